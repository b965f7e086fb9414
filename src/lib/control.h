/*
 * The supervisor's side of the control socket: starting the template (one
 * posix_spawn per sandbox, with an empty environment and nothing of the
 * host's but the socket), configuring it, taking idle workers, stopping it.
 */
#ifndef PYSBX_CONTROL_H
#define PYSBX_CONTROL_H

#include "sandbox.h"

#include <stddef.h>

/* Starts the template at |path|, sends it |cfg|, and waits for its report
 * (versions, layers), which lands in |sbx|. Returns 0 or a negative errno
 * with |err| set. */
int control_start(struct sbx *sbx, const char *path, const struct sbx_config *cfg,
                  struct sbx_error *err);

/* An idle worker taken from the pool. Its descriptors are the caller's from
 * here on; the caller hands each to exactly one owner. */
struct taken_worker {
    int fds[WFD_COUNT];
    pid_t pid;
    uid_t uid; /* its own uid and gid, or 0 when it has none of its own */
    gid_t gid;
    char workspace[WIRE_NAME_MAX];
};

/* Takes the next idle worker. Returns 0, or a negative errno with the
 * reason in |why| (the template failed to make one, or is gone). */
int control_take_worker(struct sbx *sbx, struct taken_worker *w, char *why, size_t whylen);

/* Closes the socket (the template then kills its workers and exits) and
 * reaps the template. */
void control_stop(struct sbx *sbx);

#endif
