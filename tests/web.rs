//! The browser runtime in headless Chromium (WebGPU on SwiftShader, no shader-f16): pages served
//! with HTTP Range support load the tiny fixture as a GGUF and as an HF directory, and SmolLM2;
//! greedy answers must equal the native CLI's for the same request. Needs `scripts/build-web`
//! (the test command runs it) and Debian's `chromium`.

mod common;
use common::fixtures;
mod browser;
use browser::WebRoot;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Opens tests/web/chat.html with `params` (served with `extra` files) and returns what the page
/// posted.
fn run_page(params: &[(&str, &str)], extra: &[(&str, &Path)], timeout: Duration) -> serde_json::Value {
    run_page_with("/repo/tests/web/chat.html", params, extra, timeout)
}

fn run_page_at(page: &str, params: &[(&str, &str)], timeout: Duration) -> serde_json::Value {
    run_page_with(page, params, &[], timeout)
}

fn run_page_with(page: &str, params: &[(&str, &str)], extra: &[(&str, &Path)], timeout: Duration) -> serde_json::Value {
    let web = WebRoot::new("tildeopen-web", extra);
    let mut query: Vec<String> = vec![format!("api={}", "/repo/www/tildeopen.js")];
    for (k, v) in params {
        query.push(format!("{k}={}", urlencode(v)));
    }
    let url = format!("{}{page}?{}", web.base, query.join("&"));
    let v = web.open(&url, &[], timeout, "the page posted nothing");
    assert!(v.get("failure").is_none(), "page failed: {}", v["failure"]);
    v
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The native CLI's answer to the same request.
fn native(model: &Path, request: &str) -> String {
    native_with(model, request, &[])
}

/// `native` with more `tildeopen chat` flags.
fn native_with(model: &Path, request: &str, flags: &[&str]) -> String {
    let dir = std::env::temp_dir().join(format!("tildeopen-web-req-{}.json", std::process::id()));
    std::fs::write(&dir, request).unwrap();
    let args = ["chat", "--model", model.to_str().unwrap(), "--request", dir.to_str().unwrap(), "--json"];
    let out = Command::new(env!("CARGO_BIN_EXE_tildeopen")).args(args).args(flags).output().unwrap();
    std::fs::remove_file(&dir).ok();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

const REQ: &str = r#"{"messages":[{"role":"user","content":"I like cakes."}],"max_tokens":8,"temperature":0}"#;

#[test]
fn tiny_gguf_in_the_browser_matches_native() {
    let v = run_page(&[("model", "/fixtures/models/tiny-tildeopen/model-Q8_0.gguf"), ("request", REQ), ("worker", "1"), ("task", "1")], &[], Duration::from_secs(300));
    let want = native(&fixtures().join("models/tiny-tildeopen/model-Q8_0.gguf"), REQ);
    println!("browser: {}", serde_json::to_string(&v).unwrap());
    let c = &v["completion"];
    assert_eq!(c["object"], "chat.completion");
    assert_eq!(c["choices"][0]["finish_reason"], "length");
    assert_eq!(c["usage"]["completion_tokens"], 8);
    assert_eq!(c["choices"][0]["message"]["content"], want.as_str(), "non-streamed");
    assert_eq!(v["streamText"], want.as_str(), "streamed");
    assert_eq!((v["firstRole"].as_str(), v["lastFinish"].as_str()), (Some("assistant"), Some("length")));
    assert_eq!(v["chunksBeforeAbort"], 2, "the loop ends right after abort()");
    assert_eq!(v["afterAbort"], want.as_str(), "a new request after an abort");
    assert_eq!(v["error"]["error"]["param"], "messages");
    assert_eq!(v["worker"], want.as_str(), "worker mode");
    assert_eq!(v["workerStream"], want.as_str(), "worker mode, streamed");
    assert_eq!(v["afterUnload"], "unloaded", "a stream's next chunk after unload()");
    assert_eq!((v["workerAfterUnload"].as_str(), v["workerCallAfterUnload"].as_str()), (Some("unloaded"), Some("unloaded")), "worker calls after unload()");
    assert!(v["progressMonotonic"].as_bool().unwrap() && v["progressEvents"].as_u64().unwrap() > 10);
    let task = r#"{"task":{"type":"translate","text":"I like cakes.","source":"en","target":"lv"},"max_tokens":6,"temperature":0}"#;
    assert_eq!(v["task"], native(&fixtures().join("models/tiny-tildeopen/model-Q8_0.gguf"), task).as_str(), "translate task");
}

/// The opt-in integer-dot matvec in the browser (WGSL's dot4I8Packed on Dawn) answers as the
/// native one (`--int-dot`) does, in this thread and in a worker.
#[test]
fn tiny_gguf_with_int_dot_in_the_browser_matches_native() {
    let m = "models/tiny-tildeopen/model-Q8_0.gguf";
    let v = run_page(&[("model", &format!("/fixtures/{m}")), ("request", REQ), ("intDot", "1"), ("worker", "1")], &[], Duration::from_secs(300));
    assert_eq!(v["integerDot"], true, "Chromium's WGSL has packed_4x8_integer_dot_product");
    assert!(v["fastPaths"].as_array().unwrap().iter().any(|p| p == "int_dot"), "{}", v["fastPaths"]);
    let want = native_with(&fixtures().join(m), REQ, &["--int-dot"]);
    println!("integer dot: browser {:?}, native {want:?}", v["completion"]["choices"][0]["message"]["content"]);
    assert_eq!(v["completion"]["choices"][0]["message"]["content"], want.as_str());
    assert_eq!(v["worker"], want.as_str(), "worker mode");
}

/// The norms folded into the matvecs (the default on GPUs; SwiftShader is a CPU device, so the
/// page asks for it) answer as native does without it: the fold moves logits by about 1e-4.
#[test]
fn tiny_gguf_with_norm_fold_in_the_browser_matches_native() {
    let m = "models/tiny-tildeopen/model-Q4_K_M.gguf";
    let v = run_page(&[("model", &format!("/fixtures/{m}")), ("request", REQ), ("normFold", "1")], &[], Duration::from_secs(300));
    assert!(v["fastPaths"].as_array().unwrap().iter().any(|p| p == "norm_fold"), "{}", v["fastPaths"]);
    let want = native(&fixtures().join(m), REQ);
    assert_eq!(v["completion"]["choices"][0]["message"]["content"], want.as_str());
    assert_eq!(v["streamText"], want.as_str(), "streamed");
}

/// Options of the wrong type or range are errors that name them (they were ignored, or a bad
/// ctxSize failed after the whole download), in the page and in a worker; a good load follows,
/// in a worker with `kvCache: "q8_0"`, and answers as native does with `--kv-cache q8_0`.
#[test]
fn bad_engine_options_are_refused_by_name() {
    let m = "models/tiny-tildeopen/model-Q8_0.gguf";
    let v = run_page(&[("model", &format!("/fixtures/{m}")), ("request", REQ), ("badOptions", "1")], &[], Duration::from_secs(300));
    let want: Vec<String> = ["ctxSize", "ctxSize", "ctxSize", "ctxSize", "kvF16", "kvCache", "kvF16", "normFold", "quant", "modelName"].iter().map(|p| format!("invalid_request_error:{p}")).collect();
    assert_eq!(v["badOptions"], serde_json::json!(want), "{v}");
    assert_eq!(v["badWorker"], "invalid_request_error:ctxSize", "{v}");
    assert_eq!(v["kvCache"], "q8_0");
    assert_eq!(v["afterBad"], native_with(&fixtures().join(m), REQ, &["--kv-cache", "q8_0"]).as_str());
}

#[test]
fn tiny_hf_dir_in_the_browser_matches_native() {
    let v = run_page(&[("model", "/fixtures/models/tiny-tildeopen/"), ("request", REQ)], &[], Duration::from_secs(300));
    let want = native(&fixtures().join("models/tiny-tildeopen"), REQ);
    assert_eq!(v["completion"]["choices"][0]["message"]["content"], want.as_str());
    assert_eq!(v["streamText"], want.as_str());
}

/// An optional checkpoint file the server fails to send (503, not 404) fails the load with its
/// name: it was taken for absent, and the model loaded without its chat template.
#[test]
fn a_failing_optional_file_fails_the_load() {
    let src = fixtures().join("models/tiny-tildeopen");
    let dir = std::env::temp_dir().join(format!("tildeopen-web-503-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::os::unix::fs::symlink(e.path().canonicalize().unwrap(), dir.join(e.file_name())).unwrap();
    }
    assert!(dir.join("tokenizer_config.json").exists());
    std::fs::write(dir.join("tokenizer_config.json.http-status"), "503").unwrap();
    let web = browser::WebRoot::new("tildeopen-web-503", &[("hf503", &dir)]);
    let url = format!("{}/repo/tests/web/chat.html?api=/repo/www/tildeopen.js&model=/hf503/&request={}", web.base, urlencode(REQ));
    let v = web.open(&url, &[], Duration::from_secs(300), "the page posted nothing");
    std::fs::remove_dir_all(&dir).ok();
    let f = v["failure"].as_str().unwrap_or_default();
    assert!(f.contains("tokenizer_config.json") && f.contains("HTTP 503"), "{v}");
}

#[test]
fn smollm2_in_the_browser_answers_riga() {
    let req = r#"{"messages":[{"role":"user","content":"What is the capital of Latvia?"}],"max_tokens":16,"temperature":0}"#;
    let v = run_page(&[("model", "/smollm2.gguf"), ("request", req), ("quick", "1")], &[("smollm2.gguf", &common::smollm2())], Duration::from_secs(900));
    let c = &v["completion"];
    println!(
        "SmolLM2 in Chromium: {:?}, load {:.1} s, {:.2} tokens/s",
        c["choices"][0]["message"]["content"],
        v["loadMs"].as_f64().unwrap() / 1000.0,
        v["tokensPerSecond"].as_f64().unwrap()
    );
    assert!(c["choices"][0]["message"]["content"].as_str().unwrap().contains("Riga"));
    assert_eq!(c["choices"][0]["finish_reason"], "stop");
}

#[test]
fn demo_page_loads_and_translates() {
    let v = run_page_at(
        "/repo/www/index.html",
        &[("model", "/fixtures/models/tiny-tildeopen/model-Q8_0.gguf"), ("autoload", "1"), ("autotranslate", "1"), ("report", "1"), ("max_tokens", "6")],
        Duration::from_secs(300),
    );
    let task = r#"{"task":{"type":"translate","text":"I like cakes.\n\nThe shop opens at nine.","source":"en","target":"lv"},"max_tokens":6,"temperature":0}"#;
    let want = native(&fixtures().join("models/tiny-tildeopen/model-Q8_0.gguf"), task);
    assert!(v["status"].as_str().unwrap().contains("ready"), "{v}");
    // The adapter by its GPUAdapterInfo (SwiftShader here) and its optional features.
    for want in ["swiftshader", "shader-f16: no", "subgroups: "] {
        assert!(v["status"].as_str().unwrap().to_lowercase().contains(want), "status names {want}: {v}");
        assert!(v["gpu"].as_str().unwrap().to_lowercase().contains(want), "adapter line names {want}: {v}");
    }
    assert_eq!(v["translation"], want.as_str());
    assert!(v["speed"].as_str().unwrap().contains("tokens/s"), "{v}");
}

#[test]
fn cached_weights_follow_the_file_and_truncated_files_fail_fast() {
    let tiny = fixtures().join("models/tiny-tildeopen");
    let swap = std::env::temp_dir().join(format!("tildeopen-swap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&swap);
    std::fs::create_dir_all(&swap).unwrap();
    std::fs::copy(tiny.join("model-Q8_0.gguf"), swap.join("m.gguf")).unwrap();
    let bytes = std::fs::read(tiny.join("model-Q8_0.gguf")).unwrap();
    std::fs::write(swap.join("trunc.gguf"), &bytes[..bytes.len() * 3 / 5]).unwrap();
    let other = "/fixtures/models/tiny-tildeopen/model-Q4_0.gguf";
    let v = run_page_with("/repo/tests/web/cache.html", &[("request", REQ), ("other", other)], &[("swap", &swap)], Duration::from_secs(300));
    std::fs::remove_dir_all(&swap).ok();
    println!("{v}");
    let q8 = native(&tiny.join("model-Q8_0.gguf"), REQ);
    let q4 = native(&tiny.join("model-Q4_0.gguf"), REQ);
    assert_ne!(q8, q4, "the two files answer differently, so a stale cache would show");
    assert_eq!(v["first"], q8.as_str());
    assert_eq!(v["again"], q8.as_str(), "from the cache");
    assert_eq!(v["changed"], q4.as_str(), "a changed file is read anew, not served from the old pieces");
    assert_eq!(v["afterFirst"]["versions"], 1);
    assert!(v["afterFirst"]["pieces"].as_u64().unwrap() >= 1);
    assert_eq!(v["afterChange"]["versions"], 1, "the old version's pieces are deleted");
    let t = v["truncated"].as_str().unwrap();
    assert!(t.contains("trunc.gguf") && (t.contains("past the end") || t.contains("truncated") || t.contains("extends")), "a clear error: {t}");
    assert!(v["truncatedMs"].as_f64().unwrap() < 10_000.0, "fails fast");
}

/// Nine requests at once on a 4-slot engine (mixed streamed and not, translation tasks sharing
/// their instruction and plain chats), in the page's thread and through the worker: every answer
/// and its usage equal the same request run alone; they run in far fewer passes than alone; the
/// shared instruction is copied between slots; an aborted stream ends after its second chunk and
/// leaves the others whole; a queued request aborted before its turn rejects with AbortError.
#[test]
fn many_requests_at_once_match_each_alone() {
    let v = run_page_at("/repo/tests/web/parallel.html", &[("model", "/fixtures/models/tiny-tildeopen/model-Q8_0.gguf")], Duration::from_secs(600));
    for mode in ["thread", "worker"] {
        let r = &v[mode];
        println!("{mode}: {}", serde_json::to_string(r).unwrap());
        assert_eq!(r["parallel"], 4, "{mode}");
        assert_eq!(r["together"], r["alone"], "{mode}: answers at once differ from alone");
        let alone = r["alone"].as_array().unwrap();
        assert_eq!(alone.len(), 9);
        for a in alone {
            assert!(a["usage"]["completion_tokens"].as_u64().unwrap() > 0, "{mode}: {a}");
            assert_eq!(a["usage"]["total_tokens"], a["usage"]["prompt_tokens"].as_u64().unwrap() + a["usage"]["completion_tokens"].as_u64().unwrap());
        }
        assert_eq!(r["abortedChunks"], 2, "{mode}");
        assert_eq!(r["queuedAbort"], "AbortError", "{mode}");
        assert!(r["copied"].as_u64().unwrap() > 0, "{mode}: the shared instruction was copied");
        let generated = r["generated"].as_u64().unwrap();
        let passes = r["passes"].as_u64().unwrap();
        assert!(passes * 2 < generated, "{mode}: {passes} passes for {generated} tokens");
    }
}

/// `tildeopen-wgpu/builtin-ai` in Chromium: a page written against the standard Translator and
/// LanguageDetector shapes runs through install(); availability moves from downloadable to
/// available, downloadprogress rises to 1, translate equals the engine's own translation task,
/// translateStreaming concatenates to translate, measureInputUsage is the prompt's token count,
/// and the standard DOMExceptions come for an unsupported pair, input over the quota, an
/// aborted signal and a destroyed translator.
#[test]
fn builtin_ai_interfaces_in_the_standard_shapes() {
    let v = run_page_at("/repo/tests/web/builtin-ai.html", &[("model", "/fixtures/models/tiny-tildeopen/model-Q8_0.gguf")], Duration::from_secs(600));
    println!("{v}");
    assert_eq!(v["installed"], serde_json::json!(["Translator", "LanguageDetector", "Summarizer", "LanguageModel"]));
    assert_eq!((v["before"].as_str(), v["after"].as_str(), v["unsupported"].as_str()), (Some("downloadable"), Some("available"), Some("unavailable")));
    assert_eq!(v["createError"], "NotSupportedError");
    assert_eq!(v["progressLast"], 1);
    assert!(v["progressRises"].as_bool().unwrap());
    assert_eq!(v["translated"], v["engineText"], "translate() differs from the engine's task");
    assert_eq!(v["streamed"], v["translated"]);
    assert_eq!(v["usage"], v["enginePromptTokens"]);
    assert_eq!(v["quotaError"], "QuotaExceededError");
    assert_eq!(v["abortError"], "AbortError");
    assert_eq!(v["destroyedError"], "InvalidStateError");
    assert_eq!(v["detected"]["detectedLanguage"], "lv");

    // Summarizer: the summarisation task with the options' instruction, streamed or not.
    assert_eq!(v["sumUnsupported"], "unavailable");
    assert_eq!((v["sumTypeError"].as_str(), v["sumLangError"].as_str()), (Some("TypeError"), Some("NotSupportedError")));
    assert_eq!(v["sumAttrs"], serde_json::json!(["headline", "plain-text", "short", "Local news."]));
    assert_eq!(v["summary"], v["engineSummary"], "summarize() differs from the engine's task");
    assert_eq!(v["sumStreamed"], v["summary"]);
    assert_eq!(v["sumUsage"], v["engineSumTokens"]);
    assert_eq!(v["sumQuota"], 256 - 64);
    assert_eq!(v["sumQuotaError"], "QuotaExceededError");
    assert_eq!(v["sumDestroyed"], "InvalidStateError");

    // LanguageModel: a conversation as chat messages, its usage counted as the engine counts.
    assert_eq!(v["params"], serde_json::json!({"defaultTopK": 3, "maxTopK": 128, "defaultTemperature": 1, "maxTemperature": 2}));
    assert_eq!(v["lmImage"], "unavailable");
    assert_eq!((v["lmHalfParams"].as_str(), v["lmLateSystem"].as_str()), (Some("NotSupportedError"), Some("TypeError")));
    assert_eq!(v["lmWindow"], 256);
    assert_eq!(v["lmUsage0"], v["engineLmUsage0"]);
    assert_eq!(v["lmAnswer"], v["engineAnswer"], "prompt() differs from the same chat request");
    assert_eq!(v["lmStreamed"], v["lmAnswer"], "a clone's promptStreaming() differs from prompt()");
    assert_eq!(v["lmUsage1"], v["engineLmUsage"]);
    assert_eq!(v["twinUsage"], v["lmUsage1"]);
    let n = |k: &str| v[k].as_i64().unwrap();
    assert!(n("lmMeasure") > 0 && n("lmUsage0") + n("lmMeasure") < n("lmUsage1"), "{v}");
    assert!(n("lmUsage2") > n("lmUsage1") && n("lmUsage3") > n("lmUsage2"), "{v}");
    assert!(n("lmOverflows") >= 1, "the history outgrew 256 tokens without contextoverflow");
    assert!(n("lmUsage4") <= 256);
    assert_eq!((v["lmQuota"].as_str(), v["lmAbort"].as_str(), v["lmDestroyed"].as_str()), (Some("QuotaExceededError"), Some("AbortError"), Some("InvalidStateError")));
    assert_eq!(v["qa"], v["engineQa"], "prompt(q, {{ context }}) differs from the question-answering task");
}
