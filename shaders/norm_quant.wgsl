// The input of the integer-dot matvec (matvec_q8.wgsl): each row of X (one workgroup per
// token) normed as rmsnorm.wgsl does (X / sqrt(mean(X^2) + eps) * WEIGHT) and cut into
// 32-value blocks, each stored as 32 signed bytes in XQ (8 words: round(v / d), d = max|v| /
// 127) and (d, d * the sum of its bytes) in XS (the sum serves weight types with a minimum,
// Q4_K). One dispatch in place of the norm for passes the matvec takes. Math in f32.
// Prepended: rms.wgsl.

@group(0) @binding(0) var<storage, read> WEIGHT: array<f32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> XQ: array<u32>;
@group(0) @binding(3) var<storage, read_write> XS: array<vec2<f32>>;
@group(0) @binding(4) var<uniform> p: NormParams;
@group(0) @binding(5) var<uniform> step: Step;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = wid.x;
    let base = t * p.n;
    let r = rms_scale(lid, base);
    let nb = p.n / 32u;
    for (var b = lid; b < nb; b += 256u) {
        let o = base + b * 32u;
        var v: array<vec4<f32>, 8>;
        var amax = vec4<f32>(0.0);
        for (var w = 0u; w < 8u; w++) {
            let i = o + 4u * w;
            let g = b * 32u + 4u * w;
            let x = vec4<f32>(X[i], X[i + 1u], X[i + 2u], X[i + 3u]) * r;
            v[w] = vec4<f32>(WEIGHT[g], WEIGHT[g + 1u], WEIGHT[g + 2u], WEIGHT[g + 3u]) * x;
            amax = max(amax, abs(v[w]));
        }
        let d = max(max(amax.x, amax.y), max(amax.z, amax.w)) / 127.0;
        let inv = select(0.0, 1.0 / d, d > 0.0);
        var sum = vec4<i32>(0);
        for (var w = 0u; w < 8u; w++) {
            let q = vec4<i32>(round(v[w] * inv));
            sum += q;
            XQ[(t * nb + b) * 8u + w] = pack4xI8(q);
        }
        XS[t * nb + b] = vec2<f32>(d, d * f32(sum.x + sum.y + sum.z + sum.w));
    }
}
