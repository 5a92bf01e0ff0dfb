//! The HTTP endpoint of the response format (native only): SageMaker's container contract
//! (`GET /ping`, `POST /invocations`) and OpenAI's (`POST /v1/chat/completions`,
//! `GET /v1/models`), with server-sent events for `"stream": true`.
//!
//! One worker thread owns the model and answers up to `parallel` requests at once, their decode
//! steps and prompt chunks sharing each forward pass (continuous batching); up to `max_queue`
//! more wait in arrival order (FIFO: nobody starves), beyond that 503 with `Retry-After`. HTTP
//! handlers parse, validate, render and tokenize (on the blocking pool, never on the model
//! thread), queue and relay. A client that goes away stops its generation at the next token.
//!
//! Access control, since every web page the user opens can reach a local port: requests with an
//! `Origin` that is not allowed get 403 (allowed: no `Origin`, the server's own loopback origin,
//! `allowed_origins`); bound to a loopback address, only loopback `Host` names are answered (DNS
//! rebinding); with an API key, every route but `/ping` and `/health` needs
//! `Authorization: Bearer KEY`; POST bodies must be JSON (which also makes browsers send a CORS
//! preflight). Connections are capped, headers and bodies have deadlines (`serve_connections`).
//!
//! Health: a panic while answering fails the requests in flight (500) and the worker goes on
//! with empty caches; a lost device (or a GPU error) or a dead worker turns `/ping` into 503 and
//! makes `serve` return an error, so the process exits non-zero and the platform restarts it.

use crate::chat::api::{ApiError, ChatCompletion, ChatCompletionChunk, ChatRequest};
use crate::chat::{self, ChatEngine, Output, Prepared, Prompter, RequestId};
use crate::error::Result;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Server settings.
pub struct ServeOptions {
    pub host: String,
    /// 0 picks a free port (the bound address is printed).
    pub port: u16,
    /// Largest request body in bytes.
    pub max_body_bytes: usize,
    /// Origins (`scheme://host[:port]`) whose pages may call the server, besides its own
    /// loopback origin; `*` allows every origin.
    pub allowed_origins: Vec<String>,
    /// When set, every route but `/ping` needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Requests that may wait for a slot; more get 503 with `Retry-After`.
    pub max_queue: usize,
    /// How long a client may take to send a body (headers: at most 10 s of it).
    pub read_timeout: std::time::Duration,
    /// Connections served at once; more are closed as they arrive.
    pub max_connections: usize,
    /// The `model` of `/v1/models`, completions and chunks, from the start (before the model
    /// has loaded).
    pub model_name: String,
    /// Requests answered at once (what `/execution-parameters` offers Batch Transform).
    pub parallel: usize,
}

/// The most requests waiting for a slot by default.
pub const DEFAULT_MAX_QUEUE: usize = 32;

/// Who may call the server (see the module docs).
struct Access {
    /// Bound to a loopback address: only loopback host names are answered.
    loopback: bool,
    origins: Vec<String>,
    any_origin: bool,
    api_key: Option<String>,
}

/// `host[:port]` names this machine only.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // `[addr]` or `[addr]:port`, nothing else after the bracket.
        match rest.split_once(']') {
            Some((addr, after)) if after.is_empty() || after.strip_prefix(':').is_some_and(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit())) => addr,
            _ => return false,
        }
    } else {
        host.rsplit_once(':').map_or(host, |(h, port)| if port.chars().all(|c| c.is_ascii_digit()) { h } else { host })
    };
    let name = name.to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// `scheme://host[:port]` with nothing after it but an optional `/`.
fn valid_origin(o: &str) -> bool {
    let Some((scheme, rest)) = o.split_once("://") else { return false };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    !scheme.is_empty()
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        && !rest.is_empty()
        && !rest.contains(['/', '?', '#', ' ', ','])
}

