/* A TOML 1.0 parser with a schema check over the parsed document, and one planted overrun.
 * Unlike the other examples it is meant not to saturate: string values carry small formats
 * of their own (durations, sizes, cron lines, versions, addresses, paths), checked by code
 * inlined into its field, so that a concolic loop keeps finding states for minutes.
 *
 * File: one TOML document of at most 4096 bytes, UTF-8, LF or CRLF lines.
 *   key = value        keys bare ([A-Za-z0-9_-]+), "basic" or 'literal', dotted (a.b."c")
 *   [a.b]  [[a.b]]     tables and arrays of tables; '#' comments to the end of a line
 *   values             "basic" strings with the escapes \b \t \n \f \r \" \\ \uXXXX and
 *                      \UXXXXXXXX (decoded to UTF-8; surrogates and > 10FFFF rejected),
 *                      'literal' strings, """multi-line basic""" (a line-ending backslash
 *                      trims the whitespace after it) and '''multi-line literal''' strings,
 *                      integers (sign, '_' between digits, no leading zero, 0x 0o 0b;
 *                      64 bits), floats (fraction, exponent of at most 999, inf, nan; kept
 *                      as mantissa * 10^exponent, 18 significant digits), true, false,
 *                      offset date-times (1979-05-27T07:32:00.5-07:00; 'T', 't' or a space
 *                      between), local date-times, local dates and local times (days checked
 *                      against the month, leap years included; seconds 00..60), arrays
 *                      (mixed, nested, over lines, with comments and a trailing comma) and
 *                      {inline = "tables"} (on one line, frozen once closed)
 * Errors as in the spec: a key or table defined twice, a table made by [header] extended by
 * dotted keys or the reverse, appending to a static array or an inline table; raw bytes
 * >= 0x80 must be valid UTF-8. Limits: 512 values, nesting 8 deep, keys of 8 parts.
 * Exit status: 0 the document parses and fits the schema, 1 it does not parse, 3 it breaks
 * the schema. Schema (every key optional unless marked *, unknown keys rejected):
 *   title string 1..64 bytes, version integer 1..3, created offset date-time from 2000,
 *   env "dev" "test" "prod" "stage"
 *   [owner]      name* string 1..32, email "local@do.main" (local [a-z0-9._+-]+, labels of
 *                [a-z0-9-] not ending in '-'), born local date 1900..2024, admin bool
 *   [server]     host (such labels, no dot needed), port 1..65535, listen "A.B.C.D:PORT" or
 *                "*:PORT", timeout number in (0, 3600] with at most 3 decimals, mode "fast"
 *                "safe" "lazy" "eco", workers power of two 1..64, protocol "http" "https"
 *                "h2c" "grpc" (https needs tls.enabled = true), idle duration 1s..1h,
 *                max_body size >= 1KiB
 *   [server.tls] enabled bool (then cert and key are needed), cert and key paths ending in
 *                ".pem" ".crt" or ".key", min_version float 1.2 or 1.3, ciphers 1..4
 *                distinct strings
 *   server.route array of at most 8 tables {path* path, method GET HEAD POST PUT PATCH
 *                DELETE OPTIONS, status 100..599, location path (exactly when status is 3xx),
 *                body string (not for HEAD, 1xx, 204, 304), cache duration 1s..1d, headers
 *                table of at most 8 scalars}
 *   [database]   url "postgres://HOST[:PORT][/...]" or "mysql://...", driver "postgres" or
 *                "mysql" (matching the url), pool 1..100, ratio number in [0, 1], timeout
 *                duration 1ms..1m, isolation "serializable" "snapshot" "read-committed",
 *                replicas array of at most 4 tables {host*, port, weight in (0, 1]} whose
 *                weights add up to at most 1
 *   [log]        level trace debug info warn error fatal, file path ending in ".log" or
 *                ".txt", keep 0..100, format "text" or "json", colors bool (only with
 *                "text"), rotate size >= 1KiB (only with file), max_age duration 1m..90d
 *   [schedule]   start and end local date-times (both or neither; start < end), days array
 *                of distinct "sun".."sat", at local time before 06:00, holidays array of at
 *                most 8 local dates, cron line
 *   backup       array of at most 4 tables {path* path, keep 1..30, compress bool or
 *                "gzip" "zstd" "lz4" "xz" "none", when offset date-time, every duration
 *                1m..7d, cron line, limit size >= 1MiB}
 *   plugin       array of at most 8 tables {name* [a-z][a-z0-9_-]* of 1..16 bytes, distinct,
 *                enabled bool, priority -100..100, after array of names of earlier plugins,
 *                icon string of one character, options table of at most 8 scalars, version
 *                semver 2.0 ("1.2.3-rc.1+b.5"), kind "http" "exec" "cron" "mail", which needs
 *                its own key and forbids the others': url "http(s)://...", command array of
 *                1..8 strings, the first a path, schedule cron line, to email}
 *   durations "1h30m" "90s" "250ms" "7d" (units d h m s ms, decreasing, each once); sizes
 *   "512" "4KiB" "2MB" "1G" (B K KB KiB M MB MiB G GB GiB); cron lines "*\/5 9-17 * jan,jun
 *   mon-fri" (minute hour day month weekday; lists of "*", N or N-M, each with an optional
 *   "/STEP"; names of months and days in their fields); paths "/srv/a.b/" (1..128 bytes,
 *   segments of [A-Za-z0-9._-] after single slashes, none "." or "..")
 * A document that fits the schema is then "rendered": each enabled plugin with an icon gets
 * a badge.
 *
 * Planted bug: a badge keeps its icon in glyph[4], "3 bytes of UTF-8 and a NUL", enough for
 * the Basic Multilingual Plane. A character beyond it takes 4 bytes: written with its NUL it
 * overruns into the integrity word after glyph[], and abort() catches it. It takes a whole
 * document that fits the schema, with a plugin table that has a name, enabled = true and an
 * icon of one astral character: "\U0001F600" (an escape of 8 hex digits above FFFF) or its
 * 4 raw UTF-8 bytes. No small seed (seeds/toml) has an icon or a \U escape; the large
 * ones have a BMP icon ("\u2605"), which needs the escape rewritten and lengthened.
 */
#include <string.h>

#include "read_input.h"

#define MAX_INPUT 4096
#define MAX_NODES 512
#define POOL_SIZE 8192
#define MAX_DEPTH 8
#define MAX_PARTS 8
#define MAX_PLUGINS 8
#define MAX_SIG 19 /* decimal digits: 2^63 - 1 has 19 */
#define BADGE_GUARD 0x70e1c0deu

enum { OK = 0, BAD_SYNTAX = 1, BAD_SCHEMA = 3 };
enum { T_TABLE, T_ARRAY, T_STRING, T_INT, T_FLOAT, T_BOOL, T_DATETIME };
enum { DT_OFFSET, DT_LOCAL, DT_DATE, DT_TIME };
enum { FL_FINITE, FL_INF, FL_NAN };

#define F_EXPLICIT 1 /* a table defined by a [header] */
#define F_DOTTED 2   /* a table defined by dotted keys */
#define F_INLINE 4   /* an inline table, or inside one: frozen */
#define F_AOT 8      /* an array of tables made by [[header]] */

struct str {
    int off, len; /* bytes in the pool */
};

