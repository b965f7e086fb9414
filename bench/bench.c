/*
 * pysbx-bench: latency and throughput of pysbx against its peers, on one
 * machine, in one run.
 *
 * Each snippet runs through the public C API's backend seam twice: the
 * embedded sandbox, and, interleaved with it, the "python3" backend, which is
 * the reference design's approach: a fresh `python3 -I -S` per run (fork,
 * exec, an empty environment, a temporary working directory with the input
 * files, the same rlimits, bounded output, the files collected and the
 * directory deleted). And the same inside `bwrap` when it is installed. Every
 * figure is wall time around the whole call, as a caller sees it.
 */
#define _GNU_SOURCE
#include "artifacts.h"
#include "outbuf.h"
#include "pysbx.h"
#include "sysutil.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PYTHON3 "/usr/bin/python3"
#define BWRAP   "/usr/bin/bwrap"

static char input_csv[1024];

struct snippet {
    const char *name;
    const char *code;
    bool with_input;
};

static const struct snippet snippets[] = {
    {"print(1)", "print(1)\n", false},
    {"import json", "import json\nprint(json.dumps({'a': [1, 2, 3], 'b': {'c': None}}))\n", false},
    {"small loop", "s = 0\nfor i in range(10000):\n    s += i * i\nprint(s)\n", false},
    {"1 KiB artifact", "open('out.bin', 'wb').write(b'x' * 1024)\n", false},
    {"1 MB output, cut", "import sys\nsys.stdout.write('x' * 1000000)\n", false},
    {"100,000 lines, cut", "for i in range(100000):\n    print(i)\n", false},
    {"read input file", "print(len(open('data.csv').read().splitlines()))\n", true},
};
#define N_SNIPPETS (int)ARRAY_SIZE(snippets)

enum system { SYS_PYSBX, SYS_FLOOR, SYS_PYTHON3, SYS_BWRAP, N_SYSTEMS };
static const char *const system_names[N_SYSTEMS] = {"pysbx", "floor", "python3 -I -S",
                                                    "bwrap python3"};

struct samples {
    double *v;
    size_t n, cap;
};

static void add_sample(struct samples *s, double ms)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        s->v = realloc(s->v, s->cap * sizeof(double));
        if (!s->v)
            abort();
    }
    s->v[s->n++] = ms;
}

static double quantile(struct samples *s, double q)
{
    if (s->n == 0)
        return 0;
    qsort(s->v, s->n, sizeof(double), cmp_doubles);
    size_t i = (size_t)(q * (double)(s->n - 1) + 0.5);
    return s->v[i];
}

static double ms_since(uint64_t t0)
{
    return (double)(now_ns() - t0) / 1e6;
}

/* --- pysbx ----------------------------------------------------------------- */

/* Template start: sbx_open three times, timed; the last sandbox stays open
 * in *last. Returns 0 or -1 having said why. */
static int time_opens(const struct sbx_config *cfg, struct samples *open_ms, struct sbx **last)
{
    struct sbx_error err;

    for (int i = 0; i < 3; i++) {
        uint64_t t0 = now_ns();
        if (sbx_open(cfg, last, &err) < 0) {
            fprintf(stderr, "pysbx-bench: sbx_open: %s\n", err.message);
            return -1;
        }
        add_sample(open_ms, ms_since(t0));
        if (i < 2)
            sbx_close(*last);
    }
    return 0;
}

static struct sbx_file input_file(void)
{
    return (struct sbx_file){"data.csv", input_csv, strlen(input_csv)};
}

static double run_backend(struct sbx_backend *b, const struct snippet *s, int *status)
{
    struct sbx_request req;
    struct sbx_result *res = NULL;
    struct sbx_error err;
    struct sbx_file f = input_file();

    sbx_request_init(&req);
    req.code = s->code;
    req.code_len = strlen(s->code);
    if (s->with_input) {
        req.files = &f;
        req.n_files = 1;
    }
    uint64_t t0 = now_ns();
    int rc = b->run(b->self, &req, &res, &err);
    double ms = ms_since(t0);
    *status = rc < 0 ? -1 : (res->status == SBX_COMPLETED && res->exit_code == 0 ? 0 : 1);
    if (rc == 0 && s->name[0] == '1' && s->name[2] == 'K' && res->n_artifacts != 1)
        *status = 1; /* the artifact must come back */
    sbx_result_free(res);
    return ms;
}

/* --- bwrap around a fresh interpreter per run -------------------------------- */

static void set_rlimit(int r, rlim_t v)
{
    struct rlimit rl = {v, v};
    setrlimit(r, &rl);
}

/* One run the way the reference design does it, inside bwrap, with the same
 * limits and the same files back. Returns the wall time, or a negative
 * value. */
