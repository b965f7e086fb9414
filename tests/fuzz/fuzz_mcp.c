/* `pysbx mcp`: mcp_main itself, reading newline-delimited JSON-RPC on its
 * stdin (here a memfd holding the input) and answering on its stdout (a
 * memfd read back), over a backend that runs nothing but makes a result of
 * the request (its code as stdout, its files as artifacts) or refuses it,
 * and keeps sessions that count their cells (code "!!" loses one).
 * Every line out is a JSON-RPC 2.0 response, and every message that needs
 * an answer gets exactly one: as many responses as the input has
 * requests, unparsable or too long lines. */
#define _GNU_SOURCE
#include "commands.h"
#include "fuzz.h"
#include "sbxerr.h"
#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <jansson.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_LINE 512 /* small, so that inputs reach the too-long path */

static int in_fd = -1, out_fd = -1, saved_stdin = -1, saved_stdout = -1;

static int stub_run(void *self, const struct sbx_request *req, struct sbx_result **out,
                    struct sbx_error *err)
{
    (void)self;
    if (req->code_len > 0 && req->code[0] == '!')
        return sbx_fail(err, SBX_ERR_BUSY, -EBUSY, "refused: %.*s", (int)req->code_len, req->code);
    struct sbx_result *r = calloc(1, sizeof(*r));
    CHECK(r);
    r->status = (enum sbx_status)(req->code_len % 6);
    r->limit = r->status == SBX_TIMEOUT ? SBX_LIMIT_CPU : SBX_LIMIT_NONE;
    r->exit_code = r->status == SBX_COMPLETED ? (int)(req->code_len % 3) : -1;
    r->signal = r->status == SBX_CRASHED ? 31 : 0;
    /* Output as the library gives it: valid UTF-8. */
    r->stdout_len = utf8_valid_prefix((const unsigned char *)req->code, req->code_len);
    r->stdout_text = fuzz_string((const uint8_t *)req->code, r->stdout_len);
    r->stderr_text = fuzz_string((const uint8_t *)"", 0);
    if (r->status != SBX_COMPLETED)
        r->reason = strdup("stopped");
    r->artifacts = calloc(req->n_files + 1, sizeof(*r->artifacts));
    CHECK(r->artifacts);
    for (size_t i = 0; i < req->n_files; i++) {
        struct sbx_artifact *a = &r->artifacts[i];
        a->name = strdup(req->files[i].name);
        a->data = (unsigned char *)fuzz_copy(req->files[i].data, req->files[i].len);
        a->data_len = a->size = req->files[i].len;
        CHECK(a->name);
    }
    r->n_artifacts = req->n_files;
    *out = r;
    return 0;
}

struct stub_session {
    uint64_t cells;
};

static int stub_session_open(void *self, const struct sbx_session_limits *limits,
                             struct sbx_session **out, struct sbx_error *err)
{
    (void)self;
    (void)limits;
    (void)err;
    struct stub_session *s = calloc(1, sizeof(*s));
    CHECK(s);
    *out = (struct sbx_session *)s;
    return 0;
}

static int stub_session_run(struct sbx_session *session, const struct sbx_request *req,
                            enum sbx_rollback rollback, struct sbx_result **out,
                            struct sbx_error *err)
{
    struct stub_session *s = (struct stub_session *)session;

    if (req->code_len >= 2 && memcmp(req->code, "!!", 2) == 0)
        return sbx_fail(err, SBX_ERR_SESSION_LOST, -ENOLINK, "the session is gone");
    int rc = stub_run(NULL, req, out, err);
    if (rc == 0) {
        (*out)->cell = ++s->cells;
        (*out)->rolled_back = (*out)->status != SBX_COMPLETED ||
                              (rollback == SBX_ROLLBACK_ON_ERROR && (*out)->exit_code != 0);
    }
    return rc;
}

static void stub_session_close(struct sbx_session *s)
{
    free(s);
}

static struct sbx_backend backend = {.name = "stub",
                                     .run = stub_run,
                                     .session_open = stub_session_open,
                                     .session_run = stub_session_run,
                                     .session_close = stub_session_close};

static void setup(void)
{
    in_fd = memfd_create("mcp-in", MFD_CLOEXEC);
    out_fd = memfd_create("mcp-out", MFD_CLOEXEC);
    saved_stdin = dup(0);
    saved_stdout = dup(1);
    CHECK(in_fd >= 0 && out_fd >= 0 && saved_stdin >= 0 && saved_stdout >= 0);
}

