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
#include <linux/userfaultfd.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <ucontext.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

_Static_assert(FD_READY == POLICY_SESSION_CHANNEL_FD, "the policy lets the channel carry messages");

/* What a fork would carry into a child that a fresh process has not: a
 * process writes it down as it becomes the state (state_loop), and a copy
 * of the state takes it on once it has the state's memory, where this
 * record is. Nothing here is the template's concern: what the state writes
 * shapes its copy alone, which its code could shape anyway. */
static struct {
    struct sigaction act[_NSIG];
    sigset_t mask;
    stack_t altstack;
    mode_t umask;
    char cwd[PATH_MAX];
    bool chdir_due; /* the copy: its workspace's files come after it resumes */
} exported;

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

/* SESSION_FORK, with the cell's channel in *chan and its plan in |m|, or
 * SESSION_ADOPT (struct session_adopt_msg at the start of |m|) with its
 * file in *chan (m->cmd says which). Returns 1, 0 when the template is
 * gone, or -errno (-EPROTO for anything else, whose descriptors are
 * closed). */
static int recv_fork(int sock, struct session_fork_msg *m, int *chan)
{
    int got = 0;
    ssize_t len = wire_recv(sock, m, sizeof(*m), chan, 1, &got);

    if (len <= 0)
        return (int)len;
    if ((size_t)len == sizeof(struct session_adopt_msg) && got == 1 && m->cmd == SESSION_ADOPT)
        return 1;
    size_t head = offsetof(struct session_fork_msg, ranges);
    if (m->cmd != SESSION_FORK || got != 1 || (size_t)len < head ||
        m->n_ranges > CELL_PLAN_MAX_RANGES ||
        (size_t)len != head + m->n_ranges * sizeof(m->ranges[0])) {
        close_fds(chan, (size_t)got);
        return -EPROTO;
    }
    return 1;
}

/* Each page of [at, at + len), mapped already, touched from here: on a
 * machine whose hypervisor keeps its own copy of a process's page tables
 * (shadow paging), the first touch of each page by a new process is a trap
 * of its own, however mapped the page is; taken now, not while the code
 * runs. A page to be written is written: an atomic add of nothing, which
 * changes no byte whoever else may write there. */
static void touch(uint64_t at, uint64_t len, bool read)
{
    for (uint64_t p = at; p < at + len; p += 4096) {
        volatile char *c = (volatile char *)(uintptr_t)p;
        if (read)
            (void)*c;
        else
            (void)__atomic_fetch_add(c, 0, __ATOMIC_RELAXED);
    }
}

/* The pages of |plan| mapped now, and touched: those the last cell read
 * of its code and constants, then those it wrote, copied (best effort: a
 * range this process does not map, or not wholly, is refused by the kernel
 * and skipped), until the template says to run: in a batch a page costs a
 * fraction of its fault, but a page the code may not need is not worth it
 * once the code waits. */
static void warm(const struct session_fork_msg *plan)
{
    const uint64_t chunk = 64 * 4096;
    uint64_t since_look = chunk;

    for (uint32_t i = 0; i < plan->n_ranges; i++) {
        bool read = plan->ranges[i][0] & CELL_PLAN_READ;
        for (uint64_t at = plan->ranges[i][0] & ~CELL_PLAN_READ; at < plan->ranges[i][1];) {
            uint64_t len = plan->ranges[i][1] - at < chunk ? plan->ranges[i][1] - at : chunk;
            struct pollfd go = {.fd = FD_READY, .events = POLLIN};
            if (since_look >= chunk) {
                if (poll(&go, 1, 0) > 0)
                    return;
                since_look = 0;
            }
            /* Touched only once the kernel has mapped all of it: a page it
             * could not map is not touched. */
            if (madvise((void *)(uintptr_t)at, (size_t)len,
                        read ? MADV_POPULATE_READ : MADV_POPULATE_WRITE) == 0)
                touch(at, len, read);
            since_look += len;
            at += len;
        }
    }
}

