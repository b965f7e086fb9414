/* Decoding the template's messages to the supervisor (fuzz_wire fuzzes the
 * same functions). */
#include "helpers.h"

#include "util.h"
#include "wire.h"

#include <errno.h>
#include <string.h>

static void worker_with_all_its_descriptors_is_taken(void **state)
{
    (void)state;
    struct wire_worker in = {.hdr = {WIRE_WORKER, WIRE_VERSION}, .pid = 42, .uid = 7, .gid = 8};
    struct wire_worker out;
    char why[64];
    memset(in.workspace, 'w', sizeof(in.workspace)); /* not terminated */
    assert_int_equal(wire_decode_worker(&in, sizeof(in), WFD_COUNT, &out, why, sizeof(why)), 0);
    assert_int_equal(out.pid, 42);
    assert_int_equal(strlen(out.workspace), sizeof(out.workspace) - 1);
    assert_int_equal(wire_decode_worker(&in, sizeof(in), WFD_COUNT - 1, &out, why, sizeof(why)),
                     -EPROTO);
    assert_int_equal(wire_decode_worker(&in, sizeof(in) - 1, WFD_COUNT, &out, why, sizeof(why)),
                     -EPROTO);
}

/* The template's words become an error's message or a result's reason,
 * both JSON strings: a path of any bytes, or a cut inside a character,
 * must not make them invalid UTF-8. */
static void template_failure_text_is_kept_to_valid_utf8(void **state)
{
    (void)state;
    struct wire_fail f = {.hdr = {WIRE_FAIL, WIRE_VERSION}};
    struct wire_hello hello;
    struct wire_worker w;
    char why[WIRE_TEXT_MAX];
    memcpy(f.text, "opening /tmp/caf\xe9: denied", 26);
    assert_int_equal(wire_decode_worker(&f, sizeof(f), 0, &w, why, sizeof(why)), -EIO);
    assert_string_equal(why, "opening /tmp/caf");
    assert_int_equal(wire_decode_hello(&f, sizeof(f), &hello, why, sizeof(why)), -EIO);
    assert_string_equal(why, "opening /tmp/caf");
    memcpy(f.text, "\xc3\xa9\xc3\xa9", 5);
    assert_int_equal(wire_decode_worker(&f, sizeof(f), 0, &w, why, 4), -EIO);
    assert_string_equal(why, "\xc3\xa9");
}

static void status_of_the_wrong_size_or_magic_is_refused(void **state)
{
    (void)state;
    struct wire_status st = {.magic = WIRE_STATUS_MAGIC, .wait_status = 9}, out;
    assert_int_equal(wire_decode_status(&st, sizeof(st), &out), 0);
    assert_int_equal(out.wait_status, 9);
    assert_int_equal(wire_decode_status(&st, sizeof(st) - 1, &out), -EPROTO);
    st.magic++;
    assert_int_equal(wire_decode_status(&st, sizeof(st), &out), -EPROTO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(worker_with_all_its_descriptors_is_taken),
        cmocka_unit_test(template_failure_text_is_kept_to_valid_utf8),
        cmocka_unit_test(status_of_the_wrong_size_or_magic_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
