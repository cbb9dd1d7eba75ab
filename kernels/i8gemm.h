/* Exact int8 x int8 products, rescaled: the NPU path's matmul in orkpack eval (orkpack/eval/numerics.py
 * int8_matmul; its numpy reference sums the same integers in float64). */
#ifndef ORK_I8GEMM_H
#define ORK_I8GEMM_H

#include <stdint.h>

/* The largest K whose sums stay exact in int32 (|x|, |w| <= 128: K * 128 * 128 < 2^31). */
#define ORK_I8GEMM_MAX_K 131071

/* CDEF BEGIN */
/* out[m * N + n] = (float)acc * sx[m] * sw[n] in float32 (left to right), acc = sum_k x[m * K + k] * w[n * K + k]
 * summed exactly in int32 (x: M x K, w: N x K, both row-major int8). Returns 0, or -1 when K is above
 * ORK_I8GEMM_MAX_K (nothing written) or memory runs out. */
int ork_i8_matmul(const int8_t *x, const float *sx, int64_t M, const int8_t *w, const float *sw, int64_t N,
                  int64_t K, float *out);
/* The SIMD path ork_i8_matmul takes: 0 portable, 1 AVX2, 2 AVX-512 VNNI (capped by ork_codecs_isa()). */
int ork_i8_matmul_isa(void);
/* CDEF END */

#endif
