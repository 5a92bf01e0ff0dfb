// `LanguageDetector` in the shape of the Language Detector API, from the detector compiled into
// the wasm (the one the page translator uses): no model to download.

import { detectLanguage } from "../tildeopen.js";
import { checkSignal, configured, monitorTarget } from "./shared.js";

export class LanguageDetector {
  #destroyed = false;

  static async availability() {
    return "available";
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
    const d = await detectLanguage(String(input), { wasmUrl: configured()?.wasmUrl });
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
