/*
 * The workers' ids, claimed machine-wide.
 *
 * Two sandboxes on one kernel (two servers, a library host beside a
 * server, two containers as root on one node) must not run workers with the
 * same uid at once: per-uid kernel quotas (threads, pending signals, POSIX
 * timers) would be shared, and one tenant could use up another's. Nothing
 * that every sandbox on a node can see is shared but the kernel, so the
 * kernel keeps the claim: a small process of the template's, the holder,
 * takes the first uid of a range and lives as long as the template; a
 * sandbox looking for a range asks the kernel how many processes that uid
 * has (a fork under RLIMIT_NPROC of 2 succeeds only for a uid's sole
 * process) and takes the range only if the answer is its holder alone. Two
 * that ask at once both see two and both look elsewhere.
 *
 * Without a range given (worker_uid -1), a range is drawn at random from
 * 2^24 ids above SBX_DEFAULT_WORKER_ID_BASE (not its first block, which
 * earlier versions used), so that collisions are rare and, when they
 * happen, seen. A range given is claimed as it is, or the template fails to
 * start, saying so. The range's first id is the holder's; workers take the
 * others. The kernel counts processes per user namespace: sandboxes that
 * each run in a user namespace of their own (not root; a pod with
 * hostUsers: false) have distinct ids on the host already, and are not
 * claimed here.
 */
#ifndef PYSBX_CLAIM_H
#define PYSBX_CLAIM_H

#include "jail.h"

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct id_claim {
    pid_t holder; /* the process that holds the range's first uid; -1: none */
    bool claimed;
    char why[JAIL_WHY_MAX]; /* what was claimed, or why nothing was */
};

/* With a uid per run as root, and CAP_KILL (the holder's death signal is
 * sent as from the template, across uids), claims the range: j->uid_base and
 * j->gid_base are set to it (drawn when |draw|). Returns 0 (claimed, or
 * nothing to claim, c->why says which) or -errno with |err| (a range given
 * is in use; or no range could be claimed). */
int ids_claim(struct id_claim *c, struct jail *j, bool draw, char *err, size_t errlen);

/* Kills the holder and reaps it: the range is free when this returns. */
void ids_release(struct id_claim *c);

#endif
