/*
 * pysbx: run untrusted Python in a forked, embedded CPython and get back an
 * honest, bounded result.
 *
 * The recipe:
 *
 *   1. Open a sandbox once. This starts the template process in which CPython
 *      is initialised (one exec of a small helper, at open, never per run).
 *
 *          struct sbx_config cfg;
 *          sbx_config_init(&cfg);
 *          struct sbx *sbx;
 *          int rc = sbx_open(&cfg, &sbx, &err);
 *
 *   2. Describe a run: code, input files, limits (defaults filled in).
 *
 *          struct sbx_request req;
 *          sbx_request_init(&req);
 *          req.code = "print(1)";
 *          req.code_len = 8;
 *
 *   3. Run it, from any thread, as often as you like. Each run gets a fresh,
 *      single-use worker forked from the template.
 *
 *          struct sbx_result *res;
 *          rc = sbx_run(sbx, &req, &res, &err);
 *          ... res->status, res->stdout_text, res->artifacts ...
 *          sbx_result_free(res);
 *
 *   4. Close it. Runs still in flight in other threads end as cancelled.
 *
 *          sbx_close(sbx);
 *
 * Return codes: functions that can fail return 0 or a negative errno value.
 * A run that the sandbox carried out always returns 0 with a result, whatever
 * happened to the code (an exception, a timeout, a crash); the result's status
 * says which. A negative return means the request itself was refused (bad
 * limit, bad file name, ...) or the library could not work at all; a struct
 * sbx_error, when given, then holds a stable code and a readable message.
 *
 * The ABI rule: until 1.0, each 0.y release is an ABI of its own. The public
 * structs are allocated by the caller and initialised with the library's
 * sizeof (sbx_config_init, sbx_request_init), and a release may add fields to
 * them, so a program runs only against the 0.y it was built with: the SONAME
 * carries the minor version (libpysbx.so.0.6, PYSBX_SONAME), the CMake
 * package accepts only the same 0.y (find_package(pysbx 0.6)), and a 0.y.z
 * release changes no struct and removes no function. From 1.0 the SONAME is
 * the major version and structs only grow under a new major.
 */
#ifndef PYSBX_H
#define PYSBX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PYSBX_VERSION "0.6.0"

#define PYSBX_VERSION_MAJOR 0
#define PYSBX_VERSION_MINOR 6
#define PYSBX_VERSION_PATCH 0
/* The shared library this header describes (see the ABI rule above). */
#define PYSBX_SONAME "libpysbx.so.0.6"

#if defined(__GNUC__)
#define PYSBX_API __attribute__((visibility("default")))
#else
#define PYSBX_API
#endif

/* Defaults of struct sbx_limits (see sbx_limits_init). */
#define SBX_DEFAULT_WALL_SECONDS              10.0
#define SBX_DEFAULT_CPU_SECONDS               5.0
#define SBX_DEFAULT_MEMORY_BYTES              (256ULL << 20)
#define SBX_DEFAULT_MAX_OUTPUT_CHARS          100000ULL
#define SBX_DEFAULT_MAX_ARTIFACT_BYTES        (4ULL << 20)
#define SBX_DEFAULT_MAX_ARTIFACTS             32ULL
#define SBX_DEFAULT_MAX_ARTIFACTS_TOTAL_BYTES (16ULL << 20)

/* Ranges accepted by sbx_run; anything outside is refused with
 * SBX_ERR_INVALID_LIMIT before anything runs. */
#define SBX_MAX_SECONDS               86400.0
#define SBX_MIN_MEMORY_BYTES          (32ULL << 20)
#define SBX_MAX_MEMORY_BYTES          (1ULL << 40)
#define SBX_MAX_OUTPUT_CHARS_LIMIT    (16ULL << 20)
#define SBX_MAX_ARTIFACT_BYTES_LIMIT  (256ULL << 20)
#define SBX_MAX_ARTIFACTS_LIMIT       100000ULL
#define SBX_MAX_ARTIFACTS_TOTAL_LIMIT (1ULL << 30)
/* Size limits of a request: the code, and the code plus all input files. */
#define SBX_MAX_CODE_BYTES    (64ULL << 20)
#define SBX_MAX_INPUT_FILES   10000u
#define SBX_MAX_REQUEST_BYTES (256ULL << 20)
#define SBX_MAX_ARGS          4096u

/* Opaque handle: one template process and its workers. Thread-safe. */
struct sbx;

/* The layers of confinement. Each is active where the kernel and the
 * caller's privileges allow; sbx_layers() says which, and why not.
 * Bits, so a set of them can be required (sbx_config.required_layers). */
