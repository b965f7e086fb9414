/*
 * Sessions, on the supervisor's side (see pysbx.h and session.h). A session
 * is a channel to the template, which keeps its processes, and the index of
 * its files. Calls on one session are taken one at a time.
 */
#define _GNU_SOURCE
#include "session.h"

#include "sandbox.h"
#include "sbxerr.h"
#include "sysutil.h"
#include "util.h"
#include "wssync.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* Templates tried for a session whose template died as it was opened. */
#define SESSION_OPEN_ATTEMPTS 3
/* How long a session's first process may take to get ready. */
#define SESSION_OPEN_TIMEOUT_NS (30ULL * 1000000000ULL)
/* A caller waiting for another's cell looks at its token this often. */
#define SESSION_WAIT_SLICE_MS 20
/* How long sbx_session_close waits for the template to say it is gone. */
#define SESSION_CLOSE_WAIT_NS (2ULL * 1000000000ULL)

struct sbx_session {
    struct sbx *sbx;
    pthread_mutex_t lock;
    int chan;           /* to the template; -1 once lost */
    int template_pidfd; /* the template this session lives in */
    enum sbx_rollback rollback;
    uint64_t cells, max_cells;
    uint64_t memory; /* every cell's memory limit: the session's */
    uint64_t id;     /* the template's name for it (a branch's origin is named so) */
    uint64_t idle_ms, lifetime_ms;
    uid_t uid;
    gid_t gid;
    struct ws_index index;     /* the workspace as of the last cell */
    struct ws_changes changes; /* what the cell running changed */
    bool changes_known;
    /* The files the state holds open (kept files), as the cell out came
     * with them (O_PATH): a rollback puts them back in their inodes. */
    int kept[WIRE_HELD_MAX];
    unsigned n_kept;
    char unknown_why[160];    /* why they are not known */
    char lost[WIRE_TEXT_MAX]; /* why it is gone, once it is */
};

void sbx_session_limits_init(struct sbx_session_limits *l)
{
    memset(l, 0, sizeof(*l));
    l->idle_seconds = SBX_DEFAULT_SESSION_IDLE_SECONDS;
    l->lifetime_seconds = SBX_DEFAULT_SESSION_LIFETIME_SECONDS;
    l->max_cells = SBX_DEFAULT_SESSION_MAX_CELLS;
}

static const char *const rollback_names[] = {
    [SBX_ROLLBACK_ON_ERROR] = "on_error",
    [SBX_ROLLBACK_ON_STOP] = "on_stop",
    [SBX_ROLLBACK_NEVER] = "never",
};

const char *sbx_rollback_name(enum sbx_rollback r)
{
    return (unsigned)r < ARRAY_SIZE(rollback_names) ? rollback_names[r] : NULL;
}

int sbx_rollback_from_name(const char *name, enum sbx_rollback *out)
{
    for (unsigned i = 0; name && i < ARRAY_SIZE(rollback_names); i++)
        if (strcmp(name, rollback_names[i]) == 0) {
            *out = (enum sbx_rollback)i;
            return 0;
        }
    return -EINVAL;
}

static bool seconds_ok(double s)
{
    return s > 0 && s <= SBX_MAX_SECONDS;
}

/* The session is gone for good: say why once, and let the template know. */
static void lose(struct sbx_session *s, const char *why)
{
    if (s->lost[0])
        return;
    fmt(s->lost, sizeof(s->lost), "%s", why && *why ? why : "the session ended");
    /* The template ends it when it sees our end (sbx_session_close waits
     * for the rest). */
    (void)shutdown(s->chan, SHUT_WR);
}

/* Waits for one message on the channel until |deadline|, also watching the
 * template's end. Returns its length, 0 when the session or its template
 * ended, -ETIMEDOUT, or -errno. */
/* One message of the session's channel (wire_recv). A template that closes
 * the channel with a request of ours unread makes the kernel report
 * ECONNRESET once, ahead of what it sent before closing (its ENDED, say):
 * that is read on. */
static ssize_t chan_recv(struct sbx_session *s, void *buf, size_t cap, int *fds, int maxfds,
                         int *nfds)
{
    ssize_t n = wire_recv(s->chan, buf, cap, fds, maxfds, nfds);

    return n == -ECONNRESET ? wire_recv(s->chan, buf, cap, fds, maxfds, nfds) : n;
}

static ssize_t await(struct sbx_session *s, void *buf, size_t cap, int *fds, int maxfds, int *nfds,
                     uint64_t deadline)
{
    for (;;) {
        ssize_t n = chan_recv(s, buf, cap, fds, maxfds, nfds);
        if (n != -EAGAIN && n != -EINTR)
            return n;
        uint64_t now = now_ns();
        if (now >= deadline)
            return -ETIMEDOUT;
        struct pollfd p[2] = {{.fd = s->chan, .events = POLLIN},
                              {.fd = s->template_pidfd, .events = POLLIN}};
        uint64_t ms = (deadline - now + 999999) / 1000000;
        if (poll(p, 2, ms > 1000 ? 1000 : (int)ms) > 0 && p[1].revents && !p[0].revents)
            return 0;
    }
}

