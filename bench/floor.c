/*
 * pysbx-floor: the least any fork-per-run design with an honest exit status
 * can cost on this machine, measured so that pysbx-bench can state every
 * figure of pysbx as a ratio to it.
 *
 * CPython is initialised once exactly as the template does it (the same
 * interp_start(): isolated, UTF-8, the default warm modules, gc.freeze()).
 * A run is: a worker forked beforehand waits on a pipe; the code is written
 * to it; the worker runs it with stdout on a second pipe and exits; its
 * stdout is read to EOF; wait4() takes its status. No confinement, no
 * supervisor, no JSON, no files back.
 *
 * The bench drives it over stdin/stdout, one command per line:
 *   L <len>\n<code>           one run, timed from writing the code to wait4()
 *                             -> "<ms> <ok>\n"
 *   T <loops> <seconds> <len>\n<code>
 *                             <loops> processes, each forking runs one after
 *                             another for <seconds>
 *                             -> "<runs> <elapsed s> <cpu ms>\n", the CPU of
 *                             every process involved (the kernel's
 *                             accounting of the children, all reaped)
 * It runs in a directory of its own that the bench made (the code's files,
 * such as data.csv, are there).
 *
 * Built with PYSBX_PROFILE (bench/phases), the answer to L goes on with the
 * CPU, in µs, of this run's parts: " fork=F afterfork=A ran=R child=C
 * parent=P": the fork in this process (made after the previous run), the
 * child's CPU clock after CPython's after-fork work and after the code ran
 * and its output was flushed, the child's whole CPU (wait4, its exit
 * included), and this process's share of the run (writing, reading,
 * wait4).
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "interp.h"
#include "profile.h"
#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

/* A code larger than this is refused (the bench's snippets are small). */
#define FLOOR_CODE_MAX (1 << 20)

struct worker {
    pid_t pid;
    int code_fd; /* write end: the code */
    int out_fd;  /* read end: its stdout */
};

/* PYSBX_PROFILE: what a child measured, in a page shared with it. */
struct child_marks {
    double afterfork, ran;
};
static struct child_marks *marks;
static double last_fork_us;
static long last_child_us;

/* In the worker: reads the code to EOF, runs it as `python3 -c` would, and
 * exits with 0, or 1 after an uncaught exception. */
