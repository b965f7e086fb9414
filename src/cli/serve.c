/*
 * pysbx serve: JSON lines in, JSON lines out, over stdin/stdout or a UNIX
 * socket. Requests run concurrently and are answered as they finish, each
 * exactly once; a line that cannot be run is answered with an error and the
 * server goes on.
 *
 * Threads: the main thread accepts clients (or starts the one stream of
 * stdin/stdout) and handles SIGINT and SIGTERM. Each stream has a reader
 * (its lines, in order), a writer (its answers, in the order they are
 * queued) and up to --jobs run threads, which take the requests waiting
 * their turn in order. A request is on its stream's list, with its cancel
 * token, from when it is read until its answer is queued: that list is what
 * a cancel message, a client hanging up and shutdown fire. Answers go
 * through the writer so that a client that does not read holds up nobody
 * but itself.
 *
 * Sessions: each stream has its own table of them (sessions.h), by the
 * names its requests give; a request for a session enters its line as it
 * is read, so that its cells run in the order they were sent, whichever
 * run threads take them. When the stream ends, its sessions are closed.
 * With --state-dir, the names are the server's (one table every stream
 * shares): a session hibernated, or one whose connection ended, is found
 * again by its name from any connection, and after a restart; at the end
 * the server hibernates them rather than close them.
 */
#define _GNU_SOURCE
#include "commands.h"
#include "detach.h"
#include "drain.h"
#include "lines.h"
#include "reqjson.h"
#include "sbxerr.h"
#include "sessions.h"
#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <sys/file.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* Requests a stream may have read and waiting for one of its --jobs places
 * (their lines together at most --max-line-bytes): reading ahead is what
 * lets a cancel sent behind them be seen. */
#define READ_AHEAD 1024u

/* The longest run of one stream's output one event line carries: events
 * waiting to be written are joined up to it. */
#define EVENT_JOIN_BYTES 65536u

struct answer {
    struct answer *next;
    char *text;
    size_t len;
    /* An output event: its request's number on the stream (0: not an
     * event), which stream, and its text before encoding, to join more to
     * while it waits. */
    uint64_t seq;
    int stream;
    char *raw;
    size_t raw_len;
};

struct server {
    const struct serve_opts *o;
    pthread_mutex_t lock; /* conns, n_conns, cancelling; taken before a conn's */
    struct conn *conns;
    unsigned n_conns;
    bool cancelling; /* the grace is over: a run is cancelled as it registers */
    int stop_fd;     /* eventfd, written at shutdown and never read: readers stop */
    int wake_fd;     /* eventfd: a stream ended or a run did; the main thread looks */
    /* --state-dir: the sessions of every stream, by the server's names. */
    struct session_table *sessions;
    struct session_idler *idler;
};

struct job {
    struct job *next;  /* in c->jobs */
    struct job *wnext; /* in c's waiting queue */
    bool waiting;
    size_t bytes; /* of its line */
    struct conn *c;
    struct sbx_cancel *cancel;
    struct session_cell *cell;        /* its place in its session's line, until it runs */
    struct session_cell *fork_to;     /* a session_fork's place in the branch's line */
    bool hibernate;                   /* |cell| is a session_hibernate's place */
    uint64_t seq;                     /* its number among the stream's requests, from 1 */
    struct sbx_tool_answers *answers; /* a run with host tools: where their results go */
    uint64_t dropped[2];              /* bytes of stdout and stderr events not queued */
    struct json_request r;
};

/* One input stream and the answers to it. */
struct conn {
    struct server *s;
    struct conn *next;
    int in_fd, out_fd;
    bool socket; /* a client's connection, rather than stdin/stdout */
    int wake_fd; /* eventfd: a run ended, or the stream was dropped */
    pthread_t writer;
    pthread_mutex_t lock;
    pthread_cond_t changed;             /* an answer queued or written, the end, a drop */
    unsigned inflight;                  /* requests read and not yet answered */
    unsigned active;                    /* threads running this stream's requests: at most jobs */
    unsigned running;                   /* runs started and not yet returned */
    struct job *jobs;                   /* requests read and not yet answered */
    struct job *wait_head, **wait_tail; /* read, waiting for a place */
    unsigned n_waiting;
    size_t waiting_bytes;
    struct answer *head, **tail;
    struct answer *last; /* the one at the tail, not yet being written; or NULL */
    uint64_t seqs;       /* requests numbered so far */
    size_t pending;      /* bytes of answers queued or being written */
    size_t events;       /* ... of them, in output events */
    bool done;           /* no more answers will be queued */
    bool dropped;        /* the client is gone or cut off: its answers go nowhere */
    /* The stream's sessions, by the names it gave them (or the server's). */
    struct session_table *sessions;
    bool own_sessions;
};

static void answer_free(struct answer *a)
{
    free(a->text);
    free(a->raw);
    free(a);
}

