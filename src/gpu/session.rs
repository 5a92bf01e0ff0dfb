//! A generation session: KV cache, activation buffers and the recorded forward pass. Bind groups
//! and pipelines are built once; each step writes a small uniform, the token ids, each token's
//! (position, cache row) and the rope table, then records the whole pass into one command buffer
//! and submits it once. A session holds one or more sequences (each its own span of the KV
//! cache); one pass can extend several of them at once (continuous batching).

use crate::model::config::{rope_table, ModelConfig};
use crate::error::{Error, Result};
use crate::gpu::kernels::{has_int_dot, matvec_lanes, matvec_sg_threads, Kernel, MATVEC_MAX_T};
use crate::gpu::Gpu;
use crate::model::{FfnIn, GpuMatrix, Layer, Model};
use std::cell::RefCell;
use std::collections::HashMap;

/// Session settings.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Context window in tokens (KV cache length).
    pub ctx_size: usize,
    /// Store K and V as f16 packed in u32 (default) or as f32.
    pub kv_f16: bool,
    /// Largest number of tokens per forward pass (further capped by the binding limit).
    pub max_batch: usize,
    /// Independent sequences, each with `ctx_size` tokens of KV cache.
    pub sequences: usize,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions { ctx_size: 4096, kv_f16: true, max_batch: 256, sequences: 1 }
    }
}

#[derive(Clone, Copy)]
enum Dispatch {
    /// Matrix with `n` rows: matvec (`rows` rows a workgroup) for a few tokens, tiled matmul for more.
    Mat { n: u32, rows: u32 },
    Embed { k: u32 },
    PerToken,
    /// An RMSNorm whose consumers fold it into their matvec: it runs only for passes that take
    /// the tiled matmul (more than `MATVEC_MAX_T` tokens).
    NormForMatmul,
    /// A norm that writes the Q8 input of the integer-dot matvecs after it: it runs only for
    /// passes the matvec takes (at most `MATVEC_MAX_T` tokens).
    QuantForMatvec,
    Threads { per_token: u32 },
    Kv { pairs: u32 },
    Attn { heads: u32 },
    /// Split attention: (KV heads, context slices, token tiles of `qt`), for the passes in
    /// `passes` (a kernel for decode, another for prefill, when their tiles differ).
    AttnSplit { kv_heads: u32, qt: u32, passes: Passes },
    /// Merging the slices: skipped when the pass needs one.
    AttnCombine { heads: u32 },
}


struct Op {
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    name: &'static str,
    pipeline: wgpu::ComputePipeline,
    /// The matvec pipelines of a matrix op: for one token, and for up to `MATVEC_MAX_T`; and
    /// their bind group (its own when the matvec folds in the RMSNorm and so reads the residual
    /// stream instead of the normed rows).
    matvec: Option<([wgpu::ComputePipeline; 2], wgpu::BindGroup)>,
    bind: wgpu::BindGroup,
    dispatch: Dispatch,
}

/// Which passes an op runs in, by their token count.
#[derive(Clone, Copy)]
enum Passes {
    All,
    /// At most `MATVEC_MAX_T` tokens (decode, and the matvec's passes).
    Short,
    /// More tokens (prefill).
    Long,
}

impl Passes {
    fn take(self, t: u32) -> bool {
        match self {
            Passes::All => true,
            Passes::Short => t <= MATVEC_MAX_T,
            Passes::Long => t > MATVEC_MAX_T,
        }
    }
}

const MAX_WG: u32 = 65535;

fn split(wgs: u32) -> (u32, u32) {
    if wgs <= MAX_WG {
        (wgs.max(1), 1)
    } else {
        (MAX_WG, wgs.div_ceil(MAX_WG))
    }
}

impl Op {
    /// Whether this op runs in a pass of `t` tokens whose attention spans `splits` slices
    /// (merging them is skipped for one; a norm the matvecs fold in, below the matmul's size).
    fn runs(&self, t: u32, splits: u32) -> bool {
        match self.dispatch {
            Dispatch::AttnCombine { .. } => splits > 1,
            Dispatch::NormForMatmul => Passes::Long.take(t),
            Dispatch::QuantForMatvec => Passes::Short.take(t),
            Dispatch::AttnSplit { passes, .. } => passes.take(t),
            _ => true,
        }
    }

    /// Records the op for a pass of `t` tokens (`splits` context slices for split attention).
    fn record(&self, pass: &mut wgpu::ComputePass<'_>, t: u32, splits: u32) {
        if !self.runs(t, splits) {
            return;
        }
        let (pipe, bind, (x, y, z)) = match self.dispatch {
            Dispatch::AttnSplit { kv_heads, qt, .. } => (&self.pipeline, &self.bind, (kv_heads, splits.max(1), t.div_ceil(qt))),
            Dispatch::AttnCombine { heads } => (&self.pipeline, &self.bind, (heads, t, 1)),
            Dispatch::Mat { n, rows } if t <= MATVEC_MAX_T => {
                let (pipes, bind) = self.matvec.as_ref().unwrap();
                let (x, y) = split(n.div_ceil(rows));
                (&pipes[(t > 1) as usize], bind, (x, y, 1))
            }
            _ => {
                let (x, y) = self.grid(t);
                (&self.pipeline, &self.bind, (x, y, 1))
            }
        };
        pass.set_pipeline(pipe);
        pass.set_bind_group(0, bind, &[]);
        pass.dispatch_workgroups(x, y, z);
    }

    /// Workgroups of a 2-D dispatch for `t` tokens (the matvec's are in `record`).
    fn grid(&self, t: u32) -> (u32, u32) {
        match self.dispatch {
            Dispatch::Mat { n, .. } => (n.div_ceil(64), t.div_ceil(64)),
            Dispatch::Embed { k } => (k.div_ceil(8 * 64), t),
            Dispatch::PerToken | Dispatch::NormForMatmul | Dispatch::QuantForMatvec => (t, 1),
            Dispatch::Threads { per_token } => split((t * per_token).div_ceil(64)),
            Dispatch::Kv { pairs } => (pairs.div_ceil(64), t),
            Dispatch::Attn { heads } => (heads, t),
            Dispatch::AttnSplit { .. } | Dispatch::AttnCombine { .. } => unreachable!("3-D dispatches"),
        }
    }
}

/// Builds ops: pipelines from the device's cache, bind groups, and uniform parameter blocks
/// shared by every op with the same contents.
struct Builder<'g> {
    gpu: &'g Gpu,
    params: RefCell<HashMap<Vec<u8>, wgpu::Buffer>>,
}

impl<'g> Builder<'g> {
    fn new(gpu: &'g Gpu) -> Self {
        Builder { gpu, params: RefCell::default() }
    }

    fn param(&self, bytes: Vec<u8>) -> wgpu::Buffer {
        self.params.borrow_mut().entry(bytes.clone()).or_insert_with(|| self.gpu.uniform("params", &bytes)).clone()
    }

    fn op(&self, k: Kernel, bufs: &[&wgpu::Buffer], d: Dispatch) -> Op {
        let ks = &self.gpu.kernels;
        Op { name: k.name(), pipeline: ks.pipeline(k), matvec: None, bind: ks.bind(k, bufs), dispatch: d }
    }

