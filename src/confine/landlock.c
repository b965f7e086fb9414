#define _GNU_SOURCE
#include "landlock.h"

#include "places.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/landlock.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The kernel headers of the build machine may be older than the kernel the
 * worker runs on: spell out what later ABIs add. */
#define LL_FS_REFER                   (1ULL << 13) /* ABI 2 */
#define LL_FS_TRUNCATE                (1ULL << 14) /* ABI 3 */
#define LL_FS_IOCTL_DEV               (1ULL << 15) /* ABI 5 */
#define LL_NET_BIND_TCP               (1ULL << 0)  /* ABI 4 */
#define LL_NET_CONNECT_TCP            (1ULL << 1)  /* ABI 4 */
#define LL_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0)  /* ABI 6 */
#define LL_SCOPE_SIGNAL               (1ULL << 1)  /* ABI 6 */
#ifndef LANDLOCK_CREATE_RULESET_VERSION
#define LANDLOCK_CREATE_RULESET_VERSION (1U << 0)
#endif

struct ll_ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net;
    uint64_t scoped;
};

struct ll_path_beneath {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

#define LL_RULE_PATH_BENEATH 1

#define FS_READ (LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR)
#define FS_V1_ALL                                                                                  \
    (LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_READ_FILE |   \
     LANDLOCK_ACCESS_FS_READ_DIR | LANDLOCK_ACCESS_FS_REMOVE_DIR |                                 \
     LANDLOCK_ACCESS_FS_REMOVE_FILE | LANDLOCK_ACCESS_FS_MAKE_CHAR | LANDLOCK_ACCESS_FS_MAKE_DIR | \
     LANDLOCK_ACCESS_FS_MAKE_REG | LANDLOCK_ACCESS_FS_MAKE_SOCK | LANDLOCK_ACCESS_FS_MAKE_FIFO |   \
     LANDLOCK_ACCESS_FS_MAKE_BLOCK | LANDLOCK_ACCESS_FS_MAKE_SYM)
/* What a file (not a directory) rule may carry. */
#define FS_FILE_RIGHTS                                                                             \
    (LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_READ_FILE |   \
     LL_FS_TRUNCATE | LL_FS_IOCTL_DEV)

static uint64_t fs_handled(int abi)
{
    uint64_t a = FS_V1_ALL;
    if (abi >= 2)
        a |= LL_FS_REFER;
    if (abi >= 3)
        a |= LL_FS_TRUNCATE;
    if (abi >= 5)
        a |= LL_FS_IOCTL_DEV;
    return a;
}

int landlock_abi(void)
{
    long v = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    return v < 0 ? -errno : (int)v;
}

/* What Landlock grants on each kind of place; rights beyond the ABI are
 * masked off. */
static uint64_t place_access(enum place_kind k)
{
    switch (k) {
    case PLACE_DIR:
        return FS_READ;
    case PLACE_DEVICE_RW:
        return LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_WRITE_FILE | LL_FS_TRUNCATE;
    case PLACE_FILE:
    case PLACE_DEVICE:
        break;
    }
    return LANDLOCK_ACCESS_FS_READ_FILE;
}

static int add_place(struct landlock_base *b, const char *path, uint64_t access, char *err,
                     size_t errlen)
{
    struct stat st;
    int fd;

    if (b->n >= (int)ARRAY_SIZE(b->fds))
        return errmsg(err, errlen, -E2BIG, "landlock: too many read-only directories");
    fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0)
        return 0; /* not on this system */
    if (fstat(fd, &st) < 0) {
        close(fd);
        return 0;
    }
    access &= fs_handled(b->abi);
    if (!S_ISDIR(st.st_mode))
        access &= FS_FILE_RIGHTS;
    b->fds[b->n] = fd;
    b->access[b->n] = access;
    b->n++;
    return 0;
}

