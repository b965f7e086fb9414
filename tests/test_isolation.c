/*
 * Isolation between runs and from the host, tried as an attacker would:
 * one run against another running beside it, and a run against the host's
 * files, processes and limits. Through the public API only; each test
 * asserts what the caller sees and that the host and the other run are
 * untouched.
 *
 * Runs as pid 1 of its own pid namespace (tests/in_pidns.sh), like the
 * escape suite.
 */
#define _GNU_SOURCE
#include "helpers.h"
#include "session_helpers.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SBX(state) (((struct fixture *)*(state))->sbx)

static bool is_root;

/* --- two runs at once ------------------------------------------------------- */

/* A run in a thread of its own that says "ready" on stdout once it holds
 * what it wants to hold, then keeps it for a while. */
struct bg_run {
    struct sbx *sbx;
    const char *code;
    struct sbx_limits limits;
    struct sbx_result *res;
    pthread_t th;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool ready, done;
    char said[256]; /* the first line it printed */
    size_t said_len;
};

static void bg_output(void *user, int stream, const char *text, size_t len)
{
    struct bg_run *b = user;

    if (stream != 1)
        return;
    pthread_mutex_lock(&b->lock);
    if (b->said_len + len < sizeof(b->said)) {
        memcpy(b->said + b->said_len, text, len);
        b->said_len += len;
        b->said[b->said_len] = '\0';
    }
    if (strstr(b->said, "ready\n"))
        b->ready = true;
    pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->lock);
}

static void *bg_main(void *p)
{
    struct bg_run *b = p;
    struct sbx_request req;
    struct sbx_error err;

    sbx_request_init(&req);
    req.code = b->code;
    req.code_len = strlen(b->code);
    req.limits = b->limits;
    req.on_output = bg_output;
    req.user = b;
    if (test_run(b->sbx, &req, &b->res, &err) < 0) {
        fprintf(stderr, "the run in the background was refused: %s\n", err.message);
        b->res = NULL;
    }
    pthread_mutex_lock(&b->lock);
    b->done = true;
    pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->lock);
    return NULL;
}

static void bg_start(struct bg_run *b, struct sbx *sbx, const char *code, double wall)
{
    memset(b, 0, sizeof(*b));
    b->sbx = sbx;
    b->code = code;
    sbx_limits_init(&b->limits);
    b->limits.wall_seconds = wall;
    b->limits.memory_bytes = 1ULL << 30;
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->cond, NULL);
    assert_int_equal(pthread_create(&b->th, NULL, bg_main, b), 0);
    pthread_mutex_lock(&b->lock);
    while (!b->ready && !b->done)
        pthread_cond_wait(&b->cond, &b->lock);
    pthread_mutex_unlock(&b->lock);
    if (!b->ready)
        fail_msg("the first run ended before it was ready: %s\n%s",
                 b->res ? b->res->stdout_text : "(refused)", b->res ? b->res->stderr_text : "");
}

/* Waits for it; its result is b->res. */
static void bg_finish(struct bg_run *b)
{
    pthread_join(b->th, NULL);
    pthread_mutex_destroy(&b->lock);
    pthread_cond_destroy(&b->cond);
    assert_non_null(b->res);
}

static void expect_out(struct sbx_result *r, const char *want)
{
    expect_completed(r, 0);
    if (strcmp(r->stdout_text, want) != 0)
        fail_msg("stdout:\n%s\nexpected:\n%s\nstderr:\n%s", r->stdout_text, want, r->stderr_text);
    sbx_result_free(r);
}

/* --- per-uid quotas ------------------------------------------------------- */

