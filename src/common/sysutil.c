#define _GNU_SOURCE
#include "sysutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* One pass over the directory |fd| (owned; closed here): unlinks what it can.
 * Returns the fd of a non-empty subdirectory to descend into (with *removed
 * counting progress), -1 when the directory is now empty, or -2 - errno on a
 * failure that stops the walk. */
static int clear_dir_pass(int fd, unsigned long *removed)
{
    DIR *d;
    struct dirent *e;
    int sub = -1;

    /* Made by the code under our uid (or we are root): make sure we can list
     * and unlink in it, whatever mode the code left on it. */
    (void)fchmod(fd, 0700);
    d = fdopendir(fd);
    if (!d) {
        int err = errno;
        close(fd);
        return -2 - err;
    }
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
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
        sub = openat(dirfd(d), n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0 && errno == EACCES) {
            (void)fchmodat(dirfd(d), n, 0700, 0);
            sub = openat(dirfd(d), n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        }
        if (sub >= 0)
            break;
    }
    closedir(d);
    return sub;
}

int remove_tree_at(int parent_fd, const char *name)
{
    int fd = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    unsigned depth = 0;
    unsigned long removed = 0, removed_at_last_climb = ULONG_MAX;

    if (fd < 0) {
        if (errno == EACCES) {
            (void)fchmodat(parent_fd, name, 0700, 0);
            fd = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        }
        if (fd < 0)
            return errno == ENOTDIR || errno == ELOOP ? (unlinkat(parent_fd, name, 0) ? -errno : 0)
                                                      : -errno;
    }
    /* Deep trees are walked down and back up through "..", one descriptor at
     * a time: the code may have nested directories far deeper than we could
     * hold descriptors or stack frames for. The worker is dead by now, so
     * nothing renames a directory under us. */
    for (;;) {
        int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (dup_fd < 0) {
            int err = errno;
            close(fd);
            return -err;
        }
        int sub = clear_dir_pass(dup_fd, &removed);
        if (sub <= -2) {
            close(fd);
            return sub + 2;
        }
        if (sub >= 0) {
            close(fd);
            fd = sub;
            depth++;
            continue;
        }
        if (depth == 0)
            break;
        /* Climbing back up with nothing removed since the last climb means a
         * directory that cannot be emptied: stop rather than loop. */
        if (removed == removed_at_last_climb) {
            close(fd);
            return -ENOTEMPTY;
        }
        removed_at_last_climb = removed;
        int up = openat(fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        close(fd);
        if (up < 0)
            return -errno;
        fd = up;
        depth--;
    }
    close(fd);
    if (unlinkat(parent_fd, name, AT_REMOVEDIR) < 0)
        return -errno;
    return 0;
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

int proc_children(pid_t parent, const char *comm, pid_t *out, int max, int *zombies)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    int n = 0;

    if (zombies)
        *zombies = 0;
    while (d && (e = readdir(d))) {
        char path[300], buf[512];
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t len = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (len <= 0)
            continue;
        buf[len] = '\0';
        /* "pid (comm) state ppid ...": comm may hold spaces and parentheses. */
        char *open_paren = strchr(buf, '('), *close_paren = strrchr(buf, ')');
        char state;
        int ppid;
        if (!open_paren || !close_paren || sscanf(close_paren + 2, "%c %d", &state, &ppid) != 2)
            continue;
        *close_paren = '\0';
        if (ppid != parent || (comm && strcmp(open_paren + 1, comm) != 0))
            continue;
        if (n < max)
            out[n] = (pid_t)atoi(e->d_name);
        n++;
        if (zombies && state == 'Z')
            (*zombies)++;
    }
    if (d)
        closedir(d);
    return n;
}
