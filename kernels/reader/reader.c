/* reader.c: liborkpack (orkpack_reader.h). The validation is a line-by-line port of
 * orkpack/pack/reader.py (Pack._open_fd, validate_header, check_layout, expected_part_sizes,
 * _check_host_copy), in the same order, so that the first problem found, and with it the exit code
 * (1 damaged, 2 "made by a newer orkpack"), is the same. Python's value semantics are kept where they
 * decide anything: ints are exact (bool is not an int), but == is Python's (1 == 1.0 == true), and a
 * repeated key means its last value at its first position. */
#define _POSIX_C_SOURCE 200809L
#include "orkpack_reader.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "../runtime.h"
#include "jscan.h"

#define MAX_TENSORS 1000000
#define MAX_DIMS 4
#define MAX_NAME_BYTES 4096
#define MAX_DIM (1ull << 48)
#define FILL_CHUNK (4u << 20)
#define IOVA_SPACE (1ull << 32)
#define DEFAULT_IOVA_CAP (IOVA_SPACE - (104ull << 20))

typedef struct { uint64_t a, b; } span_t;

struct orkpack {
    int fd;
    uint8_t *map;
    size_t size;
    orkpack_preamble_t pre;
    char label[200];
    jscan_t js;
    cJSON *root;
    orkpack_tensor_t *tensors;
    size_t ntensors;
    orkpack_slice_t *slices;
    size_t nslices;
    const cJSON **slice_nodes;
    uint64_t cap;
    const char *cap_source;
};

/* ------------------------------------------------------------------ errors, names */

static int seterr(orkpack_err_t *err, int code, const char *fmt, ...) {
    if (err) {
        err->code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* control and non-ASCII bytes as \xNN, cut to about limit characters */
static void escape_bytes(const char *s, size_t n, char *out, size_t size, size_t limit) {
    size_t o = 0;
    if (!size) return;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[8];
        int w = (c < 0x20 || c >= 0x7f || c == '\\') ? snprintf(tmp, sizeof tmp, "\\x%02x", c) : (tmp[0] = (char)c, 1);
        if (o + (size_t)w + 4 >= size || o + (size_t)w > limit) {
            if (o + 4 < size) { memcpy(out + o, "...", 3); o += 3; }
            break;
        }
        memcpy(out + o, tmp, (size_t)w);
        o += (size_t)w;
    }
    out[o] = '\0';
}

const char *orkpack_slice_label(const orkpack_tensor_t *t, const orkpack_slice_t *s, char *buf, size_t size) {
    char name[160];
    escape_bytes(t->name, t->name_len, name, sizeof name, 120);
    if (s && s->expert >= 0) snprintf(buf, size, "%s[expert %lld]", name, (long long)s->expert);
    else snprintf(buf, size, "%s", name);
    return buf;
}

uint64_t orkpack_xxh3(const void *p, size_t n) { return (uint64_t)XXH3_64bits(p, n); }

/* ------------------------------------------------------------------ JSON access (Python semantics) */

typedef struct {
    const jscan_t *js;
} J;

static const jtok_t *keytok(const J *j, const cJSON *n) {
    return (n && n->string && n->valueint >= 0) ? &j->js->tok[n->valueint] : NULL;
}
static const jtok_t *valtok(const J *j, const cJSON *n) {
    if (!n || !(cJSON_IsString(n) || cJSON_IsNumber(n)) || n->valueint < 0) return NULL;
    return &j->js->tok[n->valueint + (n->string ? 1 : 0)];
}
static const char *tokstr(const J *j, const jtok_t *t) { return j->js->arena + t->off; }

static int key_is(const J *j, const cJSON *n, const char *key) {
    const jtok_t *t = keytok(j, n);
    size_t L = strlen(key);
    return t && t->len == L && memcmp(tokstr(j, t), key, L) == 0;
}

/* obj.get(key): the last child with that key (Python dict: the last value wins) */
static const cJSON *get(const J *j, const cJSON *obj, const char *key) {
    if (!cJSON_IsObject(obj)) return NULL;
    const cJSON *found = NULL;
    for (const cJSON *c = obj->child; c; c = c->next)
        if (key_is(j, c, key)) found = c;
    return found;
}
static int has(const J *j, const cJSON *obj, const char *key) { return get(j, obj, key) != NULL; }
static int is_none(const cJSON *n) { return !n || cJSON_IsNull(n); }
static int is_str(const cJSON *n) { return n && cJSON_IsString(n); }
static int is_num(const cJSON *n) { return n && cJSON_IsNumber(n); }
static int is_int(const J *j, const cJSON *n) {
    const jtok_t *t = valtok(j, n);
    return t && t->kind == JTOK_NUM && t->is_int;
}
static int str_eq(const J *j, const cJSON *n, const char *s) {
    const jtok_t *t = valtok(j, n);
    size_t L = strlen(s);
    return t && t->kind == JTOK_STR && t->len == L && memcmp(tokstr(j, t), s, L) == 0;
}
/* Python n == v for an int v (bool: True == 1, float: exact) */
static int eq_int(const J *j, const cJSON *n, int64_t v) {
    if (!n) return 0;
    if (cJSON_IsTrue(n)) return v == 1;
    if (cJSON_IsFalse(n)) return v == 0;
    const jtok_t *t = valtok(j, n);
    if (!t || t->kind != JTOK_NUM) return 0;
    if (t->is_int) return !t->ovf && t->i == v;
    double d = t->d;
    if (!(d == d) || d != floor(d) || fabs(d) >= 9.2e18) return 0;
    return (int64_t)d == v;
}
/* exact int value: 0 fits, +1/-1 beyond int64 (saturated *v) */
static int int_val(const J *j, const cJSON *n, int64_t *v) {
    const jtok_t *t = valtok(j, n);
    *v = t->i;
    return t->ovf;
}
static int is_hex16(const J *j, const cJSON *n, uint64_t *out) {
    const jtok_t *t = valtok(j, n);
    if (!t || t->kind != JTOK_STR || t->len != 16) return 0;
    const char *s = tokstr(j, t);
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int h = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
        if (h < 0) return 0;
        v = v << 4 | (uint64_t)h;
    }
    if (out) *out = v;
    return 1;
}
/* list(obj) == names: the distinct keys, in order of first appearance (a repeated key keeps its first place) */
static int keys_are(const J *j, const cJSON *obj, const char *const *names, int count) {
    if (!cJSON_IsObject(obj)) return 0;
    int seen = 0; /* names[0 .. seen) have appeared, in that order */
    for (const cJSON *c = obj->child; c; c = c->next) {
        int again = 0;
        for (int i = 0; i < seen && !again; i++) again = key_is(j, c, names[i]);
        if (again) continue;
        if (seen == count || !key_is(j, c, names[seen])) return 0;
        seen++;
    }
    return seen == count;
}

/* ------------------------------------------------------------------ format tables */

/* spec.ENCODINGS, in the order of the ORKPACK_ENC_* enum */
static const char *const ENC_NAMES[] = {"f32", "f16", "bf16", "int8", "nf4", "raw", "nf4dq", "int5dq", "int6dq",
                                        "int8dq"};
#define N_ENCODINGS 10
#define IS_INTDQ(e) ((e) == ORKPACK_ENC_INT5DQ || (e) == ORKPACK_ENC_INT6DQ || (e) == ORKPACK_ENC_INT8DQ)
/* spec.INTDQ_BITS */
static int intdq_bits(int enc) { return enc == ORKPACK_ENC_INT5DQ ? 5 : enc == ORKPACK_ENC_INT6DQ ? 6 : 8; }
static const char *const RAW_NAMES[] = {"bool", "u8", "u16", "u32", "u64", "i8", "i16", "i32", "i64", "f64", "c64"};
static const unsigned RAW_SIZE[] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 8, 8};
static const char *const PARTS_DATA[] = {"data"};
static const char *const PARTS_INT8[] = {"q", "scale"};
static const char *const PARTS_NF4[] = {"codes", "absmax"};
static const char *const PARTS_NF4DQ[] = {"codes", "absmax_q", "absmax_scale", "absmax_offset"};

