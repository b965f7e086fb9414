/*
 * The messages between the supervisor (library), the template and a worker.
 *
 * Supervisor <-> template: one SOCK_SEQPACKET socket (the control socket).
 *   supervisor -> template: CONFIG once (JSON text, with the workspace root
 *   directory descriptor attached), then TAKE each time it takes a worker.
 *   template -> supervisor: HELLO or FAIL after CONFIG; then WORKER for each
 *   idle worker (its descriptors attached), or FAIL when one could not be
 *   made ready.
 *
 * Template -> supervisor, one per worker: a status pipe that carries one
 * struct wire_status once the template has reaped the worker. The template
 * never ran user code, so this is the only channel whose bytes decide a
 * verdict.
 *
 * Supervisor -> worker: the request socket carries one request (struct
 * wire_req, the code, then each file), after which the supervisor closes it.
 */
#ifndef PYSBX_WIRE_H
#define PYSBX_WIRE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define WIRE_VERSION 9

enum wire_msg_type {
    WIRE_CONFIG = 1,
    WIRE_HELLO,
    WIRE_WORKER,
    WIRE_FAIL,
    WIRE_TAKE,
    WIRE_SESSION_OPEN, /* supervisor -> template: a session's channel attached */
    WIRE_SESSION,      /* template -> supervisor, on the channel: the session is ready */
    WIRE_CELL,         /* supervisor -> template, on the channel: run the next cell */
    WIRE_ENDED,        /* template -> supervisor, on the channel: the session is over */
    WIRE_SETTLE,       /* supervisor -> template, on the channel: keep the cell or not */
    WIRE_SAVE,         /* supervisor -> template, on the channel: the state's image, to the fd */
    WIRE_SAVED,        /* template -> supervisor, on the channel: written (struct wire_saved) */
    WIRE_RESTORE,      /* supervisor -> template, on a restored session's channel: its image */
    WIRE_ADOPT,        /* supervisor -> template, on a branch's channel: its kept files */
};

/* Descriptors attached to WIRE_WORKER, in this order. */
enum wire_worker_fd {
    WFD_REQUEST,   /* stream socket: write the request, then close */
    WFD_STDOUT,    /* pipe, read end */
    WFD_STDERR,    /* pipe, read end */
    WFD_STATUS,    /* pipe, read end: one struct wire_status from the template */
    WFD_PIDFD,     /* pidfd of the worker, to kill it without a pid race */
    WFD_WORKSPACE, /* the worker's workspace directory */
    WFD_COUNT,
};

/* A cell's WIRE_WORKER carries one more: the session's saved workspace,
 * the files as of the last kept cell. Then one (O_PATH) for each regular
 * file of the workspace the session's state holds open (kept files, below),
 * in the order the template keeps them: the files a rollback puts back in
 * their own inodes. */
#define WFD_SAVED         WFD_COUNT
#define WFD_SESSION_COUNT (WFD_COUNT + 1)

/* The most regular files of its workspace a session's state may hold open
 * from one cell to the next (kept files): a cell that leaves more is
 * rolled back. A cell gets each as a descriptor of its own, and the
 * supervisor each with the cell (WFD_SESSION_COUNT + this, at most, on a
 * cell's WIRE_WORKER; the descriptors one message may carry are more). */
#define WIRE_HELD_MAX 64

#define WIRE_TEXT_MAX 1024
#define WIRE_NAME_MAX 64
/* The largest message either side sends or receives on the control socket
 * (CONFIG, a header and JSON text, is the only one near it). */
#define WIRE_MSG_MAX         65536
#define WIRE_CONFIG_TEXT_MAX (WIRE_MSG_MAX - sizeof(struct wire_hdr) - 1)

/* A worker whose code ended with an uncaught MemoryError ends by this
 * signal, so the supervisor can tell it from an exit status the code chose.
 * The convention is between worker and supervisor; no other signal is
 * spent on it. */
#define WIRE_NOMEM_SIGNAL (SIGRTMAX)

struct wire_hdr {
    uint32_t type;
    uint32_t version;
};

#define WIRE_LAYERS           12  /* SBX_LAYER_COUNT */
#define WIRE_LAYER_DETAIL_MAX 192 /* struct sbx_layer_info's detail */

struct wire_layer {
    uint32_t active;
    char detail[WIRE_LAYER_DETAIL_MAX];
};

