/* nf4opt.c: error-minimizing NF4 encode. See nf4opt.h; the definition is
 * orkpack/codecs/reference.py nf4opt_encode, mirrored here operation for operation.
 *
 * Layout: 16 blocks at a time, one per SIMD lane (x[i][b] is element i of block b), so every
 * per-block sum runs in order over i inside its own lane (the reference's order) and nothing is
 * horizontal. The code of a scaled value s is bitsandbytes' (the number of float32 midpoints
 * strictly below s); the AVX-512 path finds it by the bin tables of codecs.c's fast encoder
 * (s clamped to +-1.03 first, which changes no code), the generic path by 15 compares: the same
 * codes, so the same bytes at every SIMD level (tests/test_nf4opt.py). The AVX-512 bodies are written
 * with intrinsics, the same operations in the same order per lane.
 *
 * Also nf4dq (reference.nf4dq_encode; tests/test_nf4dq.py): its first step is this encoder at block 32
 * (with float32 error and refit sums), then ork_nf4dq_scales (offset, group scales) and ork_nf4dq_encode
 * (per block the 8-bit absmax code among 3 candidates and the NF4 codes), (the decode is runtime.c ork_rt_nf4dq_decode). */
#include "codecs.h"
#include "nf4opt.h"

#include <math.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))
#define BLKMAX 64
#define G 16
#define ROUNDS 2
static const float STEP = 3.0f / 32.0f;
static const float TINY = 1e-38f;

#include "nf4_codebook.h"
#include "nf4dq_code.h"

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

/* the body, written once; LEVELS(s, q, c) computes 16 codes / levels; BLK: the block length (a constant);
 * ACC: the type of the error and refit sums of steps 0 and 2 (double at 64; float at 32, nf4dq's first step) */
#define GROUP_BODY(LEVELS, BLK, ACC)                                                                       \
    float amax[G], dc[G], best_d[G], inv0[G], d[G], fx[G], fq[G];                                        \
    float wf[BLK][G], wx[BLK][G];                                                                        \
    for (int i = 0; i < BLK; i++)                                                                        \
        for (int b = 0; b < G; b++) { wf[i][b] = (float)w[i][b]; wx[i][b] = wf[i][b] * x[i][b]; }       \
    ACC best_e[G], sxq[G], sqq[G], e[G];                                                                 \
    double best_s[G], dscan[G];                                                                          \
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
            const ACC r = (ACC)x[i][b] - (ACC)deq;                                                       \
            e[b] += (ACC)w[i][b] * r * r;                                                                \
        }                                                                                                \
    }                                                                                                    \
    for (int b = 0; b < G; b++) { best_e[b] = e[b]; best_s[b] = -1.0; dscan[b] = 0.0; }                 \
    /* 1. the scan */                                                                                    \
    for (int g = 0; g < 2; g++)                                                                          \
        for (int j = -tries; j <= tries; j++) {                                                          \
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
                const double sx = (double)fx[b], sq = (double)fq[b];                                     \
                const double den = sq > 0.0 ? sq : 1.0;                                                  \
                const double score = sq > 0.0 ? sx * sx / den : -1.0;                                    \
                const int better = sq > 0.0 && score > best_s[b];                                        \
                best_s[b] = better ? score : best_s[b];                                                  \
                dscan[b] = better ? sx / den : dscan[b];                                                 \
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
                const ACC rr = (ACC)x[i][b] - (ACC)deq;                                                  \
                e[b] += (ACC)w[i][b] * rr * rr;                                                          \
                const ACC qd = (ACC)q[b];                                                                \
                sxq[b] += (ACC)w[i][b] * (ACC)x[i][b] * qd;                                              \
                sqq[b] += (ACC)w[i][b] * qd * qd;                                                        \
            }                                                                                            \
        }                                                                                                \
        int take[G];                                                                                     \
        for (int b = 0; b < G; b++) {                                                                    \
            take[b] = going[b] && e[b] < best_e[b];                                                      \
            best_e[b] = take[b] ? e[b] : best_e[b];                                                      \
            best_d[b] = take[b] ? dd[b] : best_d[b];                                                     \
            going[b] = going[b] && sqq[b] > 0.0;                                                         \
            d[b] = (float)(sxq[b] / (sqq[b] > 0 ? sqq[b] : (ACC)1));                                     \
        }                                                                                                \
        for (int i = 0; i < BLK; i++)                                                                    \
            for (int b = 0; b < G; b++) best_c[i][b] = take[b] ? cr[i][b] : best_c[i][b];               \
    }                                                                                                    \
    for (int b = 0; b < G; b++) dout[b] = best_d[b];

/* nf4dq step 3 for 16 blocks of 32 (one per lane): the candidates q0 + NF4DQ_CAND[t] (those in 0..255), each
 * with the nearest NF4 codes of x * (1 / a) and its weighted squared error; the first least error is kept
 * (reference.nf4dq_encode). a(q) = DQ[q] * sc + off. best_c starts all 0, best_q at q0, the error at +inf.
 * The error sums are float32: (float)w * r * r, r = x - deq, in element order. */
