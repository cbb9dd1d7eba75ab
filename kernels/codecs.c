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

#include "nf4_codebook.h"

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

/* ------------------------------------------------------------------ NF4 code by bins
 *
 * The fast paths find a code without 15 compares. bin(s) = (int)((s * 15.5f) + 16.0f)
 * (float32 operations) is a non-decreasing function of s, in [0, 31] for |s| <= 1.03
 * (every scaled value: |s| <= 1 + 2^-23). For each bin v, with bin(MID[k]) computed by
 * the same arithmetic:
 *   BIN_BASE[v] = number of midpoints k with bin(MID[k]) < v   (all of them are < s)
 *   BIN_MID[v]  = the midpoint with bin(MID[k]) == v, or 2.0f if there is none
 * Midpoints with bin(MID[k]) > v are > s. So for bin(s) == v, the code (the number of
 * midpoints strictly below s) is BIN_BASE[v] + (s > BIN_MID[v]): the last decision is
 * always a float32 compare with the true midpoint, hence bit-identical. It needs at most
 * one midpoint per bin (bins are 1/15.5 wide, midpoints at least 0.08 apart): checked
 * when the tables are built; if it ever failed, the fast paths are not used. */
#define BIN_SCALE 15.5f
#define BIN_OFF 16.0f
#define NBINS 32
static float BIN_MID[NBINS];
static int32_t BIN_BASE[NBINS];
static int bins_state = 0; /* 0: not built, 1: built and valid, -1: invalid (fast paths off) */

AI int nf4_bin(float s) { return (int)((s * BIN_SCALE) + BIN_OFF); }

static void nf4_bins_init(void) {
    if (bins_state) return;
    int bk[15], ok = 1;
    for (int k = 0; k < 15; k++) bk[k] = nf4_bin(MID[k]);
    for (int v = 0; v < NBINS; v++) {
        int base = 0, hits = 0;
        float m = 2.0f;
        for (int k = 0; k < 15; k++) {
            base += bk[k] < v;
            if (bk[k] == v) { m = MID[k]; hits++; }
        }
        ok &= hits <= 1;
        BIN_BASE[v] = base;
        BIN_MID[v] = m;
    }
    for (int k = 0; k < 15; k++) ok &= bk[k] >= 0 && bk[k] < NBINS;
    ok &= nf4_bin(-1.03f) >= 0 && nf4_bin(1.03f) < NBINS;
    bins_state = ok ? 1 : -1;
}

int ork_nf4_bin_tables(const float **mid, const int32_t **base) {
    nf4_bins_init();
    *mid = BIN_MID;
    *base = BIN_BASE;
    return bins_state;
}

/* Hand the vector accumulators' stats to the generic block code (tail block, or a block
 * with a non-finite value) and back: lane j of the generic code is element j mod 16. */
