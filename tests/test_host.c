/*
 * What a C service that links the library relies on: many threads at once,
 * streamed output, cancellation, back-pressure, and a host whose secrets,
 * threads and descriptors stay out of the sandbox.
 */
#define _GNU_SOURCE
#include "helpers.h"
#include "session_helpers.h"

#include "sysutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SBX(state) (((struct fixture *)*(state))->sbx)

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* --- streaming -------------------------------------------------------------- */

struct stream_log {
    char text[2][4096];
    size_t len[2];
    double first_at[2];
    int calls;
};

static void on_output(void *user, int stream, const char *text, size_t len)
{
    struct stream_log *log = user;
    int i = stream - 1;
    if (log->len[i] == 0)
        log->first_at[i] = now_s();
    size_t room = sizeof(log->text[i]) - 1 - log->len[i];
    size_t n = len < room ? len : room;
    memcpy(log->text[i] + log->len[i], text, n);
    log->len[i] += n;
    log->calls++;
}

static void output_is_streamed_as_it_is_written(void **state)
{
    struct stream_log log = {0};
    struct sbx_request req;
    struct sbx_result *r;
    struct sbx_error err;
    const char *code = "import sys, time\n"
                       "print('first', flush=True)\n"
                       "print('oops', file=sys.stderr, flush=True)\n"
                       "time.sleep(0.5)\n"
                       "print('second')\n";
    sbx_request_init(&req);
    req.code = code;
    req.code_len = strlen(code);
    req.on_output = on_output;
    req.user = &log;
    double t0 = now_s();
    assert_int_equal(sbx_run(SBX(state), &req, &r, &err), 0);
    double done = now_s();
    expect_completed(r, 0);
    /* The first line arrived while the code was still sleeping. */
    assert_true(log.first_at[0] - t0 < done - t0 - 0.3);
    assert_string_equal(log.text[0], r->stdout_text);
    assert_string_equal(log.text[1], r->stderr_text);
    assert_true(log.calls >= 3);
    sbx_result_free(r);
}

static void streamed_output_is_bounded_like_the_result(void **state)
{
    struct stream_log log = {0};
    struct sbx_request req;
    struct sbx_result *r;
    struct sbx_error err;
    const char *code = "for i in range(1000):\n    print('x' * 100, flush=True)\n";
    sbx_request_init(&req);
    req.code = code;
    req.code_len = strlen(code);
    req.limits.max_output_chars = 250;
    req.on_output = on_output;
    req.user = &log;
    assert_int_equal(sbx_run(SBX(state), &req, &r, &err), 0);
    assert_true(r->stdout_truncated);
    assert_string_equal(log.text[0], r->stdout_text); /* the cut line included */
    assert_non_null(strstr(log.text[0], "more characters]"));
    sbx_result_free(r);
}

/* --- host tools ----------------------------------------------------------------- */

struct tool_host {
    struct sbx_tool_answers *answers;
    pthread_t caller;
    int calls;
    bool on_callers_thread;
    uint64_t last_call;
    pthread_t later;
    bool answer_later;
};

static void *answer_later(void *p)
{
    struct tool_host *h = p;
    const char *answer = "[1, \"two\"]";
    usleep(200000);
    /* Checked on the test's thread, once the run is back. */
    h->calls += 100 * (sbx_tool_answer(h->answers, h->last_call, answer, strlen(answer)) != 0);
    return NULL;
}

static void on_tool_call(void *user, uint64_t call, const char *name, const char *args, size_t len)
{
    struct tool_host *h = user;
    char buf[256];

    h->calls++;
    h->last_call = call;
    h->on_callers_thread = pthread_equal(pthread_self(), h->caller);
    assert_int_equal(strlen(args), len);
    if (h->answer_later) {
        assert_int_equal(pthread_create(&h->later, NULL, answer_later, h), 0);
        return;
    }
    /* What is not JSON (or UTF-8), or longer than max_tool_bytes, changes
     * nothing. */
    size_t big = (1 << 20) + 2;
    char *huge = malloc(big);
    assert_non_null(huge);
    memset(huge, ' ', big);
    huge[0] = '1';
    assert_int_equal(sbx_tool_answer(h->answers, call, huge, big), -E2BIG);
    free(huge);
    assert_int_equal(sbx_tool_answer(h->answers, call, "{", 1), -EINVAL);
    assert_int_equal(sbx_tool_fail(h->answers, call, "\xff"), -EINVAL);
    snprintf(buf, sizeof(buf), "{\"name\": \"%s\", \"args\": %s, \"call\": %llu}", name, args,
             (unsigned long long)call);
    assert_int_equal(sbx_tool_answer(h->answers, call, buf, strlen(buf)), 0);
    /* Once only; and nothing but JSON. */
    assert_int_equal(sbx_tool_answer(h->answers, call, "1", 1), -EALREADY);
    assert_int_equal(sbx_tool_answer(h->answers, call + 1, "1", 1), -ENOENT);
}