/* spec.PARTS[encoding] */
static const char *const *enc_parts(int enc, int *count) {
    switch (enc) {
    case ORKPACK_ENC_INT8: *count = 2; return PARTS_INT8;
    case ORKPACK_ENC_NF4: *count = 2; return PARTS_NF4;
    case ORKPACK_ENC_NF4DQ:
    case ORKPACK_ENC_INT5DQ:
    case ORKPACK_ENC_INT6DQ:
    case ORKPACK_ENC_INT8DQ: *count = 4; return PARTS_NF4DQ; /* 1.7: the intdq parts are nf4dq's names */
    default: *count = 1; return PARTS_DATA;
    }
}
/* "['codes', 'absmax']": the parts list as the Python reader prints it */
static const char *parts_repr(int enc) {
    switch (enc) {
    case ORKPACK_ENC_INT8: return "['q', 'scale']";
    case ORKPACK_ENC_NF4: return "['codes', 'absmax']";
    case ORKPACK_ENC_NF4DQ:
    case ORKPACK_ENC_INT5DQ:
    case ORKPACK_ENC_INT6DQ:
    case ORKPACK_ENC_INT8DQ: return "['codes', 'absmax_q', 'absmax_scale', 'absmax_offset']";
    default: return "['data']";
    }
}

static int lookup(const J *j, const cJSON *n, const char *const *names, int count) {
    for (int i = 0; i < count; i++)
        if (str_eq(j, n, names[i])) return i;
    return -1;
}

static uint64_t sat_mul(uint64_t a, uint64_t b) {
    if (a == 0 || b == 0) return 0;
    return a > UINT64_MAX / b ? UINT64_MAX : a * b;
}
static uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }
static int64_t round32(int64_t v) { return (v + 31) / 32 * 32; }

/* n_pad * sum(kp) of the npu_int8 tiling of [n, k] with k_segment ks (n, k >= 1, ks >= 32) */
static uint64_t tiled_bytes(int64_t n, int64_t k, int64_t ks) {
    uint64_t sum = 0;
    int64_t full = k / ks, rest = k % ks;
    sum = full ? sat_mul((uint64_t)full, (uint64_t)round32(ks)) : 0; /* full > 0: ks <= k */
    if (rest) sum = sat_add(sum, (uint64_t)round32(rest));
    return sat_mul((uint64_t)round32(n), sum);
}

/* layout == npu_layout(n, k, ks), with Python's dict and list equality. ks was read from this layout's
 * own k_segment (so that key is equal by construction); INT64_MAX stands for any width >= k. */
static int layout_equals_npu(const J *j, const cJSON *lay, int64_t n, int64_t k, int64_t ks) {
    static const char *const keys[] = {"kind", "tile_n", "tile_k", "n_pad", "k_segment", "segments"};
    if (!cJSON_IsObject(lay)) return 0;
    for (const cJSON *c = lay->child; c; c = c->next) {
        int ok = 0;
        for (int i = 0; i < 6; i++) ok |= key_is(j, c, keys[i]);
        if (!ok) return 0;
    }
    if (!str_eq(j, get(j, lay, "kind"), "npu_int8") || !eq_int(j, get(j, lay, "tile_n"), 32) ||
        !eq_int(j, get(j, lay, "tile_k"), 32) || !eq_int(j, get(j, lay, "n_pad"), round32(n)) ||
        !get(j, lay, "k_segment"))
        return 0;
    const cJSON *segs = get(j, lay, "segments");
    if (!cJSON_IsArray(segs)) return 0;
    const cJSON *s = segs->child;
    for (int64_t k0 = 0; k0 < k; s = s->next) {
        if (!s || !cJSON_IsArray(s)) return 0;
        int64_t k1 = (k - k0 > ks) ? k0 + ks : k;
        const cJSON *a = s->child, *b = a ? a->next : NULL, *c = b ? b->next : NULL;
        if (!c || c->next || !eq_int(j, a, k0) || !eq_int(j, b, k1) || !eq_int(j, c, round32(k1 - k0))) return 0;
        k0 = k1;
    }
    return s == NULL;
}

/* ------------------------------------------------------------------ header validation */

typedef struct {
    const J *j;
    struct orkpack *pk;
    uint64_t lo, hi, max_numel;
    span_t *spans;
    size_t nspans;
    char *why;
    size_t whylen;
    int newer;
} V;

static int prob(V *v, int newer, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->why, v->whylen, fmt, ap);
    va_end(ap);
    v->newer = newer;
    return 1;
}

/* check_layout(shape, encoding, layout): why a layout record is inconsistent (returns 1), or 0 */
static int check_layout(V *v, const char *name, int ndim, const int64_t *dims, const cJSON *sshape, const cJSON *lay,
                        int64_t *ks_out) {
    const J *j = v->j;
    *ks_out = 0;
    if (!cJSON_IsObject(lay) || !has(j, lay, "kind")) return prob(v, 0, "%s: layout record missing", name);
    const cJSON *kind = get(j, lay, "kind");
    if (str_eq(j, kind, "row_major")) {
        for (const cJSON *c = lay->child; c; c = c->next)
            if (!key_is(j, c, "kind")) return prob(v, 0, "%s: row_major layout has extra keys", name);
        return 0;
    }
    if (!str_eq(j, kind, "npu_int8")) return prob(v, 0, "%s: unknown layout", name);
    if (ndim != 2) return prob(v, 0, "%s: npu_int8 layout needs a 2-D slice", name);
    const cJSON *ksn = get(j, lay, "k_segment");
    int64_t ks;
    /* an int k_segment beyond int64 is a valid (single-segment) width when it is a multiple of 32 */
    if (!is_int(j, ksn) || int_val(j, ksn, &ks) < 0 || ks <= 0 || valtok(j, ksn)->mod32)
        return prob(v, 0, "%s: npu_int8 k_segment invalid", name);
    /* all(_is_int(d) and d >= 1 for d in shape): the slice's own shape values (== the tensor's) */
    for (const cJSON *d = sshape->child; d; d = d->next)
        if (!is_int(j, d)) return prob(v, 0, "%s: npu_int8 layout record does not match the slice shape", name);
    const cJSON *segs = get(j, lay, "segments");
    int64_t n = dims[0], k = dims[1];
    if (n < 1 || k < 1 || !cJSON_IsArray(segs))
        return prob(v, 0, "%s: npu_int8 layout record does not match the slice shape", name);
    uint64_t want = (uint64_t)(k / ks + (k % ks != 0)); /* ks may exceed int64 range only via ovf (then > k) */
    if ((uint64_t)cJSON_GetArraySize(segs) != want || (size_t)cJSON_GetArraySize(segs) > (size_t)INT32_MAX)
        return prob(v, 0, "%s: npu_int8 layout record does not match the slice shape", name);
    if (!layout_equals_npu(j, lay, n, k, ks))
        return prob(v, 0, "%s: npu_int8 layout record does not match the slice shape", name);
    *ks_out = ks;
    return 0;
}

/* expected part sizes of a slice (saturating): expected_part_sizes */
static void part_sizes(int enc, int dtype, int ndim, const int64_t *dims, uint64_t numel, int npu_layout, int64_t ks,
                       uint64_t out[ORKPACK_MAX_PARTS]) {
    switch (enc) {
    case ORKPACK_ENC_F32: out[0] = sat_mul(numel, 4); break;
    case ORKPACK_ENC_F16:
    case ORKPACK_ENC_BF16: out[0] = sat_mul(numel, 2); break;
    case ORKPACK_ENC_RAW: out[0] = sat_mul(numel, RAW_SIZE[dtype]); break;
    case ORKPACK_ENC_NF4:
        out[0] = numel / 2 + (numel & 1);
        out[1] = sat_mul(4, numel / ORKPACK_NF4_BLOCK + (numel % ORKPACK_NF4_BLOCK != 0));
        break;
    case ORKPACK_ENC_NF4DQ: {
        uint64_t nb = numel / ORKPACK_NF4DQ_BLOCK + (numel % ORKPACK_NF4DQ_BLOCK != 0);
        out[0] = numel / 2 + (numel & 1);
        out[1] = nb;
        out[2] = sat_mul(4, nb / ORKPACK_NF4DQ_GROUP + (nb % ORKPACK_NF4DQ_GROUP != 0));
        out[3] = 4;
        break;
    }
    case ORKPACK_ENC_INT5DQ:
    case ORKPACK_ENC_INT6DQ:
    case ORKPACK_ENC_INT8DQ: { /* 1.7: ceil(n b / 8) code bytes, then nf4dq's scales */
        const uint64_t b = (uint64_t)intdq_bits(enc);
        uint64_t nb = numel / ORKPACK_NF4DQ_BLOCK + (numel % ORKPACK_NF4DQ_BLOCK != 0);
        out[0] = numel / 8 * b + ((numel % 8) * b + 7) / 8; /* ceil(numel b / 8) without overflow */
        out[1] = nb;
        out[2] = sat_mul(4, nb / ORKPACK_NF4DQ_GROUP + (nb % ORKPACK_NF4DQ_GROUP != 0));
        out[3] = 4;
        break;
    }
    default: { /* int8 */
        uint64_t rows = ndim == 2 ? (uint64_t)dims[0] : 1;
        out[0] = npu_layout ? tiled_bytes(dims[0], dims[1], ks) : numel;
        out[1] = sat_mul(4, rows);
    }
    }
}