struct datetime {
    int year, month, day, hour, minute, second, nanos, offset; /* offset in minutes */
    int kind;
};

struct node {
    int type, flags, section;
    int first, last, next, count;
    struct str key;
    struct str s;
    long long i; /* T_INT, T_BOOL; T_FLOAT: mantissa of i * 10^exp */
    int exp, fclass;
    struct datetime dt;
};

struct badge {
    unsigned char glyph[4]; /* BUG: 3 bytes and a NUL, but UTF-8 goes up to 4 */
    unsigned int guard;     /* must still be BADGE_GUARD */
};

static const unsigned char *in;
static int in_len, pos;
static struct node nodes[MAX_NODES];
static int nnodes, nsections;
static unsigned char pool[POOL_SIZE];
static int pool_len;
static struct badge badges[MAX_PLUGINS];

/* ---- helpers ---------------------------------------------------------------------- */

/* Not inlined: loops calling it would otherwise get trip counts computed with smax/umin
 * and freeze, which SymCC concretizes. */
static __attribute__((noinline)) int peek_at(int k)
{
    return pos + k < in_len ? in[pos + k] : -1;
}

#define PEEK() peek_at(0)

static __attribute__((noinline)) int emit(unsigned int byte)
{
    if (pool_len >= POOL_SIZE) return -1;
    pool[pool_len++] = (unsigned char)byte;
    return 0;
}

static int is_digit(int c) { return c >= '0' && c <= '9'; }

