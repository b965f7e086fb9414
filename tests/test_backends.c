/* The backend seam: the embedded sandbox and a fresh python3 per run answer
 * the same requests with the same result contract. */
#define _GNU_SOURCE
#include "helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct backends {
    struct sbx_backend b[2];
    char root[256];
};

static int open_backends(void **state)
{
    struct backends *s = calloc(1, sizeof(*s));
    struct sbx_config cfg;
    struct sbx_error err;
    make_temp_dir(s->root, sizeof(s->root));
    chmod(s->root, 0711);
    test_config_init(&cfg, s->root);
    if (sbx_backend_open("embedded", &cfg, &s->b[0], &err) < 0 ||
        sbx_backend_open("python3", &cfg, &s->b[1], &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return -1;
    }
    *state = s;
    return 0;
}

static int close_backends(void **state)
{
    struct backends *s = *state;
    for (int i = 0; i < 2; i++)
        s->b[i].close(s->b[i].self);
    int left = count_entries(s->root);
    rmdir(s->root);
    free(s);
    return left == 0 ? 0 : -1;
}

struct want {
    const char *code;
    double cpu, wall;
    enum sbx_status status;
    enum sbx_limit_kind limit;
    int exit_code;
    const char *stdout_text; /* exact, or NULL */
    const char *stderr_has;  /* substring, or NULL */
    const char *artifact;    /* the one artifact's name, or NULL for none */
};

static void both_backends_answer_alike(void **state)
{
    struct backends *s = *state;
    const struct sbx_file input = {"in.txt", "input", 5};
    const struct want cases[] = {
        {"print(1)\n", 5, 10, SBX_COMPLETED, SBX_LIMIT_NONE, 0, "1\n", NULL, NULL},
        {"def f():\n    raise ValueError('x')\nf()\n", 5, 10, SBX_COMPLETED, SBX_LIMIT_NONE, 1, "",
         "    raise ValueError('x')\n", NULL},
        {"import sys\nsys.exit(3)\n", 5, 10, SBX_COMPLETED, SBX_LIMIT_NONE, 3, "", NULL, NULL},
        {"print(open('in.txt').read())\nopen('out.txt', 'w').write('o')\n", 5, 10, SBX_COMPLETED,
         SBX_LIMIT_NONE, 0, "input\n", NULL, "out.txt"},
        {"x = (\n", 5, 10, SBX_COMPLETED, SBX_LIMIT_NONE, 1, "", "SyntaxError", NULL},
        {"while True: pass\n", 1, 10, SBX_TIMEOUT, SBX_LIMIT_CPU, -1, NULL, NULL, NULL},
        {"import time\ntime.sleep(10)\n", 5, 0.5, SBX_TIMEOUT, SBX_LIMIT_WALL, -1, NULL, NULL,
         NULL},
        {"b = bytearray(1 << 30)\n", 5, 10, SBX_MEMORY_LIMIT, SBX_LIMIT_MEMORY, -1, NULL,
         "MemoryError", NULL},
        {"import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", 5, 10, SBX_CRASHED,
         SBX_LIMIT_NONE, -1, NULL, NULL, NULL},
    };
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            const struct want *w = &cases[i];
            struct sbx_request req;
            struct sbx_result *r = NULL;
            struct sbx_error err;
            sbx_request_init(&req);
            req.code = w->code;
            req.code_len = strlen(w->code);
            req.files = &input;
            req.n_files = 1;
            req.limits.cpu_seconds = w->cpu;
            req.limits.wall_seconds = w->wall;
            assert_int_equal(s->b[k].run(s->b[k].self, &req, &r, &err), 0);
            if (r->status != w->status || r->limit != w->limit || r->exit_code != w->exit_code ||
                (w->stdout_text && strcmp(r->stdout_text, w->stdout_text) != 0) ||
                (w->stderr_has && !strstr(r->stderr_text, w->stderr_has)) ||
                (w->artifact ? r->n_artifacts != 1 || strcmp(r->artifacts[0].name, w->artifact)
                             : r->n_artifacts != 0))
                fail_msg("%s backend, case %zu: %s/%d exit %d (%s)\nstdout: %s\nstderr: %s",
                         s->b[k].name, i, sbx_status_name(r->status), r->limit, r->exit_code,
                         r->reason ? r->reason : "", r->stdout_text, r->stderr_text);
            sbx_result_free(r);
        }
    }
}

static void both_backends_refuse_bad_requests_alike(void **state)
{
    struct backends *s = *state;
    for (int k = 0; k < 2; k++) {
        struct sbx_request req;
        struct sbx_result *r = NULL;
        struct sbx_error err = {0};
        sbx_request_init(&req);
        req.code = "pass";
        req.code_len = 4;
        req.limits.wall_seconds = 0;
        assert_int_equal(s->b[k].run(s->b[k].self, &req, &r, &err), -22);
        assert_int_equal(err.code, SBX_ERR_INVALID_LIMIT);
        assert_null(r);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(both_backends_answer_alike),
        cmocka_unit_test(both_backends_refuse_bad_requests_alike),
    };
    return cmocka_run_group_tests(tests, open_backends, close_backends);
}
