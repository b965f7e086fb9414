/* The verdict table: (wait status, started, killed, cpu) -> status, limit. */
#include "helpers.h"

#include "wire.h"
#include "verdict.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

#define EXITED(c)   ((c) << 8)
#define SIGNALED(s) (s)

struct row {
    const char *what;
    int wait_status;
    bool started, killed_for_wall;
    double cpu_ms;
    bool cpu_killed, limit_lost;
    enum sbx_status status;
    enum sbx_limit_kind limit;
    int exit_code, signal;
};

static void verdicts_follow_the_table(void **state)
{
    (void)state;
    const struct row rows[] = {
        /* what, status, started, wall kill, cpu ms, cpu kill, limit lost -> verdict */
        {"exit 0", EXITED(0), true, false, 10, false, false, SBX_COMPLETED, SBX_LIMIT_NONE, 0, 0},
        {"exception", EXITED(1), true, false, 10, false, false, SBX_COMPLETED, SBX_LIMIT_NONE, 1,
         0},
        {"sys.exit(42)", EXITED(42), true, false, 10, false, false, SBX_COMPLETED, SBX_LIMIT_NONE,
         42, 0},
        {"wall kill", SIGNALED(SIGKILL), true, true, 10, false, false, SBX_TIMEOUT, SBX_LIMIT_WALL,
         -1, 0},
        {"wall kill before start", SIGNALED(SIGKILL), false, true, 1, false, false, SBX_TIMEOUT,
         SBX_LIMIT_WALL, -1, 0},
        {"exit just as the deadline hit", EXITED(0), true, true, 10, false, false, SBX_COMPLETED,
         SBX_LIMIT_NONE, 0, 0},
        {"the template's CPU kill", SIGNALED(SIGKILL), true, false, 1001, true, false, SBX_TIMEOUT,
         SBX_LIMIT_CPU, -1, 0},
        {"the CPU kill, rusage read a little under", SIGNALED(SIGKILL), true, false, 998, true,
         false, SBX_TIMEOUT, SBX_LIMIT_CPU, -1, 0},
        {"RLIMIT_CPU backstop", SIGNALED(SIGKILL), true, false, 2000, false, false, SBX_TIMEOUT,
         SBX_LIMIT_CPU, -1, 0},
        {"SIGKILL sent to itself after 90% of the CPU", SIGNALED(SIGKILL), true, false, 950, false,
         false, SBX_CRASHED, SBX_LIMIT_NONE, -1, SIGKILL},
        {"SIGXCPU, which the sandbox never sends", SIGNALED(SIGXCPU), true, false, 1000, false,
         false, SBX_CRASHED, SBX_LIMIT_NONE, -1, SIGXCPU},
        {"CPU limit could not be armed", SIGNALED(SIGKILL), true, false, 1, false, true,
         SBX_SANDBOX_ERROR, SBX_LIMIT_NONE, -1, 0},
        {"unexplained SIGKILL", SIGNALED(SIGKILL), true, false, 5, false, false, SBX_CRASHED,
         SBX_LIMIT_NONE, -1, SIGKILL},
        {"MemoryError", 0, true, false, 5, false, false, SBX_MEMORY_LIMIT, SBX_LIMIT_MEMORY, -1, 0},
        {"segfault", SIGNALED(SIGSEGV), true, false, 5, false, false, SBX_CRASHED, SBX_LIMIT_NONE,
         -1, SIGSEGV},
        {"policy", SIGNALED(SIGSYS), true, false, 5, false, false, SBX_CRASHED, SBX_LIMIT_NONE, -1,
         SIGSYS},
        {"died in setup", EXITED(125), false, false, 1, false, false, SBX_SANDBOX_ERROR,
         SBX_LIMIT_NONE, -1, 0},
        {"killed in setup", SIGNALED(SIGSEGV), false, false, 1, false, false, SBX_SANDBOX_ERROR,
         SBX_LIMIT_NONE, -1, 0},
    };
    struct sbx_limits l;
    sbx_limits_init(&l);
    l.cpu_seconds = 1.0;

    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const struct row *r = &rows[i];
        struct sbx_result res;
        memset(&res, 0, sizeof(res));
        struct verdict_input in = {
            .wait_status = strcmp(r->what, "MemoryError") == 0 ? WIRE_NOMEM_SIGNAL : r->wait_status,
            .started = r->started,
            .killed_for_wall = r->killed_for_wall,
            .cpu_killed = r->cpu_killed,
            .limit_lost = r->limit_lost,
            .cpu_ms = r->cpu_ms,
            .limits = &l,
        };
        assert_int_equal(verdict_classify(&in, &res), 0);
        if (res.status != r->status || res.limit != r->limit || res.exit_code != r->exit_code ||
            res.signal != r->signal)
            fail_msg("%s: got %s/%d exit %d signal %d", r->what, sbx_status_name(res.status),
                     res.limit, res.exit_code, res.signal);
        assert_true((res.status == SBX_COMPLETED) == (res.reason == NULL));
        assert_true(res.partial == (res.status != SBX_COMPLETED));
        free(res.reason);
    }
}

/* What the worker said before the code, cut by the supervisor's buffer in
 * the middle of a character, must still make a result that encodes. */
static void a_reason_cut_inside_a_character_stays_utf8(void **state)
{
    (void)state;
    struct sbx_limits l;
    struct sbx_result res;
    sbx_limits_init(&l);
    memset(&res, 0, sizeof(res));
    struct verdict_input in = {
        .wait_status = EXITED(125),
        .limits = &l,
        .setup_error = "pysbx: input file \xc3\xa9\xe2\x82", /* an \u00e9, then 2 of 3 bytes */
    };

    assert_int_equal(verdict_classify(&in, &res), 0);
    assert_int_equal(res.status, SBX_SANDBOX_ERROR);
    assert_string_equal(res.reason, "pysbx: input file \xc3\xa9");
    char *json = sbx_result_to_json(&res);
    assert_non_null(json);
    assert_non_null(strstr(json, "\"reason\":\"pysbx: input file \xc3\xa9\""));
    free(json);
    free(res.reason);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(verdicts_follow_the_table),
        cmocka_unit_test(a_reason_cut_inside_a_character_stays_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
