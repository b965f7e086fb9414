#define _GNU_SOURCE
#include "session_helpers.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct sbx_session *open_session(struct sbx *sbx, const struct sbx_session_limits *l)
{
    struct sbx_session *s = NULL;
    struct sbx_error err = {0};

    if (sbx_session_open(sbx, l, &s, &err) < 0)
        fail_msg("sbx_session_open: %s: %s", sbx_error_code_name(err.code), err.message);
    return s;
}

struct sbx_result *cell_limited(struct sbx_session *s, const char *code, enum sbx_rollback rb,
                                double wall, double cpu, const struct sbx_file *files,
                                size_t n_files, int *rc, struct sbx_error *err)
{
    struct sbx_request req;
    struct sbx_result *res = NULL;

    sbx_request_init(&req);
    req.code = code;
    req.code_len = strlen(code);
    req.files = files;
    req.n_files = n_files;
    if (wall > 0)
        req.limits.wall_seconds = wall;
    if (cpu > 0)
        req.limits.cpu_seconds = cpu;
    *rc = sbx_session_run(s, &req, rb, &res, err);
    return res;
}

struct sbx_result *cell_full(struct sbx_session *s, const char *code, enum sbx_rollback rb,
                             double wall, const struct sbx_file *files, size_t n_files, int *rc,
                             struct sbx_error *err)
{
    return cell_limited(s, code, rb, wall, 0, files, n_files, rc, err);
}

struct sbx_result *cell_rb(struct sbx_session *s, const char *code, enum sbx_rollback rb)
{
    struct sbx_error err = {0};
    int rc;
    struct sbx_result *r = cell_full(s, code, rb, 0, NULL, 0, &rc, &err);

    if (rc < 0)
        fail_msg("sbx_session_run: %s: %s", sbx_error_code_name(err.code), err.message);
    return r;
}

struct sbx_result *cell(struct sbx_session *s, const char *code)
{
    return cell_rb(s, code, SBX_ROLLBACK_ON_ERROR);
}

void expect_cell(struct sbx_session *s, const char *code, const char *want)
{
    struct sbx_result *r = cell(s, code);

    expect_completed(r, 0);
    if (r->rolled_back || strcmp(r->stdout_text, want) != 0)
        fail_msg("cell %s\nrolled_back %d (%s), stdout:\n%s\nexpected:\n%s\nstderr:\n%s", code,
                 r->rolled_back, r->reason ? r->reason : "", r->stdout_text, want, r->stderr_text);
    sbx_result_free(r);
}

void expect_rolled_back(struct sbx_session *s, const char *code)
{
    char buf[8192];

    snprintf(buf, sizeof(buf), "%s\nraise RuntimeError('undo this')\n", code);
    struct sbx_result *r = cell(s, buf);
    expect_completed(r, 1);
    if (!r->rolled_back)
        fail_msg("the failed cell was kept");
    if (r->reason && strstr(r->reason, "could not"))
        fail_msg("the rollback was not done: %s", r->reason);
    sbx_result_free(r);
}

struct sbx_session *expect_fork(struct sbx_session *from)
{
    struct sbx_session *b = NULL;
    struct sbx_error err = {0};

    if (sbx_session_fork(from, &b, &err) < 0)
        fail_msg("sbx_session_fork: %s", err.message);
    return b;
}

void expect_lost(struct sbx_session *s, const char *why_part)
{
    struct sbx_error err = {0};
    int rc;
    struct sbx_result *r = cell_full(s, "print(1)", SBX_ROLLBACK_ON_ERROR, 0, NULL, 0, &rc, &err);

    if (rc == 0)
        fail_msg("the session still runs cells: %s", r->stdout_text);
    assert_int_equal(rc, -ENOLINK);
    assert_int_equal(err.code, SBX_ERR_SESSION_LOST);
    if (!strstr(err.message, why_part))
        fail_msg("'%s' lacks '%s'", err.message, why_part);
    /* And it stays lost. */
    r = cell_full(s, "print(1)", SBX_ROLLBACK_ON_ERROR, 0, NULL, 0, &rc, &err);
    assert_int_equal(rc, -ENOLINK);
}

uid_t session_uid(struct sbx_session *s)
{
    struct sbx_result *r = cell(s, "import os\nprint(os.getuid())");

    expect_completed(r, 0);
    uid_t uid = (uid_t)strtoul(r->stdout_text, NULL, 10);
    sbx_result_free(r);
    return uid;
}

/* Calls |fn| with each process's pid and the text of its /proc status. */
static void each_process(void (*fn)(void *ctx, pid_t pid, const char *status), void *ctx)
{
    DIR *d = opendir("/proc");
    struct dirent *e;

    assert_non_null(d);
    while ((e = readdir(d))) {
        char path[300], buf[4096];
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%s/status", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        fn(ctx, (pid_t)atoi(e->d_name), buf);
    }
    closedir(d);
}

/* The number after |field| in a status text, or -1. */
static long status_field(const char *status, const char *field)
{
    const char *p = strstr(status, field);

    return p ? strtol(p + strlen(field), NULL, 10) : -1;
}

struct uid_count {
    uid_t uid;
    int n;
    double cpu_ms;
};

