//! Choosing the next token: penalties, temperature, top-k, top-p, min-p, seeded draws.
//!
//! Greedy decoding without penalties never reads logits back: the GPU's argmax (4 bytes) is
//! enough ([`Sampler::needs_logits`] is false). Everything else reads the last position's logits
//! (vocab x 4 bytes) once per token and works on the host.

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
        // Candidates sorted by logit, cut by top-k.
        // A +inf logit is certain: the draw is among the +inf tokens alone, as greedy takes one.
        let certain = logits.contains(&f32::INFINITY);
        let mut cand: Vec<(u32, f32)> = if certain {
            logits.iter().enumerate().filter(|(_, &l)| l == f32::INFINITY).map(|(i, _)| (i as u32, 0.0)).collect()
        } else {
            logits.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| (i as u32, l)).collect()
        };
        if cand.is_empty() {
            return None;
        }
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.partial_cmp(&a.1).unwrap().then(a.0.cmp(&b.0));
        if self.p.top_k > 0 && self.p.top_k < cand.len() {
            cand.select_nth_unstable_by(self.p.top_k - 1, by_logit);
            cand.truncate(self.p.top_k);
        }
        cand.sort_unstable_by(by_logit);
        let max = cand[0].1;
        let mut probs: Vec<f64> = cand.iter().map(|c| (((c.1 - max) / self.p.temperature) as f64).exp()).collect();
        let sum: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= sum);
        let mut keep = probs.len();
        if self.p.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, p) in probs.iter().enumerate() {
                acc += p;
                if acc >= self.p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        if self.p.min_p > 0.0 {
            let floor = probs[0] * self.p.min_p as f64;
            keep = keep.min(probs.iter().take_while(|&&p| p >= floor).count().max(1));
        }
        let total: f64 = probs[..keep].iter().sum();
        let mut r = self.next_f64() * total;
        for (i, p) in probs[..keep].iter().enumerate() {
            if r < *p {
                return Some(cand[i].0);
            }
            r -= p;
        }
        Some(cand[keep - 1].0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(t: f32) -> SamplingParams {
        SamplingParams { temperature: t, seed: Some(7), ..Default::default() }
    }

    #[test]
    fn ignore_eos_never_picks_a_stop_token() {
        // Token 1 is the stop token and the most likely: greedy and sampled draws skip it.
        let mut g = Sampler::new(SamplingParams { temperature: 0.0, ignore_eos: true, ..Default::default() }, &[], &[1]);
        assert!(g.needs_logits(), "the GPU argmax cannot skip it");
        assert_eq!(g.sample(&mut [0.1, 9.0, 2.0]), Some(2));
        let mut t = Sampler::new(SamplingParams { ignore_eos: true, ..params(1.0) }, &[], &[1]);
        for _ in 0..50 {
            assert_ne!(t.sample(&mut [0.0, 5.0, 0.0]), Some(1));
        }
    }

    #[test]
    fn greedy_and_penalties() {
        let mut s = Sampler::new(SamplingParams { temperature: 0.0, ..Default::default() }, &[], &[]);
        assert!(!s.needs_logits());
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.0]), Some(1));
        // Repetition penalty 2 on token 1 (seen in the prompt): 3.0 -> 1.5 < 2.0.
        let rp = SamplingParams { temperature: 0.0, repetition_penalty: 2.0, ..Default::default() };
        let mut s = Sampler::new(rp.clone(), &[1], &[]);
        assert!(s.needs_logits());
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.0]), Some(2));
        // ... unless token 1 is a stop token (every chat prompt holds its turn markers).
        let mut s = Sampler::new(rp, &[1], &[1]);
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.0]), Some(1));
        let mut s = Sampler::new(SamplingParams { temperature: 0.0, frequency_penalty: 0.6, ..Default::default() }, &[], &[]);
        s.accept(1);
        s.accept(1);
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.0]), Some(2));
    }

    #[test]
    fn non_finite_logits() {
        let greedy = SamplingParams { temperature: 0.0, presence_penalty: 0.5, ..Default::default() };
        let mut s = Sampler::new(greedy.clone(), &[], &[]);
        assert_eq!(s.sample(&mut [f32::NAN, 1.0, f32::INFINITY, 2.0]), Some(2));
        assert_eq!(s.sample(&mut [f32::NAN, 1.0, 2.0, 2.0]), Some(2));
        let mut s = Sampler::new(greedy, &[], &[]);
        assert_eq!(s.sample(&mut [f32::NAN, f32::NEG_INFINITY]), None);
        let mut s = Sampler::new(params(1.0), &[], &[]);
        assert_eq!(s.sample(&mut [f32::NAN, f32::NAN]), None);
        assert_eq!(s.sample(&mut [f32::NAN, 0.5]), Some(1));
        // +inf is certain when sampling too (it was dropped as non-finite, and 1.0 drawn).
        for _ in 0..20 {
            assert_eq!(s.sample(&mut [1.0, f32::INFINITY, 3.0]), Some(1));
        }
        let mut seen = [0; 3];
        for _ in 0..200 {
            seen[s.sample(&mut [f32::INFINITY, 1.0, f32::INFINITY]).unwrap() as usize] += 1;
        }
        assert!(seen[1] == 0 && seen[0] > 50 && seen[2] > 50, "{seen:?}");
    }

    #[test]
    fn seeded_and_truncated() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let draw = |p: SamplingParams| {
            let mut s = Sampler::new(p, &[], &[]);
            (0..50).map(|_| s.sample(&mut logits.clone()).unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(draw(params(1.0)), draw(params(1.0)));
        assert_ne!(draw(params(1.0)), draw(SamplingParams { seed: Some(8), ..params(1.0) }));
        let mut order: Vec<usize> = (0..100).collect();
        order.sort_by(|&a, &b| logits[b].partial_cmp(&logits[a]).unwrap());
        let top3: Vec<u32> = order[..3].iter().map(|&i| i as u32).collect();
        assert!(draw(SamplingParams { top_k: 3, ..params(1.0) }).iter().all(|t| top3.contains(t)));
        assert!(draw(SamplingParams { top_p: 1e-6, ..params(1.0) }).iter().all(|&t| t == top3[0]));
        assert!(draw(SamplingParams { min_p: 1.0, ..params(5.0) }).iter().all(|&t| t == top3[0]));
    }
}
