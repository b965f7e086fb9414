/*
 * The sweeper: a small process (no Python) forked by the template into its
 * namespaces, which detaches finished tmpfs workspaces and removes their
 * mount points. Unmounting waits for an RCU grace period, a millisecond or
 * more: the template's loop must not.
 */
#ifndef PYSBX_SWEEPER_H
#define PYSBX_SWEEPER_H

#include <stddef.h>
#include <sys/types.h>

struct sweeper {
    int fd;    /* to the sweeper: names of workspaces to detach, one a line */
    pid_t pid; /* -1: none (no mount namespace, so no mounts to undo) */
};

/* Starts it for the workspaces under |base_path| (|base_fd|); |ppid| is
 * what getppid() says in it while the template lives (confine.h). Returns
 * 0 or -errno with a message. */
int sweeper_start(struct sweeper *sw, const char *base_path, int base_fd, pid_t ppid, char *err,
                  size_t errlen);

/* After the worker is gone and its status sent: hands workspace |name| to
 * the sweeper (the supervisor's descriptor keeps the tmpfs readable until it
 * closes it). Without a sweeper the supervisor deletes the directory. */
void sweeper_release(const struct sweeper *sw, const char *name);

/* Lets the sweeper finish what it was given, and waits for it. */
void sweeper_stop(struct sweeper *sw);

#endif
