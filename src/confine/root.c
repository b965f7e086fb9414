#define _GNU_SOURCE
#include "root.h"

#include "places.h"
#include "workspace.h"
#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The new root is a tmpfs mounted on the work directory, in our mount
 * namespace only (nothing is made on the host's disk), which then becomes
 * "/". */
#define ROOT_TMPFS_OPTS "mode=0755,size=16m,nr_inodes=4096"
#define PROC_FD_PATH    "/proc/self/fd/%d"

/* A bind mount made read-only keeps the flags the kernel locked on its
 * source (in a user namespace a remount that drops them is refused). */
static unsigned long locked_flags(const char *target)
{
    static const struct {
        unsigned long st, ms;
    } flags[] = {
        {ST_NOSUID, MS_NOSUID},   {ST_NODEV, MS_NODEV},           {ST_NOEXEC, MS_NOEXEC},
        {ST_NOATIME, MS_NOATIME}, {ST_NODIRATIME, MS_NODIRATIME}, {ST_RELATIME, MS_RELATIME},
    };
    struct statvfs v;
    unsigned long f = 0;

    if (statvfs(target, &v) < 0)
        return 0;
    for (size_t i = 0; i < ARRAY_SIZE(flags); i++)
        if (v.f_flag & flags[i].st)
            f |= flags[i].ms;
    return f;
}

/* mkdir -p of |rel| (relative to the current directory, the new root). */
static int make_dirs(const char *rel)
{
    char buf[PATH_MAX];

    fmt(buf, sizeof(buf), "%s", rel);
    for (char *p = buf;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        if (buf[0] && mkdir(buf, 0755) < 0 && errno != EEXIST)
            return -errno;
        if (c == '\0')
            return 0;
        *p = c;
    }
}

/* Binds |src_fd| at |path| (absolute; made in the new root as a directory or
 * an empty file), then remounts it with |flags| added. */
static int bind(int src_fd, const char *path, bool dir, bool rec, unsigned long flags, char *err,
                size_t errlen)
{
    const char *rel = path + strspn(path, "/");
    char src[64];
    int rc;

    if (dir)
        rc = make_dirs(rel);
    else {
        char parent[PATH_MAX];
        fmt(parent, sizeof(parent), "%s", rel);
        char *slash = strrchr(parent, '/');
        rc = 0;
        if (slash) {
            *slash = '\0';
            rc = make_dirs(parent);
        }
        int fd = rc == 0 ? open(rel, O_WRONLY | O_CREAT | O_CLOEXEC, 0644) : -1;
        if (rc == 0 && fd < 0)
            rc = -errno;
        if (fd >= 0)
            close(fd);
    }
    if (rc < 0)
        return errmsg(err, errlen, rc, "private root: making %s: %s", path, strerror(-rc));
    fmt(src, sizeof(src), PROC_FD_PATH, src_fd);
    if (mount(src, rel, NULL, MS_BIND | (rec ? MS_REC : 0), NULL) < 0)
        return errmsg(err, errlen, -errno, "private root: binding %s: %s", path, strerror(errno));
    if (mount(NULL, rel, NULL, MS_REMOUNT | MS_BIND | flags | locked_flags(rel), NULL) < 0)
        return errmsg(err, errlen, -errno, "private root: remounting %s: %s", path,
                      strerror(errno));
    return 0;
}

static int bind_path(const char *path, bool required, bool dir_expected, unsigned long flags,
                     char *err, size_t errlen)
{
    int fd = open(path, O_PATH | O_CLOEXEC);
    struct stat st;
    int rc;

    if (fd < 0)
        return required ? errmsg(err, errlen, -errno, "private root: %s: %s", path, strerror(errno))
                        : 0; /* not on this system */
    if (fstat(fd, &st) < 0 || (dir_expected && !S_ISDIR(st.st_mode))) {
        close(fd);
        return required ? errmsg(err, errlen, -ENOTDIR, "private root: %s is not a directory", path)
                        : 0;
    }
    rc = bind(fd, path, S_ISDIR(st.st_mode), true, flags, err, errlen);
    close(fd);
    return rc;
}

/* Whether |path| lies in a directory of the fixed list, bound already. */
static bool in_places(const char *path)
{
    for (size_t i = 0; i < n_places; i++) {
        size_t l = strlen(places[i].path);
        if (places[i].kind == PLACE_DIR && strncmp(path, places[i].path, l) == 0 &&
            (path[l] == '/' || path[l] == '\0'))
            return true;
    }
    return false;
}

/* The package set's places and links (see struct root_spec). */
static int add_packages(const struct root_spec *s, char *err, size_t errlen)
{
    int rc = 0;

    for (const char *const *p = s->package_places; rc == 0 && p && *p; p++)
        if (!in_places(*p))
            rc = bind_path(*p, true, false, MS_RDONLY | MS_NOSUID | MS_NODEV, err, errlen);
    if (rc == 0 && s->package_places && make_dirs(ROOT_SCRATCH + 1) < 0)
        rc = errmsg(err, errlen, -errno, "private root: " ROOT_SCRATCH ": %s", strerror(errno));
    for (const char *const *l = s->package_links; rc == 0 && l && l[0] && l[1]; l += 2) {
        char parent[PATH_MAX];
        fmt(parent, sizeof(parent), "%s", l[0] + strspn(l[0], "/"));
        char *slash = strrchr(parent, '/');
        if (slash)
            *slash = '\0';
        if ((slash && make_dirs(parent) < 0) || symlink(l[1], l[0] + strspn(l[0], "/")) < 0)
            rc = errmsg(err, errlen, -errno, "private root: link %s: %s", l[0], strerror(errno));
    }
    return rc;
}

void root_user_name(char *buf, size_t cap, bool per_run_ids, unsigned index)
{
    if (per_run_ids)
        fmt(buf, cap, "sandbox-%u", index);
    else
        fmt(buf, cap, "sandbox");
}

const char *const root_written_files[] = {"/etc/passwd", "/etc/group", "/etc/nsswitch.conf", NULL};

static int write_etc(const struct root_spec *s, char *err, size_t errlen)
{
    FILE *pw = NULL, *gr = NULL, *ns = NULL;
    int rc = 0;

    if (make_dirs("etc") < 0)
        return errmsg(err, errlen, -errno, "private root: /etc: %s", strerror(errno));
    pw = fopen("etc/passwd", "we");
    gr = fopen("etc/group", "we");
    ns = fopen("etc/nsswitch.conf", "we");
    if (!pw || !gr || !ns) {
        rc = errmsg(err, errlen, -errno, "private root: writing /etc: %s", strerror(errno));
        goto out;
    }
    fputs("passwd: files\ngroup: files\n", ns);
    /* The owners of the files a run sees (the standard library's are
     * root's; ids not mapped into a user namespace show as 65534), named as
     * on any system: tarfile, shutil.make_archive and CPython's own tests
     * look root up by id. Unless a worker is one of them itself. */
    if (s->uid_base != 0 && s->gid_base != 0) {
        fputs("root:x:0:0:root:/root:/usr/sbin/nologin\n", pw);
        fputs("root:x:0:\n", gr);
    }
    if (s->uid_base + (s->per_run_ids ? s->ids : 1) <= 65534 || s->uid_base > 65534)
        fputs("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", pw);
    if (s->gid_base + (s->per_run_ids ? s->ids : 1) <= 65534 || s->gid_base > 65534)
        fputs("nogroup:x:65534:\n", gr);
    /* Code that asks who and where it is gets an answer: getpass.getuser(),
     * pwd.getpwuid(os.getuid()), a home that is its workspace. */
    for (unsigned i = 0; i < (s->per_run_ids ? s->ids : 1); i++) {
        char name[32];
        root_user_name(name, sizeof(name), s->per_run_ids, i);
        fprintf(pw, "%s:x:%u:%u:%s:" WORKSPACE_MOUNT ":/nonexistent\n", name, s->uid_base + i,
                s->gid_base + i, name);
        fprintf(gr, "%s:x:%u:\n", name, s->gid_base + i);
    }
out:
    if (pw && fclose(pw) != 0 && rc == 0)
        rc = errmsg(err, errlen, -EIO, "private root: writing /etc/passwd");
    if (gr && fclose(gr) != 0 && rc == 0)
        rc = errmsg(err, errlen, -EIO, "private root: writing /etc/group");
    if (ns)
        fclose(ns);
    return rc;
}

int root_enter(const struct root_spec *s, char *err, size_t errlen)
{
    int rc;

    const char *path = s->work_dir;
    if (mount("pysbx-root", path, "tmpfs", MS_NOSUID | MS_NODEV, ROOT_TMPFS_OPTS) < 0)
        return errmsg(err, errlen, -errno, "private root: mounting a tmpfs on %s: %s", path,
                      strerror(errno));
    if (chdir(path) < 0)
        return errmsg(err, errlen, -errno, "private root: entering it: %s", strerror(errno));
    rc = 0;
    for (size_t i = 0; rc == 0 && i < n_places; i++) {
        unsigned long flags = MS_RDONLY | MS_NOSUID;
        if (places[i].kind == PLACE_DEVICE_RW)
            flags = MS_NOSUID | MS_NOEXEC;
        else if (places[i].kind == PLACE_DEVICE)
            flags |= MS_NOEXEC;
        else
            flags |= MS_NODEV;
        rc = bind_path(places[i].path, false, places[i].kind == PLACE_DIR, flags, err, errlen);
    }
    for (const char *const *d = s->module_dirs; rc == 0 && d && *d; d++)
        rc = bind_path(*d, true, true, MS_RDONLY | MS_NOSUID | MS_NODEV, err, errlen);
    if (rc == 0)
        rc = add_packages(s, err, errlen);
    if (rc == 0)
        rc = write_etc(s, err, errlen);
    if (rc == 0 && make_dirs(WORKSPACE_MOUNT + 1) < 0)
        rc = errmsg(err, errlen, -errno, "private root: " WORKSPACE_MOUNT ": %s", strerror(errno));
    if (rc < 0)
        goto out;
    /* Nothing in the root itself is writable from here on. */
    if (mount(NULL, ".", NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0) {
        rc = errmsg(err, errlen, -errno, "private root: making it read-only: %s", strerror(errno));
        goto out;
    }
    /* The old root is stacked under the new one, then detached: nothing of
     * it stays reachable by path. */
    if (syscall(SYS_pivot_root, ".", ".") < 0 || umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
        rc = errmsg(err, errlen, -errno, "private root: pivot_root: %s", strerror(errno));
out:
    return rc;
}