static int start(struct sbx *sbx, const struct wire_session_open *m, uint64_t max_cells, int *fds,
                 int want, int image_fd, struct wire_session *ready, struct sbx_session **out,
                 struct sbx_error *err);
static void look_for_end(struct sbx_session *s);
static bool ended(struct sbx_session *s, struct wire_fail *m, ssize_t n);

int sbx_session_open(struct sbx *sbx, const struct sbx_session_limits *given,
                     struct sbx_session **out, struct sbx_error *err)
{
    struct sbx_session_limits l;
    struct sbx_session *s = NULL;

    *out = NULL;
    if (!sbx)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "no sandbox");
    if (given)
        l = *given;
    else
        sbx_session_limits_init(&l);
    if (!seconds_ok(l.idle_seconds) || !seconds_ok(l.lifetime_seconds) || l.max_cells < 1 ||
        (l.memory_bytes &&
         (l.memory_bytes < SBX_MIN_MEMORY_BYTES || l.memory_bytes > SBX_MAX_MEMORY_BYTES)))
        return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL,
                        "session limits: idle and lifetime must be in (0, %g] s, max_cells at "
                        "least 1, memory 0 or in [%llu, %llu] bytes",
                        SBX_MAX_SECONDS, (unsigned long long)SBX_MIN_MEMORY_BYTES,
                        (unsigned long long)SBX_MAX_MEMORY_BYTES);
    struct wire_session_open m = {
        .hdr = {WIRE_SESSION_OPEN, WIRE_VERSION},
        .idle_ms = (uint64_t)(l.idle_seconds * 1000.0 + 0.5),
        .lifetime_ms = (uint64_t)(l.lifetime_seconds * 1000.0 + 0.5),
        .memory_bytes = l.memory_bytes ? l.memory_bytes : SBX_DEFAULT_MEMORY_BYTES,
    };
    struct wire_session ready;
    int rc = start(sbx, &m, l.max_cells, NULL, 0, -1, &ready, &s, err);
    if (rc == 0) {
        clock_gettime(CLOCK_REALTIME, &s->index.taken); /* an empty workspace */
        *out = s;
    }
    return rc;
}

static void discard(struct sbx_session *s)
{
    close_fd(&s->chan);
    close_fd(&s->template_pidfd);
    ws_index_free(&s->index);
    pthread_mutex_destroy(&s->lock);
    atomic_fetch_sub(&s->sbx->sessions, 1);
    free(s);
}

/* A session's place among max_sessions and its channel, asked for with
 * |m|: 0, *out and the template's word (*ready) once it says it is ready
 * (with |want| descriptors, into |fds|), or -errno with |err|. A restored
 * session's image (|image_fd|) goes to the template as soon as it has the
 * channel. */
/* The most an image of a session of |memory| may be: its memory, and the
 * interpreter's own (what the template maps, with numpy and friends some
 * hundreds of MiB), beside its files, which are bounded apart. */
static uint64_t image_max_bytes(uint64_t memory)
{
    return memory + (1ULL << 30);
}

static int start(struct sbx *sbx, const struct wire_session_open *m, uint64_t max_cells, int *fds,
                 int want, int image_fd, struct wire_session *ready, struct sbx_session **out,
                 struct sbx_error *err)
{
    struct sbx_session *s = NULL;
    int sv[2] = {-1, -1};
    char why[WIRE_TEXT_MAX];
    int rc, nfds = 0;

    /* A place among max_sessions, or busy. */
    unsigned open = atomic_load(&sbx->sessions);
    do {
        if (open >= sbx->cfg.max_sessions)
            return sbx_fail(err, SBX_ERR_BUSY, -EBUSY,
                            "%u sessions are open, the most this sandbox keeps (max_sessions)",
                            open);
    } while (!atomic_compare_exchange_weak(&sbx->sessions, &open, open + 1));

