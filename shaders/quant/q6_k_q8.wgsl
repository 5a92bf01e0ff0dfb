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
    let sub = q6k_sub(rb, e);
    var s0 = 0i;
    var s1 = 0i;
    for (var i = 0u; i < 4u; i++) {
        s0 += dot4I8Packed(q6s(W[sub.ql + i], W[sub.qh + i], sub.nsh, sub.hsh), (*xq)[i]);
        s1 += dot4I8Packed(q6s(W[sub.ql + 4u + i], W[sub.qh + 4u + i], sub.nsh, sub.hsh), (*xq)[4u + i]);
    }
    return sub.d * xs.x * (sub.sc.x * f32(s0) + sub.sc.y * f32(s1));
}
