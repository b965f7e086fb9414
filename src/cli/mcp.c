/*
 * pysbx mcp: a Model Context Protocol server over stdio (newline-delimited
 * JSON-RPC 2.0) offering two tools: run_python, and reset_session for the
 * sessions run_python keeps when given a session_id (sessions.h: one table
 * for the process, the cells of a session run in the order they were
 * called). Calls run concurrently; a client's notifications/cancelled
 * cancels the call it names, which is then never answered (as the protocol
 * asks).
 */
#define _GNU_SOURCE
#include "commands.h"
#include "detach.h"
#include "drain.h"
#include "lines.h"
#include "reqjson.h"
#include "sbxerr.h"
#include "sessions.h"
#include "stopper.h"
#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PROTOCOL_LATEST "2025-06-18"

static const char *const protocols[] = {"2025-06-18", "2025-03-26", "2024-11-05"};

struct call {
    struct call *next;
    json_t *id;
    struct sbx_cancel *cancel;
    bool cancelled; /* by the client: its answer is not sent; under lock */
};

/* A call's output waiting to go out as progress notifications. */
struct progress {
    struct progress *next; /* in s->progressing while it has text waiting */
    json_t *token;         /* the call's progressToken */
    char *text;            /* waiting: text[0..len), whole UTF-8 characters */
    size_t len, cap;
    uint64_t sent;    /* notifications sent: each one's "progress" */
    uint64_t dropped; /* bytes past PROGRESS_BYTES, not sent */
    bool queued;      /* on s->progressing */
};

/* What one call may have waiting to go out as progress; past it, output is
 * counted and left to the call's result (which holds all of it). */
#define PROGRESS_BYTES (1u << 20)

struct server {
    const struct mcp_opts *o;
    pthread_mutex_t lock; /* output lines, calls, inflight */
    pthread_cond_t idle;
    unsigned inflight;
    struct call *calls;
    struct session_table *sessions;
    /* Progress: taken and written by the notifier under |lock|, so that a
     * call's notifications go out before its answer; put by the runs
     * under |plock| alone, which a blocked standard output never holds. */
    pthread_mutex_t plock;
    pthread_cond_t pwake;
    struct progress *progressing;
    bool pstop;
};

static char *message_text(json_t *msg)
{
    char *text = json_dumps(msg, JSON_COMPACT | JSON_REAL_PRECISION(10));

    json_decref(msg);
    return text;
}

/* Under s->lock: one whole line. */
static void write_line(char *text)
{
    if (!text)
        return;
    (void)write_full(1, text, strlen(text));
    (void)write_full(1, "\n", 1);
    free(text);
}

static void send_message(struct server *s, json_t *msg)
{
    char *text = message_text(msg);

    pthread_mutex_lock(&s->lock);
    write_line(text);
    pthread_mutex_unlock(&s->lock);
}

static json_t *response(json_t *id, json_t *result)
{
    return json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id, "result", result);
}

static void reply(struct server *s, json_t *id, json_t *result)
{
    send_message(s, response(id, result));
}

static void reply_error(struct server *s, json_t *id, int code, const char *message)
{
    send_message(s, json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id",
                              id ? id : json_null(), "error", "code", code, "message", message));
}

/* --- the tool ---------------------------------------------------------------- */

/* A file is text, or {"content": ..., "encoding": "utf-8" | "base64"}. */
static const char input_schema[] =
    "{\"type\": \"object\", \"required\": [\"code\"], \"properties\": {"
    "\"session_id\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 128, "
    "\"description\": \"Run the code as the next cell of this session (made on the first call "
    "with this id): variables, imports and files of the cells before it are there. Without it, "
    "the code runs in a fresh interpreter\"},"
    "\"fork_from\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 128, "
    "\"description\": \"With session_id: first make session_id a copy of this session as its "
    "last kept cell left it (variables, imports, files), then run the code there. session_id "
    "must not be open (reset_session it first); from then on each goes its own way, so that "
    "several continuations can be tried from one state\"},"
    "\"rollback\": {\"type\": \"string\", \"enum\": [\"on_error\", \"on_stop\", \"never\"], "
    "\"default\": \"on_error\", \"description\": \"With session_id: what a cell that fails does "
    "to the session. on_error: an exception or a non-zero exit puts the session back as it was "
    "before the cell; on_stop: only a cell the sandbox stopped (a limit, a crash) is undone, an "
    "exception keeps what ran before it; never: as on_stop, and a stopped cell keeps the files "
    "it wrote\"},"
    "\"code\": {\"type\": \"string\", \"description\": \"Python 3 source code to run\"},"
    "\"stdin\": {\"type\": \"string\", \"description\": \"The program's standard input, "
    "whole (without it, input() raises EOFError). Not with session_id\"},"
    "\"argv\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"maxItems\": 4096, "
    "\"description\": \"The program's arguments, sys.argv[1:]\"},"
    "\"files\": {\"type\": \"object\", \"description\": \"Input files, written to the working "
    "directory before the code runs; names may contain '/'. Each is its text, or {\\\"content\\\": "
    "..., \\\"encoding\\\": \\\"base64\\\"} for binary content\", \"additionalProperties\": "
    "{\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"object\", \"required\": [\"content\"], "
    "\"additionalProperties\": false, \"properties\": {\"content\": {\"type\": \"string\"}, "
    "\"encoding\": {\"type\": \"string\", \"enum\": [\"utf-8\", \"base64\"], "
    "\"default\": \"utf-8\"}}}]}}}, \"additionalProperties\": false}";

