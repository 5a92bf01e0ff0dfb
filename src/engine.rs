//! A generation session: KV cache, activation buffers and the recorded forward pass. Bind groups
//! and pipelines are built once; each step writes a small uniform, the token ids and the rope
//! table, then records the whole pass into one command buffer and submits it once.

use crate::config::rope_table;
use crate::error::{Error, Result};
use crate::gpu::kernels::{matvec_lanes, Kernel};
use crate::gpu::Gpu;
use crate::model::{GpuMatrix, Model};
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
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions { ctx_size: 4096, kv_f16: true, max_batch: 256 }
    }
}

#[derive(Clone, Copy)]
enum Dispatch {
    /// Matrix with `n` rows: matvec (`lanes` threads a row) for one token, tiled matmul for more.
    Mat { n: u32, lanes: u32 },
    Embed { k: u32 },
    PerToken,
    Threads { per_token: u32 },
    Kv { pairs: u32 },
    Attn { heads: u32 },
}

struct Op {
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    name: &'static str,
    pipeline: wgpu::ComputePipeline,
    /// The one-token pipeline of a matrix op.
    matvec: Option<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    dispatch: Dispatch,
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
    fn record(&self, pass: &mut wgpu::ComputePass<'_>, t: u32) {
        let (pipe, (x, y)) = match self.dispatch {
            Dispatch::Mat { n, lanes } if t == 1 => (self.matvec.as_ref().unwrap(), split(n.div_ceil(256 / lanes * 4))),
            Dispatch::Mat { n, .. } => (&self.pipeline, (n.div_ceil(64), t.div_ceil(64))),
            Dispatch::Embed { k } => (&self.pipeline, (k.div_ceil(8 * 64), t)),
            Dispatch::PerToken => (&self.pipeline, (t, 1)),
            Dispatch::Threads { per_token } => (&self.pipeline, split((t * per_token).div_ceil(64))),
            Dispatch::Kv { pairs } => (&self.pipeline, (pairs.div_ceil(64), t)),
            Dispatch::Attn { heads } => (&self.pipeline, (heads, t)),
        };
        pass.set_pipeline(pipe);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(x, y, 1);
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
            let p = self.param(u32s(&[ch.rows, m.cols, m.row_bytes, ch.row0, m.cols]));
            out.push(self.op(Kernel::Embed { ty: m.ty }, &[&ch.buf, tokens, x, &p, step], Dispatch::Embed { k: m.cols }));
        }
    }

    /// `y (+)= m x` for every row chunk of `m`; `stride` is the row stride of `y`.
    #[allow(clippy::too_many_arguments)]
    fn mat(&self, out: &mut Vec<Op>, m: &GpuMatrix, x: &wgpu::Buffer, y: &wgpu::Buffer, acc: bool, stride: u32, step: &wgpu::Buffer) {
        let ks = &self.gpu.kernels;
        for ch in &m.chunks {
            let p = self.param(u32s(&[ch.rows, m.cols, m.row_bytes, ch.row0, stride]));
            let mm = Kernel::MatMul { ty: m.ty, acc };
            let lanes = matvec_lanes(m.cols);
            let mv = Kernel::MatVec { ty: m.ty, acc, lanes };
            out.push(Op {
                name: mm.name(),
                pipeline: ks.pipeline(mm),
                matvec: Some(ks.pipeline(mv)),
                bind: ks.bind(mm, &[&ch.buf, x, y, &p, step]),
                dispatch: Dispatch::Mat { n: ch.rows, lanes },
            });
        }
    }
}

/// Runs one weight matrix on `t` input rows `x` (`t * cols` values) with the engine's kernels:
/// the matvec for one row, the tiled matmul for more; or, with `embed`, looks up the rows whose
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
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        for op in &ops {
            op.record(&mut pass, t as u32);
        }
    }
    gpu.queue.submit([enc.finish()]);
    let bytes = gpu.read(&y, 0, (out_len * 4) as u64).await?;
    Ok(bytemuck::cast_slice(&bytes).to_vec())
}

/// One sequence's state on the GPU.
pub struct Session {
    /// A cheap handle (GPU buffers are reference-counted): the session owns no weights.
    model: Model,
    opts: SessionOptions,
    pos: usize,
    max_t: usize,
    max_out: usize,
    step: wgpu::Buffer,
    step_out: wgpu::Buffer,
    tokens: wgpu::Buffer,
    rope: wgpu::Buffer,
    xb: wgpu::Buffer,
    xout: wgpu::Buffer,
    logits: wgpu::Buffer,
    argmax: wgpu::Buffer,
    body: Vec<Op>,
    head: Vec<Op>,
    profile: Option<HashMap<&'static str, f64>>,
}