/// Equal, in a time that depends on neither where they differ nor the secret's length (`b`).
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() != b.len()) as u8;
    for (i, x) in a.iter().enumerate() {
        diff |= x ^ b.get(i % b.len().max(1)).copied().unwrap_or(0);
    }
    diff == 0
}

impl Access {
    fn origin_allowed(&self, origin: &str, host: &str) -> bool {
        let origin = origin.trim_end_matches('/');
        self.any_origin
            || self.origins.iter().any(|o| o.trim_end_matches('/').eq_ignore_ascii_case(origin))
            // The server's own origin, on loopback only.
            || (is_loopback_host(host) && ["http://", "https://"].iter().any(|s| origin.eq_ignore_ascii_case(&format!("{s}{host}"))))
    }
}

fn deny(status: u16, code: &str, message: String) -> Response {
    let kind = if status == 401 { "authentication_error" } else { "invalid_request_error" };
    error_response(&ApiError { status, message, kind: kind.into(), param: None, code: Some(code.into()) })
}

/// Host, Origin, CORS preflight, API key and content type, before any route.
async fn guard(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let a = &st.access;
    let headers = req.headers();
    let text = |h: &HeaderMap, n: header::HeaderName| h.get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
    let host = text(headers, header::HOST).unwrap_or_default();
    if a.loopback && !is_loopback_host(&host) {
        return deny(403, "host_not_allowed", format!("Host {host:?} is not a loopback name, and this server is bound to loopback"));
    }
    // An Origin that is there counts, readable or not: two of them, or one that is not ASCII,
    // is refused rather than read as none.
    let origins = headers.get_all(header::ORIGIN).iter().collect::<Vec<_>>();
    if origins.len() > 1 || origins.first().is_some_and(|o| o.to_str().is_err()) {
        return deny(403, "origin_not_allowed", "a request may carry one ASCII Origin header".into());
    }
    let origin = text(headers, header::ORIGIN);
    if let Some(o) = &origin {
        if !a.origin_allowed(o, &host) {
            return deny(403, "origin_not_allowed", format!("origin {o} is not allowed (tildeopen serve --allowed-origins)"));
        }
    }
    let cors = |mut r: Response| {
        if let Some(o) = origin.as_deref().and_then(|o| HeaderValue::from_str(o).ok()) {
            let h = r.headers_mut();
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
            h.insert(header::VARY, HeaderValue::from_static("Origin"));
        }
        r
    };
    if req.method() == Method::OPTIONS {
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, OPTIONS"));
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static("authorization, content-type"));
        h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
        return cors(r);
    }
    if let Some(key) = &a.api_key {
        let given = text(headers, header::AUTHORIZATION).unwrap_or_default();
        // The scheme is case-insensitive (RFC 7235); the key itself is not.
        let ok = given.split_once(' ').filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer")).is_some_and(|(_, k)| same_secret(k.trim().as_bytes(), key.as_bytes()));
        // Health checks (SageMaker's /ping, Kubernetes-style /health) need no key.
        if !matches!(req.uri().path(), "/ping" | "/health") && !ok {
            let mut r = deny(401, "invalid_api_key", "this server needs Authorization: Bearer <its API key>".into());
            r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return cors(r);
        }
    }
    if req.method() == Method::POST {
        let ct = text(headers, header::CONTENT_TYPE).unwrap_or_default();
        let essence = ct.split(';').next().unwrap_or("").trim();
        // JSON, or one JSON line as SageMaker Batch Transform sends a record of a JSON-lines
        // file: none of these is a type a page may send without a CORS preflight.
        if !["application/json", "application/jsonlines", "application/x-jsonlines", "application/x-ndjson"].iter().any(|t| essence.eq_ignore_ascii_case(t)) {
            return cors(deny(415, "unsupported_media_type", format!("request bodies must be application/json, not {ct:?}")));
        }
        // The whole body within read_timeout and max_body bytes, before any handler: a client
        // that trickles its body cannot hold a connection (or a place) for ever.
        let (parts, body) = req.into_parts();
        let bytes = match tokio::time::timeout(st.read_timeout, http_body_util::BodyExt::collect(http_body_util::Limited::new(body, st.max_body))).await {
            Err(_) => return cors(deny(408, "request_timeout", format!("the request body did not arrive within {} s", st.read_timeout.as_secs()))),
            Ok(Err(e)) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
                return cors(deny(413, "payload_too_large", format!("request bodies may be at most {} bytes", st.max_body)))
            }
            Ok(Err(e)) => return cors(deny(400, "bad_body", format!("the request body could not be read: {e}"))),
            Ok(Ok(b)) => b.to_bytes(),
        };
        return cors(next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await);
    }
    cors(next.run(req).await)
}