/* The kept files (go->held, their |n| descriptors in |fds|) at the
 * numbers the state holds them at: each a description of the cell's own,
 * at the state's offset and with its flags, so that a seek, a write's
 * offset or a flag set through it is the cell's alone and goes with it if
 * it is rolled back. What the state holds at a number the template gave
 * nothing for is closed. */
static int take_kept_files(const struct cell_go *go, int *fds, int n)
{
    int k = 0;

    for (uint32_t i = 0; i < go->n_held; i++)
        k += go->held[i].given != 0;
    if (k != n)
        return -EPROTO;
    k = 0;
    for (uint32_t i = 0; i < go->n_held; i++) {
        const struct cell_held *h = &go->held[i];
        if (!h->given) {
            close(h->num);
            continue;
        }
        int rc = fds[k] == h->num ? fcntl(h->num, F_SETFD, h->cloexec ? FD_CLOEXEC : 0)
                                  : dup3(fds[k], h->num, h->cloexec ? O_CLOEXEC : 0);
        if (rc < 0)
            return -errno;
        if (fds[k] != h->num)
            close(fds[k]);
        fds[k++] = -1;
    }
    return 0;
}

/* |fds| to the numbers |at|, whatever numbers they arrived at. */
static int place(const int *fds, const int *at, int n)
{
    int tmp[CELL_FDS];

    for (int i = 0; i < n; i++)
        if ((tmp[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 64)) < 0)
            return -errno;
    /* All the old numbers first: one of them may be a number placed to. */
    for (int i = 0; i < n; i++)
        close(fds[i]);
    for (int i = 0; i < n; i++) {
        if (dup2(tmp[i], at[i]) < 0)
            return -errno;
        close(tmp[i]);
    }
    return 0;
}

/* A cell: the fork of the state, in the template's care. Its request, its
 * code, then what the code's end was; then it returns to wait as a state
 * would, in the loop it was forked in (a session's thousands of cells are
 * as many generations of processes: none may add to the stack).
 * Nothing here is trusted: after the session's first cell this is the
 * tenant's process (its memory may hold anything), so the template keeps
 * the cell's CPU and wall limits itself, the memory limit is the hard one
 * the first state set, and what this says is checked against what the
 * kernel says of the process (sessions.c). */
