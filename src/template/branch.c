#define _GNU_SOURCE
#include "branch.h"

#include "procmaps.h"
#include "pysbx.h"

#include "sysutil.h"
#include "util.h"
#include "wire.h"
#include "worker.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
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
#include <xxhash.h>

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
#define PM_IS_FILE    (1ULL << 2)
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
    bool filled;    /* its pages go in through the branch's userfaultfd */
    bool lazy;      /* and after the branch resumed (branch_fill) */
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

/* The kernel's map of |pid|, in bounded steps (procmaps.h): its text
 * first, since what reads maps here is a copier (a process of its own),
 * or the template its own as it starts (image_layout). */
static int read_map(int proc_fd, pid_t pid, struct map *m, char *why, size_t cap)
{
    struct procmap *v = NULL;
    size_t n = 0;
    int rc = procmaps_read(proc_fd, pid, BRANCH_MAX_REGIONS, true, &v, &n, why, cap);

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

/* The branch's one-byte answer |want|; its failure's words in |why|.
 * With |fd|, the descriptor that may come with it (else -1 there); with
 * |full|, whether the answer was BRANCH_MAPPED_FULL (taken for
 * BRANCH_MAPPED). */
static int hear(int sock, char want, int *fd, bool *full, char *why, size_t cap)
{
    char buf[160];
    struct pollfd p = {.fd = sock, .events = POLLIN};
    int nfds = 0, got = -1;

    if (fd)
        *fd = -1;
    if (poll(&p, 1, STEP_MS) <= 0)
        return errmsg(why, cap, -ETIMEDOUT, "the branch's process did not answer in time");
    ssize_t n = wire_recv(sock, buf, sizeof(buf) - 1, &got, fd ? 1 : 0, &nfds);
    if (full)
        *full = false;
    if (n == 1 && buf[0] == BRANCH_MAPPED_FULL && want == BRANCH_MAPPED) {
        buf[0] = BRANCH_MAPPED;
        if (full)
            *full = true;
    }
    if (n == 1 && buf[0] == want) {
        if (nfds && fd)
            *fd = got;
        return 0;
    }
    if (nfds)
        close(got);
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

/* [lo, hi) added to *v (growing it). */
static int add_range(uint64_t (**v)[2], size_t *n, size_t *room, uint64_t lo, uint64_t hi)
{
    if (*n == *room) {
        size_t c = *room ? *room * 2 : 64;
        void *nv = realloc(*v, c * sizeof(**v));
        if (!nv)
            return -ENOMEM;
        *v = nv;
        *room = c;
    }
    (*v)[*n][0] = lo;
    (*v)[*n][1] = hi;
    (*n)++;
    return 0;
}

/* The ranges of [lo, hi) in which |pm| (a page map) has pages present or
 * swapped, added to *v (growing it); -ENOTTY where the kernel cannot say.
 * The zero page is not among them: it reads as the zeros a page the branch
 * lacks reads as (a state that only read a GiB has nothing to copy). With
 * |anon|, a file's own pages are not either (where both map the same file,
 * only the pages either has made its own can differ). */
static int scan(int pm, uint64_t lo, uint64_t hi, bool anon, uint64_t (**v)[2], size_t *n,
                size_t *room)
{
    uint64_t not = PM_IS_PFNZERO | (anon ? PM_IS_FILE : 0);
    struct pm_region got[256];

    for (uint64_t at = lo; at < hi;) {
        struct pm_scan a = {
            .size = sizeof(a),
            .start = at,
            .end = hi,
            .vec = (uint64_t)(uintptr_t)got,
            .vec_len = sizeof(got) / sizeof(got[0]),
            .category_inverted = not,
            .category_mask = not,
            .category_anyof_mask = PM_IS_PRESENT | PM_IS_SWAPPED,
            .return_mask = PM_IS_PRESENT | PM_IS_SWAPPED,
        };
        int r = ioctl(pm, PM_SCAN, &a);
        if (r < 0)
            return errno == EINVAL || errno == ENOTTY ? -ENOTTY : -errno;
        for (int i = 0; i < r; i++)
            if (add_range(v, n, room, got[i].start, got[i].end) < 0)
                return -ENOMEM;
        if (a.walk_end <= at)
            break;
        at = a.walk_end;
    }
    return 0;
}

/* The ranges of a page map that scan() finds, for every mapping of a state
 * at once: one PAGEMAP_SCAN call per mapping costs a system call and a
 * walk's start each (3 to 4 us here, two hundred of them for a small state
 * and its branch), a call per run of neighbouring mappings only those. */
struct scanned {
    struct pm_region *v; /* in address order */
    size_t n, room;
    bool ok; /* else each mapping is scanned on its own (scan) */
};

/* [lo, hi) of |pm|, into |s| (grown as it fills), each range with whether
 * it is a file's pages if |file| (asking costs the kernel a look at each
 * page's own record: 7.5 ms for a GiB, against 1.6 ms for its page table
 * entries alone). */
static int scan_span(int pm, uint64_t lo, uint64_t hi, bool file, struct scanned *s)
{
    for (uint64_t at = lo; at < hi;) {
        if (s->room - s->n < 256) {
            size_t c = s->room ? s->room * 2 : 1024;
            void *nv = realloc(s->v, c * sizeof(*s->v));
            if (!nv)
                return -ENOMEM;
            s->v = nv;
            s->room = c;
        }
        struct pm_scan a = {
            .size = sizeof(a),
            .start = at,
            .end = hi,
            .vec = (uint64_t)(uintptr_t)(s->v + s->n),
            .vec_len = s->room - s->n,
            .category_inverted = PM_IS_PFNZERO,
            .category_mask = PM_IS_PFNZERO,
            .category_anyof_mask = PM_IS_PRESENT | PM_IS_SWAPPED,
            .return_mask = file ? PM_IS_FILE : PM_IS_PRESENT | PM_IS_SWAPPED,
        };
        int r = ioctl(pm, PM_SCAN, &a);
        if (r < 0)
            return -errno;
        s->n += (size_t)r;
        if (a.walk_end <= at)
            break;
        at = a.walk_end;
    }
    return 0;
}

/* Every mapping of |a| but the kernel's, scanned in |pm| into |s|: in runs
 * of neighbours alike (the branch maps the same file there, or not), so
 * that no call walks the kernel's own mappings and only the first kind
 * asks which pages are a file's. A kernel that cannot (before Linux 6.7),
 * or any failure, leaves |s| not ok: then each mapping is scanned alone,
 * as it fails or is read page by page there. */
static void scan_all(int pm, const struct map *a, struct scanned *s)
{
    s->n = 0;
    s->ok = false;
    for (size_t i = 0; i < a->n;) {
        const struct region *r = &a->v[i];
        if (r->m.kind == PROCMAP_KERNEL) {
            i++;
            continue;
        }
        size_t j = i + 1;
        while (j < a->n && a->v[j].m.kind != PROCMAP_KERNEL && a->v[j].file_same == r->file_same)
            j++;
        if (scan_span(pm, r->m.lo, a->v[j - 1].m.hi, r->file_same, s) < 0)
            return;
        i = j;
    }
    s->ok = true;
}

/* What scan() would add for [lo, hi), taken from |s|. */
static int scanned_take(const struct scanned *s, uint64_t lo, uint64_t hi, bool anon,
                        uint64_t (**v)[2], size_t *n, size_t *room)
{
    size_t first = 0, last = s->n;

    while (first < last) {
        size_t mid = first + (last - first) / 2;
        if (s->v[mid].end <= lo)
            first = mid + 1;
        else
            last = mid;
    }
    for (size_t i = first; i < s->n && s->v[i].start < hi; i++) {
        if (anon && (s->v[i].categories & PM_IS_FILE))
            continue;
        int rc = add_range(v, n, room, s->v[i].start > lo ? s->v[i].start : lo,
                           s->v[i].end < hi ? s->v[i].end : hi);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int cmp_range(const void *x, const void *y)
{
    const uint64_t *a = x, *b = y;
    return a[0] < b[0] ? -1 : a[0] > b[0];
}

static char *ready_buffer; /* branch_buffer_ready's */

/* A buffer of COPY_CHUNK bytes (the one made ready, if any), or NULL. */
static char *buffer_take(void)
{
    char *b = ready_buffer;

    ready_buffer = NULL;
    return b ? b : malloc(COPY_CHUNK);
}

/* |b| (buffer_take's) kept for the next copy, or freed: giving 4 MiB back
 * to the kernel takes a quarter of a millisecond, which a copier (whose
 * answer is awaited, and which ends after it) does not spend before it. */
static void buffer_put(char *b)
{
    if (!ready_buffer)
        ready_buffer = b;
    else
        free(b);
}

/* Runs copied in one pair of system calls, at most (IOV_MAX is 1024). */
#define COPY_BATCH 512

struct copier {
    pid_t to;
    int uffd; /* the branch's userfaultfd (session_import_fd), or -1 */
    /* Where the pages of regions made for the copy are put after the copy
     * resumed (a userfaultfd that takes every fault), else NULL. */
    struct branch_fill *lazy;
    bool filling;   /* the runs batched are in regions it fills */
    uint64_t chunk; /* of buf: the most batched at once */
    int mem_from;   /* the state's /proc/PID/mem */
    int pm_from, pm_to;
    char *buf;
    struct iovec batch[COPY_BATCH]; /* runs waiting, of the state's (and the branch's) */
    size_t n_batch, batched;        /* how many, and their bytes (in buf) */
    uint64_t *ea, *eb;              /* page map entries of a range, for both */
    size_t e_room;
    struct scanned sa, sb; /* the state's pages and the branch's, scanned */
    struct branch_stats *st;
    bool dry; /* a rehearsal's (rehearse): what it batches is dropped */
};

/* Reads [at, at + len) of a stopped process's memory through its
 * /proc/PID/mem (|mem|) into |buf|. Not process_vm_readv: that pins the
 * pages it reads, and the kernel gives a process a private copy of each
 * page it shares before letting it be pinned (gup_must_unshare). A state
 * shares every page with the next cell made of it, so a read that way
 * copied all of it inside the state: a 1 GiB state's read took 650-690 ms
 * instead of 230-290, and the state held 1 GiB more until that cell
 * ended. Of a page the state has alone, either read costs the same. */
static int read_at(int mem, void *buf, uint64_t at, uint64_t len)
{
    for (uint64_t done = 0; done < len;) {
        ssize_t n = pread(mem, (char *)buf + done, len - done, (off_t)(at + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? -errno : -EFAULT;
        done += (uint64_t)n;
    }
    return 0;
}

/* [at, at + len) of the branch written from |src|, a run of a region
 * registered with the branch's userfaultfd (|uffd|, else -1): there the
 * kernel puts a page of its own in place with our bytes (UFFDIO_COPY),
 * where a write would take a fault that zeroes a page and then copy over
 * it (1 GiB: 250-270 ms against 400-480 measured outside pysbx). What it
 * does not put (a page the branch has already, which a region made for
 * the copy does not) is written. */
static int put_pages(const struct copier *c, int uffd, uint64_t at, const char *src, uint64_t len)
{
    for (int tries = 0; uffd >= 0 && len && tries < 8;) {
        struct uffdio_copy cp = {.dst = at, .src = (uint64_t)(uintptr_t)src, .len = len};
        if (ioctl(uffd, UFFDIO_COPY, &cp) == 0)
            return 0;
        if (cp.copy <= 0 && cp.copy != -EAGAIN)
            break;
        if (cp.copy > 0) {
            at += (uint64_t)cp.copy;
            src += cp.copy;
            len -= (uint64_t)cp.copy;
        } else
            tries++;
    }
    struct iovec local = {(void *)src, len}, remote = {(void *)(uintptr_t)at, len};
    errno = 0;
    if (len && process_vm_writev(c->to, &local, 1, &remote, 1, 0) != (ssize_t)len)
        return errno ? -errno : -EFAULT;
    return 0;
}

/* The runs batched, copied through our buffer: read from the state, and
 * written at the same addresses in the branch. */
static int flush(struct copier *c)
{
    struct iovec local = {.iov_base = c->buf, .iov_len = c->batched};
    uint64_t off = 0;

    if (!c->n_batch || c->dry) {
        c->n_batch = c->batched = 0;
        return 0;
    }
    for (size_t i = 0; i < c->n_batch; i++) {
        int rc = read_at(c->mem_from, c->buf + off, (uint64_t)(uintptr_t)c->batch[i].iov_base,
                         c->batch[i].iov_len);
        if (rc < 0)
            return rc;
        off += c->batch[i].iov_len;
    }
    off = 0;
    for (size_t i = 0; c->filling && i < c->n_batch; i++) {
        int rc = put_pages(c, c->uffd, (uint64_t)(uintptr_t)c->batch[i].iov_base, c->buf + off,
                           c->batch[i].iov_len);
        if (rc < 0)
            return rc;
        off += c->batch[i].iov_len;
    }
    errno = 0;
    if (!c->filling &&
        process_vm_writev(c->to, &local, 1, c->batch, c->n_batch, 0) != (ssize_t)c->batched)
        return errno ? -errno : -EFAULT;
    c->st->copied += c->batched / PAGE;
    c->n_batch = c->batched = 0;
    return 0;
}

/* [at, at + len) to be copied (len at most c->chunk). */
static int copy_run(struct copier *c, uint64_t at, uint64_t len)
{
    if (c->n_batch == COPY_BATCH || c->batched + len > c->chunk) {
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
        while (j < n && (j - i) * PAGE < c->chunk && differs(c->ea[j], c->eb[j], file_same))
            j++;
        int rc = copy_run(c, lo + i * PAGE, (j - i) * PAGE);
        if (rc < 0)
            return rc;
        i = j;
    }
    return 0;
}

/* The branch's userfaultfd (|fd|, as it came with BRANCH_MAPPED) made
 * ready, or closed (-1 there) if it is not one, and the copy writes. The
 * branch's process sends it before anything of the tenant's is in it (it
 * is the template's fresh process then), and it is a descriptor of that
 * process's own memory: the worst it could be is not a userfaultfd, which
 * this refuses, and the pages are written as without it. */
static void fill_ready(int *fd, bool *full)
{
    /* One that takes every fault is followed into the processes made of
     * the branch, and through what they unmap, move and give back, so
     * that their pages can be put in after the branch resumed
     * (branch_fill; the fork event takes our CAP_SYS_PTRACE). */
    struct uffdio_api api = {
        .api = UFFD_API,
        .features = full && *full ? UFFD_FEATURE_EVENT_FORK | UFFD_FEATURE_EVENT_REMAP |
                                        UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP
                                  : 0};

    if (*fd >= 0 && ioctl(*fd, UFFDIO_API, &api) < 0) {
        close_fd(fd);
        if (full)
            *full = false;
    }
}

/* Region |r| (mapped for the copy: the branch has no page there)
 * registered with |uffd|, so that UFFDIO_COPY may put pages in it. */
static int fill_register(int uffd, const struct region *r)
{
    struct uffdio_register reg = {.range = {.start = r->m.lo, .len = r->m.hi - r->m.lo},
                                  .mode = UFFDIO_REGISTER_MODE_MISSING};

    return ioctl(uffd, UFFDIO_REGISTER, &reg) < 0 ? -errno : 0;
}

/* Every region filled taken off |*uffd|, which is closed: before the copy
 * resumes, nothing of the branch's waits on a fault of ours, but in the
 * regions filled after it resumed (kept, with |*uffd|, for branch_fill). */
static void fill_end(int *uffd, struct map *a)
{
    bool lazy = false;

    for (size_t i = 0; *uffd >= 0 && i < a->n; i++)
        if (a->v[i].lazy)
            lazy = true;
        else if (a->v[i].filled) {
            struct uffdio_range r = {.start = a->v[i].m.lo, .len = a->v[i].m.hi - a->v[i].m.lo};
            (void)ioctl(*uffd, UFFDIO_UNREGISTER, &r);
            a->v[i].filled = false;
        }
    if (!lazy)
        close_fd(uffd);
}

/* The pages of [lo, hi) of the state's region |r| (all of it, if it was
 * made for the copy) that the branch lacks, copied. */
static int copy_region(struct copier *c, struct region *r, uint64_t lo, uint64_t hi, char *why,
                       size_t cap)
{
    uint64_t(*v)[2] = NULL;
    size_t n = 0, room = 0;
    int rc = c->sa.ok ? scanned_take(&c->sa, lo, hi, r->file_same, &v, &n, &room)
                      : scan(c->pm_from, lo, hi, r->file_same, &v, &n, &room);
    size_t of_state = n;

    /* The branch's own pages there count too: where the state has none,
     * the branch's go. */
    if (rc == 0)
        rc = c->sb.ok ? scanned_take(&c->sb, lo, hi, r->file_same, &v, &n, &room)
                      : scan(c->pm_to, lo, hi, r->file_same, &v, &n, &room);
    /* Where the branch has no page (a mapping made for the copy), every
     * page the scan found of the state's is one the branch lacks: copied
     * without comparing page map entries (for a large state, most of it:
     * 2 MiB of entries for each GiB, read from both page maps). */
    bool lacks = rc == 0 && n == of_state;
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
        rc = add_range(&v, &n, &room, lo, hi);
    }
    /* A region made for the copy, with pages to copy: filled through the
     * branch's userfaultfd if it takes the region (else written). Runs
     * of regions filled and written are not batched together. */
    if (rc == 0 && n && c->uffd >= 0 && r->fresh && !r->file_same && !r->filled)
        r->filled = fill_register(c->uffd, r) == 0;
    if (rc == 0 && n && c->filling != r->filled) {
        rc = flush(c);
        c->filling = r->filled;
    }
    /* Such a region, if the userfaultfd takes every fault: filled after the
     * copy resumed (branch_fill), its runs written down. */
    struct branch_fill *z = rc == 0 && n && lacks && r->filled ? c->lazy : NULL;
    if (z)
        r->lazy = true;
    if (rc == 0) {
        if (n > 1)
            qsort(v, n, sizeof(*v), cmp_range);
        for (size_t i = 0; i < n && rc == 0;) {
            uint64_t lo = v[i][0], hi = v[i][1];
            for (i++; i < n && v[i][0] <= hi; i++)
                if (v[i][1] > hi)
                    hi = v[i][1];
            if (z) {
                rc = add_range(&z->runs, &z->n_runs, &z->runs_room, lo, hi);
                continue;
            }
            /* In slices, so that the page map entries stay small (no
             * address is near the top of the space: procmaps.h). */
            uint64_t slice = lacks ? c->chunk : COPY_SLICE;
            for (uint64_t at = lo, to; at < hi && rc == 0; at = to) {
                to = hi - at < slice ? hi : at + slice;
                rc = lacks ? copy_run(c, at, to - at) : copy_range(c, at, to, r->file_same);
            }
        }
        if (rc < 0)
            errmsg(why, cap, rc, "copying the state's pages at %#llx: %s", (unsigned long long)lo,
                   strerror(-rc));
    } else
        errmsg(why, cap, rc, "reading the page map: %s", strerror(-rc));
    free(v);
    return rc;
}

/* --- the copy, in two threads ------------------------------------------------ */

/* A region the branch kept is copied in this many parts at most, of a
 * MiB at least, so that the two threads end about together. */
#define PARTS_MAX 8
#define PART_MIN  (1ULL << 20)

/* A part of the copy: [lo, hi) of the state's region |r|. */
struct part {
    struct region *r;
    uint64_t lo, hi;
};

/* The work of a copy, shared by its threads: the two scans, then the
 * parts, in address order; each taken by one (|next|, the first not yet
 * taken). */
struct work {
    atomic_int scans_taken, scans_made;
    struct part *v;
    size_t n;
    atomic_size_t next;
};

/* Until *|v| is at least |want|, the CPU given up meanwhile: not slept on
 * (a thread woken by the other may be moved to its CPU, and the two then
 * copy in turn, not at once), unless the other has not come in a
 * millisecond (its CPU taken by something else): then in naps of 50 us,
 * not to burn ours. */
static void await_count(atomic_int *v, int want)
{
    uint64_t until = now_ns() + 1000000ULL;

    while (atomic_load(v) < want)
        if (now_ns() < until)
            sched_yield();
        else
            usleep(50);
}

/* Both page maps scanned, into |c| (the first thread's copier): each by
 * the thread that takes it first, then the other's waited for. */
static void scan_both(struct copier *c, const struct map *a, struct work *w)
{
    for (int k; (k = atomic_fetch_add(&w->scans_taken, 1)) < 2;) {
        if (k == 0)
            scan_all(c->pm_from, a, &c->sa);
        else
            scan_all(c->pm_to, a, &c->sb);
        atomic_fetch_add(&w->scans_made, 1);
    }
    await_count(&w->scans_made, 2);
}

/* The parts of |w| copied with |c|, each the next not yet taken, and
 * each part's pages written before the next is taken (so that the thread
 * that found more to copy does not end long after the other). */
static int copy_parts(struct copier *c, struct work *w, char *why, size_t cap)
{
    int rc = 0;

    for (size_t i; rc == 0 && (i = atomic_fetch_add(&w->next, 1)) < w->n;)
        if ((rc = copy_region(c, w->v[i].r, w->v[i].lo, w->v[i].hi, why, cap)) == 0 &&
            (rc = flush(c)) < 0)
            errmsg(why, cap, rc, "copying the state's pages: %s", strerror(-rc));
    return rc;
}

/* The second thread of a copy, with a copier of its own (half the buffer;
 * its batch, page map entries, runs to put in after the branch resumed
 * and counts), the descriptors and, once made, the scans shared: it
 * scans one page map as the first thread scans the other. */
struct half {
    struct copier c;
    struct copier *first;
    struct map *a;
    struct work *w;
    struct branch_fill later; /* its runs (c.lazy) */
    struct branch_stats st;
    int rc;
    char why[256];
    atomic_int done; /* 1: the second thread is done with it */
};

static void half_main(struct half *h)
{
    scan_both(h->first, h->a, h->w);
    h->c.sa = h->first->sa;
    h->c.sb = h->first->sb;
    h->rc = copy_parts(&h->c, h->w, h->why, sizeof(h->why));
}

/* The copier's second thread, made as the copier waits for its first job
 * (branch_buffer_ready) and kept: made for each copy, it cost 0.1 ms to
 * start and as much to be joined, on the copy's way. It waits for a
 * copy's half (|job|), does it, says so (done), and waits again. It
 * never runs anything of a tenant's: it reads and writes the memory of
 * the state and the branch as the first thread does. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct half *job;
    pthread_t th;
    bool made;
} helper = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void *helper_main(void *unused)
{
    (void)unused;
    for (;;) {
        pthread_mutex_lock(&helper.mu);
        while (!helper.job)
            pthread_cond_wait(&helper.cv, &helper.mu);
        struct half *h = helper.job;
        helper.job = NULL;
        pthread_mutex_unlock(&helper.mu);
        half_main(h);
        atomic_store(&h->done, 1);
    }
    return NULL;
}

static void helper_start(void)
{
    if (!helper.made)
        helper.made = pthread_create(&helper.th, NULL, helper_main, NULL) == 0;
}

/* |h| given to the second thread, which may run on any CPU we may use but
 * the one we are on (there it would only take turns with us): false if
 * there is none, or no second thread. */
static bool helper_give(struct half *h)
{
    cpu_set_t cpus;
    int here = sched_getcpu();

    if (!helper.made || here < 0 || here >= CPU_SETSIZE ||
        sched_getaffinity(0, sizeof(cpus), &cpus) < 0)
        return false;
    CPU_CLR(here, &cpus);
    if (CPU_COUNT(&cpus) == 0 || pthread_setaffinity_np(helper.th, sizeof(cpus), &cpus) != 0)
        return false;
    pthread_mutex_lock(&helper.mu);
    helper.job = h;
    pthread_cond_signal(&helper.cv);
    pthread_mutex_unlock(&helper.mu);
    return true;
}

/* The regions of |a| but the kernel's, as parts: one of a region made for
 * the copy (what it gets is the region's as a whole: filled, or not),
 * else up to PARTS_MAX. Only a region the branch kept (the template's own
 * mapping, as the template maps it) is cut: the tenant makes no more
 * parts than mappings. */
static int parts_of(const struct map *a, struct work *w)
{
    size_t room = 0;

    for (size_t i = 0; i < a->n; i++) {
        struct region *r = &a->v[i];
        if (r->m.kind == PROCMAP_KERNEL)
            continue;
        uint64_t len = r->m.hi - r->m.lo, parts = r->kept ? len / PART_MIN : 1;
        parts = parts < 1 ? 1 : parts > PARTS_MAX ? PARTS_MAX : parts;
        uint64_t step = (len / parts + PAGE - 1) & ~(PAGE - 1);
        if (w->n + parts > room) {
            size_t c = room ? room * 2 : 256;
            c = c < w->n + parts ? w->n + parts : c;
            void *nv = realloc(w->v, c * sizeof(*w->v));
            if (!nv)
                return -ENOMEM;
            w->v = nv;
            room = c;
        }
        for (uint64_t at = r->m.lo; at < r->m.hi; at += step)
            w->v[w->n++] =
                (struct part){.r = r, .lo = at, .hi = r->m.hi - at < step ? r->m.hi : at + step};
    }
    return 0;
}

/* Both page maps scanned (c->sa, c->sb), and every region of |a| but the
 * kernel's copied with |c| (fresh: nothing batched, no page map entries
 * read, which the second thread's copier, a copy of it, starts from too):
 * by two threads at once, each scanning one
 * page map, then taking the next part not yet taken, which shortens the
 * copy where a second CPU is free (the work, and the CPU it costs us,
 * are the same; without a second thread or CPU, this one does it all).
 * Returns 0, or -errno with |why|. */
static int copy_all(struct copier *c, struct map *a, char *why, size_t cap)
{
    struct work w = {0};
    struct half *h = malloc(sizeof(*h));
    bool threaded = false;
    int rc = parts_of(a, &w);

    if (rc < 0) {
        rc = errmsg(why, cap, -ENOMEM, "template: out of memory");
        goto out;
    }
    if (h) {
        *h = (struct half){.c = *c, .first = c, .a = a, .w = &w, .later = {.uffd = -1, .mem = -1}};
        h->c.chunk = COPY_CHUNK / 2;
        h->c.buf = c->buf + COPY_CHUNK / 2;
        h->c.lazy = c->lazy ? &h->later : NULL;
        h->c.st = &h->st;
        if ((threaded = helper_give(h)))
            c->chunk = COPY_CHUNK / 2; /* the other half is its */
    }
    /* Scanned once, before any page is written: the state is stopped and
     * the branch's process waits for our word, so neither changes its
     * mappings or pages meanwhile, and what the copy writes in one
     * mapping changes nothing the scans say of another. */
    scan_both(c, a, &w);
    rc = copy_parts(c, &w, why, cap);
    if (!threaded)
        goto out;
    await_count(&h->done, 1);
    if (rc == 0 && h->rc < 0) {
        rc = h->rc;
        fmt(why, cap, "%s", h->why);
    }
    c->st->copied += h->st.copied;
    /* The runs to put in after, both threads', in address order again. */
    for (size_t k = 0; rc == 0 && k < h->later.n_runs; k++)
        if (add_range(&c->lazy->runs, &c->lazy->n_runs, &c->lazy->runs_room, h->later.runs[k][0],
                      h->later.runs[k][1]) < 0)
            rc = errmsg(why, cap, -ENOMEM, "template: out of memory");
    if (rc == 0 && h->later.n_runs)
        qsort(c->lazy->runs, c->lazy->n_runs, sizeof(*c->lazy->runs), cmp_range);
out:
    c->chunk = COPY_CHUNK;
    if (h) {
        free(h->later.runs);
        free(h->c.ea);
        free(h->c.eb);
        free(h);
    }
    free(w.v);
    return rc;
}

/* What |c| holds, released (its buffer kept for the next copy). */
static void copier_free(struct copier *c)
{
    close_fd(&c->uffd);
    close_fd(&c->pm_from);
    close_fd(&c->pm_to);
    close_fd(&c->mem_from);
    if (c->buf)
        buffer_put(c->buf);
    c->buf = NULL;
    free(c->ea);
    free(c->eb);
    free(c->sa.v);
    free(c->sb.v);
    c->ea = c->eb = NULL;
    c->sa.v = c->sb.v = NULL;
}

/* A copy of our own memory onto itself, compared and not written: made
 * by a copier while it waits for its first job (branch_buffer_ready).
 * A copier's first copy took its two threads two to three times the CPU
 * of its next (the first branch of a small state 7 ms, the next 3.5, on
 * a machine whose faults are dear): their first allocations of a copy's
 * sizes (the maps, the scans, the page map entries) are pages written for
 * the first time, or pages of the template's heap written by us for the
 * first time, a fault each (85 in a first copy, none in the next). The
 * same allocations made and freed here are in our heap when the copy
 * makes them. Both page maps compared are ours, so no page differs but
 * what changed between the two reads; |dry| drops whatever is batched,
 * so nothing is read or written. Best effort: a failure is the first
 * copy's slowness only. */
static void rehearse(int proc_fd)
{
    struct map a = {0}, b = {0}; /* a copy reads two maps: the state's, the branch's */
    struct branch_stats st = {0};
    struct copier c = {.uffd = -1, .mem_from = -1, .chunk = COPY_CHUNK, .st = &st, .dry = true};
    char path[32], why[128];
    /* Our number as |proc_fd|'s pid namespace, not ours, numbers us. */
    ssize_t len = readlinkat(proc_fd, "self", path, sizeof(path) - 1);

    if (len <= 0)
        return;
    path[len] = '\0';
    c.to = (pid_t)strtol(path, NULL, 10);
    fmt(path, sizeof(path), "%d/pagemap", (int)c.to);
    c.pm_from = openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
    c.pm_to = openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
    c.buf = buffer_take();
    if (c.pm_from >= 0 && c.pm_to >= 0 && c.buf &&
        read_map(proc_fd, c.to, &a, why, sizeof(why)) == 0 &&
        read_map(proc_fd, c.to, &b, why, sizeof(why)) == 0) {
        /* As a branch that maps what the state maps has them. */
        for (size_t i = 0; i < a.n; i++) {
            a.v[i].kept = true;
            a.v[i].file_same = a.v[i].m.ino != 0;
        }
        (void)copy_all(&c, &a, why, sizeof(why));
    }
    copier_free(&c);
    map_free(&a);
    map_free(&b);
}

void branch_buffer_ready(int proc_fd)
{
    helper_start();
    if (ready_buffer || !(ready_buffer = malloc(COPY_CHUNK)))
        return;
    /* Each page written (not a memset, which a compiler may fold into a
     * calloc that writes nothing). */
    for (size_t at = 0; at < COPY_CHUNK; at += PAGE)
        ((volatile char *)ready_buffer)[at] = 0;
    rehearse(proc_fd);
}

/* --- the plan ----------------------------------------------------------------- */

/* A mapping of |t| of the file |m| maps, at its offset, as long. */
static const struct procmap *same_file(const struct map *t, const struct procmap *m)
{
    for (size_t i = 0; t && i < t->n; i++) {
        const struct procmap *r = &t->v[i].m;
        if (r->ino == m->ino && r->dev_major == m->dev_major && r->dev_minor == m->dev_minor &&
            r->off == m->off && r->hi - r->lo == m->hi - m->lo && !r->shared)
            return r;
    }
    return NULL;
}

/* The branch's map made the state's, but for the stack's size and the
 * pages. |from| is the state's process, whose files of read-only mounts the
 * branch maps too; without one (an image), a mapping of a file the
 * template |tmpl| maps (|t|) is the template's file, and any other file's
 * is memory of its own. */
static int map_like(int proc_fd, pid_t from, const struct map *t, pid_t tmpl, int sock,
                    struct map *a, const struct map *b, uint64_t stack_at, char *why, size_t cap)
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
        /* An image's mapping of a file the template maps too, elsewhere
         * (where a module its warm imports loaded went): the template's. */
        const struct procmap *there = from > 0 || !r->m.ino ? NULL : same_file(t, &r->m);
        if (there || (r->m.ino && from > 0)) {
            /* The very file the state maps (the kernel's link to it), if it
             * is on a file system nobody writes: the branch shares its
             * pages, as the state shares them with the template. A file
             * the tenant could write (its workspace) is copied instead, so
             * that no write of the state's reaches the branch. */
            char path[64];
            struct statvfs vfs;
            fmt(path, sizeof(path), "%d/map_files/%llx-%llx", (int)(there ? tmpl : from),
                (unsigned long long)(there ? there->lo : r->m.lo),
                (unsigned long long)(there ? there->hi : r->m.hi));
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

/* The pages are in: what was mapped for the copy gets the state's
 * protection, and the copy resumes. */
static int resume(int sock, const struct map *a, char *why, size_t cap)
{
    char copied = BRANCH_COPIED;
    int rc = wire_send(sock, &copied, 1, NULL, 0);

    for (size_t i = 0; i < a->n && rc == 0; i++)
        if (a->v[i].fresh && a->v[i].m.prot != (PROT_READ | PROT_WRITE))
            rc =
                send_op(sock, BRANCH_OP_PROTECT, a->v[i].m.prot, a->v[i].m.lo, a->v[i].m.hi, 0, -1);
    if (rc == 0)
        rc = send_op(sock, BRANCH_OP_END, 0, 0, 0, 0, -1);
    if (rc < 0)
        errmsg(why, cap, rc, "the branch's process does not listen: %s", strerror(-rc));
    return rc;
}

/* The branch's first process at its import: its map read, the stack it
 * imports on placed (told to it), and its map made |a|'s. */
static int prepare_import(int proc_fd, pid_t from, const struct map *t, pid_t tmpl, pid_t to,
                          int sock, struct map *a, struct map *b, int *uffd, bool *full, char *why,
                          size_t cap)
{
    int rc = read_map(proc_fd, to, b, why, cap);

    if (rc < 0)
        return rc;
    uint64_t stack_at = import_stack_at(a, b);
    if (!stack_at)
        return errmsg(why, cap, -ENOMEM, "no room for the branch's import stack");
    if ((rc = send_op(sock, BRANCH_STACK, 0, stack_at, stack_at + IMPORT_STACK, 0, -1)) < 0)
        return errmsg(why, cap, rc, "the branch's process does not listen: %s", strerror(-rc));
    if ((rc = map_like(proc_fd, from, t, tmpl, sock, a, b, stack_at, why, cap)) < 0)
        return rc;
    if ((rc = hear(sock, BRANCH_MAPPED, uffd, full, why, cap)) == 0)
        fill_ready(uffd, full);
    return rc;
}

int branch_copy(int proc_fd, const struct branch_pids *p, int sock, struct branch_fill *lazy,
                struct branch_stats *st, char *why, size_t cap)
{
    struct map a = {0}, b = {0};
    struct copier c = {.to = p->vm_to,
                       .uffd = -1,
                       .mem_from = -1,
                       .pm_from = -1,
                       .pm_to = -1,
                       .chunk = COPY_CHUNK,
                       .st = st};
    pid_t from = p->from, to = p->to;
    char path[32];
    bool full = false;
    int rc;

    memset(st, 0, sizeof(*st));
    *lazy = (struct branch_fill){.uffd = -1, .mem = -1};
    if ((rc = read_map(proc_fd, from, &a, why, cap)) < 0 ||
        (rc = prepare_import(proc_fd, from, NULL, 0, to, sock, &a, &b, &c.uffd, &full, why, cap)) <
            0)
        goto out;
    if (c.uffd >= 0 && full)
        c.lazy = lazy;
    st->regions = a.n;
    fmt(path, sizeof(path), "%d/pagemap", (int)from);
    c.pm_from = openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
    fmt(path, sizeof(path), "%d/pagemap", (int)to);
    c.pm_to = openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
    fmt(path, sizeof(path), "%d/mem", (int)from);
    c.mem_from = openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
    c.buf = buffer_take();
    if (c.pm_from < 0 || c.pm_to < 0 || c.mem_from < 0 || !c.buf) {
        rc = errmsg(why, cap, c.buf ? -errno : -ENOMEM,
                    "opening the page maps and the state's memory: %s",
                    c.buf ? strerror(errno) : "out of memory");
        goto out;
    }
    if ((rc = copy_all(&c, &a, why, cap)) < 0)
        goto out;
    fill_end(&c.uffd, &a);
    if (lazy->n_runs) {
        /* What the fill needs, kept past the copy. */
        lazy->uffd = c.uffd;
        lazy->mem = c.mem_from;
        lazy->buf = c.buf;
        c.uffd = c.mem_from = -1;
        c.buf = NULL;
    }
    rc = resume(sock, &a, why, cap);
out:
    if (rc < 0)
        branch_fill_free(lazy);
    copier_free(&c);
    map_free(&a);
    map_free(&b);
    return rc;
}

/* --- the pages filled after the branch resumed ------------------------------ */

/* A step of the fill: between two, the faults waiting are served (so a
 * fault waits for one step at most, about half a millisecond). */
#define FILL_STEP (1ULL << 20)
/* What a fault gets: the 64 KiB around its page, of the run it is in. */
#define FAULT_CHUNK (64ULL << 10)
/* The most processes, and pieces of one's memory, the fill follows: past
 * them the branch ends (its code forked, or moved and gave back its
 * memory, more than any program does while a copy is made). */
#define FILL_MAX_MMS    256
#define FILL_MAX_PIECES 65536

/* A part of a process's memory that no longer reads as the state's at the
 * same address: zeros from now on (gone: given back, unmapped, or moved
 * away), or the state's pages from |src| on (moved there by mremap). */
struct piece {
    uint64_t lo, hi, src;
    uint64_t done; /* moved: how far from lo its pages are in (at least) */
    bool gone;
};

/* The memory of a process the copier puts pages in (its userfaultfd): the
 * branch's first process, and each fork made of one before all of its
 * pages were in (the fork event gives its child's descriptor). */
struct fill_mm {
    int uffd;
    struct piece *p;
    size_t n, room;
    size_t run;   /* the pass over the state's runs: the next one, */
    uint64_t off; /* and how far into it */
    bool done;    /* every page of the state's is in (or its place gone) */
    bool dead;    /* its process has ended (ESRCH) */
};

void branch_fill_free(struct branch_fill *f)
{
    for (size_t i = 0; i < f->n_mm; i++) {
        close_fd(&f->mm[i].uffd);
        free(f->mm[i].p);
    }
    free(f->mm);
    close_fd(&f->uffd);
    close_fd(&f->mem);
    if (f->buf)
        buffer_put(f->buf);
    free(f->runs);
    *f = (struct branch_fill){.uffd = -1, .mem = -1};
}

/* [at, at + len) of the memory of |uffd| put in from |src| where it has no
 * page yet. A page there already was put by a fault (or, after a
 * MADV_DONTNEED, by the process's own code): it is left as it is, never
 * written over. A page no longer registered (unmapped, or moved: an event
 * says where) is skipped. Returns 0; -EAGAIN while an event of its
 * memory waits to be read (the kernel puts nothing in until it is: what
 * was done stays done); -ESRCH once its process has ended; else -errno. */
static int fill_put(int uffd, uint64_t at, const char *src, uint64_t len)
{
    while (len) {
        struct uffdio_copy cp = {.dst = at, .src = (uint64_t)(uintptr_t)src, .len = len};
        if (ioctl(uffd, UFFDIO_COPY, &cp) == 0)
            return 0;
        int64_t done = cp.copy > 0 ? cp.copy : 0;
        int e = cp.copy < 0 ? (int)-cp.copy : errno;
        if (!done && (e == EEXIST || e == ENOENT))
            done = PAGE;
        else if (!done)
            return -e;
        at += (uint64_t)done;
        src += done;
        len -= (uint64_t)done;
    }
    return 0;
}

/* The state's bytes of [src, src + len) put at [dst, dst + len) of |m|,
 * through our buffer (len at most COPY_CHUNK). */
static int fill_from(struct branch_fill *f, struct fill_mm *m, uint64_t dst, uint64_t src,
                     uint64_t len)
{
    int rc = read_at(f->mem, f->buf, src, len);

    return rc < 0 ? rc : fill_put(m->uffd, dst, f->buf, len);
}

/* The run of the state's that holds |at|, or the first after it (n_runs
 * if none). */
static size_t run_from(const struct branch_fill *f, uint64_t at)
{
    size_t lo = 0, hi = f->n_runs;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (f->runs[mid][1] <= at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The state's pages of [src, src + len) put at dst + (s - src) in |m|,
 * the runs of it the state has. */
static int fill_runs(struct branch_fill *f, struct fill_mm *m, uint64_t dst, uint64_t src,
                     uint64_t len)
{
    for (size_t i = run_from(f, src); i < f->n_runs && f->runs[i][0] < src + len; i++) {
        uint64_t lo = f->runs[i][0] > src ? f->runs[i][0] : src;
        uint64_t hi = f->runs[i][1] < src + len ? f->runs[i][1] : src + len;
        int rc = fill_from(f, m, dst + (lo - src), lo, hi - lo);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* The first piece of |m| that ends past |at| (m->n if none). */
static size_t piece_from(const struct fill_mm *m, uint64_t at)
{
    size_t lo = 0, hi = m->n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->p[mid].hi <= at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The piece of |m| that holds |at| split there (nothing if none does). */
static int piece_cut(struct fill_mm *m, uint64_t at)
{
    size_t i = piece_from(m, at);

    if (i == m->n || m->p[i].lo >= at)
        return 0;
    if (m->n == m->room) {
        size_t c = m->room ? m->room * 2 : 16;
        if (c > FILL_MAX_PIECES)
            return -E2BIG;
        void *nv = realloc(m->p, c * sizeof(*m->p));
        if (!nv)
            return -ENOMEM;
        m->p = nv;
        m->room = c;
    }
    memmove(&m->p[i + 1], &m->p[i], (m->n - i) * sizeof(*m->p));
    m->n++;
    struct piece *l = &m->p[i], *r = &m->p[i + 1];
    uint64_t left = at - l->lo;
    l->hi = r->lo = at;
    r->src = l->gone ? 0 : l->src + left;
    r->done = l->done > left ? l->done - left : 0;
    l->done = l->done < left ? l->done : left;
    return 0;
}

/* [lo, hi) of |m| made |with| (|n| pieces in order, within it; gaps read
 * as the state's at the same address). */
static int piece_set(struct fill_mm *m, uint64_t lo, uint64_t hi, const struct piece *with,
                     size_t n)
{
    int rc = piece_cut(m, lo);

    if (rc == 0)
        rc = piece_cut(m, hi);
    if (rc < 0)
        return rc;
    size_t i = piece_from(m, lo), j = i;
    while (j < m->n && m->p[j].hi <= hi)
        j++;
    size_t want = m->n - (j - i) + n;
    if (want > FILL_MAX_PIECES)
        return -E2BIG;
    if (want > m->room) {
        void *nv = realloc(m->p, want * sizeof(*m->p));
        if (!nv)
            return -ENOMEM;
        m->p = nv;
        m->room = want;
    }
    memmove(&m->p[i + n], &m->p[j], (m->n - j) * sizeof(*m->p));
    memcpy(&m->p[i], with, n * sizeof(*with));
    m->n = want;
    return 0;
}

/* [lo, hi) of |m| given back, unmapped or moved away: zeros from now on. */
static int piece_gone(struct fill_mm *m, uint64_t lo, uint64_t hi)
{
    struct piece g = {.lo = lo, .hi = hi, .gone = true};

    return lo < hi ? piece_set(m, lo, hi, &g, 1) : 0;
}

/* |len| bytes of |m| moved from |from| to |to| (mremap): what read as the
 * state's pages at |from| on reads as them at |to| on. */
static int piece_moved(struct fill_mm *m, uint64_t from, uint64_t to, uint64_t len)
{
    uint64_t hi = from + len;
    struct piece *v = malloc((2 * (m->n + 1)) * sizeof(*v));
    size_t n = 0;
    int rc = 0;

    if (!v)
        return -ENOMEM;
    for (uint64_t at = from; at < hi;) {
        size_t i = piece_from(m, at);
        struct piece q = {.lo = at, .hi = hi, .src = at};
        if (i < m->n && m->p[i].lo <= at) {
            q = m->p[i];
            q.src = q.gone ? 0 : q.src + (at - q.lo);
            q.lo = at;
            q.hi = q.hi < hi ? q.hi : hi;
        } else if (i < m->n && m->p[i].lo < hi)
            q.hi = m->p[i].lo;
        q.done = 0;
        at = q.hi;
        q.lo += to - from;
        q.hi += to - from;
        v[n++] = q;
    }
    rc = piece_gone(m, from, hi);
    if (rc == 0)
        rc = piece_set(m, to, to + len, v, n);
    free(v);
    return rc;
}

/* A process forked of |parent|: its memory read as its parent's did. */
static int mm_forked(struct branch_fill *f, size_t parent, int uffd)
{
    int fl = fcntl(uffd, F_GETFL);

    if (fl < 0 || fcntl(uffd, F_SETFL, fl | O_NONBLOCK) < 0 || f->n_mm == FILL_MAX_MMS) {
        close(uffd);
        return f->n_mm == FILL_MAX_MMS ? -EMLINK : -errno;
    }
    if (f->n_mm == f->mm_room) {
        size_t c = f->mm_room ? f->mm_room * 2 : 8;
        void *nv = realloc(f->mm, c * sizeof(*f->mm));
        if (!nv) {
            close(uffd);
            return -ENOMEM;
        }
        f->mm = nv;
        f->mm_room = c;
    }
    struct fill_mm *m = &f->mm[f->n_mm], *p = parent < f->n_mm ? &f->mm[parent] : NULL;
    *m = (struct fill_mm){.uffd = uffd};
    f->n_mm++;
    if (!p)
        return 0;
    /* A fork of a process whose pages were all in has them all. */
    m->done = p->done;
    if (p->n) {
        m->p = malloc(p->n * sizeof(*m->p));
        if (!m->p)
            return -ENOMEM;
        memcpy(m->p, p->p, p->n * sizeof(*m->p));
        m->n = m->room = p->n;
        for (size_t i = 0; i < m->n; i++)
            m->p[i].done = 0;
    }
    return 0;
}

/* A fault of |m|'s at |addr| served: with the state's pages around it
 * (64 KiB of them at most, that read the same way), or a page of zeros
 * where the state had none or its place is gone. */
static int serve_fault(struct branch_fill *f, struct fill_mm *m, uint64_t addr)
{
    uint64_t page = addr & ~(PAGE - 1), lo = page & ~(FAULT_CHUNK - 1), hi = lo + FAULT_CHUNK;
    size_t i = piece_from(m, page);
    uint64_t delta = 0;
    bool zero = false;
    int rc = 0;

    if (i < m->n && m->p[i].lo <= page) {
        zero = m->p[i].gone;
        delta = m->p[i].src - m->p[i].lo;
        lo = lo > m->p[i].lo ? lo : m->p[i].lo;
        hi = hi < m->p[i].hi ? hi : m->p[i].hi;
    } else {
        if (i < m->n && m->p[i].lo < hi)
            hi = m->p[i].lo;
        if (i > 0 && m->p[i - 1].hi > lo)
            lo = m->p[i - 1].hi;
    }
    size_t r = zero ? f->n_runs : run_from(f, page + delta);
    if (r < f->n_runs && f->runs[r][0] <= page + delta) {
        lo = lo + delta > f->runs[r][0] ? lo : f->runs[r][0] - delta;
        hi = hi + delta < f->runs[r][1] ? hi : f->runs[r][1] - delta;
        rc = fill_from(f, m, lo, lo + delta, hi - lo);
    } else {
        struct uffdio_zeropage z = {.range = {.start = page, .len = PAGE}};
        if (ioctl(m->uffd, UFFDIO_ZEROPAGE, &z) < 0 && errno != EEXIST && errno != ENOENT)
            rc = -errno;
    }
    if (rc < 0)
        return rc;
    /* It may have been put already: whoever waits on it goes on. */
    struct uffdio_range w = {.start = page, .len = PAGE};
    (void)ioctl(m->uffd, UFFDIO_WAKE, &w);
    return 0;
}

/* An event of |f->mm[k]|'s memory followed. */
static int follow(struct branch_fill *f, size_t k, const struct uffd_msg *e)
{
    switch (e->event) {
    case UFFD_EVENT_FORK:
        return mm_forked(f, k, (int)e->arg.fork.ufd);
    case UFFD_EVENT_REMAP:
        return piece_moved(&f->mm[k], e->arg.remap.from, e->arg.remap.to, e->arg.remap.len);
    case UFFD_EVENT_REMOVE:
    case UFFD_EVENT_UNMAP:
        return piece_gone(&f->mm[k], e->arg.remove.start & ~(PAGE - 1),
                          (e->arg.remove.end + PAGE - 1) & ~(PAGE - 1));
    default:
        return -EPROTO;
    }
}

/* What waits on |f->mm[k]|'s descriptor, read and done: its events (a
 * fork, a range moved, given back or unmapped) followed in order, its
 * faults served after the events read with them (the map they fault in
 * is the one the events made; one that meets an event not read yet is
 * served once it is). Returns 0, or -errno.
 *
 * Who says these is a process of the branch's, which runs the tenant's
 * code: what it can make us do is follow its forks and moves (each a
 * process or a piece more, bounded: FILL_MAX_MMS, FILL_MAX_PIECES, past
 * which the branch ends) and fault on its own pages in any order (each
 * fault a copy of 64 KiB at most, a fault waiting once per thread), all
 * on this process's CPU, which is bounded: the session ends when it runs
 * out. What it gets is pages of the state it is a copy of, or zeros, in
 * its own memory. */
static int serve(struct branch_fill *f, size_t k)
{
    struct uffd_msg msg[16];
    uint64_t *wait = NULL;
    size_t n_wait = 0, room = 0;
    int rc = 0;

    for (int idle = 0; rc == 0 && !f->mm[k].dead;) {
        ssize_t n = read(f->mm[k].uffd, msg, sizeof(msg));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            if (!n_wait)
                break;
            /* A fault that met an event not yet read: wait for it (the
             * kernel queues it as the change it reports ends). */
            if (++idle > 2000) {
                rc = -ETIMEDOUT;
                break;
            }
            struct pollfd p = {.fd = f->mm[k].uffd, .events = POLLIN};
            (void)poll(&p, 1, 1);
        } else if (n <= 0 || n % (ssize_t)sizeof(msg[0])) {
            rc = n < 0 ? -errno : -EIO;
            break;
        }
        for (ssize_t i = 0; n > 0 && i < n / (ssize_t)sizeof(msg[0]) && rc == 0; i++) {
            if (msg[i].event != UFFD_EVENT_PAGEFAULT) {
                rc = follow(f, k, &msg[i]);
                continue;
            }
            if (n_wait == room) {
                size_t c = room ? room * 2 : 16;
                void *nv = realloc(wait, c * sizeof(*wait));
                if (!nv) {
                    rc = -ENOMEM;
                    break;
                }
                wait = nv;
                room = c;
            }
            wait[n_wait++] = msg[i].arg.pagefault.address;
        }
        size_t kept = 0;
        for (size_t i = 0; i < n_wait && rc == 0; i++) {
            int r = serve_fault(f, &f->mm[k], wait[i]);
            if (r == -EAGAIN)
                wait[kept++] = wait[i];
            else if (r == -ESRCH)
                f->mm[k].dead = true;
            else
                rc = r;
        }
        n_wait = f->mm[k].dead ? 0 : kept;
    }
    free(wait);
    return rc;
}

/* One step of |m|'s fill: 1 MiB of the state's pages, where they read as
 * the state's at the same address, or else (the first pass done) in a
 * piece moved there. Returns 0 (|m| done once nothing is left), -EAGAIN
 * (an event to read first: the step is taken again), or -errno. */
static int fill_step(struct branch_fill *f, struct fill_mm *m)
{
    if (m->run < f->n_runs) {
        uint64_t at = f->runs[m->run][0] + m->off;
        uint64_t len = f->runs[m->run][1] - at < FILL_STEP ? f->runs[m->run][1] - at : FILL_STEP;
        /* Less what a piece says reads otherwise. */
        uint64_t end = at + len;
        for (size_t i = piece_from(m, at); at < end;) {
            if (i < m->n && m->p[i].lo <= at) {
                at = m->p[i++].hi;
                continue;
            }
            uint64_t to = i < m->n && m->p[i].lo < end ? m->p[i].lo : end;
            int rc = fill_from(f, m, at, at, to - at);
            if (rc < 0)
                return rc;
            at = to;
        }
        m->off += len;
        if (f->runs[m->run][0] + m->off >= f->runs[m->run][1]) {
            m->run++;
            m->off = 0;
        }
        return 0;
    }
    for (size_t i = 0; i < m->n; i++) {
        struct piece *q = &m->p[i];
        if (q->gone || q->done >= q->hi - q->lo)
            continue;
        uint64_t len = q->hi - q->lo - q->done < FILL_STEP ? q->hi - q->lo - q->done : FILL_STEP;
        int rc = fill_runs(f, m, q->lo + q->done, q->src + q->done, len);
        if (rc < 0)
            return rc;
        q->done += len;
        return 0;
    }
    m->done = true;
    return 0;
}

int branch_fill(struct branch_fill *f, char *why, size_t cap)
{
    int rc = mm_forked(f, (size_t)-1, f->uffd);

    f->uffd = -1; /* the first process's, now f->mm[0]'s */
    /* The processes in the order they were made: the branch's first
     * before the cells made of it, a cell kept before its own forks. */
    for (int quiet = 0; rc == 0;) {
        for (size_t k = 0; k < f->n_mm && rc == 0; k++)
            if (!f->mm[k].dead)
                rc = serve(f, k);
        size_t k = 0;
        while (k < f->n_mm && (f->mm[k].done || f->mm[k].dead))
            k++;
        if (rc < 0)
            break;
        if (k == f->n_mm) {
            /* All in: a last look for a fork of one not yet followed. */
            if (quiet++)
                break;
            struct pollfd p[64];
            size_t np = 0;
            for (size_t i = 0; i < f->n_mm && np < 64; i++)
                if (!f->mm[i].dead)
                    p[np++] = (struct pollfd){.fd = f->mm[i].uffd, .events = POLLIN};
            (void)poll(p, np, 2);
            continue;
        }
        quiet = 0;
        rc = fill_step(f, &f->mm[k]);
        if (rc == -EAGAIN) {
            rc = 0;
            struct pollfd p = {.fd = f->mm[k].uffd, .events = POLLIN};
            (void)poll(&p, 1, 1);
        } else if (rc == -ESRCH) {
            f->mm[k].dead = true;
            rc = 0;
        }
    }
    if (rc < 0)
        errmsg(why, cap, rc, "copying the state's pages after the branch resumed: %s",
               rc == -E2BIG || rc == -EMLINK
                   ? "the branch's processes forked, moved or gave back more than the copy "
                     "follows"
                   : strerror(-rc));
    /* Closed at our end: a process's pages still missing then are those
     * the state did not have or whose place is gone, which the kernel
     * gives as zeros once nothing is registered. */
    return rc;
}

/* --- images ------------------------------------------------------------------- */

#define IMAGE_MAGIC   "PYSBXMEM"
#define IMAGE_END     0x646e652d78627370ULL /* "psbx-end" */
#define IMAGE_VERSION 1

enum image_how {
    IMG_PAGES,    /* the pages the image holds; the rest zeros (or its file's: every page held) */
    IMG_TEMPLATE, /* the template's own mapping of a file: the restoring process has it */
    IMG_KERNEL,   /* the kernel's pages (vDSO): where every process of the template has them */
};

struct image_head {
    char magic[8];
    uint32_t version, n_regions;
    uint64_t layout;   /* image_layout() of the template that wrote it */
    uint64_t as_limit; /* the state's hard RLIMIT_AS */
    uint64_t bytes;    /* the whole image, this head and the tail included */
};

struct image_region {
    uint64_t lo, hi, off, ino;
    uint32_t dev_major, dev_minor;
    int32_t prot;
    uint8_t kind; /* enum procmap_kind */
    uint8_t how;  /* enum image_how */
    uint8_t reserved[2];
    uint64_t n_runs; /* of its pages, in its block: runs, then their bytes */
};

struct image_run {
    uint64_t lo, pages;
};

struct image_tail {
    uint64_t end;  /* IMAGE_END */
    uint64_t hash; /* XXH3-64 of every byte before */
};

/* FNV-1a, over a few words. */
static uint64_t mix(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xff;
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t image_layout(int proc_fd, pid_t tmpl)
{
    struct map m = {0};
    char why[128];
    uint64_t h = 0xcbf29ce484222325ULL;

    if (read_map(proc_fd, tmpl, &m, why, sizeof(why)) < 0)
        return 0;
    for (const char *v = PYSBX_VERSION; *v; v++)
        h = mix(h, (unsigned char)*v);
    for (size_t i = 0; i < m.n; i++) {
        const struct procmap *r = &m.v[i].m;
        /* Where things are, not how far the heap and stack have grown. */
        if (r->ino)
            h = mix(mix(mix(mix(mix(h, r->lo), r->hi), r->off), r->ino),
                    (uint64_t)r->dev_major << 32 | r->dev_minor);
        else if (r->kind == PROCMAP_HEAP)
            h = mix(h, r->lo);
        else if (r->kind == PROCMAP_STACK)
            h = mix(h, r->hi);
        else if (r->kind == PROCMAP_KERNEL)
            h = mix(mix(h, r->lo), r->hi);
    }
    map_free(&m);
    return h ? h : 1;
}

/* Writes or reads the image, hashing every byte as it goes. */
struct stream {
    int fd;
    uint64_t done, limit; /* bytes so far; the most allowed */
    XXH3_state_t *hash;
};

static int put(struct stream *s, const void *p, size_t n)
{
    int rc = write_full(s->fd, p, n);
    if (rc == 0) {
        XXH3_64bits_update(s->hash, p, n);
        s->done += n;
    }
    return rc;
}

static int take(struct stream *s, void *p, size_t n)
{
    if (n > s->limit - s->done)
        return -EFBIG;
    ssize_t got = read_full(s->fd, p, n);
    if (got < 0)
        return (int)got;
    if ((size_t)got != n)
        return -EPIPE; /* cut short */
    XXH3_64bits_update(s->hash, p, n);
    s->done += n;
    return 0;
}

/* What of the state's region |r| the image holds; its runs added to *v. */
static int image_runs(const struct region *r, const struct map *t, int pm, enum image_how *how,
                      uint64_t (**v)[2], size_t *n, size_t *room)
{
    *how = IMG_PAGES;
    if (r->m.kind == PROCMAP_KERNEL) {
        *how = IMG_KERNEL;
        return 0;
    }
    if (r->m.shared)
        return -ENOTSUP;
    if (r->m.ino && !(r->m.prot & PROT_WRITE)) {
        const struct region *there = region_at(t, r->m.lo);
        if (there && same_mapping(&there->m, &r->m)) {
            *how = IMG_TEMPLATE;
            return 0;
        }
    }
    /* A file's mapping whole (what was never touched is the file's); of
     * memory of no file, what is there. */
    int rc = r->m.ino ? -ENOTTY : scan(pm, r->m.lo, r->m.hi, false, v, n, room);
    return rc != -ENOTTY ? rc : add_range(v, n, room, r->m.lo, r->m.hi);
}

int image_save(int proc_fd, const struct branch_pids *p, const struct image_req *r, int out,
               uint64_t *bytes, char *why, size_t cap)
{
    struct map a = {0}, t = {0};
    struct stream st = {.fd = out, .limit = UINT64_MAX, .hash = XXH3_createState()};
    uint64_t(*runs)[2] = NULL;
    size_t n_runs = 0, room = 0, *first = NULL;
    uint8_t *how = NULL;
    char path[32], *buf = buffer_take();
    int pm = -1, mem = -1, rc;

    *bytes = 0;
    if (!st.hash || !buf) {
        rc = errmsg(why, cap, -ENOMEM, "template: out of memory");
        goto out;
    }
    XXH3_64bits_reset(st.hash);
    if ((rc = read_map(proc_fd, p->from, &a, why, cap)) < 0 ||
        (rc = read_map(proc_fd, r->tmpl, &t, why, cap)) < 0)
        goto out;
    fmt(path, sizeof(path), "%d/pagemap", (int)p->from);
    pm = openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
    fmt(path, sizeof(path), "%d/mem", (int)p->from);
    mem = pm < 0 ? -1 : openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
    first = calloc(a.n + 1, sizeof(*first));
    how = calloc(a.n ? a.n : 1, 1);
    if (pm < 0 || mem < 0 || !first || !how) {
        rc = errmsg(why, cap, mem < 0 ? -errno : -ENOMEM, "opening the state's memory: %s",
                    mem < 0 ? strerror(errno) : "out of memory");
        goto out;
    }
    /* What each region holds, first: the image's length comes first. */
    uint64_t total =
        sizeof(struct image_head) + a.n * sizeof(struct image_region) + sizeof(struct image_tail);
    for (size_t i = 0; i < a.n; i++) {
        enum image_how h;
        first[i] = n_runs;
        rc = image_runs(&a.v[i], &t, pm, &h, &runs, &n_runs, &room);
        if (rc < 0) {
            errmsg(why, cap, rc, "the state's mapping at %#llx: %s",
                   (unsigned long long)a.v[i].m.lo, rc == -ENOTSUP ? "shared" : strerror(-rc));
            goto out;
        }
        how[i] = (uint8_t)h;
        if (n_runs - first[i] > 1)
            qsort(runs + first[i], n_runs - first[i], sizeof(*runs), cmp_range);
        for (size_t k = first[i]; k < n_runs; k++)
            total += sizeof(struct image_run) + (runs[k][1] - runs[k][0]);
    }
    first[a.n] = n_runs;
    if (total > r->max_bytes) {
        rc = errmsg(why, cap, -EFBIG, "the state's image would be %llu MiB, more than %llu",
                    (unsigned long long)(total >> 20), (unsigned long long)(r->max_bytes >> 20));
        goto out;
    }
    struct image_head head = {.version = IMAGE_VERSION,
                              .n_regions = (uint32_t)a.n,
                              .layout = r->layout,
                              .as_limit = r->as_limit,
                              .bytes = total};
    memcpy(head.magic, IMAGE_MAGIC, sizeof(head.magic));
    rc = put(&st, &head, sizeof(head));
    for (size_t i = 0; i < a.n && rc == 0; i++) {
        const struct procmap *m = &a.v[i].m;
        struct image_region ir = {.lo = m->lo,
                                  .hi = m->hi,
                                  .off = m->off,
                                  .ino = m->ino,
                                  .dev_major = m->dev_major,
                                  .dev_minor = m->dev_minor,
                                  .prot = m->prot,
                                  .kind = (uint8_t)m->kind,
                                  .how = how[i],
                                  .n_runs = first[i + 1] - first[i]};
        rc = put(&st, &ir, sizeof(ir));
    }
    for (size_t i = 0; i < a.n && rc == 0; i++) {
        for (size_t k = first[i]; k < first[i + 1] && rc == 0; k++) {
            struct image_run run = {runs[k][0], (runs[k][1] - runs[k][0]) / PAGE};
            rc = put(&st, &run, sizeof(run));
        }
        /* The pages, read out of the stopped state a chunk at a time. */
        for (size_t k = first[i]; k < first[i + 1] && rc == 0; k++)
            for (uint64_t at = runs[k][0], len; at < runs[k][1] && rc == 0; at += len) {
                len = runs[k][1] - at < COPY_CHUNK ? runs[k][1] - at : COPY_CHUNK;
                rc = read_at(mem, buf, at, len);
                if (rc == 0)
                    rc = put(&st, buf, len);
            }
    }
    struct image_tail tail = {.end = IMAGE_END, .hash = XXH3_64bits_digest(st.hash)};
    if (rc == 0)
        rc = write_full(out, &tail, sizeof(tail));
    if (rc < 0)
        errmsg(why, cap, rc, "writing the state's image: %s", strerror(-rc));
    else
        *bytes = st.done + sizeof(tail);
out:
    close_fd(&pm);
    close_fd(&mem);
    XXH3_freeState(st.hash);
    buffer_put(buf);
    free(runs);
    free(first);
    free(how);
    map_free(&a);
    map_free(&t);
    return rc;
}

/* The head and the map of an image, checked as a map from the kernel is
 * (procmaps.h), into |a|. */
static int read_image_map(struct stream *st, const struct image_req *r, struct image_head *head,
                          struct map *a, uint64_t **n_runs, uint8_t **how, char *why, size_t cap)
{
    int rc = take(st, head, sizeof(*head));

    if (rc < 0)
        return errmsg(why, cap, rc, "reading the image: %s", strerror(-rc));
    if (memcmp(head->magic, IMAGE_MAGIC, sizeof(head->magic)) != 0 ||
        head->version != IMAGE_VERSION)
        return errmsg(why, cap, -EPROTO, "not a session's image of this version");
    if (head->layout != r->layout)
        return errmsg(why, cap, -ESTALE,
                      "the image was made by a template of another layout (another build, "
                      "or a template started without a fixed layout)");
    if (head->bytes > r->max_bytes || head->bytes < sizeof(*head) + sizeof(struct image_tail) ||
        head->n_regions > BRANCH_MAX_REGIONS)
        return errmsg(why, cap, -EFBIG, "the image is larger than a session may be");
    st->limit = head->bytes - sizeof(struct image_tail);
    a->v = calloc(head->n_regions ? head->n_regions : 1, sizeof(*a->v));
    *n_runs = calloc(head->n_regions ? head->n_regions : 1, sizeof(**n_runs));
    *how = calloc(head->n_regions ? head->n_regions : 1, 1);
    if (!a->v || !*n_runs || !*how)
        return errmsg(why, cap, -ENOMEM, "template: out of memory");
    for (uint32_t i = 0; i < head->n_regions; i++) {
        struct image_region ir;
        if ((rc = take(st, &ir, sizeof(ir))) < 0)
            return errmsg(why, cap, rc, "reading the image's map: %s", strerror(-rc));
        struct procmap *m = &a->v[i].m;
        *m = (struct procmap){.lo = ir.lo,
                              .hi = ir.hi,
                              .off = ir.off,
                              .ino = ir.ino,
                              .dev_major = ir.dev_major,
                              .dev_minor = ir.dev_minor,
                              .prot = ir.prot & (PROT_READ | PROT_WRITE | PROT_EXEC),
                              .kind = ir.kind <= PROCMAP_KERNEL ? (enum procmap_kind)ir.kind
                                                                : PROCMAP_PLAIN};
        if (ir.lo % PAGE || ir.hi % PAGE || ir.lo >= ir.hi || ir.hi > PROCMAPS_ADDR_END ||
            (i && ir.lo < a->v[i - 1].m.hi) || ir.kind > PROCMAP_KERNEL || ir.how > IMG_KERNEL ||
            (ir.how != IMG_PAGES && ir.n_runs) || ir.n_runs > (ir.hi - ir.lo) / PAGE ||
            ir.prot != m->prot)
            return errmsg(why, cap, -EPROTO, "the image's map is out of order or form at %#llx",
                          (unsigned long long)ir.lo);
        (*n_runs)[i] = ir.n_runs;
        (*how)[i] = ir.how;
        a->n = i + 1;
    }
    return 0;
}

/* The runs of region |r| from the image: in order, apart, within it. */
static int read_runs(struct stream *st, const struct region *r, uint64_t n, uint64_t (*v)[2])
{
    uint64_t at = r->m.lo;

    for (uint64_t k = 0; k < n; k++) {
        struct image_run run;
        int rc = take(st, &run, sizeof(run));
        if (rc < 0)
            return rc;
        if (run.lo % PAGE || run.lo < at || run.lo >= r->m.hi || !run.pages ||
            run.pages > (r->m.hi - run.lo) / PAGE)
            return -EPROTO;
        v[k][0] = run.lo;
        v[k][1] = run.lo + run.pages * PAGE;
        at = v[k][1];
    }
    return 0;
}

/* Zeros over the pages the branch has of region |r| that the image does
 * not hold (|v|, |n|: its runs): they were nothing in the state. */
static int zero_the_rest(struct copier *c, const struct region *r, uint64_t (*v)[2], uint64_t n,
                         const char *zeros)
{
    uint64_t(*mine)[2] = NULL;
    size_t m = 0, room = 0;
    int rc = scan(c->pm_to, r->m.lo, r->m.hi, false, &mine, &m, &room);

    if (rc == -ENOTTY) {
        /* Page by page, for a kernel without PAGEMAP_SCAN: all of it. */
        m = 0;
        rc = add_range(&mine, &m, &room, r->m.lo, r->m.hi);
    }
    if (m > 1)
        qsort(mine, m, sizeof(*mine), cmp_range);
    uint64_t k = 0;
    for (size_t i = 0; i < m && rc == 0; i++)
        for (uint64_t at = mine[i][0]; at < mine[i][1] && rc == 0;) {
            while (k < n && v[k][1] <= at)
                k++;
            uint64_t end = mine[i][1];
            if (k < n && v[k][0] <= at) {
                at = v[k][1]; /* the image's: written after */
                continue;
            }
            if (k < n && v[k][0] < end)
                end = v[k][0];
            if (end - at > COPY_CHUNK)
                end = at + COPY_CHUNK;
            struct iovec local = {(void *)zeros, end - at},
                         remote = {(void *)(uintptr_t)at, end - at};
            errno = 0;
            if (process_vm_writev(c->to, &local, 1, &remote, 1, 0) != (ssize_t)(end - at))
                rc = errno ? -errno : -EFAULT;
            at = end;
        }
    free(mine);
    return rc;
}

int image_restore(int proc_fd, const struct branch_pids *p, int sock, const struct image_req *r,
                  int in, char *why, size_t cap)
{
    struct map a = {0}, b = {0}, t = {0};
    struct stream st = {.fd = in, .limit = sizeof(struct image_head), .hash = XXH3_createState()};
    struct copier c = {.to = p->vm_to, .uffd = -1, .pm_from = -1, .pm_to = -1, .chunk = COPY_CHUNK};
    struct image_head head;
    uint64_t *n_runs = NULL, (*v)[2] = NULL, v_room = 0;
    uint8_t *how = NULL;
    char path[32], *buf = buffer_take(), *zeros = calloc(1, COPY_CHUNK);
    int rc;

    if (!st.hash || !buf || !zeros) {
        rc = errmsg(why, cap, -ENOMEM, "template: out of memory");
        goto out;
    }
    XXH3_64bits_reset(st.hash);
    if ((rc = read_image_map(&st, r, &head, &a, &n_runs, &how, why, cap)) < 0 ||
        (rc = read_map(proc_fd, r->tmpl, &t, why, cap)) < 0 ||
        (rc = prepare_import(proc_fd, -1, &t, r->tmpl, p->to, sock, &a, &b, &c.uffd, NULL, why,
                             cap)) < 0)
        goto out;
    for (size_t i = 0; i < a.n; i++)
        if (how[i] == IMG_TEMPLATE && !a.v[i].kept && !a.v[i].file_same) {
            rc = errmsg(why, cap, -ESTALE,
                        "the image maps a file of the template's at %#llx that this template "
                        "does not",
                        (unsigned long long)a.v[i].m.lo);
            goto out;
        }
    fmt(path, sizeof(path), "%d/pagemap", (int)p->to);
    c.pm_to = openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
    if (c.pm_to < 0) {
        rc = errmsg(why, cap, -errno, "opening the page map: %s", strerror(errno));
        goto out;
    }
    for (size_t i = 0; i < a.n && rc == 0; i++) {
        struct region *reg = &a.v[i];
        if (how[i] != IMG_PAGES)
            continue;
        if (n_runs[i] && c.uffd >= 0 && reg->fresh && !reg->file_same)
            reg->filled = fill_register(c.uffd, reg) == 0;
        if (n_runs[i] > v_room) {
            free(v);
            v_room = n_runs[i];
            if (!(v = malloc(v_room * sizeof(*v)))) {
                rc = -ENOMEM;
                break;
            }
        }
        if ((rc = read_runs(&st, reg, n_runs[i], v)) < 0 ||
            (reg->kept && (rc = zero_the_rest(&c, reg, v, n_runs[i], zeros)) < 0))
            break;
        for (uint64_t k = 0; k < n_runs[i] && rc == 0; k++)
            for (uint64_t at = v[k][0], len; at < v[k][1] && rc == 0; at += len) {
                len = v[k][1] - at < COPY_CHUNK ? v[k][1] - at : COPY_CHUNK;
                if ((rc = take(&st, buf, len)) == 0)
                    rc = put_pages(&c, reg->filled ? c.uffd : -1, at, buf, len);
            }
    }
    if (rc < 0) {
        errmsg(why, cap, rc, "restoring the image's pages: %s", strerror(-rc));
        goto out;
    }
    /* All of it read, and what was written is what was read: only then
     * does the copy resume. */
    struct image_tail tail;
    uint64_t hash = XXH3_64bits_digest(st.hash);
    st.limit = head.bytes;
    if (st.done != head.bytes - sizeof(tail) || take(&st, &tail, sizeof(tail)) < 0 ||
        tail.end != IMAGE_END || tail.hash != hash) {
        rc = errmsg(why, cap, -EBADMSG, "the image is not as it was written (its check fails)");
        goto out;
    }
    fill_end(&c.uffd, &a);
    rc = resume(sock, &a, why, cap);
out:
    close_fd(&c.uffd);
    close_fd(&c.pm_to);
    XXH3_freeState(st.hash);
    buffer_put(buf);
    free(zeros);
    free(v);
    free(n_runs);
    free(how);
    map_free(&a);
    map_free(&b);
    map_free(&t);
    return rc;
}
