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
 * row's codes (SIMD: a max over the codes' |CB| ranks). With inv known, each piece gets a
 * 16-entry int8 table T[c] = q(CB[c] * a) (the same float32 ops as above), and every nibble is
 * expanded through it straight into the 32-byte row of its tile.
 * A non-finite absmax makes every v of its block non-finite, i.e. 0: it acts as absmax 0.
 *
 * Order of work (k % 64 == 0): one row tile (32 rows) at a time: the rows' amax first, then
 * 64 columns at a time the 32 rows' tables and expansions, so that every 1 KiB tile is written
 * front to back once (row by row the stores would hit one half line in each of K/32 tiles, and
 * the store traffic, not the arithmetic, was what bounded the inflate). Per ISA (ork_rt_isa):
 *   - x86 AVX-512 VBMI: a table is one zmm of 16 floats narrowed by vpmovsdb; nibbles ordered by
 *     vpmultishiftqb and looked up by vpermb; row amax for 16 blocks at once by a reduction tree;
 *     rows written in pairs (whole 64-byte lines), streaming stores for images >= 4 MiB;
 *   - x86 SSSE3: tables four floats at a time, pshufb; aarch64 NEON: tables with FCVTNS, tbl;
 *   - portable C: scalar tables and lookups (every other target, and tested on x86 and aarch64).
 * k % 64 != 0 (blocks straddle rows): row by row, portable C.
 *
 * Rounding: after the clamp |t| <= 127, and (t + 1.5*2^23) - 1.5*2^23 is rint(t) in the
 * default rounding mode (ties to even); this file is compiled with -ffp-contract=off and
 * without -ffast-math, so the compiler keeps the two float32 operations. The SIMD tables convert
 * with the CPU's round-to-nearest-even (cvtps2dq in the default MXCSR mode, FCVTNS): the same
 * integers, since |v * inv| < 127.5 makes the clamp a no-op.
 */
#include "runtime.h"
#include "nf4dq_code.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(ORK_NO_X86_SIMD)
#include <immintrin.h>
#define ORK_RT_X86 1 /* -DORK_NO_X86_SIMD: the portable C path only (what a non-NEON, non-x86 build runs) */
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
/* tiled images of at least this many bytes are written with streaming stores where the SIMD path
 * supports them (x86 AVX-512): larger than the L2 cache, going to a device, not read back soon */
#define ORK_RT_STREAM_MIN ((size_t)4 << 20)
#define RINT_MAGIC 12582912.0f /* 1.5 * 2^23 */

static int g_force_portable = 0;
static int g_isa_cap = -1; /* ork_rt_set_isa: the highest level allowed, -1 = best */

/* ------------------------------------------------------------------ geometry */

typedef struct {
    int64_t n, k, kseg, np, nseg, klast; /* klast: width of the last segment */
} geom_t;

static int64_t round32(int64_t v) { return (v + 31) & ~(int64_t)31; }

/* the largest n, k and k_segment the load paths take */
#define ORK_RT_MAX_DIM ((int64_t)1 << 40)

/* The geometry of an [n, k] slice tiled in K segments of kseg columns; 0 on arguments no pack can hold.
 * Guarded here, whatever the caller checked: kseg is a multiple of 32 in [32, 2^40] (a segment at least
 * k wide is the one segment: the same tiling whatever its width), n and k in [1, 2^40], and the tiled
 * image (np * round32(k) bytes: the segments' padded widths sum to round32(k)) fits int64, so no
 * size, offset or segment count below can overflow. */
