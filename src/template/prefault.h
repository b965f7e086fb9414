/*
 * Profile-guided prefaulting of a worker's copy-on-write pages.
 *
 * Every worker copies the same few hundred pages of the template while it
 * gets ready (the interpreter's after-fork work, the warm-up). Taken one
 * fault at a time that is the bulk of a worker's cost on machines where a
 * fault is expensive (measured here: 15-30 us per fault, 6 us per page with
 * MADV_POPULATE_WRITE). The template looks, once, at which pages its first
 * ready worker holds privately, and every later worker copies exactly those
 * in a few madvise() calls right after the fork. Same pages, same private
 * memory, far fewer traps.
 */
#ifndef PYSBX_PREFAULT_H
#define PYSBX_PREFAULT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct prefault {
    uintptr_t (*ranges)[2]; /* [start, end) */
    size_t n;
    size_t pages;
    int recorded; /* 1 recorded, -1 could not be (then never tried again) */
};

enum prefault_kind {
    PREFAULT_WRITTEN, /* pages of private writable mappings that |pid| alone maps */
    PREFAULT_READ,    /* pages of private read-only mappings of files that it maps */
};

/* Reads |pid|'s maps and pagemap under /proc (|proc_fd|): the pages of
 * |kind|, the first |max_pages| of them (0: all). Returns 0 or -errno. */
int prefault_record(int proc_fd, pid_t pid, size_t max_pages, enum prefault_kind kind,
                    struct prefault *p);
void prefault_free(struct prefault *p);

/* In a new worker: copies the recorded pages now, in batches. Best effort. */
void prefault_apply(const struct prefault *p);

#endif