static json_t *tool_description(const struct sbx_limits *l, const char *const *packages)
{
    char desc[2048], has[512] = "the standard library only";
    size_t n = 0;

    /* "numpy, pandas (already imported) and the standard library; ..." */
    for (const char *const *p = packages; p && *p && n < sizeof(has); p++)
        n += (size_t)snprintf(has + n, sizeof(has) - n, "%s%s", p == packages ? "" : ", ", *p);
    if (n && n < sizeof(has))
        fmt(has + n, sizeof(has) - n,
            " (already imported) and the standard library; matplotlib figures left open or "
            "shown come back as PNG images");
    fmt(desc, sizeof(desc),
        "Run Python 3 code in a sandbox and get back its exit status, stdout, stderr, the "
        "value of its last line when that is an expression (as in a notebook) and the "
        "files it wrote. The sandbox has %s, no network, and an empty "
        "working directory (the input files, if any, are written there first). Limits: %g s "
        "of wall time, %g s of CPU, %llu MiB of memory, %llu characters of output per "
        "stream (a NUL byte in it shows as \\x00). Each call is a fresh interpreter, unless it "
        "gives a session_id: then it runs as the next cell of that session, with the variables, "
        "imports and files of the cells before it, and a cell that raises leaves the session as "
        "it was (the result says the cell's number and whether it was rolled back or kept); "
        "reset_session starts it afresh. Print what you want to see.",
        has, l->wall_seconds, l->cpu_seconds, (unsigned long long)(l->memory_bytes >> 20),
        (unsigned long long)l->max_output_chars);
    return json_pack("{s:s, s:s, s:s, s:o}", "name", "run_python", "title", "Run Python",
                     "description", desc, "inputSchema", json_loads(input_schema, 0, NULL));
}

static const char reset_schema[] =
    "{\"type\": \"object\", \"required\": [\"session_id\"], \"properties\": {"
    "\"session_id\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 128, "
    "\"description\": \"The session_id given to run_python\"}}, \"additionalProperties\": false}";

static json_t *reset_description(void)
{
    return json_pack("{s:s, s:s, s:s, s:o}", "name", "reset_session", "title",
                     "Reset a Python session", "description",
                     "Close the session that run_python calls with this session_id share: its "
                     "variables, imports and files are gone, and the next run_python with the id "
                     "starts a fresh one. An id with no open session is an error.",
                     "inputSchema", json_loads(reset_schema, 0, NULL));
}

/* An image is known by its first bytes, whatever its name says. */
static const char *image_type(const unsigned char *d, size_t len)
{
    static const struct {
        size_t at, len;
        const char *magic, *mime;
    } magics[] = {
        {0, 8, "\x89PNG\r\n\x1a\n", "image/png"},
        {0, 3, "\xff\xd8\xff", "image/jpeg"},
        {0, 6, "GIF87a", "image/gif"},
        {0, 6, "GIF89a", "image/gif"},
        {8, 4, "WEBP", "image/webp"},
    };
    for (size_t i = 0; i < ARRAY_SIZE(magics); i++)
        if (len >= magics[i].at + magics[i].len &&
            memcmp(d + magics[i].at, magics[i].magic, magics[i].len) == 0 &&
            (magics[i].at == 0 || memcmp(d, "RIFF", 4) == 0))
            return magics[i].mime;
    return NULL;
}

