/*
 * The worker's confinement sequence, applied while it is idle, before any
 * request. Any failure is fatal: a worker never runs half-confined.
 */
#ifndef PYSBX_CONFINE_H
#define PYSBX_CONFINE_H

#include "policy.h"

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct confine_plan {
    bool switch_user; /* drop to uid/gid (the template is root) */
    /* What getppid() says while the template lives: its pid, or 0 when
     * the worker is in a pid namespace the template is outside of. We die
     * with it. */
    pid_t ppid;
    uid_t uid;
    gid_t gid;
    int landlock_abi; /* > 0: restrict with ruleset_fd */
    int ruleset_fd;
    const struct policy *policy; /* NULL: no seccomp */
    bool policy_debug;
    /* A session's process: |policy| is the session's program, loaded with
     * a listener, which lands here (see policy_load_session). */
    int *session_listener;
    /* Make a holder (holder.h) between Landlock and seccomp; its pid, or
     * -errno when there is none, lands here. NULL: none. */
    pid_t *holder;
};

/* Empties the capability bounding set (what an execve could give back),
 * while CAP_SETPCAP is effective; without it there is nothing in the set we
 * could use. The template does it once, after its last exec of a helper, so
 * that its workers inherit an empty set instead of each dropping the 41
 * capabilities again (each drop a new set of credentials). Returns 0 or
 * -errno with a message. */
int confine_drop_bounding_set(char *err, size_t errlen);

/* Whether this process's bounding set holds no capability at all. */
bool confine_bounding_set_empty(void);

/* Whether capability |cap| is in this process's effective set. */
bool confine_has_cap(int cap);

/* In order: the capability bounding set, the user, every other capability,
 * no_new_privs, Landlock, and seccomp last. Returns 0 or -errno with a
 * message. */
int confine_self(const struct confine_plan *plan, char *err, size_t errlen);

#endif
