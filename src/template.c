/*
 * pysbx-template: the process in which CPython is initialised, once, and from
 * which every worker is forked. It never runs user code and holds nothing of
 * the host: the supervisor starts it by exec with an empty environment and
 * only the control socket open (as descriptor 3).
 *
 * It is single-threaded, and its loop is short: keep |pool_size| workers
 * idle and announced, fork a replacement each time one is taken, and reap
 * each worker, sending its exit status and resource use to the supervisor.
 */
#define _GNU_SOURCE
#include "jail.h"
#include "landlock.h"
#include "policy.h"
#include "prefault.h"
#include "pyhost.h"
#include "pysbx.h"
#include "sysutil.h"
#include "util.h"
#include "wire.h"
#include "worker.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define CTL_FD 3
#define MAX_POLL 256

struct worker_rec {
    struct worker_rec *next;
    pid_t pid;
    uint32_t id;
    int ready_fd;           /* read end of the worker's ready pipe */
    int status_fd;          /* write end of the supervisor's status pipe */
    int sup_fds[WFD_COUNT]; /* the supervisor's ends, held until announced */
    bool announced;         /* a WORKER or FAIL message was sent for it */
    bool started;
    char name[WIRE_NAME_MAX];
};

struct tmpl {
    int ctl;
    int sigfd;
    int base_fd;
    int devnull;
    pid_t pid;
    char *base_path;
    unsigned pool_size;
    unsigned outstanding; /* messages not yet taken + workers getting ready */
    uint32_t next_id;
    struct worker_rec *workers;
    char **warm;
    char **module_dirs;
    long uid, gid;
    uint64_t workspace_bytes;
    bool policy_debug;
    /* The confinement every worker gets, decided once. */
    struct jail jail;
    struct policy policy;
    bool seccomp;
    char seccomp_why[192];
    int landlock;      /* ABI, or <= 0 */
    char landlock_why[192];
    struct landlock_base ll_base;
    struct prefault prefault; /* learnt from the first worker to get ready */
};

static void send_fail(struct tmpl *t, const char *text)
{
    struct wire_fail m = {.hdr = {WIRE_FAIL, WIRE_VERSION}};

    fmt(m.text, sizeof(m.text), "%s", text);
    (void)wire_send(t->ctl, &m, sizeof(m), NULL, 0);
}

static void close_sup_fds(struct worker_rec *w)
{
    for (int i = 0; i < WFD_COUNT; i++)
        close_fd(&w->sup_fds[i]);
}