/* one part record: returns 1 with a problem */
static int check_part(V *v, const char *name, const char *what, const char *pn, const cJSON *pr, uint64_t want,
                      orkpack_part_t *out) {
    const J *j = v->j;
    const cJSON *offn = get(j, pr, "offset"), *sizen = get(j, pr, "size");
    if (!cJSON_IsObject(pr) || !is_int(j, offn) || !is_int(j, sizen))
        return prob(v, 0, "%s: malformed %spart %s", name, what, pn);
    uint64_t h;
    if (!is_hex16(j, get(j, pr, "xxh3"), &h)) return prob(v, 0, "%s: %spart %s has no checksum", name, what, pn);
    int64_t off, size;
    int oo = int_val(j, offn, &off), so = int_val(j, sizen, &size);
    if (so || size < 0 || (uint64_t)size != want)
        return prob(v, 0, "%s: %spart %s is %lld bytes, its shape and encoding say %llu", name, what, pn,
                    (long long)size, (unsigned long long)want);
    /* off % ALIGN or off < lo or off + size > hi (an offset beyond int64 is always one of these) */
    if (oo || off < 0 || off % ORKPACK_ALIGN || (uint64_t)off < v->lo || (uint64_t)size > v->hi ||
        (uint64_t)off > v->hi - (uint64_t)size)
        return prob(v, 0, "%s: %spart %s at %lld+%lld is outside the data section or unaligned", name, what, pn,
                    (long long)off, (long long)size);
    v->spans[v->nspans].a = (uint64_t)off;
    v->spans[v->nspans].b = (uint64_t)off + (uint64_t)size;
    v->nspans++;
    out->name = pn;
    out->offset = (uint64_t)off;
    out->size = (uint64_t)size;
    out->xxh3 = h;
    out->ptr = v->pk->map + off;
    return 0;
}

static int check_host_copy(V *v, const char *name, const cJSON *s, orkpack_slice_t *sl) {
    const J *j = v->j;
    const cJSON *hc = get(j, s, "host_copy");
    if (!cJSON_IsObject(hc)) return prob(v, 0, "%s: host_copy is not an object", name);
    /* spec.HOST_COPY_ENCODINGS: nf4, nf4dq (1.5), int5dq, int6dq (1.8) */
    const cJSON *he = get(j, hc, "encoding");
    int henc = str_eq(j, he, "nf4") ? ORKPACK_ENC_NF4 : str_eq(j, he, "nf4dq") ? ORKPACK_ENC_NF4DQ
               : str_eq(j, he, "int5dq") ? ORKPACK_ENC_INT5DQ : str_eq(j, he, "int6dq") ? ORKPACK_ENC_INT6DQ : -1;
    if (henc < 0) return prob(v, 1, "%s: unknown host copy encoding", name);
    if (sl->tier != ORKPACK_TIER_NPU) return prob(v, 0, "%s: a host slice has a host copy (only NPU slices have one)", name);
    if ((sl->encoding != ORKPACK_ENC_INT8 && sl->encoding != ORKPACK_ENC_NF4) || sl->ndim != 2)
        return prob(v, 0, "%s: a host copy belongs to a 2-D int8 or nf4 NPU slice", name);
    const cJSON *lay = get(j, hc, "layout");
    int ok = cJSON_IsObject(lay) && str_eq(j, get(j, lay, "kind"), "row_major");
    for (const cJSON *c = ok ? lay->child : NULL; c; c = c->next) ok &= key_is(j, c, "kind");
    if (!ok) return prob(v, 0, "%s: host copy layout must be row_major", name);
    const cJSON *sq = get(j, hc, "sqnr_db");
    if (!is_none(sq) && !is_num(sq)) return prob(v, 0, "%s: host copy sqnr_db is not a number", name);
    const cJSON *parts = get(j, hc, "parts");
    int np;
    const char *const *pnames = enc_parts(henc, &np);
    if (!keys_are(j, parts, pnames, np)) return prob(v, 0, "%s: host copy parts are not %s", name, parts_repr(henc));
    uint64_t sizes[ORKPACK_MAX_PARTS];
    part_sizes(henc, -1, sl->ndim, sl->shape, sl->numel, 0, 0, sizes);
    for (int i = 0; i < np; i++)
        if (check_part(v, name, "host copy ", pnames[i], get(j, parts, pnames[i]), sizes[i], &sl->host_parts[i]))
            return 1;
    sl->has_host_copy = 1;
    sl->host_encoding = henc;
    sl->host_nparts = np;
    sl->has_host_sqnr_db = is_num(sq);
    sl->host_sqnr_db = is_num(sq) ? sq->valuedouble : 0.0;
    if (is_num(sq)) sl->host_sqnr_db = valtok(j, sq)->d;
    return 0;
}

static int check_slice(V *v, const char *name, const cJSON *t, int i, int raw, int stacked, int tndim,
                       const int64_t *tdims, const cJSON *s, orkpack_slice_t *sl) {
    const J *j = v->j;
    memset(sl, 0, sizeof *sl);
    sl->dtype = ORKPACK_RAW_NONE;
    (void)t;
    if (!cJSON_IsObject(s)) return prob(v, 0, "%s: malformed slice", name);
    const cJSON *encn = get(j, s, "encoding"), *sshape = get(j, s, "shape");
    int enc = lookup(j, encn, ENC_NAMES, N_ENCODINGS);
    if (enc < 0) return prob(v, 1, "%s: unknown encoding", name);
    const cJSON *tier = get(j, s, "tier");
    int tr = str_eq(j, tier, "npu") ? ORKPACK_TIER_NPU : str_eq(j, tier, "host") ? ORKPACK_TIER_HOST : -1;
    if (tr < 0) return prob(v, 0, "%s: unknown tier", name);
    sl->encoding = enc;
    sl->tier = tr;
    if (enc == ORKPACK_ENC_RAW) {
        int dt = lookup(j, get(j, s, "dtype"), RAW_NAMES, 11);
        if (dt < 0) return prob(v, 1, "%s: unknown raw element type", name);
        sl->dtype = dt;
        if (!raw) return prob(v, 0, "%s: a raw slice must be its tensor's only slice", name);
        if (tr != ORKPACK_TIER_HOST) return prob(v, 0, "%s: raw slices live on the host", name);
        if (!is_none(get(j, s, "min_m")) || !is_none(get(j, s, "sqnr_db")) || has(j, s, "inflate"))
            return prob(v, 0, "%s: a raw slice has no min_m, sqnr_db or inflate record", name);
    }
    /* want_shape = shape[1:] if stacked else shape; expert = i or None */
    int ndim = stacked ? tndim - 1 : tndim;
    const int64_t *dims = stacked ? tdims + 1 : tdims;
    int ok = cJSON_IsArray(sshape) && cJSON_GetArraySize(sshape) == ndim;
    if (ok) {
        int d = 0;
        for (const cJSON *c = sshape->child; c; c = c->next, d++) ok &= eq_int(j, c, dims[d]);
    }
    const cJSON *ex = get(j, s, "expert");
    if (!ex) ok = 0; /* "missing" */
    else if (stacked) ok &= !cJSON_IsBool(ex) && eq_int(j, ex, i);
    else ok &= cJSON_IsNull(ex);
    if (!ok) return prob(v, 0, "%s: slice %d shape or expert index does not match the tensor", name, i);
    sl->expert = stacked ? i : -1;
    sl->ndim = ndim;
    uint64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        sl->shape[d] = dims[d];
        numel = sat_mul(numel, (uint64_t)dims[d]);
        if (dims[d] == 0) numel = 0;
    }
    if (numel == 0) for (int d = 0; d < ndim; d++) if (dims[d] == 0) numel = 0;
    sl->numel = numel;
    if (numel > v->max_numel) return prob(v, 0, "%s: shape cannot fit in the data section", name);
    const cJSON *sq = get(j, s, "sqnr_db");
    if (!is_none(sq) && !is_num(sq)) return prob(v, 0, "%s: sqnr_db is not a number", name);
    sl->has_sqnr_db = is_num(sq);
    if (is_num(sq)) sl->sqnr_db = valtok(j, sq)->d;
    const cJSON *lay = get(j, s, "layout");
    int64_t ks = 0;
    if (check_layout(v, name, ndim, dims, sshape, lay, &ks)) return 1;
    if (enc == ORKPACK_ENC_INT8 && ndim > 2) return prob(v, 0, "%s: int8 slices are 1-D or 2-D", name);
    int npu_lay = str_eq(j, get(j, lay, "kind"), "npu_int8");
    sl->layout = npu_lay ? ORKPACK_LAYOUT_NPU_INT8 : ORKPACK_LAYOUT_ROW_MAJOR;
    sl->k_segment = ks;
    if (npu_lay && (enc != ORKPACK_ENC_INT8 || tr != ORKPACK_TIER_NPU))
        return prob(v, 0, "%s: npu_int8 layout is only for int8 slices on the NPU", name);
    if ((enc == ORKPACK_ENC_NF4DQ || IS_INTDQ(enc)) && tr != ORKPACK_TIER_HOST)
        return prob(v, 0, "%s: %s slices live on the host (an NPU slice is int8, or nf4 to inflate)", name,
                    ENC_NAMES[enc]);
    const cJSON *mm = get(j, s, "min_m");
    if (tr == ORKPACK_TIER_NPU) {
        int64_t m;
        if (!is_int(j, mm) || (int_val(j, mm, &m) == 0 && m < 2) || (int_val(j, mm, &m) < 0))
            return prob(v, 0, "%s: NPU slice min_m must be >= 2 (M = 1 never goes to the NPU)", name);
        if (enc == ORKPACK_ENC_NF4) {
            const cJSON *inf = get(j, s, "inflate");
            const cJSON *qs = get(j, inf, "q_size");
            int64_t q;
            if (!cJSON_IsObject(inf) || !cJSON_IsObject(get(j, inf, "layout")) || !is_int(j, qs) ||
                (int_val(j, qs, &q) < 0) || q < 0 || !is_hex16(j, get(j, inf, "q_xxh3"), &sl->inflate_q_xxh3) ||
                !is_hex16(j, get(j, inf, "scale_xxh3"), &sl->inflate_scale_xxh3))
                return prob(v, 0, "%s: NPU nf4 slice has no valid inflate record", name);
            sl->has_inflate = 1;
            sl->inflate_q_size = int_val(j, qs, &q) ? UINT64_MAX : (uint64_t)q;
            const cJSON *iks = get(j, get(j, inf, "layout"), "k_segment");
            int64_t kv;
            if (is_int(j, iks) && int_val(j, iks, &kv) == 0 && kv >= 32 && kv % 32 == 0) sl->inflate_k_segment = kv;
        }
    } else if (!is_none(mm) && !is_int(j, mm)) {
        return prob(v, 0, "%s: min_m is not an integer", name);
    }
    if (is_int(j, mm)) {
        int64_t m;
        int o = int_val(j, mm, &m);
        sl->has_min_m = 1;
        sl->min_m = o > 0 ? INT64_MAX : m;
    }
    uint64_t sizes[ORKPACK_MAX_PARTS];
    part_sizes(enc, sl->dtype, ndim, dims, numel, npu_lay, ks, sizes);
    int np;
    const char *const *pnames = enc_parts(enc, &np);
    const cJSON *parts = get(j, s, "parts");
    if (!keys_are(j, parts, pnames, np))
        return prob(v, 0, "%s: parts are not %s", name, parts_repr(enc));
    sl->nparts = np;
    for (int p = 0; p < np; p++)
        if (check_part(v, name, "", pnames[p], get(j, parts, pnames[p]), sizes[p], &sl->parts[p])) return 1;
    if (has(j, s, "host_copy") && check_host_copy(v, name, s, sl)) return 1;
    return 0;
}

