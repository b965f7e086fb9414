/* Behaviour of one run, through the public API, as a caller sees it. */
#define _GNU_SOURCE
#include "helpers.h"

#include "sysutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SBX(state)  (((struct fixture *)*(state))->sbx)
#define ROOT(state) (((struct fixture *)*(state))->root)

static struct sbx_limits limits(double wall, double cpu)
{
    struct sbx_limits l;
    sbx_limits_init(&l);
    l.wall_seconds = wall;
    l.cpu_seconds = cpu;
    return l;
}

/* The workspace a run used, as the code printed it on its first line. */
/* Where the workspace a run printed ("cwd uid") lives on the host: under
 * the private root the code sees it at /workspace, and it is w<uid> in the
 * sandbox's work directory (the one pysbx-XXXXXX under the root). */
static void workspace_on_host(void **state, const char *printed, char *out, size_t cap)
{
    char cwd[512];
    unsigned uid = 0;

    assert_int_equal(sscanf(printed, "%511s %u", cwd, &uid), 2);
    if (strcmp(cwd, "/workspace") != 0) {
        snprintf(out, cap, "%s", cwd);
        return;
    }
    DIR *d = opendir(ROOT(state));
    struct dirent *e;
    out[0] = '\0';
    while (d && (e = readdir(d)))
        if (strncmp(e->d_name, "pysbx-", 6) == 0 && strlen(e->d_name) == 12)
            snprintf(out, cap, "%s/%s/w%u", ROOT(state), e->d_name, uid);
    if (d)
        closedir(d);
    assert_true(out[0] != '\0');
}

/* A workspace on its own tmpfs is detached when the call returns (no path
 * leads to it) and its empty mount point is removed by the template right
 * after; a plain directory is deleted before the call returns. Either way,
 * nothing of the run may be seen at the path, and the path must go. */
static void assert_gone(const char *path)
{
    struct stat st;
    for (int i = 0; i < 200 && lstat(path, &st) == 0; i++) {
        if (count_entries(path) > 0)
            fail_msg("%s still holds the run's files", path);
        usleep(10000);
    }
    if (lstat(path, &st) == 0)
        fail_msg("%s is still there", path);
    assert_int_equal(errno, ENOENT);
}

/* --- exit status and output ------------------------------------------------ */

static void print_completes_with_output(void **state)
{
    struct sbx_result *r = run_code(SBX(state), "print(1)\n");
    expect_completed(r, 0);
    assert_string_equal(r->stdout_text, "1\n");
    assert_string_equal(r->stderr_text, "");
    assert_false(r->partial);
    assert_null(r->reason);
    assert_true(r->wall_ms > 0);
    assert_true(r->max_rss_kb > 0);
    sbx_result_free(r);
}

static void uncaught_exception_is_exit_1_with_traceback(void **state)
{
    struct sbx_result *r = run_code(SBX(state), "def f():\n    raise ValueError('boom')\nf()\n");
    expect_completed(r, 1);
    assert_non_null(strstr(r->stderr_text, "Traceback (most recent call last)"));
    assert_non_null(strstr(r->stderr_text, "raise ValueError('boom')")); /* the source line */
    assert_non_null(strstr(r->stderr_text, "ValueError: boom"));
    sbx_result_free(r);
}

static void sys_exit_code_is_the_exit_code(void **state)
{
    struct sbx_result *r = run_code(SBX(state), "import sys\nprint('x')\nsys.exit(42)\n");
    expect_completed(r, 42);
    assert_string_equal(r->stdout_text, "x\n");
    sbx_result_free(r);
    r = run_code(SBX(state), "import sys\nsys.exit('bye')\n");
    expect_completed(r, 1);
    assert_string_equal(r->stderr_text, "bye\n");
    sbx_result_free(r);
    r = run_code(SBX(state), "raise SystemExit\n");
    expect_completed(r, 0);
    sbx_result_free(r);
}

static void last_expression_value_comes_back_not_printed(void **state)
{
    struct sbx_result *r = run_code(SBX(state), "x = 6\nx * 7\n");
    expect_completed(r, 0);
    assert_string_equal(r->value, "42");
    assert_int_equal(r->value_len, 2);
    assert_string_equal(r->stdout_text, "");
    sbx_result_free(r);
    /* repr(), not str(); and the line is still the program's own. */
    r = run_code(SBX(state), "print('a')\n{'k': 'v'}\n");
    expect_completed(r, 0);
    assert_string_equal(r->value, "{'k': 'v'}");
    assert_string_equal(r->stdout_text, "a\n");
    sbx_result_free(r);
}

static void no_value_without_a_final_expression(void **state)
{
    /* A statement, a call returning None, and a file of the value's name
     * the code left itself: no value each time, and the file is no
     * artifact either. */
    const char *codes[] = {"x = 1\n", "print(1)\n",
                           "open('.pysbx-value', 'w').write('forged')\nx = 1\n"};
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        struct sbx_result *r = run_code(SBX(state), codes[i]);
        expect_completed(r, 0);
        assert_null(r->value);
        assert_int_equal(r->n_artifacts, 0);
        sbx_result_free(r);
    }
}

static void value_is_cut_at_the_output_limit(void **state)
{
    struct sbx_limits l = limits(10, 5);
    l.max_output_chars = 10;
    struct sbx_result *r = run_with(SBX(state), "'\u00e9' * 100\n", &l, NULL, 0);
    expect_completed(r, 0);
    assert_true(r->value_truncated);
    assert_int_equal(strncmp(r->value, "'\u00e9\u00e9", 5), 0);
    assert_non_null(strstr(r->value, "output cut"));
    sbx_result_free(r);
}

static void a_failing_last_expression_is_an_uncaught_exception(void **state)
{
    struct sbx_result *r = run_code(SBX(state), "x = 1\n1 / 0\n");
    expect_completed(r, 1);
    assert_null(r->value);
    assert_non_null(strstr(r->stderr_text, "line 2"));
    assert_non_null(strstr(r->stderr_text, "ZeroDivisionError"));
    sbx_result_free(r);
    r = run_code(SBX(state),
                 "class A:\n    def __repr__(self):\n        raise KeyError('r')\nA()\n");
    expect_completed(r, 1);
    assert_null(r->value);
    assert_non_null(strstr(r->stderr_text, "KeyError"));
    sbx_result_free(r);
}

static void threads_are_joined_and_atexit_runs(void **state)
{
    expect_stdout(SBX(state),
                  "import threading, time, atexit\n"
                  "atexit.register(lambda: print('atexit'))\n"
                  "def work():\n"
                  "    time.sleep(0.05)\n"
                  "    print('thread done')\n"
                  "threading.Thread(target=work).start()\n"
                  "print('main done')\n",
                  "main done\nthread done\natexit\n");
}

static void output_over_limit_is_cut_and_flagged(void **state)
{
    struct sbx_limits l = limits(10, 5);
    l.max_output_chars = 100;
    /* 200 two-byte characters: the cut is in characters. */
    struct sbx_result *r = run_with(SBX(state),
                                    "print('\\u00e9' * 200)\nimport sys\n"
                                    "print('e' * 5, file=sys.stderr)\n",
                                    &l, NULL, 0);
    expect_completed(r, 0);
    assert_true(r->stdout_truncated);
    assert_false(r->stderr_truncated);
    assert_int_equal(strncmp(r->stdout_text, "\xc3\xa9", 2), 0);
    assert_non_null(strstr(r->stdout_text, "[pysbx: output cut, 101 more characters]"));
    assert_int_equal(strstr(r->stdout_text, "\n[pysbx") - r->stdout_text, 200); /* 100 chars */
    assert_string_equal(r->stderr_text, "eeeee\n");
    sbx_result_free(r);
}

