/* The records of a Chrome-trace events array (PyTorch profiler / Kineto,
 * Horovod Timeline) straight into columns: one pass over the bytes, no
 * object per event.
 *
 * traces/fastjson/__init__.py calls kineto_scan() on a chunk of the
 * array (traces/jsonrecords.py cuts it). Only what the readers use is
 * taken, checked as msgspec checks it against the readers' structs
 * (traces/readers/kineto.py, horovod_timeline.py):
 *   the rows: complete events (ph "X"), or every record when
 *     Scan.all_records (the Timeline: its Begin/End pairs and instants);
 *     their ph, name, cat, pid, tid, ts, dur and the args correlation,
 *     "External id", "Collective name", dtype, "In msg nelems", "In msg
 *     size" and (all_records) shape as columns;
 *   metadata (ph "M") and complete events whose ids are strings: their
 *     byte spans, for the reader to decode with msgspec (few, in the traces
 *     of today's PyTorch and Horovod).
 * Every other value is validated as JSON and skipped. Whenever the chunk is
 * not plain valid JSON of the shapes above (a cut or damaged record, a
 * \u escape in a name, an integer that does not fit ...), it
 * returns SCAN_FALLBACK and the reader decodes that chunk with msgspec as
 * before: this pass is only ever a faster way to the same result.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define SCAN_OK 0
#define SCAN_FALLBACK 1
#define SCAN_FULL 2 /* more records than capacity: call again with more */
#define MAX_DEPTH 512
#define ID_NULL INT64_MIN /* traces.table.NULL */
#define NO_TIME INT64_MIN /* traces.fastjson.NO_TIME: no time, or none an int64 holds */
enum { ID_ABSENT, ID_INT, ID_TEXT }; /* the kinds of an id (pid, tid, correlation) */

typedef struct {
    int64_t capacity;      /* rows the row arrays hold */
    int64_t names_capacity; /* bytes of names (and of cats) */
    int32_t *name_offsets;  /* capacity + 1, Arrow string offsets */
    uint8_t *names;
    int32_t *cat_offsets;
    uint8_t *cats;
    uint8_t *cat_valid;
    int32_t *collective_offsets; /* args."Collective name" */
    uint8_t *collectives;
    uint8_t *collective_valid;
    int32_t *dtype_offsets; /* args.dtype */
    uint8_t *dtypes;
    uint8_t *dtype_valid;
    int32_t *shape_offsets; /* args.shape, a string (all_records only) */
    uint8_t *shapes;
    uint8_t *shape_valid;
    uint8_t *ph; /* its one character; 0: no ph, '?': a longer one */
    double *nelems; /* args."In msg nelems", NaN: none */
    double *msg_size; /* args."In msg size" */
    int64_t *pid;
    uint8_t *pid_kind; /* ID_* */
    int64_t *tid;
    uint8_t *tid_kind;
    int64_t *ts; /* nanoseconds, exact from the text; NO_TIME: none */
    int64_t *dur;
    int64_t *correlation; /* ID_NULL: none, or a string (a span) */
    int64_t *external;
    int64_t *spans; /* 3 per span: start, end (bytes), row (-1: metadata) */
    int64_t rows;
    int64_t n_spans;
    int32_t escaped; /* some name or cat holds a backslash escape */
    int64_t failed_at; /* byte where the pass gave up (SCAN_FALLBACK) */
    int32_t all_records; /* every record a row, not only complete events */
    int32_t open_ended; /* not bracketed, data runs on past the array's ']' */
    int64_t array_end;  /* open_ended: where that ']' is */
} Scan;

typedef struct {
    const uint8_t *p, *end, *base;
    int depth;
} Cursor;

/* A field's value as the record's pass found it. */
typedef struct {
    const uint8_t *at;
    int64_t len;
    int present, null, escaped;
} Text;

enum { PH_NONE, PH_X, PH_M, PH_OTHER };

static inline void skip_ws(Cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t'))
        c->p++;
}

/* The length of the whole, shortest-form UTF-8 sequence (no surrogate) at
 * p, a byte >= 0x80; 0 if there is none. */
static int utf8_length(const uint8_t *p, const uint8_t *end) {
    uint8_t b = *p;
    int n;
    uint32_t cp;
    if (b >= 0xC2 && b <= 0xDF) n = 1, cp = b & 0x1F;
    else if (b >= 0xE0 && b <= 0xEF) n = 2, cp = b & 0x0F;
    else if (b >= 0xF0 && b <= 0xF4) n = 3, cp = b & 0x07;
    else return 0;
    if (end - p <= n) return 0;
    for (int i = 1; i <= n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if ((n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return n + 1;
}

static inline int hex(uint8_t b) {
    return (b >= '0' && b <= '9') || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F');
}

/* The first byte from p that ends or escapes a string or needs a UTF-8
 * check ('"', '\\', a control character, a byte >= 0x80), 16 bytes at a
 * time; end - p < 16 when none was found. */
static inline const uint8_t *plain_run(const uint8_t *p, const uint8_t *end) {
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
    const __m128i space = _mm_set1_epi8(0x20);
    while (end - p >= 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)p);
        /* signed: bytes >= 0x80 are negative, so below 0x20 too */
        __m128i special = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, quote),
                                                    _mm_cmpeq_epi8(x, backslash)),
                                       _mm_cmplt_epi8(x, space));
        int mask = _mm_movemask_epi8(special);
        if (mask) return p + __builtin_ctz(mask);
        p += 16;
    }