#define DQB 32
static const int NF4DQ_CAND[] = {0, -1, 1}; /* reference.NF4DQ_CANDIDATES */
#define NCAND ((int)(sizeof NF4DQ_CAND / sizeof NF4DQ_CAND[0]))
#define DQ_BODY(LEVELS)                                                                                  \
    float best_e[G];                                                                                     \
    float s[G], q[G];                                                                                    \
    for (int b = 0; b < G; b++) { best_e[b] = INFINITY; qout[b] = q0[b]; }                               \
    for (int i = 0; i < DQB; i++)                                                                        \
        for (int b = 0; b < G; b++) best_c[i][b] = 0;                                                    \
    for (int t = 0; t < NCAND; t++) {                                                                    \
        float a[G], iv[G];                                                                               \
        int valid[G], qc[G];                                                                             \
        float e[G];                                                                                      \
        uint8_t cr[DQB][G];                                                                              \
        for (int b = 0; b < G; b++) {                                                                    \
            const int qq = q0[b] + NF4DQ_CAND[t];                                                        \
            valid[b] = qq >= 0 && qq <= 255;                                                             \
            qc[b] = qq < 0 ? 0 : (qq > 255 ? 255 : qq);                                                  \
            a[b] = dq[qc[b]] * sc[b] + off;                                                              \
            const float inv = 1.0f / a[b];                                                               \
            iv[b] = (a[b] != 0.0f && isfinite(inv)) ? inv : 0.0f;                                        \
            e[b] = 0.0f;                                                                                 \
        }                                                                                                \
        for (int i = 0; i < DQB; i++) {                                                                  \
            for (int b = 0; b < G; b++) s[b] = x[i][b] * iv[b];                                          \
            LEVELS(s, q, cr[i]);                                                                         \
            for (int b = 0; b < G; b++) {                                                                \
                const float deq = q[b] * a[b];                                                           \
                const float r = x[i][b] - deq;                                                           \
                e[b] += (float)w[i][b] * r * r;                                                          \
            }                                                                                            \
        }                                                                                                \
        int take[G];                                                                                     \
        for (int b = 0; b < G; b++) {                                                                    \
            take[b] = valid[b] && e[b] < best_e[b];                                                      \
            best_e[b] = take[b] ? e[b] : best_e[b];                                                      \
            qout[b] = take[b] ? qc[b] : qout[b];                                                         \
        }                                                                                                \
        for (int i = 0; i < DQB; i++)                                                                    \
            for (int b = 0; b < G; b++) best_c[i][b] = take[b] ? cr[i][b] : best_c[i][b];               \
    }                                                                                                    \
    /* SQNR sums of the decoded values: lane b (the block), in element order */                         \
    float ab[G];                                                                                         \
    for (int b = 0; b < G; b++) ab[b] = dq[qout[b]] * sc[b] + off;                                       \
    for (int i = 0; i < DQB; i++)                                                                        \
        for (int b = 0; b < G; b++) {                                                                    \
            const float r = x[i][b] - CB[best_c[i][b]] * ab[b];                                          \
            ax[b] += (double)x[i][b] * (double)x[i][b];                                                  \
            ae[b] += (double)r * (double)r;                                                              \
        }

#define GEN_LEVELS(s, q, c) levels_generic(s, q, c)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(ORK_NO_X86_SIMD)
#define ORK_NF4OPT_X86 1
#include <immintrin.h>
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif
CLONES static void group_generic64(const float (*x)[G], const double (*w)[G], const int *tail, int tries,
                                   uint8_t (*best_c)[G], float *dout) {
    GROUP_BODY(GEN_LEVELS, 64, double)
}
CLONES static void group_generic32(const float (*x)[G], const double (*w)[G], const int *tail, int tries,
                                   uint8_t (*best_c)[G], float *dout) {
    GROUP_BODY(GEN_LEVELS, 32, float)
}
CLONES static void dq_generic(const float (*x)[G], const double (*w)[G], const int *q0, const float *sc, float off,
                              const float *dq, uint8_t (*pk)[DQB / 2], int *qout, double *ax, double *ae) {
    uint8_t best_c[DQB][G];
    DQ_BODY(GEN_LEVELS)
    for (int b = 0; b < G; b++)
        for (int i = 0; i < DQB / 2; i++) pk[b][i] = (uint8_t)((best_c[2 * i][b] << 4) | best_c[2 * i + 1][b]);
}

#ifdef ORK_NF4OPT_X86
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2")))
/* bin tables as codecs.c's (bin(s) = (int)(s * 15.5f + 16.0f) for |s| <= 1.03): code = BASE[bin] + (s > MIDB[bin]) */
static const float *BIN_MID;
static const int32_t *BIN_BASE;

typedef struct { __m512 mlo, mhi, cb; __m512i blo, bhi; } tabs512;

#define TABS512                                                                                          \
    tabs512 tb;                                                                                          \
    tb.mlo = _mm512_loadu_ps(BIN_MID);                                                                   \
    tb.mhi = _mm512_loadu_ps(BIN_MID + 16);                                                              \
    tb.blo = _mm512_loadu_si512(BIN_BASE);                                                               \
    tb.bhi = _mm512_loadu_si512(BIN_BASE + 16);                                                          \
    tb.cb = _mm512_loadu_ps(CB);

/* The AVX-512 bodies: GROUP_BODY and DQ_BODY written out with intrinsics, operation for operation (the same
 * float32 / float64 operations in the same order per lane, no fused multiply-add), so the same bytes as the
 * generic code (tests/test_nf4opt.py, tests/test_nf4dq.py); GCC's vectorizer left parts of the macro bodies
 * scalar. Per-block (per-lane) bookkeeping stays scalar C, as in the macros. */