static void free_answers(struct conn *c)
{
    while (c->head) {
        struct answer *a = c->head;
        c->head = a->next;
        c->pending -= a->len;
        c->events -= a->seq ? a->len : 0;
        answer_free(a);
    }
    c->tail = &c->head;
    c->last = NULL;
}

/* Puts |a| at the tail. Under c->lock. */
static void enqueue(struct conn *c, struct answer *a)
{
    a->next = NULL;
    *c->tail = a;
    c->tail = &a->next;
    c->last = a;
    c->pending += a->len;
    c->events += a->seq ? a->len : 0;
    pthread_cond_broadcast(&c->changed);
}

/* The client is gone, or will not be waited for: cancel its runs, forget its
 * answers, wake whoever waits on it. Under c->lock. */
static void drop_locked(struct conn *c, const char *why)
{
    unsigned runs = 0;

    if (c->dropped)
        return;
    c->dropped = true;
    for (struct job *j = c->jobs; j; j = j->next, runs++)
        sbx_cancel_fire(j->cancel);
    free_answers(c);
    /* Ends the reader's read() and the writer's write() on the socket. */
    if (c->socket)
        shutdown(c->in_fd, SHUT_RDWR);
    pthread_cond_broadcast(&c->changed);
    efd_notify(c->wake_fd);
    fprintf(stderr, "pysbx serve: %s %s; %u run%s cancelled\n",
            c->socket ? "a client" : "the reader of standard output", why, runs,
            runs == 1 ? "" : "s");
}

/* Takes |j| (may be NULL) out of c's waiting queue, to be run at once.
 * Under c->lock. Returns |j|. */
static struct job *unqueue(struct conn *c, struct job *j)
{
    for (struct job **pp = &c->wait_head; j && *pp; pp = &(*pp)->wnext)
        if (*pp == j) {
            *pp = j->wnext;
            if (!*pp)
                c->wait_tail = pp;
            j->waiting = false;
            c->n_waiting--;
            c->waiting_bytes -= j->bytes;
            c->running++;
            break;
        }
    return j;
}

/* Queues |line| (taken) and, when |j| is given, retires that request in the
 * same step: a cancel either finds a request or comes after its answer.
 * When |slot| (the caller holds one of the stream's places), returns the
 * next waiting request, now the caller's to run, or gives the place up. */
static struct job *finish(struct conn *c, struct job *j, char *line, bool slot)
{
    size_t max = c->s->o->max_pending_bytes;
    struct answer *a = line ? malloc(sizeof(*a)) : NULL;
    size_t len = line ? strlen(line) : 0;
    struct job *next = NULL;

    pthread_mutex_lock(&c->lock);
    /* Standard output: wait, as a blocking pipe would make us. A client:
     * past its allowance (one answer alone may exceed it), cut it off.
     * Output events have an allowance of their own (stream_output). */
    while (!c->socket && !c->dropped && c->pending > c->events &&
           c->pending - c->events + len > max)
        pthread_cond_wait(&c->changed, &c->lock);
    if (c->socket && !c->dropped && c->pending > c->events && c->pending - c->events + len > max) {
        char why[96];
        fmt(why, sizeof(why), "left more than %zu bytes of answers unread", max);
        drop_locked(c, why);
    }
    if (a && !c->dropped) {
        *a = (struct answer){.text = line, .len = len};
        enqueue(c, a);
        a = NULL;
        line = NULL;
    }
    if (j) {
        for (struct job **pp = &c->jobs; *pp; pp = &(*pp)->next)
            if (*pp == j) {
                *pp = j->next;
                break;
            }
        c->inflight--;
        if (slot && !(next = unqueue(c, c->wait_head)))
            c->active--;
        efd_notify(c->wake_fd);
        /* Before the unlock: once it is done, the stream (and, at the end,
         * the server) may be gone. */
        efd_notify(c->s->wake_fd);
    }
    pthread_mutex_unlock(&c->lock);
    free(a);
    free(line);
    return next;
}

/* An answer with the request's id whatever went wrong, if memory allows. */
static char *or_fallback(char *line, const char *id_text)
{
    char *l = NULL;

    if (line)
        return line;
    if (asprintf(&l,
                 "{\"id\":%s,\"error\":{\"code\":\"sandbox_unavailable\","
                 "\"message\":\"out of memory\"}}\n",
                 id_text ? id_text : "null") < 0)
        return NULL;
    return l;
}

static void answer_error(struct conn *c, const char *id_text, const struct sbx_error *err)
{
    finish(c, NULL, or_fallback(json_answer_error(id_text, err), id_text), false);
}

static void job_free(struct job *j)
{
    session_leave(j->cell);
    session_leave(j->fork_to);
    sbx_tool_answers_free(j->answers);
    json_request_free(&j->r);
    sbx_cancel_free(j->cancel);
    free(j);
}

