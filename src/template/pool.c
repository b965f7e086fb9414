/*
 * The template's loop: keep |pool_size| workers idle and announced, fork a
 * replacement when one is taken, and reap each worker, sending its exit
 * status and resource use to the supervisor.
 */
#define _GNU_SOURCE
#include "interp.h"
#include "packages.h"
#include "profile.h"
#include "root.h"
#include "sysutil.h"
#include "template.h"
#include "util.h"
#include "worker.h"
#include "workspace.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void template_send_fail(struct tmpl *t, const char *text)
{
    struct wire_fail m = {.hdr = {WIRE_FAIL, WIRE_VERSION}};

    fmt(m.text, sizeof(m.text), "%s", text);
    (void)wire_send(t->ctl, &m, sizeof(m), NULL, 0);
}

static void close_sup_fds(struct worker_rec *w)
{
    close_fds(w->sup_fds, WFD_COUNT);
}

struct worker_rec *worker_new(struct tmpl *t)
{
    struct worker_rec *w = calloc(1, sizeof(*w));

    if (!w)
        return NULL;
    for (int i = 0; i < WFD_COUNT; i++)
        w->sup_fds[i] = -1;
    w->ready_fd = w->status_fd = w->mnt_ns_fd = -1;
    w->out_watch[0] = w->out_watch[1] = -1;
    w->id = ++t->next_id;
    return w;
}

/* PYSBX_PROFILE builds: the last worker's making, for the next one. */
static struct prof_spawn last_spawn;

