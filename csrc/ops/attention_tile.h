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

#endif
