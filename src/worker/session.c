#define _GNU_SOURCE
#include "session.h"

#include "policy.h"
#include "pysbx.h"
#include "pyrun.h"
#include "request.h"
#include "sysutil.h"
#include "util.h"
#include "wire.h"
#include "worker_limits.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

_Static_assert(FD_READY == POLICY_SESSION_CHANNEL_FD, "the policy lets the channel carry messages");

/* One byte, with |fd| attached. */
static int send_fd(int sock, char byte, int fd)
{
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } c;
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf, .msg_controllen = sizeof(c.buf)};
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);

    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &fd, sizeof(int));
    return sendmsg(sock, &m, MSG_NOSIGNAL) == 1 ? 0 : -errno;
}

/* The template's next command: SESSION_FORK with its descriptors in |fds|.
 * Returns 1, 0 when the template is gone, or -errno (-EPROTO for anything
 * else, whose descriptors are closed). */
static int recv_fork(int sock, int fds[SESSION_FORK_FDS])
{
    char byte = 0;
    int got = 0;
    ssize_t n = wire_recv(sock, &byte, 1, fds, SESSION_FORK_FDS, &got);

    if (n <= 0)
        return (int)n;
    if (byte != SESSION_FORK || got != SESSION_FORK_FDS) {
        close_fds(fds, (size_t)got);
        return -EPROTO;
    }
    return 1;
}

/* |fds| to fixed numbers, whatever numbers they arrived at. */
static int place(const int fds[SESSION_FORK_FDS], const int at[SESSION_FORK_FDS])
{
    int tmp[SESSION_FORK_FDS];

    for (int i = 0; i < SESSION_FORK_FDS; i++)
        if ((tmp[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 64)) < 0)
            return -errno;
    /* All the old numbers first: one of them may be a number placed to. */
    for (int i = 0; i < SESSION_FORK_FDS; i++)
        close(fds[i]);
    for (int i = 0; i < SESSION_FORK_FDS; i++) {
        if (dup2(tmp[i], at[i]) < 0)
            return -errno;
        close(tmp[i]);
    }
    return 0;
}

_Noreturn static void state_loop(const struct worker_args *a);

/* A cell: the fork of the state, in the template's care. Its request, its
 * code, then what the code's end was; then it waits as a state would. */
_Noreturn static void cell_main(const struct worker_args *a, int fds[SESSION_FORK_FDS])
{
    static const int at[SESSION_FORK_FDS] = {FD_READY, FD_REQUEST, FD_STDOUT, FD_STDERR};
    struct wire_req req;
    struct rlimit as;
    char err[WIRE_TEXT_MAX];
    char *code;
    int rc;

    /* Our parent is the template (the fork's CLONE_PARENT): die with it. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != a->ppid)
        _exit(127);
    /* A process group of our own: kill(0, ...) reaches us alone. */
    if (setsid() < 0 || place(fds, at) < 0)
        _exit(127);
    char hello = CELL_HELLO;
    if (write_full(FD_READY, &hello, 1) < 0)
        _exit(127);

    /* The workspace by its path (the code of earlier cells may have moved
     * the working directory, never the mount). */
    int ws = open(a->ws_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    rc = ws < 0 ? -errno : request_read(FD_REQUEST, ws, &req, &code, err, sizeof(err));
    if (rc == -ENODATA)
        _exit(0); /* the supervisor closed without a request */
    if (rc < 0) {
        /* Before user code: the supervisor trusts this line (see worker.c). */
        (void)write_full(FD_STDERR, err, strnlen(err, sizeof(err)));
        _exit(125);
    }
    /* While the code runs, it holds its three streams and its channel. */
    close(ws);
    close(FD_REQUEST);
    /* The cell's limits, under the session's ceilings (the hard limits,
     * which no cell can raise): its memory, and RLIMIT_CPU a second past
     * its CPU limit, the backstop of the template's timer. */
    struct rlimit cpu;
    if (getrlimit(RLIMIT_AS, &as) < 0 || getrlimit(RLIMIT_CPU, &cpu) < 0)
        _exit(125);
    as.rlim_cur = req.memory_bytes < as.rlim_max ? req.memory_bytes : as.rlim_max;
    rlim_t backstop = (rlim_t)(req.cpu_ms / 1000) + 2;
    cpu.rlim_cur = backstop < cpu.rlim_max ? backstop : cpu.rlim_max;
    if (setrlimit(RLIMIT_AS, &as) < 0 || setrlimit(RLIMIT_CPU, &cpu) < 0 ||
        worker_start_limits(req.cpu_ms, req.wall_ms, false) < 0)
        _exit(125);
    int status = pyrun_cell(code, req.code_len);
    /* Let go of the cell's pipes: the supervisor sees their end. */
    if (dup2(FD_STDIN, FD_STDOUT) < 0 || dup2(FD_STDIN, FD_STDERR) < 0)
        _exit(127);
    char done[1 + sizeof(int32_t)] = {CELL_DONE};
    int32_t st = status;
    memcpy(done + 1, &st, sizeof(st));
    if (write_full(FD_READY, done, sizeof(done)) < 0)
        _exit(127);
    state_loop(a);
}

/* The state: nothing runs but this loop, and the template stops it between
 * cells. Each SESSION_FORK makes a cell. */
_Noreturn static void state_loop(const struct worker_args *a)
{
    for (;;) {
        int fds[SESSION_FORK_FDS];
        int rc = recv_fork(FD_READY, fds);
        if (rc == 0)
            _exit(0); /* the template is gone */
        if (rc == -EINTR || rc == -EAGAIN || rc == -EPROTO)
            continue;
        if (rc < 0)
            _exit(127);
        /* The raw system call: glibc's fork() would run the process's
         * at-fork handlers, and the template allows these flags only. No
         * Python code runs here, and this is the only thread. */
        pid_t pid =
            (pid_t)syscall(SYS_clone, (unsigned long)POLICY_SESSION_FORK, 0UL, 0UL, 0UL, 0UL);
        if (pid == 0)
            cell_main(a, fds);
        int e = errno;
        close_fds(fds, SESSION_FORK_FDS);
        if (pid < 0) {
            char msg[WIRE_TEXT_MAX];
            int n = snprintf(msg, sizeof(msg), "%cthe session's fork failed: %s",
                             SESSION_FORK_FAILED, strerror(e));
            (void)write_full(FD_READY, msg, n > 0 ? (size_t)n : 1);
        }
    }
}

_Noreturn void session_main(const struct worker_args *a, int listener)
{
    /* The session's ceilings, hard: no cell may pass them. A cell's CPU
     * time counts from its fork, so the longest a cell may ask for bounds
     * every process of the session. */
    rlim_t cpu = (rlim_t)SBX_MAX_SECONDS + 2;
    if (worker_set_limit(RLIMIT_FSIZE, WORKER_FSIZE_LIMIT, WORKER_FSIZE_LIMIT) < 0 ||
        worker_set_limit(RLIMIT_AS, a->session_memory, a->session_memory) < 0 ||
        worker_set_limit(RLIMIT_CPU, cpu, cpu) < 0 ||
        send_fd(FD_READY, SESSION_READY, listener) < 0)
        _exit(127);
    /* Each cell opens the workspace for itself and has its own request. */
    close(listener);
    close(FD_WORKSPACE);
    close(FD_REQUEST);
    state_loop(a);
}
