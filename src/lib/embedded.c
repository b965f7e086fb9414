/*
 * The embedded backend: one run on a worker of the template. Take an idle
 * worker, hand it the request, and let supervise.c read its output and
 * outcome.
 */
#define _GNU_SOURCE
#include "control.h"
#include "sandbox.h"
#include "sbxerr.h"
#include "session.h"
#include "supervise.h"
#include "sysutil.h"
#include "util.h"
#include "verdict.h"

#include <errno.h>
#include <jansson.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A program up to this size goes in one write with the request header: the
 * worker wakes once. */
#define SMALL_CODE_BYTES 16384

/* Reads the template's status message; on end of stream the template is
 * gone. */
static void read_status(struct supervision *sv)
{
    struct wire_status buf, st;
    ssize_t n = read_full(sv->done_fd, &buf, sizeof(buf));

    sv->end_ns = now_ns();
    if (n > 0 && wire_decode_status(&buf, (size_t)n, &st) == 0) {
        sv->outcome = (struct run_outcome){
            .wait_status = st.wait_status,
            .started = st.started != 0,
            .cpu_killed = (st.flags & WIRE_STATUS_CPU_KILLED) != 0,
            .limit_lost = (st.flags & WIRE_STATUS_LIMIT_LOST) != 0,
            .wall_killed = (st.flags & WIRE_STATUS_WALL_KILLED) != 0,
            .utime_us = st.utime_us,
            .stime_us = st.stime_us,
            .maxrss_kb = st.maxrss_kb,
            .flags = st.flags,
            .cell_status = st.cell_status,
        };
        /* A reason of a result: a string, valid UTF-8, whatever came. */
        st.fds_why[sizeof(st.fds_why) - 1] = '\0';
        fmt(sv->outcome.fds_why, sizeof(sv->outcome.fds_why), "%s", st.fds_why);
        utf8_terminate(sv->outcome.fds_why);
        sv->have_outcome = true;
    } else {
        sv->lost = true;
        sv->lost_reason = "the template process ended unexpectedly";
        supervise_kill(sv);
    }
    close_fd(&sv->done_fd);
}

struct segment {
    const void *p;
    size_t len;
};

static int send_segment(struct supervision *sv, int fd, struct segment s)
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
        if (now >= sv->deadline_ns) {
            supervise_kill_for_wall(sv);
            return -ETIMEDOUT;
        }
        int ms = (int)((sv->deadline_ns - now) / 1000000) + 1;
        if (poll(&pfd, 1, ms > 1000 ? 1000 : ms) < 0 && errno != EINTR)
            return -errno;
    }
    return 0;
}

/* What the worker's pysbx module is told: {"max_bytes": N, "tools":
 * [{"name", "description"}, ...]}. */
static char *tools_spec(const struct sbx_request *req)
{
    json_t *list = json_array();
    for (size_t i = 0; list && i < req->n_tools; i++)
        json_array_append_new(
            list, json_pack("{s:s, s:s}", "name", req->tools[i].name, "description",
                            req->tools[i].description ? req->tools[i].description : ""));
    json_t *o =
        list ? json_pack("{s:I, s:o}", "max_bytes", (json_int_t)req->max_tool_bytes, "tools", list)
             : NULL;
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return text && strlen(text) <= WIRE_TOOLS_MAX ? text : (free(text), NULL);
}

