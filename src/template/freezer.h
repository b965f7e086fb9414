/*
 * Stopped means frozen: a cgroup v2 freezer of the template's own for the
 * session processes that are stopped between cells.
 *
 * SIGSTOP alone does not keep a process from running: SIGCONT ends the
 * stop, from whatever sends it, and a session's code can arrange for its
 * own process to be sent one while it is stopped (a POSIX timer with
 * SIGCONT as its signal, F_SETSIG on a descriptor). A process in a frozen
 * cgroup runs no code of its own whatever signal it gets, and nothing it
 * can do undoes that: the cgroup's files are not in its view (the private
 * root has no /sys), nor are its descriptors (the template's, opened
 * before any worker exists, closed in every process it forks).
 *
 * The template makes a cgroup of its own beside itself, frozen, and moves
 * a stopped session process into it once the kernel has reported it
 * stopped, and back to the template's own cgroup before it lets it run.
 * Only cgroup v2 is used: a task frozen by v1's freezer does not die of
 * SIGKILL until thawed, and every process of a session must die when its
 * session or its sandbox does. Where no cgroup v2 hierarchy can be
 * written (a container without one, an ordinary user with no delegated
 * cgroup), there is no freezer, the layer says why, and a stopped process
 * is held by SIGSTOP and watched by its CPU clock (sessions.c).
 */
#ifndef PYSBX_FREEZER_H
#define PYSBX_FREEZER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct freezer {
    int dir;    /* the template's own cgroup (its directory), or -1 */
    int home;   /* its cgroup.procs */
    int frozen; /* the frozen cgroup's cgroup.procs */
    char name[64];
};

/* Makes the frozen cgroup beside the template's own. Returns 1 when there
 * is a freezer, 0 when not (|why| says why). Before the private root. */
int freezer_open(struct freezer *f, char *why, size_t cap);

/* Moves |pid| (as our pid namespace numbers it) into the frozen cgroup,
 * or out of it. Returns 0 or -errno. */
int freezer_hold(struct freezer *f, pid_t pid);
int freezer_release(struct freezer *f, pid_t pid);

/* Removes the frozen cgroup (once no process is in it) and closes. */
void freezer_close(struct freezer *f);

#endif