static int hex_value(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static __attribute__((noinline)) int is_bare(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_' ||
           c == '-';
}

static int new_node(int type)
{
    if (nnodes >= MAX_NODES) return -1;
    struct node *nd = &nodes[nnodes];
    memset(nd, 0, sizeof *nd);
    nd->type = type;
    nd->first = nd->last = nd->next = -1;
    return nnodes++;
}

static void append(int parent, int child)
{
    struct node *p = &nodes[parent];
    if (p->last < 0)
        p->first = child;
    else
        nodes[p->last].next = child;
    p->last = child;
    p->count++;
}

static int str_same(const struct str *a, const struct str *b)
{
    if (a->len != b->len) return 0;
    for (int i = 0; i < a->len; i++)
        if (pool[a->off + i] != pool[b->off + i]) return 0;
    return 1;
}

static __attribute__((noinline)) int find_child(int table, const struct str *key)
{
    int c = nodes[table].first;
    while (c >= 0 && !str_same(&nodes[c].key, key)) c = nodes[c].next;
    return c; /* -1 when none */
}

/* Inlined with the constant word: each character of each keyword is its own branch. */
static inline __attribute__((always_inline)) int str_is_n(const struct str *s, const char *w,
                                                          int n)
{
    if (s->len != n) return 0;
    for (int i = 0; i < n; i++)
        if (pool[s->off + i] != (unsigned char)w[i]) return 0;
    return 1;
}

#define str_is(s, word) str_is_n(s, word, (int)sizeof(word) - 1)
#define INLINE inline __attribute__((always_inline))
#define key_is(nd, word) str_is(&(nd)->key, word)

/* ---- whitespace, comments, line ends ---------------------------------------------- */

static void skip_ws(void)
{
    while (PEEK() == ' ' || PEEK() == '\t') pos++;
}

static int raw_utf8(void);

/* '#' to the end of the line: printable characters, tabs and valid UTF-8. */
static int comment(void)
{
    if (PEEK() != '#') return 0;
    pos++;
    for (;;) {
        int c = PEEK();
        if (c < 0 || c == '\n' || (c == '\r' && peek_at(1) == '\n')) return 0;
        if ((c < 0x20 && c != '\t') || c == 0x7f) return -1;
        if (c >= 0x80) {
            int keep = pool_len; /* validated, not kept */
            if (raw_utf8() != 0) return -1;
            pool_len = keep;
        } else {
            pos++;
        }
    }
}

/* LF or CRLF: 1 when one was skipped. */
static int newline(void)
{
    int n = PEEK() == '\n' ? 1 : PEEK() == '\r' && peek_at(1) == '\n' ? 2 : 0;
    pos += n;
    return n > 0;
}

/* Blanks, comments and newlines, as allowed between the values of an array. */
static int skip_ws_nl(void)
{
    for (;;) {
        skip_ws();
        if (comment() != 0) return -1;
        if (!newline()) return 0;
    }
}

static int end_of_line(void)
{
    skip_ws();
    if (comment() != 0) return -1;
    return PEEK() < 0 || newline() ? 0 : -1;
}

/* ---- strings ---------------------------------------------------------------------- */

static int emit_utf8(unsigned int cp)
{
    if (cp < 0x80) return emit(cp);
    if (cp < 0x800) return emit(0xc0 | (cp >> 6)) || emit(0x80 | (cp & 0x3f));
    if (cp < 0x10000)
        return emit(0xe0 | (cp >> 12)) || emit(0x80 | ((cp >> 6) & 0x3f)) ||
               emit(0x80 | (cp & 0x3f));
    return emit(0xf0 | (cp >> 18)) || emit(0x80 | ((cp >> 12) & 0x3f)) ||
           emit(0x80 | ((cp >> 6) & 0x3f)) || emit(0x80 | (cp & 0x3f));
}

/* A raw UTF-8 sequence whose lead byte is at pos: validated and copied. */
static int raw_utf8(void)
{
    int lead = PEEK(), extra = lead >= 0xc2 && lead <= 0xdf   ? 1
                             : lead >= 0xe0 && lead <= 0xef ? 2
                             : lead >= 0xf0 && lead <= 0xf4 ? 3
                                                            : 0;
    unsigned int cp = (unsigned int)lead & (0x3fu >> extra);
    if (extra == 0 || emit((unsigned int)lead) != 0) return -1;
    pos++;
    for (int i = 0; i < extra; i++) {
        int c = PEEK();
        if (c < 0 || (c & 0xc0) != 0x80 || emit((unsigned int)c) != 0) return -1;
        cp = (cp << 6) | (c & 0x3f);
        pos++;
    }
    if ((extra == 2 && cp < 0x800) || (extra == 3 && (cp < 0x10000 || cp > 0x10ffff)))
        return -1; /* overlong or out of range */
    return cp >= 0xd800 && cp <= 0xdfff ? -1 : 0;
}

static int hex_escape(int digits)
{
    unsigned int v = 0;
    for (int i = 0; i < digits; i++) {
        int d = hex_value(PEEK());
        if (d < 0) return -1;
        pos++;
        v = (v << 4) | (unsigned int)d;
    }
    if ((v >= 0xd800 && v <= 0xdfff) || v > 0x10ffff) return -1;
    return emit_utf8(v);
}

/* After a backslash in a basic string. */
static int escape(void)
{
    int c = PEEK();
    pos++;
    switch (c) {
    case 'b': return emit('\b');
    case 't': return emit('\t');
    case 'n': return emit('\n');
    case 'f': return emit('\f');
    case 'r': return emit('\r');
    case '"': return emit('"');
    case '\\': return emit('\\');
    case 'u': return hex_escape(4);
    case 'U': return hex_escape(8);
    default: return -1;
    }
}

/* A backslash at the end of a line of a multi-line basic string: 1 when it was one (and
 * the whitespace after it is skipped), 0 when it is an escape. */
static int line_ending_backslash(void)
{
    int k = 1;
    while (peek_at(k) == ' ' || peek_at(k) == '\t') k++;
    if (peek_at(k) != '\n' && !(peek_at(k) == '\r' && peek_at(k + 1) == '\n')) return 0;
    pos += k;
    for (;;) {
        skip_ws();
        if (!newline()) return 1;
    }
}

/* A string of any of the four kinds at pos, decoded into the pool. */
static int parse_string(struct str *s, int allow_multiline)
{
    int q = PEEK(), ml = peek_at(1) == q && peek_at(2) == q;
    s->off = pool_len;
    if (ml) {
        if (!allow_multiline) return -1;
        pos += 3;
        newline(); /* a newline right after the delimiter is trimmed */
    } else {
        pos++;
    }
    for (;;) {
        int c = PEEK();
        if (c < 0) return -1;
        if (c == q) {
            if (!ml) {
                pos++;
                break;
            }
            if (peek_at(1) == q && peek_at(2) == q) {
                pos += 3;
                for (int extra = 0; extra < 2 && PEEK() == q; extra++, pos++)
                    if (emit((unsigned int)q) != 0) return -1;
                break;
            }
            if (emit((unsigned int)c) != 0) return -1;
            pos++;
        } else if (c == '\\' && q == '"') {
            if (ml && line_ending_backslash()) continue;
            pos++;
            if (escape() != 0) return -1;
        } else if (ml && (c == '\n' || (c == '\r' && peek_at(1) == '\n'))) {
            newline();
            if (emit('\n') != 0) return -1;
        } else if (c >= 0x80) {
            if (raw_utf8() != 0) return -1;
        } else if ((c < 0x20 && c != '\t') || c == 0x7f) {
            return -1;
        } else {
            if (emit((unsigned int)c) != 0) return -1;
            pos++;
        }
    }
    s->len = pool_len - s->off;
    return 0;
}

/* ---- keys ------------------------------------------------------------------------- */

static int parse_key(struct str *parts, int *nparts)
{
    int np = 0;
    for (;;) {
        struct str *k = &parts[np];
        if (np >= MAX_PARTS) return -1;
        skip_ws();
        if (PEEK() == '"' || PEEK() == '\'') {
            if (parse_string(k, 0) != 0) return -1;
        } else {
            k->off = pool_len;
            while (is_bare(PEEK())) {
                if (emit((unsigned int)PEEK()) != 0) return -1;
                pos++;
            }
            k->len = pool_len - k->off;
            if (k->len == 0) return -1;
        }
        np++;
        skip_ws();
        if (PEEK() != '.') break;
        pos++;
    }
    *nparts = np;
    return 0;
}

/* ---- numbers ---------------------------------------------------------------------- */

/* Digits of `base` with '_' only between two digits, into a mantissa of at most `max`
 * significant digits (*sig so far; the others are dropped and counted in *dropped). */
static int digit_run(int base, int max, unsigned long long *v, int *sig, int *ndigits,
                     int *dropped)
{
    int n = 0;
    for (;;) {
        int c = PEEK(), d = hex_value(c);
        if (c == '_') {
            if (n == 0 || hex_value(peek_at(1)) < 0 || hex_value(peek_at(1)) >= base) return -1;
            pos++;
            continue;
        }
        if (d < 0 || d >= base) break;
        pos++;
        n++;
        if (*v != 0 || d != 0) (*sig)++;
        if (*sig > max) {
            (*dropped)++;
            continue;
        }
        *v = *v * (unsigned long long)base + (unsigned long long)d;
    }
    *ndigits = n;
    return n == 0 ? -1 : 0;
}

static int parse_number(struct node *nd)
{
    int neg = 0, signed_ = 0, n, sig = 0, dropped = 0, frac = 0, exp = 0, is_float = 0;
    unsigned long long v = 0;
    if (PEEK() == '+' || PEEK() == '-') {
        neg = in[pos++] == '-';
        signed_ = 1;
    }
    if (PEEK() == 'i' || PEEK() == 'n') {
        int inf = PEEK() == 'i';
        const char *w = inf ? "inf" : "nan";
        for (int k = 0; k < 3; k++)
            if (peek_at(k) != w[k]) return -1;
        pos += 3;
        nd->type = T_FLOAT;
        nd->fclass = inf ? FL_INF : FL_NAN;
        nd->i = neg ? -1 : 1;
        return 0;
    }
    if (!signed_ && PEEK() == '0' && (peek_at(1) == 'x' || peek_at(1) == 'o' || peek_at(1) == 'b')) {
        int base = peek_at(1) == 'x' ? 16 : peek_at(1) == 'o' ? 8 : 2;
        int max = base == 16 ? 16 : base == 8 ? 21 : 63; /* 2^63 - 1 fits */
        pos += 2;
        if (digit_run(base, max, &v, &sig, &n, &dropped) != 0 || dropped > 0 ||
            v > 0x7fffffffffffffffULL)
            return -1;
        nd->type = T_INT;
        nd->i = (long long)v;
        return 0;
    }
    if (PEEK() == '0' && (is_digit(peek_at(1)) || peek_at(1) == '_'))
        return -1; /* a leading zero */
    if (digit_run(10, MAX_SIG, &v, &sig, &n, &dropped) != 0) return -1;
    exp = dropped;
    if (PEEK() == '.') {
        pos++;
        dropped = 0;
        if (!is_digit(PEEK()) || digit_run(10, MAX_SIG, &v, &sig, &frac, &dropped) != 0)
            return -1;
        frac -= dropped;
        is_float = 1;
    }
    if (PEEK() == 'e' || PEEK() == 'E') {
        unsigned long long e = 0;
        int eneg = 0, esig = 0, edropped = 0, ed;
        pos++;
        if (PEEK() == '+' || PEEK() == '-')
            eneg = in[pos++] == '-';
        if (digit_run(10, 3, &e, &esig, &ed, &edropped) != 0 || edropped > 0)
            return -1; /* no digits, or an exponent beyond 999 */
        exp += eneg ? -(int)e : (int)e;
        is_float = 1;
    }
    if (!is_float) {
        if (dropped > 0 || v > 0x7fffffffffffffffULL + (unsigned long long)neg) return -1;
        nd->type = T_INT;
        nd->i = neg ? (long long)(0 - v) : (long long)v;
        return 0;
    }
    for (; v >= 1000000000000000000ULL; v /= 10)
        exp++; /* 18 significant digits kept */
    nd->type = T_FLOAT;
    nd->fclass = FL_FINITE;
    nd->i = neg ? -(long long)v : (long long)v;
    nd->exp = v == 0 ? 0 : exp - frac;
    return 0;
}

/* ---- dates and times -------------------------------------------------------------- */

/* k digits, then the separator `sep` unless it is 0. */
static int fixed_digits(int k, int *out, int sep)
{
    int v = 0;
    for (int i = 0; i < k; i++, pos++) {
        if (!is_digit(PEEK())) return -1;
        v = v * 10 + (PEEK() - '0');
    }
    *out = v;
    if (sep == 0) return 0;
    return PEEK() == sep ? (pos++, 0) : -1;
}

static int days_in_month(int year, int month)
{
    if (month == 2) return year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) ? 29 : 28;
    if (month == 4 || month == 6 || month == 9 || month == 11) return 30;
    return 31;
}

