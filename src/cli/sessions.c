#define _GNU_SOURCE
#include "sessions.h"

#include "sbxerr.h"

#include "reqjson.h"
#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(((struct session_info *)0)->name) == SESSION_NAME_MAX + 1,
               "a session_info holds any session's name");

/* A session and the cells entered for it. */
struct entry {
    struct entry *next; /* in t->named, while it has its name */
    struct session_table *t;
    char *name;
    bool named;
    /* Opened when its first cell runs; NULL before that, or while an open
     * failed (the next cell tries again). */
    struct sbx_session *s;
    /* Lost (by the library, or by a cell whose number it was not): the
     * cells still in its line are answered session_lost too. */
    bool gone;
    /* What session_list says of it: cells answered, the last one's peak
     * memory, its memory limit, when it was last busy; whether a cell runs. */
    uint64_t cells;
    long max_rss_kb;
    uint64_t memory_bytes;
    uint64_t idle_since_ns, opened_ns;
    bool busy;
    /* Cells entered and not yet done, in order: it is the first one's
     * turn. The entry lives while it has cells, or a name and a session. */
    struct session_cell *line, **line_tail;
};

struct session_cell {
    struct session_cell *next;
    struct entry *e;
    uint64_t expect; /* the number the cell says it is (0: any) */
};

struct session_table {
    const struct sbx_backend *b;
    struct sbx_session_limits limits;
    pthread_mutex_t lock;
    pthread_cond_t changed; /* a turn passed */
    struct entry *named;
};

struct session_table *session_table_new(const struct sbx_backend *b,
                                        const struct sbx_session_limits *limits)
{
    struct session_table *t = calloc(1, sizeof(*t));

    if (!t)
        return NULL;
    t->b = b;
    if (limits)
        t->limits = *limits;
    else
        sbx_session_limits_init(&t->limits);
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->changed, NULL);
    return t;
}

static void entry_free(struct entry *e, const struct sbx_backend *b)
{
    if (e->s)
        b->session_close(e->s);
    free(e->name);
    free(e);
}

/* The name is free for a new session. Under t->lock. */
static void unname(struct session_table *t, struct entry *e)
{
    for (struct entry **pp = &t->named; *pp; pp = &(*pp)->next)
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    e->named = false;
}

void session_table_free(struct session_table *t)
{
    if (!t)
        return;
    while (t->named) {
        struct entry *e = t->named;
        t->named = e->next;
        entry_free(e, t->b);
    }
    pthread_mutex_destroy(&t->lock);
    pthread_cond_destroy(&t->changed);
    free(t);
}

static struct entry *take_out(struct session_cell *c);
static void entry_free(struct entry *e, const struct sbx_backend *b);

/* |c| at the end of the line of |name| (made if there is none). Under
 * t->lock; returns 0, or -ENOMEM (|c| untouched). */
static int enter_locked(struct session_table *t, const char *name, uint64_t expect,
                        struct session_cell *c)
{
    struct entry *e;

    for (e = t->named; e && strcmp(e->name, name) != 0; e = e->next)
        ;
    if (!e && (e = calloc(1, sizeof(*e))) && !(e->name = strdup(name))) {
        free(e);
        e = NULL;
    }
    if (!e)
        return -ENOMEM;
    if (!e->named) {
        e->t = t;
        e->named = true;
        e->line_tail = &e->line;
        e->next = t->named;
        t->named = e;
    }
    c->e = e;
    c->expect = expect;
    *e->line_tail = c;
    e->line_tail = &c->next;
    return 0;
}

int session_enter(struct session_table *t, const char *name, uint64_t expect,
                  struct session_cell **out, struct sbx_error *err)
{
    struct session_cell *c = NULL;

    *out = NULL;
    if (!t->b->session_open)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EOPNOTSUPP, "the %s backend has no sessions",
                        t->b->name);
    if (!(c = calloc(1, sizeof(*c))))
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    pthread_mutex_lock(&t->lock);
    int rc = enter_locked(t, name, expect, c);
    pthread_mutex_unlock(&t->lock);
    if (rc < 0) {
        free(c);
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    }
    *out = c;
    return 0;
}

int session_enter_fork(struct session_table *t, const char *from, const char *to,
                       struct session_cell **cfrom, struct session_cell **cto,
                       struct sbx_error *err)
{
    struct session_cell *a = NULL, *b = NULL;
    int rc = -ENOMEM;

