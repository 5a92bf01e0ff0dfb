// The page side of a worker engine: the same API as createEngineInThread, every call a message.
import { taskRequest } from "./tildeopen.js";
import { chunkStream, engineError, foldedStream } from "./util.js";

export async function createWorkerEngine(opts) {
  // Bundlers that do not follow `new URL("./worker.js", import.meta.url)` (esbuild) bundle
  // "tildeopen-wgpu/worker" themselves and pass its URL as `workerUrl`.
  // The literal `new Worker(new URL("./worker.js", import.meta.url), ...)` is the form Vite and
  // webpack recognise (they bundle the worker then); any other expression leaves worker.js
  // unbundled, and its imports fail in a production build.
  const worker = opts.workerUrl
    ? new Worker(opts.workerUrl, { type: "module" })
    : new Worker(new URL("./worker.js", import.meta.url), { type: "module" });
  let next = 1;
  const pending = new Map();
  // Set once the worker is gone (unload(), or it failed): every call then rejects at once
  // instead of waiting for an answer that cannot come.
  let dead = null;
  const fail = (err) => {
    dead ??= err;
    for (const p of pending.values()) p.reject(err);
    pending.clear();
    // A failed worker is not used again: free it (and its GPU device) now.
    worker.terminate();
  };
  worker.onmessage = (e) => {
    const { id, result, error, progress } = e.data;
    const p = pending.get(id);
    if (!p) return;
    if (progress) return p.onProgress?.(progress);
    pending.delete(id);
    error !== undefined ? p.reject(engineError(error)) : p.resolve(result);
  };
  const failed = (what) => fail(engineError(`worker failed: ${what}`, "server_error", "worker_failed"));
  worker.onerror = (e) => failed(e.message);
  worker.onmessageerror = () => failed("a message could not be read");
  const call = (op, args, onProgress) =>
    new Promise((resolve, reject) => {
      if (dead) return reject(dead);
      const id = next++;
      pending.set(id, { resolve, reject, onProgress });
      worker.postMessage({ id, op, args });
    });

  const { model, onProgress, workerUrl, ...rest } = opts;
  // URLs cross to the worker as absolute strings (a URL object cannot be posted).
  // A relative model URL means the page's folder, not the worker script's.
  if (rest.wasmUrl !== undefined) rest.wasmUrl = new URL(rest.wasmUrl, globalThis.location?.href).href;
  const modelArg = typeof model === "string" ? new URL(model, globalThis.location?.href).href : model;
  // A failed load frees the worker (its wasm memory and GPU device) at once.
  const info = await call("load", { model: modelArg, ...rest }, onProgress).catch((e) => {
    fail(e);
    throw e;
  });

  async function create(request) {
    const { signal, ...req } = request;
    if (signal?.aborted) throw new DOMException("aborted", "AbortError");
    // Requests run side by side in the worker's engine (its parallel slots, then its queue).
    // With a signal, a non-streamed one runs as a stream (which the signal stops between
    // tokens) folded into one completion.
    if (!req.stream && signal) return foldedStream(create, req, signal);
    if (!req.stream) return call("create", req);
    const streamId = next++;
    await call("create", { ...req, streamId });
    return chunkStream(() => call("next", { streamId }), () => call("return", { streamId }), signal);
  }
  const task = (type) => (args) => create(taskRequest(type, args));
  return {
    ...info,
    stats: () => call("stats"),
    countTokens: ({ signal, ...req }) => call("count", req),
    chat: { completions: { create } },
    tasks: { translate: task("translate"), ask: task("ask"), summarise: task("summarise") },
    // Terminating the worker frees its GPU device at once; asking it to unload would wait
    // behind a running completion (up to the whole context).
    async unload() {
      fail(engineError("the engine was unloaded", "invalid_request_error", "unloaded"));
    },
  };
}
