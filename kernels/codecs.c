/* codecs.c: NF4 / int8 encoders and decoders, NPU int8 tiling. See codecs.h.
 *
 * Arithmetic mirrors orkpack/codecs/reference.py operation for operation, in
 * float32, with no fused multiply-add (built with -ffp-contract=off):
 *   NF4 full block : s = x * (1.0f / max(amax, 1e-38f));   stored absmax = amax
 *   NF4 tail block : s = x / max(amax, 1e-38f);            stored absmax = max(amax, 1e-38f)
 *   NF4 code       : number of float32 midpoints strictly below s
 *   int8           : v = x * inv, clamped to [-127, 127], rounded half to even by
 *                    (v + 1.5*2^23) - 1.5*2^23 (exact for |v| <= 2^22)
 * The kernel bodies are written once (always_inline, dtype a compile-time
 * constant at each call site) and compiled per SIMD level.
 */
#include "codecs.h"

#include <float.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))
#define LANES 16
#define NF4_BLOCK 64
#define RUN 32 /* int8: columns handled at a time (= the NPU tile width) */

#define CB_0 (-1.0f)
#define CB_1 (-0.6961928009986877f)
#define CB_2 (-0.5250730514526367f)
#define CB_3 (-0.39491748809814453f)
#define CB_4 (-0.28444138169288635f)
#define CB_5 (-0.18477343022823334f)
#define CB_6 (-0.09105003625154495f)
#define CB_7 0.0f
#define CB_8 0.07958029955625534f
#define CB_9 0.16093020141124725f
#define CB_10 0.24611230194568634f
#define CB_11 0.33791524171829224f
#define CB_12 0.44070982933044434f
#define CB_13 0.5626170039176941f
#define CB_14 0.7229568362236023f
#define CB_15 1.0f
static const float CB[16] = {CB_0, CB_1, CB_2, CB_3, CB_4, CB_5, CB_6, CB_7,
                             CB_8, CB_9, CB_10, CB_11, CB_12, CB_13, CB_14, CB_15};

/* float32 (CB[i] + CB[i+1]) / 2: a float32 add and an exact halving, folded by the
 * compiler in float32 (as torch computes its bucketize bounds) */
#define MIDK(i, j) ((CB_##i + CB_##j) / 2.0f)
static const float MID[15] = {MIDK(0, 1), MIDK(1, 2), MIDK(2, 3), MIDK(3, 4), MIDK(4, 5),
                              MIDK(5, 6), MIDK(6, 7), MIDK(7, 8), MIDK(8, 9), MIDK(9, 10),
                              MIDK(10, 11), MIDK(11, 12), MIDK(12, 13), MIDK(13, 14), MIDK(14, 15)};
static const float NF4_TINY = 1e-38f; /* a subnormal: 9.99999935e-39f */
static const float ROUND_MAGIC = 12582912.0f; /* 1.5 * 2^23 */

