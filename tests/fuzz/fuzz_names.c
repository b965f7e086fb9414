/* name_problem: the check on every input file name before it is written
 * beneath a workspace, and on every artifact name. An accepted name can
 * only ever name something beneath the directory it is opened in. */
#include "fuzz.h"
#include "util.h"

#include <jansson.h>

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
    free(name);
    return 0;
}
