/*
 * Degraded deployments: each layer turned off in turn (the test-only
 * disable_layers switch), so that the paths a machine without it takes run
 * in CI too. For each: the sandbox opens when asked for less, doctor's
 * report says the layer is off, ordinary code still works, and what the
 * remaining layers are there to stop is still stopped.
 *
 * Runs as pid 1 of its own pid namespace (tests/in_pidns.sh): with seccomp
 * off, fork is no longer refused.
 */
#define _GNU_SOURCE
#include "helpers.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];
static char host_dir[300]; /* world-readable, outside any workspace */
static char secret[400];   /* in it, world-readable */
static char owned[400];    /* in it, owned by the first worker uid */

static struct sbx *open_without(unsigned disable, unsigned ids)
{
    struct sbx_config cfg;
    struct sbx_error err = {0};
    struct sbx *sbx = NULL;

    test_config_init(&cfg, root);
    cfg.required_layers = 0; /* a deployment that accepts less says so */
    cfg.disable_layers = disable;
    cfg.worker_ids = ids;
    if (sbx_open(&cfg, &sbx, &err) < 0)
        fail_msg("sbx_open without %s: %s", sbx_layer_name(disable), err.message);
    return sbx;
}

static void expect_off(struct sbx *sbx, unsigned layer)
{
    struct sbx_layer_info l[SBX_LAYER_COUNT];
    sbx_layers(sbx, l);
    for (int i = 0; i < SBX_LAYER_COUNT; i++)
        if (l[i].layer == layer && l[i].active)
            fail_msg("%s is still reported active: %s", l[i].name, l[i].detail);
}

static bool active(struct sbx *sbx, unsigned layer)
{
    struct sbx_layer_info l[SBX_LAYER_COUNT];
    sbx_layers(sbx, l);
    return l[__builtin_ctz(layer)].active;
}

static void expect(struct sbx *sbx, const char *what, const char *code, const char *want)
{
    struct sbx_result *r = run_code(sbx, code);
    if (r->status != SBX_COMPLETED || r->exit_code != 0 || strcmp(r->stdout_text, want) != 0)
        fail_msg("%s: %s exit %d\nstdout:\n%s\nexpected:\n%s\nstderr:\n%s", what,
                 sbx_status_name(r->status), r->exit_code, r->stdout_text, want, r->stderr_text);
    sbx_result_free(r);
}

static void still_works_and_still_holds(unsigned disable, unsigned ids)
{
    struct sbx *sbx = open_without(disable, ids);
    char code[2048];

    expect_off(sbx, disable);
    /* Ordinary code, files in and out. */
    struct sbx_result *r = run_code(sbx, "import json\nopen('out.json', 'w').write("
                                         "json.dumps({'a': 1}))\nprint(sum(range(10)))\n");
    expect_completed(r, 0);
    assert_string_equal(r->stdout_text, "45\n");
    assert_int_equal(r->n_artifacts, 1);
    sbx_result_free(r);
    /* No network: the shim, seccomp and the namespace each refuse. */
    expect(sbx, "network",
           "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 22), 1)\n"
           "    print('connected')\nexcept OSError:\n    print('no network')\n",
           "no network\n");
    /* Host files: Landlock or the private root, whichever remains. */
    snprintf(code, sizeof(code),
             "try:\n    open('%s').read()\n    print('read')\n"
             "except OSError:\n    print('refused')\n",
             secret);
    expect(sbx, "host file", code, "refused\n");
    /* Metadata of a host file the worker's uid owns: the private root hides
     * it; without one, seccomp refuses chmod, chown and utime by path. */
    snprintf(code, sizeof(code),
             "import os\nchanged = []\n"
             "for name, f in (('chmod', lambda: os.chmod('%s', 0o4777)),\n"
             "                ('utime', lambda: os.utime('%s', (0, 0))),\n"
             "                ('chown', lambda: os.chown('%s', os.getuid(), -1))):\n"
             "    try:\n        f()\n        changed.append(name)\n"
             "    except OSError:\n        pass\n"
             "print(changed)\n",
             owned, owned, owned);
    struct stat before, after;
    assert_int_equal(stat(owned, &before), 0);
    expect(sbx, "host file metadata", code, "[]\n");
    assert_int_equal(stat(owned, &after), 0);
    assert_int_equal(before.st_mode, after.st_mode);
    assert_int_equal(before.st_mtime, after.st_mtime);
    /* Processes: seccomp, unless it is the layer turned off. */
    if (active(sbx, SBX_LAYER_SECCOMP))
        expect(sbx, "fork",
               "import os\ntry:\n    os.fork()\n    print('forked')\n"
               "except OSError:\n    print('refused')\n",
               "refused\n");
    sbx_close(sbx);
}

#define LAYER_TEST(layer, ids)                                                                     \
    static void without_##layer(void **state)                                                      \
    {                                                                                              \
        (void)state;                                                                               \
        still_works_and_still_holds(SBX_LAYER_##layer, ids);                                       \
    }

LAYER_TEST(SECCOMP, 1)
LAYER_TEST(LANDLOCK, 1)
LAYER_TEST(NETNS, 1)
LAYER_TEST(MOUNTNS, 1)
LAYER_TEST(IPCNS, 1)
LAYER_TEST(UTSNS, 1)
LAYER_TEST(USER, 1)
LAYER_TEST(ROOT, 1)
LAYER_TEST(UIDRUN, 0)

static int setup(void **state)
{
    (void)state;
    make_temp_dir(root, sizeof(root));
    chmod(root, 0711);
    snprintf(host_dir, sizeof(host_dir), "%s/host", root);
    mkdir(host_dir, 0755);
    snprintf(secret, sizeof(secret), "%s/secret", host_dir);
    int fd = open(secret, O_WRONLY | O_CREAT, 0644);
    (void)!write(fd, "hunter2", 7);
    close(fd);
    /* With worker_ids 1 every worker runs as the first id: it owns this. */
    snprintf(owned, sizeof(owned), "%s/owned", host_dir);
    fd = open(owned, O_WRONLY | O_CREAT, 0644);
    close(fd);
    if (geteuid() == 0)
        (void)!chown(owned, (uid_t)SBX_DEFAULT_WORKER_ID_BASE, (gid_t)SBX_DEFAULT_WORKER_ID_BASE);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    remove_dir(root);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(without_SECCOMP), cmocka_unit_test(without_LANDLOCK),
        cmocka_unit_test(without_NETNS),   cmocka_unit_test(without_MOUNTNS),
        cmocka_unit_test(without_IPCNS),   cmocka_unit_test(without_UTSNS),
        cmocka_unit_test(without_USER),    cmocka_unit_test(without_ROOT),
        cmocka_unit_test(without_UIDRUN),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
