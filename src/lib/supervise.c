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
/* The longest poll() between two looks at the deadline. */
#define POLL_SLICE_MS 60000

void supervise_init(struct supervision *s, const struct sbx_request *req)
{
    memset(s, 0, sizeof(*s));
    s->req = req;
    s->out_fd = s->err_fd = s->done_fd = s->pidfd = s->ws_fd = -1;
    outbuf_init(&s->out, req->limits.max_output_chars);
    outbuf_init(&s->err, req->limits.max_output_chars);
    tool_chan_init(&s->tools, req);
}

void supervise_start_clock(struct supervision *s)
{
    s->start_ns = now_ns();
    s->deadline_ns = s->start_ns + (uint64_t)(s->req->limits.wall_seconds * 1e9);
}

void supervise_free(struct supervision *s)
{
    close_fd(&s->out_fd);
    close_fd(&s->err_fd);
    close_fd(&s->done_fd);
    close_fd(&s->pidfd);
    close_fd(&s->ws_fd);
    outbuf_free(&s->out);
    outbuf_free(&s->err);
    tool_chan_end(&s->tools);
}

/* Hands the caller the text kept since the last call, if it asked. */
static void deliver(struct supervision *s, int stream, const char *text, size_t len)
{
    size_t *done = &s->delivered[stream - 1];

    if (s->req->on_output && len > *done && text) {
        s->req->on_output(s->req->user, stream, text + *done, len - *done);
        *done = len;
    }
}

void supervise_kill(struct supervision *s)
{
    /* ESRCH: already reaped. Anything else (EPERM: no CAP_KILL over the
     * worker's uid) means the run cannot be stopped: say so now, rather
     * than wait for it to end on its own and call that a result. */
    if (s->pidfd >= 0 && pidfd_send_signal(s->pidfd, SIGKILL, NULL, 0) < 0 && errno != ESRCH &&
        !s->lost) {
        s->lost = true;
        s->lost_reason = errno == EPERM ? "the sandbox may not signal the worker (no CAP_KILL over "
                                          "its uid): the run could not be stopped"
                                        : "the sandbox could not signal the worker";
    }
}

static int poll_timeout_ms(uint64_t until_ns)
{
    uint64_t now = now_ns();

    if (now >= until_ns)
        return 0;
    uint64_t ms = (until_ns - now + 999999) / 1000000;
    return ms > POLL_SLICE_MS ? POLL_SLICE_MS : (int)ms;
}

/* Keeps the deadline: past it, kills the worker once and allows it a grace
 * period for its verdict to arrive. */
void supervise_kill_for_wall(struct supervision *s)
{
    supervise_kill(s);
    s->killed_for_wall = true;
    s->deadline_ns = now_ns() + KILL_GRACE_NS;
}

static void check_deadline(struct supervision *s)
{
    if (!s->killed_for_wall && now_ns() >= s->deadline_ns)
        supervise_kill_for_wall(s);
}

enum stream_state { STREAM_DATA, STREAM_EMPTY, STREAM_END };

/* Reads what one stream (1 stdout, 2 stderr) has now. */
static enum stream_state read_stream(struct supervision *s, int stream)
{
    struct outbuf *ob = stream == 1 ? &s->out : &s->err;
    int fd = stream == 1 ? s->out_fd : s->err_fd;
    char buf[65536];
    ssize_t n = read(fd, buf, sizeof(buf));

