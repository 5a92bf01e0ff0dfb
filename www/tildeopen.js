// tildeopen-wgpu in the browser: an OpenAI-shaped chat API over the wasm engine (WebGPU).
//
//   import { createEngine } from "./tildeopen.js";
//   const engine = await createEngine({ model: "https://host/model.gguf", onProgress: p => {} });
//   const completion = await engine.chat.completions.create({ messages, temperature: 0 });
//   for await (const chunk of await engine.chat.completions.create({ messages, stream: true, signal }))
//     out.textContent += chunk.choices[0]?.delta?.content ?? "";
//   await engine.tasks.translate({ text, from: "en", to: "lv", glossary: [["cake", "kūka"]] });
//   await engine.unload();
//
// Weights are fetched tensor by tensor with HTTP Range requests and kept in the Cache API in
// 32 MiB pieces, so a reload does not download them again (clearCache() forgets them).

import init, { WasmEngine, detect_language } from "./pkg/tildeopen.js";
import { engineError } from "./util.js";
import { scheduler } from "./scheduler.js";

const CACHE = "tildeopen-weights-v1";
const PIECE = 32 << 20;

let ready = null;
function initWasm(wasmUrl) {
  // By default the wasm is found next to pkg/tildeopen.js (new URL(..., import.meta.url), which
  // bundlers such as Vite and webpack follow); `wasmUrl` says where it is otherwise.
  // A failed start (a network error, say) is not kept: the next createEngine tries again.
  ready ??= init(wasmUrl === undefined ? undefined : { module_or_path: wasmUrl }).catch((e) => {
    ready = null;
    throw e;
  });
  return ready;
}

/** What the browser says about the WebGPU adapter the engine uses: vendor, architecture,
 *  device, description (GPUAdapterInfo; fields a browser hides are empty), whether the
 *  optional `shader-f16` and `subgroups` features exist and whether WGSL has the 8-bit integer
 *  dot product (`packed_4x8_integer_dot_product`, for `intDot`). `null` without WebGPU. */
export async function adapterInfo() {
  const gpu = globalThis.navigator?.gpu;
  const a = gpu && (await gpu.requestAdapter({ powerPreference: "high-performance" }));
  if (!a) return null;
  const i = a.info ?? (a.requestAdapterInfo ? await a.requestAdapterInfo() : {});
  const info = { vendor: i.vendor ?? "", architecture: i.architecture ?? "", device: i.device ?? "", description: i.description ?? "", shaderF16: a.features.has("shader-f16"), subgroups: a.features.has("subgroups"), integerDot: !!gpu.wgslLanguageFeatures?.has("packed_4x8_integer_dot_product") };
  const name = [info.vendor, info.architecture, info.device].filter(Boolean).join(" ") || info.description || "unknown adapter";
  const yn = (b) => (b ? "yes" : "no");
  info.summary = `${name} · shader-f16: ${yn(info.shaderF16)} · subgroups: ${yn(info.subgroups)}`;
  return info;
}

/** The language `text` is in: `{ language, confidence, reliable }` (an ISO 639-1 code where one
 *  exists; `reliable` when the detector is sure: short texts are guesses), or `null` for text
 *  without letters. Needs no model (the detector is compiled into the wasm). */
export async function detectLanguage(text, { wasmUrl } = {}) {
  await initWasm(wasmUrl);
  return detect_language(String(text));
}

/** Whether the Cache API holds pieces of `url` (a model loaded before in this origin: a new load
 *  reads them instead of the network). */
export async function isCached(url) {
  if (!globalThis.caches) return false;
  const abs = new URL(url, globalThis.location?.href).href.replace(/\/$/, "");
  try {
    const c = await caches.open(CACHE);
    return (await c.keys()).some((r) => r.url.startsWith(`${PIECE_PREFIX}${encodeURIComponent(abs)}/`));
  } catch {
    return false;
  }
}