static int parse_time(struct datetime *dt)
{
    if (fixed_digits(2, &dt->hour, ':') || fixed_digits(2, &dt->minute, ':') ||
        fixed_digits(2, &dt->second, 0) || dt->hour > 23 || dt->minute > 59 || dt->second > 60)
        return -1;
    if (PEEK() == '.') {
        int scale = 100000000, n = 0;
        pos++;
        while (is_digit(PEEK())) {
            dt->nanos += (PEEK() - '0') * scale;
            scale /= 10;
            n++;
            pos++;
        }
        if (n == 0) return -1;
    }
    return 0;
}

static int parse_datetime(struct node *nd)
{
    struct datetime *dt = &nd->dt;
    nd->type = T_DATETIME;
    if (peek_at(2) == ':') {
        dt->kind = DT_TIME;
        return parse_time(dt);
    }
    if (fixed_digits(4, &dt->year, '-') || fixed_digits(2, &dt->month, '-') ||
        fixed_digits(2, &dt->day, 0))
        return -1;
    if (dt->month < 1 || dt->month > 12 || dt->day < 1 ||
        dt->day > days_in_month(dt->year, dt->month))
        return -1;
    dt->kind = DT_DATE;
    if (!(PEEK() == 'T' || PEEK() == 't' || (PEEK() == ' ' && is_digit(peek_at(1))))) return 0;
    pos++;
    if (parse_time(dt) != 0) return -1;
    dt->kind = DT_LOCAL;
    if (PEEK() == 'Z' || PEEK() == 'z') {
        pos++;
        dt->kind = DT_OFFSET;
    } else if (PEEK() == '+' || PEEK() == '-') {
        int neg = in[pos++] == '-', h, m;
        if (fixed_digits(2, &h, ':') || fixed_digits(2, &m, 0) || h > 23 || m > 59) return -1;
        dt->offset = neg ? -(h * 60 + m) : h * 60 + m;
        dt->kind = DT_OFFSET;
    }
    return 0;
}

/* ---- values, arrays, inline tables ------------------------------------------------ */

static int parse_value(int depth);
static int keyval(int table, int section, int depth);

static int parse_array(int depth)
{
    int self = new_node(T_ARRAY);
    if (self < 0) return -1;
    pos++; /* '[' */
    for (;;) {
        if (skip_ws_nl() != 0) return -1;
        if (PEEK() == ']') break;
        int v = parse_value(depth + 1);
        if (v < 0) return -1;
        append(self, v);
        if (skip_ws_nl() != 0) return -1;
        if (PEEK() == ',') {
            pos++;
            continue;
        }
        if (PEEK() != ']') return -1;
        break;
    }
    pos++;
    return self;
}

static int parse_inline_table(int depth)
{
    int self = new_node(T_TABLE), section = ++nsections;
    if (self < 0) return -1;
    nodes[self].flags = F_INLINE;
    pos++; /* '{' */
    skip_ws();
    if (PEEK() == '}') {
        pos++;
        return self;
    }
    for (;;) {
        if (keyval(self, section, depth + 1) != 0) return -1;
        skip_ws();
        if (PEEK() == ',') {
            pos++;
            continue;
        }
        if (PEEK() != '}') return -1;
        pos++;
        return self;
    }
}

static int parse_value(int depth)
{
    int c = PEEK(), self;
    if (depth > MAX_DEPTH) return -1;
    if (c == '[') return parse_array(depth);
    if (c == '{') return parse_inline_table(depth);
    if ((self = new_node(T_STRING)) < 0) return -1;
    struct node *nd = &nodes[self];
    if (c == '"' || c == '\'') return parse_string(&nd->s, 1) == 0 ? self : -1;
    if (c == 't' || c == 'f') {
        const char *w = c == 't' ? "true" : "false";
        for (int k = 0; w[k]; k++, pos++)
            if (PEEK() != w[k]) return -1;
        nd->type = T_BOOL;
        nd->i = c == 't';
        return self;
    }
    if (is_digit(c) && is_digit(peek_at(1)) &&
        (peek_at(2) == ':' || (is_digit(peek_at(2)) && is_digit(peek_at(3)) && peek_at(4) == '-')))
        return parse_datetime(nd) == 0 ? self : -1;
    return parse_number(nd) == 0 ? self : -1;
}

/* key = value into `table`; dotted keys make (or reopen, in the same section) tables. */
static int keyval(int table, int section, int depth)
{
    struct str parts[MAX_PARTS];
    int np, t = table;
    if (parse_key(parts, &np) != 0 || PEEK() != '=') return -1;
    pos++;
    skip_ws();
    for (int i = 0; i + 1 < np; i++) {
        int c = find_child(t, &parts[i]);
        if (c < 0) {
            if ((c = new_node(T_TABLE)) < 0) return -1;
            nodes[c].flags = F_DOTTED | (nodes[table].flags & F_INLINE);
            nodes[c].section = section;
            nodes[c].key = parts[i];
            append(t, c);
        } else if (nodes[c].type != T_TABLE || !(nodes[c].flags & F_DOTTED) ||
                   nodes[c].section != section) {
            return -1;
        }
        t = c;
    }
    if (find_child(t, &parts[np - 1]) >= 0)
        return -1; /* defined twice */
    int v = parse_value(depth);
    if (v < 0) return -1;
    nodes[v].key = parts[np - 1];
    append(t, v);
    return 0;
}

/* [a.b] or [[a.b]] at pos: the table that the following key/value pairs go into. */
static int header(int root)
{
    struct str parts[MAX_PARTS];
    int np, t = root, aot = peek_at(1) == '[';
    pos += aot ? 2 : 1;
    if (parse_key(parts, &np) != 0 || PEEK() != ']') return -1;
    pos++;
    if (aot) {
        if (PEEK() != ']') return -1;
        pos++;
    }
    for (int i = 0; i < np; i++) {
        int c = find_child(t, &parts[i]), last = i == np - 1;
        if (c >= 0 && nodes[c].type == T_ARRAY && (nodes[c].flags & F_AOT) && !(last && !aot)) {
            if (last) {
                int e = new_node(T_TABLE);
                if (e < 0) return -1;
                nodes[e].flags = F_EXPLICIT;
                append(c, e);
                return e;
            }
            t = nodes[c].last;
            continue;
        }
        if (c >= 0 && (nodes[c].type != T_TABLE || (nodes[c].flags & F_INLINE))) return -1;
        if (last && c >= 0) {
            if (aot || (nodes[c].flags & (F_EXPLICIT | F_DOTTED)))
                return -1; /* defined twice */
            nodes[c].flags |= F_EXPLICIT;
            return c;
        }
        if (c < 0) {
            if ((c = new_node(last && aot ? T_ARRAY : T_TABLE)) < 0) return -1;
            nodes[c].key = parts[i];
            append(t, c);
            if (last && aot) {
                int e = new_node(T_TABLE);
                if (e < 0) return -1;
                nodes[c].flags = F_AOT;
                nodes[e].flags = F_EXPLICIT;
                append(c, e);
                return e;
            }
            if (last) nodes[c].flags = F_EXPLICIT;
        }
        t = c;
    }
    return t;
}

