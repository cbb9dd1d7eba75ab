/* nf4opt.c: error-minimizing NF4 encode. See nf4opt.h; the definition is
 * orkpack/codecs/reference.py nf4opt_encode, mirrored here operation for operation. */
#include "codecs.h"
#include "nf4opt.h"

#include <math.h>
#include <string.h>

#define BLK 64
#define LN 16
#define TRIES 4
#define ROUNDS 2
static const float STEP = 3.0f / 64.0f;
static const float TINY = 1e-38f;

/* bitsandbytes' NF4 codebook and its float32 midpoints (as codecs.c / reference.py) */
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
#define MIDK(i, j) ((CB_##i + CB_##j) / 2.0f)
static const float MID[15] = {MIDK(0, 1), MIDK(1, 2), MIDK(2, 3), MIDK(3, 4), MIDK(4, 5),
                              MIDK(5, 6), MIDK(6, 7), MIDK(7, 8), MIDK(8, 9), MIDK(9, 10),
                              MIDK(10, 11), MIDK(11, 12), MIDK(12, 13), MIDK(13, 14), MIDK(14, 15)};

#if defined(__x86_64__) && defined(__GNUC__) && !defined(ORK_NO_X86_SIMD)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

typedef int tabs_t; /* unused */

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* the code of s: the number of midpoints strictly below s (MID is sorted) */
static inline uint8_t code_of(float s, const tabs_t *t) {
    (void)t;
    unsigned c = 0;
    for (int m = 0; m < 15; m++) c += s > MID[m];
    return (uint8_t)c;
}

/* CB[code of s], its bits built by XORs (no selects, no gather: vectorizes) */
static inline float level_of(float s, const tabs_t *t) {
    (void)t;
    uint32_t cbb = f2u(CB[0]);
    for (int m = 0; m < 15; m++) cbb ^= (0u - (uint32_t)(s > MID[m])) & (f2u(CB[m + 1]) ^ f2u(CB[m]));
    return u2f(cbb);
}

/* the reference's _lanesum: lane l = a[l] + a[16+l] + a[32+l] + a[48+l], then 0 + lane 0 + ... + lane 15 */
static inline double lanesum(const double *a) {
    double acc[LN];
    for (int l = 0; l < LN; l++) acc[l] = a[l];
    for (int g = 1; g < BLK / LN; g++)
        for (int l = 0; l < LN; l++) acc[l] += a[g * LN + l];
    double s = 0.0;
    for (int l = 0; l < LN; l++) s += acc[l];
    return s;
}

/* codes of x against d, bitsandbytes' rule (full block: x * (1/d); tail: x / d), and their levels */
static inline void codes_under(const float *x, float d, int tail, const tabs_t *t, uint8_t *c, float *q) {
    float sc[BLK];
    if (tail) {
        for (int i = 0; i < BLK; i++) sc[i] = x[i] / d;
    } else {
        const float inv = 1.0f / d;
        for (int i = 0; i < BLK; i++) sc[i] = x[i] * inv;
    }
    for (int i = 0; i < BLK; i++) c[i] = code_of(sc[i], t);
    for (int i = 0; i < BLK; i++) q[i] = level_of(sc[i], t);
}

static inline double exact_err(const float *x, const double *w, const float *q, float d) {
    double a[BLK];
    for (int i = 0; i < BLK; i++) {
        const float deq = q[i] * d;
        const double e = (double)x[i] - (double)deq;
        a[i] = w[i] * e * e;
    }
    return lanesum(a);
}

static inline void refit(const float *x, const double *w, const float *qf, double *sxq, double *sqq) {
    double a[BLK], b[BLK];
    for (int i = 0; i < BLK; i++) {
        const double q = (double)qf[i];
        a[i] = w[i] * (double)x[i] * q;
        b[i] = w[i] * q * q;
    }
    *sxq = lanesum(a);
    *sqq = lanesum(b);
}

static inline int usable(float d) {
    return d != 0.0f && isfinite(d) && isfinite(1.0f / d);
}

