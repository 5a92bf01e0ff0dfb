// F16: halves packed two to a u32, unpacked without shader-f16.
fn dequant8(rb: u32, e: u32) -> F8 {
    let i = (rb >> 2u) + (e >> 1u);
    let a = unpack2x16float(W[i]);
    let b = unpack2x16float(W[i + 1u]);
    let c = unpack2x16float(W[i + 2u]);
    let d = unpack2x16float(W[i + 3u]);
    return F8(vec4<f32>(a, b), vec4<f32>(c, d));
}
// dot(W[row, e..e+32], xv) for the matvec kernel.
fn dot32(rb: u32, e: u32, xv: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    var s = 0.0;
    for (var i = 0u; i < 4u; i++) {
        let w = dequant8(rb, e + 8u * i);
        s += dot(w.a, (*xv)[2u * i]) + dot(w.b, (*xv)[2u * i + 1u]);
    }
    return s;
}
