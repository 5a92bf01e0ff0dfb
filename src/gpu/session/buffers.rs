//! A session's sizes and buffers: the split attention's shape, the activation and cache buffers
//! (the cache's layout is `kv.rs`'s), and the uniform blocks the ops share.

use crate::error::{Error, Result};
use crate::gpu::kernels::MATVEC_MAX_T;
use crate::model::config::ModelConfig;
use crate::model::Model;
use super::*;

/// The kv_copy kernel: its pipeline, one bind group per layer and cache buffer (that buffer's K
/// and V) and its parameter block.
pub(super) struct KvCopy {
    pub(super) pipeline: wgpu::ComputePipeline,
    pub(super) layers: Vec<wgpu::BindGroup>,
    pub(super) params: wgpu::Buffer,
}

/// How big a session's buffers are: tokens per pass, logit rows per pass, how a layer's K (or V)
/// cache is laid out. Checked against the device's binding limit before anything is allocated.
pub(super) struct Sizes {
    pub(super) max_t: usize,
    pub(super) max_out: usize,
    pub(super) kv: KvLayout,
    /// How decode attention splits the context, when the model's heads suit the split kernel.
    pub(super) split: Option<Split>,
}

/// The split attention's shape (see `shaders/attn_split.wgsl`).
#[derive(Clone, Copy)]
pub(super) struct Split {
    /// Query heads per KV head.
    pub(super) g: u32,
    /// Value-row words per thread.
    pub(super) wpt: u32,
    /// Passes of at most `MATVEC_MAX_T` tokens (decode): one token per workgroup.
    pub(super) short: AttnTile,
    /// Longer passes (prefill, one slice): as many tokens per workgroup as fit.
    pub(super) long: AttnTile,
    /// Keys per slice at the least: `MIN_SPAN` with wide attention (a GPU), else one round of
    /// the decode tile (slices stay at most `MAX_SPLITS` for the whole context either way).
    pub(super) min_span: u32,
    /// Whether the slices are sized by each pass's context (wide attention) or by the session's.
    pub(super) wide: bool,
    pub(super) ctx: u32,
    pub(super) max_splits: u32,
}

/// How many tokens a split-attention workgroup takes, and what that leaves for the rest.
#[derive(Clone, Copy, PartialEq)]
pub(super) struct AttnTile {
    /// Tokens per workgroup (R = qt * g query rows).
    pub(super) qt: u32,
    /// Keys per round (R queries and R * chunk scores fit the kernel's workgroup memory).
    pub(super) chunk: u32,
    /// Keys per thread in the score loop: 2 where a round has 128 keys or more.
    pub(super) kb: u32,
    /// Threads per query row in the softmax reductions.
    pub(super) gt: u32,
}

/// The most context slices split attention uses.
pub(super) const MAX_SPLITS: u32 = 32;
/// The fewest keys in a slice of wide attention: 32 slices (workgroups per KV head) at 512.
pub(super) const MIN_SPAN: u32 = 16;
/// The kernel's limits: query rows per workgroup, and floats of workgroup memory for their
/// queries and scores together.
pub(super) const ATTN_MAX_ROWS: u32 = 16;
pub(super) const ATTN_POOL_FLOATS: u32 = 3072;

impl AttnTile {
    /// The tile for `qt` tokens of `g` query heads of `hd` values: the largest round of keys
    /// (at most 256, a power of two) whose scores fit beside the queries.
    pub(super) fn new(g: u32, qt: u32, hd: u32) -> AttnTile {
        let pow2_at_most = |v: u32| 1u32 << (31 - v.max(1).leading_zeros());
        let rows = g * qt;
        let chunk = pow2_at_most(((ATTN_POOL_FLOATS - rows * hd) / rows).min(256));
        AttnTile { qt, chunk, kb: if chunk >= 128 { 2 } else { 1 }, gt: pow2_at_most(64 / rows) }
    }
}

impl Split {
    /// The shape for `c`'s heads (`None` where the kernel cannot take them); `query_tiles`:
    /// several tokens per workgroup in long passes.
    pub(super) fn plan(c: &ModelConfig, ctx: usize, kv: KvType, query_tiles: bool, wide: bool) -> Option<Split> {
        let (heads, kvh, hd) = (c.num_heads as u32, c.num_kv_heads as u32, c.head_dim as u32);
        if kvh == 0 || heads % kvh != 0 {
            return None;
        }
        let g = heads / kvh;
        // Rounds of at least 64 keys (one per thread) beside the queries.
        if g > ATTN_MAX_ROWS || g * (hd + 64) > ATTN_POOL_FLOATS || hd % 8 != 0 || hd > 256 {
            return None;
        }
        // Long passes: as many tokens as keep rounds of 128 keys (two per thread).
        let qt = if query_tiles { (ATTN_MAX_ROWS / g).min(ATTN_POOL_FLOATS / (g * (hd + 128))).max(1) } else { 1 };
        // Columns a thread owns of a value row: f32 words, else pairs of values.
        let cols = if kv == KvType::F32 { hd } else { hd / 2 };
        let wpt = cols.div_ceil(64);
        let short = AttnTile::new(g, 1, hd);
        let ctx = ctx as u32;
        let min_span = if wide { MIN_SPAN } else { short.chunk };
        let mut sp = Split { g, wpt, short, long: AttnTile::new(g, qt, hd), min_span, wide, ctx, max_splits: 0 };
        sp.max_splits = sp.slices(ctx.max(1) - 1).0.max((MAX_SPLITS).min(ctx.div_ceil(min_span)));
        Some(sp)
    }

