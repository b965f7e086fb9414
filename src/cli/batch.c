/*
 * pysbx batch: many programs, --jobs at a time, one result line each, then a
 * summary. Programs are the .py files of a directory (in name order), or the
 * request lines of a JSONL file (the form `pysbx serve` reads).
 */
#define _GNU_SOURCE
#include "commands.h"
#include "lines.h"
#include "options.h"
#include "reqjson.h"
#include "sbxerr.h"
#include "stopper.h"
#include "sysutil.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct program {
    char *label; /* file name, or "line N" */
    char *text;  /* the code, or the request line */
    size_t len;
    bool is_request;
};

struct batch {
    const struct batch_opts *o;
    struct program *p;
    size_t n;
    size_t next; /* under lock */
    int out_fd;
    pthread_mutex_t lock;
    /* tallies, under lock */
    size_t done, by_status[SBX_SANDBOX_ERROR + 1], refused, failed_code;
    double *wall_ms;
    uint64_t start_ns, last_draw_ns;
    struct sbx_cancel *stop; /* fired by SIGINT/SIGTERM/SIGHUP */
    bool tty;
};

static int load_dir(struct batch *b, const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char **names = NULL;
    size_t n = 0;

    if (!d)
        return -errno;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 4 || strcmp(e->d_name + l - 3, ".py") != 0)
            continue;
        char **nn = realloc(names, (n + 1) * sizeof(*nn));
        if (!nn)
            break;
        names = nn;
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof(*names), cmp_strings);
    b->p = calloc(n ? n : 1, sizeof(*b->p));
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        fmt(path, sizeof(path), "%s/%s", dir, names[i]);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        struct stat st;
        b->p[b->n].label = names[i];
        if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
            (uint64_t)st.st_size <= SBX_MAX_CODE_BYTES) {
            b->p[b->n].text = malloc((size_t)st.st_size + 1);
            ssize_t got = b->p[b->n].text ? read_full(fd, b->p[b->n].text, (size_t)st.st_size) : -1;
            b->p[b->n].len = got > 0 ? (size_t)got : 0;
        }
        if (fd >= 0)
            close(fd);
        b->n++;
    }
    free(names);
    return 0;
}

static int load_jsonl(struct batch *b, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct line_reader lr;
    const char *line;
    size_t len, cap = 0, lineno = 0;
    enum line_result r;

    if (fd < 0)
        return -errno;
    line_reader_init(&lr, fd, b->o->max_line_bytes);
    while ((r = line_next(&lr, &line, &len)) != LINE_END && r != LINE_ERROR) {
        lineno++;
        if (r == LINE_OK && len == 0)
            continue;
        if (b->n == cap) {
            cap = cap ? cap * 2 : 256;
            struct program *p = realloc(b->p, cap * sizeof(*p));
            if (!p)
                break;
            b->p = p;
        }
        struct program *p = &b->p[b->n++];
        memset(p, 0, sizeof(*p));
        if (asprintf(&p->label, "line %zu", lineno) < 0)
            p->label = NULL;
        p->is_request = true;
        if (r == LINE_OK) {
            p->text = malloc(len + 1);
            if (p->text)
                memcpy(p->text, line, len);
            p->len = len;
        }
    }
    line_reader_free(&lr);
    close(fd);
    return r == LINE_ERROR ? -EIO : 0;
}

static void progress(struct batch *b, bool final)
{
    uint64_t now = now_ns();
    if (!b->tty || (!final && now - b->last_draw_ns < 100000000ULL))
        return;
    b->last_draw_ns = now;
    double secs = (double)(now - b->start_ns) / 1e9;
    int width = 30, fill = b->n ? (int)((double)b->done / (double)b->n * width) : width;
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '=' : ' ';
    bar[width] = '\0';
    double rate = secs > 0 ? (double)b->done / secs : 0.0;
    char eta[32] = "";
    if (!final && rate > 0 && b->done < b->n) {
        double left = (double)(b->n - b->done) / rate;
        fmt(eta, sizeof(eta), "  ETA %dm%02ds", (int)(left / 60), (int)left % 60);
    }
    /* \033[K clears what a longer line drawn before left behind. */
    fprintf(stderr,
            "\r[%s] %zu/%zu  exit 0 %zu  exit non-zero %zu  stopped %zu  refused %zu  %.1f runs/s%s"
            "\033[K%s",
            bar, b->done, b->n, b->by_status[SBX_COMPLETED] - b->failed_code, b->failed_code,
            b->done - b->by_status[SBX_COMPLETED] - b->refused, b->refused, rate, eta,
            final ? "\n" : "");
}

