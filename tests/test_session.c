/*
 * Sessions through the public API: state kept across cells; every way a
 * cell can fail rolls its variables and its files back; what a cell may
 * not do to the session (fork, leave a thread, forge its own end); the
 * session's bounds (idle time, max_sessions, max_cells) and its end
 * (session_lost when its process dies); hundreds of cells without leaks.
 *
 * Runs as pid 1 of its own pid namespace (tests/in_pidns.sh): /proc shows
 * this program, the template and its processes only, which the leak checks
 * count, and a fork that got through could not reach the machine.
 */
#define _GNU_SOURCE
#include "session_helpers.h"

#include <dirent.h>
#include <pthread.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SBX(state) (((struct fixture *)*(state))->sbx)

/* The check every rollback test ends with: variables and files as the
 * first cell left them. */
#define SETUP_CELL                                                                                 \
    "import os\n"                                                                                  \
    "x = 1\n"                                                                                      \
    "os.makedirs('d/e', exist_ok=True)\n"                                                          \
    "open('keep.txt', 'w').write('kept')\n"                                                        \
    "open('d/e/deep.txt', 'w').write('deep')\n"
#define CHANGE_EVERYTHING                                                                          \
    "import os, shutil\n"                                                                          \
    "x = 2\n"                                                                                      \
    "y = 3\n"                                                                                      \
    "open('keep.txt', 'w').write('changed')\n"                                                     \
    "open('new.txt', 'w').write('new')\n"                                                          \
    "os.rename('d', 'moved')\n"                                                                    \
    "os.symlink('keep.txt', 'link')\n"                                                             \
    "os.chmod('keep.txt', 0o600)\n"
#define CHECK_CELL                                                                                 \
    "import os\n"                                                                                  \
    "files = sorted(os.path.join(r, f)[2:] for r, ds, fs in os.walk('.') for f in fs + ds)\n"      \
    "print(x, 'y' in dir(), files, open('keep.txt').read(), open('d/e/deep.txt').read(),\n"        \
    "      oct(os.stat('keep.txt').st_mode & 0o777))\n"
#define CHECK_WANT "1 False ['d', 'd/e', 'd/e/deep.txt', 'keep.txt'] kept deep 0o644\n"

static void rolled_back_by(void **state, const char *failing, enum sbx_rollback rb, double wall,
                           enum sbx_status status, const char *reason_part)
{
    struct sbx_session *s = open_session(SBX(state), NULL);
    struct sbx_error err = {0};
    int rc;

    expect_cell(s, SETUP_CELL, "");
    char code[4096];
    snprintf(code, sizeof(code), "%s%s", CHANGE_EVERYTHING, failing);
    struct sbx_result *r = cell_full(s, code, rb, wall, NULL, 0, &rc, &err);
    assert_int_equal(rc, 0);
    if (r->status != status || !r->rolled_back || r->cell != 2)
        fail_msg("%s: got %s (rolled_back %d, cell %llu): %s\n%s", failing,
                 sbx_status_name(r->status), r->rolled_back, (unsigned long long)r->cell,
                 r->reason ? r->reason : "", r->stderr_text);
    if (reason_part && (!r->reason || !strstr(r->reason, reason_part)))
        fail_msg("reason '%s' lacks '%s'", r->reason ? r->reason : "", reason_part);
    sbx_result_free(r);
    expect_cell(s, CHECK_CELL, CHECK_WANT);
    sbx_session_close(s);
}

