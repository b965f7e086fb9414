/* pysbx run --connect: one request to a running `pysbx serve --listen`. */
#define _GNU_SOURCE
#include "connect.h"

#include "options.h"
#include "sbxerr.h"
#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* The longest answer line taken from a server: outputs and artifacts at the
 * library's ceilings, base64-encoded, fit well within it. */
#define ANSWER_MAX (1ULL << 30)

static const char *const limit_keys[GIVEN_COUNT] = {
    "wall_seconds",
    "cpu_seconds",
    "memory_bytes",
    "max_output_chars",
    "max_artifact_bytes",
    "max_artifacts",
    "max_artifacts_total_bytes",
};

static json_t *request_json(const struct sbx_request *req, unsigned given, struct sbx_error *err)
{
    const struct sbx_limits *l = &req->limits;
    const double values[GIVEN_COUNT] = {
        l->wall_seconds,
        l->cpu_seconds,
        (double)l->memory_bytes,
        (double)l->max_output_chars,
        (double)l->max_artifact_bytes,
        (double)l->max_artifacts,
        (double)l->max_artifacts_total_bytes,
    };
    json_t *o = json_object(), *files = json_object(), *limits = json_object();
    json_t *code = json_stringn(req->code, req->code_len);

    json_t *c;

    if (!code) {
        sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                 "--connect sends the program as JSON text: it must be valid UTF-8");
        goto fail;
    }
    /* json_object_set_new takes the value even when it fails. */
    c = code;
    code = NULL;
    if (!o || !files || !limits || json_object_set_new(o, "id", json_integer(1)) < 0 ||
        json_object_set_new(o, "code", c) < 0)
        goto nomem;
    for (size_t i = 0; i < req->n_files; i++) {
        char *b64 = base64_encode(req->files[i].data, req->files[i].len, NULL);
        if (!b64 || json_object_set_new(files, req->files[i].name, json_string(b64)) < 0) {
            free(b64);
            goto nomem;
        }
        free(b64);
    }
    /* Only the limits the command line set: the server's own defaults (and
     * ceilings) hold for the rest. */
    for (int i = 0; i < GIVEN_COUNT; i++)
        if (given & (1u << i) &&
            json_object_set_new(limits, limit_keys[i],
                                i <= GIVEN_CPU ? json_real(values[i])
                                               : json_integer((json_int_t)values[i])) < 0)
            goto nomem;
    json_t *f = files, *lim = limits;
    files = limits = NULL;
    if (json_object_set_new(o, "files_base64", f) < 0 || json_object_set_new(o, "limits", lim) < 0)
        goto nomem;
    if (req->argc) {
        json_t *args = json_array();
        if (!args || json_object_set_new(o, "argv", args) < 0)
            goto nomem;
        for (size_t i = 0; i < req->argc; i++)
            if (json_array_append_new(args, json_string(req->argv[i])) < 0)
                goto nomem;
    }
    if (req->filename && json_object_set_new(o, "filename", json_string(req->filename)) < 0)
        goto nomem;
    if (req->stdin_len) {
        char *b64 = base64_encode(req->stdin_data, req->stdin_len, NULL);
        int rc = b64 ? json_object_set_new(o, "stdin_base64", json_string(b64)) : -1;
        free(b64);
        if (rc < 0)
            goto nomem;
    }
    return o;
nomem:
    sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
fail:
    json_decref(code);
    json_decref(files);
    json_decref(limits);
    json_decref(o);
    return NULL;
}

/* The enum value whose name |name(i)| is |s|, or |fallback|. */
static int lookup(const char *s, const char *(*name)(int), int n, int fallback)
{
    for (int i = 0; s && i < n; i++) {
        const char *v = name(i);
        if (v && strcmp(v, s) == 0)
            return i;
    }
    return fallback;
}

static const char *status_name(int i)
{
    return sbx_status_name((enum sbx_status)i);
}

static const char *drop_reason_name(int i)
{
    return sbx_drop_reason_name((enum sbx_drop_reason)i);
}

static const char *limit_name(int i)
{
    return sbx_limit_name((enum sbx_limit_kind)i);
}

static const char *code_name(int i)
{
    return sbx_error_code_name((enum sbx_error_code)i);
}

