//! The ops a pass records (pipeline, bind group, dispatch shape) and the builder that makes
//! them; `apply_matrix` runs one weight matrix alone (tests and tools).

use crate::error::{Error, Result};
use crate::gpu::kernels::{has_int_dot, matvec_lanes, matvec_sg_threads, Kernel, MATVEC_MAX_T};
use crate::gpu::Gpu;
use crate::model::GpuMatrix;
use super::*;

#[derive(Clone, Copy)]
pub(super) enum Dispatch {
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


pub(super) struct Op {
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub(super) name: &'static str,
    pub(super) pipeline: wgpu::ComputePipeline,
    /// The matvec pipelines of a matrix op: for one token, and for up to `MATVEC_MAX_T`; and
    /// their bind group (its own when the matvec folds in the RMSNorm and so reads the residual
    /// stream instead of the normed rows).
    pub(super) matvec: Option<([wgpu::ComputePipeline; 2], wgpu::BindGroup)>,
    pub(super) bind: wgpu::BindGroup,
    pub(super) dispatch: Dispatch,
    /// What it computes, for cutting prefill passes into command buffers by work.
    pub(super) work: Work,
}

/// An op's floating-point operations: none worth counting, per token, or per token and key of
/// its context (attention).
#[derive(Clone, Copy, Default)]
pub(super) enum Work {
    #[default]
    Light,
    PerToken(f64),
    PerKey(f64),
}

/// Which passes an op runs in, by their token count.
#[derive(Clone, Copy)]
pub(super) enum Passes {
    All,
    /// At most `MATVEC_MAX_T` tokens (decode, and the matvec's passes).
    Short,
    /// More tokens (prefill).
    Long,
}

impl Passes {
    pub(super) fn take(self, t: u32) -> bool {
        match self {
            Passes::All => true,
            Passes::Short => t <= MATVEC_MAX_T,
            Passes::Long => t > MATVEC_MAX_T,
        }
    }
}

pub(super) const MAX_WG: u32 = 65535;

pub(super) fn split(wgs: u32) -> (u32, u32) {
    if wgs <= MAX_WG {
        (wgs.max(1), 1)
    } else {
        (MAX_WG, wgs.div_ceil(MAX_WG))
    }
}

impl Op {
    /// The op with its work set.
    pub(super) fn with_work(mut self, work: Work) -> Op {
        self.work = work;
        self
    }

    /// Floating-point operations in a pass of `t` tokens that attend to `keys` keys on average.
    pub(super) fn flops(&self, t: u32, keys: f64) -> f64 {
        match self.work {
            Work::Light => 0.0,
            Work::PerToken(f) => f * t as f64,
            Work::PerKey(f) => f * t as f64 * keys,
        }
    }

    /// Whether this op runs in a pass of `t` tokens whose attention spans `splits` slices
    /// (merging them is skipped for one; a norm the matvecs fold in, below the matmul's size).
    pub(super) fn runs(&self, t: u32, splits: u32) -> bool {
        match self.dispatch {
            Dispatch::AttnCombine { .. } => splits > 1,
            Dispatch::NormForMatmul => Passes::Long.take(t),
            Dispatch::QuantForMatvec => Passes::Short.take(t),
            Dispatch::AttnSplit { passes, .. } => passes.take(t),
            _ => true,
        }
    }

    /// Records the op for a pass of `t` tokens (`splits` context slices for split attention).
    pub(super) fn record(&self, pass: &mut wgpu::ComputePass<'_>, t: u32, splits: u32) {
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
    pub(super) fn grid(&self, t: u32) -> (u32, u32) {
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
pub(super) struct Builder<'g> {
    pub(super) gpu: &'g Gpu,
    pub(super) params: RefCell<HashMap<Vec<u8>, wgpu::Buffer>>,
}

impl<'g> Builder<'g> {
    pub(super) fn new(gpu: &'g Gpu) -> Self {
        Builder { gpu, params: RefCell::default() }
    }

    pub(super) fn param(&self, bytes: Vec<u8>) -> wgpu::Buffer {
        self.params.borrow_mut().entry(bytes.clone()).or_insert_with(|| self.gpu.uniform("params", &bytes)).clone()
    }

    pub(super) fn op(&self, k: Kernel, bufs: &[&wgpu::Buffer], d: Dispatch) -> Op {
        let ks = &self.gpu.kernels;
        Op { name: k.name(), pipeline: ks.pipeline(k), matvec: None, bind: ks.bind(k, bufs), dispatch: d, work: Work::Light }
    }

    /// `x[t, :] = row tokens[t] of m` for every row chunk of `m` (each looks up the ids it holds).
    pub(super) fn embed(&self, out: &mut Vec<Op>, m: &GpuMatrix, tokens: &wgpu::Buffer, x: &wgpu::Buffer, step: &wgpu::Buffer) {
        for ch in &m.chunks {
            let p = self.param(u32s(&[ch.rows, m.cols, m.row_bytes, ch.row0, m.cols, u32::MAX, u32::MAX, 0, 0, 0, 0, 0]));
            out.push(self.op(Kernel::Embed { ty: m.ty }, &[&ch.buf, tokens, x, &p, step], Dispatch::Embed { k: m.cols }));
        }
    }

    /// `y (+)= m x` for every row chunk of `m`; `stride` is the row stride of `y`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mat(&self, out: &mut Vec<Op>, m: &GpuMatrix, x: &wgpu::Buffer, y: &wgpu::Buffer, acc: bool, stride: u32, step: &wgpu::Buffer) {
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
    pub(super) fn mat_kind(
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
                work: Work::PerToken(2.0 * ch.rows as f64 * m.cols as f64),
            });
        }
    }
}

/// What a matrix op's matvec reads (its matmul always reads the rows in `x`).
#[derive(Clone, Copy)]
pub(super) enum MatIn<'a> {
    /// The rows in `x`.
    Rows,
    /// The residual stream, normed by the matvec itself (`shaders/mat_norm.wgsl`).
    Norm(Norm<'a>),
    /// The rows quantized by a `NormQuant` op: bytes and block scales (`shaders/matvec_q8.wgsl`).
    Q8 { xq: &'a wgpu::Buffer, xs: &'a wgpu::Buffer },
}

/// The RMSNorm a matvec folds in: the residual stream it reads and the norm's weight and epsilon.
#[derive(Clone, Copy)]
pub(super) struct Norm<'a> {
    pub(super) x: &'a wgpu::Buffer,
    pub(super) weight: &'a wgpu::Buffer,
    pub(super) eps: f32,
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
pub(super) async fn run_ops(gpu: &Gpu, ops: &[Op], t: usize, y: &wgpu::Buffer, len: usize) -> Result<Vec<f32>> {
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
