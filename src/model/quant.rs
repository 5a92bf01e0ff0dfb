//! Tensor element types as they live on the GPU (GGUF/ggml block layouts), with host-side
//! dequantization (for checks) and load-time quantization of HF checkpoints.

use crate::error::{Error, Result};
use half::{bf16, f16};

/// A tensor type, in llama.cpp's block layout. On the GPU every matrix keeps this layout and the
/// kernels dequantize it on the fly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

impl GgmlType {
    /// From the GGUF `ggml_type` id.
    pub fn from_gguf(id: u32) -> Result<Self> {
        Ok(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            8 => Self::Q8_0,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            30 => Self::BF16,
            other => {
                let name = match other {
                    7 => "Q5_1",
                    9 => "Q8_1",
                    10 => "Q2_K",
                    11 => "Q3_K",
                    15 => "Q8_K",
                    16..=23 | 29 => "an IQ type",
                    _ => "an unknown type",
                };
                return Err(Error::Unsupported(format!(
                    "tensor type {name} (ggml id {other}); supported: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q4_K Q5_K Q6_K"
                )));
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q8_0 => "Q8_0",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
        }
    }

    /// Elements per block.
    pub fn block_elems(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q8_0 => 32,
            Self::Q4K | Self::Q5K | Self::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q8_0 => 34,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
        }
    }

    /// Bytes of one row of `cols` elements, or an error if `cols` is not whole blocks.
    pub fn row_bytes(self, cols: usize) -> Result<usize> {
        if !cols.is_multiple_of(self.block_elems()) {
            return Err(Error::Shape(format!(
                "row of {cols} elements is not a whole number of {} blocks",
                self.name()
            )));
        }
        Ok(cols / self.block_elems() * self.block_bytes())
    }

    /// Bytes per block on the GPU: the file's block, padded to whole 4-byte words where that
    /// costs little (Q6_K: 210 -> 212 bytes, so every word the kernels read is aligned).
    pub fn gpu_block_bytes(self) -> usize {
        match self {
            Self::Q6K => 212,
            t => t.block_bytes(),
        }
    }

    /// [`GgmlType::row_bytes`] in the GPU layout.
    pub fn gpu_row_bytes(self, cols: usize) -> Result<usize> {
        Ok(self.row_bytes(cols)? / self.block_bytes() * self.gpu_block_bytes())
    }

    /// Blocks in the file's layout (whole blocks) rewritten in the GPU layout (a copy only for
    /// the types that are padded).
    pub fn to_gpu_layout(self, data: &[u8]) -> std::borrow::Cow<'_, [u8]> {
        let (b, g) = (self.block_bytes(), self.gpu_block_bytes());
        if b == g {
            return std::borrow::Cow::Borrowed(data);
        }
        let mut out = vec![0u8; data.len() / b * g];
        for (src, dst) in data.chunks_exact(b).zip(out.chunks_exact_mut(g)) {
            dst[..b].copy_from_slice(src);
        }
        std::borrow::Cow::Owned(out)
    }

    /// The WGSL source of this type's `dequant8` and, for block types, `dot32` (the float
    /// types share `dot32_generic.wgsl`).
    pub fn wgsl(self) -> &'static str {
        match self {
            Self::F32 => include_str!("../../shaders/quant/f32.wgsl"),
            Self::F16 => include_str!("../../shaders/quant/f16.wgsl"),
            Self::BF16 => include_str!("../../shaders/quant/bf16.wgsl"),
            Self::Q4_0 => include_str!("../../shaders/quant/q4_0.wgsl"),
            Self::Q4_1 => include_str!("../../shaders/quant/q4_1.wgsl"),
            Self::Q5_0 => include_str!("../../shaders/quant/q5_0.wgsl"),
            Self::Q8_0 => include_str!("../../shaders/quant/q8_0.wgsl"),
            Self::Q4K => include_str!("../../shaders/quant/q4_k.wgsl"),
            Self::Q5K => include_str!("../../shaders/quant/q5_k.wgsl"),
            Self::Q6K => include_str!("../../shaders/quant/q6_k.wgsl"),
        }
    }

    pub const ALL: [GgmlType; 10] = [
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q8_0,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
    ];
}

fn h(b: &[u8], o: usize) -> f32 {
    f16::from_le_bytes([b[o], b[o + 1]]).to_f32()
}

