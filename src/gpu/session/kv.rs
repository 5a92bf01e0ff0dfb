//! The KV cache's storage: its type (f32, f16, or llama.cpp's q8_0 / q4_0 blocks), the words a
//! cache row takes, how a layer's cache is laid out in buffers (one, or one per group of KV heads
//! when one buffer would pass the device's binding limit), and the context sizes that fit.
//!
//! Row layout (`shaders/kv_types.wgsl` reads and writes it): a row is one token's keys (or
//! values) for the KV heads of one buffer, in u32 words. f32: one value a word; f16: two
//! (`pack2x16float`); q8_0 and q4_0: the values in blocks of 32, each quantized as llama.cpp does
//! (q8_0: d = max|x| / 127, codes round(x / d); q4_0: d = the value of largest magnitude / -8,
//! codes min(15, trunc(x / d + 8.5)) - 8), the row's codes first (4 a word for q8_0, 8 a word
//! for q4_0, in order), then its blocks' f16 scales two a word, the row padded to whole vec4s:
//! the bytes per value are llama.cpp's (34 per 32 for q8_0, 18 for q4_0, plus the padding), but
//! no word holds parts of two blocks' codes and every row starts on a 16-byte boundary. A
//! quantized block holds its values rotated by the normalised 32-point Walsh-Hadamard transform
//! ([`hadamard32`]), which spreads an outlier over the block before it sets the block's scale;
//! attention rotates the query the same way and its output back (the transform is orthonormal
//! and its own inverse), so nothing outside the cache sees rotated values.

use crate::error::{Error, Result};
use crate::model::config::ModelConfig;

/// How the KV cache stores keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvType {
    F32,
    #[default]
    F16,
    Q8_0,
    Q4_0,
}

impl KvType {
    pub const ALL: [KvType; 4] = [KvType::F16, KvType::F32, KvType::Q8_0, KvType::Q4_0];
    /// The accepted names, for messages.
    pub const NAMES: &'static str = "f16, f32, q8_0 or q4_0";

    pub fn parse(s: &str) -> Result<KvType> {
        KvType::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| Error::Input(format!("unknown KV cache type {s:?}: use {}", KvType::NAMES)))
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    /// The kernels' `KV_TYPE` override.
    pub fn code(self) -> u32 {
        match self {
            KvType::F32 => 0,
            KvType::F16 => 1,
            KvType::Q8_0 => 2,
            KvType::Q4_0 => 3,
        }
    }

    pub fn quantized(self) -> bool {
        matches!(self, KvType::Q8_0 | KvType::Q4_0)
    }

    /// u32 words one cache row of `vals` values takes (see the module docs).
    pub fn row_words(self, vals: usize) -> usize {
        match self {
            KvType::F32 => vals,
            KvType::F16 => vals.div_ceil(2),
            KvType::Q8_0 => vals.div_ceil(4) + vals.div_ceil(64).next_multiple_of(4),
            KvType::Q4_0 => vals.div_ceil(8) + vals.div_ceil(64).next_multiple_of(4),
        }
    }

    /// Why `cfg`'s heads cannot use this type, if they cannot: quantized blocks of 32 must not
    /// straddle two heads.
    pub fn unsupported(self, cfg: &ModelConfig) -> Option<String> {
        (self.quantized() && !cfg.head_dim.is_multiple_of(32))
            .then(|| format!("a {} KV cache needs a head_dim that is a multiple of 32 (this model's is {})", self.name(), cfg.head_dim))
    }
}

/// The normalised Walsh-Hadamard transform of a 32-value block, in place (its own inverse):
/// the same butterflies, in the same order, as `kv_hadamard` in `shaders/kv_types.wgsl`.
pub fn hadamard32(x: &mut [f32]) {
    assert_eq!(x.len(), 32);
    let mut h = 1;
    while h < 32 {
        for i in (0..32).filter(|i| i & h == 0) {
            let (a, b) = (x[i], x[i + h]);
            x[i] = a + b;
            x[i + h] = a - b;
        }
        h <<= 1;
    }
    // 1 / sqrt(32), exactly the f32 the kernels use.
    x.iter_mut().for_each(|v| *v *= std::f32::consts::FRAC_1_SQRT_2 / 4.0);
}