/* Other files: by name, for the text formats a client shows as such. */
static const char *text_type(const char *name)
{
    static const struct {
        const char *ext, *mime;
    } types[] = {
        {".svg", "image/svg+xml"}, {".csv", "text/csv"},     {".json", "application/json"},
        {".txt", "text/plain"},    {".md", "text/markdown"}, {".html", "text/html"},
        {".py", "text/x-python"},
    };
    const char *dot = strrchr(name, '.');
    for (size_t i = 0; dot && i < ARRAY_SIZE(types); i++)
        if (strcasecmp(dot, types[i].ext) == 0)
            return types[i].mime;
    return NULL;
}

static json_t *artifact_content(const struct sbx_artifact *a)
{
    const char *mime = image_type(a->data, a->data_len);
    bool image = mime != NULL;
    bool text = !image && utf8_valid_prefix(a->data, a->data_len) == a->data_len &&
                !memchr(a->data, '\0', a->data_len);
    if (!image && text)
        mime = text_type(a->name);
    char uri[4200];
    fmt(uri, sizeof(uri), "pysbx://artifact/%s", a->name);
    if (image && !a->truncated) {
        char *b64 = base64_encode(a->data, a->data_len, NULL);
        json_t *c =
            b64 ? json_pack("{s:s, s:s, s:s}", "type", "image", "data", b64, "mimeType", mime)
                : NULL;
        free(b64);
        return c;
    }
    if (!mime)
        mime = text ? "text/plain" : "application/octet-stream";
    if (text)
        return json_pack("{s:s, s:{s:s, s:s, s:s%}}", "type", "resource", "resource", "uri", uri,
                         "mimeType", mime, "text", (const char *)a->data, a->data_len);
    char *b64 = base64_encode(a->data, a->data_len, NULL);
    json_t *c = b64 ? json_pack("{s:s, s:{s:s, s:s, s:s}}", "type", "resource", "resource", "uri",
                                uri, "mimeType", mime, "blob", b64)
                    : NULL;
    free(b64);
    return c;
}

static void add_text(json_t *content, const char *text, size_t len)
{
    json_array_append_new(content, json_pack("{s:s, s:s%}", "type", "text", "text", text, len));
}

/* A stream's text after its heading; a NUL byte, which many clients would
 * take for the end of the text, shows as \x00 (the text stays whole). */
static void add_stream(json_t *content, const char *heading, const char *text, size_t len)
{
    size_t nuls = 0, hl = strlen(heading);
    for (size_t i = 0; i < len; i++)
        nuls += text[i] == '\0';
    char *t = malloc(hl + len + 3 * nuls + 1);
    if (!t)
        return;
    memcpy(t, heading, hl);
    size_t o = hl;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == '\0') {
            memcpy(t + o, "\\x00", 4);
            o += 4;
        } else
            t[o++] = text[i];
    }
    add_text(content, t, o);
    free(t);
}

/* A result of one text. */
static json_t *tool_text(const char *text, bool error)
{
    return json_pack("{s:[{s:s, s:s}], s:b}", "content", "type", "text", "text", text, "isError",
                     error);
}

/* "session: NAME, cell N, kept", or "..., rolled back" and, for a cell
 * that ran to its end (the status line says why the others stopped), why. */
static void add_session(json_t *content, const struct sbx_result *r, const char *session)
{
    static const char rolled[] = "rolled back";
    const char *why = r->rolled_back && r->status == SBX_COMPLETED ? r->reason : NULL;
    char line[1024];

    /* The library's reason may say "rolled back: ..." itself. */
    if (why && strncmp(why, rolled, strlen(rolled)) == 0)
        why += strlen(rolled) + (why[strlen(rolled)] == ':');
    while (why && *why == ' ')
        why++;
    fmt(line, sizeof(line), "session: %s, cell %llu, %s%s%s", session, (unsigned long long)r->cell,
        r->rolled_back ? rolled : "kept", why && *why ? ": " : "", why && *why ? why : "");
    add_text(content, line, strlen(line));
}

/* What the model sees: a status line, for a session cell what became of
 * it, stdout, stderr, then the files. */