#endif
    return p;
}

/* A string from its opening quote; t: its raw bytes between the quotes.
 * allow_u: \uXXXX accepted (only in values that are skipped). */
static int string(Cursor *c, Text *t, int allow_u) {
    const uint8_t *p = c->p, *end = c->end;
    if (p >= end || *p != '"') return 0;
    const uint8_t *start = ++p;
    int escaped = 0;
    for (;;) {
        p = plain_run(p, end);
        if (p >= end) return 0;
        uint8_t b = *p;
        if (b == '"') break;
        if (b < 0x20) return 0;
        if (b == '\\') {
            if (end - p < 2) return 0;
            uint8_t e = p[1];
            escaped = 1;
            if (e == 'u') {
                if (!allow_u || end - p < 6 || !hex(p[2]) || !hex(p[3]) || !hex(p[4]) ||
                    !hex(p[5]))
                    return 0;
                p += 6;
            } else if (e != 0 && strchr("\"\\/bfnrt", e) != NULL) {
                p += 2;
            } else {
                return 0;
            }
        } else if (b >= 0x80) {
            int n = utf8_length(p, end);
            if (!n) return 0;
            p += n;
        } else {
            p++; /* an ordinary byte in the last 16 */
        }
    }
    if (t) {
        t->at = start;
        t->len = p - start;
        t->present = 1;
        t->null = 0;
        t->escaped = escaped;
    }
    c->p = p + 1;
    return 1;
}

/* A JSON number; *is_int: no fraction nor exponent. */
static int number(Cursor *c, const uint8_t **start, int *is_int) {
    const uint8_t *p = c->p;
    *start = p;
    *is_int = 1;
    if (p < c->end && *p == '-') p++;
    if (p >= c->end) return 0;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9')
        while (p < c->end && *p >= '0' && *p <= '9') p++;
    else return 0;
    if (p < c->end && *p == '.') {
        *is_int = 0;
        p++;
        if (p >= c->end || *p < '0' || *p > '9') return 0;
        while (p < c->end && *p >= '0' && *p <= '9') p++;
    }
    if (p < c->end && (*p == 'e' || *p == 'E')) {
        *is_int = 0;
        p++;
        if (p < c->end && (*p == '+' || *p == '-')) p++;
        if (p >= c->end || *p < '0' || *p > '9') return 0;
        while (p < c->end && *p >= '0' && *p <= '9') p++;
    }
    c->p = p;
    return 1;
}

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                               1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                               1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static int value(Cursor *c);

static int literal(Cursor *c, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0) return 0;
    c->p += n;
    return 1;
}

/* Any value, validated and skipped. */
static int value(Cursor *c) {
    skip_ws(c);
    if (c->p >= c->end) return 0;
    uint8_t b = *c->p;
    if (b == '"') return string(c, NULL, 1);
    if (b == '{' || b == '[') {
        uint8_t close = b == '{' ? '}' : ']';
        if (++c->depth > MAX_DEPTH) return 0;
        c->p++;
        skip_ws(c);
        if (c->p < c->end && *c->p == close) {
            c->p++;
            c->depth--;
            return 1;
        }
        for (;;) {
            if (b == '{') {
                skip_ws(c);
                if (!string(c, NULL, 1)) return 0;
                skip_ws(c);
                if (c->p >= c->end || *c->p != ':') return 0;
                c->p++;
            }
            if (!value(c)) return 0;
            skip_ws(c);
            if (c->p >= c->end) return 0;
            if (*c->p == ',') {
                c->p++;
                continue;
            }
            if (*c->p != close) return 0;
            c->p++;
            c->depth--;
            return 1;
        }
    }
    if (b == 't') return literal(c, "true");
    if (b == 'f') return literal(c, "false");
    if (b == 'n') return literal(c, "null");
    const uint8_t *start;
    int is_int;
    return number(c, &start, &is_int);
}

/* After an object's member, past what follows it: 1 a ',' (another member
 * follows), 0 the object's closing '}', -1 anything else. */
static int after_member(Cursor *c) {
    skip_ws(c);
    if (c->p >= c->end) return -1;
    uint8_t b = *c->p++;
    return b == ',' ? 1 : b == '}' ? 0 : -1;
}

static inline int key_is(const Text *k, const char *name) {
    /* the first byte before the length: most keys differ there (no strlen) */
    if (k->len == 0 || k->at[0] != (uint8_t)name[0]) return k->len == 0 && name[0] == 0;
    size_t n = strlen(name);
    return (size_t)k->len == n && memcmp(k->at, name, n) == 0;
}

/* Whether the key at p (its opening quote; 17 bytes or more before the
 * chunk's end) is `quoted`, a key written with its quotes: a key without
 * escapes, read in one comparison. */
#define IS_KEY(p, quoted) (memcmp((p), (quoted), sizeof(quoted) - 1) == 0)
#define TAKE_KEY(c, p, quoted, key)        \
    if (IS_KEY(p, quoted)) {               \
        (c)->p = (p) + sizeof(quoted) - 1; \
        return key;                        \
    }
#define LONGEST_KEY 17 /* "Collective name", quoted */

/* The fields read from a record (the others are skipped) and from its args,
 * each enum the index of its key in the list after it (0: any other key). */
enum { K_OTHER, K_PH, K_NAME, K_CAT, K_PID, K_TID, K_TS, K_DUR, K_ARGS, K_KEYS };
static const char *const RECORD_KEYS[K_KEYS] = {"", "ph", "name", "cat", "pid",
                                                "tid", "ts", "dur", "args"};