struct worker_rec *spawn_process(struct tmpl *t, struct session_rec *sess, char *why, size_t whylen)
{
    double spawn_start = prof_now();
    struct worker_rec *w = worker_new(t);
    int req[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
    int status[2] = {-1, -1}, ready[2] = {-1, -1};
    int ws = -1, ws_mount = -1, ruleset = -1;
    char path[4096];
    pid_t pid;

    if (!w) {
        errmsg(why, whylen, -ENOMEM, "template: out of memory");
        return NULL;
    }
    if (uids_take(&t->uids, t->base_fd, &w->slot, &w->uid, &w->gid, w->name, sizeof(w->name)) < 0) {
        free(w);
        errmsg(why, whylen, -EAGAIN,
               "template: no free worker id: every one is held by a worker or "
               "its workspace is not yet removed (raise worker_ids)");
        return NULL;
    }
    fmt(path, sizeof(path), "%s/%s", t->base_path, w->name);

    /* A session's process talks over a socket (descriptors go both ways,
     * and the kernel says which process sent what); it has no pipes of its
     * own: each cell brings its own. */
    if (sess ? socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ready) < 0 ||
                   setsockopt(ready[0], SOL_SOCKET, SO_PASSCRED, &(int){1}, sizeof(int)) < 0
             : socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, req) < 0 ||
                   pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0 ||
                   pipe2(status, O_CLOEXEC) < 0 || pipe2(ready, O_CLOEXEC) < 0) {
        fmt(why, whylen, "template: making a worker's pipes: %s", strerror(errno));
        goto fail;
    }
    if (t->root) {
        /* A tmpfs mounted nowhere: no directory to make on the disk, none
         * to sweep, no mount in our namespace for each worker to copy. */
        ws_mount = workspace_mount_detached(&t->jail, w->uid, w->gid, why, whylen);
        if (ws_mount < 0)
            goto fail;
        ws = openat(ws_mount, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } else {
        if (workspace_make(&t->jail, w->uid, w->gid, t->base_fd, w->name, path, why, whylen) < 0)
            goto fail;
        /* By path, in our own mount namespace: through the supervisor's
         * descriptor, the lookup would stay in the host's and find the
         * directory under the tmpfs instead of the tmpfs. */
        ws = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (ws < 0) {
        fmt(why, whylen, "template: opening workspace %s: %s",
            t->root ? "(a detached tmpfs)" : path, strerror(errno));
        goto fail;
    }
    if (t->landlock > 0) {
        ruleset = landlock_ruleset_for(&t->ll_base, ws, why, whylen);
        if (ruleset < 0)
            goto fail;
    }
    double fork_start = prof_now();
    prof_set_spawn(&last_spawn); /* inherited by the child */
    pid = interp_fork(sess ? NULL : &t->prefault, sess ? session_cgroup(sess) : NULL);
    last_spawn.fork_us = prof_now() - fork_start;
    if (pid < 0) {
        fmt(why, whylen, "template: fork: %s", strerror(errno));
        goto fail;
    }
    if (pid == 0) {
        /* The private root names the worker's uid; the host's does not. */
        char user[32] = "sandbox";
        if (t->root)
            root_user_name(user, sizeof(user), t->jail.uid_per_run,
                           t->jail.switch_user ? (unsigned)(w->uid - t->jail.uid_base) : 0);
        struct worker_args a = {
            .ppid = t->pid_ns ? 0 : t->pid,
            .req_fd = sess ? t->devnull : req[1],
            .out_fd = sess ? t->devnull : out[1],
            .err_fd = sess ? t->devnull : err[1],
            .ready_fd = ready[1],
            .ws_fd = ws,
            .devnull_fd = t->devnull,
            .ws_path = t->root ? WORKSPACE_MOUNT : path,
            .ws_mount_fd = ws_mount,
            .user = user,
            .late = t->single_run && t->pkg_path && !sess ? packages_in_worker : NULL,
            .late_arg = t,
            .rehearse = !t->single_run && !sess,
            .warm_code = t->pkg_path && !t->single_run && !sess ? packages_worker_warm_up : NULL,
            /* Where the teardown is milliseconds (a package template's
             * address space): there the holder took 4 ms off a chart
             * run's answer, for 0.3 ms of CPU. For the default template's
             * 0.75 ms exit it cost more CPU (its fork and its own exit)
             * than the 0.4 ms of latency it saved was worth against the
             * throughput of a full machine. */
            .hold_exit = t->pid_ns && t->pkg_path && !t->single_run && !sess,
            .session = sess != NULL,
            .plan =
                {
                    .switch_user = t->jail.switch_user,
                    .ppid = t->pid_ns ? 0 : t->pid,
                    .uid = w->uid,
                    .gid = w->gid,
                    .landlock_abi = t->landlock,
                    .ruleset_fd = ruleset,
                    .policy = sess         ? &t->session_policy
                              : t->seccomp ? &t->policy
                                           : NULL,
                    .policy_debug = t->policy_debug,
                },
        };
        worker_main(&a);
    }
    close_fd(&ruleset);
    close_fd(&ws_mount); /* the worker's copy keeps it until it is mounted */
    w->pid = pid;
    w->session = sess;
    if (sess) {
        struct stat st;
        w->chan_ino = fstat(ready[1], &st) == 0 ? st.st_ino : 0;
    }
    close_fd(&ready[1]);
    w->ready_fd = ready[0];
    if (sess) {
        /* The session keeps its workspace; the worker's slot is its. */
        session_adopt(sess, w, ws);
        goto linked;
    }
    close(req[1]);
    close(out[1]);
    close(err[1]);
    w->sup_fds[WFD_REQUEST] = req[0];
    w->sup_fds[WFD_STDOUT] = out[0];
    w->sup_fds[WFD_STDERR] = err[0];
    w->sup_fds[WFD_STATUS] = status[0];
    w->sup_fds[WFD_WORKSPACE] = ws;
    w->status_fd = status[1];
    w->sup_fds[WFD_PIDFD] = pidfd_open(pid, 0);
    if (w->sup_fds[WFD_PIDFD] < 0) {
        /* The supervisor could not kill it safely: do not hand it out. */
        fmt(why, whylen, "template: pidfd_open: %s", strerror(errno));
        kill(pid, SIGKILL);
        template_send_fail(t, why);
        w->announced = true;
        close_sup_fds(w);
    }
linked:
    w->next = t->workers;
    t->workers = w;
    t->n_workers++;
    last_spawn.spawn_us = prof_now() - spawn_start;
    return w;

fail:
    close_fds(req, 2);
    close_fds(out, 2);
    close_fds(err, 2);
    close_fds(status, 2);
    close_fds(ready, 2);
    if (ws >= 0 && !t->root) {
        if (t->jail.mount_ns)
            sweeper_release(&t->sweeper, w->name);
        else
            (void)unlinkat(t->base_fd, w->name, AT_REMOVEDIR);
    }
    close_fd(&ws);
    close_fd(&ws_mount);
    close_fd(&ruleset);
    uids_release(&t->uids, w->slot);
    free(w);
    return NULL;
}

static void spawn_worker(struct tmpl *t)
{
    char why[256];

    t->outstanding++;
    if (!spawn_process(t, NULL, why, sizeof(why)))
        template_send_fail(t, why);
}

/* Brings the workers not yet taken (ready or getting ready) up to |to|. */
static void refill(struct tmpl *t, unsigned to)
{

    while (t->outstanding < to)
        spawn_worker(t);
}

static void announce(struct tmpl *t, struct worker_rec *w)
{
    struct wire_worker m = {.hdr = {WIRE_WORKER, WIRE_VERSION}, .pid = w->pid};

    if (t->jail.switch_user) {
        m.uid = w->uid;
        m.gid = w->gid;
    }

    fmt(m.workspace, sizeof(m.workspace), "%s", w->name);
    if (wire_send(t->ctl, &m, sizeof(m), w->sup_fds, WFD_COUNT) < 0)
        kill(w->pid, SIGKILL); /* nobody to hand it to */
    w->announced = true;
    close_sup_fds(w);
}

/* A worker that could not get ready: pass on what it said, if anything. */
static void report_setup_failure(struct tmpl *t, struct worker_rec *w, const char *said)
{
    char why[WIRE_TEXT_MAX];

    if (said && *said)
        fmt(why, sizeof(why), "worker setup failed: %s", said);
    else
        fmt(why, sizeof(why), "worker %d ended while getting ready", (int)w->pid);
    template_send_fail(t, why);
    w->announced = true;
    close_sup_fds(w);
}

/* The worker's user code starts now: arm its CPU limit, a timer on its
 * CPU clock (all its threads) that only we hold. It fires at the CPU time
 * the worker had used when it said so, plus its limit. */
void arm_cpu_limit(struct worker_rec *w, const struct wire_started *st)
{
    struct sigevent sev = {
        .sigev_notify = SIGEV_SIGNAL,
        .sigev_signo = TEMPLATE_CPU_SIGNAL,
        .sigev_value = {.sival_int = w->pid},
    };
    uint64_t at = st->cpu_used_ns + st->cpu_limit_ns;
    struct itimerspec its = {
        .it_value = {.tv_sec = (time_t)(at / 1000000000ULL), .tv_nsec = (long)(at % 1000000000ULL)},
    };
    clockid_t clock;

    if (w->dead || w->has_timer)
        return;
    /* The wall limit, from now on the monotonic clock. */
    struct sigevent wsev = sev;
    struct itimerspec wits = {
        .it_value = {.tv_sec = (time_t)(st->wall_limit_ns / 1000000000ULL),
                     .tv_nsec = (long)(st->wall_limit_ns % 1000000000ULL)},
    };
    wsev.sigev_signo = TEMPLATE_WALL_SIGNAL;
    if (st->wall_limit_ns && timer_create(CLOCK_MONOTONIC, &wsev, &w->wall_timer) == 0) {
        w->has_wall_timer = true;
        (void)timer_settime(w->wall_timer, 0, &wits, NULL);
    }
    if (clock_getcpuclockid(w->pid, &clock) == 0 && timer_create(clock, &sev, &w->timer) == 0) {
        w->has_timer = true;
        if (timer_settime(w->timer, TIMER_ABSTIME, &its, NULL) == 0)
            return;
    }
    /* No limit we can keep: the run must not go on without one. */
    w->limit_lost = true;
    kill(w->pid, SIGKILL);
}

/* A ready worker under the private root has a mount namespace of its own
 * (its workspace is attached there). Its last reference going at the
 * worker's exit would unmount the lot, and an unmount waits for an
 * expedited RCU grace period, all before wait4() can see the exit: hold
 * one until the status is sent (forget_worker). Read while the worker has
 * run nothing of a request: it is the worker's. Best effort. */
static void hold_mount_ns(struct tmpl *t, struct worker_rec *w)
{
    char path[48];

    if (!t->root || !t->proc_ok || w->mnt_ns_fd >= 0)
        return;
    fmt(path, sizeof(path), "%d/ns/mnt", (int)w->pid);
    w->mnt_ns_fd = openat(t->proc_fd, path, O_RDONLY | O_CLOEXEC);
}

/* Reads what the worker wrote on its ready pipe. */
static void on_ready(struct tmpl *t, struct worker_rec *w)
{
    char buf[WIRE_TEXT_MAX];
    ssize_t n = read(w->ready_fd, buf, sizeof(buf) - 1);

    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        close_fd(&w->ready_fd);
        if (!w->announced)
            report_setup_failure(t, w, NULL);
        return;
    }
    buf[n] = '\0';
    for (ssize_t i = 0; i < n; i++) {
        if (buf[i] == WORKER_READY && !w->announced) {
            /* Ready and idle: the pages it copied are what every worker
             * copies. Learn them once (see prefault.h). */
            if (t->prefault.recorded == 0 && !t->single_run && t->proc_ok)
                (void)prefault_record(t->proc_fd, w->pid, 0, PREFAULT_WRITTEN, &t->prefault);
            hold_mount_ns(t, w);
            announce(t, w);
        } else if (buf[i] == WORKER_STARTED && !w->started) {
            struct wire_started st;
            w->started = true;
            /* Written in one piece, under PIPE_BUF: here whole, or the
             * worker is not one of ours. */
            if (n - i - 1 < (ssize_t)sizeof(st)) {
                w->limit_lost = true;
                kill(w->pid, SIGKILL);
                close_fd(&w->ready_fd);
                return;
            }
            memcpy(&st, buf + i + 1, sizeof(st));
            i += (ssize_t)sizeof(st);
            w->setup_cpu_ns = st.cpu_used_ns;
            arm_cpu_limit(w, &st);
        } else if (buf[i] == WORKER_FAILED) {
            if (!w->announced)
                report_setup_failure(t, w, buf + i + 1);
            close_fd(&w->ready_fd);
            return;
        }
    }
}

