/* pysbx: the command. Dispatches to run, serve, mcp, batch and doctor. */
#define _GNU_SOURCE
#include "commands.h"
#include "options.h"
#include "statedir.h"
#include "stopper.h"

#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SERVER_MMAP_THRESHOLD (1 << 20)

static unsigned cores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1;
}

/* serve and mcp --state-dir: opened before the sandbox, so that a
 * directory another server holds is refused before anything starts.
 * Returns 0, or the exit status having said why. */
static int open_state(enum cmd cmd, const struct opts *o, struct state_dir **out)
{
    struct sbx_config cfg;
    char tmpl[PATH_MAX], why[320];

    *out = NULL;
    if (!o->state_dir)
        return 0;
    opts_config(o, &cfg, tmpl, sizeof(tmpl));
    struct state_dir_config c = {
        .path = o->state_dir,
        .max_bytes = o->state_max_bytes,
        .template_path = cfg.template_path ? cfg.template_path : getenv("PYSBX_TEMPLATE"),
        .packages = cfg.packages,
        .module_dirs = cfg.module_dirs,
    };
    if (state_dir_open(&c, out, why, sizeof(why)) < 0) {
        fprintf(stderr, "pysbx %s: --state-dir %s: %s\n", cmd_name(cmd), o->state_dir, why);
        return 1;
    }
    return 0;
}

static int cmd_front(enum cmd cmd, int argc, char **argv)
{
    struct opts o;
    struct sbx_backend b = {0};
    struct sbx_error err = {0};
    struct state_dir *state = NULL;
    int status = parse_opts(cmd, argc, argv, &o);

    if (status != 0) {
        opts_free(&o);
        return status < 0 ? 0 : status;
    }
    if (!o.jobs)
        o.jobs = 2 * cores();
    /* A run's output and its answer are megabytes at a time, freed once
     * sent: mapped and unmapped whole, so that the server's memory is what
     * it holds now, not what it held at its busiest (glibc's threshold
     * would otherwise rise, and freed answers stay in its arenas). */
    mallopt(M_MMAP_THRESHOLD, SERVER_MMAP_THRESHOLD);
    /* run, mcp and batch turn SIGINT/SIGTERM/SIGHUP into a cancellation
     * (stopper.h) from before their sandbox exists; serve has its own. */
    if (cmd != CMD_SERVE)
        (void)stopper_start();
    if ((status = open_state(cmd, &o, &state)) != 0) {
        opts_free(&o);
        return status;
    }
    if (open_backend(&o, &b, &err) < 0) {
        state_dir_close(state);
        opts_free(&o);
        return open_error(cmd, &err);
    }
    struct sbx_session_limits sl;
    sbx_session_limits_init(&sl);
    if (o.session_idle)
        sl.idle_seconds = o.session_idle;
    if (o.session_lifetime)
        sl.lifetime_seconds = o.session_lifetime;
    if (cmd == CMD_SERVE) {
        struct serve_opts so = {.backend = &b,
                                .max_line_bytes = o.max_line,
                                .jobs = o.jobs,
                                .listen_path = o.listen,
                                .socket_mode = (mode_t)o.socket_mode,
                                .ceilings = o.ceilings,
                                .grace_seconds = o.grace,
                                .max_pending_bytes = o.max_pending,
                                .max_held_bytes = o.max_held,
                                .http_addr = o.http,
                                .token_file = o.token_file,
                                .metrics_addr = o.metrics_http,
                                .max_client_connections =
                                    o.max_client_connections ? o.max_client_connections : 128,
                                .session_limits = sl,
                                .state = state,
                                .hibernate_after = o.hibernate_after};
        status = o.http ? http_main(&so) : serve_main(&so);
    } else if (cmd == CMD_MCP) {
        struct mcp_opts mo = {.backend = &b,
                              .limits = o.limits,
                              .max_line_bytes = o.max_line,
                              .packages = (const char *const *)o.packages,
                              .session_limits = sl,
                              .state = state,
                              .hibernate_after = o.hibernate_after};
        status = mcp_main(&mo);
    } else {
        struct batch_opts bo = {&b, o.limits, o.limits_given, o.target, o.out, o.jobs, o.max_line};
        status = batch_main(&bo);
    }
    state_dir_close(state);
    b.close(b.self);
    opts_free(&o);
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
    const char *c = argv[1];
    if (strcmp(c, "run") == 0)
        return cmd_run(argc - 1, argv + 1);
    if (strcmp(c, "serve") == 0)
        return cmd_front(CMD_SERVE, argc - 1, argv + 1);
    if (strcmp(c, "mcp") == 0)
        return cmd_front(CMD_MCP, argc - 1, argv + 1);
    if (strcmp(c, "batch") == 0)
        return cmd_front(CMD_BATCH, argc - 1, argv + 1);
    if (strcmp(c, "doctor") == 0)
        return cmd_doctor(argc - 1, argv + 1);
    if (strcmp(c, "version") == 0 || strcmp(c, "--version") == 0) {
        printf("pysbx %s\n", PYSBX_VERSION);
        return 0;
    }
    if (strcmp(c, "-h") == 0 || strcmp(c, "--help") == 0 || strcmp(c, "help") == 0) {
        fputs(main_usage, stdout);
        return 0;
    }
    fprintf(stderr, "pysbx: unknown command '%s'\n\n%s", c, main_usage);
    return EXIT_USAGE;
}
