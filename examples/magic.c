/* Planted bug behind a 6-byte magic chain, each byte checked by its own branch. */
#include "read_input.h"

static void crash(void)
{
    volatile int *p = NULL;
    *p = 0x1bad; /* SIGSEGV */
}

int main(int argc, char **argv)
{
    unsigned char buf[64];
    size_t n = read_input(argc, argv, buf, sizeof buf);

    if (n < 6)
        return 1;
    if (buf[0] == 'M') {
        if (buf[1] == 'A') {
            if (buf[2] == 'G') {
                if (buf[3] == 'I') {
                    if (buf[4] == 'C') {
                        if (buf[5] == '!')
                            crash();
                        return 5;
                    }
                    return 4;
                }
                return 3;
            }
            return 2;
        }
        return 1;
    }
    return 0;
}
