#include "detach.h"

#include <pthread.h>

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
