// Q4_K against a Q8 block of x (matvec_q8.wgsl): one sub-block of 8 aligned words of nibbles
// (unsigned, 0..15, so valid signed bytes), its scale times the integer dot product minus its
// minimum times the block's sum (XS.y).
fn dot32q(rb: u32, e: u32, xq: ptr<function, array<u32, 8>>, xs: vec2<f32>) -> f32 {
    let sub = q4k_sub(rb, e);
    var s = 0i;
    for (var i = 0u; i < 8u; i++) {
        s += dot4I8Packed((W[sub.q0 + i] >> sub.sh) & 0x0f0f0f0fu, (*xq)[i]);
    }
    return sub.dm.x * xs.x * f32(s) - sub.dm.y * xs.y;
}
