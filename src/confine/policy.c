/*
 * The seccomp policy, as a table. Default: fail with EPERM, so well-meaning
 * code gets an OSError rather than a dead process. Everything CPython and
 * glibc need to run Python code is allowed, some of it only with the
 * arguments they use; exploit primitives kill the process; calls whose
 * pointer arguments a filter cannot inspect, and that glibc falls back from,
 * answer ENOSYS. Native architecture only: any other (i386 through int 0x80,
 * x32 numbers) kills.
 *
 * Each row names who needs it.
 */
#define _GNU_SOURCE
#include "policy.h"

#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <seccomp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <termios.h>
#include <ucontext.h>
#include <unistd.h>

enum act {
    ALLOW,
    FAIL, /* errno given in |err| */
    KILL, /* the whole process, never just the thread */
};

struct rule {
    int nr;
    enum act act;
    int err;
    unsigned n_args;
    struct scmp_arg_cmp args[2];
    const char *who; /* who needs it, or what it stops */
    /* Changes a file's metadata by path: without a private root, the path
     * may name a host file the worker's uid owns, and the call is refused. */
    bool path_meta;
};

/* One rule a line: the table reads as a table, so the formatter keeps out. */
/* clang-format off */
#define A(n, cmp, a, b) {.arg = (n), .op = (cmp), .datum_a = (a), .datum_b = (b)}
#define R_ALLOW(name, who) {SCMP_SYS(name), ALLOW, 0, 0, {{0}}, who}
#define R_ALLOW_IF(name, who, ...)                                                              \
    {SCMP_SYS(name), ALLOW, 0, sizeof((struct scmp_arg_cmp[]){__VA_ARGS__}) /                   \
                                   sizeof(struct scmp_arg_cmp), {__VA_ARGS__}, who}
#define R_FAIL(name, e, who) {SCMP_SYS(name), FAIL, e, 0, {{0}}, who}
#define R_FAIL_IF(name, e, who, ...)                                                            \
    {SCMP_SYS(name), FAIL, e, sizeof((struct scmp_arg_cmp[]){__VA_ARGS__}) /                    \
                              sizeof(struct scmp_arg_cmp), {__VA_ARGS__}, who}
#define R_KILL(name, who) {SCMP_SYS(name), KILL, 0, 0, {{0}}, who}
#define R_META(name, who) {SCMP_SYS(name), ALLOW, 0, 0, {{0}}, who, true}
#define R_META_IF(name, who, ...)                                                               \
    {SCMP_SYS(name), ALLOW, 0, sizeof((struct scmp_arg_cmp[]){__VA_ARGS__}) /                   \
                                   sizeof(struct scmp_arg_cmp), {__VA_ARGS__}, who, true}
/* "pid 0 or our own": two rows, since a row's conditions all must hold. */
#define SELF_OR_0(name, who, argn)                                                              \
    R_ALLOW_IF(name, who, A(argn, SCMP_CMP_EQ, 0, 0)),                                          \
    R_ALLOW_IF(name, who, A(argn, SCMP_CMP_EQ, POLICY_SELF_PID, 0))

/* Namespace flags that must never come with a thread. */
#define CLONE_NS_FLAGS                                                                          \
    (CLONE_NEWNS | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS |  \
     CLONE_NEWCGROUP)

/* clang-format on */

