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
    bool in_userns;   /* not root: a user namespace of our own */
    bool switch_user; /* workers drop to a uid/gid of the range below */
    bool uid_per_run; /* ... each worker to one of its own */
    char uidrun_why[JAIL_WHY_MAX];
    uid_t uid_base;
    gid_t gid_base;
    unsigned ids;             /* how many in the range */
    uint64_t workspace_bytes; /* tmpfs size per workspace, when mount_ns */
};

struct jail_config {
    long uid_base, gid_base; /* the workers' ids, when root */
    unsigned ids;            /* 1: every worker shares uid_base */
    uint64_t workspace_bytes;
    unsigned disable; /* enum sbx_layer bits not to set up (tests) */
};

/* Enters new network, IPC, UTS and mount namespaces (inside a new user
 * namespace when not root), with mounts made private so nothing propagates
 * back to the host, and decides the workers' ids. */
void jail_setup(struct jail *j, const struct jail_config *c);

#endif
