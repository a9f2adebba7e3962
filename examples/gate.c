/* Planted bug behind a 32-bit magic number, for hybrid campaigns beside AFL++.
 *
 * Input: "GT" then a little-endian u32 key then commands, one byte each.
 * Commands are counted by a chain of byte comparisons that a fuzzer explores well.
 * With the right key (0x6b1d3c5a, no value a fuzzer tries on its own: 1 in 2^32 by
 * mutation) a second command set opens, and its 'Z' command followed by a byte above
 * 0xf0 writes through a NULL pointer. Concolic execution solves the key in one step;
 * the commands behind it are byte comparisons again, which the fuzzers take from there.
 * Comparisons are if-chains, not a switch: no jump table for the Triton executor. */
#include <stdint.h>

#include "read_input.h"

#define KEY 0x6b1d3c5au

static int open_command(unsigned char c)
{
    if (c == 'a') return 1;
    if (c == 'b') return 2;
    if (c == 'c') return 3;
    if (c == 'd') return 4;
    if (c == 'e') return 5;
    if (c == 'f') return 6;
    if (c == 'g') return 7;
    if (c == 'h') return 8;
    return 0;
}

static int locked_command(const unsigned char *p, size_t left)
{
    unsigned char c = p[0];
    if (c == 'P') return 11;
    if (c == 'Q') return 12;
    if (c == 'R') return 13;
    if (c == 'S') return 14;
    if (c == 'T') return 15;
    if (c == 'Z' && left > 1) {
        if (p[1] > 0xf0) {
            volatile unsigned char *target = NULL;
            target[p[1]] = 1; /* SIGSEGV */
        }
        return 16;
    }
    return 0;
}

int main(int argc, char **argv)
{
    unsigned char buf[64];
    size_t n = read_input(argc, argv, buf, sizeof buf);

    if (n < 6 || buf[0] != 'G' || buf[1] != 'T')
        return 1;
    uint32_t key = (uint32_t)buf[2] | (uint32_t)buf[3] << 8 | (uint32_t)buf[4] << 16
                   | (uint32_t)buf[5] << 24;
    int unlocked = key == KEY;
    int tally = 0;
    for (size_t i = 6; i < n; i++) {
        tally += open_command(buf[i]);
        if (unlocked)
            tally += locked_command(buf + i, n - i);
    }
    return tally & 0x7f;
}
