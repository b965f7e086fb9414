#define _GNU_SOURCE
#include "worker.h"

#include "confine.h"
#include "holder.h"
#include "profile.h"
#include "pyrun.h"
#include "request.h"
#include "session.h"
#include "sysutil.h"
#include "util.h"
#include "wire.h"
#include "worker_limits.h"
#include "workspace.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Without close_range(2), descriptors below this are closed one by one. */
#define CLOSE_LOOP_MAX 65536

_Noreturn __attribute__((format(printf, 1, 2))) static void fail_idle(const char *format, ...)
{
    char msg[WIRE_TEXT_MAX];
    va_list ap;

    msg[0] = WORKER_FAILED;
    va_start(ap, format);
    vsnprintf(msg + 1, sizeof(msg) - 1, format, ap);
    va_end(ap);
    (void)write_full(FD_READY, msg, strlen(msg));
    _exit(126);
}

/* After the request arrived but before user code: the template has not seen
 * WORKER_STARTED, so the supervisor knows nothing of ours ran and trusts what
 * we say on stderr. */
_Noreturn __attribute__((format(printf, 1, 2))) static void fail_request(const char *format, ...)
{
    char msg[WIRE_TEXT_MAX];
    va_list ap;
    int n;

    va_start(ap, format);
    n = vsnprintf(msg, sizeof(msg), format, ap);
    va_end(ap);
    if (n > 0)
        (void)write_full(FD_STDERR, msg, strnlen(msg, sizeof(msg)));
    _exit(125);
}

/* Puts |n| descriptors at fixed numbers 0..n-1 whatever numbers they had,
 * then closes everything else. */
static int place_fds(const int *src, int n)
{
    int tmp[FD_FIRST_FREE];

    for (int i = 0; i < n; i++) {
        tmp[i] = fcntl(src[i], F_DUPFD_CLOEXEC, 64);
        if (tmp[i] < 0)
            return -errno;
    }
    for (int i = 0; i < n; i++)
        if (dup2(tmp[i], i) < 0)
            return -errno;
    if (close_range(FD_FIRST_FREE, ~0U, 0) < 0) {
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
            return -errno;
        for (rlim_t fd = FD_FIRST_FREE; fd < rl.rlim_cur && fd < CLOSE_LOOP_MAX; fd++)
            close((int)fd);
    }
    return 0;
}

int worker_set_limit(int resource, rlim_t soft, rlim_t hard)
{
    struct rlimit rl = {.rlim_cur = soft, .rlim_max = hard};

    return setrlimit(resource, &rl) < 0 ? -errno : 0;
}

/* How finely worker_vm_bytes() measures. */
#define VM_PROBE_STEP (64ULL << 10)

/* Whether one more mapping of VM_PROBE_STEP bytes fits under an address
 * space limit of |limit| bytes: it does when what is mapped already is at
 * most |limit| less that step. */
