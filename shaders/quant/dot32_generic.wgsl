// dot(W[row, e..e+32], xv) for the matvec kernel, from dequant8: the float types (F32, F16,
// BF16), whose elements need no shared scale.
fn dot32(rb: u32, e: u32, xv: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    var s = 0.0;
    for (var i = 0u; i < 4u; i++) {
        let w = dequant8(rb, e + 8u * i);
        s += dot(w.a, (*xv)[2u * i]) + dot(w.b, (*xv)[2u * i + 1u]);
    }
    return s;
}
