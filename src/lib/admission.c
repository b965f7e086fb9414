#include "admission.h"

#include "sbxerr.h"
#include "sysutil.h"

#include <errno.h>
#include <stdint.h>
#include <time.h>

/* A waiting caller wakes at least this often to see its cancellation token:
 * a token is not tied to this lock. */
#define CANCEL_CHECK_NS (50ULL * 1000000ULL)

/* One caller in the queue, on its own stack. */
struct waiter {
    struct waiter *next;
    pthread_cond_t cond; /* CLOCK_MONOTONIC */
    bool admitted;       /* a place was handed to it (running counts it) */
};

static void cond_init_monotonic(pthread_cond_t *c)
{
    pthread_condattr_t ca;

    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(c, &ca);
    pthread_condattr_destroy(&ca);
}

void admission_init(struct admission *a, unsigned max_running, unsigned max_queued)
{
    a->running = a->waiting = 0;
    a->max_running = max_running;
    a->max_queued = max_queued;
    a->head = a->tail = NULL;
    a->closed = false;
    pthread_mutex_init(&a->lock, NULL);
    cond_init_monotonic(&a->idle);
}

void admission_destroy(struct admission *a)
{
    pthread_mutex_destroy(&a->lock);
    pthread_cond_destroy(&a->idle);
}

static void unlink_waiter(struct admission *a, struct waiter *w)
{
    struct waiter *prev = NULL;

    for (struct waiter *p = a->head; p; prev = p, p = p->next)
        if (p == w) {
            if (prev)
                prev->next = w->next;
            else
                a->head = w->next;
            if (a->tail == w)
                a->tail = prev;
            return;
        }
}

/* Hands free places to the oldest waiters. Called with the lock held. */
static void hand_out(struct admission *a)
{
    while (a->head && a->running < a->max_running) {
        struct waiter *w = a->head;
        a->head = w->next;
        if (!a->head)
            a->tail = NULL;
        w->admitted = true;
        a->running++;
        pthread_cond_signal(&w->cond);
    }
}

enum admitted admission_enter(struct admission *a, const struct sbx_request *req,
                              struct sbx_error *err)
{
    uint64_t deadline = req->queue_timeout_seconds > 0
                            ? now_ns() + (uint64_t)(req->queue_timeout_seconds * 1e9)
                            : UINT64_MAX;
    struct waiter w = {.next = NULL, .admitted = false};
    enum admitted got = ADMITTED;

    pthread_mutex_lock(&a->lock);
    if (a->closed) {
        sbx_fail(err, SBX_ERR_UNAVAILABLE, -ESHUTDOWN, "the sandbox is closing");
        got = REFUSED;
        goto out;
    }
    /* Nobody ahead and a place free: in at once. */
    if (!a->head && a->running < a->max_running) {
        a->running++;
        goto out;
    }
    if (a->waiting >= a->max_queued) {
        sbx_fail(err, SBX_ERR_BUSY, -EBUSY, "%u runs in flight and %u waiting: queue full",
                 a->running, a->waiting);
        got = REFUSED;
        goto out;
    }
    cond_init_monotonic(&w.cond);
    if (a->tail)
        a->tail->next = &w;
    else
        a->head = &w;
    a->tail = &w;
    a->waiting++;
    while (!w.admitted) {
        if (a->closed) {
            sbx_fail(err, SBX_ERR_UNAVAILABLE, -ESHUTDOWN, "the sandbox is closing");
            got = REFUSED;
            break;
        }
        if (sbx_cancel_fired(req->cancel)) {
            got = CANCELLED;
            break;
        }
        uint64_t now = now_ns();
        if (now >= deadline) {
            sbx_fail(err, SBX_ERR_BUSY, -EBUSY, "no worker free within %g s (%u runs in flight)",
                     req->queue_timeout_seconds, a->running);
            got = REFUSED;
            break;
        }
        uint64_t until = deadline - now > CANCEL_CHECK_NS ? now + CANCEL_CHECK_NS : deadline;
        struct timespec ts = {(time_t)(until / 1000000000ULL), (long)(until % 1000000000ULL)};
        pthread_cond_timedwait(&w.cond, &a->lock, &ts);
    }
    a->waiting--;
    if (w.admitted)
        got = ADMITTED; /* admitted just as it gave up: it has the place */
    else
        unlink_waiter(a, &w);
    pthread_cond_destroy(&w.cond);
    if (!a->waiting && !a->running)
        pthread_cond_broadcast(&a->idle);
out:
    pthread_mutex_unlock(&a->lock);
    return got;
}

void admission_leave(struct admission *a)
{
    pthread_mutex_lock(&a->lock);
    a->running--;
    if (!a->closed)
        hand_out(a);
    if (!a->running && !a->waiting)
        pthread_cond_broadcast(&a->idle);
    pthread_mutex_unlock(&a->lock);
}

void admission_close(struct admission *a)
{
    pthread_mutex_lock(&a->lock);
    a->closed = true;
    for (struct waiter *w = a->head; w; w = w->next)
        pthread_cond_signal(&w->cond);
    while (a->running || a->waiting)
        pthread_cond_wait(&a->idle, &a->lock);
    pthread_mutex_unlock(&a->lock);
}

void admission_counts(struct admission *a, unsigned *running, unsigned *waiting)
{
    pthread_mutex_lock(&a->lock);
    *running = a->running;
    *waiting = a->waiting;
    pthread_mutex_unlock(&a->lock);
}
