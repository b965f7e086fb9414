/*
 * One tenant's worst against another's latency. The template's loop serves
 * every tenant of a sandbox: nothing it does may take time that one tenant
 * sizes. Each test here has a session do what made shared work grow (names
 * of mapped files that read as mappings of their own, forged stacks and
 * unaligned ranges among them, tens of thousands of mappings, a large
 * state, a timer that resumes a stopped state), while another tenant runs
 * print(1) in a loop through the same sandbox;
 * no run of that tenant may wait for the attack (before, they waited
 * seconds), and each attack's own invariant is checked (the branch is an
 * exact copy, a stopped state uses no CPU). The latencies are printed.
 * The last test has another sandbox, in a pid namespace of its own, start
 * and end beside ours: our frozen sessions' cgroup must outlive it.
 *
 * Runs as pid 1 of its own pid namespace (tests/in_pidns.sh), as the other
 * session tests do: it reads the sessions' processes from /proc.
 */
#define _GNU_SOURCE
#include "session_helpers.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#define SBX(state) (((struct fixture *)*(state))->sbx)

/* A run of the other tenant that waits this long waited for the attack:
 * before the fixes here, they waited 2 to 30 s. */
#define STALL_MS 250.0

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* --- the other tenant ------------------------------------------------------- */

struct victim {
    struct sbx *sbx;
    pthread_t thread;
    atomic_bool stop;
    pthread_mutex_t lock;
    double ms[1 << 16];
    size_t n;
    int failed;
};

