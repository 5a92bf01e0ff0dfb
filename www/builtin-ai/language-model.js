// `LanguageModel` in the shape of the Prompt API: a session keeps its conversation (the
// initial prompts, then every prompt and answer) and sends all of it with each prompt, as chat
// messages to the engine (whose prefix cache makes the repeated history cheap). When the
// history outgrows the context window, its oldest exchanges are dropped (the system message
// kept) and `contextoverflow` fires.
//
// Extensions (documented in the README): `create({ maxTokens })` caps each answer (default: the
// rest of the context window); `prompt(question, { context })` answers from `context` alone
// with the response format's question-answering task, and keeps the question and the answer in
// the history.

import { LANGUAGE_MODEL_PARAMS, languagesError, promptMessages, samplingOptions, trimHistory } from "../builtin-ai-core.js";
import { checkSignal, completionText, loadFor, modelAvailability, promptTokens, textStream } from "./shared.js";

function languagesOf(expected) {
  return (expected ?? []).flatMap((e) => e?.languages ?? []);
}

function unsupported(options) {
  for (const e of [...(options.expectedInputs ?? []), ...(options.expectedOutputs ?? [])]) {
    if (e?.type && e.type !== "text") return `${e.type} is not supported: this model reads and writes text only`;
  }
  return languagesError([...languagesOf(options.expectedInputs), ...languagesOf(options.expectedOutputs)]);
}

function messagesOrThrow(input, systemAllowed) {
  const m = promptMessages(input, systemAllowed);
  if (m.error) throw m.name === "TypeError" ? new TypeError(m.error) : new DOMException(m.error, m.name);
  return m;
}

export class LanguageModel extends EventTarget {
  #engine; #system = []; #turns = []; #destroyed = false; #usage = 0; #maxTokens; #live = new Set();
  oncontextoverflow = null;

  static async availability(options = {}) {
    return unsupported(options) ? "unavailable" : modelAvailability();
  }

  static async params() {
    return { ...LANGUAGE_MODEL_PARAMS };
  }

