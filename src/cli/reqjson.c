#define _GNU_SOURCE
#include "reqjson.h"

#include "sbxerr.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The limits a request may set, with the library's ceiling on each. */
static const struct limit_field {
    const char *name;
    bool seconds; /* a double; else a uint64_t */
    size_t off;
    double max;
} limit_fields[] = {
    {"wall_seconds", true, offsetof(struct sbx_limits, wall_seconds), SBX_MAX_SECONDS},
    {"cpu_seconds", true, offsetof(struct sbx_limits, cpu_seconds), SBX_MAX_SECONDS},
    {"memory_bytes", false, offsetof(struct sbx_limits, memory_bytes), SBX_MAX_MEMORY_BYTES},
    {"max_output_chars", false, offsetof(struct sbx_limits, max_output_chars),
     SBX_MAX_OUTPUT_CHARS_LIMIT},
    {"max_artifact_bytes", false, offsetof(struct sbx_limits, max_artifact_bytes),
     SBX_MAX_ARTIFACT_BYTES_LIMIT},
    {"max_artifacts", false, offsetof(struct sbx_limits, max_artifacts), SBX_MAX_ARTIFACTS_LIMIT},
    {"max_artifacts_total_bytes", false, offsetof(struct sbx_limits, max_artifacts_total_bytes),
     SBX_MAX_ARTIFACTS_TOTAL_LIMIT},
};

_Static_assert(ARRAY_SIZE(limit_fields) == REQUEST_LIMIT_COUNT, "one entry per request limit");

/* What a request may hold, besides the limits' own keys. */
static const char *const request_fields[] = {
    "id",       "code",           "files",          "files_base64", "limits",   "session",
    "rollback", "stdin",          "stdin_base64",   "argv",         "filename", "stream",
    "tools",    "max_tool_calls", "max_tool_bytes", "cell"};

static double *seconds_of(struct sbx_limits *l, const struct limit_field *f)
{
    return (double *)((char *)l + f->off);
}

static uint64_t *count_of(struct sbx_limits *l, const struct limit_field *f)
{
    return (uint64_t *)((char *)l + f->off);
}

static double seconds_in(const struct sbx_limits *l, const struct limit_field *f)
{
    return *(const double *)((const char *)l + f->off);
}

static uint64_t count_in(const struct sbx_limits *l, const struct limit_field *f)
{
    return *(const uint64_t *)((const char *)l + f->off);
}

void json_request_default_limits(struct json_request *r, const struct sbx_limits *defaults,
                                 unsigned given)
{
    json_t *named = json_object_get(r->doc, "limits");

    for (size_t i = 0; i < ARRAY_SIZE(limit_fields); i++) {
        const struct limit_field *f = &limit_fields[i];
        if (!(given & (1u << i)) || json_object_get(named, f->name))
            continue;
        if (f->seconds)
            *seconds_of(&r->req.limits, f) = seconds_in(defaults, f);
        else
            *count_of(&r->req.limits, f) = count_in(defaults, f);
    }
}

void json_ceilings_init(struct sbx_limits *ceil)
{
    for (size_t i = 0; i < ARRAY_SIZE(limit_fields); i++) {
        const struct limit_field *f = &limit_fields[i];
        if (f->seconds)
            *seconds_of(ceil, f) = f->max;
        else
            *count_of(ceil, f) = (uint64_t)f->max;
    }
}

static int number(json_t *v, const char *name, double *out, struct sbx_error *err)
{
    if (!json_is_number(v))
        return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL, "limit %s must be a number", name);
    *out = json_number_value(v);
    return 0;
}

/* A whole number. Integers past 2^63 reach us as reals (see parse_object),
 * so a real with no fraction counts too. */
static int count(json_t *v, const char *name, uint64_t *out, struct sbx_error *err)
{
    double d = json_is_real(v) ? json_real_value(v) : -1;

    if (json_is_integer(v) && json_integer_value(v) >= 0)
        *out = (uint64_t)json_integer_value(v);
    else if (d >= 0 && d == floor(d))
        *out = d >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)d;
    else
        return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL,
                        "limit %s must be a whole number, 0 or more", name);
    return 0;
}

static int parse_limit(const struct limit_field *f, json_t *v, struct sbx_limits *out,
                       struct sbx_error *err)
{
    /* memory_bytes: bytes, or a size such as "256M" */
    if (f->off == offsetof(struct sbx_limits, memory_bytes) && json_is_string(v) &&
        parse_size(json_string_value(v), &out->memory_bytes) == 0)
        return 0;
    if (f->seconds)
        return number(v, f->name, seconds_of(out, f), err);
    return count(v, f->name, count_of(out, f), err);
}