enum sbx_layer {
    SBX_LAYER_SECCOMP = 1u << 0,  /* "seccomp": default-deny system call policy */
    SBX_LAYER_LANDLOCK = 1u << 1, /* "landlock": file system confined */
    SBX_LAYER_NETNS = 1u << 2,    /* "netns": a network namespace with no interface */
    SBX_LAYER_MOUNTNS = 1u << 3,  /* "mountns": each workspace a private, bounded tmpfs */
    SBX_LAYER_IPCNS = 1u << 4,    /* "ipcns": System V IPC of its own */
    SBX_LAYER_UTSNS = 1u << 5,    /* "utsns": a hostname of its own */
    SBX_LAYER_USER = 1u << 6,     /* "user": an unprivileged uid and gid */
    SBX_LAYER_RLIMITS = 1u << 7,  /* "rlimits": time, memory, file size, descriptors */
    SBX_LAYER_CAPS = 1u << 8,     /* "caps": no capabilities, no_new_privs */
    SBX_LAYER_ROOT = 1u << 9,     /* "root": a private, read-only view of the machine */
    SBX_LAYER_UIDRUN = 1u << 10,  /* "uidrun": each run its own uid and gid */
    SBX_LAYER_FREEZE = 1u << 11,  /* "freeze": a session's stopped processes frozen */
};
#define SBX_LAYER_COUNT 12
/* In required_layers: the default set. seccomp; file-system confinement
 * (landlock or root, either one); and, when the caller is root, uidrun. */
#define SBX_LAYERS_DEFAULT (1u << 31)

/* Defaults and ranges of struct sbx_config. */
#define SBX_DEFAULT_WORKSPACE_BYTES (128ULL << 20)
#define SBX_MIN_WORKSPACE_BYTES     (1ULL << 20)
#define SBX_MAX_POOL_SIZE           1024u
/* A block of ids no distribution assigns (above the 16-bit range and the
 * ranges systemd and container tools hand out). */
#define SBX_DEFAULT_WORKER_ID_BASE 2130706432L /* 0x7f000000 */
#define SBX_DEFAULT_WORKER_IDS     4096u
#define SBX_MAX_WORKER_IDS         65536u
#define SBX_SINGLE_RUN_WORKER_IDS  4u

struct sbx_layer_info {
    enum sbx_layer layer;
    const char *name; /* "seccomp", ... */
    bool active;
    char detail[192]; /* what it does here, or why it is unavailable */
};

/* How sbx_open starts the sandbox. Strings are copied by sbx_open. */
struct sbx_config {
    /* The template helper (pysbx-template). NULL: the PYSBX_TEMPLATE
     * environment variable if set, else the installed helper. */
    const char *template_path;
    /* Directory in which per-run workspaces are made. NULL: $TMPDIR, else
     * /tmp. */
    const char *work_root;
    /* Idle workers kept ready. 0: a default sized to the machine. */
    unsigned pool_size;
    /* NULL-terminated list of modules imported in the template before any
     * fork, so that importing them in user code is free. NULL: the default
     * set (json, re, math, collections, ...). */
    const char *const *warm_modules;
    /* NULL-terminated list of extra read-only directories put on sys.path
     * after the standard library (a vetted package tree, for example). */
    const char *const *module_dirs;
    /* Layers (enum sbx_layer bits) without which sbx_open fails rather than
     * run with less. sbx_config_init sets SBX_LAYERS_DEFAULT; 0 accepts
     * whatever the machine gives. */
    unsigned required_layers;
    /* When the caller is root, each worker runs as its own uid and gid,
     * taken from worker_ids consecutive ids starting at worker_uid and
     * worker_gid; an id is used again only once its previous worker is dead
     * and its workspace gone. The range is claimed machine-wide while the
     * sandbox lives (its first id is held by a process of the sandbox's,
     * and a range whose first id has a process already is not taken), so
     * that no two sandboxes on one kernel run workers with the same uid;
     * workers take the range's other ids. -1: a range drawn at random from
     * the 2^24 ids above SBX_DEFAULT_WORKER_ID_BASE (gids alike); a range
     * given that another sandbox holds fails sbx_open. worker_ids 0:
     * SBX_DEFAULT_WORKER_IDS; worker_ids 1: every worker shares one uid (no
     * uidrun layer, nothing claimed). */
    long worker_uid;
    long worker_gid;
    unsigned worker_ids;
    /* For tests of degraded deployments only: layers (enum sbx_layer bits)
     * the template must not set up even where it could. */
    unsigned disable_layers;
    /* Size of each workspace tmpfs (when the mount namespace is available);
     * 0: SBX_DEFAULT_WORKSPACE_BYTES. Input files must fit in it. */
    uint64_t workspace_bytes;
    /* Refused system calls are named on stderr and fail with EPERM instead
     * of being policy-checked for real: for finding what code needs. Never
     * for production. */
    bool policy_debug;
    /* Runs in flight at once; more callers wait in a queue. 0: two per
     * core. */
    unsigned max_running;
    /* Callers that may wait for a worker; one more is refused at once with
     * SBX_ERR_BUSY. 0: 1024. */
    unsigned max_queued;
    /* The sandbox will run one program and close (a command-line run):
     * start as fast as possible rather than be ready for many. The template
     * imports no warm modules (unless warm_modules names some), makes one
     * worker, which skips its idle rehearsal, and replaces none; the worker
     * ids default to SBX_SINGLE_RUN_WORKER_IDS. A second sbx_run is
     * refused with SBX_ERR_BUSY. */
    bool single_run;
    /* NULL-terminated list of Python distributions installed by the system's
     * package manager ("numpy", "pandas", "matplotlib": Debian's python3-NAME)
     * to make importable, read-only, with what they depend on (the Debian
     * packages' own relations) and nothing else of the system's
     * dist-packages. They are imported in the template (matplotlib with its
     * non-interactive backend), so a sandbox with packages has a template of
     * its own; figures a run leaves open come back as figure-N.png. NULL or
     * empty: the standard library only. */
    const char *const *packages;
    /* Sessions open at once (sbx_session_open); one more is refused with
     * SBX_ERR_BUSY. 0: SBX_DEFAULT_MAX_SESSIONS. */
    unsigned max_sessions;
    /* The template's address layout is the same at every start of this
     * build on this machine (ASLR off for it: its workers share one layout
     * anyway, now across starts too), so that a session's image
     * (sbx_session_save) restores in a sandbox started later. Without it an
     * image restores only in the sandbox that wrote it. */
    bool fixed_layout;
};

