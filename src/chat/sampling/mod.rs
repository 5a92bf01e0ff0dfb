//! Choosing the next token: penalties, temperature, top-k, top-p, min-p, seeded draws.
//!
//! Greedy decoding without penalties never reads logits back: the GPU's argmax (4 bytes) is
//! enough ([`Sampler::needs_logits`] is false). Everything else reads the last position's logits
//! (vocab x 4 bytes) once per token and works on the host, without sorting the vocabulary (see
//! `Buckets`): about 0.3 ms a token over 131,072 logits where a full sort took 15 ms, the same
//! token for the same seed.

use std::collections::HashMap;

/// Sampling settings (OpenAI names; `repetition_penalty` as in transformers).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// Nucleus sampling: keep the most likely tokens whose probabilities add up to `top_p`.
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Drop tokens less likely than `min_p` times the most likely one.
    pub min_p: f32,
    /// transformers' repetition penalty over every token in the context (1 = off; TildeOpen
    /// recommends 1.2): positive logits are divided by it, negative ones multiplied.
    pub repetition_penalty: f32,
    /// OpenAI's penalties over generated tokens: `presence` once per distinct token,
    /// `frequency` per occurrence, subtracted from the logit.
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// Same seed, same output. `None` draws a seed from the clock.
    pub seed: Option<u64>,
    /// Never choose an end-of-generation token (the stop tokens): the answer runs to
    /// `max_tokens` or a stop string. For benchmarks (llama.cpp's and vLLM's `ignore_eos`).
    pub ignore_eos: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            ignore_eos: false,
        }
    }
}

/// A sampler for one generation.
pub struct Sampler {
    p: SamplingParams,
    rng: u64,
    /// Tokens in the context (prompt and generated), for the repetition penalty.
    seen: HashMap<u32, u32>,
    /// Never penalised: the end-of-turn/stop tokens, which every chat prompt holds (its turn
    /// markers); penalising them would keep answers from ending.
    exempt: Vec<u32>,
    /// Generated tokens and their counts, for presence/frequency penalties.
    generated: HashMap<u32, u32>,
}

impl Sampler {
    /// `exempt`: tokens the repetition penalty never touches (the stop tokens).
    pub fn new(p: SamplingParams, prompt: &[u32], exempt: &[u32]) -> Self {
        let seed = p.seed.unwrap_or_else(crate::util::clock_seed);
        let mut seen = HashMap::new();
        if p.repetition_penalty != 1.0 {
            for &t in prompt {
                *seen.entry(t).or_insert(0) += 1;
            }
        }
        Sampler { p, rng: seed ^ crate::util::GOLDEN, seen, exempt: exempt.to_vec(), generated: HashMap::new() }
    }

    /// Whether [`Sampler::sample`] needs the logits (otherwise the GPU argmax is the answer).
    pub fn needs_logits(&self) -> bool {
        self.p.temperature > 0.0 || self.p.ignore_eos || self.p.repetition_penalty != 1.0 || self.p.presence_penalty != 0.0 || self.p.frequency_penalty != 0.0
    }

    /// Records a token that joined the context (for the penalties).
    pub fn accept(&mut self, t: u32) {
        if self.p.repetition_penalty != 1.0 {
            *self.seen.entry(t).or_insert(0) += 1;
        }
        *self.generated.entry(t).or_insert(0) += 1;
    }

    fn next_f64(&mut self) -> f64 {
        crate::util::splitmix64_f64(&mut self.rng)
    }

    /// The next token from the last position's logits (modified in place by the penalties);
    /// `None` when no logit is finite.
    pub fn sample(&mut self, logits: &mut [f32]) -> Option<u32> {
        if self.p.ignore_eos {
            for &t in &self.exempt {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        let rp = self.p.repetition_penalty;
        if rp != 1.0 {
            for &t in self.seen.keys().filter(|t| !self.exempt.contains(t)) {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / rp } else { *l * rp };
                }
            }
        }
        if self.p.presence_penalty != 0.0 || self.p.frequency_penalty != 0.0 {
            for (&t, &n) in &self.generated {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= self.p.presence_penalty + self.p.frequency_penalty * n as f32;
                }
            }
        }
        if self.p.temperature <= 0.0 {
            // The first of the largest logits above -3.4e38 (NaN never wins, +inf does): the
            // GPU's argmax.wgsl rule, so greedy rows agree with and without penalties.
            let mut best: Option<(usize, f32)> = None;
            for (i, &l) in logits.iter().enumerate() {
                if l > -3.4e38 && best.is_none_or(|b| l > b.1) {
                    best = Some((i, l));
                }
            }
            return best.map(|b| b.0 as u32);
        }
        // A +inf logit is certain: the draw is among the +inf tokens alone, as greedy takes one.
        let certain = logits.contains(&f32::INFINITY);
        if !certain && self.p.top_k == 0 && logits.len() > SORT_UP_TO {
            // Every finite logit is a candidate: no list of them unless the draw is too close to call.
            if let Some(mut b) = Buckets::new(logits, None, self.p.temperature, self.p.top_p < 1.0) {
                if b.n == 0 {
                    return None;
                }
                let u = self.next_f64();
                return Some(match b.pick(&self.p, u) {
                    Some(t) => t,
                    None => pick_sorted(&mut finite(logits), &self.p, u),
                });
            }
        }
        let mut cand: Vec<(u32, f32)> = if certain {
            logits.iter().enumerate().filter(|(_, &l)| l == f32::INFINITY).map(|(i, _)| (i as u32, 0.0)).collect()
        } else {
            finite(logits)
        };
        if cand.is_empty() {
            return None;
        }
        if self.p.top_k > 0 && self.p.top_k < cand.len() {
            cand.select_nth_unstable_by(self.p.top_k - 1, by_logit);
            cand.truncate(self.p.top_k);
        }
        let u = self.next_f64();
        Some(pick(&mut cand, &self.p, u))
    }
}

