/* nf4opt.c: error-minimizing NF4 encode. See nf4opt.h; the definition is
 * orkpack/codecs/reference.py nf4opt_encode, mirrored here operation for operation.
 *
 * Layout: 16 blocks at a time, one per SIMD lane (x[i][b] is element i of block b), so every
 * per-block sum runs in order over i inside its own lane (the reference's order) and nothing is
 * horizontal. The code of a scaled value s is bitsandbytes' (the number of float32 midpoints
 * strictly below s); the AVX-512 path finds it by the bin tables of codecs.c's fast encoder
 * (s clamped to +-1.03 first, which changes no code), the generic path by 15 compares: the same
 * codes, so the same bytes at every SIMD level (tests/test_nf4opt.py). */
#include "codecs.h"
#include "nf4opt.h"

#include <math.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))
#define BLK 64
#define G 16
#define TRIES 2
#define ROUNDS 2
static const float STEP = 3.0f / 32.0f;
static const float TINY = 1e-38f;

#include "nf4_codebook.h"

AI uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
AI float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* generic: codes and levels of 16 scaled values by 15 compares (vectorizes; no gather) */
AI void levels_generic(const float *s, float *q, uint8_t *c) {
    for (int b = 0; b < G; b++) {
        uint32_t code = 0, cbb = f2u(CB[0]);
        for (int m = 0; m < 15; m++) {
            const uint32_t gt = s[b] > MID[m];
            code += gt;
            cbb ^= (0u - gt) & (f2u(CB[m + 1]) ^ f2u(CB[m]));
        }
        q[b] = u2f(cbb);
        if (c) c[b] = (uint8_t)code;
    }
}