static void cell_main(const struct worker_args *a, int chan, const struct session_fork_msg *plan,
                      const sigset_t *mask)
{
    static const int at[CELL_FDS] = {FD_REQUEST, FD_STDOUT, FD_STDERR};
    static struct cell_go go;
    int fds[CELL_FDS + WIRE_HELD_MAX];
    int got = 0;
    struct wire_req req;
    struct request_input in = {.stdin_fd = -1};
    char err[WIRE_TEXT_MAX];
    char *code;
    int rc;

    /* Our parent is the template (the fork's CLONE_PARENT): die with it. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != a->ppid)
        _exit(127);
    /* A process group and session of our own: kill(0, ...) reaches us alone. */
    if (setsid() < 0 || place(&chan, (const int[]){FD_READY}, 1) < 0)
        _exit(127);
    warm(plan);
    char hello = CELL_HELLO;
    if (write_full(FD_READY, &hello, 1) < 0)
        _exit(127);
    /* The cell's own pipes come from the template when it is handed out,
     * straight to us: the state never holds a cell's output, so the end of
     * the output is the cell's alone to make. Its kept files come with
     * them; the one that may have come at the request's number moves. */
    if (wire_recv(FD_READY, &go, sizeof(go), fds, CELL_FDS + WIRE_HELD_MAX, &got) !=
            (ssize_t)sizeof(go) ||
        go.cmd != CELL_GO || go.n_held > WIRE_HELD_MAX || got < CELL_FDS)
        _exit(127);
    for (int i = CELL_FDS; i < got; i++)
        if (fds[i] == FD_REQUEST &&
            (fds[i] = fcntl(FD_REQUEST, F_DUPFD_CLOEXEC, FD_FIRST_FREE)) < 0)
            _exit(127);
    if (place(fds, at, CELL_FDS) < 0)
        _exit(127);

    /* The workspace by its path (the code of earlier cells may have moved
     * the working directory, never the mount). */
    int ws = open(a->ws_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    rc = ws < 0 ? -errno : request_read(FD_REQUEST, ws, true, &req, &code, err, sizeof(err));
    if (rc == -ENODATA)
        _exit(0); /* the supervisor closed without a request */
    /* A cell takes arguments, not standard input (the library refuses it:
     * the state's sys.stdin would carry one cell's input into the next). */
    if (rc == 0 && req.stdin_len)
        rc = errmsg(err, sizeof(err), -EINVAL, "pysbx: a session's cell takes no stdin\n");
    if (rc == 0 && req.tools_len) /* refused by the library too */
        rc = errmsg(err, sizeof(err), -EINVAL, "pysbx: a session's cell has no host tools\n");
    if (rc == 0)
        rc = request_read_input(FD_REQUEST, ws, &req, &in, err, sizeof(err));
    if (rc < 0) {
        (void)write_full(FD_STDERR, err, strnlen(err, sizeof(err)));
        _exit(125);
    }
    /* A branch's first cells go where its origin's state was (its files
     * are in place now); the first one kept took it on. */
    if (exported.chdir_due) {
        (void)chdir(exported.cwd);
        exported.chdir_due = false;
    }
    /* While the code runs, it holds its three streams, its channel and
     * its kept files. */
    close(ws);
    close(FD_REQUEST);
    if (take_kept_files(&go, fds + CELL_FDS, got - CELL_FDS) < 0)
        _exit(127);
    /* The code's signals again (state_loop): what came meanwhile is
     * delivered now, to the code. */
    sigprocmask(SIG_SETMASK, mask, NULL);
    struct pyrun_exit status =
        pyrun_cell(code, req.code_len, req.max_output_chars, in.args, in.n_args, in.filename);
    request_input_free(&in);
    /* Let go of the cell's pipes: the supervisor sees their end. */
    if (dup2(FD_STDIN, FD_STDOUT) < 0 || dup2(FD_STDIN, FD_STDERR) < 0)
        _exit(127);
    char done[CELL_DONE_LEN] = {CELL_DONE};
    memcpy(done + 1, &status.value, sizeof(status.value));
    done[1 + sizeof(status.value)] = status.past;
    if (write_full(FD_READY, done, sizeof(done)) < 0)
        _exit(127);
}

/* --- branching ----------------------------------------------------------- */

/* Where a copy resumes: in state_loop, where it waits for its first
 * command. Marked once, by a session's first process: every state after
 * it is a fork of it or a copy, whose state_loop is where the first's is. */
static jmp_buf branch_point;

static void export_self(void)
{
    for (int sig = 1; sig < _NSIG; sig++)
        if (sigaction(sig, NULL, &exported.act[sig]) < 0)
            exported.act[sig].sa_handler = SIG_DFL;
    sigprocmask(SIG_BLOCK, NULL, &exported.mask);
    if (sigaltstack(NULL, &exported.altstack) < 0)
        exported.altstack.ss_flags = SS_DISABLE;
    exported.umask = umask(0);
    umask(exported.umask);
    if (!getcwd(exported.cwd, sizeof(exported.cwd)))
        exported.cwd[0] = '\0';
}

static void adopt_exported(void)
{
    for (int sig = 1; sig < _NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP)
            (void)sigaction(sig, &exported.act[sig], NULL);
    if (!(exported.altstack.ss_flags & SS_DISABLE)) {
        exported.altstack.ss_flags = 0;
        (void)sigaltstack(&exported.altstack, NULL);
    }
    umask(exported.umask);
    exported.chdir_due = exported.cwd[0] != '\0';
    sigprocmask(SIG_SETMASK, &exported.mask, NULL);
}

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1 /* Linux 5.11 */
#endif

/* Whether session_import_fd's descriptor takes the kernel's faults too. */
static bool import_fd_full;

int session_import_fd(void)
{
    /* Faults of the kernel's as well (a system call reading or writing a
     * page not yet there), where the process may make one: root, before
     * it drops its privileges (CAP_SYS_PTRACE), or where the sysctl
     * vm.unprivileged_userfaultfd allows it. */
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);

    import_fd_full = fd >= 0;
    return fd >= 0 ? fd : (int)syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
}

