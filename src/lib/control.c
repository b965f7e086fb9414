#define _GNU_SOURCE
#include "control.h"

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
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* The template imports its warm set before it answers; on a cold disk cache
 * that can take a while. */
#define TEMPLATE_START_TIMEOUT_MS 60000
/* The descriptor the template finds its control socket on. */
#define TEMPLATE_CTL_FD 3

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
                            cfg->warm_modules ? string_array(cfg->warm_modules) : json_null()) <
            0 ||
        json_object_set_new(o, "module_dirs", string_array(cfg->module_dirs)) < 0 ||
        json_object_set_new(o, "worker_uid", json_integer(cfg->worker_uid)) < 0 ||
        json_object_set_new(o, "worker_gid", json_integer(cfg->worker_gid)) < 0 ||
        json_object_set_new(o, "worker_ids", json_integer(cfg->worker_ids)) < 0 ||
        json_object_set_new(o, "disable_layers", json_integer(cfg->disable_layers)) < 0 ||
        json_object_set_new(o, "workspace_bytes", json_integer((json_int_t)cfg->workspace_bytes)) <
            0 ||
        json_object_set_new(o, "policy_debug", json_boolean(cfg->policy_debug)) < 0)
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
    struct wire_hello hello;
    char why[WIRE_TEXT_MAX];
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

int control_start(struct sbx *sbx, const char *path, const struct sbx_config *cfg,
                  struct sbx_error *err)
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
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -errno, "fcntl: %s", strerror(errno));
    rc = spawn_template(sbx, path, child_end, err);
    close(child_end);
    if (rc == 0)
        rc = send_config(sbx, cfg, err);
    if (rc == 0)
        rc = await_hello(sbx, err);
    return rc;
}

int control_take_worker(struct sbx *sbx, struct taken_worker *w, char *why, size_t whylen)
{
    union {
        struct wire_hdr hdr;
        struct wire_worker worker;
        struct wire_fail fail;
    } m;
    struct wire_worker worker;
    int nfds = 0;
    ssize_t n;
    int rc;

    for (int i = 0; i < WFD_COUNT; i++)
        w->fds[i] = -1;
    pthread_mutex_lock(&sbx->ctl_lock);
    n = sbx->ctl < 0 ? -EBADF : wire_recv(sbx->ctl, &m, sizeof(m), w->fds, WFD_COUNT, &nfds);
    if (n > 0) {
        /* Whatever it was, one of the template's pool is spoken for. */
        struct wire_hdr take = {WIRE_TAKE, WIRE_VERSION};
        (void)wire_send(sbx->ctl, &take, sizeof(take), NULL, 0);
    }
    pthread_mutex_unlock(&sbx->ctl_lock);

    if (n <= 0) {
        close_fds(w->fds, WFD_COUNT);
        return errmsg(why, whylen, n < 0 ? (int)n : -EPIPE, "the template process is gone%s%s",
                      n < 0 ? ": " : "", n < 0 ? strerror((int)-n) : "");
    }
    rc = wire_decode_worker(&m, (size_t)n, nfds, &worker, why, whylen);
    if (rc < 0) {
        close_fds(w->fds, WFD_COUNT);
        return rc;
    }
    w->pid = worker.pid;
    w->uid = worker.uid;
    w->gid = worker.gid;
    fmt(w->workspace, sizeof(w->workspace), "%s", worker.workspace);
    return 0;
}

void control_stop(struct sbx *sbx)
{
    /* End of stream tells the template to kill its workers and exit. */
    close_fd(&sbx->ctl);
    if (sbx->template_pid > 0)
        while (waitpid(sbx->template_pid, NULL, 0) < 0 && errno == EINTR)
            ;
    sbx->template_pid = -1;
}