    /// `x[t, :] = row tokens[t] of m` for every row chunk of `m` (each looks up the ids it holds).
    fn embed(&self, out: &mut Vec<Op>, m: &GpuMatrix, tokens: &wgpu::Buffer, x: &wgpu::Buffer, step: &wgpu::Buffer) {
        for ch in &m.chunks {
            let p = self.param(u32s(&[ch.rows, m.cols, m.row_bytes, ch.row0, m.cols, u32::MAX, u32::MAX, 0, 0, 0, 0, 0]));
            out.push(self.op(Kernel::Embed { ty: m.ty }, &[&ch.buf, tokens, x, &p, step], Dispatch::Embed { k: m.cols }));
        }
    }

    /// `y (+)= m x` for every row chunk of `m`; `stride` is the row stride of `y`.
    #[allow(clippy::too_many_arguments)]
    fn mat(&self, out: &mut Vec<Op>, m: &GpuMatrix, x: &wgpu::Buffer, y: &wgpu::Buffer, acc: bool, stride: u32, step: &wgpu::Buffer) {
        self.mat_kind(out, m, x, &[(y, stride)], acc, false, MatIn::Rows, step)
    }

    /// `ys = m x` (with `glu`, for a matrix whose rows are (gate, up) pairs: `y = silu(gate x) *
    /// (up x)`) for a matrix holding up to three projections' rows one after another, each
    /// `(buffer, row stride)`. With several outputs, each holds as many rows as its stride (the
    /// kernel sends rows below the first stride to the first buffer, and so on), and the second
    /// and third share one stride. Unused output slots bind `Gpu::spare`: WebGPU rejects a
    /// dispatch whose writable bindings overlap, so no slot may repeat another's buffer.
    /// `x` holds the input rows for the matmul; `input` says what the matvec reads (see [`MatIn`]).
    #[allow(clippy::too_many_arguments)]
    fn mat_kind(
        &self,
        out: &mut Vec<Op>,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        ys: &[(&wgpu::Buffer, u32)],
        acc: bool,
        glu: bool,
        input: MatIn,
        step: &wgpu::Buffer,
    ) {
        debug_assert!((1..=3).contains(&ys.len()) && (ys.len() < 3 || ys[1].1 == ys[2].1), "one to three outputs, the last two with one stride");
        let slot = |i: usize| ys.get(i).map_or(&self.gpu.spare[i - 1], |y| y.0);
        let split = |i: usize| if ys.len() > i { ys[..i].iter().map(|y| y.1).sum() } else { u32::MAX };
        let (stride, stride2) = (ys[0].1, ys.get(1).map_or(0, |y| y.1));
        let (split1, split2) = (split(1), split(2));
        let ks = &self.gpu.kernels;
        let eps = if let MatIn::Norm(n) = input { n.eps.to_bits() } else { 0 };
        let fold = matches!(input, MatIn::Norm(_));
        for ch in &m.chunks {
            let p = self.param(u32s(&[ch.rows, m.cols, m.row_bytes, ch.row0, stride, split1, split2, stride2, eps, 0, 0, 0]));
            let mm = Kernel::MatMul { ty: m.ty, acc, glu };
            let (mv, rows): (Box<dyn Fn(bool) -> wgpu::ComputePipeline>, u32) = if let MatIn::Q8 { .. } = input {
                let lanes = matvec_lanes(m.cols);
                (Box::new(move |one| ks.pipeline(Kernel::MatVecQ8 { ty: m.ty, acc, lanes, one, glu })), 256 / lanes * 4)
            } else if self.gpu.fast.subgroups {
                let wg = matvec_sg_threads(m.cols);
                (Box::new(move |one| ks.pipeline(Kernel::MatVecSg { ty: m.ty, acc, wg, one, glu, norm: fold })), 4)
            } else {
                let lanes = matvec_lanes(m.cols);
                (Box::new(move |one| ks.pipeline(Kernel::MatVec { ty: m.ty, acc, lanes, one, glu, norm: fold })), 256 / lanes * 4)
            };
            // The unused norm-weight slot binds X again (read-only, so no overlap).
            let bind = |x: &wgpu::Buffer, g: &wgpu::Buffer| ks.bind(mm, &[&ch.buf, x, ys[0].0, &p, step, slot(1), slot(2), g]);
            let mat_bind = bind(x, x);
            let mv_bind = match input {
                MatIn::Rows => mat_bind.clone(),
                MatIn::Norm(n) => bind(n.x, n.weight),
                MatIn::Q8 { xq, xs } => bind(xq, xs),
            };
            out.push(Op {
                name: mm.name(),
                pipeline: ks.pipeline(mm),
                matvec: Some(([mv(true), mv(false)], mv_bind)),
                bind: mat_bind,
                dispatch: Dispatch::Mat { n: ch.rows, rows },
            });
        }
    }
}

/// What a matrix op's matvec reads (its matmul always reads the rows in `x`).
#[derive(Clone, Copy)]
enum MatIn<'a> {
    /// The rows in `x`.
    Rows,
    /// The residual stream, normed by the matvec itself (`shaders/mat_norm.wgsl`).
    Norm(Norm<'a>),
    /// The rows quantized by a `NormQuant` op: bytes and block scales (`shaders/matvec_q8.wgsl`).
    Q8 { xq: &'a wgpu::Buffer, xs: &'a wgpu::Buffer },
}

/// The RMSNorm a matvec folds in: the residual stream it reads and the norm's weight and epsilon.
#[derive(Clone, Copy)]
struct Norm<'a> {
    x: &'a wgpu::Buffer,
    weight: &'a wgpu::Buffer,
    eps: f32,
}

/// Runs one weight matrix on `t` input rows `x` (`t * cols` values) with the engine's kernels:
/// the matvec for a few rows, the tiled matmul for more; or, with `embed`, looks up the rows whose
/// ids are `x` (as integers). Returns `t * rows` (or `t * cols`) values. For tests and tools.
pub async fn apply_matrix(gpu: &Gpu, m: &GpuMatrix, x: &[f32], t: usize, embed: bool) -> Result<Vec<f32>> {
    let b = Builder::new(gpu);
    let step = gpu.uniform("step", &u32s(&[t as u32, 0, 0, 0]));
    let (xbuf, out_len) = if embed {
        let ids: Vec<u32> = x.iter().map(|v| *v as u32).collect();
        (gpu.storage_uncapped("ids", bytemuck::cast_slice(&ids))?, t * m.cols as usize)
    } else {
        (gpu.storage_uncapped("x", bytemuck::cast_slice(x))?, t * m.rows as usize)
    };
    let y = gpu.storage_uncapped("y", &vec![0u8; out_len * 4])?;
    let mut ops = vec![];
    if embed {
        b.embed(&mut ops, m, &xbuf, &y, &step);
    } else {
        b.mat(&mut ops, m, &xbuf, &y, false, m.rows, &step);
    }
    run_ops(gpu, &ops, t, &y, out_len).await
}