/* "stream": true. Called in the run's thread with each piece of output as
 * it arrives (whole UTF-8 characters, never more in all than the result's
 * own text); queued as an event line with the answers, or joined to the
 * same stream's event of this request still waiting at the tail. Never
 * waits (the run's clock is kept in the thread that calls this): past the
 * stream's allowance an event is dropped and counted, and the answer,
 * which holds every character, is preceded by a line that says so. */
static void stream_output(void *user, int stream, const char *text, size_t len)
{
    struct job *j = user;
    struct conn *c = j->c;
    size_t max = c->s->o->max_pending_bytes;

    pthread_mutex_lock(&c->lock);
    struct answer *t = c->last;
    bool join =
        t && t->seq == j->seq && t->stream == stream && t->raw_len + len <= EVENT_JOIN_BYTES;
    size_t before = join ? t->raw_len : 0, old = join ? t->len : 0;
    char *raw = c->dropped ? NULL : malloc(before + len + 1);
    char *line = NULL;
    if (raw) {
        memcpy(raw, join ? t->raw : "", before);
        memcpy(raw + before, text, len);
        line = json_event_output(j->r.id_text, stream, raw, before + len);
    }
    size_t llen = line ? strlen(line) : 0;
    struct answer *a = line && !join ? calloc(1, sizeof(*a)) : NULL;
    /* Events have an allowance of their own, apart from the answers'; as
     * for answers, one alone may pass it. */
    bool room = c->events == old || c->events - old + llen <= max;
    if (!line || (!join && !a) || !room) {
        j->dropped[stream - 1] += len;
        free(raw);
        free(line);
        free(a);
    } else if (join) {
        free(t->text);
        free(t->raw);
        *t = (struct answer){NULL, line, llen, j->seq, stream, raw, before + len};
        c->last = t;
        c->pending += llen - old;
        c->events += llen - old;
        pthread_cond_broadcast(&c->changed);
    } else {
        *a = (struct answer){NULL, line, llen, j->seq, stream, raw, len};
        enqueue(c, a);
    }
    pthread_mutex_unlock(&c->lock);
}

/* A call of |j|'s run to a host tool (on_tool_call, in the run's thread):
 * an event line, queued with the events, never waited for. The client
 * answers with a tool_result line (tool_result()). A client that has let
 * more than its allowance of events pile up unread is not asked: the call
 * fails at once in the code, rather than the server holding calls for
 * it. */
static void tool_call(void *user, uint64_t call, const char *name, const char *args, size_t len)
{
    struct job *j = user;
    struct conn *c = j->c;
    char *line = json_event_tool_call(j->r.id_text, call, name, args, len);
    struct answer *a = line ? calloc(1, sizeof(*a)) : NULL;
    const char *why = "the client was not asked: out of memory";

    pthread_mutex_lock(&c->lock);
    if (a && !c->dropped && c->events && c->events + strlen(line) > c->s->o->max_pending_bytes)
        why = "the client was not asked: it has left too much unread";
    else if (a && !c->dropped) {
        *a = (struct answer){.text = line, .len = strlen(line), .seq = j->seq};
        enqueue(c, a);
        line = NULL;
        a = NULL;
        why = NULL;
    } else if (c->dropped)
        why = "the client is gone";
    pthread_mutex_unlock(&c->lock);
    if (why)
        (void)sbx_tool_fail(j->answers, call, why);
    free(line);
    free(a);
}

/* The answer of a request some of whose events were dropped, after the
 * line that says how many bytes of each stream. */
static char *dropped_first(struct job *j, char *answer)
{
    char *note = json_event_dropped(j->r.id_text, j->dropped), *both = NULL;

    if (note && asprintf(&both, "%s%s", note, answer) >= 0) {
        free(answer);
        answer = both;
    }
    free(note);
    return answer;
}

/* Runs |j| and answers it; returns the next request to run (see finish). */
static struct job *run_one(struct job *j, bool slot)
{
    struct conn *c = j->c;
    struct server *s = c->s;
    struct sbx_result *res = NULL;
    struct sbx_error err = {0};
    struct job *next;
    char *line;

