#define _GNU_SOURCE
#include "control.h"

#include "cancel.h"
#include "sbxerr.h"
#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/pidfd.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The template imports its warm set before it answers; on a cold disk cache
 * that can take a while. */
#define TEMPLATE_START_TIMEOUT_MS 60000
/* The descriptor the template finds its control socket on. */
#define TEMPLATE_CTL_FD 3
/* sbx_close gives the template this long to exit by itself. */
#define CLOSE_GRACE_MS 2000
/* A taker looks again at least this often: the template may have been
 * replaced under it. */
#define TAKE_SLICE_NS (100ULL * 1000000ULL)
/* Restarts: the first after this, doubling up to the maximum; that many
 * failures within the window, and the sandbox refuses runs for a window. */
#define RESTART_BACKOFF_FIRST_NS (100ULL * 1000000ULL)
#define RESTART_BACKOFF_MAX_NS   (5ULL * 1000000000ULL)
#define RESTART_WINDOW_NS        (30ULL * 1000000000ULL)
/* Backoffs a session's opening waits out before it gives up. */
#define SESSION_RESTART_TRIES 3
/* How long what a dead template left may take to end (a worker's address
 * space is torn down before it is a zombie: tens of ms), and how often it
 * is looked at meanwhile. */
#define ORPHANS_WAIT_NS (2000ULL * 1000000ULL)
#define ORPHANS_LOOK_NS (2ULL * 1000000ULL)

static json_t *string_array(const char *const *list)
{
    json_t *arr = json_array();

    for (; arr && list && *list; list++)
        if (json_array_append_new(arr, json_string(*list)) < 0) {
            json_decref(arr);
            return NULL;
        }
    return arr;
}

/* The template's configuration, sent as JSON after the message header, with
 * the work directory's descriptor attached. |cfg| has its defaults filled. */
static int send_config(struct sbx *sbx, const struct sbx_config *cfg, struct sbx_error *err)
{
    json_t *o = json_object();
    char *text = NULL;
    char *msg = NULL;
    int rc = -ENOMEM;

    if (!o || json_object_set_new(o, "work_dir", json_string(sbx->work.path)) < 0 ||
        json_object_set_new(o, "pool_size", json_integer(cfg->pool_size)) < 0 ||
        json_object_set_new(o, "warm_modules",
                            cfg->warm_modules ? string_array(cfg->warm_modules)
                            : cfg->single_run ? json_array()
                                              : json_null()) < 0 ||
        json_object_set_new(o, "single_run", json_boolean(cfg->single_run)) < 0 ||
        json_object_set_new(o, "module_dirs", string_array(cfg->module_dirs)) < 0 ||
        json_object_set_new(o, "worker_uid", json_integer(cfg->worker_uid)) < 0 ||
        json_object_set_new(o, "worker_gid", json_integer(cfg->worker_gid)) < 0 ||
        json_object_set_new(o, "worker_ids", json_integer(cfg->worker_ids)) < 0 ||
        json_object_set_new(o, "disable_layers", json_integer(cfg->disable_layers)) < 0 ||
        json_object_set_new(o, "workspace_bytes", json_integer((json_int_t)cfg->workspace_bytes)) <
            0 ||
        json_object_set_new(o, "policy_debug", json_boolean(cfg->policy_debug)) < 0 ||
        (cfg->packages &&
         (json_object_set_new(o, "package_path", json_string(PACKAGES_DIST_DIR)) < 0 ||
          json_object_set_new(o, "package_modules",
                              string_array((const char *const *)sbx->packages.modules)) < 0 ||
          json_object_set_new(o, "package_places",
                              string_array((const char *const *)sbx->packages.places)) < 0 ||
          json_object_set_new(o, "package_links",
                              string_array((const char *const *)sbx->packages.links)) < 0 ||
          (sbx->packages.font_cache &&
           json_object_set_new(o, "font_cache", json_string(sbx->packages.font_cache)) < 0))))
        goto out;
    text = json_dumps(o, JSON_COMPACT);
    if (!text)
        goto out;
    size_t tlen = strlen(text);
    if (tlen > WIRE_CONFIG_TEXT_MAX) {
        rc = sbx_fail(err, SBX_ERR_INVALID_REQUEST, -E2BIG, "configuration too large");
        goto out;
    }
    msg = malloc(sizeof(struct wire_hdr) + tlen);
    if (!msg)
        goto out;
    struct wire_hdr h = {WIRE_CONFIG, WIRE_VERSION};
    memcpy(msg, &h, sizeof(h));
    memcpy(msg + sizeof(h), text, tlen);
    rc = wire_send(sbx->ctl, msg, sizeof(h) + tlen, &sbx->work.fd, 1);
    if (rc < 0)
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "sending the configuration: %s", strerror(-rc));
out:
    if (rc == -ENOMEM)
        sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "out of memory");
    free(msg);
    free(text);
    json_decref(o);
    return rc;
}

