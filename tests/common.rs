//! Shared helpers: fixture paths, golden files, model loading.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use tildeopen::gpu::{Gpu, GpuOptions};
use tildeopen::model::loader::WeightFormat;
use tildeopen::model::LoadOptions;
use tildeopen::Model;

pub fn fixtures() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures");
    assert!(p.is_dir(), "fixtures not found at {}", p.display());
    p
}

/// (name, model path, golden path) for every fixture model: each HF dir and each GGUF.
pub fn cases() -> Vec<(String, PathBuf, PathBuf)> {
    let root = fixtures().join("models");
    let mut out = vec![];
    let mut dirs: Vec<_> = std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().path()).collect();
    dirs.sort();
    for d in dirs {
        let name = d.file_name().unwrap().to_string_lossy().to_string();
        out.push((format!("{name}/hf"), d.clone(), d.join("golden.safetensors")));
        let mut ggufs: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
            .collect();
        ggufs.sort();
        for g in ggufs {
            let stem = g.file_stem().unwrap().to_string_lossy().to_string();
            out.push((format!("{name}/{stem}"), g.clone(), d.join(format!("{stem}.golden.safetensors"))));
        }
    }
    assert!(out.len() >= 12, "expected at least 12 fixture models, found {}", out.len());
    out
}

pub struct Golden {
    pub input_ids: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    pub greedy_margins: Vec<f32>,
}

fn tensor_f32(st: &safetensors::SafeTensors, name: &str) -> (Vec<usize>, Vec<f32>) {
    let t = st.tensor(name).unwrap();
    let v = match t.dtype() {
        safetensors::Dtype::F32 => t.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect(),
        safetensors::Dtype::I32 => t.data().chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap()) as f32).collect(),
        safetensors::Dtype::I64 => t.data().chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f32).collect(),
        d => panic!("{name}: dtype {d:?}"),
    };
    (t.shape().to_vec(), v)
}

pub fn golden(path: &Path) -> Golden {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let ids = |n: &str| tensor_f32(&st, n).1.into_iter().map(|x| x as u32).collect::<Vec<_>>();
    let (shape, l) = tensor_f32(&st, "logits");
    Golden {
        input_ids: ids("input_ids"),
        logits: l.chunks(shape[1]).map(|r| r.to_vec()).collect(),
        prompt_ids: ids("prompt_ids"),
        greedy_ids: ids("greedy_ids"),
        greedy_margins: tensor_f32(&st, "greedy_margins").1,
    }
}

/// Loads a model on a newly opened GPU; HF checkpoints in bf16 (their own dtype, exact).
pub fn load(path: &Path, max_binding: Option<u64>) -> Model {
    let opts = LoadOptions { gpu: GpuOptions { max_binding_size: max_binding, ..Default::default() }, hf_format: WeightFormat::BF16 };
    pollster::block_on(Model::load(path, &opts)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Opens the GPU once, so several models share its compiled pipelines.
pub fn gpu(max_binding: Option<u64>) -> Gpu {
    pollster::block_on(Gpu::new(&GpuOptions { max_binding_size: max_binding, ..Default::default() })).expect("no usable GPU adapter")
}

/// Opens the GPU with neither the subgroup matvec nor the norm fold, whatever the device (on a
/// GPU both are on by default): the plain kernels browsers without subgroups run.
pub fn gpu_plain(max_binding: Option<u64>) -> Gpu {
    let opts = GpuOptions { max_binding_size: max_binding, subgroups: Some(false), norm_fold: Some(false), ..Default::default() };
    pollster::block_on(Gpu::new(&opts)).expect("no usable GPU adapter")
}

/// Opens the GPU with the subgroup matvec wherever the adapter has subgroups (lavapipe does; by
/// default CPU devices do not use it). Panics when the adapter has none, so the path is tested.
pub fn gpu_subgroups() -> Gpu {
    let g = pollster::block_on(Gpu::new(&GpuOptions { subgroups: Some(true), ..Default::default() })).expect("no usable GPU adapter");
    assert!(g.fast.subgroups, "the test adapter {} has no subgroups", g.info.name);
    g
}

/// Opens the GPU with the RMSNorm folded into the matvecs (off by default on CPU devices), with
/// or without the subgroup matvec (both on: what a GPU gets by default).
pub fn gpu_norm_fold(subgroups: bool) -> Gpu {
    let opts = GpuOptions { norm_fold: Some(true), subgroups: Some(subgroups), ..Default::default() };
    let g = pollster::block_on(Gpu::new(&opts)).expect("no usable GPU adapter");
    assert!(g.fast.norm_fold && g.fast.subgroups == subgroups, "{}: {:?}", g.info.name, g.fast);
    g
}

/// Opens the GPU with the integer-dot matvec (opt-in everywhere).
pub fn gpu_int_dot() -> Gpu {
    let g = pollster::block_on(Gpu::new(&GpuOptions { int_dot: Some(true), ..Default::default() })).expect("no usable GPU adapter");
    assert!(g.fast.int_dot, "{}: no dot4I8Packed", g.info.name);
    g
}

/// Opens the GPU with only the baseline kernels (no fusions, no split attention).
pub fn gpu_baseline() -> Gpu {
    pollster::block_on(Gpu::new(&GpuOptions { baseline: true, ..Default::default() })).expect("no usable GPU adapter")
}

/// The baseline kernels with bindings capped at `max_binding` bytes.
pub fn gpu_baseline_capped(max_binding: u64) -> Gpu {
    pollster::block_on(Gpu::new(&GpuOptions { baseline: true, max_binding_size: Some(max_binding), ..Default::default() })).expect("no usable GPU adapter")
}

/// Loads a model on `gpu`; HF checkpoints in bf16.
pub fn load_on(path: &Path, gpu: &Gpu) -> Model {
    Model::load_on(path, gpu, WeightFormat::BF16).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).flat_map(|(x, y)| {
        assert_eq!(x.len(), y.len());
        x.iter().zip(y).map(|(p, q)| (p - q).abs())
    }).fold(0.0, f32::max)
}

/// The argmax of `v` and its margin over the second-best value.
pub fn top_margin(v: &[f32]) -> (usize, f32) {
    let top = argmax(v);
    let second = v.iter().enumerate().filter(|(i, _)| *i != top).map(|(_, x)| *x).fold(f32::MIN, f32::max);
    (top, v[top] - second)
}

pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}

/// Where the test command put SmolLM2-135M-Instruct Q4_1 (`TILDEOPEN_SMOLLM2`), else the
/// default-model cache (fetched on first use).
pub fn smollm2() -> PathBuf {
    if let Some(p) = std::env::var_os("TILDEOPEN_SMOLLM2") {
        return PathBuf::from(p);
    }
    tildeopen::model::fetch::default_model().expect("fetch SmolLM2")
}
