/* What the fuzz targets share: an invariant check that holds in every build
 * type (assert() is gone under NDEBUG), and copying the input into a
 * buffer of exactly its size, so that AddressSanitizer sees any read past
 * the length a decoder was given. */
#ifndef PYSBX_FUZZ_H
#define PYSBX_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond);           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input in a malloc'd buffer of |size| bytes (at least one, so that an
 * empty input has an address). */
static inline char *fuzz_copy(const uint8_t *data, size_t size)
{
    char *p = malloc(size ? size : 1);
    CHECK(p);
    if (size)
        memcpy(p, data, size);
    return p;
}

/* The input as a NUL-terminated string (cut at its first NUL). */
static inline char *fuzz_string(const uint8_t *data, size_t size)
{
    char *p = malloc(size + 1);
    CHECK(p);
    if (size)
        memcpy(p, data, size);
    p[size] = '\0';
    return p;
}

#endif