static void pending_signal_quota_of_one_run_leaves_others_alone(void **state)
{
    /* POSIX timers each hold a queued signal, counted per uid against
     * RLIMIT_SIGPENDING: exhaust it. */
    struct bg_run a;
    bg_start(&a, SBX(state),
             "import ctypes, time\n"
             "libc = ctypes.CDLL(None, use_errno=True)\n"
             "t = ctypes.c_void_p()\n"
             "n = 0\n"
             "while libc.timer_create(1, None, ctypes.byref(t)) == 0:\n"
             "    n += 1\n"
             "print('exhausted' if ctypes.get_errno() == 11 and n > 1000 else n, flush=True)\n"
             "print('ready', flush=True)\n"
             "time.sleep(2)\n",
             30);
    /* Another run starts, gets its CPU limit armed and honoured, and can
     * make timers of its own. */
    expect_out(run_code(SBX(state), "import ctypes\n"
                                    "libc = ctypes.CDLL(None, use_errno=True)\n"
                                    "t = ctypes.c_void_p()\n"
                                    "print(libc.timer_create(1, None, ctypes.byref(t)))\n"),
               "0\n");
    struct sbx_limits l;
    sbx_limits_init(&l);
    l.cpu_seconds = 0.2;
    struct sbx_result *r = run_with(SBX(state), "while True: pass\n", &l, NULL, 0);
    assert_int_equal(r->status, SBX_TIMEOUT);
    assert_int_equal(r->limit, SBX_LIMIT_CPU);
    sbx_result_free(r);
    bg_finish(&a);
    if (!strstr(a.res->stdout_text, "exhausted"))
        fail_msg("the first run did not exhaust its quota: %s", a.res->stdout_text);
    expect_out(a.res, "exhausted\nready\n");
}

static void thread_quota_of_one_run_leaves_others_alone(void **state)
{
    struct bg_run a;
    bg_start(&a, SBX(state),
             "import threading, time\n"
             "threading.stack_size(65536)\n"
             "stop = threading.Event()\n"
             "n = 0\n"
             "try:\n"
             "    while n < 5000:\n"
             "        threading.Thread(target=stop.wait, daemon=True).start()\n"
             "        n += 1\n"
             "except RuntimeError:\n"
             "    pass\n"
             "print('capped' if 1000 < n < 5000 else n, flush=True)\n"
             "print('ready', flush=True)\n"
             "time.sleep(2)\n"
             "stop.set()\n",
             30);
    /* Python 3.13 keeps a finished thread's stack (8 MiB by default) until
     * it is joined: 50 of them are more address space than the default
     * memory limit, whatever the other run does. */
    expect_out(run_code(SBX(state),
                        "import threading\n"
                        "threading.stack_size(1 << 20)\n"
                        "ts = [threading.Thread(target=lambda: None) for _ in range(50)]\n"
                        "[t.start() for t in ts]\n[t.join() for t in ts]\n"
                        "print('50 threads')\n"),
               "50 threads\n");
    bg_finish(&a);
    expect_out(a.res, "capped\nready\n");
}

static void prio_user_cannot_renice_other_runs(void **state)
{
    struct bg_run a;
    bg_start(&a, SBX(state),
             "import os, time\n"
             "print('ready', flush=True)\n"
             "time.sleep(1)\n"
             "print(os.getpriority(os.PRIO_PROCESS, 0))\n",
             10);
    expect_out(run_code(SBX(state), "import os\n"
                                    "for which in (os.PRIO_USER, os.PRIO_PGRP):\n"
                                    "    try:\n"
                                    "        os.setpriority(which, 0, 19)\n"
                                    "        print('reniced')\n"
                                    "    except PermissionError:\n"
                                    "        print('refused')\n"
                                    "os.setpriority(os.PRIO_PROCESS, 0, 5)\n"
                                    "print(os.getpriority(os.PRIO_PROCESS, os.getpid()))\n"),
               "refused\nrefused\n5\n");
    bg_finish(&a);
    /* The other run, and the next one, are at the default priority. */
    expect_out(a.res, "ready\n0\n");
    expect_out(run_code(SBX(state), "import os\nprint(os.getpriority(os.PRIO_PROCESS, 0))\n"),
               "0\n");
}

static void each_run_has_its_own_uid(void **state)
{
    struct bg_run a;
    bg_start(&a, SBX(state),
             "import os, time\nprint(os.getuid())\nprint('ready', flush=True)\n"
             "time.sleep(1)\n",
             10);
    struct sbx_result *b = run_code(SBX(state), "import os\nprint(os.getuid(), os.getgid())\n");
    expect_completed(b, 0);
    bg_finish(&a);
    unsigned ua = 0, ub = 0, gb = 0;
    assert_int_equal(sscanf(a.res->stdout_text, "%u", &ua), 1);
    assert_int_equal(sscanf(b->stdout_text, "%u %u", &ub, &gb), 2);
    sbx_result_free(a.res);
    sbx_result_free(b);
    /* Not root, the ids are the caller's (or subordinate ones): say so
     * rather than pass without looking. */
    if (!is_root)
        skip();
    assert_true(ua != ub);
    assert_true(ua != 0 && ub != 0 && gb != 0);
}