static double run_peer(const struct snippet *s, const char *tmp_root, int *status)
{
    struct sbx_limits l;
    char ws[512];
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    struct outbuf ob_out, ob_err;

    sbx_limits_init(&l);
    uint64_t t0 = now_ns();
    snprintf(ws, sizeof(ws), "%s/peer-XXXXXX", tmp_root);
    if (!mkdtemp(ws) || pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0)
        return -1;
    int wsfd = open(ws, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct sbx_file f = input_file();
    if (s->with_input) {
        int fd = openat(wsfd, f.name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 || write_full(fd, f.data, f.len) < 0)
            return -1;
        close(fd);
    }
    pid_t pid = fork();
    if (pid == 0) {
        char env_home[600], env_tmp[600];
        snprintf(env_home, sizeof(env_home), "HOME=/work");
        snprintf(env_tmp, sizeof(env_tmp), "TMPDIR=/work");
        char *envp[] = {env_home, env_tmp, "LANG=C.UTF-8", NULL};
        int devnull = open("/dev/null", O_RDONLY);
        dup2(devnull, 0);
        dup2(out[1], 1);
        dup2(err[1], 2);
        close_range(3, ~0U, 0);
        setsid();
        if (chdir(ws) < 0)
            _exit(127);
        set_rlimit(RLIMIT_AS, l.memory_bytes);
        set_rlimit(RLIMIT_CPU, (rlim_t)l.cpu_seconds);
        set_rlimit(RLIMIT_FSIZE, 1ULL << 30);
        set_rlimit(RLIMIT_NOFILE, 256);
        set_rlimit(RLIMIT_CORE, 0);
        /* bwrap itself needs more address space than the code's limit. */
        set_rlimit(RLIMIT_AS, RLIM_INFINITY);
        char *argv[] = {"bwrap",
                        "--unshare-all",
                        "--die-with-parent",
                        "--new-session",
                        "--ro-bind",
                        "/usr",
                        "/usr",
                        "--symlink",
                        "usr/lib",
                        "/lib",
                        "--symlink",
                        "usr/lib64",
                        "/lib64",
                        "--symlink",
                        "usr/bin",
                        "/bin",
                        "--ro-bind",
                        "/etc/ld.so.cache",
                        "/etc/ld.so.cache",
                        "--proc",
                        "/proc",
                        "--dev",
                        "/dev",
                        "--bind",
                        ws,
                        "/work",
                        "--chdir",
                        "/work",
                        PYTHON3,
                        "-I",
                        "-S",
                        "-c",
                        (char *)s->code,
                        NULL};
        execve(BWRAP, argv, envp);
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    outbuf_init(&ob_out, l.max_output_chars);
    outbuf_init(&ob_err, l.max_output_chars);
    struct pollfd p[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
    uint64_t deadline = t0 + (uint64_t)(l.wall_seconds * 1e9);
    int open_streams = 2;
    char buf[65536];
    while (open_streams > 0) {
        int left = (int)((deadline - now_ns()) / 1000000);
        if (now_ns() >= deadline) {
            kill(pid, SIGKILL);
            break;
        }
        if (poll(p, 2, left) <= 0)
            continue;
        for (int i = 0; i < 2; i++) {
            if (!p[i].revents)
                continue;
            ssize_t n = read(p[i].fd, buf, sizeof(buf));
            if (n > 0)
                outbuf_feed(i ? &ob_err : &ob_out, buf, (size_t)n);
            else {
                p[i].fd = -1;
                open_streams--;
            }
        }
    }
    int st;
    waitpid(pid, &st, 0);
    size_t len;
    bool cut;
    free(outbuf_finish(&ob_out, &len, &cut));
    free(outbuf_finish(&ob_err, &len, &cut));
    struct artifact_spec spec = {.max_bytes = l.max_artifact_bytes,
                                 .max_count = l.max_artifacts,
                                 .max_total = l.max_artifacts_total_bytes,
                                 .inputs = s->with_input ? &f : NULL,
                                 .n_inputs = s->with_input ? 1u : 0u};
    struct artifact_set arts;
    if (artifacts_collect(wsfd, &spec, artifacts_private_fs(wsfd), &arts) == 0)
        artifact_set_free(&arts);
    close(wsfd);
    close(out[0]);
    close(err[0]);
    int rfd = open(tmp_root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    remove_tree_at(rfd, strrchr(ws, '/') + 1);
    close(rfd);
    double ms = ms_since(t0);
    *status = WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
    return ms;
}

/* --- the floor: pysbx-floor, driven over a pipe (see bench/floor.c) --------- */

struct floor {
    pid_t pid;
    FILE *to, *from;
    char dir[64]; /* its working directory, with the snippets' input file */
};

static int floor_start(struct floor *f, const char *program)
{
    int in[2], out[2];
    char path[128];

    memset(f, 0, sizeof(*f));
    fmt(f->dir, sizeof(f->dir), "/tmp/pysbx-floor-XXXXXX");
    if (!mkdtemp(f->dir))
        return -errno;
    fmt(path, sizeof(path), "%s/data.csv", f->dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 || write_full(fd, input_csv, strlen(input_csv)) < 0)
        return -errno;
    close(fd);
    if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0)
        return -errno;
    f->pid = fork();
    if (f->pid == 0) {
        char *argv[] = {"pysbx-floor", NULL}, *envp[] = {NULL};
        if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0 || chdir(f->dir) < 0)
            _exit(127);
        execve(program, argv, envp);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    if (f->pid < 0)
        return -errno;
    f->to = fdopen(in[1], "w");
    f->from = fdopen(out[0], "r");
    return f->to && f->from ? 0 : -ENOMEM;
}

static double floor_run(struct floor *f, const struct snippet *s, int *status)
{
    double ms = -1;
    int ok = 0;

    fprintf(f->to, "L %zu\n%s", strlen(s->code), s->code);
    fflush(f->to);
    if (fscanf(f->from, "%lf %d", &ms, &ok) != 2)
        ok = 0;
    *status = ok ? 0 : 1;
    return ms;
}

/* |loops| processes forking runs of print(1) for |seconds|. */
static int floor_throughput(struct floor *f, int loops, double seconds, double *rate, double *cpu)
{
    long runs = -1;
    double elapsed = 0, cpu_ms = 0;

    fprintf(f->to, "T %d %.3f %zu\n%s", loops, seconds, strlen(snippets[0].code), snippets[0].code);
    fflush(f->to);
    if (fscanf(f->from, "%ld %lf %lf", &runs, &elapsed, &cpu_ms) != 3 || runs <= 0)
        return -1;
    *rate = (double)runs / elapsed;
    *cpu = cpu_ms / (double)runs;
    return 0;
}

static void floor_stop(struct floor *f)
{
    if (f->to)
        fclose(f->to);
    if (f->from)
        fclose(f->from);
    if (f->pid > 0)
        waitpid(f->pid, NULL, 0);
    if (f->dir[0]) {
        int rfd = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        remove_tree_at(rfd, f->dir + 5);
        close(rfd);
    }
}

/* --- CPU: the kernel's accounting of a process tree -------------------------- */

/* User + system CPU of |root| and every process beneath it but |skip|'s
 * subtree: what each has used, and what its children it reaped used. In
 * clock ticks, as /proc gives it. */
static double tree_cpu_ms(pid_t root, pid_t skip)
{
    struct proc_stat *all = NULL;
    size_t n = 0, cap = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    unsigned long long ticks = 0;

    while (d && (e = readdir(d))) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        if (n == cap && !(all = realloc(all, (cap = cap ? cap * 2 : 512) * sizeof(*all))))
            abort();
        if (proc_stat_read(e->d_name, &all[n]) == 0)
            n++;
    }
    if (d)
        closedir(d);
    /* A process is counted when its chain of parents reaches |root|. */
    for (size_t i = 0; i < n; i++) {
        pid_t p = all[i].pid;
        for (int depth = 0; depth < 16 && p > 1 && p != root && p != skip; depth++) {
            pid_t parent = 0;
            for (size_t j = 0; j < n; j++)
                if (all[j].pid == p)
                    parent = all[j].ppid;
            p = parent;
        }
        if (p == root)
            ticks += all[i].cpu_ticks;
    }
    free(all);
    return (double)ticks * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

/* --- throughput -------------------------------------------------------------- */

struct tp_arg {
    struct sbx_backend *b;
    uint64_t until;
    long runs;
    long failures;
};

static void *tp_worker(void *p)
{
    struct tp_arg *a = p;
    int status;
    while (now_ns() < a->until) {
        run_backend(a->b, &snippets[0], &status);
        if (status == 0)
            a->runs++;
        else
            a->failures++;
    }
    return NULL;
}

/* The throughput windows, in the order each round runs them; |vs| is the
 * floor window a pysbx window is compared with: 1 caller with 1 loop, more
 * callers with one loop per core (main sets that count and the labels). */
static struct tp_config {
    char label[32];
    bool floor;
    int callers;
    int vs;
} tp_configs[] = {
    {"", true, 1, 0}, {"", false, 1, 0}, {"", true, 0, 2}, {"", false, 2, 2}, {"", false, 8, 2},
};
#define N_TP (int)ARRAY_SIZE(tp_configs)

static double throughput(struct sbx_backend *b, int callers, double seconds, long *failures,
                         double *cpu_ms_per_run, pid_t skip)
{
    pthread_t th[64];
    struct tp_arg args[64];
    double cpu0 = tree_cpu_ms(getpid(), skip);
    uint64_t t0 = now_ns();
    long runs = 0;

    *failures = 0;
    for (int i = 0; i < callers; i++) {
        args[i] = (struct tp_arg){b, t0 + (uint64_t)(seconds * 1e9), 0, 0};
        pthread_create(&th[i], NULL, tp_worker, &args[i]);
    }
    for (int i = 0; i < callers; i++) {
        pthread_join(th[i], NULL);
        runs += args[i].runs;
        *failures += args[i].failures;
    }
    double rate = (double)runs / ((double)(now_ns() - t0) / 1e9);
    *cpu_ms_per_run = runs ? (tree_cpu_ms(getpid(), skip) - cpu0) / (double)runs : 0;
    return rate;
}

/* --- memory: what an idle worker does not share with the template ------------ */

static long private_kb(pid_t pid)
{
    char path[64], line[256];
    long total = 0, v;
    snprintf(path, sizeof(path), "/proc/%d/smaps_rollup", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "Private_Clean: %ld", &v) == 1 ||
            sscanf(line, "Private_Dirty: %ld", &v) == 1)
            total += v;
    fclose(f);
    return total;
}

/* --- main ------------------------------------------------------------------- */

static void machine(FILE *out)
{
    struct utsname u;
    char model[256] = "unknown", line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "model name : %255[^\n]", model) == 1)
            break;
    if (f)
        fclose(f);
    uname(&u);
    fprintf(out, "machine: %ld cores, %s, %s %s\n", sysconf(_SC_NPROCESSORS_ONLN), model, u.sysname,
            u.release);
}

/* The plots: per snippet and system, a box from p25 to p75, whiskers to p10
 * and p90, a bar at p50; and throughput with CPU per run, floor and pysbx. */
