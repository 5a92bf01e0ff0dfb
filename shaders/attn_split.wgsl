// Attention, split across workgroups (flash-decoding) for passes of a few tokens. One
// workgroup takes one KV head, all G query heads that share it (so each key and value row is
// read once for the group, not once per query head), one token, and one slice of `span` keys of
// its context; it walks the slice in CHUNKs of keys: scores for the G heads into workgroup
// memory, per head a running max and sum (online softmax), then the value rows weighted into
// per-thread accumulators (a thread owns one or more words of a value row: adjacent threads
// read adjacent words). With one slice (long passes, whose many tokens fill the device, and
// short contexts) it writes the normalised output; with more, each slice writes its unnormalised sum with its (max, sum) to PART and
// attn_combine.wgsl merges them. All math in f32.

struct SplitParams {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    scale: f32,
    span: u32, // keys per slice, a multiple of CHUNK
}
@group(0) @binding(0) var<storage, read> Q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> KC: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> VC: array<u32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(4) var<storage, read_write> PART: array<f32>; // per (token, head, slice): hd sums, max, sum
@group(0) @binding(5) var<storage, read> SEQ: array<vec2<u32>>; // per token: (position, first cache row)
@group(0) @binding(6) var<uniform> p: SplitParams;
@group(0) @binding(7) var<uniform> step: Step;

override KV_F16: bool = true;
override G: u32 = 1u;       // query heads per KV head (<= MAXG; G * head_dim <= 1024)
override CHUNK: u32 = 256u; // keys per round (G * CHUNK <= 2048)
override GT: u32 = 64u;     // threads per head in the softmax reductions (a power of two, G * GT <= 64)
override WPT: u32 = 1u;     // value-row words per thread: ceil(words per row / 64)
const MAXG: u32 = 16u;

