//! wasm-bindgen bindings: the chat engine in the browser, on WebGPU.
//!
//! Weights come over the network tensor by tensor: the JS side passes an `io` object whose
//! `range(url, start, end)` returns a `Promise<Uint8Array>` of bytes `start..end` (HTTP Range
//! requests, cached by the JS layer) and `size(url)` the file's length. Each tensor is uploaded
//! to the GPU as soon as it arrives, so wasm memory holds one tensor at a time, never the model.
//! Requests and responses cross the boundary as plain JS objects (serde-wasm-bindgen); errors
//! are `Error`s whose message is the JSON error body.

use crate::api::{ApiError, ChatRequest};
use crate::chat::{ChatEngine, ChatOptions, ChatStream};
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::gpu::{Gpu, GpuOptions};
use crate::model::{Model, TensorSource};
use crate::tensor::HostTensor;
use crate::tokenizer::Tokenizer;
use serde::Serialize;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

fn js_error(e: &ApiError) -> JsValue {
    js_sys::Error::new(&e.body().to_string()).into()
}

fn engine_error(e: Error) -> JsValue {
    js_error(&ApiError::from(e))
}

fn to_js<T: Serialize>(v: &T) -> JsValue {
    v.serialize(&serde_wasm_bindgen::Serializer::json_compatible()).unwrap_or(JsValue::UNDEFINED)
}

/// The JS `io` object.
struct Io {
    range: js_sys::Function,
    size: js_sys::Function,
    this: JsValue,
}

impl Io {
    fn new(io: &JsValue) -> Result<Self> {
        let get = |k: &str| -> Result<js_sys::Function> {
            js_sys::Reflect::get(io, &k.into())
                .ok()
                .and_then(|f| f.dyn_into::<js_sys::Function>().ok())
                .ok_or_else(|| Error::Input(format!("io.{k} must be a function")))
        };
        Ok(Io { range: get("range")?, size: get("size")?, this: io.clone() })
    }

    async fn call(&self, f: &js_sys::Function, args: &[JsValue], url: &str) -> Result<JsValue> {
        let arr = js_sys::Array::new();
        for a in args {
            arr.push(a);
        }
        let p = f.apply(&self.this, &arr).map_err(|e| Error::Io { path: url.into(), source: std::io::Error::other(format!("{e:?}")) })?;
        JsFuture::from(js_sys::Promise::resolve(&p))
            .await
            .map_err(|e| Error::Io { path: url.into(), source: std::io::Error::other(e.as_string().unwrap_or_else(|| format!("{e:?}"))) })
    }

    async fn size(&self, url: &str) -> Result<u64> {
        let v = self.call(&self.size, &[url.into()], url).await?;
        v.as_f64().map(|f| f as u64).ok_or_else(|| Error::corrupt(url, "io.size did not return a number"))
    }

    async fn range(&self, url: &str, start: u64, end: u64, out: &mut Vec<u8>) -> Result<()> {
        let v = self.call(&self.range, &[url.into(), (start as f64).into(), (end as f64).into()], url).await?;
        let a = js_sys::Uint8Array::new(&v);
        if a.length() as u64 != end - start {
            return Err(Error::corrupt(url, format!("asked for bytes {start}..{end}, got {}", a.length())));
        }
        out.resize(a.length() as usize, 0);
        a.copy_to(out);
        Ok(())
    }
}

/// A GGUF file over the network.
struct RemoteGguf<'a> {
    io: &'a Io,
    url: String,
    gguf: Gguf,
    cfg: crate::ModelConfig,
    buf: Vec<u8>,
    loaded: u64,
    progress: &'a dyn Fn(u64, &str),
}

impl TensorSource for RemoteGguf<'_> {
    async fn tensor(&mut self, name: &str, rows: usize, cols: usize) -> Result<HostTensor<'_>> {
        let info = self.gguf.tensor(name).ok_or_else(|| Error::Shape(format!("GGUF {} lacks tensor {name}", self.url)))?.clone();
        self.io.range(&self.url, info.offset, info.offset + info.size, &mut self.buf).await?;
        self.loaded += info.size;
        (self.progress)(self.loaded, name);
        crate::gguf::host_tensor(&info, &self.buf, rows, cols, &self.cfg)
    }
    fn has(&self, name: &str) -> bool {
        self.gguf.tensor(name).is_some()
    }
}

/// Reads a GGUF header: the first 1 MiB, doubled until the header parses.
async fn fetch_header(io: &Io, url: &str, len: u64) -> Result<Gguf> {
    let mut n = (1u64 << 20).min(len);
    let mut buf = Vec::new();
    loop {
        io.range(url, 0, n, &mut buf).await?;
        match Gguf::parse(&buf, len, url) {
            Ok(g) => return Ok(g),
            Err(Error::Corrupt { msg, .. }) if msg.contains("truncated") && n < len => n = (n * 2).min(len),
            Err(e) => return Err(e),
        }
    }
}

/// The engine behind the JS API.
#[wasm_bindgen]
pub struct WasmEngine {
    chat: ChatEngine,
    model: Option<Model>,
    stream: Option<ChatStream>,
}

