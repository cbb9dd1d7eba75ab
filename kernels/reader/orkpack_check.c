/* orkpack-check PACK...: the checks of `orkpack verify --device host` (orkpack/runtime/verify.py) on
 * liborkpack, for a board without Python. In order, stopping at a pack's first failure:
 *   open    preamble, header checksum, the whole header (orkpack_open)
 *   data    the data-section checksum
 *   parts   every part's checksum, host copies included
 *   layout  what the NPU load paths rely on (orkpack_check_npu_slice)
 *   arena   every NPU slice placed in the IOVA arena (tier map cap or 4 GiB - 104 MiB)
 *   load    every NPU slice through its real path (int8: cacheable fill; nf4: direct inflate), the
 *           image compared with its recorded checksums (the q/scale parts, or the inflate record)
 * One line per pack on stdout, starting with its result: "ok PATH: ...", "FAIL PATH: CHECK: why" or
 * "unusable PATH: why". Exit code: 0 all passed, 1 a check failed, 2 unusable input (the worst
 * over all packs), as `orkpack verify`.
 *
 * --dump also prints, for a pack that opens, one line per part and per loaded NPU image (tab-separated:
 * "part"|"host", tensor index, slice index, part name, offset, size, xxh3 of the bytes the reader
 * returns; "npu", tensor index, slice index, image size, q xxh3, scale xxh3; "dec", tensor index, slice
 * index, "part" (a host slice) or "host" (an NPU slice's host copy), the encoding (nf4, nf4dq, int5dq, int6dq, int8dq), elements, xxh3 of the
 * float32 decode by orkpack_decode_host, for every quantized slice on the host), for tests/test_c_reader.py.
 *
 * --model prints, for a pack that opens, its model record (format 1.3, docs/FORMAT.md 9) as read through
 * orkpack_model_kv / orkpack_kv_*: one line per entry, tab-separated: "kv", key, type, element count, and
 * the xxh3 of its elements (integers as int64 LE, floats as double LE with every NaN as eight 0xff bytes,
 * strings as u64 LE length + bytes), or "bad" and why. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "orkpack_reader.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void print_path(const char *p) {
    for (; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
}

static int fail(const char *path, const char *what, const char *msg) {
    printf("FAIL ");
    print_path(path);
    printf(": %s: %s\n", what, msg);
    return 1;
}

static void dump_parts(const orkpack_t *pk) {
    for (size_t ti = 0; ti < orkpack_tensor_count(pk); ti++) {
        const orkpack_tensor_t *t = orkpack_tensor(pk, ti);
        for (size_t si = 0; si < t->nslices; si++) {
            const orkpack_slice_t *s = &t->slices[si];
            for (int h = 0; h < 2; h++) {
                const orkpack_part_t *parts = h ? s->host_parts : s->parts;
                int np = h ? s->host_nparts : s->nparts;
                for (int k = 0; k < np; k++)
                    printf("%s\t%zu\t%zu\t%s\t%llu\t%llu\t%016llx\n", h ? "host" : "part", ti, si, parts[k].name,
                           (unsigned long long)parts[k].offset, (unsigned long long)parts[k].size,
                           (unsigned long long)orkpack_xxh3(parts[k].ptr, (size_t)parts[k].size));
            }
        }
    }
}

/* the float32 decode of every host nf4 / nf4dq / intdq slice and host copy (orkpack_decode_host) */
static void dump_decoded(const orkpack_t *pk) {
    for (size_t ti = 0; ti < orkpack_tensor_count(pk); ti++) {
        const orkpack_tensor_t *t = orkpack_tensor(pk, ti);
        for (size_t si = 0; si < t->nslices; si++) {
            const orkpack_slice_t *s = &t->slices[si];
            for (int h = 0; h < 2; h++) {
                int enc = h ? (s->has_host_copy ? s->host_encoding : -1) : (s->tier == ORKPACK_TIER_HOST ? s->encoding : -1);
                static const char *const NAMES[] = {[ORKPACK_ENC_NF4] = "nf4", [ORKPACK_ENC_NF4DQ] = "nf4dq",
                                                    [ORKPACK_ENC_INT5DQ] = "int5dq", [ORKPACK_ENC_INT6DQ] = "int6dq",
                                                    [ORKPACK_ENC_INT8DQ] = "int8dq"};
                if (enc < 0 || enc > ORKPACK_ENC_INT8DQ || !NAMES[enc]) continue;
                float *out = (float *)malloc(s->numel ? (size_t)s->numel * sizeof(float) : 1);
                orkpack_err_t err;
                printf("dec\t%zu\t%zu\t%s\t%s\t%llu\t", ti, si, h ? "host" : "part", NAMES[enc],
                       (unsigned long long)s->numel);
                if (!out) printf("bad out of memory\n");
                else if (orkpack_decode_host(s, h, 0, s->numel, out, &err)) printf("bad %s\n", err.msg);
                else printf("%016llx\n", (unsigned long long)orkpack_xxh3(out, (size_t)s->numel * sizeof(float)));
                free(out);
            }
        }
    }
}

