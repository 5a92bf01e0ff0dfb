//! Stepping: one forward pass over every request in flight, and what its tokens become (stop
//! ids, detokenizing, stop strings, task output cleaning, the response objects).

use super::*;

impl ChatEngine {
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


fn usage(g: &Generation) -> Usage {
    Usage { prompt_tokens: g.prompt_tokens as u64, completion_tokens: g.produced as u64, total_tokens: (g.prompt_tokens + g.produced) as u64 }
}

pub(super) fn chunk(g: &Generation, delta: Delta, finish: Option<FinishReason>) -> ChatCompletionChunk {
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

pub(super) fn cancelled() -> ApiError {
    ApiError { status: 499, message: "request cancelled".into(), kind: "cancelled".into(), param: None, code: None }
}
