// F32: plain floats. `rb` is the row's byte offset, `e` the element index (a multiple of 8).
fn dequant8(rb: u32, e: u32) -> F8 {
    let i = (rb >> 2u) + e;
    return F8(
        bitcast<vec4<f32>>(vec4<u32>(W[i], W[i + 1u], W[i + 2u], W[i + 3u])),
        bitcast<vec4<f32>>(vec4<u32>(W[i + 4u], W[i + 5u], W[i + 6u], W[i + 7u])),
    );
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