/// Runs one weight matrix of a type with an integer dot ([`has_int_dot`]) on `t <= 16` rows
/// already quantized as the `norm_quant` kernel writes them: `xq` the bytes (`t * cols / 4`
/// words), `xs` per 32-value block (scale, scale * sum of its bytes), with the integer-dot
/// matvec. Returns `t * rows` values. For tests and tools.
pub async fn apply_matrix_q8(gpu: &Gpu, m: &GpuMatrix, xq: &[u32], xs: &[[f32; 2]], t: usize) -> Result<Vec<f32>> {
    if !has_int_dot(m.ty) || t == 0 || t > MATVEC_MAX_T as usize {
        return Err(Error::Input(format!("no integer-dot matvec for {:?} on {t} rows", m.ty)));
    }
    let b = Builder::new(gpu);
    let step = gpu.uniform("step", &u32s(&[t as u32, 0, 0, 0]));
    let q = gpu.storage_uncapped("xq", bytemuck::cast_slice(xq))?;
    let sc = gpu.storage_uncapped("xs", bytemuck::cast_slice(xs))?;
    let out_len = t * m.rows as usize;
    let y = gpu.storage_uncapped("y", &vec![0u8; out_len * 4])?;
    let mut ops = vec![];
    b.mat_kind(&mut ops, m, &q, &[(&y, m.rows)], false, false, MatIn::Q8 { xq: &q, xs: &sc }, &step);
    run_ops(gpu, &ops, t, &y, out_len).await
}

/// Records `ops` for a pass of `t` rows in one submit and reads back the `len` f32 of `y`.
async fn run_ops(gpu: &Gpu, ops: &[Op], t: usize, y: &wgpu::Buffer, len: usize) -> Result<Vec<f32>> {
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        for op in ops {
            op.record(&mut pass, t as u32, 1);
        }
    }
    gpu.submit(enc.finish());
    let bytes = gpu.read(y, 0, (len * 4) as u64).await?;
    Ok(bytemuck::cast_slice(&bytes).to_vec())
}

/// Bytes one token takes in one layer's K (or V) cache: f16 pairs or f32 values in u32 words.
pub fn kv_row_bytes(cfg: &ModelConfig, kv_f16: bool) -> usize {
    cfg.kv_dim() * if kv_f16 { 2 } else { 4 }
}

/// Tokens (of all sequences together) one layer's K or V buffer can hold under a binding limit
/// of `max_binding` bytes.
pub fn kv_tokens_fit(cfg: &ModelConfig, max_binding: u64, kv_f16: bool) -> usize {
    (max_binding.saturating_sub(4) / kv_row_bytes(cfg, kv_f16).max(1) as u64) as usize
}

/// The context CLI commands and the web engine default to: the model's own, at most 4096.
pub const DEFAULT_CTX_CAP: usize = 4096;

/// The one default context size (every front end asks here): the model's own context, at most
/// `cap` tokens and at most what one layer's KV buffer holds for `sequences` sequences under a
/// binding limit of `max_binding`; at least 2.
pub fn default_ctx_size(cfg: &ModelConfig, max_binding: u64, kv_f16: bool, sequences: usize, cap: usize) -> usize {
    let fits = (kv_tokens_fit(cfg, max_binding, kv_f16) / sequences.max(1)).max(2);
    cfg.max_position_embeddings.clamp(2, cap.max(2)).min(fits)
}

/// Part of a batched forward pass: `tokens` appended to sequence `seq`; with `logits`, the
/// logits after its last token are kept (output rows in piece order).
#[derive(Debug, Clone, Copy)]
pub struct Piece<'a> {
    pub seq: usize,
    pub tokens: &'a [u32],
    pub logits: bool,
}

/// The kv_copy kernel: its pipeline, one bind group per layer (that layer's K and V caches)
/// and its parameter block.
struct KvCopy {
    pipeline: wgpu::ComputePipeline,
    layers: Vec<wgpu::BindGroup>,
    params: wgpu::Buffer,
}

/// How big a session's buffers are: tokens per pass, logit rows per pass, bytes of one layer's
/// K (or V) cache. Checked against the device's binding limit before anything is allocated.
struct Sizes {
    max_t: usize,
    max_out: usize,
    kv_bytes: u64,
    /// How decode attention splits the context, when the model's heads suit the split kernel.
    split: Option<Split>,
}

/// The split attention's shape (see `shaders/attn_split.wgsl`).
#[derive(Clone, Copy)]
struct Split {
    /// Query heads per KV head.
    g: u32,
    /// Value-row words per thread.
    wpt: u32,
    /// Passes of at most `MATVEC_MAX_T` tokens (decode): one token per workgroup.
    short: AttnTile,
    /// Longer passes (prefill, one slice): as many tokens per workgroup as fit.
    long: AttnTile,
    /// Keys per slice: slices stay at most `MAX_SPLITS` for the whole context.
    span: u32,
    max_splits: u32,
}

/// How many tokens a split-attention workgroup takes, and what that leaves for the rest.
#[derive(Clone, Copy, PartialEq)]
struct AttnTile {
    /// Tokens per workgroup (R = qt * g query rows).
    qt: u32,
    /// Keys per round (R queries and R * chunk scores fit the kernel's workgroup memory).
    chunk: u32,
    /// Keys per thread in the score loop: 2 where a round has 128 keys or more.
    kb: u32,
    /// Threads per query row in the softmax reductions.
    gt: u32,
}

/// The most context slices split attention uses.
const MAX_SPLITS: u32 = 32;
/// The kernel's limits: query rows per workgroup, and floats of workgroup memory for their
/// queries and scores together.
const ATTN_MAX_ROWS: u32 = 16;
const ATTN_POOL_FLOATS: u32 = 3072;

impl AttnTile {
    /// The tile for `qt` tokens of `g` query heads of `hd` values: the largest round of keys
    /// (at most 256, a power of two) whose scores fit beside the queries.
    fn new(g: u32, qt: u32, hd: u32) -> AttnTile {
        let pow2_at_most = |v: u32| 1u32 << (31 - v.max(1).leading_zeros());
        let rows = g * qt;
        let chunk = pow2_at_most(((ATTN_POOL_FLOATS - rows * hd) / rows).min(256));
        AttnTile { qt, chunk, kb: if chunk >= 128 { 2 } else { 1 }, gt: pow2_at_most(64 / rows) }
    }
}

impl Split {
    /// The shape for `c`'s heads (`None` where the kernel cannot take them); `query_tiles`:
    /// several tokens per workgroup in long passes.
    fn plan(c: &ModelConfig, ctx: usize, kv_f16: bool, query_tiles: bool) -> Option<Split> {
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
        let words = if kv_f16 { hd / 2 } else { hd };
        let wpt = words.div_ceil(64);
        let short = AttnTile::new(g, 1, hd);
        let span = short.chunk * (ctx as u32).div_ceil(short.chunk * MAX_SPLITS).max(1);
        Some(Split { g, wpt, short, long: AttnTile::new(g, qt, hd), span, max_splits: (ctx as u32).div_ceil(span) })
    }

    /// Slices a pass needs when its latest token is at position `last`.
    fn slices(&self, last: u32) -> u32 {
        (last + 1).div_ceil(self.span)
    }
}

