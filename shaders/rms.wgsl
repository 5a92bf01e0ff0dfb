// The RMS of one row, shared by the norm kernels (rmsnorm, norm_quant; prepended to each, which
// declare X: array<f32> and p: NormParams and run 256 threads a workgroup, one per token).

struct NormParams {
    n: u32,
    eps: f32,
}

var<workgroup> red: array<f32, 256>;

// 1 / sqrt(mean(X[base .. base + p.n]^2) + eps), the same in every thread of the workgroup.
fn rms_scale(lid: u32, base: u32) -> f32 {
    var s = 0.0;
    for (var i = lid; i < p.n; i += 256u) {
        let v = X[base + i];
        s = fma(v, v, s);
    }
    red[lid] = s;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if (lid < k) {
            red[lid] += red[lid + k];
        }
        workgroupBarrier();
    }
    return inverseSqrt(red[0] / f32(p.n) + p.eps);
}
