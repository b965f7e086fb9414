/*
 * The template process's state, shared by its modules: main.c (start,
 * configuration), pool.c (the pool loop), layers.c (the layer report).
 */
#ifndef PYSBX_TEMPLATE_H
#define PYSBX_TEMPLATE_H

#include "jail.h"
#include "landlock.h"
#include "policy.h"
#include "prefault.h"
#include "sweeper.h"
#include "uids.h"
#include "wire.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* The control socket, as the supervisor's posix_spawn placed it. */
#define TEMPLATE_CTL_FD 3
/* The signal a worker's CPU timer raises in the template. */
#define TEMPLATE_CPU_SIGNAL (SIGRTMIN + 1)
/* ... and its wall-clock timer (the supervisor keeps the deadline first;
 * this one holds even when the supervisor is held up). */
#define TEMPLATE_WALL_SIGNAL (SIGRTMIN + 2)

struct worker_rec;

struct tmpl {
    int ctl;
    int sigfd;
    int base_fd; /* the work directory */
    int devnull;
    pid_t pid;
    char *base_path;
    unsigned pool_size;
    unsigned outstanding; /* messages not yet taken + workers getting ready */
    int proc_fd;          /* /proc, for the template alone */
    struct worker_rec *workers;
    unsigned n_workers;
    char **warm;
    char **module_dirs;
    /* A vetted package set (all NULL without one): see packages.h. */
    char *pkg_path;
    char **pkg_modules;
    char **pkg_places;
    char **pkg_links;
    bool policy_debug;
    /* One run, then closed (sbx_config.single_run): one worker, no
     * rehearsal, no page plan, no replacement. */
    bool single_run;
    /* The confinement every worker gets, decided once. */
    struct jail_config jc;
    struct jail jail;
    bool root; /* in the private root */
    char root_why[WIRE_LAYER_DETAIL_MAX];
    struct uids uids;
    struct sweeper sweeper;
    struct policy policy;
    bool seccomp;
    char seccomp_why[WIRE_LAYER_DETAIL_MAX];
    int landlock; /* ABI, or <= 0 */
    char landlock_why[WIRE_LAYER_DETAIL_MAX];
    struct landlock_base ll_base;
    struct prefault prefault; /* learnt from the first worker to get ready */
};

/* Tells the supervisor that a worker could not be made (or the template
 * could not start). */
void template_send_fail(struct tmpl *t, const char *text);

/* Fills the pool, then serves the control socket and the workers until the
 * supervisor goes away; kills and reaps every worker before it returns. */
void pool_run(struct tmpl *t);

/* The report the supervisor gets at start: versions, and each layer as
 * active or not with the reason. */
void layers_describe(const struct tmpl *t, struct wire_hello *h);

#endif