/* the body, written once; LEVELS(s, q, c) computes 16 codes / levels */
#define GROUP_BODY(LEVELS)                                                                              \
    float amax[G], dc[G], best_d[G], inv0[G], d[G], fx[G], fq[G];                                        \
    float wf[BLK][G], wx[BLK][G];                                                                        \
    for (int i = 0; i < BLK; i++)                                                                        \
        for (int b = 0; b < G; b++) { wf[i][b] = (float)w[i][b]; wx[i][b] = wf[i][b] * x[i][b]; }       \
    double best_e[G], best_s[G], dscan[G], sxq[G], sqq[G], e[G];                                         \
    int going[G];                                                                                        \
    float s[G], q[G];                                                                                    \
    for (int b = 0; b < G; b++) {                                                                        \
        uint32_t m = 0;                                                                                  \
        for (int i = 0; i < BLK; i++) { uint32_t u = f2u(x[i][b]) & 0x7fffffffu; m = u > m ? u : m; }   \
        amax[b] = u2f(m);                                                                                \
        dc[b] = amax[b] < TINY ? TINY : amax[b];                                                         \
        best_d[b] = tail[b] ? dc[b] : amax[b];                                                           \
        inv0[b] = 1.0f / dc[b];                                                                          \
        e[b] = 0.0;                                                                                      \
    }                                                                                                    \
    /* 0. bitsandbytes' choice */                                                                        \
    for (int i = 0; i < BLK; i++) {                                                                      \
        for (int b = 0; b < G; b++) s[b] = tail[b] ? x[i][b] / dc[b] : x[i][b] * inv0[b];               \
        LEVELS(s, q, best_c[i]);                                                                         \
        for (int b = 0; b < G; b++) {                                                                    \
            const float deq = q[b] * best_d[b];                                                          \
            const double r = (double)x[i][b] - (double)deq;                                              \
            e[b] += w[i][b] * r * r;                                                                     \
        }                                                                                                \
    }                                                                                                    \
    for (int b = 0; b < G; b++) { best_e[b] = e[b]; best_s[b] = -1.0; dscan[b] = 0.0; }                 \
    /* 1. the scan */                                                                                    \
    for (int g = 0; g < 2; g++)                                                                          \
        for (int j = -TRIES; j <= TRIES; j++) {                                                          \
            float inv[G];                                                                                \
            for (int b = 0; b < G; b++) {                                                                \
                const float safe = amax[b] >= TINY ? amax[b] : 1.0f;                                     \
                inv[b] = (g ? -1.0f : 1.0f) * (1.0f + (float)j * STEP) / safe;                           \
                fx[b] = 0.0f; fq[b] = 0.0f;                                                              \
            }                                                                                            \
            for (int i = 0; i < BLK; i++) {                                                              \
                for (int b = 0; b < G; b++) s[b] = x[i][b] * inv[b];                                     \
                LEVELS(s, q, (uint8_t *)0);                                                              \
                for (int b = 0; b < G; b++) {                                                            \
                    fx[b] += wx[i][b] * q[b];                                                            \
                    fq[b] += wf[i][b] * q[b] * q[b];                                                     \
                }                                                                                        \
            }                                                                                            \
            for (int b = 0; b < G; b++) {                                                                \
                sxq[b] = (double)fx[b]; sqq[b] = (double)fq[b];                                          \
                const double den = sqq[b] > 0.0 ? sqq[b] : 1.0;                                          \
                const double score = sqq[b] > 0.0 ? sxq[b] * sxq[b] / den : -1.0;                        \
                const int better = sqq[b] > 0.0 && score > best_s[b];                                    \
                best_s[b] = better ? score : best_s[b];                                                  \
                dscan[b] = better ? sxq[b] / den : dscan[b];                                             \
            }                                                                                            \
        }                                                                                                \
    /* 2. refinement */                                                                                  \
    for (int b = 0; b < G; b++) { d[b] = (float)dscan[b]; going[b] = amax[b] >= TINY; }                 \
    for (int r = 0; r < ROUNDS; r++) {                                                                   \
        float dd[G], inv[G];                                                                             \
        int any = 0;                                                                                     \
        for (int b = 0; b < G; b++) {                                                                    \
            const float den = d[b] != 0.0f ? d[b] : 1.0f;                                                \
            going[b] = going[b] && d[b] != 0.0f && isfinite(d[b]) && isfinite(1.0f / den);               \
            dd[b] = going[b] ? d[b] : 1.0f;                                                              \
            inv[b] = 1.0f / dd[b];                                                                       \
            e[b] = 0.0; sxq[b] = 0.0; sqq[b] = 0.0;                                                      \
            any |= going[b];                                                                             \
        }                                                                                                \
        if (!any) break;                                                                                 \
        uint8_t cr[BLK][G];                                                                              \
        for (int i = 0; i < BLK; i++) {                                                                  \
            for (int b = 0; b < G; b++) s[b] = tail[b] ? x[i][b] / dd[b] : x[i][b] * inv[b];            \
            LEVELS(s, q, cr[i]);                                                                         \
            for (int b = 0; b < G; b++) {                                                                \
                const float deq = q[b] * dd[b];                                                          \
                const double rr = (double)x[i][b] - (double)deq;                                         \
                e[b] += w[i][b] * rr * rr;                                                               \
                const double qd = (double)q[b];                                                          \
                sxq[b] += w[i][b] * (double)x[i][b] * qd;                                                \
                sqq[b] += w[i][b] * qd * qd;                                                             \
            }                                                                                            \
        }                                                                                                \
        int take[G];                                                                                     \
        for (int b = 0; b < G; b++) {                                                                    \
            take[b] = going[b] && e[b] < best_e[b];                                                      \
            best_e[b] = take[b] ? e[b] : best_e[b];                                                      \
            best_d[b] = take[b] ? dd[b] : best_d[b];                                                     \
            going[b] = going[b] && sqq[b] > 0.0;                                                         \
            d[b] = (float)(sxq[b] / (sqq[b] > 0.0 ? sqq[b] : 1.0));                                      \
        }                                                                                                \
        for (int i = 0; i < BLK; i++)                                                                    \
            for (int b = 0; b < G; b++) best_c[i][b] = take[b] ? cr[i][b] : best_c[i][b];               \
    }                                                                                                    \
    for (int b = 0; b < G; b++) dout[b] = best_d[b];

