/* Opening and closing a sandbox, and what it reports of itself. */
#define _GNU_SOURCE
#include "control.h"
#include "sandbox.h"
#include "sbxerr.h"
#include "util.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef PYSBX_TEMPLATE_DEFAULT
#error "PYSBX_TEMPLATE_DEFAULT must name the installed pysbx-template"
#endif
#ifndef PYSBX_TEMPLATE_RELATIVE
#error "PYSBX_TEMPLATE_RELATIVE must name the helper relative to the library's directory"
#endif

#define DEFAULT_MAX_QUEUED 1024

void sbx_config_init(struct sbx_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->required_layers = SBX_LAYERS_DEFAULT;
    cfg->worker_uid = -1;
    cfg->worker_gid = -1;
}

_Static_assert(SBX_LAYER_COUNT == WIRE_LAYERS, "the wire carries every layer");

static const char *const layer_names[SBX_LAYER_COUNT] = {
    "seccomp", "landlock", "netns", "mountns", "ipcns",  "utsns",
    "user",    "rlimits",  "caps",  "root",    "uidrun", "freeze",
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

static void free_list(char **list)
{
    for (size_t i = 0; list && list[i]; i++)
        free(list[i]);
    free(list);
}

static const char *const *copy_list(const char *const *list)
{
    size_t n = 0;

    while (list[n])
        n++;
    char **copy = calloc(n + 1, sizeof(*copy));
    for (size_t i = 0; copy && i < n; i++)
        if (!(copy[i] = strdup(list[i]))) {
            free_list(copy);
            return NULL;
        }
    return (const char *const *)copy;
}

static unsigned default_pool_size(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);

    if (n < 1)
        n = 1;
    return n > 16 ? 32 : (unsigned)n * 2;
}

/* The helper where this install put it, relative to the file this code was
 * loaded from (the shared library, or a program linked with the static
 * one), so that an install moved elsewhere as a whole still works. */
static const char *template_beside_library(char *buf, size_t cap)
{
    Dl_info info;
    char self[PATH_MAX];

    if (dladdr((void *)sbx_config_init, &info) == 0 || !info.dli_fname)
        return NULL;
    const char *file = info.dli_fname;
    /* In the program itself (the static library), glibc names it by argv[0],
     * which may be a bare name found on PATH: the kernel knows better. */
    if (strcmp(file, program_invocation_name) == 0) {
        ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        if (n <= 0)
            return NULL;
        self[n] = '\0';
        file = self;
    }
    const char *slash = strrchr(file, '/');
    if (!slash)
        return NULL;
    int n = snprintf(buf, cap, "%.*s/%s", (int)(slash - file), file, PYSBX_TEMPLATE_RELATIVE);
    if (n < 0 || (size_t)n >= cap)
        return NULL;
    return access(buf, X_OK) == 0 ? buf : NULL;
}

/* The caller's choice, else PYSBX_TEMPLATE, else the helper beside the
 * library, else where it was configured to be installed. */
static const char *template_path(const struct sbx_config *cfg, char *buf, size_t cap)
{
    const char *env, *rel;

    if (cfg->template_path)
        return cfg->template_path;
    env = getenv("PYSBX_TEMPLATE");
    if (env && *env)
        return env;
    rel = template_beside_library(buf, cap);
    return rel ? rel : PYSBX_TEMPLATE_DEFAULT;
}

static bool active(const struct sbx *sbx, enum sbx_layer l)
{
    return sbx->layers[__builtin_ctz(l)].active != 0;
}

/* Fail closed: a layer the caller requires and this machine lacks stops
 * the sandbox from opening at all. */
int sbx_check_layers(const struct sbx *sbx, unsigned required, struct sbx_error *err)
{
    if (required & SBX_LAYERS_DEFAULT) {
        required &= ~SBX_LAYERS_DEFAULT;
        required |= SBX_LAYER_SECCOMP;
        if (geteuid() == 0)
            required |= SBX_LAYER_UIDRUN;
        if (!active(sbx, SBX_LAYER_LANDLOCK) && !active(sbx, SBX_LAYER_ROOT))
            return sbx_fail(err, SBX_ERR_UNAVAILABLE, -EPERM,
                            "the file system is not confined: neither landlock (%s) nor a "
                            "private root (%s); require less to run anyway",
                            sbx->layers[__builtin_ctz(SBX_LAYER_LANDLOCK)].detail,
                            sbx->layers[__builtin_ctz(SBX_LAYER_ROOT)].detail);
    }
    for (unsigned i = 0; i < SBX_LAYER_COUNT; i++)
        if ((required & (1u << i)) && !sbx->layers[i].active)
            return sbx_fail(err, SBX_ERR_UNAVAILABLE, -EPERM,
                            "required layer %s is not available: %s", layer_names[i],
                            sbx->layers[i].detail);
    return 0;
}

