// Types of tildeopen.js: an OpenAI-shaped chat API over the wasm engine (WebGPU).

export interface Message { role: "system" | "user" | "assistant" | "developer"; content: string }

export interface ChatRequest {
  messages?: Message[];
  /** One of the response format's tasks instead of messages. */
  task?: TaskSpec;
  max_tokens?: number;
  temperature?: number;
  top_p?: number;
  top_k?: number;
  min_p?: number;
  repetition_penalty?: number;
  presence_penalty?: number;
  frequency_penalty?: number;
  seed?: number;
  stop?: string | string[];
  stream?: boolean;
  stream_options?: { include_usage?: boolean };
  /** Accepted and ignored (the engine has one model). */
  model?: string;
  /** One choice only. */
  n?: 1;
  /** Never end at an end-of-generation token, only at `max_tokens` or a stop string (an
   *  extension, as llama.cpp and vLLM take it: for benchmarks). */
  ignore_eos?: boolean;
  /** Stops generation between tokens: a stream ends (`done`), a non-streamed request rejects
   *  with an `AbortError`. */
  signal?: AbortSignal;
}

/** What engine calls reject with: `message` is the JSON error body, and its fields are here too. */
export interface EngineError extends Error {
  type: "invalid_request_error" | "server_error" | string;
  code: string | null;
  param: string | null;
}

export type TaskSpec =
  | { type: "translate"; text: string; source: string; target: string; glossary?: [string, string][]; examples?: [string, string][] }
  | { type: "ask"; context: string; question: string }
  | { type: "summarise"; text: string; instruction?: string };

export interface Usage { prompt_tokens: number; completion_tokens: number; total_tokens: number }
export type FinishReason = "stop" | "length";

export interface ChatCompletion {
  id: string;
  object: "chat.completion";
  created: number;
  model: string;
  choices: [{ index: 0; message: { role: "assistant"; content: string }; finish_reason: FinishReason }];
  usage: Usage;
}

export interface ChatCompletionChunk {
  id: string;
  object: "chat.completion.chunk";
  created: number;
  model: string;
  choices: [{ index: 0; delta: { role?: "assistant"; content?: string }; finish_reason: FinishReason | null }];
  usage?: Usage;
}

export interface Progress { loaded: number; total: number; text: string }

export interface EngineOptions {
  /** A GGUF URL, an HF checkpoint folder URL (config.json, tokenizer files, safetensors), or a local File/Blob (GGUF). */
  model: string | Blob;
  onProgress?: (p: Progress) => void;
  /** Run in a dedicated Web Worker (default true; false runs in this thread). */
  worker?: boolean;
  /** Context window in tokens of each parallel request (default: the model's, at most 4096 and
   *  at most what the device can bind). */
  ctxSize?: number;
  /** Requests answered at once, all in the same forward passes (1 to 32). Default: 4 where
   *  one binding holds 4 KV caches of `ctxSize` tokens, else as many as fit (`Engine.parallel`
   *  says). Each slot costs a context's KV cache. More requests wait in order. */
  parallel?: number;
  /** How the KV cache stores keys and values: "f16" (default), "f32", or llama.cpp's "q8_0" /
   *  "q4_0" blocks, which take about 1/2 and 1/4 of f16's memory, so the same device holds about
   *  2x / 3.5x the context or parallel slots (q8_0 is close to lossless; q4_0 moves answers more).
   *  Needs a head_dim that is a multiple of 32 for the quantized types. */
  kvCache?: "f16" | "f32" | "q8_0" | "q4_0";
  /** Older switch: false is `kvCache: "f32"`. Leave it out when `kvCache` is given. */
  kvF16?: boolean;
  /** The `model` field of responses. */
  modelName?: string;
  /** What HF checkpoints are converted to at load: "q8_0" (default), "q4_0", "f16", "bf16". */
  quant?: string;
  /** Q/K/V and gate/up with 8-bit integer dot products on input rounded to 8 bits (Q8_0, Q4_0,
   *  Q4_1, Q4_K, Q6_K weights), where WGSL has them (`AdapterInfo.integerDot`). Lossy: off by
   *  default. */
  intDot?: boolean;
  /** The RMSNorm computed inside the matrix kernels that consume it (fewer dispatches). Default:
   *  on, except on CPU adapters (software WebGPU such as SwiftShader), where it measured slower. */
  normFold?: boolean;
  /** Keep downloaded weights in the Cache API (default true). */
  cache?: boolean;
  /** Where tildeopen_bg.wasm is (default: next to pkg/tildeopen.js, found with
   *  `new URL(..., import.meta.url)`). Needed with bundlers that do not copy it, such as esbuild. */
  wasmUrl?: string | URL;
  /** The worker script for `worker: true` (default: worker.js of this package). With esbuild,
   *  bundle "tildeopen-wgpu/worker" as its own entry point and give its URL. */
  workerUrl?: string | URL;
}

