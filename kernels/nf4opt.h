/* nf4opt.h: error-minimizing NF4 (the "opt" mode of the nf4 codec).
 *
 * The bytes are defined by orkpack/codecs/reference.py nf4opt_encode (the comment block above it):
 * the same NF4 format and decoder as bitsandbytes; per 64-block the stored absmax is the scale that
 * minimizes the weighted squared error over bitsandbytes' choice, a scan and a refinement. Every
 * operation here is the reference's, in the same order (float32 scaling and decode, float64 sums in
 * in element order), built with -ffp-contract=off: tests/test_nf4opt.py checks the bytes are equal.
 * The block length is 64 (the nf4 encoding) or 32 (the first step of nf4dq, below; tests/test_nf4dq.py).
 */
#ifndef ORK_NF4OPT_H
#define ORK_NF4OPT_H
#include <stdint.h>

#define ORK_NF4W_PLAIN 0
#define ORK_NF4W_X2 1
#define ORK_NF4W_SIGMA 2

/* CDEF BEGIN */
/* Blocks [b0, b1) of `block` (64 or 32) elements of the flat x[n] (dtype ORK_DT_*): codes (ceil(n/2) bytes in
 * all) and absmax[b0..b1) (reference.nf4opt_encode(..., block=block, tries=tries): the scan tries
 * 2 * (2 * tries + 1) scales).
 * col_w: NULL, or float32 weights per column, element e weighing col_w[e % k]. weighting: ORK_NF4W_*.
 * stats as ork_nf4_encode's (sum x^2 and sum (x - decoded)^2, 16 lanes by element index mod 16).
 * codes and stats may be NULL (nf4dq's first step wants only the absmax). */
void ork_nf4opt_encode(const void *x, int dtype, int64_t n, int64_t k, const float *col_w, int weighting, int block,
                       int tries, int64_t b0, int64_t b1, uint8_t *codes, float *absmax, ork_codec_stats *stats);

/* nf4dq (reference.nf4dq_encode), in three steps: (1) d[nb] = ork_nf4opt_encode(..., block=32, tries=1) (no codes);
 * (2) ork_nf4dq_scales: offset and the per-256-block scale[ceil(nb/256)] from d (one call, nb > 0);
 * (3) ork_nf4dq_encode, blocks [b0, b1): codes and absmax_q, stats of the decoded values (as nf4's). */
void ork_nf4dq_scales(const float *d, int64_t nb, float *scale, float *offset);
void ork_nf4dq_encode(const void *x, int dtype, int64_t n, int64_t k, const float *col_w, int weighting,
                      const float *d, const float *scale, float offset, int64_t b0, int64_t b1, uint8_t *codes,
                      uint8_t *absmax_q, ork_codec_stats *stats);
/* The SIMD body the two encoders run now: 0 portable, 1 AVX2, 2 AVX-512 (x86: follows ork_codecs_isa()),
 * 3 NEON (every aarch64 build). */
int ork_nf4opt_level(void);
/* For the tests: the unit-weight bodies' NF4 lookups of level lv (0..3, as ork_nf4opt_level) on n values s: the
 * value of each code (q, and CB[code] in qc), the value alone (qq), and where |s| <= 1.1 the unclamped value (qn1)
 * and the values of the codes of s and -s from one lookup (qp, qn); 0 elsewhere. -1 if this build or CPU has no
 * such level (x86 follows ork_codecs_isa()). */
int ork_nf4opt_lookups(int lv, const float *s, int64_t n, float *q, float *qc, float *qq, float *qn1, float *qp,
                       float *qn);
/* For the tests: ork_nf4dq_encode's q0 (the number of DQ midpoints strictly below v; NaN: 255) of n values v (with
 * offset 0 and scale 1) at level lv as above (AVX-512: the register search; the others: the scalar one); -1 if
 * this build or CPU has no such level. */
int ork_nf4dq_q0s(int lv, const float *v, int64_t n, int *q0);
/* CDEF END */

#endif