/* A limit asked above the server's ceiling is refused; where the ceiling is
 * the library's own range, the library's check says it instead. A default
 * above the ceiling is lowered to it. */
static int apply_ceiling(const struct limit_field *f, bool given, struct sbx_limits *l,
                         const struct sbx_limits *ceil, struct sbx_error *err)
{
    if (f->seconds) {
        double v = seconds_in(l, f), top = seconds_in(ceil, f);
        if (v <= top || top >= f->max)
            return 0;
        if (!given) {
            *seconds_of(l, f) = top;
            return 0;
        }
        return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL,
                        "%s %g exceeds the server's ceiling of %g", f->name, v, top);
    }
    uint64_t v = count_in(l, f), top = count_in(ceil, f);
    if (v <= top || (double)top >= f->max)
        return 0;
    if (!given) {
        *count_of(l, f) = top;
        return 0;
    }
    /* Sizes as a person writes them ("256 MiB"), counts as counts. */
    char asked[48], most[48];
    bool size = strstr(f->name, "_bytes") != NULL;
    if (size) {
        fmt_size(asked, sizeof(asked), v);
        fmt_size(most, sizeof(most), top);
    } else {
        fmt(asked, sizeof(asked), "%llu", (unsigned long long)v);
        fmt(most, sizeof(most), "%llu", (unsigned long long)top);
    }
    return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL, "%s %s exceeds the server's ceiling of %s",
                    f->name, asked, most);
}

static int parse_limits(json_t *l, struct sbx_limits *out, const struct sbx_limits *ceil,
                        struct sbx_error *err)
{
    bool given[ARRAY_SIZE(limit_fields)] = {false};
    const char *k;
    json_t *v;
    int rc;

    if (l && !json_is_object(l))
        return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL, "limits must be an object");
    json_object_foreach(l, k, v)
    {
        size_t i = 0;
        while (i < ARRAY_SIZE(limit_fields) && strcmp(k, limit_fields[i].name) != 0)
            i++;
        if (i == ARRAY_SIZE(limit_fields))
            return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL, "unknown limit '%s'", k);
        if ((rc = parse_limit(&limit_fields[i], v, out, err)) < 0)
            return rc;
        given[i] = true;
    }
    for (size_t i = 0; ceil && i < ARRAY_SIZE(limit_fields); i++)
        if ((rc = apply_ceiling(&limit_fields[i], given[i], out, ceil, err)) < 0)
            return rc;
    return 0;
}

/* Appends the files of |o| (name -> text, or name -> base64) to the room
 * made for them. A name given in |other| too (files and files_base64) is
 * refused: within one object jansson keeps one member per key. Linear in
 * the request: each member is looked at once, its size counted as it
 * goes. */
static int parse_files(json_t *o, json_t *other, bool b64, struct json_request *r, uint64_t *total,
                       struct sbx_error *err)
{
    const char *name;
    json_t *v;