AI T512 __m512 levels512v(__m512 v, __m512i *code, const tabs512 *t) {
    v = _mm512_max_ps(_mm512_set1_ps(-1.03f), _mm512_min_ps(_mm512_set1_ps(1.03f), v));
    const __m512i bin = _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(v, _mm512_set1_ps(15.5f)),
                                                          _mm512_set1_ps(16.0f)));
    const __m512 mid = _mm512_permutex2var_ps(t->mlo, bin, t->mhi);
    const __m512i base = _mm512_permutex2var_epi32(t->blo, bin, t->bhi);
    const __mmask16 gt = _mm512_cmp_ps_mask(v, mid, _CMP_GT_OQ);
    *code = _mm512_mask_add_epi32(base, gt, base, _mm512_set1_epi32(1));
    return _mm512_permutexvar_ps(*code, t->cb);
}

AI T512 __m512d lo8(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
AI T512 __m512d hi8(__m512 v) {
    return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
AI T512 __mmask16 lanes_mask(const int *f) {
    __mmask16 m = 0;
    for (int b = 0; b < G; b++) m |= (__mmask16)((f[b] ? 1u : 0u) << b);
    return m;
}
/* (float)w of 16 double weights */
AI T512 __m512 f32x16(const double *w) {
    const __m256 wl = _mm512_cvtpd_ps(_mm512_loadu_pd(w)), wh = _mm512_cvtpd_ps(_mm512_loadu_pd(w + 8));
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(wl)), _mm256_castps_pd(wh), 1));
}
/* 16 float32 sums into a double[16] (exactly: the comparisons and the float32-rounded quotients of the
 * per-lane code then equal those of float32 arithmetic) */
AI T512 void store16d(double *dst, __m512 v) {
    _mm512_storeu_pd(dst, lo8(v));
    _mm512_storeu_pd(dst + 8, hi8(v));
}
/* e += (w * r) * r with r = x - (double)deq, both halves */
#define ACC_ERR(EL, EH, WL, WH, XL, XH, DEQ)                                                             \
    do {                                                                                                 \
        const __m512d rl_ = _mm512_sub_pd(XL, lo8(DEQ)), rh_ = _mm512_sub_pd(XH, hi8(DEQ));             \
        EL = _mm512_add_pd(EL, _mm512_mul_pd(_mm512_mul_pd(WL, rl_), rl_));                              \
        EH = _mm512_add_pd(EH, _mm512_mul_pd(_mm512_mul_pd(WH, rh_), rh_));                              \
    } while (0)

