//! Chat completions on a model: template, tokens, prefix-cached KV, sampling, stopping, and the
//! response objects, whole ([`ChatEngine::complete`]) or streamed ([`ChatEngine::stream`]).
//!
//! Several requests can be in flight at once (continuous batching): [`ChatEngine::submit`] takes
//! a request into a free sequence slot, and every [`ChatEngine::step`] runs one forward pass
//! that carries the next token of every decoding request plus prompt chunks of requests still
//! prefilling, then hands out the chunks and completions that became ready.

use crate::chat::api::{ApiError, ChatCompletion, ChatCompletionChunk, ChatRequest, Choice, ChunkChoice, Delta, FinishReason, Message, Usage};
use crate::gpu::session::{default_ctx_size, KvType, Piece, Session, SessionOptions};
use crate::error::Result;
use crate::model::Model;
use crate::chat::sampling::Sampler;
use crate::chat::tasks::OutputFilter;
use crate::chat::prompt::{Prepared, Prompter};
use crate::text::template::ChatTemplate;
use crate::text::tokenizer::{StreamDecoder, Tokenizer};
use futures_util::Stream;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

mod step;
mod stream;
use step::{cancelled, chunk};

/// The largest context a request may use (the response format's limit).
pub const MAX_CONTEXT: usize = 65_536;

/// Settings of a [`ChatEngine`].
#[derive(Debug, Clone)]
pub struct ChatOptions {
    /// Context window; default: the model's own, capped at [`MAX_CONTEXT`] and at what one
    /// KV-cache buffer can hold.
    pub ctx_size: Option<usize>,
    /// The KV cache's type: f16 (default), f32, q8_0 or q4_0.
    pub kv: KvType,
    /// Most tokens in one forward pass (prompt chunks and decode steps together).
    pub max_batch: usize,
    /// Requests answered at once, each with its own `ctx_size` tokens of KV cache.
    pub parallel: usize,
    /// The `model` field of responses.
    pub model_name: String,
}

impl Default for ChatOptions {
    fn default() -> Self {
        ChatOptions { ctx_size: None, kv: KvType::F16, max_batch: 256, parallel: 1, model_name: "tildeopen".into() }
    }
}

/// Counters since the engine was made (prompt tokens by where their keys and values came from).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Forward passes run.
    pub passes: u64,
    /// Prompt tokens computed by the model.
    pub prefilled: u64,
    /// Prompt tokens already in the slot's own cache.
    pub reused: u64,
    /// Prompt tokens copied from another slot's cache.
    pub copied: u64,
    /// Tokens generated.
    pub generated: u64,
    /// Forward passes that failed (a GPU error): every request in flight failed with the error.
    pub failed_passes: u64,
}

/// A request in flight (see [`ChatEngine::submit`]).
pub type RequestId = u64;

/// What a request produced: a stream's chunk, a whole completion, or its error.
#[derive(Debug, Clone)]
pub enum Output {
    Chunk(ChatCompletionChunk),
    Completion(ChatCompletion),
    Error(ApiError),
}

/// One output of one request; `last` marks the request's final output (it has left the engine).
#[derive(Debug, Clone)]
pub struct Event {
    pub id: RequestId,
    pub output: Output,
    pub last: bool,
}

/// A span of the KV cache that one request at a time uses; what it holds stays for the next
/// request with the same prefix (a chat's earlier turns).
struct Slot {
    busy: bool,
    /// When it was last given out (least recently used slots are reused first).
    used: u64,
}

/// A request being answered.
struct Active {
    id: RequestId,
    slot: usize,
    g: Generation,
    stream: bool,
    prompt: Vec<u32>,
    /// Prompt tokens in the slot's cache; `prompt[fed..]` is still to be prefilled.
    fed: usize,
    /// Waits for request `.0` (in slot `.1`) to prefill `.2` tokens this prompt starts with, to
    /// copy them instead of computing them a second time (requests that arrive together).
    wait_for: Option<(RequestId, usize, usize)>,
    /// The answer so far (whole completions only).
    content: String,
}

/// A model ready to answer chat requests: tokenizer, template and one session with a KV-cache
/// slot per parallel request.
pub struct ChatEngine {
    prompter: Prompter,
    session: Session,
    name: String,
    stop_ids: Vec<u32>,
    slots: Vec<Slot>,
    /// In arrival order.
    active: Vec<Active>,
    /// Outputs not handed out yet.
    outbox: VecDeque<Event>,
    next_id: RequestId,
    clock: u64,
    /// Requests whose owner (a dropped [`ChatStream`] or completion future) went away.
    abandoned: Arc<Mutex<Vec<RequestId>>>,
    stats: Stats,
    /// Test hook: the next pass fails as a GPU error would.
    fail_next_pass: bool,
}