#define GEN_LEVELS(s, q, c) levels_generic(s, q, c)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(ORK_NO_X86_SIMD)
#define ORK_NF4OPT_X86 1
#include <immintrin.h>
__attribute__((target_clones("avx2", "default")))
#endif
static void group_generic(const float (*x)[G], const double (*w)[G], const int *tail, uint8_t (*best_c)[G],
                          float *dout) {
    GROUP_BODY(GEN_LEVELS)
}

#ifdef ORK_NF4OPT_X86
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2")))
/* bin tables as codecs.c's (bin(s) = (int)(s * 15.5f + 16.0f) for |s| <= 1.03): code = BASE[bin] + (s > MIDB[bin]) */
static const float *BIN_MID;
static const int32_t *BIN_BASE;

typedef struct { __m512 mlo, mhi, cb; __m512i blo, bhi; } tabs512;

AI T512 void levels512(const float *s, float *q, uint8_t *c, const tabs512 *t) {
    __m512 v = _mm512_loadu_ps(s);
    v = _mm512_max_ps(_mm512_set1_ps(-1.03f), _mm512_min_ps(_mm512_set1_ps(1.03f), v));
    const __m512i bin = _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(v, _mm512_set1_ps(15.5f)),
                                                          _mm512_set1_ps(16.0f)));
    const __m512 mid = _mm512_permutex2var_ps(t->mlo, bin, t->mhi);
    const __m512i base = _mm512_permutex2var_epi32(t->blo, bin, t->bhi);
    const __mmask16 gt = _mm512_cmp_ps_mask(v, mid, _CMP_GT_OQ);
    const __m512i code = _mm512_mask_add_epi32(base, gt, base, _mm512_set1_epi32(1));
    _mm512_storeu_ps(q, _mm512_permutexvar_ps(code, t->cb));
    if (c) _mm_storeu_si128((__m128i *)c, _mm512_cvtepi32_epi8(code));
}

#define V512_LEVELS(s, q, c) levels512(s, q, c, &tb)

T512 static void group_avx512(const float (*x)[G], const double (*w)[G], const int *tail, uint8_t (*best_c)[G],
                              float *dout) {
    tabs512 tb;
    tb.mlo = _mm512_loadu_ps(BIN_MID);
    tb.mhi = _mm512_loadu_ps(BIN_MID + 16);
    tb.blo = _mm512_loadu_si512(BIN_BASE);
    tb.bhi = _mm512_loadu_si512(BIN_BASE + 16);
    tb.cb = _mm512_loadu_ps(CB);
    GROUP_BODY(V512_LEVELS)
}
#endif

#if defined(ORK_NF4OPT_X86)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void load_group(const float *xb, const float *cwb, int weighting, int nb, float (*x)[G], double (*w)[G]) {
    /* xb: nb blocks of 64 floats (sanitized, zero padded); cwb: their column weights (0 past the end) */
    for (int b = 0; b < G; b++) {
        for (int i = 0; i < BLK; i++) {
            x[i][b] = b < nb ? xb[b * BLK + i] : 0.0f;
            w[i][b] = b < nb ? (double)cwb[b * BLK + i] : 0.0;
        }
    }
    if (weighting == ORK_NF4W_X2) {
        for (int i = 0; i < BLK; i++)
            for (int b = 0; b < G; b++) w[i][b] = w[i][b] * ((double)x[i][b] * (double)x[i][b]);
    } else if (weighting == ORK_NF4W_SIGMA) {
        double s2[G];
        for (int b = 0; b < G; b++) s2[b] = 0.0;
        for (int i = 0; i < BLK; i++)
            for (int b = 0; b < G; b++) s2[b] += (double)x[i][b] * (double)x[i][b];
        for (int b = 0; b < G; b++) s2[b] = 2.0 * s2[b] / 64.0;
        for (int i = 0; i < BLK; i++)
            for (int b = 0; b < G; b++) w[i][b] = w[i][b] * sqrt(s2[b] + (double)x[i][b] * (double)x[i][b]);
    }
}

