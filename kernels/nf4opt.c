/* nf4opt.c: error-minimizing NF4 encode. See nf4opt.h; the definition is
 * orkpack/codecs/reference.py nf4opt_encode, mirrored here operation for operation.
 *
 * Layout: 16 blocks at a time, one per SIMD lane (x[i][b] is element i of block b), so every
 * per-block sum runs in order over i inside its own lane (the reference's order) and nothing is
 * horizontal. The search itself (kernels/nf4opt_body.inc) is written once, in vector extensions over
 * 16 lanes, and compiled once per SIMD level; only the NF4 code of a scaled value s (bitsandbytes': the
 * number of float32 midpoints strictly below s) is found per level:
 *   - AVX-512: the bin tables of codecs.c's fast encoder (s clamped to +-1.03 first, which changes no code);
 *   - AVX2: a branch-free binary search over the 15 midpoints (two 8-lane halves, permutes of 8);
 *   - NEON (aarch64): the same binary search with tbl lookups (four 4-lane quarters);
 *   - portable: 15 compares (any other target, and x86 with ork_codecs_set_isa(portable)).
 * The nf4dq unit-weight bodies (no imatrix: every weight 1) have their own lookups where a level gives them:
 * AVX-512 wide bins by one fma, AVX2 and portable the scan's pair of values (s and -s) from |s|.
 * The same codes, so the same bytes at every level (tests/test_nf4opt.py, tests/test_nf4dq.py; NEON under
 * qemu-aarch64 in tests/test_aarch64.py). x86 picks the level of ork_codecs_isa(); aarch64 always runs NEON.
 *
 * Also nf4dq (reference.nf4dq_encode; tests/test_nf4dq.py): its first step is this encoder at block 32
 * (with float32 error and refit sums), then ork_nf4dq_scales (offset, group scales) and ork_nf4dq_encode
 * (per block the 8-bit absmax code among 3 candidates and the NF4 codes), (the decode is runtime.c ork_rt_nf4dq_decode). */
#include "codecs.h"
#include "nf4opt.h"

#include <math.h>
#include <pthread.h>
#if defined(__x86_64__) || defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi" /* 64-byte vectors by value between always-inlined helpers only */
#endif

#define AI static inline __attribute__((always_inline))
#define ORK_ALIGN64 __attribute__((aligned(64))) /* the bodies' [i][b] arrays (nf4opt_body.inc ALIGNED_IN) */
#define BLKMAX 64
#define G 16
#define ROUNDS 2
static const float STEP = 3.0f / 32.0f;
static const float TINY = 1e-38f;

#include "nf4_codebook.h"
#include "nf4dq_code.h"

AI uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
AI float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

#define DQB 32
static const int NF4DQ_CAND[] = {0, -1, 1}; /* reference.NF4DQ_CANDIDATES */
#define NCAND ((int)(sizeof NF4DQ_CAND / sizeof NF4DQ_CAND[0]))

/* native vector types of 4, 8 and 16 floats (and their halves) for the levels' bodies */
#define VT(name, T, bytes) typedef T name __attribute__((vector_size(bytes)));
VT(vf4, float, 16) VT(vi4, int32_t, 16) VT(vu4, uint32_t, 16) VT(vfh2, float, 8) VT(vih2, int32_t, 8)
VT(vdn2, double, 16) VT(vln2, int64_t, 16)
VT(vf8, float, 32) VT(vi8, int32_t, 32) VT(vu8, uint32_t, 32) VT(vfh4, float, 16) VT(vih4, int32_t, 16)
VT(vdn4, double, 32) VT(vln4, int64_t, 32)
VT(vf16, float, 64) VT(vi16, int32_t, 64) VT(vu16, uint32_t, 64) VT(vfh8, float, 32) VT(vih8, int32_t, 32)
VT(vdn8, double, 64) VT(vln8, int64_t, 64)
#undef VT

/* ------------------------------------------------------------------ the code of a scaled value, per level */

/* portable: 15 compares; the code book value by bits (no table lookup, nothing but lane-wise operations) */
AI vf4 lv_portable(vf4 s, vi4 *code) {
    vi4 c = {0, 0, 0, 0};
    const uint32_t c0 = f2u(CB[0]);
    vu4 cbb = {c0, c0, c0, c0};
    for (int m = 0; m < 15; m++) {
        const vi4 gt = s > MID[m];
        c -= gt;
        cbb ^= (vu4)gt & (f2u(CB[m + 1]) ^ f2u(CB[m]));
    }
    *code = c;
    return (vf4)cbb;
}
/* the unit bodies' (LEVELSU): 15 compares for the code, its value read per lane (nf4dq step 3 122 against 133 ms
 * with the value by bits; in the weighted bodies the bits are faster: opt encode at 64 0.074 against 0.069-0.071
 * GB/s with the read) */
AI vf4 lvt_portable(vf4 s, vi4 *code) {
    vi4 c = {0, 0, 0, 0};
    for (int m = 0; m < 15; m++) c -= s > MID[m];
    *code = c;
    vf4 q;
    for (int b = 0; b < 4; b++) q[b] = CB[c[b]];
    return q;
}
/* the value alone (the unit bodies' scan): 15 compares, the code book value by bits, no count (the per-lane bin
 * tables of codecs.c in scalar code were slower here: 0.088 against 0.106 GB/s) */
AI vf4 lvq_portable(vf4 s) {
    const uint32_t c0 = f2u(CB[0]);
    vu4 cbb = {c0, c0, c0, c0};
    for (int m = 0; m < 15; m++) cbb ^= (vu4)(s > MID[m]) & (f2u(CB[m + 1]) ^ f2u(CB[m]));
    return (vf4)cbb;
}
/* the values of the codes of s and of -s (the unit bodies' scan): from a = |s|, the code of a non-negative value is
 * 7 + P(a), P(a) = #{m >= 7: MID[m] < a}, and of a negative one 7 - N(a), N(a) = #{m <= 6: -MID[m] <= a} (every
 * MID[m], m <= 6, is below -0.0 and every MID[m], m >= 7, above +0.0), so the 15 compares of a give both values
 * (s < 0 swaps them; s = +-0: both are code 7) instead of 30 (nf4dq step 1 167 against 220 ms) */
AI void lvpn_portable(vf4 s, vf4 *qp, vf4 *qn) {
    const vf4 a = (vf4)((vu4)s & 0x7fffffffu);
    const uint32_t c7 = f2u(CB[7]);
    vu4 pb = {c7, c7, c7, c7}, nb = pb;
    for (int m = 7; m < 15; m++) pb ^= (vu4)(a > MID[m]) & (f2u(CB[m + 1]) ^ f2u(CB[m]));
    for (int m = 6; m >= 0; m--) nb ^= (vu4)(a >= -MID[m]) & (f2u(CB[m]) ^ f2u(CB[m + 1]));
    const vu4 neg = (vu4)(s < 0.0f), pos = (vu4)(s > 0.0f);
    *qp = (vf4)((neg & nb) | (~neg & pb));
    *qn = (vf4)((pos & nb) | (~pos & pb));
}
#define W 4
#define vf vf4
#define vi vi4
#define vu vu4
#define vfh vfh2
#define vih vih2
#define vdn vdn2
#define vln vln2
#define SUF portable
#define ATTR
#define LV_SETUP
#define LEVELS(s, c) lv_portable(s, c)
#define LVU_SETUP
#define LEVELSU(s, c) lvt_portable(s, c)
#define LEVELSQ(s) lvq_portable(s)
#define LEVELSQN(s) lvq_portable(s)
#define LEVELSPN(s, qp, qn) lvpn_portable(s, qp, qn)
#define DQ_ONEPASS
#include "nf4opt_body.inc"
#undef DQ_ONEPASS
#undef SUF
#undef ATTR
#undef LV_SETUP
#undef LEVELS
#undef LVU_SETUP
#undef LEVELSU
#undef LEVELSQ
#undef LEVELSQN
#undef LEVELSPN

