//! A GGUF file's header: parse, the model configuration, the embedded vocabulary, and every
//! tensor the loader would read whose bytes lie inside the input (shape checks, Q/K row
//! un-permutation, dequantization of the norm vectors).
//!
//! The input is the start of a GGUF file. It is parsed twice: as the whole file, and as the
//! first bytes of a much larger file (how the web loader reads a header it fetched in part), so
//! seeds that hold only a header still get past the tensor bounds checks.
//!
//! Shared by the fuzz target (fuzz/fuzz_targets/) and the seed replay of the test command
//! (tests/fuzz_seeds.rs).

use tildeopen::model::gguf::{host_tensor, Gguf};
use tildeopen::text::tokenizer::Tokenizer;

/// One input: panics (an assertion) when a check fails.
pub fn run(data: &[u8]) {
    let whole = Gguf::parse(data, data.len() as u64, "fuzz.gguf");
    let prefix = Gguf::parse(data, data.len() as u64 + (1 << 32), "fuzz.gguf");
    for g in [whole, prefix].into_iter().flatten() {
        check(&g, data);
    }
}

fn check(g: &Gguf, data: &[u8]) {
    if let Ok(tok) = Tokenizer::from_gguf(g) {
        if let Ok(ids) = tok.encode_chat("Sveiki, pasaule! <|user|>Hi 12345 äö\n") {
            let _ = tok.decode(&ids);
        }
    }
    let Ok(cfg) = g.config() else { return };
    // A validated configuration gives finite rotary tables (the kernels take them as they are).
    let (inv, attn) = cfg.rope_inv_freq();
    assert!(inv.iter().all(|f| f.is_finite()) && attn.is_finite(), "{cfg:?}: inv_freq {inv:?}, attention factor {attn}");
    // The tensors Model::build asks for, with the shapes it asks for.
    let (h, q, kv, f, v) = (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim(), cfg.intermediate_size, cfg.vocab_size);
    let mut wanted = vec![("token_embd.weight".to_string(), v, h), ("output_norm.weight".into(), 1, h), ("output.weight".into(), v, h)];
    for l in 0..cfg.num_layers.min(4) {
        for (s, r, c) in [
            ("attn_norm", 1, h),
            ("attn_q", q, h),
            ("attn_k", kv, h),
            ("attn_v", kv, h),
            ("attn_output", h, q),
            ("ffn_norm", 1, h),
            ("ffn_gate", f, h),
            ("ffn_up", f, h),
            ("ffn_down", h, f),
        ] {
            wanted.push((format!("blk.{l}.{s}.weight"), r, c));
        }
    }
    for (name, rows, cols) in wanted {
        let Some(info) = g.tensor(&name) else { continue };
        // Only what the input holds: the rest of the "file" does not exist.
        let Some(bytes) = usize::try_from(info.offset).ok().zip(usize::try_from(info.size).ok()).and_then(|(o, n)| data.get(o..o.checked_add(n)?)) else {
            continue;
        };
        if let Ok(t) = host_tensor(info, bytes, rows, cols, &cfg) {
            if rows == 1 {
                let _ = t.to_f32();
            }
            let _ = t.ty.to_gpu_layout(&t.data);
        }
    }
}