void ork_nf4opt_encode(const void *x, int dtype, int64_t n, int64_t k, const float *col_w, int weighting,
                       int64_t b0, int64_t b1, uint8_t *codes, float *absmax, ork_codec_stats *st) {
    int use512 = 0;
#ifdef ORK_NF4OPT_X86
    if (ork_codecs_isa() == ORK_ISA_AVX512) {
        use512 = ork_nf4_bin_tables(&BIN_MID, &BIN_BASE) == 1;
    }
#endif
    (void)use512;
    const int esz = dtype == ORK_DT_F32 ? 4 : 2;
    double ax[16], ae[16];
    for (int l = 0; l < 16; l++) ax[l] = ae[l] = 0.0;
    int64_t nf = 0;
    float xb[G * BLK], cwb[G * BLK], dout[G];
    float xs[BLK][G];
    double ws[BLK][G];
    uint8_t cs[BLK][G];
    int tail[G];
    for (int64_t g0 = b0; g0 < b1; g0 += G) {
        const int nb = (int)(b1 - g0 < G ? b1 - g0 : G);
        const int64_t off0 = g0 * BLK;
        const int64_t len_all = (n - off0 < (int64_t)nb * BLK) ? n - off0 : (int64_t)nb * BLK;
        nf += ork_widen((const char *)x + off0 * esz, dtype, len_all, xb);
        for (int64_t i = 0; i < len_all; i++)
            if ((f2u(xb[i]) & 0x7f800000u) == 0x7f800000u) xb[i] = 0.0f;
        for (int64_t i = len_all; i < (int64_t)G * BLK; i++) xb[i] = 0.0f;
        if (col_w) {
            int64_t col = k > 0 ? off0 % k : 0;
            for (int64_t i = 0; i < len_all; i++) {
                cwb[i] = col_w[col];
                if (++col == k) col = 0;
            }
        } else {
            for (int64_t i = 0; i < len_all; i++) cwb[i] = 1.0f;
        }
        for (int64_t i = len_all; i < (int64_t)G * BLK; i++) cwb[i] = 0.0f;
        for (int b = 0; b < G; b++) tail[b] = b < nb && off0 + (int64_t)(b + 1) * BLK > n;
        load_group(xb, cwb, weighting, nb, xs, ws);
#ifdef ORK_NF4OPT_X86
        if (use512)
            group_avx512((const float (*)[G])xs, (const double (*)[G])ws, tail, cs, dout);
        else
#endif
            group_generic((const float (*)[G])xs, (const double (*)[G])ws, tail, cs, dout);
        for (int b = 0; b < nb; b++) {
            const int64_t off = off0 + (int64_t)b * BLK;
            const int len = (int)(n - off < BLK ? n - off : BLK);
            const float dv = dout[b];
            absmax[g0 + b] = dv;
            uint8_t packed[BLK / 2];
            for (int i = 0; i < BLK / 2; i++) packed[i] = (uint8_t)((cs[2 * i][b] << 4) | cs[2 * i + 1][b]);
            memcpy(codes + off / 2, packed, (size_t)((len + 1) / 2));
            /* SQNR sums: lane i % 16, in element order (xb is the block contiguous, as xs holds it) */
            const float *xr = xb + (int64_t)b * BLK;
            float deq[BLK];
            for (int i = 0; i < BLK; i++) deq[i] = CB[cs[i][b]] * dv;
            for (int g = 0; g < BLK; g += 16)
                for (int l = 0; l < 16; l++) {
                    const float xv = xr[g + l];
                    const float r = xv - deq[g + l];
                    ax[l] += (double)xv * (double)xv;
                    ae[l] += (double)r * (double)r;
                }
        }
    }
    double sx = 0.0, se = 0.0;
    for (int l = 0; l < 16; l++) {
        sx += ax[l];
        se += ae[l];
    }
    st->sum_x2 = sx;
    st->sum_err2 = se;
    st->nonfinite = nf;
}
