/* Exact int8 x int8 matmul, rescaled in float32 (i8gemm.h). The integer sums are exact on every path (int32,
 * K <= ORK_I8GEMM_MAX_K), so the paths differ only in speed, never in a bit; the rescale is one float32
 * conversion and two float32 multiplies, left to right, as numpy's reference does them
 * (orkpack/eval/numerics.py _int8_matmul_f64; -ffp-contract=off keeps them apart).
 *
 * AVX-512 VNNI: vpdpbusd multiplies unsigned by signed bytes, so x is taken as x + 128 (x ^ 0x80) and
 * 128 * sum_k w[n][k] is taken off afterwards; int32 wraps modulo 2^32, and the true sum fits, so the result
 * is exact. w is packed per 16 columns as [K/4][16][4] bytes. AVX2: bytes widened to int16, vpmaddwd
 * (pairs of int16 products summed into int32, exact); w packed per 8 columns as [K/2][8][2] int16. */
#include "i8gemm.h"
#include "codecs.h"

#include <stdlib.h>
#include <string.h>

static void rescale_row(const int32_t *acc, float sxm, const float *sw, int64_t n0, int64_t n1, float *out) {
    for (int64_t n = n0; n < n1; n++) {
        float a = (float)acc[n - n0];
        a = a * sxm;
        out[n] = a * sw[n];
    }
}

