/* ignis_model.h — the C ABI of a model compiled by `ignis compile MODEL -o DIR`.
 *
 * DIR holds libignis_<name>.so (this ABI), this header, weights.bin and manifest.json. The library
 * carries the model's compiled step (the planned tape, arena and scratch sizes, the KV layout), the
 * C kernels with their run-time CPU dispatch, and the hash of the weights it was built with; it
 * links only libc, libm and libpthread. No Python is involved at run time.
 *
 *     ignis_model *m = ignis_open("DIR", NULL);          // or "{\"threads\": 2}"
 *     if (!m) { fprintf(stderr, "%s\n", ignis_last_error()); return 1; }
 *     int32_t out[64];
 *     int n = ignis_generate_ids(m, prompt, n_prompt, 64, out, 64);
 *     ignis_close(m);
 *
 * Threads: any number of handles per process; calls on one handle are serialised by the handle's
 * mutex (a second caller waits), calls on different handles run concurrently. ignis_last_error()
 * is per thread. The kernels' worker threads start with the first multi-threaded step and live
 * as long as the process: a program that dlopen()s the library must not dlclose() it.
 *
 * Versioning. ignis_abi_version() is IGNIS_ABI_VERSION of the library. It is bumped when a
 * function here changes its signature or meaning, or a function is removed; adding a function
 * does not bump it. manifest.json records the ABI version and the weights layout version
 * (IGNIS_WEIGHTS_FORMAT_VERSION) the directory was written for; ignis_open refuses a directory
 * whose manifest names other versions, a weights.bin of another size or hash than the library was
 * built with, or a library whose baked model data is of another format version than its runtime,
 * each with an error naming both values. The library also exports ig_testonly_chat_forced, an entry
 * for ignis's own tests: it is not part of this ABI (not declared here; it may change or go in
 * any version).
 *
 * Weights check at open (time to first token matters, and weights.bin is hundreds of MB):
 *   default        the size of weights.bin, its header, and the SHA-256 of 256 chunks of 4 KiB
 *                  spread evenly over the file (the first and the last included), against the
 *                  digest baked into the library: a truncated, extended, swapped or re-written
 *                  file is refused; one flipped byte outside the sampled chunks is not noticed.
 *   {"verify_weights": true}   the SHA-256 of the whole file against manifest.json's "sha256"
 *                  (also baked into the library): every damaged byte is refused, at the cost of
 *                  reading and hashing the whole file (portable C SHA-256, about 3-4 s per GB on
 *                  a 2020s x86 core; the default check takes about a millisecond).
 * Either way manifest.json's "sha256" must equal the library's.
 *
 * options_json (NULL or a flat JSON object; an unknown key is an error):
 *   "threads": N          kernel threads (default: the CPUs this process may use: its affinity
 *                         mask, capped by a cgroup CPU quota, as the Python package counts them)
 *   "kernels": "NAME"     force a kernel table ("generic", "avx2", "avx512", ...; default: the
 *                         best this CPU supports, or the IGNIS_KERNELS environment variable)
 *   "kv_dtype": "auto"|"f32"|"f16"   KV cache storage (auto: f16 where the table's attention reads
 *                         it at f32's speed, as ignis.load does, f32 with f32 weights)
 *   "verify_weights": true|false     the whole-file SHA-256 above (default false)
 *   "huge_pages": true|false   copy the packed weights into 2 MB-page memory at open, as the
 *                         Python path does (default true; IGNIS_HUGEPAGES=0 turns the default off)
 *
 * The JSON entry points take an OpenAI request body and return the response body (a malloc'd
 * string: free it with ignis_free). A bad request is answered with an OpenAI error object,
 * {"error": {"message", "type", "param", "code"}}, worded as `ignis serve` words it (and
 * ignis_last_error() holds its message); NULL only when even that cannot be written (no memory).
 */
#ifndef IGNIS_MODEL_H
#define IGNIS_MODEL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IGNIS_ABI_VERSION 1
#define IGNIS_WEIGHTS_FORMAT_VERSION 1

typedef struct ignis_model ignis_model;

/* IGNIS_ABI_VERSION of this library. */
int ignis_abi_version(void);

/* Open the compiled model in `dir` (manifest.json and weights.bin beside the library, or any
 * directory holding the same files). A library compiled with --embed-weights holds its weights:
 * `dir` (then only its manifest.json is read and checked) may be NULL. NULL on error:
 * ignis_last_error() says why. */