struct wire_hello {
    struct wire_hdr hdr;
    char python_version[32];
    char libseccomp_version[32];
    uint64_t workspace_bytes;              /* tmpfs size of each workspace; 0: none */
    struct wire_layer layers[WIRE_LAYERS]; /* by bit of enum sbx_layer */
};

struct wire_worker {
    struct wire_hdr hdr;
    int32_t pid;
    uint32_t uid, gid;             /* the worker's own, when it has one (else 0) */
    char workspace[WIRE_NAME_MAX]; /* name inside the workspace root */
};

struct wire_fail {
    struct wire_hdr hdr;
    char text[WIRE_TEXT_MAX];
};

/*
 * Sessions. The supervisor makes a SOCK_SEQPACKET pair per session and sends
 * one end to the template with WIRE_SESSION_OPEN; everything else of the
 * session goes over it. The template answers WIRE_SESSION (or WIRE_FAIL),
 * then, for each WIRE_CELL, WIRE_WORKER with WFD_SESSION_COUNT descriptors
 * (the cell's, as a worker's, and the saved workspace) or WIRE_FAIL; the
 * cell's status pipe then carries its struct wire_status as a worker's
 * does. WIRE_CELL carries the cell's CPU and wall limits: the template arms
 * them itself, from nothing the cell says. After each cell whose status it
 * read, the supervisor says with WIRE_SETTLE whether the cell is kept (only
 * a status marked KEPT may be, and only if its files were saved): the
 * template answers the next WIRE_CELL only after it. When the session ends
 * on the template's side (its idle time or lifetime ran out, its process
 * died, one of its processes broke the protocol) the template sends
 * WIRE_ENDED (a struct wire_fail by its layout) saying why, and closes the
 * channel once the session's last process is reaped and its uid is free of
 * processes. A FAIL is about one cell (or the opening): the session goes on.
 */
struct wire_session_open {
    struct wire_hdr hdr;
    uint64_t idle_ms;
    uint64_t lifetime_ms;
    uint64_t memory_bytes; /* a branch's is its origin's, whatever this says */
    /* Not 0: the session is a branch of the one the template calls so
     * (wire_session.id), which the supervisor keeps from any other call
     * meanwhile. Its WIRE_SESSION comes once the copy of the state is made,
     * with WIRE_BRANCH_FDS descriptors: the branch's workspace, its saved
     * copy, and the origin's saved copy (the supervisor copies the files). */
    uint64_t branch_of;
    /* Not 0: the session is restored from an image (WIRE_RESTORE, which the
     * supervisor sends next). Its WIRE_SESSION comes once the copy is made,
     * with WIRE_RESTORE_FDS descriptors: its workspace and its saved copy
     * (the supervisor writes the files). */
    uint64_t restore;
};

struct wire_session {
    struct wire_hdr hdr;
    int32_t pid; /* the session's first state process */
    uint32_t uid, gid;
    /* A branch whose origin's state holds files open (kept files): how
     * many, and their inodes in the origin's workspace. The supervisor
     * answers WIRE_ADOPT with the branch's copy of each (after it copied
     * the files), before any cell: its state takes them on. */
    uint32_t held;
    uint64_t id; /* the template's name for it (wire_session_open.branch_of) */
    uint64_t held_ino[WIRE_HELD_MAX];
};
#define WIRE_BRANCH_FDS  3
#define WIRE_RESTORE_FDS 2

/*
 * Images of a session's state. WIRE_SAVE (a session waiting between cells,
 * the descriptor to write to attached): once the state may be copied, as
 * for a branch, a copier writes its memory to the descriptor
 * (src/template/branch.h); then WIRE_SAVED says how it went, with the
 * session's saved copy of its files attached when it went well (the
 * supervisor writes the files after the memory). The session goes on.
 * WIRE_RESTORE (a session opened with |restore|, the descriptor to read
 * from attached): its first process is made a copy of the image. An image
 * past |max_bytes| is refused, either way.
 */
struct wire_image {
    struct wire_hdr hdr;
    uint64_t max_bytes;
};

struct wire_saved {
    struct wire_hdr hdr;
    int32_t rc; /* 0, or -errno */
    uint32_t reserved;
    uint64_t bytes; /* the memory image */
    char why[WIRE_TEXT_MAX];
};

struct wire_cell {
    struct wire_hdr hdr;
    uint32_t rollback; /* enum sbx_rollback */
    uint32_t reserved;
    uint64_t cpu_ms; /* the request's limits, kept by the template */
    uint64_t wall_ms;
};

