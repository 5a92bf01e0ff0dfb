//! wasm-bindgen bindings: the chat engine in the browser, on WebGPU.
//!
//! Weights come over the network tensor by tensor: the JS side passes an `io` object whose
//! `range(url, start, end)` returns a `Promise<Uint8Array>` of bytes `start..end` (HTTP Range
//! requests, cached by the JS layer) and `size(url)` the file's length. Each tensor is uploaded
//! to the GPU as soon as it arrives, so wasm memory holds one tensor at a time, never the model.
//! Requests and responses cross the boundary as plain JS objects (serde-wasm-bindgen); errors
//! are `Error`s whose message is the JSON error body.

use crate::chat::api::{ApiError, ChatRequest};
use crate::chat::{ChatEngine, Output, Prepared, Prompter};
use crate::error::Error;
use crate::model::Model;
use serde::Serialize;
use wasm_bindgen::prelude::*;

mod load;
mod remote;

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

/// A `400 invalid_request_error` about option `k` of `load`.
fn bad_option(k: &str, want: &str) -> JsValue {
    js_error(&ApiError { status: 400, message: format!("options.{k} must be {want}"), kind: "invalid_request_error".into(), param: Some(k.into()), code: None })
}

/// The engine behind the JS API: several requests in flight at once (one KV slot each), all
/// advanced by the same [`WasmEngine::step`] passes. The JS side (`www/scheduler.js`) owns the
/// loop: it prepares requests (any time, through [`WasmEngine::prompter`]), admits them while a
/// slot is free, and calls `step` while any is in flight; `admit`, `cancel` and `unload` are
/// called between steps (a call while `step` runs would alias the engine, which wasm-bindgen
/// refuses).
#[wasm_bindgen]
pub struct WasmEngine {
    chat: ChatEngine,
    model: Option<Model>,
}

/// Turns requests into prompts; independent of the engine, so it runs while a step is in
/// flight (errors in a request reach the caller at once, not after the pass).
#[wasm_bindgen]
pub struct WasmPrompter {
    p: Prompter,
}

/// A request ready for a slot (see [`WasmEngine::admit`]); used once.
#[wasm_bindgen]
pub struct WasmPrepared {
    p: Option<Prepared>,
    tokens: usize,
}

#[wasm_bindgen]
impl WasmPrepared {
    /// The prompt's length in tokens.
    #[wasm_bindgen(getter)]
    pub fn prompt_tokens(&self) -> usize {
        self.tokens
    }
}

#[wasm_bindgen]
impl WasmPrompter {
    /// Validates a request object, renders and tokenizes its prompt and checks it against the
    /// context window; errors are the response format's (400, `context_length_exceeded`, ...).
    pub fn prepare(&self, request: JsValue) -> std::result::Result<WasmPrepared, JsValue> {
        let r: ChatRequest = serde_path_to_error::deserialize(serde_wasm_bindgen::Deserializer::from(request)).map_err(|e| js_error(&ChatRequest::malformed(e)))?;
        let p = self.p.prepare(&r).map_err(|e| js_error(&e))?;
        Ok(WasmPrepared { tokens: p.prompt.len(), p: Some(p) })
    }

    /// The prompt tokens of a request object, within the context window or not (see
    /// `Prompter::count`); errors as `prepare` has them.
    pub fn count(&self, request: JsValue) -> std::result::Result<usize, JsValue> {
        let r: ChatRequest = serde_path_to_error::deserialize(serde_wasm_bindgen::Deserializer::from(request)).map_err(|e| js_error(&ChatRequest::malformed(e)))?;
        self.p.count(&r).map_err(|e| js_error(&e))
    }
}

#[wasm_bindgen]
impl WasmEngine {
    /// A `device_lost` error (the page should create a new engine) once the GPU is gone.
    fn check_device(&self) -> std::result::Result<(), JsValue> {
        let Some(m) = &self.model else {
            return Err(js_error(&ApiError { status: 409, message: "the model was unloaded".into(), kind: "invalid_request_error".into(), param: None, code: Some("unloaded".into()) }));
        };
        m.gpu.check_lost().map_err(|e| js_error(&ApiError { status: 503, message: e.to_string(), kind: "server_error".into(), param: None, code: Some("device_lost".into()) }))
    }

