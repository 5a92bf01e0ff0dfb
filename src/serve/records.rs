//! SageMaker Batch Transform's MultiRecord payloads on `/invocations`: several JSON Lines
//! records in one body (`BatchStrategy: MultiRecord`, `SplitType: Line`), answered with one line
//! per record in the same order. Every record runs in the same forward passes as the others
//! (each is a job of the model thread, as separate requests are); the payload takes one queue
//! place per record. A record that is malformed, invalid or too long gets the response format's
//! error object on its own line and the others are answered: the response is 200 whenever the
//! payload itself was taken, so one bad record fails neither the payload nor the transform job
//! (Batch Transform retries or fails a whole payload on a non-2xx status).

use super::server::{error_response, overloaded, ready, server_error, take_places, AppState, Job, Reply};
use crate::chat::api::{ApiError, ChatRequest};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use tokio::sync::mpsc;

/// The records of a MultiRecord payload, or `None` for a body that is one request (answered as
/// `/v1/chat/completions` answers it, streaming included). A payload has at least two non-blank
/// lines and its first line is a whole JSON value on its own (a pretty-printed single object's
/// first line is not).
pub(super) fn split(body: &[u8]) -> Option<Vec<String>> {
    let text = std::str::from_utf8(body).ok()?;
    let lines: Vec<&str> = text.split('\n').map(|l| l.trim_end_matches('\r')).filter(|l| !l.trim().is_empty()).collect();
    if lines.len() < 2 || serde_json::from_str::<serde::de::IgnoredAny>(lines[0]).is_err() {
        return None;
    }
    Some(lines.into_iter().map(str::to_string).collect())
}

/// Answers every record of a payload, one line each, in order.
pub(super) async fn answer(st: Arc<AppState>, lines: Vec<String>) -> Response {
    let prompter = match ready(&st) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let n = lines.len();
    if n > st.max_queue {
        let e = ApiError::invalid(
            format!("a payload of {n} records: at most {} per payload (--max-queue); lower MaxPayloadInMB or split the input", st.max_queue),
            None,
        );
        return error_response(&ApiError { status: 413, ..e });
    }
    // The whole payload's places at once, or none.
    let Some(places) = take_places(&st, n) else {
        return overloaded(st.max_queue);
    };
    let Ok(permit) = st.preparing.clone().acquire_owned().await else {
        return error_response(&server_error(503, "unhealthy", "the server is shutting down".into()));
    };
    // Parsed, validated and tokenized on the blocking pool, as single requests are.
    let prepared = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        lines
            .iter()
            .map(|l| {
                // Records are answered whole: a `stream` asked for inside one is ignored.
                let req = ChatRequest::from_json(l)?;
                prompter.prepare(&ChatRequest { stream: Some(false), stream_options: None, ..req })
            })
            .collect::<Vec<_>>()
    })
    .await;
    let Ok(prepared) = prepared else {
        return error_response(&server_error(500, "internal_error", "preparing the records failed".into()));
    };
    // Every valid record goes to the model thread now, so they share its passes.
    let mut answers: Vec<std::result::Result<mpsc::UnboundedReceiver<Reply>, ApiError>> = Vec::with_capacity(n);
    for (p, place) in prepared.into_iter().zip(places) {
        match p {
            Err(e) => answers.push(Err(e)),
            Ok(prepared) => {
                let (tx, rx) = mpsc::unbounded_channel();
                if st.jobs.send(Job { prepared, stream: false, tx }).is_err() {
                    return error_response(&server_error(503, "unhealthy", "the model worker has stopped".into()));
                }
                place.handed_over();
                answers.push(Ok(rx));
            }
        }
    }
    let mut out = String::new();
    for a in answers {
        let line = match a {
            Err(e) => e.body().to_string(),
            Ok(mut rx) => match rx.recv().await {
                Some(Reply::Completion(c)) => serde_json::to_string(&*c).unwrap_or_default(),
                Some(Reply::Error(e)) => e.body().to_string(),
                _ => server_error(500, "internal_error", "the model worker dropped the record".into()).body().to_string(),
            },
        };
        out.push_str(&line);
        out.push('\n');
    }
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/jsonlines")], out).into_response()
}
