// The web platform's built-in AI interfaces over the engine: `Translator`, `Summarizer`,
// `LanguageDetector` and the Prompt API's `LanguageModel`, in the shapes of their explainers'
// WebIDL (as Chrome ships them), so code written for Chrome's built-in AI runs on any WebGPU
// browser with TildeOpen. Every instance shares one engine (one download, one device; its
// parallel slots let several instances run at once).
//
//   import { install } from "tildeopen-wgpu/builtin-ai";
//   install({ model: "https://host/TildeOpen-30b-Q4_K_M.gguf" });   // only where the browser has none
//   const t = await Translator.create({ sourceLanguage: "en", targetLanguage: "lv" });
//   console.log(await t.translate("I like cakes."));
//
// One file per interface under builtin-ai/; their pure parts (language pairs, the summary
// instruction, prompt messages) are in builtin-ai-core.js.

import { configure, sharedEngine } from "./builtin-ai/shared.js";
import { Translator } from "./builtin-ai/translator.js";
import { LanguageDetector } from "./builtin-ai/detector.js";
import { Summarizer } from "./builtin-ai/summarizer.js";
import { LanguageModel } from "./builtin-ai/language-model.js";

export { configure, Translator, LanguageDetector, Summarizer, LanguageModel };
export { languageName, summaryInstruction } from "./builtin-ai-core.js";

/** The engine every instance shares (loading it on first use), for code that also wants the
 *  engine's own API. */
export function getEngine() {
  return sharedEngine();
}

const CLASSES = { Translator, LanguageDetector, Summarizer, LanguageModel };

/** Puts the classes on `globalThis` where the browser has none of its own (`force: true`
 *  replaces a native one), using `opts` (`model` and createEngine options) for every instance.
 *  Returns the names installed. */
export function install({ force = false, ...opts } = {}) {
  configure(opts);
  const installed = [];
  for (const [name, cls] of Object.entries(CLASSES)) {
    if (force || !(name in globalThis)) {
      globalThis[name] = cls;
      installed.push(name);
    }
  }
  return installed;
}
