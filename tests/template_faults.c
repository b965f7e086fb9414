/*
 * Linked into pysbx-template-faults only (-Wl,--wrap=...): after start-up
 * (the private root alone takes some thirty mounts), some of the template's
 * forks, mounts (workspaces: mount, or fsmount under the private root) and
 * pipes fail as they can on a machine out of processes,
 * memory or descriptors. A fixed pattern, so that a failing run can be
 * repeated.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

pid_t __wrap_fork(void);
int __wrap_mount(const char *src, const char *target, const char *type, unsigned long flags,
                 const void *data);
int __wrap_pipe2(int fds[2], int flags);
int __wrap_fsmount(int fs_fd, unsigned int flags, unsigned int attr_flags);
pid_t __real_fork(void);
int __real_mount(const char *src, const char *target, const char *type, unsigned long flags,
                 const void *data);
int __real_pipe2(int fds[2], int flags);
int __real_fsmount(int fs_fd, unsigned int flags, unsigned int attr_flags);

/* Calls that always pass before the pattern starts: start-up's own. */
#define FORKS_FREE  4
#define MOUNTS_FREE 40
#define PIPES_FREE  8

static unsigned forks, mounts, fsmounts, pipes;

pid_t __wrap_fork(void)
{
    if (++forks > FORKS_FREE && forks % 5 == 0) {
        errno = EAGAIN;
        return -1;
    }
    return __real_fork();
}

int __wrap_mount(const char *src, const char *target, const char *type, unsigned long flags,
                 const void *data)
{
    if (++mounts > MOUNTS_FREE && mounts % 7 == 0) {
        errno = ENOMEM;
        return -1;
    }
    return __real_mount(src, target, type, flags, data);
}

int __wrap_pipe2(int fds[2], int flags)
{
    if (++pipes > PIPES_FREE && pipes % 11 == 0) {
        errno = EMFILE;
        return -1;
    }
    return __real_pipe2(fds, flags);
}

/* Start-up makes no detached mount: every one is a workspace's. */
int __wrap_fsmount(int fs_fd, unsigned int flags, unsigned int attr_flags)
{
    if (++fsmounts % 7 == 0) {
        errno = ENOMEM;
        return -1;
    }
    return __real_fsmount(fs_fd, flags, attr_flags);
}
