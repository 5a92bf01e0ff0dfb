// Attention for one KV head and the G query heads that share it (so each key and value row is
// read once for the group, not once per query head), QT consecutive tokens of the pass (so, in
// long prefill passes, once for QT tokens: the tile over queries), and one slice of `span` keys
// of each token's context (flash-decoding, for passes of a few tokens). The R = QT * G query
// rows of a workgroup walk the union of their tokens' key ranges in CHUNKs of cache rows, skipping
// rows none of them attends to (a tile may straddle two sequences): scores for the R rows into
// workgroup memory (a row's keys outside its token's range, e.g. past its position, get none),
// per row a running max and sum (online softmax), then the value rows weighted into per-thread
// accumulators (a thread owns one or more words of a value row: adjacent threads read adjacent
// words). With one slice (long passes, whose many tokens fill the device, and short contexts) it
// writes the normalised output; with more, each slice writes its unnormalised sum with its
// (max, sum) to PART and attn_combine.wgsl merges them. All math in f32. The cache buffers hold
// KV heads head0 .. head0 + kv_heads (all of them unless the cache spans several buffers, one
// dispatch each), laid out as kv_types.wgsl says: f32, f16, or q8_0 / q4_0 blocks whose codes
// are read a vec4 of words at a time and scaled before the dot (blocks rotated: the queries are
// rotated on load and the output back at the end).

struct SplitParams {
    heads: u32,
    kv_heads: u32, // KV heads in these buffers
    head_dim: u32,
    scale: f32,
    head0: u32, // the first of them
}
@group(0) @binding(0) var<storage, read> Q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> KC: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> VC: array<u32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(4) var<storage, read_write> PART: array<f32>; // per (token, head, slice): hd sums, max, sum
@group(0) @binding(5) var<storage, read> SEQ: array<vec2<u32>>; // per token: (position, first cache row)
@group(0) @binding(6) var<uniform> p: SplitParams;
@group(0) @binding(7) var<uniform> step: Step;

override G: u32 = 1u;       // query heads per KV head
override QT: u32 = 1u;      // tokens per workgroup (R = QT * G <= MAXR)
override CHUNK: u32 = 256u; // keys per round, a multiple of 64 * KB (R * (head_dim + CHUNK) <= 3072)
override KB: u32 = 1u;      // keys per thread in the score loop (1 or 2)
override GT: u32 = 64u;     // threads per row in the softmax reductions (a power of two, R * GT <= 64)
override WPT: u32 = 1u;     // value-row words per thread: ceil(words per row / 64)
override HD: u32 = 128u;    // head_dim (a multiple of 8, at most 256): loop bounds known to the compiler
const MAXR: u32 = 16u;
const NONE: f32 = -3.0e38;  // the score of a key the row does not attend to

// The R query rows, scaled ([R][hd / 4]), and their scores, then probabilities ([R][CHUNK]):
// sized by the pipeline (QV = R * hd / 4, SC = R * CHUNK; 4 * QV + SC <= 3072). The scores are
// scalars, read four at a time by `prob4`: neighbouring threads write neighbouring keys' scores,
// and a store to one component of a vec4 may write the whole vector (WGSL's memory model allows
// it, Metal may do it), which would race. Each query vec4 is written whole by one thread.
override QV: u32 = 256u;
override SC: u32 = 1024u;
var<workgroup> qpool: array<vec4<f32>, QV>;
var<workgroup> spool: array<f32, SC>;
var<workgroup> red: array<f32, 64>;
var<workgroup> ml: array<vec2<f32>, MAXR>; // per row: running (max, sum)
var<workgroup> corr: array<f32, MAXR>;