    if (n > 0) {
        outbuf_feed(ob, buf, (size_t)n);
        deliver(s, stream, ob->data, ob->len);
        return STREAM_DATA;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return STREAM_EMPTY;
    return STREAM_END;
}

void supervise_run(struct supervision *s)
{
    bool out_open = true, err_open = true;
    int cfd = cancel_fd(s->req->cancel);

    while (!s->have_outcome && !s->lost) {
        short tool_events = tool_chan_events(&s->tools);
        struct pollfd p[6] = {
            {.fd = out_open ? s->out_fd : -1, .events = POLLIN},
            {.fd = err_open ? s->err_fd : -1, .events = POLLIN},
            {.fd = s->done_fd, .events = POLLIN},
            {.fd = s->cancelled ? -1 : cfd, .events = POLLIN},
            {.fd = tool_events ? s->tools.fd : -1, .events = tool_events},
            {.fd = tool_chan_answers_fd(&s->tools), .events = POLLIN},
        };
        check_deadline(s);
        if ((s->killed_for_wall || s->cancelled) && now_ns() >= s->deadline_ns) {
            /* SIGKILL sent and still no verdict: whoever reaps is stuck. */
            s->lost = true;
            s->lost_reason = "no exit status for the worker after SIGKILL";
            break;
        }
        int n = poll(p, 6, poll_timeout_ms(s->deadline_ns));
        if (n < 0 && errno != EINTR)
            break;
        if (n <= 0)
            continue;
        if (p[0].revents)
            out_open = read_stream(s, 1) != STREAM_END;
        if (p[1].revents)
            err_open = read_stream(s, 2) != STREAM_END;
        /* After the output: what the code printed before a call is seen
         * before the call. */
        if (p[4].revents || p[5].revents)
            tool_chan_ready(&s->tools, p[4].revents, p[5].revents != 0);
        if (p[2].revents)
            s->on_done(s);
        if (p[3].revents && !s->cancelled) {
            supervise_kill(s);
            s->cancelled = true;
            if (!s->killed_for_wall)
                s->deadline_ns = now_ns() + KILL_GRACE_NS;
        }
    }
    /* The worker is dead: what it wrote is in the pipes, and no one else
     * holds their write ends. Read to the end without waiting. */
    fcntl(s->out_fd, F_SETFL, O_NONBLOCK);
    fcntl(s->err_fd, F_SETFL, O_NONBLOCK);
    while (out_open && read_stream(s, 1) == STREAM_DATA)
        ;
    while (err_open && read_stream(s, 2) == STREAM_DATA)
        ;
    /* No call of this run can be answered any more. */
    tool_chan_end(&s->tools);
}

/* The first line of what the worker said before user code, for a reason. */
static void first_line(const char *text, char *buf, size_t cap)
{
    size_t n = strcspn(text, "\n");
    fmt(buf, cap, "%.*s", (int)n, text);
}

/* Hands the captured text to |res| (and the rest of it to on_output). */
static int take_texts(struct supervision *s, struct sbx_result *res)
{
    res->stdout_text = outbuf_finish(&s->out, &res->stdout_len, &res->stdout_truncated);
    res->stderr_text = outbuf_finish(&s->err, &res->stderr_len, &res->stderr_truncated);
    /* The line saying how much was cut is part of the text too. */
    deliver(s, 1, res->stdout_text, res->stdout_len);
    deliver(s, 2, res->stderr_text, res->stderr_len);
    return res->stdout_text && res->stderr_text ? 0 : -ENOMEM;
}

int supervise_finish(struct supervision *s, struct sbx_result *res)
{
    char setup[512] = "";
    int rc;

    rc = take_texts(s, res);
    if (rc < 0)
        return rc;
    res->wall_ms = (double)((s->end_ns ? s->end_ns : now_ns()) - s->start_ns) / 1e6;
    if (s->lost)
        return verdict_stopped(res, SBX_SANDBOX_ERROR,
                               s->lost_reason ? s->lost_reason : "the run's verdict was lost");
    res->cpu_ms = (double)(s->outcome.utime_us + s->outcome.stime_us) / 1000.0;
    res->max_rss_kb = (long)s->outcome.maxrss_kb;
    if (!s->outcome.started)
        first_line(res->stderr_text, setup, sizeof(setup));
    struct verdict_input in = {
        .wait_status = s->outcome.wait_status,
        .started = s->outcome.started,
        .cpu_killed = s->outcome.cpu_killed,
        .limit_lost = s->outcome.limit_lost,
        .killed_for_wall = s->killed_for_wall || s->outcome.wall_killed,
        .cancelled = s->cancelled,
        .cpu_ms = res->cpu_ms,
        .limits = &s->req->limits,
        .setup_error = setup,
    };
    rc = verdict_classify(&in, res);
    if (rc < 0 || res->status != SBX_COMPLETED)
        return rc;

    struct artifact_spec spec = {
        .max_bytes = s->req->limits.max_artifact_bytes,
        .max_count = s->req->limits.max_artifacts,
        .max_total = s->req->limits.max_artifacts_total_bytes,
        .inputs = s->req->files,
        .n_inputs = s->req->n_files,
        .only = s->only_artifacts,
        .only_ctx = s->only_ctx,
    };
    /* Read as the run's owner: on a file system of the run's own, with the
     * owner's rights over what it made (a file it made unreadable is still
     * its own); elsewhere with no more than the run had. */
    bool private_fs = artifacts_private_fs(s->ws_fd), switched;
    rc = private_fs ? fsid_enter_owner(s->owner_uid, s->owner_gid, &switched)
                    : fsid_enter(s->owner_uid, s->owner_gid, &switched);
    struct artifact_set set;
    if (rc == 0)
        rc = artifacts_collect(s->ws_fd, &spec, private_fs, &set);
    if (rc == 0) {
        res->artifacts = set.v;
        res->n_artifacts = set.n;
        res->artifacts_dropped = set.dropped;
        res->dropped = set.gone;
        res->n_dropped = set.n_gone;
    }
    if (rc == 0)
        rc = artifacts_take_value(s->ws_fd, s->req->limits.max_output_chars, &res->value,
                                  &res->value_len, &res->value_truncated);
    /* The exit status an uncaught exception gives, which the kernel
     * reported: only then is the worker's report of one taken. */
    if (rc == 0 && res->exit_code == 1)
        rc = artifacts_take_error(s->ws_fd, s->req->limits.max_output_chars, res);
    fsid_leave(switched);
    if (rc == -ENOMEM)
        return rc;
    if (rc < 0)
        return verdict_stopped(res, SBX_SANDBOX_ERROR, "collecting the artifacts failed");
    return 0;
}

int supervise_refuse(struct supervision *s, struct sbx_result *res, enum sbx_status status,
                     const char *reason)
{
    int rc = take_texts(s, res);

    return rc < 0 ? rc : verdict_stopped(res, status, reason);
}
