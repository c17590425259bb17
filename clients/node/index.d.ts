// Types of ignis-client: the request and response shapes of the official `openai` package's chat
// completions, completions, embeddings and models, with the sampling fields ignis adds.

export interface ClientOptions {
  /** Model name -> the directory `ignis compile MODEL -o DIR` wrote; or a list of such
   * directories, each model then known by the name it was compiled as. */
  models?: Record<string, string> | string[];
  /** Where model names with no library go, e.g. "http://127.0.0.1:8000/v1" (`ignis serve`). */
  baseURL?: string | null;
  /** Bearer token for baseURL (default: the OPENAI_API_KEY environment variable). */
  apiKey?: string;
  /** ignis_open's options, for every library: see ignis_model.h. */
  options?: NativeOptions;
  /** Headers sent with every request to baseURL. */
  defaultHeaders?: Record<string, string>;
  /** A fetch to use for baseURL instead of the global one. */
  fetch?: typeof globalThis.fetch;
  /** How many chunks a local stream may hold unread before its generation is cancelled (its
   * reader then gets the chunks held, then a StreamOverflowError). A whole number >= 1, or
   * Infinity for no limit; default 4096. */
  maxBufferedChunks?: number;
}

export interface NativeOptions {
  threads?: number;
  kernels?: string;
  kv_dtype?: 'auto' | 'f32' | 'f16';
  verify_weights?: boolean;
  huge_pages?: boolean;
}

/** Per-request options. */
export interface RequestOptions {
  /** Aborts the request, as the official client's signal does: already aborted, create() rejects
   * with APIUserAbortError and nothing is sent or started; aborted before create() has resolved,
   * it rejects with APIUserAbortError; aborted later, a stream's loop ends quietly. For a compiled
   * model, a stream's generation stops at its next chunk, and a call still waiting for the handle
   * (calls on one handle run in turn) never runs. A call that is not streamed, once the library has
   * started it, cannot be stopped (the library can only cancel streams): create() rejects at once,
   * but the generation runs to its end on its worker thread, and the handle's later calls (and
   * close()) wait for it. */
  signal?: AbortSignal;
  /** Extra headers (baseURL requests only). */
  headers?: Record<string, string>;
}

// ---- requests ---------------------------------------------------------------------------------

export interface ChatCompletionContentPartText {
  type: 'text';
  text: string;
}

export interface ChatCompletionMessageParam {
  role: 'system' | 'developer' | 'user' | 'assistant' | 'tool';
  content: string | ChatCompletionContentPartText[] | null;
  name?: string;
  tool_call_id?: string;
}

export interface StreamOptions {
  include_usage?: boolean;
}

/** Sampling fields shared by chat completions and completions (the last five are ignis's). */
export interface SamplingParams {
  model: string;
  max_tokens?: number | null;
  temperature?: number | null;
  top_p?: number | null;
  n?: number | null;
  stop?: string | string[] | null;
  seed?: number | null;
  presence_penalty?: number | null;
  frequency_penalty?: number | null;
  logit_bias?: Record<string, number> | null;
  user?: string;
  stream_options?: StreamOptions | null;
  top_k?: number;
  min_p?: number;
  repetition_penalty?: number;
  ignore_eos?: boolean;
  split_special_tokens?: boolean;
}

export interface ChatCompletionCreateParamsBase extends SamplingParams {
  messages: ChatCompletionMessageParam[];
  max_completion_tokens?: number | null;
  logprobs?: boolean | null;
  top_logprobs?: number | null;
  response_format?: { type: 'text' | 'json_object' | 'json_schema'; [key: string]: unknown };
  chat_template_kwargs?: Record<string, unknown>;
  stream?: boolean | null;
}
export interface ChatCompletionCreateParamsNonStreaming extends ChatCompletionCreateParamsBase {
  stream?: false | null;
}
export interface ChatCompletionCreateParamsStreaming extends ChatCompletionCreateParamsBase {
  stream: true;
}
export type ChatCompletionCreateParams = ChatCompletionCreateParamsNonStreaming | ChatCompletionCreateParamsStreaming;

export interface CompletionCreateParamsBase extends SamplingParams {
  prompt: string | string[] | number[] | number[][];
  logprobs?: number | null;
  echo?: boolean | null;
  suffix?: string | null;
  stream?: boolean | null;
}
export interface CompletionCreateParamsNonStreaming extends CompletionCreateParamsBase {
  stream?: false | null;
}
export interface CompletionCreateParamsStreaming extends CompletionCreateParamsBase {
  stream: true;
}
export type CompletionCreateParams = CompletionCreateParamsNonStreaming | CompletionCreateParamsStreaming;

export interface EmbeddingCreateParams {
  model: string;
  input: string | string[] | number[] | number[][];
  encoding_format?: 'float' | 'base64';
  dimensions?: number;
  user?: string;
  /** ignis: how token states are pooled (default "mean"). */
  pooling?: 'mean' | 'last';
}

// ---- responses --------------------------------------------------------------------------------

export interface CompletionUsage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details?: { cached_tokens?: number | null; audio_tokens?: number | null } | null;
  completion_tokens_details?: Record<string, number | null> | null;
}

export type FinishReason = 'stop' | 'length' | 'tool_calls' | 'content_filter' | 'function_call';

export interface ChatCompletionMessage {
  role: 'assistant';
  content: string | null;
  refusal: string | null;
  tool_calls?: unknown[] | null;
  /** ignis: a thinking model's reasoning, when the server separates it. */
  reasoning_content?: string | null;
}

