//! Model files over the network: the JS `io` object (HTTP Range reads, cached by the JS layer)
//! and the GGUF / HF-checkpoint tensor sources the loader reads one tensor at a time.

use super::js_text;
use crate::error::{Error, Result};
use crate::model::gguf::Gguf;
use crate::model::tensor::{HostTensor, WeightFormat};
use crate::model::TensorSource;
use std::collections::HashMap;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

/// The JS `io` object.
pub(super) struct Io {
    range: js_sys::Function,
    size: js_sys::Function,
    this: JsValue,
}

impl Io {
    pub(super) fn new(io: &JsValue) -> Result<Self> {
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

    pub(super) async fn size(&self, url: &str) -> Result<u64> {
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
pub(super) struct RemoteGguf<'a> {
    pub(super) io: &'a Io,
    pub(super) url: String,
    pub(super) gguf: Gguf,
    pub(super) cfg: crate::ModelConfig,
    pub(super) buf: Vec<u8>,
    pub(super) loaded: u64,
    pub(super) progress: &'a dyn Fn(u64, &str),
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
pub(super) struct Shard {
    pub(super) url: String,
    pub(super) tensors: HashMap<String, Entry>,
}

/// An HF checkpoint directory over the network (`config.json`, safetensors, tokenizer files).
pub(super) struct RemoteHf<'a> {
    pub(super) io: &'a Io,
    pub(super) shards: Vec<Shard>,
    pub(super) format: WeightFormat,
    pub(super) buf: Vec<u8>,
    pub(super) loaded: u64,
    pub(super) progress: &'a dyn Fn(u64, &str),
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

pub(super) async fn fetch_text(io: &Io, url: &str) -> Result<String> {
    utf8(fetch_bytes(io, url).await?, url)
}

pub(super) async fn fetch_bytes(io: &Io, url: &str) -> Result<Vec<u8>> {
    let n = io.size(url).await?;
    let mut buf = Vec::new();
    io.range(url, 0, n, &mut buf).await?;
    Ok(buf)
}

/// An optional file of a checkpoint: `None` only when the server says it is not there (404 or
/// 410). Any other failure (a 5xx, a 403, the network) is an error: taking it for "absent"
/// loaded the model without its chat template or end-of-turn tokens, without a word.
pub(super) async fn fetch_optional(io: &Io, url: &str) -> Result<Option<Vec<u8>>> {
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

pub(super) fn utf8(b: Vec<u8>, url: &str) -> Result<String> {
    String::from_utf8(b).map_err(|_| Error::corrupt(url, "not UTF-8"))
}

/// A safetensors file's header (8-byte length, then JSON).
pub(super) async fn fetch_shard(io: &Io, url: &str) -> Result<Shard> {
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
pub(super) async fn fetch_header(io: &Io, url: &str, len: u64) -> Result<Gguf> {
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

