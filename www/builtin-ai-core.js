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
