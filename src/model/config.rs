//! The model's hyper-parameters, read from an HF `config.json` (transformers 4 and 5 layouts) or
//! from GGUF `llama.*` metadata, and the rotary embedding tables derived from them.

use crate::error::{Error, Result};
use serde_json::Value;

/// How rotary position embeddings are scaled.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor`.
    Linear { factor: f32 },
    /// YaRN with transformers' semantics (`_compute_yarn_parameters`).
    Yarn {
        factor: f32,
        original_max_position_embeddings: usize,
        beta_fast: f32,
        beta_slow: f32,
        truncate: bool,
        attention_factor: Option<f32>,
        mscale: Option<f32>,
        mscale_all_dim: Option<f32>,
    },
}

/// Typed configuration of a Llama-architecture decoder (TildeOpen and relatives).
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub architecture: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    /// Per-head width; `num_heads * head_dim` may differ from `hidden_size` (distilled models).
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// transformers keeps the rotary `inv_freq` as a floating-point buffer, so a checkpoint
    /// loaded in bfloat16 runs with `inv_freq` rounded to bf16 (even when later upcast to f32).
    /// True for HF checkpoints whose dtype is bfloat16; the HF goldens depend on it.
    pub inv_freq_bf16: bool,
}

fn get_usize(v: &Value, key: &str) -> Result<usize> {
    v.get(key)
        .and_then(Value::as_u64)
        .and_then(|x| usize::try_from(x).ok())
        .ok_or_else(|| Error::Unsupported(format!("config.json lacks integer field `{key}`")))
}

/// The kinds a config.json field may have.
#[derive(Clone, Copy)]
enum Kind {
    Int,
    Num,
    Bool,
    Str,
    /// A token id or a list of them (`eos_token_id`).
    Ids,
}

/// A present field (not null) must have its kind: a wrong one is an error naming the field,
/// never a silent default (`"attention_bias": "true"` read as false, `"hidden_size": 2^32 + 4096`
/// wrapped to 4096 on a 32-bit target).
fn check_kind(obj: &Value, key: &str, kind: Kind, at: &str) -> Result<()> {
    let Some(x) = obj.get(key).filter(|x| !x.is_null()) else { return Ok(()) };
    let id = |x: &Value| x.as_u64().is_some_and(|n| n <= u32::MAX as u64);
    let ok = match kind {
        Kind::Int => x.as_u64().is_some_and(|n| usize::try_from(n).is_ok_and(|n| n <= u32::MAX as usize)),
        Kind::Num => x.is_number(),
        Kind::Bool => x.is_boolean(),
        Kind::Str => x.is_string(),
        Kind::Ids => id(x) || x.as_array().is_some_and(|a| a.iter().all(id)),
    };
    if ok {
        return Ok(());
    }
    let want = match kind {
        Kind::Int => "a non-negative integer below 2^32",
        Kind::Num => "a number",
        Kind::Bool => "true or false",
        Kind::Str => "a string",
        Kind::Ids => "a token id or a list of token ids",
    };
    Err(Error::corrupt("config.json", format!("`{at}{key}` must be {want}, got {x}")))
}

fn opt_f32(v: &Value, key: &str) -> Option<f32> {
    v.get(key).and_then(Value::as_f64).map(|x| x as f32)
}

fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|x| x as u32).collect(),
        _ => vec![],
    }
}