static int span_cmp(const void *a, const void *b) {
    const span_t *x = (const span_t *)a, *y = (const span_t *)b;
    if (x->a != y->a) return x->a < y->a ? -1 : 1;
    if (x->b != y->b) return x->b < y->b ? -1 : 1;
    return 0;
}

/* validate_header(h, p); fills the tensor and slice tables. 0 valid, 1 a problem (v->why), -2 no memory */
static int validate(V *v, const cJSON *h) {
    const J *j = v->j;
    struct orkpack *pk = v->pk;
    const cJSON *tensors = get(j, h, "tensors");
    if (!cJSON_IsObject(h) || !str_eq(j, get(j, h, "format"), "orkpack") || !cJSON_IsArray(tensors))
        return prob(v, 0, "header is not an orkpack header");
    static const char *const objkeys[] = {"tool", "provenance", "config", "model", "tiermap"};
    for (int i = 0; i < 5; i++) {
        const cJSON *x = get(j, h, objkeys[i]);
        if (!is_none(x) && !cJSON_IsObject(x)) return prob(v, 0, "header key '%s' is not an object", objkeys[i]);
    }
    size_t nt = 0, ns = 0, maxparts = 0;
    for (const cJSON *t = tensors->child; t; t = t->next) {
        nt++;
        const cJSON *sl = get(j, t, "slices");
        if (cJSON_IsArray(sl))
            for (const cJSON *s = sl->child; s; s = s->next) ns++;
    }
    if (nt > MAX_TENSORS) return prob(v, 0, "too many tensors");
    maxparts = 2 * ORKPACK_MAX_PARTS * ns; /* a slice's own parts and its host copy's */
    pk->tensors = (orkpack_tensor_t *)calloc(nt ? nt : 1, sizeof *pk->tensors);
    pk->slices = (orkpack_slice_t *)calloc(ns ? ns : 1, sizeof *pk->slices);
    pk->slice_nodes = (const cJSON **)calloc(ns ? ns : 1, sizeof *pk->slice_nodes);
    v->spans = (span_t *)malloc((maxparts ? maxparts : 1) * sizeof *v->spans);
    if (!pk->tensors || !pk->slices || !pk->slice_nodes || !v->spans) return -2;
    size_t si = 0;
    for (const cJSON *t = tensors->child; t; t = t->next) {
        const cJSON *nm = get(j, t, "name"), *sl = get(j, t, "slices");
        if (!cJSON_IsObject(t) || !is_str(nm) || !cJSON_IsArray(sl)) return prob(v, 0, "malformed tensor record");
        const jtok_t *nt_ = valtok(j, nm);
        char name[160];
        escape_bytes(tokstr(j, nt_), nt_->len, name, sizeof name, 120);
        if (nt_->len > MAX_NAME_BYTES) return prob(v, 0, "tensor name too long (%s)", name);
        const cJSON *srcn = get(j, t, "source_name"), *srcd = get(j, t, "source_dtype");
        if (!is_str(srcn) || !is_str(srcd)) return prob(v, 0, "%s: source_name or source_dtype missing", name);
        const cJSON *shape = get(j, t, "shape");
        int ndim = cJSON_IsArray(shape) ? cJSON_GetArraySize(shape) : -1;
        if (ndim < 0 || ndim > MAX_DIMS) return prob(v, 0, "%s: bad shape", name);
        int64_t dims[4] = {0, 0, 0, 0};
        int d = 0;
        for (const cJSON *c = shape->child; c; c = c->next, d++) {
            if (!is_int(j, c) || int_val(j, c, &dims[d]) || dims[d] < 0 || (uint64_t)dims[d] > MAX_DIM)
                return prob(v, 0, "%s: bad shape", name);
        }
        int nsl = cJSON_GetArraySize(sl);
        const cJSON *s0 = sl->child;
        int raw = nsl > 0 && cJSON_IsObject(s0) && str_eq(j, get(j, s0, "encoding"), "raw");
        /* one slice covering the tensor ("expert": null) whatever its rank; a 3-D tensor whose first slice
           has an expert index is a stack of experts, one slice per expert */
        const cJSON *ex0 = nsl > 0 ? get(j, s0, "expert") : NULL;
        int stacked = ndim == 3 && !raw && !(ex0 && cJSON_IsNull(ex0));
        if (stacked) {
            if ((int64_t)nsl != dims[0]) return prob(v, 0, "%s: %d slices for %lld experts", name, nsl, (long long)dims[0]);
        } else if (nsl != 1) {
            return prob(v, 0, "%s: a %d-D %stensor must have one slice", name, ndim, raw ? "raw " : "");
        }
        orkpack_tensor_t *tt = &pk->tensors[pk->ntensors];
        tt->name = tokstr(j, nt_);
        tt->name_len = nt_->len;
        tt->source_name = tokstr(j, valtok(j, srcn));
        tt->source_dtype = tokstr(j, valtok(j, srcd));
        tt->ndim = ndim;
        memcpy(tt->shape, dims, sizeof dims);
        tt->slices = &pk->slices[si];
        int i = 0;
        for (const cJSON *s = sl->child; s; s = s->next, i++) {
            if (check_slice(v, name, t, i, raw, stacked, ndim, dims, s, &pk->slices[si])) return 1;
            pk->slice_nodes[si] = s;
            si++;
        }
        tt->nslices = (size_t)nsl;
        pk->ntensors++;
    }
    pk->nslices = si;
    qsort(v->spans, v->nspans, sizeof *v->spans, span_cmp);
    for (size_t i = 0; i + 1 < v->nspans; i++)
        if (v->spans[i + 1].a < v->spans[i].b) return prob(v, 0, "parts overlap");
    return 0;
}

