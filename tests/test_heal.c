/*
 * A sandbox that heals itself and never waits without bound: a template
 * killed from outside is replaced, one that keeps dying puts the sandbox
 * down instead of into a restart storm, workers die with their template,
 * sbx_close is bounded and safe with runs in flight, start-up survives the
 * host's signals, cancellation reaches a caller waiting for a worker, and
 * waiting callers are served in order.
 *
 * Runs as pid 1 of its own pid namespace (tests/in_pidns.sh): orphaned
 * workers, if there were any, would become this program's children, where
 * the tests can count them.
 */
#define _GNU_SOURCE
#include "helpers.h"

#include "sysutil.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char root[256];

static struct sbx *open_sbx(unsigned pool, unsigned max_running)
{
    struct sbx_config cfg;
    struct sbx_error err = {0};
    struct sbx *sbx = NULL;

    test_config_init(&cfg, root);
    cfg.pool_size = pool;
    cfg.max_running = max_running;
    if (sbx_open(&cfg, &sbx, &err) < 0)
        fail_msg("sbx_open: %s", err.message);
    return sbx;
}

/* Dead: gone, or a zombie the library has not reaped yet (it reaps a dead
 * template when a run next needs one). */
static bool dead(pid_t pid)
{
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return true;
    bool z = fgets(buf, sizeof(buf), f) && strstr(buf, ") Z ");
    fclose(f);
    return z;
}

/* The template of the (only) sandbox this process has open. */
static pid_t template_pid(void)
{
    for (int i = 0; i < 200; i++) {
        pid_t pids[8];
        int n = proc_children(getpid(), "pysbx-template", pids, 8, NULL);
        for (int k = 0; k < n && k < 8; k++)
            if (!dead(pids[k]))
                return pids[k];
        usleep(10000);
    }
    fail_msg("no template process");
    return -1;
}

static void kill_template(void)
{
    pid_t pid = template_pid();
    assert_int_equal(kill(pid, SIGKILL), 0);
    for (int i = 0; i < 500 && !dead(pid); i++)
        usleep(10000);
}

/* After sbx_close: no template of ours left alive. (A worker orphaned
 * while it starts carries the template's name until it has renamed itself;
 * it exits at once, and as pid 1 here we are the one who would reap it:
 * such zombies are not templates.) */
static void no_template_left(const char *test)
{
    pid_t pids[8];
    int n = proc_children(getpid(), "pysbx-template", pids, 8, NULL);
    for (int k = 0; k < n && k < 8; k++)
        if (!dead(pids[k]))
            fail_msg("%s: template %d still alive after sbx_close", test, (int)pids[k]);
}

/* Live workers among our children: orphans of a dead template would be
 * reparented to us, pid 1 of this namespace. */
static int orphan_workers(void)
{
    pid_t pids[64];
    int zombies = 0;
    int n = proc_children(getpid(), "pysbx-worker", pids, 64, &zombies);
    return n - zombies;
}

static double ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

static void a_killed_template_is_replaced_and_its_workers_die_with_it(void **state)
{
    (void)state;
    struct sbx *sbx = open_sbx(4, 4);
    expect_stdout(sbx, "print(1)\n", "1\n");
    kill_template();
    /* Its idle workers went with it (none reparented to us, alive). */
    int left = 0;
    for (int i = 0; i < 100 && (left = orphan_workers()) > 0; i++)
        usleep(10000);
    assert_int_equal(left, 0);
    struct sbx_health h;
    sbx_health(sbx, &h);
    assert_false(h.ready);
    /* The next run starts a new template. */
    expect_stdout(sbx, "print(2)\n", "2\n");
    sbx_health(sbx, &h);
    assert_true(h.ready);
    assert_int_equal(h.restarts, 1);
    sbx_close(sbx);
    no_template_left("a_killed_template_is_replaced_and_its_workers_die_with_it");
}

struct bg {
    struct sbx *sbx;
    const char *code;
    struct sbx_cancel *cancel;
    double queue_timeout;
    struct sbx_result *res;
    int rc;
    struct sbx_error err;
    struct timespec started, ended;
    volatile bool up; /* it printed: it has a worker */
    pthread_t th;
};

static void bg_output(void *user, int stream, const char *text, size_t len)
{
    (void)stream;
    (void)text;
    if (len)
        ((struct bg *)user)->up = true;
}