/* Per-run ceilings. */
struct sbx_limits {
    double wall_seconds;         /* kept by the supervisor's clock, SIGKILL */
    double cpu_seconds;          /* user + system, all threads */
    uint64_t memory_bytes;       /* address space (RLIMIT_AS) */
    uint64_t max_output_chars;   /* per stream, in characters; 0 keeps none */
    uint64_t max_artifact_bytes; /* per file returned */
    uint64_t max_artifacts;      /* files returned; the first by name */
    /* Bytes returned of all files together: a file whose returned bytes
     * would pass it is not returned, and counted in artifacts_dropped. */
    uint64_t max_artifacts_total_bytes;
};

/* An input file written into the workspace before the code runs. |name| is
 * relative, '/'-separated, without "." or ".." components; parents are made. */
struct sbx_file {
    const char *name;
    const void *data;
    size_t len;
};

/* A host tool the code may call: in a run that declares tools, `import
 * pysbx` gives pysbx.tools.NAME(**arguments) and pysbx.call_tool(name,
 * arguments), which block the calling thread until the caller answers
 * (on_tool_call, sbx_tool_answer). Nothing of the host reaches the code but
 * what the caller answers. */
struct sbx_tool {
    const char *name;        /* [A-Za-z_][A-Za-z0-9_]{0,63} */
    const char *description; /* optional: the function's __doc__; valid UTF-8 */
};

#define SBX_MAX_TOOLS              64u
#define SBX_MAX_TOOL_DESCRIPTION   4096u
#define SBX_DEFAULT_MAX_TOOL_CALLS 64u
#define SBX_MAX_TOOL_CALLS_LIMIT   4096u
#define SBX_DEFAULT_MAX_TOOL_BYTES (1ULL << 20)
#define SBX_MAX_TOOL_BYTES_LIMIT   (16ULL << 20)
#define SBX_MIN_TOOL_BYTES         1024u
/* How deep a call's arguments may nest (an empty object is 1): readers
 * that recurse (Python's json stops at about 1,000) can take every call. */
#define SBX_MAX_TOOL_DEPTH 64u

/* Where a run's tool calls are answered, owned by the caller: made with
 * sbx_tool_answers_new, given in the request, answered from any thread with
 * sbx_tool_answer or sbx_tool_fail, freed only after the run returned. */
struct sbx_tool_answers;

/* A cancellation token, owned by the caller: fire it from any thread and the
 * run that carries it ends as SBX_CANCELLED (at once if it is still waiting
 * for a worker). Free it only after that run has returned. */
struct sbx_cancel;

