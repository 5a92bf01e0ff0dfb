//! A generation session: KV cache, activation buffers and the recorded forward pass. Bind groups
//! and pipelines are built once; each step writes a small uniform, the token ids, each token's
//! (position, cache row) and the rope table, then records the pass into a few command buffers
//! (`run.rs`). A session holds one or more sequences (each its own span of the KV cache); one
//! pass can extend several of them at once (continuous batching).
//!
//! Here: the options, the session and its bookkeeping (sequences, prefix copies, checks). In
//! `buffers.rs` the sizes and buffers, `ops.rs` the ops and their builder, `layer.rs` the
//! recorded forward pass, `run.rs` running it and reading back.

mod buffers;
mod kv;
mod layer;
mod ops;
mod run;

use crate::error::{Error, Result};
use crate::gpu::kernels::Kernel;
use crate::model::Model;
use std::cell::RefCell;
use std::collections::HashMap;

/// Session settings.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Context window in tokens (KV cache length).
    pub ctx_size: usize,
    /// How K and V are stored: f16 (default), f32, or q8_0 / q4_0 blocks.
    pub kv: KvType,
    /// Largest number of tokens per forward pass (further capped by the binding limit).
    pub max_batch: usize,
    /// Independent sequences, each with `ctx_size` tokens of KV cache.
    pub sequences: usize,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions { ctx_size: 4096, kv: KvType::F16, max_batch: 256, sequences: 1 }
    }
}

/// Part of a batched forward pass: `tokens` appended to sequence `seq`; with `logits`, the
/// logits after its last token are kept (output rows in piece order).
#[derive(Debug, Clone, Copy)]
pub struct Piece<'a> {
    pub seq: usize,
    pub tokens: &'a [u32],
    pub logits: bool,
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
    kv: KvLayout,
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
        let params = Params::new(&b, &model.cfg, &sizes.kv);
        let pass = b.forward(model, &bufs, &params, &sizes.kv, sizes.split);
        let copy_p = gpu.uniform("copy", &[0; 16]);
        let copy = KvCopy {
            pipeline: gpu.kernels.pipeline(Kernel::KvCopy),
            layers: bufs.kv.iter().flatten().map(|(kc, vc)| gpu.kernels.bind(Kernel::KvCopy, &[kc, vc, &copy_p])).collect(),
            params: copy_p,
        };
        Ok(Session {
            model: model.clone(),
            held: vec![Vec::new(); opts.sequences],
            opts,
            max_t: sizes.max_t,
            max_out: sizes.max_out,
            split: sizes.split,
            kv: sizes.kv,
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

    /// The KV cache's type.
    pub fn kv_type(&self) -> KvType {
        self.opts.kv
    }

    /// Buffers each layer's K (and V) cache spans: 1 unless one would pass the binding limit,
    /// else one per group of KV heads.
    pub fn kv_buffers(&self) -> usize {
        self.kv.pieces as usize
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
            // Every cache buffer has rows of the same size.
            let row_words = self.kv.row_words;
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

}

use buffers::*;
use layer::*;
use ops::*;
use kv::KvLayout;
pub use kv::{default_ctx_size, hadamard32, kv_row_bytes, kv_tokens_fit, KvType, DEFAULT_CTX_CAP};
pub use ops::{apply_matrix, apply_matrix_q8};
