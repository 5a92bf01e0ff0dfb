//! The fuzz targets' checks (fuzz/checks/) on their seeds, in the test command: the seeds
//! `fuzz/make_seeds.py` makes from the fixtures (and SmolLM2's GGUF header), the committed
//! ones (fuzz/seeds/) and, where a fuzzing run left one, the grown corpus (fuzz/corpus/). Every
//! input found to crash a parser so far is among them or has its own regression test. Fuzzing
//! itself (libFuzzer, AddressSanitizer, new inputs) is `scripts/fuzz`.

mod common;

#[path = "../fuzz/checks/chat_request.rs"]
mod chat_request;
#[path = "../fuzz/checks/gguf_header.rs"]
mod gguf_header;
#[path = "../fuzz/checks/hf_config.rs"]
mod hf_config;
#[path = "../fuzz/checks/spm_model.rs"]
mod spm_model;

use std::path::{Path, PathBuf};

/// The fixtures folder, for chat_request's tokenizers.
pub fn fixtures_dir() -> PathBuf {
    common::fixtures()
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir).map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_file()).collect()).unwrap_or_default();
    v.sort();
    v
}

#[test]
fn fuzz_checks_pass_on_every_seed() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let made = std::env::temp_dir().join(format!("tildeopen-seeds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&made);
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(repo.join("fuzz/make_seeds.py")).arg(common::fixtures()).arg(&made);
    if let Ok(s) = std::env::var("TILDEOPEN_SMOLLM2") {
        cmd.arg(s);
    }
    let out = cmd.output().expect("python3 runs fuzz/make_seeds.py");
    assert!(out.status.success(), "make_seeds.py: {}", String::from_utf8_lossy(&out.stderr));

    let targets: [(&str, fn(&[u8])); 4] = [("chat_request", chat_request::run), ("gguf_header", gguf_header::run), ("hf_config", hf_config::run), ("spm_model", spm_model::run)];
    let mut failures = vec![];
    for (name, run) in targets {
        let inputs: Vec<PathBuf> = [made.join(name), repo.join("fuzz/seeds").join(name), repo.join("fuzz/corpus").join(name)].iter().flat_map(|d| files(d)).collect();
        // Every target has seeds: a folder renamed or a generator broken must not pass empty.
        assert!(inputs.len() >= 5, "{name}: only {} seeds", inputs.len());
        for f in &inputs {
            let data = std::fs::read(f).unwrap();
            if std::panic::catch_unwind(|| run(&data)).is_err() {
                failures.push(format!("{name}: {}", f.display()));
            }
        }
        println!("{name}: {} inputs", inputs.len());
    }
    std::fs::remove_dir_all(&made).ok();
    assert!(failures.is_empty(), "the fuzz checks fail on (replay with `cargo +nightly fuzz run TARGET FILE`):\n{}", failures.join("\n"));
}
