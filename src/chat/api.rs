//! The product's API objects, shared by every front end (Rust, JS, CLI, server): OpenAI-style
//! requests in; `chat.completion` objects, `chat.completion.chunk` streams and JSON error bodies
//! out, as `response-format.md` defines them.

use crate::error::Error;
use crate::chat::tasks::Task;
use serde::{Deserialize, Serialize};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(deserialize_with = "content_text")]
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        Message { role: role.into(), content: content.into() }
    }
    pub fn system(c: impl Into<String>) -> Self {
        Self::new("system", c)
    }
    pub fn user(c: impl Into<String>) -> Self {
        Self::new("user", c)
    }
    pub fn assistant(c: impl Into<String>) -> Self {
        Self::new("assistant", c)
    }
}

/// OpenAI content: a string, or a list of `{"type": "text", "text": ...}` parts (joined).
fn content_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Content {
        Text(String),
        Parts(Vec<Part>),
        Null(()),
    }
    #[derive(Deserialize)]
    struct Part {
        #[serde(rename = "type")]
        kind: String,
        #[serde(default)]
        text: String,
    }
    match Content::deserialize(d)? {
        Content::Text(s) => Ok(s),
        Content::Null(()) => Ok(String::new()),
        Content::Parts(parts) => {
            if let Some(p) = parts.iter().find(|p| p.kind != "text") {
                return Err(serde::de::Error::custom(format!("content part type {:?} is not supported (text only)", p.kind)));
            }
            Ok(parts.into_iter().map(|p| p.text).collect::<Vec<_>>().join(""))
        }
    }
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// A chat request in OpenAI's shape. Unknown fields are ignored; invalid values are rejected by
/// [`ChatRequest::validate`]. Instead of `messages`, a request may carry a `task` (one of the
/// response format's five), which builds the messages and cleans the output.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<Message>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<Task>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, alias = "max_completion_tokens", skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Only 1 is supported: the response has exactly one choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u64>,
    /// An extension for benchmarks (as llama.cpp and vLLM take it): never end at an
    /// end-of-generation token, only at `max_tokens` or a stop string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
}

impl ChatRequest {
    /// A request with these messages and defaults for everything else.
    pub fn new(messages: Vec<Message>) -> Self {
        ChatRequest { messages, ..Default::default() }
    }

    /// A request for a task.
    pub fn task(task: Task) -> Self {
        ChatRequest { task: Some(task), ..Default::default() }
    }

    /// Parses a JSON request body; malformed JSON or wrong types are an [`ApiError`].
    pub fn from_json(body: &str) -> Result<Self, ApiError> {
        let malformed = |e: String| ApiError::invalid(format!("malformed request: {e}"), None);
        // Straight into the request type: no intermediate JSON tree of a large body.
        if !body.trim_start().starts_with('{') {
            return Err(malformed("the body must be a JSON object".into()));
        }
        let mut de = serde_json::Deserializer::from_str(body);
        let r: ChatRequest = serde_path_to_error::deserialize(&mut de).map_err(Self::malformed)?;
        de.end().map_err(|e| malformed(e.to_string()))?;
        r.validate()?;
        Ok(r)
    }

    /// A request that did not deserialize: the error names the top-level field it is about
    /// (`param`) and the path inside it (`messages[2].content`).
    pub fn malformed<E: std::fmt::Display>(e: serde_path_to_error::Error<E>) -> ApiError {
        let path = e.path().to_string();
        let field = path.split(['.', '[']).next().filter(|f| !f.is_empty() && *f != "?").map(str::to_string);
        let at = if field.is_some() { format!("`{path}`: ") } else { String::new() };
        ApiError::invalid(format!("malformed request: {at}{}", e.inner()), field.as_deref())
    }

    /// The messages the model sees: `messages`, or the task's.
    pub fn effective_messages(&self) -> Vec<Message> {
        match (&self.task, self.messages.is_empty()) {
            (Some(t), true) => t.messages(),
            // OpenAI's "developer" role is the system role for chat templates.
            _ => self
                .messages
                .iter()
                .map(|m| if m.role == "developer" { Message::system(m.content.clone()) } else { m.clone() })
                .collect(),
        }
    }

