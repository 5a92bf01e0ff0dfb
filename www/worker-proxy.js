// The page side of a worker engine: the same API as createEngineInThread, every call a message.
import { taskRequest } from "./tildeopen.js";
import { chunkStream } from "./util.js";

export async function createWorkerEngine(opts) {
  // Bundlers that do not follow `new URL("./worker.js", import.meta.url)` (esbuild) bundle
  // "tildeopen-wgpu/worker" themselves and pass its URL as `workerUrl`.
  const worker = new Worker(opts.workerUrl ?? new URL("./worker.js", import.meta.url), { type: "module" });
  let next = 1;
  const pending = new Map();
  worker.onmessage = (e) => {
    const { id, result, error, progress } = e.data;
    const p = pending.get(id);
    if (!p) return;
    if (progress) return p.onProgress?.(progress);
    pending.delete(id);
    error !== undefined ? p.reject(new Error(error)) : p.resolve(result);
  };
  worker.onerror = (e) => {
    for (const p of pending.values()) p.reject(new Error(JSON.stringify({ error: { message: `worker failed: ${e.message}`, type: "server_error" } })));
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
  if (rest.wasmUrl !== undefined) rest.wasmUrl = new URL(rest.wasmUrl, globalThis.location?.href).href;
  const info = await call("load", { model, ...rest }, onProgress);

  async function create(request) {
    const { signal, ...req } = request;
    if (!req.stream) return call("create", req);
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
