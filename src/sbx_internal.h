/* The supervisor's state, shared by the library's modules. */
#ifndef PYSBX_SBX_INTERNAL_H
#define PYSBX_SBX_INTERNAL_H

#include "pysbx.h"
#include "wire.h"

#include <pthread.h>
#include <sys/types.h>

struct sbx {
    pthread_mutex_t lock; /* serialises taking workers off the control socket */
    /* Admission: at most max_running runs in flight, max_queued waiting. */
    pthread_mutex_t qlock;
    pthread_cond_t qcond;
    unsigned running, waiting, max_running, max_queued;
    int ctl;              /* control socket to the template */
    pid_t template_pid;
    int root_fd;          /* the directory holding work_dir */
    int work_fd;          /* work_dir: one workspace per worker inside */
    char *work_dir;       /* <work_root>/pysbx-XXXXXX */
    char python_version[32];
    char libseccomp_version[32];
    uint64_t workspace_bytes; /* tmpfs size per workspace; 0: none */
    struct wire_layer layers[WIRE_LAYERS];
};

/* A worker taken from the pool: the descriptors of enum wire_worker_fd. */
struct taken_worker {
    int fds[WFD_COUNT];
    pid_t pid;
    char workspace[WIRE_NAME_MAX];
};

/* Takes the next idle worker. Returns 0, or -1 with the reason (the template
 * failed to make one, or is gone). */
int sbx_take_worker(struct sbx *sbx, struct taken_worker *w, char *why, size_t whylen);

/* Sets *err (may be NULL) and returns |rc|. */
int sbx_fail(struct sbx_error *err, enum sbx_error_code code, int rc, const char *format, ...)
    __attribute__((format(printf, 4, 5)));

#endif
