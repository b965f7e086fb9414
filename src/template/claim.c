#define _GNU_SOURCE
#include "claim.h"

#include "pysbx.h"
#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* Where ranges are drawn: 2^24 ids from SBX_DEFAULT_WORKER_ID_BASE, in
 * blocks aligned to the range's size; the first block is left to versions
 * that used it for every sandbox. */
#define CLAIM_REGION_IDS (1u << 24)
/* Ranges tried before the template gives up. */
#define CLAIM_TRIES 32

/* The holder: the range's first uid, and nothing else. It tells the
 * template with one byte on |verdict| whether it is that uid's only
 * process; if it is, it waits to die with the template. */
_Noreturn static void holder_main(uid_t uid, gid_t gid, int verdict, pid_t parent)
{
    struct rlimit two = {2, 2};
    char yes = '1', no = '0';

    prctl(PR_SET_NAME, "pysbx-claim");
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
        _exit(1);
    if (dup2(verdict, 0) < 0)
        _exit(1);
    close_range(1, ~0U, 0);
    /* The system calls themselves: the template is single-threaded here,
     * and the holder must be exactly this uid, no capability left. */
    if (syscall(SYS_setgroups, 0, NULL) != 0 || syscall(SYS_setresgid, gid, gid, gid) != 0 ||
        syscall(SYS_setresuid, uid, uid, uid) != 0 ||
        syscall(SYS_prlimit64, 0, RLIMIT_NPROC, &two, NULL) != 0)
        _exit(1);
    pid_t probe = vfork();
    if (probe == 0)
        _exit(0);
    if (probe < 0) {
        (void)!write(0, &no, 1); /* EAGAIN: another process has this uid */
        _exit(0);
    }
    while (waitpid(probe, NULL, 0) < 0 && errno == EINTR)
        ;
    if (write(0, &yes, 1) != 1)
        _exit(1);
    close(0);
    for (;;)
        pause();
}

/* Starts a holder for |uid|; returns 1 when it holds the uid alone (its
 * pid in *holder), 0 when another process has the uid, -errno on failure. */
static int try_hold(uid_t uid, gid_t gid, pid_t *holder)
{
    int p[2];
    char verdict = 0;

    if (pipe2(p, O_CLOEXEC) < 0)
        return -errno;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        holder_main(uid, gid, p[1], parent);
    }
    int e = errno;
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        return -e;
    }
    ssize_t n = read_full(p[0], &verdict, 1);
    close(p[0]);
    if (n == 1 && verdict == '1') {
        *holder = pid;
        return 1;
    }
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    return n == 1 && verdict == '0' ? 0 : -EIO;
}

int ids_claim(struct id_claim *c, struct jail *j, bool draw, char *err, size_t errlen)
{
    c->holder = -1;
    c->claimed = false;
    if (!j->switch_user || !j->uid_per_run || j->in_userns) {
        fmt(c->why, sizeof(c->why), "%s",
            !j->uid_per_run ? "nothing to claim"
                            : "ids of its own user namespace, not claimed on the host");
        return 0;
    }
    unsigned stride = 1;
    while (stride < j->ids)
        stride <<= 1;
    unsigned blocks = CLAIM_REGION_IDS / stride;
    uint32_t offset = 0;
    for (int i = 0; i < CLAIM_TRIES; i++) {
        if (draw) {
            uint32_t r = 0;
            if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r))
                return errmsg(err, errlen, -errno, "template: getrandom: %s", strerror(errno));
            offset = (1 + r % (blocks - 1)) * stride; /* not the first block */
            j->uid_base = (uid_t)(SBX_DEFAULT_WORKER_ID_BASE + offset);
            j->gid_base = (gid_t)(SBX_DEFAULT_WORKER_ID_BASE + offset);
        }
        int rc = try_hold(j->uid_base, j->gid_base, &c->holder);
        if (rc < 0)
            return errmsg(err, errlen, rc, "template: claiming worker ids: %s", strerror(-rc));
        if (rc == 1) {
            c->claimed = true;
            fmt(c->why, sizeof(c->why), "claimed machine-wide");
            fmt(j->uidrun_why, sizeof(j->uidrun_why),
                "a uid and gid per worker, reused once it is dead and its workspace gone (%u "
                "ids)",
                j->ids - 1);
            fmt(j->user_why, sizeof(j->user_why), "workers run as uids %u-%u, gids %u-%u",
                (unsigned)j->uid_base + 1, (unsigned)(j->uid_base + j->ids - 1),
                (unsigned)j->gid_base + 1, (unsigned)(j->gid_base + j->ids - 1));
            return 0;
        }
        if (!draw)
            return errmsg(err, errlen, -EADDRINUSE,
                          "template: worker ids %u-%u are in use: uid %u has a process already "
                          "(another sandbox on this machine holds them): give each sandbox a "
                          "range of its own (worker_uid), or let it draw one",
                          (unsigned)j->uid_base, (unsigned)(j->uid_base + j->ids - 1),
                          (unsigned)j->uid_base);
    }
    return errmsg(err, errlen, -EADDRINUSE,
                  "template: no free range of %u worker ids in %d tries (the ids above %ld are "
                  "taken by other processes)",
                  j->ids, CLAIM_TRIES, (long)SBX_DEFAULT_WORKER_ID_BASE);
}
