// Y[t, n] (+)= sum_k X[t, k] * W[n, k] for many tokens (prefill): 64x64 output tiles, K in
// steps of 32 staged in workgroup memory (weights dequantized once per tile and shared by 64
// tokens), each of the 256 threads accumulating a 4x4 block in f32 from vec4 loads.
// Prepended: bytes.wgsl and the weight type's dequant8.

struct MatParams {
    n: u32,
    k: u32,
    row_bytes: u32,
    out_off: u32,
    out_stride: u32,
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

const BK: u32 = 32u;
// ws[k * 16 + r] holds rows 4r..4r+3 of the tile at column k; xs likewise for tokens.
var<workgroup> ws: array<vec4<f32>, 512>;
var<workgroup> xs: array<vec4<f32>, 512>;


@compute @workgroup_size(16, 16)
fn main(@builtin(local_invocation_id) l: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(workgroup_id) wid: vec3<u32>) {
    let n0 = wid.x * 64u;
    let t0 = wid.y * 64u;
    let lr = lid / 4u;        // tile row this thread loads (0..64)
    let lk = (lid % 4u) * 8u; // its 8 columns within the K step
    var acc: array<vec4<f32>, 4>; // acc[j][i]: token 4*l.y + j, row 4*l.x + i
    for (var j = 0u; j < 4u; j++) {
        acc[j] = vec4<f32>(0.0);
    }
    let kq = p.k >> 2u;
    let slot = lr / 4u;
    let comp = lr % 4u;
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        var w = F8(vec4<f32>(0.0), vec4<f32>(0.0));
        if (n0 + lr < p.n) {
            w = dequant8((n0 + lr) * p.row_bytes, k0 + lk);
        }
        var xa = vec4<f32>(0.0);
        var xb = vec4<f32>(0.0);
        if (t0 + lr < step.t) {
            let xi = (t0 + lr) * kq + ((k0 + lk) >> 2u);
            xa = X[xi];
            xb = X[xi + 1u];
        }
        for (var c = 0u; c < 4u; c++) {
            ws[(lk + c) * 16u + slot][comp] = w.a[c];
            ws[(lk + 4u + c) * 16u + slot][comp] = w.b[c];
            xs[(lk + c) * 16u + slot][comp] = xa[c];
            xs[(lk + 4u + c) * 16u + slot][comp] = xb[c];
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            let wv = ws[kk * 16u + l.x];
            let xv = xs[kk * 16u + l.y];
            acc[0] = fma(wv, vec4<f32>(xv.x), acc[0]);
            acc[1] = fma(wv, vec4<f32>(xv.y), acc[1]);
            acc[2] = fma(wv, vec4<f32>(xv.z), acc[2]);
            acc[3] = fma(wv, vec4<f32>(xv.w), acc[3]);
        }
        workgroupBarrier();
    }
    for (var j = 0u; j < 4u; j++) {
        let t = t0 + 4u * l.y + j;
        if (t < step.t) {
            for (var i = 0u; i < 4u; i++) {
                let n = n0 + 4u * l.x + i;
                if (n < p.n) {
                    let o = t * p.out_stride + p.out_off + n;
                    if (ACCUMULATE) {
                        Y[o] += acc[j][i];
                    } else {
                        Y[o] = acc[j][i];
                    }
                }
            }
        }
    }
}
