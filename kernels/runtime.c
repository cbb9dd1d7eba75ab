/* runtime.c: the cacheable fill and the NF4 -> int8 tiled inflates (see runtime.h).
 *
 * Arithmetic of the inflate, exactly that of the numpy reference
 * tile_int8(int8_encode(nf4_decode(codes, absmax, (N, K)))):
 *
 *   v     = CODEBOOK[code] * absmax[e / 64]     float32 multiply; a non-finite v is taken as 0
 *   amax  = max over the row of |v|             (float32)
 *   scale = amax / 127                          float32 division -> scale[r]
 *   inv   = 0 if amax == 0 else min(127 / amax, FLT_MAX)
 *   q     = clamp(rint(v * inv), -127, 127)     float32 multiply, round half to even
 *
 * Direct path. |v| = fl(|CB[c]| * |a|) exactly (rounding is sign-symmetric), and it is
 * monotone in |CB[c]|; CODEBOOK is increasing, so the largest |CB[c]| over a set of codes is
 * at its smallest or largest code. A row's amax is therefore the max over its (block, row)
 * pieces of fl(max(|CB[cmin]|, |CB[cmax]|) * |a|), found from a byte min/max scan of the
 * row's codes. With inv known, each piece gets a 16-entry int8 table T[c] = q(CB[c] * a)
 * (the same float32 ops as above), and every nibble is expanded through it straight into the
 * 32-byte row of its tile (pshufb on x86 SSSE3, tbl on NEON, a scalar loop otherwise).
 * A non-finite absmax makes every v of its block non-finite, i.e. 0: it acts as absmax 0.
 *
 * Rounding: after the clamp |t| <= 127, and (t + 1.5*2^23) - 1.5*2^23 is rint(t) in the
 * default rounding mode (ties to even); this file is compiled with -ffp-contract=off and
 * without -ffast-math, so the compiler keeps the two float32 operations.
 */
#include "runtime.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ORK_RT_X86 1
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

static const float CB[16] = {
    (float)-1.0, (float)-0.6961928009986877, (float)-0.5250730514526367, (float)-0.39491748809814453,
    (float)-0.28444138169288635, (float)-0.18477343022823334, (float)-0.09105003625154495, (float)0.0,
    (float)0.07958029955625534, (float)0.16093020141124725, (float)0.24611230194568634, (float)0.33791524171829224,
    (float)0.44070982933044434, (float)0.5626170039176941, (float)0.7229568362236023, (float)1.0,
};
static const float ABSCB[16] = {
    (float)1.0, (float)0.6961928009986877, (float)0.5250730514526367, (float)0.39491748809814453,
    (float)0.28444138169288635, (float)0.18477343022823334, (float)0.09105003625154495, (float)0.0,
    (float)0.07958029955625534, (float)0.16093020141124725, (float)0.24611230194568634, (float)0.33791524171829224,
    (float)0.44070982933044434, (float)0.5626170039176941, (float)0.7229568362236023, (float)1.0,
};

#define TILE 32
#define RINT_MAGIC 12582912.0f /* 1.5 * 2^23 */

static int g_force_portable = 0;

/* ------------------------------------------------------------------ geometry */

typedef struct {
    int64_t n, k, kseg, np, nseg, klast; /* klast: width of the last segment */
} geom_t;

static int64_t round32(int64_t v) { return (v + 31) & ~(int64_t)31; }

static int geom_init(geom_t *g, int64_t n, int64_t k, int64_t kseg) {
    if (n < 1 || k < 1 || kseg < TILE || kseg % TILE) return 0;
    if (n > ((int64_t)1 << 40) || k > ((int64_t)1 << 40) || n > INT64_MAX / k) return 0;
    g->n = n;
    g->k = k;
    g->kseg = kseg;
    g->np = round32(n);
    g->nseg = (k + kseg - 1) / kseg;
    g->klast = k - (g->nseg - 1) * kseg;
    return 1;
}

