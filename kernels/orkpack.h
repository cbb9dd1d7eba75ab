/* orkpack.h: the .orkpack v1 preamble and constants for C readers.
 * The spec is docs/FORMAT.md. All integers little-endian. */
#ifndef ORKPACK_H
#define ORKPACK_H
#include <stdint.h>

#define ORKPACK_MAGIC "ORKPACK\0"
#define ORKPACK_VERSION_MAJOR 1
/* the minor a pack without flags is written as; 1.9 (the newest read): a pack with ORKPACK_FLAG_ONLINE_R4, preamble
 * flags bit 0: the runtime must rotate every ffn_down input online (docs/FORMAT.md 11, docs/RUNTIME.md) */
#define ORKPACK_VERSION_MINOR 8
#define ORKPACK_VERSION_MINOR_MAX 9
#define ORKPACK_FLAG_ONLINE_R4 1u
#define ORKPACK_KNOWN_FLAGS ORKPACK_FLAG_ONLINE_R4
#define ORKPACK_PREAMBLE_SIZE 128
#define ORKPACK_PREAMBLE_BLOCK 4096
#define ORKPACK_ALIGN 4096
#define ORKPACK_PREAMBLE_XXH3_OFFSET 120
#define ORKPACK_MAX_HEADER_SIZE (256ull * 1024 * 1024)
#define ORKPACK_NPU_TILE_N 32
#define ORKPACK_NPU_TILE_K 32
#define ORKPACK_NPU_K_SEGMENT 8192
#define ORKPACK_NF4_BLOCK 64
#define ORKPACK_NF4DQ_BLOCK 32  /* nf4dq (1.5): elements per absmax */
#define ORKPACK_NF4DQ_GROUP 256 /* nf4dq: absmaxes per float32 absmax_scale */

/* CDEF BEGIN */
typedef struct {
    char magic[8];           /* "ORKPACK\0" */
    uint16_t version_major;  /* 1: a reader refuses a larger major */
    uint16_t version_minor;  /* 7 (1.1 raw, 1.2 host copies, 1.3 model record, 1.4 smoothing, 1.5 nf4dq, 1.6 rotation, 1.7 intdq; 8 only with flag bit 0, online R4): any minor of its major is read */
    uint32_t preamble_size;  /* 128 */
    uint64_t file_size;      /* exact size of the file */
    uint64_t data_offset;    /* 4096 */
    uint64_t data_size;      /* multiple of 4096 */
    uint64_t header_offset;  /* data_offset + data_size */
    uint64_t header_size;    /* UTF-8 JSON; file_size = header_offset + header_size */
    uint64_t data_xxh3;      /* XXH3_64bits(seed 0) of [data_offset, header_offset) */
    uint64_t header_xxh3;    /* XXH3_64bits(seed 0) of the header bytes */
    uint32_t alignment;      /* 4096 */
    uint32_t flags;          /* 0 */
    uint8_t reserved[40];    /* zero */
    uint64_t preamble_xxh3;  /* XXH3_64bits(seed 0) of bytes [0, 4096) with these 8 bytes as zero */
} orkpack_preamble_t;
/* CDEF END */

#ifdef __cplusplus
static_assert(sizeof(orkpack_preamble_t) == ORKPACK_PREAMBLE_SIZE, "preamble is 128 bytes");
#else
_Static_assert(sizeof(orkpack_preamble_t) == ORKPACK_PREAMBLE_SIZE, "preamble is 128 bytes");
#endif
#endif