fn prob4(j: u32) -> vec4<f32> {
    return vec4<f32>(spool[j], spool[j + 1u], spool[j + 2u], spool[j + 3u]);
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let kvh = wid.x;
    // The first of this workgroup's query heads (of all the model's).
    let qh0 = (p.head0 + kvh) * G;
    let slice = wid.y;
    let t0 = wid.z * QT;
    let R = QT * G;
    let hd = HD;
    let hd4 = hd / 4u;
    let kv_dim = p.kv_heads * hd;
    // Values per thread's column (a word of f32 or f16, a pair of quantized values), and columns
    // per row of one head.
    let vpw = select(2u, 1u, KV_TYPE == 0u);
    let wcols = hd / vpw;
    let rw = kv_row_words(kv_dim);
    // One slice (long passes, short contexts) is the whole context.
    let span = select(step.span, 0xffffffffu, step.splits <= 1u);
    // Each token's cache rows in this slice, [ts, te) (empty past the pass's last token), and
    // the union's bounds.
    var ts: array<u32, MAXR>;
    var te: array<u32, MAXR>;
    var lo = 0xffffffffu;
    var hi = 0u;
    for (var u = 0u; u < QT; u++) {
        ts[u] = 0u;
        te[u] = 0u;
        if (t0 + u < step.t) {
            let qpos = SEQ[t0 + u].x;
            let first = SEQ[t0 + u].y;
            let a = slice * span;
            if (a <= qpos) {
                ts[u] = first + a;
                te[u] = first + a + min(span, qpos + 1u - a);
                lo = min(lo, ts[u]);
                hi = max(hi, te[u]);
            }
        }
    }
    for (var i = lid; i < R * hd4; i += 64u) {
        let r = i / hd4;
        let u = r / G;
        var q = vec4<f32>(0.0);
        if (t0 + u < step.t) {
            q = Q[((t0 + u) * p.heads + qh0 + r % G) * hd4 + i % hd4] * p.scale;
        }
        qpool[i] = q;
    }
    if (lid < R) {
        ml[lid] = vec2<f32>(NONE, 0.0);
    }
    if (kv_quantized()) {
        // The cache holds keys rotated block by block (kv_types.wgsl): rotate the queries' blocks
        // the same way, a block (8 vec4s of one row) per thread.
        workgroupBarrier();
        for (var bi = lid; bi < R * hd / 32u; bi += 64u) {
            var x: array<f32, 32>;
            for (var m = 0u; m < 8u; m++) {
                let v = qpool[bi * 8u + m];
                x[4u * m] = v.x;
                x[4u * m + 1u] = v.y;
                x[4u * m + 2u] = v.z;
                x[4u * m + 3u] = v.w;
            }
            let y = kv_hadamard(x);
            for (var m = 0u; m < 8u; m++) {
                qpool[bi * 8u + m] = vec4<f32>(y[4u * m], y[4u * m + 1u], y[4u * m + 2u], y[4u * m + 3u]);
            }
        }
    }
    let g = lid / GT;
    let rr = lid % GT;
    var acc: array<vec2<f32>, 64>; // [WPT][MAXR]
    for (var c = 0u; c < WPT; c++) {
        for (var h = 0u; h < R; h++) {
            acc[c * MAXR + h] = vec2<f32>(0.0);
        }
    }
    workgroupBarrier();
    var c0 = lo;
    while (c0 < hi) {
        let n = min(CHUNK, hi - c0);
        // Whole vec4s of keys: those past `n` score NONE (a probability of 0).
        let n4 = (n + 3u) & ~3u;
        // Scores: KB key rows per thread (64 apart), all R query rows at once: each query
        // vec4 read from workgroup memory serves KB keys.
        for (var i0 = lid; i0 < n4; i0 += 64u * KB) {
            var s: array<f32, 2 * MAXR>; // [KB][R]
            // The first word of each key row, and (f16, f32) its head's first vec4.
            var rowb: array<u32, 2>;
            var base: array<u32, 2>;
            for (var b = 0u; b < KB; b++) {
                let row = c0 + min(i0 + 64u * b, n - 1u);
                rowb[b] = row * rw;
                base[b] = (row * kv_dim + kvh * hd) / select(4u, 8u, KV_TYPE == 1u);
                for (var h = 0u; h < R; h++) {
                    s[b * MAXR + h] = 0.0;
                }
            }
            if (kv_quantized()) {
                let bw = kv_block_words();
                let cw = kv_code_words(kv_dim);
                let blk0 = kvh * hd / 32u;
                for (var blk = 0u; blk < hd / 32u; blk++) {
                    var d: array<f32, 2>;
                    for (var b = 0u; b < KB; b++) {
                        let sw = rowb[b] + cw + (blk0 + blk) / 2u;
                        d[b] = kv_scale(KC[sw / 4u][sw % 4u], blk0 + blk);
                    }
                    for (var m = 0u; m < bw / 4u; m++) {
                        var kw: array<vec4<u32>, 2>;
                        for (var b = 0u; b < KB; b++) {
                            kw[b] = KC[(rowb[b] + (blk0 + blk) * bw) / 4u + m];
                        }
                        for (var c = 0u; c < 4u; c++) {
                            // q8_0: one vec4 of values a word; q4_0: two.
                            var ka: array<vec4<f32>, 2>;
                            var kb: array<vec4<f32>, 2>;
                            for (var b = 0u; b < KB; b++) {
                                if (KV_TYPE == 2u) {
                                    ka[b] = kv_q8(kw[b][c]) * d[b];
                                } else {
                                    ka[b] = kv_q4(kw[b][c], 0u) * d[b];
                                    kb[b] = kv_q4(kw[b][c], 1u) * d[b];
                                }
                            }
                            for (var h = 0u; h < R; h++) {
                                if (KV_TYPE == 2u) {
                                    let q = qpool[h * hd4 + blk * 8u + m * 4u + c];
                                    for (var b = 0u; b < KB; b++) {
                                        s[b * MAXR + h] += dot(ka[b], q);
                                    }
                                } else {
                                    let qa = qpool[h * hd4 + blk * 8u + 2u * c];
                                    let qb = qpool[h * hd4 + blk * 8u + 2u * c + 1u];
                                    for (var b = 0u; b < KB; b++) {
                                        s[b * MAXR + h] += dot(ka[b], qa) + dot(kb[b], qb);
                                    }
                                }
                            }
                        }
                    }
                }
            } else if (KV_TYPE == 1u) {
                for (var w = 0u; w < hd / 8u; w++) {
                    var ka: array<vec4<f32>, 2>;
                    var kb: array<vec4<f32>, 2>;
                    for (var b = 0u; b < KB; b++) {
                        let kw = KC[base[b] + w];
                        ka[b] = vec4<f32>(unpack2x16float(kw.x), unpack2x16float(kw.y));
                        kb[b] = vec4<f32>(unpack2x16float(kw.z), unpack2x16float(kw.w));
                    }
                    for (var h = 0u; h < R; h++) {
                        let qa = qpool[h * hd4 + 2u * w];
                        let qb = qpool[h * hd4 + 2u * w + 1u];
                        for (var b = 0u; b < KB; b++) {
                            s[b * MAXR + h] += dot(ka[b], qa) + dot(kb[b], qb);
                        }
                    }
                }
            } else {
                for (var w = 0u; w < hd4; w++) {
                    var k: array<vec4<f32>, 2>;
                    for (var b = 0u; b < KB; b++) {
                        k[b] = bitcast<vec4<f32>>(KC[base[b] + w]);
                    }
                    for (var h = 0u; h < R; h++) {
                        let q = qpool[h * hd4 + w];
                        for (var b = 0u; b < KB; b++) {
                            s[b * MAXR + h] += dot(k[b], q);
                        }
                    }
                }
            }
            for (var b = 0u; b < KB; b++) {
                let i = i0 + 64u * b;
                let row = c0 + i;
                if (i < n4) {
                    for (var h = 0u; h < R; h++) {
                        let u = h / G;
                        spool[h * CHUNK + i] = select(NONE, s[b * MAXR + h], i < n && row >= ts[u] && row < te[u]);
                    }
                }
            }
        }
        workgroupBarrier();
        // Per row (GT threads each): the round's max, then probabilities and their sum.
        var mx = NONE;
        if (g < R) {
            for (var i = rr; i < n4; i += GT) {
                mx = max(mx, spool[g * CHUNK + i]);
            }
        }
        red[lid] = mx;
        workgroupBarrier();
        for (var k = GT / 2u; k > 0u; k >>= 1u) {
            if (rr < k) {
                red[lid] = max(red[lid], red[lid + k]);
            }
            workgroupBarrier();
        }
        var m_new = 0.0;
        if (g < R) {
            m_new = max(ml[g].x, red[g * GT]);
        }
        workgroupBarrier();
        var sum = 0.0;
        if (g < R) {
            for (var i = rr; i < n4; i += GT) {
                let v = spool[g * CHUNK + i];
                let e = select(0.0, exp(v - m_new), v > NONE);
                spool[g * CHUNK + i] = e;
                sum += e;
            }
        }
        red[lid] = sum;
        workgroupBarrier();
        for (var k = GT / 2u; k > 0u; k >>= 1u) {
            if (rr < k) {
                red[lid] += red[lid + k];
            }
            workgroupBarrier();
        }
        if (g < R && rr == 0u) {
            let old = ml[g];
            let cf = exp(old.x - m_new);
            corr[g] = cf;
            ml[g] = vec2<f32>(m_new, old.y * cf + red[lid]);
        }
        workgroupBarrier();
        // Values: this thread's words of each row, weighted for every query row.
        for (var c = 0u; c < WPT; c++) {
            let wc = lid + 64u * c;
            if (wc < wcols) {
                for (var h = 0u; h < R; h++) {
                    acc[c * MAXR + h] *= corr[h];
                }
                let vstride = kv_dim / vpw;
                let vbase = c0 * vstride + kvh * wcols + wc;
                // Quantized: this column's values in the row, its code word and scale word.
                let vi = kvh * hd + 2u * wc;
                let vcode = vi / select(8u, 4u, KV_TYPE == 2u);
                let vscale = kv_code_words(kv_dim) + vi / 64u;
                // Four keys at a time: one workgroup-memory load of their four probabilities
                // per query row (the rows of the last round past `n` hold zeros).
                for (var i = 0u; i < n4; i += 4u) {
                    var v: array<vec2<f32>, 4>;
                    for (var k = 0u; k < 4u; k++) {
                        let key = min(i + k, n - 1u);
                        if (kv_quantized()) {
                            let r0 = (c0 + key) * rw;
                            v[k] = kv_code_pair(VC[r0 + vcode], vi, kv_scale(VC[r0 + vscale], vi / 32u));
                        } else {
                            let vw = VC[vbase + key * vstride];
                            v[k] = vec2<f32>(bitcast<f32>(vw), 0.0);
                            if (KV_TYPE == 1u) {
                                v[k] = unpack2x16float(vw);
                            }
                        }
                    }
                    for (var h = 0u; h < R; h++) {
                        let pr = prob4(h * CHUNK + i);
                        var a = acc[c * MAXR + h];
                        a = fma(vec2<f32>(pr.x), v[0], a);
                        a = fma(vec2<f32>(pr.y), v[1], a);
                        a = fma(vec2<f32>(pr.z), v[2], a);
                        a = fma(vec2<f32>(pr.w), v[3], a);
                        acc[c * MAXR + h] = a;
                    }
                }
            }
        }
        workgroupBarrier();
        // The next chunk starts at the first row past this one that some token attends to.
        var next = 0xffffffffu;
        for (var u = 0u; u < QT; u++) {
            if (te[u] > c0 + n) {
                next = min(next, max(c0 + n, ts[u]));
            }
        }
        c0 = next;
    }
    if (kv_quantized()) {
        // The weighted value rows are rotated (kv_types.wgsl): gather each row's sums in qpool
        // (free now; even columns, then odd ones, so a vec4 has one writer at a time) and rotate
        // them back, each thread its own pair of values.
        for (var par = 0u; par < 2u; par++) {
            for (var c = 0u; c < WPT; c++) {
                let wc = lid + 64u * c;
                if (wc < wcols && (wc & 1u) == par) {
                    for (var h = 0u; h < R; h++) {
                        let a = acc[c * MAXR + h];
                        var v = qpool[h * hd4 + wc / 2u];
                        v[2u * par] = a.x;
                        v[2u * par + 1u] = a.y;
                        qpool[h * hd4 + wc / 2u] = v;
                    }
                }
            }
            workgroupBarrier();
        }
        for (var c = 0u; c < WPT; c++) {
            let wc = lid + 64u * c;
            if (wc < wcols) {
                let j = (2u * wc) % 32u;
                let b0 = (2u * wc / 32u) * 8u;
                for (var h = 0u; h < R; h++) {
                    var y = vec2<f32>(0.0);
                    for (var m = 0u; m < 8u; m++) {
                        let v = qpool[h * hd4 + b0 + m];
                        y += vec2<f32>(dot(v, kv_hsign4(j, m)), dot(v, kv_hsign4(j + 1u, m)));
                    }
                    acc[c * MAXR + h] = y * KV_H;
                }
            }
        }
    }
    let rec_len = hd + 2u;
    for (var c = 0u; c < WPT; c++) {
        let wc = lid + 64u * c;
        if (wc < wcols) {
            for (var h = 0u; h < R; h++) {
                let t = t0 + h / G;
                if (t < step.t) {
                    let head = qh0 + h % G;
                    let a = acc[c * MAXR + h];
                    if (step.splits <= 1u) {
                        let o = (t * p.heads + head) * hd + wc * vpw;
                        let l = ml[h].y;
                        OUT[o] = a.x / l;
                        if (vpw == 2u) {
                            OUT[o + 1u] = a.y / l;
                        }
                    } else {
                        let o = ((t * p.heads + head) * step.splits + slice) * rec_len + wc * vpw;
                        PART[o] = a.x;
                        if (vpw == 2u) {
                            PART[o + 1u] = a.y;
                        }
                    }
                }
            }
        }
    }
    if (step.splits > 1u && lid < R && t0 + lid / G < step.t) {
        let t = t0 + lid / G;
        let o = ((t * p.heads + qh0 + lid % G) * step.splits + slice) * rec_len + hd;
        PART[o] = ml[lid].x;
        PART[o + 1u] = ml[lid].y;
    }
}
