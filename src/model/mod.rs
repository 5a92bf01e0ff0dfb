//! The model layer: everything about a model's files and weights. Hyper-parameters
//! ([`config`]), the GGUF reader ([`gguf`]), HF checkpoints and safetensors ([`loader`]), tensor
//! names ([`names`]), quantized block layouts ([`quant`]), a weight on the host ([`tensor`]),
//! and the weights uploaded to the GPU ([`weights`]: [`Model`], [`GpuMatrix`]); natively also
//! the default demo model ([`fetch`]).
//!
//! May use: [`crate::error`], [`crate::util`], and the GPU device ([`crate::gpu::Gpu`], buffers
//! only) to upload weights. Never the session, text, chat or front-end layers.

pub mod config;
#[cfg(not(target_arch = "wasm32"))]
pub mod fetch;
pub mod gguf;
#[cfg(not(target_arch = "wasm32"))]
pub mod loader;
#[doc(hidden)]
pub mod names;
pub mod quant;
pub mod tensor;
pub mod weights;

pub use weights::*;
