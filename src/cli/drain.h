/*
 * What the two servers (JSON lines in serve.c, HTTP in http.c) share, and
 * with mcp.c the sessions' end:
 * SIGINT and SIGTERM read from a descriptor, eventfd wake-ups, and the
 * order of a drain at shutdown: the grace for what is in flight, then
 * cancelling what is left, then a moment for clients to read their answers.
 */
#ifndef PYSBX_DRAIN_H
#define PYSBX_DRAIN_H

#include <stdbool.h>

/* Blocks SIGINT and SIGTERM in the calling thread (call it before any
 * thread starts, so that every thread inherits the mask) and returns a
 * descriptor that reads them, or -errno. */
int stop_signals_open(void);

/* Whether a signal waits on |*(int *)sfd| (a descriptor of
 * stop_signals_open): at shutdown, another one says to stop at once. For
 * session_table_hibernate's |stop|. */
bool signal_waiting(void *sfd);

/* Wakes whoever polls eventfd |efd|; takes the wake-up. */
void efd_notify(int efd);
void efd_consume(int efd);

/* What a drain waits for: every request answered and written (ALL_DONE),
 * or no run left in the sandbox (NO_RUNS; answers may still wait for a
 * slow reader). */
enum drain_until { ALL_DONE, NO_RUNS };

struct drain {
    void *self;
    int wake_fd; /* written whenever reached() may have changed */
    double grace_seconds;
    bool (*reached)(void *self, enum drain_until what);
    void (*cancel_all)(void *self); /* fire every run's cancel token, and any later one's */
    void (*drop_all)(void *self);   /* give up on the clients that still have not read */
    bool drop_ends_all;             /* once dropped, every stream ends by itself */
};

/* After SIGINT or SIGTERM, once no new request is taken: what is in flight
 * has the grace to finish, then is cancelled (its answer says so), then
 * clients get a second to read. Returns 1 when everything ended, 0 when a
 * stream could not be waited for, -1 on a second signal on |sfd|. */
int drain_run(const struct drain *d, int sfd);

/* At shutdown (the drain done), |idler| (may be NULL) stopped first: every
 * open session of |tables| (|n|) hibernates, when they have a state
 * directory, until another signal on |sfd| (-1: none) says to stop; those
 * that did not leave a tombstone there, so that their next cell is
 * session_lost. For serve and mcp alike. */
struct session_table;
struct session_idler;
void hibernate_at_exit(struct session_table *const *tables, unsigned n, struct session_idler *idler,
                       int sfd);

/* After drain_run's |r|: ends the process, having said so, on a second
 * signal (status 1), or with status 0 when |held| (threads still hold what
 * the caller would free next); else returns. */
void drain_exit_if_held(int r, bool held);

#endif