static void *victim_main(void *p)
{
    struct victim *v = p;
    struct sbx_request req;

    sbx_request_init(&req);
    req.code = "print(1)";
    req.code_len = 8;
    req.limits.wall_seconds = 60;
    while (!atomic_load(&v->stop)) {
        struct sbx_result *res = NULL;
        struct sbx_error err = {0};
        double t = now_ms();
        int rc = sbx_run(v->sbx, &req, &res, &err);
        double took = now_ms() - t;
        pthread_mutex_lock(&v->lock);
        if (rc < 0 || res->status != SBX_COMPLETED || strcmp(res->stdout_text, "1\n") != 0)
            v->failed++;
        else if (v->n < sizeof(v->ms) / sizeof(v->ms[0]))
            v->ms[v->n++] = took;
        pthread_mutex_unlock(&v->lock);
        sbx_result_free(res);
        usleep(2000);
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct latency {
    size_t n;
    double p50, p99, max;
};

/* What the other tenant saw since the last call, and a new count. */
static struct latency victim_take(struct victim *v)
{
    struct latency l = {0};

    pthread_mutex_lock(&v->lock);
    l.n = v->n;
    if (v->n) {
        qsort(v->ms, v->n, sizeof(v->ms[0]), cmp_double);
        l.p50 = v->ms[v->n / 2];
        l.p99 = v->ms[v->n * 99 / 100];
        l.max = v->ms[v->n - 1];
    }
    v->n = 0;
    pthread_mutex_unlock(&v->lock);
    return l;
}

/* The one running, stopped by the test's teardown if the test failed. */
static struct victim *running;

static void victim_end(struct victim *v)
{
    atomic_store(&v->stop, true);
    pthread_join(v->thread, NULL);
    pthread_mutex_destroy(&v->lock);
    free(v);
    running = NULL;
}

static int stop_victim(void **state)
{
    (void)state;
    if (running)
        victim_end(running);
    return 0;
}

static struct victim *victim_start(struct sbx *sbx, struct latency *idle)
{
    struct victim *v = calloc(1, sizeof(*v));

    assert_non_null(v);
    running = v;
    v->sbx = sbx;
    pthread_mutex_init(&v->lock, NULL);
    assert_int_equal(pthread_create(&v->thread, NULL, victim_main, v), 0);
    usleep(1000 * 1000);
    *idle = victim_take(v);
    return v;
}

/* Stops the other tenant and holds what it saw during the attack |what|
 * against what it saw idle: no run waited for the attack. */
static void victim_check(struct victim *v, const struct latency *idle, const char *what)
{
    struct latency l = victim_take(v);
    int failed = v->failed;

    victim_end(v);
    fprintf(stderr,
            "(%s: another tenant's print(1), idle: p50 %.2f ms, p99 %.2f ms; during: n %zu, "
            "p50 %.2f ms, p99 %.2f ms, max %.1f ms)\n",
            what, idle->p50, idle->p99, l.n, l.p50, l.p99, l.max);
    assert_int_equal(failed, 0);
    assert_true(l.n > 0);
    if (l.max > STALL_MS)
        fail_msg("%s: another tenant's run waited %.0f ms", what, l.max);
}

/* --- what /proc says of a session's process --------------------------------- */

/* The mappings ([start, end)) of |pid|, read whole (names of any length). */
static int mappings(pid_t pid, uint64_t (*out)[2], int cap)
{
    char path[64], *line = NULL;
    size_t room = 0;
    int n = 0;

    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    while (getline(&line, &room, f) > 0 && n < cap) {
        unsigned long long lo, hi;
        if (sscanf(line, "%llx-%llx ", &lo, &hi) == 2) {
            out[n][0] = lo;
            out[n][1] = hi;
            n++;
        }
    }
    free(line);
    fclose(f);
    return n;
}

/* A process of |uid| that is stopped (its state, or the next cell made of
 * it: the same mappings), once the session has settled to those two; or 0. */
static pid_t stopped_process_of(uid_t uid)
{
    pid_t pids[16];

    (void)wait_processes_of(uid, 2);
    int n = pids_of(uid, pids, 16);
    for (int i = 0; i < n; i++) {
        char path[64], buf[512];
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pids[i]);
        FILE *f = fopen(path, "re");
        if (!f)
            continue;
        size_t got = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[got] = '\0';
        char *p = strrchr(buf, ')');
        if (p && p[2] == 'T')
            return pids[i];
    }
    return 0;
}

/* The branch maps nothing its origin does not, but the stack its copy was
 * made on (one mapping of 256 KiB, and its stack's pages below the
 * origin's, at most). Mappings are compared as the address space they
 * cover: the branch's copies of the origin's file mappings are anonymous
 * memory, which the kernel joins where they touch. */
static void expect_exact_mappings(uid_t origin, uid_t branch)
{
    static uint64_t a[70000][2], b[70000][2];
    int na = mappings(stopped_process_of(origin), a, 70000);
    int nb = mappings(stopped_process_of(branch), b, 70000);
    int extra = 0, u = 0;

    assert_true(na > 0 && nb > 0);
    /* The origin's, joined where they touch. */
    for (int i = 1; i < na; i++) {
        if (a[i][0] <= a[u][1]) {
            if (a[i][1] > a[u][1])
                a[u][1] = a[i][1];
        } else {
            u++;
            a[u][0] = a[i][0];
            a[u][1] = a[i][1];
        }
    }
    na = u + 1;
    for (int j = 0, i = 0; j < nb; j++) {
        while (i < na && a[i][1] <= b[j][0])
            i++;
        bool inside = i < na && a[i][0] <= b[j][0] && b[j][1] <= a[i][1];
        if (inside)
            continue;
        if (b[j][1] - b[j][0] > (264ULL << 10))
            fail_msg("the branch maps %#llx-%#llx, which its origin does not",
                     (unsigned long long)b[j][0], (unsigned long long)b[j][1]);
        extra++;
    }
    if (extra > 2)
        fail_msg("the branch maps %d small ranges its origin does not", extra);
}

static struct sbx_session *fork_of(struct sbx_session *from, double *took_ms)
{
    struct sbx_session *b = NULL;
    struct sbx_error err = {0};
    double t = now_ms();

    if (sbx_session_fork(from, &b, &err) < 0)
        fail_msg("sbx_session_fork: %s", err.message);
    if (took_ms)
        *took_ms = now_ms() - t;
    return b;
}

/* --- the attacks -------------------------------------------------------------- */

/* ctypes' mmap of a workspace file, private, its descriptor closed: what
 * stays is the mapping, named by the file's path. */
#define MAP_FILE_PY                                                                                \
    "import ctypes, os\n"                                                                          \
    "libc = ctypes.CDLL(None, use_errno=True)\n"                                                   \
    "libc.mmap.restype = ctypes.c_void_p\n"                                                        \
    "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,\n"        \
    "                      ctypes.c_int, ctypes.c_long]\n"                                         \
    "def map_file(name):\n"                                                                        \
    "    os.makedirs(os.path.dirname(name) or '.', exist_ok=True)\n"                               \
    "    with open(name, 'wb') as f:\n"                                                            \
    "        f.write(b'm' * 4096)\n"                                                               \
    "    fd = os.open(name, os.O_RDONLY)\n"                                                        \
    "    p = libc.mmap(None, 4096, 1, 2, fd, 0)\n"                                                 \
    "    os.close(fd)\n"                                                                           \
    "    assert p and p != ctypes.c_void_p(-1).value\n"

/* Names whose tail, wherever a line buffer cuts them (at 512 bytes, or at
 * 4 KiB), reads as a mapping: directories of lengths such that one of the
 * cuts falls in the blanks before the forged text. Paths past PATH_MAX are
 * made a directory at a time; the working directory goes back after. */
static void map_forging_names(struct sbx_session *s, const char *forged)
{
    char code[4096];

    snprintf(code, sizeof(code),
             MAP_FILE_PY "top = os.getcwd()\n"
                         "for k in range(12):\n"
                         "    for deep in (7, 21):\n"
                         "        os.chdir(top)\n"
                         "        for i in range(deep):\n"
                         "            d = 'd' * (60 + 15 * k) + str(deep)\n"
                         "            os.makedirs(d, exist_ok=True)\n"
                         "            os.chdir(d)\n"
                         "        map_file(' ' * 200 + '%s')\n"
                         "os.chdir(top)\n"
                         "x = 41\n",
             forged);
    expect_cell(s, code, "");
}

/* A long name that reads as a mapping of 256 GiB: kept cells (whose pages
 * the template learns, at the first and every 16th) and a branch (which
 * must not map it). */
static void names_that_read_as_mappings_are_names(void **state)
{
    struct latency idle;
    struct victim *v = victim_start(SBX(state), &idle);
    struct sbx_session *a = open_session(SBX(state), NULL);

    map_forging_names(a, "0-4000000000 rw-p 0 0:0 0");
    for (int i = 0; i < 17; i++)
        expect_cell(a, "x += 1", "");
    struct sbx_session *b = fork_of(a, NULL);
    expect_cell(b, "print(x)", "58\n");
    if (geteuid() == 0)
        expect_exact_mappings(session_uid(a), session_uid(b));
    sbx_session_close(b);
    sbx_session_close(a);
    victim_check(v, &idle, "names that read as a 256 GiB mapping");
}

/* For comparison: a tenant that does nothing but compute, ten cells of
 * 100 ms each and a branch, as a tenant may. What the other tenant sees
 * then is the two sharing the machine's CPUs, with no shared part of the
 * sandbox doing anything for either: the attacks above are to be judged
 * against it, not only against idle. */
static void a_tenant_that_only_computes(void **state)
{
    struct latency idle;
    struct victim *v = victim_start(SBX(state), &idle);
    struct sbx_session *a = open_session(SBX(state), NULL);

    for (int i = 0; i < 10; i++)
        expect_cell(a,
                    "import time\nt = time.perf_counter()\n"
                    "while time.perf_counter() - t < 0.1:\n    pass\n",
                    "");
    struct sbx_session *b = fork_of(a, NULL);
    expect_cell(b, "print(round(t) > 0)", "True\n");
    sbx_session_close(b);
    sbx_session_close(a);
    victim_check(v, &idle, "a tenant that only computes (for comparison)");
}

/* For comparison too: a tenant that uses its session as the attacks
 * above do, with nothing hostile in it (cells kept, one at a time, and a
 * branch): what its cells' own processes cost the other tenant on the
 * machine's CPUs. */
static void a_tenant_that_keeps_cells_and_branches(void **state)
{
    struct latency idle;
    struct victim *v = victim_start(SBX(state), &idle);
    struct sbx_session *a = open_session(SBX(state), NULL);

    expect_cell(a, "x = 41", "");
    for (int i = 0; i < 17; i++)
        expect_cell(a, "x += 1", "");
    struct sbx_session *b = fork_of(a, NULL);
    expect_cell(b, "print(x)", "58\n");
    sbx_session_close(b);
    sbx_session_close(a);
    victim_check(v, &idle, "a tenant that keeps cells and branches (for comparison)");
}

/* Names that read as stacks, and as a range that is not page-aligned and
 * ends at the top of the address space: the branch is made, exact. */
static void names_that_read_as_stacks_are_names(void **state)
{
    struct latency idle;
    struct victim *v = victim_start(SBX(state), &idle);
    struct sbx_session *a = open_session(SBX(state), NULL);

    map_forging_names(a, "7f0000000000-7f0001000000 rw-p 0 0:0 0 [stack]");
    map_forging_names(a, "fffffffffffff001-ffffffffffffffff rw-p 0 0:0 0 [stack]");
    double took;
    struct sbx_session *b = fork_of(a, &took);
    expect_cell(b, "print(x)", "41\n");
    if (geteuid() == 0)
        expect_exact_mappings(session_uid(a), session_uid(b));
    fprintf(stderr, "(the branch took %.1f ms)\n", took);
    sbx_session_close(b);
    sbx_session_close(a);
    victim_check(v, &idle, "names that read as stacks");
}

/* 63,000 mappings of a page each, 260 KiB apart (no room between them for
 * the stack a branch's copy is made on), right below the stack, every
 * hundredth written: a branch copies them, and costs the other tenant
 * nothing. */
static void a_state_of_many_mappings_is_branched_off_the_loop(void **state)
{
    struct sbx_session_limits l;
    sbx_session_limits_init(&l);
    l.memory_bytes = 512ULL << 20;
    struct sbx_session *a = open_session(SBX(state), &l);
    struct latency idle;

    expect_cell(a,
                "import ctypes\n"
                "libc = ctypes.CDLL(None, use_errno=True)\n"
                "libc.mmap.restype = ctypes.c_void_p\n"
                "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,\n"
                "                      ctypes.c_int, ctypes.c_int, ctypes.c_long]\n"
                "stack = ctypes.c_void_p.in_dll(libc, 'environ').value\n"
                "n, step = 63000, 260 * 1024\n"
                "base = (stack - (1 << 20) - n * step) & ~0xfff\n"
                "made = []\n"
                "for i in range(n):\n"
                "    at = base + i * step\n"
                "    p = libc.mmap(at, 4096, 3, 0x22 | 0x100000, -1, 0)\n"
                "    if p == at:\n"
                "        made.append(at)\n"
                "assert len(made) > 62000, len(made)\n"
                "for i, at in enumerate(made[::100]):\n"
                "    ctypes.c_int.from_address(at).value = i\n"
                "def total():\n"
                "    return sum(ctypes.c_int.from_address(at).value for at in made)\n"
                "want = sum(range(len(made[::100])))\n",
                "");
    struct victim *v = victim_start(SBX(state), &idle);
    double took;
    struct sbx_session *b = fork_of(a, &took);
    /* Its first cell too: it is made once the branch's pages are all in,
     * which may be after the branch answered. */
    double t = now_ms();
    expect_cell(b, "print(total() == want, total() > 0)", "True True\n");
    victim_check(v, &idle, "a branch of 63,000 mappings, and its first cell");
    fprintf(stderr, "(the branch took %.0f ms, its first cell %.0f ms)\n", took, now_ms() - t);
    sbx_session_close(b);
    sbx_session_close(a);
}

/* A state that read 1 GiB (the zero page, mapped): a branch of it has
 * nothing of it to copy, and the other tenant does not wait. */
static void a_state_that_read_a_lot_is_branched_off_the_loop(void **state)
{
    struct sbx_session_limits l;
    sbx_session_limits_init(&l);
    l.memory_bytes = 5ULL << 28;
    struct sbx_session *a = open_session(SBX(state), &l);
    struct latency idle;

    expect_cell(a,
                "import mmap\n"
                "m = mmap.mmap(-1, 1 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)\n"
                "m.madvise(22)  # MADV_POPULATE_READ\n"
                "m[1 << 20] = 7\n",
                "");
    struct victim *v = victim_start(SBX(state), &idle);
    double took;
    struct sbx_session *b = fork_of(a, &took);
    double t = now_ms();
    expect_cell(b, "print(m[1 << 20], m[(1 << 20) + 1], len(m))", "7 0 1073741824\n");
    victim_check(v, &idle, "a branch of a state that read 1 GiB, and its first cell");
    fprintf(stderr, "(the branch took %.0f ms, its first cell %.0f ms)\n", took, now_ms() - t);
    sbx_session_close(b);
    sbx_session_close(a);
}

/* A kept cell arms a timer that sends SIGCONT every 20 ms to a handler
 * that spins: between cells the state is stopped, and stays so (frozen;
 * where there is no freezer, its session ends when it runs). */
#define SIGCONT_TIMER                                                                              \
    "import ctypes, signal, time\n"                                                                \
    "libc = ctypes.CDLL(None, use_errno=True)\n"                                                   \
    "class sigevent(ctypes.Structure):\n"                                                          \
    "    _fields_ = [('value', ctypes.c_void_p), ('signo', ctypes.c_int),\n"                       \
    "                ('notify', ctypes.c_int), ('pad', ctypes.c_char * 48)]\n"                     \
    "class itimerspec(ctypes.Structure):\n"                                                        \
    "    _fields_ = [('i_s', ctypes.c_long), ('i_ns', ctypes.c_long),\n"                           \
    "                ('v_s', ctypes.c_long), ('v_ns', ctypes.c_long)]\n"                           \
    "HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int)\n"                                             \
    "def spin(sig):\n"                                                                             \
    "    t = time.process_time()\n"                                                                \
    "    while time.process_time() - t < 0.004:\n"                                                 \
    "        pass\n"                                                                               \
    "h = HANDLER(spin)\n"                                                                          \
    "libc.signal(signal.SIGCONT, h)\n"                                                             \
    "ev = sigevent(None, signal.SIGCONT, 0)\n"                                                     \
    "tid = ctypes.c_void_p()\n"                                                                    \
    "assert libc.timer_create(1, ctypes.byref(ev), ctypes.byref(tid)) == 0\n"                      \
    "spec = itimerspec(0, 20000000, 0, 20000000)\n"                                                \
    "assert libc.timer_settime(tid, 0, ctypes.byref(spec), None) == 0\n"

static void a_stopped_state_does_not_run(void **state)
{
    struct sbx_layer_info layers[SBX_LAYER_COUNT];
    struct latency idle;

    sbx_layers(SBX(state), layers);
    bool frozen = layers[__builtin_ctz(SBX_LAYER_FREEZE)].active;
    struct sbx_session *a = open_session(SBX(state), NULL);
    uid_t uid = session_uid(a);
    struct victim *v = victim_start(SBX(state), &idle);
    /* The cell that arms the timer is kept: it is the state now. */
    expect_cell(a, SIGCONT_TIMER, "");
    double cpu = -1;
    /* The next cell is made meanwhile (the kept cell forks it, which then
     * copies pages): that is not between cells. */
    usleep(500 * 1000);
    if (geteuid() == 0) {
        double c0 = cpu_ms_of(uid);
        usleep(2000 * 1000);
        cpu = cpu_ms_of(uid) - c0;
    } else
        usleep(2000 * 1000);
    victim_check(v, &idle, "a stopped state resumed by its own timer");
    fprintf(stderr, "(the session's processes used %.0f ms of CPU in 2 s between cells; %s)\n", cpu,
            frozen ? "frozen" : "no freezer");
    /* Either the state was frozen before its timer fired (it cannot run,
     * and its cells go on), or the timer resumed it before it was frozen,
     * or there is no freezer: the session ended at once, saying why. Or,
     * without a freezer, the stop discarded the timer's SIGCONT before it
     * was delivered, and the kernel does not re-arm a periodic timer whose
     * signal was never delivered: the timer is dead and the state never
     * ran (outside pysbx, a process with such a timer, stopped 300 times
     * at random moments, was never continued by it again 25 times). Its
     * cells go on then, and the state's CPU, read as root, says it did
     * not run. */
    struct sbx_error err = {0};
    int rc;
    struct sbx_result *r =
        cell_full(a, "print('still here')", SBX_ROLLBACK_ON_ERROR, 0, NULL, 0, &rc, &err);
    fprintf(stderr, "(then: %s)\n", rc == 0 ? "its cells go on" : err.message);
    if (rc == 0) {
        if (geteuid() == 0)
            assert_true(cpu < 20.0);
        else
            assert_true(frozen);
        expect_completed(r, 0);
        assert_string_equal(r->stdout_text, "still here\n");
        sbx_result_free(r);
    } else {
        assert_int_equal(err.code, SBX_ERR_SESSION_LOST);
        if (geteuid() == 0)
            assert_true(cpu < 200.0);
    }
    sbx_session_close(a);
    if (geteuid() == 0)
        assert_int_equal(wait_processes_of(uid, 0), 0);
}

/* Each sandbox's frozen sessions live in a cgroup of the sandbox's; one
 * starting removes what sandboxes that are gone left. Another sandbox,
 * started and closed in a pid namespace of its own (where our template's
 * pid names nothing, or another process), must take ours for live: before,
 * it took it for gone and removed it, and no session of ours opened. */
static void another_sandbox_elsewhere_leaves_ours_alone(void **state)
{
    struct sbx_layer_info layers[SBX_LAYER_COUNT];

    sbx_layers(SBX(state), layers);
    if (!layers[__builtin_ctz(SBX_LAYER_FREEZE)].active)
        skip();
    char buf[32] = "";
    int fd = open("/proc/sys/kernel/ns_last_pid", O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0 && read(fd, buf, sizeof(buf) - 1) > 0);
    close(fd);
    pid_t last = (pid_t)atoi(buf) + 64;
    assert_true(last < 1 << 16);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (unshare(CLONE_NEWPID) < 0)
            _exit(77);
        pid_t other = fork();
        if (other == 0) {
            /* Past every pid of ours (the namespace numbers from 1, as
             * ours does): our template's pid names nothing here. */
            for (pid_t p = 0; p <= last && p >= 0;)
                if ((p = fork()) == 0)
                    _exit(0);
                else if (p > 0)
                    waitpid(p, NULL, 0);
            setenv("TENANTS_ONE_SANDBOX", "1", 1);
            execl("/proc/self/exe", "test_tenants", (char *)NULL);
            _exit(127);
        }
        int st = 0;
        while (other > 0 && waitpid(other, &st, 0) < 0)
            ;
        _exit(other > 0 && WIFEXITED(st) ? WEXITSTATUS(st) : 1);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        ;
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 77)
        skip();
    assert_int_equal(WEXITSTATUS(st), 0);
    struct sbx_session *a = open_session(SBX(state), NULL);
    expect_cell(a, "x = 41", "");
    expect_cell(a, "print(x + 1)", "42\n");
    uid_t uid = session_uid(a);
    sbx_session_close(a);
    if (geteuid() == 0)
        assert_int_equal(wait_processes_of(uid, 0), 0);
}

int main(void)
{
    /* The other sandbox of the test above. */
    if (getenv("TENANTS_ONE_SANDBOX")) {
        void *f = NULL;
        return fixture_open(&f) == 0 && fixture_close(&f) == 0 ? 0 : 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(a_tenant_that_only_computes, stop_victim),
        cmocka_unit_test_teardown(a_tenant_that_keeps_cells_and_branches, stop_victim),
        cmocka_unit_test_teardown(names_that_read_as_mappings_are_names, stop_victim),
        cmocka_unit_test_teardown(names_that_read_as_stacks_are_names, stop_victim),
        cmocka_unit_test_teardown(a_state_of_many_mappings_is_branched_off_the_loop, stop_victim),
        cmocka_unit_test_teardown(a_state_that_read_a_lot_is_branched_off_the_loop, stop_victim),
        cmocka_unit_test_teardown(a_stopped_state_does_not_run, stop_victim),
        cmocka_unit_test(another_sandbox_elsewhere_leaves_ours_alone),
    };
    if (getenv("TEST_FILTER"))
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, fixture_open, fixture_close);
}