static size_t geom_size(const geom_t *g) {
    /* every full segment is kseg wide (a multiple of 32); the last is rounded up to 32 */
    return (size_t)g->np * (size_t)((g->nseg - 1) * g->kseg + round32(g->klast));
}

/* start of the 32-byte row of row r at segment s, k-tile j */
static inline int8_t *tile_row(const geom_t *g, int8_t *q, int64_t r, int64_t s, int64_t j) {
    int64_t kp = (s == g->nseg - 1) ? round32(g->klast) : g->kseg;
    int64_t kt = kp / TILE;
    int64_t base = s * g->np * g->kseg;
    return q + base + (((r / TILE) * kt + j) * TILE + (r % TILE)) * TILE;
}

size_t ork_rt_tiled_size(int64_t n, int64_t k, int64_t k_segment) {
    geom_t g;
    if (!geom_init(&g, n, k, k_segment)) return 0;
    return geom_size(&g);
}

static int check_args(const geom_t *g, size_t codes_size, size_t absmax_count, int64_t tile0, int64_t tile1,
                      size_t q_size) {
    int64_t total = g->n * g->k;
    if (codes_size < (size_t)((total + 1) / 2)) return 0;
    if (absmax_count < (size_t)((total + 63) / 64)) return 0;
    if (q_size < geom_size(g)) return 0;
    if (tile0 < 0 || tile0 > tile1 || tile1 > g->np / TILE) return 0;
    return 1;
}

/* ------------------------------------------------------------------ fill and clean */

void ork_rt_clean(void *p, size_t n) {
#if defined(__aarch64__)
    if (n == 0) return;
    uint64_t ctr;
    __asm__ volatile("mrs %0, ctr_el0" : "=r"(ctr));
    uintptr_t line = (uintptr_t)4 << ((ctr >> 16) & 0xf); /* DminLine: log2 of words */
    uintptr_t a = (uintptr_t)p & ~(line - 1);
    uintptr_t end = (uintptr_t)p + n;
    for (; a < end; a += line) __asm__ volatile("dc cvac, %0" : : "r"(a) : "memory");
    __asm__ volatile("dsb sy" : : : "memory");
#else
    (void)p;
    (void)n; /* x86 caches are coherent with DMA; nothing to clean */
#endif
}

void ork_rt_fill(void *dst, const void *src, size_t n, int clean) {
    memcpy(dst, src, n);
    if (clean) ork_rt_clean(dst, n);
}

/* ------------------------------------------------------------------ scalar helpers */

static inline unsigned nib(const uint8_t *codes, int64_t e) {
    return (codes[e >> 1] >> ((~e & 1) << 2)) & 15u; /* even element: high nibble */
}

static inline float finite_or_zero(float a) { return isfinite(a) ? a : 0.0f; }

static inline int8_t quant(float v, float inv) {
    float t = v * inv; /* never NaN: v finite, inv in [0, FLT_MAX] */
    t = t < -127.0f ? -127.0f : t;
    t = t > 127.0f ? 127.0f : t;
    t = (t + RINT_MAGIC) - RINT_MAGIC;
    return (int8_t)(int32_t)t;
}

static inline float inv_of(float amax) {
    if (amax == 0.0f) return 0.0f;
    float inv = 127.0f / amax;
    return inv > FLT_MAX ? FLT_MAX : inv;
}

static inline void build_table(float a, float inv, int8_t T[16]) {
    for (int c = 0; c < 16; c++) T[c] = quant(CB[c] * a, inv);
}

