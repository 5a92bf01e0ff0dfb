// Q6_K: super-blocks of 256 = 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 signed
// scales, f16 d (210 bytes in files; 212 on the GPU, padded so every word read is aligned).
// Each half (128 elements) has four quarters of 32.
const Q6K_BYTES: u32 = 212u;

fn two4(x: u32, sh: u32) -> vec4<f32> {
    let y = x >> sh;
    return vec4<f32>(f32(y & 3u), f32((y >> 8u) & 3u), f32((y >> 16u) & 3u), f32((y >> 24u) & 3u));
}

// Signed byte `i` (0..4) of `x`.
fn sbyte(x: u32, i: u32) -> f32 {
    return f32(bitcast<i32>(x << (24u - 8u * i)) >> 24u);
}

fn dequant8(rb: u32, e: u32) -> F8 {
    let bo = rb + (e >> 8u) * Q6K_BYTES;
    let w = e & 255u;
    let n = w >> 7u;
    let qd = (w >> 5u) & 3u;
    let l0 = w & 31u;
    let ql = (bo + 64u * n + (qd & 1u) * 32u + l0) >> 2u;
    let qh = (bo + 128u + 32u * n + l0) >> 2u;
    let nsh = (qd >> 1u) * 4u;
    let hsh = 2u * qd;
    let sb = bo + 192u + 8u * n + (l0 >> 4u) + 2u * qd;
    let sc = sbyte(W[sb >> 2u], sb & 3u);
    let d = unpack2x16float(W[(bo + 208u) >> 2u]).x * sc;
    return F8(
        (nib4(W[ql], nsh) + two4(W[qh], hsh) * 16.0 - 32.0) * d,
        (nib4(W[ql + 1u], nsh) + two4(W[qh + 1u], hsh) * 16.0 - 32.0) * d,
    );
}

// One quarter (32 elements) of a half: two 16-element scales (in one word).
fn dot32(rb: u32, e: u32, xv: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    let bo = rb + (e >> 8u) * Q6K_BYTES;
    let w = e & 255u;
    let n = w >> 7u;
    let qd = (w >> 5u) & 3u;
    let ql = (bo + 64u * n + (qd & 1u) * 32u) >> 2u;
    let qh = (bo + 128u + 32u * n) >> 2u;
    let nsh = (qd >> 1u) * 4u;
    let hsh = 2u * qd;
    var s0 = 0.0;
    var s1 = 0.0;
    for (var i = 0u; i < 4u; i++) {
        s0 += dot(nib4(W[ql + i], nsh) + two4(W[qh + i], hsh) * 16.0 - 32.0, (*xv)[i]);
        s1 += dot(nib4(W[ql + 4u + i], nsh) + two4(W[qh + 4u + i], hsh) * 16.0 - 32.0, (*xv)[4u + i]);
    }
    let sb = bo + 192u + 8u * n + 2u * qd;
    let sw = W[sb >> 2u];
    let d = unpack2x16float(W[(bo + 208u) >> 2u]).x;
    return d * (sbyte(sw, sb & 3u) * s0 + sbyte(sw, (sb & 3u) + 1u) * s1);
}
