/*
 * The template's share of the confinement: namespaces, made once for the
 * template and so for every worker it forks, and the user the workers run
 * as. Each layer is tried where the kernel and our privileges allow, and
 * reported either way.
 */
#ifndef PYSBX_JAIL_H
#define PYSBX_JAIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Room for what a layer does here, or why it is not available. */
#define JAIL_WHY_MAX 160

struct jail {
    bool net_ns, ipc_ns, uts_ns, mount_ns;
    char net_why[JAIL_WHY_MAX], ipc_why[JAIL_WHY_MAX], uts_why[JAIL_WHY_MAX];
    char mount_why[JAIL_WHY_MAX], user_why[JAIL_WHY_MAX];
    bool switch_user; /* workers drop to uid/gid below */
    uid_t uid;
    gid_t gid;
    uint64_t workspace_bytes; /* tmpfs size per workspace, when mount_ns */
};

/* Enters new network, IPC, UTS and mount namespaces (inside a new user
 * namespace when not root), with mounts made private so nothing propagates
 * back to the host. |uid|/|gid| < 0 pick the default (65534 when root). */
void jail_setup(struct jail *j, long uid, long gid, uint64_t workspace_bytes);

#endif