static int geom_init(geom_t *g, int64_t n, int64_t k, int64_t kseg) {
    if (n < 1 || k < 1 || n > ORK_RT_MAX_DIM || k > ORK_RT_MAX_DIM) return 0;
    if (kseg < TILE || kseg % TILE || kseg > ORK_RT_MAX_DIM) return 0;
    if (n > INT64_MAX / k || round32(n) > INT64_MAX / round32(k)) return 0;
    g->n = n;
    g->k = k;
    g->kseg = kseg;
    g->np = round32(n);
    g->nseg = kseg >= k ? 1 : (k + kseg - 1) / kseg;
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

/* q(v) of FORMAT.md: clamp(rint(v * inv), -127, 127). Since |v| <= amax and inv = fl(127 / amax) or
 * FLT_MAX < 127 / amax, |v * inv| <= 127 (1 + 2^-24)^2 < 127.5: rint alone lands in [-127, 127], so the
 * SIMD tables may skip the clamp and use the CPU's round-to-nearest-even conversion instead. */
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

/* codes ordered by |CODEBOOK|: rank 0 = code 7 (0.0) ... rank 14 = codes 0 and 15 (1.0) */
__attribute__((unused)) static const float ABS_BY_RANK[16] = {
    (float)0.0, (float)0.07958029955625534, (float)0.09105003625154495, (float)0.16093020141124725,
    (float)0.18477343022823334, (float)0.24611230194568634, (float)0.28444138169288635, (float)0.33791524171829224,
    (float)0.39491748809814453, (float)0.44070982933044434, (float)0.5250730514526367, (float)0.5626170039176941,
    (float)0.6961928009986877, (float)0.7229568362236023, (float)1.0, (float)1.0,
};
#define ORK_RANK_OF_CODE 14, 12, 10, 8, 6, 4, 2, 0, 1, 3, 5, 7, 9, 11, 13, 14

/* ------------------------------------------------------------------ per-ISA pieces of the tile-order path
 * For a row of nb whole blocks (k % 64 == 0): amax(cp, ab, nb) is the row's max |v| (the largest
 * |CB| among a block's codes is ABS_BY_RANK[max rank], times |a|; exact, order-free); table(a, inv, T)
 * writes T[c] = q(CB[c] * a) (a finite or 0). All give the bytes of the portable versions. */

static float amax_portable(const uint8_t *cp, const float *ab, int64_t nb) { return row_amax(cp, ab, 0, nb * 64); }

#if defined(ORK_RT_X86)
__attribute__((target("ssse3"))) static float amax_ssse3(const uint8_t *cp, const float *ab, int64_t nb) {
    const __m128i m15 = _mm_set1_epi8(15);
    const __m128i rank = _mm_setr_epi8(ORK_RANK_OF_CODE);
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
    return amax;
}

/* four floats at a time; cvtps2dq rounds in the current mode (round half to even by default, like
 * quant()'s magic-number rounding), and |v * inv| < 127.5 makes quant()'s clamp a no-op (see there) */
__attribute__((target("ssse3"))) static inline void table_ssse3(float a, float inv, int8_t T[16]) {
    const __m128 va = _mm_set1_ps(a), vinv = _mm_set1_ps(inv);
#define ORK_Q4(o) _mm_cvtps_epi32(_mm_mul_ps(_mm_mul_ps(_mm_loadu_ps(CB + (o)), va), vinv))
    __m128i tab = _mm_packs_epi16(_mm_packs_epi32(ORK_Q4(0), ORK_Q4(4)), _mm_packs_epi32(ORK_Q4(8), ORK_Q4(12)));
#undef ORK_Q4
    _mm_storeu_si128((__m128i *)T, tab);
}
#endif

#if defined(__aarch64__)
static float amax_neon(const uint8_t *cp, const float *ab, int64_t nb) {
    const uint8x16_t rank = {ORK_RANK_OF_CODE}, m15 = vdupq_n_u8(15);
    float amax = 0.0f;
    for (int64_t t = 0; t < nb; t++) {
        float a = ab[t];
        if (!(fabsf(a) <= FLT_MAX) || a == 0.0f) continue; /* non-finite acts as 0 */
        uint8x16_t c0 = vld1q_u8(cp + 32 * t), c1 = vld1q_u8(cp + 32 * t + 16);
        uint8x16_t m = vmaxq_u8(vmaxq_u8(vqtbl1q_u8(rank, vandq_u8(c0, m15)), vqtbl1q_u8(rank, vshrq_n_u8(c0, 4))),
                                vmaxq_u8(vqtbl1q_u8(rank, vandq_u8(c1, m15)), vqtbl1q_u8(rank, vshrq_n_u8(c1, 4))));
        float v = ABS_BY_RANK[vmaxvq_u8(m)] * fabsf(a);
        amax = v > amax ? v : amax;
    }
    return amax;
}

/* FCVTNS rounds to nearest, ties to even, as rint() in the default rounding mode; |v * inv| < 127.5
 * (see quant()), so the saturating narrows never saturate and no clamp is needed */
static inline void table_neon(float a, float inv, int8_t T[16]) {
    const float32x4_t va = vdupq_n_f32(a), vi = vdupq_n_f32(inv);
#define ORK_Q4(o) vcvtnq_s32_f32(vmulq_f32(vmulq_f32(vld1q_f32(CB + (o)), va), vi))
    int16x8_t h0 = vcombine_s16(vqmovn_s32(ORK_Q4(0)), vqmovn_s32(ORK_Q4(4)));
    int16x8_t h1 = vcombine_s16(vqmovn_s32(ORK_Q4(8)), vqmovn_s32(ORK_Q4(12)));
#undef ORK_Q4
    vst1q_s8(T, vcombine_s8(vqmovn_s16(h0), vqmovn_s16(h1)));
}
#endif

/* Row tile i when k % 64 == 0 (any k_segment): rows get their amax and scale, then 64 columns at a
 * time the 32 rows' tables are built and both 32-column tiles are written front to back, row after
 * row (each 1 KiB tile is one run of stores; rows past n are zeros). Written once, instantiated per
 * ISA with constant function arguments, which the compiler inlines. */
static inline __attribute__((always_inline)) void tile_order_body(
    const geom_t *g, const uint8_t *codes, const float *absmax, int64_t i, int8_t *q, float *scale,
    float (*amax_fn)(const uint8_t *, const float *, int64_t), void (*table_fn)(float, float, int8_t *),
    void (*expand)(const uint8_t *, const int8_t *, int8_t *)) {
    const int64_t r0 = i * TILE, nr = (g->n - r0) < TILE ? g->n - r0 : TILE;
    const int64_t k = g->k, nb = k / 64;
    float inv[TILE];
    for (int64_t x = 0; x < nr; x++) {
        const int64_t e0 = (r0 + x) * k;
        float amax = amax_fn(codes + (e0 >> 1), absmax + (e0 >> 6), nb);
        scale[r0 + x] = amax / 127.0f;
        inv[x] = inv_of(amax);
    }
    int8_t T[TILE][16];
    const uint8_t *cbase = codes + ((r0 * k) >> 1);
    const float *abase = absmax + ((r0 * k) >> 6);
    for (int64_t t = 0; t < nb; t++) {
        for (int64_t x = 0; x < nr; x++) table_fn(finite_or_zero(abase[x * nb + t]), inv[x], T[x]);
        for (int h = 0; h < 2; h++) {
            const int64_t col = t * 64 + h * TILE, s = col / g->kseg, j = (col - s * g->kseg) / TILE;
            int8_t *d = tile_row(g, q, r0, s, j); /* row 0 of the tile: the tile's first byte */
            const uint8_t *cp = cbase + (col >> 1);
            for (int64_t x = 0; x < nr; x++) expand(cp + x * (k >> 1), T[x], d + x * TILE);
            if (nr < TILE) memset(d + nr * TILE, 0, (size_t)((TILE - nr) * TILE));
        }
    }
}

static void tile_order_portable(const geom_t *g, const uint8_t *codes, const float *absmax, int64_t i, int8_t *q,
                                float *scale) {
    tile_order_body(g, codes, absmax, i, q, scale, amax_portable, build_table, expand_portable);
}
#if defined(ORK_RT_X86)
__attribute__((target("ssse3"))) static void tile_order_ssse3(const geom_t *g, const uint8_t *codes,
                                                               const float *absmax, int64_t i, int8_t *q,
                                                               float *scale) {
    tile_order_body(g, codes, absmax, i, q, scale, amax_ssse3, table_ssse3, expand_ssse3);
}
#endif
#if defined(__aarch64__)
static void tile_order_neon(const geom_t *g, const uint8_t *codes, const float *absmax, int64_t i, int8_t *q,
                            float *scale) {
    tile_order_body(g, codes, absmax, i, q, scale, amax_neon, table_neon, expand_neon);
}
#endif

#if defined(ORK_RT_X86)
#define ORK_AVX512_TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx2")))

/* Ranks (index into ABS_BY_RANK) of 16 blocks (512 code bytes) -> one float per block,
 * ABS_BY_RANK[max rank of the block], in the block order blk_order of row_amax_avx512. The 32-byte
 * per-block max is a reduction tree: 128-bit lanes, then qwords, then dwords, then bytes. */
ORK_AVX512_TGT static inline __m512i ranks64(const uint8_t *p, __m512i rank, __m512i m15) {
    __m512i c = _mm512_loadu_si512((const void *)p);
    __m512i lo = _mm512_shuffle_epi8(rank, _mm512_and_si512(c, m15));
    __m512i hi = _mm512_shuffle_epi8(rank, _mm512_and_si512(_mm512_srli_epi16(c, 4), m15));
    return _mm512_max_epu8(lo, hi);
}

ORK_AVX512_TGT static inline __m512i lane_pair(__m512i a, __m512i b) {
    /* a = blocks (x, x+1), b = (x+2, x+3), 32 bytes each -> lane l = block x+l, 16 bytes */
    return _mm512_max_epu8(_mm512_shuffle_i64x2(a, b, 0x88), _mm512_shuffle_i64x2(a, b, 0xDD));
}

ORK_AVX512_TGT static inline __m512 absrank16(const uint8_t *p, __m512i rank, __m512i m15, __m512 tab) {
    __m512i s0 = lane_pair(ranks64(p, rank, m15), ranks64(p + 64, rank, m15));        /* blocks 0..3 */
    __m512i s1 = lane_pair(ranks64(p + 128, rank, m15), ranks64(p + 192, rank, m15)); /* 4..7 */
    __m512i s2 = lane_pair(ranks64(p + 256, rank, m15), ranks64(p + 320, rank, m15)); /* 8..11 */
    __m512i s3 = lane_pair(ranks64(p + 384, rank, m15), ranks64(p + 448, rank, m15)); /* 12..15 */
    /* qwords: lane l = [block l, block 4+l] and [block 8+l, block 12+l] */
    __m512i t0 = _mm512_max_epu8(_mm512_unpacklo_epi64(s0, s1), _mm512_unpackhi_epi64(s0, s1));
    __m512i t1 = _mm512_max_epu8(_mm512_unpacklo_epi64(s2, s3), _mm512_unpackhi_epi64(s2, s3));
    /* dwords: lane l = [block l, 4+l, 8+l, 12+l] */
    __m512 f0 = _mm512_castsi512_ps(t0), f1 = _mm512_castsi512_ps(t1);
    __m512i w = _mm512_max_epu8(_mm512_castps_si512(_mm512_shuffle_ps(f0, f1, 0x88)),
                                _mm512_castps_si512(_mm512_shuffle_ps(f0, f1, 0xDD)));
    w = _mm512_max_epu8(w, _mm512_srli_epi32(w, 16));
    w = _mm512_max_epu8(w, _mm512_srli_epi32(w, 8));
    return _mm512_permutexvar_ps(_mm512_and_si512(w, _mm512_set1_epi32(15)), tab);
}

/* max |v| of one row of nb whole blocks (k % 64 == 0): max over blocks of fl(ABS_BY_RANK[max rank] * |a|),
 * exact and order-free; a non-finite absmax acts as 0. */
ORK_AVX512_TGT static float row_amax_avx512(const uint8_t *cp, const float *ab, int64_t nb) {
    const __m512i m15 = _mm512_set1_epi8(15);
    const __m512i rank = _mm512_broadcast_i32x4(_mm_setr_epi8(ORK_RANK_OF_CODE));
    const __m512 absr = _mm512_loadu_ps(ABS_BY_RANK);
    const __m512i blk_order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512 fmax = _mm512_set1_ps(FLT_MAX);
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
    __m512 vmax = _mm512_setzero_ps();
    int64_t t = 0;
    for (; t + 16 <= nb; t += 16) {
        __m512 v = absrank16(cp + 32 * t, rank, m15, absr);
        __m512 a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(ab + t)), absmask));
        a = _mm512_permutexvar_ps(blk_order, a);
        __mmask16 fin = _mm512_cmp_ps_mask(a, fmax, _CMP_LE_OQ); /* non-finite acts as 0 */
        vmax = _mm512_max_ps(vmax, _mm512_maskz_mul_ps(fin, v, a));
    }
    float amax = _mm512_reduce_max_ps(vmax);
    for (; t < nb; t++) {
        float a = ab[t];
        if (!(fabsf(a) <= FLT_MAX) || a == 0.0f) continue;
        float v = piece_amax(cp, 64 * t, 64 * t + 64, a);
        amax = v > amax ? v : amax;
    }
    return amax;
}

