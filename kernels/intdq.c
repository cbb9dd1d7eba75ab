/* intdq.c: the int5dq / int6dq / int8dq encoders (see intdq.h; the definition is orkpack/codecs/reference.py
 * intdq_encode, mirrored here operation for operation).
 *
 * Layout: G = 16 blocks at a time, one per lane (x[i][l] is element i of block l), so every per-block sum runs
 * in element order inside its own lane and the loops over l are plain lane-wise arithmetic that GCC vectorizes
 * at any SIMD width (x86 SSE2/AVX, aarch64 NEON) without changing a result. Rounding half to even is
 * (v + 1.5 * 2^23) - 1.5 * 2^23 after the clamp to [LO, HI] (|v| <= 128; -ffp-contract=off, no -ffast-math),
 * which equals np.rint there.
 */
#include "codecs.h"
#include "intdq.h"
#include "nf4dq_code.h"
#include "nf4opt.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define B 32
#define G 16
#define TRIES 4                /* reference.INTDQ_TRIES */
static const float STEP = 0.25f; /* reference.INTDQ_STEP */
static const int DQ_CAND[3] = {0, -1, 1}; /* reference.NF4DQ_CANDIDATES */
static const float RND = 12582912.0f;    /* 1.5 * 2^23 */

typedef struct {
    float x[B][G];  /* the values (non-finite as 0, padding 0) */
    float wf[B][G]; /* float32 weights (padding 0) */
    float wx[B][G]; /* wf * x */
    int nb;         /* live lanes */
} lanes;

static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline int finite_f(float v) { return fabsf(v) <= FLT_MAX; }

/* the scan's (s, L) per b (reference.INTDQ_SCAN): L = HI ("hi") or -LO ("lo") */
static void scan_of(int bits, int *s, int *lo, int *hi) {
    const int h = 1 << (bits - 1);
    *lo = -h;
    *hi = h - 1;
    s[0] = 1;                     /* (+1, HI) */
    s[1] = bits == 5 ? -1 : 1;    /* (-1, -LO) at 5 bits, (+1, -LO) at 6 and 8 */
}

/* widen, sanitize, transpose and weigh blocks [g0, g0 + nb); returns the non-finite count */
static int64_t load(const void *x, int dtype, int64_t n, int64_t k, const float *col_w, int weighting, int64_t g0,
                    int nb, lanes *L) {
    float buf[G * B];
    const int64_t e0 = g0 * B;
    const int64_t e1 = (g0 + nb) * B < n ? (g0 + nb) * B : n;
    const size_t esz = dtype == ORK_DT_F32 ? 4 : 2;
    int64_t nf = 0;
    ork_widen((const char *)x + (size_t)e0 * esz, dtype, e1 - e0, buf);
    for (int64_t i = 0; i < e1 - e0; i++)
        if (!finite_f(buf[i])) { buf[i] = 0.0f; nf++; }
    for (int64_t i = e1 - e0; i < G * B; i++) buf[i] = 0.0f;
    L->nb = nb;
    for (int l = 0; l < G; l++) {
        double s2 = 0.0;
        if (weighting == ORK_NF4W_SIGMA)
            for (int i = 0; i < B; i++) s2 += (double)buf[l * B + i] * (double)buf[l * B + i];
        const double sigma2 = 2.0 * s2 / B;
        for (int i = 0; i < B; i++) {
            const int64_t e = e0 + (int64_t)l * B + i;
            const float xv = buf[l * B + i];
            double w = 0.0;
            if (l < nb && e < n) {
                const double cw = col_w ? (double)col_w[e % k] : 1.0;
                const double xd = (double)xv;
                const double f = weighting == ORK_NF4W_X2 ? xd * xd
                                 : weighting == ORK_NF4W_SIGMA ? sqrt(sigma2 + xd * xd) : 1.0;
                w = cw * f;
            }
            L->x[i][l] = xv;
            L->wf[i][l] = (float)w;
            L->wx[i][l] = L->wf[i][l] * xv;
        }
    }
    return nf;
}