/** Forgets every cached weight piece. */
export async function clearCache() {
  if (globalThis.caches) await caches.delete(CACHE);
}

/** Bytes [start, end) of `url`: a 206 whose Content-Range (when the server exposes it) names
 *  exactly these bytes of a file of `size` bytes, and whose validator matches `version`. */
/** A request that sends nothing for this long (headers or body) is given up: a stalled server
 *  left the load waiting for ever. */
const IDLE_MS = 60_000;

async function httpRange(url, start, end, size, etag, modified) {
  const ac = new AbortController();
  let timer;
  const watch = () => {
    clearTimeout(timer);
    timer = setTimeout(() => ac.abort(), IDLE_MS);
  };
  watch();
  try {
    return await rangeBody(url, start, end, size, etag, modified, ac.signal, watch);
  } catch (e) {
    if (ac.signal.aborted) throw new Error(`${url}: the server sent nothing for ${IDLE_MS / 1000} s (bytes ${start}-${end - 1}); try again`);
    throw e;
  } finally {
    clearTimeout(timer);
  }
}

async function rangeBody(url, start, end, size, etag, modified, signal, watch) {
  const r = await fetch(url, { headers: { Range: `bytes=${start}-${end - 1}` }, signal });
  if (r.status === 200) {
    // The whole file instead of a range: refuse rather than download gigabytes per piece.
    r.body?.cancel();
    throw new Error(`${url}: the server ignores HTTP Range requests (needed to stream weights)`);
  }
  if (r.status === 416) throw new Error(`${url}: bytes ${start}..${end} are past the end of the file (it is shorter than the ${size} bytes announced)`);
  if (r.status !== 206) throw new Error(`${url}: HTTP ${r.status}`);
  const cr = r.headers.get("Content-Range");
  const m = cr && cr.match(/^bytes (\d+)-(\d+)\/(\d+|\*)$/);
  if (cr && (!m || Number(m[1]) !== start || Number(m[2]) !== end - 1 || (m[3] !== "*" && Number(m[3]) !== size))) {
    r.body?.cancel();
    throw new Error(`${url}: asked for bytes ${start}-${end - 1} of ${size}, the server sent "${cr}" (the file changed on the server? reload)`);
  }
  const tag = r.headers.get("ETag");
  if (etag && tag && tag !== etag) {
    r.body?.cancel();
    throw new Error(`${url}: the file changed on the server while loading (ETag ${etag} -> ${tag}); reload`);
  }
  // Cross-origin, ETag and Content-Range are hidden unless the server exposes them, but
  // Last-Modified is always readable: without an ETag it is what tells a replaced file.
  const lm = r.headers.get("Last-Modified");
  if (!etag && modified && lm && lm !== modified) {
    r.body?.cancel();
    throw new Error(`${url}: the file changed on the server while loading (Last-Modified ${modified} -> ${lm}); reload`);
  }
  // Read as it arrives, each chunk resetting the idle watch; never more than was asked for.
  const buf = new Uint8Array(end - start);
  let got = 0;
  const reader = r.body.getReader();
  for (;;) {
    watch();
    const { done, value } = await reader.read();
    if (done) break;
    if (got + value.length > buf.length) {
      reader.cancel().catch(() => {});
      throw new Error(`${url}: asked for ${end - start} bytes at ${start}, the server sent more`);
    }
    buf.set(value, got);
    got += value.length;
  }
  if (got !== end - start) throw new Error(`${url}: asked for ${end - start} bytes at ${start}, got ${got} (the file is shorter than announced?)`);
  return buf;
}

const PIECE_PREFIX = "https://tildeopen.invalid/";

/** Deletes the cached pieces of `url` that belong to another version of the file. */
async function evictOtherVersions(cache, url, version) {
  const mine = `${PIECE_PREFIX}${encodeURIComponent(url)}/`;
  const keep = `${mine}${encodeURIComponent(version)}/`;
  for (const req of await cache.keys()) {
    if (req.url.startsWith(mine) && !req.url.startsWith(keep)) await cache.delete(req);
  }
}

