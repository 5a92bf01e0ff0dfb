// RoPE on Q and K, and the KV-cache store, in one kernel (HF's rotate-half convention: pairs
// (i, i + d/2)). Per token, three kinds of work items:
//   - one per query rope pair: rotates Q in place;
//   - one per two adjacent key rope pairs (i, i + 1): rotates them and stores dims i, i + 1 and
//     i + d/2, i + d/2 + 1 to the cache (two f16 words);
//   - one per pair of V values: stored as is.
// Token t goes to cache row SEQ[t].y + SEQ[t].x, laid out as kv_types.wgsl says. With a quantized
// cache the key and value work items are instead one per pair of 32-value blocks of the row
// (kv_write.wgsl): a key item rotates its 64 dims, then quantizes and stores them. CS holds
// cos/sin per token and frequency.

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

// Stores the pair `v` at dims (d, d + 1) of cache row `row` (kv_dim values per row): f16 or f32.
fn store(row: u32, d: u32, v: vec2<f32>, is_k: bool) {
    let kv_dim = p.kv_heads * p.head_dim;
    if (KV_TYPE == 1u) {
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
    let kv_dim = p.kv_heads * hd;
    let nv = kv_dim / 2u;
    // Key and value items: pairs of rope pairs and of values, or pairs of blocks.
    let nb = (kv_dim + 63u) / 64u;
    let nk = select(p.kv_heads * half / 2u, nb, kv_quantized());
    let nvi = select(nv, nb, kv_quantized());
    let per_token = nq + nk + nvi;
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
    if (kv_quantized()) {
        store_blocks(t, row, select(j - nk, j, j < nk), j < nk);
        return;
    }
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

// A quantized cache: blocks 2 * pair and 2 * pair + 1 of token t's key row (rotated) or value
// row, stored to cache row `row`.
fn store_blocks(t: u32, row: u32, pair: u32, is_k: bool) {
    let hd = p.head_dim;
    let half = hd / 2u;
    let kv_dim = p.kv_heads * hd;
    let base = row * kv_row_words(kv_dim);
    var d = vec2<f32>(0.0);
    for (var b = 0u; b < 2u; b++) {
        let blk = 2u * pair + b;
        if (blk * 32u >= kv_dim) {
            break;
        }
        var x: array<f32, 32>;
        for (var k = 0u; k < 32u; k++) {
            let dim = blk * 32u + k;
            let src = t * kv_dim + dim;
            if (is_k) {
                // Dim i of its head pairs with i + d/2 (first half) or i - d/2 (second half).
                let i = dim % hd;
                let lo = i < half;
                let f = select(i - half, i, lo);
                let cs = CS[t * half + f];
                let other = K[select(src - half, src + half, lo)];
                x[k] = select(K[src] * cs.x + other * cs.y, K[src] * cs.x - other * cs.y, lo);
            } else {
                let v = V[src / 2u];
                x[k] = v[src & 1u];
            }
        }
        d[b] = kv_put_block(is_k, base, blk, x);
    }
    kv_put_scales(is_k, base, kv_dim, pair, d);
}