static void flood_without_end_is_stopped_at_the_deadline(void **state)
{
    struct sbx_limits l = limits(1, 10);
    l.max_output_chars = 1000;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct sbx_result *r = run_with(SBX(state),
                                    "import sys\n"
                                    "while True:\n"
                                    "    sys.stdout.write('x' * 65536)\n"
                                    "    sys.stderr.write('y' * 65536)\n",
                                    &l, NULL, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_int_equal(r->status, SBX_TIMEOUT);
    assert_int_equal(r->limit, SBX_LIMIT_WALL);
    assert_true(r->partial);
    assert_true(r->stdout_truncated);
    assert_true(r->stderr_truncated);
    assert_true(r->stdout_len < 1200);
    assert_true(t1.tv_sec - t0.tv_sec < 8); /* no hang: killed and drained */
    sbx_result_free(r);
}

static void flood_that_ends_completes_with_a_bounded_result(void **state)
{
    struct sbx_limits l = limits(20, 20);
    l.max_output_chars = 10;
    struct sbx_result *r = run_with(SBX(state),
                                    "import os\n"
                                    "for _ in range(1600):\n" /* 100 MiB */
                                    "    os.write(1, b'z' * 65536)\n",
                                    &l, NULL, 0);
    expect_completed(r, 0);
    assert_true(r->stdout_truncated);
    assert_non_null(strstr(r->stdout_text, "104857590 more characters"));
    sbx_result_free(r);
}

static void invalid_utf8_output_is_replaced(void **state)
{
    expect_stdout(SBX(state), "import sys\nsys.stdout.buffer.write(b'a\\xffb')\n",
                  "a\xef\xbf\xbd"
                  "b");
}

/* An uncaught exception comes back typed; sys.exit and a report the code
 * forged without the exit status of an exception do not. */
static void an_exception_comes_back_typed(void **state)
{
    static const struct {
        const char *code, *type, *message, *tb_end;
    } cases[] = {
        {"d = {}\nd['k']\n", "KeyError", "'k'", "KeyError: 'k'\n"},
        {"import json\njson.loads('{')\n", "json.decoder.JSONDecodeError",
         "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)", NULL},
        {"x = (\n", "SyntaxError", "'(' was never closed (<main>, line 1)",
         "SyntaxError: '(' was never closed\n"},
        {"class E(Exception):\n    def __str__(self): raise RuntimeError\nraise E()\n", "E",
         "<str() of it failed>", NULL},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sbx_result *r = run_code(SBX(state), cases[i].code);
        assert_int_equal(r->status, SBX_COMPLETED);
        assert_int_equal(r->exit_code, 1);
        assert_non_null(r->error_type);
        assert_string_equal(r->error_type, cases[i].type);
        assert_string_equal(r->error_message, cases[i].message);
        if (cases[i].tb_end) {
            size_t n = strlen(r->error_traceback), m = strlen(cases[i].tb_end);
            assert_true(n >= m && strcmp(r->error_traceback + n - m, cases[i].tb_end) == 0);
        }
        assert_int_equal(r->n_artifacts, 0);
        sbx_result_free(r);
    }
    /* A small max_output_chars cuts each part, and still gives all three. */
    struct sbx_limits l;
    sbx_limits_init(&l);
    l.max_output_chars = 5;
    struct sbx_result *small = run_with(SBX(state), "d = {}\nd['key']\n", &l, NULL, 0);
    assert_string_equal(small->error_type, "KeyEr");
    assert_string_equal(small->error_message, "'key'");
    assert_string_equal(small->error_traceback, "Trace");
    sbx_result_free(small);

    static const char *const none[] = {
        "import sys\nsys.exit(1)\n",
        "import sys\nsys.exit('bye')\n",
        "print(1)\n",
        /* The code's own file, and an exit status of 0: not taken. */
        "open('.pysbx-error', 'w').write('Fake\\0m\\0t\\0')\n",
    };
    for (size_t i = 0; i < sizeof(none) / sizeof(none[0]); i++) {
        struct sbx_result *r = run_code(SBX(state), none[i]);
        assert_int_equal(r->status, SBX_COMPLETED);
        assert_null(r->error_type);
        assert_null(r->error_message);
        assert_null(r->error_traceback);
        assert_int_equal(r->n_artifacts, 0);
        sbx_result_free(r);
    }
}

/* A message longer than the reader would take of the whole report comes
 * back cut, never dropped: the run does not read as sys.exit(1). */
static void a_long_exception_message_is_cut_not_dropped(void **state)
{
    static const uint64_t limits[] = {SBX_DEFAULT_MAX_OUTPUT_CHARS, 10};

    for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); i++) {
        struct sbx_limits l = {0};
        sbx_limits_init(&l);
        l.max_output_chars = limits[i];
        struct sbx_result *r =
            run_with(SBX(state), "raise ValueError('A' * 1_000_000)\n", &l, NULL, 0);
        expect_completed(r, 1);
        assert_non_null(r->error_type);
        assert_string_equal(r->error_type, "ValueError");
        assert_non_null(r->error_message);
        assert_int_equal(strlen(r->error_message), limits[i]);
        assert_int_equal(strspn(r->error_message, "A"), limits[i]);
        assert_non_null(r->error_traceback);
        /* The traceback's first characters, whatever the limit. */
        size_t n = strlen(r->error_traceback);
        assert_int_equal(n, limits[i] < 100 ? limits[i] : n);
        assert_memory_equal(r->error_traceback, "Traceback (most", n < 15 ? n : 15);
        sbx_result_free(r);
    }
}

/* A request's stdin and arguments reach the program; without stdin,
 * input() meets the end of its input. */
/* The program's name, as python3 FILE has it: sys.argv[0], __file__ and
 * the traceback's file; "-" is standard input's; none is "<main>". */
static void the_program_has_its_name(void **state)
{
    static const char *const args[] = {"a"};
    static const char code[] = "import sys\n"
                               "print(sys.argv, globals().get('__file__'))\n"
                               "1 / 0\n";
    const char *names[] = {"report.py", "-", NULL};
    const char *want_out[] = {"['report.py', 'a'] report.py\n", "['-', 'a'] <stdin>\n",
                              "['', 'a'] None\n"};
    const char *want_tb[] = {"File \"report.py\", line 3", "File \"<stdin>\", line 3",
                             "File \"<main>\", line 3"};
    struct sbx_error err;

    for (int i = 0; i < 3; i++) {
        struct sbx_request req;
        struct sbx_result *r = NULL;
        sbx_request_init(&req);
        req.code = code;
        req.code_len = strlen(code);
        req.argv = args;
        req.argc = 1;
        req.filename = names[i];
        assert_int_equal(test_run(SBX(state), &req, &r, &err), 0);
        expect_completed(r, 1);
        assert_string_equal(r->stdout_text, want_out[i]);
        if (!strstr(r->error_traceback, want_tb[i]))
            fail_msg("traceback without %s: %s", want_tb[i], r->error_traceback);
        /* The line itself, from the program's own text. */
        assert_non_null(strstr(r->error_traceback, "    1 / 0\n"));
        sbx_result_free(r);
    }
    /* Refused: empty, not UTF-8. */
    struct sbx_request req;
    struct sbx_result *r = NULL;
    sbx_request_init(&req);
    req.code = "pass";
    req.code_len = 4;
    req.filename = "";
    assert_int_equal(test_run(SBX(state), &req, &r, &err), -EINVAL);
    assert_int_equal(err.code, SBX_ERR_INVALID_REQUEST);
    req.filename = "\xff.py";
    assert_int_equal(test_run(SBX(state), &req, &r, &err), -EINVAL);
    assert_null(r);
}

