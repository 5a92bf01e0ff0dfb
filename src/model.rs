//! Model weights on the GPU. Every matrix keeps its block layout and is split by rows into as
//! many buffers as the device's binding limit requires.

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::tensor::HostTensor;
use crate::quant::GgmlType;

/// A run of whole rows of a matrix in one buffer.
#[derive(Clone)]
pub struct Chunk {
    pub row0: u32,
    pub rows: u32,
    pub buf: wgpu::Buffer,
}

/// A weight matrix `rows x cols` of type `ty`, row-split across buffers.
#[derive(Clone)]
pub struct GpuMatrix {
    pub ty: GgmlType,
    pub rows: u32,
    pub cols: u32,
    pub row_bytes: u32,
    pub chunks: Vec<Chunk>,
}

impl GpuMatrix {
    pub fn upload(gpu: &Gpu, name: &str, t: &HostTensor) -> Result<Self> {
        let row_bytes = t.ty.row_bytes(t.cols)?;
        if t.data.len() != row_bytes * t.rows {
            return Err(Error::Shape(format!("{name}: {} bytes for {}x{} {}", t.data.len(), t.rows, t.cols, t.ty.name())));
        }
        if !t.cols.is_multiple_of(32) {
            return Err(Error::Unsupported(format!("{name}: {} columns is not a multiple of 32", t.cols)));
        }
        // Leave room for the 4 padding bytes of each buffer.
        let rows_per = ((gpu.max_binding - 4) / row_bytes as u64) as usize;
        if rows_per == 0 {
            return Err(Error::Gpu(format!(
                "{name}: one row ({row_bytes} bytes) exceeds the device's binding limit of {} bytes",
                gpu.max_binding
            )));
        }
        let mut chunks = Vec::new();
        let mut r = 0;
        while r < t.rows {
            let n = rows_per.min(t.rows - r);
            let buf = gpu.storage_init(name, &t.data[r * row_bytes..(r + n) * row_bytes])?;
            chunks.push(Chunk { row0: r as u32, rows: n as u32, buf });
            r += n;
        }
        Ok(GpuMatrix { ty: t.ty, rows: t.rows as u32, cols: t.cols as u32, row_bytes: row_bytes as u32, chunks })
    }
}

/// One transformer block.
#[derive(Clone)]
pub struct Layer {
    pub attn_norm: wgpu::Buffer,
    pub wq: GpuMatrix,
    pub wk: GpuMatrix,
    pub wv: GpuMatrix,
    pub wo: GpuMatrix,
    pub ffn_norm: wgpu::Buffer,
    pub w_gate: GpuMatrix,
    pub w_up: GpuMatrix,
    pub w_down: GpuMatrix,
}

/// A loaded model: configuration, GPU, kernels and weights.
#[derive(Clone)]
pub struct Model {
    pub gpu: Gpu,
    pub cfg: ModelConfig,
    pub embed: GpuMatrix,
    pub layers: Vec<Layer>,
    pub out_norm: wgpu::Buffer,
    /// `None` when the output projection is tied to the embedding.
    pub lm_head: Option<GpuMatrix>,
    pub inv_freq: Vec<f32>,
    pub attention_factor: f32,
    /// Bytes of weights on the GPU.
    pub weight_bytes: u64,
}

/// Where tensors come from: `(gguf_name, rows, cols) -> tensor`.
pub trait TensorSource {
    fn tensor(&mut self, name: &str, rows: usize, cols: usize) -> Result<HostTensor<'_>>;
    fn has(&self, name: &str) -> bool;
}

