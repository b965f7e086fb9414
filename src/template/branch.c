#define _GNU_SOURCE
#include "branch.h"

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

enum region_kind { R_PLAIN, R_STACK, R_HEAP, R_KERNEL /* vdso, vvar, vsyscall */ };

struct region {
    uint64_t lo, hi, off, ino;
    unsigned dev_major, dev_minor;
    int prot;
    bool shared;
    enum region_kind kind;
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

static int read_map(int proc_fd, pid_t pid, struct map *m, char *why, size_t cap)
{
    char path[32], line[4096 + 128];
    size_t room = 0;

    fmt(path, sizeof(path), "%d/maps", (int)pid);
    int fd = openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
    FILE *f = fd >= 0 ? fdopen(fd, "re") : NULL;
    if (!f) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return errmsg(why, cap, -e, "reading the memory map of process %d: %s", (int)pid,
                      strerror(e));
    }
    while (fgets(line, sizeof(line), f)) {
        struct region r = {0};
        char perms[8];
        int name = 0;
        unsigned long lo, hi, off, ino;
        if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu %n", &lo, &hi, perms, &off, &r.dev_major,
                   &r.dev_minor, &ino, &name) < 7)
            continue;
        r.lo = lo;
        r.hi = hi;
        r.off = off;
        r.ino = ino;
        r.prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
                 (perms[2] == 'x' ? PROT_EXEC : 0);
        r.shared = perms[3] == 's';
        const char *n = name ? line + name : "";
        r.kind = strncmp(n, "[stack]", 7) == 0  ? R_STACK
                 : strncmp(n, "[heap]", 6) == 0 ? R_HEAP
                 : strncmp(n, "[vdso]", 6) == 0 || strncmp(n, "[vvar", 5) == 0 ||
                         strncmp(n, "[vsyscall]", 10) == 0
                     ? R_KERNEL
                     : R_PLAIN;
        if (m->n == room) {
            room = room ? room * 2 : 256;
            struct region *v = realloc(m->v, room * sizeof(*v));
            if (!v) {
                fclose(f);
                return errmsg(why, cap, -ENOMEM, "template: out of memory");
            }
            m->v = v;
        }
        m->v[m->n++] = r;
    }
    fclose(f);
    return 0;
}

static bool same_mapping(const struct region *a, const struct region *b)
{
    return a->lo == b->lo && a->hi == b->hi && a->ino == b->ino && a->dev_major == b->dev_major &&
           a->dev_minor == b->dev_minor && a->shared == b->shared && (!a->ino || a->off == b->off);
}

static const struct region *find_kind(const struct map *m, enum region_kind k, bool last)
{
    const struct region *found = NULL;

    for (size_t i = 0; i < m->n; i++)
        if (m->v[i].kind == k && (!found || last))
            found = &m->v[i];
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
 * longjmp checks). */
static uint64_t import_stack_at(const struct map *a, const struct map *b)
{
    const struct region *sa = find_kind(a, R_STACK, false), *sb = find_kind(b, R_STACK, false);
    uint64_t top = sa && sb ? (sa->lo < sb->lo ? sa->lo : sb->lo) : 0;
    uint64_t want = IMPORT_STACK + 2 * PAGE;

    /* Downward from the stacks (past the gap the kernel keeps below a
     * stack that grows), the first gap both maps leave. */
    top = top > STACK_GAP ? top - STACK_GAP : 0;
    for (uint64_t hi = top; hi > want;) {
        uint64_t lo = hi - want;
        uint64_t lowest = 0; /* the lowest start of a region in [lo, hi), or 0 */
        for (int k = 0; k < 2; k++) {
            const struct map *m = k ? b : a;
            for (size_t i = 0; i < m->n; i++)
                if (m->v[i].lo < hi && m->v[i].hi > lo && (!lowest || m->v[i].lo < lowest))
                    lowest = m->v[i].lo;
        }
        if (!lowest)
            return lo + PAGE;
        hi = lowest; /* below the lowest region met */
    }
    return 0;
}

/* --- the pages -------------------------------------------------------------- */

