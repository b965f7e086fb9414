#define _GNU_SOURCE
#include "options.h"

#include "reqjson.h"
#include "statedir.h"
#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A longer request line is refused, not read into memory. */
#define DEFAULT_MAX_LINE (64u << 20)
/* serve: how long runs in flight may finish after SIGTERM, and how many
 * bytes of answers a client may leave unread before it is dropped. */
#define DEFAULT_GRACE_SECONDS 10.0
#define DEFAULT_MAX_PENDING   (64u << 20)
#define DEFAULT_MAX_HELD      (256u << 20)
#define MIN_MAX_PENDING       4096u

static const char limits_help[] =
    "  --wall SECONDS          wall-clock limit (default 10)\n"
    "  --cpu SECONDS           CPU-time limit, all threads (default 5)\n"
    "  --memory SIZE           address-space limit: bytes, or with K, M, G, T\n"
    "                          (powers of 1024), e.g. 256M (default 256M)\n"
    "  --max-output CHARS      characters kept of stdout and of stderr each\n"
    "                          (default 100000)\n"
    "  --max-artifact-bytes N  bytes returned of each file (default 4194304)\n"
    "  --max-artifacts N       files returned, the first by name (default 32)\n"
    "  --max-artifacts-total-bytes N\n"
    "                          bytes returned of all files together; a file past it\n"
    "                          is counted in artifacts_dropped (default 16777216)\n";

static const char sandbox_help[] =
    "  --require LAYER,...     refuse to run unless these layers are active; 'default'\n"
    "                          (the default): seccomp, the file system confined by\n"
    "                          landlock or a private root, and uidrun when root;\n"
    "                          'none' runs with whatever the machine has; layers:\n"
    "                          seccomp, landlock, netns, mountns, ipcns, utsns, user,\n"
    "                          rlimits, caps, root, uidrun (see pysbx doctor)\n"
    "  --template PATH         the pysbx-template helper to use\n"
    "  --packages NAME,...     make these installed Python distributions importable\n"
    "                          (Debian's python3-NAME: numpy, pandas, matplotlib),\n"
    "                          with what they depend on and nothing else; imported\n"
    "                          before any run; open matplotlib figures come back\n"
    "                          as figure-N.png\n"
    "  --module-dir DIR        make the modules of DIR importable (read-only, on\n"
    "                          sys.path after the standard library); repeatable\n"
    "  --workspace-size SIZE   each run's workspace: its input files and what it\n"
    "                          writes, e.g. 512M (default 128M)\n";

static const char backend_help[] =
    "  --backend NAME          embedded (the sandbox, default) or python3 (a fresh\n"
    "                          python3 -I -S per run with the same limits and result,\n"
    "                          but no confinement: a baseline, never for untrusted code)\n";

static const char run_usage_head[] =
    "usage: pysbx run [options] FILE|- [ARG...]\n"
    "\n"
    "Runs the Python script FILE (or standard input, for -) in a fresh sandboxed\n"
    "worker, with the ARGs as its sys.argv[1:] (after -- when one starts with -).\n"
    "By default prints the code's stdout and stderr as they were and exits\n"
    "with its exit status; when a limit stops it, prints one line saying which and\n"
    "exits 124 (time), 125 (memory), 128+N (killed by signal N) or 70 (the sandbox\n"
    "failed).\n"
    "\n"
    "options:\n"
    "  --json                  print the result object (status, stdout, stderr,\n"
    "                          artifacts, stats) as one JSON line; exit 0 when a\n"
    "                          result was printed\n";

static const char run_usage_tail[] =
    "  --file NAME=PATH        put the file PATH in the workspace as NAME before the\n"
    "                          code runs (repeatable); NAME is relative, may hold '/',\n"
    "                          never '..'\n"
    "  --artifacts-dir DIR     write the files the code left in its workspace to DIR\n"
    "                          (made if missing)\n"
    "  --stdin FILE            the program's standard input: FILE, or - for this\n"
    "                          command's own (read whole before the program starts);\n"
    "                          without it the program's stdin is empty\n"
    "  --connect SOCKET        send the program to a running `pysbx serve --listen\n"
    "                          SOCKET` instead of starting a sandbox (so do the\n"
    "                          environment variable PYSBX_CONNECT); the same output\n"
    "                          and exit status; the server's defaults and ceilings\n"
    "                          hold for the limits not given here\n"
    "  --policy-debug          name refused system calls on stderr and let them fail\n"
    "                          with EPERM instead of applying the policy's kills:\n"
    "                          for finding what code needs, never for production\n"
    "  -h, --help              this text\n";

/* serve and mcp. */
static const char sessions_help[] =
    "  --max-sessions N        sessions open at once, in all (default 64, at most 4096);\n"
    "                          one more is refused with sandbox_busy\n"
    "  --session-idle SECONDS  a session with no cell for this long ends (default 600)\n"
    "  --session-lifetime SECONDS\n"
    "                          a session ends this long after it opened (default 86400)\n";