struct sbx_request {
    const char *code; /* Python source; need not be NUL-terminated */
    size_t code_len;
    const struct sbx_file *files;
    size_t n_files;
    struct sbx_limits limits;
    /* Optional: called in sbx_run's thread as output arrives, |stream| 1 for
     * stdout and 2 for stderr, with exactly the text the result will hold
     * (valid UTF-8, at most max_output_chars characters per stream, then
     * the line that says how much was cut), in pieces. */
    void (*on_output)(void *user, int stream, const char *text, size_t len);
    void *user;
    struct sbx_cancel *cancel; /* optional */
    /* When every worker is busy: how long to wait for one before the run is
     * refused with SBX_ERR_BUSY. 0: as long as it takes. */
    double queue_timeout_seconds;
    /* Optional: the program's standard input, |stdin_len| bytes, whole
     * before the code starts (NULL: none; input() raises EOFError), counted
     * with the code and the files against SBX_MAX_REQUEST_BYTES. */
    const void *stdin_data;
    size_t stdin_len;
    /* Optional: the program's arguments, sys.argv[1:]: |argc| strings of
     * valid UTF-8 (at most SBX_MAX_ARGS, counted against
     * SBX_MAX_REQUEST_BYTES); sys.argv[0] is the program's |filename|. */
    const char *const *argv;
    size_t argc;
    /* Optional: the program's name as the caller gave it ("report.py"), as
     * `python3 report.py` takes it: sys.argv[0], __file__ and the file the
     * traceback names. "-" is standard input's: sys.argv[0] "-", __file__
     * and tracebacks "<stdin>". Valid UTF-8, at most 4096 bytes. NULL:
     * tracebacks name "<main>", __file__ is not set, sys.argv[0] is "". */
    const char *filename;
    /* Optional: host tools (at most SBX_MAX_TOOLS, names unique). Each call
     * the code makes is numbered from 1 in the order it was made and handed
     * to on_tool_call in sbx_run's thread, with its arguments as a JSON
     * object (|len| bytes, NUL-terminated); it must not block: the answer
     * goes to |tool_answers| (sbx_tool_answer, sbx_tool_fail), now or from
     * another thread while the code waits, its wall and CPU limits running.
     * A call the code makes past |max_tool_calls| (default 64), or with
     * arguments longer than |max_tool_bytes| (default 1 MiB; also the most a
     * result may be) or nested deeper than SBX_MAX_TOOL_DEPTH, or naming no
     * declared tool, is refused to the code
     * (pysbx.ToolError) without reaching on_tool_call (a frame written past
     * max_tool_bytes by the code itself closes the channel). A call never
     * answered waits until the run's limits end it. |tool_answers| serves
     * one run at a time. Not in a session's cell, nor on the python3
     * backend. */
    const struct sbx_tool *tools;
    size_t n_tools;
    void (*on_tool_call)(void *user, uint64_t call, const char *name, const char *arguments_json,
                         size_t len);
    struct sbx_tool_answers *tool_answers;
    uint32_t max_tool_calls;
    uint64_t max_tool_bytes;
};

enum sbx_status {
    SBX_COMPLETED = 0, /* the code ran to its end; see exit_code */
    SBX_TIMEOUT,       /* limit is SBX_LIMIT_WALL or SBX_LIMIT_CPU */
    SBX_MEMORY_LIMIT,  /* an allocation past the memory limit ended the code */
    SBX_CRASHED,       /* ended by a signal; SIGSYS means the policy stopped it */
    SBX_CANCELLED,     /* reserved for cancellation by the caller */
    SBX_SANDBOX_ERROR, /* the sandbox failed; reason says why */
};

enum sbx_limit_kind {
    SBX_LIMIT_NONE = 0,
    SBX_LIMIT_WALL,
    SBX_LIMIT_CPU,
    SBX_LIMIT_MEMORY,
};

/* A file's name as the result gives it: its path relative to the
 * workspace, '/'-separated, as valid UTF-8. A name that is not valid UTF-8,
 * or that holds U+FFFD itself, is escaped: each byte that is not part of a
 * valid character other than U+FFFD is written as U+FFFD and two lowercase
 * hex digits ("\xff" is "\xef\xbf\xbdff"), so that two files never share a
 * name; |raw_name| is then its bytes on disk (else the same pointer as
 * |name|). */
struct sbx_artifact {
    char *name;          /* relative to the workspace, '/'-separated, UTF-8 */
    uint64_t size;       /* the file's size on disk */
    bool truncated;      /* size > max_artifact_bytes */
    unsigned char *data; /* at most max_artifact_bytes of the file */
    size_t data_len;
    char *raw_name; /* the name's bytes on disk; == name unless it was escaped */
};

/* Why a file the code left was not returned. */
enum sbx_drop_reason {
    SBX_DROP_MAX_ARTIFACTS = 1, /* "max_artifacts": past the number returned */
    SBX_DROP_MAX_TOTAL_BYTES,   /* "max_artifacts_total_bytes": past what was left of it */
    SBX_DROP_TOO_DEEP,          /* "too_deep": a directory deeper than SBX_MAX_ARTIFACT_DEPTH */
    SBX_DROP_UNREADABLE,        /* "unreadable": the sandbox could not open it */
    SBX_DROP_LINKED,            /* "linked": a file of several names, not read (docs/result.md) */
};

/* Directories nested deeper than this in the workspace are not looked
 * into: each is listed once, as itself, with SBX_DROP_TOO_DEEP. */
#define SBX_MAX_ARTIFACT_DEPTH 1024
/* Files not returned are all counted in artifacts_dropped; the first (by
 * name) are listed with why, at most this many, and at most
 * SBX_MAX_DROPPED_NAME_BYTES of their names together. */