static int parse_document(void)
{
    int root = new_node(T_TABLE), table = root, section = 0;
    for (;;) {
        if (skip_ws_nl() != 0) return -1;
        if (PEEK() < 0) return root;
        if (PEEK() == '[') {
            if ((table = header(root)) < 0) return -1;
            section = ++nsections;
        } else if (keyval(table, section, 0) != 0) {
            return -1;
        }
        if (end_of_line() != 0) return -1;
    }
}

/* ---- schema ----------------------------------------------------------------------- */

/* The checks below return 1 when a value fits. In a table's loop over its members m,
 * FIELD(word, ok) rejects a member named `word` that does not fit; the last `else`
 * rejects unknown keys. */
#define FIELD(word, ok)                                                                    \
    if (key_is(m, word)) {                                                                 \
        if (!(ok))                                                                         \
            return 0;                                                                      \
        continue;                                                                          \
    }
#define MEMBERS(t) for (const struct node *m = first(t); m != NULL; m = next(m))
#define S_IS(m, word) str_is(&(m)->s, word)

static const struct node *first(const struct node *t)
{
    return t->first >= 0 ? &nodes[t->first] : NULL;
}
static const struct node *next(const struct node *m)
{
    return m->next >= 0 ? &nodes[m->next] : NULL;
}

/* An integer or finite float times 10^scale, as an exact integer within +-10^15. */
static int num_scaled(const struct node *nd, int scale, long long *out)
{
    long long m = nd->i;
    int e = nd->type == T_INT ? scale : nd->exp + scale;
    if (nd->type != T_INT && (nd->type != T_FLOAT || nd->fclass != FL_FINITE)) return 0;
    for (; e < 0; e++) {
        if (m % 10 != 0)
            return 0; /* more decimals than kept */
        m /= 10;
    }
    for (; e > 0; e--) {
        if (m > 100000000000000LL || m < -100000000000000LL) return 0;
        m *= 10;
    }
    *out = m;
    return 1;
}

static int number_in(const struct node *nd, int scale, long long lo, long long hi)
{
    long long v;
    return num_scaled(nd, scale, &v) && v >= lo && v <= hi;
}

static int int_in(const struct node *nd, long long lo, long long hi)
{
    return nd->type == T_INT && nd->i >= lo && nd->i <= hi;
}

static int is_bool(const struct node *nd) { return nd->type == T_BOOL; }
static int is_str(const struct node *nd) { return nd->type == T_STRING; }
static int is_table(const struct node *nd) { return nd->type == T_TABLE; }

static int is_dt(const struct node *nd, int kind)
{
    return nd->type == T_DATETIME && nd->dt.kind == kind;
}

static int str_len(const struct node *nd, int lo, int hi)
{
    return is_str(nd) && nd->s.len >= lo && nd->s.len <= hi;
}

static __attribute__((noinline)) int is_lower_alnum(int c)
{
    return (c >= 'a' && c <= 'z') || is_digit(c);
}

static inline __attribute__((always_inline)) int str_starts_n(const struct str *s,
                                                              const char *w, int n)
{
    if (s->len < n) return 0;
    for (int i = 0; i < n; i++)
        if (pool[s->off + i] != (unsigned char)w[i]) return 0;
    return 1;
}

#define str_starts(s, word) str_starts_n(s, word, (int)sizeof(word) - 1)

/* A cursor over a string value, for the small formats inside strings. */
struct cur {
    const unsigned char *c;
    int i, len;
};

static struct cur cursor(const struct node *nd)
{
    struct cur k = {pool + nd->s.off, 0, nd->s.len};
    return k;
}

static __attribute__((noinline)) int cpeek(const struct cur *k)
{
    return k->i < k->len ? k->c[k->i] : -1;
}

/* A decimal of 1..max digits without a leading zero, in lo..hi. */
static INLINE int cnum(struct cur *k, int max, long long lo, long long hi, long long *out)
{
    long long v = 0;
    int n = 0;
    if (cpeek(k) == '0' && k->i + 1 < k->len && is_digit(k->c[k->i + 1])) return 0;
    while (is_digit(cpeek(k))) {
        if (n == max) return 0;
        n++;
        v = v * 10 + (k->c[k->i++] - '0');
    }
    *out = v;
    return n > 0 && v >= lo && v <= hi;
}

/* Labels of [a-z0-9-] (not starting or ending with '-') separated by dots; dots > 0. */
static INLINE int domain(struct cur *k, int min_dots)
{
    int label = 0, dots = 0;
    for (; k->i < k->len; k->i++) {
        int c = k->c[k->i];
        if (c == '.') {
            if (label == 0 || k->c[k->i - 1] == '-') return 0;
            dots++;
            label = 0;
        } else if (c == '-') {
            if (label == 0) return 0;
            label++;
        } else if (is_lower_alnum(c)) {
            label++;
        } else {
            break;
        }
    }
    return label > 0 && k->c[k->i - 1] != '-' && dots >= min_dots;
}

static INLINE int hostname(const struct node *nd)
{
    struct cur k = cursor(nd);
    return str_len(nd, 1, 64) && domain(&k, 0) && k.i == k.len;
}

static INLINE int email(const struct node *nd)
{
    struct cur k = cursor(nd);
    if (!str_len(nd, 3, 64)) return 0;
    for (; cpeek(&k) != '@'; k.i++) {
        int c = cpeek(&k);
        if (c == '.' || c == '_' || c == '+' || c == '-') continue;
        if (c < 0 || !is_lower_alnum(c)) return 0;
    }
    if (k.i == 0) return 0;
    k.i++;
    return domain(&k, 1) && k.i == k.len;
}

static int dot(struct cur *k) { return cpeek(k) == '.' && ++k->i; }

/* "A.B.C.D:PORT" or "*:PORT". */
static int listen_address(const struct node *nd)
{
    struct cur k = cursor(nd);
    long long v;
    if (!str_len(nd, 3, 21)) return 0;
    if (cpeek(&k) == '*')
        k.i++;
    else if (!(cnum(&k, 3, 0, 255, &v) && dot(&k) && cnum(&k, 3, 0, 255, &v) && dot(&k) &&
               cnum(&k, 3, 0, 255, &v) && dot(&k) && cnum(&k, 3, 0, 255, &v)))
        return 0;
    if (cpeek(&k) != ':') return 0;
    k.i++;
    return cnum(&k, 5, 1, 65535, &v) && k.i == k.len;
}

/* "1h30m", "90s", "250ms", "7d": units d h m s ms, in decreasing order, each once; in
 * milliseconds within lo..hi. */
static INLINE int duration(const struct node *nd, long long lo, long long hi)
{
    struct cur k = cursor(nd);
    long long total = 0, v, unit;
    int last = 5;
    if (!str_len(nd, 2, 32)) return 0;
    while (k.i < k.len) {
        int u;
        if (!cnum(&k, 6, 0, 999999, &v)) return 0;
        switch (cpeek(&k)) {
        case 'd': u = 4, unit = 86400000; break;
        case 'h': u = 3, unit = 3600000; break;
        case 'm':
            if (k.i + 1 < k.len && k.c[k.i + 1] == 's') {
                u = 0, unit = 1;
                k.i++;
            } else {
                u = 2, unit = 60000;
            }
            break;
        case 's': u = 1, unit = 1000; break;
        default: return 0;
        }
        k.i++;
        if (u >= last) return 0;
        last = u;
        total += v * unit;
    }
    return total >= lo && total <= hi;
}

