//! A weight on the host, in a GPU-ready layout (shared by the native loader and the web).

use crate::error::{Error, Result};
use crate::model::quant::{self, GgmlType};
use std::borrow::Cow;

/// `rows` rows of `cols` elements of `ty`, in llama.cpp's block layout.
pub struct HostTensor<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: Cow<'a, [u8]>,
}

impl HostTensor<'_> {
    /// All elements as f32 (used for the small norm vectors).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut v = Vec::with_capacity(self.rows * self.cols);
        quant::dequantize_row(self.ty, &self.data, &mut v);
        v
    }
}

/// What HF checkpoints are converted to at load time (GGUF tensors keep their own types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    Q8_0,
    Q4_0,
    F16,
    BF16,
}

impl WeightFormat {
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "q8_0" | "q8" => Self::Q8_0,
            "q4_0" | "q4" => Self::Q4_0,
            "f16" => Self::F16,
            "bf16" => Self::BF16,
            _ => return Err(Error::Input(format!("unknown weight format {s:?} (q8_0, q4_0, f16, bf16)"))),
        })
    }
    pub fn ggml(self) -> GgmlType {
        match self {
            Self::Q8_0 => GgmlType::Q8_0,
            Self::Q4_0 => GgmlType::Q4_0,
            Self::F16 => GgmlType::F16,
            Self::BF16 => GgmlType::BF16,
        }
    }
}


/// A safetensors dtype name (`BF16`, `F16`, `F32`) as a tensor type.
pub fn safetensors_dtype(dtype: &str, name: &str) -> Result<GgmlType> {
    match dtype {
        "BF16" => Ok(GgmlType::BF16),
        "F16" => Ok(GgmlType::F16),
        "F32" => Ok(GgmlType::F32),
        d => Err(Error::Unsupported(format!("{name}: safetensors dtype {d} (bf16, f16, f32)"))),
    }
}

/// A checkpoint tensor (`rows` x `cols` of `src_ty`) in the GPU layout: vectors (norms) stay as
/// they are; matrices become `format`.
pub fn from_checkpoint(src_ty: GgmlType, data: &[u8], rows: usize, cols: usize, format: WeightFormat) -> Result<HostTensor<'_>> {
    let rb = src_ty.row_bytes(cols)?;
    if rb.checked_mul(rows) != Some(data.len()) {
        return Err(Error::Shape(format!("{} bytes for {rows}x{cols} {src_ty:?}", data.len())));
    }
    let target = if rows == 1 { src_ty } else { format.ggml() };
    if target == src_ty {
        return Ok(HostTensor { ty: src_ty, rows, cols, data: Cow::Borrowed(data) });
    }
    let mut out = Vec::with_capacity(rows * target.row_bytes(cols)?);
    let mut row = Vec::with_capacity(cols);
    for r in data.chunks_exact(rb) {
        row.clear();
        quant::dequantize_row(src_ty, r, &mut row);
        out.extend_from_slice(&quant::quantize(target, &row)?);
    }
    Ok(HostTensor { ty: target, rows, cols, data: Cow::Owned(out) })
}

/// The shard files an HF `model.safetensors.index.json` (`text`, read from `what`) lists in its
/// `weight_map`, sorted, each once.
pub fn index_shards(text: &str, what: &str) -> Result<Vec<String>> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| Error::corrupt(what, e.to_string()))?;
    let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| Error::corrupt(what, "no weight_map object"))?;
    let mut names: Vec<String> = map.values().filter_map(|f| f.as_str().map(String::from)).collect();
    // Shards are plain file names inside the checkpoint: no paths, no "..", nothing absolute
    // (natively they are opened from the directory, on the web fetched beside the index).
    if let Some(bad) = names.iter().find(|n| {
        // `%`, `?` and `#` change what a URL names (`%2e%2e` is `..` to a URL parser).
        n.is_empty() || n.contains(['/', '\\', ':', '%', '?', '#']) || n.starts_with('.') || n.chars().any(char::is_control)
    }) {
        return Err(Error::corrupt(what, format!("weight_map names {bad:?}, which is not a file name in the checkpoint directory")));
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// A safetensors tensor's shape (`[n]` or `[rows, cols]`) is the `rows x cols` the model expects.
pub fn check_shape(name: &str, shape: &[usize], rows: usize, cols: usize) -> Result<()> {
    let (r, c) = match shape {
        [n] => (1, *n),
        [r, c] => (*r, *c),
        _ => return Err(Error::Shape(format!("{name} has shape {shape:?}"))),
    };
    if (r, c) != (rows, cols) {
        return Err(Error::Shape(format!("{name} is {r}x{c}, expected {rows}x{cols}")));
    }
    Ok(())
}

/// Every tensor of a safetensors file (`bytes`, the whole file) with its absolute byte range,
/// after checking the header once against the bytes it describes (offsets, sizes, dtypes): how
/// the native loader opens a shard (parsed once, not once per tensor, so a huge header costs
/// one parse).
pub fn safetensors_entries(bytes: &[u8], what: &str) -> Result<std::collections::HashMap<String, SafetensorsEntry>> {
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| Error::corrupt(what, e.to_string()))?;
    let base = bytes.as_ptr() as usize;
    Ok(st
        .iter()
        .map(|(name, view)| {
            let start = (view.data().as_ptr() as usize).saturating_sub(base) as u64;
            let entry = SafetensorsEntry { dtype: format!("{:?}", view.dtype()), shape: view.shape().to_vec(), start, end: start + view.data().len() as u64 };
            (name.to_string(), entry)
        })
        .collect())
}