static void plot(const char *out_dir)
{
    char path[600], cmd[700];

    if (access("/usr/bin/gnuplot", X_OK) != 0) {
        fprintf(stderr, "pysbx-bench: gnuplot not installed; no plot\n");
        return;
    }
    snprintf(path, sizeof(path), "%s/latency.gp", out_dir);
    FILE *gp = fopen(path, "w");
    if (!gp)
        return;
    fprintf(gp,
            "set terminal png size 1200,560\nset output '%s/latency.png'\n"
            "set title 'pysbx-bench: wall time per run (box p25-p75, whiskers "
            "p10-p90, bar p50)' noenhanced\n"
            "set ylabel 'ms (log scale)'\nset logscale y\nset grid ytics\n"
            "set boxwidth 0.2\nset style fill solid 0.4\nset key top left "
            "noenhanced\nset xrange [-0.6:%d.6]\nset xtics (",
            out_dir, N_SNIPPETS - 1);
    for (int s = 0; s < N_SNIPPETS; s++)
        fprintf(gp, "%s'%s' %d", s ? ", " : "", snippets[s].name, s);
    fprintf(gp,
            ") noenhanced\nnames = 'pysbx floor python3 bwrap'\n"
            "plot for [k=0:%d] '%s/quantiles.dat' using ($2==k ? $1+(k-1.5)*0.22 : "
            "1/0):5:4:8:7 with candlesticks whiskerbars lw 1.5 title word(names,k+1), "
            "\\\n  for [k=0:%d] '' using ($2==k ? $1+(k-1.5)*0.22 : 1/0):6:6:6:6 "
            "with candlesticks lt -1 lw 2 notitle\n",
            N_SYSTEMS - 1, out_dir, N_SYSTEMS - 1);
    /* Throughput: bars of runs/s, points of CPU per run on the right axis. */
    fprintf(gp,
            "reset\nset terminal png size 900,480\nset output '%s/throughput.png'\n"
            "set title 'pysbx-bench: throughput of print(1) (bars) and CPU per run (points)' "
            "noenhanced\nset style fill solid 0.5\nset boxwidth 0.6\nset grid ytics\n"
            "set ylabel 'runs/s'\nset y2label 'ms CPU per run'\nset ytics nomirror\n"
            "set y2tics\nset yrange [0:*]\nset y2range [0:*]\nset xtics noenhanced\n"
            "set key top left\n"
            "plot '%s/throughput.dat' using 1:3:xtic(2) with boxes title 'runs/s', "
            "'' using 1:4 axes x1y2 with points pt 7 ps 2 title 'ms CPU/run'\n",
            out_dir, out_dir);
    fclose(gp);
    snprintf(cmd, sizeof(cmd), "gnuplot '%s' 2>&1", path);
    if (system(cmd) != 0)
        fprintf(stderr, "pysbx-bench: gnuplot failed; no plot\n");
}

/* --- data science: numpy, pandas, matplotlib (--packages) ------------------- */

/* The programs of the data-science case. The first is the chart the
 * template's rehearsal also draws (a line of a small table); the second is
 * none of the rehearsal's shape (a CSV read, a pivot table, a bar chart and
 * a histogram on two axes, a layout pass): what warming the idle worker does
 * for code that it did not rehearse. */
struct ds_program {
    const char *name;
    const char *code;
    const char *artifact; /* the one file it writes */
};
static const struct ds_program ds_programs[] = {
    {"chart (a line of a small table)",
     "import numpy as np, pandas as pd, matplotlib.pyplot as plt\n"
     "df = pd.DataFrame({\"x\": np.arange(24), \"y\": np.arange(24) ** 2})\n"
     "print(df.groupby(df.x % 3).y.sum().to_string())\n"
     "plt.plot(df.x, df.y); plt.savefig(\"chart.png\"); plt.close(\"all\")\n",
     "chart.png"},
    {"report (CSV, pivot, bar and histogram)",
     "import io\n"
     "import numpy as np\n"
     "import pandas as pd\n"
     "import matplotlib.pyplot as plt\n"
     "rng = np.random.default_rng(7)\n"
     "csv = 'region,month,sales\\n' + '\\n'.join(f'{r},{m},{rng.integers(50, 500)}'\n"
     "    for r in ('north', 'south', 'east', 'west') for m in range(1, 13))\n"
     "df = pd.read_csv(io.StringIO(csv))\n"
     "pivot = df.pivot_table(index='month', columns='region', values='sales', aggfunc='sum')\n"
     "print(pivot.describe().round(1))\n"
     "fig, (a, b) = plt.subplots(1, 2, figsize=(9, 4))\n"
     "pivot.plot(kind='bar', ax=a, title='sales by month')\n"
     "a.legend(loc='upper left', fontsize=7)\n"
     "b.hist(df.sales, bins=12, color='tab:green')\n"
     "b.set_xlabel('sales')\n"
     "fig.tight_layout()\n"
     "fig.savefig('report.png', dpi=80)\n"
     "plt.close('all')\n",
     "report.png"},
};
#define DS_PROGRAMS (sizeof(ds_programs) / sizeof(ds_programs[0]))
static const char *const ds_packages[] = {"numpy", "pandas", "matplotlib", NULL};

/* The floor: one warm /usr/bin/python3 that imported the packages runs the
 * program again and again, no fork, each time compiled afresh into a fresh
 * namespace with its stdout captured. "r" runs it, "f" times a fork and
 * exit of this interpreter; each answers one line. */
static const char ds_floor[] =
    "import io, os, sys, time\n"
    "import numpy, pandas, matplotlib.pyplot\n"
    "src = sys.stdin.buffer.read(int(sys.stdin.buffer.readline()))\n"
    "out = sys.stdout\n"
    "for line in sys.stdin.buffer:\n"
    "    if line.startswith(b'f'):\n"
    "        t = time.perf_counter(); pid = os.fork()\n"
    "        if pid == 0: os._exit(0)\n"
    "        os.waitpid(pid, 0); out.write('%f\\n' % ((time.perf_counter() - t) * 1e3))\n"
    "    else:\n"
    "        sys.stdout = io.StringIO()\n"
    "        exec(compile(src, '<main>', 'exec'), {'__name__': '__main__'})\n"
    "        n = len(sys.stdout.getvalue()); sys.stdout = out\n"
    "        out.write('ok %d\\n' % n)\n"
    "    out.flush()\n";

enum ds_system { DS_PYSBX, DS_FRESH, DS_FLOOR, DS_N };
static const char *const ds_names[DS_N] = {"pysbx, packages warm", "fresh python3 -I",
                                           "in-process floor"};

struct ds_floor_proc {
    pid_t pid;
    int to, from;
    FILE *in;
};

/* The environment both python3 baselines run with is the one the sandbox's
 * template sets (one-thread pools, the Agg backend), with a matplotlib
 * configuration directory |mpl| kept across runs so that its font cache is
 * built once, not on every fresh run. */
static pid_t ds_spawn(char *const argv[], const char *dir, const char *mpl, int in_fd, int out_fd)
{
    char *env[] = {(char *)mpl,         "MPLBACKEND=Agg", "OPENBLAS_NUM_THREADS=1",
                   "OMP_NUM_THREADS=1", "LANG=C.UTF-8",   NULL};
    pid_t pid = fork();

    if (pid == 0) {
        if ((in_fd >= 0 && dup2(in_fd, 0) < 0) || dup2(out_fd, 1) < 0 || chdir(dir) < 0)
            _exit(127);
        close_range(3, ~0U, 0);
        execve(PYTHON3, argv, env);
        _exit(127);
    }
    return pid;
}

/* A fresh `/usr/bin/python3 -I` running the program in |dir|. */
static double ds_run_fresh(const struct ds_program *prog, const char *dir, const char *mpl,
                           int *status)
{
    char *argv[] = {PYTHON3, "-I", "-c", (char *)prog->code, NULL};
    int p[2];
    char buf[4096];
    int st = -1;

    uint64_t t0 = now_ns();
    if (pipe2(p, O_CLOEXEC) < 0)
        return -1;
    pid_t pid = ds_spawn(argv, dir, mpl, -1, p[1]);
    close(p[1]);
    while (read(p[0], buf, sizeof(buf)) > 0)
        ;
    close(p[0]);
    if (pid > 0)
        waitpid(pid, &st, 0);
    double ms = ms_since(t0);
    *status = pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
    return ms;
}

static int ds_floor_start(struct ds_floor_proc *f, const struct ds_program *p, const char *dir,
                          const char *mpl)
{
    char *argv[] = {PYTHON3, "-I", "-c", (char *)ds_floor, NULL};
    int in[2], out[2];

    if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0)
        return -1;
    f->pid = ds_spawn(argv, dir, mpl, in[0], out[1]);
    close(in[0]);
    close(out[1]);
    f->to = in[1];
    f->from = out[0];
    f->in = fdopen(f->from, "r");
    char head[32];
    int n = snprintf(head, sizeof(head), "%zu\n", strlen(p->code));
    if (f->pid < 0 || !f->in || write_full(f->to, head, (size_t)n) < 0 ||
        write_full(f->to, p->code, strlen(p->code)) < 0)
        return -1;
    return 0;
}

/* One request to the floor process: its answer line in |line|. */
static double ds_floor_ask(struct ds_floor_proc *f, char what, char *line, size_t cap)
{
    char req[2] = {what, '\n'};
    uint64_t t0 = now_ns();

    if (write_full(f->to, req, 2) < 0 || !fgets(line, (int)cap, f->in))
        return -1;
    return ms_since(t0);
}

static void ds_floor_stop(struct ds_floor_proc *f)
{
    close(f->to);
    if (f->in)
        fclose(f->in);
    if (f->pid > 0)
        waitpid(f->pid, NULL, 0);
}