enum {
    A_OTHER,
    A_CORRELATION,
    A_EXTERNAL,
    A_COLLECTIVE,
    A_DTYPE,
    A_NAME,
    A_NELEMS,
    A_SIZE,
    A_SHAPE, /* last: a Timeline's only */
    A_KEYS
};
static const char *const ARGS_KEYS[A_KEYS] = {
    "", "correlation", "External id", "Collective name", "dtype", "name", "In msg nelems",
    "In msg size", "shape"};

/* The index of k among keys[1 .. n-1]; 0 where it is none of them. */
static int key_index(const Text *k, const char *const *keys, int n) {
    for (int i = 1; i < n; i++)
        if (key_is(k, keys[i])) return i;
    return 0;
}

/* A record's key, read from its opening quote: K_*, or -1 where it is not
 * a string without escapes. The keys of the Kineto and Timeline records
 * are told by their first letter and one comparison; any other goes
 * through string(). */
static int record_key(Cursor *c) {
    const uint8_t *p = c->p;
    if (c->end - p >= LONGEST_KEY && *p == '"') {
        switch (p[1]) {
        case 'p':
            TAKE_KEY(c, p, "\"ph\"", K_PH)
            TAKE_KEY(c, p, "\"pid\"", K_PID)
            break;
        case 'n': TAKE_KEY(c, p, "\"name\"", K_NAME) break;
        case 'c': TAKE_KEY(c, p, "\"cat\"", K_CAT) break;
        case 't':
            TAKE_KEY(c, p, "\"tid\"", K_TID)
            TAKE_KEY(c, p, "\"ts\"", K_TS)
            break;
        case 'd': TAKE_KEY(c, p, "\"dur\"", K_DUR) break;
        case 'a': TAKE_KEY(c, p, "\"args\"", K_ARGS) break;
        /* not ours, but in every flow event (ac2g) of a Kineto trace */
        case 'i': TAKE_KEY(c, p, "\"id\"", K_OTHER) break;
        case 'b': TAKE_KEY(c, p, "\"bp\"", K_OTHER) break;
        }
    }
    Text k = {0};
    if (!string(c, &k, 0) || k.escaped) return -1;
    return key_index(&k, RECORD_KEYS, K_KEYS);
}

/* A key of a record's args, as record_key(): A_*, or -1 where it is not
 * a string (escapes allowed: an escaped key is none of ours). shape_too:
 * "shape" is one of ours. */
static int args_key(Cursor *c, int shape_too) {
    const uint8_t *p = c->p;
    if (c->end - p >= LONGEST_KEY && *p == '"') {
        switch (p[1]) {
        case 'c': TAKE_KEY(c, p, "\"correlation\"", A_CORRELATION) break;
        case 'E': TAKE_KEY(c, p, "\"External id\"", A_EXTERNAL) break;
        case 's': TAKE_KEY(c, p, "\"stream\"", A_OTHER) break; /* a kernel's: not ours */
        }
    }
    Text k = {0};
    if (!string(c, &k, 0)) return -1;
    return key_index(&k, ARGS_KEYS, shape_too ? A_KEYS : A_SHAPE);
}

/* A string (no \u escape: the reader would have to undo it) or, when
 * nullable, null (t->null). */
static int text_or_null(Cursor *c, Text *t, int nullable) {
    skip_ws(c);
    if (nullable && c->p < c->end && *c->p == 'n') {
        if (!literal(c, "null")) return 0;
        t->present = 1;
        t->null = 1;
        return 1;
    }
    return string(c, t, 0);
}

/* An ``int | str | None`` field as msgspec reads it: *kind ID_INT with
 * the integer in *out, ID_ABSENT (null) or ID_TEXT (the reader decodes the
 * record itself). An integer is read in one pass; a number with a fraction
 * or an exponent, or one no int64 holds, is refused (the chunk falls back),
 * as msgspec would not read it as an int. */
static int id_value(Cursor *c, int64_t *out, uint8_t *kind) {
    skip_ws(c);
    *out = ID_NULL;
    const uint8_t *p = c->p, *end = c->end;
    if (p < end && *p == 'n') {
        *kind = ID_ABSENT;
        return literal(c, "null");
    }
    if (p < end && *p == '"') {
        *kind = ID_TEXT;
        return string(c, NULL, 1);
    }
    int negative = p < end && *p == '-';
    p += negative;
    if (p >= end || *p < '0' || *p > '9') return 0;
    uint64_t v = 0, limit = negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    if (*p == '0') p++;
    else
        for (; p < end && *p >= '0' && *p <= '9'; p++) {
            uint64_t digit = *p - '0';
            if (v > (limit - digit) / 10) return 0;
            v = v * 10 + digit;
        }
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) return 0; /* not an int */
    if (negative && v == (uint64_t)INT64_MAX + 1) return 0; /* INT64_MIN: our NULL */
    c->p = p;
    *kind = ID_INT;
    *out = negative ? -(int64_t)v : (int64_t)v;
    return 1;
}

/* A number as the double nearest it, in one pass: exact arithmetic when
 * its digits make an integer below 2^53 and the power of ten is exact (one
 * rounding: correctly rounded), else strtod (correctly rounded too). */
