/* Checking a request before anything runs: every refusal says what is wrong. */
#include "sbxerr.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
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
    l->max_artifacts_total_bytes = SBX_DEFAULT_MAX_ARTIFACTS_TOTAL_BYTES;
}

void sbx_request_init(struct sbx_request *req)
{
    memset(req, 0, sizeof(*req));
    sbx_limits_init(&req->limits);
    req->max_tool_calls = SBX_DEFAULT_MAX_TOOL_CALLS;
    req->max_tool_bytes = SBX_DEFAULT_MAX_TOOL_BYTES;
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
    if (l->max_artifacts_total_bytes > SBX_MAX_ARTIFACTS_TOTAL_LIMIT)
        return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL,
                        "max_artifacts_total_bytes must be at most %llu",
                        SBX_MAX_ARTIFACTS_TOTAL_LIMIT);
    return 0;
}

/* The names of a request's files, in an open-addressed table: looked up by
 * a hash of a name's first |len| bytes, which a name's every prefix gets
 * as the name is read once (FNV-1a), so that checking all of them is
 * linear in the names' length, not in the square of it. */
struct name_set {
    const char **names;
    uint64_t *hashes;
    size_t mask;
};

static uint64_t fnv_step(uint64_t h, unsigned char c)
{
    return (h ^ c) * 0x100000001b3ULL;
}

#define FNV_START 0xcbf29ce484222325ULL

static int name_set_init(struct name_set *t, size_t n)
{
    size_t cap = 16;

    while (cap < 2 * n)
        cap <<= 1;
    t->mask = cap - 1;
    t->names = calloc(cap, sizeof(*t->names));
    t->hashes = calloc(cap, sizeof(*t->hashes));
    return t->names && t->hashes ? 0 : -ENOMEM;
}

static void name_set_free(struct name_set *t)
{
    free(t->names);
    free(t->hashes);
}

/* The name in |t| that is exactly s[0..len), or NULL. */
static const char *name_set_find(const struct name_set *t, uint64_t h, const char *s, size_t len)
{
    for (size_t i = h & t->mask; t->names[i]; i = (i + 1) & t->mask)
        if (t->hashes[i] == h && strncmp(t->names[i], s, len) == 0 && t->names[i][len] == '\0')
            return t->names[i];
    return NULL;
}

/* Adds |name|; returns false when it is there already. */
static bool name_set_add(struct name_set *t, const char *name)
{
    uint64_t h = FNV_START;

    for (const char *p = name; *p; p++)
        h = fnv_step(h, (unsigned char)*p);
    if (name_set_find(t, h, name, strlen(name)))
        return false;
    size_t i = h & t->mask;
    while (t->names[i])
        i = (i + 1) & t->mask;
    t->names[i] = name;
    t->hashes[i] = h;
    return true;
}

static int check_files(const struct sbx_request *req, uint64_t *total, struct sbx_error *err)
{
    struct name_set set = {0};
    int rc = 0;

    if (req->n_files > 0 && !req->files)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "n_files is set but files is NULL");
    if (req->n_files > SBX_MAX_INPUT_FILES)
        return sbx_fail(err, SBX_ERR_TOO_LARGE, -E2BIG, "more than %u input files",
                        SBX_MAX_INPUT_FILES);
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
    if (name_set_init(&set, req->n_files) < 0) {
        name_set_free(&set);
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < req->n_files && rc == 0; i++)
        if (!name_set_add(&set, req->files[i].name))
            rc = sbx_fail(err, SBX_ERR_INVALID_FILE, -EINVAL, "input file %s is given twice",
                          req->files[i].name);
    for (size_t i = 0; i < req->n_files && rc == 0; i++) {
        const char *name = req->files[i].name;
        uint64_t h = FNV_START;
        for (const char *p = name; *p && rc == 0; p++) {
            const char *dir;
            if (*p == '/' && (dir = name_set_find(&set, h, name, (size_t)(p - name))))
                rc = sbx_fail(err, SBX_ERR_INVALID_FILE, -EINVAL,
                              "input file %s is also the directory of %s", dir, name);
            h = fnv_step(h, (unsigned char)*p);
        }
    }
    name_set_free(&set);
    return rc;
}

