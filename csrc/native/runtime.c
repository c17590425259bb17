/* runtime.c — the C side of a compiled model (ignis_model.h): reads the blob `ignis compile`
 * embedded in the library (ignis/native/blob.py, modl.py), checks and maps DIR/weights.bin
 * (weights_file.py) or the library's own copy of it (--embed-weights), and runs the compiled step through the executor (csrc/executor.c) to decode.
 * Python writes every format read here; the two sides are tested together by
 * tests/test_native_compile.py. */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE 1
#endif
#if defined(__APPLE__) && !defined(_DARWIN_C_SOURCE)
#define _DARWIN_C_SOURCE 1
#endif
#include "ignis_model.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../ignis.h"
#include "sha256.h"
#include "api.h"
#include "json.h"

#define set_error ig_rt_set_error
#define clear_error ig_rt_clear_error

#define IG_API __attribute__((visibility("default")))

/* the blob, between two hidden symbols of the assembled data object (ignis/native/link.py) */
extern const unsigned char ignis_blob_start[];
extern const unsigned char ignis_blob_end[];
/* weights.bin's bytes when the library was compiled with --embed-weights (else an empty range):
 * [0] its start, [1] its end, as pointers (the bytes may lie beyond a 32-bit offset from code) */
extern const unsigned char *const ignis_weights_range[2];

#define BLOB_VERSION 1
#define MODL_VERSION 1
#define WEIGHTS_HEADER 64
enum { KV_F32 = 0, KV_F16 = 1, KV_AUTO = 2 };
enum { ROLE_TOKENS = 0, ROLE_POS = 1, ROLE_ROWS = 2 };

/* ---- errors: one message per thread ---------------------------------------------------------- */

/* The buffer is allocated per thread through a pthread key rather than _Thread_local: a
 * dynamic-TLS variable would make the library need the dynamic loader's __tls_get_addr (an
 * ld-linux NEEDED entry); setup.py compiles the core's few TLS words as initial-exec. */
#define ERR_BYTES 1024
static pthread_key_t err_key;
static pthread_once_t err_once = PTHREAD_ONCE_INIT;
static char err_fallback[ERR_BYTES];     /* when a thread's buffer cannot be allocated */

static void err_key_make(void) { pthread_key_create(&err_key, free); }

static char *err_buf(void) {
    pthread_once(&err_once, err_key_make);
    char *b = pthread_getspecific(err_key);
    if (!b) {
        b = calloc(1, ERR_BYTES);
        if (!b || pthread_setspecific(err_key, b) != 0) {
            free(b);
            return err_fallback;
        }
    }
    return b;
}

void ig_rt_set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf(), ERR_BYTES, fmt, ap);
    va_end(ap);
}

void ig_rt_clear_error(void) { err_buf()[0] = 0; }

IG_API const char *ignis_last_error(void) { return err_buf(); }
IG_API int ignis_abi_version(void) { return IGNIS_ABI_VERSION; }
IG_API void ignis_free(char *s) { free(s); }

/* ---- the blob ---------------------------------------------------------------------------------- */


/* The section `tag`; returns 0 when the blob is malformed or of another version (error set), and
 * a span of length 0 with p NULL when the tag is absent. */
static int blob_section(const char *tag, span *out) {
    const unsigned char *b = ignis_blob_start;
    const size_t n = (size_t)(ignis_blob_end - ignis_blob_start);
    out->p = NULL;
    out->len = 0;
    if (n < 16 || memcmp(b, "IGNBLOB", 8) != 0) {
        set_error("the library's model data is damaged (no blob magic)");
        return 0;
    }
    uint32_t version, count;
    memcpy(&version, b + 8, 4);
    memcpy(&count, b + 12, 4);
    if (version != BLOB_VERSION) {
        set_error("the library's model data is blob version %u, this runtime reads version %d: "
                  "compile the model again with this ignis", version, BLOB_VERSION);
        return 0;
    }
    if (16 + (size_t)count * 24 > n) {
        set_error("the library's model data is damaged (section table past its end)");
        return 0;
    }
    for (uint32_t i = 0; i < count; i++) {
        const unsigned char *e = b + 16 + (size_t)i * 24;
        uint64_t off, len;
        memcpy(&off, e + 8, 8);
        memcpy(&len, e + 16, 8);
        if (off > n || len > n - off) {
            set_error("the library's model data is damaged (section %.4s past its end)", (const char *)e);
            return 0;
        }
        if (memcmp(e, tag, 4) == 0) {
            out->p = b + off;
            out->len = (size_t)len;
            return 1;
        }
    }
    return 1;
}

/* a bounds-checked cursor over a section */
typedef struct {
    const unsigned char *p, *end;
    int bad;
} reader;

static const void *rd_take(reader *r, size_t n) {
    if (r->bad || (size_t)(r->end - r->p) < n) {
        r->bad = 1;
        return NULL;
    }
    const void *at = r->p;
    r->p += n;
    return at;
}
static int32_t rd_i32(reader *r) {
    int32_t v = 0;
    const void *p = rd_take(r, 4);
    if (p) memcpy(&v, p, 4);
    return v;
}
static int64_t rd_i64(reader *r) {
    int64_t v = 0;
    const void *p = rd_take(r, 8);
    if (p) memcpy(&v, p, 8);
    return v;
}
static void rd_align(reader *r, const unsigned char *base) {
    const size_t off = (size_t)(r->p - base), pad = (8 - off % 8) % 8;
    rd_take(r, pad);
}

/* ---- a flat JSON object's members (options_json, manifest.json), read with json.h ------------- */
/* Scalar values are reported; nested objects and arrays are skipped (allow_nested) or an error. */

typedef enum { JV_STRING, JV_NUMBER, JV_BOOL, JV_NULL } jv_kind;
typedef struct {
    jv_kind kind;
    char    str[256];
    double  num;
    int     boolean;
    int     truncated;     /* a string longer than str */
} jvalue;
typedef int (*json_key_fn)(const char *key, const jvalue *v, void *ctx);   /* 0: stop (error set) */