static int send_request(struct supervision *sv, int *fdp)
{
    const struct sbx_request *req = sv->req;
    int fd = *fdp;
    struct wire_req h = {
        .magic = WIRE_REQ_MAGIC,
        .version = WIRE_VERSION,
        .cpu_ms = (uint64_t)(req->limits.cpu_seconds * 1000.0 + 0.5),
        .wall_ms = (uint64_t)(req->limits.wall_seconds * 1000.0 + 0.5),
        .memory_bytes = req->limits.memory_bytes,
        .code_len = req->code_len,
        .n_files = (uint32_t)req->n_files,
        .n_args = (uint32_t)req->argc,
        .max_output_chars = req->limits.max_output_chars,
        .stdin_len = req->stdin_len,
        .filename_len = req->filename ? (uint32_t)strlen(req->filename) : 0,
    };
    char *tools = NULL;
    int rc;

    if (req->n_tools) {
        if (!(tools = tools_spec(req))) {
            close_fd(fdp);
            return -ENOMEM;
        }
        h.tools_len = (uint32_t)strlen(tools);
    }
    if (h.cpu_ms == 0)
        h.cpu_ms = 1;
    /* Header and a small program in one write: the worker wakes once. */
    if (req->code_len <= SMALL_CODE_BYTES) {
        char first[sizeof(h) + SMALL_CODE_BYTES];
        memcpy(first, &h, sizeof(h));
        memcpy(first + sizeof(h), req->code, req->code_len);
        rc = send_segment(sv, fd, (struct segment){first, sizeof(h) + req->code_len});
    } else {
        rc = send_segment(sv, fd, (struct segment){&h, sizeof(h)});
        if (rc == 0)
            rc = send_segment(sv, fd, (struct segment){req->code, req->code_len});
    }
    for (size_t i = 0; rc == 0 && i < req->n_files; i++) {
        const struct sbx_file *f = &req->files[i];
        struct wire_file fh = {.name_len = (uint32_t)strlen(f->name), .data_len = f->len};
        rc = send_segment(sv, fd, (struct segment){&fh, sizeof(fh)});
        if (rc == 0)
            rc = send_segment(sv, fd, (struct segment){f->name, fh.name_len});
        if (rc == 0)
            rc = send_segment(sv, fd, (struct segment){f->data, f->len});
    }
    for (size_t i = 0; rc == 0 && i < req->argc; i++) {
        uint32_t len = (uint32_t)strlen(req->argv[i]);
        rc = send_segment(sv, fd, (struct segment){&len, sizeof(len)});
        if (rc == 0)
            rc = send_segment(sv, fd, (struct segment){req->argv[i], len});
    }
    if (rc == 0 && h.filename_len)
        rc = send_segment(sv, fd, (struct segment){req->filename, h.filename_len});
    if (rc == 0 && h.tools_len)
        rc = send_segment(sv, fd, (struct segment){tools, h.tools_len});
    if (rc == 0 && req->stdin_len)
        rc = send_segment(sv, fd, (struct segment){req->stdin_data, req->stdin_len});
    free(tools);
    /* With host tools the socket is their channel (tools.h says what the
     * code can send on it). Else closing our end also discards anything the
     * code might send back on it, descriptors included, so nothing of the
     * worker outlives it here. */
    if (rc == 0 && h.tools_len) {
        fcntl(fd, F_SETFL, O_NONBLOCK);
        *fdp = -1;
        return tool_chan_start(&sv->tools, fd);
    }
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

int embedded_check_fits(const struct sbx *sbx, const struct sbx_request *req, struct sbx_error *err)
{
    uint64_t in = 0;

    if (!sbx->workspace_bytes)
        return 0;
    for (size_t i = 0; i < req->n_files; i++)
        in += req->files[i].len;
    if (in > sbx->workspace_bytes)
        return sbx_fail(err, SBX_ERR_TOO_LARGE, -E2BIG,
                        "input files (%llu bytes) do not fit the workspace (%llu bytes)",
                        (unsigned long long)in, (unsigned long long)sbx->workspace_bytes);
    return 0;
}

/* Empties the workspace as its worker's user (so that nothing, not even a
 * rename racing the walk, can make us touch what that user could not),
 * then removes the empty directory from our work directory. */
static void remove_workspace(struct sbx *sbx, const struct taken_worker *w)
{
    bool switched;

    if (fsid_enter(w->uid, w->gid, &switched) == 0)
        (void)empty_tree_at(sbx->work.fd, w->workspace);
    fsid_leave(switched);
    /* What its user could not remove stays until the sandbox closes. */
    (void)unlinkat(sbx->work.fd, w->workspace, AT_REMOVEDIR);
}

/* Runs |req| on a worker taken from the pool. Returns 0 or -ENOMEM; every
 * other failure is a result, but for the sandbox being down, closing, or no
 * worker within the queue timeout: then *refused is the negative errno to
 * return, with |err| filled. */
static int run_on_worker(struct sbx *sbx, struct sbx_session *sess, struct supervision *sv,
                         struct sbx_result *res, int *refused, struct sbx_error *err)
{
    const struct sbx_request *req = sv->req;
    uint64_t deadline = req->queue_timeout_seconds > 0
                            ? now_ns() + (uint64_t)(req->queue_timeout_seconds * 1e9)
                            : UINT64_MAX;
    struct taken_worker w;
    char why[WIRE_TEXT_MAX];
    int saved = -1;
    int req_fd;
    int rc;
    /* A run whose template died under it before anything of it reached the
     * caller is run again on the next template, found within the time the
     * run had (its code's effects died with the first worker: the
     * workspace, the processes). Once. */
    uint64_t retry_by = now_ns() + (uint64_t)(req->limits.wall_seconds * 1e9);
    bool retried = false;

again:
    /* A session's cell is a fork of its state, there as soon as the
     * state forks: it waits for no queue, only (at most) its wall limit. */
    if (sess)
        rc = session_take_cell(sess, req, now_ns() + (uint64_t)(req->limits.wall_seconds * 1e9), &w,
                               &saved, why, sizeof(why));
    else
        rc = control_take_worker(sbx, req->cancel,
                                 retried && retry_by < deadline ? retry_by : deadline, &w, why,
                                 sizeof(why));
    if (rc == -ENOLINK) {
        *refused = sbx_fail(err, SBX_ERR_SESSION_LOST, rc, "%s", why);
        return 0;
    }
    if (rc == -ECANCELED)
        return supervise_refuse(sv, res, SBX_CANCELLED, why);
    if (rc == -EHOSTDOWN || rc == -ESHUTDOWN || rc == -ETIMEDOUT) {
        *refused =
            sbx_fail(err, rc == -ETIMEDOUT ? SBX_ERR_BUSY : SBX_ERR_UNAVAILABLE, rc, "%s", why);
        return 0;
    }
    if (rc < 0)
        return supervise_refuse(sv, res, SBX_SANDBOX_ERROR, why);
    /* Each descriptor to one owner: the supervision closes its five; the
     * request socket is closed once the request is sent. */
    req_fd = w.fds[WFD_REQUEST];
    sv->out_fd = w.fds[WFD_STDOUT];
    sv->err_fd = w.fds[WFD_STDERR];
    sv->done_fd = w.fds[WFD_STATUS];
    sv->pidfd = w.fds[WFD_PIDFD];
    sv->ws_fd = w.fds[WFD_WORKSPACE];
    sv->owner_uid = w.uid;
    sv->owner_gid = w.gid;
    sv->on_done = read_status;
    if (!workspace_name_ok(w.workspace)) {
        close_fd(&req_fd);
        close_fd(&saved);
        supervise_kill(sv);
        return supervise_refuse(sv, res, SBX_SANDBOX_ERROR,
                                "malformed workspace name from the template");
    }
    /* The wall limit is the code's: it starts once a worker is ours. */
    supervise_start_clock(sv);
    (void)send_request(sv, &req_fd); /* a failure shows in the outcome */
    supervise_run(sv);
    if (!sess && !retried && sv->lost && !sv->cancelled && !sv->killed_for_wall &&
        !sv->delivered[0] && !sv->delivered[1] && now_ns() < retry_by &&
        !__atomic_load_n(&sbx->closing, __ATOMIC_ACQUIRE)) {
        if (!sbx->workspace_bytes)
            remove_workspace(sbx, &w);
        supervise_free(sv);
        supervise_init(sv, req);
        control_template_lost(sbx, w.generation);
        retried = true;
        goto again;
    }
    if (sess)
        session_cell_ended(sess, sv, saved);
    rc = supervise_finish(sv, res);
    if (sess) {
        if (rc == 0)
            rc = session_cell_settle(sess, sv, saved, res);
        close_fd(&saved);
        if (rc == -ENOLINK) {
            session_lost_why(sess, why, sizeof(why));
            *refused = sbx_fail(err, SBX_ERR_SESSION_LOST, rc, "%s", why);
            rc = 0;
        }
    }
    /* Its template ended under it because the sandbox is closing. */
    if (rc == 0 && res->status == SBX_SANDBOX_ERROR &&
        __atomic_load_n(&sbx->closing, __ATOMIC_ACQUIRE))
        rc = verdict_stopped(res, SBX_CANCELLED, "the sandbox was closed");
    /* A tmpfs workspace goes with its mount, detached by the template's
     * sweeper; a plain directory is ours to delete. */
    if (!sbx->workspace_bytes)
        remove_workspace(sbx, &w);
    return rc;
}

int sbx_run(struct sbx *sbx, const struct sbx_request *req, struct sbx_result **out,
            struct sbx_error *err)
{
    int rc;

    *out = NULL;
    if (!sbx)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "no sandbox");
    rc = sbx_request_check(req, err);
    if (rc == 0 && req->n_tools && (!req->on_tool_call || !req->tool_answers))
        rc = sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                      "a request with tools needs on_tool_call and tool_answers");
    if (rc == 0 && req->n_tools && tool_answers_busy(req->tool_answers))
        rc = sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EBUSY,
                      "the request's tool_answers belong to a run in flight");
    if (rc == 0)
        rc = embedded_check_fits(sbx, req, err);
    if (rc < 0)
        return rc;
    /* A single-run sandbox makes one worker and no other: a second run
     * would wait for one that never comes. */
    if (sbx->cfg.single_run && atomic_exchange(&sbx->single_run_used, true))
        return sbx_fail(err, SBX_ERR_BUSY, -EBUSY,
                        "this sandbox was opened for a single run (single_run), which it has had");
    return embedded_run(sbx, NULL, req, out, err);
}

int embedded_run(struct sbx *sbx, struct sbx_session *sess, const struct sbx_request *req,
                 struct sbx_result **out, struct sbx_error *err)
{
    struct supervision sv;
    struct sbx_result *res;
    enum admitted a;
    int refused = 0;
    int rc;

    *out = NULL;
    a = admission_enter(&sbx->admission, req, err);
    if (a == REFUSED)
        return err && err->code == SBX_ERR_UNAVAILABLE ? -ESHUTDOWN : -EBUSY;
    res = calloc(1, sizeof(*res));
    if (!res) {
        if (a == ADMITTED)
            admission_leave(&sbx->admission);
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    }
    res->exit_code = -1;
    supervise_init(&sv, req);
    if (a == CANCELLED || sbx_cancel_fired(req->cancel))
        rc = supervise_refuse(&sv, res, SBX_CANCELLED, "cancelled before it started");
    else
        rc = run_on_worker(sbx, sess, &sv, res, &refused, err);
    if (a == ADMITTED)
        admission_leave(&sbx->admission);
    supervise_free(&sv);
    if (refused) {
        sbx_result_free(res);
        return refused;
    }
    if (rc < 0) {
        sbx_result_free(res);
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "out of memory");
    }
    *out = res;
    return 0;
}
