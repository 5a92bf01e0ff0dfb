//! The README's commands stay true: every command line of the `sh` blocks of README.md and
//! docs/*.md must be in the table
//! below, which says how it is checked. Most are run here as written, in a scratch directory
//! holding the files they name (`model.gguf` and the default model are the fetched SmolLM2,
//! `tokenizer.model` the tiny fixture's tokenizer); the server commands run against a
//! server started by the README's own `serve` line. The rest name the test or script that runs
//! them (checked to still mention them) or are benchmarks (never timed tests). A command added to,
//! changed in or removed from the README without the table fails this test.

mod common;
mod browser;
use browser::Kill;
use common::fixtures;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

enum How {
    /// Run as written in the scratch directory (or the repo for `repo` commands); stdout must
    /// contain the text.
    Run(&'static str),
    /// Run from the repository root; stdout must contain the text.
    RunInRepo(&'static str),
    /// Run with smaller sizes (the README's take minutes on a CPU device, or generate until the
    /// model stops: the same options, a token limit added); stdout must contain the text.
    Shrunk(&'static str, &'static str),
    /// The server line: started, waited for, stopped at the end.
    Serve,
    /// Against the server; stdout must contain the text.
    Curl(&'static str),
    /// Run by another test or script: that file must still contain the text.
    By(&'static str, &'static str),
    /// A benchmark or a script a person runs (docs/performance.md, docs/server.md's container,
    /// docs/testing.md's fuzzing),
    /// never in the test command.
    Bench,
}
use How::*;

const TABLE: &[(&str, How)] = &[
    (r#"scripts/chat "What is the capital of Latvia?""#, RunInRepo("Riga")),
    ("scripts/test", By(".ci/run", "exec scripts/test")),
    (r#"cargo run --release -- chat "What is the capital of Latvia?""#, RunInRepo("Riga")),
    (r#"tildeopen translate --from en --to lv "I like cakes.""#, Run("")),
    ("tildeopen serve --model model.gguf --port 8080", Serve),
    (r#"curl -s localhost:8080/v1/chat/completions -H 'Content-Type: application/json' -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":64}'"#, Curl(r#""object":"chat.completion""#)),
    ("scripts/demo", By("tests/newcomer.rs", "scripts/demo")),
    ("scripts/build-extension", By("tests/extension.rs", "scripts/build-extension")),
    (r#"tildeopen chat "What is the capital of Latvia?""#, Run("Riga")),
    ("tildeopen chat --request req.json --json", Run(r#""object":"chat.completion""#)),
    (r#"tildeopen ask --context-file doc.txt "Who signed it?""#, Shrunk(r#"tildeopen ask --context-file doc.txt "Who signed it?" --max-tokens 12"#, "")),
    (
        r#"tildeopen summarise --file report.txt --instruction "Two sentences, about costs.""#,
        Shrunk(r#"tildeopen summarise --file report.txt --instruction "Two sentences, about costs." --max-tokens 12"#, ""),
    ),
    (r#"tildeopen complete --prompt "The capital of France is" --max-tokens 8 --json"#, Run(r#""ids""#)),
    ("tildeopen complete --tokens 504,3575,282 --max-tokens 8 --json", Run(r#""ids""#)),
    (r#"tildeopen tokenize --model tokenizer.model --text "Sveiki""#, Run(r#""ids""#)),
    ("tildeopen perplexity --file text.txt --ctx 256", Shrunk("tildeopen perplexity --file text.txt --ctx 64 --chunks 1", "PPL = ")),
    ("tildeopen logits   --tokens 48,512,33", Run(r#""logits""#)),
    ("tildeopen bench    --prompt-tokens 672 --gen-tokens 128 --repeat 3 --json", Shrunk("tildeopen bench --prompt-tokens 16 --gen-tokens 4 --repeat 1 --json", "decode_tok_s")),
    ("tildeopen info", Run("")),
    ("tildeopen fetch", Run(".gguf")),
    ("scripts/build-web", By("scripts/test", "scripts/build-web")),
    ("npm pack ./www", By("tests/npm.rs", r#""pack", "./www""#)),
    ("scripts/build-extension --model https://host/TildeOpen-30b-Q4_K_M.gguf --target lv --parallel 8", By("tests/extension.rs", r#""--parallel", "2""#)),
    ("scripts/page-bench --parallel 1,8", Bench),
    ("cargo test --release --locked --lib sampling_time_over_131072_logits -- --nocapture", By("src/chat/sampling/tests.rs", "fn sampling_time_over_131072_logits")),
    (r#"tildeopen chat --kv-cache q8_0 "What is the capital of Latvia?""#, Run("Riga")),
    ("cargo test --release --locked --test kv_cache -- --ignored --nocapture", By("tests/kv_cache.rs", "fn long_context_q8_0_on_the_64k_fixture")),
    (r#"tildeopen perplexity --model "$(tildeopen fetch)" --file ../shared/fixtures/smollm2/eval-shared.txt --ctx 512 --chunks 3 --kv-cache q4_0"#, Bench),
    (
        r#"LLAMA_SERVER=scripts/llama-server-kv LLAMA_KV=q8_0 ../shared/bench/vs-llama-vulkan --model /tmp/bench.gguf --prompt-tokens 2000 --gen-tokens 32 --rounds 1 --extra "--kv-cache q8_0""#,
        Bench,
    ),
    (
        r#"LLAMA_SERVER=scripts/llama-server-kv LLAMA_KV=f16 ../shared/bench/vs-llama-vulkan --model /tmp/bench.gguf --prompt-tokens 2000 --gen-tokens 32 --rounds 1 --extra "--kv-cache f16""#,
        Bench,
    ),
    ("scripts/container", Bench),
    ("scripts/container --gpu", Bench),
    ("curl -s localhost:8080/ping", Curl(r#""status":"ok""#)),
    (
        r#"curl -s localhost:8080/invocations -H 'Content-Type: application/json' -d '{"messages":[{"role":"user","content":"What is the capital of Latvia?"}],"temperature":0}'"#,
        Curl(r#""object":"chat.completion""#),
    ),
    (r#"curl -sN localhost:8080/v1/chat/completions -H 'Content-Type: application/json' -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":64,"stream":true}'"#, Curl("data: [DONE]")),
    ("tildeopen batch --model model.gguf requests.jsonl", Run("")),
    ("tildeopen batch --model model.gguf requests.jsonl --output-dir out --join-source input", Run("")),
    ("cargo build --release", By("scripts/test", "cargo build --release")),
    ("scripts/fuzz 60 gguf_header", Bench),
    ("../shared/bench/make-bench-model /tmp/bench.gguf bench", Bench),
    ("../shared/bench/vs-llama-vulkan --model /tmp/bench.gguf --prompt-tokens 512 --gen-tokens 64 --rounds 2", Bench),
    ("../shared/bench/vs-llama-vulkan --model /tmp/bench.gguf --prompt-tokens 2000 --gen-tokens 32 --rounds 1", Bench),
    (r#"../shared/bench/vs-llama-vulkan --model "$(target/release/tildeopen fetch)" --prompt-tokens 672 --gen-tokens 128 --rounds 2"#, Bench),
];

/// The command lines of the README's `sh` blocks: continuation lines joined, comments (after two
/// or more spaces, or whole lines) dropped.
fn readme_commands(text: &str) -> Vec<String> {
    let mut out = vec![];
    let mut in_sh = false;
    let mut cur = String::new();
    for line in text.lines() {
        if let Some(lang) = line.strip_prefix("```") {
            in_sh = !in_sh && (lang == "sh" || lang == "bash");
            continue;
        }
        if !in_sh {
            continue;
        }
        if !cur.is_empty() {
            cur.push(' ');
            cur.push_str(line.trim());
        } else {
            cur = line.to_string();
        }
        if cur.trim_end().ends_with('\\') {
            let t = cur.trim_end();
            cur = t[..t.len() - 1].trim_end().to_string();
            continue;
        }
        let mut c = std::mem::take(&mut cur);
        if let Some(i) = c.find("  #") {
            c.truncate(i);
        }
        let c = c.trim();
        if !c.is_empty() && !c.starts_with('#') {
            out.push(c.to_string());
        }
    }
    out
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `cmd` with bash in `dir`, `tildeopen` on the PATH; returns (success, stdout, stderr).
fn sh(cmd: &str, dir: &Path, bin: &Path) -> (bool, String, String) {
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new("bash").args(["-c", cmd]).current_dir(dir).env("PATH", path).stdin(Stdio::null()).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn scratch() -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("tildeopen-readme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tildeopen"), bin.join("tildeopen")).unwrap();
    let tiny = fixtures().join("models/tiny-tildeopen");
    // SmolLM2 as `model.gguf`: it ends its answers, so requests without max_tokens are short.
    std::os::unix::fs::symlink(common::smollm2(), dir.join("model.gguf")).unwrap();
    std::os::unix::fs::symlink(tiny.join("tokenizer.model"), dir.join("tokenizer.model")).unwrap();
    std::fs::write(dir.join("req.json"), r#"{"messages":[{"role":"user","content":"What is the capital of Latvia?"}],"max_tokens":16,"temperature":0}"#).unwrap();
    std::fs::write(dir.join("doc.txt"), "The lease was signed on 3 May 2024 by Anna Berzina for the tenant and by Janis Ozols for the owner.\n").unwrap();
    std::fs::write(dir.join("report.txt"), "The new roof cost 12,000 euros, 2,000 more than planned, because of a late delivery. Heating costs fell by a fifth after the insulation work.\n").unwrap();
    let eval = std::fs::read_to_string(fixtures().join("smollm2/eval-shared.txt")).unwrap();
    std::fs::write(dir.join("text.txt"), eval.chars().take(1200).collect::<String>()).unwrap();
    std::fs::write(
        dir.join("requests.jsonl"),
        "{\"messages\":[{\"role\":\"user\",\"content\":\"I like cakes.\"}],\"max_tokens\":4,\"temperature\":0}\n{\"messages\":[{\"role\":\"user\",\"content\":\"Sveiki\"}],\"max_tokens\":4,\"temperature\":0}\n",
    )
    .unwrap();
    (dir, bin)
}

#[test]
fn every_readme_command_is_checked() {
    // The front page and the reference pages under docs/.
    let mut readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let mut docs: Vec<_> = std::fs::read_dir(repo().join("docs")).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "md")).collect();
    docs.sort();
    for d in docs {
        readme.push('\n');
        readme += &std::fs::read_to_string(d).unwrap();
    }
    let commands = readme_commands(&readme);
    let mut failures = vec![];
    for c in &commands {
        if !TABLE.iter().any(|(t, _)| t == c) {
            failures.push(format!("README command not in tests/readme.rs's table: {c}"));
        }
    }
    for (t, _) in TABLE {
        if !commands.iter().any(|c| c == t) {
            failures.push(format!("table entry no longer in the README: {t}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    let (dir, bin) = scratch();
    let port = free_port();
    let mut server = None;
    let mut ran = 0;
    for (cmd, how) in TABLE {
        let t0 = Instant::now();
        match how {
            Run(want) | RunInRepo(want) | Shrunk(_, want) => {
                let (run, at) = match how {
                    Shrunk(s, _) => (*s, dir.as_path()),
                    RunInRepo(_) => (*cmd, repo()),
                    _ => (*cmd, dir.as_path()),
                };
                let (ok, out, err) = sh(run, at, &bin);
                assert!(ok, "`{run}` failed:\n{err}");
                assert!(out.contains(want), "`{run}` prints {want:?}: {out}");
                ran += 1;
            }
            Serve => {
                let c = cmd.replace("8080", &port.to_string());
                let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
                let child = Command::new("bash").args(["-c", &format!("exec {c}")]).current_dir(&dir).env("PATH", path).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
                server = Some(Kill(child));
                let ping = format!("curl -s -o /dev/null -w '%{{http_code}}' localhost:{port}/ping");
                while sh(&ping, &dir, &bin).1 != "200" {
                    assert!(t0.elapsed() < Duration::from_secs(120), "the README's server answers /ping");
                    std::thread::sleep(Duration::from_millis(200));
                }
                ran += 1;
            }
            Curl(want) => {
                assert!(server.is_some(), "the serve line comes before {cmd}");
                let c = cmd.replace("8080", &port.to_string());
                let (ok, out, err) = sh(&c, &dir, &bin);
                assert!(ok && out.contains(want), "`{c}` prints {want:?}: {out} {err}");
                ran += 1;
            }
            By(file, needle) => {
                let text = std::fs::read_to_string(repo().join(file)).unwrap();
                assert!(text.contains(needle), "{file} still runs `{cmd}` (mentions {needle:?})");
            }
            Bench => {}
        }
        println!("{:5.1} s  {cmd}", t0.elapsed().as_secs_f64());
    }
    drop(server);
    // What the batch lines wrote.
    let plain = std::fs::read_to_string(dir.join("requests.jsonl.out")).unwrap();
    assert_eq!(plain.lines().filter(|l| l.contains("\"chat.completion\"")).count(), 2, "{plain}");
    let joined = std::fs::read_to_string(dir.join("out/requests.jsonl.out")).unwrap();
    assert_eq!(joined.lines().filter(|l| l.contains("SageMakerOutput")).count(), 2, "{joined}");
    println!("{ran} README commands run, {} checked through other tests or scripts", TABLE.len() - ran);
    std::fs::remove_dir_all(&dir).ok();
}
