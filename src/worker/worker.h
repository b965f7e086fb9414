/*
 * A worker: forked from the template, confines itself while idle, then reads
 * one request, runs it, and ends. Used once.
 */
#ifndef PYSBX_WORKER_H
#define PYSBX_WORKER_H

#include "confine.h"
#include "wire.h"

#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

/* Bytes a worker writes on its ready pipe to the template. */
#define WORKER_READY 'R' /* idle and confined: may be handed out */
#define WORKER_STARTED                                                                             \
    'S' /* the request is in place; user code runs next;                                           \
           a struct wire_started follows */

/* Written to the ready pipe, after which the worker exits, when it could not
 * get ready; the rest of the line says why. */
#define WORKER_FAILED 'F'

/* A session's processes (session.h): what the state process tells the
 * template on its channel. */
#define SESSION_READY       'R' /* confined; the listener is attached */
#define SESSION_FORK_FAILED 'F' /* the fork was let through and failed; why follows */
/* What the template tells a session's first process once it is ready and
 * has a session (at once, or when it was made ahead as a spare and is
 * taken): its address-space ceiling, and whether it is a branch's (it
 * imports a state: BRANCH_STACK comes next) or a new session's. Nothing of
 * any tenant's has run in it before. */
#define SESSION_BEGIN 'B'
struct session_begin {
    char cmd; /* SESSION_BEGIN */
    uint8_t branch;
    uint8_t reserved[6];
    uint64_t memory_bytes; /* past what it has mapped */
    uint64_t as_limit;     /* a branch's RLIMIT_AS, exactly (0: from memory_bytes) */
};
#define SESSION_FORKED 'k' /* ... and made its child: look for it */
/* ... and what a cell's process says on its own channel. */
#define CELL_HELLO 'H' /* forked: here I am (the kernel attaches who) */
#define CELL_DONE  'D' /* the code ended by itself; how follows (CELL_DONE_LEN) */
/* CELL_DONE, then the int64_t value and the past flag (one byte, 0 or 1)
 * of the cell's struct pyrun_exit. */
#define CELL_DONE_LEN (1 + sizeof(int64_t) + 1)
/* What the template tells the state process: fork the next cell; the
 * cell's channel is attached, and the message says which pages the cell
 * maps while it waits to be handed out: those the last cell read of its
 * code and constants (a fork copies no page table entry of a file's
 * mapping, so each page of code a cell runs is a fault of its own), and
 * those it wrote, copied (a cell's first writes are copy-on-write faults).
 * On some machines a fault costs more than the rest of a small cell. */
#define SESSION_FORK         'K'
#define CELL_PLAN_MAX_RANGES 1024
/* A range whose start has this bit (addresses are page-aligned) is only
 * read: its pages are mapped, not copied. */
#define CELL_PLAN_READ 1ULL
struct session_fork_msg {
    char cmd; /* SESSION_FORK */
    uint8_t reserved[3];
    uint32_t n_ranges;
    uint64_t ranges[CELL_PLAN_MAX_RANGES][2]; /* [start, end), page-aligned; n_ranges of them */
};
/* Branching (a copy of a state as a session of its own). Each process, as
 * it becomes the state (the session's first, a kept cell once its code
 * ended), writes down what a fork would carry into a child and a fresh
 * process lacks (its signal actions, mask and alternate stack, umask,
 * working directory) before it forks anything, and where a copy resumes is
 * marked once, in the first: the template copies a state only once the
 * kernel has seen it fork since it became the state, and never wakes it
 * for a copy. A branch's first process, made fresh and confined as its
 * own session, gets BRANCH_STACK (struct branch_op: where to map the stack
 * it imports on, clear of the state's memory), then struct branch_op
 * messages that make its memory map the state's; at BRANCH_OP_GROW it
 * answers BRANCH_MAPPED, with a userfaultfd of its own memory if it has
 * one (session_import_fd; BRANCH_MAPPED_FULL if that takes the kernel's
 * faults too), and waits while the template copies the state's pages into
 * it; BRANCH_OP_END resumes the copy where the state marked, and it says
 * SESSION_BRANCHED (from then on it is the tenant's). BRANCH_FAILED and
 * why, then its exit, if an operation fails. */
#define SESSION_BRANCHED   'b'
#define BRANCH_MAPPED      'M'
#define BRANCH_MAPPED_FULL 'F' /* its userfaultfd takes the kernel's faults too */
#define BRANCH_FAILED      'E'
#define BRANCH_COPIED      'C'
enum branch_op_kind {
    BRANCH_STACK = 1,
    BRANCH_OP_MUNMAP,
    BRANCH_OP_BRK,
    BRANCH_OP_MMAP_ANON,
    BRANCH_OP_MMAP_FILE, /* the file attached */
    BRANCH_OP_PROTECT,
    BRANCH_OP_GROW, /* the stack, down to |lo| */
    BRANCH_OP_END,
};
/* The stack a branch imports on stays mapped in it: its address-space
 * ceiling is its origin's plus this, so that the code has the room it had. */