static void spawn_worker(struct tmpl *t)
{
    struct worker_rec *w = calloc(1, sizeof(*w));
    int req[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
    int status[2] = {-1, -1}, ready[2] = {-1, -1};
    int ws = -1, ruleset = -1;
    char path[4096];
    char why[256];
    pid_t pid;

    t->outstanding++;
    if (!w) {
        send_fail(t, "template: out of memory");
        return;
    }
    for (int i = 0; i < WFD_COUNT; i++)
        w->sup_fds[i] = -1;
    w->ready_fd = w->status_fd = -1;
    w->id = t->next_id++;
    fmt(w->name, sizeof(w->name), "w%u", w->id);
    fmt(path, sizeof(path), "%s/%s", t->base_path, w->name);

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, req) < 0 ||
        pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0 ||
        pipe2(status, O_CLOEXEC) < 0 || pipe2(ready, O_CLOEXEC) < 0) {
        fmt(why, sizeof(why), "template: making a worker's pipes: %s", strerror(errno));
        goto fail;
    }
    if (jail_workspace(&t->jail, t->base_fd, w->name, path, why, sizeof(why)) < 0)
        goto fail;
    /* By path, in our own mount namespace: through the supervisor's
     * descriptor, the lookup would stay in the host's and find the
     * directory under the tmpfs instead of the tmpfs. */
    ws = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (ws < 0) {
        fmt(why, sizeof(why), "template: opening workspace %s: %s", path, strerror(errno));
        goto fail;
    }
    if (t->landlock > 0) {
        ruleset = landlock_ruleset_for(&t->ll_base, ws, why, sizeof(why));
        if (ruleset < 0)
            goto fail;
    }
    pid = pyhost_fork(&t->prefault);
    if (pid < 0) {
        fmt(why, sizeof(why), "template: fork: %s", strerror(errno));
        goto fail;
    }
    if (pid == 0) {
        struct worker_args a = {
            .template_pid = t->pid,
            .req_fd = req[1],
            .out_fd = out[1],
            .err_fd = err[1],
            .ready_fd = ready[1],
            .ws_fd = ws,
            .devnull_fd = t->devnull,
            .ws_path = path,
            .plan = {
                .switch_user = t->jail.switch_user,
                .uid = t->jail.uid,
                .gid = t->jail.gid,
                .landlock_abi = t->landlock,
                .ruleset_fd = ruleset,
                .policy = t->seccomp ? &t->policy : NULL,
                .policy_debug = t->policy_debug,
            },
        };
        worker_main(&a);
    }
    close_fd(&ruleset);
    w->pid = pid;
    close(req[1]);
    close(out[1]);
    close(err[1]);
    close(ready[1]);
    w->sup_fds[WFD_REQUEST] = req[0];
    w->sup_fds[WFD_STDOUT] = out[0];
    w->sup_fds[WFD_STDERR] = err[0];
    w->sup_fds[WFD_STATUS] = status[0];
    w->sup_fds[WFD_WORKSPACE] = ws;
    w->status_fd = status[1];
    w->ready_fd = ready[0];
    w->sup_fds[WFD_PIDFD] = pidfd_open(pid, 0);
    if (w->sup_fds[WFD_PIDFD] < 0) {
        /* The supervisor could not kill it safely: do not hand it out. */
        fmt(why, sizeof(why), "template: pidfd_open: %s", strerror(errno));
        kill(pid, SIGKILL);
        send_fail(t, why);
        w->announced = true;
        close_sup_fds(w);
    }
    w->next = t->workers;
    t->workers = w;
    return;

fail:
    for (int i = 0; i < 2; i++) {
        close_fd(&req[i]);
        close_fd(&out[i]);
        close_fd(&err[i]);
        close_fd(&status[i]);
        close_fd(&ready[i]);
    }
    if (ws >= 0) {
        if (t->jail.mount_ns)
            jail_workspace_release(&t->jail, w->name);
        else
            (void)unlinkat(t->base_fd, w->name, AT_REMOVEDIR);
    }
    close_fd(&ws);
    close_fd(&ruleset);
    free(w);
    send_fail(t, why);
}

/* Brings the workers not yet taken (ready or getting ready) up to |to|. */
static void refill(struct tmpl *t, unsigned to)
{
    while (t->outstanding < to)
        spawn_worker(t);
}

static void announce(struct tmpl *t, struct worker_rec *w)
{
    struct wire_worker m = {.hdr = {WIRE_WORKER, WIRE_VERSION}, .id = w->id, .pid = w->pid};

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
    send_fail(t, why);
    w->announced = true;
    close_sup_fds(w);
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
            if (t->prefault.recorded == 0)
                (void)prefault_record(w->pid, &t->prefault);
            announce(t, w);
        }
        else if (buf[i] == WORKER_STARTED)
            w->started = true;
        else if (buf[i] == WORKER_FAILED) {
            if (!w->announced)
                report_setup_failure(t, w, buf + i + 1);
            close_fd(&w->ready_fd);
            return;
        }
    }
}

