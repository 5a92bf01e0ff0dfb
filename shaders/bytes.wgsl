// Byte access into a weight buffer `W: array<u32>` that keeps llama.cpp's block layouts, whose
// blocks are not always 4-byte aligned (Q4_0 is 18 bytes, Q6_K 210). Prepended to every kernel
// that reads weights; the kernel declares `W`. Buffers carry 4 bytes of padding so the unaligned
// read of the last word stays in bounds.

struct F8 {
    a: vec4<f32>,
    b: vec4<f32>,
}

fn rd_u8(b: u32) -> u32 {
    return (W[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
}

// `b` must be even.
fn rd_u16(b: u32) -> u32 {
    return (W[b >> 2u] >> ((b & 2u) * 8u)) & 0xffffu;
}

fn rd_u32(b: u32) -> u32 {
    let i = b >> 2u;
    let s = (b & 3u) * 8u;
    if (s == 0u) {
        return W[i];
    }
    return (W[i] >> s) | (W[i + 1u] << (32u - s));
}

// `n` (at most 8) 32-bit words starting at byte `b` (even) into `q`: whole words, or two
// halves joined where `b` is 2 bytes past a word (Q8_0's and Q4_0's quants).
fn words_at(b: u32, n: u32, q: ptr<function, array<u32, 8>>) {
    let q0 = b >> 2u;
    let odd = (b & 2u) != 0u;
    var w = W[q0];
    for (var i = 0u; i < n; i++) {
        let nx = W[q0 + i + 1u];
        (*q)[i] = select(w, (w >> 16u) | (nx << 16u), odd);
        w = nx;
    }
}

fn rd_f16(b: u32) -> f32 {
    return unpack2x16float(rd_u16(b)).x;
}

// Four 4-bit fields of `x` starting at bit `sh`, one per byte.
fn nib4(x: u32, sh: u32) -> vec4<f32> {
    let y = x >> sh;
    return vec4<f32>(f32(y & 15u), f32((y >> 8u) & 15u), f32((y >> 16u) & 15u), f32((y >> 24u) & 15u));
}

// The four bytes of `x` as signed integers.
fn i8x4(x: u32) -> vec4<f32> {
    return vec4<f32>(
        f32(bitcast<i32>(x << 24u) >> 24u),
        f32(bitcast<i32>(x << 16u) >> 24u),
        f32(bitcast<i32>(x << 8u) >> 24u),
        f32(bitcast<i32>(x) >> 24u),
    );
}

// Bit `i` of each byte of `x`, as 0 or 1.
fn bit4(x: u32, i: u32) -> vec4<f32> {
    let y = x >> i;
    return vec4<f32>(f32(y & 1u), f32((y >> 8u) & 1u), f32((y >> 16u) & 1u), f32((y >> 24u) & 1u));
}
