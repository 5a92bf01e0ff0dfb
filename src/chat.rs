//! Chat completions on a model: template, tokens, prefix-cached KV, sampling, stopping, and the
//! response objects, whole ([`ChatEngine::complete`]) or streamed ([`ChatEngine::stream`]).

use crate::api::{ApiError, ChatCompletion, ChatCompletionChunk, ChatRequest, Choice, ChunkChoice, Delta, FinishReason, Message, Usage};
use crate::engine::{Session, SessionOptions};
use crate::error::Result;
use crate::model::Model;
use crate::sampling::Sampler;
use crate::tasks::OutputFilter;
use crate::template::ChatTemplate;
use crate::tokenizer::{StreamDecoder, Tokenizer};
use futures_util::Stream;

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
    /// Largest prefill batch.
    pub max_batch: usize,
    /// The `model` field of responses.
    pub model_name: String,
}

impl Default for ChatOptions {
    fn default() -> Self {
        ChatOptions { ctx_size: None, kv_f16: true, max_batch: 256, model_name: "tildeopen".into() }
    }
}

/// A model ready to answer chat requests: tokenizer, template and one session whose KV cache is
/// reused across requests that share a prefix (a chat's earlier turns).
pub struct ChatEngine {
    tokenizer: Tokenizer,
    template: ChatTemplate,
    session: Session,
    name: String,
    /// The tokens whose keys and values are in the session's cache.
    cached: Vec<u32>,
    stop_ids: Vec<u32>,
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
        // Default: the model's context, capped at MAX_CONTEXT and at what one KV buffer holds.
        let per_token = model.cfg.kv_dim() * if opts.kv_f16 { 2 } else { 4 };
        let fits = (model.gpu.max_binding.saturating_sub(4) as usize / per_token.max(1)).max(2);
        let cap = model.cfg.max_position_embeddings.clamp(2, MAX_CONTEXT).min(fits);
        let ctx = opts.ctx_size.unwrap_or(cap).clamp(2, MAX_CONTEXT);
        let session = Session::new(model, SessionOptions { ctx_size: ctx, kv_f16: opts.kv_f16, max_batch: opts.max_batch })?;
        let template = ChatTemplate::for_tokenizer(&tokenizer)?;
        let mut stop_ids = tokenizer.eog.clone();
        stop_ids.extend(&template.stop_ids);
        if stop_ids.is_empty() {
            log::warn!("the tokenizer names no end-of-generation token: answers end only at max_tokens or stop strings");
        }
        Ok(ChatEngine { tokenizer, template, session, name: opts.model_name, cached: Vec::new(), stop_ids })
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The context window in tokens.
    pub fn context_size(&self) -> usize {
        self.session.ctx_size()
    }

    /// The model name responses carry.
    pub fn model_name(&self) -> &str {
        &self.name
    }

    /// The prompt text a request renders to.
    pub fn prompt_text(&self, req: &ChatRequest) -> std::result::Result<String, ApiError> {
        let messages: Vec<Message> = req.effective_messages();
        Ok(self.template.render(&messages, true)?)
    }

