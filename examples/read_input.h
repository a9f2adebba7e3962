/* Shared input reader of the examples: argv[1] names the input file, else stdin. */
#ifndef READ_INPUT_H
#define READ_INPUT_H

#include <stdio.h>
#include <stdlib.h>

/* Reads at most cap bytes; exits with status 2 when the file cannot be opened.
 * Only fopen/fread/fclose/fputs are used because tritondse models exactly these. */
static size_t read_input(int argc, char **argv, unsigned char *buf, size_t cap)
{
    FILE *f = stdin;
    if (argc > 1) {
        f = fopen(argv[1], "rb");
        if (f == NULL) {
            fputs("cannot open input\n", stderr);
            exit(2);
        }
    }
    size_t n = fread(buf, 1, cap, f);
    if (f != stdin)
        fclose(f);
    return n;
}

#endif