/* "SIGSEGV" (or "SIG11") to 11; 0 when it is neither. */
static int signal_number(const char *s)
{
    if (!s || strncmp(s, "SIG", 3) != 0)
        return 0;
    for (int sig = 1; sig < NSIG; sig++) {
        const char *abbrev = sigabbrev_np(sig);
        if (abbrev && strcmp(abbrev, s + 3) == 0)
            return sig;
    }
    return atoi(s + 3);
}

static char *text_of(json_t *o, const char *key, size_t *len)
{
    json_t *v = json_object_get(o, key);
    size_t n = json_is_string(v) ? json_string_length(v) : 0;
    char *t = malloc(n + 1);

    if (t) {
        memcpy(t, n ? json_string_value(v) : "", n);
        t[n] = '\0';
    }
    if (len)
        *len = n;
    return t;
}

/* The bytes of an answer's name: its "name_base64" when it has one (a name
 * the server escaped), else |name| itself. NULL when that is not a name. */
static char *raw_name_of(json_t *o, char *name)
{
    const char *b64 = json_string_value(json_object_get(o, "name_base64"));
    size_t len;

    if (!name || !b64)
        return name;
    char *raw = (char *)base64_decode(b64, strlen(b64), &len);
    char *z = raw ? realloc(raw, len + 1) : NULL;
    if (!z || len == 0 || memchr(z, '\0', len)) {
        free(z ? z : raw);
        return NULL;
    }
    z[len] = '\0';
    return z;
}

static int dropped_from(json_t *arr, struct sbx_result *r)
{
    size_t n = json_array_size(arr);

    r->dropped = n ? calloc(n, sizeof(*r->dropped)) : NULL;
    if (n && !r->dropped)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        json_t *d = json_array_get(arr, i);
        struct sbx_dropped_artifact *out = &r->dropped[r->n_dropped];
        const char *why = json_string_value(json_object_get(d, "reason"));
        out->name = text_of(d, "name", NULL);
        out->raw_name = raw_name_of(d, out->name);
        out->size = (uint64_t)json_integer_value(json_object_get(d, "size"));
        out->reason = (enum sbx_drop_reason)lookup(why, drop_reason_name, SBX_DROP_LINKED + 1, 0);
        r->n_dropped++;
        if (!out->name || !out->raw_name || out->reason == 0)
            return -EPROTO;
    }
    return 0;
}

static int artifacts_from(json_t *arr, struct sbx_result *r)
{
    size_t n = json_array_size(arr);

    r->artifacts = n ? calloc(n, sizeof(*r->artifacts)) : NULL;
    if (n && !r->artifacts)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        json_t *a = json_array_get(arr, i);
        const char *b64 = json_string_value(json_object_get(a, "content_base64"));
        struct sbx_artifact *out = &r->artifacts[r->n_artifacts];
        out->name = text_of(a, "name", NULL);
        out->raw_name = raw_name_of(a, out->name);
        out->data = b64 ? base64_decode(b64, strlen(b64), &out->data_len) : NULL;
        out->size = (uint64_t)json_integer_value(json_object_get(a, "size"));
        out->truncated = json_is_true(json_object_get(a, "truncated"));
        r->n_artifacts++;
        if (!out->name || !out->raw_name || !out->data)
            return -EPROTO;
    }
    return 0;
}