T512 static void group_avx512(const float (*x)[G], const double (*w)[G], const int *tail, int blk, int tries,
                              uint8_t (*best_c)[G], float *dout) {
    TABS512
    const int f32 = blk == 32; /* nf4dq's first step: float32 error and refit sums (GROUP_BODY's ACC) */
    float amax[G], dc[G], best_d[G], inv0[G], d[G], fx[G], fq[G];
    double best_e[G], best_s[G], dscan[G], sxq[G], sqq[G], e[G];
    int going[G];
    __m512 wfv[BLKMAX], wxv[BLKMAX];
    for (int i = 0; i < blk; i++) {
        const __m512 xv = _mm512_loadu_ps(x[i]);
        wfv[i] = f32x16(w[i]);
        wxv[i] = _mm512_mul_ps(wfv[i], xv);
    }
    const __mmask16 tm = lanes_mask(tail);
    for (int b = 0; b < G; b++) {
        uint32_t m = 0;
        for (int i = 0; i < blk; i++) { uint32_t u = f2u(x[i][b]) & 0x7fffffffu; m = u > m ? u : m; }
        amax[b] = u2f(m);
        dc[b] = amax[b] < TINY ? TINY : amax[b];
        best_d[b] = tail[b] ? dc[b] : amax[b];
        inv0[b] = 1.0f / dc[b];
    }
    /* 0. bitsandbytes' choice */
    {
        const __m512 iv = _mm512_loadu_ps(inv0), dcv = _mm512_loadu_ps(dc), bd = _mm512_loadu_ps(best_d);
        __m512d el = _mm512_setzero_pd(), eh = _mm512_setzero_pd();
        __m512 ef = _mm512_setzero_ps();
        for (int i = 0; i < blk; i++) {
            const __m512 xv = _mm512_loadu_ps(x[i]);
            __m512 sv = _mm512_mul_ps(xv, iv);
            if (tm) sv = _mm512_mask_div_ps(sv, tm, xv, dcv);
            __m512i code;
            const __m512 q = levels512v(sv, &code, &tb);
            _mm_storeu_si128((__m128i *)best_c[i], _mm512_cvtepi32_epi8(code));
            if (f32) {
                const __m512 rv = _mm512_sub_ps(xv, _mm512_mul_ps(q, bd));
                ef = _mm512_add_ps(ef, _mm512_mul_ps(_mm512_mul_ps(wfv[i], rv), rv));
            } else {
                ACC_ERR(el, eh, _mm512_loadu_pd(w[i]), _mm512_loadu_pd(w[i] + 8), lo8(xv), hi8(xv),
                        _mm512_mul_ps(q, bd));
            }
        }
        if (f32) store16d(e, ef);
        else {
            _mm512_storeu_pd(e, el);
            _mm512_storeu_pd(e + 8, eh);
        }
    }
    for (int b = 0; b < G; b++) { best_e[b] = e[b]; best_s[b] = -1.0; dscan[b] = 0.0; }
    /* 1. the scan (float32 sums) */
    for (int g = 0; g < 2; g++)
        for (int j = -tries; j <= tries; j++) {
            float inv[G];
            for (int b = 0; b < G; b++) {
                const float safe = amax[b] >= TINY ? amax[b] : 1.0f;
                inv[b] = (g ? -1.0f : 1.0f) * (1.0f + (float)j * STEP) / safe;
            }
            const __m512 iv = _mm512_loadu_ps(inv);
            __m512 fxv = _mm512_setzero_ps(), fqv = _mm512_setzero_ps();
            for (int i = 0; i < blk; i++) {
                __m512i code;
                const __m512 q = levels512v(_mm512_mul_ps(_mm512_loadu_ps(x[i]), iv), &code, &tb);
                fxv = _mm512_add_ps(fxv, _mm512_mul_ps(wxv[i], q));
                fqv = _mm512_add_ps(fqv, _mm512_mul_ps(_mm512_mul_ps(wfv[i], q), q));
            }
            _mm512_storeu_ps(fx, fxv);
            _mm512_storeu_ps(fq, fqv);
            for (int b = 0; b < G; b++) {
                sxq[b] = (double)fx[b]; sqq[b] = (double)fq[b];
                const double den = sqq[b] > 0.0 ? sqq[b] : 1.0;
                const double score = sqq[b] > 0.0 ? sxq[b] * sxq[b] / den : -1.0;
                const int better = sqq[b] > 0.0 && score > best_s[b];
                best_s[b] = better ? score : best_s[b];
                dscan[b] = better ? sxq[b] / den : dscan[b];
            }
        }
    /* 2. refinement (float64 sums) */
    for (int b = 0; b < G; b++) { d[b] = (float)dscan[b]; going[b] = amax[b] >= TINY; }
    for (int r = 0; r < ROUNDS; r++) {
        float dd[G], inv[G];
        int any = 0;
        for (int b = 0; b < G; b++) {
            const float den = d[b] != 0.0f ? d[b] : 1.0f;
            going[b] = going[b] && d[b] != 0.0f && isfinite(d[b]) && isfinite(1.0f / den);
            dd[b] = going[b] ? d[b] : 1.0f;
            inv[b] = 1.0f / dd[b];
            any |= going[b];
        }
        if (!any) break;
        const __m512 iv = _mm512_loadu_ps(inv), ddv = _mm512_loadu_ps(dd);
        const int last = r == ROUNDS - 1;
        __m512d el = _mm512_setzero_pd(), eh = _mm512_setzero_pd(), xl_ = _mm512_setzero_pd(),
                xh_ = _mm512_setzero_pd(), ql_ = _mm512_setzero_pd(), qh_ = _mm512_setzero_pd();
        __m512 ef = _mm512_setzero_ps(), sxf = _mm512_setzero_ps(), sqf = _mm512_setzero_ps();
        __m128i cr[BLKMAX];
        for (int i = 0; i < blk; i++) {
            const __m512 xv = _mm512_loadu_ps(x[i]);
            __m512 sv = _mm512_mul_ps(xv, iv);
            if (tm) sv = _mm512_mask_div_ps(sv, tm, xv, ddv);
            __m512i code;
            const __m512 q = levels512v(sv, &code, &tb);
            cr[i] = _mm512_cvtepi32_epi8(code);
            if (f32) {
                const __m512 rv = _mm512_sub_ps(xv, _mm512_mul_ps(q, ddv));
                ef = _mm512_add_ps(ef, _mm512_mul_ps(_mm512_mul_ps(wfv[i], rv), rv));
                if (last) continue;
                sxf = _mm512_add_ps(sxf, _mm512_mul_ps(wxv[i], q));
                sqf = _mm512_add_ps(sqf, _mm512_mul_ps(_mm512_mul_ps(wfv[i], q), q));
                continue;
            }
            const __m512d wl = _mm512_loadu_pd(w[i]), wh = _mm512_loadu_pd(w[i] + 8);
            const __m512d x64l = lo8(xv), x64h = hi8(xv);
            ACC_ERR(el, eh, wl, wh, x64l, x64h, _mm512_mul_ps(q, ddv));
            if (last) continue; /* the refit of the last round is never used */
            const __m512d qdl = lo8(q), qdh = hi8(q);
            xl_ = _mm512_add_pd(xl_, _mm512_mul_pd(_mm512_mul_pd(wl, x64l), qdl));
            xh_ = _mm512_add_pd(xh_, _mm512_mul_pd(_mm512_mul_pd(wh, x64h), qdh));
            ql_ = _mm512_add_pd(ql_, _mm512_mul_pd(_mm512_mul_pd(wl, qdl), qdl));
            qh_ = _mm512_add_pd(qh_, _mm512_mul_pd(_mm512_mul_pd(wh, qdh), qdh));
        }
        if (f32) {
            store16d(e, ef);
            store16d(sxq, sxf);
            store16d(sqq, sqf);
        } else {
            _mm512_storeu_pd(e, el); _mm512_storeu_pd(e + 8, eh);
            _mm512_storeu_pd(sxq, xl_); _mm512_storeu_pd(sxq + 8, xh_);
            _mm512_storeu_pd(sqq, ql_); _mm512_storeu_pd(sqq + 8, qh_);
        }
        int take[G];
        for (int b = 0; b < G; b++) {
            take[b] = going[b] && e[b] < best_e[b];
            best_e[b] = take[b] ? e[b] : best_e[b];
            best_d[b] = take[b] ? dd[b] : best_d[b];
            going[b] = going[b] && sqq[b] > 0.0;
            d[b] = (float)(sxq[b] / (sqq[b] > 0.0 ? sqq[b] : 1.0));
        }
        const __mmask16 tk = lanes_mask(take);
        if (tk)
            for (int i = 0; i < blk; i++)
                _mm_storeu_si128((__m128i *)best_c[i],
                                 _mm_mask_blend_epi8(tk, _mm_loadu_si128((const __m128i *)best_c[i]), cr[i]));
    }
    for (int b = 0; b < G; b++) dout[b] = best_d[b];
}