static int json_flat_each(const char *text, size_t len, const char *what, int allow_nested,
                          json_key_fn fn, void *ctx) {
    ig_json_error je;
    ig_json_doc *doc = ig_json_parse(text, len, NULL, &je);
    if (!doc) {
        set_error("%s is not valid JSON (%s)", what, je.message);
        return 0;
    }
    const ig_json *root = ig_json_root(doc);
    int ok = root->type == IG_JSON_OBJECT;
    if (!ok) set_error("%s must be a JSON object", what);
    for (size_t i = 0; ok && i < root->u.obj.n; i++) {
        const ig_json_member *mb = &root->u.obj.members[i];
        const ig_json *x = mb->value;
        /* a NUL (\u0000) would cut the key or value short for the string compares below */
        if (strlen(mb->key) != mb->key_len || (x->type == IG_JSON_STRING && strlen(x->u.str.s) != x->u.str.len)) {
            set_error("%s: the %s of \"%s\" holds a NUL character (\\u0000), which no option or manifest field "
                      "takes", what, strlen(mb->key) != mb->key_len ? "key" : "value", mb->key);
            ok = 0;
            continue;
        }
        jvalue v;
        memset(&v, 0, sizeof v);
        switch (x->type) {
        case IG_JSON_STRING:
            v.kind = JV_STRING;
            v.truncated = x->u.str.len >= sizeof v.str;
            memcpy(v.str, x->u.str.s, v.truncated ? sizeof v.str - 1 : x->u.str.len);
            break;
        case IG_JSON_NUMBER: v.kind = JV_NUMBER, v.num = x->u.num.d; break;
        case IG_JSON_TRUE: case IG_JSON_FALSE: v.kind = JV_BOOL, v.boolean = x->type == IG_JSON_TRUE; break;
        case IG_JSON_NULL: v.kind = JV_NULL; break;
        default:
            if (allow_nested) continue;
            set_error("%s: \"%s\" must be a string, number or boolean", what, mb->key);
            ok = 0;
            continue;
        }
        ok = fn(mb->key, &v, ctx);
    }
    ig_json_free(doc);
    return ok;
}

/* ---- options ---------------------------------------------------------------------------------- */

typedef struct {
    int  threads;          /* 0: default */
    char kernels[64];      /* "": default */
    int  kv_dtype;         /* KV_* */
    int  verify_weights;
    int  huge_pages;
} options;

static int option_key(const char *key, const jvalue *v, void *ctx) {
    options *o = ctx;
    if (strcmp(key, "threads") == 0) {
        if (v->kind != JV_NUMBER || v->num != floor(v->num) || v->num < 1 || v->num > IG_MAX_THREADS) {
            set_error("options: \"threads\" must be an integer in 1..%d", IG_MAX_THREADS);
            return 0;
        }
        o->threads = (int)v->num;
    } else if (strcmp(key, "kernels") == 0) {
        if (v->kind != JV_STRING || v->truncated || strlen(v->str) >= sizeof o->kernels) {
            set_error("options: \"kernels\" must be a kernel table name (\"generic\", \"avx2\", ...)");
            return 0;
        }
        strcpy(o->kernels, v->str);
    } else if (strcmp(key, "kv_dtype") == 0) {
        if (v->kind != JV_STRING || (strcmp(v->str, "auto") && strcmp(v->str, "f32") && strcmp(v->str, "f16"))) {
            set_error("options: \"kv_dtype\" must be \"auto\", \"f32\" or \"f16\"");
            return 0;
        }
        o->kv_dtype = strcmp(v->str, "f32") == 0 ? KV_F32 : strcmp(v->str, "f16") == 0 ? KV_F16 : KV_AUTO;
    } else if (strcmp(key, "verify_weights") == 0 || strcmp(key, "huge_pages") == 0) {
        if (v->kind != JV_BOOL) {
            set_error("options: \"%s\" must be true or false", key);
            return 0;
        }
        *(strcmp(key, "huge_pages") == 0 ? &o->huge_pages : &o->verify_weights) = v->boolean;
    } else {
        set_error("options: unknown key \"%s\" (known: threads, kernels, kv_dtype, verify_weights, "
                  "huge_pages)", key);
        return 0;
    }
    return 1;
}

/* ---- default thread count: affinity mask, capped by a cgroup CPU quota (ignis/runtime/cpus.py) */

static int read_small(const char *path, char *buf, size_t cap) {
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    const ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    return 1;
}

static void v2_quota(const char *dir, double *best) {
    char path[4200], buf[128], q[64];
    long long period;
    snprintf(path, sizeof path, "%s/cpu.max", dir);
    if (!read_small(path, buf, sizeof buf) || sscanf(buf, "%63s %lld", q, &period) != 2) return;
    char *endp;
    const long long quota = strtoll(q, &endp, 10);
    if (*endp || quota <= 0 || period <= 0) return;   /* "max": no quota */
    const double cpus = (double)quota / (double)period;
    if (*best < 0 || cpus < *best) *best = cpus;
}

static void v1_quota(const char *dir, double *best) {
    char path[4200], buf[64];
    long long quota, period;
    snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
    if (!read_small(path, buf, sizeof buf) || sscanf(buf, "%lld", &quota) != 1) return;
    snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
    if (!read_small(path, buf, sizeof buf) || sscanf(buf, "%lld", &period) != 1) return;
    if (quota <= 0 || period <= 0) return;
    const double cpus = (double)quota / (double)period;
    if (*best < 0 || cpus < *best) *best = cpus;
}

