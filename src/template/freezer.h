/*
 * Stopped means frozen: a cgroup v2 of its own for each session, frozen
 * while the session is between cells.
 *
 * SIGSTOP alone does not keep a process from running: SIGCONT ends the
 * stop, from whatever sends it, and a session's code can arrange for its
 * own process to be sent one while it is stopped (a POSIX timer with
 * SIGCONT as its signal, F_SETSIG on a descriptor). A process in a frozen
 * cgroup runs no code of its own whatever signal it gets, and nothing it
 * can do undoes that: the cgroup's files are not in its view (the private
 * root has no /sys), nor are its descriptors (the template's, closed in
 * every process it forks).
 *
 * Moving a process between cgroups waits for an RCU grace period once the
 * kernel's cgroups have been still for a moment (7 ms here, on the loop
 * that serves every tenant), so nothing is moved: a session's first
 * process is born in the session's cgroup (clone3 with CLONE_INTO_CGROUP),
 * every cell after it is a fork of it, and the cgroup as a whole is frozen
 * when the session is idle (cgroup.freeze: some microseconds) and thawed
 * when the template lets one of its processes run. Only cgroup v2 is used:
 * a task frozen by v1's freezer does not die of SIGKILL until thawed, and
 * every process of a session must die when its session or its sandbox
 * does. Where no cgroup v2 can be written (a container without one, an
 * ordinary user with no delegated cgroup), there is no freezer, the layer
 * says why, and sessions.c holds its stopped processes by SIGSTOP and the
 * kernel's reports (a continue it did not make ends the session).
 */
#ifndef PYSBX_FREEZER_H
#define PYSBX_FREEZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct freezer {
    int dir; /* the sandbox's cgroup, beside the template's own; -1: none */
    char name[64];
};

/* A session's cgroup. */
struct freezer_cg {
    int dir;    /* its directory (for CLONE_INTO_CGROUP), or -1 */
    int freeze; /* its cgroup.freeze */
};

/* Makes the sandbox's cgroup beside the template's own and tries it out.
 * Returns 1 when there is a freezer, 0 when not (|why| says why). Before
 * the private root, before any thread or pid namespace of ours. The
 * directory is flock()ed for the template's life; the sandbox cgroups of
 * templates that are gone (no lock held: the kernel dropped it with their
 * last descriptor) are removed here once empty. */
int freezer_open(struct freezer *f, char *why, size_t cap);

/* A cgroup for session |id|, not frozen. Returns 0 or -errno. */
int freezer_cg_new(struct freezer *f, uint64_t id, struct freezer_cg *cg);
/* Freezes or thaws it. Returns 0 or -errno. */
int freezer_cg_set(const struct freezer_cg *cg, bool frozen);
/* Closes it and removes it (it is empty: every process of the session is
 * reaped). */
void freezer_cg_end(struct freezer *f, uint64_t id, struct freezer_cg *cg);

/* A child of ours born in |cg| (clone3 with CLONE_INTO_CGROUP): returns as
 * fork() does. */
pid_t freezer_fork_into(const struct freezer_cg *cg);

/* Removes the sandbox's cgroup (its sessions' are gone) and closes. */
void freezer_close(struct freezer *f);

#endif
