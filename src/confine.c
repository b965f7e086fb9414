#define _GNU_SOURCE
#include "confine.h"

#include "util.h"

#include <errno.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/prctl.h>

static int drop_capabilities(char *err, size_t errlen)
{
    cap_t none = NULL;
    int rc = -1;

    /* The bounding set first, while CAP_SETPCAP is still effective; without
     * it (not root) there is nothing in the bounding set we could use. */
    if (CAP_IS_SUPPORTED(CAP_SETPCAP) && cap_get_bound(CAP_SETPCAP) == 1) {
        for (cap_value_t c = 0; c <= CAP_LAST_CAP; c++) {
            if (cap_drop_bound(c) < 0 && errno != EINVAL && errno != EPERM) {
                fmt(err, errlen, "dropping capability %d from the bounding set: %s", (int)c,
                    strerror(errno));
                goto out;
            }
        }
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL) {
        fmt(err, errlen, "clearing ambient capabilities: %s", strerror(errno));
        goto out;
    }
    none = cap_init();
    if (!none || cap_set_proc(none) < 0) {
        fmt(err, errlen, "clearing capabilities: %s", strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (none)
        cap_free(none);
    return rc;
}

int confine_self(char *err, size_t errlen)
{
    if (drop_capabilities(err, errlen) < 0)
        return -1;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
        fmt(err, errlen, "PR_SET_NO_NEW_PRIVS: %s", strerror(errno));
        return -1;
    }
    return 0;
}
