/*
 * The sessions of one client, by the names the client gives them: a
 * connection of `pysbx serve --listen`, its standard input stream, or the
 * `pysbx mcp` process. Two clients using the same name have two sessions.
 *
 * A session is opened on its first cell (through the backend's
 * session_open) and kept until it is closed by name, is lost, or the table
 * is freed. Cells of one session run one at a time in the order they were
 * entered (session_enter, called as requests are read), whichever thread
 * runs them: a client that sends `x = 1` and then `print(x)` without
 * waiting gets them run in that order. A cell whose cancel token fires
 * while it waits here keeps its place (the order is this table's): when
 * its turn comes, the library ends it as cancelled without running it.
 */
#ifndef PYSBX_SESSIONS_H
#define PYSBX_SESSIONS_H

#include "pysbx.h"
#include "statedir.h"

struct session_table;
struct session_cell;
struct session_idler;

/* A table over |b| (kept, not copied), whose sessions are opened with
 * |limits| (NULL: the defaults). NULL when out of memory. */
struct session_table *session_table_new(const struct sbx_backend *b,
                                        const struct sbx_session_limits *limits);

/* Closes every session of |t| and frees it; no cell may be entered. NULL is
 * accepted. */
void session_table_free(struct session_table *t);

/* The sessions of |t| hibernate into |state| (kept, not copied), as
 * |tenant|'s: before any cell is entered. */
void session_table_hibernate_to(struct session_table *t, struct state_dir *state,
                                const uint8_t tenant[STATE_TENANT_BYTES]);

/* Hibernates, one at a time, the sessions of |t| that have had no cell
 * for |idle_seconds| and have none waiting (0: every open session, as at
 * shutdown), until |stop| (may be NULL) says to stop. A session whose
 * image could not be written goes on, and is not tried again by this
 * until it has run another cell. Returns how many were hibernated. */
unsigned session_table_hibernate(struct session_table *t, double idle_seconds,
                                 bool (*stop)(void *arg), void *arg);

/* For each session of |t| still open (one that could not hibernate), a
 * tombstone in the state directory saying so: its next cell, in this
 * process or a later one, is answered session_lost rather than starting a
 * new session unannounced (a cell may come without a number). At a
 * server's end (hibernate_at_exit). */
void session_table_bury_open(struct session_table *t);

/* A thread that hibernates the sessions of |tables| (|n|, kept) after
 * |idle_seconds| without a cell, looking a few times as often. NULL when
 * no thread can be had (then nothing hibernates by itself). */
struct session_idler *session_idler_start(struct session_table *const *tables, unsigned n,
                                          double idle_seconds);
/* Stops it (a hibernation under way ends first). NULL is accepted. */
void session_idler_stop(struct session_idler *i);

/* Takes the next place in the line of the session called |name| (made if
 * there is none; opened when its first cell runs). |expect|, when not 0,
 * is the number the cell says it is ("cell": N, as answers number them):
 * at its turn, a cell 1 ends a session held under the name and starts a
 * new one, and a cell N > 1 that is not the session's next (or finds none:
 * this server never held it, or lost it) is answered session_lost, the
 * session it finds ended. A client that moved to another server and back
 * is so never answered from a state it left behind. Returns 0 with *out,
 * to be given to session_run or session_leave, or a negative errno with
 * |err| (invalid_request: the backend has no sessions). */
int session_enter(struct session_table *t, const char *name, uint64_t expect,
                  struct session_cell **out, struct sbx_error *err);

/* Runs |req| as the cell |c| once its turn comes, then gives up the place
 * and frees |c|. A hibernated session is restored first (*restored, when
 * not NULL, says whether it was). Returns as the backend's session_run (or
 * its session_open, for the first cell, or its session_restore); when the
 * session is lost (session_lost: also an image refused, or dropped past
 * the state directory's cap), its name is forgotten: the next cell
 * entered with it starts a new session. */
int session_run(struct session_cell *c, const struct sbx_request *req, enum sbx_rollback rollback,
                struct sbx_result **out, bool *restored, struct sbx_error *err);

/* At the turn of |c| (entered with session_enter): its session is written
 * to the table's state directory and its processes end (*bytes: its
 * image's). Gives up the place and frees |c|. Returns 0 (also for a
 * session hibernated already), or a negative errno with |err|:
 * invalid_request when the table has no state directory, or there is no
 * such session (-ENOENT); session_lost when it is lost; sandbox_unavailable
 * when its image could not be written (the session goes on). */
int session_hibernate(struct session_cell *c, uint64_t *bytes, struct sbx_error *err);

/* A branch: takes the next places in the lines of |from| and |to| at once
 * (so that requests read after it wait for it in both), into *cfrom and
 * *cto, to be given to session_fork or session_leave each. Returns as
 * session_enter. */
int session_enter_fork(struct session_table *t, const char *from, const char *to,
                       struct session_cell **cfrom, struct session_cell **cto,
                       struct sbx_error *err);

/* At the turn of both: |to| becomes a branch of |from| (the backend's
 * session_fork), numbered on from it (*cells: its last cell's number).
 * Gives up both places and frees them. Returns 0, or a negative errno with
 * |err|: invalid_request when |from| holds no session or |to| holds one,
 * or the backend cannot branch; session_lost when |from| is lost (its name
 * is then forgotten); what the backend says otherwise. */
int session_fork(struct session_cell *cfrom, struct session_cell *cto, uint64_t *cells,
                 struct sbx_error *err);

/* What session_list says of a session. */
struct session_info {
    char name[129];
    uint64_t cells;        /* cells answered */
    double idle_seconds;   /* since its last cell ended (0 while one runs) */
    uint64_t memory_bytes; /* its memory limit (0: the library's default) */
    long max_rss_kb;       /* its last cell's peak resident memory */
    bool running;
    bool hibernated; /* in the state directory, no process of its own */
};

/* The open sessions of |t| (and, with |hibernated|, those hibernated), at
 * most |cap| into |out|; returns how many there are (more than |cap| when
 * they did not all fit). */
size_t session_list(struct session_table *t, bool hibernated, struct session_info *out, size_t cap);

/* Gives up the place of a cell that will not be run; frees it. NULL is
 * accepted. */
void session_leave(struct session_cell *c);

/* Closes the session called |name|: its name is free at once; the session
 * itself ends once the cells entered before this have run (a hibernated
 * one's image, or the tombstone of one dropped, is removed at once).
 * Returns 0, or -ENOENT with |err| (invalid_request) when there is no such
 * session. */
int session_close(struct session_table *t, const char *name, struct sbx_error *err);

#endif
