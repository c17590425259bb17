/* The sampler of the native library: logits of one position -> the next token id and its logprobs,
 * choosing exactly the tokens ignis/generate/sampler.py chooses for the same seed and parameters.
 *
 * Its generator is numpy's default_rng(seed): SeedSequence(seed) (the seed's 32-bit words, least
 * significant first, hash-mixed into a pool of four words, from which four 64-bit words are drawn)
 * seeding PCG64 (a 128-bit LCG, output XSL-RR), and a draw is random(): the top 53 bits of the
 * next 64-bit output times 2^-53. A request without a seed draws 128 bits of fresh entropy from
 * the OS, as numpy does. sampler.py reduces a seed modulo 2^64 (a negative one too); so does the
 * caller here, by passing it as uint64_t.
 *
 * The order of operations and the float64 arithmetic are sampler.py's: repetition penalty over
 * prompt + output, presence/frequency over the output, logit_bias, the caller's mask of allowed
 * ids (a grammar's), then temperature, top_k (ties with the k-th kept), top_p (the smallest set by
 * decreasing probability, ties by id, whose mass before it is < top_p), min_p, and one draw by the
 * inverse CDF in id order. Sums are numpy's pairwise sums and its cumsum (sequential), so the
 * probabilities are the same doubles wherever exp() is (libm here; numpy may use its own SIMD exp,
 * which can differ in the last bit: the token differs only if a draw lands within that bit of a
 * bucket's edge, about 1e-16 per draw). Logprobs are the log-softmax of the raw logits.
 * Where numpy's choice is arbitrary this one is the defined one: ties at the k-th place of
 * top_logprobs, or at the 1024th place of top_p's first ordering, go to the lower id (numpy's
 * argpartition may pick either). Logits with NaN have no defined top_k or top_p order here.
 * Compile with -ffp-contract=off (a fused multiply-add changes the last bit).
 */
#ifndef IG_NATIVE_SAMPLER_H
#define IG_NATIVE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IG_MAX_TOP_LOGPROBS 20

/* numpy's PCG64: 128-bit state and increment as two 64-bit halves each */
typedef struct { uint64_t state_hi, state_lo, inc_hi, inc_lo; } ig_pcg64;

/* SeedSequence(entropy words, least significant first; pool of 4) -> PCG64, as numpy seeds it */
void ig_pcg64_seed_words(ig_pcg64 *g, const uint32_t *words, size_t n_words);
void ig_pcg64_seed(ig_pcg64 *g, uint64_t seed);          /* default_rng(seed), 0 <= seed < 2^64 */
int ig_pcg64_seed_entropy(ig_pcg64 *g);                   /* default_rng(None); -1: no entropy */
uint64_t ig_pcg64_next(ig_pcg64 *g);                      /* bit_generator.random_raw() */
double ig_pcg64_random(ig_pcg64 *g);                      /* Generator.random() */

typedef struct {
    double temperature;          /* < 1e-5 (or top_k == 1): greedy */
    int64_t top_k;               /* 0: off */
    double top_p;                /* (0, 1]; 1: off */
    double min_p;                /* [0, 1]; 0: off */
    double repetition_penalty;   /* > 0; 1: off */
    double presence_penalty, frequency_penalty;
    const int32_t *bias_ids;     /* logit_bias: n_bias ids (distinct) and their values */
    const double *bias_values;
    size_t n_bias;
    int has_seed;                /* 0: fresh entropy */
    uint64_t seed;               /* the request's seed modulo 2^64 */
    int logprobs;                /* fill the chosen token's logprob */
    int top_logprobs;            /* 0..IG_MAX_TOP_LOGPROBS alternatives, best first */
} ig_sampling_params;

typedef struct { int32_t token_id; double logprob; } ig_top_logprob;

typedef struct {
    int32_t token_id;
    double logprob;
    int n_top;
    ig_top_logprob top[IG_MAX_TOP_LOGPROBS];
} ig_token_logprob;

typedef struct ig_sampler ig_sampler;

/* One request's sampler. valid:(vocab_size,) 0 for ids with no token (never drawn or reported),
 * NULL: all valid; prompt_ids: seen by the repetition penalty. NULL with a message in err on bad
 * parameters or no memory. */
ig_sampler *ig_sampler_new(const ig_sampling_params *p, int32_t vocab_size, const uint8_t *valid,
                           const int32_t *prompt_ids, size_t n_prompt, char *err, size_t err_len);
/* The next token for logits:(vocab_size,); allowed:(vocab_size,) or NULL (a grammar's mask: 0 is
 * -inf after logit_bias). Records the token (ig_sampler_accept) and, if info and params.logprobs,
 * fills info. Returns -1 when no id is left to draw from (all masked). */
int32_t ig_sampler_sample(ig_sampler *s, const float *logits, const uint8_t *allowed,
                          ig_token_logprob *info);
void ig_sampler_accept(ig_sampler *s, int32_t token);    /* a token chosen elsewhere (forced) */
void ig_sampler_free(ig_sampler *s);

/* numpy's pairwise sum of x:(n,) (np.sum of a contiguous float64 array) */
double ig_pairwise_sum(const double *x, size_t n);

#ifdef __cplusplus
}
#endif
#endif