static int default_threads(void) {
    int n = ig_cpus_available();
    double quota = -1;
    char own[8192];
    if (read_small("/proc/self/cgroup", own, sizeof own)) {
        char *save = NULL;       /* strtok's state is shared by every thread opening a handle */
        for (char *line = strtok_r(own, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
            if (!c2) continue;
            *c1 = 0, *c2 = 0;
            const char *ctrl = c1 + 1, *rel = c2 + 1;
            while (*rel == '/') rel++;
            char dir[4096];
            if (strcmp(line, "0") == 0 && *ctrl == 0) {          /* v2: the path up to the root */
                snprintf(dir, sizeof dir, "/sys/fs/cgroup%s%s", *rel ? "/" : "", rel);
                for (;;) {
                    v2_quota(dir, &quota);
                    char *slash = strrchr(dir, '/');
                    if (!slash || strcmp(dir, "/sys/fs/cgroup") == 0) break;
                    *slash = 0;
                }
            } else {                                              /* v1: the cpu controller */
                char ctrls[256];
                snprintf(ctrls, sizeof ctrls, ",%s,", ctrl);
                if (!strstr(ctrls, ",cpu,")) continue;
                static const char *const MOUNTS[] = {"cpu", "cpu,cpuacct", "cpuacct,cpu"};
                for (int i = 0; i < 3; i++) {
                    snprintf(dir, sizeof dir, "/sys/fs/cgroup/%s/%s", MOUNTS[i], rel);
                    v1_quota(dir, &quota);
                    snprintf(dir, sizeof dir, "/sys/fs/cgroup/%s", MOUNTS[i]);
                    v1_quota(dir, &quota);
                }
            }
        }
    } else {
        v2_quota("/sys/fs/cgroup", &quota);
        v1_quota("/sys/fs/cgroup/cpu", &quota);
    }
    if (quota > 0) {
        const int q = (int)ceil(quota - 1e-9);
        if (q < n) n = q < 1 ? 1 : q;
    }
    return n < 1 ? 1 : n;
}

/* ---- the handle ------------------------------------------------------------------------------- */

typedef struct {
    int64_t rows, elems;
    int32_t packing, layout;
    int64_t f32_off, f32_bytes, packed_off, packed_bytes;
} weight_entry;


typedef struct {
    const char *sha256;           /* expected, hex */
    int64_t     size;
    int         ok_sha, ok_abi, ok_fmt, ok_size;
    char        got_sha[72];
    double      abi, fmt, got_size;
} manifest_check;

static int manifest_key(const char *key, const jvalue *v, void *ctx) {
    manifest_check *m = ctx;
    if (strcmp(key, "sha256") == 0 && v->kind == JV_STRING) {
        snprintf(m->got_sha, sizeof m->got_sha, "%.70s", v->str);
        m->ok_sha = 1;
    } else if (strcmp(key, "abi_version") == 0 && v->kind == JV_NUMBER) {
        m->abi = v->num, m->ok_abi = 1;
    } else if (strcmp(key, "weights_format_version") == 0 && v->kind == JV_NUMBER) {
        m->fmt = v->num, m->ok_fmt = 1;
    } else if (strcmp(key, "size") == 0 && v->kind == JV_NUMBER) {
        m->got_size = v->num, m->ok_size = 1;
    }
    return 1;
}

static char *read_file(const char *path, size_t max, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(max + 1);
    size_t n = buf ? fread(buf, 1, max + 1, f) : 0;
    fclose(f);
    if (!buf || n > max) {
        free(buf);
        errno = EFBIG;
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

static void sample_digest(uint8_t out[32], const unsigned char *data, int64_t size, int64_t chunk,
                          int64_t samples) {
    ig_sha256_ctx c;
    ig_sha256_init(&c);
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)((uint64_t)size >> (8 * i));
    ig_sha256_update(&c, le, 8);
    if (size > 0) {
        int64_t n = (size + chunk - 1) / chunk;
        if (n > samples) n = samples;
        const int64_t len = chunk < size ? chunk : size;
        for (int64_t i = 0; i < n; i++) {
            const int64_t off = n == 1 ? 0 : i * (size - len) / (n - 1);
            ig_sha256_update(&c, data + off, (size_t)len);
        }
    }
    ig_sha256_final(&c, out);
}

/* A MODL-format section (MODL, EMBD: ignis/native/modl.py) read in place. */
typedef struct {
    ig_model_desc d;
    int kv_mode, vocab, width, n_eos, f32_weights, n_valid;
    const int32_t *roles, *eos;
    const unsigned char *valid, *table;
    int64_t w_size, w_chunk, w_samples;
    const uint8_t *w_sha, *w_sample;
} modl_view;

static int read_modl(span s, const char *what, modl_view *o) {
    memset(o, 0, sizeof *o);
    reader r = {s.p, s.p + s.len, 0};
    const uint32_t modl_version = (uint32_t)rd_i32(&r), instr_size = (uint32_t)rd_i32(&r);
    if (modl_version != MODL_VERSION || instr_size != ig_instr_size()) {
        set_error("the library's %s is format %u with %u-byte instructions; its runtime "
                  "reads format %d with %zu-byte instructions: compile the model again with one ignis",
                  what, modl_version, instr_size, MODL_VERSION, ig_instr_size());
        return 0;
    }
    ig_model_desc d;
    memset(&d, 0, sizeof d);
    d.n_instrs = rd_i32(&r);
    d.n_weights = rd_i32(&r);
    d.n_inputs = rd_i32(&r);
    d.n_outputs = rd_i32(&r);
    d.arena_bytes = rd_i64(&r);
    d.scratch_bytes = rd_i64(&r);
    d.max_T = rd_i32(&r);
    d.max_R = rd_i32(&r);
    d.max_ctx = rd_i32(&r);
    d.n_kv_layers = rd_i32(&r);
    o->kv_mode = rd_i32(&r), o->vocab = rd_i32(&r), o->width = rd_i32(&r), o->n_eos = rd_i32(&r);
    o->f32_weights = rd_i32(&r);
    d.n_seq = 1;
    if (r.bad || d.n_inputs < 1 || d.n_inputs > MAX_INPUTS || d.n_outputs != 1 || d.n_weights < 0 ||
        d.n_instrs < 0 || d.n_kv_layers < 0 || o->n_eos < 0 || o->vocab < 1 || o->width < 1 || d.max_T < 1) {
        set_error("the library's %s is damaged (header)", what);
        return 0;
    }
    rd_align(&r, s.p);
    o->roles = rd_take(&r, 4 * (size_t)d.n_inputs);
    rd_align(&r, s.p);
    d.kv_widths = rd_take(&r, 4 * (size_t)d.n_kv_layers);
    rd_align(&r, s.p);
    o->eos = rd_take(&r, 4 * (size_t)o->n_eos);
    rd_align(&r, s.p);
    o->n_valid = rd_i32(&r);
    o->valid = rd_take(&r, ((size_t)(o->n_valid > 0 ? o->n_valid : 0) + 7) / 8);
    rd_align(&r, s.p);
    o->w_size = rd_i64(&r), o->w_chunk = rd_i64(&r), o->w_samples = rd_i64(&r);
    o->w_sha = rd_take(&r, 32), o->w_sample = rd_take(&r, 32);
    o->table = rd_take(&r, (size_t)d.n_weights * 56);
    rd_align(&r, s.p);
    d.instrs = rd_take(&r, (size_t)d.n_instrs * instr_size);
    if (r.bad || (o->n_valid != 0 && o->n_valid != o->vocab) || o->w_chunk < 1 || o->w_samples < 1 ||
        o->w_size < WEIGHTS_HEADER) {
        set_error("the library's %s is damaged (runs past its section)", what);
        return 0;
    }
    o->d = d;
    return 1;
}

static void free_handle(ignis_model *h) {
    if (!h) return;
    if (h->exec) ig_model_free(h->exec);
    if (h->embd.exec) ig_model_free(h->embd.exec);
    for (int i = 0; i < MAX_INPUTS; i++) free(h->embd.in_buf[i]);
    free(h->embd.out);
    free(h->w_poff), free(h->w_pptr);
    if (h->map && h->map != ignis_weights_range[0]) munmap((void *)h->map, h->map_bytes);
    if (h->huge) munmap(h->huge, h->huge_bytes);
    for (int i = 0; i < MAX_INPUTS; i++) free(h->in_buf[i]);
    free(h->out);
    free(h->eos);
    free(h->valid);
    ig_api_close(h);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

static const ig_kernel_table *pick_table(const char *name) {
    if (!*name) {
        const char *env = getenv("IGNIS_KERNELS");
        if (env && *env) name = env;
    }
    if (!*name) return ig_kernel_table_best();
    const ig_kernel_table *t = ig_kernel_table_find(name);
    if (!t) {
        char known[512] = "";
        for (int i = 0; i < ig_kernel_table_count(); i++) {
            if (i) strncat(known, ", ", sizeof known - strlen(known) - 1);
            strncat(known, ig_kernel_table_at(i)->name, sizeof known - strlen(known) - 1);
        }
        set_error("kernel table \"%s\" does not exist (this library has: %s)", name, known);
        return NULL;
    }
    if (!ig_kernel_table_eligible(t)) {
        set_error("kernel table \"%s\" needs CPU features this machine lacks", name);
        return NULL;
    }
    return t;
}

/* manifest.json of DIR: its versions, and the weights it names must be the ones this library was
 * built for. */
static int check_manifest(const char *dir, const char *sha_hex, int64_t w_size) {
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    size_t mlen;
    char *mtext = read_file(path, 1 << 20, &mlen);
    if (!mtext) {
        set_error("cannot read %s: %s (ignis_open takes the directory ignis compile wrote)", path,
                  strerror(errno));
        return 0;
    }
    manifest_check mc;
    memset(&mc, 0, sizeof mc);
    const int parsed = json_flat_each(mtext, mlen, path, 1, manifest_key, &mc);
    free(mtext);
    if (!parsed) return 0;
    if (!mc.ok_sha || !mc.ok_abi || !mc.ok_fmt || !mc.ok_size) {
        set_error("%s lacks sha256, size, abi_version or weights_format_version", path);
        return 0;
    }
    if (mc.abi != IGNIS_ABI_VERSION) {
        set_error("%s is for ABI version %g; this library is ABI version %d", path, mc.abi, IGNIS_ABI_VERSION);
        return 0;
    }
    if (mc.fmt != IGNIS_WEIGHTS_FORMAT_VERSION) {
        set_error("%s describes weights format version %g; this library reads version %d", path, mc.fmt,
                  IGNIS_WEIGHTS_FORMAT_VERSION);
        return 0;
    }
    if (strcmp(mc.got_sha, sha_hex) != 0 || mc.got_size != (double)w_size) {
        set_error("%s names weights with sha256 %s (%.0f bytes); this library was built for "
                  "sha256 %s (%lld bytes): the directory's files come from another compile",
                  path, mc.got_sha, mc.got_size, sha_hex, (long long)w_size);
        return 0;
    }
    return 1;
}

/* The weights: the library's own copy when it was compiled with --embed-weights, else DIR/weights.bin
 * mapped read-only (of the size the library was built for). `path` receives the name errors use. */
static const void *map_weights(const char *dir, int64_t w_size, const char *sha_hex, char *path,
                               size_t cap) {
    const size_t embedded = (size_t)(ignis_weights_range[1] - ignis_weights_range[0]);
    if (embedded) {
        snprintf(path, cap, "the library's embedded weights");
        if (embedded != (size_t)w_size) {
            set_error("%s are %zu bytes; its compiled step expects %lld: the library is damaged", path,
                      embedded, (long long)w_size);
            return NULL;
        }
        return ignis_weights_range[0];
    }
    snprintf(path, cap, "%s/weights.bin", dir);
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        set_error("cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size != w_size) {
        set_error("%s is %lld bytes; this library was built for %lld bytes (sha256 %s): the file is "
                  "damaged or from another compile", path, (long long)st.st_size, (long long)w_size, sha_hex);
        close(fd);
        return NULL;
    }
    void *map = mmap(NULL, (size_t)w_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        set_error("cannot map %s: %s", path, strerror(errno));
        return NULL;
    }
    return map;
}

IG_API ignis_model *ignis_open(const char *dir, const char *options_json) {
    clear_error();
    const size_t embedded = (size_t)(ignis_weights_range[1] - ignis_weights_range[0]);
    if (!dir && !embedded) {
        set_error("ignis_open: dir is NULL (only a library compiled with --embed-weights opens "
                  "without its directory)");
        return NULL;
    }
    if (dir && strlen(dir) > 4000) {       /* dir + "/manifest.json" must fit path[4096] below, uncut */
        set_error("ignis_open: dir is %zu bytes long; at most 4000 are taken", strlen(dir));
        return NULL;
    }
    options o = {0, "", KV_AUTO, 0, 1};
    const char *hp = getenv("IGNIS_HUGEPAGES");
    if (hp && (strcmp(hp, "0") == 0 || *hp == 0)) o.huge_pages = 0;
    if (options_json && !json_flat_each(options_json, strlen(options_json), "options_json", 0,
                                        option_key, &o))
        return NULL;

    /* the compiled step */
    span s;
    if (!blob_section("MODL", &s)) return NULL;
    if (!s.p) {
        set_error("the library has no MODL section: it was not made by ignis compile");
        return NULL;
    }
    modl_view mv;
    if (!read_modl(s, "compiled step", &mv)) return NULL;
    ig_model_desc d = mv.d;
    const int kv_mode = mv.kv_mode, vocab = mv.vocab, width = mv.width, n_eos = mv.n_eos;
    const int f32_weights = mv.f32_weights, n_valid = mv.n_valid;
    const int32_t *roles = mv.roles, *eos = mv.eos;
    const unsigned char *valid = mv.valid, *table = mv.table;
    const int64_t w_size = mv.w_size, w_chunk = mv.w_chunk, w_samples = mv.w_samples;
    const uint8_t *w_sha = mv.w_sha, *w_sample = mv.w_sample;
    if (width < vocab) {
        set_error("the library's compiled step is damaged (output width %d < vocabulary %d)", width, vocab);
        return NULL;
    }
    char sha_hex[65];
    ig_sha256_hex(sha_hex, w_sha);

    char path[4096];
    if (dir && !check_manifest(dir, sha_hex, w_size)) return NULL;
    const void *map = map_weights(dir, w_size, sha_hex, path, sizeof path);
    if (!map) return NULL;
    ignis_model *h = calloc(1, sizeof *h);
    if (!h) {
        if (map != ignis_weights_range[0]) munmap((void *)map, (size_t)w_size);
        set_error("out of memory");
        return NULL;
    }
    pthread_mutex_init(&h->lock, NULL);
    h->map = map;
    h->map_bytes = (size_t)w_size;
    const unsigned char *wb = map;
    uint32_t wver;
    memcpy(&wver, wb + 8, 4);
    if (memcmp(wb, "IGNWGHT", 8) != 0 || wver != IGNIS_WEIGHTS_FORMAT_VERSION) {
        set_error("%s is not an ignis weights file of format version %d (magic or version differ)", path,
                  IGNIS_WEIGHTS_FORMAT_VERSION);
        goto fail;
    }
    uint8_t got[32];
    char got_hex[65];
    if (o.verify_weights) {
        ig_sha256(got, wb, (size_t)w_size);
        if (memcmp(got, w_sha, 32) != 0) {
            ig_sha256_hex(got_hex, got);
            set_error("%s has sha256 %s; this library was built for sha256 %s: the file is damaged or "
                      "from another compile", path, got_hex, sha_hex);
            goto fail;
        }
    } else {
        sample_digest(got, wb, w_size, w_chunk, w_samples);
        if (memcmp(got, w_sample, 32) != 0) {
            char want_hex[65];
            ig_sha256_hex(got_hex, got);
            ig_sha256_hex(want_hex, w_sample);
            set_error("%s: the digest of its sampled chunks is %s, this library expects %s (the "
                      "weights of sha256 %s): the file is damaged or from another compile", path,
                      got_hex, want_hex, sha_hex);
            goto fail;
        }
    }

    /* weight pointers; packed arrays optionally copied to 2 MB pages */
    d.kernels = pick_table(o.kernels);
    if (!d.kernels) goto fail;
    const float **wp = calloc((size_t)(d.n_weights ? d.n_weights : 1), sizeof *wp);
    ig_packed_weight *pp = calloc((size_t)(d.n_weights ? d.n_weights : 1), sizeof *pp);
    int64_t *rows = calloc((size_t)(d.n_weights ? d.n_weights : 1), sizeof *rows);
    int64_t *elems = calloc((size_t)(d.n_weights ? d.n_weights : 1), sizeof *elems);
    weight_entry *we = calloc((size_t)(d.n_weights ? d.n_weights : 1), sizeof *we);
    if (!wp || !pp || !rows || !elems || !we) {
        set_error("out of memory");
        goto fail_w;
    }
    size_t huge_need = 0;
    for (int i = 0; i < d.n_weights; i++) {
        reader e = {table + (size_t)i * 56, table + (size_t)(i + 1) * 56, 0};
        we[i].rows = rd_i64(&e), we[i].elems = rd_i64(&e);
        we[i].packing = rd_i32(&e), we[i].layout = rd_i32(&e);
        we[i].f32_off = rd_i64(&e), we[i].f32_bytes = rd_i64(&e);
        we[i].packed_off = rd_i64(&e), we[i].packed_bytes = rd_i64(&e);
        const weight_entry *x = &we[i];
        const int has_f32 = x->f32_off >= 0, has_packed = x->packed_off >= 0;
        if ((has_f32 && (x->f32_off % 64 || x->f32_bytes != x->elems * 4 || x->f32_off > w_size - x->f32_bytes)) ||
            (has_packed && (x->packed_off % 64 || x->packed_bytes < 0 || x->packed_off > w_size - x->packed_bytes)) ||
            (!has_f32 && !has_packed) || (has_packed != (x->packing != IG_PACK_F32))) {
            set_error("the library's weight table is damaged (weight %d)", i);
            goto fail_w;
        }
        if (has_packed) huge_need += ((size_t)x->packed_bytes + 63) / 64 * 64;
        rows[i] = x->rows;
        elems[i] = x->elems;
    }
    const size_t huge_page = 2u << 20;
    unsigned char *dst = NULL;
    if (o.huge_pages && huge_need) {
        h->huge_bytes = (huge_need + huge_page - 1) / huge_page * huge_page + huge_page;
        void *hm = mmap(NULL, h->huge_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (hm == MAP_FAILED) {
            h->huge_bytes = 0;        /* run from the file mapping instead */
        } else {
            h->huge = hm;
#ifdef MADV_HUGEPAGE
            madvise(hm, h->huge_bytes, MADV_HUGEPAGE);
#endif
            dst = h->huge + (huge_page - (uintptr_t)h->huge % huge_page) % huge_page;
        }
    }
    for (int i = 0; i < d.n_weights; i++) {
        const weight_entry *x = &we[i];
        const void *packed = NULL;
        if (x->packed_off >= 0) {
            packed = wb + x->packed_off;
            if (dst) {
                memcpy(dst, packed, (size_t)x->packed_bytes);
                packed = dst;
                dst += ((size_t)x->packed_bytes + 63) / 64 * 64;
            }
            pp[i] = (ig_packed_weight){x->packing, x->layout, packed};
        } else {
            pp[i] = (ig_packed_weight){IG_PACK_F32, 0, wb + x->f32_off};
        }
        /* a packed matmul weight whose f32 rows nothing reads has none stored (ignis/native/
         * compile.py _f32_needed); the executor wants a non-NULL pointer and never reads it */
        wp[i] = (const float *)(x->f32_off >= 0 ? wb + x->f32_off : packed);
    }
    h->w_poff = malloc(sizeof *h->w_poff * (size_t)(d.n_weights ? d.n_weights : 1));
    h->w_pptr = malloc(sizeof *h->w_pptr * (size_t)(d.n_weights ? d.n_weights : 1));
    if (!h->w_poff || !h->w_pptr) {
        set_error("out of memory");
        goto fail_w;
    }
    for (int i = 0; i < d.n_weights; i++) h->w_poff[i] = we[i].packed_off, h->w_pptr[i] = pp[i].w;
    h->n_w = d.n_weights;
    d.weights = wp;
    d.packed = pp;
    d.weight_rows = rows;
    d.weight_elems = elems;
    int kv = o.kv_dtype != KV_AUTO ? o.kv_dtype : kv_mode;
    if (kv == KV_AUTO)   /* ignis.runtime.engine.choose_kv_dtype */
        kv = !f32_weights && (strcmp(d.kernels->name, "avx512") == 0 ||
                              strcmp(d.kernels->name, "avx512_vnni") == 0) ? KV_F16 : KV_F32;
    d.kv_f16 = kv == KV_F16;
    char err[512] = "";
    const ig_status status = ig_model_create(&h->exec, &d, err, (int)sizeof err);
    free(wp), free(pp), free(rows), free(elems), free(we);
    wp = NULL, pp = NULL, rows = NULL, elems = NULL, we = NULL;
    if (status != IG_OK) {
        set_error("the executor refused the compiled step: %s", err);
        goto fail;
    }

    h->threads = o.threads ? o.threads : default_threads();
    h->max_T = d.max_T, h->max_R = d.max_R, h->max_ctx = d.max_ctx;
    h->vocab = vocab, h->width = width, h->n_inputs = d.n_inputs;
    h->select = 0;
    for (int i = 0; i < d.n_inputs; i++) {
        if (roles[i] < ROLE_TOKENS || roles[i] > ROLE_ROWS) {
            set_error("the library's compiled step has an unknown input role %d", (int)roles[i]);
            goto fail;
        }
        if (roles[i] == ROLE_ROWS) h->select = 1;
        h->in_buf[i] = calloc((size_t)d.max_T, sizeof(int32_t));
        if (!h->in_buf[i]) goto nomem;
    }
    const size_t out_rows = h->select ? (size_t)(d.max_R > 0 ? d.max_R : 1) : (size_t)d.max_T;
    h->out = calloc(out_rows * (size_t)width, sizeof(float));
    h->eos = malloc(sizeof(int32_t) * (size_t)(n_eos ? n_eos : 1));
    if (!h->out || !h->eos) goto nomem;
    memcpy(h->eos, eos, sizeof(int32_t) * (size_t)n_eos);
    h->n_eos = n_eos;
    if (n_valid) {
        h->valid = malloc(((size_t)n_valid + 7) / 8);
        if (!h->valid) goto nomem;
        memcpy(h->valid, valid, ((size_t)n_valid + 7) / 8);
    }
    /* roles: remember which buffer is which */
    int32_t *by_role[3] = {0};
    for (int i = 0; i < d.n_inputs; i++) by_role[roles[i]] = h->in_buf[i];
    if (!by_role[ROLE_TOKENS] || !by_role[ROLE_POS]) {
        set_error("the library's compiled step does not take tokens and positions");
        goto fail;
    }
    memcpy(h->role, by_role, sizeof by_role);
    h->kernels = d.kernels->name;
    h->kv_f16 = d.kv_f16;
    span tokn, chat;
    if (!blob_section("CONF", &h->conf) || !blob_section("TOKN", &tokn) || !blob_section("CHAT", &chat) ||
        !ig_api_open(h, tokn, chat))
        goto fail;
    return h;
nomem:
    set_error("out of memory");
    goto fail;
fail_w:
    free(wp), free(pp), free(rows), free(elems), free(we);
fail:
    free_handle(h);
    return NULL;
}

/* ---- running ---------------------------------------------------------------------------------- */

/* Run ids at positions n_past.. (chunks of max_T, as Engine.forward); on success the last
 * position's logits are at *last. Caller holds the lock. */
int ig_rt_run_tokens(ignis_model *h, const int32_t *ids, int n, const float **last) {
    if (n < 1) {
        set_error("the prompt is empty: give at least one token id");
        return -1;
    }
    if (n > h->max_ctx - h->n_past) {
        set_error("%d tokens after %d cached positions need %lld positions; the context holds %d",
                  n, h->n_past, (long long)n + h->n_past, h->max_ctx);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= h->vocab) {
            set_error("token id %d at index %d is outside the vocabulary 0..%d", (int)ids[i], i, h->vocab - 1);
            return -1;
        }
    const void *ins[MAX_INPUTS];
    for (int i = 0; i < h->n_inputs; i++) ins[i] = h->in_buf[i];
    float *outs[1] = {h->out};
    int T = 0;
    for (int s = 0; s < n; s += T) {
        T = n - s < h->max_T ? n - s : h->max_T;
        memcpy(h->role[ROLE_TOKENS], ids + s, sizeof(int32_t) * (size_t)T);
        for (int t = 0; t < T; t++) h->role[ROLE_POS][t] = h->n_past + t;
        if (h->select) h->role[ROLE_ROWS][0] = T - 1;
        int failed = -1;
        const ig_status st = ig_model_step(h->exec, ins, outs, T, h->select ? 1 : 0, NULL, h->threads, &failed);
        if (st != IG_OK) {
            set_error("step failed at instruction %d: %s", failed, ig_model_error(h->exec));
            return -1;
        }
        h->n_past += T;
    }
    *last = h->select ? h->out : h->out + (size_t)(T - 1) * (size_t)h->width;
    return 0;
}

/* ---- the embedding step (EMBD), opened on first use ------------------------------------------- */

static int embd_open(ignis_model *h) {
    embd_step *e = &h->embd;
    if (e->exec) return 1;
    span s;
    if (!blob_section("EMBD", &s)) return 0;
    if (!s.p) {
        set_error("this library has no embedding step: it was compiled by an ignis without embeddings; "
                  "compile the model again");
        return 0;
    }
    modl_view mv;
    if (!read_modl(s, "embedding step", &mv)) return 0;
    ig_model_desc d = mv.d;
    if ((size_t)mv.w_size != h->map_bytes) {
        set_error("the library's embedding step was built for other weights (%lld bytes, not %zu)",
                  (long long)mv.w_size, h->map_bytes);
        return 0;
    }
    const size_t nw = (size_t)(d.n_weights ? d.n_weights : 1);
    const float **wp = calloc(nw, sizeof *wp);
    ig_packed_weight *pp = calloc(nw, sizeof *pp);
    int64_t *rows = calloc(nw, sizeof *rows), *elems = calloc(nw, sizeof *elems);
    int ok = 0;
    if (!wp || !pp || !rows || !elems) {
        set_error("out of memory");
        goto done;
    }
    for (int i = 0; i < d.n_weights; i++) {
        reader r = {mv.table + (size_t)i * 56, mv.table + (size_t)(i + 1) * 56, 0};
        weight_entry x;
        x.rows = rd_i64(&r), x.elems = rd_i64(&r);
        x.packing = rd_i32(&r), x.layout = rd_i32(&r);
        x.f32_off = rd_i64(&r), x.f32_bytes = rd_i64(&r);
        x.packed_off = rd_i64(&r), x.packed_bytes = rd_i64(&r);
        const int64_t size = (int64_t)h->map_bytes;
        if ((x.f32_off >= 0 && (x.f32_off % 64 || x.f32_bytes != x.elems * 4 || x.f32_off > size - x.f32_bytes)) ||
            (x.packed_off >= 0 && (x.packed_off % 64 || x.packed_bytes < 0 || x.packed_off > size - x.packed_bytes)) ||
            (x.f32_off < 0 && x.packed_off < 0) || ((x.packed_off >= 0) != (x.packing != IG_PACK_F32))) {
            set_error("the library's embedding weight table is damaged (weight %d)", i);
            goto done;
        }
        const void *packed = NULL;
        if (x.packed_off >= 0) {
            /* the generation step's copy of the same bytes (2 MB pages) when it has one */
            packed = h->map + x.packed_off;
            for (int j = 0; j < h->n_w; j++)
                if (h->w_poff[j] == x.packed_off) {
                    packed = h->w_pptr[j];
                    break;
                }
            pp[i] = (ig_packed_weight){x.packing, x.layout, packed};
        } else {
            pp[i] = (ig_packed_weight){IG_PACK_F32, 0, h->map + x.f32_off};
        }
        wp[i] = (const float *)(x.f32_off >= 0 ? h->map + x.f32_off : packed);
        rows[i] = x.rows, elems[i] = x.elems;
    }
    d.weights = wp, d.packed = pp, d.weight_rows = rows, d.weight_elems = elems;
    d.kernels = ig_kernel_table_find(h->kernels);
    d.kv_f16 = h->kv_f16;          /* as Model's embedding Engine: the generation engine's kv_dtype */
    char err[512] = "";
    if (ig_model_create(&e->exec, &d, err, (int)sizeof err) != IG_OK) {
        e->exec = NULL;
        set_error("the executor refused the embedding step: %s", err);
        goto done;
    }
    e->max_T = d.max_T, e->max_R = d.max_R, e->width = mv.width, e->n_inputs = d.n_inputs, e->select = 0;
    for (int i = 0; i < d.n_inputs; i++) {
        if (mv.roles[i] < ROLE_TOKENS || mv.roles[i] > ROLE_ROWS) {
            set_error("the library's embedding step has an unknown input role %d", (int)mv.roles[i]);
            goto done;
        }
        if (mv.roles[i] == ROLE_ROWS) e->select = 1;
        if (!(e->in_buf[i] = calloc((size_t)d.max_T, sizeof(int32_t)))) goto nomem;
        e->role[mv.roles[i]] = e->in_buf[i];
    }
    if (!e->role[ROLE_TOKENS] || !e->role[ROLE_POS]) {
        set_error("the library's embedding step does not take tokens and positions");
        goto done;
    }
    if (!(e->out = calloc((size_t)d.max_T * (size_t)e->width, sizeof(float)))) goto nomem;
    ok = 1;
    goto done;
nomem:
    set_error("out of memory");
done:
    free(wp), free(pp), free(rows), free(elems);
    if (!ok && e->exec) {
        ig_model_free(e->exec);
        for (int i = 0; i < MAX_INPUTS; i++) free(e->in_buf[i]), e->in_buf[i] = NULL;
        free(e->out);
        memset(e, 0, sizeof *e);
    }
    return ok;
}

int ig_rt_embed_width(ignis_model *h) { return embd_open(h) ? h->embd.width : -1; }

int ig_rt_embed(ignis_model *h, const int32_t *ids, int n, int last, double *v) {
    if (!embd_open(h)) return -1;
    embd_step *e = &h->embd;
    if (n < 1 || n > h->max_ctx) {
        set_error("%d tokens do not fit the context of %d", n, h->max_ctx);
        return -1;
    }
    const void *ins[MAX_INPUTS];
    for (int i = 0; i < e->n_inputs; i++) ins[i] = e->in_buf[i];
    float *outs[1] = {e->out};
    for (int j = 0; j < e->width; j++) v[j] = 0;
    int T = 0;
    for (int s = 0; s < n; s += T) {    /* from an empty cache: positions 0.. (Engine.reset) */
        T = n - s < e->max_T ? n - s : e->max_T;
        memcpy(e->role[ROLE_TOKENS], ids + s, sizeof(int32_t) * (size_t)T);
        for (int t = 0; t < T; t++) {
            e->role[ROLE_POS][t] = s + t;
            if (e->select) e->role[ROLE_ROWS][t] = t;
        }
        int failed = -1;
        if (ig_model_step(e->exec, ins, outs, T, e->select ? T : 0, NULL, h->threads, &failed) != IG_OK) {
            set_error("embedding step failed at instruction %d: %s", failed, ig_model_error(e->exec));
            return -1;
        }
        for (int t = last ? T - 1 : 0; t < T; t++)
            for (int j = 0; j < e->width; j++) {
                const double x = e->out[(size_t)t * (size_t)e->width + (size_t)j];
                if (last) v[j] = x;
                else v[j] += x;
            }
    }
    if (!last)
        for (int j = 0; j < e->width; j++) v[j] /= n;
    return e->width;
}

/* the highest logit among the ids that may be generated; the first on a tie (numpy's argmax) */
static int argmax_valid(const ignis_model *h, const float *x) {
    int best = -1;
    float bv = 0;
    for (int i = 0; i < h->vocab; i++) {
        if (h->valid && !(h->valid[i >> 3] >> (i & 7) & 1)) continue;
        if (best < 0 || x[i] > bv) best = i, bv = x[i];
    }
    return best;
}

IG_API int ignis_generate_ids(ignis_model *m, const int32_t *prompt, int n_prompt, int max_new,
                              int32_t *out, int out_cap) {
    clear_error();
    if (!m || (!prompt && n_prompt) || (!out && out_cap > 0) || max_new < 0 || out_cap < 0) {
        set_error("ignis_generate_ids: a NULL handle or buffer, or a negative count");
        return -1;
    }
    pthread_mutex_lock(&m->lock);
    m->n_past = 0;
    const float *logits;
    int n = 0, rc = ig_rt_run_tokens(m, prompt, n_prompt, &logits);
    const int limit = max_new < out_cap ? max_new : out_cap;
    while (rc == 0 && n < limit) {
        const int32_t tok = argmax_valid(m, logits);
        int stop = tok < 0;
        for (int i = 0; i < m->n_eos && !stop; i++) stop = m->eos[i] == tok;
        if (stop) break;
        out[n++] = tok;
        if (n == limit || m->n_past >= m->max_ctx) break;
        rc = ig_rt_run_tokens(m, &tok, 1, &logits);
    }
    pthread_mutex_unlock(&m->lock);
    return rc == 0 ? n : -1;
}

IG_API int ignis_logits(ignis_model *m, const int32_t *prompt, int n_prompt, float *logits, int cap) {
    clear_error();
    if (!m || (!prompt && n_prompt) || !logits) {
        set_error("ignis_logits: a NULL handle or buffer");
        return -1;
    }
    if (cap < m->width) {
        set_error("ignis_logits: the buffer holds %d floats, the logits are %d", cap, m->width);
        return -1;
    }
    pthread_mutex_lock(&m->lock);
    m->n_past = 0;
    const float *last;
    const int rc = ig_rt_run_tokens(m, prompt, n_prompt, &last);
    if (rc == 0) memcpy(logits, last, sizeof(float) * (size_t)m->width);
    pthread_mutex_unlock(&m->lock);
    return rc == 0 ? m->width : -1;
}

IG_API char *ignis_model_info(ignis_model *m) {
    clear_error();
    if (!m) {
        set_error("ignis_model_info: the handle is NULL");
        return NULL;
    }
    /* the kernel table's name is one of dispatch.c's identifiers: no escaping needed */
    const char *fmt = "{\"abi_version\": %d, \"kernels\": \"%s\", \"kv_dtype\": \"%s\", \"threads\": %d, "
                      "\"n_ctx\": %d, \"max_batch_tokens\": %d, \"vocab_size\": %d, \"compiled\": %.*s}";
    const char *conf = m->conf.p ? (const char *)m->conf.p : "null";
    const int conf_len = m->conf.p ? (int)m->conf.len : 4;
    const int n = snprintf(NULL, 0, fmt, IGNIS_ABI_VERSION, m->kernels, m->kv_f16 ? "f16" : "f32",
                           m->threads, m->max_ctx, m->max_T, m->vocab, conf_len, conf);
    char *out = malloc((size_t)n + 1);
    if (!out) {
        set_error("out of memory");
        return NULL;
    }
    snprintf(out, (size_t)n + 1, fmt, IGNIS_ABI_VERSION, m->kernels, m->kv_f16 ? "f16" : "f32", m->threads,
             m->max_ctx, m->max_T, m->vocab, conf_len, conf);
    return out;
}

IG_API void ignis_close(ignis_model *m) { free_handle(m); }