/* token index of every node (see jscan.h): the key's if it has one, else its value's, else -1 */
static int attach(cJSON *n, size_t *k, size_t ntok) {
    for (; n; n = n->next) {
        int first = -1;
        if (n->string) {
            if (*k >= ntok) return -1;
            first = (int)(*k)++;
        }
        if (cJSON_IsString(n) || cJSON_IsNumber(n)) {
            if (*k >= ntok) return -1;
            size_t at = (*k)++;
            if (first < 0) first = (int)at;
        }
        n->valueint = first;
        if ((cJSON_IsArray(n) || cJSON_IsObject(n)) && attach(n->child, k, ntok)) return -1;
    }
    return 0;
}

static uint64_t cap_from_header(const J *j, const cJSON *h, const char **src) {
    static const char *const chains[5][4] = {
        {"board", "iova_usable_bytes", NULL}, {"board", "iova_usable", NULL}, {"budget", "npu", "cap", NULL},
        {"budgets", "npu", "cap", NULL}, {"npu", "cap", NULL}};
    static const char *const names[5] = {"tiermap.board.iova_usable_bytes", "tiermap.board.iova_usable",
                                         "tiermap.budget.npu.cap", "tiermap.budgets.npu.cap", "tiermap.npu.cap"};
    const cJSON *tm = get(j, h, "tiermap");
    if (cJSON_IsObject(tm)) {
        for (int c = 0; c < 5; c++) {
            const cJSON *x = tm;
            for (int i = 0; chains[c][i] && x; i++) x = get(j, x, chains[c][i]);
            int64_t val;
            if (x && is_int(j, x) && int_val(j, x, &val) == 0 && val >= 0 && (uint64_t)val <= IOVA_SPACE) {
                *src = names[c];
                return (uint64_t)val;
            }
        }
    }
    *src = "default (4 GiB - 104 MiB)";
    return DEFAULT_IOVA_CAP;
}

/* ------------------------------------------------------------------ open / close */

static int popcount8(unsigned x) { int c = 0; for (; x; x &= x - 1) c++; return c; }

static int open_checked(struct orkpack *pk, orkpack_err_t *err) {
    const char *L = pk->label;
    struct stat st;
    if (fstat(pk->fd, &st)) return seterr(err, ORKPACK_E_UNUSABLE, "%s: cannot open (%s)", L, strerror(errno));
    if (S_ISDIR(st.st_mode)) return seterr(err, ORKPACK_E_UNUSABLE, "%s: is a folder, not a pack", L);
    if (!S_ISREG(st.st_mode)) return seterr(err, ORKPACK_E_UNUSABLE, "%s: not a regular file", L);
    if ((uint64_t)st.st_size > SIZE_MAX) return seterr(err, ORKPACK_E_UNUSABLE, "%s: too large to map", L);
    pk->size = (size_t)st.st_size;
    if (pk->size) {
        void *m = mmap(NULL, pk->size, PROT_READ, MAP_SHARED, pk->fd, 0);
        if (m == MAP_FAILED) return seterr(err, ORKPACK_E_UNUSABLE, "%s: cannot map (%s)", L, strerror(errno));
        pk->map = (uint8_t *)m;
    }
    const uint8_t *b = pk->map;
    if (pk->size < 8 || memcmp(b, ORKPACK_MAGIC, 8) != 0) {
        if (pk->size >= 8) {
            int bits = 0;
            for (int i = 0; i < 8; i++) bits += popcount8((unsigned)(b[i] ^ (uint8_t)ORKPACK_MAGIC[i]));
            if (bits <= 3) return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: the magic number is corrupted", L);
        }
        return seterr(err, ORKPACK_E_UNUSABLE, "%s: not an orkpack file (build one with `orkpack build`)", L);
    }
    if (pk->size < ORKPACK_PREAMBLE_BLOCK)
        return seterr(err, ORKPACK_E_UNUSABLE,
                      "%s: truncated pack (%zu bytes, less than the 4096-byte preamble); rebuild or re-copy it", L, pk->size);
    memcpy(&pk->pre, b, sizeof pk->pre); /* little-endian host (x86-64, aarch64) */
    const orkpack_preamble_t *p = &pk->pre;
    uint8_t block[ORKPACK_PREAMBLE_BLOCK];
    memcpy(block, b, sizeof block);
    memset(block + ORKPACK_PREAMBLE_XXH3_OFFSET, 0, 8);
    if (XXH3_64bits(block, sizeof block) != p->preamble_xxh3)
        return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: preamble checksum mismatch", L);
    if (p->version_major > ORKPACK_VERSION_MAJOR)
        return seterr(err, ORKPACK_E_UNUSABLE, "%s: made by a newer orkpack (format %u.%u, this one reads %d.x); upgrade orkpack",
                      L, p->version_major, p->version_minor, ORKPACK_VERSION_MAJOR);
    if (p->version_major < 1)
        return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: format version %u.%u does not exist", L,
                      p->version_major, p->version_minor);
    const char *bad = NULL;
    int zero = 1;
    for (int i = 0; i < 40; i++) zero &= p->reserved[i] == 0;
    char flags[64];
    if (p->preamble_size != ORKPACK_PREAMBLE_SIZE || p->alignment != ORKPACK_ALIGN || p->data_offset != ORKPACK_PREAMBLE_BLOCK)
        bad = "preamble constants are wrong";
    else if (p->flags & ~ORKPACK_KNOWN_FLAGS) {
        snprintf(flags, sizeof flags, "unknown flags 0x%x", p->flags & ~ORKPACK_KNOWN_FLAGS);
        bad = flags;
    } else if (p->flags && p->version_minor < ORKPACK_VERSION_MINOR_MAX) {
        snprintf(flags, sizeof flags, "flags 0x%x in a format %u.%u pack (they are 1.8's)", p->flags, p->version_major,
                 p->version_minor);
        bad = flags;
    }
    else if (!zero) bad = "reserved preamble bytes are not zero";
    else if (p->data_size % ORKPACK_ALIGN || p->data_size > UINT64_MAX - p->data_offset ||
             p->header_offset != p->data_offset + p->data_size)
        bad = "data section bounds are inconsistent";
    else if (p->header_size > UINT64_MAX - p->header_offset || p->file_size != p->header_offset + p->header_size)
        bad = "file size does not add up";
    else if (p->header_size > ORKPACK_MAX_HEADER_SIZE || p->header_size == 0)
        bad = "header size is out of range";
    if (bad) return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: %s", L, bad);
    if ((uint64_t)pk->size < p->file_size)
        return seterr(err, ORKPACK_E_UNUSABLE, "%s: truncated pack (%zu of %llu bytes); rebuild or re-copy it", L, pk->size,
                      (unsigned long long)p->file_size);
    if ((uint64_t)pk->size > p->file_size)
        return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: %llu unexpected bytes after the end", L,
                      (unsigned long long)((uint64_t)pk->size - p->file_size));
    const char *hb = (const char *)b + p->header_offset;
    size_t hs = (size_t)p->header_size;
    if (XXH3_64bits(hb, hs) != p->header_xxh3)
        return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: header checksum mismatch", L);
    for (size_t i = 0; i < hs; i++)
        if ((unsigned char)hb[i] >= 0x80)
            return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: header is not valid JSON (a non-ASCII byte at %zu)", L, i);
    char why[256];
    int rc = jscan_run(hb, hs, ORKPACK_MAX_JSON_DEPTH, &pk->js, why, sizeof why);
    if (rc == -2) return seterr(err, ORKPACK_E_NOMEM, "%s: out of memory reading the header", L);
    if (rc) return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: header is not valid JSON (%s)", L, why);
    pk->root = cJSON_ParseWithLength(pk->js.rw, pk->js.rw_len);
    if (!pk->root) return seterr(err, ORKPACK_E_NOMEM, "%s: out of memory reading the header", L);
    size_t k = 0;
    if (attach(pk->root, &k, pk->js.ntok) || k != pk->js.ntok)
        return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: header is not valid JSON (internal token mismatch)", L);
    J j = {&pk->js};
    char problem[400];
    V v = {&j, pk, p->data_offset, p->header_offset, 0, NULL, 0, problem, sizeof problem, 0};
    uint64_t ds = p->header_offset - p->data_offset;
    v.max_numel = sat_add(sat_mul(2, ds), 2);
    rc = validate(&v, pk->root);
    free(v.spans);
    if (rc == -2) return seterr(err, ORKPACK_E_NOMEM, "%s: out of memory reading the header", L);
    if (rc && v.newer && p->version_minor > ORKPACK_VERSION_MINOR_MAX)
        return seterr(err, ORKPACK_E_UNUSABLE,
                      "%s: made by a newer orkpack (format %u.%u, this one reads up to %d.%d): %s; upgrade orkpack", L,
                      p->version_major, p->version_minor, ORKPACK_VERSION_MAJOR, ORKPACK_VERSION_MINOR_MAX, problem);
    if (rc) return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: %s", L, problem);
    /* flag bit 0 (1.8) and its record, provenance.rotation.r4, come together (FORMAT.md 11) */
    int flagged = (p->flags & ORKPACK_FLAG_ONLINE_R4) != 0;
    if (flagged == is_none(get(&j, get(&j, get(&j, pk->root, "provenance"), "rotation"), "r4")))
        return seterr(err, ORKPACK_E_DAMAGED,
                      "%s: damaged pack: the preamble's online-Hadamard flag and provenance.rotation.r4 disagree", L);
    pk->cap = cap_from_header(&j, pk->root, &pk->cap_source);
    return ORKPACK_OK;
}