AI float bits2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
AI uint32_t f2bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* IEEE half -> float, exact for every input (normal, subnormal, inf, NaN), branch-free. */
AI float f16_to_f32(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const float normalized = bits2f((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = bits2f((two_w >> 17) | (126u << 23)) - 0.5f;
    const uint32_t small = 0u - (uint32_t)(two_w < (1u << 27)); /* a mask, not a select: vectorizes on SSE/AVX2 */
    const uint32_t r = sign | (f2bits(denormalized) & small) | (f2bits(normalized) & ~small);
    return bits2f(r);
}

AI float load1(const void *p, int64_t i, int dt) {
    if (dt == ORK_DT_F32) return ((const float *)p)[i];
    if (dt == ORK_DT_F16) return f16_to_f32(((const uint16_t *)p)[i]);
    return bits2f((uint32_t)((const uint16_t *)p)[i] << 16);
}

/* buf[0..len) = x[off..off+len) widened, non-finite as 0; buf[len..width) = 0. Returns non-finite count. */
AI int load_run(const void *x, int64_t off, int len, int width, int dt, float *buf) {
    int nf = 0;
    for (int i = 0; i < len; i++) {
        float v = load1(x, off + i, dt);
        int bad = (f2bits(v) & 0x7f800000u) == 0x7f800000u;
        nf += bad;
        buf[i] = bad ? 0.0f : v;
    }
    for (int i = len; i < width; i++) buf[i] = 0.0f;
    return nf;
}

/* max |buf[i]| of finite floats, via their bit patterns (integer max vectorizes; order-free) */
AI float absmax_of(const float *buf, int len) {
    uint32_t m = 0;
    for (int i = 0; i < len; i++) {
        uint32_t a = f2bits(buf[i]) & 0x7fffffffu;
        m = a > m ? a : m;
    }
    return bits2f(m);
}

AI double fold(const double *acc) {
    double s = 0.0;
    for (int j = 0; j < LANES; j++) s += acc[j];
    return s;
}

/* ------------------------------------------------------------------ NF4 */

/* MID is sorted, so s > MID[k] holds exactly for k < code: code counts the hits, and
 * the bits of CB[code] are CB[0]'s bits XORed with each step's delta (no selects,
 * which GCC will not if-convert for AVX2 / SSE). */
#define NF4_STEP(k) do { const uint32_t gt = s > MID[k]; code += gt; \
                         cbb ^= (0u - gt) & (f2bits(CB[(k) + 1]) ^ f2bits(CB[k])); } while (0)

/* One block: buf holds 64 floats (zero padded past len). */
AI void nf4_block(const float *buf, int len, int tail, uint8_t *out, float *absmax_out,
                  double *ax, double *ae) {
    const float amax = absmax_of(buf, NF4_BLOCK);
    const float d = amax < NF4_TINY ? NF4_TINY : amax;
    const float inv = 1.0f / d;
    const float stored = tail ? d : amax;
    uint8_t c[NF4_BLOCK];
    float deq[NF4_BLOCK];
    for (int i = 0; i < NF4_BLOCK; i++) {
        const float s = tail ? buf[i] / d : buf[i] * inv;
        uint32_t code = 0, cbb = f2bits(CB[0]);
        NF4_STEP(0); NF4_STEP(1); NF4_STEP(2); NF4_STEP(3); NF4_STEP(4);
        NF4_STEP(5); NF4_STEP(6); NF4_STEP(7); NF4_STEP(8); NF4_STEP(9);
        NF4_STEP(10); NF4_STEP(11); NF4_STEP(12); NF4_STEP(13); NF4_STEP(14);
        c[i] = (uint8_t)code;
        deq[i] = bits2f(cbb) * stored;
    }
    uint8_t packed[NF4_BLOCK / 2];
    for (int i = 0; i < NF4_BLOCK / 2; i++) packed[i] = (uint8_t)((c[2 * i] << 4) | c[2 * i + 1]);
    memcpy(out, packed, (size_t)((len + 1) / 2));
    *absmax_out = stored;
    for (int g = 0; g < NF4_BLOCK; g += LANES) {
        for (int j = 0; j < LANES; j++) {
            const float x = buf[g + j];
            const float e = x - deq[g + j];
            ax[j] += (double)x * (double)x;
            ae[j] += (double)e * (double)e;
        }
    }
}

AI void nf4_encode_body(const void *x, int dt, int64_t n, int64_t b0, int64_t b1,
                        uint8_t *codes, float *absmax, ork_codec_stats *st) {
    double ax[LANES] = {0}, ae[LANES] = {0};
    int64_t nf = 0;
    const int64_t full = n / NF4_BLOCK;
    float buf[NF4_BLOCK];
    for (int64_t b = b0; b < b1; b++) {
        const int64_t off = b * NF4_BLOCK;
        if (b < full) {
            nf += load_run(x, off, NF4_BLOCK, NF4_BLOCK, dt, buf);
            nf4_block(buf, NF4_BLOCK, 0, codes + off / 2, absmax + b, ax, ae);
        } else {
            const int len = (int)(n - off);
            nf += load_run(x, off, len, NF4_BLOCK, dt, buf);
            nf4_block(buf, len, 1, codes + off / 2, absmax + b, ax, ae);
        }
    }
    st->sum_x2 = fold(ax);
    st->sum_err2 = fold(ae);
    st->nonfinite = nf;
}

AI void nf4_decode_body(const uint8_t *codes, const float *absmax, int64_t n, int64_t b0, int64_t b1,
                        float *out) {
    for (int64_t b = b0; b < b1; b++) {
        const int64_t off = b * NF4_BLOCK;
        const float a = absmax[b];
        const uint8_t *cb = codes + off / 2;
        if (off + NF4_BLOCK <= n) {
            float *o = out + off;
            for (int i = 0; i < NF4_BLOCK / 2; i++) {
                o[2 * i] = CB[cb[i] >> 4] * a;
                o[2 * i + 1] = CB[cb[i] & 15] * a;
            }
        } else {
            for (int64_t i = off; i < n; i++) {
                const uint8_t byte = cb[(i - off) / 2];
                const int code = ((i - off) & 1) ? (byte & 15) : (byte >> 4);
                out[i] = CB[code] * a;
            }
        }
    }
}

/* ------------------------------------------------------------------ int8 */

/* Where row r's run j (columns k0 + 32j ...) of segment seg starts in the tiled image. */
AI int64_t tiled_offset(int64_t r, int64_t seg, int64_t j, int64_t Np, int64_t K, int64_t kseg) {
    const int64_t k0 = seg * kseg;
    const int64_t w = (K - k0 < kseg ? K - k0 : kseg);
    const int64_t Kt = (w + RUN - 1) / RUN;
    return Np * k0 + (((r / 32) * Kt + j) * 32 + (r % 32)) * RUN;
}

/* int8 stats lanes: one per column of a 32-wide run (folded in a fixed order per chunk) */
#define I8_LANES RUN
#define SCAN 256 /* amax pass: columns widened at a time */

AI double fold32(const double *acc) {
    double s = 0.0;
    for (int j = 0; j < I8_LANES; j++) s += acc[j];
    return s;
}

AI void int8_encode_body(const void *x, int dt, int64_t N, int64_t K, int64_t r0, int64_t r1,
                         int64_t kseg, int8_t *q, float *scale, ork_codec_stats *st) {
    double ax[I8_LANES] = {0}, ae[I8_LANES] = {0};
    int64_t nf = 0;
    const int64_t Np = (N + 31) / 32 * 32;
    const int64_t nseg = kseg > 0 ? (K + kseg - 1) / kseg : 1;
    const int64_t segw = kseg > 0 ? kseg : K;
    float buf[SCAN];
    int8_t qb[RUN];
    for (int64_t r = r0; r < r1; r++) {
        if (r >= N) { /* NPU padding row */
            for (int64_t s = 0; s < nseg; s++) {
                const int64_t w = K - s * segw < segw ? K - s * segw : segw;
                for (int64_t j = 0; j * RUN < w; j++)
                    memset(q + tiled_offset(r, s, j, Np, K, kseg), 0, RUN);
            }
            continue;
        }
        const int64_t roff = r * K;
        /* pass 1: amax (non-finite as 0) */
        uint32_t m = 0;
        for (int64_t c = 0; c < K; c += SCAN) {
            const int len = (int)(K - c < SCAN ? K - c : SCAN);
            nf += load_run(x, roff + c, len, len, dt, buf);
            const uint32_t a = f2bits(absmax_of(buf, len));
            m = a > m ? a : m;
        }
        const float amax = bits2f(m);
        const float sc = amax / 127.0f;
        float inv = 127.0f / amax;
        inv = amax == 0.0f ? 0.0f : (inv > FLT_MAX ? FLT_MAX : inv);
        scale[r] = sc;
        /* pass 2: codes, 32 columns at a time (|x * inv| <= 127.00002, so the magic-number
         * rounding is exact and the clamp can be done on the integer) */
        for (int64_t s = 0; s < nseg; s++) {
            const int64_t k0 = s * segw;
            const int64_t w = K - k0 < segw ? K - k0 : segw;
            for (int64_t j = 0; j * RUN < w; j++) {
                const int len = (int)(w - j * RUN < RUN ? w - j * RUN : RUN);
                load_run(x, roff + k0 + j * RUN, len, RUN, dt, buf);
                for (int l = 0; l < RUN; l++) {
                    const float xv = buf[l];
                    const float v = xv * inv;
                    int32_t qi = (int32_t)((v + ROUND_MAGIC) - ROUND_MAGIC);
                    qi = qi > 127 ? 127 : qi;
                    qi = qi < -127 ? -127 : qi;
                    qb[l] = (int8_t)qi;
                    const float e = xv - (float)qi * sc;
                    ax[l] += (double)xv * (double)xv;
                    ae[l] += (double)e * (double)e;
                }
                if (kseg > 0)
                    memcpy(q + tiled_offset(r, s, j, Np, K, kseg), qb, RUN);
                else
                    memcpy(q + roff + j * RUN, qb, (size_t)len);
            }
        }
    }
    st->sum_x2 = fold32(ax);
    st->sum_err2 = fold32(ae);
    st->nonfinite = nf;
}

AI void int8_decode_body(const int8_t *q, const float *scale, int64_t N, int64_t K, int64_t r0,
                         int64_t r1, int64_t kseg, float *out) {
    const int64_t Np = (N + 31) / 32 * 32;
    const int64_t segw = kseg > 0 ? kseg : K;
    const int64_t nseg = kseg > 0 ? (K + kseg - 1) / kseg : 1;
    for (int64_t r = r0; r < r1 && r < N; r++) {
        const float sc = scale[r];
        float *o = out + r * K;
        if (kseg <= 0) {
            const int8_t *qr = q + r * K;
            for (int64_t c = 0; c < K; c++) o[c] = (float)qr[c] * sc;
            continue;
        }
        for (int64_t s = 0; s < nseg; s++) {
            const int64_t k0 = s * segw;
            const int64_t w = K - k0 < segw ? K - k0 : segw;
            for (int64_t j = 0; j * RUN < w; j++) {
                const int len = (int)(w - j * RUN < RUN ? w - j * RUN : RUN);
                const int8_t *qt = q + tiled_offset(r, s, j, Np, K, kseg);
                float *oo = o + k0 + j * RUN;
                for (int l = 0; l < len; l++) oo[l] = (float)qt[l] * sc;
            }
        }
    }
}

AI void int8_tile_body(const int8_t *q, int64_t N, int64_t K, int64_t r0, int64_t r1, int64_t kseg,
                       int8_t *dst) {
    const int64_t Np = (N + 31) / 32 * 32;
    const int64_t nseg = (K + kseg - 1) / kseg;
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t s = 0; s < nseg; s++) {
            const int64_t k0 = s * kseg;
            const int64_t w = K - k0 < kseg ? K - k0 : kseg;
            for (int64_t j = 0; j * RUN < w; j++) {
                const int len = (int)(w - j * RUN < RUN ? w - j * RUN : RUN);
                int8_t *d = dst + tiled_offset(r, s, j, Np, K, kseg);
                if (r < N) {
                    memcpy(d, q + r * K + k0 + j * RUN, (size_t)len);
                    if (len < RUN) memset(d + len, 0, (size_t)(RUN - len));
                } else {
                    memset(d, 0, RUN);
                }
            }
        }
    }
}