#define SBX_MAX_DROPPED_LISTED     256
#define SBX_MAX_DROPPED_NAME_BYTES (1U << 20)

/* A file (or a directory, whose name then ends with '/') the code left and
 * the result does not return. */
struct sbx_dropped_artifact {
    char *name;     /* as sbx_artifact's */
    char *raw_name; /* == name unless it was escaped */
    uint64_t size;  /* a file's size on disk; 0 for a directory */
    enum sbx_drop_reason reason;
};

/* Mirrors the JSON result object of the design (see sbx_result_to_json).
 * Text fields are valid UTF-8 and NUL-terminated; invalid bytes the code
 * wrote are shown as U+FFFD. */
struct sbx_result {
    enum sbx_status status;
    enum sbx_limit_kind limit;
    int exit_code; /* SBX_COMPLETED only, else -1 */
    int signal;    /* SBX_CRASHED only, else 0 */
    char *stdout_text;
    size_t stdout_len;
    char *stderr_text;
    size_t stderr_len;
    bool stdout_truncated;
    bool stderr_truncated;
    bool partial;                   /* output is what came before the sandbox stopped the run */
    struct sbx_artifact *artifacts; /* only for SBX_COMPLETED */
    size_t n_artifacts;
    uint64_t artifacts_dropped;
    double wall_ms;
    double cpu_ms; /* user + system, all threads, from the code's start */
    long max_rss_kb;
    char *reason; /* one line for any status but SBX_COMPLETED (and a session cell
                   * rolled back), else NULL */
    /* As in a notebook cell: when the program's last statement is an
     * expression, its repr(), at most max_output_chars characters (cut as
     * stdout is); NULL otherwise, and for runs the sandbox stopped. */
    char *value;
    size_t value_len;
    bool value_truncated;
    /* Session cells only (sbx_session_run; 0 and false otherwise): the
     * cell's number in its session, from 1, and whether the session was put
     * back as it was before the cell (variables and files). A completed cell
     * that was rolled back has its reason set too. */
    uint64_t cell;
    bool rolled_back;
    /* When the code ended by an uncaught exception (a completed run with
     * exit_code 1; never for sys.exit): its type ("KeyError", qualified by
     * its module unless a builtin or the program's own, as a traceback
     * names it: "json.decoder.JSONDecodeError"), str() of
     * it and its traceback as Python prints it, each valid UTF-8 of at most
     * max_output_chars characters; all NULL otherwise. Like stderr, this is
     * what the sandboxed interpreter reported, not something the sandbox
     * vouches for. */
    char *error_type;
    char *error_message;
    char *error_traceback;
    /* What artifacts_dropped counts, listed with why: the first by name, at
     * most SBX_MAX_DROPPED_LISTED (so n_dropped <= artifacts_dropped). */
    struct sbx_dropped_artifact *dropped;
    size_t n_dropped;
};

/* Stable codes for refused requests; sbx_error_code_name() gives the JSON
 * spelling. */
enum sbx_error_code {
    SBX_ERR_NONE = 0,
    SBX_ERR_INVALID_REQUEST, /* "invalid_request": malformed, no code, ... */
    SBX_ERR_INVALID_LIMIT,   /* "invalid_limit": zero, negative, absurd */
    SBX_ERR_INVALID_FILE,    /* "invalid_file": a name that escapes, ... */
    SBX_ERR_TOO_LARGE,       /* "request_too_large" */
    SBX_ERR_UNAVAILABLE,     /* "sandbox_unavailable": could not start */
    SBX_ERR_BUSY,            /* "sandbox_busy": queue full, or waited too long */
    SBX_ERR_SESSION_LOST,    /* "session_lost": the session is gone (see sbx_session_run) */
};

struct sbx_error {
    enum sbx_error_code code;
    char message[256];
};

PYSBX_API void sbx_config_init(struct sbx_config *cfg);
PYSBX_API void sbx_limits_init(struct sbx_limits *limits);
/* Zeroes |req| and sets its limits to the defaults. */
PYSBX_API void sbx_request_init(struct sbx_request *req);

/* Starts the template. On success *out owns it; free with sbx_close.
 * Returns 0, or a negative errno with |err| (may be NULL) filled in. */
PYSBX_API int sbx_open(const struct sbx_config *cfg, struct sbx **out, struct sbx_error *err);

/* Runs |req| in a fresh worker. Safe to call from many threads at once.
 * Returns 0 with *out set (free with sbx_result_free), or -EINVAL, -E2BIG,
 * -ENOMEM with |err| filled in and *out left NULL. Does not keep pointers
 * into |req| after it returns. */
PYSBX_API int sbx_run(struct sbx *sbx, const struct sbx_request *req, struct sbx_result **out,
                      struct sbx_error *err);