/// The longest a client may take to send a request's headers.
const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Connections served at once by default; more are closed as they come (each holds a file
/// descriptor, and up to `max_body` bytes while its body arrives).
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// After Ctrl-C, how long connections in progress get to finish (a second Ctrl-C: none).
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves `app` on `listener` until Ctrl-C: at most `max_connections` connections, each
/// HTTP/1.1 with `header_timeout` to send its headers (an idle keep-alive connection is closed
/// then too).
async fn serve_connections(listener: tokio::net::TcpListener, app: Router, max_connections: usize, header_timeout: std::time::Duration) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let max_connections = max_connections.clamp(1, 1 << 20);
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let (close_tx, close_rx) = tokio::sync::watch::channel(false);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    log::warn!("accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut ctrl_c => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            log::warn!("{max_connections} connections open: one more closed");
            continue;
        };
        let svc = hyper_util::service::TowerToHyperService::new(app.clone());
        let mut close = close_rx.clone();
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(stream), svc);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = close.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            drop(slot);
        });
    }
    // Stop: no new connections; those in progress finish their response, for at most
    // SHUTDOWN_GRACE (or until a second Ctrl-C).
    drop(listener);
    let _ = close_tx.send(true);
    tokio::select! {
        _ = tokio::time::timeout(SHUTDOWN_GRACE, slots.acquire_many(max_connections as u32)) => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}

pub(super) enum Reply {
    Error(ApiError),
    Completion(Box<ChatCompletion>),
    Chunk(Box<ChatCompletionChunk>),
    Done,
}

pub(super) struct Job {
    pub(super) prepared: Prepared,
    pub(super) stream: bool,
    pub(super) tx: mpsc::UnboundedSender<Reply>,
}

pub(super) struct AppState {
    ready: AtomicBool,
    /// The worker has stopped (a lost device, a GPU error, a panic outside a request).
    dead: AtomicBool,
    pub(super) model: String,
    parallel: usize,
    /// Turns requests into prompts off the model thread (set once the model is loaded).
    pub(super) prompter: std::sync::OnceLock<Prompter>,
    pub(super) jobs: std::sync::mpsc::Sender<Job>,
    /// Requests past the queue check and not yet given a slot: being prepared, or sent to the
    /// worker and waiting (the place is taken before preparing, so at most `max_queue`).
    pub(super) waiting: Arc<AtomicUsize>,
    pub(super) max_queue: usize,
    /// Requests being parsed, rendered and tokenized at once (about one per core): a flood of
    /// big bodies queues here instead of filling the blocking pool.
    pub(super) preparing: Arc<tokio::sync::Semaphore>,
    access: Access,
    /// Largest request body in bytes.
    pub(super) max_body: usize,
    read_timeout: std::time::Duration,
}

/// A place in the queue, given back when dropped unless the worker took the job (which then
/// gives it back when the job gets a slot): a request refused, failed or abandoned by its
/// client while being prepared frees its place.
pub(super) struct Place(Arc<AtomicUsize>, bool);