static const char serve_usage[] =
    "usage: pysbx serve [--listen PATH | --http ADDR:PORT] [options]\n"
    "\n"
    "Answers JSON lines: one request per line on standard input (or on each\n"
    "connection to the UNIX socket PATH), one answer per line on standard output\n"
    "(or the same connection), as each run finishes, in any order, each exactly\n"
    "once. A request:\n"
    "  {\"id\": any, \"code\": \"...\", \"files\": {\"name\": \"text\"},\n"
    "   \"files_base64\": {\"name\": \"base64\"}, \"limits\": {\"wall_seconds\": 2,\n"
    "   \"cpu_seconds\": 1, \"memory_bytes\": 268435456, \"max_output_chars\": 1000,\n"
    "   \"max_artifact_bytes\": 65536, \"max_artifacts\": 8}}\n"
    "An answer: the result object of pysbx run --json with the request's id, or\n"
    "  {\"id\": ..., \"error\": {\"code\": \"...\", \"message\": \"...\"}}.\n"
    "Only those fields: any other is refused (invalid_request). The id comes back\n"
    "exactly as written. {\"cancel\": ID} cancels the requests in flight on the\n"
    "same stream whose id is written ID (each then answers status \"cancelled\");\n"
    "if there is none it is answered {\"id\": null, \"cancel\": ID, \"error\": ...}.\n"
    "At the end of input, finishes and answers what is in flight, and exits 0.\n"
    "A request with \"session\": \"NAME\" runs as the next cell of that session of\n"
    "the stream (made on first use): variables, imports and files carry over, and\n"
    "\"rollback\" (\"on_error\", the default; \"on_stop\"; \"never\") says what a cell\n"
    "that fails does to it; the answer adds \"session\": {\"name\", \"cell\",\n"
    "\"rolled_back\"}. {\"id\": ..., \"session_close\": \"NAME\"} closes one; the end of\n"
    "the stream closes them all. {\"id\": ..., \"session_fork\": {\"from\": \"A\", \"to\":\n"
    "\"B\"}} makes B a copy of session A's state (after the cells of A read before\n"
    "it), then a session of its own, answered {\"id\": ..., \"session_forked\": {\"from\",\n"
    "\"to\", \"cell\"}}. \"cell\": N, when given, is the number the cell\n"
    "expects to be: 1 starts the session afresh, another that is not its next is\n"
    "answered session_lost. Over --http a session is the token's, by the name in\n"
    "the path (POST /v1/sessions/NAME/run, POST /v1/sessions/NAME/fork,\n"
    "DELETE /v1/sessions/NAME).\n"
    "With --listen, runs until SIGINT or SIGTERM; a client that hangs up has its\n"
    "runs cancelled. On SIGINT or SIGTERM: reads no more, lets what is in flight\n"
    "finish for --grace seconds, cancels and answers the rest, removes the socket\n"
    "and exits 0; a second signal exits at once with status 1.\n"
    "\n"
    "options:\n"
    "  --listen PATH           serve on a UNIX socket (mode 0600) instead\n"
    "  --socket-mode MODE      permissions of that socket, octal (default 600)\n"
    "  --http ADDR:PORT        serve HTTP instead: POST /v1/run (a request object in,\n"
    "                          its answer out), POST /v1/sessions/NAME/run,\n"
    "                          GET /v1/sessions, GET /healthz, GET /metrics\n"
    "                          (Prometheus); e.g. 127.0.0.1:8080, [::1]:8080 or\n"
    "                          localhost:8080 (a name: its first address)\n"
    "  --http-token-file FILE  clients must send Authorization: Bearer <a token of\n"
    "                          the file> (all but /healthz): a token a line, each\n"
    "                          a tenant with sessions of its own; required unless\n"
    "                          ADDR is loopback\n"
    "  --metrics-http ADDR:PORT\n"
    "                          also serve GET /metrics, and nothing else, on ADDR:PORT\n"
    "                          without the token (counts only: for a scraper)\n"
    "  --max-client-connections N\n"
    "                          HTTP connections open at once from one address\n"
    "                          (default 128; behind a load balancer, what it may\n"
    "                          open)\n"
    "  --jobs N                requests run at once per input stream (default: two\n"
    "                          per core)\n"
    "  --max-line-bytes N      a longer request line (HTTP: body) is refused, not read\n"
    "                          into memory (default 67108864)\n"
    "  --max-pending-bytes N   answers a client has not read, in bytes, past which it\n"
    "                          is disconnected and its runs cancelled (default 64M;\n"
    "                          one answer alone may exceed it); on standard output,\n"
    "                          the server waits instead; over HTTP, per tenant\n"
    "  --max-held-bytes N      HTTP: answers held for all clients at once, in bytes,\n"
    "                          past which an answer is not kept and its connection\n"
    "                          is cut (default 256M)\n"
    "  --grace SECONDS         at SIGINT or SIGTERM, how long runs in flight may still\n"
    "                          finish before they are cancelled (default 10; 0: at once)\n"
    "  --state-dir DIR         sessions may hibernate: their state is written to DIR\n"
    "                          (made 0700; a key of the server's signs each image) and\n"
    "                          their processes end, on request ({\"id\": ...,\n"
    "                          \"session_hibernate\": NAME}; over --http POST\n"
    "                          /v1/sessions/NAME/hibernate), after --hibernate-after,\n"
    "                          and at shutdown; the next cell restores it, also in a\n"
    "                          server started later with the same DIR and build. The\n"
    "                          template's address layout is then fixed (no ASLR) for\n"
    "                          this build on this machine. JSON lines: session names\n"
    "                          are the server's, no longer each connection's\n"
    "  --hibernate-after SECONDS\n"
    "                          with --state-dir, a session with no cell for this long\n"
    "                          hibernates (below --session-idle; default: never)\n"
    "  --state-max-bytes SIZE  with --state-dir, the images' bytes together, past\n"
    "                          which the oldest are dropped (their next cell is told\n"
    "                          so: session_lost) (default 4G, at least 16M)\n";

