#define _GNU_SOURCE
#include "freezer.h"

#include "sysutil.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define FROZEN_PREFIX "pysbx-frozen-"

/* Where a cgroup v2 hierarchy is mounted: alone, or beside v1's (hybrid). */
static const char *const v2_mounts[] = {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"};

/* The template's own cgroup v2 path ("0::PATH" of /proc/self/cgroup). */
static int own_cgroup(char *path, size_t cap)
{
    char buf[4096];
    int fd = open("/proc/self/cgroup", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read_full(fd, buf, sizeof(buf) - 1) : -errno;

    if (fd >= 0)
        close(fd);
    if (n < 0)
        return (int)n;
    buf[n] = '\0';
    for (char *line = buf; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL)
        if (strncmp(line, "0::/", 4) == 0) {
            size_t len = strcspn(line + 3, "\n");
            if (len >= cap)
                return -ENAMETOOLONG;
            memcpy(path, line + 3, len);
            path[len] = '\0';
            return 0;
        }
    return -ENOENT;
}

static int write_text(int dir, const char *file, const char *text)
{
    int fd = openat(dir, file, O_WRONLY | O_CLOEXEC);
    int rc = fd < 0 ? -errno : write_full(fd, text, strlen(text));

    if (fd >= 0)
        close(fd);
    return rc;
}

static int move(int procs, pid_t pid)
{
    char text[16];

    fmt(text, sizeof(text), "%d", (int)pid);
    return write_full(procs, text, strlen(text));
}

/* The frozen cgroup, made (again) and opened. */
static int make_frozen(struct freezer *f)
{
    close_fd(&f->frozen);
    if (mkdirat(f->dir, f->name, 0700) < 0 && errno != EEXIST)
        return -errno;
    int child = openat(f->dir, f->name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (child < 0)
        return -errno;
    int rc = write_text(child, "cgroup.freeze", "1");
    if (rc == 0) {
        f->frozen = openat(child, "cgroup.procs", O_WRONLY | O_CLOEXEC);
        rc = f->frozen < 0 ? -errno : 0;
    }
    close(child);
    return rc;
}

/* Frozen cgroups that templates before us left (a template killed): gone
 * once empty. One of a living template's, empty for now, goes too; that
 * template makes it again (freezer_hold). */
static void sweep_stale(int dir)
{
    int fd = openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;

    if (!d) {
        if (fd >= 0)
            close(fd);
        return;
    }
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, FROZEN_PREFIX, strlen(FROZEN_PREFIX)) == 0)
            (void)unlinkat(dir, e->d_name, AT_REMOVEDIR);
    closedir(d);
}

/* A process of ours moved in and out, as a session's will be: the kernel
 * may refuse moves (a cgroup whose subtree is delegated elsewhere). */
static int try_moves(struct freezer *f)
{
    pid_t pid = (pid_t)syscall(SYS_clone, (unsigned long)SIGCHLD, 0UL, 0UL, 0UL, 0UL);

    if (pid == 0) {
        syscall(SYS_pause);
        syscall(SYS_exit_group, 0);
    }
    if (pid < 0)
        return -errno;
    int rc = move(f->frozen, pid);
    if (rc == 0)
        rc = move(f->home, pid);
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    return rc;
}

int freezer_open(struct freezer *f, char *why, size_t cap)
{
    char own[1024], path[1200];
    unsigned rnd = 0;
    const char *mount = NULL;
    int rc;

    *f = (struct freezer){.dir = -1, .home = -1, .frozen = -1};
    if ((rc = own_cgroup(own, sizeof(own))) < 0) {
        fmt(why, cap, "no cgroup v2 of the template's in /proc/self/cgroup (%s)", strerror(-rc));
        return 0;
    }
    for (size_t i = 0; i < sizeof(v2_mounts) / sizeof(v2_mounts[0]) && !mount; i++) {
        struct statfs sf;
        if (statfs(v2_mounts[i], &sf) == 0 && sf.f_type == CGROUP2_SUPER_MAGIC)
            mount = v2_mounts[i];
    }
    if (!mount) {
        fmt(why, cap, "no cgroup v2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified");
        return 0;
    }
    fmt(path, sizeof(path), "%s%s", mount, strcmp(own, "/") == 0 ? "" : own);
    f->dir = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (f->dir < 0) {
        fmt(why, cap, "the template's cgroup %s: %s", path, strerror(errno));
        return 0;
    }
    sweep_stale(f->dir);
    (void)getrandom(&rnd, sizeof(rnd), 0);
    fmt(f->name, sizeof(f->name), FROZEN_PREFIX "%d-%08x", (int)getpid(), rnd);
    f->home = openat(f->dir, "cgroup.procs", O_WRONLY | O_CLOEXEC);
    rc = f->home < 0 ? -errno : make_frozen(f);
    if (rc == 0)
        rc = try_moves(f);
    if (rc < 0) {
        fmt(why, cap, "cgroup v2 at %s cannot be written here (%s)", path, strerror(-rc));
        freezer_close(f);
        return 0;
    }
    fmt(why, cap, "a session's stopped processes are frozen (cgroup v2, %s/%s)", path, f->name);
    return 1;
}

int freezer_hold(struct freezer *f, pid_t pid)
{
    if (f->dir < 0)
        return -ENOTSUP;
    int rc = move(f->frozen, pid);
    /* The cgroup was removed under us (sweep_stale of another template):
     * made again. */
    if (rc == -ENODEV || rc == -ENOENT) {
        rc = make_frozen(f);
        if (rc == 0)
            rc = move(f->frozen, pid);
    }
    return rc;
}

int freezer_release(struct freezer *f, pid_t pid)
{
    return f->dir < 0 ? -ENOTSUP : move(f->home, pid);
}

void freezer_close(struct freezer *f)
{
    if (f->dir >= 0 && f->name[0])
        (void)unlinkat(f->dir, f->name, AT_REMOVEDIR);
    close_fd(&f->frozen);
    close_fd(&f->home);
    close_fd(&f->dir);
}
