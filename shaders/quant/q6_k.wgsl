// Q6_K: super-blocks of 256 = 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 signed
// scales, f16 d (210 bytes). Each half (128 elements) has four quarters of 32.
fn two4(x: u32, sh: u32) -> vec4<f32> {
    let y = x >> sh;
    return vec4<f32>(f32(y & 3u), f32((y >> 8u) & 3u), f32((y >> 16u) & 3u), f32((y >> 24u) & 3u));
}

fn dequant8(rb: u32, e: u32) -> F8 {
    let bo = rb + (e >> 8u) * 210u;
    let w = e & 255u;
    let n = w >> 7u;
    let qd = (w >> 5u) & 3u;
    let l0 = w & 31u;
    let ql = bo + 64u * n + (qd & 1u) * 32u + l0;
    let qh = bo + 128u + 32u * n + l0;
    let nsh = (qd >> 1u) * 4u;
    let hsh = 2u * qd;
    let sc = f32(bitcast<i32>(rd_u8(bo + 192u + 8u * n + (l0 >> 4u) + 2u * qd) << 24u) >> 24u);
    let d = rd_f16(bo + 208u) * sc;
    return F8(
        (nib4(rd_u32(ql), nsh) + two4(rd_u32(qh), hsh) * 16.0 - 32.0) * d,
        (nib4(rd_u32(ql + 4u), nsh) + two4(rd_u32(qh + 4u), hsh) * 16.0 - 32.0) * d,
    );
}

// One quarter (32 elements) of a half: two 16-element scales.
fn dot32(rb: u32, e: u32, xv: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    let bo = rb + (e >> 8u) * 210u;
    let w = e & 255u;
    let n = w >> 7u;
    let qd = (w >> 5u) & 3u;
    let ql = bo + 64u * n + (qd & 1u) * 32u;
    let qh = bo + 128u + 32u * n;
    let nsh = (qd >> 1u) * 4u;
    let hsh = 2u * qd;
    let sc = bo + 192u + 8u * n + 2u * qd;
    var s0 = 0.0;
    var s1 = 0.0;
    for (var i = 0u; i < 4u; i++) {
        s0 += dot(nib4(rd_u32(ql + 4u * i), nsh) + two4(rd_u32(qh + 4u * i), hsh) * 16.0 - 32.0, (*xv)[i]);
        s1 += dot(nib4(rd_u32(ql + 16u + 4u * i), nsh) + two4(rd_u32(qh + 16u + 4u * i), hsh) * 16.0 - 32.0, (*xv)[4u + i]);
    }
    let d = rd_f16(bo + 208u);
    let c0 = f32(bitcast<i32>(rd_u8(sc) << 24u) >> 24u);
    let c1 = f32(bitcast<i32>(rd_u8(sc + 1u) << 24u) >> 24u);
    return d * (c0 * s0 + c1 * s1);
}
