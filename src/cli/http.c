/*
 * pysbx serve --http ADDR:PORT: the JSON-lines server's requests and
 * answers over HTTP, with libmicrohttpd doing the HTTP.
 *
 *   POST /v1/run   a request object (reqjson.h) in, its answer object out:
 *                  200 with the result whatever the code did, or the error
 *                  object with 400 (invalid_*), 413 (request_too_large) or
 *                  503 (sandbox_busy, sandbox_unavailable). Sessions are
 *                  not served here (400): each exchange stands alone.
 *   GET /healthz   200 when the sandbox can take runs, 503 otherwise.
 *   GET /metrics   Prometheus' text format.
 *
 * Threads: libmicrohttpd gives each connection a thread (keep-alive
 * included), which parses, runs (blocking in the backend: at most --jobs
 * runs at once, the library's queue behind them) and answers. A watcher
 * cancels the run of a client that hangs up meanwhile. The main
 * thread waits for SIGINT or SIGTERM, then drains as serve.c does
 * (drain.h): no new connection, 503 to new requests on open ones, the
 * grace for runs in flight, then cancel.
 */
#define _GNU_SOURCE
#include "commands.h"
#include "detach.h"
#include "drain.h"
#include "options.h"
#include "reqjson.h"
#include "sbxerr.h"
#include "sessions.h"
#include "sysutil.h"
#include "util.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <jansson.h>
#include <dlfcn.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

/* libmicrohttpd's functions, loaded on first use (dlopen): linked into the
 * command, it and GnuTLS cost every `pysbx run` their start-up. */
static struct {
    __typeof__(MHD_start_daemon) *start_daemon;
    __typeof__(MHD_stop_daemon) *stop_daemon;
    __typeof__(MHD_queue_response) *queue_response;
    __typeof__(MHD_create_response_from_buffer) *create_response_from_buffer;
    __typeof__(MHD_create_response_from_callback) *create_response_from_callback;
    __typeof__(MHD_create_response_from_buffer_with_free_callback_cls) *create_response_held;
    __typeof__(MHD_destroy_response) *destroy_response;
    __typeof__(MHD_add_response_header) *add_response_header;
    __typeof__(MHD_lookup_connection_value) *lookup_connection_value;
    __typeof__(MHD_get_connection_info) *get_connection_info;
    __typeof__(MHD_http_unescape) *http_unescape;
} mhd;

/* Returns 0, or -1 having said why on stderr. The handle stays open: the
 * server's threads use it until the process ends. */
static int mhd_load(void)
{
    void *h = dlopen(PYSBX_MHD_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "pysbx serve: --http needs %s: %s\n", PYSBX_MHD_SONAME, dlerror());
        return -1;
    }
#define MHD_LOAD(field, symbol)                                                                    \
    if (!(*(void **)&mhd.field = dlsym(h, symbol))) {                                              \
        fprintf(stderr, "pysbx serve: %s has no %s\n", PYSBX_MHD_SONAME, symbol);                  \
        return -1;                                                                                 \
    }
    MHD_LOAD(start_daemon, "MHD_start_daemon")
    MHD_LOAD(stop_daemon, "MHD_stop_daemon")
    MHD_LOAD(queue_response, "MHD_queue_response")
    MHD_LOAD(create_response_from_buffer, "MHD_create_response_from_buffer")
    MHD_LOAD(create_response_from_callback, "MHD_create_response_from_callback")
    MHD_LOAD(create_response_held, "MHD_create_response_from_buffer_with_free_callback_cls")
    MHD_LOAD(destroy_response, "MHD_destroy_response")
    MHD_LOAD(add_response_header, "MHD_add_response_header")
    MHD_LOAD(lookup_connection_value, "MHD_lookup_connection_value")
    MHD_LOAD(get_connection_info, "MHD_get_connection_info")
    MHD_LOAD(http_unescape, "MHD_http_unescape")
#undef MHD_LOAD
    return 0;
}

/* What a connection may hold of request line and headers (libmicrohttpd
 * answers 431 past it), how many connections (each a thread) at once, and
 * how long an idle keep-alive connection is kept. */
#define HEADER_BYTES    (64u << 10)
#define MAX_CONNECTIONS 512u
#define IDLE_TIMEOUT_S  60u
/* --metrics-http: a scraper or two, each a request every few seconds. */
#define METRICS_CONNECTIONS 16u
#define METRICS_TIMEOUT_S   10u
/* Hostile clients: a connection has this long to send its request line and
 * headers, and this long for its body; and connections that have not yet
 * shown a request past the token may hold at most MAX_CONNECTIONS less
 * this reserve (the oldest of them is cut off to make room), so that slow
 * or silent connections cannot take the places a client with the token
 * needs. */
#define HEADER_DEADLINE_S 10u
#define BODY_DEADLINE_S   120u
#define AUTHED_RESERVE    64u
#define LISTEN_BACKLOG    128
#define TOKEN_MAX         4096u
#define TOKEN_FILE_MAX    (1u << 20)
#define TENANTS_MAX       1024u
#define JSON_TYPE         "application/json"
#define NDJSON_TYPE       "application/x-ndjson"
#define METRICS_TYPE      "text/plain; version=0.0.4; charset=utf-8"
#define METRICS_ROOM      8192u

/* The run-duration histogram's upper bounds, in seconds. */
static const double buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                 0.25,  0.5,    1,     2.5,  5,     10,   30};
#define N_BUCKETS ARRAY_SIZE(buckets)
#define N_STATUS  (SBX_SANDBOX_ERROR + 1)
#define N_CODES   (SBX_ERR_BUSY + 1)

/* Refusals of the HTTP layer itself, counted apart from the library's
 * error codes. */
enum http_refusal { REF_UNAUTHORIZED, REF_NOT_FOUND, REF_METHOD, REF_FRAMING, N_REFUSALS };
static const char *const refusal_codes[N_REFUSALS] = {"unauthorized", "not_found",
                                                      "method_not_allowed", "bad_framing"};

struct metrics {
    uint64_t runs[N_STATUS];           /* answered with a result, by status */
    uint64_t refused[N_CODES];         /* answered with an error, by code */
    uint64_t http_refused[N_REFUSALS]; /* ... by the HTTP layer, by its code */
    uint64_t cut_off[2];               /* connections cut off: too slow, or evicted */
    uint64_t le[N_BUCKETS + 1];        /* runs per bucket (not cumulative); last: +Inf */
    double seconds;                    /* the sum */
    uint64_t cells;                    /* of the runs, cells of sessions */
};

/* An open connection, from libmicrohttpd's notice of it to its close (the
 * socket is closed only after that notice, so shutting down |fd| under the
 * lock never reaches another connection's). */
struct conn {
    struct conn *prev, *next;
    int fd;
    uint64_t due_ns; /* cut off then, unless it has got further (0: no deadline) */
    bool authed;     /* it sent a request that passed the token */
    bool cut;        /* shut down by us: it goes */
};

struct job {
    struct job *next;
    struct sbx_cancel *cancel;
    int fd; /* the client's connection, watched for a hang-up */
};

struct http {
    const struct serve_opts *o;
    /* --http-token-file: a token per tenant (none: one tenant, no token);
     * each tenant has its own sessions, by the names it gives them. */
    char **tokens;
    size_t *token_lens;
    unsigned n_tokens;
    struct session_table **tables; /* one per tenant (one when no token) */
    unsigned n_tables;
    struct session_idler *idler; /* --hibernate-after */
    int wake_fd;                 /* eventfd: an exchange or a run ended */
    pthread_mutex_t lock;
    struct metrics m;
    struct job *jobs; /* runs in flight, for cancel_all */
    unsigned running; /* runs in flight */
    unsigned open;    /* requests begun and not yet answered to the end */
    bool draining;    /* SIGINT or SIGTERM: new requests get 503 */
    bool cancelling;  /* the grace is over: a run is cancelled as it starts */
    int watch_fd;     /* eventfd: the runs in flight changed, or the watcher should end */
    bool unwatched;   /* the watcher ends */
    struct conn *conns, *conns_tail; /* open connections, oldest first */
    struct live *tooled;             /* streamed runs with host tools, in flight */
    unsigned unauthed;               /* of them, not authed and not cut */
    /* Answers held for their clients until taken (hold_answer), in bytes:
     * in all, and by tenant. Under held_lock, which is taken alone. */
    pthread_mutex_t held_lock;
    size_t held, *tenant_held;
    uint64_t not_held; /* answers cut off, and event bytes dropped, for want of room */
};

enum route {
    ROUTE_NONE,
    ROUTE_RUN,
    ROUTE_TOOL_RESULTS,
    ROUTE_SESSIONS,          /* GET /v1/sessions */
    ROUTE_SESSION,           /* DELETE /v1/sessions/NAME */
    ROUTE_SESSION_RUN,       /* POST /v1/sessions/NAME/run */
    ROUTE_SESSION_FORK,      /* POST /v1/sessions/NAME/fork */
    ROUTE_SESSION_HIBERNATE, /* POST /v1/sessions/NAME/hibernate */
    ROUTE_HEALTH,
    ROUTE_METRICS
};

/* A run's id in /v1/runs/ID/tool_results: 32 hex digits. */
#define RUN_ID_LEN 32

/* One request: where it goes, its body as it arrives. */
struct exchange {
    enum route rt;
    int tenant;                      /* whose token it showed */
    char name[SESSION_NAME_MAX + 1]; /* the session the path names */
    char *body;
    size_t len, cap;
    bool too_large;
    size_t discarded; /* bytes thrown away once too_large */
};

static bool is_draining(struct http *h)
{
    pthread_mutex_lock(&h->lock);
    bool d = h->draining;
    pthread_mutex_unlock(&h->lock);
    return d;
}

/* --- answers ------------------------------------------------------------------- */

static enum MHD_Result send_text_allow(struct MHD_Connection *conn, unsigned status, char *text,
                                       const char *type, bool close_after, const char *allow)
{
    struct MHD_Response *r;
    enum MHD_Result ok;

    if (!text)
        return MHD_NO; /* out of memory: the connection is closed */
    r = mhd.create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    mhd.add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == MHD_HTTP_UNAUTHORIZED)
        mhd.add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED && allow)
        mhd.add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    if (status == MHD_HTTP_SERVICE_UNAVAILABLE)
        mhd.add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (close_after)
        mhd.add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    ok = mhd.queue_response(conn, status, r);
    mhd.destroy_response(r);
    return ok;
}

static enum MHD_Result send_text(struct MHD_Connection *conn, unsigned status, char *text,
                                 const char *type, bool close_after)
{
    return send_text_allow(conn, status, text, type, close_after, NULL);
}

