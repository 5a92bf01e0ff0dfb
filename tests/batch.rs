//! `tildeopen batch` on the tiny fixture: GPU faults stop the run before anything is written,
//! resume only from an output of the same input, join mode and model, the joined request keeps
//! its members as written, every output record is one line for every reader, and output names
//! keep the input name's bytes.

mod common;
use common::fixtures;
use std::path::{Path, PathBuf};
use std::process::Command;

fn tiny() -> String {
    fixtures().join("models/tiny-tildeopen/model-Q8_0.gguf").to_str().unwrap().to_string()
}

fn batch_env(input: &Path, extra: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let m = tiny();
    Command::new(env!("CARGO_BIN_EXE_tildeopen")).args(["batch", "--model", &m]).arg(input).args(extra).envs(env.iter().copied()).output().unwrap()
}

fn batch(input: &Path, extra: &[&str]) -> std::process::Output {
    batch_env(input, extra, &[])
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tildeopen-batchtest-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn req(i: usize, max_tokens: usize) -> String {
    format!(r#"{{"id_in_test":{i},"messages":[{{"role":"user","content":"Request {i}"}}],"max_tokens":{max_tokens},"temperature":0.0}}"#)
}

fn read(p: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(p).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// What a line says that does not change between runs (ids and timestamps do).
fn answer(v: &serde_json::Value) -> serde_json::Value {
    if v["object"] == "chat.completion" {
        serde_json::json!([v["choices"], v["usage"]])
    } else {
        v.clone()
    }
}

#[test]
fn gpu_fault_stops_before_writing_and_the_rerun_resumes_there() {
    let d = dir("fault");
    let input = d.join("req.jsonl");
    let mut lines: Vec<String> = (0..7).map(|i| req(i, 3)).collect();
    lines[1] = "{broken".into();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let clean_dir = d.join("clean");
    let o = batch(&input, &["--parallel", "2", "--output-dir", clean_dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let clean = read(&clean_dir.join("req.jsonl.out"));
    assert_eq!(clean.len(), 7);

    // A forward pass fails (as a GPU error would) in the middle of the file.
    let o = batch_env(&input, &["--parallel", "2"], &[("TILDEOPEN_TEST_FAIL_AT_STEP", "8")]);
    assert!(!o.status.success(), "a failed pass ends the run with an error");
    let err = stderr(&o);
    assert!(err.contains("batch stopped with") && err.contains("injected pass failure"), "{err}");
    let out_path = d.join("req.jsonl.out");
    let partial = read(&out_path);
    assert!(!partial.is_empty() && partial.len() < 7, "{} lines", partial.len());
    assert!(err.contains(&format!("with {} of 7 output lines written", partial.len())), "{err}");
    // Only answers and the bad line's own 400 are written, never the fault.
    for (i, v) in partial.iter().enumerate() {
        assert_eq!(answer(v), answer(&clean[i]), "line {i}: {v}");
        assert!(!v.to_string().contains("injected"), "line {i}: {v}");
    }
    assert!(partial[1]["error"]["message"].as_str().unwrap().starts_with("malformed request"));

    // The rerun answers the lines the fault hit, and the file is the same as a clean run's.
    let o = batch(&input, &["--parallel", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("{} resumed", partial.len())), "{}", stderr(&o));
    let all = read(&out_path);
    assert_eq!(all.iter().map(answer).collect::<Vec<_>>(), clean.iter().map(answer).collect::<Vec<_>>());
    assert_eq!(&all[..partial.len()], &partial[..], "the written lines are kept as they were");
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn resume_only_from_the_same_input_join_mode_and_model() {
    let d = dir("resume");
    let input = d.join("req.jsonl");
    let out_path = d.join("req.jsonl.out");
    std::fs::write(&input, (0..7).map(|i| req(i, 2)).collect::<Vec<_>>().join("\n")).unwrap();
    let o = batch(&input, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(read(&out_path).len(), 7);
    let seven = std::fs::read(&out_path).unwrap();

    // The same input again: everything is resumed.
    let o = batch(&input, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("7 resumed"), "{}", stderr(&o));

    // Another join mode or model name: refused, the output left alone.
    let o = batch(&input, &["--join-source", "input"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--join-source none") && stderr(&o).contains("--overwrite"), "{}", stderr(&o));
    let o = batch(&input, &["--model-name", "another"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("another run (model \""), "{}", stderr(&o));
    assert_eq!(std::fs::read(&out_path).unwrap(), seven);

    // Two new requests in place of the seven: refused (it named "2 resumed" and kept 7 lines).
    std::fs::write(&input, [req(10, 2), req(11, 2)].join("\n")).unwrap();
    let o = batch(&input, &[]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.lines().any(|l| l.contains("a different input") && l.contains("--overwrite")), "one line says why and what to do: {err}");
    assert_eq!(std::fs::read(&out_path).unwrap(), seven);
    let o = batch(&input, &["--overwrite"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("0 resumed"), "{}", stderr(&o));
    let two = read(&out_path);
    assert_eq!(two.len(), 2);

    // Lines beyond the input's requests are cut; a partial last line too.
    let mut f = std::fs::OpenOptions::new().append(true).open(&out_path).unwrap();
    std::io::Write::write_all(&mut f, b"{\"extra\":1}\n{\"extra\":2}\n{\"part").unwrap();
    drop(f);
    let o = batch(&input, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("2 lines (2 resumed"), "{}", stderr(&o));
    assert_eq!(read(&out_path), two);

    // An output no run recorded (planted, or from before state files) is not progress.
    let other = d.join("other.jsonl");
    std::fs::write(&other, [req(0, 2), req(1, 2)].join("\n")).unwrap();
    std::fs::write(d.join("other.jsonl.out"), "{\"planted\":true}\n").unwrap();
    let o = batch(&other, &[]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--overwrite"), "{}", stderr(&o));
    let o = batch(&other, &["--overwrite"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(read(&d.join("other.jsonl.out")).iter().all(|v| v["object"] == "chat.completion"));
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn joined_lines_keep_the_request_and_stay_one_line() {
    let d = dir("join");
    // A name that is not UTF-8: the output's name keeps its bytes.
    #[cfg(unix)]
    let input = {
        use std::os::unix::ffi::OsStrExt;
        d.join(std::ffi::OsStr::from_bytes(b"r\xe9q.jsonl"))
    };
    #[cfg(not(unix))]
    let input = d.join("req.jsonl");
    let own = r#"{"SageMakerOutput":{"old":[1,2]},"messages":[{"role":"user","content":"Hi"}],"max_tokens": 2 ,"temperature":0.0}"#;
    // Valid JSON with a raw CR between tokens and raw U+2028, U+2029 and U+0085 in a string.
    let seps = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\u{2028}b\u{2029}c\u{85}d\"}],\r\"max_tokens\":2,\"temperature\":0.0}";
    std::fs::write(&input, [own, seps].join("\n")).unwrap();
    let o = batch(&input, &["--join-source", "input"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut name = input.file_name().unwrap().to_os_string();
    name.push(".out");
    let out_path = d.join(&name);
    assert!(out_path.is_file(), "no {}", out_path.display());
    assert!(!d.join("input.out").exists());
    let mut state = name.clone();
    state.push(".state");
    assert!(d.join(state).is_file());

    let text = std::fs::read_to_string(&out_path).unwrap();
    // Python's splitlines() splits at each of these; the file must still have two lines.
    for c in ['\r', '\u{2028}', '\u{2029}', '\u{85}', '\u{b}', '\u{c}'] {
        assert!(!text.contains(c), "raw {c:?} in {text:?}");
    }
    let raw: Vec<&str> = text.lines().collect();
    assert_eq!(raw.len(), 2);
    // The request's own SageMakerOutput is gone; its other members as written, in order, then
    // the response, whose fields come in the spec's order.
    let want = r#"{"messages":[{"role":"user","content":"Hi"}],"max_tokens": 2 ,"temperature":0.0,"SageMakerOutput":{"id":"chatcmpl-"#;
    assert!(raw[0].starts_with(want), "{}", raw[0]);
    let keys: Vec<usize> = ["\"object\"", "\"created\"", "\"model\"", "\"choices\"", "\"usage\""].iter().map(|k| raw[0].find(k).unwrap()).collect();
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "{}", raw[0]);
    assert!(!raw[0].contains("old"));
    let v: Vec<serde_json::Value> = raw.iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(v[1]["messages"][0]["content"], "a\u{2028}b\u{2029}c\u{85}d", "the escapes mean the same text");
    assert!(raw[1].contains(r#""content":"a\u2028b\u2029c\u0085d"}], "max_tokens":2"#), "{}", raw[1]);
    for x in &v {
        assert_eq!(x["SageMakerOutput"]["object"], "chat.completion", "{x}");
    }
    std::fs::remove_dir_all(&d).ok();
}
