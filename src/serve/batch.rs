//! Batch Transform as the response format describes it: one request object per input line, one
//! `chat.completion` object per output line in `<input file name>.out`, in input order; with
//! `JoinSource = Input` each output line is the request with the response under
//! `"SageMakerOutput"`. A line that is not a valid request gets an error object in its place.
//! Each output line is written whole with one append, so a rerun after a crash resumes after the
//! last complete line. Requests run several at a time (the engine's parallel slots), their
//! decode steps batched on the GPU.

use crate::chat::api::{ApiError, ChatRequest};
use crate::chat::{ChatEngine, Output, RequestId};
use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What a batch run did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchSummary {
    /// Request lines in the input (blank lines are not requests).
    pub lines: usize,
    /// Lines already in the output from an earlier run.
    pub resumed: usize,
    /// Lines answered with an error object.
    pub errors: usize,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub seconds: f64,
    pub output: PathBuf,
}

/// `<dir>/<input file name>.out`, `dir` defaulting to the input's folder.
pub fn output_path(input: &Path, output_dir: Option<&Path>) -> PathBuf {
    let name = format!("{}.out", input.file_name().and_then(|n| n.to_str()).unwrap_or("input"));
    match output_dir {
        Some(d) => d.join(name),
        None => input.parent().unwrap_or(Path::new(".")).join(name),
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::Io { path: path.display().to_string(), source: e }
}

/// Number of complete lines in an existing output; a trailing partial line (a crash mid-write)
/// is cut off.
fn complete_lines(out: &Path) -> Result<usize> {
    let Ok(bytes) = std::fs::read(out) else { return Ok(0) };
    let keep = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1);
    if keep < bytes.len() {
        let f = std::fs::OpenOptions::new().write(true).open(out).map_err(io(out))?;
        f.set_len(keep as u64).map_err(io(out))?;
    }
    Ok(bytes[..keep].iter().filter(|&&b| b == b'\n').count())
}

/// Runs every request line of `input` through `eng`, as many at once as it has parallel slots
/// (their decode steps share each forward pass); output lines are written in input order as soon
/// as every earlier line is done. `progress(done, total)` after each written line.
pub fn run(
    eng: &mut ChatEngine,
    input: &Path,
    output_dir: Option<&Path>,
    join_input: bool,
    mut progress: impl FnMut(usize, usize),
) -> Result<BatchSummary> {
    if eng.in_flight() > 0 {
        return Err(Error::Input("batch needs an engine with no requests in flight".into()));
    }
    let text = std::fs::read_to_string(input).map_err(io(input))?;
    // A UTF-8 byte-order mark (some editors write one) is not part of the first request.
    let lines: Vec<&str> = text.strip_prefix('\u{feff}').unwrap_or(&text).lines().filter(|l| !l.trim().is_empty()).collect();
    if let Some(d) = output_dir {
        std::fs::create_dir_all(d).map_err(io(d))?;
    }
    let out_path = output_path(input, output_dir);
    let resumed = complete_lines(&out_path)?.min(lines.len());
    let mut out = std::fs::OpenOptions::new().create(true).append(true).open(&out_path).map_err(io(&out_path))?;
    let mut s = BatchSummary { lines: lines.len(), resumed, output: out_path.clone(), ..Default::default() };
    let t0 = std::time::Instant::now();
    let (mut next_submit, mut next_write) = (resumed, resumed);
    let mut in_flight: HashMap<RequestId, usize> = HashMap::new();
    // Each finished line's response, serialized (a completion keeps its fields' order).
    let mut done: BTreeMap<usize, std::result::Result<String, ApiError>> = BTreeMap::new();
    while next_write < lines.len() {
        while next_submit < lines.len() && eng.has_free_slot() {
            let submitted = ChatRequest::from_json(lines[next_submit]).and_then(|req| eng.submit(&ChatRequest { stream: Some(false), ..req }, false));
            match submitted {
                Ok(id) => {
                    in_flight.insert(id, next_submit);
                }
                Err(e) => {
                    done.insert(next_submit, Err(e));
                }
            }
            next_submit += 1;
        }
        while let Some(result) = done.remove(&next_write) {
            let response = result.unwrap_or_else(|e| {
                s.errors += 1;
                e.body().to_string()
            });
            let record = if join_input { joined(lines[next_write], &response) } else { response };
            let mut bytes = record.into_bytes();
            bytes.push(b'\n');
            out.write_all(&bytes).map_err(io(&out_path))?;
            out.flush().map_err(io(&out_path))?;
            next_write += 1;
            progress(next_write, lines.len());
        }
        if in_flight.is_empty() {
            continue; // the lines just taken were all errors (written above) or all are done
        }
        // Requests are whole completions: their one output is their last.
        for ev in pollster::block_on(eng.step()) {
            let Some(line) = in_flight.remove(&ev.id) else { continue };
            let result = match ev.output {
                Output::Completion(c) => {
                    s.prompt_tokens += c.usage.prompt_tokens;
                    s.completion_tokens += c.usage.completion_tokens;
                    Ok(serde_json::to_string(&c).unwrap())
                }
                Output::Error(e) => Err(e),
                Output::Chunk(_) => unreachable!("batch requests are submitted without streaming"),
            };
            done.insert(line, result);
        }
    }
    s.seconds = t0.elapsed().as_secs_f64();
    Ok(s)
}

/// The input line with the response added under "SageMakerOutput" (JoinSource=Input): the
/// request object's text as it was written (outer whitespace trimmed), with the response as its
/// last member. A
/// line that is no JSON object gets the response alone; one that already has the key gets it
/// replaced (re-serialized, the one case where the request's own text changes).
fn joined(line: &str, response: &str) -> String {
    let Ok(serde_json::Value::Object(mut o)) = serde_json::from_str::<serde_json::Value>(line) else {
        return response.to_string();
    };
    if o.contains_key("SageMakerOutput") {
        let v = serde_json::from_str(response).unwrap_or(serde_json::Value::Null);
        o.insert("SageMakerOutput".into(), v);
        return serde_json::Value::Object(o).to_string();
    }
    // A valid object ends with `}` once trimmed; what comes before it is `{` or its members.
    let body = line.trim().strip_suffix('}').unwrap_or("{").trim_end();
    let sep = if body.ends_with('{') { "" } else { "," };
    format!("{body}{sep}\"SageMakerOutput\":{response}}}")
}

#[cfg(test)]
mod tests {
    use super::joined;

    #[test]
    fn joined_keeps_the_request_as_written() {
        let r = r#"{"id":"x"}"#;
        assert_eq!(joined(r#" {"max_tokens": 1.0E2, "messages": []} "#, r), r#"{"max_tokens": 1.0E2, "messages": [],"SageMakerOutput":{"id":"x"}}"#);
        assert_eq!(joined("{ }", r), r#"{"SageMakerOutput":{"id":"x"}}"#);
        assert_eq!(joined("[1]", r), r);
        assert_eq!(joined("not json", r), r);
        let again: serde_json::Value = serde_json::from_str(&joined(r#"{"SageMakerOutput":1,"a":2}"#, r)).unwrap();
        assert_eq!(again, serde_json::json!({"a": 2, "SageMakerOutput": {"id": "x"}}));
    }
}
