#define _GNU_SOURCE
#include "sysutil.h"

#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

ssize_t read_full(int fd, void *buf, size_t len)
{
    size_t got = 0;

    while (got < len) {
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n == 0)
            break;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        got += (size_t)n;
    }
    return (ssize_t)got;
}

int write_full(int fd, const void *buf, size_t len)
{
    size_t done = 0;

    while (done < len) {
        ssize_t n = write(fd, (const char *)buf + done, len - done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        done += (size_t)n;
    }
    return 0;
}

void close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

void close_fds(int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        close_fd(&fds[i]);
}

int64_t timeval_us(struct timeval tv)
{
    return (int64_t)tv.tv_sec * 1000000 + tv.tv_usec;
}

uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

int open_beneath(int dirfd, const char *relpath, int flags, mode_t mode, bool make_parents)
{
    char comp[NAME_MAX + 1];
    const char *p = relpath;
    int cur = -1;
    int rc;

    for (;;) {
        const char *slash = strchr(p, '/');
        if (!slash)
            break;
        size_t n = (size_t)(slash - p);
        if (n == 0 || n > NAME_MAX) {
            rc = -EINVAL;
            goto out;
        }
        memcpy(comp, p, n);
        comp[n] = '\0';
        int base = cur >= 0 ? cur : dirfd;
        int next = openat(base, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0 && errno == ENOENT && make_parents) {
            if (mkdirat(base, comp, 0755) < 0 && errno != EEXIST) {
                rc = -errno;
                goto out;
            }
            next = openat(base, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        }
        if (next < 0) {
            rc = -errno;
            goto out;
        }
        if (cur >= 0)
            close(cur);
        cur = next;
        p = slash + 1;
    }
    rc = openat(cur >= 0 ? cur : dirfd, p, flags | O_NOFOLLOW | O_CLOEXEC, mode);
    if (rc < 0)
        rc = -errno;
out:
    if (cur >= 0)
        close(cur);
    return rc;
}

/* The removal walk keeps, per level below the top, the directory's name
 * and, every CHECKPOINT_EVERY levels, an open descriptor: re-opening a
 * level starts from the nearest checkpoint above it and goes down by name.
 * It never goes up with "..", so a directory renamed during the walk cannot
 * lead it out of the tree, and it holds few descriptors however deep the
 * tree is. */
#define CHECKPOINT_EVERY 64

struct level {
    char *name; /* in its parent; NULL for the top */
    int fd;     /* a checkpoint, or -1 */
};

/* Opens |name| beneath |dirfd| as a directory on device |dev|, following
 * nothing. Returns the descriptor or -errno (-EXDEV: another file system). */
static int open_subdir(int dirfd, const char *name, dev_t dev)
{
    struct stat st;
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int rc;

    if (fd < 0)
        return -errno;
    rc = fstat(fd, &st) < 0 ? -errno : st.st_dev != dev ? -EXDEV : fd;
    if (rc < 0)
        close(fd);
    return rc;
}

static int open_level(const struct level *lv, size_t depth, dev_t dev)
{
    size_t k = depth;

    while (lv[k].fd < 0)
        k--;
    /* A new open file description, not a dup: a dup would share the
     * directory's read position with the checkpoint. */
    int fd = openat(lv[k].fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    for (size_t i = k + 1; i <= depth; i++) {
        int next = open_subdir(fd, lv[i].name, dev);
        close(fd);
        if (next < 0)
            return next;
        fd = next;
    }
    return fd;
}

/* Adds a level (taking |name| and |fd|, released on failure). */
static int push_level(struct level **lv, size_t *n, size_t *cap, char *name, int fd)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        struct level *grown = realloc(*lv, c * sizeof(**lv));
        if (!grown) {
            free(name);
            if (fd >= 0)
                close(fd);
            return -ENOMEM;
        }
        *lv = grown;
        *cap = c;
    }
    (*lv)[(*n)++] = (struct level){name, fd};
    return 0;
}

static void pop_level(struct level *lv, size_t *n)
{
    struct level *l = &lv[--*n];
    free(l->name);
    if (l->fd >= 0)
        close(l->fd);
}

/* One pass over the directory |fd| (closed here): unlinks what it can.
 * Returns 1 with *sub (malloc'd) naming a non-empty subdirectory to
 * descend into, 0 when the directory is now empty, or -errno. */
static int clear_dir_pass(int fd, dev_t dev, unsigned long *removed, char **sub)
{
    DIR *d;
    struct dirent *e;
    int rc = 0;

    /* Made by the code (or we are root): make sure we can list and unlink
     * in it, whatever mode the code left on it. */
    (void)fchmod(fd, 0700);
    d = fdopendir(fd);
    if (!d) {
        int err = errno;
        close(fd);
        return -err;
    }
    while (rc == 0 && (e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        struct stat st;
        if (n[0] == '.' && (n[1] == '\0' || (n[1] == '.' && n[2] == '\0')))
            continue;
        if (unlinkat(dirfd(d), n, 0) == 0 || errno == ENOENT) {
            (*removed)++;
            continue;
        }
        if (errno != EISDIR && errno != EPERM)
            continue;
        if (unlinkat(dirfd(d), n, AT_REMOVEDIR) == 0) {
            (*removed)++;
            continue;
        }
        if (errno != ENOTEMPTY && errno != EEXIST && errno != EACCES)
            continue;
        /* A directory we cannot remove as it is: go in, unless it is
         * another file system (a mount point is never ours to empty). */
        if (fstatat(dirfd(d), n, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode) ||
            st.st_dev != dev)
            continue;
        (void)chmod_nofollow(dirfd(d), n, 0700);
        *sub = strdup(n);
        rc = *sub ? 1 : -ENOMEM;
    }
    closedir(d);
    return rc;
}

static int walk_tree(int parent_fd, const char *name, bool remove_top)
{
    struct level *lv = NULL;
    size_t n = 0, cap = 0; /* lv[0] is the top, lv[n - 1] where the walk is */
    unsigned long removed = 0, removed_at_last_climb = ULONG_MAX;
    struct stat st;
    int rc;

    int top = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (top < 0 && errno == EACCES) {
        (void)chmod_nofollow(parent_fd, name, 0700);
        top = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (top < 0)
        return (errno == ENOTDIR || errno == ELOOP) && remove_top
                   ? (unlinkat(parent_fd, name, 0) ? -errno : 0)
                   : -errno;
    if (fstat(top, &st) < 0) {
        rc = -errno;
        close(top);
        return rc;
    }
    rc = push_level(&lv, &n, &cap, NULL, top);
    while (rc == 0) {
        char *sub = NULL;
        int fd = open_level(lv, n - 1, st.st_dev);
        int r = fd < 0 ? fd : clear_dir_pass(fd, st.st_dev, &removed, &sub);
        if (r < 0) {
            rc = r;
            break;
        }
        if (r == 1) {
            rc = push_level(&lv, &n, &cap, sub, -1);
            if (rc == 0 && (n - 1) % CHECKPOINT_EVERY == 0) {
                int cfd = open_level(lv, n - 1, st.st_dev);
                if (cfd < 0)
                    rc = cfd;
                else
                    lv[n - 1].fd = cfd;
            }
            continue;
        }
        if (n == 1)
            break; /* the top is empty */
        /* Climbing back up with nothing removed since the last climb means a
         * directory that cannot be emptied: stop rather than loop. */
        if (removed == removed_at_last_climb) {
            rc = -ENOTEMPTY;
            break;
        }
        removed_at_last_climb = removed;
        pop_level(lv, &n);
    }
    while (n > 0)
        pop_level(lv, &n);
    free(lv);
    if (rc == 0 && remove_top && unlinkat(parent_fd, name, AT_REMOVEDIR) < 0)
        rc = -errno;
    return rc;
}

int remove_tree_at(int parent_fd, const char *name)
{
    return walk_tree(parent_fd, name, true);
}

int empty_tree_at(int parent_fd, const char *name)
{
    return walk_tree(parent_fd, name, false);
}

int fsid_enter(uid_t uid, gid_t gid, bool *switched)
{
    *switched = false;
    if (geteuid() != 0 || uid == 0)
        return 0;
    /* setfsuid and setfsgid return the previous id, never an error: ask
     * again to see whether the change took. */
    setfsgid(gid);
    setfsuid(uid);
    if ((uid_t)setfsuid((uid_t)-1) != uid || (gid_t)setfsgid((gid_t)-1) != gid) {
        fsid_leave(true);
        return -EPERM;
    }
    *switched = true;
    return 0;
}

int fsid_enter_owner(uid_t uid, gid_t gid, bool *switched)
{
    int rc = fsid_enter(uid, gid, switched);

    if (rc < 0 || !*switched)
        return rc;
    /* The kernel took the file-system capabilities out of the effective
     * set with the fsuid; those still permitted go back in, this thread
     * only (capabilities are per thread). */
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d) == 0) {
        static const int keep[] = {CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER};
        for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++)
            d[keep[i] / 32].effective |= d[keep[i] / 32].permitted & (1u << (keep[i] % 32));
        (void)syscall(SYS_capset, &h, d);
    }
    return 0;
}

