/*
 * The command's options: one table of every option with the commands that
 * take it, the usage texts, and what the commands share (opening a backend).
 */
#ifndef PYSBX_OPTIONS_H
#define PYSBX_OPTIONS_H

#include "pysbx.h"

#include <stdbool.h>
#include <stddef.h>

/* Exit statuses of the command. */
#define EXIT_USAGE   2
#define EXIT_TIMEOUT 124
#define EXIT_MEMORY  125
#define EXIT_SANDBOX 70
#define EXIT_SIGNAL  128 /* + the signal number */

/* Bits of opts.limits_given, in the order of struct sbx_limits. */
enum {
    GIVEN_WALL,
    GIVEN_CPU,
    GIVEN_MEMORY,
    GIVEN_OUTPUT,
    GIVEN_ARTIFACT_BYTES,
    GIVEN_ARTIFACTS,
    GIVEN_ARTIFACTS_TOTAL,
    GIVEN_COUNT
};

enum cmd { CMD_RUN = 1, CMD_SERVE = 2, CMD_MCP = 4, CMD_BATCH = 8, CMD_DOCTOR = 16 };

struct opts {
    enum cmd cmd;
    bool json;
    bool policy_debug;
    unsigned required;
    const char *template_path;
    const char *backend;
    const char *listen;
    unsigned socket_mode;
    const char *out;
    const char *artifacts_dir;
    const char *target;      /* run: the script; batch: the source */
    const char *const *args; /* run: the script's arguments (in argv) */
    size_t n_args;
    const char *stdin_path; /* run --stdin: a file, or - */
    unsigned jobs;
    size_t max_line;
    struct sbx_file *files;
    size_t n_files;
    struct sbx_limits limits;
    unsigned limits_given;      /* bits GIVEN_*: the limits the command line set */
    const char *connect;        /* run: a server's socket */
    struct sbx_limits ceilings; /* serve: the most a request may ask */
    double grace;               /* serve: seconds to drain at SIGTERM */
    size_t max_pending;         /* serve: unsent answer bytes per client */
    size_t max_held;            /* serve --http: unsent answer bytes in all */
    const char *http;           /* serve: ADDR:PORT */
    const char *token_file;     /* serve --http: the bearer token */
    const char *metrics_http;   /* serve --http: a /metrics-only listener */
    char **packages;            /* --packages, NULL-terminated, or NULL */
    char **module_dirs;         /* --module-dir, absolute, NULL-terminated, or NULL */
    size_t n_module_dirs;
    uint64_t workspace_bytes;        /* --workspace-size (0: the library's default) */
    unsigned max_sessions;           /* serve, mcp: sessions open at once (0: the library's) */
    double session_idle;             /* serve, mcp: --session-idle (0: the library's) */
    double session_lifetime;         /* serve, mcp: --session-lifetime (0: the library's) */
    unsigned max_client_connections; /* serve --http: from one address (0: the default) */
    const char *state_dir;           /* serve: where sessions hibernate (NULL: nowhere) */
    double hibernate_after;   /* serve: idle seconds before a session hibernates (0: never) */
    uint64_t state_max_bytes; /* serve: the images' bytes together */
    bool given_state_max;
};

/* serve --state-max-bytes, when not given. */
#define DEFAULT_STATE_MAX_BYTES (4ULL << 30)

/* "run", "serve", ... */
const char *cmd_name(enum cmd c);

/* Prints "pysbx: <message>" and where to find help; returns EXIT_USAGE. */
int usage_error(enum cmd c, const char *format, ...) __attribute__((format(printf, 2, 3)));
/* Says why sbx_open failed and returns the exit status: EXIT_USAGE for what
 * the caller asked (an unknown package), EXIT_SANDBOX otherwise. */
int open_error(enum cmd c, const struct sbx_error *err);

/* The top-level usage text. */
extern const char main_usage[];

/* Parses the options of |cmd| (argv[0] is the command's name). Returns 0,
 * or the exit status to end with (after --help, or a usage error). Free
 * with opts_free either way. */
int parse_opts(enum cmd cmd, int argc, char **argv, struct opts *o);
void opts_free(struct opts *o);

/* Reads a whole file (or stdin for "-"), refusing more than |max| bytes.
 * Returns 0 with *data (free it) and *len, or -errno (-EFBIG: too large). */
int slurp(const char *path, uint64_t max, char **data, size_t *len);

/* Fills |cfg| from the options: the template helper beside this program,
 * required layers, pool size for the command. */
void opts_config(const struct opts *o, struct sbx_config *cfg, char *tmpl, size_t tmpl_cap);

/* Opens the backend the options name. Returns 0 or -errno with |err|. */
int open_backend(const struct opts *o, struct sbx_backend *b, struct sbx_error *err);

#endif
