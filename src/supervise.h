/*
 * Supervising one run, whatever runs it: read stdout and stderr as they come,
 * bounded, handing them to the caller's callback; keep the wall deadline;
 * kill on cancellation; then turn the kernel's verdict into a result and
 * collect the artifacts. The backends (run.c: the embedded template;
 * backend_python3.c: a fresh python3 per run) feed it descriptors.
 */
#ifndef PYSBX_SUPERVISE_H
#define PYSBX_SUPERVISE_H

#include "outbuf.h"
#include "pysbx.h"
#include "wire.h"

#include <stdbool.h>
#include <stdint.h>

struct run {
    const struct sbx_request *req;
    int out_fd, err_fd; /* read ends of the code's stdout and stderr */
    int done_fd;        /* readable once the verdict can be had; on_done reads it */
    int pidfd;          /* to kill the process that runs the code */
    int ws_fd;          /* the workspace, for the artifacts */
    /* Fills |status| and sets have_status, or sets lost; closes done_fd. */
    void (*on_done)(struct run *r);
    void *ctx;
    uint64_t start_ns;
    uint64_t deadline_ns;
    uint64_t end_ns;
    bool killed_for_wall;
    bool cancelled;
    bool have_status;
    bool lost; /* no verdict will come */
    const char *lost_reason;
    struct wire_status status;
    struct outbuf out, err;
    size_t delivered[2]; /* bytes of out/err text handed to on_output */
};

/* Descriptors -1, output buffers bound to the request's limits. */
void run_init(struct run *r, const struct sbx_request *req);
/* Starts the wall clock. */
void run_start_clock(struct run *r);
void run_kill(struct run *r);
/* Reads both streams until the verdict is in (or lost), keeping the
 * deadline and watching the cancellation token; then drains the streams. */
void run_supervise(struct run *r);
/* Hands the captured text to |res| (and the rest of it to on_output). */
int run_take_texts(struct run *r, struct sbx_result *res);
/* The whole result: texts, stats, verdict, and the artifacts of a completed
 * run. Returns 0 or -ENOMEM. */
int run_finish(struct run *r, struct sbx_result *res);
void run_free(struct run *r);

#endif
