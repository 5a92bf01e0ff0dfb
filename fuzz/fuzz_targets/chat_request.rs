//! The `chat_request` fuzz target: the checks of fuzz/checks/chat_request.rs on each input.

#![no_main]

#[path = "../checks/chat_request.rs"]
mod check;

/// The fixtures folder (../shared/fixtures beside the repository).
pub fn fixtures_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures")
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