/// Holds back text that may be the start of a stop string.
struct StopFilter {
    stops: Vec<String>,
    held: String,
}

impl StopFilter {
    /// Returns (text that is final, whether a stop string ended the output).
    fn push(&mut self, s: &str) -> (String, bool) {
        self.held.push_str(s);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.held), false);
        }
        if let Some(pos) = self.stops.iter().filter_map(|st| self.held.find(st.as_str())).min() {
            let out = self.held[..pos].to_string();
            self.held.clear();
            return (out, true);
        }
        // Longest suffix of `held` that begins some stop string.
        let mut keep = 0;
        for (i, _) in self.held.char_indices() {
            let suffix = &self.held[i..];
            if self.stops.iter().any(|st| st.starts_with(suffix)) {
                keep = self.held.len() - i;
                break;
            }
        }
        let out = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        (out, false)
    }
    fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// One request's generation state.
struct Generation {
    id: String,
    created: u64,
    model: String,
    prompt_tokens: usize,
    max_new: usize,
    produced: usize,
    sampler: Sampler,
    decoder: StreamDecoder,
    stop: StopFilter,
    filter: OutputFilter,
    /// A sampled token not yet in the KV cache.
    pending: Option<u32>,
    finished: Option<FinishReason>,
    include_usage: bool,
}
impl ChatEngine {
    /// A chat engine on `model` (a cheap handle is kept) with its tokenizer.
    pub fn new(model: &Model, tokenizer: Tokenizer, opts: ChatOptions) -> Result<Self> {
        let parallel = opts.parallel.max(1);
        // An asked-for size outside the range is an error (it was clamped without a word).
        if let Some(n) = opts.ctx_size.filter(|n| !(2..=MAX_CONTEXT).contains(n)) {
            return Err(crate::error::Error::Input(format!("context size {n}: a chat context is 2 to {MAX_CONTEXT} tokens")));
        }
        let ctx = opts
            .ctx_size
            .unwrap_or_else(|| default_ctx_size(&model.cfg, model.gpu.max_binding, opts.kv, parallel, MAX_CONTEXT))
            .clamp(2, MAX_CONTEXT);
        let session = Session::new(
            model,
            SessionOptions { ctx_size: ctx, kv: opts.kv, max_batch: opts.max_batch, sequences: parallel },
        )?;
        let template = ChatTemplate::for_tokenizer(&tokenizer)?;
        let vocab = model.cfg.vocab_size;
        // The tokenizer's own ids against the model's vocabulary: a bos past it would fail every
        // prompt, an end-of-generation id past it could never be generated.
        if let Some(b) = tokenizer.bos.filter(|&b| b as usize >= vocab) {
            return Err(crate::error::Error::Unsupported(format!("the tokenizer's bos id {b} is outside the model's vocabulary of {vocab}")));
        }
        let mut stop_ids = tokenizer.eog.clone();
        stop_ids.extend(&template.stop_ids);
        if let Some(s) = stop_ids.iter().find(|&&s| s as usize >= vocab) {
            log::warn!("end-of-generation id {s} is outside the model's vocabulary of {vocab}: ignored");
        }
        stop_ids.retain(|&s| (s as usize) < vocab);
        if stop_ids.is_empty() {
            log::warn!("the tokenizer names no end-of-generation token: answers end only at max_tokens or stop strings");
        }
        let slots = (0..parallel).map(|_| Slot { busy: false, used: 0 }).collect();
        Ok(ChatEngine {
            prompter: Prompter::new(tokenizer, template, ctx),
            session,
            name: opts.model_name,
            stop_ids,
            slots,
            active: Vec::new(),
            outbox: VecDeque::new(),
            next_id: 1,
            clock: 0,
            abandoned: Arc::default(),
            stats: Stats::default(),
            fail_next_pass: false,
        })
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.prompter.tokenizer
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.prompter.template
    }

    /// What turns requests into prompts for this engine (cheap to clone, usable on any thread).
    pub fn prompter(&self) -> Prompter {
        self.prompter.clone()
    }

