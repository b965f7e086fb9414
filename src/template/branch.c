#define _GNU_SOURCE
#include "branch.h"

#include "procmaps.h"

#include "sysutil.h"
#include "util.h"
#include "wire.h"
#include "worker.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#define PAGE         4096ULL
#define IMPORT_STACK BRANCH_IMPORT_STACK
/* The kernel keeps 1 MiB free below a stack (stack_guard_gap); more here. */
#define STACK_GAP (4ULL << 20)
/* How long the branch's process may take over one step. */
#define STEP_MS 10000
/* The copy goes through this much of our memory at a time. */
#define COPY_CHUNK (4ULL << 20)
/* Without PAGEMAP_SCAN, a mapping is read page by page: one this large is
 * refused rather than read (a sanitizer's shadow is terabytes). */
#define PLAIN_SCAN_MAX (4ULL << 30)
/* Page map entries are read for this much of a mapping at a time. */
#define COPY_SLICE (64ULL << 20)

#define PM_PFN     ((1ULL << 55) - 1)
#define PM_FILE    (1ULL << 61)
#define PM_SWAP    (1ULL << 62)
#define PM_PRESENT (1ULL << 63)

/* The kernel's PAGEMAP_SCAN (Linux 6.7, <linux/fs.h>): the ranges of a
 * mapping whose pages are in some state, found from the page tables alone
 * (an empty terabyte costs nothing). */
struct pm_region {
    uint64_t start, end, categories;
};
struct pm_scan {
    uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
    uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
#define PM_SCAN       _IOWR('f', 16, struct pm_scan)
#define PM_IS_PRESENT (1ULL << 3)
#define PM_IS_SWAPPED (1ULL << 4)
#define PM_IS_PFNZERO (1ULL << 5)

/* The most mappings a state may have for a branch of it (the kernel's
 * default vm.max_map_count is 65530). */
#define BRANCH_MAX_REGIONS (1U << 17)

struct region {
    struct procmap m;
    /* the state's regions: how the branch has it */
    bool kept;      /* the branch maps it already, the same */
    bool file_same; /* the branch maps the same file there */
    bool fresh;     /* mapped for the copy (writable until the end) */
};

struct map {
    struct region *v;
    size_t n;
};

static void map_free(struct map *m)
{
    free(m->v);
    m->v = NULL;
    m->n = 0;
}

/* The kernel's map of |pid|, in bounded steps (procmaps.h). */
static int read_map(int proc_fd, pid_t pid, struct map *m, char *why, size_t cap)
{
    struct procmap *v = NULL;
    size_t n = 0;
    int rc = procmaps_read(proc_fd, pid, BRANCH_MAX_REGIONS, &v, &n, why, cap);

    if (rc < 0)
        return rc;
    m->v = calloc(n ? n : 1, sizeof(*m->v));
    if (!m->v) {
        free(v);
        return errmsg(why, cap, -ENOMEM, "template: out of memory");
    }
    for (size_t i = 0; i < n; i++)
        m->v[i].m = v[i];
    m->n = n;
    free(v);
    return 0;
}

static bool same_mapping(const struct procmap *a, const struct procmap *b)
{
    return a->lo == b->lo && a->hi == b->hi && a->ino == b->ino && a->dev_major == b->dev_major &&
           a->dev_minor == b->dev_minor && a->shared == b->shared && (!a->ino || a->off == b->off);
}

static const struct procmap *find_kind(const struct map *m, enum procmap_kind k, bool last)
{
    const struct procmap *found = NULL;

    for (size_t i = 0; i < m->n; i++)
        if (m->v[i].m.kind == k && (!found || last))
            found = &m->v[i].m;
    return found;
}

/* --- talking to the branch ------------------------------------------------- */

static int send_op(int sock, uint32_t kind, int prot, uint64_t lo, uint64_t hi, uint64_t off,
                   int fd)
{
    struct branch_op o = {.kind = kind, .prot = prot, .lo = lo, .hi = hi, .off = off};

    return wire_send(sock, &o, sizeof(o), fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0);
}

/* The branch's one-byte answer |want|; its failure's words in |why|. */
static int hear(int sock, char want, char *why, size_t cap)
{
    char buf[160];
    struct pollfd p = {.fd = sock, .events = POLLIN};
    int nfds = 0;

    if (poll(&p, 1, STEP_MS) <= 0)
        return errmsg(why, cap, -ETIMEDOUT, "the branch's process did not answer in time");
    ssize_t n = wire_recv(sock, buf, sizeof(buf) - 1, NULL, 0, &nfds);
    if (n == 1 && buf[0] == want)
        return 0;
    if (n > 1 && buf[0] == BRANCH_FAILED) {
        buf[n] = '\0';
        fmt(why, cap, "the branch could not map the state: %s", buf + 1);
        utf8_terminate(why);
        return -EIO;
    }
    return errmsg(why, cap, -EPROTO, "the branch's process ended as it imported the state");
}

/* The stack the branch imports on: a gap clear of both maps, below both
 * stacks (so that leaving it for the state's stack is a jump up, as glibc's
 * longjmp checks), the highest such gap. Both maps are in address order:
 * one pass over them, merged. */
static uint64_t import_stack_at(const struct map *a, const struct map *b)
{
    const struct procmap *sa = find_kind(a, PROCMAP_STACK, false);
    const struct procmap *sb = find_kind(b, PROCMAP_STACK, false);
    uint64_t want = IMPORT_STACK + 2 * PAGE, found = 0;
    /* Nothing is mapped below the kernel's mmap_min_addr. */
    uint64_t end = 1ULL << 20;
    size_t i = 0, j = 0;

    if (!sa || !sb)
        return 0;
    /* Past the gap the kernel keeps below a stack that grows. */
    uint64_t top = sa->lo < sb->lo ? sa->lo : sb->lo;
    if (top <= STACK_GAP)
        return 0;
    top -= STACK_GAP;
    for (;;) {
        const struct procmap *next = NULL;
        if (i < a->n && (j >= b->n || a->v[i].m.lo <= b->v[j].m.lo))
            next = &a->v[i++].m;
        else if (j < b->n)
            next = &b->v[j++].m;
        uint64_t gap_hi = next && next->lo < top ? next->lo : top;
        if (gap_hi > end && gap_hi - end >= want)
            found = gap_hi - want + PAGE;
        if (!next || next->lo >= top)
            return found;
        if (next->hi > end)
            end = next->hi;
    }
}

/* The region of |m| that starts at |lo|, or NULL (|m| is in address
 * order). */
static struct region *region_at(const struct map *m, uint64_t lo)
{
    size_t first = 0, last = m->n;

