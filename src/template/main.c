/*
 * pysbx-template: the process in which CPython is initialised, once, and from
 * which every worker is forked. It never runs user code and holds nothing of
 * the host: the supervisor starts it by exec with an empty environment and
 * only the control socket open (as TEMPLATE_CTL_FD). It is single-threaded.
 */
#define _GNU_SOURCE
#include "branch.h"
#include "confine.h"
#include "interp.h"
#include "packages.h"
#include "root.h"
#include "pysbx.h"
#include "sysutil.h"
#include "template.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <malloc.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <unistd.h>

/* glibc gives each new thread a malloc arena of 64 MiB of address space;
 * under RLIMIT_AS that, not the memory used, would cap a worker at a
 * handful of threads. Two arenas are plenty under the GIL. */
#define WORKER_MALLOC_ARENAS 2

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

/* Reads CONFIG from the supervisor. Returns 0 or -errno with a message. */
static int read_config(struct tmpl *t, char *err, size_t errlen)
{
    static char buf[WIRE_MSG_MAX];
    int fds[1];
    int nfds = 0;
    ssize_t n = wire_recv(t->ctl, buf, sizeof(buf) - 1, fds, 1, &nfds);
    json_error_t jerr;
    json_t *cfg = NULL;
    const struct wire_hdr *h = (const struct wire_hdr *)buf;
    int rc = -EPROTO;

    if (n < (ssize_t)sizeof(*h) || h->type != WIRE_CONFIG || h->version != WIRE_VERSION ||
        nfds != 1) {
        errmsg(err, errlen, rc, "template: no valid configuration from the supervisor");
        goto out;
    }
    t->base_fd = fds[0];
    nfds = 0;
    buf[n] = '\0';
    cfg = json_loads(buf + sizeof(*h), 0, &jerr);
    const char *base = cfg ? json_string_value(json_object_get(cfg, "work_dir")) : NULL;
    json_int_t pool = cfg ? json_integer_value(json_object_get(cfg, "pool_size")) : 0;
    if (!base || pool < 1 || pool > SBX_MAX_POOL_SIZE) {
        errmsg(err, errlen, rc, "template: bad configuration");
        goto out;
    }
    t->base_path = strdup(base);
    t->pool_size = (unsigned)pool;
    t->jc.uid_base = (long)json_integer_value(json_object_get(cfg, "worker_uid"));
    t->jc.gid_base = (long)json_integer_value(json_object_get(cfg, "worker_gid"));
    json_int_t ids = json_integer_value(json_object_get(cfg, "worker_ids"));
    t->jc.workspace_bytes = (uint64_t)json_integer_value(json_object_get(cfg, "workspace_bytes"));
    t->jc.disable = (unsigned)json_integer_value(json_object_get(cfg, "disable_layers"));
    t->policy_debug = json_is_true(json_object_get(cfg, "policy_debug"));
    t->single_run = json_is_true(json_object_get(cfg, "single_run"));
    if (t->jc.workspace_bytes < SBX_MIN_WORKSPACE_BYTES || ids < 1 || ids > SBX_MAX_WORKER_IDS ||
        t->jc.uid_base < -1 || (t->jc.uid_base >= 0 && t->jc.gid_base < 0) ||
        (uint64_t)t->jc.uid_base + (uint64_t)ids > UINT32_MAX ||
        (uint64_t)t->jc.gid_base + (uint64_t)ids > UINT32_MAX) {
        errmsg(err, errlen, rc, "template: bad workspace size or worker ids");
        goto out;
    }
    t->jc.ids = (unsigned)ids;
    json_t *warm = json_object_get(cfg, "warm_modules");
    if (json_is_array(warm))
        t->warm = string_list(warm);
    t->module_dirs = string_list(json_object_get(cfg, "module_dirs"));
    const char *pkg_path = json_string_value(json_object_get(cfg, "package_path"));
    if (pkg_path) {
        t->pkg_path = strdup(pkg_path);
        t->pkg_modules = string_list(json_object_get(cfg, "package_modules"));
        t->pkg_places = string_list(json_object_get(cfg, "package_places"));
        t->pkg_links = string_list(json_object_get(cfg, "package_links"));
        const char *fonts = json_string_value(json_object_get(cfg, "font_cache"));
        t->font_cache = fonts ? strdup(fonts) : NULL;
    }
    if (!t->base_path || (json_is_array(warm) && !t->warm) || !t->module_dirs ||
        (pkg_path && (!t->pkg_path || !t->pkg_modules || !t->pkg_places || !t->pkg_links)) ||
        (json_object_get(cfg, "font_cache") && !t->font_cache)) {
        rc = errmsg(err, errlen, -ENOMEM, "template: out of memory");
        goto out;
    }
    rc = 0;
out:
    close_fds(fds, (size_t)nfds);
    json_decref(cfg);
    return rc;
}

