// Q4_1: blocks of 32 = f16 scale d + f16 minimum m + 16 bytes of nibbles; value q * d + m.
fn dequant8(rb: u32, e: u32) -> F8 {
    let bo = rb + (e >> 5u) * 20u;
    let d = rd_f16(bo);
    let m = rd_f16(bo + 2u);
    let w = e & 31u;
    let q = bo + 4u + (w & 15u);
    let sh = (w >> 4u) * 4u;
    return F8(nib4(rd_u32(q), sh) * d + m, nib4(rd_u32(q + 4u), sh) * d + m);
}

// Q4_1 blocks are 20 bytes, so always 4-aligned: d and m share the first word.
fn dot32(rb: u32, e: u32, xv: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    let w0 = (rb + (e >> 5u) * 20u) >> 2u;
    let dm = unpack2x16float(W[w0]);
    var s = 0.0;
    var sx = 0.0;
    for (var i = 0u; i < 4u; i++) {
        let q = W[w0 + 1u + i];
        let xa = (*xv)[i];
        let xb = (*xv)[4u + i];
        s += dot(nib4(q, 0u), xa) + dot(nib4(q, 4u), xb);
        sx += dot(xa + xb, vec4<f32>(1.0));
    }
    return s * dm.x + sx * dm.y;
}
