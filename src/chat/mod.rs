//! The chat layer: the API objects and request validation ([`api`]), next-token choice
//! ([`sampling`]), the five tasks ([`tasks`]), requests into prompts ([`prompt`]), the engine that
//! answers them (slots, continuous batching, prefix sharing, streaming: [`engine`]) and [`perplexity`].
//!
//! May use: every lower layer ([`crate::model`], [`crate::gpu`], [`crate::text`]). Never the
//! front ends (server, batch, web bindings, CLI).

pub mod api;
pub mod engine;
pub mod perplexity;
pub mod prompt;
pub mod sampling;
pub mod tasks;

pub use engine::*;
pub use prompt::{Prepared, Prompter};
