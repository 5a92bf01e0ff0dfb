//! tildeopen-wgpu: the TildeOpen LLM family (Llama architecture), quantized, on WGSL compute
//! shaders over wgpu, natively (Vulkan/Metal/DX12) and in the browser (WebGPU).
//!
//! - [`config`]: the model's hyper-parameters and rotary tables.
//! - [`gguf`], [`loader`]: model files (GGUF, HF safetensors checkpoints).
//! - [`quant`]: tensor types in llama.cpp's block layouts; [`tensor`]: a weight on the host.
//! - [`gpu`]: device, buffers, kernels.
//! - [`model`]: weights on the GPU. [`engine`]: sessions with a KV cache.
//! - [`tokenizer`]: SentencePiece, GGUF and `tokenizer.json` vocabularies; [`template`]: chat
//!   templates; [`sampling`]: next-token choice; [`tasks`]: the five task request builders.
//! - [`api`]: request, `chat.completion`, chunk and error objects; [`chat`]: the engine that
//!   answers requests. Native only: [`server`] (HTTP endpoint, SageMaker contract) and [`batch`]
//!   (Batch Transform files).

pub mod api;
#[cfg(not(target_arch = "wasm32"))]
pub mod batch;
pub mod chat;
pub mod config;
pub mod engine;
pub mod error;
#[cfg(not(target_arch = "wasm32"))]
pub mod fetch;
pub mod gguf;
pub mod gpu;
#[cfg(not(target_arch = "wasm32"))]
pub mod loader;
#[doc(hidden)]
pub mod loader_names;
pub mod model;
pub mod perplexity;
pub mod quant;
pub mod sampling;
#[cfg(not(target_arch = "wasm32"))]
pub mod server;
pub mod tasks;
pub mod template;
pub mod tensor;
pub mod tokenizer;
pub mod util;
#[cfg(target_arch = "wasm32")]
pub mod wasm;

pub use api::{ApiError, ChatCompletion, ChatCompletionChunk, ChatRequest, FinishReason, Message};
pub use chat::{ChatEngine, ChatOptions};
pub use config::ModelConfig;
pub use engine::{Session, SessionOptions};
pub use error::{Error, Result};
pub use model::Model;
pub use tokenizer::Tokenizer;