    *cfrom = *cto = NULL;
    if (!t->b->session_fork)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EOPNOTSUPP,
                        "the %s backend cannot branch sessions", t->b->name);
    if (!(a = calloc(1, sizeof(*a))) || !(b = calloc(1, sizeof(*b)))) {
        free(a);
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    }
    /* Both at once: two branches entered in opposite orders could
     * otherwise each wait for the other's turn. */
    pthread_mutex_lock(&t->lock);
    if (enter_locked(t, from, 0, a) == 0 && (rc = enter_locked(t, to, 0, b)) < 0) {
        struct entry *dead = take_out(a);
        a = NULL;
        if (dead) {
            pthread_mutex_unlock(&t->lock);
            entry_free(dead, t->b);
            pthread_mutex_lock(&t->lock);
        }
    }
    pthread_mutex_unlock(&t->lock);
    if (!a || rc < 0) {
        free(b);
        if (a && !a->e)
            free(a);
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    }
    *cfrom = a;
    *cto = b;
    return 0;
}

/* Takes |c| out of its line and frees it. Under t->lock; returns its entry
 * when that is now to be freed (after the unlock), else NULL. */
static struct entry *take_out(struct session_cell *c)
{
    struct entry *e = c->e;

    for (struct session_cell **pp = &e->line; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            if (e->line_tail == &c->next)
                e->line_tail = pp;
            break;
        }
    free(c);
    pthread_cond_broadcast(&e->t->changed);
    if (e->line || (e->named && e->s))
        return NULL;
    if (e->named)
        unname(e->t, e); /* an open that failed: nothing to keep */
    return e;
}

void session_leave(struct session_cell *c)
{
    if (!c)
        return;
    struct session_table *t = c->e->t;
    pthread_mutex_lock(&t->lock);
    struct entry *dead = take_out(c);
    pthread_mutex_unlock(&t->lock);
    if (dead)
        entry_free(dead, t->b);
}

/* The cell's number against the session's, at its turn (under t->lock):
 * 0 when it may run; else the session is lost to it and its name freed.
 * Cell 1 says it starts a session: one held under its name is ended (the
 * client has moved on from it, say after a replica answered session_lost)
 * in *stale, for the caller to close. */
static int check_number(struct session_cell *c, struct sbx_session **stale, struct sbx_error *err)
{
    struct entry *e = c->e;

    *stale = NULL;
    if (e->gone)
        return sbx_fail(err, SBX_ERR_SESSION_LOST, -ENOLINK,
                        "session \"%s\" was lost before this cell's turn", e->name);
    if (!c->expect || c->expect == e->cells + 1)
        return 0;
    *stale = e->s;
    e->s = NULL;
    e->cells = 0;
    if (c->expect == 1)
        return 0;
    if (e->named)
        unname(e->t, e);
    e->gone = true;
    return sbx_fail(err, SBX_ERR_SESSION_LOST, -ENOLINK,
                    "cell %llu of session \"%s\" cannot run here: this server holds %s",
                    (unsigned long long)c->expect, e->name,
                    *stale ? "it at another cell" : "no session of that name");
}

int session_run(struct session_cell *c, const struct sbx_request *req, enum sbx_rollback rollback,
                struct sbx_result **out, struct sbx_error *err)
{
    struct entry *e = c->e;
    struct session_table *t = e->t;
    const struct sbx_backend *b = t->b;
    struct sbx_session *s = NULL, *stale = NULL;
    int rc = 0;

    *out = NULL;
    pthread_mutex_lock(&t->lock);
    while (e->line != c)
        pthread_cond_wait(&t->changed, &t->lock);
    rc = check_number(c, &stale, err);
    s = e->s;
    e->busy = rc == 0;
    pthread_mutex_unlock(&t->lock);
    if (stale)
        b->session_close(stale);
    /* Its turn: the session is opened by its first cell to run, outside
     * the lock, while the others wait. */
    if (rc == 0 && !s) {
        /* Its memory is fixed now: the server's (or the tool's), else what
         * this first cell asks for, the server's default when it asks for
         * nothing. */
        struct sbx_session_limits l = t->limits;
        if (!l.memory_bytes)
            l.memory_bytes = req->limits.memory_bytes;
        rc = b->session_open(b->self, &l, &s, err);
        pthread_mutex_lock(&t->lock);
        e->s = s;
        e->memory_bytes = l.memory_bytes;
        e->opened_ns = now_ns();
        pthread_mutex_unlock(&t->lock);
    }
    if (rc == 0) {
        rc = b->session_run(s, req, rollback, out, err);
        pthread_mutex_lock(&t->lock);
        if (rc == 0) {
            e->cells = (*out)->cell;
            e->max_rss_kb = (*out)->max_rss_kb;
        } else if (err && err->code == SBX_ERR_SESSION_LOST) {
            e->gone = true;
            if (e->named)
                unname(t, e); /* the cells already in line learn it too */
        }
        pthread_mutex_unlock(&t->lock);
    }
    pthread_mutex_lock(&t->lock);
    e->busy = false;
    e->idle_since_ns = now_ns();
    struct entry *dead = take_out(c);
    pthread_mutex_unlock(&t->lock);
    if (dead)
        entry_free(dead, b);
    return rc;
}