    if (!o)
        return 0;
    json_object_foreach(o, name, v)
    {
        if (!json_is_string(v))
            return sbx_fail(err, SBX_ERR_INVALID_FILE, -EINVAL, "file %s: content must be a string",
                            name);
        if (other && json_object_get(other, name))
            return sbx_fail(err, SBX_ERR_INVALID_FILE, -EINVAL, "file %s is given twice", name);
        /* Base64 decodes to three quarters of its length: refused before
         * it is decoded, past the library's ceiling on a request. */
        size_t vlen = json_string_length(v);
        *total += (b64 ? vlen / 4 * 3 : vlen) + strlen(name);
        if (*total > SBX_MAX_REQUEST_BYTES)
            return sbx_fail(err, SBX_ERR_TOO_LARGE, -E2BIG,
                            "code and input files together are larger than %llu MiB",
                            SBX_MAX_REQUEST_BYTES >> 20);
        struct sbx_file *f = &r->files[r->n_files];
        char *nm = strdup(name);
        void *data;
        size_t len;
        if (b64) {
            data = base64_decode(json_string_value(v), vlen, &len);
            if (!data && errno == EINVAL) {
                free(nm);
                return sbx_fail(err, SBX_ERR_INVALID_FILE, -EINVAL, "file %s: not valid base64",
                                name);
            }
        } else {
            len = vlen;
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

/* Both objects of files: counted (and refused past the library's number)
 * before anything of them is decoded. */
static int parse_all_files(json_t *text, json_t *b64, uint64_t code_len, struct json_request *r,
                           struct sbx_error *err)
{
    uint64_t total = code_len;

    if ((text && !json_is_object(text)) || (b64 && !json_is_object(b64)))
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "%s must be an object of name: content",
                        text && !json_is_object(text) ? "files" : "files_base64");
    size_t n = json_object_size(text) + json_object_size(b64);
    if (n > SBX_MAX_INPUT_FILES)
        return sbx_fail(err, SBX_ERR_TOO_LARGE, -E2BIG, "more than %u input files",
                        SBX_MAX_INPUT_FILES);
    if (!n)
        return 0;
    r->files = calloc(n, sizeof(*r->files));
    if (!r->files)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    int rc = parse_files(text, NULL, false, r, &total, err);
    return rc < 0 ? rc : parse_files(b64, text, true, r, &total, err);
}

static int unknown_field(json_t *o, const char *const *known, size_t n, const char *what,
                         struct sbx_error *err)
{
    const char *k;
    json_t *v;

    json_object_foreach(o, k, v)
    {
        size_t i = 0;
        while (i < n && strcmp(k, known[i]) != 0)
            i++;
        if (i == n)
            return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "unknown field '%s' (%s)", k,
                            what);
    }
    return 0;
}

/* "stdin" (text) or "stdin_base64", "filename" and "argv" (a list of
 * strings), into r->req. */
static int parse_input(json_t *o, struct json_request *r, struct sbx_error *err)
{
    json_t *text = json_object_get(o, "stdin"), *b64 = json_object_get(o, "stdin_base64");
    json_t *argv = json_object_get(o, "argv"), *name = json_object_get(o, "filename");

    if (name &&
        (!json_is_string(name) || strlen(json_string_value(name)) != json_string_length(name)))
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "\"filename\" is a string without NUL (the program's name)");
    if (name)
        r->req.filename = json_string_value(name);

    if (text && b64)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "give stdin or stdin_base64, not both");
    if (text && !json_is_string(text))
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "\"stdin\" is a string");
    if (b64 && !json_is_string(b64))
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "\"stdin_base64\" is a string");
    if (text) {
        r->req.stdin_data = json_string_value(text);
        r->req.stdin_len = json_string_length(text);
    } else if (b64) {
        size_t len = 0;
        r->stdin_decoded = base64_decode(json_string_value(b64), json_string_length(b64), &len);
        if (!r->stdin_decoded)
            return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                            errno == ENOMEM ? "out of memory" : "\"stdin_base64\" is not base64");
        r->req.stdin_data = r->stdin_decoded;
        r->req.stdin_len = len;
    }
    if (!argv)
        return 0;
    if (!json_is_array(argv))
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "\"argv\" is a list of strings (sys.argv[1:])");
    size_t n = json_array_size(argv);
    if (n > SBX_MAX_ARGS)
        return sbx_fail(err, SBX_ERR_TOO_LARGE, -E2BIG, "more than %u arguments", SBX_MAX_ARGS);
    if (n && !(r->args = calloc(n, sizeof(char *))))
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *a = json_array_get(argv, i);
        /* A NUL inside would cut the argument short without a word. */
        if (!json_is_string(a) || strlen(json_string_value(a)) != json_string_length(a))
            return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                            "\"argv\" is a list of strings without NUL (item %zu is not)", i);
        r->args[i] = json_string_value(a);
    }
    r->req.argv = r->args;
    r->req.argc = n;
    return 0;
}

/* "tools": [{"name", "description", "parameters"}, ...] and their bounds,
 * into r->req (sbx_request_check checks the names and the bounds' ranges).
 * "parameters" (a JSON Schema object) is the caller's documentation of the
 * tool: taken, not enforced here. */
