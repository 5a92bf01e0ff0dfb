//! Running a session's passes: recording the ops into command buffers (a decode pass in two,
//! a prefill pass in pieces of a few layers), the profiled variant, and reading outputs back.

use crate::error::{Error, Result};
use crate::gpu::kernels::MATVEC_MAX_T;
use crate::model::config::rope_table;
use super::*;

impl Session {
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
        let (splits, span) = self.slices(t, last);
        gpu.queue.write_buffer(&self.bufs.step, 0, &u32s(&[t, splits, span, 0]));
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
        // goes out in pieces of about PREFILL_FLOPS_PER_SUBMIT of work: on a slow GPU one
        // command buffer for a whole 256-token pass through a big model can outlast the OS's or
        // the browser's GPU watchdog (Windows resets the device after 2 s).
        let pieces = if t > MATVEC_MAX_T {
            let keys = seq.iter().map(|s| s[0] as f64 + 1.0).sum::<f64>() / t as f64;
            budget_pieces(&self.pass.body, |op| op.flops(t, keys), PREFILL_FLOPS_PER_SUBMIT)
        } else {
            let per = self.pass.body.len().div_ceil(DECODE_SUBMITS).max(1);
            (0..self.pass.body.len()).step_by(per).map(|i| i..(i + per).min(self.pass.body.len())).collect()
        };
        let mut chunks = pieces.into_iter().map(|r| &self.pass.body[r]).peekable();
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

    /// The keys and values sequence `seq` holds in layer `layer`'s cache, decoded on the host:
    /// (K, V), each a row of `kv_dim` values per token (for tests and tools; a readback).
    pub async fn read_kv(&self, layer: usize, seq: usize) -> Result<(Vec<Vec<f32>>, Vec<Vec<f32>>)> {
        let (Some(caches), Some(held)) = (self.bufs.kv.get(layer), self.held.get(seq)) else {
            return Err(Error::Input(format!("no layer {layer} or sequence {seq}")));
        };
        let vals = self.kv.piece_vals(&self.model.cfg) as usize;
        let rw = self.kv.row_words as u64;
        let first = (seq * self.opts.ctx_size) as u64;
        let n = held.len();
        if n == 0 {
            return Ok((vec![], vec![]));
        }
        let mut k = vec![Vec::with_capacity(self.model.cfg.kv_dim()); n];
        let mut v = k.clone();
        for (kc, vc) in caches {
            for (buf, out) in [(kc, &mut k), (vc, &mut v)] {
                let bytes = self.model.gpu.read(buf, first * rw * 4, (n as u64 * rw * 4).max(4)).await?;
                let words: &[u32] = bytemuck::cast_slice(&bytes);
                for (row, o) in words.chunks(rw as usize).zip(out.iter_mut()) {
                    o.extend(self.kv.ty.decode_row(row, vals));
                }
            }
        }
        Ok((k, v))
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
        let splits = self.slices(t as u32, last as u32).0;
        let body = self.pass.body.iter().filter(|op| op.runs(t as u32, splits)).count();
        body + if n_out > 0 { self.pass.head.len() } else { 0 }
    }

    /// (slices, keys per slice) of split attention in a pass of `t` tokens whose latest is at
    /// position `last`: long passes have tokens enough to fill the device, one slice each.
    fn slices(&self, t: u32, last: u32) -> (u32, u32) {
        match self.split {
            Some(sp) if t <= MATVEC_MAX_T => sp.slices(last),
            _ => (1, u32::MAX),
        }
    }

    /// Workgroups of the decode attention dispatches (all cache buffers) in a one-token pass whose
    /// token is at position `last`: KV heads x context slices (the baseline kernel: query heads).
    pub fn attn_workgroups(&self, last: usize) -> usize {
        let c = &self.model.cfg;
        match self.split {
            Some(_) => c.num_kv_heads * self.slices(1, last as u32).0 as usize,
            None => c.num_heads,
        }
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

/// Ops per command buffer when profiling with timestamps (see `time_ops`): about four layers.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
pub(super) const PREFILL_OPS_PER_SUBMIT: usize = 48;

/// Work per command buffer in a prefill pass (see `Session::run`), in floating-point
/// operations: 0.1 s on a GPU that sustains 0.5 TFLOPS (an integrated GPU), far under the 2 s
/// watchdog; one op larger than this goes alone.
pub(super) const PREFILL_FLOPS_PER_SUBMIT: f64 = 5e10;

/// `ops` cut into consecutive ranges whose work (`flops` each) stays within `budget`, each at
/// least one op (an op over the budget goes with only the light ops after it).
pub(super) fn budget_pieces<T>(ops: &[T], flops: impl Fn(&T) -> f64, budget: f64) -> Vec<std::ops::Range<usize>> {
    let mut out = vec![];
    let (mut start, mut sum) = (0, 0.0);
    for (i, op) in ops.iter().enumerate() {
        let w = flops(op);
        if i > start && w > 0.0 && sum + w > budget {
            out.push(start..i);
            (start, sum) = (i, 0.0);
        }
        sum += w;
    }
    if start < ops.len() {
        out.push(start..ops.len());
    }
    out
}

/// Command buffers per decode pass (the last also holds the output head).
pub(super) const DECODE_SUBMITS: usize = 2;

/// Adds each op's GPU time to `prof` (seconds, by name). With timestamp queries every op is its
/// own compute pass with a timestamp at its start and end, recorded into one submit per
/// PREFILL_OPS_PER_SUBMIT ops (as a prefill pass, for the watchdog),
/// so the figures are the device's own; without them each op is submitted and waited for alone and
/// timed on the host, which on a fast GPU is mostly the round trip.
#[cfg(not(target_arch = "wasm32"))]
pub(super) fn time_ops(gpu: &crate::gpu::Gpu, prof: &mut HashMap<&'static str, f64>, ops: &[(&'static str, &Op, u32, u32)]) {
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

#[cfg(test)]
mod tests {
    use super::budget_pieces;

    #[test]
    fn prefill_pieces_follow_the_work_budget() {
        // Ops of 0 (light), 30 and 80 units under a budget of 100: a piece closes before the op
        // that would pass the budget; an op over it goes alone; light ops ride along.
        let work = [0.0, 30.0, 30.0, 0.0, 30.0, 30.0, 150.0, 0.0, 80.0, 0.0];
        let pieces = budget_pieces(&work, |w| *w, 100.0);
        assert_eq!(pieces, vec![0..5, 5..6, 6..8, 8..10]);
        assert!(pieces.iter().all(|r| work[r.clone()].iter().sum::<f64>() <= 100.0 || r.len() == 1 || work[r.start] > 100.0));
        assert!(budget_pieces(&[] as &[f64], |w: &f64| *w, 1.0).is_empty());
        assert_eq!(budget_pieces(&[0.0f64; 3], |w: &f64| *w, 1.0), vec![0..3]);
    }
}
