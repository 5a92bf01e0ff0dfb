// The output side shared by the matrix kernels (matvec, matvec_sg, matmul; prepended to each).
// A fused Q/K/V matrix holds the three projections' rows one after another and writes the
// three row ranges to three buffers: rows below p.split1 go to Y (row stride p.out_stride),
// rows below p.split2 to Y2, the rest to Y3 (both with row stride p.stride2). Other matrices
// set both splits past their last row and bind two spare buffers as Y2 and Y3 (never written
// then: WebGPU rejects a dispatch whose writable bindings overlap).
@group(0) @binding(5) var<storage, read_write> Y2: array<f32>;
@group(0) @binding(6) var<storage, read_write> Y3: array<f32>;

// Output row n (of the whole matrix) of token t (+)= v.
fn put(t: u32, n: u32, v: f32) {
    if (n < p.split1) {
        let o = t * p.out_stride + n;
        if (ACCUMULATE) {
            Y[o] += v;
        } else {
            Y[o] = v;
        }
    } else if (n < p.split2) {
        Y2[t * p.stride2 + n - p.split1] = v;
    } else {
        Y3[t * p.stride2 + n - p.split2] = v;
    }
}

// Rows come in (gate, up) pairs (row 2i gate i, row 2i + 1 up i): output i = silu(gate) * up.
fn put_glu(t: u32, n: u32, gate: f32, up: f32) {
    Y[t * p.out_stride + n / 2u] = gate / (1.0 + exp(-gate)) * up;
}

// The matvec applies the RMSNorm that feeds it (mat_norm.wgsl): its row totals are scaled by
// norm_scale. Set only for matvec and matvec_sg.
override NORM: bool = false;

// The scale of the norm for a token whose squares of x sum to ss (1 without NORM).
fn norm_scale(ss: f32) -> f32 {
    if (NORM) {
        return inverseSqrt(ss / f32(p.k) + p.eps);
    }
    return 1.0;
}
