#define _GNU_SOURCE
#include "prefault.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

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
    char path[64], line[512];
    long page = sysconf(_SC_PAGESIZE);
    size_t cap = 0;
    int rc = 0;

    snprintf(path, sizeof(path), "%d/maps", (int)pid);
    int mfd = openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
    FILE *maps = mfd >= 0 ? fdopen(mfd, "re") : NULL;
    if (!maps && mfd >= 0)
        close(mfd);
    snprintf(path, sizeof(path), "%d/pagemap", (int)pid);
    int pm = openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
    if (!maps || pm < 0) {
        rc = -errno;
        goto out;
    }
    while (rc == 0 && (!max_pages || p->pages < max_pages) && fgets(line, sizeof(line), maps)) {
        unsigned long start, end;
        char perms[8];
        int path = 0;
        if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %n", &start, &end, perms, &path) != 3)
            continue;
        bool file = path > 0 && line[path] == '/';
        /* Private and writable: where copy-on-write happens. Private, read
         * only and of a file: code and constants, whose page table entries
         * a fork does not copy. */
        if (perms[0] != 'r' || perms[3] != 'p' ||
            (kind == PREFAULT_WRITTEN ? perms[1] != 'w' : perms[1] == 'w' || !file))
            continue;
        for (unsigned long a = start; a < end && rc == 0 && (!max_pages || p->pages < max_pages);) {
            uint64_t entries[512];
            size_t want = (end - a) / (unsigned long)page;
            if (want > 512)
                want = 512;
            ssize_t got = pread(pm, entries, want * 8, (off_t)(a / (unsigned long)page * 8));
            if (got <= 0)
                break;
            for (size_t i = 0; i < (size_t)got / 8; i++) {
                uint64_t e = entries[i];
                uintptr_t at = a + i * (unsigned long)page;
                if ((e & PM_PRESENT) && (kind == PREFAULT_READ || (e & PM_EXCLUSIVE)) &&
                    (!max_pages || p->pages < max_pages)) {
                    rc = add_range(p, at, at + (uintptr_t)page, &cap);
                    p->pages++;
                }
            }
            a += (size_t)got / 8 * (unsigned long)page;
        }
    }
out:
    if (maps)
        fclose(maps);
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
