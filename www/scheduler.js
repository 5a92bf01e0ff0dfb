// Many requests on one engine: the loop that drives the wasm engine's parallel slots. Pure logic
// over a small interface (tested in node with a fake engine: tests/web/scheduler-test.mjs).
//
// Requests are prepared (validated, tokenized) as they arrive, so their errors come at once; they
// then wait in a FIFO queue for a slot. One loop admits queued requests while a slot is free and
// runs `step()` (one forward pass for every request in flight) while any is in flight, handing
// each request the outputs it got. A request that is aborted (its signal, a stream's `return()`)
// leaves the queue at once, or gives its slot back before the next pass; the others go on.

/** `engine`: `{ prepare(req) -> prepared (throws the request's error), admit(prepared, stream)
 *  -> id (throws), hasFreeSlot() -> bool, step() -> Promise<[{id, last, chunk|completion|error}]>
 *  (rejects when the engine cannot run again), cancel(id), unload() }`. `prepare` may be called
 *  at any time; the others only between steps, which this loop guarantees. Returns
 *  `{ submit(req, { stream, signal }), close(error), inFlight, queued }`: `submit` returns a
 *  promise of the completion (non-streamed) or an async iterator of chunks (streamed; its
 *  `next()` waits for a slot first). */
export function scheduler(engine) {
  const queue = []; // jobs waiting for a slot, in arrival order
  const running = new Map(); // engine id -> job
  const cancels = []; // engine ids to cancel before the next step
  let looping = false, scheduled = false, closed = null, unloaded = null;

  const abortError = () => new DOMException("aborted", "AbortError");

  // Ends a job: out of the queue or its slot (cancelled before the next pass), its waiters told.
  function end(job, error) {
    if (job.done) return;
    job.done = true;
    job.error = error ?? null;
    job.signal?.removeEventListener("abort", job.onAbort);
    const q = queue.indexOf(job);
    if (q >= 0) queue.splice(q, 1);
    if (job.id === null) engine.discard?.(job.prepared);
    else if (running.get(job.id) === job) {
      running.delete(job.id);
      if (!job.finished) cancels.push(job.id);
    }
    if (error) job.reject?.(error);
    job.wake();
  }

  function deliver(ev) {
    const job = running.get(ev.id);
    if (!job) return; // cancelled meanwhile
    if (ev.last) { job.finished = true; running.delete(ev.id); }
    if (ev.error) return end(job, ev.error);
    if (ev.chunk) job.chunks.push(ev.chunk);
    if (ev.completion) job.resolve?.(ev.completion);
    if (ev.last) end(job);
    else job.wake();
  }

  function admitQueued() {
    while (queue.length && engine.hasFreeSlot()) {
      const job = queue.shift();
      try {
        job.id = engine.admit(job.prepared, job.stream);
        running.set(job.id, job);
      } catch (e) {
        end(job, e);
      }
    }
  }

  async function loop() {
    scheduled = false;
    if (looping) return;
    looping = true;
    try {
      for (;;) {
        while (cancels.length) engine.cancel(cancels.shift());
        if (closed) break;
        admitQueued();
        if (!running.size) break;
        let events;
        try {
          events = await engine.step();
        } catch (e) {
          // The engine cannot run again (device lost, unloaded): every request fails with it.
          fail(e);
          break;
        }
        for (const ev of events) deliver(ev);
      }
    } finally {
      looping = false;
      if (closed && !unloaded) {
        unloaded = Promise.resolve().then(() => engine.unload());
      }
      if (!closed && (queue.length || cancels.length) && !scheduled) start();
    }
  }

  // The loop starts in a microtask: requests made in the same turn (a page's blocks sent
  // together) are admitted before the first pass, so they share its prefill.
  function start() {
    if (looping || scheduled) return;
    scheduled = true;
    queueMicrotask(loop);
  }

  function fail(e, { drop = false } = {}) {
    for (const job of [...running.values(), ...queue]) {
      if (drop) job.chunks.length = 0;
      end(job, e);
    }
  }

  function submit(req, { stream = false, signal } = {}) {
    if (closed) throw closed;
    if (signal?.aborted) throw abortError();
    const prepared = engine.prepare(req); // the request's own errors, at once
    const job = {
      prepared, stream, signal, id: null, done: false, finished: false, error: null, chunks: [],
      waiter: null, resolve: null, reject: null,
      wake() { const w = this.waiter; this.waiter = null; w?.(); },
    };
    job.onAbort = () => end(job, abortError());
    signal?.addEventListener("abort", job.onAbort, { once: true });
    queue.push(job);
    start();
    if (!stream) {
      return new Promise((resolve, reject) => {
        job.resolve = resolve;
        job.reject = reject;
        if (job.done) reject(job.error ?? abortError());
      });
    }
    return {
      [Symbol.asyncIterator]() { return this; },
      async next() {
        for (;;) {
          if (job.chunks.length) return { done: false, value: job.chunks.shift() };
          if (job.done) {
            // An abort ends the stream quietly (as breaking out of the loop would); any other
            // error is thrown once.
            const e = job.error;
            job.error = null;
            if (e && e.name !== "AbortError") throw e;
            return { done: true, value: undefined };
          }
          await new Promise((w) => (job.waiter = w));
        }
      },
      async return() {
        job.chunks.length = 0;
        end(job);
        return { done: true, value: undefined };
      },
    };
  }

  return {
    submit,
    /** Fails every request with `error`, refuses new ones, and unloads the engine once no
     *  step is running. */
    close(error) {
      closed ??= error;
      // Chunks not read yet are dropped: after unload() a stream's next call is the error.
      fail(error, { drop: true });
      if (!looping) {
        while (cancels.length) engine.cancel(cancels.shift());
        unloaded ??= Promise.resolve().then(() => engine.unload());
      }
      return new Promise((r) => {
        const check = () => (unloaded ? unloaded.then(r, r) : setTimeout(check, 5));
        check();
      });
    },
    get inFlight() { return running.size; },
    get queued() { return queue.length; },
  };
}