static void stdin_and_arguments_reach_the_program(void **state)
{
    static const char *const args[] = {"a", "b c", "-x", "\xc3\xa9"};
    static char big[1 << 20];
    struct sbx_request req;
    struct sbx_result *r = NULL;
    struct sbx_error err;

    sbx_request_init(&req);
    req.code = "import sys, os\nprint(input(), input(), sys.argv, sorted(os.listdir()))\n"
               "print(repr(sys.stdin.read()))";
    req.code_len = strlen(req.code);
    req.stdin_data = "5\n7\nrest";
    req.stdin_len = strlen(req.stdin_data);
    req.argv = args;
    req.argc = 4;
    assert_int_equal(test_run(SBX(state), &req, &r, &err), 0);
    expect_completed(r, 0);
    assert_string_equal(r->stdout_text, "5 7 ['', 'a', 'b c', '-x', '\xc3\xa9'] []\n'rest'\n");
    assert_int_equal(r->n_artifacts, 0);
    sbx_result_free(r);

    /* A megabyte, whole. */
    memset(big, 'x', sizeof(big));
    sbx_request_init(&req);
    req.code = "import sys\nprint(len(sys.stdin.buffer.read()), sys.argv)";
    req.code_len = strlen(req.code);
    req.stdin_data = big;
    req.stdin_len = sizeof(big);
    assert_int_equal(test_run(SBX(state), &req, &r, &err), 0);
    expect_completed(r, 0);
    assert_string_equal(r->stdout_text, "1048576 ['']\n");
    sbx_result_free(r);

    /* None: the end of the input at once. */
    r = run_code(SBX(state), "input()");
    expect_completed(r, 1);
    assert_string_equal(r->error_type, "EOFError");
    sbx_result_free(r);

    /* Refused: an argument that is not UTF-8, stdin_len without data. */
    static const char *const bad[] = {"\xff"};
    sbx_request_init(&req);
    req.code = "pass";
    req.code_len = 4;
    req.argv = bad;
    req.argc = 1;
    assert_true(test_run(SBX(state), &req, &r, &err) < 0);
    assert_int_equal(err.code, SBX_ERR_INVALID_REQUEST);
    assert_non_null(strstr(err.message, "UTF-8"));
    req.argc = 0;
    req.stdin_len = 3;
    assert_true(test_run(SBX(state), &req, &r, &err) < 0);
    assert_int_equal(err.code, SBX_ERR_INVALID_REQUEST);
}

/* The host name agrees with itself, whichever way the code asks. */
static void the_host_name_is_one(void **state)
{
    expect_stdout(SBX(state),
                  "import os, socket\nprint(socket.gethostname() == os.uname().nodename == "
                  "socket.getfqdn())\n",
                  "True\n");
}

/* --- ceilings ------------------------------------------------------------- */

static void wall_limit_fires_with_partial_output(void **state)
{
    struct sbx_limits l = limits(0.5, 10);
    struct sbx_result *r = run_with(
        SBX(state), "import time\nprint('before', flush=True)\ntime.sleep(30)\n", &l, NULL, 0);
    assert_int_equal(r->status, SBX_TIMEOUT);
    assert_int_equal(r->limit, SBX_LIMIT_WALL);
    assert_int_equal(r->exit_code, -1);
    assert_true(r->partial);
    assert_string_equal(r->stdout_text, "before\n");
    assert_non_null(strstr(r->reason, "wall"));
    assert_true(r->wall_ms >= 500 && r->wall_ms < 5000);
    sbx_result_free(r);
}

/* What the code printed before a limit fired is in the answer, flushed or
 * not: its stdout is line-buffered, as on a terminal. */
static void output_printed_before_a_limit_is_in_the_answer(void **state)
{
    static const char *const code[] = {
        "import time\nfor i in range(100): print('step', i)\ntime.sleep(30)\n",
        "for i in range(100): print('step', i)\nwhile True: pass\n",
        "import sys\nfor i in range(100): print('step', i, file=sys.stderr)\nwhile True: pass\n",
    };
    struct sbx_limits l = limits(0.5, 0.3);

    for (size_t k = 0; k < sizeof(code) / sizeof(code[0]); k++) {
        struct sbx_result *r = run_with(SBX(state), code[k], &l, NULL, 0);
        assert_int_equal(r->status, SBX_TIMEOUT);
        assert_true(r->partial);
        const char *text = k == 2 ? r->stderr_text : r->stdout_text;
        assert_non_null(strstr(text, "step 0\n"));
        assert_non_null(strstr(text, "step 99\n"));
        sbx_result_free(r);
    }
}

/* Past what the answer shows, the output goes in blocks (a write per line
 * costs more than the line); what the answer shows of a stopped run is
 * still all there. */
static void a_stopped_run_shows_all_it_can_of_a_long_output(void **state)
{
    struct sbx_limits l = limits(0.5, 10);
    l.max_output_chars = 1000;
    struct sbx_result *r =
        run_with(SBX(state),
                 "import sys, time\nfor i in range(10000): print('%04d' % i, 'x' * 14)\n"
                 "print('line buffered:', sys.stdout.line_buffering, file=sys.stderr)\n"
                 "time.sleep(30)\n",
                 &l, NULL, 0);
    char want[1001];
    for (int i = 0; i < 50; i++)
        snprintf(want + 20 * i, sizeof(want) - 20 * (size_t)i, "%04d xxxxxxxxxxxxxx\n", i);
    assert_int_equal(r->status, SBX_TIMEOUT);
    assert_true(r->stdout_truncated);
    assert_memory_equal(r->stdout_text, want, 1000);
    assert_string_equal(r->stderr_text, "line buffered: False\n");
    sbx_result_free(r);
}

static void cpu_limit_fires(void **state)
{
    struct sbx_limits l = limits(10, 0.3);
    struct sbx_result *r = run_with(SBX(state), "while True:\n    pass\n", &l, NULL, 0);
    assert_int_equal(r->status, SBX_TIMEOUT);
    assert_int_equal(r->limit, SBX_LIMIT_CPU);
    assert_true(r->cpu_ms >= 299);
    assert_true(r->wall_ms < 5000);
    sbx_result_free(r);
}

static void cpu_limit_counts_every_thread(void **state)
{
    /* The main thread only sleeps; two others burn CPU outside the GIL
     * (hashlib releases it for large data). Were only the main thread
     * counted, this would end at the wall limit instead. */
    struct sbx_limits l = limits(10, 0.4);
    struct sbx_result *r = run_with(SBX(state),
                                    "import hashlib, threading, time\n"
                                    "data = b'x' * (1 << 20)\n"
                                    "def spin():\n"
                                    "    while True: hashlib.sha256(data).digest()\n"
                                    "for _ in range(2):\n"
                                    "    threading.Thread(target=spin, daemon=True).start()\n"
                                    "time.sleep(30)\n",
                                    &l, NULL, 0);
    assert_int_equal(r->status, SBX_TIMEOUT);
    assert_int_equal(r->limit, SBX_LIMIT_CPU);
    sbx_result_free(r);
}