    s = calloc(1, sizeof(*s));
    if (!s) {
        atomic_fetch_sub(&sbx->sessions, 1);
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    }
    s->sbx = sbx;
    s->chan = s->template_pidfd = -1;
    s->max_cells = max_cells;
    s->memory = m->memory_bytes;
    s->idle_ms = m->idle_ms;
    s->lifetime_ms = m->lifetime_ms;
    pthread_mutex_init(&s->lock, NULL);
    union {
        struct wire_hdr hdr;
        struct wire_session session;
        struct wire_fail fail;
    } r;
    uint64_t until = now_ns() + SESSION_OPEN_TIMEOUT_NS;
    ssize_t n = 0;
    /* A template that died just before (its end not yet seen) takes the
     * request with it: the next one is asked, as a run would wait for its
     * worker. (Not for a branch: its origin was in the template that died.) */
    for (int attempt = 0;
         n == 0 && attempt < (m->branch_of || m->restore ? 1 : SESSION_OPEN_ATTEMPTS); attempt++) {
        close_fd(&s->chan);
        close_fd(&s->template_pidfd);
        /* Ours non-blocking: between cells we only look whether the
         * template ended the session. */
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0 ||
            fcntl(sv[0], F_SETFL, O_NONBLOCK) < 0) {
            rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, -errno, "socketpair: %s", strerror(errno));
            goto fail;
        }
        rc = control_open_session(sbx, m, sv[1], &s->template_pidfd, why, sizeof(why));
        close_fd(&sv[1]);
        s->chan = sv[0];
        sv[0] = -1;
        if (rc < 0) {
            rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "%s", why);
            goto fail;
        }
        struct wire_image img = {.hdr = {WIRE_RESTORE, WIRE_VERSION},
                                 .max_bytes = image_max_bytes(m->memory_bytes)};
        if (image_fd >= 0 && (rc = wire_send(s->chan, &img, sizeof(img), &image_fd, 1)) < 0) {
            rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "the template does not listen");
            goto fail;
        }
        n = await(s, &r, sizeof(r), fds, want, &nfds, until);
    }
    if (n <= 0) {
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, n < 0 ? (int)n : -EPIPE,
                      n == -ETIMEDOUT ? "the session's process did not get ready in time"
                                      : "the template ended before the session was ready");
        goto fail;
    }
    if ((rc = wire_decode_session(&r, (size_t)n, ready, why, sizeof(why))) < 0) {
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "%s", why);
        goto fail;
    }
    if (nfds != want || ready->held > (m->branch_of ? WIRE_HELD_MAX : 0)) {
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, -EPROTO, "the template's answer was cut");
        goto fail;
    }
    s->uid = ready->uid;
    s->gid = ready->gid;
    s->id = ready->id;
    *out = s;
    return 0;

fail:
    close_fds(sv, 2);
    close_fds(fds, (size_t)nfds);
    discard(s);
    return rc;
}

/* The branch |s| of |from| gets its copies of the files |from|'s state
 * holds open (ready->held of them, by their inodes in |from|'s workspace):
 * the same names in its own workspace |ws_fd|, which its state takes on
 * before its first cell (WIRE_ADOPT). Returns 0 or -errno with |why|. */
static int give_kept(struct sbx_session *s, const struct sbx_session *from, int ws_fd,
                     const struct wire_session *ready, char *why, size_t cap)
{
    struct wire_adopt_msg m = {.hdr = {WIRE_ADOPT, WIRE_VERSION}, .adopt = {.n = ready->held}};
    int fds[WIRE_HELD_MAX];
    uint32_t n = 0;
    int rc = 0;

    for (; n < ready->held; n++) {
        fds[n] = ws_open_ino(ws_fd, &from->index, (ino_t)ready->held_ino[n], O_PATH);
        if (fds[n] < 0) {
            rc = errmsg(why, cap, fds[n], "a file its state holds open: %s", strerror(-fds[n]));
            break;
        }
        m.adopt.which[n] = (uint8_t)n;
    }
    if (rc == 0 && (rc = wire_send(s->chan, &m, sizeof(m), fds, (int)n)) < 0)
        fmt(why, cap, "telling the template: %s", strerror(-rc));
    close_fds(fds, n);
    return rc;
}

