/* The command's subcommands. Each returns the process's exit status. */
#ifndef PYSBX_COMMANDS_H
#define PYSBX_COMMANDS_H

#include "pysbx.h"
#include "statedir.h"

#include <stddef.h>
#include <sys/types.h>

/* argv[0] is the subcommand's name. */
int cmd_run(int argc, char **argv);
int cmd_doctor(int argc, char **argv);

/* The front ends over a backend: serve, mcp, batch. */
struct serve_opts {
    struct sbx_backend *backend;
    size_t max_line_bytes;   /* a longer request line is refused, not read */
    unsigned jobs;           /* requests run at once per input stream */
    const char *listen_path; /* a UNIX socket instead of stdin/stdout */
    mode_t socket_mode;
    struct sbx_limits ceilings;      /* the most a request may ask for */
    double grace_seconds;            /* at SIGTERM: how long runs in flight may finish */
    size_t max_pending_bytes;        /* answers a client leaves unread, before it is dropped */
    size_t max_held_bytes;           /* HTTP: answers held for all clients at once */
    const char *http_addr;           /* ADDR:PORT: HTTP instead of JSON lines (http.c) */
    const char *token_file;          /* HTTP: the bearer token clients must send */
    const char *metrics_addr;        /* HTTP: ADDR:PORT serving /metrics alone, no token */
    unsigned max_client_connections; /* HTTP: connections from one address */
    struct sbx_session_limits session_limits; /* each session's idle time and lifetime */
    struct state_dir *state; /* --state-dir: where sessions hibernate (NULL: nowhere) */
    double hibernate_after;  /* idle seconds before a session hibernates (0: never) */
};

int serve_main(const struct serve_opts *o);
int http_main(const struct serve_opts *o);

struct mcp_opts {
    struct sbx_backend *backend;
    struct sbx_limits limits; /* the tool's limits */
    size_t max_line_bytes;
    const char *const *packages; /* the sandbox's, named in the description */
    struct sbx_session_limits session_limits;
    struct state_dir *state; /* --state-dir, or NULL */
    double hibernate_after;  /* --hibernate-after, or 0 */
};

int mcp_main(const struct mcp_opts *o);

struct batch_opts {
    struct sbx_backend *backend;
    struct sbx_limits limits; /* for programs given as files */
    unsigned limits_given;    /* GIVEN_* bits: also the defaults of request lines */
    const char *source;       /* a directory of .py files, or a JSONL file */
    const char *out_path;     /* NULL: stdout */
    unsigned jobs;
    size_t max_line_bytes;
};

int batch_main(const struct batch_opts *o);

#endif
