// Rotary embedding in place on Q or K laid out [t][head][head_dim], HF's rotate-half convention
// (pairs (i, i + d/2)). CS holds cos/sin per token and frequency, computed on the host with the
// attention factor already applied.

struct RopeParams {
    heads: u32,
    head_dim: u32,
}
@group(0) @binding(0) var<storage, read> CS: array<vec2<f32>>;
@group(0) @binding(1) var<storage, read_write> Q: array<f32>;
@group(0) @binding(2) var<uniform> p: RopeParams;
@group(0) @binding(3) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let half = p.head_dim / 2u;
    let idx = gid.y * nwg.x * 64u + gid.x;
    if (idx >= step.t * p.heads * half) {
        return;
    }
    let i = idx % half;
    let th = idx / half; // t * heads + head
    let t = th / p.heads;
    let cs = CS[t * half + i];
    let b = th * p.head_dim + i;
    let x0 = Q[b];
    let x1 = Q[b + half];
    Q[b] = x0 * cs.x - x1 * cs.y;
    Q[b + half] = x1 * cs.x + x0 * cs.y;
}