impl ModelConfig {
    /// Parses an HF `config.json` (transformers 4 layout with `rope_theta`/`rope_scaling`, or the
    /// transformers 5 layout with `rope_parameters`).
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| Error::corrupt("config.json", e.to_string()))?;
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        let archs: Vec<&str> = v
            .get("architectures")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if model_type != "llama" && !archs.contains(&"LlamaForCausalLM") {
            return Err(Error::Unsupported(format!(
                "architecture {model_type:?} {archs:?}; only the Llama architecture (TildeOpen) is supported"
            )));
        }
        for flag in ["attention_bias", "mlp_bias"] {
            if v.get(flag).and_then(Value::as_bool) == Some(true) {
                return Err(Error::Unsupported(format!("{flag} = true is not supported")));
            }
        }
        if let Some(act) = v.get("hidden_act").and_then(Value::as_str) {
            if act != "silu" {
                return Err(Error::Unsupported(format!("hidden_act {act:?} (only silu)")));
            }
        }
        // Present fields must have their type: a wrong one is an error naming the field, never a
        // silent default.
        for key in [
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "max_position_embeddings",
        ] {
            match v.get(key) {
                None | Some(Value::Null) => {}
                Some(x) if x.as_u64().is_some_and(|n| n <= u32::MAX as u64) => {}
                Some(x) => return Err(Error::corrupt("config.json", format!("`{key}` must be a non-negative integer below 2^32, got {x}"))),
            }
        }
        for key in ["rms_norm_eps", "rope_theta"] {
            for obj in [Some(&v), v.get("rope_parameters")].into_iter().flatten() {
                match obj.get(key) {
                    None | Some(Value::Null) => {}
                    Some(x) if x.as_f64().is_some() => {}
                    Some(x) => return Err(Error::corrupt("config.json", format!("`{key}` must be a number, got {x}"))),
                }
            }
        }
        for (key, kind) in [
            ("attention_bias", Kind::Bool), ("mlp_bias", Kind::Bool), ("tie_word_embeddings", Kind::Bool),
            ("hidden_act", Kind::Str), ("model_type", Kind::Str), ("dtype", Kind::Str), ("torch_dtype", Kind::Str),
            ("bos_token_id", Kind::Ids), ("eos_token_id", Kind::Ids),
        ] {
            check_kind(&v, key, kind, "")?;
        }
        for (obj, at) in [("rope_scaling", "rope_scaling."), ("rope_parameters", "rope_parameters.")] {
            let Some(o) = v.get(obj).filter(|o| o.is_object()) else { continue };
            for (key, kind) in [
                ("rope_type", Kind::Str), ("type", Kind::Str), ("factor", Kind::Num), ("beta_fast", Kind::Num),
                ("beta_slow", Kind::Num), ("attention_factor", Kind::Num), ("mscale", Kind::Num),
                ("mscale_all_dim", Kind::Num), ("truncate", Kind::Bool), ("original_max_position_embeddings", Kind::Int),
            ] {
                check_kind(o, key, kind, at)?;
            }
        }
        let hidden_size = get_usize(&v, "hidden_size")?;
        let num_heads = get_usize(&v, "num_attention_heads")?;
        let head_dim = match v.get("head_dim").and_then(Value::as_u64) {
            Some(h) => h as usize, // below 2^32: checked above
            None => hidden_size / num_heads.max(1),
        };
        let rope_params = v.get("rope_parameters").filter(|p| p.is_object());
        let rope_scaling_v = rope_params.or_else(|| v.get("rope_scaling").filter(|p| p.is_object()));
        let rope_theta = rope_params
            .and_then(|p| opt_f32(p, "rope_theta"))
            .or_else(|| opt_f32(&v, "rope_theta"))
            .unwrap_or(10000.0);
        let max_position_embeddings = get_usize(&v, "max_position_embeddings").unwrap_or(4096);
        let rope_scaling = match rope_scaling_v {
            None => RopeScaling::None,
            Some(s) => {
                let ty = s
                    .get("rope_type")
                    .or_else(|| s.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                match ty {
                    "default" => RopeScaling::None,
                    "linear" => RopeScaling::Linear {
                        factor: opt_f32(s, "factor").ok_or_else(|| {
                            Error::Unsupported("linear rope scaling without factor".into())
                        })?,
                    },
                    "yarn" => {
                        let original = s
                            .get("original_max_position_embeddings")
                            .and_then(Value::as_u64)
                            .map(|x| x as usize);
                        // The config's own factor, as transformers (4.57 and 5) and llama.cpp take it:
                        // TildeOpen-30b-64k has factor 10 over 8192 tokens but a 65,536-token
                        // maximum, so the ratio of the two lengths (8) would be wrong. Only a
                        // missing factor is that ratio (transformers 5).
                        let factor = match (opt_f32(s, "factor"), original) {
                            (Some(f), _) => f,
                            (None, Some(o)) if o > 0 => max_position_embeddings as f32 / o as f32,
                            (None, _) => return Err(Error::Unsupported("yarn rope scaling without factor".into())),
                        };
                        RopeScaling::Yarn {
                            factor,
                            original_max_position_embeddings: original.unwrap_or(max_position_embeddings),
                            beta_fast: opt_f32(s, "beta_fast").unwrap_or(32.0),
                            beta_slow: opt_f32(s, "beta_slow").unwrap_or(1.0),
                            truncate: s.get("truncate").and_then(Value::as_bool).unwrap_or(true),
                            attention_factor: opt_f32(s, "attention_factor"),
                            mscale: opt_f32(s, "mscale"),
                            mscale_all_dim: opt_f32(s, "mscale_all_dim"),
                        }
                    }
                    other => return Err(Error::Unsupported(format!("rope scaling type {other:?}"))),
                }
            }
        };
        let eos = token_ids(v.get("eos_token_id"));
        let dtype = v.get("dtype").or_else(|| v.get("torch_dtype")).and_then(Value::as_str).unwrap_or("");
        ModelConfig {
            architecture: "llama".into(),
            vocab_size: get_usize(&v, "vocab_size")?,
            hidden_size,
            intermediate_size: get_usize(&v, "intermediate_size")?,
            num_layers: get_usize(&v, "num_hidden_layers")?,
            num_heads,
            num_kv_heads: get_usize(&v, "num_key_value_heads").unwrap_or(num_heads),
            head_dim,
            rms_norm_eps: opt_f32(&v, "rms_norm_eps").unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            max_position_embeddings,
            tie_word_embeddings: v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false),
            bos_token_id: token_ids(v.get("bos_token_id")).first().copied(),
            eos_token_ids: eos,
            inv_freq_bf16: dtype == "bfloat16",
        }
        .validated()
    }

    /// Checks the invariants the kernels rely on.
    pub fn validated(self) -> Result<Self> {
        let c = &self;
        // Every size > 0 and within what any real model has (so nothing absurd is allocated).
        for (name, v, max) in [
            ("hidden_size", c.hidden_size, 1 << 17),
            ("intermediate_size", c.intermediate_size, 1 << 19),
            ("num_hidden_layers", c.num_layers, 1 << 12),
            ("num_attention_heads", c.num_heads, 1 << 12),
            ("num_key_value_heads", c.num_kv_heads, 1 << 12),
            ("head_dim", c.head_dim, 256),
            // 2^21: the output head's matmul puts rows / 64 workgroups in one dimension (at most 65535).
            ("vocab_size", c.vocab_size, 1 << 21),
            ("max_position_embeddings", c.max_position_embeddings, 1 << 24),
        ] {
            if v == 0 || v > max {
                return Err(Error::Unsupported(format!("{name} = {v} (must be between 1 and {max})")));
            }
        }
        for (name, v) in [("rms_norm_eps", c.rms_norm_eps), ("rope_theta", c.rope_theta)] {
            if !(v.is_finite() && v > 0.0) {
                return Err(Error::Unsupported(format!("{name} = {v} (must be finite and > 0)")));
            }
        }
        // A base of 1 or less makes the frequencies grow along the head (and a tiny one
        // overflows them): found by the gguf_header fuzz target (rope_theta 1.7e-44).
        if c.rope_theta <= 1.0 {
            return Err(Error::Unsupported(format!("rope_theta = {} (must be greater than 1)", c.rope_theta)));
        }
        if let RopeScaling::Yarn { original_max_position_embeddings, beta_fast, beta_slow, attention_factor, mscale, mscale_all_dim, .. } = &c.rope_scaling {
            for (name, v) in [("beta_fast", *beta_fast), ("beta_slow", *beta_slow)] {
                if !(v.is_finite() && v > 0.0) {
                    return Err(Error::Unsupported(format!("rope_scaling.{name} = {v} (must be finite and > 0)")));
                }
            }
            if *original_max_position_embeddings == 0 {
                return Err(Error::Unsupported("rope_scaling.original_max_position_embeddings = 0".into()));
            }
            for (name, v) in [("attention_factor", attention_factor), ("mscale", mscale), ("mscale_all_dim", mscale_all_dim)] {
                if let Some(v) = v.filter(|v| !v.is_finite()) {
                    return Err(Error::Unsupported(format!("rope_scaling.{name} = {v} (must be finite)")));
                }
            }
        }
        let factor = match c.rope_scaling {
            RopeScaling::None => None,
            RopeScaling::Linear { factor } | RopeScaling::Yarn { factor, .. } => Some(factor),
        };
        if let Some(f) = factor.filter(|f| !(f.is_finite() && *f > 0.0)) {
            return Err(Error::Unsupported(format!("rope_scaling.factor = {f} (must be finite and > 0)")));
        }
        // Whatever the scaling parameters, the rotary tables the kernels take must be finite.
        let (inv, attn) = c.rope_inv_freq();
        if !(attn.is_finite() && attn > 0.0) || inv.iter().any(|f| !f.is_finite()) {
            return Err(Error::Unsupported(format!("rope_scaling {:?} gives non-finite rotary frequencies", c.rope_scaling)));
        }
        if c.num_kv_heads == 0 || !c.num_heads.is_multiple_of(c.num_kv_heads) {
            return Err(Error::Unsupported(format!(
                "{} query heads are not a multiple of {} KV heads",
                c.num_heads, c.num_kv_heads
            )));
        }
        if !c.head_dim.is_multiple_of(2) || c.head_dim > 256 {
            return Err(Error::Unsupported(format!("head_dim {} (must be even and <= 256)", c.head_dim)));
        }
        for (name, v) in [
            ("hidden_size", c.hidden_size),
            ("intermediate_size", c.intermediate_size),
            ("num_heads * head_dim", c.num_heads * c.head_dim),
        ] {
            if v % 32 != 0 {
                return Err(Error::Unsupported(format!("{name} = {v} is not a multiple of 32")));
            }
        }
        Ok(self)
    }

    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Inverse frequencies (f32, as transformers computes them) and the attention factor that
    /// multiplies cos and sin.
    pub fn rope_inv_freq(&self) -> (Vec<f32>, f32) {
        let (mut inv, attn) = self.rope_inv_freq_f32();
        if self.inv_freq_bf16 {
            inv.iter_mut().for_each(|f| *f = half::bf16::from_f32(*f).to_f32());
        }
        (inv, attn)
    }

    fn rope_inv_freq_f32(&self) -> (Vec<f32>, f32) {
        let dim = self.head_dim;
        let base = self.rope_theta as f64;
        let half = dim / 2;
        let pos_freqs: Vec<f32> = (0..half)
            .map(|i| base.powf((2 * i) as f64 / dim as f64) as f32)
            .collect();
        match &self.rope_scaling {
            RopeScaling::None => (pos_freqs.iter().map(|p| 1.0 / p).collect(), 1.0),
            RopeScaling::Linear { factor } => (pos_freqs.iter().map(|p| 1.0 / p / factor).collect(), 1.0),
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                truncate,
                attention_factor,
                mscale,
                mscale_all_dim,
            } => {
                let factor = *factor as f64;
                let get_mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
                let attn = match attention_factor {
                    Some(a) => *a as f64,
                    None => match (mscale, mscale_all_dim) {
                        (Some(m), Some(ma)) if *m != 0.0 && *ma != 0.0 => {
                            get_mscale(factor, *m as f64) / get_mscale(factor, *ma as f64)
                        }
                        _ => get_mscale(factor, 1.0),
                    },
                };
                let omax = *original_max_position_embeddings as f64;
                let corr_dim = |rot: f64| {
                    (dim as f64 * (omax / (rot * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * base.ln())
                };
                let (mut low, mut high) = (corr_dim(*beta_fast as f64), corr_dim(*beta_slow as f64));
                if *truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0) as f32;
                let mut high = high.min(dim as f64 - 1.0) as f32;
                if low == high {
                    high += 0.001;
                }
                let inv: Vec<f32> = (0..half)
                    .map(|i| {
                        let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                        let extra_factor = 1.0 - ramp;
                        let extra = 1.0 / pos_freqs[i];
                        let inter = 1.0 / (factor as f32 * pos_freqs[i]);
                        inter * (1.0 - extra_factor) + extra * extra_factor
                    })
                    .collect();
                (inv, attn as f32)
            }
        }
    }
}

/// cos/sin rows for each of `positions`, laid out `[n][head_dim/2]` as interleaved
/// (cos, sin) pairs, already multiplied by the attention factor. Computed on the CPU so the
/// angle is rounded exactly as transformers rounds it (f32 product) whatever the GPU's sin is.
pub fn rope_table(inv_freq: &[f32], attention_factor: f32, positions: impl IntoIterator<Item = usize>) -> Vec<f32> {
    let positions = positions.into_iter();
    let mut out = Vec::with_capacity(positions.size_hint().0 * inv_freq.len() * 2);
    for p in positions {
        let pf = p as f32;
        for &f in inv_freq {
            let angle = (f * pf) as f64;
            out.push((angle.cos() as f32) * attention_factor);
            out.push((angle.sin() as f32) * attention_factor);
        }
    }
    out
}