/// llama.cpp's `roundf`: halves away from zero.
fn round_away(x: f32) -> f32 {
    x.signum() * (x.abs() + 0.5).floor()
}

impl KvType {
    /// One cache row of `x` (its length even; a multiple of 32 for quantized types) as words:
    /// the host's reference of what the kernels store (`shaders/kv_types.wgsl`).
    pub fn encode_row(self, x: &[f32]) -> Vec<u32> {
        let f16 = |v: f32| half::f16::from_f32(v.clamp(-65504.0, 65504.0)).to_bits() as u32;
        match self {
            KvType::F32 => x.iter().map(|v| v.to_bits()).collect(),
            KvType::F16 => x.chunks(2).map(|p| f16(p[0]) | f16(p[1]) << 16).collect(),
            KvType::Q8_0 | KvType::Q4_0 => {
                let mut codes = Vec::new();
                let mut scales = Vec::new();
                for b in x.chunks(32) {
                    let mut r = [0f32; 32];
                    r.copy_from_slice(b);
                    hadamard32(&mut r);
                    let b = &r[..];
                    if self == KvType::Q8_0 {
                        let d = b.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
                        codes.extend(b.chunks(4).map(|w| w.iter().enumerate().fold(0u32, |acc, (k, v)| acc | ((round_away(v * id) as i32 as u32) & 255) << (8 * k))));
                        scales.push(d);
                    } else {
                        let mx = b.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
                        let d = mx / -8.0;
                        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                        codes.extend(b.chunks(8).map(|w| w.iter().enumerate().fold(0u32, |acc, (k, v)| acc | (((v * id + 8.5).max(0.0) as u32).min(15)) << (4 * k))));
                        scales.push(d);
                    }
                }
                scales.resize(scales.len().next_multiple_of(2), 0.0);
                codes.extend(scales.chunks(2).map(|p| f16(p[0]) | f16(p[1]) << 16));
                codes.resize(self.row_words(x.len()), 0);
                codes
            }
        }
    }

    /// The `vals` values of a cache row stored as `words` (the inverse of [`KvType::encode_row`]).
    pub fn decode_row(self, words: &[u32], vals: usize) -> Vec<f32> {
        let f16 = |w: u32, i: usize| half::f16::from_bits((w >> (16 * (i & 1))) as u16).to_f32();
        let mut out: Vec<f32> = (0..vals)
            .map(|i| match self {
                KvType::F32 => f32::from_bits(words[i]),
                KvType::F16 => f16(words[i / 2], i),
                KvType::Q8_0 => ((words[i / 4] << (24 - 8 * (i % 4))) as i32 >> 24) as f32 * f16(words[vals / 4 + i / 64], i / 32),
                KvType::Q4_0 => (((words[i / 8] >> (4 * (i % 8))) & 15) as f32 - 8.0) * f16(words[vals / 8 + i / 64], i / 32),
            })
            .collect();
        if self.quantized() {
            out.chunks_mut(32).for_each(hadamard32);
        }
        out
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Bytes one token takes in one layer's K (or V) cache, all KV heads in one buffer.
pub fn kv_row_bytes(cfg: &ModelConfig, ty: KvType) -> usize {
    ty.row_words(cfg.kv_dim()) * 4
}

/// Tokens (of all sequences together) one layer's K or V cache can hold under a binding limit of
/// `max_binding` bytes: a cache larger than one binding is split by KV head across buffers, so
/// the limit is one head's rows in one binding.
pub fn kv_tokens_fit(cfg: &ModelConfig, max_binding: u64, ty: KvType) -> usize {
    (max_binding / (ty.row_words(cfg.head_dim) * 4).max(1) as u64) as usize
}

/// The context CLI commands and the web engine default to: the model's own, at most 4096.
pub const DEFAULT_CTX_CAP: usize = 4096;

/// The one default context size (every front end asks here): the model's own context, at most
/// `cap` tokens and at most what one layer's KV cache holds for `sequences` sequences under a
/// binding limit of `max_binding`; at least 2.
pub fn default_ctx_size(cfg: &ModelConfig, max_binding: u64, ty: KvType, sequences: usize, cap: usize) -> usize {
    let fits = (kv_tokens_fit(cfg, max_binding, ty) / sequences.max(1)).max(2);
    cfg.max_position_embeddings.clamp(2, cap.max(2)).min(fits)
}

/// How one layer's K (and V) cache sits in buffers: `pieces` buffers of `heads` KV heads each
/// (one buffer unless that would pass the binding limit), `rows` rows of `row_words` words.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvLayout {
    pub ty: KvType,
    pub pieces: u32,
    pub heads: u32,
    pub rows: u64,
    pub row_words: u32,
}

impl KvLayout {
    /// The fewest buffers (a divisor of the KV heads) whose each fits `max_binding` bytes.
    pub fn plan(cfg: &ModelConfig, ty: KvType, rows: u64, max_binding: u64) -> Result<KvLayout> {
        if let Some(why) = ty.unsupported(cfg) {
            return Err(Error::Input(why));
        }
        let kvh = cfg.num_kv_heads.max(1) as u32;
        for pieces in (1..=kvh).filter(|p| kvh.is_multiple_of(*p)) {
            let heads = kvh / pieces;
            let row_words = ty.row_words(heads as usize * cfg.head_dim) as u64;
            if rows.checked_mul(row_words * 4).is_some_and(|b| b <= max_binding) {
                return Ok(KvLayout { ty, pieces, heads, rows, row_words: row_words as u32 });
            }
        }
        let one_head = rows.saturating_mul(ty.row_words(cfg.head_dim) as u64 * 4);
        Err(Error::Gpu(format!(
            "a {ty} KV cache of {rows} tokens needs {one_head} bytes per layer for each KV head, over the device's binding limit of {max_binding} bytes; at most {} tokens fit in all (context x sequences)",
            kv_tokens_fit(cfg, max_binding, ty)
        )))
    }

