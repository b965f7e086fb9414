/*
 * Where a worker's CPU goes, phase by phase: a build with -DPYSBX_PROFILE=ON
 * marks the CPU clock of its thread (user + system since the fork; the
 * process clock lags once a CPU timer is armed on it) at each step
 * of a worker's life and writes the marks as one line to its stderr just
 * before it exits, where bench/phases reads them. In any other build the
 * marks are nothing at all.
 */
#ifndef PYSBX_PROFILE_H
#define PYSBX_PROFILE_H

enum prof_mark {
    PROF_PREFAULT,  /* the planned pages copied (prefault.h) */
    PROF_AFTERFORK, /* CPython's after-fork work */
    PROF_FDS,       /* descriptors at their numbers, the rest closed */
    PROF_WORKSPACE, /* a session; the workspace attached and entered */
    PROF_PREPARE,   /* environment, rehearsal */
    PROF_CONFINE,   /* limits, ids, capabilities, Landlock, seccomp */
    PROF_REQUEST,   /* waited for and read the request (mostly waiting: no CPU) */
    PROF_STARTED,   /* request limits, the CPU timer armed */
    PROF_RAN,       /* the code ran; streams flushed */
    PROF_COUNT,
};

/* The template's side, measured there and carried to the next worker (the
 * cost of making one worker is known only once it is made): the CPU its
 * fork() took in the template, and the whole of making it (pipes,
 * workspace, Landlock ruleset, fork, pidfd, bookkeeping). */
struct prof_spawn {
    double fork_us, spawn_us;
};

#ifdef PYSBX_PROFILE
void prof_mark(enum prof_mark m);
/* This thread's CPU clock, in µs. */
double prof_now(void);
/* The template's figures of the worker made before this one. */
void prof_set_spawn(const struct prof_spawn *s);
/* "pysbx-profile: prefault=U ... ran=U tfork=U tspawn=U\n": µs of the
 * worker's CPU since the fork at each mark, then the template's. */
void prof_report(int fd);
#else
static inline void prof_mark(enum prof_mark m)
{
    (void)m;
}
static inline double prof_now(void)
{
    return 0;
}
static inline void prof_set_spawn(const struct prof_spawn *s)
{
    (void)s;
}
static inline void prof_report(int fd)
{
    (void)fd;
}
#endif

#endif
