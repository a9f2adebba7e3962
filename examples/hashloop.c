/* CPU-bound target for scaling benchmarks: hashes its input many times (~10 ms natively).
 *
 * Meant for native, AFL and SymCC runs; under the Triton emulator a run would take
 * minutes. HASHLOOP_ROUNDS overrides the number of rounds (default 20000). */
#include <stdint.h>
#include <stdlib.h>

#include "read_input.h"

int main(int argc, char **argv)
{
    unsigned char buf[256];
    size_t n = read_input(argc, argv, buf, sizeof buf);
    const char *env = getenv("HASHLOOP_ROUNDS");
    long rounds = env ? atoi(env) : 20000;
    uint32_t h = 2166136261u; /* FNV-1a, re-seeded with the round number each round */

    for (long r = 0; r < rounds; r++) {
        h ^= (uint32_t)r;
        for (size_t i = 0; i < n; i++) {
            h ^= buf[i];
            h *= 16777619u;
        }
    }
    if (n > 0 && buf[0] == 'H')
        return (int)(h & 0x7f) | 1;
    return 0;
}