int session_fork(struct session_cell *cfrom, struct session_cell *cto, uint64_t *cells,
                 struct sbx_error *err)
{
    struct entry *a = cfrom->e, *b = cto->e;
    struct session_table *t = a->t;
    const struct sbx_backend *be = t->b;
    struct sbx_session *s = NULL, *from = NULL;
    int rc = 0;

    *cells = 0;
    pthread_mutex_lock(&t->lock);
    while (a->line != cfrom || b->line != cto)
        pthread_cond_wait(&t->changed, &t->lock);
    if (a->gone || !a->s)
        rc = a->gone ? sbx_fail(err, SBX_ERR_SESSION_LOST, -ENOLINK,
                                "session \"%s\" was lost before it could be branched", a->name)
                     : sbx_fail(err, SBX_ERR_INVALID_REQUEST, -ENOENT,
                                "no open session is called \"%s\"", a->name);
    else if (b->s)
        rc = sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EEXIST,
                      "a session called \"%s\" is open: close it first", b->name);
    from = a->s;
    a->busy = b->busy = rc == 0;
    pthread_mutex_unlock(&t->lock);
    if (rc == 0)
        rc = be->session_fork(from, &s, err);
    pthread_mutex_lock(&t->lock);
    if (rc == 0) {
        b->s = s;
        b->cells = *cells = a->cells;
        b->memory_bytes = a->memory_bytes;
        b->max_rss_kb = a->max_rss_kb;
        b->opened_ns = now_ns();
        b->gone = false;
    } else if (err && err->code == SBX_ERR_SESSION_LOST && a->s == from && from) {
        a->gone = true;
        if (a->named)
            unname(t, a);
    }
    a->busy = b->busy = false;
    a->idle_since_ns = b->idle_since_ns = now_ns();
    struct entry *dead_a = take_out(cfrom), *dead_b = take_out(cto);
    pthread_mutex_unlock(&t->lock);
    if (dead_a)
        entry_free(dead_a, be);
    if (dead_b)
        entry_free(dead_b, be);
    return rc;
}

size_t session_list(struct session_table *t, struct session_info *out, size_t cap)
{
    size_t n = 0;
    uint64_t now = now_ns();

    pthread_mutex_lock(&t->lock);
    for (const struct entry *e = t->named; e; e = e->next) {
        /* Not opened yet by its first cell; or past its idle time or
         * lifetime, which the library ended it at (its next cell is told). */
        if (!e->s ||
            (!e->busy && ((double)(now - e->idle_since_ns) / 1e9 > t->limits.idle_seconds ||
                          (double)(now - e->opened_ns) / 1e9 > t->limits.lifetime_seconds)))
            continue;
        if (n < cap) {
            struct session_info *i = &out[n];
            fmt(i->name, sizeof(i->name), "%s", e->name);
            i->cells = e->cells;
            i->idle_seconds = e->busy ? 0 : (double)((now - e->idle_since_ns) / 1000000) / 1e3;
            i->memory_bytes = e->memory_bytes;
            i->max_rss_kb = e->max_rss_kb;
            i->running = e->busy;
        }
        n++;
    }
    pthread_mutex_unlock(&t->lock);
    return n;
}

int session_close(struct session_table *t, const char *name, struct sbx_error *err)
{
    struct entry *e, *dead = NULL;

    pthread_mutex_lock(&t->lock);
    for (e = t->named; e && strcmp(e->name, name) != 0; e = e->next)
        ;
    if (e) {
        unname(t, e);
        if (!e->line)
            dead = e; /* else its last cell frees it */
    }
    pthread_mutex_unlock(&t->lock);
    if (!e)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -ENOENT, "no open session is called \"%s\"",
                        name);
    if (dead)
        entry_free(dead, t->b);
    return 0;
}