ignis_model *ignis_open(const char *dir, const char *options_json);

/* This thread's last error message ("" when none). Valid until the thread's next failing call. */
const char *ignis_last_error(void);

/* Greedy decoding from token ids: runs the prompt as a new sequence (the KV cache is reset), then
 * appends the highest-scoring token (among the tokenizer's own ids: padding rows of the output
 * layer are never chosen; the first on a tie) until an end-of-sequence id of the model (not
 * written), max_new ids, out_cap ids or the end of the context. Returns the number of ids written
 * to out, or -1 on error (ignis_last_error()). */
int ignis_generate_ids(ignis_model *m, const int32_t *prompt, int n_prompt, int max_new,
                       int32_t *out, int out_cap);

/* The logits of the last prompt position (the prompt run as a new sequence) into logits[0..vocab).
 * Returns the vocabulary size, or -1 on error (prompt ids out of range, cap < vocabulary size). */
int ignis_logits(ignis_model *m, const int32_t *prompt, int n_prompt, float *logits, int cap);

/* A streamed chunk (its JSON text, valid during the call only) for the caller; returning nonzero
 * stops the generation (the call then answers an error object with code "cancelled"). The callback
 * runs on the calling thread with the handle locked: it must not call the same handle. */
typedef int (*ignis_chunk_cb)(const char *chunk_json, void *user);

/* POST /v1/completions: {"model": the compiled model's name, "prompt": a string or a list of token
 * ids, "max_tokens" (default 16, shortened to the room the context has left), "temperature",
 * "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
 * "logit_bias", "seed", "stop" (a string or up to 4), "ignore_eos", "split_special_tokens",
 * "stream", "stream_options": {"include_usage"}, "user", ...} -> {"id": "cmpl-...", "object":
 * "text_completion", "created", "model", "choices": [{"index": 0, "text", "finish_reason":
 * "stop"|"length", "logprobs": null}], "usage": {...}, "system_fingerprint"}. The model's
 * generation defaults (generation_config.json) apply to what the request leaves out, as in ignis
 * serve; a seed gives the text ignis serve gives for the same request. Text is released only when
 * final: whole characters and grapheme clusters, never the start of a possible stop string. With
 * "stream": true every "text_completion" chunk goes to cb (the server's stream events, in order:
 * text chunks, one with the finish_reason, with include_usage one with the usage) and the return
 * value is the whole response, as without streaming. "prompt" may also be a list of strings or of
 * token-id lists (not streamed), and "n" asks for several choices: they run in turn, choice j of
 * prompt p at index p * n + j, seeded seed + j, as ignis serve runs them on one KV slot.
 * "logprobs": N (0..5) gives the legacy logprobs object (tokens, token_logprobs, top_logprobs,
 * text_offset); streamed, each chunk carries the tokens whose text it completes. Not in this
 * version: echo, suffix, constrained decoding (response_format, guided_*): each is answered with
 * an error object saying so. Every call runs its whole prompt (no KV prefix reuse
 * across calls: usage.prompt_tokens_details.cached_tokens is 0). Needs the tokenizer (compiled in
 * when ignis can carry it to C; else an error object says why). */
char *ignis_completions(ignis_model *m, const char *request_json, ignis_chunk_cb cb, void *user);