/* --- sibling workspaces ----------------------------------------------------- */

static void sibling_workspace_cannot_be_seen_or_changed(void **state)
{
    /* The first run leaves a file and reports where its workspace is on
     * the host; the second, knowing that, tries everything. */
    struct bg_run a;
    bg_start(&a, SBX(state),
             "import os, time\n"
             "open('mine', 'w').write('untouched')\n"
             "st = os.stat('.')\n"
             "print(os.getuid(), flush=True)\n"
             "print('ready', flush=True)\n"
             "time.sleep(1.5)\n"
             "st2 = os.stat('.')\n"
             "print(oct(st2.st_mode & 0o7777), st2.st_mtime_ns == st.st_mtime_ns)\n",
             10);
    unsigned uid = 0;
    assert_int_equal(sscanf(a.said, "%u", &uid), 1);
    /* The host path of the first workspace: w<uid> in the work directory
     * (the one pysbx-XXXXXX under the fixture's root). */
    char work[512] = "", ws[600], code[4096];
    DIR *d = opendir(((struct fixture *)*state)->root);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strncmp(e->d_name, "pysbx-", 6) == 0 && strlen(e->d_name) == 12)
            snprintf(work, sizeof(work), "%s/%s", ((struct fixture *)*state)->root, e->d_name);
    if (d)
        closedir(d);
    assert_true(work[0] != '\0');
    snprintf(ws, sizeof(ws), "%s/w%u", work, uid);
    /* Under the private root a workspace is a tmpfs mounted nowhere on the
     * host: nothing at that path. Without it, the directory is there. The
     * second run tries the path either way. */
    struct stat before;
    if (stat(ws, &before) < 0)
        assert_int_equal(errno, ENOENT);
    snprintf(code, sizeof(code),
             "import os\n"
             "seen = []\n"
             "for t in ('%s', '%s/mine', '/w%u', '/workspace/../w%u'):\n"
             "    for name, f in (('stat', os.stat), ('statvfs', os.statvfs),\n"
             "                    ('listdir', os.listdir),\n"
             "                    ('chmod', lambda p: os.chmod(p, 0)),\n"
             "                    ('utime', lambda p: os.utime(p, (0, 0))),\n"
             "                    ('readlink', os.readlink)):\n"
             "        try:\n"
             "            f(t)\n"
             "            seen.append((name, t))\n"
             "        except OSError:\n"
             "            pass\n"
             "print(seen)\n",
             ws, ws, uid, uid);
    expect_out(run_code(SBX(state), code), "[]\n");
    bg_finish(&a);
    /* The first run's workspace is as it left it: mode, times, its file. */
    struct sbx_result *r = a.res;
    expect_completed(r, 0);
    assert_non_null(strstr(r->stdout_text, "0o700 True\n"));
    assert_int_equal(r->n_artifacts, 1);
    assert_string_equal(r->artifacts[0].name, "mine");
    assert_memory_equal(r->artifacts[0].data, "untouched", 9);
    sbx_result_free(r);
}

/* --- the host --------------------------------------------------------------- */

static void host_files_cannot_even_be_statted(void **state)
{
    expect_out(run_code(SBX(state),
                        "import os\n"
                        "seen = []\n"
                        "for p in ('/etc/shadow', '/etc/hostname', '/root', '/home', '/usr/bin',\n"
                        "          '/proc/self/mountinfo', '/proc/self/cgroup', '/proc/1',\n"
                        "          '/sys/fs/cgroup', '/var', '/boot', '/run'):\n"
                        "    try:\n"
                        "        os.stat(p)\n"
                        "        seen.append(p)\n"
                        "    except OSError:\n"
                        "        pass\n"
                        "print(seen)\n"),
               "[]\n");
}

