// Merges the slices of attn_split.wgsl (used when a context spans more than one): per (token,
// query head), out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s with M the largest slice
// max. Empty slices carry max -3e38 and sum 0, so they weigh nothing.

struct CombineParams {
    heads: u32,
    head_dim: u32,
}
@group(0) @binding(0) var<storage, read> PART: array<f32>;
@group(0) @binding(1) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(2) var<uniform> p: CombineParams;
@group(0) @binding(3) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let t = wid.y;
    let hd = p.head_dim;
    let rec_len = hd + 2u;
    let rec0 = (t * p.heads + h) * step.splits;
    var big = -3.0e38;
    for (var s = 0u; s < step.splits; s++) {
        big = max(big, PART[(rec0 + s) * rec_len + hd]);
    }
    var l = 0.0;
    for (var s = 0u; s < step.splits; s++) {
        let o = (rec0 + s) * rec_len + hd;
        l += PART[o + 1u] * exp(PART[o] - big);
    }
    for (var d = lid; d < hd; d += 64u) {
        var a = 0.0;
        for (var s = 0u; s < step.splits; s++) {
            let o = (rec0 + s) * rec_len;
            a += PART[o + d] * exp(PART[o + hd] - big);
        }
        OUT[(t * p.heads + h) * hd + d] = a / l;
    }
}