static json_t *tool_result(const struct sbx_result *r, const char *session)
{
    json_t *content = json_array();
    char head[512];
    bool error = r->status != SBX_COMPLETED || r->exit_code != 0;

    if (r->status == SBX_COMPLETED && r->error_type)
        fmt(head, sizeof(head), "exit_code: %d (an uncaught exception: %.200s: %.200s)",
            r->exit_code, r->error_type, r->error_message);
    else if (r->status == SBX_COMPLETED)
        fmt(head, sizeof(head), "exit_code: %d%s", r->exit_code,
            r->exit_code == 1 ? " (an uncaught exception; see stderr)" : "");
    else if (r->status == SBX_TIMEOUT || r->status == SBX_MEMORY_LIMIT)
        fmt(head, sizeof(head),
            "sandbox_limit_exceeded: %s (limit: %s): %s; the output below "
            "is what the code wrote before it was stopped",
            sbx_status_name(r->status), sbx_limit_name(r->limit), r->reason);
    else
        fmt(head, sizeof(head), "%s: %s", sbx_status_name(r->status), r->reason ? r->reason : "");
    add_text(content, head, strlen(head));
    if (session)
        add_session(content, r, session);
    if (r->stdout_len)
        add_stream(content, "stdout:\n", r->stdout_text, r->stdout_len);
    if (r->stderr_len)
        add_stream(content, "stderr:\n", r->stderr_text, r->stderr_len);
    if (r->value)
        add_stream(content, "value:\n", r->value, r->value_len);
    for (size_t i = 0; i < r->n_artifacts; i++) {
        const struct sbx_artifact *a = &r->artifacts[i];
        char *note = NULL;
        if (asprintf(&note, "file %s (%llu bytes%s)", a->name, (unsigned long long)a->size,
                     a->truncated ? ", cut to the size limit" : "") >= 0) {
            add_text(content, note, strlen(note));
            free(note);
        }
        json_t *c = artifact_content(a);
        if (c)
            json_array_append_new(content, c);
    }
    for (size_t i = 0; i < r->n_dropped; i++) {
        const struct sbx_dropped_artifact *d = &r->dropped[i];
        char *note = NULL;
        if (asprintf(&note, "not returned: %s (%s)", d->name, sbx_drop_reason_name(d->reason)) >=
            0) {
            add_text(content, note, strlen(note));
            free(note);
        }
    }
    if (r->artifacts_dropped > r->n_dropped) {
        fmt(head, sizeof(head), "%llu more files not returned",
            (unsigned long long)(r->artifacts_dropped - r->n_dropped));
        add_text(content, head, strlen(head));
    }
    return json_pack("{s:o, s:b}", "content", content, "isError", error);
}

struct call_job {
    struct server *s;
    struct progress progress; /* token NULL: the call asked for none */
    json_t *id;
    json_t *args;
    struct call call;
    const char *session; /* in args, or NULL */
    enum sbx_rollback rollback;
    struct session_cell *cell; /* its place in the session's line, until it runs */
    const char *fork_from;     /* in args, or NULL */
    struct session_cell *fork_from_cell, *fork_to_cell; /* the branch's places, until made */
};

static void call_job_free(struct call_job *j)
{
    json_decref(j->progress.token);
    free(j->progress.text);
    session_leave(j->fork_from_cell);
    session_leave(j->fork_to_cell);
    session_leave(j->cell);
    sbx_cancel_free(j->call.cancel);
    json_decref(j->id);
    json_decref(j->args);
    free(j);
}