static double ds_run_pysbx(struct sbx *sbx, const struct ds_program *p, int *status)
{
    struct sbx_request req;
    struct sbx_result *res = NULL;
    struct sbx_error err;

    sbx_request_init(&req);
    req.code = p->code;
    req.code_len = strlen(p->code);
    uint64_t t0 = now_ns();
    int rc = sbx_run(sbx, &req, &res, &err);
    double ms = ms_since(t0);
    *status = rc == 0 && res->status == SBX_COMPLETED && res->exit_code == 0 &&
                      res->n_artifacts == 1 && strcmp(res->artifacts[0].name, p->artifact) == 0
                  ? 0
                  : 1;
    sbx_result_free(res);
    return ms;
}

/* The idle workers' private memory, median, in KiB. */
static double idle_private_kb(void)
{
    pid_t workers[64], template_pid = 0;
    struct samples priv = {0};

    proc_children(getpid(), "pysbx-template", &template_pid, 1, NULL);
    int n = proc_children(template_pid, "pysbx-worker", workers, 64, NULL);
    for (int i = 0; i < n && i < 64; i++) {
        long kb = private_kb(workers[i]);
        if (kb >= 0)
            add_sample(&priv, (double)kb);
    }
    double kb = quantile(&priv, 0.5);
    free(priv.v);
    return kb;
}

/* The data-science case alone: pysbx with the packages warm, a fresh
 * python3 and the in-process floor, interleaved in a rotating order. */
static int bench_packages(int iterations, const char *tmpl, const char *out_dir)
{
    struct sbx_config cfg;
    struct sbx *sbx = NULL;
    char beside[4096], dir[] = "/tmp/pysbx-bench-ds-XXXXXX", mpl[600], line[128];
    struct samples lat[DS_PROGRAMS][DS_N] = {{{0}}}, open_ms = {0}, fork_ms = {0};
    struct ds_floor_proc floor[DS_PROGRAMS];
    long failures[DS_PROGRAMS][DS_N] = {{0}}, failed = 0;
    double priv_kb = 0;
    int st;

    if (!mkdtemp(dir))
        return 1;
    snprintf(mpl, sizeof(mpl), "MPLCONFIGDIR=%s/mpl", dir);
    sbx_config_init(&cfg);
    cfg.template_path = tmpl ? tmpl : beside_self("pysbx-template", beside, sizeof(beside));
    cfg.packages = ds_packages;
    if (time_opens(&cfg, &open_ms, &sbx) < 0)
        return 1;
    usleep(1000000); /* let the pool fill */
    priv_kb = idle_private_kb();
    (void)ds_run_fresh(&ds_programs[0], dir, mpl, &st); /* the font cache, once */
    for (size_t p = 0; p < DS_PROGRAMS; p++) {
        floor[p] = (struct ds_floor_proc){.pid = -1, .to = -1, .from = -1};
        if (ds_floor_start(&floor[p], &ds_programs[p], dir, mpl) < 0 ||
            ds_floor_ask(&floor[p], 'r', line, sizeof(line)) < 0) {
            fprintf(stderr, "pysbx-bench: the in-process floor did not start\n");
            return 1;
        }
    }
    /* Each program in turn, its systems interleaved in a rotating order. */
    for (size_t p = 0; p < DS_PROGRAMS; p++)
        for (int it = 0; it < iterations; it++)
            for (int k = 0; k < DS_N; k++) {
                enum ds_system sys = (enum ds_system)((k + it) % DS_N);
                double ms = sys == DS_PYSBX   ? ds_run_pysbx(sbx, &ds_programs[p], &st)
                            : sys == DS_FRESH ? ds_run_fresh(&ds_programs[p], dir, mpl, &st)
                                              : ds_floor_ask(&floor[p], 'r', line, sizeof(line));
                if (sys == DS_FLOOR)
                    st = ms < 0 || strncmp(line, "ok ", 3) != 0;
                add_sample(&lat[p][sys], ms);
                failures[p][sys] += st != 0;
                failed += st != 0;
            }
    for (int i = 0; i < 20; i++) {
        double ms = ds_floor_ask(&floor[0], 'f', line, sizeof(line));
        if (ms >= 0)
            add_sample(&fork_ms, atof(line));
    }
    for (size_t p = 0; p < DS_PROGRAMS; p++)
        ds_floor_stop(&floor[p]);
    sbx_close(sbx);

    char path[700];
    snprintf(path, sizeof(path), "%s/packages.txt", out_dir);
    FILE *sum = fopen(path, "w");
    FILE *outs[2] = {stdout, sum};
    for (int o = 0; o < 2; o++) {
        FILE *f = outs[o];
        if (!f)
            continue;
        machine(f);
        fprintf(f, "numpy + pandas + matplotlib programs; %d iterations per program and system\n",
                iterations);
        for (size_t p = 0; p < DS_PROGRAMS; p++) {
            double pysbx = quantile(&lat[p][DS_PYSBX], 0.5);
            fprintf(f, "\n%s\n", ds_programs[p].name);
            fprintf(f, "%-22s %9s %9s %9s %9s\n", "system", "min ms", "p50 ms", "p90 ms",
                    "vs pysbx");
            for (int k = 0; k < DS_N; k++) {
                double p50 = quantile(&lat[p][k], 0.5);
                fprintf(f, "%-22s %9.1f %9.1f %9.1f %8.2fx\n", ds_names[k], quantile(&lat[p][k], 0),
                        p50, quantile(&lat[p][k], 0.9), p50 / pysbx);
            }
            fprintf(f, "failed runs: pysbx %ld, fresh python3 %ld, floor %ld\n",
                    failures[p][DS_PYSBX], failures[p][DS_FRESH], failures[p][DS_FLOOR]);
        }
        fprintf(f, "\npackage template start (sbx_open): median %.0f ms of 3\n",
                quantile(&open_ms, 0.5));
        fprintf(f, "fork + exit of a warm python3 with the packages: median %.1f ms of %zu\n",
                quantile(&fork_ms, 0.5), fork_ms.n);
        fprintf(f, "idle worker private memory (package template): median %.0f KiB\n", priv_kb);
    }
    if (sum)
        fclose(sum);
    for (size_t p = 0; p < DS_PROGRAMS; p++)
        for (int k = 0; k < DS_N; k++)
            free(lat[p][k].v);
    free(open_ms.v);
    free(fork_ms.v);
    int rfd = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    remove_tree_at(rfd, dir + 5);
    close(rfd);
    return failed ? 1 : 0;
}

/* --- sessions (--sessions) ---------------------------------------------------- */

static double plain_run(struct sbx *sbx, const char *code, bool *ok)
{
    struct sbx_request req;
    struct sbx_result *res = NULL;
    struct sbx_error err;

    sbx_request_init(&req);
    req.code = code;
    req.code_len = strlen(code);
    uint64_t t0 = now_ns();
    int rc = sbx_run(sbx, &req, &res, &err);
    double ms = ms_since(t0);
    *ok = rc == 0 && res->status == SBX_COMPLETED && res->exit_code == 0;
    sbx_result_free(res);
    return ms;
}

static struct sbx_session *bench_session_sized(struct sbx *sbx, uint64_t memory)
{
    struct sbx_session_limits l;
    struct sbx_session *s = NULL;
    struct sbx_error err;

    sbx_session_limits_init(&l);
    l.memory_bytes = memory;
    if (sbx_session_open(sbx, &l, &s, &err) < 0)
        fprintf(stderr, "pysbx-bench: sbx_session_open: %s\n", err.message);
    return s;
}

static struct sbx_session *bench_session(struct sbx *sbx)
{
    return bench_session_sized(sbx, 1ULL << 30);
}

/* Branches of a state that wrote 1 GiB: fewer (each copies it). */
#define HUGE_FORKS 5
/* Sessions branched once each. */
#define FIRST_FORKS 10

#define SESSION_CELLS 100
/* Between cells of a conversation there is the model's turn; in the bench
 * a pause stands for it (where said). */
#define THINK_US 50000

/* The minor page faults of a cell (copies of the state's pages, among
 * others), from inside: its getrusage before and after |code|. */
static const char faults_wrap[] = "import resource as _r\n"
                                  "_f = _r.getrusage(_r.RUSAGE_SELF).ru_minflt\n"
                                  "%s\n"
                                  "print(_r.getrusage(_r.RUSAGE_SELF).ru_minflt - _f)\n";

/* One cell, timed as its caller sees it; *ok when it completed and was
 * kept. With |faults|, the code is wrapped to count its page faults. */