static void count_uid(void *ctx, pid_t pid, const char *status)
{
    struct uid_count *c = ctx;

    if ((uid_t)status_field(status, "\nUid:") != c->uid)
        return;
    c->n++;
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* utime and stime: the 14th and 15th fields, the 12th and 13th after
     * the name's closing parenthesis. */
    char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2)
        c->cpu_ms += (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

int processes_of(uid_t uid)
{
    struct uid_count c = {.uid = uid};

    if (getuid() != 0)
        return -1;
    each_process(count_uid, &c);
    return c.n;
}

struct uid_pids {
    uid_t uid;
    pid_t *out;
    int cap, n;
};

static void note_uid(void *ctx, pid_t pid, const char *status)
{
    struct uid_pids *u = ctx;

    if ((uid_t)status_field(status, "\nUid:") == u->uid && u->n < u->cap)
        u->out[u->n++] = pid;
}

int pids_of(uid_t uid, pid_t *out, int cap)
{
    struct uid_pids u = {.uid = uid, .out = out, .cap = cap};

    each_process(note_uid, &u);
    return u.n;
}

struct name_pids {
    const char *name;
    pid_t *out;
    int cap, n;
};

static void note_name(void *ctx, pid_t pid, const char *status)
{
    struct name_pids *u = ctx;
    size_t len = strlen(u->name);

    if (strncmp(status, "Name:\t", 6) == 0 && strncmp(status + 6, u->name, len) == 0 &&
        status[6 + len] == '\n' && u->n < u->cap)
        u->out[u->n++] = pid;
}

int pids_named(const char *name, pid_t *out, int cap)
{
    struct name_pids u = {.name = name, .out = out, .cap = cap};

    each_process(note_name, &u);
    return u.n;
}

int descriptors_named(pid_t pid, const char *name, bool prefix, int *all)
{
    char path[64], link[256];
    int n = 0, any = 0;

    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        any++;
        ssize_t len = readlinkat(dirfd(d), e->d_name, link, sizeof(link) - 1);
        if (len > 0) {
            link[len] = '\0';
            n += (prefix ? strncmp(link, name, strlen(name)) : strcmp(link, name)) == 0;
        }
    }
    if (d)
        closedir(d);
    if (all)
        *all = any;
    return n;
}

int descriptors_of_pid(pid_t pid, const char *name)
{
    return descriptors_named(pid, name, false, NULL);
}

int descriptors_of(uid_t uid, const char *name)
{
    pid_t pids[64];
    int n = 0;

    if (getuid() != 0)
        return -1;
    int np = pids_of(uid, pids, 64);
    for (int i = 0; i < np; i++)
        n += descriptors_of_pid(pids[i], name);
    return n;
}

long proc_status_field(pid_t pid, const char *field)
{
    char path[64], buf[4096];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return status_field(buf, field);
}

double cpu_ms_of(uid_t uid)
{
    struct uid_count c = {.uid = uid};

    each_process(count_uid, &c);
    return c.cpu_ms;
}

static void deepest_stack(void *ctx, pid_t pid, const char *status)
{
    struct uid_count *c = ctx;

    (void)pid;
    if ((uid_t)status_field(status, "\nUid:") == c->uid && status_field(status, "\nVmStk:") > c->n)
        c->n = (int)status_field(status, "\nVmStk:");
}

long stack_kb_of(uid_t uid)
{
    struct uid_count c = {.uid = uid, .n = -1};

    if (getuid() != 0)
        return -1;
    each_process(deepest_stack, &c);
    return c.n;
}

int wait_processes_of(uid_t uid, int n)
{
    int got = 0;

    for (int i = 0; i < 100 && (got = processes_of(uid)) != n; i++) {
        struct timespec pause = {0, 10 * 1000000};
        nanosleep(&pause, NULL);
    }
    return got;
}

struct stopped {
    pid_t *out;
    int cap, n;
};

static void note_stopped(void *ctx, pid_t pid, const char *status)
{
    struct stopped *s = ctx;
    const char *state = strstr(status, "\nState:");

    if (!state)
        return;
    state += strlen("\nState:");
    state += strspn(state, " \t");
    if (*state == 'T' && s->n < s->cap)
        s->out[s->n++] = pid;
}

int stopped_processes(pid_t *out, int cap)
{
    struct stopped s = {.out = out, .cap = cap};

    each_process(note_stopped, &s);
    return s.n;
}

int wait_stopped(pid_t *out, int cap, int n)
{
    int got = 0;

    for (int i = 0; i < 100 && (got = stopped_processes(out, cap)) != n; i++) {
        struct timespec pause = {0, 10 * 1000000};
        nanosleep(&pause, NULL);
    }
    return got;
}

struct inside {
    uid_t uid;
    pid_t inner, found;
};

static void match_inner(void *ctx, pid_t pid, const char *status)
{
    struct inside *in = ctx;
    const char *ns = strstr(status, "\nNSpid:");

    if (!ns || (uid_t)status_field(status, "\nUid:") != in->uid)
        return;
    /* The last number of the line: the pid in the innermost namespace. */
    const char *end = strchr(ns + 1, '\n');
    const char *p = end ? end : ns + strlen(ns);
    while (p > ns && (p[-1] == ' ' || p[-1] == '\t'))
        p--;
    while (p > ns && p[-1] >= '0' && p[-1] <= '9')
        p--;
    if ((pid_t)atoi(p) == in->inner)
        in->found = pid;
}

pid_t pid_from_inside(uid_t uid, pid_t inner)
{
    struct inside in = {.uid = uid, .inner = inner, .found = -1};

    each_process(match_inner, &in);
    return in.found;
}

struct named {
    int pid;
};

static void match_template(void *ctx, pid_t pid, const char *status)
{
    struct named *n = ctx;

    if (strncmp(status, "Name:\tpysbx-template\n", 21) == 0 && n->pid < 0)
        n->pid = (int)pid;
}

int template_pid(void)
{
    struct named n = {.pid = -1};

    each_process(match_template, &n);
    assert_true(n.pid > 0);
    return n.pid;
}

long rss_kb(void)
{
    char buf[4096];
    FILE *f = fopen("/proc/self/status", "r");

    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return status_field(buf, "\nVmRSS:");
}
