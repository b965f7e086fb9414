/*
 * The "python3" backend: a fresh `python3 -I -S` per request, the way the
 * reference design runs code, with the same limits and result contract as
 * the embedded sandbox and none of its confinement. It exists to prove the
 * backend seam and to give the benchmark its baseline through the same
 * front ends; never point untrusted code at it.
 */
#define _GNU_SOURCE
#include "backend.h"
#include "sbxerr.h"
#include "supervise.h"
#include "sysutil.h"
#include "util.h"
#include "workdir.h"
#include "worker_limits.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef PYSBX_PYTHON3
#error "PYSBX_PYTHON3 must name the python3 matching the embedded library"
#endif

/* Reads the code from descriptor 3, so that its size is not bounded by
 * argv; shows tracebacks without its own frame and with the code's lines
 * (imported only then: the common path costs what `python3 -c` does); ends
 * an uncaught MemoryError as the embedded runtime does. */
static const char wrapper[] =
    "import sys, os\n"
    "with os.fdopen(3, 'rb') as f:\n"
    "    src = f.read()\n"
    "def hook(t, v, tb):\n"
    "    import linecache, traceback\n"
    "    linecache.cache['<main>'] = (len(src), None,"
    " src.decode('utf-8', 'replace').splitlines(True), '<main>')\n"
    "    while tb is not None and tb.tb_frame.f_code.co_filename == '<string>':\n"
    "        tb = tb.tb_next\n"
    "    traceback.print_exception(t, v, tb)\n"
    "    if issubclass(t, MemoryError):\n"
    "        import signal\n"
    "        sys.stdout.flush()\n"
    "        sys.stderr.flush()\n"
    "        signal.signal(signal.SIGRTMAX, signal.SIG_DFL)\n"
    "        os.kill(os.getpid(), signal.SIGRTMAX)\n"
    "sys.excepthook = hook\n"
    "sys.argv = ['']\n"
    "del f\n"
    "exec(compile(src, '<main>', 'exec', dont_inherit=True),"
    " {'__name__': '__main__', '__builtins__': __builtins__})\n";

struct py3 {
    struct workdir work; /* <work_root>/pysbx-py3-XXXXXX */
};

struct py3_run {
    struct supervision s; /* first: on_done gets it */
    pid_t pid;
};

/* The share of the CPU limit that rusage must show for a SIGKILL to count
 * as RLIMIT_CPU's (see reap_child). */
#define RUSAGE_CPU_SHARE 0.75

/* RLIMIT_CPU counts whole seconds: the limit rounded up. */
static rlim_t whole_seconds(double seconds)
{
    rlim_t whole = (rlim_t)seconds;
    return (double)whole < seconds ? whole + 1 : whole;
}

static void reap_child(struct supervision *s)
{
    struct py3_run *p = (struct py3_run *)s;
    struct rusage ru;
    int st;

    pid_t got = wait4(p->pid, &st, WNOHANG, &ru);
    if (got == 0)
        return; /* spurious */
    s->end_ns = now_ns();
    close_fd(&s->done_fd);
    if (got < 0) {
        s->lost = true;
        s->lost_reason = "lost track of the python3 process";
        return;
    }
    p->pid = -1;
    s->outcome = (struct run_outcome){
        .wait_status = st,
        .started = true, /* nothing of ours runs before the code in python3 */
        .utime_us = timeval_us(ru.ru_utime),
        .stime_us = timeval_us(ru.ru_stime),
        .maxrss_kb = ru.ru_maxrss,
    };
    /* RLIMIT_CPU's SIGKILL (the kernel checks the precise runtime; rusage,
     * sampled, can read under it: 0.89 s at a 1 s limit on a loaded VM).
     * The baseline cannot tell it from a SIGKILL the code sent itself near
     * the limit; the embedded sandbox can, by its own timer. */
    double cpu_s = (double)(s->outcome.utime_us + s->outcome.stime_us) / 1e6;
    s->outcome.cpu_killed =
        WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL &&
        cpu_s >= RUSAGE_CPU_SHARE * (double)whole_seconds(s->req->limits.cpu_seconds);
    s->have_outcome = true;
}