AI void nf4_generic_block(const void *x, int dt, int64_t n, int64_t b, uint8_t *codes, float *absmax,
                          double *ax, double *ae, int64_t *nf) {
    const int64_t off = b * NF4_BLOCK;
    const int len = (int)(n - off < NF4_BLOCK ? n - off : NF4_BLOCK);
    float buf[NF4_BLOCK];
    *nf += load_run(x, off, len, NF4_BLOCK, dt, buf);
    nf4_block(buf, len, len < NF4_BLOCK, codes + off / 2, absmax + b, ax, ae);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(ORK_NO_X86_SIMD) /* -DORK_NO_X86_SIMD: portable only */
#define ORK_HAVE_X86 1
#include <immintrin.h>
#ifdef __clang__
#define ORK_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx2"
#else /* GCC: use the full 512-bit width (its default tuning may prefer 256) */
#define ORK_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx2,prefer-vector-width=512"
#endif
#define T512 __attribute__((target(ORK_AVX512_TARGET)))

/* AVX-512 NF4 encode. A block of 64 is held as four vectors of 16: the even and the odd
 * elements of each half (E0, O0, E1, O1), so that a byte of codes is (E << 4) | O and a
 * bf16 pair is widened by one shift and one mask. Stats: the generic code's lane j
 * (element j mod 16) is lane j/2 of the E accumulator (j even) or of the O accumulator
 * (j odd); within a lane the elements are added in the same order (2q, 16 + 2q, ...). */
typedef struct { __m512d xe, xo, ee, eo; } acc512;

AI T512 void acc512_to(const acc512 *a, double *ax, double *ae) {
    double t[4][8];
    _mm512_storeu_pd(t[0], a->xe); _mm512_storeu_pd(t[1], a->xo);
    _mm512_storeu_pd(t[2], a->ee); _mm512_storeu_pd(t[3], a->eo);
    for (int q = 0; q < 8; q++) {
        ax[2 * q] = t[0][q]; ax[2 * q + 1] = t[1][q];
        ae[2 * q] = t[2][q]; ae[2 * q + 1] = t[3][q];
    }
}

AI T512 void acc512_from(acc512 *a, const double *ax, const double *ae) {
    double t[4][8];
    for (int q = 0; q < 8; q++) {
        t[0][q] = ax[2 * q]; t[1][q] = ax[2 * q + 1];
        t[2][q] = ae[2 * q]; t[3][q] = ae[2 * q + 1];
    }
    a->xe = _mm512_loadu_pd(t[0]); a->xo = _mm512_loadu_pd(t[1]);
    a->ee = _mm512_loadu_pd(t[2]); a->eo = _mm512_loadu_pd(t[3]);
}

/* acc lanes q += v[q]^2 then += v[8 + q]^2 (elements 2q and 16 + 2q of this parity) */
AI T512 __m512d sq_add512(__m512d acc, __m512 v) {
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
    acc = _mm512_add_pd(acc, _mm512_mul_pd(lo, lo));
    return _mm512_add_pd(acc, _mm512_mul_pd(hi, hi));
}

/* 32 elements at p (dtype dt) as their even and odd elements, widened exactly */
AI T512 void load32_eo(const void *p, int dt, __m512 *e, __m512 *o) {
    if (dt == ORK_DT_BF16) {
        const __m512i d = _mm512_loadu_si512(p);
        *e = _mm512_castsi512_ps(_mm512_slli_epi32(d, 16));
        *o = _mm512_castsi512_ps(_mm512_and_si512(d, _mm512_set1_epi32((int)0xffff0000u)));
        return;
    }
    __m512 a, b;
    if (dt == ORK_DT_F16) {
        a = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        b = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p + 1));
    } else {
        a = _mm512_loadu_ps((const float *)p);
        b = _mm512_loadu_ps((const float *)p + 16);
    }
    const __m512i ie = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i io = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    *e = _mm512_permutex2var_ps(a, ie, b);
    *o = _mm512_permutex2var_ps(a, io, b);
}

typedef struct { __m512 mlo, mhi, cb; __m512i blo, bhi; } nf4_tabs512;

/* codes of 16 values v (full block: s = v * inv); err^2 and x^2 go to the accumulators */
AI T512 __m512i code16(__m512 v, __m512 inv, __m512 stored, const nf4_tabs512 *t, __m512d *ax, __m512d *ae) {
    const __m512 s = _mm512_mul_ps(v, inv);
    const __m512i bin = _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(s, _mm512_set1_ps(BIN_SCALE)),
                                                          _mm512_set1_ps(BIN_OFF)));
    const __m512 m = _mm512_permutex2var_ps(t->mlo, bin, t->mhi);
    const __m512i base = _mm512_permutex2var_epi32(t->blo, bin, t->bhi);
    const __mmask16 gt = _mm512_cmp_ps_mask(s, m, _CMP_GT_OQ);
    const __m512i code = _mm512_mask_add_epi32(base, gt, base, _mm512_set1_epi32(1));
    const __m512 deq = _mm512_mul_ps(_mm512_permutexvar_ps(code, t->cb), stored);
    const __m512 e = _mm512_sub_ps(v, deq);
    *ax = sq_add512(*ax, v);
    *ae = sq_add512(*ae, e);
    return code;
}