static void ignoring_sigxcpu_does_not_help(void **state)
{
    struct sbx_limits l = limits(10, 0.5);
    struct sbx_result *r = run_with(SBX(state),
                                    "import signal\n"
                                    "signal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
                                    "while True:\n    pass\n",
                                    &l, NULL, 0);
    assert_int_equal(r->status, SBX_TIMEOUT);
    assert_int_equal(r->limit, SBX_LIMIT_CPU);
    assert_true(r->cpu_ms < 3500); /* the hard limit, one second past the soft */
    sbx_result_free(r);
}

static void memory_limit_fires_for_one_big_allocation(void **state)
{
    struct sbx_result *r = run_code(SBX(state), "print('start', flush=True)\n"
                                                "b = bytearray(512 * 1024 * 1024)\n");
    assert_int_equal(r->status, SBX_MEMORY_LIMIT);
    assert_int_equal(r->limit, SBX_LIMIT_MEMORY);
    assert_true(r->partial);
    assert_string_equal(r->stdout_text, "start\n");
    assert_non_null(strstr(r->stderr_text, "MemoryError"));
    sbx_result_free(r);
}

/* The limit is on what the code maps, not on what the template had: under
 * the default 256 MiB, 252 MiB fit (169 did, before; the interpreter needs
 * a MiB or two of its own to run the code), 257 do not. */
static void the_memory_limit_counts_the_codes_own_data(void **state)
{
    struct sbx_result *r = run_code(SBX(state), "b = bytearray(252 << 20)\nprint(len(b) >> 20)\n");
    expect_completed(r, 0);
    assert_string_equal(r->stdout_text, "252\n");
    sbx_result_free(r);
    r = run_code(SBX(state), "b = bytearray(257 << 20)\n");
    assert_int_equal(r->status, SBX_MEMORY_LIMIT);
    assert_non_null(strstr(r->reason, "memory limit of 256 MiB exceeded"));
    sbx_result_free(r);
}

static void memory_limit_fires_for_growth(void **state)
{
    struct sbx_limits l = limits(20, 20);
    l.memory_bytes = 128 << 20;
    struct sbx_result *r =
        run_with(SBX(state), "x = []\nwhile True:\n    x.append(' ' * 100000)\n", &l, NULL, 0);
    assert_int_equal(r->status, SBX_MEMORY_LIMIT);
    sbx_result_free(r);
}

static void caught_memory_error_is_just_a_result(void **state)
{
    expect_stdout(SBX(state),
                  "try:\n    bytearray(2**40)\n"
                  "except MemoryError:\n    print('caught')\n",
                  "caught\n");
}

static void crash_reports_the_signal(void **state)
{
    struct sbx_result *r = run_code(SBX(state), "import ctypes\nctypes.string_at(0)\n");
    assert_int_equal(r->status, SBX_CRASHED);
    assert_int_equal(r->signal, SIGSEGV);
    assert_int_equal(r->exit_code, -1);
    assert_true(r->partial);
    sbx_result_free(r);
}

/* --- the workspace and artifacts ----------------------------------------- */

static void artifacts_come_back_sorted_and_capped(void **state)
{
    struct sbx_limits l = limits(10, 5);
    l.max_artifacts = 3;
    l.max_artifact_bytes = 10;
    struct sbx_result *r = run_with(SBX(state),
                                    "import os\n"
                                    "os.makedirs('plots')\n"
                                    "for n in ['b.txt', 'plots/a.png', 'a.txt', 'c', 'd']:\n"
                                    "    open(n, 'w').write(n * 5)\n",
                                    &l, NULL, 0);
    expect_completed(r, 0);
    assert_int_equal(r->n_artifacts, 3);
    assert_string_equal(r->artifacts[0].name, "a.txt");
    assert_string_equal(r->artifacts[1].name, "b.txt");
    assert_string_equal(r->artifacts[2].name, "c");
    assert_int_equal(r->artifacts_dropped, 2);
    assert_int_equal(r->artifacts[0].size, 25);
    assert_int_equal(r->artifacts[0].data_len, 10);
    assert_true(r->artifacts[0].truncated);
    assert_memory_equal(r->artifacts[0].data, "a.txta.txt", 10);
    assert_false(r->artifacts[2].truncated);
    sbx_result_free(r);
}

static void inputs_are_readable_and_come_back_only_if_changed(void **state)
{
    const struct sbx_file files[] = {
        {"data/in.csv", "a,b\n1,2\n", 8},
        {"keep.txt", "same", 4},
        {"edit.txt", "old", 3},
    };
    struct sbx_result *r = run_with(SBX(state),
                                    "import csv\n"
                                    "rows = list(csv.reader(open('data/in.csv')))\n"
                                    "print(rows)\n"
                                    "open('edit.txt', 'w').write('new')\n"
                                    "open('out.txt', 'w').write(str(len(rows)))\n",
                                    NULL, files, 3);
    expect_completed(r, 0);
    assert_string_equal(r->stdout_text, "[['a', 'b'], ['1', '2']]\n");
    assert_int_equal(r->n_artifacts, 2);
    assert_string_equal(r->artifacts[0].name, "edit.txt");
    assert_memory_equal(r->artifacts[0].data, "new", 3);
    assert_string_equal(r->artifacts[1].name, "out.txt");
    sbx_result_free(r);
}

static void links_and_fifos_are_skipped(void **state)
{
    struct sbx_error err;
    bool private_fs = sbx_check_layers(SBX(state), SBX_LAYER_MOUNTNS, &err) == 0;
    struct sbx_result *r = run_code(SBX(state), "import os\n"
                                                "os.symlink('/etc/passwd', 'passwd')\n"
                                                "os.symlink('/etc', 'etc')\n"
                                                "os.mkfifo('fifo')\n"
                                                "open('real', 'w').write('ok')\n"
                                                "os.link('real', 'real2')\n"
                                                "open('plain', 'w').write('p')\n");
    expect_completed(r, 0);
    /* Links are not followed, and the FIFO has no writer: opening it would
     * have hung. A file of two names comes back under each when the
     * workspace is a file system of its own (nothing on it is the host's),
     * else is listed as not read. */
    if (private_fs) {
        assert_int_equal(r->n_artifacts, 3);
        assert_string_equal(r->artifacts[1].name, "real");
        assert_string_equal(r->artifacts[2].name, "real2");
        assert_memory_equal(r->artifacts[2].data, "ok", 2);
    } else {
        assert_int_equal(r->n_artifacts, 1);
        assert_int_equal(r->n_dropped, 2);
        assert_int_equal(r->dropped[0].reason, SBX_DROP_LINKED);
    }
    assert_string_equal(r->artifacts[0].name, "plain");
    sbx_result_free(r);
}

/* Makes N nested directories NAME, writes DATA to LEAF in the deepest. */
#define NEST_PY                                                                                    \
    "import os\n"                                                                                  \
    "def nest(n, name, leaf, data):\n"                                                             \
    "    top = os.open('.', os.O_RDONLY)\n"                                                        \
    "    for _ in range(n):\n"                                                                     \
    "        os.makedirs(name, exist_ok=True)\n"                                                   \
    "        os.chdir(name)\n"                                                                     \
    "    open(leaf, 'w').write(data)\n"                                                            \
    "    os.fchdir(top)\n"                                                                         \
    "    os.close(top)\n"

/* What the code hides from an honest answer comes back whole: a deep tree,
 * a path past 4,096 bytes, two names of one file, files and a directory it
 * made unreadable, names that are not UTF-8 (each its own name). */