static int spawn_template(struct sbx *sbx, const char *path, int child_end, struct sbx_error *err)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    sigset_t none, all;
    char *const argv[] = {"pysbx-template", NULL};
    char *const envp[] = {NULL};
    int rc;

    sigemptyset(&none);
    sigfillset(&all);
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
    /* Only the control socket crosses over; the host's environment, signal
     * handlers and masks stay behind. */
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, child_end, TEMPLATE_CTL_FD);
    posix_spawn_file_actions_addclosefrom_np(&fa, TEMPLATE_CTL_FD + 1);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    /* Its own session: a terminal's ^C for the host does not reach it. */
    posix_spawnattr_setflags(&attr,
                             POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSID);
    /* A fixed layout: this thread's personality, which the child it spawns
     * takes, without address randomization for the exec; back after. */
    int persona = sbx->cfg.fixed_layout ? personality(0xffffffff) : -1;
    if (persona >= 0)
        (void)personality((unsigned long)persona | ADDR_NO_RANDOMIZE);
    rc = posix_spawn(&sbx->template_pid, path, &fa, &attr, argv, envp);
    if (persona >= 0)
        (void)personality((unsigned long)persona);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
        sbx->template_pid = -1;
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -rc,
                        "starting the template %s: %s (give the pysbx-template helper's path: "
                        "--template on the command, sbx_config.template_path in C, or the "
                        "environment variable PYSBX_TEMPLATE)",
                        path, strerror(rc));
    }
    return 0;
}

static int await_hello(struct sbx *sbx, struct sbx_error *err)
{
    union {
        struct wire_hello hello;
        struct wire_fail fail;
    } m;
    struct wire_hello hello;
    char why[WIRE_TEXT_MAX];
    struct pollfd p = {.fd = sbx->ctl, .events = POLLIN};
    int fds[WFD_COUNT];
    int nfds = 0;
    uint64_t until = now_ns() + (uint64_t)TEMPLATE_START_TIMEOUT_MS * 1000000ULL;
    int r;
    ssize_t n;

    /* A signal the host takes meanwhile (an interval timer, say) is no
     * reason to fail: wait out the rest. */
    do {
        uint64_t now = now_ns();
        r = now >= until ? 0 : poll(&p, 1, (int)((until - now + 999999) / 1000000));
    } while (r < 0 && errno == EINTR);

    if (r == 0)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ETIMEDOUT,
                        "the template did not start within %d s", TEMPLATE_START_TIMEOUT_MS / 1000);
    if (r < 0)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -errno, "poll: %s", strerror(errno));
    n = wire_recv(sbx->ctl, &m, sizeof(m), fds, WFD_COUNT, &nfds);
    close_fds(fds, (size_t)nfds);
    if (wire_decode_hello(&m, n < 0 ? 0 : (size_t)n, &hello, why, sizeof(why)) < 0)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -EIO, "%s", why);
    fmt(sbx->python_version, sizeof(sbx->python_version), "%s", hello.python_version);
    fmt(sbx->libseccomp_version, sizeof(sbx->libseccomp_version), "%s", hello.libseccomp_version);
    sbx->workspace_bytes = hello.workspace_bytes;
    for (int i = 0; i < WIRE_LAYERS; i++) {
        sbx->layers[i] = hello.layers[i];
        sbx->layers[i].detail[sizeof(sbx->layers[i].detail) - 1] = '\0';
    }
    return 0;
}

/* Whether this process is where orphans go (pid 1 of its pid namespace, or
 * a subreaper), with /proc of its own namespace to find them in. */