    j->r.req.cancel = j->cancel;
    if (j->r.stream)
        j->r.req.on_output = stream_output;
    if (j->answers) {
        j->r.req.on_tool_call = tool_call;
        j->r.req.tool_answers = j->answers;
    }
    j->r.req.user = j;
    struct session_cell *cell = j->cell, *fork_to = j->fork_to;
    uint64_t cells = 0, bytes = 0;
    bool restored = false;
    j->cell = j->fork_to = NULL; /* session_run and session_fork give their places up */
    int rc = fork_to        ? session_fork(cell, fork_to, &cells, &err)
             : j->hibernate ? session_hibernate(cell, &bytes, &err)
             : cell         ? session_run(cell, &j->r.req, j->r.rollback, &res, &restored, &err)
                            : s->o->backend->run(s->o->backend->self, &j->r.req, &res, &err);
    pthread_mutex_lock(&c->lock);
    c->running--;
    pthread_mutex_unlock(&c->lock);
    efd_notify(s->wake_fd);
    if (rc < 0)
        line = json_answer_error(j->r.id_text, &err);
    else if (fork_to)
        line = json_answer_session_forked(j->r.id_text, j->r.fork_from, j->r.fork_to, cells);
    else if (j->hibernate)
        line = json_answer_session_hibernated(j->r.id_text, j->r.session_hibernate, bytes);
    else if (cell)
        line = json_answer_session(j->r.id_text, res, j->r.session, restored);
    else
        line = json_answer_result(j->r.id_text, res);
    sbx_result_free(res);
    line = or_fallback(line, j->r.id_text);
    if (line && (j->dropped[0] || j->dropped[1]))
        line = dropped_first(j, line);
    next = finish(c, j, line, slot);
    job_free(j);
    return next;
}

/* A thread holding one of the stream's places: runs requests while some
 * wait. */
static void *run_jobs(void *p)
{
    for (struct job *j = p; j;)
        j = run_one(j, true);
    return NULL;
}

/* A request taken out of the queue by a cancel: it ends at once. */
static void *run_unqueued(void *p)
{
    run_one(p, false);
    return NULL;
}