static inline float qround(float v, float lo, float hi) {
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    return (v + RND) - RND;
}

/* step 1 over the lanes: d[l] */
static void steps_lanes(const lanes *L, int bits, float *d) {
    int s[2], lo, hi;
    scan_of(bits, s, &lo, &hi);
    const float flo = (float)lo, fhi = (float)hi;
    float m[G];
    double best[G];
    for (int l = 0; l < G; l++) { m[l] = 0.0f; best[l] = -1.0; d[l] = 0.0f; }
    for (int i = 0; i < B; i++)
        for (int l = 0; l < G; l++) {
            const float a = fabsf(L->x[i][l]);
            m[l] = a > m[l] ? a : m[l];
        }
    for (int c = 0; c < 2; c++) {
        const int Lv = c == 0 ? hi : -lo;
        for (int j = -TRIES; j <= TRIES; j++) {
            const float num = (float)s[c] * ((float)Lv + (float)j * STEP);
            float isc[G], sxq[G], sqq[G];
            int ok[G];
            for (int l = 0; l < G; l++) {
                const float v = num / m[l];
                ok[l] = finite_f(v);
                isc[l] = ok[l] ? v : 0.0f;
                sxq[l] = sqq[l] = 0.0f;
            }
            for (int i = 0; i < B; i++)
                for (int l = 0; l < G; l++) {
                    const float q = qround(L->x[i][l] * isc[l], flo, fhi);
                    sxq[l] += L->wx[i][l] * q;
                    sqq[l] += (L->wf[i][l] * q) * q;
                }
            for (int l = 0; l < G; l++) {
                if (!(ok[l] && sqq[l] > 0.0f)) continue;
                const double sx = (double)sxq[l];
                const double score = sx * sx / (double)sqq[l];
                if (score > best[l]) {
                    best[l] = score;
                    d[l] = sxq[l] / sqq[l];
                }
            }
        }
    }
}

int64_t ork_intdq_steps(const void *x, int dtype, int64_t n, int64_t k, const float *col_w, int weighting, int bits,
                        int64_t b0, int64_t b1, float *d) {
    lanes L;
    float dl[G];
    int64_t nf = 0;
    for (int64_t g0 = b0; g0 < b1; g0 += G) {
        const int nb = (int)(b1 - g0 < G ? b1 - g0 : G);
        nf += load(x, dtype, n, k, col_w, weighting, g0, nb, &L);
        steps_lanes(&L, bits, dl);
        for (int l = 0; l < nb; l++) d[g0 + l] = dl[l];
    }
    return nf;
}

/* numpy's searchsorted(mid, v, side="left"): the number of mid strictly below v (NaN sorts last: 255) */
static int dq_nearest(const float *mid, float v) {
    if (v != v) return 255;
    int pos = 0;
    for (int step = 128; step; step >>= 1) pos += mid[pos + step - 1] < v ? step : 0;
    return pos;
}

/* the b-bit two's complement fields of cnt codes, LSB first, from byte p on (cnt * bits / 8 bytes, rounded up) */
static void pack_block(const float *q, int cnt, int bits, uint8_t *p) {
    const uint32_t mask = (1u << bits) - 1u;
    uint32_t acc = 0;
    int nacc = 0;
    for (int i = 0; i < cnt; i++) {
        acc |= ((uint32_t)(int32_t)q[i] & mask) << nacc;
        nacc += bits;
        while (nacc >= 8) {
            *p++ = (uint8_t)(acc & 255u);
            acc >>= 8;
            nacc -= 8;
        }
    }
    if (nacc > 0) *p = (uint8_t)acc;
}

