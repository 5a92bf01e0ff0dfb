// The index of the largest logit of each output row (lowest index on ties): greedy decoding
// reads back one u32 per row instead of the whole vocabulary.

struct ArgmaxParams {
    n: u32, // vocabulary size
}
@group(0) @binding(0) var<storage, read> L: array<f32>;
@group(0) @binding(1) var<storage, read_write> OUT: array<u32>;
@group(0) @binding(2) var<uniform> p: ArgmaxParams;
@group(0) @binding(3) var<uniform> step: Step;

var<workgroup> bv: array<f32, 256>;
var<workgroup> bi: array<u32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let row = wid.x;
    let base = row * p.n;
    var best = -3.4e38;
    var bidx = 0xffffffffu;
    for (var i = lid; i < p.n; i += 256u) {
        let v = L[base + i];
        if (v > best) {
            best = v;
            bidx = i;
        }
    }
    bv[lid] = best;
    bi[lid] = bidx;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if (lid < k) {
            let v = bv[lid + k];
            let j = bi[lid + k];
            if (v > bv[lid] || (v == bv[lid] && j < bi[lid])) {
                bv[lid] = v;
                bi[lid] = j;
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        OUT[row] = bi[0];
    }
}
