/* driver.c: runs orkpack's C kernels (kernels/codecs.c, kernels/runtime.c) on inputs read from
 * files and writes their outputs to files, so that a build for another ISA (aarch64 under
 * qemu-aarch64, or x86-64 with -DORK_NO_X86_SIMD) can be compared byte for byte with the
 * x86-64 kernels and the numpy references (tests/test_aarch64.py).
 *
 * Commands come on stdin, one a line, file names relative to the working directory:
 *
 *   isa                                              print "codecs <level> runtime <level> nf4opt <level>"
 *   nf4_encode DT N CHUNK_BLOCKS IN CODES ABSMAX STATS
 *   nf4_decode N CODES ABSMAX OUT
 *   int8_encode DT N K KSEG CHUNK_ROWS IN Q SCALE STATS   (KSEG 0: row-major q; else tiled, rows up to Np)
 *   int8_decode N K KSEG Q SCALE OUT
 *   int8_tile N K KSEG Q OUT
 *   widen DT N IN OUT COUNT                           (COUNT: int64 non-finite count, twice: widen, count)
 *   fill N OFF IN OUT                                 (ork_rt_fill of IN to OUT+OFF with clean, then
 *                                                      ork_rt_clean of odd sub-ranges; OUT has N+OFF+64 bytes)
 *   inflate METHOD PORTABLE N K KSEG CHUNK_TILES CODES ABSMAX Q SCALE   (METHOD direct|two_step)
 *   rt_decode N CODES ABSMAX OUT
 *   nf4opt_encode DT N K WEIGHTING BLOCK TRIES CHUNK IN COLW CODES ABSMAX STATS   (COLW "-": no column weights)
 *   nf4dq_encode DT N K WEIGHTING CHUNK IN COLW CODES ABSMAX_Q SCALE OFFSET STATS  (the three steps, as NF4DQCodec)
 *   nf4dq_decode N CODES ABSMAX_Q SCALE OFFSET OUT
 *
 * STATS files hold the chunk-order fold that orkpack/codecs/__init__.py does: double sum_x2,
 * double sum_err2, int64 nonfinite. Each command prints "ok <cmd>" or "FAIL <cmd>: why", and the
 * exit code is the number of failures (so a crash or a bad return code is seen).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs.h"
#include "nf4opt.h"
#include "orkpack.h"
#include "runtime.h"

static int failures = 0;

static void *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (size) *size = (size_t)(n > 0 ? n : 0);
    return buf;
}

static int write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t w = n ? fwrite(p, 1, n, f) : 0;
    fclose(f);
    return w == n;
}

static void *xmalloc(size_t n) {
    /* 64-byte aligned, as the arena's buffers are; poisoned so unwritten bytes show */
    size_t sz = (n + 63) / 64 * 64 + 64;
    void *p = aligned_alloc(64, sz);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(100);
    }
    memset(p, 0xA5, sz);
    return p;
}

static size_t dt_size(int dt) { return dt == ORK_DT_F32 ? 4 : 2; }

#define NEED(cond, why)                                  \
    do {                                                 \
        if (!(cond)) {                                   \
            printf("FAIL %s: %s\n", cmd, why);           \
            failures++;                                  \
            return;                                      \
        }                                                \
    } while (0)

static void write_stats(const char *cmd, const char *path, double sx, double se, int64_t nf) {
    unsigned char b[24];
    memcpy(b, &sx, 8);
    memcpy(b + 8, &se, 8);
    memcpy(b + 16, &nf, 8);
    NEED(write_file(path, b, sizeof b), "cannot write stats");
}

static void do_nf4_encode(const char *cmd, char **a) {
    int dt = atoi(a[0]);
    int64_t n = atoll(a[1]), chunk = atoll(a[2]);
    size_t insz;
    void *x = read_file(a[3], &insz);
    NEED(x && insz == (size_t)n * dt_size(dt), "bad input file");
    int64_t nb = (n + 63) / 64;
    uint8_t *codes = xmalloc((size_t)(n + 1) / 2);
    float *absmax = xmalloc((size_t)nb * 4);
    double sx = 0, se = 0;
    int64_t nf = 0;
    for (int64_t b = 0; b < nb; b += chunk) {
        ork_codec_stats st;
        int64_t b1 = b + chunk < nb ? b + chunk : nb;
        ork_nf4_encode(x, dt, n, b, b1, codes, absmax, &st);
        sx += st.sum_x2;
        se += st.sum_err2;
        nf += st.nonfinite;
    }
    NEED(write_file(a[4], codes, (size_t)(n + 1) / 2) && write_file(a[5], absmax, (size_t)nb * 4), "cannot write");
    write_stats(cmd, a[6], sx, se, nf);
    free(x);
    free(codes);
    free(absmax);
}

