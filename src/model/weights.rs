//! Model weights on the GPU. Every matrix keeps its block layout (Q6_K blocks padded to whole
//! words: `GgmlType::gpu_block_bytes`) and is split by rows into as many buffers as the
//! device's binding limit requires.

use crate::model::config::ModelConfig;
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::model::tensor::HostTensor;
use crate::model::quant::GgmlType;

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
        Self::upload_grouped(gpu, name, t, 1)
    }

    /// [`GpuMatrix::upload`] with every buffer holding a multiple of `group` rows.
    fn upload_grouped(gpu: &Gpu, name: &str, t: &HostTensor, group: usize) -> Result<Self> {
        if t.ty.row_bytes(t.cols)?.checked_mul(t.rows) != Some(t.data.len()) {
            return Err(Error::Shape(format!("{name}: {} bytes for {}x{} {}", t.data.len(), t.rows, t.cols, t.ty.name())));
        }
        let data = t.ty.to_gpu_layout(&t.data);
        let row_bytes = t.ty.gpu_row_bytes(t.cols)?;
        if !t.cols.is_multiple_of(32) {
            return Err(Error::Unsupported(format!("{name}: {} columns is not a multiple of 32", t.cols)));
        }
        // Leave room for the 4 padding bytes of each buffer.
        let rows_per = ((gpu.max_binding - 4) / row_bytes as u64) as usize / group * group;
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
            let buf = gpu.storage_init(name, &data[r * row_bytes..(r + n) * row_bytes])?;
            chunks.push(Chunk { row0: r as u32, rows: n as u32, buf });
            r += n;
        }
        Ok(GpuMatrix { ty: t.ty, rows: t.rows as u32, cols: t.cols as u32, row_bytes: row_bytes as u32, chunks })
    }
}

/// The gate and up projections of an FFN.
#[derive(Clone)]
pub enum FfnIn {
    /// One matrix with the rows interleaved (gate row i at 2i, up row i at 2i + 1), so one
    /// kernel reads the input once and writes silu(gate) * up: when both have the same type.
    GateUp(GpuMatrix),
    Split { gate: GpuMatrix, up: GpuMatrix },
}

/// A run of the attention's input projections (Q, K, V, in that order) sharing one matrix:
/// consecutive projections of the same type have their rows concatenated, so one kernel reads
/// the normed input once for all of them and writes each row range to its own buffer.
#[derive(Clone)]
pub struct QkvPart {
    pub m: GpuMatrix,
    /// The projections it holds, `first .. first + count` (0 = Q, 1 = K, 2 = V).
    pub first: usize,
    pub count: usize,
}

/// One transformer block.
#[derive(Clone)]
pub struct Layer {
    pub attn_norm: wgpu::Buffer,
    /// Q, K and V: one part when all three have the same type, else two or three.
    pub qkv: Vec<QkvPart>,
    pub wo: GpuMatrix,
    pub ffn_norm: wgpu::Buffer,
    /// The FFN's gate and up projections.
    pub ffn_in: FfnIn,
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
/// Where weights come from: memory-mapped files natively, HTTP range requests in the browser.
/// Tensors are asked for one at a time, by GGUF name, already in the GPU layout.
#[allow(async_fn_in_trait)]
pub trait TensorSource {
    async fn tensor(&mut self, name: &str, rows: usize, cols: usize) -> Result<HostTensor<'_>>;
    fn has(&self, name: &str) -> bool;
}

/// Upload bookkeeping for [`Model::build`].
struct Uploader<'g, P> {
    gpu: &'g Gpu,
    bytes: u64,
    since_flush: u64,
    done: usize,
    total: usize,
    progress: P,
}