/* 64 int8 outputs of one block (32 code bytes at p, absmax a finite or 0, row inverse scale vinv):
 * T = cvt(fl(fl(CB * a) * inv)) in the current rounding mode (round half to even; no clamp needed,
 * |v * inv| < 127.5, see quant()), one zmm of floats narrowed to bytes (vpmovsdb) and replicated to
 * the four 128-bit lanes; the nibbles are put in element order by vpmultishiftqb and looked up by
 * vpermb (which reads only the low 6 index bits: with 4 replicas bits 4-5 do not matter). */
ORK_AVX512_TGT static inline __m512i block64_avx512(const uint8_t *p, float a, __m512 cb, __m512 vinv,
                                                    __m512i dupq, __m512i ctrl) {
    __m128i tb = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(cb, _mm512_set1_ps(a)), vinv)));
    __m512i c = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p));
    __m512i idx = _mm512_multishift_epi64_epi8(ctrl, _mm512_permutexvar_epi64(dupq, c));
    return _mm512_permutexvar_epi8(idx, _mm512_broadcast_i32x4(tb));
}

/* Row tile i (rows 32i .. 32i+31) when k % 64 == 0 and k_segment % 64 == 0 (AVX-512 VBMI). The
 * same arithmetic as the portable path (see the top of this file). Rows first get their amax and
 * scale; then, k-tile pair by k-tile pair, the 32 rows are expanded two at a time, so each 1 KiB
 * tile is written front to back in whole 64-byte lines (rows r and r+1 share a line). With `stream`
 * (a large image: see ORK_RT_STREAM_MIN) the lines go out as non-temporal stores: the NPU reads
 * them, not this CPU, and a store that misses the cache then costs no read for ownership. When the
 * destination is not 64-byte aligned (numpy's buffers are 16 past a line), each 2 KiB run of two
 * tiles is composed in an L1 buffer placed at the destination's offset within a line, and its whole
 * lines are streamed out; the m bytes that spill into the next run's first line are carried over,
 * so only the first and last partial lines of a segment's row of tiles get ordinary (masked)
 * stores. The caller issues the sfence. */