/* POST /v1/chat/completions: {"model", "messages": [{"role": "system"|"developer"|"user"|
 * "assistant"|"tool", "content": a string or text parts}, ...], "max_tokens" /
 * "max_completion_tokens" (default: generation_config's max_new_tokens, else the room the context
 * has left), the sampling fields of ignis_completions, "chat_template_kwargs" (keys are Python
 * identifiers, str.isidentifier by the Unicode 14.0 tables of Python 3.11, as the server built
 * with it checks them), "stream",
 * "stream_options", ...} -> {"id": "chatcmpl-...", "object": "chat.completion", "choices":
 * [{"index": 0, "message": {"role": "assistant", "content", ...}, "finish_reason"}], "usage", ...}.
 * The conversation is rendered by the C renderer of the model's chat template family (compiled in
 * by ignis compile when one reproduces the template exactly) and tokenized as ignis does: only the
 * template's markup becomes control tokens; message text is plain text. With "stream": true cb
 * gets the server's "chat.completion.chunk" events (the role first, then the content pieces, the
 * finish_reason, the usage when asked). "n" works as in ignis_completions (every choice's role
 * chunk first when streamed, as the server sends them).
 *   "logprobs": true and "top_logprobs": 0..20: each message's (and each chunk's) logprobs
 * {"content": [{"token", "bytes", "logprob", "top_logprobs": [...]}]}, as ignis serve gives them.
 *   A thinking template (Qwen3): the answer's <think>...</think> part is the message's
 * "reasoning_content" (streamed as reasoning_content deltas), the rest its content; an earlier
 * assistant turn's "reasoning_content" is given to the template, which drops it as Python's does;
 * chat_template_kwargs {"enable_thinking": false} closes the think block in the prompt.
 *   "tools" (function tools, checked as ignis serve checks them) are rendered into the prompt as
 * the model's template renders them, and so are assistant "tool_calls" and "tool" messages; the
 * answer is read for calls as ignis serve reads it. A template that shows "<tool_call>" blocks
 * (Qwen2.5, Qwen2.5-Coder, Qwen3): each <tool_call>{"name", "arguments"}</tool_call> block is a
 * call (the text around them the content), and an answer that is nothing but a call object, or a
 * list of them, naming offered functions (bare or in a ```json fence: Qwen2.5-Coder answers so)
 * is calls too. A Llama 3.1/3.2 template: an answer that is only {"name", "parameters"} objects,
 * optionally after <|python_tag|> and separated by ";", is calls. Either way a call object has
 * exactly "name" and one of "arguments" / "parameters" (an object, or a string of one). The
 * calls are the message's
 * "tool_calls" (ids "call_" + 24 hex digits, arguments a JSON string), streamed as OpenAI streams
 * them, and finish_reason "tool_calls". "tool_choice": "none" (the tools stay out
 * of the prompt), "auto" (the default) and "parallel_tool_calls" are taken. ignis serve holds a
 * call the model begins to a grammar of the functions (llguidance; the text before the call is
 * free); the library has no grammar engine and decodes freely, reading the same calls: its greedy
 * answer is ignis serve's whenever the model's own call is valid (its arguments fit the schema)
 * and the answer ends where the grammar lets it (with parallel_tool_calls false the server stops
 * right after the first complete call, where the library goes on to the end-of-sequence token),
 * and logprobs after the call's marker are of the unmasked distribution. Not in this version:
 * tool_choice "required" or naming a function (the answer must be calls: that needs constrained
 * decoding) and other constrained decoding (response_format, guided_*): each answered with an
 * error object saying so, except where ignis serve refuses first: a malformed guided_* field, or
 * one beside tool_choice "required" / a named function (two grammars), is answered with the
 * server's own error. */
char *ignis_chat_completions(ignis_model *m, const char *request_json, ignis_chunk_cb cb, void *user);

/* POST /v1/embeddings: {"model", "input": a string, a list of strings, a list of token ids or a list
 * of token-id lists (up to 2048 inputs, each at most the context, together at most 8 contexts of
 * tokens), "encoding_format": "float" (default) | "base64" (each vector's little-endian float32
 * bytes), "dimensions" (only the model's hidden size), "user", "pooling": "mean" (default) |
 * "last"} -> {"data": [{"embedding", "index", "object": "embedding"}, ...], "model", "object":
 * "list", "usage": {"prompt_tokens", "total_tokens"}}: per input the final hidden states (after
 * the last RMSNorm) of its tokens run alone from an empty cache, pooled and L2-normalised, as
 * ignis serve and ignis.Client's embeddings (Model.embed) give them. Strings are tokenized with
 * the model's added tokens (BOS...). The embedding step is compiled into the library beside the
 * generation step and reads the same weights.bin; it is set up on the first call (its own KV
 * cache of the context's size). */
char *ignis_embeddings(ignis_model *m, const char *request_json);

/* What the handle runs, as JSON (free it with ignis_free): {"abi_version", "kernels" (the kernel
 * table), "kv_dtype", "threads", "n_ctx", "max_batch_tokens" (the prefill chunk), "vocab_size",
 * "compiled": {the model's name, architecture, weight format, eos_token_ids, generation defaults,
 * ignis version, ...: what `ignis compile` recorded}}. NULL on error. */
char *ignis_model_info(ignis_model *m);

/* Free a string this library returned (ignis_model_info, the JSON entry points). NULL is allowed. */
void ignis_free(char *s);

/* Close a handle (NULL is allowed); no call on it may be running or follow. */
void ignis_close(ignis_model *m);

#ifdef __cplusplus
}
#endif
#endif /* IGNIS_MODEL_H */
