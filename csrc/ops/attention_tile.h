/* attention_tile.h — the state of one tile of the tiled attention path (ops/attention_tmpl.h),
 * shared by the template and the ISA parts that replace its per-block steps
 * (arch/attention_avx512.h). */
#ifndef IGNIS_ATTENTION_TILE_H
#define IGNIS_ATTENTION_TILE_H
#include <stdint.h>

/* The tile's state, per lane (nl lanes padded to nlp, a multiple of 16; lane = row * heads + head) */
typedef struct {
    float *qt;          /* (head_dim, nlp): the queries, transposed (lane fastest) */
    float *o;           /* (nlp, head_dim): the running outputs */
    float *m, *l, *al;  /* (nlp,) running max, running sum, this block's rescale */
    float *p;           /* (IG_ATTN_KB, nlp): this block's weights, key-major */
    int32_t *lf, *lp;   /* (nlp,) each lane's first and last key position */
    int nlp, head_dim;
} ig_attn_tile;

/* The decode shape's next pass (ops/attention_tmpl.h ATTN(tile_few_run)), brought towards the core
 * while this pass's scores are computed, position by position (ig_attn_ahead_pos), not in one burst
 * of a whole block's lines: a block's keys and value rows each start a new 4 KiB page, where the
 * hardware's prefetcher starts again (benchmarks/RESULTS.md, "Decode attention's next block"). */
typedef struct {
    const char *k[4];           /* the blocks' keys, (head_dim, 16) elements; NULL: no block */
    const int64_t *vat[4];      /* their value rows: element vat[b][j] of v, -1 for none */
    const char *v;              /* the value cache */
    int esize, row_bytes;       /* an element's bytes, head_dim's */
} ig_attn_ahead;

#if defined(__GNUC__) || defined(__clang__)
#  define IG_ATTN_AHEAD_LINE(p) __builtin_prefetch((p), 0, 3)
#else
#  define IG_ATTN_AHEAD_LINE(p) ((void)(p))
#endif
/* position j's part of the next pass's nb blocks: its value row and 1/16 of the key block (the
 * same bytes, row_bytes), one line at a time */
static inline void ig_attn_ahead_pos(const ig_attn_ahead *a, int nb, int j) {
    for (int b = 0; b < nb; b++) {
        if (!a->k[b]) continue;
        const char *k = a->k[b] + (size_t)j * a->row_bytes;
        const int64_t at = a->vat[b][j];
        for (int o = 0; o < a->row_bytes; o += 64) IG_ATTN_AHEAD_LINE(k + o);
        if (at >= 0)
            for (int o = 0; o < a->row_bytes; o += 64) IG_ATTN_AHEAD_LINE(a->v + (size_t)at * a->esize + o);
    }
}

#endif
