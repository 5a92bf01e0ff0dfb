//! Every supported tensor type, kernel by kernel, against gguf-py's dequantization (llama.cpp's
//! Python reference; vectors made by scripts/make-quant-vectors.py): the host dequantizer, the
//! matvec (1 token), the tiled matmul (70 tokens: a partial second tile) and the embedding
//! lookup, also with the matrix split across buffers.

mod common;
use common::*;
use std::borrow::Cow;
use tildeopen::gpu::kernels::has_int_dot;
use tildeopen::gpu::session::{apply_matrix, apply_matrix_q8};
use tildeopen::model::loader::HostTensor;
use tildeopen::model::GpuMatrix;
use tildeopen::model::quant::{dequantize_row, GgmlType};

struct Vectors {
    bytes: Vec<u8>,
}

impl Vectors {
    fn load() -> Self {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/quant-vectors.safetensors");
        Vectors { bytes: std::fs::read(p).unwrap() }
    }
    fn get(&self, name: &str) -> (Vec<usize>, Vec<u8>) {
        let st = safetensors::SafeTensors::deserialize(&self.bytes).unwrap();
        let t = st.tensor(name).unwrap();
        (t.shape().to_vec(), t.data().to_vec())
    }
    fn f32s(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let (s, b) = self.get(name);
        (s, b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
    }
}

fn close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1e-3f32, |a, b| a.max(b.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * scale, "{what}[{i}]: got {g}, want {w} (scale {scale})");
    }
}

/// The integer-dot matvec (opt-in: `GpuOptions::int_dot`) on an input already in Q8 blocks
/// gives what the dequantized weights times the dequantized input give, up to f32 rounding:
/// for 1, 5, 8 and 13 tokens, for every type that has one, whole and split across buffers.
#[test]
fn int_dot_matvec_is_exact_on_q8_input() {
    let v = Vectors::load();
    let (xs, x) = v.f32s("x");
    let cols = xs[1];
    let gpu_int = gpu_int_dot();
    let types: Vec<GgmlType> = GgmlType::ALL.into_iter().filter(|t| has_int_dot(*t)).collect();
    assert_eq!(types.len(), 5, "Q8_0, Q4_0, Q4_1, Q4_K, Q6_K");
    for split in [false, true] {
        for &ty in &types {
            let rb = ty.row_bytes(cols).unwrap() as u64;
            let gpu = if split { gpu(Some((3 * rb + 4).div_ceil(256) * 256)) } else { gpu_int.clone() };
            let (rs, raw) = v.get(&format!("{}.raw", ty.name()));
            let (_, want) = v.f32s(&format!("{}.f32", ty.name()));
            let rows = rs[0];
            let t = HostTensor { ty, rows, cols, data: Cow::Borrowed(&raw) };
            let m = GpuMatrix::upload(&gpu, ty.name(), &t).unwrap();
            for ntok in [1usize, 5, 8, 13] {
                // Quantize as norm_quant.wgsl does: d = max|v| / 127 per 32 values.
                let (mut q, mut words, mut scales) = (vec![0i8; ntok * cols], vec![], vec![]);
                for (b, block) in x[..ntok * cols].chunks(32).enumerate() {
                    let d = block.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                    let qb = &mut q[b * 32..(b + 1) * 32];
                    for (qi, v) in qb.iter_mut().zip(block) {
                        *qi = if d > 0.0 { (v / d).round_ties_even() as i8 } else { 0 };
                    }
                    words.extend(qb.chunks(4).map(|c| u32::from_le_bytes([c[0] as u8, c[1] as u8, c[2] as u8, c[3] as u8])));
                    scales.push([d, d * qb.iter().map(|&v| v as f32).sum::<f32>()]);
                }
                let got = pollster::block_on(apply_matrix_q8(&gpu, &m, &words, &scales, ntok)).unwrap();
                let mut reference = vec![0f32; ntok * rows];
                for tk in 0..ntok {
                    for r in 0..rows {
                        let w = &want[r * cols..(r + 1) * cols];
                        let xq = &q[tk * cols..(tk + 1) * cols];
                        let d = |i: usize| scales[(tk * cols + i) / 32][0] as f64;
                        reference[tk * rows + r] = w.iter().zip(xq).enumerate().map(|(i, (a, b))| (*a as f64) * (*b as f64) * d(i)).sum::<f64>() as f32;
                    }
                }
                close(&got, &reference, 2e-5, &format!("{} integer-dot matvec, {ntok} tokens, split {split}", ty.name()));
            }
        }
    }
}

