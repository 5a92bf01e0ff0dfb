// Q4_1 against a Q8 block of x (matvec_q8.wgsl): unsigned nibbles (valid signed bytes), the
// scale times the integer dot product plus the minimum times the block's sum (XS.y).
fn dot32q(rb: u32, e: u32, xq: ptr<function, array<u32, 8>>, xs: vec2<f32>) -> f32 {
    let w0 = (rb + (e >> 5u) * 20u) >> 2u;
    let dm = unpack2x16float(W[w0]);
    var s = 0i;
    for (var i = 0u; i < 4u; i++) {
        let q = W[w0 + 1u + i];
        s += dot4I8Packed(q & 0x0f0f0f0fu, (*xq)[i]) + dot4I8Packed((q >> 4u) & 0x0f0f0f0fu, (*xq)[4u + i]);
    }
    return dm.x * xs.x * f32(s) + dm.y * xs.y;
}