    while (first < last) {
        size_t mid = first + (last - first) / 2;
        if (m->v[mid].m.lo == lo)
            return &m->v[mid];
        if (m->v[mid].m.lo < lo)
            first = mid + 1;
        else
            last = mid;
    }
    return NULL;
}

/* --- the pages -------------------------------------------------------------- */

/* The ranges of [lo, hi) in which |pm| (a page map) has pages present or
 * swapped, added to *v (growing it); -ENOTTY where the kernel cannot say.
 * The zero page is not among them: it reads as the zeros a page the branch
 * lacks reads as (a state that only read a GiB has nothing to copy). */
static int scan(int pm, uint64_t lo, uint64_t hi, uint64_t (**v)[2], size_t *n, size_t *room)
{
    struct pm_region got[256];

    for (uint64_t at = lo; at < hi;) {
        struct pm_scan a = {
            .size = sizeof(a),
            .start = at,
            .end = hi,
            .vec = (uint64_t)(uintptr_t)got,
            .vec_len = sizeof(got) / sizeof(got[0]),
            .category_inverted = PM_IS_PFNZERO,
            .category_mask = PM_IS_PFNZERO,
            .category_anyof_mask = PM_IS_PRESENT | PM_IS_SWAPPED,
            .return_mask = PM_IS_PRESENT | PM_IS_SWAPPED,
        };
        int r = ioctl(pm, PM_SCAN, &a);
        if (r < 0)
            return errno == EINVAL || errno == ENOTTY ? -ENOTTY : -errno;
        for (int i = 0; i < r; i++) {
            if (*n == *room) {
                size_t c = *room ? *room * 2 : 64;
                void *nv = realloc(*v, c * sizeof(**v));
                if (!nv)
                    return -ENOMEM;
                *v = nv;
                *room = c;
            }
            (*v)[*n][0] = got[i].start;
            (*v)[*n][1] = got[i].end;
            (*n)++;
        }
        if (a.walk_end <= at)
            break;
        at = a.walk_end;
    }
    return 0;
}

static int cmp_range(const void *x, const void *y)
{
    const uint64_t *a = x, *b = y;
    return a[0] < b[0] ? -1 : a[0] > b[0];
}

/* Runs copied in one pair of system calls, at most (IOV_MAX is 1024). */
#define COPY_BATCH 512

struct copier {
    pid_t from, to;
    int pm_from, pm_to;
    char *buf;
    struct iovec batch[COPY_BATCH]; /* runs waiting, of the state's (and the branch's) */
    size_t n_batch, batched;        /* how many, and their bytes (in buf) */
    uint64_t *ea, *eb;              /* page map entries of a range, for both */
    size_t e_room;
    struct branch_stats *st;
};

/* The runs batched, copied through our buffer: read from the state, and
 * written at the same addresses in the branch. */
static int flush(struct copier *c)
{
    struct iovec local = {.iov_base = c->buf, .iov_len = c->batched};

    if (!c->n_batch)
        return 0;
    errno = 0;
    if (process_vm_readv(c->from, &local, 1, c->batch, c->n_batch, 0) != (ssize_t)c->batched)
        return errno ? -errno : -EFAULT;
    if (process_vm_writev(c->to, &local, 1, c->batch, c->n_batch, 0) != (ssize_t)c->batched)
        return errno ? -errno : -EFAULT;
    c->st->copied += c->batched / PAGE;
    c->n_batch = c->batched = 0;
    return 0;
}

/* [at, at + len) to be copied (len at most COPY_CHUNK). */
static int copy_run(struct copier *c, uint64_t at, uint64_t len)
{
    if (c->n_batch == COPY_BATCH || c->batched + len > COPY_CHUNK) {
        int rc = flush(c);
        if (rc < 0)
            return rc;
    }
    c->batch[c->n_batch++] = (struct iovec){.iov_base = (void *)(uintptr_t)at, .iov_len = len};
    c->batched += len;
    return 0;
}

/* Whether the page whose entries are |a| (the state's) and |b| (the
 * branch's) must be copied for the branch to read what the state reads. */
static bool differs(uint64_t a, uint64_t b, bool file_same)
{
    bool ap = a & PM_PRESENT, bp = b & PM_PRESENT;

    /* The same physical page (a page number of 0 means it is not shown). */
    if (ap && bp && (a & PM_PFN) && (a & PM_PFN) == (b & PM_PFN))
        return false;
    /* The file's page, which the branch maps too: unless the branch has a
     * private copy there. */
    if (ap && (a & PM_FILE) && file_same)
        return bp && !(b & PM_FILE);
    if (ap || (a & PM_SWAP))
        return true;
    /* The state has nothing there (zeros, or the file's): the branch's own
     * private page goes. */
    return bp && !(b & PM_FILE);
}

static int copy_range(struct copier *c, uint64_t lo, uint64_t hi, bool file_same)
{
    size_t n = (size_t)((hi - lo) / PAGE);

    if (n > c->e_room) {
        free(c->ea);
        free(c->eb);
        c->ea = malloc(n * sizeof(uint64_t));
        c->eb = malloc(n * sizeof(uint64_t));
        c->e_room = c->ea && c->eb ? n : 0;
        if (!c->e_room)
            return -ENOMEM;
    }
    off_t at = (off_t)(lo / PAGE * sizeof(uint64_t));
    if (pread(c->pm_from, c->ea, n * sizeof(uint64_t), at) != (ssize_t)(n * sizeof(uint64_t)) ||
        pread(c->pm_to, c->eb, n * sizeof(uint64_t), at) != (ssize_t)(n * sizeof(uint64_t)))
        return -EIO;
    for (size_t i = 0; i < n;) {
        if (!differs(c->ea[i], c->eb[i], file_same)) {
            i++;
            continue;
        }
        size_t j = i + 1;
        while (j < n && (j - i) * PAGE < COPY_CHUNK && differs(c->ea[j], c->eb[j], file_same))
            j++;
        int rc = copy_run(c, lo + i * PAGE, (j - i) * PAGE);
        if (rc < 0)
            return rc;
        i = j;
    }
    return 0;
}

/* The pages of the state's region |r| that the branch lacks, copied. */
static int copy_region(struct copier *c, const struct region *r, char *why, size_t cap)
{
    uint64_t(*v)[2] = NULL;
    size_t n = 0, room = 0;
    int rc = scan(c->pm_from, r->m.lo, r->m.hi, &v, &n, &room);

    /* The branch's own pages there count too: where the state has none,
     * the branch's go. */
    if (rc == 0)
        rc = scan(c->pm_to, r->m.lo, r->m.hi, &v, &n, &room);
    if (rc == -ENOTTY) {
        if (r->m.hi - r->m.lo > PLAIN_SCAN_MAX) {
            free(v);
            return errmsg(why, cap, -E2BIG,
                          "the state maps %llu MiB at %#llx, more than this kernel lets the "
                          "template look at page by page (PAGEMAP_SCAN is Linux 6.7)",
                          (unsigned long long)((r->m.hi - r->m.lo) >> 20),
                          (unsigned long long)r->m.lo);
        }
        n = 0;
        rc = 0;
        if (room == 0 && !(v = malloc(sizeof(*v))))
            rc = -ENOMEM;
        else {
            v[0][0] = r->m.lo;
            v[0][1] = r->m.hi;
            n = 1;
        }
    }
    if (rc == 0) {
        if (n > 1)
            qsort(v, n, sizeof(*v), cmp_range);
        for (size_t i = 0; i < n && rc == 0;) {
            uint64_t lo = v[i][0], hi = v[i][1];
            for (i++; i < n && v[i][0] <= hi; i++)
                if (v[i][1] > hi)
                    hi = v[i][1];
            /* In slices, so that the page map entries stay small (no
             * address is near the top of the space: procmaps.h). */
            for (uint64_t at = lo, to; at < hi && rc == 0; at = to) {
                to = hi - at < COPY_SLICE ? hi : at + COPY_SLICE;
                rc = copy_range(c, at, to, r->file_same);
            }
        }
        if (rc < 0)
            errmsg(why, cap, rc, "copying the state's pages at %#llx: %s",
                   (unsigned long long)r->m.lo, strerror(-rc));
    } else
        errmsg(why, cap, rc, "reading the page map: %s", strerror(-rc));
    free(v);
    return rc;
}

/* --- the plan ----------------------------------------------------------------- */

/* The branch's map made the state's, but for the stack's size and the
 * pages. */
static int map_like(int proc_fd, pid_t from, int sock, struct map *a, const struct map *b,
                    uint64_t stack_at, char *why, size_t cap)
{
    int rc = 0;

    /* What the branch maps that the state does not, unmapped. */
    for (size_t j = 0; j < b->n && rc == 0; j++) {
        const struct procmap *r = &b->v[j].m;
        struct region *same = region_at(a, r->lo);
        bool keep =
            r->kind != PROCMAP_PLAIN || (r->lo < stack_at + IMPORT_STACK && r->hi > stack_at);
        if (!keep && same && same->m.kind == PROCMAP_PLAIN && same_mapping(&same->m, r))
            keep = same->kept = true;
        if (!keep)
            rc = send_op(sock, BRANCH_OP_MUNMAP, 0, r->lo, r->hi, 0, -1);
    }
    /* The heap where the state's ends. */
    const struct procmap *heap = find_kind(a, PROCMAP_HEAP, true);
    const struct procmap *bheap = find_kind(b, PROCMAP_HEAP, false);
    if (rc == 0 && heap)
        rc = send_op(sock, BRANCH_OP_BRK, 0, heap->hi, 0, 0, -1);
    else if (rc == 0 && bheap)
        return errmsg(why, cap, -ENOTSUP, "the state has given back all of its heap");
    for (size_t i = 0; i < a->n && rc == 0; i++) {
        struct region *r = &a->v[i];
        if (r->m.kind == PROCMAP_HEAP || r->m.kind == PROCMAP_STACK) {
            r->kept = true;
            continue;
        }
        if (r->m.kind == PROCMAP_KERNEL) {
            /* The kernel's own pages are where the template's were, in
             * every process of it. */
            const struct region *there = region_at(b, r->m.lo);
            if (!there || there->m.kind != PROCMAP_KERNEL || there->m.hi != r->m.hi)
                return errmsg(why, cap, -ENOTSUP, "the state's vDSO is not where the branch's is");
            r->kept = true;
            continue;
        }
        if (r->kept) {
            r->file_same = r->m.ino != 0;
            continue;
        }
        if (r->m.shared)
            return errmsg(why, cap, -ENOTSUP, "the state has a shared mapping at %#llx",
                          (unsigned long long)r->m.lo);
        r->fresh = true;
        int fd = -1;
        if (r->m.ino) {
            /* The very file the state maps (the kernel's link to it), if it
             * is on a file system nobody writes: the branch shares its
             * pages, as the state shares them with the template. A file
             * the tenant could write (its workspace) is copied instead, so
             * that no write of the state's reaches the branch. */
            char path[64];
            struct statvfs vfs;
            fmt(path, sizeof(path), "%d/map_files/%llx-%llx", (int)from,
                (unsigned long long)r->m.lo, (unsigned long long)r->m.hi);
            fd = openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0 && (fstatvfs(fd, &vfs) < 0 || !(vfs.f_flag & ST_RDONLY)))
                close_fd(&fd);
        }
        r->file_same = fd >= 0;
        rc = send_op(sock, fd >= 0 ? BRANCH_OP_MMAP_FILE : BRANCH_OP_MMAP_ANON, 0, r->m.lo, r->m.hi,
                     r->m.off, fd);
        close_fd(&fd);
    }
    /* The stack, down to where the state's reaches. */
    const struct procmap *sa = find_kind(a, PROCMAP_STACK, false);
    const struct procmap *sb = find_kind(b, PROCMAP_STACK, false);
    if (rc == 0 && (!sa || !sb))
        return errmsg(why, cap, -ENOTSUP, "a stack is not in the memory map");
    if (rc == 0)
        rc = send_op(sock, BRANCH_OP_GROW, 0, sa->lo < sb->lo ? sa->lo : sb->lo, sb->lo, 0, -1);
    if (rc < 0)
        return errmsg(why, cap, rc, "the branch's process does not listen: %s", strerror(-rc));
    return 0;
}

