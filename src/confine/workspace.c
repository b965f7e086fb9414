#define _GNU_SOURCE
#include "workspace.h"

#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

/* Inodes per byte of a workspace tmpfs: one per page, and a few spare. */
#define WORKSPACE_BYTES_PER_INODE 4096
#define WORKSPACE_SPARE_INODES    64

int workspace_make(const struct jail *j, uid_t uid, gid_t gid, int base_fd, const char *name,
                   const char *path, char *err, size_t errlen)
{
    char opts[160];
    int rc = 0;

    if (mkdirat(base_fd, name, 0700) < 0)
        return errmsg(err, errlen, -errno, "making workspace %s: %s", path, strerror(errno));
    if (!j->switch_user)
        uid = gid = 0; /* root of our user namespace: the caller */
    if (j->mount_ns) {
        /* Bounded bytes and files, and nothing runnable or device-like. */
        /* A supervisor that is not root reads the artifacts as "other" (the
         * workers' subordinate uids are not its own): it needs to pass. */
        snprintf(opts, sizeof(opts), "size=%llu,nr_inodes=%llu,mode=%s,uid=%u,gid=%u",
                 (unsigned long long)j->workspace_bytes,
                 (unsigned long long)(j->workspace_bytes / WORKSPACE_BYTES_PER_INODE +
                                      WORKSPACE_SPARE_INODES),
                 j->in_userns && j->switch_user ? "0711" : "0700", (unsigned)uid, (unsigned)gid);
        if (mount("pysbx", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts) < 0)
            rc = errmsg(err, errlen, -errno, "mounting the workspace tmpfs: %s", strerror(errno));
    } else if (j->switch_user && fchownat(base_fd, name, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
        rc = errmsg(err, errlen, -errno, "chown of workspace %s: %s", path, strerror(errno));
    if (rc < 0)
        unlinkat(base_fd, name, AT_REMOVEDIR);
    return rc;
}

int workspace_isolate(int ws_fd, const char *work_dir, char *err, size_t errlen)
{
    /* A detached copy of the workspace's mount, taken while that mount is
     * still in our namespace (a clone must come from the caller's own). */
    int tree =
        (int)syscall(SYS_open_tree, ws_fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
    int rc = 0;

    if (tree < 0)
        return errmsg(err, errlen, -errno, "open_tree of the workspace: %s", strerror(errno));
    if (unshare(CLONE_NEWNS) < 0)
        rc = errmsg(err, errlen, -errno, "unshare(CLONE_NEWNS): %s", strerror(errno));
    else if (umount2(work_dir, MNT_DETACH) < 0)
        rc = errmsg(err, errlen, -errno, "detaching %s: %s", work_dir, strerror(errno));
    else if (syscall(SYS_move_mount, tree, "", AT_FDCWD, WORKSPACE_MOUNT, MOVE_MOUNT_F_EMPTY_PATH) <
             0)
        rc = errmsg(err, errlen, -errno, "mounting the workspace at " WORKSPACE_MOUNT ": %s",
                    strerror(errno));
    close(tree);
    return rc;
}