/* |req| for |code| with |n| host tools, their calls to on_tool_call. */
static void tool_request(struct sbx_request *req, const char *code, const struct sbx_tool *tools,
                         size_t n, struct tool_host *h)
{
    sbx_request_init(req);
    req->code = code;
    req->code_len = strlen(code);
    req->tools = tools;
    req->n_tools = n;
    req->on_tool_call = on_tool_call;
    req->user = h;
}

static void tools_are_called_on_the_callers_thread_and_answered(void **state)
{
    struct tool_host h = {.answers = sbx_tool_answers_new(), .caller = pthread_self()};
    const struct sbx_tool tools[] = {{"lookup", "Finds it."}, {"other", NULL}};
    struct sbx_request req;
    struct sbx_result *r;
    struct sbx_error err;
    const char *code = "import pysbx\n"
                       "print(pysbx.tools.lookup(q=1)['args'], pysbx.call_tool('other')['call'])\n"
                       "try:\n    pysbx.call_tool('missing')\n"
                       "except pysbx.ToolError as e:\n    print(e)\n";
    tool_request(&req, code, tools, 2, &h);
    /* Without somewhere to answer, refused before it runs. */
    assert_int_equal(sbx_run(SBX(state), &req, &r, &err), -EINVAL);
    assert_int_equal(err.code, SBX_ERR_INVALID_REQUEST);
    req.tool_answers = h.answers;
    assert_int_equal(sbx_run(SBX(state), &req, &r, &err), 0);
    expect_completed(r, 0);
    assert_string_equal(r->stdout_text, "{'q': 1} 2\nno tool named missing in this run\n");
    assert_int_equal(h.calls, 2);
    assert_true(h.on_callers_thread);
    sbx_result_free(r);
    /* The run is over: its calls are no one's to answer. */
    assert_int_equal(sbx_tool_answer(h.answers, 1, "1", 1), -ENOENT);
    sbx_tool_answers_free(h.answers);
}

static void a_tool_answered_from_another_thread_while_the_code_waits(void **state)
{
    struct tool_host h = {.answers = sbx_tool_answers_new(), .answer_later = true};
    const struct sbx_tool tool = {"slow", NULL};
    struct sbx_request req;
    struct sbx_result *r;
    struct sbx_error err;
    const char *code = "import pysbx\nprint(pysbx.tools.slow())";
    tool_request(&req, code, &tool, 1, &h);
    req.tool_answers = h.answers;
    req.max_tool_bytes = 1024;
    h.caller = pthread_self();
    assert_int_equal(sbx_run(SBX(state), &req, &r, &err), 0);
    pthread_join(h.later, NULL);
    assert_int_equal(h.calls, 1);
    expect_completed(r, 0);
    assert_string_equal(r->stdout_text, "[1, 'two']\n");
    assert_true(r->wall_ms >= 200);
    assert_true(r->cpu_ms < 150); /* the code waited, it did not spin */
    sbx_result_free(r);
    /* Its run over, no call of it takes an answer, whatever the answer. */
    assert_int_equal(sbx_tool_answer(h.answers, 1, "{", 1), -ENOENT);
    sbx_tool_answers_free(h.answers);
}

/* --- cancellation ------------------------------------------------------------- */

struct canceller {
    struct sbx_cancel *token;
    double after;
};

static void *cancel_later(void *p)
{
    struct canceller *c = p;
    usleep((useconds_t)(c->after * 1e6));
    sbx_cancel_fire(c->token);
    return NULL;
}