static int real(Cursor *c, double *out) {
    skip_ws(c);
    const uint64_t below = (uint64_t)1 << 53;
    const uint8_t *p = c->p, *end = c->end, *start = p;
    int negative = 0, scale = 0, exact = 1;
    uint64_t m = 0;
    if (p < end && *p == '-') negative = 1, p++;
    if (p >= end) return 0;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9')
        for (; p < end && *p >= '0' && *p <= '9'; p++) {
            uint64_t digit = *p - '0';
            if (m > (below - 1 - digit) / 10) exact = 0;
            else if (exact) m = m * 10 + digit;
        }
    else return 0;
    if (p < end && *p == '.') {
        p++;
        if (p >= end || *p < '0' || *p > '9') return 0;
        for (; p < end && *p >= '0' && *p <= '9'; p++) {
            uint64_t digit = *p - '0';
            if (m > (below - 1 - digit) / 10 || ++scale > 22) exact = 0;
            else if (exact) m = m * 10 + digit;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        exact = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return 0;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    c->p = p;
    if (exact) {
        double v = scale ? (double)m / POW10[scale] : (double)m;
        *out = negative ? -v : v;
    } else {
        char buffer[64];
        if (p - start >= (int64_t)sizeof buffer) return 0;
        memcpy(buffer, start, p - start);
        buffer[p - start] = 0;
        *out = strtod(buffer, NULL);
    }
    return isfinite(*out);
}

typedef struct {
    int64_t correlation, external;
    uint8_t correlation_kind, external_kind;
    Text collective, dtype, shape;
    double nelems, size;
} Args;

#define NO_ARGS {ID_NULL, ID_NULL, ID_ABSENT, ID_ABSENT, {0}, {0}, {0}, NAN, NAN}

/* A value that msgspec reads as ``int | float | str | None``: a number or
 * null (NaN) here; a string falls back. */
static int number_or_null(Cursor *c, double *out) {
    skip_ws(c);
    *out = NAN;
    if (c->p < c->end && *c->p == 'n') return literal(c, "null");
    return real(c, out);
}

/* shape_too: args.shape is taken (a string; a list falls back), not skipped */
static int args(Cursor *c, Args *a, int shape_too) {
    skip_ws(c);
    if (c->p < c->end && *c->p == 'n') return literal(c, "null");
    if (c->p >= c->end || *c->p != '{') return 0;
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return 1;
    }
    for (;;) {
        skip_ws(c);
        int key = args_key(c, shape_too);
        if (key < 0) return 0;
        skip_ws(c);
        if (c->p >= c->end || *c->p != ':') return 0;
        c->p++;
        int ok;
        switch (key) {
        case A_CORRELATION: ok = id_value(c, &a->correlation, &a->correlation_kind); break;
        case A_EXTERNAL: ok = id_value(c, &a->external, &a->external_kind); break;
        case A_COLLECTIVE: ok = text_or_null(c, &a->collective, 1); break;
        case A_DTYPE: ok = text_or_null(c, &a->dtype, 1); break;
        case A_NAME: ok = text_or_null(c, &(Text){0}, 1); break;
        case A_NELEMS: ok = number_or_null(c, &a->nelems); break;
        case A_SIZE: ok = number_or_null(c, &a->size); break;
        case A_SHAPE: ok = text_or_null(c, &a->shape, 1); break;
        default: ok = value(c);
        }
        int more = ok ? after_member(c) : -1;
        if (more <= 0) return more == 0;
    }
}

static int put_text(uint8_t *data, int32_t *offsets, int64_t row, const Text *t, int64_t cap) {
    int64_t at = offsets[row];
    int64_t len = t->present && !t->null ? t->len : 0;
    if (at + len > cap || at + len > INT32_MAX) return 0;
    if (len) memcpy(data + at, t->at, len);
    offsets[row + 1] = (int32_t)(at + len);
    return 1;
}

#define KEPT_DIGITS 40 /* more than a time in range has before its nanoseconds */
#define NS_LIMIT 9200000000000000000ULL /* traces/readers/kineto.py's MAX_MICROSECONDS, in ns */

/* nanoseconds() of the common form, in one pass: at most 16 digits before
 * the point and at most 3 after it, no exponent (the value is then exact
 * in nanoseconds: no rounding). 0 for any other form, c unmoved: the
 * general reading decides. */
static inline int plain_nanoseconds(Cursor *c, int64_t *out) {
    const uint8_t *p = c->p, *end = c->end;
    int negative = p < end && *p == '-';
    p += negative;
    if (p >= end || *p < '0' || *p > '9') return 0;
    const uint8_t *first = p;
    uint64_t ns = 0;
    if (*p == '0') p++;
    else
        for (; p < end && *p >= '0' && *p <= '9'; p++) ns = ns * 10 + (*p - '0');
    if (p - first > 16) return 0;
    int places = 0;
    if (p < end && *p == '.') {
        p++;
        for (; places < 3 && p < end && *p >= '0' && *p <= '9'; p++, places++)
            ns = ns * 10 + (*p - '0');
        if (places == 0) return 0;
    }
    if (p >= end || (*p >= '0' && *p <= '9') || *p == 'e' || *p == 'E') return 0;
    for (; places < 3; places++) ns *= 10;
    c->p = p;
    *out = ns >= NS_LIMIT ? NO_TIME : negative ? -(int64_t)ns : (int64_t)ns;
    return 1;
}

/* A number of microseconds as integer nanoseconds, exact from its decimal
 * digits (never through a double: one holds only 0.25 us steps at today's
 * epoch times), rounded half to even below the nanosecond, as
 * traces/readers/kineto.py's ns_of_number. *out = NO_TIME where it is out
 * of an int64's range; 0 (not a number) leaves the chunk to msgspec. */
static int nanoseconds(Cursor *c, int64_t *out) {
    skip_ws(c);
    if (plain_nanoseconds(c, out)) return 1;
    const uint8_t *p = c->p, *end = c->end;
    uint8_t digits[KEPT_DIGITS];
    int n = 0, sticky = 0, negative = 0;
    int64_t point = 0; /* digits before the decimal point, of the kept ones */
    if (p < end && *p == '-') negative = 1, p++;
    if (p >= end || *p < '0' || *p > '9') return 0;
    if (*p == '0' && p + 1 < end && p[1] >= '0' && p[1] <= '9') return 0; /* 01: not JSON */
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        if (n == 0 && *p == '0') continue; /* a leading zero */
        if (n < KEPT_DIGITS) digits[n++] = *p - '0';
        else sticky |= *p != '0';
        point++;
    }
    if (p < end && *p == '.') {
        p++;
        if (p >= end || *p < '0' || *p > '9') return 0;
        for (; p < end && *p >= '0' && *p <= '9'; p++) {
            if (n == 0 && *p == '0') {
                point--; /* 0.00x: the first digit kept is further right */
                continue;
            }
            if (n < KEPT_DIGITS) digits[n++] = *p - '0';
            else sticky |= *p != '0';
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        int exp_negative = 0;
        int64_t exponent = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) exp_negative = *p++ == '-';
        if (p >= end || *p < '0' || *p > '9') return 0;
        for (; p < end && *p >= '0' && *p <= '9'; p++)
            if (exponent < 100000) exponent = exponent * 10 + (*p - '0');
        point += exp_negative ? -exponent : exponent;
    }
    c->p = p;
    /* nanoseconds: the digits up to 3 places after the point */
    int64_t whole = point + 3;
    if (n == 0) whole = 0; /* the number is 0 */
    if (whole > 19) {
        *out = NO_TIME;
        return 1;
    }
    uint64_t ns = 0;
    for (int64_t i = 0; i < whole; i++) ns = ns * 10 + (i < n ? digits[i] : 0);
    int half = 0; /* the first digit dropped: 5 or more, and more than half */
    if (whole >= 0 && whole < n) {
        half = digits[whole] >= 5;
        for (int i = (int)whole + 1; i < n && !sticky; i++) sticky |= digits[i] != 0;
        if (digits[whole] == 5 && !sticky) half = ns & 1; /* a tie: to even */
    }
    ns += half;
    if (ns >= NS_LIMIT) {
        *out = NO_TIME;
        return 1;
    }
    *out = negative ? -(int64_t)ns : (int64_t)ns;
    return 1;
}

