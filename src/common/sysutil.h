/* Helpers that touch the operating system but know nothing of the sandbox. */
#ifndef PYSBX_SYSUTIL_H
#define PYSBX_SYSUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/time.h>
#include <sys/types.h>

/* Reads until |len| bytes or end of file; returns the count or -errno. */
ssize_t read_full(int fd, void *buf, size_t len);
/* Writes all of |buf|, retrying on EINTR; returns 0 or -errno. */
int write_full(int fd, const void *buf, size_t len);

/* Closes *fd if it is open and sets it to -1. */
void close_fd(int *fd);
/* close_fd on each of |n| descriptors (pipe pairs, descriptor tables). */
void close_fds(int *fds, size_t n);

/* A struct timeval (rusage times) in microseconds. */
int64_t timeval_us(struct timeval tv);

/* Monotonic clock, nanoseconds. */
uint64_t now_ns(void);

/* Opens |relpath| beneath |dirfd| without following any symbolic link in
 * any component (each directory is opened O_NOFOLLOW in turn). With
 * |make_parents|, missing parent directories are made with mode 0755.
 * |flags| apply to the last component; O_NOFOLLOW and O_CLOEXEC are added.
 * |relpath| must have passed name_problem(). Returns an fd or -errno. */
int open_beneath(int dirfd, const char *relpath, int flags, mode_t mode, bool make_parents);

/* Removes |name| (a directory) beneath |parent_fd| and everything in it,
 * never following a link, never going up with "..", never leaving the
 * directory's file system, at any depth, with a bounded number of open
 * descriptors. Returns 0 or -errno (the first failure). */
int remove_tree_at(int parent_fd, const char *name);
/* The same, leaving |name| itself, empty. */
int empty_tree_at(int parent_fd, const char *name);

/* Makes the calling thread's file-system checks those of |uid|:|gid|,
 * without the capabilities that override them (the kernel drops those
 * while the fsuid is not 0), so that what follows can reach no more than
 * that user could. Only when we are root and |uid| is not; *switched says
 * whether it happened, for fsid_leave. Returns 0 or -EPERM. */
int fsid_enter(uid_t uid, gid_t gid, bool *switched);
void fsid_leave(bool switched);
/* As fsid_enter, keeping (in this thread) the capabilities that override
 * file modes (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER) where we
 * hold them: for copying, as their owner, files the owner made unreadable
 * to itself. Whatever acts so must follow no link and use no "..". */
int fsid_enter_owner(uid_t uid, gid_t gid, bool *switched);

/* chmod of |name| beneath |dirfd| itself, never of what a link names
 * (fchmodat2 with AT_SYMLINK_NOFOLLOW; before Linux 6.6, a link is
 * refused with -ELOOP). Returns 0 or -errno. */
int chmod_nofollow(int dirfd, const char *name, mode_t mode);

/* |name| in the directory of this program (/proc/self/exe) when it exists
 * and is executable: how a command finds pysbx-template beside it in a build
 * tree. Returns |buf| or NULL. */
const char *beside_self(const char *name, char *buf, size_t cap);

/* Whether the interpreter core (libpython: its |version|, "3.11.2", its
 * Py_GetBuildInfo() |build_info|, "main, Apr 28 2025, 14:11:48", and the
 * file |lib_path| it was loaded from, or NULL) and the standard library in
 * |stdlib_dir| are one build. Not one when the standard library's
 * _sysconfigdata files name another major.minor version; or, for a build stamped with
 * one time (reproducible, as Debian's: the core's build time is its file's
 * time), when they carry another stamp. Returns 0, or -EINVAL with why in
 * |why| (-errno when the standard library cannot be read). */
int python_build_problem(const char *stdlib_dir, const char *version, const char *build_info,
                         const char *lib_path, char *why, size_t cap);

/* One process's line of /proc/PID/stat. */
struct proc_stat {
    pid_t pid, ppid;
    pid_t session; /* its session's id */
    char state;
    char comm[32];
    /* utime + stime + cutime + cstime: its own CPU and that of the children
     * it has reaped, in clock ticks (sysconf(_SC_CLK_TCK)). */
    unsigned long long cpu_ticks;
};

/* Reads /proc/|pid|/stat (|pid| as the directory's name). Returns 0 or
 * -errno. */
int proc_stat_read(const char *pid, struct proc_stat *s);

/* The children of |parent| whose name (comm) is |comm|, or all when NULL:
 * up to |max| of their pids in |out|. Returns how many there are, and how
 * many of those are zombies in *zombies (may be NULL). */
int proc_children(pid_t parent, const char *comm, pid_t *out, int max, int *zombies);

#endif
