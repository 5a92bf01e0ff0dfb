//! Sampling without sorting the vocabulary: the candidates in logit buckets (see below).

use super::*;

// The candidates go into buckets of x, 1/256 wide (16384 of them span x in [-64, 0], the last
// also holds everything below), which follow the sorted order: one pass over the logits. The
// bounds start coarse: a bucket's sum lies within its count times exp at its edges (0.4%
// apart), or, with top-p, within 7.6e-6 from the sum of the candidates' offsets in the bucket
// (counted in the same pass); the first few hundred candidates, and the buckets where a
// decision falls, are sorted and their exp computed. When a decision is too close to call for
// that (a draw, or a top-p cut, among the many small probabilities past the first few hundred),
// every candidate's exp is summed into its bucket (`refine`: exp of the bucket's edge times a
// short polynomial in the offset from it) and the decisions are made again. A bucket is sorted
// whole: logits within temperature / 256 of each other by the thousand (all equal, say) cost
// what the full sort did.

/// Relative error bound of [`exp_approx`] (1.5e-14, see there) and of libm's exp (< 1e-15),
/// with room to spare.
pub(super) const EXP_EPS: f64 = 1e-13;
pub(super) const BUCKETS_PER_UNIT: f64 = 256.0;
pub(super) const BUCKETS: usize = 16384;
pub(super) const LAST: usize = BUCKETS - 1;
/// A non-candidate's bucket.
pub(super) const NO_BUCKET: u16 = BUCKETS as u16;
/// Candidates sorted at once when a bucket is needed (the next buckets come along).
pub(super) const TAKE_AT_LEAST: usize = 256;

/// exp(x) for x <= 0 within relative error 1.5e-14; 0 below -64 (where exp < 1.7e-28).
///
/// x = k ln 2 + r with k = round(x / ln 2) (Cody-Waite: x - k LN2_HI is exact, r's error is
/// under 1e-16), |r| <= 0.3466, exp(r) by its Taylor polynomial of degree 11 (remainder under
/// e^|r| |r|^12 / 12! < 9e-15 relative, Horner's rounding under 6e-15), times 2^k exactly.
pub(super) fn exp_approx(x: f64) -> f64 {
    const MAGIC: f64 = 6755399441055744.0; // 1.5 * 2^52: adding it rounds to an integer
    // ln 2 = LN2_HI + LN2_LO to 2^-86, LN2_HI with 21 trailing zero bits (fdlibm's).
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    const C: [f64; 12] = [
        1.0,
        1.0,
        1.0 / 2.0,
        1.0 / 6.0,
        1.0 / 24.0,
        1.0 / 120.0,
        1.0 / 720.0,
        1.0 / 5040.0,
        1.0 / 40320.0,
        1.0 / 362880.0,
        1.0 / 3628800.0,
        1.0 / 39916800.0,
    ];
    if x.is_nan() || x < -64.0 {
        return 0.0;
    }
    let t = x * std::f64::consts::LOG2_E + MAGIC;
    let k = t - MAGIC;
    let r = (x - k * LN2_HI) - k * LN2_LO;
    let q = C.iter().rev().fold(0.0, |q, c| q * r + c);
    // t's low mantissa bits hold k (two's complement): 2^k from the exponent field.
    q * f64::from_bits(((t.to_bits() as i64 - MAGIC.to_bits() as i64 + 1023) << 52) as u64)
}

/// exp(-b / 256) for b in 0..=BUCKETS (approximate): a candidate in bucket b < LAST has x in
/// (-(b + 1) / 256, -b / 256], so its exp(x) lies between the next entry and this one; one in the
/// last bucket has x <= -LAST / 256.
pub(super) fn bucket_edges() -> &'static [f64] {
    static EDGES: std::sync::OnceLock<Vec<f64>> = std::sync::OnceLock::new();
    EDGES.get_or_init(|| (0..=BUCKETS).map(|b| exp_approx(-(b as f64) / BUCKETS_PER_UNIT)).collect())
}

