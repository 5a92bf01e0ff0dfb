// F32: plain floats. `rb` is the row's byte offset, `e` the element index (a multiple of 8).
fn dequant8(rb: u32, e: u32) -> F8 {
    let i = (rb >> 2u) + e;
    return F8(
        bitcast<vec4<f32>>(vec4<u32>(W[i], W[i + 1u], W[i + 2u], W[i + 3u])),
        bitcast<vec4<f32>>(vec4<u32>(W[i + 4u], W[i + 5u], W[i + 6u], W[i + 7u])),
    );
}