/* one block: x[64] (zero padded), w[64] (0 past len); writes c[64] and returns the stored absmax */
static inline float block(const float *x, const double *w, int tail, const tabs_t *t, uint8_t *best_c) {
    uint32_t mb = 0;
    for (int i = 0; i < BLK; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        u &= 0x7fffffffu;
        mb = u > mb ? u : mb;
    }
    float amax;
    memcpy(&amax, &mb, 4);
    const float dc = amax < TINY ? TINY : amax;
    float best_d = tail ? dc : amax;
    float q[BLK];
    codes_under(x, dc, tail, t, best_c, q);
    if (!(amax >= TINY)) return best_d; /* an all-zero block: bitsandbytes' */
    double best_e = exact_err(x, w, q, best_d);

    uint8_t c[BLK];
    double best_score = -1.0, dscan = 0.0;
    for (int g = 0; g < 2; g++)
    for (int j = -TRIES; j <= TRIES; j++) {
        const float inv = (g ? -1.0f : 1.0f) * (1.0f + (float)j * STEP) / amax;
        for (int i = 0; i < BLK; i++) q[i] = level_of(x[i] * inv, t);
        double sxq, sqq;
        refit(x, w, q, &sxq, &sqq);
        if (sqq > 0.0) {
            const double score = sxq * sxq / sqq;
            if (score > best_score) {
                best_score = score;
                dscan = sxq / sqq;
            }
        }
    }
    float d = (float)dscan;
    for (int r = 0; r < ROUNDS; r++) {
        if (!usable(d)) break;
        codes_under(x, d, tail, t, c, q);
        const double e = exact_err(x, w, q, d);
        if (e < best_e) {
            best_e = e;
            best_d = d;
            memcpy(best_c, c, BLK);
        }
        double sxq, sqq;
        refit(x, w, q, &sxq, &sqq);
        if (!(sqq > 0.0)) break;
        d = (float)(sxq / sqq);
    }
    return best_d;
}

CLONES
static void encode_range(const void *x, int dt, int64_t n, int64_t k, const float *col_w, int weighting,
                         int64_t b0, int64_t b1, uint8_t *codes, float *absmax, ork_codec_stats *st) {
    tabs_t t = 0;
    double ax[LN], ae[LN];
    for (int l = 0; l < LN; l++) ax[l] = ae[l] = 0.0;
    int64_t nf = 0;
    float xb[BLK];
    double w[BLK];
    uint8_t c[BLK];
    for (int64_t b = b0; b < b1; b++) {
        const int64_t off = b * BLK;
        const int len = (int)(n - off < BLK ? n - off : BLK);
        nf += ork_widen((const char *)x + off * (dt == ORK_DT_F32 ? 4 : 2), dt, len, xb);
        for (int i = 0; i < len; i++) {
            uint32_t u;
            memcpy(&u, &xb[i], 4);
            if ((u & 0x7f800000u) == 0x7f800000u) xb[i] = 0.0f;
        }
        for (int i = len; i < BLK; i++) xb[i] = 0.0f;
        int64_t col = k > 0 ? off % k : 0;
        for (int i = 0; i < BLK; i++) {
            double cw = 0.0;
            if (i < len) {
                cw = col_w ? (double)col_w[col] : 1.0;
                if (++col == k) col = 0;
            }
            w[i] = cw;
        }
        if (weighting == ORK_NF4W_X2) {
            for (int i = 0; i < BLK; i++) w[i] = w[i] * ((double)xb[i] * (double)xb[i]);
        } else if (weighting == ORK_NF4W_SIGMA) {
            double a[BLK];
            for (int i = 0; i < BLK; i++) a[i] = (double)xb[i] * (double)xb[i];
            const double sigma2 = 2.0 * lanesum(a) / 64.0;
            for (int i = 0; i < BLK; i++) w[i] = w[i] * sqrt(sigma2 + a[i]);
        }
        const float d = block(xb, w, len < BLK, &t, c);
        absmax[b] = d;
        uint8_t packed[BLK / 2];
        for (int i = 0; i < BLK / 2; i++) packed[i] = (uint8_t)((c[2 * i] << 4) | c[2 * i + 1]);
        memcpy(codes + off / 2, packed, (size_t)((len + 1) / 2));
        for (int i = 0; i < BLK; i++) {
            const float e = xb[i] - CB[c[i]] * d;
            ax[i % LN] += (double)xb[i] * (double)xb[i];
            ae[i % LN] += (double)e * (double)e;
        }
    }
    double sx = 0.0, se = 0.0;
    for (int l = 0; l < LN; l++) {
        sx += ax[l];
        se += ae[l];
    }
    st->sum_x2 = sx;
    st->sum_err2 = se;
    st->nonfinite = nf;
}

void ork_nf4opt_encode(const void *x, int dtype, int64_t n, int64_t k, const float *col_w, int weighting,
                       int64_t b0, int64_t b1, uint8_t *codes, float *absmax, ork_codec_stats *stats) {
    encode_range(x, dtype, n, k, col_w, weighting, b0, b1, codes, absmax, stats);
}
