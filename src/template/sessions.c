/*
 * Sessions, on the template's side: the one party that may let a session's
 * state fork, and the keeper of which process is the state.
 *
 * A session is a first state process, made like a worker (spawn_process)
 * but with the session's seccomp program, which hands one fork to us, its
 * listener: clone(CLONE_PARENT | SIGCHLD), nothing else. The state sits in
 * a loop (src/worker/session.c) that forks when told. For each cell asked
 * for on the session's channel we make the cell's pipes, wake the state,
 * tell it to fork, and answer its clone with "continue" only then, only for
 * the state's own (single) thread. The fork's parent is us, so we reap the
 * cell and the kernel's word on how it ended is what the supervisor gets,
 * as for a worker. A cell whose code ends by itself says so: if the rule
 * keeps it and it has one thread, it becomes the state (and the old state
 * is killed); otherwise it is killed and the state stays. Between cells the
 * state is stopped (SIGSTOP): nothing of it runs.
 */
#define _GNU_SOURCE
#include "pysbx.h"
#include "sysutil.h"
#include "template.h"
#include "util.h"
#include "worker.h"
#include "workspace.h"

#include <errno.h>
#include <fcntl.h>
#include <seccomp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A cell that said it is done while a thread of it was still there gets
 * this long for the thread to finish leaving (a joined thread's kernel
 * side lingers a moment), looked at every RECHECK_NS. */
#define THREAD_GRACE_NS (100ULL * 1000000ULL)
#define RECHECK_NS      (2ULL * 1000000ULL)

struct session_rec {
    struct session_rec *next;
    int chan;     /* to the supervisor; -1 once it is gone */
    int listener; /* the session's seccomp notifications; -1 until sent */
    int ws_fd;    /* the workspace the state and the cells see */
    int saved_fd; /* the files as of the last kept cell (the supervisor's) */
    unsigned slot;
    uid_t uid;
    gid_t gid;
    char name[WIRE_NAME_MAX];
    uint64_t memory;
    uint64_t idle_ns, lifetime_ns;
    uint64_t opened_ns, idle_since_ns;
    uint64_t recheck_ns;      /* a done cell with a thread: look again then */
    struct worker_rec *state; /* NULL once it died */
    struct worker_rec *cell;  /* the cell asked for or running */
    unsigned procs;           /* its processes not yet reaped */
    unsigned dying;           /* ... of which states killed once a cell was kept */
    uint32_t rollback;
    bool ready;       /* WIRE_SESSION sent */
    bool pending;     /* a cell asked for and not yet handed over */
    bool fork_failed; /* the last fork made ahead failed: wait for a cell */
    bool permit;      /* the state may fork, once */
    bool ending;      /* freed once its processes are reaped */
};

static struct seccomp_notif *notif;
static struct seccomp_notif_resp *notif_resp;

uint64_t session_memory(const struct session_rec *s)
{
    return s->memory;
}

void session_adopt(struct session_rec *s, struct worker_rec *w, int ws_fd)
{
    s->state = w;
    s->slot = w->slot;
    s->uid = w->uid;
    s->gid = w->gid;
    s->ws_fd = ws_fd;
    s->procs = 1;
    fmt(s->name, sizeof(s->name), "%s", w->name);
}

/* FAIL (a cell could not be made, or the opening failed) or ENDED. */
static void send_text(struct session_rec *s, uint32_t type, const char *why)
{
    struct wire_fail m = {.hdr = {type, WIRE_VERSION}};

    fmt(m.text, sizeof(m.text), "%s", why);
    if (s->chan >= 0 && !s->ending)
        (void)wire_send(s->chan, &m, sizeof(m), NULL, 0);
}

/* Numbers from /proc/PID/status ("Threads:", "PPid:", "VmHWM:", ...), in
 * one read: out[i] for fields[i], -1 where there is none. */
