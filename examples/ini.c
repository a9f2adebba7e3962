/* An INI/config parser with typed values, interpolation and a schema check, and one
 * planted overrun.
 *
 * File: at most 2048 bytes of lines (LF or CRLF). A line ending in a backslash continues
 * on the next one (whose leading blanks are dropped); a logical line holds at most 256
 * bytes. Blank lines and lines starting with ';' or '#' are comments.
 *   [name] or [name.sub] or [name.sub.sub]   section header (names of [A-Za-z0-9_-],
 *                                           1..32 bytes each; no section twice)
 *   key = value   or   key: value           an entry (key of [A-Za-z0-9_-], once per
 *                                           section); entries before any header belong
 *                                           to the global section ""
 * A value is one item or a list of up to 8 items separated by commas, then an optional
 * comment (';' or '#' at the start of an item or after a blank). An item is bare
 * (printable ASCII, trailing blanks trimmed) or quoted ("...", printable ASCII and the
 * escapes \n \t \\ \" \xHH \uXXXX, the last decoded to UTF-8, surrogates rejected).
 * In every item, "$$" is a '$' and "${sec.key}" (or "${key}" in the same section) is
 * replaced by the expanded value of that entry, which must be a single item: references
 * nest at most 4 deep and a cycle is an error; an expanded item holds at most 255 bytes.
 * Typed values are read by hand: integers (sign, 0x/0o/0b prefixes, '_' between digits),
 * decimals (sign, fraction, exponent), booleans (yes/no/on/off/true/false in any case),
 * durations (1h30m, 10s, 250ms: units d h m s ms in decreasing order), sizes (512, 4KiB,
 * 2MB, 1G: B K KB KiB M MB MiB G GB GiB).
 * Exit status: 0 parses and fits the schema, 1 does not parse (or a reference fails),
 * 3 breaks the schema. Schema (unknown sections or keys are rejected):
 *   ""           version integer 1..2, title string
 *   [server]     port integer 1..65535 (required), host string of 1..64 bytes without
 *                blanks, timeout duration 1ms..1h, keepalive boolean, max_body size up to
 *                64MiB, workers integer 1..64, aliases list of up to 4 distinct strings
 *   [server.tls] enabled boolean, cert and key strings (both required when enabled),
 *                min_version decimal 1.2 or 1.3; needs a [server] section
 *   [limits]     min and max decimals (3 decimals kept), min <= max when both are given,
 *                rate decimal in [0, 1], burst integer 0..max when max is given
 *   [log]        level debug/info/warn/error (any case), file string, rotate size of at
 *                least 1KiB (only with file), keep integer 0..100
 *   [user.NAME]  name string (required, distinct across all users), uid integer
 *                1000..65535 (distinct across users), admin boolean, groups list of up to
 *                4 distinct non-empty strings, quota size; at most 8 users
 *   [env]        keys of [A-Z0-9_] not starting with a digit, single items; each is
 *                exported as a C-style string, bytes outside 0x20..0x7e as \xHH
 *
 * Planted bug: an exported variable keeps its text in text[16] and is checked to fit as
 * "expanded length + 3 per non-printable byte of the literal value <= 15". The count of
 * non-printable bytes looks at the value as written, not at what interpolation pasted in:
 * a "${sec.key}" whose target expands to bytes outside 0x20..0x7e (which only a quoted
 * value's \n \t \xHH or \uXXXX escapes can make) writes 4 bytes for each, overruns into
 * the integrity word that follows text[], and abort() catches it. It takes an [env]
 * section whose entry references (after the earlier sections pass the schema) an entry
 * with a quoted value such as "/srv/\x01data" (len + 3 * count >= 16).
 */
#include <string.h>

#include "read_input.h"

#define MAX_INPUT 2048
#define MAX_LINE 256
#define MAX_NAME 32
#define MAX_SECTIONS 16
#define MAX_ENTRIES 64
#define MAX_ITEMS 160
#define MAX_LIST 8
#define POOL_SIZE 8192
#define MAX_EXPAND 255
#define MAX_REF_DEPTH 4
#define MAX_USERS 8
#define MAX_ENV 8
#define LIMIT 1000000000000000LL /* integers within +-10^15 */
#define ENV_GUARD 0x1e5c0deu