/* "512", "4KiB", "2MB", "1G": B K KB KiB M MB MiB G GB GiB; in bytes, at least lo. */
static INLINE int size(const struct node *nd, long long lo)
{
    struct cur k = cursor(nd);
    long long v, mult = 1;
    if (!str_len(nd, 1, 16) || !cnum(&k, 6, 0, 999999, &v)) return 0;
    if (cpeek(&k) == 'K' || cpeek(&k) == 'M' || cpeek(&k) == 'G') {
        int p = k.c[k.i++];
        mult = p == 'K' ? 1024 : p == 'M' ? 1048576 : 1073741824;
        if (cpeek(&k) == 'B') {
            mult = p == 'K' ? 1000 : p == 'M' ? 1000000 : 1000000000;
            k.i++;
        } else if (cpeek(&k) == 'i') {
            k.i++;
            if (cpeek(&k) != 'B') return 0;
            k.i++;
        }
    } else if (cpeek(&k) == 'B') {
        k.i++;
    }
    return k.i == k.len && v * mult >= lo;
}

/* "/a/b.c": segments of [A-Za-z0-9._-] after single slashes, none of them "." or ".."; ext 1
 * needs the file to end in ".pem", ".crt" or ".key", ext 2 in ".log" or ".txt". */
static INLINE int path(const struct node *nd, int ext)
{
    struct cur k = cursor(nd);
    struct str tail = {nd->s.off + nd->s.len - 4, 4};
    int seg = 0, dots = 0;
    if (!str_len(nd, 1, 128) || cpeek(&k) != '/') return 0;
    for (k.i = 1; k.i <= k.len; k.i++) {
        int c = cpeek(&k);
        if (c == '/' || c < 0) {
            if ((seg == 0 && c == '/') || (seg > 0 && seg == dots && dots <= 2))
                return 0; /* "//", "/./" or "/../" */
            seg = dots = 0;
            continue;
        }
        seg++;
        if (c == '.')
            dots++;
        else if (c != '_' && c != '-' && !(c >= 'A' && c <= 'Z') && !is_lower_alnum(c))
            return 0;
    }
    if (ext == 0) return 1;
    if (nd->s.len < 6 || pool[tail.off - 1] == '/') return 0; /* a name before the extension */
    if (ext == 1) return str_is(&tail, ".pem") || str_is(&tail, ".crt") || str_is(&tail, ".key");
    return str_is(&tail, ".log") || str_is(&tail, ".txt");
}

/* After '-' (pre-release) or '+' (build): dot-separated identifiers of [0-9A-Za-z-]. */
static INLINE int identifiers(struct cur *k, int sep)
{
    if (cpeek(k) != sep) return 1;
    do {
        int start = ++k->i, digits = 1;
        while (is_lower_alnum(cpeek(k)) || cpeek(k) == '-' ||
               (cpeek(k) >= 'A' && cpeek(k) <= 'Z')) {
            digits &= is_digit(cpeek(k));
            k->i++;
        }
        if (k->i == start)
            return 0; /* an empty identifier */
        if (sep == '-' && digits && k->c[start] == '0' && k->i - start > 1)
            return 0; /* a numeric identifier with a leading zero */
    } while (cpeek(k) == '.');
    return 1;
}

/* "1.2.3", "0.9.0-rc.1", "2.0.0+build.5": semantic versioning 2.0. */
static int semver(const struct node *nd)
{
    struct cur k = cursor(nd);
    long long v;
    return str_len(nd, 5, 32) && cnum(&k, 6, 0, 999999, &v) && dot(&k) &&
           cnum(&k, 6, 0, 999999, &v) && dot(&k) && cnum(&k, 6, 0, 999999, &v) &&
           identifiers(&k, '-') && identifiers(&k, '+') && k.i == k.len;
}

/* A day name at the cursor: 0 (sun) .. 6 (sat), -1 when none. */
static INLINE int weekday(struct cur *k)
{
    struct str s = {(int)(k->c - pool) + k->i, k->len - k->i < 3 ? k->len - k->i : 3};
    int d = str_is(&s, "sun") ? 0 : str_is(&s, "mon") ? 1 : str_is(&s, "tue") ? 2
          : str_is(&s, "wed") ? 3 : str_is(&s, "thu") ? 4 : str_is(&s, "fri") ? 5
          : str_is(&s, "sat") ? 6 : -1;
    k->i += d >= 0 ? 3 : 0;
    return d;
}

/* A month name at the cursor: 1 (jan) .. 12 (dec), -1 when none. */
static INLINE int month(struct cur *k)
{
    struct str s = {(int)(k->c - pool) + k->i, k->len - k->i < 3 ? k->len - k->i : 3};
    int m = str_is(&s, "jan") ? 1 : str_is(&s, "feb") ? 2 : str_is(&s, "mar") ? 3
      : str_is(&s, "apr") ? 4 : str_is(&s, "may") ? 5 : str_is(&s, "jun") ? 6
      : str_is(&s, "jul") ? 7 : str_is(&s, "aug") ? 8 : str_is(&s, "sep") ? 9
      : str_is(&s, "oct") ? 10 : str_is(&s, "nov") ? 11 : str_is(&s, "dec") ? 12 : -1;
    k->i += m > 0 ? 3 : 0;
    return m;
}

/* One cron field: a list of "*", "N" or "N-M" (N <= M), each optionally "/STEP"; N and
 * M in lo..hi, or names in the month and day-of-week fields. Inlined into each field. */
static INLINE int cron_field(struct cur *k, int names, long long lo, long long hi)
{
    do {
        long long a, b, step;
        if (cpeek(k) == '*') {
            k->i++;
        } else {
            if (names && cpeek(k) >= 'a')
                a = names == 1 ? month(k) : weekday(k);
            else if (!cnum(k, 2, lo, hi, &a))
                return 0;
            if (a < 0) return 0;
            if (cpeek(k) == '-') {
                k->i++;
                if (names && cpeek(k) >= 'a')
                    b = names == 1 ? month(k) : weekday(k);
                else if (!cnum(k, 2, lo, hi, &b))
                    return 0;
                if (b < a) return 0;
            }
        }
        if (cpeek(k) == '/') {
            k->i++;
            if (!cnum(k, 2, 1, hi, &step)) return 0;
        }
    } while (cpeek(k) == ',' && ++k->i);
    return 1;
}

static int blank(struct cur *k) { return cpeek(k) == ' ' && ++k->i; }

/* "*\/5 0-6 * 1,jun mon-fri": minute hour day-of-month month day-of-week. */
static INLINE int cron(const struct node *nd)
{
    struct cur k = cursor(nd);
    return str_len(nd, 9, 64) && cron_field(&k, 0, 0, 59) && blank(&k) &&
           cron_field(&k, 0, 0, 23) && blank(&k) && cron_field(&k, 0, 1, 31) && blank(&k) &&
           cron_field(&k, 1, 1, 12) && blank(&k) && cron_field(&k, 2, 0, 7) && k.i == k.len;
}

/* The number of UTF-8 characters of a string (the parser validated it). */
static int characters(const struct str *s)
{
    int n = 0;
    for (int i = 0; i < s->len; i++)
        if ((pool[s->off + i] & 0xc0) != 0x80) n++;
    return n;
}