static void state_kept_across_cells(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);
    static const char csv[] = "a,b\n1,2\n3,4\n";
    struct sbx_file in = {"data.csv", csv, sizeof(csv) - 1};
    struct sbx_error err = {0};
    int rc;

    struct sbx_result *r = cell_full(s, "rows = open('data.csv').read().splitlines()\nlen(rows)",
                                     SBX_ROLLBACK_ON_ERROR, 0, &in, 1, &rc, &err);
    assert_int_equal(rc, 0);
    expect_completed(r, 0);
    assert_int_equal(r->cell, 1);
    assert_false(r->rolled_back);
    assert_string_equal(r->value, "3");
    assert_int_equal(r->n_artifacts, 0); /* the input, unchanged, is no artifact */
    sbx_result_free(r);

    expect_cell(s, "rows.append('5,6')\nprint(len(rows))", "4\n");
    /* Only what a cell created or changed comes back as its artifacts. */
    r = cell(s, "open('out.txt', 'w').write('x')\nprint(open('data.csv').read().count('\\n'))");
    expect_completed(r, 0);
    assert_string_equal(r->stdout_text, "3\n");
    assert_int_equal(r->n_artifacts, 1);
    assert_string_equal(r->artifacts[0].name, "out.txt");
    sbx_result_free(r);
    r = cell(s, "import json\nprint(rows[-1])");
    expect_completed(r, 0);
    assert_string_equal(r->stdout_text, "5,6\n");
    assert_int_equal(r->n_artifacts, 0);
    assert_int_equal(r->cell, 4);
    sbx_result_free(r);
    sbx_session_close(s);
}

static void exception_rolls_back(void **state)
{
    rolled_back_by(state, "raise ValueError('no')\n", SBX_ROLLBACK_ON_ERROR, 0, SBX_COMPLETED,
                   "exit status 1");
}

/* A cell rolled back is killed, and its end takes the kernel's time to
 * free what it mapped (milliseconds of its CPU clock for 150 MB): the
 * sandbox does not take that for a stopped process that ran. Cell after
 * cell, the session goes on. */
static void a_rolled_back_cell_that_takes_long_to_end_is_not_running(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);

    expect_cell(s, "x = 1", "");
    for (int i = 0; i < 50; i++)
        expect_rolled_back(s, "b = b'x' * (150 << 20)");
    expect_cell(s, "print(x, 'b' in dir())", "1 False\n");
    sbx_session_close(s);
}

static void nonzero_exit_rolls_back(void **state)
{
    rolled_back_by(state, "import sys\nsys.exit(3)\n", SBX_ROLLBACK_ON_ERROR, 0, SBX_COMPLETED,
                   "exit status 3");
}

static void wall_timeout_rolls_back(void **state)
{
    rolled_back_by(state, "import time\ntime.sleep(60)\n", SBX_ROLLBACK_ON_STOP, 1.0, SBX_TIMEOUT,
                   NULL);
}

static void cpu_timeout_rolls_back(void **state)
{
    rolled_back_by(state, "while True: pass\n", SBX_ROLLBACK_ON_STOP, 0, SBX_TIMEOUT, NULL);
}

static void memory_limit_rolls_back(void **state)
{
    rolled_back_by(state, "b = bytearray(1 << 31)\n", SBX_ROLLBACK_ON_STOP, 0, SBX_MEMORY_LIMIT,
                   NULL);
}

static void crash_rolls_back(void **state)
{
    rolled_back_by(state, "import ctypes\nctypes.string_at(0)\n", SBX_ROLLBACK_ON_STOP, 0,
                   SBX_CRASHED, NULL);
}

static void os_exit_rolls_back(void **state)
{
    /* The process is gone: whatever the rule, it cannot be the state. */
    rolled_back_by(state, "os._exit(0)\n", SBX_ROLLBACK_ON_STOP, 0, SBX_COMPLETED, "os._exit");
}

static void thread_left_running_rolls_back(void **state)
{
    rolled_back_by(state,
                   "import threading, time\n"
                   "def scribble():\n"
                   "    while True:\n"
                   "        open('scribble.txt', 'a').write('.')\n"
                   "        time.sleep(0.001)\n"
                   "threading.Thread(target=scribble, daemon=True).start()\n"
                   "time.sleep(0.05)\n",
                   SBX_ROLLBACK_ON_STOP, 0, SBX_COMPLETED, "thread");
}