int sbx_session_fork(struct sbx_session *from, struct sbx_session **out, struct sbx_error *err)
{
    struct sbx_session *s = NULL;
    int fds[WIRE_BRANCH_FDS] = {-1, -1, -1};
    char why[160];
    int rc;

    *out = NULL;
    if (!from)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "no session");
    /* Behind a cell of the origin's: the copy is of the state it leaves. */
    pthread_mutex_lock(&from->lock);
    look_for_end(from);
    if (from->lost[0]) {
        rc = sbx_fail(err, SBX_ERR_SESSION_LOST, -ENOLINK, "%s", from->lost);
        goto out;
    }
    struct wire_session_open m = {
        .hdr = {WIRE_SESSION_OPEN, WIRE_VERSION},
        .idle_ms = from->idle_ms,
        .lifetime_ms = from->lifetime_ms,
        .memory_bytes = from->memory,
        .branch_of = from->id,
    };
    struct wire_session ready;
    rc = start(from->sbx, &m, from->max_cells, fds, WIRE_BRANCH_FDS, -1, &ready, &s, err);
    if (rc < 0) {
        /* The branch failed; the origin too, if the template says so. */
        look_for_end(from);
        if (from->lost[0])
            rc = sbx_fail(err, SBX_ERR_SESSION_LOST, -ENOLINK, "%s", from->lost);
        goto out;
    }
    /* The files as of the origin's last kept cell (its saved copy), into
     * the branch's workspace and saved copy, as the branch's user (the
     * capabilities that override modes read the origin's). */
    bool switched = false;
    rc = fsid_enter_owner(s->uid, s->gid, &switched);
    if (rc == 0) {
        rc = ws_restore_all(fds[0], fds[2]);
        if (rc == 0)
            rc = ws_restore_all(fds[1], fds[2]);
        if (rc == 0)
            rc = ws_index_build(fds[0], &s->index, why, sizeof(why));
        else
            fmt(why, sizeof(why), "%s", strerror(-rc));
        if (rc == 0 && ready.held)
            rc = give_kept(s, from, fds[0], &ready, why, sizeof(why));
        fsid_leave(switched);
    } else
        fmt(why, sizeof(why), "taking the branch's user: %s", strerror(-rc));
    if (rc < 0) {
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "copying the session's files: %s", why);
        sbx_session_close(s);
        goto out;
    }
    s->cells = from->cells;
    s->rollback = from->rollback;
    *out = s;
out:
    close_fds(fds, WIRE_BRANCH_FDS);
    pthread_mutex_unlock(&from->lock);
    return rc;
}

/* --- images ------------------------------------------------------------------ */

#define SESSION_IMAGE_MAGIC   "PYSBXSES"
#define SESSION_IMAGE_VERSION 1
/* How long the template may take to write or restore a state's image. */
#define IMAGE_TIMEOUT_NS (60ULL * 1000000000ULL)

/* What an image holds before the state's memory (the template's part,
 * src/template/branch.h) and its files (wssync.h). */
struct session_image_head {
    char magic[8];
    uint32_t version;
    uint32_t rollback;
    uint64_t cells, max_cells, memory, idle_ms, lifetime_ms;
};

int sbx_session_save(struct sbx_session *s, int fd, struct sbx_error *err)
{
    union {
        struct wire_hdr hdr;
        struct wire_saved saved;
        struct wire_fail fail;
    } r;
    char why[WIRE_TEXT_MAX];
    int saved = -1, nfds = 0, rc;

    if (!s || fd < 0)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "no session or descriptor");
    pthread_mutex_lock(&s->lock);
    look_for_end(s);
    if (s->lost[0]) {
        rc = sbx_fail(err, SBX_ERR_SESSION_LOST, -ENOLINK, "%s", s->lost);
        goto out;
    }
    struct session_image_head head = {.version = SESSION_IMAGE_VERSION,
                                      .rollback = (uint32_t)s->rollback,
                                      .cells = s->cells,
                                      .max_cells = s->max_cells,
                                      .memory = s->memory,
                                      .idle_ms = s->idle_ms,
                                      .lifetime_ms = s->lifetime_ms};
    memcpy(head.magic, SESSION_IMAGE_MAGIC, sizeof(head.magic));
    struct wire_image ask = {.hdr = {WIRE_SAVE, WIRE_VERSION},
                             .max_bytes = image_max_bytes(s->memory)};
    if ((rc = write_full(fd, &head, sizeof(head))) < 0) {
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "writing the image: %s", strerror(-rc));
        goto out;
    }
    if ((rc = wire_send(s->chan, &ask, sizeof(ask), &fd, 1)) < 0) {
        lose(s, "the template ended");
        rc = sbx_fail(err, SBX_ERR_SESSION_LOST, -ENOLINK, "%s", s->lost);
        goto out;
    }
    ssize_t n = await(s, &r, sizeof(r), &saved, 1, &nfds, now_ns() + IMAGE_TIMEOUT_NS);
    if (n <= 0 || r.hdr.type != WIRE_SAVED || n != (ssize_t)sizeof(r.saved)) {
        if (n > 0 && !ended(s, &r.fail, n))
            lose(s, "the template answered out of turn");
        else if (n <= 0)
            lose(s, n == -ETIMEDOUT ? "the state's image was not written in time"
                                    : "the template ended");
        rc = sbx_fail(err, SBX_ERR_SESSION_LOST, -ENOLINK, "%s", s->lost);
        goto out;
    }
    r.saved.why[sizeof(r.saved.why) - 1] = '\0';
    if (r.saved.rc < 0 || nfds != 1) {
        /* -EBUSY: the state's own doing (it keeps files open); it goes on. */
        rc = sbx_fail(err, r.saved.rc == -EBUSY ? SBX_ERR_INVALID_REQUEST : SBX_ERR_UNAVAILABLE,
                      r.saved.rc < 0 ? r.saved.rc : -EPROTO,
                      "the state's image was not written: %s", r.saved.why);
        goto out;
    }
    /* The files as of the last kept cell (the saved copy), as the
     * session's user with the capabilities that override modes. */
    bool switched = false;
    rc = fsid_enter_owner(s->uid, s->gid, &switched);
    if (rc == 0) {
        rc = ws_write_stream(saved, fd, why, sizeof(why));
        fsid_leave(switched);
    } else
        fmt(why, sizeof(why), "taking the session's user: %s", strerror(-rc));
    if (rc < 0)
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "%s", why);
out:
    close_fd(&saved);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int sbx_session_restore(struct sbx *sbx, const struct sbx_session_limits *limits, int fd,
                        struct sbx_session **out, struct sbx_error *err)
{
    struct session_image_head head;
    struct sbx_session *s = NULL;
    int fds[WIRE_RESTORE_FDS] = {-1, -1};
    char why[WIRE_TEXT_MAX];
    int rc;

