// Appends this step's K and V rows to one buffer of the layer's cache (the buffer holds `vals`
// values of each row, from value `off` of the kv_dim-wide K and V rows: all KV heads, or a group
// of them when the cache spans several buffers). Token t goes to row SEQ[t].y + SEQ[t].x (its
// sequence's first cache row plus its position), so one pass can extend several sequences. Rows
// are laid out as kv_types.wgsl says; one thread per pair of values (f16, f32) or per pair of
// 32-value blocks (q8_0, q4_0: kv_write.wgsl).

struct KvParams {
    kv_dim: u32,
    off: u32,
    vals: u32,
}
@group(0) @binding(0) var<storage, read> K: array<vec2<f32>>;
@group(0) @binding(1) var<storage, read> V: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read_write> KC: array<u32>;
@group(0) @binding(3) var<storage, read_write> VC: array<u32>;
@group(0) @binding(4) var<storage, read> SEQ: array<vec2<u32>>; // per token: (position, first cache row)
@group(0) @binding(5) var<uniform> p: KvParams;
@group(0) @binding(6) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let j = gid.x;
    let items = select(p.vals / 2u, (p.vals + 63u) / 64u, kv_quantized());
    if (t >= step.t || j >= items) {
        return;
    }
    let s = SEQ[t];
    let row = s.y + s.x;
    // Pair j of this token's values for the buffer.
    let src = (t * p.kv_dim + p.off) / 2u;
    if (kv_quantized()) {
        let base = row * kv_row_words(p.vals);
        var dk = vec2<f32>(0.0);
        var dv = vec2<f32>(0.0);
        for (var b = 0u; b < 2u; b++) {
            let blk = 2u * j + b;
            if (blk * 32u >= p.vals) {
                break;
            }
            var xk: array<f32, 32>;
            var xv: array<f32, 32>;
            for (var k = 0u; k < 16u; k++) {
                let kp = K[src + blk * 16u + k];
                let vp = V[src + blk * 16u + k];
                xk[2u * k] = kp.x;
                xk[2u * k + 1u] = kp.y;
                xv[2u * k] = vp.x;
                xv[2u * k + 1u] = vp.y;
            }
            dk[b] = kv_put_block(true, base, blk, xk);
            dv[b] = kv_put_block(false, base, blk, xv);
        }
        kv_put_scales(true, base, p.vals, j, dk);
        kv_put_scales(false, base, p.vals, j, dv);
        return;
    }
    let k = K[src + j];
    let v = V[src + j];
    let dst = row * (p.vals / 2u) + j;
    if (KV_TYPE == 1u) {
        KC[dst] = pack_f16(k);
        VC[dst] = pack_f16(v);
    } else {
        KC[2u * dst] = bitcast<u32>(k.x);
        KC[2u * dst + 1u] = bitcast<u32>(k.y);
        VC[2u * dst] = bitcast<u32>(v.x);
        VC[2u * dst + 1u] = bitcast<u32>(v.y);
    }
}