static void cancel_from_another_thread_ends_the_run(void **state)
{
    struct sbx_request req;
    struct sbx_result *r;
    struct sbx_error err;
    const char *code = "import os, time\nprint(os.getcwd(), flush=True)\ntime.sleep(30)\n";
    struct canceller c = {sbx_cancel_new(), 0.3};
    pthread_t th;
    assert_non_null(c.token);
    sbx_request_init(&req);
    req.code = code;
    req.code_len = strlen(code);
    req.cancel = c.token;
    pthread_create(&th, NULL, cancel_later, &c);
    double t0 = now_s();
    assert_int_equal(sbx_run(SBX(state), &req, &r, &err), 0);
    assert_true(now_s() - t0 < 5);
    pthread_join(th, NULL);
    assert_int_equal(r->status, SBX_CANCELLED);
    assert_int_equal(r->exit_code, -1);
    assert_true(r->partial);
    assert_non_null(strstr(r->reason, "cancelled"));
    assert_true(r->stdout_len > 1);
    sbx_result_free(r);
    /* Fired after the run: harmless. */
    sbx_cancel_fire(c.token);
    assert_true(sbx_cancel_fired(c.token));
    sbx_cancel_free(c.token);
}

static void cancel_before_the_start_runs_nothing(void **state)
{
    struct sbx_request req;
    struct sbx_result *r;
    struct sbx_error err;
    struct sbx_cancel *token = sbx_cancel_new();
    sbx_cancel_fire(token);
    sbx_request_init(&req);
    req.code = "print(1)";
    req.code_len = 8;
    req.cancel = token;
    assert_int_equal(sbx_run(SBX(state), &req, &r, &err), 0);
    assert_int_equal(r->status, SBX_CANCELLED);
    assert_string_equal(r->stdout_text, "");
    sbx_result_free(r);
    sbx_cancel_free(token);
}

/* --- many threads, back-pressure ---------------------------------------------- */

struct hammer {
    struct sbx *sbx;
    int id;
    int ok;
};

static void *hammer_runs(void *p)
{
    struct hammer *h = p;
    for (int i = 0; i < 10; i++) {
        char code[64], want[32];
        snprintf(code, sizeof(code), "print(%d * 1000 + %d)\n", h->id, i);
        snprintf(want, sizeof(want), "%d\n", h->id * 1000 + i);
        struct sbx_request req;
        struct sbx_result *r;
        struct sbx_error err;
        sbx_request_init(&req);
        req.code = code;
        req.code_len = strlen(code);
        if (sbx_run(h->sbx, &req, &r, &err) == 0) {
            h->ok += r->status == SBX_COMPLETED && strcmp(r->stdout_text, want) == 0;
            sbx_result_free(r);
        }
    }
    return NULL;
}

static void many_threads_at_once_each_get_their_own_answer(void **state)
{
    pthread_t th[8];
    struct hammer h[8];
    for (int i = 0; i < 8; i++) {
        h[i] = (struct hammer){SBX(state), i, 0};
        pthread_create(&th[i], NULL, hammer_runs, &h[i]);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(h[i].ok, 10);
    }
}

struct slow_run {
    struct sbx *sbx;
    double queue_timeout;
    int rc;
    enum sbx_error_code code;
    enum sbx_status status;
    char message[256];
};

static void *run_slow(void *p)
{
    struct slow_run *s = p;
    struct sbx_request req;
    struct sbx_result *r = NULL;
    struct sbx_error err = {0};
    sbx_request_init(&req);
    req.code = "import time\ntime.sleep(1)\n";
    req.code_len = strlen(req.code);
    req.queue_timeout_seconds = s->queue_timeout;
    s->rc = sbx_run(s->sbx, &req, &r, &err);
    s->code = err.code;
    snprintf(s->message, sizeof(s->message), "%s", err.message);
    if (r)
        s->status = r->status;
    sbx_result_free(r);
    return NULL;
}

static void slow_callback(void *user, int stream, const char *text, size_t len)
{
    (void)user;
    (void)stream;
    (void)text;
    (void)len;
    static int once;
    if (!once++)
        sleep(3); /* a host that blocks in its callback */
}