static void files_the_code_hides_come_back(void **state)
{
    struct sbx_error err;
    if (sbx_check_layers(SBX(state), SBX_LAYER_MOUNTNS, &err) != 0)
        skip(); /* the workspace is not a file system of its own */
    struct sbx_result *r =
        run_code(SBX(state), NEST_PY "nest(70, 'd', 'deep.txt', 'deep')\n"
                                     "nest(20, 'L' * 250, 'long.txt', 'long')\n"
                                     "open('a', 'w').write('linked')\n"
                                     "os.link('a', 'b')\n"
                                     "open('m000', 'w').write('zero')\n"
                                     "os.chmod('m000', 0)\n"
                                     "os.mkdir('dz')\n"
                                     "open('dz/in', 'w').write('in dz')\n"
                                     "os.chmod('dz', 0)\n"
                                     "for n in (b'\\xff', b'\\xfe', '\\ufffd'):\n"
                                     "    open(n, 'w').write(repr(n))\n");
    expect_completed(r, 0);
    assert_int_equal(r->artifacts_dropped, 0);
    assert_int_equal(r->n_dropped, 0);
    assert_int_equal(r->n_artifacts, 9);
    /* In the order of their bytes on disk. */
    static const char *const raw[] = {"dz/in", "m000", "\xef\xbf\xbd", "\xfe", "\xff"};
    static const char *const shown[] = {"\xef\xbf\xbd"
                                        "ef\xef\xbf\xbd"
                                        "bf\xef\xbf\xbd"
                                        "bd",
                                        "\xef\xbf\xbd"
                                        "fe",
                                        "\xef\xbf\xbd"
                                        "ff"};
    assert_true(strncmp(r->artifacts[0].name, "LLLL", 4) == 0);
    assert_int_equal(strlen(r->artifacts[0].name), 20 * 251 + 8);
    assert_memory_equal(r->artifacts[0].data, "long", 4);
    assert_string_equal(r->artifacts[1].name, "a");
    assert_string_equal(r->artifacts[2].name, "b");
    assert_memory_equal(r->artifacts[2].data, "linked", 6);
    assert_true(strncmp(r->artifacts[3].name, "d/d/d/", 6) == 0);
    assert_int_equal(strlen(r->artifacts[3].name), 70 * 2 + 8);
    assert_memory_equal(r->artifacts[3].data, "deep", 4);
    for (size_t i = 4; i < 9; i++) {
        const struct sbx_artifact *a = &r->artifacts[i];
        assert_string_equal(a->raw_name, raw[i - 4]);
        assert_string_equal(a->name, i < 6 ? raw[i - 4] : shown[i - 6]);
    }
    assert_memory_equal(r->artifacts[4].data, "in dz", 5);
    assert_memory_equal(r->artifacts[5].data, "zero", 4);
    assert_memory_equal(r->artifacts[8].data, "b'\\xff'", 7);
    sbx_result_free(r);

    /* A workspace whose root the code made unreadable. */
    r = run_code(SBX(state), "import os\nopen('x', 'w').write('x')\nos.chmod('.', 0)\n");
    expect_completed(r, 0);
    assert_int_equal(r->n_artifacts, 1);
    assert_string_equal(r->artifacts[0].name, "x");
    sbx_result_free(r);
}

/* Every file not returned is counted and listed with why. */
static void files_not_returned_are_listed_with_why(void **state)
{
    struct sbx_limits l = limits(20, 10);
    l.max_artifacts = 2;
    l.max_artifacts_total_bytes = 1000;
    char depth[16];
    snprintf(depth, sizeof(depth), "%d", SBX_MAX_ARTIFACT_DEPTH + 1);
    char code[1024];
    snprintf(code, sizeof(code),
             NEST_PY "nest(%s, 't', 'lost', 'x')\n"
                     "open('a', 'w').write('a' * 600)\n"
                     "open('b', 'w').write('b' * 600)\n"
                     "open('c', 'w').write('c')\n"
                     "open('d', 'w').write('d')\n",
             depth);
    struct sbx_result *r = run_with(SBX(state), code, &l, NULL, 0);
    expect_completed(r, 0);
    assert_int_equal(r->n_artifacts, 2);
    assert_string_equal(r->artifacts[0].name, "a");
    assert_string_equal(r->artifacts[1].name, "c");
    assert_int_equal(r->artifacts_dropped, 3);
    assert_int_equal(r->n_dropped, 3);
    assert_string_equal(r->dropped[0].name, "b");
    assert_int_equal(r->dropped[0].reason, SBX_DROP_MAX_TOTAL_BYTES);
    assert_int_equal(r->dropped[0].size, 600);
    assert_string_equal(r->dropped[1].name, "d");
    assert_int_equal(r->dropped[1].reason, SBX_DROP_MAX_ARTIFACTS);
    assert_int_equal(r->dropped[2].reason, SBX_DROP_TOO_DEEP);
    assert_int_equal(strlen(r->dropped[2].name), 2 * (SBX_MAX_ARTIFACT_DEPTH + 1));
    char *json = sbx_result_to_json(r);
    assert_non_null(strstr(json, "\"dropped_artifacts\":[{\"name\":\"b\","));
    assert_non_null(strstr(json, "\"reason\":\"too_deep\""));
    free(json);
    sbx_result_free(r);
}

static void artifacts_are_not_returned_from_a_stopped_run(void **state)
{
    struct sbx_limits l = limits(0.5, 5);
    struct sbx_result *r = run_with(
        SBX(state), "open('x', 'w').write('x')\nimport time\ntime.sleep(10)\n", &l, NULL, 0);
    assert_int_equal(r->status, SBX_TIMEOUT);
    assert_int_equal(r->n_artifacts, 0);
    sbx_result_free(r);
}

static void workspace_is_deleted_on_every_outcome(void **state)
{
    static const char *endings[] = {
        "pass\n",
        "raise RuntimeError\n",
        "import time\ntime.sleep(10)\n",                             /* wall */
        "while True: pass\n",                                        /* cpu */
        "bytearray(2**40)\n",                                        /* memory */
        "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", /* crash */
        "os.chmod('.', 0)\n",                                        /* hostile permissions */
    };
    struct sbx_limits l = limits(0.5, 0.3);
    for (size_t i = 0; i < sizeof(endings) / sizeof(endings[0]); i++) {
        char code[512], ws[1024];
        snprintf(code, sizeof(code),
                 "import os\nprint(os.getcwd(), os.getuid(), flush=True)\n"
                 "os.makedirs('a/b/c')\nopen('a/b/c/f', 'w').write('x')\n"
                 "os.symlink('/etc', 'a/link')\n"
                 "os.chmod('a/b', 0)\n%s",
                 endings[i]);
        struct sbx_result *r = run_with(SBX(state), code, &l, NULL, 0);
        workspace_on_host(state, r->stdout_text, ws, sizeof(ws));
        assert_true(strncmp(ws, ROOT(state), strlen(ROOT(state))) == 0);
        assert_gone(ws);
        sbx_result_free(r);
    }
    /* /etc was linked into a workspace and deleted with it: still here. */
    assert_int_equal(access("/etc/passwd", F_OK), 0);
}

static void each_run_starts_in_a_fresh_empty_workspace(void **state)
{
    struct sbx_result *a = run_code(SBX(state), "import os\nprint(os.listdir('.'))\n"
                                                "open('left-behind', 'w').write('x')\n");
    struct sbx_result *b = run_code(SBX(state), "import os\nprint(os.listdir('.'))\n");
    assert_string_equal(a->stdout_text, "[]\n");
    assert_string_equal(b->stdout_text, "[]\n");
    sbx_result_free(a);
    sbx_result_free(b);
}

/* --- what the code can see of the host ------------------------------------ */