enum { OK = 0, BAD_SYNTAX = 1, BAD_SCHEMA = 3 };

struct str {
    int off, len; /* bytes in the pool */
};

struct section {
    struct str name;
};

struct item {
    struct str raw; /* decoded, not yet interpolated */
    struct str val; /* interpolated */
};

struct entry {
    int section;
    struct str key;
    int first, count; /* items[first .. first + count) */
    int state;        /* 0 not expanded, 1 being expanded, 2 expanded */
};

struct env_var {
    unsigned char text[16]; /* BUG: sized by a count that misses interpolated bytes */
    unsigned int guard;     /* must still be ENV_GUARD */
};

static const unsigned char *in;
static size_t in_len, pos;
static unsigned char line[MAX_LINE];
static int llen, lp;
static unsigned char pool[POOL_SIZE];
static int pool_len;
static struct section secs[MAX_SECTIONS];
static int nsecs;
static struct entry ents[MAX_ENTRIES];
static int nents;
static struct item items[MAX_ITEMS];
static int nitems;
static struct env_var envs[MAX_ENV];
static int nenvs;

/* ---- helpers ---------------------------------------------------------------------- */

/* Not inlined: the loops that call it would otherwise get trip counts computed with
 * llvm.smax/umin and freeze, which SymCC does not model (it concretizes them). */
static __attribute__((noinline)) int emit(unsigned int byte)
{
    if (pool_len >= POOL_SIZE)
        return -1;
    pool[pool_len++] = (unsigned char)byte;
    return 0;
}

static int is_digit(int c)
{
    return c >= '0' && c <= '9';
}

static __attribute__((noinline)) int is_name_char(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_' ||
           c == '-';
}

static int is_blank(int c)
{
    return c == ' ' || c == '\t';
}

static int printable(unsigned int c)
{
    return c >= 0x20 && c <= 0x7e;
}

static int lower(int c)
{
    if (c >= 'A' && c <= 'Z')
        return c + ('a' - 'A');
    return c;
}

/* Inlined with the constant word: each character of each keyword is its own branch, so
 * that matching one more character is new coverage (a loop would only raise a hit count). */
static inline __attribute__((always_inline)) int str_is_n(const struct str *s, const char *word, int n)
{
    if (s->len != n)
        return 0;
    for (int i = 0; i < n; i++)
        if (pool[s->off + i] != (unsigned char)word[i])
            return 0;
    return 1;
}

#define str_is(s, word) str_is_n(s, word, (int)sizeof(word) - 1)

/* Case-insensitive comparison with a lowercase word. */
static inline __attribute__((always_inline)) int str_is_nocase_n(const struct str *s,
                                                                 const char *word, int n)
{
    if (s->len != n)
        return 0;
    for (int i = 0; i < n; i++)
        if (lower(pool[s->off + i]) != (unsigned char)word[i])
            return 0;
    return 1;
}

#define str_is_nocase(s, word) str_is_nocase_n(s, word, (int)sizeof(word) - 1)

static __attribute__((noinline)) int str_starts(const struct str *s, const char *word, struct str *rest)
{
    const unsigned char *c = pool + s->off, *end = c + s->len;
    for (; *word; word++, c++)
        if (c == end || *c != (unsigned char)*word)
            return 0;
    rest->off = (int)(c - pool);
    rest->len = (int)(end - c);
    return 1;
}

static int str_same(const struct str *a, const struct str *b)
{
    if (a->len != b->len)
        return 0;
    for (int i = 0; i < a->len; i++)
        if (pool[a->off + i] != pool[b->off + i])
            return 0;
    return 1;
}

/* ---- lines ------------------------------------------------------------------------ */

/* The next logical line into line[]: 1, or 0 at the end of the input, -1 too long. */
static int next_line(void)
{
    if (pos >= in_len)
        return 0;
    llen = 0;
    for (;;) {
        size_t start = pos, end;
        while (pos < in_len && in[pos] != '\n')
            pos++;
        end = pos;
        if (pos < in_len)
            pos++;
        if (end > start && in[end - 1] == '\r')
            end--;
        int cont = 0;
        if (end > start && in[end - 1] == '\\') {
            cont = 1;
            end--;
        }
        if (end - start > (size_t)(MAX_LINE - llen))
            return -1;
        memcpy(line + llen, in + start, end - start);
        llen += (int)(end - start);
        if (!cont || pos >= in_len)
            return 1;
        while (pos < in_len && is_blank(in[pos]))
            pos++;
    }
}

