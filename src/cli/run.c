/* pysbx run: one script, its output passed through, its exit status ours. */
#define _GNU_SOURCE
#include "commands.h"
#include "connect.h"
#include "options.h"
#include "stopper.h"
#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* What was not returned, and why, on stderr. */
static void report_dropped(const struct sbx_result *res)
{
    static const char *const why[] = {
        [SBX_DROP_MAX_ARTIFACTS] = "past --max-artifacts",
        [SBX_DROP_MAX_TOTAL_BYTES] = "past --max-artifacts-total-bytes",
        [SBX_DROP_TOO_DEEP] = "too deep to look into",
        [SBX_DROP_UNREADABLE] = "could not be read",
        [SBX_DROP_LINKED] = "has several names and the workspace is not its own file system",
    };

    for (size_t i = 0; i < res->n_dropped; i++) {
        const struct sbx_dropped_artifact *d = &res->dropped[i];
        fprintf(stderr, "pysbx: not returned: %s (%s)\n", d->name,
                (unsigned)d->reason < ARRAY_SIZE(why) && why[d->reason] ? why[d->reason]
                                                                        : "unknown");
    }
    if (res->artifacts_dropped > res->n_dropped)
        fprintf(stderr, "pysbx: %llu more files not returned\n",
                (unsigned long long)(res->artifacts_dropped - res->n_dropped));
}

/* --artifacts-dir, made if missing and opened before the code runs: a
 * directory that cannot take the files is said before the run, not after
 * it. The descriptor, or -1 with the reason on stderr. */
static int open_artifacts_dir(const char *dir)
{
    int dfd = -1;

    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        goto fail;
    dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || faccessat(dfd, ".", W_OK | X_OK, AT_EACCESS) < 0)
        goto fail;
    return dfd;
fail:
    fprintf(stderr, "pysbx: --artifacts-dir %s: %s\n", dir, strerror(errno));
    if (dfd >= 0)
        close(dfd);
    return -1;
}

static int save_artifacts(int dfd, const struct sbx_result *res)
{
    int rc = 0;

    for (size_t i = 0; i < res->n_artifacts; i++) {
        const struct sbx_artifact *a = &res->artifacts[i];
        /* Under its true name, which came from the code: it must stay
         * beneath DIR, through no link that may already be there. */
        const char *raw = a->raw_name ? a->raw_name : a->name;
        int fd = path_problem(raw, strlen(raw))
                     ? -EINVAL
                     : open_beneath(dfd, raw, O_WRONLY | O_CREAT | O_TRUNC, 0644, true);
        if (fd < 0 || write_full(fd, a->data, a->data_len) < 0) {
            fprintf(stderr, "pysbx: saving artifact %s: %s\n", a->name,
                    strerror(fd < 0 ? -fd : errno));
            rc = -1;
        }
        if (fd >= 0)
            close(fd);
        if (a->truncated)
            fprintf(stderr, "pysbx: artifact %s was cut to %zu of %llu bytes\n", a->name,
                    a->data_len, (unsigned long long)a->size);
    }
    report_dropped(res);
    return rc;
}

/* The code's stdout and stderr, passed on as they arrive: exactly the text
 * the result holds, bounded the same way. */
static void pass_through(void *user, int stream, const char *text, size_t len)
{
    (void)user;
    FILE *f = stream == 1 ? stdout : stderr;
    fwrite(text, 1, len, f);
    fflush(f);
}

static int report(const struct opts *o, int artifacts_fd, const struct sbx_result *res)
{
    if (artifacts_fd >= 0 && res->status == SBX_COMPLETED &&
        save_artifacts(artifacts_fd, res) < 0 && !o->json)
        return EXIT_SANDBOX;
    if (o->json) {
        char *s = sbx_result_to_json(res);
        if (!s) {
            fputs("pysbx: out of memory\n", stderr);
            return EXIT_SANDBOX;
        }
        puts(s);
        free(s);
        return 0;
    }
    /* The code's output went out as it came (pass_through). */
    if (!o->artifacts_dir && res->n_artifacts)
        fprintf(stderr, "pysbx: %zu file%s left in the workspace (save with --artifacts-dir)\n",
                res->n_artifacts, res->n_artifacts == 1 ? "" : "s");
    switch (res->status) {
    case SBX_COMPLETED:
        return res->exit_code;
    case SBX_TIMEOUT:
        fprintf(stderr, "pysbx: timeout: %s\n", res->reason);
        return EXIT_TIMEOUT;
    case SBX_MEMORY_LIMIT:
        fprintf(stderr, "pysbx: memory_limit: %s\n", res->reason);
        return EXIT_MEMORY;
    case SBX_CRASHED:
        fprintf(stderr, "pysbx: crashed: %s\n", res->reason);
        return EXIT_SIGNAL + res->signal;
    case SBX_CANCELLED:
    case SBX_SANDBOX_ERROR:
        break;
    }
    fprintf(stderr, "pysbx: %s: %s\n", sbx_status_name(res->status),
            res->reason ? res->reason : "");
    return EXIT_SANDBOX;
}

/* The sandbox could not start (a required layer missing, or no template):
 * in --json mode this is still an answer, a sandbox_error result. */