static int strings(const struct node *a, int lo, int hi, int distinct)
{
    if (a->type != T_ARRAY || a->count < lo || a->count > hi) return 0;
    MEMBERS(a) {
        if (!str_len(m, 1, 128)) return 0;
        for (const struct node *o = next(m); distinct && o != NULL; o = next(o))
            if (str_same(&m->s, &o->s)) return 0;
    }
    return 1;
}

static int check_owner(const struct node *t)
{
    int has_name = 0;
    MEMBERS(t) {
        FIELD("name", (has_name = str_len(m, 1, 32)))
        FIELD("email", email(m))
        FIELD("born", is_dt(m, DT_DATE) && m->dt.year >= 1900 && m->dt.year <= 2024)
        FIELD("admin", is_bool(m))
        return 0; /* an unknown key */
    }
    return has_name;
}

static int check_tls(const struct node *t, int *enabled)
{
    int has_cert = 0, has_key = 0;
    MEMBERS(t) {
        FIELD("enabled", is_bool(m) && ((*enabled = (int)m->i) || 1))
        FIELD("cert", (has_cert = path(m, 1)))
        FIELD("key", (has_key = path(m, 1)))
        FIELD("min_version", m->type == T_FLOAT && (number_in(m, 1, 12, 12) ||
                                                    number_in(m, 1, 13, 13)))
        FIELD("ciphers", strings(m, 1, 4, 1))
        return 0; /* an unknown key */
    }
    return !*enabled || (has_cert && has_key);
}

static int scalars(const struct node *t)
{
    if (!is_table(t) || t->count > 8) return 0;
    MEMBERS(t)
        if (m->type == T_TABLE || m->type == T_ARRAY) return 0;
    return 1;
}

/* An array of at most max tables, each passing check(table, index). */
static int tables(const struct node *a, int max, int (*check)(const struct node *, int))
{
    int i = 0;
    if (a->type != T_ARRAY || a->count > max) return 0;
    MEMBERS(a)
        if (!check(m, i++)) return 0;
    return 1;
}

/* [[server.route]]: 3xx needs a location, 1xx 204 304 have no body, HEAD no body. */
static int route(const struct node *t, int index)
{
    int head = 0, status = 200, location = 0, body = 0, has_path = 0;
    (void)index;
    if (!is_table(t)) return 0;
    MEMBERS(t) {
        FIELD("path", (has_path = path(m, 0)))
        FIELD("method", is_str(m) && (S_IS(m, "GET") || (head = S_IS(m, "HEAD")) ||
                                      S_IS(m, "POST") || S_IS(m, "PUT") || S_IS(m, "PATCH") ||
                                      S_IS(m, "DELETE") || S_IS(m, "OPTIONS")))
        FIELD("status", int_in(m, 100, 599) && (status = (int)m->i))
        FIELD("location", (location = path(m, 0)))
        FIELD("body", (body = is_str(m)))
        FIELD("cache", duration(m, 1000, 86400000))
        FIELD("headers", scalars(m))
        return 0; /* an unknown key */
    }
    if (!has_path || (status / 100 == 3) != location) return 0;
    return !body || !(head || status < 200 || status == 204 || status == 304);
}

static int check_server(const struct node *t)
{
    int tls = 0, https = 0;
    MEMBERS(t) {
        FIELD("host", hostname(m))
        FIELD("port", int_in(m, 1, 65535))
        FIELD("listen", listen_address(m))
        FIELD("timeout", number_in(m, 3, 1, 3600000))
        FIELD("mode", is_str(m) && (S_IS(m, "fast") || S_IS(m, "safe") || S_IS(m, "lazy") ||
                                    S_IS(m, "eco")))
        FIELD("workers", int_in(m, 1, 64) && (m->i & (m->i - 1)) == 0)
        FIELD("protocol", is_str(m) && (S_IS(m, "http") || S_IS(m, "h2c") || S_IS(m, "grpc") ||
                                        (https = S_IS(m, "https"))))
        FIELD("idle", duration(m, 1000, 3600000))
        FIELD("max_body", size(m, 1024))
        FIELD("tls", is_table(m) && check_tls(m, &tls))
        FIELD("route", tables(m, 8, route))
        return 0; /* an unknown key */
    }
    return !https || tls; /* https needs tls.enabled */
}

static int check_url(const struct node *nd, int *scheme)
{
    struct cur k = cursor(nd);
    if (!is_str(nd)) return 0;
    if (str_starts(&nd->s, "postgres://"))
        k.i = 11, *scheme = 1;
    else if (str_starts(&nd->s, "mysql://"))
        k.i = 8, *scheme = 2;
    else
        return 0;
    if (!domain(&k, 0)) return 0;
    if (cpeek(&k) == ':') {
        long long port;
        k.i++;
        if (!cnum(&k, 5, 1, 65535, &port)) return 0;
    }
    return k.i == k.len || cpeek(&k) == '/';
}

static int replicas(const struct node *a)
{
    long long total = 0, w;
    if (a->type != T_ARRAY || a->count > 4) return 0;
    MEMBERS(a) {
        int has_host = 0;
        const struct node *r = m;
        if (!is_table(r)) return 0;
        MEMBERS(r) {
            FIELD("host", (has_host = hostname(m)))
            FIELD("port", int_in(m, 1, 65535))
            FIELD("weight", num_scaled(m, 3, &w) && w > 0 && w <= 1000 && (total += w) <= 1000)
            return 0; /* an unknown key */
        }
        if (!has_host) return 0;
    }
    return 1;
}

static int check_database(const struct node *t)
{
    int scheme = 0, driver = 0;
    MEMBERS(t) {
        FIELD("url", check_url(m, &scheme))
        FIELD("driver", is_str(m) && ((S_IS(m, "postgres") && (driver = 1)) ||
                                      (S_IS(m, "mysql") && (driver = 2))))
        FIELD("pool", int_in(m, 1, 100))
        FIELD("ratio", number_in(m, 6, 0, 1000000))
        FIELD("timeout", duration(m, 1, 60000))
        FIELD("isolation", is_str(m) && (S_IS(m, "serializable") || S_IS(m, "snapshot") ||
                                         S_IS(m, "read-committed")))
        FIELD("replicas", replicas(m))
        return 0; /* an unknown key */
    }
    return !driver || !scheme || driver == scheme;
}

static int check_log(const struct node *t)
{
    int text = -1, colors = 0, file = 0, rotate = 0;
    MEMBERS(t) {
        FIELD("level", is_str(m) && (S_IS(m, "trace") || S_IS(m, "debug") || S_IS(m, "info") ||
                                     S_IS(m, "warn") || S_IS(m, "error") || S_IS(m, "fatal")))
        FIELD("file", (file = path(m, 2)))
        FIELD("keep", int_in(m, 0, 100))
        FIELD("format", is_str(m) && ((S_IS(m, "text") && (text = 1)) ||
                                      (S_IS(m, "json") && !(text = 0))))
        FIELD("colors", (colors = is_bool(m)))
        FIELD("rotate", (rotate = size(m, 1024)))
        FIELD("max_age", duration(m, 60000, 90LL * 86400000))
        return 0; /* an unknown key */
    }
    return (!colors || text == 1) && (!rotate || file);
}

