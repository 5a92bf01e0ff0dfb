// Small helpers shared by tildeopen.js, worker-proxy.js and the extension's service worker.

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