impl Sizes {
    fn check(model: &Model, opts: &SessionOptions) -> Result<Sizes> {
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
        let rows = opts.ctx_size.checked_mul(opts.sequences);
        let kv_bytes = rows.and_then(|r| r.checked_mul(kv_row_bytes(c, opts.kv_f16))).map_or(u64::MAX, |b| b as u64);
        if kv_bytes > maxb {
            let fits = kv_tokens_fit(c, gpu.max_binding, opts.kv_f16);
            let what = if opts.sequences == 1 {
                format!("a KV cache of {} tokens", opts.ctx_size)
            } else {
                format!("a KV cache of {} sequences x {} tokens", opts.sequences, opts.ctx_size)
            };
            return Err(Error::Gpu(format!(
                "{what} needs {kv_bytes}-byte buffers per layer, over the device's binding limit; at most {fits} tokens fit in all (context x sequences)"
            )));
        }
        let split = if gpu.fast.split_attention { Split::plan(c, opts.ctx_size, opts.kv_f16, gpu.fast.query_tiles) } else { None };
        Ok(Sizes { max_t, max_out, kv_bytes, split })
    }
}

/// The buffers a pass reads and writes besides the weights: per-step inputs, activations (one
/// row per token of the pass), the output head's rows, and each layer's KV cache.
struct Buffers {
    /// Tokens in this pass (`step`) and logit rows (`step_out`).
    step: wgpu::Buffer,
    step_out: wgpu::Buffer,
    tokens: wgpu::Buffer,
    /// Per token of a pass: (position, first cache row of its sequence).
    seq: wgpu::Buffer,
    rope: wgpu::Buffer,
    x: wgpu::Buffer,
    xb: wgpu::Buffer,
    /// The integer-dot matvec's input: `xb`'s rows (of passes the matvec takes) as Q8 bytes,
    /// and per 32-value block (scale, scale * sum of the bytes).
    xq: wgpu::Buffer,
    xs: wgpu::Buffer,
    q: wgpu::Buffer,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    att: wgpu::Buffer,
    gate: wgpu::Buffer,
    up: wgpu::Buffer,
    xout: wgpu::Buffer,
    logits: wgpu::Buffer,
    argmax: wgpu::Buffer,
    /// Split attention's per-slice partial sums.
    part: wgpu::Buffer,
    /// (K, V) per layer.
    kv: Vec<(wgpu::Buffer, wgpu::Buffer)>,
}

