/* A JSON parser with a schema check over the parsed tree, and one planted overrun.
 *
 * File: one JSON document (RFC 8259, at most 1024 bytes): objects and arrays nested at
 * most 8 deep, strings with the escapes \" \\ \/ \b \f \n \r \t and \uXXXX (a surrogate
 * pair makes one character; decoded to UTF-8; raw bytes >= 0x80 must be valid UTF-8 and
 * are not allowed in keys), numbers (sign, fraction, exponent, at most 15 significant
 * digits, parsed by hand into mantissa * 10^exponent), true, false, null.
 * Exit status: 0 the document parses and fits the schema, 1 it does not parse, 3 it
 * breaks the schema. Schema of the root object (every key optional, none twice in one
 * object, unknown keys rejected):
 *   "version" integer 1..3           "name"  non-empty string of at most 32 bytes
 *   "enabled" true or false          "ratio" number in [0, 1]
 *   "tags"    array of at most 8 distinct strings
 *   "limits"  object {"min": number, "max": number}, min <= max when both are given
 *   "items"   array of at most 8 objects, each with
 *       "id"    integer >= 0, required, distinct across items
 *       "kind"  "book", "food" or "tool"
 *       "price" number >= 0 with at most 2 decimals
 *       "qty"   integer 1..99, only together with "price"
 *       "x-NAME" extension keys (any value, NAME of 1..32 bytes): each gets a label
 *                whose initial is NAME's first character in UTF-8
 *
 * Planted bug: a label keeps its initial in initial[4], "3 bytes of UTF-8 and a NUL",
 * which holds any character of the Basic Multilingual Plane. A character beyond it takes
 * 4 bytes: written with its NUL it overruns into the integrity word that follows, and
 * abort() catches it. Keys are ASCII, so the only way there is a \uXXXX surrogate pair
 * (high D800-DBFF then low DC00-DFFF) right after "x-" in a key of an object that is an
 * element of the root's "items" array.
 */
#include <string.h>

#include "read_input.h"

#define MAX_INPUT 1024
#define MAX_DEPTH 8
#define MAX_NODES 256
#define POOL_SIZE 2048
#define MAX_ITEMS 8
#define MAX_SIG_DIGITS 15
#define LABEL_GUARD 0x6a50c0deu

enum { J_NULL, J_FALSE, J_TRUE, J_NUM, J_STR, J_ARR, J_OBJ };
enum { OK = 0, BAD_SYNTAX = 1, BAD_SCHEMA = 3 };

struct str {
    int off, len; /* decoded bytes in the pool */
};

struct node {
    int type;
    int first, next; /* children of an array or object, in order; -1 ends */
    int count;
    struct str key; /* when a member of an object */
    struct str s;
    long long mant; /* J_NUM: mant * 10^exp, mant without trailing zeros */
    int exp;
};

struct parser {
    const unsigned char *in;
    size_t n, pos;
    struct node nodes[MAX_NODES];
    int nnodes;
    unsigned char pool[POOL_SIZE];
    int pool_len;
};

struct label {
    unsigned char initial[4]; /* BUG: 3 bytes and a NUL, but UTF-8 goes up to 4 */
    unsigned int guard;       /* must still be LABEL_GUARD */
    unsigned char width;
};

struct checker {
    struct label labels[MAX_ITEMS];
    int nlabels;
    long long ids[MAX_ITEMS];
    int nids;
};

static struct parser P;
static struct checker C;

/* ---- parsing ---------------------------------------------------------------------- */