/// The finite logits as candidates (token id, logit).
fn finite(logits: &[f32]) -> Vec<(u32, f32)> {
    logits.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| (i as u32, l)).collect()
}

/// The candidates' order: higher logit first, then lower id.
fn by_logit(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.partial_cmp(&a.1).unwrap().then(a.0.cmp(&b.0))
}

/// Up to this many candidates are simply sorted ([`pick_sorted`]).
const SORT_UP_TO: usize = 512;

/// The token that the draw `u` (uniform in [0, 1)) picks among the candidates (finite logits,
/// or +inf ones given as 0.0; top-k applied): [`pick_sorted`]'s, found without sorting when
/// there are many.
fn pick(cand: &mut [(u32, f32)], p: &SamplingParams, u: f64) -> u32 {
    if cand.len() > SORT_UP_TO {
        let (ids, ls): (Vec<u32>, Vec<f32>) = cand.iter().copied().unzip();
        if let Some(t) = Buckets::new(&ls, Some(&ids), p.temperature, p.top_p < 1.0).and_then(|mut b| b.pick(p, u)) {
            return t;
        }
    }
    pick_sorted(cand, p, u)
}

/// The definition: sort the candidates, softmax in f64 (exp((logit - max) / temperature),
/// normalised by their sum in sorted order), cut by top-p (cumulative sum in sorted order)
/// and min-p (relative to the most likely), draw `u` times the kept mass and walk the kept
/// tokens in order. O(n log n).
fn pick_sorted(cand: &mut [(u32, f32)], p: &SamplingParams, u: f64) -> u32 {
    cand.sort_unstable_by(by_logit);
    let max = cand[0].1;
    let mut probs: Vec<f64> = cand.iter().map(|c| (((c.1 - max) / p.temperature) as f64).exp()).collect();
    let sum: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|q| *q /= sum);
    let mut keep = probs.len();
    if p.top_p < 1.0 {
        let mut acc = 0.0;
        for (i, q) in probs.iter().enumerate() {
            acc += q;
            if acc >= p.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
    }
    if p.min_p > 0.0 {
        let floor = probs[0] * p.min_p as f64;
        keep = keep.min(probs.iter().take_while(|&&q| q >= floor).count().max(1));
    }
    let total: f64 = probs[..keep].iter().sum();
    let mut r = u * total;
    for (i, q) in probs[..keep].iter().enumerate() {
        if r < *q {
            return cand[i].0;
        }
        r -= q;
    }
    cand[keep - 1].0
}

// Sampling without sorting the vocabulary.
//
// pick_sorted's token is decided by a few comparisons: the top-p cut (a cumulative probability
// in sorted order against top_p), the min-p cut (each probability against the top one's times
// min_p) and the walk (the draw against cumulative probabilities). Each compared quantity is,
// up to floating-point error, a ratio of sums of exp(x) over prefixes of the sorted order
// (x = (logit - max) / temperature, as there): the normaliser cancels in the walk and in min-p
// and enters top-p as the sum over all. Buckets::pick bounds those sums and decides a
// comparison only when it holds with a margin (relative `delta`) covering every rounding of
// pick_sorted (libm's exp, sums of up to n terms in any order, the divisions, the walk's
// subtractions) and its own; when one is too close to call it returns None and the caller
// sorts. So the token is pick_sorted's, always. The sort happens when a compared quantity is
// within `delta` (2.4e-10 at 131,072 candidates) of its threshold: exact ties, such as a top-p
// cut between equal probabilities, or about once in 1e9 draws.
//

mod buckets;
use buckets::Buckets;

#[cfg(test)]
mod tests;
