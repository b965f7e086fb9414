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

/* A workspace tmpfs's options: bounded bytes and files, owned by the
 * worker. */
struct ws_opts {
    char size[24], nr_inodes[24], uid[16], gid[16];
    const char *mode;
};

static void ws_opts(const struct jail *j, uid_t uid, gid_t gid, struct ws_opts *o)
{
    if (!j->switch_user)
        uid = gid = 0; /* root of our user namespace: the caller */
    snprintf(o->size, sizeof(o->size), "%llu", (unsigned long long)j->workspace_bytes);
    snprintf(o->nr_inodes, sizeof(o->nr_inodes), "%llu",
             (unsigned long long)(j->workspace_bytes / WORKSPACE_BYTES_PER_INODE +
                                  WORKSPACE_SPARE_INODES));
    snprintf(o->uid, sizeof(o->uid), "%u", (unsigned)uid);
    snprintf(o->gid, sizeof(o->gid), "%u", (unsigned)gid);
    /* A supervisor that is not root reads the artifacts as "other" (the
     * workers' subordinate uids are not its own): it needs to pass. */
    o->mode = j->in_userns && j->switch_user ? "0711" : "0700";
}

int workspace_make(const struct jail *j, uid_t uid, gid_t gid, int base_fd, const char *name,
                   const char *path, char *err, size_t errlen)
{
    char opts[160];
    struct ws_opts o;
    int rc = 0;

    if (mkdirat(base_fd, name, 0700) < 0)
        return errmsg(err, errlen, -errno, "making workspace %s: %s", path, strerror(errno));
    if (!j->switch_user)
        uid = gid = 0; /* root of our user namespace: the caller */
    if (j->mount_ns) {
        /* Bounded bytes and files, and nothing runnable or device-like. */
        ws_opts(j, uid, gid, &o);
        snprintf(opts, sizeof(opts), "size=%s,nr_inodes=%s,mode=%s,uid=%s,gid=%s", o.size,
                 o.nr_inodes, o.mode, o.uid, o.gid);
        if (mount("pysbx", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts) < 0)
            rc = errmsg(err, errlen, -errno, "mounting the workspace tmpfs: %s", strerror(errno));
    } else if (j->switch_user && fchownat(base_fd, name, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
        rc = errmsg(err, errlen, -errno, "chown of workspace %s: %s", path, strerror(errno));
    if (rc < 0)
        unlinkat(base_fd, name, AT_REMOVEDIR);
    return rc;
}

int workspace_mount_detached(const struct jail *j, uid_t uid, gid_t gid, char *err, size_t errlen)
{
    struct ws_opts o;
    const char *step = "fsopen";
    int fs = fsopen("tmpfs", FSOPEN_CLOEXEC), mnt = -1;

    ws_opts(j, uid, gid, &o);
    if (fs >= 0) {
        step = "fsconfig";
        if (fsconfig(fs, FSCONFIG_SET_STRING, "source", "pysbx", 0) == 0 &&
            fsconfig(fs, FSCONFIG_SET_STRING, "size", o.size, 0) == 0 &&
            fsconfig(fs, FSCONFIG_SET_STRING, "nr_inodes", o.nr_inodes, 0) == 0 &&
            fsconfig(fs, FSCONFIG_SET_STRING, "mode", o.mode, 0) == 0 &&
            fsconfig(fs, FSCONFIG_SET_STRING, "uid", o.uid, 0) == 0 &&
            fsconfig(fs, FSCONFIG_SET_STRING, "gid", o.gid, 0) == 0 &&
            fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) == 0) {
            step = "fsmount";
            mnt = fsmount(fs, FSMOUNT_CLOEXEC,
                          MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC);
        }
    }
    if (mnt < 0)
        mnt = errmsg(err, errlen, -errno, "template: mounting a workspace tmpfs (%s): %s", step,
                     strerror(errno));
    if (fs >= 0)
        close(fs);
    return mnt;
}

int workspace_attach(int mnt_fd, char *err, size_t errlen)
{
    if (unshare(CLONE_NEWNS) < 0)
        return errmsg(err, errlen, -errno, "unshare(CLONE_NEWNS): %s", strerror(errno));
    if (move_mount(mnt_fd, "", AT_FDCWD, WORKSPACE_MOUNT, MOVE_MOUNT_F_EMPTY_PATH) < 0)
        return errmsg(err, errlen, -errno, "mounting the workspace at " WORKSPACE_MOUNT ": %s",
                      strerror(errno));
    return 0;
}