#if defined(__x86_64__) && defined(__GNUC__) && !defined(ORK_NO_X86_SIMD)
#define ORK_NF4OPT_X86 1
#include <immintrin.h>
#ifdef __clang__
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2")))
#else /* GCC: the full 512-bit width for the vector extensions too (its default tuning may split them in two) */
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,prefer-vector-width=512")))
#endif
#define T256 __attribute__((target("avx2")))
/* bin tables as codecs.c's (bin(s) = (int)(s * 15.5f + 16.0f) for |s| <= 1.03): code = BASE[bin] + (s > MIDB[bin]) */
static const float *BIN_MID;
static const int32_t *BIN_BASE;

AI T512 __m512d lo8(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
AI T512 __m512d hi8(__m512 v) {
    return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
typedef struct { __m512 mlo, mhi, cb; __m512i blo, bhi; } tabs512;
AI T512 tabs512 tabs512_load(void) {
    tabs512 t;
    t.mlo = _mm512_loadu_ps(BIN_MID);
    t.mhi = _mm512_loadu_ps(BIN_MID + 16);
    t.blo = _mm512_loadu_si512(BIN_BASE);
    t.bhi = _mm512_loadu_si512(BIN_BASE + 16);
    t.cb = _mm512_loadu_ps(CB);
    return t;
}
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
AI T512 vf16 lv_avx512(vf16 s, vi16 *code, const tabs512 *t) {
    __m512i c;
    const __m512 q = levels512v((__m512)s, &c, t);
    *code = (vi16)c;
    return (vf16)q;
}
/* The unit-weight bodies' lookups (group32u, dq32u): bins of [-1.1, 1.1], wbin(s) = the integer nearest (ties to
 * even) to s * 14 + 16, a non-decreasing function of s with wbin(-1.1f) = 1 and wbin(1.1f) = 31, found by one fma:
 * t = fma(s, 14, 2^23 + 16) is 2^23 + wbin(s) (one rounding, of s * 14 + 16 + 2^23: to an integer, as every float
 * in [2^23, 2^24) is), whose low 5 bits are wbin(s): the index vpermt2ps / vpermps read, with no conversion. s is
 * first clamped to +-1.1 (vrangeps: the smaller magnitude with the sign of s), which changes no code (every midpoint
 * is within +-0.87); where |s| <= 1.1 is known (the first pass and the scan: |x| <= amax) the clamp is left out.
 * As codecs.c's tables: code = WBASE[v] + (s > WMID[v]) for v = wbin(s), exact as long as no bin holds two
 * midpoints (checked when built; else the unit bodies use the old lookup). The same bins also give the code of -s
 * (the scan's other sign) from the mirrored midpoints NMID_j = -MID[14 - j]: code(-s) = 15 - #{NMID_j <= s} =
 * WNB[v] - (s >= WNMID[v]), WNB[v] = 15 - #{j: wbin(NMID_j) < v} (x * (-inv) is -(x * inv) exactly). */
static float WMID[32], WNMID[32];
static int32_t WBASE[32], WNB[32];
static int wtabs_ok; /* 1 valid, -1 not */
static pthread_once_t wtabs_once = PTHREAD_ONCE_INIT;
/* 2^23 + wbin(s) as bits: the low 5 bits index the 32-entry tables */
AI T512 __m512i wbin512(__m512 s) {
    return _mm512_castps_si512(_mm512_fmadd_ps(s, _mm512_set1_ps(14.0f), _mm512_set1_ps(8388608.0f + 16.0f)));
}
T512 static void wtabs_build(void) {
    float m[16], nm[16], e[16] = {-1.1f, 1.1f};
    int32_t bm[16], bn[16], be[16];
    for (int k = 0; k < 16; k++) {
        m[k] = k < 15 ? MID[k] : 0.0f;
        nm[k] = k < 15 ? -MID[14 - k] : 0.0f;
    }
    const __m512i b23 = _mm512_set1_epi32(0x4b000000); /* the bits of 2^23 */
    _mm512_storeu_si512(bm, _mm512_sub_epi32(wbin512(_mm512_loadu_ps(m)), b23));
    _mm512_storeu_si512(bn, _mm512_sub_epi32(wbin512(_mm512_loadu_ps(nm)), b23));
    _mm512_storeu_si512(be, _mm512_sub_epi32(wbin512(_mm512_loadu_ps(e)), b23));
    int ok = be[0] >= 0 && be[1] <= 31;
    for (int v = 0; v < 32; v++) {
        int base = 0, nbase = 0, hits = 0, nhits = 0;
        WMID[v] = 2.0f;
        WNMID[v] = 2.0f;
        for (int k = 0; k < 15; k++) {
            ok &= bm[k] >= 0 && bm[k] < 32 && bn[k] >= 0 && bn[k] < 32;
            base += bm[k] < v;
            nbase += bn[k] < v;
            if (bm[k] == v) { WMID[v] = m[k]; hits++; }
            if (bn[k] == v) { WNMID[v] = nm[k]; nhits++; }
        }
        ok &= hits <= 1 && nhits <= 1;
        WBASE[v] = base;
        WNB[v] = 15 - nbase;
    }
    wtabs_ok = ok ? 1 : -1;
}
static void wtabs_init(void) { pthread_once(&wtabs_once, wtabs_build); }

typedef struct { __m512 mlo, mhi, nlo, nhi, cb; __m512i blo, bhi, nblo, nbhi; } wtabs512;
AI T512 wtabs512 wtabs512_load(void) {
    wtabs512 t;
    t.mlo = _mm512_loadu_ps(WMID);
    t.mhi = _mm512_loadu_ps(WMID + 16);
    t.nlo = _mm512_loadu_ps(WNMID);
    t.nhi = _mm512_loadu_ps(WNMID + 16);
    t.blo = _mm512_loadu_si512(WBASE);
    t.bhi = _mm512_loadu_si512(WBASE + 16);
    t.nblo = _mm512_loadu_si512(WNB);
    t.nbhi = _mm512_loadu_si512(WNB + 16);
    t.cb = _mm512_loadu_ps(CB);
    return t;
}
/* |s| <= 1.1: the code of s and its value */
AI T512 __m512 wlv512(__m512 s, __m512i *code, const wtabs512 *t) {
    const __m512i bin = wbin512(s);
    const __m512 mid = _mm512_permutex2var_ps(t->mlo, bin, t->mhi);
    const __m512i base = _mm512_permutex2var_epi32(t->blo, bin, t->bhi);
    *code = _mm512_mask_add_epi32(base, _mm512_cmp_ps_mask(s, mid, _CMP_GT_OQ), base, _mm512_set1_epi32(1));
    return _mm512_permutexvar_ps(*code, t->cb);
}
/* |s| <= 1.1: the values of the codes of s and of -s */
AI T512 void wlv512pn(__m512 s, __m512 *qp, __m512 *qn, const wtabs512 *t) {
    const __m512i bin = wbin512(s);
    const __m512 mid = _mm512_permutex2var_ps(t->mlo, bin, t->mhi);
    const __m512i base = _mm512_permutex2var_epi32(t->blo, bin, t->bhi);
    const __m512i cp = _mm512_mask_add_epi32(base, _mm512_cmp_ps_mask(s, mid, _CMP_GT_OQ), base, _mm512_set1_epi32(1));
    const __m512 nmid = _mm512_permutex2var_ps(t->nlo, bin, t->nhi);
    const __m512i nb = _mm512_permutex2var_epi32(t->nblo, bin, t->nbhi);
    const __m512i cn = _mm512_mask_sub_epi32(nb, _mm512_cmp_ps_mask(s, nmid, _CMP_GE_OQ), nb, _mm512_set1_epi32(1));
    *qp = _mm512_permutexvar_ps(cp, t->cb);
    *qn = _mm512_permutexvar_ps(cn, t->cb);
}
AI T512 vf16 wq_avx512(vf16 s, vi16 *code, int clamp, const wtabs512 *t) {
    __m512 v = (__m512)s;
    if (clamp) v = _mm512_range_ps(v, _mm512_set1_ps(1.1f), 0x02);
    __m512i c;
    const __m512 q = wlv512(v, &c, t);
    *code = (vi16)c;
    return (vf16)q;
}
#undef W
#undef vf
#undef vi
#undef vu
#undef vfh
#undef vih
#undef vdn
#undef vln
#define W 16
#define vf vf16
#define vi vi16
#define vu vu16
#define vfh vfh8
#define vih vih8
#define vdn vdn8
#define vln vln8
#define SUF avx512
#define ATTR T512
#define LV_SETUP const tabs512 tb = tabs512_load();
#define LEVELS(s, c) lv_avx512(s, c, &tb)
#define LVU_SETUP const wtabs512 wt = wtabs512_load();
#define LEVELSU(s, c) wq_avx512(s, c, 1, &wt)
#define LEVELSQ(s) ({ vi16 c_; wq_avx512(s, &c_, 1, &wt); })
#define LEVELSQN(s) ({ vi16 c_; wq_avx512(s, &c_, 0, &wt); })
#define LEVELSPN(s, qp, qn) wlv512pn((__m512)(s), (__m512 *)(qp), (__m512 *)(qn), &wt)
#define DQ_ONEPASS
#define UMAX(a, b) ((vu16)_mm512_max_epu32((__m512i)(a), (__m512i)(b)))
#define DCVT(v) ((dv_t_avx512){{(vdn8)lo8((__m512)(v)), (vdn8)hi8((__m512)(v))}})
#define DTOF(d) ((vf16)_mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps((__m512d)(d).h[0])), \
                                          _mm512_cvtpd_ps((__m512d)(d).h[1]), 1))