static void environment_holds_no_host_variables(void **state)
{
    expect_stdout(SBX(state),
                  "import os\n"
                  "print(sorted(os.environ))\n"
                  /* Absent under the private root (no /proc);
                   * unreadable once the worker drops to its own uid
                   * (it is not dumpable); empty otherwise. */
                  "def read(p):\n"
                  "    try:\n"
                  "        return open(p, 'rb').read()\n"
                  "    except OSError:\n"
                  "        return b''\n"
                  "e = read('/proc/self/environ')\n"
                  "c = read('/proc/self/cmdline')\n"
                  "print(b'PYSBX_TEST_SECRET' in e, b'PYSBX_TEST_SECRET' in c)\n"
                  "print(b'hunter2' in e + c)\n",
                  "['HOME', 'LANG', 'LOGNAME', 'TMPDIR', 'USER']\nFalse False\nFalse\n");
}

static void only_its_own_descriptors_are_open(void **state)
{
    /* Asked of every descriptor number (there may be no /proc to list). */
    struct sbx_result *r =
        run_code(SBX(state), "import os\n"
                             "def is_open(fd):\n"
                             "    try:\n"
                             "        os.fstat(fd)\n"
                             "        return True\n"
                             "    except OSError:\n"
                             "        return False\n"
                             "print([fd for fd in range(4096) if is_open(fd)])\n");
    expect_completed(r, 0);
    assert_string_equal(r->stdout_text, "[0, 1, 2]\n");
    sbx_result_free(r);
    r = run_code(SBX(state), "import sys\nprint(repr(sys.stdin.read()))\n");
    assert_string_equal(r->stdout_text, "''\n");
    sbx_result_free(r);
}

static void host_packages_are_not_importable(void **state)
{
    expect_stdout(SBX(state),
                  "import sys\n"
                  "print(sys.flags.no_site, sys.flags.no_user_site,"
                  " sys.flags.isolated, 'site' in sys.modules)\n"
                  "print([p for p in sys.path if 'packages' in p or p in ('', '.')])\n"
                  "try:\n    import pysbx_test_planted\n"
                  "except ImportError:\n    print('not importable')\n",
                  "1 1 1 False\n[]\nnot importable\n");
}

static void connect_raises_oserror(void **state)
{
    struct sbx_result *r = run_code(
        SBX(state), "import socket, _socket\n"
                    "for make in (lambda: socket.socket(),\n"
                    "             lambda: socket.create_connection(('127.0.0.1', 80)),\n"
                    "             lambda: _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM),\n"
                    "             lambda: _socket.socket(_socket.AF_UNIX),\n"
                    "             lambda: socket.getaddrinfo('example.com', 80)):\n"
                    "    try:\n"
                    "        make()\n"
                    "        print('CONNECTED')\n"
                    "    except OSError as e:\n"
                    "        print(type(e).__name__)\n");
    expect_completed(r, 0);
    assert_null(strstr(r->stdout_text, "CONNECTED"));
    /* create_connection resolves the name first: that fails already. */
    assert_string_equal(r->stdout_text, "PermissionError\ngaierror\nPermissionError\n"
                                        "PermissionError\ngaierror\n");
    sbx_result_free(r);
}

/* ssl imports as it does beside the real _socket (matplotlib and the
 * standard library's clients import it); what would reach the network
 * fails as a socket does, with the sandbox's message, and TLS in memory,
 * which needs no socket, works. */
static void ssl_imports_and_every_connection_fails_as_a_socket_does(void **state)
{
    expect_stdout(SBX(state),
                  "import socket, ssl, urllib.request, _socket\n"
                  "ctx = ssl.create_default_context()\n"
                  "for make in (lambda: ctx.wrap_socket(socket.socket(), server_hostname='a.b'),\n"
                  "             lambda: urllib.request.urlopen('https://example.com', timeout=1),\n"
                  "             lambda: ssl.get_server_certificate(('127.0.0.1', 443))):\n"
                  "    try:\n"
                  "        make()\n"
                  "        print('CONNECTED')\n"
                  "    except OSError as e:\n"
                  "        print(type(e).__name__, 'network access is disabled' in str(e))\n"
                  "a, b = socket.socketpair()\n"
                  "try:\n    ctx.wrap_socket(a, server_hostname='a.b')\n"
                  "except OSError as e:\n    print(type(e).__name__)\n"
                  "out = ssl.MemoryBIO()\n"
                  "tls = ctx.wrap_bio(ssl.MemoryBIO(), out, server_hostname='a.b')\n"
                  "try:\n    tls.do_handshake()\n"
                  "except ssl.SSLWantReadError:\n    print('client hello', out.pending > 0)\n"
                  "print(type(_socket.CAPI).__name__)\n",
                  "PermissionError True\nURLError True\ngaierror True\nPermissionError\n"
                  "client hello True\nPyCapsule\n");
}

static void asyncio_still_runs_without_a_network(void **state)
{
    expect_stdout(SBX(state),
                  "import asyncio\n"
                  "async def main():\n"
                  "    await asyncio.sleep(0.01)\n"
                  "    return sum(await asyncio.gather(*(asyncio.sleep(0, i) for i in range(4))))\n"
                  "print(asyncio.run(main()))\n",
                  "6\n");
}

/* As under python3: a terminal query on a closed descriptor is EBADF, not
 * ENOTTY; the standard library's own links lead somewhere (Debian's
 * sitecustomize.py, read by code that reads the whole library). */
static void the_standard_library_reads_as_under_python3(void **state)
{
    expect_stdout(SBX(state),
                  "import errno, json, os, pathlib\n"
                  "try:\n    os.get_terminal_size(99)\n"
                  "except OSError as e:\n    print(errno.errorcode[e.errno])\n"
                  "print(os.isatty(0), os.isatty(1))\n"
                  "links = [p for p in pathlib.Path(json.__file__).parent.parent.glob('*.py') "
                  "if p.is_symlink()]\n"
                  "print([p.name for p in links if not p.exists()])\n",
                  "EBADF\nFalse False\n[]\n");
}

/* A run's stdout and stderr are pipes, and say so as python3's do on pipes
 * (CPython 3.13's own test runner reconfigures them first thing). */
static void stdout_and_stderr_are_pipes_as_under_python3(void **state)
{
    expect_stdout(SBX(state),
                  "import io, sys\n"
                  "for s in (sys.stdout, sys.stderr):\n"
                  "    print(s.seekable(), s.buffer.seekable(), s.buffer.raw.seekable())\n"
                  "    try:\n        s.tell()\n"
                  "    except io.UnsupportedOperation as e:\n        print(e)\n"
                  "    s.reconfigure(errors='backslashreplace')\n"
                  "    print(s.errors, s.name)\n",
                  "False False False\nunderlying stream is not seekable\n"
                  "backslashreplace <stdout>\n"
                  "False False False\nunderlying stream is not seekable\n"
                  "backslashreplace <stderr>\n");
}

static void random_state_differs_between_runs(void **state)
{
    const char *code = "import random, os\nprint(random.getrandbits(64), os.urandom(8).hex())\n";
    struct sbx_result *a = run_code(SBX(state), code);
    struct sbx_result *b = run_code(SBX(state), code);
    expect_completed(a, 0);
    expect_completed(b, 0);
    assert_string_not_equal(a->stdout_text, b->stdout_text);
    sbx_result_free(a);
    sbx_result_free(b);
}

/* --- bad input ----------------------------------------------------------- */

