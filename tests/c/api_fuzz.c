/* api_fuzz.c — hostile and valid requests through the compiled library's JSON entry points, run by
 * tests/test_native_api.py under valgrind (memcheck: invalid reads and writes, uninitialised
 * values, leaks). Every answer must be a JSON object (a response or an error object), never a
 * crash. Input file: records of one kind byte ('c' completions, 'h' chat, 'x' a completions stream
 * cancelled at its second chunk), a little-endian u32 length, the body's bytes (any bytes; the
 * body is NUL-terminated here, as the ABI takes it).
 *     api_fuzz DIR REQUESTS */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ignis_model.h"

static int chunks;

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
        char *out = head[0] == 'h' ? ignis_chat_completions(m, body, on_chunk, &cancel_at)
                                   : ignis_completions(m, body, on_chunk, &cancel_at);
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