int chmod_nofollow(int dirfd, const char *name, mode_t mode)
{
#ifndef SYS_fchmodat2
#define SYS_fchmodat2 452
#endif
    struct stat st;

    if (syscall(SYS_fchmodat2, dirfd, name, mode, AT_SYMLINK_NOFOLLOW) == 0)
        return 0;
    if (errno != ENOSYS)
        return -errno;
    /* Before Linux 6.6: a link is refused, anything else changed by name
     * (its callers act where nothing of the code runs any more). */
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return -errno;
    if (S_ISLNK(st.st_mode))
        return -ELOOP;
    return fchmodat(dirfd, name, mode, 0) == 0 ? 0 : -errno;
}

void fsid_leave(bool switched)
{
    if (!switched)
        return;
    setfsuid(geteuid());
    setfsgid(getegid());
}

const char *beside_self(const char *name, char *buf, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

    if (n <= 0)
        return NULL;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (!slash)
        return NULL;
    *slash = '\0';
    if ((size_t)snprintf(buf, cap, "%s/%s", self, name) >= cap)
        return NULL;
    return access(buf, X_OK) == 0 ? buf : NULL;
}

/* The time Py_GetBuildInfo() names ("main, Apr 28 2025, 14:11:48": the
 * compiler's __DATE__ and __TIME__, UTC under SOURCE_DATE_EPOCH), or -1. */
