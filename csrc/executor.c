/* executor.c — runs a lowered instruction tape (ignis/plan/tape.py) over one planned arena.
 *
 * The tape is checked once, at creation, against the weights and bounds it will run with; arena,
 * scratch and KV cache are one allocation made then. A step is one loop with one switch: it never
 * calls Python, allocates only a thread's attention scratch at its first step (ig_thread_scratch,
 * IG_ERR_NOMEM when it cannot), and reports failures as a status plus the failing instruction.
 */
#if !defined(_POSIX_C_SOURCE) && !defined(_WIN32)
#define _POSIX_C_SOURCE 199309L     /* clock_gettime, for the per-instruction profile */
#endif
#include "ignis.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define IG_ALIGN 64

struct ig_model {
    ig_instr             *instrs;
    int                   n_instrs;
    const float         **weights;
    ig_packed_weight     *packed;         /* per weight its matmuls' form (IG_PACK_F32: weights[w]) */
    int64_t              *weight_rows;
    int                   n_weights;
    int                   n_inputs, n_outputs;
    unsigned char        *block;          /* the one allocation: arena | scratch | K, V per layer */
    unsigned char        *block_raw;      /* what calloc returned (block is it, aligned) */
    int64_t               block_bytes;
    unsigned char        *arena;
    float                *scratch;
    int64_t               scratch_bytes;
    void                 *xq;             /* quantized activation rows (q8 or x16 blocks) */
    float                *xsum;           /* x16: the f32 sum of each activation block */
    float                *gate;           /* a decode step's SwiGLU gate dots (one row) */
    void                **k_cache, **v_cache;  /* per layer (kv_rows, width), f32 or f16 */
    int                   kv_f16;
    int32_t              *kv_widths;
    int32_t              *kv_rows;   /* per layer: rows kept per slot (max_ctx or a ring, in blocks) */
    int                   n_kv_layers;
    int                   max_T, max_R, max_ctx, n_seq;
    const ig_kernel_table *kt;
    const float         **rope_inv;       /* per instruction: its rope's inverse frequencies, or NULL */
    float                *rope_inv_block; /* the tables made at creation (rope ops without one) */
    int64_t              *profile_ns;     /* NULL, or per instruction the time its steps took */
    char                  err[320];
};

size_t ig_instr_size(void) { return sizeof(ig_instr); }

static void set_err(char *buf, int len, const char *fmt, ...) {
    if (!buf || len <= 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, (size_t)len, fmt, ap);
    va_end(ap);
}

/* ---- the op table (ops.def) --------------------------------------------------------------- */

