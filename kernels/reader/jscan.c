/* jscan.c: the JSON pre-pass of liborkpack (see jscan.h). Grammar as Python's json module (C scanner,
 * strict mode): whitespace is space, tab, LF, CR; numbers -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][-+]?[0-9]+)?;
 * an integer of more than 4300 digits is refused (CPython's int max_str_digits); NaN, Infinity and
 * -Infinity are refused (orkpack's parse_constant); strings hold no byte below 0x20; escapes
 * \" \\ \/ \b \f \n \r \t \uXXXX, a high surrogate followed by an escaped low surrogate joins it. */
#include "jscan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PY_INT_MAX_DIGITS 4300

typedef struct {
    const char *b;
    size_t n, i;
    int max_depth;
    jscan_t *js;
    char *why;
    size_t whylen;
    int oom;
} P;

static int fail(P *p, const char *what) {
    if (p->why && p->whylen) snprintf(p->why, p->whylen, "%s at byte %zu", what, p->i);
    return -1;
}

static void ws(P *p) {
    while (p->i < p->n) {
        char c = p->b[p->i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') p->i++;
        else break;
    }
}

static int emit(P *p, char c) { p->js->rw[p->js->rw_len++] = c; return 0; }

static jtok_t *newtok(P *p) {
    jscan_t *js = p->js;
    if (js->ntok == js->cap) {
        size_t nc = js->cap ? js->cap * 2 : 256;
        jtok_t *t = (jtok_t *)realloc(js->tok, nc * sizeof(jtok_t));
        if (!t) { p->oom = 1; return NULL; }
        js->tok = t;
        js->cap = nc;
    }
    jtok_t *t = &js->tok[js->ntok++];
    memset(t, 0, sizeof *t);
    return t;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int hex4(P *p, size_t at, unsigned *out) {
    if (at + 4 > p->n) return -1;
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(p->b[at + k]);
        if (h < 0) return -1;
        v = v * 16 + (unsigned)h;
    }
    *out = v;
    return 0;
}

static void put_wtf8(char *a, size_t *len, unsigned c) {
    if (c < 0x80) a[(*len)++] = (char)c;
    else if (c < 0x800) {
        a[(*len)++] = (char)(0xC0 | (c >> 6));
        a[(*len)++] = (char)(0x80 | (c & 63));
    } else if (c < 0x10000) {
        a[(*len)++] = (char)(0xE0 | (c >> 12));
        a[(*len)++] = (char)(0x80 | ((c >> 6) & 63));
        a[(*len)++] = (char)(0x80 | (c & 63));
    } else {
        a[(*len)++] = (char)(0xF0 | (c >> 18));
        a[(*len)++] = (char)(0x80 | ((c >> 12) & 63));
        a[(*len)++] = (char)(0x80 | ((c >> 6) & 63));
        a[(*len)++] = (char)(0x80 | (c & 63));
    }
}

/* at '"': decode into the arena (decoded bytes + NUL never exceed the quoted source length) */
static int string(P *p) {
    jtok_t *t = newtok(p);
    if (!t) return -2;
    t->kind = JTOK_STR;
    char *a = p->js->arena;
    size_t len = p->js->arena_len;
    t->off = len;
    p->i++;
    for (;;) {
        if (p->i >= p->n) return fail(p, "unterminated string");
        unsigned char c = (unsigned char)p->b[p->i];
        if (c == '"') { p->i++; break; }
        if (c < 0x20) return fail(p, "invalid control character in a string");
        if (c != '\\') { a[len++] = (char)c; p->i++; continue; }
        if (p->i + 1 >= p->n) return fail(p, "unterminated string");
        char e = p->b[p->i + 1];
        unsigned u;
        switch (e) {
        case '"': a[len++] = '"'; p->i += 2; break;
        case '\\': a[len++] = '\\'; p->i += 2; break;
        case '/': a[len++] = '/'; p->i += 2; break;
        case 'b': a[len++] = '\b'; p->i += 2; break;
        case 'f': a[len++] = '\f'; p->i += 2; break;
        case 'n': a[len++] = '\n'; p->i += 2; break;
        case 'r': a[len++] = '\r'; p->i += 2; break;
        case 't': a[len++] = '\t'; p->i += 2; break;
        case 'u':
            if (hex4(p, p->i + 2, &u)) return fail(p, "invalid \\uXXXX escape");
            p->i += 6;
            if (u >= 0xD800 && u <= 0xDBFF && p->i + 6 <= p->n && p->b[p->i] == '\\' && p->b[p->i + 1] == 'u') {
                unsigned u2;
                if (hex4(p, p->i + 2, &u2)) return fail(p, "invalid \\uXXXX escape");
                if (u2 >= 0xDC00 && u2 <= 0xDFFF) {
                    u = 0x10000 + ((u - 0xD800) << 10) + (u2 - 0xDC00);
                    p->i += 6;
                }
            }
            put_wtf8(a, &len, u);
            break;
        default:
            return fail(p, "invalid escape");
        }
    }
    a[len++] = '\0';
    t->len = len - 1 - t->off;
    p->js->arena_len = len;
    emit(p, '"');
    emit(p, '"');
    return 0;
}

static int isdig(char c) { return c >= '0' && c <= '9'; }

static int number(P *p) {
    size_t s = p->i;
    int neg = 0, is_int = 1;
    if (p->b[p->i] == '-') { neg = 1; p->i++; }
    if (p->i >= p->n || !isdig(p->b[p->i])) {
        if (p->i < p->n && p->b[p->i] == 'I') return fail(p, "-Infinity is not allowed");
        return fail(p, "expecting a value");
    }
    size_t d0 = p->i;
    if (p->b[p->i] == '0') p->i++;
    else while (p->i < p->n && isdig(p->b[p->i])) p->i++;
    size_t d1 = p->i;
    if (p->i + 1 < p->n && p->b[p->i] == '.' && isdig(p->b[p->i + 1])) {
        is_int = 0;
        p->i++;
        while (p->i < p->n && isdig(p->b[p->i])) p->i++;
    }
    if (p->i < p->n && (p->b[p->i] == 'e' || p->b[p->i] == 'E')) {
        size_t j = p->i + 1;
        if (j < p->n && (p->b[j] == '+' || p->b[j] == '-')) j++;
        if (j < p->n && isdig(p->b[j])) {
            is_int = 0;
            while (j < p->n && isdig(p->b[j])) j++;
            p->i = j;
        }
    }
    jtok_t *t = newtok(p);
    if (!t) return -2;
    t->kind = JTOK_NUM;
    t->is_int = is_int;
    if (is_int) {
        if (d1 - d0 > PY_INT_MAX_DIGITS) return fail(p, "integer of more than 4300 digits");
        uint64_t m = 0;
        int ovf = 0;
        unsigned r = 0;
        for (size_t k = d0; k < d1; k++) {
            unsigned dg = (unsigned)(p->b[k] - '0');
            r = (r * 10 + dg) % 32;
            if (!ovf && m > (UINT64_MAX - dg) / 10) ovf = 1;
            if (!ovf) m = m * 10 + dg;
        }
        t->mod32 = r;
        if (!ovf && !neg && m > (uint64_t)INT64_MAX) ovf = 1;
        if (!ovf && neg && m > (uint64_t)INT64_MAX + 1) ovf = 1;
        if (ovf) {
            t->ovf = neg ? -1 : 1;
            t->i = neg ? INT64_MIN : INT64_MAX;
        } else {
            t->i = neg ? (m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m) : (int64_t)m;
        }
    }
    /* the double value (Python float for a non-int; for an int, used only in comparisons) */
    size_t L = p->i - s;
    char small[128];
    char *tmp = L < sizeof small ? small : (char *)malloc(L + 1);
    if (!tmp) { p->oom = 1; return -2; }
    memcpy(tmp, p->b + s, L);
    tmp[L] = '\0';
    t->d = strtod(tmp, NULL);
    if (tmp != small) free(tmp);
    emit(p, '0');
    return 0;
}

static int lit(P *p, const char *w) {
    size_t L = strlen(w);
    if (p->i + L > p->n || memcmp(p->b + p->i, w, L) != 0) return fail(p, "expecting a value");
    for (size_t k = 0; k < L; k++) emit(p, w[k]);
    p->i += L;
    return 0;
}

static int value(P *p, int depth);

static int container(P *p, int depth, char open, char close) {
    if (depth + 1 > p->max_depth) return fail(p, "JSON nests too deep");
    emit(p, open);
    p->i++;
    ws(p);
    if (p->i < p->n && p->b[p->i] == close) { emit(p, close); p->i++; return 0; }
    for (;;) {
        int rc;
        if (open == '{') {
            if (p->i >= p->n || p->b[p->i] != '"') return fail(p, "expecting a property name in double quotes");
            if ((rc = string(p))) return rc;
            ws(p);
            if (p->i >= p->n || p->b[p->i] != ':') return fail(p, "expecting ':'");
            emit(p, ':');
            p->i++;
        }
        if ((rc = value(p, depth + 1))) return rc;
        ws(p);
        if (p->i < p->n && p->b[p->i] == ',') {
            emit(p, ',');
            p->i++;
            ws(p);
            continue;
        }
        if (p->i < p->n && p->b[p->i] == close) { emit(p, close); p->i++; return 0; }
        return fail(p, "expecting ',' delimiter");
    }
}

static int value(P *p, int depth) {
    ws(p);
    if (p->i >= p->n) return fail(p, "expecting a value");
    char c = p->b[p->i];
    switch (c) {
    case '{': return container(p, depth, '{', '}');
    case '[': return container(p, depth, '[', ']');
    case '"': return string(p);
    case 't': return lit(p, "true");
    case 'f': return lit(p, "false");
    case 'n': return lit(p, "null");
    case 'N': return fail(p, "NaN is not allowed");
    case 'I': return fail(p, "Infinity is not allowed");
    default:
        if (c == '-' || isdig(c)) return number(p);
        return fail(p, "expecting a value");
    }
}

int jscan_run(const char *buf, size_t len, int max_depth, jscan_t *js, char *why, size_t whylen) {
    memset(js, 0, sizeof *js);
    if (why && whylen) why[0] = '\0';
    js->arena = (char *)malloc(len + 1);
    js->rw = (char *)malloc(len + 1);
    if (!js->arena || !js->rw) { jscan_free(js); return -2; }
    P p = {buf, len, 0, max_depth, js, why, whylen, 0};
    int rc = value(&p, 0);
    if (rc == 0) {
        ws(&p);
        if (p.i != p.n) rc = fail(&p, "extra data");
    }
    if (p.oom) rc = -2;
    if (rc) { jscan_free(js); return rc; }
    js->rw[js->rw_len] = '\0';
    return 0;
}

void jscan_free(jscan_t *js) {
    free(js->tok);
    free(js->arena);
    free(js->rw);
    memset(js, 0, sizeof *js);
}
