//! Requests into prompts, one way: validate -> render the chat template -> tokenize, with the
//! size checks against the context window. No engine state: a [`Prompter`] runs on any thread
//! (the server prepares requests on its blocking pool while the model thread generates; the
//! browser prepares while a forward pass runs).

use crate::chat::api::{ApiError, ChatRequest, Message};
use crate::text::template::{content_marker, place_contents, ChatTemplate};
use crate::text::tokenizer::Tokenizer;
use std::ops::Range;
use std::sync::Arc;

/// Turns requests into prompts, in one direction: validate (with a cheap size bound) ->
/// render the template -> tokenize. Holds no engine state, so it can run on any thread while
/// the engine keeps generating.
#[derive(Clone)]
pub struct Prompter {
    pub(crate) tokenizer: Arc<Tokenizer>,
    pub(crate) template: Arc<ChatTemplate>,
    /// The engine's context window.
    ctx: usize,
    max_piece_bytes: usize,
}

/// A request ready for a slot: its prompt's token ids and what generation needs from it.
pub struct Prepared {
    pub prompt: Vec<u32>,
    pub(crate) max_tokens: Option<u64>,
    pub(crate) sampling: crate::chat::sampling::SamplingParams,
    pub(crate) stops: Vec<String>,
    pub(crate) task: Option<crate::chat::tasks::Task>,
    pub(crate) include_usage: bool,
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
        self.check_bytes(&text, 4)?;
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

    /// The prompt tokens a request renders to, whether or not they fit the context window (the
    /// web's task interfaces compare them with their quotas). A prompt of more than sixteen
    /// times the bytes the context could spell is refused untokenized, as `prepare` refuses one
    /// of four times.
    pub fn count(&self, req: &ChatRequest) -> std::result::Result<usize, ApiError> {
        req.validate()?;
        let (text, guarded) = self.render_guarded(req)?;
        self.check_bytes(&text, 16)?;
        Ok(self.tokenize(&text, &guarded)?.len())
    }

    /// Refuses a prompt text of more than `times` the bytes the context window could spell
    /// even in its longest pieces (the rest could only be whitespace a normalizer collapses),
    /// before the tokenizer spends memory on it.
    fn check_bytes(&self, text: &str, times: usize) -> std::result::Result<(), ApiError> {
        let cap = times * self.ctx * self.max_piece_bytes;
        if text.len() > cap {
            let mut e = ApiError::context_length(0, self.ctx);
            e.message = format!(
                "the request's messages are {} bytes, more than a context window of {} tokens takes (at most {cap} bytes)",
                text.len(),
                self.ctx
            );
            return Err(e);
        }
        Ok(())
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
