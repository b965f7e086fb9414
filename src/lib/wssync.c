#define _GNU_SOURCE
#include "wssync.h"

#include "sysutil.h"
#include "util.h"
#include "wire.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

/* Names tried for parking one kept file (park) before giving up on it. */
#define PARK_ATTEMPTS 32

/* Change times this close before the index was taken may share a clock
 * tick with a later change (file systems stamp them from a coarse clock):
 * those entries are compared by content. */
#define SAME_TICK_NS (50LL * 1000000LL)

static int64_t ns(struct timespec t)
{
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

void ws_index_free(struct ws_index *ix)
{
    free(ix->v);
    free(ix->names);
    memset(ix, 0, sizeof(*ix));
}

static const char *name_of(const struct ws_index *ix, uint32_t i)
{
    return ix->names + ix->v[i].name;
}

/* --- the walk ---------------------------------------------------------------- */

struct walk {
    struct ws_index *ix;
    char *why;
    size_t cap;
};

/* By name; |names| is the index's (qsort_r: several sessions sync at once). */
static int by_name(const void *a, const void *b, void *names)
{
    const struct ws_node *x = a, *y = b;
    const char *all = names;
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(all + x->name, all + y->name, n);

    return c ? c : (int)x->name_len - (int)y->name_len;
}

static int add_node(struct walk *w, uint32_t parent, const char *name, const struct stat *st)
{
    struct ws_index *ix = w->ix;
    size_t len = strlen(name);

    if (ix->n >= WS_MAX_ENTRIES)
        return errmsg(w->why, w->cap, -E2BIG,
                      "the workspace holds more than %u entries (a session keeps at most %u "
                      "entries and %u KiB of names)",
                      WS_MAX_ENTRIES, WS_MAX_ENTRIES, WS_MAX_NAME_BYTES >> 10);
    if (ix->names_len + len > WS_MAX_NAME_BYTES)
        return errmsg(w->why, w->cap, -E2BIG,
                      "the workspace's names take more than %u KiB (a session keeps at most %u "
                      "entries and %u KiB of names)",
                      WS_MAX_NAME_BYTES >> 10, WS_MAX_ENTRIES, WS_MAX_NAME_BYTES >> 10);
    if (ix->n == ix->cap) {
        uint32_t c = ix->cap ? ix->cap * 2 : 64;
        if (c > WS_MAX_ENTRIES)
            c = WS_MAX_ENTRIES; /* the bound is the memory's too */
        struct ws_node *v = realloc(ix->v, c * sizeof(*v));
        if (!v)
            return errmsg(w->why, w->cap, -ENOMEM, "out of memory");
        ix->v = v;
        ix->cap = c;
    }
    if (ix->names_len + len > ix->names_cap) {
        size_t c = ix->names_cap ? ix->names_cap * 2 : 4096;
        while (c < ix->names_len + len)
            c *= 2;
        if (c > WS_MAX_NAME_BYTES)
            c = WS_MAX_NAME_BYTES;
        char *p = realloc(ix->names, c);
        if (!p)
            return errmsg(w->why, w->cap, -ENOMEM, "out of memory");
        ix->names = p;
        ix->names_cap = c;
    }
    memcpy(ix->names + ix->names_len, name, len);
    ix->v[ix->n++] = (struct ws_node){
        .parent = parent,
        .name = (uint32_t)ix->names_len,
        .name_len = (uint16_t)len,
        .twin = WS_NONE,
        .mode = st->st_mode,
        .nlink = st->st_nlink,
        .ino = st->st_ino,
        .size = st->st_size,
        .ctime = st->st_ctim,
        .mtime = st->st_mtim,
    };
    ix->names_len += len;
    return 0;
}

/* Indexes what the directory |dir| holds as the entries of |self| (WS_NONE:
 * the top): all of them first, by name, then what each subdirectory holds. */
static int walk_dir(struct walk *w, int dir, uint32_t self, unsigned depth)
{
    struct ws_index *ix = w->ix;
    int fd = fcntl(dir, F_DUPFD_CLOEXEC, 0);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    uint32_t first = ix->n;
    int rc = 0;

    if (!d) {
        rc = errmsg(w->why, w->cap, -errno, "listing a directory: %s", strerror(errno));
        if (fd >= 0)
            close(fd);
        return rc;
    }
    rewinddir(d);
    for (struct dirent *e; rc == 0 && (e = readdir(d));) {
        const char *n = e->d_name;
        struct stat st;
        if (n[0] == '.' && (n[1] == '\0' || (n[1] == '.' && n[2] == '\0')))
            continue;
        if (self == WS_NONE && (strcmp(n, WIRE_VALUE_FILE) == 0 || strcmp(n, WIRE_ERROR_FILE) == 0))
            continue;
        if (fstatat(dirfd(d), n, &st, AT_SYMLINK_NOFOLLOW) < 0)
            rc = errmsg(w->why, w->cap, -errno, "%s: %s", n, strerror(errno));
        else
            rc = add_node(w, self, n, &st);
    }
    closedir(d);
    if (rc < 0)
        return rc;
    uint32_t count = ix->n - first;
    if (count > 1)
        qsort_r(ix->v + first, count, sizeof(*ix->v), by_name, ix->names);
    if (self == WS_NONE) {
        ix->top = first;
        ix->ntop = count;
    } else {
        ix->v[self].kids = first;
        ix->v[self].nkids = count;
    }
    for (uint32_t i = first; rc == 0 && i < first + count; i++) {
        if (!S_ISDIR(ix->v[i].mode))
            continue;
        if (depth + 1 > WS_MAX_DEPTH)
            return errmsg(w->why, w->cap, -E2BIG,
                          "the workspace is more than %u directories deep (a session keeps at "
                          "most %u)",
                          WS_MAX_DEPTH, WS_MAX_DEPTH);
        char name[NAME_MAX + 1];
        fmt(name, sizeof(name), "%.*s", (int)ix->v[i].name_len, name_of(ix, i));
        int sub = openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0)
            return errmsg(w->why, w->cap, -errno, "%s: %s", name, strerror(errno));
        rc = walk_dir(w, sub, i, depth + 1);
        close(sub);
    }
    return rc;
}