static void odd_code_gets_a_clear_answer(void **state)
{
    struct sbx_request req;
    struct sbx_result *r;
    struct sbx_error err;

    sbx_request_init(&req);
    req.code = "print(1)\0print(2)";
    req.code_len = 17;
    assert_int_equal(sbx_run(SBX(state), &req, &r, &err), 0);
    expect_completed(r, 1);
    assert_non_null(strstr(r->stderr_text, "null bytes"));
    sbx_result_free(r);

    req.code = "print('\xff')";
    req.code_len = strlen(req.code);
    assert_int_equal(sbx_run(SBX(state), &req, &r, &err), 0);
    expect_completed(r, 1);
    assert_non_null(strstr(r->stderr_text, "SyntaxError"));
    sbx_result_free(r);

    req.code = "";
    req.code_len = 0;
    assert_int_equal(sbx_run(SBX(state), &req, &r, &err), 0);
    expect_completed(r, 0);
    sbx_result_free(r);

    req.code = "def f(:\n";
    req.code_len = strlen(req.code);
    assert_int_equal(sbx_run(SBX(state), &req, &r, &err), 0);
    expect_completed(r, 1);
    assert_non_null(strstr(r->stderr_text, "SyntaxError"));
    sbx_result_free(r);
}

static void ten_mib_program_gets_a_clear_answer(void **state)
{
    size_t n = 10 << 20;
    char *code = malloc(n + 1);
    const char *line = "x = 1\n";
    size_t i = 0;
    for (; i + 6 <= n; i += 6)
        memcpy(code + i, line, 6);
    memset(code + i, '\n', n - i);
    code[n] = '\0';
    struct sbx_limits l = limits(60, 60);
    struct sbx_result *r = run_with(SBX(state), code, &l, NULL, 0);
    /* Compiling 1.7 million statements may fit in 256 MiB or not; either is a
     * clear answer. */
    if (r->status != SBX_MEMORY_LIMIT)
        expect_completed(r, 0);
    sbx_result_free(r);
    free(code);
}

static void bad_limits_are_refused_before_running(void **state)
{
    struct {
        const char *what;
        double wall, cpu;
        uint64_t memory, max_output, max_bytes, max_count;
    } cases[] = {
        {"zero wall", 0, 1, 256 << 20, 10, 10, 10},
        {"negative cpu", 1, -1, 256 << 20, 10, 10, 10},
        {"NaN wall", NAN, 1, 256 << 20, 10, 10, 10},
        {"infinite cpu", 1, INFINITY, 256 << 20, 10, 10, 10},
        {"absurd wall", 1e30, 1, 256 << 20, 10, 10, 10},
        {"zero memory", 1, 1, 0, 10, 10, 10},
        {"tiny memory", 1, 1, 4096, 10, 10, 10},
        {"absurd memory", 1, 1, UINT64_MAX, 10, 10, 10},
        {"absurd output", 1, 1, 256 << 20, UINT64_MAX, 10, 10},
        {"absurd artifact bytes", 1, 1, 256 << 20, 10, UINT64_MAX, 10},
        {"absurd artifacts", 1, 1, 256 << 20, 10, 10, UINT64_MAX},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sbx_request req;
        struct sbx_result *r = (struct sbx_result *)1;
        struct sbx_error err = {0};
        sbx_request_init(&req);
        req.code = "print(1)";
        req.code_len = 8;
        req.limits.wall_seconds = cases[i].wall;
        req.limits.cpu_seconds = cases[i].cpu;
        req.limits.memory_bytes = cases[i].memory;
        req.limits.max_output_chars = cases[i].max_output;
        req.limits.max_artifact_bytes = cases[i].max_bytes;
        req.limits.max_artifacts = cases[i].max_count;
        int rc = sbx_run(SBX(state), &req, &r, &err);
        if (rc != -EINVAL || err.code != SBX_ERR_INVALID_LIMIT || !err.message[0])
            fail_msg("%s: rc %d, code %s", cases[i].what, rc, sbx_error_code_name(err.code));
        assert_null(r);
    }
}

static void escaping_file_names_are_refused(void **state)
{
    const char *names[] = {"../x", "/etc/passwd", "a/../../b", "", "a//b", "./a", ".."};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        struct sbx_file f = {names[i], "x", 1};
        struct sbx_request req;
        struct sbx_result *r = NULL;
        struct sbx_error err = {0};
        sbx_request_init(&req);
        req.code = "pass";
        req.code_len = 4;
        req.files = &f;
        req.n_files = 1;
        assert_int_equal(sbx_run(SBX(state), &req, &r, &err), -EINVAL);
        assert_int_equal(err.code, SBX_ERR_INVALID_FILE);
        assert_null(r);
    }
    /* Twice the same name, or a name used as another's directory. */
    struct sbx_file twice[] = {{"a", "1", 1}, {"a", "2", 1}};
    struct sbx_file dir[] = {{"a", "1", 1}, {"a-b", "1", 1}, {"a/b", "2", 1}};
    struct sbx_request req;
    struct sbx_result *r = NULL;
    struct sbx_error err = {0};
    sbx_request_init(&req);
    req.code = "pass";
    req.code_len = 4;
    req.files = twice;
    req.n_files = 2;
    assert_int_equal(sbx_run(SBX(state), &req, &r, &err), -EINVAL);
    req.files = dir;
    req.n_files = 3;
    assert_int_equal(sbx_run(SBX(state), &req, &r, &err), -EINVAL);
    assert_int_equal(err.code, SBX_ERR_INVALID_FILE);
    req.code = NULL;
    req.n_files = 0;
    assert_int_equal(sbx_run(SBX(state), &req, &r, &err), -EINVAL);
    assert_int_equal(err.code, SBX_ERR_INVALID_REQUEST);
    /* Nothing ran, so nothing may be left: only idle workspaces exist. */
}

static void a_work_root_workers_cannot_pass_is_refused(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip(); /* workers keep our uid: nothing to pass */
    char root[256];
    make_temp_dir(root, sizeof(root)); /* 0700 */
    struct sbx_config cfg;
    struct sbx_error err = {0};
    struct sbx *sbx = NULL;
    test_config_init(&cfg, root);
    assert_int_equal(sbx_open(&cfg, &sbx, &err), -EACCES);
    assert_null(sbx);
    assert_int_equal(err.code, SBX_ERR_UNAVAILABLE);
    assert_non_null(strstr(err.message, "not searchable"));
    assert_int_equal(count_entries(root), 0);
    rmdir(root);
}

/* --- a single run -------------------------------------------------------- */

/* A sandbox opened for one program (as pysbx run does): no warm module
 * imported, yet the standard library works; the environment is the usual
 * one; a traceback still shows its lines; a second run is refused at once,
 * not left waiting for a worker that never comes. */
static void a_single_run_sandbox_runs_one_program_then_refuses(void **state)
{
    (void)state;
    char root[256];
    make_temp_dir(root, sizeof(root));
    chmod(root, 0711);
    struct sbx_config cfg;
    struct sbx_error err = {0};
    struct sbx *sbx = NULL;
    test_config_init(&cfg, root);
    cfg.single_run = true;
    assert_int_equal(sbx_open(&cfg, &sbx, &err), 0);
    struct sbx_result *r = run_code(sbx, "import os, sys, json\n"
                                         "print('json' in sys.modules, os.environ['HOME'],\n"
                                         "      sorted(os.environ), json.dumps([1]))\n"
                                         "def f():\n"
                                         "    raise ValueError('x')\n"
                                         "f()\n");
    expect_completed(r, 1);
    assert_string_equal(r->stdout_text, "True /workspace ['HOME', 'LANG', 'LOGNAME', 'TMPDIR', "
                                        "'USER'] [1]\n");
    assert_non_null(strstr(r->stderr_text, "    raise ValueError('x')\n"));
    sbx_result_free(r);
    struct sbx_request req;
    struct sbx_result *second = NULL;
    sbx_request_init(&req);
    req.code = "print(2)";
    req.code_len = 8;
    assert_int_equal(sbx_run(sbx, &req, &second, &err), -EBUSY);
    assert_null(second);
    assert_int_equal(err.code, SBX_ERR_BUSY);
    sbx_close(sbx);
    assert_int_equal(count_entries(root), 0);
    rmdir(root);
}

