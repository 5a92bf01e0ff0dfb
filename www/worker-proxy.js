// The page side of a worker engine: the same API as createEngineInThread, every call a message.
import { taskRequest } from "./tildeopen.js";
import { chunkStream, engineError, foldedStream, serialQueue } from "./util.js";

export async function createWorkerEngine(opts) {
  // Bundlers that do not follow `new URL("./worker.js", import.meta.url)` (esbuild) bundle
  // "tildeopen-wgpu/worker" themselves and pass its URL as `workerUrl`.
  const worker = new Worker(opts.workerUrl ?? new URL("./worker.js", import.meta.url), { type: "module" });
  let next = 1;
  const requests = serialQueue();
  const pending = new Map();
  worker.onmessage = (e) => {
    const { id, result, error, progress } = e.data;
    const p = pending.get(id);
    if (!p) return;
    if (progress) return p.onProgress?.(progress);
    pending.delete(id);
    error !== undefined ? p.reject(engineError(error)) : p.resolve(result);
  };
  worker.onerror = (e) => {
    for (const p of pending.values()) p.reject(engineError(`worker failed: ${e.message}`, "server_error", "worker_failed"));
    pending.clear();
  };
  const call = (op, args, onProgress) =>
    new Promise((resolve, reject) => {
      const id = next++;
      pending.set(id, { resolve, reject, onProgress });
      worker.postMessage({ id, op, args });
    });

  const { model, onProgress, workerUrl, ...rest } = opts;
  // URLs cross to the worker as absolute strings (a URL object cannot be posted).
  // A relative model URL means the page's folder, not the worker script's.
  if (rest.wasmUrl !== undefined) rest.wasmUrl = new URL(rest.wasmUrl, globalThis.location?.href).href;
  const modelArg = typeof model === "string" ? new URL(model, globalThis.location?.href).href : model;
  const info = await call("load", { model: modelArg, ...rest }, onProgress);

  async function create(request) {
    const { signal, ...req } = request;
    if (signal?.aborted) throw new DOMException("aborted", "AbortError");
    // Non-streamed requests wait for each other here; with a signal, one runs as a stream (which
    // the signal stops between tokens) folded into one completion.
    if (!req.stream && signal) return requests(() => foldedStream(create, req, signal));
    if (!req.stream) return requests(() => call("create", req));
    const streamId = next++;
    await call("create", { ...req, streamId });
    return chunkStream(() => call("next", { streamId }), () => call("return", { streamId }), signal);
  }
  const task = (type) => (args) => create(taskRequest(type, args));
  return {
    ...info,
    chat: { completions: { create } },
    tasks: { translate: task("translate"), ask: task("ask"), summarise: task("summarise") },
    async unload() { await call("unload"); worker.terminate(); },
  };
}
