// Q5_0: blocks of 32 = f16 scale + u32 of fifth bits (bit i for element i) + 16 bytes of
// nibbles (as Q4_0); value (q - 16) * d (22 bytes).
fn dequant8(rb: u32, e: u32) -> F8 {
    let bo = rb + (e >> 5u) * 22u;
    let d = rd_f16(bo);
    let qh = rd_u32(bo + 2u);
    let w = e & 31u;
    let q = bo + 6u + (w & 15u);
    let sh = (w >> 4u) * 4u;
    let h0 = vec4<f32>(f32((qh >> w) & 1u), f32((qh >> (w + 1u)) & 1u), f32((qh >> (w + 2u)) & 1u), f32((qh >> (w + 3u)) & 1u));
    let h1 = vec4<f32>(f32((qh >> (w + 4u)) & 1u), f32((qh >> (w + 5u)) & 1u), f32((qh >> (w + 6u)) & 1u), f32((qh >> (w + 7u)) & 1u));
    return F8((nib4(rd_u32(q), sh) + h0 * 16.0 - 16.0) * d, (nib4(rd_u32(q + 4u), sh) + h1 * 16.0 - 16.0) * d);
}

fn dot32(rb: u32, e: u32, xv: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    let bo = rb + (e >> 5u) * 22u;
    let d = rd_f16(bo);
    let qh = rd_u32(bo + 2u);
    var s = 0.0;
    for (var i = 0u; i < 4u; i++) {
        let q = rd_u32(bo + 6u + 4u * i);
        let lo = nib4(q, 0u) + 16.0 * vec4<f32>(f32((qh >> (4u * i)) & 1u), f32((qh >> (4u * i + 1u)) & 1u), f32((qh >> (4u * i + 2u)) & 1u), f32((qh >> (4u * i + 3u)) & 1u));
        let hb = 16u + 4u * i;
        let hi = nib4(q, 4u) + 16.0 * vec4<f32>(f32((qh >> hb) & 1u), f32((qh >> (hb + 1u)) & 1u), f32((qh >> (hb + 2u)) & 1u), f32((qh >> (hb + 3u)) & 1u));
        s += dot(lo - 16.0, (*xv)[i]) + dot(hi - 16.0, (*xv)[4u + i]);
    }
    return s * d;
}