static void record(struct batch *b, size_t i, char *line, const struct sbx_result *res, double ms)
{
    pthread_mutex_lock(&b->lock);
    if (line)
        (void)write_full(b->out_fd, line, strlen(line));
    b->done++;
    if (res) {
        b->by_status[res->status]++;
        b->failed_code += res->status == SBX_COMPLETED && res->exit_code != 0;
        b->wall_ms[i] = ms;
    } else {
        b->refused++;
        b->wall_ms[i] = -1;
    }
    progress(b, false);
    pthread_mutex_unlock(&b->lock);
    free(line);
}

/* The answer line, with the program's label first. The answer's own text
 * follows as it is, so that its id stays as the request wrote it. */
static char *labelled(const char *label, char *answer)
{
    json_t *l = json_string(label ? label : "?");
    char *ltext = l ? json_dumps(l, JSON_ENCODE_ANY) : NULL;
    char *out = NULL;

    json_decref(l);
    if (ltext && answer && answer[0] == '{' &&
        asprintf(&out, "{\"program\":%s,%s", ltext, answer + 1) < 0)
        out = NULL;
    free(ltext);
    free(answer);
    return out;
}

_Static_assert(GIVEN_COUNT == REQUEST_LIMIT_COUNT, "the GIVEN_* bits are the request limits");

static void *worker(void *p)
{
    struct batch *b = p;
    for (;;) {
        pthread_mutex_lock(&b->lock);
        /* Once stopped by a signal, no new program starts. */
        size_t i = b->next < b->n && !sbx_cancel_fired(b->stop) ? b->next++ : SIZE_MAX;
        pthread_mutex_unlock(&b->lock);
        if (i == SIZE_MAX)
            return NULL;
        struct program *pr = &b->p[i];
        struct json_request r;
        struct sbx_result *res = NULL;
        struct sbx_error err = {0};
        char *answer;
        int rc;

        memset(&r, 0, sizeof(r));
        if (!pr->text) {
            rc = sbx_fail(&err, pr->is_request ? SBX_ERR_TOO_LARGE : SBX_ERR_INVALID_REQUEST,
                          -EINVAL, pr->is_request ? "request line too long" : "cannot read it");
        } else if (pr->is_request) {
            rc = json_request_parse(pr->text, pr->len, NULL, &r, &err);
            if (rc == 0)
                rc = json_request_no_session(&r, &err);
            if (rc == 0)
                json_request_default_limits(&r, &b->o->limits, b->o->limits_given);
            if (rc == 0 && r.cancel_text)
                rc = sbx_fail(&err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                              "a cancel message means nothing to a batch");
            if (rc == 0 && (r.req.n_tools || r.is_tool_result))
                rc = sbx_fail(&err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                              "a batch answers no tool calls: host tools are served over JSON "
                              "lines and HTTP");
        } else {
            sbx_request_init(&r.req);
            r.req.code = pr->text;
            r.req.code_len = pr->len;
            r.req.limits = b->o->limits;
            rc = 0;
        }
        r.req.cancel = b->stop;
        uint64_t t0 = now_ns();
        if (rc == 0)
            rc = b->o->backend->run(b->o->backend->self, &r.req, &res, &err);
        double ms = (double)(now_ns() - t0) / 1e6;
        answer = rc == 0 ? json_answer_result(r.id_text, res) : json_answer_error(r.id_text, &err);
        record(b, i, labelled(pr->label, answer), rc == 0 ? res : NULL, ms);
        sbx_result_free(res);
        json_request_free(&r);
    }
}