int orkpack_open(const char *path, orkpack_t **out, orkpack_err_t *err) {
    if (err) { err->code = 0; err->msg[0] = '\0'; }
    if (!path || !out) return seterr(err, ORKPACK_E_ARGS, "orkpack_open: NULL argument");
    *out = NULL;
    struct orkpack *pk = (struct orkpack *)calloc(1, sizeof *pk);
    if (!pk) return seterr(err, ORKPACK_E_NOMEM, "out of memory");
    escape_bytes(path, strlen(path), pk->label, sizeof pk->label, 160);
    pk->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (pk->fd < 0) {
        int e = errno;
        free(pk);
        char label[200];
        escape_bytes(path, strlen(path), label, sizeof label, 160);
        if (e == ENOENT) return seterr(err, ORKPACK_E_UNUSABLE, "%s: no such file", label);
        if (e == EISDIR) return seterr(err, ORKPACK_E_UNUSABLE, "%s: is a folder, not a pack", label);
        return seterr(err, ORKPACK_E_UNUSABLE, "%s: cannot open (%s)", label, strerror(e));
    }
    int rc = open_checked(pk, err);
    if (rc) {
        orkpack_close(pk);
        return rc;
    }
    *out = pk;
    return ORKPACK_OK;
}

void orkpack_close(orkpack_t *pk) {
    if (!pk) return;
    if (pk->root) cJSON_Delete(pk->root);
    jscan_free(&pk->js);
    free(pk->tensors);
    free(pk->slices);
    free(pk->slice_nodes);
    if (pk->map) munmap(pk->map, pk->size);
    if (pk->fd >= 0) close(pk->fd);
    free(pk);
}

/* ------------------------------------------------------------------ access */

const orkpack_preamble_t *orkpack_preamble(const orkpack_t *pk) { return &pk->pre; }
const char *orkpack_header_json(const orkpack_t *pk, size_t *len) {
    if (len) *len = (size_t)pk->pre.header_size;
    return (const char *)pk->map + pk->pre.header_offset;
}
const uint8_t *orkpack_file(const orkpack_t *pk, size_t *len) {
    if (len) *len = pk->size;
    return pk->map;
}
size_t orkpack_tensor_count(const orkpack_t *pk) { return pk->ntensors; }
const orkpack_tensor_t *orkpack_tensor(const orkpack_t *pk, size_t i) { return i < pk->ntensors ? &pk->tensors[i] : NULL; }
const orkpack_tensor_t *orkpack_find_n(const orkpack_t *pk, const char *name, size_t len) {
    for (size_t i = 0; i < pk->ntensors; i++)
        if (pk->tensors[i].name_len == len && memcmp(pk->tensors[i].name, name, len) == 0) return &pk->tensors[i];
    return NULL;
}
const orkpack_tensor_t *orkpack_find(const orkpack_t *pk, const char *name) {
    return name ? orkpack_find_n(pk, name, strlen(name)) : NULL;
}

/* ------------------------------------------------------------------ checksums */

int orkpack_check_data(const orkpack_t *pk, orkpack_err_t *err) {
    const orkpack_preamble_t *p = &pk->pre;
    if (XXH3_64bits(pk->map + p->data_offset, (size_t)p->data_size) == p->data_xxh3) return ORKPACK_OK;
    /* name the place: the first part whose own checksum fails, or the padding */
    for (size_t i = 0; i < pk->nslices; i++) {
        const orkpack_slice_t *s = &pk->slices[i];
        for (int h = 0; h < 2; h++) {
            const orkpack_part_t *parts = h ? s->host_parts : s->parts;
            int np = h ? s->host_nparts : s->nparts;
            for (int k = 0; k < np; k++)
                if (XXH3_64bits(parts[k].ptr, (size_t)parts[k].size) != parts[k].xxh3) {
                    const orkpack_tensor_t *t = NULL;
                    for (size_t ti = 0; ti < pk->ntensors; ti++)
                        if (s >= pk->tensors[ti].slices && s < pk->tensors[ti].slices + pk->tensors[ti].nslices) t = &pk->tensors[ti];
                    char lab[200];
                    orkpack_slice_label(t, s, lab, sizeof lab);
                    return seterr(err, ORKPACK_E_DAMAGED, "data section checksum mismatch: damaged bytes in %s part %s%s", lab,
                                  h ? "host copy " : "", parts[k].name);
                }
        }
    }
    return seterr(err, ORKPACK_E_DAMAGED, "data section checksum mismatch: damaged bytes in the padding between parts");
}

int orkpack_check_part(const orkpack_t *pk, const orkpack_part_t *part, orkpack_err_t *err) {
    (void)pk;
    uint64_t got = XXH3_64bits(part->ptr, (size_t)part->size);
    if (got == part->xxh3) return ORKPACK_OK;
    return seterr(err, ORKPACK_E_DAMAGED, "part %s checksum mismatch (recorded %016llx, found %016llx)", part->name,
                  (unsigned long long)part->xxh3, (unsigned long long)got);
}

int orkpack_check_parts(const orkpack_t *pk, size_t *nchecked, orkpack_err_t *err) {
    size_t n = 0;
    for (size_t ti = 0; ti < pk->ntensors; ti++) {
        const orkpack_tensor_t *t = &pk->tensors[ti];
        for (size_t si = 0; si < t->nslices; si++) {
            const orkpack_slice_t *s = &t->slices[si];
            for (int h = 0; h < 2; h++) {
                const orkpack_part_t *parts = h ? s->host_parts : s->parts;
                int np = h ? s->host_nparts : s->nparts;
                for (int k = 0; k < np; k++) {
                    n++;
                    if (orkpack_check_part(pk, &parts[k], NULL)) {
                        if (nchecked) *nchecked = n;
                        char lab[200];
                        uint64_t got = XXH3_64bits(parts[k].ptr, (size_t)parts[k].size);
                        return seterr(err, ORKPACK_E_DAMAGED, "%s: part %s%s checksum mismatch (recorded %016llx, found %016llx)",
                                      orkpack_slice_label(t, s, lab, sizeof lab), h ? "host copy " : "", parts[k].name,
                                      (unsigned long long)parts[k].xxh3, (unsigned long long)got);
                    }
                }
            }
        }
    }
    if (nchecked) *nchecked = n;
    return ORKPACK_OK;
}

/* ------------------------------------------------------------------ NPU slices */

uint64_t orkpack_npu_image_size(const orkpack_slice_t *s) {
    if (s->tier != ORKPACK_TIER_NPU) return 0;
    if (s->encoding == ORKPACK_ENC_NF4) return s->inflate_q_size;
    return s->encoding == ORKPACK_ENC_INT8 ? s->parts[0].size : 0;
}

uint64_t orkpack_npu_cap(const orkpack_t *pk, const char **source) {
    if (source) *source = pk->cap_source;
    return pk->cap;
}

/* ------------------------------------------------------------------ the model record (1.3) */

static const cJSON *model_kv_array(const orkpack_t *pk) {
    J jj = {&pk->js};
    const cJSON *m = get(&jj, pk->root, "model");
    const cJSON *kv = cJSON_IsObject(m) ? get(&jj, m, "kv") : NULL;
    return cJSON_IsArray(kv) ? kv : NULL;
}

size_t orkpack_model_kv_count(const orkpack_t *pk) {
    const cJSON *kv = model_kv_array(pk);
    size_t n = 0;
    if (kv)
        for (const cJSON *e = kv->child; e; e = e->next) n++;
    return n;
}

/* a GGUF value type as the record spells it: one of the 12 names, or "array[T]" of one (nested <= 8 deep), the
   whole string (orkpack.pack.model.valid_type) */
