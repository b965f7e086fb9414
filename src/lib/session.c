/* Sessions (see pysbx.h). */
#define _GNU_SOURCE
#include "sandbox.h"
#include "sbxerr.h"

#include <errno.h>
#include <string.h>

void sbx_session_limits_init(struct sbx_session_limits *l)
{
    memset(l, 0, sizeof(*l));
    l->idle_seconds = SBX_DEFAULT_SESSION_IDLE_SECONDS;
    l->lifetime_seconds = SBX_DEFAULT_SESSION_LIFETIME_SECONDS;
    l->max_cells = SBX_DEFAULT_SESSION_MAX_CELLS;
}

static const char *const rollback_names[] = {"on_error", "on_stop", "never"};

const char *sbx_rollback_name(enum sbx_rollback r)
{
    return (unsigned)r < 3 ? rollback_names[r] : NULL;
}

int sbx_rollback_from_name(const char *name, enum sbx_rollback *out)
{
    for (unsigned i = 0; name && i < 3; i++)
        if (strcmp(name, rollback_names[i]) == 0) {
            *out = (enum sbx_rollback)i;
            return 0;
        }
    return -EINVAL;
}

int sbx_session_open(struct sbx *sbx, const struct sbx_session_limits *limits,
                     struct sbx_session **out, struct sbx_error *err)
{
    (void)sbx;
    (void)limits;
    *out = NULL;
    return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOSYS, "sessions are not implemented yet");
}

int sbx_session_run(struct sbx_session *s, const struct sbx_request *req,
                    enum sbx_rollback rollback, struct sbx_result **out, struct sbx_error *err)
{
    (void)s;
    (void)req;
    (void)rollback;
    *out = NULL;
    return sbx_fail(err, SBX_ERR_SESSION_LOST, -ENOLINK, "sessions are not implemented yet");
}

void sbx_session_close(struct sbx_session *s)
{
    (void)s;
}
