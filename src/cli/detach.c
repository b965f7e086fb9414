#define _GNU_SOURCE
#include "detach.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

/* How long a thread that finished its task waits for the next. */
#define POOL_IDLE_SECONDS 10

int start_detached(void *(*fn)(void *), void *arg)
{
    pthread_attr_t attr;
    pthread_t th;
    int rc;

    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    rc = pthread_create(&th, &attr, fn, arg);
    pthread_attr_destroy(&attr);
    return -rc;
}

struct task {
    void *(*fn)(void *);
    void *arg;
};

/* The idle threads, and one task handed to whichever of them takes it
 * first. */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_cond = PTHREAD_COND_INITIALIZER;
static unsigned pool_idle; /* waiting, and not yet promised the handed task */
static struct task pool_next;
static bool pool_has_next;

static void *pooled_main(void *p)
{
    struct task t = *(struct task *)p;

    free(p);
    for (;;) {
        t.fn(t.arg);
        struct timespec until;
        int rc = 0;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += POOL_IDLE_SECONDS;
        pthread_mutex_lock(&pool_lock);
        pool_idle++;
        while (!pool_has_next && rc != ETIMEDOUT)
            rc = pthread_cond_clockwait(&pool_cond, &pool_lock, CLOCK_MONOTONIC, &until);
        if (!pool_has_next) {
            pool_idle--;
            pthread_mutex_unlock(&pool_lock);
            return NULL;
        }
        /* The giver counted us out of the idle ones. */
        t = pool_next;
        pool_has_next = false;
        pthread_mutex_unlock(&pool_lock);
    }
}

int start_pooled(void *(*fn)(void *), void *arg)
{
    struct task *t;
    int rc;

    pthread_mutex_lock(&pool_lock);
    if (pool_idle > 0 && !pool_has_next) {
        pool_next = (struct task){fn, arg};
        pool_has_next = true;
        pool_idle--;
        pthread_cond_signal(&pool_cond);
        pthread_mutex_unlock(&pool_lock);
        return 0;
    }
    pthread_mutex_unlock(&pool_lock);
    t = malloc(sizeof(*t));
    if (!t)
        return -ENOMEM;
    *t = (struct task){fn, arg};
    rc = start_detached(pooled_main, t);
    if (rc < 0)
        free(t);
    return rc;
}
