// Q5_K: as Q4_K plus 32 bytes of fifth bits (176 bytes): element l of the 64-element group g
// takes bit 2g (low half) or 2g+1 (high half) of qh[l].
fn dequant8(rb: u32, e: u32) -> F8 {
    let bo = rb + (e >> 8u) * 176u;
    let w = e & 255u;
    let g = w >> 6u;
    let hi = (w >> 5u) & 1u;
    let l0 = w & 31u;
    let dm = k_sub_dm(bo, w);
    let d = dm.x;
    let m = dm.y;
    let q = (bo + 48u + 32u * g + l0) >> 2u;
    let h = (bo + 16u + l0) >> 2u;
    let sh = hi * 4u;
    let b = 2u * g + hi;
    return F8(
        (nib4(W[q], sh) + bit4(W[h], b) * 16.0) * d - m,
        (nib4(W[q + 1u], sh) + bit4(W[h + 1u], b) * 16.0) * d - m,
    );
}

fn dot32(rb: u32, e: u32, xv: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    let bo = rb + (e >> 8u) * 176u;
    let w = e & 255u;
    let g = w >> 6u;
    let hi = (w >> 5u) & 1u;
    let dm = k_sub_dm(bo, w);
    let q0 = (bo + 48u + 32u * g) >> 2u;
    let h0 = (bo + 16u) >> 2u;
    let sh = hi * 4u;
    let b = 2u * g + hi;
    var s = 0.0;
    var sx = 0.0;
    for (var i = 0u; i < 8u; i++) {
        let x = (*xv)[i];
        s += dot(nib4(W[q0 + i], sh) + bit4(W[h0 + i], b) * 16.0, x);
        sx += dot(x, vec4<f32>(1.0));
    }
    return dm.x * s - dm.y * sx;
}
