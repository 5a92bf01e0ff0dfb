//! GGUF v2/v3 parsing: header, metadata and tensor directory. Tensor data stays where it is and
//! is read tensor by tensor by the loader.

use crate::model::config::{ModelConfig, RopeScaling};
use crate::error::{Error, Result};
use crate::model::quant::GgmlType;
use crate::model::tensor::HostTensor;
use std::borrow::Cow;
use std::collections::HashMap;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U64(u64),
    I64(i64),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::U64(v) => Some(*v),
            Value::I64(v) if *v >= 0 => Some(*v as u64),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::F64(v) => Some(*v),
            Value::U64(v) => Some(*v as f64),
            Value::I64(v) => Some(*v as f64),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// One entry of the tensor directory.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: `dims[0]` is the contiguous (column) dimension.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Absolute byte offset in the file.
    pub offset: u64,
    pub size: u64,
}

/// A parsed GGUF header.
#[derive(Debug, Clone)]
pub struct Gguf {
    pub version: u32,
    pub metadata: HashMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    pub data_offset: u64,
    /// Tensor name -> index in `tensors`.
    index: HashMap<String, usize>,
}

/// The most elements a metadata array may have (the largest real vocabularies and merge lists
/// are a few hundred thousand).
const MAX_ARRAY: u64 = 1 << 24;
/// The most array elements all metadata may hold together (each is a 32-byte `Value` once
/// parsed: at most 256 MiB), about ten times a 256k-token vocabulary with its scores, types and
/// merges.
const MAX_ELEMENTS: u64 = 1 << 23;
/// The most bytes a header may take (real ones are a few MiB, the largest vocabularies tens).
const MAX_HEADER: usize = 256 << 20;

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
    path: &'a str,
    /// Set when a read ran past the end of `b` (a prefix of the file may just be too short).
    short: bool,
    /// Metadata array elements read so far.
    elements: u64,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.pos.saturating_add(n) > MAX_HEADER {
            return Err(Error::corrupt(self.path, format!("the GGUF header runs past {} MiB", MAX_HEADER >> 20)));
        }
        if self.b.len() - self.pos < n {
            self.short = true;
            return Err(Error::corrupt(self.path, "truncated GGUF header"));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn string(&mut self) -> Result<String> {
        let n = self.u64()?;
        if n > (1 << 30) {
            return Err(Error::corrupt(self.path, format!("string length {n} is implausible")));
        }
        let s = self.take(n as usize)?;
        String::from_utf8(s.to_vec()).map_err(|_| Error::corrupt(self.path, "metadata string is not UTF-8"))
    }
    fn value(&mut self, ty: u32, depth: u32) -> Result<Value> {
        Ok(match ty {
            0 => Value::U64(self.take(1)?[0] as u64),
            1 => Value::I64(self.take(1)?[0] as i8 as i64),
            2 => Value::U64(u16::from_le_bytes(self.take(2)?.try_into().unwrap()) as u64),
            3 => Value::I64(i16::from_le_bytes(self.take(2)?.try_into().unwrap()) as i64),
            4 => Value::U64(self.u32()? as u64),
            5 => Value::I64(self.u32()? as i32 as i64),
            6 => Value::F64(f32::from_le_bytes(self.take(4)?.try_into().unwrap()) as f64),
            7 => Value::Bool(self.take(1)?[0] != 0),
            8 => Value::Str(self.string()?),
            9 => {
                if depth > 2 {
                    return Err(Error::corrupt(self.path, "nested arrays too deep"));
                }
                let et = self.u32()?;
                let n = self.u64()?;
                // Every element takes at least this many bytes of the header, so the count is
                // bounded by what is left before anything is allocated.
                let min_bytes: u64 = match et {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10 | 11 | 12 => 8,
                    9 => 12,
                    _ => 1,
                };
                if n.saturating_mul(min_bytes) > (self.b.len() - self.pos) as u64 {
                    self.short = true;
                    return Err(Error::corrupt(self.path, "truncated GGUF header (array)"));
                }
                // A parsed element takes far more memory than its bytes in the file (a u8 is a
                // 32-byte Value): a count beyond any real vocabulary or merge list is refused
                // before it is allocated, whatever the file's size.
                if n > MAX_ARRAY {
                    return Err(Error::corrupt(self.path, format!("a metadata array of {n} elements (at most {MAX_ARRAY})")));
                }
                self.elements += n;
                if self.elements > MAX_ELEMENTS {
                    return Err(Error::corrupt(self.path, format!("metadata arrays of more than {MAX_ELEMENTS} elements in all")));
                }
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(et, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(self.u64()? as i64),
            12 => Value::F64(f64::from_le_bytes(self.take(8)?.try_into().unwrap())),
            t => return Err(Error::corrupt(self.path, format!("unknown metadata value type {t}"))),
        })
    }
}

impl Gguf {
    /// Parses the header from the first bytes of a file of `file_len` bytes. `bytes` may be the
    /// whole file (memory-mapped) or just a prefix; a prefix too short gives a "truncated" error.
    pub fn parse(bytes: &[u8], file_len: u64, path: &str) -> Result<Self> {
        Self::parse_from(&mut Reader { b: bytes, pos: 0, path, short: false, elements: 0 }, file_len)
    }

    /// As [`Gguf::parse`] on a prefix of the file, but `Ok(None)` when the header runs past the
    /// prefix and the file has more bytes: the caller reads more and tries again. Every other
    /// fault (a tensor past the end of the file, a bad count) is an error however much is read.
    pub fn parse_prefix(bytes: &[u8], file_len: u64, path: &str) -> Result<Option<Self>> {
        let mut r = Reader { b: bytes, pos: 0, path, short: false, elements: 0 };
        match Self::parse_from(&mut r, file_len) {
            Err(_) if r.short && (bytes.len() as u64) < file_len => Ok(None),
            g => g.map(Some),
        }
    }

    fn parse_from(r: &mut Reader, file_len: u64) -> Result<Self> {
        let (bytes, path) = (r.b, r.path);
        if r.take(4).map_err(|_| Error::corrupt(path, "file too short to be GGUF"))? != b"GGUF" {
            return Err(Error::corrupt(path, "not a GGUF file (bad magic)"));
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(Error::Unsupported(format!("GGUF version {version} (2 and 3 are supported)")));
        }
        let n_tensors = r.u64()?;
        let n_kv = r.u64()?;
        // A tensor entry takes at least 32 header bytes and a metadata entry 13: counts beyond
        // what the header holds are refused before anything is allocated.
        let left = (bytes.len() - r.pos) as u64;
        if n_tensors > 1 << 20 || n_kv > 1 << 20 || n_tensors.saturating_mul(32).saturating_add(n_kv.saturating_mul(13)) > left.max(file_len.min(1 << 30)) {
            return Err(Error::corrupt(path, "implausible tensor or metadata count"));
        }
        let mut metadata = HashMap::new();
        for _ in 0..n_kv {
            let k = r.string()?;
            let t = r.u32()?;
            let v = r.value(t, 0)?;
            metadata.insert(k, v);
        }
        let align = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() && a <= 1 << 16 => a,
                _ => return Err(Error::corrupt(path, "general.alignment must be a power of two up to 65536")),
            },
        };
        let mut raw = Vec::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let name = r.string()?;
            let nd = r.u32()?;
            if nd == 0 || nd > 4 {
                return Err(Error::corrupt(path, format!("tensor {name} has {nd} dimensions")));
            }
            let dims = (0..nd).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
            if dims.contains(&0) {
                return Err(Error::corrupt(path, format!("tensor {name} has a zero dimension ({dims:?})")));
            }
            let ty_id = r.u32()?;
            let off = r.u64()?;
            raw.push((name, dims, ty_id, off));
        }
        let data_offset = (r.pos as u64).div_ceil(align) * align;
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, dims, ty_id, off) in raw {
            let ty = GgmlType::from_gguf(ty_id).map_err(|e| Error::Unsupported(format!("{name}: {e}")))?;
            let n: u64 = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).ok_or_else(|| {
                Error::corrupt(path, format!("tensor {name} dimensions overflow"))
            })?;
            if !n.is_multiple_of(ty.block_elems() as u64) || dims[0] % ty.block_elems() as u64 != 0 {
                return Err(Error::corrupt(path, format!("tensor {name}: rows are not whole {} blocks", ty.name())));
            }
            let size = (n / ty.block_elems() as u64)
                .checked_mul(ty.block_bytes() as u64)
                .ok_or_else(|| Error::corrupt(path, format!("tensor {name}: {n} elements of {} overflow the byte size", ty.name())))?;
            if off % align != 0 {
                return Err(Error::corrupt(path, format!("tensor {name}: offset {off} is not aligned to general.alignment {align}")));
            }
            let offset = data_offset.checked_add(off).ok_or_else(|| Error::corrupt(path, format!("tensor {name}: offset {off} overflows")))?;
            if offset.checked_add(size).is_none_or(|end| end > file_len) {
                return Err(Error::corrupt(
                    path,
                    format!("tensor {name} ends past the end of the file (truncated download?)"),
                ));
            }
            tensors.push(TensorInfo { name, dims, ty, offset, size });
        }
        // Tensors may not overlap.
        let mut spans: Vec<(u64, u64, &str)> = tensors.iter().map(|t| (t.offset, t.offset + t.size, t.name.as_str())).collect();
        spans.sort_unstable();
        for w in spans.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(Error::corrupt(path, format!("tensors {} and {} overlap", w[0].2, w[1].2)));
            }
        }
        let mut index = HashMap::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if index.insert(t.name.clone(), i).is_some() {
                return Err(Error::corrupt(path, format!("tensor {} appears twice", t.name)));
            }
        }
        Ok(Gguf { version, metadata, tensors, data_offset, index })
    }

    pub fn get(&self, k: &str) -> Option<&Value> {
        self.metadata.get(k)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The model configuration from `llama.*` metadata.
    pub fn config(&self) -> Result<ModelConfig> {
        let arch = self.get("general.architecture").and_then(Value::as_str).unwrap_or("");
        if arch != "llama" {
            return Err(Error::Unsupported(format!(
                "architecture {arch:?}; only llama (TildeOpen, SmolLM2, ...) is supported"
            )));
        }
        // A key that is absent takes its default; one that is present with the wrong type (or
        // a value past this target's usize) is an error, not a silent default.
        let opt_u = |k: &str| -> Result<Option<usize>> {
            match self.get(&format!("llama.{k}")) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|v| usize::try_from(v).ok())
                    .map(Some)
                    .ok_or_else(|| Error::corrupt("GGUF metadata", format!("llama.{k} must be a non-negative integer, not {v:?}"))),
            }
        };
        let u = |k: &str| -> Result<usize> { opt_u(k)?.ok_or_else(|| Error::Unsupported(format!("GGUF lacks llama.{k}"))) };
        let f = |k: &str| -> Result<Option<f64>> {
            match self.get(&format!("llama.{k}")) {
                None => Ok(None),
                Some(v) => v.as_f64().map(Some).ok_or_else(|| Error::corrupt("GGUF metadata", format!("llama.{k} must be a number, not {v:?}"))),
            }
        };
        let hidden = u("embedding_length")?;
        let heads = u("attention.head_count")?;
        let embd = self
            .tensor("token_embd.weight")
            .ok_or_else(|| Error::Unsupported("GGUF has no token_embd.weight".into()))?;
        let vocab = match opt_u("vocab_size")? {
            Some(v) => v,
            None => usize::try_from(embd.dims.get(1).copied().unwrap_or(0)).unwrap_or(0),
        };
        let ctx = opt_u("context_length")?.unwrap_or(4096);
        let scaling_type = match self.get("llama.rope.scaling.type") {
            None => None,
            Some(v) => Some(v.as_str().ok_or_else(|| Error::corrupt("GGUF metadata", format!("llama.rope.scaling.type must be a string, not {v:?}")))?),
        };
        let scaling = match scaling_type {
            None | Some("none") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear { factor: f("rope.scaling.factor")?.unwrap_or(1.0) as f32 },
            Some("yarn") => {
                let orig = opt_u("rope.scaling.original_context_length")?.unwrap_or(ctx);
                RopeScaling::Yarn {
                    // The file's factor (llama.cpp's freq_scale = 1 / factor); the ratio of the two
                    // context lengths only where it is missing (TildeOpen-30b-64k: 10, not 65536 / 8192).
                    factor: match f("rope.scaling.factor")? {
                        Some(x) => x as f32,
                        None => ctx as f32 / orig as f32,
                    },
                    original_max_position_embeddings: orig,
                    beta_fast: f("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0) as f32,
                    beta_slow: f("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0) as f32,
                    truncate: true,
                    attention_factor: f("rope.scaling.attn_factor")?.filter(|a| *a != 0.0 && *a != 1.0).map(|a| a as f32),
                    mscale: None,
                    mscale_all_dim: None,
                }
            }
            Some(other) => return Err(Error::Unsupported(format!("rope scaling type {other:?}"))),
        };
        let head_dim = opt_u("attention.key_length")?.unwrap_or(hidden / heads.max(1));
        // Rotary embedding over part of each head is not implemented: refused, not run wrong.
        if let Some(rot) = opt_u("rope.dimension_count")? {
            if rot != head_dim {
                return Err(Error::Unsupported(format!("llama.rope.dimension_count {rot} (rotary over part of a {head_dim}-wide head)")));
            }
        }
        let tok = |k: &str| -> Result<Option<u32>> {
            match self.get(&format!("tokenizer.ggml.{k}")) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|v| u32::try_from(v).ok())
                    .map(Some)
                    .ok_or_else(|| Error::corrupt("GGUF metadata", format!("tokenizer.ggml.{k} must be a token id, not {v:?}"))),
            }
        };
        ModelConfig {
            architecture: arch.into(),
            vocab_size: vocab,
            hidden_size: hidden,
            intermediate_size: u("feed_forward_length")?,
            num_layers: u("block_count")?,
            num_heads: heads,
            num_kv_heads: opt_u("attention.head_count_kv")?.unwrap_or(heads),
            head_dim,
            rms_norm_eps: f("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5) as f32,
            rope_theta: f("rope.freq_base")?.unwrap_or(10000.0) as f32,
            rope_scaling: scaling,
            max_position_embeddings: ctx,
            tie_word_embeddings: self.tensor("output.weight").is_none(),
            bos_token_id: tok("bos_token_id")?,
            eos_token_ids: tok("eos_token_id")?.into_iter().collect(),
            inv_freq_bf16: false,
        }
        .validated()
    }
}