/* load_group with AVX-512: the same values (xb and cwb are zero padded to 16 blocks, as load_group reads them),
 * transposed 16 x 16 at a time by four rounds of interleaving row j with row j + 8. */
AI T512 void transpose16x16_f32(__m512 *r) {
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    for (int s = 0; s < 4; s++) {
        __m512 t[16];
        for (int j = 0; j < 8; j++) {
            t[2 * j] = _mm512_permutex2var_ps(r[j], lo, r[j + 8]);
            t[2 * j + 1] = _mm512_permutex2var_ps(r[j], hi, r[j + 8]);
        }
        for (int j = 0; j < 16; j++) r[j] = t[j];
    }
}

T512 static void load_group512(const float *xb, const float *cwb, int weighting, int blk, float (*x)[G],
                               double (*w)[G]) {
    for (int i0 = 0; i0 < blk; i0 += 16) {
        __m512 rx[16], rw[16];
        for (int b = 0; b < G; b++) {
            rx[b] = _mm512_loadu_ps(xb + b * blk + i0);
            rw[b] = _mm512_loadu_ps(cwb + b * blk + i0);
        }
        transpose16x16_f32(rx);
        transpose16x16_f32(rw);
        for (int i = 0; i < 16; i++) {
            _mm512_storeu_ps(x[i0 + i], rx[i]);
            _mm512_storeu_pd(w[i0 + i], lo8(rw[i]));
            _mm512_storeu_pd(w[i0 + i] + 8, hi8(rw[i]));
        }
    }
    if (weighting == ORK_NF4W_X2) {
        for (int i = 0; i < blk; i++) {
            const __m512 xv = _mm512_loadu_ps(x[i]);
            const __m512d xl = lo8(xv), xh = hi8(xv);
            _mm512_storeu_pd(w[i], _mm512_mul_pd(_mm512_loadu_pd(w[i]), _mm512_mul_pd(xl, xl)));
            _mm512_storeu_pd(w[i] + 8, _mm512_mul_pd(_mm512_loadu_pd(w[i] + 8), _mm512_mul_pd(xh, xh)));
        }
    } else if (weighting == ORK_NF4W_SIGMA) {
        __m512d sl = _mm512_setzero_pd(), sh = _mm512_setzero_pd();
        for (int i = 0; i < blk; i++) {
            const __m512 xv = _mm512_loadu_ps(x[i]);
            const __m512d xl = lo8(xv), xh = hi8(xv);
            sl = _mm512_add_pd(sl, _mm512_mul_pd(xl, xl));
            sh = _mm512_add_pd(sh, _mm512_mul_pd(xh, xh));
        }
        const __m512d two = _mm512_set1_pd(2.0), bl = _mm512_set1_pd((double)blk);
        sl = _mm512_div_pd(_mm512_mul_pd(two, sl), bl);
        sh = _mm512_div_pd(_mm512_mul_pd(two, sh), bl);
        for (int i = 0; i < blk; i++) {
            const __m512 xv = _mm512_loadu_ps(x[i]);
            const __m512d xl = lo8(xv), xh = hi8(xv);
            _mm512_storeu_pd(w[i], _mm512_mul_pd(_mm512_loadu_pd(w[i]),
                                                 _mm512_sqrt_pd(_mm512_add_pd(sl, _mm512_mul_pd(xl, xl)))));
            _mm512_storeu_pd(w[i] + 8, _mm512_mul_pd(_mm512_loadu_pd(w[i] + 8),
                                                     _mm512_sqrt_pd(_mm512_add_pd(sh, _mm512_mul_pd(xh, xh)))));
        }
    }
}

/* the 16 x 16 byte transpose: four rounds of interleaving row j with row j + 8 */
AI T512 void transpose16x16_u8(__m128i *r) {
    for (int s = 0; s < 4; s++) {
        __m128i t[16];
        for (int j = 0; j < 8; j++) {
            t[2 * j] = _mm_unpacklo_epi8(r[j], r[j + 8]);
            t[2 * j + 1] = _mm_unpackhi_epi8(r[j], r[j + 8]);
        }
        for (int j = 0; j < 16; j++) r[j] = t[j];
    }
}

