// y[t, n] (+)= dot(W[n, :], x[t, :]) for a few tokens with 8-bit integer dot products
// (dot4I8Packed, four multiply-adds per instruction): x comes quantized in 32-value blocks
// (norm_quant.wgsl: bytes in XQ, scales in XS), so a thread loads 8 words per block and token
// instead of 32 floats, and each weight type's dot32q multiplies the block's integer weights
// with them and applies the scales once per block. Otherwise as matvec.wgsl (LANES threads per
// NR rows, NT tokens at once, the same workgroup-memory reduction) with its output side
// (mat_out.wgsl: the Q/K/V split, the GLU epilogue). Lossy: the input is rounded to 8 bits per
// value, as llama.cpp's Q8_1 activations are; the engine uses it only where asked.
// Prepended: bytes.wgsl, the weight type's dot32q, mat_out.wgsl, matvec_reduce.wgsl.

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> XQ: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> p: MatParams;
@group(0) @binding(4) var<uniform> step: Step;
@group(0) @binding(7) var<storage, read> XS: array<vec2<f32>>;

override ACCUMULATE: bool = false;
// Rows come in (gate, up) pairs (row 2i gate i, row 2i + 1 up i): Y[i] = silu(gate) * up.
override GLU: bool = false;
override LANES: u32 = 32u;
const NR: u32 = 4u;
const MAX_T: u32 = 8u;
override NT: u32 = MAX_T;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let g = lid / LANES;
    let lane = lid % LANES;
    let row0 = ((wid.y * nwg.x + wid.x) * (256u / LANES) + g) * NR;
    let nb = p.k / 32u;
    for (var t0 = 0u; t0 < step.t; t0 += NT) {
        let nt = min(step.t - t0, NT);
        var acc: array<vec4<f32>, MAX_T>;
        for (var b = 0u; b < NT; b++) {
            acc[b] = vec4<f32>(0.0);
        }
        if (row0 < p.n) {
            // Rows past the end read row 0 again (always present) and are never written.
            let rb0 = row0 * p.row_bytes;
            let rb1 = select(0u, rb0 + p.row_bytes, row0 + 1u < p.n);
            let rb2 = select(0u, rb0 + 2u * p.row_bytes, row0 + 2u < p.n);
            let rb3 = select(0u, rb0 + 3u * p.row_bytes, row0 + 3u < p.n);
            var xq: array<u32, 8>;
            for (var u = lane; u < nb; u += LANES) {
                let e = u * 32u;
                for (var b = 0u; b < NT; b++) {
                    if (b >= nt) {
                        break;
                    }
                    let o = (t0 + b) * nb + u;
                    let lo = XQ[2u * o];
                    let hi = XQ[2u * o + 1u];
                    xq[0] = lo.x;
                    xq[1] = lo.y;
                    xq[2] = lo.z;
                    xq[3] = lo.w;
                    xq[4] = hi.x;
                    xq[5] = hi.y;
                    xq[6] = hi.z;
                    xq[7] = hi.w;
                    let xs = XS[o];
                    acc[b] += vec4<f32>(dot32q(rb0, e, &xq, xs), dot32q(rb1, e, &xq, xs), dot32q(rb2, e, &xq, xs), dot32q(rb3, e, &xq, xs));
                }
            }
        }
        // Thread r of each group sums row row0 + r, token by token.
        for (var b = 0u; b < NT; b++) {
            if (b >= nt) {
                break;
            }
            reduce_put(lid, row0, t0 + b, acc[b], 0.0);
        }
    }
}
