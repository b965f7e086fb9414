/* The supervisor's state for one sandbox, shared by the library's modules. */
#ifndef PYSBX_SANDBOX_H
#define PYSBX_SANDBOX_H

#include "admission.h"
#include "packages.h"
#include "pysbx.h"
#include "wire.h"
#include "workdir.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* Failures of the template within RESTART_WINDOW_NS (control.c) that put
 * the sandbox down for a while. */
#define RESTART_BURST 5
#include <sys/types.h>

struct sbx {
    struct admission admission;
    struct workdir work;   /* one workspace per worker inside */
    struct sbx_config cfg; /* a deep copy (strings our own): every start uses it */
    char *template_path;
    struct packages packages;    /* resolved from cfg.packages at open */
    atomic_bool single_run_used; /* cfg.single_run: the one run was asked for */
    atomic_uint sessions;        /* open (sbx_session_open), at most cfg.max_sessions */
    /* The template, through its control socket (control.c), all under
     * ctl_lock. */
    pthread_mutex_t ctl_lock;
    int ctl;
    pid_t template_pid;
    int template_pidfd;
    unsigned generation; /* templates started */
    unsigned restarts;   /* ... after the first */
    uint64_t failures[RESTART_BURST];
    unsigned n_failures;
    uint64_t retry_at; /* no new template before this (now_ns clock) */
    bool down;         /* failing too often: runs refused until retry_at */
    bool closing;
    char why_down[WIRE_TEXT_MAX];
    /* What the template reported when it started. */
    char python_version[32];
    char libseccomp_version[32];
    uint64_t workspace_bytes; /* tmpfs size per workspace; 0: none */
    struct wire_layer layers[WIRE_LAYERS];
};

#endif