/* numpy's searchsorted(mid, v, side="left") of 16 values (dq_nearest, 16 lanes) */
T512 static void dq_nearest16(const float *mid, const float *v, int *q) {
    const __m512 vv = _mm512_loadu_ps(v);
    __m512i pos = _mm512_setzero_si512();
    for (int step = 128; step; step >>= 1) {
        const __m512i idx = _mm512_add_epi32(pos, _mm512_set1_epi32(step - 1));
        const __m512 m = _mm512_i32gather_ps(idx, mid, 4);
        pos = _mm512_mask_add_epi32(pos, _mm512_cmp_ps_mask(m, vv, _CMP_LT_OQ), pos, _mm512_set1_epi32(step));
    }
    pos = _mm512_mask_mov_epi32(pos, _mm512_cmp_ps_mask(vv, vv, _CMP_UNORD_Q), _mm512_set1_epi32(255));
    _mm512_storeu_si512(q, pos);
}

T512 static void dq_avx512(const float (*x)[G], const double (*w)[G], const int *q0, const float *sc, float off,
                           const float *dq, uint8_t (*pk)[DQB / 2], int *qout, double *ax, double *ae) {
    TABS512
    float best_e[G], e[G];
    for (int b = 0; b < G; b++) { best_e[b] = INFINITY; qout[b] = q0[b]; }
    __m512 wfv[DQB];
    for (int i = 0; i < DQB; i++) wfv[i] = f32x16(w[i]);
    __m128i bc[DQB];
    for (int i = 0; i < DQB; i++) bc[i] = _mm_setzero_si128();
    for (int t = 0; t < NCAND; t++) {
        float a[G], iv[G];
        int valid[G], qc[G];
        for (int b = 0; b < G; b++) {
            const int qq = q0[b] + NF4DQ_CAND[t];
            valid[b] = qq >= 0 && qq <= 255;
            qc[b] = qq < 0 ? 0 : (qq > 255 ? 255 : qq);
            a[b] = dq[qc[b]] * sc[b] + off;
            const float inv = 1.0f / a[b];
            iv[b] = (a[b] != 0.0f && isfinite(inv)) ? inv : 0.0f;
        }
        const __m512 av = _mm512_loadu_ps(a), ivv = _mm512_loadu_ps(iv);
        __m512 ef = _mm512_setzero_ps();
        __m128i cr[DQB];
        for (int i = 0; i < DQB; i++) {
            const __m512 xv = _mm512_loadu_ps(x[i]);
            __m512i code;
            const __m512 q = levels512v(_mm512_mul_ps(xv, ivv), &code, &tb);
            cr[i] = _mm512_cvtepi32_epi8(code);
            const __m512 rv = _mm512_sub_ps(xv, _mm512_mul_ps(q, av));
            ef = _mm512_add_ps(ef, _mm512_mul_ps(_mm512_mul_ps(wfv[i], rv), rv));
        }
        _mm512_storeu_ps(e, ef);
        int take[G];
        for (int b = 0; b < G; b++) {
            take[b] = valid[b] && e[b] < best_e[b];
            best_e[b] = take[b] ? e[b] : best_e[b];
            qout[b] = take[b] ? qc[b] : qout[b];
        }
        const __mmask16 tk = lanes_mask(take);
        for (int i = 0; i < DQB; i++) bc[i] = _mm_mask_blend_epi8(tk, bc[i], cr[i]);
    }
    float ab[G];
    for (int b = 0; b < G; b++) ab[b] = dq[qout[b]] * sc[b] + off;
    const __m512 abv = _mm512_loadu_ps(ab);
    __m512d xl = _mm512_loadu_pd(ax), xh = _mm512_loadu_pd(ax + 8);
    __m512d el = _mm512_loadu_pd(ae), eh = _mm512_loadu_pd(ae + 8);
    __m128i pr[DQB / 2];
    for (int i = 0; i < DQB / 2; i++) pr[i] = _mm_or_si128(_mm_slli_epi16(bc[2 * i], 4), bc[2 * i + 1]);
    transpose16x16_u8(pr);
    for (int b = 0; b < G; b++) _mm_storeu_si128((__m128i *)pk[b], pr[b]);
    for (int i = 0; i < DQB; i++) {
        const __m512 xv = _mm512_loadu_ps(x[i]);
        const __m512 q = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(bc[i]), tb.cb);
        const __m512 r = _mm512_sub_ps(xv, _mm512_mul_ps(q, abv));
        const __m512d x64l = lo8(xv), x64h = hi8(xv), rl = lo8(r), rh = hi8(r);
        xl = _mm512_add_pd(xl, _mm512_mul_pd(x64l, x64l));
        xh = _mm512_add_pd(xh, _mm512_mul_pd(x64h, x64h));
        el = _mm512_add_pd(el, _mm512_mul_pd(rl, rl));
        eh = _mm512_add_pd(eh, _mm512_mul_pd(rh, rh));
    }
    _mm512_storeu_pd(ax, xl); _mm512_storeu_pd(ax + 8, xh);
    _mm512_storeu_pd(ae, el); _mm512_storeu_pd(ae + 8, eh);
}
#endif

