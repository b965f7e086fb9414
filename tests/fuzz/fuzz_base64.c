/* base64_decode reads files_base64 of serve and batch requests; its
 * partner base64_encode writes artifacts. Decoding never reads past its
 * length, accepts exactly the alphabet (padding optional), and what it
 * accepts re-encodes to the input when the input is canonical. */
#include "fuzz.h"
#include "util.h"

#include <errno.h>

static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int value(char c)
{
    const char *p = c ? strchr(alphabet, c) : NULL;
    return p ? (int)(p - alphabet) : -1;
}

/* What the decoder must make of |text| by this independent reading:
 * whether it is base64, and if so whether it is canonical (its last
 * character carries no stray bits). */
static int expect(const char *text, size_t len, size_t *stripped, int *canonical)
{
    while (len > 0 && text[len - 1] == '=')
        len--;
    *stripped = len;
    if (len % 4 == 1)
        return -1;
    for (size_t i = 0; i < len; i++)
        if (value(text[i]) < 0)
            return -1;
    *canonical = 1;
    if (len % 4 == 2)
        *canonical = (value(text[len - 1]) & 15) == 0;
    else if (len % 4 == 3)
        *canonical = (value(text[len - 1]) & 3) == 0;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_copy(data, size);
    size_t out_len = 0, stripped = 0, enc_len = 0;
    int canonical = 0;
    int valid = expect(text, size, &stripped, &canonical) == 0;

    errno = 0;
    unsigned char *out = base64_decode(text, size, &out_len);
    CHECK((out != NULL) == valid);
    if (!out) {
        CHECK(errno == EINVAL);
    } else {
        CHECK(out_len == stripped / 4 * 3 + (stripped % 4 ? stripped % 4 - 1 : 0));
        char *enc = base64_encode(out, out_len, &enc_len);
        CHECK(enc && strlen(enc) == enc_len && enc_len % 4 == 0);
        /* The encoder pads; compare without the padding. */
        size_t e = enc_len;
        while (e > 0 && enc[e - 1] == '=')
            e--;
        CHECK(e == stripped);
        if (canonical)
            CHECK(memcmp(enc, text, stripped) == 0);
        size_t back_len = 0;
        unsigned char *back = base64_decode(enc, enc_len, &back_len);
        CHECK(back && back_len == out_len && memcmp(back, out, out_len) == 0);
        free(back);
        free(enc);
        free(out);
    }

    /* Any bytes survive the round trip. */
    char *enc = base64_encode(data, size, &enc_len);
    CHECK(enc && enc_len == 4 * ((size + 2) / 3));
    unsigned char *back = base64_decode(enc, enc_len, &out_len);
    CHECK(back && out_len == size && (size == 0 || memcmp(back, data, size) == 0));
    free(back);
    free(enc);
    free(text);
    return 0;
}