int batch_main(const struct batch_opts *o)
{
    struct batch b = {.o = o, .out_fd = 1};
    struct stat st;
    int rc;

    if (stat(o->source, &st) < 0) {
        fprintf(stderr, "pysbx batch: %s: %s\n", o->source, strerror(errno));
        return 2;
    }
    /* One program is `pysbx run`'s; batch takes many. */
    size_t sl = strlen(o->source);
    if (!S_ISDIR(st.st_mode) && sl >= 3 && strcmp(o->source + sl - 3, ".py") == 0) {
        fprintf(stderr,
                "pysbx batch: %s is one program: batch wants a directory of .py files or a "
                ".jsonl file of requests (pysbx run runs one program)\n",
                o->source);
        return 2;
    }
    rc = S_ISDIR(st.st_mode) ? load_dir(&b, o->source) : load_jsonl(&b, o->source);
    if (rc < 0) {
        fprintf(stderr, "pysbx batch: %s: %s\n", o->source, strerror(-rc));
        return 2;
    }
    if (o->out_path) {
        b.out_fd = open(o->out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (b.out_fd < 0) {
            fprintf(stderr, "pysbx batch: %s: %s\n", o->out_path, strerror(errno));
            return 2;
        }
    }
    b.wall_ms = calloc(b.n ? b.n : 1, sizeof(double));
    for (size_t i = 0; b.wall_ms && i < b.n; i++)
        b.wall_ms[i] = -1; /* not run (yet): left out of the percentiles */
    b.stop = stopper_start();
    /* The bar goes to stderr when that is a terminal and the result lines do
     * not go to one: on a terminal they would run into it. */
    b.tty = isatty(2) && !isatty(b.out_fd);
    b.start_ns = now_ns();
    pthread_mutex_init(&b.lock, NULL);
    unsigned jobs = o->jobs ? o->jobs : 1;
    pthread_t *th = calloc(jobs, sizeof(*th));
    unsigned started = 0;
    while (th && started < jobs && pthread_create(&th[started], NULL, worker, &b) == 0)
        started++;
    if (started == 0)
        worker(&b); /* no thread to be had: one at a time, here */
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    free(th);
    progress(&b, true);

    double total = (double)(now_ns() - b.start_ns) / 1e9;
    size_t ran = 0;
    for (size_t i = 0; i < b.n; i++)
        if (b.wall_ms[i] >= 0)
            b.wall_ms[ran++] = b.wall_ms[i];
    qsort(b.wall_ms, ran, sizeof(double), cmp_doubles);
    fprintf(stderr, "pysbx batch: %zu programs in %.2f s (%.1f/s), %u at a time, backend %s\n", b.n,
            total, total > 0 ? (double)b.n / total : 0.0, jobs, o->backend->name);
    if (stopper_signal())
        fprintf(stderr, "  stopped by signal %d: %zu programs not started\n", stopper_signal(),
                b.n - b.next);
    fprintf(stderr,
            "  completed %zu (%zu with a non-zero exit code), timeout %zu, "
            "memory_limit %zu, crashed %zu, cancelled %zu, sandbox_error %zu, "
            "refused %zu\n",
            b.by_status[SBX_COMPLETED], b.failed_code, b.by_status[SBX_TIMEOUT],
            b.by_status[SBX_MEMORY_LIMIT], b.by_status[SBX_CRASHED], b.by_status[SBX_CANCELLED],
            b.by_status[SBX_SANDBOX_ERROR], b.refused);
    if (ran)
        fprintf(stderr, "  latency per program: p50 %.2f ms, p99 %.2f ms\n",
                percentile(b.wall_ms, ran, 50), percentile(b.wall_ms, ran, 99));
    rc = b.by_status[SBX_SANDBOX_ERROR] || b.refused ? 1 : 0;
    if (stopper_signal())
        rc = 128 + stopper_signal();
    for (size_t i = 0; i < b.n; i++) {
        free(b.p[i].label);
        free(b.p[i].text);
    }
    free(b.p);
    free(b.wall_ms);
    if (o->out_path)
        close(b.out_fd);
    pthread_mutex_destroy(&b.lock);
    return rc;
}