static int cannot_start(const struct opts *o, const struct sbx_error *err)
{
    if (o->json) {
        struct sbx_result r = {
            .status = SBX_SANDBOX_ERROR,
            .exit_code = -1,
            .stdout_text = "",
            .stderr_text = "",
            .partial = true,
            .reason = (char *)err->message,
        };
        char *s = sbx_result_to_json(&r);
        if (s)
            puts(s);
        free(s);
        return EXIT_SANDBOX;
    }
    return open_error(CMD_RUN, err);
}

/* The whole of |path| into |buf|, or a usage error (status 2) naming
 * |what| path and, past |max|, the limit as a size ("larger than the code
 * limit of 64 MiB"). */
static int read_input(const char *path, const char *what, size_t max, const char *limit_is,
                      char **buf, size_t *len)
{
    int rc = slurp(path, max, buf, len);
    char limit[48];

    if (rc == 0)
        return 0;
    if (rc != -EFBIG)
        return usage_error(CMD_RUN, "%s%s: %s", what, path, strerror(-rc));
    fmt_size(limit, sizeof(limit), max);
    return usage_error(CMD_RUN, "%s%s: larger than %s%s", what, path, limit_is, limit);
}

int cmd_run(int argc, char **argv)
{
    struct opts o;
    struct sbx_backend b = {0};
    struct sbx_request req;
    struct sbx_result *res = NULL;
    struct sbx_error err = {0};
    char *code = NULL, *input = NULL;
    size_t code_len = 0, input_len = 0;
    int status, artifacts_fd = -1;

    status = parse_opts(CMD_RUN, argc, argv, &o);
    if (status != 0) {
        status = status < 0 ? 0 : status;
        goto out;
    }
    if ((status = read_input(o.target, "", SBX_MAX_CODE_BYTES, "the code limit of ", &code,
                             &code_len)) != 0 ||
        (o.stdin_path && (status = read_input(o.stdin_path, "--stdin ", SBX_MAX_REQUEST_BYTES,
                                              "a request may be, ", &input, &input_len)) != 0))
        goto out;
    sbx_request_init(&req);
    req.code = code;
    req.code_len = code_len;
    req.files = o.files;
    req.n_files = o.n_files;
    req.limits = o.limits;
    req.argv = o.args;
    req.argc = o.n_args;
    req.stdin_data = input;
    req.stdin_len = input_len;
    /* The program's name as given, as python3 would have it ("-": standard
     * input); one that is not UTF-8 is left out rather than refused. */
    size_t name_len = strlen(o.target);
    if (name_len && name_len <= 4096 &&
        utf8_valid_prefix((const unsigned char *)o.target, name_len) == name_len)
        req.filename = o.target;
    /* Refuse a bad request before paying for a template. */
    if (sbx_request_check(&req, &err) < 0) {
        status = usage_error(CMD_RUN, "%s", err.message);
        goto out;
    }
    if (o.artifacts_dir && (artifacts_fd = open_artifacts_dir(o.artifacts_dir)) < 0) {
        status = EXIT_USAGE;
        goto out;
    }
    const char *server = o.connect ? o.connect : getenv("PYSBX_CONNECT");
    if (server && *server) {
        /* A running server does the run: its answer, printed as ours. */
        if (o.backend || o.template_path || o.policy_debug || o.required != SBX_LAYERS_DEFAULT ||
            o.packages || o.module_dirs || o.workspace_bytes) {
            status = usage_error(CMD_RUN, "--connect runs on the server's sandbox: --backend, "
                                          "--template, --require, --packages, --module-dir, "
                                          "--workspace-size and --policy-debug are its");
            goto out;
        }
        if (remote_run(server, &req, o.limits_given, &res, &err) < 0) {
            fprintf(stderr, "pysbx: %s\n", err.message);
            status = err.code == SBX_ERR_UNAVAILABLE || err.code == SBX_ERR_BUSY ? EXIT_SANDBOX
                                                                                 : EXIT_USAGE;
            goto out;
        }
        if (!o.json) {
            fwrite(res->stdout_text, 1, res->stdout_len, stdout);
            fflush(stdout);
            fwrite(res->stderr_text, 1, res->stderr_len, stderr);
        }
        status = report(&o, artifacts_fd, res);
        goto out;
    }
    (void)stopper_start();
    if (open_backend(&o, &b, &err) < 0) {
        status = cannot_start(&o, &err);
        goto out;
    }
    /* A signal cancels the run; the sandbox is still closed below. (The
     * stopper started before the sandbox did: no window without it.) */
    req.cancel = stopper_start();
    if (!o.json)
        req.on_output = pass_through;
    if (b.run(b.self, &req, &res, &err) < 0) {
        fprintf(stderr, "pysbx: %s\n", err.message);
        status = err.code == SBX_ERR_UNAVAILABLE ? EXIT_SANDBOX : EXIT_USAGE;
        goto out;
    }
    status = report(&o, artifacts_fd, res);
    if (stopper_signal())
        status = EXIT_SIGNAL + stopper_signal();
out:
    if (artifacts_fd >= 0)
        close(artifacts_fd);
    sbx_result_free(res);
    if (b.close)
        b.close(b.self);
    free(code);
    free(input);
    opts_free(&o);
    return status;
}
