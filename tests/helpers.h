/* Shared by the tests: a sandbox opened on the build tree's template, and a
 * one-call way to run a snippet. */
#ifndef PYSBX_TEST_HELPERS_H
#define PYSBX_TEST_HELPERS_H

/* cmocka needs these first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "pysbx.h"

#include <stdbool.h>

struct fixture {
    struct sbx *sbx;
    char root[256]; /* a private work root, removed at teardown */
};

/* sbx_config_init, then the build tree's template and |work_root|. */
void test_config_init(struct sbx_config *cfg, const char *work_root);

/* cmocka group setup/teardown: state is a struct fixture. */
int fixture_open(void **state);
int fixture_close(void **state);

/* sbx_run; or, with PYSBX_TEST_SESSION set, the same request as the second
 * cell of a session opened for it (and closed after). */
int test_run(struct sbx *sbx, const struct sbx_request *req, struct sbx_result **out,
             struct sbx_error *err);

/* Runs |code| with default limits changed by |limits| (may be NULL) and the
 * given files; fails the test if sbx_run refuses. */
struct sbx_result *run_with(struct sbx *sbx, const char *code, const struct sbx_limits *limits,
                            const struct sbx_file *files, size_t n_files);
struct sbx_result *run_code(struct sbx *sbx, const char *code);

/* Asserts |res| completed with exit code |code|, printing its output if not. */
void expect_completed(const struct sbx_result *res, int code);
/* Runs |code| with default limits; asserts it completed with exit code 0 and
 * printed exactly |want|. */
void expect_stdout(struct sbx *sbx, const char *code, const char *want);

/* Entries in a directory, "." and ".." aside; -1 if it cannot be opened. */
int count_entries(const char *dir);
/* Number of open descriptors of this process. */
int count_fds(void);
/* The same, each as "number:what it is" on a line of |out|. */
int list_fds(char *out, size_t cap);
/* Makes a temporary directory; returns its path in |buf|. */
void make_temp_dir(char *buf, size_t cap);
/* rm -rf without following links (the library's own). */
void remove_dir(const char *path);

#endif
