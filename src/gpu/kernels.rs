//! The WGSL kernels (one per file in `shaders/`), their bind group layouts and pipelines.
//! Every kernel is prefixed with `common.wgsl` (shared structs); weight-reading kernels are
//! linked with `bytes.wgsl` and the weight type's `dequant8`/`dot32`;
//! variants (accumulate into the output, the KV cache's type) are `override` constants.

use crate::model::quant::GgmlType;
use std::collections::HashMap;
use std::sync::Mutex;

/// A binding's kind, in binding order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    Ro,
    Rw,
    Uniform,
}

/// Which kernel, with the variant that selects its pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `one`: the pipeline for one-token passes (decode of a single sequence); `norm`: X is the
    /// residual stream and the kernel applies the RMSNorm (weight in binding 7) that feeds it.
    MatVec { ty: GgmlType, acc: bool, lanes: u32, one: bool, glu: bool, norm: bool },
    /// The matvec on devices with subgroups: `wg` threads per 4 rows, reduced with `subgroupAdd`.
    MatVecSg { ty: GgmlType, acc: bool, wg: u32, one: bool, glu: bool, norm: bool },
    /// The matvec with 8-bit integer dot products on a Q8-quantized input, for the types
    /// [`has_int_dot`] names.
    MatVecQ8 { ty: GgmlType, acc: bool, lanes: u32, one: bool, glu: bool },
    /// `glu`: rows are (gate, up) pairs and the output is silu(gate) * up.
    MatMul { ty: GgmlType, acc: bool, glu: bool },
    Embed { ty: GgmlType },
    RmsNorm,
    /// RMSNorm, then the rows quantized to Q8 blocks for `MatVecQ8`.
    NormQuant,
    Rope,
    /// RoPE on Q and K plus the KV-cache store, in one kernel.
    /// `kv`: the KV cache's type (`KvType::code`: f32, f16, q8_0, q4_0) in these four.
    RopeKv { kv: u32 },
    KvStore { kv: u32 },
    KvCopy,
    Attention { kv: u32 },
    /// Split attention: `g` query heads per KV head, `qt` tokens per workgroup, `chunk` keys per
    /// round, `kb` keys per thread in its score loop, `gt` threads per query row in its
    /// reductions, `wpt` value words per thread.
    AttnSplit { kv: u32, g: u32, qt: u32, chunk: u32, kb: u32, gt: u32, wpt: u32, hd: u32 },
    AttnCombine,
    SwiGlu,
    Argmax,
}

/// The most tokens a pass sends to the matvec kernel (two of its 8-token groups); more go to
/// the tiled matmul, whose 64-token tiles would be at least three-quarters idle below that.
pub const MATVEC_MAX_T: u32 = 16;

/// Whether weight type `ty` has an integer-dot matvec (`shaders/quant/*_q8.wgsl`).
pub fn has_int_dot(ty: GgmlType) -> bool {
    int_dot_source(ty).is_some()
}

fn int_dot_source(ty: GgmlType) -> Option<&'static str> {
    Some(match ty {
        GgmlType::Q8_0 => include_str!("../../shaders/quant/q8_0_q8.wgsl"),
        GgmlType::Q4_0 => include_str!("../../shaders/quant/q4_0_q8.wgsl"),
        GgmlType::Q4_1 => include_str!("../../shaders/quant/q4_1_q8.wgsl"),
        GgmlType::Q4K => include_str!("../../shaders/quant/q4_k_q8.wgsl"),
        GgmlType::Q6K => include_str!("../../shaders/quant/q6_k_q8.wgsl"),
        _ => return None,
    })
}

/// Threads per row group for the matvec kernel: about four 32-element blocks each, a power of
/// two from 4 (the kernel's rows per group) to 32.
pub fn matvec_lanes(cols: u32) -> u32 {
    let blocks = (cols / 32).max(1);
    let mut lanes = 4;
    while lanes < 32 && lanes * 2 * 4 <= blocks {
        lanes *= 2;
    }
    lanes
}

/// Threads per workgroup (per 4 rows) for the subgroup matvec: one or two 32-element blocks
/// each for most rows, 32 to 128.
pub fn matvec_sg_threads(cols: u32) -> u32 {
    match cols / 32 {
        0..128 => 32,
        128..512 => 64,
        _ => 128,
    }
}

