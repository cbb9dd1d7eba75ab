/* nf4_codebook.h: bitsandbytes' NF4 code book (float32, its quantize_4bit/dequantize_4bit table) and the
 * float32 midpoints its encoder rounds against. One copy for every NF4 kernel (codecs.c, nf4opt.c). */
#ifndef ORK_NF4_CODEBOOK_H
#define ORK_NF4_CODEBOOK_H

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

/* float32 (CB[i] + CB[i+1]) / 2: a float32 add and an exact halving, folded by the
 * compiler in float32 (as torch computes its bucketize bounds) */
#define MIDK(i, j) ((CB_##i + CB_##j) / 2.0f)
static const float MID[15] = {MIDK(0, 1), MIDK(1, 2), MIDK(2, 3), MIDK(3, 4), MIDK(4, 5),
                              MIDK(5, 6), MIDK(6, 7), MIDK(7, 8), MIDK(8, 9), MIDK(9, 10),
                              MIDK(10, 11), MIDK(11, 12), MIDK(12, 13), MIDK(13, 14), MIDK(14, 15)};

#include <stdint.h>

/* codecs.c's bin tables for the AVX-512 encoders (32 bins, bin(s) = (int)(s * 15.5f + 16.0f) for |s| <= 1.03;
 * code = base[bin] + (s > mid[bin])), built once; 1 when valid, -1 when not (then use the compare path). */
int ork_nf4_bin_tables(const float **mid, const int32_t **base);

#endif
