/*
 * Sessions, on the supervisor's side (the public calls are in pysbx.h): the
 * channel to the template, and the session's files (wssync.h). embedded.c
 * runs a cell as it runs a request, with these three steps in place of
 * taking a pool worker and around collecting the artifacts.
 */
#ifndef PYSBX_LIB_SESSION_H
#define PYSBX_LIB_SESSION_H

#include "control.h"
#include "pysbx.h"
#include "supervise.h"

/* The next cell's worker, by |deadline| (now_ns clock), and the session's
 * saved workspace in *saved. Returns 0; -ENOLINK when the session is gone;
 * -ETIMEDOUT or another -errno when this cell could not be made, with
 * |why|. */
int session_take_cell(struct sbx_session *s, const struct sbx_request *req, uint64_t deadline,
                      struct taken_worker *w, int *saved, char *why, size_t whylen);
/* The cell's process has ended or been kept: what it changed in the
 * workspace decides its artifacts. */
void session_cell_ended(struct sbx_session *s, struct supervision *sv, int saved);
/* After the result: the files follow the cell (kept, or put back), the
 * template hears whether it keeps the cell's process, and the result says
 * which. Returns 0, -ENOMEM, or -ENOLINK when the session ended while the
 * cell was out (session_lost_why says why). */
int session_cell_settle(struct sbx_session *s, struct supervision *sv, int saved,
                        struct sbx_result *res);

/* Why the session is lost. */
void session_lost_why(const struct sbx_session *s, char *why, size_t cap);

/* embedded.c: a run, on a pool worker (|sess| NULL) or as |sess|'s cell,
 * its request checked already. */
int embedded_run(struct sbx *sbx, struct sbx_session *sess, const struct sbx_request *req,
                 struct sbx_result **out, struct sbx_error *err);
int embedded_check_fits(const struct sbx *sbx, const struct sbx_request *req,
                        struct sbx_error *err);

#endif