fn u32s(v: &[u32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

impl Session {
    pub fn new(model: &Model, opts: SessionOptions) -> Result<Self> {
        let model = model.clone();
        let model = &model;
        let c = &model.cfg;
        let gpu = &model.gpu;
        let maxb = gpu.max_binding - 4;
        if opts.ctx_size == 0 {
            return Err(Error::Input("context size must be at least 1".into()));
        }
        let widest = c.hidden_size.max(c.q_dim()).max(c.intermediate_size) as u64 * 4;
        let max_t = (maxb / widest).min(opts.max_batch as u64).min(opts.ctx_size as u64) as usize;
        let max_out = (maxb / (c.vocab_size as u64 * 4)).min(max_t as u64) as usize;
        if max_t == 0 || max_out == 0 {
            return Err(Error::Gpu(format!(
                "binding limit {} bytes cannot hold one token's activations or logits",
                gpu.max_binding
            )));
        }
        let kv_word = if opts.kv_f16 { 2 } else { 4 };
        let kv_bytes = (opts.ctx_size * c.kv_dim() * kv_word) as u64;
        if kv_bytes > maxb {
            let fits = maxb / (c.kv_dim() * kv_word) as u64;
            return Err(Error::Gpu(format!(
                "a KV cache of {} tokens needs {kv_bytes}-byte buffers per layer, over the device's binding limit; use a context of at most {fits} tokens",
                opts.ctx_size
            )));
        }
        let f32b = |n: usize| (n * 4) as u64;
        let act = |name: &str, width: usize| gpu.storage(name, f32b(max_t * width));
        let x = act("x", c.hidden_size)?;
        let xb = act("xb", c.hidden_size)?;
        let q = act("q", c.q_dim())?;
        let k = act("k", c.kv_dim())?;
        let v = act("v", c.kv_dim())?;
        let att = act("att", c.q_dim())?;
        let g = act("gate", c.intermediate_size)?;
        let u = act("up", c.intermediate_size)?;
        let xout = gpu.storage("xout", f32b(max_out * c.hidden_size))?;
        let logits = gpu.storage("logits", f32b(max_out * c.vocab_size))?;
        let argmax = gpu.storage("argmax", (max_out * 4) as u64)?;
        let tokens = gpu.storage("tokens", (max_t * 4) as u64)?;
        let rope = gpu.storage("rope", f32b(max_t * c.head_dim))?;
        let step = gpu.uniform("step", &[0; 16]);
        let step_out = gpu.uniform("step_out", &[0; 16]);

        let b = Builder::new(gpu);
        let param = |bytes: Vec<u8>| b.param(bytes);
        let op = |k: Kernel, bufs: &[&wgpu::Buffer], d: Dispatch| b.op(k, bufs, d);
        let mat_ops = |out: &mut Vec<Op>, m: &GpuMatrix, x: &wgpu::Buffer, y: &wgpu::Buffer, acc: bool, stride: u32, step: &wgpu::Buffer| {
            b.mat(out, m, x, y, acc, stride, step)
        };
        let mut body = Vec::new();
        let mut head = Vec::new();
        let (h, qd, kvd, ffn) = (c.hidden_size as u32, c.q_dim() as u32, c.kv_dim() as u32, c.intermediate_size as u32);
        b.embed(&mut body, &model.embed, &tokens, &x, &step);
        let mut norm_p = u32s(&[h]);
        norm_p.extend_from_slice(&c.rms_norm_eps.to_le_bytes());
        let norm_p = param(norm_p);
        let rope_q = param(u32s(&[c.num_heads as u32, c.head_dim as u32]));
        let rope_k = param(u32s(&[c.num_kv_heads as u32, c.head_dim as u32]));
        let kv_p = param(u32s(&[kvd]));
        let mut attn_p = u32s(&[c.num_heads as u32, c.num_kv_heads as u32, c.head_dim as u32]);
        attn_p.extend_from_slice(&(1.0 / (c.head_dim as f32).sqrt()).to_le_bytes());
        let attn_p = param(attn_p);
        let ffn_p = param(u32s(&[ffn]));
        let f16 = opts.kv_f16;
        for layer in &model.layers {
            let kc = gpu.storage("k_cache", kv_bytes)?;
            let vc = gpu.storage("v_cache", kv_bytes)?;
            body.push(op(Kernel::RmsNorm, &[&layer.attn_norm, &x, &xb, &norm_p, &step], Dispatch::PerToken));
            mat_ops(&mut body, &layer.wq, &xb, &q, false, qd, &step);
            mat_ops(&mut body, &layer.wk, &xb, &k, false, kvd, &step);
            mat_ops(&mut body, &layer.wv, &xb, &v, false, kvd, &step);
            let half = c.head_dim as u32 / 2;
            body.push(op(Kernel::Rope, &[&rope, &q, &rope_q, &step], Dispatch::Threads { per_token: c.num_heads as u32 * half }));
            body.push(op(Kernel::Rope, &[&rope, &k, &rope_k, &step], Dispatch::Threads { per_token: c.num_kv_heads as u32 * half }));
            body.push(op(Kernel::KvStore { f16 }, &[&k, &v, &kc, &vc, &kv_p, &step], Dispatch::Kv { pairs: kvd / 2 }));
            body.push(op(Kernel::Attention { f16 }, &[&q, &kc, &vc, &att, &attn_p, &step], Dispatch::Attn { heads: c.num_heads as u32 }));
            mat_ops(&mut body, &layer.wo, &att, &x, true, h, &step);
            body.push(op(Kernel::RmsNorm, &[&layer.ffn_norm, &x, &xb, &norm_p, &step], Dispatch::PerToken));
            mat_ops(&mut body, &layer.w_gate, &xb, &g, false, ffn, &step);
            mat_ops(&mut body, &layer.w_up, &xb, &u, false, ffn, &step);
            body.push(op(Kernel::SwiGlu, &[&u, &g, &ffn_p, &step], Dispatch::Threads { per_token: ffn }));
            mat_ops(&mut body, &layer.w_down, &g, &x, true, h, &step);
        }
        body.push(op(Kernel::RmsNorm, &[&model.out_norm, &x, &xb, &norm_p, &step], Dispatch::PerToken));
        mat_ops(&mut head, model.lm_head(), &xout, &logits, false, c.vocab_size as u32, &step_out);
        let am_p = param(u32s(&[c.vocab_size as u32]));
        head.push(op(Kernel::Argmax, &[&logits, &argmax, &am_p, &step_out], Dispatch::PerToken));
        Ok(Session { model: model.clone(), opts, pos: 0, max_t, max_out, step, step_out, tokens, rope, xb, xout, logits, argmax, body, head, profile: None })
    }

    /// Tokens already in the KV cache.
    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn ctx_size(&self) -> usize {
        self.opts.ctx_size
    }

    /// Forgets the sequence (the cache is overwritten from position 0).
    pub fn reset(&mut self) {
        self.pos = 0;
    }

    /// Rolls the sequence back to `pos` tokens.
    pub fn truncate(&mut self, pos: usize) {
        self.pos = self.pos.min(pos);
    }

    fn check(&self, tokens: &[u32]) -> Result<()> {
        let vocab = self.model.cfg.vocab_size;
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Input(format!("token id {bad} is out of range (vocabulary of {vocab})")));
        }
        if self.pos + tokens.len() > self.opts.ctx_size {
            return Err(Error::Input(format!(
                "{} tokens after {} do not fit the context of {} tokens",
                tokens.len(),
                self.pos,
                self.opts.ctx_size
            )));
        }
        Ok(())
    }

    /// Runs one forward pass over at most `max_t` tokens, keeping the logits of the last `n_out`.
    /// Per-kernel GPU time (seconds, by kernel name) when profiling is on: each op is then
    /// submitted and waited for on its own, which is slow; for `bench --profile` only.
    pub fn enable_profile(&mut self) {
        self.profile = Some(Default::default());
    }

    pub fn profile(&self) -> Option<&HashMap<&'static str, f64>> {
        self.profile.as_ref()
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn run_profiled(&mut self, t: u32, n_out: u32, xcopy: (u64, u64)) {
        let gpu = &self.model.gpu;
        let prof = self.profile.as_mut().unwrap();
        let time = |prof: &mut HashMap<&'static str, f64>, name, f: &dyn Fn(&mut wgpu::CommandEncoder)| {
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            f(&mut enc);
            let t0 = std::time::Instant::now();
            gpu.queue.submit([enc.finish()]);
            gpu.flush();
            *prof.entry(name).or_default() += t0.elapsed().as_secs_f64();
        };
        for op in &self.body {
            let name = if t == 1 && op.matvec.is_some() { "matvec" } else { op.name };
            time(prof, name, &|enc| op.record(&mut enc.begin_compute_pass(&Default::default()), t));
        }
        time(prof, "copy", &|enc| enc.copy_buffer_to_buffer(&self.xb, xcopy.0, &self.xout, 0, xcopy.1));
        for op in &self.head {
            let name = if n_out == 1 && op.matvec.is_some() { "matvec" } else { op.name };
            time(prof, name, &|enc| op.record(&mut enc.begin_compute_pass(&Default::default()), n_out));
        }
    }

    fn run(&mut self, tokens: &[u32], n_out: usize) {
        let gpu = &self.model.gpu;
        let c = &self.model.cfg;
        let t = tokens.len() as u32;
        gpu.queue.write_buffer(&self.step, 0, &u32s(&[t, self.pos as u32, 0, 0]));
        gpu.queue.write_buffer(&self.step_out, 0, &u32s(&[n_out as u32, 0, n_out as u32, 0]));
        gpu.queue.write_buffer(&self.tokens, 0, bytemuck::cast_slice(tokens));
        let table = rope_table(&self.model.inv_freq, self.model.attention_factor, self.pos, tokens.len());
        gpu.queue.write_buffer(&self.rope, 0, bytemuck::cast_slice(&table));
        let row = (c.hidden_size * 4) as u64;
        let xcopy = ((tokens.len() - n_out) as u64 * row, n_out as u64 * row);
        #[cfg(not(target_arch = "wasm32"))]
        if self.profile.is_some() {
            self.run_profiled(t, n_out as u32, xcopy);
            self.pos += tokens.len();
            return;
        }
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for op in &self.body {
                op.record(&mut pass, t);
            }
        }
        enc.copy_buffer_to_buffer(&self.xb, xcopy.0, &self.xout, 0, xcopy.1);
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for op in &self.head {
                op.record(&mut pass, n_out as u32);
            }
        }
        gpu.queue.submit([enc.finish()]);
        self.pos += tokens.len();
    }

    async fn read_logits(&self, rows: usize) -> Result<Vec<Vec<f32>>> {
        let v = self.model.cfg.vocab_size;
        let bytes = self.model.gpu.read(&self.logits, 0, (rows * v * 4) as u64).await?;
        let f: &[f32] = bytemuck::cast_slice(&bytes);
        Ok(f.chunks(v).map(|r| r.to_vec()).collect())
    }

    /// Feeds `tokens` and returns the logits at every one of their positions.
    pub async fn logits_all(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.check(tokens)?;
        let mut out = Vec::with_capacity(tokens.len());
        for chunk in tokens.chunks(self.max_out) {
            self.run(chunk, chunk.len());
            out.extend(self.read_logits(chunk.len()).await?);
        }
        Ok(out)
    }

    /// Feeds `tokens` (in batches of the session's maximum); the logits of the last one stay on
    /// the GPU for [`Session::last_logits`] or [`Session::last_argmax`].
    pub async fn feed(&mut self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::Input("no tokens to feed".into()));
        }
        self.check(tokens)?;
        for chunk in tokens.chunks(self.max_t) {
            self.run(chunk, 1);
        }
        Ok(())
    }

    /// The logits after the last fed token.
    pub async fn last_logits(&self) -> Result<Vec<f32>> {
        Ok(self.read_logits(1).await?.remove(0))
    }

    /// The most likely next token after the last fed token (computed on the GPU).
    pub async fn last_argmax(&self) -> Result<u32> {
        let b = self.model.gpu.read(&self.argmax, 0, 4).await?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Greedy continuation: feeds `prompt`, then generates `n` tokens, stopping early at any of
    /// `stop` ids (which are included).
    pub async fn generate_greedy(&mut self, prompt: &[u32], n: usize, stop: &[u32]) -> Result<Vec<u32>> {
        self.feed(prompt).await?;
        let mut out = Vec::with_capacity(n);
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
        let mut rng = seed ^ 0x9E37_79B9_7F4A_7C15;
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let logits = self.last_logits().await?;
            let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let w: Vec<f64> = logits.iter().map(|&l| (((l - max) / temperature) as f64).exp()).collect();
            // splitmix64
            rng = rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = rng;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let mut r = (z >> 11) as f64 / (1u64 << 53) as f64 * w.iter().sum::<f64>();
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

    pub fn max_batch(&self) -> usize {
        self.max_t
    }
}
