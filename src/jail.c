#define _GNU_SOURCE
#include "jail.h"

#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#define NOBODY 65534

static int write_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    ssize_t n;

    if (fd < 0)
        return -errno;
    n = write(fd, text, strlen(text));
    int e = errno;
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -e;
}

/* Not root: a user namespace in which we are root, mapped to ourselves. */
static bool enter_user_ns(struct jail *j)
{
    uid_t uid = geteuid();
    gid_t gid = getegid();
    char map[64];

    if (unshare(CLONE_NEWUSER) < 0) {
        fmt(j->user_why, sizeof(j->user_why), "not root, and no user namespace: %s",
            strerror(errno));
        return false;
    }
    snprintf(map, sizeof(map), "0 %u 1", (unsigned)uid);
    int e = write_file("/proc/self/uid_map", map);
    if (e == 0)
        e = write_file("/proc/self/setgroups", "deny");
    snprintf(map, sizeof(map), "0 %u 1", (unsigned)gid);
    if (e == 0)
        e = write_file("/proc/self/gid_map", map);
    if (e < 0) {
        fmt(j->user_why, sizeof(j->user_why), "user namespace maps: %s", strerror(-e));
        return false;
    }
    j->user_ns = true;
    fmt(j->user_why, sizeof(j->user_why),
        "not root: workers keep the caller's uid %u (inside a user namespace)", (unsigned)uid);
    return true;
}

static bool try_unshare(int flag, char *why, size_t cap, const char *what)
{
    if (unshare(flag) == 0) {
        fmt(why, cap, "%s", what);
        return true;
    }
    fmt(why, cap, "unshare: %s", strerror(errno));
    return false;
}

void jail_setup(struct jail *j, long uid, long gid, uint64_t workspace_bytes)
{
    memset(j, 0, sizeof(*j));
    j->sweep_fd = -1;
    j->sweeper = -1;
    j->workspace_bytes = workspace_bytes;
    if (geteuid() == 0) {
        j->switch_user = true;
        j->uid = uid >= 0 ? (uid_t)uid : NOBODY;
        j->gid = gid >= 0 ? (gid_t)gid : NOBODY;
        fmt(j->user_why, sizeof(j->user_why), "workers run as uid %u, gid %u",
            (unsigned)j->uid, (unsigned)j->gid);
    } else
        enter_user_ns(j);

    j->net_ns = try_unshare(CLONE_NEWNET, j->net_why, sizeof(j->net_why),
                            "a network namespace with no interface up");
    j->ipc_ns = try_unshare(CLONE_NEWIPC, j->ipc_why, sizeof(j->ipc_why),
                            "an IPC namespace of its own");
    j->uts_ns = try_unshare(CLONE_NEWUTS, j->uts_why, sizeof(j->uts_why),
                            "hostname \"sandbox\"");
    if (j->uts_ns && sethostname("sandbox", 7) < 0) {
        j->uts_ns = false;
        fmt(j->uts_why, sizeof(j->uts_why), "sethostname: %s", strerror(errno));
    }
    if (try_unshare(CLONE_NEWNS, j->mount_why, sizeof(j->mount_why), "")) {
        /* Nothing we mount may propagate back to the host. */
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
            fmt(j->mount_why, sizeof(j->mount_why), "making mounts private: %s",
                strerror(errno));
        else {
            j->mount_ns = true;
            fmt(j->mount_why, sizeof(j->mount_why),
                "each workspace a private tmpfs of %llu MiB",
                (unsigned long long)(workspace_bytes >> 20));
        }
    }
}

int jail_workspace(const struct jail *j, int base_fd, const char *name, const char *path,
                   char *err, size_t errlen)
{
    char opts[160];

    if (mkdirat(base_fd, name, 0700) < 0) {
        fmt(err, errlen, "making workspace %s: %s", path, strerror(errno));
        return -1;
    }
    if (j->mount_ns) {
        uid_t uid = j->switch_user ? j->uid : 0;
        gid_t gid = j->switch_user ? j->gid : 0;
        /* Bounded bytes and files, and nothing runnable or device-like. */
        snprintf(opts, sizeof(opts), "size=%llu,nr_inodes=%llu,mode=0700,uid=%u,gid=%u",
                 (unsigned long long)j->workspace_bytes,
                 (unsigned long long)(j->workspace_bytes / 4096 + 64), (unsigned)uid,
                 (unsigned)gid);
        if (mount("pysbx", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts) < 0) {
            fmt(err, errlen, "mounting the workspace tmpfs: %s", strerror(errno));
            unlinkat(base_fd, name, AT_REMOVEDIR);
            return -1;
        }
        return 0;
    }
    if (j->switch_user && fchownat(base_fd, name, j->uid, j->gid, AT_SYMLINK_NOFOLLOW) < 0) {
        fmt(err, errlen, "chown of workspace %s: %s", path, strerror(errno));
        unlinkat(base_fd, name, AT_REMOVEDIR);
        return -1;
    }
    return 0;
}

_Noreturn static void sweeper_main(const char *base_path, int base_fd, int in)
{
    char buf[4096];
    size_t have = 0;

    for (;;) {
        ssize_t n = read(in, buf + have, sizeof(buf) - have);
        if (n <= 0)
            _exit(0); /* the template is gone or done */
        have += (size_t)n;
        char *line;
        while ((line = memchr(buf, '\n', have))) {
            char path[4096 + 256];
            *line = '\0';
            snprintf(path, sizeof(path), "%s/%s", base_path, buf);
            (void)umount2(path, MNT_DETACH);
            (void)unlinkat(base_fd, buf, AT_REMOVEDIR);
            size_t used = (size_t)(line - buf) + 1;
            memmove(buf, buf + used, have - used);
            have -= used;
        }
        if (have == sizeof(buf))
            have = 0; /* no name is this long: drop it rather than stall */
    }
}

int jail_sweeper_start(struct jail *j, const char *base_path, int base_fd, char *err,
                       size_t errlen)
{
    int p[2];
    pid_t parent = getpid();

    j->sweep_fd = -1;
    j->sweeper = -1;
    if (!j->mount_ns)
        return 0;
    if (pipe2(p, O_CLOEXEC) < 0) {
        fmt(err, errlen, "sweeper pipe: %s", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        fmt(err, errlen, "sweeper fork: %s", strerror(errno));
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_NAME, "pysbx-sweeper");
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
            _exit(1);
        int in = fcntl(p[0], F_DUPFD_CLOEXEC, 3);
        int base = fcntl(base_fd, F_DUPFD_CLOEXEC, 4);
        if (in != 3 && dup2(in, 3) < 0)
            _exit(1);
        if (base != 4 && dup2(base, 4) < 0)
            _exit(1);
        close_range(5, ~0U, 0);
        sweeper_main(base_path, 4, 3);
    }
    close(p[0]);
    j->sweep_fd = p[1];
    j->sweeper = pid;
    return 0;
}

void jail_workspace_release(const struct jail *j, const char *name)
{
    char line[300];

    if (j->sweep_fd < 0)
        return;
    int n = snprintf(line, sizeof(line), "%s\n", name);
    if (n > 0 && (size_t)n < sizeof(line))
        (void)write_full(j->sweep_fd, line, (size_t)n);
}

void jail_sweeper_stop(struct jail *j)
{
    if (j->sweep_fd >= 0)
        close(j->sweep_fd);
    j->sweep_fd = -1;
    if (j->sweeper > 0)
        (void)waitpid(j->sweeper, NULL, 0);
    j->sweeper = -1;
}
