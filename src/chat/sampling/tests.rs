//! The sampler's tests: seeded draws, penalties, non-finite logits, and the bucketed
//! selection against the full sort it replaces (the same token for every input tried).

use super::*;
use super::buckets::*;

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

/// The sampler before partial selection (`Sampler::sample` with temperature > 0 and no
/// penalties, as it was: a full sort per token), the reference for the new one.
fn reference(sp: &SamplingParams, rng: &mut u64, logits: &[f32]) -> Option<u32> {
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
    if sp.top_k > 0 && sp.top_k < cand.len() {
        cand.select_nth_unstable_by(sp.top_k - 1, by_logit);
        cand.truncate(sp.top_k);
    }
    cand.sort_unstable_by(by_logit);
    let max = cand[0].1;
    let mut probs: Vec<f64> = cand.iter().map(|c| (((c.1 - max) / sp.temperature) as f64).exp()).collect();
    let sum: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= sum);
    let mut keep = probs.len();
    if sp.top_p < 1.0 {
        let mut acc = 0.0;
        for (i, p) in probs.iter().enumerate() {
            acc += p;
            if acc >= sp.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
    }
    if sp.min_p > 0.0 {
        let floor = probs[0] * sp.min_p as f64;
        keep = keep.min(probs.iter().take_while(|&&p| p >= floor).count().max(1));
    }
    let total: f64 = probs[..keep].iter().sum();
    let mut r = crate::util::splitmix64_f64(rng) * total;
    for (i, p) in probs[..keep].iter().enumerate() {
        if r < *p {
            return Some(cand[i].0);
        }
        r -= p;
    }
    Some(cand[keep - 1].0)
}

struct Rand(u64);

impl Rand {
    fn f(&mut self) -> f64 {
        crate::util::splitmix64_f64(&mut self.0)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.f() * n as f64) as usize
    }
    fn normal(&mut self) -> f64 {
        (-2.0 * (1.0 - self.f()).ln()).sqrt() * (std::f64::consts::TAU * self.f()).cos()
    }
}

/// A language model's logits: a few large ones, some middling, a long normal tail.
fn lm_logits(r: &mut Rand, n: usize, sigma: f64) -> Vec<f32> {
    let mut v: Vec<f32> = (0..n).map(|_| (sigma * r.normal()) as f32).collect();
    for j in 0..(n / 2000 + 1).min(40) {
        let i = r.below(n);
        v[i] = if j < 4 { 14.0 + 5.0 * r.f() } else { 6.0 + 8.0 * r.f() } as f32;
    }
    v
}

/// Logits of several shapes, ties and non-finite values included.
fn random_logits(r: &mut Rand, n: usize) -> Vec<f32> {
    let mut v: Vec<f32> = match r.below(6) {
        0 | 1 => {
            let sigma = [1.0, 2.5, 4.0][r.below(3)];
            lm_logits(r, n, sigma)
        }
        2 => (0..n).map(|_| (4.0 * r.f() - 2.0) as f32).collect(),
        // Many exact ties, signed zeros among them.
        3 => (0..n).map(|_| ((2.0 * r.normal()).round() / 2.0) as f32 * if r.f() < 0.5 { -1.0 } else { 1.0 }).collect(),
        4 => (0..n).map(|_| (20.0 * r.normal()) as f32).collect(),
        _ => (0..n).map(|_| r.below(3) as f32).collect(),
    };
    let mut sprinkle = |r: &mut Rand, x: f32, chance: f64, most: usize| {
        if r.f() < chance {
            for _ in 0..1 + r.below(most) {
                let i = r.below(n);
                v[i] = x;
            }
        }
    };
    sprinkle(r, f32::NEG_INFINITY, 0.3, 50);
    sprinkle(r, f32::NAN, 0.3, 50);
    sprinkle(r, f32::INFINITY, 0.05, 3);
    if r.f() < 0.02 {
        v.iter_mut().for_each(|l| *l = if r.f() < 0.5 { f32::NAN } else { f32::NEG_INFINITY });
    }
    v
}

/// The candidates `Sampler::sample` passes to `pick`.
fn candidates(logits: &[f32], top_k: usize) -> Vec<(u32, f32)> {
    let certain = logits.contains(&f32::INFINITY);
    let mut cand: Vec<(u32, f32)> = if certain {
        logits.iter().enumerate().filter(|(_, &l)| l == f32::INFINITY).map(|(i, _)| (i as u32, 0.0)).collect()
    } else {
        logits.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| (i as u32, l)).collect()
    };
    if top_k > 0 && top_k < cand.len() {
        cand.select_nth_unstable_by(top_k - 1, by_logit);
        cand.truncate(top_k);
    }
    cand
}

/// `Buckets::pick` on a candidate list, with or without the tight bounds, and whether they
/// were too loose (then every exp is computed).
fn partial(cand: &[(u32, f32)], p: &SamplingParams, u: f64, tight: bool) -> (Option<u32>, bool) {
    let (ids, ls): (Vec<u32>, Vec<f32>) = cand.iter().copied().unzip();
    let Some(mut b) = Buckets::new(&ls, Some(&ids), p.temperature, tight) else { return (None, false) };
    if let Ok(t) = b.decide(p, u) {
        return (Some(t), false);
    }
    b.refine();
    (b.decide(p, u).ok(), true)
}