/* stdin and the arguments, added to *total. */
static int check_input(const struct sbx_request *req, uint64_t *total, struct sbx_error *err)
{
    if (req->stdin_len > 0 && !req->stdin_data)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "stdin_len is set but stdin_data is NULL");
    if (req->argc > 0 && !req->argv)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "argc is set but argv is NULL");
    if (req->argc > SBX_MAX_ARGS)
        return sbx_fail(err, SBX_ERR_TOO_LARGE, -E2BIG, "more than %u arguments", SBX_MAX_ARGS);
    *total += req->stdin_len;
    for (size_t i = 0; i < req->argc; i++) {
        const char *a = req->argv[i];
        size_t n = a ? strlen(a) : 0;
        if (!a || utf8_valid_prefix((const unsigned char *)a, n) != n)
            return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "argument %zu is %s", i + 1,
                            a ? "not valid UTF-8" : "NULL");
        *total += n + 1;
    }
    if (req->filename) {
        size_t n = strlen(req->filename);
        if (n == 0 || n > 4096 || utf8_valid_prefix((const unsigned char *)req->filename, n) != n)
            return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "filename is %s",
                            n ? "longer than 4096 bytes or not valid UTF-8" : "empty");
        *total += n;
    }
    return 0;
}

static bool tool_name_ok(const char *name)
{
    size_t n = 0;

    if (!name || !(name[0] == '_' || ((name[0] | 0x20) >= 'a' && (name[0] | 0x20) <= 'z')))
        return false;
    for (const char *p = name; *p; p++, n++)
        if (!(*p == '_' || ((*p | 0x20) >= 'a' && (*p | 0x20) <= 'z') || (*p >= '0' && *p <= '9')))
            return false;
    return n <= 64;
}

static int check_tools(const struct sbx_request *req, struct sbx_error *err)
{
    if (req->n_tools == 0)
        return 0;
    if (!req->tools || req->n_tools > SBX_MAX_TOOLS)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "at most %u tools", SBX_MAX_TOOLS);
    if (req->max_tool_calls < 1 || req->max_tool_calls > SBX_MAX_TOOL_CALLS_LIMIT)
        return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL, "max_tool_calls must be from 1 to %u",
                        SBX_MAX_TOOL_CALLS_LIMIT);
    if (req->max_tool_bytes < SBX_MIN_TOOL_BYTES || req->max_tool_bytes > SBX_MAX_TOOL_BYTES_LIMIT)
        return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL,
                        "max_tool_bytes must be from %u to %llu", SBX_MIN_TOOL_BYTES,
                        SBX_MAX_TOOL_BYTES_LIMIT);
    for (size_t i = 0; i < req->n_tools; i++) {
        const struct sbx_tool *t = &req->tools[i];
        if (!tool_name_ok(t->name))
            return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                            "tool %zu: a name is [A-Za-z_][A-Za-z0-9_]{0,63}", i + 1);
        for (size_t j = 0; j < i; j++)
            if (strcmp(req->tools[j].name, t->name) == 0)
                return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "tool %s is declared twice",
                                t->name);
        const char *desc = t->description ? t->description : "";
        size_t dlen = strlen(desc);
        if (dlen > SBX_MAX_TOOL_DESCRIPTION ||
            utf8_valid_prefix((const unsigned char *)desc, dlen) != dlen)
            return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                            "tool %s: a description is valid UTF-8, at most %u bytes", t->name,
                            SBX_MAX_TOOL_DESCRIPTION);
    }
    return 0;
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
    if ((rc = check_files(req, &total, err)) < 0 || (rc = check_input(req, &total, err)) < 0 ||
        (rc = check_tools(req, err)) < 0)
        return rc;
    if (total + req->code_len > SBX_MAX_REQUEST_BYTES)
        return sbx_fail(err, SBX_ERR_TOO_LARGE, -E2BIG,
                        "code, input files, stdin and arguments together are larger than %llu MiB",
                        SBX_MAX_REQUEST_BYTES >> 20);
    return 0;
}