static void skip_ws(struct parser *p)
{
    while (p->pos < p->n) {
        unsigned char c = p->in[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

static int peek(const struct parser *p)
{
    return p->pos < p->n ? p->in[p->pos] : -1;
}

static int is_digit(int c)
{
    return c >= '0' && c <= '9';
}

static int new_node(struct parser *p, int type)
{
    if (p->nnodes >= MAX_NODES)
        return -1;
    struct node *nd = &p->nodes[p->nnodes];
    memset(nd, 0, sizeof *nd);
    nd->type = type;
    nd->first = nd->next = -1;
    return p->nnodes++;
}

static int emit(struct parser *p, unsigned int byte)
{
    if (p->pool_len >= POOL_SIZE)
        return -1;
    p->pool[p->pool_len++] = (unsigned char)byte;
    return 0;
}

static int emit_utf8(struct parser *p, unsigned int cp)
{
    if (cp < 0x80)
        return emit(p, cp);
    if (cp < 0x800)
        return emit(p, 0xc0 | (cp >> 6)) || emit(p, 0x80 | (cp & 0x3f));
    if (cp < 0x10000)
        return emit(p, 0xe0 | (cp >> 12)) || emit(p, 0x80 | ((cp >> 6) & 0x3f)) ||
               emit(p, 0x80 | (cp & 0x3f));
    return emit(p, 0xf0 | (cp >> 18)) || emit(p, 0x80 | ((cp >> 12) & 0x3f)) ||
           emit(p, 0x80 | ((cp >> 6) & 0x3f)) || emit(p, 0x80 | (cp & 0x3f));
}

static int hex4(struct parser *p, unsigned int *out)
{
    unsigned int v = 0;
    for (int i = 0; i < 4; i++) {
        if (p->pos >= p->n)
            return -1;
        unsigned char c = p->in[p->pos++];
        unsigned int d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return -1;
        v = (v << 4) | d;
    }
    *out = v;
    return 0;
}

/* After "\u": one character, or a surrogate pair "\uD8xx\uDCxx". */
static int unicode_escape(struct parser *p)
{
    unsigned int cp, lo;
    if (hex4(p, &cp) != 0)
        return -1;
    if (cp >= 0xd800 && cp <= 0xdbff) {
        if (p->pos + 2 > p->n || p->in[p->pos] != '\\' || p->in[p->pos + 1] != 'u')
            return -1; /* a high surrogate alone */
        p->pos += 2;
        if (hex4(p, &lo) != 0)
            return -1;
        if (lo < 0xdc00 || lo > 0xdfff)
            return -1;
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
    } else if (cp >= 0xdc00 && cp <= 0xdfff) {
        return -1; /* a low surrogate alone */
    }
    return emit_utf8(p, cp);
}

/* A raw UTF-8 sequence whose lead byte was just read: validated and copied as is. */
static int raw_utf8(struct parser *p, unsigned char lead)
{
    int extra;
    unsigned int cp;
    if ((lead & 0xe0) == 0xc0) {
        extra = 1;
        cp = lead & 0x1f;
    } else if ((lead & 0xf0) == 0xe0) {
        extra = 2;
        cp = lead & 0x0f;
    } else if ((lead & 0xf8) == 0xf0) {
        extra = 3;
        cp = lead & 0x07;
    } else {
        return -1;
    }
    if (emit(p, lead) != 0)
        return -1;
    for (int i = 0; i < extra; i++) {
        if (p->pos >= p->n)
            return -1;
        unsigned char c = p->in[p->pos++];
        if ((c & 0xc0) != 0x80)
            return -1;
        cp = (cp << 6) | (c & 0x3f);
        if (emit(p, c) != 0)
            return -1;
    }
    if ((extra == 1 && cp < 0x80) || (extra == 2 && cp < 0x800) ||
        (extra == 3 && (cp < 0x10000 || cp > 0x10ffff)))
        return -1; /* overlong or out of range */
    if (cp >= 0xd800 && cp <= 0xdfff)
        return -1;
    return 0;
}

/* After a backslash. */
static int escape(struct parser *p)
{
    if (p->pos >= p->n)
        return -1;
    switch (p->in[p->pos++]) {
    case '"': return emit(p, '"');
    case '\\': return emit(p, '\\');
    case '/': return emit(p, '/');
    case 'b': return emit(p, '\b');
    case 'f': return emit(p, '\f');
    case 'n': return emit(p, '\n');
    case 'r': return emit(p, '\r');
    case 't': return emit(p, '\t');
    case 'u': return unicode_escape(p);
    default: return -1;
    }
}

static int parse_string(struct parser *p, struct str *s, int is_key)
{
    p->pos++; /* the opening quote */
    s->off = p->pool_len;
    for (;;) {
        if (p->pos >= p->n)
            return -1;
        unsigned char c = p->in[p->pos++];
        if (c == '"')
            break;
        if (c < 0x20)
            return -1;
        if (c == '\\') {
            if (escape(p) != 0)
                return -1;
        } else if (c >= 0x80) {
            if (is_key)
                return -1; /* keys are ASCII; other characters must be escaped */
            if (raw_utf8(p, c) != 0)
                return -1;
        } else if (emit(p, c) != 0) {
            return -1;
        }
    }
    s->len = p->pool_len - s->off;
    return 0;
}

/* One digit into the mantissa; zeros are held back so that it has no trailing zeros. */
static int add_digit(long long *mant, int *zeros, int *sig, int d)
{
    if (d == 0) {
        if (*mant != 0)
            (*zeros)++;
        return 0;
    }
    for (; *zeros > 0; (*zeros)--, (*sig)++)
        *mant *= 10;
    *mant = *mant * 10 + d;
    (*sig)++;
    return *sig > MAX_SIG_DIGITS ? -1 : 0;
}

static int parse_number(struct parser *p, struct node *nd)
{
    long long mant = 0;
    int zeros = 0, sig = 0, frac = 0, exp = 0, neg = 0;
    if (peek(p) == '-') {
        neg = 1;
        p->pos++;
    }
    if (peek(p) == '0') {
        p->pos++;
        if (is_digit(peek(p)))
            return -1; /* leading zero */
    } else if (is_digit(peek(p))) {
        while (is_digit(peek(p)))
            if (add_digit(&mant, &zeros, &sig, p->in[p->pos++] - '0') != 0)
                return -1;
    } else {
        return -1;
    }
    if (peek(p) == '.') {
        p->pos++;
        if (!is_digit(peek(p)))
            return -1;
        while (is_digit(peek(p))) {
            if (add_digit(&mant, &zeros, &sig, p->in[p->pos++] - '0') != 0)
                return -1;
            frac++;
        }
    }
    if (peek(p) == 'e' || peek(p) == 'E') {
        int eneg = 0;
        p->pos++;
        if (peek(p) == '+' || peek(p) == '-')
            eneg = p->in[p->pos++] == '-';
        if (!is_digit(peek(p)))
            return -1;
        while (is_digit(peek(p))) {
            exp = exp * 10 + (p->in[p->pos++] - '0');
            if (exp > 999)
                return -1;
        }
        if (eneg)
            exp = -exp;
    }
    nd->mant = neg ? -mant : mant;
    nd->exp = mant == 0 ? 0 : exp + zeros - frac;
    return 0;
}

static int parse_value(struct parser *p, int depth);

/* Links `child` after the last child of `parent`. */
static void append(struct parser *p, int parent, int *last, int child)
{
    if (*last < 0)
        p->nodes[parent].first = child;
    else
        p->nodes[*last].next = child;
    *last = child;
    p->nodes[parent].count++;
}

static int parse_container(struct parser *p, int depth, int is_object)
{
    if (depth >= MAX_DEPTH)
        return -1;
    int self = new_node(p, is_object ? J_OBJ : J_ARR), last = -1;
    if (self < 0)
        return -1;
    p->pos++; /* '{' or '[' */
    skip_ws(p);
    if (peek(p) == (is_object ? '}' : ']')) {
        p->pos++;
        return self;
    }
    for (;;) {
        struct str key = {0, 0};
        skip_ws(p);
        if (is_object) {
            if (peek(p) != '"' || parse_string(p, &key, 1) != 0)
                return -1;
            skip_ws(p);
            if (peek(p) != ':')
                return -1;
            p->pos++;
        }
        int child = parse_value(p, depth + 1);
        if (child < 0)
            return -1;
        p->nodes[child].key = key;
        append(p, self, &last, child);
        skip_ws(p);
        int c = peek(p);
        p->pos++;
        if (c == ',')
            continue;
        if (c == (is_object ? '}' : ']'))
            return self;
        return -1;
    }
}

static int literal(struct parser *p, const char *word, int type)
{
    size_t i = 0;
    for (; word[i]; i++)
        if (p->pos + i >= p->n || p->in[p->pos + i] != (unsigned char)word[i])
            return -1;
    p->pos += i;
    return new_node(p, type);
}

static int parse_value(struct parser *p, int depth)
{
    skip_ws(p);
    int c = peek(p), self;
    switch (c) {
    case '{': return parse_container(p, depth, 1);
    case '[': return parse_container(p, depth, 0);
    case 't': return literal(p, "true", J_TRUE);
    case 'f': return literal(p, "false", J_FALSE);
    case 'n': return literal(p, "null", J_NULL);
    case '"':
        self = new_node(p, J_STR);
        if (self < 0 || parse_string(p, &p->nodes[self].s, 0) != 0)
            return -1;
        return self;
    default:
        if (c != '-' && !is_digit(c))
            return -1;
        self = new_node(p, J_NUM);
        if (self < 0 || parse_number(p, &p->nodes[self]) != 0)
            return -1;
        return self;
    }
}

/* ---- schema ----------------------------------------------------------------------- */

static int str_is(const struct str *s, const char *word)
{
    const unsigned char *c = P.pool + s->off, *end = c + s->len;
    for (; *word; word++, c++)
        if (c == end || *c != (unsigned char)*word)
            return 0;
    return c == end;
}

static int str_same(const struct str *a, const struct str *b)
{
    if (a->len != b->len)
        return 0;
    for (int i = 0; i < a->len; i++)
        if (P.pool[a->off + i] != P.pool[b->off + i])
            return 0;
    return 1;
}

/* The number times 10^scale as an exact integer within +-10^15; -1 when it is not one. */
static int num_scaled(const struct node *nd, int scale, long long *out)
{
    long long m = nd->mant;
    int e = nd->exp + scale;
    if (nd->type != J_NUM || (e < 0 && m != 0))
        return -1;
    for (; e > 0 && m != 0; e--) {
        if (m > 100000000000000LL || m < -100000000000000LL)
            return -1;
        m *= 10;
    }
    *out = m;
    return 0;
}

static int no_duplicate_keys(const struct node *obj)
{
    for (int a = obj->first; a >= 0; a = P.nodes[a].next)
        for (int b = P.nodes[a].next; b >= 0; b = P.nodes[b].next)
            if (str_same(&P.nodes[a].key, &P.nodes[b].key))
                return -1;
    return 0;
}

static void record_label(const struct str *key)
{
    const unsigned char *name = P.pool + key->off + 2;
    unsigned char initial[8];
    int width;
    if (C.nlabels >= MAX_ITEMS)
        return;
    if (name[0] < 0x80)
        width = 1;
    else if (name[0] < 0xe0)
        width = 2;
    else if (name[0] < 0xf0)
        width = 3;
    else
        width = 4;
    memcpy(initial, name, width);
    initial[width] = 0;
    struct label *label = &C.labels[C.nlabels++];
    memcpy(label->initial, initial, width + 1);
    label->width = (unsigned char)width;
    if (label->guard != LABEL_GUARD) {
        fputs("json: label overrun\n", stderr);
        abort();
    }
}

static int check_item(const struct node *item)
{
    int has_id = 0, has_price = 0, has_qty = 0;
    long long v;
    if (item->type != J_OBJ || no_duplicate_keys(item) != 0)
        return -1;
    for (int i = item->first; i >= 0; i = P.nodes[i].next) {
        const struct node *m = &P.nodes[i];
        if (str_is(&m->key, "id")) {
            if (num_scaled(m, 0, &v) != 0 || v < 0)
                return -1;
            for (int k = 0; k < C.nids; k++)
                if (C.ids[k] == v)
                    return -1;
            C.ids[C.nids++] = v;
            has_id = 1;
        } else if (str_is(&m->key, "kind")) {
            if (m->type != J_STR ||
                !(str_is(&m->s, "book") || str_is(&m->s, "food") || str_is(&m->s, "tool")))
                return -1;
        } else if (str_is(&m->key, "price")) {
            if (num_scaled(m, 2, &v) != 0 || v < 0)
                return -1;
            has_price = 1;
        } else if (str_is(&m->key, "qty")) {
            if (num_scaled(m, 0, &v) != 0 || v < 1 || v > 99)
                return -1;
            has_qty = 1;
        } else if (m->key.len >= 3 && P.pool[m->key.off] == 'x' &&
                   P.pool[m->key.off + 1] == '-') {
            if (m->key.len - 2 > 8 * 4)
                return -1;
            record_label(&m->key);
        } else {
            return -1;
        }
    }
    return has_id && (!has_qty || has_price) ? 0 : -1;
}

static int check_root(const struct node *root)
{
    long long v, min = 0, max = 0;
    if (root->type != J_OBJ || no_duplicate_keys(root) != 0)
        return -1;
    for (int i = root->first; i != -1; i = P.nodes[i].next) {
        const struct node *m = &P.nodes[i];
        if (str_is(&m->key, "version")) {
            if (num_scaled(m, 0, &v) != 0 || v < 1 || v > 3)
                return -1;
        } else if (str_is(&m->key, "name")) {
            if (m->type != J_STR || m->s.len == 0 || m->s.len > 32)
                return -1;
        } else if (str_is(&m->key, "enabled")) {
            if (m->type != J_TRUE && m->type != J_FALSE)
                return -1;
        } else if (str_is(&m->key, "ratio")) {
            if (num_scaled(m, 6, &v) != 0 || v < 0 || v > 1000000)
                return -1;
        } else if (str_is(&m->key, "tags")) {
            if (m->type != J_ARR || m->count > 8)
                return -1;
            for (int t = m->first; t >= 0; t = P.nodes[t].next) {
                if (P.nodes[t].type != J_STR)
                    return -1;
                for (int u = P.nodes[t].next; u >= 0; u = P.nodes[u].next)
                    if (str_same(&P.nodes[t].s, &P.nodes[u].s))
                        return -1;
            }
        } else if (str_is(&m->key, "limits")) {
            int has_min = 0, has_max = 0;
            if (m->type != J_OBJ || no_duplicate_keys(m) != 0)
                return -1;
            for (int k = m->first; k >= 0; k = P.nodes[k].next) {
                if (str_is(&P.nodes[k].key, "min") && num_scaled(&P.nodes[k], 3, &min) == 0)
                    has_min = 1;
                else if (str_is(&P.nodes[k].key, "max") &&
                         num_scaled(&P.nodes[k], 3, &max) == 0)
                    has_max = 1;
                else
                    return -1;
            }
            if (has_min && has_max && min > max)
                return -1;
        } else if (str_is(&m->key, "items")) {
            if (m->type != J_ARR || m->count > MAX_ITEMS)
                return -1;
            for (int k = m->first; k >= 0; k = P.nodes[k].next)
                if (check_item(&P.nodes[k]) != 0)
                    return -1;
        } else {
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    static unsigned char buf[MAX_INPUT];
    size_t n = read_input(argc, argv, buf, sizeof buf);

    memset(&C, 0, sizeof C);
    for (int i = 0; i < MAX_ITEMS; i++)
        C.labels[i].guard = LABEL_GUARD;
    P.in = buf;
    P.n = n;
    int root = parse_value(&P, 0);
    if (root < 0)
        return BAD_SYNTAX;
    skip_ws(&P);
    if (P.pos != P.n)
        return BAD_SYNTAX; /* trailing garbage */
    return check_root(&P.nodes[root]) == 0 ? OK : BAD_SCHEMA;
}