int landlock_base_open(struct landlock_base *b, int abi, const char *const *ro_dirs,
                       const char *const *ro_files, bool list_all, char *err, size_t errlen)
{
    memset(b, 0, sizeof(*b));
    b->abi = abi;
    int rc = list_all ? add_place(b, "/", LANDLOCK_ACCESS_FS_READ_DIR, err, errlen) : 0;

    for (size_t i = 0; rc == 0 && i < n_places; i++)
        rc = add_place(b, places[i].path, place_access(places[i].kind), err, errlen);
    for (; rc == 0 && ro_files && *ro_files; ro_files++)
        rc = add_place(b, *ro_files, LANDLOCK_ACCESS_FS_READ_FILE, err, errlen);
    for (; rc == 0 && ro_dirs && *ro_dirs; ro_dirs++) {
        int before = b->n;
        rc = add_place(b, *ro_dirs, FS_READ, err, errlen);
        if (rc == 0 && b->n == before)
            rc =
                errmsg(err, errlen, -ENOENT, "module directory %s: %s", *ro_dirs, strerror(ENOENT));
    }
    return rc;
}

static int add_rule(int ruleset, int fd, uint64_t access)
{
    struct ll_path_beneath pb = {.allowed_access = access, .parent_fd = fd};

    return syscall(SYS_landlock_add_rule, ruleset, LL_RULE_PATH_BENEATH, &pb, 0) < 0 ? -errno : 0;
}

int landlock_ruleset_for(const struct landlock_base *b, int ws_fd, char *err, size_t errlen)
{
    struct ll_ruleset_attr attr = {.handled_access_fs = fs_handled(b->abi)};
    size_t size = sizeof(attr.handled_access_fs);
    uint64_t ws_access = (FS_V1_ALL | LL_FS_REFER | LL_FS_TRUNCATE) & fs_handled(b->abi) &
                         ~(LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_MAKE_CHAR |
                           LANDLOCK_ACCESS_FS_MAKE_BLOCK);
    int rs, rc;

    if (b->abi >= 4) {
        /* No TCP binding or connecting, belt and braces under seccomp. */
        attr.handled_access_net = LL_NET_BIND_TCP | LL_NET_CONNECT_TCP;
        size = offsetof(struct ll_ruleset_attr, scoped);
    }
    if (b->abi >= 6) {
        /* Signals and abstract UNIX sockets stay inside the worker. */
        attr.scoped = LL_SCOPE_ABSTRACT_UNIX_SOCKET | LL_SCOPE_SIGNAL;
        size = sizeof(attr);
    }
    /* The kernel makes the ruleset descriptor close-on-exec. */
    rs = (int)syscall(SYS_landlock_create_ruleset, &attr, size, 0);
    if (rs < 0)
        return errmsg(err, errlen, -errno, "landlock_create_ruleset: %s", strerror(errno));
    for (int i = 0; i < b->n; i++) {
        rc = add_rule(rs, b->fds[i], b->access[i]);
        if (rc < 0) {
            close(rs);
            return errmsg(err, errlen, rc, "landlock_add_rule (read-only place %d): %s", i,
                          strerror(-rc));
        }
    }
    rc = add_rule(rs, ws_fd, ws_access);
    if (rc < 0) {
        close(rs);
        return errmsg(err, errlen, rc, "landlock_add_rule (workspace): %s", strerror(-rc));
    }
    return rs;
}

int landlock_enter(int abi, int ruleset_fd, char *err, size_t errlen)
{
    /* Our own /proc/<pid>, and nobody else's: /proc/self resolves to it.
     * Under a private root there is no /proc at all, and nothing to add. */
    int self = open("/proc/self", O_PATH | O_DIRECTORY | O_CLOEXEC);
    int rc = 0;

    if (self < 0 && errno != ENOENT) {
        rc = errmsg(err, errlen, -errno, "opening /proc/self: %s", strerror(errno));
        goto out;
    }
    if (self >= 0) {
        rc = add_rule(ruleset_fd, self, FS_READ & fs_handled(abi));
        if (rc < 0) {
            errmsg(err, errlen, rc, "landlock_add_rule (/proc/self): %s", strerror(-rc));
            goto out;
        }
    }
    if (syscall(SYS_landlock_restrict_self, ruleset_fd, 0) < 0)
        rc = errmsg(err, errlen, -errno, "landlock_restrict_self: %s", strerror(errno));
out:
    if (self >= 0)
        close(self);
    close(ruleset_fd);
    return rc;
}
