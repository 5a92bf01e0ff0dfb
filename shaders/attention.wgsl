// Causal attention over the KV cache for one (token, query head) per workgroup, any GQA ratio
// and head_dim <= 256. Token t attends to the rows of its own sequence: cache rows SEQ[t].y ..
// SEQ[t].y + SEQ[t].x (its first row, its position), so one pass can serve several sequences.
// Keys are visited in tiles of 64 with an online softmax (running max and
// sum), so the context length is bounded only by the cache. All math in f32. The cache buffers
// hold KV heads head0 .. head0 + pheads (all of them unless the cache spans several buffers, one
// dispatch each), laid out as kv_types.wgsl says (quantized blocks rotated: the query is rotated
// on load and the output back at the end).

struct AttnParams {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    scale: f32,
    head0: u32,  // first KV head in these buffers
    pheads: u32, // KV heads in these buffers
}
@group(0) @binding(0) var<storage, read> Q: array<f32>;
@group(0) @binding(1) var<storage, read> KC: array<u32>;
@group(0) @binding(2) var<storage, read> VC: array<u32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(4) var<storage, read> SEQ: array<vec2<u32>>; // per token: (position, first cache row)
@group(0) @binding(5) var<uniform> p: AttnParams;
@group(0) @binding(6) var<uniform> step: Step;

const TILE: u32 = 64u;
var<workgroup> qs: array<f32, 256>;
var<workgroup> ps: array<f32, 64>;
var<workgroup> red: array<f32, 64>;

// Value `i` of cache row `row` (`vals` values a row), from its word `w` (of `kword`) and, for
// quantized types, its block's scale word `sw` (of `kscale`).
fn kword(row: u32, vals: u32, i: u32) -> u32 {
    switch KV_TYPE {
        case 0u: {
            return row * vals + i;
        }
        case 1u: {
            return (row * vals + i) / 2u;
        }
        default: {
            return row * kv_row_words(vals) + i / select(8u, 4u, KV_TYPE == 2u);
        }
    }
}
fn kscale(row: u32, vals: u32, i: u32) -> u32 {
    return row * kv_row_words(vals) + kv_code_words(vals) + i / 64u;
}
fn decode(w: u32, sw: u32, i: u32) -> f32 {
    switch KV_TYPE {
        case 0u: {
            return bitcast<f32>(w);
        }
        case 1u: {
            return unpack2x16float(w)[i & 1u];
        }
        default: {
            return kv_code(w, i) * kv_scale(sw, i / 32u);
        }
    }
}
fn kval(row: u32, vals: u32, i: u32) -> f32 {
    var sw = 0u;
    if (kv_quantized()) {
        sw = KC[kscale(row, vals, i)];
    }
    return decode(KC[kword(row, vals, i)], sw, i);
}
fn vval(row: u32, vals: u32, i: u32) -> f32 {
    var sw = 0u;
    if (kv_quantized()) {
        sw = VC[kscale(row, vals, i)];
    }
    return decode(VC[kword(row, vals, i)], sw, i);
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let ratio = p.heads / p.kv_heads;
    let h = p.head0 * ratio + wid.x;
    let t = wid.y;
    let hd = p.head_dim;
    // This KV head's place in the buffers' rows.
    let kvh = h / ratio - p.head0;
    let vals = p.pheads * hd;
    let qbase = (t * p.heads + h) * hd;
    for (var d = lid; d < hd; d += TILE) {
        qs[d] = Q[qbase + d] * p.scale;
    }
    workgroupBarrier();
    if (kv_quantized()) {
        // Keys are stored rotated block by block (kv_types.wgsl): rotate the query's blocks too.
        if (lid < hd / 32u) {
            var x: array<f32, 32>;
            for (var k = 0u; k < 32u; k++) {
                x[k] = qs[32u * lid + k];
            }
            let y = kv_hadamard(x);
            for (var k = 0u; k < 32u; k++) {
                qs[32u * lid + k] = y[k];
            }
        }
        workgroupBarrier();
    }
    let qpos = SEQ[t].x;
    let first = SEQ[t].y;
    var m = -3.0e38;
    var l = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var j0 = 0u; j0 <= qpos; j0 += TILE) {
        let j = j0 + lid;
        var s = -3.0e38;
        if (j <= qpos) {
            var dotv = 0.0;
            for (var d = 0u; d < hd; d++) {
                dotv = fma(qs[d], kval(first + j, vals, kvh * hd + d), dotv);
            }
            s = dotv;
        }
        red[lid] = s;
        workgroupBarrier();
        for (var k = 32u; k > 0u; k >>= 1u) {
            if (lid < k) {
                red[lid] = max(red[lid], red[lid + k]);
            }
            workgroupBarrier();
        }
        let m_new = max(m, red[0]);
        workgroupBarrier();
        var pj = 0.0;
        if (j <= qpos) {
            pj = exp(s - m_new);
        }
        ps[lid] = pj;
        red[lid] = pj;
        workgroupBarrier();
        for (var k = 32u; k > 0u; k >>= 1u) {
            if (lid < k) {
                red[lid] += red[lid + k];
            }
            workgroupBarrier();
        }
        let corr = exp(m - m_new);
        l = l * corr + red[0];
        m = m_new;
        let n = min(TILE, qpos + 1u - j0);
        for (var c = 0u; c < 4u; c++) {
            let d = lid + c * TILE;
            if (d < hd) {
                var a = acc[c] * corr;
                for (var i = 0u; i < n; i++) {
                    a = fma(ps[i], vval(first + j0 + i, vals, kvh * hd + d), a);
                }
                acc[c] = a;
            }
        }
        workgroupBarrier();
    }
    if (kv_quantized()) {
        // So are values: rotate the weighted sum back (through qs, free now).
        for (var c = 0u; c < 4u; c++) {
            let d = lid + c * TILE;
            if (d < hd) {
                qs[d] = acc[c];
            }
        }
        workgroupBarrier();
        for (var c = 0u; c < 4u; c++) {
            let d = lid + c * TILE;
            if (d < hd) {
                var y = 0.0;
                for (var k = 0u; k < 32u; k++) {
                    y = fma(kv_hsign(d % 32u, k), qs[d - d % 32u + k], y);
                }
                acc[c] = y * KV_H;
            }
        }
    }
    for (var c = 0u; c < 4u; c++) {
        let d = lid + c * TILE;
        if (d < hd) {
            OUT[qbase + d] = acc[c] / l;
        }
    }
}
