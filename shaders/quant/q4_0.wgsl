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

fn dot32(rb: u32, e: u32, xv: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    let bo = rb + (e >> 5u) * 18u;
    let d = rd_f16(bo);
    let q0 = (bo + 2u) >> 2u;
    let odd = ((bo + 2u) & 3u) != 0u;
    var s = 0.0;
    var w = W[q0];
    for (var i = 0u; i < 4u; i++) {
        let nx = W[q0 + i + 1u];
        var q = w;
        if (odd) {
            q = (w >> 16u) | (nx << 16u);
        }
        s += dot(nib4(q, 0u) - 8.0, (*xv)[i]) + dot(nib4(q, 4u) - 8.0, (*xv)[4u + i]);
        w = nx;
    }
    return s * d;
}
