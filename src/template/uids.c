#define _GNU_SOURCE
#include "uids.h"

#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>

int uids_init(struct uids *u, const struct jail *j)
{
    u->per_run = j->uid_per_run;
    u->switch_user = j->switch_user;
    u->uid_base = j->switch_user ? j->uid_base : 0;
    u->gid_base = j->switch_user ? j->gid_base : 0;
    u->n = u->per_run ? j->ids : 1;
    u->next = 0;
    u->counter = 0;
    u->busy = calloc(u->n, 1);
    return u->busy ? 0 : -ENOMEM;
}

int uids_take(struct uids *u, int base_fd, unsigned *slot, uid_t *uid, gid_t *gid, char *name,
              size_t cap)
{
    struct stat st;

    if (!u->per_run) {
        *slot = 0;
        *uid = u->uid_base;
        *gid = u->gid_base;
        fmt(name, cap, "w%u", u->counter++);
        return 0;
    }
    for (unsigned tries = 0; tries < u->n; tries++) {
        unsigned i = u->next;
        u->next = (u->next + 1) % u->n;
        if (u->busy[i])
            continue;
        fmt(name, cap, "w%u", u->uid_base + i);
        if (fstatat(base_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT)
            continue; /* the last holder's workspace is still there */
        u->busy[i] = 1;
        *slot = i;
        *uid = u->uid_base + i;
        *gid = u->gid_base + i;
        return 0;
    }
    return -EAGAIN;
}

void uids_release(struct uids *u, unsigned slot)
{
    if (u->per_run && slot < u->n)
        u->busy[slot] = 0;
}

void uids_hold(struct uids *u, unsigned slot)
{
    if (u->per_run && slot < u->n)
        u->busy[slot] = 1;
}