static int walk_all(int root, struct ws_index *ix, char *why, size_t cap)
{
    struct walk w = {.ix = ix, .why = why, .cap = cap};

    memset(ix, 0, sizeof(*ix));
    int rc = walk_dir(&w, root, WS_NONE, 0);
    if (rc < 0)
        ws_index_free(ix);
    else
        clock_gettime(CLOCK_REALTIME, &ix->taken);
    return rc;
}

int ws_index_build(int ws_fd, struct ws_index *ix, char *why, size_t cap)
{
    struct ws_index fresh;
    int rc = walk_all(ws_fd, &fresh, why, cap);

    if (rc == 0) {
        ws_index_free(ix);
        *ix = fresh;
    }
    return rc;
}

/* --- paths, a component at a time ------------------------------------------- */

/* The directory beneath |root| that holds node |i| of |ix|, opened a
 * component at a time, following no link; its name in |leaf|. Returns a
 * descriptor or -errno. */
static int open_parent(int root, const struct ws_index *ix, uint32_t i, char leaf[NAME_MAX + 1])
{
    uint32_t chain[WS_MAX_DEPTH + 1];
    unsigned n = 0;

    fmt(leaf, NAME_MAX + 1, "%.*s", (int)ix->v[i].name_len, name_of(ix, i));
    for (uint32_t p = ix->v[i].parent; p != WS_NONE && n <= WS_MAX_DEPTH; p = ix->v[p].parent)
        chain[n++] = p;
    int fd = fcntl(root, F_DUPFD_CLOEXEC, 0);
    while (fd >= 0 && n > 0) {
        char comp[NAME_MAX + 1];
        uint32_t p = chain[--n];
        fmt(comp, sizeof(comp), "%.*s", (int)ix->v[p].name_len, name_of(ix, p));
        int next = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int e = errno;
        close(fd);
        fd = next;
        errno = e;
    }
    return fd < 0 ? -errno : fd;
}

/* --- copying one entry -------------------------------------------------------- */

/* Pieces files are copied and compared in: on the heap, since this runs on
 * whatever thread the host called from, whose stack may be small. */
#define COPY_CHUNK 65536

/* Copies the bytes of |in| into |out| (from its start), holes kept holes. */
static int copy_data(int in, int out, off_t size)
{
    char *buf = malloc(COPY_CHUNK);
    off_t pos = 0;
    int rc = 0;

    if (!buf)
        return -ENOMEM;

    while (pos < size) {
        off_t data = lseek(in, pos, SEEK_DATA);
        if (data < 0 && errno == ENXIO)
            break; /* a hole to the end */
        off_t hole = data < 0 ? size : lseek(in, data, SEEK_HOLE);
        if (data < 0)
            data = pos; /* no SEEK_DATA here: all of it */
        if (hole < 0 || hole > size)
            hole = size;
        for (off_t at = data; rc == 0 && at < hole;) {
            size_t want = (size_t)(hole - at) < COPY_CHUNK ? (size_t)(hole - at) : COPY_CHUNK;
            ssize_t n = pread(in, buf, want, at);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                rc = n < 0 ? -errno : -EIO;
                break;
            }
            for (ssize_t done = 0; rc == 0 && done < n;) {
                ssize_t m = pwrite(out, buf + done, (size_t)(n - done), at + done);
                if (m < 0 && errno == EINTR)
                    continue;
                if (m <= 0)
                    rc = m < 0 ? -errno : -EIO;
                else
                    done += m;
            }
            at += n;
        }
        if (rc < 0)
            break;
        pos = hole;
    }
    free(buf);
    if (rc == 0 && ftruncate(out, size) < 0)
        rc = -errno;
    return rc;
}

/* |out| (a regular file) gets |st|'s mode and times. */
static int finish_file(int out, const struct ws_node *n)
{
    struct timespec times[2] = {{.tv_nsec = UTIME_OMIT}, n->mtime};

    if (fchmod(out, n->mode & 07777) < 0 || futimens(out, times) < 0)
        return -errno;
    return 0;
}

