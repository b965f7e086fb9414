#define _GNU_SOURCE
#include "drain.h"

#include "sessions.h"
#include "sysutil.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/signalfd.h>
#include <unistd.h>

/* Once the grace is over and what was left is cancelled: how long the
 * cancelled runs may take to end, then how long clients have to read their
 * answers before they are cut off. */
#define CANCEL_WAIT_SECONDS 10.0
#define FLUSH_SECONDS       1.0

int stop_signals_open(void)
{
    sigset_t stop;

    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    int fd = signalfd(-1, &stop, SFD_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

bool signal_waiting(void *sfd)
{
    struct pollfd p = {*(int *)sfd, POLLIN, 0};

    return poll(&p, 1, 0) > 0;
}

void hibernate_at_exit(struct session_table *const *tables, unsigned n, struct session_idler *idler,
                       int sfd)
{
    unsigned done = 0;

    session_idler_stop(idler);
    for (unsigned i = 0; i < n && !signal_waiting(&sfd); i++)
        done += session_table_hibernate(tables[i], 0, signal_waiting, &sfd);
    if (done)
        fprintf(stderr, "pysbx: %u session%s hibernated\n", done, done == 1 ? "" : "s");
    /* A cell may come without a number, which would not tell a new session
     * from the one meant: those still open are said lost at their next. */
    for (unsigned i = 0; i < n; i++)
        session_table_bury_open(tables[i]);
}

void efd_notify(int efd)
{
    uint64_t one = 1;
    (void)!write(efd, &one, sizeof(one));
}

void efd_consume(int efd)
{
    uint64_t n;
    (void)!read(efd, &n, sizeof(n));
}

/* Waits for |what|, at most until |deadline| (now_ns(); 0: no end). Returns
 * 1 when reached, 0 at the deadline, -1 on another SIGINT or SIGTERM. */
static int wait_for(const struct drain *d, int sfd, enum drain_until what, uint64_t deadline)
{
    for (;;) {
        if (d->reached(d->self, what))
            return 1;
        uint64_t now = now_ns();
        if (deadline && now >= deadline)
            return 0;
        int ms = deadline ? (int)((deadline - now + 999999) / 1000000) : -1;
        struct pollfd p[2] = {{sfd, POLLIN, 0}, {d->wake_fd, POLLIN, 0}};
        if (poll(p, 2, ms) < 0 && errno != EINTR)
            return 1;
        if (p[0].revents)
            return -1;
        if (p[1].revents)
            efd_consume(d->wake_fd);
    }
}

static uint64_t after(double seconds)
{
    return now_ns() + (uint64_t)(seconds * 1e9);
}

int drain_run(const struct drain *d, int sfd)
{
    int r = wait_for(d, sfd, ALL_DONE, after(d->grace_seconds));

    if (r == 0) {
        d->cancel_all(d->self);
        r = wait_for(d, sfd, NO_RUNS, after(CANCEL_WAIT_SECONDS));
        if (r >= 0)
            r = wait_for(d, sfd, ALL_DONE, after(FLUSH_SECONDS));
        if (r == 0) {
            d->drop_all(d->self);
            r = d->drop_ends_all ? wait_for(d, sfd, ALL_DONE, 0) : 0;
        }
    }
    return r;
}

void drain_exit_if_held(int r, bool held)
{
    if (r >= 0 && !held)
        return;
    if (r < 0)
        fputs("pysbx serve: a second signal: exiting now\n", stderr);
    fflush(stderr);
    _exit(r < 0 ? 1 : 0);
}
