/* Bounded, character-counted output capture. */
#include "helpers.h"

#include "outbuf.h"

#include <stdlib.h>
#include <string.h>

static char *capture(uint64_t max, const char *const *chunks, size_t n, size_t *len, bool *cut)
{
    struct outbuf ob;
    outbuf_init(&ob, max);
    for (size_t i = 0; i < n; i++)
        outbuf_feed(&ob, chunks[i], strlen(chunks[i]));
    char *s = outbuf_finish(&ob, len, cut);
    assert_non_null(s);
    return s;
}

static void short_output_is_kept_whole(void **state)
{
    (void)state;
    const char *in[] = {"hello\n"};
    size_t len;
    bool cut;
    char *s = capture(100, in, 1, &len, &cut);
    assert_string_equal(s, "hello\n");
    assert_false(cut);
    free(s);
}

static void output_over_limit_is_cut_and_says_so(void **state)
{
    (void)state;
    const char *in[] = {"abcdefghij", "klmnop"};
    size_t len;
    bool cut;
    char *s = capture(12, in, 2, &len, &cut);
    assert_true(cut);
    assert_string_equal(s, "abcdefghijkl\n[pysbx: output cut, 4 more characters]\n");
    free(s);
}

static void limit_counts_characters_not_bytes(void **state)
{
    (void)state;
    /* Three two-byte and one four-byte character, split across chunks in the
     * middle of a sequence. */
    const char *in[] = {"\xc3\xa9\xc3", "\xa9\xf0\x9f", "\x98\x80\xc3\xa9"};
    size_t len;
    bool cut;
    char *s = capture(3, in, 3, &len, &cut);
    assert_true(cut);
    assert_memory_equal(
        s, "\xc3\xa9\xc3\xa9\xf0\x9f\x98\x80\n[pysbx: output cut, 1 more characters]\n", len);
    free(s);
}

static void invalid_bytes_become_replacement_characters(void **state)
{
    (void)state;
    const char *in[] = {"a\xff"
                        "b\xc3("
                        "\xe2\x82"};
    size_t len;
    bool cut;
    char *s = capture(100, in, 1, &len, &cut);
    /* 0xff alone, 0xc3 cut short by '(', and a dangling 0xe2 0x82 at the end
     * each become one U+FFFD. */
    assert_string_equal(s, "a\xef\xbf\xbd"
                           "b\xef\xbf\xbd(\xef\xbf\xbd");
    assert_false(cut);
    free(s);
}

static void zero_limit_keeps_nothing(void **state)
{
    (void)state;
    const char *in[] = {"xyz"};
    size_t len;
    bool cut;
    char *s = capture(0, in, 1, &len, &cut);
    assert_string_equal(s, "[pysbx: output cut, 3 more characters]\n");
    free(s);
}

static void flood_does_not_grow_memory(void **state)
{
    (void)state;
    struct outbuf ob;
    static char chunk[65536];
    memset(chunk, 'x', sizeof(chunk));
    outbuf_init(&ob, 1000);
    for (int i = 0; i < 2000; i++) /* 128 MiB */
        outbuf_feed(&ob, chunk, sizeof(chunk));
    assert_true(ob.cap <= 2048);
    assert_int_equal(ob.cut_chars, 2000ULL * 65536 - 1000);
    outbuf_free(&ob);
}

static void nul_characters_are_kept(void **state)
{
    (void)state;
    struct outbuf ob;
    size_t len;
    bool cut;
    outbuf_init(&ob, 10);
    outbuf_feed(&ob, "a\0b", 3);
    char *s = outbuf_finish(&ob, &len, &cut);
    assert_int_equal(len, 3);
    assert_memory_equal(s, "a\0b", 3);
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(short_output_is_kept_whole),
        cmocka_unit_test(output_over_limit_is_cut_and_says_so),
        cmocka_unit_test(limit_counts_characters_not_bytes),
        cmocka_unit_test(invalid_bytes_become_replacement_characters),
        cmocka_unit_test(zero_limit_keeps_nothing),
        cmocka_unit_test(flood_does_not_grow_memory),
        cmocka_unit_test(nul_characters_are_kept),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
