// Q8_0 against a Q8 block of x (matvec_q8.wgsl): nine aligned loads, funnel-shifted when the
// block is 2-aligned, then one dot4I8Packed per word.
fn dot32q(rb: u32, e: u32, xq: ptr<function, array<u32, 8>>, xs: vec2<f32>) -> f32 {
    var q: array<u32, 8>;
    let d = q8_0_block(rb, e, &q);
    var s = 0i;
    for (var i = 0u; i < 8u; i++) {
        s += dot4I8Packed(q[i], (*xq)[i]);
    }
    return f32(s) * d * xs.x;
}