#include "nf4opt_body.inc"
#undef SUF
#undef ATTR
#undef LV_SETUP
#undef LEVELS
#undef LVU_SETUP
#undef LEVELSU
#undef LEVELSQ
#undef LEVELSQN
#undef LEVELSPN
#undef DQ_ONEPASS
#undef UMAX
#undef DCVT
#undef DTOF

/* AVX2: numpy's searchsorted(MID, s, side="left") by a branch-free binary search, the path bits b1..b4 building
 * the next level's index (2 idx + b): MID[7]; MID[3] or MID[11] (by bits); MID[1, 5, 9, 13][2 b1 + b2];
 * MID[0, 2, .., 14][4 b1 + 2 b2 + b3]; pos = 8 b1 + 4 b2 + 2 b3 + b4, then CB[pos] from two permutes of 8 (they read
 * the low 3 bits) chosen by b1. No blendv (3 uops here): selections by and / xor. */
static const float MID_Q[8] = {MIDK(1, 2), MIDK(5, 6), MIDK(9, 10), MIDK(13, 14), 0, 0, 0, 0};
static const float MID_E[8] = {MIDK(0, 1), MIDK(2, 3), MIDK(4, 5), MIDK(6, 7),
                               MIDK(8, 9), MIDK(10, 11), MIDK(12, 13), MIDK(14, 15)};
/* The scan's pair (the values of the codes of s and of -s, |s| <= 1.1) from a = |s|: the code of s >= 0 is
 * 7 + P(a), P(a) = #{m >= 7: MID[m] < a}, of s < 0 7 - N(a), N(a) = #{m <= 6: -MID[m] <= a} (as the portable level's).
 * The 8 thresholds of P (P_k = MID[7 + k]) and the 7 of N (N_k = -MID[6 - k]) alternate, P_0 < N_0 < P_1 < .. <
 * N_6 < P_7, so 8 bins of a hold one of each (bin 7: P_7 alone): bin(a) = (int)g(a), g(a) = (a * PB_B + PB_A) * a
 * (float32 operations), and in bin v, P(a) = v + (a > P_v) and N(a) = v + (a >= N_v) (N_7 = +inf). Exact because
 * the real g is strictly increasing on [0, 1.1] (PB_A + 2 * PB_B * 1.1 > 0), g(1.1) < 8 (no clamp), and every
 * P_k and N_k has k + m <= g <= k + 1 - m with a margin m of 0.02 (tests/test_nf4dq.py checks these in float32),
 * far above the evaluation's rounding (< 1e-5): a in bin v is then above every threshold of a lower bin and below
 * every one of a higher bin. The values from bin tables (CB[7 + v] or CB[8 + v] by the compare, CB[7 - v] or
 * CB[6 - v]), swapped where s is negative (by its sign bit: s = -0.0 has both values CB[7]). 22 operations for the
 * pair (the former two 3-level searches over 7 thresholds: 32). */
#define PB_A 13.0f
#define PB_B (-5.625f)
static const float PB_NT[8] = {-MIDK(6, 7), -MIDK(5, 6), -MIDK(4, 5), -MIDK(3, 4), -MIDK(2, 3), -MIDK(1, 2),
                               -MIDK(0, 1), INFINITY};
static const float VNEG[8] = {CB_7, CB_6, CB_5, CB_4, CB_3, CB_2, CB_1, CB_0};
static const float VNEG1[8] = {CB_6, CB_5, CB_4, CB_3, CB_2, CB_1, CB_0, CB_0};
typedef struct { __m256 q, e, cl, ch, pt, nt, plo, px, nlo, nx; } tabs256;
AI T256 tabs256 tabs256_load(void) {
    tabs256 t;
    t.q = _mm256_loadu_ps(MID_Q);
    t.e = _mm256_loadu_ps(MID_E);
    t.cl = _mm256_loadu_ps(CB);
    t.ch = _mm256_loadu_ps(CB + 8);
    t.pt = _mm256_loadu_ps(MID + 7);
    t.nt = _mm256_loadu_ps(PB_NT);
    t.plo = _mm256_loadu_ps(CB + 7);
    t.px = _mm256_xor_ps(t.plo, t.ch);
    t.nlo = _mm256_loadu_ps(VNEG);
    t.nx = _mm256_xor_ps(t.nlo, _mm256_loadu_ps(VNEG1));
    return t;
}

