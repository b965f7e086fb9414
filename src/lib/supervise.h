/*
 * Supervising one run, whatever runs it: read stdout and stderr as they come,
 * bounded, handing them to the caller's callback; keep the wall deadline;
 * kill on cancellation; then turn the kernel's verdict into a result and
 * collect the artifacts. The backends (embedded.c: a worker of the template;
 * backend_python3.c: a fresh python3 per run) feed it descriptors and an
 * outcome.
 */
#ifndef PYSBX_SUPERVISE_H
#define PYSBX_SUPERVISE_H

#include "outbuf.h"
#include "tools.h"
#include "wire.h"
#include "pysbx.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* How the process that ran the code ended, from the kernel (wait4) through
 * whoever reaped it; never from anything the code wrote. */
struct run_outcome {
    int wait_status;
    bool started;     /* user code may have run; false: certainly not */
    bool cpu_killed;  /* the CPU limit's keeper killed it */
    bool limit_lost;  /* the CPU limit could not be kept; it was killed */
    bool wall_killed; /* the wall limit's other keeper killed it */
    int64_t utime_us;
    int64_t stime_us;
    int64_t maxrss_kb;
    uint32_t flags;      /* WIRE_STATUS_* as the template sent them */
    int64_t cell_status; /* a session's cell: its code's own value (its claim; wire.h) */
    char fds_why[WIRE_STATUS_WHY_MAX]; /* WIRE_STATUS_FDS_LEFT: the template's words */
};

struct supervision {
    const struct sbx_request *req;
    /* Owned: supervise_free closes each that is still open. */
    int out_fd, err_fd; /* read ends of the code's stdout and stderr */
    int done_fd;        /* readable once the outcome can be had; on_done reads it */
    int pidfd;          /* to kill the process that runs the code */
    int ws_fd;          /* the workspace, for the artifacts */
    /* Whose files the workspace holds: they are read as that user, with no
     * capability to override file permissions (0: as we are). */
    uid_t owner_uid;
    gid_t owner_gid;
    /* Fills |outcome| and sets have_outcome, or sets lost; closes done_fd. */
    void (*on_done)(struct supervision *s);
    uint64_t start_ns;
    uint64_t deadline_ns;
    uint64_t end_ns;
    bool killed_for_wall;
    bool cancelled;
    bool have_outcome;
    bool lost; /* no outcome will come */
    const char *lost_reason;
    struct run_outcome outcome;
    /* A session's cell: which of its files count as artifacts. */
    bool (*only_artifacts)(const void *ctx, const char *path);
    const void *only_ctx;
    struct outbuf out, err;
    size_t delivered[2];    /* bytes of out/err text handed to on_output */
    struct tool_chan tools; /* a run with host tools: their channel */
};

/* Descriptors -1, output buffers bound to the request's limits. */
void supervise_init(struct supervision *s, const struct sbx_request *req);
/* Starts the wall clock. */
void supervise_start_clock(struct supervision *s);
void supervise_kill(struct supervision *s);
/* The supervisor itself gave up on the run (deadline passed while it was
 * still being handed over): the verdict will be a wall timeout. */
void supervise_kill_for_wall(struct supervision *s);
/* Reads both streams until the outcome is in (or lost), keeping the
 * deadline and watching the cancellation token; then drains the streams. */
void supervise_run(struct supervision *s);
/* The whole result: texts, stats, verdict, and the artifacts of a completed
 * run. Returns 0 or -ENOMEM. */
int supervise_finish(struct supervision *s, struct sbx_result *res);
/* A result for a run that never reached a process: the texts (empty) and
 * |status| SBX_CANCELLED or SBX_SANDBOX_ERROR with |reason|. Returns 0 or
 * -ENOMEM. */
int supervise_refuse(struct supervision *s, struct sbx_result *res, enum sbx_status status,
                     const char *reason);
/* Closes what is still open and frees the buffers. */
void supervise_free(struct supervision *s);

#endif
