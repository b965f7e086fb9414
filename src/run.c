/*
 * One run on the embedded backend: take an idle worker from the template,
 * hand it the request, and let supervise.c read its output and verdict.
 */
#define _GNU_SOURCE
#include "artifacts.h"
#include "cancel.h"
#include "sbx_internal.h"
#include "supervise.h"
#include "sysutil.h"
#include "util.h"
#include "verdict.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct embedded_run {
    struct run r;
    struct taken_worker w;
};

/* Reads the template's status message; on end of stream the template is
 * gone. */
static void read_status(struct run *r)
{
    ssize_t n = read_full(r->done_fd, &r->status, sizeof(r->status));

    r->end_ns = now_ns();
    if (n == (ssize_t)sizeof(r->status) && r->status.magic == WIRE_STATUS_MAGIC)
        r->have_status = true;
    else {
        r->lost = true;
        r->lost_reason = "the template process ended unexpectedly";
        run_kill(r);
    }
    close_fd(&r->done_fd);
}

struct segment {
    const void *p;
    size_t len;
};

static int send_segment(struct run *r, int fd, struct segment s)
{
    const char *p = s.p;

    while (s.len > 0) {
        ssize_t n = send(fd, p, s.len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            s.len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN)
            return -errno; /* the worker is gone; its status will say why */
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        uint64_t now = now_ns();
        if (now >= r->deadline_ns) {
            run_kill(r);
            r->killed_for_wall = true;
            return -ETIMEDOUT;
        }
        int ms = (int)((r->deadline_ns - now) / 1000000) + 1;
        if (poll(&pfd, 1, ms > 1000 ? 1000 : ms) < 0 && errno != EINTR)
            return -errno;
    }
    return 0;
}

static int send_request(struct run *r, int *fdp)
{
    const struct sbx_request *req = r->req;
    int fd = *fdp;
    struct wire_req h = {
        .magic = WIRE_REQ_MAGIC,
        .version = WIRE_VERSION,
        .cpu_ms = (uint64_t)(req->limits.cpu_seconds * 1000.0 + 0.5),
        .memory_bytes = req->limits.memory_bytes,
        .code_len = req->code_len,
        .n_files = (uint32_t)req->n_files,
    };
    int rc;

    if (h.cpu_ms == 0)
        h.cpu_ms = 1;
    /* Header and a small program in one write: the worker wakes once. */
    if (req->code_len <= 16384) {
        char first[sizeof(h) + 16384];
        memcpy(first, &h, sizeof(h));
        memcpy(first + sizeof(h), req->code, req->code_len);
        rc = send_segment(r, fd, (struct segment){first, sizeof(h) + req->code_len});
    } else {
        rc = send_segment(r, fd, (struct segment){&h, sizeof(h)});
        if (rc == 0)
            rc = send_segment(r, fd, (struct segment){req->code, req->code_len});
    }
    for (size_t i = 0; rc == 0 && i < req->n_files; i++) {
        const struct sbx_file *f = &req->files[i];
        struct wire_file fh = {.name_len = (uint32_t)strlen(f->name), .data_len = f->len};
        rc = send_segment(r, fd, (struct segment){&fh, sizeof(fh)});
        if (rc == 0)
            rc = send_segment(r, fd, (struct segment){f->name, fh.name_len});
        if (rc == 0)
            rc = send_segment(r, fd, (struct segment){f->data, f->len});
    }
    /* Closing our end also discards anything the code might send back on
     * it, descriptors included, so nothing of the worker outlives it here. */
    close_fd(fdp);
    return rc;
}

static bool workspace_name_ok(const char *name)
{
    if (name[0] != 'w' || name[1] == '\0')
        return false;
    for (const char *p = name + 1; *p; p++)
        if (*p < '0' || *p > '9')
            return false;
    return true;
}

enum admission { ADMITTED, REFUSED, CANCELLED };

/* Waits for a place among the runs in flight: a bounded queue, with the
 * request's deadline, left early if the caller cancels. */
static enum admission admit(struct sbx *sbx, const struct sbx_request *req, struct sbx_error *err)
{
    uint64_t deadline = req->queue_timeout_seconds > 0
                            ? now_ns() + (uint64_t)(req->queue_timeout_seconds * 1e9)
                            : UINT64_MAX;
    enum admission a = ADMITTED;