static const char serve_ceilings_help[] =
    "\n"
    "ceilings: a request asking more is refused (invalid_limit), and a default above\n"
    "one is lowered to it (default: the library's ranges):\n"
    "  --max-wall SECONDS      wall_seconds\n"
    "  --max-cpu SECONDS       cpu_seconds\n"
    "  --max-memory SIZE       memory_bytes (bytes, or with K, M, G, T)\n"
    "  --max-output CHARS      max_output_chars\n"
    "  --max-artifact-bytes N  max_artifact_bytes\n"
    "  --max-artifacts N       max_artifacts\n"
    "  --max-artifacts-total-bytes N\n"
    "                          max_artifacts_total_bytes\n";

static const char mcp_usage[] =
    "usage: pysbx mcp [options]\n"
    "\n"
    "A Model Context Protocol server over stdio offering two tools: run_python\n"
    "(code, and optional files: name -> text, or -> {\"content\": BASE64,\n"
    "\"encoding\": \"base64\"}, stdin, argv, session_id, rollback; nothing else)\n"
    "and reset_session. run_python's result shows the exit status, stdout, stderr\n"
    "and each file the code wrote (PNG, JPEG, GIF and WebP images, known by their\n"
    "bytes, as images); when a limit stops the code it is an error result that says\n"
    "sandbox_limit_exceeded and which limit. A call cancelled by the client is not\n"
    "answered. The limits below are the tool's: the model cannot raise them.\n"
    "With session_id, run_python runs the code as the next cell of that session\n"
    "(made on first use; variables, imports and files carry over; rollback:\n"
    "on_error, the default, on_stop or never); reset_session closes one.\n"
    "\n"
    "options:\n"
    "  --jobs N                calls run at once (default: two per core)\n"
    "  --state-dir DIR         the sessions outlive this process: at the end of input\n"
    "                          (or SIGINT, SIGTERM, SIGHUP) each open session's state\n"
    "                          is written to DIR (made 0700; a key of its own signs\n"
    "                          each image) and its processes end; the next run_python\n"
    "                          with its session_id, here or in a pysbx mcp started\n"
    "                          later with the same DIR and build, restores it. One\n"
    "                          pysbx mcp uses DIR at a time (another is refused). The\n"
    "                          template's address layout is then fixed (no ASLR) for\n"
    "                          this build on this machine\n"
    "  --hibernate-after SECONDS\n"
    "                          with --state-dir, a session with no cell for this long\n"
    "                          hibernates (below --session-idle; default: never)\n"
    "  --state-max-bytes SIZE  with --state-dir, the images' bytes together, past\n"
    "                          which the oldest are dropped (their next call is told\n"
    "                          so: session_lost) (default 4G, at least 16M)\n";

static const char batch_usage[] =
    "usage: pysbx batch DIR|FILE.jsonl [options]\n"
    "\n"
    "Runs many programs, --jobs at a time: every .py file of DIR (in name order,\n"
    "with the limits below), or every request line of FILE.jsonl (the form pysbx\n"
    "serve reads; the limits below given on the command line are its defaults, a\n"
    "line's own win). Writes one JSON result line per program, with \"program\"\n"
    "(the file name, or \"line N\"), as each finishes; shows a progress bar (with\n"
    "an ETA) on stderr when that is a terminal and the result lines are not\n"
    "written to one; ends with a summary on stderr (counts by status, p50 and p99\n"
    "latency by the nearest-rank method, total time). Exits 0 when every program\n"
    "was run, 1 when the sandbox failed or refused some, 2 on bad usage.\n"
    "\n"
    "options:\n"
    "  --jobs N                programs run at once (default: two per core)\n"
    "  --out FILE              write the result lines to FILE instead of stdout\n";

const char main_usage[] =
    "usage: pysbx COMMAND [options]\n"
    "\n"
    "commands:\n"
    "  run [options] FILE|-   run a Python script in the sandbox\n"
    "  serve [options]        answer JSON-lines requests (stdin/stdout or a UNIX socket)\n"
    "  mcp [options]          a Model Context Protocol server with a run_python tool\n"
    "  batch DIR|FILE.jsonl   run many programs, N at a time, with a summary\n"
    "  doctor [--json] [--require LAYER,...]\n"
    "                         say which layers of confinement are active here, and why\n"
    "                         not where they are not\n"
    "  version                print the version\n"
    "\n"
    "pysbx COMMAND --help documents each. pysbx runs untrusted Python in a forked,\n"
    "embedded CPython: no network, no host environment or files, bounded time,\n"
    "memory and output.\n";

const char *cmd_name(enum cmd c)
{
    static const char *const names[] = {"run", "serve", "mcp", "batch", "doctor"};
    unsigned i = c ? (unsigned)__builtin_ctz((unsigned)c) : ARRAY_SIZE(names);

    return i < ARRAY_SIZE(names) ? names[i] : "?";
}

int usage_error(enum cmd c, const char *format, ...)
{
    va_list ap;

    fputs("pysbx: ", stderr);
    va_start(ap, format);
    vfprintf(stderr, format, ap);
    va_end(ap);
    fprintf(stderr, "\n(see pysbx %s --help)\n", cmd_name(c));
    return EXIT_USAGE;
}