static void sys_exit_zero_ends_the_cell_only(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);

    struct sbx_result *r = cell(s, "import sys\nz = 7\nprint('before')\nsys.exit()\nprint('no')");
    expect_completed(r, 0);
    assert_false(r->rolled_back);
    assert_string_equal(r->stdout_text, "before\n");
    sbx_result_free(r);
    expect_cell(s, "print(z)", "7\n");
    sbx_session_close(s);
}

/* sys.exit's value is judged as Python holds it: any but 0 rolls back,
 * whatever its low bits; the exit status is python3's for it, and the
 * reason says what the value was. */
static void exit_values_are_judged_as_python_holds_them(void **state)
{
    static const struct {
        const char *value;
        int exit_code;
        const char *reason;
    } cases[] = {
        {"2 ** 32", 0, "sys.exit(4294967296) (exit status 0 to the system"},
        {"256", 0, "sys.exit(256) (exit status 0 to the system"},
        {"-2 ** 63", 0, "sys.exit(-9223372036854775808) (exit status 0 to the system"},
        {"2 ** 63 - 1", 255, "sys.exit(9223372036854775807) (exit status 255 to the system"},
        {"-2 ** 64", 255,
         "sys.exit() of a number below -9223372036854775808 (exit status 255 to the system"},
        {"2 ** 64", 255,
         "sys.exit() of a number above 9223372036854775807 (exit status 255 to the system"},
        {"-3", 253, "exit status 253"},
    };
    struct sbx_session *s = open_session(SBX(state), NULL);

    expect_cell(s, "x = 1", "");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char code[128];
        snprintf(code, sizeof(code), "import sys\nx = 2\nsys.exit(%s)\n", cases[i].value);
        struct sbx_result *r = cell(s, code);
        if (r->status != SBX_COMPLETED || r->exit_code != cases[i].exit_code || !r->rolled_back ||
            !r->reason || !strstr(r->reason, cases[i].reason))
            fail_msg("sys.exit(%s): %s, exit %d, rolled back %d: %s", cases[i].value,
                     sbx_status_name(r->status), r->exit_code, r->rolled_back,
                     r->reason ? r->reason : "(no reason)");
        sbx_result_free(r);
        expect_cell(s, "print(x)", "1\n");
    }
    sbx_session_close(s);
}

static void on_stop_keeps_an_exception(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);

    expect_cell(s, "x = 1", "");
    struct sbx_result *r =
        cell_rb(s, "x = 2\nopen('f', 'w').write('f')\n1 / 0", SBX_ROLLBACK_ON_STOP);
    expect_completed(r, 1);
    assert_false(r->rolled_back);
    assert_null(r->reason);
    /* A cell's exception comes back typed, and its report is not a file
     * of the session's. */
    assert_string_equal(r->error_type, "ZeroDivisionError");
    assert_string_equal(r->error_message, "division by zero");
    sbx_result_free(r);
    expect_cell(s, "import os\nprint(x, open('f').read(), sorted(os.listdir()))", "2 f ['f']\n");
    sbx_session_close(s);
}

static void never_keeps_the_files_of_a_stopped_cell(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);
    struct sbx_error err = {0};
    int rc;

    expect_cell(s, "x = 1", "");
    struct sbx_result *r =
        cell_full(s, "x = 2\nopen('partial.txt', 'w').write('p')\nimport time\ntime.sleep(60)",
                  SBX_ROLLBACK_NEVER, 1.0, NULL, 0, &rc, &err);
    assert_int_equal(rc, 0);
    assert_int_equal(r->status, SBX_TIMEOUT);
    assert_true(r->rolled_back); /* its variables: the process is gone */
    sbx_result_free(r);
    expect_cell(s, "print(x, open('partial.txt').read())", "1 p\n");
    sbx_session_close(s);
}