static bool reaper_of_orphans(void)
{
    char link[32], self[32];
    int sub = 0;
    ssize_t n;

    if (getpid() != 1 && (prctl(PR_GET_CHILD_SUBREAPER, &sub) < 0 || !sub))
        return false;
    n = readlink("/proc/self", link, sizeof(link) - 1);
    fmt(self, sizeof(self), "%d", (int)getpid());
    return n > 0 && (size_t)n == strlen(self) && memcmp(link, self, (size_t)n) == 0;
}

/* The inode of |pid|'s pid namespace (0 when it cannot be had). */
static ino_t pid_ns_of(pid_t pid)
{
    char path[64];
    struct stat st;

    fmt(path, sizeof(path), "/proc/%d/ns/pid", (int)pid);
    return stat(path, &st) == 0 ? st.st_ino : 0;
}

/* A template that dies by a signal leaves its children (its keeper, pid 1
 * of its workers' namespace; its helpers; the namespace's processes, which
 * the keeper's end kills) to the nearest subreaper above it, or to pid 1
 * of our namespace. When that is this process (pid 1 of a container, a
 * subreaper), no one else reaps them: the keeper, as an init, ends only
 * once every process of its namespace is reaped, and it and its namespace
 * would live on. So they are reaped here, |tpl| dead and not yet reaped
 * (its pid, the session id of all it made but the workers, is nobody
 * else's until then): our children in its session, and those in its
 * keeper's pid namespace. Bounded: whatever has not ended by then stays. */
static void reap_orphans(pid_t tpl)
{
    uint64_t until = now_ns() + ORPHANS_WAIT_NS;
    ino_t own, theirs = 0;
    pid_t *kids = NULL;
    int cap = 0;

    if (!reaper_of_orphans() || !(own = pid_ns_of(getpid())))
        return;
    for (;;) {
        int n = proc_children(getpid(), NULL, kids, cap, NULL);
        if (n > cap) {
            /* Room for more than counted: children come and go between scans. */
            pid_t *more = realloc(kids, (size_t)n * 2 * sizeof(*kids));
            if (!more || now_ns() >= until) {
                free(more ? more : kids);
                return;
            }
            kids = more;
            cap = n * 2;
            continue;
        }
        bool left = false;
        for (int i = 0; i < n; i++) {
            char name[16];
            struct proc_stat ps;
            if (kids[i] == tpl)
                continue; /* reaped last, by the caller */
            fmt(name, sizeof(name), "%d", (int)kids[i]);
            ino_t ns = pid_ns_of(kids[i]);
            if (proc_stat_read(name, &ps) < 0 || !ns)
                continue; /* gone meanwhile */
            if (ps.session == tpl && ns != own)
                theirs = ns; /* the keeper */
            if (ps.session != tpl && ns != theirs)
                continue;
            if (ps.state != 'Z' || waitpid(kids[i], NULL, WNOHANG) == 0)
                left = true;
        }
        uint64_t now = now_ns();
        if (!left || now >= until)
            break;
        (void)nanosleep(&(struct timespec){.tv_nsec = (long)ORPHANS_LOOK_NS}, NULL);
    }
    free(kids);
}

/* Ends the template: end of stream on its socket (shutdown, so that a copy
 * of the descriptor some forked child of the host still holds does not
 * keep it open) tells it to kill its workers and exit; after |grace_ms| it
 * is killed. Always reaped. */
