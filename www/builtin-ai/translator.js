// `Translator` in the shape of the Translator API, over the response format's translation task.

import { pairError } from "../builtin-ai-core.js";
import { checkSignal, completionText, loadFor, modelAvailability, promptTokens, textStream } from "./shared.js";

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
    return completionText(this.#engine, { ...this.#request(input, { max_tokens }), signal });
  }

  /** A ReadableStream of the translation's text, piece by piece. */
  translateStreaming(input, { signal } = {}) {
    return textStream(async () => {
      const max_tokens = await this.#maxTokens(input);
      return this.#engine.chat.completions.create({ ...this.#request(input, { max_tokens, stream: true }), signal });
    }, signal);
  }

  /** The prompt tokens translating `input` takes (compare with `inputQuota`). */
  async measureInputUsage(input, { signal } = {}) {
    checkSignal(signal);
    return promptTokens(this.#engine, this.#request(input));
  }

  destroy() {
    this.#destroyed = true;
  }
}