static int type_ok(const char *t, size_t len, int depth) {
    static const char *const names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
                                        "string", "uint64", "int64", "float64"};
    if (len > 7 && strncmp(t, "array[", 6) == 0 && t[len - 1] == ']' && depth < 8) return type_ok(t + 6, len - 7, depth + 1);
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strlen(names[i]) == len && memcmp(t, names[i], len) == 0) return 1;
    return 0;
}

static int kv_fill(const orkpack_t *pk, const cJSON *e, size_t i, orkpack_kv_t *out, orkpack_err_t *err) {
    J jj = {&pk->js};
    const cJSON *k = cJSON_IsArray(e) ? e->child : NULL, *t = k ? k->next : NULL, *v = t ? t->next : NULL;
    const jtok_t *kt = valtok(&jj, k), *tt = valtok(&jj, t);
    if (!v || v->next || !kt || kt->kind != JTOK_STR || kt->len == 0 || !tt || tt->kind != JTOK_STR)
        return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: model.kv[%zu] is not a [key, type, value] entry",
                      pk->label, i);
    out->key = tokstr(&jj, kt);
    out->key_len = kt->len;
    out->type = tokstr(&jj, tt);
    if (!type_ok(out->type, tt->len, 0))
        return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: model key %.100s: unknown type %.40s", pk->label,
                      out->key, out->type);
    out->node_ = v;
    if (strncmp(out->type, "array[", 6) == 0) {
        if (!cJSON_IsArray(v))
            return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: model key %.100s: %s value is not a list",
                          pk->label, out->key, out->type);
        size_t n = 0;
        for (const cJSON *x = v->child; x; x = x->next) n++;
        out->count = n;
    } else {
        out->count = 1;
    }
    return ORKPACK_OK;
}

int orkpack_model_kv(const orkpack_t *pk, size_t i, orkpack_kv_t *out, orkpack_err_t *err) {
    if (!pk || !out) return seterr(err, ORKPACK_E_ARGS, "orkpack_model_kv: NULL argument");
    const cJSON *kv = model_kv_array(pk);
    size_t n = 0;
    for (const cJSON *e = kv ? kv->child : NULL; e; e = e->next, n++)
        if (n == i) return kv_fill(pk, e, i, out, err);
    return seterr(err, ORKPACK_E_ARGS, "%s: model entry %zu out of range (%zu entries)", pk->label, i, n);
}

int orkpack_model_find(const orkpack_t *pk, const char *key, orkpack_kv_t *out, orkpack_err_t *err) {
    if (!pk || !key || !out) return seterr(err, ORKPACK_E_ARGS, "orkpack_model_find: NULL argument");
    J jj = {&pk->js};
    const cJSON *kv = model_kv_array(pk);
    size_t L = strlen(key), i = 0;
    for (const cJSON *e = kv ? kv->child : NULL; e; e = e->next, i++) {
        const jtok_t *kt = cJSON_IsArray(e) ? valtok(&jj, e->child) : NULL;
        if (kt && kt->kind == JTOK_STR && kt->len == L && memcmp(tokstr(&jj, kt), key, L) == 0)
            return kv_fill(pk, e, i, out, err);
    }
    return seterr(err, ORKPACK_E_ARGS, "%s: no key %.100s in the pack's model record", pk->label, key);
}

/* the element type of kv (the type itself for a scalar), and the first element node */
static const char *kv_elems(const orkpack_kv_t *kv, const cJSON **first) {
    const cJSON *v = (const cJSON *)kv->node_;
    if (strncmp(kv->type, "array[", 6) == 0) {
        *first = v->child;
        return kv->type + 6; /* "T]" */
    }
    *first = v;
    return kv->type;
}
static int type_is(const char *t, const char *name) {
    size_t L = strlen(name);
    return strncmp(t, name, L) == 0 && (t[L] == 0 || (t[L] == ']' && t[L + 1] == 0));
}

int orkpack_kv_ints(const orkpack_t *pk, const orkpack_kv_t *kv, int64_t *out, size_t n, orkpack_err_t *err) {
    if (!pk || !kv || (!out && n) || n != kv->count)
        return seterr(err, ORKPACK_E_ARGS, "orkpack_kv_ints: NULL argument or n != count");
    static const char *const names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"};
    static const int64_t lo[] = {0, -128, 0, -32768, 0, -2147483648LL, 0, INT64_MIN};
    static const int64_t hi[] = {255, 127, 65535, 32767, 4294967295LL, 2147483647, INT64_MAX, INT64_MAX};
    J jj = {&pk->js};
    const cJSON *x;
    const char *t = kv_elems(kv, &x);
    int ty = -1, is_bool = type_is(t, "bool");
    for (int i = 0; i < 8 && !is_bool; i++)
        if (type_is(t, names[i])) ty = i;
    if (ty < 0 && !is_bool) return seterr(err, ORKPACK_E_ARGS, "model key %.100s is %s, not an integer type", kv->key, kv->type);
    for (size_t i = 0; i < n; i++, x = x->next) {
        if (!x) return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: model key %.100s is short", pk->label, kv->key);
        if (is_bool) {
            if (!cJSON_IsBool(x))
                return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: model key %.100s: bool value is not true/false",
                              pk->label, kv->key);
            out[i] = cJSON_IsTrue(x) ? 1 : 0;
            continue;
        }
        const jtok_t *vt = valtok(&jj, x);
        if (!vt || vt->kind != JTOK_NUM || !vt->is_int || (vt->ovf && !(ty == 6 && vt->ovf > 0)))
            return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: model key %.100s: %s value out of range",
                          pk->label, kv->key, kv->type);
        if (vt->ovf) /* a uint64 above INT64_MAX: valid, but not an int64 */
            return seterr(err, ORKPACK_E_ARGS, "model key %.100s: value above INT64_MAX", kv->key);
        if (vt->i < lo[ty] || vt->i > hi[ty])
            return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: model key %.100s: %s value out of range",
                          pk->label, kv->key, kv->type);
        out[i] = vt->i;
    }
    return ORKPACK_OK;
}

int orkpack_kv_floats(const orkpack_t *pk, const orkpack_kv_t *kv, double *out, size_t n, orkpack_err_t *err) {
    if (!pk || !kv || (!out && n) || n != kv->count)
        return seterr(err, ORKPACK_E_ARGS, "orkpack_kv_floats: NULL argument or n != count");
    J jj = {&pk->js};
    const cJSON *x;
    const char *t = kv_elems(kv, &x);
    if (!type_is(t, "float32") && !type_is(t, "float64"))
        return seterr(err, ORKPACK_E_ARGS, "model key %.100s is %s, not a float type", kv->key, kv->type);
    for (size_t i = 0; i < n; i++, x = x->next) {
        const jtok_t *vt = x ? valtok(&jj, x) : NULL;
        if (vt && vt->kind == JTOK_NUM && !cJSON_IsBool(x)) {
            out[i] = vt->is_int ? (double)vt->i : vt->d;
            if (vt->is_int && vt->ovf) out[i] = vt->d;
            if (!isfinite(out[i])) /* 1e400 or a 400-digit integer: beyond a double (nan and inf are strings) */
                return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: model key %.100s: %s value out of range",
                              pk->label, kv->key, kv->type);
        } else if (vt && vt->kind == JTOK_STR && strcmp(tokstr(&jj, vt), "nan") == 0) {
            out[i] = NAN;
        } else if (vt && vt->kind == JTOK_STR && strcmp(tokstr(&jj, vt), "inf") == 0) {
            out[i] = INFINITY;
        } else if (vt && vt->kind == JTOK_STR && strcmp(tokstr(&jj, vt), "-inf") == 0) {
            out[i] = -INFINITY;
        } else {
            return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: model key %.100s: %s value is not a number",
                          pk->label, kv->key, kv->type);
        }
    }
    return ORKPACK_OK;
}

int orkpack_kv_strings(const orkpack_t *pk, const orkpack_kv_t *kv, const char **out, size_t *lens, size_t n,
                       orkpack_err_t *err) {
    if (!pk || !kv || (!out && n) || n != kv->count)
        return seterr(err, ORKPACK_E_ARGS, "orkpack_kv_strings: NULL argument or n != count");
    J jj = {&pk->js};
    const cJSON *x;
    const char *t = kv_elems(kv, &x);
    if (!type_is(t, "string")) return seterr(err, ORKPACK_E_ARGS, "model key %.100s is %s, not a string type", kv->key, kv->type);
    for (size_t i = 0; i < n; i++, x = x->next) {
        const jtok_t *vt = x ? valtok(&jj, x) : NULL;
        if (!vt || vt->kind != JTOK_STR)
            return seterr(err, ORKPACK_E_DAMAGED, "%s: damaged pack: model key %.100s: string value is not a string",
                          pk->label, kv->key);
        out[i] = tokstr(&jj, vt);
        if (lens) lens[i] = vt->len;
    }
    return ORKPACK_OK;
}