    /// The prompt's token ids (bos added when the tokenizer wants one and the template did not).
    pub fn prompt_tokens(&self, req: &ChatRequest) -> std::result::Result<Vec<u32>, ApiError> {
        let text = self.prompt_text(req)?;
        let mut ids = self.tokenizer.encode_chat(&text)?;
        if let (true, Some(bos)) = (self.tokenizer.add_bos, self.tokenizer.bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    /// Validates, renders and prefills a request; the KV cache keeps the longest prefix shared
    /// with the previous request.
    async fn start(&mut self, req: &ChatRequest) -> std::result::Result<Generation, ApiError> {
        req.validate()?;
        let prompt = self.prompt_tokens(req)?;
        let ctx = self.context_size();
        if prompt.is_empty() {
            return Err(ApiError::invalid("the request renders to an empty prompt".into(), Some("messages")));
        }
        if prompt.len() >= ctx {
            return Err(ApiError::context_length(prompt.len(), ctx));
        }
        let mut common = self.cached.iter().zip(&prompt).take_while(|(a, b)| a == b).count();
        if common == prompt.len() {
            common -= 1; // the last prompt token is fed again for its logits
        }
        self.cached.truncate(common);
        self.session.truncate(common);
        if let Err(e) = self.session.feed(&prompt[common..]).await {
            self.cached.clear();
            self.session.reset();
            return Err(e.into());
        }
        self.cached = prompt.clone();
        let room = ctx - prompt.len();
        let max_new = req.max_tokens.map_or(room, |m| (m.min(usize::MAX as u64) as usize).min(room));
        Ok(Generation {
            id: crate::util::completion_id(),
            created: crate::util::unix_time(),
            model: self.name.clone(),
            prompt_tokens: prompt.len(),
            max_new,
            produced: 0,
            sampler: Sampler::new(req.sampling(), &prompt),
            decoder: StreamDecoder::new(),
            stop: StopFilter { stops: req.stop_strings(), held: String::new() },
            filter: OutputFilter::new(req.task.as_ref()),
            pending: None,
            finished: None,
            include_usage: req.stream_options.as_ref().is_some_and(|o| o.include_usage),
        })
    }

    /// Generates one token; returns the text that became final (maybe empty). Sets
    /// `g.finished` at the end.
    async fn step(&mut self, g: &mut Generation) -> Result<String> {
        if let Some(t) = g.pending.take() {
            self.session.feed(&[t]).await?;
            self.cached.push(t);
        }
        let t = if g.sampler.needs_logits() {
            let mut logits = self.session.last_logits().await?;
            g.sampler.sample(&mut logits)
        } else {
            self.session.last_argmax().await?
        };
        g.produced += 1;
        g.sampler.accept(t);
        let mut out = String::new();
        if self.stop_ids.contains(&t) {
            g.finished = Some(FinishReason::Stop);
        } else {
            let text = g.decoder.push(&self.tokenizer, t)?;
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
            let tail = g.decoder.finish(&self.tokenizer)?;
            let (tail, _) = g.stop.push(&tail);
            out += &g.filter.push(&tail);
            let rest = g.stop.finish();
            out += &g.filter.push(&rest);
            out += &g.filter.finish();
        }
        Ok(out)
    }

    fn usage(g: &Generation) -> Usage {
        Usage { prompt_tokens: g.prompt_tokens as u64, completion_tokens: g.produced as u64, total_tokens: (g.prompt_tokens + g.produced) as u64 }
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
        let mut g = self.start(req).await?;
        let mut content = String::new();
        while g.finished.is_none() {
            if !keep_going() {
                return Err(cancelled());
            }
            content += &self.step(&mut g).await?;
        }
        Ok(ChatCompletion {
            id: g.id.clone(),
            object: "chat.completion".into(),
            created: g.created,
            model: g.model.clone(),
            choices: vec![Choice { index: 0, message: Message::assistant(content), finish_reason: g.finished.unwrap() }],
            usage: Self::usage(&g),
        })
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
    /// Dropping the [`ChatStream`] abandons the generation.
    pub async fn start_stream(&mut self, req: &ChatRequest) -> std::result::Result<ChatStream, ApiError> {
        Ok(ChatStream { g: self.start(req).await?, phase: 0 })
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
        let chunk = |g: &Generation, delta: Delta, finish: Option<FinishReason>| ChatCompletionChunk {
            id: g.id.clone(),
            object: "chat.completion.chunk".into(),
            created: g.created,
            model: g.model.clone(),
            choices: vec![ChunkChoice { index: 0, delta, finish_reason: finish }],
            usage: match (finish, g.include_usage) {
                (Some(_), true) => Some(Self::usage(g)),
                _ => None,
            },
        };
        match s.phase {
            0 => {
                s.phase = 1;
                Some(Ok(chunk(&s.g, Delta { role: Some("assistant".into()), content: Some(String::new()) }, None)))
            }
            1 => loop {
                if let Some(reason) = s.g.finished {
                    s.phase = 2;
                    return Some(Ok(chunk(&s.g, Delta::default(), Some(reason))));
                }
                if !keep_going() {
                    s.phase = 2;
                    return Some(Err(cancelled()));
                }
                match self.step(&mut s.g).await {
                    Ok(text) if !text.is_empty() => return Some(Ok(chunk(&s.g, Delta { role: None, content: Some(text) }, None))),
                    Ok(_) => continue,
                    Err(e) => {
                        s.phase = 2;
                        return Some(Err(e.into()));
                    }
                }
            },
            _ => None,
        }
    }
}

fn cancelled() -> ApiError {
    ApiError { status: 499, message: "request cancelled".into(), kind: "cancelled".into(), param: None, code: None }
}

/// A streamed answer in progress (see [`ChatEngine::start_stream`]).
pub struct ChatStream {
    g: Generation,
    /// 0 = role chunk next, 1 = content, 2 = done.
    phase: u8,
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
