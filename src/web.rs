//! wasm-bindgen bindings: the chat engine in the browser, on WebGPU.
//!
//! Weights come over the network tensor by tensor: the JS side passes an `io` object whose
//! `range(url, start, end)` returns a `Promise<Uint8Array>` of bytes `start..end` (HTTP Range
//! requests, cached by the JS layer) and `size(url)` the file's length. Each tensor is uploaded
//! to the GPU as soon as it arrives, so wasm memory holds one tensor at a time, never the model.
//! Requests and responses cross the boundary as plain JS objects (serde-wasm-bindgen); errors
//! are `Error`s whose message is the JSON error body.

use crate::chat::api::{ApiError, ChatRequest};
use crate::chat::{ChatEngine, ChatOptions, ChatStream, MAX_CONTEXT};
use crate::error::{Error, Result};
use crate::model::gguf::Gguf;
use crate::gpu::{Gpu, GpuOptions};
use crate::gpu::session::{default_ctx_size, kv_row_bytes, kv_tokens_fit, DEFAULT_CTX_CAP};
use crate::model::{Model, TensorSource};
use crate::model::tensor::{HostTensor, WeightFormat};
use std::collections::HashMap;
use crate::text::tokenizer::Tokenizer;
use serde::Serialize;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

/// An `Error` whose message is the JSON error body and whose `type`, `code` and `param` are its
/// fields (as `engineError` in www/util.js makes them).
fn js_error(e: &ApiError) -> JsValue {
    let err = js_sys::Error::new(&e.body().to_string());
    for (k, v) in [("type", Some(e.kind.as_str())), ("code", e.code.as_deref()), ("param", e.param.as_deref())] {
        let _ = js_sys::Reflect::set(&err, &k.into(), &v.map_or(JsValue::NULL, JsValue::from));
    }
    err.into()
}

/// The text of what a JS promise rejected with: an `Error`'s message, a string as it is.
fn js_text(e: &JsValue) -> String {
    e.dyn_ref::<js_sys::Error>().map(|e| String::from(e.message())).or_else(|| e.as_string()).unwrap_or_else(|| format!("{e:?}"))
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
        // The JS messages already name the URL: strip it rather than say it twice.
        let io_err = |e: JsValue| {
            let text = js_text(&e);
            let text = text.strip_prefix(&format!("{url}: ")).map(str::to_string).unwrap_or(text);
            Error::Io { path: url.into(), source: std::io::Error::other(text) }
        };
        let p = f.apply(&self.this, &arr).map_err(io_err)?;
        JsFuture::from(js_sys::Promise::resolve(&p)).await.map_err(io_err)
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
        crate::model::gguf::host_tensor(&info, &self.buf, rows, cols, &self.cfg)
    }
    fn has(&self, name: &str) -> bool {
        self.gguf.tensor(name).is_some()
    }
}

/// A tensor in a safetensors file: dtype, shape, absolute byte range.
type Entry = crate::model::tensor::SafetensorsEntry;

/// One safetensors file over the network.
struct Shard {
    url: String,
    tensors: HashMap<String, Entry>,
}

/// An HF checkpoint directory over the network (`config.json`, safetensors, tokenizer files).
struct RemoteHf<'a> {
    io: &'a Io,
    shards: Vec<Shard>,
    format: WeightFormat,
    buf: Vec<u8>,
    loaded: u64,
    progress: &'a dyn Fn(u64, &str),
}

impl RemoteHf<'_> {
    fn find(&self, hf: &str) -> Option<(&Shard, &Entry)> {
        self.shards.iter().find_map(|s| s.tensors.get(hf).map(|t| (s, t)))
    }
}

impl TensorSource for RemoteHf<'_> {
    async fn tensor(&mut self, name: &str, rows: usize, cols: usize) -> Result<HostTensor<'_>> {
        let hf = crate::model::names::hf_name(name);
        let (url, Entry { dtype, shape, start, end }) = match self.find(&hf) {
            Some((s, t)) => (s.url.clone(), t.clone()),
            None => return Err(Error::Shape(format!("checkpoint lacks tensor {hf}"))),
        };
        crate::model::tensor::check_shape(&hf, &shape, rows, cols)?;
        let ty = crate::model::tensor::safetensors_dtype(&dtype, &hf)?;
        self.io.range(&url, start, end, &mut self.buf).await?;
        self.loaded += end - start;
        (self.progress)(self.loaded, name);
        crate::model::tensor::from_checkpoint(ty, &self.buf, rows, cols, self.format)
    }
    fn has(&self, name: &str) -> bool {
        self.find(&crate::model::names::hf_name(name)).is_some()
    }
}

