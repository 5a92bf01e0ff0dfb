// Small helpers shared by tildeopen.js, worker-proxy.js and the extension's service worker.

/** The Error engine calls reject with: its message is the response format's JSON error body
 *  (`{"error": {message, type, param, code}}`) and `type`, `code` and `param` are that body's
 *  fields, so `catch (e) { if (e.code === "context_length_exceeded") ... }` needs no parsing. A
 *  message that is not such a body (a browser error) becomes a `server_error` body. */
export function engineError(message, type = "server_error", code = null) {
  let body;
  try { body = JSON.parse(message)?.error; } catch {}
  if (!body || typeof body.message !== "string") body = { message: String(message), type, param: null, code };
  const e = new Error(JSON.stringify({ error: body }));
  e.type = body.type ?? null;
  e.code = body.code ?? null;
  e.param = body.param ?? null;
  return e;
}

/** A queue that runs the functions given to it one at a time, in order: `serial(f)` returns
 *  f's result once every earlier call has settled (a rejection does not stop the queue). */
export function serialQueue() {
  let queue = Promise.resolve();
  return (f) => {
    const r = queue.then(f);
    queue = r.catch(() => {});
    return r;
  };
}

/** An async iterator over a stream of chunks. `pull(state)` resolves to the next iterator result
 *  (`{ done: true }` at the end) and may set `state.done` itself; `cancel()` ends the stream
 *  early, at most once: on `return()` or when `signal` has aborted by the next `next()`. */
export function chunkStream(pull, cancel, signal) {
  const state = { done: false };
  const finish = async () => {
    if (state.done) return;
    state.done = true;
    await cancel();
  };
  return {
    [Symbol.asyncIterator]() { return this; },
    async next() {
      if (state.done) return { done: true, value: undefined };
      if (signal?.aborted) { await finish(); return { done: true, value: undefined }; }
      const r = await pull(state);
      if (r.done) state.done = true;
      return r;
    },
    async return() { await finish(); return { done: true, value: undefined }; },
  };
}

/** A non-streamed request that has a `signal`, run as a stream (`stream(req)` starts it) and
 *  folded into the one `chat.completion` the request asked for, so the signal stops generation
 *  between tokens as it does for streams; an abort rejects with an `AbortError`. */
export async function foldedStream(stream, req, signal) {
  const it = await stream({ ...req, stream: true, stream_options: { include_usage: true }, signal });
  let first = null, content = "", finish = null, usage = null;
  for await (const c of it) {
    first ??= c;
    content += c.choices[0]?.delta?.content ?? "";
    finish = c.choices[0]?.finish_reason ?? finish;
    usage = c.usage ?? usage;
  }
  if (signal.aborted || first === null || finish === null) throw new DOMException("aborted", "AbortError");
  return { id: first.id, object: "chat.completion", created: first.created, model: first.model, choices: [{ index: 0, message: { role: "assistant", content }, finish_reason: finish }], usage };
}