/* |n| bytes of an answer (or of its events), to be held until |tenant|'s
 * client takes them: only within the tenant's allowance (--max-pending-bytes;
 * one exchange alone may pass it: |own| is what the exchange holds already)
 * and the server's (--max-held-bytes), so that clients that do not read
 * cannot grow the server. Returns whether they are held. */
static bool hold_answer(struct http *h, int tenant, size_t own, size_t n)
{
    pthread_mutex_lock(&h->held_lock);
    size_t *mine = &h->tenant_held[tenant];
    bool ok = (*mine == own || *mine + n <= h->o->max_pending_bytes) &&
              h->held + n <= h->o->max_held_bytes;
    if (ok) {
        *mine += n;
        h->held += n;
    } else
        h->not_held++;
    pthread_mutex_unlock(&h->held_lock);
    return ok;
}

static void unhold_answer(struct http *h, int tenant, size_t n)
{
    pthread_mutex_lock(&h->held_lock);
    h->tenant_held[tenant] -= n;
    h->held -= n;
    pthread_mutex_unlock(&h->held_lock);
}

/* A run's answer, held (above) while libmicrohttpd sends it. */
struct held {
    struct http *h;
    int tenant;
    char *text;
    size_t len;
};

/* Taken, or the client went away (libmicrohttpd's idle timeout included):
 * the room is given back. */
static void held_free(void *cls)
{
    struct held *a = cls;

    unhold_answer(a->h, a->tenant, a->len);
    free(a->text);
    free(a);
}

/* A 200 with |text| (taken) as a held answer; a client past its allowance,
 * or a server past its own, is cut off and the answer not kept. */
static enum MHD_Result send_held(struct http *h, struct MHD_Connection *conn, int tenant,
                                 char *text)
{
    struct held *a = text ? calloc(1, sizeof(*a)) : NULL;
    struct MHD_Response *r = NULL;

    if (a) {
        *a = (struct held){.h = h, .tenant = tenant, .text = text, .len = strlen(text)};
        if (!hold_answer(h, tenant, 0, a->len)) {
            free(a);
            a = NULL;
        }
    }
    if (!a) {
        free(text);
        return MHD_NO; /* the connection is cut */
    }
    /* From a buffer, libmicrohttpd sends the head and the body in one
     * write: a server killed mid-answer leaves its proxy a whole answer or
     * none (a 502), not a head whose body never comes (unless the answer
     * is larger than the socket takes at once). */
    r = mhd.create_response_held(a->len, a->text, held_free, a);
    if (!r) {
        held_free(a);
        return MHD_NO;
    }
    mhd.add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, JSON_TYPE);
    enum MHD_Result ok = mhd.queue_response(conn, MHD_HTTP_OK, r);
    mhd.destroy_response(r);
    return ok;
}

static unsigned status_for(enum sbx_error_code code)
{
    switch (code) {
    case SBX_ERR_TOO_LARGE:
        return MHD_HTTP_CONTENT_TOO_LARGE;
    case SBX_ERR_UNAVAILABLE:
    case SBX_ERR_BUSY:
        return MHD_HTTP_SERVICE_UNAVAILABLE;
    case SBX_ERR_SESSION_LOST:
        return MHD_HTTP_GONE;
    default:
        return MHD_HTTP_BAD_REQUEST;
    }
}

static void count_refused(struct http *h, enum sbx_error_code code)
{
    pthread_mutex_lock(&h->lock);
    h->m.refused[(unsigned)code < N_CODES ? code : SBX_ERR_INVALID_REQUEST]++;
    pthread_mutex_unlock(&h->lock);
}

/* The JSON-lines server's error answer, with |id_text| (NULL: null). */
static enum MHD_Result send_error(struct http *h, struct MHD_Connection *conn, unsigned status,
                                  const char *id_text, enum sbx_error_code code, const char *format,
                                  ...) __attribute__((format(printf, 6, 7)));

static enum MHD_Result send_error(struct http *h, struct MHD_Connection *conn, unsigned status,
                                  const char *id_text, enum sbx_error_code code, const char *format,
                                  ...)
{
    struct sbx_error err = {.code = code};
    va_list ap;

    va_start(ap, format);
    vsnprintf(err.message, sizeof(err.message), format, ap);
    va_end(ap);
    count_refused(h, code);
    return send_text(conn, status, json_answer_error(id_text, &err), JSON_TYPE,
                     status == MHD_HTTP_SERVICE_UNAVAILABLE && is_draining(h));
}

/* |s| as a message may show it: at most |max| of its bytes, each byte
 * that is not printable ASCII as %XX (a path's bytes after libmicrohttpd
 * decoded its escapes, or a method, may be anything). */
static void shown(char *out, size_t cap, const char *s, size_t max)
{
    size_t o = 0;

    for (size_t i = 0; s[i] && i < max && o + 4 <= cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c > ' ' && c < 0x7f)
            out[o++] = (char)c;
        else
            o += (size_t)snprintf(out + o, cap - o, "%%%02X", c);
    }
    out[o] = '\0';
}

/* A refusal of the HTTP layer: the error object with a code of its own,
 * counted under it; |close_after| closes the connection after it. */
static enum MHD_Result refuse(struct http *h, struct MHD_Connection *conn, unsigned status,
                              enum http_refusal why, const char *allow, bool close_after,
                              const char *format, ...) __attribute__((format(printf, 7, 8)));

static enum MHD_Result refuse(struct http *h, struct MHD_Connection *conn, unsigned status,
                              enum http_refusal why, const char *allow, bool close_after,
                              const char *format, ...)
{
    char message[512];
    va_list ap;

    va_start(ap, format);
    vsnprintf(message, sizeof(message), format, ap);
    va_end(ap);
    pthread_mutex_lock(&h->lock);
    h->m.http_refused[why]++;
    pthread_mutex_unlock(&h->lock);
    /* Whole characters only (the message may be cut inside one): the
     * encoder refuses anything else, and the client would get no answer. */
    size_t n = utf8_valid_prefix((const unsigned char *)message, strlen(message));
    json_t *o = json_pack("{s:n, s:{s:s, s:s%}}", "id", "error", "code", refusal_codes[why],
                          "message", message, n);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return send_text_allow(conn, status, text, JSON_TYPE, close_after, allow);
}

/* --- authentication ------------------------------------------------------------ */

/* Whether |got| is |want|, in time that depends on |want|'s length only,
 * never on where the first wrong byte is. */
static bool token_matches(const char *want, size_t wlen, const char *got)
{
    size_t glen = strlen(got);
    unsigned char diff = glen != wlen;

    for (size_t i = 0; i < wlen; i++)
        diff |= (unsigned char)(want[i] ^ got[i < glen ? i : 0]);
    return diff == 0;
}

/* The tenant whose token the request shows (0 when the server has none),
 * or -1. Every token is compared, whichever matches. */
static int tenant_of(const struct http *h, struct MHD_Connection *conn)
{
    const char *a;
    int tenant = -1;

    if (!h->n_tokens)
        return 0;
    a = mhd.lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!a || strncasecmp(a, "Bearer ", 7) != 0)
        return -1;
    a += 7;
    while (*a == ' ')
        a++;
    for (unsigned i = 0; i < h->n_tokens; i++)
        if (token_matches(h->tokens[i], h->token_lens[i], a))
            tenant = (int)i;
    return tenant;
}

/* --- connections: deadlines and the reserve ---------------------------------------- */

static struct conn *conn_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        mhd.get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Shuts |c| down (libmicrohttpd sees its end and closes it). Under the lock. */
static void cut(struct http *h, struct conn *c, unsigned why)
{
    if (c->cut)
        return;
    c->cut = true;
    if (!c->authed)
        h->unauthed--;
    h->m.cut_off[why]++;
    shutdown(c->fd, SHUT_RDWR);
}

static void notify_connection(void *cls, struct MHD_Connection *conn, void **ctx,
                              enum MHD_ConnectionNotificationCode toe)
{
    struct http *h = cls;
    struct conn *c = *ctx;

    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            mhd.get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci || !(c = calloc(1, sizeof(*c)))) {
            if (ci)
                shutdown(ci->connect_fd, SHUT_RDWR); /* no room to watch it: it goes */
            return;
        }
        c->fd = ci->connect_fd;
        c->due_ns = now_ns() + HEADER_DEADLINE_S * 1000000000ULL;
        *ctx = c;
        pthread_mutex_lock(&h->lock);
        c->prev = h->conns_tail;
        *(c->prev ? &c->prev->next : &h->conns) = c;
        h->conns_tail = c;
        h->unauthed++;
        /* Past its share, the oldest connection not yet past the token
         * goes, so that a new one (which may be a client with the token)
         * finds room. */
        for (struct conn *o = h->conns; o && h->unauthed > MAX_CONNECTIONS - AUTHED_RESERVE;
             o = o->next)
            if (!o->authed && !o->cut && o != c)
                cut(h, o, 1);
        pthread_mutex_unlock(&h->lock);
        return;
    }
    if (!c)
        return;
    pthread_mutex_lock(&h->lock);
    *(c->prev ? &c->prev->next : &h->conns) = c->next;
    *(c->next ? &c->next->prev : &h->conns_tail) = c->prev;
    if (!c->authed && !c->cut)
        h->unauthed--;
    pthread_mutex_unlock(&h->lock);
    free(c);
    *ctx = NULL;
}

/* A request's headers are in: the body has its own deadline; a request
 * past the token makes the connection one that is never cut to make room. */
static void conn_headers_in(struct http *h, struct MHD_Connection *conn, bool authed)
{
    struct conn *c = conn_of(conn);

    if (!c)
        return;
    pthread_mutex_lock(&h->lock);
    c->due_ns = now_ns() + BODY_DEADLINE_S * 1000000000ULL;
    if (authed && !c->authed) {
        c->authed = true;
        if (!c->cut)
            h->unauthed--;
    }
    pthread_mutex_unlock(&h->lock);
}

/* The body is in (the run has its own limits), or the answer went out
 * (the next request on the connection has the header deadline again,
 * after the idle time libmicrohttpd keeps). */
static void conn_due(struct http *h, struct MHD_Connection *conn, uint64_t due_ns)
{
    struct conn *c = conn_of(conn);

    if (!c)
        return;
    pthread_mutex_lock(&h->lock);
    c->due_ns = due_ns;
    pthread_mutex_unlock(&h->lock);
}

/* Cuts off connections past their deadline; the time until the next one
 * is due (ms, at most a second). */
