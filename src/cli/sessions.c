#define _GNU_SOURCE
#include "sessions.h"

#include "sbxerr.h"

#include "reqjson.h"
#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
    /* Its image could not be written (say, the state directory has no
     * room): the idler leaves it be until it has run another cell. */
    bool unhibernatable;
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
    /* Where its sessions hibernate, as whose (NULL: nowhere). */
    struct state_dir *state;
    uint8_t tenant[STATE_TENANT_BYTES];
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

void session_table_hibernate_to(struct session_table *t, struct state_dir *state,
                                const uint8_t tenant[STATE_TENANT_BYTES])
{
    t->state = state;
    memcpy(t->tenant, tenant, STATE_TENANT_BYTES);
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

/* |e| is lost: the cells in its line are told so, and its name is free.
 * Under t->lock. */
static void lose(struct entry *e)
{
    e->gone = true;
    if (e->named)
        unname(e->t, e);
}

static void lose_locked(struct entry *e)
{
    pthread_mutex_lock(&e->t->lock);
    lose(e);
    pthread_mutex_unlock(&e->t->lock);
}

/* At the turn of |c|, whose session (named, not lost) has no process: the
 * state directory's image of it restored into *s, or its tombstone said.
 * The number the cell expects is held against the image's as
 * check_number does for a session with processes. Returns 0, with *s, or
 * NULL when there is nothing to restore; or a negative errno with |err|. */
static int revive(struct session_cell *c, struct sbx_session **s, struct sbx_error *err)
{
    struct entry *e = c->e;
    struct session_table *t = e->t;
    const struct sbx_backend *b = t->b;
    struct state_session info;
    char why[256];
    uint64_t ticket;

    *s = NULL;
    /* Cell 1 starts afresh: whatever was held under the name goes. */
    if (c->expect == 1) {
        state_dir_drop(t->state, t->tenant, e->name);
        return 0;
    }
    int fd = state_dir_take(t->state, t->tenant, e->name, &info, &ticket, err);
    if (fd == -ENOENT) {
        if (state_dir_find(t->state, t->tenant, e->name, &info, why, sizeof(why)) != STATE_LOST)
            return 0;
        /* Said once: the next cell of the name starts a new session. */
        state_dir_drop(t->state, t->tenant, e->name);
        lose_locked(e);
        return sbx_fail(err, SBX_ERR_SESSION_LOST, -ENOLINK, "session \"%s\" is lost: %s", e->name,
                        why);
    }
    if (fd < 0) {
        lose_locked(e); /* refused, and removed: |err| says why */
        return fd;
    }
    if (c->expect && c->expect != info.cells + 1) {
        close(fd);
        state_dir_release(t->state, ticket, false);
        lose_locked(e);
        return sbx_fail(err, SBX_ERR_SESSION_LOST, -ENOLINK,
                        "cell %llu of session \"%s\" cannot run here: this server holds it at "
                        "another cell",
                        (unsigned long long)c->expect, e->name);
    }
    /* Its memory limit is the image's; its idle time and lifetime count
     * from now. */
    struct sbx_session_limits l = t->limits;
    l.memory_bytes = 0;
    int rc = b->session_restore ? b->session_restore(b->self, &l, fd, s, err)
                                : sbx_fail(err, SBX_ERR_SESSION_LOST, -EOPNOTSUPP,
                                           "the %s backend cannot restore a session", b->name);
    close(fd);
    if (rc < 0 && err && err->code == SBX_ERR_BUSY) {
        state_dir_release(t->state, ticket, true); /* kept for a cell that finds room */
        return rc;
    }
    state_dir_release(t->state, ticket, false);
    if (rc < 0) {
        char lib[sizeof(err->message)];
        fmt(lib, sizeof(lib), "%s", err ? err->message : "");
        fprintf(stderr,
                "pysbx serve: the image of session \"%s\" could not be restored, and was "
                "removed: %s\n",
                e->name, lib);
        lose_locked(e);
        return sbx_fail(err, SBX_ERR_SESSION_LOST, rc,
                        "session \"%s\" could not be restored from its image (removed): %.150s",
                        e->name, lib);
    }
    pthread_mutex_lock(&t->lock);
    e->cells = info.cells;
    e->memory_bytes = info.memory_bytes;
    e->max_rss_kb = (long)info.max_rss_kb;
    e->opened_ns = now_ns();
    pthread_mutex_unlock(&t->lock);
    return 0;
}

int session_run(struct session_cell *c, const struct sbx_request *req, enum sbx_rollback rollback,
                struct sbx_result **out, bool *restored, struct sbx_error *err)
{
    struct entry *e = c->e;
    struct session_table *t = e->t;
    const struct sbx_backend *b = t->b;
    struct sbx_session *s = NULL, *stale = NULL;
    int rc = 0;

    *out = NULL;
    if (restored)
        *restored = false;
    pthread_mutex_lock(&t->lock);
    while (e->line != c)
        pthread_cond_wait(&t->changed, &t->lock);
    /* A session with no process under its name may be hibernated. Its
     * turn: nothing else touches its session meanwhile. */
    bool wake = t->state && !e->s && !e->gone && e->named;
    pthread_mutex_unlock(&t->lock);
    if (wake) {
        rc = revive(c, &s, err);
        if (s) {
            pthread_mutex_lock(&t->lock);
            e->s = s;
            pthread_mutex_unlock(&t->lock);
            if (restored)
                *restored = true;
        }
    }
    pthread_mutex_lock(&t->lock);
    if (rc == 0)
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
            e->unhibernatable = false;
        } else if (err && err->code == SBX_ERR_SESSION_LOST)
            lose(e); /* the cells already in line learn it too */
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

/* Seconds since the epoch that |e| has been idle since. Under t->lock. */
static double idle_since_wall(const struct entry *e)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    double now = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
    return now - (double)(now_ns() - e->idle_since_ns) / 1e9;
}

