#define _GNU_SOURCE
#include "reqjson.h"

#include "sbxerr.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int number(json_t *v, const char *name, double *out, struct sbx_error *err)
{
    if (!json_is_number(v))
        return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL, "limit %s must be a number", name);
    *out = json_number_value(v);
    return 0;
}

static int count(json_t *v, const char *name, uint64_t *out, struct sbx_error *err)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL,
                        "limit %s must be a whole number, 0 or more", name);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int parse_limits(json_t *l, struct sbx_limits *out, struct sbx_error *err)
{
    const char *k;
    json_t *v;
    int rc = 0;

    if (!json_is_object(l))
        return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL, "limits must be an object");
    json_object_foreach(l, k, v)
    {
        if (strcmp(k, "wall_seconds") == 0)
            rc = number(v, k, &out->wall_seconds, err);
        else if (strcmp(k, "cpu_seconds") == 0)
            rc = number(v, k, &out->cpu_seconds, err);
        else if (strcmp(k, "memory_bytes") == 0) {
            /* bytes, or a size such as "256M" */
            if (json_is_string(v) && parse_size(json_string_value(v), &out->memory_bytes) == 0)
                rc = 0;
            else
                rc = count(v, k, &out->memory_bytes, err);
        } else if (strcmp(k, "max_output_chars") == 0)
            rc = count(v, k, &out->max_output_chars, err);
        else if (strcmp(k, "max_artifact_bytes") == 0)
            rc = count(v, k, &out->max_artifact_bytes, err);
        else if (strcmp(k, "max_artifacts") == 0)
            rc = count(v, k, &out->max_artifacts, err);
        else
            rc = sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL, "unknown limit '%s'", k);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Appends the files of |o| (name -> text, or name -> base64). */
static int parse_files(json_t *o, bool b64, struct json_request *r, struct sbx_error *err)
{
    const char *name;
    json_t *v;

    if (!o)
        return 0;
    if (!json_is_object(o))
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "%s must be an object of name: content", b64 ? "files_base64" : "files");
    json_object_foreach(o, name, v)
    {
        if (!json_is_string(v))
            return sbx_fail(err, SBX_ERR_INVALID_FILE, -EINVAL, "file %s: content must be a string",
                            name);
        for (size_t i = 0; i < r->n_files; i++)
            if (strcmp(r->files[i].name, name) == 0)
                return sbx_fail(err, SBX_ERR_INVALID_FILE, -EINVAL, "file %s is given twice", name);
        struct sbx_file *f = realloc(r->files, (r->n_files + 1) * sizeof(*f));
        if (!f)
            return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
        r->files = f;
        f = &r->files[r->n_files];
        memset(f, 0, sizeof(*f));
        char *nm = strdup(name);
        void *data;
        size_t len;
        if (b64) {
            data = base64_decode(json_string_value(v), json_string_length(v), &len);
            if (!data && errno == EINVAL) {
                free(nm);
                return sbx_fail(err, SBX_ERR_INVALID_FILE, -EINVAL, "file %s: not valid base64",
                                name);
            }
        } else {
            len = json_string_length(v);
            data = malloc(len ? len : 1);
            if (data)
                memcpy(data, json_string_value(v), len);
        }
        if (!nm || !data) {
            free(nm);
            free(data);
            return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
        }
        *f = (struct sbx_file){nm, data, len};
        r->n_files++;
    }
    return 0;
}

int json_request_from(json_t *o, struct json_request *r, struct sbx_error *err)
{
    json_t *code;
    int rc;

    memset(r, 0, sizeof(*r));
    sbx_request_init(&r->req);
    r->id = json_incref(json_object_get(o, "id"));
    if (!r->id)
        r->id = json_null();
    code = json_object_get(o, "code");
    if (!json_is_string(code))
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "a request needs \"code\", a string");
    json_t *limits = json_object_get(o, "limits");
    if (limits && (rc = parse_limits(limits, &r->req.limits, err)) < 0)
        return rc;
    if ((rc = parse_files(json_object_get(o, "files"), false, r, err)) < 0 ||
        (rc = parse_files(json_object_get(o, "files_base64"), true, r, err)) < 0)
        return rc;
    /* The code stays in the parsed document, which the caller keeps. */
    r->req.code = json_string_value(code);
    r->req.code_len = json_string_length(code);
    r->req.files = r->files;
    r->req.n_files = r->n_files;
    return sbx_request_check(&r->req, err);
}

int json_request_parse(const char *text, size_t len, struct json_request *r, struct sbx_error *err)
{
    json_error_t jerr;
    json_t *o = json_loadb(text, len, JSON_ALLOW_NUL, &jerr);
    int rc;

    memset(r, 0, sizeof(*r));
    if (!o) {
        r->id = json_null();
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "not JSON: %s (column %d)",
                        jerr.text, jerr.column);
    }
    if (!json_is_object(o)) {
        json_decref(o);
        r->id = json_null();
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "a request is a JSON object");
    }
    rc = json_request_from(o, r, err);
    r->doc = o; /* it holds the code string */
    return rc;
}

void json_request_free(struct json_request *r)
{
    for (size_t i = 0; i < r->n_files; i++) {
        free((char *)r->files[i].name);
        free((void *)r->files[i].data);
    }
    free(r->files);
    json_decref(r->id);
    json_decref(r->doc);
    memset(r, 0, sizeof(*r));
}

static char *line(json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10)) : NULL;
    char *l = NULL;

    json_decref(o);
    if (!s)
        return NULL;
    size_t n = strlen(s);
    l = realloc(s, n + 2);
    if (!l) {
        free(s);
        return NULL;
    }
    l[n] = '\n';
    l[n + 1] = '\0';
    return l;
}

char *json_answer_result(json_t *id, const struct sbx_result *res)
{
    /* The result's own JSON text, with the id spliced in first:
     * {"id":<id>,"status":...} */
    char *idtext = json_dumps(id ? id : json_null(), JSON_ENCODE_ANY | JSON_COMPACT);
    char *result = sbx_result_to_json(res);
    char *out = NULL;

    if (idtext && result && result[0] == '{' &&
        asprintf(&out, "{\"id\":%s,%s\n", idtext, result + 1) < 0)
        out = NULL;
    free(idtext);
    free(result);
    return out;
}

char *json_answer_error(json_t *id, const struct sbx_error *err)
{
    return line(json_pack("{s:O, s:{s:s, s:s}}", "id", id ? id : json_null(), "error", "code",
                          sbx_error_code_name(err->code), "message", err->message));
}
