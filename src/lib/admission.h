/*
 * Admission: at most max_running runs in flight; up to max_queued callers
 * wait for a place, first come first served, each until its own deadline or
 * its cancellation.
 */
#ifndef PYSBX_ADMISSION_H
#define PYSBX_ADMISSION_H

#include "pysbx.h"

#include <pthread.h>
#include <stdbool.h>

struct waiter;

struct admission {
    pthread_mutex_t lock;
    pthread_cond_t idle; /* CLOCK_MONOTONIC; signalled when nothing is in flight */
    unsigned running, waiting, max_running, max_queued;
    struct waiter *head, *tail; /* the queue, oldest first */
    bool closed;
};

enum admitted { ADMITTED, REFUSED, CANCELLED };

void admission_init(struct admission *a, unsigned max_running, unsigned max_queued);
void admission_destroy(struct admission *a);

/* Waits for a place for |req| (its queue_timeout_seconds and cancel token).
 * REFUSED fills |err| (SBX_ERR_BUSY, or SBX_ERR_UNAVAILABLE once closed);
 * only ADMITTED must be left. */
enum admitted admission_enter(struct admission *a, const struct sbx_request *req,
                              struct sbx_error *err);
void admission_leave(struct admission *a);

/* How many runs are in flight and callers waiting, now. */
void admission_counts(struct admission *a, unsigned *running, unsigned *waiting);

/* Refuses every waiting and later caller, then waits until no run is in
 * flight. */
void admission_close(struct admission *a);

#endif