ORK_AVX512_TGT static void tile_fast_avx512(const geom_t *g, const uint8_t *codes, const float *absmax, int64_t i,
                                            int8_t *q, float *scale, int stream) {
    const int64_t r0 = i * TILE, nr = (g->n - r0) < TILE ? g->n - r0 : TILE;
    const int64_t k = g->k;
    float inv[TILE];
    for (int64_t x = 0; x < nr; x++) {
        const int64_t e0 = (r0 + x) * k;
        float amax = row_amax_avx512(codes + (e0 >> 1), absmax + (e0 >> 6), k / 64);
        scale[r0 + x] = amax / 127.0f;
        inv[x] = inv_of(amax);
    }
    const __m512 cb = _mm512_loadu_ps(CB);
    const __m512i dupq = _mm512_setr_epi64(0, 0, 1, 1, 2, 2, 3, 3);
    /* output qword j holds elements 8j..8j+7 = code bytes 4(j%2)..4(j%2)+3 of source qword j/2:
     * byte b takes the nibble at bit 8*(4(j%2) + b/2) + (b even ? 4 : 0) */
    const __m512i ctrl = _mm512_setr_epi64(0x181C1014080C0004ll, 0x383C3034282C2024ll, 0x181C1014080C0004ll,
                                           0x383C3034282C2024ll, 0x181C1014080C0004ll, 0x383C3034282C2024ll,
                                           0x181C1014080C0004ll, 0x383C3034282C2024ll);
    const __m512i lo_pair = _mm512_setr_epi64(0, 1, 2, 3, 8, 9, 10, 11);
    const __m512i hi_pair = _mm512_setr_epi64(4, 5, 6, 7, 12, 13, 14, 15);
    const int64_t cstride = k / 2, astride = k / 64;
    _Alignas(64) int8_t stage[2 * TILE * TILE + 128];
    for (int64_t s = 0; s < g->nseg; s++) {
        const int64_t k0 = s * g->kseg, w = (s == g->nseg - 1) ? g->klast : g->kseg;
        const int64_t kt = w / TILE; /* w is a multiple of 64 here */
        int8_t *base = q + s * g->np * g->kseg + (i * kt) * TILE * TILE; /* kt KiB, contiguous */
        const uint8_t *cs = codes + (r0 * k + k0) / 2;
        const float *as = absmax + (r0 * k + k0) / 64;
        const unsigned m = (unsigned)((uintptr_t)base & 63);
        const int direct_nt = stream && m == 0, staged = stream && m != 0;
        for (int64_t u = 0; u < w / 64; u++) {
            /* tiles 2u and 2u+1 are one contiguous 2 KiB run at `out`; `d` is where the rows go: `out`
             * itself, or with streaming to a misaligned `out`, the staging buffer streamed out below */
            int8_t *out = base + (2 * u) * (TILE * TILE);
            int8_t *d = staged ? stage + m : out;
            const uint8_t *cu = cs + 32 * u;
            const float *au = as + u;
            int64_t x = 0;
            for (; x + 2 <= nr; x += 2) {
                float a0 = au[x * astride], a1 = au[(x + 1) * astride];
                __m512i o0 = block64_avx512(cu + x * cstride, isfinite(a0) ? a0 : 0.0f, cb, _mm512_set1_ps(inv[x]),
                                            dupq, ctrl);
                __m512i o1 = block64_avx512(cu + (x + 1) * cstride, isfinite(a1) ? a1 : 0.0f, cb,
                                            _mm512_set1_ps(inv[x + 1]), dupq, ctrl);
                __m512i l0 = _mm512_permutex2var_epi64(o0, lo_pair, o1), l1 = _mm512_permutex2var_epi64(o0, hi_pair, o1);
                if (direct_nt) {
                    _mm512_stream_si512((void *)(d + x * TILE), l0);
                    _mm512_stream_si512((void *)(d + TILE * TILE + x * TILE), l1);
                } else {
                    _mm512_storeu_si512((void *)(d + x * TILE), l0);
                    _mm512_storeu_si512((void *)(d + TILE * TILE + x * TILE), l1);
                }
            }
            if (x < nr) { /* odd row count in the last tile */
                float a0 = au[x * astride];
                __m512i o0 = block64_avx512(cu + x * cstride, isfinite(a0) ? a0 : 0.0f, cb, _mm512_set1_ps(inv[x]),
                                            dupq, ctrl);
                _mm256_storeu_si256((__m256i *)(d + x * TILE), _mm512_castsi512_si256(o0));
                _mm256_storeu_si256((__m256i *)(d + TILE * TILE + x * TILE), _mm512_extracti64x4_epi64(o0, 1));
                x++;
            }
            for (; x < TILE; x++) { /* padding rows past n */
                memset(d + x * TILE, 0, TILE);
                memset(d + TILE * TILE + x * TILE, 0, TILE);
            }
            if (staged) {
                /* stage line 0 = m bytes carried from the previous run + this run's first 64 - m bytes;
                 * lines 1..31 are whole; bytes [2048, 2048 + m) are the next run's carry */
                int8_t *line0 = out - m;
                if (u == 0)
                    _mm512_mask_storeu_epi8(line0, ~(__mmask64)0 << m, _mm512_load_si512((const void *)stage));
                else
                    _mm512_stream_si512((void *)line0, _mm512_load_si512((const void *)stage));
                for (int l = 1; l < 2 * TILE * TILE / 64; l++)
                    _mm512_stream_si512((void *)(line0 + 64 * l), _mm512_load_si512((const void *)(stage + 64 * l)));
                _mm512_store_si512((void *)stage, _mm512_load_si512((const void *)(stage + 2 * TILE * TILE)));
            }
        }
        if (staged) /* the segment row's last m bytes */
            _mm512_mask_storeu_epi8(base + kt * TILE * TILE - m, ((__mmask64)1 << m) - 1,
                                    _mm512_load_si512((const void *)stage));
    }
}
#endif

