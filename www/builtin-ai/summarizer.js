// `Summarizer` in the shape of the Summarizer API, over the response format's summarisation
// task: `type`, `format` and `length` (and the shared and per-call context) become the task's
// instruction (builtin-ai-core.js, summaryInstruction).

import { summarizerOptions, summaryInstruction, summaryMaxTokens } from "../builtin-ai-core.js";
import { checkSignal, completionText, loadFor, modelAvailability, promptTokens, textStream } from "./shared.js";

export class Summarizer {
  #engine; #o; #destroyed = false;

  /** "unavailable" when a language asked for is not one the model is offered for; else as the
   *  weights stand. A value outside an enum (`type`, `format`, `length`) throws a TypeError. */
  static async availability(options = {}) {
    if (summarizerOptions(options).error) return "unavailable";
    return modelAvailability();
  }

  static async create(options = {}) {
    const o = summarizerOptions(options);
    if (o.error) throw new DOMException(o.error, "NotSupportedError");
    const e = await loadFor(options.signal, options.monitor);
    return new Summarizer(e, o);
  }

  constructor(engine, o) {
    if (!engine) throw new TypeError("use Summarizer.create()");
    this.#engine = engine;
    this.#o = o;
    for (const k of ["sharedContext", "type", "format", "length", "expectedInputLanguages", "expectedContextLanguages", "outputLanguage"]) this[k] = o[k];
    // Prompt tokens one call may take (the instruction and context included): the rest of the
    // context is the summary's room.
    this.inputQuota = Math.max(1, engine.contextSize - summaryMaxTokens(o));
  }

  #request(input, context, extra = {}) {
    if (this.#destroyed) throw new DOMException("the summarizer was destroyed", "InvalidStateError");
    return { task: { type: "summarise", text: String(input), instruction: summaryInstruction(this.#o, context) }, temperature: 0, max_tokens: summaryMaxTokens(this.#o), ...extra };
  }

  async #checked(input, context, signal, extra) {
    checkSignal(signal);
    const n = await this.measureInputUsage(input, { context });
    if (n > this.inputQuota) throw new DOMException(`the input takes ${n} tokens; the quota is ${this.inputQuota}`, "QuotaExceededError");
    return { ...this.#request(input, context, extra), signal };
  }

  async summarize(input, { context, signal } = {}) {
    return completionText(this.#engine, await this.#checked(input, context, signal));
  }

  /** A ReadableStream of the summary's text, piece by piece. */
  summarizeStreaming(input, { context, signal } = {}) {
    return textStream(async () => this.#engine.chat.completions.create(await this.#checked(input, context, signal, { stream: true })), signal);
  }

  /** The prompt tokens summarising `input` takes (compare with `inputQuota`). */
  async measureInputUsage(input, { context, signal } = {}) {
    checkSignal(signal);
    return promptTokens(this.#engine, this.#request(input, context));
  }

  destroy() {
    this.#destroyed = true;
  }
}
