// Writing quantized cache rows (prepended to the kernels that store keys and values, after
// kv_types.wgsl; they bind the caches as KC and VC, u32 words). A thread writes a pair of
// blocks, 2 * pair and 2 * pair + 1, so that the word holding their two scales has one writer.

// Quantizes block `blk` of the row at word `base` into K's cache (`is_k`) or V's; returns its
// scale.
fn kv_put_block(is_k: bool, base: u32, blk: u32, x: array<f32, 32>) -> f32 {
    let q = kv_quant(x);
    let bw = kv_block_words();
    for (var w = 0u; w < bw; w++) {
        let o = base + blk * bw + w;
        if (is_k) {
            KC[o] = q.w[w];
        } else {
            VC[o] = q.w[w];
        }
    }
    return q.d;
}

// Stores the scales of blocks 2 * pair and 2 * pair + 1 of a row of `vals` values at word `base`.
fn kv_put_scales(is_k: bool, base: u32, vals: u32, pair: u32, d: vec2<f32>) {
    let o = base + kv_code_words(vals) + pair;
    if (is_k) {
        KC[o] = pack_f16(d);
    } else {
        VC[o] = pack_f16(d);
    }
}
