// Types of builtin-ai.js: the Translator and Language Detector APIs' shapes over the engine.
import type { Engine, EngineOptions } from "./tildeopen.js";

export type Availability = "unavailable" | "downloadable" | "downloading" | "available";

/** What `monitor` receives: `downloadprogress` events whose `loaded` rises from 0 to 1. */
export interface CreateMonitor extends EventTarget {}

export interface TranslatorCreateOptions {
  sourceLanguage: string;
  targetLanguage: string;
  signal?: AbortSignal;
  monitor?: (m: CreateMonitor) => void;
  /** Extension: terms and their translations, passed to the translation task. */
  glossary?: [string, string][];
  /** Extension: example sentence pairs, passed to the translation task. */
  examples?: [string, string][];
}

export declare class Translator {
  static availability(o: { sourceLanguage: string; targetLanguage: string }): Promise<Availability>;
  static create(o: TranslatorCreateOptions): Promise<Translator>;
  readonly sourceLanguage: string;
  readonly targetLanguage: string;
  /** Prompt tokens (the instruction included) one call may take. */
  readonly inputQuota: number;
  translate(input: string, o?: { signal?: AbortSignal }): Promise<string>;
  translateStreaming(input: string, o?: { signal?: AbortSignal }): ReadableStream<string>;
  measureInputUsage(input: string, o?: { signal?: AbortSignal }): Promise<number>;
  destroy(): void;
}

export declare class LanguageDetector {
  static availability(o?: { expectedInputLanguages?: string[] }): Promise<Availability>;
  static create(o?: { expectedInputLanguages?: string[]; signal?: AbortSignal; monitor?: (m: CreateMonitor) => void }): Promise<LanguageDetector>;
  readonly expectedInputLanguages: string[] | null;
  readonly inputQuota: number;
  detect(input: string, o?: { signal?: AbortSignal }): Promise<{ detectedLanguage: string; confidence: number }[]>;
  measureInputUsage(input: string): Promise<number>;
  destroy(): void;
}

/** Sets the model (and createEngine options) every instance uses. */
export function configure(opts: EngineOptions): void;
/** Puts Translator and LanguageDetector on globalThis where the browser has none (`force`:
 *  also over a native one); returns the names installed. */
export function install(opts: EngineOptions & { force?: boolean }): string[];
/** The engine every instance shares. */
export function getEngine(): Promise<Engine>;
/** The English name of a supported language tag, or null. */
export function languageName(tag: string): string | null;
