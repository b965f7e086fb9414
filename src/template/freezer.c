#define _GNU_SOURCE
#include "freezer.h"

#include "sysutil.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define SANDBOX_PREFIX "pysbx-"

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

/* Each cgroup under |dir| whose name starts with |prefix|, removed if it
 * is empty (after its own children, one level down). A sandbox's
 * directory (|depth| 1) only once no template holds its lock: a live
 * template keeps it locked for its whole life, the kernel lets go when
 * the template is gone, whatever pid namespace either of us is in. */
static void remove_empty(int dir, const char *prefix, int depth)
{
    int fd = openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;

    if (!d) {
        if (fd >= 0)
            close(fd);
        return;
    }
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_type != DT_DIR || e->d_name[0] == '.' ||
            strncmp(e->d_name, prefix, strlen(prefix)) != 0)
            continue;
        int sub = depth ? openat(dir, e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
        if (depth && (sub < 0 || flock(sub, LOCK_EX | LOCK_NB) < 0)) {
            if (sub >= 0)
                close(sub);
            continue;
        }
        if (sub >= 0) {
            remove_empty(sub, "", depth - 1);
            close(sub);
        }
        (void)unlinkat(dir, e->d_name, AT_REMOVEDIR);
    }
    closedir(d);
}

pid_t freezer_fork_into(const struct freezer_cg *cg)
{
    struct clone_args args = {
        .flags = CLONE_INTO_CGROUP,
        .exit_signal = SIGCHLD,
        .cgroup = (uint64_t)cg->dir,
    };

    return (pid_t)syscall(SYS_clone3, &args, sizeof(args));
}

int freezer_cg_set(const struct freezer_cg *cg, bool frozen)
{
    return pwrite(cg->freeze, frozen ? "1" : "0", 1, 0) == 1 ? 0 : -errno;
}

int freezer_cg_new(struct freezer *f, uint64_t id, struct freezer_cg *cg)
{
    char name[32];
    int rc = 0;

    *cg = (struct freezer_cg){.dir = -1, .freeze = -1};
    fmt(name, sizeof(name), "s%llu", (unsigned long long)id);
    if (mkdirat(f->dir, name, 0700) < 0)
        return -errno;
    cg->dir = openat(f->dir, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (cg->dir < 0 || (cg->freeze = openat(cg->dir, "cgroup.freeze", O_WRONLY | O_CLOEXEC)) < 0)
        rc = -errno;
    if (rc < 0)
        freezer_cg_end(f, id, cg);
    return rc;
}

void freezer_cg_end(struct freezer *f, uint64_t id, struct freezer_cg *cg)
{
    char name[32];

    if (cg->dir >= 0 || cg->freeze >= 0) {
        fmt(name, sizeof(name), "s%llu", (unsigned long long)id);
        (void)unlinkat(f->dir, name, AT_REMOVEDIR);
    }
    close_fd(&cg->freeze);
    close_fd(&cg->dir);
}

/* A process of ours born in a session's cgroup, frozen and thawed, as a
 * session's will be: the kernel may refuse any of it (a cgroup delegated
 * elsewhere, a kernel before clone3's CLONE_INTO_CGROUP). */
static int try_out(struct freezer *f)
{
    struct freezer_cg cg;
    int rc = freezer_cg_new(f, 0, &cg);

    if (rc < 0)
        return rc;
    pid_t pid = freezer_fork_into(&cg);
    if (pid == 0) {
        syscall(SYS_pause);
        syscall(SYS_exit_group, 0);
    }
    rc = pid < 0 ? -errno : freezer_cg_set(&cg, true);
    if (rc == 0)
        rc = freezer_cg_set(&cg, false);
    if (pid > 0) {
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    freezer_cg_end(f, 0, &cg);
    return rc;
}

int freezer_open(struct freezer *f, char *why, size_t cap)
{
    char own[1024], path[1200];
    unsigned rnd = 0;
    const char *mount = NULL;
    int rc;

    *f = (struct freezer){.dir = -1};
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
    int parent = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (parent < 0) {
        fmt(why, cap, "the template's cgroup %s: %s", path, strerror(errno));
        return 0;
    }
    /* What templates killed before us left: gone once empty. */
    remove_empty(parent, SANDBOX_PREFIX, 1);
    /* Locked for our life (remove_empty). Another template's sweep may
     * take the empty directory between its making and our lock (the lock
     * refused, or a removed cgroup that has no files left): a new name. */
    for (int attempt = 0; attempt < 3; attempt++) {
        if (attempt) {
            close_fd(&f->dir);
            (void)unlinkat(parent, f->name, AT_REMOVEDIR);
        }
        (void)getrandom(&rnd, sizeof(rnd), 0);
        fmt(f->name, sizeof(f->name), SANDBOX_PREFIX "%d-%08x", (int)getpid(), rnd);
        rc = mkdirat(parent, f->name, 0700) < 0 ? -errno : 0;
        if (rc == 0) {
            f->dir = openat(parent, f->name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            rc = f->dir < 0 ? -errno : 0;
        }
        if (rc == 0)
            rc = flock(f->dir, LOCK_EX | LOCK_NB) < 0 ? -errno : try_out(f);
        if (rc != -ENOENT && rc != -EWOULDBLOCK)
            break;
    }
    if (rc < 0) {
        fmt(why, cap, "cgroup v2 at %s cannot be used here (%s)", path, strerror(-rc));
        close_fd(&f->dir);
        (void)unlinkat(parent, f->name, AT_REMOVEDIR);
        close(parent);
        f->name[0] = '\0';
        return 0;
    }
    close(parent);
    fmt(why, cap,
        "a session between cells is frozen: a cgroup v2 of its own in %s/%s, born in it, never "
        "moved",
        path, f->name);
    return 1;
}

void freezer_close(struct freezer *f)
{
    if (f->dir >= 0) {
        remove_empty(f->dir, "s", 0);
        /* Our own cgroup's directory: the parent of ours. */
        int parent = openat(f->dir, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (parent >= 0) {
            (void)unlinkat(parent, f->name, AT_REMOVEDIR);
            close(parent);
        }
    }
    close_fd(&f->dir);
}