/* max |v| over elements [e, pe) of one block with absmax a (finite) */
static inline float piece_amax(const uint8_t *codes, int64_t e, int64_t pe, float a) {
    unsigned mn = 15, mx = 0;
    int64_t x = e;
    if (x < pe && (x & 1)) {
        unsigned c = nib(codes, x++);
        mn = c < mn ? c : mn;
        mx = c > mx ? c : mx;
    }
    const uint8_t *p = codes + (x >> 1);
    int64_t nb = (pe - x) >> 1;
    unsigned bmn = 255, bmx = 0;
    for (int64_t m = 0; m < nb; m++) {
        unsigned b = p[m], h = b >> 4, l = b & 15u;
        unsigned lo = h < l ? h : l, hi = h < l ? l : h;
        bmn = lo < bmn ? lo : bmn;
        bmx = hi > bmx ? hi : bmx;
    }
    if (nb) {
        mn = bmn < mn ? bmn : mn;
        mx = bmx > mx ? bmx : mx;
    }
    x += nb * 2;
    if (x < pe) {
        unsigned c = nib(codes, x);
        mn = c < mn ? c : mn;
        mx = c > mx ? c : mx;
    }
    float f = ABSCB[mn] > ABSCB[mx] ? ABSCB[mn] : ABSCB[mx];
    return f * fabsf(a);
}

static float row_amax(const uint8_t *codes, const float *absmax, int64_t e0, int64_t k) {
    float m = 0.0f;
    int64_t e = e0, end = e0 + k;
    while (e < end) {
        int64_t b = e >> 6;
        int64_t pe = (b + 1) << 6;
        if (pe > end) pe = end;
        float a = finite_or_zero(absmax[b]);
        if (a != 0.0f) {
            float v = piece_amax(codes, e, pe, a);
            m = v > m ? v : m;
        }
        e = pe;
    }
    return m;
}

/* ------------------------------------------------------------------ 16 code bytes -> 32 int8 */

static void expand_portable(const uint8_t *p, const int8_t T[16], int8_t *dst) {
    for (int m = 0; m < 16; m++) {
        dst[2 * m] = T[p[m] >> 4];
        dst[2 * m + 1] = T[p[m] & 15];
    }
}

#if defined(ORK_RT_X86)
__attribute__((target("ssse3"))) static void expand_ssse3(const uint8_t *p, const int8_t T[16], int8_t *dst) {
    __m128i t = _mm_loadu_si128((const __m128i *)T);
    __m128i c = _mm_loadu_si128((const __m128i *)p);
    __m128i m = _mm_set1_epi8(15);
    __m128i lo = _mm_and_si128(c, m);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(c, 4), m);
    __m128i vh = _mm_shuffle_epi8(t, hi);
    __m128i vl = _mm_shuffle_epi8(t, lo);
    _mm_storeu_si128((__m128i *)dst, _mm_unpacklo_epi8(vh, vl));
    _mm_storeu_si128((__m128i *)(dst + 16), _mm_unpackhi_epi8(vh, vl));
}
static int have_ssse3(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("ssse3") ? 1 : 0;
    }
    return cached;
}
#endif

#if defined(__aarch64__)
static void expand_neon(const uint8_t *p, const int8_t T[16], int8_t *dst) {
    int8x16_t t = vld1q_s8(T);
    uint8x16_t c = vld1q_u8(p);
    int8x16x2_t v;
    v.val[0] = vqtbl1q_s8(t, vshrq_n_u8(c, 4));
    v.val[1] = vqtbl1q_s8(t, vandq_u8(c, vdupq_n_u8(15)));
    vst2q_s8(dst, v); /* interleaves: hi nibble first */
}
#endif

#if defined(ORK_RT_X86)
/* codes ordered by |CODEBOOK|: rank 0 = code 7 (0.0) ... rank 14 = codes 0 and 15 (1.0) */
static const float ABS_BY_RANK[16] = {
    (float)0.0, (float)0.07958029955625534, (float)0.09105003625154495, (float)0.16093020141124725,
    (float)0.18477343022823334, (float)0.24611230194568634, (float)0.28444138169288635, (float)0.33791524171829224,
    (float)0.39491748809814453, (float)0.44070982933044434, (float)0.5250730514526367, (float)0.5626170039176941,
    (float)0.6961928009986877, (float)0.7229568362236023, (float)1.0, (float)1.0,
};

