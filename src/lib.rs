//! tildeopen-wgpu: the TildeOpen LLM family (Llama architecture), quantized, on WGSL compute
//! shaders over wgpu, natively (Vulkan/Metal/DX12) and in the browser (WebGPU).
//!
//! Layers, lowest first (a layer uses only those before it; see ARCHITECTURE.md):
//! - [`error`], [`util`]: the error type, clock and identifiers.
//! - [`gpu`]: device, buffers, kernels; and the session that runs the forward pass.
//! - [`model`]: model files (GGUF, HF safetensors checkpoints), tensor types, weights on the GPU.
//! - [`text`]: tokenizers and chat templates.
//! - [`chat`]: request, `chat.completion`, chunk and error objects; sampling; tasks; the engine
//!   that answers requests; perplexity.
//! - Front ends: [`serve`] (native: HTTP endpoint, Batch Transform), `web` (wasm bindings), and
//!   the `tildeopen` binary (`src/cli/`).

pub mod chat;
pub mod error;
pub mod gpu;
pub mod model;
#[cfg(not(target_arch = "wasm32"))]
pub mod serve;
pub mod text;
pub mod util;
#[cfg(target_arch = "wasm32")]
pub mod web;

pub use chat::api::{ApiError, ChatCompletion, ChatCompletionChunk, ChatRequest, FinishReason, Message};
pub use chat::{ChatEngine, ChatOptions};
pub use error::{Error, Result};
pub use gpu::session::{KvType, Session, SessionOptions};
pub use model::config::ModelConfig;
pub use model::Model;
pub use text::tokenizer::Tokenizer;