/* A worker's CPU or wall timer fired: its code has had its time. */
static void on_timer(struct tmpl *t, pid_t pid, bool wall)
{
    for (struct worker_rec *w = t->workers; w; w = w->next)
        if (w->pid == pid && !w->dead) {
            if (wall)
                w->wall_killed = true;
            else
                w->cpu_killed = true;
            kill(pid, SIGKILL); /* our child, not yet reaped: the pid is its */
            return;
        }
}

void disarm_limits(struct worker_rec *w)
{
    if (w->has_timer)
        timer_delete(w->timer);
    if (w->has_wall_timer)
        timer_delete(w->wall_timer);
    w->has_timer = w->has_wall_timer = false;
}

void forget_worker(struct tmpl *t, struct worker_rec *w)
{
    disarm_limits(w);
    close_fds(w->out_watch, 2);
    close_fd(&w->ready_fd);
    close_fd(&w->status_fd);
    close_sup_fds(w);
    close_fd(&w->mnt_ns_fd); /* its namespace goes now, if it was the last */
    if (!w->session)
        uids_release(&t->uids, w->slot);
    t->n_workers--;
    free(w);
}

struct wire_status status_of(const struct worker_rec *w, int wait_status, const struct rusage *ru)
{
    /* The run's CPU, not the worker's getting ready (a package worker's
     * warm-up is tens of milliseconds): what the clock said as the code
     * started comes off, user time first. */
    int64_t utime = timeval_us(ru->ru_utime), stime = timeval_us(ru->ru_stime);
    int64_t setup = (int64_t)(w->setup_cpu_ns / 1000);
    int64_t from_user = setup < utime ? setup : utime;
    utime -= from_user;
    stime -= setup - from_user < stime ? setup - from_user : stime;
    return (struct wire_status){
        .magic = WIRE_STATUS_MAGIC,
        .wait_status = wait_status,
        .started = w->started,
        .flags = (w->cpu_killed ? WIRE_STATUS_CPU_KILLED : 0) |
                 (w->limit_lost ? WIRE_STATUS_LIMIT_LOST : 0) |
                 (w->wall_killed ? WIRE_STATUS_WALL_KILLED : 0),
        .utime_us = utime,
        .stime_us = stime,
        .maxrss_kb = ru->ru_maxrss,
    };
}