int sbx_open(const struct sbx_config *given, struct sbx **out, struct sbx_error *err)
{
    struct sbx_config cfg;
    struct sbx *sbx;
    int rc;

    *out = NULL;
    if (given)
        cfg = *given;
    else
        sbx_config_init(&cfg);
    if (cfg.pool_size > SBX_MAX_POOL_SIZE)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "pool_size must be at most %u",
                        SBX_MAX_POOL_SIZE);
    if ((cfg.required_layers & ~SBX_LAYERS_DEFAULT) >> SBX_LAYER_COUNT ||
        cfg.disable_layers >> SBX_LAYER_COUNT)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "unknown layer in the configuration");
    if (cfg.worker_ids > SBX_MAX_WORKER_IDS)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "worker_ids must be at most %u",
                        SBX_MAX_WORKER_IDS);
    if (cfg.worker_uid < -1 || cfg.worker_gid < -1 || cfg.worker_uid > UINT32_MAX - 1 ||
        cfg.worker_gid > UINT32_MAX - 1)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "worker_uid/worker_gid out of range");
    if (cfg.workspace_bytes && (cfg.workspace_bytes < SBX_MIN_WORKSPACE_BYTES ||
                                cfg.workspace_bytes > SBX_MAX_MEMORY_BYTES))
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "workspace_bytes must be between 1 MiB and 1 TiB");
    if (cfg.max_sessions > SBX_MAX_SESSIONS_LIMIT)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "max_sessions must be at most %u",
                        SBX_MAX_SESSIONS_LIMIT);
    if (!cfg.max_sessions)
        cfg.max_sessions = SBX_DEFAULT_MAX_SESSIONS;
    if (cfg.single_run)
        cfg.pool_size = 1;
    if (!cfg.pool_size)
        cfg.pool_size = default_pool_size();
    if (!cfg.workspace_bytes)
        cfg.workspace_bytes = SBX_DEFAULT_WORKSPACE_BYTES;
    /* worker_uid -1: the template draws a range, and claims it (as a range
     * given) machine-wide; the gids follow the uids. */
    if (cfg.worker_uid >= 0 && cfg.worker_gid < 0)
        cfg.worker_gid = cfg.worker_uid;
    if (!cfg.worker_ids)
        cfg.worker_ids = cfg.single_run ? SBX_SINGLE_RUN_WORKER_IDS : SBX_DEFAULT_WORKER_IDS;
    if (cfg.worker_uid >= 0 && ((uint64_t)cfg.worker_uid + cfg.worker_ids > UINT32_MAX ||
                                (uint64_t)cfg.worker_gid + cfg.worker_ids > UINT32_MAX))
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "worker id range past 2^32 - 1");
    sbx = calloc(1, sizeof(*sbx));
    if (!sbx)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    sbx->ctl = sbx->template_pidfd = -1;
    sbx->work.root_fd = sbx->work.fd = sbx->work.owner_fd = -1;
    sbx->template_pid = -1;
    pthread_mutex_init(&sbx->ctl_lock, NULL);
    admission_init(&sbx->admission, cfg.max_running ? cfg.max_running : default_pool_size(),
                   cfg.max_queued ? cfg.max_queued : DEFAULT_MAX_QUEUED);
    /* Kept for restarts: the caller's strings may be gone by then. */
    char tmpl[PATH_MAX];
    sbx->template_path = strdup(template_path(&cfg, tmpl, sizeof(tmpl)));
    cfg.template_path = NULL;
    cfg.work_root = NULL;
    cfg.warm_modules = cfg.warm_modules ? copy_list(cfg.warm_modules) : NULL;
    cfg.module_dirs = cfg.module_dirs ? copy_list(cfg.module_dirs) : NULL;
    cfg.packages = cfg.packages && cfg.packages[0] ? copy_list(cfg.packages) : NULL;
    sbx->cfg = cfg;
    if (!sbx->template_path || (given && given->warm_modules && !cfg.warm_modules) ||
        (given && given->module_dirs && !cfg.module_dirs) ||
        (given && given->packages && given->packages[0] && !cfg.packages)) {
        sbx_close(sbx);
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    }
    /* Once: a template that is started again shows the same places. */
    if (cfg.packages && (rc = packages_resolve(cfg.packages, &sbx->packages, err)) < 0) {
        sbx_close(sbx);
        return rc;
    }

    rc = workdir_make(&sbx->work, given ? given->work_root : NULL, "pysbx-", geteuid() == 0, err);
    if (rc == 0)
        rc = control_start(sbx, err);
    if (rc == 0)
        rc = sbx_check_layers(sbx, cfg.required_layers, err);
    if (rc < 0) {
        sbx_close(sbx);
        return rc;
    }
    *out = sbx;
    return 0;
}

void sbx_close(struct sbx *sbx)
{
    if (!sbx)
        return;
    /* The template first: runs still in flight then end at once (as
     * cancelled), and nothing waits on a worker that will not come. */
    control_stop(sbx);
    admission_close(&sbx->admission);
    workdir_remove(&sbx->work);
    pthread_mutex_destroy(&sbx->ctl_lock);
    admission_destroy(&sbx->admission);
    free_list((char **)sbx->cfg.warm_modules);
    free_list((char **)sbx->cfg.module_dirs);
    free_list((char **)sbx->cfg.packages);
    packages_free(&sbx->packages);
    free(sbx->template_path);
    free(sbx);
}

int sbx_health(struct sbx *sbx, struct sbx_health *h)
{
    admission_counts(&sbx->admission, &h->running, &h->waiting);
    return control_health(sbx, h);
}