/* A cell gets what a worker gets when it forks, by any means: refused, and
 * the next state is the one before it. */
static void a_cell_cannot_fork(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);

    expect_cell(s, "n = 1", "");
    expect_cell(s,
                "import os\n"
                "try:\n"
                "    os.fork()\n"
                "except PermissionError as e:\n"
                "    print('fork', e.errno)\n",
                "fork 1\n");
    /* The very flags the session's own fork uses, straight to the kernel:
     * the sandbox only lets the state fork, only when it asked it to. */
    expect_cell(s,
                "import ctypes, os\n"
                "libc = ctypes.CDLL(None, use_errno=True)\n"
                "libc.syscall.restype = ctypes.c_long\n"
                "r = libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0)\n"
                "if r == 0:\n"
                "    os._exit(0)\n"
                "print('clone', r, ctypes.get_errno())\n"
                "n += 1\n",
                "clone -1 1\n");
    expect_cell(s, "print(n)", "2\n");
    sbx_session_close(s);
}

static void the_state_is_stopped_between_cells(void **state)
{
    struct timespec settle = {0, 50 * 1000000}; /* earlier tests' sessions go */
    nanosleep(&settle, NULL);
    struct sbx_session *s = open_session(SBX(state), NULL);
    pid_t stopped[8];

    /* The state, and the next cell, made ahead: both stopped. */
    assert_int_equal(wait_stopped(stopped, 8, 2), 2);
    expect_cell(s, "x = 1", "");
    assert_int_equal(wait_stopped(stopped, 8, 2), 2);
    uid_t uid = session_uid(s);
    /* Those two, and (a moment, while the state before is reaped and the
     * next cell made) one more at most. */
    int n = processes_of(uid);
    assert_true(n == -1 || (n >= 1 && n <= 3));
    if (n >= 0)
        assert_int_equal(wait_processes_of(uid, 2), 2);
    sbx_session_close(s);
}

/* The next cell waits at the lowest priority (when the sandbox can give
 * it its own back) and runs at its own: a cell never runs at SCHED_IDLE,
 * where any other load would starve it while its wall clock runs. */
static void a_cell_runs_at_its_own_priority(void **state)
{
    struct timespec settle = {0, 50 * 1000000}; /* earlier tests' sessions go */
    nanosleep(&settle, NULL);
    struct sbx_session *s = open_session(SBX(state), NULL);
    pid_t stopped[8];

    for (int i = 0; i < 3; i++)
        expect_cell(
            s, "import os\nprint(os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))",
            "0 0\n");
    /* The state at its own priority, the next cell made ahead at the
     * lowest (when the sandbox runs as root, which can put it back); the
     * state before may still be there a moment, and the next cell not
     * made yet. */
    int idle = 0, other = 0, n = 0;
    for (int tries = 0; tries < 100; tries++) {
        n = wait_stopped(stopped, 8, 2);
        idle = other = 0;
        for (int i = 0; i < n; i++) {
            int policy = sched_getscheduler(stopped[i]);
            idle += policy == SCHED_IDLE;
            other += policy == SCHED_OTHER;
        }
        if (n == 2 && idle == (getuid() == 0))
            break;
        nanosleep(&settle, NULL);
    }
    assert_int_equal(n, 2);
    assert_int_equal(other + idle, 2);
    if (getuid() == 0)
        assert_int_equal(idle, 1);
    expect_cell(s, "import os\nprint(os.sched_getscheduler(0))", "0\n");
    sbx_session_close(s);
}

/* Each cell starts as a run does: stdout line-buffered though the cell
 * before went to blocks past its output limit, sys.argv and __file__ its
 * own. */