static int record(Cursor *c, Scan *s) {
    const uint8_t *begin = c->p;
    if (c->p >= c->end || *c->p != '{') return 0;
    c->p++;
    Text ph = {0}, name = {0}, cat = {0};
    int64_t pid = 0, tid = 0;
    uint8_t pid_kind = ID_ABSENT, tid_kind = ID_ABSENT;
    int64_t ts = NO_TIME, dur = 0;
    Args a = NO_ARGS;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return 1; /* {}: ph "" */
    }
    for (;;) {
        skip_ws(c);
        int key = record_key(c);
        if (key < 0) return 0;
        skip_ws(c);
        if (c->p >= c->end || *c->p != ':') return 0;
        c->p++;
        int ok;
        switch (key) {
        case K_PH: ok = text_or_null(c, &ph, 0) && !ph.escaped; break;
        case K_NAME: ok = text_or_null(c, &name, 0); break;
        case K_CAT: ok = text_or_null(c, &cat, 1); break;
        case K_PID: ok = id_value(c, &pid, &pid_kind); break;
        case K_TID: ok = id_value(c, &tid, &tid_kind); break;
        case K_TS: ok = nanoseconds(c, &ts); break;
        case K_DUR: ok = nanoseconds(c, &dur); break;
        case K_ARGS:
            a = (Args)NO_ARGS;
            ok = args(c, &a, s->all_records);
            break;
        default: ok = value(c);
        }
        int more = ok ? after_member(c) : -1;
        if (more < 0) return 0;
        if (!more) break;
    }
    int kind = !ph.present ? PH_NONE
               : ph.len == 1 && ph.at[0] == 'X' ? PH_X
               : ph.len == 1 && ph.at[0] == 'M' ? PH_M
                                                : PH_OTHER;
    /* what the reader takes from a msgspec decoding of the record */
    int decode = pid_kind == ID_TEXT || tid_kind == ID_TEXT ||
                 a.correlation_kind == ID_TEXT || a.external_kind == ID_TEXT;
    if (s->all_records && decode) return 0; /* the Timeline's ids: never strings */
    if (kind == PH_M || (kind == PH_X && decode)) {
        int64_t *span = s->spans + 3 * s->n_spans++;
        span[0] = begin - c->base;
        span[1] = c->p - c->base;
        span[2] = kind == PH_X ? s->rows : -1;
    }
    if (kind != PH_X && !s->all_records) return 1;
    int64_t r = s->rows;
    if (r >= s->capacity) return 0;
    if (!put_text(s->names, s->name_offsets, r, &name, s->names_capacity) ||
        !put_text(s->cats, s->cat_offsets, r, &cat, s->names_capacity) ||
        !put_text(s->collectives, s->collective_offsets, r, &a.collective, s->names_capacity) ||
        !put_text(s->dtypes, s->dtype_offsets, r, &a.dtype, s->names_capacity) ||
        !put_text(s->shapes, s->shape_offsets, r, &a.shape, s->names_capacity))
        return 0;
    s->escaped |= name.escaped | cat.escaped | a.collective.escaped | a.dtype.escaped |
                  a.shape.escaped;
    s->ph[r] = !ph.present ? 0 : ph.len == 1 ? ph.at[0] : '?';
    s->cat_valid[r] = cat.present && !cat.null;
    s->collective_valid[r] = a.collective.present && !a.collective.null;
    s->dtype_valid[r] = a.dtype.present && !a.dtype.null;
    s->shape_valid[r] = a.shape.present && !a.shape.null;
    s->nelems[r] = a.nelems;
    s->msg_size[r] = a.size;
    s->pid[r] = pid;
    s->pid_kind[r] = pid_kind;
    s->tid[r] = tid;
    s->tid_kind[r] = tid_kind;
    s->ts[r] = ts;
    s->dur[r] = dur;
    s->correlation[r] = a.correlation;
    s->external[r] = a.external;
    s->rows = r + 1;
    return 1;
}