static int parse_tools(json_t *o, struct json_request *r, struct sbx_error *err)
{
    static const char *const tool_fields[] = {"name", "description", "parameters"};
    json_t *list = json_object_get(o, "tools");
    json_t *calls = json_object_get(o, "max_tool_calls"),
           *bytes = json_object_get(o, "max_tool_bytes");
    int rc;

    if ((calls || bytes) && !list)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "max_tool_calls and max_tool_bytes go with tools");
    if (!list)
        return 0;
    if (!json_is_array(list) || json_array_size(list) == 0 || json_array_size(list) > SBX_MAX_TOOLS)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "\"tools\" is a list of 1 to %u tools", SBX_MAX_TOOLS);
    if (calls && (!json_is_integer(calls) || json_integer_value(calls) < 1 ||
                  json_integer_value(calls) > SBX_MAX_TOOL_CALLS_LIMIT))
        return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL,
                        "max_tool_calls is an integer from 1 to %u", SBX_MAX_TOOL_CALLS_LIMIT);
    if (bytes && (!json_is_integer(bytes) || json_integer_value(bytes) < SBX_MIN_TOOL_BYTES ||
                  (uint64_t)json_integer_value(bytes) > SBX_MAX_TOOL_BYTES_LIMIT))
        return sbx_fail(err, SBX_ERR_INVALID_LIMIT, -EINVAL,
                        "max_tool_bytes is an integer from %u to %llu", SBX_MIN_TOOL_BYTES,
                        SBX_MAX_TOOL_BYTES_LIMIT);
    size_t n = json_array_size(list);
    if (!(r->tools = calloc(n, sizeof(*r->tools))))
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(list, i), *name = json_object_get(t, "name");
        json_t *desc = json_object_get(t, "description"),
               *params = json_object_get(t, "parameters");
        if (!json_is_object(t) || !json_is_string(name) || (desc && !json_is_string(desc)) ||
            (params && !json_is_object(params)))
            return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                            "tool %zu is {\"name\": string, \"description\": string, "
                            "\"parameters\": object}",
                            i + 1);
        if ((rc = unknown_field(t, tool_fields, ARRAY_SIZE(tool_fields),
                                "a tool has name, description, parameters", err)) < 0)
            return rc;
        r->tools[i].name = json_string_value(name);
        r->tools[i].description = desc ? json_string_value(desc) : NULL;
    }
    r->req.tools = r->tools;
    r->req.n_tools = n;
    if (calls)
        r->req.max_tool_calls = (uint32_t)json_integer_value(calls);
    if (bytes)
        r->req.max_tool_bytes = (uint64_t)json_integer_value(bytes);
    return 0;
}

/* "cell": N, the number a session's cell says it is (sessions.h). */
static int parse_cell(json_t *o, bool session, uint64_t *cell, struct sbx_error *err)
{
    json_t *v = json_object_get(o, "cell");

    *cell = 0;
    if (!v)
        return 0;
    if (!session)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "cell is the number of a session's cell: it goes with session");
    if (!json_is_integer(v) || json_integer_value(v) < 1)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "cell is a whole number from 1: the cell's number in its session");
    *cell = (uint64_t)json_integer_value(v);
    return 0;
}

int json_request_from(json_t *o, const struct sbx_limits *ceil, struct json_request *r,
                      struct sbx_error *err)
{
    json_t *code;
    int rc;

    sbx_request_init(&r->req);
    /* A misspelt field would otherwise be ignored, and the request run
     * without what its caller thinks it asked for. */
    if ((rc = unknown_field(o, request_fields, ARRAY_SIZE(request_fields),
                            "a request has id, code, files, files_base64, stdin, stdin_base64, "
                            "argv, limits, session, rollback, cell, stream, tools, "
                            "max_tool_calls, max_tool_bytes",
                            err)) < 0 ||
        (rc = json_session_fields(o, "session", &r->session, &r->rollback, err)) < 0 ||
        (rc = parse_cell(o, r->session != NULL, &r->cell, err)) < 0)
        return rc;
    json_t *stream = json_object_get(o, "stream");
    if (stream && !json_is_boolean(stream))
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "\"stream\" is true or false");
    r->stream = json_is_true(stream);
    if ((rc = parse_tools(o, r, err)) < 0)
        return rc;
    code = json_object_get(o, "code");
    if (!json_is_string(code))
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "a request needs \"code\", a string");
    if ((rc = parse_limits(json_object_get(o, "limits"), &r->req.limits, ceil, err)) < 0)
        return rc;
    if ((rc = parse_all_files(json_object_get(o, "files"), json_object_get(o, "files_base64"),
                              json_string_length(code), r, err)) < 0)
        return rc;
    if ((rc = parse_input(o, r, err)) < 0)
        return rc;
    /* The code stays in the parsed document, which the caller keeps. */
    r->req.code = json_string_value(code);
    r->req.code_len = json_string_length(code);
    r->req.files = r->files;
    r->req.n_files = r->n_files;
    return sbx_request_check(&r->req, err);
}

/* --- the text of a member, as written ---------------------------------------- */

static size_t skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n'))
        i++;
    return i;
}

/* s[i] is the opening quote; returns the index after the closing one. A
 * backslash always escapes the next byte (\uXXXX's digits are plain). */
static size_t skip_string(const char *s, size_t i, size_t n)
{
    for (i++; i < n && s[i] != '"'; i++)
        if (s[i] == '\\')
            i++;
    return i < n ? i + 1 : n;
}