static const struct rule table[] = {
    /* --- memory: the allocator, pymalloc, mmap module, ctypes --- */
    R_ALLOW(brk, "glibc malloc"),
    R_ALLOW(mmap, "glibc malloc, pymalloc arenas, thread stacks, dlopen, mmap module"),
    R_ALLOW(munmap, "glibc malloc, pymalloc"),
    R_ALLOW(mremap, "glibc realloc of large blocks"),
    R_ALLOW(mprotect, "dlopen, thread stack guard pages"),
    R_ALLOW(madvise, "glibc malloc trimming, pymalloc"),
    R_ALLOW(msync, "mmap.flush"),
    R_ALLOW(mincore, "glibc, rarely"),

    /* --- files: the workspace, the standard library, the code's I/O --- */
    R_ALLOW(read, "everything"),
    R_ALLOW(write, "everything"),
    R_ALLOW(readv, "io"),
    R_ALLOW(writev, "io"),
    R_ALLOW(pread64, "io, zipfile"),
    R_ALLOW(pwrite64, "io"),
    R_ALLOW(preadv, "os.preadv"),
    R_ALLOW(pwritev, "os.pwritev"),
    /* RWF_NOWAIT fails unless the data is cached: a probe of what another
     * run has read. */
    R_ALLOW_IF(preadv2, "os.preadv, without RWF_NOWAIT", A(5, SCMP_CMP_MASKED_EQ, RWF_NOWAIT, 0)),
    R_FAIL_IF(preadv2, EOPNOTSUPP, "RWF_NOWAIT: refused",
              A(5, SCMP_CMP_MASKED_EQ, RWF_NOWAIT, RWF_NOWAIT)),
    R_ALLOW(pwritev2, "os.pwritev"),
    R_ALLOW(open, "legacy open"),
    R_ALLOW(openat, "glibc open, import"),
    R_ALLOW(close, "everything"),
    R_ALLOW(close_range, "os.closerange"),
    R_ALLOW(lseek, "io"),
    R_ALLOW(fstat, "io, import"),
    R_ALLOW(stat, "os.stat"),
    R_ALLOW(lstat, "os.lstat"),
    R_ALLOW(newfstatat, "glibc stat, import"),
    R_ALLOW(statx, "glibc stat"),
    R_ALLOW(access, "os.access"),
    R_ALLOW(faccessat, "os.access"),
    R_ALLOW(faccessat2, "glibc access"),
    R_ALLOW(readlink, "os.readlink, os.path.realpath"),
    R_ALLOW(readlinkat, "os.readlink"),
    R_ALLOW(getdents64, "os.listdir, os.scandir"),
    R_ALLOW(getdents, "legacy listdir"),
    R_ALLOW(getcwd, "os.getcwd"),
    R_ALLOW(chdir, "os.chdir"),
    R_ALLOW(fchdir, "os.chdir on a descriptor"),
    R_ALLOW(mkdir, "os.mkdir"),
    R_ALLOW(mkdirat, "os.mkdir, input files"),
    R_ALLOW(rmdir, "os.rmdir"),
    R_ALLOW(unlink, "os.unlink"),
    R_ALLOW(unlinkat, "os.unlink, shutil.rmtree"),
    R_ALLOW(rename, "os.rename"),
    R_ALLOW(renameat, "os.rename"),
    R_ALLOW(renameat2, "os.rename"),
    R_ALLOW(link, "os.link"),
    R_ALLOW(linkat, "os.link"),
    R_ALLOW(symlink, "os.symlink"),
    R_ALLOW(symlinkat, "os.symlink"),
    R_META(chmod, "os.chmod"),
    R_ALLOW(fchmod, "os.chmod on a descriptor"),
    R_META(fchmodat, "os.chmod"),
#ifdef __NR_fchmodat2
    /* Linux 6.6; glibc 2.39 (Debian 13) calls it for fchmodat with flags,
     * where 2.36 opened the path with O_PATH instead. */
    R_META(fchmodat2, "os.chmod(follow_symlinks=False), os.lchmod"),
#endif
    R_META(chown, "os.chown (to ourselves only, without CAP_CHOWN)"),
    R_ALLOW(fchown, "os.chown on a descriptor"),
    R_META(fchownat, "os.chown"),
    R_META(lchown, "os.lchown"),
    R_ALLOW(truncate, "os.truncate"),
    R_ALLOW(ftruncate, "file.truncate"),
    R_ALLOW(fallocate, "os.posix_fallocate"),
    R_ALLOW(fsync, "os.fsync"),
    R_ALLOW(fdatasync, "os.fdatasync, sqlite3"),
    R_ALLOW_IF(utimensat, "os.utime on a descriptor (futimens: no path)", A(1, SCMP_CMP_EQ, 0, 0)),
    R_META_IF(utimensat, "os.utime", A(1, SCMP_CMP_NE, 0, 0)),
    R_META(utime, "os.utime"),
    R_META(utimes, "os.utime"),
    R_META(futimesat, "glibc's utimes"),
    R_ALLOW(flock, "fcntl.flock"),
    R_ALLOW(umask, "os.umask"),
    R_ALLOW(statfs, "os.statvfs"),
    R_ALLOW(fstatfs, "os.fstatvfs"),
    /* Advice is only advice: it succeeds and does nothing. DONTNEED on a
     * shared file would let a run evict, and so time, another run's page
     * cache. */
    R_FAIL(fadvise64, 0, "os.posix_fadvise: accepted, ignored"),
    R_ALLOW(readahead, "glibc"),
    R_ALLOW(sendfile, "shutil.copyfile"),
    R_ALLOW(copy_file_range, "shutil.copyfile"),
    R_FAIL(splice, EPERM, "os.splice: refused (pipes of page-cache pages)"),
    R_FAIL(tee, EPERM, "refused, as splice"),
    R_ALLOW(getxattr, "shutil.copystat"),
    R_ALLOW(lgetxattr, "shutil.copystat"),
    R_ALLOW(fgetxattr, "shutil.copystat"),
    R_ALLOW(listxattr, "shutil.copystat"),
    R_ALLOW(llistxattr, "shutil.copystat"),
    R_ALLOW(flistxattr, "shutil.copystat"),
    R_ALLOW(dup, "os.dup"),
    R_ALLOW(dup2, "os.dup2"),
    R_ALLOW(dup3, "os.dup2"),
    R_ALLOW(pipe, "os.pipe"),
    R_ALLOW(pipe2, "os.pipe, the socket shim's socketpair"),
    /* FIFOs and empty files only: devices need CAP_MKNOD anyway. */
    R_ALLOW_IF(mknodat, "os.mkfifo", A(2, SCMP_CMP_MASKED_EQ, S_IFMT, S_IFIFO)),
    R_ALLOW_IF(mknodat, "os.mknod of a file", A(2, SCMP_CMP_MASKED_EQ, S_IFMT, S_IFREG)),
    R_ALLOW_IF(mknod, "os.mkfifo", A(1, SCMP_CMP_MASKED_EQ, S_IFMT, S_IFIFO)),
    /* fcntl: not F_SETOWN/F_SETSIG, which would aim SIGIO at another process. */
    R_ALLOW_IF(fcntl, "glibc, io", A(1, SCMP_CMP_EQ, F_GETFD, 0)),
    R_ALLOW_IF(fcntl, "glibc, io", A(1, SCMP_CMP_EQ, F_SETFD, 0)),
    R_ALLOW_IF(fcntl, "os.set_blocking", A(1, SCMP_CMP_EQ, F_GETFL, 0)),
    R_ALLOW_IF(fcntl, "os.set_blocking", A(1, SCMP_CMP_EQ, F_SETFL, 0)),
    R_ALLOW_IF(fcntl, "os.dup", A(1, SCMP_CMP_EQ, F_DUPFD, 0)),
    R_ALLOW_IF(fcntl, "os.dup", A(1, SCMP_CMP_EQ, F_DUPFD_CLOEXEC, 0)),
    R_ALLOW_IF(fcntl, "fcntl.lockf, sqlite3", A(1, SCMP_CMP_EQ, F_GETLK, 0)),
    R_ALLOW_IF(fcntl, "fcntl.lockf, sqlite3", A(1, SCMP_CMP_EQ, F_SETLK, 0)),
    R_ALLOW_IF(fcntl, "fcntl.lockf", A(1, SCMP_CMP_EQ, F_SETLKW, 0)),
    R_ALLOW_IF(fcntl, "sqlite3", A(1, SCMP_CMP_EQ, F_OFD_GETLK, 0)),
    R_ALLOW_IF(fcntl, "sqlite3", A(1, SCMP_CMP_EQ, F_OFD_SETLK, 0)),
    R_ALLOW_IF(fcntl, "sqlite3", A(1, SCMP_CMP_EQ, F_OFD_SETLKW, 0)),
    R_ALLOW_IF(fcntl, "fcntl module", A(1, SCMP_CMP_EQ, F_GETPIPE_SZ, 0)),
    /* ioctl: a short list. */
    R_ALLOW_IF(ioctl, "select, asyncio", A(1, SCMP_CMP_EQ, FIONREAD, 0)),
    R_ALLOW_IF(ioctl, "glibc non-blocking io", A(1, SCMP_CMP_EQ, FIONBIO, 0)),
    R_ALLOW_IF(ioctl, "close-on-exec", A(1, SCMP_CMP_EQ, FIOCLEX, 0)),
    R_ALLOW_IF(ioctl, "close-on-exec", A(1, SCMP_CMP_EQ, FIONCLEX, 0)),
    /* Terminal queries that only read: the kernel answers them (a worker
     * has no terminal: ENOTTY; a closed descriptor: EBADF, as os expects). */
    R_ALLOW_IF(ioctl, "isatty()", A(1, SCMP_CMP_EQ, TCGETS, 0)),
    R_ALLOW_IF(ioctl, "shutil.get_terminal_size", A(1, SCMP_CMP_EQ, TIOCGWINSZ, 0)),
    /* A worker has no terminal (its descriptors are pipes and /dev/null),
     * so these answer ENOTTY or EBADF, as the kernel would to python3. */
    R_ALLOW_IF(ioctl, "os.tcgetpgrp", A(1, SCMP_CMP_EQ, TIOCGPGRP, 0)),
    R_ALLOW_IF(ioctl, "os.tcsetpgrp", A(1, SCMP_CMP_EQ, TIOCSPGRP, 0)),

    /* --- waiting and time --- */
    R_ALLOW(poll, "select, subprocess-free waits"),
    R_ALLOW(ppoll, "select"),
    R_ALLOW(select, "select"),
    R_ALLOW(pselect6, "select"),
    R_ALLOW(epoll_create, "selectors"),
    R_ALLOW(epoll_create1, "selectors, asyncio"),
    R_ALLOW(epoll_ctl, "selectors, asyncio"),
    R_ALLOW(epoll_wait, "selectors, asyncio"),
    R_ALLOW(epoll_pwait, "selectors"),
    R_ALLOW(epoll_pwait2, "selectors"),
    R_ALLOW(eventfd2, "os.eventfd"),
    R_ALLOW(clock_gettime, "time (when the vDSO is not used)"),
    R_ALLOW(clock_getres, "time.get_clock_info"),
    R_ALLOW(clock_nanosleep, "time.sleep"),
    R_ALLOW(nanosleep, "time.sleep"),
    R_ALLOW(gettimeofday, "time"),
    R_ALLOW(time, "time"),
    R_ALLOW(timer_create, "POSIX timers (counted against the worker's own uid)"),
    R_ALLOW(timer_settime, "POSIX timers"),
    R_ALLOW(timer_gettime, "glibc timers"),
    R_ALLOW(timer_getoverrun, "glibc timers"),
    R_ALLOW(timer_delete, "glibc timers"),
    R_ALLOW(timerfd_create, "os.timerfd_create"),
    R_ALLOW(timerfd_settime, "os.timerfd_settime"),
    R_ALLOW(timerfd_gettime, "os.timerfd_gettime"),
    R_ALLOW(setitimer, "signal.setitimer"),
    R_ALLOW(getitimer, "signal.getitimer"),
    R_ALLOW(alarm, "signal.alarm"),
    R_ALLOW(pause, "signal.pause"),

    /* --- threads: yes; processes: no --- */
    R_ALLOW_IF(clone, "pthread_create (threading)",
               A(0, SCMP_CMP_MASKED_EQ, CLONE_THREAD | CLONE_NS_FLAGS, CLONE_THREAD)),
    /* A row of its own, not the default: glibc's posix_spawn (which 3.13's
     * platform module reaches) clones with every signal blocked, where the
     * debug program's trap could only kill. */
    R_FAIL_IF(clone, EPERM, "fork, posix_spawn: refused",
              A(0, SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0)),
    R_FAIL(clone3, ENOSYS, "glibc's pthread_create falls back to clone"),
    R_FAIL(fork, EPERM, "os.fork: refused"),
    R_FAIL(vfork, EPERM, "vfork: refused"),
    R_FAIL(execve, EPERM, "subprocess, os.system, os.exec*: refused"),
    R_FAIL(execveat, EPERM, "refused"),
    R_ALLOW(exit, "thread exit"),
    R_ALLOW(exit_group, "process exit"),
    R_ALLOW(wait4, "os.wait (no children: ECHILD)"),
    R_ALLOW(waitid, "os.waitid (no children: ECHILD)"),
    R_ALLOW(set_tid_address, "thread start"),
    R_ALLOW(set_robust_list, "thread start"),
    R_ALLOW(get_robust_list, "glibc"),
    R_ALLOW(rseq, "glibc thread start"),
    R_ALLOW(futex, "locks, the GIL"),
    R_ALLOW(futex_waitv, "glibc"),
    R_ALLOW(sched_yield, "threads"),
    /* Calls that take a pid: ours (or 0, which means ours) only, so no
     * host process can be looked at or changed through them. */
    SELF_OR_0(sched_getaffinity, "os.sched_getaffinity, os.cpu_count", 0),
    SELF_OR_0(sched_setaffinity, "os.sched_setaffinity(0, ...)", 0),
    SELF_OR_0(sched_getparam, "os.sched_getparam", 0),
    SELF_OR_0(sched_getscheduler, "os.sched_getscheduler", 0),
    SELF_OR_0(sched_rr_get_interval, "os.sched_rr_get_interval", 0),
    R_ALLOW(sched_get_priority_max, "os.sched_get_priority_max"),
    R_ALLOW(sched_get_priority_min, "os.sched_get_priority_min"),
    /* PRIO_PROCESS (0) only: PRIO_PGRP and PRIO_USER name other
     * processes. */
    R_ALLOW_IF(getpriority, "os.getpriority(PRIO_PROCESS, 0)", A(0, SCMP_CMP_EQ, 0, 0),
               A(1, SCMP_CMP_EQ, 0, 0)),
    R_ALLOW_IF(getpriority, "os.getpriority(PRIO_PROCESS, os.getpid())", A(0, SCMP_CMP_EQ, 0, 0),
               A(1, SCMP_CMP_EQ, POLICY_SELF_PID, 0)),
    R_ALLOW_IF(setpriority, "os.nice, os.setpriority(PRIO_PROCESS, 0)", A(0, SCMP_CMP_EQ, 0, 0),
               A(1, SCMP_CMP_EQ, 0, 0)),
    R_ALLOW_IF(setpriority, "os.setpriority(PRIO_PROCESS, os.getpid())", A(0, SCMP_CMP_EQ, 0, 0),
               A(1, SCMP_CMP_EQ, POLICY_SELF_PID, 0)),
    R_ALLOW(getpid, "os.getpid"),
    R_ALLOW(gettid, "threading.get_native_id"),
    R_ALLOW(getppid, "os.getppid"),
    R_ALLOW(getuid, "os.getuid"),
    R_ALLOW(geteuid, "os.geteuid"),
    R_ALLOW(getgid, "os.getgid"),
    R_ALLOW(getegid, "os.getegid"),
    R_ALLOW(getgroups, "os.getgroups"),
    R_ALLOW(getresuid, "os.getresuid"),
    R_ALLOW(getresgid, "os.getresgid"),
    R_ALLOW(getpgrp, "os.getpgrp"),
    SELF_OR_0(getpgid, "os.getpgid", 0),
    SELF_OR_0(getsid, "os.getsid", 0),
    /* The pid sits behind a pointer, where a filter cannot look. */
    R_FAIL(capget, EPERM, "reading capabilities: refused"),
    R_ALLOW(uname, "platform, os.uname"),
    R_ALLOW(sysinfo, "glibc"),
    R_ALLOW(getrandom, "os.urandom, random, secrets, hash seeding"),
    R_ALLOW(getrusage, "resource.getrusage"),
    R_ALLOW(times, "os.times"),
    R_ALLOW(getcpu, "glibc"),
    R_ALLOW(restart_syscall, "the kernel, after a signal"),
    /* Limits: our own only. Raising a hard limit needs CAP_SYS_RESOURCE,
     * which the worker does not have; reading or lowering is fine. */
    R_ALLOW_IF(prlimit64, "resource.getrlimit/setrlimit, the worker's own limits",
               A(0, SCMP_CMP_EQ, 0, 0)),
    R_ALLOW(getrlimit, "resource.getrlimit"),
    /* prctl: the harmless name calls only. */
    R_ALLOW_IF(prctl, "thread names", A(0, SCMP_CMP_EQ, PR_SET_NAME, 0)),
    R_ALLOW_IF(prctl, "thread names", A(0, SCMP_CMP_EQ, PR_GET_NAME, 0)),
    R_ALLOW_IF(prctl, "a session's cell dies with the template, as every worker does",
               A(0, SCMP_CMP_EQ, PR_SET_PDEATHSIG, 0), A(1, SCMP_CMP_EQ, SIGKILL, 0)),
    R_ALLOW(setsid, "a session's cell leads a process group of its own (a worker leads one "
                    "already: EPERM)"),

    /* --- signals: to ourselves only --- */
    R_ALLOW(rt_sigaction, "signal.signal"),
    R_ALLOW(rt_sigprocmask, "signal.pthread_sigmask, glibc"),
    R_ALLOW(rt_sigreturn, "return from a handler"),
    R_ALLOW(rt_sigpending, "signal.sigpending"),
    R_ALLOW(rt_sigtimedwait, "signal.sigtimedwait"),
    R_ALLOW(rt_sigsuspend, "signal.pause"),
    R_ALLOW(sigaltstack, "faulthandler"),
    /* Never SIGSYS: a run that ends by SIGSYS was stopped by this policy,
     * not by a signal it sent itself. */
    R_ALLOW_IF(kill, "os.kill(os.getpid(), ...)", A(0, SCMP_CMP_EQ, POLICY_SELF_PID, 0),
               A(1, SCMP_CMP_NE, SIGSYS, 0)),
    R_ALLOW_IF(kill, "os.kill(0, ...): our own process group (we lead it)", A(0, SCMP_CMP_EQ, 0, 0),
               A(1, SCMP_CMP_NE, SIGSYS, 0)),
    R_ALLOW_IF(tgkill, "raise(), signal.pthread_kill, a MemoryError's end",
               A(0, SCMP_CMP_EQ, POLICY_SELF_PID, 0), A(2, SCMP_CMP_NE, SIGSYS, 0)),

    /* --- the network: none, for every address family, AF_UNIX included --- */
    R_FAIL(socket, EPERM, "refused: no network"),
    R_FAIL(socketpair, EPERM, "refused: the shim gives pipes instead"),

    /* --- no new file systems, mappings of memory objects or handles --- */
    R_FAIL(memfd_create, EPERM, "refused"),
    R_FAIL(openat2, ENOSYS, "RESOLVE_* flags sit behind a pointer; glibc falls back"),
    R_FAIL(io_uring_setup, ENOSYS, "submissions bypass this filter"),
    R_FAIL(io_uring_enter, ENOSYS, "submissions bypass this filter"),
    R_FAIL(io_uring_register, ENOSYS, "submissions bypass this filter"),

    /* --- exploit primitives: the process dies --- */
    R_KILL(ptrace, "reading or steering another process"),
    R_KILL(process_vm_readv, "reading another process"),
    R_KILL(process_vm_writev, "writing another process"),
    R_KILL(pidfd_getfd, "stealing descriptors"),
    R_KILL(bpf, "kernel attack surface"),
    R_KILL(perf_event_open, "kernel attack surface, side channels"),
    R_KILL(userfaultfd, "race widening for kernel exploits"),
    R_KILL(keyctl, "kernel keyrings"),
    R_KILL(add_key, "kernel keyrings"),
    R_KILL(request_key, "kernel keyrings"),
    R_KILL(mount, "file system changes"),
    R_KILL(umount2, "file system changes"),
    R_KILL(pivot_root, "file system changes"),
    R_FAIL(chroot, EPERM, "os.chroot: refused (an ordinary os function, not worth a kill)"),
    R_KILL(fsopen, "new mount API"),
    R_KILL(fsconfig, "new mount API"),
    R_KILL(fsmount, "new mount API"),
    R_KILL(fspick, "new mount API"),
    R_KILL(move_mount, "new mount API"),
    R_KILL(open_tree, "new mount API"),
    R_KILL(mount_setattr, "new mount API"),
    R_KILL(unshare, "new namespaces"),
    R_KILL(setns, "entering namespaces"),
    R_KILL(kexec_load, "replacing the kernel"),
    R_KILL(kexec_file_load, "replacing the kernel"),
    R_KILL(init_module, "loading kernel code"),
    R_KILL(finit_module, "loading kernel code"),
    R_KILL(delete_module, "unloading kernel code"),
    R_KILL(iopl, "port I/O"),
    R_KILL(ioperm, "port I/O"),
    R_KILL(modify_ldt, "segment tricks behind many exploits"),
    R_KILL(open_by_handle_at, "escaping by file handle"),
    R_KILL(name_to_handle_at, "file handles"),
    R_KILL(reboot, "the host"),
    R_KILL(swapon, "the host"),
    R_KILL(swapoff, "the host"),
};

