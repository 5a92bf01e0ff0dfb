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
    if data.len() != rb * rows {
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
        n.is_empty() || n.contains(['/', '\\', ':']) || n.starts_with('.') || n.chars().any(char::is_control)
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