static const ig_op_info OPS[] = {
#define IG_OP(NAME, name, opcode, n_args, w_min, w_max) \
    [opcode] = {#name, opcode, n_args, w_min, w_max},
#include "ops.def"
#undef IG_OP
};
_Static_assert(sizeof OPS / sizeof OPS[0] == IG_OP_COUNT,
               "ops.def: opcodes must run 1, 2, ... without a gap or a repeat");

const ig_op_info *ig_op_info_of(int opcode) {
    return opcode >= 1 && opcode < IG_OP_COUNT ? &OPS[opcode] : NULL;
}

static const char *op_name(int opcode) {
    const ig_op_info *op = ig_op_info_of(opcode);
    return op ? op->name : "unknown op";
}

/* ---- packings: sizes and blocks (ignis.h's macros), for creation and for Python's checks ------ */

int ig_packed_block(int packing, int layout) {
    switch (packing) {
    case IG_PACK_F32: case IG_PACK_BF16: return 1;
    case IG_PACK_Q8: case IG_PACK_Q4: return IG_QK;
    case IG_PACK_X16:
        return layout == IG_WX_Q8 || layout == IG_WX_Q5_0 || layout == IG_WX_Q4_1 ||
               layout == IG_WX_Q5_1 ? IG_QK
             : layout == IG_WX_Q6K || layout == IG_WX_Q4K || layout == IG_WX_Q5K ||
               layout == IG_WX_Q3K || layout == IG_WX_Q2K ? 256 : 0;
    }
    return 0;
}

int64_t ig_packed_bytes(int packing, int64_t N, int64_t K, int layout) {
    const int qk = ig_packed_block(packing, layout);
    if (!qk || N < 0 || K < 0 || K % qk) return -1;
    const int64_t nb = K / IG_QK, groups = (N + IG_Q8P_ROWS - 1) / IG_Q8P_ROWS;
    switch (packing) {
    case IG_PACK_F32: return 4 * N * K;
    case IG_PACK_BF16: return 2 * N * K;
    case IG_PACK_Q8: return IG_Q8P_BYTES(N, K);
    case IG_PACK_Q4: return IG_Q4P_BYTES(N, K);
    }
    switch (layout) {   /* IG_PACK_X16 */
    case IG_WX_Q8: return groups * IG_Q8P_GROUP_BYTES(nb);
    case IG_WX_Q5_0: return groups * IG_Q5P_GROUP_BYTES(nb);
    case IG_WX_Q6K: return groups * IG_Q6KP_GROUP_BYTES(nb);
    case IG_WX_Q4_1: return groups * IG_Q41P_GROUP_BYTES(nb);
    case IG_WX_Q5_1: return groups * IG_Q51P_GROUP_BYTES(nb);
    case IG_WX_Q5K: return groups * IG_Q5KP_GROUP_BYTES(nb);
    case IG_WX_Q3K: return groups * IG_Q3KP_GROUP_BYTES(nb);
    case IG_WX_Q2K: return groups * IG_Q2KP_GROUP_BYTES(nb);
    default: return groups * IG_Q4KP_GROUP_BYTES(nb);
    }
}

static const char *const PACKING_NAMES[IG_PACK_COUNT] = {"f32", "bf16", "q8", "q4", "x16"};

const char *ig_packing_name(int packing) {
    return packing >= 0 && packing < IG_PACK_COUNT ? PACKING_NAMES[packing] : NULL;
}

/* ---- creation: check every instruction once ------------------------------------------------- */
/* The checks say what is wrong with one instruction; ig_model_create names it in front
 * ("instruction 12 (rope): ..."). */

static int64_t bound_rows(const ig_model_desc *d, int32_t code) {
    return code == IG_ROWS_T ? d->max_T : code == IG_ROWS_R ? d->max_R : code;
}

#define CHECK(cond, ...)                                   \
    do {                                                   \
        if (!(cond)) {                                     \
            set_err(err, err_len, __VA_ARGS__);            \
            return IG_ERR_TAPE;                            \
        }                                                  \
    } while (0)

#define TRY(x)                        \
    do {                              \
        ig_status s_ = (x);           \
        if (s_ != IG_OK) return s_;   \
    } while (0)

static ig_status check_operand(const ig_model_desc *d, const char *what, int32_t space, int32_t rows,
                               int64_t where, int64_t cols, char *err, int err_len) {
    CHECK(rows >= IG_ROWS_R, "%s has row code %d (expected >= 0, -1 for T or -2 for R)", what,
          (int)rows);
    CHECK(cols >= 1, "%s has %lld columns", what, (long long)cols);
    const int64_t nbytes = bound_rows(d, rows) * cols * 4;
    switch (space) {
    case IG_SPACE_ARENA:
        CHECK(where >= 0 && where % 4 == 0 && where + nbytes <= d->arena_bytes,
              "%s at arena+%lld (%lld bytes) does not fit the %lld-byte arena", what,
              (long long)where, (long long)nbytes, (long long)d->arena_bytes);
        break;
    case IG_SPACE_INPUT:
        CHECK(where >= 0 && where < d->n_inputs, "%s reads input %lld of %d", what, (long long)where,
              d->n_inputs);
        break;
    case IG_SPACE_OUTPUT:
        CHECK(where >= 0 && where < d->n_outputs, "%s writes output %lld of %d", what,
              (long long)where, d->n_outputs);
        break;
    default:
        CHECK(0, "%s has unknown space %d", what, (int)space);
    }
    return IG_OK;
}

/* A matmul weight (N, K), plus the optional bias (N,), must match the tape's column counts. */
static ig_status check_linear(const ig_model_desc *d, int w, int64_t N, int64_t K, char *err,
                              int err_len) {
    CHECK(d->weight_rows[w] == N && d->weight_elems[w] == N * K,
          "weight %d has %lld rows and %lld elements; the tape needs (%lld, %lld)", w,
          (long long)d->weight_rows[w], (long long)d->weight_elems[w], (long long)N, (long long)K);
    return IG_OK;
}

static ig_status check_vec(const ig_model_desc *d, int w, int64_t n, char *err, int err_len) {
    CHECK(d->weight_elems[w] == n, "weight %d has %lld elements; the tape needs %lld", w,
          (long long)d->weight_elems[w], (long long)n);
    return IG_OK;
}

static ig_status check_heads(int64_t nh, int64_t nkv, int64_t hd, char *err, int err_len) {
    CHECK(nh >= 1 && nkv >= 1 && nh % nkv == 0, "n_heads %lld is not a multiple of n_kv_heads %lld",
          (long long)nh, (long long)nkv);
    CHECK(hd >= 2 && hd % 2 == 0 && hd <= IG_MAX_HEAD_DIM, "head_dim %lld must be even and at most "
          "%d", (long long)hd, IG_MAX_HEAD_DIM);
    return IG_OK;
}

/* The rope ops' optional inverse-frequency table (head_dim/2 floats from the config) is their last
 * weight: rope and rope_qkv with one weight, the fused projections with 4 or 7 after the norm. */
static int has_rope_table(const ig_instr *in) {
    switch (in->opcode) {
    case IG_OP_ROPE: case IG_OP_ROPE_QKV: return in->n_weights == 1;
    case IG_OP_LINEAR_QKV_ROPE: return in->n_weights == 4 || in->n_weights == 7;
    case IG_OP_RMS_LINEAR_QKV_ROPE: return in->n_weights == 5 || in->n_weights == 8;
    default: return 0;
    }
}

/* theta and head_dim of a rope op, or 0 for an op that rotates nothing */
static int rope_params(const ig_instr *in, float *theta) {
    switch (in->opcode) {
    case IG_OP_ROPE: *theta = (float)in->floats[0]; return (int)in->ints[1];
    case IG_OP_ROPE_QKV: case IG_OP_LINEAR_QKV_ROPE: *theta = (float)in->floats[0]; return (int)in->ints[2];
    case IG_OP_RMS_LINEAR_QKV_ROPE: *theta = (float)in->floats[1]; return (int)in->ints[2];
    default: return 0;
    }
}

/* The inverse frequencies a rope op rotates by: the config's table (its last weight), or the one
 * made at creation from theta, 1 / theta^(2j/head_dim) exactly as the rope kernels compute it
 * without a table (the same expression, so the same bits): a decode step no longer takes
 * head_dim/2 pow calls per rope op (36 ops a token in Gemma 3 270M). */
static const float *rope_table(const ig_model *m, const ig_instr *in) {
    return has_rope_table(in) ? m->weights[in->weight[in->n_weights - 1]] : m->rope_inv[in - m->instrs];
}

/* weights w0..nw-1 are Wq, Wk, Wv[, bq, bk, bv] */
static ig_status check_qkv(const ig_model_desc *d, const ig_instr *in, int w0, int nw, int64_t K,
                           char *err, int err_len) {
    const int64_t nh = in->ints[0], nkv = in->ints[1], hd = in->ints[2];
    TRY(check_heads(nh, nkv, hd, err, err_len));
    const int64_t qd = nh * hd, kd = nkv * hd;
    CHECK(in->out_cols == qd + 2 * kd, "packed qkv width %lld != (n_heads + 2*n_kv_heads)*head_dim "
          "= %lld", (long long)in->out_cols, (long long)(qd + 2 * kd));
    TRY(check_linear(d, in->weight[w0], qd, K, err, err_len));
    TRY(check_linear(d, in->weight[w0 + 1], kd, K, err, err_len));
    TRY(check_linear(d, in->weight[w0 + 2], kd, K, err, err_len));
    CHECK(nw - w0 == 3 || nw - w0 == 6, "%d projection weights; expected Wq, Wk, Wv and optionally "
          "their biases", nw - w0);
    if (nw - w0 == 6) {
        TRY(check_vec(d, in->weight[w0 + 3], qd, err, err_len));
        TRY(check_vec(d, in->weight[w0 + 4], kd, err, err_len));
        TRY(check_vec(d, in->weight[w0 + 5], kd, err, err_len));
    }
    return IG_OK;
}

static ig_status check_attention(const ig_model_desc *d, const ig_instr *in, int64_t q_cols,
                                 char *err, int err_len) {
    const int64_t layer = in->ints[0], nh = in->ints[1], nkv = in->ints[2], hd = in->ints[3];
    TRY(check_heads(nh, nkv, hd, err, err_len));
    CHECK(layer >= 0 && layer < d->n_kv_layers && d->kv_widths[layer] == nkv * hd,
          "attention layer %lld has no KV cache of width %lld", (long long)layer,
          (long long)(nkv * hd));
    CHECK(q_cols >= nh * hd && in->out_cols == nh * hd, "attention columns do not match "
          "n_heads*head_dim = %lld", (long long)(nh * hd));
    CHECK(d->scratch_bytes >= 4 * nh * (int64_t)d->max_ctx, "attention needs %lld scratch bytes, "
          "the tape has %lld", (long long)(4 * nh * d->max_ctx), (long long)d->scratch_bytes);
    return IG_OK;
}

static ig_status check_instr(const ig_model_desc *d, const ig_instr *in, char *err, int err_len) {
    const ig_op_info *op = ig_op_info_of(in->opcode);
    CHECK(op, "unknown opcode %d (this build knows 1..%d)", (int)in->opcode, IG_OP_COUNT - 1);
    CHECK(in->n_args == op->n_args && in->n_weights >= op->w_min && in->n_weights <= op->w_max,
          "%d activations and %d weights; expected %d and %d..%d", (int)in->n_args,
          (int)in->n_weights, op->n_args, op->w_min, op->w_max);
    CHECK(in->out_space != IG_SPACE_INPUT, "writes to an input");
    TRY(check_operand(d, "output", in->out_space, in->out_rows, in->out_where, in->out_cols, err,
                      err_len));
    for (int a = 0; a < in->n_args; a++) {
        char what[32];
        snprintf(what, sizeof what, "operand %d", a);
        TRY(check_operand(d, what, in->arg_space[a], in->arg_rows[a], in->arg_where[a],
                          in->arg_cols[a], err, err_len));
    }
    for (int w = 0; w < in->n_weights; w++)
        CHECK(in->weight[w] >= 0 && in->weight[w] < d->n_weights && d->weights[in->weight[w]],
              "weight slot %d refers to weight %d of %d (or a NULL pointer)", w, (int)in->weight[w],
              d->n_weights);
    const int64_t K = in->arg_cols[0], N = in->out_cols;
    const int rowwise = in->opcode != IG_OP_TAKE_ROWS && in->opcode != IG_OP_EMBED;
    if (rowwise) CHECK(in->arg_rows[0] == in->out_rows, "output rows differ from input rows");
    const int table = has_rope_table(in);
    if (table)      /* head_dim: ints[1] of rope, ints[2] of the packed ops */
        TRY(check_vec(d, in->weight[in->n_weights - 1],
                      (in->opcode == IG_OP_ROPE ? in->ints[1] : in->ints[2]) / 2, err, err_len));
    switch (in->opcode) {
    case IG_OP_EMBED:
        CHECK(d->weight_elems[in->weight[0]] == d->weight_rows[in->weight[0]] * N,
              "embedding table rows are not %lld wide", (long long)N);
        break;
    case IG_OP_SCALE: case IG_OP_RMSNORM:
        TRY(check_vec(d, in->weight[0], N, err, err_len));
        /* fallthrough */
    case IG_OP_RMS_NORMALIZE: case IG_OP_SILU:
        CHECK(K == N, "input and output widths differ");
        break;
    case IG_OP_ADD: case IG_OP_MUL: case IG_OP_SWIGLU: case IG_OP_GEGLU:
        CHECK(K == N && in->arg_cols[1] == N && in->arg_rows[1] == in->out_rows,
              "elementwise operands differ in shape");
        break;
    case IG_OP_LINEAR: case IG_OP_LINEAR_ADD:
        TRY(check_linear(d, in->weight[0], N, K, err, err_len));
        if (in->n_weights == 2) TRY(check_vec(d, in->weight[1], N, err, err_len));
        if (in->opcode == IG_OP_LINEAR_ADD)
            CHECK(in->arg_cols[1] == N && in->arg_rows[1] == in->out_rows,
                  "residual shape differs from the output");
        break;
    case IG_OP_LINEAR_SWIGLU:
        TRY(check_linear(d, in->weight[0], N, K, err, err_len));
        TRY(check_linear(d, in->weight[1], N, K, err, err_len));
        break;
    case IG_OP_RMS_LINEAR: case IG_OP_RMS_LINEAR_SWIGLU:
        TRY(check_vec(d, in->weight[0], K, err, err_len));
        TRY(check_linear(d, in->weight[1], N, K, err, err_len));
        if (in->opcode == IG_OP_RMS_LINEAR_SWIGLU)
            TRY(check_linear(d, in->weight[2], N, K, err, err_len));
        else if (in->n_weights == 3)
            TRY(check_vec(d, in->weight[2], N, err, err_len));
        CHECK(d->scratch_bytes >= 4 * K * d->max_T, "the normalized rows need %lld scratch bytes",
              (long long)(4 * K * d->max_T));
        break;
    case IG_OP_ROPE:
        TRY(check_heads(in->ints[0], 1, in->ints[1], err, err_len));
        CHECK(K == N && N == in->ints[0] * in->ints[1], "rope width is not n_heads*head_dim");
        break;
    case IG_OP_ROPE_QKV:
        TRY(check_heads(in->ints[0], in->ints[1], in->ints[2], err, err_len));
        CHECK(K == N && N == (in->ints[0] + 2 * in->ints[1]) * in->ints[2], "packed qkv width is not "
              "(n_heads+2*n_kv_heads)*head_dim");
        break;
    case IG_OP_LINEAR_QKV: case IG_OP_LINEAR_QKV_ROPE:
        TRY(check_qkv(d, in, 0, in->n_weights - table, K, err, err_len));
        break;
    case IG_OP_RMSNORM_HEADS:
        CHECK(K == N && in->ints[0] >= 1 && N % in->ints[0] == 0, "width %lld is not a whole "
              "number of heads of %lld", (long long)N, (long long)in->ints[0]);
        TRY(check_vec(d, in->weight[0], in->ints[0], err, err_len));
        break;
    case IG_OP_RMS_LINEAR_QKV_ROPE:
        TRY(check_vec(d, in->weight[0], K, err, err_len));
        TRY(check_qkv(d, in, 1, in->n_weights - table, K, err, err_len));
        CHECK(d->scratch_bytes >= 4 * K * d->max_T, "the normalized rows need %lld scratch bytes",
              (long long)(4 * K * d->max_T));
        break;
    case IG_OP_ATTENTION_WINDOW:
        CHECK(in->ints[4] >= 0 && in->ints[4] <= INT32_MAX && isfinite(in->floats[0]) &&
              in->floats[0] > 0, "window %lld must be in 0..2^31-1 and scale %g positive",
              (long long)in->ints[4],
              in->floats[0]);
        /* fallthrough */
    case IG_OP_ATTENTION:
        TRY(check_attention(d, in, K, err, err_len));
        CHECK(in->arg_cols[1] == in->ints[2] * in->ints[3] && in->arg_cols[2] == in->arg_cols[1],
              "k/v widths are not n_kv_heads*head_dim");
        break;
    case IG_OP_ATTENTION_PACKED:
        TRY(check_attention(d, in, K, err, err_len));
        CHECK(K == (in->ints[1] + 2 * in->ints[2]) * in->ints[3], "packed qkv width is not "
              "(n_heads+2*n_kv_heads)*head_dim");
        break;
    case IG_OP_TAKE_ROWS:
        CHECK(K == N, "take_rows changes the width");
        break;
    }
    return IG_OK;
}

static int64_t round_up(int64_t x) { return (x + IG_ALIGN - 1) / IG_ALIGN * IG_ALIGN; }
static int64_t kv_block_rows(int64_t n) { return (n + IG_KV_BLOCK - 1) / IG_KV_BLOCK * IG_KV_BLOCK; }

ig_status ig_model_create(ig_model **out, const ig_model_desc *d, char *err, int err_len) {
    *out = NULL;
    if (!d || !d->kernels || d->n_instrs < 0 || d->n_weights < 0 || d->max_T < 1 || d->max_R < 0 ||
        d->max_ctx < 1 || d->max_ctx > IG_MAX_CTX || d->n_seq < 1 || d->arena_bytes < 0 || d->scratch_bytes < 0 ||
        d->n_kv_layers < 0) {
        set_err(err, err_len, "model description out of range (bounds, counts or kernel table)");
        return IG_ERR_ARG;
    }
    for (int i = 0; i < d->n_instrs; i++) {
        char why[256];
        ig_status s = check_instr(d, &d->instrs[i], why, (int)sizeof why);
        if (s != IG_OK) {
            if (ig_op_info_of(d->instrs[i].opcode))
                set_err(err, err_len, "instruction %d (%s): %s", i, op_name(d->instrs[i].opcode), why);
            else
                set_err(err, err_len, "instruction %d: %s", i, why);
            return s;
        }
    }
    /* packed weights: a known packing, only matmul operands, K a multiple of the block; size the
     * quantized activations (x16: blocks and their sums) */
    for (int w = 0; d->packed && w < d->n_weights; w++) {
        const ig_packed_weight *p = &d->packed[w];
        if (p->packing == IG_PACK_F32) continue;
        if (!ig_packed_block(p->packing, p->layout) || !p->w) {
            set_err(err, err_len, "weight %d: unknown packing %d (layout %d), or no bytes", w,
                    (int)p->packing, (int)p->layout);
            return IG_ERR_ARG;
        }
    }
    int64_t xq_bytes = 0, xsum_bytes = 0;
    for (int i = 0; d->packed && i < d->n_instrs; i++) {
        const ig_instr *in = &d->instrs[i];
        if (in->opcode == IG_OP_EMBED) continue;       /* gathers read the f32 rows (tied lm_head) */
        for (int k = 0; k < in->n_weights; k++) {
            const int wk = in->weight[k];
            const ig_packed_weight *p = &d->packed[wk];
            if (p->packing == IG_PACK_F32) continue;
            const int64_t K = in->arg_cols[0];
            const int qk = ig_packed_block(p->packing, p->layout);
            if (K % qk || d->weight_elems[wk] % K || d->weight_rows[wk] * K != d->weight_elems[wk]) {
                set_err(err, err_len, "instruction %d (%s): weight %d is given packed (%s) but is not "
                        "a matmul weight with a multiple of %d input features", i,
                        op_name(in->opcode), wk, ig_packing_name(p->packing), qk);
                return IG_ERR_TAPE;
            }
            const int act = d->kernels->fns.wformat[p->packing].act;
            const int64_t blocks = (int64_t)d->max_T * (K / IG_QK);
            const int64_t b = act == IG_ACT_Q8 ? blocks * (int64_t)sizeof(ig_block_q8)
                            : act == IG_ACT_X16 ? blocks * (int64_t)sizeof(ig_block_x16) : 0;
            if (b > xq_bytes) xq_bytes = b;
            if (act == IG_ACT_X16 && blocks * (int64_t)sizeof(float) > xsum_bytes)
                xsum_bytes = blocks * (int64_t)sizeof(float);
        }
    }
    /* the gate row of a decode step's SwiGLU pair in two passes (linear_x) */
    int64_t gate_bytes = 0;
    for (int i = 0; i < d->n_instrs; i++) {
        const ig_instr *in = &d->instrs[i];
        if ((in->opcode == IG_OP_LINEAR_SWIGLU || in->opcode == IG_OP_RMS_LINEAR_SWIGLU) &&
            in->out_cols * (int64_t)sizeof(float) > gate_bytes)
            gate_bytes = in->out_cols * (int64_t)sizeof(float);
    }
    int64_t total = 0;
    const int64_t kv_elem = d->kv_f16 ? 2 : 4;
    ig_model *m = calloc(1, sizeof *m);
    if (!m) goto nomem;
    m->n_instrs = d->n_instrs;
    m->n_weights = d->n_weights;
    m->n_kv_layers = d->n_kv_layers;
    m->instrs = malloc(sizeof(ig_instr) * (size_t)(d->n_instrs ? d->n_instrs : 1));
    m->weights = malloc(sizeof(float *) * (size_t)(d->n_weights ? d->n_weights : 1));
    m->packed = calloc((size_t)(d->n_weights ? d->n_weights : 1), sizeof(ig_packed_weight));
    m->weight_rows = malloc(sizeof(int64_t) * (size_t)(d->n_weights ? d->n_weights : 1));
    m->k_cache = calloc((size_t)(d->n_kv_layers ? d->n_kv_layers : 1), sizeof(void *));
    m->v_cache = calloc((size_t)(d->n_kv_layers ? d->n_kv_layers : 1), sizeof(void *));
    m->kv_widths = calloc((size_t)(d->n_kv_layers ? d->n_kv_layers : 1), sizeof(int32_t));
    m->kv_rows = calloc((size_t)(d->n_kv_layers ? d->n_kv_layers : 1), sizeof(int32_t));
    if (!m->instrs || !m->weights || !m->packed || !m->weight_rows || !m->k_cache || !m->v_cache ||
        !m->kv_widths || !m->kv_rows)
        goto nomem;
    memcpy(m->instrs, d->instrs, sizeof(ig_instr) * (size_t)d->n_instrs);
    for (int w = 0; w < d->n_weights; w++) {
        m->weights[w] = d->weights[w];
        if (d->packed && d->packed[w].packing != IG_PACK_F32)
            m->packed[w] = d->packed[w];
        else
            m->packed[w] = (ig_packed_weight){IG_PACK_F32, 0, d->weights[w]};
        m->weight_rows[w] = d->weight_rows[w];
    }
    total = round_up(d->arena_bytes) + round_up(d->scratch_bytes) + round_up(xq_bytes) +
            round_up(xsum_bytes) + round_up(gate_bytes);
    /* each rope op without a config table: its inverse frequencies (rope_table) */
    int64_t rope_floats = 0;
    for (int i = 0; i < d->n_instrs; i++) {
        float theta;
        const int hd = rope_params(&d->instrs[i], &theta);
        if (hd && !has_rope_table(&d->instrs[i])) rope_floats += hd / 2;
    }
    m->rope_inv = calloc((size_t)(d->n_instrs ? d->n_instrs : 1), sizeof(float *));
    m->rope_inv_block = malloc(sizeof(float) * (size_t)(rope_floats ? rope_floats : 1));
    if (!m->rope_inv || !m->rope_inv_block) goto nomem;
    for (int i = 0, at = 0; i < d->n_instrs; i++) {
        float theta;
        const int hd = rope_params(&d->instrs[i], &theta);
        if (!hd || has_rope_table(&d->instrs[i])) continue;
        float *inv = m->rope_inv_block + at;
        for (int j = 0; j < hd / 2; j++) {
            const float e = (float)(2 * j) / (float)hd;
            inv[j] = 1.0f / (float)pow((double)theta, (double)e);
        }
        m->rope_inv[i] = inv;
        at += hd / 2;
    }
    /* A layer whose attention sees only a window keeps a ring of window + max_T positions per
     * slot (position p at row p % rows): a step of up to max_T tokens writes its keys before
     * attending, and every row's window is still there. Other layers keep all max_ctx. Both
     * rounded up to whole blocks of the key cache (IG_KV_BLOCK rows): then the keys at positions
     * 16b..16b+15 are one block, in a ring too. (runtime/engine.py kv_cache_rows says the same.) */
    const int64_t full_rows = kv_block_rows(d->max_ctx);
    for (int l = 0; l < d->n_kv_layers; l++) m->kv_rows[l] = (int32_t)full_rows;
    for (int i = 0; i < d->n_instrs; i++) {      /* the instructions are checked already */
        const ig_instr *in = &d->instrs[i];
        if (in->opcode == IG_OP_ATTENTION_WINDOW && in->ints[4] > 0 &&
            in->ints[4] + (int64_t)d->max_T < d->max_ctx)
            m->kv_rows[in->ints[0]] = (int32_t)kv_block_rows(in->ints[4] + d->max_T);
    }
    for (int l = 0; l < d->n_kv_layers; l++) {
        m->kv_widths[l] = d->kv_widths[l];
        total += 2 * round_up((int64_t)d->n_seq * m->kv_rows[l] * d->kv_widths[l] * kv_elem);
    }
    /* calloc: everything starts defined (KV rows included), so a bug shows as wrong numbers, not
     * as garbage that differs from run to run; and a large block comes as zero pages the OS maps
     * only when touched, so unused KV slots and positions cost no memory */
    m->block_raw = calloc(1, (size_t)total + IG_ALIGN);
    if (!m->block_raw) goto nomem;
    m->block = m->block_raw + (IG_ALIGN - (uintptr_t)m->block_raw % IG_ALIGN) % IG_ALIGN;
    m->block_bytes = total;
    m->arena = m->block;
    m->scratch = (float *)(m->block + round_up(d->arena_bytes));
    m->scratch_bytes = d->scratch_bytes;
    m->xq = m->block + round_up(d->arena_bytes) + round_up(d->scratch_bytes);
    m->xsum = (float *)((unsigned char *)m->xq + round_up(xq_bytes));
    m->gate = (float *)((unsigned char *)m->xsum + round_up(xsum_bytes));
    unsigned char *p = (unsigned char *)m->gate + round_up(gate_bytes);
    for (int l = 0; l < d->n_kv_layers; l++) {
        const int64_t b = round_up((int64_t)d->n_seq * m->kv_rows[l] * d->kv_widths[l] * kv_elem);
        m->k_cache[l] = p;
        m->v_cache[l] = p + b;
        p += 2 * b;
    }
    m->n_inputs = d->n_inputs;
    m->n_outputs = d->n_outputs;
    m->max_T = d->max_T;
    m->max_R = d->max_R;
    m->max_ctx = d->max_ctx;
    m->n_seq = d->n_seq;
    m->kt = d->kernels;
    m->kv_f16 = d->kv_f16 != 0;
    *out = m;
    return IG_OK;
nomem:
    set_err(err, err_len, "cannot allocate %lld bytes for the arena, scratch and KV cache",
            (long long)total);
    ig_model_free(m);
    return IG_ERR_NOMEM;
}

void ig_model_free(ig_model *m) {
    if (!m) return;
    free(m->block_raw);
    free(m->instrs);
    free((void *)m->weights);
    free(m->packed);
    free(m->weight_rows);
    free(m->k_cache);
    free(m->v_cache);
    free(m->kv_widths);
    free(m->kv_rows);
    free((void *)m->rope_inv);
    free(m->rope_inv_block);
    free(m);
}

const char *ig_model_error(const ig_model *m) { return m ? m->err : "no model"; }
int64_t ig_model_bytes(const ig_model *m) { return m ? m->block_bytes : 0; }

ig_status ig_model_kv_copy(ig_model *m, int dst_seq, int src_seq, int n_positions) {
    if (!m) return IG_ERR_ARG;
    m->err[0] = 0;
    if (dst_seq < 0 || dst_seq >= m->n_seq || src_seq < 0 || src_seq >= m->n_seq) {
        set_err(m->err, (int)sizeof m->err, "kv_copy from slot %d to slot %d; this model has "
                "slots 0..%d", src_seq, dst_seq, m->n_seq - 1);
        return IG_ERR_ARG;
    }
    if (n_positions < 0 || n_positions > m->max_ctx) {
        set_err(m->err, (int)sizeof m->err, "kv_copy of %d positions; the KV cache holds 0..%d",
                n_positions, m->max_ctx);
        return IG_ERR_ARG;
    }
    if (dst_seq == src_seq || n_positions == 0) return IG_OK;
    const size_t elem = m->kv_f16 ? 2 : 4;
    for (int l = 0; l < m->n_kv_layers; l++) {
        const int rows = m->kv_rows[l], width = m->kv_widths[l];
        const size_t row_bytes = (size_t)width * elem;
        unsigned char *kc = m->k_cache[l], *vc = m->v_cache[l];
        /* position p lives at row p % rows: a ring shorter than n keeps (and gets) only the
         * last `rows` positions, every row of it; otherwise rows 0..n-1 are positions 0..n-1 */
        const int first = n_positions > rows ? n_positions - rows : 0;
        for (int p = first; p < n_positions; p++) {
            const int r = p % rows;
            const size_t src = ((size_t)src_seq * rows + (size_t)r) * row_bytes;
            const size_t dst = ((size_t)dst_seq * rows + (size_t)r) * row_bytes;
            /* a whole block of IG_KV_BLOCK positions at once (its value rows are contiguous too:
             * a block never straddles a ring's end), else one position, its key element by element */
            if (r % IG_KV_BLOCK == 0 && p + IG_KV_BLOCK <= n_positions) {
                memcpy(kc + ig_kcache_at(dst_seq, r, 0, rows, width) * elem,
                       kc + ig_kcache_at(src_seq, r, 0, rows, width) * elem, IG_KV_BLOCK * row_bytes);
                memcpy(vc + dst, vc + src, IG_KV_BLOCK * row_bytes);
                p += IG_KV_BLOCK - 1;
                continue;
            }
            memcpy(vc + dst, vc + src, row_bytes);
            for (int c = 0; c < width; c++)
                memcpy(kc + ig_kcache_at(dst_seq, r, c, rows, width) * elem,
                       kc + ig_kcache_at(src_seq, r, c, rows, width) * elem, elem);
        }
    }
    return IG_OK;
}

/* ---- the step ------------------------------------------------------------------------------ */

#define FAIL(code, ...)                                        \
    do {                                                       \
        set_err(m->err, (int)sizeof m->err, __VA_ARGS__);      \
        return (code);                                         \
    } while (0)

static int64_t now_ns(void) {
#if defined(_WIN32)
    return 0;
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
#endif
}

typedef struct {
    const void *const *inputs;
    float *const      *outputs;
    const int32_t     *seq;      /* (T,) KV slot of each row, or NULL: all slot 0 */
    int                T, R;
} step_env;

static void *where(ig_model *m, const step_env *e, int32_t space, int64_t at) {
    switch (space) {
    case IG_SPACE_ARENA: return m->arena + at;
    case IG_SPACE_INPUT: return (void *)e->inputs[at];
    default: return e->outputs[at];
    }
}

static int rows_of(const step_env *e, int32_t code) {
    return code == IG_ROWS_T ? e->T : code == IG_ROWS_R ? e->R : code;
}

/* x @ W^T with W (and the SwiGLU up projection W2, when w2 >= 0) given by weight index, in the
 * weight's packing: its entry in the kernel table says which activations its matmul reads (the f32
 * rows, or m->xq as q8 or x16 blocks, quantized here first) and which function runs it. A SwiGLU
 * pair whose packings differ runs both weights on their f32 rows (ig_model_desc.packed).
 * xq_ready (an IG_ACT_*) says what m->xq already holds for x (IG_ACT_F32: nothing); the return
 * value says what it holds afterwards, so projections of the same rows quantize them once. */
static int linear_x(ig_model *m, float *out, int64_t ldo, const float *x, int64_t ldx, int w, int w2,
                    const float *bias, const float *res, int T, int N, int K, int n_threads,
                    int xq_ready) {
    ig_packed_weight p = m->packed[w], p2 = {IG_PACK_F32, 0, NULL};
    if (w2 >= 0) {
        p2 = m->packed[w2];
        if (p2.packing != p.packing) {
            p = (ig_packed_weight){IG_PACK_F32, 0, m->weights[w]};
            p2 = (ig_packed_weight){IG_PACK_F32, 0, m->weights[w2]};
        }
    }
    const ig_wformat *f = &m->kt->fns.wformat[p.packing];
    ig_matmul_args a = {.out = out, .x = x, .xsum = NULL, .w = p.w, .w2 = p2.w, .bias = bias,
                        .res = res, .ldo = ldo, .ldx = ldx, .ldr = ldo, .T = T, .N = N, .K = K,
                        .layout = p.layout, .layout2 = p2.layout};
    /* A decode step's SwiGLU pair in two passes, the gate's dots into m->gate, then the up
     * projection's into out, then out = silu(gate) * out by the table's SwiGLU: the same dots and
     * the epilogue's arithmetic, so the same bits. The fused tile alternates between the two
     * matrices every 16 rows, and its prefetches of the next tile of each (twice its own bytes)
     * overflow the L1 before they are read: the 1.5B's Q4_K gate/up read at 25 GB/s fused against
     * 33 one after the other. Where the table has a vector SwiGLU (AVX-512: 16 outputs a vector,
     * AVX2: 8), it runs after the passes on this thread (0.5B: ~320 -> ~40 us a token on AVX-512);
     * a table with only the portable loop (generic, NEON) keeps silu(gate) * up in the up pass's
     * epilogue instead (ig_matmul_args.gate), spread over the threads with the dots. */
    const int split = w2 >= 0 && T == 1 && p.packing != IG_PACK_F32;
    if (split) {
        a.w2 = NULL;
        a.layout2 = 0;
    }
    if (f->act == IG_ACT_Q8) {
        if (xq_ready != IG_ACT_Q8) m->kt->fns.quantize_q8_rows(m->xq, x, ldx, T, K);
        a.x = m->xq;
    } else if (f->act == IG_ACT_X16) {
        if (xq_ready != IG_ACT_X16) m->kt->fns.quantize_x16_rows(m->xq, m->xsum, x, ldx, T, K);
        a.x = m->xq;
        a.xsum = m->xsum;
    }
    if (split) {     /* both passes in one job, each piece of rows through the gate then up */
        ig_matmul_args gate = a, up = a;
        gate.out = m->gate;
        up.w = p2.w;
        up.layout = p2.layout;
        const int vector_swiglu = m->kt->fns.eltwise_f32 != ig_eltwise_f32_ref;
        if (!vector_swiglu) up.gate = m->gate;
        const ig_matmul_args parts[2] = {gate, up};
        ig_call_matmuls(f, p.packing, parts, 2, 1, n_threads);
        if (vector_swiglu) m->kt->fns.eltwise_f32(out, m->gate, out, IG_EW_SWIGLU, 1, N, 1);
    } else {
        ig_call_matmul(f, &a, n_threads);
    }
    return f->act == IG_ACT_F32 ? xq_ready : f->act;
}

static void linear(ig_model *m, float *out, int64_t ldo, const float *x, int64_t ldx, int w, int w2,
                   const float *bias, const float *res, int T, int N, int K, int n_threads) {
    linear_x(m, out, ldo, x, ldx, w, w2, bias, res, T, N, K, n_threads, IG_ACT_F32);
}

/* q|k|v projections into one packed (T, qd + 2*kd) buffer; wi: weight indices Wq, Wk, Wv[, bq, bk,
 * bv] */
static void linear_qkv(ig_model *m, float *out, const float *x, const int32_t *wi, int with_bias,
                       const ig_instr *in, int T, int K, int n_threads) {
    const int nh = (int)in->ints[0], nkv = (int)in->ints[1], hd = (int)in->ints[2];
    const int qd = nh * hd, kd = nkv * hd, ld = qd + 2 * kd;
    const float *const *b = m->weights;
    const ig_packed_weight pq = m->packed[wi[0]], pk = m->packed[wi[1]], pv = m->packed[wi[2]];
    if (T == 1 && pq.packing == pk.packing && pq.packing == pv.packing) {
        /* a decode step's three projections as one job (ig_call_matmuls): the same kernel on
         * each row, its x quantized once */
        const ig_wformat *f = &m->kt->fns.wformat[pq.packing];
        const void *xa = x;
        if (f->act == IG_ACT_Q8) {
            m->kt->fns.quantize_q8_rows(m->xq, x, K, T, K);
            xa = m->xq;
        } else if (f->act == IG_ACT_X16) {
            m->kt->fns.quantize_x16_rows(m->xq, m->xsum, x, K, T, K);
            xa = m->xq;
        }
        const ig_packed_weight pw[3] = {pq, pk, pv};
        const int rows[3] = {qd, kd, kd}, at[3] = {0, qd, qd + kd};
        ig_matmul_args parts[3];
        for (int i = 0; i < 3; i++)
            parts[i] = (ig_matmul_args){.out = out + at[i], .x = xa,
                                        .xsum = f->act == IG_ACT_X16 ? m->xsum : NULL,
                                        .w = pw[i].w, .bias = with_bias ? b[wi[3 + i]] : NULL,
                                        .ldo = ld, .ldx = K, .ldr = ld, .T = T, .N = rows[i],
                                        .K = K, .layout = pw[i].layout};
        ig_call_matmuls(f, pq.packing, parts, 3, 0, n_threads);
        return;
    }
    int xq = linear_x(m, out, ld, x, K, wi[0], -1, with_bias ? b[wi[3]] : NULL, NULL, T, qd, K,
                      n_threads, IG_ACT_F32);
    xq = linear_x(m, out + qd, ld, x, K, wi[1], -1, with_bias ? b[wi[4]] : NULL, NULL, T, kd, K,
                  n_threads, xq);
    linear_x(m, out + qd + kd, ld, x, K, wi[2], -1, with_bias ? b[wi[5]] : NULL, NULL, T, kd, K,
             n_threads, xq);
}

/* rope on the q and k sections of packed q|k|v rows (out may equal qkv); v is copied when not in
 * place. q's and k's heads sit side by side, so one call rotates both with one set of angles. */
static void rope_qkv(ig_model *m, float *out, const float *qkv, const int32_t *pos,
                     const ig_instr *in, float theta, int T, int n_threads) {
    const int nh = (int)in->ints[0], nkv = (int)in->ints[1], hd = (int)in->ints[2];
    const int64_t ld = (int64_t)(nh + 2 * nkv) * hd, qk = (int64_t)(nh + nkv) * hd;
    ig_call_rope(&m->kt->fns, out, ld, qkv, ld, pos, rope_table(m, in), T, nh + nkv, hd, theta, n_threads);
    if (out != qkv)
        for (int t = 0; t < T; t++)
            memcpy(out + t * ld + qk, qkv + t * ld + qk, (size_t)(ld - qk) * sizeof(float));
}

/* A key or value as the f16 cache holds it: IEEE half, saturated at +-65504 instead of
 * overflowing to inf (NaN stays NaN). The tiled attention multiplies the value rows a lane does
 * not read by a weight of 0, which leaves finite values out exactly but would make inf a NaN. */
static inline uint16_t kv_half(float x) {
    return ig_f32_to_f16(x > 65504.0f ? 65504.0f : x < -65504.0f ? -65504.0f : x);
}

static ig_status attend(ig_model *m, float *out, const float *q, int64_t ldq, const float *k,
                        const float *v, int64_t ldkv, const int32_t *pos, const int32_t *seq,
                        const ig_instr *in, int T, int n_threads) {
    const int layer = (int)in->ints[0], nh = (int)in->ints[1], nkv = (int)in->ints[2];
    const int hd = (int)in->ints[3], width = nkv * hd;
    /* attention_window carries its window (ints[4], 0: none) and score scale (floats[0]) */
    const int windowed = in->opcode == IG_OP_ATTENTION_WINDOW;
    const float scale = windowed ? (float)in->floats[0] : 1.0f / sqrtf((float)hd);
    const int window = windowed ? (int)in->ints[4] : 0;
    for (int t = 0; t < T; t++)
        if (pos[t] < 0 || pos[t] >= m->max_ctx)
            FAIL(IG_ERR_ARG, "position %d (row %d) is outside the KV cache of %d positions",
                 (int)pos[t], t, m->max_ctx);
    void *kc = m->k_cache[layer], *vc = m->v_cache[layer];
    const int rows = m->kv_rows[layer];      /* max_ctx, or a ring's length, in whole blocks */
    /* every row's k and v go into the cache before any row attends: row t sees its slot's rows
     * at positions <= pos[t], those of this step included */
    for (int t = 0; t < T; t++) {
        const int s = seq ? seq[t] : 0, r = pos[t] % rows;
        const size_t at = ((size_t)s * rows + (size_t)r) * width;
        /* a key's elements are IG_KV_BLOCK apart (ig_kcache_at) */
        const size_t k0 = ig_kcache_at(s, r, 0, rows, width);
        const float *kt = k + (size_t)t * ldkv;
        if (m->kv_f16) {
            const float *vt = v + (size_t)t * ldkv;
            for (int c = 0; c < width; c++) {
                ((uint16_t *)vc)[at + (size_t)c] = kv_half(vt[c]);
                ((uint16_t *)kc)[k0 + (size_t)c * IG_KV_BLOCK] = kv_half(kt[c]);
            }
        } else {
            memcpy((float *)vc + at, v + (size_t)t * ldkv, (size_t)width * sizeof(float));
            for (int c = 0; c < width; c++) ((float *)kc)[k0 + (size_t)c * IG_KV_BLOCK] = kt[c];
        }
    }
    if (ig_call_attention(&m->kt->fns, out, (int64_t)nh * hd, q, ldq, kc, vc, m->kv_f16, pos, seq,
                          m->scratch, T, nh, nkv, hd, m->max_ctx, rows, scale, window, n_threads) != IG_OK)
        FAIL(IG_ERR_NOMEM, "cannot allocate %zu bytes of attention scratch for the thread running "
             "this step (made once per thread)", (size_t)IG_ATTN_SCRATCH_BYTES);
    return IG_OK;
}

static ig_status run_instr(ig_model *m, const ig_instr *in, const step_env *e, int n_threads) {
    float *out = where(m, e, in->out_space, in->out_where);
    const void *arg[IG_MAX_ARGS] = {0};
    for (int a = 0; a < in->n_args; a++) arg[a] = where(m, e, in->arg_space[a], in->arg_where[a]);
    const float *w[IG_MAX_WEIGHTS] = {0};
    const int32_t *wi = in->weight;
    for (int k = 0; k < in->n_weights; k++) w[k] = m->weights[wi[k]];
    const int T = rows_of(e, in->out_rows);
    const int N = (int)in->out_cols, K = (int)in->arg_cols[0];
    const float *x = arg[0];
    const float eps = (float)in->floats[0];
    switch (in->opcode) {
    case IG_OP_EMBED: {
        const int32_t *ids = arg[0];
        const int64_t vocab = m->weight_rows[in->weight[0]];
        for (int t = 0; t < T; t++) {
            if (ids[t] < 0 || ids[t] >= vocab)
                FAIL(IG_ERR_ARG, "token id %d (row %d) is outside the vocabulary 0..%lld", (int)ids[t],
                     t, (long long)vocab - 1);
            memcpy(out + (size_t)t * N, w[0] + (size_t)ids[t] * N, (size_t)N * sizeof(float));
        }
        return IG_OK;
    }
    case IG_OP_RMS_NORMALIZE:
        ig_call_rmsnorm(&m->kt->fns, out, x, NULL, T, N, eps, n_threads);
        return IG_OK;
    case IG_OP_RMSNORM:
        ig_call_rmsnorm(&m->kt->fns, out, x, w[0], T, N, eps, n_threads);
        return IG_OK;
    case IG_OP_SCALE:
        ig_call_eltwise(&m->kt->fns, out, x, w[0], IG_EW_SCALE, T, N, n_threads);
        return IG_OK;
    case IG_OP_LINEAR:
        linear(m, out, N, x, K, wi[0], -1, in->n_weights == 2 ? w[1] : NULL, NULL, T, N, K, n_threads);
        return IG_OK;
    case IG_OP_LINEAR_ADD:
        linear(m, out, N, x, K, wi[0], -1, in->n_weights == 2 ? w[1] : NULL, arg[1], T, N, K,
               n_threads);
        return IG_OK;
    case IG_OP_LINEAR_SWIGLU:
        linear(m, out, N, x, K, wi[0], wi[1], NULL, NULL, T, N, K, n_threads);
        return IG_OK;
    case IG_OP_ROPE:
        ig_call_rope(&m->kt->fns, out, N, x, K, arg[1], rope_table(m, in), T, (int)in->ints[0],
                            (int)in->ints[1], (float)in->floats[0], n_threads);
        return IG_OK;
    case IG_OP_RMSNORM_HEADS:   /* each head_dim-wide head of a row is a row of the norm */
        ig_call_rmsnorm(&m->kt->fns, out, x, w[0], T * (N / (int)in->ints[0]), (int)in->ints[0], eps,
                               n_threads);
        return IG_OK;
    case IG_OP_ADD:
        ig_call_eltwise(&m->kt->fns, out, x, arg[1], IG_EW_ADD, T, N, n_threads);
        return IG_OK;
    case IG_OP_MUL:
        ig_call_eltwise(&m->kt->fns, out, x, arg[1], IG_EW_MUL, T, N, n_threads);
        return IG_OK;
    case IG_OP_SWIGLU:
        ig_call_eltwise(&m->kt->fns, out, x, arg[1], IG_EW_SWIGLU, T, N, n_threads);
        return IG_OK;
    case IG_OP_SILU:
        ig_call_eltwise(&m->kt->fns, out, x, NULL, IG_EW_SILU, T, N, n_threads);
        return IG_OK;
    case IG_OP_TAKE_ROWS: {
        const int32_t *rows = arg[1];
        const int have = rows_of(e, in->arg_rows[0]);
        for (int r = 0; r < T; r++) {
            if (rows[r] < 0 || rows[r] >= have)
                FAIL(IG_ERR_ARG, "row index %d (entry %d) is outside the %d rows of this step",
                     (int)rows[r], r, have);
            memcpy(out + (size_t)r * N, x + (size_t)rows[r] * N, (size_t)N * sizeof(float));
        }
        return IG_OK;
    }
    case IG_OP_LINEAR_QKV:
        linear_qkv(m, out, x, wi, in->n_weights == 6, in, T, K, n_threads);
        return IG_OK;
    case IG_OP_LINEAR_QKV_ROPE:
        linear_qkv(m, out, x, wi, in->n_weights - has_rope_table(in) == 6, in, T, K, n_threads);
        rope_qkv(m, out, out, arg[1], in, (float)in->floats[0], T, n_threads);
        return IG_OK;
    case IG_OP_ROPE_QKV:
        rope_qkv(m, out, x, arg[1], in, (float)in->floats[0], T, n_threads);
        return IG_OK;
    case IG_OP_GEGLU:
        ig_call_eltwise(&m->kt->fns, out, x, arg[1], IG_EW_GEGLU, T, N, n_threads);
        return IG_OK;
    case IG_OP_ATTENTION: case IG_OP_ATTENTION_WINDOW:
        return attend(m, out, x, K, arg[1], arg[2], in->arg_cols[1], arg[3], e->seq, in, T,
                      n_threads);
    case IG_OP_ATTENTION_PACKED: {
        const int qd = (int)(in->ints[1] * in->ints[3]), kd = (int)(in->ints[2] * in->ints[3]);
        return attend(m, out, x, K, x + qd, x + qd + kd, K, arg[1], e->seq, in, T, n_threads);
    }
    case IG_OP_RMS_LINEAR: case IG_OP_RMS_LINEAR_SWIGLU: case IG_OP_RMS_LINEAR_QKV_ROPE: {
        /* the normalized rows live in scratch, not in the arena */
        ig_call_rmsnorm(&m->kt->fns, m->scratch, x, w[0], T, K, eps, n_threads);
        if (in->opcode == IG_OP_RMS_LINEAR)
            linear(m, out, N, m->scratch, K, wi[1], -1, in->n_weights == 3 ? w[2] : NULL, NULL, T, N,
                   K, n_threads);
        else if (in->opcode == IG_OP_RMS_LINEAR_SWIGLU)
            linear(m, out, N, m->scratch, K, wi[1], wi[2], NULL, NULL, T, N, K, n_threads);
        else {
            linear_qkv(m, out, m->scratch, wi + 1, in->n_weights - has_rope_table(in) == 7, in, T, K,
                       n_threads);
            rope_qkv(m, out, out, arg[1], in, (float)in->floats[1], T, n_threads);
        }
        return IG_OK;
    }
    }
    FAIL(IG_ERR_TAPE, "%s (opcode %d) has no case in run_instr", op_name(in->opcode), (int)in->opcode);
}

ig_status ig_model_step(ig_model *m, const void *const *inputs, float *const *outputs, int T, int R,
                        const int32_t *seq, int n_threads, int *failed) {
    *failed = -1;
    m->err[0] = 0;
    if (T < 1 || T > m->max_T || R < 0 || R > m->max_R)
        FAIL(IG_ERR_ARG, "step with T=%d, R=%d; this model was compiled for 1 <= T <= %d, R <= %d", T,
             R, m->max_T, m->max_R);
    for (int i = 0; i < m->n_inputs; i++)
        if (!inputs[i]) FAIL(IG_ERR_ARG, "input %d is NULL", i);
    for (int i = 0; i < m->n_outputs; i++)
        if (!outputs[i]) FAIL(IG_ERR_ARG, "output %d is NULL", i);
    for (int t = 0; seq && t < T; t++)
        if (seq[t] < 0 || seq[t] >= m->n_seq)
            FAIL(IG_ERR_ARG, "row %d belongs to KV slot %d; this model has slots 0..%d", t,
                 (int)seq[t], m->n_seq - 1);
    const step_env e = {inputs, outputs, seq, T, R};
    /* the pool weighs steps on all threads against steps on fewer (threads.c) */
    const int64_t begun = n_threads > 1 ? ig_pool_step_begin() : 0;
    int64_t *prof = m->profile_ns;
    int64_t t_prev = prof ? now_ns() : 0;
    for (int i = 0; i < m->n_instrs; i++) {
        ig_status s = run_instr(m, &m->instrs[i], &e, n_threads);
        if (s != IG_OK) {
            *failed = i;
            if (n_threads > 1) ig_pool_step_done(NULL, T, begun);     /* not a step to weigh */
            return s;
        }
        if (prof) {
            const int64_t t = now_ns();
            prof[i] += t - t_prev;
            t_prev = t;
        }
    }
    if (n_threads > 1) ig_pool_step_done(m, T, begun);
    return IG_OK;
}

void ig_model_profile(ig_model *m, int64_t *ns_per_instr) {
    if (m) m->profile_ns = ns_per_instr;
}