int open_error(enum cmd c, const struct sbx_error *err)
{
    if (err->code == SBX_ERR_INVALID_REQUEST)
        return usage_error(c, "%s", err->message);
    fprintf(stderr, "pysbx %s: cannot start the sandbox: %s\n", cmd_name(c), err->message);
    return EXIT_SANDBOX;
}

static void print_usage(enum cmd c)
{
    switch (c) {
    case CMD_RUN:
        printf("%s%s%s%s", run_usage_head, limits_help, sandbox_help, run_usage_tail);
        break;
    case CMD_SERVE:
        printf("%s%s%s%s  -h, --help              this text\n%s", serve_usage, sessions_help,
               backend_help, sandbox_help, serve_ceilings_help);
        break;
    case CMD_MCP:
        printf("%s%s%s%s%s  -h, --help              this text\n", mcp_usage, limits_help,
               sessions_help, backend_help, sandbox_help);
        break;
    case CMD_BATCH:
        printf("%s%s%s%s  -h, --help              this text\n", batch_usage, limits_help,
               backend_help, sandbox_help);
        break;
    case CMD_DOCTOR:
        printf("usage: pysbx doctor [options]\n"
               "\n"
               "Starts a sandbox as `pysbx run` would and says which layers are active;\n"
               "with --packages, also what a run can import, with versions.\n"
               "Exits 1 when a required layer (default: seccomp, file-system confinement by\n"
               "landlock or a private root, and uidrun when root) is not.\n"
               "\n"
               "options:\n"
               "  --json                  print the layers as one JSON object\n"
               "%s  -h, --help              this text\n",
               sandbox_help);
        break;
    }
}

/* Reads a whole file (or stdin for "-"), refusing more than |max| bytes. */
int slurp(const char *path, uint64_t max, char **data, size_t *len)
{
    int fd = strcmp(path, "-") == 0 ? dup(0) : open(path, O_RDONLY | O_CLOEXEC);
    size_t cap = 65536, n = 0;
    char *buf = NULL;
    int rc = 0;

    if (fd < 0)
        return -errno;
    buf = malloc(cap);
    if (!buf) {
        rc = -ENOMEM;
        goto out;
    }
    for (;;) {
        if (n == cap) {
            if (cap > max) {
                rc = -EFBIG;
                goto out;
            }
            char *b = realloc(buf, cap * 2);
            if (!b) {
                rc = -ENOMEM;
                goto out;
            }
            buf = b;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            goto out;
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n > max) {
            rc = -EFBIG;
            goto out;
        }
    }
    *data = buf;
    *len = n;
    buf = NULL;
out:
    free(buf);
    close(fd);
    return rc;
}

static int add_file(struct opts *o, const char *spec)
{
    const char *eq = strchr(spec, '=');
    char *name, *data = NULL;
    size_t len = 0;
    const char *why;
    int rc;

    if (!eq || eq == spec || !eq[1])
        return usage_error(o->cmd, "--file wants NAME=PATH, not '%s'", spec);
    name = strndup(spec, (size_t)(eq - spec));
    if (!name)
        return usage_error(o->cmd, "out of memory");
    why = name_problem(name, strlen(name));
    if (why) {
        rc = usage_error(o->cmd, "--file %s: %s", name, why);
        free(name);
        return rc;
    }
    rc = slurp(eq + 1, SBX_MAX_REQUEST_BYTES, &data, &len);
    if (rc < 0) {
        int e = usage_error(o->cmd, "--file %s: %s: %s", name, eq + 1,
                            rc == -EFBIG ? "file too large" : strerror(-rc));
        free(name);
        return e;
    }
    struct sbx_file *f = realloc(o->files, (o->n_files + 1) * sizeof(*f));
    if (!f) {
        free(name);
        free(data);
        return usage_error(o->cmd, "out of memory");
    }
    o->files = f;
    o->files[o->n_files++] = (struct sbx_file){.name = name, .data = data, .len = len};
    return 0;
}

static void free_packages(struct opts *o)
{
    for (size_t i = 0; o->packages && o->packages[i]; i++)
        free(o->packages[i]);
    free(o->packages);
    o->packages = NULL;
}

/* "seccomp,landlock" or "none". */
static int parse_layers(const char *text, unsigned *out)
{
    char buf[256];
    unsigned set = 0;

    if (strcmp(text, "none") == 0) {
        *out = 0;
        return 0;
    }
    if (strcmp(text, "default") == 0) {
        *out = SBX_LAYERS_DEFAULT;
        return 0;
    }
    if (strlen(text) >= sizeof(buf))
        return -EINVAL;
    strcpy(buf, text);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        enum sbx_layer l = sbx_layer_from_name(tok);
        if (!l)
            return -EINVAL;
        set |= l;
    }
    if (!set)
        return -EINVAL;
    *out = set;
    return 0;
}

/* "numpy,pandas": the list, replacing an earlier one. */
static int parse_packages(const char *text, struct opts *o)
{
    size_t n = 1;
    char *copy = strdup(text);

    for (const char *p = text; *p; p++)
        n += *p == ',';
    free_packages(o);
    o->packages = copy ? calloc(n + 1, sizeof(char *)) : NULL;
    n = 0;
    for (char *save = NULL, *tok = o->packages ? strtok_r(copy, ",", &save) : NULL; tok;
         tok = strtok_r(NULL, ",", &save))
        if (!(o->packages[n++] = strdup(tok)))
            break;
    free(copy);
    if (!o->packages || !n || !o->packages[n - 1]) {
        free_packages(o);
        return -EINVAL;
    }
    return 0;
}

