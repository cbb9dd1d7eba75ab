/* libFuzzer target for liborkpack (docs/READER.md):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I/usr/include/cjson kernels/reader/fuzz_reader.c \
 *         kernels/reader/reader.c kernels/reader/jscan.c kernels/runtime.c -lcjson -lxxhash -lm -o fuzz_reader
 *   ./fuzz_reader -max_total_time=300 CORPUS/
 * Input modes (first byte mod 3), as fuzz/harness.py: 0 the file as is; 1 the file with the checksums
 * it declares recomputed; 2 byte 1 = data pages, the rest a header JSON wrapped in a correct preamble.
 * Property: no crash, leak or sanitizer report; any pack that opens is checked and its NPU slices loaded. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "orkpack_reader.h"

static void put64(uint8_t *b, size_t at, uint64_t v) { memcpy(b + at, &v, 8); }
static uint64_t get64(const uint8_t *b, size_t at) { uint64_t v; memcpy(&v, b + at, 8); return v; }

static void fix(uint8_t *b, size_t n) {
    if (n < 4096) return;
    uint64_t doff = get64(b, 24), dsize = get64(b, 32), hoff = get64(b, 40), hsize = get64(b, 48);
    if (doff <= n && dsize <= n - doff) put64(b, 56, XXH3_64bits(b + doff, dsize));
    if (hoff <= n && hsize <= n - hoff) put64(b, 64, XXH3_64bits(b + hoff, hsize));
    memset(b + 120, 0, 8);
    put64(b, 120, XXH3_64bits(b, 4096));
}

static uint8_t *wrap(const uint8_t *hdr, size_t hn, unsigned pages, size_t *out_n) {
    size_t ds = (size_t)pages * 4096, n = 4096 + ds + hn;
    uint8_t *b = calloc(1, n);
    if (!b) return NULL;
    memcpy(b, "ORKPACK\0", 8);
    uint16_t maj = 1, min = 2;
    uint32_t ps = 128, al = 4096;
    memcpy(b + 8, &maj, 2);
    memcpy(b + 10, &min, 2);
    memcpy(b + 12, &ps, 4);
    put64(b, 16, n);
    put64(b, 24, 4096);
    put64(b, 32, ds);
    put64(b, 40, 4096 + ds);
    put64(b, 48, hn);
    memcpy(b + 72, &al, 4);
    memcpy(b + 4096 + ds, hdr, hn);
    fix(b, n);
    *out_n = n;
    return b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char path[64];
    if (!path[0]) snprintf(path, sizeof path, "/dev/shm/orkpack-fuzz-%d", (int)getpid());
    if (!size) return 0;
    uint8_t *buf;
    size_t n;
    int mode = data[0] % 3;
    if (mode == 2) {
        buf = wrap(data + 2 < data + size ? data + 2 : data + size, size > 2 ? size - 2 : 0, size > 1 ? data[1] % 8 : 0, &n);
    } else {
        n = size - 1;
        buf = malloc(n ? n : 1);
        if (buf) memcpy(buf, data + 1, n);
        if (buf && mode == 1) fix(buf, n);
    }
    if (!buf) return 0;
    FILE *f = fopen(path, "wb");
    if (!f) { free(buf); return 0; }
    fwrite(buf, 1, n, f);
    fclose(f);
    free(buf);
    orkpack_t *pk;
    orkpack_err_t err;
    if (orkpack_open(path, &pk, &err) == 0) {
        orkpack_check_data(pk, &err);
        orkpack_check_parts(pk, NULL, &err);
        for (size_t i = 0; i < orkpack_tensor_count(pk); i++) {
            const orkpack_tensor_t *t = orkpack_tensor(pk, i);
            orkpack_find_n(pk, t->name, t->name_len);
            for (size_t s = 0; s < t->nslices; s++) {
                const orkpack_slice_t *sl = &t->slices[s];
                char lab[64];
                orkpack_slice_label(t, sl, lab, sizeof lab);
                if (sl->tier != ORKPACK_TIER_NPU || orkpack_check_npu_slice(pk, t, sl, &err)) continue;
                uint64_t q = orkpack_npu_image_size(sl);
                if (q > (64u << 20)) continue;
                void *qb = malloc(q ? q : 1);
                float *sc = malloc((size_t)sl->shape[0] * 4 + 4);
                if (qb && sc) orkpack_load_npu(pk, sl, qb, q, sc, (size_t)sl->shape[0], 1, &err);
                free(qb);
                free(sc);
            }
        }
        orkpack_close(pk);
    }
    return 0;
}