static __attribute__((noinline)) int lpeek(void)
{
    return lp < llen ? line[lp] : -1;
}

static void lskip_blank(void)
{
    while (lp < llen && is_blank(line[lp]))
        lp++;
}

static int at_end_or_comment(void)
{
    lskip_blank();
    switch (lpeek()) {
    case -1:
    case ';':
    case '#':
        return 1;
    default:
        return 0;
    }
}

/* ---- syntax ----------------------------------------------------------------------- */

static int parse_header(void)
{
    struct section *s;
    int parts = 0;
    if (nsecs >= MAX_SECTIONS)
        return -1;
    s = &secs[nsecs];
    lp++; /* '[' */
    lskip_blank();
    s->name.off = pool_len;
    for (;;) {
        int len = 0;
        while (is_name_char(lpeek())) {
            if (emit(line[lp++]) != 0)
                return -1;
            len++;
        }
        if (len == 0 || len > MAX_NAME)
            return -1;
        if (lpeek() != '.')
            break;
        if (++parts > 2)
            return -1;
        lp++;
        if (emit('.') != 0)
            return -1;
    }
    s->name.len = pool_len - s->name.off;
    lskip_blank();
    if (lpeek() != ']')
        return -1;
    lp++;
    if (!at_end_or_comment())
        return -1;
    for (int i = 0; i < nsecs; i++)
        if (str_same(&secs[i].name, &s->name))
            return -1;
    nsecs++;
    return 0;
}

