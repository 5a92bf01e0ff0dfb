//! The `spm_model` fuzz target: the checks of fuzz/checks/spm_model.rs on each input.

#![no_main]

#[path = "../checks/spm_model.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