static void do_nf4_decode(const char *cmd, char **a) {
    int64_t n = atoll(a[0]);
    int64_t nb = (n + 63) / 64;
    size_t cs, as;
    uint8_t *codes = read_file(a[1], &cs);
    float *absmax = read_file(a[2], &as);
    NEED(codes && absmax && cs == (size_t)(n + 1) / 2 && as == (size_t)nb * 4, "bad input files");
    float *out = xmalloc((size_t)n * 4);
    ork_nf4_decode(codes, absmax, n, 0, nb, out);
    NEED(write_file(a[3], out, (size_t)n * 4), "cannot write");
    free(codes);
    free(absmax);
    free(out);
}

static size_t q_bytes(int64_t N, int64_t K, int64_t kseg) {
    return kseg > 0 ? ork_rt_tiled_size(N, K, kseg) : (size_t)(N * K);
}

static void do_int8_encode(const char *cmd, char **a) {
    int dt = atoi(a[0]);
    int64_t N = atoll(a[1]), K = atoll(a[2]), kseg = atoll(a[3]), chunk = atoll(a[4]);
    size_t insz;
    void *x = read_file(a[5], &insz);
    NEED(x && insz == (size_t)(N * K) * dt_size(dt), "bad input file");
    size_t qn = q_bytes(N, K, kseg);
    NEED(qn > 0, "bad shape");
    int8_t *q = xmalloc(qn);
    float *scale = xmalloc((size_t)N * 4);
    int64_t rows = kseg > 0 ? (N + 31) / 32 * 32 : N;
    double sx = 0, se = 0;
    int64_t nf = 0;
    for (int64_t r = 0; r < rows; r += chunk) {
        ork_codec_stats st;
        int64_t r1 = r + chunk < rows ? r + chunk : rows;
        ork_int8_encode(x, dt, N, K, r, r1, kseg, q, scale, &st);
        sx += st.sum_x2;
        se += st.sum_err2;
        nf += st.nonfinite;
    }
    NEED(write_file(a[6], q, qn) && write_file(a[7], scale, (size_t)N * 4), "cannot write");
    write_stats(cmd, a[8], sx, se, nf);
    free(x);
    free(q);
    free(scale);
}

static void do_int8_decode(const char *cmd, char **a) {
    int64_t N = atoll(a[0]), K = atoll(a[1]), kseg = atoll(a[2]);
    size_t qs, ss;
    int8_t *q = read_file(a[3], &qs);
    float *scale = read_file(a[4], &ss);
    NEED(q && scale && qs == q_bytes(N, K, kseg) && ss == (size_t)N * 4, "bad input files");
    float *out = xmalloc((size_t)(N * K) * 4);
    ork_int8_decode(q, scale, N, K, 0, N, kseg, out);
    NEED(write_file(a[5], out, (size_t)(N * K) * 4), "cannot write");
    free(q);
    free(scale);
    free(out);
}

static void do_int8_tile(const char *cmd, char **a) {
    int64_t N = atoll(a[0]), K = atoll(a[1]), kseg = atoll(a[2]);
    size_t qs;
    int8_t *q = read_file(a[3], &qs);
    NEED(q && qs == (size_t)(N * K), "bad input file");
    size_t on = ork_rt_tiled_size(N, K, kseg);
    int8_t *out = xmalloc(on);
    ork_int8_tile(q, N, K, 0, (N + 31) / 32 * 32, kseg, out);
    NEED(write_file(a[4], out, on), "cannot write");
    free(q);
    free(out);
}

static void do_widen(const char *cmd, char **a) {
    int dt = atoi(a[0]);
    int64_t n = atoll(a[1]);
    size_t insz;
    void *x = read_file(a[2], &insz);
    NEED(x && insz == (size_t)n * dt_size(dt), "bad input file");
    float *out = xmalloc((size_t)n * 4);
    int64_t c[2];
    c[0] = ork_widen(x, dt, n, out);
    c[1] = ork_count_nonfinite(x, dt, n);
    NEED(write_file(a[3], out, (size_t)n * 4) && write_file(a[4], c, sizeof c), "cannot write");
    free(x);
    free(out);
}

static void do_fill(const char *cmd, char **a) {
    int64_t n = atoll(a[0]), off = atoll(a[1]);
    size_t insz;
    uint8_t *src = read_file(a[2], &insz);
    NEED(src && insz == (size_t)n, "bad input file");
    size_t total = (size_t)(n + off + 64);
    uint8_t *dst = xmalloc(total);
    memset(dst, 0, total);
    ork_rt_fill(dst + off, src, (size_t)n, 1); /* cached stores, then DC CVAC + DSB on aarch64 */
    ork_rt_fill(dst + off, src, (size_t)n, 0); /* no clean: the same bytes */
    /* the clean alone over ranges that start and end mid-line, and an empty one: must not change a byte */
    ork_rt_clean(dst + off, 0);
    if (n > 3) ork_rt_clean(dst + off + 1, (size_t)n - 2);
    ork_rt_clean(dst, total);
    NEED(write_file(a[3], dst, total), "cannot write");
    free(src);
    free(dst);
}

