//! tildeopen-wgpu: the TildeOpen LLM family (Llama architecture), quantized, on WGSL compute
//! shaders over wgpu, natively (Vulkan/Metal/DX12) and in the browser (WebGPU).
//!
//! - [`config`]: the model's hyper-parameters and rotary tables.
//! - [`gguf`], [`loader`]: model files (GGUF, HF safetensors checkpoints).
//! - [`quant`]: tensor types in llama.cpp's block layouts.
//! - [`gpu`]: device, buffers, kernels.
//! - [`model`]: weights on the GPU. [`engine`]: sessions with a KV cache.

pub mod config;
pub mod engine;
pub mod error;
#[cfg(not(target_arch = "wasm32"))]
pub mod fetch;
pub mod gguf;
pub mod gpu;
#[cfg(not(target_arch = "wasm32"))]
pub mod loader;
#[cfg(target_arch = "wasm32")]
pub mod loader {
    //! On the web tensors arrive over the network; the host-side tensor type is shared.
    use crate::quant::{self, GgmlType};
    use std::borrow::Cow;
    /// A weight matrix on the host, in a GPU-ready layout.
    pub struct HostTensor<'a> {
        pub ty: GgmlType,
        pub rows: usize,
        pub cols: usize,
        pub data: Cow<'a, [u8]>,
    }
    impl HostTensor<'_> {
        pub fn to_f32(&self) -> Vec<f32> {
            let mut v = Vec::with_capacity(self.rows * self.cols);
            quant::dequantize_row(self.ty, &self.data, &mut v);
            v
        }
    }
}
pub mod model;
pub mod quant;

pub use config::ModelConfig;
pub use engine::{Session, SessionOptions};
pub use error::{Error, Result};
pub use model::Model;
