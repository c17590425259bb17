/* api_fuzz.c — hostile and valid requests through the compiled library's JSON entry points, run by
 * tests/test_native_api.py under valgrind (memcheck: invalid reads and writes, uninitialised
 * values, leaks). Every answer must be a JSON object (a response or an error object), never a
 * crash. Input file: records of one kind byte ('c' completions, 'h' chat, 'x' a completions stream
 * cancelled at its second chunk, 'a' a chat whose answer is given: the body starts with a u32 count
 * and that many little-endian i32 token ids, then the request, for ig_testonly_chat_forced, the
 * library's test entry), a little-endian u32 length, the body's bytes (any bytes; the body is
 * NUL-terminated here, as the ABI takes it).
 *     api_fuzz DIR REQUESTS */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ignis_model.h"

static int chunks;

/* the library's test entry (not in ignis_model.h): a chat whose answer's tokens are given */
char *ig_testonly_chat_forced(ignis_model *m, const char *request_json, const int32_t *ids, size_t n_ids,
                         ignis_chunk_cb cb, void *user);

static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int on_chunk(const char *json, void *user) {
    const int cancel_at = *(const int *)user;
    if (json[0] != '{') {
        fprintf(stderr, "a chunk is not a JSON object: %.80s\n", json);
        exit(2);
    }
    return cancel_at > 0 && ++chunks >= cancel_at;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s DIR REQUESTS\n", argv[0]);
        return 2;
    }
    ignis_model *m = ignis_open(argv[1], "{\"threads\": 1, \"kernels\": \"generic\", \"huge_pages\": false}");
    if (!m) {
        fprintf(stderr, "ignis_open: %s\n", ignis_last_error());
        return 1;
    }
    FILE *f = fopen(argv[2], "rb");
    if (!f) return 1;
    int n = 0, errors = 0;
    unsigned char head[5];
    while (fread(head, 1, 5, f) == 5) {
        const uint32_t len = (uint32_t)head[1] | (uint32_t)head[2] << 8 | (uint32_t)head[3] << 16 | (uint32_t)head[4] << 24;
        char *body = malloc((size_t)len + 1);
        if (!body || fread(body, 1, len, f) != len) return 1;
        body[len] = 0;
        int cancel_at = head[0] == 'x' ? 2 : 0;
        chunks = 0;
        char *out;
        if (head[0] == 'a') {
            const uint32_t k = len >= 4 ? rd32((const unsigned char *)body) : 0;
            if (len < 4 || (len - 4) / 4 < k) return 1;
            int32_t *ids = malloc(4 * (size_t)(k ? k : 1));
            if (!ids) return 1;
            for (uint32_t i = 0; i < k; i++) ids[i] = (int32_t)rd32((const unsigned char *)body + 4 + 4 * i);
            out = ig_testonly_chat_forced(m, body + 4 + 4 * (size_t)k, ids, k, on_chunk, &cancel_at);
            free(ids);
        } else {
            out = head[0] == 'h' ? ignis_chat_completions(m, body, on_chunk, &cancel_at)
                                 : ignis_completions(m, body, on_chunk, &cancel_at);
        }
        if (!out || out[0] != '{') {
            fprintf(stderr, "request %d: no JSON object answered (%s)\n", n, out ? out : ignis_last_error());
            return 1;
        }
        errors += strncmp(out, "{\"error\"", 8) == 0;
        ignis_free(out);
        free(body);
        n++;
    }
    fclose(f);
    ignis_close(m);
    printf("%d requests, %d error objects\n", n, errors);
    return 0;
}