static void dump_model(const orkpack_t *pk) {
    size_t n = orkpack_model_kv_count(pk);
    for (size_t i = 0; i < n; i++) {
        orkpack_kv_t kv;
        orkpack_err_t err;
        printf("kv\t");
        if (orkpack_model_kv(pk, i, &kv, &err)) {
            printf("?\t?\t0\tbad %s\n", err.msg);
            continue;
        }
        print_path(kv.key);
        printf("\t%s\t%zu\t", kv.type, kv.count);
        size_t m = kv.count ? kv.count : 1, bytes = 0;
        int64_t *iv = malloc(m * sizeof *iv);
        double *dv = malloc(m * sizeof *dv);
        const char **sv = malloc(m * sizeof *sv);
        size_t *lv = malloc(m * sizeof *lv);
        unsigned char *buf = NULL;
        int rc = -1;
        if (iv && dv && sv && lv) {
            int is_f = strstr(kv.type, "float") != NULL, is_s = strstr(kv.type, "string") != NULL;
            if (!is_f && !is_s) {
                if (orkpack_kv_ints(pk, &kv, iv, kv.count, &err) == ORKPACK_OK) {
                    buf = malloc(m * 8);
                    if (buf) { memcpy(buf, iv, kv.count * 8); bytes = kv.count * 8; rc = 0; }
                }
            } else if (is_f && orkpack_kv_floats(pk, &kv, dv, kv.count, &err) == ORKPACK_OK) {
                for (size_t k = 0; k < kv.count; k++)
                    if (dv[k] != dv[k]) memset(&dv[k], 0xff, 8);
                buf = malloc(m * 8);
                if (buf) { memcpy(buf, dv, kv.count * 8); bytes = kv.count * 8; rc = 0; }
            } else if (is_s && orkpack_kv_strings(pk, &kv, sv, lv, kv.count, &err) == ORKPACK_OK) {
                size_t total = 0;
                for (size_t k = 0; k < kv.count; k++) total += 8 + lv[k];
                buf = malloc(total ? total : 1);
                if (buf) {
                    for (size_t k = 0; k < kv.count; k++) {
                        uint64_t L = lv[k];
                        memcpy(buf + bytes, &L, 8);
                        memcpy(buf + bytes + 8, sv[k], lv[k]);
                        bytes += 8 + lv[k];
                    }
                    rc = 0;
                }
            }
        }
        if (rc == 0) printf("%016llx\n", (unsigned long long)orkpack_xxh3(buf, bytes));
        else printf("bad %s\n", err.msg);
        free(buf);
        free(iv);
        free(dv);
        free(sv);
        free(lv);
    }
}

