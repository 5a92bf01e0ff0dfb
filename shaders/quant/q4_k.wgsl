// Q4_K: super-blocks of 256 = f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of
// nibbles (144 bytes). Each 64 elements use 32 bytes: low nibbles first, then high nibbles.
// The 32-element sub-block holding element `e`: its scale and minimum (d * sc, dmin * m), the
// first of its 8 aligned words of nibbles, and the nibbles' shift in those words (each 64
// elements share 32 bytes: low nibbles, then high). dequant8, dot32 and the integer dot's
// dot32q share it.
struct Q4kSub {
    dm: vec2<f32>,
    q0: u32,
    sh: u32,
}

fn q4k_sub(rb: u32, e: u32) -> Q4kSub {
    let bo = rb + (e >> 8u) * 144u;
    let w = e & 255u;
    return Q4kSub(k_sub_dm(bo, w), (bo + 16u + 32u * (w >> 6u)) >> 2u, ((w >> 5u) & 1u) * 4u);
}

fn dequant8(rb: u32, e: u32) -> F8 {
    let s = q4k_sub(rb, e);
    let q = s.q0 + ((e & 31u) >> 2u);
    return F8(nib4(W[q], s.sh) * s.dm.x - s.dm.y, nib4(W[q + 1u], s.sh) * s.dm.x - s.dm.y);
}

fn dot32(rb: u32, e: u32, xv: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    let sub = q4k_sub(rb, e);
    var s = 0.0;
    var sx = 0.0;
    for (var i = 0u; i < 8u; i++) {
        let x = (*xv)[i];
        s += dot(nib4(W[sub.q0 + i], sub.sh), x);
        sx += dot(x, vec4<f32>(1.0));
    }
    return sub.dm.x * s - sub.dm.y * sx;
}