    /// What prepares requests for this engine.
    pub fn prompter(&self) -> WasmPrompter {
        WasmPrompter { p: self.chat.prompter() }
    }

    /// Whether a prepared request would get a slot now.
    pub fn has_free_slot(&mut self) -> bool {
        self.chat.has_free_slot()
    }

    /// Gives a prepared request a slot (the one sharing the longest prompt prefix; a longer
    /// prefix in another slot is copied). Returns its id; its outputs come from `step`. No GPU
    /// work runs until then.
    pub fn admit(&mut self, prepared: &mut WasmPrepared, stream: bool) -> std::result::Result<f64, JsValue> {
        self.check_device()?;
        let p = prepared.p.take().ok_or_else(|| js_error(&ApiError::invalid("this prepared request was already admitted".into(), None)))?;
        Ok(self.chat.admit(p, stream).map_err(|e| js_error(&e))? as f64)
    }

    /// One forward pass over every request in flight. Returns the outputs that became ready:
    /// `[{id, last, chunk | completion | error}]` (`error` an `Error` as the other calls
    /// reject with; `last`: the request has ended and left its slot). Rejects only when the
    /// engine cannot run again (`device_lost`, `unloaded`).
    pub async fn step(&mut self) -> std::result::Result<js_sys::Array, JsValue> {
        self.check_device()?;
        let events = self.chat.step().await;
        // A pass that failed because the device went away fails the requests with the device's
        // error (the page makes a new engine), not with the pass's.
        self.check_device()?;
        let out = js_sys::Array::new();
        for e in events {
            let o = js_sys::Object::new();
            let (k, v) = match &e.output {
                Output::Chunk(c) => ("chunk", to_js(c)),
                Output::Completion(c) => ("completion", to_js(c)),
                Output::Error(err) => ("error", js_error(err)),
            };
            let _ = js_sys::Reflect::set(&o, &"id".into(), &(e.id as f64).into());
            let _ = js_sys::Reflect::set(&o, &"last".into(), &e.last.into());
            let _ = js_sys::Reflect::set(&o, &k.into(), &v);
            out.push(&o);
        }
        Ok(out)
    }

    /// Stops answering a request; its slot is free for the next `admit`.
    pub fn cancel(&mut self, id: f64) {
        self.chat.cancel(id as u64);
    }

    /// Requests in flight.
    #[wasm_bindgen(getter)]
    pub fn in_flight(&self) -> usize {
        self.chat.in_flight()
    }

    /// The task object's request (`{type: "translate", text, source, target, ...}`).
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

    /// The KV cache's type: "f16", "f32", "q8_0" or "q4_0".
    #[wasm_bindgen(getter)]
    pub fn kv_cache(&self) -> String {
        self.chat.kv_type().name().into()
    }

    /// Requests answered at once (KV slots of `context_size` tokens each).
    #[wasm_bindgen(getter)]
    pub fn parallel(&self) -> usize {
        self.chat.parallel()
    }

    /// Prompt tokens by where their keys and values came from, and passes run:
    /// `{passes, prefilled, reused, copied, generated}`.
    #[wasm_bindgen(getter)]
    pub fn stats(&self) -> JsValue {
        let s = self.chat.stats();
        let o = js_sys::Object::new();
        for (k, v) in [("passes", s.passes), ("prefilled", s.prefilled), ("reused", s.reused), ("copied", s.copied), ("generated", s.generated)] {
            let _ = js_sys::Reflect::set(&o, &k.into(), &(v as f64).into());
        }
        o.into()
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

    /// Frees the model's GPU memory; every request in flight is dropped.
    pub fn unload(&mut self) {
        self.chat.abort_all();
        if let Some(m) = self.model.take() {
            m.gpu.device.destroy();
        }
    }
}

/// The language of `text`: `{language, confidence, reliable}` (ISO 639-1 where one exists), or
/// `null` for text without letters.
#[wasm_bindgen]
pub fn detect_language(text: &str) -> JsValue {
    crate::text::lang::detect(text).map_or(JsValue::NULL, |d| to_js(&d))
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