/// x's bucket: floor(-256 x) (exact in f32), the last one for x <= -LAST / 256.
#[inline(always)]
pub(super) fn bucket_of(x: f32) -> u16 {
    let v = (-x * BUCKETS_PER_UNIT as f32).max(0.0).min(LAST as f32);
    // SAFETY: v is in [0, LAST] (max and min drop a NaN).
    unsafe { v.to_int_unchecked::<u16>() }
}

/// Adds exp(x) / exp(-b / 256) of each candidate (at most 64) to its bucket b's sum. A
/// candidate in bucket b < LAST has x = -b / 256 - z with z in [0, 1 / 256) (exact in f64), so
/// that is exp(-z), by its Taylor polynomial of degree 4 (remainder under z^5 / 5! < 8e-15).
/// The last bucket's sum is left unused.
#[inline(always)]
pub(super) fn add_exp(bs: &[u16], ls: &[f32], max: f32, temperature: f32, sum: &mut [f64]) {
    let mut g = [0f64; 64];
    // Vectorisable: the polynomials; then the sums.
    for ((g, &b), &l) in g.iter_mut().zip(bs).zip(ls) {
        let x = ((l - max) / temperature) as f64;
        let z = -x - b as f64 * (1.0 / BUCKETS_PER_UNIT);
        *g = 1.0 - z * (1.0 - z * (0.5 - z * (1.0 / 6.0 - z * (1.0 / 24.0))));
    }
    for (&g, &b) in g.iter().zip(bs) {
        sum[b as usize] += g;
    }
}

/// [`add_exp`]'s sums times each bucket's exp(-b / 256).
pub(super) fn scale_sums(mut sum: Vec<f64>) -> Vec<f64> {
    for (s, e) in sum.iter_mut().zip(bucket_edges()) {
        *s *= e;
    }
    sum
}

/// A candidate with its exp(x) (approximate).
pub(super) struct Elem {
    pub(super) id: u32,
    pub(super) l: f32,
    pub(super) e: f64,
}

pub(super) enum Flow<R> {
    Next,
    Done(R),
    Unsure,
}

/// Bounds (low, high) of a sum.
pub(super) type Sum = (f64, f64);

/// The candidates by bucket; a bucket is sorted when first needed. See the comment above
/// EXP_EPS.
pub(super) struct Buckets<'a> {
    /// The logits; the candidates are the finite ones.
    pub(super) logits: &'a [f32],
    /// Their token ids (None: the index).
    pub(super) ids: Option<&'a [u32]>,
    pub(super) max: f32,
    pub(super) temperature: f32,
    /// The number of candidates.
    pub(super) n: usize,
    pub(super) bucket: Vec<u16>,
    pub(super) count: Vec<u32>,
    /// Per bucket b, the sum of its candidates' -256 x - b (empty unless `tight`).
    pub(super) offsets: Vec<f64>,
    /// 256 (1 - exp(-1 / 256)): exp(-z) <= 1 - chord z for z in [0, 1 / 256] (convexity).
    pub(super) chord: f64,
    /// Past the last non-empty bucket.
    pub(super) end: usize,
    /// Where a sorted bucket's candidates are in `sorted` (u32::MAX: not sorted).
    pub(super) start: Vec<u32>,
    pub(super) sorted: Vec<Elem>,
    /// Each bucket's sum of exp(x), once [`Buckets::refine`] ran.
    pub(super) mass: Option<Vec<f64>>,
}

