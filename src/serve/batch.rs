//! Batch Transform as the response format describes it: one request object per input line, one
//! `chat.completion` object per output line in `<input file name>.out`, in input order; with
//! `JoinSource = Input` each output line is the request with the response under
//! `"SageMakerOutput"`. A line that is not a valid request gets an error object in its place.
//! Each output line is written whole with one append, so a rerun after a crash resumes after the
//! last complete line; `<output>.state` records the input (length and sha256), the join mode and
//! the model the output is made from, and a rerun that differs in any of them is refused unless
//! told to start over. A GPU fault stops the run before anything more is written, so the rerun
//! answers the lines it hit again. Requests run several at a time (the engine's parallel slots),
//! their decode steps batched on the GPU.

use crate::chat::api::{ApiError, ChatRequest};
use crate::chat::{ChatEngine, Output, RequestId};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
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
    let mut name = input.file_name().unwrap_or(OsStr::new("input")).to_os_string();
    name.push(".out");
    match output_dir {
        Some(d) => d.join(name),
        None => input.parent().unwrap_or(Path::new(".")).join(name),
    }
}

/// `<output>.state`: what the output is made from.
pub fn state_path(output: &Path) -> PathBuf {
    let mut p = OsString::from(output.as_os_str());
    p.push(".state");
    PathBuf::from(p)
}

/// The contents of `<output>.state`. A rerun resumes only when all of it matches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct RunState {
    input_bytes: u64,
    input_sha256: String,
    join_source: String,
    model: String,
}

impl RunState {
    /// What differs from `now`, in words (empty when nothing does).
    fn differences(&self, now: &RunState) -> Vec<String> {
        let mut d = Vec::new();
        if (self.input_bytes, &self.input_sha256) != (now.input_bytes, &now.input_sha256) {
            d.push("a different input".to_string());
        }
        if self.join_source != now.join_source {
            d.push(format!("--join-source {}", self.join_source));
        }
        if self.model != now.model {
            d.push(format!("model {:?}", self.model));
        }
        d
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::Io { path: path.display().to_string(), source: e }
}

/// Writes `<output>.state` whole (a temporary file renamed over it).
fn write_state(path: &Path, state: &RunState) -> Result<()> {
    let mut tmp = OsString::from(path.as_os_str());
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, serde_json::to_string(state).unwrap() + "\n").map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// The lines an earlier run left in `out` that this run keeps: complete lines only (a trailing
/// partial line, from a crash mid-write, is cut off), at most `max` of them, and only when
/// `<out>.state` says they were made from the same input, join mode and model. Otherwise (and
/// with `overwrite`) the output is emptied and the state written anew, in that order, so a state
/// never vouches for an older output.
fn resume(out: &Path, want: &RunState, max: usize, overwrite: bool) -> Result<usize> {
    let state = state_path(out);
    let bytes = match std::fs::read(out) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io(out)(e)),
    };
    if !bytes.is_empty() && !overwrite {
        let have: Option<RunState> = std::fs::read(&state).ok().and_then(|b| serde_json::from_slice(&b).ok());
        let again = "rerun with --overwrite to start over";
        let Some(have) = have else {
            return Err(Error::Input(format!(
                "{} exists but no {} says which run wrote it; {again}",
                out.display(),
                state.display()
            )));
        };
        let differs = have.differences(want);
        if !differs.is_empty() {
            return Err(Error::Input(format!("{} is the output of another run ({}); {again}", out.display(), differs.join(", "))));
        }
        // Complete lines, and never more lines than the input has requests.
        let mut keep = 0;
        let mut n = 0;
        for (i, _) in bytes.iter().enumerate().filter(|&(_, &b)| b == b'\n') {
            if n == max {
                break;
            }
            keep = i + 1;
            n += 1;
        }
        if keep < bytes.len() {
            let f = std::fs::OpenOptions::new().write(true).open(out).map_err(io(out))?;
            f.set_len(keep as u64).map_err(io(out))?;
        }
        return Ok(n);
    }
    std::fs::File::create(out).map_err(io(out))?;
    write_state(&state, want)?;
    Ok(0)
}