    *out = NULL;
    if (!sbx || fd < 0)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "no sandbox or descriptor");
    ssize_t got = read_full(fd, &head, sizeof(head));
    if (got != (ssize_t)sizeof(head) ||
        memcmp(head.magic, SESSION_IMAGE_MAGIC, sizeof(head.magic)) != 0 ||
        head.version != SESSION_IMAGE_VERSION || head.rollback > SBX_ROLLBACK_NEVER ||
        head.memory < SBX_MIN_MEMORY_BYTES || head.memory > SBX_MAX_MEMORY_BYTES ||
        !head.max_cells || head.cells >= head.max_cells ||
        head.idle_ms > (uint64_t)(SBX_MAX_SECONDS * 1000) || !head.idle_ms ||
        head.lifetime_ms > (uint64_t)(SBX_MAX_SECONDS * 1000) || !head.lifetime_ms)
        return sbx_fail(err, SBX_ERR_SESSION_LOST, -EBADMSG,
                        "not a session's image of this version (or cut short)");
    struct wire_session_open m = {
        .hdr = {WIRE_SESSION_OPEN, WIRE_VERSION},
        .idle_ms = head.idle_ms,
        .lifetime_ms = head.lifetime_ms,
        .memory_bytes = head.memory,
        .restore = 1,
    };
    uint64_t max_cells = head.max_cells;
    if (limits) {
        if (!seconds_ok(limits->idle_seconds) || !seconds_ok(limits->lifetime_seconds) ||
            limits->max_cells <= head.cells ||
            (limits->memory_bytes && limits->memory_bytes < head.memory))
            return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL,
                            "limits for a restored session: idle and lifetime in (0, %g] s, "
                            "max_cells past the image's %llu cells, memory at least its %llu",
                            SBX_MAX_SECONDS, (unsigned long long)head.cells,
                            (unsigned long long)head.memory);
        m.idle_ms = (uint64_t)(limits->idle_seconds * 1000.0 + 0.5);
        m.lifetime_ms = (uint64_t)(limits->lifetime_seconds * 1000.0 + 0.5);
        m.memory_bytes = limits->memory_bytes ? limits->memory_bytes : head.memory;
        max_cells = limits->max_cells;
    }
    struct wire_session ready;
    rc = start(sbx, &m, max_cells, fds, WIRE_RESTORE_FDS, fd, &ready, &s, err);
    if (rc < 0) {
        if (err && err->code == SBX_ERR_UNAVAILABLE && rc != -EBUSY)
            err->code = SBX_ERR_SESSION_LOST; /* the template refused the image */
        return rc;
    }
    /* The files, into its saved copy, then its workspace, as its user. */
    bool switched = false;
    rc = fsid_enter_owner(s->uid, s->gid, &switched);
    if (rc == 0) {
        /* What a workspace holds, and its names and entries' heads. */
        uint64_t ws = sbx->workspace_bytes ? sbx->workspace_bytes : SBX_DEFAULT_WORKSPACE_BYTES;
        rc = ws_read_stream(fd, fds[1], ws + (4ULL << 20), why, sizeof(why));
        if (rc == 0 && (rc = ws_restore_all(fds[0], fds[1])) < 0)
            fmt(why, sizeof(why), "restoring the files: %s", strerror(-rc));
        if (rc == 0)
            rc = ws_index_build(fds[0], &s->index, why, sizeof(why));
        fsid_leave(switched);
    } else
        fmt(why, sizeof(why), "taking the session's user: %s", strerror(-rc));
    if (rc < 0) {
        rc = sbx_fail(err, SBX_ERR_SESSION_LOST, rc, "the image's files: %s", why);
        sbx_session_close(s);
        goto out;
    }
    s->cells = head.cells;
    s->rollback = (enum sbx_rollback)head.rollback;
    *out = s;
out:
    close_fds(fds, WIRE_RESTORE_FDS);
    return rc;
}