impl Kernel {
    pub fn slots(self) -> &'static [Slot] {
        use Slot::*;
        match self {
            // W, X, Y, params, step, then Y2 and Y3 (mat_out.wgsl) and the norm weight G
            // (mat_norm.wgsl; the matmul has none). One layout, so an op's bind groups suit
            // both its matvec and its matmul pipelines.
            // The integer-dot matvec binds the quantized rows as X and their scales as G.
            Kernel::MatVec { .. } | Kernel::MatVecSg { .. } | Kernel::MatVecQ8 { .. } | Kernel::MatMul { .. } => {
                &[Ro, Ro, Rw, Uniform, Uniform, Rw, Rw, Ro]
            }
            Kernel::NormQuant => &[Ro, Ro, Rw, Rw, Uniform, Uniform],
            Kernel::Embed { .. } | Kernel::RmsNorm => &[Ro, Ro, Rw, Uniform, Uniform],
            Kernel::Rope | Kernel::SwiGlu | Kernel::Argmax => &[Ro, Rw, Uniform, Uniform],
            Kernel::KvStore { .. } => &[Ro, Ro, Rw, Rw, Ro, Uniform, Uniform],
            Kernel::RopeKv { .. } => &[Ro, Rw, Ro, Ro, Rw, Rw, Ro, Uniform, Uniform],
            Kernel::KvCopy => &[Rw, Rw, Uniform],
            Kernel::Attention { .. } => &[Ro, Ro, Ro, Rw, Ro, Uniform, Uniform],
            Kernel::AttnSplit { .. } => &[Ro, Ro, Ro, Rw, Rw, Ro, Uniform, Uniform],
            Kernel::AttnCombine => &[Ro, Rw, Uniform, Uniform],
        }
    }

    /// A short name for profiles.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::MatVec { .. } => "matvec",
            Kernel::MatVecSg { .. } => "matvec_sg",
            Kernel::MatVecQ8 { .. } => "matvec_q8",
            Kernel::NormQuant => "norm_quant",
            Kernel::MatMul { .. } => "matmul",
            Kernel::Embed { .. } => "embed",
            Kernel::RmsNorm => "rmsnorm",
            Kernel::Rope => "rope",
            Kernel::RopeKv { .. } => "rope_kv",
            Kernel::KvStore { .. } => "kv_store",
            Kernel::KvCopy => "kv_copy",
            Kernel::Attention { .. } => "attention",
            Kernel::AttnSplit { .. } => "attn_split",
            Kernel::AttnCombine => "attn_combine",
            Kernel::SwiGlu => "swiglu",
            Kernel::Argmax => "argmax",
        }
    }

    fn source(self) -> String {
        const COMMON: &str = include_str!("../../shaders/common.wgsl");
        const BYTES: &str = include_str!("../../shaders/bytes.wgsl");
        const KSCALE: &str = include_str!("../../shaders/quant/kscale.wgsl");
        const DOT32_GENERIC: &str = include_str!("../../shaders/quant/dot32_generic.wgsl");
        let weights = |ty: GgmlType| {
            let ks = if matches!(ty, GgmlType::Q4K | GgmlType::Q5K) { KSCALE } else { "" };
            let dot = if ty.block_elems() == 1 { DOT32_GENERIC } else { "" };
            format!("{BYTES}\n{ks}\n{}\n{dot}", ty.wgsl())
        };
        const MAT_OUT: &str = include_str!("../../shaders/mat_out.wgsl");
        const MAT_NORM: &str = include_str!("../../shaders/mat_norm.wgsl");
        const RMS: &str = include_str!("../../shaders/rms.wgsl");
        const KV_TYPES: &str = include_str!("../../shaders/kv_types.wgsl");
        const KV_WRITE: &str = include_str!("../../shaders/kv_write.wgsl");
        let matrix = |ty: GgmlType| format!("{}\n{MAT_OUT}", weights(ty));
        const MATVEC_REDUCE: &str = include_str!("../../shaders/matvec_reduce.wgsl");
        let matvec = |ty: GgmlType| format!("{}\n{MAT_NORM}", matrix(ty));
        let (prelude, body) = match self {
            Kernel::MatVec { ty, .. } => (format!("{}\n{MATVEC_REDUCE}", matvec(ty)), include_str!("../../shaders/matvec.wgsl")),
            Kernel::MatVecSg { ty, .. } => (matvec(ty), include_str!("../../shaders/matvec_sg.wgsl")),
            Kernel::MatVecQ8 { ty, .. } => {
                let dot = int_dot_source(ty).expect("MatVecQ8 is only built for types with an integer dot");
                (format!("{}\n{dot}\n{MAT_OUT}\n{MATVEC_REDUCE}", weights(ty)), include_str!("../../shaders/matvec_q8.wgsl"))
            }
            Kernel::MatMul { ty, .. } => (matrix(ty), include_str!("../../shaders/matmul.wgsl")),
            Kernel::Embed { ty } => (weights(ty), include_str!("../../shaders/embed.wgsl")),
            Kernel::RmsNorm => (RMS.into(), include_str!("../../shaders/rmsnorm.wgsl")),
            Kernel::NormQuant => (RMS.into(), include_str!("../../shaders/norm_quant.wgsl")),
            Kernel::Rope => (String::new(), include_str!("../../shaders/rope.wgsl")),
            Kernel::RopeKv { .. } => (format!("{KV_TYPES}\n{KV_WRITE}"), include_str!("../../shaders/rope_kv.wgsl")),
            Kernel::KvStore { .. } => (format!("{KV_TYPES}\n{KV_WRITE}"), include_str!("../../shaders/kv_store.wgsl")),
            Kernel::KvCopy => (String::new(), include_str!("../../shaders/kv_copy.wgsl")),
            Kernel::Attention { .. } => (KV_TYPES.into(), include_str!("../../shaders/attention.wgsl")),
            Kernel::AttnSplit { .. } => (KV_TYPES.into(), include_str!("../../shaders/attn_split.wgsl")),
            Kernel::AttnCombine => (String::new(), include_str!("../../shaders/attn_combine.wgsl")),
            Kernel::SwiGlu => (String::new(), include_str!("../../shaders/swiglu.wgsl")),
            Kernel::Argmax => (String::new(), include_str!("../../shaders/argmax.wgsl")),
        };
        format!("{COMMON}\n{prelude}\n{body}")
    }

    fn constants(self) -> Vec<(&'static str, f64)> {
        match self {
            Kernel::MatVec { acc, lanes, one, glu, norm, .. } => {
                let mut c = vec![("ACCUMULATE", acc as u8 as f64), ("LANES", lanes as f64), ("GLU", glu as u8 as f64), ("NORM", norm as u8 as f64)];
                if one {
                    c.push(("NT", 1.0));
                }
                c
            }
            Kernel::MatVecSg { acc, wg, one, glu, norm, .. } => {
                let mut c = vec![("ACCUMULATE", acc as u8 as f64), ("WG", wg as f64), ("GLU", glu as u8 as f64), ("NORM", norm as u8 as f64)];
                if one {
                    c.push(("NT", 1.0));
                }
                c
            }
            Kernel::MatVecQ8 { acc, lanes, one, glu, .. } => {
                let mut c = vec![("ACCUMULATE", acc as u8 as f64), ("LANES", lanes as f64), ("GLU", glu as u8 as f64)];
                if one {
                    c.push(("NT", 1.0));
                }
                c
            }
            Kernel::MatMul { acc, glu, .. } => vec![("ACCUMULATE", acc as u8 as f64), ("GLU", glu as u8 as f64)],
            Kernel::KvStore { kv } | Kernel::Attention { kv } | Kernel::RopeKv { kv } => vec![("KV_TYPE", kv as f64)],
            Kernel::AttnSplit { kv, g, qt, chunk, kb, gt, wpt, hd } => vec![
                ("KV_TYPE", kv as f64),
                ("G", g as f64),
                ("QT", qt as f64),
                ("CHUNK", chunk as f64),
                ("KB", kb as f64),
                ("GT", gt as f64),
                ("WPT", wpt as f64),
                ("HD", hd as f64),
                // Workgroup memory: the queries (vec4s) and the scores.
                ("QV", (qt * g * hd / 4) as f64),
                ("SC", (qt * g * chunk) as f64),
            ],
            _ => vec![],
        }
    }
}