static void a_slow_output_callback_does_not_stretch_the_wall_limit(void **state)
{
    struct sbx *sbx = ((struct fixture *)*state)->sbx;
    struct sbx_request req;
    struct sbx_result *res = NULL;
    struct sbx_error err;
    sbx_request_init(&req);
    req.code = "print('x', flush=True)\nwhile True: pass\n";
    req.code_len = strlen(req.code);
    req.limits.wall_seconds = 0.5;
    req.limits.cpu_seconds = 30;
    req.on_output = slow_callback;
    assert_int_equal(sbx_run(sbx, &req, &res, &err), 0);
    assert_int_equal(res->status, SBX_TIMEOUT);
    assert_int_equal(res->limit, SBX_LIMIT_WALL);
    /* The code spun for its half second, not for the callback's three. */
    if (res->cpu_ms > 1500)
        fail_msg("the code ran %.0f ms under a 0.5 s wall limit", res->cpu_ms);
    sbx_result_free(res);
}

/* Waits (bounded) until the sandbox has |running| runs in flight and
 * |waiting| callers queued: what the test sets up, observed, not assumed. */
static void wait_for(struct sbx *sbx, unsigned running, unsigned waiting)
{
    struct sbx_health h;
    for (int i = 0; i < 500; i++) {
        sbx_health(sbx, &h);
        if (h.running == running && h.waiting == waiting)
            return;
        usleep(10000);
    }
    fail_msg("never %u running and %u waiting (%u, %u)", running, waiting, h.running, h.waiting);
}

static void when_every_worker_is_busy_callers_queue_with_a_deadline(void **state)
{
    (void)state;
    char root[256];
    make_temp_dir(root, sizeof(root));
    chmod(root, 0711);
    struct sbx_config cfg;
    struct sbx_error err;
    struct sbx *sbx;
    test_config_init(&cfg, root);
    cfg.max_running = 1;
    cfg.max_queued = 1;
    assert_int_equal(sbx_open(&cfg, &sbx, &err), 0);

    struct slow_run first = {.sbx = sbx}, waits = {.sbx = sbx, .queue_timeout = 5},
                    full = {.sbx = sbx, .queue_timeout = 5},
                    gives_up = {.sbx = sbx, .queue_timeout = 0.2};
    pthread_t a, b;
    pthread_create(&a, NULL, run_slow, &first);
    wait_for(sbx, 1, 0); /* first is running */
    pthread_create(&b, NULL, run_slow, &waits);
    wait_for(sbx, 1, 1); /* waits is queued: the queue (1) is full */
    /* Refused at once for a full queue, though it would wait 5 s for a
     * place: not a timeout. */
    run_slow(&full);
    assert_int_equal(full.rc, -EBUSY);
    assert_int_equal(full.code, SBX_ERR_BUSY);
    if (!strstr(full.message, "queue full"))
        fail_msg("refused for another reason: %s", full.message);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    assert_int_equal(first.rc, 0);
    assert_int_equal(first.status, SBX_COMPLETED);
    assert_int_equal(waits.rc, 0); /* ran once the first was done */
    assert_int_equal(waits.status, SBX_COMPLETED);

    /* A short deadline with the queue free: waits, then gives up. */
    pthread_create(&a, NULL, run_slow, &first);
    wait_for(sbx, 1, 0);
    run_slow(&gives_up);
    assert_int_equal(gives_up.rc, -EBUSY);
    if (!strstr(gives_up.message, "within"))
        fail_msg("refused for another reason: %s", gives_up.message);
    pthread_join(a, NULL);
    sbx_close(sbx);
    assert_int_equal(count_entries(root), 0);
    rmdir(root);
}

/* --- the host's secrets --------------------------------------------------- */

static char secret[64];
static char *secret_in_heap;
static int secret_fd = -1;
static volatile int host_thread_stop;

static void *host_thread(void *p)
{
    (void)p;
    while (!host_thread_stop)
        usleep(10000);
    return NULL;
}

