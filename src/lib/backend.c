/* The backend seam, and its default: the embedded sandbox. */
#include "backend.h"
#include "sbxerr.h"

#include <errno.h>
#include <string.h>

static int embedded_run(void *self, const struct sbx_request *req, struct sbx_result **out,
                        struct sbx_error *err)
{
    return sbx_run(self, req, out, err);
}

static int embedded_health(void *self, struct sbx_health *out)
{
    return sbx_health(self, out);
}

static int embedded_session_restore(void *self, const struct sbx_session_limits *limits, int fd,
                                    struct sbx_session **out, struct sbx_error *err)
{
    return sbx_session_restore(self, limits, fd, out, err);
}

static int embedded_session_open(void *self, const struct sbx_session_limits *limits,
                                 struct sbx_session **out, struct sbx_error *err)
{
    return sbx_session_open(self, limits, out, err);
}

static void embedded_close(void *self)
{
    sbx_close(self);
}

int sbx_backend_open(const char *name, const struct sbx_config *cfg, struct sbx_backend *out,
                     struct sbx_error *err)
{
    memset(out, 0, sizeof(*out));
    if (!name || strcmp(name, "embedded") == 0) {
        struct sbx *sbx;
        int rc = sbx_open(cfg, &sbx, err);
        if (rc < 0)
            return rc;
        *out = (struct sbx_backend){
            .name = "embedded",
            .self = sbx,
            .run = embedded_run,
            .close = embedded_close,
            .health = embedded_health,
            .session_open = embedded_session_open,
            .session_run = sbx_session_run,
            .session_close = sbx_session_close,
            .session_fork = sbx_session_fork,
            .session_save = sbx_session_save,
            .session_restore = embedded_session_restore,
        };
        return 0;
    }
    if (strcmp(name, "python3") == 0)
        return backend_python3_open(cfg, out, err);
    return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                    "unknown backend '%s' (embedded or python3)", name);
}