static int cut_the_slow(struct http *h)
{
    uint64_t now = now_ns(), next = now + 1000000000ULL;

    pthread_mutex_lock(&h->lock);
    for (struct conn *c = h->conns; c; c = c->next) {
        if (c->cut || !c->due_ns)
            continue;
        if (c->due_ns <= now)
            cut(h, c, 0);
        else if (c->due_ns < next)
            next = c->due_ns;
    }
    pthread_mutex_unlock(&h->lock);
    return (int)((next - now + 999999) / 1000000);
}

/* --- the endpoints --------------------------------------------------------------- */

static bool ready(const struct serve_opts *o, struct sbx_health *st)
{
    memset(st, 0, sizeof(*st));
    if (!o->backend->health) {
        st->ready = true;
        return true;
    }
    o->backend->health(o->backend->self, st);
    /* Workers ready: one idle, or runs in flight (whose ends make more).
     * A template that is up but cannot make any is not ready. */
    return st->ready && (st->idle > 0 || st->running > 0);
}

static enum MHD_Result healthz(struct http *h, struct MHD_Connection *conn)
{
    struct sbx_health st;
    bool draining = is_draining(h);
    bool ok = ready(h->o, &st) && !draining;
    const char *state = draining ? "draining" : ok ? "ready" : "unavailable";
    json_t *j =
        json_pack("{s:s, s:b, s:I, s:I, s:I, s:I, s:s}", "status", state, "template_up", st.ready,
                  "idle_workers", (json_int_t)st.idle, "runs_in_flight", (json_int_t)st.running,
                  "queued", (json_int_t)st.waiting, "template_restarts", (json_int_t)st.restarts,
                  "reason", draining ? "the server is shutting down" : st.reason);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;

    json_decref(j);
    return send_text(conn, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, text, JSON_TYPE,
                     draining);
}

struct buf {
    char *p;
    size_t len, cap;
    bool failed;
};

static void add(struct buf *b, const char *format, ...) __attribute__((format(printf, 2, 3)));

static void add(struct buf *b, const char *format, ...)
{
    va_list ap;

    for (int tries = 0; !b->failed && tries < 2; tries++) {
        va_start(ap, format);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, format, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = true;
        } else if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        } else {
            char *p = realloc(b->p, b->cap * 2 + (size_t)n);
            if (!p)
                b->failed = true;
            else {
                b->p = p;
                b->cap = b->cap * 2 + (size_t)n;
            }
        }
    }
}