    /// The context window in tokens (of each parallel request).
    pub fn context_size(&self) -> usize {
        self.session.ctx_size()
    }

    /// An error once the GPU is lost or has reported an error: the engine cannot answer again
    /// (load the model anew, or restart the process).
    pub fn check_device(&self) -> Result<()> {
        self.session.check_device()
    }

    /// Test hook: the next [`ChatEngine::step`] with requests in flight fails as a GPU error
    /// would (every request in flight fails, the caches are forgotten).
    #[doc(hidden)]
    pub fn fail_next_pass(&mut self) {
        self.fail_next_pass = true;
    }

    /// Drops every request in flight and forgets every cache (after a fault: nothing the engine
    /// held can be trusted). Returns the ids that were dropped.
    pub fn abort_all(&mut self) -> Vec<RequestId> {
        let ids: Vec<RequestId> = self.active.drain(..).map(|a| a.id).collect();
        self.outbox.clear();
        for s in &mut self.slots {
            s.busy = false;
        }
        self.session.reset();
        ids
    }

    /// The KV cache's type.
    pub fn kv_type(&self) -> KvType {
        self.session.kv_type()
    }

    /// How many requests can be answered at once.
    pub fn parallel(&self) -> usize {
        self.slots.len()
    }

    /// What the engine has done so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.active.len()
    }

    /// Whether [`ChatEngine::submit`] would find a free slot.
    pub fn has_free_slot(&mut self) -> bool {
        self.reap();
        self.slots.iter().any(|s| !s.busy)
    }

    /// The model name responses carry.
    pub fn model_name(&self) -> &str {
        &self.name
    }

    /// The prompt text a request renders to.
    pub fn prompt_text(&self, req: &ChatRequest) -> std::result::Result<String, ApiError> {
        self.prompter.render(req)
    }

    /// The prompt's token ids (bos added when the tokenizer wants one and the template did not).
    pub fn prompt_tokens(&self, req: &ChatRequest) -> std::result::Result<Vec<u32>, ApiError> {
        let (text, guarded) = self.prompter.render_guarded(req)?;
        self.prompter.tokenize(&text, &guarded)
    }

    /// Takes a request in: [`Prompter::prepare`] then [`ChatEngine::admit`].
    pub fn submit(&mut self, req: &ChatRequest, stream: bool) -> std::result::Result<RequestId, ApiError> {
        let prepared = self.prompter.prepare(req)?;
        self.admit(prepared, stream)
    }

    /// Gives a prepared request a free slot (the one whose cache shares the longest prefix with
    /// the prompt, else the least recently used; a longer prefix held by another slot is copied
    /// into it). No GPU work happens until [`ChatEngine::step`]. A streamed request's first
    /// chunk (the role) is ready at once. Errors: 503 `busy` when every slot is taken, or a
    /// request prepared for a smaller context than this engine's.
    pub fn admit(&mut self, p: Prepared, stream: bool) -> std::result::Result<RequestId, ApiError> {
        self.reap();
        let ctx = self.context_size();
        let Prepared { prompt, max_tokens, sampling, stops, task, include_usage } = p;
        if prompt.len() >= ctx {
            return Err(ApiError::context_length(prompt.len(), ctx));
        }
        // A tokenizer with more tokens than the model (added tokens in tokenizer.json) could
        // otherwise put an id into a pass that fails it for every request in flight.
        if let Some(bad) = self.session.out_of_vocab(&prompt) {
            let vocab = self.session.vocab_size();
            return Err(ApiError::invalid(format!("the prompt holds token id {bad}, outside the model's vocabulary of {vocab} (tokenizer and model do not match)"), Some("messages")));
        }
        let common_with = |i: usize| common_prefix(self.session.tokens_of(i), &prompt);
        let Some(slot) = (0..self.slots.len())
            .filter(|&i| !self.slots[i].busy)
            .max_by_key(|&i| (common_with(i), std::cmp::Reverse(self.slots[i].used)))
        else {
            return Err(ApiError {
                status: 503,
                message: format!("all {} parallel slots are busy; retry later", self.slots.len()),
                kind: "server_error".into(),
                param: None,
                code: Some("busy".into()),
            });
        };
        // The last prompt token is always fed (again) for its logits.
        let limit = prompt.len() - 1;
        let mut common = common_with(slot).min(limit);
        // A longer shared prefix in another slot (busy or not: its first rows no longer change)
        // is copied over on the GPU instead of recomputed: a common system prompt or task
        // instruction is prefilled once for all slots.
        let (donor, shared) = (0..self.slots.len()).map(|i| (i, common_with(i).min(limit))).max_by_key(|d| d.1).unwrap();
        if shared > common {
            self.session.copy_prefix(donor, slot, shared)?;
            self.stats.copied += shared as u64;
            common = shared;
        } else {
            self.stats.reused += common as u64;
        }
        self.clock += 1;
        let s = &mut self.slots[slot];
        s.busy = true;
        s.used = self.clock;
        self.session.truncate_seq(slot, common);
        let room = ctx - prompt.len();
        let max_new = max_tokens.map_or(room, |m| (m.min(usize::MAX as u64) as usize).min(room));
        let g = Generation {
            id: crate::util::completion_id(),
            created: crate::util::unix_time(),
            model: self.name.clone(),
            prompt_tokens: prompt.len(),
            max_new,
            produced: 0,
            sampler: Sampler::new(sampling, &prompt, &self.stop_ids),
            decoder: StreamDecoder::new(),
            stop: StopFilter { stops, held: String::new() },
            filter: OutputFilter::new(task.as_ref()),
            pending: None,
            finished: None,
            include_usage,
        };
        let id = self.next_id;
        self.next_id += 1;
        if stream {
            let role = Delta { role: Some("assistant".into()), content: Some(String::new()) };
            self.outbox.push_back(Event { id, output: Output::Chunk(chunk(&g, role, None)), last: false });
        }
        // A request still prefilling may be about to hold a longer shared prefix: wait for it.
        let wait_for = self
            .active
            .iter()
            .map(|a| (a.id, a.slot, common_prefix(&a.prompt, &prompt).min(limit)))
            .filter(|&(_, d, n)| n > common && self.session.position_of(d) < n)
            .max_by_key(|d| d.2);
        self.active.push(Active { id, slot, g, stream, prompt, fed: common, wait_for, content: String::new() });
        Ok(id)
    }

    /// Stops answering a request (a client that went away); its slot is free again. Outputs
    /// already made for it are dropped.
    pub fn cancel(&mut self, id: RequestId) {
        self.release(id);
        self.outbox.retain(|e| e.id != id);
    }

    /// Takes a request out of the engine and frees its slot (what the slot holds stays).
    fn release(&mut self, id: RequestId) {
        if let Some(i) = self.active.iter().position(|a| a.id == id) {
            let a = self.active.remove(i);
            self.slots[a.slot].busy = false;
        }
    }

    /// Cancels the requests whose owners were dropped.
    fn reap(&mut self) {
        let gone = std::mem::take(&mut *self.abandoned.lock().unwrap());
        for id in gone {
            self.cancel(id);
        }
    }

    fn guard(&self, id: RequestId) -> Owner {
        Owner { id, abandoned: self.abandoned.clone(), done: false }
    }

    /// The outputs ready without a forward pass (a streamed request's role chunk).
    pub fn ready(&mut self) -> Vec<Event> {
        self.outbox.drain(..).collect()
    }

}