var<workgroup> qs: array<vec4<f32>, 256>; // [G][hd / 4], scaled
var<workgroup> sc: array<f32, 2048>;      // [G][CHUNK]: scores, then probabilities
var<workgroup> red: array<f32, 64>;
var<workgroup> ml: array<vec2<f32>, MAXG>; // per head: running (max, sum)
var<workgroup> corr: array<f32, MAXG>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let kvh = wid.x;
    let slice = wid.y;
    let t = wid.z;
    let hd = p.head_dim;
    let hd4 = hd / 4u;
    let kv_dim = p.kv_heads * hd;
    // Values per cache word, and words per row of one head.
    let vpw = select(1u, 2u, KV_F16);
    let wcols = hd / vpw;
    let qpos = SEQ[t].x;
    let first = SEQ[t].y;
    // One slice (long passes, short contexts) is the whole context.
    let span = select(p.span, 0xffffffffu, step.splits <= 1u);
    let lo = slice * span;
    let hi = select(lo, min(lo + span, qpos + 1u), lo <= qpos);
    let q0 = (t * p.heads + kvh * G) * hd4;
    for (var i = lid; i < G * hd4; i += 64u) {
        qs[i] = Q[q0 + i] * p.scale;
    }
    if (lid < G) {
        ml[lid] = vec2<f32>(-3.0e38, 0.0);
    }
    let g = lid / GT;
    let r = lid % GT;
    var acc: array<vec2<f32>, 64>; // [WPT][MAXG]
    for (var c = 0u; c < WPT; c++) {
        for (var h = 0u; h < G; h++) {
            acc[c * MAXG + h] = vec2<f32>(0.0);
        }
    }
    workgroupBarrier();
    for (var c0 = lo; c0 < hi; c0 += CHUNK) {
        let n = min(CHUNK, hi - c0);
        // Scores: one key row per thread, all G heads at once.
        for (var i = lid; i < n; i += 64u) {
            let row = first + c0 + i;
            var s: array<f32, MAXG>;
            for (var h = 0u; h < G; h++) {
                s[h] = 0.0;
            }
            if (KV_F16) {
                let base = (row * kv_dim + kvh * hd) / 8u;
                for (var w = 0u; w < hd / 8u; w++) {
                    let kw = KC[base + w];
                    let ka = vec4<f32>(unpack2x16float(kw.x), unpack2x16float(kw.y));
                    let kb = vec4<f32>(unpack2x16float(kw.z), unpack2x16float(kw.w));
                    for (var h = 0u; h < G; h++) {
                        s[h] += dot(ka, qs[h * hd4 + 2u * w]) + dot(kb, qs[h * hd4 + 2u * w + 1u]);
                    }
                }
            } else {
                let base = (row * kv_dim + kvh * hd) / 4u;
                for (var w = 0u; w < hd4; w++) {
                    let k = bitcast<vec4<f32>>(KC[base + w]);
                    for (var h = 0u; h < G; h++) {
                        s[h] += dot(k, qs[h * hd4 + w]);
                    }
                }
            }
            for (var h = 0u; h < G; h++) {
                sc[h * CHUNK + i] = s[h];
            }
        }
        workgroupBarrier();
        // Per head (GT threads each): the round's max, then probabilities and their sum.
        var mx = -3.0e38;
        if (g < G) {
            for (var i = r; i < n; i += GT) {
                mx = max(mx, sc[g * CHUNK + i]);
            }
        }
        red[lid] = mx;
        workgroupBarrier();
        for (var k = GT / 2u; k > 0u; k >>= 1u) {
            if (r < k) {
                red[lid] = max(red[lid], red[lid + k]);
            }
            workgroupBarrier();
        }
        var m_new = 0.0;
        if (g < G) {
            m_new = max(ml[g].x, red[g * GT]);
        }
        workgroupBarrier();
        var sum = 0.0;
        if (g < G) {
            for (var i = r; i < n; i += GT) {
                let e = exp(sc[g * CHUNK + i] - m_new);
                sc[g * CHUNK + i] = e;
                sum += e;
            }
        }
        red[lid] = sum;
        workgroupBarrier();
        for (var k = GT / 2u; k > 0u; k >>= 1u) {
            if (r < k) {
                red[lid] += red[lid + k];
            }
            workgroupBarrier();
        }
        if (g < G && r == 0u) {
            let old = ml[g];
            let cf = exp(old.x - m_new);
            corr[g] = cf;
            ml[g] = vec2<f32>(m_new, old.y * cf + red[lid]);
        }
        workgroupBarrier();
        // Values: this thread's words of each row, weighted for every head.
        for (var c = 0u; c < WPT; c++) {
            let wc = lid + 64u * c;
            if (wc < wcols) {
                for (var h = 0u; h < G; h++) {
                    acc[c * MAXG + h] *= corr[h];
                }
                let vbase = (first + c0) * (kv_dim / vpw) + kvh * wcols + wc;
                for (var i = 0u; i < n; i++) {
                    let vw = VC[vbase + i * (kv_dim / vpw)];
                    var v = vec2<f32>(bitcast<f32>(vw), 0.0);
                    if (KV_F16) {
                        v = unpack2x16float(vw);
                    }
                    for (var h = 0u; h < G; h++) {
                        acc[c * MAXG + h] = fma(vec2<f32>(sc[h * CHUNK + i]), v, acc[c * MAXG + h]);
                    }
                }
            }
        }
        workgroupBarrier();
    }
    let rec_len = hd + 2u;
    for (var c = 0u; c < WPT; c++) {
        let wc = lid + 64u * c;
        if (wc < wcols) {
            for (var h = 0u; h < G; h++) {
                let head = kvh * G + h;
                let a = acc[c * MAXG + h];
                if (step.splits == 1u) {
                    let o = (t * p.heads + head) * hd + wc * vpw;
                    let l = ml[h].y;
                    OUT[o] = a.x / l;
                    if (KV_F16) {
                        OUT[o + 1u] = a.y / l;
                    }
                } else {
                    let o = ((t * p.heads + head) * step.splits + slice) * rec_len + wc * vpw;
                    PART[o] = a.x;
                    if (KV_F16) {
                        PART[o + 1u] = a.y;
                    }
                }
            }
        }
    }
    if (step.splits > 1u && lid < G) {
        let o = ((t * p.heads + kvh * G + lid) * step.splits + slice) * rec_len + hd;
        PART[o] = ml[lid].x;
        PART[o + 1u] = ml[lid].y;
    }
}
