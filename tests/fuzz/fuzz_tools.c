/* The host tools' channel as the worst code would use it: the input is what
 * the code writes on its socket (the first byte sets max_tool_calls). The
 * supervisor's side (src/lib/tools.c) must hand the caller only calls of a
 * declared name, numbered 1, 2, ... in order, at most max_tool_calls, each
 * with a JSON object of arguments of at most max_tool_bytes; and everything
 * it writes back to the code must be whole frames, each a JSON object with
 * an integer "call" no larger than the calls it read and either "content"
 * or "error". The caller here answers every other call, fails the rest. */
#define _GNU_SOURCE
#include "fuzz.h"
#include "tools.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

struct caller {
    struct sbx_tool_answers *answers;
    uint64_t last;
    uint32_t max_calls;
    uint64_t max_bytes;
};

/* How deep the JSON text |s| nests: its brackets, outside strings. */
static unsigned depth_of(const char *s, size_t n)
{
    unsigned depth = 0, most = 0;
    bool in_string = false;

    for (size_t i = 0; i < n; i++) {
        if (in_string) {
            if (s[i] == '\\')
                i++;
            else if (s[i] == '"')
                in_string = false;
        } else if (s[i] == '"')
            in_string = true;
        else if (s[i] == '{' || s[i] == '[')
            most = ++depth > most ? depth : most;
        else if (s[i] == '}' || s[i] == ']')
            depth--;
    }
    return most;
}

static void on_call(void *user, uint64_t call, const char *name, const char *args, size_t len)
{
    struct caller *c = user;
    json_error_t e;

    CHECK(call == c->last + 1 || call > c->last); /* in order; refused ones skip numbers */
    CHECK(call <= c->max_calls);
    CHECK(strcmp(name, "lookup") == 0 || strcmp(name, "other") == 0);
    CHECK(strlen(args) == len && len <= c->max_bytes);
    json_t *a = json_loadb(args, len, 0, &e);
    CHECK(json_is_object(a));
    json_decref(a);
    CHECK(depth_of(args, len) <= SBX_MAX_TOOL_DEPTH);
    c->last = call;
    CHECK((call % 2 ? sbx_tool_answer(c->answers, call, "[1, {\"a\": null}]",
                                      strlen("[1, {\"a\": null}]"))
                    : sbx_tool_fail(c->answers, call, "no")) == 0);
    CHECK(sbx_tool_fail(c->answers, call, "again") == -EALREADY);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct sbx_tool tools[] = {{"lookup", "d"}, {"other", NULL}};
    int sv[2];

    if (size < 1 || size > 65536)
        return 0;
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    struct caller c = {
        .answers = sbx_tool_answers_new(), .max_calls = 1 + data[0] % 8, .max_bytes = 1024};
    struct sbx_request req;
    sbx_request_init(&req);
    req.tools = tools;
    req.n_tools = 2;
    req.on_tool_call = on_call;
    req.tool_answers = c.answers;
    req.user = &c;
    req.max_tool_calls = c.max_calls;
    req.max_tool_bytes = c.max_bytes;
    CHECK(write(sv[0], data + 1, size - 1) == (ssize_t)(size - 1));
    shutdown(sv[0], SHUT_WR);
    fcntl(sv[1], F_SETFL, O_NONBLOCK);

    struct tool_chan t;
    tool_chan_init(&t, &req);
    CHECK(tool_chan_start(&t, sv[1]) == 0);
    for (int round = 0; round < 64 && tool_chan_events(&t); round++) {
        struct pollfd p[2] = {{t.fd, tool_chan_events(&t), 0},
                              {tool_chan_answers_fd(&t), POLLIN, 0}};
        if (poll(p, 2, 0) <= 0)
            break;
        tool_chan_ready(&t, p[0].revents, p[1].revents != 0);
    }
    uint64_t calls = t.calls;
    tool_chan_end(&t);
    CHECK(sbx_tool_answer(c.answers, 1, "1", 1) == -ENOENT); /* the run is over */

    /* What reached the code: whole frames of answers to calls it made. */
    static unsigned char back[1 << 20];
    size_t n = 0;
    ssize_t got;
    while (n < sizeof(back) && (got = read(sv[0], back + n, sizeof(back) - n)) > 0)
        n += (size_t)got;
    for (size_t at = 0; at < n;) {
        CHECK(n - at >= 4);
        uint32_t len = (uint32_t)back[at] | (uint32_t)back[at + 1] << 8 |
                       (uint32_t)back[at + 2] << 16 | (uint32_t)back[at + 3] << 24;
        CHECK(n - at - 4 >= len);
        json_error_t e;
        json_t *o = json_loadb((const char *)back + at + 4, len, 0, &e);
        json_t *call = json_object_get(o, "call");
        CHECK(json_is_integer(call) && json_integer_value(call) >= 1 &&
              (uint64_t)json_integer_value(call) <= calls);
        CHECK(!json_object_get(o, "content") != !json_object_get(o, "error"));
        json_decref(o);
        at += 4 + len;
    }
    close(sv[0]);
    sbx_tool_answers_free(c.answers);
    return 0;
}
