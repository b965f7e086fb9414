/* The supervisor's state for one sandbox, shared by the library's modules. */
#ifndef PYSBX_SANDBOX_H
#define PYSBX_SANDBOX_H

#include "admission.h"
#include "pysbx.h"
#include "wire.h"
#include "workdir.h"

#include <pthread.h>
#include <sys/types.h>

struct sbx {
    struct admission admission;
    struct workdir work; /* one workspace per worker inside */
    /* The template, through its control socket (control.c). */
    pthread_mutex_t ctl_lock; /* serialises taking workers off the socket */
    int ctl;
    pid_t template_pid;
    /* What the template reported when it started. */
    char python_version[32];
    char libseccomp_version[32];
    uint64_t workspace_bytes; /* tmpfs size per workspace; 0: none */
    struct wire_layer layers[WIRE_LAYERS];
};

#endif
