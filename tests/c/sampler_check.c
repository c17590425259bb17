/* A bounded random run of csrc/native/sampler.c with hostile parameters and logits, built with
 * -fsanitize=address,undefined by tests/test_native_sampler.py: vocabularies of 1..6000 ids,
 * top_k past the vocabulary, temperatures near the greedy cut, repetition penalties near 0 (logits
 * pushed to +inf), logits with infinities and NaN, masks that leave one id or none, every id
 * biased. Every answer must be an id of the vocabulary (or -1 when nothing is left), and logprobs
 * best first; memory errors, leaks and undefined behaviour abort under the sanitizers.
 *     sampler_check [runs] [seed] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "sampler.h"

static unsigned long long rng_state;
static unsigned long long next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static double uniform(void) { return (double)(next() >> 11) / 9007199254740992.0; }
static size_t below(size_t n) { return n ? (size_t)(next() % n) : 0; }

int main(int argc, char **argv) {
    long runs = argc > 1 ? atol(argv[1]) : 300;
    rng_state = argc > 2 ? strtoull(argv[2], NULL, 10) * 2654435761u + 1 : 1;
    long drawn = 0, empty = 0;
    for (long r = 0; r < runs; r++) {
        int32_t n = 1 + (int32_t)below(below(4) ? 300 : 6000);     /* > 4096: the radix sort */
        ig_sampling_params p = {0};
        p.temperature = below(5) == 0 ? uniform() * 2e-5 : uniform() * 2;
        p.top_k = below(3) ? 0 : (int64_t)below((size_t)n * 2 + 2);
        p.top_p = below(2) ? 1.0 : 1e-9 + uniform() * (1 - 1e-9);
        p.min_p = below(2) ? 0.0 : uniform();
        p.repetition_penalty = below(3) ? 1.0 : (below(3) ? 1e-300 : 0.01 + uniform() * 10);
        p.presence_penalty = below(2) ? 0 : uniform() * 4 - 2;
        p.frequency_penalty = below(2) ? 0 : uniform() * 4 - 2;
        size_t nb = below(3) ? 0 : below((size_t)n + 1);
        int32_t *bias_ids = malloc((nb + 1) * sizeof *bias_ids);
        double *bias = malloc((nb + 1) * sizeof *bias);
        for (size_t k = 0; k < nb; k++) {
            bias_ids[k] = (int32_t)k;
            bias[k] = uniform() * 200 - 100;
        }
        p.bias_ids = bias_ids;
        p.bias_values = bias;
        p.n_bias = nb;
        p.has_seed = (int)below(4) != 0;
        p.seed = next();
        p.logprobs = (int)below(2);
        p.top_logprobs = p.logprobs ? (int)below(IG_MAX_TOP_LOGPROBS + 1) : 0;
        uint8_t *valid = malloc((size_t)n), *allowed = malloc((size_t)n);
        for (int32_t i = 0; i < n; i++) valid[i] = below(10) != 0;
        int32_t prompt[16];
        for (int i = 0; i < 16; i++) prompt[i] = (int32_t)below((size_t)n);
        char err[200];
        ig_sampler *s = ig_sampler_new(&p, n, below(2) ? valid : NULL, prompt, below(17), err,
                                       sizeof err);
        if (!s) {
            printf("refused valid parameters: %s\n", err);
            return 1;
        }
        float *logits = malloc((size_t)n * sizeof *logits);
        for (int step = 0; step < 20; step++) {
            for (int32_t i = 0; i < n; i++) {
                size_t kind = below(200);
                logits[i] = kind == 0 ? INFINITY : kind == 1 ? -INFINITY : kind == 2 && below(20) == 0
                            ? NAN : (float)((uniform() - 0.5) * (below(2) ? 10 : 1e6));
            }
            size_t mode = below(4);
            for (int32_t i = 0; i < n; i++) allowed[i] = mode == 0 ? 0 : mode == 1 ? i == n - 1 : 1;
            ig_token_logprob info;
            int32_t tok = ig_sampler_sample(s, logits, mode == 3 ? NULL : allowed, &info);
            if (tok < -1 || tok >= n) {
                printf("token %d out of [-1, %d)\n", (int)tok, (int)n);
                return 1;
            }
            if (tok == -1) { empty++; continue; }
            drawn++;
            if (p.logprobs) {
                if (info.token_id != tok || info.n_top != (p.top_logprobs < n ? p.top_logprobs : n)) {
                    printf("logprobs of another token or count\n");
                    return 1;
                }
                for (int k = 0; k < info.n_top; k++)
                    if (info.top[k].token_id < 0 || info.top[k].token_id >= n ||
                        (k && info.top[k].logprob > info.top[k - 1].logprob)) {
                        printf("top_logprobs out of range or order\n");
                        return 1;
                    }
            }
            if (below(5) == 0) ig_sampler_accept(s, (int32_t)below((size_t)n));
        }
        free(logits);
        ig_sampler_free(s);
        free(valid);
        free(allowed);
        free(bias_ids);
        free(bias);
    }
    printf("runs: %ld drawn: %ld empty: %ld\n", runs, drawn, empty);
    return 0;
}
