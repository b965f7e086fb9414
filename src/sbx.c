/* Opening and closing a sandbox: starting the template, the workspace root,
 * taking workers from the pool. */
#define _GNU_SOURCE
#include "sbx_internal.h"
#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef PYSBX_TEMPLATE_DEFAULT
#error "PYSBX_TEMPLATE_DEFAULT must name the installed pysbx-template"
#endif

/* The template imports its warm set before it answers; on a cold disk cache
 * that can take a while. */
#define TEMPLATE_START_TIMEOUT_MS 60000

void sbx_config_init(struct sbx_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->required_layers = SBX_LAYER_SECCOMP;
    cfg->worker_uid = -1;
    cfg->worker_gid = -1;
}

static const char *const layer_names[SBX_LAYER_COUNT] = {
    "seccomp", "landlock", "netns", "mountns", "ipcns", "utsns", "user", "rlimits", "caps",
};

const char *sbx_layer_name(enum sbx_layer layer)
{
    unsigned i = layer ? (unsigned)__builtin_ctz(layer) : SBX_LAYER_COUNT;
    return i < SBX_LAYER_COUNT && layer == (1u << i) ? layer_names[i] : NULL;
}

enum sbx_layer sbx_layer_from_name(const char *name)
{
    for (unsigned i = 0; name && i < SBX_LAYER_COUNT; i++)
        if (strcmp(name, layer_names[i]) == 0)
            return (enum sbx_layer)(1u << i);
    return (enum sbx_layer)0;
}

int sbx_layers(const struct sbx *sbx, struct sbx_layer_info out[SBX_LAYER_COUNT])
{
    for (unsigned i = 0; i < SBX_LAYER_COUNT; i++) {
        out[i].layer = (enum sbx_layer)(1u << i);
        out[i].name = layer_names[i];
        out[i].active = sbx->layers[i].active != 0;
        fmt(out[i].detail, sizeof(out[i].detail), "%s", sbx->layers[i].detail);
    }
    return SBX_LAYER_COUNT;
}

const char *sbx_python_version(const struct sbx *sbx)
{
    return sbx->python_version;
}

const char *sbx_libseccomp_version(const struct sbx *sbx)
{
    return sbx->libseccomp_version;
}

static unsigned default_pool_size(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);

    if (n < 1)
        n = 1;
    return n > 16 ? 32 : (unsigned)n * 2;
}

static const char *template_path(const struct sbx_config *cfg)
{
    const char *env;

    if (cfg->template_path)
        return cfg->template_path;
    env = getenv("PYSBX_TEMPLATE");
    return env && *env ? env : PYSBX_TEMPLATE_DEFAULT;
}

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

