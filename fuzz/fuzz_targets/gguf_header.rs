//! The `gguf_header` fuzz target: the checks of fuzz/checks/gguf_header.rs on each input.

#![no_main]

#[path = "../checks/gguf_header.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