static size_t skip_value(const char *s, size_t i, size_t n)
{
    size_t depth = 0;

    if (i < n && s[i] == '"')
        return skip_string(s, i, n);
    if (i < n && s[i] != '{' && s[i] != '[') {
        /* a number, true, false or null: up to what ends it */
        while (i < n && !strchr(",}] \t\r\n", s[i]))
            i++;
        return i;
    }
    while (i < n) {
        char ch = s[i];
        if (ch == '"') {
            i = skip_string(s, i, n);
            continue;
        }
        if (ch == '{' || ch == '[')
            depth++;
        else if ((ch == '}' || ch == ']') && --depth == 0)
            return i + 1;
        i++;
    }
    return n;
}

/* Whether the string token s[a..b) (quotes included) decodes to |key|: a key
 * may be written with escapes ("\u0069d" is "id"). */
static bool key_is(const char *s, size_t a, size_t b, const char *key)
{
    size_t klen = strlen(key);

    if (b - a < 2)
        return false;
    if (!memchr(s + a, '\\', b - a))
        return b - a - 2 == klen && memcmp(s + a + 1, key, klen) == 0;
    json_t *k = json_loadb(s + a, b - a, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    bool same = json_is_string(k) && json_string_length(k) == klen &&
                memcmp(json_string_value(k), key, klen) == 0;
    json_decref(k);
    return same;
}

int json_raw_member(const char *text, size_t len, const char *key, const char **val, size_t *vlen)
{
    size_t i = skip_ws(text, 0, len);
    int rc = -ENOENT;

    if (i >= len || text[i] != '{')
        return -ENOENT;
    i = skip_ws(text, i + 1, len);
    while (i < len && text[i] == '"') {
        size_t ka = i, kb = skip_string(text, i, len);
        i = skip_ws(text, kb, len);
        if (i >= len || text[i] != ':')
            break;
        size_t va = skip_ws(text, i + 1, len), vb = skip_value(text, va, len);
        if (key_is(text, ka, kb, key)) { /* the last one wins, as in the parser */
            *val = text + va;
            *vlen = vb - va;
            rc = 0;
        }
        i = skip_ws(text, vb, len);
        if (i >= len || text[i] != ',')
            break;
        i = skip_ws(text, i + 1, len);
    }
    return rc;
}

/* The member's text, for echoing. A carriage return, a newline or a NUL
 * byte in it can only stand between tokens (JSON strings hold none raw, and
 * jansson lets a NUL end a number); each becomes a space, since line readers
 * would end the answer's line there and C strings at the NUL. (A line from
 * the line reader holds no newline; a caller with a document of several
 * lines might.) */
static char *member_text(const char *text, size_t len, const char *key)
{
    const char *v;
    size_t n;
    char *t = json_raw_member(text, len, key, &v, &n) == 0 ? malloc(n + 1) : NULL;

    if (!t)
        return NULL;
    for (size_t i = 0; i < n; i++)
        t[i] = v[i] == '\r' || v[i] == '\n' || v[i] == '\0' ? ' ' : v[i];
    t[n] = '\0';
    return t;
}

/* --- parsing a line ----------------------------------------------------------- */

/* The id of a line jansson stopped reading at one of its limits, not at
 * an error of the text: a number past a double's range, or nesting deeper
 * than it goes (JSON has neither limit). Such a line may be an object with
 * an id, which is owed its answer: the id is found by the scan of the
 * object's top level, which needs no depth, and echoed only when it is a
 * JSON value by itself (a number past a double's range included), so that
 * the answer is JSON. NULL when there is none, or it is no such value. */
static char *unread_id(const char *text, size_t len)
{
    char *id = member_text(text, len, "id");
    json_error_t jerr;
    json_t *v;

    if (!id)
        return NULL;
    size_t n = strlen(id);
    v = json_loadb(id, n, JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &jerr);
    /* A number past a double's range is read whole before it is refused:
     * then the refusal stands at its end. */
    if (!v && !(json_error_code(&jerr) == json_error_numeric_overflow && jerr.position == (int)n &&
                (id[0] == '-' || (id[0] >= '0' && id[0] <= '9')))) {
        free(id);
        return NULL;
    }
    json_decref(v);
    return id;
}

/* The line as an object, or NULL with |err| set (and r->id_text when
 * the line may be an object with an id that jansson could not hold). */
static json_t *parse_object(const char *text, size_t len, struct json_request *r,
                            struct sbx_error *err)
{
    json_error_t jerr;
    json_t *o = json_loadb(text, len, JSON_ALLOW_NUL, &jerr);

    /* jansson refuses integers past 2^63 unless all numbers are reals;
     * only the id (echoed as written) and whole-number limits (which take
     * reals without a fraction) can tell. */
    if (!o && json_error_code(&jerr) == json_error_numeric_overflow)
        o = json_loadb(text, len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &jerr);
    if (!o) {
        enum json_error_code why = json_error_code(&jerr);
        if (why == json_error_numeric_overflow || why == json_error_stack_overflow) {
            r->id_text = unread_id(text, len);
            sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                     "a number past a double's range, or nesting deeper than %d, is not read "
                     "here: %s (column %d)",
                     JSON_PARSER_MAX_DEPTH, jerr.text, jerr.column);
        } else
            sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "not JSON: %s (column %d)", jerr.text,
                     jerr.column);
        return NULL;
    }
    if (!json_is_object(o)) {
        json_decref(o);
        sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL, "a request is a JSON object");
        return NULL;
    }
    return o;
}