/** The `io` object the engine reads weights through: a URL (cached pieces) or a File/Blob. */
function makeIo(model, useCache) {
  if (typeof Blob !== "undefined" && model instanceof Blob) {
    return {
      size: async () => model.size,
      range: async (_u, start, end) => new Uint8Array(await model.slice(start, end).arrayBuffer()),
    };
  }
  const sizes = new Map(), versions = new Map(), etags = new Map(), modifieds = new Map();
  // The cache is optional: where storage is blocked (site data off, some private windows)
  // caches.open rejects, and the load goes on without it.
  const cache = useCache && globalThis.caches ? caches.open(CACHE).catch(() => null) : null;
  const pieceKey = (url, i) => `${PIECE_PREFIX}${encodeURIComponent(url)}/${encodeURIComponent(versions.get(url))}/${i}`;
  async function piece(url, i) {
    const size = sizes.get(url);
    const start = i * PIECE, end = Math.min(size, start + PIECE);
    // Pieces are cached only for files whose version the server exposes (ETag or
    // Last-Modified): without one a changed file could not be told from the cached copy.
    const c = cache && versions.get(url) !== null && (await cache);
    if (c) {
      // A cache entry that cannot be read is fetched again.
      const hit = await c.match(pieceKey(url, i)).catch(() => null);
      const b = hit && (await hit.arrayBuffer().then((a) => new Uint8Array(a), () => null));
      if (b && b.length === end - start) return b;
    }
    const bytes = await httpRange(url, start, end, size, etags.get(url), modifieds.get(url));
    if (c) await c.put(pieceKey(url, i), new Response(bytes)).catch(() => {});
    return bytes;
  }
  return {
    async size(url) {
      if (sizes.has(url)) return sizes.get(url);
      const r = await fetch(url, { method: "HEAD", cache: "no-store", signal: AbortSignal.timeout(IDLE_MS) });
      if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
      const len = r.headers.get("Content-Length");
      const size = len === null ? NaN : Number(len);
      if (!Number.isFinite(size)) throw new Error(`${url}: no Content-Length`);
      const etag = r.headers.get("ETag"), modified = r.headers.get("Last-Modified");
      // Cached pieces belong to this version of the file; other versions' pieces are deleted.
      const version = etag || modified ? `${size}-${etag ?? modified}` : null;
      versions.set(url, version);
      etags.set(url, etag);
      modifieds.set(url, modified);
      sizes.set(url, size);
      const c = cache && (await cache);
      if (c && version !== null) await evictOtherVersions(c, url, version).catch(() => {});
      return size;
    },
    async range(url, start, end) {
      const out = new Uint8Array(end - start);
      for (let i = Math.floor(start / PIECE); i * PIECE < end; i++) {
        const p = await piece(url, i);
        const from = Math.max(start, i * PIECE), to = Math.min(end, i * PIECE + p.length);
        out.set(p.subarray(from - i * PIECE, to - i * PIECE), from - start);
      }
      return out;
    },
  };
}

const TASK_FIELDS = {
  translate: ({ text, from, to, glossary = [], examples = [] }) => ({ text, source: from, target: to, glossary, examples }),
  ask: ({ context, question }) => ({ context, question }),
  summarise: ({ text, instruction }) => ({ text, instruction }),
};

/** The chat request for one of the response format's tasks: `translate({text, from, to,
 *  glossary, examples})`, `ask({context, question})`, `summarise({text, instruction})`, plus the
 *  usual request fields (stream, signal, max_tokens, temperature, ...). */
export function taskRequest(type, args) {
  const { text, from, to, glossary, examples, context, question, instruction, ...rest } = args;
  return { ...rest, task: { type, ...TASK_FIELDS[type]({ text, from, to, glossary, examples, context, question, instruction }) } };
}

/** Runs `f` (sync or async); whatever it throws (an engine error, a trap, a lost device)
 * comes out as an engine error with type and code. */
