/* Cancellation tokens: a flag any thread may set, and an eventfd that a
 * supervising thread can poll alongside the worker's pipes. */
#define _GNU_SOURCE
#include "cancel.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct sbx_cancel {
    atomic_bool fired;
    int efd;
};

struct sbx_cancel *sbx_cancel_new(void)
{
    struct sbx_cancel *c = calloc(1, sizeof(*c));

    if (!c)
        return NULL;
    c->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->efd < 0) {
        free(c);
        return NULL;
    }
    atomic_init(&c->fired, false);
    return c;
}

void sbx_cancel_fire(struct sbx_cancel *c)
{
    uint64_t one = 1;

    if (!c || atomic_exchange(&c->fired, true))
        return;
    (void)!write(c->efd, &one, sizeof(one));
}

bool sbx_cancel_fired(const struct sbx_cancel *c)
{
    return c && atomic_load(&((struct sbx_cancel *)c)->fired);
}

int cancel_fd(const struct sbx_cancel *c)
{
    return c ? c->efd : -1;
}

void sbx_cancel_free(struct sbx_cancel *c)
{
    if (!c)
        return;
    close(c->efd);
    free(c);
}
