/* intdq_driver.c: runs the intdq kernels (kernels/intdq.c, runtime.c ork_rt_intdq_decode) on the inputs in a
 * directory and writes their outputs there, for tests/test_intdq.py (aarch64 under qemu, x86 portable).
 *   intdq_driver DIR N K BITS WEIGHTING HAS_CW
 * reads DIR/x.f32 (N float32) and, when HAS_CW, DIR/cw.f32 (K float32); writes DIR/codes, DIR/q, DIR/scale,
 * DIR/offset, DIR/dec.f32 (the decode of the encoded slice). */
#include <stdio.h>
#include <stdlib.h>

#include "codecs.h"
#include "intdq.h"
#include "nf4opt.h"
#include "runtime.h"

static void *slurp(const char *dir, const char *name, size_t n) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    void *b = malloc(n ? n : 1);
    if (!f || fread(b, 1, n, f) != n) { fprintf(stderr, "cannot read %s\n", p); exit(2); }
    fclose(f);
    return b;
}

static void spill(const char *dir, const char *name, const void *b, size_t n) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(b, 1, n, f) != n) { fprintf(stderr, "cannot write %s\n", p); exit(2); }
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc != 7) return 2;
    const char *dir = argv[1];
    const int64_t n = atoll(argv[2]), k = atoll(argv[3]);
    const int bits = atoi(argv[4]), weighting = atoi(argv[5]), has_cw = atoi(argv[6]);
    float *x = slurp(dir, "x.f32", (size_t)n * 4);
    float *cw = has_cw ? slurp(dir, "cw.f32", (size_t)k * 4) : NULL;
    const int64_t nb = (n + 31) / 32, ng = (nb + 255) / 256, nc = (n * bits + 7) / 8;
    float *d = malloc((size_t)nb * 4), *scale = malloc((size_t)ng * 4), *dec = malloc((size_t)n * 4), off = 0.0f;
    uint8_t *codes = malloc((size_t)nc), *q = malloc((size_t)nb);
    ork_intdq_steps(x, ORK_DT_F32, n, k, cw, weighting, bits, 0, nb, d);
    ork_nf4dq_scales(d, nb, scale, &off);
    ork_codec_stats st;
    ork_intdq_encode(x, ORK_DT_F32, n, k, cw, weighting, bits, d, scale, off, 0, nb, codes, q, &st);
    if (ork_rt_intdq_decode(bits, codes, (size_t)nc, q, (size_t)nb, scale, (size_t)ng, off, 0, n, dec)) return 3;
    spill(dir, "codes", codes, (size_t)nc);
    spill(dir, "q", q, (size_t)nb);
    spill(dir, "scale", scale, (size_t)ng * 4);
    spill(dir, "offset", &off, 4);
    spill(dir, "dec.f32", dec, (size_t)n * 4);
    return 0;
}