AI T256 __m256i m2i(__m256 m) { return _mm256_castps_si256(m); }
/* 2 idx + (the compare's bit): idx + idx - mask */
AI T256 __m256i nexti(__m256i idx, __m256 m) { return _mm256_sub_epi32(_mm256_add_epi32(idx, idx), m2i(m)); }
AI T256 __m256 lv8(__m256 s, __m256i *code, const tabs256 *t) {
    const __m256 m1 = _mm256_cmp_ps(s, _mm256_set1_ps(MID[7]), _CMP_GT_OQ);
    const __m256 t2 = _mm256_xor_ps(_mm256_set1_ps(MID[3]),
                                    _mm256_and_ps(m1, _mm256_xor_ps(_mm256_set1_ps(MID[3]), _mm256_set1_ps(MID[11]))));
    __m256i idx = _mm256_srli_epi32(m2i(m1), 31);
    idx = nexti(idx, _mm256_cmp_ps(s, t2, _CMP_GT_OQ));
    idx = nexti(idx, _mm256_cmp_ps(s, _mm256_permutevar8x32_ps(t->q, idx), _CMP_GT_OQ));
    const __m256i pos = nexti(idx, _mm256_cmp_ps(s, _mm256_permutevar8x32_ps(t->e, idx), _CMP_GT_OQ));
    *code = pos;
    const __m256 ql = _mm256_permutevar8x32_ps(t->cl, pos), qh = _mm256_permutevar8x32_ps(t->ch, pos);
    return _mm256_xor_ps(ql, _mm256_and_ps(m1, _mm256_xor_ps(ql, qh)));
}
AI T256 void lv8pn(__m256 s, __m256 *qp, __m256 *qn, const tabs256 *t) {
    const __m256 a = _mm256_and_ps(s, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
    const __m256i v = _mm256_cvttps_epi32(
        _mm256_mul_ps(_mm256_add_ps(_mm256_mul_ps(a, _mm256_set1_ps(PB_B)), _mm256_set1_ps(PB_A)), a));
    const __m256 mp = _mm256_cmp_ps(a, _mm256_permutevar8x32_ps(t->pt, v), _CMP_GT_OQ);
    const __m256 mn = _mm256_cmp_ps(a, _mm256_permutevar8x32_ps(t->nt, v), _CMP_GE_OQ);
    const __m256 vp = _mm256_xor_ps(_mm256_permutevar8x32_ps(t->plo, v), _mm256_and_ps(mp, _mm256_permutevar8x32_ps(t->px, v)));
    const __m256 vn = _mm256_xor_ps(_mm256_permutevar8x32_ps(t->nlo, v), _mm256_and_ps(mn, _mm256_permutevar8x32_ps(t->nx, v)));
    const __m256 sw = _mm256_and_ps(_mm256_castsi256_ps(_mm256_srai_epi32(_mm256_castps_si256(s), 31)),
                                    _mm256_xor_ps(vp, vn));
    *qp = _mm256_xor_ps(vp, sw);
    *qn = _mm256_xor_ps(vn, sw);
}
AI T256 vf8 lv_avx2(vf8 s, vi8 *code, const tabs256 *t) {
    __m256i c;
    const __m256 q = lv8((__m256)s, &c, t);
    *code = (vi8)c;
    return (vf8)q;
}
#undef W
#undef vf
#undef vi
#undef vu
#undef vfh
#undef vih
#undef vdn
#undef vln
#define W 8
#define vf vf8
#define vi vi8
#define vu vu8
#define vfh vfh4
#define vih vih4
#define vdn vdn4
#define vln vln4
#define SUF avx2
#define ATTR T256
#define LV_SETUP const tabs256 tb = tabs256_load();
#define LEVELS(s, c) lv_avx2(s, c, &tb)
#define LEVELSQ(s) ({ vi8 c_; lv_avx2(s, &c_, &tb); })
#define LEVELSQN(s) LEVELSQ(s)
#define LEVELSPN(s, qp, qn) lv8pn((__m256)(s), (__m256 *)(qp), (__m256 *)(qn), &tb)
#define UMAX(a, b) ((vu8)_mm256_max_epu32((__m256i)(a), (__m256i)(b)))
#define DQ_ONEPASS
#define DCVT(v) ((dv_t_avx2){{(vdn4)_mm256_cvtps_pd(_mm256_castps256_ps128((__m256)(v))), \
                               (vdn4)_mm256_cvtps_pd(_mm256_extractf128_ps((__m256)(v), 1))}})
#define DTOF(d) ((vf8)_mm256_insertf128_ps(_mm256_castps128_ps256(_mm256_cvtpd_ps((__m256d)(d).h[0])), \
                                           _mm256_cvtpd_ps((__m256d)(d).h[1]), 1))
#include "nf4opt_body.inc"
#undef SUF
#undef ATTR
#undef LV_SETUP
#undef LEVELS
#undef LEVELSQ
#undef LEVELSQN
#undef LEVELSPN
#undef UMAX
#undef DQ_ONEPASS
#undef DCVT
#undef DTOF
#endif

#if defined(__aarch64__)
#define ORK_NF4OPT_NEON 1
#include <arm_neon.h>
/* NEON: AVX2's binary search, the tables read by tbl (byte index 4 k + 0..3 of float k) */
static const float MID_QN[4] = {MIDK(1, 2), MIDK(5, 6), MIDK(9, 10), MIDK(13, 14)};
static const float MID_EN[8] = {MIDK(0, 1), MIDK(2, 3), MIDK(4, 5), MIDK(6, 7),
                                MIDK(8, 9), MIDK(10, 11), MIDK(12, 13), MIDK(14, 15)};
typedef struct { uint8x16_t q; uint8x16x2_t e; uint8x16x4_t cb; } tabsn;
AI tabsn tabsn_load(void) {
    tabsn t;
    t.q = vld1q_u8((const uint8_t *)MID_QN);
    t.e.val[0] = vld1q_u8((const uint8_t *)MID_EN);
    t.e.val[1] = vld1q_u8((const uint8_t *)MID_EN + 16);
    for (int k = 0; k < 4; k++) t.cb.val[k] = vld1q_u8((const uint8_t *)CB + 16 * k);
    return t;
}
AI float32x4_t lv4(float32x4_t s, uint32x4_t *code, const tabsn *t) {
    const uint32x4_t bytes = vdupq_n_u32(0x03020100u);
    const uint32x4_t m8 = vcgtq_f32(s, vdupq_n_f32(MID[7]));
    uint32x4_t pos = vandq_u32(m8, vdupq_n_u32(8));
    const float32x4_t t4 = vbslq_f32(m8, vdupq_n_f32(MID[11]), vdupq_n_f32(MID[3]));
    pos = vsubq_u32(pos, vshlq_n_u32(vcgtq_f32(s, t4), 2));
    /* pos is 0, 4, 8 or 12: float pos / 4 at bytes pos .. pos + 3 */
    const float32x4_t t2 = vreinterpretq_f32_u8(vqtbl1q_u8(t->q, vreinterpretq_u8_u32(vmlaq_n_u32(bytes, pos, 0x01010101u))));
    pos = vsubq_u32(pos, vshlq_n_u32(vcgtq_f32(s, t2), 1));
    /* pos is even: float pos / 2 at bytes 2 pos .. 2 pos + 3 */
    const float32x4_t t1 = vreinterpretq_f32_u8(vqtbl2q_u8(t->e, vreinterpretq_u8_u32(vmlaq_n_u32(bytes, pos, 0x02020202u))));
    pos = vsubq_u32(pos, vcgtq_f32(s, t1));
    *code = pos;
    return vreinterpretq_f32_u8(vqtbl4q_u8(t->cb, vreinterpretq_u8_u32(vmlaq_n_u32(bytes, pos, 0x04040404u))));
}
AI vf4 lv_neon(vf4 s, vi4 *code, const tabsn *t) {
    uint32x4_t c;
    const float32x4_t q = lv4((float32x4_t)s, &c, t);
    *code = (vi4)c;
    return (vf4)q;
}
#undef W
#undef vf
#undef vi
#undef vu
#undef vfh
#undef vih
#undef vdn
#undef vln
#define W 4
#define vf vf4
#define vi vi4
#define vu vu4
#define vfh vfh2
#define vih vih2
#define vdn vdn2
#define vln vln2
#define SUF neon
#define ATTR
#define LV_SETUP const tabsn tb = tabsn_load();
#define LEVELS(s, c) lv_neon(s, c, &tb)
#include "nf4opt_body.inc"
#undef SUF
#undef ATTR
#undef LV_SETUP
#undef LEVELS
#endif