static void host_processes_are_out_of_reach(void **state)
{
    /* pid 1 of this namespace is this test program; in a real deployment
     * it would be the host's init. Asked through every call that takes a
     * pid, the answer is the same refusal. */
    expect_out(run_code(SBX(state),
                        "import os, signal\n"
                        "calls = {\n"
                        "  'getsid': lambda: os.getsid(1),\n"
                        "  'getpgid': lambda: os.getpgid(1),\n"
                        "  'getpriority': lambda: os.getpriority(os.PRIO_PROCESS, 1),\n"
                        "  'setpriority': lambda: os.setpriority(os.PRIO_PROCESS, 1, 10),\n"
                        "  'sched_getaffinity': lambda: os.sched_getaffinity(1),\n"
                        "  'sched_setaffinity': lambda: os.sched_setaffinity(1, {0}),\n"
                        "  'sched_getparam': lambda: os.sched_getparam(1),\n"
                        "  'sched_getscheduler': lambda: os.sched_getscheduler(1),\n"
                        "  'sched_rr_get_interval': lambda: os.sched_rr_get_interval(1),\n"
                        "  'kill': lambda: os.kill(1, 0),\n"
                        "  'pidfd_open': lambda: os.pidfd_open(1),\n"
                        "}\n"
                        "print(sorted(calls))\n"
                        "reached = []\n"
                        "for k, f in calls.items():\n"
                        "    try:\n"
                        "        f()\n"
                        "        reached.append(k)\n"
                        "    except PermissionError:\n"
                        "        pass\n"
                        "print(reached)\n"
                        "os.getsid(0); os.getpgid(0); os.sched_getaffinity(0)\n"
                        "os.sched_getaffinity(os.getpid()); os.getpriority(os.PRIO_PROCESS, 0)\n"
                        "print('own ok')\n"),
               "['getpgid', 'getpriority', 'getsid', 'kill', 'pidfd_open', "
               "'sched_getaffinity', 'sched_getparam', 'sched_getscheduler', "
               "'sched_rr_get_interval', 'sched_setaffinity', 'setpriority']\n[]\nown ok\n");
}

static void cpu_limit_survives_deleted_timers_and_ignored_sigxcpu(void **state)
{
    struct sbx_limits l;
    sbx_limits_init(&l);
    l.cpu_seconds = 0.1;
    l.wall_seconds = 10;
    struct sbx_result *r = run_with(SBX(state),
                                    "import ctypes, signal\n"
                                    "signal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
                                    "libc = ctypes.CDLL(None)\n"
                                    "for t in range(256):\n"
                                    "    libc.timer_delete(ctypes.c_void_p(t))\n"
                                    "while True:\n"
                                    "    pass\n",
                                    &l, NULL, 0);
    if (r->status != SBX_TIMEOUT || r->limit != SBX_LIMIT_CPU)
        fail_msg("expected timeout/cpu, got %s: %s", sbx_status_name(r->status), r->reason);
    /* Exactly: under the limit plus 50 ms (a timer tick and a kill), past
     * what the worker spent before the code started, which cpu_ms counts
     * too (tens of ms in a package sandbox on a slow machine): the most a
     * run of `pass` costs here, of three. */
    double start = 0;
    for (int i = 0; i < 3; i++) {
        struct sbx_result *p = run_code(SBX(state), "pass\n");
        if (p->cpu_ms > start)
            start = p->cpu_ms;
        sbx_result_free(p);
    }
    if (r->cpu_ms > start + 150.0)
        fail_msg("ran %.1f ms of CPU under a 100 ms limit (a run of pass: %.1f ms)", r->cpu_ms,
                 start);
    sbx_result_free(r);
}

static void page_cache_probes_are_refused(void **state)
{
    expect_out(run_code(SBX(state), "import os, errno\n"
                                    "import json\nfd = os.open(json.__file__, os.O_RDONLY)\n"
                                    /* advice is accepted and does nothing */
                                    "print(os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED))\n"
                                    "buf = bytearray(4096)\n"
                                    "try:\n"
                                    "    os.preadv(fd, [buf], 0, os.RWF_NOWAIT)\n"
                                    "    print('probed')\n"
                                    "except OSError as e:\n"
                                    "    print(e.errno == errno.EOPNOTSUPP)\n"
                                    "print(os.preadv(fd, [buf], 0) > 0)\n"
                                    "r, w = os.pipe()\n"
                                    "try:\n"
                                    "    os.splice(fd, w, 4096)\n"
                                    "    print('spliced')\n"
                                    "except PermissionError:\n"
                                    "    print('splice refused')\n"),
               "None\nTrue\nTrue\nsplice refused\n");
}

