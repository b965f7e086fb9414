/* The seccomp policy as data: the exported program, replayed on a table of
 * (system call, arguments) -> action rows without loading it, in the
 * manner of libseccomp's own tests. */
#define _GNU_SOURCE
#include "helpers.h"

#include "policy.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <termios.h>

#define SELF 4242

/* A classic-BPF evaluator for the instructions a seccomp program uses. */
static uint32_t eval(const struct sock_filter *f, unsigned len, const struct seccomp_data *d)
{
    uint32_t A = 0, X = 0, M[BPF_MEMWORDS] = {0};
    const unsigned char *data = (const unsigned char *)d;

    for (unsigned pc = 0; pc < len; pc++) {
        const struct sock_filter *i = &f[pc];
        uint32_t src = BPF_SRC(i->code) == BPF_X ? X : i->k;
        switch (BPF_CLASS(i->code)) {
        case BPF_LD:
            if (BPF_MODE(i->code) == BPF_ABS && BPF_SIZE(i->code) == BPF_W &&
                i->k + 4 <= sizeof(*d))
                memcpy(&A, data + i->k, 4);
            else if (BPF_MODE(i->code) == BPF_MEM)
                A = M[i->k];
            else if (BPF_MODE(i->code) == BPF_IMM)
                A = i->k;
            else
                fail_msg("unsupported load 0x%x at %u", i->code, pc);
            break;
        case BPF_LDX:
            X = BPF_MODE(i->code) == BPF_MEM ? M[i->k] : i->k;
            break;
        case BPF_ST:
            M[i->k] = A;
            break;
        case BPF_STX:
            M[i->k] = X;
            break;
        case BPF_ALU:
            switch (BPF_OP(i->code)) {
            case BPF_AND:
                A &= src;
                break;
            case BPF_OR:
                A |= src;
                break;
            case BPF_ADD:
                A += src;
                break;
            case BPF_SUB:
                A -= src;
                break;
            case BPF_RSH:
                A >>= src;
                break;
            case BPF_LSH:
                A <<= src;
                break;
            default:
                fail_msg("unsupported alu 0x%x at %u", i->code, pc);
            }
            break;
        case BPF_JMP: {
            bool t;
            switch (BPF_OP(i->code)) {
            case BPF_JA:
                pc += i->k;
                continue;
            case BPF_JEQ:
                t = A == src;
                break;
            case BPF_JGT:
                t = A > src;
                break;
            case BPF_JGE:
                t = A >= src;
                break;
            case BPF_JSET:
                t = (A & src) != 0;
                break;
            default:
                fail_msg("unsupported jump 0x%x at %u", i->code, pc);
                t = false;
            }
            pc += t ? i->jt : i->jf;
            break;
        }
        case BPF_RET:
            return BPF_RVAL(i->code) == BPF_A ? A : i->k;
        case BPF_MISC:
            if (BPF_MISCOP(i->code) == BPF_TAX)
                X = A;
            else
                A = X;
            break;
        default:
            fail_msg("unsupported class 0x%x at %u", i->code, pc);
        }
    }
    fail_msg("the program fell off its end");
    return 0;
}

#define ALLOWED SECCOMP_RET_ALLOW
#define KILLED  SECCOMP_RET_KILL_PROCESS
#define ERR(e)  (SECCOMP_RET_ERRNO | (e))

struct row {
    const char *what;
    uint32_t arch;
    int nr;
    uint64_t args[6];
    uint32_t expect;
};

#define X86 AUDIT_ARCH_X86_64
#define THREAD_FLAGS                                                                               \
    (CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM |            \
     CLONE_SETTLS | CLONE_PARENT_SETTID | CLONE_CHILD_CLEARTID)