/* --- many runs ------------------------------------------------------------ */

/* Our only child is the template; its children are the workers. */
static int count_template_children(int *zombies)
{
    pid_t tmpl = 0;
    *zombies = 0;
    if (proc_children(getpid(), "pysbx-template", &tmpl, 1, NULL) < 1)
        return 0;
    return proc_children(tmpl, NULL, NULL, 0, zombies);
}

/* Workspaces (w<id>) in a work directory: not its owner file or the
 * private root's mount point. */
static int count_workspaces(const char *work)
{
    DIR *d = opendir(work);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)))
        if (e->d_name[0] == 'w')
            n++;
    if (d)
        closedir(d);
    return n;
}

static void a_thousand_runs_leave_nothing_behind(void **state)
{
    char work[1024];
    /* The sandbox's own directory is the one entry of the root. */
    DIR *d = opendir(ROOT(state));
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            snprintf(work, sizeof(work), "%s/%s", ROOT(state), e->d_name);
    closedir(d);

    for (int i = 0; i < 20; i++) /* warm up the allocator's arenas */
        sbx_result_free(run_code(SBX(state), "open('f', 'w').write('x')\nprint(1)\n"));
    int fds = count_fds();
    struct mallinfo2 before = mallinfo2();
    for (int i = 0; i < 1000; i++) {
        struct sbx_result *r = run_code(
            SBX(state), "import os\nos.makedirs('d')\nopen('d/f', 'w').write('x')\nprint(1)\n");
        expect_completed(r, 0);
        assert_int_equal(r->n_artifacts, 1);
        sbx_result_free(r);
    }
    struct mallinfo2 after = mallinfo2();
    assert_int_equal(count_fds(), fds);
    int zombies;
    int workers = count_template_children(&zombies);
    assert_int_equal(zombies, 0);
    assert_true(workers <= 64);
    /* Idle workers' workspaces only (and any being made), once the
     * template's sweeper has caught up with the last mount points. */
    int entries = count_workspaces(work);
    for (int i = 0; i < 300 && entries > workers; i++) {
        usleep(10000);
        workers = count_template_children(&zombies);
        entries = count_workspaces(work);
    }
    if (entries > workers)
        fail_msg("%d workspaces left for %d workers", entries, workers);
#if !defined(__SANITIZE_ADDRESS__)
    /* Without ASan's allocator, heap in use must not grow with the count of
     * runs (under ASan, LeakSanitizer checks at exit instead). */
    assert_true(after.uordblks < before.uordblks + 64 * 1024);
#else
    (void)before;
    (void)after;
#endif
}

int main(void)
{
    /* What the host holds must not reach the code: a variable set before the
     * sandbox is opened, and a module on a PYTHONPATH. */
    char planted[256], path[512];
    make_temp_dir(planted, sizeof(planted));
    snprintf(path, sizeof(path), "%s/pysbx_test_planted.py", planted);
    FILE *f = fopen(path, "w");
    fputs("print('planted')\n", f);
    fclose(f);
    setenv("PYTHONPATH", planted, 1);
    setenv("PYSBX_TEST_SECRET", "hunter2", 1);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(print_completes_with_output),
        cmocka_unit_test(uncaught_exception_is_exit_1_with_traceback),
        cmocka_unit_test(sys_exit_code_is_the_exit_code),
        cmocka_unit_test(last_expression_value_comes_back_not_printed),
        cmocka_unit_test(no_value_without_a_final_expression),
        cmocka_unit_test(value_is_cut_at_the_output_limit),
        cmocka_unit_test(a_failing_last_expression_is_an_uncaught_exception),
        cmocka_unit_test(threads_are_joined_and_atexit_runs),
        cmocka_unit_test(output_over_limit_is_cut_and_flagged),
        cmocka_unit_test(flood_without_end_is_stopped_at_the_deadline),
        cmocka_unit_test(flood_that_ends_completes_with_a_bounded_result),
        cmocka_unit_test(invalid_utf8_output_is_replaced),
        cmocka_unit_test(an_exception_comes_back_typed),
        cmocka_unit_test(a_long_exception_message_is_cut_not_dropped),
        cmocka_unit_test(stdin_and_arguments_reach_the_program),
        cmocka_unit_test(the_program_has_its_name),
        cmocka_unit_test(the_host_name_is_one),
        cmocka_unit_test(wall_limit_fires_with_partial_output),
        cmocka_unit_test(output_printed_before_a_limit_is_in_the_answer),
        cmocka_unit_test(a_stopped_run_shows_all_it_can_of_a_long_output),
        cmocka_unit_test(cpu_limit_fires),
        cmocka_unit_test(cpu_limit_counts_every_thread),
        cmocka_unit_test(ignoring_sigxcpu_does_not_help),
        cmocka_unit_test(memory_limit_fires_for_one_big_allocation),
        cmocka_unit_test(the_memory_limit_counts_the_codes_own_data),
        cmocka_unit_test(memory_limit_fires_for_growth),
        cmocka_unit_test(caught_memory_error_is_just_a_result),
        cmocka_unit_test(crash_reports_the_signal),
        cmocka_unit_test(artifacts_come_back_sorted_and_capped),
        cmocka_unit_test(inputs_are_readable_and_come_back_only_if_changed),
        cmocka_unit_test(links_and_fifos_are_skipped),
        cmocka_unit_test(files_the_code_hides_come_back),
        cmocka_unit_test(files_not_returned_are_listed_with_why),
        cmocka_unit_test(artifacts_are_not_returned_from_a_stopped_run),
        cmocka_unit_test(workspace_is_deleted_on_every_outcome),
        cmocka_unit_test(each_run_starts_in_a_fresh_empty_workspace),
        cmocka_unit_test(environment_holds_no_host_variables),
        cmocka_unit_test(only_its_own_descriptors_are_open),
        cmocka_unit_test(host_packages_are_not_importable),
        cmocka_unit_test(connect_raises_oserror),
        cmocka_unit_test(ssl_imports_and_every_connection_fails_as_a_socket_does),
        cmocka_unit_test(asyncio_still_runs_without_a_network),
        cmocka_unit_test(stdout_and_stderr_are_pipes_as_under_python3),
        cmocka_unit_test(random_state_differs_between_runs),
        cmocka_unit_test(the_standard_library_reads_as_under_python3),
        cmocka_unit_test(odd_code_gets_a_clear_answer),
        cmocka_unit_test(ten_mib_program_gets_a_clear_answer),
        cmocka_unit_test(bad_limits_are_refused_before_running),
        cmocka_unit_test(escaping_file_names_are_refused),
        cmocka_unit_test(a_work_root_workers_cannot_pass_is_refused),
        cmocka_unit_test(a_single_run_sandbox_runs_one_program_then_refuses),
        cmocka_unit_test(a_thousand_runs_leave_nothing_behind),
    };
    int rc = cmocka_run_group_tests(tests, fixture_open, fixture_close);
    remove_dir(planted);
    return rc;
}