static bool vm_fits(rlim_t limit, rlim_t hard)
{
    struct rlimit rl = {.rlim_cur = limit, .rlim_max = hard};
    void *p;

    if (setrlimit(RLIMIT_AS, &rl) < 0)
        return false;
    p = mmap(NULL, VM_PROBE_STEP, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return false;
    munmap(p, VM_PROBE_STEP);
    return true;
}

/* What this worker had mapped once warm, before any request: the
 * template's own and its warm-up's, not the code's to pay for. */
static uint64_t vm_base;

rlim_t worker_memory_limit(uint64_t memory_bytes)
{
    uint64_t at = vm_base + memory_bytes;
    return at < memory_bytes || at >= (uint64_t)RLIM_INFINITY ? RLIM_INFINITY - 1 : (rlim_t)at;
}

uint64_t worker_vm_bytes(void)
{
    struct rlimit old;
    rlim_t lo = 0, hi = 64ULL << 20;

    /* What RLIMIT_AS counts (the kernel's total_vm), without /proc: the
     * smallest limit under which one more step still maps, found by
     * doubling and then halving (a dozen tries for a few hundred MiB). */
    if (getrlimit(RLIMIT_AS, &old) < 0)
        return 0;
    while (hi <= old.rlim_max && hi < (1ULL << 44) && !vm_fits(hi, old.rlim_max)) {
        lo = hi;
        hi *= 2;
    }
    if (hi > old.rlim_max || hi >= (1ULL << 44)) {
        setrlimit(RLIMIT_AS, &old);
        return 0; /* unknown: count from nothing */
    }
    while (hi - lo > VM_PROBE_STEP) {
        rlim_t mid = lo + (hi - lo) / 2 / VM_PROBE_STEP * VM_PROBE_STEP;
        if (vm_fits(mid, old.rlim_max))
            hi = mid;
        else
            lo = mid;
    }
    setrlimit(RLIMIT_AS, &old);
    return hi - VM_PROBE_STEP;
}

/* CPU time is kept from outside: the template holds a timer on this
 * process's CPU clock (all threads count) that it arms from what we tell it
 * here, and kills us with SIGKILL when it fires; nothing the code can delete
 * or ignore. RLIMIT_CPU, a second later and as SIGKILL too, is the backstop
 * should the template be slow. Returns 0 or -errno. */
int worker_start_limits(uint64_t cpu_ms, uint64_t wall_ms)
{
    struct timespec now;
    char msg[1 + sizeof(struct wire_started)];
    struct wire_started st;

    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now) < 0)
        return -errno;
    st.cpu_used_ns = (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec;
    st.cpu_limit_ns = cpu_ms * 1000000ULL;
    st.wall_limit_ns = wall_ms * 1000000ULL;
    /* Whole seconds for the rlimit, at least a second past the timer. */
    rlim_t at = (rlim_t)((st.cpu_used_ns + st.cpu_limit_ns) / 1000000000ULL) + 2;
    int rc = worker_set_limit(RLIMIT_CPU, at, at);
    if (rc < 0)
        return rc;
    msg[0] = WORKER_STARTED;
    memcpy(msg + 1, &st, sizeof(st));
    /* One write, under PIPE_BUF: the template reads it whole. */
    return write_full(FD_READY, msg, sizeof(msg));
}