static void add_metric(struct buf *b, const char *name, const char *type, const char *help)
{
    add(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static enum MHD_Result metrics(struct http *h, struct MHD_Connection *conn)
{
    struct buf b = {malloc(METRICS_ROOM), 0, METRICS_ROOM, false};
    struct sbx_health st;
    struct metrics m;
    uint64_t cumulative = 0, total = 0;

    if (!b.p)
        return MHD_NO;
    bool up = ready(h->o, &st);
    pthread_mutex_lock(&h->lock);
    m = h->m;
    pthread_mutex_unlock(&h->lock);
    pthread_mutex_lock(&h->held_lock);
    size_t held = h->held;
    uint64_t not_held = h->not_held;
    pthread_mutex_unlock(&h->held_lock);

    add_metric(&b, "pysbx_runs_total", "counter", "Runs answered with a result, by status.");
    for (unsigned i = 0; i < N_STATUS; i++)
        add(&b, "pysbx_runs_total{status=\"%s\"} %llu\n", sbx_status_name(i),
            (unsigned long long)m.runs[i]);
    add_metric(&b, "pysbx_requests_refused_total", "counter",
               "Requests answered with an error object, by error code.");
    for (unsigned i = 1; i < N_CODES; i++)
        add(&b, "pysbx_requests_refused_total{code=\"%s\"} %llu\n", sbx_error_code_name(i),
            (unsigned long long)m.refused[i]);
    for (unsigned i = 0; i < N_REFUSALS; i++)
        add(&b, "pysbx_requests_refused_total{code=\"%s\"} %llu\n", refusal_codes[i],
            (unsigned long long)m.http_refused[i]);
    add_metric(&b, "pysbx_connections_cut_total", "counter",
               "Connections the server shut: too slow to send a request (slow), or the oldest "
               "of those not yet past the token, to make room (evicted).");
    add(&b, "pysbx_connections_cut_total{why=\"slow\"} %llu\n", (unsigned long long)m.cut_off[0]);
    add(&b, "pysbx_connections_cut_total{why=\"evicted\"} %llu\n",
        (unsigned long long)m.cut_off[1]);
    add_metric(&b, "pysbx_answer_bytes_held", "gauge",
               "Bytes of answers and events held for clients that have not taken them yet.");
    add(&b, "pysbx_answer_bytes_held %zu\n", held);
    add_metric(&b, "pysbx_answers_not_held_total", "counter",
               "Answers (their connection then cut) and events not held: past the client's "
               "--max-pending-bytes or the server's --max-held-bytes.");
    add(&b, "pysbx_answers_not_held_total %llu\n", (unsigned long long)not_held);
    add_metric(&b, "pysbx_run_duration_seconds", "histogram",
               "Wall time of runs answered with a result, from the request read to its result.");
    for (unsigned i = 0; i <= N_BUCKETS; i++) {
        cumulative += m.le[i];
        if (i < N_BUCKETS)
            add(&b, "pysbx_run_duration_seconds_bucket{le=\"%g\"} %llu\n", buckets[i],
                (unsigned long long)cumulative);
        else
            add(&b, "pysbx_run_duration_seconds_bucket{le=\"+Inf\"} %llu\n",
                (unsigned long long)cumulative);
    }
    for (unsigned i = 0; i < N_STATUS; i++)
        total += m.runs[i];
    add(&b, "pysbx_run_duration_seconds_sum %.6f\npysbx_run_duration_seconds_count %llu\n",
        m.seconds, (unsigned long long)total);
    add_metric(&b, "pysbx_session_cells_total", "counter",
               "Of the runs answered with a result, cells of sessions.");
    add(&b, "pysbx_session_cells_total %llu\n", (unsigned long long)m.cells);
    size_t open_sessions = 0;
    for (unsigned i = 0; i < h->n_tables; i++)
        open_sessions += session_list(h->tables[i], false, NULL, 0);
    add_metric(&b, "pysbx_sessions_open", "gauge", "Sessions open, of every tenant.");
    add(&b, "pysbx_sessions_open %zu\n", open_sessions);
    if (h->o->state) {
        uint64_t images, bytes;
        state_dir_totals(h->o->state, &images, &bytes);
        add_metric(&b, "pysbx_sessions_hibernated", "gauge",
                   "Sessions hibernated in the state directory, of every tenant.");
        add(&b, "pysbx_sessions_hibernated %llu\n", (unsigned long long)images);
        add_metric(&b, "pysbx_state_bytes", "gauge",
                   "Bytes of the images in the state directory (--state-max-bytes caps them).");
        add(&b, "pysbx_state_bytes %llu\n", (unsigned long long)bytes);
    }
    add_metric(&b, "pysbx_queue_depth", "gauge", "Runs waiting for a place in the sandbox.");
    add(&b, "pysbx_queue_depth %u\n", st.waiting);
    add_metric(&b, "pysbx_runs_in_flight", "gauge", "Runs in the sandbox now.");
    add(&b, "pysbx_runs_in_flight %u\n", st.running);
    add_metric(&b, "pysbx_idle_workers", "gauge", "Workers ready and not yet taken.");
    add(&b, "pysbx_idle_workers %u\n", st.idle);
    add_metric(&b, "pysbx_template_up", "gauge", "1 when the template process is running.");
    add(&b, "pysbx_template_up %d\n", st.ready ? 1 : 0);
    add_metric(&b, "pysbx_ready", "gauge", "1 when /healthz answers 200.");
    add(&b, "pysbx_ready %d\n", up && !is_draining(h) ? 1 : 0);
    add_metric(&b, "pysbx_template_restarts_total", "counter",
               "Template processes started after the first.");
    add(&b, "pysbx_template_restarts_total %u\n", st.restarts);
    add_metric(&b, "pysbx_build_info", "gauge", "The version and backend; always 1.");
    add(&b, "pysbx_build_info{version=\"%s\",backend=\"%s\"} 1\n", PYSBX_VERSION,
        h->o->backend->name);
    if (b.failed) {
        free(b.p);
        return MHD_NO;
    }
    return send_text(conn, MHD_HTTP_OK, b.p, METRICS_TYPE, false);
}

static void job_add(struct http *h, struct job *j)
{
    pthread_mutex_lock(&h->lock);
    j->next = h->jobs;
    h->jobs = j;
    h->running++;
    if (h->cancelling)
        sbx_cancel_fire(j->cancel); /* answered at once: cancelled */
    pthread_mutex_unlock(&h->lock);
    efd_notify(h->watch_fd);
}

static void job_done(struct http *h, struct job *j, const struct sbx_result *res, double seconds,
                     bool cell)
{
    pthread_mutex_lock(&h->lock);
    for (struct job **pp = &h->jobs; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            break;
        }
    h->running--;
    efd_notify(h->watch_fd);
    if (res) {
        unsigned i = 0;
        while (i < N_BUCKETS && seconds > buckets[i])
            i++;
        h->m.le[i]++;
        h->m.seconds += seconds;
        h->m.runs[(unsigned)res->status < N_STATUS ? res->status : SBX_SANDBOX_ERROR]++;
        h->m.cells += cell;
    }
    pthread_mutex_unlock(&h->lock);
    efd_notify(h->wake_fd);
}

/* --- "stream": true ---------------------------------------------------------------- */

/* A streamed run: its thread runs it, queueing the output as event lines
 * and the answer last; libmicrohttpd's thread for the connection takes the
 * bytes as the client takes them (a chunked application/x-ndjson body).
 * Both hold it; the last to let go frees it. */
struct live {
    struct http *h;
    pthread_mutex_t lock;
    pthread_cond_t more;
    char *buf; /* queued bytes not yet taken: buf[off..len) */
    size_t off, len, cap;
    size_t max;          /* --max-pending-bytes: events past it are dropped */
    uint64_t dropped[2]; /* bytes of stdout and stderr events dropped */
    bool done;           /* the answer is queued: nothing more comes */
    bool cut;            /* ... or found no room: the connection is cut */
    bool gone;           /* libmicrohttpd let go: the client is gone or served */
    size_t reserved;     /* held for the lines that end the run, not yet queued */
    unsigned refs;
    /* A run with host tools: on h->tooled while it runs, found by run_id. */
    struct live *tnext;
    char run_id[RUN_ID_LEN + 1];
    struct sbx_tool_answers *answers;
    struct job j;
    struct json_request r;
    struct session_cell *cell; /* a session's cell: its place in the line */
    int tenant;                /* whose token started it: only that one answers its tools */
};

static void live_unref(struct live *l)
{
    pthread_mutex_lock(&l->lock);
    bool last = --l->refs == 0;
    pthread_mutex_unlock(&l->lock);
    if (!last)
        return;
    free(l->buf);
    session_leave(l->cell);
    sbx_tool_answers_free(l->answers);
    sbx_cancel_free(l->j.cancel);
    json_request_free(&l->r);
    pthread_mutex_destroy(&l->lock);
    pthread_cond_destroy(&l->more);
    free(l);
}

/* Appends |line| (taken), held for the client (hold_answer) unless it is
 * |reserved| already. An |optional| line (an event) goes only within the
 * stream's allowance and the held bytes', else it is dropped; another line
 * that finds no room cuts the connection. Under l->lock; returns whether
 * it went. */
static bool live_put(struct live *l, char *line, bool optional, bool reserved)
{
    size_t n = line ? strlen(line) : 0;
    bool ok = line != NULL && !l->gone;

    if (l->off == l->len)
        l->off = l->len = 0;
    if (ok && optional && l->len > l->off && l->len - l->off + n > l->max)
        ok = false; /* as for answers, one alone may pass the allowance */
    if (ok && !reserved && !hold_answer(l->h, l->tenant, l->len - l->off, n)) {
        ok = false;
        l->cut |= !optional;
    }
    if (ok && l->len + n > l->cap) {
        size_t cap = l->cap ? l->cap : 4096;
        while (cap < l->len + n)
            cap *= 2;
        char *p = realloc(l->buf, cap);
        ok = p != NULL;
        if (ok) {
            l->buf = p;
            l->cap = cap;
        }
    }
    if (ok) {
        memcpy(l->buf + l->len, line, n);
        l->len += n;
        pthread_cond_broadcast(&l->more);
    } else if (reserved)
        unhold_answer(l->h, l->tenant, n);
    free(line);
    return ok;
}

/* on_output, in the run's thread: never waits for the client. */
static void live_output(void *user, int stream, const char *text, size_t len)
{
    struct live *l = user;

    pthread_mutex_lock(&l->lock);
    if (l->gone || !live_put(l, json_event_output(l->r.id_text, stream, text, len), true, false))
        l->dropped[stream - 1] += len;
    pthread_mutex_unlock(&l->lock);
}

/* on_tool_call: the call as an event line. A client that has left more
 * than its allowance unread is not asked: the call fails at once in the
 * code, rather than the server holding calls for it. */
static void live_tool_call(void *user, uint64_t call, const char *name, const char *args,
                           size_t len)
{
    struct live *l = user;

    pthread_mutex_lock(&l->lock);
    bool asked = !l->gone && live_put(l, json_event_tool_call(l->r.id_text, call, name, args, len),
                                      true, false);
    pthread_mutex_unlock(&l->lock);
    if (!asked)
        (void)sbx_tool_fail(l->answers, call,
                            "the client was not asked: it is gone or has left too much unread");
}

/* Takes |l| off the runs that tool results can reach. */
static void untool(struct http *h, struct live *l)
{
    pthread_mutex_lock(&h->lock);
    for (struct live **pp = &h->tooled; *pp; pp = &(*pp)->tnext)
        if (*pp == l) {
            *pp = l->tnext;
            break;
        }
    pthread_mutex_unlock(&h->lock);
}

static void *live_main(void *p)
{
    struct live *l = p;
    struct http *h = l->h;
    struct sbx_result *res = NULL;
    struct sbx_error err = {0};
    char *answer;

    uint64_t t0 = now_ns();
    bool cell = l->cell != NULL, restored = false;
    int rc = cell ? session_run(l->cell, &l->r.req, l->r.rollback, &res, &restored, &err)
                  : h->o->backend->run(h->o->backend->self, &l->r.req, &res, &err);
    l->cell = NULL; /* session_run gave its place up */
    if (l->answers)
        untool(h, l);
    if (rc < 0)
        count_refused(h, err.code);
    answer = rc < 0 ? json_answer_error(l->r.id_text, &err)
             : cell ? json_answer_session(l->r.id_text, res, l->r.session, restored)
                    : json_answer_result(l->r.id_text, res);
    /* The room for the last lines is taken while |h| is sure to be there:
     * once the run is done (job_done), the drain may end the server. */
    pthread_mutex_lock(&l->lock);
    char *dropped =
        l->dropped[0] || l->dropped[1] ? json_event_dropped(l->r.id_text, l->dropped) : NULL;
    size_t last = (dropped ? strlen(dropped) : 0) + (answer ? strlen(answer) : 0);
    bool room = !l->gone && answer && hold_answer(h, l->tenant, l->len - l->off, last);
    l->reserved = room ? last : 0;
    l->cut = !room;
    pthread_mutex_unlock(&l->lock);
    job_done(h, &l->j, rc == 0 ? res : NULL, (double)(now_ns() - t0) / 1e9, cell);
    sbx_result_free(res);
    /* From here on |h| may be gone: the drain waits for this exchange only
     * until its answer has been taken. */
    pthread_mutex_lock(&l->lock);
    if (l->reserved) {
        l->reserved = 0;
        if (dropped)
            live_put(l, dropped, false, true);
        live_put(l, answer, false, true);
    } else {
        free(dropped);
        free(answer);
    }
    l->done = true;
    pthread_cond_broadcast(&l->more);
    pthread_mutex_unlock(&l->lock);
    live_unref(l);
    return NULL;
}

/* libmicrohttpd asks for the next bytes of the body: waits for them (this
 * is the connection's own thread); the end once the answer is taken. */
static ssize_t live_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct live *l = cls;
    ssize_t n;

    (void)pos;
    pthread_mutex_lock(&l->lock);
    while (l->off == l->len && !l->done)
        pthread_cond_wait(&l->more, &l->lock);
    if (l->off == l->len)
        n = l->cut || (l->len == 0 && !l->buf) ? MHD_CONTENT_READER_END_WITH_ERROR
                                               : MHD_CONTENT_READER_END_OF_STREAM;
    else {
        n = (ssize_t)(l->len - l->off < max ? l->len - l->off : max);
        memcpy(buf, l->buf + l->off, (size_t)n);
        l->off += (size_t)n;
        unhold_answer(l->h, l->tenant, (size_t)n);
    }
    pthread_mutex_unlock(&l->lock);
    return n;
}

/* libmicrohttpd is done with the body: the client took it all, or went
 * away, in which case its run is cancelled. */
static void live_release(void *cls)
{
    struct live *l = cls;

    pthread_mutex_lock(&l->lock);
    l->gone = true;
    if (!l->done)
        sbx_cancel_fire(l->j.cancel);
    /* What nobody will take now is not held. */
    unhold_answer(l->h, l->tenant, l->len - l->off + l->reserved);
    l->off = l->len;
    l->reserved = 0;
    pthread_mutex_unlock(&l->lock);
    live_unref(l);
}

/* Starts |r| (taken; and |cell|, a session's cell's place) in a thread of
 * its own and answers with its stream. */
static enum MHD_Result run_streamed(struct http *h, struct MHD_Connection *conn,
                                    struct json_request *r, struct session_cell *cell, int tenant)
{
    struct live *l = calloc(1, sizeof(*l));
    struct MHD_Response *resp = NULL;
    enum MHD_Result ok;

    if (!l || !(l->j.cancel = sbx_cancel_new())) {
        free(l);
        session_leave(cell);
        json_request_free(r);
        return send_error(h, conn, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, SBX_ERR_UNAVAILABLE,
                          "out of memory");
    }
    l->h = h;
    l->r = *r;
    l->cell = cell;
    l->tenant = tenant;
    l->max = h->o->max_pending_bytes;
    l->refs = 2;
    pthread_mutex_init(&l->lock, NULL);
    pthread_cond_init(&l->more, NULL);
    l->r.req.cancel = l->j.cancel;
    if (l->r.stream)
        l->r.req.on_output = live_output;
    l->r.req.user = l;
    if (l->r.req.n_tools) {
        unsigned char raw[RUN_ID_LEN / 2];
        if (!(l->answers = sbx_tool_answers_new()) ||
            getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
            live_unref(l);
            live_unref(l);
            return send_error(h, conn, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, SBX_ERR_UNAVAILABLE,
                              "no room for the run's tools");
        }
        for (size_t i = 0; i < sizeof(raw); i++)
            snprintf(l->run_id + 2 * i, 3, "%02x", raw[i]);
        l->r.req.on_tool_call = live_tool_call;
        l->r.req.tool_answers = l->answers;
        /* The first line names the run, for its tool results. */
        live_put(l, json_event_started(l->r.id_text, l->run_id), false, false);
        pthread_mutex_lock(&h->lock);
        l->tnext = h->tooled;
        h->tooled = l;
        pthread_mutex_unlock(&h->lock);
    }
    const union MHD_ConnectionInfo *ci =
        mhd.get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    l->j.fd = ci ? ci->connect_fd : -1;
    resp = mhd.create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, live_read, l, live_release);
    if (!resp) {
        l->refs = 1;
        live_unref(l);
        return MHD_NO;
    }
    job_add(h, &l->j);
    if (start_pooled(live_main, l) < 0) {
        struct sbx_error err;
        sbx_fail(&err, SBX_ERR_UNAVAILABLE, -EAGAIN, "cannot start a thread");
        count_refused(h, err.code);
        job_done(h, &l->j, NULL, 0, false);
        if (l->answers)
            untool(h, l);
        pthread_mutex_lock(&l->lock);
        live_put(l, json_answer_error(l->r.id_text, &err), false, false);
        l->done = true;
        pthread_mutex_unlock(&l->lock);
        live_unref(l);
    }
    mhd.add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, NDJSON_TYPE);
    /* A proxy in front (nginx) passes each line on as it comes. */
    mhd.add_response_header(resp, "X-Accel-Buffering", "no");
    ok = mhd.queue_response(conn, MHD_HTTP_OK, resp);
    mhd.destroy_response(resp); /* live_release runs once libmicrohttpd is done with it */
    return ok;
}

/* POST /v1/run, and POST /v1/sessions/NAME/run: a cell of the session
 * NAME of the caller's tenant (its line, sessions.h, is entered here, as
 * requests arrive). */