/* BRANCH_MAPPED (BRANCH_MAPPED_FULL if |full|), with |fd|
 * (session_import_fd's) if there is one, which is then ours no more: the
 * copier's copy is the only one left. */
__attribute__((no_sanitize("address", "undefined"), noinline)) static long say_mapped(int fd,
                                                                                      bool full)
{
    char said = fd >= 0 && full ? BRANCH_MAPPED_FULL : BRANCH_MAPPED;
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } c;
    struct iovec iov = {.iov_base = &said, .iov_len = 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};

    if (fd >= 0) {
        m.msg_control = c.buf;
        m.msg_controllen = sizeof(c.buf);
        struct cmsghdr *h = CMSG_FIRSTHDR(&m);
        h->cmsg_level = SOL_SOCKET;
        h->cmsg_type = SCM_RIGHTS;
        h->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(h), &fd, sizeof(int));
    }
    long n = syscall(SYS_sendmsg, FD_READY, &m, 0);
    if (fd >= 0)
        syscall(SYS_close, fd);
    return n;
}

/* The import failed: the template hears why, and the process ends. */
__attribute__((no_sanitize("address", "undefined"), noinline)) static void
branch_fail(const char *what, uint64_t at, int e)
{
    char msg[128];
    int n = snprintf(msg, sizeof(msg), "%c%s at %#llx: %s", BRANCH_FAILED, what,
                     (unsigned long long)at, strerror(e));
    syscall(SYS_write, FD_READY, msg, n > 0 ? (size_t)n : 1);
    syscall(SYS_exit_group, 127);
}

/* A branch's import, on a stack of its own: from the first page the
 * template copies, everything this process had in memory is the state's,
 * so this uses its stack and the system calls alone, and ends in the
 * state's own branch_point. Nothing of the tenant's has run in this
 * process: it is confined as its own session already, and what it maps is
 * what the template (which reads the state's map from the kernel) says. */