enum { LV_PORTABLE, LV_AVX2, LV_AVX512, LV_NEON };

/* the level of this call: x86 follows ork_codecs_isa() (the bin tables must be valid for AVX-512) */
static int level(void) {
#ifdef ORK_NF4OPT_X86
    const int isa = ork_codecs_isa();
    if (isa == ORK_ISA_AVX512 && ork_nf4_bin_tables(&BIN_MID, &BIN_BASE) == 1) {
        wtabs_init();
        return LV_AVX512;
    }
    if (isa >= ORK_ISA_AVX2) return LV_AVX2;
#endif
#ifdef ORK_NF4OPT_NEON
    return LV_NEON;
#endif
    return LV_PORTABLE;
}

int ork_nf4opt_level(void) { return level(); }

int ork_nf4opt_lookups(int lv, const float *s, int64_t n, float *q, float *qc, float *qq, float *qn1, float *qp,
                       float *qn) {
    float *const out[6] = {q, qc, qq, qn1, qp, qn};
    (void)level(); /* the tables built */
    switch (lv) {
#ifdef ORK_NF4OPT_X86
    case LV_AVX512:
        if (level() != LV_AVX512 || wtabs_ok != 1) return -1;
        lookups_avx512(s, n, out);
        return 0;
    case LV_AVX2:
        if (level() < LV_AVX2) return -1;
        lookups_avx2(s, n, out);
        return 0;
#endif
#ifdef ORK_NF4OPT_NEON
    case LV_NEON: lookups_neon(s, n, out); return 0;
#endif
    case LV_PORTABLE: lookups_portable(s, n, out); return 0;
    default: return -1;
    }
}

static void group_run(int lv, const float (*x)[G], const double (*w)[G], const int *tail, int blk, int tries,
                      uint8_t (*cs)[G], float *dout) {
    switch (lv) {
#ifdef ORK_NF4OPT_X86
    case LV_AVX512: group_avx512(x, w, tail, blk, tries, cs, dout); break;
    case LV_AVX2: group_avx2(x, w, tail, blk, tries, cs, dout); break;
#endif
#ifdef ORK_NF4OPT_NEON
    case LV_NEON: group_neon(x, w, tail, blk, tries, cs, dout); break;
#endif
    default: group_portable(x, w, tail, blk, tries, cs, dout); break;
    }
}

static void dq_run(int lv, const float (*x)[G], const double (*w)[G], const int *q0, const float *sc, float off,
                   const float *dq, uint8_t (*pk)[DQB / 2], int *qout, double *ax, double *ae) {
#define xv x
#define wv w
    switch (lv) {
#ifdef ORK_NF4OPT_X86
    case LV_AVX512: dq_avx512(xv, wv, q0, sc, off, dq, pk, qout, ax, ae); break;
    case LV_AVX2: dq_avx2(xv, wv, q0, sc, off, dq, pk, qout, ax, ae); break;
#endif
#ifdef ORK_NF4OPT_NEON
    case LV_NEON: dq_neon(xv, wv, q0, sc, off, dq, pk, qout, ax, ae); break;
#endif
    default: dq_portable(xv, wv, q0, sc, off, dq, pk, qout, ax, ae); break;
    }
#undef xv
#undef wv
}

static void group32u_run(int lv, const float (*x)[G], float *dout) {
    switch (lv) {
#ifdef ORK_NF4OPT_X86
    case LV_AVX512:
        if (wtabs_ok == 1) {
            group32u_avx512(x, dout);
            break;
        }
        /* fall through: no valid wide bins, the AVX2 body (the same bytes) */
    case LV_AVX2: group32u_avx2(x, dout); break;
#endif
#ifdef ORK_NF4OPT_NEON
    case LV_NEON: group32u_neon(x, dout); break;
#endif
    default: group32u_portable(x, dout); break;
    }
}

static void dq32u_run(int lv, const float (*x)[G], const int *q0, const float *sc, const float (*dqv)[G], float off,
                      int32_t (*pk)[G], int *qout, double *ax, double *ae) {
    switch (lv) {
#ifdef ORK_NF4OPT_X86
    case LV_AVX512:
        if (wtabs_ok == 1) {
            dq32u_avx512(x, q0, sc, dqv, off, pk, qout, ax, ae);
            break;
        }
        /* fall through */
    case LV_AVX2: dq32u_avx2(x, q0, sc, dqv, off, pk, qout, ax, ae); break;
#endif
#ifdef ORK_NF4OPT_NEON
    case LV_NEON: dq32u_neon(x, q0, sc, dqv, off, pk, qout, ax, ae); break;
#endif
    default: dq32u_portable(x, q0, sc, dqv, off, pk, qout, ax, ae); break;
    }
}

#ifdef ORK_NF4OPT_X86
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

#endif

#ifdef ORK_NF4OPT_X86
/* 16 full blocks of 32 from element off0 of the source, widened (exact), non-finite values as 0 (counted), transposed
 * to x[i][b]: the values gather_group + load_x give, without the staging buffers */
AI T512 __m512 san512(__m512 v, int64_t *nf) {
    const __m512i e = _mm512_set1_epi32(0x7f800000);
    const __mmask16 bad = _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), e), e);
    *nf += __builtin_popcount((unsigned)bad);
    return _mm512_maskz_mov_ps((__mmask16)~bad, v);
}
/* The 16-bit sources: the 16 blocks (one a register, 32 words) transposed as words, then widened. Four rounds each
 * swap a bit of the register index (the block's) with a bit of the word index (the element's): after them register
 * k holds elements 2k and 2k + 1 of every block, word 2b + (i & 1) of it element i of block b, so element 2k is
 * (word << 16) of each dword and element 2k + 1 its high word (bf16: a float's high half; f16: converted). The
 * round on word bit 1 is qword shifts and blends (no shuffle port), the others word permutes. Non-finite values
 * are found as words (the exponent all ones), counted and zeroed before (zero words widen to +0.0f, as san512). */
/* round k's word indices (p = 2^(k + 1)): the low register of a pair takes its words l without bit p and the high
 * one's words l - p; the high register the low one's l + p and its own l with bit p */