static void *writer_main(void *p)
{
    struct conn *c = p;

    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (!c->head && !c->done && !c->dropped)
            pthread_cond_wait(&c->changed, &c->lock);
        if (c->dropped || !c->head)
            break;
        struct answer *a = c->head;
        c->head = a->next;
        if (!c->head) {
            c->tail = &c->head;
            c->last = NULL; /* being written: nothing more is joined to it */
        }
        pthread_mutex_unlock(&c->lock);
        int rc = write_full(c->out_fd, a->text, a->len);
        pthread_mutex_lock(&c->lock);
        c->pending -= a->len;
        c->events -= a->seq ? a->len : 0;
        answer_free(a);
        pthread_cond_broadcast(&c->changed);
        if (rc < 0)
            drop_locked(c, rc == -EPIPE ? "hung up" : "cannot be written to");
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* Waits until every request of |c| is answered (|idle|) or there is room to
 * read ahead, cancelling them all if the client hangs up meanwhile. */
static void wait_stream(struct conn *c, bool idle)
{
    size_t max_bytes = c->s->o->max_line_bytes;

    for (;;) {
        pthread_mutex_lock(&c->lock);
        bool ok =
            idle ? c->inflight == 0 : c->n_waiting < READ_AHEAD && c->waiting_bytes < max_bytes;
        bool watch = c->socket && !c->dropped;
        pthread_mutex_unlock(&c->lock);
        if (ok)
            return;
        /* No events asked of the socket: poll() reports a hang-up (both
         * directions shut, the client closed) but not unread requests or a
         * client that only shut its writing side to say it is done. */
        struct pollfd p[2] = {{c->wake_fd, POLLIN, 0}, {watch ? c->in_fd : -1, 0, 0}};
        if (poll(p, 2, -1) < 0 && errno != EINTR)
            return;
        if (p[1].revents & (POLLHUP | POLLERR)) {
            pthread_mutex_lock(&c->lock);
            drop_locked(c, "hung up");
            pthread_mutex_unlock(&c->lock);
        }
        if (p[0].revents)
            efd_consume(c->wake_fd);
    }
}

/* {"cancel": ID}: every request of this stream in flight with that id. */
static void cancel_requests(struct conn *c, const char *id_text)
{
    struct sbx_error err = {0};
    struct job *now = NULL;
    unsigned n = 0;

    pthread_mutex_lock(&c->lock);
    for (struct job *j = c->jobs; j; j = j->next) {
        if (strcmp(j->r.id_text ? j->r.id_text : "null", id_text) != 0)
            continue;
        sbx_cancel_fire(j->cancel);
        n++;
        if (!j->waiting)
            continue;
        /* Out of the queue, so that it is answered now rather than once a
         * place frees. */
        unqueue(c, j);
        j->wnext = now;
        now = j;
    }
    pthread_mutex_unlock(&c->lock);
    while (now) {
        struct job *j = now;
        now = j->wnext;
        if (start_detached(run_unqueued, j) < 0)
            run_one(j, false); /* no thread to be had: here, at once all the same */
    }
    if (n)
        return; /* the request's own answer says it */
    sbx_fail(&err, SBX_ERR_INVALID_REQUEST, -ENOENT,
             "no request in flight on this stream has the id %s", id_text);
    finish(c, NULL, json_answer_cancel_error(id_text, &err), false);
}

/* {"id": ID, "tool_result": {"call": N, ...}}: the answer to call N of the
 * request of this stream in flight with id ID that declared tools. Nothing
 * is said when it is taken (the call returns it to the code); a result
 * that fits no waiting call is refused and changes nothing. */
static void tool_result(struct conn *c, const struct json_request *r)
{
    const char *id = r->id_text ? r->id_text : "null";
    struct sbx_error err = {0};
    struct job *found = NULL;
    unsigned n = 0;
    int rc = 0;

    pthread_mutex_lock(&c->lock);
    for (struct job *j = c->jobs; j; j = j->next)
        if (j->answers && strcmp(j->r.id_text ? j->r.id_text : "null", id) == 0) {
            found = j;
            n++;
        }
    if (n == 1) {
        char *text = r->result_content
                         ? json_dumps(r->result_content, JSON_COMPACT | JSON_ENCODE_ANY)
                         : NULL;
        rc = r->result_error ? sbx_tool_fail(found->answers, r->result_call, r->result_error)
             : text          ? sbx_tool_answer(found->answers, r->result_call, text, strlen(text))
                             : -ENOMEM;
        free(text);
    }
    pthread_mutex_unlock(&c->lock);
    if (n == 1 && rc == 0)
        return;
    unsigned long long call = (unsigned long long)r->result_call;
    if (n == 0)
        sbx_fail(&err, SBX_ERR_INVALID_REQUEST, -ENOENT,
                 "no request in flight on this stream with the id %s declared tools", id);
    else if (n > 1)
        sbx_fail(&err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                 "%u requests in flight on this stream have the id %s: give each its own", n, id);
    else if (rc == -ENOENT)
        sbx_fail(&err, SBX_ERR_INVALID_REQUEST, rc,
                 "request %s has no call %llu waiting (never made, refused, or its run ended)", id,
                 call);
    else if (rc == -EALREADY)
        sbx_fail(&err, SBX_ERR_INVALID_REQUEST, rc, "call %llu of request %s is answered already",
                 call, id);
    else if (rc == -E2BIG)
        sbx_fail(&err, SBX_ERR_TOO_LARGE, rc, "the result is longer than the run's max_tool_bytes");
    else
        sbx_fail(&err, rc == -ENOMEM ? SBX_ERR_UNAVAILABLE : SBX_ERR_INVALID_REQUEST, rc,
                 "the result could not be taken (%s)", strerror(-rc));
    finish(c, NULL, json_answer_tool_result_error(id, r->result_call, &err), false);
}

/* {"id": ..., "session_close": NAME}: answered at once. */
static void close_session(struct conn *c, const struct json_request *r)
{
    struct sbx_error err = {0};

    if (session_close(c->sessions, r->session_close, &err) < 0)
        answer_error(c, r->id_text, &err);
    else
        finish(c, NULL,
               or_fallback(json_answer_session_closed(r->id_text, r->session_close), r->id_text),
               false);
}

static void start_job(struct conn *c, struct job *j)
{
    struct server *s = c->s;
    struct sbx_error err = {0};
    bool now;

    j->c = c;
    j->seq = ++c->seqs; /* only the reader numbers them */
    if (j->r.req.n_tools && !(j->answers = sbx_tool_answers_new()))
        sbx_fail(&err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    else if (!(j->cancel = sbx_cancel_new()))
        sbx_fail(&err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    /* In its session's line now, in the order requests are read (a
     * branch: in both its sessions' lines). */
    j->hibernate = j->r.session_hibernate != NULL;
    if (!j->cancel ||
        (j->r.fork_from && session_enter_fork(c->sessions, j->r.fork_from, j->r.fork_to, &j->cell,
                                              &j->fork_to, &err) < 0) ||
        (j->hibernate &&
         session_enter(c->sessions, j->r.session_hibernate, 0, &j->cell, &err) < 0) ||
        (j->r.session && session_enter(c->sessions, j->r.session, j->r.cell, &j->cell, &err) < 0)) {
        answer_error(c, j->r.id_text, &err);
        job_free(j);
        return;
    }
    pthread_mutex_lock(&s->lock);
    pthread_mutex_lock(&c->lock);
    j->next = c->jobs;
    c->jobs = j;
    c->inflight++;
    if (s->cancelling || c->dropped)
        sbx_cancel_fire(j->cancel); /* answered at once: cancelled */
    /* At most jobs requests of a stream at a time; the rest wait in order. */
    now = c->active < s->o->jobs;
    if (now) {
        c->active++;
        c->running++;
    } else {
        j->waiting = true;
        *c->wait_tail = j;
        c->wait_tail = &j->wnext;
        c->n_waiting++;
        c->waiting_bytes += j->bytes;
    }
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_unlock(&s->lock);
    if (now && start_pooled(run_jobs, j) < 0)
        run_jobs(j); /* no thread to be had: here, reading nothing meanwhile */
    /* Beyond the read-ahead, stop reading, and let the client's own pipe or
     * socket hold it back. */
    wait_stream(c, false);
}

static bool blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

static bool dropped(struct conn *c)
{
    pthread_mutex_lock(&c->lock);
    bool d = c->dropped;
    pthread_mutex_unlock(&c->lock);
    return d;
}

/* Reads requests until the end of input, shutdown or a drop. */
static void read_requests(struct conn *c)
{
    const struct serve_opts *o = c->s->o;
    struct line_reader lr;
    const char *line;
    size_t len;
    enum line_result lres = LINE_END;

    line_reader_init(&lr, c->in_fd, o->max_line_bytes);
    lr.stop_fd = c->s->stop_fd;
    while (!dropped(c) && (lres = line_next(&lr, &line, &len)) != LINE_END && lres != LINE_ERROR) {
        struct sbx_error err = {0};
        if (lres == LINE_TOO_LONG) {
            sbx_fail(&err, SBX_ERR_TOO_LARGE, -E2BIG, "request line longer than %zu bytes",
                     o->max_line_bytes);
            answer_error(c, NULL, &err);
            continue;
        }
        if (blank(line, len))
            continue;
        struct job *j = calloc(1, sizeof(*j));
        if (!j) {
            sbx_fail(&err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
            answer_error(c, NULL, &err);
            continue;
        }
        int prc = json_request_parse(line, len, &o->ceilings, &j->r, &err);
        if (prc < 0 && j->r.is_tool_result)
            finish(c, NULL, json_answer_tool_result_error(j->r.id_text, 0, &err), false);
        else if (prc < 0)
            answer_error(c, j->r.id_text, &err);
        else if (j->r.is_tool_result)
            tool_result(c, &j->r);
        else if (j->r.cancel_text)
            cancel_requests(c, j->r.cancel_text);
        else if (j->r.session_close)
            close_session(c, &j->r);
        else {
            j->bytes = len;
            start_job(c, j);
            continue;
        }
        job_free(j);
    }
    line_reader_free(&lr);
    if (lres == LINE_ERROR && c->socket) {
        pthread_mutex_lock(&c->lock);
        drop_locked(c, "cannot be read from");
        pthread_mutex_unlock(&c->lock);
    }
}

static void conn_free(struct conn *c)
{
    if (c->socket)
        close(c->in_fd);
    if (c->own_sessions)
        session_table_free(c->sessions);
    close_fd(&c->wake_fd);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->changed);
    free(c);
}

static void leave(struct server *s, struct conn *c)
{
    pthread_mutex_lock(&s->lock);
    for (struct conn **pp = &s->conns; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    s->n_conns--;
    efd_notify(s->wake_fd); /* under the lock: the main thread may end once it sees none */
    pthread_mutex_unlock(&s->lock);
}

/* A stream's life: its requests, the answers to all of them, then the end. */
static void *conn_main(void *p)
{
    struct conn *c = p;

    read_requests(c);
    wait_stream(c, true);
    /* Every request is answered: no cell holds a session. Closed before
     * the stream leaves, so that at shutdown they all are before the
     * backend closes; the server's (--state-dir) stay. */
    if (c->own_sessions)
        session_table_free(c->sessions);
    c->sessions = NULL;
    pthread_mutex_lock(&c->lock);
    c->done = true;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->writer, NULL);
    leave(c->s, c);
    conn_free(c);
    return NULL;
}

static int add_conn(struct server *s, int in_fd, int out_fd, bool socket)
{
    struct conn *c = calloc(1, sizeof(*c));

    if (!c)
        return -ENOMEM;
    c->s = s;
    c->in_fd = in_fd;
    c->out_fd = out_fd;
    c->socket = socket;
    c->tail = &c->head;
    c->wait_tail = &c->wait_head;
    c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    c->own_sessions = !s->sessions;
    c->sessions =
        s->sessions ? s->sessions : session_table_new(s->o->backend, &s->o->session_limits);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->changed, NULL);
    if (c->wake_fd < 0 || !c->sessions || pthread_create(&c->writer, NULL, writer_main, c) != 0) {
        c->socket = false; /* the caller still owns the descriptor */
        conn_free(c);
        return -EAGAIN;
    }
    pthread_mutex_lock(&s->lock);
    c->next = s->conns;
    s->conns = c;
    s->n_conns++;
    pthread_mutex_unlock(&s->lock);
    if (start_detached(conn_main, c) < 0) {
        pthread_mutex_lock(&c->lock);
        c->done = true;
        pthread_cond_broadcast(&c->changed);
        pthread_mutex_unlock(&c->lock);
        pthread_join(c->writer, NULL);
        leave(s, c);
        c->socket = false;
        conn_free(c);
        return -EAGAIN;
    }
    return 0;
}

/* --- shutdown ------------------------------------------------------------------ */

static bool reached(void *p, enum drain_until what)
{
    struct server *s = p;
    bool yes = true;

    pthread_mutex_lock(&s->lock);
    for (struct conn *c = s->conns; yes && c; c = c->next) {
        pthread_mutex_lock(&c->lock);
        yes = what == NO_RUNS && !c->running && !c->n_waiting;
        pthread_mutex_unlock(&c->lock);
    }
    pthread_mutex_unlock(&s->lock);
    return yes;
}

static void cancel_all(void *p)
{
    struct server *s = p;

    pthread_mutex_lock(&s->lock);
    s->cancelling = true;
    for (struct conn *c = s->conns; c; c = c->next) {
        pthread_mutex_lock(&c->lock);
        for (struct job *j = c->jobs; j; j = j->next)
            sbx_cancel_fire(j->cancel);
        pthread_mutex_unlock(&c->lock);
    }
    pthread_mutex_unlock(&s->lock);
}

static void drop_all(void *p)
{
    struct server *s = p;

    pthread_mutex_lock(&s->lock);
    for (struct conn *c = s->conns; c; c = c->next) {
        pthread_mutex_lock(&c->lock);
        drop_locked(c, "did not read its answers at shutdown");
        pthread_mutex_unlock(&c->lock);
    }
    pthread_mutex_unlock(&s->lock);
}

/* After SIGINT or SIGTERM: no more requests; then drain.h's order. */
static int drain(struct server *s, int sfd)
{
    /* A socket's writer ends with the drop; standard output may block for
     * good, and is not waited for. */
    struct drain d = {.self = s,
                      .wake_fd = s->wake_fd,
                      .grace_seconds = s->o->grace_seconds,
                      .reached = reached,
                      .cancel_all = cancel_all,
                      .drop_all = drop_all,
                      .drop_ends_all = s->o->listen_path != NULL};

    efd_notify(s->stop_fd);
    return drain_run(&d, sfd);
}

/* --- the server ------------------------------------------------------------------ */

/* PATH.lock, held (flock) for as long as this server listens on PATH: a
 * server that finds it taken knows a live one has PATH; one that takes it
 * knows that whatever socket is at PATH is a dead server's. Returns the
 * locked descriptor, -EADDRINUSE, or -errno. */
static int lock_listen_path(const char *path, char *lock, size_t cap)
{
    if ((size_t)snprintf(lock, cap, "%s.lock", path) >= cap)
        return -ENAMETOOLONG;
    int fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno == EWOULDBLOCK ? -EADDRINUSE : -errno;
        close(fd);
        return e;
    }
    return fd;
}

/* Whatever is at |path| before we bind: nothing, or a socket no server
 * listens on (a server that was killed), which goes. A socket a server
 * answers on (one that takes no lock), a link or anything else stays, and
 * we do not start. Returns 0 or -errno with the message printed. */
static int clear_listen_path(const struct sockaddr_un *addr, const char *path)
{
    struct stat st;

    if (lstat(path, &st) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (!S_ISSOCK(st.st_mode)) {
        fprintf(stderr, "pysbx serve: %s exists and is not a socket: not removed\n", path);
        return -EEXIST;
    }
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int live = probe >= 0 && connect(probe, (const struct sockaddr *)addr, sizeof(*addr)) == 0;
    int e = errno;
    if (probe >= 0)
        close(probe);
    if (live || (e != ECONNREFUSED && e != ENOENT)) {
        fprintf(stderr, "pysbx serve: %s: a server is listening there already\n", path);
        return -EADDRINUSE;
    }
    /* A dead server's: no one accepts on it any more. */
    if (unlink(path) < 0 && errno != ENOENT)
        return -errno;
    return 0;
}

static int open_listener(const struct serve_opts *o, int *lock_fd, char *lock, size_t cap)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int lfd;

    if (strlen(o->listen_path) >= sizeof(addr.sun_path)) {
        fprintf(stderr, "pysbx serve: socket path too long: %s\n", o->listen_path);
        return -ENAMETOOLONG;
    }
    strcpy(addr.sun_path, o->listen_path);
    *lock_fd = lock_listen_path(o->listen_path, lock, cap);
    if (*lock_fd < 0) {
        fprintf(stderr, "pysbx serve: %s: %s\n", o->listen_path,
                *lock_fd == -EADDRINUSE ? "a server is listening there already"
                                        : strerror(-*lock_fd));
        return *lock_fd;
    }
    int rc = clear_listen_path(&addr, o->listen_path);
    if (rc < 0)
        return rc;
    /* Bound under a name of its own, listening, then renamed into place: a
     * client that waits for the path to appear finds a socket that accepts
     * (bound at the path itself, it would be there a moment before it
     * listens, and a connect then is refused). */
    struct sockaddr_un tmp = addr;
    bool staged = (size_t)snprintf(tmp.sun_path, sizeof(tmp.sun_path), "%s.%d.new", o->listen_path,
                                   (int)getpid()) < sizeof(tmp.sun_path);
    lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    mode_t old = umask(0177); /* the socket is born 0600 */
    int b = lfd < 0 ? -1 : staged ? bind(lfd, (struct sockaddr *)&tmp, sizeof(tmp)) : -1;
    if (lfd >= 0 && b < 0) {
        staged = false; /* that name is taken, or too long: the path itself */
        b = bind(lfd, (struct sockaddr *)&addr, sizeof(addr));
    }
    umask(old);
    if (b == 0)
        (void)chmod(staged ? tmp.sun_path : o->listen_path, o->socket_mode);
    if (b < 0 || listen(lfd, 64) < 0 || (staged && rename(tmp.sun_path, o->listen_path) < 0)) {
        int e = -errno;
        fprintf(stderr, "pysbx serve: %s: %s\n", o->listen_path, strerror(errno));
        if (staged && b == 0)
            unlink(tmp.sun_path);
        if (lfd >= 0)
            close(lfd);
        return e;
    }
    fprintf(stderr, "pysbx serve: listening on %s (backend %s)\n", o->listen_path,
            o->backend->name);
    return lfd;
}

/* Until the input ends (stdin) or a signal comes (either). Returns 1 on a
 * signal, 0 when every stream has ended. */
static int serve_until_signal(struct server *s, int sfd, int lfd)
{
    for (;;) {
        if (lfd < 0 && reached(s, ALL_DONE))
            return 0;
        struct pollfd p[3] = {{sfd, POLLIN, 0}, {s->wake_fd, POLLIN, 0}, {lfd, POLLIN, 0}};
        if (poll(p, 3, -1) < 0 && errno != EINTR)
            return 1;
        if (p[0].revents) {
            struct signalfd_siginfo si;
            (void)!read(sfd, &si, sizeof(si)); /* so that only another one counts */
            return 1;
        }
        if (p[1].revents)
            efd_consume(s->wake_fd);
        if (!p[2].revents)
            continue;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0 && add_conn(s, fd, fd, true) < 0)
            close(fd);
    }
}

