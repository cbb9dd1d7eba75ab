/* orkpack_reader.h: liborkpack, a C99 reader of .orkpack files (docs/FORMAT.md; usage in docs/READER.md).
 *
 * orkpack_open() maps a pack and validates it exactly as the Python reader (orkpack/pack/reader.py,
 * Pack.open) does: preamble and its checksum, sizes, header checksum, header JSON, and every tensor,
 * slice, shape, encoding, layout, part offset/size/alignment/overlap, min_m, inflate record and host
 * copy. A pack it opens is one the Python reader opens, and the reverse (the known divergence: JSON
 * nested deeper than ORKPACK_MAX_JSON_DEPTH, see docs/READER.md). Nothing is allocated from a size the
 * file claims before that size is checked against the real file.
 *
 * Errors: every call that can fail returns an ORKPACK_E* code and, when err is not NULL, fills it with
 * the same code and one line of text. No call aborts, exits or keeps global state (the load paths of
 * kernels/runtime.c keep their SIMD-level choice, set once).
 *
 * Thread safety: an open pack is read-only; any number of threads may read it at once.
 */
#ifndef ORKPACK_READER_H
#define ORKPACK_READER_H
#include <stddef.h>
#include <stdint.h>

#include "../orkpack.h"

#ifdef __cplusplus
extern "C" {
#endif

/* return codes; the exit code of orkpack-check / `orkpack verify` is in brackets */
#define ORKPACK_OK 0
#define ORKPACK_E_DAMAGED 1  /* [1] a checksum or the header does not hold: a damaged pack */
#define ORKPACK_E_UNUSABLE 2 /* [2] not a pack, truncated, a newer format, cannot open */
#define ORKPACK_E_NOMEM 3    /* [2] out of memory */
#define ORKPACK_E_ARGS 4     /* [2] a wrong argument (NULL pointer, buffer too small, not an NPU slice) */

#define ORKPACK_MAX_JSON_DEPTH 512 /* header JSON nesting the reader accepts */
#define ORKPACK_MAX_PARTS 4        /* parts of one encoding (nf4dq: codes, absmax_q, absmax_scale, absmax_offset) */

typedef struct {
    int code;       /* ORKPACK_OK or ORKPACK_E* */
    char msg[512];  /* one line, names the pack and the tensor; "" when code is ORKPACK_OK */
} orkpack_err_t;

enum { ORKPACK_ENC_F32, ORKPACK_ENC_F16, ORKPACK_ENC_BF16, ORKPACK_ENC_INT8, ORKPACK_ENC_NF4, ORKPACK_ENC_RAW,
       ORKPACK_ENC_NF4DQ /* 1.5: host only, and a host copy's encoding */,
       ORKPACK_ENC_INT5DQ, ORKPACK_ENC_INT6DQ, ORKPACK_ENC_INT8DQ /* 1.7: host slices; int5dq, int6dq also host copies (1.8) */ };
enum { ORKPACK_TIER_NPU, ORKPACK_TIER_HOST };
enum { ORKPACK_LAYOUT_ROW_MAJOR, ORKPACK_LAYOUT_NPU_INT8 };
/* element types of a raw slice (its "dtype") */
enum {
    ORKPACK_RAW_NONE = -1, ORKPACK_RAW_BOOL = 0, ORKPACK_RAW_U8, ORKPACK_RAW_U16, ORKPACK_RAW_U32, ORKPACK_RAW_U64,
    ORKPACK_RAW_I8, ORKPACK_RAW_I16, ORKPACK_RAW_I32, ORKPACK_RAW_I64, ORKPACK_RAW_F64, ORKPACK_RAW_C64
};

typedef struct {
    const char *name;    /* "data", "q", "scale", "codes", "absmax", "absmax_q", "absmax_scale", "absmax_offset" */
    uint64_t offset;     /* absolute file offset, a multiple of 4096 */
    uint64_t size;       /* bytes */
    uint64_t xxh3;       /* recorded XXH3_64bits */
    const uint8_t *ptr;  /* the bytes, in the read-only mapping (valid until orkpack_close) */
} orkpack_part_t;

typedef struct {
    int64_t expert;       /* expert index, -1 for a tensor that is not stacked */
    int ndim;             /* 0..4 */
    int64_t shape[4];     /* this slice's logical shape */
    uint64_t numel;       /* elements (1 for 0-D) */
    int encoding;         /* ORKPACK_ENC_* */
    int dtype;            /* ORKPACK_RAW_* for a raw slice, ORKPACK_RAW_NONE otherwise */
    int tier;             /* ORKPACK_TIER_* */
    int layout;           /* ORKPACK_LAYOUT_* of the stored parts */
    int64_t k_segment;    /* npu_int8 layout: its k_segment (0 otherwise) */
    int nparts;           /* 1 to 4, in file order (docs/FORMAT.md 3: data | q, scale | codes, absmax |
                             codes, absmax_q, absmax_scale, absmax_offset) */
    orkpack_part_t parts[ORKPACK_MAX_PARTS];
    int has_sqnr_db;      /* sqnr_db is a number (not null) */
    double sqnr_db;
    int has_min_m;        /* min_m is present and not null */
    int64_t min_m;        /* saturated at INT64_MAX */
    /* NPU nf4 slices (docs/FORMAT.md 5): the int8 image they inflate to */
    int has_inflate;
    int64_t inflate_k_segment; /* from the inflate layout; 0 when it has no valid k_segment */
    uint64_t inflate_q_size;   /* saturated at UINT64_MAX */
    uint64_t inflate_q_xxh3, inflate_scale_xxh3;
    /* dual residency (1.2, docs/FORMAT.md 8): the host NF4 copy of an NPU slice */
    int has_host_copy;
    int host_encoding;    /* ORKPACK_ENC_NF4 or ORKPACK_ENC_NF4DQ (1.5) when has_host_copy */
    int host_nparts;      /* 2 (nf4) or 4 (nf4dq); 0 without a host copy */
    orkpack_part_t host_parts[ORKPACK_MAX_PARTS]; /* the parts of host_encoding, in file order */
    int has_host_sqnr_db;
    double host_sqnr_db;
} orkpack_slice_t;

typedef struct {
    const char *name;         /* canonical name, NUL-terminated (WTF-8: may hold a NUL or lone surrogates) */
    size_t name_len;          /* its length in bytes */
    const char *source_name;
    const char *source_dtype;
    int ndim;
    int64_t shape[4];
    size_t nslices;           /* 1, or E for a stacked [E, N, K] tensor */
    const orkpack_slice_t *slices;
} orkpack_tensor_t;

typedef struct orkpack orkpack_t;

/* Open (mmap) and validate a pack. On success *out is the pack (free with orkpack_close). */
int orkpack_open(const char *path, orkpack_t **out, orkpack_err_t *err);
void orkpack_close(orkpack_t *pack);

const orkpack_preamble_t *orkpack_preamble(const orkpack_t *pack);
/* The header JSON bytes (not NUL-terminated) and the whole mapped file. */
const char *orkpack_header_json(const orkpack_t *pack, size_t *len);
const uint8_t *orkpack_file(const orkpack_t *pack, size_t *len);

size_t orkpack_tensor_count(const orkpack_t *pack);
const orkpack_tensor_t *orkpack_tensor(const orkpack_t *pack, size_t i); /* NULL when i is out of range */
/* The tensor with this canonical name (the first one, in file order), or NULL. */
const orkpack_tensor_t *orkpack_find(const orkpack_t *pack, const char *name);
const orkpack_tensor_t *orkpack_find_n(const orkpack_t *pack, const char *name, size_t len);
/* "NAME" or "NAME[expert E]" into buf (cut to size, NUL-terminated, control bytes escaped); returns buf. */
const char *orkpack_slice_label(const orkpack_tensor_t *t, const orkpack_slice_t *s, char *buf, size_t size);

/* Checksums. Each returns ORKPACK_OK or ORKPACK_E_DAMAGED (with the place in err). */
int orkpack_check_data(const orkpack_t *pack, orkpack_err_t *err);  /* data_xxh3 over the data section */
int orkpack_check_part(const orkpack_t *pack, const orkpack_part_t *part, orkpack_err_t *err);
/* Every part of every slice, host copies included; *nchecked counts the parts checked (may be NULL). */
int orkpack_check_parts(const orkpack_t *pack, size_t *nchecked, orkpack_err_t *err);

/* What the NPU load paths rely on (the `layout` check of `orkpack verify`): a 2-D non-empty slice,
 * int8 in npu_int8 tiles or nf4 with an inflate record whose layout and q_size are the tiling of its
 * shape. ORKPACK_OK, ORKPACK_E_DAMAGED, or ORKPACK_E_ARGS for a host slice. */
int orkpack_check_npu_slice(const orkpack_t *pack, const orkpack_tensor_t *t, const orkpack_slice_t *s,
                            orkpack_err_t *err);
/* Bytes of the NPU int8 image of an NPU slice (its q part, or the inflate q_size); 0 for a host slice. */
uint64_t orkpack_npu_image_size(const orkpack_slice_t *s);
/* The usable IOVA bytes for this pack's NPU slices: the tier map's cap, or 4 GiB - 104 MiB
 * (orkpack/runtime/arena.py); *source (may be NULL) says which. */
uint64_t orkpack_npu_cap(const orkpack_t *pack, const char **source);

/* Load an NPU slice through its real path into the caller's buffers: int8 tiles by the cacheable fill
 * (ork_rt_fill, chunked, cleaning the cache when clean != 0) and scales copied; an nf4 slice by the
 * direct int4 -> int8 inflate (ork_rt_inflate_direct). q must hold orkpack_npu_image_size(s) bytes and
 * scale shape[0] floats. Does not check checksums (orkpack_check_part / compare the image yourself). */
int orkpack_load_npu(const orkpack_t *pack, const orkpack_slice_t *s, void *q, size_t q_size, float *scale,
                     size_t scale_count, int clean, orkpack_err_t *err);

/* Decode elements [e0, e1) of a 4-bit NormalFloat slice to float32 (docs/FORMAT.md 3): a host nf4 or nf4dq
 * slice (host_copy == 0), or an NPU slice's host copy (host_copy != 0). Bit for bit the reference decode
 * (orkpack/codecs/reference.py nf4_decode, nf4dq_decode): CODEBOOK[code] * absmax, with nf4dq's absmax
 * DQ_CODE[absmax_q] * absmax_scale + absmax_offset, float32. out holds e1 - e0 floats. ORKPACK_E_ARGS for
 * another encoding, no host copy or a range beyond the slice. Does not check checksums. */
int orkpack_decode_nf4(const orkpack_slice_t *s, int host_copy, uint64_t e0, uint64_t e1, float *out,
                       orkpack_err_t *err);
/* The same for every quantized host encoding: nf4 and nf4dq as orkpack_decode_nf4, and (1.7) a host int5dq,
 * int6dq or int8dq slice or (1.8) an int5dq / int6dq host copy: q * (DQ_CODE[absmax_q] * absmax_scale + absmax_offset), float32, bit for bit
 * reference.intdq_decode (kernels/runtime.c ork_rt_intdq_decode). ORKPACK_E_ARGS for another encoding. */
int orkpack_decode_host(const orkpack_slice_t *s, int host_copy, uint64_t e0, uint64_t e1, float *out,
                        orkpack_err_t *err);

/* The model record (format 1.3, docs/FORMAT.md 9): the GGUF key-value pairs a runtime builds the model
 * from (hyperparameters, RoPE, norms, tokenizer, chat template). Types are GGUF's, spelled "uint32",
 * "float32", "string", "array[string]", ... Values are checked against their type when read, not at open
 * (a malformed value is ORKPACK_E_DAMAGED naming the key). */
typedef struct {
    const char *key;    /* NUL-terminated (WTF-8) */
    size_t key_len;
    const char *type;   /* NUL-terminated */
    size_t count;       /* elements: the array's length, 1 for a scalar */
    const void *node_;  /* internal */
} orkpack_kv_t;

/* Entries in the record (0 when the pack has none: packs before 1.3, a source without metadata). */
size_t orkpack_model_kv_count(const orkpack_t *pack);
/* Entry i (file order); ORKPACK_E_ARGS when i is out of range, ORKPACK_E_DAMAGED when it is malformed. */
int orkpack_model_kv(const orkpack_t *pack, size_t i, orkpack_kv_t *out, orkpack_err_t *err);
/* The entry with this key; ORKPACK_E_ARGS (message "no key ...") when there is none. */
int orkpack_model_find(const orkpack_t *pack, const char *key, orkpack_kv_t *out, orkpack_err_t *err);
/* All n = kv->count elements in one pass (n must equal it), converted: integer types (and bool as 0/1) to
 * int64 (a uint64 above INT64_MAX is ORKPACK_E_ARGS); float32/float64 to double ("nan", "inf", "-inf"
 * restored); strings as pointers into the header (NUL-terminated, valid until orkpack_close) and lengths.
 * A type that does not convert is ORKPACK_E_ARGS; a value that does not match its type ORKPACK_E_DAMAGED. */
int orkpack_kv_ints(const orkpack_t *pack, const orkpack_kv_t *kv, int64_t *out, size_t n, orkpack_err_t *err);
int orkpack_kv_floats(const orkpack_t *pack, const orkpack_kv_t *kv, double *out, size_t n, orkpack_err_t *err);
int orkpack_kv_strings(const orkpack_t *pack, const orkpack_kv_t *kv, const char **out, size_t *lens, size_t n,
                       orkpack_err_t *err);

/* XXH3_64bits (seed 0) of a buffer, as the format uses it. */
uint64_t orkpack_xxh3(const void *p, size_t n);

#ifdef __cplusplus
}
#endif
#endif