__attribute__((no_sanitize("address", "undefined"), noinline)) static void branch_ops(int import_fd,
                                                                                      int full)
{
    for (;;) {
        struct branch_op o;
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } c;
        struct iovec iov = {.iov_base = &o, .iov_len = sizeof(o)};
        struct msghdr m = {.msg_iov = &iov,
                           .msg_iovlen = 1,
                           .msg_control = c.buf,
                           .msg_controllen = sizeof(c.buf)};
        long n = syscall(SYS_recvmsg, FD_READY, &m, MSG_CMSG_CLOEXEC);
        if (n <= 0)
            syscall(SYS_exit_group, n == 0 ? 0 : 127);
        int fd = -1;
        struct cmsghdr *h = CMSG_FIRSTHDR(&m);
        if (h && h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS &&
            h->cmsg_len == CMSG_LEN(sizeof(int)))
            memcpy(&fd, CMSG_DATA(h), sizeof(int));
        if (n != sizeof(o) || (o.kind == BRANCH_OP_MMAP_FILE) != (fd >= 0))
            branch_fail("a message out of turn", 0, EPROTO);
        long r = 0;
        size_t len = (size_t)(o.hi - o.lo);
        switch (o.kind) {
        case BRANCH_OP_MUNMAP:
            r = syscall(SYS_munmap, o.lo, len);
            break;
        case BRANCH_OP_BRK:
            r = syscall(SYS_brk, o.lo) == (long)o.lo ? 0 : (errno = ENOMEM, -1);
            break;
        case BRANCH_OP_MMAP_ANON:
        case BRANCH_OP_MMAP_FILE:
            /* Writable while it is copied into; protected after. */
            r = syscall(SYS_mmap, o.lo, len, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_FIXED_NOREPLACE |
                            (o.kind == BRANCH_OP_MMAP_ANON ? MAP_ANONYMOUS : 0),
                        fd, o.kind == BRANCH_OP_MMAP_FILE ? o.off : 0);
            r = r == (long)o.lo ? 0 : r == -1 ? -1 : (errno = EEXIST, -1);
            if (fd >= 0)
                syscall(SYS_close, fd);
            break;
        case BRANCH_OP_PROTECT:
            r = syscall(SYS_mprotect, o.lo, len, o.prot);
            break;
        case BRANCH_OP_GROW:
            /* The stack grows down to the state's as its pages are touched. */
            for (uint64_t p = o.hi; p > o.lo; p -= 4096)
                *(volatile char *)(uintptr_t)(p - 4096) = 0;
            break;
        case BRANCH_OP_END:
            if (import_fd >= 0) /* not given: BRANCH_OP_GROW never came */
                syscall(SYS_close, import_fd);
            longjmp(branch_point, 1);
        default:
            branch_fail("an unknown operation", 0, EPROTO);
        }
        if (r < 0)
            branch_fail(o.kind == BRANCH_OP_MUNMAP    ? "munmap"
                        : o.kind == BRANCH_OP_BRK     ? "brk"
                        : o.kind == BRANCH_OP_PROTECT ? "mprotect"
                                                      : "mmap",
                        o.lo, errno);
        if (o.kind == BRANCH_OP_GROW) {
            char heard = 0;
            if (say_mapped(import_fd, full) != 1 || syscall(SYS_read, FD_READY, &heard, 1) != 1 ||
                heard != BRANCH_COPIED)
                syscall(SYS_exit_group, 127);
            import_fd = -1;
        }
    }
}

/* A branch's first process: its import stack where the template says,
 * then the import on it. Never returns (the import ends in the state's
 * loop, or the process ends). */