export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  choices: Array<{
    index: number;
    message: ChatCompletionMessage;
    finish_reason: FinishReason;
    logprobs: unknown | null;
  }>;
  usage?: CompletionUsage | null;
  system_fingerprint?: string | null;
  service_tier?: string | null;
}

export interface ChatCompletionChunk {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
  choices: Array<{
    index: number;
    delta: { role?: 'assistant'; content?: string | null; refusal?: string | null; tool_calls?: unknown[] | null };
    finish_reason: FinishReason | null;
    logprobs?: unknown | null;
  }>;
  usage?: CompletionUsage | null;
  system_fingerprint?: string | null;
  service_tier?: string | null;
}

export interface CompletionLogprobs {
  tokens?: string[];
  token_logprobs?: number[];
  top_logprobs?: Array<Record<string, number>>;
  text_offset?: number[];
}

export interface Completion {
  id: string;
  object: 'text_completion';
  created: number;
  model: string;
  choices: Array<{
    index: number;
    text: string;
    finish_reason: 'stop' | 'length' | 'content_filter' | null;
    logprobs: CompletionLogprobs | null;
  }>;
  usage?: CompletionUsage | null;
  system_fingerprint?: string | null;
}

export interface Embedding {
  object: 'embedding';
  index: number;
  /** Numbers, or with encoding_format "base64" the little-endian float32 bytes in base64. */
  embedding: number[] | string;
}

export interface CreateEmbeddingResponse {
  object: 'list';
  data: Embedding[];
  model: string;
  usage: { prompt_tokens: number; total_tokens: number };
}

export interface Model {
  id: string;
  object: 'model';
  created: number;
  owned_by: string;
}

export interface ModelsPage extends AsyncIterable<Model> {
  object: 'list';
  data: Model[];
}

// ---- streams and errors -----------------------------------------------------------------------

/** A stream of chunks; leaving a `for await` loop early or controller.abort() stops generating. */
export class Stream<Item> implements AsyncIterable<Item> {
  controller: AbortController;
  [Symbol.asyncIterator](): AsyncIterator<Item>;
}

export class OpenAIError extends Error {}

export interface ErrorObject {
  message: string;
  type?: string;
  param?: string | null;
  code?: string | null;
}

export class APIError extends OpenAIError {
  constructor(status: number | undefined, error: ErrorObject | undefined, message: string | undefined,
              headers?: Headers);
  /** The HTTP status (the one `ignis serve` would answer for a library's error object). */
  readonly status: number | undefined;
  readonly headers: Headers | undefined;
  readonly requestID: string | undefined;
  readonly error: ErrorObject | undefined;
  readonly code: string | null | undefined;
  readonly param: string | null | undefined;
  readonly type: string | undefined;
  static makeMessage(status: number | undefined, error: ErrorObject | undefined, message: string | undefined): string;
  static generate(status: number, error: ErrorObject | undefined, message: string | undefined,
                  headers?: Headers): APIError;
}
export class BadRequestError extends APIError {}
export class AuthenticationError extends APIError {}
export class PermissionDeniedError extends APIError {}
export class NotFoundError extends APIError {}
export class ConflictError extends APIError {}
export class UnprocessableEntityError extends APIError {}
export class RateLimitError extends APIError {}
export class InternalServerError extends APIError {}
export class APIConnectionError extends APIError {
  constructor(opts?: { message?: string; cause?: unknown });
}
/** A request aborted by its signal before create() resolved (or a local one still waiting for
 * the handle when close() was called). */
export class APIUserAbortError extends APIError {
  constructor(opts?: { message?: string });
}
/** A local stream left unread until maxBufferedChunks chunks waited: its generation was cancelled
 * (the handle freed); its reader gets the chunks held, then this. */
export class StreamOverflowError extends OpenAIError {}
/** A compiled-model directory that cannot be used, or a Client used after close(). */
export class NativeLibraryError extends OpenAIError {}

// ---- the client -------------------------------------------------------------------------------

export interface NativeModel {
  readonly directory: string;
  /** The name the library was compiled as (manifest.json's "model"). */
  readonly name: string;
  readonly manifest: Record<string, unknown>;
  readonly closed: boolean;
  /** ignis_model_info: kernels, threads, context, the compiled model's record. */
  info(): Record<string, unknown>;
}

export class Client {
  constructor(config?: ClientOptions);
  readonly baseURL: string | null;
  /** The compiled models this client opened, by the names it knows them by. */
  readonly local: ReadonlyMap<string, NativeModel>;
  chat: {
    completions: {
      create(body: ChatCompletionCreateParamsNonStreaming, options?: RequestOptions): Promise<ChatCompletion>;
      create(body: ChatCompletionCreateParamsStreaming, options?: RequestOptions): Promise<Stream<ChatCompletionChunk>>;
      create(body: ChatCompletionCreateParamsBase, options?: RequestOptions):
        Promise<ChatCompletion | Stream<ChatCompletionChunk>>;
    };
  };
  completions: {
    create(body: CompletionCreateParamsNonStreaming, options?: RequestOptions): Promise<Completion>;
    create(body: CompletionCreateParamsStreaming, options?: RequestOptions): Promise<Stream<Completion>>;
    create(body: CompletionCreateParamsBase, options?: RequestOptions): Promise<Completion | Stream<Completion>>;
  };
  embeddings: {
    create(body: EmbeddingCreateParams, options?: RequestOptions): Promise<CreateEmbeddingResponse>;
  };
  models: {
    list(options?: RequestOptions): Promise<ModelsPage>;
  };
  /** Cancel open streams (one still waiting for its handle rejects with APIUserAbortError), wait
   * for running calls, close every library handle (twice is safe). */
  close(): Promise<void>;
}

export default Client;