static const int16_t WSWAP_IDX[3][2][32] = {
    {{0, 1, 2, 3, 32, 33, 34, 35, 8, 9, 10, 11, 40, 41, 42, 43,
      16, 17, 18, 19, 48, 49, 50, 51, 24, 25, 26, 27, 56, 57, 58, 59},
     {4, 5, 6, 7, 36, 37, 38, 39, 12, 13, 14, 15, 44, 45, 46, 47,
      20, 21, 22, 23, 52, 53, 54, 55, 28, 29, 30, 31, 60, 61, 62, 63}},
    {{0, 1, 2, 3, 4, 5, 6, 7, 32, 33, 34, 35, 36, 37, 38, 39,
      16, 17, 18, 19, 20, 21, 22, 23, 48, 49, 50, 51, 52, 53, 54, 55},
     {8, 9, 10, 11, 12, 13, 14, 15, 40, 41, 42, 43, 44, 45, 46, 47,
      24, 25, 26, 27, 28, 29, 30, 31, 56, 57, 58, 59, 60, 61, 62, 63}},
    {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
      32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47},
     {16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
      48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63}}};
AI T512 void wswap(__m512i *r, int k, __m512i ia, __m512i ib) {
    for (int a = 0; a < 16; a++) {
        if (a & (1 << k)) continue;
        const int b = a | (1 << k);
        const __m512i A = r[a], B = r[b];
        r[a] = _mm512_permutex2var_epi16(A, ia, B);
        r[b] = _mm512_permutex2var_epi16(A, ib, B);
    }
}
T512 static int64_t load_src512_16(const uint16_t *src, int bf16, float (*xr)[G]) {
    __m512i r[16];
    const __m512i e = _mm512_set1_epi16(bf16 ? 0x7f80 : 0x7c00);
    __mmask32 bad = 0;
    for (int b = 0; b < G; b++) {
        r[b] = _mm512_loadu_si512(src + (int64_t)b * DQB);
        bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(r[b], e), e);
    }
    int64_t nf = 0;
    if (bad)
        for (int b = 0; b < G; b++) {
            const __mmask32 m = _mm512_cmpeq_epi16_mask(_mm512_and_si512(r[b], e), e);
            nf += __builtin_popcount((unsigned)m);
            r[b] = _mm512_maskz_mov_epi16(~m, r[b]);
        }
    /* round 0: register bit 0 <-> word bit 1 (words 2, 3 of each qword) */
    for (int a = 0; a < 16; a += 2) {
        const __m512i A = r[a], B = r[a + 1];
        r[a] = _mm512_mask_blend_epi16(0xccccccccu, A, _mm512_slli_epi64(B, 32));
        r[a + 1] = _mm512_mask_blend_epi16(0xccccccccu, _mm512_srli_epi64(A, 32), B);
    }
    /* rounds 1..3: register bit k <-> word bit k + 1 */
    for (int k = 1; k < 4; k++)
        wswap(r, k, _mm512_loadu_si512(WSWAP_IDX[k - 1][0]), _mm512_loadu_si512(WSWAP_IDX[k - 1][1]));
    for (int k = 0; k < 16; k++) {
        __m512 lo, hi;
        if (bf16) {
            lo = _mm512_castsi512_ps(_mm512_slli_epi32(r[k], 16));
            hi = _mm512_castsi512_ps(_mm512_and_si512(r[k], _mm512_set1_epi32((int)0xffff0000u)));
        } else {
            lo = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(r[k]));
            hi = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(r[k], 16)));
        }
        _mm512_storeu_ps(xr[2 * k], lo);
        _mm512_storeu_ps(xr[2 * k + 1], hi);
    }
    return nf;
}
T512 static int64_t load_src512(const void *x, int dtype, int64_t off0, float (*xr)[G]) {
    __m512 lo[16], hi[16];
    int64_t nf = 0;
    if (dtype != ORK_DT_F32) return load_src512_16((const uint16_t *)x + off0, dtype == ORK_DT_BF16, xr);
    for (int b = 0; b < G; b++) {
        const int64_t o = off0 + (int64_t)b * DQB;
        __m512 a, c;
        if (dtype == ORK_DT_F32) {
            a = _mm512_loadu_ps((const float *)x + o);
            c = _mm512_loadu_ps((const float *)x + o + 16);
        } else {
            const __m512i v = _mm512_loadu_si512((const uint16_t *)x + o);
            const __m256i v0 = _mm512_castsi512_si256(v), v1 = _mm512_extracti64x4_epi64(v, 1);
            if (dtype == ORK_DT_BF16) {
                a = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v0), 16));
                c = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v1), 16));
            } else {
                a = _mm512_cvtph_ps(v0);
                c = _mm512_cvtph_ps(v1);
            }
        }
        lo[b] = san512(a, &nf);
        hi[b] = san512(c, &nf);
    }
    transpose16x16_f32(lo);
    transpose16x16_f32(hi);
    for (int i = 0; i < 16; i++) {
        _mm512_storeu_ps(xr[i], lo[i]);
        _mm512_storeu_ps(xr[16 + i], hi[i]);
    }
    return nf;
}
#endif

#ifdef ORK_NF4OPT_X86
/* AVX2 (+F16C, as ork_codecs_isa's AVX2 level): the same values in 8 x 8 tiles (8 rows of 8 elements widened,
 * non-finite values counted and zeroed as floats, the tile transposed by unpacks, shuffles and lane swaps),
 * not the generic path's widen, sanitize and scalar transpose over staging buffers (12% of the AVX2 encode) */
#define T256F __attribute__((target("avx2,f16c")))
AI T256F void transpose8x8_f32(__m256 *r) {
    __m256 t[8], u[8];
    for (int k = 0; k < 4; k++) {
        t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for (int h = 0; h < 2; h++) {
        u[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
        u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xee);
        u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xee);
    }
    for (int k = 0; k < 4; k++) {
        r[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
        r[4 + k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
    }
}
T256F static int64_t load_src256(const void *x, int dtype, int64_t off0, float (*xr)[G]) {
    const __m256i e = _mm256_set1_epi32(0x7f800000);
    int64_t nf = 0;
    for (int b0 = 0; b0 < G; b0 += 8)
        for (int i0 = 0; i0 < DQB; i0 += 8) {
            __m256 r[8];
            for (int k = 0; k < 8; k++) {
                const int64_t o = off0 + (int64_t)(b0 + k) * DQB + i0;
                __m256 v;
                if (dtype == ORK_DT_F32) {
                    v = _mm256_loadu_ps((const float *)x + o);
                } else {
                    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)x + o));
                    v = dtype == ORK_DT_BF16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                                             : _mm256_cvtph_ps(h);
                }
                const __m256 bad = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), e), e));
                nf += __builtin_popcount((unsigned)_mm256_movemask_ps(bad));
                r[k] = _mm256_andnot_ps(bad, v);
            }
            transpose8x8_f32(r);
            for (int k = 0; k < 8; k++) _mm256_storeu_ps(&xr[i0 + k][b0], r[k]);
        }
    return nf;
}
#endif

/* The generic levels' bf16 and f32 sources: widened (bf16: the high half of a float), sanitized (non-finite as +0.0,
 * counted) and transposed in 4 x 4 tiles of lane-wise vectors in one pass (not ork_widen, a sanitize pass and a scalar
 * transpose over a staging buffer: 10% of the portable encode) */