static time_t build_time(const char *build_info)
{
    const char *p = build_info ? strstr(build_info, ", ") : NULL;
    struct tm tm = {0};

    if (!p)
        return -1;
    const char *end = strptime(p + 2, "%b %d %Y, %H:%M:%S", &tm);
    return end ? timegm(&tm) : -1;
}

int python_build_problem(const char *stdlib_dir, const char *version, const char *build_info,
                         const char *lib_path, char *why, size_t cap)
{
    static const char key[] = "'VERSION': '";
    DIR *d = opendir(stdlib_dir);
    struct stat lib;
    time_t built = build_time(build_info);
    /* A stamped build: the core was built at its file's time. */
    bool stamped = built >= 0 && lib_path && stat(lib_path, &lib) == 0 && lib.st_mtime == built;
    int seen = 0, rc = 0;

    if (!d)
        return errmsg(why, cap, -errno, "the standard library %s: %s", stdlib_dir, strerror(errno));
    for (struct dirent *e; rc == 0 && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, "_sysconfigdata_", 15) != 0 || n < 3 ||
            strcmp(e->d_name + n - 3, ".py") != 0)
            continue;
        char text[65536], found[32] = "";
        struct stat st;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC);
        ssize_t got = fd >= 0 ? read_full(fd, text, sizeof(text) - 1) : -1;
        if (fd < 0 || got < 0 || fstat(fd, &st) < 0) {
            rc = errmsg(why, cap, fd < 0 ? -errno : -EIO, "the standard library's %s: %s",
                        e->d_name, strerror(errno));
            if (fd >= 0)
                close(fd);
            break;
        }
        close(fd);
        text[got] = '\0';
        const char *at = strstr(text, key);
        if (at)
            fmt(found, sizeof(found), "%.*s", (int)strcspn(at + strlen(key), "'"),
                at + strlen(key));
        seen++;
        /* Its major.minor (the file names no more) against the core's. */
        size_t mm = strlen(found);
        if (!mm || strncmp(found, version, mm) != 0 || (version[mm] != '.' && version[mm]))
            rc = errmsg(why, cap, -EINVAL,
                        "the standard library in %s is Python %s, the interpreter core "
                        "(libpython) %s: not one build (install or upgrade both together)",
                        stdlib_dir, found[0] ? found : "(unknown)", version);
        else if (stamped && st.st_mtime != built) {
            char a[32], b[32];
            strftime(a, sizeof(a), "%Y-%m-%d %H:%M:%S", gmtime(&built));
            strftime(b, sizeof(b), "%Y-%m-%d %H:%M:%S", gmtime(&st.st_mtime));
            rc = errmsg(why, cap, -EINVAL,
                        "the standard library in %s was built at %s UTC, the interpreter core "
                        "(libpython %s) at %s: not one build (install or upgrade both together)",
                        stdlib_dir, b, version, a);
        }
    }
    closedir(d);
    if (rc == 0 && seen == 0)
        rc = errmsg(why, cap, -EINVAL, "the standard library in %s has no _sysconfigdata file",
                    stdlib_dir);
    return rc;
}

int proc_stat_read(const char *pid, struct proc_stat *s)
{
    char path[300], buf[1024];
    unsigned long long ut, st, cut, cst;

    snprintf(path, sizeof(path), "/proc/%s/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t len = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (len <= 0)
        return -EIO;
    buf[len] = '\0';
    /* "pid (comm) state ppid ...": comm may hold spaces and parentheses. */
    char *open_paren = strchr(buf, '('), *close_paren = strrchr(buf, ')');
    int ppid, session;
    if (!open_paren || !close_paren ||
        sscanf(close_paren + 2, "%c %d %*d %d %*d %*d %*u %*u %*u %*u %*u %llu %llu %llu %llu",
               &s->state, &ppid, &session, &ut, &st, &cut, &cst) != 7)
        return -EIO;
    *close_paren = '\0';
    fmt(s->comm, sizeof(s->comm), "%s", open_paren + 1);
    s->pid = (pid_t)atoi(pid);
    s->ppid = (pid_t)ppid;
    s->session = (pid_t)session;
    s->cpu_ticks = ut + st + cut + cst;
    return 0;
}

int proc_children(pid_t parent, const char *comm, pid_t *out, int max, int *zombies)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    struct proc_stat ps;
    int n = 0;

    if (zombies)
        *zombies = 0;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9' || proc_stat_read(e->d_name, &ps) < 0)
            continue;
        if (ps.ppid != parent || (comm && strcmp(ps.comm, comm) != 0))
            continue;
        if (n < max)
            out[n] = ps.pid;
        n++;
        if (zombies && ps.state == 'Z')
            (*zombies)++;
    }
    if (d)
        closedir(d);
    return n;
}