AI T512 void nf4_encode_fast512(const void *x, int dt, int64_t n, int64_t b0, int64_t b1,
                                uint8_t *codes, float *absmax, ork_codec_stats *st) {
    const int esz = dt == ORK_DT_F32 ? 4 : 2;
    const int64_t full = n / NF4_BLOCK;
    nf4_tabs512 t;
    t.mlo = _mm512_loadu_ps(BIN_MID); t.mhi = _mm512_loadu_ps(BIN_MID + 16);
    t.blo = _mm512_loadu_si512(BIN_BASE); t.bhi = _mm512_loadu_si512(BIN_BASE + 16);
    t.cb = _mm512_loadu_ps(CB);
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
    acc512 a;
    a.xe = a.xo = a.ee = a.eo = _mm512_setzero_pd();
    int64_t nf = 0;
    double ax[LANES], ae[LANES];
    for (int64_t b = b0; b < b1; b++) {
        const char *p = (const char *)x + b * NF4_BLOCK * esz;
        __m512 e0, o0, e1, o1;
        int fast = b < full;
        if (fast) {
            load32_eo(p, dt, &e0, &o0);
            load32_eo(p + 32 * esz, dt, &e1, &o1);
            const __m512i m = _mm512_max_epu32(
                _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(e0), absmask),
                                 _mm512_and_si512(_mm512_castps_si512(o0), absmask)),
                _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(e1), absmask),
                                 _mm512_and_si512(_mm512_castps_si512(o1), absmask)));
            const uint32_t mb = _mm512_reduce_max_epu32(m);
            if (mb < 0x7f800000u) { /* all finite */
                const float amax = bits2f(mb);
                const float d = amax < NF4_TINY ? NF4_TINY : amax;
                const __m512 inv = _mm512_set1_ps(1.0f / d), stored = _mm512_set1_ps(amax);
                const __m512i c0 = code16(e0, inv, stored, &t, &a.xe, &a.ee);
                const __m512i c1 = code16(o0, inv, stored, &t, &a.xo, &a.eo);
                const __m512i c2 = code16(e1, inv, stored, &t, &a.xe, &a.ee);
                const __m512i c3 = code16(o1, inv, stored, &t, &a.xo, &a.eo);
                uint8_t *out = codes + b * (NF4_BLOCK / 2);
                _mm_storeu_si128((__m128i *)out, _mm512_cvtepi32_epi8(_mm512_or_si512(_mm512_slli_epi32(c0, 4), c1)));
                _mm_storeu_si128((__m128i *)(out + 16),
                                 _mm512_cvtepi32_epi8(_mm512_or_si512(_mm512_slli_epi32(c2, 4), c3)));
                absmax[b] = amax;
                continue;
            }
        }
        acc512_to(&a, ax, ae); /* tail block or a non-finite value: the generic code */
        nf4_generic_block(x, dt, n, b, codes, absmax, ax, ae, &nf);
        acc512_from(&a, ax, ae);
    }
    acc512_to(&a, ax, ae);
    st->sum_x2 = fold(ax);
    st->sum_err2 = fold(ae);
    st->nonfinite = nf;
}

/* AVX2 (+F16C) NF4 encode: the same layout, 8 lanes, the code by a binary search (AVX2 has
 * no 32-entry permute for the bin tables). A block is four groups of 16; each
 * group is held as its 8 even and 8 odd elements. Stats: generic lane j (element j mod 16)
 * is lane (j mod 8) / 2 of accumulator [j odd][j >= 8]; the order within a lane is kept. */
#define T256 __attribute__((target("avx2,f16c")))
typedef struct { __m256d x[2][2], e[2][2]; } acc256; /* [parity][high half] */

AI T256 void acc256_to(const acc256 *a, double *ax, double *ae) {
    double t[2][2][2][4];
    for (int par = 0; par < 2; par++)
        for (int h = 0; h < 2; h++) {
            _mm256_storeu_pd(t[0][par][h], a->x[par][h]);
            _mm256_storeu_pd(t[1][par][h], a->e[par][h]);
        }
    for (int par = 0; par < 2; par++)
        for (int h = 0; h < 2; h++)
            for (int q = 0; q < 4; q++) {
                ax[8 * h + 2 * q + par] = t[0][par][h][q];
                ae[8 * h + 2 * q + par] = t[1][par][h][q];
            }
}

AI T256 void acc256_from(acc256 *a, const double *ax, const double *ae) {
    double t[2][2][2][4];
    for (int par = 0; par < 2; par++)
        for (int h = 0; h < 2; h++)
            for (int q = 0; q < 4; q++) {
                t[0][par][h][q] = ax[8 * h + 2 * q + par];
                t[1][par][h][q] = ae[8 * h + 2 * q + par];
            }
    for (int par = 0; par < 2; par++)
        for (int h = 0; h < 2; h++) {
            a->x[par][h] = _mm256_loadu_pd(t[0][par][h]);
            a->e[par][h] = _mm256_loadu_pd(t[1][par][h]);
        }
}