static const struct row rows[] = {
    {"read", X86, SYS_read, {0}, ALLOWED},
    {"write", X86, SYS_write, {1}, ALLOWED},
    {"openat", X86, SYS_openat, {0}, ALLOWED},
    {"mmap", X86, SYS_mmap, {0}, ALLOWED},
    {"mmap shared (a plain run keeps it)",
     X86,
     SYS_mmap,
     {0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED},
     ALLOWED},
    {"an unknown, future call", X86, 1000, {0}, ERR(EPERM)},
    /* the network */
    {"socket(AF_INET)", X86, SYS_socket, {AF_INET, SOCK_STREAM}, ERR(EPERM)},
    {"socket(AF_UNIX)", X86, SYS_socket, {AF_UNIX, SOCK_STREAM}, ERR(EPERM)},
    {"socket(AF_NETLINK)", X86, SYS_socket, {16, SOCK_RAW}, ERR(EPERM)},
    {"socketpair(AF_UNIX)", X86, SYS_socketpair, {AF_UNIX, SOCK_STREAM}, ERR(EPERM)},
    {"connect", X86, SYS_connect, {3}, ERR(EPERM)},
    /* processes and threads */
    {"pthread_create's clone", X86, SYS_clone, {THREAD_FLAGS}, ALLOWED},
    {"fork's clone", X86, SYS_clone, {SIGCHLD}, ERR(EPERM)},
    {"posix_spawn's clone", X86, SYS_clone, {CLONE_VM | CLONE_VFORK | SIGCHLD}, ERR(EPERM)},
    {"thread in a new user namespace", X86, SYS_clone, {THREAD_FLAGS | CLONE_NEWUSER}, ERR(EPERM)},
    {"thread in a new network namespace",
     X86,
     SYS_clone,
     {THREAD_FLAGS | CLONE_NEWNET},
     ERR(EPERM)},
    {"clone3", X86, SYS_clone3, {0}, ERR(ENOSYS)},
    {"fork", X86, SYS_fork, {0}, ERR(EPERM)},
    {"vfork", X86, SYS_vfork, {0}, ERR(EPERM)},
    {"execve", X86, SYS_execve, {0}, ERR(EPERM)},
    {"execveat", X86, SYS_execveat, {0}, ERR(EPERM)},
    /* signals */
    {"kill(self)", X86, SYS_kill, {SELF, SIGTERM}, ALLOWED},
    {"kill(0): own group", X86, SYS_kill, {0, SIGTERM}, ALLOWED},
    {"kill(1)", X86, SYS_kill, {1, SIGKILL}, ERR(EPERM)},
    {"kill(-1)", X86, SYS_kill, {(uint64_t)-1, SIGKILL}, ERR(EPERM)},
    {"kill(parent)", X86, SYS_kill, {SELF - 1, SIGKILL}, ERR(EPERM)},
    {"kill(self) with high bits", X86, SYS_kill, {(1ULL << 32) | SELF, SIGKILL}, ERR(EPERM)},
    {"tgkill(self, thread)", X86, SYS_tgkill, {SELF, SELF + 3, SIGUSR1}, ALLOWED},
    {"tgkill(other)", X86, SYS_tgkill, {SELF + 1, SELF + 1, SIGKILL}, ERR(EPERM)},
    {"tkill", X86, SYS_tkill, {SELF, SIGKILL}, ERR(EPERM)},
    {"kill(self, SIGSYS): only the policy ends a run that way",
     X86,
     SYS_kill,
     {SELF, SIGSYS},
     ERR(EPERM)},
    {"kill(0, SIGSYS)", X86, SYS_kill, {0, SIGSYS}, ERR(EPERM)},
    {"tgkill(self, SIGSYS)", X86, SYS_tgkill, {SELF, SELF, SIGSYS}, ERR(EPERM)},
    {"getsid(1)", X86, SYS_getsid, {1}, ERR(EPERM)},
    {"getsid(self)", X86, SYS_getsid, {SELF}, ALLOWED},
    {"setpriority(PRIO_USER)", X86, SYS_setpriority, {2, 0, 19}, ERR(EPERM)},
    {"setpriority(PRIO_PROCESS, 0)", X86, SYS_setpriority, {0, 0, 5}, ALLOWED},
    {"sched_getaffinity(1)", X86, SYS_sched_getaffinity, {1, 128, 0}, ERR(EPERM)},
    {"splice", X86, SYS_splice, {3, 0, 4, 0, 4096, 0}, ERR(EPERM)},
    {"fadvise: accepted, ignored", X86, SYS_fadvise64, {3, 0, 0, 4}, ERR(0)},
    {"preadv2 RWF_NOWAIT", X86, SYS_preadv2, {3, 0, 1, 0, 0, RWF_NOWAIT}, ERR(EOPNOTSUPP)},
    {"preadv2", X86, SYS_preadv2, {3, 0, 1, 0, 0, 0}, ALLOWED},
    {"capget", X86, SYS_capget, {0, 0}, ERR(EPERM)},
    {"chroot: refused, not killed", X86, SYS_chroot, {0}, ERR(EPERM)},
#ifdef __NR_fchmodat2
    {"fchmodat2: glibc 2.39's lchmod", X86, __NR_fchmodat2, {AT_FDCWD, 0, 0644, 0x100}, ALLOWED},
#endif
    {"pidfd_send_signal", X86, SYS_pidfd_send_signal, {3, SIGKILL}, ERR(EPERM)},
    {"rt_sigqueueinfo(other)", X86, SYS_rt_sigqueueinfo, {1, SIGKILL}, ERR(EPERM)},
    /* limits and process attributes */
    {"prlimit64(self)", X86, SYS_prlimit64, {0, RLIMIT_AS, 0x1000, 0}, ALLOWED},
    {"prlimit64(other)", X86, SYS_prlimit64, {1, RLIMIT_AS, 0x1000, 0}, ERR(EPERM)},
    {"prctl(PR_SET_NAME)", X86, SYS_prctl, {PR_SET_NAME}, ALLOWED},
    {"prctl(PR_SET_DUMPABLE)", X86, SYS_prctl, {PR_SET_DUMPABLE, 1}, ERR(EPERM)},
    {"prctl(PR_SET_PTRACER)", X86, SYS_prctl, {PR_SET_PTRACER}, ERR(EPERM)},
    {"setpriority(self)", X86, SYS_setpriority, {0, 0, 10}, ALLOWED},
    {"setpriority(other)", X86, SYS_setpriority, {0, 1, 10}, ERR(EPERM)},
    {"setuid", X86, SYS_setuid, {0}, ERR(EPERM)},
    {"capset", X86, SYS_capset, {0}, ERR(EPERM)},
    /* descriptors */
    {"ioctl(FIONREAD)", X86, SYS_ioctl, {0, FIONREAD}, ALLOWED},
    {"ioctl(TCGETS): the kernel answers", X86, SYS_ioctl, {0, TCGETS}, ALLOWED},
    {"ioctl(TIOCGWINSZ): the kernel answers", X86, SYS_ioctl, {0, TIOCGWINSZ}, ALLOWED},
    {"ioctl(TIOCGPGRP): the kernel answers", X86, SYS_ioctl, {0, TIOCGPGRP}, ALLOWED},
    {"ioctl(TIOCSPGRP): the kernel answers", X86, SYS_ioctl, {0, TIOCSPGRP}, ALLOWED},
    {"ioctl(TIOCSTI)", X86, SYS_ioctl, {0, TIOCSTI}, ERR(EPERM)},
    {"fcntl(F_GETFL)", X86, SYS_fcntl, {0, F_GETFL}, ALLOWED},
    {"fcntl(F_SETOWN)", X86, SYS_fcntl, {0, F_SETOWN, 1}, ERR(EPERM)},
    {"fcntl(F_SETSIG)", X86, SYS_fcntl, {0, F_SETSIG, 9}, ERR(EPERM)},
    {"memfd_create", X86, SYS_memfd_create, {0}, ERR(EPERM)},
    {"mknodat(FIFO)", X86, SYS_mknodat, {AT_FDCWD, 0, S_IFIFO | 0644}, ALLOWED},
    {"mknodat(char device)", X86, SYS_mknodat, {AT_FDCWD, 0, S_IFCHR | 0644, 0x0101}, ERR(EPERM)},
    {"openat2", X86, SYS_openat2, {0}, ERR(ENOSYS)},
    {"io_uring_setup", X86, SYS_io_uring_setup, {8, 0}, ERR(ENOSYS)},
    {"io_uring_enter", X86, SYS_io_uring_enter, {0}, ERR(ENOSYS)},
    /* exploit primitives */
    {"ptrace", X86, SYS_ptrace, {16 /* PTRACE_ATTACH */, 1}, KILLED},
    {"process_vm_readv", X86, SYS_process_vm_readv, {1}, KILLED},
    {"process_vm_writev", X86, SYS_process_vm_writev, {1}, KILLED},
    {"pidfd_getfd", X86, SYS_pidfd_getfd, {0}, KILLED},
    {"bpf", X86, SYS_bpf, {0}, KILLED},
    {"perf_event_open", X86, SYS_perf_event_open, {0}, KILLED},
    {"userfaultfd", X86, SYS_userfaultfd, {0}, KILLED},
    {"keyctl", X86, SYS_keyctl, {0}, KILLED},
    {"add_key", X86, SYS_add_key, {0}, KILLED},
    {"mount", X86, SYS_mount, {0}, KILLED},
    {"fsopen", X86, SYS_fsopen, {0}, KILLED},
    {"open_tree", X86, SYS_open_tree, {0}, KILLED},
    {"unshare", X86, SYS_unshare, {CLONE_NEWUSER}, KILLED},
    {"setns", X86, SYS_setns, {0}, KILLED},
    {"kexec_load", X86, SYS_kexec_load, {0}, KILLED},
    {"init_module", X86, SYS_init_module, {0}, KILLED},
    {"iopl", X86, SYS_iopl, {3}, KILLED},
    {"ioperm", X86, SYS_ioperm, {0}, KILLED},
    {"modify_ldt", X86, SYS_modify_ldt, {1}, KILLED},
    {"open_by_handle_at", X86, SYS_open_by_handle_at, {0}, KILLED},
    /* other architectures */
    {"x32 getpid", X86, 0x40000000 | SYS_getpid, {0}, KILLED},
    {"x32 socket", X86, 0x40000000 | SYS_socket, {AF_INET}, KILLED},
    {"i386 getpid (int 0x80)", AUDIT_ARCH_I386, 20, {0}, KILLED},
    {"i386 socketcall", AUDIT_ARCH_I386, 102, {1}, KILLED},
};