/* The session is over if |m| (|n| bytes) says so, or is not a message
 * the template sends: lost, with its words. Returns whether it was. */
static bool ended(struct sbx_session *s, struct wire_fail *m, ssize_t n)
{
    if (n > 0 && m->hdr.type == WIRE_ENDED && n == (ssize_t)sizeof(*m))
        m->text[sizeof(m->text) - 1] = '\0';
    else if (n > 0 && m->hdr.type != WIRE_ENDED)
        return false;
    else
        fmt(m->text, sizeof(m->text), "the sandbox's template ended, and its sessions with it");
    lose(s, m->text);
    return true;
}

/* Between cells the template sends nothing but the session's end. */
static void look_for_end(struct sbx_session *s)
{
    struct wire_fail f;
    int nfds = 0;

    if (s->lost[0])
        return;
    ssize_t n = chan_recv(s, &f, sizeof(f), NULL, 0, &nfds);
    if (n == -EAGAIN || n == -EINTR)
        return;
    if (!ended(s, &f, n))
        lose(s, "the template said something out of turn");
}

/* The kept files the last cell came with, let go of. */
static void drop_kept(struct sbx_session *s)
{
    close_fds(s->kept, s->n_kept);
    s->n_kept = 0;
}

int session_take_cell(struct sbx_session *s, const struct sbx_request *req, uint64_t deadline,
                      struct taken_worker *w, int *saved, char *why, size_t whylen)
{
    union wire_worker_reply m;
    struct wire_worker worker;
    /* The cell's limits travel with the request for it: the template arms
     * them, whatever the cell says. */
    struct wire_cell cell = {
        .hdr = {WIRE_CELL, WIRE_VERSION},
        .rollback = s->rollback,
        .cpu_ms = (uint64_t)(req->limits.cpu_seconds * 1000.0 + 0.5),
        .wall_ms = (uint64_t)(req->limits.wall_seconds * 1000.0 + 0.5),
    };
    int fds[WFD_SESSION_COUNT + WIRE_HELD_MAX];
    int nfds = 0;

    for (int i = 0; i < WFD_COUNT; i++)
        w->fds[i] = -1;
    drop_kept(s);
    if (!s->lost[0] && wire_send(s->chan, &cell, sizeof(cell), NULL, 0) < 0)
        look_for_end(s);
    if (s->lost[0])
        return errmsg(why, whylen, -ENOLINK, "%s", s->lost);
    ssize_t n = await(s, &m, sizeof(m), fds, WFD_SESSION_COUNT + WIRE_HELD_MAX, &nfds, deadline);
    if (n == -ETIMEDOUT) {
        /* The template answers in the end; the channel is out of step
         * until it does, so the session cannot go on. */
        lose(s, "the session's cell could not be made in time");
        return errmsg(why, whylen, -ENOLINK, "%s", s->lost);
    }
    if (n <= 0) {
        lose(s, "the sandbox's template ended, and its sessions with it");
        return errmsg(why, whylen, -ENOLINK, "%s", s->lost);
    }
    /* The session may have ended while we asked. */
    if (ended(s, &m.fail, n)) {
        close_fds(fds, (size_t)nfds);
        return errmsg(why, whylen, -ENOLINK, "%s", s->lost);
    }
    /* The cell's descriptors, then one for each file the state keeps. */
    int want = nfds > WFD_SESSION_COUNT ? nfds : WFD_SESSION_COUNT;
    int rc = wire_decode_worker_fds(&m, (size_t)n, nfds, want, &worker, why, whylen);
    if (rc < 0) {
        close_fds(fds, (size_t)nfds);
        return rc;
    }
    memcpy(w->fds, fds, sizeof(w->fds));
    *saved = fds[WFD_SAVED];
    s->n_kept = (unsigned)(nfds - WFD_SESSION_COUNT);
    memcpy(s->kept, fds + WFD_SESSION_COUNT, s->n_kept * sizeof(int));
    control_taken(w, &worker);
    return 0;
}

static bool changed_by_cell(const void *ctx, const char *path)
{
    return ws_changed(ctx, path);
}

void session_cell_ended(struct sbx_session *s, struct supervision *sv, int saved)
{
    bool switched;

    s->changes_known = false;
    int rc = fsid_enter_owner(s->uid, s->gid, &switched);
    if (rc == 0)
        rc = ws_diff(sv->ws_fd, saved, &s->index, &s->changes, s->unknown_why,
                     sizeof(s->unknown_why));
    else
        fmt(s->unknown_why, sizeof(s->unknown_why), "the sandbox could not act as its user");
    s->changes_known = rc == 0;
    fsid_leave(switched);
    /* Unknown changes: no artifacts rather than the whole workspace. */
    sv->only_artifacts = changed_by_cell;
    sv->only_ctx = &s->changes;
}