static void do_inflate(const char *cmd, char **a) {
    int direct = strcmp(a[0], "direct") == 0;
    NEED(direct || strcmp(a[0], "two_step") == 0, "method must be direct or two_step");
    int portable = atoi(a[1]);
    int64_t n = atoll(a[2]), k = atoll(a[3]), kseg = atoll(a[4]), chunk = atoll(a[5]);
    size_t cs, as;
    uint8_t *codes = read_file(a[6], &cs);
    float *absmax = read_file(a[7], &as);
    NEED(codes && absmax, "bad input files");
    size_t qn = ork_rt_tiled_size(n, k, kseg);
    NEED(qn > 0, "bad shape");
    int8_t *q = xmalloc(qn);
    float *scale = xmalloc((size_t)n * 4);
    ork_rt_force_portable(portable);
    int64_t tiles = (n + 31) / 32;
    int rc = 0;
    for (int64_t t = 0; t < tiles && rc == 0; t += chunk) {
        int64_t t1 = t + chunk < tiles ? t + chunk : tiles;
        rc = direct ? ork_rt_inflate_direct(codes, cs, absmax, as / 4, n, k, kseg, t, t1, q, qn, scale)
                    : ork_rt_inflate_two_step(codes, cs, absmax, as / 4, n, k, kseg, t, t1, q, qn, scale);
    }
    ork_rt_force_portable(0);
    NEED(rc == ORK_RT_OK, "inflate returned an error");
    NEED(write_file(a[8], q, qn) && write_file(a[9], scale, (size_t)n * 4), "cannot write");
    free(codes);
    free(absmax);
    free(q);
    free(scale);
}

static void do_rt_decode(const char *cmd, char **a) {
    int64_t n = atoll(a[0]);
    size_t cs, as;
    uint8_t *codes = read_file(a[1], &cs);
    float *absmax = read_file(a[2], &as);
    NEED(codes && absmax, "bad input files");
    float *out = xmalloc((size_t)n * 4);
    NEED(ork_rt_nf4_decode(codes, cs, absmax, as / 4, 0, n, out) == ORK_RT_OK, "decode returned an error");
    NEED(write_file(a[3], out, (size_t)n * 4), "cannot write");
    free(codes);
    free(absmax);
    free(out);
}


static float *read_colw(const char *path, int64_t k) {
    if (strcmp(path, "-") == 0) return NULL;
    size_t sz;
    float *w = read_file(path, &sz);
    return w && sz == (size_t)k * 4 ? w : NULL;
}

static void do_nf4opt_encode(const char *cmd, char **a) {
    int dt = atoi(a[0]), weighting = atoi(a[3]), block = atoi(a[4]), tries = atoi(a[5]);
    int64_t n = atoll(a[1]), k = atoll(a[2]), chunk = atoll(a[6]);
    size_t insz;
    void *x = read_file(a[7], &insz);
    NEED(x && insz == (size_t)n * dt_size(dt), "bad input file");
    float *cw = read_colw(a[8], k);
    NEED(cw || strcmp(a[8], "-") == 0, "bad column weights");
    int64_t nb = (n + block - 1) / block;
    uint8_t *codes = xmalloc((size_t)(n + 1) / 2);
    float *absmax = xmalloc((size_t)nb * 4);
    double sx = 0, se = 0;
    int64_t nf = 0;
    for (int64_t b = 0; b < nb; b += chunk) {
        ork_codec_stats st;
        int64_t b1 = b + chunk < nb ? b + chunk : nb;
        ork_nf4opt_encode(x, dt, n, k, cw, weighting, block, tries, b, b1, codes, absmax, &st);
        sx += st.sum_x2;
        se += st.sum_err2;
        nf += st.nonfinite;
    }
    NEED(write_file(a[9], codes, (size_t)(n + 1) / 2) && write_file(a[10], absmax, (size_t)nb * 4), "cannot write");
    write_stats(cmd, a[11], sx, se, nf);
    free(x);
    free(cw);
    free(codes);
    free(absmax);
}

