/* runtime.h: orkpack's load paths (docs/RUNTIME.md, docs/FORMAT.md sections 4 and 5).
 *
 *  - cacheable fill: copy int8 tiles into an NPU buffer with ordinary cached writes,
 *    then clean exactly the written range (DC CVAC + DSB on aarch64, a no-op elsewhere);
 *  - direct int4 -> int8 tiled inflate: NF4 codes + absmax straight into the NPU's
 *    int8 tiles and per-row float32 scales, one pass;
 *  - the two-step inflate (dequantize to float32, requantize per row, tile), the baseline.
 *
 * Bit-exactness contract: both inflates produce exactly the bytes of the numpy
 * reference  tile_int8(int8_encode(nf4_decode(codes, absmax, (N, K))))  of
 * orkpack/codecs/reference.py + orkpack/layout.py (float32 arithmetic, round half
 * to even, non-finite decoded values taken as 0, inv = min(127/amax, FLT_MAX)).
 *
 * Work is split by the caller into ranges of 32-row tiles [tile0, tile1): each range
 * writes a disjoint set of output bytes (its tile rows in every K segment, padding
 * included) and its own scales, so any number of threads gives the same bytes.
 */
#ifndef ORK_RUNTIME_H
#define ORK_RUNTIME_H
#include <stddef.h>
#include <stdint.h>

/* return codes */
#define ORK_RT_OK 0
#define ORK_RT_EARGS (-1)
#define ORK_RT_ENOMEM (-2)

/* SIMD levels of the inflate (ork_rt_isa) */
#define ORK_RT_ISA_PORTABLE 0
#define ORK_RT_ISA_SSSE3 1
#define ORK_RT_ISA_NEON 2
#define ORK_RT_ISA_AVX512 3 /* AVX-512 F/BW/VL/DQ + VBMI */

/* CDEF BEGIN */
/* Bytes of the tiled int8 image of an [n, k] slice with K segments of k_segment columns (0 on bad args:
 * k_segment not a multiple of 32 in [32, 2^40], n or k outside [1, 2^40], an image beyond int64; the
 * inflates return ORK_RT_EARGS on the same). A k_segment >= k is one segment. */
size_t ork_rt_tiled_size(int64_t n, int64_t k, int64_t k_segment);
/* Clean [p, p+n) from the data cache to the point of coherency (aarch64: DC CVAC per line, DSB); no-op elsewhere. */
void ork_rt_clean(void *p, size_t n);
/* Cacheable fill of one chunk: memcpy(dst, src, n) with ordinary stores, then ork_rt_clean(dst, n) when clean != 0. */
void ork_rt_fill(void *dst, const void *src, size_t n, int clean);
/* Direct inflate of row tiles [tile0, tile1) of an NF4 [n, k] slice into the tiled image q (q_size bytes)
 * and scale[n]. codes_size / absmax_count are the sizes of the stored parts (checked). 0 or ORK_RT_E*. */
int ork_rt_inflate_direct(const uint8_t *codes, size_t codes_size, const float *absmax, size_t absmax_count,
                          int64_t n, int64_t k, int64_t k_segment, int64_t tile0, int64_t tile1,
                          int8_t *q, size_t q_size, float *scale);
/* The two-step inflate of the same rows (decode to float32, requantize per row, tile). Same bytes. */
int ork_rt_inflate_two_step(const uint8_t *codes, size_t codes_size, const float *absmax, size_t absmax_count,
                            int64_t n, int64_t k, int64_t k_segment, int64_t tile0, int64_t tile1,
                            int8_t *q, size_t q_size, float *scale);
/* Plain NF4 decode of elements [e0, e1) of a flat slice: out[e - e0] = CODEBOOK[code] * absmax[e / 64]. */
int ork_rt_nf4_decode(const uint8_t *codes, size_t codes_size, const float *absmax, size_t absmax_count,
                      int64_t e0, int64_t e1, float *out);
/* nf4dq decode of elements [e0, e1) (docs/FORMAT.md 3): CODEBOOK[code] * (DQ_CODE[absmax_q[e / 32]] *
 * scale[e / 8192] + offset), float32. The sizes are the stored parts' (checked). 0 or ORK_RT_EARGS. */
int ork_rt_nf4dq_decode(const uint8_t *codes, size_t codes_size, const uint8_t *absmax_q, size_t absmax_count,
                        const float *scale, size_t scale_count, float offset, int64_t e0, int64_t e1, float *out);
/* int5dq / int6dq / int8dq decode of elements [e0, e1) (docs/FORMAT.md 3, intdq; bits 5, 6 or 8): q[e] * (DQ_CODE[
 * absmax_q[e / 32]] * scale[e / 8192] + offset), float32, q[e] the b-bit two's complement field at bit b e of codes.
 * The sizes are the stored parts' (checked: codes_size >= ceil(e1 b / 8)). 0 or ORK_RT_EARGS. */
int ork_rt_intdq_decode(int bits, const uint8_t *codes, size_t codes_size, const uint8_t *absmax_q,
                        size_t absmax_count, const float *scale, size_t scale_count, float offset, int64_t e0,
                        int64_t e1, float *out);
/* SIMD in use by the direct inflate: 0 portable C, 1 x86 (SSSE3 or AVX-512), 2 aarch64 NEON. */
int ork_rt_simd_level(void);
/* The exact level in use: 0 portable C, 1 x86 SSSE3, 2 aarch64 NEON, 3 x86 AVX-512 VBMI. */
int ork_rt_isa(void);
/* Cap the level (for tests and benchmarks; negative: the best the CPU has); returns ork_rt_isa().
 * AVX-512 capped below 3 runs SSSE3; any other cap below the best runs portable C.
 * ork_rt_force_portable(1) overrides the cap. */
int ork_rt_set_isa(int level);
/* Force the portable C path (on != 0) or re-enable SIMD (on == 0); for tests and benchmarks. */
void ork_rt_force_portable(int on);
/* CDEF END */

#endif