impl Model {
    /// Uploads every tensor, one at a time, from `src`.
    pub fn build(gpu: Gpu, cfg: ModelConfig, src: &mut dyn TensorSource, mut progress: impl FnMut(usize, usize)) -> Result<Self> {
        let c = &cfg;
        let mut bytes = 0u64;
        let mut since_flush = 0u64;
        let total = 3 + c.num_layers * 9;
        let mut done = 0;
        let mut mat = |gpu: &Gpu, src: &mut dyn TensorSource, name: &str, rows: usize, cols: usize| -> Result<GpuMatrix> {
            let t = src.tensor(name, rows, cols)?;
            let m = GpuMatrix::upload(gpu, name, &t)?;
            bytes += t.data.len() as u64;
            since_flush += t.data.len() as u64;
            if since_flush > 256 << 20 {
                // Let the staging memory of queued uploads go before it piles up.
                gpu.queue.submit([]);
                gpu.flush();
                since_flush = 0;
            }
            done += 1;
            progress(done, total);
            Ok(m)
        };
        let vec = |gpu: &Gpu, src: &mut dyn TensorSource, name: &str, n: usize| -> Result<wgpu::Buffer> {
            let t = src.tensor(name, 1, n)?;
            gpu.storage_init(name, bytemuck::cast_slice(&t.to_f32()))
        };
        let (h, q, kv, f) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let embed = mat(&gpu, src, "token_embd.weight", c.vocab_size, h)?;
        let mut layers = Vec::with_capacity(c.num_layers);
        for l in 0..c.num_layers {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            layers.push(Layer {
                attn_norm: vec(&gpu, src, &n("attn_norm"), h)?,
                wq: mat(&gpu, src, &n("attn_q"), q, h)?,
                wk: mat(&gpu, src, &n("attn_k"), kv, h)?,
                wv: mat(&gpu, src, &n("attn_v"), kv, h)?,
                wo: mat(&gpu, src, &n("attn_output"), h, q)?,
                ffn_norm: vec(&gpu, src, &n("ffn_norm"), h)?,
                w_gate: mat(&gpu, src, &n("ffn_gate"), f, h)?,
                w_up: mat(&gpu, src, &n("ffn_up"), f, h)?,
                w_down: mat(&gpu, src, &n("ffn_down"), h, f)?,
            });
        }
        let out_norm = vec(&gpu, src, "output_norm.weight", h)?;
        let lm_head = if src.has("output.weight") && !c.tie_word_embeddings {
            Some(mat(&gpu, src, "output.weight", c.vocab_size, h)?)
        } else {
            None
        };
        gpu.queue.submit([]);
        gpu.flush();
        let (inv_freq, attention_factor) = cfg.rope_inv_freq();
        Ok(Model { gpu, cfg, embed, layers, out_norm, lm_head, inv_freq, attention_factor, weight_bytes: bytes })
    }

    pub fn lm_head(&self) -> &GpuMatrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod native {
    use super::*;
    use crate::loader::{ModelFiles, WeightFormat};
    use crate::gpu::GpuOptions;
    use std::path::Path;

    struct FileSource<'a> {
        files: &'a ModelFiles,
        cfg: &'a ModelConfig,
    }

    impl TensorSource for FileSource<'_> {
        fn tensor(&mut self, name: &str, rows: usize, cols: usize) -> Result<HostTensor<'_>> {
            self.files.tensor(name, rows, cols, self.cfg)
        }
        fn has(&self, name: &str) -> bool {
            self.files.has(name)
        }
    }

    /// How to load a model natively.
    #[derive(Debug, Clone)]
    pub struct LoadOptions {
        pub gpu: GpuOptions,
        /// Format HF checkpoints are converted to.
        pub hf_format: WeightFormat,
    }

    impl Default for LoadOptions {
        fn default() -> Self {
            LoadOptions { gpu: GpuOptions::default(), hf_format: WeightFormat::Q8_0 }
        }
    }

    impl Model {
        /// Loads a GGUF file or an HF checkpoint directory onto a newly opened GPU.
        pub async fn load(path: &Path, opts: &LoadOptions) -> Result<Self> {
            Self::load_with_progress(path, opts, |_, _| {}).await
        }

        /// [`Model::load`], calling `progress(tensors_done, tensors_total)` as weights upload.
        pub async fn load_with_progress(path: &Path, opts: &LoadOptions, progress: impl FnMut(usize, usize)) -> Result<Self> {
            let files = ModelFiles::open(path, opts.hf_format)?;
            let cfg = files.config()?;
            let gpu = Gpu::new(&opts.gpu).await?;
            let mut src = FileSource { files: &files, cfg: &cfg };
            Model::build(gpu, cfg.clone(), &mut src, progress)
        }

        /// Loads a model onto an already open GPU (sharing its device and compiled pipelines).
        pub fn load_on(path: &Path, gpu: &Gpu, hf_format: WeightFormat) -> Result<Self> {
            let files = ModelFiles::open(path, hf_format)?;
            let cfg = files.config()?;
            Self::load_files(&files, cfg, gpu.clone())
        }

        fn load_files(files: &ModelFiles, cfg: ModelConfig, gpu: Gpu) -> Result<Self> {
            let mut src = FileSource { files, cfg: &cfg };
            Model::build(gpu, cfg.clone(), &mut src, |_, _| {})
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub use native::LoadOptions;
