// Declarations shared by every kernel (prepended to each).

// What changes per forward pass: written once per step by the engine.
struct Step {
    t: u32, // tokens in this pass (or logit rows, for the output head)
    splits: u32, // context slices of split decode attention (attn_split.wgsl)
    span: u32,   // keys per slice

    _c: u32,
}

// A weight matrix chunk (matvec, matmul, embedding).
struct MatParams {
    n: u32,          // rows in this weight chunk
    k: u32,          // columns
    row_bytes: u32,  // bytes per row in the weight's block layout
    out_off: u32,    // first output row of this chunk (embedding: first vocabulary row)
    out_stride: u32, // output row stride (all rows of the full matrix)
    split1: u32,     // fused Q/K/V: first row written to Y2 (else past the last row)
    split2: u32,     // fused Q/K/V: first row written to Y3 (else past the last row)
    stride2: u32,    // row stride of Y2 and Y3
    eps: f32,        // matvec with NORM: the RMSNorm epsilon
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

// Two f32 as f16 in one u32 (the f16 KV cache). pack2x16float is indeterminate beyond f16's
// range, so values are clamped to +-65504 first: a cache entry is never Inf or garbage.
fn pack_f16(v: vec2<f32>) -> u32 {
    return pack2x16float(clamp(v, vec2<f32>(-65504.0), vec2<f32>(65504.0)));
}
