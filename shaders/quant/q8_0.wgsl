// Q8_0: blocks of 32 = f16 scale + 32 signed bytes (34 bytes).
fn dequant8(rb: u32, e: u32) -> F8 {
    let bo = rb + (e >> 5u) * 34u;
    let d = rd_f16(bo);
    let q = bo + 2u + (e & 31u);
    return F8(i8x4(rd_u32(q)) * d, i8x4(rd_u32(q + 4u)) * d);
}

// One whole block against X: nine aligned loads, funnel-shifted when the block is 2-aligned.
// The block holding element `e` (a multiple of 32): its 8 words of quants into `q`, and its
// scale (dot32 and the integer dot's dot32q share it).
fn q8_0_block(rb: u32, e: u32, q: ptr<function, array<u32, 8>>) -> f32 {
    let bo = rb + (e >> 5u) * 34u;
    words_at(bo + 2u, 8u, q);
    return rd_f16(bo);
}

fn dot32(rb: u32, e: u32, xv: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    var q: array<u32, 8>;
    let d = q8_0_block(rb, e, &q);
    var s = 0.0;
    for (var i = 0u; i < 8u; i++) {
        s += dot(i8x4(q[i]), (*xv)[i]);
    }
    return s * d;
}
