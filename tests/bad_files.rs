//! Corrupt, truncated and unsupported model files give one-line errors, never panics; the CLI
//! exits non-zero with a readable message.

mod common;
use common::*;
use std::path::PathBuf;
use std::process::Command;
use tildeopen::model::loader::{ModelFiles, WeightFormat};

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tildeopen-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn open_err(path: &std::path::Path) -> String {
    match ModelFiles::open(path, WeightFormat::F16).and_then(|f| f.config().map(|_| f)) {
        Ok(_) => panic!("{} opened without error", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn truncated_gguf() {
    let src = std::fs::read(fixtures().join("models/tiny-tildeopen/model-Q4_K_M.gguf")).unwrap();
    let d = tmpdir("trunc");
    for cut in [10, 2000, src.len() / 2, src.len() - 1] {
        let p = d.join(format!("cut{cut}.gguf"));
        std::fs::write(&p, &src[..cut]).unwrap();
        let e = open_err(&p);
        assert!(e.contains("truncated") || e.contains("too short") || e.contains("past the end"), "{cut}: {e}");
    }
}

/// The browser loader reads a GGUF header from a prefix of the file and asks for more only when
/// the header runs past it: a short prefix of a good file says "more", the whole header parses, and
/// a file whose header is cut or whose tensors run past its end is an error, not a request for more.
#[test]
fn gguf_header_from_a_prefix() {
    use tildeopen::model::gguf::Gguf;
    let src = std::fs::read(fixtures().join("models/tiny-tildeopen/model-Q4_K_M.gguf")).unwrap();
    let len = src.len() as u64;
    let whole = Gguf::parse(&src, len, "x").unwrap();
    let header = whole.data_offset as usize;
    // (The header proper ends within the alignment padding before data_offset.)
    for cut in [0, 3, 16, 100, header / 2, header - 32] {
        assert!(Gguf::parse_prefix(&src[..cut], len, "x").unwrap().is_none(), "prefix {cut}");
    }
    let g = Gguf::parse_prefix(&src[..header], len, "x").unwrap().expect("the header alone parses");
    assert_eq!(g.tensors.len(), whole.tensors.len());
    // The same prefix of a file that really ends there: no more to read, so an error.
    let e = Gguf::parse_prefix(&src[..header / 2], (header / 2) as u64, "x").unwrap_err().to_string();
    assert!(e.contains("truncated"), "{e}");
    // The header is whole but the file is shorter than its tensors: an error at once.
    let e = Gguf::parse_prefix(&src[..header], len - 1, "x").unwrap_err().to_string();
    assert!(e.contains("past the end"), "{e}");
}

#[test]
fn wrong_magic() {
    let mut src = std::fs::read(fixtures().join("models/tiny-tildeopen/model-Q8_0.gguf")).unwrap();
    src[..4].copy_from_slice(b"GGML");
    let p = tmpdir("magic").join("bad.gguf");
    std::fs::write(&p, &src).unwrap();
    assert!(open_err(&p).contains("bad magic"));
}

#[test]
fn unsupported_tensor_type() {
    // Rewrite the type id of the first tensor to Q2_K (10).
    let path = fixtures().join("models/tiny-tildeopen/model-Q8_0.gguf");
    let mut src = std::fs::read(&path).unwrap();
    let g = tildeopen::model::gguf::Gguf::parse(&src, src.len() as u64, "x").unwrap();
    let name = g.tensors[0].name.as_bytes().to_vec();
    let at = src.windows(name.len()).rposition(|w| w == name).unwrap() + name.len();
    let nd = u32::from_le_bytes(src[at..at + 4].try_into().unwrap()) as usize;
    let ty_at = at + 4 + 8 * nd;
    src[ty_at..ty_at + 4].copy_from_slice(&10u32.to_le_bytes());
    let p = tmpdir("type").join("q2k.gguf");
    std::fs::write(&p, &src).unwrap();
    let e = open_err(&p);
    assert!(e.contains("Q2_K"), "{e}");
}

#[test]
fn unknown_architecture() {
    let mut src = std::fs::read(fixtures().join("models/tiny-tildeopen/model-Q8_0.gguf")).unwrap();
    let key = b"general.architecture";
    let at = src.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    // value: u32 type (8 = string), u64 length 5, "llama"
    assert_eq!(&src[at + 12..at + 17], b"llama");
    src[at + 12..at + 17].copy_from_slice(b"qwen2");
    let p = tmpdir("arch").join("qwen.gguf");
    std::fs::write(&p, &src).unwrap();
    let e = open_err(&p);
    assert!(e.contains("unsupported model") && e.contains("qwen2"), "{e}");

    let d = tmpdir("arch-hf");
    let cfg = std::fs::read_to_string(fixtures().join("models/tiny-tildeopen/config.json"))
        .unwrap()
        .replace("LlamaForCausalLM", "MistralForCausalLM")
        .replace("\"llama\"", "\"mistral\"");
    std::fs::write(d.join("config.json"), cfg).unwrap();
    std::os::unix::fs::symlink(fixtures().join("models/tiny-tildeopen/model.safetensors"), d.join("model.safetensors")).unwrap();
    let e = open_err(&d);
    assert!(e.contains("unsupported model") && e.contains("mistral"), "{e}");
}

/// A copy of the tiny HF checkpoint in a new directory `name`, the first `from` in its
/// safetensors header replaced by `to` (the length prefix rewritten, the data unchanged); also
/// returns the original file's bytes.
fn tiny_checkpoint_with_header(name: &str, from: &str, to: &str) -> (PathBuf, Vec<u8>) {
    let src_dir = fixtures().join("models/tiny-tildeopen");
    let d = tmpdir(name);
    std::fs::copy(src_dir.join("config.json"), d.join("config.json")).unwrap();
    let bytes = std::fs::read(src_dir.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
    let changed = header.replacen(from, to, 1);
    assert_ne!(changed, header, "fixture header layout changed");
    let mut out = (changed.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(changed.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(d.join("model.safetensors"), &out).unwrap();
    (d, bytes)
}

/// Two shards holding the same tensor: refused (natively the last shard won, on the web the first).
#[test]
fn a_tensor_in_two_shards() {
    let d = tmpdir("twoshards");
    let src_dir = fixtures().join("models/tiny-tildeopen");
    std::fs::copy(src_dir.join("config.json"), d.join("config.json")).unwrap();
    for f in ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"] {
        std::os::unix::fs::symlink(src_dir.join("model.safetensors"), d.join(f)).unwrap();
    }
    let index = r#"{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}"#;
    std::fs::write(d.join("model.safetensors.index.json"), index).unwrap();
    let e = open_err(&d);
    assert!(e.contains("in two shards"), "{e}");
}

#[test]
fn safetensors_header_lies_about_sizes() {
    // Claim the lm_head is bigger than it is: same header length, offsets past the data.
    let (d, bytes) = tiny_checkpoint_with_header("st", "\"data_offsets\":[0,2097152]", "\"data_offsets\":[0,9097152]");
    let e = open_err(&d);
    assert!(e.contains("corrupt model file"), "{e}");
    // A file cut short is caught too.
    std::fs::write(d.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    assert!(open_err(&d).contains("corrupt model file"));
}

#[test]
fn shape_mismatch_is_an_error() {
    let d = tmpdir("shape");
    let src_dir = fixtures().join("models/tiny-tildeopen");
    let cfg = std::fs::read_to_string(src_dir.join("config.json")).unwrap().replace("\"intermediate_size\": 768", "\"intermediate_size\": 1024");
    std::fs::write(d.join("config.json"), cfg).unwrap();
    std::os::unix::fs::symlink(src_dir.join("model.safetensors"), d.join("model.safetensors")).unwrap();
    let opts = tildeopen::model::LoadOptions::default();
    let e = pollster::block_on(tildeopen::Model::load(&d, &opts)).err().expect("loaded a mismatched model").to_string();
    assert!(e.contains("shape mismatch"), "{e}");
}

fn cli(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tildeopen")).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn cli_errors_are_one_line() {
    let m = fixtures().join("models/tiny-tildeopen/model-Q8_0.gguf");
    let m = m.to_str().unwrap();
    for (args, want) in [
        (vec!["logits", "--model", "/nonexistent.gguf", "--tokens", "1"], "No such file"),
        (vec!["logits", "--model", m, "--tokens", "1,99999"], "out of range"),
        (vec!["logits", "--model", m, "--tokens", "1,x"], "bad token id"),
        (vec!["complete", "--model", m, "--tokens", "1", "--quant", "q3"], "unknown weight format"),
        (vec!["logits", "--model", m, "--tokens", "1", "--max-binding-size", "100"], "too small"),
    ] {
        let (code, _, err) = cli(&args);
        check(&args, code, &err, want);
    }
    // No adapter: only backends that do not exist on this machine.
    let out = Command::new(env!("CARGO_BIN_EXE_tildeopen")).arg("info").env("WGPU_BACKEND", "dx12").output().unwrap();
    check(&["info (WGPU_BACKEND=dx12)"], out.status.code().unwrap_or(-1), &String::from_utf8_lossy(&out.stderr), "no usable GPU adapter");
}

fn check(args: &[&str], code: i32, err: &str, want: &str) {
    assert_ne!(code, 0, "{args:?}");
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("{args:?}: {err}"));
    assert!(line.contains(want), "{args:?}: {line}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
}

#[test]
fn cli_logits_and_complete() {
    let root = fixtures().join("models/tiny-tildeopen-decoupled");
    let g = golden(&root.join("model-Q4_K_M.golden.safetensors"));
    let m = root.join("model-Q4_K_M.gguf");
    let ids: Vec<String> = g.input_ids[..5].iter().map(|i| i.to_string()).collect();
    let (code, out, err) = cli(&["logits", "--model", m.to_str().unwrap(), "--tokens", &ids.join(","), "--kv-cache", "f32"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = v["logits"].as_array().unwrap();
    assert_eq!(rows.len(), 5);
    let got: Vec<Vec<f32>> = rows.iter().map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()).collect();
    assert!(max_abs_diff(&got, &g.logits[..5]) <= 0.01);

    let p: Vec<String> = g.prompt_ids.iter().map(|i| i.to_string()).collect();
    let (code, out, err) = cli(&["complete", "--model", m.to_str().unwrap(), "--tokens", &p.join(","), "--max-tokens", "4", "--temperature", "0", "--json", "--kv-cache", "f32"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ids: Vec<u32> = v["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    assert_eq!(ids.len(), 4);
    let firm = g.greedy_margins.iter().position(|m| *m < 0.05).unwrap_or(4).min(4);
    assert_eq!(&ids[..firm], &g.greedy_ids[..firm]);
}

/// config.json values that lie: each is an error naming the field (no silent default, no huge
/// allocation), checked before any weight is read.
#[test]
fn invalid_config_values_name_the_field() {
    let good = std::fs::read_to_string(fixtures().join("models/tiny-tildeopen/config.json")).unwrap();
    let base: serde_json::Value = serde_json::from_str(&good).unwrap();
    assert!(tildeopen::ModelConfig::from_hf_json(&good).is_ok());
    let cases: Vec<(&str, serde_json::Value)> = vec![
        ("head_dim", serde_json::json!(-1)),
        ("head_dim", serde_json::json!(0)),
        ("rope_theta", serde_json::json!(0)),
        ("rope_theta", serde_json::json!(-5.0)),
        ("rms_norm_eps", serde_json::json!("x")),
        ("rms_norm_eps", serde_json::json!(0)),
        ("max_position_embeddings", serde_json::json!(0)),
        ("num_hidden_layers", serde_json::json!(1u64 << 40)),
        ("num_hidden_layers", serde_json::json!(0)),
        ("hidden_size", serde_json::json!("big")),
        ("vocab_size", serde_json::json!(0)),
        // 2^22 rows / 64 per workgroup would exceed one dispatch dimension (65535).
        ("vocab_size", serde_json::json!(1u64 << 22)),
        ("num_key_value_heads", serde_json::json!(3)),
        ("intermediate_size", serde_json::json!(1.5)),
        // Found by the hf_config fuzz target: a zero factor gave infinite rotary frequencies.
        ("rope_scaling", serde_json::json!({"type": "linear", "factor": 0.0})),
        // Found by the gguf_header fuzz target: a tiny rope_theta overflowed the frequencies.
        ("rope_theta", serde_json::json!(1.7e-44)),
        ("rope_theta", serde_json::json!(0.5)),
        ("rope_scaling", serde_json::json!({"type": "yarn", "factor": 4.0, "beta_fast": 0.0})),
        ("rope_scaling", serde_json::json!({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0})),
        // Wrongly typed fields were read as their defaults (a bias taken as absent, a wrapped size).
        ("attention_bias", serde_json::json!("true")),
        ("mlp_bias", serde_json::json!(1)),
        ("tie_word_embeddings", serde_json::json!("true")),
        ("hidden_act", serde_json::json!(5)),
        ("hidden_size", serde_json::json!((1u64 << 32) + 64)),
        ("eos_token_id", serde_json::json!((1u64 << 32) + 2)),
        ("bos_token_id", serde_json::json!("1")),
        ("rope_scaling", serde_json::json!({"type": "yarn", "factor": 4.0, "beta_fast": "64"})),
        ("rope_scaling", serde_json::json!({"type": "yarn", "factor": 4.0, "truncate": "no"})),
    ];
    for (key, value) in cases {
        let mut v = base.clone();
        v[key] = value.clone();
        match tildeopen::ModelConfig::from_hf_json(&v.to_string()) {
            Ok(_) => panic!("{key} = {value} was accepted"),
            Err(e) => {
                let msg = e.to_string();
                let named = msg.contains(key) || (key == "num_key_value_heads" && msg.contains("KV heads"));
                assert!(named, "{key} = {value}: {msg}");
            }
        }
    }
}

/// GGUF tensor offsets that lie (unaligned, wrapping past u64, overlapping another tensor) are
/// errors at parse time, before any weight is read.
#[test]
fn gguf_offsets_that_lie() {
    let path = fixtures().join("models/tiny-tildeopen/model-Q8_0.gguf");
    let src = std::fs::read(&path).unwrap();
    let g = tildeopen::model::gguf::Gguf::parse(&src, src.len() as u64, "x").unwrap();
    // The offset field of tensor `i` in the header.
    let off_at = |i: usize| {
        let name = g.tensors[i].name.as_bytes();
        let at = src.windows(name.len()).rposition(|w| w == name).unwrap() + name.len();
        let nd = u32::from_le_bytes(src[at..at + 4].try_into().unwrap()) as usize;
        at + 4 + 8 * nd + 4
    };
    let second = u64::from_le_bytes(src[off_at(1)..off_at(1) + 8].try_into().unwrap());
    let first = u64::from_le_bytes(src[off_at(0)..off_at(0) + 8].try_into().unwrap());
    for (what, value, want) in [
        ("unaligned", second + 1, "aligned"),
        ("wrapping", u64::MAX - 31, "overflow"),
        ("overlapping", first, "overlap"),
    ] {
        let mut bad = src.clone();
        let at = off_at(1);
        bad[at..at + 8].copy_from_slice(&value.to_le_bytes());
        let e = match tildeopen::model::gguf::Gguf::parse(&bad, bad.len() as u64, "bad.gguf") {
            Ok(_) => panic!("{what} offset accepted"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(want), "{what}: {e}");
    }
    // Dimensions whose element count fits u64 but whose byte size does not (found by the
    // gguf_header fuzz target: the size wrapped, so the tensor seemed to fit in the file).
    let name = g.tensors[1].name.as_bytes();
    let at = src.windows(name.len()).rposition(|w| w == name).unwrap() + name.len();
    let nd = u32::from_le_bytes(src[at..at + 4].try_into().unwrap()) as usize;
    let mut bad = src.clone();
    bad[at + 4..at + 12].copy_from_slice(&0xFC00_0000_0000_0000u64.to_le_bytes());
    for d in 1..nd {
        bad[at + 4 + 8 * d..at + 12 + 8 * d].copy_from_slice(&1u64.to_le_bytes());
    }
    match tildeopen::model::gguf::Gguf::parse(&bad, bad.len() as u64, "bad.gguf") {
        Ok(_) => panic!("a byte size past u64 accepted"),
        Err(e) => assert!(e.to_string().contains("overflow"), "{e}"),
    }
    // A zero dimension makes every product 0, whatever the others claim.
    let mut bad = src.clone();
    bad[at + 4..at + 12].copy_from_slice(&0u64.to_le_bytes());
    for d in 1..nd {
        bad[at + 4 + 8 * d..at + 12 + 8 * d].copy_from_slice(&(1u64 << 40).to_le_bytes());
    }
    match tildeopen::model::gguf::Gguf::parse(&bad, bad.len() as u64, "bad.gguf") {
        Ok(_) => panic!("a zero dimension accepted"),
        Err(e) => assert!(e.to_string().contains("zero dimension"), "{e}"),
    }
}

/// A metadata array of more elements than any vocabulary is refused before it is allocated
/// (each parsed element takes 32 times the byte it is in the file).
#[test]
fn gguf_metadata_array_too_long() {
    let n = (1u64 << 24) + 1;
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes()); // tensors
    b.extend_from_slice(&1u64.to_le_bytes()); // metadata entries
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b'x');
    b.extend_from_slice(&9u32.to_le_bytes()); // array
    b.extend_from_slice(&0u32.to_le_bytes()); // of u8
    b.extend_from_slice(&n.to_le_bytes());
    b.resize(b.len() + n as usize, 7);
    match tildeopen::model::gguf::Gguf::parse(&b, b.len() as u64, "long.gguf") {
        Ok(_) => panic!("a {n}-element array accepted"),
        Err(e) => assert!(e.to_string().contains("metadata array"), "{e}"),
    }
}

/// Many arrays, each under the per-array bound, are bounded in all: 2^23 elements (a parsed
/// element takes 32 bytes, so 32 MiB of u8 arrays would have taken over 1 GiB), and a tensor
/// named twice is refused.
#[test]
fn gguf_metadata_bounded_in_all_and_tensors_named_once() {
    let per = 1u64 << 22;
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes()); // tensors
    b.extend_from_slice(&3u64.to_le_bytes()); // metadata entries
    for key in [b'a', b'b', b'c'] {
        b.extend_from_slice(&1u64.to_le_bytes());
        b.push(key);
        b.extend_from_slice(&9u32.to_le_bytes()); // array
        b.extend_from_slice(&0u32.to_le_bytes()); // of u8
        b.extend_from_slice(&per.to_le_bytes());
        b.resize(b.len() + per as usize, 7);
    }
    let e = tildeopen::model::gguf::Gguf::parse(&b, b.len() as u64, "many.gguf").expect_err("3 x 2^22 elements accepted").to_string();
    assert!(e.contains("in all"), "{e}");

    // The tiny GGUF with its second tensor renamed to the first's name (names are length-prefixed
    // strings in the header; the two names have the same length only if we pick such a pair).
    let path = fixtures().join("models/tiny-tildeopen/model-Q8_0.gguf");
    let mut src = std::fs::read(&path).unwrap();
    let g = tildeopen::model::gguf::Gguf::parse(&src, src.len() as u64, "x").unwrap();
    let (a, b2) = g
        .tensors
        .iter()
        .enumerate()
        .find_map(|(i, t)| g.tensors[i + 1..].iter().find(|u| u.name.len() == t.name.len()).map(|u| (t.name.clone(), u.name.clone())))
        .expect("two tensor names of one length");
    let at = src.windows(b2.len()).position(|w| w == b2.as_bytes()).unwrap();
    src[at..at + a.len()].copy_from_slice(a.as_bytes());
    let e = tildeopen::model::gguf::Gguf::parse(&src, src.len() as u64, "dup.gguf").expect_err("a tensor named twice").to_string();
    assert!(e.contains("appears twice"), "{e}");
}

/// A checkpoint whose config unties the head but which has no lm_head is an error, not logits
/// read through the embedding.
#[test]
fn untied_head_without_lm_head() {
    let (d, _) = tiny_checkpoint_with_header("nohead", "\"lm_head.weight\"", "\"lm_head.unused\"");
    let opts = tildeopen::model::LoadOptions::default();
    let e = pollster::block_on(tildeopen::Model::load(&d, &opts)).err().expect("loaded an untied model without its head").to_string();
    assert!(e.contains("lm_head"), "{e}");
}

/// A sharded checkpoint's index may only name files inside its directory.
#[test]
fn shard_index_names_stay_inside_the_checkpoint() {
    use tildeopen::model::tensor::index_shards;
    let ok = r#"{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}"#;
    assert_eq!(index_shards(ok, "index").unwrap().len(), 2);
    for bad in ["../secrets.safetensors", "/etc/passwd", "sub/dir.safetensors", "..", "C:\\\\x.safetensors", "", "%2e%2e", "a%2fb.safetensors", "x?y", "x#y"] {
        let text = serde_json::json!({"weight_map": {"a": bad}}).to_string();
        let e = index_shards(&text, "index").expect_err(bad).to_string();
        assert!(e.contains("not a file name"), "{bad}: {e}");
    }
}

/// Weights that make every logit NaN (a NaN final norm): greedy decoding says the activations
/// overflowed instead of emitting a token id past the vocabulary (the GPU argmax of a row with
/// no finite logit) or token 0.
#[test]
fn nan_logits_are_an_error() {
    let d = tmpdir("nan");
    let src = fixtures().join("models/tiny-tildeopen");
    for f in ["config.json", "generation_config.json", "tokenizer.model", "tokenizer_config.json"] {
        std::os::unix::fs::symlink(src.join(f), d.join(f)).unwrap();
    }
    let mut bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let t = &header["model.norm.weight"];
    assert_eq!(t["dtype"], "BF16");
    let (a, b) = (t["data_offsets"][0].as_u64().unwrap() as usize, t["data_offsets"][1].as_u64().unwrap() as usize);
    for w in bytes[8 + n + a..8 + n + b].chunks_mut(2) {
        w.copy_from_slice(&0x7fc0u16.to_le_bytes()); // bf16 NaN
    }
    std::fs::write(d.join("model.safetensors"), &bytes).unwrap();
    let args = ["complete", "--model", d.to_str().unwrap(), "--tokens", "1,2,3", "--max-tokens", "2", "--temperature", "0"];
    let (code, _, err) = cli(&args);
    check(&args, code, &err, "no finite logit");
}

/// GGUF metadata of the wrong type, or per-token arrays of the wrong length, are errors that
/// name the key, not silent defaults (a string rope base once became 10000).
#[test]
fn gguf_metadata_of_the_wrong_type() {
    use tildeopen::model::gguf::{Gguf, Value};
    let path = fixtures().join("models/tiny-tildeopen/model-Q8_0.gguf");
    let src = std::fs::read(&path).unwrap();
    let good = Gguf::parse(&src, src.len() as u64, "x").unwrap();
    assert!(good.config().is_ok() && tildeopen::Tokenizer::from_gguf(&good).is_ok());
    for (key, value, want) in [
        ("llama.rope.freq_base", Value::Str("1e6".into()), "llama.rope.freq_base must be a number"),
        ("llama.context_length", Value::F64(4096.5), "llama.context_length must be a non-negative integer"),
        ("llama.attention.head_count_kv", Value::I64(-2), "head_count_kv"),
        ("llama.rope.dimension_count", Value::U64(8), "dimension_count"),
        // Were read as absent: plain RoPE, no bos.
        ("llama.rope.scaling.type", Value::U64(2), "llama.rope.scaling.type must be a string"),
        ("tokenizer.ggml.bos_token_id", Value::I64(-1), "tokenizer.ggml.bos_token_id must be a token id"),
    ] {
        let mut g = Gguf::parse(&src, src.len() as u64, "x").unwrap();
        g.metadata.insert(key.into(), value);
        let e = g.config().err().unwrap_or_else(|| panic!("{key} accepted")).to_string();
        assert!(e.contains(want), "{key}: {e}");
    }
    let n = match good.get("tokenizer.ggml.tokens") {
        Some(Value::Array(a)) => a.len(),
        _ => panic!("no tokens"),
    };
    for (key, value, want) in [
        ("tokenizer.ggml.scores", Value::Array(vec![Value::F64(0.0); n - 1]), "entries for"),
        ("tokenizer.ggml.token_type", Value::Array(vec![Value::Str("x".into()); n]), "not an integer"),
        ("tokenizer.ggml.tokens", Value::Array(vec![Value::U64(1); n]), "not a string"),
        ("tokenizer.ggml.eos_token_id", Value::U64((1 << 32) + 2), "not a token id"),
    ] {
        let mut g = Gguf::parse(&src, src.len() as u64, "x").unwrap();
        g.metadata.insert(key.into(), value);
        let e = tildeopen::Tokenizer::from_gguf(&g).err().unwrap_or_else(|| panic!("{key} accepted")).to_string();
        assert!(e.contains(key) && e.contains(want), "{key}: {e}");
    }
}