AI T256 void sq_add256(__m256d *acc, __m256 v) {
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    acc[0] = _mm256_add_pd(acc[0], _mm256_mul_pd(lo, lo));
    acc[1] = _mm256_add_pd(acc[1], _mm256_mul_pd(hi, hi));
}

/* 16 elements at p as their even and odd elements, widened exactly */
AI T256 void load16_eo(const void *p, int dt, __m256 *e, __m256 *o) {
    if (dt == ORK_DT_BF16) {
        const __m256i d = _mm256_loadu_si256((const __m256i *)p);
        *e = _mm256_castsi256_ps(_mm256_slli_epi32(d, 16));
        *o = _mm256_castsi256_ps(_mm256_and_si256(d, _mm256_set1_epi32((int)0xffff0000u)));
        return;
    }
    __m256 a, b;
    if (dt == ORK_DT_F16) {
        a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p + 1));
    } else {
        a = _mm256_loadu_ps((const float *)p);
        b = _mm256_loadu_ps((const float *)p + 8);
    }
    /* per 128-bit lane [a0 a2 b0 b2 | a4 a6 b4 b6], then the middle 64-bit pairs swapped */
    *e = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
    *o = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
}

/* codes of 8 values v (s = v * inv) by a branch-free binary search over the sorted midpoints:
 * four float32 compares with true midpoints (the 8 entries tables hold MID[1 + 4i], MID[2i]) */
AI T256 __m256i code8(__m256 v, __m256 inv, __m256 stored, const __m256 *tab, __m256d *ax, __m256d *ae) {
    const __m256 s = _mm256_mul_ps(v, inv);
    __m256 g = _mm256_cmp_ps(s, _mm256_set1_ps(MID[7]), _CMP_GT_OQ);
    __m256i c = _mm256_and_si256(_mm256_castps_si256(g), _mm256_set1_epi32(8));
    g = _mm256_cmp_ps(s, _mm256_blendv_ps(_mm256_set1_ps(MID[3]), _mm256_set1_ps(MID[11]), g), _CMP_GT_OQ);
    c = _mm256_or_si256(c, _mm256_and_si256(_mm256_castps_si256(g), _mm256_set1_epi32(4)));
    g = _mm256_cmp_ps(s, _mm256_permutevar8x32_ps(tab[2], _mm256_srli_epi32(c, 2)), _CMP_GT_OQ);
    c = _mm256_or_si256(c, _mm256_and_si256(_mm256_castps_si256(g), _mm256_set1_epi32(2)));
    g = _mm256_cmp_ps(s, _mm256_permutevar8x32_ps(tab[3], _mm256_srli_epi32(c, 1)), _CMP_GT_OQ);
    c = _mm256_sub_epi32(c, _mm256_castps_si256(g));
    const __m256 cb = _mm256_blendv_ps(_mm256_permutevar8x32_ps(tab[0], c), _mm256_permutevar8x32_ps(tab[1], c),
                                       _mm256_castsi256_ps(_mm256_slli_epi32(c, 28)));
    const __m256 e = _mm256_sub_ps(v, _mm256_mul_ps(cb, stored));
    sq_add256(ax, v);
    sq_add256(ae, e);
    return c;
}

