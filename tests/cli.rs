//! The command line's chat-side commands on the tiny fixture: output shapes, streaming lines,
//! JSON error bodies, tokenize --jsonl, complete --prompt, perplexity's last line.

mod common;
use common::fixtures;
use std::io::Write;
use std::process::{Command, Stdio};

fn cli(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tildeopen"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A command that fails on its flags exits without reading stdin: a broken pipe here is fine
    // (what the command printed is what the test checks).
    if let Err(e) = child.stdin.take().unwrap().write_all(stdin.as_bytes()) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    let out = child.wait_with_output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn tiny() -> String {
    fixtures().join("models/tiny-tildeopen/model-Q8_0.gguf").to_str().unwrap().to_string()
}

#[test]
fn chat_json_and_stream() {
    let m = tiny();
    let (code, out, err) = cli(&["chat", "--model", &m, "--max-tokens", "4", "--json", "Hello"], "");
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!((v["object"].as_str(), v["choices"][0]["finish_reason"].as_str()), (Some("chat.completion"), Some("length")));
    assert_eq!(v["usage"]["completion_tokens"], 4);

    let (code, out, err) = cli(&["translate", "--model", &m, "--from", "en", "--to", "lv", "--max-tokens", "4", "--json", "--stream", "I like cakes."], "");
    assert_eq!(code, 0, "{err}");
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines.len() >= 2);
    assert!(lines.iter().all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(lines.last().unwrap()["choices"][0]["finish_reason"], "length");

    // A request from a JSON file on stdin, with its own max_tokens.
    let (code, out, err) = cli(&["chat", "--model", &m, "--request", "-", "--json"], r#"{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2,"temperature":0}"#);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"completion_tokens\":2"), "{out}");
    // --stream applies to a request file; sampling flags conflict with it (the file's fields
    // are the settings) instead of being ignored.
    let (code, out, err) = cli(&["chat", "--model", &m, "--request", "-", "--json", "--stream"], r#"{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2,"temperature":0}"#);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().all(|l| l.contains("chat.completion.chunk")), "{out}");
    let (code, _, err) = cli(&["chat", "--model", &m, "--request", "-", "--max-tokens", "5"], "{}");
    assert_ne!(code, 0);
    assert!(err.contains("--max-tokens") && err.contains("--request"), "{err}");
}

#[test]
fn interactive_chat_reads_turns_from_stdin() {
    let m = tiny();
    let (code, out, err) = cli(&["chat", "--model", &m, "--max-tokens", "3", "--json"], "Hello\n\n/reset\nBye\n");
    assert_eq!(code, 0, "{err}");
    let answers: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(answers.len(), 2, "{out}");
    // After /reset the history is gone: the second prompt is as short as the first.
    let p = |i: usize| answers[i]["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(p(1) <= p(0) + 2, "{} vs {}", p(1), p(0));
}

#[test]
fn errors_have_json_bodies() {
    let m = tiny();
    let long = "word ".repeat(300);
    let (code, out, err) = cli(&["ask", "--model", &m, "--ctx-size", "64", "--context", &long, "--json", "What?"], "");
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert!(v.get("choices").is_none());
    assert!(err.lines().any(|l| l.starts_with("error:") && l.contains("context window of 64")), "{err}");
    let (code, out, _) = cli(&["chat", "--model", &m, "--request", "-", "--json"], "{not json");
    assert_eq!(code, 1);
    assert!(serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()["error"]["message"].as_str().unwrap().starts_with("malformed request"));
}

#[test]
fn tokenize_complete_perplexity() {
    let spm = fixtures().join("tokenizers/tokenizer-unigram.model");
    let (code, out, err) = cli(&["tokenize", "--model", spm.to_str().unwrap(), "--jsonl"], "{\"text\": \"Man patīk kūkas.\"}\n{\"text\": \"\"}\n");
    assert_eq!(code, 0, "{err}");
    let golden = std::fs::read_to_string(fixtures().join("tokenizers/tokenizer-unigram.golden-1.jsonl")).unwrap();
    let want = golden.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()).find(|v| v["text"] == "Man patīk kūkas.").unwrap();
    let got: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(got, [serde_json::json!({"ids": want["ids"]}), serde_json::json!({"ids": []})]);

    let m = tiny();
    let (code, out, err) = cli(&["complete", "--model", &m, "--prompt", "Man patīk", "--max-tokens", "3", "--json"], "");
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["ids"].as_array().unwrap().len(), 3);
    assert!(v["text"].is_string());

    let text = std::env::temp_dir().join(format!("tildeopen-ppl-{}.txt", std::process::id()));
    std::fs::write(&text, "The quick brown fox jumps over the lazy dog. ".repeat(20)).unwrap();
    let (code, out, err) = cli(&["perplexity", "--model", &m, "--file", text.to_str().unwrap(), "--ctx", "32", "--chunks", "2"], "");
    std::fs::remove_file(&text).ok();
    assert_eq!(code, 0, "{err}");
    let last = out.lines().last().unwrap();
    let ppl: f64 = last.strip_prefix("PPL = ").unwrap().parse().unwrap();
    assert!(ppl.is_finite() && ppl > 1.0, "{last}");
}

/// `info` reports the fast paths the device gets, and the environment switches reach them:
/// on lavapipe (a CPU device) the norm fold and the integer dot are off unless asked for, and
/// `TILDEOPEN_BASELINE_KERNELS=1` turns every optional path off.
#[test]
fn info_reports_fast_paths_and_their_switches() {
    let info = |env: &[(&str, &str)]| -> serde_json::Value {
        let mut c = Command::new(env!("CARGO_BIN_EXE_tildeopen"));
        c.arg("info");
        for v in ["TILDEOPEN_NORM_FOLD", "TILDEOPEN_INT_DOT", "TILDEOPEN_SUBGROUPS", "TILDEOPEN_BASELINE_KERNELS", "TILDEOPEN_QUERY_TILES", "TILDEOPEN_WIDE_ATTENTION"] {
            c.env_remove(v);
        }
        let out = c.envs(env.iter().copied()).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["fast_paths"].clone()
    };
    let plain = info(&[]);
    assert_eq!((plain["fused"].as_bool(), plain["int_dot"].as_bool(), plain["query_tiles"].as_bool()), (Some(true), Some(false), Some(true)), "{plain}");
    assert_eq!(info(&[("TILDEOPEN_QUERY_TILES", "0")])["query_tiles"], false);
    // Wide attention: off on a CPU device unless asked for.
    assert_eq!((plain["wide_attention"].as_bool(), info(&[("TILDEOPEN_WIDE_ATTENTION", "1")])["wide_attention"].as_bool()), (Some(false), Some(true)), "{plain}");
    let asked = info(&[("TILDEOPEN_NORM_FOLD", "1"), ("TILDEOPEN_INT_DOT", "1")]);
    assert_eq!((asked["norm_fold"].as_bool(), asked["int_dot"].as_bool()), (Some(true), Some(true)), "{asked}");
    let base = info(&[("TILDEOPEN_BASELINE_KERNELS", "1"), ("TILDEOPEN_NORM_FOLD", "1"), ("TILDEOPEN_INT_DOT", "1"), ("TILDEOPEN_WIDE_ATTENTION", "1")]);
    for k in ["fused", "split_attention", "query_tiles", "subgroups", "norm_fold", "int_dot", "wide_attention"] {
        assert_eq!(base[k], false, "{k} with the baseline kernels: {base}");
    }
}

/// `bench --json --profile`: the JSON line's rates and dispatch count, and a per-kernel table
/// whose times add up to something, with GPU timestamps where the device has them (lavapipe
/// does) and with the host-clock fallback.
#[test]
fn bench_json_and_profile() {
    for ts in ["1", "0"] {
        let out = Command::new(env!("CARGO_BIN_EXE_tildeopen"))
            .args(["bench", "--model", &tiny(), "--prompt-tokens", "20", "--gen-tokens", "4", "--repeat", "1", "--json", "--profile"])
            .env("TILDEOPEN_TIMESTAMPS", ts)
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{stderr}");
        let j: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        assert!(j["prefill_tok_s"].as_f64().unwrap() > 0.0 && j["decode_tok_s"].as_f64().unwrap() > 0.0, "{j}");
        assert!(j["dispatches_per_token"].as_u64().unwrap() > 4, "{j}");
        let table = stderr.split_once("time per kernel").map(|t| t.1).unwrap_or_else(|| panic!("no profile: {stderr}"));
        let how = if table.contains("(GPU timestamps)") { "timestamps" } else { "host clock" };
        if ts == "0" {
            assert_eq!(how, "host clock", "{stderr}");
        }
        let times: Vec<(String, f64)> = table
            .lines()
            .filter_map(|l| l.split_once(':'))
            .filter_map(|(k, v)| Some((k.trim().to_string(), v.trim().strip_suffix(" s")?.trim().parse().ok()?)))
            .collect();
        for k in ["matvec", "matmul", "embed", "argmax"] {
            assert!(times.iter().any(|(n, t)| n == k && *t > 0.0), "{k} missing or zero ({how}): {stderr}");
        }
    }
}

/// `bench --json` counts what a decode step asks of the device: no buffer created (readbacks
/// reuse a kept staging buffer), one host wait (reading the greedy token), and three submits
/// (the layers in two command buffers, so the device starts on the first while the host records
/// the second, and the readback's copy).
#[test]
fn bench_counts_per_decode_token() {
    let out = Command::new(env!("CARGO_BIN_EXE_tildeopen"))
        .args(["bench", "--model", &tiny(), "--prompt-tokens", "8", "--gen-tokens", "6", "--repeat", "2", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let j: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(j["buffers_created_per_token"].as_f64(), Some(0.0), "{j}");
    assert_eq!(j["syncs_per_token"].as_f64(), Some(1.0), "{j}");
    assert_eq!(j["submits_per_token"].as_f64(), Some(3.0), "{j}");
    assert_eq!(j["kv_cache"], "f16", "{j}");
    // lavapipe is a CPU device: one slice of up to 256 keys for this short context (2 KV heads).
    assert_eq!((j["wide_attention"].as_bool(), j["attn_workgroups"].as_u64()), (Some(false), Some(2)), "{j}");
    // Wide attention (a GPU's default) at 600 tokens: 32 slices per KV head; a q8_0 cache; the
    // tiny model's 576-token prompt is far under one command buffer's work (one pass, one submit).
    let out = Command::new(env!("CARGO_BIN_EXE_tildeopen"))
        .args(["bench", "--model", &tiny(), "--prompt-tokens", "576", "--gen-tokens", "24", "--repeat", "1", "--json", "--kv-cache", "q8_0"])
        .env("TILDEOPEN_WIDE_ATTENTION", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!((j["kv_cache"].as_str(), j["attn_workgroups"].as_u64()), (Some("q8_0"), Some(64)), "{j}");
    assert_eq!(j["prefill_submits"].as_u64(), Some(3), "{j}");
}

/// `info --dump-kernels DIR`: one WGSL file per pipeline the model compiles on this device (the
/// matvec and matmul of each weight type, attention, ...), each as compiled, its overrides in the
/// header; every file parses and validates with naga, and every override the header names is
/// one the module declares.
#[test]
fn info_dumps_every_kernel_as_compiled() {
    use wgpu::naga;
    let dir = std::env::temp_dir().join(format!("tildeopen-kernels-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_tildeopen")).args(["info", "--model", &tiny(), "--dump-kernels", dir.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let names: Vec<String> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
    for k in ["matvec", "matmul", "embed", "argmax"] {
        assert!(names.iter().any(|n| n.contains(&format!("-{k}"))), "no {k} kernel among {names:?}");
    }
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("{} kernels written", files.len())));
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let module = naga::front::wgsl::parse_str(&text).unwrap_or_else(|e| panic!("{}: {}", f.display(), e.emit_to_string(&text)));
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}: {e:?}", f.display()));
        let declared: Vec<&str> = module.overrides.iter().filter_map(|(_, o)| o.name.as_deref()).collect();
        for line in text.lines().take_while(|l| l.starts_with("//")) {
            if let Some(name) = line.strip_prefix("// override ").and_then(|r| r.split(" = ").next()) {
                assert!(declared.contains(&name), "{}: override {name} is not in the module", f.display());
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `info` lists every adapter; `--adapter` (or TILDEOPEN_ADAPTER) picks one by a part of its
/// name, ignoring case, and a name that matches none is an error that lists them.
#[test]
fn adapter_by_name() {
    let (code, out, err) = cli(&["info"], "");
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let name = j["adapter"].as_str().unwrap().to_string();
    assert!(j["adapters"].as_array().unwrap().iter().any(|a| a.as_str().unwrap().starts_with(&name)), "{j}");
    let part: String = name.chars().take(4).collect::<String>().to_uppercase();
    let (code, out, err) = cli(&["info", "--adapter", &part], "");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&name), "{out}");
    let (code, _, err) = cli(&["info", "--adapter", "no-such-gpu"], "");
    assert_ne!(code, 0);
    assert!(err.contains("no-such-gpu") && err.contains(&name), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_tildeopen"))
        .args(["chat", "--model", &tiny(), "--max-tokens", "1", "hi"])
        .env("TILDEOPEN_ADAPTER", "no-such-gpu")
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("no-such-gpu"));
}

/// Out-of-range counts and sizes are errors that name their flag, before any work: they used to
/// panic (`capacity overflow`), wrap to a small KV cache and fail on the GPU, measure a prompt
/// cut to 32 bits, clamp without a word, or fail only after generating.
#[test]
fn odd_arguments_are_clear_errors() {
    let m = tiny();
    let input = std::env::temp_dir().join(format!("tildeopen-odd-{}.jsonl", std::process::id()));
    std::fs::write(&input, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n").unwrap();
    let input = input.to_str().unwrap().to_string();
    for (args, want) in [
        (vec!["complete", "--tokens", "1,2,3", "--max-tokens", "18446744073709551615"], "--max-tokens 18446744073709551615: must be 1 to"),
        (vec!["complete", "--tokens", "1,2,3", "--max-tokens", "0"], "--max-tokens 0"),
        (vec!["complete", "--tokens", "1,2,3", "--max-tokens", "100", "--ctx-size", "20"], "need a context of 103 tokens; --ctx-size is 20"),
        (vec!["logits", "--tokens", "1,2,3", "--ctx-size", "144115188075855872"], "over the device's binding limit"),
        (vec!["bench", "--prompt-tokens", "4294967300", "--gen-tokens", "2"], "--prompt-tokens 4294967300: must be 1 to"),
        (vec!["bench", "--prompt-tokens", "0"], "--prompt-tokens 0"),
        (vec!["bench", "--prompt-tokens", "8", "--gen-tokens", "2", "--repeat", "0"], "--repeat 0"),
        (vec!["perplexity", "--file", "-", "--ctx", "3"], "--ctx 3: must be 4 to"),
        (vec!["perplexity", "--file", "-", "--chunks", "0"], "--chunks 0"),
        (vec!["chat", "--ctx-size", "0", "hi"], "--ctx-size 0: a chat context is 2 to 65536 tokens"),
        (vec!["chat", "--ctx-size", "1000000", "hi"], "--ctx-size 1000000"),
        (vec!["batch", &input, "--parallel", "1152921504606846976"], "over the device's binding limit"),
        (vec!["logits", "--tokens", "1", "--max-binding-size", "100"], "(100 asked for) is too small"),
    ] {
        let mut a = args.clone();
        a.extend(["--model", &m]);
        let (code, _, err) = cli(&a, "some text");
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains(want) && !err.contains("panicked"), "{args:?}: {err}");
    }
    std::fs::remove_file(&input).ok();
    // Negative penalties (the API's -2..2) parse as values, not as flags.
    let (code, _, err) = cli(&["chat", "--model", &m, "--max-tokens", "2", "--presence-penalty", "-0.5", "--frequency-penalty", "-1", "hi"], "");
    assert_eq!(code, 0, "{err}");
}

/// Interactive `--stream --json` keeps the model's answers in the conversation, as `--json`
/// does (they were dropped: the second turn saw empty assistant messages).
#[test]
fn streamed_json_turns_keep_the_history() {
    let m = tiny();
    let turns = |extra: &[&str]| -> Vec<String> {
        let mut a = vec!["chat", "--model", &m, "--max-tokens", "6", "--json"];
        a.extend(extra);
        let (code, out, err) = cli(&a, "hello\nand then\n");
        assert_eq!(code, 0, "{err}");
        let mut answers = vec![String::new()];
        for l in out.lines() {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            if v["object"] == "chat.completion" {
                answers.push(v["choices"][0]["message"]["content"].as_str().unwrap().to_string());
            } else if let Some(c) = v["choices"][0].get("delta") {
                *answers.last_mut().unwrap() += c["content"].as_str().unwrap_or("");
                if !v["choices"][0]["finish_reason"].is_null() {
                    answers.push(String::new());
                }
            }
        }
        answers.into_iter().filter(|a| !a.is_empty()).collect()
    };
    let plain = turns(&[]);
    assert_eq!(plain.len(), 2, "{plain:?}");
    assert_eq!(turns(&["--stream"]), plain);
}

/// A reader that goes away ends the command quietly: no panic from println!, and a streamed
/// chat stops instead of generating to the end of its context.
#[cfg(unix)]
#[test]
fn a_closed_pipe_ends_the_command() {
    let m = tiny();
    for args in [vec!["logits", "--tokens", "1,2,3,4,5,6,7,8"], vec!["chat", "--stream", "--max-tokens", "100000", "--ctx-size", "65536", "hi"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tildeopen"))
            .args(&args)
            .args(["--model", &m])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = [0u8; 1];
        std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
        drop(child.stdout.take());
        let t0 = std::time::Instant::now();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(t0.elapsed() < std::time::Duration::from_secs(30), "{args:?} ran on after its reader left");
    }
}