/* The ranges of [lo, hi) in which |pm| (a page map) has pages present or
 * swapped, added to *v (growing it); -ENOTTY where the kernel cannot say. */
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
    int rc = scan(c->pm_from, r->lo, r->hi, &v, &n, &room);

    /* The branch's own pages there count too: where the state has none,
     * the branch's go. */
    if (rc == 0)
        rc = scan(c->pm_to, r->lo, r->hi, &v, &n, &room);
    if (rc == -ENOTTY) {
        if (r->hi - r->lo > PLAIN_SCAN_MAX) {
            free(v);
            return errmsg(why, cap, -E2BIG,
                          "the state maps %llu MiB at %#llx, more than this kernel lets the "
                          "template look at page by page (PAGEMAP_SCAN is Linux 6.7)",
                          (unsigned long long)((r->hi - r->lo) >> 20), (unsigned long long)r->lo);
        }
        n = 0;
        rc = 0;
        if (room == 0 && !(v = malloc(sizeof(*v))))
            rc = -ENOMEM;
        else {
            v[0][0] = r->lo;
            v[0][1] = r->hi;
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
            /* In slices, so that the page map entries stay small. */
            for (uint64_t at = lo; at < hi && rc == 0; at += 64ULL << 20)
                rc = copy_range(c, at, hi - at < (64ULL << 20) ? hi : at + (64ULL << 20),
                                r->file_same);
        }
        if (rc < 0)
            errmsg(why, cap, rc, "copying the state's pages at %#llx: %s",
                   (unsigned long long)r->lo, strerror(-rc));
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
        const struct region *r = &b->v[j];
        bool keep = r->kind != R_PLAIN || (r->lo < stack_at + IMPORT_STACK && r->hi > stack_at);
        for (size_t i = 0; i < a->n && !keep; i++)
            if (a->v[i].kind == R_PLAIN && same_mapping(&a->v[i], r))
                keep = a->v[i].kept = true;
        if (!keep)
            rc = send_op(sock, BRANCH_OP_MUNMAP, 0, r->lo, r->hi, 0, -1);
    }
    /* The heap where the state's ends. */
    const struct region *heap = find_kind(a, R_HEAP, true);
    const struct region *bheap = find_kind(b, R_HEAP, false);
    if (rc == 0 && heap)
        rc = send_op(sock, BRANCH_OP_BRK, 0, heap->hi, 0, 0, -1);
    else if (rc == 0 && bheap)
        return errmsg(why, cap, -ENOTSUP, "the state has given back all of its heap");
    for (size_t i = 0; i < a->n && rc == 0; i++) {
        struct region *r = &a->v[i];
        if (r->kind == R_HEAP || r->kind == R_STACK) {
            r->kept = true;
            continue;
        }
        if (r->kind == R_KERNEL) {
            /* The kernel's own pages are where the template's were, in
             * every process of it. */
            bool there = false;
            for (size_t j = 0; j < b->n && !there; j++)
                there = b->v[j].kind == R_KERNEL && b->v[j].lo == r->lo && b->v[j].hi == r->hi;
            if (!there)
                return errmsg(why, cap, -ENOTSUP, "the state's vDSO is not where the branch's is");
            r->kept = true;
            continue;
        }
        if (r->kept) {
            r->file_same = r->ino != 0;
            continue;
        }
        if (r->shared)
            return errmsg(why, cap, -ENOTSUP, "the state has a shared mapping at %#llx",
                          (unsigned long long)r->lo);
        r->fresh = true;
        int fd = -1;
        if (r->ino) {
            /* The very file the state maps (the kernel's link to it), if it
             * is on a file system nobody writes: the branch shares its
             * pages, as the state shares them with the template. A file
             * the tenant could write (its workspace) is copied instead, so
             * that no write of the state's reaches the branch. */
            char path[64];
            struct statvfs vfs;
            fmt(path, sizeof(path), "%d/map_files/%llx-%llx", (int)from, (unsigned long long)r->lo,
                (unsigned long long)r->hi);
            fd = openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0 && (fstatvfs(fd, &vfs) < 0 || !(vfs.f_flag & ST_RDONLY)))
                close_fd(&fd);
        }
        r->file_same = fd >= 0;
        rc = send_op(sock, fd >= 0 ? BRANCH_OP_MMAP_FILE : BRANCH_OP_MMAP_ANON, 0, r->lo, r->hi,
                     r->off, fd);
        close_fd(&fd);
    }
    /* The stack, down to where the state's reaches. */
    const struct region *sa = find_kind(a, R_STACK, false), *sb = find_kind(b, R_STACK, false);
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
        if (a.v[i].kind != R_KERNEL)
            rc = copy_region(&c, &a.v[i], why, cap);
    if (rc == 0 && (rc = flush(&c)) < 0)
        errmsg(why, cap, rc, "copying the state's pages: %s", strerror(-rc));
    if (rc < 0)
        goto out;
    char copied = BRANCH_COPIED;
    rc = wire_send(sock, &copied, 1, NULL, 0);
    /* What was mapped for the copy gets the state's protection. */
    for (size_t i = 0; i < a.n && rc == 0; i++)
        if (a.v[i].fresh && a.v[i].prot != (PROT_READ | PROT_WRITE))
            rc = send_op(sock, BRANCH_OP_PROTECT, a.v[i].prot, a.v[i].lo, a.v[i].hi, 0, -1);
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
