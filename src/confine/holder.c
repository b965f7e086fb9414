#define _GNU_SOURCE
#include "holder.h"

#include "util.h"

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/futex.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#define HOLDER_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define HOLDER_ARCH AUDIT_ARCH_AARCH64
#endif

#ifdef HOLDER_ARCH

/* Shared with the holder (same memory): what it has done so far. */
enum { HOLDER_STARTING, HOLDER_HOLDING, HOLDER_FAILED };

struct holder_start {
    int state; /* a futex word */
    pid_t parent;
};

/* All the holder may do once it holds: wait for a signal that never comes
 * (every one is blocked), be restarted after a stop, wake its maker, end.
 * Anything else, or another architecture's numbering (x32 included), kills
 * it. */
static const struct sock_filter holder_filter[] = {
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, HOLDER_ARCH, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_rt_sigsuspend, 4, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_restart_syscall, 3, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_futex, 2, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_exit, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
};

static void holder_say(struct holder_start *h, int state)
{
    __atomic_store_n(&h->state, state, __ATOMIC_RELEASE);
    syscall(SYS_futex, &h->state, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/* The holder: a process in the worker's memory, never again in user mode
 * once it holds. Raw system calls only, on its own small stack; it shares
 * the worker's memory but not its descriptors (a copy, closed first). */
__attribute__((no_sanitize("address"))) static int holder_main(void *arg)
{
    struct holder_start *h = arg; /* on the maker's stack: gone once we hold */
    struct sock_fprog prog = {.len = sizeof(holder_filter) / sizeof(holder_filter[0]),
                              .filter = (struct sock_filter *)holder_filter};
    sigset_t all;

    /* Every signal: sigfillset() would leave glibc's two of its own. */
    memset(&all, 0xff, sizeof(all));
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, NULL, _NSIG / 8);
    if (syscall(SYS_close_range, 0U, ~0U, 0U) != 0 ||
        syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 ||
        syscall(SYS_getppid) != h->parent ||
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) {
        holder_say(h, HOLDER_FAILED);
        syscall(SYS_exit, 0);
    }
    holder_say(h, HOLDER_HOLDING);
    /* The code can write to this stack, the mask included, and a stop and
     * continue restarts the wait with what it finds there: what keeps the
     * holder harmless is the filter, not the mask. */
    for (;;)
        syscall(SYS_rt_sigsuspend, &all, _NSIG / 8);
    return 0;
}

pid_t holder_start(void)
{
    struct holder_start h = {.state = HOLDER_STARTING, .parent = getpid()};
    /* Part of the worker's memory for as long as it lives; never freed. */
    char *stack = mmap(NULL, HOLDER_STACK_BYTES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);

    if (stack == MAP_FAILED)
        return -errno;
    /* Not CLONE_THREAD: the worker's exit_group does not take it along,
     * so the worker's exit is cheap and its status is reported at once.
     * No exit signal: the code's os.wait() does not see it. */
    pid_t pid = clone(holder_main, stack + HOLDER_STACK_BYTES, CLONE_VM, &h);
    if (pid < 0) {
        int e = errno;
        munmap(stack, HOLDER_STACK_BYTES);
        return -e;
    }
    /* Until it holds, it runs code on memory our code could write to:
     * nothing of the request may run before then. */
    for (;;) {
        int s = __atomic_load_n(&h.state, __ATOMIC_ACQUIRE);
        if (s == HOLDER_HOLDING)
            return pid;
        if (s == HOLDER_FAILED) {
            waitpid(pid, NULL, __WALL);
            return -EPERM;
        }
        struct timespec ms = {0, 1000000};
        syscall(SYS_futex, &h.state, FUTEX_WAIT, HOLDER_STARTING, &ms, NULL, 0);
        if (waitpid(pid, NULL, __WALL | WNOHANG) == pid)
            return -ECHILD; /* it died before it held */
    }
}

#else

pid_t holder_start(void)
{
    return -ENOSYS;
}

#endif