/* One whole row when k % 64 == 0 and k_segment % 64 == 0: the same arithmetic as the portable
 * path (see the top of this file), with the byte min/max scan done as a max over |CB| ranks,
 * the 16-entry table built four floats at a time, and the nibbles expanded by pshufb. */
__attribute__((target("ssse3"))) static void row_fast_ssse3(const geom_t *g, const uint8_t *cp, const float *ab,
                                                             int64_t r, int8_t *q, float *scale_out) {
    const int64_t nb = g->k / 64;
    const __m128i m15 = _mm_set1_epi8(15);
    const __m128i rank = _mm_setr_epi8(14, 12, 10, 8, 6, 4, 2, 0, 1, 3, 5, 7, 9, 11, 13, 14);
    float amax = 0.0f;
    for (int64_t t = 0; t < nb; t++) {
        float a = ab[t];
        if (!(fabsf(a) <= FLT_MAX) || a == 0.0f) continue; /* non-finite acts as 0 */
        __m128i c0 = _mm_loadu_si128((const __m128i *)(cp + 32 * t));
        __m128i c1 = _mm_loadu_si128((const __m128i *)(cp + 32 * t + 16));
        __m128i r0 = _mm_max_epu8(_mm_shuffle_epi8(rank, _mm_and_si128(c0, m15)),
                                  _mm_shuffle_epi8(rank, _mm_and_si128(_mm_srli_epi16(c0, 4), m15)));
        __m128i r1 = _mm_max_epu8(_mm_shuffle_epi8(rank, _mm_and_si128(c1, m15)),
                                  _mm_shuffle_epi8(rank, _mm_and_si128(_mm_srli_epi16(c1, 4), m15)));
        __m128i m = _mm_max_epu8(r0, r1);
        m = _mm_max_epu8(m, _mm_srli_si128(m, 8));
        m = _mm_max_epu8(m, _mm_srli_si128(m, 4));
        m = _mm_max_epu8(m, _mm_srli_si128(m, 2));
        m = _mm_max_epu8(m, _mm_srli_si128(m, 1));
        float v = ABS_BY_RANK[_mm_cvtsi128_si32(m) & 15] * fabsf(a);
        amax = v > amax ? v : amax;
    }
    *scale_out = amax / 127.0f;
    const __m128 vinv = _mm_set1_ps(inv_of(amax));
    const __m128 lo = _mm_set1_ps(-127.0f), hi = _mm_set1_ps(127.0f), mg = _mm_set1_ps(RINT_MAGIC);
    const __m128 cb0 = _mm_loadu_ps(CB), cb1 = _mm_loadu_ps(CB + 4), cb2 = _mm_loadu_ps(CB + 8), cb3 = _mm_loadu_ps(CB + 12);
    const int64_t i = r / TILE, nr = r % TILE;
    for (int64_t s = 0; s < g->nseg; s++) {
        int64_t k0 = s * g->kseg, w = (s == g->nseg - 1) ? g->klast : g->kseg;
        int64_t kt = w / TILE; /* w is a multiple of 64 here */
        int8_t *base = q + s * g->np * g->kseg + ((i * kt) * TILE + nr) * TILE;
        for (int64_t t = 0; t < w / 64; t++) {
            float a = ab[k0 / 64 + t];
            __m128 va = _mm_set1_ps(isfinite(a) ? a : 0.0f);
#define ORK_Q4(cb) _mm_cvttps_epi32(_mm_sub_ps(_mm_add_ps(_mm_min_ps(_mm_max_ps(_mm_mul_ps(_mm_mul_ps(cb, va), vinv), lo), hi), mg), mg))
            __m128i tab = _mm_packs_epi16(_mm_packs_epi32(ORK_Q4(cb0), ORK_Q4(cb1)), _mm_packs_epi32(ORK_Q4(cb2), ORK_Q4(cb3)));
#undef ORK_Q4
            const uint8_t *p = cp + (k0 + 64 * t) / 2;
            for (int h = 0; h < 2; h++) {
                __m128i c = _mm_loadu_si128((const __m128i *)(p + 16 * h));
                __m128i vh = _mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(c, 4), m15));
                __m128i vl = _mm_shuffle_epi8(tab, _mm_and_si128(c, m15));
                int8_t *d = base + (2 * t + h) * (TILE * TILE);
                _mm_storeu_si128((__m128i *)d, _mm_unpacklo_epi8(vh, vl));
                _mm_storeu_si128((__m128i *)(d + 16), _mm_unpackhi_epi8(vh, vl));
            }
        }
    }
}
#endif