int session_hibernate(struct session_cell *c, uint64_t *bytes, struct sbx_error *err)
{
    struct entry *e = c->e;
    struct session_table *t = e->t;
    const struct sbx_backend *b = t->b;
    struct state_session info = {0};
    int rc = 0;

    *bytes = 0;
    pthread_mutex_lock(&t->lock);
    while (e->line != c)
        pthread_cond_wait(&t->changed, &t->lock);
    /* A closed session (its name freed while this waited) is no one's to
     * hibernate: its image would be found by the name's next session. */
    struct sbx_session *s = e->named && !e->gone ? e->s : NULL;
    if (s) {
        e->busy = true;
        fmt(info.name, sizeof(info.name), "%s", e->name);
        info.cells = e->cells;
        info.memory_bytes = e->memory_bytes;
        info.max_rss_kb = e->max_rss_kb;
        info.idle_since = idle_since_wall(e);
    }
    bool named = e->named && !e->gone;
    pthread_mutex_unlock(&t->lock);
    if (!t->state || !b->session_save)
        rc = sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EOPNOTSUPP,
                      "this server keeps no sessions' images: start it with --state-dir");
    else if (!s && named &&
             state_dir_find(t->state, t->tenant, e->name, &info, NULL, 0) == STATE_IMAGE)
        *bytes = info.bytes; /* hibernated already */
    else if (!s)
        rc = e->gone ? sbx_fail(err, SBX_ERR_SESSION_LOST, -ENOLINK,
                                "session \"%s\" was lost before it could be hibernated", e->name)
                     : sbx_fail(err, SBX_ERR_INVALID_REQUEST, -ENOENT,
                                "no open session is called \"%s\"", e->name);
    else {
        uint64_t ticket = 0;
        rc = state_dir_save(t->state, t->tenant, &info, b->session_save, s, bytes, &ticket, err);
        pthread_mutex_lock(&t->lock);
        if (rc == 0 && e->named)
            e->s = NULL; /* the image holds it now */
        else if (rc == 0)
            s = NULL; /* closed meanwhile: its image goes, the entry's end closes it */
        else if (err && err->code == SBX_ERR_SESSION_LOST)
            lose(e);
        else
            e->unhibernatable = true;
        pthread_mutex_unlock(&t->lock);
        if (rc == 0 && !s)
            state_dir_release(t->state, ticket, false);
        else if (rc == 0)
            b->session_close(s);
    }
    pthread_mutex_lock(&t->lock);
    e->busy = false;
    struct entry *dead = take_out(c);
    pthread_mutex_unlock(&t->lock);
    if (dead)
        entry_free(dead, b);
    return rc;
}

