// BF16: the high half of an f32, two to a u32.
fn bf2(w: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xffff0000u));
}

fn dequant8(rb: u32, e: u32) -> F8 {
    let i = (rb >> 2u) + (e >> 1u);
    return F8(vec4<f32>(bf2(W[i]), bf2(W[i + 1u])), vec4<f32>(bf2(W[i + 2u]), bf2(W[i + 3u])));
}
