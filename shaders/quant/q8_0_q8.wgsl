// Q8_0 against a Q8 block of x (matvec_q8.wgsl): nine aligned loads, funnel-shifted when the
// block is 2-aligned, then one dot4I8Packed per word.
fn dot32q(rb: u32, e: u32, xq: ptr<function, array<u32, 8>>, xs: vec2<f32>) -> f32 {
    let bo = rb + (e >> 5u) * 34u;
    let d = rd_f16(bo);
    let q0 = (bo + 2u) >> 2u;
    let odd = ((bo + 2u) & 3u) != 0u;
    var s = 0i;
    var w = W[q0];
    for (var i = 0u; i < 8u; i++) {
        let nx = W[q0 + i + 1u];
        var q = w;
        if (odd) {
            q = (w >> 16u) | (nx << 16u);
        }
        s += dot4I8Packed(q, (*xq)[i]);
        w = nx;
    }
    return f32(s) * d * xs.x;
}
