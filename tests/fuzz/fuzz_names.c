/* name_problem: the check on every input file name before it is written
 * beneath a workspace, and on every artifact name. An accepted name can
 * only ever name something beneath the directory it is opened in. */
#define _GNU_SOURCE
#include "artifacts.h"
#include "fuzz.h"
#include "util.h"

#include <jansson.h>

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *name = fuzz_copy(data, size);
    const char *why = name_problem(name, size);
    /* jansson's own UTF-8 check, as a second opinion. */
    json_t *utf8 = json_stringn(name, size);

    if (why) {
        CHECK(why[0] != '\0');
    } else {
        CHECK(size > 0 && size <= 4096);
        CHECK(!memchr(name, '\0', size));
        CHECK(name[0] != '/');
        CHECK(utf8 != NULL);
        CHECK(utf8_valid_prefix((const unsigned char *)name, size) == size);
        /* Every component: not empty, not "." or "..", at most 255 bytes. */
        size_t start = 0;
        for (size_t i = 0; i <= size; i++) {
            if (i < size && name[i] != '/')
                continue;
            size_t n = i - start;
            CHECK(n > 0 && n <= 255);
            CHECK(!(n == 1 && name[start] == '.'));
            CHECK(!(n == 2 && name[start] == '.' && name[start + 1] == '.'));
            start = i + 1;
        }
    }
    /* The UTF-8 verdict is jansson's whenever the rest is fine. */
    if (why && strcmp(why, "the name is not valid UTF-8") == 0)
        CHECK(utf8 == NULL);
    json_decref(utf8);

    /* An artifact's name on disk (bytes up to a NUL) as the result gives
     * it: valid UTF-8 and, decoded, the same bytes, so that two names
     * never give one; unchanged exactly when it is UTF-8 without U+FFFD. */
    free(name);
    name = fuzz_string(data, size);
    size_t raw_len = strlen(name);
    char *shown = artifacts_escape_name(name);
    CHECK(shown != NULL);
    size_t n = strlen(shown), k = 0;
    CHECK(utf8_valid_prefix((const unsigned char *)shown, n) == n);
    char *back = malloc(n + 1);
    CHECK(back);
    for (size_t i = 0; i < n;) {
        if (i + 5 <= n && memcmp(shown + i, "\xef\xbf\xbd", 3) == 0) {
            unsigned v = 0;
            CHECK(isxdigit((unsigned char)shown[i + 3]) && isxdigit((unsigned char)shown[i + 4]) &&
                  sscanf(shown + i + 3, "%2x", &v) == 1);
            back[k++] = (char)v;
            i += 5;
        } else
            back[k++] = shown[i++];
    }
    CHECK(k == raw_len && memcmp(back, name, k) == 0);
    bool plain = utf8_valid_prefix((const unsigned char *)name, raw_len) == raw_len &&
                 !memmem(name, raw_len, "\xef\xbf\xbd", 3);
    CHECK(plain == (shown == name));
    free(back);
    if (shown != name)
        free(shown);
    free(name);
    return 0;
}