unsigned session_table_hibernate(struct session_table *t, double idle_seconds,
                                 bool (*stop)(void *arg), void *arg)
{
    unsigned n = 0;

    while (t && t->state && !(stop && stop(arg))) {
        struct session_cell *c = calloc(1, sizeof(*c));
        struct entry *e = NULL;
        char name[SESSION_NAME_MAX + 1] = "";
        if (!c)
            break;
        pthread_mutex_lock(&t->lock);
        uint64_t now = now_ns();
        for (e = t->named; e; e = e->next)
            if (e->s && !e->line && !e->gone && !e->unhibernatable &&
                (idle_seconds <= 0 || (double)(now - e->idle_since_ns) / 1e9 >= idle_seconds))
                break;
        /* Its line is empty: this place is its turn at once. */
        if (e) {
            c->e = e;
            *e->line_tail = c;
            e->line_tail = &c->next;
            fmt(name, sizeof(name), "%s", e->name);
        }
        pthread_mutex_unlock(&t->lock);
        if (!e) {
            free(c);
            break;
        }
        struct sbx_error err = {0};
        uint64_t bytes;
        if (session_hibernate(c, &bytes, &err) == 0)
            n++;
        else if (err.code != SBX_ERR_SESSION_LOST)
            fprintf(stderr, "pysbx: session \"%s\" could not hibernate, and %s: %s\n", name,
                    idle_seconds > 0 ? "goes on" : "ends with the server", err.message);
    }
    return n;
}

void session_table_bury_open(struct session_table *t)
{
    if (!t || !t->state)
        return;
    pthread_mutex_lock(&t->lock);
    for (struct entry *e = t->named; e; e = e->next)
        if (e->s && !e->gone)
            state_dir_bury(t->state, t->tenant, e->name,
                           "it could not hibernate when its server ended (its state kept files "
                           "open, or its image could not be written), and ended with it");
    pthread_mutex_unlock(&t->lock);
}

struct session_idler {
    struct session_table *const *tables;
    unsigned n;
    double after;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t stopped;
    bool stop;
};

static bool idler_stopping(void *p)
{
    struct session_idler *i = p;

    pthread_mutex_lock(&i->lock);
    bool stop = i->stop;
    pthread_mutex_unlock(&i->lock);
    return stop;
}

/* How often the idler looks: a quarter of the idle time (so that a
 * session hibernates at most a quarter late), within bounds. */
#define IDLER_MIN_PERIOD_S 0.05
#define IDLER_MAX_PERIOD_S 5.0

static void *idler_main(void *p)
{
    struct session_idler *i = p;
    double period = i->after / 4;

    period = period < IDLER_MIN_PERIOD_S   ? IDLER_MIN_PERIOD_S
             : period > IDLER_MAX_PERIOD_S ? IDLER_MAX_PERIOD_S
                                           : period;
    pthread_mutex_lock(&i->lock);
    while (!i->stop) {
        pthread_mutex_unlock(&i->lock);
        for (unsigned k = 0; k < i->n && !idler_stopping(i); k++)
            session_table_hibernate(i->tables[k], i->after, idler_stopping, i);
        pthread_mutex_lock(&i->lock);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        uint64_t ns = (uint64_t)until.tv_nsec + (uint64_t)(period * 1e9);
        until.tv_sec += (time_t)(ns / 1000000000u);
        until.tv_nsec = (long)(ns % 1000000000u);
        while (!i->stop && pthread_cond_timedwait(&i->stopped, &i->lock, &until) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&i->lock);
    return NULL;
}

struct session_idler *session_idler_start(struct session_table *const *tables, unsigned n,
                                          double idle_seconds)
{
    struct session_idler *i = calloc(1, sizeof(*i));
    pthread_condattr_t ca;

    if (!i)
        return NULL;
    i->tables = tables;
    i->n = n;
    i->after = idle_seconds;
    pthread_mutex_init(&i->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&i->stopped, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&i->thread, NULL, idler_main, i) != 0) {
        pthread_mutex_destroy(&i->lock);
        pthread_cond_destroy(&i->stopped);
        free(i);
        return NULL;
    }
    return i;
}

