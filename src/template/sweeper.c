#define _GNU_SOURCE
#include "sweeper.h"

#include "sysutil.h"
#include "util.h"
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* The sweeper's descriptors: its input and the work directory. */
#define SWEEP_IN_FD   3
#define SWEEP_BASE_FD 4

_Noreturn static void sweeper_main(const char *base_path)
{
    char buf[WIRE_NAME_MAX + 1];
    size_t have = 0;

    for (;;) {
        ssize_t n = read(SWEEP_IN_FD, buf + have, sizeof(buf) - have);
        if (n <= 0)
            _exit(0); /* the template is gone or done */
        have += (size_t)n;
        char *line;
        while ((line = memchr(buf, '\n', have))) {
            char path[PATH_MAX];
            *line = '\0';
            fmt(path, sizeof(path), "%s/%s", base_path, buf);
            (void)umount2(path, MNT_DETACH);
            (void)unlinkat(SWEEP_BASE_FD, buf, AT_REMOVEDIR);
            size_t used = (size_t)(line - buf) + 1;
            memmove(buf, buf + used, have - used);
            have -= used;
        }
        if (have == sizeof(buf))
            have = 0; /* no name is this long: drop it rather than stall */
    }
}

int sweeper_start(struct sweeper *sw, const char *base_path, int base_fd, pid_t ppid, char *err,
                  size_t errlen)
{
    int p[2];

    sw->fd = -1;
    sw->pid = -1;
    if (pipe2(p, O_CLOEXEC) < 0)
        return errmsg(err, errlen, -errno, "sweeper pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close_fds(p, 2);
        return errmsg(err, errlen, -e, "sweeper fork: %s", strerror(e));
    }
    if (pid == 0) {
        prctl(PR_SET_NAME, "pysbx-sweeper");
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != ppid)
            _exit(1);
        int in = fcntl(p[0], F_DUPFD_CLOEXEC, SWEEP_IN_FD);
        int base = fcntl(base_fd, F_DUPFD_CLOEXEC, SWEEP_BASE_FD);
        if (in != SWEEP_IN_FD && dup2(in, SWEEP_IN_FD) < 0)
            _exit(1);
        if (base != SWEEP_BASE_FD && dup2(base, SWEEP_BASE_FD) < 0)
            _exit(1);
        close_range(SWEEP_BASE_FD + 1, ~0U, 0);
        sweeper_main(base_path);
    }
    close(p[0]);
    sw->fd = p[1];
    sw->pid = pid;
    return 0;
}

void sweeper_release(const struct sweeper *sw, const char *name)
{
    char line[WIRE_NAME_MAX + 1];

    if (sw->fd < 0)
        return;
    int n = snprintf(line, sizeof(line), "%s\n", name);
    if (n > 0 && (size_t)n < sizeof(line))
        (void)write_full(sw->fd, line, (size_t)n);
}

void sweeper_stop(struct sweeper *sw)
{
    close_fd(&sw->fd);
    if (sw->pid > 0)
        (void)waitpid(sw->pid, NULL, 0);
    sw->pid = -1;
}
