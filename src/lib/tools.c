/* Host tools: the run's answers (any thread) and its channel (the
 * supervising thread). See tools.h for what the code can do with it. */
#define _GNU_SOURCE
#include "tools.h"

#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

enum { CALL_NONE, CALL_WAITING, CALL_ANSWERED };

/* Past this many bytes waiting to go to the code, its calls are not read
 * until it reads: the supervisor's own refusals would otherwise pile up
 * without bound for code that writes calls and never reads the answers.
 * What one read may still add on top is bounded by the read's size. */
#define OUT_PAUSE_BYTES (64u << 10)

struct queued {
    struct queued *next;
    char *frame;
    size_t len;
};

struct sbx_tool_answers {
    pthread_mutex_t lock;
    int efd;      /* readable while answers are queued */
    bool running; /* a run's channel is attached */
    uint64_t max_bytes;
    uint32_t n_calls; /* calls that may reach the caller: 1..n_calls */
    unsigned char *state;
    struct queued *head, **tail;
};

struct sbx_tool_answers *sbx_tool_answers_new(void)
{
    struct sbx_tool_answers *a = calloc(1, sizeof(*a));

    if (!a)
        return NULL;
    a->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (a->efd < 0) {
        free(a);
        return NULL;
    }
    pthread_mutex_init(&a->lock, NULL);
    a->tail = &a->head;
    return a;
}

/* Under a->lock. */
static void drop_queue(struct sbx_tool_answers *a)
{
    while (a->head) {
        struct queued *q = a->head;
        a->head = q->next;
        free(q->frame);
        free(q);
    }
    a->tail = &a->head;
}