typedef void (*expand_fn)(const uint8_t *, const int8_t *, int8_t *);

static expand_fn pick_expand(void) {
    if (g_force_portable) return expand_portable;
#if defined(ORK_RT_X86)
    if (have_ssse3()) return expand_ssse3;
#endif
#if defined(__aarch64__)
    return expand_neon;
#endif
    return expand_portable;
}

int ork_rt_simd_level(void) {
    if (g_force_portable) return 0;
#if defined(ORK_RT_X86)
    return have_ssse3() ? 1 : 0;
#elif defined(__aarch64__)
    return 2;
#else
    return 0;
#endif
}

void ork_rt_force_portable(int on) { g_force_portable = on ? 1 : 0; }

/* ------------------------------------------------------------------ tiling of one int8 row */

static void zero_row(const geom_t *g, int8_t *q, int64_t r) {
    for (int64_t s = 0; s < g->nseg; s++) {
        int64_t kt = ((s == g->nseg - 1) ? round32(g->klast) : g->kseg) / TILE;
        for (int64_t j = 0; j < kt; j++) memset(tile_row(g, q, r, s, j), 0, TILE);
    }
}

/* copy a row-major int8 row (k values) into its tile rows, zero padding each segment's tail */
static void tile_one_row(const geom_t *g, int8_t *q, int64_t r, const int8_t *rowq) {
    for (int64_t s = 0; s < g->nseg; s++) {
        int64_t k0 = s * g->kseg;
        int64_t w = (s == g->nseg - 1) ? g->klast : g->kseg;
        int64_t kt = round32(w) / TILE;
        for (int64_t j = 0; j < kt; j++) {
            int8_t *d = tile_row(g, q, r, s, j);
            int64_t c0 = j * TILE, len = w - c0 < TILE ? w - c0 : TILE;
            memcpy(d, rowq + k0 + c0, (size_t)len);
            if (len < TILE) memset(d + len, 0, (size_t)(TILE - len));
        }
    }
}

/* ------------------------------------------------------------------ direct inflate */

int ork_rt_inflate_direct(const uint8_t *codes, size_t codes_size, const float *absmax, size_t absmax_count,
                          int64_t n, int64_t k, int64_t k_segment, int64_t tile0, int64_t tile1,
                          int8_t *q, size_t q_size, float *scale) {
    geom_t g;
    if (!geom_init(&g, n, k, k_segment) || !check_args(&g, codes_size, absmax_count, tile0, tile1, q_size))
        return ORK_RT_EARGS;
    expand_fn expand = pick_expand();
    /* fast path: every row starts on a block boundary and every 32-column chunk sits in one block */
    int fast = (k % 64) == 0;
    int8_t *rowq = NULL;
    if (!fast) {
        rowq = (int8_t *)malloc((size_t)k);
        if (!rowq) return ORK_RT_ENOMEM;
    }
    int64_t r_end = tile1 * TILE;
    for (int64_t r = tile0 * TILE; r < r_end; r++) {
        if (r >= n) {
            zero_row(&g, q, r);
            continue;
        }
        int64_t e0 = r * k;
#if defined(ORK_RT_X86)
        if (fast && g.kseg % 64 == 0 && !g_force_portable && have_ssse3()) {
            row_fast_ssse3(&g, codes + (e0 >> 1), absmax + (e0 >> 6), r, q, scale + r);
            continue;
        }
#endif
        float amax = row_amax(codes, absmax, e0, k);
        scale[r] = amax / 127.0f;
        float inv = inv_of(amax);
        int8_t T[16];
        if (fast) {
            const float *ab = absmax + (e0 >> 6);
            const uint8_t *cp = codes + (e0 >> 1);
            for (int64_t t = 0; t < k / 64; t++) {
                build_table(finite_or_zero(ab[t]), inv, T);
                for (int h = 0; h < 2; h++) {
                    int64_t col = t * 64 + h * TILE;
                    int64_t s = col / g.kseg;
                    int64_t j = (col - s * g.kseg) / TILE;
                    expand(cp + (col >> 1), T, tile_row(&g, q, r, s, j));
                }
            }
        } else {
            int64_t e = e0, end = e0 + k;
            while (e < end) {
                int64_t b = e >> 6;
                int64_t pe = (b + 1) << 6;
                if (pe > end) pe = end;
                build_table(finite_or_zero(absmax[b]), inv, T);
                for (int64_t x = e; x < pe; x++) rowq[x - e0] = T[nib(codes, x)];
                e = pe;
            }
            tile_one_row(&g, q, r, rowq);
        }
    }
    free(rowq);
    return ORK_RT_OK;
}