/* Checks |req| the way sbx_run does, without running it; all but whether a
 * request with tools has on_tool_call and a tool_answers free to use, so
 * that a request may be checked before it is wired to its caller. */
PYSBX_API int sbx_request_check(const struct sbx_request *req, struct sbx_error *err);

PYSBX_API void sbx_result_free(struct sbx_result *res);

/* Cancellation tokens (see struct sbx_request). sbx_cancel_new returns NULL
 * when out of memory. */
PYSBX_API struct sbx_cancel *sbx_cancel_new(void);
PYSBX_API void sbx_cancel_fire(struct sbx_cancel *cancel);
PYSBX_API bool sbx_cancel_fired(const struct sbx_cancel *cancel);
PYSBX_API void sbx_cancel_free(struct sbx_cancel *cancel);

/* Tool answers (see struct sbx_request). sbx_tool_answers_new returns NULL
 * when out of memory. sbx_tool_answer gives call |call| its result, any JSON
 * value (|json|, |len| bytes; at most the run's max_tool_bytes), which the
 * code's call returns decoded; sbx_tool_fail makes it raise
 * pysbx.ToolError(|message|) (valid UTF-8). Each returns 0, or -ENOENT for a
 * call that was never made or whose run has ended, -EALREADY for a call
 * already answered, -EINVAL for text that is not JSON (or not UTF-8),
 * -E2BIG past max_tool_bytes, -ENOMEM: and then nothing changed. */
PYSBX_API struct sbx_tool_answers *sbx_tool_answers_new(void);
PYSBX_API int sbx_tool_answer(struct sbx_tool_answers *a, uint64_t call, const char *json,
                              size_t len);
PYSBX_API int sbx_tool_fail(struct sbx_tool_answers *a, uint64_t call, const char *message);
PYSBX_API void sbx_tool_answers_free(struct sbx_tool_answers *a);

/* Fills |out| (SBX_LAYER_COUNT entries, in bit order) with what is active
 * in this sandbox. Returns SBX_LAYER_COUNT. */
PYSBX_API int sbx_layers(const struct sbx *sbx, struct sbx_layer_info out[SBX_LAYER_COUNT]);
/* "3.13.5" and "2.6.0" (Debian 13; "3.11.2" and "2.5.4" on 12): the
 * interpreter and libseccomp the template uses. */
PYSBX_API const char *sbx_python_version(const struct sbx *sbx);
PYSBX_API const char *sbx_libseccomp_version(const struct sbx *sbx);
/* Whether the layers |required| asks for (enum sbx_layer bits, or
 * SBX_LAYERS_DEFAULT among them) are active in |sbx|. Returns 0, or -EPERM
 * with |err| saying which is missing. */
PYSBX_API int sbx_check_layers(const struct sbx *sbx, unsigned required, struct sbx_error *err);
/* The layer called |name| ("seccomp", "landlock", ...), or 0. */
PYSBX_API enum sbx_layer sbx_layer_from_name(const char *name);
PYSBX_API const char *sbx_layer_name(enum sbx_layer layer);

/* Whether the sandbox can take runs now. A template that dies (killed from
 * outside, say) is replaced when the next run needs it, after a backoff;
 * one that fails RESTART times in a row within half a minute puts the
 * sandbox down for half a minute, during which sbx_run refuses at once
 * with SBX_ERR_UNAVAILABLE. */
struct sbx_health {
    bool ready;        /* a template is running */
    unsigned restarts; /* templates started after the first */
    unsigned running;  /* runs in flight */
    unsigned waiting;  /* callers queued for a place */
    char reason[256];  /* when not ready: why, and when it tries again */
    unsigned idle;     /* workers ready and not yet taken */
};
PYSBX_API int sbx_health(struct sbx *sbx, struct sbx_health *out);

/* Stops the template and its workers and deletes every workspace. Runs in
 * flight in other threads end at once, as cancelled ("the sandbox was
 * closed"), and callers waiting for a place are refused; sbx_close returns
 * once they have all returned, so it is safe to call with runs in flight
 * (but not to call sbx_run after it has begun). Bounded: a template that
 * does not exit within two seconds is killed. NULL is accepted. */
PYSBX_API void sbx_close(struct sbx *sbx);

/* The result as the design's JSON object, one line, NUL-terminated;
 * free() it. NULL only when out of memory. */
PYSBX_API char *sbx_result_to_json(const struct sbx_result *res);

PYSBX_API const char *sbx_status_name(enum sbx_status status);   /* "completed", ... */
PYSBX_API const char *sbx_limit_name(enum sbx_limit_kind limit); /* "wall", ... or NULL */
/* "too_deep", ... or NULL for a value that is not one */
PYSBX_API const char *sbx_drop_reason_name(enum sbx_drop_reason reason);
PYSBX_API const char *sbx_error_code_name(enum sbx_error_code code); /* "invalid_limit", ... */