/* The template's configuration, sent as JSON after the message header. */
static int send_config(struct sbx *sbx, const struct sbx_config *cfg, struct sbx_error *err)
{
    json_t *o = json_object();
    char *text = NULL;
    char *msg = NULL;
    int rc = -ENOMEM;

    if (!o || json_object_set_new(o, "work_dir", json_string(sbx->work_dir)) < 0 ||
        json_object_set_new(o, "pool_size",
                            json_integer(cfg->pool_size ? cfg->pool_size : default_pool_size())) < 0 ||
        json_object_set_new(o, "warm_modules",
                            cfg->warm_modules ? string_array(cfg->warm_modules) : json_null()) < 0 ||
        json_object_set_new(o, "module_dirs", string_array(cfg->module_dirs)) < 0 ||
        json_object_set_new(o, "worker_uid", json_integer(cfg->worker_uid)) < 0 ||
        json_object_set_new(o, "worker_gid", json_integer(cfg->worker_gid)) < 0 ||
        json_object_set_new(o, "workspace_bytes",
                            json_integer((json_int_t)(cfg->workspace_bytes
                                                          ? cfg->workspace_bytes
                                                          : SBX_DEFAULT_WORKSPACE_BYTES))) < 0 ||
        json_object_set_new(o, "policy_debug", json_boolean(cfg->policy_debug)) < 0)
        goto out;
    text = json_dumps(o, JSON_COMPACT);
    if (!text)
        goto out;
    size_t tlen = strlen(text);
    if (tlen > 60000) {
        rc = sbx_fail(err, SBX_ERR_INVALID_REQUEST, -E2BIG, "configuration too large");
        goto out;
    }
    msg = malloc(sizeof(struct wire_hdr) + tlen);
    if (!msg)
        goto out;
    struct wire_hdr h = {WIRE_CONFIG, WIRE_VERSION};
    memcpy(msg, &h, sizeof(h));
    memcpy(msg + sizeof(h), text, tlen);
    rc = wire_send(sbx->ctl, msg, sizeof(h) + tlen, &sbx->work_fd, 1);
    if (rc < 0)
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "sending the configuration: %s",
                      strerror(-rc));
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
    /* Only the control socket crosses over, as descriptor 3; the host's
     * environment, signal handlers and masks stay behind. */
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, child_end, 3);
    posix_spawn_file_actions_addclosefrom_np(&fa, 4);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    /* Its own session: a terminal's ^C for the host does not reach it. */
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                                        POSIX_SPAWN_SETSID);
    rc = posix_spawn(&sbx->template_pid, path, &fa, &attr, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
        sbx->template_pid = -1;
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -rc, "starting the template %s: %s", path,
                        strerror(rc));
    }
    return 0;
}

static int await_hello(struct sbx *sbx, struct sbx_error *err)
{
    union {
        struct wire_hello hello;
        struct wire_fail fail;
    } m;
    struct pollfd p = {.fd = sbx->ctl, .events = POLLIN};
    int fds[WFD_COUNT];
    int nfds = 0;
    int r = poll(&p, 1, TEMPLATE_START_TIMEOUT_MS);
    ssize_t n;

    if (r == 0)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ETIMEDOUT,
                        "the template did not start within %d s", TEMPLATE_START_TIMEOUT_MS / 1000);
    if (r < 0)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -errno, "poll: %s", strerror(errno));
    memset(&m, 0, sizeof(m));
    n = wire_recv(sbx->ctl, &m, sizeof(m), fds, WFD_COUNT, &nfds);
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    if (n >= (ssize_t)sizeof(struct wire_hdr) && m.hello.hdr.type == WIRE_FAIL) {
        m.fail.text[sizeof(m.fail.text) - 1] = '\0';
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -EIO, "%s", m.fail.text);
    }
    if (n != (ssize_t)sizeof(m.hello) || m.hello.hdr.type != WIRE_HELLO ||
        m.hello.hdr.version != WIRE_VERSION)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -EIO,
                        "the template ended before it was ready (is it the same version?)");
    m.hello.python_version[sizeof(m.hello.python_version) - 1] = '\0';
    m.hello.libseccomp_version[sizeof(m.hello.libseccomp_version) - 1] = '\0';
    fmt(sbx->python_version, sizeof(sbx->python_version), "%s", m.hello.python_version);
    fmt(sbx->libseccomp_version, sizeof(sbx->libseccomp_version), "%s",
        m.hello.libseccomp_version);
    sbx->workspace_bytes = m.hello.workspace_bytes;
    for (int i = 0; i < WIRE_LAYERS; i++) {
        sbx->layers[i] = m.hello.layers[i];
        sbx->layers[i].detail[sizeof(sbx->layers[i].detail) - 1] = '\0';
    }
    return 0;
}

/* Fail closed: a layer the caller requires and this machine lacks stops
 * the sandbox from opening at all. */
static int check_required(const struct sbx *sbx, unsigned required, struct sbx_error *err)
{
    for (unsigned i = 0; i < SBX_LAYER_COUNT; i++)
        if ((required & (1u << i)) && !sbx->layers[i].active)
            return sbx_fail(err, SBX_ERR_UNAVAILABLE, -EPERM,
                            "required layer %s is not available: %s", layer_names[i],
                            sbx->layers[i].detail);
    return 0;
}