/* The records of data[begin:end]: a whole JSON array when bracketed, else
 * the records between its brackets (comma-separated). */
int kineto_scan(const uint8_t *data, int64_t begin, int64_t end, int32_t bracketed, Scan *s) {
    Cursor c = {data + begin, data + end, data, 0};
    s->rows = s->n_spans = 0;
    s->escaped = 0;
    s->name_offsets[0] = s->cat_offsets[0] = s->collective_offsets[0] = s->dtype_offsets[0] =
        s->shape_offsets[0] = 0;
    skip_ws(&c);
    if (bracketed) {
        if (c.p >= c.end || *c.p != '[') goto fail;
        c.p++;
        skip_ws(&c);
        if (c.p < c.end && *c.p == ']') {
            c.p++;
            goto done;
        }
    } else if (c.p >= c.end) {
        return SCAN_OK;
    }
    for (;;) {
        skip_ws(&c);
        if (s->n_spans >= s->capacity || s->rows >= s->capacity) return SCAN_FULL;
        if (!record(&c, s)) goto fail;
        skip_ws(&c);
        if (c.p < c.end && *c.p == ',') {
            c.p++;
            continue;
        }
        if (bracketed) {
            if (c.p >= c.end || *c.p != ']') goto fail;
            c.p++;
        } else if (s->open_ended) { /* the array's last record: what follows is not ours */
            if (c.p >= c.end || *c.p != ']') goto fail;
            s->array_end = c.p - data;
            return SCAN_OK;
        }
        break;
    }
done:
    skip_ws(&c);
    if (c.p != c.end) goto fail;
    return SCAN_OK;
fail:
    s->failed_at = c.p - data;
    return SCAN_FALLBACK;
}

/* Where the JSON value at data[begin] (white space before it allowed)
 * ends: the byte after it; -1 where no whole value lies before end
 * (malformed, nested deeper than MAX_DEPTH, or cut). The walk of
 * traces/readers to a document's "traceEvents" skips the top-level values
 * before it with this: token by token in Python it took 2 us a token, 6
 * minutes for a 1 GiB document opening with "metadata". */
int64_t value_end(const uint8_t *data, int64_t begin, int64_t end) {
    Cursor c = {data + begin, data + end, data, 0};
    return value(&c) ? (int64_t)(c.p - data) : -1;
}

/* How many bytes of data[begin:end] are b (an upper bound of the records:
 * each opens a brace). */
int64_t count_byte(const uint8_t *data, int64_t begin, int64_t end, int32_t b) {
    int64_t n = 0;
    const uint8_t *p = data + begin, *stop = data + end;
    while ((p = memchr(p, b, stop - p)) != NULL) {
        n++;
        p++;
    }
    return n;
}

/* traces/nesting.py's enclosing(), its last step: over rows sorted by
 * (group, start, longest first), each row's parent is the nearest open row
 * of its group that encloses it (starts no later, ends no later than it
 * ends, and does not end where it starts unless it has no length). The
 * rows on the stack are the open ones, innermost last; parent: sorted row
 * numbers, -1 for none; stack: n int64 of scratch. */
void stack_parents(const int64_t *group, const int64_t *s, const int64_t *e, int64_t n,
                   int64_t *parent, int64_t *stack) {
    int64_t open = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i > 0 && group[i] != group[i - 1]) open = 0;
        while (open) {
            int64_t top = stack[open - 1];
            if (e[top] < s[i] || (e[top] == s[i] && s[i] < e[i]) || e[top] < e[i]) open--;
            else break;
        }
        parent[i] = open ? stack[open - 1] : -1;
        stack[open++] = i;
    }
}

/* traces/nesting.py's pair_begin_end(): Begin and End records matched in
 * file order by a stack per key (keys 0 .. keys-1). end_of[i]: for a Begin
 * i, the End that closes it (-1: never closed); depth[i]: how many Begins
 * of its key were open under it. top (keys) and below (n) are scratch.
 * Returns the Ends with no open Begin; *unclosed: the Begins left open. */
