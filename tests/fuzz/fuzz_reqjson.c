/* A line of `pysbx serve` or `pysbx batch`: json_request_parse, then the
 * answer the front end writes for it. An accepted request passes
 * sbx_request_check with its limits in range and its files named safely,
 * once each; a refused one says why with a stable code; and the error
 * answer is always one line of valid JSON that carries the request's id. */
#include "fuzz.h"
#include "reqjson.h"
#include "sbxerr.h"
#include "util.h"

#include <errno.h>
#include <math.h>

/* The answer is one line, reads back as the object it should be, and
 * carries the id exactly as the request wrote it. */
static json_t *check_answer(char *line, const char *id_text)
{
    CHECK(line != NULL);
    size_t n = strlen(line), idlen = strlen(id_text);
    CHECK(n > 1 && line[n - 1] == '\n' && !memchr(line, '\n', n - 1));
    /* Byte for byte, but for a carriage return between tokens (a space). */
    CHECK(n - 1 > 6 + idlen && strncmp(line, "{\"id\":", 6) == 0);
    for (size_t i = 0; i < idlen; i++)
        CHECK(line[6 + i] == id_text[i] ||
              ((id_text[i] == '\r' || id_text[i] == '\n') && line[6 + i] == ' '));
    CHECK(line[6 + idlen] == ',' || line[6 + idlen] == '}');
    json_error_t jerr;
    /* Integers past 2^63 are valid JSON that jansson reads only as reals
     * (the parser under test does the same, and echoes them as written). */
    json_t *id =
        json_loads(id_text, JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &jerr);
    if (!id) {
        /* Only a lone number past a double's range, which no jansson reads:
         * the rest of the answer is read with a 0 in its place. */
        CHECK(json_error_code(&jerr) == json_error_numeric_overflow && jerr.position == (int)idlen);
        memset(line + 6, ' ', idlen);
        line[6] = '0';
    }
    json_t *o = json_loadb(line, n - 1, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &jerr);
    CHECK(json_is_object(o));
    CHECK(!id || json_equal(json_object_get(o, "id"), id));
    json_decref(id);
    free(line);
    return o;
}