static double session_cell_faults(struct sbx_session *s, const char *code, bool *ok, long *faults)
{
    char wrapped[512];
    struct sbx_request req;
    struct sbx_result *res = NULL;
    struct sbx_error err;

    if (faults)
        snprintf(wrapped, sizeof(wrapped), faults_wrap, code);
    sbx_request_init(&req);
    req.code = faults ? wrapped : code;
    req.code_len = strlen(req.code);
    req.limits.memory_bytes = 1ULL << 30;
    uint64_t t0 = now_ns();
    int rc = sbx_session_run(s, &req, SBX_ROLLBACK_ON_ERROR, &res, &err);
    double ms = ms_since(t0);
    *ok = rc == 0 && res->status == SBX_COMPLETED && res->exit_code == 0 && !res->rolled_back;
    if (faults)
        *faults = *ok ? atol(res->stdout_text) : 0;
    sbx_result_free(res);
    return ms;
}

static double session_cell(struct sbx_session *s, const char *code, bool *ok)
{
    return session_cell_faults(s, code, ok, NULL);
}

/* A branch, timed, as a thread of its own may make it. */
struct fork_job {
    struct sbx_session *from, *b;
    int rc;
    double ms;
    struct sbx_error err;
    atomic_bool done;
};

static void *fork_in_thread(void *p)
{
    struct fork_job *j = p;
    uint64_t t0 = now_ns();

    j->rc = sbx_session_fork(j->from, &j->b, &j->err);
    j->ms = ms_since(t0);
    atomic_store(&j->done, true);
    return NULL;
}

/* A branch of |from| after the pause, timed into |lat|; NULL (said, and
 * counted in *failed) if it failed. */
static struct sbx_session *paused_fork(struct sbx_session *from, struct samples *lat, long *failed)
{
    struct fork_job job = {.from = from};

    usleep(THINK_US);
    fork_in_thread(&job);
    if (job.rc < 0) {
        fprintf(stderr, "pysbx-bench: sbx_session_fork: %s\n", job.err.message);
        (*failed)++;
        return NULL;
    }
    add_sample(lat, job.ms);
    return job.b;
}

/* Images (sbx_session_save, sbx_session_restore) of each state, made
 * afresh each time. */
#define IMAGE_ROUNDS 10

/* A session that ran |code| written to the file |path|, then closed (what
 * hibernating it is: *save_ms); after a pause, a session restored from it
 * and its first cell (what its next cell is: *wake_ms). Returns 0, or -1
 * having said why. */
static int image_round(struct sbx *sbx, const char *code, const char *path, double *save_ms,
                       double *wake_ms)
{
    struct sbx_session *s = bench_session(sbx), *r = NULL;
    struct sbx_error err;
    bool ok;
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600), rc = -1;

    if (!s || fd < 0 || (session_cell(s, code, &ok), !ok)) {
        fprintf(stderr, "pysbx-bench: a state to write: %s\n", fd < 0 ? strerror(errno) : "failed");
        goto out;
    }
    usleep(THINK_US);
    uint64_t t0 = now_ns();
    rc = sbx_session_save(s, fd, &err);
    sbx_session_close(s);
    s = NULL;
    *save_ms = ms_since(t0);
    if (rc < 0) {
        fprintf(stderr, "pysbx-bench: sbx_session_save: %s\n", err.message);
        goto out;
    }
    usleep(THINK_US);
    t0 = now_ns();
    if (lseek(fd, 0, SEEK_SET) < 0 || (rc = sbx_session_restore(sbx, NULL, fd, &r, &err)) < 0) {
        fprintf(stderr, "pysbx-bench: sbx_session_restore: %s\n", err.message);
        rc = -1;
        goto out;
    }
    session_cell(r, "small.append(len(small))", &ok);
    *wake_ms = ms_since(t0);
    rc = ok ? 0 : -1;
out:
    sbx_session_close(s);
    sbx_session_close(r);
    if (fd >= 0)
        close(fd);
    unlink(path);
    return rc;
}

/* Sessions: cells of a growing list against plain runs of the same code,
 * interleaved; then, with a pause before each cell, cells of a small and a
 * 200 MB state; the 200 MB state's cells back to back; and cells that
 * replace a tenth of its items (counting the pages each copies). */