static enum MHD_Result run(struct http *h, struct MHD_Connection *conn, struct exchange *x)
{
    bool is_cell = x->rt == ROUTE_SESSION_RUN;
    struct json_request r = {0};
    struct sbx_error err = {0};
    struct sbx_result *res = NULL;
    struct session_cell *cell = NULL;
    struct job j = {0};
    enum MHD_Result ok;
    bool restored = false;
    const char *body = x->body ? x->body : "";
    char *text;
    int rc;

    rc = is_cell ? json_request_parse_cell(body, x->len, x->name, &h->o->ceilings, &r, &err)
                 : json_request_parse(body, x->len, &h->o->ceilings, &r, &err);
    if (rc == 0 && !is_cell && (r.session || r.session_close))
        rc = sbx_fail(&err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                      "over HTTP a session's cell is POST /v1/sessions/NAME/run, and "
                      "DELETE /v1/sessions/NAME closes it");
    if (rc == 0 && is_cell && r.req.n_tools)
        rc = sbx_fail(&err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                      "a session's cell takes no host tools");
    if (rc == 0 && is_cell)
        rc = session_enter(h->tables[x->tenant], x->name, r.cell, &cell, &err);
    if (rc < 0) {
        text = json_answer_error(r.id_text, &err);
        count_refused(h, err.code);
        json_request_free(&r);
        return send_text(conn, status_for(err.code), text, JSON_TYPE, false);
    }
    if (r.cancel_text) {
        ok = send_error(h, conn, MHD_HTTP_BAD_REQUEST, NULL, SBX_ERR_INVALID_REQUEST,
                        "cancel messages are for the JSON-lines server; over HTTP, close the "
                        "connection to cancel its run");
        json_request_free(&r);
        return ok;
    }
    if (r.is_tool_result) {
        ok = send_error(h, conn, MHD_HTTP_BAD_REQUEST, r.id_text, SBX_ERR_INVALID_REQUEST,
                        "over HTTP a tool's result is POST /v1/runs/RUN_ID/tool_results");
        json_request_free(&r);
        return ok;
    }
    /* A run with host tools is streamed: its calls are lines of it. */
    if (r.stream || r.req.n_tools)
        return run_streamed(h, conn, &r, cell, x->tenant);
    if (!(j.cancel = sbx_cancel_new())) {
        session_leave(cell);
        json_request_free(&r);
        return send_error(h, conn, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, SBX_ERR_UNAVAILABLE,
                          "out of memory");
    }
    r.req.cancel = j.cancel;
    const union MHD_ConnectionInfo *ci =
        mhd.get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    j.fd = ci ? ci->connect_fd : -1;
    job_add(h, &j);
    uint64_t t0 = now_ns();
    rc = cell ? session_run(cell, &r.req, r.rollback, &res, &restored, &err)
              : h->o->backend->run(h->o->backend->self, &r.req, &res, &err);
    job_done(h, &j, rc == 0 ? res : NULL, (double)(now_ns() - t0) / 1e9, is_cell);
    if (rc == 0) {
        text = is_cell ? json_answer_session(r.id_text, res, x->name, restored)
                       : json_answer_result(r.id_text, res);
        sbx_result_free(res);
        res = NULL;
        ok = send_held(h, conn, x->tenant, text);
    } else {
        text = json_answer_error(r.id_text, &err);
        count_refused(h, err.code);
        ok = send_text(conn, status_for(err.code), text, JSON_TYPE, false);
    }
    sbx_result_free(res);
    sbx_cancel_free(j.cancel);
    json_request_free(&r);
    return ok;
}

/* GET /v1/sessions: the caller's tenant's open sessions. */
static enum MHD_Result list_sessions(struct http *h, struct MHD_Connection *conn,
                                     struct exchange *x)
{
    struct session_table *t = h->tables[x->tenant];
    size_t cap = 16, n;
    struct session_info *info = NULL;

    for (;;) {
        struct session_info *p = realloc(info, cap * sizeof(*info));
        if (!p) {
            free(info);
            return MHD_NO;
        }
        info = p;
        if ((n = session_list(t, true, info, cap)) <= cap)
            break;
        cap = n + 16; /* more opened meanwhile: again, with room */
    }
    json_t *list = json_array();
    for (size_t i = 0; list && i < n; i++)
        if (json_array_append_new(list, json_pack("{s:s, s:I, s:f, s:b, s:I, s:I, s:b}", "name",
                                                  info[i].name, "cells", (json_int_t)info[i].cells,
                                                  "idle_seconds", info[i].idle_seconds, "running",
                                                  info[i].running, "memory_limit_bytes",
                                                  (json_int_t)info[i].memory_bytes, "max_rss_kb",
                                                  (json_int_t)info[i].max_rss_kb, "hibernated",
                                                  info[i].hibernated)) < 0) {
            json_decref(list);
            list = NULL;
        }
    free(info);
    json_t *o = list ? json_pack("{s:o}", "sessions", list) : NULL;
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return send_text(conn, MHD_HTTP_OK, text, JSON_TYPE, false);
}

/* DELETE /v1/sessions/NAME: 200 {"session_closed": NAME}, or 404 when the
 * caller's tenant has no such session (another's is never seen). */
static enum MHD_Result close_session(struct http *h, struct MHD_Connection *conn,
                                     struct exchange *x)
{
    struct sbx_error err;

    if (session_close(h->tables[x->tenant], x->name, &err) < 0)
        return refuse(h, conn, MHD_HTTP_NOT_FOUND, REF_NOT_FOUND, NULL, false,
                      "no open session is called \"%s\"", x->name);
    json_t *o = json_pack("{s:s}", "session_closed", x->name);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return send_text(conn, MHD_HTTP_OK, text, JSON_TYPE, false);
}

/* A session's family: its name up to its first '~' (all of it when it has
 * none). The load balancer pins a session by its family
 * (deploy/nginx/pysbx.conf), so a branch must be of its origin's, or its
 * cells would be sent to a replica that does not hold it. */
static size_t family_len(const char *name)
{
    return strcspn(name, "~");
}

static bool valid_path_name(const char *name)
{
    size_t n = strlen(name);

    if (n == 0 || n > SESSION_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)name[i]) && !strchr("._~-", name[i]))
            return false;
    return true;
}

/* POST /v1/sessions/NAME/fork, {"to": "NAME2"}: 200 {"session_forked":
 * {"from", "to", "cell"}}; 404 when the caller's tenant has no session
 * NAME, 409 when it has one called NAME2, 410 when NAME is lost. */
static enum MHD_Result fork_session(struct http *h, struct MHD_Connection *conn, struct exchange *x)
{
    struct sbx_error err = {0};
    json_error_t jerr;
    json_t *o = json_loadb(x->body ? x->body : "", x->len, JSON_REJECT_DUPLICATES, &jerr);
    json_t *to = json_object_get(o, "to");
    const char *name = json_string_value(to);
    struct session_cell *cfrom = NULL, *cto = NULL;
    uint64_t cells = 0;
    enum MHD_Result ok;

    if (!json_is_object(o) || json_object_size(o) != 1 || !name ||
        strlen(name) != json_string_length(to) || !valid_path_name(name)) {
        json_decref(o);
        return send_error(h, conn, MHD_HTTP_BAD_REQUEST, NULL, SBX_ERR_INVALID_REQUEST,
                          "a fork's body is {\"to\": NAME}, NAME 1 to %d of A-Z a-z 0-9 . _ ~ -",
                          SESSION_NAME_MAX);
    }
    if (strcmp(name, x->name) == 0 || family_len(name) != family_len(x->name) ||
        strncmp(name, x->name, family_len(name)) != 0) {
        ok = send_error(h, conn, MHD_HTTP_BAD_REQUEST, NULL, SBX_ERR_INVALID_REQUEST,
                        "a branch of \"%s\" is named %.*s~SOMETHING: a session's name up to "
                        "its first ~ is what pins it to a replica, and a branch lives where its "
                        "origin does",
                        x->name, (int)family_len(x->name), x->name);
        json_decref(o);
        return ok;
    }
    struct session_table *t = h->tables[x->tenant];
    int rc = session_enter_fork(t, x->name, name, &cfrom, &cto, &err);
    if (rc == 0)
        rc = session_fork(cfrom, cto, &cells, &err);
    if (rc == 0) {
        json_t *a = json_pack("{s:{s:s,s:s,s:I}}", "session_forked", "from", x->name, "to", name,
                              "cell", (json_int_t)cells);
        char *text = a ? json_dumps(a, JSON_COMPACT) : NULL;
        json_decref(a);
        ok = send_text(conn, MHD_HTTP_OK, text, JSON_TYPE, false);
    } else {
        count_refused(h, err.code);
        unsigned status = rc == -ENOENT   ? MHD_HTTP_NOT_FOUND
                          : rc == -EEXIST ? MHD_HTTP_CONFLICT
                                          : status_for(err.code);
        ok = send_text(conn, status, json_answer_error(NULL, &err), JSON_TYPE, false);
    }
    json_decref(o);
    return ok;
}

/* POST /v1/sessions/NAME/hibernate (no body, or {}): 200
 * {"session_hibernated": {"name", "bytes"}}, after the cells of NAME sent
 * before it; 404 when the caller's tenant has no session NAME, 410 when it
 * is lost, 400 without --state-dir, 503 when its image could not be
 * written (the session goes on). */
static enum MHD_Result hibernate_session(struct http *h, struct MHD_Connection *conn,
                                         struct exchange *x)
{
    struct sbx_error err = {0};
    struct session_cell *c = NULL;
    uint64_t bytes = 0;
    json_error_t jerr;
    json_t *o = x->len ? json_loadb(x->body, x->len, 0, &jerr) : NULL;
    bool empty = !x->len || (json_is_object(o) && json_object_size(o) == 0);

    json_decref(o);
    if (!empty)
        return send_error(h, conn, MHD_HTTP_BAD_REQUEST, NULL, SBX_ERR_INVALID_REQUEST,
                          "a hibernation's body is empty, or {}");
    int rc = session_enter(h->tables[x->tenant], x->name, 0, &c, &err);
    if (rc == 0)
        rc = session_hibernate(c, &bytes, &err);
    if (rc == 0) {
        json_t *a = json_pack("{s:{s:s,s:I}}", "session_hibernated", "name", x->name, "bytes",
                              (json_int_t)bytes);
        char *text = a ? json_dumps(a, JSON_COMPACT) : NULL;
        json_decref(a);
        return send_text(conn, MHD_HTTP_OK, text, JSON_TYPE, false);
    }
    count_refused(h, err.code);
    return send_text(conn, rc == -ENOENT ? MHD_HTTP_NOT_FOUND : status_for(err.code),
                     json_answer_error(NULL, &err), JSON_TYPE, false);
}

