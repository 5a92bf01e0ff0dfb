// Y[t, n] (+)= sum_k X[t, k] * W[n, k] for many tokens (prefill): 64x64 output tiles per
// workgroup of 64 threads, K in steps of 32 staged in workgroup memory (each weight dequantized
// once per tile and shared by 64 tokens). Each thread accumulates an 8x8 block in f32 from four
// vec4 loads per k: 16 FMAs per load. Prepended: bytes.wgsl and the weight type's dequant8.

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> p: MatParams;
@group(0) @binding(4) var<uniform> step: Step;

override ACCUMULATE: bool = false;
// Rows come in (gate, up) pairs (row 2i gate i, row 2i + 1 up i): Y[i] = silu(gate) * up.
override GLU: bool = false;

const BK: u32 = 32u;
// ws[k * 16 + r] holds tile rows 4r..4r+3 at column k; xs likewise for tokens.
var<workgroup> ws: array<vec4<f32>, 512>;
var<workgroup> xs: array<vec4<f32>, 512>;

@compute @workgroup_size(8, 8)
fn main(@builtin(local_invocation_id) l: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(workgroup_id) wid: vec3<u32>) {
    let n0 = wid.x * 64u;
    let t0 = wid.y * 64u;
    // acc[2j + h]: token 8*l.y + j, rows 8*l.x + 4h .. + 3.
    var acc: array<vec4<f32>, 16>; // zero-initialised
    let kq = p.k >> 2u;
    // This thread stages tile rows (and tokens) 4s .. 4s + 3 at columns 8c .. 8c + 7 of each
    // K step: four dequant8 calls, then a 4x4 transpose in registers so every workgroup-memory
    // store is a whole vec4.
    let s4 = lid / 4u;
    let cq = lid % 4u;
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        let kc = k0 + 8u * cq;
        var wa: array<vec4<f32>, 4>;
        var wb: array<vec4<f32>, 4>;
        var xa: array<vec4<f32>, 4>;
        var xb: array<vec4<f32>, 4>;
        for (var r = 0u; r < 4u; r++) {
            let row = n0 + 4u * s4 + r;
            wa[r] = vec4<f32>(0.0);
            wb[r] = vec4<f32>(0.0);
            if (row < p.n) {
                let f = dequant8(row * p.row_bytes, kc);
                wa[r] = f.a;
                wb[r] = f.b;
            }
            let tok = t0 + 4u * s4 + r;
            xa[r] = vec4<f32>(0.0);
            xb[r] = vec4<f32>(0.0);
            if (tok < step.t) {
                let xi = tok * kq + (kc >> 2u);
                xa[r] = X[xi];
                xb[r] = X[xi + 1u];
            }
        }
        for (var i = 0u; i < 4u; i++) {
            let c0 = (8u * cq + i) * 16u + s4;
            let c1 = (8u * cq + 4u + i) * 16u + s4;
            ws[c0] = vec4<f32>(wa[0][i], wa[1][i], wa[2][i], wa[3][i]);
            ws[c1] = vec4<f32>(wb[0][i], wb[1][i], wb[2][i], wb[3][i]);
            xs[c0] = vec4<f32>(xa[0][i], xa[1][i], xa[2][i], xa[3][i]);
            xs[c1] = vec4<f32>(xb[0][i], xb[1][i], xb[2][i], xb[3][i]);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            let w0 = ws[kk * 16u + 2u * l.x];
            let w1 = ws[kk * 16u + 2u * l.x + 1u];
            let x0 = xs[kk * 16u + 2u * l.y];
            let x1 = xs[kk * 16u + 2u * l.y + 1u];
            acc[0] = fma(w0, vec4<f32>(x0.x), acc[0]);
            acc[1] = fma(w1, vec4<f32>(x0.x), acc[1]);
            acc[8] = fma(w0, vec4<f32>(x1.x), acc[8]);
            acc[9] = fma(w1, vec4<f32>(x1.x), acc[9]);
            acc[2] = fma(w0, vec4<f32>(x0.y), acc[2]);
            acc[3] = fma(w1, vec4<f32>(x0.y), acc[3]);
            acc[10] = fma(w0, vec4<f32>(x1.y), acc[10]);
            acc[11] = fma(w1, vec4<f32>(x1.y), acc[11]);
            acc[4] = fma(w0, vec4<f32>(x0.z), acc[4]);
            acc[5] = fma(w1, vec4<f32>(x0.z), acc[5]);
            acc[12] = fma(w0, vec4<f32>(x1.z), acc[12]);
            acc[13] = fma(w1, vec4<f32>(x1.z), acc[13]);
            acc[6] = fma(w0, vec4<f32>(x0.w), acc[6]);
            acc[7] = fma(w1, vec4<f32>(x0.w), acc[7]);
            acc[14] = fma(w0, vec4<f32>(x1.w), acc[14]);
            acc[15] = fma(w1, vec4<f32>(x1.w), acc[15]);
        }
        workgroupBarrier();
    }
    // One call per token with constant accumulator indices, so the accumulators stay in
    // registers: a runtime index into `acc` would put the whole array in memory.
    let tb = t0 + 8u * l.y;
    let nb = n0 + 8u * l.x;
    store8(tb, nb, acc[0], acc[1]);
    store8(tb + 1u, nb, acc[2], acc[3]);
    store8(tb + 2u, nb, acc[4], acc[5]);
    store8(tb + 3u, nb, acc[6], acc[7]);
    store8(tb + 4u, nb, acc[8], acc[9]);
    store8(tb + 5u, nb, acc[10], acc[11]);
    store8(tb + 6u, nb, acc[12], acc[13]);
    store8(tb + 7u, nb, acc[14], acc[15]);
}

// Token t, rows n .. n + 7 (a: n .. n + 3, b: n + 4 .. n + 7).
fn store8(t: u32, n: u32, a: vec4<f32>, b: vec4<f32>) {
    if (t >= step.t) {
        return;
    }
    store4(t, n, a);
    store4(t, n + 4u, b);
}

fn store4(t: u32, n: u32, v: vec4<f32>) {
    let r = p.out_off + n;
    if (GLU) {
        // (gate, up) pairs: v.x, v.y and v.z, v.w.
        if (n < p.n) {
            put_glu(t, r, v.x, v.y);
        }
        if (n + 2u < p.n) {
            put_glu(t, r + 2u, v.z, v.w);
        }
        return;
    }
    for (var i = 0u; i < 4u; i++) {
        if (n + i < p.n) {
            put(t, r + i, v[i]);
        }
    }
}