    /// (slices, keys per slice) of a decode pass whose latest token is at position `last`: wide,
    /// the context of the pass in `MAX_SPLITS` slices, none under `MIN_SPAN` keys (so 32 from
    /// 512 keys on); else slices of the size the session's whole context needs for `MAX_SPLITS`
    /// (a multiple of the decode tile's round).
    pub(super) fn slices(&self, last: u32) -> (u32, u32) {
        let len = last + 1;
        let span = if self.wide {
            len.div_ceil(MAX_SPLITS).max(MIN_SPAN)
        } else {
            self.ctx.div_ceil(MAX_SPLITS).next_multiple_of(self.min_span)
        };
        (len.div_ceil(span), span)
    }
}

impl Sizes {
    pub(super) fn check(model: &Model, opts: &SessionOptions) -> Result<Sizes> {
        let c = &model.cfg;
        let gpu = &model.gpu;
        let maxb = gpu.max_binding - 4;
        if opts.ctx_size == 0 {
            return Err(Error::Input("context size must be at least 1".into()));
        }
        if opts.sequences == 0 {
            return Err(Error::Input("a session needs at least one sequence".into()));
        }
        let widest = c.hidden_size.max(c.q_dim()).max(c.intermediate_size) as u64 * 4;
        // At most 65535: several kernels put the pass's tokens in one dispatch dimension.
        let max_t = (maxb / widest).min(opts.max_batch as u64).min(opts.ctx_size.saturating_mul(opts.sequences) as u64).min(65535) as usize;
        let max_out = (maxb / (c.vocab_size as u64 * 4)).min(max_t as u64) as usize;
        if max_t == 0 || max_out == 0 {
            return Err(Error::Gpu(format!(
                "binding limit {} bytes cannot hold one token's activations or logits",
                gpu.max_binding
            )));
        }
        // Checked: a huge --ctx-size or --parallel wrapped to a small size that passed.
        let rows = opts.ctx_size.checked_mul(opts.sequences).map_or(u64::MAX, |r| r as u64);
        let kv = KvLayout::plan(c, opts.kv, rows, gpu.max_binding).map_err(|e| match e {
            Error::Gpu(m) if opts.sequences > 1 => Error::Gpu(format!("{} sequences x {} tokens: {m}", opts.sequences, opts.ctx_size)),
            e => e,
        })?;
        let fast = &gpu.fast;
        let split = if fast.split_attention { Split::plan(c, opts.ctx_size, opts.kv, fast.query_tiles, fast.wide_attention) } else { None };
        Ok(Sizes { max_t, max_out, kv, split })
    }
}

/// The buffers a pass reads and writes besides the weights: per-step inputs, activations (one
/// row per token of the pass), the output head's rows, and each layer's KV cache.
pub(super) struct Buffers {
    /// Tokens in this pass (`step`) and logit rows (`step_out`).
    pub(super) step: wgpu::Buffer,
    pub(super) step_out: wgpu::Buffer,
    pub(super) tokens: wgpu::Buffer,
    /// Per token of a pass: (position, first cache row of its sequence).
    pub(super) seq: wgpu::Buffer,
    pub(super) rope: wgpu::Buffer,
    pub(super) x: wgpu::Buffer,
    pub(super) xb: wgpu::Buffer,
    /// The integer-dot matvec's input: `xb`'s rows (of passes the matvec takes) as Q8 bytes,
    /// and per 32-value block (scale, scale * sum of the bytes).
    pub(super) xq: wgpu::Buffer,
    pub(super) xs: wgpu::Buffer,
    pub(super) q: wgpu::Buffer,
    pub(super) k: wgpu::Buffer,
    pub(super) v: wgpu::Buffer,
    pub(super) att: wgpu::Buffer,
    pub(super) gate: wgpu::Buffer,
    pub(super) up: wgpu::Buffer,
    pub(super) xout: wgpu::Buffer,
    pub(super) logits: wgpu::Buffer,
    pub(super) argmax: wgpu::Buffer,
    /// Split attention's per-slice partial sums.
    pub(super) part: wgpu::Buffer,
    /// Per layer, (K, V) per cache buffer (`KvLayout::pieces`, each a group of KV heads).
    pub(super) kv: Vec<Vec<(wgpu::Buffer, wgpu::Buffer)>>,
}