#[test]
fn every_type_every_kernel() {
    let v = Vectors::load();
    let (xs, x) = v.f32s("x");
    let cols = xs[1];
    let whole = gpu_plain(None);
    let sg = gpu_subgroups();
    // The default kernels, the same with tensors split across buffers, and the subgroup matvec.
    for (split, subgroups) in [(false, false), (true, false), (false, true)] {
        for ty in GgmlType::ALL {
            // Split: a binding cap that holds 3 of the 8 rows.
            let rb = ty.row_bytes(cols).unwrap() as u64;
            let binding = split.then(|| (3 * rb + 4).div_ceil(256) * 256);
            let gpu = if split { gpu_plain(binding) } else if subgroups { sg.clone() } else { whole.clone() };
            let (rs, raw) = v.get(&format!("{}.raw", ty.name()));
            let (_, want) = v.f32s(&format!("{}.f32", ty.name()));
            let rows = rs[0];
            // Host dequantizer.
            let mut host = Vec::new();
            dequantize_row(ty, &raw, &mut host);
            close(&host, &want, 1e-6, &format!("{} host dequant", ty.name()));

            let t = HostTensor { ty, rows, cols, data: Cow::Borrowed(&raw) };
            let m = GpuMatrix::upload(&gpu, ty.name(), &t).unwrap();
            if split {
                assert_eq!(m.chunks.len(), 3, "{}: not split in 3", ty.name());
            }
            // 1, 5, 8 and 13 tokens: the matvec (one or two 8-token groups); 70: the tiled matmul.
            for ntok in [1usize, 5, 8, 13, 70] {
                let xin = &x[..ntok * cols];
                let got = pollster::block_on(apply_matrix(&gpu, &m, xin, ntok, false)).unwrap();
                let mut reference = vec![0f32; ntok * rows];
                for tk in 0..ntok {
                    for r in 0..rows {
                        let w = &want[r * cols..(r + 1) * cols];
                        let xr = &xin[tk * cols..(tk + 1) * cols];
                        reference[tk * rows + r] = w.iter().zip(xr).map(|(a, b)| (*a as f64) * (*b as f64)).sum::<f64>() as f32;
                    }
                }
                close(&got, &reference, 1e-4, &format!("{} x {ntok} tokens (binding {binding:?}, subgroups {})", ty.name(), gpu.fast.subgroups));
            }
            let ids = [3f32, 0.0, 7.0, 5.0, 3.0];
            let got = pollster::block_on(apply_matrix(&gpu, &m, &ids, ids.len(), true)).unwrap();
            let reference: Vec<f32> = ids.iter().flat_map(|&i| want[i as usize * cols..(i as usize + 1) * cols].to_vec()).collect();
            close(&got, &reference, 1e-6, &format!("{} embedding", ty.name()));
        }
    }
}

#[test]
fn binding_size_keeps_kernel_offsets_in_u32() {
    use tildeopen::gpu::binding_size;
    // lavapipe: 128 MiB bindings, 2^32-byte buffers.
    assert_eq!(binding_size(128 << 20, u32::MAX as u64, None), 128 << 20);
    // A GPU allowing 8 GiB bindings and 64 GiB buffers: capped at 2 GiB (tensors split instead).
    assert_eq!(binding_size(8 << 30, 64 << 30, None), 1 << 31);
    // NVIDIA's usual 4 GiB - 1: 2 GiB as well, 256-aligned.
    assert_eq!(binding_size(u32::MAX as u64, u32::MAX as u64, None), 1 << 31);
    // A caller's cap, rounded down to 256 bytes.
    assert_eq!(binding_size(8 << 30, 8 << 30, Some(131_100)), 131_072);
}