impl Buffers {
    fn alloc(model: &Model, s: &Sizes) -> Result<Buffers> {
        let c = &model.cfg;
        let gpu = &model.gpu;
        let f32b = |n: usize| (n * 4) as u64;
        let act = |name: &str, width: usize| gpu.storage(name, f32b(s.max_t * width));
        let (int_dot, tq) = (gpu.fast.int_dot, s.max_t.min(MATVEC_MAX_T as usize));
        let mut kv = Vec::with_capacity(model.layers.len());
        for _ in &model.layers {
            kv.push((gpu.storage("k_cache", s.kv_bytes)?, gpu.storage("v_cache", s.kv_bytes)?));
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

/// The uniform blocks the layers' ops share (model constants only).
struct Params {
    norm: wgpu::Buffer,
    rope_q: wgpu::Buffer,
    rope_k: wgpu::Buffer,
    rope_kv: wgpu::Buffer,
    kv: wgpu::Buffer,
    attn: wgpu::Buffer,
    split: wgpu::Buffer,
    combine: wgpu::Buffer,
    ffn: wgpu::Buffer,
    argmax: wgpu::Buffer,
}

impl Params {
    fn new(b: &Builder, c: &ModelConfig, split: Option<Split>) -> Params {
        let with_f32 = |mut head: Vec<u8>, v: f32| {
            head.extend_from_slice(&v.to_le_bytes());
            head
        };
        Params {
            norm: b.param(with_f32(u32s(&[c.hidden_size as u32]), c.rms_norm_eps)),
            rope_q: b.param(u32s(&[c.num_heads as u32, c.head_dim as u32])),
            rope_k: b.param(u32s(&[c.num_kv_heads as u32, c.head_dim as u32])),
            rope_kv: b.param(u32s(&[c.num_heads as u32, c.num_kv_heads as u32, c.head_dim as u32])),
            kv: b.param(u32s(&[c.kv_dim() as u32])),
            attn: b.param(with_f32(
                u32s(&[c.num_heads as u32, c.num_kv_heads as u32, c.head_dim as u32]),
                1.0 / (c.head_dim as f32).sqrt(),
            )),
            split: {
                let mut v = u32s(&[c.num_heads as u32, c.num_kv_heads as u32, c.head_dim as u32]);
                v.extend_from_slice(&(1.0 / (c.head_dim as f32).sqrt()).to_le_bytes());
                v.extend(u32s(&[split.map_or(0, |s| s.span)]));
                b.param(v)
            },
            combine: b.param(u32s(&[c.num_heads as u32, c.head_dim as u32])),
            ffn: b.param(u32s(&[c.intermediate_size as u32])),
            argmax: b.param(u32s(&[c.vocab_size as u32])),
        }
    }
}

/// The recorded forward pass: the body runs on every token of a pass, the head (final norm
/// output rows -> logits -> argmax) on the rows whose logits are kept.
struct Pass {
    body: Vec<Op>,
    head: Vec<Op>,
}

impl Builder<'_> {
    /// The whole forward pass: embedding, every decoder layer, then the output head.
    fn forward(&self, model: &Model, bufs: &Buffers, p: &Params, kv_f16: bool, split: Option<Split>) -> Pass {
        let mut body = Vec::new();
        self.embed(&mut body, &model.embed, &bufs.tokens, &bufs.x, &bufs.step);
        for (layer, kv) in model.layers.iter().zip(&bufs.kv) {
            self.layer(&mut body, &model.cfg, layer, kv, bufs, p, kv_f16, split);
        }
        let mut head = Vec::new();
        self.head(&mut body, &mut head, model, bufs, p);
        Pass { body, head }
    }

    /// One decoder layer, in the order of its equations (x is the residual stream):
    ///   xb = rmsnorm(x) * attn_norm
    ///   q, k, v = Wq xb, Wk xb, Wv xb
    ///   q, k = rope(q), rope(k);  K[pos], V[pos] = k, v
    ///   att = softmax(q K^T / sqrt(head_dim)) V   (grouped-query: heads share KV heads)
    ///   x += Wo att
    ///   xb = rmsnorm(x) * ffn_norm
    ///   x += Wdown (silu(Wgate xb) * (Wup xb))
    #[allow(clippy::too_many_arguments)]
    fn layer<'a>(
        &self,
        ops: &mut Vec<Op>,
        c: &ModelConfig,
        l: &'a Layer,
        (kc, vc): &(wgpu::Buffer, wgpu::Buffer),
        b: &'a Buffers,
        p: &Params,
        f16: bool,
        split: Option<Split>,
    ) {
        let (h, qd, kvd, ffn) = (c.hidden_size as u32, c.q_dim() as u32, c.kv_dim() as u32, c.intermediate_size as u32);
        let half = c.head_dim as u32 / 2;
        let st = &b.step;
        // Each norm and the matrices it feeds: with `int_dot` (all of them of a type that has an
        // integer dot) a norm_quant op writes their Q8 input for passes the matvec takes; else
        // with `norm_fold` the matvecs apply the norm themselves. The matmul (longer passes)
        // reads the rows the norm op wrote either way.
        let normed = |ops: &mut Vec<Op>, weight: &'a wgpu::Buffer, mats: &[&GpuMatrix]| -> MatIn<'a> {
            let fast = &self.gpu.fast;
            let rms = |d| self.op(Kernel::RmsNorm, &[weight, &b.x, &b.xb, &p.norm, st], d);
            if fast.int_dot && c.hidden_size.is_multiple_of(32) && mats.iter().all(|m| has_int_dot(m.ty)) {
                ops.push(self.op(Kernel::NormQuant, &[weight, &b.x, &b.xq, &b.xs, &p.norm, st], Dispatch::QuantForMatvec));
                ops.push(rms(Dispatch::NormForMatmul));
                MatIn::Q8 { xq: &b.xq, xs: &b.xs }
            } else if fast.norm_fold {
                ops.push(rms(Dispatch::NormForMatmul));
                MatIn::Norm(Norm { x: &b.x, weight, eps: c.rms_norm_eps })
            } else {
                ops.push(rms(Dispatch::PerToken));
                MatIn::Rows
            }
        };
        // q, k, v = Wq xb, Wk xb, Wv xb: one dispatch per run of same-typed matrices.
        let qkv: Vec<&GpuMatrix> = l.qkv.iter().map(|part| &part.m).collect();
        let input = normed(ops, &l.attn_norm, &qkv);
        let outs = [(&b.q, qd), (&b.k, kvd), (&b.v, kvd)];
        for part in &l.qkv {
            self.mat_kind(ops, &part.m, &b.xb, &outs[part.first..part.first + part.count], false, false, input, st);
        }
        if half.is_multiple_of(2) && self.gpu.fast.fused {
            // q, k = rope(q), rope(k); K[pos], V[pos] = k, v: one kernel.
            let per_token = c.num_heads as u32 * half + c.num_kv_heads as u32 * half / 2 + kvd / 2;
            ops.push(self.op(Kernel::RopeKv { f16 }, &[&b.rope, &b.q, &b.k, &b.v, kc, vc, &b.seq, &p.rope_kv, st], Dispatch::Threads { per_token }));
        } else {
            ops.push(self.op(Kernel::Rope, &[&b.rope, &b.q, &p.rope_q, st], Dispatch::Threads { per_token: c.num_heads as u32 * half }));
            ops.push(self.op(Kernel::Rope, &[&b.rope, &b.k, &p.rope_k, st], Dispatch::Threads { per_token: c.num_kv_heads as u32 * half }));
            ops.push(self.op(Kernel::KvStore { f16 }, &[&b.k, &b.v, kc, vc, &b.seq, &p.kv, st], Dispatch::Kv { pairs: kvd / 2 }));
        }
        self.attention(ops, c, kc, vc, b, p, f16, split);
        self.mat(ops, &l.wo, &b.att, &b.x, true, h, st);
        match &l.ffn_in {
            FfnIn::GateUp(m) => {
                let input = normed(ops, &l.ffn_norm, &[m]);
                self.mat_kind(ops, m, &b.xb, &[(&b.gate, ffn)], false, true, input, st)
            }
            FfnIn::Split { gate, up } => {
                let input = normed(ops, &l.ffn_norm, &[gate, up]);
                self.mat_kind(ops, gate, &b.xb, &[(&b.gate, ffn)], false, false, input, st);
                self.mat_kind(ops, up, &b.xb, &[(&b.up, ffn)], false, false, input, st);
                ops.push(self.op(Kernel::SwiGlu, &[&b.up, &b.gate, &p.ffn, st], Dispatch::Threads { per_token: ffn }));
            }
        }
        self.mat(ops, &l.w_down, &b.gate, &b.x, true, h, st);
    }

    /// att = softmax(q K^T / sqrt(head_dim)) V: one workgroup per (KV head, token) for the query
    /// heads sharing it, split across the context for passes of a few tokens (then merged), when
    /// the heads suit that kernel; else one workgroup per (query head, token).
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        ops: &mut Vec<Op>,
        c: &ModelConfig,
        kc: &wgpu::Buffer,
        vc: &wgpu::Buffer,
        b: &Buffers,
        p: &Params,
        f16: bool,
        split: Option<Split>,
    ) {
        let st = &b.step;
        let Some(sp) = split else {
            ops.push(self.op(Kernel::Attention { f16 }, &[&b.q, kc, vc, &b.att, &b.seq, &p.attn, st], Dispatch::Attn { heads: c.num_heads as u32 }));
            return;
        };
        let tiles = if sp.short == sp.long { vec![(sp.short, Passes::All)] } else { vec![(sp.short, Passes::Short), (sp.long, Passes::Long)] };
        for (tile, passes) in tiles {
            let k = Kernel::AttnSplit { f16, g: sp.g, qt: tile.qt, chunk: tile.chunk, kb: tile.kb, gt: tile.gt, wpt: sp.wpt, hd: c.head_dim as u32 };
            let d = Dispatch::AttnSplit { kv_heads: c.num_kv_heads as u32, qt: tile.qt, passes };
            ops.push(self.op(k, &[&b.q, kc, vc, &b.att, &b.part, &b.seq, &p.split, st], d));
        }
        ops.push(self.op(Kernel::AttnCombine, &[&b.part, &b.att, &p.combine, st], Dispatch::AttnCombine { heads: c.num_heads as u32 }));
    }

    /// The output head: the final norm runs in the body (on every token, into `xb`); the kept
    /// rows are copied to `xout` between the two, then logits = lm_head xout and their argmax.
    fn head(&self, body: &mut Vec<Op>, head: &mut Vec<Op>, model: &Model, b: &Buffers, p: &Params) {
        body.push(self.op(Kernel::RmsNorm, &[&model.out_norm, &b.x, &b.xb, &p.norm, &b.step], Dispatch::PerToken));
        self.mat(head, model.lm_head(), &b.xout, &b.logits, false, model.cfg.vocab_size as u32, &b.step_out);
        head.push(self.op(Kernel::Argmax, &[&b.logits, &b.argmax, &p.argmax, &b.step_out], Dispatch::PerToken));
    }
}

/// One or more sequences' state on the GPU.
pub struct Session {
    /// A cheap handle (GPU buffers are reference-counted): the session owns no weights.
    model: Model,
    opts: SessionOptions,
    /// The token ids whose keys and values are in the KV cache, per sequence (the one record of
    /// what a sequence holds: its length is the sequence's position).
    held: Vec<Vec<u32>>,
    max_t: usize,
    max_out: usize,
    split: Option<Split>,
    bufs: Buffers,
    pass: Pass,
    copy: KvCopy,
    profile: Option<HashMap<&'static str, f64>>,
}

