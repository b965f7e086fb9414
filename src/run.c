/*
 * One run, on the supervisor's side: hand the request to an idle worker,
 * read its output as it comes while keeping the deadline, take the verdict
 * from the template's status message, collect the artifacts, delete the
 * workspace.
 */
#define _GNU_SOURCE
#include "artifacts.h"
#include "cancel.h"
#include "outbuf.h"
#include "sbx_internal.h"
#include "sysutil.h"
#include "util.h"
#include "verdict.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* How long to wait for the template's status after killing a worker. */
#define KILL_GRACE_NS (5ULL * 1000000000ULL)

struct run {
    struct taken_worker w;
    const struct sbx_request *req;
    uint64_t start_ns;
    uint64_t deadline_ns;
    bool killed_for_wall;
    bool cancelled;
    bool have_status;
    bool template_lost;
    struct wire_status status;
    uint64_t end_ns;
    struct outbuf out, err;
    size_t delivered[2]; /* bytes of out/err text handed to on_output */
};

/* Hands the caller the text kept since the last call, if it asked. */
static void deliver(struct run *r, int stream, const char *text, size_t len)
{
    size_t *done = &r->delivered[stream - 1];

    if (r->req->on_output && len > *done && text) {
        r->req->on_output(r->req->user, stream, text + *done, len - *done);
        *done = len;
    }
}

static void kill_worker(struct run *r)
{
    if (r->w.fds[WFD_PIDFD] >= 0)
        (void)pidfd_send_signal(r->w.fds[WFD_PIDFD], SIGKILL, NULL, 0);
}

static int poll_timeout_ms(uint64_t until_ns)
{
    uint64_t now = now_ns();

    if (now >= until_ns)
        return 0;
    uint64_t ms = (until_ns - now + 999999) / 1000000;
    return ms > 60000 ? 60000 : (int)ms;
}

/* Keeps the deadline; returns true once the worker was killed for it. */
static void check_deadline(struct run *r)
{
    if (!r->killed_for_wall && now_ns() >= r->deadline_ns) {
        kill_worker(r);
        r->killed_for_wall = true;
        r->deadline_ns = now_ns() + KILL_GRACE_NS;
    }
}

/* Reads the status message; on end of stream the template is gone. */
static void read_status(struct run *r)
{
    ssize_t n = read_full(r->w.fds[WFD_STATUS], &r->status, sizeof(r->status));

    r->end_ns = now_ns();
    if (n == (ssize_t)sizeof(r->status) && r->status.magic == WIRE_STATUS_MAGIC)
        r->have_status = true;
    else {
        r->template_lost = true;
        kill_worker(r);
    }
    close_fd(&r->w.fds[WFD_STATUS]);
}

enum stream_state { STREAM_DATA, STREAM_EMPTY, STREAM_END };

/* Reads what one stream (1 stdout, 2 stderr) has now. */
static enum stream_state read_stream(struct run *r, int stream)
{
    struct outbuf *ob = stream == 1 ? &r->out : &r->err;
    int fd = r->w.fds[stream == 1 ? WFD_STDOUT : WFD_STDERR];
    char buf[65536];
    ssize_t n = read(fd, buf, sizeof(buf));

    if (n > 0) {
        outbuf_feed(ob, buf, (size_t)n);
        deliver(r, stream, ob->data, ob->len);
        return STREAM_DATA;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return STREAM_EMPTY;
    return STREAM_END;
}

struct segment {
    const void *p;
    size_t len;
};

static int send_segment(struct run *r, struct segment s)
{
    int fd = r->w.fds[WFD_REQUEST];
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
        check_deadline(r);
        if (r->killed_for_wall)
            return -ETIMEDOUT;
        if (poll(&pfd, 1, poll_timeout_ms(r->deadline_ns)) < 0 && errno != EINTR)
            return -errno;
    }
    return 0;
}

static int send_request(struct run *r)
{
    const struct sbx_request *req = r->req;
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
        rc = send_segment(r, (struct segment){first, sizeof(h) + req->code_len});
    } else {
        rc = send_segment(r, (struct segment){&h, sizeof(h)});
        if (rc == 0)
            rc = send_segment(r, (struct segment){req->code, req->code_len});
    }
    for (size_t i = 0; rc == 0 && i < req->n_files; i++) {
        const struct sbx_file *f = &req->files[i];
        struct wire_file fh = {.name_len = (uint32_t)strlen(f->name), .data_len = f->len};
        rc = send_segment(r, (struct segment){&fh, sizeof(fh)});
        if (rc == 0)
            rc = send_segment(r, (struct segment){f->name, fh.name_len});
        if (rc == 0)
            rc = send_segment(r, (struct segment){f->data, f->len});
    }
    /* Closing our end also discards anything the code might send back on
     * it, descriptors included, so nothing of the worker outlives it here. */
    close_fd(&r->w.fds[WFD_REQUEST]);
    return rc;
}

