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
#include <sched.h>
#include <sys/mman.h>
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

/* The holder shares the template's memory (clone with CLONE_VM, a stack
 * of its own), never a copy of it: a fork would share every page the
 * template had with a process that lives as long as it does, and each page
 * the interpreter's start then writes (libpython's data, the heap) would be
 * copied, a fault and a TLB flush each, about 8 ms of a one-shot run; an
 * exec of a fresh image costs about as much CPU in the dynamic loader.
 * Sharing the memory, it must leave the template's alone: it runs only
 * system calls through syscall() and clone() (no cancellation points,
 * whose wrappers write the calling thread's descriptor); the one write to
 * anything not on its stack is errno when a call fails, which happens only
 * while the template waits in read() for the verdict. It holds no
 * capability, and its uid is one no worker is given. */
#define HOLDER_STACK (64u << 10)

struct holder_args {
    uid_t uid;
    gid_t gid;
    int verdict;  /* the pipe's write end */
    pid_t parent; /* the template */
};

__attribute__((no_sanitize("address", "undefined"))) static int probe_main(void *arg)
{
    (void)arg;
    return 0;
}

__attribute__((no_sanitize("address", "undefined"))) static int holder_main(void *arg)
{
    const struct holder_args *a = arg;
    uid_t uid = a->uid;
    gid_t gid = a->gid;
    int verdict = a->verdict;
    pid_t parent = a->parent;
    struct rlimit two = {2, 2};
    char yes = '1', no = '0';
    sigset_t all;
    _Alignas(16) char probe_stack[4096];

    /* None of the template's descriptors but the verdict's (its copies
     * of the control socket, of the pipe's read end: with the template
     * gone, the verdict must find no reader). The name first (a change
     * of credentials would not clear it); the parent-death signal after
     * the ids, whose change would; then the parent is looked at, for a
     * template that died before the signal was set. */
    if ((verdict > 0 && syscall(SYS_close_range, 0, verdict - 1, 0) != 0) ||
        syscall(SYS_close_range, verdict + 1, ~0U, 0) != 0)
        return 1;
    syscall(SYS_prctl, PR_SET_NAME, "pysbx-claim", 0, 0, 0);
    sigfillset(&all);
    if (syscall(SYS_rt_sigprocmask, SIG_BLOCK, &all, NULL, _NSIG / 8) != 0 ||
        syscall(SYS_setgroups, 0, NULL) != 0 || syscall(SYS_setresgid, gid, gid, gid) != 0 ||
        syscall(SYS_setresuid, uid, uid, uid) != 0 ||
        syscall(SYS_prlimit64, 0, RLIMIT_NPROC, &two, NULL) != 0 ||
        syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 ||
        syscall(SYS_getppid) != parent)
        return 1;
    /* The probe: a child that only ends, on a stack of its own while this
     * one waits (CLONE_VFORK). */
    pid_t probe = clone(probe_main, probe_stack + sizeof(probe_stack),
                        CLONE_VM | CLONE_VFORK | SIGCHLD, NULL);
    if (probe < 0) {
        syscall(SYS_write, verdict, &no, 1); /* EAGAIN: another process has this uid */
        return 0;
    }
    while (syscall(SYS_wait4, probe, NULL, 0, NULL) < 0)
        ;
    if (syscall(SYS_write, verdict, &yes, 1) != 1)
        return 1;
    syscall(SYS_close, verdict);
    /* Until the template's end, whose death signal ends it (blocked
     * signals do not hold SIGKILL back). */
    for (;;)
        syscall(SYS_ppoll, NULL, 0, NULL, NULL, 0);
}

/* Starts a holder for |uid|; returns 1 when it holds the uid alone (its
 * pid in *holder), 0 when another process has the uid, -errno on failure. */
static int try_hold(uid_t uid, gid_t gid, pid_t *holder)
{
    int p[2];
    char verdict = 0;

    if (pipe2(p, O_CLOEXEC) < 0)
        return -errno;
    /* Its stack stays mapped for its life; workers forked later inherit
     * the (unused) mapping. One holder is kept per template. */
    void *stack = mmap(NULL, HOLDER_STACK, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED) {
        int e = errno;
        close_fds(p, 2);
        return -e;
    }
    struct holder_args a = {uid, gid, p[1], getpid()};
    pid_t pid = clone(holder_main, (char *)stack + HOLDER_STACK, CLONE_VM | SIGCHLD, &a);
    int e = errno;
    if (pid < 0) {
        close_fds(p, 2);
        munmap(stack, HOLDER_STACK);
        return -e;
    }
    ssize_t n = read_full(p[0], &verdict, 1);
    close_fds(p, 2);
    if (n == 1 && verdict == '1') {
        *holder = pid;
        return 1;
    }
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, __WALL) < 0 && errno == EINTR)
        ;
    munmap(stack, HOLDER_STACK);
    return n == 1 && verdict == '0' ? 0 : -EIO;
}

void ids_release(struct id_claim *c)
{
    if (c->holder <= 0)
        return;
    /* A kill that fails is not waited for (the template claims only with
     * CAP_KILL, which this kill and the holder's death signal need). */
    if (kill(c->holder, SIGKILL) == 0)
        while (waitpid(c->holder, NULL, 0) < 0 && errno == EINTR)
            ;
    c->holder = -1;
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
