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

/* The answer is one line, and reads back as the object it should be. */
static json_t *check_answer(char *line, json_t *id)
{
    CHECK(line != NULL);
    size_t n = strlen(line);
    CHECK(n > 1 && line[n - 1] == '\n' && !memchr(line, '\n', n - 1));
    json_error_t jerr;
    json_t *o = json_loadb(line, n - 1, JSON_ALLOW_NUL, &jerr);
    CHECK(json_is_object(o));
    CHECK(json_equal(json_object_get(o, "id"), id ? id : json_null()));
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
    int rc = json_request_parse(text, size, &r, &err);

    CHECK(r.id != NULL);
    if (rc == 0) {
        check_accepted(&r);
        /* Refused by the backend after all: the answer still carries the
         * id, and a message with the request's own text in it. */
        sbx_fail(&err, SBX_ERR_BUSY, -EBUSY, "busy with %.*s", (int)r.req.code_len, r.req.code);
    } else {
        CHECK(rc == -EINVAL || rc == -E2BIG || rc == -ENOMEM);
        CHECK(err.code != SBX_ERR_NONE && err.message[0] != '\0');
        CHECK(memchr(err.message, '\0', sizeof(err.message)));
    }
    json_t *answer = check_answer(json_answer_error(r.id, &err), r.id);
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