AI int64_t widen_body(const void *x, int dt, int64_t n, float *out) {
    int64_t nf = 0;
    for (int64_t i = 0; i < n; i++) {
        const float v = load1(x, i, dt);
        nf += (f2bits(v) & 0x7f800000u) == 0x7f800000u;
        if (out) out[i] = v;
    }
    return nf;
}

/* ------------------------------------------------------------------ one instance per SIMD level */

typedef struct {
    void (*nf4_encode)(const void *, int, int64_t, int64_t, int64_t, uint8_t *, float *, ork_codec_stats *);
    void (*nf4_decode)(const uint8_t *, const float *, int64_t, int64_t, int64_t, float *);
    void (*int8_encode)(const void *, int, int64_t, int64_t, int64_t, int64_t, int64_t, int8_t *, float *,
                        ork_codec_stats *);
    void (*int8_decode)(const int8_t *, const float *, int64_t, int64_t, int64_t, int64_t, int64_t, float *);
    int64_t (*widen)(const void *, int, int64_t, float *);
} ork_codec_impl;

#define DT_SWITCH(dt, CALL) \
    switch (dt) { case ORK_DT_F16: CALL(ORK_DT_F16); break; case ORK_DT_BF16: CALL(ORK_DT_BF16); break; \
                  default: CALL(ORK_DT_F32); break; }

