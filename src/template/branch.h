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
 * into it the pages in which the two differ (into the mappings made for
 * the copy, through the userfaultfd the branch's process gives it:
 * session_import_fd). Pages the state still shares with the template (the
 * same physical page, as the kernel's page map says) are not copied: the
 * branch has them too. A state of a few MB costs about a cell; each MB it
 * wrote costs a copy (where the branch's userfaultfd takes every fault,
 * most of it after the branch resumed: branch_fill).
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

struct fill_mm;

struct branch_stats {
    uint64_t regions; /* the state's mappings */
    uint64_t copied;  /* pages copied before the branch resumed */
};

/* The pages a branch gets after it resumed: of the mappings made for the
 * copy, when its userfaultfd takes every fault (the kernel's too: made by
 * a process that could, session_import_fd). Registered with it, they are
 * put in by branch_fill from the state's memory, a fault on one served
 * first; a process forked of the branch's meanwhile (a cell) is followed
 * (the fork event: a userfaultfd of its own memory) and gets them too. */
struct branch_fill {
    int uffd; /* the branch's userfaultfd */
    int mem;  /* the state's /proc/PID/mem */
    char *buf;
    uint64_t (*runs)[2]; /* the state's pages there, in address order */
    size_t n_runs, runs_room;
    struct fill_mm *mm; /* the processes filled (branch_fill's) */
    size_t n_mm, mm_room;
};

/* Which processes: as /proc (|proc_fd|) numbers them, and the one copied
 * into as the caller's own pid namespace does (for process_vm_writev). */
struct branch_pids {
    pid_t from, to;
    pid_t vm_to;
};

/* Makes process |to| (a branch's first process, waiting at its import on
 * the channel |sock|) a copy of the memory of |from| (a state that has
 * written its record down and is stopped: worker.h), reading both under
 * /proc (|proc_fd|). On success the copy resumes where the state marked,
 * and says SESSION_BRANCHED on its channel; if |lazy| has runs then, the
 * copy is not whole until branch_fill has run (the state must stay as it
 * is until then). Returns 0, or -errno with |why| (|lazy| then empty). */
int branch_copy(int proc_fd, const struct branch_pids *p, int sock, struct branch_fill *lazy,
                struct branch_stats *st, char *why, size_t cap);

/* The rest of a branch's pages put in (|f|, branch_copy's), in its first
 * process and in every process forked of one before its pages were all
 * in, in the order they were made; faults served meanwhile. Returns once
 * every page is in each of them that is alive; branch_fill_free then
 * closes their userfaultfds. Returns 0, or -errno with |why|: then the
 * branch is not a copy of the state (a page not put in reads as zeros
 * once the userfaultfd is closed) and must end. */
int branch_fill(struct branch_fill *f, char *why, size_t cap);

/* What |f| holds, released. */
void branch_fill_free(struct branch_fill *f);

/* The buffer a copy goes through, made and written now, before the copy
 * (a copier made ahead calls it while it waits): a page of it written for
 * the first time is a fault, which on a machine whose hypervisor backs
 * memory as it is first touched costs a trap of its own. And the copier's
 * second thread made, which copies beside the first (0.1 ms to make, 0.1
 * ms to join, if made for each copy). Then a copy rehearsed on our own
 * memory, through |proc_fd| (/proc), compared and not written, so that
 * the first job's allocations are warm too. Best effort: without a second
 * thread, one thread copies. Only in a copier: the template itself forks,
 * and keeps to one thread. */
void branch_buffer_ready(int proc_fd);

/*
 * Images: a state's memory written to a descriptor, and a branch's first
 * process made a copy of it from one. The image is the state's map (from
 * the kernel) and the pages that are the state's own: of each mapping the
 * present pages (the zero page aside) of memory of no file; all the pages
 * of a file's mapping that is writable or not the template's own; none of
 * the template's own mappings of files that are not writable (the process
 * that restores it maps them too) nor the kernel's. It ends with a check
 * of all of it (XXH3), and a restore reads it all and checks it before the
 * copy resumes. Restoring needs a process with the template's layout (the
 * same template, or one started with the same layout: |layout| says which,
 * image_layout()); an image is the tenant's data whoever wrote it: every
 * field of it is checked as a map from the kernel would be, and whatever
 * it holds is copied into the branch's process alone, confined as any.
 */

/* The layout of the template as it was started (|pid| under /proc
 * |proc_fd|, read before anything of its own is mapped): a hash of where
 * the program, its libraries, stack, heap and the kernel's pages are, and
 * this build's version; 0 if it cannot be read. A module the template
 * loads later may land elsewhere at another start: an image maps its file
 * where the image had it. */
uint64_t image_layout(int proc_fd, pid_t pid);

struct image_req {
    pid_t tmpl;         /* the template (its own mappings of files) */
    uint64_t layout;    /* its image_layout() */
    uint64_t max_bytes; /* an image past this is refused */
    uint64_t as_limit;  /* save: the state's hard RLIMIT_AS, written down */
};

/* Writes the memory of |p->from| (recorded and stopped) to |out|, with the
 * template's own mappings of files that are not writable left out.
 * *bytes gets its length. Returns 0, or -errno with |why|. */
int image_save(int proc_fd, const struct branch_pids *p, const struct image_req *r, int out,
               uint64_t *bytes, char *why, size_t cap);

/* Makes |p->to| (a branch's first process at its import on |sock|) a copy
 * of the state the image on |in| holds, as branch_copy does from a live
 * state. Returns 0, or -errno with |why|. */
int image_restore(int proc_fd, const struct branch_pids *p, int sock, const struct image_req *r,
                  int in, char *why, size_t cap);

#endif