static int hex_digit(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int hex_escape(int digits, unsigned int *out)
{
    unsigned int v = 0;
    for (int i = 0; i < digits; i++) {
        int d = hex_digit(lpeek());
        if (d < 0)
            return -1;
        lp++;
        v = (v << 4) | (unsigned int)d;
    }
    *out = v;
    return 0;
}

static int emit_utf8(unsigned int cp)
{
    if (cp < 0x80)
        return emit(cp);
    if (cp < 0x800)
        return emit(0xc0 | (cp >> 6)) || emit(0x80 | (cp & 0x3f));
    return emit(0xe0 | (cp >> 12)) || emit(0x80 | ((cp >> 6) & 0x3f)) ||
           emit(0x80 | (cp & 0x3f));
}

static int parse_quoted(void)
{
    unsigned int v;
    lp++; /* the opening quote */
    for (;;) {
        int c = lpeek();
        if (c < 0)
            return -1;
        lp++;
        if (c == '"')
            return 0;
        if (!printable((unsigned int)c))
            return -1;
        if (c != '\\') {
            if (emit((unsigned int)c) != 0)
                return -1;
            continue;
        }
        c = lpeek();
        lp++;
        switch (c) {
        case 'n': v = '\n'; break;
        case 't': v = '\t'; break;
        case '\\': v = '\\'; break;
        case '"': v = '"'; break;
        case 'x':
            if (hex_escape(2, &v) != 0)
                return -1;
            break;
        case 'u':
            if (hex_escape(4, &v) != 0 || (v >= 0xd800 && v <= 0xdfff))
                return -1;
            if (emit_utf8(v) != 0)
                return -1;
            continue;
        default:
            return -1;
        }
        if (emit(v) != 0)
            return -1;
    }
}

static int parse_bare(void)
{
    int start = pool_len;
    for (;;) {
        int c = lpeek();
        if (c < 0 || c == ',')
            break;
        if ((c == ';' || c == '#') &&
            (pool_len == start || is_blank(pool[pool_len - 1])))
            break; /* a comment */
        if (c != ' ' && !printable((unsigned int)c))
            return -1;
        if (emit((unsigned int)c) != 0)
            return -1;
        lp++;
    }
    while (pool_len > start && pool[pool_len - 1] == ' ')
        pool_len--;
    return 0;
}

static int parse_entry(void)
{
    struct entry *e;
    if (nents >= MAX_ENTRIES)
        return -1;
    e = &ents[nents];
    e->section = nsecs - 1;
    e->state = 0;
    e->key.off = pool_len;
    while (is_name_char(lpeek()))
        if (emit(line[lp++]) != 0)
            return -1;
    e->key.len = pool_len - e->key.off;
    if (e->key.len == 0 || e->key.len > MAX_NAME)
        return -1;
    for (int i = 0; i < nents; i++)
        if (ents[i].section == e->section && str_same(&ents[i].key, &e->key))
            return -1;
    lskip_blank();
    if (lpeek() != '=' && lpeek() != ':')
        return -1;
    lp++;
    lskip_blank();
    e->first = nitems;
    e->count = 0;
    for (;;) {
        struct item *it;
        if (nitems >= MAX_ITEMS || e->count >= MAX_LIST)
            return -1;
        it = &items[nitems++];
        e->count++;
        it->raw.off = pool_len;
        if (lpeek() == '"') {
            if (parse_quoted() != 0)
                return -1;
        } else if (parse_bare() != 0) {
            return -1;
        }
        it->raw.len = pool_len - it->raw.off;
        lskip_blank();
        if (lpeek() != ',')
            break;
        lp++;
        lskip_blank();
    }
    if (!at_end_or_comment())
        return -1;
    nents++;
    return 0;
}

static int parse_file(void)
{
    int r;
    /* the global section */
    secs[0].name.off = pool_len;
    secs[0].name.len = 0;
    nsecs = 1;
    while ((r = next_line()) > 0) {
        lp = 0;
        if (at_end_or_comment())
            continue;
        if (lpeek() == '[') {
            if (parse_header() != 0)
                return -1;
        } else if (parse_entry() != 0) {
            return -1;
        }
    }
    return r;
}

/* ---- interpolation ---------------------------------------------------------------- */

static int expand_entry(int e, int depth);

/* The entry named by ref ("sec.key", or "key" in section `sec`); -1 when none. */
static int find_ref(int sec, const unsigned char *ref, int len)
{
    int dot = -1;
    for (int i = 0; i < len; i++)
        if (ref[i] == '.')
            dot = i;
    const unsigned char *key = ref + dot + 1;
    int klen = len - dot - 1;
    if (dot >= 0) {
        sec = -1;
        for (int s = 0; s < nsecs; s++) {
            if (secs[s].name.len != dot)
                continue;
            int i = 0;
            while (i < dot && pool[secs[s].name.off + i] == ref[i])
                i++;
            if (i == dot) {
                sec = s;
                break;
            }
        }
        if (sec < 0)
            return -1;
    }
    for (int e = 0; e < nents; e++) {
        if (ents[e].section != sec || ents[e].key.len != klen)
            continue;
        int i = 0;
        while (i < klen && pool[ents[e].key.off + i] == key[i])
            i++;
        if (i == klen)
            return e;
    }
    return -1;
}

static int expand_item(int sec, struct item *it, int depth)
{
    unsigned char out[MAX_EXPAND];
    int w = 0;
    for (int i = 0; i < it->raw.len;) {
        const unsigned char *c = pool + it->raw.off + i;
        int rest = it->raw.len - i;
        if (c[0] == '$' && rest >= 2 && c[1] == '$') {
            if (w >= MAX_EXPAND)
                return -1;
            out[w++] = '$';
            i += 2;
        } else if (c[0] == '$' && rest >= 2 && c[1] == '{') {
            int len = 0;
            while (len + 2 < rest && c[len + 2] != '}')
                len++;
            if (len + 2 >= rest || len == 0)
                return -1; /* unterminated or empty */
            int target = find_ref(sec, c + 2, len);
            if (target < 0 || ents[target].count != 1)
                return -1;
            if (expand_entry(target, depth + 1) != 0)
                return -1;
            const struct str *v = &items[ents[target].first].val;
            if (w + v->len > MAX_EXPAND)
                return -1;
            memcpy(out + w, pool + v->off, (size_t)v->len);
            w += v->len;
            i += len + 3;
        } else {
            if (w >= MAX_EXPAND)
                return -1;
            out[w++] = c[0];
            i++;
        }
    }
    if (w > POOL_SIZE - pool_len)
        return -1;
    it->val.off = pool_len;
    it->val.len = w;
    memcpy(pool + pool_len, out, (size_t)w);
    pool_len += w;
    return 0;
}

static int expand_entry(int e, int depth)
{
    struct entry *en = &ents[e];
    if (en->state == 2)
        return 0;
    if (en->state == 1 || depth > MAX_REF_DEPTH)
        return -1; /* a cycle, or too deep */
    en->state = 1;
    for (int i = 0; i < en->count; i++)
        if (expand_item(en->section, &items[en->first + i], depth) != 0)
            return -1;
    en->state = 2;
    return 0;
}

/* ---- typed values ----------------------------------------------------------------- */

/* Digits in base `base`, '_' allowed between two of them; at least one. */
static int digits(const unsigned char *c, int len, int *i, int base, long long *out)
{
    long long v = 0;
    int n = 0;
    while (*i < len) {
        int d = hex_digit(c[*i]);
        if (c[*i] == '_' && n > 0 && *i + 1 < len && c[*i + 1] != '_') {
            (*i)++;
            continue;
        }
        if (d < 0 || d >= base)
            break;
        v = v * base + d;
        if (v > LIMIT)
            return -1;
        n++;
        (*i)++;
    }
    if (n == 0 || c[*i - 1] == '_')
        return -1;
    *out = v;
    return 0;
}

static int as_int(const struct str *s, long long *out)
{
    const unsigned char *c = pool + s->off;
    int i = 0, neg = 0, base = 10;
    long long v;
    if (s->len > 0 && (c[0] == '+' || c[0] == '-')) {
        neg = c[0] == '-';
        i++;
    }
    if (i + 1 < s->len && c[i] == '0') {
        int p = lower(c[i + 1]);
        if (p == 'x')
            base = 16;
        else if (p == 'o')
            base = 8;
        else if (p == 'b')
            base = 2;
        if (base != 10)
            i += 2;
    }
    if (digits(c, s->len, &i, base, &v) != 0 || i != s->len)
        return -1;
    *out = neg ? -v : v;
    return 0;
}

/* A decimal times 10^scale, as an exact integer within +-10^15. */
static int as_decimal(const struct str *s, int scale, long long *out)
{
    const unsigned char *c = pool + s->off;
    int i = 0, neg = 0, frac = 0, exp = 0, n = 0;
    long long mant = 0;
    if (s->len > 0 && (c[0] == '+' || c[0] == '-')) {
        neg = c[0] == '-';
        i++;
    }
    for (; i < s->len && is_digit(c[i]); i++, n++) {
        mant = mant * 10 + (c[i] - '0');
        if (mant > LIMIT)
            return -1;
    }
    if (i < s->len && c[i] == '.') {
        i++;
        for (; i < s->len && is_digit(c[i]); i++, n++, frac++) {
            mant = mant * 10 + (c[i] - '0');
            if (mant > LIMIT)
                return -1;
        }
    }
    if (n == 0)
        return -1;
    if (i < s->len && lower(c[i]) == 'e') {
        int eneg = 0, en = 0;
        i++;
        if (i < s->len && (c[i] == '+' || c[i] == '-')) {
            eneg = c[i] == '-';
            i++;
        }
        for (; i < s->len && is_digit(c[i]); i++, en++) {
            exp = exp * 10 + (c[i] - '0');
            if (exp > 99)
                return -1;
        }
        if (en == 0)
            return -1;
        if (eneg)
            exp = -exp;
    }
    if (i != s->len)
        return -1;
    int e = exp - frac + scale;
    for (; e > 0; e--) {
        if (mant > LIMIT / 10)
            return -1;
        mant *= 10;
    }
    for (; e < 0; e++) {
        if (mant % 10 != 0)
            return -1; /* more decimals than kept */
        mant /= 10;
    }
    *out = neg ? -mant : mant;
    return 0;
}

static int as_bool(const struct str *s, int *out)
{
    if (str_is_nocase(s, "yes") || str_is_nocase(s, "on") || str_is_nocase(s, "true")) {
        *out = 1;
        return 0;
    }
    if (str_is_nocase(s, "no") || str_is_nocase(s, "off") || str_is_nocase(s, "false")) {
        *out = 0;
        return 0;
    }
    return -1;
}

/* In milliseconds. */
static int as_duration(const struct str *s, long long *out)
{
    const unsigned char *c = pool + s->off;
    int i = 0, last = 5; /* units: 4 d, 3 h, 2 m, 1 s, 0 ms */
    long long total = 0, v;
    static const long long ms[] = {1, 1000, 60000, 3600000, 86400000};
    if (s->len == 0)
        return -1;
    while (i < s->len) {
        int unit;
        if (digits(c, s->len, &i, 10, &v) != 0 || v > 100000 || i >= s->len)
            return -1;
        switch (c[i]) {
        case 'd': unit = 4; break;
        case 'h': unit = 3; break;
        case 'm':
            if (i + 1 < s->len && c[i + 1] == 's') {
                unit = 0;
                i++;
            } else {
                unit = 2;
            }
            break;
        case 's': unit = 1; break;
        default: return -1;
        }
        i++;
        if (unit >= last)
            return -1; /* units in decreasing order, each once */
        last = unit;
        total += v * ms[unit];
    }
    *out = total;
    return 0;
}

/* In bytes. */
static int as_size(const struct str *s, long long *out)
{
    const unsigned char *c = pool + s->off;
    int i = 0;
    long long v, mult = 1;
    if (digits(c, s->len, &i, 10, &v) != 0 || v > 1000000)
        return -1;
    if (i < s->len && c[i] == ' ')
        i++;
    if (i < s->len) {
        int p = c[i++];
        if (p == 'K')
            mult = 1024;
        else if (p == 'M')
            mult = 1024 * 1024;
        else if (p == 'G')
            mult = 1024 * 1024 * 1024;
        else if (p != 'B')
            return -1;
        if (p != 'B' && i < s->len) {
            if (c[i] == 'B') {
                /* KB MB GB: decimal */
                mult = p == 'K' ? 1000 : p == 'M' ? 1000000 : 1000000000;
                i++;
            } else if (c[i] == 'i' && i + 1 < s->len && c[i + 1] == 'B') {
                i += 2;
            } else {
                return -1;
            }
        }
    }
    if (i != s->len)
        return -1;
    *out = v * mult;
    return 0;
}

/* ---- schema ----------------------------------------------------------------------- */

static const struct str *value(const struct entry *e)
{
    return &items[e->first].val;
}

static int single(const struct entry *e)
{
    return e->count == 1;
}

static int int_in(const struct entry *e, long long lo, long long hi, long long *out)
{
    long long v;
    if (!single(e) || as_int(value(e), &v) != 0 || v < lo || v > hi)
        return -1;
    if (out)
        *out = v;
    return 0;
}

static int distinct_list(const struct entry *e, int max)
{
    if (e->count > max)
        return -1;
    for (int a = 0; a < e->count; a++) {
        if (items[e->first + a].val.len == 0)
            return -1;
        for (int b = a + 1; b < e->count; b++)
            if (str_same(&items[e->first + a].val, &items[e->first + b].val))
                return -1;
    }
    return 0;
}

static int check_global(int s)
{
    for (int k = 0; k < nents; k++) {
        const struct entry *e = &ents[k];
        if (e->section != s)
            continue;
        if (str_is(&e->key, "version")) {
            if (int_in(e, 1, 2, NULL) != 0)
                return -1;
        } else if (str_is(&e->key, "title")) {
            if (!single(e))
                return -1;
        } else {
            return -1;
        }
    }
    return 0;
}

static int check_server(int s)
{
    int has_port = 0, b;
    long long v;
    for (int k = 0; k < nents; k++) {
        const struct entry *e = &ents[k];
        if (e->section != s)
            continue;
        if (str_is(&e->key, "port")) {
            if (int_in(e, 1, 65535, NULL) != 0)
                return -1;
            has_port = 1;
        } else if (str_is(&e->key, "host")) {
            const struct str *h = value(e);
            if (!single(e) || h->len == 0 || h->len > 64)
                return -1;
            for (int i = 0; i < h->len; i++)
                if (!printable(pool[h->off + i]) || pool[h->off + i] == ' ')
                    return -1;
        } else if (str_is(&e->key, "timeout")) {
            if (!single(e) || as_duration(value(e), &v) != 0 || v < 1 || v > 3600000)
                return -1;
        } else if (str_is(&e->key, "keepalive")) {
            if (!single(e) || as_bool(value(e), &b) != 0)
                return -1;
        } else if (str_is(&e->key, "max_body")) {
            if (!single(e) || as_size(value(e), &v) != 0 || v > 64LL * 1024 * 1024)
                return -1;
        } else if (str_is(&e->key, "workers")) {
            if (int_in(e, 1, 64, NULL) != 0)
                return -1;
        } else if (str_is(&e->key, "aliases")) {
            if (distinct_list(e, 4) != 0)
                return -1;
        } else {
            return -1;
        }
    }
    return has_port ? 0 : -1;
}

static int check_tls(int s)
{
    int enabled = 0, has_cert = 0, has_key = 0, has_server = 0;
    long long v;
    for (int i = 0; i < nsecs; i++)
        if (str_is(&secs[i].name, "server"))
            has_server = 1;
    if (!has_server)
        return -1;
    for (int k = 0; k < nents; k++) {
        const struct entry *e = &ents[k];
        if (e->section != s)
            continue;
        if (str_is(&e->key, "enabled")) {
            if (!single(e) || as_bool(value(e), &enabled) != 0)
                return -1;
        } else if (str_is(&e->key, "cert")) {
            if (!single(e) || value(e)->len == 0)
                return -1;
            has_cert = 1;
        } else if (str_is(&e->key, "key")) {
            if (!single(e) || value(e)->len == 0)
                return -1;
            has_key = 1;
        } else if (str_is(&e->key, "min_version")) {
            if (!single(e) || as_decimal(value(e), 1, &v) != 0 || (v != 12 && v != 13))
                return -1;
        } else {
            return -1;
        }
    }
    if (enabled && !(has_cert && has_key))
        return -1;
    return 0;
}

static int check_limits(int s)
{
    long long min = 0, max = 0, burst = 0, v;
    int has_min = 0, has_max = 0, has_burst = 0;
    for (int k = 0; k < nents; k++) {
        const struct entry *e = &ents[k];
        if (e->section != s)
            continue;
        if (str_is(&e->key, "min")) {
            if (!single(e) || as_decimal(value(e), 3, &min) != 0)
                return -1;
            has_min = 1;
        } else if (str_is(&e->key, "max")) {
            if (!single(e) || as_decimal(value(e), 3, &max) != 0)
                return -1;
            has_max = 1;
        } else if (str_is(&e->key, "rate")) {
            if (!single(e) || as_decimal(value(e), 6, &v) != 0 || v < 0 || v > 1000000)
                return -1;
        } else if (str_is(&e->key, "burst")) {
            if (int_in(e, 0, LIMIT, &burst) != 0)
                return -1;
            has_burst = 1;
        } else {
            return -1;
        }
    }
    if (has_min && has_max && min > max)
        return -1;
    if (has_burst && has_max && burst * 1000 > max)
        return -1;
    return 0;
}

static int check_log(int s)
{
    int has_file = 0, has_rotate = 0;
    long long v;
    for (int k = 0; k < nents; k++) {
        const struct entry *e = &ents[k];
        if (e->section != s)
            continue;
        if (str_is(&e->key, "level")) {
            const struct str *l = value(e);
            if (!single(e) || !(str_is_nocase(l, "debug") || str_is_nocase(l, "info") ||
                                str_is_nocase(l, "warn") || str_is_nocase(l, "error")))
                return -1;
        } else if (str_is(&e->key, "file")) {
            if (!single(e) || value(e)->len == 0)
                return -1;
            has_file = 1;
        } else if (str_is(&e->key, "rotate")) {
            if (!single(e) || as_size(value(e), &v) != 0 || v < 1024)
                return -1;
            has_rotate = 1;
        } else if (str_is(&e->key, "keep")) {
            if (int_in(e, 0, 100, NULL) != 0)
                return -1;
        } else {
            return -1;
        }
    }
    return has_rotate && !has_file ? -1 : 0;
}

struct user {
    struct str name;
    long long uid;
};

static struct user users[MAX_USERS];
static int nusers;

static int check_user(int s)
{
    struct user *u;
    int has_name = 0, b;
    long long v;
    if (nusers >= MAX_USERS)
        return -1;
    u = &users[nusers];
    u->uid = -1;
    for (int k = 0; k < nents; k++) {
        const struct entry *e = &ents[k];
        if (e->section != s)
            continue;
        if (str_is(&e->key, "name")) {
            if (!single(e) || value(e)->len == 0)
                return -1;
            u->name = *value(e);
            has_name = 1;
        } else if (str_is(&e->key, "uid")) {
            if (int_in(e, 1000, 65535, &u->uid) != 0)
                return -1;
        } else if (str_is(&e->key, "admin")) {
            if (!single(e) || as_bool(value(e), &b) != 0)
                return -1;
        } else if (str_is(&e->key, "groups")) {
            if (distinct_list(e, 4) != 0)
                return -1;
        } else if (str_is(&e->key, "quota")) {
            if (!single(e) || as_size(value(e), &v) != 0)
                return -1;
        } else {
            return -1;
        }
    }
    if (!has_name)
        return -1;
    for (int i = 0; i < nusers; i++)
        if (str_same(&users[i].name, &u->name) || (u->uid >= 0 && users[i].uid == u->uid))
            return -1;
    nusers++;
    return 0;
}

static int export_env(const struct entry *e)
{
    const struct item *it = &items[e->first];
    unsigned char tmp[4 * MAX_EXPAND + 1];
    int unprintable = 0, w = 0;
    struct env_var *ev;
    if (nenvs >= MAX_ENV)
        return -1;
    /* BUG: counts the value as written, not the text that interpolation pasted in */
    for (int i = 0; i < it->raw.len; i++)
        if (!printable(pool[it->raw.off + i]))
            unprintable++;
    if (it->val.len + 3 * unprintable > 15)
        return -1;
    for (int i = 0; i < it->val.len; i++) {
        unsigned int c = pool[it->val.off + i];
        if (printable(c)) {
            tmp[w++] = (unsigned char)c;
        } else {
            tmp[w++] = '\\';
            tmp[w++] = 'x';
            tmp[w++] = (unsigned char)"0123456789abcdef"[c >> 4];
            tmp[w++] = (unsigned char)"0123456789abcdef"[c & 15];
        }
    }
    tmp[w] = 0;
    ev = &envs[nenvs++];
    memcpy(ev->text, tmp, (size_t)w + 1);
    if (ev->guard != ENV_GUARD) {
        fputs("ini: env overrun\n", stderr);
        abort();
    }
    return 0;
}

static int check_env(int s)
{
    for (int k = 0; k < nents; k++) {
        const struct entry *e = &ents[k];
        if (e->section != s)
            continue;
        if (is_digit(pool[e->key.off]))
            return -1;
        for (int i = 0; i < e->key.len; i++) {
            int c = pool[e->key.off + i];
            if (!((c >= 'A' && c <= 'Z') || is_digit(c) || c == '_'))
                return -1;
        }
        if (!single(e) || export_env(e) != 0)
            return -1;
    }
    return 0;
}

static int check(void)
{
    struct str rest;
    for (int s = 0; s < nsecs; s++) {
        const struct str *name = &secs[s].name;
        int r;
        if (name->len == 0)
            r = check_global(s);
        else if (str_is(name, "server"))
            r = check_server(s);
        else if (str_is(name, "server.tls"))
            r = check_tls(s);
        else if (str_is(name, "limits"))
            r = check_limits(s);
        else if (str_is(name, "log"))
            r = check_log(s);
        else if (str_is(name, "env"))
            r = check_env(s);
        else if (str_starts(name, "user.", &rest) && rest.len > 0)
            r = check_user(s);
        else
            r = -1;
        if (r != 0)
            return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static unsigned char buf[MAX_INPUT];
    in_len = read_input(argc, argv, buf, sizeof buf);
    in = buf;
    for (int i = 0; i < MAX_ENV; i++)
        envs[i].guard = ENV_GUARD;
    if (parse_file() != 0)
        return BAD_SYNTAX;
    for (int e = 0; e < nents; e++)
        if (expand_entry(e, 0) != 0)
            return BAD_SYNTAX;
    return check() == 0 ? OK : BAD_SCHEMA;
}