/// How many tokens `a` and `b` share at their start.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Marks its request abandoned when dropped before the request ended.
struct Owner {
    id: RequestId,
    abandoned: Arc<Mutex<Vec<RequestId>>>,
    done: bool,
}

impl Drop for Owner {
    fn drop(&mut self) {
        if !self.done {
            self.abandoned.lock().unwrap().push(self.id);
        }
    }
}

/// A streamed answer in progress (see [`ChatEngine::start_stream`]).
pub struct ChatStream {
    owner: Owner,
}

#[cfg(test)]
mod tests {
    use super::StopFilter;

    #[test]
    fn stop_strings_hold_back_partial_matches() {
        let mut f = StopFilter { stops: vec!["\n\nUser:".into(), "END".into()], held: String::new() };
        let mut out = String::new();
        for piece in ["Hello", " wor", "ld\n", "\nUs", "er: more"] {
            let (s, hit) = f.push(piece);
            out += &s;
            if hit {
                break;
            }
        }
        assert_eq!(out, "Hello world");
        let mut f = StopFilter { stops: vec!["END".into()], held: String::new() };
        assert_eq!(f.push("aEN"), ("a".into(), false));
        assert_eq!(f.push("x"), ("ENx".into(), false));
        assert_eq!(f.push("E"), (String::new(), false));
        assert_eq!(f.finish(), "E");
    }
}
