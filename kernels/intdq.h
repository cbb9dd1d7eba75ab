/* intdq.h: the int5dq, int6dq and int8dq encoders (docs/FORMAT.md 3, intdq).
 *
 * The bytes are defined by orkpack/codecs/reference.py intdq_encode (the comment block above INTDQ_BITS): b-bit
 * integer codes in blocks of 32, each block's step double-quantized as nf4dq's absmax (DQ_CODE of
 * kernels/nf4dq_code.h, a float32 scale per 256 blocks, one offset; step 2 is nf4opt.c's ork_nf4dq_scales).
 * Every operation is the reference's, in its order (float32 products and sums in element order, the scan's score
 * in float64), built with -ffp-contract=off: tests/test_intdq.py checks the bytes are equal. The decode is
 * kernels/runtime.c ork_rt_intdq_decode (the runtime's and liborkpack's).
 */
#ifndef ORK_INTDQ_H
#define ORK_INTDQ_H
#include <stdint.h>

/* CDEF BEGIN */
/* Step 1, blocks [b0, b1) of 32 elements of the flat x[n] (dtype ORK_DT_*): each block's least-squares step
 * d[b0..b1). bits: 5, 6 or 8; col_w: NULL or float32 weights per column (element e weighs col_w[e % k]);
 * weighting: ORK_NF4W_* (kernels/nf4opt.h). Returns the number of non-finite inputs seen (taken as 0). */
int64_t ork_intdq_steps(const void *x, int dtype, int64_t n, int64_t k, const float *col_w, int weighting, int bits,
                        int64_t b0, int64_t b1, float *d);
/* Step 3, blocks [b0, b1): absmax_q[b0..b1) and the codes of those blocks (bytes [4 bits b0, ..) of the
 * ceil(n bits / 8) in all), from d, the group scales and the offset of ork_nf4dq_scales. stats as nf4's
 * (sum x^2 and sum (x - decoded)^2 in 16 lanes by element position in the range, non-finite count). */
void ork_intdq_encode(const void *x, int dtype, int64_t n, int64_t k, const float *col_w, int weighting, int bits,
                      const float *d, const float *scale, float offset, int64_t b0, int64_t b1, uint8_t *codes,
                      uint8_t *absmax_q, ork_codec_stats *stats);
/* CDEF END */

#endif
