//! Native front ends over the chat layer: the HTTP server ([`server`]: SageMaker `/ping` and
//! `/invocations`, OpenAI `/v1/chat/completions` with SSE) and Batch Transform files
//! ([`batch`]).
//!
//! May use: [`crate::chat`] and below. Nothing imports it but the CLI.

pub mod batch;
mod records;
pub mod server;