void session_idler_stop(struct session_idler *i)
{
    if (!i)
        return;
    pthread_mutex_lock(&i->lock);
    i->stop = true;
    pthread_cond_broadcast(&i->stopped);
    pthread_mutex_unlock(&i->lock);
    pthread_join(i->thread, NULL);
    pthread_mutex_destroy(&i->lock);
    pthread_cond_destroy(&i->stopped);
    free(i);
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
    bool wake = t->state && !a->s && !a->gone && a->named;
    pthread_mutex_unlock(&t->lock);
    /* A hibernated origin is restored to be branched; a hibernated |to|
     * is a session of that name. */
    struct state_session held;
    if (wake && (rc = revive(cfrom, &s, err)) == 0 && s) {
        pthread_mutex_lock(&t->lock);
        a->s = s;
        pthread_mutex_unlock(&t->lock);
        s = NULL;
    }
    bool to_held = rc == 0 && t->state && !b->s && b->named &&
                   state_dir_find(t->state, t->tenant, b->name, &held, NULL, 0) == STATE_IMAGE;
    pthread_mutex_lock(&t->lock);
    if (rc < 0)
        ;
    else if (a->gone || !a->s)
        rc = a->gone ? sbx_fail(err, SBX_ERR_SESSION_LOST, -ENOLINK,
                                "session \"%s\" was lost before it could be branched", a->name)
                     : sbx_fail(err, SBX_ERR_INVALID_REQUEST, -ENOENT,
                                "no open session is called \"%s\"", a->name);
    else if (b->s || to_held)
        rc = sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EEXIST,
                      "a session called \"%s\" is open%s: close it first", b->name,
                      to_held ? " (hibernated)" : "");
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
    } else if (err && err->code == SBX_ERR_SESSION_LOST && a->s == from && from)
        lose(a);
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

/* The hibernated sessions of |t| not among the |n| of |out| already (a
 * session hibernating as the list is made may be in both), from out[n] on
 * within |cap|. Returns how many there are. */
static size_t list_hibernated(struct session_table *t, struct session_info *out, size_t n,
                              size_t cap)
{
    size_t count = state_dir_list(t->state, t->tenant, NULL, 0), seen = 0;
    struct state_session *h = count ? calloc(count, sizeof(*h)) : NULL;
    struct timespec ts;

    if (!h)
        return 0;
    size_t got = state_dir_list(t->state, t->tenant, h, count);
    count = got < count ? got : count; /* some woke meanwhile */
    clock_gettime(CLOCK_REALTIME, &ts);
    double now = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
    for (size_t k = 0; k < count; k++) {
        bool live = false;
        for (size_t j = 0; j < n && j < cap && !live; j++)
            live = strcmp(out[j].name, h[k].name) == 0;
        if (live)
            continue;
        if (n + seen < cap) {
            struct session_info *i = &out[n + seen];
            memset(i, 0, sizeof(*i));
            fmt(i->name, sizeof(i->name), "%s", h[k].name);
            i->cells = h[k].cells;
            i->idle_seconds = now > h[k].idle_since
                                  ? (double)(long long)((now - h[k].idle_since) * 1e3) / 1e3
                                  : 0;
            i->memory_bytes = h[k].memory_bytes;
            i->max_rss_kb = (long)h[k].max_rss_kb;
            i->hibernated = true;
        }
        seen++;
    }
    free(h);
    return seen;
}

size_t session_list(struct session_table *t, bool hibernated, struct session_info *out, size_t cap)
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
            memset(i, 0, sizeof(*i));
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
    if (hibernated && t->state)
        n += list_hibernated(t, out, n, cap);
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
    /* A hibernated one: its image; one dropped: its tombstone. */
    bool held = t->state && state_dir_drop(t->state, t->tenant, name);
    if (!e && !held)
        return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -ENOENT, "no open session is called \"%s\"",
                        name);
    if (dead)
        entry_free(dead, t->b);
    return 0;
}