static void forget_call(struct server *s, struct call *c)
{
    for (struct call **pp = &s->calls; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
}

/* The tool's files as a request's: text under "files", the ones the caller
 * sent as base64 under "files_base64" (call_tool checked their shape). */
static json_t *request_for(json_t *args)
{
    json_t *files = json_object(), *b64 = json_object(), *v;
    const char *name;

    json_object_foreach(json_object_get(args, "files"), name, v)
    {
        json_t *content = json_is_string(v) ? v : json_object_get(v, "content");
        const char *enc = json_string_value(json_object_get(v, "encoding"));
        json_object_set(enc && strcmp(enc, "base64") == 0 ? b64 : files, name, content);
    }
    json_t *req = json_pack("{s:O, s:o, s:o, s:o}", "code", json_object_get(args, "code"), "files",
                            files, "files_base64", b64, "limits", json_object());
    /* As given: the request's parser checks them as it does any request's. */
    static const char *const passed[] = {"stdin", "argv"};
    for (size_t i = 0; req && i < ARRAY_SIZE(passed); i++)
        if (json_object_get(args, passed[i]) &&
            json_object_set(req, passed[i], json_object_get(args, passed[i])) < 0) {
            json_decref(req);
            req = NULL;
        }
    return req;
}

/* --- progress: the output as it comes ----------------------------------------- */

/* on_output of a call that carries a progressToken, in its run's thread:
 * never waits for standard output. */
static void progress_output(void *user, int stream, const char *text, size_t len)
{
    struct call_job *j = user;
    struct server *s = j->s;
    struct progress *p = &j->progress;

    (void)stream; /* stdout and stderr interleaved, as a terminal shows them */
    pthread_mutex_lock(&s->plock);
    if (p->len + len > PROGRESS_BYTES)
        p->dropped += len;
    else {
        if (p->len + len > p->cap) {
            size_t cap = p->cap ? p->cap : 4096;
            while (cap < p->len + len)
                cap *= 2;
            char *t = realloc(p->text, cap);
            if (t) {
                p->text = t;
                p->cap = cap;
            }
        }
        if (p->len + len <= p->cap) {
            memcpy(p->text + p->len, text, len);
            p->len += len;
        } else
            p->dropped += len;
    }
    if (!p->queued && (p->len || p->dropped)) {
        p->queued = true;
        p->next = s->progressing;
        s->progressing = p;
        pthread_cond_signal(&s->pwake);
    }
    pthread_mutex_unlock(&s->plock);
}

/* Writes what |p| has waiting as one notification. Under s->lock and
 * s->plock (taken in that order); leaves |p| empty and off the list. */
static void progress_flush_locked(struct server *s, struct progress *p)
{
    for (struct progress **pp = &s->progressing; p->queued && *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            p->queued = false;
            break;
        }
    if (!p->len && !p->dropped)
        return;
    char note[96] = "";
    if (p->dropped)
        fmt(note, sizeof(note), "[pysbx: %llu bytes of output not sent as progress]\n",
            (unsigned long long)p->dropped);
    char *msg = NULL;
    if (asprintf(&msg, "%.*s%s", (int)p->len, p->text ? p->text : "", note) >= 0)
        write_line(
            message_text(json_pack("{s:s, s:s, s:{s:O, s:I, s:s}}", "jsonrpc", "2.0", "method",
                                   "notifications/progress", "params", "progressToken", p->token,
                                   "progress", (json_int_t)++p->sent, "message", msg)));
    free(msg);
    p->len = 0;
    p->dropped = 0;
}

/* The notifier: sends each call's waiting output, one call at a time. */
static void *notifier_main(void *arg)
{
    struct server *s = arg;

    for (;;) {
        pthread_mutex_lock(&s->plock);
        while (!s->progressing && !s->pstop)
            pthread_cond_wait(&s->pwake, &s->plock);
        bool stop = !s->progressing;
        pthread_mutex_unlock(&s->plock);
        if (stop)
            return NULL;
        pthread_mutex_lock(&s->lock);
        pthread_mutex_lock(&s->plock);
        if (s->progressing)
            progress_flush_locked(s, s->progressing);
        pthread_mutex_unlock(&s->plock);
        pthread_mutex_unlock(&s->lock);
    }
}

static void *run_call(void *p)
{
    struct call_job *j = p;
    struct server *s = j->s;
    struct json_request r;
    struct sbx_result *res = NULL;
    struct sbx_error err = {0};
    json_t *req = request_for(j->args), *result;
    int rc = -EINVAL;

    memset(&r, 0, sizeof(r));
    /* The tool's own limits, whatever the model asks. */
    if (req && json_request_from(req, NULL, &r, &err) == 0) {
        r.req.limits = s->o->limits;
        r.req.cancel = j->call.cancel;
        if (j->progress.token) {
            r.req.on_output = progress_output;
            r.req.user = j;
        }
        rc = sbx_request_check(&r.req, &err);
    }
    /* fork_from: the branch first, at its turn; the cell runs in it. */
    if (rc == 0 && j->fork_to_cell) {
        uint64_t cells;
        rc = session_fork(j->fork_from_cell, j->fork_to_cell, &cells, &err);
        j->fork_from_cell = j->fork_to_cell = NULL; /* given up */
    }
    if (rc == 0 && j->cell) {
        rc = session_run(j->cell, &r.req, j->rollback, &res, NULL, &err);
        j->cell = NULL; /* its place is given up */
    } else if (rc == 0)
        rc = s->o->backend->run(s->o->backend->self, &r.req, &res, &err);
    if (rc == 0)
        result = tool_result(res, j->session);
    else if (err.code == SBX_ERR_SESSION_LOST) {
        char text[512];
        fmt(text, sizeof(text),
            "session_lost: %s; the next run_python with this session_id starts a new session",
            err.message);
        result = tool_text(text, true);
    } else
        result = tool_text(err.message[0] ? err.message : "bad arguments", true);
    char *text = message_text(response(j->id, result));
    if (req)
        json_request_free(&r);
    json_decref(req);
    sbx_result_free(res);
    pthread_mutex_lock(&s->lock);
    /* Its last progress first; none at all for a call the client
     * cancelled, and no answer: it has stopped waiting. */
    pthread_mutex_lock(&s->plock);
    if (j->call.cancelled)
        j->progress.len = j->progress.dropped = 0;
    progress_flush_locked(s, &j->progress);
    pthread_mutex_unlock(&s->plock);
    if (j->call.cancelled)
        free(text);
    else
        write_line(text);
    forget_call(s, &j->call);
    s->inflight--;
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->lock);
    call_job_free(j);
    return NULL;
}