/* /v1/runs/RUN_ID/tool_results, its id into |id| (RUN_ID_LEN + 1). */
static bool tool_results_path(const char *url, char *id)
{
    static const char head[] = "/v1/runs/", tail[] = "/tool_results";
    size_t n = strlen(url);

    if (n != strlen(head) + RUN_ID_LEN + strlen(tail) || strncmp(url, head, strlen(head)) != 0 ||
        strcmp(url + strlen(head) + RUN_ID_LEN, tail) != 0)
        return false;
    for (size_t i = 0; i < RUN_ID_LEN; i++) {
        char c = url[strlen(head) + i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return false;
        id[i] = c;
    }
    id[RUN_ID_LEN] = '\0';
    return true;
}

/* POST /v1/runs/RUN_ID/tool_results: {"call": N, "content": any JSON} or
 * {"call": N, "error": "message"}, the answer to call N of that run (one
 * of this server's, whose stream said its run_id, started with the same
 * tenant's token: another tenant's run is not found). 200 {"run_id", "call"}
 * when the call takes it; else refused, nothing changed: 404 for a run
 * that is not in flight here, 409 for a call not waiting (never made,
 * refused, answered, or its run ended), 413 past the run's max_tool_bytes. */
static enum MHD_Result tool_results(struct http *h, struct MHD_Connection *conn, const char *url,
                                    struct exchange *x)
{
    static const char *const fields[] = {"call", "content", "error"};
    char id[RUN_ID_LEN + 1];
    json_error_t je;
    json_t *o = json_loadb(x->body ? x->body : "", x->len, 0, &je);
    json_t *call = json_object_get(o, "call"), *content = json_object_get(o, "content");
    json_t *error = json_object_get(o, "error");
    const char *k;
    json_t *v;
    bool known = json_is_object(o);

    json_object_foreach(o, k, v)
    {
        size_t i = 0;
        while (i < ARRAY_SIZE(fields) && strcmp(k, fields[i]) != 0)
            i++;
        known = known && i < ARRAY_SIZE(fields);
    }
    if (!tool_results_path(url, id) || !known || !json_is_integer(call) ||
        json_integer_value(call) < 1 || !content == !error || (error && !json_is_string(error))) {
        json_decref(o);
        return send_error(h, conn, MHD_HTTP_BAD_REQUEST, NULL, SBX_ERR_INVALID_REQUEST,
                          "a tool result is {\"call\": N, \"content\": any JSON} or "
                          "{\"call\": N, \"error\": string}");
    }
    uint64_t n = (uint64_t)json_integer_value(call);
    char *text = content ? json_dumps(content, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    int rc = -ESRCH;
    struct live *found = NULL;
    /* Found under the server's lock and held by a reference of its own: the
     * result (up to 16 MiB) is parsed without holding up every other run. */
    pthread_mutex_lock(&h->lock);
    for (struct live *l = h->tooled; l && !found; l = l->tnext)
        if (strcmp(l->run_id, id) == 0 && l->tenant == x->tenant) {
            pthread_mutex_lock(&l->lock);
            l->refs++;
            pthread_mutex_unlock(&l->lock);
            found = l;
        }
    pthread_mutex_unlock(&h->lock);
    if (found) {
        rc = error  ? sbx_tool_fail(found->answers, n, json_string_value(error))
             : text ? sbx_tool_answer(found->answers, n, text, strlen(text))
                    : -ENOMEM;
        live_unref(found);
    }
    free(text);
    json_decref(o);
    if (rc == 0) {
        json_t *ok = json_pack("{s:s, s:I}", "run_id", id, "call", (json_int_t)n);
        char *body = ok ? json_dumps(ok, JSON_COMPACT) : NULL;
        json_decref(ok);
        return send_text(conn, MHD_HTTP_OK, body, JSON_TYPE, false);
    }
    if (rc == -ESRCH)
        return refuse(h, conn, MHD_HTTP_NOT_FOUND, REF_NOT_FOUND, NULL, false,
                      "no run %s with tools is in flight here", id);
    if (rc == -E2BIG)
        return send_error(h, conn, MHD_HTTP_CONTENT_TOO_LARGE, NULL, SBX_ERR_TOO_LARGE,
                          "the result is longer than the run's max_tool_bytes");
    if (rc == -EALREADY)
        return send_error(h, conn, MHD_HTTP_CONFLICT, NULL, SBX_ERR_INVALID_REQUEST,
                          "call %llu of run %s is answered already", (unsigned long long)n, id);
    if (rc == -ENOENT)
        return send_error(h, conn, MHD_HTTP_CONFLICT, NULL, SBX_ERR_INVALID_REQUEST,
                          "run %s has no call %llu waiting (never made, refused, or its run "
                          "ended)",
                          id, (unsigned long long)n);
    return send_error(h, conn, rc == -ENOMEM ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_BAD_REQUEST,
                      NULL, rc == -ENOMEM ? SBX_ERR_UNAVAILABLE : SBX_ERR_INVALID_REQUEST,
                      "the result could not be taken (%s)", strerror(-rc));
}

/* Takes what arrived of the body, up to --max-line-bytes. */
static void take_body(struct exchange *x, size_t max, const char *data, size_t n)
{
    if (x->too_large || x->len + n > max) {
        x->too_large = true;
        x->discarded += n;
        return;
    }
    if (x->len + n + 1 > x->cap) {
        size_t cap = x->cap ? x->cap : 4096;
        while (cap < x->len + n + 1)
            cap *= 2;
        char *p = realloc(x->body, cap);
        if (!p) {
            x->too_large = true; /* answered as too large for this server */
            return;
        }
        x->body = p;
        x->cap = cap;
    }
    memcpy(x->body + x->len, data, n);
    x->len += n;
    x->body[x->len] = '\0';
}

/* /v1/sessions/NAME/TAIL (|tail| "": /v1/sessions/NAME), NAME into |name|:
 * 1 to SESSION_NAME_MAX of A-Z a-z 0-9 . _ ~ - (no escape is needed in a
 * path, so a load balancer hashing the path and this server see one name). */
static bool session_path(const char *url, const char *tail, char *name)
{
    static const char head[] = "/v1/sessions/";
    size_t n = 0;

    if (strncmp(url, head, strlen(head)) != 0)
        return false;
    url += strlen(head);
    while (url[n] && (isalnum((unsigned char)url[n]) || strchr("._~-", url[n])))
        n++;
    if (n == 0 || n > SESSION_NAME_MAX || strcmp(url + n, tail) != 0)
        return false;
    memcpy(name, url, n);
    name[n] = '\0';
    return true;
}

static enum route route_of(const char *url, char *name)
{
    char id[RUN_ID_LEN + 1];

    if (strcmp(url, "/v1/run") == 0)
        return ROUTE_RUN;
    if (tool_results_path(url, id))
        return ROUTE_TOOL_RESULTS;
    if (strcmp(url, "/v1/sessions") == 0)
        return ROUTE_SESSIONS;
    if (session_path(url, "/run", name))
        return ROUTE_SESSION_RUN;
    if (session_path(url, "/fork", name))
        return ROUTE_SESSION_FORK;
    if (session_path(url, "/hibernate", name))
        return ROUTE_SESSION_HIBERNATE;
    if (session_path(url, "", name))
        return ROUTE_SESSION;
    if (strcmp(url, "/healthz") == 0)
        return ROUTE_HEALTH;
    if (strcmp(url, "/metrics") == 0)
        return ROUTE_METRICS;
    return ROUTE_NONE;
}

static bool is(const char *method, const char *want)
{
    return strcmp(method, want) == 0;
}

/* The first call for a request, before its body: everything that can be
 * refused without reading it (an answer queued now closes the connection
 * after it). Returns MHD_YES with nothing queued to go on. */
static enum MHD_Result screen(struct http *h, struct MHD_Connection *conn, const char *url,
                              const char *method, struct exchange *x)
{
    enum route rt = x->rt;
    bool get = is(method, MHD_HTTP_METHOD_GET) || is(method, MHD_HTTP_METHOD_HEAD);
    bool post = rt == ROUTE_RUN || rt == ROUTE_TOOL_RESULTS || rt == ROUTE_SESSION_RUN ||
                rt == ROUTE_SESSION_FORK || rt == ROUTE_SESSION_HIBERNATE;
    bool del = rt == ROUTE_SESSION;
    const char *allow = post ? "POST" : del ? "DELETE" : "GET, HEAD";
    const char *cl, *te;

    /* A body framed two ways (RFC 9112, 6.1), or by a coding we do not
     * know: what follows it on the connection could be read as another
     * request (smuggling). Refused, and the connection closed. */
    cl = mhd.lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    te = mhd.lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    if (te && (cl || strcasecmp(te, "chunked") != 0))
        return refuse(h, conn, MHD_HTTP_BAD_REQUEST, REF_FRAMING, NULL, true,
                      cl ? "a request with both Content-Length and Transfer-Encoding is refused"
                         : "Transfer-Encoding other than chunked is refused: %.40s",
                      te);
    char path[3 * 100 + 1], verb[3 * 20 + 1];
    shown(path, sizeof(path), url, 100);
    shown(verb, sizeof(verb), method, 20);
    if (rt == ROUTE_NONE)
        return refuse(h, conn, MHD_HTTP_NOT_FOUND, REF_NOT_FOUND, NULL, false,
                      "no such path: %s (POST /v1/run, POST /v1/runs/RUN_ID/tool_results, "
                      "POST /v1/sessions/NAME/run, POST /v1/sessions/NAME/fork, "
                      "POST /v1/sessions/NAME/hibernate, DELETE /v1/sessions/NAME, "
                      "GET /v1/sessions, "
                      "GET /healthz, GET /metrics; NAME: 1 to %d of A-Z a-z 0-9 . _ ~ -)",
                      path, SESSION_NAME_MAX);
    if (post ? !is(method, MHD_HTTP_METHOD_POST) : del ? !is(method, MHD_HTTP_METHOD_DELETE) : !get)
        return refuse(h, conn, MHD_HTTP_METHOD_NOT_ALLOWED, REF_METHOD, allow, false,
                      "%s takes %s, not %s", path, allow, verb);
    x->tenant = tenant_of(h, conn);
    bool authed = x->tenant >= 0;
    /* /healthz needs no token, and earns none of the reserve either. */
    conn_headers_in(h, conn, authed && (h->n_tokens || rt != ROUTE_HEALTH));
    if (rt != ROUTE_HEALTH && !authed)
        return refuse(h, conn, MHD_HTTP_UNAUTHORIZED, REF_UNAUTHORIZED, NULL, false,
                      "a valid bearer token is required (Authorization: Bearer ...)");
    if (!post)
        return MHD_YES;
    /* A run in flight during the drain still has its tools answered. */
    if (rt != ROUTE_TOOL_RESULTS && is_draining(h))
        return send_error(h, conn, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, SBX_ERR_UNAVAILABLE,
                          "the server is shutting down");
    uint64_t n;
    if (cl && parse_u64(cl, &n) == 0 && n > h->o->max_line_bytes)
        return send_error(h, conn, MHD_HTTP_CONTENT_TOO_LARGE, NULL, SBX_ERR_TOO_LARGE,
                          "request body longer than %zu bytes", h->o->max_line_bytes);
    return MHD_YES;
}

/* libmicrohttpd decodes a path's %XX escapes in place and hands on a C
 * string: a decoded %00 would end the path there, and
 * DELETE /v1/sessions/victim%00-of-someone-else would close "victim" (a
 * front end that escapes the names its users choose would pass it on).
 * Such a path is left as it was sent, which no route matches: every
 * route is plain ASCII without '%'. (A raw NUL byte in the request line
 * cuts the path before this is called; only a client that could name the
 * session outright can send one.) */
static size_t unescape(void *cls, struct MHD_Connection *conn, char *s)
{
    (void)cls;
    (void)conn;
    for (const char *p = strchr(s, '%'); p; p = strchr(p + 1, '%'))
        if (p[1] == '0' && p[2] == '0')
            return strlen(s);
    return mhd.http_unescape(s);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *data,
                              size_t *data_size, void **state)
{
    struct http *h = cls;
    struct exchange *x = *state;

    (void)version;
    if (!x) {
        if (!(x = calloc(1, sizeof(*x))))
            return MHD_NO;
        *state = x;
        x->rt = route_of(url, x->name);
        pthread_mutex_lock(&h->lock);
        h->open++;
        pthread_mutex_unlock(&h->lock);
        return screen(h, conn, url, method, x);
    }
    if (*data_size) {
        take_body(x, h->o->max_line_bytes, data, *data_size);
        *data_size = 0;
        /* libmicrohttpd takes no answer before the body has ended: a
         * chunked body over the limit is read and thrown away to its end,
         * then answered 413, unless it goes on for as much again: then the
         * connection is closed without an answer. */
        return x->discarded > h->o->max_line_bytes ? MHD_NO : MHD_YES;
    }
    conn_due(h, conn, 0); /* the request is in: its run has its own limits */
    if (x->rt == ROUTE_HEALTH)
        return healthz(h, conn);
    if (x->rt == ROUTE_METRICS)
        return metrics(h, conn);
    if (x->rt == ROUTE_SESSIONS)
        return list_sessions(h, conn, x);
    if (x->rt == ROUTE_SESSION)
        return close_session(h, conn, x);
    if (x->too_large)
        return send_error(h, conn, MHD_HTTP_CONTENT_TOO_LARGE, NULL, SBX_ERR_TOO_LARGE,
                          "request body longer than %zu bytes", h->o->max_line_bytes);
    if (x->rt == ROUTE_TOOL_RESULTS)
        return tool_results(h, conn, url, x);
    if (x->rt == ROUTE_SESSION_FORK)
        return fork_session(h, conn, x);
    if (x->rt == ROUTE_SESSION_HIBERNATE)
        return hibernate_session(h, conn, x);
    return run(h, conn, x);
}

/* --metrics-http: GET (or HEAD) /metrics and nothing else, without the
 * token. What it answers is counts and gauges: no code, output, file or
 * token of anyone's. A body is never read: a request with one is answered
 * when it has arrived, and a connection that sends more than a header's
 * room is closed by libmicrohttpd. */
static enum MHD_Result handle_metrics_only(void *cls, struct MHD_Connection *conn, const char *url,
                                           const char *method, const char *version,
                                           const char *data, size_t *data_size, void **state)
{
    static int seen;

    (void)version;
    (void)data;
    if (!*state) {
        *state = &seen; /* the headers: answer once the request is whole */
        return MHD_YES;
    }
    if (*data_size) {
        *data_size = 0;
        return MHD_YES;
    }
    if (strcmp(url, "/metrics") != 0)
        return send_text(conn, MHD_HTTP_NOT_FOUND,
                         strdup("{\"error\": {\"code\": \"not_found\", \"message\": \"this "
                                "address serves GET /metrics only\"}}"),
                         JSON_TYPE, true);
    if (!is(method, MHD_HTTP_METHOD_GET) && !is(method, MHD_HTTP_METHOD_HEAD))
        return send_text_allow(conn, MHD_HTTP_METHOD_NOT_ALLOWED,
                               strdup("{\"error\": {\"code\": \"method_not_allowed\", "
                                      "\"message\": \"/metrics takes GET, HEAD\"}}"),
                               JSON_TYPE, true, "GET, HEAD");
    return metrics(cls, conn);
}

static void completed(void *cls, struct MHD_Connection *conn, void **state,
                      enum MHD_RequestTerminationCode why)
{
    struct http *h = cls;
    struct exchange *x = *state;

    (void)why;
    conn_due(h, conn, now_ns() + (IDLE_TIMEOUT_S + HEADER_DEADLINE_S) * 1000000000ULL);
    if (!x)
        return;
    free(x->body);
    free(x);
    *state = NULL;
    pthread_mutex_lock(&h->lock);
    h->open--;
    pthread_mutex_unlock(&h->lock);
    efd_notify(h->wake_fd);
}

static void log_mhd(void *cls, const char *format, va_list ap)
{
    (void)cls;
    fputs("pysbx serve: ", stderr);
    vfprintf(stderr, format, ap);
}

/* --- clients that hang up ---------------------------------------------------------- */

/* Polls the connections of the runs in flight; a client that hangs up (or
 * shuts its sending side: an HTTP client waiting for its answer does not)
 * has its run cancelled, as the JSON-lines server does. A connection's
 * descriptor stays its own while its run is on the list: libmicrohttpd
 * closes it only after the handler returned. */
static void *watcher_main(void *p)
{
    struct http *h = p;
    struct pollfd *fds = NULL;
    size_t cap = 0;

    for (;;) {
        size_t n = 1;
        pthread_mutex_lock(&h->lock);
        if (h->unwatched) {
            pthread_mutex_unlock(&h->lock);
            break;
        }
        if (cap < h->running + 1) {
            struct pollfd *more = realloc(fds, (h->running + 1) * sizeof(*fds));
            if (more) {
                fds = more;
                cap = h->running + 1;
            }
        }
        if (fds) {
            fds[0] = (struct pollfd){h->watch_fd, POLLIN, 0};
            for (struct job *j = h->jobs; j && n < cap; j = j->next)
                if (j->fd >= 0 && !sbx_cancel_fired(j->cancel))
                    fds[n++] = (struct pollfd){j->fd, POLLRDHUP, 0};
        }
        pthread_mutex_unlock(&h->lock);
        struct pollfd wake = {h->watch_fd, POLLIN, 0};
        if (poll(fds ? fds : &wake, fds ? n : 1, cut_the_slow(h)) < 0 && errno != EINTR)
            break;
        if ((fds ? fds : &wake)[0].revents)
            efd_consume(h->watch_fd);
        for (size_t i = 1; i < n; i++) {
            if (!(fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)))
                continue;
            pthread_mutex_lock(&h->lock);
            for (struct job *j = h->jobs; j; j = j->next)
                if (j->fd == fds[i].fd && !sbx_cancel_fired(j->cancel)) {
                    sbx_cancel_fire(j->cancel);
                    fputs("pysbx serve: a client hung up; its run is cancelled\n", stderr);
                }
            pthread_mutex_unlock(&h->lock);
        }
    }
    free(fds);
    return NULL;
}

/* --- the drain ------------------------------------------------------------------ */

static bool reached(void *p, enum drain_until what)
{
    struct http *h = p;

    pthread_mutex_lock(&h->lock);
    bool yes = what == NO_RUNS ? h->running == 0 : h->open == 0;
    pthread_mutex_unlock(&h->lock);
    return yes;
}

static void cancel_all(void *p)
{
    struct http *h = p;

    pthread_mutex_lock(&h->lock);
    h->cancelling = true;
    for (struct job *j = h->jobs; j; j = j->next)
        sbx_cancel_fire(j->cancel);
    pthread_mutex_unlock(&h->lock);
}

/* Stopping the daemon cuts off whoever is left. */
static void drop_none(void *p)
{
    (void)p;
}

/* --- start-up ------------------------------------------------------------------ */

static bool loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(a))
        return a->s6_addr[12] == 127;
    return IN6_IS_ADDR_LOOPBACK(a);
}

