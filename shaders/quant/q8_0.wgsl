// Q8_0: blocks of 32 = f16 scale + 32 signed bytes (34 bytes).
fn dequant8(rb: u32, e: u32) -> F8 {
    let bo = rb + (e >> 5u) * 34u;
    let d = rd_f16(bo);
    let q = bo + 2u + (e & 31u);
    return F8(i8x4(rd_u32(q)) * d, i8x4(rd_u32(q + 4u)) * d);
}

// One whole block against X: nine aligned loads, funnel-shifted when the block is 2-aligned.
fn dot32(rb: u32, e: u32, xv: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    let bo = rb + (e >> 5u) * 34u;
    let d = rd_f16(bo);
    let q0 = (bo + 2u) >> 2u;
    let odd = ((bo + 2u) & 3u) != 0u;
    var s = 0.0;
    var w = W[q0];
    for (var i = 0u; i < 8u; i++) {
        let nx = W[q0 + i + 1u];
        var q = w;
        if (odd) {
            q = (w >> 16u) | (nx << 16u);
        }
        s += dot(i8x4(q), (*xv)[i]);
        w = nx;
    }
    return s * d;
}
