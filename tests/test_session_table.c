/* The command's table of named sessions (src/cli/sessions.c) over a stub
 * backend that records the order cells reach it and can hold one: cells run
 * in the order they were entered, a lost session's name starts a new one,
 * closing waits for the cells before it. */
#include "helpers.h"

#include "sbxerr.h"
#include "sessions.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The stub: "hold" blocks until released; "lose" is session_lost. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    bool holding, released;
    char log[16][16];
    unsigned n_log, opens, closes;
} stub = {.lock = PTHREAD_MUTEX_INITIALIZER, .changed = PTHREAD_COND_INITIALIZER};

struct stub_session {
    uint64_t cells;
};

static int stub_open(void *self, const struct sbx_session_limits *limits, struct sbx_session **out,
                     struct sbx_error *err)
{
    (void)self;
    (void)limits;
    (void)err;
    pthread_mutex_lock(&stub.lock);
    stub.opens++;
    pthread_mutex_unlock(&stub.lock);
    *out = calloc(1, sizeof(struct stub_session));
    return *out ? 0 : -ENOMEM;
}

static int stub_run_cell(struct sbx_session *session, const struct sbx_request *req,
                         enum sbx_rollback rollback, struct sbx_result **out, struct sbx_error *err)
{
    struct stub_session *s = (struct stub_session *)session;

    (void)rollback;
    pthread_mutex_lock(&stub.lock);
    snprintf(stub.log[stub.n_log++ % 16], 16, "%.*s", (int)req->code_len, req->code);
    if (strcmp(req->code, "hold") == 0) {
        stub.holding = true;
        pthread_cond_broadcast(&stub.changed);
        while (!stub.released)
            pthread_cond_wait(&stub.changed, &stub.lock);
    }
    pthread_mutex_unlock(&stub.lock);
    if (strcmp(req->code, "lose") == 0)
        return sbx_fail(err, SBX_ERR_SESSION_LOST, -ENOLINK, "lost");
    struct sbx_result *r = calloc(1, sizeof(*r));
    assert_non_null(r);
    r->status = SBX_COMPLETED;
    r->cell = ++s->cells;
    *out = r;
    return 0;
}

static void stub_close(struct sbx_session *s)
{
    pthread_mutex_lock(&stub.lock);
    stub.closes++;
    pthread_mutex_unlock(&stub.lock);
    free(s);
}

static const struct sbx_backend backend = {.name = "stub",
                                           .session_open = stub_open,
                                           .session_run = stub_run_cell,
                                           .session_close = stub_close};

static int setup(void **state)
{
    stub.holding = stub.released = false;
    stub.n_log = stub.opens = stub.closes = 0;
    *state = session_table_new(&backend, NULL);
    return *state ? 0 : -1;
}

static int teardown(void **state)
{
    session_table_free(*state);
    return 0;
}

struct cell {
    pthread_t thread;
    struct session_cell *place;
    struct sbx_request req;
    int rc;
    uint64_t number;
    struct sbx_error err;
};

static void *run_cell(void *p)
{
    struct cell *c = p;
    struct sbx_result *res = NULL;

    c->rc = session_run(c->place, &c->req, SBX_ROLLBACK_ON_ERROR, &res, NULL, &c->err);
    c->number = res ? res->cell : 0;
    sbx_result_free(res);
    return NULL;
}

/* Enters a cell that says it is number |expect| (0: says nothing). */
static void enter_n(struct session_table *t, const char *name, struct cell *c, const char *code,
                    uint64_t expect)
{
    struct sbx_error err;

    memset(c, 0, sizeof(*c));
    sbx_request_init(&c->req);
    c->req.code = code;
    c->req.code_len = strlen(code);
    assert_int_equal(session_enter(t, name, expect, &c->place, &err), 0);
}

static void enter(struct session_table *t, const char *name, struct cell *c, const char *code)
{
    enter_n(t, name, c, code, 0);
}

static void start(struct cell *c)
{
    assert_int_equal(pthread_create(&c->thread, NULL, run_cell, c), 0);
}

static void wait_until(bool *flag)
{
    pthread_mutex_lock(&stub.lock);
    while (!*flag)
        pthread_cond_wait(&stub.changed, &stub.lock);
    pthread_mutex_unlock(&stub.lock);
}

static void release(void)
{
    pthread_mutex_lock(&stub.lock);
    stub.released = true;
    pthread_cond_broadcast(&stub.changed);
    pthread_mutex_unlock(&stub.lock);
}

static void cells_run_in_the_order_they_were_entered(void **state)
{
    struct cell c[3];

    enter(*state, "s", &c[0], "hold");
    enter(*state, "s", &c[1], "second");
    enter(*state, "s", &c[2], "third");
    /* Threads started last to first: the order is the entries'. */
    start(&c[2]);
    start(&c[1]);
    start(&c[0]);
    wait_until(&stub.holding);
    release();
    for (int i = 0; i < 3; i++) {
        pthread_join(c[i].thread, NULL);
        assert_int_equal(c[i].rc, 0);
        assert_int_equal(c[i].number, (uint64_t)i + 1);
    }
    assert_int_equal(stub.n_log, 3);
    assert_string_equal(stub.log[0], "hold");
    assert_string_equal(stub.log[1], "second");
    assert_string_equal(stub.log[2], "third");
    assert_int_equal(stub.opens, 1);
}

static void a_lost_session_gives_up_its_name(void **state)
{
    struct cell c;

    enter(*state, "s", &c, "lose");
    run_cell(&c);
    assert_int_equal(c.rc, -ENOLINK);
    assert_int_equal(c.err.code, SBX_ERR_SESSION_LOST);
    enter(*state, "s", &c, "again");
    run_cell(&c);
    assert_int_equal(c.rc, 0);
    assert_int_equal(c.number, 1);
    assert_int_equal(stub.opens, 2);
    assert_int_equal(stub.closes, 1); /* the lost one, once its cell was done */
}

