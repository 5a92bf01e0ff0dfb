//! The recorded forward pass: embedding, each decoder layer's ops (norms, Q/K/V, RoPE and KV
//! store, attention, output projection, FFN), the output head.

use crate::gpu::kernels::{has_int_dot, Kernel};
use crate::model::config::ModelConfig;
use crate::model::{FfnIn, GpuMatrix, Layer, Model};
use super::*;

/// The recorded forward pass: the body runs on every token of a pass, the head (final norm
/// output rows -> logits -> argmax) on the rows whose logits are kept.
pub(super) struct Pass {
    pub(super) body: Vec<Op>,
    pub(super) head: Vec<Op>,
}

impl Builder<'_> {
    /// The whole forward pass: embedding, every decoder layer, then the output head.
    pub(super) fn forward(&self, model: &Model, bufs: &Buffers, p: &Params, kv: &KvLayout, split: Option<Split>) -> Pass {
        let mut body = Vec::new();
        self.embed(&mut body, &model.embed, &bufs.tokens, &bufs.x, &bufs.step);
        for (layer, caches) in model.layers.iter().zip(&bufs.kv) {
            self.layer(&mut body, &model.cfg, layer, caches, bufs, p, kv, split);
        }
        let mut head = Vec::new();
        self.head(&mut body, &mut head, model, bufs, p);
        Pass { body, head }
    }

    /// One decoder layer, in the order of its equations (x is the residual stream):
    ///   xb = rmsnorm(x) * attn_norm
    ///   q, k, v = Wq xb, Wk xb, Wv xb
    ///   q, k = rope(q), rope(k);  K[pos], V[pos] = k, v  (in each cache buffer: its KV heads)
    ///   att = softmax(q K^T / sqrt(head_dim)) V   (grouped-query: heads share KV heads)
    ///   x += Wo att
    ///   xb = rmsnorm(x) * ffn_norm
    ///   x += Wdown (silu(Wgate xb) * (Wup xb))
    #[allow(clippy::too_many_arguments)]
    pub(super) fn layer<'a>(
        &self,
        ops: &mut Vec<Op>,
        c: &ModelConfig,
        l: &'a Layer,
        caches: &[(wgpu::Buffer, wgpu::Buffer)],
        b: &'a Buffers,
        p: &Params,
        kv: &KvLayout,
        split: Option<Split>,
    ) {
        let code = kv.ty.code();
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
        if half.is_multiple_of(2) && self.gpu.fast.fused && caches.len() == 1 {
            // q, k = rope(q), rope(k); K[pos], V[pos] = k, v: one kernel (a work item per pair of
            // rope pairs and of values, or per pair of quantized blocks of K and of V).
            let kv_items = if kv.ty.quantized() { 2 * kvd.div_ceil(64) } else { c.num_kv_heads as u32 * half / 2 + kvd / 2 };
            let per_token = c.num_heads as u32 * half + kv_items;
            let (kc, vc) = &caches[0];
            ops.push(self.op(Kernel::RopeKv { kv: code }, &[&b.rope, &b.q, &b.k, &b.v, kc, vc, &b.seq, &p.rope_kv, st], Dispatch::Threads { per_token }));
        } else {
            ops.push(self.op(Kernel::Rope, &[&b.rope, &b.q, &p.rope_q, st], Dispatch::Threads { per_token: c.num_heads as u32 * half }));
            ops.push(self.op(Kernel::Rope, &[&b.rope, &b.k, &p.rope_k, st], Dispatch::Threads { per_token: c.num_kv_heads as u32 * half }));
            let vals = kv.piece_vals(c);
            let items = if kv.ty.quantized() { vals.div_ceil(64) } else { vals / 2 };
            for ((kc, vc), params) in caches.iter().zip(&p.kv) {
                ops.push(self.op(Kernel::KvStore { kv: code }, &[&b.k, &b.v, kc, vc, &b.seq, params, st], Dispatch::Kv { pairs: items }));
            }
        }
        self.attention(ops, c, caches, b, p, kv, split);
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
    /// the heads suit that kernel; else one workgroup per (query head, token). One dispatch per
    /// cache buffer (its KV heads).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention(
        &self,
        ops: &mut Vec<Op>,
        c: &ModelConfig,
        caches: &[(wgpu::Buffer, wgpu::Buffer)],
        b: &Buffers,
        p: &Params,
        kv: &KvLayout,
        split: Option<Split>,
    ) {
        let st = &b.step;
        let code = kv.ty.code();
        // Per token and key: a dot product and a weighted sum over head_dim, per query head.
        let heads = kv.heads * (c.num_heads / c.num_kv_heads) as u32;
        let work = Work::PerKey(4.0 * heads as f64 * c.head_dim as f64);
        let Some(sp) = split else {
            for ((kc, vc), params) in caches.iter().zip(&p.attn) {
                ops.push(self.op(Kernel::Attention { kv: code }, &[&b.q, kc, vc, &b.att, &b.seq, params, st], Dispatch::Attn { heads }).with_work(work));
            }
            return;
        };
        let tiles = if sp.short == sp.long { vec![(sp.short, Passes::All)] } else { vec![(sp.short, Passes::Short), (sp.long, Passes::Long)] };
        for (tile, passes) in tiles {
            let k = Kernel::AttnSplit { kv: code, g: sp.g, qt: tile.qt, chunk: tile.chunk, kb: tile.kb, gt: tile.gt, wpt: sp.wpt, hd: c.head_dim as u32 };
            let d = Dispatch::AttnSplit { kv_heads: kv.heads, qt: tile.qt, passes };
            for ((kc, vc), params) in caches.iter().zip(&p.split) {
                ops.push(self.op(k, &[&b.q, kc, vc, &b.att, &b.part, &b.seq, params, st], d).with_work(work));
            }
        }
        ops.push(self.op(Kernel::AttnCombine, &[&b.part, &b.att, &p.combine, st], Dispatch::AttnCombine { heads: c.num_heads as u32 }));
    }

    /// The output head: the final norm runs in the body (on every token, into `xb`); the kept
    /// rows are copied to `xout` between the two, then logits = lm_head xout and their argmax.
    pub(super) fn head(&self, body: &mut Vec<Op>, head: &mut Vec<Op>, model: &Model, b: &Buffers, p: &Params) {
        body.push(self.op(Kernel::RmsNorm, &[&model.out_norm, &b.x, &b.xb, &p.norm, &b.step], Dispatch::PerToken));
        self.mat(head, model.lm_head(), &b.xout, &b.logits, false, model.cfg.vocab_size as u32, &b.step_out);
        head.push(self.op(Kernel::Argmax, &[&b.logits, &b.argmax, &p.argmax, &b.step_out], Dispatch::PerToken));
    }
}
