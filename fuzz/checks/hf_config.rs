//! An HF checkpoint's files: `config.json` (and `model.safetensors.index.json`) as text, and
//! the input as a safetensors file: the native loader's path (header checked against the bytes,
//! then every tensor read, shape-checked and converted to each weight format) and the web
//! loader's (length prefix, then the JSON header read without the data).
//!
//! Shared by the fuzz target (fuzz/fuzz_targets/) and the seed replay of the test command
//! (tests/fuzz_seeds.rs).

use tildeopen::model::tensor::{index_shards, safetensors_header, safetensors_entries, safetensors_entry_tensor, safetensors_header_len, WeightFormat};
use tildeopen::ModelConfig;

/// One input: panics (an assertion) when a check fails.
pub fn run(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(cfg) = ModelConfig::from_hf_json(text) {
            let cfg = cfg.validated().expect("from_hf_json returns a validated config");
            // A validated configuration gives finite rotary tables (the kernels take them as
            // they are).
            let (inv, attn) = cfg.rope_inv_freq();
            let table = tildeopen::model::config::rope_table(&inv, attn, [0, 1, cfg.max_position_embeddings - 1]);
            assert!(table.iter().all(|f| f.is_finite()), "{cfg:?}: inv_freq {inv:?}, attention factor {attn}");
        }
        let _ = index_shards(text, "model.safetensors.index.json");
    }
    safetensors(data);
}

fn safetensors(data: &[u8]) {
    // Native: the whole file is mapped, the header parsed once, tensors read from its entries.
    if let Ok(entries) = safetensors_entries(data, "fuzz.safetensors") {
        for (name, e) in entries.iter().take(16) {
            // The shape the file claims, as the loader would ask for it when it matches.
            let (rows, cols) = match e.shape.as_slice() {
                [n] => (1, *n),
                [r, c] => (*r, *c),
                _ => (1, 1),
            };
            if rows.saturating_mul(cols) > 1 << 16 {
                continue;
            }
            for format in [WeightFormat::Q8_0, WeightFormat::Q4_0, WeightFormat::F16, WeightFormat::BF16] {
                let _ = safetensors_entry_tensor(data, e, name, rows, cols, format, "fuzz.safetensors");
            }
            // And a shape it does not have.
            let _ = safetensors_entry_tensor(data, e, name, rows + 1, cols, WeightFormat::Q8_0, "fuzz.safetensors");
        }
    }
    // Web: length prefix, then the header, without the data (the file is larger than the input).
    for file_len in [data.len() as u64, data.len() as u64 + (1 << 20)] {
        if let Ok(n) = safetensors_header_len(data, file_len, "fuzz.safetensors") {
            if let Some(json) = data.get(8..).and_then(|d| d.get(..n as usize)) {
                if let Ok(entries) = safetensors_header(json, n, file_len, "fuzz.safetensors") {
                    for e in entries.values() {
                        assert!(e.start <= e.end && e.end <= file_len, "{e:?} outside the {file_len}-byte file");
                    }
                }
            }
        }
    }
}
