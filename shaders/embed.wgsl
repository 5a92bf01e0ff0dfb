// X[t, :] = row TOKENS[t] of the embedding matrix, dequantized, for the rows held by this chunk
// (the table may be split across several buffers). Prepended: bytes.wgsl and dequant8.

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> TOKENS: array<u32>;
@group(0) @binding(2) var<storage, read_write> X: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> p: MatParams;
@group(0) @binding(4) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let e = gid.x * 8u;
    if (t >= step.t || e >= p.k) {
        return;
    }
    let tok = TOKENS[t];
    if (tok < p.out_off || tok >= p.out_off + p.n) {
        return;
    }
    let w = dequant8((tok - p.out_off) * p.row_bytes, e);
    let o = (t * p.k + e) >> 2u;
    X[o] = w.a;
    X[o + 1u] = w.b;
}
