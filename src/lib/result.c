/* The result: its JSON form, the names of its codes, freeing it. */
#include "artifacts.h"
#include "pysbx.h"
#include "util.h"

#include <jansson.h>

#include <stdlib.h>
#include <string.h>

static const char *const status_names[] = {
    [SBX_COMPLETED] = "completed",       [SBX_TIMEOUT] = "timeout",
    [SBX_MEMORY_LIMIT] = "memory_limit", [SBX_CRASHED] = "crashed",
    [SBX_CANCELLED] = "cancelled",       [SBX_SANDBOX_ERROR] = "sandbox_error",
};

static const char *const limit_names[] = {
    [SBX_LIMIT_NONE] = NULL,
    [SBX_LIMIT_WALL] = "wall",
    [SBX_LIMIT_CPU] = "cpu",
    [SBX_LIMIT_MEMORY] = "memory",
};

static const char *const error_code_names[] = {
    [SBX_ERR_NONE] = "none",
    [SBX_ERR_INVALID_REQUEST] = "invalid_request",
    [SBX_ERR_INVALID_LIMIT] = "invalid_limit",
    [SBX_ERR_INVALID_FILE] = "invalid_file",
    [SBX_ERR_TOO_LARGE] = "request_too_large",
    [SBX_ERR_UNAVAILABLE] = "sandbox_unavailable",
    [SBX_ERR_BUSY] = "sandbox_busy",
    [SBX_ERR_SESSION_LOST] = "session_lost",
};

/* An out-of-range value (a caller's cast) gets |fallback|. */
#define NAME_OF(table, i, fallback) ((unsigned)(i) < ARRAY_SIZE(table) ? (table)[i] : (fallback))

const char *sbx_status_name(enum sbx_status s)
{
    return NAME_OF(status_names, s, "sandbox_error");
}

const char *sbx_limit_name(enum sbx_limit_kind l)
{
    return NAME_OF(limit_names, l, NULL);
}

const char *sbx_error_code_name(enum sbx_error_code c)
{
    return NAME_OF(error_code_names, c, "invalid_request");
}

static json_t *string_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

static json_t *artifact_json(const struct sbx_artifact *a)
{
    char *b64 = base64_encode(a->data ? a->data : (const unsigned char *)"", a->data_len, NULL);
    json_t *o =
        b64 ? json_pack("{s:s, s:I, s:b, s:s}", "name", a->name, "size", (json_int_t)a->size,
                        "truncated", a->truncated, "content_base64", b64)
            : NULL;
    free(b64);
    return o;
}

static json_t *result_json(const struct sbx_result *r)
{
    json_t *arts = json_array();
    json_t *o = NULL;

    for (size_t i = 0; arts && i < r->n_artifacts; i++)
        if (json_array_append_new(arts, artifact_json(&r->artifacts[i])) < 0) {
            json_decref(arts);
            return NULL;
        }
    if (!arts)
        return NULL;
    const char *sig = r->status == SBX_CRASHED ? signal_name(r->signal) : NULL;
    char sigbuf[32];
    if (r->status == SBX_CRASHED && !sig) {
        fmt(sigbuf, sizeof(sigbuf), "SIG%d", r->signal);
        sig = sigbuf;
    }
    o = json_pack(
        "{s:s, s:o, s:o, s:o, s:s%, s:s%, s:b, s:b, s:b, s:o, s:I, s:{s:f, s:f, s:I}, "
        "s:o}",
        "status", sbx_status_name(r->status), "limit", string_or_null(sbx_limit_name(r->limit)),
        "exit_code", r->status == SBX_COMPLETED ? json_integer(r->exit_code) : json_null(),
        "signal", string_or_null(sig), "stdout", r->stdout_text ? r->stdout_text : "",
        r->stdout_len, "stderr", r->stderr_text ? r->stderr_text : "", r->stderr_len,
        "stdout_truncated", r->stdout_truncated, "stderr_truncated", r->stderr_truncated, "partial",
        r->partial, "artifacts", arts, "artifacts_dropped", (json_int_t)r->artifacts_dropped,
        "stats", "wall_ms", r->wall_ms, "cpu_ms", r->cpu_ms, "max_rss_kb",
        (json_int_t)r->max_rss_kb, "reason", string_or_null(r->reason));
    json_t *value = r->value ? json_stringn(r->value, r->value_len) : json_null();
    json_t *error = r->error_type ? json_pack("{s:s, s:s, s:s}", "type", r->error_type, "message",
                                              r->error_message, "traceback", r->error_traceback)
                                  : json_null();
    if (o && (json_object_set_new(o, "value", value) < 0 ||
              json_object_set_new(o, "error", error) < 0)) {
        json_decref(o);
        o = NULL;
    }
    return o;
}

char *sbx_result_to_json(const struct sbx_result *res)
{
    json_t *o = result_json(res);
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10)) : NULL;

    json_decref(o);
    return s;
}

void sbx_result_free(struct sbx_result *res)
{
    if (!res)
        return;
    free(res->stdout_text);
    free(res->stderr_text);
    free(res->reason);
    free(res->value);
    free(res->error_type);
    free(res->error_message);
    free(res->error_traceback);
    artifacts_free(res->artifacts, res->n_artifacts);
    free(res);
}