/* The answer object as the library's result; -EPROTO when it is not one. */
static int result_from(json_t *o, struct sbx_result **out)
{
    struct sbx_result *r = calloc(1, sizeof(*r));
    json_t *stats = json_object_get(o, "stats");
    json_t *code = json_object_get(o, "exit_code");
    const char *status = json_string_value(json_object_get(o, "status"));

    if (!r)
        return -ENOMEM;
    *out = r;
    r->status = (enum sbx_status)lookup(status, status_name, SBX_SANDBOX_ERROR + 1, -1);
    r->limit = (enum sbx_limit_kind)lookup(json_string_value(json_object_get(o, "limit")),
                                           limit_name, SBX_LIMIT_MEMORY + 1, SBX_LIMIT_NONE);
    r->exit_code = json_is_integer(code) ? (int)json_integer_value(code) : -1;
    r->signal = signal_number(json_string_value(json_object_get(o, "signal")));
    r->stdout_text = text_of(o, "stdout", &r->stdout_len);
    r->stderr_text = text_of(o, "stderr", &r->stderr_len);
    r->stdout_truncated = json_is_true(json_object_get(o, "stdout_truncated"));
    r->stderr_truncated = json_is_true(json_object_get(o, "stderr_truncated"));
    r->partial = json_is_true(json_object_get(o, "partial"));
    r->artifacts_dropped = (uint64_t)json_integer_value(json_object_get(o, "artifacts_dropped"));
    r->wall_ms = json_number_value(json_object_get(stats, "wall_ms"));
    r->cpu_ms = json_number_value(json_object_get(stats, "cpu_ms"));
    r->max_rss_kb = (long)json_integer_value(json_object_get(stats, "max_rss_kb"));
    if (json_is_string(json_object_get(o, "reason")))
        r->reason = text_of(o, "reason", NULL);
    if (json_is_string(json_object_get(o, "value")))
        r->value = text_of(o, "value", &r->value_len);
    json_t *error = json_object_get(o, "error");
    if (json_is_object(error)) {
        r->error_type = text_of(error, "type", NULL);
        r->error_message = text_of(error, "message", NULL);
        r->error_traceback = text_of(error, "traceback", NULL);
        if (!r->error_type || !r->error_message || !r->error_traceback)
            return -EPROTO;
    }
    if ((int)r->status < 0 || !r->stdout_text || !r->stderr_text)
        return -EPROTO;
    int rc = dropped_from(json_object_get(o, "dropped_artifacts"), r);
    return rc < 0 ? rc : artifacts_from(json_object_get(o, "artifacts"), r);
}

/* The whole of |buf|, without SIGPIPE should the server be gone. */
static int send_all(int fd, const char *buf, size_t len)
{
    while (len) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Reads one line (without its newline) of at most ANSWER_MAX bytes. */
static int read_line(int fd, char **line, size_t *len)
{
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);

    while (buf) {
        char *nl = n ? memchr(buf, '\n', n) : NULL;
        if (nl) {
            *line = buf;
            *len = (size_t)(nl - buf);
            return 0;
        }
        if (n == cap) {
            if (cap >= ANSWER_MAX)
                break;
            char *b = realloc(buf, cap *= 2);
            if (!b)
                break;
            buf = b;
        }
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            free(buf);
            return got < 0 ? -errno : -ECONNRESET;
        }
        n += (size_t)got;
    }
    free(buf);
    return -E2BIG;
}

static int open_socket(const char *path, struct sbx_error *err)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};

    if (strlen(path) >= sizeof(sa.sun_path))
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -ENAMETOOLONG,
                        "--connect %s: the socket path is too long", path);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -e, "--connect %s: %s", path, strerror(e));
    }
    return fd;
}

int remote_run(const char *path, const struct sbx_request *req, unsigned given,
               struct sbx_result **res, struct sbx_error *err)
{
    json_t *rq = request_json(req, given, err), *answer = NULL;
    char *text = rq ? json_dumps(rq, JSON_COMPACT) : NULL;
    char *line = NULL;
    size_t len = 0;
    int fd = -1, rc;

    *res = NULL;
    json_decref(rq);
    if (!text) {
        rc = rq ? sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory") : -EINVAL;
        goto out;
    }
    if ((fd = rc = open_socket(path, err)) < 0)
        goto out;
    size_t tlen = strlen(text);
    text[tlen] = '\n'; /* json_dumps's NUL becomes the line's end */
    if ((rc = send_all(fd, text, tlen + 1)) < 0 || (rc = read_line(fd, &line, &len)) < 0) {
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "--connect %s: the server did not answer: %s",
                      path, strerror(-rc));
        goto out;
    }
    json_error_t jerr;
    answer = json_loadb(line, len, 0, &jerr);
    /* A refusal: an error and no status (a result's error is its code's). */
    json_t *error = json_object_get(answer, "error");
    if (json_is_object(error) && !json_object_get(answer, "status")) {
        const char *msg = json_string_value(json_object_get(error, "message"));
        rc = sbx_fail(err,
                      (enum sbx_error_code)lookup(json_string_value(json_object_get(error, "code")),
                                                  code_name, SBX_ERR_BUSY + 1, SBX_ERR_UNAVAILABLE),
                      -EINVAL, "%s", msg ? msg : "refused by the server");
        goto out;
    }
    rc = json_is_object(answer) ? result_from(answer, res) : -EPROTO;
    if (rc < 0) {
        sbx_result_free(*res);
        *res = NULL;
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "--connect %s: not a pysbx answer", path);
    }
out:
    json_decref(answer);
    free(line);
    free(text);
    if (fd >= 0)
        close(fd);
    return rc;
}