#if defined(__clang__)
#define SHUF4(a, b, i0, i1, i2, i3) __builtin_shufflevector(a, b, i0, i1, i2, i3)
#else
#define SHUF4(a, b, i0, i1, i2, i3) __builtin_shuffle(a, b, (vu4){i0, i1, i2, i3})
#endif
typedef uint16_t vw4 __attribute__((vector_size(8)));
static int64_t load_src_bits(const void *x, int dtype, int64_t off0, float (*xr)[G]) {
    vu4 nbad = {0, 0, 0, 0};
    for (int b0 = 0; b0 < G; b0 += 4)
        for (int i0 = 0; i0 < DQB; i0 += 4) {
            vu4 r[4];
            for (int k = 0; k < 4; k++) {
                const int64_t o = off0 + (int64_t)(b0 + k) * DQB + i0;
                vu4 u;
                if (dtype == ORK_DT_BF16) {
                    vw4 h;
                    memcpy(&h, (const uint16_t *)x + o, sizeof h);
                    u = __builtin_convertvector(h, vu4) << 16;
                } else {
                    memcpy(&u, (const float *)x + o, sizeof u);
                }
                const vu4 bad = (vu4)((u & 0x7f800000u) == 0x7f800000u);
                nbad -= bad;
                r[k] = u & ~bad;
            }
            const vu4 t0 = SHUF4(r[0], r[1], 0, 4, 1, 5), t1 = SHUF4(r[0], r[1], 2, 6, 3, 7);
            const vu4 t2 = SHUF4(r[2], r[3], 0, 4, 1, 5), t3 = SHUF4(r[2], r[3], 2, 6, 3, 7);
            const vu4 o[4] = {SHUF4(t0, t2, 0, 1, 4, 5), SHUF4(t0, t2, 2, 3, 6, 7), SHUF4(t1, t3, 0, 1, 4, 5),
                              SHUF4(t1, t3, 2, 3, 6, 7)};
            for (int j = 0; j < 4; j++) memcpy(&xr[i0 + j][b0], &o[j], sizeof o[j]);
        }
    return (int64_t)nbad[0] + nbad[1] + nbad[2] + nbad[3];
}

static int64_t load_src_x(int lv, const void *x, int dtype, int64_t off0, float *xb, float (*xr)[G]) {
#ifdef ORK_NF4OPT_X86
    if (lv == LV_AVX512 && (dtype == ORK_DT_F32 || dtype == ORK_DT_BF16 || dtype == ORK_DT_F16))
        return load_src512(x, dtype, off0, xr);
    if (lv == LV_AVX2 && (dtype == ORK_DT_F32 || dtype == ORK_DT_BF16 || dtype == ORK_DT_F16))
        return load_src256(x, dtype, off0, xr);
#endif
    (void)lv;
    if (dtype == ORK_DT_F32 || dtype == ORK_DT_BF16) return load_src_bits(x, dtype, off0, xr);
    const int esz = dtype == ORK_DT_F32 ? 4 : 2;
    const int64_t nf = ork_widen((const char *)x + off0 * esz, dtype, (int64_t)G * DQB, xb);
    for (int i = 0; i < G * DQB; i++) xb[i] = (f2u(xb[i]) & 0x7f800000u) == 0x7f800000u ? 0.0f : xb[i];
    for (int b = 0; b < G; b++)
        for (int i = 0; i < DQB; i++) xr[i][b] = xb[b * DQB + i];
    return nf;
}

/* q0 of 16 blocks (ork_nf4dq_encode's per-block rule), AVX-512: dq_nearest's binary search, each step's
 * midpoints mid[pos + step - 1] (pos a multiple of 2 step) read from registers: lv (dq_levels) holds them level by
 * level, step 128 first (1 value, then 2, 4, .., 128), so the step's value is lv[base + pos / (2 step)], a lookup in
 * 128 / step entries (a permute of 16 or 32, or 2 and 4 of 32 with blends) instead of a gather. */
#ifdef ORK_NF4OPT_X86
AI T512 __m512 lv_lookup(const float *t, int n, __m512i idx) {
    if (n <= 16) return _mm512_permutexvar_ps(idx, _mm512_loadu_ps(t));
    __m512 c[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()}; /* n is 32, 64 or 128: no read of an unset one (GCC cannot see it) */
    for (int k = 0; k < n / 32; k++)
        c[k] = _mm512_permutex2var_ps(_mm512_loadu_ps(t + 32 * k), idx, _mm512_loadu_ps(t + 32 * k + 16));
    if (n == 32) return c[0];
    const __mmask16 b5 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(32));
    const __m512 lo = _mm512_mask_mov_ps(c[0], b5, c[1]);
    if (n == 64) return lo;
    const __m512 hi = _mm512_mask_mov_ps(c[2], b5, c[3]);
    return _mm512_mask_mov_ps(lo, _mm512_test_epi32_mask(idx, _mm512_set1_epi32(64)), hi);
}
T512 static void q0_512(const float *dg, const float *sc, float off, const float *lv, int *q0) {
    const __m512 s = _mm512_loadu_ps(sc);
    const __m512 r = _mm512_sub_ps(_mm512_loadu_ps(dg), _mm512_set1_ps(off));
    const __mmask16 sp = _mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_GT_OQ);
    const __m512 v = _mm512_maskz_div_ps(sp, r, _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), sp, s));
    __m512i pos = _mm512_setzero_si512();
    int base = 0, lg = 8;
    for (int step = 128, n = 1; step; step >>= 1, n <<= 1, lg--) {
        const __m512 t = n == 1 ? _mm512_set1_ps(lv[0]) : lv_lookup(lv + base, n, _mm512_srli_epi32(pos, lg));
        pos = _mm512_mask_add_epi32(pos, _mm512_cmp_ps_mask(t, v, _CMP_LT_OQ), pos, _mm512_set1_epi32(step));
        base += n;
    }
    pos = _mm512_mask_mov_epi32(pos, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(255));
    _mm512_storeu_si512(q0, pos);
}
#endif

/* the packed codes of 16 blocks: pp[i][b] (the byte i of block b, as int32) to pk[b][i] */
static void pack_t(const int32_t (*pp)[G], uint8_t (*pk)[DQB / 2]) {
#if defined(__x86_64__) || defined(__SSE2__)
    __m128i r[16];
    for (int i = 0; i < 16; i++) {
        const __m128i a = _mm_packs_epi32(_mm_loadu_si128((const __m128i *)pp[i]), _mm_loadu_si128((const __m128i *)(pp[i] + 4)));
        const __m128i c = _mm_packs_epi32(_mm_loadu_si128((const __m128i *)(pp[i] + 8)), _mm_loadu_si128((const __m128i *)(pp[i] + 12)));
        r[i] = _mm_packus_epi16(a, c);
    }
    /* 16 x 16 bytes: four rounds of interleaving rows j and j + 8 (a perfect shuffle each round) */
    for (int round = 0; round < 4; round++) {
        __m128i t[16];
        for (int j = 0; j < 8; j++) {
            t[2 * j] = _mm_unpacklo_epi8(r[j], r[j + 8]);
            t[2 * j + 1] = _mm_unpackhi_epi8(r[j], r[j + 8]);
        }
        for (int j = 0; j < 16; j++) r[j] = t[j];
    }
    for (int b = 0; b < 16; b++) _mm_storeu_si128((__m128i *)pk[b], r[b]);
#else
    for (int b = 0; b < G; b++)
        for (int i = 0; i < DQB / 2; i++) pk[b][i] = (uint8_t)pp[i][b];
#endif
}

