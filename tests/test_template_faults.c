/*
 * Fault injection in the template: a helper built with fork, mount and
 * pipe2 failing now and then (tests/template_faults.c). Every request still
 * ends in exactly one answer, the failures say what failed, the sandbox
 * goes on serving, and nothing is left when it closes.
 *
 * Runs as pid 1 of its own pid namespace.
 */
#define _GNU_SOURCE
#include "helpers.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static void a_template_whose_forks_and_mounts_fail_still_answers_each_run(void **state)
{
    (void)state;
    char root[256];
    struct sbx_config cfg;
    struct sbx_error err = {0};
    struct sbx *sbx = NULL;
    unsigned completed = 0, failed = 0, refused = 0;

    make_temp_dir(root, sizeof(root));
    chmod(root, 0711);
    int fds_before = count_fds();
    sbx_config_init(&cfg);
    cfg.template_path = PYSBX_FAULTS_TEMPLATE;
    cfg.work_root = root;
    cfg.pool_size = 2;
    if (sbx_open(&cfg, &sbx, &err) < 0)
        fail_msg("sbx_open: %s", err.message);
    for (int i = 0; i < 60; i++) {
        struct sbx_result *res = NULL;
        struct sbx_request req;
        sbx_request_init(&req);
        req.code = "open('f', 'w').write('x')\nprint('ok')\n";
        req.code_len = strlen(req.code);
        int rc = sbx_run(sbx, &req, &res, &err);
        if (rc < 0) {
            assert_null(res);
            assert_true(err.code != SBX_ERR_NONE);
            refused++;
            continue;
        }
        if (res->status == SBX_COMPLETED) {
            assert_string_equal(res->stdout_text, "ok\n");
            assert_int_equal(res->n_artifacts, 1);
            completed++;
        } else {
            assert_int_equal(res->status, SBX_SANDBOX_ERROR);
            assert_non_null(res->reason);
            if (!strstr(res->reason, "fork") && !strstr(res->reason, "mount") &&
                !strstr(res->reason, "pipe"))
                fail_msg("a failure that does not say what failed: %s", res->reason);
            failed++;
        }
        sbx_result_free(res);
    }
    sbx_close(sbx);
    fprintf(stderr, "template faults: %u completed, %u sandbox errors, %u refused\n", completed,
            failed, refused);
    assert_true(completed > 0);
    assert_true(failed > 0);
    assert_int_equal(count_fds(), fds_before);
    assert_int_equal(count_entries(root), 0);
    remove_dir(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_template_whose_forks_and_mounts_fail_still_answers_each_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
