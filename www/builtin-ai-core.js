// Pure helpers of builtin-ai.js (tested with node: tests/web/builtin-ai-test.mjs): which
// language pairs the model is offered for, named as the specifications name languages (BCP 47).
import { LANGUAGES } from "./extension/languages.js";

/** The primary language subtag of a BCP 47 tag ("en-GB" -> "en"), lower case; null if none. */
export function primary(tag) {
  if (typeof tag !== "string") return null;
  const p = tag.trim().toLowerCase().split(/[-_]/)[0];
  return /^[a-z]{2,3}$/.test(p) ? p : null;
}

/** Why a pair cannot be translated (a message for NotSupportedError), or null when it can. */
export function pairError(source, target) {
  const [s, t] = [primary(source), primary(target)];
  if (!s || !t) return `sourceLanguage and targetLanguage must be BCP 47 language tags (got ${JSON.stringify(source)}, ${JSON.stringify(target)})`;
  if (!Object.hasOwn(LANGUAGES, s)) return `${source} is not a language this model translates from`;
  if (!Object.hasOwn(LANGUAGES, t)) return `${target} is not a language this model translates into`;
  if (s === t) return "sourceLanguage and targetLanguage are the same language";
  return null;
}

/** The English name of a supported language code, or null. */
export function languageName(tag) {
  const p = primary(tag);
  return p && Object.hasOwn(LANGUAGES, p) ? LANGUAGES[p] : null;
}

// --- Summarizer ---------------------------------------------------------------------------

/** The Summarizer API's enums and defaults (its WebIDL). */
export const SUMMARIZER = {
  type: ["key-points", "tldr", "teaser", "headline"],
  format: ["markdown", "plain-text"],
  length: ["short", "medium", "long"],
  defaults: { type: "key-points", format: "markdown", length: "short" },
};

const SIZES = {
  "key-points": ["3 bullet points", "5 bullet points", "7 bullet points"],
  tldr: ["one sentence", "three sentences", "five sentences"],
  teaser: ["one sentence", "three sentences", "five sentences"],
  headline: ["at most 12 words", "at most 17 words", "at most 22 words"],
};

/** The Summarizer options with defaults filled in; a value outside an enum is a TypeError (as
 *  WebIDL converts enums); a language the model does not offer is `error` (NotSupportedError). */
export function summarizerOptions(o = {}) {
  const out = { ...SUMMARIZER.defaults };
  for (const k of ["type", "format", "length"]) {
    if (o[k] === undefined) continue;
    if (!SUMMARIZER[k].includes(o[k])) throw new TypeError(`${k} must be one of ${SUMMARIZER[k].map((v) => JSON.stringify(v)).join(", ")} (got ${JSON.stringify(o[k])})`);
    out[k] = o[k];
  }
  out.sharedContext = o.sharedContext === undefined ? "" : String(o.sharedContext);
  out.expectedInputLanguages = o.expectedInputLanguages ?? null;
  out.expectedContextLanguages = o.expectedContextLanguages ?? null;
  out.outputLanguage = o.outputLanguage ?? null;
  out.error = languagesError([...(out.expectedInputLanguages ?? []), ...(out.expectedContextLanguages ?? []), ...(out.outputLanguage ? [out.outputLanguage] : [])]);
  return out;
}

/** Why a list of language tags cannot be served (a message), or null. */
export function languagesError(tags) {
  for (const t of tags) {
    const p = primary(t);
    if (!p || !Object.hasOwn(LANGUAGES, p)) return `${JSON.stringify(t)} is not a language this model is offered for`;
  }
  return null;
}

/** The instruction of the response format's summarisation task for these options, with the
 *  shared context and a call's own `context`. */