int json_session_name(json_t *o, const char *field, const char **name, struct sbx_error *err)
{
    json_t *v = json_object_get(o, field);
    size_t n = json_string_length(v);

    /* No NUL: names are compared as C strings, and "a\u0000b" is not "a". */
    if (!json_is_string(v) || n == 0 || n > SESSION_NAME_MAX || strlen(json_string_value(v)) != n)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "%s must be a session's name: a string of 1 to %d bytes, without NUL",
                        field, SESSION_NAME_MAX);
    *name = json_string_value(v);
    return 0;
}

int json_session_fields(json_t *o, const char *field, const char **name,
                        enum sbx_rollback *rollback, struct sbx_error *err)
{
    json_t *rb = json_object_get(o, "rollback");
    const char *rbname = json_string_value(rb);
    int rc;

    *name = NULL;
    *rollback = SBX_ROLLBACK_ON_ERROR;
    if (!json_object_get(o, field))
        return rb ? sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                             "rollback is for a cell of a session: it goes with %s", field)
                  : 0;
    if ((rc = json_session_name(o, field, name, err)) < 0)
        return rc;
    if (rb && (!rbname || strlen(rbname) != json_string_length(rb) ||
               sbx_rollback_from_name(rbname, rollback) < 0))
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "rollback is \"on_error\", \"on_stop\" or \"never\"");
    return 0;
}

int json_request_no_session(const struct json_request *r, struct sbx_error *err)
{
    if (r->session || r->session_close || r->fork_from || r->session_hibernate)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                        "sessions are served over JSON lines and MCP");
    return 0;
}

int json_request_parse(const char *text, size_t len, const struct sbx_limits *ceil,
                       struct json_request *r, struct sbx_error *err)
{
    static const char *const cancel_fields[] = {"cancel"};
    static const char *const close_fields[] = {"id", "session_close"};
    json_t *o;

