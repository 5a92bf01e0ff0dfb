//! The GPU layer: the device and its limits, buffers and readback ([`device`]), the WGSL kernels
//! and their pipelines ([`kernels`]), and the session that records and runs the forward pass
//! over a model's weights with a KV cache ([`session`]).
//!
//! [`device`] and [`kernels`] know nothing of models (the model layer uploads its weights
//! through them); [`session`] sits above the model layer. May use: [`crate::error`],
//! [`crate::model`] (session only). Never text, chat or the front ends.

pub mod device;
pub mod kernels;
pub mod session;

pub use device::*;