/* libseccomp's SCMP_FLTATR_CTL_OPTIMIZE value for a binary tree. */
#define POLICY_TREE 2

/* Whether a row compares an argument with the worker's own pid. */
static bool names_self(const struct rule *r)
{
    for (unsigned i = 0; i < r->n_args; i++)
        if (r->args[i].datum_a == POLICY_SELF_PID)
            return true;
    return false;
}

/* kill(0, sig): the caller's process group. A session's process need not
 * lead its own group (a fork of a state whose memory the tenant wrote runs
 * whatever that memory says), so in a session's program the listener does
 * it as a signal to the caller's process alone. */
static bool session_listens(const struct rule *r)
{
    return r->nr == SCMP_SYS(kill) && r->act == ALLOW && r->n_args >= 1 && r->args[0].arg == 0 &&
           r->args[0].op == SCMP_CMP_EQ && r->args[0].datum_a == 0;
}

int policy_self_arg(long nr)
{
    for (size_t i = 0; i < ARRAY_SIZE(table); i++)
        for (unsigned k = 0; table[i].nr == nr && k < table[i].n_args; k++)
            if (table[i].args[k].datum_a == POLICY_SELF_PID)
                return (int)table[i].args[k].arg;
    return -1;
}

int policy_build(struct policy *p, bool debug, bool refuse_path_meta, bool session, char *err,
                 size_t errlen)
{
    const uint32_t deflt = debug ? SCMP_ACT_TRAP : SCMP_ACT_ERRNO(EPERM);
    scmp_filter_ctx ctx = seccomp_init(deflt);
    int memfd = -1;
    int rc = -EIO;
    unsigned added = 0;

    memset(p, 0, sizeof(*p));
    if (!ctx)
        return errmsg(err, errlen, -ENOMEM, "seccomp_init failed");
    /* Any other architecture, x32 numbers included, kills. */
    /* A binary tree of system call numbers rather than a list: each worker
     * loads the program, and the kernel, when it does, runs it once per
     * system call number to fill its cache of always-allowed calls; with a
     * tree that costs half the CPU of a list (and each call checks fewer
     * jumps). */
    if (seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS) < 0 ||
        seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0) < 0 ||
        seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, POLICY_TREE) < 0) {
        errmsg(err, errlen, rc, "seccomp_attr_set failed");
        goto out;
    }
    for (size_t i = 0; i < ARRAY_SIZE(table); i++) {
        const struct rule *r = &table[i];
        uint32_t action = r->act == ALLOW  ? SCMP_ACT_ALLOW
                          : r->act == KILL ? SCMP_ACT_KILL_PROCESS
                                           : SCMP_ACT_ERRNO((unsigned)r->err);
        if (r->path_meta && refuse_path_meta)
            action = SCMP_ACT_ERRNO(EPERM);
        if (r->nr < 0)
            continue; /* not a system call on this architecture */
        /* A session's program has no pid of its own to compare with (each
         * cell is a fork that carries it): the row goes to the listener,
         * which compares the pid with the caller's (policy_self_arg). */
        struct scmp_arg_cmp args[2];
        unsigned n_args = r->n_args;
        memcpy(args, r->args, sizeof(args));
        if (session && session_listens(r))
            action = SCMP_ACT_NOTIFY; /* kill(0, ...): the listener signals the caller */
        if (session && r->nr == SCMP_SYS(mmap) && n_args == 0) {
            /* A shared mapping is shared with every fork of the state: a
             * cell's writes through it would outlive its rollback. Private
             * mappings only (anything else is the default EPERM). */
            args[0] = (struct scmp_arg_cmp)A(3, SCMP_CMP_MASKED_EQ, MAP_TYPE, MAP_PRIVATE);
            n_args = 1;
        }
        if (session && names_self(r)) {
            action = SCMP_ACT_NOTIFY;
            for (unsigned k = 0; k < r->n_args; k++)
                if (args[k].datum_a == POLICY_SELF_PID)
                    args[k] = (struct scmp_arg_cmp)A(args[k].arg, SCMP_CMP_NE, 0, 0);
        }
        /* Spelled out for the reader; libseccomp refuses rules that repeat
         * the default action. */
        if (action == deflt) {
            added++;
            continue;
        }
        int e = seccomp_rule_add_array(ctx, action, r->nr, n_args, args);
        if (e < 0) {
            char *name = seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, r->nr);
            rc = errmsg(err, errlen, e, "seccomp rule for %s: %s", name ? name : "?", strerror(-e));
            free(name);
            goto out;
        }
        added++;
    }
    /* A session's fork, and only its exact flags: the listener (the
     * template) answers, allowing it only at a cell's start. */
    if (session) {
        int e = seccomp_rule_add(ctx, SCMP_ACT_NOTIFY, SCMP_SYS(clone), 1,
                                 SCMP_A0(SCMP_CMP_EQ, POLICY_SESSION_FORK));
        /* Its channel to us carries descriptors (a cell's pipes, the
         * listener): messages on that descriptor alone. */
        if (e == 0)
            e = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(sendmsg), 1,
                                 SCMP_A0(SCMP_CMP_EQ, POLICY_SESSION_CHANNEL_FD));
        if (e == 0)
            e = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(recvmsg), 1,
                                 SCMP_A0(SCMP_CMP_EQ, POLICY_SESSION_CHANNEL_FD));
        if (e < 0) {
            rc = errmsg(err, errlen, e, "seccomp rule for a session's fork: %s", strerror(-e));
            goto out;
        }
        added += 3;
    }
    /* libseccomp writes the program to a descriptor; read it back. */
    memfd = memfd_create("pysbx-policy", MFD_CLOEXEC);
    if (memfd < 0 || seccomp_export_bpf(ctx, memfd) < 0) {
        rc = errmsg(err, errlen, -errno, "exporting the seccomp program: %s", strerror(errno));
        goto out;
    }
    off_t size = lseek(memfd, 0, SEEK_END);
    if (size <= 0 || size % (off_t)sizeof(struct sock_filter) != 0 ||
        size / (off_t)sizeof(struct sock_filter) > BPF_MAXINSNS) {
        errmsg(err, errlen, rc, "the seccomp program has an odd size (%lld)", (long long)size);
        goto out;
    }
    p->insns = malloc((size_t)size);
    if (!p->insns || pread(memfd, p->insns, (size_t)size, 0) != size) {
        errmsg(err, errlen, rc, "reading the seccomp program back failed");
        goto out;
    }
    p->len = (unsigned short)(size / (off_t)sizeof(struct sock_filter));
    p->rules = added;
    rc = 0;