/* With the mount namespace: the private root (root.h). */
static int enter_root(struct tmpl *t, char *err, size_t errlen)
{
    const struct jail *j = &t->jail;
    struct root_spec spec = {
        .work_dir = t->base_path,
        .module_dirs = (const char *const *)t->module_dirs,
        .package_places = (const char *const *)t->pkg_places,
        .package_links = (const char *const *)t->pkg_links,
        .per_run_ids = j->uid_per_run,
        .uid_base = j->switch_user ? j->uid_base : 0,
        .gid_base = j->switch_user ? j->gid_base : 0,
        .ids = j->ids,
    };

    if (t->jc.disable & SBX_LAYER_ROOT) {
        fmt(t->root_why, sizeof(t->root_why), "turned off by the configuration");
        return 0;
    }
    if (!j->mount_ns) {
        fmt(t->root_why, sizeof(t->root_why),
            "needs the mount namespace (%s): runs see the host's tree (Landlock, where active, "
            "limits what they open; names and stat stay visible)",
            j->mount_why);
        return 0;
    }
    int rc = root_enter(&spec, err, errlen);
    if (rc < 0)
        return rc;
    t->root = true;
    fmt(t->root_why, sizeof(t->root_why),
        "a tmpfs root: the standard library, shared libraries, time zones, module dirs "
        "read-only; three devices; the workspace; no /proc, no host files");
    return 0;
}

static void *build_policy(void *arg)
{
    struct tmpl *t = arg;

    t->seccomp = policy_build(&t->policy, t->policy_debug, !t->root, false, t->seccomp_why,
                              sizeof(t->seccomp_why)) == 0;
    return NULL;
}