static void stop_template(struct sbx *sbx, int grace_ms)
{
    if (sbx->ctl >= 0)
        (void)shutdown(sbx->ctl, SHUT_RDWR);
    close_fd(&sbx->ctl);
    if (sbx->template_pid > 0) {
        struct pollfd p = {.fd = sbx->template_pidfd, .events = POLLIN};
        uint64_t until = now_ns() + (uint64_t)grace_ms * 1000000ULL;
        int r = 0;
        while (sbx->template_pidfd >= 0 && grace_ms > 0) {
            uint64_t now = now_ns();
            r = now >= until ? 0 : poll(&p, 1, (int)((until - now + 999999) / 1000000));
            if (r >= 0 || errno != EINTR)
                break;
        }
        if (r != 1)
            (void)kill(sbx->template_pid, SIGKILL);
        siginfo_t si;
        while (waitid(P_PID, (id_t)sbx->template_pid, &si, WEXITED | WNOWAIT) < 0 && errno == EINTR)
            ;
        reap_orphans(sbx->template_pid);
        while (waitpid(sbx->template_pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    sbx->template_pid = -1;
    close_fd(&sbx->template_pidfd);
}

/* Starts a template and waits for its report. On failure nothing of it is
 * left (socket closed, process killed and reaped). */
static int start_template(struct sbx *sbx, struct sbx_error *err)
{
    int sv[2] = {-1, -1};
    int child_end;
    int rc;

    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -errno, "socketpair: %s", strerror(errno));
    sbx->ctl = sv[0];
    /* Keep the child's end off TEMPLATE_CTL_FD, where dup2 would be a no-op
     * that leaves close-on-exec set. */
    child_end = fcntl(sv[1], F_DUPFD_CLOEXEC, TEMPLATE_CTL_FD + 1);
    close(sv[1]);
    if (child_end < 0)
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, -errno, "fcntl: %s", strerror(errno));
    else
        rc = spawn_template(sbx, sbx->template_path, child_end, err);
    close_fd(&child_end);
    if (rc == 0) {
        sbx->template_pidfd = pidfd_open(sbx->template_pid, 0);
        if (sbx->template_pidfd < 0)
            rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, -errno, "pidfd_open: %s", strerror(errno));
    }
    if (rc == 0)
        rc = send_config(sbx, &sbx->cfg, err);
    if (rc == 0)
        rc = await_hello(sbx, err);
    /* Takers poll, then receive without waiting: several may wake for one
     * message, and only one gets it. */
    if (rc == 0 && fcntl(sbx->ctl, F_SETFL, O_NONBLOCK) < 0)
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, -errno, "fcntl: %s", strerror(errno));
    if (rc < 0)
        stop_template(sbx, 0);
    return rc;
}

int control_start(struct sbx *sbx, struct sbx_error *err)
{
    int rc;

    pthread_mutex_lock(&sbx->ctl_lock);
    rc = start_template(sbx, err);
    if (rc == 0)
        sbx->generation++;
    pthread_mutex_unlock(&sbx->ctl_lock);
    return rc;
}

/* How long a lost worker's template may take to be seen gone. */
#define TEMPLATE_LOST_WAIT_MS 2000

/* The template died, or would not start: forget it, and decide when the
 * next may start. Called with ctl_lock held. */
static void template_failed(struct sbx *sbx, const char *why)
{
    uint64_t now = now_ns();
    unsigned recent = 0;

    stop_template(sbx, 0);
    sbx->failures[sbx->n_failures++ % RESTART_BURST] = now;
    for (unsigned i = 0; i < RESTART_BURST && i < sbx->n_failures; i++)
        if (now - sbx->failures[i] < RESTART_WINDOW_NS)
            recent++;
    if (recent >= RESTART_BURST) {
        /* It keeps dying: no restart storm. Refuse at once for a window. */
        sbx->down = true;
        sbx->retry_at = now + RESTART_WINDOW_NS;
        fmt(sbx->why_down, sizeof(sbx->why_down),
            "the template failed %u times within %llu s (last: %s); retrying in %llu s", recent,
            (unsigned long long)(RESTART_WINDOW_NS / 1000000000ULL), why,
            (unsigned long long)(RESTART_WINDOW_NS / 1000000000ULL));
        return;
    }
    uint64_t backoff = RESTART_BACKOFF_FIRST_NS << (recent ? recent - 1 : 0);
    sbx->retry_at = now + (backoff < RESTART_BACKOFF_MAX_NS ? backoff : RESTART_BACKOFF_MAX_NS);
    fmt(sbx->why_down, sizeof(sbx->why_down), "%s", why);
}

/* A template to take workers from: the running one, or a new one once the
 * backoff allows. Called with ctl_lock held. Returns 0, -EAGAIN (not yet:
 * try again at sbx->retry_at), -EHOSTDOWN (down: refuse) or -ESHUTDOWN. */