enum {
    O_JSON = 256,
    O_WALL,
    O_CPU,
    O_MEM,
    O_OUT,
    O_ABYTES,
    O_ARTS,
    O_ATOTAL,
    O_FILE,
    O_DIR,
    O_STDIN,
    O_TMPL,
    O_REQUIRE,
    O_DEBUG,
    O_BACKEND,
    O_LISTEN,
    O_MODE,
    O_JOBS,
    O_LINE,
    O_OUTFILE,
    O_GRACE,
    O_PENDING,
    O_HELD,
    O_MAXWALL,
    O_MAXCPU,
    O_MAXMEM,
    O_CONNECT,
    O_HTTP,
    O_TOKEN,
    O_METRICS,
    O_PACKAGES,
    O_MODDIR,
    O_WSSIZE,
    O_SESSIONS,
    O_SIDLE,
    O_SLIFE,
    O_CLIENTCONNS,
    O_STATEDIR,
    O_HIBERNATE,
    O_STATEMAX,
};

#define LIMITS  (CMD_RUN | CMD_MCP | CMD_BATCH)
#define SANDBOX (CMD_RUN | CMD_SERVE | CMD_MCP | CMD_BATCH | CMD_DOCTOR)
#define FRONTS  (CMD_SERVE | CMD_MCP | CMD_BATCH)

static const struct {
    struct option opt;
    unsigned cmds;
} options[] = {
    {{"json", no_argument, NULL, O_JSON}, CMD_RUN | CMD_DOCTOR},
    {{"wall", required_argument, NULL, O_WALL}, LIMITS},
    {{"cpu", required_argument, NULL, O_CPU}, LIMITS},
    {{"memory", required_argument, NULL, O_MEM}, LIMITS},
    /* For serve, these three are ceilings (the limits are the requests'). */
    {{"max-output", required_argument, NULL, O_OUT}, LIMITS | CMD_SERVE},
    {{"max-artifact-bytes", required_argument, NULL, O_ABYTES}, LIMITS | CMD_SERVE},
    {{"max-artifacts", required_argument, NULL, O_ARTS}, LIMITS | CMD_SERVE},
    {{"max-artifacts-total-bytes", required_argument, NULL, O_ATOTAL}, LIMITS | CMD_SERVE},
    {{"max-wall", required_argument, NULL, O_MAXWALL}, CMD_SERVE},
    {{"max-cpu", required_argument, NULL, O_MAXCPU}, CMD_SERVE},
    {{"max-memory", required_argument, NULL, O_MAXMEM}, CMD_SERVE},
    {{"grace", required_argument, NULL, O_GRACE}, CMD_SERVE},
    {{"max-pending-bytes", required_argument, NULL, O_PENDING}, CMD_SERVE},
    {{"max-held-bytes", required_argument, NULL, O_HELD}, CMD_SERVE},
    {{"file", required_argument, NULL, O_FILE}, CMD_RUN},
    {{"artifacts-dir", required_argument, NULL, O_DIR}, CMD_RUN},
    {{"stdin", required_argument, NULL, O_STDIN}, CMD_RUN},
    {{"connect", required_argument, NULL, O_CONNECT}, CMD_RUN},
    {{"template", required_argument, NULL, O_TMPL}, SANDBOX},
    {{"require", required_argument, NULL, O_REQUIRE}, SANDBOX},
    {{"packages", required_argument, NULL, O_PACKAGES}, SANDBOX},
    {{"module-dir", required_argument, NULL, O_MODDIR}, SANDBOX},
    {{"workspace-size", required_argument, NULL, O_WSSIZE}, SANDBOX},
    {{"policy-debug", no_argument, NULL, O_DEBUG}, CMD_RUN},
    {{"backend", required_argument, NULL, O_BACKEND}, FRONTS},
    {{"listen", required_argument, NULL, O_LISTEN}, CMD_SERVE},
    {{"http", required_argument, NULL, O_HTTP}, CMD_SERVE},
    {{"http-token-file", required_argument, NULL, O_TOKEN}, CMD_SERVE},
    {{"metrics-http", required_argument, NULL, O_METRICS}, CMD_SERVE},
    {{"socket-mode", required_argument, NULL, O_MODE}, CMD_SERVE},
    {{"jobs", required_argument, NULL, O_JOBS}, CMD_SERVE | CMD_MCP | CMD_BATCH},
    {{"max-line-bytes", required_argument, NULL, O_LINE}, FRONTS},
    {{"max-sessions", required_argument, NULL, O_SESSIONS}, CMD_SERVE | CMD_MCP},
    {{"session-idle", required_argument, NULL, O_SIDLE}, CMD_SERVE | CMD_MCP},
    {{"session-lifetime", required_argument, NULL, O_SLIFE}, CMD_SERVE | CMD_MCP},
    {{"max-client-connections", required_argument, NULL, O_CLIENTCONNS}, CMD_SERVE},
    {{"state-dir", required_argument, NULL, O_STATEDIR}, CMD_SERVE | CMD_MCP},
    {{"hibernate-after", required_argument, NULL, O_HIBERNATE}, CMD_SERVE | CMD_MCP},
    {{"state-max-bytes", required_argument, NULL, O_STATEMAX}, CMD_SERVE | CMD_MCP},
    {{"out", required_argument, NULL, O_OUTFILE}, CMD_BATCH},
    {{"help", no_argument, NULL, 'h'}, SANDBOX},
};

