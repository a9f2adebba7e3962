/* Planted bug behind a length field and an additive checksum.
 *
 * Packet: "CK" | len (u16 little endian) | payload[len] | sum8(payload).
 * A well-formed packet whose payload is a "poke" command (0x7f) with a
 * large operand writes through a NULL pointer. */
#include "read_input.h"

#define MAX_PACKET 256

static unsigned char sum8(const unsigned char *p, size_t n)
{
    unsigned char s = 0;
    for (size_t i = 0; i < n; i++)
        s = (unsigned char)(s + p[i]);
    return s;
}

static int handle(const unsigned char *payload, size_t len)
{
    if (len >= 2 && payload[0] == 0x7f) {
        if (payload[1] > 0xf0) {
            volatile unsigned char *target = NULL;
            target[payload[1]] = 1; /* SIGSEGV */
        }
        return 3;
    }
    return 0;
}

int main(int argc, char **argv)
{
    unsigned char buf[MAX_PACKET];
    size_t n = read_input(argc, argv, buf, sizeof buf);

    if (n < 5 || buf[0] != 'C' || buf[1] != 'K')
        return 1;
    size_t len = (size_t)buf[2] | ((size_t)buf[3] << 8);
    if (len != n - 5) /* the length must match what was really read */
        return 1;
    const unsigned char *payload = buf + 4;
    if (sum8(payload, len) != payload[len])
        return 2;
    return handle(payload, len);
}