impl<P: FnMut(usize, usize)> Uploader<'_, P> {
    async fn mat(&mut self, src: &mut impl TensorSource, name: &str, rows: usize, cols: usize) -> Result<GpuMatrix> {
        let t = src.tensor(name, rows, cols).await?;
        let m = GpuMatrix::upload(self.gpu, name, &t)?;
        self.count(t.data.len() as u64, 1)?;
        Ok(m)
    }

    /// The Q, K and V matrices (`rows` each, `cols` columns), consecutive ones of the same type
    /// concatenated into one (with fused kernels).
    async fn qkv(&mut self, src: &mut impl TensorSource, names: [String; 3], rows: [usize; 3], cols: usize) -> Result<Vec<QkvPart>> {
        let mut ts = Vec::with_capacity(3);
        for (name, &r) in names.iter().zip(&rows) {
            let t = src.tensor(name, r, cols).await?;
            let rb = t.ty.row_bytes(cols)?;
            if t.data.len() != rb * r {
                return Err(Error::Shape(format!("{name}: {} bytes for {r}x{cols} {}", t.data.len(), t.ty.name())));
            }
            // Owned, so the source can be asked for the next tensor.
            ts.push(HostTensor { ty: t.ty, rows: t.rows, cols: t.cols, data: std::borrow::Cow::Owned(t.data.into_owned()) });
        }
        let mut parts = Vec::new();
        let mut i = 0;
        while i < 3 {
            let mut j = i + 1;
            while j < 3 && self.gpu.fast.fused && ts[j].ty == ts[i].ty {
                j += 1;
            }
            let m = if j == i + 1 {
                GpuMatrix::upload(self.gpu, &names[i], &ts[i])?
            } else {
                let data: Vec<u8> = ts[i..j].iter().flat_map(|t| t.data.iter().copied()).collect();
                let t = HostTensor { ty: ts[i].ty, rows: ts[i..j].iter().map(|t| t.rows).sum(), cols, data: data.into() };
                GpuMatrix::upload(self.gpu, &names[i], &t)?
            };
            parts.push(QkvPart { m, first: i, count: j - i });
            i = j;
        }
        self.count(ts.iter().map(|t| t.data.len() as u64).sum(), 3)?;
        Ok(parts)
    }

    /// The gate and up matrices, interleaved into one when their types match.
    async fn gate_up(&mut self, src: &mut impl TensorSource, gate: &str, upn: &str, rows: usize, cols: usize) -> Result<FfnIn> {
        let g = src.tensor(gate, rows, cols).await?;
        // Owned, so the source can be asked for the next tensor.
        let g = HostTensor { ty: g.ty, rows: g.rows, cols: g.cols, data: std::borrow::Cow::Owned(g.data.into_owned()) };
        let u = src.tensor(upn, rows, cols).await?;
        let n = (g.data.len() + u.data.len()) as u64;
        let fin = if g.ty == u.ty && self.gpu.fast.fused {
            let rb = g.ty.row_bytes(cols)?;
            if rb.checked_mul(rows).is_none_or(|n| g.data.len() != n || u.data.len() != n) {
                return Err(Error::Shape(format!("{gate}/{upn}: {} and {} bytes for {rows}x{cols} {}", g.data.len(), u.data.len(), g.ty.name())));
            }
            let mut data = Vec::with_capacity(g.data.len() * 2);
            for (a, b) in g.data.chunks_exact(rb).zip(u.data.chunks_exact(rb)) {
                data.extend_from_slice(a);
                data.extend_from_slice(b);
            }
            let t = HostTensor { rows: 2 * rows, data: data.into(), ..g };
            FfnIn::GateUp(GpuMatrix::upload_grouped(self.gpu, gate, &t, 2)?)
        } else {
            FfnIn::Split { gate: GpuMatrix::upload(self.gpu, gate, &g)?, up: GpuMatrix::upload(self.gpu, upn, &u)? }
        };
        self.count(n, 2)?;
        Ok(fin)
    }

    /// Counts an upload, and stops the load at the first GPU error (out of memory, typically)
    /// rather than after the rest of the weights went nowhere.
    fn count(&mut self, bytes: u64, mats: usize) -> Result<()> {
        self.bytes += bytes;
        self.since_flush += bytes;
        if self.since_flush > 256 << 20 {
            // Let the staging memory of queued uploads go before it piles up.
            self.gpu.queue.submit([]);
            self.gpu.flush();
            self.since_flush = 0;
        }
        self.done += mats;
        (self.progress)(self.done, self.total);
        self.gpu.check_lost()
    }

    async fn vec(&mut self, src: &mut impl TensorSource, name: &str, n: usize) -> Result<wgpu::Buffer> {
        let t = src.tensor(name, 1, n).await?;
        self.gpu.storage_init(name, bytemuck::cast_slice(&t.to_f32()))
    }
}

impl Model {
    /// Uploads every tensor, one at a time, from `src`; `progress(done, total)` counts matrices.
    pub async fn build(gpu: Gpu, cfg: ModelConfig, src: &mut impl TensorSource, progress: impl FnMut(usize, usize)) -> Result<Self> {
        let c = &cfg;
        let mut up = Uploader { gpu: &gpu, bytes: 0, since_flush: 0, done: 0, total: 2 + c.num_layers * 7, progress };
        let (h, q, kv, f) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let embed = up.mat(src, "token_embd.weight", c.vocab_size, h).await?;
        let mut layers = Vec::with_capacity(c.num_layers);
        for l in 0..c.num_layers {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            layers.push(Layer {
                attn_norm: up.vec(src, &n("attn_norm"), h).await?,
                qkv: up.qkv(src, [n("attn_q"), n("attn_k"), n("attn_v")], [q, kv, kv], h).await?,
                wo: up.mat(src, &n("attn_output"), h, q).await?,
                ffn_norm: up.vec(src, &n("ffn_norm"), h).await?,
                ffn_in: up.gate_up(src, &n("ffn_gate"), &n("ffn_up"), f, h).await?,
                w_down: up.mat(src, &n("ffn_down"), h, f).await?,
            });
        }
        let out_norm = up.vec(src, "output_norm.weight", h).await?;
        let lm_head = if src.has("output.weight") && !c.tie_word_embeddings {
            Some(up.mat(src, "output.weight", c.vocab_size, h).await?)
        } else if !c.tie_word_embeddings {
            // Reading logits through the embedding would be silent garbage for an untied model.
            return Err(Error::Shape("the config says tie_word_embeddings is false, but the checkpoint has no lm_head.weight".into()));
        } else {
            None
        };
        let bytes = up.bytes;
        gpu.queue.submit([]);
        gpu.flush();
        gpu.check_lost()?;
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
    use crate::model::loader::{ModelFiles, WeightFormat};
    use crate::gpu::GpuOptions;
    use std::path::Path;

    struct FileSource<'a> {
        files: &'a ModelFiles,
        cfg: &'a ModelConfig,
    }

    impl TensorSource for FileSource<'_> {
        async fn tensor(&mut self, name: &str, rows: usize, cols: usize) -> Result<HostTensor<'_>> {
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
            Model::build(gpu, cfg.clone(), &mut src, progress).await
        }

        /// Loads a model onto an already open GPU (sharing its device and compiled pipelines).
        pub fn load_on(path: &Path, gpu: &Gpu, hf_format: WeightFormat) -> Result<Self> {
            let files = ModelFiles::open(path, hf_format)?;
            let cfg = files.config()?;
            Self::load_files(&files, cfg, gpu.clone())
        }

        fn load_files(files: &ModelFiles, cfg: ModelConfig, gpu: Gpu) -> Result<Self> {
            let mut src = FileSource { files, cfg: &cfg };
            pollster::block_on(Model::build(gpu, cfg.clone(), &mut src, |_, _| {}))
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub use native::LoadOptions;
