// y[n] (+)= dot(W[n, :], x): one token (decode). LANES threads share a row, each taking whole
// 32-element blocks in turn (adjacent threads read adjacent blocks), then one barrier and a
// per-row sum of the LANES partials. The engine picks LANES so each thread gets about four
// blocks (32 for wide rows); a 256-thread workgroup covers 256 / LANES rows. Prepended: bytes.wgsl and the weight type's dot32.

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

override LANES: u32 = 32u;
override ROWS: u32 = 256u / LANES;
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
        for (var u = lane; u < p.k / 32u; u += LANES) {
            acc += dot32(rb, u * 32u, u * 8u);
        }
    }
    red[lid] = acc;
    workgroupBarrier();
    // One barrier, then the first lane of each row sums its 32 partials.
    if (lane == 0u && row < p.n) {
        var total = 0.0;
        for (var i = 0u; i < LANES; i++) {
            total += red[lid + i];
        }
        let o = p.out_off + row;
        if (ACCUMULATE) {
            Y[o] += total;
        } else {
            Y[o] = total;
        }
    }
}