/* reset_session: answered at once; the cells called before it still run,
 * then the session ends. */
/* As the schemas say (additionalProperties: false): an argument that is
 * not a property of the tool's input schema is refused, not ignored (a
 * misspelt "sesion_id" would otherwise run the code outside its session).
 * The schema is the one list of what a tool takes. Replies and returns
 * true. */
static bool unknown_argument(struct server *s, json_t *id, json_t *args, const char *tool,
                             const char *schema)
{
    json_t *doc = json_loads(schema, 0, NULL), *props = json_object_get(doc, "properties"), *v;
    const char *key, *unknown = NULL;

    json_object_foreach(args, key, v)
    {
        if (!json_object_get(props, key)) {
            unknown = key;
            break;
        }
    }
    if (unknown) {
        char text[512], listed[256] = "";
        size_t n = 0;
        json_object_foreach(props, key, v)
        {
            fmt(listed + n, sizeof(listed) - n, "%s%s", n ? ", " : "", key);
            n += strlen(listed + n);
        }
        fmt(text, sizeof(text), "%s has no argument '%.128s' (it takes %s)", tool, unknown, listed);
        reply_error(s, id, -32602, text);
    }
    json_decref(doc);
    return unknown != NULL;
}

static void reset_session(struct server *s, json_t *id, json_t *args)
{
    struct sbx_error err = {0};
    const char *name;
    char text[512];

    if (json_is_object(args) && unknown_argument(s, id, args, "reset_session", reset_schema))
        return;
    if (json_session_name(args, "session_id", &name, &err) < 0) {
        reply_error(s, id, -32602, err.message);
        return;
    }
    if (session_close(s->sessions, name, &err) < 0) {
        reply(s, id, tool_text(err.message, true));
        return;
    }
    fmt(text, sizeof(text),
        "session %s closed: the next run_python with this session_id starts a new one", name);
    reply(s, id, tool_text(text, false));
}

