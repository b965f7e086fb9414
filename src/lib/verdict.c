#define _GNU_SOURCE
#include "verdict.h"

#include "util.h"
#include "wire.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static int set_reason(struct sbx_result *res, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

static int set_reason(struct sbx_result *res, const char *format, ...)
{
    va_list ap;
    char *s = NULL;
    int n;

    va_start(ap, format);
    n = vasprintf(&s, format, ap);
    va_end(ap);
    if (n < 0)
        return -ENOMEM;
    /* A reason may quote what the worker said, cut to a buffer's size
     * possibly inside a character: keep whole characters, or the result
     * could not be encoded as JSON at all. */
    s[utf8_valid_prefix((const unsigned char *)s, (size_t)n)] = '\0';
    free(res->reason);
    res->reason = s;
    return 0;
}

int verdict_stopped(struct sbx_result *res, enum sbx_status status, const char *reason)
{
    res->status = status;
    res->limit = SBX_LIMIT_NONE;
    res->exit_code = -1;
    res->signal = 0;
    res->partial = true;
    return set_reason(res, "%s", reason);
}

int verdict_classify(const struct verdict_input *in, struct sbx_result *res)
{
    const struct sbx_limits *l = in->limits;
    int st = in->wait_status;
    int sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    /* RLIMIT_CPU, the backstop behind the template's timer, kills at least
     * a second past the limit. */
    bool cpu_spent = in->cpu_ms >= l->cpu_seconds * 1000.0;

    res->exit_code = -1;
    res->signal = 0;
    res->limit = SBX_LIMIT_NONE;
    res->partial = true;

    if (in->cancelled && sig == SIGKILL)
        return verdict_stopped(res, SBX_CANCELLED, "cancelled by the caller");
    if (in->killed_for_wall && sig == SIGKILL) {
        res->status = SBX_TIMEOUT;
        res->limit = SBX_LIMIT_WALL;
        return set_reason(res, "wall time limit of %g s exceeded", l->wall_seconds);
    }
    if (!in->started) {
        /* Nothing of the caller's ran: whatever ended the worker is ours. */
        if (in->setup_error && *in->setup_error)
            return verdict_stopped(res, SBX_SANDBOX_ERROR, in->setup_error);
        char why[128];
        if (sig)
            fmt(why, sizeof(why), "the worker was killed by %s before the code started",
                signal_name(sig) ? signal_name(sig) : "a signal");
        else
            fmt(why, sizeof(why), "the worker ended before the code started");
        return verdict_stopped(res, SBX_SANDBOX_ERROR, why);
    }
    if (sig == SIGKILL && in->limit_lost)
        return verdict_stopped(res, SBX_SANDBOX_ERROR,
                               "the sandbox could not keep the CPU limit and stopped the run");
    /* Only the sandbox's own kill is a CPU timeout: a worker that kills
     * itself, however much CPU it spent, has crashed. */
    if (sig == SIGKILL && (in->cpu_killed || cpu_spent)) {
        res->status = SBX_TIMEOUT;
        res->limit = SBX_LIMIT_CPU;
        return set_reason(res, "CPU time limit of %g s exceeded", l->cpu_seconds);
    }
    if (sig == WIRE_NOMEM_SIGNAL) {
        res->status = SBX_MEMORY_LIMIT;
        res->limit = SBX_LIMIT_MEMORY;
        char size[48];
        fmt_size(size, sizeof(size), l->memory_bytes);
        return set_reason(res, "memory limit of %s exceeded (MemoryError)", size);
    }
    if (sig) {
        const char *name = signal_name(sig);
        res->status = SBX_CRASHED;
        res->signal = sig;
        if (sig == SIGSYS)
            return set_reason(res, "stopped by the sandbox policy (SIGSYS)");
        if (sig == SIGKILL)
            return set_reason(res, "killed by SIGKILL, not by the sandbox's deadline (the "
                                   "kernel's out-of-memory killer is one cause)");
        if (name)
            return set_reason(res, "killed by %s", name);
        return set_reason(res, "killed by signal %d", sig);
    }
    if (WIFEXITED(st)) {
        res->status = SBX_COMPLETED;
        res->exit_code = WEXITSTATUS(st);
        res->partial = false;
        free(res->reason);
        res->reason = NULL;
        return 0;
    }
    return verdict_stopped(res, SBX_SANDBOX_ERROR, "the worker ended in an unknown way");
}