#[wasm_bindgen]
impl WasmEngine {
    /// Loads a GGUF model from `url` through `io`. `options`: `{ctxSize, kvF16, modelName}`.
    /// `on_progress({loaded, total, text})` as tensors arrive.
    pub async fn load(url: String, io: JsValue, options: JsValue, on_progress: Option<js_sys::Function>) -> std::result::Result<WasmEngine, JsValue> {
        console_error_panic_hook();
        let opt = |k: &str| js_sys::Reflect::get(&options, &k.into()).ok().filter(|v| !v.is_undefined() && !v.is_null());
        let io = Io::new(&io).map_err(engine_error)?;
        let len = io.size(&url).await.map_err(engine_error)?;
        let report = |loaded: u64, text: &str| {
            if let Some(f) = &on_progress {
                let o = js_sys::Object::new();
                let _ = js_sys::Reflect::set(&o, &"loaded".into(), &(loaded as f64).into());
                let _ = js_sys::Reflect::set(&o, &"total".into(), &(len as f64).into());
                let _ = js_sys::Reflect::set(&o, &"text".into(), &text.into());
                let _ = f.call1(&JsValue::NULL, &o);
            }
        };
        let gguf = fetch_header(&io, &url, len).await.map_err(engine_error)?;
        let cfg = gguf.config().map_err(engine_error)?;
        let tokenizer = Tokenizer::from_gguf(&gguf).map_err(engine_error)?;
        let gpu = Gpu::new(&GpuOptions::default()).await.map_err(engine_error)?;
        // Refuse before downloading what cannot fit: each layer's KV cache is one binding.
        let ctx_size = opt("ctxSize").and_then(|v| v.as_f64()).map(|v| v as usize).unwrap_or(4096).min(cfg.max_position_embeddings.max(2));
        let kv_f16 = opt("kvF16").and_then(|v| v.as_bool()).unwrap_or(true);
        let kv_bytes = (ctx_size * cfg.kv_dim() * if kv_f16 { 2 } else { 4 }) as u64;
        if kv_bytes + 4 > gpu.max_binding {
            return Err(engine_error(Error::Gpu(format!(
                "a {ctx_size}-token KV cache needs {kv_bytes}-byte buffers; this device binds at most {} bytes: ask for a smaller ctxSize",
                gpu.max_binding
            ))));
        }
        report(0, "header");
        let mut src = RemoteGguf { io: &io, url: url.clone(), gguf, cfg: cfg.clone(), buf: Vec::new(), loaded: 0, progress: &report };
        let model = Model::build(gpu, cfg, &mut src, |_, _| {}).await.map_err(engine_error)?;
        let name = opt("modelName").and_then(|v| v.as_string()).unwrap_or_else(|| {
            url.rsplit('/').next().unwrap_or("model").trim_end_matches(".gguf").to_string()
        });
        let chat = ChatEngine::new(&model, tokenizer, ChatOptions { ctx_size: Some(ctx_size), kv_f16, max_batch: 128, model_name: name })
            .map_err(engine_error)?;
        report(len, "ready");
        Ok(WasmEngine { chat, model: Some(model), stream: None })
    }

    fn request(req: JsValue) -> std::result::Result<ChatRequest, JsValue> {
        let r: ChatRequest = serde_wasm_bindgen::from_value(req).map_err(|e| js_error(&ApiError::invalid(format!("malformed request: {e}"), None)))?;
        r.validate().map_err(|e| js_error(&e))?;
        Ok(r)
    }

    /// A `chat.completion` for a request object.
    pub async fn complete(&mut self, request: JsValue) -> std::result::Result<JsValue, JsValue> {
        self.stream = None;
        let req = Self::request(request)?;
        let c = self.chat.complete(&req).await.map_err(|e| js_error(&e))?;
        Ok(to_js(&c))
    }

    /// Starts a streamed answer (replacing one in progress); then call `next_chunk`.
    pub async fn start_stream(&mut self, request: JsValue) -> std::result::Result<(), JsValue> {
        self.stream = None;
        let req = Self::request(request)?;
        self.stream = Some(self.chat.start_stream(&req).await.map_err(|e| js_error(&e))?);
        Ok(())
    }

    /// The next `chat.completion.chunk`, or `undefined` at the end.
    pub async fn next_chunk(&mut self) -> std::result::Result<JsValue, JsValue> {
        let Some(mut s) = self.stream.take() else { return Ok(JsValue::UNDEFINED) };
        match self.chat.next_chunk(&mut s).await {
            None => Ok(JsValue::UNDEFINED),
            Some(Ok(c)) => {
                self.stream = Some(s);
                Ok(to_js(&c))
            }
            Some(Err(e)) => Err(js_error(&e)),
        }
    }

    /// Abandons the streamed answer in progress.
    pub fn cancel(&mut self) {
        self.stream = None;
    }

    /// The messages a task object (`{type: "translate", text, source, target, ...}`) builds.
    pub fn task_request(task: JsValue) -> std::result::Result<JsValue, JsValue> {
        let t: crate::tasks::Task = serde_wasm_bindgen::from_value(task).map_err(|e| js_error(&ApiError::invalid(format!("malformed task: {e}"), Some("task"))))?;
        Ok(to_js(&ChatRequest::task(t)))
    }

    #[wasm_bindgen(getter)]
    pub fn model_name(&self) -> String {
        self.chat.model_name().to_string()
    }

    #[wasm_bindgen(getter)]
    pub fn context_size(&self) -> usize {
        self.chat.context_size()
    }

    /// The GPU adapter's name and backend.
    #[wasm_bindgen(getter)]
    pub fn adapter(&self) -> String {
        self.model.as_ref().map(|m| format!("{} ({:?})", m.gpu.info.name, m.gpu.info.backend)).unwrap_or_default()
    }

    /// Frees the model's GPU memory.
    pub fn unload(&mut self) {
        self.stream = None;
        if let Some(m) = self.model.take() {
            m.gpu.device.destroy();
        }
    }
}

fn console_error_panic_hook() {
    use std::sync::Once;
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            web_log(&format!("tildeopen panicked: {info}"));
        }));
    });
}

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn web_log(s: &str);
}