async fn fetch_text(io: &Io, url: &str) -> Result<String> {
    utf8(fetch_bytes(io, url).await?, url)
}

async fn fetch_bytes(io: &Io, url: &str) -> Result<Vec<u8>> {
    let n = io.size(url).await?;
    let mut buf = Vec::new();
    io.range(url, 0, n, &mut buf).await?;
    Ok(buf)
}

/// An optional file of a checkpoint: `None` only when the server says it is not there (404 or
/// 410). Any other failure (a 5xx, a 403, the network) is an error: taking it for "absent"
/// loaded the model without its chat template or end-of-turn tokens, without a word.
async fn fetch_optional(io: &Io, url: &str) -> Result<Option<Vec<u8>>> {
    match fetch_bytes(io, url).await {
        Ok(b) => Ok(Some(b)),
        Err(e) => {
            let m = e.to_string();
            if m.ends_with("HTTP 404") || m.ends_with("HTTP 410") {
                Ok(None)
            } else {
                Err(e)
            }
        }
    }
}

fn utf8(b: Vec<u8>, url: &str) -> Result<String> {
    String::from_utf8(b).map_err(|_| Error::corrupt(url, "not UTF-8"))
}

/// A safetensors file's header (8-byte length, then JSON).
async fn fetch_shard(io: &Io, url: &str) -> Result<Shard> {
    let len = io.size(url).await?;
    let mut buf = Vec::new();
    io.range(url, 0, 8.min(len), &mut buf).await?;
    let n = crate::model::tensor::safetensors_header_len(&buf, len, url)?;
    io.range(url, 8, 8 + n, &mut buf).await?;
    let tensors = crate::model::tensor::safetensors_header(&buf, n, len, url)?;
    Ok(Shard { url: url.to_string(), tensors })
}

