// Q4_0 against a Q8 block of x (matvec_q8.wgsl).

// Four nibbles of `q` (from bit `sh` of each byte) minus 8, as signed bytes: q ^ 8 is q - 8
// for q >= 8 and q + 8 below, where bit 3 is set and extending it to the top bits gives q - 8.
fn q4s(q: u32, sh: u32) -> u32 {
    let v = ((q >> sh) & 0x0f0f0f0fu) ^ 0x08080808u;
    return v | (((v >> 3u) & 0x01010101u) * 0xf0u);
}

fn dot32q(rb: u32, e: u32, xq: ptr<function, array<u32, 8>>, xs: vec2<f32>) -> f32 {
    let bo = rb + (e >> 5u) * 18u;
    let d = rd_f16(bo);
    let q0 = (bo + 2u) >> 2u;
    let odd = ((bo + 2u) & 3u) != 0u;
    var s = 0i;
    var w = W[q0];
    for (var i = 0u; i < 4u; i++) {
        let nx = W[q0 + i + 1u];
        var q = w;
        if (odd) {
            q = (w >> 16u) | (nx << 16u);
        }
        s += dot4I8Packed(q4s(q, 0u), (*xq)[i]) + dot4I8Packed(q4s(q, 4u), (*xq)[4u + i]);
        w = nx;
    }
    return f32(s) * d * xs.x;
}
