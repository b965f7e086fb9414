#include "stopper.h"

#include "detach.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

static struct sbx_cancel *token;
static atomic_int stopped_by;
static sigset_t stop_set;

static void *wait_for_signal(void *p)
{
    int sig = 0;

    (void)p;
    if (sigwait(&stop_set, &sig) == 0) {
        atomic_store(&stopped_by, sig);
        sbx_cancel_fire(token);
    }
    return NULL;
}

struct sbx_cancel *stopper_start(void)
{
    sigemptyset(&stop_set);
    sigaddset(&stop_set, SIGINT);
    sigaddset(&stop_set, SIGTERM);
    sigaddset(&stop_set, SIGHUP);
    token = sbx_cancel_new();
    if (!token)
        return NULL;
    /* Blocked here, so in every thread started from now on. */
    if (pthread_sigmask(SIG_BLOCK, &stop_set, NULL) != 0 ||
        start_detached(wait_for_signal, NULL) < 0) {
        pthread_sigmask(SIG_UNBLOCK, &stop_set, NULL);
        sbx_cancel_free(token);
        token = NULL;
    }
    return token;
}

int stopper_signal(void)
{
    return atomic_load(&stopped_by);
}