static int ensure_template(struct sbx *sbx, char *why, size_t whylen)
{
    struct sbx_error err = {0};

    if (sbx->closing)
        return errmsg(why, whylen, -ESHUTDOWN, "the sandbox is closing");
    if (sbx->ctl >= 0)
        return 0;
    if (now_ns() < sbx->retry_at)
        return errmsg(why, whylen, sbx->down ? -EHOSTDOWN : -EAGAIN, "%s", sbx->why_down);
    sbx->down = false;
    if (start_template(sbx, &err) < 0) {
        template_failed(sbx, err.message);
        return errmsg(why, whylen, sbx->down ? -EHOSTDOWN : -EAGAIN, "%s", sbx->why_down);
    }
    sbx->generation++;
    sbx->restarts++;
    return 0;
}

static bool template_dead(const struct sbx *sbx)
{
    struct pollfd p = {.fd = sbx->template_pidfd, .events = POLLIN};

    return sbx->template_pidfd >= 0 && poll(&p, 1, 0) == 1;
}

/* Receives one message, if there is one. Called with ctl_lock held.
 * Returns the length, -EAGAIN (nothing yet), or 0 / -errno (the template
 * is gone). */
static ssize_t receive(struct sbx *sbx, void *m, size_t cap, int *fds, int *nfds)
{
    ssize_t n = wire_recv(sbx->ctl, m, cap, fds, WFD_COUNT, nfds);

    if (n > 0) {
        /* Whatever it was, one of the template's pool is spoken for. */
        struct wire_hdr take = {WIRE_TAKE, WIRE_VERSION};
        (void)wire_send(sbx->ctl, &take, sizeof(take), NULL, 0);
        /* Workers announced by a template that has died since are dead
         * too (they die with it): not worth handing out. */
        if (template_dead(sbx)) {
            close_fds(fds, (size_t)*nfds);
            *nfds = 0;
            return 0;
        }
    }
    return n;
}

int control_take_worker(struct sbx *sbx, const struct sbx_cancel *cancel, uint64_t deadline,
                        struct taken_worker *w, char *why, size_t whylen)
{
    union wire_worker_reply m;
    struct wire_worker worker;
    int nfds = 0;
    ssize_t n = -EAGAIN;
    unsigned taken_from = 0;

    for (int i = 0; i < WFD_COUNT; i++)
        w->fds[i] = -1;
    for (;;) {
        pthread_mutex_lock(&sbx->ctl_lock);
        int rc = ensure_template(sbx, why, whylen);
        uint64_t wake = rc == -EAGAIN ? sbx->retry_at : 0;
        int ctl = sbx->ctl, pidfd = sbx->template_pidfd;
        taken_from = sbx->generation;
        if (rc == 0) {
            memset(&m, 0, sizeof(m));
            n = receive(sbx, &m, sizeof(m), w->fds, &nfds);
            if (n == 0 || (n < 0 && n != -EAGAIN))
                template_failed(sbx, "the template process ended");
        }
        pthread_mutex_unlock(&sbx->ctl_lock);
        if (rc < 0 && rc != -EAGAIN)
            return rc;
        if (rc == 0 && n > 0)
            break;
        /* Nothing yet: wait for a message, the template's end, the caller's
         * cancellation, its deadline, or (after a failure) the backoff. */
        uint64_t now = now_ns();
        if (sbx_cancel_fired(cancel))
            return errmsg(why, whylen, -ECANCELED, "cancelled while waiting for a worker");
        if (now >= deadline)
            return errmsg(why, whylen, -ETIMEDOUT, "no worker ready in time");
        uint64_t until = deadline;
        if (wake && wake < until)
            until = wake;
        if (until - now > TAKE_SLICE_NS)
            until = now + TAKE_SLICE_NS; /* the template may change under us */
        struct pollfd p[3] = {
            {.fd = rc == 0 && n != 0 ? ctl : -1, .events = POLLIN},
            {.fd = rc == 0 ? pidfd : -1, .events = POLLIN},
            {.fd = cancel_fd(cancel), .events = POLLIN},
        };
        (void)poll(p, 3, (int)((until - now + 999999) / 1000000));
    }

    int rc = wire_decode_worker(&m, (size_t)n, nfds, &worker, why, whylen);
    if (rc < 0) {
        close_fds(w->fds, WFD_COUNT);
        return rc;
    }
    control_taken(w, &worker);
    w->generation = taken_from;
    return 0;
}

