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

// The 32-element sub-block (a quarter of a half) holding element `e`: the first of its words
// of low nibbles (`ql`) and of high 2-bit pairs (`qh`), their shifts in those words, the
// super-block's d and the scales of the sub-block's two 16-element halves (in one word).
// dequant8, dot32 and the integer dot's dot32q share it.
struct Q6kSub {
    ql: u32,
    qh: u32,
    nsh: u32,
    hsh: u32,
    d: f32,
    sc: vec2<f32>,
}

fn q6k_sub(rb: u32, e: u32) -> Q6kSub {
    let bo = rb + (e >> 8u) * Q6K_BYTES;
    let w = e & 255u;
    let n = w >> 7u;
    let qd = (w >> 5u) & 3u;
    let sb = bo + 192u + 8u * n + 2u * qd;
    let sw = W[sb >> 2u];
    return Q6kSub(
        (bo + 64u * n + (qd & 1u) * 32u) >> 2u,
        (bo + 128u + 32u * n) >> 2u,
        (qd >> 1u) * 4u,
        2u * qd,
        unpack2x16float(W[(bo + 208u) >> 2u]).x,
        vec2<f32>(sbyte(sw, sb & 3u), sbyte(sw, (sb & 3u) + 1u)),
    );
}

fn dequant8(rb: u32, e: u32) -> F8 {
    let s = q6k_sub(rb, e);
    let l0 = e & 31u;
    let ql = s.ql + (l0 >> 2u);
    let qh = s.qh + (l0 >> 2u);
    let d = s.d * select(s.sc.x, s.sc.y, l0 >= 16u);
    return F8(
        (nib4(W[ql], s.nsh) + two4(W[qh], s.hsh) * 16.0 - 32.0) * d,
        (nib4(W[ql + 1u], s.nsh) + two4(W[qh + 1u], s.hsh) * 16.0 - 32.0) * d,
    );
}

fn dot32(rb: u32, e: u32, xv: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    let sub = q6k_sub(rb, e);
    var s0 = 0.0;
    var s1 = 0.0;
    for (var i = 0u; i < 4u; i++) {
        s0 += dot(nib4(W[sub.ql + i], sub.nsh) + two4(W[sub.qh + i], sub.hsh) * 16.0 - 32.0, (*xv)[i]);
        s1 += dot(nib4(W[sub.ql + 4u + i], sub.nsh) + two4(W[sub.qh + 4u + i], sub.hsh) * 16.0 - 32.0, (*xv)[4u + i]);
    }
    return sub.d * (sub.sc.x * s0 + sub.sc.y * s1);
}