static void supervise(struct run *r)
{
    bool out_open = true, err_open = true;
    int cfd = cancel_fd(r->req->cancel);

    while (!r->have_status && !r->template_lost) {
        struct pollfd p[4] = {
            {.fd = out_open ? r->w.fds[WFD_STDOUT] : -1, .events = POLLIN},
            {.fd = err_open ? r->w.fds[WFD_STDERR] : -1, .events = POLLIN},
            {.fd = r->w.fds[WFD_STATUS], .events = POLLIN},
            {.fd = r->cancelled ? -1 : cfd, .events = POLLIN},
        };
        check_deadline(r);
        if ((r->killed_for_wall || r->cancelled) && now_ns() >= r->deadline_ns) {
            /* SIGKILL sent and still no status: the template is stuck. */
            r->template_lost = true;
            break;
        }
        int n = poll(p, 4, poll_timeout_ms(r->deadline_ns));
        if (n < 0 && errno != EINTR)
            break;
        if (n <= 0)
            continue;
        if (p[0].revents)
            out_open = read_stream(r, 1) != STREAM_END;
        if (p[1].revents)
            err_open = read_stream(r, 2) != STREAM_END;
        if (p[2].revents)
            read_status(r);
        if (p[3].revents && !r->cancelled) {
            kill_worker(r);
            r->cancelled = true;
            if (!r->killed_for_wall)
                r->deadline_ns = now_ns() + KILL_GRACE_NS;
        }
    }
    /* The worker is dead: what it wrote is in the pipes, and no one else
     * holds their write ends. Read to the end without waiting. */
    fcntl(r->w.fds[WFD_STDOUT], F_SETFL, O_NONBLOCK);
    fcntl(r->w.fds[WFD_STDERR], F_SETFL, O_NONBLOCK);
    while (out_open && read_stream(r, 1) == STREAM_DATA)
        ;
    while (err_open && read_stream(r, 2) == STREAM_DATA)
        ;
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

/* The first line of what the worker said before user code, for a reason. */
static void first_line(const char *text, char *buf, size_t cap)
{
    size_t n = strcspn(text, "\n");
    fmt(buf, cap, "%.*s", (int)n, text);
}

static int take_texts(struct run *r, struct sbx_result *res)
{
    res->stdout_text = outbuf_finish(&r->out, &res->stdout_len, &res->stdout_truncated);
    res->stderr_text = outbuf_finish(&r->err, &res->stderr_len, &res->stderr_truncated);
    /* The line saying how much was cut is part of the text too. */
    deliver(r, 1, res->stdout_text, res->stdout_len);
    deliver(r, 2, res->stderr_text, res->stderr_len);
    return res->stdout_text && res->stderr_text ? 0 : -ENOMEM;
}

static int finish(struct run *r, struct sbx_result *res)
{
    char setup[512] = "";
    int rc;

    rc = take_texts(r, res);
    if (rc < 0)
        return rc;
    res->wall_ms = (double)((r->end_ns ? r->end_ns : now_ns()) - r->start_ns) / 1e6;
    if (r->template_lost)
        return verdict_sandbox_error(res, r->killed_for_wall
                                              ? "no exit status for the worker after SIGKILL"
                                              : "the template process ended unexpectedly");
    res->cpu_ms = (double)(r->status.utime_us + r->status.stime_us) / 1000.0;
    res->max_rss_kb = (long)r->status.maxrss_kb;
    if (!r->status.started)
        first_line(res->stderr_text, setup, sizeof(setup));
    struct verdict_input in = {
        .wait_status = r->status.wait_status,
        .started = r->status.started != 0,
        .killed_for_wall = r->killed_for_wall,
        .cancelled = r->cancelled,
        .cpu_ms = res->cpu_ms,
        .limits = &r->req->limits,
        .setup_error = setup,
    };
    rc = verdict_classify(&in, res);
    if (rc < 0 || res->status != SBX_COMPLETED)
        return rc;

    struct artifact_spec spec = {
        .max_bytes = r->req->limits.max_artifact_bytes,
        .max_count = r->req->limits.max_artifacts,
        .inputs = r->req->files,
        .n_inputs = r->req->n_files,
    };
    rc = artifacts_collect(r->w.fds[WFD_WORKSPACE], &spec, &res->artifacts, &res->n_artifacts,
                           &res->artifacts_dropped);
    if (rc == -ENOMEM)
        return rc;
    if (rc < 0)
        return verdict_sandbox_error(res, "collecting the artifacts failed");
    return 0;
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
    struct run r;
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

    memset(&r, 0, sizeof(r));
    r.req = req;
    for (int i = 0; i < WFD_COUNT; i++)
        r.w.fds[i] = -1;
    outbuf_init(&r.out, req->limits.max_output_chars);
    outbuf_init(&r.err, req->limits.max_output_chars);
    if (a == CANCELLED || sbx_cancel_fired(req->cancel)) {
        rc = take_texts(&r, res);
        if (rc == 0)
            rc = verdict_cancelled(res, "cancelled before it started");
        goto done;
    }
    if (sbx_take_worker(sbx, &r.w, why, sizeof(why)) < 0) {
        rc = take_texts(&r, res);
        if (rc == 0)
            rc = verdict_sandbox_error(res, why);
        goto done;
    }
    if (!workspace_name_ok(r.w.workspace)) {
        kill_worker(&r);
        rc = take_texts(&r, res);
        if (rc == 0)
            rc = verdict_sandbox_error(res, "malformed workspace name from the template");
        goto done;
    }
    /* The wall limit is the code's: it starts once a worker is ours. */
    r.start_ns = now_ns();
    r.deadline_ns = r.start_ns + (uint64_t)(req->limits.wall_seconds * 1e9);
    (void)send_request(&r); /* a failure shows in the worker's status */
    supervise(&r);
    rc = finish(&r, res);
    /* A tmpfs workspace goes with its mount, detached by the template's
     * sweeper; a plain directory is ours to delete. */
    if (!sbx->workspace_bytes)
        (void)remove_tree_at(sbx->work_fd, r.w.workspace);
done:
    for (int i = 0; i < WFD_COUNT; i++)
        close_fd(&r.w.fds[i]);
    if (a == ADMITTED)
        leave(sbx);
    outbuf_free(&r.out);
    outbuf_free(&r.err);
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