static void a_cell_starts_with_its_own_stdout_and_arguments(void **state)
{
    static const char *const args[] = {"a"};
    struct sbx_session *s = open_session(SBX(state), NULL);
    struct sbx_request req;
    struct sbx_result *r = NULL;
    struct sbx_error err;

    sbx_request_init(&req);
    req.code = "import sys\nprint('x' * 200)\n"
               "print(sys.stdout.line_buffering, sys.argv, file=sys.stderr)";
    req.code_len = strlen(req.code);
    req.limits.max_output_chars = 100;
    req.argv = args;
    req.argc = 1;
    req.filename = "cell.py";
    assert_int_equal(sbx_session_run(s, &req, SBX_ROLLBACK_ON_ERROR, &r, &err), 0);
    expect_completed(r, 0);
    assert_string_equal(r->stderr_text, "False ['cell.py', 'a']\n");
    sbx_result_free(r);
    /* The next has none: no name, no __file__ left from the one before. */
    expect_cell(s,
                "import sys\nprint(sys.stdout.line_buffering, sys.argv, "
                "globals().get('__file__'))",
                "True [''] None\n");
    /* A __file__ the code made itself is its own: a cell with arguments
     * (and no name) leaves it. */
    expect_cell(s, "__file__ = 'mine'", "");
    sbx_request_init(&req);
    req.code = "print(__file__)";
    req.code_len = strlen(req.code);
    req.argv = args;
    req.argc = 1;
    assert_int_equal(sbx_session_run(s, &req, SBX_ROLLBACK_ON_ERROR, &r, &err), 0);
    assert_string_equal(r->stdout_text, "mine\n");
    sbx_result_free(r);
    sbx_session_close(s);
}

static void killed_session_process_is_lost(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);
    pid_t stopped[8];

    /* A kept cell's process is the state: it says its own pid (in the
     * sandbox's pid namespace). */
    uid_t uid = session_uid(s);
    struct sbx_result *r = cell(s, "import os\nprint(os.getpid())");
    expect_completed(r, 0);
    assert_false(r->rolled_back);
    pid_t pid = pid_from_inside(uid, (pid_t)atoi(r->stdout_text));
    sbx_result_free(r);
    assert_true(pid > 1);
    /* Stopped between cells, as every state is. */
    bool found = false;
    for (int i = 0; i < 100 && !found; i++) {
        int n = stopped_processes(stopped, 8);
        for (int k = 0; k < n; k++)
            found = found || stopped[k] == pid;
        struct timespec pause = {0, 10 * 1000000};
        if (!found)
            nanosleep(&pause, NULL);
    }
    assert_true(found);
    assert_int_equal(kill(pid, SIGKILL), 0);
    /* Gone (reaped by the template, which ends the session as it does). */
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d", (int)pid);
    for (int i = 0; i < 200 && access(path, F_OK) == 0; i++) {
        struct timespec pause = {0, 10 * 1000000};
        nanosleep(&pause, NULL);
    }
    assert_int_not_equal(access(path, F_OK), 0);
    expect_lost(s, "died");
    sbx_session_close(s);
}

/* Killed at any moment (while it forks the next cell, while that cell
 * says hello, while both are stopped): the session is lost, the template
 * stays up for every other run. */
static void killing_a_state_at_any_moment_leaves_the_template_up(void **state)
{
    struct sbx_health before, after;

    assert_int_equal(sbx_health(SBX(state), &before), 0);
    for (int k = 0; k < 40; k++) {
        struct sbx_session *s = open_session(SBX(state), NULL);
        uid_t uid = session_uid(s);
        struct sbx_result *r = cell(s, "import os\nprint(os.getpid())");
        expect_completed(r, 0);
        pid_t pid = pid_from_inside(uid, (pid_t)atoi(r->stdout_text));
        sbx_result_free(r);
        assert_true(pid > 1);
        struct timespec delay = {0, (k % 5) * 100 * 1000};
        nanosleep(&delay, NULL);
        assert_int_equal(kill(pid, SIGKILL), 0);
        sbx_session_close(s);
    }
    assert_int_equal(sbx_health(SBX(state), &after), 0);
    assert_true(after.ready);
    assert_int_equal(after.restarts, before.restarts);
    struct sbx_session *s = open_session(SBX(state), NULL);
    expect_cell(s, "print(1)", "1\n");
    sbx_session_close(s);
}