fn u32s(v: &[u32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

impl Session {
    /// Checks the sizes against the device's limits, allocates the buffers, then records the
    /// forward pass once (pipelines and bind groups are reused by every step).
    pub fn new(model: &Model, opts: SessionOptions) -> Result<Self> {
        let sizes = Sizes::check(model, &opts)?;
        let bufs = Buffers::alloc(model, &sizes)?;
        // Out of GPU memory for the KV cache shows here, not at the first readback.
        model.gpu.check_lost()?;
        let gpu = &model.gpu;
        let b = Builder::new(gpu);
        let params = Params::new(&b, &model.cfg, sizes.split);
        let pass = b.forward(model, &bufs, &params, opts.kv_f16, sizes.split);
        let copy_p = gpu.uniform("copy", &[0; 16]);
        let copy = KvCopy {
            pipeline: gpu.kernels.pipeline(Kernel::KvCopy),
            layers: bufs.kv.iter().map(|(kc, vc)| gpu.kernels.bind(Kernel::KvCopy, &[kc, vc, &copy_p])).collect(),
            params: copy_p,
        };
        Ok(Session {
            model: model.clone(),
            held: vec![Vec::new(); opts.sequences],
            opts,
            max_t: sizes.max_t,
            max_out: sizes.max_out,
            split: sizes.split,
            bufs,
            pass,
            copy,
            profile: None,
        })
    }

    /// An error once the device is lost or has reported an error.
    pub fn check_device(&self) -> Result<()> {
        self.model.gpu.check_lost()
    }

    /// Tokens already in the KV cache (of sequence 0).
    pub fn position(&self) -> usize {
        self.held[0].len()
    }

    /// Tokens already in the KV cache of sequence `seq`.
    pub fn position_of(&self, seq: usize) -> usize {
        self.held[seq].len()
    }

    /// The model's vocabulary size (token ids run below it).
    pub fn vocab_size(&self) -> usize {
        self.model.cfg.vocab_size
    }

    /// The first of `tokens` outside the model's vocabulary, if any.
    pub fn out_of_vocab(&self, tokens: &[u32]) -> Option<u32> {
        tokens.iter().copied().find(|&t| t as usize >= self.model.cfg.vocab_size)
    }

    /// The token ids in the KV cache of sequence `seq`, in order.
    pub fn tokens_of(&self, seq: usize) -> &[u32] {
        &self.held[seq]
    }

    /// Tokens of context each sequence has.
    pub fn ctx_size(&self) -> usize {
        self.opts.ctx_size
    }

    /// Independent sequences in this session.
    pub fn sequences(&self) -> usize {
        self.opts.sequences
    }

    /// Forgets every sequence (their caches are overwritten from position 0).
    pub fn reset(&mut self) {
        self.held.iter_mut().for_each(Vec::clear);
    }

    /// Rolls sequence 0 back to `pos` tokens.
    pub fn truncate(&mut self, pos: usize) {
        self.truncate_seq(0, pos);
    }

    /// Rolls sequence `seq` back to `pos` tokens.
    pub fn truncate_seq(&mut self, seq: usize, pos: usize) {
        self.held[seq].truncate(pos);
    }

    /// Makes sequence `dst` hold the first `n` tokens of sequence `src`: their keys and values
    /// are copied on the GPU (one dispatch per layer), which is far cheaper than recomputing them.
    pub fn copy_prefix(&mut self, src: usize, dst: usize, n: usize) -> Result<()> {
        self.copy_rows(src, dst, 0, n)
    }

    /// [`Session::copy_prefix`] when `dst` already holds the first `from` of those tokens: only
    /// rows `from..n` are copied.
    pub fn copy_rows(&mut self, src: usize, dst: usize, from: usize, n: usize) -> Result<()> {
        let seqs = self.opts.sequences;
        if src >= seqs || dst >= seqs || n > self.held[src].len() || from > n || from > self.held[dst].len() {
            return Err(Error::Input(format!(
                "cannot copy tokens {from}..{n} from sequence {src} to {dst} ({seqs} sequences, the source holds {}, the destination {})",
                self.held.get(src).map_or(0, Vec::len),
                self.held.get(dst).map_or(0, Vec::len)
            )));
        }
        if src != dst && n > from {
            let row_words = (kv_row_bytes(&self.model.cfg, self.opts.kv_f16) / 4) as u32;
            let span = self.opts.ctx_size as u32 * row_words;
            let skip = from as u32 * row_words;
            let words = (n - from) as u32 * row_words;
            let gpu = &self.model.gpu;
            gpu.queue.write_buffer(&self.copy.params, 0, &u32s(&[src as u32 * span + skip, dst as u32 * span + skip, words, 0]));
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&self.copy.pipeline);
                let (x, y) = split(words.div_ceil(64));
                for bg in &self.copy.layers {
                    pass.set_bind_group(0, bg, &[]);
                    pass.dispatch_workgroups(x, y, 1);
                }
            }
            gpu.submit(enc.finish());
        }
        // The caller vouches that `dst` held the first `from` tokens of `src`.
        let copied = self.held[src][..n].to_vec();
        self.held[dst] = copied;
        Ok(())
    }

    /// `tokens` can be appended to sequence `seq`: it exists, ids are in the vocabulary, they fit.
    fn check_seq(&self, seq: usize, tokens: &[u32]) -> Result<()> {
        let vocab = self.model.cfg.vocab_size;
        if seq >= self.opts.sequences {
            return Err(Error::Input(format!("sequence {seq} does not exist (the session has {})", self.opts.sequences)));
        }
        if tokens.is_empty() {
            return Err(Error::Input("no tokens to feed".into()));
        }
        if let Some(bad) = self.out_of_vocab(tokens) {
            return Err(Error::Input(format!("token id {bad} is out of range (vocabulary of {vocab})")));
        }
        let pos = self.held[seq].len();
        if pos + tokens.len() > self.opts.ctx_size {
            return Err(Error::Input(format!(
                "{} tokens after {pos} do not fit the context of {} tokens",
                tokens.len(),
                self.opts.ctx_size
            )));
        }
        Ok(())
    }

    /// Every piece is valid and the pass fits the session's buffers.
    fn check(&self, pieces: &[Piece]) -> Result<()> {
        let total: usize = pieces.iter().map(|p| p.tokens.len()).sum();
        let outs = pieces.iter().filter(|p| p.logits).count();
        if pieces.is_empty() {
            return Err(Error::Input("no tokens to feed".into()));
        }
        if total > self.max_t || outs > self.max_out {
            return Err(Error::Input(format!(
                "a pass takes at most {} tokens and {} logit rows ({total} and {outs} given)",
                self.max_t, self.max_out
            )));
        }
        for (i, p) in pieces.iter().enumerate() {
            if pieces[..i].iter().any(|q| q.seq == p.seq) {
                return Err(Error::Input(format!("sequence {} appears twice in one pass", p.seq)));
            }
            self.check_seq(p.seq, p.tokens)?;
        }
        Ok(())
    }

    /// Per-kernel GPU time (seconds, by kernel name) when profiling is on: each op is then its
    /// own compute pass, timed with timestamp queries where the device has them (else submitted
    /// and waited for alone), which is slow; for `bench --profile` only.
    pub fn enable_profile(&mut self) {
        self.profile = Some(Default::default());
    }

    pub fn profile(&self) -> Option<&HashMap<&'static str, f64>> {
        self.profile.as_ref()
    }

    fn record_copies(&self, enc: &mut wgpu::CommandEncoder, outs: &[(usize, usize)]) {
        let row = (self.model.cfg.hidden_size * 4) as u64;
        let mut dst = 0;
        for &(src, n) in outs {
            enc.copy_buffer_to_buffer(&self.bufs.xb, src as u64 * row, &self.bufs.xout, dst * row, n as u64 * row);
            dst += n as u64;
        }
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn run_profiled(&mut self, t: u32, splits: u32, n_out: u32, outs: &[(usize, usize)]) {
        let gpu = self.model.gpu.clone();
        let mut prof = self.profile.take().unwrap();
        let name = |op: &Op, t: u32| if t <= MATVEC_MAX_T && op.matvec.is_some() { "matvec" } else { op.name };
        let body: Vec<(&'static str, &Op, u32, u32)> =
            self.pass.body.iter().filter(|op| op.runs(t, splits)).map(|op| (name(op, t), op, t, splits)).collect();
        let head: Vec<(&'static str, &Op, u32, u32)> = self.pass.head.iter().map(|op| (name(op, n_out), op, n_out, 1)).collect();
        time_ops(&gpu, &mut prof, &body);
        // As `run`: no logits wanted, no copy and no head.
        if n_out > 0 {
            // A copy is no compute pass, so it has no pass timestamps: host clock.
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            self.record_copies(&mut enc, outs);
            let t0 = std::time::Instant::now();
            gpu.submit(enc.finish());
            gpu.flush();
            *prof.entry("copy (host clock)").or_default() += t0.elapsed().as_secs_f64();
            time_ops(&gpu, &mut prof, &head);
        }
        self.profile = Some(prof);
    }

    /// Records and submits one pass over `pieces` (already checked); `outs` are (first row,
    /// rows) ranges of the pass's tokens whose logits are computed, in order.
    fn run(&mut self, pieces: &[Piece], outs: &[(usize, usize)]) {
        let gpu = self.model.gpu.clone();
        let ctx = self.opts.ctx_size;
        let tokens: Vec<u32> = pieces.iter().flat_map(|p| p.tokens.iter().copied()).collect();
        // Per token: (position, first cache row of its sequence).
        let seq: Vec<[u32; 2]> =
            pieces.iter().flat_map(|p| (self.held[p.seq].len()..self.held[p.seq].len() + p.tokens.len()).map(move |pos| [pos as u32, (p.seq * ctx) as u32])).collect();
        let t = tokens.len() as u32;
        let n_out: usize = outs.iter().map(|o| o.1).sum();
        let last = seq.iter().map(|s| s[0]).max().unwrap_or(0);
        // Long passes have tokens enough to fill the device: one slice each.
        let splits = match self.split {
            Some(sp) if t <= MATVEC_MAX_T => sp.slices(last),
            _ => 1,
        };
        gpu.queue.write_buffer(&self.bufs.step, 0, &u32s(&[t, splits, 0, 0]));
        gpu.queue.write_buffer(&self.bufs.step_out, 0, &u32s(&[n_out as u32, 0, 0, 0]));
        gpu.queue.write_buffer(&self.bufs.tokens, 0, bytemuck::cast_slice(&tokens));
        gpu.queue.write_buffer(&self.bufs.seq, 0, bytemuck::cast_slice(&seq));
        let table = rope_table(&self.model.inv_freq, self.model.attention_factor, seq.iter().map(|s| s[0] as usize));
        gpu.queue.write_buffer(&self.bufs.rope, 0, bytemuck::cast_slice(&table));
        for p in pieces {
            self.held[p.seq].extend_from_slice(p.tokens);
        }
        #[cfg(not(target_arch = "wasm32"))]
        if self.profile.is_some() {
            self.run_profiled(t, splits, n_out as u32, outs);
            return;
        }
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        // A pass of a few tokens (decode) goes out in DECODE_SUBMITS command buffers, so the
        // device runs the first layers while the host records the rest. A long prefill pass
        // goes out in pieces of PREFILL_OPS_PER_SUBMIT ops (a few layers): on a slow GPU one
        // command buffer for a whole 256-token pass through a big model can outlast the OS's or
        // the browser's GPU watchdog (Windows resets the device after 2 s).
        let per_submit = if t > MATVEC_MAX_T { PREFILL_OPS_PER_SUBMIT } else { self.pass.body.len().div_ceil(DECODE_SUBMITS).max(1) };
        let mut chunks = self.pass.body.chunks(per_submit).peekable();
        while let Some(ops) = chunks.next() {
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for op in ops {
                    op.record(&mut pass, t, splits);
                }
            }
            if chunks.peek().is_some() {
                gpu.submit(std::mem::replace(&mut enc, gpu.device.create_command_encoder(&Default::default())).finish());
            }
        }
        if n_out > 0 {
            self.record_copies(&mut enc, outs);
            let mut pass = enc.begin_compute_pass(&Default::default());
            for op in &self.pass.head {
                op.record(&mut pass, n_out as u32, 1);
            }
        }
        gpu.submit(enc.finish());
    }

    /// One forward pass that extends several sequences at once (at most [`Session::max_batch`]
    /// tokens in all, each sequence once). The logits after the last token of every piece with
    /// `logits` set become output rows 0, 1, ... for [`Session::output_argmax`] and
    /// [`Session::output_logits`]. Returns the number of output rows.
    pub fn forward(&mut self, pieces: &[Piece]) -> Result<usize> {
        self.check(pieces)?;
        // (first row, rows) ranges of the pass's tokens to keep; adjacent rows go together.
        let mut outs: Vec<(usize, usize)> = Vec::new();
        let mut end = 0;
        for p in pieces {
            end += p.tokens.len();
            if p.logits {
                match outs.last_mut() {
                    Some(last) if last.0 + last.1 == end - 1 => last.1 += 1,
                    _ => outs.push((end - 1, 1)),
                }
            }
        }
        self.run(pieces, &outs);
        Ok(outs.iter().map(|o| o.1).sum())
    }

    /// The greedy next token of the first `rows` output rows of the last pass (computed on the
    /// GPU: 4 bytes a row are read back).
    pub async fn output_argmax(&self, rows: usize) -> Result<Vec<u32>> {
        let ids = self.output_argmax_rows(rows).await?;
        if let Some(r) = ids.iter().position(Option::is_none) {
            return Err(Error::Gpu(format!("output row {r} has no finite logit: the activations overflowed")));
        }
        Ok(ids.into_iter().flatten().collect())
    }

    /// As [`Session::output_argmax`], with `None` for a row that has no argmax (no logit but
    /// NaN or -inf), so a caller can fail only that row's request.
    pub async fn output_argmax_rows(&self, rows: usize) -> Result<Vec<Option<u32>>> {
        let b = self.model.gpu.read(&self.bufs.argmax, 0, (rows * 4) as u64).await?;
        let ids: &[u32] = bytemuck::cast_slice(&b);
        Ok(ids.iter().map(|&i| (i < self.model.cfg.vocab_size as u32).then_some(i)).collect())
    }

    /// The logits of the first `rows` output rows of the last pass.
    pub async fn output_logits(&self, rows: usize) -> Result<Vec<Vec<f32>>> {
        let v = self.model.cfg.vocab_size;
        let bytes = self.model.gpu.read(&self.bufs.logits, 0, (rows * v * 4) as u64).await?;
        let f: &[f32] = bytemuck::cast_slice(&bytes);
        Ok(f.chunks(v).map(|r| r.to_vec()).collect())
    }

    /// Feeds `tokens` to sequence 0 and returns the logits at every one of their positions.
    pub async fn logits_all(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.check_seq(0, tokens)?;
        let mut out = Vec::with_capacity(tokens.len());
        for chunk in tokens.chunks(self.max_out) {
            // Whole input checked above; chunks fit the pass and its logit rows.
            self.run(&[Piece { seq: 0, tokens: chunk, logits: true }], &[(0, chunk.len())]);
            out.extend(self.output_logits(chunk.len()).await?);
        }
        Ok(out)
    }

    /// Feeds `tokens` to sequence 0 (in batches of the session's maximum); the logits of the
    /// last one stay on the GPU for [`Session::last_logits`] or [`Session::last_argmax`].
    pub async fn feed(&mut self, tokens: &[u32]) -> Result<()> {
        self.feed_seq(0, tokens).await
    }

    /// Feeds `tokens` to sequence `seq`; the logits after the last one become output row 0.
    pub async fn feed_seq(&mut self, seq: usize, tokens: &[u32]) -> Result<()> {
        self.check_seq(seq, tokens)?;
        // Whole input checked above; chunks fit the pass.
        for chunk in tokens.chunks(self.max_t) {
            self.run(&[Piece { seq, tokens: chunk, logits: true }], &[(chunk.len() - 1, 1)]);
        }
        Ok(())
    }

    /// The logits after the last fed token.
    pub async fn last_logits(&self) -> Result<Vec<f32>> {
        Ok(self.output_logits(1).await?.remove(0))
    }

    /// The most likely next token after the last fed token (computed on the GPU).
    pub async fn last_argmax(&self) -> Result<u32> {
        Ok(self.output_argmax(1).await?[0])
    }

    /// Greedy continuation: feeds `prompt`, then generates `n` tokens, stopping early at any of
    /// `stop` ids (which are included).
    pub async fn generate_greedy(&mut self, prompt: &[u32], n: usize, stop: &[u32]) -> Result<Vec<u32>> {
        self.feed(prompt).await?;
        // (n is a caller's number: capped, so a huge one cannot overflow the allocation.)
        let mut out = Vec::with_capacity(n.min(1 << 16));
        while out.len() < n {
            let next = self.last_argmax().await?;
            out.push(next);
            if stop.contains(&next) || out.len() == n {
                break;
            }
            self.feed(&[next]).await?;
        }
        Ok(out)
    }

    /// Sampled continuation at `temperature` (> 0) with a seeded generator: same seed, same ids.
    /// (Full sampling controls come with the chat API.)
    pub async fn generate_sampled(
        &mut self,
        prompt: &[u32],
        n: usize,
        stop: &[u32],
        temperature: f32,
        seed: u64,
    ) -> Result<Vec<u32>> {
        self.feed(prompt).await?;
        let mut rng = seed ^ crate::util::GOLDEN;
        // (n is a caller's number: capped, so a huge one cannot overflow the allocation.)
        let mut out = Vec::with_capacity(n.min(1 << 16));
        while out.len() < n {
            let logits = self.last_logits().await?;
            let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let w: Vec<f64> = logits.iter().map(|&l| (((l - max) / temperature) as f64).exp()).collect();
            let mut r = crate::util::splitmix64_f64(&mut rng) * w.iter().sum::<f64>();
            let mut next = (w.len() - 1) as u32;
            for (i, p) in w.iter().enumerate() {
                if r < *p {
                    next = i as u32;
                    break;
                }
                r -= p;
            }
            out.push(next);
            if stop.contains(&next) || out.len() == n {
                break;
            }
            self.feed(&[next]).await?;
        }
        Ok(out)
    }

    /// Compute dispatches a pass of `t` tokens records when its latest token is at position
    /// `last` and it keeps `n_out` logit rows (a decode step: `t = 1, n_out = 1`). Every pass is
    /// one submit.
    pub fn dispatches(&self, t: usize, last: usize, n_out: usize) -> usize {
        let splits = match self.split {
            Some(sp) if t as u32 <= MATVEC_MAX_T => sp.slices(last as u32),
            _ => 1,
        };
        let body = self.pass.body.iter().filter(|op| op.runs(t as u32, splits)).count();
        body + if n_out > 0 { self.pass.head.len() } else { 0 }
    }

    /// The most tokens one pass takes.
    pub fn max_batch(&self) -> usize {
        self.max_t
    }

    /// The most logit rows one pass produces.
    pub fn max_outputs(&self) -> usize {
        self.max_out
    }
}

/// Ops per command buffer in a prefill pass (see `Session::run`): about four layers.
const PREFILL_OPS_PER_SUBMIT: usize = 48;

/// Command buffers per decode pass (the last also holds the output head).
const DECODE_SUBMITS: usize = 2;

/// Adds each op's GPU time to `prof` (seconds, by name). With timestamp queries every op is its
/// own compute pass with a timestamp at its start and end, recorded into one submit per
/// PREFILL_OPS_PER_SUBMIT ops (as a prefill pass, for the watchdog),
/// so the figures are the device's own; without them each op is submitted and waited for alone and
/// timed on the host, which on a fast GPU is mostly the round trip.
#[cfg(not(target_arch = "wasm32"))]
fn time_ops(gpu: &Gpu, prof: &mut HashMap<&'static str, f64>, ops: &[(&'static str, &Op, u32, u32)]) {
    if !gpu.timestamps {
        for &(name, op, t, splits) in ops {
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            op.record(&mut enc.begin_compute_pass(&Default::default()), t, splits);
            let t0 = std::time::Instant::now();
            gpu.submit(enc.finish());
            gpu.flush();
            *prof.entry(name).or_default() += t0.elapsed().as_secs_f64();
        }
        return;
    }
    let period = gpu.queue.get_timestamp_period() as f64 * 1e-9;
    for chunk in ops.chunks(PREFILL_OPS_PER_SUBMIT.min(wgpu::QUERY_SET_MAX_QUERIES as usize / 2)) {
        let n = 2 * chunk.len() as u32;
        let qs = gpu.device.create_query_set(&wgpu::QuerySetDescriptor { label: Some("profile"), ty: wgpu::QueryType::Timestamp, count: n });
        let size = n as u64 * wgpu::QUERY_SIZE as u64;
        gpu.counters.buffers_created.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let resolved = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("profile"),
            size,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for (i, &(_, op, t, splits)) in chunk.iter().enumerate() {
            let writes = wgpu::ComputePassTimestampWrites {
                query_set: &qs,
                beginning_of_pass_write_index: Some(2 * i as u32),
                end_of_pass_write_index: Some(2 * i as u32 + 1),
            };
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: Some(writes) });
            op.record(&mut pass, t, splits);
        }
        enc.resolve_query_set(&qs, 0..n, &resolved, 0);
        gpu.submit(enc.finish());
        let Ok(bytes) = pollster::block_on(gpu.read(&resolved, 0, size)) else { return };
        let ticks: &[u64] = bytemuck::cast_slice(&bytes);
        for (i, &(name, ..)) in chunk.iter().enumerate() {
            *prof.entry(name).or_default() += ticks[2 * i + 1].saturating_sub(ticks[2 * i]) as f64 * period;
        }
    }
}