/* Workers under their own uid reach their workspace by path too (HOME,
 * TMPDIR, absolute paths the code builds): every directory above it must
 * let others pass. */
static int check_traversable(const char *root, struct sbx_error *err)
{
    char path[PATH_MAX];
    struct stat st;

    if (!realpath(root, path))
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -errno, "work root %s: %s", root,
                        strerror(errno));
    for (char *p = path + strlen(path); p > path; p = strrchr(path, '/')) {
        *p = '\0';
        const char *dir = path[0] ? path : "/";
        if (stat(dir, &st) < 0 || !(st.st_mode & S_IXOTH))
            return sbx_fail(err, SBX_ERR_UNAVAILABLE, -EACCES,
                            "work root %s: %s is not searchable by the workers' uid; use a "
                            "directory others may pass through (such as /tmp)",
                            root, dir);
        if (!path[0])
            break;
    }
    return 0;
}

static int make_work_dir(struct sbx *sbx, const struct sbx_config *cfg, struct sbx_error *err)
{
    const char *root = cfg->work_root;
    char path[PATH_MAX];

    if (!root)
        root = getenv("TMPDIR");
    if (!root || !*root)
        root = "/tmp";
    if (geteuid() == 0) {
        char full[PATH_MAX];
        snprintf(full, sizeof(full), "%s/.", root); /* the root itself too */
        int rc = check_traversable(full, err);
        if (rc < 0)
            return rc;
    }
    sbx->root_fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (sbx->root_fd < 0)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -errno, "work root %s: %s", root,
                        strerror(errno));
    if ((size_t)snprintf(path, sizeof(path), "%s/pysbx-XXXXXX", root) >= sizeof(path))
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENAMETOOLONG, "work root path too long");
    if (!mkdtemp(path))
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -errno, "making a directory in %s: %s", root,
                        strerror(errno));
    sbx->work_dir = strdup(path);
    sbx->work_fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    /* Workers under their own uid must be able to pass through to their
     * workspace by path (HOME, TMPDIR); each workspace itself is 0700. */
    if (sbx->work_fd >= 0 && geteuid() == 0)
        (void)fchmod(sbx->work_fd, 0711);
    if (!sbx->work_dir || sbx->work_fd < 0) {
        int e = sbx->work_dir ? errno : ENOMEM;
        rmdir(path);
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -e, "opening %s: %s", path, strerror(e));
    }
    return 0;
}

int sbx_open(const struct sbx_config *cfg, struct sbx **out, struct sbx_error *err)
{
    struct sbx_config defaults;
    struct sbx *sbx;
    int sv[2] = {-1, -1};
    int child_end = -1;
    int rc;

    *out = NULL;
    if (!cfg) {
        sbx_config_init(&defaults);
        cfg = &defaults;
    }
    if (cfg->pool_size > 1024)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "pool_size must be at most 1024");
    if (cfg->required_layers >> SBX_LAYER_COUNT)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "unknown layer in required_layers");
    if (cfg->workspace_bytes && (cfg->workspace_bytes < (1ULL << 20) ||
                                 cfg->workspace_bytes > SBX_MAX_MEMORY_BYTES))
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "workspace_bytes must be between 1 MiB and 1 TiB");
    sbx = calloc(1, sizeof(*sbx));
    if (!sbx)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    sbx->ctl = sbx->root_fd = sbx->work_fd = -1;
    sbx->template_pid = -1;
    pthread_mutex_init(&sbx->lock, NULL);
    pthread_mutex_init(&sbx->qlock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&sbx->qcond, &ca);
    pthread_condattr_destroy(&ca);
    sbx->max_running = cfg->max_running ? cfg->max_running : default_pool_size();
    sbx->max_queued = cfg->max_queued ? cfg->max_queued : 1024;

    rc = make_work_dir(sbx, cfg, err);
    if (rc < 0)
        goto fail;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, -errno, "socketpair: %s", strerror(errno));
        goto fail;
    }
    sbx->ctl = sv[0];
    /* Keep the child's end off descriptor 3, where dup2 would be a no-op
     * that leaves close-on-exec set. */
    child_end = fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
    close(sv[1]);
    if (child_end < 0) {
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, -errno, "fcntl: %s", strerror(errno));
        goto fail;
    }
    rc = spawn_template(sbx, template_path(cfg), child_end, err);
    close(child_end);
    if (rc < 0)
        goto fail;
    rc = send_config(sbx, cfg, err);
    if (rc < 0)
        goto fail;
    rc = await_hello(sbx, err);
    if (rc < 0)
        goto fail;
    rc = check_required(sbx, cfg->required_layers, err);
    if (rc < 0)
        goto fail;
    *out = sbx;
    return 0;
