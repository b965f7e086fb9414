/* Checking a request before anything runs: every refusal says what is wrong. */
#include "sbxerr.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sbx_limits_init(struct sbx_limits *l)
{
    l->wall_seconds = SBX_DEFAULT_WALL_SECONDS;
    l->cpu_seconds = SBX_DEFAULT_CPU_SECONDS;
    l->memory_bytes = SBX_DEFAULT_MEMORY_BYTES;
    l->max_output_chars = SBX_DEFAULT_MAX_OUTPUT_CHARS;
    l->max_artifact_bytes = SBX_DEFAULT_MAX_ARTIFACT_BYTES;
    l->max_artifacts = SBX_DEFAULT_MAX_ARTIFACTS;
}

void sbx_request_init(struct sbx_request *req)
{
    memset(req, 0, sizeof(*req));
    sbx_limits_init(&req->limits);
}

static int check_seconds(const char *what, double v, struct sbx_error *err)
{
    if (!isfinite(v) || v <= 0 || v > SBX_MAX_SECONDS)
        return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL,
                        "%s must be more than 0 and at most %.0f seconds", what, SBX_MAX_SECONDS);
    return 0;
}

static int check_limits(const struct sbx_limits *l, struct sbx_error *err)
{
    int rc;

    if ((rc = check_seconds("wall_seconds", l->wall_seconds, err)) < 0 ||
        (rc = check_seconds("cpu_seconds", l->cpu_seconds, err)) < 0)
        return rc;
    if (l->cpu_seconds * 1000.0 < 1.0 || l->wall_seconds * 1000.0 < 1.0)
        return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL,
                        "time limits must be at least 1 millisecond");
    if (l->memory_bytes < SBX_MIN_MEMORY_BYTES || l->memory_bytes > SBX_MAX_MEMORY_BYTES)
        return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL,
                        "memory_bytes must be between %llu MiB and %llu GiB",
                        SBX_MIN_MEMORY_BYTES >> 20, SBX_MAX_MEMORY_BYTES >> 30);
    if (l->max_output_chars > SBX_MAX_OUTPUT_CHARS_LIMIT)
        return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL,
                        "max_output_chars must be at most %llu", SBX_MAX_OUTPUT_CHARS_LIMIT);
    if (l->max_artifact_bytes > SBX_MAX_ARTIFACT_BYTES_LIMIT)
        return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL,
                        "max_artifact_bytes must be at most %llu", SBX_MAX_ARTIFACT_BYTES_LIMIT);
    if (l->max_artifacts > SBX_MAX_ARTIFACTS_LIMIT)
        return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL, "max_artifacts must be at most %llu",
                        SBX_MAX_ARTIFACTS_LIMIT);
    return 0;
}

static int check_files(const struct sbx_request *req, uint64_t *total, struct sbx_error *err)
{
    const char **names = NULL;
    int rc = 0;

    if (req->n_files > 0 && !req->files)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "n_files is set but files is NULL");
    if (req->n_files > 10000)
        return sbx_fail(err, SBX_ERR_TOO_LARGE, -E2BIG, "more than 10000 input files");
    for (size_t i = 0; i < req->n_files; i++) {
        const struct sbx_file *f = &req->files[i];
        const char *why = f->name ? name_problem(f->name, strlen(f->name)) : "the name is NULL";
        if (why)
            return sbx_fail(err, SBX_ERR_INVALID_FILE, -EINVAL, "input file %s: %s",
                            f->name ? f->name : "(null)", why);
        if (f->len > 0 && !f->data)
            return sbx_fail(err, SBX_ERR_INVALID_FILE, -EINVAL, "input file %s: data is NULL",
                            f->name);
        *total += f->len + strlen(f->name);
    }
    if (req->n_files < 2)
        return 0;

    /* No name twice, and no name that another uses as a directory. */
    names = malloc(req->n_files * sizeof(*names));
    if (!names)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -ENOMEM, "out of memory");
    for (size_t i = 0; i < req->n_files; i++)
        names[i] = req->files[i].name;
    qsort(names, req->n_files, sizeof(*names), cmp_strings);
    for (size_t i = 0; i < req->n_files && rc == 0; i++) {
        if (i > 0 && strcmp(names[i - 1], names[i]) == 0) {
            rc = sbx_fail(err, SBX_ERR_INVALID_FILE, -EINVAL, "input file %s is given twice",
                          names[i]);
            break;
        }
        char prefix[4097];
        for (const char *s = strchr(names[i], '/'); s; s = strchr(s + 1, '/')) {
            size_t n = (size_t)(s - names[i]);
            memcpy(prefix, names[i], n);
            prefix[n] = '\0';
            const char *key = prefix;
            if (bsearch(&key, names, req->n_files, sizeof(*names), cmp_strings)) {
                rc = sbx_fail(err, SBX_ERR_INVALID_FILE, -EINVAL,
                              "input file %s is also the directory of %s", prefix, names[i]);
                break;
            }
        }
    }
    free(names);
    return rc;
}

int sbx_request_check(const struct sbx_request *req, struct sbx_error *err)
{
    uint64_t total = 0;
    int rc;

    if (!req)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "no request");
    if (!req->code)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "no code");
    if (req->code_len > SBX_MAX_CODE_BYTES)
        return sbx_fail(err, SBX_ERR_TOO_LARGE, -E2BIG, "the code is larger than %llu MiB",
                        SBX_MAX_CODE_BYTES >> 20);
    if ((rc = check_limits(&req->limits, err)) < 0)
        return rc;
    if ((rc = check_files(req, &total, err)) < 0)
        return rc;
    if (total + req->code_len > SBX_MAX_REQUEST_BYTES)
        return sbx_fail(err, SBX_ERR_TOO_LARGE, -E2BIG,
                        "code and input files together are larger than %llu MiB",
                        SBX_MAX_REQUEST_BYTES >> 20);
    return 0;
}