/* unit weights: no column weights and the plain weighting (every w is 1) */
#define UNIT(col_w, weighting) ((col_w) == NULL && (weighting) == ORK_NF4W_PLAIN)

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
    const int lv = level();
    const int blk = block == 32 ? 32 : 64;
    ORK_ALIGN64 double ax[16], ae[16];
    for (int l = 0; l < 16; l++) ax[l] = ae[l] = 0.0;
    int64_t nf = 0;
    float xb[G * BLKMAX], cwb[G * BLKMAX], dout[G];
    ORK_ALIGN64 float xr[BLKMAX][G]; /* [i][b]: element i of block b */
    ORK_ALIGN64 double wr[BLKMAX][G];
    uint8_t cs[BLKMAX][G];
    int tail[G];
    for (int64_t g0 = b0; g0 < b1; g0 += G) {
        const int nb = (int)(b1 - g0 < G ? b1 - g0 : G);
        const int64_t off0 = g0 * blk;
        if (blk == DQB && tries == 1 && !codes && UNIT(col_w, weighting) && nb == G && off0 + G * DQB <= n) {
            nf += load_src_x(lv, x, dtype, off0, xb, xr);
            group32u_run(lv, (const float (*)[G])xr, absmax + g0);
            continue;
        }
        nf += gather_group(x, dtype, n, k, col_w, blk, g0, nb, xb, cwb);
        for (int b = 0; b < G; b++) tail[b] = b < nb && off0 + (int64_t)(b + 1) * blk > n;
#ifdef ORK_NF4OPT_X86
        if (lv == LV_AVX512) load_group512(xb, cwb, weighting, blk, xr, wr);
        else
#endif
            load_group(xb, cwb, weighting, nb, blk, xr, wr);
        group_run(lv, (const float (*)[G])xr, (const double (*)[G])wr, tail, blk, tries, codes ? cs : 0, dout);
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

/* dq_nearest's midpoints by binary-search level (q0_512): the level of step s holds mid[2 s k + s - 1], k < 128 / s */
static void dq_levels(const float *mid, float *lv) {
    int base = 0;
    for (int step = 128; step; step >>= 1) {
        for (int k = 0; k < 128 / step; k++) lv[base + k] = mid[2 * step * k + step - 1];
        base += 128 / step;
    }
    for (int i = base; i < 256 + 16; i++) lv[i] = 0.0f; /* the 16-float loads of the small levels read past them */
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

int ork_nf4dq_q0s(int lv, const float *v, int64_t n, int *q0) {
    float dq[256], mid[255], lvm[256 + 16];
    dq_tables(dq, mid);
    dq_levels(mid, lvm);
    if (lv < 0 || lv > LV_NEON || (lv == LV_AVX512 && level() != LV_AVX512)) return -1;
    const float one[G] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    for (int64_t e0 = 0; e0 < n; e0 += G) {
        const int m = n - e0 < G ? (int)(n - e0) : G;
        float vb[G] = {0};
        int qb[G];
        memcpy(vb, v + e0, (size_t)m * sizeof(float));
#ifdef ORK_NF4OPT_X86
        if (lv == LV_AVX512) q0_512(vb, one, 0.0f, lvm, qb);
        else
#endif
            for (int b = 0; b < G; b++) qb[b] = dq_nearest(mid, one[b] > 0.0f ? (vb[b] - 0.0f) / one[b] : 0.0f);
        memcpy(q0 + e0, qb, (size_t)m * sizeof(int));
    }
    return 0;
}

void ork_nf4dq_encode(const void *x, int dtype, int64_t n, int64_t k, const float *col_w, int weighting,
                      const float *d, const float *scale, float offset, int64_t b0, int64_t b1, uint8_t *codes,
                      uint8_t *absmax_q, ork_codec_stats *st) {
    const int lv = level();
    float dq[256], mid[255], lvm[256 + 16];
    dq_tables(dq, mid);
    dq_levels(mid, lvm);
    ORK_ALIGN64 double ax[16], ae[16];
    for (int l = 0; l < 16; l++) ax[l] = ae[l] = 0.0;
    int64_t nf = 0;
    float xb[G * DQB], cwb[G * DQB];
    ORK_ALIGN64 float xr[DQB][G];
    ORK_ALIGN64 double wr[DQB][G];
    uint8_t pk[G][DQB / 2];
    ORK_ALIGN64 int32_t pp[DQB / 2][G];
    int q0[G], qo[G];
    float sc[G];
    ORK_ALIGN64 float dqv[NCAND][G];
    for (int64_t g0 = b0; g0 < b1; g0 += G) {
        const int nb = (int)(b1 - g0 < G ? b1 - g0 : G);
        const int fast = UNIT(col_w, weighting) && nb == G && (g0 + G) * DQB <= n;
        if (fast) {
            nf += load_src_x(lv, x, dtype, g0 * DQB, xb, xr);
            for (int b = 0; b < G; b++) sc[b] = scale[(g0 + b) / ORK_NF4DQ_GROUP];
#ifdef ORK_NF4OPT_X86
            if (lv == LV_AVX512) q0_512(d + g0, sc, offset, lvm, q0);
            else
#endif
                for (int b = 0; b < G; b++) {
                    const float r = d[g0 + b] - offset;
                    q0[b] = dq_nearest(mid, sc[b] > 0.0f ? r / sc[b] : 0.0f);
                }
            for (int t = 0; t < NCAND; t++)
                for (int b = 0; b < G; b++) {
                    const int qq = q0[b] + NF4DQ_CAND[t];
                    dqv[t][b] = dq[qq < 0 ? 0 : (qq > 255 ? 255 : qq)];
                }
            dq32u_run(lv, (const float (*)[G])xr, q0, sc, (const float (*)[G])dqv, offset, pp, qo, ax, ae);
            pack_t((const int32_t (*)[G])pp, pk);
        } else {
            nf += gather_group(x, dtype, n, k, col_w, DQB, g0, nb, xb, cwb);
#ifdef ORK_NF4OPT_X86
            if (lv == LV_AVX512) load_group512(xb, cwb, weighting, DQB, xr, wr);
            else
#endif
                load_group(xb, cwb, weighting, nb, DQB, xr, wr);
            for (int b = 0; b < G; b++) {
                sc[b] = b < nb ? scale[(g0 + b) / ORK_NF4DQ_GROUP] : 0.0f;
                const float r = (b < nb ? d[g0 + b] : 0.0f) - offset;
                const float v = sc[b] > 0.0f ? r / sc[b] : 0.0f; /* past the end: 0, the code 127 */
                q0[b] = dq_nearest(mid, v);
            }
            dq_run(lv, (const float (*)[G])xr, (const double (*)[G])wr, q0, sc, offset, dq, pk, qo, ax, ae);
        }
        for (int b = 0; b < nb; b++) {
            const int64_t off = (g0 + b) * DQB;
            absmax_q[g0 + b] = (uint8_t)qo[b];
            const int len = (int)(n - off < DQB ? n - off : DQB);
            if (len == DQB) memcpy(codes + off / 2, pk[b], DQB / 2);
            else {
                memcpy(codes + off / 2, pk[b], (size_t)((len + 1) / 2));
                /* odd n: the last byte's low nibble is the padding, code 7 as the reference writes it (the padding
                 * element's own code is 0 when no candidate is ever taken, e.g. an error of +inf) */
                if (len & 1) codes[off / 2 + len / 2] = (uint8_t)((pk[b][len / 2] & 0xf0) | 7);
            }
        }
    }
    if (st) fold_stats(ax, ae, nf, st);
}
