#define _GNU_SOURCE
#include "procmaps.h"

#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE 4096ULL

/* The kernel's PROCMAP_QUERY (Linux 6.11, <linux/fs.h>). */
struct pm_query {
    uint64_t size, query_flags, query_addr;
    uint64_t vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
    uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
    uint64_t vma_name_addr, build_id_addr;
};
#define PM_QUERY              _IOWR('f', 17, struct pm_query)
#define PM_Q_READABLE         0x01
#define PM_Q_WRITABLE         0x02
#define PM_Q_EXECUTABLE       0x04
#define PM_Q_SHARED           0x08
#define PM_Q_COVERING_OR_NEXT 0x10

/* A name long enough for every name that decides a kind ("[vvar_vclock]"):
 * a longer one is a plain mapping's, and is not read. */
#define KIND_NAME_MAX 32

static enum procmap_kind kind_of(const char *name, size_t len, uint64_t ino)
{
    static const struct {
        const char *name;
        enum procmap_kind kind;
    } kinds[] = {{"[stack]", PROCMAP_STACK},        {"[heap]", PROCMAP_HEAP},
                 {"[vdso]", PROCMAP_KERNEL},        {"[vvar]", PROCMAP_KERNEL},
                 {"[vvar_vclock]", PROCMAP_KERNEL}, {"[vsyscall]", PROCMAP_KERNEL}};

    /* A file's name is a path (it starts with '/'); these are the kernel's
     * names for memory of no file. */
    if (ino != 0)
        return PROCMAP_PLAIN;
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (strlen(kinds[i].name) == len && memcmp(kinds[i].name, name, len) == 0)
            return kinds[i].kind;
    return PROCMAP_PLAIN;
}

/* One more mapping, checked against the last: aligned, in order, apart,
 * below the end of user addresses; at most |max|. */
static int add(struct procmap **v, size_t *n, size_t *room, size_t max, const struct procmap *m,
               char *why, size_t cap)
{
    if (m->lo % PAGE || m->hi % PAGE || m->lo >= m->hi || m->hi > PROCMAPS_ADDR_END ||
        (*n && m->lo < (*v)[*n - 1].hi))
        return errmsg(why, cap, -EPROTO,
                      "the memory map has a mapping out of order or form at %#llx",
                      (unsigned long long)m->lo);
    if (*n == max)
        return errmsg(why, cap, -E2BIG, "the process has more than %zu mappings", max);
    if (*n == *room) {
        size_t c = *room ? *room * 2 : 64;
        if (c > max)
            c = max;
        struct procmap *nv = realloc(*v, c * sizeof(*nv));
        if (!nv)
            return errmsg(why, cap, -ENOMEM, "template: out of memory");
        *v = nv;
        *room = c;
    }
    (*v)[(*n)++] = *m;
    return 0;
}

