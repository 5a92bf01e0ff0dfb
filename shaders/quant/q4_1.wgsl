// Q4_1: blocks of 32 = f16 scale d + f16 minimum m + 16 bytes of nibbles; value q * d + m.
fn dequant8(rb: u32, e: u32) -> F8 {
    let bo = rb + (e >> 5u) * 20u;
    let d = rd_f16(bo);
    let m = rd_f16(bo + 2u);
    let w = e & 31u;
    let q = bo + 4u + (w & 15u);
    let sh = (w >> 4u) * 4u;
    return F8(nib4(rd_u32(q), sh) * d + m, nib4(rd_u32(q + 4u), sh) * d + m);
}
