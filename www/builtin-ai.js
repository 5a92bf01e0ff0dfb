// The web platform's built-in AI interfaces over the engine: `Translator` and `LanguageDetector`
// in the shapes of the Translator and Language Detector APIs (WebIDL of the explainers, as
// Chrome ships them), so code written for Chrome's built-in AI runs on any WebGPU browser with
// TildeOpen. Every instance shares one engine (one download, one device; its parallel slots let
// several instances translate at once).
//
//   import { install } from "tildeopen-wgpu/builtin-ai";
//   install({ model: "https://host/TildeOpen-30b-Q4_K_M.gguf" });   // only where the browser has none
//   const t = await Translator.create({ sourceLanguage: "en", targetLanguage: "lv" });
//   console.log(await t.translate("I like cakes."));
//
// Not here yet: Summarizer and the Prompt API's LanguageModel (see the README's table).

import { createEngine, detectLanguage, isCached } from "./tildeopen.js";
import { languageName, pairError } from "./builtin-ai-core.js";

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

/** The engine every instance shares (loading it on first use), for code that also wants the
 *  engine's own API. */
export function getEngine() {
  return sharedEngine();
}

function sharedEngine() {
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
function monitorTarget(monitor) {
  if (typeof monitor !== "function") return null;
  const target = new EventTarget();
  monitor(target);
  return (loaded) => {
    const e = new Event("downloadprogress");
    Object.assign(e, { loaded, total: 1 });
    target.dispatchEvent(e);
  };
}

async function modelAvailability() {
  if (!config) return "unavailable";
  if (engine && !downloading) return "available";
  if (downloading) return "downloading";
  const url = typeof config.model === "string" ? config.model : null;
  return url === null || (await isCached(url)) ? "available" : "downloadable";
}

function checkSignal(signal) {
  if (signal?.aborted) throw signal.reason instanceof DOMException ? signal.reason : new DOMException("aborted", "AbortError");
}

// Engine errors as the specifications' DOMExceptions.
function domError(e) {
  if (e instanceof DOMException) return e;
  if (e?.code === "context_length_exceeded") return new DOMException(e.message, "QuotaExceededError");
  if (e?.code === "unloaded") return new DOMException("the engine was unloaded", "InvalidStateError");
  return new DOMException(e?.message ?? String(e), "OperationError");
}

async function loadFor(signal, monitor) {
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

export class Translator {
  #engine; #destroyed = false; #glossary; #examples;

  /** "unavailable" for a pair the model is not offered for, else as the weights stand:
   *  "downloadable", "downloading" or "available". */
  static async availability({ sourceLanguage, targetLanguage } = {}) {
    if (pairError(sourceLanguage, targetLanguage)) return "unavailable";
    return modelAvailability();
  }

  /** Options beyond the specification: `glossary` ([[term, translation]]) and `examples`
   *  ([[source, translation]]), passed to the engine's translation task. */
  static async create(options = {}) {
    const { sourceLanguage, targetLanguage, signal, monitor } = options;
    const bad = pairError(sourceLanguage, targetLanguage);
    if (bad) throw new DOMException(bad, "NotSupportedError");
    const e = await loadFor(signal, monitor);
    return new Translator(e, options);
  }

  constructor(engine, { sourceLanguage, targetLanguage, glossary = [], examples = [] }) {
    if (!engine) throw new TypeError("use Translator.create()");
    this.#engine = engine;
    this.sourceLanguage = sourceLanguage;
    this.targetLanguage = targetLanguage;
    this.#glossary = glossary;
    this.#examples = examples;
    // What one translate() call may take, in prompt tokens (the instruction included), leaving
    // the rest of the engine's context for the answer.
    this.inputQuota = Math.floor(engine.contextSize / 2);
  }

  #request(input, extra = {}) {
    if (this.#destroyed) throw new DOMException("the translator was destroyed", "InvalidStateError");
    return { task: { type: "translate", text: String(input), source: this.sourceLanguage, target: this.targetLanguage, glossary: this.#glossary, examples: this.#examples }, temperature: 0, ...extra };
  }

  // An answer's room: twice the text's own tokens and 16 (a translation is about as long as its
  // source; a model that does not stop is cut there, not at the end of the context).
  async #maxTokens(input) {
    const all = await this.measureInputUsage(input);
    if (all > this.inputQuota) throw new DOMException(`the input takes ${all} tokens; the quota is ${this.inputQuota}`, "QuotaExceededError");
    const bare = await this.measureInputUsage(".");
    return 2 * Math.max(1, all - bare + 1) + 16;
  }

  async translate(input, { signal } = {}) {
    checkSignal(signal);
    const max_tokens = await this.#maxTokens(input);
    try {
      const c = await this.#engine.chat.completions.create({ ...this.#request(input, { max_tokens }), signal });
      return c.choices[0].message.content;
    } catch (e) {
      throw domError(e);
    }
  }

  /** A ReadableStream of the translation's text, piece by piece. */
  translateStreaming(input, { signal } = {}) {
    let it = null;
    return new ReadableStream({
      start: async () => {
        checkSignal(signal);
        const max_tokens = await this.#maxTokens(input);
        it = await this.#engine.chat.completions.create({ ...this.#request(input, { max_tokens, stream: true }), signal }).catch((e) => { throw domError(e); });
      },
      // Each pull enqueues a piece of text or ends the stream: a pull that enqueues nothing is
      // not called again (the Streams standard), so chunks without text (the role, the
      // finish) are read past here.
      pull: async (controller) => {
        for (;;) {
          if (signal?.aborted) { await it.return?.(); return controller.error(new DOMException("aborted", "AbortError")); }
          const r = await it.next().catch((e) => { throw domError(e); });
          if (r.done) return controller.close();
          const d = r.value.choices[0]?.delta?.content;
          if (d) return controller.enqueue(d);
        }
      },
      cancel: async () => { await it?.return?.(); },
    });
  }

  /** The prompt tokens translating `input` takes (compare with `inputQuota`). */
  async measureInputUsage(input, { signal } = {}) {
    checkSignal(signal);
    return this.#engine.countTokens(this.#request(input)).catch((e) => { throw domError(e); });
  }

  destroy() {
    this.#destroyed = true;
  }
}

export class LanguageDetector {
  #destroyed = false;

  static async availability() {
    return "available"; // compiled into the wasm: no model to download
  }

  static async create({ signal, monitor, expectedInputLanguages } = {}) {
    checkSignal(signal);
    monitorTarget(monitor)?.(1);
    return new LanguageDetector(expectedInputLanguages);
  }

  constructor(expectedInputLanguages) {
    this.expectedInputLanguages = expectedInputLanguages ?? null;
    this.inputQuota = Infinity;
  }

  /** `[{ detectedLanguage, confidence }]`, most likely first; "und" (undetermined) for text
   *  without letters. */
  async detect(input, { signal } = {}) {
    if (this.#destroyed) throw new DOMException("the detector was destroyed", "InvalidStateError");
    checkSignal(signal);
    const d = await detectLanguage(String(input), { wasmUrl: config?.wasmUrl });
    if (!d) return [{ detectedLanguage: "und", confidence: 1 }];
    return [{ detectedLanguage: d.language, confidence: d.confidence }, { detectedLanguage: "und", confidence: Math.max(0, 1 - d.confidence) }];
  }

  async measureInputUsage() {
    return 0;
  }

  destroy() {
    this.#destroyed = true;
  }
}

/** Puts `Translator` and `LanguageDetector` on `globalThis` where the browser has none of its
 *  own (`force: true` replaces a native one), using `opts` (`model` and createEngine options)
 *  for every instance. Returns the names installed. */
export function install({ force = false, ...opts } = {}) {
  configure(opts);
  const installed = [];
  for (const [name, cls] of [["Translator", Translator], ["LanguageDetector", LanguageDetector]]) {
    if (force || !(name in globalThis)) {
      globalThis[name] = cls;
      installed.push(name);
    }
  }
  return installed;
}

export { languageName };
