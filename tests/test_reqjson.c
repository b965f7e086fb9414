/*
 * The request decoder every front end uses (JSON lines, HTTP, MCP, batch):
 * linear in the request's size, its caps applied before the work they
 * bound. Timed as a ratio in one run: ten times the input must take about
 * ten times as long (a quadratic step takes a hundred), whatever the
 * machine's speed.
 */
#define _GNU_SOURCE
#include "helpers.h"

#include "reqjson.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The thread's CPU time, not the wall clock: on a machine busy with other
 * work, a parse preempted in each of its tries would read as a slower
 * algorithm. */
static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* A request of |n| input files under |depth|-deep names, half as text
 * under files and half as base64 under files_base64. */
static char *request_of(size_t n, unsigned depth)
{
    size_t cap = n * (depth * 6 + 64) + 256, len = 0;
    char *s = malloc(cap);

    assert_non_null(s);
    len += (size_t)sprintf(s + len, "{\"id\": 1, \"code\": \"pass\"");
    for (int part = 0; part < 2; part++) {
        len += (size_t)sprintf(s + len, ", \"%s\": {", part ? "files_base64" : "files");
        size_t from = part ? n / 2 : 0, to = part ? n : n / 2;
        for (size_t i = from; i < to; i++) {
            len += (size_t)sprintf(s + len, "%s\"f%zu", i > from ? ", " : "", i);
            for (unsigned d = 0; d < depth; d++)
                len += (size_t)sprintf(s + len, "/d%u", d);
            len += (size_t)sprintf(s + len, "\": \"%s\"", part ? "eHg=" : "x");
        }
        len += (size_t)sprintf(s + len, "}");
    }
    len += (size_t)sprintf(s + len, "}");
    assert_true(len < cap);
    return s;
}

/* The fastest of a few parses of |text|, in seconds; the parse must pass. */
static double parse_time(const char *text)
{
    double best = 1e9;

    for (int k = 0; k < 3; k++) {
        struct json_request r;
        struct sbx_error err = {0};
        double t0 = now_s();
        int rc = json_request_parse(text, strlen(text), NULL, &r, &err);
        double t = now_s() - t0;
        if (rc < 0)
            fail_msg("refused: %s", err.message);
        assert_int_equal(r.req.n_files > 0, 1);
        json_request_free(&r);
        if (t < best)
            best = t;
    }
    return best;
}

static void ten_times_the_files_take_about_ten_times_as_long(void **state)
{
    (void)state;
    /* Names 600 bytes long, 200 directories deep: each one's prefixes are
     * checked against every name. */
    char *small = request_of(800, 200), *large = request_of(8000, 200);
    (void)parse_time(small); /* warm the allocator */
    double a = parse_time(small), b = parse_time(large);
    print_message("800 files: %.2f ms; 8000: %.2f ms; ratio %.1f\n", a * 1e3, b * 1e3, b / a);
    /* Linear is 10; comparing names pairwise, or each name's prefixes as
     * copies, would be 100. */
    if (b / a > 40)
        fail_msg("10x the files took %.0fx as long: not linear", b / a);
    free(small);
    free(large);
}

static void names_ten_times_as_long_take_about_ten_times_as_long(void **state)
{
    (void)state;
    /* Every prefix of a name is a directory to check: 80 of them, then 800
     * (names of 400 and 4000 bytes). */
    char *small = request_of(400, 80), *large = request_of(400, 800);
    (void)parse_time(small);
    double a = parse_time(small), b = parse_time(large);
    print_message("names of 80 levels: %.2f ms; of 800: %.2f ms; ratio %.1f\n", a * 1e3, b * 1e3,
                  b / a);
    if (b / a > 40)
        fail_msg("names 10x as long took %.0fx as long: not linear", b / a);
    free(small);
    free(large);
}

/* Past the number of files a request may hold, it is refused before any is
 * decoded, at once: ten times more takes about ten times as long to parse,
 * not to decode and compare. */
static double refusal_time(const char *text)
{
    double best = 1e9;

    for (int k = 0; k < 3; k++) {
        struct json_request r;
        struct sbx_error err = {0};
        double t0 = now_s();
        int rc = json_request_parse(text, strlen(text), NULL, &r, &err);
        double t = now_s() - t0;
        json_request_free(&r);
        assert_int_equal(rc, -E2BIG);
        assert_int_equal(err.code, SBX_ERR_TOO_LARGE);
        assert_non_null(strstr(err.message, "10000"));
        if (t < best)
            best = t;
    }
    return best;
}

static void too_many_files_are_refused_before_they_are_decoded(void **state)
{
    (void)state;
    char *big = request_of(20000, 1), *bigger = request_of(200000, 1);
    double a = refusal_time(big), b = refusal_time(bigger);
    print_message("20000 files refused in %.2f ms; 200000 in %.2f ms; ratio %.1f\n", a * 1e3,
                  b * 1e3, b / a);
    /* Linear is 10 (a little more as the larger one leaves the caches);
     * comparing names pairwise would be 100. */
    if (b / a > 40)
        fail_msg("10x the files took %.0fx as long to refuse: not linear", b / a);
    free(big);
    free(bigger);
}

/* One name that another uses as its directory, and one given in both
 * objects, are still found. */
static void clashing_names_are_still_refused(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "{\"code\": \"pass\", \"files\": {\"a/b\": \"x\", \"a\": \"y\"}}",
        "{\"code\": \"pass\", \"files\": {\"a\": \"x\"}, \"files_base64\": {\"a\": \"eA==\"}}",
        "{\"code\": \"pass\", \"files\": {\"d/e/f\": \"x\", \"d/e\": \"y\"}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct json_request r;
        struct sbx_error err = {0};
        assert_true(json_request_parse(bad[i], strlen(bad[i]), NULL, &r, &err) < 0);
        assert_int_equal(err.code, SBX_ERR_INVALID_FILE);
        json_request_free(&r);
    }
    const char *good = "{\"code\": \"pass\", \"files\": {\"a/b\": \"x\", \"a-b\": \"y\", \"ab\": "
                       "\"z\"}}";
    struct json_request r;
    struct sbx_error err = {0};
    assert_int_equal(json_request_parse(good, strlen(good), NULL, &r, &err), 0);
    assert_int_equal(r.req.n_files, 3);
    json_request_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ten_times_the_files_take_about_ten_times_as_long),
        cmocka_unit_test(names_ten_times_as_long_take_about_ten_times_as_long),
        cmocka_unit_test(too_many_files_are_refused_before_they_are_decoded),
        cmocka_unit_test(clashing_names_are_still_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