#if defined(ORK_NF4OPT_X86)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void load_group(const float *xb, const float *cwb, int weighting, int nb, int blk, float (*x)[G],
                       double (*w)[G]) {
    /* xb: nb blocks of blk floats (sanitized, zero padded); cwb: their column weights (0 past the end) */
    for (int b = 0; b < G; b++) {
        for (int i = 0; i < blk; i++) {
            x[i][b] = b < nb ? xb[b * blk + i] : 0.0f;
            w[i][b] = b < nb ? (double)cwb[b * blk + i] : 0.0;
        }
    }
    if (weighting == ORK_NF4W_X2) {
        for (int i = 0; i < blk; i++)
            for (int b = 0; b < G; b++) w[i][b] = w[i][b] * ((double)x[i][b] * (double)x[i][b]);
    } else if (weighting == ORK_NF4W_SIGMA) {
        double s2[G];
        for (int b = 0; b < G; b++) s2[b] = 0.0;
        for (int i = 0; i < blk; i++)
            for (int b = 0; b < G; b++) s2[b] += (double)x[i][b] * (double)x[i][b];
        for (int b = 0; b < G; b++) s2[b] = 2.0 * s2[b] / (double)blk;
        for (int i = 0; i < blk; i++)
            for (int b = 0; b < G; b++) w[i][b] = w[i][b] * sqrt(s2[b] + (double)x[i][b] * (double)x[i][b]);
    }
}

/* The 16 blocks from block g0 (nb of them real) into xb / cwb (zero padded): returns the non-finite count. */
static int64_t gather_group(const void *x, int dtype, int64_t n, int64_t k, const float *col_w, int blk, int64_t g0,
                            int nb, float *xb, float *cwb) {
    const int esz = dtype == ORK_DT_F32 ? 4 : 2;
    const int64_t off0 = g0 * blk;
    const int64_t len_all = (n - off0 < (int64_t)nb * blk) ? n - off0 : (int64_t)nb * blk;
    const int64_t nf = ork_widen((const char *)x + off0 * esz, dtype, len_all, xb);
    for (int64_t i = 0; i < len_all; i++) xb[i] = (f2u(xb[i]) & 0x7f800000u) == 0x7f800000u ? 0.0f : xb[i];
    for (int64_t i = len_all; i < (int64_t)G * blk; i++) xb[i] = 0.0f;
    if (col_w) {
        int64_t col = k > 0 ? off0 % k : 0;
        for (int64_t i = 0; i < len_all; i++) {
            cwb[i] = col_w[col];
            if (++col == k) col = 0;
        }
    } else {
        for (int64_t i = 0; i < len_all; i++) cwb[i] = 1.0f;
    }
    for (int64_t i = len_all; i < (int64_t)G * blk; i++) cwb[i] = 0.0f;
    return nf;
}

static int want512(void) {
#ifdef ORK_NF4OPT_X86
    if (ork_codecs_isa() == ORK_ISA_AVX512) return ork_nf4_bin_tables(&BIN_MID, &BIN_BASE) == 1;
#endif
    return 0;
}

/* Pack the codes of block b (codes[i][b], len of them) and add its SQNR sums: lane i % 16, in element order. */
static void block_out(uint8_t (*cs)[G], int b, int blk, const float *xr, int len, float a, uint8_t *dst, double *ax,
                      double *ae) {
    uint8_t packed[BLKMAX / 2];
    for (int i = 0; i < blk / 2; i++) packed[i] = (uint8_t)((cs[2 * i][b] << 4) | cs[2 * i + 1][b]);
    memcpy(dst, packed, (size_t)((len + 1) / 2));
    for (int g = 0; g < blk; g += 16)
        for (int l = 0; l < 16; l++) {
            const float xv = xr[g + l];
            const float r = xv - CB[cs[g + l][b]] * a;
            ax[l] += (double)xv * (double)xv;
            ae[l] += (double)r * (double)r;
        }
}

static void fold_stats(const double *ax, const double *ae, int64_t nf, ork_codec_stats *st) {
    double sx = 0.0, se = 0.0;
    for (int l = 0; l < 16; l++) {
        sx += ax[l];
        se += ae[l];
    }
    st->sum_x2 = sx;
    st->sum_err2 = se;
    st->nonfinite = nf;
}

void ork_nf4opt_encode(const void *x, int dtype, int64_t n, int64_t k, const float *col_w, int weighting, int block,
                       int tries, int64_t b0, int64_t b1, uint8_t *codes, float *absmax, ork_codec_stats *st) {
    const int use512 = want512();
    (void)use512;
    const int blk = block == 32 ? 32 : 64;
    double ax[16], ae[16];
    for (int l = 0; l < 16; l++) ax[l] = ae[l] = 0.0;
    int64_t nf = 0;
    float xb[G * BLKMAX], cwb[G * BLKMAX], dout[G];
    float xs[BLKMAX][G];
    double ws[BLKMAX][G];
    uint8_t cs[BLKMAX][G];
    int tail[G];
    for (int64_t g0 = b0; g0 < b1; g0 += G) {
        const int nb = (int)(b1 - g0 < G ? b1 - g0 : G);
        const int64_t off0 = g0 * blk;
        nf += gather_group(x, dtype, n, k, col_w, blk, g0, nb, xb, cwb);
        for (int b = 0; b < G; b++) tail[b] = b < nb && off0 + (int64_t)(b + 1) * blk > n;
#ifdef ORK_NF4OPT_X86
        if (use512) load_group512(xb, cwb, weighting, blk, xs, ws);
        else
#endif
            load_group(xb, cwb, weighting, nb, blk, xs, ws);
        const float (*xc)[G] = (const float (*)[G])xs;
        const double (*wc)[G] = (const double (*)[G])ws;
#ifdef ORK_NF4OPT_X86
        if (use512) {
            group_avx512(xc, wc, tail, blk, tries, cs, dout);
        } else
#endif
        {
            if (blk == 32) group_generic32(xc, wc, tail, tries, cs, dout);
            else group_generic64(xc, wc, tail, tries, cs, dout);
        }
        for (int b = 0; b < nb; b++) {
            const int64_t off = off0 + (int64_t)b * blk;
            absmax[g0 + b] = dout[b];
            if (codes) block_out(cs, b, blk, xb + (int64_t)b * blk, (int)(n - off < blk ? n - off : blk), dout[b],
                                 codes + off / 2, ax, ae);
        }
    }
    if (st) fold_stats(ax, ae, nf, st);
}

