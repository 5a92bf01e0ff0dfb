// Appends this step's K and V rows to the layer's cache: token t goes to row SEQ[t].y + SEQ[t].x
// (its sequence's first cache row plus its position), so one pass can extend several sequences.
// The cache is u32 words: f16 pairs packed with pack2x16float (KV_F16) or f32 bit patterns.

struct KvParams {
    kv_dim: u32,
}
@group(0) @binding(0) var<storage, read> K: array<vec2<f32>>;
@group(0) @binding(1) var<storage, read> V: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read_write> KC: array<u32>;
@group(0) @binding(3) var<storage, read_write> VC: array<u32>;
@group(0) @binding(4) var<storage, read> SEQ: array<vec2<u32>>; // per token: (position, first cache row)
@group(0) @binding(5) var<uniform> p: KvParams;
@group(0) @binding(6) var<uniform> step: Step;

override KV_F16: bool = true;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let pairs = p.kv_dim / 2u;
    let t = gid.y;
    let j = gid.x;
    if (t >= step.t || j >= pairs) {
        return;
    }
    let src = t * pairs + j;
    let s = SEQ[t];
    let dst = (s.y + s.x) * pairs + j;
    let k = K[src];
    let v = V[src];
    if (KV_F16) {
        KC[dst] = pack_f16(k);
        VC[dst] = pack_f16(v);
    } else {
        KC[2u * dst] = bitcast<u32>(k.x);
        KC[2u * dst + 1u] = bitcast<u32>(k.y);
        VC[2u * dst] = bitcast<u32>(v.x);
        VC[2u * dst + 1u] = bitcast<u32>(v.y);
    }
}