static int bench_sessions(int iterations, const char *tmpl, const char *out_dir)
{
    enum {
        SMALL,
        PLAIN,
        KEPT2,
        KEPT64,
        ROLLBACK,
        ROLLBACK_KEPT,
        SMALL_PAUSED,
        BIG_PAUSED,
        BIG_BACK,
        BIG_WRITE,
        FORK_FIRST,
        FORK_SMALL,
        FORK_BIG,
        FORK_BIG_CELL,
        FORK_BIG_BUSY,
        PLAIN_DURING,
        FORK_HUGE,
        FORK_HUGE_CELL,
        SAVE_SMALL,
        WAKE_SMALL,
        SAVE_100,
        WAKE_100,
        N_S
    };
    static const char *const names[N_S] = {
        "cell, small state",         "plain run (sbx_run)",        "cell, 2 kept files",
        "cell, 64 kept files",       "rolled back, then a cell",   "... with 2 kept files",
        "cell, small state, paused", "cell, 200 MB, paused",       "cell, 200 MB, back to back",
        "cell replacing 1/10 of it", "a small state's 1st branch", "branch, small state",
        "branch, 200 MB state",      "a 200 MB branch's 1st cell", "branch, 200 MB, runs on",
        "plain run, 200 MB branch",  "branch, 1 GiB state",        "a 1 GiB branch's 1st cell",
        "save+close, small state",   "restore+1st cell, small",    "save+close, wrote 100 MB",
        "restore+1st cell, 100 MB"};
    struct samples lat[N_S] = {{0}}, faults[N_S] = {{0}};
    long failures[N_S] = {0};
    struct sbx_config cfg;
    struct sbx_error err;
    struct sbx *sbx = NULL;
    char beside[4096];
    bool ok;
    long f;

    sbx_config_init(&cfg);
    cfg.template_path = tmpl ? tmpl : beside_self("pysbx-template", beside, sizeof(beside));
    if (sbx_open(&cfg, &sbx, &err) < 0) {
        fprintf(stderr, "pysbx-bench: sbx_open: %s\n", err.message);
        return 1;
    }
    usleep(500000); /* let the pool fill */
    int sessions = iterations / SESSION_CELLS > 0 ? iterations / SESSION_CELLS : 1;
    /* The same cells in sessions whose state keeps files open (a sqlite3
     * connection and a log; 64 files): each cell gets its own descriptions
     * of them. */
    static const char *const opening[3] = {
        "rows = []",
        "import sqlite3\nc = sqlite3.connect('db.sqlite')\nlog = open('log.txt', 'a')\nrows = []",
        "fs = [open('f%02d' % i, 'w') for i in range(64)]\nrows = []"};
    static const int kinds[4] = {SMALL, PLAIN, KEPT2, KEPT64};
    for (int k = 0; k < sessions; k++) {
        struct sbx_session *s[3] = {bench_session(sbx), bench_session(sbx), bench_session(sbx)};
        if (!s[0] || !s[1] || !s[2])
            return 1;
        for (int m = 0; m < 3; m++)
            failures[kinds[m ? m + 1 : 0]] += (session_cell(s[m], opening[m], &ok), !ok);
        for (int i = 0; i < SESSION_CELLS; i++) {
            /* In turn, which goes first turning each time. */
            for (int j = 0; j < 4; j++) {
                int kind = kinds[(i + j) % 4];
                double ms = kind == PLAIN ? plain_run(sbx, "rows = []\nrows.append(len(rows))", &ok)
                                          : session_cell(s[kind == SMALL   ? 0
                                                           : kind == KEPT2 ? 1
                                                                           : 2],
                                                         "rows.append(len(rows))", &ok);
                add_sample(&lat[kind], ms);
                failures[kind] += !ok;
            }
        }
        /* A cell rolled back, and the one after it (a state that keeps
         * files forks the next cell only once the files are put back). */
        for (int i = 0; i < SESSION_CELLS / 5; i++)
            for (int m = 0; m < 2; m++) {
                usleep(THINK_US);
                double ms = session_cell(s[m], "rows.append(0)\nraise ValueError", &ok);
                failures[m ? ROLLBACK_KEPT : ROLLBACK] += ok;
                ms += session_cell(s[m], "rows.append(len(rows))", &ok);
                add_sample(&lat[m ? ROLLBACK_KEPT : ROLLBACK], ms);
                failures[m ? ROLLBACK_KEPT : ROLLBACK] += !ok;
            }
        for (int m = 0; m < 3; m++)
            sbx_session_close(s[m]);
    }
    /* A small state and a 200 MB one (a list of 5.6 million distinct ints,
     * 36 bytes each), cells alternating between them, a pause before
     * each. */
    struct sbx_session *small = bench_session(sbx), *big = bench_session(sbx);
    if (!small || !big)
        return 1;
    uint64_t t0 = now_ns();
    failures[BIG_PAUSED] += (session_cell(big,
                                          "big = list(range(1000, 5601000))\n"
                                          "zeros = [0] * len(big[::10])\nsmall = []",
                                          &ok),
                             !ok);
    double build_ms = ms_since(t0);
    failures[SMALL_PAUSED] += (session_cell(small, "small = []", &ok), !ok);
    for (int i = 0; i < SESSION_CELLS; i++)
        for (int j = 0; j < 2; j++) {
            int which = (i + j) % 2 == 0 ? SMALL_PAUSED : BIG_PAUSED;
            usleep(THINK_US);
            add_sample(&lat[which], session_cell_faults(which == BIG_PAUSED ? big : small,
                                                        "small.append(len(small))", &ok, &f));
            add_sample(&faults[which], (double)f);
            failures[which] += !ok;
        }
    for (int i = 0; i < SESSION_CELLS; i++) {
        add_sample(&lat[BIG_BACK], session_cell_faults(big, "small.append(len(small))", &ok, &f));
        add_sample(&faults[BIG_BACK], (double)f);
        failures[BIG_BACK] += !ok;
    }
    /* A tenth of the list's items replaced (one slice assignment, in C):
     * its pointers rewritten and the old ints freed, which writes their
     * pages. */
    for (int i = 0; i < SESSION_CELLS / 5; i++) {
        usleep(THINK_US);
        add_sample(&lat[BIG_WRITE], session_cell_faults(big, "big[::10] = zeros", &ok, &f));
        add_sample(&faults[BIG_WRITE], (double)f);
        failures[BIG_WRITE] += !ok;
    }
    /* The first branch of each of FIRST_FORKS small states (a session
     * opened, one cell, the pause, the branch): what a caller that
     * branches a session once waits. */
    for (int i = 0; i < FIRST_FORKS; i++) {
        struct sbx_session *once = bench_session(sbx);
        if (!once)
            return 1;
        failures[FORK_FIRST] += (session_cell(once, "small = []", &ok), !ok);
        sbx_session_close(paused_fork(once, &lat[FORK_FIRST], &failures[FORK_FIRST]));
        sbx_session_close(once);
    }
    /* Branches (sbx_session_fork) of both states, a pause before each:
     * the call until the branch is ready; then, of the 200 MB one, its
     * first cell. Each branch is closed before the next. */
    for (int i = 0; i < SESSION_CELLS / 5; i++)
        for (int j = 0; j < 2; j++) {
            int which = (i + j) % 2 == 0 ? FORK_SMALL : FORK_BIG;
            struct fork_job job = {.from = which == FORK_BIG ? big : small};
            usleep(THINK_US);
            /* A big branch in a thread of its own, and plain runs meanwhile:
             * what the others wait while it is copied. */
            pthread_t thread;
            bool threaded = which == FORK_BIG && i % 2 &&
                            pthread_create(&thread, NULL, fork_in_thread, &job) == 0;
            if (threaded) {
                while (!atomic_load(&job.done)) {
                    double run_ms = plain_run(sbx, "pass", &ok);
                    if (!atomic_load(&job.done))
                        add_sample(&lat[PLAIN_DURING], run_ms);
                    failures[PLAIN_DURING] += !ok;
                }
                pthread_join(thread, NULL);
            } else
                fork_in_thread(&job);
            struct sbx_session *b = job.b;
            int rc = job.rc;
            double ms = job.ms;
            err = job.err;
            if (rc < 0) {
                fprintf(stderr, "pysbx-bench: sbx_session_fork: %s\n", err.message);
                failures[which]++;
                continue;
            }
            add_sample(&lat[threaded ? FORK_BIG_BUSY : which], ms);
            if (which == FORK_BIG) {
                usleep(THINK_US);
                add_sample(&lat[FORK_BIG_CELL],
                           session_cell_faults(b, "small.append(len(small))", &ok, &f));
                add_sample(&faults[FORK_BIG_CELL], (double)f);
                failures[FORK_BIG_CELL] += !ok;
            }
            sbx_session_close(b);
        }
    /* A state that wrote 1 GiB (every page of a bytearray), branched. */
    struct sbx_session *huge = bench_session_sized(sbx, 3ULL << 30);
    if (!huge)
        return 1;
    failures[FORK_HUGE] +=
        (session_cell(huge, "huge = bytearray(b'x') * (1 << 30)\nsmall = []", &ok), !ok);
    for (int i = 0; i < HUGE_FORKS; i++) {
        struct sbx_session *b = paused_fork(huge, &lat[FORK_HUGE], &failures[FORK_HUGE]);
        if (!b)
            continue;
        usleep(THINK_US);
        add_sample(&lat[FORK_HUGE_CELL],
                   session_cell_faults(b, "small.append(len(small))", &ok, &f));
        add_sample(&faults[FORK_HUGE_CELL], (double)f);
        failures[FORK_HUGE_CELL] += !ok;
        sbx_session_close(b);
    }
    sbx_session_close(huge);
    /* Images of a small state and of one that wrote 100 MB (every page
     * of a bytearray), alternating: in a file beside the results. */
    char image[700];
    snprintf(image, sizeof(image), "%s/session-image.tmp", out_dir);
    for (int i = 0; i < IMAGE_ROUNDS; i++)
        for (int j = 0; j < 2; j++) {
            bool hundred = (i + j) % 2 == 1;
            double save_ms = 0, wake_ms = 0;
            int rc = image_round(sbx,
                                 hundred ? "b = bytearray(b'x') * (100 * 1000 * 1000)\nsmall = []"
                                         : "small = []",
                                 image, &save_ms, &wake_ms);
            failures[hundred ? SAVE_100 : SAVE_SMALL] += rc < 0;
            if (rc == 0) {
                add_sample(&lat[hundred ? SAVE_100 : SAVE_SMALL], save_ms);
                add_sample(&lat[hundred ? WAKE_100 : WAKE_SMALL], wake_ms);
            }
        }
    long state_kb = 0;
    {
        struct sbx_request req;
        struct sbx_result *res = NULL;
        sbx_request_init(&req);
        req.code = "import resource\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)";
        req.code_len = strlen(req.code);
        req.limits.memory_bytes = 1ULL << 30;
        if (sbx_session_run(big, &req, SBX_ROLLBACK_ON_ERROR, &res, &err) == 0)
            state_kb = atol(res->stdout_text);
        sbx_result_free(res);
    }
    sbx_session_close(big);
    sbx_session_close(small);
    sbx_close(sbx);

    char path[700];
    snprintf(path, sizeof(path), "%s/sessions.txt", out_dir);
    FILE *sum = fopen(path, "w");
    FILE *outs[2] = {stdout, sum};
    double plain = quantile(&lat[PLAIN], 0.5);
    long failed = 0;
    for (int k = 0; k < N_S; k++)
        failed += failures[k];
    for (int o = 0; o < 2; o++) {
        FILE *out = outs[o];
        if (!out)
            continue;
        machine(out);
        fprintf(out,
                "%d sessions of %d cells (rows.append(len(rows))) interleaved with plain runs "
                "of the same code and with the same cells of sessions that keep files open (a "
                "sqlite3\nconnection and a log; 64 files); in each session with none and with "
                "2, %d cells that raise (rolled back), each timed with the cell after it;\n"
                "then a small and a 200 MB state, %d cells each, alternating, "
                "%d ms before each cell;\nthe 200 MB state's cells back to back; %d cells "
                "replacing a tenth of its items;\nthe first branch of each of %d small states (a "
                "session, one cell, the pause);\n%d branches (sbx_session_fork) of each state, "
                "alternating, the same pause before each, and the 200 MB branches' first cells;\n"
                "half of the 200 MB branches made while plain runs of 'pass' go on back to back;\n"
                "%d branches of a state that wrote 1 GiB, and their first cells;\n"
                "%d images (sbx_session_save to a file, then close) of a small state and of one "
                "that wrote 100 MB,\nalternating, each restored (sbx_session_restore) and its "
                "first cell run, the pause before each\n\n",
                sessions, SESSION_CELLS, SESSION_CELLS / 5, SESSION_CELLS, THINK_US / 1000,
                SESSION_CELLS / 5, FIRST_FORKS, SESSION_CELLS / 5, HUGE_FORKS, IMAGE_ROUNDS);
        fprintf(out, "%-28s %8s %8s %8s %8s %11s %12s\n", "", "min ms", "p50 ms", "p99 ms", "n",
                "p50/plain", "faults p50");
        for (int k = 0; k < N_S; k++) {
            fprintf(out, "%-28s %8.3f %8.3f %8.3f %8zu %10.2fx", names[k], quantile(&lat[k], 0),
                    quantile(&lat[k], 0.5), quantile(&lat[k], 0.99), lat[k].n,
                    quantile(&lat[k], 0.5) / plain);
            if (faults[k].n)
                fprintf(out, " %12.0f", quantile(&faults[k], 0.5));
            fputc('\n', out);
        }
        fprintf(out, "faults: minor page faults inside the cell (4 KiB each), copies of the "
                     "state's pages among them\n");
        fprintf(out, "the 200 MB state: built in %.0f ms, its process's peak RSS %ld MiB\n",
                build_ms, state_kb / 1024);
        fprintf(out, "failed cells or runs: %ld\n", failed);
    }
    if (sum)
        fclose(sum);
    for (int k = 0; k < N_S; k++) {
        free(lat[k].v);
        free(faults[k].v);
    }
    return failed ? 1 : 0;
}