static void ordinary_os_functions_fail_instead_of_killing(void **state)
{
    expect_out(run_code(SBX(state), "import os\n"
                                    "try:\n"
                                    "    os.chroot('/missing')\n"
                                    "except OSError as e:\n"
                                    "    print(type(e).__name__)\n"),
               "PermissionError\n");
}

static void code_finds_itself(void **state)
{
    /* Each worker's uid has a name of its own, which looks up that uid and
     * not a sibling's: chown by name (shutil.chown, tarfile) works on the
     * code's own files. Two runs: consecutive workers never share a uid,
     * so at least one of them is not the first of the range. */
    for (int i = 0; i < 2; i++)
        expect_out(run_code(SBX(state),
                            "import os, pwd, grp, getpass, pathlib, shutil\n"
                            "home = pathlib.Path.home()\n"
                            "print(home == pathlib.Path(os.getcwd()), os.path.expanduser('~') == "
                            "str(home))\n"
                            "me = getpass.getuser()\n"
                            "pw = pwd.getpwuid(os.getuid())\n"
                            "print(me.startswith('sandbox'), me == pw.pw_name, "
                            "pw.pw_dir == str(home))\n"
                            "print(pwd.getpwnam(me).pw_uid == os.getuid(),\n"
                            "      grp.getgrnam(grp.getgrgid(os.getgid()).gr_name).gr_gid == "
                            "os.getgid())\n"
                            "open('f', 'w').close()\n"
                            "shutil.chown('f', me, grp.getgrgid(os.getgid()).gr_name)\n"
                            "print('chown by name')\n"),
                   "True True\nTrue True True\nTrue True\nchown by name\n");
}

/* --- what a worker leaves as it ends (holder.h) ------------------------------ */

static bool env_set(const char *name)
{
    const char *v = getenv(name);
    return v && *v;
}

/* The uid on the first line a run printed. */
static uid_t uid_said(const char *text)
{
    unsigned u = 0;
    assert_int_equal(sscanf(text, "%u", &u), 1);
    return (uid_t)u;
}

static int fds_of(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    return count_entries(path);
}

/* Every signal but SIGKILL and SIGSTOP, which cannot be blocked. */
#define ALL_BLOCKED "fffffffffffbfeff"

/* While a run waits, its uid has the worker and, on a package template,
 * the holder that takes the worker's teardown off the answer's path: a
 * process of the worker's that holds no descriptor, blocks every signal,
 * is under seccomp and sleeps. When the answer is in, neither is left. */
static void a_run_leaves_nothing_behind_it(void **state)
{
    struct bg_run a;
    pid_t pids[8];
    int n = -1;

    bg_start(&a, SBX(state),
             "import os, time\nprint(os.getuid())\nprint('ready', flush=True)\n"
             "time.sleep(1)\n",
             10);
    uid_t uid = uid_said(a.said);
    if (is_root)
        n = pids_of(uid, pids, 8);
    int holders = 0;
    for (int i = 0; i < n; i++) {
        long ppid = proc_status_field(pids[i], "\nPPid:");
        bool of_the_worker = false;
        for (int k = 0; k < n; k++)
            of_the_worker |= k != i && ppid == pids[k];
        if (!of_the_worker)
            continue;
        holders++;
        char path[64], buf[4096];
        snprintf(path, sizeof(path), "/proc/%d/status", (int)pids[i]);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        buf[fread(buf, 1, sizeof(buf) - 1, f)] = '\0';
        fclose(f);
        if (!strstr(buf, "\nSigBlk:\t" ALL_BLOCKED "\n") || !strstr(buf, "\nSeccomp:\t2\n") ||
            !strstr(buf, "\nState:\tS"))
            fail_msg("the holder is not as it must be:\n%s", buf);
        assert_int_equal(fds_of(pids[i]), 0);
    }
    bg_finish(&a);
    expect_out(a.res, a.said);
    if (!is_root)
        skip(); /* uids shared: what is whose cannot be told */
    if (!env_set("PYSBX_TEST_SESSION")) {
        assert_int_equal(holders, env_set("PYSBX_TEST_PACKAGES") ? 1 : 0);
        assert_int_equal(n, 1 + holders);
    }
    assert_int_equal(wait_processes_of(uid, 0), 0);
}