/* "127.0.0.1:8080", "[::1]:8080", "0.0.0.0:0", "localhost:8080" (a name
 * is resolved, and its first address used). Returns a listening socket or
 * -errno, having said why: -EINVAL for a bad address, -EACCES for one that
 * is not loopback when there is no token. */
static int open_http_listener(const char *opt, const char *spec, bool token, char *shown,
                              size_t cap)
{
    struct addrinfo hints = {.ai_flags = AI_NUMERICSERV | AI_PASSIVE, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    const char *colon = strrchr(spec, ':');
    char host[256];
    size_t hl = colon ? (size_t)(colon - spec) : 0;
    int fd = -1, one = 1, rc;

    if (!colon || hl == 0 || hl >= sizeof(host) || !colon[1]) {
        fprintf(stderr,
                "pysbx serve: %s wants ADDR:PORT (127.0.0.1:8080, [::1]:8080), "
                "not '%s'\n",
                opt, spec);
        return -EINVAL;
    }
    memcpy(host, spec, hl);
    host[hl] = '\0';
    if (host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    rc = getaddrinfo(host, colon + 1, &hints, &ai);
    if (rc != 0) {
        fprintf(stderr, "pysbx serve: %s %s: %s (an address or a host name, and a port number)\n",
                opt, spec, gai_strerror(rc));
        return -EINVAL;
    }
    if (!token && !loopback(ai->ai_addr)) {
        fprintf(stderr,
                "pysbx serve: %s %s is not a loopback address: refusing to serve "
                "it without --http-token-file\n",
                opt, spec);
        freeaddrinfo(ai);
        return -EACCES;
    }
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, LISTEN_BACKLOG) < 0) {
        rc = -errno;
        fprintf(stderr, "pysbx serve: %s %s: %s\n", opt, spec, strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return rc;
    }
    freeaddrinfo(ai);

    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char a[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        bool v4 = ss.ss_family == AF_INET;
        const void *in = v4 ? (const void *)&((struct sockaddr_in *)&ss)->sin_addr
                            : (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr;
        inet_ntop(ss.ss_family, in, a, sizeof(a));
        port = ntohs(v4 ? ((struct sockaddr_in *)&ss)->sin_port
                        : ((struct sockaddr_in6 *)&ss)->sin6_port);
        fmt(shown, cap, v4 ? "%s:%u" : "[%s]:%u", a, port);
    }
    return fd;
}

/* The token: the file's text without surrounding white space; printable
 * ASCII only, so that it fits in a header as it is. */
/* --http-token-file: a token a line, each a tenant of its own (blank lines
 * skipped); a token is printable ASCII without spaces, at most TOKEN_MAX
 * bytes, and none is there twice. Returns 0 with h->tokens, or -errno
 * having said why. */
static int load_tokens(struct http *h, const char *path)
{
    char *t = NULL;
    size_t n = 0;
    unsigned line = 0;
    int rc = slurp(path, TOKEN_FILE_MAX, &t, &n);

    if (rc < 0) {
        fprintf(stderr, "pysbx serve: --http-token-file %s: %s\n", path,
                rc == -EFBIG ? "longer than 1 MiB" : strerror(-rc));
        return rc;
    }
    h->tokens = calloc(TENANTS_MAX, sizeof(*h->tokens));
    h->token_lens = calloc(TENANTS_MAX, sizeof(*h->token_lens));
    rc = h->tokens && h->token_lens ? 0 : -ENOMEM;
    for (size_t at = 0; rc == 0 && at < n;) {
        size_t end = at;
        while (end < n && t[end] != '\n')
            end++;
        size_t a = at, b = end;
        at = end + 1;
        line++;
        while (a < b && isspace((unsigned char)t[a]))
            a++;
        while (b > a && isspace((unsigned char)t[b - 1]))
            b--;
        if (a == b)
            continue;
        const char *why = NULL;
        for (size_t i = a; i < b && !why; i++)
            if (t[i] <= ' ' || t[i] >= 0x7f)
                why = "a token is printable ASCII without spaces";
        if (!why && b - a > TOKEN_MAX)
            why = "a token is at most 4096 bytes";
        for (unsigned i = 0; !why && i < h->n_tokens; i++)
            if (h->token_lens[i] == b - a && memcmp(h->tokens[i], t + a, b - a) == 0)
                why = "the same token twice: each line is a tenant of its own";
        if (!why && h->n_tokens == TENANTS_MAX)
            why = "more than 1024 tokens";
        if (why) {
            fprintf(stderr, "pysbx serve: --http-token-file %s, line %u: %s\n", path, line, why);
            rc = -EINVAL;
        } else if (!(h->tokens[h->n_tokens] = strndup(t + a, b - a)))
            rc = -ENOMEM;
        else
            h->token_lens[h->n_tokens++] = b - a;
    }
    if (rc == 0 && !h->n_tokens) {
        fprintf(stderr, "pysbx serve: --http-token-file %s: empty (no token in it)\n", path);
        rc = -EINVAL;
    }
    if (rc == -ENOMEM)
        fprintf(stderr, "pysbx serve: out of memory\n");
    free(t);
    return rc;
}

int http_main(const struct serve_opts *o)
{
    struct http h = {.o = o, .wake_fd = -1, .watch_fd = -1};
    pthread_t watcher;
    bool watching = false;
    struct MHD_Daemon *d = NULL, *md = NULL;
    char shown[INET6_ADDRSTRLEN + 16] = "", mshown[INET6_ADDRSTRLEN + 16] = "";
    int sfd = -1, lfd = -1, mfd = -1, rc = EXIT_USAGE;

    pthread_mutex_init(&h.lock, NULL);
    pthread_mutex_init(&h.held_lock, NULL);
    sfd = stop_signals_open();
    h.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    h.watch_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (sfd < 0 || h.wake_fd < 0 || h.watch_fd < 0) {
        fprintf(stderr, "pysbx serve: %s\n", strerror(errno));
        rc = 1;
        goto out;
    }
    if (o->token_file && load_tokens(&h, o->token_file) < 0)
        goto out;
    h.n_tables = h.n_tokens ? h.n_tokens : 1;
    if (!(h.tables = calloc(h.n_tables, sizeof(*h.tables))) ||
        !(h.tenant_held = calloc(h.n_tables, sizeof(*h.tenant_held)))) {
        fputs("pysbx serve: out of memory\n", stderr);
        rc = 1;
        goto out;
    }
    for (unsigned i = 0; i < h.n_tables; i++) {
        uint8_t tenant[STATE_TENANT_BYTES];
        /* A tenant's images are bound to its token (a MAC of it: the
         * token is never written down), wherever it is in the file. */
        if (!(h.tables[i] = session_table_new(o->backend, &o->session_limits)) ||
            (o->state && state_dir_tenant(o->state, h.n_tokens ? "http-token" : "http-open",
                                          h.n_tokens ? h.tokens[i] : "",
                                          h.n_tokens ? h.token_lens[i] : 0, tenant) < 0)) {
            fputs("pysbx serve: out of memory\n", stderr);
            rc = 1;
            goto out;
        }
        if (o->state)
            session_table_hibernate_to(h.tables[i], o->state, tenant);
    }
    if (o->state && o->hibernate_after &&
        !(h.idler = session_idler_start(h.tables, h.n_tables, o->hibernate_after))) {
        fputs("pysbx serve: cannot start a thread\n", stderr);
        rc = 1;
        goto out;
    }
    if ((lfd = open_http_listener("--http", o->http_addr, h.n_tokens > 0, shown, sizeof(shown))) <
        0) {
        rc = lfd == -EINVAL || lfd == -EACCES ? EXIT_USAGE : 1;
        goto out;
    }
    /* The scraper's listener serves counts and nothing else: any address. */
    if (o->metrics_addr && (mfd = open_http_listener("--metrics-http", o->metrics_addr, true,
                                                     mshown, sizeof(mshown))) < 0) {
        rc = mfd == -EINVAL ? EXIT_USAGE : 1;
        goto out;
    }
    if (mhd_load() < 0) {
        rc = 1;
        goto out;
    }
    d = mhd.start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                             MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG,
                         0, NULL, NULL, handle, &h, MHD_OPTION_EXTERNAL_LOGGER, log_mhd, NULL,
                         MHD_OPTION_LISTEN_SOCKET, lfd, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                         (size_t)HEADER_BYTES, MHD_OPTION_CONNECTION_LIMIT, MAX_CONNECTIONS,
                         MHD_OPTION_CONNECTION_TIMEOUT, IDLE_TIMEOUT_S, MHD_OPTION_NOTIFY_COMPLETED,
                         completed, &h, MHD_OPTION_NOTIFY_CONNECTION, notify_connection, &h,
                         MHD_OPTION_PER_IP_CONNECTION_LIMIT, o->max_client_connections,
                         MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL, MHD_OPTION_END);
    if (!d || pthread_create(&watcher, NULL, watcher_main, &h) != 0) {
        fprintf(stderr, "pysbx serve: cannot start the HTTP server\n");
        rc = 1;
        goto out;
    }
    watching = true;
    /* One thread polls every scraper's connection: a few, short-lived. */
    if (mfd >= 0 &&
        !(md = mhd.start_daemon(
              MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG, 0,
              NULL, NULL, handle_metrics_only, &h, MHD_OPTION_EXTERNAL_LOGGER, log_mhd, NULL,
              MHD_OPTION_LISTEN_SOCKET, mfd, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
              (size_t)HEADER_BYTES, MHD_OPTION_CONNECTION_LIMIT, METRICS_CONNECTIONS,
              MHD_OPTION_CONNECTION_TIMEOUT, METRICS_TIMEOUT_S, MHD_OPTION_UNESCAPE_CALLBACK,
              unescape, NULL, MHD_OPTION_END))) {
        fprintf(stderr, "pysbx serve: cannot start the metrics listener\n");
        rc = 1;
        goto out;
    }
    fprintf(stderr, "pysbx serve: listening on http://%s (backend %s%s)\n", shown, o->backend->name,
            h.n_tokens == 1 ? ", bearer token required"
            : h.n_tokens    ? ", a bearer token per tenant required"
                            : "");
    if (md)
        fprintf(stderr, "pysbx serve: metrics on http://%s/metrics\n", mshown);

    struct pollfd p = {sfd, POLLIN, 0};
    while (poll(&p, 1, -1) < 0 && errno == EINTR)
        ;
    uint64_t sig[16];
    (void)!read(sfd, sig, sizeof(sig)); /* so that only another one counts */

    /* New connections are refused at once (shutdown ends the listening:
     * what waits in the backlog is reset); the descriptor itself is closed
     * only after the daemon has stopped, which may still poll it. */
    shutdown(lfd, SHUT_RDWR);
    pthread_mutex_lock(&h.lock);
    h.draining = true;
    pthread_mutex_unlock(&h.lock);
    struct drain dr = {.self = &h,
                       .wake_fd = h.wake_fd,
                       .grace_seconds = o->grace_seconds,
                       .reached = reached,
                       .cancel_all = cancel_all,
                       .drop_all = drop_none};
    int r = drain_run(&dr, sfd);
    /* Threads still holding runs: the process ends rather than free what
     * they use. */
    drain_exit_if_held(r, r == 0 && !reached(&h, NO_RUNS));
    rc = 0;
out:
    if (md)
        mhd.stop_daemon(md);
    if (d)
        mhd.stop_daemon(d);
    if (watching) {
        pthread_mutex_lock(&h.lock);
        h.unwatched = true;
        pthread_mutex_unlock(&h.lock);
        efd_notify(h.watch_fd);
        pthread_join(watcher, NULL);
    }
    if (lfd >= 0)
        close(lfd);
    close_fd(&mfd);
    /* No run is in flight: the sessions hibernate (--state-dir), before
     * they end below. */
    hibernate_at_exit(h.tables, h.tables ? h.n_tables : 0, h.idler, sfd);
    close_fd(&sfd);
    close_fd(&h.wake_fd);
    close_fd(&h.watch_fd);
    /* No run is in flight (the drain waited, or none began): the sessions
     * end here. */
    for (unsigned i = 0; h.tables && i < h.n_tables; i++)
        session_table_free(h.tables[i]);
    free(h.tables);
    free(h.tenant_held);
    for (unsigned i = 0; i < h.n_tokens; i++)
        free(h.tokens[i]);
    free(h.tokens);
    free(h.token_lens);
    pthread_mutex_destroy(&h.lock);
    pthread_mutex_destroy(&h.held_lock);
    return rc;
}