impl Place {
    pub(super) fn handed_over(mut self) {
        self.1 = false;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.1 {
            self.0.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

pub(super) fn server_error(status: u16, code: &str, message: String) -> ApiError {
    ApiError { status, message, kind: "server_error".into(), param: None, code: Some(code.into()) }
}

pub(super) fn error_response(e: &ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(e.body())).into_response()
}

/// 503 while the model loads, with `Retry-After` (clients and SageMaker retry).
pub(super) fn unavailable() -> Response {
    let e = ApiError { status: 503, message: "the model is still loading".into(), kind: "server_error".into(), param: None, code: Some("loading".into()) };
    let mut r = error_response(&e);
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    r
}

/// 503 `overloaded` with `Retry-After`: the queue of `max_queue` requests is full.
pub(super) fn overloaded(max_queue: usize) -> Response {
    let mut r = error_response(&server_error(503, "overloaded", format!("{max_queue} requests are already waiting; retry later")));
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// `n` places in the queue at once, or none when they would pass its bound.
pub(super) fn take_places(st: &AppState, n: usize) -> Option<Vec<Place>> {
    st.waiting.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| (w + n <= st.max_queue).then_some(w + n)).ok()?;
    Some((0..n).map(|_| Place(st.waiting.clone(), true)).collect())
}

/// The checks before a request is taken: the worker alive, the model loaded. Returns the
/// prompter.
pub(super) fn ready(st: &AppState) -> std::result::Result<Prompter, Response> {
    if st.dead.load(Ordering::Acquire) {
        return Err(error_response(&server_error(503, "unhealthy", "the model worker has stopped".into())));
    }
    st.prompter.get().cloned().filter(|_| st.ready.load(Ordering::Acquire)).ok_or_else(unavailable)
}

async fn ping(State(st): State<Arc<AppState>>) -> Response {
    if st.dead.load(Ordering::Acquire) {
        return error_response(&server_error(503, "unhealthy", "the model worker has stopped; the server is exiting".into()));
    }
    if st.ready.load(Ordering::Acquire) {
        (StatusCode::OK, Json(serde_json::json!({"status": "ok"}))).into_response()
    } else {
        unavailable()
    }
}

/// The one model, by the name given at start (known before it loads: never empty).
async fn models(State(st): State<Arc<AppState>>) -> Response {
    Json(serde_json::json!({"object": "list", "data": [{"id": st.model, "object": "model", "created": crate::util::unix_time(), "owned_by": "tildeopen"}]}))
        .into_response()
}

/// What SageMaker Batch Transform asks for when a job leaves them unset: requests at once (the
/// parallel slots), records packed into one request (MultiRecord), and the payload size the body
/// limit takes (whole MB, 1 to 100).
async fn execution_parameters(State(st): State<Arc<AppState>>) -> Response {
    let mb = (st.max_body >> 20).clamp(1, 100);
    Json(serde_json::json!({"MaxConcurrentTransforms": st.parallel, "BatchStrategy": "MultiRecord", "MaxPayloadInMB": mb})).into_response()
}

/// A body the extractor refused (too large, unreadable): its status and reason.
pub(super) fn rejected(rej: BytesRejection) -> Response {
    let status = rej.status().as_u16();
    error_response(&ApiError { status, message: rej.body_text(), kind: "invalid_request_error".into(), param: None, code: None })
}

/// `/invocations`: one request as `/v1/chat/completions` takes it, or a MultiRecord payload of
/// JSON Lines records (see `records.rs`).
async fn invocations(State(st): State<Arc<AppState>>, body: std::result::Result<Bytes, BytesRejection>) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(rej) => return rejected(rej),
    };
    match super::records::split(&body) {
        Some(lines) => super::records::answer(st, lines).await,
        None => chat(State(st), Ok(body)).await,
    }
}

