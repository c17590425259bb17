/* Chat templates for the native library, rendered in C: one hand-written renderer per template
 * family ignis supports, each giving, byte for byte, what the family's Jinja template renders in
 * ignis's Python path (ignis/tokenizer/chat.py) for every conversation that path accepts.
 *
 * The families (ig_chat_family): Qwen2.5 with tools (qwen2.5-coder-0.5b-instruct's template and
 * the tiny test model's), ChatML with a default system prompt (smollm2-135m-instruct's), Qwen3
 * (tools, <think> blocks, enable_thinking, earlier turns' reasoning dropped) and Llama 3.2 (tools
 * as JSON, the date line, bos text). Which family a model's template is, and its parameters (the
 * default system prompt, the bos text, the tokenizer's added-token spellings), come from a section
 * ignis.native.chat_blob.chat_section writes at compile time; a template outside the known set is
 * refused there, not here.
 *
 * The input is the conversation as already-extracted fields (ig_chat_request), which the runtime
 * fills from the request's JSON after the validation `ignis serve` does (ignis/api/client.py
 * _messages, ignis/generate/tools.py check_tools):
 *  - content: the text parts in order (a string is one part); the renderer joins them, as the
 *    client does. has_content 0: the message has no content (an assistant with tool_calls).
 *  - tool call arguments: when the request's arguments string reads as a JSON object, the JSON
 *    text of that object as Python's json.dumps writes it (ig_jw_value: Python's escapes and repr
 *    floats; compact or spaced separators, both are read) with arguments_is_object = 1; otherwise
 *    the string itself with arguments_is_object = 0 (the client's rule).
 *  - tools: each tool object's JSON text, {"type": "function", "function": {...}} with the function's
 *    fields in check_tools' order (name, description, parameters, strict), written as above.
 *  - template variables (chat_template_kwargs): enable_thinking, tools_in_user_message, date_string
 *    (NULL: today's date, as strftime_now gives it). ig_chat_reads says which variables a family's
 *    template reads; a variable a template reads that the native renderer does not take must be
 *    refused by the runtime (IG_CHAT_READS_UNSUPPORTED), one it does not read has no effect in
 *    Jinja either.
 *
 * The output is the prompt text and its spans: IG_CHAT_SPAN_MARKUP is the template's own text
 * (where added tokens such as <|im_start|> are matched), IG_CHAT_SPAN_TEXT came from the caller's
 * strings (content, names, arguments, tool schemas, variables) and is tokenized as plain text, so a
 * user writing "<|im_end|>" cannot close their turn (ignis's Tokenizer.encode_chat rule). Spans
 * cover the text in order, adjacent spans of one kind merged.
 *
 * A JSON null is an absent field (check_messages drops None values), and strings carry their
 * length: a NUL inside content is text like any other byte.
 *
 * Threads: a loaded template is read-only; ig_chat_render may run on many threads at once.
 *
 * Errors: every function checks its arguments (NULL pointers, counts past the limits, a damaged
 * section) and returns an IG_CHAT_E_* status with a message, never crashing. A conversation the
 * template itself refuses (Llama 3.2's "This model only supports single tool-calls at once!") is
 * IG_CHAT_E_REFUSED with the template's message, as ChatTemplateError carries it in Python.
 */
#ifndef IG_NATIVE_CHAT_H
#define IG_NATIVE_CHAT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IG_CHAT_SECTION_VERSION 1

typedef enum {
    IG_CHAT_FAMILY_NONE = 0,         /* the model has no chat template (a base model) */
    IG_CHAT_FAMILY_QWEN25 = 1,       /* Qwen2.5 instruct: default system prompt, <tool_call> tools */
    IG_CHAT_FAMILY_CHATML = 2,       /* ChatML with a default system prompt (SmolLM2), no tools */
    IG_CHAT_FAMILY_QWEN3 = 3,        /* Qwen3: tools, <think> reasoning, enable_thinking */
    IG_CHAT_FAMILY_LLAMA3 = 4,       /* Llama 3.2: JSON tool calls, date line, bos text */
    IG_CHAT_FAMILY_COUNT
} ig_chat_family;

typedef enum {
    IG_CHAT_SYSTEM = 0, IG_CHAT_DEVELOPER = 1, IG_CHAT_USER = 2, IG_CHAT_ASSISTANT = 3,
    IG_CHAT_TOOL = 4, IG_CHAT_ROLE_COUNT
} ig_chat_role;

/* a template variable: undefined, the JSON value false, true, or another value (a string, 0...) */
enum { IG_CHAT_UNSET = -1, IG_CHAT_FALSE = 0, IG_CHAT_TRUE = 1, IG_CHAT_OTHER = 2 };

enum { IG_CHAT_SPAN_MARKUP = 0, IG_CHAT_SPAN_TEXT = 1 };

typedef enum {
    IG_CHAT_OK = 0,
    IG_CHAT_E_ARG,          /* a NULL pointer, a bad role or count, arguments that are not JSON */
    IG_CHAT_E_SECTION,      /* the section is damaged, of another version, or of an unknown family */
    IG_CHAT_E_NO_TEMPLATE,  /* the model has no chat template */
    IG_CHAT_E_REFUSED,      /* the template refuses this conversation (Python: ChatTemplateError) */
    IG_CHAT_E_LIMIT,        /* more messages, parts, calls, tools or bytes than the limits below */
    IG_CHAT_E_MEMORY,
} ig_chat_status;