/* The map by PROCMAP_QUERY: -ENOTTY when the kernel has no such call. */
static int read_by_query(int fd, size_t max, struct procmap **v, size_t *n, char *why, size_t cap)
{
    size_t room = 0;
    char name[KIND_NAME_MAX];

    for (uint64_t at = 0; at < PROCMAPS_ADDR_END;) {
        /* Without its name first: a file's is a path the kernel would
         * build for nothing (a file's mapping is of no kind but plain). */
        struct pm_query q = {
            .size = sizeof(q), .query_flags = PM_Q_COVERING_OR_NEXT, .query_addr = at};
        int r = ioctl(fd, PM_QUERY, &q);
        if (r == 0 && q.inode == 0) {
            /* Memory of no file: its name (if short) says its kind. */
            struct pm_query named = {.size = sizeof(named),
                                     .query_flags = PM_Q_COVERING_OR_NEXT,
                                     .query_addr = q.vma_start,
                                     .vma_name_size = sizeof(name),
                                     .vma_name_addr = (uint64_t)(uintptr_t)name};
            r = ioctl(fd, PM_QUERY, &named);
            if (r < 0 && errno == ENAMETOOLONG) {
                /* A long name, so not one that decides a kind: asked
                 * again without it. */
                named.vma_name_size = 0;
                named.vma_name_addr = 0;
                r = ioctl(fd, PM_QUERY, &named);
            }
            q = named;
        }
        if (r < 0 && errno == ENOENT)
            return 0; /* no mapping at or past |at| */
        if (r < 0) {
            if (*n == 0 && (errno == ENOTTY || errno == EINVAL))
                return -ENOTTY;
            return errmsg(why, cap, -errno, "reading the memory map: %s", strerror(errno));
        }
        size_t len = q.vma_name_size ? strnlen(name, q.vma_name_size) : 0;
        struct procmap m = {
            .lo = q.vma_start,
            .hi = q.vma_end,
            .off = q.vma_offset,
            .ino = q.inode,
            .dev_major = q.dev_major,
            .dev_minor = q.dev_minor,
            .prot = (q.vma_flags & PM_Q_READABLE ? PROT_READ : 0) |
                    (q.vma_flags & PM_Q_WRITABLE ? PROT_WRITE : 0) |
                    (q.vma_flags & PM_Q_EXECUTABLE ? PROT_EXEC : 0),
            .shared = (q.vma_flags & PM_Q_SHARED) != 0,
            .kind = kind_of(name, len, q.inode),
        };
        if (m.lo < at)
            return errmsg(why, cap, -EPROTO, "the memory map went back to %#llx",
                          (unsigned long long)m.lo);
        int rc = add(v, n, &room, max, &m, why, cap);
        if (rc < 0)
            return rc;
        at = m.hi;
    }
    return 0;
}

/* A hexadecimal number of 1 to 16 digits at *p, ended by |end|. */
static bool hex(const char **p, char end, uint64_t *out)
{
    const char *s = *p;
    uint64_t v = 0;
    int digits = 0;

    for (; digits < 17; s++, digits++) {
        int d = *s >= '0' && *s <= '9' ? *s - '0' : *s >= 'a' && *s <= 'f' ? *s - 'a' + 10 : -1;
        if (d < 0)
            break;
        v = v << 4 | (uint64_t)d;
    }
    if (digits < 1 || digits > 16 || *s != end)
        return false;
    *out = v;
    *p = s + 1;
    return true;
}

/* One line of the text form, without its newline, strictly. */
static bool parse_line(const char *s, struct procmap *m)
{
    uint64_t major, minor, ino = 0;
    int digits = 0;

    if (!hex(&s, '-', &m->lo) || !hex(&s, ' ', &m->hi))
        return false;
    if ((s[0] != 'r' && s[0] != '-') || (s[1] != 'w' && s[1] != '-') ||
        (s[2] != 'x' && s[2] != '-') || (s[3] != 's' && s[3] != 'p') || s[4] != ' ')
        return false;
    m->prot = (s[0] == 'r' ? PROT_READ : 0) | (s[1] == 'w' ? PROT_WRITE : 0) |
              (s[2] == 'x' ? PROT_EXEC : 0);
    m->shared = s[3] == 's';
    s += 5;
    if (!hex(&s, ' ', &m->off) || !hex(&s, ':', &major) || !hex(&s, ' ', &minor) ||
        major > UINT32_MAX || minor > UINT32_MAX)
        return false;
    for (; *s >= '0' && *s <= '9' && digits < 20; s++, digits++)
        ino = ino * 10 + (uint64_t)(*s - '0');
    if (digits < 1 || digits >= 20 || (*s != ' ' && *s != '\0'))
        return false;
    while (*s == ' ')
        s++;
    m->dev_major = (uint32_t)major;
    m->dev_minor = (uint32_t)minor;
    m->ino = ino;
    m->kind = kind_of(s, strlen(s), ino);
    return true;
}