/* Files the session's state holds open that now have another inode: a
 * rolled-back cell deleted or replaced one (its old inode can have no name
 * again), or a branch's copy. |n| descriptors come with the message, one
 * for each; which[i] says which of the kept files (as the cell's
 * WIRE_WORKER carried them; a branch: as its WIRE_SESSION listed them)
 * the i-th replaces. The state takes each on at the kept file's number. */
struct wire_adopt {
    uint32_t n;
    uint32_t reserved;
    uint8_t which[WIRE_HELD_MAX];
};

struct wire_settle {
    struct wire_hdr hdr;
    uint32_t keep; /* 1: the cell kept (its status said KEPT); 0: rolled back */
    uint32_t reserved;
    struct wire_adopt adopt; /* rolled back: kept files put back in new inodes */
};

/* WIRE_ADOPT: a branch's kept files (wire_session.held of them, in order). */
struct wire_adopt_msg {
    struct wire_hdr hdr;
    struct wire_adopt adopt;
};

#define WIRE_STATUS_MAGIC   0x70737473u /* "psts" */
#define WIRE_STATUS_WHY_MAX 256

struct wire_status {
    uint32_t magic;
    int32_t wait_status; /* as from wait4() */
    uint32_t started;    /* the worker said its request was in place: user
                            code may have run. 0 means it certainly did not. */
    uint32_t flags;      /* WIRE_STATUS_* */
    int64_t utime_us;
    int64_t stime_us;
    int64_t maxrss_kb;
    /* A session's cell: the value its code ended with, as Python held it
     * (its claim); past 64 bits, INT64_MAX or -1 with
     * WIRE_STATUS_EXIT_PAST in flags. */
    int64_t cell_status;
    /* WIRE_STATUS_FDS_LEFT: which descriptor, and why it cannot be kept
     * (the template's words, from what the kernel says of it; NUL-ended). */
    char fds_why[WIRE_STATUS_WHY_MAX];
};

/* The template killed the worker when its CPU time reached the limit (a
 * timer on the worker's CPU clock, held by the template). */
#define WIRE_STATUS_CPU_KILLED 1u
/* The template could not keep the worker's CPU limit and killed it. */
#define WIRE_STATUS_LIMIT_LOST 2u
/* The template killed the worker at its wall limit: the supervisor's own
 * deadline had not (a slow output callback, say, held it up). */
#define WIRE_STATUS_WALL_KILLED 4u
/* Session cells. The cell ended by itself (its code's status in
 * cell_status, the kernel's eight bits of it in wait_status) and its
 * process, stopped, may be the session's state: the supervisor settles. */
#define WIRE_STATUS_KEPT 8u
/* The cell ended by itself but was rolled back: its process was killed,
 * the state is the one before it, for the reason the next flags give
 * (none of them: its code's status under the rollback rule). */
#define WIRE_STATUS_ROLLED_BACK 16u
/* ... it left a thread running at its end. */
#define WIRE_STATUS_THREADS_LEFT 32u
/* ... its output was still open: something could still write to it. */
#define WIRE_STATUS_OUTPUT_OPEN 64u
/* ... it left a descriptor open that a session cannot keep (anything but
 * its standard streams, its channel and at most WIRE_HELD_MAX regular
 * files of its workspace, unlocked): what later cells did through it could
 * not be rolled back. fds_why names it. */
#define WIRE_STATUS_FDS_LEFT 128u
/* The session ended while this cell was out (WIRE_ENDED says why): the
 * cell was killed with it. */
#define WIRE_STATUS_SESSION_ENDED 256u
/* The cell's value was an integer past 64 bits (cell_status says which
 * way). */
#define WIRE_STATUS_EXIT_PAST 512u

/* What a worker tells the template, on its ready pipe, once its request is
 * in place and before any of the request's code runs: the byte
 * WORKER_STARTED and then this. The template arms the CPU limit from it. */
struct wire_started {
    uint64_t cpu_used_ns;   /* the worker's CPU clock now */
    uint64_t cpu_limit_ns;  /* the request's CPU limit */
    uint64_t wall_limit_ns; /* and its wall limit: the template keeps it too */
};

#define WIRE_REQ_MAGIC 0x70737271u /* "psrq" */

