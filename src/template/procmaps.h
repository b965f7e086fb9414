/*
 * A process's memory map, as the kernel reports it, read in bounded steps.
 *
 * The processes whose maps the template reads (a session's state, a cell)
 * have run the tenant's code, and a mapping's name is a path the tenant
 * chose: it may be longer than any line buffer, hold newlines, spaces or
 * text that looks like another mapping. So the map is not parsed as text
 * where the kernel can say it field by field: PROCMAP_QUERY (Linux 6.11)
 * answers one mapping at a time as a struct, the name only where it is
 * asked for (here: only to tell the stack, the heap and the kernel's own
 * pages apart, which are short). Older kernels get the text, strictly: a
 * line longer than PROCMAPS_LINE_MAX or without its newline, a field out
 * of form, an address that is not page-aligned, out of order, overlapping
 * or past the largest user address refuses the whole read. And there are
 * never more than the caller's |max| mappings: a map past it is refused,
 * not read on. What the reader costs is then bounded by |max|, whatever
 * the tenant mapped.
 *
 * The text is also the cheaper read where system calls are dear: one
 * read of 16 KiB against two PROCMAP_QUERY calls for each mapping of no
 * file (a Python process's 119 mappings, here: 58 us against 190). But
 * the kernel builds every mapped file's path for it, whose length the
 * tenant chooses. So a reader whose time is its own (a process of the
 * copy's, not the template's loop) may ask for the text first, and reads
 * field by field instead if the text fails any check above or passes
 * PROCMAPS_TEXT_BUDGET: what it spent on the text is then bounded by
 * that, and the map is read, or refused, as without the text.
 */
#ifndef PYSBX_PROCMAPS_H
#define PYSBX_PROCMAPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The longest line of the text form read (a name past it refuses the read). */
#define PROCMAPS_LINE_MAX 8192
/* The most text a reader that asked for it first reads (some 8,000
 * mappings of a Python process's kind). */
#define PROCMAPS_TEXT_BUDGET (1U << 20)
/* No user address is at or past this (57-bit, five-level page tables). */
#define PROCMAPS_ADDR_END (1ULL << 57)

enum procmap_kind {
    PROCMAP_PLAIN,
    PROCMAP_STACK,  /* [stack] */
    PROCMAP_HEAP,   /* [heap] */
    PROCMAP_KERNEL, /* [vdso], [vvar], [vvar_vclock], [vsyscall]: the kernel's own pages */
};

struct procmap {
    uint64_t lo, hi; /* [lo, hi), page-aligned, lo < hi */
    uint64_t off, ino;
    uint32_t dev_major, dev_minor;
    int prot; /* PROT_READ | PROT_WRITE | PROT_EXEC */
    bool shared;
    enum procmap_kind kind;
};

/* |pid|'s mappings under /proc (|proc_fd|), in address order: at most
 * |max| of them into *out (malloc'ed, the caller frees), their number in
 * *n; the text asked for first with |text_first| (above). Returns 0, or
 * -errno with |why|: -E2BIG when there are more than |max|, -EPROTO when
 * the kernel's text fails a check above. */
int procmaps_read(int proc_fd, pid_t pid, size_t max, bool text_first, struct procmap **out,
                  size_t *n, char *why, size_t cap);

#endif