    memset(r, 0, sizeof(*r));
    if (!(o = parse_object(text, len, r, err)))
        return -EINVAL;
    r->doc = o; /* it holds the code string */
    /* Only now is the text known to be JSON, which the scan relies on. */
    if (json_object_get(o, "id") && !(r->id_text = member_text(text, len, "id")))
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    if (json_object_get(o, "cancel")) {
        if (!(r->cancel_text = member_text(text, len, "cancel")))
            return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
        return unknown_field(o, cancel_fields, ARRAY_SIZE(cancel_fields),
                             "a cancel message has only \"cancel\"", err);
    }
    if (json_object_get(o, "tool_result")) {
        static const char *const result_fields[] = {"id", "tool_result"};
        static const char *const answer_fields[] = {"call", "content", "error"};
        json_t *a = json_object_get(o, "tool_result"), *call = json_object_get(a, "call");
        json_t *content = json_object_get(a, "content"), *error = json_object_get(a, "error");
        int rc = unknown_field(o, result_fields, ARRAY_SIZE(result_fields),
                               "a tool_result message has only id and tool_result", err);
        if (rc == 0 && json_is_object(a))
            rc = unknown_field(a, answer_fields, ARRAY_SIZE(answer_fields),
                               "a tool_result has call, and content or error", err);
        r->is_tool_result = true;
        if (rc < 0)
            return rc;
        if (!json_is_object(a) || !json_is_integer(call) || json_integer_value(call) < 1 ||
            !content == !error || (error && !json_is_string(error)))
            return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                            "a tool_result is {\"call\": N, \"content\": any JSON} or "
                            "{\"call\": N, \"error\": string}");
        r->result_call = (uint64_t)json_integer_value(call);
        r->result_content = content;
        r->result_error = error ? json_string_value(error) : NULL;
        return 0;
    }
    if (json_object_get(o, "session_close")) {
        int rc = unknown_field(o, close_fields, ARRAY_SIZE(close_fields),
                               "a session_close message has only id and session_close", err);
        return rc < 0 ? rc : json_session_name(o, "session_close", &r->session_close, err);
    }
    if (json_object_get(o, "session_hibernate")) {
        static const char *const fields[] = {"id", "session_hibernate"};
        int rc =
            unknown_field(o, fields, ARRAY_SIZE(fields),
                          "a session_hibernate message has only id and session_hibernate", err);
        return rc < 0 ? rc : json_session_name(o, "session_hibernate", &r->session_hibernate, err);
    }
    if (json_object_get(o, "session_fork")) {
        static const char *const fork_fields[] = {"id", "session_fork"};
        static const char *const names[] = {"from", "to"};
        json_t *f = json_object_get(o, "session_fork");
        int rc = unknown_field(o, fork_fields, ARRAY_SIZE(fork_fields),
                               "a session_fork message has only id and session_fork", err);
        if (rc == 0 && !json_is_object(f))
            rc = sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                          "session_fork is {\"from\": NAME, \"to\": NAME}");
        if (rc == 0)
            rc = unknown_field(f, names, ARRAY_SIZE(names), "session_fork has only from and to",
                               err);
        if (rc == 0)
            rc = json_session_name(f, "from", &r->fork_from, err);
        if (rc == 0)
            rc = json_session_name(f, "to", &r->fork_to, err);
        if (rc == 0 && strcmp(r->fork_from, r->fork_to) == 0)
            rc = sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                          "session_fork's from and to are two sessions: two names");
        return rc;
    }
    return json_request_from(o, ceil, r, err);
}

int json_request_parse_cell(const char *text, size_t len, const char *session,
                            const struct sbx_limits *ceil, struct json_request *r,
                            struct sbx_error *err)
{
    static const char *const others[] = {"session",       "cancel",       "tool_result",
                                         "session_close", "session_fork", "session_hibernate"};
    json_t *o;

    memset(r, 0, sizeof(*r));
    if (!(o = parse_object(text, len, r, err)))
        return -EINVAL;
    r->doc = o;
    if (json_object_get(o, "id") && !(r->id_text = member_text(text, len, "id")))
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    for (size_t i = 0; i < ARRAY_SIZE(others); i++)
        if (json_object_get(o, others[i]))
            return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                            "a session's cell is a request: \"%s\" is not one of its fields "
                            "(the path names the session)",
                            others[i]);
    if (json_object_set_new(o, "session", json_string(session)) < 0)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    return json_request_from(o, ceil, r, err);
}

void json_request_free(struct json_request *r)
{
    for (size_t i = 0; i < r->n_files; i++) {
        free((char *)r->files[i].name);
        free((void *)r->files[i].data);
    }
    free(r->files);
    free(r->stdin_decoded);
    free(r->args);
    free(r->tools);
    free(r->id_text);
    free(r->cancel_text);
    json_decref(r->doc);
    memset(r, 0, sizeof(*r));
}

/* --- answers ------------------------------------------------------------------ */

/* "{" head "," rest-of-|obj| "\n": members spliced in front of an encoded
 * object's own, so that their text stays as it was. */
static char *splice(const char *head, char *obj)
{
    char *out = NULL;

    if (obj && obj[0] == '{' &&
        asprintf(&out, "{%s%s%s\n", head, obj[1] == '}' ? "" : ",", obj + 1) < 0)
        out = NULL;
    free(obj);
    return out;
}

static char *with_id(const char *id_text, char *obj)
{
    char *head = NULL;
    char *out;

    if (asprintf(&head, "\"id\":%s", id_text ? id_text : "null") < 0) {
        free(obj);
        return NULL;
    }
    out = splice(head, obj);
    free(head);
    return out;
}

char *json_answer_result(const char *id_text, const struct sbx_result *res)
{
    char *result = sbx_result_to_json(res);

    if (!result) {
        /* Still an answer to this id, rather than none. */
        struct sbx_error err;
        sbx_fail(&err, SBX_ERR_UNAVAILABLE, -ENOMEM, "the result (status %s) could not be encoded",
                 sbx_status_name(res->status));
        return json_answer_error(id_text, &err);
    }
    return with_id(id_text, result);
}

