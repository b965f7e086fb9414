/* The result: its JSON form, the names of its codes, freeing it. */
#include "artifacts.h"
#include "pysbx.h"
#include "util.h"

#include <jansson.h>

#include <stdlib.h>
#include <string.h>

const char *sbx_status_name(enum sbx_status s)
{
    switch (s) {
    case SBX_COMPLETED:
        return "completed";
    case SBX_TIMEOUT:
        return "timeout";
    case SBX_MEMORY_LIMIT:
        return "memory_limit";
    case SBX_CRASHED:
        return "crashed";
    case SBX_CANCELLED:
        return "cancelled";
    case SBX_SANDBOX_ERROR:
        return "sandbox_error";
    }
    return "sandbox_error";
}

const char *sbx_limit_name(enum sbx_limit_kind l)
{
    switch (l) {
    case SBX_LIMIT_WALL:
        return "wall";
    case SBX_LIMIT_CPU:
        return "cpu";
    case SBX_LIMIT_MEMORY:
        return "memory";
    case SBX_LIMIT_NONE:
        break;
    }
    return NULL;
}

const char *sbx_error_code_name(enum sbx_error_code c)
{
    switch (c) {
    case SBX_ERR_NONE:
        return "none";
    case SBX_ERR_INVALID_REQUEST:
        return "invalid_request";
    case SBX_ERR_INVALID_LIMIT:
        return "invalid_limit";
    case SBX_ERR_INVALID_FILE:
        return "invalid_file";
    case SBX_ERR_TOO_LARGE:
        return "request_too_large";
    case SBX_ERR_UNAVAILABLE:
        return "sandbox_unavailable";
    case SBX_ERR_BUSY:
        return "sandbox_busy";
    }
    return "invalid_request";
}

static json_t *string_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

static json_t *artifact_json(const struct sbx_artifact *a)
{
    char *b64 = base64_encode(a->data ? a->data : (const unsigned char *)"", a->data_len, NULL);
    json_t *o = b64 ? json_pack("{s:s, s:I, s:b, s:s}", "name", a->name, "size",
                                (json_int_t)a->size, "truncated", a->truncated,
                                "content_base64", b64)
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
    o = json_pack("{s:s, s:o, s:o, s:o, s:s%, s:s%, s:b, s:b, s:b, s:o, s:I, s:{s:f, s:f, s:I}, "
                  "s:o}",
                  "status", sbx_status_name(r->status),
                  "limit", string_or_null(sbx_limit_name(r->limit)),
                  "exit_code", r->status == SBX_COMPLETED ? json_integer(r->exit_code) : json_null(),
                  "signal", string_or_null(sig),
                  "stdout", r->stdout_text ? r->stdout_text : "", r->stdout_len,
                  "stderr", r->stderr_text ? r->stderr_text : "", r->stderr_len,
                  "stdout_truncated", r->stdout_truncated,
                  "stderr_truncated", r->stderr_truncated,
                  "partial", r->partial,
                  "artifacts", arts,
                  "artifacts_dropped", (json_int_t)r->artifacts_dropped,
                  "stats", "wall_ms", r->wall_ms, "cpu_ms", r->cpu_ms,
                  "max_rss_kb", (json_int_t)r->max_rss_kb,
                  "reason", string_or_null(r->reason));
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
    artifacts_free(res->artifacts, res->n_artifacts);
    free(res);
}