static void policy_table_holds(void **state)
{
    (void)state;
    struct policy p;
    char err[256];
    struct sock_filter prog[BPF_MAXINSNS];

    assert_int_equal(policy_build(&p, false, false, false, err, sizeof(err)), 0);
    unsigned short len = policy_patch(&p, SELF, prog);
    assert_true(len > 10);
    int failures = 0;
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        struct seccomp_data d = {.nr = rows[i].nr, .arch = rows[i].arch};
        memcpy(d.args, rows[i].args, sizeof(d.args));
        uint32_t got = eval(prog, len, &d);
        uint32_t want = rows[i].expect;
        /* Kill-thread would leave the rest of the process running. */
        if (got != want) {
            print_error("%-36s got 0x%08x, want 0x%08x\n", rows[i].what, got, want);
            failures++;
        }
    }
    policy_free(&p);
    assert_int_equal(failures, 0);
}

static void debug_program_traps_what_it_would_refuse(void **state)
{
    (void)state;
    /* The debug program traps by default: every EPERM default becomes a
     * trap, and the explicit rows still hold. */
    struct policy p;
    char err[256];
    struct sock_filter prog[BPF_MAXINSNS];
    assert_int_equal(policy_build(&p, true, false, false, err, sizeof(err)), 0);
    unsigned short len = policy_patch(&p, SELF, prog);
    struct seccomp_data d = {.nr = 1000, .arch = X86};
    assert_int_equal(eval(prog, len, &d), SECCOMP_RET_TRAP);
    d.nr = SYS_read;
    assert_int_equal(eval(prog, len, &d), ALLOWED);
    d.nr = SYS_ptrace;
    assert_int_equal(eval(prog, len, &d), KILLED);
    /* A process's clone is refused, not trapped: posix_spawn makes it with
     * every signal blocked, where a trap would kill. */
    d.nr = SYS_clone;
    d.args[0] = CLONE_VM | CLONE_VFORK | SIGCHLD;
    assert_int_equal(eval(prog, len, &d), ERR(EPERM));
    policy_free(&p);
}