/* Removes |leaf| in |dir|, whatever it is; gone already is fine. */
static int remove_at(int dir, const char *leaf)
{
    struct stat st;

    if (fstatat(dir, leaf, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (S_ISDIR(st.st_mode))
        return remove_tree_at(dir, leaf);
    return unlinkat(dir, leaf, 0) < 0 ? -errno : 0;
}

/* Makes node |i| of |ix| (as it is in |src|, which holds it) in |dst|,
 * replacing what |dst| has there unless both are directories (then only
 * the mode), or, with |link_dir|/|link_leaf|, as a hard link to that. A
 * regular file already in |dst| with the inode |keep_ino| is rewritten in
 * place. */
static int copy_node(int src, int dst, const struct ws_index *ix, uint32_t i, int link_dir,
                     const char *link_leaf, ino_t keep_ino)
{
    const struct ws_node *n = &ix->v[i];
    char leaf[NAME_MAX + 1];
    int sdir = open_parent(src, ix, i, leaf);
    int ddir = sdir >= 0 ? open_parent(dst, ix, i, leaf) : -1;
    int in = -1, out = -1;
    struct stat old;
    int rc = 0;

    if (sdir < 0 || ddir < 0) {
        rc = sdir < 0 ? sdir : ddir;
        goto out;
    }
    bool had = fstatat(ddir, leaf, &old, AT_SYMLINK_NOFOLLOW) == 0;
    bool in_place = had && keep_ino && S_ISREG(old.st_mode) && S_ISREG(n->mode) &&
                    old.st_ino == keep_ino && !link_leaf;
    bool both_dirs = had && S_ISDIR(old.st_mode) && S_ISDIR(n->mode);
    if (had && !in_place && !both_dirs && (rc = remove_at(ddir, leaf)) < 0)
        goto out;
    if (link_leaf) {
        rc = linkat(link_dir, link_leaf, ddir, leaf, 0) < 0 ? -errno : 0;
    } else if (S_ISDIR(n->mode)) {
        if (!both_dirs && mkdirat(ddir, leaf, 0700) < 0)
            rc = -errno;
        else
            rc = chmod_nofollow(ddir, leaf, n->mode & 07777);
    } else if (S_ISLNK(n->mode)) {
        char target[PATH_MAX + 1];
        ssize_t len = readlinkat(sdir, leaf, target, PATH_MAX);
        if (len < 0)
            rc = -errno;
        else {
            target[len] = '\0';
            rc = symlinkat(target, ddir, leaf) < 0 ? -errno : 0;
        }
    } else if (S_ISFIFO(n->mode)) {
        if (mkfifoat(ddir, leaf, 0600) < 0)
            rc = -errno;
        else
            rc = chmod_nofollow(ddir, leaf, n->mode & 07777);
    } else if (S_ISREG(n->mode)) {
        in = openat(sdir, leaf, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        out = in < 0 ? -1
              : in_place
                  ? openat(ddir, leaf, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
                  : openat(ddir, leaf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (in < 0 || out < 0)
            rc = -errno;
        else if (in_place && ftruncate(out, 0) < 0)
            rc = -errno;
        else if ((rc = copy_data(in, out, n->size)) == 0)
            rc = finish_file(out, n);
    }
out:
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
    if (sdir >= 0)
        close(sdir);
    if (ddir >= 0)
        close(ddir);
    return rc;
}

/* Removes node |i| of |ix| beneath |root|; gone already is fine. */
static int remove_node(int root, const struct ws_index *ix, uint32_t i)
{
    char leaf[NAME_MAX + 1];
    int dir = open_parent(root, ix, i, leaf);

    if (dir == -ENOENT)
        return 0;
    if (dir < 0)
        return dir;
    int rc = remove_at(dir, leaf);
    close(dir);
    return rc;
}

/* --- the diff ------------------------------------------------------------------ */

/* Whether node |i| of |now| (in |ws_fd|) holds what its twin in |saved_fd|
 * does: the same bytes, or the same link target. */
static bool same_content(int ws_fd, int saved_fd, const struct ws_index *now, uint32_t i)
{
    const struct ws_node *n = &now->v[i];
    char leaf[NAME_MAX + 1];
    char *a = malloc(2 * COPY_CHUNK), *b = a + COPY_CHUNK;
    int wd = a ? open_parent(ws_fd, now, i, leaf) : -1;
    int sd = wd >= 0 ? open_parent(saved_fd, now, i, leaf) : -1;
    bool same = false;

    if (wd >= 0 && sd >= 0 && S_ISLNK(n->mode)) {
        ssize_t x = readlinkat(wd, leaf, a, COPY_CHUNK);
        ssize_t y = readlinkat(sd, leaf, b, COPY_CHUNK);
        same = x >= 0 && x == y && memcmp(a, b, (size_t)x) == 0;
    } else if (wd >= 0 && sd >= 0 && S_ISREG(n->mode)) {
        int fa = openat(wd, leaf, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        int fb = openat(sd, leaf, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        struct stat sb;
        if (fa >= 0 && fb >= 0 && fstat(fb, &sb) == 0 && sb.st_size == n->size &&
            sb.st_mode == n->mode && ns(sb.st_mtim) == ns(n->mtime)) {
            for (;;) {
                ssize_t x = read_full(fa, a, COPY_CHUNK);
                ssize_t y = read_full(fb, b, COPY_CHUNK);
                if (x < 0 || x != y || memcmp(a, b, (size_t)x) != 0)
                    break;
                if (x == 0) {
                    same = true;
                    break;
                }
            }
        }
        if (fa >= 0)
            close(fa);
        if (fb >= 0)
            close(fb);
    } else if (wd >= 0 && sd >= 0)
        same = true; /* a FIFO holds nothing */
    if (wd >= 0)
        close(wd);
    if (sd >= 0)
        close(sd);
    free(a);
    return same;
}

struct diff {
    int ws_fd, saved_fd;
    const struct ws_index *old;
    struct ws_index *now;
    uint32_t *gone;
    uint32_t n_gone;
};

static void mark_tree(struct ws_index *ix, uint32_t i)
{
    ix->v[i].changed = true;
    if (S_ISDIR(ix->v[i].mode))
        for (uint32_t k = 0; k < ix->v[i].nkids; k++)
            mark_tree(ix, ix->v[i].kids + k);
}

static int name_cmp(const struct ws_index *a, uint32_t i, const struct ws_index *b, uint32_t j)
{
    size_t x = a->v[i].name_len, y = b->v[j].name_len;
    int c = memcmp(name_of(a, i), name_of(b, j), x < y ? x : y);

    return c ? c : (int)x - (int)y;
}

/* Matches the entries |nk|.. (|nn| of them) of a directory now with those
 * of the same directory in the index, |ok|.. (|on|). */
static void match(struct diff *d, uint32_t nk, uint32_t nn, uint32_t ok, uint32_t on)
{
    struct ws_index *now = d->now;
    const struct ws_index *old = d->old;
    uint32_t i = 0, j = 0;

    while (i < nn || j < on) {
        int c = i >= nn ? 1 : j >= on ? -1 : name_cmp(now, nk + i, old, ok + j);
        if (c > 0) {
            d->gone[d->n_gone++] = ok + j++; /* not there any more */
            continue;
        }
        uint32_t a = nk + i++;
        if (c < 0) {
            mark_tree(now, a); /* new */
            continue;
        }
        uint32_t b = ok + j++;
        struct ws_node *n = &now->v[a];
        const struct ws_node *o = &old->v[b];
        if ((n->mode & S_IFMT) != (o->mode & S_IFMT)) {
            /* Another kind under the same name: the old one goes, as gone. */
            mark_tree(now, a);
            d->gone[d->n_gone++] = b;
            continue;
        }
        n->twin = b;
        if (S_ISDIR(n->mode)) {
            /* A directory's times move with its entries, which are looked
             * at one by one: only its mode matters. */
            n->changed = n->mode != o->mode;
            match(d, n->kids, n->nkids, o->kids, o->nkids);
        } else
            n->changed = !(n->ino == o->ino && ns(n->ctime) == ns(o->ctime) &&
                           (ns(o->ctime) + SAME_TICK_NS < ns(old->taken) ||
                            same_content(d->ws_fd, d->saved_fd, now, a)));
    }
}

int ws_diff(int ws_fd, int saved_fd, const struct ws_index *ix, struct ws_changes *out, char *why,
            size_t cap)
{
    memset(out, 0, sizeof(*out));
    int rc = walk_all(ws_fd, &out->now, why, cap);
    if (rc < 0)
        return rc;
    out->old = ix;
    out->gone = malloc(((size_t)ix->n + 1) * sizeof(*out->gone));
    if (!out->gone) {
        ws_changes_free(out);
        return errmsg(why, cap, -ENOMEM, "out of memory");
    }
    struct diff d = {
        .ws_fd = ws_fd, .saved_fd = saved_fd, .old = ix, .now = &out->now, .gone = out->gone};
    match(&d, out->now.top, out->now.ntop, ix->top, ix->ntop);
    out->n_gone = d.n_gone;
    return 0;
}

bool ws_changed(const struct ws_changes *c, const char *path)
{
    const struct ws_index *ix = &c->now;
    uint32_t first = ix->top, count = ix->ntop, at = WS_NONE;

    while (*path) {
        size_t len = strcspn(path, "/");
        uint32_t lo = 0, hi = count;
        at = WS_NONE;
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2, i = first + mid;
            size_t n = ix->v[i].name_len;
            int cmp = memcmp(name_of(ix, i), path, n < len ? n : len);
            if (!cmp)
                cmp = (int)n - (int)len;
            if (cmp == 0) {
                at = i;
                break;
            }
            if (cmp < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (at == WS_NONE)
            return false;
        path += len;
        if (*path == '/')
            path++;
        first = ix->v[at].kids;
        count = ix->v[at].nkids;
    }
    return at != WS_NONE && ix->v[at].changed;
}

void ws_changes_free(struct ws_changes *c)
{
    ws_index_free(&c->now);
    free(c->gone);
    memset(c, 0, sizeof(*c));
}

void ws_index_take(struct ws_index *ix, struct ws_changes *c)
{
    ws_index_free(ix);
    *ix = c->now;
    memset(&c->now, 0, sizeof(c->now));
}

/* --- hard links ------------------------------------------------------------------ */

/* The regular files of |ix| with more than one link, by inode: each group's
 * members are one file, to be made once and linked to after. */
struct link_entry {
    ino_t ino;
    uint32_t node;
};

static int by_ino(const void *a, const void *b)
{
    const struct link_entry *x = a, *y = b;

    return x->ino != y->ino ? (x->ino < y->ino ? -1 : 1) : (x->node < y->node ? -1 : 1);
}

struct links {
    struct link_entry *v;
    size_t n;
    uint32_t
        *anchor; /* per entry's group (indexed like v): the node holding the file, or WS_NONE */
};

static int links_of(const struct ws_index *ix, struct links *l)
{
    memset(l, 0, sizeof(*l));
    for (uint32_t i = 0; i < ix->n; i++)
        if (S_ISREG(ix->v[i].mode) && ix->v[i].nlink > 1)
            l->n++;
    if (!l->n)
        return 0;
    l->v = malloc(l->n * sizeof(*l->v));
    l->anchor = malloc(l->n * sizeof(*l->anchor));
    if (!l->v || !l->anchor) {
        free(l->v);
        free(l->anchor);
        return -ENOMEM;
    }
    size_t k = 0;
    for (uint32_t i = 0; i < ix->n; i++)
        if (S_ISREG(ix->v[i].mode) && ix->v[i].nlink > 1)
            l->v[k++] = (struct link_entry){ix->v[i].ino, i};
    qsort(l->v, l->n, sizeof(*l->v), by_ino);
    for (size_t i = 0; i < l->n; i++)
        l->anchor[i] = WS_NONE;
    return 0;
}

static void links_free(struct links *l)
{
    free(l->v);
    free(l->anchor);
}

/* The first entry of node |i|'s group, or -1 when it is in none. */
static ssize_t group_of(const struct links *l, const struct ws_index *ix, uint32_t i)
{
    struct link_entry key = {ix->v[i].ino, 0};
    size_t lo = 0, hi = l->n;

    if (!l->n || !S_ISREG(ix->v[i].mode) || ix->v[i].nlink < 2)
        return -1;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (l->v[mid].ino < key.ino)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < l->n && l->v[lo].ino == key.ino ? (ssize_t)lo : -1;
}

/* Makes node |i| in |dst| from |src|: as a link to its group's anchor
 * when the group has one there, else as a copy that becomes it. */
static int make_node(int src, int dst, const struct ws_index *ix, uint32_t i, struct links *l,
                     ino_t keep_ino)
{
    ssize_t g = group_of(l, ix, i);
    uint32_t anchor = g >= 0 ? l->anchor[g] : WS_NONE;

    if (anchor != WS_NONE && anchor != i) {
        char leaf[NAME_MAX + 1];
        int dir = open_parent(dst, ix, anchor, leaf);
        if (dir < 0)
            return dir;
        int rc = copy_node(src, dst, ix, i, dir, leaf, 0);
        close(dir);
        return rc;
    }
    int rc = copy_node(src, dst, ix, i, -1, NULL, keep_ino);
    if (rc == 0 && g >= 0)
        l->anchor[g] = i;
    return rc;
}

/* --- kept files ------------------------------------------------------------------- */

/* The first regular file of |ix| whose inode is |ino|, or WS_NONE. */
static uint32_t node_of_ino(const struct ws_index *ix, ino_t ino)
{
    for (uint32_t i = 0; i < ix->n; i++)
        if (S_ISREG(ix->v[i].mode) && ix->v[i].ino == ino)
            return i;
    return WS_NONE;
}

int ws_open_ino(int root, const struct ws_index *ix, ino_t ino, int flags)
{
    char leaf[NAME_MAX + 1];
    uint32_t i = node_of_ino(ix, ino);

    if (i == WS_NONE)
        return -ENOENT;
    int dir = open_parent(root, ix, i, leaf);
    if (dir < 0)
        return dir;
    int fd = openat(dir, leaf, flags | O_NOFOLLOW | O_CLOEXEC);
    int rc = fd < 0 ? -errno : fd;
    close(dir);
    return rc;
}

/* Whether inode |ino| is still at one of the names the index gave it (the
 * restore leaves it there, and rewrites it in place). */
static bool still_named(const struct ws_changes *c, ino_t ino)
{
    for (uint32_t i = 0; i < c->now.n; i++) {
        const struct ws_node *n = &c->now.v[i];
        if (n->ino == ino && S_ISREG(n->mode) && n->twin != WS_NONE &&
            c->old->v[n->twin].ino == ino)
            return true;
    }
    return false;
}

/* A kept file the cell moved off all its names, linked under a name of
 * ours at the top while the restore removes what the cell made (its last
 * name may be among it, and an inode with no name can never get one
 * again), then moved back to the first of its names (unpark). */
struct parked {
    ino_t ino;
    char name[48]; /* "" once moved back */
};

/* A hard link to the file |fd| (O_PATH will do) at a free name of ours in
 * |ws_fd|: by the descriptor itself, or else through /proc (which needs no
 * capability). Returns 0, or -errno when it could not be made (then the
 * file may be left with no name: ws_restore puts it back as a new inode). */
static int park(int ws_fd, int fd, unsigned k, struct parked *p)
{
    char proc[40];
    int rc = -EEXIST;

    fmt(proc, sizeof(proc), "/proc/self/fd/%d", fd);
    for (unsigned attempt = 0; rc == -EEXIST && attempt < PARK_ATTEMPTS; attempt++) {
        fmt(p->name, sizeof(p->name), ".pysbx-kept-%u-%u", k, attempt);
        rc = linkat(fd, "", ws_fd, p->name, AT_EMPTY_PATH) == 0 ? 0 : -errno;
        if (rc < 0 && rc != -EEXIST)
            rc = linkat(AT_FDCWD, proc, ws_fd, p->name, AT_SYMLINK_FOLLOW) == 0 ? 0 : -errno;
    }
    if (rc < 0)
        p->name[0] = '\0';
    return rc;
}

/* Each kept file the cell left at none of its old names, parked. */
static unsigned park_kept(int ws_fd, const struct ws_changes *c, const struct ws_kept *kept,
                          struct parked *parked)
{
    unsigned n = 0;

    for (unsigned k = 0; kept && k < kept->n; k++) {
        struct stat st;
        if (fstat(kept->fds[k], &st) < 0 || !S_ISREG(st.st_mode) || st.st_nlink == 0 ||
            node_of_ino(c->old, st.st_ino) == WS_NONE || still_named(c, st.st_ino))
            continue;
        parked[n].ino = st.st_ino;
        if (park(ws_fd, kept->fds[k], k, &parked[n]) == 0)
            n++;
    }
    return n;
}

/* Node |i| of |old| (a regular file about to be made) is a parked file's
 * first name: the file goes back there, to be rewritten in place. */
static int unpark(int ws_fd, const struct ws_index *old, uint32_t i, const struct links *l,
                  struct parked *parked, unsigned n)
{
    ssize_t g = group_of(l, old, i);

    if (g >= 0 && l->anchor[g] != WS_NONE)
        return 0; /* another name of it is made already: linked to that */
    for (unsigned k = 0; k < n; k++) {
        if (!parked[k].name[0] || parked[k].ino != old->v[i].ino)
            continue;
        char leaf[NAME_MAX + 1];
        int dir = open_parent(ws_fd, old, i, leaf);
        if (dir < 0)
            return dir;
        int rc = renameat(ws_fd, parked[k].name, dir, leaf) < 0 ? -errno : 0;
        close(dir);
        if (rc == 0)
            parked[k].name[0] = '\0';
        return rc;
    }
    return 0;
}

int ws_restore_kept(int ws_fd, int saved_fd, const struct ws_index *old, struct ws_kept *kept)
{
    int rc = 0;

    for (unsigned k = 0; rc == 0 && kept && k < kept->n; k++) {
        struct stat st;
        char leaf[NAME_MAX + 1], proc[40];
        if (fstat(kept->fds[k], &st) < 0 || st.st_nlink > 0)
            continue; /* named: put back in place */
        uint32_t i = node_of_ino(old, st.st_ino);
        if (i == WS_NONE)
            continue; /* never in the workspace's index: nothing to put back */
        /* Its content as the state had it, for the state's mappings of the
         * inode; its names have a new one, which the state takes on. */
        fmt(proc, sizeof(proc), "/proc/self/fd/%d", kept->fds[k]);
        int dir = open_parent(saved_fd, old, i, leaf);
        int in = dir < 0 ? -1 : openat(dir, leaf, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        int out = in < 0 ? -1 : open(proc, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (dir < 0 || in < 0 || out < 0)
            rc = dir < 0 ? dir : -errno;
        else if (ftruncate(out, 0) < 0)
            rc = -errno;
        else if ((rc = copy_data(in, out, old->v[i].size)) == 0)
            rc = finish_file(out, &old->v[i]);
        if (dir >= 0)
            close(dir);
        if (in >= 0)
            close(in);
        if (out >= 0)
            close(out);
        if (rc == 0) {
            kept->adopt[k] = ws_open_ino(ws_fd, old, st.st_ino, O_PATH);
            rc = kept->adopt[k] < 0 ? kept->adopt[k] : 0;
        }
    }
    return rc;
}

/* --- commit and restore --------------------------------------------------------- */

int ws_commit(int ws_fd, int saved_fd, const struct ws_changes *c)
{
    const struct ws_index *now = &c->now;
    struct links l;
    int rc = links_of(now, &l);

    /* A group member the cell left alone is in the saved copy already:
     * the group's new names link to it. */
    for (size_t k = 0; rc == 0 && k < l.n; k++) {
        ssize_t g = group_of(&l, now, l.v[k].node);
        if (!now->v[l.v[k].node].changed && l.anchor[g] == WS_NONE)
            l.anchor[g] = l.v[k].node;
    }
    /* What went, then what came or changed, parents before what they hold. */
    for (uint32_t k = 0; rc == 0 && k < c->n_gone; k++)
        rc = remove_node(saved_fd, c->old, c->gone[k]);
    for (uint32_t i = 0; rc == 0 && i < now->n; i++)
        if (now->v[i].changed)
            rc = make_node(ws_fd, saved_fd, now, i, &l, 0);
    links_free(&l);
    return rc;
}

static void mark_old_tree(const struct ws_index *ix, uint32_t i, bool *mark)
{
    mark[i] = true;
    if (S_ISDIR(ix->v[i].mode))
        for (uint32_t k = 0; k < ix->v[i].nkids; k++)
            mark_old_tree(ix, ix->v[i].kids + k, mark);
}

int ws_restore(int ws_fd, int saved_fd, const struct ws_changes *c, struct ws_kept *kept)
{
    const struct ws_index *now = &c->now, *old = c->old;
    bool *back = calloc((size_t)old->n + 1, sizeof(*back));
    struct parked *parked = kept && kept->n ? calloc(kept->n, sizeof(*parked)) : NULL;
    struct links l;
    int rc = back && (parked || !kept || !kept->n) ? links_of(old, &l) : -ENOMEM;

    if (rc < 0) {
        free(back);
        free(parked);
        return rc;
    }
    unsigned n_parked = parked ? park_kept(ws_fd, c, kept, parked) : 0;
    /* What the cell made or changed goes, what it holds first; a directory
     * that was there stays (its mode is put back below), and so does a
     * file in the inode it had, rewritten in place below: the state may
     * map it. */
    for (uint32_t i = now->n; rc == 0 && i-- > 0;) {
        const struct ws_node *n = &now->v[i];
        if (!n->changed)
            continue;
        if (n->twin != WS_NONE) {
            back[n->twin] = true;
            if (S_ISDIR(n->mode) || (S_ISREG(n->mode) && n->ino == old->v[n->twin].ino))
                continue;
        }
        rc = remove_node(ws_fd, now, i);
    }
    for (uint32_t k = 0; k < c->n_gone; k++)
        mark_old_tree(old, c->gone[k], back);
    /* A group member the cell left alone holds the group's inode still. */
    for (uint32_t i = 0; rc == 0 && i < now->n; i++) {
        const struct ws_node *n = &now->v[i];
        ssize_t g = n->twin != WS_NONE && !n->changed ? group_of(&l, old, n->twin) : -1;
        if (g >= 0 && l.anchor[g] == WS_NONE)
            l.anchor[g] = n->twin;
    }
    /* Then what was there comes back, parents first; a kept file moved
     * off its names to its first one, in its own inode. */
    for (uint32_t i = 0; rc == 0 && i < old->n; i++)
        if (back[i]) {
            if (n_parked && S_ISREG(old->v[i].mode))
                rc = unpark(ws_fd, old, i, &l, parked, n_parked);
            if (rc == 0)
                rc = make_node(saved_fd, ws_fd, old, i, &l, old->v[i].ino);
        }
    for (unsigned k = 0; k < n_parked; k++)
        if (parked[k].name[0])
            (void)unlinkat(ws_fd, parked[k].name, 0);
    if (rc == 0)
        rc = ws_restore_kept(ws_fd, saved_fd, old, kept);
    links_free(&l);
    free(back);
    free(parked);
    return rc;
}

int ws_restore_all(int ws_fd, int saved_fd)
{
    struct ws_index saved;
    struct links l;
    char why[160];
    int rc = walk_all(saved_fd, &saved, why, sizeof(why));

    if (rc < 0)
        return rc;
    rc = links_of(&saved, &l);
    if (rc == 0)
        rc = empty_tree_at(ws_fd, ".");
    for (uint32_t i = 0; rc == 0 && i < saved.n; i++)
        rc = make_node(saved_fd, ws_fd, &saved, i, &l, 0);
    links_free(&l);
    ws_index_free(&saved);
    return rc;
}

/* --- a stream of the files ----------------------------------------------------- */

#define STREAM_MAGIC   "PYSBXFIL"
#define STREAM_VERSION 1

enum stream_kind { SK_END, SK_FILE, SK_DIR, SK_LINK, SK_FIFO, SK_HARD };

/* One entry; its name follows, then what its kind holds: a file, its
 * extents (offset and length each) and their bytes; a link, its target. */
struct stream_entry {
    uint8_t kind;
    uint8_t reserved;
    uint16_t name_len;
    uint32_t mode;
    uint32_t parent;  /* an earlier entry, a directory; WS_NONE: the top */
    uint32_t link_to; /* SK_HARD: the earlier file it is a name of */
    int64_t mtime_sec;
    uint32_t mtime_nsec;
    uint32_t n_extents; /* SK_FILE */
    uint64_t size;      /* SK_FILE: its length; SK_LINK: its target's */
};

struct extent {
    uint64_t at, len;
};

/* The stream's descriptor, and a hash (XXH3) of every byte through it. */
struct fstream {
    int fd;
    XXH3_state_t *hash;
    uint64_t budget; /* reading: the most bytes left to read */
};

static int out_all(struct fstream *f, const void *p, size_t n)
{
    int rc = write_full(f->fd, p, n);
    if (rc == 0)
        XXH3_64bits_update(f->hash, p, n);
    return rc;
}

/* The extents of |fd| (|size| long) that hold data, into *v. */
static int extents_of(int fd, off_t size, struct extent **v, uint32_t *n)
{
    uint32_t room = 0;

    *v = NULL;
    *n = 0;
    for (off_t pos = 0; pos < size;) {
        off_t data = lseek(fd, pos, SEEK_DATA);
        if (data < 0 && errno == ENXIO)
            break;
        off_t hole = data < 0 ? size : lseek(fd, data, SEEK_HOLE);
        if (data < 0)
            data = pos;
        if (hole < 0 || hole > size)
            hole = size;
        if (*n == room) {
            room = room ? room * 2 : 8;
            struct extent *nv = realloc(*v, room * sizeof(**v));
            if (!nv)
                return -ENOMEM;
            *v = nv;
        }
        (*v)[(*n)++] = (struct extent){(uint64_t)data, (uint64_t)(hole - data)};
        pos = hole;
    }
    return 0;
}

static int write_file(int root, const struct ws_index *ix, uint32_t i, struct stream_entry *e,
                      struct fstream *out, char *buf)
{
    char leaf[NAME_MAX + 1];
    int dir = open_parent(root, ix, i, leaf);
    int fd = dir >= 0 ? openat(dir, leaf, O_RDONLY | O_NOFOLLOW | O_CLOEXEC) : -1;
    struct extent *v = NULL;
    struct stat st;
    int rc = fd < 0 ? (dir < 0 ? dir : -errno) : 0;

    if (rc == 0 && fstat(fd, &st) < 0)
        rc = -errno;
    if (rc == 0)
        rc = extents_of(fd, st.st_size, &v, &e->n_extents);
    e->size = rc == 0 ? (uint64_t)st.st_size : 0;
    if (rc == 0)
        rc = out_all(out, e, sizeof(*e));
    if (rc == 0)
        rc = out_all(out, name_of(ix, i), ix->v[i].name_len);
    if (rc == 0 && e->n_extents)
        rc = out_all(out, v, e->n_extents * sizeof(*v));
    for (uint32_t k = 0; rc == 0 && k < e->n_extents; k++)
        for (uint64_t at = v[k].at; rc == 0 && at < v[k].at + v[k].len;) {
            size_t want =
                v[k].at + v[k].len - at < COPY_CHUNK ? v[k].at + v[k].len - at : COPY_CHUNK;
            ssize_t got = pread(fd, buf, want, (off_t)at);
            if (got < 0 && errno == EINTR)
                continue;
            /* What a file holds is what was listed: it does not change
             * under us (no process of the session reaches the saved copy). */
            if (got != (ssize_t)want)
                rc = got < 0 ? -errno : -EIO;
            else
                rc = out_all(out, buf, want);
            at += want;
        }
    free(v);
    if (fd >= 0)
        close(fd);
    if (dir >= 0)
        close(dir);
    return rc;
}

int ws_write_stream(int root, int fd, char *why, size_t cap)
{
    struct ws_index ix;
    struct fstream f = {.fd = fd, .hash = XXH3_createState()}, *out = &f;
    char *buf = malloc(COPY_CHUNK);
    int rc = buf && f.hash ? walk_all(root, &ix, why, cap) : -ENOMEM;

    if (rc < 0) {
        free(buf);
        XXH3_freeState(f.hash);
        return rc == -ENOMEM ? errmsg(why, cap, rc, "out of memory") : rc;
    }
    XXH3_64bits_reset(f.hash);
    struct {
        char magic[8];
        uint32_t version, reserved;
    } head = {.version = STREAM_VERSION};
    memcpy(head.magic, STREAM_MAGIC, sizeof(head.magic));
    rc = out_all(out, &head, sizeof(head));
    for (uint32_t i = 0; rc == 0 && i < ix.n; i++) {
        const struct ws_node *n = &ix.v[i];
        struct stream_entry e = {.name_len = n->name_len,
                                 .mode = n->mode & 07777,
                                 .parent = n->parent,
                                 .mtime_sec = n->mtime.tv_sec,
                                 .mtime_nsec = (uint32_t)n->mtime.tv_nsec};
        uint32_t first = WS_NONE;
        if (S_ISREG(n->mode) && n->nlink > 1)
            for (uint32_t j = 0; j < i && first == WS_NONE; j++)
                if (S_ISREG(ix.v[j].mode) && ix.v[j].ino == n->ino)
                    first = j;
        if (S_ISREG(n->mode) && first == WS_NONE) {
            e.kind = SK_FILE;
            rc = write_file(root, &ix, i, &e, out, buf);
            continue;
        }
        char target[PATH_MAX + 1];
        ssize_t tlen = 0;
        if (first != WS_NONE) {
            e.kind = SK_HARD;
            e.link_to = first;
        } else if (S_ISDIR(n->mode))
            e.kind = SK_DIR;
        else if (S_ISFIFO(n->mode))
            e.kind = SK_FIFO;
        else if (S_ISLNK(n->mode)) {
            char leaf[NAME_MAX + 1];
            int dir = open_parent(root, &ix, i, leaf);
            tlen = dir >= 0 ? readlinkat(dir, leaf, target, PATH_MAX) : -1;
            if (dir >= 0)
                close(dir);
            if (tlen < 0) {
                rc = -errno;
                break;
            }
            e.kind = SK_LINK;
            e.size = (uint64_t)tlen;
        } else {
            rc = -EINVAL; /* no other kind can be made in a workspace */
            break;
        }
        rc = out_all(out, &e, sizeof(e));
        if (rc == 0)
            rc = out_all(out, name_of(&ix, i), n->name_len);
        if (rc == 0 && tlen)
            rc = out_all(out, target, (size_t)tlen);
    }
    struct stream_entry end = {.kind = SK_END};
    if (rc == 0)
        rc = out_all(out, &end, sizeof(end));
    /* Last, a hash of all of it: a stream changed or cut is refused. */
    uint64_t hash = XXH3_64bits_digest(f.hash);
    if (rc == 0)
        rc = write_full(fd, &hash, sizeof(hash));
    if (rc < 0)
        errmsg(why, cap, rc, "writing the session's files: %s", strerror(-rc));
    ws_index_free(&ix);
    XXH3_freeState(f.hash);
    free(buf);
    return rc;
}

/* Reads exactly |n| bytes, counting them against the budget. */
static int in_exact(struct fstream *f, void *p, size_t n)
{
    if (n > f->budget)
        return -EFBIG;
    ssize_t got = read_full(f->fd, p, n);
    if (got < 0)
        return (int)got;
    if ((size_t)got != n)
        return -EPIPE;
    f->budget -= n;
    XXH3_64bits_update(f->hash, p, n);
    return 0;
}

/* A file's extents and bytes, from the stream into |fd|. */
static int read_file(struct fstream *in, int fd, const struct stream_entry *e, char *buf)
{
    struct extent *v = NULL;
    int rc = 0;

    if (e->n_extents > e->size || e->n_extents > (1u << 20))
        return -EPROTO;
    if (e->n_extents && !(v = malloc(e->n_extents * sizeof(*v))))
        return -ENOMEM;
    if (e->n_extents)
        rc = in_exact(in, v, e->n_extents * sizeof(*v));
    uint64_t end = 0;
    for (uint32_t k = 0; rc == 0 && k < e->n_extents; k++) {
        if (v[k].at < end || !v[k].len || v[k].len > e->size || v[k].at > e->size - v[k].len) {
            rc = -EPROTO;
            break;
        }
        end = v[k].at + v[k].len;
        for (uint64_t at = v[k].at; rc == 0 && at < end;) {
            size_t want = end - at < COPY_CHUNK ? end - at : COPY_CHUNK;
            rc = in_exact(in, buf, want);
            for (size_t done = 0; rc == 0 && done < want;) {
                ssize_t m = pwrite(fd, buf + done, want - done, (off_t)(at + done));
                if (m < 0 && errno == EINTR)
                    continue;
                if (m <= 0)
                    rc = m < 0 ? -errno : -EIO;
                else
                    done += (size_t)m;
            }
            at += want;
        }
    }
    free(v);
    if (rc == 0 && ftruncate(fd, (off_t)e->size) < 0)
        rc = -errno;
    return rc;
}

int ws_read_stream(int fd, int root, uint64_t max_bytes, char *why, size_t cap)
{
    struct ws_index ix = {0};
    struct fstream f = {.fd = fd, .hash = XXH3_createState(), .budget = max_bytes}, *in = &f;
    char *buf = malloc(COPY_CHUNK);
    int rc = buf && f.hash ? 0 : -ENOMEM;
    struct {
        char magic[8];
        uint32_t version, reserved;
    } head;

    if (rc == 0) {
        XXH3_64bits_reset(f.hash);
        rc = in_exact(in, &head, sizeof(head));
    }
    if (rc == 0 &&
        (memcmp(head.magic, STREAM_MAGIC, sizeof(head.magic)) || head.version != STREAM_VERSION))
        rc = -EPROTO;
    for (;;) {
        struct stream_entry e;
        if (rc < 0 || (rc = in_exact(in, &e, sizeof(e))) < 0 || e.kind == SK_END)
            break;
        /* The entry, as an index of the tree takes it (its parent earlier,
         * a directory; its name one component), so that it is made
         * beneath |root| a component at a time, as every copy is. */
        char name[NAME_MAX + 1], leaf[NAME_MAX + 1];
        if (e.kind > SK_HARD || !e.name_len || e.name_len > NAME_MAX ||
            (e.parent != WS_NONE && (e.parent >= ix.n || !S_ISDIR(ix.v[e.parent].mode))) ||
            (e.kind == SK_HARD &&
             (e.link_to >= ix.n || !S_ISREG(ix.v[e.link_to].mode) || ix.v[e.link_to].nlink))) {
            rc = -EPROTO;
            break;
        }
        if ((rc = in_exact(in, name, e.name_len)) < 0)
            break;
        name[e.name_len] = '\0';
        if (strlen(name) != e.name_len || strchr(name, '/') || strcmp(name, ".") == 0 ||
            strcmp(name, "..") == 0) {
            rc = -EPROTO;
            break;
        }
        static const mode_t types[] = {0, S_IFREG, S_IFDIR, S_IFLNK, S_IFIFO, S_IFREG};
        struct stat st = {.st_mode = types[e.kind] | (e.mode & 07777),
                          .st_mtim = {(time_t)e.mtime_sec, e.mtime_nsec % 1000000000u}};
        struct walk w = {.ix = &ix, .why = why, .cap = cap};
        if ((rc = add_node(&w, e.parent, name, &st)) < 0)
            break;
        uint32_t i = ix.n - 1;
        ix.v[i].nlink = e.kind == SK_HARD; /* a name of another: not a link target */
        unsigned depth = 0;
        for (uint32_t p = e.parent; p != WS_NONE; p = ix.v[p].parent)
            depth++;
        if (depth > WS_MAX_DEPTH) {
            rc = -E2BIG;
            break;
        }
        int dir = open_parent(root, &ix, i, leaf);
        if (dir < 0) {
            rc = dir;
            break;
        }
        struct timespec times[2] = {{.tv_nsec = UTIME_OMIT}, st.st_mtim};
        if (e.kind == SK_FILE) {
            int out = openat(dir, leaf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
            rc = out < 0 ? -errno : read_file(in, out, &e, buf);
            if (rc == 0)
                rc = finish_file(out, &ix.v[i]);
            if (out >= 0)
                close(out);
        } else if (e.kind == SK_DIR)
            rc = mkdirat(dir, leaf, 0700) < 0 ? -errno : 0;
        else if (e.kind == SK_FIFO)
            rc = mkfifoat(dir, leaf, e.mode & 07777) < 0 ? -errno : 0;
        else if (e.kind == SK_HARD) {
            char to[NAME_MAX + 1];
            int todir = open_parent(root, &ix, e.link_to, to);
            rc = todir < 0 ? todir : linkat(todir, to, dir, leaf, 0) < 0 ? -errno : 0;
            if (todir >= 0)
                close(todir);
        } else {
            char target[PATH_MAX + 1];
            if (e.size > PATH_MAX)
                rc = -EPROTO;
            else if ((rc = in_exact(in, target, (size_t)e.size)) == 0) {
                target[e.size] = '\0';
                rc = symlinkat(target, dir, leaf) < 0 ? -errno : 0;
                if (rc == 0)
                    (void)utimensat(dir, leaf, times, AT_SYMLINK_NOFOLLOW);
            }
        }
        close(dir);
    }
    /* What was read is what was written. */
    uint64_t hash = XXH3_64bits_digest(f.hash), said = 0;
    if (rc == 0 && (read_full(fd, &said, sizeof(said)) != (ssize_t)sizeof(said) || said != hash))
        rc = -EBADMSG;
    /* Directories last, their modes and times, deepest first. */
    for (uint32_t i = ix.n; rc == 0 && i-- > 0;) {
        if (!S_ISDIR(ix.v[i].mode))
            continue;
        char leaf[NAME_MAX + 1];
        int dir = open_parent(root, &ix, i, leaf);
        struct timespec times[2] = {{.tv_nsec = UTIME_OMIT}, ix.v[i].mtime};
        rc = dir < 0 ? dir : chmod_nofollow(dir, leaf, ix.v[i].mode & 07777);
        if (rc == 0 && utimensat(dir, leaf, times, AT_SYMLINK_NOFOLLOW) < 0)
            rc = -errno;
        if (dir >= 0)
            close(dir);
    }
    if (rc < 0)
        errmsg(why, cap, rc, "reading the session's files: %s",
               rc == -EPROTO    ? "the stream is out of form"
               : rc == -EBADMSG ? "the stream is not as it was written (its check fails)"
                                : strerror(-rc));
    ws_index_free(&ix);
    XXH3_freeState(f.hash);
    free(buf);
    return rc;
}