/*
 * Sessions: state across runs, and a failed cell leaves no trace.
 *
 * A session is a process of its own, started from the template like a
 * worker and confined the same way (its own uid, private root, seccomp,
 * Landlock), that holds the interpreter's state between runs ("cells").
 * Each cell runs in a fork of that state, made by the sandbox at the cell's
 * start and by nothing else: if the cell is kept, its process becomes the
 * session's state; if it is rolled back, its process is killed and the
 * session is exactly as it was before the cell, its workspace files
 * included. Between cells the state process is stopped: nothing of it runs.
 * A cell may leave regular files of its workspace open (at most 64, no
 * lock held: a sqlite3 connection, a log) for the cells after it, each of
 * which gets descriptions of its own of them; a rolled-back cell leaves
 * their contents, offsets and flags as the state had them.
 *
 *          struct sbx_session *s;
 *          rc = sbx_session_open(sbx, NULL, &s, &err);
 *          rc = sbx_session_run(s, &req, SBX_ROLLBACK_ON_ERROR, &res, &err);
 *          ... res->cell, res->rolled_back ...
 *          sbx_session_close(s);
 *
 * A session holds two processes (its state, and the next cell, forked
 * ahead and stopped until it runs; for a moment after a cell is kept, also
 * the state it replaced, being torn down) and two workspaces (the cells',
 * and the files as of the last kept cell).
 */

/* Defaults of struct sbx_session_limits and sbx_config.max_sessions. */
#define SBX_DEFAULT_SESSION_IDLE_SECONDS     600.0
#define SBX_DEFAULT_SESSION_LIFETIME_SECONDS 86400.0
#define SBX_DEFAULT_SESSION_MAX_CELLS        100000ULL
#define SBX_DEFAULT_MAX_SESSIONS             64u
#define SBX_MAX_SESSIONS_LIMIT               4096u

struct sbx_session_limits {
    /* No cell for this long: the session ends (session_lost). */
    double idle_seconds;
    /* The session ends this long after it opened, once no cell runs. */
    double lifetime_seconds;
    /* The ceiling of every cell's memory limit: each of the session's
     * processes has at most this much address space, whatever a cell asks
     * (code may raise its own soft limit up to it). 0: the default memory
     * limit of a run. */
    uint64_t memory_bytes;
    /* Cells it may run; the one after the last is refused (session_lost). */
    uint64_t max_cells;
};

/* What a cell that did not end well does to the session. Whatever the
 * choice, a cell whose process is gone (a timeout, the memory limit, a
 * crash, os._exit), that left a thread running or a descriptor a session
 * cannot keep (anything but regular files of its workspace; a lock) cannot
 * become the state and is rolled back. */
enum sbx_rollback {
    /* "on_error" (the default): an uncaught exception or a non-zero
     * sys.exit() rolls back too. */
    SBX_ROLLBACK_ON_ERROR = 0,
    /* "on_stop": as a notebook, an exception keeps what the cell did
     * before it. */
    SBX_ROLLBACK_ON_STOP,
    /* "never": as on_stop, and a cell the sandbox had to stop keeps the
     * files it wrote (its variables cannot be kept: its process is gone). */
    SBX_ROLLBACK_NEVER,
};

struct sbx_session;

PYSBX_API void sbx_session_limits_init(struct sbx_session_limits *limits);

/* Opens a session in |sbx| (|limits| NULL: the defaults). Returns 0 with
 * *out (close it with sbx_session_close, before sbx_close), or a negative
 * errno with |err|: SBX_ERR_BUSY when max_sessions are open,
 * SBX_ERR_INVALID_LIMIT for a bad limit, SBX_ERR_UNAVAILABLE when the
 * sandbox cannot start one. */
PYSBX_API int sbx_session_open(struct sbx *sbx, const struct sbx_session_limits *limits,
                               struct sbx_session **out, struct sbx_error *err);

/* Runs |req| as the session's next cell: as sbx_run (the same checks, the
 * request's limits for this cell, the same result), in a fork of the
 * session's state. The cell's artifacts are the files it created or
 * changed. sys.exit() ends the cell, not the session. Calls on one session
 * are taken one at a time (a second caller waits). Returns 0 with *out, or
 * a negative errno with |err|; -ENOLINK with SBX_ERR_SESSION_LOST when the
 * session is gone: its idle time or lifetime ran out, it ran its cells, its
 * process died, or its sandbox's template was replaced. A lost session
 * stays lost; close it. */
PYSBX_API int sbx_session_run(struct sbx_session *s, const struct sbx_request *req,
                              enum sbx_rollback rollback, struct sbx_result **out,
                              struct sbx_error *err);

/* Ends the session: its processes are killed, its workspaces and uid
 * released. NULL is accepted. */
PYSBX_API void sbx_session_close(struct sbx_session *s);