async fn chat(State(st): State<Arc<AppState>>, body: std::result::Result<Bytes, BytesRejection>) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(rej) => return rejected(rej),
    };
    let prompter = match ready(&st) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let Some(mut places) = take_places(&st, 1) else {
        return overloaded(st.max_queue);
    };
    let place = places.pop().unwrap();
    let Ok(permit) = st.preparing.clone().acquire_owned().await else {
        return error_response(&server_error(503, "unhealthy", "the server is shutting down".into()));
    };
    // Parsing, validation, the template and the tokenizer run here, on the blocking pool: a
    // giant request never delays the forward passes of the others. The permit goes with the
    // work, so a client that hangs up does not free it before the work is done.
    let prepared = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let text = std::str::from_utf8(&body).map_err(|_| ApiError::invalid("malformed request: the body is not UTF-8".into(), None))?;
        let req = ChatRequest::from_json(text)?;
        let stream = req.stream.unwrap_or(false);
        Ok::<_, ApiError>((prompter.prepare(&req)?, stream))
    })
    .await;
    let (prepared, stream) = match prepared {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => return error_response(&e),
        Err(_) => return error_response(&server_error(500, "internal_error", "preparing the request failed".into())),
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    if st.jobs.send(Job { prepared, stream, tx }).is_err() {
        return error_response(&server_error(503, "unhealthy", "the model worker has stopped".into()));
    }
    place.handed_over();
    match rx.recv().await {
        Some(Reply::Error(e)) => error_response(&e),
        Some(Reply::Completion(c)) => Json(*c).into_response(),
        Some(Reply::Chunk(first)) => {
            let events = futures_util::stream::unfold((Some(first), rx, false), |(first, mut rx, done)| async move {
                if done {
                    return None;
                }
                let reply = match first {
                    Some(c) => Reply::Chunk(c),
                    None => rx.recv().await.unwrap_or(Reply::Done),
                };
                let (event, done) = match reply {
                    Reply::Chunk(c) => (Event::default().data(serde_json::to_string(&c).unwrap()), false),
                    Reply::Error(e) => (Event::default().data(e.body().to_string()), false),
                    Reply::Done | Reply::Completion(_) => (Event::default().data("[DONE]"), true),
                };
                Some((Ok::<_, std::convert::Infallible>(event), (None, rx, done)))
            });
            ([(header::CACHE_CONTROL, "no-cache")], Sse::new(events)).into_response()
        }
        Some(Reply::Done) | None => error_response(&server_error(500, "internal_error", "the model worker dropped the request".into())),
    }
}

