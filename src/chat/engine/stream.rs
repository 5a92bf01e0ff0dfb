//! Answers for one caller at a time: a whole completion, or a stream of chunks, each driving
//! [`ChatEngine::step`] until its own request has an output (other requests' outputs wait).

use super::*;

impl ChatEngine {
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
