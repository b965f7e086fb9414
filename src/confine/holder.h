/*
 * The worker's exit off the answer's path.
 *
 * A process's exit tears down its address space and its namespaces before
 * its parent can learn its exit status: for a worker of the package
 * template (about 90 MB mapped) that is milliseconds of every answer. A
 * holder is a second process in the worker's memory and namespaces
 * (clone(CLONE_VM), not a thread): while it lives, the worker's exit only
 * drops a reference to each, wait4() reports the status at once, and the
 * teardown is paid by the holder, killed by the kernel as the worker ends
 * (its parent-death signal) and reaped by the pid namespace's init.
 *
 * It is made after the worker's credentials, capabilities and Landlock and
 * before its seccomp program, and before any of the request's code: it
 * blocks every signal, closes its copy of every descriptor, dies with the
 * worker, loads a filter of its own that lets it only wait, wake and exit
 * (anything else kills it), and waits for a signal that cannot come. The
 * worker goes on only once it holds. Its memory is the code's to write,
 * stack included: if the code got it back to user mode (a stop and a
 * continue restart its wait with what the code left there), the filter is
 * all it has. What the code can do to it: kill it (the teardown is back on
 * the worker's exit), stop it (the kernel's SIGKILL still ends it), nothing
 * else a process of its own uid could not do to the worker itself.
 */
#ifndef PYSBX_HOLDER_H
#define PYSBX_HOLDER_H

#include <sys/types.h>

/* What a holder adds to the worker's address space: its stack. */
#define HOLDER_STACK_BYTES (16 * 1024)

/* Makes the holder; returns its pid (in our pid namespace) once it holds,
 * or -errno (then there is none and the worker's exit is as it was). */
pid_t holder_start(void);

#endif
