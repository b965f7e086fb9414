#define _GNU_SOURCE
#include "stopper.h"

#include "detach.h"

#include <pthread.h>
#include <signal.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <unistd.h>

static struct sbx_cancel *token;
static atomic_int stopped_by;
static sigset_t stop_set;
static int stop_pipe[2] = {-1, -1}; /* readable once stopped */

static void *wait_for_signal(void *p)
{
    int sig = 0;

    (void)p;
    if (sigwait(&stop_set, &sig) == 0) {
        atomic_store(&stopped_by, sig);
        sbx_cancel_fire(token);
        (void)!write(stop_pipe[1], "s", 1);
    }
    return NULL;
}

struct sbx_cancel *stopper_start(void)
{
    if (token)
        return token; /* once per process */
    sigemptyset(&stop_set);
    sigaddset(&stop_set, SIGINT);
    sigaddset(&stop_set, SIGTERM);
    sigaddset(&stop_set, SIGHUP);
    token = sbx_cancel_new();
    if (!token)
        return NULL;
    if (pipe2(stop_pipe, O_CLOEXEC) < 0) {
        sbx_cancel_free(token);
        token = NULL;
        return NULL;
    }
    /* Blocked here, so in every thread started from now on. */
    if (pthread_sigmask(SIG_BLOCK, &stop_set, NULL) != 0 ||
        start_detached(wait_for_signal, NULL) < 0) {
        pthread_sigmask(SIG_UNBLOCK, &stop_set, NULL);
        sbx_cancel_free(token);
        token = NULL;
    }
    return token;
}

int stopper_fd(void)
{
    return stop_pipe[0];
}

int stopper_signal(void)
{
    return atomic_load(&stopped_by);
}
