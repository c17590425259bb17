/* answer.h — a chat answer's text read as OpenAI's message parts, as ignis/api/client.py _Answer
 * reads it: a thinking model's <think>...</think> part as reasoning_content
 * (ignis/generate/reasoning.py ReasoningSplitter), then the tool calls in the rest
 * (ignis/generate/tools.py ToolCallParser, in the mode tool_choice "auto" uses: a call is given out
 * once it is complete and valid, text that only looked like one stays content), whole or fed in
 * the pieces a stream releases, with one reader for both so a streamed answer's deltas, joined,
 * are the whole answer's message.
 *
 * The formats (ToolFormat): "hermes" (Qwen2.5, Qwen3: <tool_call>\n{"name": ..., "arguments":
 * {...}}\n</tool_call> blocks, and, with the offered function names, an answer that is only a bare
 * call object or a ```json fence of one, as Qwen2.5-Coder writes them) and "llama3_json" (Llama
 * 3.2: the whole answer is {"name": ..., "parameters": {...}} objects joined by ";", optionally
 * after <|python_tag|>).
 *
 * Known differences from the Python reader, for text no supported model writes as a call: JSON is
 * read by json.h, which refuses NaN and Infinity (json.loads reads them) and reads at most 990
 * levels of nesting (about where json.loads gives up too).
 *
 * Not part of the ABI; api.c turns the deltas into chat.completion.chunk objects. */
#ifndef IG_NATIVE_ANSWER_H
#define IG_NATIVE_ANSWER_H

#include <stddef.h>
#include <stdint.h>

enum { IG_TOOLS_NONE = 0, IG_TOOLS_HERMES = 1, IG_TOOLS_LLAMA3_JSON = 2 };

/* one ChoiceDelta: exactly one of its parts */
enum { IG_DELTA_CONTENT, IG_DELTA_REASONING, IG_DELTA_CALL, IG_DELTA_ARGUMENTS };

typedef struct {
    int kind;
    char *text;                  /* content / reasoning / arguments (NUL-terminated) */
    size_t len;
    int index;                   /* the call's index (CALL, ARGUMENTS) */
    char id[32];                 /* CALL: "call_" + 24 hex digits */
    char *name;                  /* CALL: the function's name */
    size_t name_len;
} ig_delta;

typedef struct {
    ig_delta *d;
    size_t n, cap;
} ig_deltas;

void ig_deltas_clear(ig_deltas *ds);     /* empty, keep the array */
void ig_deltas_free(ig_deltas *ds);

typedef struct {
    int thinking;                /* the template writes <think> blocks (Qwen3) */
    int open_in_prompt;          /* ... and the prompt opened one the answer continues */
    int tools;                   /* IG_TOOLS_*: the calls to read (NONE: no tools, or "none") */
    int parallel;                /* parallel_tool_calls (false: the first call only) */
    const char *const *names;    /* the offered functions (hermes: bare calls naming one) */
    const size_t *name_lens;
    size_t n_names;
} ig_answer_config;

typedef struct {
    char id[32];
    char *name, *arguments;
    size_t name_len, arguments_len;
} ig_answer_call;

typedef struct ig_answer ig_answer;

/* NULL: out of memory. The config's names must outlive the reader. */
ig_answer *ig_answer_new(const ig_answer_config *c);
void ig_answer_free(ig_answer *a);
/* 1: the answer is read as it is (no reasoning, no calls): a stream sends its text as content */
int ig_answer_plain(const ig_answer *a);
/* Feed the next piece of the answer / end it: the deltas it completes are appended to *out (in
 * _Answer.feed's and finish()'s order and merging). 0, or -1 out of memory. */
int ig_answer_feed(ig_answer *a, const char *text, size_t len, ig_deltas *out);
int ig_answer_finish(ig_answer *a, ig_deltas *out);
/* After finish: the message's parts. reasoning / content: NULL when None. */
const char *ig_answer_reasoning(const ig_answer *a, size_t *len);
const char *ig_answer_content(const ig_answer *a, size_t *len);
size_t ig_answer_calls(const ig_answer *a, const ig_answer_call **calls);

int ig_py_space(uint32_t c);             /* Python's str.isspace() for one code point */

#endif