static void *bg_main(void *p)
{
    struct bg *b = p;
    struct sbx_request req;
    sbx_request_init(&req);
    req.code = b->code;
    req.code_len = strlen(b->code);
    req.cancel = b->cancel;
    req.queue_timeout_seconds = b->queue_timeout;
    req.on_output = bg_output;
    req.user = b;
    clock_gettime(CLOCK_MONOTONIC, &b->started);
    b->rc = sbx_run(b->sbx, &req, &b->res, &b->err);
    clock_gettime(CLOCK_MONOTONIC, &b->ended);
    return NULL;
}

static void bg_start(struct bg *b, struct sbx *sbx, const char *code)
{
    memset(b, 0, sizeof(*b));
    b->sbx = sbx;
    b->code = code;
    assert_int_equal(pthread_create(&b->th, NULL, bg_main, b), 0);
}

static void a_run_in_flight_when_the_template_dies_ends_at_once(void **state)
{
    (void)state;
    struct sbx *sbx = open_sbx(2, 2);
    struct bg b;
    bg_start(&b, sbx, "import time\nprint('up', flush=True)\ntime.sleep(8)\n");
    usleep(300000); /* it is running (a result either way; only the timing matters) */
    kill_template();
    pthread_join(b.th, NULL);
    assert_int_equal(b.rc, 0);
    assert_int_equal(b.res->status, SBX_SANDBOX_ERROR);
    assert_true(ms_since(&b.started) < 5000); /* not the 8 s of its sleep */
    sbx_result_free(b.res);
    expect_stdout(sbx, "print(3)\n", "3\n");
    sbx_close(sbx);
    no_template_left("a_run_in_flight_when_the_template_dies_ends_at_once");
}

/* Sent just after its template was killed (the death not yet seen, a
 * worker of the dead template maybe taken already): the run waits for the
 * next template, within its own time, and is answered. */
static void a_run_sent_right_after_the_template_died_is_answered(void **state)
{
    (void)state;
    struct sbx *sbx = open_sbx(2, 2);
    for (int i = 0; i < 3; i++) {
        expect_stdout(sbx, "print('before')\n", "before\n");
        usleep(200000); /* its pool is refilled */
        pid_t pid = template_pid();
        assert_int_equal(kill(pid, SIGKILL), 0);
        struct sbx_request req;
        struct sbx_result *res = NULL;
        struct sbx_error err = {0};
        sbx_request_init(&req);
        req.code = "print('after')\n";
        req.code_len = strlen(req.code);
        if (sbx_run(sbx, &req, &res, &err) < 0)
            fail_msg("try %d: refused: %s", i, err.message);
        if (res->status != SBX_COMPLETED || strcmp(res->stdout_text, "after\n") != 0)
            fail_msg("try %d: %s (%s): %s", i, sbx_status_name(res->status),
                     res->reason ? res->reason : "", res->stdout_text);
        sbx_result_free(res);
    }
    struct sbx_health h;
    sbx_health(sbx, &h);
    assert_int_equal(h.restarts, 3);
    sbx_close(sbx);
    no_template_left("a_run_sent_right_after_the_template_died_is_answered");
}

static void a_template_that_keeps_dying_puts_the_sandbox_down(void **state)
{
    (void)state;
    struct sbx *sbx = open_sbx(1, 1);
    struct sbx_request req;
    struct sbx_result *res = NULL;
    struct sbx_error err = {0};
    int rc = 0;

    sbx_request_init(&req);
    req.code = "print(1)\n";
    req.code_len = 9;
    /* Kill each template as soon as it is there, until the sandbox stops
     * starting new ones. */
    for (int i = 0; i < 20; i++) {
        kill_template();
        res = NULL;
        rc = sbx_run(sbx, &req, &res, &err);
        sbx_result_free(res);
        if (rc < 0)
            break;
    }
    assert_true(rc < 0);
    assert_int_equal(err.code, SBX_ERR_UNAVAILABLE);
    assert_non_null(strstr(err.message, "failed"));
    /* Refused at once while down, with the same stable code. */
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_true(sbx_run(sbx, &req, &res, &err) < 0);
    assert_int_equal(err.code, SBX_ERR_UNAVAILABLE);
    assert_true(ms_since(&t0) < 500);
    struct sbx_health h;
    sbx_health(sbx, &h);
    assert_false(h.ready);
    assert_non_null(strstr(h.reason, "retrying"));
    sbx_close(sbx);
    no_template_left("a_template_that_keeps_dying_puts_the_sandbox_down");
}