int serve_main(const struct serve_opts *o)
{
    struct server s = {.o = o, .stop_fd = -1, .wake_fd = -1};
    int sfd = -1, lfd = -1, lock_fd = -1, rc = 1;
    char lock[PATH_MAX] = "";

    /* SIGINT and SIGTERM are read from a descriptor by the main thread. */
    sfd = stop_signals_open();
    s.stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    s.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pthread_mutex_init(&s.lock, NULL);
    if (sfd < 0 || s.stop_fd < 0 || s.wake_fd < 0) {
        fprintf(stderr, "pysbx serve: %s\n", strerror(errno));
        goto out;
    }
    if (o->state) {
        uint8_t tenant[STATE_TENANT_BYTES];
        if (state_dir_tenant(o->state, "json-lines", "", 0, tenant) < 0 ||
            !(s.sessions = session_table_new(o->backend, &o->session_limits))) {
            fputs("pysbx serve: out of memory\n", stderr);
            goto out;
        }
        session_table_hibernate_to(s.sessions, o->state, tenant);
        if (o->hibernate_after &&
            !(s.idler = session_idler_start(&s.sessions, 1, o->hibernate_after))) {
            fputs("pysbx serve: cannot start a thread\n", stderr);
            goto out;
        }
    }
    if (o->listen_path) {
        lfd = open_listener(o, &lock_fd, lock, sizeof(lock));
        if (lfd < 0) {
            rc = lfd == -ENAMETOOLONG ? 2 : 1;
            goto out;
        }
    } else if (add_conn(&s, 0, 1, false) < 0) {
        fputs("pysbx serve: cannot start a thread\n", stderr);
        goto out;
    }
    if (serve_until_signal(&s, sfd, lfd)) {
        /* No new clients: the socket goes at once, so that they are told
         * so rather than left waiting in the backlog. */
        if (lfd >= 0) {
            close_fd(&lfd);
            unlink(o->listen_path);
        }
        int r = drain(&s, sfd);
        /* Threads still holding the streams (and perhaps runs): the
         * process ends rather than free what they use. */
        drain_exit_if_held(r, r == 0);
    }
    /* Every stream has ended: no cell holds a session. */
    hibernate_at_exit(&s.sessions, s.sessions ? 1 : 0, s.idler, sfd);
    s.idler = NULL;
    rc = 0;
out:
    session_idler_stop(s.idler);
    session_table_free(s.sessions);
    if (lfd >= 0) {
        close_fd(&lfd);
        unlink(o->listen_path);
    }
    if (lock_fd >= 0) {
        /* Still ours: a server starting now finds no lock file, or ours
         * taken until the close. */
        unlink(lock);
        close_fd(&lock_fd);
    }
    close_fd(&sfd);
    close_fd(&s.stop_fd);
    close_fd(&s.wake_fd);
    pthread_mutex_destroy(&s.lock);
    return rc;
}
