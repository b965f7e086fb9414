/*
 * The workers' ids. With a uid per run, each worker takes an id of its own
 * from the range and gives it back when it is reaped; an id is taken again
 * only once its workspace (named after it) is gone too, so nothing a
 * previous holder left can be reached by the next.
 */
#ifndef PYSBX_UIDS_H
#define PYSBX_UIDS_H

#include "jail.h"

#include <stdbool.h>
#include <sys/types.h>

struct uids {
    bool per_run;
    bool switch_user;
    uid_t uid_base;
    gid_t gid_base;
    unsigned n;
    unsigned next;       /* where the next search starts */
    unsigned char *busy; /* per id: held by a live worker */
    unsigned counter;    /* names workspaces when ids are shared */
};

/* Returns 0 or -ENOMEM. */
int uids_init(struct uids *u, const struct jail *j);

/* Takes an id for a new worker: its slot, uid, gid and workspace name
 * (w<uid>, or w<counter> when ids are shared). Returns 0, or -EAGAIN when
 * every id is held or its workspace not yet removed. */
int uids_take(struct uids *u, int base_fd, unsigned *slot, uid_t *uid, gid_t *gid, char *name,
              size_t cap);

void uids_release(struct uids *u, unsigned slot);
/* Keeps |slot| from every worker, for good. */
void uids_hold(struct uids *u, unsigned slot);

#endif