AI T256 void nf4_encode_fast256(const void *x, int dt, int64_t n, int64_t b0, int64_t b1,
                                uint8_t *codes, float *absmax, ork_codec_stats *st) {
    const int esz = dt == ORK_DT_F32 ? 4 : 2;
    const int64_t full = n / NF4_BLOCK;
    const __m256 tab[4] = {_mm256_loadu_ps(CB), _mm256_loadu_ps(CB + 8),
                           _mm256_setr_ps(MID[1], MID[5], MID[9], MID[13], 2.0f, 2.0f, 2.0f, 2.0f),
                           _mm256_setr_ps(MID[0], MID[2], MID[4], MID[6], MID[8], MID[10], MID[12], MID[14])};
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    acc256 a;
    for (int par = 0; par < 2; par++)
        for (int h = 0; h < 2; h++) a.x[par][h] = a.e[par][h] = _mm256_setzero_pd();
    int64_t nf = 0;
    double ax[LANES], ae[LANES];
    for (int64_t b = b0; b < b1; b++) {
        const char *p = (const char *)x + b * NF4_BLOCK * esz;
        if (b < full) {
            __m256 e[4], o[4];
            __m256i m = _mm256_setzero_si256();
            for (int g = 0; g < 4; g++) {
                load16_eo(p + 16 * g * esz, dt, &e[g], &o[g]);
                m = _mm256_max_epu32(m, _mm256_max_epu32(_mm256_and_si256(_mm256_castps_si256(e[g]), absmask),
                                                         _mm256_and_si256(_mm256_castps_si256(o[g]), absmask)));
            }
            m = _mm256_max_epu32(m, _mm256_permute2x128_si256(m, m, 1));
            m = _mm256_max_epu32(m, _mm256_shuffle_epi32(m, 0x4E));
            m = _mm256_max_epu32(m, _mm256_shuffle_epi32(m, 0xB1));
            const uint32_t mb = (uint32_t)_mm256_cvtsi256_si32(m);
            if (mb < 0x7f800000u) { /* all finite */
                const float amax = bits2f(mb);
                const float d = amax < NF4_TINY ? NF4_TINY : amax;
                const __m256 inv = _mm256_set1_ps(1.0f / d), stored = _mm256_set1_ps(amax);
                __m256i pk[4];
                for (int g = 0; g < 4; g++) {
                    const __m256i ce = code8(e[g], inv, stored, tab, a.x[0], a.e[0]);
                    const __m256i co = code8(o[g], inv, stored, tab, a.x[1], a.e[1]);
                    pk[g] = _mm256_or_si256(_mm256_slli_epi32(ce, 4), co);
                }
                const __m256i by = _mm256_packus_epi16(_mm256_packus_epi32(pk[0], pk[1]),
                                                       _mm256_packus_epi32(pk[2], pk[3]));
                _mm256_storeu_si256((__m256i *)(codes + b * (NF4_BLOCK / 2)),
                                    _mm256_permutevar8x32_epi32(by, order));
                absmax[b] = amax;
                continue;
            }
        }
        acc256_to(&a, ax, ae); /* tail block or a non-finite value: the generic code */
        nf4_generic_block(x, dt, n, b, codes, absmax, ax, ae, &nf);
        acc256_from(&a, ax, ae);
    }
    acc256_to(&a, ax, ae);
    st->sum_x2 = fold(ax);
    st->sum_err2 = fold(ae);
    st->nonfinite = nf;
}

/* ------------------------------------------------------------------ int8 encode, SIMD
 *
 * The generic int8_encode_body's arithmetic, vectorized: pass 1 the row's absmax from the
 * finite values' bit patterns (non-finite counted and taken as 0), pass 2 each 32-column
 * run: v = x * inv, (v + 1.5*2^23) - 1.5*2^23, clamped to [-127, 127] on the integer,
 * e = x - q * sc. Stats: the generic code's lane l (column l of a run) is lane l mod 8 of
 * double accumulator l / 8 (AVX-512) or l / 4 (AVX2), summed in the same order (row by
 * row, run by run), folded lane 0..31: the sums are the generic code's, bit for bit.
 * Columns past a run's end are zeros, as the generic code pads them (they add +0.0). */

AI T512 __m512 i8_load16_512(const void *x, int dt, int64_t off, __mmask16 m) {
    if (dt == ORK_DT_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)x + off)), 16));
    if (dt == ORK_DT_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)x + off));
    return _mm512_maskz_loadu_ps(m, (const float *)x + off);
}

AI T512 __mmask16 i8_mask16(int64_t len) {
    return len >= 16 ? (__mmask16)0xffff : len <= 0 ? (__mmask16)0 : (__mmask16)((1u << len) - 1u);
}