_Noreturn static void branch_import(int import_fd)
{
    static ucontext_t here, there;
    struct branch_op o;
    int fd = -1, got = 0;

    if (wire_recv(FD_READY, &o, sizeof(o), &fd, 1, &got) != (ssize_t)sizeof(o) || got ||
        o.kind != BRANCH_STACK || o.hi <= o.lo)
        _exit(127);
    void *stack = mmap((void *)(uintptr_t)o.lo, (size_t)(o.hi - o.lo), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (stack != (void *)(uintptr_t)o.lo)
        branch_fail("mmap of the import's stack", o.lo, stack == MAP_FAILED ? errno : EEXIST);
    if (getcontext(&there) < 0)
        _exit(127);
    there.uc_stack.ss_sp = stack;
    there.uc_stack.ss_size = (size_t)(o.hi - o.lo);
    there.uc_link = NULL;
    makecontext(&there, (void (*)(void))branch_ops, 2, import_fd, (int)import_fd_full);
    swapcontext(&here, &there);
    _exit(127);
}

/* The state: nothing runs but this loop, and the template stops it between
 * cells. Each SESSION_FORK makes a cell. A copy of the state (a branch, an
 * image restored) resumes at the top, with the state's memory. */
_Noreturn static void state_loop(const struct worker_args *a)
{
    static struct session_fork_msg fork_msg;

    if (setjmp(branch_point) != 0) {
        /* A copy of the state, in a process of its own session: its record
         * is the state's, written before the state forked (the template
         * copies none that has not). */
        adopt_exported();
        char said = SESSION_BRANCHED;
        (void)write_full(FD_READY, &said, 1);
    } else
        export_self();
    for (;;) {
        int chan = -1;
        int rc = recv_fork(FD_READY, &fork_msg, &chan);
        if (rc == 0)
            _exit(0); /* the template is gone */
        if (rc == -EINTR || rc == -EAGAIN || rc == -EPROTO)
            continue;
        if (rc < 0)
            _exit(127);
        if (fork_msg.cmd == SESSION_ADOPT) {
            /* A kept file in a new inode: the cells forked after find it. */
            struct session_adopt_msg adopt;
            memcpy(&adopt, &fork_msg, sizeof(adopt));
            if (adopt.num != chan) {
                (void)dup3(chan, adopt.num, adopt.cloexec ? O_CLOEXEC : 0);
                close(chan);
            }
            continue;
        }
        /* The raw system call: glibc's fork() would run the process's
         * at-fork handlers, and the template allows these flags only. No
         * Python code runs here, and this is the only thread. The cell is
         * born with every signal blocked, until its code runs: a handler
         * of the code's (a SIGCONT's, as the cell is let run) would
         * otherwise run amid the cell taking its pipes and files, and
         * could put a file of its own at the request's number. */
        sigset_t all, mask;
        sigfillset(&all);
        sigprocmask(SIG_SETMASK, &all, &mask);
        pid_t pid =
            (pid_t)syscall(SYS_clone, (unsigned long)POLICY_SESSION_FORK, 0UL, 0UL, 0UL, 0UL);
        if (pid == 0) {
            cell_main(a, chan, &fork_msg, &mask);
            /* The cell ended: it is a state now, if it is kept. Its record
             * is written (after its answer: the template stops it as it
             * settles, and lets it run again to fork) before it forks. */
            export_self();
            continue;
        }
        int e = errno;
        sigprocmask(SIG_SETMASK, &mask, NULL);
        close(chan);
        if (pid < 0) {
            char msg[WIRE_TEXT_MAX];
            int n = snprintf(msg, sizeof(msg), "%cthe session's fork failed: %s",
                             SESSION_FORK_FAILED, strerror(e));
            (void)write_full(FD_READY, msg, n > 0 ? (size_t)n : 1);
        } else {
            char forked = SESSION_FORKED;
            (void)write_full(FD_READY, &forked, 1);
        }
    }
}

_Noreturn void session_main(const struct worker_args *a, int listener, int import_fd)
{
    struct session_begin b;
    int got = 0;

    /* The session's ceilings, hard: no cell may pass them. A cell's CPU
     * time counts from its fork, so the longest a cell may ask for bounds
     * every process of the session. */
    rlim_t cpu = (rlim_t)SBX_MAX_SECONDS + 2;
    if (worker_set_limit(RLIMIT_FSIZE, WORKER_FSIZE_LIMIT, WORKER_FSIZE_LIMIT) < 0 ||
        worker_set_limit(RLIMIT_CPU, cpu, cpu) < 0 ||
        send_fd(FD_READY, SESSION_READY, listener) < 0)
        _exit(127);
    /* Each cell opens the workspace for itself and has its own request. */
    close(listener);
    close(FD_WORKSPACE);
    close(FD_REQUEST);
    /* Made ahead or not, it waits for its session: then its memory
     * ceiling, before anything of the tenant's runs. */
    if (wire_recv(FD_READY, &b, sizeof(b), NULL, 0, &got) != (ssize_t)sizeof(b) ||
        b.cmd != SESSION_BEGIN)
        _exit(0); /* the template is gone, or has no session for it */
    rlim_t as = b.as_limit ? (rlim_t)b.as_limit : worker_memory_limit(b.memory_bytes);
    if (worker_set_limit(RLIMIT_AS, as, as) < 0)
        _exit(127);
    if (b.branch)
        branch_import(import_fd);
    if (import_fd >= 0)
        close(import_fd);
    state_loop(a);
}