int main(void)
{
    struct tmpl t = {.ctl = TEMPLATE_CTL_FD,
                     .sigfd = -1,
                     .base_fd = -1,
                     .devnull = -1,
                     .proc_fd = -1,
                     .font_tree = -1,
                     .keeper = {.pid = -1, .life = -1},
                     .claim = {.holder = -1},
                     .sweeper = {.fd = -1, .pid = -1},
                     .freezer = {.dir = -1},
                     .copier_next = {.sock = -1}};
    char err[WIRE_TEXT_MAX];
    sigset_t chld;
    struct rlimit no_core = {0, 0};

    t.pid = getpid();
    prctl(PR_SET_NAME, "pysbx-template");
    /* Where the program and its libraries are, before anything else is
     * mapped (an image of a session is for a template laid out so). */
    int proc = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    t.layout = proc >= 0 ? image_layout(proc, t.pid) : 0;
    if (proc >= 0)
        close(proc);
    mallopt(M_ARENA_MAX, WORKER_MALLOC_ARENAS);
    setrlimit(RLIMIT_CORE, &no_core);
    if (chdir("/") < 0 || fcntl(TEMPLATE_CTL_FD, F_SETFD, FD_CLOEXEC) < 0)
        return 1;

    if (read_config(&t, err, sizeof(err)) < 0)
        goto fail;
    t.devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (t.devnull < 0) {
        errmsg(err, sizeof(err), -errno, "template: /dev/null: %s", strerror(errno));
        goto fail;
    }
    /* Namespaces first: everything after, and every worker, lives in them. */
    bool draw = t.jc.uid_base < 0;
    if (draw)
        t.jc.uid_base = t.jc.gid_base = SBX_DEFAULT_WORKER_ID_BASE;
    jail_setup(&t.jail, &t.jc);
    /* Workers under other uids are stopped by signals (the template's
     * timers, the supervisor's deadline): without CAP_KILL every kill would
     * fail and a run would go on past its limits. Before the claim: the
     * holder's death signal, sent as from us, needs it too. */
    if (t.jail.switch_user && !confine_has_cap(CAP_KILL)) {
        errmsg(err, sizeof(err), -EPERM,
               "template: the workers run as their own uids, which it could not signal to "
               "stop them without CAP_KILL: give the process CAP_KILL (or run it as an "
               "ordinary user)");
        goto fail;
    }
    /* The workers' ids, claimed machine-wide. */
    if (ids_claim(&t.claim, &t.jail, draw, err, sizeof(err)) < 0)
        goto fail;
    /* /proc stays reachable to the template alone, through this descriptor
     * (prefault reads its workers' page maps, sessions their threads and
     * children); a private root has none. Only our own pid namespace's:
     * another's numbers name other processes. */
    t.proc_fd = proc_open_own(t.proc_why, sizeof(t.proc_why));
    t.proc_ok = t.proc_fd >= 0;
    /* The freezer's cgroup, while /sys is in view (freezer.h). */
    if (t.jc.disable & SBX_LAYER_FREEZE)
        fmt(t.freeze_why, sizeof(t.freeze_why), "turned off by the configuration");
    else
        t.freeze = freezer_open(&t.freezer, t.freeze_why, sizeof(t.freeze_why)) > 0;
    if (t.font_cache)
        packages_font_cache(&t);
    if (enter_root(&t, err, sizeof(err)) < 0)
        goto fail;
    /* Nothing is executed from here on (jail_setup ran the id-mapping
     * helpers): the bounding set can go, once for every worker. */
    if (confine_drop_bounding_set(err, sizeof(err)) < 0)
        goto fail;
    t.bounding_empty = confine_bounding_set_empty();
    if (uids_init(&t.uids, &t.jail) < 0) {
        errmsg(err, sizeof(err), -ENOMEM, "template: out of memory");
        goto fail;
    }
    if (t.claim.claimed)
        uids_hold(&t.uids, 0); /* the holder's */

    struct interp_config py = {
        .warm_modules = (const char *const *)t.warm,
        .module_dirs = (const char *const *)t.module_dirs,
    };
    /* The seccomp program, built once (workers load the finished BPF), on a
     * thread of its own while the interpreter starts: libseccomp takes a
     * millisecond or two that a one-shot run would otherwise wait for. The
     * thread is joined before anything is forked. */
    pthread_t builder;
    bool threaded = !(t.jc.disable & SBX_LAYER_SECCOMP) &&
                    pthread_create(&builder, NULL, build_policy, &t) == 0;
    if (!threaded && !(t.jc.disable & SBX_LAYER_SECCOMP))
        build_policy(&t);
    int py_rc = t.pkg_path ? packages_prepare(&t, &py, err, sizeof(err)) : 0;
    if (py_rc == 0)
        py_rc = interp_start(&py, err, sizeof(err));
    if (threaded)
        pthread_join(builder, NULL);
    if (py_rc < 0)
        goto fail;
    if (t.pkg_path && packages_started(&t, err, sizeof(err)) < 0)
        goto fail;
    /* The pid namespace, whose init is our first child, before any other
     * (the sweeper, the workers). After it this process can start no
     * thread (the kernel refuses CLONE_THREAD where the namespace for
     * children is not one's own): it comes once the interpreter, its
     * imports and the policy's builder are done with theirs. */
    int kept = keeper_start(&t.keeper, t.pidns_why, sizeof(t.pidns_why));
    if (kept < 0) {
        fmt(err, sizeof(err), "%s", t.pidns_why);
        goto fail;
    }
    t.pid_ns = kept > 0;
    /* Workspaces mounted in our namespace are unmounted and removed by the
     * sweeper; under the private root they are detached mounts that go
     * with their last descriptor. */
    if (t.jail.mount_ns && !t.root &&
        sweeper_start(&t.sweeper, t.base_path, t.base_fd, t.pid_ns ? 0 : t.pid, err, sizeof(err)) <
            0)
        goto fail;
    if (t.jc.disable & SBX_LAYER_SECCOMP)
        fmt(t.seccomp_why, sizeof(t.seccomp_why), "turned off by the configuration");
    if (t.seccomp)
        fmt(t.seccomp_why, sizeof(t.seccomp_why),
            "%u rules, default EPERM, exploit primitives kill%s%s", t.policy.rules,
            t.root ? "" : "; chmod, chown, utime by path refused (no private root)",
            t.policy_debug ? " (DEBUG: refusals trap and are named; never for production)" : "");
    t.landlock = (t.jc.disable & SBX_LAYER_LANDLOCK) ? -EPERM : landlock_abi();
    /* A module directory that cannot be confined is the caller's error. */
    const char *const *read_only = packages_read_only(&t);
    if (!read_only) {
        errmsg(err, sizeof(err), -ENOMEM, "template: out of memory");
        goto fail;
    }
    if (t.landlock > 0 &&
        landlock_base_open(&t.ll_base, t.landlock, read_only, t.root ? root_written_files : NULL,
                           t.root, err, sizeof(err)) < 0)
        goto fail;
    if (t.landlock > 0)
        fmt(t.landlock_why, sizeof(t.landlock_why),
            "ABI %d: workspace read-write; standard library, module dirs, shared libraries, "
            "time zones read-only%s",
            t.landlock, t.landlock >= 6 ? "; signals and abstract sockets scoped" : "");
    else if (t.jc.disable & SBX_LAYER_LANDLOCK)
        fmt(t.landlock_why, sizeof(t.landlock_why), "turned off by the configuration");
    else
        fmt(t.landlock_why, sizeof(t.landlock_why), "not available in this kernel: %s",
            strerror(-t.landlock));

    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigaddset(&chld, TEMPLATE_CPU_SIGNAL);
    sigaddset(&chld, TEMPLATE_WALL_SIGNAL);
    if (sigprocmask(SIG_BLOCK, &chld, NULL) < 0 ||
        (t.sigfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC)) < 0) {
        errmsg(err, sizeof(err), -errno, "template: signalfd: %s", strerror(errno));
        goto fail;
    }

    struct wire_hello hello;
    layers_describe(&t, &hello);
    if (wire_send(t.ctl, &hello, sizeof(hello), NULL, 0) < 0)
        return 1;
    pool_run(&t);
    sweeper_stop(&t.sweeper);
    /* Nothing of ours outlives us, and the range is free for the next
     * sandbox, once we have returned. */
    ids_release(&t.claim);
    keeper_stop(&t.keeper);
    /* Once every process of ours is reaped: a cgroup with one is busy. */
    freezer_close(&t.freezer);
    return 0;

fail:
    /* The range is free, and nothing of ours left, when the supervisor
     * hears why we failed. */
    ids_release(&t.claim);
    keeper_stop(&t.keeper);
    freezer_close(&t.freezer);
    template_send_fail(&t, err);
    return 1;
}
