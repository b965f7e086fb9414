/*
 * The template's share of the confinement: namespaces, made once for the
 * template and so for every worker it forks, and a size-limited tmpfs per
 * workspace. Each layer is tried where the kernel and our privileges allow,
 * and reported either way.
 */
#ifndef PYSBX_JAIL_H
#define PYSBX_JAIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct jail {
    bool net_ns, ipc_ns, uts_ns, mount_ns, user_ns;
    char net_why[160], ipc_why[160], uts_why[160], mount_why[160], user_why[160];
    bool switch_user; /* workers drop to uid/gid below */
    uid_t uid;
    gid_t gid;
    uint64_t workspace_bytes; /* tmpfs size per workspace, when mount_ns */
    int sweep_fd;             /* to the sweeper: names of workspaces to detach */
    pid_t sweeper;
};

/* Enters new network, IPC, UTS and mount namespaces (inside a new user
 * namespace when not root), with mounts made private so nothing propagates
 * back to the host. |uid|/|gid| < 0 pick the default (65534 when root). */
void jail_setup(struct jail *j, long uid, long gid, uint64_t workspace_bytes);

/* Makes the workspace at |path| (|name| beneath |base_fd|) ready for a
 * worker: a tmpfs of workspace_bytes when mount_ns, owned by the worker's
 * user. Returns 0 or -1 with a message. */
int jail_workspace(const struct jail *j, int base_fd, const char *name, const char *path,
                   char *err, size_t errlen);

/* With mount_ns: starts the sweeper, a small process (no Python) in our
 * namespaces that detaches finished workspaces and removes their mount
 * points. Unmounting waits for an RCU grace period, a millisecond or more:
 * the template's loop must not. Returns 0 or -1 with a message. */
int jail_sweeper_start(struct jail *j, const char *base_path, int base_fd, char *err,
                       size_t errlen);

/* After the worker is gone and its status sent: hands workspace |name| to
 * the sweeper (the supervisor's descriptor keeps the tmpfs readable until it
 * closes it). Without mount_ns the supervisor deletes the directory. */
void jail_workspace_release(const struct jail *j, const char *name);

/* Lets the sweeper finish what it was given, and waits for it. */
void jail_sweeper_stop(struct jail *j);

#endif
