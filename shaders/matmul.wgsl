// Y[t, n] (+)= sum_k X[t, k] * W[n, k] for many tokens (prefill): 64x64 output tiles, K in
// steps of 32 staged in workgroup memory (weights dequantized once per tile), each of the 256
// threads accumulating a 4x4 block in f32. Prepended: bytes.wgsl and the weight type's dequant8.

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

const BN: u32 = 64u;
const BT: u32 = 64u;
const BK: u32 = 32u;
const PAD: u32 = 33u;
var<workgroup> ws: array<f32, 2112>; // BN * PAD
var<workgroup> xs: array<f32, 2112>; // BT * PAD

@compute @workgroup_size(16, 16)
fn main(@builtin(local_invocation_id) l: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(workgroup_id) wid: vec3<u32>) {
    let n0 = wid.x * BN;
    let t0 = wid.y * BT;
    let lr = lid / 4u;        // tile row this thread loads (0..64)
    let lk = (lid % 4u) * 8u; // its 8 columns within the K step
    var acc: array<array<f32, 4>, 4>;
    for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) {
            acc[i][j] = 0.0;
        }
    }
    let kq = p.k >> 2u;
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
        let o = lr * PAD + lk;
        ws[o] = w.a.x; ws[o + 1u] = w.a.y; ws[o + 2u] = w.a.z; ws[o + 3u] = w.a.w;
        ws[o + 4u] = w.b.x; ws[o + 5u] = w.b.y; ws[o + 6u] = w.b.z; ws[o + 7u] = w.b.w;
        xs[o] = xa.x; xs[o + 1u] = xa.y; xs[o + 2u] = xa.z; xs[o + 3u] = xa.w;
        xs[o + 4u] = xb.x; xs[o + 5u] = xb.y; xs[o + 6u] = xb.z; xs[o + 7u] = xb.w;
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            var wv: array<f32, 4>;
            var xv: array<f32, 4>;
            for (var i = 0u; i < 4u; i++) {
                wv[i] = ws[(l.x + 16u * i) * PAD + kk];
                xv[i] = xs[(l.y + 16u * i) * PAD + kk];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    acc[i][j] = fma(wv[i], xv[j], acc[i][j]);
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let n = n0 + l.x + 16u * i;
        for (var j = 0u; j < 4u; j++) {
            let t = t0 + l.y + 16u * j;
            if (n < p.n && t < step.t) {
                let o = t * p.out_stride + p.out_off + n;
                if (ACCUMULATE) {
                    Y[o] += acc[i][j];
                } else {
                    Y[o] = acc[i][j];
                }
            }
        }
    }
}
