//! Chat completions on a model: template, tokens, prefix-cached KV, sampling, stopping, and the
//! response objects, whole ([`ChatEngine::complete`]) or streamed ([`ChatEngine::stream`]).
//!
//! Several requests can be in flight at once (continuous batching): [`ChatEngine::submit`] takes
//! a request into a free sequence slot, and every [`ChatEngine::step`] runs one forward pass
//! that carries the next token of every decoding request plus prompt chunks of requests still
//! prefilling, then hands out the chunks and completions that became ready.

use crate::chat::api::{ApiError, ChatCompletion, ChatCompletionChunk, ChatRequest, Choice, ChunkChoice, Delta, FinishReason, Message, Usage};
use crate::gpu::session::{default_ctx_size, Piece, Session, SessionOptions};
use crate::error::Result;
use crate::model::Model;
use crate::chat::sampling::Sampler;
use crate::chat::tasks::OutputFilter;
use crate::text::template::{content_marker, place_contents, ChatTemplate};
use crate::text::tokenizer::{StreamDecoder, Tokenizer};
use futures_util::Stream;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// The largest context a request may use (the response format's limit).
pub const MAX_CONTEXT: usize = 65_536;

/// Settings of a [`ChatEngine`].
#[derive(Debug, Clone)]
pub struct ChatOptions {
    /// Context window; default: the model's own, capped at [`MAX_CONTEXT`] and at what one
    /// KV-cache buffer can hold.
    pub ctx_size: Option<usize>,
    /// f16 KV cache (default) or f32.
    pub kv_f16: bool,
    /// Most tokens in one forward pass (prompt chunks and decode steps together).
    pub max_batch: usize,
    /// Requests answered at once, each with its own `ctx_size` tokens of KV cache.
    pub parallel: usize,
    /// The `model` field of responses.
    pub model_name: String,
}

