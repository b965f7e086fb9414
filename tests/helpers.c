#define _GNU_SOURCE
#include "helpers.h"

#include "sysutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void make_temp_dir(char *buf, size_t cap)
{
    const char *t = getenv("TMPDIR");
    snprintf(buf, cap, "%s/pysbx-test-XXXXXX", t && *t ? t : "/tmp");
    assert_non_null(mkdtemp(buf));
}

void remove_dir(const char *path)
{
    char copy[4096];
    snprintf(copy, sizeof(copy), "%s", path);
    char *base = basename(copy);
    char parent[4096];
    snprintf(parent, sizeof(parent), "%s", path);
    int pfd = open(dirname(parent), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(pfd >= 0);
    remove_tree_at(pfd, base);
    close(pfd);
}

void test_config_init(struct sbx_config *cfg, const char *work_root)
{
    /* PYSBX_TEST_PACKAGES=numpy,pandas runs a suite again on a template
     * with those packages loaded: they must not open a way out. */
    static char list[256];
    static const char *packages[8];
    const char *env = getenv("PYSBX_TEST_PACKAGES");

    sbx_config_init(cfg);
    /* PYSBX_TEST_TEMPLATE: a suite again on another build of the helper
     * (tests/CMakeLists.txt's pysbx-template-written). */
    const char *tmpl = getenv("PYSBX_TEST_TEMPLATE");
    cfg->template_path = tmpl && *tmpl ? tmpl : PYSBX_TEST_TEMPLATE;
    cfg->work_root = work_root;
    if (env && *env && !packages[0]) {
        size_t n = 0;
        snprintf(list, sizeof(list), "%s", env);
        for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok && n < 7;
             tok = strtok_r(NULL, ",", &save))
            packages[n++] = tok;
    }
    if (packages[0])
        cfg->packages = packages;
    /* PYSBX_TEST_DISABLE_LAYERS=freeze,...: a suite again on a machine as
     * one without those layers would be (as the command takes it). */
    const char *off = getenv("PYSBX_TEST_DISABLE_LAYERS");
    for (unsigned i = 0; off && i < SBX_LAYER_COUNT; i++) {
        const char *name = sbx_layer_name(1u << i);
        const char *at = name ? strstr(off, name) : NULL;
        size_t len = name ? strlen(name) : 0;
        if (at && (at == off || at[-1] == ',') && (at[len] == '\0' || at[len] == ','))
            cfg->disable_layers |= 1u << i;
    }
}

int fixture_open(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    struct sbx_config cfg;
    struct sbx_error err = {0};

    if (!f)
        return -1;
    make_temp_dir(f->root, sizeof(f->root));
    chmod(f->root, 0711); /* workers under their own uid pass through it */
    test_config_init(&cfg, f->root);
    if (sbx_open(&cfg, &f->sbx, &err) < 0) {
        fprintf(stderr, "sbx_open: %s\n", err.message);
        rmdir(f->root);
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

int fixture_close(void **state)
{
    struct fixture *f = *state;

    sbx_close(f->sbx);
    /* Closing must leave nothing behind in the work root. */
    int left = count_entries(f->root);
    rmdir(f->root);
    free(f);
    return left == 0 ? 0 : -1;
}

int test_run(struct sbx *sbx, const struct sbx_request *req, struct sbx_result **out,
             struct sbx_error *err)
{
    /* PYSBX_TEST_SESSION=1 runs a suite again with each run as the second
     * cell of a session of its own: a fork of a state that was a cell. */
    const char *env = getenv("PYSBX_TEST_SESSION");
    struct sbx_session_limits l;
    struct sbx_session *s;
    struct sbx_request first;
    struct sbx_result *r0 = NULL;
    int rc;

    if (!env || !*env)
        return sbx_run(sbx, req, out, err);
    sbx_session_limits_init(&l);
    l.memory_bytes = req->limits.memory_bytes;
    if ((rc = sbx_session_open(sbx, &l, &s, err)) < 0)
        return rc;
    sbx_request_init(&first);
    first.code = "_before = 1\n";
    first.code_len = strlen(first.code);
    rc = sbx_session_run(s, &first, SBX_ROLLBACK_ON_ERROR, &r0, err);
    if (rc == 0) {
        expect_completed(r0, 0);
        assert_false(r0->rolled_back);
        sbx_result_free(r0);
        rc = sbx_session_run(s, req, SBX_ROLLBACK_ON_ERROR, out, err);
    }
    sbx_session_close(s);
    return rc;
}

struct sbx_result *run_with(struct sbx *sbx, const char *code, const struct sbx_limits *limits,
                            const struct sbx_file *files, size_t n_files)
{
    struct sbx_request req;
    struct sbx_result *res = NULL;
    struct sbx_error err = {0};

    sbx_request_init(&req);
    req.code = code;
    req.code_len = strlen(code);
    req.files = files;
    req.n_files = n_files;
    if (limits)
        req.limits = *limits;
    if (test_run(sbx, &req, &res, &err) < 0)
        fail_msg("sbx_run refused: %s: %s", sbx_error_code_name(err.code), err.message);
    assert_non_null(res);
    assert_non_null(res->stdout_text);
    assert_non_null(res->stderr_text);
    return res;
}

struct sbx_result *run_code(struct sbx *sbx, const char *code)
{
    return run_with(sbx, code, NULL, NULL, 0);
}

void expect_completed(const struct sbx_result *res, int code)
{
    if (res->status != SBX_COMPLETED || res->exit_code != code)
        fail_msg("expected completed/%d, got %s/%d (%s)\nstdout: %s\nstderr: %s", code,
                 sbx_status_name(res->status), res->exit_code, res->reason ? res->reason : "",
                 res->stdout_text, res->stderr_text);
}

void expect_stdout(struct sbx *sbx, const char *code, const char *want)
{
    struct sbx_result *r = run_code(sbx, code);
    expect_completed(r, 0);
    if (strcmp(r->stdout_text, want) != 0)
        fail_msg("stdout:\n%s\nexpected:\n%s\nstderr:\n%s", r->stdout_text, want, r->stderr_text);
    sbx_result_free(r);
}

int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;

    if (!d)
        return -1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

int count_fds(void)
{
    return count_entries("/proc/self/fd") - 1; /* the directory's own */
}

int list_fds(char *out, size_t cap)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    size_t used = 0;
    int n = 0;

    if (cap)
        out[0] = '\0';
    while (d && (e = readdir(d))) {
        char link[256];
        if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d))
            continue;
        ssize_t len = readlinkat(dirfd(d), e->d_name, link, sizeof(link) - 1);
        link[len > 0 ? len : 0] = '\0';
        int w = snprintf(out + used, cap > used ? cap - used : 0, "%s:%s\n", e->d_name, link);
        used += w > 0 ? (size_t)w : 0;
        n++;
    }
    if (d)
        closedir(d);
    return n;
}