static int check_one(const char *path, int dump, int model) {
    double t0 = now();
    orkpack_t *pk = NULL;
    orkpack_err_t err;
    int rc = orkpack_open(path, &pk, &err);
    if (rc) {
        if (rc == ORKPACK_E_DAMAGED) {
            printf("FAIL ");
            print_path(path);
            size_t L = strlen(path);
            const char *m = (strncmp(err.msg, path, L) == 0 && strncmp(err.msg + L, ": ", 2) == 0) ? err.msg + L + 2 : err.msg;
            printf(": open: %s\n", m);
            return 1;
        }
        printf("unusable %s\n", err.msg);
        return 2;
    }
    if (dump) {
        dump_parts(pk);
        dump_decoded(pk);
    }
    if (model) dump_model(pk);
    int code = 0;
    size_t nparts = 0, nslices = 0, nnpu = 0;
    uint64_t loaded = 0;
    char lab[200];
    if (orkpack_check_data(pk, &err)) { code = fail(path, "data", err.msg); goto out; }
    if (orkpack_check_parts(pk, &nparts, &err)) { code = fail(path, "parts", err.msg); goto out; }
    /* layout, then arena, then load: each over every NPU slice */
    for (size_t ti = 0; ti < orkpack_tensor_count(pk); ti++) {
        const orkpack_tensor_t *t = orkpack_tensor(pk, ti);
        for (size_t si = 0; si < t->nslices; si++) {
            nslices++;
            if (t->slices[si].tier != ORKPACK_TIER_NPU) continue;
            nnpu++;
            if (orkpack_check_npu_slice(pk, t, &t->slices[si], &err)) { code = fail(path, "layout", err.msg); goto out; }
        }
    }
    const char *src;
    uint64_t cap = orkpack_npu_cap(pk, &src), used = 0;
    for (size_t ti = 0; ti < orkpack_tensor_count(pk); ti++) {
        const orkpack_tensor_t *t = orkpack_tensor(pk, ti);
        for (size_t si = 0; si < t->nslices; si++) {
            const orkpack_slice_t *s = &t->slices[si];
            if (s->tier != ORKPACK_TIER_NPU) continue;
            uint64_t size = orkpack_npu_image_size(s);
            uint64_t span = size < 1 ? 1 : size;
            span = span > UINT64_MAX - 4095 ? UINT64_MAX : (span + 4095) / 4096 * 4096;
            if (span > cap || used > cap - span) {
                char msg[800];
                snprintf(msg, sizeof msg, "%s: needs %llu bytes at IOVA offset %llu, past the arena cap of %llu bytes (%s)",
                         orkpack_slice_label(t, s, lab, sizeof lab), (unsigned long long)span, (unsigned long long)used,
                         (unsigned long long)cap, src);
                code = fail(path, "arena", msg);
                goto out;
            }
            used += span;
        }
    }
    for (size_t ti = 0; ti < orkpack_tensor_count(pk); ti++) {
        const orkpack_tensor_t *t = orkpack_tensor(pk, ti);
        for (size_t si = 0; si < t->nslices; si++) {
            const orkpack_slice_t *s = &t->slices[si];
            if (s->tier != ORKPACK_TIER_NPU) continue;
            size_t qsize = (size_t)orkpack_npu_image_size(s), n = (size_t)s->shape[0];
            void *q = malloc(qsize ? qsize : 1);
            float *scale = (float *)malloc(n * sizeof(float));
            if (!q || !scale) {
                free(q);
                free(scale);
                printf("unusable ");
                print_path(path);
                printf(": out of memory loading %s\n", orkpack_slice_label(t, s, lab, sizeof lab));
                code = 2;
                goto out;
            }
            rc = orkpack_load_npu(pk, s, q, qsize, scale, n, 1, &err);
            uint64_t gq = rc ? 0 : orkpack_xxh3(q, qsize), gs = rc ? 0 : orkpack_xxh3(scale, n * sizeof(float));
            free(q);
            free(scale);
            orkpack_slice_label(t, s, lab, sizeof lab);
            char msg[800];
            if (rc) {
                snprintf(msg, sizeof msg, "%s: %s", lab, err.msg);
                code = fail(path, "load", msg);
                goto out;
            }
            int nf4 = s->encoding == ORKPACK_ENC_NF4;
            uint64_t wq = nf4 ? s->inflate_q_xxh3 : s->parts[0].xxh3, ws = nf4 ? s->inflate_scale_xxh3 : s->parts[1].xxh3;
            if (dump) printf("npu\t%zu\t%zu\t%zu\t%016llx\t%016llx\n", ti, si, qsize, (unsigned long long)gq, (unsigned long long)gs);
            if (gq != wq || gs != ws) {
                snprintf(msg, sizeof msg, "%s: %s %s differ from the recorded image (recorded %016llx, loaded %016llx)", lab,
                         nf4 ? "inflated (direct)" : "filled", gq != wq ? "int8 tiles" : "scales",
                         (unsigned long long)(gq != wq ? wq : ws), (unsigned long long)(gq != wq ? gq : gs));
                code = fail(path, "load", msg);
                goto out;
            }
            loaded += qsize;
        }
    }
    printf("ok ");
    print_path(path);
    printf(": %zu slices (%zu NPU), %zu parts, %.3f GiB file, %.3f GiB NPU images loaded, %.3f s%s\n", nslices, nnpu,
           nparts, (double)orkpack_preamble(pk)->file_size / (1 << 30), (double)loaded / (1 << 30), now() - t0,
           orkpack_preamble(pk)->flags & ORKPACK_FLAG_ONLINE_R4
               ? "; flag 0x1: the runtime must rotate every ffn_down input online (R4, provenance.rotation.r4)" : "");
out:
    orkpack_close(pk);
    return code;
}

int main(int argc, char **argv) {
    int dump = 0, model = 0, worst = 0, npacks = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--dump") == 0) dump = 1;
        else if (strcmp(argv[i], "--model") == 0) model = 1;
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("usage: orkpack-check [--dump] [--model] PACK...\n"
                   "the checks of `orkpack verify --device host`; exit 0 passed, 1 a check failed, 2 unusable input\n");
            return 0;
        } else if (strncmp(argv[i], "--", 2) == 0 && argv[i][2]) {
            fprintf(stderr, "orkpack-check: unknown option %s\n", argv[i]);
            return 2;
        } else npacks++;
    }
    if (!npacks) {
        fprintf(stderr, "usage: orkpack-check [--dump] [--model] PACK...\n");
        return 2;
    }
    int opts = 1;
    for (int i = 1; i < argc; i++) {
        if (opts && strcmp(argv[i], "--") == 0) { opts = 0; continue; }
        if (opts && strncmp(argv[i], "--", 2) == 0) continue;
        int c = check_one(argv[i], dump, model);
        fflush(stdout);
        if (c > worst) worst = c;
    }
    return worst;
}
