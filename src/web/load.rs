//! Loading a model in the browser: the JS options (checked before any download), the header and
//! tokenizer, the device, the context and parallel slots, and the weights tensor by tensor.

use super::remote::*;
use super::{bad_option, console_error_panic_hook, engine_error, WasmEngine};
use crate::chat::{ChatEngine, ChatOptions, MAX_CONTEXT};
use crate::error::Error;
use crate::gpu::session::{default_ctx_size, kv_tokens_fit, KvType, DEFAULT_CTX_CAP};
use crate::gpu::{Gpu, GpuOptions};
use crate::model::tensor::WeightFormat;
use crate::model::Model;
use crate::text::tokenizer::Tokenizer;
use wasm_bindgen::prelude::*;

#[wasm_bindgen]
impl WasmEngine {
    /// Loads a model through `io`: a GGUF file (`url` ends in `.gguf`) or an HF checkpoint
    /// directory (`url` is its base: config.json, tokenizer files, safetensors, converted at
    /// load to `options.quant`, default q8_0). `options`: `{ctxSize, parallel, kvF16, modelName,
    /// quant, intDot, normFold}`.
    /// `on_progress({loaded, total, text})` as tensors arrive.
    pub async fn load(url: String, io: JsValue, options: JsValue, on_progress: Option<js_sys::Function>) -> std::result::Result<WasmEngine, JsValue> {
        console_error_panic_hook();
        let opt = |k: &str| js_sys::Reflect::get(&options, &k.into()).ok().filter(|v| !v.is_undefined() && !v.is_null());
        // Every option is checked before anything is downloaded: a wrong type was ignored (the
        // default used), and a bad ctxSize failed only after every weight had arrived.
        let bad = bad_option;
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
        let asked_parallel = match opt("parallel") {
            None => None,
            Some(v) => match v.as_f64() {
                Some(x) if x.fract() == 0.0 && (1.0..=MAX_PARALLEL as f64).contains(&x) => Some(x as usize),
                _ => return Err(bad("parallel", &format!("a whole number from 1 to {MAX_PARALLEL}"))),
            },
        };
        // kvCache names the type; kvF16 (false: f32) is the older switch, still taken.
        let kv = match (opt_string("kvCache")?, opt_bool("kvF16")?) {
            (Some(name), f16) => {
                let kv = KvType::parse(&name).map_err(|_| bad("kvCache", KvType::NAMES))?;
                if f16.is_some_and(|f| f != (kv == KvType::F16)) {
                    return Err(bad("kvF16", "left out when kvCache is given"));
                }
                kv
            }
            (None, Some(false)) => KvType::F32,
            (None, _) => KvType::F16,
        };
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
            let (ctx_size, parallel) = slots(&cfg, gpu.max_binding, kv, asked_ctx, asked_parallel)?;
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
            let chat = ChatEngine::new(&model, tokenizer, ChatOptions { ctx_size: Some(ctx_size), kv, max_batch: 128, parallel, model_name: name })
                .map_err(engine_error)?;
            report(total.get(), "ready");
            Ok(WasmEngine { chat, model: Some(model) })
        }
        .await;
        if r.is_err() {
            device.destroy();
        }
        r
    }

}

/// Most parallel slots the web engine takes.
pub const MAX_PARALLEL: usize = 32;
/// Parallel slots when the page does not say: as many as one KV binding holds contexts of the
/// chosen size, at most this.
pub const DEFAULT_PARALLEL: usize = 4;

/// The context size and parallel slots: the asked ones (an error naming the option when one
/// layer's KV cache for all slots would not fit a binding), else the model's context (at most
/// 4096, at most what fits) and [`DEFAULT_PARALLEL`] slots, fewer where fewer contexts fit.
fn slots(cfg: &crate::ModelConfig, max_binding: u64, kv: KvType, ctx: Option<usize>, parallel: Option<usize>) -> Result<(usize, usize), JsValue> {
    if let Some(why) = kv.unsupported(cfg) {
        return Err(bad_option("kvCache", &why));
    }
    let fits = kv_tokens_fit(cfg, max_binding, kv);
    let ctx_size = match ctx {
        None => default_ctx_size(cfg, max_binding, kv, parallel.unwrap_or(1), DEFAULT_CTX_CAP),
        Some(v) => v.min(cfg.max_position_embeddings.max(2)),
    };
    let parallel = match parallel {
        Some(n) => n,
        None => (fits / ctx_size.max(1)).clamp(1, DEFAULT_PARALLEL),
    };
    if ctx_size * parallel > fits {
        let (k, most) = if parallel > 1 { ("parallel", format!("{} slots of {ctx_size} tokens", fits / ctx_size)) } else { ("ctxSize", format!("{fits} tokens")) };
        return Err(bad_option(
            k,
            &format!(
                "at most {most} here: {parallel} x {ctx_size} tokens of {kv} KV cache need {} bytes per layer for each KV head and this device binds {} bytes (kvCache \"q8_0\" or \"q4_0\" holds about 2x or 3.5x the tokens of f16)",
                (ctx_size * parallel) as u64 * kv.row_words(cfg.head_dim) as u64 * 4,
                max_binding
            ),
        ));
    }
    Ok((ctx_size, parallel))
}