void control_template_lost(struct sbx *sbx, unsigned generation)
{
    pthread_mutex_lock(&sbx->ctl_lock);
    if (sbx->generation == generation && sbx->ctl >= 0) {
        struct pollfd p = {.fd = sbx->template_pidfd, .events = POLLIN};
        (void)poll(&p, 1, TEMPLATE_LOST_WAIT_MS);
        if (template_dead(sbx))
            template_failed(sbx, "the template process ended");
    }
    pthread_mutex_unlock(&sbx->ctl_lock);
}

void control_taken(struct taken_worker *w, const struct wire_worker *m)
{
    w->pid = m->pid;
    w->uid = m->uid;
    w->gid = m->gid;
    fmt(w->workspace, sizeof(w->workspace), "%s", m->workspace);
}

int control_open_session(struct sbx *sbx, const struct wire_session_open *m, int chan,
                         int *template_pidfd, char *why, size_t whylen)
{
    int rc = -EAGAIN;

    pthread_mutex_lock(&sbx->ctl_lock);
    /* Takers notice a dead template when its socket ends; look first. */
    if (sbx->ctl >= 0 && template_dead(sbx))
        template_failed(sbx, "the template process ended");
    /* A restart after its backoff, as a taker would wait for it; and a
     * template that died before we saw it go refuses the message: the
     * next one gets it. */
    for (int i = 0; i <= SESSION_RESTART_TRIES; i++) {
        rc = ensure_template(sbx, why, whylen);
        if (rc == 0) {
            rc = wire_send(sbx->ctl, m, sizeof(*m), &chan, 1);
            if (rc == 0)
                break;
            errmsg(why, whylen, rc, "the template does not listen: %s", strerror(-rc));
            template_failed(sbx, "the template process ended");
            rc = -EAGAIN;
        }
        if (rc != -EAGAIN || i == SESSION_RESTART_TRIES)
            break;
        uint64_t now = now_ns(), at = sbx->retry_at;
        pthread_mutex_unlock(&sbx->ctl_lock);
        if (at > now)
            (void)nanosleep(&(struct timespec){.tv_sec = (time_t)((at - now) / 1000000000ULL),
                                               .tv_nsec = (long)((at - now) % 1000000000ULL)},
                            NULL);
        pthread_mutex_lock(&sbx->ctl_lock);
    }
    if (rc == -EAGAIN)
        rc = -EHOSTDOWN;
    if (rc == 0) {
        *template_pidfd = fcntl(sbx->template_pidfd, F_DUPFD_CLOEXEC, 0);
        if (*template_pidfd < 0)
            rc = errmsg(why, whylen, -errno, "dup: %s", strerror(errno));
    }
    pthread_mutex_unlock(&sbx->ctl_lock);
    return rc;
}

int control_health(struct sbx *sbx, struct sbx_health *h)
{
    pthread_mutex_lock(&sbx->ctl_lock);
    /* A dead template is let go of at once (and what it left reaped): a
     * host may look at its health long before it runs anything again. */
    if (sbx->ctl >= 0 && template_dead(sbx))
        template_failed(sbx, "the template process ended");
    h->ready = sbx->ctl >= 0 && !template_dead(sbx);
    h->restarts = sbx->restarts;
    /* Announced workers wait on the socket as one message each: the bytes
     * queued there (SIOCINQ counts a whole SOCK_SEQPACKET queue) say how
     * many. */
    int queued = 0;
    h->idle = h->ready && ioctl(sbx->ctl, SIOCINQ, &queued) == 0 && queued > 0
                  ? (unsigned)((size_t)queued / sizeof(struct wire_worker))
                  : 0;
    fmt(h->reason, sizeof(h->reason), "%s", h->ready ? "" : sbx->why_down);
    if (!h->ready && !h->reason[0])
        fmt(h->reason, sizeof(h->reason), "the template process ended; the next run restarts it");
    pthread_mutex_unlock(&sbx->ctl_lock);
    return 0;
}

void control_stop(struct sbx *sbx)
{
    pthread_mutex_lock(&sbx->ctl_lock);
    __atomic_store_n(&sbx->closing, true, __ATOMIC_RELEASE);
    stop_template(sbx, CLOSE_GRACE_MS);
    pthread_mutex_unlock(&sbx->ctl_lock);
}