static void reap(struct tmpl *t)
{
    struct signalfd_siginfo si;
    bool reaped = false;

    while (read(t->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
        ;
    for (;;) {
        struct rusage ru;
        int st;
        pid_t pid = wait4(-1, &st, WNOHANG, &ru);
        if (pid <= 0)
            break;
        struct worker_rec **pp = &t->workers;
        while (*pp && (*pp)->pid != pid)
            pp = &(*pp)->next;
        struct worker_rec *w = *pp;
        if (!w)
            continue;
        /* What it wrote before it ended is still in the pipe. */
        if (w->ready_fd >= 0) {
            fcntl(w->ready_fd, F_SETFL, O_NONBLOCK);
            while (w->ready_fd >= 0)
                on_ready(t, w);
        }
        if (!w->announced)
            report_setup_failure(t, w, NULL);
        struct wire_status s = {
            .magic = WIRE_STATUS_MAGIC,
            .wait_status = st,
            .started = w->started,
            .utime_us = (int64_t)ru.ru_utime.tv_sec * 1000000 + ru.ru_utime.tv_usec,
            .stime_us = (int64_t)ru.ru_stime.tv_sec * 1000000 + ru.ru_stime.tv_usec,
            .maxrss_kb = ru.ru_maxrss,
        };
        (void)write_full(w->status_fd, &s, sizeof(s));
        close_fd(&w->status_fd);
        close_sup_fds(w);
        /* After the status: the supervisor is waiting for that, not this. */
        jail_workspace_release(&t->jail, w->name);
        reaped = true;
        *pp = w->next;
        free(w);
    }
    /* A run just ended: now is the time to replace the workers taken. */
    if (reaped)
        refill(t, t->pool_size);
}

static void on_control(struct tmpl *t, bool *stop)
{
    struct wire_hdr h;
    int fds[1];
    int nfds = 0;
    ssize_t n = wire_recv(t->ctl, &h, sizeof(h), fds, 1, &nfds);

    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    if (n == -EINTR || n == -EAGAIN)
        return;
    if (n <= 0) {
        *stop = true; /* the supervisor is gone or closed us */
        return;
    }
    if (n == (ssize_t)sizeof(h) && h.type == WIRE_TAKE && t->outstanding > 0)
        t->outstanding--;
    /* Forking a replacement costs a worker's whole setup in CPU; done now,
     * it competes with the run that just took a worker. While at least half
     * the pool is ready, wait for a run to end (reap) instead. */
    refill(t, (t->pool_size + 1) / 2);
}

static void shutdown_workers(struct tmpl *t)
{
    for (struct worker_rec *w = t->workers; w; w = w->next)
        kill(w->pid, SIGKILL);
    while (t->workers) {
        struct worker_rec *w = t->workers;
        waitpid(w->pid, NULL, 0);
        t->workers = w->next;
        close_fd(&w->ready_fd);
        close_fd(&w->status_fd);
        close_sup_fds(w);
        free(w);
    }
}

static void run_loop(struct tmpl *t)
{
    bool stop = false;

    while (!stop) {
        struct pollfd pfd[MAX_POLL];
        struct worker_rec *who[MAX_POLL];
        nfds_t n = 0;

        pfd[n++] = (struct pollfd){.fd = t->ctl, .events = POLLIN};
        pfd[n++] = (struct pollfd){.fd = t->sigfd, .events = POLLIN};
        for (struct worker_rec *w = t->workers; w && n < MAX_POLL; w = w->next) {
            if (w->ready_fd < 0)
                continue;
            who[n] = w;
            pfd[n++] = (struct pollfd){.fd = w->ready_fd, .events = POLLIN};
        }
        if (poll(pfd, n, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        /* Reaping first: it is what a waiting supervisor is blocked on. */
        if (pfd[1].revents)
            reap(t);
        for (nfds_t i = 2; i < n; i++) {
            if (!pfd[i].revents)
                continue;
            /* reap() may have freed it; look it up again. */
            for (struct worker_rec *w = t->workers; w; w = w->next)
                if (w == who[i] && w->ready_fd == pfd[i].fd)
                    on_ready(t, w);
        }
        if (pfd[0].revents)
            on_control(t, &stop);
    }
    shutdown_workers(t);
}

static void layer(struct wire_hello *h, enum sbx_layer which, bool active, const char *detail)
{
    int i = __builtin_ctz(which);
    h->layers[i].active = active;
    fmt(h->layers[i].detail, sizeof(h->layers[i].detail), "%s", detail);
}

/* What is active, and why not where it is not: `pysbx doctor` prints it and
 * sbx_open holds it against the caller's required layers. */
static void describe(const struct tmpl *t, struct wire_hello *h)
{
    const struct jail *j = &t->jail;
    char rl[192];

    memset(h, 0, sizeof(*h));
    h->hdr = (struct wire_hdr){WIRE_HELLO, WIRE_VERSION};
    h->template_pid = t->pid;
    fmt(h->python_version, sizeof(h->python_version), "%s", pyhost_version());
    fmt(h->libseccomp_version, sizeof(h->libseccomp_version), "%s",
        policy_libseccomp_version());
    h->workspace_bytes = j->mount_ns ? j->workspace_bytes : 0;
    layer(h, SBX_LAYER_SECCOMP, t->seccomp, t->seccomp_why);
    layer(h, SBX_LAYER_LANDLOCK, t->landlock > 0, t->landlock_why);
    layer(h, SBX_LAYER_NETNS, j->net_ns, j->net_why);
    layer(h, SBX_LAYER_MOUNTNS, j->mount_ns, j->mount_why);
    layer(h, SBX_LAYER_IPCNS, j->ipc_ns, j->ipc_why);
    layer(h, SBX_LAYER_UTSNS, j->uts_ns, j->uts_why);
    layer(h, SBX_LAYER_USER, j->switch_user, j->user_why);
    fmt(rl, sizeof(rl),
        "CPU (timer + RLIMIT_CPU), address space, file size %llu MiB, %d descriptors, no "
        "core%s",
        (unsigned long long)(WORKER_FSIZE_LIMIT >> 20), WORKER_NOFILE_LIMIT,
        j->switch_user ? ", " PYSBX_STR(WORKER_NPROC_LIMIT) " threads for the workers' uid" : "");
    layer(h, SBX_LAYER_RLIMITS, true, rl);
    layer(h, SBX_LAYER_CAPS, true, "every capability dropped (bounding set too), no_new_privs");
}

static char **string_list(json_t *arr)
{
    size_t n = json_array_size(arr);
    char **list = calloc(n + 1, sizeof(char *));

    for (size_t i = 0; list && i < n; i++) {
        const char *s = json_string_value(json_array_get(arr, i));
        list[i] = strdup(s ? s : "");
        if (!list[i])
            return NULL;
    }
    return list;
}

/* Reads CONFIG from the supervisor. Returns 0 or -1 with a message. */
static int read_config(struct tmpl *t, char *err, size_t errlen)
{
    static char buf[65536];
    int fds[1];
    int nfds = 0;
    ssize_t n = wire_recv(t->ctl, buf, sizeof(buf) - 1, fds, 1, &nfds);
    json_error_t jerr;
    json_t *cfg = NULL;
    const struct wire_hdr *h = (const struct wire_hdr *)buf;
    int rc = -1;

    if (n < (ssize_t)sizeof(*h) || h->type != WIRE_CONFIG || h->version != WIRE_VERSION ||
        nfds != 1) {
        fmt(err, errlen, "template: no valid configuration from the supervisor");
        goto out;
    }
    t->base_fd = fds[0];
    nfds = 0;
    buf[n] = '\0';
    cfg = json_loads(buf + sizeof(*h), 0, &jerr);
    const char *base = cfg ? json_string_value(json_object_get(cfg, "work_dir")) : NULL;
    json_int_t pool = cfg ? json_integer_value(json_object_get(cfg, "pool_size")) : 0;
    if (!base || pool < 1 || pool > 1024) {
        fmt(err, errlen, "template: bad configuration");
        goto out;
    }
    t->base_path = strdup(base);
    t->pool_size = (unsigned)pool;
    t->uid = (long)json_integer_value(json_object_get(cfg, "worker_uid"));
    t->gid = (long)json_integer_value(json_object_get(cfg, "worker_gid"));
    t->workspace_bytes = (uint64_t)json_integer_value(json_object_get(cfg, "workspace_bytes"));
    t->policy_debug = json_is_true(json_object_get(cfg, "policy_debug"));
    if (t->workspace_bytes < (1 << 20)) {
        fmt(err, errlen, "template: bad workspace size");
        goto out;
    }
    json_t *warm = json_object_get(cfg, "warm_modules");
    if (json_is_array(warm))
        t->warm = string_list(warm);
    t->module_dirs = string_list(json_object_get(cfg, "module_dirs"));
    if (!t->base_path || (json_is_array(warm) && !t->warm) || !t->module_dirs) {
        fmt(err, errlen, "template: out of memory");
        goto out;
    }
    rc = 0;
out:
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    json_decref(cfg);
    return rc;
}

int main(void)
{
    struct tmpl t = {.ctl = CTL_FD, .sigfd = -1, .base_fd = -1, .devnull = -1};
    char err[WIRE_TEXT_MAX];
    sigset_t chld;
    struct rlimit no_core = {0, 0};

    t.pid = getpid();
    prctl(PR_SET_NAME, "pysbx-template");
    /* glibc gives each new thread a malloc arena of 64 MiB of address space;
     * under RLIMIT_AS that, not the memory used, would cap a worker at a
     * handful of threads. Two arenas are plenty under the GIL. */
    mallopt(M_ARENA_MAX, 2);
    setrlimit(RLIMIT_CORE, &no_core);
    if (chdir("/") < 0 || fcntl(CTL_FD, F_SETFD, FD_CLOEXEC) < 0)
        return 1;

    if (read_config(&t, err, sizeof(err)) < 0)
        goto fail;
    t.devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (t.devnull < 0) {
        fmt(err, sizeof(err), "template: /dev/null: %s", strerror(errno));
        goto fail;
    }
    /* Namespaces first: everything after, and every worker, lives in them. */
    jail_setup(&t.jail, t.uid, t.gid, t.workspace_bytes);
    if (jail_sweeper_start(&t.jail, t.base_path, t.base_fd, err, sizeof(err)) < 0)
        goto fail;

    struct pyhost_config py = {
        .warm_modules = (const char *const *)t.warm,
        .module_dirs = (const char *const *)t.module_dirs,
    };
    if (pyhost_start(&py, err, sizeof(err)) < 0)
        goto fail;

    /* The seccomp program, built once; workers load the finished BPF. */
    t.seccomp = policy_build(&t.policy, t.policy_debug, t.seccomp_why, sizeof(t.seccomp_why)) == 0;
    if (t.seccomp)
        fmt(t.seccomp_why, sizeof(t.seccomp_why),
            "%u rules, default EPERM, exploit primitives kill%s", t.policy.rules,
            t.policy_debug ? " (DEBUG: refusals trap and are named; never for production)"
                           : "");
    t.landlock = landlock_abi();
    if (t.landlock > 0 && landlock_base_open(&t.ll_base, t.landlock,
                                             (const char *const *)t.module_dirs, t.landlock_why,
                                             sizeof(t.landlock_why)) < 0) {
        /* A module directory that cannot be confined is the caller's error. */
        fmt(err, sizeof(err), "%s", t.landlock_why);
        goto fail;
    }
    if (t.landlock > 0)
        fmt(t.landlock_why, sizeof(t.landlock_why),
            "ABI %d: workspace read-write; standard library, module dirs, shared libraries, "
            "time zones read-only%s",
            t.landlock, t.landlock >= 6 ? "; signals and abstract sockets scoped" : "");
    else
        fmt(t.landlock_why, sizeof(t.landlock_why), "not available in this kernel: %s",
            strerror(-t.landlock));

    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &chld, NULL) < 0 ||
        (t.sigfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC)) < 0) {
        fmt(err, sizeof(err), "template: signalfd: %s", strerror(errno));
        goto fail;
    }

    struct wire_hello hello;
    describe(&t, &hello);
    if (wire_send(t.ctl, &hello, sizeof(hello), NULL, 0) < 0)
        return 1;
    refill(&t, t.pool_size);
    run_loop(&t);
    jail_sweeper_stop(&t.jail);
    return 0;

fail:
    send_fail(&t, err);
    return 1;
}
