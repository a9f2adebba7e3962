/* A small TLV parser with a copy-paste bounds-check bug in one record type.
 *
 * File: "TLV" version(=1) then records type(u8) len(u8) value[len]; type 0 ends.
 *   1 NAME  (len <= 32)  copied into name[32]
 *   2 COUNT (len == 4)   little-endian u32, at most 1000
 *   3 NOTE               copied into note[16], but its length is checked
 *                        against sizeof name: len 17..32 overruns into the
 *                        integrity word that follows note, caught by abort(). */
#include <string.h>

#include "read_input.h"

#define STATE_MAGIC 0x5a17e5u

enum { T_END = 0, T_NAME = 1, T_COUNT = 2, T_NOTE = 3 };

struct state {
    char name[32];
    char note[16];
    unsigned int magic; /* must still be STATE_MAGIC after parsing */
    unsigned int count;
    int records;
};

static int parse_record(struct state *st, unsigned type, const unsigned char *val, size_t len)
{
    if (type == T_NAME) {
        if (len > sizeof st->name)
            return -1;
        memcpy(st->name, val, len);
    } else if (type == T_COUNT) {
        if (len != 4)
            return -1;
        unsigned int c = val[0] | (val[1] << 8) | (val[2] << 16) | ((unsigned int)val[3] << 24);
        if (c > 1000)
            return -1;
        st->count = c;
    } else if (type == T_NOTE) {
        if (len > sizeof st->name) /* BUG: should be sizeof st->note */
            return -1;
        memcpy(st->note, val, len);
    } else {
        return -1;
    }
    st->records++;
    return 0;
}

static int parse(struct state *st, const unsigned char *buf, size_t n)
{
    if (n < 4 || buf[0] != 'T' || buf[1] != 'L' || buf[2] != 'V')
        return -1;
    if (buf[3] != 1)
        return -1;
    size_t pos = 4;
    while (pos + 2 <= n) {
        unsigned type = buf[pos];
        size_t len = buf[pos + 1];
        pos += 2;
        if (type == T_END)
            return 0;
        if (len > n - pos)
            return -1;
        if (parse_record(st, type, buf + pos, len) != 0)
            return -1;
        pos += len;
    }
    return -1; /* no END record */
}

int main(int argc, char **argv)
{
    unsigned char buf[512];
    size_t n = read_input(argc, argv, buf, sizeof buf);
    struct state st;

    memset(&st, 0, sizeof st);
    st.magic = STATE_MAGIC;
    int rc = parse(&st, buf, n);
    if (st.magic != STATE_MAGIC) {
        fputs("tlv: state corrupted\n", stderr);
        abort();
    }
    return rc == 0 ? 0 : 1;
}