static void closing_with_runs_in_flight_cancels_them_and_is_bounded(void **state)
{
    (void)state;
    struct sbx *sbx = open_sbx(2, 2);
    struct bg b[2];
    bg_start(&b[0], sbx, "import time\ntime.sleep(20)\n");
    bg_start(&b[1], sbx, "while True: pass\n");
    usleep(300000);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    sbx_close(sbx);
    assert_true(ms_since(&t0) < 5000);
    for (int i = 0; i < 2; i++) {
        pthread_join(b[i].th, NULL);
        if (b[i].rc == 0) {
            assert_int_equal(b[i].res->status, SBX_CANCELLED);
            sbx_result_free(b[i].res);
        } else
            assert_int_equal(b[i].err.code, SBX_ERR_UNAVAILABLE); /* not yet admitted */
    }
    no_template_left("closing_with_runs_in_flight_cancels_them_and_is_bounded");
}

static void closing_is_bounded_when_a_forked_child_holds_the_socket(void **state)
{
    (void)state;
    struct sbx *sbx = open_sbx(1, 1);
    pid_t child = fork();
    if (child == 0) {
        sleep(30); /* holds a copy of every descriptor the host had */
        _exit(0);
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    sbx_close(sbx);
    double ms = ms_since(&t0);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    assert_true(ms < 5000);
    no_template_left("closing_is_bounded_when_a_forked_child_holds_the_socket");
}

static void on_alarm(int sig)
{
    (void)sig;
}

static void opening_survives_the_hosts_signals(void **state)
{
    (void)state;
    struct sigaction sa = {.sa_handler = on_alarm}; /* no SA_RESTART */
    struct itimerval every_10ms = {{0, 10000}, {0, 10000}}, off = {{0, 0}, {0, 0}};
    sigaction(SIGALRM, &sa, NULL);
    setitimer(ITIMER_REAL, &every_10ms, NULL);
    for (int i = 0; i < 5; i++) {
        struct sbx *sbx = open_sbx(1, 1);
        expect_stdout(sbx, "print(1)\n", "1\n");
        sbx_close(sbx);
    }
    setitimer(ITIMER_REAL, &off, NULL);
    signal(SIGALRM, SIG_DFL);
    no_template_left("opening_survives_the_hosts_signals");
}

static void cancelling_while_waiting_for_a_worker_returns_at_once(void **state)
{
    (void)state;
    enum { MAX = 8 };
    struct sbx *sbx = open_sbx(1, MAX + 1);
    expect_stdout(sbx, "print(1)\n", "1\n");
    /* A template that makes no more workers (stopped): once the ready ones
     * are taken, the next run waits for one. */
    pid_t t = template_pid();
    kill(t, SIGSTOP);
    struct bg hold[MAX];
    int n = 0, waiting = -1;
    for (; n < MAX; n++) {
        bg_start(&hold[n], sbx, "import time\nprint('up', flush=True)\ntime.sleep(3)\n");
        hold[n].cancel = NULL;
        for (int i = 0; i < 50 && !hold[n].up; i++)
            usleep(10000);
        if (!hold[n].up) {
            waiting = n++;
            break;
        }
    }
    if (waiting < 0)
        fail_msg("every run got a worker from a stopped template (%d): first %s %s", (int)t,
                 hold[0].res ? sbx_status_name(hold[0].res->status) : "(running)",
                 hold[0].res ? hold[0].res->stdout_text : "");
    /* It is waiting for a worker that will not come; cancel it. (Its
     * token is set after the fact: the library reads it while waiting.) */
    struct sbx_cancel *c = sbx_cancel_new();
    struct bg b;
    memset(&b, 0, sizeof(b));
    b.sbx = sbx;
    b.code = "print('never')\n";
    b.cancel = c;
    assert_int_equal(pthread_create(&b.th, NULL, bg_main, &b), 0);
    usleep(300000);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    sbx_cancel_fire(c);
    pthread_join(b.th, NULL);
    assert_true(ms_since(&t0) < 1000);
    assert_int_equal(b.rc, 0);
    if (b.res->status != SBX_CANCELLED)
        fail_msg("expected cancelled, got %s: %s", sbx_status_name(b.res->status),
                 b.res->stdout_text);
    sbx_result_free(b.res);
    sbx_cancel_free(c);
    kill(t, SIGCONT);
    for (int i = 0; i < n; i++) {
        pthread_join(hold[i].th, NULL);
        if (hold[i].rc == 0)
            sbx_result_free(hold[i].res);
    }
    sbx_close(sbx);
    no_template_left("cancelling_while_waiting_for_a_worker_returns_at_once");
}

static void waiting_callers_are_served_in_order(void **state)
{
    (void)state;
    enum { N = 8 };
    struct sbx *sbx = open_sbx(2, 1);
    struct bg b[N];
    /* One place; callers arrive 30 ms apart behind a run that holds it. */
    struct bg hold;
    bg_start(&hold, sbx, "import time\ntime.sleep(0.5)\n");
    usleep(100000);
    for (int i = 0; i < N; i++) {
        bg_start(&b[i], sbx, "import time\ntime.sleep(0.02)\n");
        usleep(30000);
    }
    pthread_join(hold.th, NULL);
    if (hold.rc == 0)
        sbx_result_free(hold.res);
    for (int i = 0; i < N; i++) {
        pthread_join(b[i].th, NULL);
        assert_int_equal(b[i].rc, 0);
        sbx_result_free(b[i].res);
    }
    /* First come, first served: each ends after the one that came before. */
    for (int i = 1; i < N; i++)
        if (ms_since(&b[i].ended) > ms_since(&b[i - 1].ended))
            fail_msg("caller %d was served before caller %d, which came first", i, i - 1);
    sbx_close(sbx);
    no_template_left("waiting_callers_are_served_in_order");
}

/* Our children that are not in |before| (|n| of them). */
static int new_children(const pid_t *before, int n)
{
    pid_t now[64];
    int m = proc_children(getpid(), NULL, now, 64, NULL), fresh = 0;

    for (int i = 0; i < m && i < 64; i++) {
        bool old = false;
        for (int k = 0; k < n && !old; k++)
            old = now[i] == before[k];
        fresh += !old;
    }
    return fresh;
}

/* Opens a sandbox, kills its template and looks at the sandbox once (as a
 * host's health check does): within a few seconds nothing of the template
 * is left among this process's children, alive or not. Returns how many
 * are left. */
static int leftovers_of_a_killed_template(void)
{
    pid_t before[64];
    int n = proc_children(getpid(), NULL, before, 64, NULL), left = 0;
    struct sbx *sbx = open_sbx(2, 2);
    struct sbx_health h;

    expect_stdout(sbx, "print(1)\n", "1\n");
    kill_template();
    sbx_health(sbx, &h);
    for (int i = 0; i < 500 && (left = new_children(before, n)) > 0; i++)
        usleep(10000);
    sbx_close(sbx);
    return left;
}

/* Here the host is pid 1 of its pid namespace: what a killed template
 * leaves (its keeper, its helpers, its namespace's processes) is
 * reparented to it, and the keeper, its namespace's init, ends only once
 * every process of the namespace is reaped. The library reaps them. */
static void a_killed_templates_processes_end_when_the_host_is_pid_1(void **state)
{
    (void)state;
    assert_int_equal(getpid(), 1);
    int left = leftovers_of_a_killed_template();
    if (left)
        fail_msg("%d processes of a killed template are left", left);
}

/* The same in a host that is a subreaper (below pid 1). */
static void a_killed_templates_processes_end_when_the_host_is_a_subreaper(void **state)
{
    (void)state;
    pid_t child = fork();
    if (child == 0) {
        if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
            _exit(2);
        _exit(leftovers_of_a_killed_template() == 0 ? 0 : 1);
    }
    assert_true(child > 0);
    int st = 0;
    assert_int_equal(waitpid(child, &st, 0), child);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("the subreaper host: %s %d", WIFEXITED(st) ? "exit" : "signal",
                 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

static int setup(void **state)
{
    (void)state;
    make_temp_dir(root, sizeof(root));
    chmod(root, 0711);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    int left = count_entries(root);
    remove_dir(root);
    return left == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_killed_template_is_replaced_and_its_workers_die_with_it),
        cmocka_unit_test(a_run_in_flight_when_the_template_dies_ends_at_once),
        cmocka_unit_test(a_run_sent_right_after_the_template_died_is_answered),
        cmocka_unit_test(a_template_that_keeps_dying_puts_the_sandbox_down),
        cmocka_unit_test(closing_with_runs_in_flight_cancels_them_and_is_bounded),
        cmocka_unit_test(closing_is_bounded_when_a_forked_child_holds_the_socket),
        cmocka_unit_test(opening_survives_the_hosts_signals),
        cmocka_unit_test(cancelling_while_waiting_for_a_worker_returns_at_once),
        cmocka_unit_test(waiting_callers_are_served_in_order),
        cmocka_unit_test(a_killed_templates_processes_end_when_the_host_is_pid_1),
        cmocka_unit_test(a_killed_templates_processes_end_when_the_host_is_a_subreaper),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