_Noreturn void worker_main(const struct worker_args *a)
{
    const int fds[FD_FIRST_FREE] = {
        a->devnull_fd,
        a->out_fd,
        a->err_fd,
        a->req_fd,
        a->ready_fd,
        a->ws_fd,
        a->plan.ruleset_fd >= 0 ? a->plan.ruleset_fd : a->devnull_fd,
        a->ws_mount_fd >= 0 ? a->ws_mount_fd : a->devnull_fd,
    };
    struct confine_plan plan = a->plan;
    int listener = -1;
    pid_t holder = 0;
    char err[WIRE_TEXT_MAX];
    sigset_t none;
    struct wire_req req;
    struct request_input in = {.stdin_fd = -1};
    char *code;
    int rc;

    prctl(PR_SET_NAME, "pysbx-worker");
    /* Die with the template, and not a moment later than it. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != a->ppid)
        _exit(127);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL); /* the template blocks SIGCHLD */
    signal(SIGCHLD, SIG_DFL);

    /* 1. Descriptors: /dev/null, our pipes, the request socket, the ready
     * pipe, the workspace and the Landlock ruleset, at fixed numbers;
     * nothing else stays open. */
    rc = place_fds(fds, FD_FIRST_FREE);
    if (rc < 0)
        _exit(127); /* cannot even report: the template sees EOF */
    prof_mark(PROF_FDS);

    /* 2. A session of its own: no signal for a group reaches the template. */
    if (setsid() < 0)
        fail_idle("setsid: %s", strerror(errno));

    /* 3. The workspace is the working directory; under the private root it
     * is the only workspace this worker's mount namespace has. */
    if (a->ws_mount_fd >= 0 && (rc = workspace_attach(FD_WS_MOUNT, err, sizeof(err))) < 0)
        fail_idle("%s", err);
    close(FD_WS_MOUNT);
    if (a->late && a->late(a->late_arg, err, sizeof(err)) < 0)
        fail_idle("%s", err);
    if ((a->ws_mount_fd >= 0 ? chdir(a->ws_path) : fchdir(FD_WORKSPACE)) < 0)
        fail_idle("entering the workspace: %s", strerror(errno));
    umask(022);
    prof_mark(PROF_WORKSPACE);

    /* 4. Environment from nothing, and our own warm-up off the request path.
     * The template was started by exec with an empty environment and a fixed
     * argv, so /proc/self/environ and cmdline hold no launcher strings. */
    if (pyrun_prepare(a->ws_path, a->user, a->rehearse, a->warm_code, FD_STDIN, err, sizeof(err)) <
        0)
        fail_idle("%s", err);

    prof_mark(PROF_PREPARE);

    /* 5. Ceilings that do not depend on the request; the address space
     * mapped so far is the sandbox's, and a run's memory limit comes on
     * top of it. */
    vm_base = worker_vm_bytes();
    if (worker_set_limit(RLIMIT_CORE, 0, 0) < 0 ||
        worker_set_limit(RLIMIT_NOFILE, WORKER_NOFILE_LIMIT, WORKER_NOFILE_LIMIT) < 0 ||
        (plan.switch_user &&
         worker_set_limit(RLIMIT_NPROC, WORKER_NPROC_LIMIT, WORKER_NPROC_LIMIT) < 0))
        fail_idle("setrlimit: %s", strerror(errno));

    /* 6. Confinement: privileges, then the kernel policies, seccomp last
     * (a session's descriptor for a branch's copy before it). */
    int import_fd = a->session ? session_import_fd() : -1;
    plan.ruleset_fd = plan.landlock_abi > 0 ? FD_RULESET : -1;
    if (a->session)
        plan.session_listener = &listener;
    if (a->hold_exit)
        plan.holder = &holder;
    if (confine_self(&plan, err, sizeof(err)) < 0)
        fail_idle("%s", err);
    if (holder > 0)
        vm_base += HOLDER_STACK_BYTES; /* its stack: ours, not the code's */
    if (plan.landlock_abi <= 0)
        close(FD_RULESET);

    prof_mark(PROF_CONFINE);

    /* 7. Ready: the template may hand us out. */
    if (a->session)
        session_main(a, listener, import_fd);
    char ready = WORKER_READY;
    if (write_full(FD_READY, &ready, 1) < 0)
        _exit(127);

    /* --- the request path --- */
    rc = request_read(FD_REQUEST, FD_WORKSPACE, false, &req, &code, err, sizeof(err));
    if (rc == -ENODATA)
        _exit(0); /* the supervisor closed without a request: nothing to do */
    if (rc == 0)
        rc = request_read_input(FD_REQUEST, FD_WORKSPACE, &req, &in, err, sizeof(err));
    if (rc < 0)
        fail_request("%s", err);
    /* The code's standard input: what the request gave, else /dev/null. */
    if (in.stdin_fd >= 0 && dup2(in.stdin_fd, FD_STDIN) < 0)
        fail_request("pysbx: standard input: %s\n", strerror(errno));
    close_fd(&in.stdin_fd);
    prof_mark(PROF_REQUEST);
    /* A run with host tools keeps the request socket as their channel. */
    if (in.tools && pyrun_tools(FD_REQUEST, in.tools, err, sizeof(err)) < 0)
        fail_request("%s", err);
    if (!in.tools)
        close(FD_REQUEST);
    close(FD_WORKSPACE);

    if (worker_set_limit(RLIMIT_FSIZE, WORKER_FSIZE_LIMIT, WORKER_FSIZE_LIMIT) < 0 ||
        worker_set_limit(RLIMIT_AS, worker_memory_limit(req.memory_bytes),
                         worker_memory_limit(req.memory_bytes)) < 0)
        fail_request("pysbx: setrlimit: %s\n", strerror(errno));
    /* From here on, user code may run: the template arms the CPU limit from
     * what this says, and records that the code started. */
    rc = worker_start_limits(req.cpu_ms, req.wall_ms);
    if (rc < 0)
        fail_request("pysbx: CPU limit: %s\n", strerror(-rc));
    close(FD_READY);
    prof_mark(PROF_STARTED);
    pyrun_main(code, req.code_len, req.max_output_chars, in.args, in.n_args, in.filename);
}
