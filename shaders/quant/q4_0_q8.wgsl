// Q4_0 against a Q8 block of x (matvec_q8.wgsl).

// Four nibbles of `q` (from bit `sh` of each byte) minus 8, as signed bytes: q ^ 8 is q - 8
// for q >= 8 and q + 8 below, where bit 3 is set and extending it to the top bits gives q - 8.
fn q4s(q: u32, sh: u32) -> u32 {
    let v = ((q >> sh) & 0x0f0f0f0fu) ^ 0x08080808u;
    return v | (((v >> 3u) & 0x01010101u) * 0xf0u);
}

fn dot32q(rb: u32, e: u32, xq: ptr<function, array<u32, 8>>, xs: vec2<f32>) -> f32 {
    var q: array<u32, 8>;
    let d = q4_0_block(rb, e, &q);
    var s = 0i;
    for (var i = 0u; i < 4u; i++) {
        s += dot4I8Packed(q4s(q[i], 0u), (*xq)[i]) + dot4I8Packed(q4s(q[i], 4u), (*xq)[4u + i]);
    }
    return f32(s) * d * xs.x;
}