/* The x86-64 kernel's vsyscall page: in every process's text (its last
 * line, above every user address), in no process's mappings, and not in
 * PROCMAP_QUERY's answers. No name makes a line of its own (the kernel
 * escapes a newline in one), so a line at that address is the kernel's. */
#define VSYSCALL_LO 0xffffffffff600000ULL

static bool gate_area(const struct procmap *m)
{
    return m->kind == PROCMAP_KERNEL && m->lo == VSYSCALL_LO && m->hi == VSYSCALL_LO + PAGE;
}

/* The map by its text, a line at a time through a buffer of its own;
 * with a |budget|, -EFBIG once more text than that has been read. */
static int read_text(int fd, size_t max, size_t budget, struct procmap **v, size_t *n, char *why,
                     size_t cap)
{
    size_t room = 0, have = 0, total = 0;
    char *buf = malloc(2 * PROCMAPS_LINE_MAX + 1);
    int rc = 0;

    if (!buf)
        return errmsg(why, cap, -ENOMEM, "template: out of memory");
    for (bool end = false; rc == 0 && !end;) {
        ssize_t got = read(fd, buf + have, 2 * PROCMAPS_LINE_MAX - have);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            rc = errmsg(why, cap, -errno, "reading the memory map: %s", strerror(errno));
            break;
        }
        end = got == 0;
        have += (size_t)got;
        total += (size_t)got;
        if (budget && total > budget) {
            rc = -EFBIG;
            break;
        }
        size_t used = 0;
        for (char *nl; rc == 0 && (nl = memchr(buf + used, '\n', have - used));) {
            struct procmap m;
            *nl = '\0';
            if (nl - (buf + used) >= PROCMAPS_LINE_MAX || !parse_line(buf + used, &m))
                rc = errmsg(why, cap, -EPROTO, "a line of the memory map is out of form");
            else if (!gate_area(&m))
                rc = add(v, n, &room, max, &m, why, cap);
            used = (size_t)(nl - buf) + 1;
        }
        memmove(buf, buf + used, have - used);
        have -= used;
        /* What is left has no newline: a line longer than the longest
         * read, or the end of one without its newline. */
        if (rc == 0 && (have >= PROCMAPS_LINE_MAX || (end && have)))
            rc = errmsg(why, cap, -EPROTO, "a line of the memory map is longer than %d bytes",
                        PROCMAPS_LINE_MAX);
    }
    free(buf);
    return rc;
}

/* Nothing read yet, and nothing kept. */
static void drop(struct procmap **out, size_t *n)
{
    free(*out);
    *out = NULL;
    *n = 0;
}

int procmaps_read(int proc_fd, pid_t pid, size_t max, bool text_first, struct procmap **out,
                  size_t *n, char *why, size_t cap)
{
    char path[32];
    int rc;

    *out = NULL;
    *n = 0;
    fmt(path, sizeof(path), "%d/maps", (int)pid);
    int fd = openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errmsg(why, cap, -errno, "reading the memory map of process %d: %s", (int)pid,
                      strerror(errno));
    /* The text first, if asked: whatever it fails on but the number of
     * mappings (a line too long, the budget spent), the fields are asked,
     * as without it. */
    rc = text_first ? read_text(fd, max, PROCMAPS_TEXT_BUDGET, out, n, why, cap) : -EFBIG;
    if (rc < 0 && rc != -E2BIG) {
        drop(out, n);
        rc = read_by_query(fd, max, out, n, why, cap);
    }
    if (rc == -ENOTTY) {
        /* The text, from its start, strictly. */
        drop(out, n);
        rc = lseek(fd, 0, SEEK_SET) == 0
                 ? read_text(fd, max, 0, out, n, why, cap)
                 : errmsg(why, cap, -errno, "reading the memory map: %s", strerror(errno));
    }
    close(fd);
    if (rc < 0)
        drop(out, n);
    return rc;
}