/// Answers jobs until every sender is gone: up to the engine's `parallel` requests at once, each
/// forward pass carrying all of them (continuous batching); waiting jobs are taken in arrival
/// order as slots free up, so nobody starves. A client that went away is cancelled before the
/// next pass. A panic while answering fails the requests in flight and the engine goes on with
/// empty caches; a device that is lost (or reported an error) ends the worker with that error.
fn worker(mut eng: ChatEngine, jobs: std::sync::mpsc::Receiver<Job>, waiting: Arc<AtomicUsize>) -> Result<()> {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let mut queue: VecDeque<Job> = VecDeque::new();
    let mut clients: HashMap<RequestId, (mpsc::UnboundedSender<Reply>, bool)> = HashMap::new();
    let took = |n: usize| {
        waiting.fetch_sub(n, Ordering::AcqRel);
    };
    // Test hook (set by the operator's environment, never by a request): panic in pass N.
    let panic_at: Option<u64> = std::env::var("TILDEOPEN_TEST_PANIC_AT_PASS").ok().and_then(|v| v.parse().ok());
    let mut passes = 0u64;
    loop {
        if clients.is_empty() && queue.is_empty() {
            match jobs.recv() {
                Ok(j) => queue.push_back(j),
                Err(_) => return Ok(()),
            }
        }
        while let Ok(j) = jobs.try_recv() {
            queue.push_back(j);
        }
        let before = queue.len();
        queue.retain(|j| !j.tx.is_closed());
        took(before - queue.len());
        clients.retain(|&id, (tx, _)| {
            let gone = tx.is_closed();
            if gone {
                log::info!("client went away: generation stopped");
                eng.cancel(id);
            }
            !gone
        });
        let ran = catch_unwind(AssertUnwindSafe(|| {
            while !queue.is_empty() && eng.has_free_slot() {
                let job = queue.pop_front().unwrap();
                took(1);
                match eng.admit(job.prepared, job.stream) {
                    Ok(id) => {
                        clients.insert(id, (job.tx, job.stream));
                    }
                    Err(e) => {
                        let _ = job.tx.send(Reply::Error(e));
                    }
                }
            }
            let ready = eng.ready();
            deliver(&mut eng, &mut clients, ready);
            passes += 1;
            if panic_at == Some(passes) {
                panic!("test hook: injected panic in pass {passes}");
            }
            let events = pollster::block_on(eng.step());
            deliver(&mut eng, &mut clients, events);
        }));
        if let Err(panic) = ran {
            let what = panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
            log::error!("internal error while answering (the requests in flight fail, the server goes on): {what}");
            eng.abort_all();
            // The detail goes to the log only: it may be about another client's request.
            for (_, (tx, stream)) in clients.drain() {
                let _ = tx.send(Reply::Error(server_error(500, "internal_error", "internal error while answering; the server log has the detail".into())));
                if stream {
                    let _ = tx.send(Reply::Done);
                }
            }
        }
        if let Err(e) = eng.check_device() {
            let err = server_error(503, "unhealthy", format!("{e}"));
            for (_, (tx, _)) in clients.drain() {
                let _ = tx.send(Reply::Error(err.clone()));
            }
            for j in queue.drain(..) {
                let _ = j.tx.send(Reply::Error(err.clone()));
            }
            return Err(e);
        }
    }
}

/// Hands each output to its client; a stream ends with `Done` after its last output.
fn deliver(eng: &mut ChatEngine, clients: &mut HashMap<RequestId, (mpsc::UnboundedSender<Reply>, bool)>, events: Vec<chat::Event>) {
    for ev in events {
        let Some((tx, stream)) = clients.get(&ev.id) else { continue };
        let reply = match ev.output {
            Output::Chunk(c) => Reply::Chunk(Box::new(c)),
            Output::Completion(c) => Reply::Completion(Box::new(c)),
            Output::Error(e) => Reply::Error(e),
        };
        let mut sent = tx.send(reply).is_ok();
        if ev.last && *stream {
            sent &= tx.send(Reply::Done).is_ok();
        }
        if ev.last {
            clients.remove(&ev.id);
        } else if !sent {
            log::info!("client went away: generation stopped");
            eng.cancel(ev.id);
            clients.remove(&ev.id);
        }
    }
}