/* Whether a line after |from| is a notifications/cancelled naming |id|. */
static bool cancelled_later(const uint8_t *data, size_t size, size_t from, json_t *id)
{
    bool named = false;

    for (size_t start = from; start < size && !named;) {
        const uint8_t *nl = memchr(data + start, '\n', size - start);
        size_t len = nl ? (size_t)(nl - (data + start)) : size - start;
        json_t *msg = len <= MAX_LINE ? json_loadb((const char *)data + start, len, 0, NULL) : NULL;
        const char *method = json_string_value(json_object_get(msg, "method"));
        named = method && strcmp(method, "notifications/cancelled") == 0 &&
                !json_object_get(msg, "id") &&
                json_equal(json_object_get(json_object_get(msg, "params"), "requestId"), id);
        json_decref(msg);
        start += len + 1;
    }
    return named;
}

/* How many answers |data| calls for, read independently of mcp.c: at most
 * that, and at least that less |*unanswerable|, the tool calls that a later
 * notifications/cancelled names (a call cancelled while in flight is never
 * answered; one that ended first was). */
static size_t expected_answers(const uint8_t *data, size_t size, size_t *unanswerable)
{
    size_t answers = 0;

    *unanswerable = 0;
    for (size_t start = 0; start < size;) {
        const uint8_t *nl = memchr(data + start, '\n', size - start);
        size_t len = nl ? (size_t)(nl - (data + start)) : size - start;
        const char *line = (const char *)data + start;
        start += len + 1;
        if (len > MAX_LINE) {
            answers++;
            continue;
        }
        if (len == 0)
            continue;
        json_error_t jerr;
        json_t *msg = json_loadb(line, len, 0, &jerr);
        if (!json_is_object(msg))
            answers++;
        else {
            json_t *id = json_object_get(msg, "id");
            const char *method = json_string_value(json_object_get(msg, "method"));
            if (method)
                answers += id != NULL;
            else
                answers +=
                    !(id && (json_object_get(msg, "result") || json_object_get(msg, "error")));
            if (method && id && strcmp(method, "tools/call") == 0 &&
                cancelled_later(data, size, start, id))
                (*unanswerable)++;
        }
        json_decref(msg);
    }
    return answers;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct mcp_opts o = {.backend = &backend, .max_line_bytes = MAX_LINE};

    if (in_fd < 0)
        setup();
    sbx_limits_init(&o.limits);
    CHECK(ftruncate(in_fd, 0) == 0 && lseek(in_fd, 0, SEEK_SET) == 0);
    CHECK(write_full(in_fd, data, size) == 0 && lseek(in_fd, 0, SEEK_SET) == 0);
    CHECK(ftruncate(out_fd, 0) == 0 && lseek(out_fd, 0, SEEK_SET) == 0);
    CHECK(dup2(in_fd, 0) == 0 && dup2(out_fd, 1) == 1);
    CHECK(mcp_main(&o) == 0);
    CHECK(dup2(saved_stdin, 0) == 0 && dup2(saved_stdout, 1) == 1);

    /* What it wrote: whole lines, each a response. */
    off_t end = lseek(out_fd, 0, SEEK_END);
    CHECK(end >= 0 && lseek(out_fd, 0, SEEK_SET) == 0);
    char *text = malloc((size_t)end + 1);
    CHECK(text && read_full(out_fd, text, (size_t)end) == (ssize_t)end);
    CHECK(end == 0 || text[end - 1] == '\n');
    size_t answers = 0;
    for (char *p = text; p < text + end;) {
        char *nl = memchr(p, '\n', (size_t)(text + end - p));
        json_error_t jerr;
        json_t *msg = json_loadb(p, (size_t)(nl - p), JSON_ALLOW_NUL, &jerr);
        CHECK(json_is_object(msg));
        CHECK(json_is_string(json_object_get(msg, "jsonrpc")) &&
              strcmp(json_string_value(json_object_get(msg, "jsonrpc")), "2.0") == 0);
        CHECK(json_object_get(msg, "id"));
        CHECK(!json_object_get(msg, "result") != !json_object_get(msg, "error"));
        json_decref(msg);
        answers++;
        p = nl + 1;
    }
    size_t unanswerable, expected = expected_answers(data, size, &unanswerable);
    CHECK(answers <= expected && answers + unanswerable >= expected);
    free(text);
    return 0;
}