/// Reads a GGUF header: the first 1 MiB, doubled until the header parses. Each step fetches only
/// the bytes after what it has (nothing is read twice), and the header checks bound every count
/// by the bytes it needs, so a truncated or lying file fails within a few requests instead of
/// reading the whole file again and again.
async fn fetch_header(io: &Io, url: &str, len: u64) -> Result<Gguf> {
    let mut n = (1u64 << 20).min(len);
    let mut buf = Vec::new();
    let mut more = Vec::new();
    loop {
        io.range(url, buf.len() as u64, n, &mut more).await?;
        buf.extend_from_slice(&more);
        // Only a header that runs past the prefix read so far asks for more; a tensor past the
        // end of the file is an error however much is read.
        match Gguf::parse_prefix(&buf, len, url)? {
            Some(g) => return Ok(g),
            None => n = (n * 2).min(len),
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
    /// Loads a model through `io`: a GGUF file (`url` ends in `.gguf`) or an HF checkpoint
    /// directory (`url` is its base: config.json, tokenizer files, safetensors, converted at
    /// load to `options.quant`, default q8_0). `options`: `{ctxSize, kvF16, modelName, quant}`.
    /// `on_progress({loaded, total, text})` as tensors arrive.
    pub async fn load(url: String, io: JsValue, options: JsValue, on_progress: Option<js_sys::Function>) -> std::result::Result<WasmEngine, JsValue> {
        console_error_panic_hook();
        let opt = |k: &str| js_sys::Reflect::get(&options, &k.into()).ok().filter(|v| !v.is_undefined() && !v.is_null());
        // Every option is checked before anything is downloaded: a wrong type was ignored (the
        // default used), and a bad ctxSize failed only after every weight had arrived.
        let bad = |k: &str, want: &str| {
            js_error(&ApiError { status: 400, message: format!("options.{k} must be {want}"), kind: "invalid_request_error".into(), param: Some(k.into()), code: None })
        };
        let opt_bool = |k: &str| match opt(k) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| bad(k, "true or false")),
        };
        let opt_string = |k: &str| match opt(k) {
            None => Ok(None),
            Some(v) => v.as_string().filter(|s| !s.is_empty() && s.len() <= 256).map(Some).ok_or_else(|| bad(k, "a string of 1 to 256 bytes")),
        };
        let asked_ctx = match opt("ctxSize") {
            None => None,
            Some(v) => match v.as_f64() {
                Some(x) if x.fract() == 0.0 && (2.0..=MAX_CONTEXT as f64).contains(&x) => Some(x as usize),
                _ => return Err(bad("ctxSize", &format!("a whole number from 2 to {MAX_CONTEXT}"))),
            },
        };
        let kv_f16 = opt_bool("kvF16")?.unwrap_or(true);
        let gpu_opts = GpuOptions { int_dot: opt_bool("intDot")?, norm_fold: opt_bool("normFold")?, ..Default::default() };
        let format = match opt_string("quant")? {
            Some(q) => WeightFormat::parse(&q).map_err(|_| bad("quant", "q8_0, q4_0, f16 or bf16"))?,
            None => WeightFormat::Q8_0,
        };
        let model_name = opt_string("modelName")?;
        let io = Io::new(&io).map_err(engine_error)?;
        let is_gguf = url.split(['?', '#']).next().unwrap_or("").ends_with(".gguf");
        let base = if is_gguf { String::new() } else { format!("{}/", url.trim_end_matches('/')) };
        let len = if is_gguf { io.size(&url).await.map_err(engine_error)? } else { 0 };
        let total = std::cell::Cell::new(len);
        let report = |loaded: u64, text: &str| {
            if let Some(f) = &on_progress {
                let o = js_sys::Object::new();
                let _ = js_sys::Reflect::set(&o, &"loaded".into(), &(loaded as f64).into());
                let _ = js_sys::Reflect::set(&o, &"total".into(), &(total.get() as f64).into());
                let _ = js_sys::Reflect::set(&o, &"text".into(), &text.into());
                let _ = f.call1(&JsValue::NULL, &o);
            }
        };
        let (cfg, tokenizer, gguf, shards) = if is_gguf {
            let gguf = fetch_header(&io, &url, len).await.map_err(engine_error)?;
            let cfg = gguf.config().map_err(engine_error)?;
            let tokenizer = Tokenizer::from_gguf(&gguf).map_err(engine_error)?;
            (cfg, tokenizer, Some(gguf), Vec::new())
        } else {
            let cfg = crate::ModelConfig::from_hf_json(&fetch_text(&io, &format!("{base}config.json")).await.map_err(engine_error)?).map_err(engine_error)?;
            let mut tokenizer = match fetch_optional(&io, &format!("{base}tokenizer.model")).await.map_err(engine_error)? {
                Some(b) => Tokenizer::from_spm_bytes(&b, &format!("{base}tokenizer.model")),
                None => Tokenizer::from_hf_json(&fetch_bytes(&io, &format!("{base}tokenizer.json")).await.map_err(engine_error)?),
            }
            .map_err(engine_error)?;
            let text = |name: &str, b: Option<Vec<u8>>| b.map(|b| utf8(b, &format!("{base}{name}"))).transpose();
            let tc = text("tokenizer_config.json", fetch_optional(&io, &format!("{base}tokenizer_config.json")).await.map_err(engine_error)?).map_err(engine_error)?;
            let gc = text("generation_config.json", fetch_optional(&io, &format!("{base}generation_config.json")).await.map_err(engine_error)?).map_err(engine_error)?;
            tokenizer.apply_hf_configs(tc.as_deref(), gc.as_deref()).map_err(engine_error)?;
            let index = fetch_optional(&io, &format!("{base}model.safetensors.index.json")).await.map_err(engine_error)?;
            let files: Vec<String> = match text("model.safetensors.index.json", index).map_err(engine_error)? {
                Some(t) => crate::model::tensor::index_shards(&t, "model.safetensors.index.json").map_err(engine_error)?,
                None => vec!["model.safetensors".into()],
            };
            let mut shards = Vec::new();
            for f in files {
                let shard = fetch_shard(&io, &format!("{base}{f}")).await.map_err(engine_error)?;
                // As natively: a tensor in two shards is refused, not taken from either.
                let seen: &Vec<Shard> = &shards;
                if let Some(dup) = shard.tensors.keys().find(|n| seen.iter().any(|s| s.tensors.contains_key(*n))) {
                    return Err(engine_error(Error::corrupt(shard.url.clone(), format!("tensor {dup} is in two shards"))));
                }
                shards.push(shard);
            }
            total.set(shards.iter().flat_map(|s| s.tensors.values().map(|t| t.end - t.start)).sum());
            (cfg, tokenizer, None, shards)
        };
        let gpu = Gpu::new(&gpu_opts).await.map_err(engine_error)?;
        // A load that fails from here on destroys its device: dropping wgpu's WebGPU objects
        // frees nothing until the browser collects them, so a retry after running out of GPU
        // memory would run out again.
        let device = gpu.device.clone();
        let r = async {
            // Checked before any weight is downloaded.
            let ctx_size = match asked_ctx {
                None => default_ctx_size(&cfg, gpu.max_binding, kv_f16, 1, DEFAULT_CTX_CAP),
                Some(v) => {
                    let ctx_size = v.min(cfg.max_position_embeddings.max(2));
                    let fits = kv_tokens_fit(&cfg, gpu.max_binding, kv_f16);
                    if ctx_size > fits {
                        // (The limit less 4 bytes of padding: saying "needs N, binds at most N" read wrong.)
                        return Err(bad(
                            "ctxSize",
                            &format!(
                                "at most {fits} here: a {ctx_size}-token KV cache needs {}-byte buffers per layer and this device binds {} bytes",
                                ctx_size * kv_row_bytes(&cfg, kv_f16),
                                gpu.max_binding
                            ),
                        ));
                    }
                    ctx_size
                }
            };
            report(0, "header");
            let model = match gguf {
                Some(gguf) => {
                    let mut src = RemoteGguf { io: &io, url: url.clone(), gguf, cfg: cfg.clone(), buf: Vec::new(), loaded: 0, progress: &report };
                    Model::build(gpu, cfg, &mut src, |_, _| {}).await
                }
                None => {
                    let mut src = RemoteHf { io: &io, shards, format, buf: Vec::new(), loaded: 0, progress: &report };
                    Model::build(gpu, cfg, &mut src, |_, _| {}).await
                }
            }
            .map_err(engine_error)?;
            let name = model_name.unwrap_or_else(|| {
                url.trim_end_matches('/').rsplit('/').next().unwrap_or("model").trim_end_matches(".gguf").to_string()
            });
            let chat = ChatEngine::new(&model, tokenizer, ChatOptions { ctx_size: Some(ctx_size), kv_f16, max_batch: 128, parallel: 1, model_name: name })
                .map_err(engine_error)?;
            report(total.get(), "ready");
            Ok(WasmEngine { chat, model: Some(model), stream: None })
        }
        .await;
        if r.is_err() {
            device.destroy();
        }
        r
    }

    /// A `device_lost` error (the page should create a new engine) once the GPU is gone.
    fn check_device(&self) -> std::result::Result<(), JsValue> {
        let Some(m) = &self.model else {
            return Err(js_error(&ApiError { status: 409, message: "the model was unloaded".into(), kind: "invalid_request_error".into(), param: None, code: Some("unloaded".into()) }));
        };
        m.gpu.check_lost().map_err(|e| js_error(&ApiError { status: 503, message: e.to_string(), kind: "server_error".into(), param: None, code: Some("device_lost".into()) }))
    }

    fn request(req: JsValue) -> std::result::Result<ChatRequest, JsValue> {
        let r: ChatRequest = serde_path_to_error::deserialize(serde_wasm_bindgen::Deserializer::from(req)).map_err(|e| js_error(&ChatRequest::malformed(e)))?;
        r.validate().map_err(|e| js_error(&e))?;
        Ok(r)
    }

    /// A `chat.completion` for a request object.
    pub async fn complete(&mut self, request: JsValue) -> std::result::Result<JsValue, JsValue> {
        self.stream = None;
        self.check_device()?;
        let req = Self::request(request)?;
        let c = self.chat.complete(&req).await.map_err(|e| js_error(&e))?;
        Ok(to_js(&c))
    }

    /// Starts a streamed answer (replacing one in progress); then call `next_chunk`.
    pub async fn start_stream(&mut self, request: JsValue) -> std::result::Result<(), JsValue> {
        self.stream = None;
        self.check_device()?;
        let req = Self::request(request)?;
        self.stream = Some(self.chat.start_stream(&req).await.map_err(|e| js_error(&e))?);
        Ok(())
    }

    /// The next `chat.completion.chunk`, or `undefined` at the end.
    pub async fn next_chunk(&mut self) -> std::result::Result<JsValue, JsValue> {
        // Checked first: after unload() the stream is gone too, and that is an error, not an end.
        self.check_device()?;
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
        let t: crate::chat::tasks::Task = serde_wasm_bindgen::from_value(task).map_err(|e| js_error(&ApiError::invalid(format!("malformed task: {e}"), Some("task"))))?;
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

    /// The optional kernel paths in use, by name (`fused`, `split_attention`, `query_tiles`,
    /// `norm_fold`, `int_dot`; `subgroups` never in a browser: wgpu's WebGPU backend does not expose it).
    #[wasm_bindgen(getter)]
    pub fn fast_paths(&self) -> Vec<String> {
        let Some(m) = self.model.as_ref() else { return vec![] };
        m.gpu.fast.by_name().iter().filter(|p| p.1).map(|p| p.0.to_string()).collect()
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
