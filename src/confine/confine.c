#define _GNU_SOURCE
#include "confine.h"

#include "holder.h"
#include "landlock.h"
#include "util.h"

#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/prctl.h>
#include <unistd.h>

int confine_drop_bounding_set(char *err, size_t errlen)
{
    /* While CAP_SETPCAP is still effective; without it (not root) there is
     * nothing in the bounding set we could use. */
    if (!CAP_IS_SUPPORTED(CAP_SETPCAP) || cap_get_bound(CAP_SETPCAP) != 1)
        return 0;
    for (cap_value_t c = 0; c <= CAP_LAST_CAP; c++)
        if (cap_drop_bound(c) < 0 && errno != EINVAL && errno != EPERM)
            return errmsg(err, errlen, -errno, "dropping capability %d from the bounding set: %s",
                          (int)c, strerror(errno));
    return 0;
}

bool confine_bounding_set_empty(void)
{
    for (cap_value_t c = 0; c <= CAP_LAST_CAP; c++)
        if (CAP_IS_SUPPORTED(c) && cap_get_bound(c) == 1)
            return false;
    return true;
}

bool confine_has_cap(int cap)
{
    cap_t c = cap_get_proc();
    cap_flag_value_t v = CAP_CLEAR;

    if (c) {
        if (cap_get_flag(c, (cap_value_t)cap, CAP_EFFECTIVE, &v) < 0)
            v = CAP_CLEAR;
        cap_free(c);
    }
    return v == CAP_SET;
}

static int switch_user(uid_t uid, gid_t gid, char *err, size_t errlen)
{
    if (setgroups(0, NULL) < 0 || setresgid(gid, gid, gid) < 0 || setresuid(uid, uid, uid) < 0)
        return errmsg(err, errlen, -errno, "switching to uid %u gid %u: %s", (unsigned)uid,
                      (unsigned)gid, strerror(errno));
    /* Make sure there is no way back. */
    if (setresuid(0, 0, 0) == 0)
        return errmsg(err, errlen, -EPERM, "could switch back to root after dropping privileges");
    return 0;
}

static int drop_capabilities(char *err, size_t errlen)
{
    cap_t none = cap_init();
    int rc = 0;

    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
        rc = errmsg(err, errlen, -errno, "clearing ambient capabilities: %s", strerror(errno));
    else if (!none || cap_set_proc(none) < 0)
        rc = errmsg(err, errlen, -errno, "clearing capabilities: %s", strerror(errno));
    if (none)
        cap_free(none);
    return rc;
}

int confine_self(const struct confine_plan *p, char *err, size_t errlen)
{
    int rc;

    /* Normally a no-op: the template emptied the set it passes on. */
    if ((rc = confine_drop_bounding_set(err, errlen)) < 0)
        return rc;
    if (p->switch_user && (rc = switch_user(p->uid, p->gid, err, errlen)) < 0)
        return rc;
    /* A change of credentials clears the parent-death signal: set it again,
     * so that a worker never outlives its template. If the template is
     * already gone, so are we. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
        return errmsg(err, errlen, -errno, "PR_SET_PDEATHSIG: %s", strerror(errno));
    if (getppid() != p->ppid)
        return errmsg(err, errlen, -ESRCH, "the template is gone");
    if ((rc = drop_capabilities(err, errlen)) < 0)
        return rc;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return errmsg(err, errlen, -errno, "PR_SET_NO_NEW_PRIVS: %s", strerror(errno));
    if (p->landlock_abi > 0 &&
        (rc = landlock_enter(p->landlock_abi, p->ruleset_fd, err, errlen)) < 0)
        return rc;
    /* Under every layer but seccomp: it loads a program of its own. */
    if (p->holder)
        *p->holder = holder_start();
    if (!p->policy)
        return 0;
    if (p->policy_debug && policy_debug_install() < 0)
        return errmsg(err, errlen, -errno, "installing the policy debug handler: %s",
                      strerror(errno));
    /* Last: from here on, only what the table allows. No thread has been
     * started in this process. */
    rc = p->session_listener ? policy_load_session(p->policy, p->session_listener)
                             : policy_load(p->policy, getpid());
    if (rc < 0)
        return errmsg(err, errlen, rc, "loading the seccomp policy: %s", strerror(-rc));
    return 0;
}