static void call_tool(struct server *s, json_t *id, json_t *params)
{
    const char *name = json_string_value(json_object_get(params, "name"));
    json_t *args = json_object_get(params, "arguments");
    struct sbx_error err = {0};

    if (name && strcmp(name, "reset_session") == 0) {
        reset_session(s, id, args);
        return;
    }
    if (!name || strcmp(name, "run_python") != 0) {
        reply_error(s, id, -32602, "unknown tool");
        return;
    }
    if (!json_is_object(args) || !json_is_string(json_object_get(args, "code"))) {
        reply_error(s, id, -32602, "run_python needs {\"code\": string}");
        return;
    }
    if (unknown_argument(s, id, args, "run_python", input_schema))
        return;
    json_t *files = json_object_get(args, "files"), *v;
    const char *fname;
    if (files && !json_is_object(files)) {
        reply_error(s, id, -32602, "files must be an object of name: text");
        return;
    }
    json_object_foreach(files, fname, v)
    {
        const char *enc = json_string_value(json_object_get(v, "encoding"));
        if (json_is_string(v) ||
            (json_is_object(v) && json_is_string(json_object_get(v, "content")) &&
             json_object_size(v) == 1u + (json_object_get(v, "encoding") != NULL) &&
             (!json_object_get(v, "encoding") ||
              (enc && (strcmp(enc, "utf-8") == 0 || strcmp(enc, "base64") == 0)))))
            continue;
        reply_error(s, id, -32602,
                    "each file is its text, or {\"content\": string, \"encoding\": \"utf-8\" | "
                    "\"base64\"}");
        return;
    }
    const char *session;
    enum sbx_rollback rollback;
    if (json_session_fields(args, "session_id", &session, &rollback, &err) < 0) {
        reply_error(s, id, -32602, err.message);
        return;
    }
    const char *fork_from = NULL;
    if (json_object_get(args, "fork_from") &&
        (json_session_name(args, "fork_from", &fork_from, &err) < 0 || !session ||
         strcmp(fork_from, session) == 0)) {
        reply_error(s, id, -32602,
                    err.message[0] ? err.message
                                   : "fork_from goes with a session_id of another session: the "
                                     "one made a copy of it");
        return;
    }
    struct call_job *j = calloc(1, sizeof(*j));
    if (!j || !(j->call.cancel = sbx_cancel_new())) {
        free(j);
        reply_error(s, id, -32603, "out of memory");
        return;
    }
    j->s = s;
    j->progress.token =
        json_incref(json_object_get(json_object_get(params, "_meta"), "progressToken"));
    j->id = json_incref(id);
    j->args = json_incref(args);
    j->call.id = j->id;
    j->session = session;
    j->rollback = rollback;
    j->fork_from = fork_from;
    /* In the session's line now: its cells run in the order called (a
     * branch first takes its places in both lines, then the cell's). */
    if ((fork_from && session_enter_fork(s->sessions, fork_from, session, &j->fork_from_cell,
                                         &j->fork_to_cell, &err) < 0) ||
        (session && session_enter(s->sessions, session, 0, &j->cell, &err) < 0)) {
        reply(s, id, tool_text(err.message, true));
        call_job_free(j);
        return;
    }
    pthread_mutex_lock(&s->lock);
    j->call.next = s->calls;
    s->calls = &j->call;
    s->inflight++;
    pthread_mutex_unlock(&s->lock);
    if (start_pooled(run_call, j) < 0) {
        pthread_mutex_lock(&s->lock);
        forget_call(s, &j->call);
        s->inflight--;
        pthread_mutex_unlock(&s->lock);
        reply_error(s, id, -32603, "cannot start a thread");
        call_job_free(j);
    }
}

static void cancel_call(struct server *s, json_t *params)
{
    json_t *id = json_object_get(params, "requestId");
    pthread_mutex_lock(&s->lock);
    for (struct call *c = s->calls; id && c; c = c->next)
        if (json_equal(c->id, id)) {
            c->cancelled = true;
            sbx_cancel_fire(c->cancel);
        }
    pthread_mutex_unlock(&s->lock);
}

static void initialize(struct server *s, json_t *id, json_t *params)
{
    const char *asked = json_string_value(json_object_get(params, "protocolVersion"));
    const char *version = PROTOCOL_LATEST;
    for (size_t i = 0; asked && i < ARRAY_SIZE(protocols); i++)
        if (strcmp(asked, protocols[i]) == 0)
            version = protocols[i];
    reply(s, id,
          json_pack("{s:s, s:{s:{s:b}}, s:{s:s, s:s}, s:s}", "protocolVersion", version,
                    "capabilities", "tools", "listChanged", false, "serverInfo", "name", "pysbx",
                    "version", PYSBX_VERSION, "instructions",
                    "run_python runs Python code in a fresh sandbox per call, or, given a "
                    "session_id, as the next cell of that session; reset_session closes one."));
}

static void dispatch(struct server *s, json_t *msg)
{
    json_t *id = json_object_get(msg, "id");
    const char *method = json_string_value(json_object_get(msg, "method"));
    json_t *params = json_object_get(msg, "params");

    if (!method) {
        if (id && (json_object_get(msg, "result") || json_object_get(msg, "error")))
            return; /* a response to us: we send no requests */
        reply_error(s, id, -32600, "invalid request");
        return;
    }
    if (!id) { /* a notification */
        if (strcmp(method, "notifications/cancelled") == 0)
            cancel_call(s, params);
        return;
    }
    if (strcmp(method, "initialize") == 0)
        initialize(s, id, params);
    else if (strcmp(method, "ping") == 0)
        reply(s, id, json_object());
    else if (strcmp(method, "tools/list") == 0)
        reply(s, id,
              json_pack("{s:[o, o]}", "tools", tool_description(&s->o->limits, s->o->packages),
                        reset_description()));
    else if (strcmp(method, "tools/call") == 0)
        call_tool(s, id, params);
    else
        reply_error(s, id, -32601, "method not found");
}