    /// The stop strings.
    pub fn stop_strings(&self) -> Vec<String> {
        match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        }
    }

    /// Rejects invalid values with a message naming the field.
    pub fn validate(&self) -> Result<(), ApiError> {
        let bad = |param: &str, msg: String| Err(ApiError::invalid(msg, Some(param)));
        match (&self.task, self.messages.is_empty()) {
            (None, true) => return bad("messages", "messages must contain at least one message".into()),
            (Some(_), false) => return bad("task", "give either messages or a task, not both".into()),
            (Some(t), true) => {
                if let Err(m) = t.validate() {
                    return bad("task", m);
                }
            }
            _ => {}
        }
        for (i, m) in self.messages.iter().enumerate() {
            if !matches!(m.role.as_str(), "system" | "user" | "assistant" | "developer") {
                return bad("messages", format!("messages[{i}].role {:?} is not system, user or assistant", m.role));
            }
        }
        let range = |name: &str, v: Option<f32>, lo: f32, hi: f32| -> Result<(), ApiError> {
            match v {
                Some(x) if !(x.is_finite() && x >= lo && x <= hi) => bad(name, format!("{name} must be between {lo} and {hi}, got {x}")),
                _ => Ok(()),
            }
        };
        range("temperature", self.temperature, 0.0, 2.0)?;
        range("top_p", self.top_p, 0.0, 1.0)?;
        range("min_p", self.min_p, 0.0, 1.0)?;
        range("presence_penalty", self.presence_penalty, -2.0, 2.0)?;
        range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?;
        range("repetition_penalty", self.repetition_penalty, 0.01, 10.0)?;
        // top_p 0 leaves nothing to draw from, except for greedy decoding, which ignores it
        // (OpenAI clients send it with temperature 0).
        if self.top_p == Some(0.0) && self.temperature != Some(0.0) {
            return bad("top_p", "top_p must be greater than 0 (unless temperature is 0)".into());
        }
        if let Some(k) = self.top_k {
            if k < 0 {
                return bad("top_k", format!("top_k must be 0 (off) or positive, got {k}"));
            }
        }
        if self.max_tokens == Some(0) {
            return bad("max_tokens", "max_tokens must be at least 1".into());
        }
        if let Some(n) = self.n {
            if n != 1 {
                return bad("n", format!("n must be 1 (one choice per response), got {n}"));
            }
        }
        let stops = self.stop_strings();
        if stops.iter().any(String::is_empty) {
            return bad("stop", "stop strings must not be empty".into());
        }
        if stops.len() > MAX_STOPS || stops.iter().any(|s| s.len() > MAX_STOP_BYTES) {
            return bad("stop", format!("at most {MAX_STOPS} stop strings of at most {MAX_STOP_BYTES} bytes each"));
        }
        if self.messages.len() > MAX_MESSAGES {
            return bad("messages", format!("at most {MAX_MESSAGES} messages ({} given)", self.messages.len()));
        }
        Ok(())
    }

    /// The sampling settings this request asks for.
    pub fn sampling(&self) -> crate::chat::sampling::SamplingParams {
        let d = crate::chat::sampling::SamplingParams::default();
        crate::chat::sampling::SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_p: self.top_p.unwrap_or(d.top_p),
            top_k: self.top_k.unwrap_or(0).max(0) as usize,
            min_p: self.min_p.unwrap_or(d.min_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            seed: self.seed,
            ignore_eos: self.ignore_eos.unwrap_or(false),
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// The model finished (end-of-turn token or a stop string).
    Stop,
    /// `max_tokens` or the context window was reached; the output is truncated.
    Length,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    pub index: u32,
    pub message: Message,
    pub finish_reason: FinishReason,
}

/// A `chat.completion` object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<Choice>,
    pub usage: Usage,
}

impl ChatCompletion {
    /// The answer text.
    pub fn content(&self) -> &str {
        &self.choices[0].message.content
    }
    pub fn finish_reason(&self) -> FinishReason {
        self.choices[0].finish_reason
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub finish_reason: Option<FinishReason>,
}

/// A `chat.completion.chunk` object: the first carries the role, the next ones content
/// deltas, the last one `finish_reason` (and `usage` when the request asked for it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// An API error: an HTTP status and an OpenAI-style JSON body, no choices.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// `invalid_request_error` or `server_error`.
    pub kind: String,
    pub param: Option<String>,
    /// e.g. `context_length_exceeded`.
    pub code: Option<String>,
}

/// The most stop strings a request may give, and their longest length in bytes.
pub const MAX_STOPS: usize = 16;
pub const MAX_STOP_BYTES: usize = 256;
/// The most messages in one request.
pub const MAX_MESSAGES: usize = 4096;

impl ApiError {
    pub fn invalid(message: String, param: Option<&str>) -> Self {
        ApiError { status: 400, message, kind: "invalid_request_error".into(), param: param.map(str::to_string), code: None }
    }

    pub fn context_length(prompt_tokens: usize, ctx: usize) -> Self {
        Self::too_long(format!("are {prompt_tokens} tokens"), ctx)
    }

    /// A prompt known to be over the context without tokenizing it whole.
    pub fn context_length_at_least(prompt_tokens: usize, ctx: usize) -> Self {
        Self::too_long(format!("are at least {prompt_tokens} tokens"), ctx)
    }

    fn too_long(what: String, ctx: usize) -> Self {
        ApiError {
            status: 400,
            message: format!(
                "the request's messages {what}, which does not fit in the context window of {ctx} tokens (room is needed for at least one generated token)"
            ),
            kind: "invalid_request_error".into(),
            param: Some("messages".into()),
            code: Some("context_length_exceeded".into()),
        }
    }

    /// The JSON body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiError {}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        match e {
            Error::Input(m) => ApiError::invalid(m, None),
            other => ApiError { status: 500, message: other.to_string(), kind: "server_error".into(), param: None, code: None },
        }
    }
}