int64_t pair_edges(const int64_t *key, const uint8_t *is_begin, int64_t n, int64_t keys,
                   int64_t *end_of, int64_t *depth, int64_t *top, int64_t *below,
                   int64_t *unclosed) {
    int64_t unmatched = 0, open = 0;
    for (int64_t k = 0; k < keys; k++) top[k] = -1;
    for (int64_t i = 0; i < n; i++) {
        int64_t k = key[i];
        end_of[i] = -1;
        if (is_begin[i]) {
            below[i] = top[k];
            depth[i] = top[k] >= 0 ? depth[top[k]] + 1 : 0;
            top[k] = i;
            open++;
        } else if (top[k] < 0) {
            unmatched++;
        } else {
            end_of[top[k]] = i;
            top[k] = below[top[k]];
            open--;
        }
    }
    *unclosed = open;
    return unmatched;
}

/* traces/nesting.py's depths(): each row's number of ancestors, in one
 * pass: from each row a walk up to the first row whose depth is known (or
 * a root), then the rows walked given theirs on the way back. depth: n
 * int64, filled; path: n int64 of scratch. 0 where the parents make a
 * cycle (depth then means nothing), else 1. */
int32_t depths(const int64_t *parent, int64_t n, int64_t *depth, int64_t *path) {
    for (int64_t i = 0; i < n; i++) depth[i] = -1;
    for (int64_t i = 0; i < n; i++) {
        int64_t walked = 0, at = i;
        while (at >= 0 && depth[at] < 0) {
            if (walked == n) return 0;
            path[walked++] = at;
            at = parent[at];
        }
        int64_t d = at >= 0 ? depth[at] + 1 : 0;
        while (walked) depth[path[--walked]] = d++;
    }
    return 1;
}

/* How traces/table.py passes values down the nesting: 1 when every row's
 * parent comes before it, -1 when every one comes after it (a reader's
 * rows in the order their intervals ended), 0 otherwise; 0 too where a
 * row's depth is not one more than its parent's (values then pass level
 * by level, in numpy). depth: int32 or int64 (depth_bytes 4 or 8). */
int32_t nesting_order(const int64_t *parent, const void *depth, int32_t depth_bytes, int64_t n) {
    int before = 1, after = 1;
    for (int64_t i = 0; i < n && (before || after); i++) {
        int64_t p = parent[i];
        if (p < 0) continue;
        int64_t d = depth_bytes == 4 ? ((const int32_t *)depth)[i] : ((const int64_t *)depth)[i];
        int64_t dp = depth_bytes == 4 ? ((const int32_t *)depth)[p] : ((const int64_t *)depth)[p];
        if (d != dp + 1) return 0;
        if (p > i) before = 0;
        else after = 0;
    }
    return before ? 1 : after ? -1 : 0;
}

/* Rows whose value is `missing` take their parent's, in an order
 * nesting_order() gave (the parent's value is final before its rows). */
#define INHERIT(name, type)                                                              \
    void name(type *v, const int64_t *parent, int64_t n, type missing, int32_t order) { \
        for (int64_t k = 0; k < n; k++) {                                                \
            int64_t i = order > 0 ? k : n - 1 - k;                                       \
            if (v[i] == missing && parent[i] >= 0) v[i] = v[parent[i]];                  \
        }                                                                                \
    }
INHERIT(inherit_i64, int64_t)
INHERIT(inherit_i8, int8_t)

/* traces/table.py's _communication_by_context in one pass, in an order
 * nesting_order() gave: placed[i] is row i's phase after it. A row in
 * communication (phase grad or other) has the context of its nearest
 * ancestor that is not; the outermost grad row of a nest takes comm_in of
 * its context (none: init where its collective is bcast, else grad), the
 * grad rows inside it take their parent's placed phase. context: scratch. */
void communication_by_context(const int8_t *phase, const int64_t *parent,
                              const int32_t *collective, int64_t n, int32_t order,
                              int8_t grad, int8_t other, int8_t init, const int8_t *comm_in,
                              int32_t bcast, int8_t *context, int8_t *placed) {
    for (int64_t k = 0; k < n; k++) {
        int64_t i = order > 0 ? k : n - 1 - k, p = parent[i];
        int8_t ph = phase[i];
        int in_comm = ph == grad || ph == other;
        context[i] = !in_comm ? ph : p >= 0 ? context[p] : -1;
        placed[i] = ph;
        if (ph != grad) continue;
        if (p >= 0 && (phase[p] == grad || phase[p] == other))
            placed[i] = placed[p];  /* inside a nest: its outermost's */
        else if (context[i] >= 0)
            placed[i] = comm_in[context[i]];
        else if (collective[i] == bcast)
            placed[i] = init;
    }
}

/* Whether a row ends after its parent (traces/readers/otf2_reader.py's
 * sign of two threads on one location). */
int32_t any_outlives(const int64_t *parent, const int64_t *end, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (parent[i] >= 0 && end[i] > end[parent[i]]) return 1;
    return 0;
}

/* Whether a row's parent is on another location (GPU work under the call
 * that launched it: traces/table.py's _steps_of_launches). */
int32_t any_parent_elsewhere(const int64_t *parent, const int32_t *location, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (parent[i] >= 0 && location[i] != location[parent[i]]) return 1;
    return 0;
}

/* traces/nesting.py's outermost(): for each of the n rows, the outermost
 * marked row among itself and its ancestors (a walk up from each). */
void outermost(const int64_t *parent, const uint8_t *marked, const int64_t *rows, int64_t n,
               int64_t *top) {
    for (int64_t k = 0; k < n; k++) {
        int64_t found = rows[k];
        for (int64_t at = parent[rows[k]]; at >= 0; at = parent[at])
            if (marked[at]) found = at;
        top[k] = found;
    }
}

