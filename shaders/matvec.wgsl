// y[t, n] (+)= dot(W[n, :], x[t, :]) for a few tokens (decode, one token per sequence).
// A group of LANES threads covers NR rows: each thread takes whole 32-element blocks in turn
// (adjacent threads read adjacent blocks) and, for each token, loads that slice of x once and
// applies it to all NR rows; the block's weights are read from memory once and hit the cache for
// the other tokens. Then per token: one barrier, and one thread per row sums the LANES partials.
// The engine picks LANES so each thread gets about four blocks (32 for wide rows); a 256-thread
// workgroup covers 256 / LANES * NR rows. Tokens go in groups of MAX_T (registers per thread stay
// fixed); the engine sends passes of more than 16 tokens to the tiled matmul instead, whose 64x64
// tiles would be mostly idle below that. NT (an override: 1 for one-token passes, MAX_T else)
// bounds every token loop by a constant, so compilers unroll them and keep `acc` in registers
// (a runtime-indexed array lives in memory).
// With NORM the kernel also applies the RMSNorm that feeds the matrix (mat_norm.wgsl).
// Prepended: bytes.wgsl, the weight type's dot32, mat_out.wgsl, matvec_reduce.wgsl and
// mat_norm.wgsl.

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> p: MatParams;
@group(0) @binding(4) var<uniform> step: Step;

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
    let kq = p.k / 4u;
    // Tokens in groups of MAX_T: each group reads the rows again (from cache on a GPU).
    for (var t0 = 0u; t0 < step.t; t0 += NT) {
        let nt = min(step.t - t0, NT);
        // Rows past the end read row 0 again (always present) and are never written.
        var acc: array<vec4<f32>, MAX_T>;
        var ss: array<f32, MAX_T>;
        for (var b = 0u; b < NT; b++) {
            acc[b] = vec4<f32>(0.0);
            ss[b] = 0.0;
        }
        if (row0 < p.n) {
            let rb0 = row0 * p.row_bytes;
            let rb1 = select(0u, rb0 + p.row_bytes, row0 + 1u < p.n);
            let rb2 = select(0u, rb0 + 2u * p.row_bytes, row0 + 2u < p.n);
            let rb3 = select(0u, rb0 + 3u * p.row_bytes, row0 + 3u < p.n);
            var xv: array<vec4<f32>, 8>;
            for (var u = lane; u < p.k / 32u; u += LANES) {
                let e = u * 32u;
                for (var b = 0u; b < NT; b++) {
                    if (b >= nt) {
                        break;
                    }
                    ss[b] += load_x((t0 + b) * kq + u * 8u, u * 8u, &xv);
                    acc[b] += vec4<f32>(dot32(rb0, e, &xv), dot32(rb1, e, &xv), dot32(rb2, e, &xv), dot32(rb3, e, &xv));
                }
            }
        }
        // Thread r of each group sums row row0 + r, token by token.
        for (var b = 0u; b < NT; b++) {
            if (b >= nt) {
                break;
            }
            reduce_put(lid, row0, t0 + b, acc[b], ss[b]);
        }
    }
}