/* The one way the code can reach its holder is its process group: every
 * signal it can send there, with the worker's own ignored, does nothing to
 * the run or to what the holder holds, and os.wait() finds no child. The
 * two signals glibc keeps for itself cannot be ignored (sigaction refuses
 * them), and from glibc 2.41 (Debian 13) the first has no handler until
 * pthread_cancel is used: sent, it would end the sender, as under python3. */
static void the_code_cannot_use_its_holder(void **state)
{
    struct sbx_result *r =
        run_code(SBX(state), "import os, signal\n"
                             "print(os.getuid())\n"
                             "ignored = sent = 0\n"
                             "for s in range(1, signal.NSIG):\n"
                             "    if s in (signal.SIGKILL, signal.SIGSTOP):\n"
                             "        continue\n"
                             "    try:\n"
                             "        signal.signal(s, signal.SIG_IGN)\n"
                             "        ignored += 1\n"
                             "    except OSError:\n"
                             "        continue\n"
                             "    try:\n"
                             "        os.kill(0, s)\n"
                             "        sent += 1\n"
                             "    except PermissionError:\n"
                             "        pass  # SIGSYS: the policy's own\n"
                             "try:\n"
                             "    os.wait()\n"
                             "    print('a child')\n"
                             "except ChildProcessError:\n"
                             "    print('no child', ignored >= 59, sent == ignored - 1)\n");
    expect_completed(r, 0);
    uid_t uid = uid_said(r->stdout_text);
    if (!strstr(r->stdout_text, "\nno child True True\n"))
        fail_msg("stdout:\n%s\nstderr:\n%s", r->stdout_text, r->stderr_text);
    sbx_result_free(r);
    if (!is_root)
        skip();
    assert_int_equal(wait_processes_of(uid, 0), 0);
}

/* Stopped, worker and holder (the group's SIGSTOP): the wall limit ends
 * the run, and the holder goes with the worker. */
static void a_stopped_run_ends_whole_at_its_limit(void **state)
{
    struct sbx_limits l;
    sbx_limits_init(&l);
    l.wall_seconds = 1;
    struct sbx_result *r = run_with(SBX(state),
                                    "import os, signal\n"
                                    "print(os.getuid(), flush=True)\n"
                                    "os.kill(0, signal.SIGSTOP)\n"
                                    "print('went on')\n",
                                    &l, NULL, 0);
    assert_int_equal(r->status, SBX_TIMEOUT);
    uid_t uid = uid_said(r->stdout_text);
    assert_null(strstr(r->stdout_text, "went on"));
    sbx_result_free(r);
    if (!is_root)
        skip();
    assert_int_equal(wait_processes_of(uid, 0), 0);
}

static int setup(void **state)
{
    is_root = geteuid() == 0;
    return fixture_open(state);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(each_run_has_its_own_uid),
        cmocka_unit_test(pending_signal_quota_of_one_run_leaves_others_alone),
        cmocka_unit_test(thread_quota_of_one_run_leaves_others_alone),
        cmocka_unit_test(prio_user_cannot_renice_other_runs),
        cmocka_unit_test(sibling_workspace_cannot_be_seen_or_changed),
        cmocka_unit_test(host_files_cannot_even_be_statted),
        cmocka_unit_test(host_processes_are_out_of_reach),
        cmocka_unit_test(cpu_limit_survives_deleted_timers_and_ignored_sigxcpu),
        cmocka_unit_test(page_cache_probes_are_refused),
        cmocka_unit_test(ordinary_os_functions_fail_instead_of_killing),
        cmocka_unit_test(code_finds_itself),
        cmocka_unit_test(a_run_leaves_nothing_behind_it),
        cmocka_unit_test(the_code_cannot_use_its_holder),
        cmocka_unit_test(a_stopped_run_ends_whole_at_its_limit),
    };
    return cmocka_run_group_tests(tests, setup, fixture_close);
}