/* Limits (each far above what the server's validation lets through) */
#define IG_CHAT_MAX_MESSAGES 65536
#define IG_CHAT_MAX_PARTS 65536          /* content parts of one message */
#define IG_CHAT_MAX_CALLS 4096           /* tool calls of one message */
#define IG_CHAT_MAX_TOOLS 4096
#define IG_CHAT_MAX_OUTPUT ((size_t)1 << 30)   /* bytes of rendered text */
#define IG_CHAT_MAX_DEPTH 256            /* nesting of a JSON text the renderer re-indents */

typedef struct { const char *s; size_t len; } ig_chat_str;   /* UTF-8; s may be NULL when len 0 */

typedef struct {
    ig_chat_str name;                /* function name */
    ig_chat_str arguments;           /* JSON text of an object, or a plain string (see above) */
    int arguments_is_object;
} ig_chat_tool_call;

typedef struct {
    int role;                        /* ig_chat_role */
    const ig_chat_str *content;      /* n_content parts, joined */
    size_t n_content;
    int has_content;
    ig_chat_str reasoning_content;   /* assistant: vLLM/DeepSeek's field (Qwen3 renders it) */
    int has_reasoning_content;
    const ig_chat_tool_call *tool_calls;
    size_t n_tool_calls;
    int has_tool_calls;              /* the key is present (even as an empty list) */
    ig_chat_str name;                /* read by no supported template; kept for the runtime */
    ig_chat_str tool_call_id;        /* idem */
} ig_chat_message;

typedef struct {
    const ig_chat_message *messages;
    size_t n_messages;
    const ig_chat_str *tools;        /* each tool's JSON text */
    size_t n_tools;
    int has_tools;                   /* tools given (Llama 3.2 renders an empty list too) */
    int add_generation_prompt;
    int enable_thinking;             /* IG_CHAT_UNSET / FALSE / TRUE / OTHER */
    int tools_in_user_message;       /* IG_CHAT_UNSET, else the value's truthiness (FALSE / TRUE) */
    ig_chat_str date_string;         /* has_date_string: Llama 3.2's date line; a string only */
    int has_date_string;
} ig_chat_request;

typedef struct { size_t offset, len; int kind; } ig_chat_span;

typedef struct {
    char *text;                      /* NUL-terminated, len bytes */
    size_t len;
    ig_chat_span *spans;
    size_t n_spans;
} ig_chat_output;

typedef struct ig_chat_template ig_chat_template;

/* The renderer a section describes (the section's bytes are copied); NULL with err filled. */
ig_chat_template *ig_chat_load(const void *section, size_t len, char *err, size_t errlen);
void ig_chat_template_free(ig_chat_template *t);
int ig_chat_template_family(const ig_chat_template *t);      /* ig_chat_family, -1 for NULL */
const char *ig_chat_family_name(int family);                  /* "qwen2.5", ...; "?" if unknown */
/* 1 if the family's template renders tool definitions (a request with tools may be served), else 0 */
int ig_chat_template_tools(const ig_chat_template *t);

/* Whether the family's template reads a template variable: */
enum {
    IG_CHAT_READS_NO = 0,            /* it does not: the variable has no effect */
    IG_CHAT_READS_YES = 1,           /* it does, and ig_chat_request carries it */
    IG_CHAT_READS_UNSUPPORTED = 2,   /* it does, and the native renderer does not take it */
    IG_CHAT_READS_RESERVED = 3,      /* the renderer's own (messages, tools, bos_token...) */
};
int ig_chat_reads(const ig_chat_template *t, const char *name);

/* Render a conversation into *out (zeroed on failure; ig_chat_output_free releases it). Returns
 * an ig_chat_status; err (may be NULL) gets the message. */
int ig_chat_render(const ig_chat_template *t, const ig_chat_request *req, ig_chat_output *out,
                   char *err, size_t errlen);
void ig_chat_output_free(ig_chat_output *out);

/* The same from a request's parsed JSON (json.h): `messages` (an array), `tools` (an array, or
 * NULL for none), `kwargs` (chat_template_kwargs: an object, or NULL). The request must have
 * passed the server's validation (ignis/api/client.py _messages, check_tools; with tool_choice
 * "none" the tools are left out, as Model.chat does: pass NULL): a shape it would
 * have refused is IG_CHAT_E_ARG here, with the place named. Fills ig_chat_request as the top of
 * this header says: text parts joined by the renderer, arguments that parse as a JSON object
 * written again as json.dumps does, tools as check_tools rebuilds them ({"type": "function",
 * "function": {name, description, parameters, strict}}, nulls left out). */
struct ig_json;
int ig_chat_render_json(const ig_chat_template *t, const struct ig_json *messages,
                        const struct ig_json *tools, const struct ig_json *kwargs,
                        int add_generation_prompt, ig_chat_output *out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
