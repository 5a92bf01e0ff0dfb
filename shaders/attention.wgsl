// Causal attention over the KV cache for one (token, query head) per workgroup, any GQA ratio
// and head_dim <= 256. Token t attends to the rows of its own sequence: cache rows SEQ[t].y ..
// SEQ[t].y + SEQ[t].x (its first row, its position), so one pass can serve several sequences.
// Keys are visited in tiles of 64 with an online softmax (running max and
// sum), so the context length is bounded only by the cache. All math in f32.

struct AttnParams {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    scale: f32,
}
@group(0) @binding(0) var<storage, read> Q: array<f32>;
@group(0) @binding(1) var<storage, read> KC: array<u32>;
@group(0) @binding(2) var<storage, read> VC: array<u32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(4) var<storage, read> SEQ: array<vec2<u32>>; // per token: (position, first cache row)
@group(0) @binding(5) var<uniform> p: AttnParams;
@group(0) @binding(6) var<uniform> step: Step;

override KV_F16: bool = true;

const TILE: u32 = 64u;
var<workgroup> qs: array<f32, 256>;
var<workgroup> ps: array<f32, 64>;
var<workgroup> red: array<f32, 64>;

// Element `i` of a cache laid out as u32 words.
fn kval(i: u32) -> f32 {
    if (KV_F16) {
        let w = KC[i >> 1u];
        return unpack2x16float(w)[i & 1u];
    }
    return bitcast<f32>(KC[i]);
}
fn vval(i: u32) -> f32 {
    if (KV_F16) {
        let w = VC[i >> 1u];
        return unpack2x16float(w)[i & 1u];
    }
    return bitcast<f32>(VC[i]);
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let t = wid.y;
    let hd = p.head_dim;
    let kvh = h / (p.heads / p.kv_heads);
    let kv_dim = p.kv_heads * hd;
    let qbase = (t * p.heads + h) * hd;
    for (var d = lid; d < hd; d += TILE) {
        qs[d] = Q[qbase + d] * p.scale;
    }
    workgroupBarrier();
    let qpos = SEQ[t].x;
    let first = SEQ[t].y;
    var m = -3.0e38;
    var l = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var j0 = 0u; j0 <= qpos; j0 += TILE) {
        let j = j0 + lid;
        var s = -3.0e38;
        if (j <= qpos) {
            let kb = (first + j) * kv_dim + kvh * hd;
            var dotv = 0.0;
            for (var d = 0u; d < hd; d++) {
                dotv = fma(qs[d], kval(kb + d), dotv);
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
                    a = fma(ps[i], vval((first + j0 + i) * kv_dim + kvh * hd + d), a);
                }
                acc[c] = a;
            }
        }
        workgroupBarrier();
    }
    for (var c = 0u; c < 4u; c++) {
        let d = lid + c * TILE;
        if (d < hd) {
            OUT[qbase + d] = acc[c] / l;
        }
    }
}
