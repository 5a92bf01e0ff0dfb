// Q4_0: blocks of 32 = f16 scale + 16 bytes; element j < 16 is the low nibble of byte j,
// element j + 16 its high nibble; value (q - 8) * d (18 bytes).
fn dequant8(rb: u32, e: u32) -> F8 {
    let bo = rb + (e >> 5u) * 18u;
    let d = rd_f16(bo);
    let w = e & 31u;
    let q = bo + 2u + (w & 15u);
    let sh = (w >> 4u) * 4u;
    return F8((nib4(rd_u32(q), sh) - 8.0) * d, (nib4(rd_u32(q + 4u), sh) - 8.0) * d);
}

// The block holding element `e` (a multiple of 32): its 4 words of nibbles into `q` (element
// i in the low nibble of byte i, element 16 + i in its high nibble), and its scale (dot32 and
// the integer dot's dot32q share it).
fn q4_0_block(rb: u32, e: u32, q: ptr<function, array<u32, 8>>) -> f32 {
    let bo = rb + (e >> 5u) * 18u;
    words_at(bo + 2u, 4u, q);
    return rd_f16(bo);
}

fn dot32(rb: u32, e: u32, xv: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    var q: array<u32, 8>;
    let d = q4_0_block(rb, e, &q);
    var s = 0.0;
    for (var i = 0u; i < 4u; i++) {
        s += dot(nib4(q[i], 0u) - 8.0, (*xv)[i]) + dot(nib4(q[i], 4u) - 8.0, (*xv)[4u + i]);
    }
    return s * d;
}