/// The tensor `e` (named `hf`) of a safetensors file (`bytes`, the whole file), checked to be
/// `rows x cols`, in the GPU layout (`format` for matrices).
pub fn safetensors_entry_tensor<'a>(bytes: &'a [u8], e: &SafetensorsEntry, hf: &str, rows: usize, cols: usize, format: WeightFormat, what: &str) -> Result<HostTensor<'a>> {
    check_shape(hf, &e.shape, rows, cols)?;
    let src_ty = safetensors_dtype(&e.dtype, hf)?;
    let data = usize::try_from(e.start).ok().zip(usize::try_from(e.end).ok()).and_then(|(s, t)| bytes.get(s..t));
    let data = data.ok_or_else(|| Error::corrupt(what, format!("{hf}: bytes {}..{} are outside the file", e.start, e.end)))?;
    from_checkpoint(src_ty, data, rows, cols, format)
}


/// One tensor of a safetensors header: dtype name, shape, absolute byte range in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct SafetensorsEntry {
    pub dtype: String,
    pub shape: Vec<usize>,
    pub start: u64,
    pub end: u64,
}

/// The most bytes a safetensors JSON header may take (the `safetensors` crate's limit).
pub const MAX_SAFETENSORS_HEADER: u64 = 100_000_000;

/// The length of a safetensors header from the file's first 8 bytes, checked against the
/// length of the file (`file_len`): how the web loader reads a shard before fetching its header.
pub fn safetensors_header_len(first: &[u8], file_len: u64, what: &str) -> Result<u64> {
    let Some(b) = first.get(..8) else {
        return Err(Error::corrupt(what, "truncated safetensors header"));
    };
    let n = u64::from_le_bytes(b.try_into().unwrap());
    if n > file_len.saturating_sub(8) || n > MAX_SAFETENSORS_HEADER {
        return Err(Error::corrupt(what, format!("safetensors header of {n} bytes in a {file_len}-byte file")));
    }
    Ok(n)
}

/// A safetensors JSON header (`json`, the `header_len` bytes after the length) of a file of
/// `file_len` bytes: every tensor with its absolute byte range, each range inside the file.
/// How the web loader reads a shard without fetching the whole file.
pub fn safetensors_header(json: &[u8], header_len: u64, file_len: u64, what: &str) -> Result<std::collections::HashMap<String, SafetensorsEntry>> {
    let v: serde_json::Value = serde_json::from_slice(json).map_err(|e| Error::corrupt(what, e.to_string()))?;
    let mut tensors = std::collections::HashMap::new();
    for (name, t) in v.as_object().ok_or_else(|| Error::corrupt(what, "header is not an object"))? {
        if name == "__metadata__" {
            continue;
        }
        let dtype = t["dtype"].as_str().unwrap_or("").to_string();
        let shape = t["shape"]
            .as_array()
            .and_then(|a| a.iter().map(|x| x.as_u64().and_then(|x| usize::try_from(x).ok())).collect::<Option<Vec<usize>>>())
            .ok_or_else(|| Error::corrupt(what, format!("{name}: shape is not a list of sizes")))?;
        let off = t["data_offsets"].as_array().and_then(|a| Some((a.first()?.as_u64()?, a.get(1)?.as_u64()?)));
        let (s, e) = off.ok_or_else(|| Error::corrupt(what, format!("{name}: no data_offsets")))?;
        let base = header_len.saturating_add(8);
        let range = base.checked_add(s).zip(base.checked_add(e)).filter(|(s, e)| s <= e && *e <= file_len);
        let Some((start, end)) = range else {
            return Err(Error::corrupt(what, format!("{name}: data_offsets {s}..{e} are not a byte range inside the {file_len}-byte file (past the end?)")));
        };
        // The byte range must be exactly what the shape and dtype take (checked in u64, before
        // the web loader fetches a byte of it).
        // (An unsupported dtype is left for the load to name.)
        if let Ok(ty) = safetensors_dtype(&dtype, name) {
            let elem = ty.block_bytes() as u64;
            let want = shape.iter().try_fold(elem, |a, &d| a.checked_mul(d as u64));
            if want != Some(end - start) {
                return Err(Error::corrupt(what, format!("{name}: {} bytes for shape {shape:?} of {dtype}", end - start)));
            }
        }
        tensors.insert(name.clone(), SafetensorsEntry { dtype, shape, start, end });
    }
    Ok(tensors)
}