/// A GGUF tensor's bytes as a GPU-ready [`HostTensor`]: the shape checked against
/// `[rows, cols]`, Q and K rows back in HF order (llama.cpp's row permutation undone) so one
/// rotation convention serves both formats.
pub fn host_tensor<'a>(info: &TensorInfo, data: &'a [u8], rows: usize, cols: usize, cfg: &ModelConfig) -> Result<HostTensor<'a>> {
    let name = &info.name;
    // Products were checked against overflow at parse time; on 32-bit targets they must still fit.
    let fit = |v: u64| usize::try_from(v).map_err(|_| Error::Shape(format!("{name}: {v} does not fit in memory on this target")));
    let (c, r) = (fit(info.dims[0])?, fit(info.dims.iter().skip(1).product::<u64>())?);
    if (r, c) != (rows, cols) {
        return Err(Error::Shape(format!("{name} is {r}x{c}, expected {rows}x{cols}")));
    }
    if data.len() as u64 != info.size {
        return Err(Error::Shape(format!("{name}: {} bytes, expected {}", data.len(), info.size)));
    }
    let heads = if name.ends_with("attn_q.weight") {
        Some(cfg.num_heads)
    } else if name.ends_with("attn_k.weight") {
        Some(cfg.num_kv_heads)
    } else {
        None
    };
    let data = match heads {
        Some(h) => Cow::Owned(unpermute_rows(data, rows, h)?),
        None => Cow::Borrowed(data),
    };
    Ok(HostTensor { ty: info.ty, rows, cols, data })
}

/// llama.cpp stores row `h*d + 2i + s` of a head where HF has row `h*d + s*d/2 + i`.
fn unpermute_rows(data: &[u8], rows: usize, heads: usize) -> Result<Vec<u8>> {
    if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return Err(Error::Shape(format!("{rows} Q/K rows do not split into {heads} heads")));
    }
    let rb = data.len() / rows;
    let d = rows / heads;
    let mut out = vec![0u8; data.len()];
    for h in 0..heads {
        for i in 0..d / 2 {
            for s in 0..2 {
                let src = h * d + 2 * i + s;
                let dst = h * d + s * (d / 2) + i;
                out[dst * rb..(dst + 1) * rb].copy_from_slice(&data[src * rb..(src + 1) * rb]);
            }
        }
    }
    Ok(out)
}