/* Why a cell that completed was rolled back, for its result. */
static const char *rollback_reason(const struct supervision *sv, const struct sbx_result *res,
                                   char *buf, size_t cap)
{
    uint32_t f = sv->outcome.flags;

    if (f & WIRE_STATUS_THREADS_LEFT)
        return "rolled back: a thread was still running at the cell's end, and nothing may run "
               "between cells";
    if (f & WIRE_STATUS_OUTPUT_OPEN)
        return "rolled back: the cell's output was still open when it said it had ended (only "
               "a cell whose output has ended can be kept)";
    if (f & WIRE_STATUS_FDS_LEFT) {
        fmt(buf, cap, "rolled back: %s",
            sv->outcome.fds_why[0] ? sv->outcome.fds_why
                                   : "the cell left a descriptor open that a session cannot keep");
        return buf;
    }
    if (f & WIRE_STATUS_ROLLED_BACK) {
        long long v = sv->outcome.cell_status;
        if (f & WIRE_STATUS_EXIT_PAST)
            fmt(buf, cap,
                "rolled back: the cell ended with sys.exit() of a number %s %lld (exit status "
                "%d to the system; rollback \"%s\")",
                v < 0 ? "below" : "above", v < 0 ? (long long)INT64_MIN : (long long)INT64_MAX,
                res->exit_code, sbx_rollback_name(SBX_ROLLBACK_ON_ERROR));
        else if (v != res->exit_code)
            fmt(buf, cap,
                "rolled back: the cell ended with sys.exit(%lld) (exit status %d to the "
                "system; rollback \"%s\")",
                v, res->exit_code, sbx_rollback_name(SBX_ROLLBACK_ON_ERROR));
        else
            fmt(buf, cap, "rolled back: the cell ended with exit status %d (rollback \"%s\")",
                res->exit_code, sbx_rollback_name(SBX_ROLLBACK_ON_ERROR));
        return buf;
    }
    return "rolled back: the cell's process ended (os._exit), so it cannot be the session's state";
}

void session_lost_why(const struct sbx_session *s, char *why, size_t cap)
{
    fmt(why, cap, "%s", s->lost[0] ? s->lost : "the session ended");
}

/* Tells the template whether the cell it offered is kept, and (rolled
 * back) which kept files are in new inodes now: |adopt|, one per kept file,
 * -1 for those in their own. */
static void send_settle(struct sbx_session *s, bool keep, const int *adopt)
{
    struct wire_settle m = {.hdr = {WIRE_SETTLE, WIRE_VERSION}, .keep = keep};
    int fds[WIRE_HELD_MAX];

    for (unsigned k = 0; !keep && k < s->n_kept; k++)
        if (adopt[k] >= 0) {
            m.adopt.which[m.adopt.n] = (uint8_t)k;
            fds[m.adopt.n++] = adopt[k];
        }
    if (!s->lost[0] && wire_send(s->chan, &m, sizeof(m), fds, (int)m.adopt.n) < 0)
        look_for_end(s);
}

int session_cell_settle(struct sbx_session *s, struct supervision *sv, int saved,
                        struct sbx_result *res)
{
    /* The session ended while the cell was out: the channel says why. */
    if (sv->have_outcome && (sv->outcome.flags & WIRE_STATUS_SESSION_ENDED)) {
        look_for_end(s);
        lose(s, "the session ended while its cell ran");
        return -ENOLINK;
    }
    bool offered = sv->have_outcome && (sv->outcome.flags & WIRE_STATUS_KEPT);
    bool keep_files = offered || s->rollback == SBX_ROLLBACK_NEVER;
    bool switched;
    char buf[WIRE_TEXT_MAX], refused[200] = "";
    int adopt[WIRE_HELD_MAX];
    struct ws_kept kept_files = {.fds = s->kept, .n = s->n_kept, .adopt = adopt};
    int rc = -EIO;