#if defined(ORK_RT_X86)
static int have_avx512vbmi(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vbmi")) ? 1 : 0;
    }
    return cached;
}
#endif

static int best_isa(void) {
#if defined(ORK_RT_X86)
    if (have_avx512vbmi()) return ORK_RT_ISA_AVX512;
    if (have_ssse3()) return ORK_RT_ISA_SSSE3;
#endif
#if defined(__aarch64__)
    return ORK_RT_ISA_NEON;
#endif
    return ORK_RT_ISA_PORTABLE;
}

int ork_rt_isa(void) {
    if (g_force_portable) return ORK_RT_ISA_PORTABLE;
    const int best = best_isa(), cap = g_isa_cap;
    if (cap < 0 || cap >= best) return best;
    /* below the best: AVX-512 falls back to SSSE3, everything else to portable C */
    return (best == ORK_RT_ISA_AVX512 && cap >= ORK_RT_ISA_SSSE3) ? ORK_RT_ISA_SSSE3 : ORK_RT_ISA_PORTABLE;
}

int ork_rt_set_isa(int level) {
    g_isa_cap = level < 0 ? -1 : level;
    return ork_rt_isa();
}

int ork_rt_simd_level(void) {
    int isa = ork_rt_isa();
    return isa == ORK_RT_ISA_AVX512 ? 1 : isa; /* 0 portable, 1 x86 (SSSE3 or AVX-512), 2 NEON */
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
    const int isa = ork_rt_isa();
    /* fast paths: every row starts on a block boundary and every 32-column chunk sits in one block */
    const int fast = (k % 64) == 0;
#if defined(ORK_RT_X86)
    if (fast && g.kseg % 64 == 0 && isa == ORK_RT_ISA_AVX512) {
        const int stream = geom_size(&g) >= ORK_RT_STREAM_MIN;
        for (int64_t i = tile0; i < tile1; i++) tile_fast_avx512(&g, codes, absmax, i, q, scale, stream);
        if (stream) _mm_sfence(); /* order the streaming stores before whatever signals completion */
        return ORK_RT_OK;
    }
#endif
    if (fast) { /* tile order: portable C, SSSE3 or NEON */
        void (*tile_fn)(const geom_t *, const uint8_t *, const float *, int64_t, int8_t *, float *) = tile_order_portable;
#if defined(ORK_RT_X86)
        if (isa == ORK_RT_ISA_SSSE3) tile_fn = tile_order_ssse3;
#endif
#if defined(__aarch64__)
        if (isa == ORK_RT_ISA_NEON) tile_fn = tile_order_neon;
#endif
        (void)isa;
        for (int64_t i = tile0; i < tile1; i++) tile_fn(&g, codes, absmax, i, q, scale);
        return ORK_RT_OK;
    }
    /* k % 64 != 0: blocks straddle rows; row by row through a row-major buffer, portable C */
    int8_t *rowq = (int8_t *)malloc((size_t)k);
    if (!rowq) return ORK_RT_ENOMEM;
    int64_t r_end = tile1 * TILE;
    for (int64_t r = tile0 * TILE; r < r_end; r++) {
        if (r >= n) {
            zero_row(&g, q, r);
            continue;
        }
        int64_t e0 = r * k;
        float amax = row_amax(codes, absmax, e0, k);
        scale[r] = amax / 127.0f;
        float inv = inv_of(amax);
        int8_t T[16];
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

/* nf4dq (docs/FORMAT.md 3): absmax[b] = DQ_CODE[absmax_q[b]] * scale[b / 256] + offset, all float32 */
#if defined(ORK_RT_X86)
/* nf4dq whole blocks [b0, b1) into out (element 32 b0 first), AVX-512: each block's 16 values CB[c] * a in a
 * register (the same products as below), its 32 codes' nibbles the permute's indices */
ORK_AVX512_TGT static void nf4dq_blocks_avx512(const uint8_t *codes, const uint8_t *absmax_q, const float *scale,
                                               float offset, int64_t b0, int64_t b1, float *out) {
    const __m512 cb = _mm512_loadu_ps(CB);
    /* element 2i of the block is byte i's high nibble, 2i + 1 its low one: (hi, lo) interleaved */
    const __m512i ia = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i ib = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    const __m512i m15 = _mm512_set1_epi32(15);
    /* (streaming stores were tried for outputs of 4 MB and more: 2-3x into a reused buffer, but 0.7x into fresh
     * pages, numpy's np.empty, what every caller decodes into) */
    for (int64_t b = b0; b < b1; b++) {
        float code;
        memcpy(&code, &DQ_CODE_BITS[absmax_q[b]], sizeof code);
        float a = code * scale[b / ORK_NF4DQ_GROUP];
        a = a + offset;
        const __m512 t = _mm512_mul_ps(cb, _mm512_set1_ps(a));
        const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + b * (ORK_NF4DQ_BLOCK / 2))));
        const __m512i hi = _mm512_srli_epi32(d, 4), lo = _mm512_and_si512(d, m15);
        float *o = out + (b - b0) * ORK_NF4DQ_BLOCK;
        _mm512_storeu_ps(o, _mm512_permutexvar_ps(_mm512_permutex2var_epi32(hi, ia, lo), t));
        _mm512_storeu_ps(o + 16, _mm512_permutexvar_ps(_mm512_permutex2var_epi32(hi, ib, lo), t));
    }
}
#endif

