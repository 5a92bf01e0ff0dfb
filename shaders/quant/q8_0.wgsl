// Q8_0: blocks of 32 = f16 scale + 32 signed bytes (34 bytes).
fn dequant8(rb: u32, e: u32) -> F8 {
    let bo = rb + (e >> 5u) * 34u;
    let d = rd_f16(bo);
    let q = bo + 2u + (e & 31u);
    return F8(i8x4(rd_u32(q)) * d, i8x4(rd_u32(q + 4u)) * d);
}
