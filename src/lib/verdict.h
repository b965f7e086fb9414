/*
 * Deciding what happened to a run, from what the kernel said (the wait
 * status and resource use, relayed by the template), whether the worker had
 * reached user code, and the supervisor's own record of whether it killed
 * the worker. Never from anything the worker wrote.
 */
#ifndef PYSBX_VERDICT_H
#define PYSBX_VERDICT_H

#include "pysbx.h"

#include <stdbool.h>

struct verdict_input {
    int wait_status;
    bool started;         /* the worker reached user code (template's record) */
    bool cpu_killed;      /* the template's CPU timer fired and it killed the worker */
    bool limit_lost;      /* the template could not arm the CPU limit and killed it */
    bool killed_for_wall; /* the supervisor sent SIGKILL at the deadline */
    bool cancelled;       /* the supervisor sent SIGKILL for the caller */
    double cpu_ms;
    const struct sbx_limits *limits;
    const char *setup_error; /* what the worker said before user code, or NULL */
};

/* Fills status, limit, exit_code, signal, partial and reason (malloc'd) of
 * |res|. Returns 0 or -ENOMEM. */
int verdict_classify(const struct verdict_input *in, struct sbx_result *res);

/* Sets |res| to |status| (SBX_CANCELLED or SBX_SANDBOX_ERROR): no exit
 * code, no signal, partial output, |reason|. Returns 0 or -ENOMEM. */
int verdict_stopped(struct sbx_result *res, enum sbx_status status, const char *reason);

#endif