static const char *option_name(int val)
{
    for (size_t i = 0; i < ARRAY_SIZE(options); i++)
        if (options[i].opt.val == val)
            return options[i].opt.name;
    return "?";
}

int parse_opts(enum cmd cmd, int argc, char **argv, struct opts *o)
{
    struct option longopts[ARRAY_SIZE(options) + 1];
    uint64_t n;
    int c, rc;

    for (size_t i = 0; i < ARRAY_SIZE(options); i++)
        longopts[i] = options[i].opt;
    memset(&longopts[ARRAY_SIZE(options)], 0, sizeof(struct option));
    memset(o, 0, sizeof(*o));
    o->cmd = cmd;
    sbx_limits_init(&o->limits);
    json_ceilings_init(&o->ceilings);
    o->grace = DEFAULT_GRACE_SECONDS;
    o->max_pending = DEFAULT_MAX_PENDING;
    o->max_held = DEFAULT_MAX_HELD;
    o->required = SBX_LAYERS_DEFAULT;
    o->max_line = DEFAULT_MAX_LINE;
    o->socket_mode = 0600;
    o->state_max_bytes = DEFAULT_STATE_MAX_BYTES;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        for (size_t i = 0; c != ':' && c != '?' && i < ARRAY_SIZE(options); i++)
            if (options[i].opt.val == c && !(options[i].cmds & cmd))
                return usage_error(cmd, "%s does not take --%s", cmd_name(cmd),
                                   options[i].opt.name);
        switch (c) {
        case 'h':
            print_usage(cmd);
            return -1; /* done: exit 0 */
        case O_JSON:
            o->json = true;
            break;
        case O_CONNECT:
            o->connect = optarg;
            break;
        case O_WALL:
        case O_CPU:
        case O_MAXWALL:
        case O_MAXCPU:
            if (parse_seconds(optarg, c == O_WALL      ? &o->limits.wall_seconds
                                      : c == O_CPU     ? &o->limits.cpu_seconds
                                      : c == O_MAXWALL ? &o->ceilings.wall_seconds
                                                       : &o->ceilings.cpu_seconds) < 0)
                return usage_error(cmd, "--%s wants a number of seconds above 0, not '%s'",
                                   option_name(c), optarg);
            if (c == O_WALL || c == O_CPU)
                o->limits_given |= 1u << (c == O_WALL ? GIVEN_WALL : GIVEN_CPU);
            break;
        case O_MEM:
        case O_MAXMEM:
            if (parse_size(optarg,
                           c == O_MEM ? &o->limits.memory_bytes : &o->ceilings.memory_bytes) < 0)
                return usage_error(cmd,
                                   "--memory wants a size such as 256M, 1G or 268435456, "
                                   "not '%s'",
                                   optarg);
            if (c == O_MEM)
                o->limits_given |= 1u << GIVEN_MEMORY;
            break;
        case O_OUT:
        case O_ABYTES:
        case O_ARTS:
        case O_ATOTAL: {
            struct sbx_limits *l = cmd == CMD_SERVE ? &o->ceilings : &o->limits;
            if (parse_u64(optarg, c == O_OUT      ? &l->max_output_chars
                                  : c == O_ABYTES ? &l->max_artifact_bytes
                                  : c == O_ARTS   ? &l->max_artifacts
                                                  : &l->max_artifacts_total_bytes) < 0)
                return usage_error(cmd, "--%s wants a whole number, not '%s'", option_name(c),
                                   optarg);
            o->limits_given |= 1u << (c == O_OUT      ? GIVEN_OUTPUT
                                      : c == O_ABYTES ? GIVEN_ARTIFACT_BYTES
                                      : c == O_ARTS   ? GIVEN_ARTIFACTS
                                                      : GIVEN_ARTIFACTS_TOTAL);
            break;
        }
        case O_GRACE:
            if (strcmp(optarg, "0") != 0 &&
                (parse_seconds(optarg, &o->grace) < 0 || o->grace > SBX_MAX_SECONDS))
                return usage_error(cmd, "--grace wants a number of seconds from 0 to 86400");
            if (strcmp(optarg, "0") == 0)
                o->grace = 0;
            break;
        case O_PENDING:
        case O_HELD:
            if (parse_size(optarg, &n) < 0 || n < MIN_MAX_PENDING || n > SIZE_MAX / 2)
                return usage_error(cmd, "--%s wants a size of at least %u, not '%s'",
                                   c == O_HELD ? "max-held-bytes" : "max-pending-bytes",
                                   MIN_MAX_PENDING, optarg);
            *(c == O_HELD ? &o->max_held : &o->max_pending) = (size_t)n;
            break;
        case O_FILE:
            if ((rc = add_file(o, optarg)) != 0)
                return rc;
            break;
        case O_DIR:
            o->artifacts_dir = optarg;
            break;
        case O_STDIN:
            o->stdin_path = optarg;
            break;
        case O_TMPL:
            o->template_path = optarg;
            break;
        case O_REQUIRE:
            if (parse_layers(optarg, &o->required) < 0)
                return usage_error(cmd,
                                   "--require wants layer names separated by commas (or "
                                   "'none'), not '%s'",
                                   optarg);
            break;
        case O_DEBUG:
            o->policy_debug = true;
            break;
        case O_PACKAGES:
            if (parse_packages(optarg, o) < 0)
                return usage_error(cmd, "--packages wants names separated by commas, not '%s'",
                                   optarg);
            break;
        case O_MODDIR: {
            char abs[PATH_MAX];
            struct stat st;
            char **v = NULL;
            if (!realpath(optarg, abs) || stat(abs, &st) < 0)
                return usage_error(cmd, "--module-dir %s: %s", optarg, strerror(errno));
            if (!S_ISDIR(st.st_mode))
                return usage_error(cmd, "--module-dir %s: not a directory", optarg);
            v = realloc(o->module_dirs, (o->n_module_dirs + 2) * sizeof(char *));
            if (!v)
                return usage_error(cmd, "out of memory");
            o->module_dirs = v;
            if (!(v[o->n_module_dirs] = strdup(abs)))
                return usage_error(cmd, "out of memory");
            v[++o->n_module_dirs] = NULL;
            break;
        }
        case O_WSSIZE:
            if (parse_size(optarg, &o->workspace_bytes) < 0 ||
                o->workspace_bytes < SBX_MIN_WORKSPACE_BYTES)
                return usage_error(cmd,
                                   "--workspace-size wants a size of at least 1M, such as "
                                   "512M, not '%s'",
                                   optarg);
            break;
        case O_BACKEND:
            if (strcmp(optarg, "embedded") != 0 && strcmp(optarg, "python3") != 0)
                return usage_error(cmd, "--backend is embedded or python3, not '%s'", optarg);
            o->backend = optarg;
            break;
        case O_LISTEN:
            o->listen = optarg;
            break;
        case O_HTTP:
            o->http = optarg;
            break;
        case O_TOKEN:
            o->token_file = optarg;
            break;
        case O_METRICS:
            o->metrics_http = optarg;
            break;
        case O_MODE: {
            char *end;
            unsigned long m = strtoul(optarg, &end, 8);
            if (!*optarg || *end || m > 0777)
                return usage_error(cmd, "--socket-mode wants an octal mode such as 600");
            o->socket_mode = (unsigned)m;
            break;
        }
        case O_JOBS:
            if (parse_u64(optarg, &n) < 0 || n < 1 || n > 1024)
                return usage_error(cmd, "--jobs wants a number from 1 to 1024, not '%s'", optarg);
            o->jobs = (unsigned)n;
            break;
        case O_LINE:
            if (parse_u64(optarg, &n) < 0 || n < 1024 || n > (1ULL << 30))
                return usage_error(cmd, "--max-line-bytes wants a number from 1024 to 2^30");
            o->max_line = (size_t)n;
            break;
        case O_OUTFILE:
            o->out = optarg;
            break;
        case O_SESSIONS:
            if (parse_u64(optarg, &n) < 0 || n < 1 || n > SBX_MAX_SESSIONS_LIMIT)
                return usage_error(cmd, "--max-sessions wants a number from 1 to %u, not '%s'",
                                   SBX_MAX_SESSIONS_LIMIT, optarg);
            o->max_sessions = (unsigned)n;
            break;
        case O_SIDLE:
        case O_SLIFE: {
            double *to = c == O_SIDLE ? &o->session_idle : &o->session_lifetime;
            if (parse_seconds(optarg, to) < 0 || *to <= 0 ||
                *to > SBX_DEFAULT_SESSION_LIFETIME_SECONDS)
                return usage_error(cmd, "--%s wants a number of seconds above 0, at most 86400",
                                   option_name(c));
            break;
        }
        case O_CLIENTCONNS:
            if (parse_u64(optarg, &n) < 0 || n < 1 || n > 512)
                return usage_error(cmd,
                                   "--max-client-connections wants a number from 1 to 512, "
                                   "not '%s'",
                                   optarg);
            o->max_client_connections = (unsigned)n;
            break;
        case O_STATEDIR:
            if (!*optarg)
                return usage_error(cmd, "--state-dir wants a directory");
            o->state_dir = optarg;
            break;
        case O_HIBERNATE:
            if (parse_seconds(optarg, &o->hibernate_after) < 0 || o->hibernate_after <= 0 ||
                o->hibernate_after > SBX_DEFAULT_SESSION_LIFETIME_SECONDS)
                return usage_error(cmd, "--hibernate-after wants a number of seconds above 0, at "
                                        "most 86400");
            break;
        case O_STATEMAX:
            if (parse_size(optarg, &o->state_max_bytes) < 0 || o->state_max_bytes < STATE_MIN_BYTES)
                return usage_error(cmd, "--state-max-bytes wants a size of at least 16M, not '%s'",
                                   optarg);
            o->given_state_max = true;
            break;
        case ':':
            return usage_error(cmd, "%s needs a value", argv[optind - 1]);
        default:
            return usage_error(cmd, "unknown option '%s'", argv[optind - 1]);
        }
    }
    bool wants_target = cmd == CMD_RUN || cmd == CMD_BATCH;
    if (wants_target && optind >= argc)
        return usage_error(cmd, cmd == CMD_RUN
                                    ? "no script given (FILE, or - for standard input)"
                                    : "no programs given (a directory or a .jsonl file)");
    /* run: what follows the script is its arguments (after "--" when they
     * start with "-"). */
    if (cmd != CMD_RUN && optind + (wants_target ? 1 : 0) < argc)
        return usage_error(cmd, "unexpected '%s'", argv[optind + (wants_target ? 1 : 0)]);
    if (wants_target)
        o->target = argv[optind];
    if (cmd == CMD_RUN) {
        o->args = (const char *const *)&argv[optind + 1];
        o->n_args = (size_t)(argc - optind - 1);
    }
    if (o->stdin_path && strcmp(o->stdin_path, "-") == 0 && o->target &&
        strcmp(o->target, "-") == 0)
        return usage_error(cmd, "the program comes from standard input (-): --stdin - cannot "
                                "be its input too");
    if (o->http && o->listen)
        return usage_error(cmd, "--http and --listen are two ways to serve: choose one");
    if (o->token_file && !o->http)
        return usage_error(cmd, "--http-token-file goes with --http");
    if (o->metrics_http && !o->http)
        return usage_error(cmd, "--metrics-http goes with --http");
    if (o->max_client_connections && !o->http)
        return usage_error(cmd, "--max-client-connections goes with --http");
    if ((o->hibernate_after || o->given_state_max) && !o->state_dir)
        return usage_error(cmd, "--%s goes with --state-dir",
                           o->hibernate_after ? "hibernate-after" : "state-max-bytes");
    double idle = o->session_idle ? o->session_idle : SBX_DEFAULT_SESSION_IDLE_SECONDS;
    if (o->hibernate_after && o->hibernate_after >= idle)
        return usage_error(cmd,
                           "--hibernate-after %g is not below --session-idle %g: a session "
                           "would end before it hibernates",
                           o->hibernate_after, idle);
    if (o->state_dir && o->backend && strcmp(o->backend, "python3") == 0)
        return usage_error(cmd, "--state-dir: the python3 backend has no sessions to hibernate");
    if (cmd != CMD_RUN && cmd != CMD_DOCTOR) {
        struct sbx_request probe;
        struct sbx_error err;
        sbx_request_init(&probe);
        probe.code = "";
        probe.limits = o->limits;
        if (sbx_request_check(&probe, &err) < 0)
            return usage_error(cmd, "%s", err.message);
        probe.limits = o->ceilings;
        if (cmd == CMD_SERVE && sbx_request_check(&probe, &err) < 0)
            return usage_error(cmd, "a ceiling out of range: %s", err.message);
    }
    return 0;
}

