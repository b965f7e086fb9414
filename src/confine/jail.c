#define _GNU_SOURCE
#include "jail.h"

#include "pysbx.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
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
                "each worker its own uid and gid, reused only once its worker is dead and "
                "its workspace gone (%u ids)",
                j->ids);
        } else if (!(c->disable & SBX_LAYER_UIDRUN))
            fmt(j->uidrun_why, sizeof(j->uidrun_why), "one uid for every worker (worker_ids 1)");
    } else if (geteuid() != 0) {
        enter_user_ns(j);
        fmt(j->uidrun_why, sizeof(j->uidrun_why),
            "not root: every worker runs as the caller's uid");
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
