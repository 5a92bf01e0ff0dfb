// Scale and minimum of the 32-element sub-block holding element `w` (0..256) of the Q4_K/Q5_K
// super-block at `bo` (f16 d and dmin, then 12 bytes of 6-bit scales and minimums, read as three
// aligned words): (d * sc, dmin * m).
fn k_sub_dm(bo: u32, w: u32) -> vec2<f32> {
    let i = bo >> 2u;
    let s0 = W[i + 1u];
    let s1 = W[i + 2u];
    let s2 = W[i + 3u];
    let j = w >> 5u;
    let sh = 8u * (j & 3u);
    let a = (s0 >> sh) & 0xffu;
    let b = (s1 >> sh) & 0xffu;
    var sm: vec2<u32>;
    if (j < 4u) {
        sm = vec2<u32>(a & 63u, b & 63u);
    } else {
        let c = (s2 >> sh) & 0xffu;
        sm = vec2<u32>((c & 15u) | ((a >> 6u) << 4u), (c >> 4u) | ((b >> 6u) << 4u));
    }
    return unpack2x16float(W[i]) * vec2<f32>(sm);
}
