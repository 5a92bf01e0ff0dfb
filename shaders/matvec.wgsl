// y[n] (+)= dot(W[n, :], x): one token (decode). 32 threads share a row, each dequantizing 8
// consecutive weights per step (coalesced across the row), then a workgroup tree reduction.
// Prepended: bytes.wgsl and the weight type's dequant8.

struct MatParams {
    n: u32,          // rows in this weight chunk
    k: u32,          // columns
    row_bytes: u32,  // bytes per row in the weight's block layout
    out_off: u32,    // first output row of this chunk
    out_stride: u32, // output row stride (all rows of the full matrix)
}
struct Step {
    t: u32,
    pos0: u32,
    _a: u32,
    _b: u32,
}

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> p: MatParams;
@group(0) @binding(4) var<uniform> step: Step;

override ACCUMULATE: bool = false;

const ROWS: u32 = 8u;
const LANES: u32 = 32u;
var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = lid / LANES;
    let lane = lid % LANES;
    let row = (wid.y * nwg.x + wid.x) * ROWS + r;
    var acc = 0.0;
    if (row < p.n) {
        let rb = row * p.row_bytes;
        for (var e = lane * 8u; e < p.k; e += LANES * 8u) {
            let w = dequant8(rb, e);
            acc += dot(w.a, X[e >> 2u]) + dot(w.b, X[(e >> 2u) + 1u]);
        }
    }
    red[lid] = acc;
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    if (lane == 0u && row < p.n) {
        let o = p.out_off + row;
        if (ACCUMULATE) {
            Y[o] += red[lid];
        } else {
            Y[o] = red[lid];
        }
    }
}