/// Runs every request line of `input` through `eng`, as many at once as it has parallel slots
/// (their decode steps share each forward pass); output lines are written in input order as soon
/// as every earlier line is done. `progress(done, total)` after each written line. A request's
/// own fault (a malformed or invalid line, one whose prompt does not fit, one the model produced
/// no finite logit or no decodable text for) is its output line; a failed forward pass or a lost
/// device ends the run with an error before any line it touched is written. `overwrite` starts
/// over instead of resuming (which is refused for an output of a different input, join mode or
/// model).
pub fn run(
    eng: &mut ChatEngine,
    input: &Path,
    output_dir: Option<&Path>,
    join_input: bool,
    overwrite: bool,
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
    let want = RunState {
        input_bytes: text.len() as u64,
        input_sha256: format!("{:x}", Sha256::digest(text.as_bytes())),
        join_source: if join_input { "input" } else { "none" }.into(),
        model: eng.model_name().to_string(),
    };
    let resumed = resume(&out_path, &want, lines.len(), overwrite)?;
    let mut out = std::fs::OpenOptions::new().append(true).open(&out_path).map_err(io(&out_path))?;
    let mut s = BatchSummary { lines: lines.len(), resumed, output: out_path.clone(), ..Default::default() };
    let t0 = std::time::Instant::now();
    let (mut next_submit, mut next_write) = (resumed, resumed);
    let mut in_flight: HashMap<RequestId, usize> = HashMap::new();
    // Each finished line's response, serialized (a completion keeps its fields' order).
    let mut done: BTreeMap<usize, std::result::Result<String, ApiError>> = BTreeMap::new();
    // Ends the run: nothing more is written, and the rerun resumes after the written lines.
    let stop = |written: usize, why: &str| {
        let why = why.strip_prefix("GPU error: ").unwrap_or(why);
        Error::Gpu(format!("batch stopped with {written} of {} output lines written (a rerun resumes after them): {why}", lines.len()))
    };
    // Test hook (set by the operator's environment, never by a request): step N's forward
    // pass fails as a GPU error would.
    let fail_at: Option<u64> = std::env::var("TILDEOPEN_TEST_FAIL_AT_STEP").ok().and_then(|v| v.parse().ok());
    let mut steps = 0u64;
    while next_write < lines.len() {
        while next_submit < lines.len() && eng.has_free_slot() {
            let submitted = ChatRequest::from_json(lines[next_submit]).and_then(|req| eng.submit(&ChatRequest { stream: Some(false), ..req }, false));
            match submitted {
                Ok(id) => {
                    in_flight.insert(id, next_submit);
                }
                // Taking a request in copies cache rows on the GPU: a fault there is no
                // answer to the request either.
                Err(e) if e.status >= 500 || eng.check_device().is_err() => {
                    let why = eng.check_device().err().map_or(e.message, |d| d.to_string());
                    eng.abort_all();
                    return Err(stop(next_write, &format!("request {}: {why}", next_submit + 1)));
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
            let mut bytes = one_line(record).into_bytes();
            bytes.push(b'\n');
            out.write_all(&bytes).map_err(io(&out_path))?;
            out.flush().map_err(io(&out_path))?;
            next_write += 1;
            progress(next_write, lines.len());
        }
        if in_flight.is_empty() {
            continue; // the lines just taken were all errors (written above) or all are done
        }
        steps += 1;
        if fail_at == Some(steps) {
            eng.fail_next_pass();
        }
        let failed_before = eng.stats().failed_passes;
        // Requests are whole completions: their one output is their last.
        let events = pollster::block_on(eng.step());
        if let Err(e) = eng.check_device() {
            eng.abort_all();
            return Err(stop(next_write, &e.to_string()));
        }
        if eng.stats().failed_passes != failed_before {
            // Every request in flight failed with the pass: none of them is answered.
            let why = events.into_iter().find_map(|ev| match ev.output {
                Output::Error(e) => Some(e.message),
                _ => None,
            });
            eng.abort_all();
            return Err(stop(next_write, &why.unwrap_or_else(|| "a forward pass failed".into())));
        }
        for ev in events {
            let Some(line) = in_flight.remove(&ev.id) else { continue };
            let result = match ev.output {
                Output::Completion(c) => {
                    s.prompt_tokens += c.usage.prompt_tokens;
                    s.completion_tokens += c.usage.completion_tokens;
                    Ok(serde_json::to_string(&c).unwrap())
                }
                // This request's own fault (no finite logit, text that does not decode): the
                // pass went on for the others.
                Output::Error(e) => Err(e),
                Output::Chunk(_) => unreachable!("batch requests are submitted without streaming"),
            };
            done.insert(line, result);
        }
    }
    s.seconds = t0.elapsed().as_secs_f64();
    Ok(s)
}

/// An output record as one line for every reader: JSON Lines readers split at `\n` only, but
/// Python's `splitlines` (and some editors) also at `\r`, U+0085, U+2028 and U+2029. The record
/// is valid JSON (serialized here, or a joined input line that parsed), so a raw `\r` can only be
/// whitespace (it becomes a space) and the others only characters of a string (they become
/// their `\u` escapes, which mean the same).
fn one_line(record: String) -> String {
    if !record.contains(['\r', '\u{85}', '\u{2028}', '\u{2029}']) {
        return record;
    }
    record.replace('\r', " ").replace('\u{85}', "\\u0085").replace('\u{2028}', "\\u2028").replace('\u{2029}', "\\u2029")
}

/// The input line with the response added under "SageMakerOutput" (JoinSource=Input): the
/// request object's text as it was written (outer whitespace trimmed), with the response as its
/// last member. A line that is no JSON object gets the response alone; one that already has the
/// key loses that member (and a comma next to it), the rest of its text kept as it was.
fn joined(line: &str, response: &str) -> String {
    let line = line.trim();
    if !line.starts_with('{') || serde_json::from_str::<serde::de::IgnoredAny>(line).is_err() {
        return response.to_string();
    }
    let mut obj = line.to_string();
    loop {
        let m = members(&obj);
        let Some(k) = m.iter().position(|m| m.0 == "SageMakerOutput") else { break };
        let cut = match (k.checked_sub(1), m.get(k + 1)) {
            (_, Some(next)) => m[k].1..next.1,
            (Some(prev), None) => m[prev].2..m[k].2,
            (None, None) => m[k].1..m[k].2,
        };
        obj.replace_range(cut, "");
    }
    // A valid object ends with `}`; what comes before it is `{` or its members.
    let body = obj.strip_suffix('}').unwrap_or("{").trim_end();
    let sep = if body.ends_with('{') { "" } else { "," };
    format!("{body}{sep}\"SageMakerOutput\":{response}}}")
}

/// The members of a JSON object's text (valid JSON: checked by the caller), in order: each key
/// (unescaped) and where the member's text starts and ends (its key's opening quote; the end of
/// its value).
fn members(obj: &str) -> Vec<(String, usize, usize)> {
    let b = obj.as_bytes();
    let ws = |mut i: usize| {
        while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
            i += 1;
        }
        i
    };
    // The end of the string starting at `i` (its opening quote).
    let string = |mut i: usize| {
        i += 1;
        while b[i] != b'"' {
            i += if b[i] == b'\\' { 2 } else { 1 };
        }
        i + 1
    };
    let mut out = Vec::new();
    let mut i = ws(1);
    while i < b.len() && b[i] == b'"' {
        let start = i;
        let key_end = string(i);
        let key: String = serde_json::from_str(&obj[start..key_end]).unwrap_or_default();
        i = ws(ws(key_end) + 1); // past the ':'
        let mut depth = 0usize;
        loop {
            match b[i] {
                b'"' => {
                    i = string(i);
                    if depth == 0 {
                        break;
                    }
                    continue;
                }
                b'{' | b'[' => depth += 1,
                b'}' | b']' if depth == 0 => break,
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        i += 1;
                        break;
                    }
                }
                b',' | b' ' | b'\t' | b'\n' | b'\r' if depth == 0 => break,
                _ => {}
            }
            i += 1;
        }
        out.push((key, start, i));
        i = ws(i);
        if i < b.len() && b[i] == b',' {
            i = ws(i + 1);
        } else {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{joined, one_line, output_path};

    #[test]
    fn joined_keeps_the_request_as_written() {
        let r = r#"{"id":"x"}"#;
        assert_eq!(joined(r#" {"max_tokens": 1.0E2, "messages": []} "#, r), r#"{"max_tokens": 1.0E2, "messages": [],"SageMakerOutput":{"id":"x"}}"#);
        assert_eq!(joined("{ }", r), r#"{"SageMakerOutput":{"id":"x"}}"#);
        assert_eq!(joined("[1]", r), r);
        assert_eq!(joined("not json", r), r);
        assert_eq!(joined("{\"a\":1", r), r);
        // An own SageMakerOutput (however its key is spelt, as often as it is there) is dropped
        // with a comma next to it; the rest keeps its text, and the response is the last member.
        assert_eq!(joined(r#"{"SageMakerOutput":1,"a":2}"#, r), r#"{"a":2,"SageMakerOutput":{"id":"x"}}"#);
        assert_eq!(
            joined(r#"{"z": [1, {"b": "}]\"", "c": null}], "SageMakerOutput" : {"old": [true]} , "a" : 1.50e1,"y":"\u00e9"}"#, r),
            r#"{"z": [1, {"b": "}]\"", "c": null}], "a" : 1.50e1,"y":"\u00e9","SageMakerOutput":{"id":"x"}}"#
        );
        assert_eq!(joined(r#"{"\u0053ageMakerOutput":"old"}"#, r), r#"{"SageMakerOutput":{"id":"x"}}"#);
        assert_eq!(joined(r#"{"a":{},"SageMakerOutput":false}"#, r), r#"{"a":{},"SageMakerOutput":{"id":"x"}}"#);
        assert_eq!(joined(r#"{ "SageMakerOutput":1 , "SageMakerOutput":[2], "a":"b" , "SageMakerOutput":"c" }"#, r), r#"{ "a":"b","SageMakerOutput":{"id":"x"}}"#);
        assert_eq!(joined("{\"a\":\r1,\"SageMakerOutput\" :\t\"x\"\n}", r), "{\"a\":\r1,\"SageMakerOutput\":{\"id\":\"x\"}}");
    }

    #[test]
    fn one_line_escapes_line_separators() {
        let rec = joined("{\"a\":\r1,\"t\":\"x\u{2028}y\u{2029}z\u{85}\"}", r#"{"id":"x"}"#);
        let line = one_line(rec);
        assert_eq!(line, r#"{"a": 1,"t":"x\u2028y\u2029z\u0085","SageMakerOutput":{"id":"x"}}"#);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["t"], "x\u{2028}y\u{2029}z\u{85}");
        assert_eq!(one_line("{}".into()), "{}");
    }

    #[cfg(unix)]
    #[test]
    fn output_name_keeps_non_utf8_bytes() {
        use std::os::unix::ffi::OsStrExt;
        let input = std::path::Path::new(std::ffi::OsStr::from_bytes(b"/d/r\xe9qs.jsonl"));
        assert_eq!(output_path(input, None).as_os_str().as_bytes(), b"/d/r\xe9qs.jsonl.out");
    }
}