fn k_scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Dequantizes one row (host side, llama.cpp's reference formulas).
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut Vec<f32>) {
    let bb = ty.block_bytes();
    for b in src.chunks_exact(bb) {
        match ty {
            GgmlType::F32 => out.push(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            GgmlType::F16 => out.push(h(b, 0)),
            GgmlType::BF16 => out.push(bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            GgmlType::Q4_0 | GgmlType::Q4_1 => {
                let d = h(b, 0);
                let (m, qs) = if ty == GgmlType::Q4_1 { (h(b, 2), &b[4..20]) } else { (-8.0 * d, &b[2..18]) };
                let base = out.len();
                out.resize(base + 32, 0.0);
                for j in 0..16 {
                    out[base + j] = (qs[j] & 0xF) as f32 * d + m;
                    out[base + j + 16] = (qs[j] >> 4) as f32 * d + m;
                }
            }
            GgmlType::Q5_0 => {
                let d = h(b, 0);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let qs = &b[6..22];
                let base = out.len();
                out.resize(base + 32, 0.0);
                for j in 0..16 {
                    let h0 = ((qh >> j) << 4) & 0x10;
                    let h1 = (qh >> (j + 12)) & 0x10;
                    out[base + j] = (((qs[j] as u32 & 0xF) | h0) as i32 - 16) as f32 * d;
                    out[base + j + 16] = (((qs[j] as u32 >> 4) | h1) as i32 - 16) as f32 * d;
                }
            }
            GgmlType::Q8_0 => {
                let d = h(b, 0);
                out.extend(b[2..34].iter().map(|&q| q as i8 as f32 * d));
            }
            GgmlType::Q4K | GgmlType::Q5K => {
                let d = h(b, 0);
                let dmin = h(b, 2);
                let scales = &b[4..16];
                let (qh, ql) = if ty == GgmlType::Q5K { (&b[16..48], &b[48..176]) } else { (&b[0..0], &b[16..144]) };
                for g in 0..4 {
                    let (s1, m1) = k_scale_min(2 * g, scales);
                    let (s2, m2) = k_scale_min(2 * g + 1, scales);
                    let q = &ql[32 * g..32 * g + 32];
                    for (half, (s, m)) in [(s1, m1), (s2, m2)].into_iter().enumerate() {
                        for l in 0..32 {
                            let mut v = if half == 0 { q[l] & 0xF } else { q[l] >> 4 } as u32;
                            if ty == GgmlType::Q5K && (qh[l] >> (2 * g + half)) & 1 != 0 {
                                v += 16;
                            }
                            out.push(d * s as f32 * v as f32 - dmin * m as f32);
                        }
                    }
                }
            }
            GgmlType::Q6K => {
                let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
                let d = h(b, 208);
                let base = out.len();
                out.resize(base + 256, 0.0);
                for n in 0..2 {
                    let (ql, qh, sc) = (&ql[64 * n..], &qh[32 * n..], &sc[8 * n..]);
                    let y = base + 128 * n;
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        out[y + l] = d * (sc[is] as i8) as f32 * q1 as f32;
                        out[y + l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                        out[y + l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                        out[y + l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                    }
                }
            }
        }
    }
}

/// Quantizes f32 values (whole rows) into `ty`, llama.cpp's reference rounding. Used when an HF
/// checkpoint is loaded with `--weights q8_0|q4_0|f16|bf16`.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(src.len() / ty.block_elems() * ty.block_bytes());
    match ty {
        GgmlType::F32 => src.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgmlType::F16 => src.iter().for_each(|x| out.extend_from_slice(&f16::from_f32(*x).to_le_bytes())),
        GgmlType::BF16 => src.iter().for_each(|x| out.extend_from_slice(&bf16::from_f32(*x).to_le_bytes())),
        GgmlType::Q8_0 => {
            for b in src.chunks_exact(32) {
                let amax = b.iter().fold(0f32, |a, x| a.max(x.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                out.extend(b.iter().map(|x| (x * id).round() as i8 as u8));
            }
        }
        GgmlType::Q4_0 => {
            for b in src.chunks_exact(32) {
                let (mut amax, mut max) = (0f32, 0f32);
                for &x in b {
                    if x.abs() > amax {
                        amax = x.abs();
                        max = x;
                    }
                }
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                for j in 0..16 {
                    let q0 = ((b[j] * id + 8.5) as i32).min(15) as u8;
                    let q1 = ((b[j + 16] * id + 8.5) as i32).min(15) as u8;
                    out.push(q0 | (q1 << 4));
                }
            }
        }
        other => return Err(Error::Unsupported(format!("quantizing to {} at load time", other.name()))),
    }
    Ok(out)
}
