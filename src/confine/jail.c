#define _GNU_SOURCE
#include "jail.h"

#include "pysbx.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <sched.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

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

#define NEWUIDMAP "/usr/bin/newuidmap"
#define NEWGIDMAP "/usr/bin/newgidmap"

/* The subordinate range of |name| or |id| in /etc/subuid or /etc/subgid
 * ("who:start:count"), as the setuid helpers newuidmap/newgidmap will
 * grant it. Returns the count (0: none). */
static unsigned long subid_range(const char *file, const char *name, unsigned id,
                                 unsigned long *start)
{
    char line[512], idtext[16];
    unsigned long count = 0;
    FILE *f = fopen(file, "re");

    fmt(idtext, sizeof(idtext), "%u", id);
    while (f && !count && fgets(line, sizeof(line), f)) {
        char *who = strtok(line, ":"), *s = strtok(NULL, ":"), *c = strtok(NULL, ":\n");
        if (!who || !s || !c || (strcmp(who, idtext) != 0 && (!name || strcmp(who, name) != 0)))
            continue;
        *start = strtoul(s, NULL, 10);
        count = strtoul(c, NULL, 10);
    }
    if (f)
        fclose(f);
    return count;
}

static int spawn_wait(const char *prog, char *const argv[])
{
    char *const envp[] = {NULL};
    pid_t pid;
    int st;

    if (posix_spawn(&pid, prog, NULL, NULL, argv, envp) != 0)
        return -1;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* Maps 0 to ourselves and 1..n to our subordinate ids, through the setuid
 * helpers, which must act from outside the new namespace: a child, forked
 * before the unshare, does it once we are in. Returns the number of ids
 * mapped above 0, or 0 (the caller then maps only itself). */
static unsigned long map_subids(struct jail *j, unsigned want)
{
    uid_t uid = geteuid();
    gid_t gid = getegid();
    struct passwd *pw = getpwuid(uid);
    unsigned long us = 0, gs = 0;
    unsigned long un = subid_range("/etc/subuid", pw ? pw->pw_name : NULL, uid, &us);
    unsigned long gn = subid_range("/etc/subgid", pw ? pw->pw_name : NULL, uid, &gs);
    unsigned long n = un < gn ? un : gn;
    int sync[2];

    if (n > want)
        n = want;
    if (n < 2 || access(NEWUIDMAP, X_OK) < 0 || access(NEWGIDMAP, X_OK) < 0) {
        fmt(j->uidrun_why, sizeof(j->uidrun_why),
            n < 2 ? "not root, and no subordinate ids (/etc/subuid, /etc/subgid): every worker "
                    "runs as the caller's uid"
                  : "not root, and no newuidmap/newgidmap: every worker runs as the caller's uid");
        return 0;
    }
    if (pipe2(sync, O_CLOEXEC) < 0)
        return 0;
    pid_t parent = getpid();
    pid_t helper = fork();
    if (helper == 0) {
        char c, p[16], u[16], g[16], a[16], b[16], k[16];
        close(sync[1]);
        if (read(sync[0], &c, 1) != 1)
            _exit(1);
        fmt(p, sizeof(p), "%d", (int)parent);
        fmt(k, sizeof(k), "%lu", n);
        fmt(u, sizeof(u), "%u", (unsigned)uid);
        fmt(a, sizeof(a), "%lu", us);
        char *const uargv[] = {"newuidmap", p, "0", u, "1", "1", a, k, NULL};
        fmt(g, sizeof(g), "%u", (unsigned)gid);
        fmt(b, sizeof(b), "%lu", gs);
        char *const gargv[] = {"newgidmap", p, "0", g, "1", "1", b, k, NULL};
        _exit(spawn_wait(NEWUIDMAP, uargv) == 0 && spawn_wait(NEWGIDMAP, gargv) == 0 ? 0 : 1);
    }
    close(sync[0]);
    if (helper < 0) {
        close(sync[1]);
        return 0;
    }
    int st = 1;
    bool in = unshare(CLONE_NEWUSER) == 0;
    (void)!write(sync[1], "x", 1);
    close(sync[1]);
    while (waitpid(helper, &st, 0) < 0 && errno == EINTR)
        ;
    if (!in) {
        fmt(j->user_why, sizeof(j->user_why), "not root, and no user namespace: %s",
            strerror(errno));
        return (unsigned long)-1;
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fmt(j->uidrun_why, sizeof(j->uidrun_why),
            "newuidmap/newgidmap refused the subordinate ids: every worker runs as the caller's "
            "uid");
        return 0;
    }
    return n;
}

/* Not root: a user namespace in which we are root, mapped to ourselves, and
 * where the caller has subordinate ids, each worker one of its own. */
static bool enter_user_ns(struct jail *j, unsigned want_ids)
{
    uid_t uid = geteuid();
    gid_t gid = getegid();
    char map[64];
    int e = 0;

    unsigned long n = want_ids ? map_subids(j, want_ids) : 0;
    if (n == (unsigned long)-1)
        return false;
    j->in_userns = true;
    if (n > 0) {
        j->switch_user = true;
        j->uid_base = 1;
        j->gid_base = 1;
        j->ids = (unsigned)n;
        j->uid_per_run = true;
        fmt(j->user_why, sizeof(j->user_why),
            "not root: workers run as %lu subordinate uids of the caller %u (newuidmap)", n,
            (unsigned)uid);
        fmt(j->uidrun_why, sizeof(j->uidrun_why),
            "each worker its own subordinate uid and gid, reused only once its worker is dead "
            "and its workspace gone (%lu ids)",
            n);
        return true;
    }
    if (unshare(CLONE_NEWUSER) < 0) {
        fmt(j->user_why, sizeof(j->user_why), "not root, and no user namespace: %s",
            strerror(errno));
        return false;
    }
    snprintf(map, sizeof(map), "0 %u 1", (unsigned)uid);
    e = write_file("/proc/self/uid_map", map);
    if (e == 0)
        e = write_file("/proc/self/setgroups", "deny");
    snprintf(map, sizeof(map), "0 %u 1", (unsigned)gid);
    if (e == 0)
        e = write_file("/proc/self/gid_map", map);
    if (e < 0) {
        fmt(j->user_why, sizeof(j->user_why), "user namespace maps: %s", strerror(-e));
        return false;
    }
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

static bool disabled(const struct jail_config *c, enum sbx_layer l, char *why, size_t cap)
{
    if (!(c->disable & l))
        return false;
    fmt(why, cap, "turned off by the configuration (disable_layers)");
    return true;
}

void jail_setup(struct jail *j, const struct jail_config *c)
{
    memset(j, 0, sizeof(*j));
    j->workspace_bytes = c->workspace_bytes;
    j->ids = c->ids;
    if (geteuid() == 0 && !disabled(c, SBX_LAYER_USER, j->user_why, sizeof(j->user_why))) {
        j->switch_user = true;
        j->uid_base = (uid_t)c->uid_base;
        j->gid_base = (gid_t)c->gid_base;
        fmt(j->user_why, sizeof(j->user_why), "workers run as uids %u-%u, gids %u-%u",
            (unsigned)j->uid_base, (unsigned)(j->uid_base + j->ids - 1), (unsigned)j->gid_base,
            (unsigned)(j->gid_base + j->ids - 1));
        if (disabled(c, SBX_LAYER_UIDRUN, j->uidrun_why, sizeof(j->uidrun_why)))
            j->ids = 1;
        if (j->ids > 1) {
            j->uid_per_run = true;
            fmt(j->uidrun_why, sizeof(j->uidrun_why),
                "a uid and gid per worker, reused once it is dead and its workspace gone (%u "
                "ids)",
                j->ids);
        } else if (!(c->disable & SBX_LAYER_UIDRUN))
            fmt(j->uidrun_why, sizeof(j->uidrun_why), "one uid for every worker (worker_ids 1)");
    } else if (geteuid() != 0) {
        fmt(j->uidrun_why, sizeof(j->uidrun_why),
            "not root: every worker runs as the caller's uid");
        if (!disabled(c, SBX_LAYER_UIDRUN, j->uidrun_why, sizeof(j->uidrun_why)))
            enter_user_ns(j, c->ids);
        else
            enter_user_ns(j, 0);
    } else
        fmt(j->uidrun_why, sizeof(j->uidrun_why), "workers keep root's uid (user layer off)");

    if (!disabled(c, SBX_LAYER_NETNS, j->net_why, sizeof(j->net_why)))
        j->net_ns = try_unshare(CLONE_NEWNET, j->net_why, sizeof(j->net_why),
                                "a network namespace with no interface up");
    if (!disabled(c, SBX_LAYER_IPCNS, j->ipc_why, sizeof(j->ipc_why)))
        j->ipc_ns = try_unshare(CLONE_NEWIPC, j->ipc_why, sizeof(j->ipc_why),
                                "an IPC namespace of its own");
    if (!disabled(c, SBX_LAYER_UTSNS, j->uts_why, sizeof(j->uts_why))) {
        j->uts_ns =
            try_unshare(CLONE_NEWUTS, j->uts_why, sizeof(j->uts_why), "hostname \"sandbox\"");
        if (j->uts_ns && sethostname("sandbox", 7) < 0) {
            j->uts_ns = false;
            fmt(j->uts_why, sizeof(j->uts_why), "sethostname: %s", strerror(errno));
        }
    }
    if (!disabled(c, SBX_LAYER_MOUNTNS, j->mount_why, sizeof(j->mount_why)) &&
        try_unshare(CLONE_NEWNS, j->mount_why, sizeof(j->mount_why), "")) {
        /* Nothing we mount may propagate back to the host. */
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
            fmt(j->mount_why, sizeof(j->mount_why), "making mounts private: %s", strerror(errno));
        else {
            j->mount_ns = true;
            fmt(j->mount_why, sizeof(j->mount_why), "each workspace a private tmpfs of %llu MiB",
                (unsigned long long)(j->workspace_bytes >> 20));
        }
    }
}