    /// Bytes of one buffer.
    pub fn piece_bytes(&self) -> u64 {
        self.rows * self.row_words as u64 * 4
    }

    /// Values in one row of one buffer.
    pub fn piece_vals(&self, cfg: &ModelConfig) -> u32 {
        self.heads * cfg.head_dim as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(kv_heads: usize, head_dim: usize) -> ModelConfig {
        ModelConfig::from_hf_json(&format!(
            r#"{{"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 1,
                "num_attention_heads": {}, "num_key_value_heads": {kv_heads}, "head_dim": {head_dim}, "rms_norm_eps": 1e-6,
                "rope_theta": 10000.0, "max_position_embeddings": 4096, "vocab_size": 64}}"#,
            kv_heads * 4
        ))
        .unwrap()
    }

    #[test]
    fn row_words_match_llama_cpp_bytes_per_value() {
        // TildeOpen-30B: 8 KV heads x 128 = 1024 values a row.
        assert_eq!(KvType::F16.row_words(1024) * 4, 2048);
        assert_eq!(KvType::Q8_0.row_words(1024) * 4, 1024 / 32 * 34);
        assert_eq!(KvType::Q4_0.row_words(1024) * 4, 1024 / 32 * 18);
        // Rows padded to whole vec4s (SmolLM2: 3 x 64).
        assert_eq!(KvType::Q8_0.row_words(192), 48 + 4);
        assert!(ALL_ROWS.iter().all(|&v| KvType::ALL.iter().all(|t| !t.quantized() || t.row_words(v).is_multiple_of(4))));
    }
    const ALL_ROWS: [usize; 5] = [32, 64, 192, 1024, 4096];

    #[test]
    fn parse_names_every_type_and_refuses_others() {
        for t in KvType::ALL {
            assert_eq!(KvType::parse(t.name()).unwrap(), t);
        }
        let e = KvType::parse("q5_1").unwrap_err().to_string();
        assert!(e.contains("q5_1") && e.contains("q8_0"), "{e}");
    }

