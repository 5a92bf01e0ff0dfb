//! Batch Transform as the response format describes it: one request object per input line, one
//! `chat.completion` object per output line in `<input file name>.out`, in input order; with
//! `JoinSource = Input` each output line is the request with the response under
//! `"SageMakerOutput"`. A line that is not a valid request gets an error object in its place.
//! Each output line is written whole with one append, so a rerun after a crash resumes after the
//! last complete line.

use crate::api::{ApiError, ChatRequest};
use crate::chat::ChatEngine;
use crate::error::{Error, Result};
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

/// Runs every request line of `input` through `eng`. `progress(done, total)` after each line.
pub fn run(
    eng: &mut ChatEngine,
    input: &Path,
    output_dir: Option<&Path>,
    join_input: bool,
    mut progress: impl FnMut(usize, usize),
) -> Result<BatchSummary> {
    let text = std::fs::read_to_string(input).map_err(io(input))?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if let Some(d) = output_dir {
        std::fs::create_dir_all(d).map_err(io(d))?;
    }
    let out_path = output_path(input, output_dir);
    let resumed = complete_lines(&out_path)?.min(lines.len());
    let mut out = std::fs::OpenOptions::new().create(true).append(true).open(&out_path).map_err(io(&out_path))?;
    let mut s = BatchSummary { lines: lines.len(), resumed, output: out_path.clone(), ..Default::default() };
    let t0 = std::time::Instant::now();
    for (i, line) in lines.iter().enumerate().skip(resumed) {
        let original: Option<serde_json::Value> = serde_json::from_str::<serde_json::Value>(line).ok().filter(|v| v.is_object());
        let result: std::result::Result<serde_json::Value, ApiError> = ChatRequest::from_json(line).and_then(|req| {
            let req = ChatRequest { stream: Some(false), ..req };
            let c = pollster::block_on(eng.complete(&req))?;
            s.prompt_tokens += c.usage.prompt_tokens;
            s.completion_tokens += c.usage.completion_tokens;
            Ok(serde_json::to_value(&c).unwrap())
        });
        let response = result.unwrap_or_else(|e| {
            s.errors += 1;
            e.body()
        });
        let record = match (join_input, original) {
            (true, Some(serde_json::Value::Object(mut o))) => {
                o.insert("SageMakerOutput".into(), response);
                serde_json::Value::Object(o)
            }
            _ => response,
        };
        let mut bytes = serde_json::to_vec(&record).unwrap();
        bytes.push(b'\n');
        out.write_all(&bytes).map_err(io(&out_path))?;
        out.flush().map_err(io(&out_path))?;
        progress(i + 1, lines.len());
    }
    s.seconds = t0.elapsed().as_secs_f64();
    Ok(s)
}