static void idle_sessions_expire(void **state)
{
    struct sbx_session_limits l;

    sbx_session_limits_init(&l);
    l.idle_seconds = 0.3;
    struct sbx_session *s = open_session(SBX(state), &l);
    uid_t uid = session_uid(s);
    int n = processes_of(uid);
    assert_true(n == -1 || (n >= 1 && n <= 3));
    struct timespec pause = {0, 600 * 1000000};
    nanosleep(&pause, NULL);
    /* Its process is gone before anyone asks. */
    if (n >= 0)
        assert_int_equal(processes_of(uid), 0);
    expect_lost(s, "no cell for");
    sbx_session_close(s);
}

static void max_cells_ends_the_session(void **state)
{
    struct sbx_session_limits l;

    sbx_session_limits_init(&l);
    l.max_cells = 2;
    struct sbx_session *s = open_session(SBX(state), &l);
    expect_cell(s, "x = 1", "");
    expect_cell(s, "print(x)", "1\n");
    expect_lost(s, "2 cells");
    sbx_session_close(s);
}

static void bad_limits_are_refused(void **state)
{
    struct sbx_session_limits l;
    struct sbx_session *s = NULL;
    struct sbx_error err = {0};

    sbx_session_limits_init(&l);
    l.idle_seconds = 0;
    assert_int_equal(sbx_session_open(SBX(state), &l, &s, &err), -EINVAL);
    assert_int_equal(err.code, SBX_ERR_INVALID_LIMIT);
    assert_null(s);
    sbx_session_limits_init(&l);
    l.memory_bytes = 1024;
    assert_int_equal(sbx_session_open(SBX(state), &l, &s, &err), -EINVAL);
    s = open_session(SBX(state), NULL);
    struct sbx_request req;
    struct sbx_result *r = NULL;
    sbx_request_init(&req);
    req.code = "print(1)";
    req.code_len = 8;
    assert_int_equal(sbx_session_run(s, &req, (enum sbx_rollback)7, &r, &err), -EINVAL);
    req.limits.wall_seconds = -1;
    assert_int_equal(sbx_session_run(s, &req, SBX_ROLLBACK_ON_ERROR, &r, &err), -EINVAL);
    assert_int_equal(err.code, SBX_ERR_INVALID_LIMIT);
    assert_null(r);
    sbx_session_close(s);
}

static void max_sessions_is_kept(void **state)
{
    (void)state;
    struct sbx_config cfg;
    struct sbx *sbx;
    struct sbx_error err = {0};
    char root[256];

    make_temp_dir(root, sizeof(root));
    chmod(root, 0711);
    test_config_init(&cfg, root);
    cfg.max_sessions = 2;
    cfg.pool_size = 1;
    assert_int_equal(sbx_open(&cfg, &sbx, &err), 0);
    struct sbx_session *a = open_session(sbx, NULL), *b = open_session(sbx, NULL), *c = NULL;
    assert_int_equal(sbx_session_open(sbx, NULL, &c, &err), -EBUSY);
    assert_int_equal(err.code, SBX_ERR_BUSY);
    assert_null(c);
    /* Two sessions do not share a thing. */
    expect_cell(a, "import os\nv = 'a'\nopen('f', 'w').write('a')\nprint(os.getuid() > 0)",
                "True\n");
    expect_cell(b, "print('v' in dir(), __import__('os').path.exists('f'))", "False False\n");
    struct sbx_result *ra = cell(a, "import os\nprint(os.getuid())");
    struct sbx_result *rb = cell(b, "import os\nprint(os.getuid())");
    if (getuid() == 0)
        assert_string_not_equal(ra->stdout_text, rb->stdout_text);
    sbx_result_free(ra);
    sbx_result_free(rb);
    sbx_session_close(b);
    c = open_session(sbx, NULL);
    expect_cell(c, "print(1)", "1\n");
    sbx_session_close(a);
    sbx_session_close(c);
    sbx_close(sbx);
    assert_int_equal(count_entries(root), 0);
    rmdir(root);
}