    for (unsigned k = 0; k < s->n_kept; k++)
        adopt[k] = -1;
    res->cell = ++s->cells;
    if (keep_files && !s->changes_known) {
        /* What cannot be saved is not kept: the cell rolls back, files and
         * all, and says why. */
        fmt(refused, sizeof(refused), "%s", s->unknown_why);
        keep_files = false;
    }
    bool kept = false;
    if (fsid_enter_owner(s->uid, s->gid, &switched) == 0) {
        /* The value and the error were read: the next cell does not find
         * them. */
        (void)unlinkat(sv->ws_fd, WIRE_VALUE_FILE, 0);
        (void)unlinkat(sv->ws_fd, WIRE_ERROR_FILE, 0);
        if (keep_files) {
            rc = ws_commit(sv->ws_fd, saved, &s->changes);
            if (rc == 0)
                ws_index_take(&s->index, &s->changes);
            kept = rc == 0 && offered;
        } else {
            /* The state's kept files in their own inodes, where they can
             * be (its descriptors name them). */
            if (s->changes_known)
                rc = ws_restore(sv->ws_fd, saved, &s->changes, &kept_files);
            else if ((rc = ws_restore_all(sv->ws_fd, saved)) == 0)
                rc = ws_restore_kept(sv->ws_fd, saved, &s->index, &kept_files);
            if (rc == 0)
                rc = ws_index_build(sv->ws_fd, &s->index, buf, sizeof(buf));
        }
        fsid_leave(switched);
    }
    ws_changes_free(&s->changes);
    if (sv->have_outcome)
        send_settle(s, kept, adopt);
    for (unsigned k = 0; k < s->n_kept; k++)
        close_fd(&adopt[k]);
    drop_kept(s);
    res->rolled_back = !kept;
    if (rc < 0) {
        /* Neither kept nor put back: the session cannot go on, and the
         * answer says so rather than claim a rollback that did not happen. */
        fmt(buf, sizeof(buf), "the session's files could not be %s: %s",
            keep_files ? "saved" : "put back", strerror(-rc));
        lose(s, buf);
        if (res->status == SBX_COMPLETED) {
            fmt(buf, sizeof(buf), "%s; the session is lost", s->lost);
            free(res->reason);
            res->reason = strdup(buf);
            if (!res->reason)
                return -ENOMEM;
        }
        return 0;
    }
    if (!kept && res->status == SBX_COMPLETED) {
        const char *why = refused[0] ? NULL : rollback_reason(sv, res, buf, sizeof(buf));
        if (refused[0])
            fmt(buf, sizeof(buf), "rolled back: its files could not be kept: %s", refused);
        free(res->reason);
        res->reason = strdup(why ? why : buf);
        if (!res->reason)
            return -ENOMEM;
    }
    if (s->cells >= s->max_cells) {
        fmt(buf, sizeof(buf), "the session ran its %llu cells (max_cells)",
            (unsigned long long)s->max_cells);
        lose(s, buf);
    }
    return 0;
}

int sbx_session_run(struct sbx_session *s, const struct sbx_request *req,
                    enum sbx_rollback rollback, struct sbx_result **out, struct sbx_error *err)
{
    int rc;

    *out = NULL;
    if (!s)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "no session");
    if (!sbx_rollback_name(rollback))
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "rollback must be on_error, on_stop or never");
    rc = sbx_request_check(req, err);
    if (rc == 0)
        rc = embedded_check_fits(s->sbx, req, err);
    /* The state's sys.stdin would carry what one cell left unread into the
     * next: a cell has no standard input. */
    if (rc == 0 && req->stdin_len)
        rc = sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                      "a session's cell takes no stdin (put the input in a file instead)");
    if (rc == 0 && req->n_tools)
        rc = sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                      "host tools are for plain runs, not a session's cells");
    if (rc < 0)
        return rc;
    /* Behind another caller's cell: its cancellation still ends it, as it
     * ends a run waiting for a worker ("cancelled before it started"). */
    for (;;) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += SESSION_WAIT_SLICE_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        if (pthread_mutex_timedlock(&s->lock, &until) == 0)
            break;
        if (sbx_cancel_fired(req->cancel))
            return embedded_run(s->sbx, NULL, req, out, err);
    }
    look_for_end(s);
    if (s->lost[0])
        rc = sbx_fail(err, SBX_ERR_SESSION_LOST, -ENOLINK, "%s", s->lost);
    else {
        /* A cell's memory limit is the session's: the hard RLIMIT_AS its
         * first process set, which no cell can raise (or be given). */
        struct sbx_request cell = *req;
        cell.limits.memory_bytes = s->memory;
        s->rollback = rollback;
        rc = embedded_run(s->sbx, s, &cell, out, err);
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

void sbx_session_close(struct sbx_session *s)
{
    if (!s)
        return;
    /* A cell in flight finishes first (it holds the lock). */
    pthread_mutex_lock(&s->lock);
    /* The template ends the session (processes, files, uid) and closes
     * its end once nothing of it is left: wait for that, a while. */
    if (s->chan >= 0 && (shutdown(s->chan, SHUT_WR) == 0 || errno == ENOTCONN)) {
        char byte;
        int nfds = 0;
        uint64_t until = now_ns() + SESSION_CLOSE_WAIT_NS;
        while (await(s, &byte, 1, NULL, 0, &nfds, until) > 0)
            ; /* a FAIL sent before it saw our end */
    }
    close_fd(&s->chan);
    close_fd(&s->template_pidfd);
    ws_index_free(&s->index);
    ws_changes_free(&s->changes);
    drop_kept(s);
    pthread_mutex_unlock(&s->lock);
    pthread_mutex_destroy(&s->lock);
    atomic_fetch_sub(&s->sbx->sessions, 1);
    free(s);
}
