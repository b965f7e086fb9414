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

/* Under the private root: a workspace tmpfs (bounded as above, owned by
 * |uid|:|gid|) mounted nowhere yet. No directory on the host's disk, nothing
 * in the template's mount namespace: the tmpfs lives as long as a
 * descriptor of it does (the worker's mount namespace, the supervisor's).
 * Returns the mount's descriptor (FSMOUNT_CLOEXEC), which must stay open
 * until workspace_attach(), or -errno with a message. */
int workspace_mount_detached(const struct jail *j, uid_t uid, gid_t gid, char *err, size_t errlen);

/* Where a worker finds its workspace under the private root. */
#define WORKSPACE_MOUNT "/workspace"

/* In a new worker under the private root, while it still holds the
 * template's privileges: a mount namespace of its own (a copy of the
 * template's, which has no workspace in it), with the detached workspace
 * |mnt_fd| mounted at WORKSPACE_MOUNT. Returns 0 or -errno with a message. */
int workspace_attach(int mnt_fd, char *err, size_t errlen);

#endif