export function summaryInstruction(o, context = "") {
  const i = SUMMARIZER.length.indexOf(o.length);
  const size = SIZES[o.type][i];
  const markdown = o.format === "markdown";
  let s = {
    "key-points": `Summarise the key points of the following text as ${size}${markdown ? ', each a Markdown list item starting with "- "' : ", one per line, without Markdown"}.`,
    tldr: `Summarise the following text in ${size}: a short overview for a busy reader.`,
    teaser: `Write a teaser of ${size} for the following text: its most interesting or intriguing parts, to draw the reader in.`,
    headline: `Write a headline of ${size} for the following text: one sentence, its main point.`,
  }[o.type];
  if (o.type !== "key-points") s += markdown ? " Markdown is allowed." : " Plain text, no Markdown.";
  const lang = o.outputLanguage ? languageName(o.outputLanguage) : null;
  if (lang) s += ` Write it in ${lang}.`;
  const ctx = [o.sharedContext, context].map((c) => String(c ?? "").trim()).filter(Boolean);
  if (ctx.length) s += ` Background: ${ctx.join(" ")}`;
  return s;
}

/** A summary's room in tokens for its length (the headline and short ones are short). */
export function summaryMaxTokens(o) {
  return { short: 128, medium: 256, long: 512 }[o.length] * (o.type === "headline" ? 0.5 : 1);
}

// --- LanguageModel (the Prompt API) -------------------------------------------------------

/** The Prompt API's `params()`: sampling defaults and limits. */
export const LANGUAGE_MODEL_PARAMS = Object.freeze({ defaultTopK: 3, maxTopK: 128, defaultTemperature: 1, maxTemperature: 2 });

/** `topK` and `temperature` as a request's `top_k` / `temperature`: both or neither (else
 *  NotSupportedError, as Chrome has it), clamped to the maxima. Returns `{ error }` or the params. */
export function samplingOptions({ topK, temperature } = {}) {
  if ((topK === undefined) !== (temperature === undefined)) return { error: "give both topK and temperature, or neither" };
  const P = LANGUAGE_MODEL_PARAMS;
  const k = topK === undefined ? P.defaultTopK : Number(topK);
  const t = temperature === undefined ? P.defaultTemperature : Number(temperature);
  if (!Number.isFinite(k) || k < 1) return { error: `topK must be at least 1 (got ${topK})` };
  if (!Number.isFinite(t) || t < 0) return { error: `temperature must be at least 0 (got ${temperature})` };
  return { topK: Math.min(Math.floor(k), P.maxTopK), temperature: Math.min(t, P.maxTemperature) };
}

/** A prompt (a string, or an array of `{ role, content }` where content is a string or an
 *  array of `{ type: "text", value }`) as chat messages. `{ error, name }` for what the
 *  specification refuses: a TypeError for a malformed message or a system message after the
 *  first place (`systemAllowed`), NotSupportedError for image or audio content. */
export function promptMessages(input, systemAllowed = false) {
  if (typeof input === "string") return [{ role: "user", content: input }];
  if (!Array.isArray(input)) return [{ role: "user", content: String(input) }];
  const out = [];
  for (const [i, m] of input.entries()) {
    if (!m || typeof m !== "object") return { name: "TypeError", error: `message ${i} is not an object` };
    const role = m.role ?? "user";
    if (!["system", "user", "assistant"].includes(role)) return { name: "TypeError", error: `message ${i}: role must be "system", "user" or "assistant" (got ${JSON.stringify(role)})` };
    if (role === "system" && !(systemAllowed && i === 0)) return { name: "TypeError", error: "a system message may only be the first of initialPrompts" };
    let content = m.content;
    if (Array.isArray(content)) {
      const parts = [];
      for (const p of content) {
        if (p?.type !== "text") return { name: "NotSupportedError", error: `${JSON.stringify(p?.type)} content is not supported: this model reads text only` };
        parts.push(String(p.value));
      }
      content = parts.join("");
    } else if (typeof content !== "string") {
      return { name: "TypeError", error: `message ${i}: content must be a string or an array of parts` };
    }
    out.push({ role, content });
  }
  return out;
}

/** The history with the oldest exchanges dropped (the system message kept) until `fits(msgs)`
 *  holds; null when even the system message and the newest turn do not fit. */
export async function trimHistory(system, turns, fits) {
  const keep = [...turns];
  for (;;) {
    const msgs = [...system, ...keep];
    if (await fits(msgs)) return keep;
    if (keep.length === 0) return null;
    keep.shift();
  }
}
