/*
 * The supervisor's side of the control socket: starting the template (one
 * posix_spawn per sandbox, with an empty environment and nothing of the
 * host's but the socket), configuring it, taking idle workers, stopping it.
 */
#ifndef PYSBX_CONTROL_H
#define PYSBX_CONTROL_H

#include "sandbox.h"

#include <stddef.h>
#include <stdint.h>

/* Starts the template (sbx->template_path, configured with sbx->cfg) and
 * waits for its report (versions, layers), which lands in |sbx|. Returns 0
 * or a negative errno with |err| set. */
int control_start(struct sbx *sbx, struct sbx_error *err);

/* An idle worker taken from the pool. Its descriptors are the caller's from
 * here on; the caller hands each to exactly one owner. */
struct taken_worker {
    int fds[WFD_COUNT];
    pid_t pid;
    uid_t uid; /* its own uid and gid, or 0 when it has none of its own */
    gid_t gid;
    char workspace[WIRE_NAME_MAX];
    unsigned generation; /* the template it came from (sbx->generation) */
};

/* Takes the next idle worker, waiting until |deadline| (now_ns() clock;
 * UINT64_MAX: no deadline) or |cancel| fires. A template that died is
 * replaced, after a backoff; one that keeps dying puts the sandbox down for
 * a while. Returns 0, or with the reason in |why|: -ECANCELED, -ETIMEDOUT,
 * -EHOSTDOWN (down: refuse the run), -ESHUTDOWN (closing), or another
 * negative errno (the template could not make a worker). */
int control_take_worker(struct sbx *sbx, const struct sbx_cancel *cancel, uint64_t deadline,
                        struct taken_worker *w, char *why, size_t whylen);

/* A worker of template |generation| lost its status: the template is
 * gone or going. Waits (a moment at most) until its end is seen, and lets
 * it go, so that the next take waits for a new one rather than taking a
 * worker the dead one had announced. */
void control_template_lost(struct sbx *sbx, unsigned generation);

/* Fills |w|'s pid, ids and workspace name from the template's message. */
void control_taken(struct taken_worker *w, const struct wire_worker *m);

/* Hands the template a session's channel |chan| with |m| (starting a
 * template if there is none). Returns 0 with a descriptor of the
 * template's pidfd in *template_pidfd (its end ends the session), or a
 * negative errno with |why|: -EHOSTDOWN, -ESHUTDOWN, or the send's. */
int control_open_session(struct sbx *sbx, const struct wire_session_open *m, int chan,
                         int *template_pidfd, char *why, size_t whylen);

/* Fills |h| (see sbx_health). */
int control_health(struct sbx *sbx, struct sbx_health *h);

/* Ends the template for good: no restart after this. Bounded: a template
 * that does not exit within a grace period is killed. */
void control_stop(struct sbx *sbx);

#endif