impl Buffers {
    pub(super) fn alloc(model: &Model, s: &Sizes) -> Result<Buffers> {
        let c = &model.cfg;
        let gpu = &model.gpu;
        let f32b = |n: usize| (n * 4) as u64;
        let act = |name: &str, width: usize| gpu.storage(name, f32b(s.max_t * width));
        let (int_dot, tq) = (gpu.fast.int_dot, s.max_t.min(MATVEC_MAX_T as usize));
        let mut kv = Vec::with_capacity(model.layers.len());
        let bytes = s.kv.piece_bytes();
        for _ in &model.layers {
            kv.push((0..s.kv.pieces).map(|_| Ok((gpu.storage_exact("k_cache", bytes)?, gpu.storage_exact("v_cache", bytes)?))).collect::<Result<Vec<_>>>()?);
        }
        Ok(Buffers {
            step: gpu.uniform("step", &[0; 16]),
            step_out: gpu.uniform("step_out", &[0; 16]),
            tokens: gpu.storage("tokens", (s.max_t * 4) as u64)?,
            seq: gpu.storage("seq", (s.max_t * 8) as u64)?,
            rope: act("rope", c.head_dim)?,
            x: act("x", c.hidden_size)?,
            xb: act("xb", c.hidden_size)?,
            xq: gpu.storage("xq", if int_dot { (tq * c.hidden_size) as u64 } else { 16 })?,
            xs: gpu.storage("xs", if int_dot { (tq * c.hidden_size / 32 * 8) as u64 } else { 16 })?,
            q: act("q", c.q_dim())?,
            k: act("k", c.kv_dim())?,
            v: act("v", c.kv_dim())?,
            att: act("att", c.q_dim())?,
            gate: act("gate", c.intermediate_size)?,
            up: act("up", c.intermediate_size)?,
            xout: gpu.storage("xout", f32b(s.max_out * c.hidden_size))?,
            logits: gpu.storage("logits", f32b(s.max_out * c.vocab_size))?,
            argmax: gpu.storage("argmax", (s.max_out * 4) as u64)?,
            part: match s.split {
                Some(sp) => {
                    let t = s.max_t.min(MATVEC_MAX_T as usize);
                    gpu.storage("attn_part", f32b(t * c.num_heads * sp.max_splits as usize * (c.head_dim + 2)))?
                }
                None => gpu.storage("attn_part", 16)?,
            },
            kv,
        })
    }
}

/// The uniform blocks the layers' ops share (model constants only; those of the cache's ops one
/// per cache buffer).
pub(super) struct Params {
    pub(super) norm: wgpu::Buffer,
    pub(super) rope_q: wgpu::Buffer,
    pub(super) rope_k: wgpu::Buffer,
    pub(super) rope_kv: wgpu::Buffer,
    pub(super) kv: Vec<wgpu::Buffer>,
    pub(super) attn: Vec<wgpu::Buffer>,
    pub(super) split: Vec<wgpu::Buffer>,
    pub(super) combine: wgpu::Buffer,
    pub(super) ffn: wgpu::Buffer,
    pub(super) argmax: wgpu::Buffer,
}

impl Params {
    pub(super) fn new(b: &Builder, c: &ModelConfig, kv: &KvLayout) -> Params {
        let with_f32 = |mut head: Vec<u8>, v: f32| {
            head.extend_from_slice(&v.to_le_bytes());
            head
        };
        // The first KV head of each cache buffer.
        let pieces = (0..kv.pieces).map(|i| i * kv.heads);
        let (hd, scale) = (c.head_dim as u32, 1.0 / (c.head_dim as f32).sqrt());
        Params {
            norm: b.param(with_f32(u32s(&[c.hidden_size as u32]), c.rms_norm_eps)),
            rope_q: b.param(u32s(&[c.num_heads as u32, c.head_dim as u32])),
            rope_k: b.param(u32s(&[c.num_kv_heads as u32, c.head_dim as u32])),
            rope_kv: b.param(u32s(&[c.num_heads as u32, c.num_kv_heads as u32, c.head_dim as u32])),
            kv: pieces.clone().map(|h0| b.param(u32s(&[c.kv_dim() as u32, h0 * hd, kv.heads * hd]))).collect(),
            attn: pieces
                .clone()
                .map(|h0| {
                    let mut v = with_f32(u32s(&[c.num_heads as u32, c.num_kv_heads as u32, hd]), scale);
                    v.extend(u32s(&[h0, kv.heads]));
                    b.param(v)
                })
                .collect(),
            split: pieces
                .map(|h0| {
                    let mut v = with_f32(u32s(&[c.num_heads as u32, kv.heads, hd]), scale);
                    v.extend(u32s(&[h0]));
                    b.param(v)
                })
                .collect(),
            combine: b.param(u32s(&[c.num_heads as u32, c.head_dim as u32])),
            ffn: b.param(u32s(&[c.intermediate_size as u32])),
            argmax: b.param(u32s(&[c.vocab_size as u32])),
        }
    }
}
