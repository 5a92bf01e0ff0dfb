//! The HTTP endpoint of the response format (native only): SageMaker's container contract
//! (`GET /ping`, `POST /invocations`) and OpenAI's (`POST /v1/chat/completions`,
//! `GET /v1/models`), with server-sent events for `"stream": true`.
//!
//! One worker thread owns the model and answers up to `parallel` requests at once, their decode
//! steps and prompt chunks sharing each forward pass (continuous batching); more wait in arrival
//! order (FIFO: nobody starves). HTTP handlers only parse, queue and relay. A client that goes
//! away stops its generation at the next token.

use crate::chat::api::{ApiError, ChatCompletion, ChatCompletionChunk, ChatRequest};
use crate::chat::{self, ChatEngine, Output, RequestId};
use crate::error::Result;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// Server settings.
pub struct ServeOptions {
    pub host: String,
    /// 0 picks a free port (the bound address is printed).
    pub port: u16,
    /// Largest request body in bytes.
    pub max_body_bytes: usize,
}

enum Reply {
    Error(ApiError),
    Completion(Box<ChatCompletion>),
    Chunk(Box<ChatCompletionChunk>),
    Done,
}

struct Job {
    req: ChatRequest,
    stream: bool,
    tx: mpsc::UnboundedSender<Reply>,
}

struct AppState {
    ready: AtomicBool,
    model: Mutex<String>,
    jobs: std::sync::mpsc::Sender<Job>,
}

fn error_response(e: &ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(e.body())).into_response()
}

fn unavailable() -> Response {
    let e = ApiError { status: 503, message: "the model is still loading".into(), kind: "server_error".into(), param: None, code: Some("loading".into()) };
    error_response(&e)
}

async fn ping(State(st): State<Arc<AppState>>) -> Response {
    if st.ready.load(Ordering::Acquire) {
        (StatusCode::OK, Json(serde_json::json!({"status": "ok"}))).into_response()
    } else {
        unavailable()
    }
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    let name = st.model.lock().unwrap().clone();
    Json(serde_json::json!({"object": "list", "data": [{"id": name, "object": "model", "created": crate::util::unix_time(), "owned_by": "tildeopen"}]}))
        .into_response()
}

async fn chat(State(st): State<Arc<AppState>>, body: std::result::Result<Bytes, BytesRejection>) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(rej) => {
            let status = rej.status().as_u16();
            return error_response(&ApiError { status, message: rej.body_text(), kind: "invalid_request_error".into(), param: None, code: None });
        }
    };
    if !st.ready.load(Ordering::Acquire) {
        return unavailable();
    }
    let Ok(text) = std::str::from_utf8(&body) else {
        return error_response(&ApiError::invalid("malformed request: the body is not UTF-8".into(), None));
    };
    let req = match ChatRequest::from_json(text) {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    let stream = req.stream.unwrap_or(false);
    let (tx, mut rx) = mpsc::unbounded_channel();
    if st.jobs.send(Job { req, stream, tx }).is_err() {
        return error_response(&ApiError { status: 500, message: "the model worker has stopped".into(), kind: "server_error".into(), param: None, code: None });
    }
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
        Some(Reply::Done) | None => {
            error_response(&ApiError { status: 500, message: "the model worker dropped the request".into(), kind: "server_error".into(), param: None, code: None })
        }
    }
}

/// Answers jobs until every sender is gone: up to the engine's `parallel` requests at once, each
/// forward pass carrying all of them (continuous batching); waiting jobs are taken in arrival
/// order as slots free up, so nobody starves. A client that went away is cancelled before the
/// next pass.
fn worker(mut eng: ChatEngine, jobs: std::sync::mpsc::Receiver<Job>) {
    let mut queue: VecDeque<Job> = VecDeque::new();
    let mut clients: HashMap<RequestId, (mpsc::UnboundedSender<Reply>, bool)> = HashMap::new();
    loop {
        if clients.is_empty() && queue.is_empty() {
            match jobs.recv() {
                Ok(j) => queue.push_back(j),
                Err(_) => return,
            }
        }
        while let Ok(j) = jobs.try_recv() {
            queue.push_back(j);
        }
        queue.retain(|j| !j.tx.is_closed());
        clients.retain(|&id, (tx, _)| {
            let gone = tx.is_closed();
            if gone {
                log::info!("client went away: generation stopped");
                eng.cancel(id);
            }
            !gone
        });
        while !queue.is_empty() && eng.has_free_slot() {
            let job = queue.pop_front().unwrap();
            match eng.submit(&job.req, job.stream) {
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
        let events = pollster::block_on(eng.step());
        deliver(&mut eng, &mut clients, events);
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
        let state = Arc::new(AppState { ready: AtomicBool::new(false), model: Mutex::new(String::new()), jobs: jobs_tx });
        let st = state.clone();
        let (fail_tx, mut fail_rx) = mpsc::unbounded_channel::<crate::Error>();
        std::thread::Builder::new()
            .name("tildeopen-model".into())
            .spawn(move || match load() {
                Ok(eng) => {
                    *st.model.lock().unwrap() = eng.model_name().to_string();
                    st.ready.store(true, Ordering::Release);
                    eprintln!(
                        "model {} ready ({} parallel requests, {} tokens of context each)",
                        eng.model_name(),
                        eng.parallel(),
                        eng.context_size()
                    );
                    drop(st);
                    worker(eng, jobs_rx);
                }
                Err(e) => {
                    let _ = fail_tx.send(e);
                }
            })
            .map_err(|e| crate::Error::Io { path: "model thread".into(), source: e })?;
        let app = Router::new()
            .route("/ping", get(ping))
            .route("/health", get(ping))
            .route("/invocations", post(chat))
            .route("/v1/chat/completions", post(chat))
            .route("/v1/models", get(models))
            .layer(DefaultBodyLimit::max(opts.max_body_bytes))
            .with_state(state);
        let server = axum::serve(listener, app).with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        });
        tokio::select! {
            r = server => r.map_err(|e| crate::Error::Io { path: addr, source: e }),
            Some(e) = fail_rx.recv() => Err(e),
        }
    })
}