/* A cell that says its number: the next one runs; cell 1 starts afresh
 * over a session the client has left; any other number that is not the
 * next is session_lost, and the session it found ends. */
static void a_numbered_cell_runs_only_as_the_next_one(void **state)
{
    struct cell c;
    struct session_info info[2];

    enter_n(*state, "s", &c, "x", 2); /* never held here */
    run_cell(&c);
    assert_int_equal(c.err.code, SBX_ERR_SESSION_LOST);
    assert_non_null(strstr(c.err.message, "holds no session of that name"));
    assert_int_equal(stub.opens, 0);
    for (uint64_t n = 1; n <= 3; n++) {
        enter_n(*state, "s", &c, "x", n);
        run_cell(&c);
        assert_int_equal(c.rc, 0);
        assert_int_equal(c.number, n);
    }
    assert_int_equal(session_list(*state, false, info, 2), 1);
    assert_string_equal(info[0].name, "s");
    assert_int_equal(info[0].cells, 3);
    assert_false(info[0].running);
    enter_n(*state, "s", &c, "x", 3); /* a number already answered */
    run_cell(&c);
    assert_int_equal(c.err.code, SBX_ERR_SESSION_LOST);
    assert_non_null(strstr(c.err.message, "holds it at another cell"));
    assert_int_equal(stub.closes, 1);
    assert_int_equal(session_list(*state, false, info, 2), 0);
    enter_n(*state, "s", &c, "x", 1);
    run_cell(&c);
    assert_int_equal(c.number, 1);
    enter_n(*state, "s", &c, "x", 2);
    run_cell(&c);
    enter_n(*state, "s", &c, "x", 1); /* starts again over the held one */
    run_cell(&c);
    assert_int_equal(c.rc, 0);
    assert_int_equal(c.number, 1);
    assert_int_equal(stub.opens, 3);
    assert_int_equal(stub.closes, 2);
}

/* The cells in line behind one that lost the session learn it too, rather
 * than open a new session under a name that is no longer theirs. */
static void the_cells_behind_a_lost_one_are_lost_too(void **state)
{
    struct cell c[3];

    enter_n(*state, "s", &c[0], "hold", 0);
    enter_n(*state, "s", &c[1], "x", 7);
    enter_n(*state, "s", &c[2], "y", 0);
    start(&c[0]);
    start(&c[1]);
    start(&c[2]);
    wait_until(&stub.holding);
    release();
    for (int i = 0; i < 3; i++)
        pthread_join(c[i].thread, NULL);
    assert_int_equal(c[0].rc, 0);
    assert_int_equal(c[1].err.code, SBX_ERR_SESSION_LOST);
    assert_int_equal(c[2].err.code, SBX_ERR_SESSION_LOST);
    assert_int_equal(stub.opens, 1);
    assert_int_equal(stub.closes, 1);
    assert_int_equal(stub.n_log, 1); /* neither reached the backend */
}

static void closing_frees_the_name_and_waits_for_the_cells_before(void **state)
{
    struct cell held, fresh;
    struct sbx_error err;

    enter(*state, "s", &held, "hold");
    start(&held);
    wait_until(&stub.holding);
    assert_int_equal(session_close(*state, "s", &err), 0);
    assert_int_equal(stub.closes, 0);
    enter(*state, "s", &fresh, "fresh");
    run_cell(&fresh);
    assert_int_equal(fresh.number, 1);
    assert_int_equal(stub.opens, 2);
    release();
    pthread_join(held.thread, NULL);
    assert_int_equal(stub.closes, 1);
    assert_int_equal(session_close(*state, "s", &err), 0);
    assert_int_equal(stub.closes, 2);
}

static void an_unknown_name_is_invalid_request(void **state)
{
    struct sbx_error err;

    assert_int_equal(session_close(*state, "nothing", &err), -ENOENT);
    assert_int_equal(err.code, SBX_ERR_INVALID_REQUEST);
    assert_non_null(strstr(err.message, "\"nothing\""));
}

static void a_backend_without_sessions_is_invalid_request(void **state)
{
    const struct sbx_backend none = {.name = "python3"};
    struct session_table *t = session_table_new(&none, NULL);
    struct session_cell *c = NULL;
    struct sbx_error err;

    (void)state;
    assert_non_null(t);
    assert_true(session_enter(t, "s", 0, &c, &err) < 0);
    assert_null(c);
    assert_int_equal(err.code, SBX_ERR_INVALID_REQUEST);
    assert_string_equal(err.message, "the python3 backend has no sessions");
    session_table_free(t);
}

static void freeing_the_table_closes_every_session(void **state)
{
    struct cell c;

    enter(*state, "a", &c, "x");
    run_cell(&c);
    enter(*state, "b", &c, "x");
    run_cell(&c);
    session_table_free(*state);
    *state = NULL;
    assert_int_equal(stub.opens, 2);
    assert_int_equal(stub.closes, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
        T(cells_run_in_the_order_they_were_entered),
        T(a_lost_session_gives_up_its_name),
        T(a_numbered_cell_runs_only_as_the_next_one),
        T(the_cells_behind_a_lost_one_are_lost_too),
        T(closing_frees_the_name_and_waits_for_the_cells_before),
        T(an_unknown_name_is_invalid_request),
        T(a_backend_without_sessions_is_invalid_request),
        T(freeing_the_table_closes_every_session),
#undef T
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