/// Pipelines built on first use and kept for the device's lifetime (shared by every model
/// loaded on it).
pub struct Kernels {
    device: wgpu::Device,
    /// Keep naga's per-access bounds clamps (every backend but Vulkan; see `pipeline`).
    bounds_checks: bool,
    layouts: Mutex<HashMap<&'static [Slot], wgpu::BindGroupLayout>>,
    pipelines: Mutex<HashMap<Kernel, wgpu::ComputePipeline>>,
}

impl Kernels {
    pub fn new(device: &wgpu::Device, backend: wgpu::Backend) -> Self {
        Kernels { device: device.clone(), bounds_checks: backend != wgpu::Backend::Vulkan, layouts: Default::default(), pipelines: Default::default() }
    }

    pub fn layout(&self, slots: &'static [Slot]) -> wgpu::BindGroupLayout {
        self.layouts
            .lock()
            .unwrap()
            .entry(slots)
            .or_insert_with(|| {
                let entries: Vec<_> = slots
                    .iter()
                    .enumerate()
                    .map(|(i, s)| wgpu::BindGroupLayoutEntry {
                        binding: i as u32,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: match s {
                            Slot::Ro => wgpu::BindingType::Buffer {
                                ty: wgpu::BufferBindingType::Storage { read_only: true },
                                has_dynamic_offset: false,
                                min_binding_size: None,
                            },
                            Slot::Rw => wgpu::BindingType::Buffer {
                                ty: wgpu::BufferBindingType::Storage { read_only: false },
                                has_dynamic_offset: false,
                                min_binding_size: None,
                            },
                            Slot::Uniform => wgpu::BindingType::Buffer {
                                ty: wgpu::BufferBindingType::Uniform,
                                has_dynamic_offset: false,
                                min_binding_size: None,
                            },
                        },
                        count: None,
                    })
                    .collect();
                self.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: None,
                    entries: &entries,
                })
            })
            .clone()
    }

    pub fn pipeline(&self, k: Kernel) -> wgpu::ComputePipeline {
        if let Some(p) = self.pipelines.lock().unwrap().get(&k) {
            return p.clone();
        }
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(&format!("{k:?}")),
            source: wgpu::ShaderSource::Wgsl(k.source().into()),
        };
        // Every index in these kernels is bounded by the parameters the engine writes and the
        // buffer sizes it allocates (plus 4 bytes of padding for unaligned block reads), so on
        // Vulkan, where wgpu turns on robustBufferAccess anyway, the per-access clamps naga would
        // insert are skipped. Metal and DX12 have no such net, so they keep the clamps: the
        // tests run on Vulkan only, where a stray read would be masked. Browsers keep their own.
        let mut checks = wgpu::ShaderRuntimeChecks::checked();
        checks.bounds_checks = self.bounds_checks;
        checks.force_loop_bounding = false;
        // SAFETY: see above; the kernels are this crate's own and index within their bindings.
        let module = unsafe { self.device.create_shader_module_trusted(desc, checks) };
        let bgl = self.layout(k.slots());
        let layout = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: None,
            bind_group_layouts: &[Some(&bgl)],
            immediate_size: 0,
        });
        let constants = k.constants();
        let p = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&format!("{k:?}")),
            layout: Some(&layout),
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &constants,
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        self.pipelines.lock().unwrap().insert(k, p.clone());
        p
    }

    /// Writes every pipeline compiled so far into `dir`: one WGSL file per pipeline, the module
    /// exactly as it was compiled (helpers prepended), with the kernel variant and its override
    /// values in a header comment. Returns the number of files written.
    pub fn dump(&self, dir: &std::path::Path) -> std::io::Result<usize> {
        std::fs::create_dir_all(dir)?;
        let mut kernels: Vec<Kernel> = self.pipelines.lock().unwrap().keys().copied().collect();
        kernels.sort_by_key(|k| format!("{k:?}"));
        for (i, k) in kernels.iter().enumerate() {
            let mut text = format!("// pipeline {i}: {k:?}\n// entry point: main\n");
            for (name, v) in k.constants() {
                text += &format!("// override {name} = {v}\n");
            }
            text += "\n";
            text += &k.source();
            std::fs::write(dir.join(format!("{i:03}-{}.wgsl", k.name())), text)?;
        }
        Ok(kernels.len())
    }

    /// A bind group for kernel `k` over `buffers` in binding order.
    pub fn bind(&self, k: Kernel, buffers: &[&wgpu::Buffer]) -> wgpu::BindGroup {
        let layout = self.layout(k.slots());
        let entries: Vec<_> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
            .collect();
        self.device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &layout, entries: &entries })
    }
}