/* What the template holds: descriptors, mounts in its namespace, and its
 * resident memory in KiB. */
struct held {
    int fds, mounts;
    long rss_kb;
};

static struct held template_holds(void)
{
    struct held h = {0};
    char path[64], line[512];
    int pid = template_pid();

    snprintf(path, sizeof(path), "/proc/%d/fd", pid);
    h.fds = count_entries(path);
    snprintf(path, sizeof(path), "/proc/%d/mountinfo", pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f))
        h.mounts++;
    fclose(f);
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    f = fopen(path, "r");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            h.rss_kb = atol(line + 6);
    fclose(f);
    return h;
}

static void hundreds_of_cells_leak_nothing(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);
    uid_t uid = session_uid(s);

    expect_cell(s, "rows = []", "");
    int fds = count_fds();
    struct held before = template_holds();
    long stack_kb = -1;
    for (int i = 0; i < 300; i++) {
        /* Each cell is a generation of processes: none may add to the
         * stack (a session's 100,000 cells would overflow it). */
        if (i == 10)
            stack_kb = stack_kb_of(uid);
        struct sbx_result *r = cell(s, i % 10 == 9 ? "rows.append(1)\nraise KeyError"
                                                   : "rows.append(1)\nopen('f', 'a').write('.')");
        assert_int_equal(r->status, SBX_COMPLETED);
        assert_int_equal(r->rolled_back, i % 10 == 9);
        sbx_result_free(r);
    }
    expect_cell(s, "print(len(rows), len(open('f').read()))", "270 270\n");
    assert_int_equal(count_fds(), fds);
    /* The pool's own workers come and go (a few descriptors each, and some
     * memory); one descriptor or one page kept per cell would be hundreds. */
    struct held after = template_holds();
    if (after.fds > before.fds + 8 || after.mounts != before.mounts ||
        after.rss_kb > before.rss_kb + 512)
        fail_msg("after 300 cells the template holds %d descriptors (%d before), %d mounts (%d), "
                 "%ld KiB (%ld)",
                 after.fds, before.fds, after.mounts, before.mounts, after.rss_kb, before.rss_kb);
    long stack_after = stack_kb_of(uid);
    if (stack_kb >= 0 && stack_after > stack_kb + 64)
        fail_msg("the session's stack grew from %ld KiB to %ld KiB in 290 cells", stack_kb,
                 stack_after);
    int n = processes_of(uid);
    assert_true(n == -1 || (n >= 1 && n <= 3));
    if (n >= 0)
        assert_int_equal(wait_processes_of(uid, 2), 2);
    sbx_session_close(s);
    /* Closed: nothing of it is left when the call returns. */
    if (n >= 0)
        assert_int_equal(processes_of(uid), 0);
}

/* A cell run on a thread of its own. */
struct behind {
    struct sbx_session *s;
    const char *code;
    struct sbx_cancel *cancel;
    struct sbx_result *res;
    int rc;
};

static void *run_behind(void *p)
{
    struct behind *b = p;
    struct sbx_request req;
    struct sbx_error err = {0};

    sbx_request_init(&req);
    req.code = b->code;
    req.code_len = strlen(req.code);
    req.cancel = b->cancel;
    b->rc = sbx_session_run(b->s, &req, SBX_ROLLBACK_ON_ERROR, &b->res, &err);
    return NULL;
}

/* A caller waiting behind another's cell is cancelled at once, without
 * running, and the cell in front is not disturbed. */
