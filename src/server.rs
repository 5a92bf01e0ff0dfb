//! The HTTP endpoint of the response format (native only): SageMaker's container contract
//! (`GET /ping`, `POST /invocations`) and OpenAI's (`POST /v1/chat/completions`,
//! `GET /v1/models`), with server-sent events for `"stream": true`.
//!
//! One worker thread owns the model and answers requests one at a time in arrival order (FIFO:
//! nobody starves); HTTP handlers only parse, queue and relay. A client that goes away stops its
//! generation at the next token.

use crate::api::{ApiError, ChatCompletion, ChatCompletionChunk, ChatRequest};
use crate::chat::ChatEngine;
use crate::error::Result;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
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

/// Answers jobs in arrival order until every sender is gone.
fn worker(mut eng: ChatEngine, jobs: std::sync::mpsc::Receiver<Job>) {
    for job in jobs {
        if job.tx.is_closed() {
            continue; // the client left while queued
        }
        let tx = job.tx;
        if !job.stream {
            let r = pollster::block_on(eng.complete_while(&job.req, || !tx.is_closed()));
            let _ = tx.send(match r {
                Ok(c) => Reply::Completion(Box::new(c)),
                Err(e) => Reply::Error(e),
            });
            continue;
        }
        pollster::block_on(async {
            match eng.start_stream(&job.req).await {
                Err(e) => {
                    let _ = tx.send(Reply::Error(e));
                }
                Ok(mut s) => {
                    // Checks the client between tokens, also while text is held back.
                    while let Some(c) = eng.next_chunk_while(&mut s, || !tx.is_closed()).await {
                        let sent = match c {
                            Ok(c) => tx.send(Reply::Chunk(Box::new(c))),
                            Err(e) => tx.send(Reply::Error(e)),
                        };
                        if sent.is_err() || tx.is_closed() {
                            log::info!("client went away: generation stopped");
                            return;
                        }
                    }
                    let _ = tx.send(Reply::Done);
                }
            }
        });
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
                    eprintln!("model {} ready ({} tokens of context)", eng.model_name(), eng.context_size());
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
