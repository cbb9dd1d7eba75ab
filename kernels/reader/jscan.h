/* jscan.h: liborkpack's JSON pre-pass (internal). cJSON builds the tree; this pass makes what is
 * accepted, and what every value is, exactly what Python's json.loads (as orkpack/pack/reader.py calls it)
 * gives: strict grammar (numbers, literals, whitespace, no control characters, no NaN/Infinity),
 * integers exact (cJSON keeps only a double), strings decoded to WTF-8 with NULs and lone surrogates
 * kept (cJSON stops at a NUL and refuses lone surrogates), and a nesting limit. It hands cJSON a
 * rewritten copy in which every string is "" and every number 0, and numbers its string and number
 * tokens in document order; jscan_attach() then stores each node's token index in its valueint. */
#ifndef ORKPACK_JSCAN_H
#define ORKPACK_JSCAN_H
#include <stddef.h>
#include <stdint.h>

#define JTOK_STR 1
#define JTOK_NUM 2

typedef struct {
    int kind;         /* JTOK_STR or JTOK_NUM */
    size_t off;       /* STR: offset of the decoded bytes in the arena (NUL-terminated) */
    size_t len;       /* STR: decoded length in bytes */
    int is_int;       /* NUM: no fraction and no exponent (Python int) */
    int ovf;          /* NUM int: 0, or +1 / -1 when it does not fit in int64 */
    int64_t i;        /* NUM int: the value (saturated when ovf) */
    unsigned mod32;   /* NUM int: |value| mod 32, exact even when ovf */
    double d;         /* NUM: the value as a double (Python float for a non-int) */
} jtok_t;

typedef struct {
    jtok_t *tok;
    size_t ntok, cap;
    char *arena;   /* decoded strings */
    size_t arena_len;
    char *rw;      /* the rewritten document for cJSON */
    size_t rw_len;
} jscan_t;

/* 0 on success; otherwise -1 (why filled: bad JSON / too deep) or -2 (out of memory). */
int jscan_run(const char *buf, size_t len, int max_depth, jscan_t *out, char *why, size_t whylen);
void jscan_free(jscan_t *js);

#endif