static void portable(const int8_t *x, const float *sx, int64_t M, const int8_t *w, const float *sw, int64_t N,
                     int64_t K, float *out) {
    int32_t acc[64];
    for (int64_t n0 = 0; n0 < N; n0 += 64) {
        const int64_t n1 = n0 + 64 < N ? n0 + 64 : N;
        for (int64_t m = 0; m < M; m++) {
            const int8_t *xm = x + m * K;
            for (int64_t n = n0; n < n1; n++) {
                const int8_t *wn = w + n * K;
                int32_t s = 0;
                for (int64_t k = 0; k < K; k++) s += (int32_t)xm[k] * (int32_t)wn[k];
                acc[n - n0] = s;
            }
            rescale_row(acc, sx[m], sw, n0, n1, out + m * N);
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(ORK_NO_X86_SIMD)
#define I8_HAVE_X86 1
#include <immintrin.h>

#define TVNNI __attribute__((target("avx512f,avx512bw,avx512vnni,avx2")))
#define TAVX2 __attribute__((target("avx2")))

/* rows of x per micro-kernel */
#define MR 4

TVNNI static int vnni(const int8_t *x, const float *sx, int64_t M, const int8_t *w, const float *sw, int64_t N,
                      int64_t K, float *out) {
    const int64_t K4 = (K + 3) / 4, NB = (N + 31) / 32 * 2; /* blocks of 16 columns, in pairs */
    uint8_t *wp = aligned_alloc(64, (size_t)(NB * K4 * 64));
    const size_t xbytes = (size_t)(((M + MR) * K4 * 4 + 63) / 64 * 64);
    uint8_t *xu = aligned_alloc(64, xbytes);
    int32_t *wsum = calloc((size_t)(NB * 16), sizeof(int32_t));
    if (!wp || !xu || !wsum) {
        free(wp); free(xu); free(wsum);
        return -1;
    }
    memset(wp, 0, (size_t)(NB * K4 * 64));
    for (int64_t n = 0; n < N; n++) {
        const int8_t *wn = w + n * K;
        uint8_t *blk = wp + (n / 16) * K4 * 64 + (n % 16) * 4;
        int32_t s = 0;
        for (int64_t k = 0; k < K; k++) {
            blk[(k / 4) * 64 + (k % 4)] = (uint8_t)wn[k];
            s += wn[k];
        }
        wsum[n] = s * 128;
    }
    memset(xu, 0x80, xbytes); /* padding: x = 0, w = 0 there */
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) xu[m * K4 * 4 + k] = (uint8_t)(x[m * K + k] ^ 0x80);
    int32_t acc[MR][32] __attribute__((aligned(64)));
    for (int64_t nb = 0; nb < NB; nb += 2) {
        const uint8_t *b0 = wp + nb * K4 * 64, *b1 = b0 + K4 * 64;
        const int64_t n0 = nb * 16, n1 = n0 + 32 < N ? n0 + 32 : N;
        const __m512i s0 = _mm512_loadu_si512((const void *)(wsum + n0));
        const __m512i s1 = _mm512_loadu_si512((const void *)(wsum + n0 + 16));
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
            __m512i c00 = _mm512_setzero_si512(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
                    c31 = c00;
            const uint8_t *a = xu + m0 * K4 * 4;
            const int64_t ra = K4 * 4;
            for (int64_t kg = 0; kg < K4; kg++) {
                const __m512i w0 = _mm512_load_si512((const void *)(b0 + kg * 64));
                const __m512i w1 = _mm512_load_si512((const void *)(b1 + kg * 64));
                int32_t v;
                memcpy(&v, a + kg * 4, 4);
                __m512i av = _mm512_set1_epi32(v);
                c00 = _mm512_dpbusd_epi32(c00, av, w0);
                c01 = _mm512_dpbusd_epi32(c01, av, w1);
                memcpy(&v, a + ra + kg * 4, 4);
                av = _mm512_set1_epi32(v);
                c10 = _mm512_dpbusd_epi32(c10, av, w0);
                c11 = _mm512_dpbusd_epi32(c11, av, w1);
                memcpy(&v, a + 2 * ra + kg * 4, 4);
                av = _mm512_set1_epi32(v);
                c20 = _mm512_dpbusd_epi32(c20, av, w0);
                c21 = _mm512_dpbusd_epi32(c21, av, w1);
                memcpy(&v, a + 3 * ra + kg * 4, 4);
                av = _mm512_set1_epi32(v);
                c30 = _mm512_dpbusd_epi32(c30, av, w0);
                c31 = _mm512_dpbusd_epi32(c31, av, w1);
            }
            _mm512_store_si512((void *)acc[0], _mm512_sub_epi32(c00, s0));
            _mm512_store_si512((void *)(acc[0] + 16), _mm512_sub_epi32(c01, s1));
            _mm512_store_si512((void *)acc[1], _mm512_sub_epi32(c10, s0));
            _mm512_store_si512((void *)(acc[1] + 16), _mm512_sub_epi32(c11, s1));
            _mm512_store_si512((void *)acc[2], _mm512_sub_epi32(c20, s0));
            _mm512_store_si512((void *)(acc[2] + 16), _mm512_sub_epi32(c21, s1));
            _mm512_store_si512((void *)acc[3], _mm512_sub_epi32(c30, s0));
            _mm512_store_si512((void *)(acc[3] + 16), _mm512_sub_epi32(c31, s1));
            for (int r = 0; r < MR && m0 + r < M; r++) rescale_row(acc[r], sx[m0 + r], sw, n0, n1, out + (m0 + r) * N);
        }
    }
    free(wp); free(xu); free(wsum);
    return 0;
}

TAVX2 static int avx2(const int8_t *x, const float *sx, int64_t M, const int8_t *w, const float *sw, int64_t N,
                      int64_t K, float *out) {
    const int64_t K2 = (K + 1) / 2, NB = (N + 15) / 16 * 2; /* blocks of 8 columns, in pairs */
    int16_t *wp = aligned_alloc(32, (size_t)(NB * K2 * 16) * sizeof(int16_t));
    const size_t xbytes = (size_t)(((M + MR) * K2 * 4 + 31) / 32 * 32);
    int16_t *xs = aligned_alloc(32, xbytes);
    if (!wp || !xs) {
        free(wp); free(xs);
        return -1;
    }
    memset(wp, 0, (size_t)(NB * K2 * 16) * sizeof(int16_t));
    for (int64_t n = 0; n < N; n++) {
        int16_t *blk = wp + (n / 8) * K2 * 16 + (n % 8) * 2;
        for (int64_t k = 0; k < K; k++) blk[(k / 2) * 16 + (k % 2)] = w[n * K + k];
    }
    memset(xs, 0, xbytes);
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) xs[m * K2 * 2 + k] = x[m * K + k];
    int32_t acc[MR][16] __attribute__((aligned(32)));
    for (int64_t nb = 0; nb < NB; nb += 2) {
        const int16_t *b0 = wp + nb * K2 * 16, *b1 = b0 + K2 * 16;
        const int64_t n0 = nb * 8, n1 = n0 + 16 < N ? n0 + 16 : N;
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
            __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
                    c31 = c00;
            const int16_t *a = xs + m0 * K2 * 2;
            const int64_t ra = K2 * 2;
            for (int64_t kp = 0; kp < K2; kp++) {
                const __m256i w0 = _mm256_load_si256((const __m256i *)(b0 + kp * 16));
                const __m256i w1 = _mm256_load_si256((const __m256i *)(b1 + kp * 16));
                int32_t v;
                memcpy(&v, a + kp * 2, 4);
                __m256i av = _mm256_set1_epi32(v);
                c00 = _mm256_add_epi32(c00, _mm256_madd_epi16(av, w0));
                c01 = _mm256_add_epi32(c01, _mm256_madd_epi16(av, w1));
                memcpy(&v, a + ra + kp * 2, 4);
                av = _mm256_set1_epi32(v);
                c10 = _mm256_add_epi32(c10, _mm256_madd_epi16(av, w0));
                c11 = _mm256_add_epi32(c11, _mm256_madd_epi16(av, w1));
                memcpy(&v, a + 2 * ra + kp * 2, 4);
                av = _mm256_set1_epi32(v);
                c20 = _mm256_add_epi32(c20, _mm256_madd_epi16(av, w0));
                c21 = _mm256_add_epi32(c21, _mm256_madd_epi16(av, w1));
                memcpy(&v, a + 3 * ra + kp * 2, 4);
                av = _mm256_set1_epi32(v);
                c30 = _mm256_add_epi32(c30, _mm256_madd_epi16(av, w0));
                c31 = _mm256_add_epi32(c31, _mm256_madd_epi16(av, w1));
            }
            _mm256_store_si256((__m256i *)acc[0], c00);
            _mm256_store_si256((__m256i *)(acc[0] + 8), c01);
            _mm256_store_si256((__m256i *)acc[1], c10);
            _mm256_store_si256((__m256i *)(acc[1] + 8), c11);
            _mm256_store_si256((__m256i *)acc[2], c20);
            _mm256_store_si256((__m256i *)(acc[2] + 8), c21);
            _mm256_store_si256((__m256i *)acc[3], c30);
            _mm256_store_si256((__m256i *)(acc[3] + 8), c31);
            for (int r = 0; r < MR && m0 + r < M; r++) rescale_row(acc[r], sx[m0 + r], sw, n0, n1, out + (m0 + r) * N);
        }
    }
    free(wp); free(xs);
    return 0;
}
#endif

int ork_i8_matmul_isa(void) {
    const int level = ork_codecs_isa();
#ifdef I8_HAVE_X86
    __builtin_cpu_init();
    if (level >= ORK_ISA_AVX512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vnni"))
        return 2;
    if (level >= ORK_ISA_AVX2 && __builtin_cpu_supports("avx2")) return 1;
#endif
    (void)level;
    return 0;
}

int ork_i8_matmul(const int8_t *x, const float *sx, int64_t M, const int8_t *w, const float *sw, int64_t N,
                  int64_t K, float *out) {
    if (K > ORK_I8GEMM_MAX_K || K < 0 || M < 0 || N < 0) return -1;
    if (M == 0 || N == 0) return 0;
#ifdef I8_HAVE_X86
    if (K > 0) {
        switch (ork_i8_matmul_isa()) {
        case 2: return vnni(x, sx, M, w, sw, N, K, out);
        case 1: return avx2(x, sx, M, w, sw, N, K, out);
        default: break;
        }
    }
#endif
    portable(x, sx, M, w, sw, N, K, out);
    return 0;
}
