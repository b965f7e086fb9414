#define _GNU_SOURCE
#include "prefault.h"

#include "procmaps.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* What a record reads, whatever the process mapped (a session's is the
 * tenant's to shape; it is read on the loop that serves every run): a map
 * of at most this many mappings (one of the template's has some hundreds;
 * past it, no plan), and page map entries for 256 MiB of them (past it,
 * the plan is what was found so far). */
#define PREFAULT_MAX_REGIONS 4096
#define PREFAULT_MAX_SCAN    (1U << 16)

#define PM_PRESENT   (1ULL << 63)
#define PM_EXCLUSIVE (1ULL << 56)

static int add_range(struct prefault *p, uintptr_t start, uintptr_t end, size_t *cap)
{
    if (p->n && p->ranges[p->n - 1][1] == start) {
        p->ranges[p->n - 1][1] = end;
        return 0;
    }
    if (p->n == *cap) {
        size_t c = *cap ? *cap * 2 : 256;
        void *r = realloc(p->ranges, c * sizeof(*p->ranges));
        if (!r)
            return -ENOMEM;
        p->ranges = r;
        *cap = c;
    }
    p->ranges[p->n][0] = start;
    p->ranges[p->n][1] = end;
    p->n++;
    return 0;
}

void prefault_free(struct prefault *p)
{
    free(p->ranges);
    memset(p, 0, sizeof(*p));
}

int prefault_record(int proc_fd, pid_t pid, size_t max_pages, enum prefault_kind kind,
                    struct prefault *p)
{
    char path[32], why[128];
    unsigned long page = (unsigned long)sysconf(_SC_PAGESIZE);
    struct procmap *maps = NULL;
    size_t n_maps = 0, cap = 0, scanned = 0;
    int rc =
        procmaps_read(proc_fd, pid, PREFAULT_MAX_REGIONS, false, &maps, &n_maps, why, sizeof(why));
    int pm = -1;

    if (rc == 0) {
        fmt(path, sizeof(path), "%d/pagemap", (int)pid);
        pm = openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
        if (pm < 0)
            rc = -errno;
    }
    for (size_t m = 0; rc == 0 && m < n_maps && scanned < PREFAULT_MAX_SCAN; m++) {
        const struct procmap *r = &maps[m];
        /* Private and writable: where copy-on-write happens. Private, read
         * only and of a file: code and constants, whose page table entries
         * a fork does not copy. */
        if (!(r->prot & PROT_READ) || r->shared ||
            (kind == PREFAULT_WRITTEN ? !(r->prot & PROT_WRITE)
                                      : (r->prot & PROT_WRITE) || !r->ino))
            continue;
        for (uint64_t a = r->lo; a < r->hi && rc == 0 && scanned < PREFAULT_MAX_SCAN &&
                                 (!max_pages || p->pages < max_pages);) {
            uint64_t entries[512];
            uint64_t want = (r->hi - a) / page;
            if (want > 512)
                want = 512;
            ssize_t got = pread(pm, entries, want * 8, (off_t)(a / page * 8));
            if (got <= 0)
                break;
            scanned += (size_t)got / 8;
            for (size_t i = 0; i < (size_t)got / 8; i++) {
                uint64_t e = entries[i];
                uintptr_t at = a + i * page;
                if ((e & PM_PRESENT) && (kind == PREFAULT_READ || (e & PM_EXCLUSIVE)) &&
                    (!max_pages || p->pages < max_pages)) {
                    rc = add_range(p, at, at + page, &cap);
                    p->pages++;
                }
            }
            a += (uint64_t)got / 8 * page;
        }
    }
    free(maps);
    if (pm >= 0)
        close(pm);
    p->recorded = rc == 0 && p->n > 0 ? 1 : -1;
    return rc;
}

void prefault_apply(const struct prefault *p)
{
    if (p->recorded != 1)
        return;
    for (size_t i = 0; i < p->n; i++) {
        /* A range the template no longer maps fails harmlessly. */
        if (madvise((void *)p->ranges[i][0], p->ranges[i][1] - p->ranges[i][0],
                    MADV_POPULATE_WRITE) < 0 &&
            errno == EINVAL)
            return; /* not supported by this kernel */
    }
}
