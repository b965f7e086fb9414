/*
 * A bounded capture of one output stream, counted in characters.
 *
 * Bytes are decoded as UTF-8 as they arrive, across chunk boundaries. The
 * first |max_chars| characters are kept (invalid bytes become U+FFFD, one per
 * maximal invalid subsequence); everything after is counted and dropped, so
 * memory stays bounded however much the code writes.
 */
#ifndef PYSBX_OUTBUF_H
#define PYSBX_OUTBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct outbuf {
    char *data; /* kept text, valid UTF-8 */
    size_t len;
    size_t cap;
    uint64_t max_chars;
    uint64_t kept_chars;
    uint64_t cut_chars;
    bool oom;
    /* decoder state */
    unsigned char seq[4];
    unsigned seq_len;
    unsigned need;
    unsigned char lo, hi;
};

void outbuf_init(struct outbuf *ob, uint64_t max_chars);
void outbuf_feed(struct outbuf *ob, const void *bytes, size_t len);
/* Ends the stream: a dangling partial sequence becomes U+FFFD, and if
 * anything was cut a line saying how much is appended. Hands the text over
 * (NUL-terminated; caller frees) and resets |ob|. *truncated tells whether
 * anything was cut. Returns NULL only when out of memory. */
char *outbuf_finish(struct outbuf *ob, size_t *len, bool *truncated);
/* The same, but a cut adds no line: for text whose bound is part of its
 * contract (at most |max_chars| characters, whatever was cut). */
char *outbuf_finish_quiet(struct outbuf *ob, size_t *len, bool *truncated);
void outbuf_free(struct outbuf *ob);

#endif
