/* parse_size, parse_seconds and parse_u64 read limits from the command line
 * and from requests ("memory_bytes": "256M"). What they accept is exactly
 * their grammar, with the value it spells, and nothing that overflows. */
#include "fuzz.h"
#include "util.h"

#include <math.h>

/* The grammar of parse_size read independently: digits, then optionally
 * one of KMGT (either case), an optional 'i', an optional 'B'. Returns the
 * power of 1024 (0 without a unit), or -1 when |s| is not of the grammar. */
static int size_grammar(const char *s, size_t *ndigits)
{
    size_t i = 0;
    int power = 0;

    while (s[i] >= '0' && s[i] <= '9')
        i++;
    *ndigits = i;
    if (i == 0)
        return -1;
    if (s[i] == '\0')
        return 0;
    const char *u = strchr("KMGT", s[i] >= 'a' && s[i] <= 'z' ? s[i] - 'a' + 'A' : s[i]);
    if (!u || !*u)
        return -1;
    power = (int)(u - "KMGT") + 1;
    i++;
    if (s[i] == 'i')
        i++;
    if (s[i] == 'B')
        i++;
    return s[i] == '\0' ? power : -1;
}

static void check_size(const char *s)
{
    uint64_t v = 0;
    size_t ndigits = 0;
    int power = size_grammar(s, &ndigits);
    int rc = parse_size(s, &v);

    if (power < 0) {
        CHECK(rc < 0);
        return;
    }
    /* The number it spells, exactly, as far as 128 bits go. */
    unsigned __int128 want = 0;
    int big = 0;
    for (size_t i = 0; i < ndigits && !big; i++) {
        want = want * 10 + (unsigned)(s[i] - '0');
        big = want > UINT64_MAX;
    }
    for (int p = 0; p < power && !big; p++) {
        want <<= 10;
        big = want > UINT64_MAX;
    }
    if (rc == 0)
        CHECK(!big && v == (uint64_t)want);
    else
        /* It may refuse a little short of the top, never a small size. */
        CHECK(big || want > UINT64_MAX / 10);
}

static void check_seconds(const char *s)
{
    double v = 0;

    if (parse_seconds(s, &v) == 0) {
        CHECK(isfinite(v) && v > 0);
        /* Decimal, maybe with an exponent: no hex, inf, nan or spaces. */
        CHECK(s[0] && strspn(s, "0123456789.eE+-") == strlen(s));
        CHECK(v == strtod(s, NULL));
    }
}

static void check_u64(const char *s)
{
    uint64_t v = 0;

    if (parse_u64(s, &v) == 0) {
        CHECK(s[0] && strspn(s, "0123456789") == strlen(s));
        unsigned __int128 want = 0;
        for (const char *p = s; *p; p++) {
            want = want * 10 + (unsigned)(*p - '0');
            CHECK(want <= UINT64_MAX);
        }
        CHECK(v == (uint64_t)want);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = fuzz_string(data, size);

    check_size(s);
    check_seconds(s);
    check_u64(s);
    free(s);
    return 0;
}