int ork_rt_nf4dq_decode(const uint8_t *codes, size_t codes_size, const uint8_t *absmax_q, size_t absmax_count,
                        const float *scale, size_t scale_count, float offset, int64_t e0, int64_t e1, float *out) {
    if (e0 < 0 || e1 < e0) return ORK_RT_EARGS;
    int64_t nb = (e1 + ORK_NF4DQ_BLOCK - 1) / ORK_NF4DQ_BLOCK;
    if (codes_size < (size_t)((e1 + 1) / 2) || absmax_count < (size_t)nb ||
        scale_count < (size_t)((nb + ORK_NF4DQ_GROUP - 1) / ORK_NF4DQ_GROUP))
        return ORK_RT_EARGS;
    /* whole blocks: the block's 16 values CB[c] * a once (the same products), then a lookup per element */
    int64_t e = e0;
#if defined(ORK_RT_X86)
    const int simd = ork_rt_isa() == ORK_RT_ISA_AVX512;
#endif
    while (e < e1) {
        const int64_t b = e / ORK_NF4DQ_BLOCK;
#if defined(ORK_RT_X86)
        if (simd && e == b * ORK_NF4DQ_BLOCK && e1 / ORK_NF4DQ_BLOCK > b) { /* a run of whole blocks */
            const int64_t bend = e1 / ORK_NF4DQ_BLOCK;
            nf4dq_blocks_avx512(codes, absmax_q, scale, offset, b, bend, out + (e - e0));
            e = bend * ORK_NF4DQ_BLOCK;
            continue;
        }
#endif
        float code;
        memcpy(&code, &DQ_CODE_BITS[absmax_q[b]], sizeof code);
        float a = code * scale[b / ORK_NF4DQ_GROUP];
        a = a + offset;
        const int64_t end = (b + 1) * ORK_NF4DQ_BLOCK < e1 ? (b + 1) * ORK_NF4DQ_BLOCK : e1;
        if (e == b * ORK_NF4DQ_BLOCK && end == e + ORK_NF4DQ_BLOCK) {
            float t[16];
            for (int c = 0; c < 16; c++) t[c] = CB[c] * a;
            const uint8_t *p = codes + e / 2;
            float *o = out + (e - e0);
            for (int i = 0; i < ORK_NF4DQ_BLOCK / 2; i++) {
                o[2 * i] = t[p[i] >> 4];
                o[2 * i + 1] = t[p[i] & 15];
            }
            e = end;
            continue;
        }
        for (; e < end; e++) out[e - e0] = CB[nib(codes, e)] * a;
    }
    return ORK_RT_OK;
}