impl Default for ChatOptions {
    fn default() -> Self {
        ChatOptions { ctx_size: None, kv_f16: true, max_batch: 256, parallel: 1, model_name: "tildeopen".into() }
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

/// Turns requests into prompts, in one direction: validate (with a cheap size bound) ->
/// render the template -> tokenize. Holds no engine state, so it can run on any thread while
/// the engine keeps generating.
#[derive(Clone)]
pub struct Prompter {
    tokenizer: Arc<Tokenizer>,
    template: Arc<ChatTemplate>,
    /// The engine's context window.
    ctx: usize,
    max_piece_bytes: usize,
}

/// A request ready for a slot: its prompt's token ids and what generation needs from it.
pub struct Prepared {
    pub prompt: Vec<u32>,
    max_tokens: Option<u64>,
    sampling: crate::chat::sampling::SamplingParams,
    stops: Vec<String>,
    task: Option<crate::chat::tasks::Task>,
    include_usage: bool,
}

impl Prompter {
    /// A prompter for `tokenizer` with its chat template, for a context of `ctx` tokens.
    pub fn new(tokenizer: Tokenizer, template: ChatTemplate, ctx: usize) -> Self {
        let max_piece_bytes = tokenizer.max_piece_bytes();
        Prompter { tokenizer: Arc::new(tokenizer), template: Arc::new(template), ctx, max_piece_bytes }
    }

    /// Validates the request, renders and tokenizes its prompt, and checks it fits the context
    /// window. A prompt whose letters, digits and ASCII punctuation alone are more tokens than
    /// the context is rejected before it is tokenized.
    pub fn prepare(&self, req: &ChatRequest) -> std::result::Result<Prepared, ApiError> {
        req.validate()?;
        let (text, guarded) = self.render_guarded(req)?;
        // Letters, digits and ASCII punctuation survive every normalizer (spaces may collapse,
        // accents and control characters may go), and each token spells at most
        // `max_piece_bytes` of them.
        let at_least = text.chars().filter(|c| c.is_ascii_graphic() || c.is_alphanumeric()).count() / self.max_piece_bytes;
        if at_least >= self.ctx {
            return Err(ApiError::context_length_at_least(at_least, self.ctx));
        }
        // Beyond four times what the context could spell even in its longest pieces, the rest
        // can only be whitespace that a normalizer collapses: refused before the tokenizer
        // spends memory on it.
        let cap = 4 * self.ctx * self.max_piece_bytes;
        if text.len() > cap {
            let mut e = ApiError::context_length(0, self.ctx);
            e.message = format!(
                "the request's messages are {} bytes, more than a context window of {} tokens takes (at most {cap} bytes)",
                text.len(),
                self.ctx
            );
            return Err(e);
        }
        let prompt = self.tokenize(&text, &guarded)?;
        if prompt.is_empty() {
            return Err(ApiError::invalid("the request renders to an empty prompt".into(), Some("messages")));
        }
        if prompt.len() >= self.ctx {
            return Err(ApiError::context_length(prompt.len(), self.ctx));
        }
        Ok(Prepared {
            prompt,
            max_tokens: req.max_tokens,
            sampling: req.sampling(),
            stops: req.stop_strings(),
            task: req.task.clone(),
            include_usage: req.stream_options.as_ref().is_some_and(|o| o.include_usage),
        })
    }

    /// The prompt text a request renders to.
    pub fn render(&self, req: &ChatRequest) -> std::result::Result<String, ApiError> {
        Ok(self.render_guarded(req)?.0)
    }

    /// The prompt text a request renders to, and the byte ranges its messages' contents take
    /// in it: marker text there (`<|user|>`, `</s>`, also split across two contents) stays text
    /// when the prompt is tokenized, so a message (a web page being translated) cannot open or
    /// close turns. The ranges come from a second render with a marker per content. Where the
    /// template changes contents beyond recognition (other than `| trim`), no ranges are
    /// known: contents that hold marker text then lose it instead.
    pub fn render_guarded(&self, req: &ChatRequest) -> std::result::Result<(String, Vec<Range<usize>>), ApiError> {
        let messages: Vec<Message> = req.effective_messages();
        let text = self.template.render(&messages, true)?;
        let marked: Vec<Message> = messages.iter().enumerate().map(|(i, m)| Message::new(&m.role, content_marker(i))).collect();
        let contents: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
        if let Some(ranges) = self.template.render(&marked, true).ok().and_then(|m| place_contents(&text, &m, &contents)) {
            return Ok((text, ranges));
        }
        if !messages.iter().any(|m| self.tokenizer.holds_special(&m.content)) {
            return Ok((text, Vec::new()));
        }
        let cleaned: Vec<Message> =
            messages.iter().map(|m| Message::new(&m.role, self.tokenizer.without_specials(&m.content))).collect();
        Ok((self.template.render(&cleaned, true)?, Vec::new()))
    }

    /// The token ids of a rendered prompt (bos added when the tokenizer wants one and the
    /// template did not); special-token text inside `guarded` stays text.
    pub fn tokenize(&self, text: &str, guarded: &[Range<usize>]) -> std::result::Result<Vec<u32>, ApiError> {
        let mut ids = self.tokenizer.encode_chat_guarded(text, guarded)?;
        if let (true, Some(bos)) = (self.tokenizer.add_bos, self.tokenizer.bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }
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
            .unwrap_or_else(|| default_ctx_size(&model.cfg, model.gpu.max_binding, opts.kv_f16, parallel, MAX_CONTEXT))
            .clamp(2, MAX_CONTEXT);
        let session = Session::new(
            model,
            SessionOptions { ctx_size: ctx, kv_f16: opts.kv_f16, max_batch: opts.max_batch, sequences: parallel },
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

    /// One forward pass over every request in flight: the pending token of each decoding
    /// request, then prompt chunks of prefilling ones in arrival order, up to the session's
    /// batch. Returns the outputs that became ready (also those from `submit`); empty when
    /// nothing is in flight.
    pub async fn step(&mut self) -> Vec<Event> {
        self.reap();
        if !self.active.is_empty() {
            let passed = if std::mem::take(&mut self.fail_next_pass) {
                Err(crate::error::Error::Gpu("injected pass failure (test hook)".into()))
            } else {
                self.pass().await
            };
            if let Err(e) = passed {
                // A GPU fault: every request in flight fails and the caches are forgotten.
                self.stats.failed_passes += 1;
                let err: ApiError = e.into();
                for a in std::mem::take(&mut self.active) {
                    self.outbox.push_back(Event { id: a.id, output: Output::Error(err.clone()), last: true });
                }
                for s in &mut self.slots {
                    s.busy = false;
                }
                self.session.reset();
            }
        }
        self.outbox.drain(..).collect()
    }

    /// Ends the waits whose donor has prefilled what was waited for (or stopped prefilling):
    /// the shared prefix is copied over.
    fn resolve_waits(&mut self) -> Result<()> {
        for i in 0..self.active.len() {
            let Some((donor_id, donor, n)) = self.active[i].wait_for else { continue };
            let donor_feeding = self.active.iter().any(|a| a.id == donor_id && a.fed < a.prompt.len());
            let a = &self.active[i];
            let have = common_prefix(self.session.tokens_of(donor), &a.prompt).min(a.prompt.len() - 1);
            if have < n && donor_feeding {
                continue;
            }
            let (own, slot) = (a.fed, a.slot);
            if have > own {
                // The slot already holds the first `own` tokens (its own or copied at submit).
                self.session.copy_rows(donor, slot, own, have)?;
                self.active[i].fed = have;
                self.stats.copied += (have - own) as u64;
            }
            self.active[i].wait_for = None;
        }
        Ok(())
    }

    async fn pass(&mut self) -> Result<()> {
        self.resolve_waits()?;
        let mut budget = self.session.max_batch();
        let mut outs_left = self.session.max_outputs();
        // (active index, tokens, wants logits)
        let mut plan: Vec<(usize, Vec<u32>, bool)> = Vec::new();
        for (i, a) in self.active.iter().enumerate() {
            if let Some(t) = a.g.pending {
                if budget == 0 || outs_left == 0 {
                    break;
                }
                plan.push((i, vec![t], true));
                budget -= 1;
                outs_left -= 1;
            }
        }
        for (i, a) in self.active.iter().enumerate() {
            let rest = &a.prompt[a.fed..];
            if rest.is_empty() || a.wait_for.is_some() || budget == 0 {
                continue;
            }
            let n = rest.len().min(budget);
            let wants = n == rest.len();
            if wants && outs_left == 0 {
                continue;
            }
            plan.push((i, rest[..n].to_vec(), wants));
            budget -= n;
            outs_left -= wants as usize;
        }
        if plan.is_empty() {
            return Ok(());
        }
        let pieces: Vec<Piece> =
            plan.iter().map(|(i, toks, wants)| Piece { seq: self.active[*i].slot, tokens: toks, logits: *wants }).collect();
        let rows = self.session.forward(&pieces)?;
        self.stats.passes += 1;
        for (i, toks, _) in &plan {
            let a = &mut self.active[*i];
            if a.g.pending.take().is_none() {
                a.fed += toks.len();
                self.stats.prefilled += toks.len() as u64;
            }
        }
        // Row r belongs to the r-th planned piece that wants logits.
        let owners: Vec<usize> = plan.iter().filter(|p| p.2).map(|p| p.0).collect();
        debug_assert_eq!(owners.len(), rows);
        if rows == 0 {
            return Ok(());
        }
        // Greedy rows need 4 bytes back (the GPU's argmax); sampled rows their logits.
        let need = owners.iter().rposition(|&i| self.active[i].g.sampler.needs_logits());
        let argmax = if owners.iter().all(|&i| self.active[i].g.sampler.needs_logits()) {
            Vec::new()
        } else {
            self.session.output_argmax_rows(rows).await?
        };
        let mut logits = match need {
            Some(last) => self.session.output_logits(last + 1).await?,
            None => Vec::new(),
        };
        let mut finished = Vec::new();
        for (r, &i) in owners.iter().enumerate() {
            let t = match logits.get_mut(r) {
                Some(l) if self.active[i].g.sampler.needs_logits() => self.active[i].g.sampler.sample(l),
                _ => argmax[r],
            };
            let Some(t) = t else {
                // No finite logit in this row (the activations overflowed): only this request
                // ends, and its slot's cache, which may hold the bad rows, is forgotten.
                let a = &self.active[i];
                let e = ApiError { status: 500, message: "the model produced no finite logit (NaN or infinity) for this request".into(), kind: "server_error".into(), param: None, code: None };
                self.outbox.push_back(Event { id: a.id, output: Output::Error(e), last: true });
                self.session.truncate_seq(a.slot, 0);
                finished.push(a.id);
                continue;
            };
            self.stats.generated += 1;
            let a = &mut self.active[i];
            let text = match accept(&self.prompter.tokenizer, &self.stop_ids, &mut a.g, t) {
                Ok(text) => text,
                Err(e) => {
                    // This request's own fault (its text cannot be decoded): only it ends.
                    self.outbox.push_back(Event { id: a.id, output: Output::Error(e.into()), last: true });
                    finished.push(a.id);
                    continue;
                }
            };
            let (id, done) = (a.id, a.g.finished);
            if a.stream {
                if !text.is_empty() {
                    let delta = Delta { role: None, content: Some(text) };
                    self.outbox.push_back(Event { id, output: Output::Chunk(chunk(&a.g, delta, None)), last: false });
                }
                if let Some(reason) = done {
                    self.outbox.push_back(Event { id, output: Output::Chunk(chunk(&a.g, Delta::default(), Some(reason))), last: true });
                }
            } else {
                a.content += &text;
                if let Some(reason) = done {
                    let c = ChatCompletion {
                        id: a.g.id.clone(),
                        object: "chat.completion".into(),
                        created: a.g.created,
                        model: a.g.model.clone(),
                        choices: vec![Choice { index: 0, message: Message::assistant(std::mem::take(&mut a.content)), finish_reason: reason }],
                        usage: usage(&a.g),
                    };
                    self.outbox.push_back(Event { id, output: Output::Completion(c), last: true });
                }
            }
            if done.is_some() {
                finished.push(id);
            }
        }
        for id in finished {
            self.release(id);
        }
        Ok(())
    }

    /// Steps until request `id` has an output; outputs of other requests stay queued.
    async fn next_output(&mut self, id: RequestId, keep_going: &mut impl FnMut() -> bool) -> Option<Event> {
        loop {
            if let Some(i) = self.outbox.iter().position(|e| e.id == id) {
                return self.outbox.remove(i);
            }
            if !self.active.iter().any(|a| a.id == id) {
                return None;
            }
            if !keep_going() {
                self.cancel(id);
                return Some(Event { id, output: Output::Error(cancelled()), last: true });
            }
            let events = self.step().await;
            self.outbox.extend(events);
        }
    }

    /// Answers a request with one `chat.completion` object.
    pub async fn complete(&mut self, req: &ChatRequest) -> std::result::Result<ChatCompletion, ApiError> {
        self.complete_while(req, || true).await
    }

    /// [`ChatEngine::complete`], giving up (with a 499 "cancelled" error) as soon as
    /// `keep_going()` returns false between tokens (e.g. when the client has gone away).
    pub async fn complete_while(
        &mut self,
        req: &ChatRequest,
        mut keep_going: impl FnMut() -> bool,
    ) -> std::result::Result<ChatCompletion, ApiError> {
        let id = self.submit(req, false)?;
        let mut owner = self.guard(id);
        let r = match self.next_output(id, &mut keep_going).await {
            Some(Event { output: Output::Completion(c), .. }) => Ok(c),
            Some(Event { output: Output::Error(e), .. }) => Err(e),
            _ => Err(cancelled()),
        };
        owner.done = true;
        r
    }

    /// Answers a request as a stream of `chat.completion.chunk` objects: the role first, then
    /// content deltas (valid UTF-8, never empty), then one with `finish_reason`. Request errors
    /// (invalid values, a prompt over the context) come before any chunk.
    pub async fn stream(
        &mut self,
        req: &ChatRequest,
    ) -> std::result::Result<impl Stream<Item = std::result::Result<ChatCompletionChunk, ApiError>> + '_, ApiError> {
        let s = self.start_stream(req).await?;
        Ok(futures_util::stream::unfold((self, s), |(eng, mut s)| async move {
            let c = eng.next_chunk(&mut s).await?;
            Some((c, (eng, s)))
        }))
    }

    /// The same stream, step by step, for callers that cannot hold a borrowing stream (the
    /// wasm bindings): [`ChatEngine::start_stream`], then [`ChatEngine::next_chunk`] until `None`.
    /// Dropping the [`ChatStream`] abandons the generation (its slot is freed).
    pub async fn start_stream(&mut self, req: &ChatRequest) -> std::result::Result<ChatStream, ApiError> {
        let id = self.submit(req, true)?;
        Ok(ChatStream { owner: self.guard(id) })
    }

    /// The next chunk of a stream, `None` after the one with `finish_reason`.
    pub async fn next_chunk(&mut self, s: &mut ChatStream) -> Option<std::result::Result<ChatCompletionChunk, ApiError>> {
        self.next_chunk_while(s, || true).await
    }

    /// [`ChatEngine::next_chunk`], giving up (a 499 "cancelled" error, then the end) as soon as
    /// `keep_going()` returns false between tokens, also while text is held back (stop strings,
    /// task output cleaning) and no chunk has been produced.
    pub async fn next_chunk_while(
        &mut self,
        s: &mut ChatStream,
        mut keep_going: impl FnMut() -> bool,
    ) -> Option<std::result::Result<ChatCompletionChunk, ApiError>> {
        if s.owner.done {
            return None;
        }
        let ev = self.next_output(s.owner.id, &mut keep_going).await;
        match ev {
            None => {
                s.owner.done = true;
                None
            }
            Some(ev) => {
                s.owner.done = ev.last;
                match ev.output {
                    Output::Chunk(c) => Some(Ok(c)),
                    Output::Error(e) => Some(Err(e)),
                    Output::Completion(_) => None,
                }
            }
        }
    }
}

/// Takes sampled token `t` into a generation: stop ids, detokenizing, stop strings, output
/// cleaning, limits. Returns the text that became final (maybe empty); sets `g.finished` at the
/// end, else `g.pending` (the token to feed next).
fn accept(tok: &Tokenizer, stop_ids: &[u32], g: &mut Generation, t: u32) -> Result<String> {
    g.produced += 1;
    g.sampler.accept(t);
    let mut out = String::new();
    if stop_ids.contains(&t) {
        g.finished = Some(FinishReason::Stop);
    } else {
        let text = g.decoder.push(tok, t)?;
        let (text, hit) = g.stop.push(&text);
        out += &g.filter.push(&text);
        if hit {
            g.finished = Some(FinishReason::Stop);
            out += &g.filter.finish();
            return Ok(out);
        }
        if g.produced >= g.max_new {
            g.finished = Some(FinishReason::Length);
        } else {
            g.pending = Some(t);
        }
    }
    if g.finished.is_some() {
        let tail = g.decoder.finish(tok)?;
        let (tail, hit) = g.stop.push(&tail);
        out += &g.filter.push(&tail);
        if hit {
            // The decoder's held-back tail completed a stop string: the answer stopped there.
            g.finished = Some(FinishReason::Stop);
        } else {
            let rest = g.stop.finish();
            out += &g.filter.push(&rest);
        }
        out += &g.filter.finish();
    }
    Ok(out)
}

/// How many tokens `a` and `b` share at their start.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn usage(g: &Generation) -> Usage {
    Usage { prompt_tokens: g.prompt_tokens as u64, completion_tokens: g.produced as u64, total_tokens: (g.prompt_tokens + g.produced) as u64 }
}

fn chunk(g: &Generation, delta: Delta, finish: Option<FinishReason>) -> ChatCompletionChunk {
    ChatCompletionChunk {
        id: g.id.clone(),
        object: "chat.completion.chunk".into(),
        created: g.created,
        model: g.model.clone(),
        choices: vec![ChunkChoice { index: 0, delta, finish_reason: finish }],
        usage: match (finish, g.include_usage) {
            (Some(_), true) => Some(usage(g)),
            _ => None,
        },
    }
}

fn cancelled() -> ApiError {
    ApiError { status: 499, message: "request cancelled".into(), kind: "cancelled".into(), param: None, code: None }
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
