/*
 * A branch of a session: a copy of its state's memory in a process of a
 * session of its own (its own uid, workspace, seccomp listener and limits).
 *
 * A fork cannot give that: a child keeps its parent's uid, mount namespace,
 * Landlock domain and everything else the state's code could reach, and no
 * process that ran the tenant's code may be given a privilege to change
 * them. So the branch's first process is made fresh from the template, as
 * any session's is, and confined before it gets anything of the state's:
 * it then maps what the state maps, at the same addresses (all of a
 * session's processes descend from the template, so the interpreter, its
 * libraries and their addresses are the same), and the template copies
 * into it the pages in which the two differ. Pages the state still shares
 * with the template (the same physical page, as the kernel's page map
 * says) are not copied: the branch has them too. A state of a few MB
 * costs about a cell; each MB it wrote costs a copy.
 *
 * Nothing of the state's is trusted here: its memory map and page map are
 * the kernel's, its pages are copied as bytes into the branch (the only
 * process they can shape), and the state is stopped while they are read.
 * The branch's process does as told until the copy resumes it; from then
 * on it is the tenant's, and the template treats it as any state.
 */
#ifndef PYSBX_BRANCH_H
#define PYSBX_BRANCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct branch_stats {
    uint64_t regions; /* the state's mappings */
    uint64_t copied;  /* pages copied */
};

/* Which processes: as /proc (|proc_fd|) numbers them, and as the caller's
 * own pid namespace does (for process_vm_readv and process_vm_writev). */
struct branch_pids {
    pid_t from, to;
    pid_t vm_from, vm_to;
};

/* Makes process |to| (a branch's first process, waiting at its import on
 * the channel |sock|) a copy of the memory of |from| (a state that has
 * exported itself and is stopped), reading both under /proc (|proc_fd|).
 * On success the copy resumes where the state exported, and says
 * SESSION_BRANCHED on its channel. Returns 0, or -errno with |why|. */
int branch_copy(int proc_fd, const struct branch_pids *p, int sock, struct branch_stats *st,
                char *why, size_t cap);

#endif
