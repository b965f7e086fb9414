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

static const char *const drop_reason_names[] = {
    [0] = NULL,
    [SBX_DROP_MAX_ARTIFACTS] = "max_artifacts",
    [SBX_DROP_MAX_TOTAL_BYTES] = "max_artifacts_total_bytes",
    [SBX_DROP_TOO_DEEP] = "too_deep",
    [SBX_DROP_UNREADABLE] = "unreadable",
    [SBX_DROP_LINKED] = "linked",
};

const char *sbx_drop_reason_name(enum sbx_drop_reason r)
{
    return NAME_OF(drop_reason_names, r, NULL);
}

/* Adds "name_base64", the name's bytes, to |o| when its name was escaped
 * (see struct sbx_artifact). Returns |o|, or NULL (and |o| released). */
static json_t *with_raw_name(json_t *o, const char *name, const char *raw)
{
    if (!o || !raw || raw == name || strcmp(raw, name) == 0)
        return o;
    char *b64 = base64_encode(raw, strlen(raw), NULL);
    if (!b64 || json_object_set_new(o, "name_base64", json_string(b64)) < 0) {
        json_decref(o);
        o = NULL;
    }
    free(b64);
    return o;
}

static json_t *artifact_json(const void *p)
{
    const struct sbx_artifact *a = p;
    char *b64 = base64_encode(a->data ? a->data : (const unsigned char *)"", a->data_len, NULL);
    json_t *o =
        b64 ? json_pack("{s:s, s:I, s:b, s:s}", "name", a->name, "size", (json_int_t)a->size,
                        "truncated", a->truncated, "content_base64", b64)
            : NULL;
    free(b64);
    return with_raw_name(o, a->name, a->raw_name);
}

static json_t *dropped_json(const void *p)
{
    const struct sbx_dropped_artifact *d = p;
    const char *why = sbx_drop_reason_name(d->reason);
    json_t *o = json_pack("{s:s, s:s}", "name", d->name, "reason", why ? why : "unreadable");
    size_t len = strlen(d->name);

    /* A file's size; a directory (its name ends with '/') has none. */
    if (o && !(len && d->name[len - 1] == '/') &&
        json_object_set_new(o, "size", json_integer((json_int_t)d->size)) < 0) {
        json_decref(o);
        o = NULL;
    }
    return with_raw_name(o, d->name, d->raw_name);
}

/* A JSON array of |n| elements of |size| bytes at |v|, each one(element);
 * NULL if out of memory. */
static json_t *json_list(const void *v, size_t n, size_t size, json_t *(*one)(const void *))
{
    json_t *list = json_array();

    for (size_t i = 0; list && i < n; i++)
        if (json_array_append_new(list, one((const char *)v + i * size)) < 0) {
            json_decref(list);
            list = NULL;
        }
    return list;
}

static json_t *result_json(const struct sbx_result *r)
{
    json_t *arts = json_list(r->artifacts, r->n_artifacts, sizeof(*r->artifacts), artifact_json);
    json_t *o = NULL;

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
    json_t *gone = json_list(r->dropped, r->n_dropped, sizeof(*r->dropped), dropped_json);
    if (!o) {
        json_decref(value);
        json_decref(error);
        json_decref(gone);
        return NULL;
    }
    /* Each takes its value, set or not (NULL, out of memory: not set). */
    bool bad = json_object_set_new(o, "value", value) < 0;
    bad |= json_object_set_new(o, "error", error) < 0;
    bad |= json_object_set_new(o, "dropped_artifacts", gone) < 0;
    if (bad) {
        json_decref(o);
        return NULL;
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
    dropped_free(res->dropped, res->n_dropped);
    free(res);
}
