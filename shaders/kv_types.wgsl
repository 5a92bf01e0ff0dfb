// The KV cache's storage types (prepended to the kernels that write or read the cache). A cache
// row is one token's keys (or values) for the KV heads of one buffer, in u32 words:
//   KV_TYPE 0, f32: one value a word (its bits);
//   KV_TYPE 1, f16: two values a word (pack2x16float, clamped to f16's range);
//   KV_TYPE 2, q8_0 and 3, q4_0: blocks of 32 values quantized as llama.cpp does, the row's codes
//     first (q8_0: 4 signed bytes a word; q4_0: 8 nibbles a word, value = nibble - 8; in value
//     order, low bits first), then each block's f16 scale, two a word, the row padded to whole
//     vec4s (src/gpu/session/kv.rs has the sizes). A quantized block holds its 32 values rotated
//     by the normalised Walsh-Hadamard transform (`kv_hadamard`): an outlier's weight spreads over
//     the block, so the block's scale no longer crushes its other values. The transform is
//     orthonormal and its own inverse, so attention rotates the query's blocks the same way (the
//     dot products are unchanged) and rotates its weighted sum of value rows back.

override KV_TYPE: u32 = 1u;

fn kv_quantized() -> bool {
    return KV_TYPE >= 2u;
}

// Words of a row of `vals` values (an even number; a multiple of 32 for quantized types).
fn kv_row_words(vals: u32) -> u32 {
    switch KV_TYPE {
        case 0u: {
            return vals;
        }
        case 1u: {
            return vals / 2u;
        }
        default: {
            return kv_code_words(vals) + ((((vals + 63u) / 64u) + 3u) & ~3u);
        }
    }
}

// Words of codes in a row of `vals` values (a quantized type).
fn kv_code_words(vals: u32) -> u32 {
    return select(vals / 8u, vals / 4u, KV_TYPE == 2u);
}

// Code words of one 32-value block.
fn kv_block_words() -> u32 {
    return select(4u, 8u, KV_TYPE == 2u);
}

// The four signed bytes of a q8_0 word, as f32.
fn kv_q8(w: u32) -> vec4<f32> {
    let b = vec4<i32>(bitcast<i32>(w << 24u), bitcast<i32>(w << 16u), bitcast<i32>(w << 8u), bitcast<i32>(w));
    return vec4<f32>(b >> vec4<u32>(24u));
}

// Nibbles 4h .. 4h + 3 of a q4_0 word (h 0 or 1), as values (nibble - 8).
fn kv_q4(w: u32, h: u32) -> vec4<f32> {
    let s = 16u * h;
    return vec4<f32>((vec4<u32>(w) >> vec4<u32>(s, s + 4u, s + 8u, s + 12u)) & vec4<u32>(15u)) - 8.0;
}

// The codes of one value (index `i` within its row) in its code word, as a value times 1/scale.
fn kv_code(w: u32, i: u32) -> f32 {
    if (KV_TYPE == 2u) {
        return f32(bitcast<i32>(w << (24u - 8u * (i & 3u))) >> 24u);
    }
    return f32((w >> (4u * (i & 7u))) & 15u) - 8.0;
}

// Values i, i + 1 (i even) of a row, from their code word and the block's scale.
fn kv_code_pair(w: u32, i: u32, d: f32) -> vec2<f32> {
    return vec2<f32>(kv_code(w, i), kv_code(w, i + 1u)) * d;
}

// Scale of block `b` from its scale word (two f16 a word).
fn kv_scale(w: u32, b: u32) -> f32 {
    return unpack2x16float(w)[b & 1u];
}

// llama.cpp's roundf: halves away from zero.
fn kv_round(x: f32) -> f32 {
    return sign(x) * floor(abs(x) + 0.5);
}

// One 32-value block quantized: its code words (8 for q8_0, the first 4 for q4_0) and its scale.
struct KvBlock {
    w: array<u32, 8>,
    d: f32,
}

fn kv_quant(x0: array<f32, 32>) -> KvBlock {
    let x = kv_hadamard(x0);
    var b: KvBlock;
    if (KV_TYPE == 2u) {
        // q8_0: d = max|x| / 127, codes round(x / d).
        var amax = 0.0;
        for (var i = 0u; i < 32u; i++) {
            amax = max(amax, abs(x[i]));
        }
        let d = amax / 127.0;
        let id = select(0.0, 1.0 / d, d > 0.0);
        for (var w = 0u; w < 8u; w++) {
            var word = 0u;
            for (var k = 0u; k < 4u; k++) {
                let q = i32(kv_round(x[4u * w + k] * id));
                word |= (bitcast<u32>(q) & 255u) << (8u * k);
            }
            b.w[w] = word;
        }
        b.d = d;
    } else {
        // q4_0: d = (the value of largest magnitude) / -8, codes min(15, trunc(x / d + 8.5)).
        var amax = 0.0;
        var mx = 0.0;
        for (var i = 0u; i < 32u; i++) {
            if (abs(x[i]) > amax) {
                amax = abs(x[i]);
                mx = x[i];
            }
        }
        let d = mx / -8.0;
        let id = select(0.0, 1.0 / d, d != 0.0);
        for (var w = 0u; w < 4u; w++) {
            var word = 0u;
            for (var k = 0u; k < 8u; k++) {
                let q = min(15u, u32(max(x[8u * w + k] * id + 8.5, 0.0)));
                word |= q << (4u * k);
            }
            b.w[w] = word;
        }
        b.d = d;
    }
    return b;
}

// 1 / sqrt(32): the normalisation of the 32-point Walsh-Hadamard transform.
const KV_H: f32 = 0.17677669529663687;

// The normalised Walsh-Hadamard transform of a block (its own inverse): y[j] = sum over k of
// (-1)^popcount(j & k) x[k] / sqrt(32), as five butterfly stages.
fn kv_hadamard(x: array<f32, 32>) -> array<f32, 32> {
    var y = x;
    for (var h = 1u; h < 32u; h <<= 1u) {
        for (var i = 0u; i < 32u; i++) {
            if ((i & h) == 0u) {
                let a = y[i];
                let b = y[i + h];
                y[i] = a + b;
                y[i + h] = a - b;
            }
        }
    }
    for (var i = 0u; i < 32u; i++) {
        y[i] *= KV_H;
    }
    return y;
}

// The transform's sign for output j and input k (both within the block).
fn kv_hsign(j: u32, k: u32) -> f32 {
    return 1.0 - 2.0 * f32(countOneBits(j & k) & 1u);
}

// The four signs of inputs 4m .. 4m + 3 for output j.
fn kv_hsign4(j: u32, m: u32) -> vec4<f32> {
    return vec4<f32>(kv_hsign(j, 4u * m), kv_hsign(j, 4u * m + 1u), kv_hsign(j, 4u * m + 2u), kv_hsign(j, 4u * m + 3u));
}