/* A branch of |from|: a new session (*out; close it as any) that starts as
 * an exact copy of |from|'s state after its last kept cell, variables,
 * imports and files, and from then on is a session of its own: its own
 * uid, workspace, processes and cells (numbered on from |from|'s), nothing
 * writable shared with |from| either way. It has |from|'s limits (its idle
 * time and lifetime count from now) and takes a place among max_sessions.
 * Waits for a cell of |from| in flight. Returns 0, or a negative errno with
 * |err|: SBX_ERR_SESSION_LOST (-ENOLINK) when |from| is lost, SBX_ERR_BUSY
 * when max_sessions are open, SBX_ERR_UNAVAILABLE when the copy could not
 * be made (why says why; |from| goes on as it was). */
PYSBX_API int sbx_session_fork(struct sbx_session *from, struct sbx_session **out,
                               struct sbx_error *err);

/* Writes |s|'s state after its last kept cell (its memory, its files, its
 * cell count and limits) to |fd| as an image, which sbx_session_restore
 * makes a session of again; |s| goes on. The image is what the session's
 * code made, and is not authenticated: keep it where only you can change
 * it (pysbx serve signs its own). It restores in this sandbox, or, with
 * sbx_config.fixed_layout, in a sandbox of this build started later.
 * Returns 0, or a negative errno with |err|: SBX_ERR_SESSION_LOST when |s|
 * is lost, SBX_ERR_UNAVAILABLE when it could not be written (why says
 * why: a descriptor the state holds, a write that failed). */
PYSBX_API int sbx_session_save(struct sbx_session *s, int fd, struct sbx_error *err);

/* A session (*out) that is the state the image on |fd| holds, as a branch
 * is a copy of its origin's: its own uid, workspace and processes, cells
 * numbered on from the image's. |limits| NULL: the image's (its idle time
 * and lifetime counting from now). Reads exactly the image (|fd| is left
 * after it). Returns 0, or a negative errno with |err|: SBX_ERR_BUSY when
 * max_sessions are open; SBX_ERR_SESSION_LOST when the image cannot be
 * restored here (not an image, changed or cut short, or made by a template
 * of another build or layout: why says which). */
PYSBX_API int sbx_session_restore(struct sbx *sbx, const struct sbx_session_limits *limits, int fd,
                                  struct sbx_session **out, struct sbx_error *err);

/* "on_error", "on_stop", "never"; and back (0, or -EINVAL). */
PYSBX_API const char *sbx_rollback_name(enum sbx_rollback rollback);
PYSBX_API int sbx_rollback_from_name(const char *name, enum sbx_rollback *out);

/*
 * Backends: what the front ends (pysbx serve, mcp, batch) run requests on,
 * through one small interface: run a request (blocking; its cancel token
 * cancels it, its on_output callback streams it, the result comes back) and
 * close. A deployment can bind something else (a micro-VM, a remote
 * executor) by filling in the same fields (health may be NULL).
 *
 *   "embedded"  this library's sandbox (sbx_open / sbx_run): the default.
 *   "python3"   a fresh `python3 -I -S` per request, with the same limits and
 *               result contract but none of the confinement layers: a
 *               baseline to compare against and a proof that the seam holds.
 *               Never for untrusted code.
 */
struct sbx_backend {
    const char *name;
    void *self;
    int (*run)(void *self, const struct sbx_request *req, struct sbx_result **out,
               struct sbx_error *err);
    void (*close)(void *self);
    /* Whether it can take runs now (see sbx_health); NULL: always. */
    int (*health)(void *self, struct sbx_health *out);
    /* Sessions, as sbx_session_open / run / close; NULL where the backend
     * has none ("python3"). */
    int (*session_open)(void *self, const struct sbx_session_limits *limits,
                        struct sbx_session **out, struct sbx_error *err);
    int (*session_run)(struct sbx_session *s, const struct sbx_request *req,
                       enum sbx_rollback rollback, struct sbx_result **out, struct sbx_error *err);
    void (*session_close)(struct sbx_session *s);
    /* As sbx_session_fork; NULL where the backend cannot branch. */
    int (*session_fork)(struct sbx_session *from, struct sbx_session **out, struct sbx_error *err);
    /* As sbx_session_save and sbx_session_restore; NULL where it has none. */
    int (*session_save)(struct sbx_session *s, int fd, struct sbx_error *err);
    int (*session_restore)(void *self, const struct sbx_session_limits *limits, int fd,
                           struct sbx_session **out, struct sbx_error *err);
};

/* Opens backend |name| ("embedded" or "python3"; NULL is "embedded") with
 * |cfg| (may be NULL). Returns 0 or a negative errno with |err| set. */
PYSBX_API int sbx_backend_open(const char *name, const struct sbx_config *cfg,
                               struct sbx_backend *out, struct sbx_error *err);

#ifdef __cplusplus
}
#endif

#endif