/* Names -> codes, kept from chunk to chunk (traces/readers/kineto.py's
 * region and category codes): each row of a chunk is one hash probe here,
 * and only the names never seen go back to Python to be given a code. An
 * open-addressing table over copies of the names' bytes. */
typedef struct {
    int64_t *slots; /* entry + 1; 0: empty */
    int64_t mask;   /* slots - 1, a power of two less one */
    int64_t count;
    uint64_t *hashes;
    int64_t *starts;
    int32_t *lengths;
    int32_t *codes; /* -(k + 1): the k-th new name of the last lookup, not coded yet */
    int64_t entries_capacity;
    uint8_t *bytes;
    int64_t used, bytes_capacity;
} NameTable;

void name_table_free(NameTable *t) {
    if (!t) return;
    free(t->slots);
    free(t->hashes);
    free(t->starts);
    free(t->lengths);
    free(t->codes);
    free(t->bytes);
    free(t);
}

NameTable *name_table_new(void) {
    NameTable *t = calloc(1, sizeof(NameTable));
    if (!t) return NULL;
    t->mask = 1023;
    t->slots = calloc(t->mask + 1, sizeof(int64_t));
    if (!t->slots) {
        name_table_free(t);
        return NULL;
    }
    return t;
}

/* A name's hash, 8 bytes at a time (a byte at a time took half of a
 * lookup on names of some 30 bytes), mixed by MurmurHash3's finalizer. */
static uint64_t hash_bytes(const uint8_t *p, int64_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n, word;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&word, p, 8);
        h = (h ^ word) * 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
    }
    for (word = 0; n > 0; n--) word = (word << 8) | p[n - 1];
    h ^= word;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

static int64_t *slot_of(NameTable *t, uint64_t h, const uint8_t *p, int32_t n) {
    for (int64_t s = (int64_t)(h & (uint64_t)t->mask);; s = (s + 1) & t->mask) {
        int64_t e = t->slots[s] - 1;
        if (e < 0 || (t->hashes[e] == h && t->lengths[e] == n &&
                      memcmp(t->bytes + t->starts[e], p, n) == 0))
            return &t->slots[s];
    }
}

static int grow_slots(NameTable *t) {
    int64_t size = (t->mask + 1) * 2;
    int64_t *slots = calloc(size, sizeof(int64_t));
    if (!slots) return 0;
    free(t->slots);
    t->slots = slots;
    t->mask = size - 1;
    for (int64_t e = 0; e < t->count; e++) {
        int64_t s = (int64_t)(t->hashes[e] & (uint64_t)t->mask);
        while (t->slots[s]) s = (s + 1) & t->mask;
        t->slots[s] = e + 1;
    }
    return 1;
}

static int add_name(NameTable *t, const uint8_t *p, int32_t n, uint64_t h, int32_t code) {
    if (t->count == t->entries_capacity) {
        int64_t cap = t->entries_capacity ? 2 * t->entries_capacity : 1024;
        void *a = realloc(t->hashes, cap * sizeof(uint64_t));
        if (a) t->hashes = a;
        void *b = realloc(t->starts, cap * sizeof(int64_t));
        if (b) t->starts = b;
        void *c = realloc(t->lengths, cap * sizeof(int32_t));
        if (c) t->lengths = c;
        void *d = realloc(t->codes, cap * sizeof(int32_t));
        if (d) t->codes = d;
        if (!a || !b || !c || !d) return 0;
        t->entries_capacity = cap;
    }
    if (t->used + n > t->bytes_capacity) {
        int64_t cap = 2 * (t->used + n) + 4096;
        uint8_t *bytes = realloc(t->bytes, cap);
        if (!bytes) return 0;
        t->bytes = bytes;
        t->bytes_capacity = cap;
    }
    memcpy(t->bytes + t->used, p, n);
    t->hashes[t->count] = h;
    t->starts[t->count] = t->used;
    t->lengths[t->count] = n;
    t->codes[t->count] = code;
    t->used += n;
    t->count++;
    return 1;
}

/* codes[i]: the code of row i of an Arrow string array (offsets from
 * `first`, null rows skipped: valid, a bitmap or NULL, says which); a name
 * not seen before is added with code -(k + 1), k its place among the new
 * names, whose first rows go to new_rows. Returns how many are new (the
 * caller gives them codes with name_table_code), -1: out of memory. */
int64_t name_table_lookup(NameTable *t, const int32_t *offsets, const uint8_t *bytes,
                          const uint8_t *valid, int64_t first, int64_t n, int32_t *codes,
                          int64_t *new_rows) {
    int64_t added = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t j = first + i;
        if (valid && !((valid[j >> 3] >> (j & 7)) & 1)) {
            codes[i] = 0;
            continue;
        }
        const uint8_t *p = bytes + offsets[j];
        int32_t len = offsets[j + 1] - offsets[j];
        uint64_t h = hash_bytes(p, len);
        int64_t *slot = slot_of(t, h, p, len);
        int64_t e = *slot - 1;
        if (e < 0) {
            if (!add_name(t, p, len, h, (int32_t)(-(added + 1)))) return -1;
            e = t->count - 1;
            *slot = t->count;
            new_rows[added++] = i;
            if (2 * t->count > t->mask && !grow_slots(t)) return -1;
        }
        codes[i] = t->codes[e];
    }
    return added;
}

/* The codes of the last lookup's k new names, in their order. */
void name_table_code(NameTable *t, const int32_t *codes, int64_t k) {
    for (int64_t i = 0; i < k; i++) t->codes[t->count - k + i] = codes[i];
}
