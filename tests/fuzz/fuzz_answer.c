/* json_answer_result: the answer line of serve and batch, and the result's
 * JSON, for any result the library can hand back (its text fields valid
 * UTF-8 as documented; output, artifact bytes and the caller's id anything);
 * or json_answer_session, the answer to a session's cell, with a session
 * name as json_session_name lets through. The answer is always one line of
 * valid JSON that reads back to the same id, status, output and artifact
 * bytes (and session). */
#include "fuzz.h"
#include "reqjson.h"
#include "util.h"

#include <stdbool.h>

struct bytes {
    const uint8_t *p;
    size_t n;
};

static uint32_t take_u32(struct bytes *b)
{
    uint32_t v = 0;
    for (int i = 0; i < 4 && b->n; i++, b->p++, b->n--)
        v = v << 8 | *b->p;
    return v;
}

/* A piece of the input: its length comes first. */
static size_t take_piece(struct bytes *b, const uint8_t **out)
{
    size_t len = take_u32(b) % 2048;
    if (len > b->n)
        len = b->n;
    *out = b->p;
    b->p += len;
    b->n -= len;
    return len;
}

/* Text as the library makes it: the valid UTF-8 prefix, NUL-terminated,
 * without NUL bytes when |c_string|. */
static char *take_text(struct bytes *b, size_t *len, bool c_string)
{
    const uint8_t *p;
    size_t n = take_piece(b, &p);
    n = utf8_valid_prefix(p, n);
    if (c_string && memchr(p, '\0', n))
        n = (size_t)((const uint8_t *)memchr(p, '\0', n) - p);
    char *s = fuzz_string(p, n);
    if (len)
        *len = n;
    return s;
}

/* An artifact's name on disk: |name| itself, or any bytes but NUL. */
static char *raw_name(struct bytes *b, char *name, bool own)
{
    if (!own)
        return name;
    const uint8_t *p;
    size_t n = take_piece(b, &p);
    if (memchr(p, '\0', n))
        n = (size_t)((const uint8_t *)memchr(p, '\0', n) - p);
    return fuzz_string(p, n);
}