/* Whether |needle| occurs anywhere in the readable memory of |pid|. */
static int memory_holds(pid_t pid, const char *needle)
{
    char path[64], line[512];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    FILE *maps = fopen(path, "r");
    snprintf(path, sizeof(path), "/proc/%d/mem", (int)pid);
    int mem = open(path, O_RDONLY);
    int found = 0, scanned = 0;
    if (!maps || mem < 0) {
        if (maps)
            fclose(maps);
        if (mem >= 0)
            close(mem);
        return -1;
    }
    static char buf[1 << 20];
    while (!found && fgets(line, sizeof(line), maps)) {
        unsigned long start, end;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &start, &end, perms) != 3 || perms[0] != 'r')
            continue;
        /* AddressSanitizer's shadow (terabytes, mostly never touched):
         * reading it would only fill this machine's memory. */
        if (end - start > (1UL << 30))
            continue;
        for (unsigned long a = start; a < end && !found; a += sizeof(buf)) {
            size_t want = end - a < sizeof(buf) ? end - a : sizeof(buf);
            ssize_t n = pread(mem, buf, want, (off_t)a);
            if (n <= 0)
                break;
            scanned = 1;
            found = memmem(buf, (size_t)n, needle, strlen(needle)) != NULL;
        }
    }
    fclose(maps);
    close(mem);
    return scanned ? found : -1;
}

/* The template of this process's sandbox (the session helpers' template_pid
 * looks machine-wide). */
static pid_t our_template_pid(void)
{
    pid_t pid = -1;
    proc_children(getpid(), "pysbx-template", &pid, 1, NULL);
    return pid;
}

/* The worker that calls itself |inner| in its pid namespace, by the pid
 * this process sees (the last number of NSpid is the innermost one). */
static pid_t worker_from_inside(pid_t inner)
{
    pid_t workers[64];
    int n = proc_children(our_template_pid(), "pysbx-worker", workers, 64, NULL);

    for (int i = 0; i < n; i++) {
        char path[64], buf[4096];
        snprintf(path, sizeof(path), "/proc/%d/status", (int)workers[i]);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t got = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[got] = '\0';
        char *ns = strstr(buf, "\nNSpid:");
        char *end = ns ? strchr(ns + 1, '\n') : NULL;
        if (!end)
            continue;
        while (end > ns && (end[-1] < '0' || end[-1] > '9'))
            end--;
        while (end > ns && end[-1] >= '0' && end[-1] <= '9')
            end--;
        if (atoi(end) == inner)
            return workers[i];
    }
    return -1;
}

/* What a worker holds before any code runs, read from the host: no
 * capability in any set (the bounding set included, which the template
 * empties once for all of them), no_new_privs. A worker counts once its
 * seccomp filter is on, the last step of its setup. */
static int check_ready_worker(pid_t pid)
{
    static const char *const caps[] = {"CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"};
    unsigned long long v[5] = {~0ULL, ~0ULL, ~0ULL, ~0ULL, ~0ULL};
    int nnp = -1, seccomp = -1;
    char path[64], line[256];

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0; /* taken and gone meanwhile */
    while (fgets(line, sizeof(line), f)) {
        for (size_t k = 0; k < 5; k++)
            if (strncmp(line, caps[k], strlen(caps[k])) == 0)
                sscanf(line + strlen(caps[k]), "%llx", &v[k]);
        if (strncmp(line, "NoNewPrivs:", 11) == 0)
            nnp = atoi(line + 11);
        if (strncmp(line, "Seccomp:", 8) == 0)
            seccomp = atoi(line + 8);
    }
    fclose(f);
    if (seccomp != 2)
        return 0; /* still setting itself up */
    for (size_t k = 0; k < 5; k++)
        if (v[k] != 0)
            fail_msg("worker %d: %s %llx", (int)pid, caps[k], v[k]);
    assert_int_equal(nnp, 1);
    return 1;
}

static void idle_workers_hold_no_capabilities(void **state)
{
    int checked = 0;

    expect_stdout(SBX(state), "print(1)\n", "1\n"); /* the pool is up */
    for (int tries = 0; tries < 300 && checked == 0; tries++) {
        pid_t workers[16];
        int n = proc_children(our_template_pid(), "pysbx-worker", workers, 16, NULL);
        for (int i = 0; i < n && i < 16; i++)
            checked += check_ready_worker(workers[i]);
        if (checked == 0)
            usleep(10000);
    }
    assert_true(checked > 0);
}

struct secret_run {
    struct sbx *sbx;
    struct sbx_request req;
    struct stream_log log;
    struct sbx_result *res;
    int rc;
};

static void *secret_runner(void *p)
{
    struct secret_run *s = p;
    struct sbx_error err;
    s->rc = sbx_run(s->sbx, &s->req, &s->res, &err);
    return NULL;
}