/// Binds, then loads the model with `load` on the worker thread (`/ping` answers 503 until it
/// is ready), then serves until the process is stopped. `on_bound` gets the bound address.
pub fn serve(
    opts: ServeOptions,
    load: impl FnOnce() -> Result<ChatEngine> + Send + 'static,
    on_bound: impl FnOnce(std::net::SocketAddr),
) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| crate::Error::Io { path: "tokio runtime".into(), source: e })?;
    rt.block_on(async move {
        let addr = format!("{}:{}", opts.host, opts.port);
        let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|e| crate::Error::Io { path: addr.clone(), source: e })?;
        let local = listener.local_addr().map_err(|e| crate::Error::Io { path: addr.clone(), source: e })?;
        on_bound(local);
        let (jobs_tx, jobs_rx) = std::sync::mpsc::channel::<Job>();
        let ip = local.ip();
        let access = Access {
            loopback: ip.is_loopback(),
            any_origin: opts.allowed_origins.iter().any(|o| o.trim() == "*"),
            origins: opts.allowed_origins.iter().map(|o| o.trim().to_string()).filter(|o| !o.is_empty()).collect(),
            // Trimmed as the key a client sends is (a key read from a CRLF file ends in \r).
            api_key: opts.api_key.as_deref().map(str::trim).filter(|k| !k.is_empty()).map(str::to_string),
        };
        if let Some(bad) = access.origins.iter().find(|o| *o != "*" && !valid_origin(o)) {
            return Err(crate::Error::Input(format!("--allowed-origins: {bad:?} is not an origin (scheme://host[:port])")));
        }
        if !access.loopback && access.api_key.is_none() {
            eprintln!(
                "warning: listening on {local}, reachable from other machines, with no API key: anyone who can reach the port can use the model (--api-key or $TILDEOPEN_API_KEY; --host 127.0.0.1 for this machine only)"
            );
        }
        let waiting = Arc::new(AtomicUsize::new(0));
        let state = Arc::new(AppState {
            ready: AtomicBool::new(false),
            dead: AtomicBool::new(false),
            model: opts.model_name.clone(),
            parallel: opts.parallel.max(1),
            prompter: std::sync::OnceLock::new(),
            jobs: jobs_tx,
            waiting: waiting.clone(),
            max_queue: opts.max_queue.max(1),
            preparing: Arc::new(tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(2, |n| n.get()))),
            access,
            max_body: opts.max_body_bytes,
            read_timeout: opts.read_timeout,
        });
        let st = state.clone();
        let (fail_tx, mut fail_rx) = mpsc::unbounded_channel::<crate::Error>();
        std::thread::Builder::new()
            .name("tildeopen-model".into())
            .spawn(move || {
                // Whatever ends this thread (an error, a panic) marks the server unhealthy.
                struct Dead(Arc<AppState>, mpsc::UnboundedSender<crate::Error>);
                impl Drop for Dead {
                    fn drop(&mut self) {
                        self.0.dead.store(true, Ordering::Release);
                        let _ = self.1.send(crate::Error::Gpu("the model worker stopped".into()));
                    }
                }
                let guard = Dead(st.clone(), fail_tx.clone());
                match load() {
                    Ok(eng) => {
                        let _ = st.prompter.set(eng.prompter());
                        st.ready.store(true, Ordering::Release);
                        eprintln!(
                            "model {} ready ({} parallel requests, {} tokens of context each)",
                            eng.model_name(),
                            eng.parallel(),
                            eng.context_size()
                        );
                        drop(st);
                        if let Err(e) = worker(eng, jobs_rx, waiting) {
                            log::error!("the model worker stopped: {e}");
                            let _ = fail_tx.send(e);
                        }
                    }
                    Err(e) => {
                        let _ = fail_tx.send(e);
                    }
                }
                drop(guard);
            })
            .map_err(|e| crate::Error::Io { path: "model thread".into(), source: e })?;
        let app = Router::new()
            .route("/ping", get(ping))
            .route("/health", get(ping))
            .route("/invocations", post(invocations))
            .route("/execution-parameters", get(execution_parameters))
            .route("/v1/chat/completions", post(chat))
            .route("/v1/models", get(models))
            .fallback(|req: Request| async move { deny(404, "not_found", format!("no route {} (see /v1/chat/completions, /v1/models, /ping)", req.uri().path())) })
            .method_not_allowed_fallback(|req: Request| async move {
                deny(405, "method_not_allowed", format!("{} does not take {}", req.uri().path(), req.method()))
            })
            .layer(DefaultBodyLimit::max(opts.max_body_bytes))
            .layer(axum::middleware::from_fn_with_state(state.clone(), guard))
            .with_state(state);
        let server = serve_connections(listener, app, opts.max_connections, HEADER_TIMEOUT.min(opts.read_timeout));
        tokio::select! {
            r = server => r.map_err(|e| crate::Error::Io { path: addr, source: e }),
            Some(e) = fail_rx.recv() => Err(e),
        }
    })
}
