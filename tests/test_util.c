/* Pure helpers: name checks, UTF-8, base64, number parsing. */
#include "helpers.h"

#include "sbxerr.h"
#include "util.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

static void names_that_escape_or_are_malformed_are_refused(void **state)
{
    (void)state;
    static const char *bad[] = {"",  "/etc/passwd", "..",   "../x", "a/../b", "a/..",
                                ".", "./a",         "a//b", "a/",   "a/./b",  "\xff.txt"};
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
        assert_non_null(name_problem(bad[i], strlen(bad[i])));
    assert_non_null(name_problem("a\0b", 3));
    char longcomp[300];
    memset(longcomp, 'x', sizeof(longcomp) - 1);
    longcomp[sizeof(longcomp) - 1] = '\0';
    assert_non_null(name_problem(longcomp, strlen(longcomp)));
}

static void ordinary_names_are_accepted(void **state)
{
    (void)state;
    static const char *good[] = {"a",   "data.csv", "plots/a.png",     "a/b/c/d.txt", ".hidden",
                                 "..x", "x..",      "caf\xc3\xa9.txt", "a b/c d"};
    for (size_t i = 0; i < ARRAY_SIZE(good); i++)
        assert_null(name_problem(good[i], strlen(good[i])));
}

static void utf8_prefix_stops_at_the_first_invalid_byte(void **state)
{
    (void)state;
    assert_int_equal(utf8_valid_prefix((const unsigned char *)"abc", 3), 3);
    assert_int_equal(utf8_valid_prefix((const unsigned char *)"a\xc3\xa9", 3), 3);
    assert_int_equal(utf8_valid_prefix((const unsigned char *)"a\xc3", 2), 1);    /* cut */
    assert_int_equal(utf8_valid_prefix((const unsigned char *)"\xc0\x80", 2), 0); /* overlong */
    assert_int_equal(utf8_valid_prefix((const unsigned char *)"\xed\xa0\x80", 3),
                     0); /* surrogate */
    assert_int_equal(utf8_valid_prefix((const unsigned char *)"\xf4\x90\x80\x80", 4), 0);
    assert_int_equal(utf8_valid_prefix((const unsigned char *)"\xf0\x9f\x98\x80!", 5), 5);
}

