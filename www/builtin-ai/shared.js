// What every class of builtin-ai.js shares: the one engine (loaded on first use), the
// `monitor`'s download progress, availability, and the specifications' DOMExceptions.

import { createEngine, isCached } from "../tildeopen.js";

let config = null;
let engine = null; // a promise of the shared engine
let downloading = false;
const progressListeners = new Set();

/** Sets the model (and createEngine options) every instance uses. */
export function configure(opts) {
  if (!opts?.model) throw new TypeError("configure({ model }) needs a model URL or File");
  config = { ...opts };
  engine = null;
}

/** The createEngine options set by `configure` (null before). */
export function configured() {
  return config;
}

/** The engine every instance shares (loading it on first use). */
export function sharedEngine() {
  if (!config) throw new DOMException("call install({ model }) or configure({ model }) first", "InvalidStateError");
  if (!engine) {
    downloading = true;
    engine = createEngine({
      ...config,
      onProgress: (p) => {
        config.onProgress?.(p);
        const loaded = p.total ? Math.min(1, p.loaded / p.total) : 0;
        for (const f of progressListeners) f(loaded);
      },
    }).then(
      (e) => { downloading = false; return e; },
      (err) => { downloading = false; engine = null; throw err; },
    );
  }
  return engine;
}

/** The monitor a `create()` call offers: `downloadprogress` events with `loaded` 0..1. */
export function monitorTarget(monitor) {
  if (typeof monitor !== "function") return null;
  const target = new EventTarget();
  monitor(target);
  return (loaded) => {
    const e = new Event("downloadprogress");
    Object.assign(e, { loaded, total: 1 });
    target.dispatchEvent(e);
  };
}

/** "downloadable", "downloading" or "available", as the model's weights stand. */
export async function modelAvailability() {
  if (!config) return "unavailable";
  if (engine && !downloading) return "available";
  if (downloading) return "downloading";
  const url = typeof config.model === "string" ? config.model : null;
  return url === null || (await isCached(url)) ? "available" : "downloadable";
}

export function checkSignal(signal) {
  if (signal?.aborted) throw signal.reason instanceof DOMException ? signal.reason : new DOMException("aborted", "AbortError");
}

/** Engine errors as the specifications' DOMExceptions. */
export function domError(e) {
  if (e instanceof DOMException) return e;
  if (e?.code === "context_length_exceeded") return new DOMException(e.message, "QuotaExceededError");
  if (e?.code === "unloaded") return new DOMException("the engine was unloaded", "InvalidStateError");
  if (e?.name === "AbortError") return new DOMException(e.message || "aborted", "AbortError");
  return new DOMException(e?.message ?? String(e), "OperationError");
}

/** The shared engine for a `create()` call: progress to its monitor, its signal honoured. */
export async function loadFor(signal, monitor) {
  checkSignal(signal);
  const report = monitorTarget(monitor);
  if (report) progressListeners.add(report);
  try {
    const e = await sharedEngine();
    report?.(1);
    checkSignal(signal);
    return e;
  } catch (err) {
    throw domError(err);
  } finally {
    if (report) progressListeners.delete(report);
  }
}

/** A ReadableStream of text from `start()`, which returns the engine's chunk iterator: each
 *  chunk's delta text is one piece. `done(text)` is awaited with the whole text before the
 *  stream closes; `end()` is called once however the stream ends (closed, errored, cancelled). */
export function textStream(start, signal, { done = async () => {}, end = () => {} } = {}) {
  let it = null;
  let text = "";
  let ended = false;
  const finish = () => { if (!ended) { ended = true; end(); } };
  return new ReadableStream({
    start: async () => {
      try {
        checkSignal(signal);
        it = await start();
      } catch (e) {
        finish();
        throw domError(e);
      }
    },
    // Each pull enqueues a piece of text or ends the stream: a pull that enqueues nothing is
    // not called again (the Streams standard), so chunks without text (the role, the finish)
    // are read past here.
    pull: async (controller) => {
      try {
        for (;;) {
          if (signal?.aborted) {
            await it.return?.();
            finish();
            return controller.error(new DOMException("aborted", "AbortError"));
          }
          const r = await it.next();
          if (r.done) {
            await done(text);
            finish();
            return controller.close();
          }
          const d = r.value.choices[0]?.delta?.content;
          if (d) { text += d; return controller.enqueue(d); }
        }
      } catch (e) {
        finish();
        throw domError(e);
      }
    },
    cancel: async () => { finish(); await it?.return?.(); },
  });
}

/** The answer's text of a non-streamed request, errors as DOMExceptions. */
export async function completionText(engine, request) {
  try {
    const c = await engine.chat.completions.create(request);
    return c.choices[0].message.content;
  } catch (e) {
    throw domError(e);
  }
}

/** The prompt tokens of a request, errors as DOMExceptions. */
export async function promptTokens(engine, request) {
  return engine.countTokens(request).catch((e) => { throw domError(e); });
}
