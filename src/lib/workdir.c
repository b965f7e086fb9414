#define _GNU_SOURCE
#include "workdir.h"

#include "sbxerr.h"
#include "sysutil.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Workers under their own uid reach their workspace by path too (HOME,
 * TMPDIR, absolute paths the code builds): every directory above it must
 * let others pass. */
static int check_traversable(const char *root, struct sbx_error *err)
{
    char path[PATH_MAX];
    struct stat st;

    if (!realpath(root, path))
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -errno, "work root %s: %s", root,
                        strerror(errno));
    for (char *p = path + strlen(path); p > path; p = strrchr(path, '/')) {
        *p = '\0';
        const char *dir = path[0] ? path : "/";
        if (stat(dir, &st) < 0 || !(st.st_mode & S_IXOTH))
            return sbx_fail(err, SBX_ERR_UNAVAILABLE, -EACCES,
                            "work root %s: %s is not searchable by the workers' uid; use a "
                            "directory others may pass through (such as /tmp)",
                            root, dir);
        if (!path[0])
            break;
    }
    return 0;
}

/* Inside each work directory, locked by its owner for as long as it lives:
 * a work directory whose lock is free was left by an owner that died. */
#define OWNER_FILE ".owner"
/* ... and at least this old: never one that is being made right now. */
#define STALE_AFTER_S 10

static bool stale(int root_fd, const char *name)
{
    struct stat st;
    bool dead = false;

    if (fstatat(root_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != geteuid())
        return false;
    int dir = openat(root_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int lock = dir < 0 ? -1 : openat(dir, OWNER_FILE, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (lock >= 0 && fstat(lock, &st) == 0 && S_ISREG(st.st_mode) &&
        time(NULL) - st.st_mtime >= STALE_AFTER_S && flock(lock, LOCK_EX | LOCK_NB) == 0)
        dead = true;
    close_fd(&lock);
    close_fd(&dir);
    return dead;
}

/* Removes what owners killed by SIGKILL (or a crash) left under |root_fd|. */
static void sweep_stale(int root_fd, const char *prefix)
{
    int fd = fcntl(root_fd, F_DUPFD_CLOEXEC, 0);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    struct dirent *e;
    size_t plen = strlen(prefix);

    if (!d) {
        close_fd(&fd);
        return;
    }
    while ((e = readdir(d)))
        if (strncmp(e->d_name, prefix, plen) == 0 && strlen(e->d_name) == plen + 6 &&
            stale(root_fd, e->d_name))
            (void)remove_tree_at(root_fd, e->d_name);
    closedir(d);
}

int workdir_make(struct workdir *wd, const char *root, const char *prefix, bool other_uids,
                 struct sbx_error *err)
{
    char path[PATH_MAX];

    wd->root_fd = wd->fd = wd->owner_fd = -1;
    wd->path = NULL;
    if (!root)
        root = getenv("TMPDIR");
    if (!root || !*root)
        root = "/tmp";
    if (other_uids) {
        char self[PATH_MAX];
        snprintf(self, sizeof(self), "%s/.", root); /* the root itself too */
        int rc = check_traversable(self, err);
        if (rc < 0)
            return rc;
    }
    wd->root_fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (wd->root_fd < 0)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -errno, "work root %s: %s", root,
                        strerror(errno));
    sweep_stale(wd->root_fd, prefix);
    if ((size_t)snprintf(path, sizeof(path), "%s/%sXXXXXX", root, prefix) >= sizeof(path))
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENAMETOOLONG, "work root path too long");
    if (!mkdtemp(path))
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -errno, "making a directory in %s: %s", root,
                        strerror(errno));
    wd->path = strdup(path);
    wd->fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (!wd->path || wd->fd < 0) {
        int e = wd->path ? errno : ENOMEM;
        rmdir(path);
        free(wd->path);
        wd->path = NULL;
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -e, "opening %s: %s", path, strerror(e));
    }
    wd->owner_fd =
        openat(wd->fd, OWNER_FILE, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (wd->owner_fd < 0 || flock(wd->owner_fd, LOCK_EX) < 0)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -errno, "%s/" OWNER_FILE ": %s", path,
                        strerror(errno));
    /* Each workspace inside is 0700 and its worker's own. */
    if (other_uids && fchmod(wd->fd, 0711) < 0)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -errno, "chmod %s: %s", path, strerror(errno));
    return 0;
}

void workdir_remove(struct workdir *wd)
{
    if (wd->path && wd->root_fd >= 0)
        (void)remove_tree_at(wd->root_fd, strrchr(wd->path, '/') + 1);
    close_fd(&wd->owner_fd);
    close_fd(&wd->fd);
    close_fd(&wd->root_fd);
    free(wd->path);
    wd->path = NULL;
}