AI T512 void int8_encode_fast512(const void *x, int dt, int64_t N, int64_t K, int64_t r0, int64_t r1,
                                 int64_t kseg, int8_t *q, float *scale, ork_codec_stats *st) {
    __m512d ax[4], ae[4];
    for (int i = 0; i < 4; i++) ax[i] = ae[i] = _mm512_setzero_pd();
    int64_t nf = 0;
    const int64_t Np = (N + 31) / 32 * 32;
    const int64_t nseg = kseg > 0 ? (K + kseg - 1) / kseg : 1;
    const int64_t segw = kseg > 0 ? kseg : K;
    const __m512i expm = _mm512_set1_epi32(0x7f800000), absm = _mm512_set1_epi32(0x7fffffff);
    const __m512i lo127 = _mm512_set1_epi32(-127), hi127 = _mm512_set1_epi32(127);
    const __m512 magic = _mm512_set1_ps(ROUND_MAGIC);
    for (int64_t r = r0; r < r1; r++) {
        if (r >= N) { /* NPU padding row */
            for (int64_t s = 0; s < nseg; s++) {
                const int64_t w = K - s * segw < segw ? K - s * segw : segw;
                for (int64_t j = 0; j * RUN < w; j++) memset(q + tiled_offset(r, s, j, Np, K, kseg), 0, RUN);
            }
            continue;
        }
        const int64_t roff = r * K;
        __m512i m = _mm512_setzero_si512();
        for (int64_t c = 0; c < K; c += 16) {
            const __m512i v = _mm512_castps_si512(i8_load16_512(x, dt, roff + c, i8_mask16(K - c)));
            const __mmask16 bad = _mm512_cmpeq_epi32_mask(_mm512_and_si512(v, expm), expm);
            nf += __builtin_popcount((unsigned)bad);
            m = _mm512_max_epu32(m, _mm512_maskz_and_epi32((__mmask16)~bad, v, absm));
        }
        const float amax = bits2f((uint32_t)_mm512_reduce_max_epu32(m));
        const float sc = amax / 127.0f;
        float inv = 127.0f / amax;
        inv = amax == 0.0f ? 0.0f : (inv > FLT_MAX ? FLT_MAX : inv);
        scale[r] = sc;
        const __m512 vinv = _mm512_set1_ps(inv), vsc = _mm512_set1_ps(sc);
        for (int64_t s = 0; s < nseg; s++) {
            const int64_t k0 = s * segw;
            const int64_t w = K - k0 < segw ? K - k0 : segw;
            for (int64_t j = 0; j * RUN < w; j++) {
                const int64_t len = w - j * RUN < RUN ? w - j * RUN : RUN;
                __m128i qb[2];
                for (int h = 0; h < 2; h++) {
                    __m512 xv = i8_load16_512(x, dt, roff + k0 + j * RUN + 16 * h, i8_mask16(len - 16 * h));
                    const __mmask16 bad = _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(xv), expm), expm);
                    xv = _mm512_maskz_mov_ps((__mmask16)~bad, xv);
                    const __m512 v = _mm512_mul_ps(xv, vinv);
                    __m512i qi = _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_add_ps(v, magic), magic));
                    qi = _mm512_max_epi32(_mm512_min_epi32(qi, hi127), lo127);
                    const __m512 e = _mm512_sub_ps(xv, _mm512_mul_ps(_mm512_cvtepi32_ps(qi), vsc));
                    const __m512d xl = _mm512_cvtps_pd(_mm512_castps512_ps256(xv));
                    const __m512d xh = _mm512_cvtps_pd(_mm512_extractf32x8_ps(xv, 1));
                    const __m512d el = _mm512_cvtps_pd(_mm512_castps512_ps256(e));
                    const __m512d eh = _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1));
                    ax[2 * h] = _mm512_add_pd(ax[2 * h], _mm512_mul_pd(xl, xl));
                    ax[2 * h + 1] = _mm512_add_pd(ax[2 * h + 1], _mm512_mul_pd(xh, xh));
                    ae[2 * h] = _mm512_add_pd(ae[2 * h], _mm512_mul_pd(el, el));
                    ae[2 * h + 1] = _mm512_add_pd(ae[2 * h + 1], _mm512_mul_pd(eh, eh));
                    qb[h] = _mm512_cvtepi32_epi8(qi);
                }
                if (kseg > 0) {
                    int8_t *d = q + tiled_offset(r, s, j, Np, K, kseg);
                    _mm_storeu_si128((__m128i *)d, qb[0]);
                    _mm_storeu_si128((__m128i *)(d + 16), qb[1]);
                } else {
                    int8_t *d = q + roff + j * RUN;
                    _mm_mask_storeu_epi8(d, i8_mask16(len), qb[0]);
                    _mm_mask_storeu_epi8(d + 16, i8_mask16(len - 16), qb[1]);
                }
            }
        }
    }
    double tx[I8_LANES], te[I8_LANES];
    for (int i = 0; i < 4; i++) {
        _mm512_storeu_pd(tx + 8 * i, ax[i]);
        _mm512_storeu_pd(te + 8 * i, ae[i]);
    }
    st->sum_x2 = fold32(tx);
    st->sum_err2 = fold32(te);
    st->nonfinite = nf;
}

