/*
 * A session's processes, in the worker's code (the template's side is
 * src/template/sessions.c). The first state process is made like a worker;
 * once confined it hands the template its seccomp listener and waits. Each
 * cell is a fork of the state process, made when the template says so and
 * allowed (through the listener) only then; the cell reads its request,
 * runs it, says how it ended, and then waits as the next state might. The
 * template decides which process is the state.
 */
#ifndef PYSBX_SESSION_H
#define PYSBX_SESSION_H

#include "worker.h"

/* In the first state process, confined, with its seccomp |listener|;
 * never returns. */
_Noreturn void session_main(const struct worker_args *a, int listener);

#endif
