/*
 * A worker's workspace: a directory of its own under the work directory,
 * made ready before the worker is forked. With the mount namespace it is a
 * private tmpfs, bounded in bytes and files, so a run cannot fill the host's
 * disk; it is owned by the worker's user and mode 0700.
 */
#ifndef PYSBX_WORKSPACE_H
#define PYSBX_WORKSPACE_H

#include "jail.h"

#include <stddef.h>
#include <sys/types.h>

/* Makes workspace |name| beneath |base_fd| (|path| is the same place, for
 * mount(2) and messages), owned by |uid|:|gid| when the workers switch
 * user. Returns 0 or -errno with a message. */
int workspace_make(const struct jail *j, uid_t uid, gid_t gid, int base_fd, const char *name,
                   const char *path, char *err, size_t errlen);

/* Where a worker finds its workspace under the private root. */
#define WORKSPACE_MOUNT "/workspace"

/* In a new worker, while it still holds the template's privileges: a mount
 * namespace of its own in which the work directory (every sibling's
 * workspace with it) is gone and its own workspace |ws_fd| is mounted at
 * WORKSPACE_MOUNT. Siblings are then not merely unreachable but absent:
 * no name, no stat, no statfs. Returns 0 or -errno with a message. */
int workspace_isolate(int ws_fd, const char *work_dir, char *err, size_t errlen);

#endif