/* AVX2: 8 values at p, widened exactly (dt F32 for a zero-padded float buffer) */
AI T256 __m256 i8_load8_256(const void *p, int dt) {
    if (dt == ORK_DT_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    if (dt == ORK_DT_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    return _mm256_loadu_ps((const float *)p);
}

AI T256 void int8_encode_fast256(const void *x, int dt, int64_t N, int64_t K, int64_t r0, int64_t r1,
                                 int64_t kseg, int8_t *q, float *scale, ork_codec_stats *st) {
    __m256d ax[8], ae[8];
    for (int i = 0; i < 8; i++) ax[i] = ae[i] = _mm256_setzero_pd();
    int64_t nf = 0;
    const int esz = dt == ORK_DT_F32 ? 4 : 2;
    const int64_t Np = (N + 31) / 32 * 32;
    const int64_t nseg = kseg > 0 ? (K + kseg - 1) / kseg : 1;
    const int64_t segw = kseg > 0 ? kseg : K;
    const __m256i expm = _mm256_set1_epi32(0x7f800000), absm = _mm256_set1_epi32(0x7fffffff);
    const __m256i lo127 = _mm256_set1_epi32(-127), hi127 = _mm256_set1_epi32(127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256 magic = _mm256_set1_ps(ROUND_MAGIC);
    float buf[RUN];
    for (int64_t r = r0; r < r1; r++) {
        if (r >= N) { /* NPU padding row */
            for (int64_t s = 0; s < nseg; s++) {
                const int64_t w = K - s * segw < segw ? K - s * segw : segw;
                for (int64_t j = 0; j * RUN < w; j++) memset(q + tiled_offset(r, s, j, Np, K, kseg), 0, RUN);
            }
            continue;
        }
        const int64_t roff = r * K;
        const char *row = (const char *)x + roff * esz;
        __m256i m = _mm256_setzero_si256();
        int64_t c = 0;
        for (; c + 8 <= K; c += 8) {
            const __m256i v = _mm256_castps_si256(i8_load8_256(row + c * esz, dt));
            const __m256i bad = _mm256_cmpeq_epi32(_mm256_and_si256(v, expm), expm);
            nf += __builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(bad)));
            m = _mm256_max_epu32(m, _mm256_andnot_si256(bad, _mm256_and_si256(v, absm)));
        }
        uint32_t mt[8];
        _mm256_storeu_si256((__m256i *)mt, m);
        uint32_t mb = 0;
        for (int i = 0; i < 8; i++) mb = mt[i] > mb ? mt[i] : mb;
        if (c < K) {
            nf += load_run(x, roff + c, (int)(K - c), (int)(K - c), dt, buf);
            const uint32_t a = f2bits(absmax_of(buf, (int)(K - c)));
            mb = a > mb ? a : mb;
        }
        const float amax = bits2f(mb);
        const float sc = amax / 127.0f;
        float inv = 127.0f / amax;
        inv = amax == 0.0f ? 0.0f : (inv > FLT_MAX ? FLT_MAX : inv);
        scale[r] = sc;
        const __m256 vinv = _mm256_set1_ps(inv), vsc = _mm256_set1_ps(sc);
        for (int64_t s = 0; s < nseg; s++) {
            const int64_t k0 = s * segw;
            const int64_t w = K - k0 < segw ? K - k0 : segw;
            for (int64_t j = 0; j * RUN < w; j++) {
                const int len = (int)(w - j * RUN < RUN ? w - j * RUN : RUN);
                const void *p = row + (k0 + j * RUN) * esz;
                int pdt = dt;
                if (len < RUN) { /* a short run: widened into a zero-padded buffer (non-finite as 0) */
                    load_run(x, roff + k0 + j * RUN, len, RUN, dt, buf);
                    p = buf;
                    pdt = ORK_DT_F32;
                }
                __m256i qi[4];
                for (int g = 0; g < 4; g++) {
                    __m256 xv = i8_load8_256((const char *)p + g * 8 * (pdt == ORK_DT_F32 ? 4 : 2), pdt);
                    const __m256i bad = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(xv), expm), expm);
                    xv = _mm256_andnot_ps(_mm256_castsi256_ps(bad), xv);
                    const __m256 v = _mm256_mul_ps(xv, vinv);
                    __m256i t = _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(v, magic), magic));
                    t = _mm256_max_epi32(_mm256_min_epi32(t, hi127), lo127);
                    qi[g] = t;
                    const __m256 e = _mm256_sub_ps(xv, _mm256_mul_ps(_mm256_cvtepi32_ps(t), vsc));
                    const __m256d xl = _mm256_cvtps_pd(_mm256_castps256_ps128(xv));
                    const __m256d xh = _mm256_cvtps_pd(_mm256_extractf128_ps(xv, 1));
                    const __m256d el = _mm256_cvtps_pd(_mm256_castps256_ps128(e));
                    const __m256d eh = _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1));
                    ax[2 * g] = _mm256_add_pd(ax[2 * g], _mm256_mul_pd(xl, xl));
                    ax[2 * g + 1] = _mm256_add_pd(ax[2 * g + 1], _mm256_mul_pd(xh, xh));
                    ae[2 * g] = _mm256_add_pd(ae[2 * g], _mm256_mul_pd(el, el));
                    ae[2 * g + 1] = _mm256_add_pd(ae[2 * g + 1], _mm256_mul_pd(eh, eh));
                }
                const __m256i by = _mm256_permutevar8x32_epi32(
                    _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3])), order);
                if (kseg > 0) {
                    _mm256_storeu_si256((__m256i *)(q + tiled_offset(r, s, j, Np, K, kseg)), by);
                } else if (len == RUN) {
                    _mm256_storeu_si256((__m256i *)(q + roff + j * RUN), by);
                } else {
                    int8_t qb[RUN];
                    _mm256_storeu_si256((__m256i *)qb, by);
                    memcpy(q + roff + j * RUN, qb, (size_t)len);
                }
            }
        }
    }
    double tx[I8_LANES], te[I8_LANES];
    for (int i = 0; i < 8; i++) {
        _mm256_storeu_pd(tx + 4 * i, ax[i]);
        _mm256_storeu_pd(te + 4 * i, ae[i]);
    }
    st->sum_x2 = fold32(tx);
    st->sum_err2 = fold32(te);
    st->nonfinite = nf;
}
#endif

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

