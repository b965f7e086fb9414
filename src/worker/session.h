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

/* In the first state process, before it is confined (seccomp kills the
 * call): a userfaultfd of its own memory, or -1: one that takes every
 * fault where the process may make one (as root, before it drops its
 * privileges), else user faults only (which needs no privilege). If the
 * process becomes a branch, the copy fills the mappings made for it
 * through this (branch.c): the kernel puts each page in place, instead of
 * a fault zeroing one that the copy then overwrites; with one that takes
 * every fault, the copier fills most of them after the branch resumed.
 * It is given to the template's copier and closed before anything of the
 * tenant's is in the process; it is never a cell's, nor held by any
 * process that runs the tenant's code. */
int session_import_fd(void);

/* In the first state process, confined, with its seccomp |listener| and
 * session_import_fd()'s |import_fd|; never returns. */
_Noreturn void session_main(const struct worker_args *a, int listener, int import_fd);

#endif
