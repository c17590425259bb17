/* api.h — what runtime.c (opening and running a compiled model) and api.c (the OpenAI-shaped JSON
 * entry points) share inside the library: the handle and the runtime's few internal calls. Not
 * part of the ABI (ignis_model.h is). */
#ifndef IG_NATIVE_API_H
#define IG_NATIVE_API_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "../ignis.h"
#include "ignis_model.h"
#include "tokenizer.h"

#define MAX_INPUTS 4

typedef struct {
    const unsigned char *p;
    size_t len;
} span;

/* the model's generation defaults (generation_config.json, as `ignis compile` recorded them) */
typedef struct {
    int     do_sample;
    double  temperature, top_p, min_p, repetition_penalty;
    int64_t top_k;
} gen_defaults;

/* the embedding step (the EMBD section), created on the first ignis_embeddings call */
typedef struct {
    ig_model *exec;               /* NULL: not opened yet */
    int       max_T, max_R, width, select, n_inputs;
    int32_t  *in_buf[MAX_INPUTS];
    int32_t  *role[3];
    float    *out;
} embd_step;

struct ignis_model {
    pthread_mutex_t lock;
    ig_model       *exec;
    const unsigned char *map;     /* weights.bin, read-only */
    size_t          map_bytes;
    unsigned char  *huge;         /* packed weights copied to 2 MB pages, or NULL */
    size_t          huge_bytes;
    int             threads, max_T, max_R, max_ctx, vocab, width, select, n_past;
    int             n_inputs;
    int32_t        *in_buf[MAX_INPUTS];   /* the step's inputs in tape order */
    int32_t        *role[3];              /* the same buffers by ROLE_* (rows: NULL when absent) */
    float          *out;
    int32_t        *eos;
    int             n_eos;
    unsigned char  *valid;        /* bit per id, or NULL: every id */
    uint8_t        *valid_ids;    /* the same, a byte per id (the sampler's form), or NULL */
    const char     *kernels;      /* the kernel table's name */
    int             kv_f16;
    span            conf;         /* the CONF section: JSON text */
    /* read from CONF and TOKN at open, for the JSON entry points */
    ig_tok         *tok;          /* NULL: the library takes token ids only (tok_why says why) */
    char            tok_why[256];
    char           *model_name;   /* the name requests must give ("model") */
    char           *fingerprint;  /* system_fingerprint: fp_ignis_<version> */
    gen_defaults    gen;
    int             max_token_bytes;   /* the longest token's bytes (the server's text-size check) */
    int64_t         max_new_tokens;    /* generation_config's max_new_tokens; -1: none */
    struct ig_chat_template *chat;     /* NULL: no chat (chat_why says why) */
    char            chat_why[256];
    char          **spellings;         /* added-token text masked in chat strings (TextMasker) */
    size_t          n_spellings;
    embd_step       embd;
    int64_t        *w_poff;       /* per generation-step weight: its packed offset in weights.bin */
    const void    **w_pptr;       /* ... and where the step reads those bytes (2 MB pages or the map) */
    int             n_w;
};

void ig_rt_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ig_rt_clear_error(void);
/* Run ids at positions n_past.. ; the last position's logits at *last. Caller holds the lock. */
int ig_rt_run_tokens(ignis_model *h, const int32_t *ids, int n, const float **last);
/* Final hidden states of ids (a new sequence on the embedding step, opened on first use), pooled
 * into v[0..dim): their mean, or the last row's (last != 0). Returns dim, or -1 (error set).
 * Caller holds the lock. */
int ig_rt_embed(ignis_model *h, const int32_t *ids, int n, int last, double *v);
/* The embedding step's width (the hidden size), opening it on first use; -1 on error (set). */
int ig_rt_embed_width(ignis_model *h);
/* Read CONF and TOKN into the handle (api.c); 0 on a damaged section (error set). */
int ig_api_open(ignis_model *h, span tokn, span chat);
void ig_api_close(ignis_model *h);

#endif