#define BRANCH_IMPORT_STACK (256 * 1024ULL)
struct branch_op {
    uint32_t kind; /* enum branch_op_kind */
    int32_t prot;
    uint64_t lo, hi, off;
};
/* ... and the cell, on its channel, when it is handed out: run; its
 * request socket, stdout and stderr are attached, then one descriptor for
 * each kept file the message gives (struct cell_go): a description of the
 * file of its own (its offset and flags the state's), which the cell puts
 * at the file's number before its code runs, so that nothing it does
 * through it (a seek, a flag) is the state's. A kept file the template
 * could not give (the state's descriptor is not what was kept) the cell
 * closes. */
#define CELL_GO  'G'
#define CELL_FDS 3
struct cell_held {
    int32_t num;     /* the descriptor's number in the state */
    uint8_t cloexec; /* its close-on-exec flag */
    uint8_t given;   /* a descriptor is attached for it (in order); 0: close |num| */
    uint8_t reserved[2];
};
struct cell_go {
    char cmd; /* CELL_GO */
    uint8_t reserved[3];
    uint32_t n_held;
    struct cell_held held[WIRE_HELD_MAX];
};
/* What the template tells the state that holds a kept file whose inode
 * changed (a rollback put it back as a new one, or a branch's copy): take
 * the attached descriptor on at |num|; the cells forked after have it. */
#define SESSION_ADOPT 'A'
struct session_adopt_msg {
    char cmd; /* SESSION_ADOPT */
    uint8_t cloexec;
    uint8_t reserved[2];
    int32_t num;
};

/* The worker's descriptors once it has set itself up; nothing else is open. */
enum {
    FD_STDIN = 0,
    FD_STDOUT = 1,
    FD_STDERR = 2,
    FD_REQUEST = 3,
    FD_READY = 4,
    FD_WORKSPACE = 5,
    FD_RULESET = 6,  /* Landlock ruleset, or /dev/null when there is none */
    FD_WS_MOUNT = 7, /* the workspace's detached mount, or /dev/null */
    FD_FIRST_FREE = 8,
};

struct worker_args {
    pid_t ppid;          /* getppid() while the template lives (confine.h): we die with it */
    int req_fd;          /* request socket, worker's end */
    int out_fd;          /* stdout pipe, write end */
    int err_fd;          /* stderr pipe, write end */
    int ready_fd;        /* ready pipe to the template, write end */
    int ws_fd;           /* the workspace directory */
    int devnull_fd;      /* /dev/null, read-write */
    const char *ws_path; /* the workspace as the code sees it (HOME, TMPDIR, cwd) */
    /* With the private root: the workspace's detached mount, which the
     * worker mounts at ws_path in a mount namespace of its own (the
     * template's has no workspace: siblings are not merely unreachable but
     * absent). -1: the workspace is the directory ws_fd, where it is. */
    int ws_mount_fd;
    const char *user; /* USER and LOGNAME: the name of the worker's uid */
    /* Work the template left to this worker, done once its mount namespace
     * is its own and before anything else of Python's (NULL: none): a
     * single run's package imports. Returns 0 or -errno with a message. */
    int (*late)(void *arg, char *err, size_t errlen);
    void *late_arg;
    bool rehearse;         /* warm up while idle (pyrun_prepare) */
    const char *warm_code; /* and run this too (pyrun_prepare), or NULL */
    /* Make a holder (holder.h), so that the exit's teardown is not on the
     * answer's path: only where an init of a pid namespace of ours reaps
     * it once we are gone (pool.c says where it pays). */
    bool hold_exit;
    /* A session's first state process: the ready pipe is a SOCK_SEQPACKET
     * socket, the policy the session's (plan.policy), and instead of one
     * request it serves the session (session.h). */
    bool session;
    struct confine_plan plan; /* its ruleset_fd is moved to a fixed number */
};

/* Runs in the child right after the fork; never returns. */
_Noreturn void worker_main(const struct worker_args *a);

/* setrlimit (session.c sets a session's ceilings with it); and the CPU and
 * wall limits' start, told to the template, with RLIMIT_CPU a second past
 * the template's timer. Both return 0 or -errno. */
int worker_set_limit(int resource, rlim_t soft, rlim_t hard);

/* The address space this process has mapped, in bytes, as RLIMIT_AS counts
 * it, at most 64 KiB over (0 when it cannot tell); probed through RLIMIT_AS
 * itself, which it leaves as it was. */
uint64_t worker_vm_bytes(void);
/* The RLIMIT_AS that lets a run map |memory_bytes| past what the worker had
 * mapped once warm (worker_main measures it before any request). */
rlim_t worker_memory_limit(uint64_t memory_bytes);
int worker_start_limits(uint64_t cpu_ms, uint64_t wall_ms);

#endif