    #[test]
    fn a_cache_exactly_the_binding_limit_is_one_buffer_and_larger_spans_heads() {
        // The bench model's heads: 2 x 128, 65536 tokens of f16 are exactly 32 MiB.
        let c = cfg(2, 128);
        let l = KvLayout::plan(&c, KvType::F16, 65536, 32 << 20).unwrap();
        assert_eq!((l.pieces, l.piece_bytes()), (1, 32 << 20));
        let l = KvLayout::plan(&c, KvType::F16, 65537, 32 << 20).unwrap();
        assert_eq!((l.pieces, l.heads), (2, 1));
        let e = KvLayout::plan(&c, KvType::F16, 131073, 32 << 20).unwrap_err().to_string();
        assert!(e.contains("131072 tokens fit"), "{e}");
        // q8_0 halves a row (plus its scales): 64k tokens of 8 x 128 heads in 128 MiB bindings.
        let c = cfg(8, 128);
        assert_eq!(KvLayout::plan(&c, KvType::F16, 65536, 128 << 20).unwrap().pieces, 1);
        assert_eq!(KvLayout::plan(&c, KvType::F16, 65537, 128 << 20).unwrap().pieces, 2);
        assert_eq!(KvLayout::plan(&c, KvType::Q8_0, 65536 * 2, 128 << 20).unwrap().pieces, 2);
    }

    fn rotated(x: &[f32]) -> Vec<f32> {
        let mut x = x.to_vec();
        x.chunks_mut(32).for_each(hadamard32);
        x
    }

    #[test]
    fn host_rows_round_trip_within_half_a_step() {
        let x: Vec<f32> = (0..192).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013 + if i == 70 { 3.0 } else { 0.0 }).collect();
        for ty in KvType::ALL {
            let w = ty.encode_row(&x);
            assert_eq!(w.len(), ty.row_words(x.len()));
            let y = ty.decode_row(&w, x.len());
            // Quantized blocks are quantized rotated: their bound holds there.
            let (x, y) = if ty.quantized() { (rotated(&x), rotated(&y)) } else { (x.clone(), y) };
            for (b, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                // Half a quantization step plus the f16 scale's rounding, or f16's own.
                let step = match ty {
                    KvType::F32 => 0.0,
                    KvType::F16 => amax / 2048.0,
                    KvType::Q8_0 => amax / 127.0 * 0.5 + amax / 2048.0,
                    // (A value of the sign opposite the largest clips at 7 steps: up to a step.)
                    KvType::Q4_0 => amax / 8.0 + amax / 2048.0,
                };
                let worst = xb.iter().zip(yb).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(worst <= step + 1e-6, "{ty} block {b}: error {worst} > {step}");
            }
        }
    }

    #[test]
    fn the_rotation_is_its_own_inverse_and_spreads_an_outlier() {
        let x: Vec<f32> = (0..32).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.1 + if i == 9 { 8.0 } else { 0.0 }).collect();
        let back = rotated(&rotated(&x));
        assert!(x.iter().zip(&back).all(|(a, b)| (a - b).abs() < 1e-5), "{back:?}");
        // Norm kept, largest value cut from 8.x to under half of it.
        let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>().sqrt();
        let r = rotated(&x);
        assert!((norm(&r) - norm(&x)).abs() < 1e-4);
        assert!(r.iter().fold(0f32, |m, v| m.max(v.abs())) < 4.0);
        // So q4_0's error on the block (a value of 8 sets a step of 1 without it) falls.
        let err = |ty: KvType| norm(&x.iter().zip(ty.decode_row(&ty.encode_row(&x), 32)).map(|(a, b)| a - b).collect::<Vec<_>>());
        let mx = x.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = mx / -8.0;
        let plain = norm(&x.iter().map(|&v| v - (((v / d + 8.5).max(0.0) as u32).min(15) as f32 - 8.0) * d).collect::<Vec<_>>());
        assert!(err(KvType::Q4_0) < plain * 0.5, "rotated {} plain {plain}", err(KvType::Q4_0));
    }

    #[test]
    fn quantized_caches_need_heads_in_whole_blocks() {
        let e = KvLayout::plan(&cfg(2, 48), KvType::Q4_0, 16, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("multiple of 32"), "{e}");
        assert!(KvLayout::plan(&cfg(2, 48), KvType::F16, 16, 1 << 20).is_ok());
    }
}
