// The input side of the matrix-vector kernels (matvec, matvec_sg; prepended to each). With
// NORM, X is the residual stream and the kernel applies the RMSNorm that feeds the matrix
// itself: W (x / rms(x) * G) = (W (x * G)) / rms(x). Each thread multiplies its blocks of x by
// G and sums their squares; those sums are reduced along with the dot products, and the row
// totals are scaled by 1 / sqrt(mean(x^2) + eps) at the end. Every row group reads all of x,
// so each computes the norm on its own (no pass over x before the matrix). Without NORM, G is
// bound to X again and never read.
@group(0) @binding(7) var<storage, read> G: array<vec4<f32>>;
// NORM and norm_scale are in mat_out.wgsl.

// Loads the 32 values of x at vec4 index xo into xv (times G from vec4 index go, with NORM);
// returns the sum of their squares (0 without NORM).
fn load_x(xo: u32, go: u32, xv: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    var ss = vec4<f32>(0.0);
    for (var i = 0u; i < 8u; i++) {
        let v = X[xo + i];
        if (NORM) {
            ss = fma(v, v, ss);
            (*xv)[i] = v * G[go + i];
        } else {
            (*xv)[i] = v;
        }
    }
    return ss.x + ss.y + ss.z + ss.w;
}