void sbx_tool_answers_free(struct sbx_tool_answers *a)
{
    if (!a)
        return;
    drop_queue(a);
    free(a->state);
    close(a->efd);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

/* |o| (taken) as a frame: its length, little-endian, then its JSON. */
static char *frame_of(json_t *o, size_t *len)
{
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    char *f = NULL;

    json_decref(o);
    if (text) {
        size_t n = strlen(text);
        if (n <= UINT32_MAX && (f = malloc(n + 4))) {
            for (int i = 0; i < 4; i++)
                f[i] = (char)((n >> (8 * i)) & 0xff);
            memcpy(f + 4, text, n);
            *len = n + 4;
        }
    }
    free(text);
    return f;
}

/* Queues |o| (taken) as the answer to |call|, if it is waiting for one. */
static int answer(struct sbx_tool_answers *a, uint64_t call, json_t *o)
{
    size_t len = 0;
    char *f = frame_of(o, &len);
    struct queued *q = f ? malloc(sizeof(*q)) : NULL;
    uint64_t one = 1;
    int rc = 0;

    if (!q) {
        free(f);
        return -ENOMEM;
    }
    pthread_mutex_lock(&a->lock);
    if (!a->running || call == 0 || call > a->n_calls || a->state[call] == CALL_NONE)
        rc = -ENOENT;
    else if (a->state[call] == CALL_ANSWERED)
        rc = -EALREADY;
    else if (len - 4 > a->max_bytes + 64) /* the result's own bytes are checked below */
        rc = -E2BIG;
    if (rc == 0) {
        a->state[call] = CALL_ANSWERED;
        *q = (struct queued){NULL, f, len};
        *a->tail = q;
        a->tail = &q->next;
        (void)!write(a->efd, &one, sizeof(one));
    }
    pthread_mutex_unlock(&a->lock);
    if (rc < 0) {
        free(f);
        free(q);
    }
    return rc;
}

/* Whether |len| bytes may be an answer now: -ENOENT with no run attached,
 * -E2BIG past its max_tool_bytes (checked again as it is queued). */
static int room_for(struct sbx_tool_answers *a, size_t len)
{
    pthread_mutex_lock(&a->lock);
    int rc = !a->running ? -ENOENT : len > a->max_bytes ? -E2BIG : 0;
    pthread_mutex_unlock(&a->lock);
    return rc;
}

bool tool_answers_busy(struct sbx_tool_answers *a)
{
    pthread_mutex_lock(&a->lock);
    bool busy = a->running;
    pthread_mutex_unlock(&a->lock);
    return busy;
}

int sbx_tool_answer(struct sbx_tool_answers *a, uint64_t call, const char *json, size_t len)
{
    json_error_t e;
    int rc;

    if (!a || !json)
        return -EINVAL;
    if ((rc = room_for(a, len)) < 0)
        return rc;
    json_t *v = json_loadb(json, len, JSON_DECODE_ANY, &e);
    if (!v)
        return -EINVAL;
    json_t *o = json_pack("{s:I, s:o}", "call", (json_int_t)call, "content", v);
    return o ? answer(a, call, o) : -ENOMEM;
}

int sbx_tool_fail(struct sbx_tool_answers *a, uint64_t call, const char *message)
{
    if (!a || !message)
        return -EINVAL;
    size_t len = strlen(message);
    int rc = room_for(a, len);
    if (rc < 0)
        return rc;
    if (utf8_valid_prefix((const unsigned char *)message, len) != len)
        return -EINVAL;
    json_t *o = json_pack("{s:I, s:s%}", "call", (json_int_t)call, "error", message, len);
    return o ? answer(a, call, o) : -ENOMEM;
}

/* --- the channel (the supervising thread) -------------------------------------- */

void tool_chan_init(struct tool_chan *t, const struct sbx_request *req)
{
    memset(t, 0, sizeof(*t));
    t->req = req;
    t->fd = -1;
}

int tool_chan_start(struct tool_chan *t, int fd)
{
    struct sbx_tool_answers *a = t->req->tool_answers;
    unsigned char *state = calloc((size_t)t->req->max_tool_calls + 1, 1);
    int rc = 0;

    if (!state) {
        close(fd);
        return -ENOMEM;
    }
    pthread_mutex_lock(&a->lock);
    if (a->running)
        rc = -EBUSY; /* one run at a time */
    else {
        drop_queue(a);
        free(a->state);
        a->state = state;
        a->n_calls = t->req->max_tool_calls;
        a->max_bytes = t->req->max_tool_bytes;
        a->running = true;
    }
    pthread_mutex_unlock(&a->lock);
    if (rc < 0) {
        free(state);
        close(fd);
        return rc;
    }
    t->fd = fd;
    t->reading = true;
    t->in_need = 4;
    return 0;
}

static bool out_room(const struct tool_chan *t)
{
    return t->out_len - t->out_off <= OUT_PAUSE_BYTES;
}

short tool_chan_events(const struct tool_chan *t)
{
    if (t->fd < 0)
        return 0;
    return (short)((t->reading && out_room(t) ? POLLIN : 0) |
                   (t->out_off < t->out_len ? POLLOUT : 0));
}

int tool_chan_answers_fd(const struct tool_chan *t)
{
    return t->fd >= 0 ? t->req->tool_answers->efd : -1;
}

/* Appends |len| bytes to what goes to the code (bounded by the calls the
 * code may make and the bytes of each answer). */
static void out_add(struct tool_chan *t, const char *p, size_t len)
{
    if (t->out_off == t->out_len)
        t->out_off = t->out_len = 0;
    if (t->out_len + len > t->out_cap) {
        size_t cap = t->out_cap ? t->out_cap : 4096;
        while (cap < t->out_len + len)
            cap *= 2;
        char *more = realloc(t->out, cap);
        if (!more)
            return; /* the code's call waits on, until its limits end it */
        t->out = more;
        t->out_cap = cap;
    }
    memcpy(t->out + t->out_len, p, len);
    t->out_len += len;
}

/* An answer of the supervisor's own to call |n|: a refusal. */
static void refuse(struct tool_chan *t, uint64_t n, const char *why)
{
    size_t len = 0;
    char *f = frame_of(json_pack("{s:I, s:s}", "call", (json_int_t)n, "error", why), &len);

    if (f)
        out_add(t, f, len);
    free(f);
}

static const struct sbx_tool *declared(const struct sbx_request *req, const char *name)
{
    for (size_t i = 0; i < req->n_tools; i++)
        if (strcmp(req->tools[i].name, name) == 0)
            return &req->tools[i];
    return NULL;
}

/* Whether |v| nests deeper than |levels| (a scalar is 0, an empty object
 * 1); it looks no deeper than that. */
static bool nested_past(json_t *v, unsigned levels)
{
    const char *k;
    json_t *e;
    size_t i;

    if (!json_is_object(v) && !json_is_array(v))
        return false;
    if (levels == 0)
        return true;
    json_array_foreach(v, i, e)
    {
        if (nested_past(e, levels - 1))
            return true;
    }
    json_object_foreach(v, k, e)
    {
        if (nested_past(e, levels - 1))
            return true;
    }
    return false;
}

/* One whole call from the code: |body|, |len| bytes, untrusted. */
static void on_call(struct tool_chan *t, const char *body, size_t len)
{
    const struct sbx_request *req = t->req;
    uint64_t n = ++t->calls;
    json_error_t e;
    json_t *o = json_loadb(body, len, 0, &e);
    json_t *name = json_object_get(o, "name"), *args = json_object_get(o, "arguments");
    char why[160];

    if (!json_is_object(o) || !json_is_string(name) || (args && !json_is_object(args)) ||
        json_object_size(o) != 1u + (args != NULL)) {
        refuse(t, n, "a call is {\"name\": string, \"arguments\": object}");
    } else if (args && nested_past(args, SBX_MAX_TOOL_DEPTH)) {
        fmt(why, sizeof(why), "a call's arguments nested deeper than %u levels",
            SBX_MAX_TOOL_DEPTH);
        refuse(t, n, why);
    } else if (!declared(req, json_string_value(name))) {
        const char *s = json_string_value(name);
        size_t shown = utf8_valid_prefix((const unsigned char *)s, strnlen(s, 64));
        fmt(why, sizeof(why), "no tool named %.*s in this run", (int)shown, s);
        refuse(t, n, why);
    } else if (n > req->max_tool_calls) {
        fmt(why, sizeof(why), "this run's %u tool calls (max_tool_calls) are used up",
            req->max_tool_calls);
        refuse(t, n, why);
    } else {
        char *text = args ? json_dumps(args, JSON_COMPACT) : strdup("{}");
        struct sbx_tool_answers *a = req->tool_answers;
        if (!text)
            refuse(t, n, "out of memory");
        else {
            pthread_mutex_lock(&a->lock);
            a->state[n] = CALL_WAITING;
            pthread_mutex_unlock(&a->lock);
            req->on_tool_call(req->user, n, json_string_value(name), text, strlen(text));
        }
        free(text);
    }
    json_decref(o);
}

/* Takes what the code wrote, call by call. */
static void take_calls(struct tool_chan *t)
{
    char buf[65536];

    while (t->reading && out_room(t)) {
        ssize_t got = recv(t->fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            if (got == 0 || errno != EAGAIN)
                t->reading = false; /* the code's end is closed, or gone */
            return;
        }
        for (size_t at = 0; at < (size_t)got && t->reading;) {
            size_t take = (size_t)got - at < t->in_need - t->in_len ? (size_t)got - at
                                                                    : t->in_need - t->in_len;
            memcpy(t->in + t->in_len, buf + at, take);
            t->in_len += take;
            at += take;
            if (t->in_len < t->in_need)
                break;
            if (t->in_need == 4 && t->in_len == 4) {
                uint32_t n = (uint32_t)t->in[0] | (uint32_t)t->in[1] << 8 |
                             (uint32_t)t->in[2] << 16 | (uint32_t)t->in[3] << 24;
                if (n > t->req->max_tool_bytes) {
                    char why[128];
                    fmt(why, sizeof(why), "a call of %u bytes, more than max_tool_bytes (%llu)", n,
                        (unsigned long long)t->req->max_tool_bytes);
                    refuse(t, ++t->calls, why);
                    /* The rest of the stream cannot be framed: no more calls. */
                    t->reading = false;
                    shutdown(t->fd, SHUT_RD);
                    break;
                }
                t->in_need = 4 + (size_t)n;
                if (n > 0)
                    continue; /* its body next (an empty one is refused at once) */
            }
            on_call(t, (const char *)t->in + 4, t->in_need - 4);
            t->in_len = 0;
            t->in_need = 4;
        }
    }
}

/* Moves the caller's answers out of the queue. */
static void take_answers(struct tool_chan *t)
{
    struct sbx_tool_answers *a = t->req->tool_answers;
    uint64_t count;

    (void)!read(a->efd, &count, sizeof(count));
    pthread_mutex_lock(&a->lock);
    struct queued *q = a->head;
    a->head = NULL;
    a->tail = &a->head;
    pthread_mutex_unlock(&a->lock);
    while (q) {
        struct queued *next = q->next;
        out_add(t, q->frame, q->len);
        free(q->frame);
        free(q);
        q = next;
    }
}

static void send_out(struct tool_chan *t)
{
    while (t->out_off < t->out_len) {
        ssize_t n =
            send(t->fd, t->out + t->out_off, t->out_len - t->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0)
            t->out_off += (size_t)n;
        else if (n < 0 && errno == EINTR)
            continue;
        else {
            if (n < 0 && errno != EAGAIN)
                t->out_off = t->out_len = 0; /* the code's end is gone */
            return;
        }
    }
}

void tool_chan_ready(struct tool_chan *t, short revents, bool answers)
{
    if (t->fd < 0)
        return;
    if (answers)
        take_answers(t);
    send_out(t); /* first: what the code took makes room to read more */
    if (revents & (POLLIN | POLLHUP | POLLERR)) {
        if (!t->in && !(t->in = malloc(4 + (size_t)t->req->max_tool_bytes)))
            t->reading = false; /* no room to take calls: the code's wait on */
        take_calls(t);
    }
    send_out(t);
}

void tool_chan_end(struct tool_chan *t)
{
    if (t->fd >= 0) {
        struct sbx_tool_answers *a = t->req->tool_answers;
        pthread_mutex_lock(&a->lock);
        a->running = false; /* later answers: -ENOENT */
        drop_queue(a);
        pthread_mutex_unlock(&a->lock);
        close_fd(&t->fd);
    }
    free(t->in);
    free(t->out);
    t->in = NULL;
    t->out = NULL;
    t->in_len = t->out_len = t->out_off = t->out_cap = 0;
    t->reading = false;
}
