#define _GNU_SOURCE
#include "wssync.h"

#include "artifacts.h"
#include "sysutil.h"
#include "util.h"
#include "wire.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PATH_CAP 4096
/* Change times this close before the index was taken may share a clock
 * tick with a later change (file systems stamp them from a coarse clock):
 * those entries are compared by content. */
#define SAME_TICK_NS (50LL * 1000000LL)

struct list {
    struct ws_node *v;
    size_t n, cap;
};

static void nodes_free(struct ws_node *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i].path);
    free(v);
}

static int list_add(struct list *l, const char *path, const struct stat *st)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 32;
        struct ws_node *v = realloc(l->v, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    char *p = strdup(path);
    if (!p)
        return -ENOMEM;
    l->v[l->n++] =
        (struct ws_node){.path = p, .mode = st->st_mode, .ino = st->st_ino, .ctime = st->st_ctim};
    return 0;
}

static int by_path(const void *a, const void *b)
{
    return strcmp(((const struct ws_node *)a)->path, ((const struct ws_node *)b)->path);
}

static void sort(struct list *l)
{
    if (l->n > 1)
        qsort(l->v, l->n, sizeof(*l->v), by_path);
}

/* Calls |fn| for every entry beneath |dirfd| (depth first, parents before
 * their children), with its path in |path| (|len| bytes so far). */
typedef int (*visit_fn)(void *ctx, int dirfd, const char *leaf, const char *path,
                        const struct stat *st);

static int walk(int dir, char *path, size_t len, int depth, visit_fn fn, void *ctx)
{
    int fd = fcntl(dir, F_DUPFD_CLOEXEC, 0);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    int rc = 0;

    if (!d) {
        rc = -errno;
        if (fd >= 0)
            close(fd);
        return rc;
    }
    rewinddir(d);
    for (struct dirent *e; rc == 0 && (e = readdir(d));) {
        const char *n = e->d_name;
        if (n[0] == '.' && (n[1] == '\0' || (n[1] == '.' && n[2] == '\0')))
            continue;
        if (depth == 0 && strcmp(n, WIRE_VALUE_FILE) == 0)
            continue;
        size_t nlen = strlen(n);
        if (len + nlen + 2 > PATH_CAP) {
            rc = -ENAMETOOLONG;
            break;
        }
        struct stat st;
        if (fstatat(dirfd(d), n, &st, AT_SYMLINK_NOFOLLOW) < 0) {
            rc = -errno;
            break;
        }
        memcpy(path + len, n, nlen + 1);
        rc = fn(ctx, dirfd(d), n, path, &st);
        if (rc == 0 && S_ISDIR(st.st_mode)) {
            if (depth >= ARTIFACT_MAX_DEPTH) {
                rc = -ELOOP;
                break;
            }
            int sub = openat(dirfd(d), n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0) {
                rc = -errno;
                break;
            }
            path[len + nlen] = '/';
            rc = walk(sub, path, len + nlen + 1, depth + 1, fn, ctx);
            close(sub);
        }
    }
    closedir(d);
    path[len] = '\0';
    return rc;
}

static int walk_all(int ws_fd, visit_fn fn, void *ctx)
{
    char path[PATH_CAP + 1] = "";

    return walk(ws_fd, path, 0, 0, fn, ctx);
}

static int add_to_index(void *ctx, int dirfd, const char *leaf, const char *path,
                        const struct stat *st)
{
    (void)dirfd;
    (void)leaf;
    return list_add(ctx, path, st);
}

int ws_index_build(int ws_fd, struct ws_index *ix)
{
    struct list l = {0};
    int rc = walk_all(ws_fd, add_to_index, &l);

    if (rc < 0) {
        nodes_free(l.v, l.n);
        return rc;
    }
    sort(&l);
    ws_index_free(ix);
    ix->v = l.v;
    ix->n = l.n;
    clock_gettime(CLOCK_REALTIME, &ix->taken);
    return 0;
}

