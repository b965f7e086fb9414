/* Pure helpers: no system calls beyond memory allocation. */
#ifndef PYSBX_UTIL_H
#define PYSBX_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define PYSBX_STR_(x) #x
#define PYSBX_STR(x)  PYSBX_STR_(x)

/* Checks an input or artifact name: relative, '/'-separated, valid UTF-8,
 * no NUL, no empty, "." or ".." component, each component at most 255 bytes,
 * the whole at most 4096 bytes. Returns NULL if fine, else why not. */
const char *name_problem(const char *name, size_t len);
/* The same checks but of bytes: any length, any encoding (an artifact's
 * name on disk, to be written beneath a directory). */
const char *path_problem(const char *name, size_t len);

/* Length in bytes of the longest prefix of |s| that is valid UTF-8. */
size_t utf8_valid_prefix(const unsigned char *s, size_t len);
/* Ends the string |s| after its longest valid UTF-8 prefix: for a message
 * cut to a buffer's size (perhaps inside a character) or holding bytes from
 * elsewhere, on its way into JSON. */
void utf8_terminate(char *s);

/* RFC 4648 base64 with padding. Returns a NUL-terminated malloc'd string
 * (length in *out_len if not NULL), or NULL when out of memory. */
char *base64_encode(const void *data, size_t len, size_t *out_len);
/* Decodes standard base64 (padding optional, no whitespace). Returns a
 * malloc'd buffer (length in *out_len), or NULL if the text is not base64
 * (errno EINVAL) or memory ran out (errno ENOMEM). */
unsigned char *base64_decode(const char *text, size_t len, size_t *out_len);

/* Parses a decimal number of seconds ("2", "0.5"); finite and > 0.
 * Returns 0 or -EINVAL. */
int parse_seconds(const char *text, double *out);
/* Parses an unsigned decimal integer without sign or suffix. */
int parse_u64(const char *text, uint64_t *out);
/* Parses "256M", "1G", "1048576" (K, M, G, T are powers of 1024; "MB" and
 * "MiB" mean the same). Returns 0 or -EINVAL. */
int parse_size(const char *text, uint64_t *out);

/* qsort/bsearch comparisons: of two `const char *` elements (bytewise), of
 * two doubles. */
int cmp_strings(const void *a, const void *b);
int cmp_doubles(const void *a, const void *b);
/* The p-th percentile (0 < p <= 100) of |n| > 0 sorted values by the
 * nearest-rank method: the smallest value with at least p% of them at or
 * below it. One method for every percentile, so p50 <= p99 always. */
double percentile(const double *sorted, size_t n, double p);

/* A size as people write it: "256 MiB", "1 GiB", "512 KiB" when it is a
 * whole number of those, else "1000 bytes". */
void fmt_size(char *buf, size_t cap, uint64_t bytes);

/* snprintf into a fixed buffer, never failing (cut if needed). */
void fmt(char *buf, size_t cap, const char *format, ...) __attribute__((format(printf, 3, 4)));

/* The code base's one failure convention: a function returns 0 or a negative
 * errno, and where its caller needs words, it writes them to a buffer. This
 * formats the message into |buf| and returns |rc|, so a failure is one line:
 * `return errmsg(err, errlen, -errno, "opening %s: %m", path);` */
int errmsg(char *buf, size_t cap, int rc, const char *format, ...)
    __attribute__((format(printf, 4, 5)));

/* The conventional name of a signal ("SIGSEGV"), or NULL if unknown. */
const char *signal_name(int sig);

#endif