/* The helper next to this executable (a build tree, or an install that keeps
 * them together), else the library's own default. */
static const char *find_template(const char *given, char *buf, size_t cap)
{
    if (given)
        return given;
    if (getenv("PYSBX_TEMPLATE"))
        return NULL;
    return beside_self("pysbx-template", buf, cap);
}

/* The pool a command wants: one worker for one run, else one per job (up to
 * a bound: a pool that size is already as fast as the machine). */
#define POOL_FOR_JOBS_MAX 64

void opts_config(const struct opts *o, struct sbx_config *cfg, char *tmpl, size_t tmpl_cap)
{
    sbx_config_init(cfg);
    cfg->template_path = find_template(o->template_path, tmpl, tmpl_cap);
    cfg->required_layers = o->required;
    cfg->policy_debug = o->policy_debug;
    cfg->packages = (const char *const *)o->packages;
    cfg->module_dirs = (const char *const *)o->module_dirs;
    if (o->workspace_bytes)
        cfg->workspace_bytes = o->workspace_bytes;
    cfg->max_sessions = o->max_sessions;
    /* Images written by a server restore in the next one it starts. */
    cfg->fixed_layout = o->state_dir != NULL;
    if (o->cmd == CMD_DOCTOR)
        cfg->pool_size = 1;
    /* One program: no warm modules to import, one worker, nothing kept. */
    cfg->single_run = o->cmd == CMD_RUN;
    if (o->jobs) {
        cfg->max_running = o->jobs;
        cfg->pool_size = o->jobs < POOL_FOR_JOBS_MAX ? o->jobs : POOL_FOR_JOBS_MAX;
    }
    /* For tests of degraded deployments only (see sbx_config.disable_layers):
     * not an option, so that no --help reader mistakes it for a setting. */
    const char *off = getenv("PYSBX_TEST_DISABLE_LAYERS");
    if (off && *off && parse_layers(off, &cfg->disable_layers) < 0)
        cfg->disable_layers = 0;
    if (cfg->disable_layers & SBX_LAYERS_DEFAULT)
        cfg->disable_layers = 0;
}

int open_backend(const struct opts *o, struct sbx_backend *b, struct sbx_error *err)
{
    struct sbx_config cfg;
    char tmpl[PATH_MAX];

    opts_config(o, &cfg, tmpl, sizeof(tmpl));
    if (o->backend && strcmp(o->backend, "python3") == 0)
        fputs("pysbx: warning: the python3 backend confines nothing; never give it untrusted "
              "code\n",
              stderr);
    return sbx_backend_open(o->backend, &cfg, b, err);
}

void opts_free(struct opts *o)
{
    for (size_t i = 0; i < o->n_files; i++) {
        free((char *)o->files[i].name);
        free((void *)o->files[i].data);
    }
    free(o->files);
    o->files = NULL;
    o->n_files = 0;
    free_packages(o);
    for (size_t i = 0; i < o->n_module_dirs; i++)
        free(o->module_dirs[i]);
    free(o->module_dirs);
    o->module_dirs = NULL;
    o->n_module_dirs = 0;
}