void ws_index_free(struct ws_index *ix)
{
    nodes_free(ix->v, ix->n);
    ix->v = NULL;
    ix->n = 0;
}

static struct ws_node *find(const struct ws_node *v, size_t n, const char *path)
{
    struct ws_node key = {.path = (char *)path};

    return n ? bsearch(&key, v, n, sizeof(*v), by_path) : NULL;
}

static int64_t ns(struct timespec t)
{
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Whether the two files (regular, or links) hold the same bytes. */
static bool same_content(int a_dir, const char *leaf, int saved_fd, const char *path,
                         const struct stat *st)
{
    char a[65536], b[65536];
    bool same = false;

    if (S_ISLNK(st->st_mode)) {
        int pfd = open_beneath(saved_fd, path, O_PATH, 0, false);
        ssize_t n = readlinkat(a_dir, leaf, a, sizeof(a));
        ssize_t m = pfd >= 0 ? readlinkat(pfd, "", b, sizeof(b)) : -1;
        if (pfd >= 0)
            close(pfd);
        return n >= 0 && n == m && memcmp(a, b, (size_t)n) == 0;
    }
    if (!S_ISREG(st->st_mode))
        return true; /* a FIFO holds nothing */
    int fa = openat(a_dir, leaf, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    int fb = open_beneath(saved_fd, path, O_RDONLY | O_NONBLOCK, 0, false);
    struct stat sb;
    if (fa >= 0 && fb >= 0 && fstat(fb, &sb) == 0 && sb.st_size == st->st_size &&
        sb.st_mode == st->st_mode && ns(sb.st_mtim) == ns(st->st_mtim)) {
        for (;;) {
            ssize_t n = read_full(fa, a, sizeof(a));
            ssize_t m = read_full(fb, b, sizeof(b));
            if (n < 0 || n != m || memcmp(a, b, (size_t)n) != 0)
                break;
            if (n == 0) {
                same = true;
                break;
            }
        }
    }
    if (fa >= 0)
        close(fa);
    if (fb >= 0)
        close(fb);
    return same;
}

struct diff {
    const struct ws_index *ix;
    int saved_fd;
    struct list changed;
    struct list now; /* everything there, the next index if it stays */
    bool *seen;
};

static int diff_visit(void *ctx, int dirfd, const char *leaf, const char *path,
                      const struct stat *st)
{
    struct diff *d = ctx;
    struct ws_node *old = find(d->ix->v, d->ix->n, path);

    if (old)
        d->seen[old - d->ix->v] = true;
    int rc = list_add(&d->now, path, st);
    if (rc < 0)
        return rc;
    if (old && (old->mode & S_IFMT) == (st->st_mode & S_IFMT)) {
        /* A directory's times move with its entries, which are looked at
         * one by one: only its mode matters. */
        if (S_ISDIR(st->st_mode) ? old->mode == st->st_mode
                                 : old->ino == st->st_ino && ns(old->ctime) == ns(st->st_ctim) &&
                                       (ns(old->ctime) + SAME_TICK_NS < ns(d->ix->taken) ||
                                        same_content(dirfd, leaf, d->saved_fd, path, st)))
            return 0;
    }
    return list_add(&d->changed, path, st);
}

int ws_diff(int ws_fd, int saved_fd, const struct ws_index *ix, struct ws_changes *out)
{
    struct diff d = {.ix = ix, .saved_fd = saved_fd, .seen = calloc(ix->n + 1, 1)};
    struct list gone = {0};
    int rc = d.seen ? walk_all(ws_fd, diff_visit, &d) : -ENOMEM;

    for (size_t i = 0; rc == 0 && i < ix->n; i++) {
        struct stat st = {.st_mode = ix->v[i].mode, .st_ino = ix->v[i].ino};
        if (!d.seen[i])
            rc = list_add(&gone, ix->v[i].path, &st);
    }
    free(d.seen);
    if (rc < 0) {
        nodes_free(d.changed.v, d.changed.n);
        nodes_free(d.now.v, d.now.n);
        nodes_free(gone.v, gone.n);
        return rc;
    }
    sort(&d.changed);
    sort(&d.now);
    *out = (struct ws_changes){d.changed.v, d.changed.n, gone.v, gone.n, d.now.v, d.now.n};
    clock_gettime(CLOCK_REALTIME, &out->walked);
    return 0;
}

void ws_index_take(struct ws_index *ix, struct ws_changes *c)
{
    ws_index_free(ix);
    ix->v = c->now;
    ix->n = c->n_now;
    ix->taken = c->walked;
    c->now = NULL;
    c->n_now = 0;
}

bool ws_changed(const struct ws_changes *c, const char *path)
{
    return find(c->changed, c->n_changed, path) != NULL;
}

void ws_changes_free(struct ws_changes *c)
{
    nodes_free(c->changed, c->n_changed);
    nodes_free(c->gone, c->n_gone);
    nodes_free(c->now, c->n_now);
    memset(c, 0, sizeof(*c));
}

/* The directory holding |path| beneath |root| (with |make|, made if
 * missing) and the last component. Returns a descriptor or -errno. */
static int parent_of(int root, const char *path, const char **leaf, bool make)
{
    const char *slash = strrchr(path, '/');
    char dir[PATH_CAP + 1];

    *leaf = slash ? slash + 1 : path;
    if (!slash) {
        int fd = fcntl(root, F_DUPFD_CLOEXEC, 0);
        return fd < 0 ? -errno : fd;
    }
    fmt(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    if (make) {
        /* open_beneath makes the parents of its last component. */
        int fd = open_beneath(root, dir, O_RDONLY | O_DIRECTORY, 0, true);
        if (fd != -ENOENT)
            return fd;
        char mk[PATH_CAP + 3];
        fmt(mk, sizeof(mk), "%s/.", dir);
        int p = open_beneath(root, mk, O_RDONLY | O_DIRECTORY, 0, true);
        if (p >= 0)
            close(p);
    }
    return open_beneath(root, dir, O_RDONLY | O_DIRECTORY, 0, false);
}

/* Removes |path| beneath |root|, whatever it is; gone already is fine. */
static int remove_node(int root, const char *path)
{
    const char *leaf;
    int dir = parent_of(root, path, &leaf, false);
    struct stat st;
    int rc = 0;

    if (dir == -ENOENT)
        return 0;
    if (dir < 0)
        return dir;
    if (fstatat(dir, leaf, &st, AT_SYMLINK_NOFOLLOW) < 0)
        rc = errno == ENOENT ? 0 : -errno;
    else if (S_ISDIR(st.st_mode))
        rc = remove_tree_at(dir, leaf);
    else if (unlinkat(dir, leaf, 0) < 0)
        rc = -errno;
    close(dir);
    return rc;
}

static int copy_bytes(int from, int to)
{
    char buf[65536];

    for (;;) {
        ssize_t n = copy_file_range(from, NULL, to, NULL, 1 << 30, 0);
        if (n == 0)
            return 0;
        if (n > 0)
            continue;
        if (errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
            return -errno;
        break;
    }
    for (;;) {
        ssize_t n = read_full(from, buf, sizeof(buf));
        if (n < 0)
            return (int)n;
        if (n == 0)
            return 0;
        if (write_full(to, buf, (size_t)n) < 0)
            return -errno;
    }
}

/* Copies the entry |path| (not what a directory holds) from |src| to
 * |dst|, replacing what |dst| had there unless both are directories. */
static int copy_node(int src, int dst, const char *path)
{
    const char *leaf, *dleaf;
    int sdir = parent_of(src, path, &leaf, false);
    int ddir = sdir >= 0 ? parent_of(dst, path, &dleaf, true) : -1;
    struct stat st, old;
    int in = -1, out = -1;
    int rc = 0;

    if (sdir < 0 || ddir < 0) {
        /* Nothing there to copy (a cell's new file, on its way back). */
        rc = sdir == -ENOENT ? 0 : sdir < 0 ? sdir : ddir;
        goto out;
    }
    if (fstatat(sdir, leaf, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        rc = errno == ENOENT ? 0 : -errno; /* nothing to copy */
        goto out;
    }
    bool had = fstatat(ddir, dleaf, &old, AT_SYMLINK_NOFOLLOW) == 0;
    if (had && !(S_ISDIR(old.st_mode) && S_ISDIR(st.st_mode)) && (rc = remove_node(dst, path)) < 0)
        goto out;
    if (S_ISDIR(st.st_mode)) {
        if (mkdirat(ddir, dleaf, 0700) < 0 && errno != EEXIST)
            rc = -errno;
        else if (fchmodat(ddir, dleaf, st.st_mode & 07777, 0) < 0)
            rc = -errno;
    } else if (S_ISLNK(st.st_mode)) {
        char target[PATH_CAP + 1];
        ssize_t n = readlinkat(sdir, leaf, target, PATH_CAP);
        if (n < 0)
            rc = -errno;
        else {
            target[n] = '\0';
            rc = symlinkat(target, ddir, dleaf) < 0 ? -errno : 0;
        }
    } else if (S_ISFIFO(st.st_mode)) {
        if (mkfifoat(ddir, dleaf, st.st_mode & 07777) < 0 ||
            fchmodat(ddir, dleaf, st.st_mode & 07777, 0) < 0)
            rc = -errno;
    } else if (S_ISREG(st.st_mode)) {
        in = openat(sdir, leaf, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        out = in < 0
                  ? -1
                  : openat(ddir, dleaf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        struct timespec times[2] = {st.st_atim, st.st_mtim};
        if (in < 0 || out < 0 || (rc = copy_bytes(in, out)) < 0 ||
            fchmod(out, st.st_mode & 07777) < 0 || futimens(out, times) < 0)
            rc = rc < 0 ? rc : -errno;
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

int ws_commit(int ws_fd, int saved_fd, const struct ws_changes *c)
{
    int rc = 0;

    /* Children before their directories. */
    for (size_t i = c->n_gone; rc == 0 && i-- > 0;)
        rc = remove_node(saved_fd, c->gone[i].path);
    /* Directories before what they hold. */
    for (size_t i = 0; rc == 0 && i < c->n_changed; i++)
        rc = copy_node(ws_fd, saved_fd, c->changed[i].path);
    return rc;
}

int ws_restore(int ws_fd, int saved_fd, const struct ws_changes *c)
{
    int rc = 0;

    /* What the cell made or changed goes (a directory that was there
     * before stays, its mode put back below)... */
    for (size_t i = c->n_changed; rc == 0 && i-- > 0;) {
        const struct ws_node *n = &c->changed[i];
        struct stat st;
        int fd = open_beneath(saved_fd, n->path, O_PATH, 0, false);
        bool keep_dir = fd >= 0 && fstat(fd, &st) == 0 && S_ISDIR(st.st_mode) && S_ISDIR(n->mode);
        if (fd >= 0)
            close(fd);
        if (!keep_dir)
            rc = remove_node(ws_fd, n->path);
    }
    /* ... then what was there comes back, parents first: what it changed
     * and what it removed, merged in path order. */
    size_t i = 0, j = 0;
    while (rc == 0 && (i < c->n_changed || j < c->n_gone)) {
        bool take_changed =
            j >= c->n_gone || (i < c->n_changed && strcmp(c->changed[i].path, c->gone[j].path) < 0);
        const char *path = take_changed ? c->changed[i++].path : c->gone[j++].path;
        rc = copy_node(saved_fd, ws_fd, path);
    }
    return rc;
}