int branch_copy(int proc_fd, const struct branch_pids *p, int sock, struct branch_stats *st,
                char *why, size_t cap)
{
    struct map a = {0}, b = {0};
    struct copier c = {.from = p->vm_from, .to = p->vm_to, .pm_from = -1, .pm_to = -1, .st = st};
    pid_t from = p->from, to = p->to;
    char path[32];
    int rc;

    memset(st, 0, sizeof(*st));
    if ((rc = read_map(proc_fd, from, &a, why, cap)) < 0 ||
        (rc = read_map(proc_fd, to, &b, why, cap)) < 0)
        goto out;
    st->regions = a.n;
    uint64_t stack_at = import_stack_at(&a, &b);
    if (!stack_at) {
        rc = errmsg(why, cap, -ENOMEM, "no room for the branch's import stack");
        goto out;
    }
    if ((rc = send_op(sock, BRANCH_STACK, 0, stack_at, stack_at + IMPORT_STACK, 0, -1)) < 0) {
        errmsg(why, cap, rc, "the branch's process does not listen: %s", strerror(-rc));
        goto out;
    }
    if ((rc = map_like(proc_fd, from, sock, &a, &b, stack_at, why, cap)) < 0 ||
        (rc = hear(sock, BRANCH_MAPPED, why, cap)) < 0)
        goto out;
    fmt(path, sizeof(path), "%d/pagemap", (int)from);
    c.pm_from = openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
    fmt(path, sizeof(path), "%d/pagemap", (int)to);
    c.pm_to = openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
    c.buf = malloc(COPY_CHUNK);
    if (c.pm_from < 0 || c.pm_to < 0 || !c.buf) {
        rc = errmsg(why, cap, c.buf ? -errno : -ENOMEM, "opening the page maps: %s",
                    c.buf ? strerror(errno) : "out of memory");
        goto out;
    }
    for (size_t i = 0; i < a.n && rc == 0; i++)
        if (a.v[i].m.kind != PROCMAP_KERNEL)
            rc = copy_region(&c, &a.v[i], why, cap);
    if (rc == 0 && (rc = flush(&c)) < 0)
        errmsg(why, cap, rc, "copying the state's pages: %s", strerror(-rc));
    if (rc < 0)
        goto out;
    char copied = BRANCH_COPIED;
    rc = wire_send(sock, &copied, 1, NULL, 0);
    /* What was mapped for the copy gets the state's protection. */
    for (size_t i = 0; i < a.n && rc == 0; i++)
        if (a.v[i].fresh && a.v[i].m.prot != (PROT_READ | PROT_WRITE))
            rc = send_op(sock, BRANCH_OP_PROTECT, a.v[i].m.prot, a.v[i].m.lo, a.v[i].m.hi, 0, -1);
    if (rc == 0)
        rc = send_op(sock, BRANCH_OP_END, 0, 0, 0, 0, -1);
    if (rc < 0)
        errmsg(why, cap, rc, "the branch's process does not listen: %s", strerror(-rc));
out:
    close_fd(&c.pm_from);
    close_fd(&c.pm_to);
    free(c.buf);
    free(c.ea);
    free(c.eb);
    map_free(&a);
    map_free(&b);
    return rc;
}