static void base64_round_trips_rfc4648_vectors(void **state)
{
    (void)state;
    static const char *plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    static const char *enc[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (size_t i = 0; i < ARRAY_SIZE(plain); i++) {
        size_t n = 0;
        char *e = base64_encode(plain[i], strlen(plain[i]), &n);
        assert_string_equal(e, enc[i]);
        assert_int_equal(n, strlen(enc[i]));
        unsigned char *d = base64_decode(e, n, &n);
        assert_non_null(d);
        assert_int_equal(n, strlen(plain[i]));
        assert_memory_equal(d, plain[i], n);
        free(d);
        free(e);
    }
    size_t n;
    assert_null(base64_decode("Zm9v!", 5, &n));
    assert_int_equal(errno, EINVAL);
    assert_null(base64_decode("Z", 1, &n));
}

static void sizes_and_numbers_parse_strictly(void **state)
{
    (void)state;
    uint64_t v;
    assert_int_equal(parse_size("256M", &v), 0);
    assert_int_equal(v, 256ULL << 20);
    assert_int_equal(parse_size("1G", &v), 0);
    assert_int_equal(v, 1ULL << 30);
    assert_int_equal(parse_size("1GiB", &v), 0);
    assert_int_equal(v, 1ULL << 30);
    assert_int_equal(parse_size("512k", &v), 0);
    assert_int_equal(v, 512ULL << 10);
    assert_int_equal(parse_size("1048576", &v), 0);
    assert_int_equal(v, 1048576);
    static const char *bad[] = {
        "", "M", "-1", "1.5G", "12Q", "1GG", " 1", "99999999999999999999", "20000000000T"};
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
        assert_int_equal(parse_size(bad[i], &v), -EINVAL);

    double s;
    assert_int_equal(parse_seconds("0.5", &s), 0);
    assert_true(s == 0.5);
    assert_int_equal(parse_seconds("1e-3", &s), 0);
    assert_true(s == 1e-3);
    assert_int_equal(parse_seconds("2E1", &s), 0);
    assert_true(s == 20);
    static const char *badsec[] = {"0",   "-1", "nan", "inf", "1e400", "",   "1s",     "0.0",
                                   "0x1", "1e", "+",   "e5",  " 1",    "1 ", "1e-400", "--1"};
    for (size_t i = 0; i < ARRAY_SIZE(badsec); i++)
        assert_int_equal(parse_seconds(badsec[i], &s), -EINVAL);
    char size[48];
    fmt_size(size, sizeof(size), 256ULL << 20);
    assert_string_equal(size, "256 MiB");
    fmt_size(size, sizeof(size), 1ULL << 30);
    assert_string_equal(size, "1 GiB");
    fmt_size(size, sizeof(size), 1536ULL << 10);
    assert_string_equal(size, "1536 KiB");
    fmt_size(size, sizeof(size), 1000);
    assert_string_equal(size, "1000 bytes");
    fmt_size(size, sizeof(size), 1);
    assert_string_equal(size, "1 byte");
    fmt_size(size, sizeof(size), 0);
    assert_string_equal(size, "0 bytes");
    assert_int_equal(parse_u64("0", &v), 0);
    assert_int_equal(parse_u64("-3", &v), -EINVAL);
    assert_int_equal(parse_u64("18446744073709551616", &v), -EINVAL);
}

static void signals_have_their_names(void **state)
{
    (void)state;
    assert_string_equal(signal_name(SIGSEGV), "SIGSEGV");
    assert_string_equal(signal_name(SIGSYS), "SIGSYS");
    assert_string_equal(signal_name(SIGXCPU), "SIGXCPU");
    assert_null(signal_name(0));
}

/* A refusal's message ends up in JSON answers: cut inside a character (a
 * long file name of two-byte letters), it must still be UTF-8. Found by
 * fuzz_reqjson. */
static void percentiles_use_one_method_and_stay_ordered(void **state)
{
    (void)state;
    const double two[] = {1, 9};
    assert_true(percentile(two, 2, 50) == 1);
    assert_true(percentile(two, 2, 99) == 9);
    const double one[] = {5};
    assert_true(percentile(one, 1, 50) == 5 && percentile(one, 1, 99) == 5);
    double v[200];
    for (size_t i = 0; i < 200; i++)
        v[i] = (double)(i + 1);
    assert_true(percentile(v, 100, 50) == 50);
    assert_true(percentile(v, 100, 99) == 99);
    assert_true(percentile(v, 100, 100) == 100);
    assert_true(percentile(v, 200, 99) == 198);
    for (size_t n = 1; n <= 200; n++)
        assert_true(percentile(v, n, 50) <= percentile(v, n, 99));
}

static void error_message_cut_inside_a_character_stays_utf8(void **state)
{
    (void)state;
    struct sbx_error err;
    char name[301];
    for (size_t i = 0; i < 150; i++)
        memcpy(name + 2 * i, "\xc3\xa9", 2);
    name[300] = '\0';
    /* 6 bytes before the name: the cut at 255 falls inside its 125th letter. */
    sbx_fail(&err, SBX_ERR_INVALID_FILE, -EINVAL, "input %s: the name has a '..' component", name);
    size_t n = strlen(err.message);
    assert_int_equal(utf8_valid_prefix((const unsigned char *)err.message, n), n);
    assert_int_equal(n, 6 + 2 * 124); /* "input " and whole letters */
    sbx_fail(&err, SBX_ERR_UNAVAILABLE, -EIO, "opening /tmp/caf\xe9: %s", "denied");
    assert_string_equal(err.message, "opening /tmp/caf");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(names_that_escape_or_are_malformed_are_refused),
        cmocka_unit_test(ordinary_names_are_accepted),
        cmocka_unit_test(utf8_prefix_stops_at_the_first_invalid_byte),
        cmocka_unit_test(base64_round_trips_rfc4648_vectors),
        cmocka_unit_test(sizes_and_numbers_parse_strictly),
        cmocka_unit_test(signals_have_their_names),
        cmocka_unit_test(error_message_cut_inside_a_character_stays_utf8),
        cmocka_unit_test(percentiles_use_one_method_and_stay_ordered),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
