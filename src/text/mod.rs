//! The text layer: tokenizers ([`tokenizer`]: SentencePiece `tokenizer.model` in [`spm`],
//! `tokenizer.json`, GGUF vocabularies; UTF-8-safe stream decoding) and chat templates
//! ([`template`]).
//!
//! May use: [`crate::error`] and the model layer's file readers (a GGUF's vocabulary, a
//! checkpoint directory's files). Never the GPU session, chat or the front ends.

pub mod lang;
pub mod spm;
pub mod template;
pub mod tokenizer;
