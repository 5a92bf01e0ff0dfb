// RoPE on Q and K, and the KV-cache store, in one kernel (HF's rotate-half convention: pairs
// (i, i + d/2)). Per token, three kinds of work items:
//   - one per query rope pair: rotates Q in place;
//   - one per two adjacent key rope pairs (i, i + 1): rotates them and stores dims i, i + 1 and
//     i + d/2, i + d/2 + 1 to the cache (two f16 words);
//   - one per pair of V values: stored as is.
// Token t goes to cache row SEQ[t].y + SEQ[t].x. The cache is u32 words: f16 pairs
// (pack2x16float) with KV_F16, else f32 bit patterns. CS holds cos/sin per token and frequency.

struct RopeKvParams {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
}
@group(0) @binding(0) var<storage, read> CS: array<vec2<f32>>;
@group(0) @binding(1) var<storage, read_write> Q: array<f32>;
@group(0) @binding(2) var<storage, read> K: array<f32>;
@group(0) @binding(3) var<storage, read> V: array<vec2<f32>>;
@group(0) @binding(4) var<storage, read_write> KC: array<u32>;
@group(0) @binding(5) var<storage, read_write> VC: array<u32>;
@group(0) @binding(6) var<storage, read> SEQ: array<vec2<u32>>;
@group(0) @binding(7) var<uniform> p: RopeKvParams;
@group(0) @binding(8) var<uniform> step: Step;

override KV_F16: bool = true;

// Stores the pair `v` at dims (d, d + 1) of cache row `row` (kv_dim values per row).
fn store(row: u32, d: u32, v: vec2<f32>, is_k: bool) {
    let kv_dim = p.kv_heads * p.head_dim;
    if (KV_F16) {
        let o = (row * kv_dim + d) / 2u;
        if (is_k) {
            KC[o] = pack_f16(v);
        } else {
            VC[o] = pack_f16(v);
        }
    } else {
        let o = row * kv_dim + d;
        if (is_k) {
            KC[o] = bitcast<u32>(v.x);
            KC[o + 1u] = bitcast<u32>(v.y);
        } else {
            VC[o] = bitcast<u32>(v.x);
            VC[o + 1u] = bitcast<u32>(v.y);
        }
    }
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let hd = p.head_dim;
    let half = hd / 2u;
    let nq = p.heads * half;
    let nk = p.kv_heads * half / 2u;
    let kv_dim = p.kv_heads * hd;
    let nv = kv_dim / 2u;
    let per_token = nq + nk + nv;
    let idx = gid.y * nwg.x * 64u + gid.x;
    if (idx >= step.t * per_token) {
        return;
    }
    let t = idx / per_token;
    var j = idx % per_token;
    if (j < nq) {
        let i = j % half;
        let cs = CS[t * half + i];
        let b = (t * p.heads + j / half) * hd + i;
        let x0 = Q[b];
        let x1 = Q[b + half];
        Q[b] = x0 * cs.x - x1 * cs.y;
        Q[b + half] = x1 * cs.x + x0 * cs.y;
        return;
    }
    let row = SEQ[t].y + SEQ[t].x;
    j -= nq;
    if (j < nk) {
        let h = j / (half / 2u);
        let i = 2u * (j % (half / 2u));
        let c0 = CS[t * half + i];
        let c1 = CS[t * half + i + 1u];
        let b = t * kv_dim + h * hd + i;
        let a = vec2<f32>(K[b], K[b + 1u]);
        let z = vec2<f32>(K[b + half], K[b + half + 1u]);
        let cs = vec2<f32>(c0.x, c1.x);
        let sn = vec2<f32>(c0.y, c1.y);
        store(row, h * hd + i, a * cs - z * sn, true);
        store(row, h * hd + i + half, z * cs + a * sn, true);
        return;
    }
    j -= nk;
    store(row, 2u * j, V[t * nv + j], false);
}