/* A session's program: the table, but its one fork and every call about a
 * process by pid go to the listener; messages on the channel (4) only; the
 * rest as a worker's. */
static void session_program_hands_its_fork_to_the_listener(void **state)
{
    (void)state;
    struct policy p;
    char err[256];
    static const struct {
        const char *what;
        long nr;
        uint64_t args[6];
        uint32_t expect;
    } srows[] = {
        {"the session's fork", SYS_clone, {CLONE_PARENT | SIGCHLD}, SECCOMP_RET_USER_NOTIF},
        {"glibc's fork",
         SYS_clone,
         {CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD},
         SECCOMP_RET_ERRNO | EPERM},
        {"a fork with more flags",
         SYS_clone,
         {CLONE_PARENT | SIGCHLD | CLONE_NEWNS},
         SECCOMP_RET_ERRNO | EPERM},
        {"a thread", SYS_clone, {CLONE_THREAD | CLONE_VM | CLONE_SIGHAND}, ALLOWED},
        {"fork()", SYS_fork, {0}, SECCOMP_RET_ERRNO | EPERM},
        {"kill(pid)", SYS_kill, {1234, SIGTERM}, SECCOMP_RET_USER_NOTIF},
        /* The caller's group, which a session's process need not lead:
         * the listener signals the caller alone. */
        {"kill(0)", SYS_kill, {0, SIGTERM}, SECCOMP_RET_USER_NOTIF},
        /* Shared mappings outlive a rollback: private ones only. */
        {"mmap private",
         SYS_mmap,
         {0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS},
         ALLOWED},
        {"mmap shared",
         SYS_mmap,
         {0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS},
         SECCOMP_RET_ERRNO | EPERM},
        {"mmap shared, read-only",
         SYS_mmap,
         {0, 4096, PROT_READ, MAP_SHARED, 3},
         SECCOMP_RET_ERRNO | EPERM},
        {"mmap shared, validated",
         SYS_mmap,
         {0, 4096, PROT_READ, MAP_SHARED_VALIDATE, 3},
         SECCOMP_RET_ERRNO | EPERM},
        {"kill(pid, SIGSYS)", SYS_kill, {1234, SIGSYS}, SECCOMP_RET_ERRNO | EPERM},
        {"tgkill", SYS_tgkill, {1234, 1234, SIGABRT}, SECCOMP_RET_USER_NOTIF},
        {"sched_getaffinity(0)", SYS_sched_getaffinity, {0}, ALLOWED},
        {"sched_getaffinity(pid)", SYS_sched_getaffinity, {1234}, SECCOMP_RET_USER_NOTIF},
        {"sendmsg on the channel", SYS_sendmsg, {4}, ALLOWED},
        {"sendmsg elsewhere", SYS_sendmsg, {5}, SECCOMP_RET_ERRNO | EPERM},
        {"recvmsg on the channel", SYS_recvmsg, {4}, ALLOWED},
        {"recvmsg elsewhere", SYS_recvmsg, {1}, SECCOMP_RET_ERRNO | EPERM},
        {"socket", SYS_socket, {AF_UNIX}, SECCOMP_RET_ERRNO | EPERM},
        {"ptrace", SYS_ptrace, {0}, KILLED},
    };

    assert_int_equal(policy_build(&p, false, false, true, err, sizeof(err)), 0);
    int failures = 0;
    for (size_t i = 0; i < sizeof(srows) / sizeof(srows[0]); i++) {
        struct seccomp_data d = {.nr = (int)srows[i].nr, .arch = X86};
        memcpy(d.args, srows[i].args, sizeof(d.args));
        uint32_t got = eval(p.insns, p.len, &d);
        if (got != srows[i].expect) {
            print_error("%-28s got 0x%08x, want 0x%08x\n", srows[i].what, got, srows[i].expect);
            failures++;
        }
    }
    assert_int_equal(policy_self_arg(SYS_kill), 0);
    assert_int_equal(policy_self_arg(SYS_getpriority), 1);
    assert_int_equal(policy_self_arg(SYS_read), -1);
    policy_free(&p);
    assert_int_equal(failures, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(policy_table_holds),
        cmocka_unit_test(session_program_hands_its_fork_to_the_listener),
        cmocka_unit_test(debug_program_traps_what_it_would_refuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