/* -1, 0 or 1 as a is before, at or after b. */
static int dt_compare(const struct datetime *a, const struct datetime *b)
{
    const int x[7] = {a->year, a->month, a->day, a->hour, a->minute, a->second, a->nanos};
    const int y[7] = {b->year, b->month, b->day, b->hour, b->minute, b->second, b->nanos};
    for (int i = 0; i < 7; i++)
        if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
    return 0;
}

static int days(const struct node *a)
{
    int seen = 0;
    if (a->type != T_ARRAY || a->count == 0) return 0;
    MEMBERS(a) {
        struct cur k = cursor(m);
        int d = is_str(m) ? weekday(&k) : -1;
        if (d < 0 || k.i != k.len || (seen & (1 << d))) return 0;
        seen |= 1 << d;
    }
    return 1;
}

static int dates(const struct node *a)
{
    if (a->type != T_ARRAY || a->count > 8) return 0;
    MEMBERS(a)
        if (!is_dt(m, DT_DATE)) return 0;
    return 1;
}

static int check_schedule(const struct node *t)
{
    const struct node *start = NULL, *end = NULL;
    MEMBERS(t) {
        FIELD("start", is_dt(start = m, DT_LOCAL))
        FIELD("end", is_dt(end = m, DT_LOCAL))
        FIELD("days", days(m))
        FIELD("at", is_dt(m, DT_TIME) && m->dt.hour < 6)
        FIELD("holidays", dates(m))
        FIELD("cron", cron(m))
        return 0; /* an unknown key */
    }
    if ((start == NULL) != (end == NULL)) return 0;
    return !start || dt_compare(&start->dt, &end->dt) < 0;
}

static int check_backup(const struct node *t, int index)
{
    int has_path = 0;
    (void)index;
    if (!is_table(t)) return 0;
    MEMBERS(t) {
        FIELD("path", (has_path = path(m, 0)))
        FIELD("keep", int_in(m, 1, 30))
        FIELD("compress", is_bool(m) || (is_str(m) && (S_IS(m, "gzip") || S_IS(m, "zstd") ||
                                                       S_IS(m, "lz4") || S_IS(m, "xz") ||
                                                       S_IS(m, "none"))))
        FIELD("when", is_dt(m, DT_OFFSET))
        FIELD("every", duration(m, 60000, 7LL * 86400000))
        FIELD("cron", cron(m))
        FIELD("limit", size(m, 1048576))
        return 0; /* an unknown key */
    }
    return has_path;
}

static int plugin_name(const struct node *nd)
{
    if (!str_len(nd, 1, 16) || pool[nd->s.off] < 'a' || pool[nd->s.off] > 'z') return 0;
    for (int i = 1; i < nd->s.len; i++) {
        int c = pool[nd->s.off + i];
        if (c == '_' || c == '-') continue;
        if (!is_lower_alnum(c)) return 0;
    }
    return 1;
}

static const struct node *plugin_names[MAX_PLUGINS];

/* Each one a name of an earlier plugin. */
static int after(const struct node *a, int index)
{
    if (a->type != T_ARRAY) return 0;
    MEMBERS(a) {
        int p = 0;
        if (!is_str(m)) return 0;
        while (p < index && !str_same(&m->s, &plugin_names[p]->s)) p++;
        if (p == index) return 0;
    }
    return 1;
}

/* kind "http" needs a url, "exec" a command, "cron" a schedule, "mail" a recipient. */
static int check_plugin(const struct node *t, int index)
{
    const struct node *name = NULL;
    int kind = 0, needs = 0;
    if (!is_table(t)) return 0;
    MEMBERS(t) {
        FIELD("name", plugin_name(name = m))
        FIELD("enabled", is_bool(m))
        FIELD("priority", int_in(m, -100, 100))
        FIELD("after", after(m, index))
        FIELD("icon", is_str(m) && characters(&m->s) == 1)
        FIELD("options", scalars(m))
        FIELD("version", semver(m))
        FIELD("kind", is_str(m) && ((S_IS(m, "http") && (kind = 1)) ||
                                    (S_IS(m, "exec") && (kind = 2)) ||
                                    (S_IS(m, "cron") && (kind = 4)) ||
                                    (S_IS(m, "mail") && (kind = 8))))
        FIELD("url", is_str(m) && (str_starts(&m->s, "http://") ||
                                   str_starts(&m->s, "https://")) && (needs |= 1))
        FIELD("command", strings(m, 1, 8, 0) && path(&nodes[m->first], 0) && (needs |= 2))
        FIELD("schedule", cron(m) && (needs |= 4))
        FIELD("to", email(m) && (needs |= 8))
        return 0; /* an unknown key */
    }
    if (name == NULL || (kind && !(needs & kind)) || (needs & ~kind))
        return 0; /* no name, or settings of another kind */
    for (int p = 0; p < index; p++)
        if (str_same(&plugin_names[p]->s, &name->s)) return 0;
    plugin_names[index] = name;
    return 1;
}

static int check_root(const struct node *root)
{
    MEMBERS(root) {
        FIELD("title", str_len(m, 1, 64))
        FIELD("version", int_in(m, 1, 3))
        FIELD("created", is_dt(m, DT_OFFSET) && m->dt.year >= 2000)
        FIELD("env", is_str(m) && (S_IS(m, "dev") || S_IS(m, "test") || S_IS(m, "prod") ||
                                   S_IS(m, "stage")))
        FIELD("owner", is_table(m) && check_owner(m))
        FIELD("server", is_table(m) && check_server(m))
        FIELD("database", is_table(m) && check_database(m))
        FIELD("log", is_table(m) && check_log(m))
        FIELD("schedule", is_table(m) && check_schedule(m))
        FIELD("backup", tables(m, 4, check_backup))
        FIELD("plugin", tables(m, MAX_PLUGINS, check_plugin))
        return 0; /* an unknown key */
    }
    return 1;
}

/* ---- rendering -------------------------------------------------------------------- */

static void render_badge(struct badge *b, const struct str *icon)
{
    unsigned char glyph[8];
    memcpy(glyph, pool + icon->off, (size_t)icon->len);
    glyph[icon->len] = 0;
    memcpy(b->glyph, glyph, (size_t)icon->len + 1);
    if (b->guard != BADGE_GUARD) {
        fputs("toml: badge overrun\n", stderr);
        abort();
    }
}

static void render(const struct node *root)
{
    int nb = 0;
    for (int k = root->first; k >= 0; k = nodes[k].next) {
        if (!key_is(&nodes[k], "plugin")) continue;
        for (int p = nodes[k].first; p >= 0; p = nodes[p].next) {
            const struct node *icon = NULL;
            int enabled = 0;
            for (int f = nodes[p].first; f >= 0; f = nodes[f].next) {
                if (key_is(&nodes[f], "enabled"))
                    enabled = (int)nodes[f].i;
                else if (key_is(&nodes[f], "icon"))
                    icon = &nodes[f];
            }
            if (enabled && icon != NULL) render_badge(&badges[nb++], &icon->s);
        }
    }
}

int main(int argc, char **argv)
{
    static unsigned char buf[MAX_INPUT];
    in_len = (int)read_input(argc, argv, buf, sizeof buf);
    in = buf;
    for (int i = 0; i < MAX_PLUGINS; i++) badges[i].guard = BADGE_GUARD;
    int root = parse_document();
    if (root < 0) return BAD_SYNTAX;
    if (!check_root(&nodes[root])) return BAD_SCHEMA;
    render(&nodes[root]);
    return OK;
}