static void limit(int resource, rlim_t soft, rlim_t hard)
{
    struct rlimit rl = {soft, hard};
    (void)setrlimit(resource, &rl);
}

/* Between fork and exec in a host that may have threads: system calls
 * only. Reports a failure to exec through |report| (close-on-exec). */
_Noreturn static void child(const struct sbx_limits *l, int ws_fd, int out, int err, int code,
                            int report, char *const argv[], char *const envp[])
{
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int fds[] = {devnull, out, err, code};
    rlim_t cpu = whole_seconds(l->cpu_seconds);

    for (int i = 0; i < 4; i++)
        if (fds[i] < 0 || (fds[i] = fcntl(fds[i], F_DUPFD, 10)) < 0)
            goto fail;
    for (int i = 0; i < 4; i++)
        if (dup2(fds[i], i) < 0)
            goto fail;
    if (fchdir(ws_fd) < 0 || dup2(report, 4) < 0 || fcntl(4, F_SETFD, FD_CLOEXEC) < 0)
        goto fail;
    close_range(5, ~0U, 0);
    /* A host (the command, for one) may block signals in its threads: the
     * baseline's python3 starts as a fresh process would. */
    sigset_t none;
    sigemptyset(&none);
    if (setsid() < 0 || sigprocmask(SIG_SETMASK, &none, NULL) < 0)
        goto fail;
    limit(RLIMIT_AS, l->memory_bytes, l->memory_bytes);
    limit(RLIMIT_CPU, cpu, cpu); /* SIGKILL at the limit, rounded up */
    limit(RLIMIT_FSIZE, WORKER_FSIZE_LIMIT, WORKER_FSIZE_LIMIT);
    limit(RLIMIT_NOFILE, WORKER_NOFILE_LIMIT, WORKER_NOFILE_LIMIT);
    limit(RLIMIT_CORE, 0, 0);
    execve(PYSBX_PYTHON3, argv, envp);
fail:;
    int e = errno;
    (void)!write(4, &e, sizeof(e));
    _exit(127);
}

static int write_inputs(int ws_fd, const struct sbx_request *req, char *why, size_t cap)
{
    for (size_t i = 0; i < req->n_files; i++) {
        const struct sbx_file *f = &req->files[i];
        int fd = open_beneath(ws_fd, f->name, O_WRONLY | O_CREAT | O_EXCL, 0644, true);
        int rc = fd < 0 ? fd : write_full(fd, f->data, f->len);
        if (fd >= 0)
            close(fd);
        if (rc < 0) {
            fmt(why, cap, "input file %s: %s", f->name, strerror(-rc));
            return -1;
        }
    }
    return 0;
}

static int py3_run(void *self, const struct sbx_request *req, struct sbx_result **out,
                   struct sbx_error *err)
{
    struct py3 *b = self;
    struct py3_run p = {.pid = -1};
    struct sbx_result *res;
    char name[] = "run-XXXXXX", path[PATH_MAX], why[256] = "";
    bool made = false;
    char env_home[PATH_MAX + 8], env_tmp[PATH_MAX + 8];
    int out_p[2] = {-1, -1}, err_p[2] = {-1, -1}, code_s[2] = {-1, -1}, rep[2] = {-1, -1};
    int rc;

