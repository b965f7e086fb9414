/*
 * The worker's seccomp policy: a table of rules handed to libseccomp once, in
 * the template; each worker loads the finished BPF program.
 */
#ifndef PYSBX_POLICY_H
#define PYSBX_POLICY_H

#include <linux/filter.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Stands for the worker's own pid in the program until policy_load()
 * patches it in. No real pid is this large (pid_max is at most 2^22). */
#define POLICY_SELF_PID 0x7ffffff0u

struct policy {
    struct sock_filter *insns;
    unsigned short len;
    unsigned rules; /* table rows that went into it */
};

/* Builds the program. With |debug|, refused calls trap instead (see
 * policy_debug_install), never for production. With |refuse_path_meta|
 * (no private root: a path may name a host file), chmod, chown and utime by
 * path fail with EPERM; their descriptor forms stay. Returns 0 or -errno
 * with a message. */
int policy_build(struct policy *p, bool debug, bool refuse_path_meta, bool session, char *err,
                 size_t errlen);
void policy_free(struct policy *p);

/* Copies the program into |out| (BPF_MAXINSNS entries) with |self| in place
 * of POLICY_SELF_PID. Returns the length. */
unsigned short policy_patch(const struct policy *p, pid_t self, struct sock_filter *out);

/* In a worker: copies the program with |self| in place of POLICY_SELF_PID
 * and loads it (no_new_privs must be set). Never calls libseccomp. Returns 0
 * or -errno. */
int policy_load(const struct policy *p, pid_t self);

/* The one fork a session's program does not refuse but hands to its
 * listener: a plain process whose parent is the forker's (the template). */
#define POLICY_SESSION_FORK (CLONE_PARENT | SIGCHLD)
/* ... and the one descriptor on which it may send and receive messages:
 * its channel to the template (the worker's FD_READY). */
#define POLICY_SESSION_CHANNEL_FD 4

/* In a session's process: loads the session's program as it is (no pid
 * patched in: in a session, where every cell is a fork carrying its state's
 * program, a pid would be another process's; calls about a process by its
 * pid go to the listener, see policy_self_arg) and returns its listener in
 * *listener. Returns 0 or -errno. */
int policy_load_session(const struct policy *p, int *listener);

/* For a call the table allows about the worker's own pid: the argument
 * that holds the pid (in a session's program the listener compares it with
 * the caller's), or -1 for any other call. */
int policy_self_arg(long nr);

/* For the debug program: a SIGSYS handler that names the refused call on
 * stderr and makes it fail with EPERM instead of killing. */
int policy_debug_install(void);

/* "2.5.4" */
const char *policy_libseccomp_version(void);

#endif