struct wire_req {
    uint32_t magic;
    uint32_t version;
    uint64_t cpu_ms;
    uint64_t wall_ms;
    uint64_t memory_bytes;
    uint64_t code_len;
    uint32_t n_files;
    uint32_t n_args;
    uint64_t max_output_chars; /* how much of stdout the answer shows */
    uint64_t stdin_len;
    uint32_t filename_len; /* the program's name (0: none) */
    /* The host tools' JSON text, [{"name", "description"}, ...] (0: none;
     * else the request socket stays open as the run's tool channel). */
    uint32_t tools_len;
};

/* Each file follows as: struct wire_file, the name (name_len bytes, no NUL),
 * then data_len bytes of content. Then each argument, as a uint32_t length
 * and its bytes (no NUL); then the program's name (filename_len bytes, no
 * NUL); then the tools (tools_len bytes); then stdin_len bytes of standard
 * input. */
#define WIRE_TOOLS_MAX (512u << 10)
struct wire_file {
    uint32_t name_len;
    uint32_t reserved;
    uint64_t data_len;
};

#define WIRE_FILE_NAME_MAX 4096

/* The worker writes the repr() of the program's last expression to this
 * file of its workspace once the code has ended (replacing whatever the
 * code left there); the supervisor takes it as the result's value, never
 * as an artifact. A file, not a descriptor: while the code runs the worker
 * holds no descriptor but its three streams. */
#define WIRE_VALUE_FILE ".pysbx-value"
/* And, when the code ended by an uncaught exception, its type (qualified
 * by its module unless a builtin), str() of it and its traceback, each
 * ended by a NUL byte. Like the value, what the sandboxed process says of
 * itself: the supervisor takes it only from a run that exited with status
 * 1 (as an uncaught exception makes it), and gives it as the code's own
 * report, never as a fact of the sandbox's. */
#define WIRE_ERROR_FILE ".pysbx-error"

/* Sends one SEQPACKET message with up to |nfds| descriptors attached.
 * Returns 0 or -errno. */
int wire_send(int sock, const void *msg, size_t len, const int *fds, int nfds);

/* Receives one message into |buf| (at most |cap| bytes); descriptors are
 * received close-on-exec into |fds| (at most |maxfds|, the rest closed), and
 * their count into *nfds. Returns the message length, 0 at end of stream, or
 * -errno (-EMSGSIZE when the message or its descriptors were cut). */
ssize_t wire_recv(int sock, void *buf, size_t cap, int *fds, int maxfds, int *nfds);
/* wire_recv of a message that carries at most one descriptor: into *fd, or
 * -1 when none came. */
ssize_t wire_recv_one(int sock, void *buf, size_t cap, int *fd);

/* The decoding of what the template sends, apart from the reading, so that
 * the bytes alone decide (and a fuzzer reaches the very code that runs).
 * |buf| holds the |n| bytes a read returned; nothing past them is read.
 * What they put in |why| is valid UTF-8. */

/* The template's answer to CONFIG. HELLO: 0, and *out with its strings
 * terminated. FAIL or anything else: -EIO, and |why| says what. */
int wire_decode_hello(const void *buf, size_t n, struct wire_hello *out, char *why, size_t cap);
/* A message after HELLO, which came with |nfds| descriptors. WORKER with
 * all WFD_COUNT of them: 0, and *out with its workspace name terminated.
 * FAIL: -EIO and its text in |why|. Anything else: -EPROTO. */
int wire_decode_worker(const void *buf, size_t n, int nfds, struct wire_worker *out, char *why,
                       size_t cap);
/* Room for what answers a request for a worker: the worker, or a failure. */
union wire_worker_reply {
    struct wire_hdr hdr;
    struct wire_worker worker;
    struct wire_fail fail;
};
/* The same, for a session's cell: |want| descriptors (WFD_SESSION_COUNT). */
int wire_decode_worker_fds(const void *buf, size_t n, int nfds, int want, struct wire_worker *out,
                           char *why, size_t cap);
/* The answer to WIRE_SESSION_OPEN: 0 and *out; FAIL or ENDED: -EIO and its
 * text in |why|; anything else: -EPROTO. */
int wire_decode_session(const void *buf, size_t n, struct wire_session *out, char *why, size_t cap);
/* A status message: 0 and *out, or -EPROTO when it is cut or not one. */
int wire_decode_status(const void *buf, size_t n, struct wire_status *out);

#endif