/* --state-dir: the sessions' images are of one tenant, whoever runs
 * pysbx mcp with the directory (the directory's lock lets one process use
 * it at a time; its mode, 0700, whose files they are). */
static int keep_sessions(struct server *s, struct session_idler **idler)
{
    uint8_t tenant[STATE_TENANT_BYTES];

    *idler = NULL;
    if (!s->o->state)
        return 0;
    if (state_dir_tenant(s->o->state, "mcp", "", 0, tenant) < 0) {
        fputs("pysbx mcp: out of memory\n", stderr);
        return -1;
    }
    session_table_hibernate_to(s->sessions, s->o->state, tenant);
    if (s->o->hibernate_after &&
        !(*idler = session_idler_start(&s->sessions, 1, s->o->hibernate_after))) {
        fputs("pysbx mcp: cannot start a thread\n", stderr);
        return -1;
    }
    return 0;
}

int mcp_main(const struct mcp_opts *o)
{
    struct server s = {.o = o};
    struct session_idler *idler = NULL;
    struct sbx_session_limits sl;
    struct line_reader lr;
    const char *line;
    size_t len;
    enum line_result lres;

    /* A session's processes get the tool's memory, as every call does. */
    sl = o->session_limits;
    sl.memory_bytes = o->limits.memory_bytes;
    if (!(s.sessions = session_table_new(o->backend, &sl))) {
        fputs("pysbx mcp: out of memory\n", stderr);
        return EXIT_FAILURE;
    }
    if (keep_sessions(&s, &idler) < 0) {
        session_table_free(s.sessions);
        return EXIT_FAILURE;
    }
    pthread_mutex_init(&s.lock, NULL);
    pthread_cond_init(&s.idle, NULL);
    pthread_mutex_init(&s.plock, NULL);
    pthread_cond_init(&s.pwake, NULL);
    pthread_t notifier;
    if (pthread_create(&notifier, NULL, notifier_main, &s) != 0) {
        fputs("pysbx mcp: cannot start a thread\n", stderr);
        session_idler_stop(idler);
        session_table_free(s.sessions);
        return EXIT_FAILURE;
    }
    line_reader_init(&lr, 0, o->max_line_bytes);
    /* SIGINT, SIGTERM, SIGHUP: no more input; the calls in flight are
     * cancelled and answered, and the sandbox is closed on the way out. */
    if (stopper_start())
        lr.stop_fd = stopper_fd();
    while ((lres = line_next(&lr, &line, &len)) != LINE_END && lres != LINE_ERROR) {
        if (lres == LINE_TOO_LONG) {
            reply_error(&s, NULL, -32600, "message too long");
            continue;
        }
        if (len == 0)
            continue;
        json_error_t jerr;
        json_t *msg = json_loadb(line, len, 0, &jerr);
        if (!msg || !json_is_object(msg)) {
            reply_error(&s, NULL, msg ? -32600 : -32700, msg ? "invalid request" : "parse error");
            json_decref(msg);
            continue;
        }
        dispatch(&s, msg);
        json_decref(msg);
    }
    line_reader_free(&lr);
    /* End of input: answer what is in flight, then go. */
    pthread_mutex_lock(&s.lock);
    if (stopper_signal())
        for (struct call *c = s.calls; c; c = c->next)
            sbx_cancel_fire(c->cancel);
    while (s.inflight > 0)
        pthread_cond_wait(&s.idle, &s.lock);
    pthread_mutex_unlock(&s.lock);
    pthread_mutex_lock(&s.plock);
    s.pstop = true;
    pthread_cond_signal(&s.pwake);
    pthread_mutex_unlock(&s.plock);
    pthread_join(notifier, NULL);
    /* No call holds a session now: with --state-dir each is written there
     * (its processes end), whatever ended the input; then the rest are
     * closed, before the backend is. */
    hibernate_at_exit(&s.sessions, 1, idler, -1);
    session_table_free(s.sessions);
    pthread_mutex_destroy(&s.lock);
    pthread_cond_destroy(&s.idle);
    pthread_mutex_destroy(&s.plock);
    pthread_cond_destroy(&s.pwake);
    return stopper_signal() ? 128 + stopper_signal() : 0;
}