char *json_answer_session(const char *id_text, const struct sbx_result *res, const char *name,
                          bool restored)
{
    char *result = sbx_result_to_json(res), *head = NULL, *out;
    json_t *session = json_pack("{s:s, s:I, s:b}", "name", name, "cell", (json_int_t)res->cell,
                                "rolled_back", res->rolled_back);
    /* Only when it was: the answers of other cells are as they were. */
    if (session && restored && json_object_set_new(session, "restored", json_true()) < 0) {
        json_decref(session);
        session = NULL;
    }
    char *stext = session ? json_dumps(session, JSON_COMPACT) : NULL;

    json_decref(session);
    if (!result || !stext ||
        asprintf(&head, "\"id\":%s,\"session\":%s", id_text ? id_text : "null", stext) < 0) {
        free(result);
        free(stext);
        return json_answer_result(id_text, res); /* its own fallback, or NULL */
    }
    out = splice(head, result);
    free(head);
    free(stext);
    return out;
}

char *json_answer_session_forked(const char *id_text, const char *from, const char *to,
                                 uint64_t cells)
{
    json_t *o = json_pack("{s:{s:s,s:s,s:I}}", "session_forked", "from", from, "to", to, "cell",
                          (json_int_t)cells);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;

    json_decref(o);
    return with_id(id_text, text);
}

char *json_answer_session_hibernated(const char *id_text, const char *name, uint64_t bytes)
{
    json_t *o =
        json_pack("{s:{s:s,s:I}}", "session_hibernated", "name", name, "bytes", (json_int_t)bytes);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;

    json_decref(o);
    return with_id(id_text, text);
}

char *json_answer_session_closed(const char *id_text, const char *name)
{
    json_t *o = json_pack("{s:s}", "session_closed", name);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;

    json_decref(o);
    return with_id(id_text, text);
}

/* {"error":{"code":...,"message":...}}. A message is cut to 255 bytes,
 * possibly inside a character (a long file name): keep whole characters, or
 * the encoder refuses it all. */
static char *error_object(const struct sbx_error *err)
{
    size_t n = strnlen(err->message, sizeof(err->message));
    n = utf8_valid_prefix((const unsigned char *)err->message, n);
    json_t *o = json_pack("{s:{s:s, s:s%}}", "error", "code", sbx_error_code_name(err->code),
                          "message", err->message, n);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

    json_decref(o);
    return s;
}

char *json_answer_error(const char *id_text, const struct sbx_error *err)
{
    return with_id(id_text, error_object(err));
}

char *json_event_output(const char *id_text, int stream, const char *text, size_t len)
{
    json_t *o =
        json_pack("{s:s, s:s%}", "event", stream == 1 ? "stdout" : "stderr", "data", text, len);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

    json_decref(o);
    return with_id(id_text, s);
}

char *json_event_dropped(const char *id_text, const uint64_t dropped[2])
{
    json_t *o = json_pack("{s:s, s:I, s:I}", "event", "dropped", "stdout", (json_int_t)dropped[0],
                          "stderr", (json_int_t)dropped[1]);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

    json_decref(o);
    return with_id(id_text, s);
}

char *json_event_tool_call(const char *id_text, uint64_t call, const char *name,
                           const char *arguments, size_t len)
{
    json_error_t e;
    json_t *args = json_loadb(arguments, len, 0, &e);
    json_t *o = args ? json_pack("{s:s, s:I, s:s, s:o}", "event", "tool_call", "call",
                                 (json_int_t)call, "name", name, "arguments", args)
                     : NULL;
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

    json_decref(o);
    return with_id(id_text, s);
}

char *json_event_started(const char *id_text, const char *run_id)
{
    json_t *o = json_pack("{s:s, s:s}", "event", "started", "run_id", run_id);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

    json_decref(o);
    return with_id(id_text, s);
}

char *json_answer_tool_result_error(const char *id_text, uint64_t call, const struct sbx_error *err)
{
    char *head = NULL, *out;

    if (asprintf(&head, "\"id\":null,\"tool_result\":{\"id\":%s,\"call\":%llu}",
                 id_text ? id_text : "null", (unsigned long long)call) < 0)
        return NULL;
    out = splice(head, error_object(err));
    free(head);
    return out;
}

char *json_answer_cancel_error(const char *cancel_text, const struct sbx_error *err)
{
    char *head = NULL;
    char *out;

    if (asprintf(&head, "\"id\":null,\"cancel\":%s", cancel_text) < 0)
        return NULL;
    out = splice(head, error_object(err));
    free(head);
    return out;
}