#define INSTANCE(SUF, ATTR)                                                                              \
    ATTR static void nf4_encode_##SUF(const void *x, int dt, int64_t n, int64_t b0, int64_t b1,        \
                                      uint8_t *codes, float *absmax, ork_codec_stats *st) {             \
        DT_SWITCH(dt, NF4E_CALL)                                                                         \
    }                                                                                                    \
    ATTR static void nf4_decode_##SUF(const uint8_t *codes, const float *absmax, int64_t n, int64_t b0, \
                                      int64_t b1, float *out) {                                         \
        nf4_decode_body(codes, absmax, n, b0, b1, out);                                                  \
    }                                                                                                    \
    ATTR static void int8_encode_##SUF(const void *x, int dt, int64_t N, int64_t K, int64_t r0,        \
                                       int64_t r1, int64_t kseg, int8_t *q, float *scale,               \
                                       ork_codec_stats *st) {                                            \
        DT_SWITCH(dt, I8E_CALL)                                                                          \
    }                                                                                                    \
    ATTR static void int8_decode_##SUF(const int8_t *q, const float *scale, int64_t N, int64_t K,       \
                                       int64_t r0, int64_t r1, int64_t kseg, float *out) {              \
        int8_decode_body(q, scale, N, K, r0, r1, kseg, out);                                             \
    }                                                                                                    \
    ATTR static int64_t widen_##SUF(const void *x, int dt, int64_t n, float *out) {                     \
        int64_t r;                                                                                       \
        DT_SWITCH(dt, WIDEN_CALL)                                                                        \
        return r;                                                                                        \
    }                                                                                                    \
    static const ork_codec_impl IMPL_##SUF = {nf4_encode_##SUF, nf4_decode_##SUF, int8_encode_##SUF,   \
                                              int8_decode_##SUF, widen_##SUF};