out:
    if (memfd >= 0)
        close(memfd);
    if (rc < 0)
        policy_free(p);
    seccomp_release(ctx);
    return rc;
}

void policy_free(struct policy *p)
{
    free(p->insns);
    memset(p, 0, sizeof(*p));
}

unsigned short policy_patch(const struct policy *p, pid_t self, struct sock_filter *out)
{
    memcpy(out, p->insns, p->len * sizeof(*out));
    for (unsigned i = 0; i < p->len; i++)
        if (BPF_CLASS(out[i].code) == BPF_JMP && out[i].k == POLICY_SELF_PID)
            out[i].k = (uint32_t)self;
    return p->len;
}

int policy_load(const struct policy *p, pid_t self)
{
    struct sock_filter insns[BPF_MAXINSNS];
    struct sock_fprog prog = {.filter = insns};

    if (!p->insns || p->len == 0)
        return -EINVAL;
    prog.len = policy_patch(p, self, insns);
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0)
        return -errno;
    return 0;
}

int policy_load_session(const struct policy *p, int *listener)
{
    struct sock_fprog prog = {.filter = p->insns, .len = p->len};

    if (!p->insns || p->len == 0)
        return -EINVAL;
    int fd =
        (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
    if (fd < 0)
        return -errno;
    *listener = fd;
    return 0;
}

static void on_sigsys(int sig, siginfo_t *si, void *uc_)
{
    ucontext_t *uc = uc_;
    char msg[96];
    int n;

    (void)sig;
    n = snprintf(msg, sizeof(msg), "pysbx: policy debug: system call %d refused (EPERM)\n",
                 si->si_syscall);
    if (n > 0)
        (void)!write(2, msg, (size_t)n);
    uc->uc_mcontext.gregs[REG_RAX] = -EPERM;
}

int policy_debug_install(void)
{
    struct sigaction sa = {.sa_sigaction = on_sigsys, .sa_flags = SA_SIGINFO};

    sigemptyset(&sa.sa_mask);
    return sigaction(SIGSYS, &sa, NULL) < 0 ? -errno : 0;
}

const char *policy_libseccomp_version(void)
{
    static char v[32];
    const struct scmp_version *sv = seccomp_version();

    fmt(v, sizeof(v), "%u.%u.%u", sv->major, sv->minor, sv->micro);
    return v;
}