/* intdq (docs/FORMAT.md 3): a[b] = DQ_CODE[absmax_q[b]] * scale[b / 256] + offset, value = q * a, all float32;
 * q is the b-bit two's complement field at bit b e (LSB first; a field spans at most two bytes) */
int ork_rt_intdq_decode(int bits, const uint8_t *codes, size_t codes_size, const uint8_t *absmax_q,
                        size_t absmax_count, const float *scale, size_t scale_count, float offset, int64_t e0,
                        int64_t e1, float *out) {
    if ((bits != 5 && bits != 6 && bits != 8) || e0 < 0 || e1 < e0 || e1 > ((int64_t)1 << 56)) return ORK_RT_EARGS;
    const int64_t nb = (e1 + ORK_NF4DQ_BLOCK - 1) / ORK_NF4DQ_BLOCK;
    if (codes_size < (size_t)((e1 * bits + 7) / 8) || absmax_count < (size_t)nb ||
        scale_count < (size_t)((nb + ORK_NF4DQ_GROUP - 1) / ORK_NF4DQ_GROUP))
        return ORK_RT_EARGS;
    const uint32_t mask = (1u << bits) - 1u, h = 1u << (bits - 1);
    int64_t e = e0;
    while (e < e1) {
        const int64_t b = e / ORK_NF4DQ_BLOCK;
        float code;
        memcpy(&code, &DQ_CODE_BITS[absmax_q[b]], sizeof code);
        float a = code * scale[b / ORK_NF4DQ_GROUP];
        a = a + offset;
        const int64_t end = (b + 1) * ORK_NF4DQ_BLOCK < e1 ? (b + 1) * ORK_NF4DQ_BLOCK : e1;
        float *o = out + (e - e0);
        if (bits == 8) {
            for (int64_t i = e; i < end; i++) o[i - e] = (float)(int8_t)codes[i] * a;
        } else {
            for (int64_t i = e; i < end; i++) {
                const int64_t pos = i * bits;
                const int sh = (int)(pos & 7);
                uint32_t v = codes[pos >> 3];
                if (sh + bits > 8) v |= (uint32_t)codes[(pos >> 3) + 1] << 8;
                const uint32_t u = (v >> sh) & mask;
                o[i - e] = (float)((int32_t)(u ^ h) - (int32_t)h) * a;
            }
        }
        e = end;
    }
    return ORK_RT_OK;
}
