//! The `hf_config` fuzz target: the checks of fuzz/checks/hf_config.rs on each input.

#![no_main]

#[path = "../checks/hf_config.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