/* The session's processes the kernel now reports stopped (waitid with
 * WSTOPPED consumes the report: what it said is kept in stop_seen until
 * the process is let run again), or continued while we hold them stopped
 * (by a SIGCONT of their own making: the template's own continue is taken
 * as it is sent). */
static void sessions_seen_stopped(struct tmpl *t)
{
    bool again = true;

    while (again) {
        again = false;
        for (struct worker_rec *w = t->workers; w; w = w->next) {
            if (!w->session || !w->stop_sent || w->dead || !w->pid)
                continue;
            siginfo_t si = {0};
            if (waitid(P_PID, (id_t)w->pid, &si, WSTOPPED | WCONTINUED | WNOHANG) < 0 ||
                si.si_pid != w->pid)
                continue;
            if (si.si_code == CLD_STOPPED && !w->stop_seen) {
                w->stop_seen = true;
                session_stopped(t, w); /* may change the list: start over */
            } else if (si.si_code == CLD_CONTINUED)
                session_continued(t, w);
            else
                continue;
            again = true;
            break;
        }
    }
}

static void reap(struct tmpl *t)
{
    struct signalfd_siginfo si;
    bool reaped = false;

    while (read(t->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
        if ((int)si.ssi_signo == TEMPLATE_CPU_SIGNAL || (int)si.ssi_signo == TEMPLATE_WALL_SIGNAL)
            on_timer(t, (pid_t)si.ssi_int, (int)si.ssi_signo == TEMPLATE_WALL_SIGNAL);
    for (;;) {
        struct rusage ru;
        int st;
        pid_t pid = wait4(-1, &st, WNOHANG, &ru);
        if (pid <= 0)
            break;
        if (pid == t->keeper.pid) {
            /* The pid namespace died with it, and every worker in it. */
            t->keeper_gone = true;
            t->keeper.pid = -1;
            continue;
        }
        if (copier_reaped(t, pid))
            continue;
        if (pid == t->claim.holder) {
            /* Another sandbox could claim our ids now: a new template will
             * claim a range of its own. */
            t->claim_lost = true;
            t->claim.holder = -1;
            continue;
        }
        struct worker_rec **pp = &t->workers;
        while (*pp && (*pp)->pid != pid)
            pp = &(*pp)->next;
        struct worker_rec *w = *pp;
        if (!w)
            continue; /* a child of a session's the kernel listed, or killed */
        w->dead = true;
        if (w->session) {
            *pp = w->next;
            session_reaped(t, w, st, &ru);
            continue;
        }
        /* What it wrote before it ended is still in the pipe. */
        if (w->ready_fd >= 0) {
            fcntl(w->ready_fd, F_SETFL, O_NONBLOCK);
            while (w->ready_fd >= 0)
                on_ready(t, w);
        }
        if (!w->announced)
            report_setup_failure(t, w, NULL);
        struct wire_status s = status_of(w, st, &ru);
        (void)write_full(w->status_fd, &s, sizeof(s));
        close_fd(&w->status_fd);
        close_sup_fds(w);
        /* After the status: the supervisor is waiting for that, not this. */
        sweeper_release(&t->sweeper, w->name);
        reaped = true;
        *pp = w->next;
        forget_worker(t, w);
    }
    sessions_seen_stopped(t);
    /* A run just ended: now is the time to replace the workers taken. */
    if (reaped && !t->single_run)
        refill(t, t->pool_size);
}

static void on_control(struct tmpl *t, bool *stop)
{
    union {
        struct wire_hdr h;
        struct wire_session_open open;
    } m;
    int fd;
    ssize_t n = wire_recv_one(t->ctl, &m, sizeof(m), &fd);

    if (n == (ssize_t)sizeof(m.open) && m.h.type == WIRE_SESSION_OPEN && fd >= 0) {
        session_open(t, &m.open, fd); /* the channel is its now */
        return;
    }
    close_fd(&fd);
    if (n == -EINTR || n == -EAGAIN)
        return;
    if (n <= 0) {
        *stop = true; /* the supervisor is gone or closed us */
        return;
    }
    if (n == (ssize_t)sizeof(m.h) && m.h.type == WIRE_TAKE && t->outstanding > 0)
        t->outstanding--;
    /* Forking a replacement costs a worker's whole setup in CPU; done now,
     * it competes with the run that just took a worker. While at least half
     * the pool is ready, wait for a run to end (reap) instead. */
    if (!t->single_run)
        refill(t, (t->pool_size + 1) / 2);
}

static void shutdown_workers(struct tmpl *t)
{
    /* pid 0: a session's cell asked for and not yet made (kill(0) would
     * be our own group). */
    for (struct worker_rec *w = t->workers; w; w = w->next)
        if (w->pid > 0)
            kill(w->pid, SIGKILL);
    while (t->workers) {
        struct worker_rec *w = t->workers;
        if (w->pid > 0)
            waitpid(w->pid, NULL, 0);
        t->workers = w->next;
        forget_worker(t, w);
    }
    sessions_shutdown(t);
}

void pool_run(struct tmpl *t)
{
    struct pollfd *pfd = NULL;
    uint64_t *who = NULL; /* the id of the worker or session each slot is for */
    size_t cap = 0;
    bool stop = false;

    refill(t, t->pool_size);
    while (!stop) {
        nfds_t n = 0;

        /* Every worker's ready pipe, however large the pool, and what the
         * sessions wait on. */
        size_t need = t->n_workers + 2 + sessions_fd_count(t);
        if (cap < need) {
            size_t c = need + 16;
            struct pollfd *p = realloc(pfd, c * sizeof(*pfd));
            uint64_t *q = p ? realloc(who, c * sizeof(*who)) : NULL;
            if (p)
                pfd = p;
            if (!q)
                break; /* out of memory: stop, killing the workers */
            who = q;
            cap = c;
        }
        pfd[n++] = (struct pollfd){.fd = t->ctl, .events = POLLIN};
        pfd[n++] = (struct pollfd){.fd = t->sigfd, .events = POLLIN};
        for (struct worker_rec *w = t->workers; w && n < cap; w = w->next) {
            if (w->ready_fd < 0 || !session_heard(w))
                continue;
            who[n] = w->id;
            pfd[n++] = (struct pollfd){.fd = w->ready_fd, .events = POLLIN};
        }
        nfds_t first_session = n;
        n = (nfds_t)sessions_poll_fds(t, pfd, who, n, cap);
        int polled = poll(pfd, n, sessions_timeout_ms(t));
        if (polled < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (polled > 0)
            t->busy_ns = now_ns();
        /* Reaping first: it is what a waiting supervisor is blocked on. */
        if (pfd[1].revents)
            reap(t);
        for (nfds_t i = 2; i < first_session; i++) {
            if (!pfd[i].revents)
                continue;
            /* reap() may have freed it; look it up again, by its id (its
             * address and descriptor number may be another's now). What
             * it says may free it (or others): nothing of the list is read
             * after. */
            for (struct worker_rec *w = t->workers; w; w = w->next)
                if (w->id == who[i] && w->ready_fd == pfd[i].fd) {
                    w->session ? session_said(t, w) : on_ready(t, w);
                    break;
                }
        }
        sessions_handle(t, pfd, who, first_session, n);
        sessions_tick(t, polled == 0);
        if (t->keeper_gone || t->claim_lost)
            break;
        if (pfd[0].revents)
            on_control(t, &stop);
    }
    free(pfd);
    free(who);
    shutdown_workers(t);
}