    pthread_mutex_lock(&sbx->qlock);
    if (sbx->running >= sbx->max_running) {
        if (sbx->waiting >= sbx->max_queued) {
            a = REFUSED;
            sbx_fail(err, SBX_ERR_BUSY, -EBUSY, "%u runs in flight and %u waiting: queue full",
                     sbx->running, sbx->waiting);
            goto out;
        }
        sbx->waiting++;
        while (sbx->running >= sbx->max_running) {
            if (sbx_cancel_fired(req->cancel)) {
                a = CANCELLED;
                break;
            }
            uint64_t now = now_ns();
            if (now >= deadline) {
                a = REFUSED;
                sbx_fail(err, SBX_ERR_BUSY, -EBUSY,
                         "no worker free within %g s (%u runs in flight)",
                         req->queue_timeout_seconds, sbx->running);
                break;
            }
            /* Slices, so that a cancellation is seen soon. */
            uint64_t until = now + 50000000ULL < deadline ? now + 50000000ULL : deadline;
            struct timespec ts = {(time_t)(until / 1000000000ULL), (long)(until % 1000000000ULL)};
            pthread_cond_timedwait(&sbx->qcond, &sbx->qlock, &ts);
        }
        sbx->waiting--;
    }
    if (a == ADMITTED)
        sbx->running++;
out:
    pthread_mutex_unlock(&sbx->qlock);
    return a;
}

static void leave(struct sbx *sbx)
{
    pthread_mutex_lock(&sbx->qlock);
    sbx->running--;
    pthread_cond_signal(&sbx->qcond);
    pthread_mutex_unlock(&sbx->qlock);
}

int sbx_run(struct sbx *sbx, const struct sbx_request *req, struct sbx_result **out,
            struct sbx_error *err)
{
    struct sbx_result *res = NULL;
    char why[WIRE_TEXT_MAX];
    int rc;

    *out = NULL;
    if (!sbx)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "no sandbox");
    rc = sbx_request_check(req, err);
    if (rc < 0)
        return rc;
    if (sbx->workspace_bytes) {
        uint64_t in = 0;
        for (size_t i = 0; i < req->n_files; i++)
            in += req->files[i].len;
        if (in > sbx->workspace_bytes)
            return sbx_fail(err, SBX_ERR_TOO_LARGE, -E2BIG,
                            "input files (%llu bytes) do not fit the workspace (%llu bytes)",
                            (unsigned long long)in, (unsigned long long)sbx->workspace_bytes);
    }
    enum admission a = admit(sbx, req, err);
    if (a == REFUSED)
        return -EBUSY;
    res = calloc(1, sizeof(*res));
    if (!res) {
        if (a == ADMITTED)
            leave(sbx);
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    }
    res->exit_code = -1;

    struct embedded_run e;
    run_init(&e.r, req);
    for (int i = 0; i < WFD_COUNT; i++)
        e.w.fds[i] = -1;
    if (a == CANCELLED || sbx_cancel_fired(req->cancel)) {
        rc = run_take_texts(&e.r, res);
        if (rc == 0)
            rc = verdict_cancelled(res, "cancelled before it started");
        goto done;
    }
    if (sbx_take_worker(sbx, &e.w, why, sizeof(why)) < 0) {
        rc = run_take_texts(&e.r, res);
        if (rc == 0)
            rc = verdict_sandbox_error(res, why);
        goto done;
    }
    e.r.out_fd = e.w.fds[WFD_STDOUT];
    e.r.err_fd = e.w.fds[WFD_STDERR];
    e.r.done_fd = e.w.fds[WFD_STATUS];
    e.r.pidfd = e.w.fds[WFD_PIDFD];
    e.r.ws_fd = e.w.fds[WFD_WORKSPACE];
    e.r.on_done = read_status;
    if (!workspace_name_ok(e.w.workspace)) {
        run_kill(&e.r);
        rc = run_take_texts(&e.r, res);
        if (rc == 0)
            rc = verdict_sandbox_error(res, "malformed workspace name from the template");
        goto done;
    }
    /* The wall limit is the code's: it starts once a worker is ours. */
    run_start_clock(&e.r);
    (void)send_request(&e.r, &e.w.fds[WFD_REQUEST]); /* a failure shows in the status */
    run_supervise(&e.r);
    if (e.r.done_fd < 0)
        e.w.fds[WFD_STATUS] = -1; /* closed by read_status */
    rc = run_finish(&e.r, res);
    /* A tmpfs workspace goes with its mount, detached by the template's
     * sweeper; a plain directory is ours to delete. */
    if (!sbx->workspace_bytes)
        (void)remove_tree_at(sbx->work_fd, e.w.workspace);
done:
    for (int i = 0; i < WFD_COUNT; i++)
        close_fd(&e.w.fds[i]);
    if (a == ADMITTED)
        leave(sbx);
    run_free(&e.r);
    if (rc < 0) {
        sbx_result_free(res);
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "out of memory");
    }
    *out = res;
    return 0;
}

void sbx_result_free(struct sbx_result *res)
{
    if (!res)
        return;
    free(res->stdout_text);
    free(res->stderr_text);
    free(res->reason);
    artifacts_free(res->artifacts, res->n_artifacts);
    free(res);
}