static void do_nf4dq_encode(const char *cmd, char **a) {
    int dt = atoi(a[0]), weighting = atoi(a[3]);
    int64_t n = atoll(a[1]), k = atoll(a[2]), chunk = atoll(a[4]);
    size_t insz;
    void *x = read_file(a[5], &insz);
    NEED(x && insz == (size_t)n * dt_size(dt) && n > 0, "bad input file");
    float *cw = read_colw(a[6], k);
    NEED(cw || strcmp(a[6], "-") == 0, "bad column weights");
    int64_t nb = (n + ORKPACK_NF4DQ_BLOCK - 1) / ORKPACK_NF4DQ_BLOCK, ng = (nb + ORKPACK_NF4DQ_GROUP - 1) / ORKPACK_NF4DQ_GROUP;
    uint8_t *codes = xmalloc((size_t)(n + 1) / 2), *q = xmalloc((size_t)nb);
    float *d = xmalloc((size_t)nb * 4), *scale = xmalloc((size_t)ng * 4), offset = 0.0f;
    for (int64_t b = 0; b < nb; b += chunk)
        ork_nf4opt_encode(x, dt, n, k, cw, weighting, ORKPACK_NF4DQ_BLOCK, 1, b, b + chunk < nb ? b + chunk : nb, NULL, d,
                          NULL);
    ork_nf4dq_scales(d, nb, scale, &offset);
    double sx = 0, se = 0;
    int64_t nf = 0;
    for (int64_t b = 0; b < nb; b += chunk) {
        ork_codec_stats st;
        ork_nf4dq_encode(x, dt, n, k, cw, weighting, d, scale, offset, b, b + chunk < nb ? b + chunk : nb, codes, q,
                         &st);
        sx += st.sum_x2;
        se += st.sum_err2;
        nf += st.nonfinite;
    }
    NEED(write_file(a[7], codes, (size_t)(n + 1) / 2) && write_file(a[8], q, (size_t)nb) &&
             write_file(a[9], scale, (size_t)ng * 4) && write_file(a[10], &offset, 4),
         "cannot write");
    write_stats(cmd, a[11], sx, se, nf);
    free(x);
    free(cw);
    free(codes);
    free(q);
    free(d);
    free(scale);
}

static void do_nf4dq_decode(const char *cmd, char **a) {
    int64_t n = atoll(a[0]);
    size_t cs, qs, ss, os;
    uint8_t *codes = read_file(a[1], &cs), *q = read_file(a[2], &qs);
    float *scale = read_file(a[3], &ss), *offset = read_file(a[4], &os);
    NEED(codes && q && scale && offset && os == 4, "bad input files");
    float *out = xmalloc((size_t)n * 4);
    NEED(ork_rt_nf4dq_decode(codes, cs, q, qs, scale, ss / 4, offset[0], 0, n, out) == ORK_RT_OK,
         "decode returned an error");
    NEED(write_file(a[5], out, (size_t)n * 4), "cannot write");
    free(codes);
    free(q);
    free(scale);
    free(offset);
    free(out);
}

static const struct {
    const char *name;
    int nargs;
    void (*fn)(const char *, char **);
} CMDS[] = {
    {"nf4_encode", 7, do_nf4_encode}, {"nf4_decode", 4, do_nf4_decode}, {"int8_encode", 9, do_int8_encode},
    {"int8_decode", 6, do_int8_decode}, {"int8_tile", 5, do_int8_tile}, {"widen", 5, do_widen},
    {"fill", 4, do_fill}, {"inflate", 10, do_inflate}, {"rt_decode", 4, do_rt_decode},
    {"nf4opt_encode", 12, do_nf4opt_encode}, {"nf4dq_encode", 12, do_nf4dq_encode}, {"nf4dq_decode", 6, do_nf4dq_decode},
};

int main(void) {
    char line[4096];
    while (fgets(line, sizeof line, stdin)) {
        char *argv[16];
        int argc = 0;
        for (char *tok = strtok(line, " \t\r\n"); tok && argc < 16; tok = strtok(NULL, " \t\r\n")) argv[argc++] = tok;
        if (argc == 0) continue;
        if (strcmp(argv[0], "isa") == 0) {
            printf("codecs %d runtime %d nf4opt %d\n", ork_codecs_isa(), ork_rt_isa(), ork_nf4opt_level());
            continue;
        }
        int found = 0;
        for (size_t c = 0; c < sizeof CMDS / sizeof CMDS[0]; c++) {
            if (strcmp(argv[0], CMDS[c].name) != 0) continue;
            found = 1;
            if (argc - 1 != CMDS[c].nargs) {
                printf("FAIL %s: wants %d arguments, got %d\n", argv[0], CMDS[c].nargs, argc - 1);
                failures++;
            } else {
                int before = failures;
                CMDS[c].fn(argv[0], argv + 1);
                if (failures == before) printf("ok %s %s\n", argv[0], argv[argc - 1]);
            }
        }
        if (!found) {
            printf("FAIL %s: unknown command\n", argv[0]);
            failures++;
        }
        fflush(stdout);
    }
    return failures > 100 ? 100 : failures;
}