fail:
    sbx_close(sbx);
    return rc;
}

void sbx_close(struct sbx *sbx)
{
    if (!sbx)
        return;
    /* End of stream tells the template to kill its workers and exit. */
    close_fd(&sbx->ctl);
    if (sbx->template_pid > 0) {
        while (waitpid(sbx->template_pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    if (sbx->work_dir && sbx->root_fd >= 0) {
        const char *base = strrchr(sbx->work_dir, '/');
        (void)remove_tree_at(sbx->root_fd, base ? base + 1 : sbx->work_dir);
    }
    close_fd(&sbx->work_fd);
    close_fd(&sbx->root_fd);
    free(sbx->work_dir);
    pthread_mutex_destroy(&sbx->lock);
    pthread_mutex_destroy(&sbx->qlock);
    pthread_cond_destroy(&sbx->qcond);
    free(sbx);
}

int sbx_take_worker(struct sbx *sbx, struct taken_worker *w, char *why, size_t whylen)
{
    union {
        struct wire_hdr hdr;
        struct wire_worker worker;
        struct wire_fail fail;
    } m;
    int nfds = 0;
    ssize_t n;
    int rc = -1;

    memset(&m, 0, sizeof(m));
    for (int i = 0; i < WFD_COUNT; i++)
        w->fds[i] = -1;
    pthread_mutex_lock(&sbx->lock);
    n = sbx->ctl < 0 ? -EBADF : wire_recv(sbx->ctl, &m, sizeof(m), w->fds, WFD_COUNT, &nfds);
    if (n > 0) {
        /* Whatever it was, one of the template's pool is spoken for. */
        struct wire_hdr take = {WIRE_TAKE, WIRE_VERSION};
        (void)wire_send(sbx->ctl, &take, sizeof(take), NULL, 0);
    }
    pthread_mutex_unlock(&sbx->lock);

    if (n <= 0)
        fmt(why, whylen, "the template process is gone%s%s", n < 0 ? ": " : "",
            n < 0 ? strerror((int)-n) : "");
    else if (m.hdr.type == WIRE_FAIL && n == (ssize_t)sizeof(m.fail)) {
        m.fail.text[sizeof(m.fail.text) - 1] = '\0';
        fmt(why, whylen, "%s", m.fail.text);
    } else if (m.hdr.type != WIRE_WORKER || n != (ssize_t)sizeof(m.worker) || nfds != WFD_COUNT)
        fmt(why, whylen, "malformed message from the template");
    else {
        m.worker.workspace[sizeof(m.worker.workspace) - 1] = '\0';
        w->pid = m.worker.pid;
        fmt(w->workspace, sizeof(w->workspace), "%s", m.worker.workspace);
        rc = 0;
    }
    if (rc < 0)
        for (int i = 0; i < nfds; i++)
            close_fd(&w->fds[i]);
    return rc;
}