static void check_accepted(const struct json_request *r)
{
    const struct sbx_limits *l = &r->req.limits;
    struct sbx_error err = {0};

    CHECK(sbx_request_check(&r->req, &err) == 0);
    CHECK(r->req.code != NULL && r->req.code_len <= SBX_MAX_CODE_BYTES);
    CHECK(isfinite(l->wall_seconds) && l->wall_seconds > 0 && l->wall_seconds <= SBX_MAX_SECONDS);
    CHECK(isfinite(l->cpu_seconds) && l->cpu_seconds > 0 && l->cpu_seconds <= SBX_MAX_SECONDS);
    CHECK(l->memory_bytes >= SBX_MIN_MEMORY_BYTES && l->memory_bytes <= SBX_MAX_MEMORY_BYTES);
    CHECK(l->max_output_chars <= SBX_MAX_OUTPUT_CHARS_LIMIT);
    CHECK(l->max_artifact_bytes <= SBX_MAX_ARTIFACT_BYTES_LIMIT);
    CHECK(l->max_artifacts <= SBX_MAX_ARTIFACTS_LIMIT);
    CHECK(r->req.files == r->files && r->req.n_files == r->n_files);
    for (size_t i = 0; i < r->n_files; i++) {
        const char *name = r->files[i].name;
        CHECK(name && !name_problem(name, strlen(name)));
        for (size_t k = 0; k < i; k++)
            CHECK(strcmp(r->files[k].name, name) != 0);
        CHECK(r->files[i].data || r->files[i].len == 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_copy(data, size);
    struct json_request r;
    struct sbx_error err = {0};
    struct sbx_limits ceil;
    json_ceilings_init(&ceil);
    ceil.wall_seconds = 30; /* a server's ceiling: nothing accepted above it */
    int rc = json_request_parse(text, size, &ceil, &r, &err);

    /* No id (not an object, or none in it): answered with a null id. */
    const char *id_text = r.id_text ? r.id_text : "null";
    if (rc == 0 && r.cancel_text) {
        /* A cancel message names an id as written; a refusal of it says so. */
        sbx_fail(&err, SBX_ERR_INVALID_REQUEST, -EINVAL, "no request with that id in flight");
        json_t *answer = check_answer(json_answer_cancel_error(r.cancel_text, &err), "null");
        json_decref(answer);
        json_request_free(&r);
        free(text);
        return 0;
    }
    if (rc == 0 && r.session_close) {
        /* A session_close message: a name; answered by name, or refused. */
        CHECK(*r.session_close && strlen(r.session_close) <= SESSION_NAME_MAX);
        json_t *answer =
            check_answer(json_answer_session_closed(r.id_text, r.session_close), id_text);
        CHECK(strcmp(json_string_value(json_object_get(answer, "session_closed")),
                     r.session_close) == 0);
        json_decref(answer);
        sbx_fail(&err, SBX_ERR_INVALID_REQUEST, -ENOENT, "no open session is called \"%s\"",
                 r.session_close);
    } else if (rc == 0 && r.session_hibernate) {
        /* A session_hibernate message: a name; answered by name, or refused. */
        CHECK(*r.session_hibernate && strlen(r.session_hibernate) <= SESSION_NAME_MAX);
        json_t *answer = check_answer(
            json_answer_session_hibernated(r.id_text, r.session_hibernate, 8 << 20), id_text);
        json_t *done = json_object_get(answer, "session_hibernated");
        CHECK(strcmp(json_string_value(json_object_get(done, "name")), r.session_hibernate) == 0);
        CHECK(json_number_value(json_object_get(done, "bytes")) == (double)(8 << 20));
        json_decref(answer);
        sbx_fail(&err, SBX_ERR_INVALID_REQUEST, -ENOENT, "no open session is called \"%s\"",
                 r.session_hibernate);
    } else if (rc == 0 && r.fork_from) {
        /* A session_fork message: two names, never one; answered by both. */
        CHECK(r.fork_to && *r.fork_from && *r.fork_to && strcmp(r.fork_from, r.fork_to) != 0);
        CHECK(strlen(r.fork_from) <= SESSION_NAME_MAX && strlen(r.fork_to) <= SESSION_NAME_MAX);
        json_t *answer =
            check_answer(json_answer_session_forked(r.id_text, r.fork_from, r.fork_to, 3), id_text);
        json_t *done = json_object_get(answer, "session_forked");
        CHECK(strcmp(json_string_value(json_object_get(done, "from")), r.fork_from) == 0);
        CHECK(strcmp(json_string_value(json_object_get(done, "to")), r.fork_to) == 0);
        json_decref(answer);
        sbx_fail(&err, SBX_ERR_INVALID_REQUEST, -ENOENT, "no open session is called \"%s\"",
                 r.fork_from);
    } else if (rc == 0 && r.is_tool_result) {
        /* A tool_result message: a call number and its content or its
         * error, one of the two; a refusal names the call, not the id's
         * request (its "id" is null). */
        CHECK(r.result_call >= 1 && !r.result_content != !r.result_error);
        sbx_fail(&err, SBX_ERR_INVALID_REQUEST, -ENOENT, "no call %llu is waiting",
                 (unsigned long long)r.result_call);
        json_t *answer =
            check_answer(json_answer_tool_result_error(r.id_text, r.result_call, &err), "null");
        json_t *which = json_object_get(answer, "tool_result");
        CHECK(json_number_value(json_object_get(which, "call")) == (double)r.result_call);
        json_decref(answer);
    } else if (rc == 0) {
        CHECK(r.req.limits.wall_seconds <= 30);
        CHECK(!r.session || (*r.session && strlen(r.session) <= SESSION_NAME_MAX));
        CHECK((unsigned)r.rollback <= SBX_ROLLBACK_NEVER && (r.session || !r.rollback));
        check_accepted(&r);
        /* Refused by the backend after all: the answer still carries the
         * id, and a message with the request's own text in it. */
        sbx_fail(&err, SBX_ERR_BUSY, -EBUSY, "busy with %.*s", (int)r.req.code_len, r.req.code);
    } else {
        CHECK(rc == -EINVAL || rc == -E2BIG || rc == -ENOMEM);
        CHECK(err.code != SBX_ERR_NONE && err.message[0] != '\0');
        CHECK(memchr(err.message, '\0', sizeof(err.message)));
    }
    json_t *answer = check_answer(json_answer_error(r.id_text, &err), id_text);
    json_t *e = json_object_get(answer, "error");
    CHECK(json_is_string(json_object_get(e, "code")));
    CHECK(strcmp(json_string_value(json_object_get(e, "code")), sbx_error_code_name(err.code)) ==
          0);
    CHECK(json_is_string(json_object_get(e, "message")));
    CHECK(strcmp(json_string_value(json_object_get(e, "message")), err.message) == 0);
    json_decref(answer);
    json_request_free(&r);
    free(text);
    return 0;
}
