// Types of builtin-ai.js: the Translator, Summarizer, Language Detector and Prompt APIs' shapes
// over the engine. Members the specifications have and this module does not are listed in the
// README's table (docs/browser.md).
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

export type SummarizerType = "key-points" | "tldr" | "teaser" | "headline";
export type SummarizerFormat = "markdown" | "plain-text";
export type SummarizerLength = "short" | "medium" | "long";

export interface SummarizerCreateOptions {
  type?: SummarizerType;
  format?: SummarizerFormat;
  length?: SummarizerLength;
  sharedContext?: string;
  expectedInputLanguages?: string[];
  expectedContextLanguages?: string[];
  outputLanguage?: string;
  signal?: AbortSignal;
  monitor?: (m: CreateMonitor) => void;
}

export declare class Summarizer {
  static availability(o?: SummarizerCreateOptions): Promise<Availability>;
  static create(o?: SummarizerCreateOptions): Promise<Summarizer>;
  readonly sharedContext: string;
  readonly type: SummarizerType;
  readonly format: SummarizerFormat;
  readonly length: SummarizerLength;
  readonly expectedInputLanguages: string[] | null;
  readonly expectedContextLanguages: string[] | null;
  readonly outputLanguage: string | null;
  /** Prompt tokens (instruction and context included) one call may take. */
  readonly inputQuota: number;
  summarize(input: string, o?: { context?: string; signal?: AbortSignal }): Promise<string>;
  summarizeStreaming(input: string, o?: { context?: string; signal?: AbortSignal }): ReadableStream<string>;
  measureInputUsage(input: string, o?: { context?: string; signal?: AbortSignal }): Promise<number>;
  destroy(): void;
}

export type LanguageModelRole = "system" | "user" | "assistant";
export interface LanguageModelMessage {
  role?: LanguageModelRole;
  /** Text only: image and audio parts are refused with NotSupportedError. */
  content: string | { type: "text"; value: string }[];
}
export type LanguageModelPrompt = string | LanguageModelMessage[];
export interface LanguageModelExpected { type: "text" | "image" | "audio"; languages?: string[] }

export interface LanguageModelCreateOptions {
  /** Both or neither (NotSupportedError otherwise); clamped to params()'s maxima. */
  topK?: number;
  temperature?: number;
  /** A system message may come first only. */
  initialPrompts?: LanguageModelMessage[];
  expectedInputs?: LanguageModelExpected[];
  expectedOutputs?: LanguageModelExpected[];
  signal?: AbortSignal;
  monitor?: (m: CreateMonitor) => void;
  /** Extension: the most tokens one answer may take (default: the rest of the context window). */
  maxTokens?: number;
}

export interface LanguageModelPromptOptions {
  signal?: AbortSignal;
  /** Extension: answer from this text alone with the question-answering task. */
  context?: string;
  /** Not supported: NotSupportedError. */
  responseConstraint?: unknown;
}

export declare class LanguageModel extends EventTarget {
  static availability(o?: LanguageModelCreateOptions): Promise<Availability>;
  static params(): Promise<{ defaultTopK: number; maxTopK: number; defaultTemperature: number; maxTemperature: number }>;
  static create(o?: LanguageModelCreateOptions): Promise<LanguageModel>;
  readonly topK: number;
  readonly temperature: number;
  readonly contextWindow: number;
  readonly contextUsage: number;
  oncontextoverflow: ((e: Event) => void) | null;
  prompt(input: LanguageModelPrompt, o?: LanguageModelPromptOptions): Promise<string>;
  promptStreaming(input: LanguageModelPrompt, o?: LanguageModelPromptOptions): ReadableStream<string>;
  append(input: LanguageModelPrompt, o?: { signal?: AbortSignal }): Promise<void>;
  measureContextUsage(input: LanguageModelPrompt, o?: { signal?: AbortSignal }): Promise<number>;
  clone(o?: { signal?: AbortSignal }): Promise<LanguageModel>;
  destroy(): void;
}

/** Sets the model (and createEngine options) every instance uses. */
export function configure(opts: EngineOptions): void;
/** Puts Translator, LanguageDetector, Summarizer and LanguageModel on globalThis where the browser has none (`force`:
 *  also over a native one); returns the names installed. */
export function install(opts: EngineOptions & { force?: boolean }): string[];
/** The engine every instance shares. */
export function getEngine(): Promise<Engine>;
/** The English name of a supported language tag, or null. */
export function languageName(tag: string): string | null;
/** The summarisation task's instruction for Summarizer options (and a call's context). */
export function summaryInstruction(o: { type: SummarizerType; format: SummarizerFormat; length: SummarizerLength; sharedContext?: string; outputLanguage?: string | null }, context?: string): string;