static void proc_fields(const struct tmpl *t, pid_t pid, const char *const *fields, long *out,
                        int n)
{
    char path[32], buf[4096];
    ssize_t got = -1;

    for (int i = 0; i < n; i++)
        out[i] = -1;
    fmt(path, sizeof(path), "%d/status", (int)pid);
    int fd = openat(t->proc_fd, path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        got = read_full(fd, buf, sizeof(buf) - 1);
        close(fd);
    }
    if (got <= 0)
        return;
    buf[got] = '\0';
    for (char *p = buf; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        for (int i = 0; i < n; i++)
            if (strncmp(p, fields[i], strlen(fields[i])) == 0)
                out[i] = strtol(p + strlen(fields[i]), NULL, 10);
}

/* The last number of a /proc/PID/status line (NSpid:, NStgid:): a pid as
 * the process's own pid namespace numbers it. -1 when there is none. */
static long proc_inner(const struct tmpl *t, pid_t pid, const char *field)
{
    char path[32], buf[4096];
    ssize_t got = -1;

    fmt(path, sizeof(path), "%d/status", (int)pid);
    int fd = openat(t->proc_fd, path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        got = read_full(fd, buf, sizeof(buf) - 1);
        close(fd);
    }
    if (got <= 0)
        return -1;
    buf[got] = '\0';
    char *line = strstr(buf, field);
    if (!line)
        return -1;
    line += strlen(field);
    char *end = line + strcspn(line, "\n");
    while (end > line && (end[-1] < '0' || end[-1] > '9'))
        end--;
    char *p = end;
    while (p > line && p[-1] >= '0' && p[-1] <= '9')
        p--;
    return p < end ? strtol(p, NULL, 10) : -1;
}

static long proc_status(const struct tmpl *t, pid_t pid, const char *field)
{
    long v;

    proc_fields(t, pid, &field, &v, 1);
    return v;
}

static void unlink_worker(struct tmpl *t, struct worker_rec *w)
{
    struct worker_rec **pp = &t->workers;

    while (*pp && *pp != w)
        pp = &(*pp)->next;
    if (*pp)
        *pp = w->next;
}

static void free_session(struct tmpl *t, struct session_rec *s)
{
    struct session_rec **pp = &t->sessions;

    while (*pp && *pp != s)
        pp = &(*pp)->next;
    if (*pp)
        *pp = s->next;
    close_fd(&s->chan);
    close_fd(&s->listener);
    close_fd(&s->ws_fd);
    close_fd(&s->saved_fd);
    uids_release(&t->uids, s->slot);
    free(s);
}

/* A cell asked for whose process never said hello: nothing to reap. */
static void drop_unborn_cell(struct tmpl *t, struct session_rec *s)
{
    struct worker_rec *w = s->cell;

    if (!w || w->pid)
        return;
    s->cell = NULL;
    s->permit = false;
    unlink_worker(t, w);
    forget_worker(t, w);
}

static void kill_quietly(struct worker_rec *w)
{
    if (w && w->pid && !w->dead) {
        w->quiet = true;
        kill(w->pid, SIGKILL);
    }
}

/* The session is over: say why (unless the supervisor ended it), kill its
 * processes, and free it once they are reaped. */
static void end_session(struct tmpl *t, struct session_rec *s, const char *why)
{
    if (why)
        send_text(s, WIRE_ENDED, why);
    /* The channel stays open (and unread) until the last process of the
     * session is reaped: its end tells the supervisor nothing is left. */
    s->ending = true;
    drop_unborn_cell(t, s);
    kill_quietly(s->state);
    /* A cell running is stopped as by its deadline: its status says so. */
    if (s->cell && s->cell->announced)
        kill(s->cell->pid, SIGKILL);
    else
        kill_quietly(s->cell);
    if (s->procs == 0)
        free_session(t, s);
}

void session_open(struct tmpl *t, const struct wire_session_open *m, int chan)
{
    struct session_rec *s = calloc(1, sizeof(*s));
    char why[WIRE_TEXT_MAX];

    if (!s) {
        close(chan);
        return;
    }
    *s = (struct session_rec){.chan = chan, .listener = -1, .ws_fd = -1, .saved_fd = -1};
    s->memory = m->memory_bytes;
    s->idle_ns = m->idle_ms * 1000000ULL;
    s->lifetime_ns = m->lifetime_ms * 1000000ULL;
    s->opened_ns = s->idle_since_ns = now_ns();
    if (!t->root || !t->seccomp) {
        fmt(why, sizeof(why), "%s",
            !t->root ? "sessions need the private root (the mount namespace): each keeps a "
                       "second workspace mounted nowhere"
                     : "sessions need the seccomp layer: it is what lets only the sandbox fork "
                       "a session's state");
        goto refuse;
    }
    if (!t->session_policy_built) {
        if (policy_build(&t->session_policy, t->policy_debug, !t->root, true, why, sizeof(why)) < 0)
            goto refuse;
        t->session_policy_built = true;
    }
    if (!notif && seccomp_notify_alloc(&notif, &notif_resp) < 0) {
        fmt(why, sizeof(why), "template: out of memory");
        goto refuse;
    }
    if (!spawn_process(t, s, why, sizeof(why)))
        goto refuse;
    s->next = t->sessions;
    t->sessions = s;
    /* The saved files: a tmpfs of the session's own, mounted nowhere. */
    int mnt = workspace_mount_detached(&t->jail, s->uid, s->gid, why, sizeof(why));
    if (mnt >= 0) {
        s->saved_fd = openat(mnt, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        close(mnt);
        if (s->saved_fd < 0)
            fmt(why, sizeof(why), "template: opening a session's saved workspace: %s",
                strerror(errno));
    }
    if (s->saved_fd < 0)
        end_session(t, s, why);
    return;

refuse:
    send_text(s, WIRE_FAIL, why);
    close(chan);
    free(s);
}

/* Both ends of a SOCK_SEQPACKET pair whose first end hears who sent what. */
static int channel_pair(int sv[2])
{
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return -errno;
    if (setsockopt(sv[0], SOL_SOCKET, SO_PASSCRED, &(int){1}, sizeof(int)) < 0) {
        int e = -errno;
        close_fds(sv, 2);
        return e;
    }
    return 0;
}

/* A cell could not be made: the supervisor hears it if it asked for one;
 * otherwise (made ahead) the next one it asks for tries again. */
static void cell_failed(struct session_rec *s, const char *why)
{
    if (s->pending) {
        s->pending = false;
        send_text(s, WIRE_FAIL, why);
    } else
        s->fork_failed = true; /* asked for, it is tried again and says why */
}

/* Makes the cell's pipes, wakes the state and tells it to fork. The cell
 * is made ahead, as soon as the state is alone: it waits, stopped, until
 * a cell is asked for, so the fork is not on the cell's way. */
static void start_cell(struct tmpl *t, struct session_rec *s)
{
    int chan[2] = {-1, -1}, req[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
    int status[2] = {-1, -1};
    struct worker_rec *w = calloc(1, sizeof(*w));
    char why[WIRE_TEXT_MAX];

    if (!w) {
        cell_failed(s, "template: out of memory");
        return;
    }
    for (int i = 0; i < WFD_COUNT; i++)
        w->sup_fds[i] = -1;
    w->ready_fd = w->status_fd = -1;
    if (channel_pair(chan) < 0 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, req) < 0 ||
        pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0 || pipe2(status, O_CLOEXEC) < 0 ||
        (w->sup_fds[WFD_WORKSPACE] = fcntl(s->ws_fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        fmt(why, sizeof(why), "template: making a cell's pipes: %s", strerror(errno));
        goto fail;
    }
    const int theirs[SESSION_FORK_FDS] = {chan[1], req[1], out[1], err[1]};
    char cmd = SESSION_FORK;
    s->permit = true;
    kill(s->state->pid, SIGCONT);
    if (wire_send(s->state->ready_fd, &cmd, 1, theirs, SESSION_FORK_FDS) < 0) {
        s->permit = false;
        kill(s->state->pid, SIGSTOP);
        fmt(why, sizeof(why), "the session's process does not listen");
        goto fail;
    }
    close_fds((int[]){chan[1], req[1], out[1], err[1]}, SESSION_FORK_FDS);
    w->session = s;
    w->slot = s->slot;
    w->uid = s->uid;
    w->gid = s->gid;
    fmt(w->name, sizeof(w->name), "%s", s->name);
    w->ready_fd = chan[0];
    w->status_fd = status[1];
    w->sup_fds[WFD_REQUEST] = req[0];
    w->sup_fds[WFD_STDOUT] = out[0];
    w->sup_fds[WFD_STDERR] = err[0];
    w->sup_fds[WFD_STATUS] = status[0];
    w->next = t->workers;
    t->workers = w;
    t->n_workers++;
    s->cell = w;
    return;

fail:
    close_fds(chan, 2);
    close_fds(req, 2);
    close_fds(out, 2);
    close_fds(err, 2);
    close_fds(status, 2);
    close_fd(&w->sup_fds[WFD_WORKSPACE]);
    free(w);
    cell_failed(s, why);
}

/* A cell can be made when the state is alone (a state before it may still
 * be dying: its teardown and the fork go on side by side). */
static void maybe_start_cell(struct tmpl *t, struct session_rec *s)
{
    if ((s->pending || !s->fork_failed) && !s->ending && s->ready && s->state && !s->cell &&
        s->procs - s->dying == 1)
        start_cell(t, s);
}

/* Hands the cell, made and stopped, to the supervisor, and lets it run. */
static void announce_cell(struct tmpl *t, struct session_rec *s, struct worker_rec *w)
{
    struct wire_worker m = {.hdr = {WIRE_WORKER, WIRE_VERSION}, .pid = w->pid};
    int fds[WFD_SESSION_COUNT];

    if (t->jail.switch_user) {
        m.uid = w->uid;
        m.gid = w->gid;
    }
    fmt(m.workspace, sizeof(m.workspace), "%s", w->name);
    memcpy(fds, w->sup_fds, sizeof(w->sup_fds));
    fds[WFD_SAVED] = s->saved_fd;
    s->pending = false;
    if (wire_send(s->chan, &m, sizeof(m), fds, WFD_SESSION_COUNT) < 0)
        kill(w->pid, SIGKILL);
    close_fds(w->sup_fds, WFD_COUNT);
    w->announced = true;
    kill(w->pid, SIGCONT);
}

static void on_channel(struct tmpl *t, struct session_rec *s)
{
    union {
        struct wire_hdr h;
        struct wire_cell cell;
    } m;
    int fds[1];
    int nfds = 0;
    ssize_t n = wire_recv(s->chan, &m, sizeof(m), fds, 1, &nfds);

    close_fds(fds, (size_t)nfds);
    if (n == -EINTR || n == -EAGAIN)
        return;
    if (n <= 0) {
        end_session(t, s, NULL); /* the supervisor closed it */
        return;
    }
    if (n != (ssize_t)sizeof(m.cell) || m.h.type != WIRE_CELL || s->pending ||
        (s->cell && s->cell->announced) || m.cell.rollback > SBX_ROLLBACK_NEVER) {
        end_session(t, s, "template: a cell asked for out of turn");
        return;
    }
    s->rollback = m.cell.rollback;
    s->pending = true;
    s->fork_failed = false;
    if (s->cell && s->cell->pid)
        announce_cell(t, s, s->cell); /* made ahead, waiting */
    else
        maybe_start_cell(t, s); /* or made as soon as the state is alone */
}

/* The listener. A fork by one of the session's processes: allowed only to
 * the state, asked to fork, with one thread. A call about a process by pid
 * (a signal, a priority, an affinity; see policy_self_arg): allowed only
 * about the caller's own (the listener tells us the calling thread; its
 * process is its Tgid), by the numbers of its own pid namespace (NSpid,
 * NStgid), which are what it passes. Anything else fails EPERM. The arguments
 * looked at are registers, which the caller cannot change while it waits;
 * the notification is checked to be alive after /proc was read, so that
 * the pid read is still the caller's. */
static void on_notification(struct tmpl *t, struct session_rec *s)
{
    memset(notif, 0, sizeof(*notif));
    if (seccomp_notify_receive(s->listener, notif) < 0)
        return; /* the caller is gone already */
    struct worker_rec *st = s->state;
    bool allow = false;
    if (notif->data.nr == SYS_clone)
        allow = s->permit && st && !st->dead && (pid_t)notif->pid == st->pid &&
                notif->data.args[0] == POLICY_SESSION_FORK &&
                proc_status(t, st->pid, "Threads:") == 1;
    else if (policy_self_arg(notif->data.nr) >= 0) {
        /* Its own process, by its pid or the calling thread's id. */
        long pid = (long)(int)notif->data.args[policy_self_arg(notif->data.nr)];
        pid_t tid = (pid_t)notif->pid;
        allow = pid > 0 &&
                (pid == proc_inner(t, tid, "\nNSpid:") || pid == proc_inner(t, tid, "\nNStgid:"));
    }
    allow = allow && seccomp_notify_id_valid(s->listener, notif->id) == 0;
    memset(notif_resp, 0, sizeof(*notif_resp));
    notif_resp->id = notif->id;
    if (allow) {
        notif_resp->flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
        if (notif->data.nr == SYS_clone)
            s->permit = false;
    } else
        notif_resp->error = -EPERM;
    (void)seccomp_notify_respond(s->listener, notif_resp);
}

/* The CPU time of a living process, from its clock. */
static int64_t cpu_us(pid_t pid)
{
    clockid_t c;
    struct timespec ts;

    if (clock_getcpuclockid(pid, &c) != 0 || clock_gettime(c, &ts) < 0)
        return 0;
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void stop_timers(struct worker_rec *w)
{
    if (w->has_timer)
        timer_delete(w->timer);
    if (w->has_wall_timer)
        timer_delete(w->wall_timer);
    w->has_timer = w->has_wall_timer = false;
}

/* The cell |w| ended by itself and is kept: it is the state now. Its peak
 * memory, |hwm_kb|, was read with its threads. */
static void keep_cell(struct session_rec *s, struct worker_rec *w, long hwm_kb)
{
    struct wire_status st = {
        .magic = WIRE_STATUS_MAGIC,
        .wait_status = W_EXITCODE(w->exit_status & 0xff, 0),
        .started = w->started,
        .flags = WIRE_STATUS_KEPT,
        .utime_us = cpu_us(w->pid),
        .maxrss_kb = hwm_kb,
    };
    stop_timers(w);
    kill(w->pid, SIGSTOP); /* first: nothing runs between cells */
    (void)write_full(w->status_fd, &st, sizeof(st));
    close_fd(&w->status_fd);
    if (s->state && !s->state->dead)
        s->dying++;
    kill_quietly(s->state);
    s->state = w;
    s->cell = NULL;
    w->done = w->started = false;
    s->idle_since_ns = now_ns();
}

/* The cell |w| said CELL_DONE: keep it or roll it back. */
static void cell_done(struct tmpl *t, struct session_rec *s, struct worker_rec *w)
{
    static const char *const fields[] = {"Threads:", "VmHWM:"};
    bool wanted = w->exit_status == 0 || s->rollback != SBX_ROLLBACK_ON_ERROR;
    long got[2];

    proc_fields(t, w->pid, fields, got, 2);
    long threads = got[0];

    s->recheck_ns = 0;
    if (threads != 1 && wanted && now_ns() < s->idle_since_ns + THREAD_GRACE_NS) {
        s->recheck_ns = now_ns() + RECHECK_NS;
        return;
    }
    if (wanted && threads == 1) {
        keep_cell(s, w, got[1]);
        maybe_start_cell(t, s); /* the next cell, from the new state */
        return;
    }
    w->rolled_back = true;
    w->threads_left = wanted && threads != 1;
    kill(w->pid, SIGKILL); /* its status goes out when it is reaped */
}

/* "Here I am": the cell's pid, from the kernel, and is it the fork we let
 * happen (our child, of this session's uid, not one we know)? */
static void cell_hello(struct tmpl *t, struct session_rec *s, struct worker_rec *w, pid_t pid)
{
    for (struct worker_rec *o = t->workers; o; o = o->next)
        if (o->pid == pid)
            return;
    if (pid <= 0 || proc_status(t, pid, "PPid:") != t->pid)
        return;
    w->pid = pid;
    s->procs++;
    kill(s->state->pid, SIGSTOP);
    w->sup_fds[WFD_PIDFD] = pidfd_open(pid, 0);
    if (w->sup_fds[WFD_PIDFD] < 0) {
        kill(pid, SIGKILL);
        return; /* its status will say it was killed before it started */
    }
    if (s->pending)
        announce_cell(t, s, w);
    else
        kill(pid, SIGSTOP); /* until a cell is asked for */
}

void session_said(struct tmpl *t, struct worker_rec *w)
{
    struct session_rec *s = w->session;
    char buf[WIRE_TEXT_MAX];
    union {
        char buf[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } c;
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf) - 1};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf, .msg_controllen = sizeof(c.buf)};
    ssize_t n = recvmsg(w->ready_fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    pid_t from = 0;
    int fd = -1;

    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    for (struct cmsghdr *h = n >= 0 ? CMSG_FIRSTHDR(&msg) : NULL; h; h = CMSG_NXTHDR(&msg, h)) {
        if (h->cmsg_level != SOL_SOCKET)
            continue;
        if (h->cmsg_type == SCM_CREDENTIALS && h->cmsg_len >= CMSG_LEN(sizeof(struct ucred))) {
            struct ucred cr;
            memcpy(&cr, CMSG_DATA(h), sizeof(cr));
            from = cr.pid;
        } else if (h->cmsg_type == SCM_RIGHTS) {
            size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < k; i++) {
                int got;
                memcpy(&got, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
                if (fd < 0 && i == 0)
                    fd = got;
                else
                    close(got);
            }
        }
    }
    if (n <= 0 || w->quiet) {
        close_fd(&fd);
        if (n == 0 || (n < 0 && errno != EINTR)) {
            close_fd(&w->ready_fd);
            /* A cell that never said hello and whose channel ended will not
             * come: no process of it is ours to reap. */
            if (w == s->cell && !w->pid) {
                drop_unborn_cell(t, s);
                cell_failed(s, "the session's process did not make the cell");
            }
        }
        return;
    }
    buf[n] = '\0';
    if (w == s->state && !s->ready && buf[0] == SESSION_READY && fd >= 0 && from == w->pid) {
        s->listener = fd;
        s->ready = true;
        kill(w->pid, SIGSTOP);
        struct wire_session m = {.hdr = {WIRE_SESSION, WIRE_VERSION},
                                 .pid = w->pid,
                                 .uid = t->jail.switch_user ? s->uid : 0,
                                 .gid = t->jail.switch_user ? s->gid : 0};
        if (wire_send(s->chan, &m, sizeof(m), NULL, 0) < 0)
            end_session(t, s, NULL);
        else
            maybe_start_cell(t, s); /* the first cell, made ahead */
        return;
    }
    close_fd(&fd);
    if (w == s->state && buf[0] == SESSION_FORK_FAILED) {
        if (!s->ready) {
            end_session(t, s, buf + 1); /* it could not get ready */
            return;
        }
        drop_unborn_cell(t, s);
        kill(w->pid, SIGSTOP);
        cell_failed(s, buf + 1);
        return;
    }
    if (w != s->cell)
        return;
    if (buf[0] == CELL_HELLO && !w->pid) {
        cell_hello(t, s, w, from);
        return;
    }
    if (from != w->pid || !w->pid)
        return;
    if (buf[0] == WORKER_STARTED && !w->started) {
        struct wire_started st;
        w->started = true;
        if (n != 1 + (ssize_t)sizeof(st)) {
            w->limit_lost = true;
            kill(w->pid, SIGKILL);
            return;
        }
        memcpy(&st, buf + 1, sizeof(st));
        arm_cpu_limit(w, &st);
    } else if (buf[0] == CELL_DONE && w->started && !w->done && n == 1 + sizeof(int32_t)) {
        w->done = true;
        memcpy(&w->exit_status, buf + 1, sizeof(int32_t));
        s->idle_since_ns = now_ns(); /* the thread grace counts from here */
        cell_done(t, s, w);
    }
}

void session_reaped(struct tmpl *t, struct worker_rec *w, int wait_status, const struct rusage *ru)
{
    struct session_rec *s = w->session;
    const char *end = NULL;
    char why[128];

    s->procs--;
    if (w == s->cell) {
        struct wire_status st = status_of(w, wait_status, ru);
        if (w->rolled_back) {
            /* It ended by itself; we killed it to roll it back. */
            st.wait_status = W_EXITCODE(w->exit_status & 0xff, 0);
            st.flags |= WIRE_STATUS_ROLLED_BACK | (w->threads_left ? WIRE_STATUS_THREADS_LEFT : 0);
        }
        if (!w->quiet)
            (void)write_full(w->status_fd, &st, sizeof(st));
        s->cell = NULL;
        s->recheck_ns = 0;
        s->idle_since_ns = now_ns();
        if (!s->state && !s->ending)
            end = "the session's process died while a cell ran, which did not last";
    } else if (w != s->state) {
        s->dying--; /* a state killed once a cell was kept */
    } else {
        s->state = NULL;
        if (!s->ending) {
            fmt(why, sizeof(why), "the session's process died (%s %d)",
                WIFSIGNALED(wait_status) ? "signal" : "exit status",
                WIFSIGNALED(wait_status) ? WTERMSIG(wait_status) : WEXITSTATUS(wait_status));
            end = why;
        }
    }
    forget_worker(t, w);
    if (end)
        end_session(t, s, end); /* frees it when nothing is left */
    else if (s->ending && s->procs == 0)
        free_session(t, s);
    else
        maybe_start_cell(t, s);
}

size_t sessions_fd_count(const struct tmpl *t)
{
    size_t n = 0;

    for (const struct session_rec *s = t->sessions; s; s = s->next)
        n += 2;
    return n;
}

size_t sessions_poll_fds(struct tmpl *t, struct pollfd *pfd, size_t n, size_t cap)
{
    for (struct session_rec *s = t->sessions; s && n + 2 <= cap; s = s->next) {
        pfd[n++] = (struct pollfd){.fd = s->ending ? -1 : s->chan, .events = POLLIN};
        pfd[n++] = (struct pollfd){.fd = s->listener, .events = POLLIN};
    }
    return n;
}

void sessions_handle(struct tmpl *t, const struct pollfd *pfd, size_t from, size_t n)
{
    for (size_t i = from; i < n; i++) {
        if (!pfd[i].revents || pfd[i].fd < 0)
            continue;
        /* Handling one may have ended another: look each up again. */
        for (struct session_rec *s = t->sessions; s; s = s->next) {
            if (s->chan == pfd[i].fd && (i - from) % 2 == 0) {
                on_channel(t, s);
                break;
            }
            if (s->listener == pfd[i].fd && (i - from) % 2 == 1) {
                if (pfd[i].revents & POLLIN)
                    on_notification(t, s);
                break;
            }
        }
    }
}

static uint64_t next_deadline(const struct session_rec *s)
{
    if (s->ending || !s->ready)
        return 0;
    if (s->recheck_ns)
        return s->recheck_ns;
    if (s->cell && s->cell->announced)
        return 0; /* a cell runs (one made ahead does not count) */
    uint64_t idle = s->idle_since_ns + s->idle_ns;
    uint64_t life = s->opened_ns + s->lifetime_ns;
    return idle < life ? idle : life;
}

int sessions_timeout_ms(struct tmpl *t)
{
    uint64_t soonest = 0, now = now_ns();

    for (struct session_rec *s = t->sessions; s; s = s->next) {
        uint64_t d = next_deadline(s);
        if (d && (!soonest || d < soonest))
            soonest = d;
    }
    if (!soonest)
        return -1;
    if (soonest <= now)
        return 0;
    uint64_t ms = (soonest - now + 999999) / 1000000;
    return ms > 60000 ? 60000 : (int)ms;
}

void sessions_tick(struct tmpl *t)
{
    uint64_t now = now_ns();

    for (struct session_rec *s = t->sessions, *next; s; s = next) {
        next = s->next;
        uint64_t d = next_deadline(s);
        if (!d || d > now)
            continue;
        if (s->recheck_ns && s->cell && s->cell->done && !s->cell->rolled_back) {
            cell_done(t, s, s->cell);
            continue;
        }
        if (s->cell && s->cell->announced)
            continue;
        char why[160];
        if (now >= s->opened_ns + s->lifetime_ns)
            fmt(why, sizeof(why), "the session ended: its lifetime (%llu s) is over",
                (unsigned long long)(s->lifetime_ns / 1000000000ULL));
        else
            fmt(why, sizeof(why), "the session ended: no cell for %llu s",
                (unsigned long long)(s->idle_ns / 1000000000ULL));
        end_session(t, s, why);
    }
}

void sessions_shutdown(struct tmpl *t)
{
    /* After shutdown_workers has killed and reaped every process. */
    while (t->sessions) {
        struct session_rec *s = t->sessions;
        t->sessions = s->next;
        close_fd(&s->chan);
        close_fd(&s->listener);
        close_fd(&s->ws_fd);
        close_fd(&s->saved_fd);
        free(s);
    }
}