void ork_intdq_encode(const void *x, int dtype, int64_t n, int64_t k, const float *col_w, int weighting, int bits,
                      const float *d, const float *scale, float offset, int64_t b0, int64_t b1, uint8_t *codes,
                      uint8_t *absmax_q, ork_codec_stats *st) {
    float dq[256], mid[255];
    for (int i = 0; i < 256; i++) dq[i] = u2f(DQ_CODE_BITS[i]);
    for (int i = 0; i < 255; i++) mid[i] = (dq[i] + dq[i + 1]) / 2.0f;
    int s[2], lo, hi;
    scan_of(bits, s, &lo, &hi);
    const float flo = (float)lo, fhi = (float)hi;
    double ax[16], ae[16];
    for (int l = 0; l < 16; l++) ax[l] = ae[l] = 0.0;
    int64_t nf = 0;
    lanes L;
    for (int64_t g0 = b0; g0 < b1; g0 += G) {
        const int nb = (int)(b1 - g0 < G ? b1 - g0 : G);
        nf += load(x, dtype, n, k, col_w, weighting, g0, nb, &L);
        int q0[G], bq[G];
        float sb[G], be[G], bc[B][G];
        for (int l = 0; l < G; l++) {
            const int64_t b = g0 + (l < nb ? l : 0);
            sb[l] = scale[b / ORK_NF4DQ_GROUP];
            const float r = d[b] - offset;
            q0[l] = dq_nearest(mid, sb[l] > 0.0f ? r / sb[l] : 0.0f);
            bq[l] = q0[l];
            be[l] = INFINITY;
        }
        for (int i = 0; i < B; i++)
            for (int l = 0; l < G; l++) bc[i][l] = 0.0f;
        for (int c = 0; c < 3; c++) {
            float a[G], inv[G], err[G];
            int valid[G], qc[G];
            for (int l = 0; l < G; l++) {
                const int q = q0[l] + DQ_CAND[c];
                valid[l] = q >= 0 && q <= 255;
                qc[l] = q < 0 ? 0 : q > 255 ? 255 : q;
                a[l] = dq[qc[l]] * sb[l];
                a[l] = a[l] + offset;
                const float iv = 1.0f / a[l];
                inv[l] = a[l] != 0.0f && finite_f(iv) ? iv : 0.0f;
                err[l] = 0.0f;
            }
            float cq[B][G];
            for (int i = 0; i < B; i++)
                for (int l = 0; l < G; l++) {
                    const float q = qround(L.x[i][l] * inv[l], flo, fhi);
                    cq[i][l] = q;
                    const float e = L.x[i][l] - q * a[l];
                    err[l] += (L.wf[i][l] * e) * e;
                }
            for (int l = 0; l < G; l++) {
                const int take = valid[l] && err[l] < be[l];
                if (!take) continue;
                bq[l] = qc[l];
                be[l] = err[l];
                for (int i = 0; i < B; i++) bc[i][l] = cq[i][l];
            }
        }
        for (int l = 0; l < nb; l++) {
            const int64_t b = g0 + l;
            absmax_q[b] = (uint8_t)bq[l];
            const int64_t e0 = b * B;
            const int cnt = (int)(n - e0 < B ? n - e0 : B);
            float qv[B];
            for (int i = 0; i < B; i++) qv[i] = bc[i][l];
            pack_block(qv, cnt, bits, codes + e0 / 8 * bits);
            const float ab = dq[bq[l]] * sb[l] + offset;
            for (int i = 0; i < cnt; i++) {
                const float xv = L.x[i][l];
                const float y = qv[i] * ab;
                const int lane = (int)((e0 - b0 * B + i) & 15);
                const double er = (double)xv - (double)y;
                ax[lane] += (double)xv * (double)xv;
                ae[lane] += er * er;
            }
        }
    }
    if (st) {
        double sx = 0.0, se = 0.0;
        for (int l = 0; l < 16; l++) { sx += ax[l]; se += ae[l]; }
        st->sum_x2 = sx;
        st->sum_err2 = se;
        st->nonfinite = nf;
    }
}