/* NF4E / I8E: the NF4 / int8 encode body of this level (nf4_encode_body, int8_encode_body: generic) */
#define INSTANCE(SUF, ATTR, NF4E, I8E)                                                                      \
    ATTR static void nf4_encode_##SUF(const void *x, int dt, int64_t n, int64_t b0, int64_t b1,        \
                                      uint8_t *codes, float *absmax, ork_codec_stats *st) {             \
        if (bins_state == 1) { DT_SWITCH(dt, NF4E) } else { DT_SWITCH(dt, NF4E_CALL) }                  \
    }                                                                                                    \
    ATTR static void nf4_decode_##SUF(const uint8_t *codes, const float *absmax, int64_t n, int64_t b0, \
                                      int64_t b1, float *out) {                                         \
        nf4_decode_body(codes, absmax, n, b0, b1, out);                                                  \
    }                                                                                                    \
    ATTR static void int8_encode_##SUF(const void *x, int dt, int64_t N, int64_t K, int64_t r0,        \
                                       int64_t r1, int64_t kseg, int8_t *q, float *scale,               \
                                       ork_codec_stats *st) {                                            \
        DT_SWITCH(dt, I8E)                                                                               \
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
#define NF4E256_CALL(T) nf4_encode_fast256(x, T, n, b0, b1, codes, absmax, st)
#define NF4E512_CALL(T) nf4_encode_fast512(x, T, n, b0, b1, codes, absmax, st)
#define I8E_CALL(T) int8_encode_body(x, T, N, K, r0, r1, kseg, q, scale, st)
#define I8E256_CALL(T) int8_encode_fast256(x, T, N, K, r0, r1, kseg, q, scale, st)
#define I8E512_CALL(T) int8_encode_fast512(x, T, N, K, r0, r1, kseg, q, scale, st)
#define WIDEN_CALL(T) r = widen_body(x, T, n, out)

INSTANCE(portable, , NF4E_CALL, I8E_CALL)

#ifdef ORK_HAVE_X86
INSTANCE(avx2, T256, NF4E256_CALL, I8E256_CALL)
INSTANCE(avx512, T512, NF4E512_CALL, I8E512_CALL)
#endif

static const ork_codec_impl *impl = 0;
static int impl_level = -1;

static int best_level(void) {
#ifdef ORK_HAVE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return ORK_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) return ORK_ISA_AVX2;
#endif
    return ORK_ISA_PORTABLE;
}

int ork_codecs_set_isa(int level) {
    nf4_bins_init();
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
