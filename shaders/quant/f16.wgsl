// F16: halves packed two to a u32, unpacked without shader-f16.
fn dequant8(rb: u32, e: u32) -> F8 {
    let i = (rb >> 2u) + (e >> 1u);
    let a = unpack2x16float(W[i]);
    let b = unpack2x16float(W[i + 1u]);
    let c = unpack2x16float(W[i + 2u]);
    let d = unpack2x16float(W[i + 3u]);
    return F8(vec4<f32>(a, b), vec4<f32>(c, d));
}
