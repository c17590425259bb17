/* The sampler of the native library: numpy's PCG64 seeding and draws, and sampler.py's arithmetic
 * (sampler.h says what is matched and how). */
#define _DEFAULT_SOURCE
#include "sampler.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __APPLE__
#include <sys/random.h>
#endif

/* no fused multiply-add: clang contracts a * b + c within an expression by default (gcc in
 * -std=c11 mode does not), which would round the penalties differently from numpy */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#ifndef __SIZEOF_INT128__
#error "the PCG64 generator needs a compiler with unsigned __int128 (gcc, clang on 64-bit targets)"
#endif
__extension__ typedef unsigned __int128 u128;

/* ---- SeedSequence (numpy.random.bit_generator): constants of its hash and mix ---- */

#define SS_POOL 4
#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_L 0xca01f9ddu
#define SS_MIX_R 0x4973f715u
#define SS_XSHIFT 16

static uint32_t ss_hash(uint32_t value, uint32_t *hash_const) {
    value ^= *hash_const;
    *hash_const *= SS_MULT_A;
    value *= *hash_const;
    value ^= value >> SS_XSHIFT;
    return value;
}

static uint32_t ss_mix(uint32_t x, uint32_t y) {
    uint32_t r = SS_MIX_L * x - SS_MIX_R * y;
    return r ^ (r >> SS_XSHIFT);
}

/* the pool from the entropy words, then n_out words of state */
static void seed_sequence(const uint32_t *words, size_t n, uint32_t *out, size_t n_out) {
    uint32_t pool[SS_POOL], hc = SS_INIT_A;
    for (size_t i = 0; i < SS_POOL; i++) pool[i] = ss_hash(i < n ? words[i] : 0, &hc);
    for (size_t src = 0; src < SS_POOL; src++)
        for (size_t dst = 0; dst < SS_POOL; dst++)
            if (src != dst) pool[dst] = ss_mix(pool[dst], ss_hash(pool[src], &hc));
    for (size_t src = SS_POOL; src < n; src++)
        for (size_t dst = 0; dst < SS_POOL; dst++) pool[dst] = ss_mix(pool[dst], ss_hash(words[src], &hc));
    uint32_t hb = SS_INIT_B;
    for (size_t i = 0; i < n_out; i++) {
        uint32_t v = pool[i % SS_POOL];
        v ^= hb;
        hb *= SS_MULT_B;
        v *= hb;
        v ^= v >> SS_XSHIFT;
        out[i] = v;
    }
}

/* ---- PCG64 ---- */

#define PCG_MULT (((u128)0x2360ED051FC65DA4ull << 64) | 0x4385DF649FCCF645ull)

static u128 get128(uint64_t hi, uint64_t lo) { return ((u128)hi << 64) | lo; }

static void put_state(ig_pcg64 *g, u128 state, u128 inc) {
    g->state_hi = (uint64_t)(state >> 64);
    g->state_lo = (uint64_t)state;
    g->inc_hi = (uint64_t)(inc >> 64);
    g->inc_lo = (uint64_t)inc;
}

void ig_pcg64_seed_words(ig_pcg64 *g, const uint32_t *words, size_t n_words) {
    uint32_t st[8];
    seed_sequence(words, n_words, st, 8);
    /* generate_state(4, uint64): word pairs, low half first; seed = (w0 << 64) | w1, inc likewise */
    uint64_t w[4];
    for (int i = 0; i < 4; i++) w[i] = (uint64_t)st[2 * i] | (uint64_t)st[2 * i + 1] << 32;
    u128 seed = get128(w[0], w[1]), inc = (get128(w[2], w[3]) << 1) | 1u;
    u128 state = 0;
    state = state * PCG_MULT + inc;
    state += seed;
    state = state * PCG_MULT + inc;
    put_state(g, state, inc);
}

