//! Perplexity as llama.cpp's `llama-perplexity` computes it: the text's tokens split into
//! chunks of `n_ctx` (the remainder dropped), each chunk evaluated from an empty cache (its first
//! token replaced by bos when the tokenizer adds one), and the second half of every chunk scored.

use crate::gpu::session::Session;
use crate::error::{Error, Result};

/// The result of [`perplexity`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Perplexity {
    pub ppl: f64,
    pub chunks: usize,
    /// Tokens scored.
    pub scored: usize,
}

/// Perplexity of `tokens` in chunks of `n_ctx`; `on_chunk(i, running_ppl)` after each chunk.
pub async fn perplexity(
    session: &mut Session,
    tokens: &[u32],
    n_ctx: usize,
    bos: Option<u32>,
    mut on_chunk: impl FnMut(usize, f64),
) -> Result<Perplexity> {
    if n_ctx < 4 {
        return Err(Error::Input(format!("perplexity context {n_ctx} is too small (at least 4)")));
    }
    if n_ctx > session.ctx_size() {
        return Err(Error::Input(format!("perplexity context {n_ctx} exceeds the session's {}", session.ctx_size())));
    }
    let chunks = tokens.len() / n_ctx;
    if chunks == 0 {
        return Err(Error::Input(format!("the text has {} tokens, fewer than one chunk of {n_ctx}", tokens.len())));
    }
    let first = n_ctx / 2;
    let (mut nll, mut count) = (0.0f64, 0usize);
    for c in 0..chunks {
        let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        session.reset();
        let logits = session.logits_all(&chunk).await?;
        for i in first..n_ctx - 1 {
            let row = &logits[i];
            let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let sum: f64 = row.iter().map(|&l| ((l - max) as f64).exp()).sum();
            let target = tokens[c * n_ctx + i + 1] as usize;
            nll -= (row[target] - max) as f64 - sum.ln();
            count += 1;
        }
        on_chunk(c, (nll / count as f64).exp());
    }
    Ok(Perplexity { ppl: (nll / count as f64).exp(), chunks, scored: count })
}
