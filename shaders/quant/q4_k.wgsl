// Q4_K: super-blocks of 256 = f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of
// nibbles (144 bytes). Each 64 elements use 32 bytes: low nibbles first, then high nibbles.
fn dequant8(rb: u32, e: u32) -> F8 {
    let bo = rb + (e >> 8u) * 144u;
    let w = e & 255u;
    let g = w >> 6u;
    let hi = (w >> 5u) & 1u;
    let l0 = w & 31u;
    let dm = k_sub_dm(bo, w);
    let d = dm.x;
    let m = dm.y;
    let q = bo + 16u + 32u * g + l0;
    let sh = hi * 4u;
    return F8(nib4(W[q >> 2u], sh) * d - m, nib4(W[(q >> 2u) + 1u], sh) * d - m);
}

// One 32-element sub-block: 8 aligned words of nibbles, one scale and one minimum.
fn dot32(rb: u32, e: u32, xv: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    let bo = rb + (e >> 8u) * 144u;
    let w = e & 255u;
    let g = w >> 6u;
    let hi = (w >> 5u) & 1u;
    let dm = k_sub_dm(bo, w);
    let q0 = (bo + 16u + 32u * g) >> 2u;
    let sh = hi * 4u;
    var s = 0.0;
    var sx = 0.0;
    for (var i = 0u; i < 8u; i++) {
        let x = (*xv)[i];
        s += dot(nib4(W[q0 + i], sh), x);
        sx += dot(x, vec4<f32>(1.0));
    }
    return dm.x * s - dm.y * sx;
}
