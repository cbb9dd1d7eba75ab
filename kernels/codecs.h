/* codecs.h: NF4 and int8 codec kernels and the RK3588 NPU int8 tiling.
 *
 * Bit-exactness contract: every output byte equals what the numpy references
 * in orkpack/codecs/reference.py and orkpack/layout.py produce (docs/FORMAT.md
 * sections 3 and 4); NF4 equals bitsandbytes 0.50.2 quantize_4bit(nf4, 64).
 *
 * Inputs are float32, float16 or bfloat16 (uint16 bits), selected by `dtype`
 * (ORK_DT_*), widened exactly inside the kernels. A non-finite input is counted
 * in stats->nonfinite and encoded as 0.
 *
 * Work is split by the caller into fixed chunks (NF4: a block range, int8: a
 * row range) that may run on different threads: each call writes only its own
 * bytes. stats (sum x^2, sum (x - dequant)^2, both double) is accumulated in 16
 * lanes by element position within the chunk and folded in a fixed order, so it
 * depends on the chunk boundaries only, never on threads or the SIMD level.
 *
 * SIMD: the same C body is compiled for a portable baseline and, on x86-64
 * with GCC/Clang, for AVX2 and AVX-512 (function target attributes), picked at
 * run time. ork_codecs_set_isa() forces a lower level (tests compare them).
 * NF4 encode has hand-written AVX-512 (bin tables) and AVX2 (+F16C, binary search)
 * paths for full, finite blocks; tail blocks and blocks holding a non-finite value go
 * through the generic body. Same bytes and same stats lane order at every level
 * (tests/test_codecs_speedpaths.py checks the sums with ==).
 */
#ifndef ORK_CODECS_H
#define ORK_CODECS_H
#include <stdint.h>

#define ORK_DT_F32 0
#define ORK_DT_F16 1
#define ORK_DT_BF16 2

#define ORK_ISA_PORTABLE 0
#define ORK_ISA_AVX2 1
#define ORK_ISA_AVX512 2

/* CDEF BEGIN */
typedef struct {
    double sum_x2;     /* sum of x^2 over the chunk's elements (x after widening, non-finite as 0) */
    double sum_err2;   /* sum of (x - dequant(code))^2, the error taken in float32 */
    int64_t nonfinite; /* NaN or Inf inputs seen */
} ork_codec_stats;

/* The SIMD level in use (ORK_ISA_*), and a way to force one; returns the level
 * actually set (never above what the CPU supports). Negative: best available. */
int ork_codecs_isa(void);
int ork_codecs_set_isa(int level);

/* Widen n values of type dtype to float32 (exact); returns the non-finite count. */
int64_t ork_widen(const void *x, int dtype, int64_t n, float *out);
int64_t ork_count_nonfinite(const void *x, int dtype, int64_t n);

/* NF4 of the flat array x[n]: blocks [b0, b1) of 64 elements. Writes
 * codes[32*b0 .. ) (ceil(n/2) bytes in all) and absmax[b0 .. b1). */
void ork_nf4_encode(const void *x, int dtype, int64_t n, int64_t b0, int64_t b1,
                    uint8_t *codes, float *absmax, ork_codec_stats *stats);
/* out[64*b0 .. min(64*b1, n)) = CODEBOOK[code] * absmax[block] */
void ork_nf4_decode(const uint8_t *codes, const float *absmax, int64_t n, int64_t b0, int64_t b1,
                    float *out);

/* int8 per output channel of x[N, K] (row-major), rows [r0, r1).
 * k_segment == 0: q is row-major int8[N, K].
 * k_segment > 0 (a multiple of 32): q is the npu_int8 image (FORMAT.md 4); rows
 * may run up to Np = N rounded up to 32, rows >= N are written as zeros.
 * scale[r] is written for r < N. */
void ork_int8_encode(const void *x, int dtype, int64_t N, int64_t K, int64_t r0, int64_t r1,
                     int64_t k_segment, int8_t *q, float *scale, ork_codec_stats *stats);
/* out[r, k] = q[r, k] * scale[r] for rows [r0, r1) (< N); q row-major or tiled as above */
void ork_int8_decode(const int8_t *q, const float *scale, int64_t N, int64_t K, int64_t r0, int64_t r1,
                     int64_t k_segment, float *out);
/* Tile rows [r0, r1) (up to Np) of a row-major int8 q[N, K] into the npu_int8 image dst. */
void ork_int8_tile(const int8_t *q, int64_t N, int64_t K, int64_t r0, int64_t r1, int64_t k_segment,
                   int8_t *dst);
/* CDEF END */

#endif
