/* pysbx: the command. */
#define _GNU_SOURCE
#include "json.h"
#include "pysbx.h"
#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

/* Exit statuses of `pysbx run` when the code did not complete. */
#define EXIT_USAGE    2
#define EXIT_TIMEOUT  124
#define EXIT_MEMORY   125
#define EXIT_SANDBOX  70
#define EXIT_SIGNAL   128 /* + the signal number */

static const char run_usage[] =
    "usage: pysbx run [options] FILE|-\n"
    "\n"
    "Runs the Python script FILE (or standard input, for -) in a fresh sandboxed\n"
    "worker. By default prints the code's stdout and stderr as they were and exits\n"
    "with its exit status; when a limit stops it, prints one line saying which and\n"
    "exits 124 (time), 125 (memory), 128+N (killed by signal N) or 70 (the sandbox\n"
    "failed).\n"
    "\n"
    "options:\n"
    "  --json                  print the result object (status, stdout, stderr,\n"
    "                          artifacts, stats) as one JSON line; exit 0 when a\n"
    "                          result was printed\n"
    "  --wall SECONDS          wall-clock limit (default 10)\n"
    "  --cpu SECONDS           CPU-time limit, all threads (default 5)\n"
    "  --memory SIZE           address-space limit: bytes, or with K, M, G, T\n"
    "                          (powers of 1024), e.g. 256M (default 256M)\n"
    "  --max-output CHARS      characters kept of stdout and of stderr each\n"
    "                          (default 100000)\n"
    "  --max-artifact-bytes N  bytes returned of each file (default 4194304)\n"
    "  --max-artifacts N       files returned, the first by name (default 32)\n"
    "  --file NAME=PATH        put the file PATH in the workspace as NAME before the\n"
    "                          code runs (repeatable); NAME is relative, may hold '/',\n"
    "                          never '..'\n"
    "  --artifacts-dir DIR     write the files the code left in its workspace to DIR\n"
    "                          (made if missing)\n"
    "  --require LAYER,...     refuse to run unless these layers are active (default:\n"
    "                          seccomp; 'none' runs with whatever the machine has);\n"
    "                          layers: seccomp, landlock, netns, mountns, ipcns, utsns,\n"
    "                          user, rlimits, caps (see pysbx doctor)\n"
    "  --template PATH         the pysbx-template helper to use\n"
    "  --policy-debug          name refused system calls on stderr and let them fail\n"
    "                          with EPERM instead of applying the policy's kills:\n"
    "                          for finding what code needs, never for production\n"
    "  -h, --help              this text\n";

static const char main_usage[] =
    "usage: pysbx COMMAND [options]\n"
    "\n"
    "commands:\n"
    "  run [options] FILE|-   run a Python script in the sandbox (pysbx run --help)\n"
    "  doctor [--json] [--require LAYER,...]\n"
    "                         say which layers of confinement are active here, and why\n"
    "                         not where they are not\n"
    "  version                print the version\n"
    "\n"
    "pysbx runs untrusted Python in a forked, embedded CPython: no network, no host\n"
    "environment or files, bounded time, memory and output.\n";

struct run_opts {
    bool json;
    bool policy_debug;
    unsigned required;
    const char *script;
    const char *artifacts_dir;
    const char *template_path;
    struct sbx_file *files;
    size_t n_files;
    struct sbx_limits limits;
};

__attribute__((format(printf, 1, 2))) static int usage_error(const char *format, ...)
{
    va_list ap;

    fputs("pysbx: ", stderr);
    va_start(ap, format);
    vfprintf(stderr, format, ap);
    va_end(ap);
    fputs("\n(see pysbx run --help)\n", stderr);
    return EXIT_USAGE;
}

/* Reads a whole file (or stdin for "-"), refusing more than |max| bytes. */
static int slurp(const char *path, uint64_t max, char **data, size_t *len)
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