static void a_linked_hosts_secrets_are_out_of_reach(void **state)
{
    /* The code gets only a digest of the secret: the secret itself must not
     * reach the worker, even as source text. */
    char cmd[256], digest[80] = "";
    snprintf(cmd, sizeof(cmd),
             "printf %%s '%s' | /usr/bin/python3 -c 'import hashlib,sys;"
             "print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'",
             secret);
    FILE *p = popen(cmd, "r");
    assert_non_null(fgets(digest, sizeof(digest), p));
    pclose(p);
    digest[strcspn(digest, "\n")] = '\0';
    static char code[2048];
    snprintf(code, sizeof(code),
             "import os, gc, hashlib, time\n"
             "digest = '%s'\n"
             "h = lambda b: hashlib.sha256(b).hexdigest()\n"
             "try:\n"
             "    env = open('/proc/self/environ', 'rb').read().split(b'\\0')\n"
             "except (PermissionError, FileNotFoundError):\n"
             "    env = []\n"
             "hits = [e for e in env if h(e.split(b'=', 1)[-1]) == digest]\n"
             "hits += [v for v in os.environ.values() if h(v.encode()) == digest]\n"
             "for o in gc.get_objects():\n"
             "    if isinstance(o, (str, bytes)) and len(o) == %zu:\n"
             "        if h(o if isinstance(o, bytes) else o.encode()) == digest:\n"
             "            hits.append(o)\n"
             "fds = []\n"
             "for fd in range(3, 1024):\n"
             "    try:\n        os.fstat(fd)\n        fds.append(fd)\n"
             "    except OSError:\n        pass\n"
             "print(len(hits), fds, os.getpid(), flush=True)\n"
             "time.sleep(1.5)\n", /* the host scans our memory meanwhile */
             digest, strlen(secret));

    struct secret_run run = {.sbx = SBX(state)};
    sbx_request_init(&run.req);
    run.req.code = code;
    run.req.code_len = strlen(code);
    run.req.on_output = on_output;
    run.req.user = &run.log;
    pthread_t th;
    pthread_create(&th, NULL, secret_runner, &run);
    for (int i = 0; i < 500 && !__atomic_load_n(&run.log.len[0], __ATOMIC_ACQUIRE); i++)
        usleep(10000);
    int hits = -1, worker = 0;
    char fds[64] = "";
    if (sscanf(run.log.text[0], "%d %63[^0-9] %d", &hits, fds, &worker) != 3)
        sscanf(run.log.text[0], "%d [] %d", &hits, &worker);
    /* From outside, as root: the secret is in neither the worker's memory
     * nor the template's (the template was started by exec). */
    pid_t outer = worker > 0 ? worker_from_inside(worker) : -1;
    int in_worker = outer > 0 ? memory_holds(outer, secret) : -1;
    int in_template = memory_holds(our_template_pid(), secret);
    int in_host = memory_holds(getpid(), secret); /* the check can find it */
    pthread_join(th, NULL);
    assert_int_equal(run.rc, 0);
    expect_completed(run.res, 0);
    /* No hit in environ, os.environ or any Python string; no descriptor. */
    if (strncmp(run.res->stdout_text, "0 [] ", 5) != 0)
        fail_msg("the code found something: %s", run.res->stdout_text);
    sbx_result_free(run.res);
    /* Reading another process's memory needs root: say so, rather than
     * pass without looking. */
    if (geteuid() != 0)
        skip();
    assert_int_equal(in_host, 1);
    assert_int_equal(in_worker, 0);
    assert_int_equal(in_template, 0);
}

/* A range of worker ids given to two sandboxes: the second is refused
 * while the first lives, saying why, and gets it once the first is
 * closed; when sbx_close returns, no process of the range's holder is left
 * (the range is free at once, not when some reaper gets to it). */
