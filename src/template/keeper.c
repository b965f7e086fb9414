#define _GNU_SOURCE
#include "keeper.h"

#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/magic.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* The keeper's descriptors: the life pipe's read end and its signalfd. */
#define KEEPER_LIFE_FD 0
#define KEEPER_SIG_FD  1

/* Pid 1 of the namespace: it reaps what is orphaned there until the
 * template is gone, then ends, and the kernel takes every process of the
 * namespace with it. It runs nothing but this loop, holds no capability
 * and none of the template's descriptors. The namespace's processes cannot
 * signal it (the policy lets a worker signal itself alone, and an init
 * gets no signal from its own namespace that it has no handler for). */
_Noreturn static void keeper_main(int life)
{
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
    struct __user_cap_data_struct none[2] = {{0}};
    sigset_t all;

    prctl(PR_SET_NAME, "pysbx-keeper");
    /* The template's death kills us (the kernel sends it from outside the
     * namespace, which an init cannot ignore); the pipe covers a template
     * that died before this line. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
        _exit(1);
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL);
    if (dup2(life, KEEPER_LIFE_FD) < 0)
        _exit(1);
    close_range(KEEPER_LIFE_FD + 1, ~0U, 0);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    if (signalfd(-1, &chld, SFD_NONBLOCK) != KEEPER_SIG_FD || syscall(SYS_capset, &h, none) != 0 ||
        prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        _exit(1);
    for (;;) {
        struct pollfd p[2] = {{.fd = KEEPER_LIFE_FD, .events = POLLIN},
                              {.fd = KEEPER_SIG_FD, .events = POLLIN}};
        if (poll(p, 2, -1) < 0 && errno != EINTR)
            _exit(1);
        if (p[0].revents)
            _exit(0); /* the template closed its end, or is gone */
        struct signalfd_siginfo si;
        while (read(KEEPER_SIG_FD, &si, sizeof(si)) == (ssize_t)sizeof(si))
            ;
        while (waitpid(-1, NULL, WNOHANG | __WALL) > 0)
            ;
    }
}

int keeper_start(struct keeper *k, char *why, size_t cap)
{
    int p[2];

    k->pid = -1;
    k->life = -1;
    if (unshare(CLONE_NEWPID) < 0) {
        fmt(why, cap, "the kernel gives no pid namespace here (unshare: %s)", strerror(errno));
        return 0;
    }
    if (pipe2(p, O_CLOEXEC) < 0)
        return errmsg(why, cap, -errno, "template: the keeper's pipe: %s", strerror(errno));
    /* The raw fork: no at-fork handler runs in the keeper, which runs no
     * Python. */
    pid_t pid = (pid_t)syscall(SYS_clone, (unsigned long)SIGCHLD, 0UL, 0UL, 0UL, 0UL);
    if (pid == 0) {
        close(p[1]);
        keeper_main(p[0]);
    }
    int e = errno;
    close(p[0]);
    if (pid < 0) {
        close(p[1]);
        return errmsg(why, cap, -e, "template: forking the pid namespace's init: %s", strerror(e));
    }
    k->pid = pid;
    k->life = p[1];
    fmt(why, cap, "a pid namespace that dies with the template");
    return 1;
}

void keeper_stop(struct keeper *k)
{
    close_fd(&k->life);
    if (k->pid <= 0)
        return;
    /* Killed, not only told: a copy of the pipe's end that some process
     * of the namespace kept would hold the word back. Its end waits for
     * every process of the namespace to be reaped, our children among
     * them: reap whatever ends until it is. */
    kill(k->pid, SIGKILL);
    for (;;) {
        pid_t w = waitpid(-1, NULL, __WALL);
        if (w == k->pid || (w < 0 && errno != EINTR))
            break;
    }
    k->pid = -1;
}

int proc_open_own(char *why, size_t cap)
{
    char buf[4096];
    struct statfs sf;
    int fd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int status = -1;
    ssize_t got = -1;

    if (fd < 0) {
        fmt(why, cap, "no /proc: %s", strerror(errno));
        return -1;
    }
    if (fstatfs(fd, &sf) < 0 || sf.f_type != PROC_SUPER_MAGIC) {
        fmt(why, cap, "/proc is not a proc file system");
        goto fail;
    }
    /* NSpid lists our pid in the namespace /proc was mounted for, then in
     * each one below it: one number, ours, when it is our own namespace's;
     * "self" is not there at all when we are not in its namespace. */
    status = openat(fd, "self/status", O_RDONLY | O_CLOEXEC);
    if (status >= 0)
        got = read_full(status, buf, sizeof(buf) - 1);
    if (got <= 0) {
        fmt(why, cap, "/proc is another pid namespace's (this process is not in it)");
        goto fail;
    }
    buf[got] = '\0';
    char *line = strstr(buf, "\nNSpid:");
    char *end = NULL;
    long pid = line ? strtol(line + 7, &end, 10) : -1;
    while (end && (*end == ' ' || *end == '\t'))
        end++;
    if (pid != (long)getpid() || !end || *end != '\n') {
        fmt(why, cap,
            "/proc is another pid namespace's (mounted for an outer one): its numbers would "
            "name other processes; mount the sandbox's own (unshare --mount-proc)");
        goto fail;
    }
    close(status);
    return fd;

fail:
    if (status >= 0)
        close(status);
    close(fd);
    return -1;
}
