/*
 * A worker: forked from the template, confines itself while idle, then reads
 * one request, runs it, and ends. Used once.
 */
#ifndef PYSBX_WORKER_H
#define PYSBX_WORKER_H

#include "confine.h"

#include <sys/types.h>

/* Bytes a worker writes on its ready pipe to the template. */
#define WORKER_READY 'R' /* idle and confined: may be handed out */
#define WORKER_STARTED                                                                             \
    'S' /* the request is in place; user code runs next;                                           \
           a struct wire_started follows */

/* Written to the ready pipe, after which the worker exits, when it could not
 * get ready; the rest of the line says why. */
#define WORKER_FAILED 'F'

struct worker_args {
    pid_t template_pid;  /* the worker dies with it */
    int req_fd;          /* request socket, worker's end */
    int out_fd;          /* stdout pipe, write end */
    int err_fd;          /* stderr pipe, write end */
    int ready_fd;        /* ready pipe to the template, write end */
    int ws_fd;           /* the workspace directory */
    int devnull_fd;      /* /dev/null, read-write */
    const char *ws_path; /* the workspace as the code sees it (HOME, TMPDIR, cwd) */
    /* With the private root: the workspace's detached mount, which the
     * worker mounts at ws_path in a mount namespace of its own (the
     * template's has no workspace: siblings are not merely unreachable but
     * absent). -1: the workspace is the directory ws_fd, where it is. */
    int ws_mount_fd;
    bool rehearse;            /* warm up while idle (pyrun_prepare) */
    struct confine_plan plan; /* its ruleset_fd is moved to a fixed number */
};

/* Runs in the child right after the fork; never returns. */
_Noreturn void worker_main(const struct worker_args *a);

#endif