#define NF4E_CALL(T) nf4_encode_body(x, T, n, b0, b1, codes, absmax, st)
#define I8E_CALL(T) int8_encode_body(x, T, N, K, r0, r1, kseg, q, scale, st)
#define WIDEN_CALL(T) r = widen_body(x, T, n, out)

INSTANCE(portable, )

#if defined(__x86_64__) && defined(__GNUC__) && !defined(ORK_NO_X86_SIMD) /* -DORK_NO_X86_SIMD: portable only */
#define ORK_HAVE_X86 1
INSTANCE(avx2, __attribute__((target("avx2"))))
#ifdef __clang__
#define ORK_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx2"
#else /* GCC: use the full 512-bit width (its default tuning may prefer 256) */
#define ORK_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx2,prefer-vector-width=512"
#endif
INSTANCE(avx512, __attribute__((target(ORK_AVX512_TARGET))))
#endif

static const ork_codec_impl *impl = 0;
static int impl_level = -1;

static int best_level(void) {
#ifdef ORK_HAVE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return ORK_ISA_AVX512;
    if (__builtin_cpu_supports("avx2")) return ORK_ISA_AVX2;
#endif
    return ORK_ISA_PORTABLE;
}

int ork_codecs_set_isa(int level) {
    const int best = best_level();
    if (level < 0 || level > best) level = best;
    switch (level) {
#ifdef ORK_HAVE_X86
    case ORK_ISA_AVX512: impl = &IMPL_avx512; break;
    case ORK_ISA_AVX2: impl = &IMPL_avx2; break;
#endif
    default: impl = &IMPL_portable; level = ORK_ISA_PORTABLE; break;
    }
    impl_level = level;
    return level;
}

static inline const ork_codec_impl *get_impl(void) {
    if (!impl) ork_codecs_set_isa(-1);
    return impl;
}

int ork_codecs_isa(void) {
    get_impl();
    return impl_level;
}

int64_t ork_widen(const void *x, int dtype, int64_t n, float *out) { return get_impl()->widen(x, dtype, n, out); }

int64_t ork_count_nonfinite(const void *x, int dtype, int64_t n) { return get_impl()->widen(x, dtype, n, 0); }

void ork_nf4_encode(const void *x, int dtype, int64_t n, int64_t b0, int64_t b1, uint8_t *codes, float *absmax,
                    ork_codec_stats *stats) {
    get_impl()->nf4_encode(x, dtype, n, b0, b1, codes, absmax, stats);
}

void ork_nf4_decode(const uint8_t *codes, const float *absmax, int64_t n, int64_t b0, int64_t b1, float *out) {
    get_impl()->nf4_decode(codes, absmax, n, b0, b1, out);
}

void ork_int8_encode(const void *x, int dtype, int64_t N, int64_t K, int64_t r0, int64_t r1, int64_t k_segment,
                     int8_t *q, float *scale, ork_codec_stats *stats) {
    get_impl()->int8_encode(x, dtype, N, K, r0, r1, k_segment, q, scale, stats);
}

void ork_int8_decode(const int8_t *q, const float *scale, int64_t N, int64_t K, int64_t r0, int64_t r1,
                     int64_t k_segment, float *out) {
    get_impl()->int8_decode(q, scale, N, K, r0, r1, k_segment, out);
}

void ork_int8_tile(const int8_t *q, int64_t N, int64_t K, int64_t r0, int64_t r1, int64_t k_segment, int8_t *dst) {
    int8_tile_body(q, N, K, r0, r1, k_segment, dst);
}