/* ---------------------------------------------------------------- nf4dq */

static void dq_tables(float *dq, float *mid) {
    for (int i = 0; i < 256; i++) dq[i] = u2f(DQ_CODE_BITS[i]);
    for (int i = 0; i < 255; i++) mid[i] = (dq[i] + dq[i + 1]) / 2.0f;
}

/* numpy's searchsorted(mid, v, side="left"): the number of mid strictly below v (NaN sorts last: 255) */
static int dq_nearest(const float *mid, float v) {
    if (v != v) return 255;
    int pos = 0; /* branch-free lower bound over the 255 sorted midpoints */
    for (int step = 128; step; step >>= 1) pos += mid[pos + step - 1] < v ? step : 0;
    return pos;
}

void ork_nf4dq_scales(const float *d, int64_t nb, float *scale, float *offset) {
    double sum = 0.0;
    for (int64_t b = 0; b < nb; b++) sum += (double)d[b];
    const float off = (float)(sum / (double)nb);
    *offset = off;
    for (int64_t g0 = 0; g0 < nb; g0 += ORK_NF4DQ_GROUP) {
        const int64_t g1 = nb - g0 < ORK_NF4DQ_GROUP ? nb : g0 + ORK_NF4DQ_GROUP;
        float m = 0.0f;
        for (int64_t b = g0; b < g1; b++) {
            const float r = fabsf(d[b] - off);
            m = (r > m || r != r) && m == m ? r : m; /* numpy's max: a NaN wins */
        }
        scale[g0 / ORK_NF4DQ_GROUP] = m;
    }
}

void ork_nf4dq_encode(const void *x, int dtype, int64_t n, int64_t k, const float *col_w, int weighting,
                      const float *d, const float *scale, float offset, int64_t b0, int64_t b1, uint8_t *codes,
                      uint8_t *absmax_q, ork_codec_stats *st) {
    const int use512 = want512();
    (void)use512;
    float dq[256], mid[255];
    dq_tables(dq, mid);
    double ax[16], ae[16];
    for (int l = 0; l < 16; l++) ax[l] = ae[l] = 0.0;
    int64_t nf = 0;
    float xb[G * DQB], cwb[G * DQB];
    float xs[DQB][G];
    double ws[DQB][G];
    uint8_t pk[G][DQB / 2];
    int q0[G], qo[G];
    float sc[G];
    for (int64_t g0 = b0; g0 < b1; g0 += G) {
        const int nb = (int)(b1 - g0 < G ? b1 - g0 : G);
        nf += gather_group(x, dtype, n, k, col_w, DQB, g0, nb, xb, cwb);
#ifdef ORK_NF4OPT_X86
        if (use512) load_group512(xb, cwb, weighting, DQB, xs, ws);
        else
#endif
            load_group(xb, cwb, weighting, nb, DQB, xs, ws);
        float v[G];
        for (int b = 0; b < G; b++) {
            sc[b] = b < nb ? scale[(g0 + b) / ORK_NF4DQ_GROUP] : 0.0f;
            const float r = (b < nb ? d[g0 + b] : 0.0f) - offset;
            v[b] = sc[b] > 0.0f ? r / sc[b] : 0.0f; /* past the end: 0, the code 127 */
        }
#ifdef ORK_NF4OPT_X86
        if (use512) dq_nearest16(mid, v, q0);
        else
#endif
            for (int b = 0; b < G; b++) q0[b] = dq_nearest(mid, v[b]);
        const float (*xc)[G] = (const float (*)[G])xs;
        const double (*wc)[G] = (const double (*)[G])ws;
#ifdef ORK_NF4OPT_X86
        if (use512) dq_avx512(xc, wc, q0, sc, offset, dq, pk, qo, ax, ae);
        else
#endif
            dq_generic(xc, wc, q0, sc, offset, dq, pk, qo, ax, ae);
        for (int b = 0; b < nb; b++) {
            const int64_t off = (g0 + b) * DQB;
            absmax_q[g0 + b] = (uint8_t)qo[b];
            const int len = (int)(n - off < DQB ? n - off : DQB);
            if (len == DQB) memcpy(codes + off / 2, pk[b], DQB / 2);
            else memcpy(codes + off / 2, pk[b], (size_t)((len + 1) / 2));
        }
    }
    if (st) fold_stats(ax, ae, nf, st);
}