void ig_pcg64_seed(ig_pcg64 *g, uint64_t seed) {
    uint32_t words[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    ig_pcg64_seed_words(g, words, seed >> 32 ? 2 : 1);      /* 0 is one word, [0] */
}

int ig_pcg64_seed_entropy(ig_pcg64 *g) {
    uint32_t words[4];
    int ok = 0;
#if defined(__APPLE__) || (defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 25)) || \
    defined(__FreeBSD__) || defined(__OpenBSD__)
    ok = getentropy(words, sizeof words) == 0;
#endif
    if (!ok) {
        FILE *f = fopen("/dev/urandom", "rb");
        if (f) {
            ok = fread(words, sizeof words, 1, f) == 1;
            fclose(f);
        }
    }
    if (!ok) return -1;
    /* numpy: SeedSequence(randbits(128)), the int's words; a leading zero word is dropped */
    size_t n = 4;
    while (n > 1 && words[n - 1] == 0) n--;
    ig_pcg64_seed_words(g, words, n);
    return 0;
}

uint64_t ig_pcg64_next(ig_pcg64 *g) {
    u128 state = get128(g->state_hi, g->state_lo) * PCG_MULT + get128(g->inc_hi, g->inc_lo);
    g->state_hi = (uint64_t)(state >> 64);
    g->state_lo = (uint64_t)state;
    uint64_t x = g->state_hi ^ g->state_lo;
    unsigned rot = (unsigned)(g->state_hi >> 58);
    return (x >> rot) | (x << ((64 - rot) & 63));
}

double ig_pcg64_random(ig_pcg64 *g) {
    return (double)(ig_pcg64_next(g) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- numpy's reductions ---- */

double ig_pairwise_sum(const double *x, size_t n) {
    if (n < 8) {
        double r = 0.0;
        for (size_t i = 0; i < n; i++) r += x[i];
        return r;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = x[j];
        size_t i;
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += x[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += x[i];
        return res;
    }
    size_t n2 = n / 2;
    n2 -= n2 % 8;
    return ig_pairwise_sum(x, n2) + ig_pairwise_sum(x + n2, n - n2);
}

/* ---- the sampler ---- */

struct ig_sampler {
    ig_sampling_params p;
    int32_t n;
    int greedy;
    uint8_t *valid;              /* NULL: every id has a token */
    int64_t *counts;             /* output tokens (OpenAI penalties) */
    uint8_t *seen;               /* prompt + output (repetition penalty) */
    int any_seen;
    /* the ids seen and output, each once: the penalties touch only these, not the vocabulary
     * (for every other id sampler.py's arithmetic leaves the logit as it is) */
    int32_t *seen_ids, *out_ids;
    size_t n_seen, n_out;
    int32_t *bias_ids;
    double *bias_values;
    ig_pcg64 rng;
    double *x, *sub, *probs, *tmp;   /* (n,) scratch */
    int32_t *keep, *order, *merge;   /* (n,) */
    struct radix_item *radix;        /* (2n,) and 65536 counts, made on the first long sort */
    uint32_t *radix_count;
};

struct radix_item { uint64_t key; int32_t id; };

void ig_sampler_free(ig_sampler *s) {
    if (!s) return;
    free(s->valid);
    free(s->counts);
    free(s->seen);
    free(s->seen_ids);
    free(s->out_ids);
    free(s->bias_ids);
    free(s->bias_values);
    free(s->x);
    free(s->sub);
    free(s->probs);
    free(s->tmp);
    free(s->keep);
    free(s->order);
    free(s->merge);
    free(s->radix);
    free(s->radix_count);
    free(s);
}

static ig_sampler *fail(ig_sampler *s, char *err, size_t len, const char *msg) {
    if (err && len) snprintf(err, len, "%s", msg);
    ig_sampler_free(s);
    return NULL;
}

ig_sampler *ig_sampler_new(const ig_sampling_params *p, int32_t vocab_size, const uint8_t *valid,
                           const int32_t *prompt_ids, size_t n_prompt, char *err, size_t err_len) {
    char msg[160];
    if (!p) return fail(NULL, err, err_len, "no sampling parameters");
    if (vocab_size <= 0) return fail(NULL, err, err_len, "the vocabulary size must be positive");
    if (!(p->temperature >= 0 && isfinite(p->temperature)))
        return fail(NULL, err, err_len, "temperature must be a finite number >= 0");
    if (p->top_k < 0) return fail(NULL, err, err_len, "top_k must be >= 0");
    if (!(p->top_p > 0 && p->top_p <= 1)) return fail(NULL, err, err_len, "top_p must be in (0, 1]");
    if (!(p->min_p >= 0 && p->min_p <= 1)) return fail(NULL, err, err_len, "min_p must be in [0, 1]");
    if (!(p->repetition_penalty > 0 && isfinite(p->repetition_penalty)))
        return fail(NULL, err, err_len, "repetition_penalty must be a finite number > 0");
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return fail(NULL, err, err_len, "presence_penalty and frequency_penalty must be finite");
    if (p->top_logprobs < 0 || p->top_logprobs > IG_MAX_TOP_LOGPROBS) {
        snprintf(msg, sizeof msg, "top_logprobs must be in [0, %d]", IG_MAX_TOP_LOGPROBS);
        return fail(NULL, err, err_len, msg);
    }
    ig_sampler *s = calloc(1, sizeof *s);
    if (!s) return fail(NULL, err, err_len, "out of memory");
    s->p = *p;
    s->n = vocab_size;
    s->greedy = p->temperature < 1e-5 || p->top_k == 1;
    size_t n = (size_t)vocab_size;
    s->counts = calloc(n, sizeof *s->counts);
    s->seen = calloc(n, 1);
    s->seen_ids = malloc(n * sizeof *s->seen_ids);
    s->out_ids = malloc(n * sizeof *s->out_ids);
    s->x = malloc(n * sizeof *s->x);
    s->sub = malloc(n * sizeof *s->sub);
    s->probs = malloc(n * sizeof *s->probs);
    s->tmp = malloc(n * sizeof *s->tmp);
    s->keep = malloc(n * sizeof *s->keep);
    s->order = malloc(n * sizeof *s->order);
    s->merge = malloc(n * sizeof *s->merge);
    if (!s->counts || !s->seen || !s->seen_ids || !s->out_ids || !s->x || !s->sub || !s->probs || !s->tmp || !s->keep || !s->order ||
        !s->merge)
        return fail(s, err, err_len, "out of memory");
    if (valid) {
        int all = 1;
        for (size_t i = 0; i < n && all; i++) all = valid[i] != 0;
        if (!all) {
            if (!(s->valid = malloc(n))) return fail(s, err, err_len, "out of memory");
            memcpy(s->valid, valid, n);
        }
    }
    for (size_t i = 0; i < n_prompt; i++) {
        if (prompt_ids[i] < 0 || prompt_ids[i] >= vocab_size) {
            snprintf(msg, sizeof msg, "prompt id %d is not in the vocabulary (0..%d)",
                     (int)prompt_ids[i], (int)vocab_size - 1);
            return fail(s, err, err_len, msg);
        }
        if (!s->seen[prompt_ids[i]]) s->seen_ids[s->n_seen++] = prompt_ids[i];
        s->seen[prompt_ids[i]] = 1;
        s->any_seen = 1;
    }
    if (p->n_bias) {
        s->bias_ids = malloc(p->n_bias * sizeof *s->bias_ids);
        s->bias_values = malloc(p->n_bias * sizeof *s->bias_values);
        if (!s->bias_ids || !s->bias_values) return fail(s, err, err_len, "out of memory");
        for (size_t k = 0; k < p->n_bias; k++) {
            if (p->bias_ids[k] < 0 || p->bias_ids[k] >= vocab_size) {
                snprintf(msg, sizeof msg, "logit_bias key %d is not a token id of this model (0..%d)",
                         (int)p->bias_ids[k], (int)vocab_size - 1);
                return fail(s, err, err_len, msg);
            }
            s->bias_ids[k] = p->bias_ids[k];
            s->bias_values[k] = p->bias_values[k];
        }
    }
    s->p.bias_ids = s->bias_ids;
    s->p.bias_values = s->bias_values;
    if (p->has_seed) ig_pcg64_seed(&s->rng, p->seed);
    else if (ig_pcg64_seed_entropy(&s->rng))
        return fail(s, err, err_len, "no entropy from the operating system for an unseeded request");
    return s;
}

void ig_sampler_accept(ig_sampler *s, int32_t token) {
    if (token < 0 || token >= s->n) return;
    if (!s->counts[token]++) s->out_ids[s->n_out++] = token;
    if (!s->seen[token]) s->seen_ids[s->n_seen++] = token;
    s->seen[token] = 1;
    s->any_seen = 1;
}

/* the raw logits in float64, ids with no token at -inf (sampler.py: x + hole) */
static void raw_logits(const ig_sampler *s, const float *logits, double *x) {
    for (int32_t i = 0; i < s->n; i++) x[i] = (double)logits[i];
    if (s->valid)
        for (int32_t i = 0; i < s->n; i++) x[i] = x[i] + (s->valid[i] ? 0.0 : -INFINITY);
}

/* Sampler.process */
static void process(ig_sampler *s, const float *logits, const uint8_t *allowed, double *x) {
    const ig_sampling_params *p = &s->p;
    raw_logits(s, logits, x);
    if (p->repetition_penalty != 1.0 && s->any_seen)
        for (size_t k = 0; k < s->n_seen; k++) {
            int32_t i = s->seen_ids[k];
            x[i] = x[i] > 0 ? x[i] / p->repetition_penalty : x[i] * p->repetition_penalty;
        }
    /* an id never output loses 0 * frequency + 0 * presence = (+-)0: its logit stays */
    if (p->presence_penalty != 0.0 || p->frequency_penalty != 0.0)
        for (size_t k = 0; k < s->n_out; k++) {
            int32_t i = s->out_ids[k];
            x[i] -= (double)s->counts[i] * p->frequency_penalty + 1.0 * p->presence_penalty;
        }
    for (size_t k = 0; k < p->n_bias; k++) x[p->bias_ids[k]] += p->bias_values[k];
    if (allowed)
        for (int32_t i = 0; i < s->n; i++)
            if (!allowed[i]) x[i] = -INFINITY;
}

/* np.argmax: the first NaN, else the first maximum */
static int32_t argmax(const double *x, int32_t n) {
    double top = x[0];
    int32_t best = 0;
    if (isnan(top)) return 0;
    for (int32_t i = 1; i < n; i++) {
        double v = x[i];
        if (!(v <= top)) {               /* greater, or NaN */
            if (v != v) return i;
            top = v;
            best = i;
        }
    }
    return best;
}

/* the k-th largest of x:(n,) for a small k: a min-heap of the k largest so far, which most
 * values pass by after one comparison with its root */
static double kth_largest_heap(const double *x, int32_t n, int64_t k, double *heap) {
    size_t size = 0, cap = (size_t)k;
    for (int32_t i = 0; i < n; i++) {
        double v = x[i];
        size_t j;
        if (size < cap) {                    /* sift up */
            j = size++;
            while (j > 0 && heap[(j - 1) / 2] > v) {
                heap[j] = heap[(j - 1) / 2];
                j = (j - 1) / 2;
            }
            heap[j] = v;
        } else if (v > heap[0]) {            /* replace the root, sift down */
            j = 0;
            for (;;) {
                size_t c = 2 * j + 1;
                if (c >= cap) break;
                if (c + 1 < cap && heap[c + 1] < heap[c]) c++;
                if (!(heap[c] < v)) break;
                heap[j] = heap[c];
                j = c;
            }
            heap[j] = v;
        }
    }
    return heap[0];
}

/* the k-th largest value of x:(n,) (np.partition(x, n - k)[n - k]); tmp:(n,) scratch.
 * NaN is not ordered here (numpy sorts it last); logits with NaN have no defined top_k. */
static double kth_largest(const double *x, int32_t n, int64_t k, double *tmp) {
    if (k <= 2048) return kth_largest_heap(x, n, k, tmp);
    memcpy(tmp, x, (size_t)n * sizeof *tmp);
    ptrdiff_t lo = 0, hi = n - 1, want = (ptrdiff_t)(n - k);
    uint64_t r = 0x9E3779B97F4A7C15ull;
    while (lo < hi) {
        r ^= r << 13; r ^= r >> 7; r ^= r << 17;
        double pivot = tmp[lo + (ptrdiff_t)(r % (uint64_t)(hi - lo + 1))];
        ptrdiff_t lt = lo, gt = hi, i = lo;     /* three ways: [lo,lt) < pivot, (gt,hi] > pivot */
        while (i <= gt) {
            double t = tmp[i];
            if (t < pivot) { tmp[i++] = tmp[lt]; tmp[lt++] = t; }
            else if (t > pivot) { tmp[i] = tmp[gt]; tmp[gt--] = t; }
            else i++;
        }
        if (want < lt) hi = lt - 1;
        else if (want > gt) lo = gt + 1;
        else return pivot;
    }
    return tmp[want];
}

/* _softmax in place over v:(m,) */
static void softmax(double *v, size_t m, double *out) {
    double top = -INFINITY;
    for (size_t i = 0; i < m; i++) if (v[i] > top || i == 0) top = v[i];
    if (top == INFINITY) {
        top = -INFINITY;
        for (size_t i = 0; i < m; i++) {
            if (v[i] > 1.7976931348623157e308) v[i] = 1.7976931348623157e308;
            if (v[i] > top || i == 0) top = v[i];
        }
    }
    if (isfinite(top)) {                /* exp(-inf - top) is 0: no call needed */
        for (size_t i = 0; i < m; i++) out[i] = v[i] == -INFINITY ? 0.0 : exp(v[i] - top);
    } else {
        for (size_t i = 0; i < m; i++) out[i] = exp(v[i] - top);
    }
    double sum = ig_pairwise_sum(out, m);
    for (size_t i = 0; i < m; i++) out[i] = out[i] / sum;
}

/* by decreasing probability, ties by index: a strict order */
static int before(int32_t a, int32_t b, const double *pr) {
    return pr[a] > pr[b] || (pr[a] == pr[b] && a < b);
}

/* ix:(m,) ordered by before(): a merge sort (tmp:(m,) scratch), insertion sort for short runs */
static void sort_desc(int32_t *ix, size_t m, const double *pr, int32_t *tmp) {
    if (m <= 16) {
        for (size_t i = 1; i < m; i++) {
            int32_t v = ix[i];
            size_t j = i;
            while (j > 0 && before(v, ix[j - 1], pr)) { ix[j] = ix[j - 1]; j--; }
            ix[j] = v;
        }
        return;
    }
    size_t h = m / 2;
    sort_desc(ix, h, pr, tmp);
    sort_desc(ix + h, m - h, pr, tmp);
    if (!before(ix[h], ix[h - 1], pr)) return;      /* already in order */
    size_t a = 0, b = h, k = 0;
    while (a < h && b < m) tmp[k++] = before(ix[b], ix[a], pr) ? ix[b++] : ix[a++];
    while (a < h) tmp[k++] = ix[a++];
    while (b < m) tmp[k++] = ix[b++];
    memcpy(ix, tmp, m * sizeof *tmp);
}

/* ix:(m,), ascending ids, ordered as sort_desc orders them, by a stable LSD radix sort of the
 * probabilities' bits (a non-negative double's bits order as its value; inverted: descending),
 * 16 bits a pass, a pass skipped when every key shares its digit. -1: no memory. */
static int radix_desc(ig_sampler *s, int32_t *ix, size_t m, const double *pr) {
    if (!s->radix) {
        s->radix = malloc(2 * (size_t)s->n * sizeof *s->radix);
        s->radix_count = malloc(65536 * sizeof *s->radix_count);
        if (!s->radix || !s->radix_count) {
            free(s->radix);
            free(s->radix_count);
            s->radix = NULL;
            s->radix_count = NULL;
            return -1;
        }
    }
    struct radix_item *a = s->radix, *b = s->radix + s->n;
    uint32_t *count = s->radix_count;
    for (size_t j = 0; j < m; j++) {
        uint64_t bits;
        memcpy(&bits, &pr[ix[j]], sizeof bits);
        a[j].key = ~bits;
        a[j].id = ix[j];
    }
    for (int shift = 0; shift < 64; shift += 16) {
        memset(count, 0, 65536 * sizeof *count);
        for (size_t j = 0; j < m; j++) count[(a[j].key >> shift) & 0xFFFF]++;
        if (count[(a[0].key >> shift) & 0xFFFF] == m) continue;
        uint32_t at = 0;
        for (size_t d = 0; d < 65536; d++) {
            uint32_t c = count[d];
            count[d] = at;
            at += c;
        }
        for (size_t j = 0; j < m; j++) b[count[(a[j].key >> shift) & 0xFFFF]++] = a[j];
        struct radix_item *t = a;
        a = b;
        b = t;
    }
    for (size_t j = 0; j < m; j++) ix[j] = a[j].id;
    return 0;
}

/* ix:(m,) holding ascending ids: ordered by before() */
static void order_desc(ig_sampler *s, int32_t *ix, size_t m, const double *pr) {
    if (m < 4096 || radix_desc(s, ix, m, pr) != 0) sort_desc(ix, m, pr, s->merge);
}

#define NUCLEUS_GUESS 1024

/* Sampler._filter over v:(m,) (the candidates' logits / temperature): probs:(m,) */
static void filter(ig_sampler *s, double *v, size_t m, double *probs) {
    const ig_sampling_params *p = &s->p;
    softmax(v, m, probs);
    if (p->top_p < 1.0) {
        int32_t *order = s->order;
        for (size_t i = 0; i < m; i++) order[i] = (int32_t)i;
        /* the nucleus almost always lies in the top 1024: order those first; if their mass reaches
         * top_p, the ids after them all have mass-before >= top_p and are dropped either way */
        size_t sorted = m;
        if (m > NUCLEUS_GUESS) {
            /* the ids whose probability reaches the 1024th largest (ties with it too): the
             * first ids in the order, found by a selection over the values, not over ids */
            double cut = kth_largest(probs, (int32_t)m, NUCLEUS_GUESS, s->x);   /* x: scratch */
            size_t k = 0;
            for (size_t i = 0; i < m; i++) if (probs[i] >= cut) order[k++] = (int32_t)i;
            order_desc(s, order, k, probs);
            double c = 0;
            for (size_t j = 0; j < k; j++) c += probs[order[j]];
            if (c >= p->top_p) {
                sorted = k;
            } else {
                for (size_t i = 0; i < m; i++) order[i] = (int32_t)i;
                order_desc(s, order, m, probs);
            }
        } else {
            order_desc(s, order, m, probs);
        }
        uint8_t *drop = (uint8_t *)s->tmp;       /* m bytes of the (n,) doubles */
        memset(drop, 1, m);
        double c = 0;
        for (size_t j = 0; j < sorted; j++) {
            double pj = probs[order[j]];
            c += pj;                             /* np.cumsum: sequential */
            if (c - pj < p->top_p) drop[order[j]] = 0;
        }
        for (size_t i = 0; i < m; i++) if (drop[i]) v[i] = -INFINITY;
        softmax(v, m, probs);
    }
    if (p->min_p > 0.0) {
        double mx = probs[0];
        for (size_t i = 1; i < m; i++) if (probs[i] > mx) mx = probs[i];
        double cut = p->min_p * mx;
        for (size_t i = 0; i < m; i++) if (probs[i] < cut) v[i] = -INFINITY;
        softmax(v, m, probs);
    }
}

/* Sampler._logprobs */
static void logprobs(ig_sampler *s, const float *logits, int32_t token, ig_token_logprob *info) {
    double *x = s->x;
    raw_logits(s, logits, x);
    int32_t n = s->n;
    double m = x[0];
    for (int32_t i = 1; i < n; i++) if (x[i] > m) m = x[i];
    for (int32_t i = 0; i < n; i++) s->probs[i] = exp(x[i] - m);
    double lse = log(ig_pairwise_sum(s->probs, (size_t)n));
    info->token_id = token;
    info->logprob = (x[token] - m) - lse;
    int k = s->p.top_logprobs < n ? s->p.top_logprobs : n;
    int have = 0;
    for (int32_t i = 0; i < n && k > 0; i++) {
        double lp = (x[i] - m) - lse;
        /* best first, ties by id: an id only displaces a strictly worse one */
        if (have == k && !(lp > info->top[k - 1].logprob)) continue;
        int j = have < k ? have++ : k - 1;
        while (j > 0 && lp > info->top[j - 1].logprob) {
            info->top[j] = info->top[j - 1];
            j--;
        }
        info->top[j] = (ig_top_logprob){i, lp};
    }
    info->n_top = k;
}

int32_t ig_sampler_sample(ig_sampler *s, const float *logits, const uint8_t *allowed,
                          ig_token_logprob *info) {
    double *x = s->x;
    process(s, logits, allowed, x);
    int32_t token;
    if (s->greedy) {
        token = argmax(x, s->n);
    } else {
        const ig_sampling_params *p = &s->p;
        int32_t n = s->n;
        size_t m = 0;
        if (p->top_k > 0 && p->top_k < n) {
            double kth = kth_largest(x, n, p->top_k, s->tmp);
            for (int32_t i = 0; i < n; i++) if (x[i] >= kth) s->keep[m++] = i;
        } else {
            for (int32_t i = 0; i < n; i++) if (x[i] > -INFINITY) s->keep[m++] = i;
        }
        if (m == 0) return -1;
        for (size_t j = 0; j < m; j++) s->sub[j] = x[s->keep[j]] / p->temperature;
        filter(s, s->sub, m, s->probs);
        double *cdf = s->sub;                    /* the logits are no longer needed */
        double c = 0;
        size_t last = 0;
        for (size_t j = 0; j < m; j++) {
            c += s->probs[j];
            cdf[j] = c;
            if (s->probs[j] != 0) last = j;
        }
        double target = ig_pcg64_random(&s->rng) * cdf[m - 1];
        size_t lo = 0, hi = m;                   /* searchsorted(side="right") */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (cdf[mid] <= target) lo = mid + 1;
            else hi = mid;
        }
        token = s->keep[lo < last ? lo : last];
    }
    if (info && s->p.logprobs) logprobs(s, logits, token, info);
    ig_sampler_accept(s, token);
    return token;
}