_Noreturn static void worker_run(int code_fd, int out_fd, int devnull)
{
    size_t cap = 4096, len = 0;
    char *code = malloc(cap);

    if (dup2(out_fd, 1) < 0 || dup2(devnull, 2) < 0 || dup2(devnull, 0) < 0 || !code)
        _exit(127);
    for (;;) {
        if (len + 1 == cap && !(code = realloc(code, cap *= 2)))
            _exit(127);
        ssize_t n = read(code_fd, code + len, cap - len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            _exit(127);
        if (n == 0)
            break;
        len += (size_t)n;
    }
    code[len] = '\0';
    int rc = PyRun_SimpleString(code) == 0 ? 0 : 1;
    PyObject *out = PySys_GetObject("stdout");
    PyObject *r = out ? PyObject_CallMethod(out, "flush", NULL) : NULL;
    if (!r)
        rc = 1;
    Py_XDECREF(r);
    if (marks)
        marks->ran = prof_now();
    _exit(rc);
}

static int worker_fork(struct worker *w, int devnull)
{
    int code[2], out[2];

    if (pipe2(code, O_CLOEXEC) < 0)
        return -errno;
    if (pipe2(out, O_CLOEXEC) < 0) {
        close_fds(code, 2);
        return -errno;
    }
    double t0 = prof_now();
    pid_t pid = interp_fork(NULL, NULL);
    if (pid == 0) {
        if (marks)
            marks->afterfork = prof_now();
        close(code[1]);
        close(out[0]);
        worker_run(code[0], out[1], devnull);
    }
    last_fork_us = prof_now() - t0;
    close(code[0]);
    close(out[1]);
    if (pid < 0) {
        close(code[1]);
        close(out[0]);
        return -errno;
    }
    *w = (struct worker){pid, code[1], out[0]};
    return 0;
}

/* Hands the code to a waiting worker, reads its stdout to EOF, reaps it.
 * Returns 1 when it exited with status 0, 0 otherwise. */
static int worker_finish(struct worker *w, const char *code, size_t len)
{
    char buf[65536];
    int st = -1;

    (void)write_full(w->code_fd, code, len);
    close(w->code_fd);
    while (read(w->out_fd, buf, sizeof(buf)) > 0)
        ;
    close(w->out_fd);
    struct rusage ru;
    if (wait4(w->pid, &st, 0, &ru) < 0)
        return 0;
    last_child_us = timeval_us(ru.ru_utime) + timeval_us(ru.ru_stime);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* One process's loop: fork, run, reap, until the deadline. */
static long loop_runs(const char *code, size_t len, uint64_t until, int devnull)
{
    long runs = 0;
    struct worker w;

    while (now_ns() < until) {
        if (worker_fork(&w, devnull) < 0 || !worker_finish(&w, code, len))
            return -1;
        runs++;
    }
    return runs;
}

static double children_cpu_ms(void)
{
    struct rusage ru;

    getrusage(RUSAGE_CHILDREN, &ru);
    return (double)(timeval_us(ru.ru_utime) + timeval_us(ru.ru_stime)) / 1e3;
}

static int throughput(int loops, double seconds, const char *code, size_t len, int devnull,
                      struct worker *idle)
{
    int pipes[64][2];
    pid_t pids[64];
    long runs = 0;
    bool ok = true;

    if (loops < 1 || loops > 64 || seconds <= 0)
        return -EINVAL;
    double cpu0 = children_cpu_ms();
    uint64_t t0 = now_ns(), until = t0 + (uint64_t)(seconds * 1e9);
    for (int i = 0; i < loops; i++) {
        if (pipe2(pipes[i], O_CLOEXEC) < 0)
            return -errno;
        pids[i] = fork();
        if (pids[i] == 0) {
            close(idle->code_fd); /* the latency worker's: not this loop's */
            close(idle->out_fd);
            long n = loop_runs(code, len, until, devnull);
            (void)write_full(pipes[i][1], &n, sizeof(n));
            _exit(0);
        }
        close(pipes[i][1]);
    }
    for (int i = 0; i < loops; i++) {
        long n = -1;
        if (read(pipes[i][0], &n, sizeof(n)) != (ssize_t)sizeof(n) || n < 0)
            ok = false;
        else
            runs += n;
        close(pipes[i][0]);
        waitpid(pids[i], NULL, 0);
    }
    double elapsed = (double)(now_ns() - t0) / 1e9;
    printf("%ld %.4f %.3f\n", ok ? runs : -1, elapsed, children_cpu_ms() - cpu0);
    fflush(stdout);
    return 0;
}

static char *read_code(size_t len)
{
    char *code = len <= FLOOR_CODE_MAX ? malloc(len + 1) : NULL;

    if (!code || fread(code, 1, len, stdin) != len) {
        free(code);
        return NULL;
    }
    code[len] = '\0';
    return code;
}

int main(void)
{
    struct interp_config cfg = {0};
    char err[512], line[128];
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);

    signal(SIGPIPE, SIG_IGN);
#ifdef PYSBX_PROFILE
    marks = mmap(NULL, sizeof(*marks), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (marks == MAP_FAILED)
        marks = NULL;
#endif
    if (devnull < 0 || interp_start(&cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "pysbx-floor: %s\n", devnull < 0 ? strerror(errno) : err);
        return 1;
    }
    struct worker next;
    if (worker_fork(&next, devnull) < 0) {
        fprintf(stderr, "pysbx-floor: fork: %s\n", strerror(errno));
        return 1;
    }
    while (fgets(line, sizeof(line), stdin)) {
        int loops = 0;
        double seconds = 0;
        size_t len = 0;
        char *code = NULL;

        if (sscanf(line, "L %zu", &len) == 1 && (code = read_code(len))) {
            double fork_us = last_fork_us, cpu0 = prof_now();
            uint64_t t0 = now_ns();
            int ok = worker_finish(&next, code, len);
            double ms = (double)(now_ns() - t0) / 1e6;
            if (marks)
                printf("%.4f %d fork=%.0f afterfork=%.0f ran=%.0f child=%ld parent=%.0f\n", ms, ok,
                       fork_us, marks->afterfork, marks->ran, last_child_us, prof_now() - cpu0);
            else
                printf("%.4f %d\n", ms, ok);
            fflush(stdout);
            /* The next worker waits before the next run is asked for. */
            if (worker_fork(&next, devnull) < 0)
                ok = -1;
            free(code);
            if (ok < 0)
                return 1;
        } else if (sscanf(line, "T %d %lf %zu", &loops, &seconds, &len) == 3 &&
                   (code = read_code(len))) {
            int rc = throughput(loops, seconds, code, len, devnull, &next);
            free(code);
            if (rc < 0)
                return 1;
        } else {
            fprintf(stderr, "pysbx-floor: bad command: %s", line);
            return 2;
        }
    }
    close(next.code_fd);
    close(next.out_fd);
    waitpid(next.pid, NULL, 0);
    return 0;
}