/* The bytes a name_base64 spells are the raw name, when there is one. */
static void check_raw_name(json_t *o, const char *name, const char *raw)
{
    json_t *b64 = json_object_get(o, "name_base64");
    if (!b64) {
        CHECK(raw == name || strcmp(raw, name) == 0);
        return;
    }
    size_t len = 0;
    unsigned char *bytes = base64_decode(json_string_value(b64), json_string_length(b64), &len);
    CHECK(bytes && len == strlen(raw) && memcmp(bytes, raw, len) == 0);
    free(bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct bytes b = {data, size};
    struct sbx_result *r = calloc(1, sizeof(*r));
    json_error_t jerr;

    CHECK(r);
    uint32_t bits = take_u32(&b);
    r->status = (enum sbx_status)(bits % 8); /* a caller's cast may be out of range */
    r->limit = (enum sbx_limit_kind)(bits / 8 % 6);
    r->stdout_truncated = bits & (1u << 8);
    r->stderr_truncated = bits & (1u << 9);
    r->partial = bits & (1u << 10);
    r->exit_code = (int)take_u32(&b);
    r->signal = (int)take_u32(&b);
    r->wall_ms = take_u32(&b) / 8.0;
    r->cpu_ms = take_u32(&b) / 1024.0;
    r->max_rss_kb = (long)take_u32(&b);
    r->artifacts_dropped = take_u32(&b);
    r->stdout_text = take_text(&b, &r->stdout_len, false);
    r->stderr_text = take_text(&b, &r->stderr_len, false);
    if (bits & (1u << 11))
        r->reason = take_text(&b, NULL, true);
    r->n_artifacts = bits >> 12 & 3;
    r->artifacts = calloc(r->n_artifacts + 1, sizeof(*r->artifacts));
    CHECK(r->artifacts);
    for (size_t i = 0; i < r->n_artifacts; i++) {
        struct sbx_artifact *a = &r->artifacts[i];
        const uint8_t *p;
        a->name = take_text(&b, NULL, true);
        a->data_len = take_piece(&b, &p);
        a->data = (unsigned char *)fuzz_copy(p, a->data_len);
        a->size = a->data_len + (bits >> 14 & 1);
        a->truncated = a->size > a->data_len;
        a->raw_name = raw_name(&b, a->name, bits & (1u << 17));
    }
    /* Files not returned: any reason a caller's cast may give. */
    r->n_dropped = bits >> 18 & 3;
    r->dropped = calloc(r->n_dropped + 1, sizeof(*r->dropped));
    CHECK(r->dropped);
    for (size_t i = 0; i < r->n_dropped; i++) {
        struct sbx_dropped_artifact *d = &r->dropped[i];
        d->name = take_text(&b, NULL, true);
        d->raw_name = raw_name(&b, d->name, bits & (1u << 20));
        d->reason = (enum sbx_drop_reason)(take_u32(&b) % 8);
        d->size = take_u32(&b);
    }
    /* A session's cell: a name of 1 to SESSION_NAME_MAX bytes, no NUL. */
    char *session = NULL;
    if (bits & (1u << 15)) {
        r->cell = take_u32(&b);
        r->rolled_back = bits & (1u << 16);
        session = take_text(&b, NULL, true);
        if (!*session || strlen(session) > SESSION_NAME_MAX) {
            free(session);
            session = NULL;
        }
    }
    /* The caller's id: any JSON value the rest of the input spells. */
    json_t *id = json_loadb((const char *)b.p, b.n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
    char *id_text = id ? json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;

    bool restored = bits & (1u << 21);
    char *line = session ? json_answer_session(id_text, r, session, restored)
                         : json_answer_result(id_text, r);
    CHECK(line != NULL);
    size_t n = strlen(line);
    CHECK(n > 1 && line[n - 1] == '\n' && !memchr(line, '\n', n - 1));
    json_t *o = json_loadb(line, n - 1, JSON_ALLOW_NUL, &jerr);
    CHECK(json_is_object(o));
    CHECK(json_equal(json_object_get(o, "id"), id ? id : json_null()));
    json_t *sess = json_object_get(o, "session");
    CHECK(!session == !sess);
    if (session) {
        json_t *want = json_pack("{s:s, s:I, s:b}", "name", session, "cell", (json_int_t)r->cell,
                                 "rolled_back", r->rolled_back);
        if (restored)
            json_object_set_new(want, "restored", json_true());
        CHECK(json_equal(sess, want));
        json_decref(want);
    }
    CHECK(strcmp(json_string_value(json_object_get(o, "status")), sbx_status_name(r->status)) == 0);
    json_t *out = json_object_get(o, "stdout");
    CHECK(json_string_length(out) == r->stdout_len &&
          memcmp(json_string_value(out), r->stdout_text, r->stdout_len) == 0);
    json_t *err = json_object_get(o, "stderr");
    CHECK(json_string_length(err) == r->stderr_len &&
          memcmp(json_string_value(err), r->stderr_text, r->stderr_len) == 0);
    json_t *reason = json_object_get(o, "reason");
    CHECK(r->reason ? strcmp(json_string_value(reason), r->reason) == 0 : json_is_null(reason));
    json_t *arts = json_object_get(o, "artifacts");
    CHECK(json_array_size(arts) == r->n_artifacts);
    for (size_t i = 0; i < r->n_artifacts; i++) {
        json_t *a = json_array_get(arts, i);
        json_t *c = json_object_get(a, "content_base64");
        size_t len = 0;
        unsigned char *bytes = base64_decode(json_string_value(c), json_string_length(c), &len);
        CHECK(strcmp(json_string_value(json_object_get(a, "name")), r->artifacts[i].name) == 0);
        CHECK(bytes && len == r->artifacts[i].data_len &&
              (len == 0 || memcmp(bytes, r->artifacts[i].data, len) == 0));
        free(bytes);
        check_raw_name(a, r->artifacts[i].name, r->artifacts[i].raw_name);
    }
    json_t *gone = json_object_get(o, "dropped_artifacts");
    CHECK(json_array_size(gone) == r->n_dropped);
    for (size_t i = 0; i < r->n_dropped; i++) {
        json_t *d = json_array_get(gone, i);
        const char *why = sbx_drop_reason_name(r->dropped[i].reason);
        CHECK(strcmp(json_string_value(json_object_get(d, "name")), r->dropped[i].name) == 0);
        CHECK(strcmp(json_string_value(json_object_get(d, "reason")), why ? why : "unreadable") ==
              0);
        check_raw_name(d, r->dropped[i].name, r->dropped[i].raw_name);
    }
    json_decref(o);
    free(line);
    free(session);
    free(id_text);
    json_decref(id);
    sbx_result_free(r);
    return 0;
}
