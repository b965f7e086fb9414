#define _GNU_SOURCE
#include "supervise.h"

#include "artifacts.h"
#include "cancel.h"
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
#include <unistd.h>

/* How long to wait for a verdict after killing. */
#define KILL_GRACE_NS (5ULL * 1000000000ULL)

void run_init(struct run *r, const struct sbx_request *req)
{
    memset(r, 0, sizeof(*r));
    r->req = req;
    r->out_fd = r->err_fd = r->done_fd = r->pidfd = r->ws_fd = -1;
    outbuf_init(&r->out, req->limits.max_output_chars);
    outbuf_init(&r->err, req->limits.max_output_chars);
}

void run_start_clock(struct run *r)
{
    r->start_ns = now_ns();
    r->deadline_ns = r->start_ns + (uint64_t)(r->req->limits.wall_seconds * 1e9);
}

void run_free(struct run *r)
{
    outbuf_free(&r->out);
    outbuf_free(&r->err);
}

/* Hands the caller the text kept since the last call, if it asked. */
static void deliver(struct run *r, int stream, const char *text, size_t len)
{
    size_t *done = &r->delivered[stream - 1];

    if (r->req->on_output && len > *done && text) {
        r->req->on_output(r->req->user, stream, text + *done, len - *done);
        *done = len;
    }
}

void run_kill(struct run *r)
{
    if (r->pidfd >= 0)
        (void)pidfd_send_signal(r->pidfd, SIGKILL, NULL, 0);
}

static int poll_timeout_ms(uint64_t until_ns)
{
    uint64_t now = now_ns();

    if (now >= until_ns)
        return 0;
    uint64_t ms = (until_ns - now + 999999) / 1000000;
    return ms > 60000 ? 60000 : (int)ms;
}

/* Keeps the deadline: past it, kills the worker once and allows it a grace
 * period for its verdict to arrive. */
static void check_deadline(struct run *r)
{
    if (!r->killed_for_wall && now_ns() >= r->deadline_ns) {
        run_kill(r);
        r->killed_for_wall = true;
        r->deadline_ns = now_ns() + KILL_GRACE_NS;
    }
}

enum stream_state { STREAM_DATA, STREAM_EMPTY, STREAM_END };

/* Reads what one stream (1 stdout, 2 stderr) has now. */
static enum stream_state read_stream(struct run *r, int stream)
{
    struct outbuf *ob = stream == 1 ? &r->out : &r->err;
    int fd = stream == 1 ? r->out_fd : r->err_fd;
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

void run_supervise(struct run *r)
{
    bool out_open = true, err_open = true;
    int cfd = cancel_fd(r->req->cancel);

    while (!r->have_status && !r->lost) {
        struct pollfd p[4] = {
            {.fd = out_open ? r->out_fd : -1, .events = POLLIN},
            {.fd = err_open ? r->err_fd : -1, .events = POLLIN},
            {.fd = r->done_fd, .events = POLLIN},
            {.fd = r->cancelled ? -1 : cfd, .events = POLLIN},
        };
        check_deadline(r);
        if ((r->killed_for_wall || r->cancelled) && now_ns() >= r->deadline_ns) {
            /* SIGKILL sent and still no verdict: whoever reaps is stuck. */
            r->lost = true;
            r->lost_reason = "no exit status for the worker after SIGKILL";
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
            r->on_done(r);
        if (p[3].revents && !r->cancelled) {
            run_kill(r);
            r->cancelled = true;
            if (!r->killed_for_wall)
                r->deadline_ns = now_ns() + KILL_GRACE_NS;
        }
    }
    /* The worker is dead: what it wrote is in the pipes, and no one else
     * holds their write ends. Read to the end without waiting. */
    fcntl(r->out_fd, F_SETFL, O_NONBLOCK);
    fcntl(r->err_fd, F_SETFL, O_NONBLOCK);
    while (out_open && read_stream(r, 1) == STREAM_DATA)
        ;
    while (err_open && read_stream(r, 2) == STREAM_DATA)
        ;
}

/* The first line of what the worker said before user code, for a reason. */
static void first_line(const char *text, char *buf, size_t cap)
{
    size_t n = strcspn(text, "\n");
    fmt(buf, cap, "%.*s", (int)n, text);
}

int run_take_texts(struct run *r, struct sbx_result *res)
{
    res->stdout_text = outbuf_finish(&r->out, &res->stdout_len, &res->stdout_truncated);
    res->stderr_text = outbuf_finish(&r->err, &res->stderr_len, &res->stderr_truncated);
    /* The line saying how much was cut is part of the text too. */
    deliver(r, 1, res->stdout_text, res->stdout_len);
    deliver(r, 2, res->stderr_text, res->stderr_len);
    return res->stdout_text && res->stderr_text ? 0 : -ENOMEM;
}

int run_finish(struct run *r, struct sbx_result *res)
{
    char setup[512] = "";
    int rc;

    rc = run_take_texts(r, res);
    if (rc < 0)
        return rc;
    res->wall_ms = (double)((r->end_ns ? r->end_ns : now_ns()) - r->start_ns) / 1e6;
    if (r->lost)
        return verdict_sandbox_error(res, r->lost_reason ? r->lost_reason
                                                         : "the run's verdict was lost");
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
    rc = artifacts_collect(r->ws_fd, &spec, &res->artifacts, &res->n_artifacts,
                           &res->artifacts_dropped);
    if (rc == -ENOMEM)
        return rc;
    if (rc < 0)
        return verdict_sandbox_error(res, "collecting the artifacts failed");
    return 0;
}