  static async create(options = {}) {
    const bad = unsupported(options);
    if (bad) throw new DOMException(bad, "NotSupportedError");
    const sampling = samplingOptions(options);
    if (sampling.error) throw new DOMException(sampling.error, "NotSupportedError");
    const initial = messagesOrThrow(options.initialPrompts ?? [], true);
    const e = await loadFor(options.signal, options.monitor);
    const s = new LanguageModel(e, sampling, options.maxTokens);
    if (initial[0]?.role === "system") s.#system = [initial.shift()];
    s.#turns = initial;
    if (initial.length || s.#system.length) {
      s.#usage = await s.#count([...s.#system, ...s.#turns]);
      if (s.#usage >= s.contextWindow) throw new DOMException(`the initial prompts take ${s.#usage} tokens; the context window is ${s.contextWindow}`, "QuotaExceededError");
    }
    return s;
  }

  constructor(engine, sampling, maxTokens) {
    super();
    if (!engine) throw new TypeError("use LanguageModel.create()");
    this.#engine = engine;
    this.topK = sampling.topK;
    this.temperature = sampling.temperature;
    this.contextWindow = engine.contextSize;
    this.#maxTokens = maxTokens === undefined ? Infinity : Math.max(1, Math.floor(maxTokens));
  }

  /** Tokens the conversation so far takes in the context window. */
  get contextUsage() {
    return this.#usage;
  }

  // Deprecated names of the same (earlier versions of the explainer).
  get inputUsage() { return this.#usage; }
  get inputQuota() { return this.contextWindow; }

  #alive() {
    if (this.#destroyed) throw new DOMException("the session was destroyed", "InvalidStateError");
  }

  #count(messages) {
    return promptTokens(this.#engine, { messages });
  }

  /** Tokens `input` would add to the conversation. */
  async measureContextUsage(input, { signal } = {}) {
    this.#alive();
    checkSignal(signal);
    const msgs = messagesOrThrow(input, false);
    return (await this.#count([...this.#system, ...this.#turns, ...msgs])) - this.#usage;
  }

  measureInputUsage(input, o) {
    return this.measureContextUsage(input, o);
  }

  // The history with `msgs` added, trimmed to leave at least one token of answer (`room`);
  // fires contextoverflow when it drops anything. Returns the messages and their token count.
  async #fit(msgs, room) {
    let used = 0;
    const fits = async (m) => (used = await this.#count([...m, ...msgs])) + room <= this.contextWindow;
    const kept = await trimHistory(this.#system, this.#turns, fits);
    if (kept === null) throw new DOMException(`the input takes ${used} tokens; the context window is ${this.contextWindow}`, "QuotaExceededError");
    if (kept.length < this.#turns.length) {
      this.#turns = kept;
      const e = new Event("contextoverflow");
      this.dispatchEvent(e);
      this.oncontextoverflow?.(e);
    }
    return { messages: [...this.#system, ...kept, ...msgs], used };
  }

  // The request of one prompt, the turn it adds, and the signal that ends it (the caller's or
  // destroy()).
  async #start(input, { signal, context, responseConstraint } = {}, extra = {}) {
    this.#alive();
    checkSignal(signal);
    if (responseConstraint !== undefined) throw new DOMException("responseConstraint is not supported", "NotSupportedError");
    const msgs = messagesOrThrow(input, false);
    const { messages, used } = await this.#fit(msgs, 1);
    const max_tokens = Math.max(1, Math.min(this.#maxTokens, this.contextWindow - used));
    const ac = new AbortController();
    const abort = () => ac.abort(signal?.reason);
    signal?.addEventListener("abort", abort, { once: true });
    this.#live.add(ac);
    const end = () => { this.#live.delete(ac); signal?.removeEventListener("abort", abort); };
    const sampling = { temperature: this.temperature, top_k: this.topK, max_tokens, signal: ac.signal, ...extra };
    let request;
    if (context !== undefined) {
      const question = msgs.filter((m) => m.role === "user").map((m) => m.content).join("\n");
      request = { task: { type: "ask", context: String(context), question }, ...sampling };
    } else {
      request = { messages, ...sampling };
    }
    return { request, msgs, end, signal: ac.signal };
  }

  async #record(msgs, answer) {
    this.#turns.push(...msgs, { role: "assistant", content: answer });
    this.#usage = await this.#count([...this.#system, ...this.#turns]).catch(() => this.#usage);
  }

  async prompt(input, options = {}) {
    const { request, msgs, end } = await this.#start(input, options);
    try {
      const answer = await completionText(this.#engine, request);
      this.#alive();
      await this.#record(msgs, answer);
      return answer;
    } finally {
      end();
    }
  }

  /** A ReadableStream of the answer's text, piece by piece; the exchange joins the history
   *  when the stream ends. */
  promptStreaming(input, options = {}) {
    let started = null;
    return textStream(async () => {
      started = await this.#start(input, options, { stream: true });
      return this.#engine.chat.completions.create(started.request);
    }, options.signal, {
      done: async (answer) => { if (!this.#destroyed) await this.#record(started.msgs, answer); },
      end: () => started?.end(),
    });
  }

  /** Adds messages to the conversation without an answer. */
  async append(input, { signal } = {}) {
    this.#alive();
    checkSignal(signal);
    const msgs = messagesOrThrow(input, false);
    const { used } = await this.#fit(msgs, 0);
    this.#turns.push(...msgs);
    this.#usage = used;
  }

  /** A new session with this one's conversation and parameters. */
  async clone({ signal } = {}) {
    this.#alive();
    checkSignal(signal);
    const c = new LanguageModel(this.#engine, { topK: this.topK, temperature: this.temperature }, this.#maxTokens);
    c.#system = [...this.#system];
    c.#turns = [...this.#turns];
    c.#usage = this.#usage;
    return c;
  }

  /** Ends the session: its answers in flight are aborted, later calls reject. */
  destroy() {
    this.#destroyed = true;
    for (const ac of this.#live) ac.abort(new DOMException("the session was destroyed", "AbortError"));
    this.#live.clear();
  }
}
