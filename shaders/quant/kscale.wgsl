// The 6-bit scale and minimum `j` (0..8) of a Q4_K/Q5_K block whose 12 scale bytes start at `s`.
fn k_scale_min(s: u32, j: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(rd_u8(s + j) & 63u), f32(rd_u8(s + j + 4u) & 63u));
    }
    let sc = (rd_u8(s + j + 4u) & 15u) | ((rd_u8(s + j - 4u) >> 6u) << 4u);
    let mn = (rd_u8(s + j + 4u) >> 4u) | ((rd_u8(s + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(mn));
}

// Scale and minimum of the 32-element sub-block holding element `w` (0..256) of the Q4_K/Q5_K
// super-block at `bo` (f16 d and dmin, then 12 bytes of 6-bit scales): (d * sc, dmin * m).
fn k_sub_dm(bo: u32, w: u32) -> vec2<f32> {
    let sm = k_scale_min(bo + 4u, w >> 5u);
    return unpack2x16float(W[bo >> 2u]) * sm;
}