/* ------------------------------------------------------------------ two-step inflate */

int ork_rt_inflate_two_step(const uint8_t *codes, size_t codes_size, const float *absmax, size_t absmax_count,
                            int64_t n, int64_t k, int64_t k_segment, int64_t tile0, int64_t tile1,
                            int8_t *q, size_t q_size, float *scale) {
    geom_t g;
    if (!geom_init(&g, n, k, k_segment) || !check_args(&g, codes_size, absmax_count, tile0, tile1, q_size))
        return ORK_RT_EARGS;
    float *buf = (float *)malloc((size_t)k * TILE * sizeof(float));
    int8_t *rowq = (int8_t *)malloc((size_t)k);
    if (!buf || !rowq) {
        free(buf);
        free(rowq);
        return ORK_RT_ENOMEM;
    }
    for (int64_t i = tile0; i < tile1; i++) {
        int64_t r0 = i * TILE, r1 = r0 + TILE < n ? r0 + TILE : n;
        /* step 1: dequantize the tile's rows to float32 */
        for (int64_t r = r0; r < r1; r++) {
            float *v = buf + (r - r0) * k;
            int64_t e0 = r * k;
            for (int64_t x = 0; x < k; x++) {
                int64_t e = e0 + x;
                float f = CB[nib(codes, e)] * absmax[e >> 6];
                v[x] = isfinite(f) ? f : 0.0f;
            }
        }
        /* step 2: requantize per row, then tile */
        for (int64_t r = r0; r < r1; r++) {
            const float *v = buf + (r - r0) * k;
            float amax = 0.0f;
            for (int64_t x = 0; x < k; x++) {
                float a = fabsf(v[x]);
                amax = a > amax ? a : amax;
            }
            scale[r] = amax / 127.0f;
            float inv = inv_of(amax);
            for (int64_t x = 0; x < k; x++) rowq[x] = quant(v[x], inv);
            tile_one_row(&g, q, r, rowq);
        }
        for (int64_t r = r1; r < r0 + TILE; r++) zero_row(&g, q, r);
    }
    free(buf);
    free(rowq);
    return ORK_RT_OK;
}

/* ------------------------------------------------------------------ plain decode */

int ork_rt_nf4_decode(const uint8_t *codes, size_t codes_size, const float *absmax, size_t absmax_count,
                      int64_t e0, int64_t e1, float *out) {
    if (e0 < 0 || e1 < e0) return ORK_RT_EARGS;
    if (codes_size < (size_t)((e1 + 1) / 2) || absmax_count < (size_t)((e1 + 63) / 64)) return ORK_RT_EARGS;
    for (int64_t e = e0; e < e1; e++) out[e - e0] = CB[nib(codes, e)] * absmax[e >> 6];
    return ORK_RT_OK;
}