    *out = NULL;
    rc = sbx_request_check(req, err);
    if (rc < 0)
        return rc;
    if (req->stdin_len || req->argc)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "the python3 backend takes no stdin or arguments");
    if (req->n_tools)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "the python3 backend has no host tools");
    res = calloc(1, sizeof(*res));
    if (!res)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    res->exit_code = -1;
    supervise_init(&p.s, req);

    if (sbx_cancel_fired(req->cancel)) {
        rc = supervise_refuse(&p.s, res, SBX_CANCELLED, "cancelled before it started");
        goto done;
    }
    fmt(path, sizeof(path), "%s/%s", b->work.path, name);
    if (!mkdtemp(path)) {
        fmt(why, sizeof(why), "making a workspace: %s", strerror(errno));
        goto failed;
    }
    memcpy(name, strrchr(path, '/') + 1, sizeof(name));
    made = true;
    p.s.ws_fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (p.s.ws_fd < 0 || write_inputs(p.s.ws_fd, req, why, sizeof(why)) < 0 ||
        pipe2(out_p, O_CLOEXEC) < 0 || pipe2(err_p, O_CLOEXEC) < 0 ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, code_s) < 0 ||
        pipe2(rep, O_CLOEXEC) < 0) {
        if (!why[0])
            fmt(why, sizeof(why), "preparing the run: %s", strerror(errno));
        goto failed;
    }
    fmt(env_home, sizeof(env_home), "HOME=%s", path);
    fmt(env_tmp, sizeof(env_tmp), "TMPDIR=%s", path);
    char *const argv[] = {"python3", "-I", "-S", "-c", (char *)wrapper, NULL};
    char *const envp[] = {env_home, env_tmp, "LANG=C.UTF-8", NULL};

    supervise_start_clock(&p.s);
    p.pid = fork();
    if (p.pid == 0)
        child(&req->limits, p.s.ws_fd, out_p[1], err_p[1], code_s[1], rep[1], argv, envp);
    if (p.pid < 0) {
        fmt(why, sizeof(why), "fork: %s", strerror(errno));
        goto failed;
    }
    close_fd(&out_p[1]);
    close_fd(&err_p[1]);
    close_fd(&code_s[1]);
    close_fd(&rep[1]);
    int e = 0;
    if (read(rep[0], &e, sizeof(e)) == (ssize_t)sizeof(e)) {
        waitpid(p.pid, NULL, 0);
        p.pid = -1;
        fmt(why, sizeof(why), "cannot run %s: %s", PYSBX_PYTHON3, strerror(e));
        goto failed;
    }
    p.s.pidfd = pidfd_open(p.pid, 0);
    p.s.done_fd = p.s.pidfd >= 0 ? dup(p.s.pidfd) : -1;
    if (p.s.done_fd < 0) {
        kill(p.pid, SIGKILL);
        fmt(why, sizeof(why), "pidfd_open: %s", strerror(errno));
        goto failed;
    }
    p.s.out_fd = out_p[0];
    p.s.err_fd = err_p[0];
    p.s.on_done = reap_child;
    /* The code goes down its own socket; a child that dies early must not
     * take the host with SIGPIPE. */
    for (size_t off = 0; off < req->code_len;) {
        ssize_t n = send(code_s[0], req->code + off, req->code_len - off, MSG_NOSIGNAL);
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    close_fd(&code_s[0]);
    supervise_run(&p.s);
    rc = supervise_finish(&p.s, res);
    goto cleanup;

failed:
    rc = supervise_refuse(&p.s, res, SBX_SANDBOX_ERROR, why);
cleanup:
    if (p.pid > 0) {
        kill(p.pid, SIGKILL);
        waitpid(p.pid, NULL, 0);
    }
    if (made)
        (void)remove_tree_at(b->work.fd, name);
done:
    close_fds(out_p, 2);
    close_fds(err_p, 2);
    close_fds(code_s, 2);
    close_fds(rep, 2);
    supervise_free(&p.s);
    if (rc < 0) {
        sbx_result_free(res);
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "out of memory");
    }
    *out = res;
    return 0;
}

static void py3_close(void *self)
{
    struct py3 *b = self;

    if (!b)
        return;
    workdir_remove(&b->work);
    free(b);
}

int backend_python3_open(const struct sbx_config *cfg, struct sbx_backend *out,
                         struct sbx_error *err)
{
    struct py3 *b;
    int rc;

    if (access(PYSBX_PYTHON3, X_OK) < 0)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOENT, "%s is not installed", PYSBX_PYTHON3);
    /* It runs python3 -I -S: no package set, and no pretending to one. */
    if (cfg && cfg->packages && cfg->packages[0])
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "the python3 backend does not take packages");
    b = calloc(1, sizeof(*b));
    if (!b)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    rc = workdir_make(&b->work, cfg ? cfg->work_root : NULL, "pysbx-py3-", false, err);
    if (rc < 0) {
        py3_close(b);
        return rc;
    }
    *out = (struct sbx_backend){"python3", b, py3_run, py3_close};
    return 0;
}