async function guard(f) {
  try { return await f(); } catch (e) { throw parseError(e); }
}

function parseError(e) {
  // Engine errors carry the JSON error body as their message (and its fields as properties).
  if (e instanceof Error && e.code !== undefined) return e;
  return engineError(e instanceof Error ? e.message : String(e));
}

/** An engine running in this thread. */
export async function createEngineInThread(opts) {
  if (!globalThis.navigator?.gpu) throw engineError("WebGPU is not available in this browser", "invalid_request_error", "no_webgpu");
  await initWasm(opts.wasmUrl);
  const model = opts.model;
  // A File or Blob is a GGUF whatever its name (the name only labels errors and the model).
  const url = typeof model === "string" ? new URL(model, globalThis.location?.href).href.replace(/\/$/, "") : (model.name || "model").replace(/(\.gguf)?$/i, ".gguf");
  const io = makeIo(model, opts.cache !== false);
  const onProgress = opts.onProgress ?? (() => {});
  let wasm;
  try {
    wasm = await WasmEngine.load(url, io, { ctxSize: opts.ctxSize, parallel: opts.parallel, kvF16: opts.kvF16, kvCache: opts.kvCache, modelName: opts.modelName, quant: opts.quant, intDot: opts.intDot, normFold: opts.normFold }, onProgress);
  } catch (e) {
    throw parseError(e);
  }
  // Every request goes through one loop that runs the engine's forward passes for all requests
  // in flight (up to `parallel` at once; the rest wait in order). See scheduler.js.
  const prompter = wasm.prompter();
  let stats = wasm.stats;
  const runner = scheduler({
    prepare: (req) => prompter.prepare(req),
    admit: (p, stream) => { try { return wasm.admit(p, stream); } finally { p.free(); } },
    hasFreeSlot: () => wasm.has_free_slot(),
    step: async () => {
      const events = await wasm.step();
      stats = wasm.stats; // read between passes: the engine is borrowed while one runs
      return events;
    },
    discard: (p) => p.free(),
    cancel: (id) => wasm.cancel(id),
    unload: () => { wasm.unload(); prompter.free(); },
  });

  async function create(request) {
    const { signal, ...req } = request;
    // Request errors surface here, before any chunk, as in the native API.
    return guard(() => runner.submit(req, { stream: !!req.stream, signal }));
  }

  /** The prompt tokens a request would take, also beyond the context window (its other
   *  errors as `create` throws them). */
  async function countTokens(request) {
    const { signal, stream, ...req } = request;
    return guard(() => prompter.count(req));
  }

  const task = (type) => (args) => create(taskRequest(type, args));
  const gpuInfo = await adapterInfo().catch(() => null);

  return {
    modelName: wasm.model_name,
    contextSize: wasm.context_size,
    kvCache: wasm.kv_cache,
    parallel: wasm.parallel,
    /** Since the load, as of the last forward pass: prompt tokens computed (`prefilled`), reused
     *  from a slot's own cache or copied from another slot's, tokens generated, passes run. */
    async stats() { return stats; },
    countTokens,
    adapter: gpuInfo?.summary ?? wasm.adapter,
    adapterInfo: gpuInfo,
    fastPaths: wasm.fast_paths,
    chat: { completions: { create } },
    tasks: { translate: task("translate"), ask: task("ask"), summarise: task("summarise") },
    async unload() { await runner.close(engineError("the model was unloaded", "invalid_request_error", "unloaded")); },
  };
}

/** Creates an engine. `worker: true` (the default) runs it in a dedicated Web Worker behind a
 *  proxy with the same API; `worker: false` runs it in this thread. */
export async function createEngine(opts) {
  if (opts.worker === false || typeof Worker === "undefined" || typeof document === "undefined") return createEngineInThread(opts);
  const { createWorkerEngine } = await import("./worker-proxy.js");
  return createWorkerEngine(opts);
}