export interface AdapterInfo {
  vendor: string;
  architecture: string;
  device: string;
  description: string;
  shaderF16: boolean;
  subgroups: boolean;
  /** WGSL's `packed_4x8_integer_dot_product` (what `EngineOptions.intDot` needs). */
  integerDot: boolean;
  /** "vendor architecture device · shader-f16: yes|no · subgroups: yes|no" */
  summary: string;
}

type Common = Omit<ChatRequest, "messages" | "task">;

/** A task: streamed with `stream: true`, one completion otherwise. */
export interface TaskCall<A> {
  (a: Omit<Common, "stream"> & A & { stream: true }): Promise<AsyncIterableIterator<ChatCompletionChunk>>;
  (a: Omit<Common, "stream"> & A & { stream?: false }): Promise<ChatCompletion>;
  (a: Omit<Common, "stream"> & A & { stream?: boolean }): Promise<ChatCompletion | AsyncIterableIterator<ChatCompletionChunk>>;
}

/** What the engine has done since it was loaded, as of its last forward pass. */
export interface EngineStats {
  /** Forward passes run. */
  passes: number;
  /** Prompt tokens computed by the model. */
  prefilled: number;
  /** Prompt tokens already in the slot's own cache (an earlier turn of the same chat). */
  reused: number;
  /** Prompt tokens copied from another slot's cache (a shared instruction). */
  copied: number;
  /** Tokens generated. */
  generated: number;
}

export interface Engine {
  modelName: string;
  contextSize: number;
  /** The KV cache's type (the `kvCache` option's, or "f16"). */
  kvCache: "f16" | "f32" | "q8_0" | "q4_0";
  /** Requests answered at once; concurrent calls beyond it wait in a FIFO queue (an aborted
   *  signal takes a request out of the queue or its slot at once). */
  parallel: number;
  stats(): Promise<EngineStats>;
  /** The prompt tokens a request would take, also beyond the context window (rejects with its other errors, as `create`). */
  countTokens(req: ChatRequest): Promise<number>;
  /** The adapter in one line (AdapterInfo.summary). */
  adapter: string;
  adapterInfo: AdapterInfo | null;
  /** The optional kernel paths the engine uses: "fused", "split_attention", "query_tiles", "norm_fold",
   *  "int_dot" (only with `intDot`). */
  fastPaths: string[];
  chat: {
    completions: {
      create(req: ChatRequest & { stream: true }): Promise<AsyncIterableIterator<ChatCompletionChunk>>;
      create(req: ChatRequest & { stream?: false }): Promise<ChatCompletion>;
      create(req: ChatRequest & { stream?: boolean }): Promise<ChatCompletion | AsyncIterableIterator<ChatCompletionChunk>>;
    };
  };
  tasks: {
    translate: TaskCall<{ text: string; from: string; to: string; glossary?: [string, string][]; examples?: [string, string][] }>;
    ask: TaskCall<{ context: string; question: string }>;
    summarise: TaskCall<{ text: string; instruction?: string }>;
  };
  /** Frees the GPU memory (and ends the worker). */
  unload(): Promise<void>;
}

/** Loads a model. Errors reject with an EngineError. */
export function createEngine(opts: EngineOptions): Promise<Engine>;
export function createEngineInThread(opts: EngineOptions): Promise<Engine>;
/** The chat request of a task, e.g. taskRequest("translate", { text, from, to }). */
export function taskRequest(type: "translate" | "ask" | "summarise", args: Record<string, unknown>): ChatRequest;
/** The WebGPU adapter the engine would use, or null without WebGPU. */
export function adapterInfo(): Promise<AdapterInfo | null>;
/** Whether the Cache API holds weights of this model URL (loaded before in this origin). */
export function isCached(url: string): Promise<boolean>;
/** Forgets the downloaded weights kept in the Cache API. */
export function clearCache(): Promise<void>;
/** The language `text` is in (no model needed): an ISO 639-1 code where one exists, the
 *  detector's confidence, and whether it calls the guess reliable (short texts often are not). */
export function detectLanguage(text: string, opts?: { wasmUrl?: string | URL }): Promise<{ language: string; confidence: number; reliable: boolean } | null>;
