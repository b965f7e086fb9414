#include "admission.h"

#include "sbxerr.h"
#include "sysutil.h"

#include <errno.h>
#include <stdint.h>
#include <time.h>

/* A waiting caller wakes at least this often to see its cancellation token:
 * a token is not tied to this condition variable. */
#define CANCEL_CHECK_NS (50ULL * 1000000ULL)

void admission_init(struct admission *a, unsigned max_running, unsigned max_queued)
{
    pthread_condattr_t ca;

    a->running = a->waiting = 0;
    a->max_running = max_running;
    a->max_queued = max_queued;
    pthread_mutex_init(&a->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->cond, &ca);
    pthread_condattr_destroy(&ca);
}

void admission_destroy(struct admission *a)
{
    pthread_mutex_destroy(&a->lock);
    pthread_cond_destroy(&a->cond);
}

enum admitted admission_enter(struct admission *a, const struct sbx_request *req,
                              struct sbx_error *err)
{
    uint64_t deadline = req->queue_timeout_seconds > 0
                            ? now_ns() + (uint64_t)(req->queue_timeout_seconds * 1e9)
                            : UINT64_MAX;
    enum admitted got = ADMITTED;

    pthread_mutex_lock(&a->lock);
    if (a->running >= a->max_running) {
        if (a->waiting >= a->max_queued) {
            got = REFUSED;
            sbx_fail(err, SBX_ERR_BUSY, -EBUSY, "%u runs in flight and %u waiting: queue full",
                     a->running, a->waiting);
            goto out;
        }
        a->waiting++;
        while (a->running >= a->max_running) {
            if (sbx_cancel_fired(req->cancel)) {
                got = CANCELLED;
                break;
            }
            uint64_t now = now_ns();
            if (now >= deadline) {
                got = REFUSED;
                sbx_fail(err, SBX_ERR_BUSY, -EBUSY,
                         "no worker free within %g s (%u runs in flight)",
                         req->queue_timeout_seconds, a->running);
                break;
            }
            uint64_t until = deadline - now > CANCEL_CHECK_NS ? now + CANCEL_CHECK_NS : deadline;
            struct timespec ts = {(time_t)(until / 1000000000ULL), (long)(until % 1000000000ULL)};
            pthread_cond_timedwait(&a->cond, &a->lock, &ts);
        }
        a->waiting--;
    }
    if (got == ADMITTED)
        a->running++;
out:
    pthread_mutex_unlock(&a->lock);
    return got;
}

void admission_leave(struct admission *a)
{
    pthread_mutex_lock(&a->lock);
    a->running--;
    pthread_cond_signal(&a->cond);
    pthread_mutex_unlock(&a->lock);
}
