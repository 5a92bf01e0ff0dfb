//! The HTTP server over loopback (real requests to `tildeopen serve` on the tiny fixture) and
//! Batch Transform files (`tildeopen batch`), including resume after a kill.

mod common;
use common::fixtures;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn tiny() -> String {
    fixtures().join("models/tiny-tildeopen/model-Q8_0.gguf").to_str().unwrap().to_string()
}

struct Server {
    child: Child,
    base: String,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(extra: &[&str]) -> Server {
    start_env(extra, &[])
}

/// Starts `tildeopen ARGS` and returns once it printed its address (the model may still load);
/// its stderr is drained into the server's log.
fn spawn(args: &[&str], env: &[(&str, &str)]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tildeopen"))
        .args(args)
        .env("RUST_LOG", "tildeopen=info")
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut base = String::new();
    let mut line = String::new();
    while err.read_line(&mut line).unwrap() > 0 {
        if let Some(a) = line.trim().strip_prefix("listening on ") {
            base = a.to_string();
            break;
        }
        line.clear();
    }
    assert!(!base.is_empty(), "no address printed");
    // Keep draining stderr (so the server never blocks on it) into a log the test can read.
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let l = log.clone();
    std::thread::spawn(move || {
        for line in err.lines().map_while(|l| l.ok()) {
            l.lock().unwrap().push(line);
        }
    });
    Server { child, base, log }
}

fn start_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
    let m = tiny();
    let mut args = vec!["serve", "--model", &m, "--port", "0", "--model-name", "tiny-test"];
    if !extra.contains(&"--ctx-size") {
        args.extend(["--ctx-size", "128"]);
    }
    args.extend_from_slice(extra);
    let server = spawn(&args, env);
    let t0 = Instant::now();
    loop {
        match ureq::get(&format!("{}/ping", server.base)).call() {
            Ok(r) if r.status() == 200 => break,
            Err(ureq::Error::Status(503, r)) => {
                let v: serde_json::Value = r.into_json().unwrap();
                assert_eq!(v["error"]["code"], "loading");
            }
            other => panic!("ping: {:?}", other.map(|r| r.status())),
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "model never became ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    server
}

/// (status, JSON body) of a POST.
fn post(url: &str, body: &str) -> (u16, serde_json::Value) {
    match ureq::post(url).set("Content-Type", "application/json").send_string(body) {
        Ok(r) => (r.status(), r.into_json().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap()),
        Err(e) => panic!("{url}: {e}"),
    }
}

/// The `data:` payloads of a streamed response.
fn sse(url: &str, body: &str) -> Vec<String> {
    let r = ureq::post(url).set("Content-Type", "application/json").send_string(body).unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.header("content-type").unwrap().starts_with("text/event-stream"));
    let mut text = String::new();
    r.into_reader().read_to_string(&mut text).unwrap();
    text.lines().filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:"))).map(|s| s.trim().to_string()).collect()
}

const HI: &str = r#"{"messages":[{"role":"user","content":"Tell me about cakes."}],"max_tokens":8,"temperature":0}"#;

#[test]
fn endpoints_stream_errors_and_concurrency() {
    let s = start(&["--max-body-bytes", "8192"]);
    let b = &s.base;

    // Both chat paths return a valid chat.completion.
    let mut contents = Vec::new();
    for path in ["/invocations", "/v1/chat/completions"] {
        let (code, v) = post(&format!("{b}{path}"), HI);
        assert_eq!(code, 200, "{v}");
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["model"], "tiny-test");
        assert_eq!(v["choices"].as_array().unwrap().len(), 1);
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["usage"]["completion_tokens"], 8);
        contents.push(v["choices"][0]["message"]["content"].as_str().unwrap().to_string());
    }
    assert_eq!(contents[0], contents[1]);
    let models: serde_json::Value = ureq::get(&format!("{b}/v1/models")).call().unwrap().into_json().unwrap();
    assert_eq!(models["data"][0]["id"], "tiny-test");

    // SSE: chunks, the final one with finish_reason, then [DONE]; deltas = the whole content.
    let events = sse(&format!("{b}/invocations"), &HI.replace("\"temperature\"", "\"stream\":true,\"temperature\""));
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<serde_json::Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length");
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, contents[0]);
    // One id, created and model across the chunks; finish_reason only on the last; no usage
    // unless asked for.
    for c in &chunks {
        for k in ["id", "created", "model"] {
            assert_eq!(c[k], chunks[0][k], "{c}");
        }
        assert!(c.get("usage").is_none_or(|u| u.is_null()), "{c}");
    }
    assert!(chunks[..chunks.len() - 1].iter().all(|c| c["choices"][0]["finish_reason"].is_null()));
    assert!(chunks[0]["id"].as_str().unwrap().starts_with("chatcmpl-"));
    // stream_options.include_usage: the final chunk (the one with finish_reason) carries usage,
    // and it matches the non-streamed response's.
    let (_, whole) = post(&format!("{b}/v1/chat/completions"), HI);
    let u = &whole["usage"];
    assert_eq!(u["total_tokens"].as_u64(), Some(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()), "{whole}");
    assert!(u["prompt_tokens"].as_u64().unwrap() > 5, "{whole}");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    assert!(whole["created"].as_u64().unwrap().abs_diff(now) < 600, "{whole}");
    let events = sse(&format!("{b}/v1/chat/completions"), &HI.replace("\"temperature\"", "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"temperature\""));
    assert_eq!(events.last().unwrap(), "[DONE]");
    let last: serde_json::Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length", "{last}");
    assert_eq!(last["usage"], *u, "{last}");
    // A stop string: finish_reason "stop", the stop text left out, streamed and not.
    let second_word = contents[0].split_whitespace().nth(1).expect("two words in 8 tokens").to_string();
    let stop_req = HI.replace("\"max_tokens\":8", &format!("\"max_tokens\":8,\"stop\":[{}]", serde_json::json!(second_word)));
    let (_, v) = post(&format!("{b}/v1/chat/completions"), &stop_req);
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let cut = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(contents[0].starts_with(cut) && !cut.contains(&second_word), "{cut:?} of {:?}", contents[0]);
    let events = sse(&format!("{b}/v1/chat/completions"), &stop_req.replace("\"temperature\"", "\"stream\":true,\"temperature\""));
    let chunks: Vec<serde_json::Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "stop");
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, cut);

    // 4xx with JSON error bodies, no choices.
    let long = "word ".repeat(300);
    for (body, status, what) in [
        ("{not json".to_string(), 400, "malformed request"),
        (r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}"#.to_string(), 400, "malformed request"),
        (r#"{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#.to_string(), 400, "malformed request"),
        (r#"{"messages":[{"role":"user","content":"x"}],"temperature":5}"#.to_string(), 400, "temperature"),
        (format!(r#"{{"messages":[{{"role":"user","content":"{long}"}}]}}"#), 400, "context window"),
        (format!(r#"{{"messages":[{{"role":"user","content":"{}"}}]}}"#, "x".repeat(9000)), 413, ""),
    ] {
        let (code, v) = post(&format!("{b}/v1/chat/completions"), &body);
        assert_eq!(code, status, "{v}");
        assert!(v.get("choices").is_none());
        assert!(v["error"]["message"].as_str().unwrap().contains(what), "{v}");
    }
    let (_, v) = post(&format!("{b}/invocations"), &format!(r#"{{"messages":[{{"role":"user","content":"{long}"}}],"stream":true}}"#));
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    // Unknown routes and wrong methods: JSON error bodies too.
    let (code, v) = post(&format!("{b}/v1/completions"), HI);
    assert_eq!((code, v["error"]["code"].as_str()), (404, Some("not_found")), "{v}");
    let (code, v) = match ureq::get(&format!("{b}/v1/chat/completions")).call() {
        Err(ureq::Error::Status(code, r)) => (code, r.into_json::<serde_json::Value>().unwrap()),
        other => panic!("GET /v1/chat/completions: {:?}", other.map(|r| r.status())),
    };
    assert_eq!((code, v["error"]["code"].as_str()), (405, Some("method_not_allowed")), "{v}");

    // A client that disconnects mid-stream does not disturb the others.
    let addr = b.strip_prefix("http://").unwrap();
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    let body = r#"{"messages":[{"role":"user","content":"Go on."}],"max_tokens":100,"stream":true}"#;
    write!(tcp, "POST /invocations HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut first = [0u8; 64];
    tcp.read_exact(&mut first).unwrap();
    drop(tcp);

    // 8 concurrent clients all succeed (4 answered side by side, the rest queued), with the
    // answers each gets alone; half of them stream.
    let body = |i: usize| format!(r#"{{"messages":[{{"role":"user","content":"Client {i}"}}],"max_tokens":{},"temperature":0}}"#, 3 + i % 4);
    let alone: Vec<String> = (0..8)
        .map(|i| {
            let (code, v) = post(&format!("{b}/v1/chat/completions"), &body(i));
            assert_eq!(code, 200, "{v}");
            v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
        })
        .collect();
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let url = format!("{b}/v1/chat/completions");
            let body = body(i);
            std::thread::spawn(move || {
                if i % 2 == 0 {
                    let (code, v) = post(&url, &body);
                    assert_eq!(code, 200, "{v}");
                    assert_eq!(v["usage"]["completion_tokens"], 3 + i % 4);
                    v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
                } else {
                    let events = sse(&url, &body.replace("\"temperature\"", "\"stream\":true,\"temperature\""));
                    assert_eq!(events.last().unwrap(), "[DONE]");
                    events[..events.len() - 1]
                        .iter()
                        .map(|e| serde_json::from_str::<serde_json::Value>(e).unwrap())
                        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(String::from))
                        .collect()
                }
            })
        })
        .collect();
    let together: Vec<String> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(together, alone);
    let (code, _) = post(&format!("{b}/invocations"), HI);
    assert_eq!(code, 200);
    // The dropped stream's generation was stopped, not run to its 100 tokens.
    assert!(s.log.lock().unwrap().iter().any(|l| l.contains("client went away")), "{:?}", s.log.lock().unwrap());
}

/// One raw HTTP/1.1 request (`head` without the final blank line); returns the status and the
/// whole response text.
fn raw(base: &str, head: &str, body: &str) -> (u16, String) {
    let addr = base.strip_prefix("http://").unwrap();
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    write!(tcp, "{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).unwrap();
    let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, out)
}

/// Web pages cannot use the server unless allowed; a foreign Host (DNS rebinding) is refused;
/// bodies must be JSON; with an API key every route but /ping needs it; the wait queue is
/// bounded; nothing refused generates.
#[test]
fn access_control_and_limits() {
    let s = start(&["--ctx-size", "2048", "--parallel", "1", "--max-queue", "1", "--allowed-origins", "https://app.example", "--api-key", "s3cret"]);
    let b = &s.base;
    let hostp = b.strip_prefix("http://").unwrap().to_string();
    let auth = "Authorization: Bearer s3cret";
    let post = |extra: &str, body: &str| raw(b, &format!("POST /v1/chat/completions HTTP/1.1\r\nHost: {hostp}\r\n{extra}"), body);
    let json = "Content-Type: application/json";
    // Allowed: no Origin, with the key.
    let (code, out) = post(&format!("{json}\r\n{auth}"), HI);
    assert_eq!(code, 200, "{out}");
    // A page of another origin, even a "simple" text/plain request: 403, nothing generated.
    let (code, out) = post(&format!("Content-Type: text/plain\r\nOrigin: https://evil.example\r\n{auth}"), HI);
    assert_eq!(code, 403, "{out}");
    assert!(out.contains("origin_not_allowed") && !out.contains("chat.completion"), "{out}");
    // text/plain without an Origin: 415.
    let (code, out) = post(&format!("Content-Type: text/plain\r\n{auth}"), HI);
    assert_eq!(code, 415, "{out}");
    // An allowed origin: its preflight is answered, then the request with CORS headers.
    let (code, out) = raw(b, &format!("OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: {hostp}\r\nOrigin: https://app.example\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type"), "");
    assert_eq!(code, 204, "{out}");
    let lower = out.to_ascii_lowercase();
    assert!(lower.contains("access-control-allow-origin: https://app.example") && lower.contains("access-control-allow-headers: authorization, content-type"), "{out}");
    let (code, out) = post(&format!("{json}\r\nOrigin: https://app.example\r\n{auth}"), HI);
    assert_eq!(code, 200, "{out}");
    assert!(out.to_ascii_lowercase().contains("access-control-allow-origin: https://app.example"), "{out}");
    // A preflight from another origin: 403.
    let (code, _) = raw(b, &format!("OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: {hostp}\r\nOrigin: http://evil.example"), "");
    assert_eq!(code, 403);
    // The server's own loopback origin is allowed.
    let (code, out) = post(&format!("{json}\r\nOrigin: http://{hostp}\r\n{auth}"), HI);
    assert_eq!(code, 200, "{out}");
    // DNS rebinding: a foreign Host on a loopback-bound server.
    let (code, out) = raw(b, &format!("POST /v1/chat/completions HTTP/1.1\r\nHost: evil.example:{}\r\n{json}\r\n{auth}", hostp.rsplit(':').next().unwrap()), HI);
    assert_eq!(code, 403, "{out}");
    assert!(out.contains("host_not_allowed"), "{out}");
    // API key: missing or wrong is 401 everywhere but /ping.
    let (code, out) = post(json, HI);
    assert_eq!(code, 401, "{out}");
    assert!(out.to_ascii_lowercase().contains("www-authenticate: bearer"), "{out}");
    let (code, _) = post(&format!("{json}\r\nAuthorization: Bearer s3cres"), HI);
    assert_eq!(code, 401);
    let (code, _) = raw(b, &format!("GET /v1/models HTTP/1.1\r\nHost: {hostp}"), "");
    assert_eq!(code, 401);
    let (code, _) = raw(b, &format!("GET /ping HTTP/1.1\r\nHost: {hostp}"), "");
    assert_eq!(code, 200);
    // Bounds on stop lists and messages.
    let stops: Vec<String> = (0..17).map(|i| format!("\"s{i}\"")).collect();
    let (code, out) = post(&format!("{json}\r\n{auth}"), &format!(r#"{{"messages":[{{"role":"user","content":"x"}}],"stop":[{}]}}"#, stops.join(",")));
    assert_eq!(code, 400, "{out}");
    assert!(out.contains("stop"), "{out}");

    // The queue: one slot busy with a long stream, one request waiting; the next gets 503 with
    // Retry-After, and the waiting one is answered once the slot frees.
    let addr = hostp.clone();
    let mut busy = std::net::TcpStream::connect(&addr).unwrap();
    // Greedy: this prompt runs to max_tokens on the tiny model (no end-of-turn), about 20 s.
    let long = r#"{"messages":[{"role":"user","content":"Go on."}],"max_tokens":1900,"temperature":0,"stream":true}"#;
    write!(busy, "POST /invocations HTTP/1.1\r\nHost: {addr}\r\n{json}\r\n{auth}\r\nContent-Length: {}\r\n\r\n{long}", long.len()).unwrap();
    let mut first = [0u8; 64];
    busy.read_exact(&mut first).unwrap();
    let (b2, h2) = (b.clone(), hostp.clone());
    let waiter = std::thread::spawn(move || raw(&b2, &format!("POST /v1/chat/completions HTTP/1.1\r\nHost: {h2}\r\nContent-Type: application/json\r\nAuthorization: Bearer s3cret"), HI));
    std::thread::sleep(Duration::from_millis(800));
    let (code, out) = post(&format!("{json}\r\n{auth}"), HI);
    assert_eq!(code, 503, "{out}");
    assert!(out.to_ascii_lowercase().contains("retry-after:") && out.contains("overloaded"), "{out}");
    // Refused before it is even parsed: a full queue costs a flood nothing to prepare.
    let (code, out) = post(&format!("{json}\r\n{auth}"), "{not json");
    assert_eq!(code, 503, "{out}");
    drop(busy);
    let (code, out) = waiter.join().unwrap();
    assert_eq!(code, 200, "{out}");
}

/// Slow or idle clients cannot hold the server: a body that has not arrived after
/// --read-timeout gets 408, headers that never end are cut off, connections past
/// --max-connections are closed as they come (and the server answers again once others go),
/// and Ctrl-C ends the server within its grace period while a client holds a connection. Also:
/// one ASCII Origin header at most, bracketed hosts with nothing after the port, a
/// case-insensitive Bearer scheme, a configured key and origins list read trimmed, /health
/// without a key, JSON-lines bodies.
#[test]
fn slow_clients_and_connection_limits() {
    let mut s = start(&["--read-timeout", "2", "--max-connections", "4", "--api-key", " k ", "--allowed-origins", "http://a.example, http://b.example"]);
    let b = s.base.clone();
    let hostp = b.strip_prefix("http://").unwrap().to_string();
    let open = || {
        let t = std::net::TcpStream::connect(&hostp).unwrap();
        t.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        t
    };
    let answer = |t: &mut std::net::TcpStream| {
        let mut out = String::new();
        let _ = t.read_to_string(&mut out);
        out
    };
    // A body that stops halfway: 408 after about 2 s.
    let mut t = open();
    let t0 = std::time::Instant::now();
    write!(t, "POST /v1/chat/completions HTTP/1.1\r\nHost: {hostp}\r\nContent-Type: application/json\r\nAuthorization: Bearer k\r\nContent-Length: 100\r\n\r\n{{\"messages\":").unwrap();
    let out = answer(&mut t);
    assert!(out.starts_with("HTTP/1.1 408") && out.contains("request_timeout"), "{out}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    // Headers that never end: the connection is closed.
    let mut t = open();
    let t0 = std::time::Instant::now();
    write!(t, "GET /ping HTTP/1.1\r\nHost: {hostp}\r\n").unwrap();
    let _ = answer(&mut t);
    assert!(t0.elapsed() < Duration::from_secs(10), "headers that never end held the connection {:?}", t0.elapsed());
    // Four idle connections fill the server; a fifth is closed at once, with no answer.
    let idle: Vec<_> = (0..4).map(|_| open()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut fifth = open();
    let t0 = std::time::Instant::now();
    let _ = write!(fifth, "GET /ping HTTP/1.1\r\nHost: {hostp}\r\nConnection: close\r\n\r\n");
    let out = answer(&mut fifth);
    assert!(out.is_empty() && t0.elapsed() < Duration::from_secs(1), "a connection past the limit: {out:?} after {:?}", t0.elapsed());
    drop(idle);
    // Answered again once the idle connections went (their slots come back as the server sees
    // them close: retried for a while, since a busy machine may take a moment).
    let t0 = std::time::Instant::now();
    loop {
        let mut t = open();
        let sent = t.write_all(format!("GET /ping HTTP/1.1\r\nHost: {hostp}\r\nConnection: close\r\n\r\n").as_bytes()).is_ok();
        if sent && answer(&mut t).starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "not answered again after the idle connections went");
        std::thread::sleep(Duration::from_millis(100));
    }
    // (raw() adds the last header lines itself: no empty line here, or they would follow the
    // request as garbage.)
    let get = |path: &str, extra: &str| {
        let extra = if extra.is_empty() { String::new() } else { format!("\r\n{extra}") };
        raw(&b, &format!("GET {path} HTTP/1.1\r\nHost: {hostp}{extra}"), "")
    };
    // The key, trimmed on both sides, under a scheme in any case; /health needs none.
    assert_eq!(get("/v1/models", "Authorization: bearer k").0, 200);
    assert_eq!(get("/v1/models", "Authorization: Bearer  k ").0, 200);
    assert_eq!(get("/v1/models", "Authorization: Bearer kk").0, 401);
    assert_eq!(get("/health", "").0, 200);
    // Origins: each of a comma-separated list with spaces; never two Origin headers, nor one
    // that is not ASCII; a bracketed host with something after it is not loopback.
    assert_eq!(get("/v1/models", "Authorization: Bearer k\r\nOrigin: http://b.example").0, 200);
    assert_eq!(get("/v1/models", "Authorization: Bearer k\r\nOrigin: http://b.example\r\nOrigin: http://evil.example").0, 403);
    let addr = hostp.clone();
    let mut t = std::net::TcpStream::connect(&addr).unwrap();
    t.write_all(format!("GET /v1/models HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer k\r\nOrigin: http://\u{e9}vil.example\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    let out = answer(&mut t);
    assert!(out.starts_with("HTTP/1.1 403"), "a non-ASCII Origin: {out}");
    let port = hostp.rsplit(':').next().unwrap();
    let (code, _) = raw(&b, &format!("GET /v1/models HTTP/1.1\r\nHost: [::1]evil.example:{port}\r\nAuthorization: Bearer k"), "");
    assert_eq!(code, 403);
    // One JSON line, as SageMaker sends a record of a JSON-lines file.
    let (code, out) = raw(&b, &format!("POST /invocations HTTP/1.1\r\nHost: {hostp}\r\nContent-Type: application/jsonlines\r\nAuthorization: Bearer k"), HI);
    assert_eq!(code, 200, "{out}");
    // Ctrl-C with a client holding a connection: the server is gone within its grace period.
    let _held = open();
    let t0 = std::time::Instant::now();
    Command::new("kill").args(["-INT", &s.child.id().to_string()]).status().unwrap();
    loop {
        if s.child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "still running {:?} after Ctrl-C", t0.elapsed());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An --allowed-origins entry that is not an origin is an error at start, not a silent no-match.
#[test]
fn a_malformed_allowed_origin_is_an_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_tildeopen"))
        .args(["serve", "--model", &tiny(), "--port", "0", "--allowed-origins", "app.example/path"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("is not an origin"), "{err}");
}

/// A panic while answering (injected through the test hook) fails the request in flight with a
/// 500 and a JSON body; the server stays healthy and answers the next request.
#[test]
fn a_panic_fails_one_request_and_the_server_goes_on() {
    let s = start_env(&[], &[("TILDEOPEN_TEST_PANIC_AT_PASS", "1")]);
    let b = &s.base;
    let (code, v) = post(&format!("{b}/v1/chat/completions"), HI);
    assert_eq!(code, 500, "{v}");
    assert_eq!(v["error"]["code"], "internal_error");
    // The panic's text stays in the log: it may be about another client's request.
    assert!(!v.to_string().contains("injected"), "{v}");
    assert!(ureq::get(&format!("{b}/ping")).call().is_ok_and(|r| r.status() == 200));
    let (code, v) = post(&format!("{b}/v1/chat/completions"), HI);
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert!(s.log.lock().unwrap().iter().any(|l| l.contains("injected panic")));
}

fn batch(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tildeopen")).args(args).output().unwrap()
}

#[test]
fn batch_transform_order_errors_join_and_resume() {
    let dir = std::env::temp_dir().join(format!("tildeopen-batch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("requests.jsonl");
    let req = |i: usize| format!(r#"{{"id_in_test":{i},"messages":[{{"role":"user","content":"Request {i}"}}],"max_tokens":3,"temperature":0.0}}"#);
    let lines = [req(0), "{broken".into(), r#"{"messages":[{"role":"user","content":"x"}],"top_p":7}"#.into(), req(3), String::new(), req(4)];
    // With a byte-order mark, as some editors write: it is not part of the first request.
    std::fs::write(&input, format!("\u{feff}{}", lines.join("\n"))).unwrap();
    let m = tiny();
    let out_dir = dir.join("out");
    let o = batch(&["batch", "--model", &m, input.to_str().unwrap(), "--output-dir", out_dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out_path = out_dir.join("requests.jsonl.out");
    let read = || -> Vec<serde_json::Value> { std::fs::read_to_string(&out_path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect() };
    let out = read();
    assert_eq!(out.len(), 5, "one line per request line, blank lines skipped");
    for i in [0, 3, 4] {
        assert_eq!(out[i]["object"], "chat.completion", "{}", out[i]);
    }
    assert!(out[1]["error"]["message"].as_str().unwrap().starts_with("malformed request"));
    assert_eq!(out[2]["error"]["param"], "top_p");
    assert!(String::from_utf8_lossy(&o.stderr).contains("5 lines"), "{}", String::from_utf8_lossy(&o.stderr));

    // JoinSource = Input: the request with the response under SageMakerOutput.
    std::fs::remove_file(&out_path).unwrap();
    let o = batch(&["batch", "--model", &m, input.to_str().unwrap(), "--output-dir", out_dir.to_str().unwrap(), "--join-source", "input"]);
    assert!(o.status.success());
    let joined = read();
    assert_eq!(joined.len(), 5);
    // The request as written, byte for byte, then the response as its last member, whose
    // fields come in the spec's order.
    let text = std::fs::read_to_string(&out_path).unwrap();
    let raw: Vec<&str> = text.lines().collect();
    for i in [0, 3, 4] {
        let want = format!("{},\"SageMakerOutput\":{{\"id\":\"chatcmpl-", req(i).strip_suffix('}').unwrap());
        assert!(raw[i].starts_with(&want), "{}", raw[i]);
        let keys: Vec<usize> = ["\"object\"", "\"created\"", "\"model\"", "\"choices\"", "\"usage\""].iter().map(|k| raw[i].find(k).unwrap()).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{}", raw[i]);
    }
    for (i, want) in [(0, 0), (3, 3), (4, 4)] {
        assert_eq!(joined[i]["id_in_test"], want);
        assert_eq!(joined[i]["max_tokens"], 3);
        assert_eq!(joined[i]["SageMakerOutput"]["object"], "chat.completion");
    }
    assert!(joined[1]["error"].is_object(), "not JSON: the error object alone");
    assert_eq!(joined[2]["SageMakerOutput"]["error"]["param"], "top_p");

    // Resume: a crash left one line and half of the next; the rerun completes the rest.
    let text = std::fs::read_to_string(&out_path).unwrap();
    let first_end = text.find('\n').unwrap() + 1;
    std::fs::write(&out_path, &text[..first_end + 20]).unwrap();
    let o = batch(&["batch", "--model", &m, input.to_str().unwrap(), "--output-dir", out_dir.to_str().unwrap(), "--join-source", "input"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("1 resumed"), "{}", String::from_utf8_lossy(&o.stderr));
    let resumed = read();
    assert_eq!(resumed.len(), 5);
    assert_eq!(resumed[0], joined[0]);
    assert_eq!(resumed.iter().map(|v| v["id_in_test"].clone()).collect::<Vec<_>>(), joined.iter().map(|v| v["id_in_test"].clone()).collect::<Vec<_>>());

    // A real kill mid-job, then a rerun: every line once, in order.
    let many: Vec<String> = (0..12).map(|i| req(i).replace("\"max_tokens\":3", "\"max_tokens\":24")).collect();
    let input2 = dir.join("many.jsonl");
    std::fs::write(&input2, many.join("\n") + "\n").unwrap();
    let out2 = dir.join("many.jsonl.out");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tildeopen")).args(["batch", "--model", &m, input2.to_str().unwrap(), "--join-source", "input"]).stderr(Stdio::null()).spawn().unwrap();
    let t0 = Instant::now();
    while std::fs::read_to_string(&out2).map_or(0, |t| t.lines().count()) < 2 && t0.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before = std::fs::read_to_string(&out2).unwrap().lines().count();
    assert!(before < 12, "killed before the end ({before} lines)");
    let o = batch(&["batch", "--model", &m, input2.to_str().unwrap(), "--join-source", "input"]);
    assert!(o.status.success());
    let all: Vec<serde_json::Value> = std::fs::read_to_string(&out2).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(all.iter().map(|v| v["id_in_test"].as_u64().unwrap()).collect::<Vec<_>>(), (0..12).collect::<Vec<_>>());
    assert!(all.iter().all(|v| v["SageMakerOutput"]["object"] == "chat.completion"));
    std::fs::remove_dir_all(&dir).ok();
}

/// `POST` with a content type; the status, the content type and the body as text.
fn post_as(url: &str, content_type: &str, body: &str) -> (u16, String, String) {
    let r = match ureq::post(url).set("Content-Type", content_type).send_string(body) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{url}: {e}"),
    };
    let (status, ct) = (r.status(), r.header("content-type").unwrap_or("").to_string());
    (status, ct, r.into_string().unwrap())
}

/// SageMaker's side of the server: MultiRecord payloads of 1, 3 and 50 JSON Lines records (any
/// of the content types the platform sends) answered one line per record, in order, each equal
/// to the record sent alone; a malformed and a too-long record in the middle become error lines
/// and the rest are answered; a payload takes a queue place per record (over the bound: 413);
/// `/execution-parameters`; and one model id in `/v1/models`, completions and chunks.
#[test]
fn multirecord_payloads_and_execution_parameters() {
    let s = start(&["--parallel", "4", "--max-queue", "60", "--max-body-bytes", "3145728"]);
    let inv = format!("{}/invocations", s.base);
    let v: serde_json::Value = ureq::get(&format!("{}/execution-parameters", s.base)).call().unwrap().into_json().unwrap();
    assert_eq!(v, serde_json::json!({"MaxConcurrentTransforms": 4, "BatchStrategy": "MultiRecord", "MaxPayloadInMB": 3}));
    let models: serde_json::Value = ureq::get(&format!("{}/v1/models", s.base)).call().unwrap().into_json().unwrap();
    assert_eq!(models["data"][0]["id"], "tiny-test");

    let record = |i: usize| format!(r#"{{"messages":[{{"role":"user","content":"Record {i}: tell me about bread and cakes."}}],"max_tokens":{},"temperature":0}}"#, 3 + i % 4);
    let alone: Vec<serde_json::Value> = (0..50).map(|i| post(&inv, &record(i)).1).collect();
    for a in &alone {
        assert_eq!(a["object"], "chat.completion");
        assert_eq!(a["model"], "tiny-test");
    }
    let content = |v: &serde_json::Value| (v["choices"][0]["message"]["content"].clone(), v["usage"].clone());
    // One record: today's answer, a chat.completion object.
    let (st, ct, body) = post_as(&inv, "application/jsonlines", &format!("{}\n", record(0)));
    assert_eq!((st, ct.as_str()), (200, "application/json"));
    assert_eq!(content(&serde_json::from_str(&body).unwrap()), content(&alone[0]));
    // 3 and 50 records, as the platform sends them.
    for (n, ct_in) in [(3, "application/jsonlines"), (50, "application/x-jsonlines"), (3, "application/json")] {
        let payload: String = (0..n).map(|i| record(i) + "\n").collect();
        let (st, ct, body) = post_as(&inv, ct_in, &payload);
        assert_eq!((st, ct.as_str()), (200, "application/jsonlines"), "{body}");
        let lines: Vec<serde_json::Value> = body.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), n);
        for (i, l) in lines.iter().enumerate() {
            assert_eq!(content(l), content(&alone[i]), "{n} records ({ct_in}): record {i}");
        }
    }
    // A malformed line and a record over the context (128 tokens) in the middle: error lines.
    let long = format!(r#"{{"messages":[{{"role":"user","content":"{}"}}]}}"#, "bread and cakes ".repeat(200));
    let payload = [record(0), "{not json".into(), long, record(1)].join("\r\n");
    let (st, _, body) = post_as(&inv, "application/jsonlines", &payload);
    assert_eq!(st, 200, "{body}");
    let lines: Vec<serde_json::Value> = body.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 4);
    assert_eq!(content(&lines[0]), content(&alone[0]));
    assert_eq!(lines[1]["error"]["type"], "invalid_request_error", "{}", lines[1]);
    assert_eq!(lines[2]["error"]["code"], "context_length_exceeded", "{}", lines[2]);
    assert_eq!(content(&lines[3]), content(&alone[1]));
    // Bounds: more records than the queue takes is refused whole; the body limit holds.
    let payload: String = (0..61).map(|i| record(i) + "\n").collect();
    let (st, _, body) = post_as(&inv, "application/jsonlines", &payload);
    assert_eq!(st, 413, "{body}");
    assert!(body.contains("at most 60 per payload"), "{body}");
    let big = format!("{}\n{}", record(0), "x".repeat(3 << 20));
    assert_eq!(post_as(&inv, "application/jsonlines", &big).0, 413);
    // A pretty-printed single request is one request, not records.
    let pretty = serde_json::to_string_pretty(&serde_json::from_str::<serde_json::Value>(&record(2)).unwrap()).unwrap();
    let (st, ct, body) = post_as(&inv, "application/json", &pretty);
    assert_eq!((st, ct.as_str()), (200, "application/json"), "{body}");
    assert_eq!(content(&serde_json::from_str(&body).unwrap()), content(&alone[2]));
    // Chunks name the same model.
    let chunks = sse(&inv, r#"{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2,"stream":true}"#);
    let first: serde_json::Value = serde_json::from_str(&chunks[0]).unwrap();
    assert_eq!(first["model"], "tiny-test");
}

/// While the model loads (SmolLM2 on lavapipe: seconds), `/v1/models` already names it (the
/// file's stem: no --model-name) and every route that needs the model answers 503 `loading`
/// with `Retry-After`; once loaded, completions carry the same id.
#[test]
fn the_model_id_is_known_while_loading() {
    let m = common::smollm2();
    let server = spawn(&["serve", "--model", m.to_str().unwrap(), "--port", "0", "--ctx-size", "256"], &[]);
    let base = server.base.clone();
    let stem = m.file_stem().unwrap().to_str().unwrap().to_string();
    let (mut saw_loading, t0) = (false, Instant::now());
    loop {
        let models: serde_json::Value = ureq::get(&format!("{base}/v1/models")).call().unwrap().into_json().unwrap();
        assert_eq!(models["data"][0]["id"], stem.as_str(), "the id, loading or not");
        match ureq::post(&format!("{base}/v1/chat/completions")).set("Content-Type", "application/json").send_string(HI) {
            Err(ureq::Error::Status(503, r)) => {
                assert_eq!(r.header("retry-after"), Some("5"));
                let v: serde_json::Value = r.into_json().unwrap();
                assert_eq!(v["error"]["code"], "loading");
                saw_loading = true;
            }
            Ok(r) => {
                let v: serde_json::Value = r.into_json().unwrap();
                assert_eq!(v["model"], stem.as_str());
                break;
            }
            Err(e) => panic!("{e}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(300), "never loaded");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(saw_loading, "the load finished before the first request: nothing was checked while loading");
    drop(server);
}