static int add_file(struct run_opts *o, const char *spec)
{
    const char *eq = strchr(spec, '=');
    char *name, *data = NULL;
    size_t len = 0;
    const char *why;
    int rc;

    if (!eq || eq == spec || !eq[1])
        return usage_error("--file wants NAME=PATH, not '%s'", spec);
    name = strndup(spec, (size_t)(eq - spec));
    if (!name)
        return usage_error("out of memory");
    why = name_problem(name, strlen(name));
    if (why) {
        rc = usage_error("--file %s: %s", name, why);
        free(name);
        return rc;
    }
    rc = slurp(eq + 1, SBX_MAX_REQUEST_BYTES, &data, &len);
    if (rc < 0) {
        int e = usage_error("--file %s: %s: %s", name, eq + 1,
                            rc == -EFBIG ? "file too large" : strerror(-rc));
        free(name);
        return e;
    }
    struct sbx_file *f = realloc(o->files, (o->n_files + 1) * sizeof(*f));
    if (!f) {
        free(name);
        free(data);
        return usage_error("out of memory");
    }
    o->files = f;
    o->files[o->n_files++] = (struct sbx_file){.name = name, .data = data, .len = len};
    return 0;
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

static int parse_run_opts(int argc, char **argv, struct run_opts *o)
{
    enum {
        O_JSON = 256, O_WALL, O_CPU, O_MEM, O_OUT, O_ABYTES, O_ARTS, O_FILE, O_DIR, O_TMPL,
        O_REQUIRE, O_DEBUG,
    };
    static const struct option longopts[] = {
        {"json", no_argument, NULL, O_JSON},
        {"wall", required_argument, NULL, O_WALL},
        {"cpu", required_argument, NULL, O_CPU},
        {"memory", required_argument, NULL, O_MEM},
        {"max-output", required_argument, NULL, O_OUT},
        {"max-artifact-bytes", required_argument, NULL, O_ABYTES},
        {"max-artifacts", required_argument, NULL, O_ARTS},
        {"file", required_argument, NULL, O_FILE},
        {"artifacts-dir", required_argument, NULL, O_DIR},
        {"template", required_argument, NULL, O_TMPL},
        {"require", required_argument, NULL, O_REQUIRE},
        {"policy-debug", no_argument, NULL, O_DEBUG},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c, rc;

    sbx_limits_init(&o->limits);
    o->required = SBX_LAYER_SECCOMP;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case 'h':
            fputs(run_usage, stdout);
            exit(0);
        case O_JSON:
            o->json = true;
            break;
        case O_WALL:
            if (parse_seconds(optarg, &o->limits.wall_seconds) < 0)
                return usage_error("--wall wants a number of seconds above 0, not '%s'", optarg);
            break;
        case O_CPU:
            if (parse_seconds(optarg, &o->limits.cpu_seconds) < 0)
                return usage_error("--cpu wants a number of seconds above 0, not '%s'", optarg);
            break;
        case O_MEM:
            if (sbx_parse_size(optarg, &o->limits.memory_bytes) < 0)
                return usage_error("--memory wants a size such as 256M, 1G or 268435456, not '%s'",
                                   optarg);
            break;
        case O_OUT:
            if (parse_u64(optarg, &o->limits.max_output_chars) < 0)
                return usage_error("--max-output wants a whole number, not '%s'", optarg);
            break;
        case O_ABYTES:
            if (parse_u64(optarg, &o->limits.max_artifact_bytes) < 0)
                return usage_error("--max-artifact-bytes wants a whole number, not '%s'", optarg);
            break;
        case O_ARTS:
            if (parse_u64(optarg, &o->limits.max_artifacts) < 0)
                return usage_error("--max-artifacts wants a whole number, not '%s'", optarg);
            break;
        case O_FILE:
            if ((rc = add_file(o, optarg)) != 0)
                return rc;
            break;
        case O_DIR:
            o->artifacts_dir = optarg;
            break;
        case O_TMPL:
            o->template_path = optarg;
            break;
        case O_REQUIRE:
            if (parse_layers(optarg, &o->required) < 0)
                return usage_error("--require wants layer names separated by commas (or "
                                   "'none'), not '%s'", optarg);
            break;
        case O_DEBUG:
            o->policy_debug = true;
            break;
        case ':':
            return usage_error("%s needs a value", argv[optind - 1]);
        default:
            return usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return usage_error("no script given (FILE, or - for standard input)");
    if (optind + 1 < argc)
        return usage_error("one script only; unexpected '%s'", argv[optind + 1]);
    o->script = argv[optind];
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

static int save_artifacts(const char *dir, const struct sbx_result *res)
{
    int dfd, rc = 0;

    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        fprintf(stderr, "pysbx: --artifacts-dir %s: %s\n", dir, strerror(errno));
        return -1;
    }
    dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        fprintf(stderr, "pysbx: --artifacts-dir %s: %s\n", dir, strerror(errno));
        return -1;
    }
    for (size_t i = 0; i < res->n_artifacts; i++) {
        const struct sbx_artifact *a = &res->artifacts[i];
        /* The name came from the code: it must stay beneath DIR, through no
         * link that may already be there. */
        int fd = name_problem(a->name, strlen(a->name))
                     ? -EINVAL
                     : open_beneath(dfd, a->name, O_WRONLY | O_CREAT | O_TRUNC, 0644, true);
        if (fd < 0 || write_full(fd, a->data, a->data_len) < 0) {
            fprintf(stderr, "pysbx: saving artifact %s: %s\n", a->name,
                    strerror(fd < 0 ? -fd : errno));
            rc = -1;
        }
        if (fd >= 0)
            close(fd);
        if (a->truncated)
            fprintf(stderr, "pysbx: artifact %s was cut to %zu of %llu bytes\n", a->name,
                    a->data_len, (unsigned long long)a->size);
    }
    if (res->artifacts_dropped)
        fprintf(stderr, "pysbx: %llu more files were not returned (--max-artifacts)\n",
                (unsigned long long)res->artifacts_dropped);
    close(dfd);
    return rc;
}

static int report(const struct run_opts *o, const struct sbx_result *res)
{
    if (o->artifacts_dir && res->status == SBX_COMPLETED &&
        save_artifacts(o->artifacts_dir, res) < 0 && !o->json)
        return EXIT_SANDBOX;
    if (o->json) {
        char *s = sbx_result_to_json(res);
        if (!s) {
            fputs("pysbx: out of memory\n", stderr);
            return EXIT_SANDBOX;
        }
        puts(s);
        free(s);
        return 0;
    }
    fwrite(res->stdout_text, 1, res->stdout_len, stdout);
    fflush(stdout);
    fwrite(res->stderr_text, 1, res->stderr_len, stderr);
    if (!o->artifacts_dir && res->n_artifacts)
        fprintf(stderr, "pysbx: %zu file%s left in the workspace (save with --artifacts-dir)\n",
                res->n_artifacts, res->n_artifacts == 1 ? "" : "s");
    switch (res->status) {
    case SBX_COMPLETED:
        return res->exit_code;
    case SBX_TIMEOUT:
        fprintf(stderr, "pysbx: timeout: %s\n", res->reason);
        return EXIT_TIMEOUT;
    case SBX_MEMORY_LIMIT:
        fprintf(stderr, "pysbx: memory_limit: %s\n", res->reason);
        return EXIT_MEMORY;
    case SBX_CRASHED:
        fprintf(stderr, "pysbx: crashed: %s\n", res->reason);
        return EXIT_SIGNAL + res->signal;
    case SBX_CANCELLED:
    case SBX_SANDBOX_ERROR:
        break;
    }
    fprintf(stderr, "pysbx: %s: %s\n", sbx_status_name(res->status),
            res->reason ? res->reason : "");
    return EXIT_SANDBOX;
}

/* The sandbox could not start (a required layer missing, or no template):
 * in --json mode this is still an answer, a sandbox_error result. */
static int cannot_start(const struct run_opts *o, const struct sbx_error *err)
{
    if (o->json) {
        struct sbx_result r = {
            .status = SBX_SANDBOX_ERROR,
            .exit_code = -1,
            .stdout_text = "",
            .stderr_text = "",
            .partial = true,
            .reason = (char *)err->message,
        };
        char *s = sbx_result_to_json(&r);
        if (s)
            puts(s);
        free(s);
    } else
        fprintf(stderr, "pysbx: cannot start the sandbox: %s\n", err->message);
    return EXIT_SANDBOX;
}

static int cmd_run(int argc, char **argv)
{
    struct run_opts o = {0};
    struct sbx_config cfg;
    struct sbx_request req;
    struct sbx_result *res = NULL;
    struct sbx_error err = {0};
    struct sbx *sbx = NULL;
    char *code = NULL;
    size_t code_len = 0;
    char tmpl[PATH_MAX];
    int status;

    status = parse_run_opts(argc, argv, &o);
    if (status != 0)
        goto out;
    int rc = slurp(o.script, SBX_MAX_CODE_BYTES, &code, &code_len);
    if (rc < 0) {
        status = usage_error("%s: %s", o.script, rc == -EFBIG ? "larger than the code limit"
                                                             : strerror(-rc));
        goto out;
    }
    sbx_request_init(&req);
    req.code = code;
    req.code_len = code_len;
    req.files = o.files;
    req.n_files = o.n_files;
    req.limits = o.limits;
    /* Refuse a bad request before paying for a template. */
    if (sbx_request_check(&req, &err) < 0) {
        status = usage_error("%s", err.message);
        goto out;
    }
    sbx_config_init(&cfg);
    cfg.template_path = find_template(o.template_path, tmpl, sizeof(tmpl));
    cfg.pool_size = 1;
    cfg.required_layers = o.required;
    cfg.policy_debug = o.policy_debug;
    if (sbx_open(&cfg, &sbx, &err) < 0) {
        status = cannot_start(&o, &err);
        goto out;
    }
    if (sbx_run(sbx, &req, &res, &err) < 0) {
        fprintf(stderr, "pysbx: %s\n", err.message);
        status = err.code == SBX_ERR_UNAVAILABLE ? EXIT_SANDBOX : EXIT_USAGE;
        goto out;
    }
    status = report(&o, res);
out:
    sbx_result_free(res);
    sbx_close(sbx);
    free(code);
    for (size_t i = 0; i < o.n_files; i++) {
        free((char *)o.files[i].name);
        free((void *)o.files[i].data);
    }
    free(o.files);
    return status;
}

static int cmd_doctor(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"json", no_argument, NULL, 'j'},
        {"require", required_argument, NULL, 'r'},
        {"template", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct sbx_config cfg;
    struct sbx_error err = {0};
    struct sbx *sbx = NULL;
    struct sbx_layer_info layers[SBX_LAYER_COUNT];
    struct utsname u;
    unsigned required = SBX_LAYER_SECCOMP;
    const char *given = NULL;
    char tmpl[PATH_MAX];
    bool json = false;
    int c, status = 0;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c == 'j')
            json = true;
        else if (c == 't')
            given = optarg;
        else if (c == 'r' && parse_layers(optarg, &required) == 0)
            continue;
        else if (c == 'h') {
            fputs("usage: pysbx doctor [--json] [--require LAYER,...] [--template PATH]\n"
                  "Starts a sandbox as `pysbx run` would and says which layers are active.\n"
                  "Exits 1 when a required layer (default: seccomp) is not.\n",
                  stdout);
            return 0;
        } else
            return usage_error("doctor: bad option '%s'", argv[optind - 1]);
    }
    sbx_config_init(&cfg);
    cfg.template_path = find_template(given, tmpl, sizeof(tmpl));
    cfg.pool_size = 1;
    cfg.required_layers = 0; /* report, whatever is missing */
    if (sbx_open(&cfg, &sbx, &err) < 0) {
        fprintf(stderr, "pysbx: cannot start the sandbox: %s\n", err.message);
        return EXIT_SANDBOX;
    }
    sbx_layers(sbx, layers);
    uname(&u);
    if (json) {
        json_t *o = json_pack("{s:s, s:s, s:s, s:s}", "pysbx", PYSBX_VERSION, "python",
                              sbx_python_version(sbx), "libseccomp", sbx_libseccomp_version(sbx),
                              "kernel", u.release);
        json_t *l = json_object();
        for (int i = 0; i < SBX_LAYER_COUNT; i++)
            json_object_set_new(l, layers[i].name,
                                json_pack("{s:b, s:b, s:s}", "active", layers[i].active,
                                          "required", (required & layers[i].layer) != 0,
                                          "detail", layers[i].detail));
        json_object_set_new(o, "layers", l);
        char *text = json_dumps(o, JSON_INDENT(2));
        if (text)
            puts(text);
        free(text);
        json_decref(o);
    } else {
        printf("pysbx       %s\npython      %s\nlibseccomp  %s\nkernel      %s %s\n\n",
               PYSBX_VERSION, sbx_python_version(sbx), sbx_libseccomp_version(sbx), u.sysname,
               u.release);
        for (int i = 0; i < SBX_LAYER_COUNT; i++)
            printf("%-9s %-12s %s\n", layers[i].name,
                   layers[i].active ? "active" : "UNAVAILABLE", layers[i].detail);
    }
    for (int i = 0; i < SBX_LAYER_COUNT; i++) {
        if ((required & layers[i].layer) && !layers[i].active) {
            fprintf(stderr, "pysbx: required layer %s is not available\n", layers[i].name);
            status = 1;
        }
    }
    sbx_close(sbx);
    return status;
}

int main(int argc, char **argv)
{
    /* The code's output is ours to pass on; a closed pipe downstream must
     * not kill us before the workspace is cleaned up. */
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2) {
        fputs(main_usage, stderr);
        return EXIT_USAGE;
    }
    if (strcmp(argv[1], "run") == 0)
        return cmd_run(argc - 1, argv + 1);
    if (strcmp(argv[1], "doctor") == 0)
        return cmd_doctor(argc - 1, argv + 1);
    if (strcmp(argv[1], "version") == 0 || strcmp(argv[1], "--version") == 0) {
        printf("pysbx %s\n", PYSBX_VERSION);
        return 0;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "help") == 0) {
        fputs(main_usage, stdout);
        return 0;
    }
    fprintf(stderr, "pysbx: unknown command '%s'\n\n%s", argv[1], main_usage);
    return EXIT_USAGE;
}