impl<'a> Buckets<'a> {
    /// Passes over the logits: the largest finite one, each one's bucket, the buckets' counts
    /// and, with `tight`, their sums of offsets (for bounds 500 times closer, worth their cost
    /// where there is a top-p cut to place). Then the first few hundred candidates, sorted.
    /// None: a temperature this path does not take (NaN or infinite).
    pub(super) fn new(logits: &'a [f32], ids: Option<&'a [u32]>, temperature: f32, tight: bool) -> Option<Self> {
        if !(temperature > 0.0 && temperature.is_finite()) {
            return None;
        }
        let max = logits.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(if l.is_finite() { l } else { f32::NEG_INFINITY }));
        let mut bucket = vec![0u16; logits.len()];
        let mut count = vec![0u32; BUCKETS + 1];
        let mut offsets = vec![0f64; if tight { BUCKETS + 1 } else { 0 }];
        let mut frac = [0f32; 64];
        for (bs, ls) in bucket.chunks_mut(64).zip(logits.chunks(64)) {
            // Vectorisable: the buckets and -256 x - b (exact; in [0, 1) below the last bucket).
            for ((b, f), &l) in bs.iter_mut().zip(frac.iter_mut()).zip(ls) {
                let x = (l - max) / temperature;
                let k = bucket_of(x);
                *f = -x * BUCKETS_PER_UNIT as f32 - k as f32;
                *b = if l.is_finite() { k } else { NO_BUCKET };
            }
            if tight {
                for (&b, &f) in bs.iter().zip(&frac) {
                    count[b as usize] += 1;
                    offsets[b as usize] += f as f64;
                }
            } else {
                for &b in bs.iter() {
                    count[b as usize] += 1;
                }
            }
        }
        let n = logits.len() - count[BUCKETS] as usize;
        let end = count[..BUCKETS].iter().rposition(|&c| c > 0).map_or(0, |b| b + 1);
        let chord = (1.0 - exp_approx(-1.0 / BUCKETS_PER_UNIT)) * BUCKETS_PER_UNIT;
        let start = vec![u32::MAX; BUCKETS];
        let mut b = Buckets { logits, ids, max, temperature, n, bucket, count, offsets, chord, end, start, sorted: Vec::new(), mass: None };
        if let Some(first) = b.count[..BUCKETS].iter().position(|&c| c > 0) {
            b.take(first);
        }
        Some(b)
    }

    /// Bucket `b`'s candidates in sorted order (sorting it, and the next unsorted ones up to
    /// TAKE_AT_LEAST candidates, on first use).
    pub(super) fn take(&mut self, b: usize) -> &[Elem] {
        if self.start[b] == u32::MAX {
            let mut end = b + 1;
            let mut n = self.count[b] as usize;
            while end < BUCKETS && self.start[end] == u32::MAX && n < TAKE_AT_LEAST {
                n += self.count[end] as usize;
                end += 1;
            }
            let from = self.sorted.len();
            let (lo, span) = (b as u16, (end - b) as u16);
            for (c, chunk) in self.bucket.chunks(32).enumerate() {
                // Mostly none of them: a branch-free test first.
                if !chunk.iter().fold(false, |any, &k| any | (k.wrapping_sub(lo) < span)) {
                    continue;
                }
                for (j, &k) in chunk.iter().enumerate() {
                    if k.wrapping_sub(lo) < span {
                        let i = c * 32 + j;
                        let l = self.logits[i];
                        let id = self.ids.map_or(i as u32, |ids| ids[i]);
                        self.sorted.push(Elem { id, l, e: exp_approx(((l - self.max) / self.temperature) as f64) });
                    }
                }
            }
            // The buckets follow the sorted order: sorting them together sorts each.
            self.sorted[from..].sort_unstable_by(|a, b| by_logit(&(a.id, a.l), &(b.id, b.l)));
            let mut at = from;
            for k in b..end {
                self.start[k] = at as u32;
                at += self.count[k] as usize;
            }
        }
        let s = self.start[b] as usize;
        &self.sorted[s..s + self.count[b] as usize]
    }

    /// Bounds of bucket `b`'s sum of exp(x), when it is not sorted. Its c candidates have
    /// x = -b / 256 - z_i with z_i in [0, 1 / 256): exp(x) = exp(-b / 256) exp(-z_i), so the sum
    /// is between c exp(-(b + 1) / 256) and c exp(-b / 256) (0.4% apart), and with s = sum z_i,
    /// between c - s and c - chord s times exp(-b / 256) (exp is convex: above its tangent at 0,
    /// below its chord over [0, 1 / 256]; 7.6e-6 apart at most).
    pub(super) fn bucket_sum(&self, b: usize) -> Sum {
        let c = self.count[b] as f64;
        let edges = bucket_edges();
        match &self.mass {
            Some(m) if b < LAST => (m[b], m[b]),
            _ if b == LAST => (0.0, c * edges[LAST]),
            _ if self.offsets.is_empty() => (c * edges[b + 1], c * edges[b]),
            _ => {
                let s = self.offsets[b] * (1.0 / BUCKETS_PER_UNIT);
                (edges[b] * (c - s), edges[b] * (c - self.chord * s))
            }
        }
    }

    /// Bounds of the sum of exp(x) over all candidates.
    pub(super) fn total(&self) -> Sum {
        let mut s = (0.0, 0.0);
        for b in 0..self.end {
            if self.count[b] == 0 {
                continue;
            }
            let (lo, hi) = if self.start[b] != u32::MAX {
                let s = self.start[b] as usize;
                let e: f64 = self.sorted[s..s + self.count[b] as usize].iter().map(|e| e.e).sum();
                (e, e)
            } else {
                self.bucket_sum(b)
            };
            s = (s.0 + lo, s.1 + hi);
        }
        s
    }

    /// Every candidate's exp(x), summed per bucket: exact bounds for all of them (but the last,
    /// whose sum is negligible).
    pub(super) fn refine(&mut self) {
        let mut sum = vec![0f64; BUCKETS + 1];
        for (bs, ls) in self.bucket.chunks(64).zip(self.logits.chunks(64)) {
            add_exp(bs, ls, self.max, self.temperature, &mut sum);
        }
        self.mass = Some(scale_sums(sum));
    }

    /// Goes through the first `limit` candidates in sorted order: an unsorted bucket that
    /// `skip(bucket, sum through it)` vouches for as all `Next` is passed over, else each
    /// candidate is `visit(rank, candidate, sum before it, sum through it)`. `Ok(None)`: reached
    /// `limit`; `Err(())`: a visit was unsure.
    pub(super) fn scan<R>(
        &mut self,
        limit: usize,
        skip: impl Fn(usize, Sum) -> bool,
        mut visit: impl FnMut(usize, &Elem, Sum, Sum) -> Flow<R>,
    ) -> Result<Option<R>, ()> {
        let mut rank = 0usize;
        let mut before: Sum = (0.0, 0.0);
        for b in 0..self.end {
            let c = self.count[b] as usize;
            if c == 0 {
                continue;
            }
            if rank >= limit {
                break;
            }
            if self.start[b] == u32::MAX && rank + c <= limit {
                let (lo, hi) = self.bucket_sum(b);
                let through = (before.0 + lo, before.1 + hi);
                if skip(b, through) {
                    rank += c;
                    before = through;
                    continue;
                }
            }
            let mut acc = 0.0;
            for el in self.take(b) {
                if rank >= limit {
                    return Ok(None);
                }
                let prev = (before.0 + acc, before.1 + acc);
                acc += el.e;
                match visit(rank, el, prev, (before.0 + acc, before.1 + acc)) {
                    Flow::Next => {}
                    Flow::Done(r) => return Ok(Some(r)),
                    Flow::Unsure => return Err(()),
                }
                rank += 1;
            }
            before = (before.0 + acc, before.1 + acc);
        }
        Ok(None)
    }

    /// [`pick_sorted`]'s token for the draw `u`, or None when too close to call.
    pub(super) fn pick(&mut self, p: &SamplingParams, u: f64) -> Option<u32> {
        if self.n == 0 {
            return None;
        }
        if let Ok(t) = self.decide(p, u) {
            return Some(t);
        }
        self.refine();
        self.decide(p, u).ok()
    }

    pub(super) fn decide(&mut self, p: &SamplingParams, u: f64) -> Result<u32, ()> {
        let n = self.n;
        // With u = 2^-53, gamma_m = m u (1 + o(1)) bounds the relative error of a sum of m
        // non-negative terms in any order: pick_sorted's normaliser, cumulative sums and total
        // (m <= n), its walk's subtractions (k u of the draw after k of them), the sums here (a
        // bucket's, a prefix over buckets, a prefix inside one: m <= 2n + BUCKETS). A comparison
        // here and pick_sorted's then agree once its two sides are apart by a relative
        // 2 EXP_EPS + (6n + 2 BUCKETS + 8) u + n 1.7e-28 (the last for exp_approx's zeros below
        // -64); `delta`, required on each side, is more than that.
        let delta = 4.0 * (EXP_EPS + (4 * n + BUCKETS + 64) as f64 * (f64::EPSILON / 2.0)) + n as f64 * 1e-27 + 1e-300;
        // "Certainly a < b" and so on, for a, b >= 0 known within relative delta.
        let lt = |a: f64, b: f64| a * (1.0 + delta) < b * (1.0 - delta);
        let le = |a: f64, b: f64| a * (1.0 + delta) <= b * (1.0 - delta);
        let ge = |a: f64, b: f64| a * (1.0 - delta) >= b * (1.0 + delta);
        let all = self.total();
        // The kept candidates and bounds of their sum.
        let (mut keep, mut kept) = (n, all);
        if p.top_p < 1.0 {
            // Through the first candidate whose cumulative probability reaches top_p.
            let tp = p.top_p as f64;
            let (goal_lo, goal_hi) = (tp * all.0, tp * all.1);
            let found = self.scan(
                n,
                |_, through| lt(through.1, goal_lo),
                |k, _, before, through| {
                    if ge(through.0, goal_hi) && (k == 0 || lt(before.1, goal_lo)) {
                        Flow::Done((k + 1, through))
                    } else if lt(through.1, goal_lo) {
                        Flow::Next
                    } else {
                        Flow::Unsure
                    }
                },
            )?;
            if let Some(cut) = found {
                (keep, kept) = cut;
            }
        }
        if p.min_p > 0.0 {
            // The leading candidates with probability >= min_p times the top one's, at least one.
            // The top one has x = 0, exp(0) = 1 exactly here and there.
            let m = p.min_p as f64;
            let (max, t) = (self.max, self.temperature);
            let found = self.scan(
                n,
                |b, _| b < LAST && ge(bucket_edges()[b + 1], m),
                |k, el, before, through| {
                    if k == 0 || (el.l - max) / t == 0.0 {
                        // Exactly the top probability p0: fl(p0 min_p) <= p0 iff min_p <= 1.
                        if m <= 1.0 {
                            Flow::Next
                        } else {
                            Flow::Done(if k == 0 { (1, through) } else { (k, before) })
                        }
                    } else if ge(el.e, m) {
                        Flow::Next
                    } else if lt(el.e + 1.7e-28, m) {
                        Flow::Done((k, before))
                    } else {
                        Flow::Unsure
                    }
                },
            )?;
            if let Some((k, s)) = found {
                if k < keep {
                    (keep, kept) = (k, s);
                }
            }
        }
        // The walk: the first candidate whose cumulative sum passes u times the kept sum.
        let (goal_lo, goal_hi) = (u * kept.0, u * kept.1);
        let found = self.scan(
            keep,
            |_, through| le(through.1, goal_lo),
            |_, el, before, through| {
                if le(through.1, goal_lo) {
                    Flow::Next
                } else if lt(goal_hi, through.0) && le(before.1, goal_lo) {
                    Flow::Done(el.id)
                } else {
                    Flow::Unsure
                }
            },
        )?;
        found.ok_or(())
    }
}