static void usage(void)
{
    fputs("usage: pysbx-bench [--iterations N] [--throughput-seconds S] [--throughput-rounds R]\n"
          "                   [--out DIR] [--template PATH] [--no-peers] [--without LAYER,...]\n"
          "                   [--packages] [--sessions]\n"
          "Latency of each snippet through pysbx, the floor (pysbx-floor: the template's\n"
          "interpreter forked per run, nothing else) and the peers (a fresh python3 -I -S\n"
          "per run, and bwrap around it when installed), interleaved; throughput and CPU\n"
          "per run with 1, 2 and 8 callers against the floor's forking loops, in R rounds\n"
          "of S seconds each; template start time; an idle worker's private memory.\n"
          "Writes DIR/samples.csv, DIR/throughput.csv, DIR/summary.txt and (with\n"
          "gnuplot) DIR/latency.png and DIR/throughput.png.\n"
          "--without turns layers off (sbx_config.disable_layers), to measure what each\n"
          "costs; never a deployment setting.\n"
          "--packages runs the data-science case instead: two numpy, pandas and matplotlib\n"
          "programs (a chart like the rehearsal's, a report unlike it) through pysbx with\n"
          "the packages warm, a fresh /usr/bin/python3 -I\n"
          "and the in-process floor (one warm python3 running it again, no fork),\n"
          "interleaved; writes DIR/packages.txt.\n"
          "--sessions runs the session case instead: cells of 100-cell sessions that\n"
          "append to a list, against plain runs, interleaved (N/100 sessions); then\n"
          "cells in a 200 MB state, the first branch (sbx_session_fork) of each of 10\n"
          "small states, and branches of a small and of the 200 MB state; then images\n"
          "(sbx_session_save, then close; sbx_session_restore and the first cell) of a\n"
          "small state and of one that wrote 100 MB; writes DIR/sessions.txt.\n",
          stdout);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"iterations", required_argument, NULL, 'n'},
        {"throughput-seconds", required_argument, NULL, 't'},
        {"throughput-rounds", required_argument, NULL, 'r'},
        {"out", required_argument, NULL, 'o'},
        {"template", required_argument, NULL, 'T'},
        {"no-peers", no_argument, NULL, 'P'},
        {"without", required_argument, NULL, 'W'},
        {"packages", no_argument, NULL, 'K'},
        {"sessions", no_argument, NULL, 'S'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int iterations = 200;
    double tp_seconds = 3.0;
    int tp_rounds = 3;
    const char *out_dir = "bench/results";
    const char *tmpl = NULL;
    bool peers = true, packages = false, sessions = false;
    unsigned without = 0;
    int c;

    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'n':
            iterations = atoi(optarg);
            break;
        case 't':
            tp_seconds = atof(optarg);
            break;
        case 'r':
            tp_rounds = atoi(optarg);
            break;
        case 'o':
            out_dir = optarg;
            break;
        case 'T':
            tmpl = optarg;
            break;
        case 'P':
            peers = false;
            break;
        case 'K':
            packages = true;
            break;
        case 'S':
            sessions = true;
            break;
        case 'W':
            for (char *save = NULL, *tok = strtok_r(optarg, ",", &save); tok;
                 tok = strtok_r(NULL, ",", &save)) {
                enum sbx_layer l = sbx_layer_from_name(tok);
                if (!l) {
                    fprintf(stderr, "pysbx-bench: no layer called %s\n", tok);
                    return 2;
                }
                without |= l;
            }
            break;
        case 'h':
            usage();
            return 0;
        default:
            usage();
            return 2;
        }
    }
    if (iterations < 1 || tp_seconds <= 0 || tp_rounds < 1) {
        usage();
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    mkdir(out_dir, 0755);
    for (int i = 0; i < N_TP; i++) {
        struct tp_config *t = &tp_configs[i];
        if (t->floor && t->callers == 0)
            t->callers = (int)sysconf(_SC_NPROCESSORS_ONLN);
        fmt(t->label, sizeof(t->label), "%s, %d %s%s", t->floor ? "floor" : "pysbx", t->callers,
            t->floor ? "loop" : "caller", t->callers > 1 ? "s" : "");
    }
    if (packages)
        return bench_packages(iterations, tmpl, out_dir);
    if (sessions)
        return bench_sessions(iterations, tmpl, out_dir);
    for (int i = 0; i < 32; i++) {
        char row[32];
        snprintf(row, sizeof(row), "%d,item-%d,%d\n", i, i, i * 7);
        strcat(input_csv, row);
    }

    bool have[N_SYSTEMS] = {true, true, peers && access(PYTHON3, X_OK) == 0,
                            peers && access(BWRAP, X_OK) == 0};
    if (peers && have[SYS_BWRAP]) {
        /* bwrap needs user namespaces or privileges; try it once. */
        int st;
        char tmp[] = "/tmp/pysbx-bench-probe-XXXXXX";
        if (!mkdtemp(tmp))
            return 1;
        run_peer(&snippets[0], tmp, &st);
        rmdir(tmp);
        have[SYS_BWRAP] = st == 0;
    }

    /* The floor first: a process of its own, forked before any thread. */
    struct floor floor;
    char floor_path[4096];
    if (!beside_self("pysbx-floor", floor_path, sizeof(floor_path)) ||
        floor_start(&floor, floor_path) < 0) {
        fprintf(stderr, "pysbx-bench: cannot start pysbx-floor beside the bench\n");
        return 1;
    }

    struct sbx_config cfg;
    struct sbx_error err;
    struct sbx *sbx = NULL;
    char beside[4096];
    sbx_config_init(&cfg);
    cfg.template_path = tmpl ? tmpl : beside_self("pysbx-template", beside, sizeof(beside));
    cfg.disable_layers = without;
    if (without)
        cfg.required_layers = 0;
    struct samples open_ms = {0};
    if (time_opens(&cfg, &open_ms, &sbx) < 0)
        return 1;
    usleep(500000); /* let the pool fill */

    /* Idle workers' private memory. */
    pid_t workers[64], template_pid = 0;
    proc_children(getpid(), "pysbx-template", &template_pid, 1, NULL);
    int n_workers = proc_children(template_pid, "pysbx-worker", workers, 64, NULL);
    if (n_workers > 64)
        n_workers = 64;
    struct samples priv = {0};
    for (int i = 0; i < n_workers; i++) {
        long kb = private_kb(workers[i]);
        if (kb >= 0)
            add_sample(&priv, (double)kb);
    }
    char py_version[32], sc_version[32];
    fmt(py_version, sizeof(py_version), "%s", sbx_python_version(sbx));
    fmt(sc_version, sizeof(sc_version), "%s", sbx_libseccomp_version(sbx));
    sbx_close(sbx);

    /* The runs themselves go through the backend seam, as a front end's do. */
    struct sbx_backend embedded, python3 = {0};
    if (sbx_backend_open("embedded", &cfg, &embedded, &err) < 0 ||
        (have[SYS_PYTHON3] && sbx_backend_open("python3", &cfg, &python3, &err) < 0)) {
        fprintf(stderr, "pysbx-bench: %s\n", err.message);
        return 1;
    }
    usleep(500000); /* let the pool fill */

    char tmp_root[] = "/tmp/pysbx-bench-XXXXXX";
    if (!mkdtemp(tmp_root))
        return 1;
    char path[600];
    snprintf(path, sizeof(path), "%s/samples.csv", out_dir);
    FILE *csv = fopen(path, "w");
    if (!csv) {
        fprintf(stderr, "pysbx-bench: %s: %s\n", path, strerror(errno));
        return 1;
    }
    fprintf(csv, "system,snippet,iteration,wall_ms,ok\n");
    struct samples lat[N_SYSTEMS][N_SNIPPETS];
    long failures[N_SYSTEMS] = {0};
    memset(lat, 0, sizeof(lat));
    for (int it = 0; it < iterations; it++) {
        for (int s = 0; s < N_SNIPPETS; s++) {
            /* Interleaved, in an order that rotates, so that the ratio
             * holds on a noisy machine. */
            for (int k = 0; k < N_SYSTEMS; k++) {
                enum system sys = (enum system)((k + it + s) % N_SYSTEMS);
                if (!have[sys])
                    continue;
                int st = 0;
                double ms = sys == SYS_PYSBX     ? run_backend(&embedded, &snippets[s], &st)
                            : sys == SYS_FLOOR   ? floor_run(&floor, &snippets[s], &st)
                            : sys == SYS_PYTHON3 ? run_backend(&python3, &snippets[s], &st)
                                                 : run_peer(&snippets[s], tmp_root, &st);
                add_sample(&lat[sys][s], ms);
                failures[sys] += st != 0;
                fprintf(csv, "%s,%s,%d,%.4f,%d\n", system_names[sys], snippets[s].name, it, ms,
                        st == 0);
            }
        }
    }
    fclose(csv);

    /* Throughput of print(1), in rounds that alternate the floor and pysbx,
     * each window the same length; the median of the rounds. */
    struct samples tp_rate[N_TP], tp_cpu[N_TP];
    long tp_fail = 0, floor_fail = 0;
    memset(tp_rate, 0, sizeof(tp_rate));
    memset(tp_cpu, 0, sizeof(tp_cpu));
    snprintf(path, sizeof(path), "%s/throughput.csv", out_dir);
    FILE *tcsv = fopen(path, "w");
    if (tcsv)
        fprintf(tcsv, "round,system,callers,runs_per_s,cpu_ms_per_run\n");
    for (int r = 0; r < tp_rounds; r++) {
        for (int i = 0; i < N_TP; i++) {
            double rate = 0, cpu = 0;
            long fails = 0;
            if (tp_configs[i].floor) {
                if (floor_throughput(&floor, tp_configs[i].callers, tp_seconds, &rate, &cpu) < 0)
                    floor_fail++;
            } else {
                rate = throughput(&embedded, tp_configs[i].callers, tp_seconds, &fails, &cpu,
                                  floor.pid);
                tp_fail += fails;
            }
            add_sample(&tp_rate[i], rate);
            add_sample(&tp_cpu[i], cpu);
            if (tcsv)
                fprintf(tcsv, "%d,%s,%d,%.1f,%.4f\n", r, tp_configs[i].floor ? "floor" : "pysbx",
                        tp_configs[i].callers, rate, cpu);
        }
    }
    if (tcsv)
        fclose(tcsv);

    snprintf(path, sizeof(path), "%s/summary.txt", out_dir);
    FILE *sum = fopen(path, "w");
    FILE *outs[2] = {stdout, sum};
    snprintf(path, sizeof(path), "%s/quantiles.dat", out_dir);
    FILE *q = fopen(path, "w");
    for (int o = 0; o < 2; o++) {
        FILE *f = outs[o];
        if (!f)
            continue;
        machine(f);
        fprintf(f, "python: %s, libseccomp %s; %d iterations per snippet and system\n\n",
                py_version, sc_version, iterations);
        fprintf(f, "%-18s %-14s %9s %9s %9s %22s\n", "snippet", "system", "p50 ms", "p90 ms",
                "p99 ms", "vs pysbx (p50)");
        for (int s = 0; s < N_SNIPPETS; s++) {
            double base = quantile(&lat[SYS_PYSBX][s], 0.5);
            double floor50 = quantile(&lat[SYS_FLOOR][s], 0.5);
            double floor99 = quantile(&lat[SYS_FLOOR][s], 0.99);
            for (int k = 0; k < N_SYSTEMS; k++) {
                if (!have[k])
                    continue;
                double p50 = quantile(&lat[k][s], 0.5), p99 = quantile(&lat[k][s], 0.99);
                char ratio[48] = "";
                if (k == SYS_PYSBX)
                    snprintf(ratio, sizeof(ratio), "%.2fx floor (p99 %.2fx)", p50 / floor50,
                             p99 / floor99);
                else
                    snprintf(ratio, sizeof(ratio), "%.1fx", p50 / base);
                fprintf(f, "%-18s %-14s %9.3f %9.3f %9.3f %22s\n", k ? "" : snippets[s].name,
                        system_names[k], p50, quantile(&lat[k][s], 0.9), p99, ratio);
            }
        }
        fprintf(f,
                "\nthroughput of print(1), median of %d rounds of %.1f s, interleaved; CPU per "
                "run is user + system of every process involved (the kernel's accounting)\n",
                tp_rounds, tp_seconds);
        for (int i = 0; i < N_TP; i++) {
            char ratio[64] = "";
            double rate = quantile(&tp_rate[i], 0.5), cpu = quantile(&tp_cpu[i], 0.5);
            if (!tp_configs[i].floor) {
                int fl = tp_configs[i].vs;
                snprintf(ratio, sizeof(ratio), "%.2fx the floor's (%s), CPU %.2fx",
                         rate / quantile(&tp_rate[fl], 0.5), tp_configs[fl].label,
                         cpu / quantile(&tp_cpu[fl], 0.5));
            }
            fprintf(f, "  %-24s %7.0f runs/s %8.3f ms CPU/run  %s\n", tp_configs[i].label, rate,
                    cpu, ratio);
        }
        fprintf(f, "template start (sbx_open): median %.1f ms of 3\n", quantile(&open_ms, 0.5));
        fprintf(f,
                "idle worker private memory (Private_Clean + Private_Dirty): median %.0f KiB "
                "of %zu workers\n",
                quantile(&priv, 0.5), priv.n);
        fprintf(f, "failed runs: pysbx %ld, floor %ld, python3 %ld, bwrap %ld; throughput %ld\n",
                failures[SYS_PYSBX], failures[SYS_FLOOR] + floor_fail, failures[SYS_PYTHON3],
                failures[SYS_BWRAP], tp_fail);
    }
    if (sum)
        fclose(sum);
    /* One line per snippet and system: index, p10, p25, p50, p75, p90. */
    for (int s = 0; q && s < N_SNIPPETS; s++)
        for (int k = 0; k < N_SYSTEMS; k++)
            if (have[k])
                fprintf(q, "%d %d \"%s\" %.4f %.4f %.4f %.4f %.4f\n", s, k, snippets[s].name,
                        quantile(&lat[k][s], 0.1), quantile(&lat[k][s], 0.25),
                        quantile(&lat[k][s], 0.5), quantile(&lat[k][s], 0.75),
                        quantile(&lat[k][s], 0.9));
    if (q)
        fclose(q);
    snprintf(path, sizeof(path), "%s/throughput.dat", out_dir);
    FILE *tdat = fopen(path, "w");
    for (int i = 0; tdat && i < N_TP; i++)
        fprintf(tdat, "%d \"%s\" %.1f %.4f\n", i, tp_configs[i].label, quantile(&tp_rate[i], 0.5),
                quantile(&tp_cpu[i], 0.5));
    if (tdat)
        fclose(tdat);
    for (int k = 0; k < N_SYSTEMS; k++)
        for (int s = 0; s < N_SNIPPETS; s++)
            free(lat[k][s].v);
    for (int i = 0; i < N_TP; i++) {
        free(tp_rate[i].v);
        free(tp_cpu[i].v);
    }
    free(open_ms.v);
    free(priv.v);
    embedded.close(embedded.self);
    if (python3.close)
        python3.close(python3.self);
    floor_stop(&floor);
    int rfd = open("/tmp", O_RDONLY | O_DIRECTORY);
    remove_tree_at(rfd, tmp_root + 5);
    close(rfd);
    plot(out_dir);
    return failures[SYS_PYSBX] || failures[SYS_FLOOR] || floor_fail ? 1 : 0;
}