#[test]
fn partial_selection_draws_what_a_full_sort_draws() {
    let mut r = Rand(2024);
    let (mut calls, mut refines, mut unsure) = (0usize, 0usize, 0usize);
    for case in 0..41 {
        // Sizes 1..5000 (log-uniform), and one vocabulary of 131072.
        let n = if case == 40 { 131072 } else { (5000f64.powf(r.f()) as usize).max(1) };
        let logits = if case == 40 { lm_logits(&mut r, n, 3.0) } else { random_logits(&mut r, n) };
        let seeds: &[u64] = if case == 40 { &[1] } else { &[1, 99] };
        for top_k in [0, 1, 40] {
            for top_p in [1.0, 0.9, 0.5] {
                for min_p in [0.0, 0.05] {
                    for temperature in [0.3, 1.0, 1.7] {
                        for &seed in seeds {
                            let p = SamplingParams { temperature, top_p, top_k, min_p, seed: Some(seed), ..Default::default() };
                            let mut s = Sampler::new(p.clone(), &[], &[]);
                            let mut rng = seed ^ crate::util::GOLDEN;
                            for draw in 0..2 {
                                let want = reference(&p, &mut rng, &logits);
                                assert_eq!(s.sample(&mut logits.clone()), want, "case {case} n {n} {p:?} draw {draw}");
                            }
                            // The partial path alone, whatever the size, on other draws.
                            let cand = candidates(&logits, top_k);
                            if cand.is_empty() || case == 40 {
                                continue;
                            }
                            for tight in [false, true] {
                                let u = r.f();
                                calls += 1;
                                let (t, refined) = partial(&cand, &p, u, tight);
                                refines += refined as usize;
                                match t {
                                    Some(t) => assert_eq!(t, pick_sorted(&mut cand.clone(), &p, u), "case {case} n {n} {p:?} u {u}"),
                                    None => unsure += 1,
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    // Too close to call with coarse bounds (then every exp is computed), or even then (then sorted).
    println!("partial selection: {calls} draws, {refines} refined, {unsure} sorted");
    assert!(unsure * 20 < calls, "{unsure} of {calls}");
}

#[test]
fn draws_near_a_boundary_are_exact_or_sorted() {
    // Draws, top-p and min-p placed on (and a few ulps around) the sorted definition's own
    // cumulative sums and ratios, where its roundings decide: the partial path answers the
    // same token or declines (then the caller sorts), never another token.
    let mut r = Rand(77);
    let (mut calls, mut unsure) = (0usize, 0usize);
    for _ in 0..8 {
        let n = 600 + r.below(3000);
        let sigma = 2.0 + r.f();
        let logits = lm_logits(&mut r, n, sigma);
        let cand = candidates(&logits, 0);
        for temperature in [0.5f32, 1.0] {
            let mut s = cand.clone();
            s.sort_unstable_by(by_logit);
            let e: Vec<f64> = s.iter().map(|c| (((c.1 - s[0].1) / temperature) as f64).exp()).collect();
            let sum: f64 = e.iter().sum();
            let probs: Vec<f64> = e.iter().map(|x| x / sum).collect();
            let cum: Vec<f64> = std::iter::once(0.0).chain(probs.iter().scan(0.0, |a, q| {
                *a += q;
                Some(*a)
            })).collect();
            for _ in 0..10 {
                let k = if r.f() < 0.5 { 1 + r.below(8) } else { 1 + r.below(s.len() - 1) };
                for (top_p, min_p) in [(1.0, 0.0), (cum[k] as f32, 0.0), (1.0, (probs[k] / probs[0]) as f32)] {
                    let p = SamplingParams { temperature, top_p, min_p, ..Default::default() };
                    let at = cum[k] / cum[s.len()];
                    for u in [at, at * (1.0 + 1e-9), at * (1.0 - 1e-9), at * (1.0 + 1e-13), at * (1.0 - 1e-13), r.f()]
                        .into_iter()
                        .chain((-3..=3).map(|j| f64::from_bits((at.to_bits() as i64 + j) as u64)))
                    {
                        if !(0.0..1.0).contains(&u) {
                            continue;
                        }
                        for tight in [false, true] {
                            calls += 1;
                            match partial(&cand, &p, u, tight).0 {
                                Some(t) => assert_eq!(t, pick_sorted(&mut cand.clone(), &p, u), "n {n} {p:?} u {u} k {k}"),
                                None => unsure += 1,
                            }
                        }
                    }
                }
            }
        }
    }
    println!("near a boundary: {unsure} of {calls} draws sorted");
    assert!(unsure > 0 && unsure * 4 < calls * 3, "{unsure} of {calls}");
}

#[test]
fn edge_cases_match_the_full_sort() {
    // Sizes past SORT_UP_TO through Sampler::sample; ties at the top, +inf, min_p 1, top_p 0.
    let n = 2000;
    let mut r = Rand(5);
    let mut cases: Vec<Vec<f32>> = vec![vec![1.5; n], (0..n).map(|i| (i % 7) as f32).collect(), (0..n).map(|i| -(i as f32)).collect()];
    let mut v = lm_logits(&mut r, n, 2.0);
    v[3] = f32::INFINITY;
    v[1999] = f32::INFINITY;
    cases.push(v);
    let mut v = lm_logits(&mut r, n, 2.0);
    let top = v.iter().cloned().fold(f32::MIN, f32::max);
    v[10] = top;
    v[20] = top;
    v[30] = -0.0;
    v[31] = 0.0;
    cases.push(v);
    cases.push((0..n).map(|i| if i < 5 { 0.0 } else { -1e30 }).collect());
    cases.push((0..n).map(|i| if i % 2 == 0 { 3.0e38 } else { -3.0e38 }).collect());
    for logits in &cases {
        for (temperature, top_p, min_p) in [
            (1.0, 1.0, 1.0),
            (1.0, 0.0, 0.0),
            (1.0, -1.0, 0.5),
            (1e-30, 0.9, 0.0),
            (f32::INFINITY, 0.5, 0.0),
            (1.0, 0.99999994, 2.0),
            (0.7, 1.0, 1e-30),
            (f32::NAN, 0.9, 0.1),
        ] {
            let p = SamplingParams { temperature, top_p, min_p, seed: Some(3), ..Default::default() };
            let mut s = Sampler::new(p.clone(), &[], &[]);
            let mut rng = 3 ^ crate::util::GOLDEN;
            for _ in 0..20 {
                assert_eq!(s.sample(&mut logits.clone()), reference(&p, &mut rng, logits), "{p:?}");
            }
        }
    }
}

#[test]
fn exp_approx_and_bucket_sums() {
    // The margins assume exp_approx within EXP_EPS of exp (its bound: 1.5e-14).
    let mut r = Rand(11);
    let mut worst = 0f64;
    for i in 0..200_000 {
        let x = if i < 16385 { -(i as f64) / 256.0 } else { -64.0 * r.f() };
        worst = worst.max((exp_approx(x) / x.exp() - 1.0).abs());
    }
    assert!(worst < EXP_EPS / 4.0, "{worst}");
    assert_eq!(exp_approx(0.0), 1.0);
    assert_eq!(exp_approx(-0.0), 1.0);
    assert_eq!(exp_approx(-64.5), 0.0);
    assert_eq!(exp_approx(f64::NEG_INFINITY), 0.0);
    // A candidate's exp(x) lies within its bucket's bounds, and refine sums them.
    let edges = bucket_edges();
    for temperature in [0.3f32, 1.0, 1.7, 1e-3] {
        let logits: Vec<f32> = (0..20000).map(|_| (30.0 * r.normal()) as f32).collect();
        let mut b = Buckets::new(&logits, None, temperature, false).unwrap();
        let mut sum = vec![0f64; BUCKETS];
        for (&l, &k) in logits.iter().zip(&b.bucket) {
            let e = (((l - b.max) / temperature) as f64).exp();
            let k = k as usize;
            let lo = if k < LAST { edges[k + 1] } else { 0.0 };
            assert!(lo * (1.0 - EXP_EPS) <= e && e <= edges[k] * (1.0 + EXP_EPS), "{l} {temperature}");
            sum[k] += e;
        }
        b.refine();
        for (k, (&m, &s)) in b.mass.as_ref().unwrap().iter().zip(&sum).take(LAST).enumerate() {
            assert!((m - s).abs() <= s * EXP_EPS, "{k} {m} {s}");
        }
    }
}

#[test]
fn sampling_time_over_131072_logits() {
    // Median time per token over a 131,072-token vocabulary shaped like a language model's,
    // before (a full sort per token) and after (partial selection).
    let mut r = Rand(42);
    let logits = lm_logits(&mut r, 131072, 3.0);
    let median = |f: &mut dyn FnMut() -> Option<u32>| {
        let mut t: Vec<f64> = (0..31)
            .map(|_| {
                let at = std::time::Instant::now();
                std::hint::black_box(f());
                at.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        t.sort_by(|a, b| a.partial_cmp(b).unwrap());
        t[t.len() / 2]
    };
    for top_p in [1.0, 0.9] {
        let p = SamplingParams { top_p, seed: Some(1), ..Default::default() };
        let mut rng = 1 ^ crate::util::GOLDEN;
        let before = median(&mut || reference(&p, &mut rng, &logits));
        // No penalties: sample leaves the logits as they are.
        let mut s = Sampler::new(p.clone(), &[], &[]);
        let mut buf = logits.clone();
        let after = median(&mut || s.sample(&mut buf));
        println!("sampling over 131072 logits, temperature 1, top_k 0, top_p {top_p}: {before:.3} ms per token with a full sort, {after:.3} ms with partial selection");
        if !cfg!(debug_assertions) {
            assert!(after < 20.0, "{after} ms");
        }
    }
}
