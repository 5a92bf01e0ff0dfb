// Q6_K against a Q8 block of x (matvec_q8.wgsl): one quarter of a half, two 16-value scales.

// Four 6-bit weights (low nibbles of `ql` from bit `nsh`, high pairs of `qh` from bit `hsh`)
// minus 32, as signed bytes: q ^ 32 is q - 32 for q >= 32 and q + 32 below, where bit 5 is
// set and extending it to the top bits gives q - 32.
fn q6s(ql: u32, qh: u32, nsh: u32, hsh: u32) -> u32 {
    let q = ((ql >> nsh) & 0x0f0f0f0fu) | (((qh >> hsh) & 0x03030303u) << 4u);
    let v = q ^ 0x20202020u;
    return v | (((v >> 5u) & 0x01010101u) * 0xc0u);
}

fn dot32q(rb: u32, e: u32, xq: ptr<function, array<u32, 8>>, xs: vec2<f32>) -> f32 {
    let bo = rb + (e >> 8u) * Q6K_BYTES;
    let w = e & 255u;
    let n = w >> 7u;
    let qd = (w >> 5u) & 3u;
    let ql = (bo + 64u * n + (qd & 1u) * 32u) >> 2u;
    let qh = (bo + 128u + 32u * n) >> 2u;
    let nsh = (qd >> 1u) * 4u;
    let hsh = 2u * qd;
    var s0 = 0i;
    var s1 = 0i;
    for (var i = 0u; i < 4u; i++) {
        s0 += dot4I8Packed(q6s(W[ql + i], W[qh + i], nsh, hsh), (*xq)[i]);
        s1 += dot4I8Packed(q6s(W[ql + 4u + i], W[qh + 4u + i], nsh, hsh), (*xq)[4u + i]);
    }
    let sb = bo + 192u + 8u * n + 2u * qd;
    let sw = W[sb >> 2u];
    let d = unpack2x16float(W[(bo + 208u) >> 2u]).x;
    return d * xs.x * (sbyte(sw, sb & 3u) * f32(s0) + sbyte(sw, (sb & 3u) + 1u) * f32(s1));
}