static void a_range_another_sandbox_holds_is_refused_until_it_closes(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip(); /* ids per worker and their claim need root */
    char root_a[256], root_b[256];
    struct sbx_config cfg;
    struct sbx_error err;
    struct sbx *a = NULL, *b = NULL;
    /* A block no sandbox holds now: this suite's own sandbox, or any other
     * on the machine, holds one drawn at random from the same 4,096 (one
     * chance in 4,095 that it is the one this pid names first). */
    unsigned block = 1000u + (unsigned)getpid() % 2000u;
    uid_t base = 0;
    for (int i = 0; i < 64; i++, block = 1u + block % 4095u) {
        base = (uid_t)(SBX_DEFAULT_WORKER_ID_BASE + 4096u * block);
        pid_t holder[4];
        int n = pids_of(base, holder, 4);
        if (n == 0)
            break;
        char path[64], comm[64] = "";
        snprintf(path, sizeof(path), "/proc/%d/comm", (int)holder[0]);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            ssize_t got = read(fd, comm, sizeof(comm) - 1);
            comm[got > 0 ? got - 1 : 0] = '\0'; /* without its newline */
            close(fd);
        }
        print_message("uid %lu is held by pid %d (%s): the next block\n", (unsigned long)base,
                      (int)holder[0], comm);
    }

    make_temp_dir(root_a, sizeof(root_a));
    make_temp_dir(root_b, sizeof(root_b));
    chmod(root_a, 0711); /* workers under their own uid pass through */
    chmod(root_b, 0711);
    assert_int_equal(processes_of(base), 0);
    test_config_init(&cfg, root_a);
    cfg.worker_uid = base;
    cfg.worker_gid = base;
    if (sbx_open(&cfg, &a, &err) < 0)
        fail_msg("sbx_open: %s", err.message);
    assert_int_equal(processes_of(base), 1); /* the holder */
    cfg.work_root = root_b;
    assert_true(sbx_open(&cfg, &b, &err) < 0);
    if (!strstr(err.message, "in use"))
        fail_msg("refused without saying why: %s", err.message);
    char in_range[128];
    snprintf(in_range, sizeof(in_range), "import os; print(0 < os.getuid() - %lu < 4096)\n",
             (unsigned long)base);
    expect_stdout(a, in_range, "True\n");
    sbx_close(a);
    assert_int_equal(processes_of(base), 0);
    if (sbx_open(&cfg, &b, &err) < 0)
        fail_msg("sbx_open after the first closed: %s", err.message);
    expect_stdout(b, in_range, "True\n");
    sbx_close(b);
    assert_int_equal(processes_of(base), 0);
    remove_dir(root_a);
    remove_dir(root_b);
}

static int host_setup(void **state)
{
    /* Before the sandbox exists: a secret in the environment and the heap, a
     * thread running, an inheritable descriptor open on a secret file. */
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    snprintf(secret, sizeof(secret), "pysbx-secret-%08x%08x", (unsigned)rand(), (unsigned)rand());
    setenv("PYSBX_HOST_SECRET", secret, 1);
    secret_in_heap = strdup(secret);
    char path[] = "/tmp/pysbx-host-secret-XXXXXX";
    secret_fd = mkstemp(path);
    if (secret_fd < 0 || write(secret_fd, secret, strlen(secret)) < 0)
        return -1;
    unlink(path);
    pthread_t th;
    pthread_create(&th, NULL, host_thread, NULL);
    pthread_detach(th);
    return fixture_open(state);
}

static int host_teardown(void **state)
{
    host_thread_stop = 1;
    close(secret_fd);
    free(secret_in_heap);
    return fixture_close(state);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(output_is_streamed_as_it_is_written),
        cmocka_unit_test(streamed_output_is_bounded_like_the_result),
        cmocka_unit_test(tools_are_called_on_the_callers_thread_and_answered),
        cmocka_unit_test(a_tool_answered_from_another_thread_while_the_code_waits),
        cmocka_unit_test(cancel_from_another_thread_ends_the_run),
        cmocka_unit_test(cancel_before_the_start_runs_nothing),
        cmocka_unit_test(many_threads_at_once_each_get_their_own_answer),
        cmocka_unit_test(when_every_worker_is_busy_callers_queue_with_a_deadline),
        cmocka_unit_test(a_slow_output_callback_does_not_stretch_the_wall_limit),
        cmocka_unit_test(a_linked_hosts_secrets_are_out_of_reach),
        cmocka_unit_test(idle_workers_hold_no_capabilities),
        cmocka_unit_test(a_range_another_sandbox_holds_is_refused_until_it_closes),
    };
    return cmocka_run_group_tests(tests, host_setup, host_teardown);
}