static void a_cell_waiting_its_turn_can_be_cancelled(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);
    struct behind b = {.s = s, .code = "x = 'second'", .cancel = sbx_cancel_new()};
    pthread_t first, second;
    struct behind a = {.s = s, .code = "import time\ntime.sleep(1.5)\nx = 'slow'"};

    assert_non_null(b.cancel);
    expect_cell(s, "x = 'first'", "");
    /* The first caller's cell sleeps; the second waits behind it. */
    assert_int_equal(pthread_create(&first, NULL, run_behind, &a), 0);
    struct timespec pause = {0, 200 * 1000000};
    nanosleep(&pause, NULL);
    assert_int_equal(pthread_create(&second, NULL, run_behind, &b), 0);
    nanosleep(&pause, NULL);
    sbx_cancel_fire(b.cancel);
    pthread_join(second, NULL);
    assert_int_equal(b.rc, 0);
    assert_int_equal(b.res->status, SBX_CANCELLED);
    assert_int_equal(b.res->cell, 0);
    /* Answered while the first was still running. */
    assert_int_equal(pthread_tryjoin_np(first, NULL), EBUSY);
    pthread_join(first, NULL);
    expect_completed(a.res, 0);
    sbx_result_free(a.res);
    sbx_result_free(b.res);
    sbx_cancel_free(b.cancel);
    expect_cell(s, "print(x)", "slow\n");
    sbx_session_close(s);
}

/* The template dies (killed from outside): its sessions are lost, say so,
 * and the sandbox makes a new template for the next session. */
static void a_new_template_loses_the_old_sessions(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);

    expect_cell(s, "x = 1", "");
    assert_int_equal(kill(template_pid(), SIGKILL), 0);
    struct timespec pause = {0, 200 * 1000000};
    nanosleep(&pause, NULL);
    expect_lost(s, "template");
    sbx_session_close(s);
    s = open_session(SBX(state), NULL);
    expect_cell(s, "print('x' in dir())", "False\n");
    sbx_session_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(state_kept_across_cells),
        cmocka_unit_test(exception_rolls_back),
        cmocka_unit_test(a_rolled_back_cell_that_takes_long_to_end_is_not_running),
        cmocka_unit_test(nonzero_exit_rolls_back),
        cmocka_unit_test(wall_timeout_rolls_back),
        cmocka_unit_test(cpu_timeout_rolls_back),
        cmocka_unit_test(memory_limit_rolls_back),
        cmocka_unit_test(crash_rolls_back),
        cmocka_unit_test(os_exit_rolls_back),
        cmocka_unit_test(thread_left_running_rolls_back),
        cmocka_unit_test(sys_exit_zero_ends_the_cell_only),
        cmocka_unit_test(exit_values_are_judged_as_python_holds_them),
        cmocka_unit_test(on_stop_keeps_an_exception),
        cmocka_unit_test(never_keeps_the_files_of_a_stopped_cell),
        cmocka_unit_test(a_cell_cannot_fork),
        cmocka_unit_test(the_state_is_stopped_between_cells),
        cmocka_unit_test(a_cell_runs_at_its_own_priority),
        cmocka_unit_test(a_cell_starts_with_its_own_stdout_and_arguments),
        cmocka_unit_test(killed_session_process_is_lost),
        cmocka_unit_test(killing_a_state_at_any_moment_leaves_the_template_up),
        cmocka_unit_test(idle_sessions_expire),
        cmocka_unit_test(max_cells_ends_the_session),
        cmocka_unit_test(bad_limits_are_refused),
        cmocka_unit_test(max_sessions_is_kept),
        cmocka_unit_test(hundreds_of_cells_leak_nothing),
        cmocka_unit_test(a_cell_waiting_its_turn_can_be_cancelled),
        cmocka_unit_test(a_new_template_loses_the_old_sessions),
    };
    if (getenv("TEST_FILTER"))
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, fixture_open, fixture_close);
}