int orkpack_check_npu_slice(const orkpack_t *pk, const orkpack_tensor_t *t, const orkpack_slice_t *s, orkpack_err_t *err) {
    char lab[200];
    orkpack_slice_label(t, s, lab, sizeof lab);
    if (s->tier != ORKPACK_TIER_NPU) return seterr(err, ORKPACK_E_ARGS, "%s: not an NPU slice", lab);
    if (s->ndim != 2 || s->shape[0] < 1 || s->shape[1] < 1)
        return seterr(err, ORKPACK_E_DAMAGED, "%s: NPU slice is not a non-empty 2-D matrix", lab);
    if (s->encoding == ORKPACK_ENC_INT8) {
        if (s->layout != ORKPACK_LAYOUT_NPU_INT8)
            return seterr(err, ORKPACK_E_DAMAGED, "%s: NPU int8 slice is not in the npu_int8 tile layout", lab);
        return ORKPACK_OK;
    }
    if (s->encoding != ORKPACK_ENC_NF4)
        return seterr(err, ORKPACK_E_DAMAGED, "%s: NPU slice has encoding %s; the NPU takes int8 tiles or nf4 to inflate", lab,
                      ENC_NAMES[s->encoding]);
    int64_t n = s->shape[0], k = s->shape[1], ks = s->inflate_k_segment;
    if (!s->has_inflate) return seterr(err, ORKPACK_E_DAMAGED, "%s: NPU nf4 slice has no inflate record", lab);
    if (ks < 32) return seterr(err, ORKPACK_E_DAMAGED, "%s: inflate layout has no valid k_segment", lab);
    size_t idx = (size_t)(s - pk->slices);
    J j = {&pk->js};
    const cJSON *lay = get(&j, get(&j, pk->slice_nodes[idx], "inflate"), "layout");
    int64_t segs = k / ks + (k % ks != 0);
    const cJSON *sg = get(&j, lay, "segments");
    if (!cJSON_IsArray(sg) || cJSON_GetArraySize(sg) != segs || !layout_equals_npu(&j, lay, n, k, ks))
        return seterr(err, ORKPACK_E_DAMAGED, "%s: inflate layout does not match the slice shape", lab);
    uint64_t want = tiled_bytes(n, k, ks);
    if (s->inflate_q_size != want)
        return seterr(err, ORKPACK_E_DAMAGED, "%s: inflate q_size %llu is not the tiled size %llu", lab,
                      (unsigned long long)s->inflate_q_size, (unsigned long long)want);
    return ORKPACK_OK;
}

int orkpack_load_npu(const orkpack_t *pk, const orkpack_slice_t *s, void *q, size_t q_size, float *scale,
                     size_t scale_count, int clean, orkpack_err_t *err) {
    (void)pk;
    if (!s || !q || !scale || s->tier != ORKPACK_TIER_NPU || s->ndim != 2)
        return seterr(err, ORKPACK_E_ARGS, "orkpack_load_npu: not an NPU slice or a NULL buffer");
    int64_t n = s->shape[0], k = s->shape[1];
    if (scale_count < (uint64_t)n) return seterr(err, ORKPACK_E_ARGS, "orkpack_load_npu: scale buffer too small");
    if (s->encoding == ORKPACK_ENC_INT8 && s->layout == ORKPACK_LAYOUT_NPU_INT8) {
        const orkpack_part_t *qp = &s->parts[0], *sp = &s->parts[1];
        if (q_size < qp->size) return seterr(err, ORKPACK_E_ARGS, "orkpack_load_npu: q buffer too small");
        for (uint64_t off = 0; off < qp->size; off += FILL_CHUNK) {
            uint64_t len = qp->size - off < FILL_CHUNK ? qp->size - off : FILL_CHUNK;
            ork_rt_fill((uint8_t *)q + off, qp->ptr + off, (size_t)len, clean);
        }
        memcpy(scale, sp->ptr, (size_t)sp->size);
        return ORKPACK_OK;
    }
    if (s->encoding == ORKPACK_ENC_NF4 && s->has_inflate && s->inflate_k_segment >= 32) {
        /* a k_segment >= k is one segment: hand the runtime the same tiling with a width its int64
         * arithmetic (k + ks - 1) cannot overflow, as verify.py does (reader.runtime_k_segment) */
        int64_t ks = s->inflate_k_segment < k ? s->inflate_k_segment : (k + 63) / 64 * 64;
        size_t need = ork_rt_tiled_size(n, k, ks);
        if (!need || q_size < need) return seterr(err, ORKPACK_E_ARGS, "orkpack_load_npu: q buffer too small");
        const orkpack_part_t *cp = &s->parts[0], *ap = &s->parts[1];
        int rc = ork_rt_inflate_direct(cp->ptr, (size_t)cp->size, (const float *)(const void *)ap->ptr, (size_t)ap->size / 4,
                                       n, k, ks, 0, round32(n) / 32, (int8_t *)q, q_size, scale);
        if (rc == ORK_RT_ENOMEM) return seterr(err, ORKPACK_E_NOMEM, "orkpack_load_npu: out of memory");
        if (rc) return seterr(err, ORKPACK_E_DAMAGED, "cannot load: the inflate refused the slice's sizes");
        if (clean) ork_rt_clean(q, need);
        return ORKPACK_OK;
    }
    return seterr(err, ORKPACK_E_ARGS, "orkpack_load_npu: the slice has no NPU load path");
}

/* ------------------------------------------------------------------ host NF4 decode */

static int decode_host(const char *fn, const orkpack_slice_t *s, int host_copy, uint64_t e0, uint64_t e1, float *out,
                       orkpack_err_t *err, int nf4_only) {
    if (!s || (!out && e1 > e0)) return seterr(err, ORKPACK_E_ARGS, "%s: NULL argument", fn);
    if (host_copy && !s->has_host_copy) return seterr(err, ORKPACK_E_ARGS, "%s: the slice has no host copy", fn);
    int enc = host_copy ? s->host_encoding : s->encoding;
    const orkpack_part_t *p = host_copy ? s->host_parts : s->parts;
    if (enc != ORKPACK_ENC_NF4 && enc != ORKPACK_ENC_NF4DQ && (nf4_only || !IS_INTDQ(enc)))
        return seterr(err, ORKPACK_E_ARGS, nf4_only ? "%s: the slice is %s, not nf4 or nf4dq"
                                                    : "%s: the slice is %s, not nf4, nf4dq, int5dq, int6dq or int8dq",
                      fn, ENC_NAMES[enc]);
    if (e0 > e1 || e1 > s->numel || e1 > (uint64_t)INT64_MAX)
        return seterr(err, ORKPACK_E_ARGS, "%s: elements [%llu, %llu) are not in the slice's %llu", fn,
                      (unsigned long long)e0, (unsigned long long)e1, (unsigned long long)s->numel);
    int rc;
    if (enc == ORKPACK_ENC_NF4) {
        rc = ork_rt_nf4_decode(p[0].ptr, (size_t)p[0].size, (const float *)(const void *)p[1].ptr, (size_t)p[1].size / 4,
                               (int64_t)e0, (int64_t)e1, out);
    } else {
        float offset;
        memcpy(&offset, p[3].ptr, sizeof offset);
        if (enc == ORKPACK_ENC_NF4DQ)
            rc = ork_rt_nf4dq_decode(p[0].ptr, (size_t)p[0].size, p[1].ptr, (size_t)p[1].size,
                                     (const float *)(const void *)p[2].ptr, (size_t)p[2].size / 4, offset, (int64_t)e0,
                                     (int64_t)e1, out);
        else
            rc = ork_rt_intdq_decode(intdq_bits(enc), p[0].ptr, (size_t)p[0].size, p[1].ptr, (size_t)p[1].size,
                                     (const float *)(const void *)p[2].ptr, (size_t)p[2].size / 4, offset,
                                     (int64_t)e0, (int64_t)e1, out);
    }
    /* the part sizes were checked at open against the shape: a refusal here is a reader bug, not the file */
    if (rc) return seterr(err, ORKPACK_E_ARGS, "%s: the parts are too small for the range", fn);
    return ORKPACK_OK;
}

int orkpack_decode_nf4(const orkpack_slice_t *s, int host_copy, uint64_t e0, uint64_t e1, float *out, orkpack_err_t *err) {
    return decode_host("orkpack_decode_nf4", s, host_copy, e0, e1, out, err, 1);
}

int orkpack_decode_host(const orkpack_slice_t *s, int host_copy, uint64_t e0, uint64_t e1, float *out,
                        orkpack_err_t *err) {
    return decode_host("orkpack_decode_host", s, host_copy, e0, e1, out, err, 0);
}
