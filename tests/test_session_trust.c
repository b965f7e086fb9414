/*
 * A session's processes are trusted with nothing once they have run the
 * tenant's code: the attacks of a tenant on its own session's machinery,
 * through the public API. Each cell below plays the worst sender on its
 * channel to the template (descriptor 4) or turns the state itself into
 * the attacker; each test asserts what the caller sees and the invariant
 * behind it: no CPU spent after the answer, no process left after the
 * session, limits that the request set and nothing else.
 *
 * Runs as pid 1 of its own pid namespace (tests/in_pidns.sh): a process
 * that escaped the session would still be inside it.
 */
#define _GNU_SOURCE
#include "session_helpers.h"

#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SBX(state) (((struct fixture *)*(state))->sbx)

static void pause_ms(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* The code's end as the sandbox would see it: its output on /dev/null,
 * nothing else open, "done" on its channel. What follows runs on. */
#define LOOKS_DONE                                                                                 \
    "import ctypes, os, struct, time\n"                                                            \
    "libc = ctypes.CDLL(None, use_errno=True)\n"                                                   \
    "libc.syscall.restype = ctypes.c_long\n"                                                       \
    "def looks_done():\n"                                                                          \
    "    null = os.open('/dev/null', os.O_RDWR)\n"                                                 \
    "    os.dup2(null, 1)\n"                                                                       \
    "    os.dup2(null, 2)\n"                                                                       \
    "    os.close(null)\n"                                                                         \
    "    os.write(4, b'D' + bytes(9))\n"

/* A command of the template's on |sock|, as the state's loop reads it:
 * the descriptors attached (SESSION_FORK: the next cell's channel; on
 * that channel, when the cell is handed out: its request, stdout and
 * stderr). */
#define COMMAND                                                                                    \
    "class iovec(ctypes.Structure):\n"                                                             \
    "    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]\n"                       \
    "class msghdr(ctypes.Structure):\n"                                                            \
    "    _fields_ = [('name', ctypes.c_void_p), ('namelen', ctypes.c_uint32),\n"                   \
    "                ('iov', ctypes.POINTER(iovec)), ('iovlen', ctypes.c_size_t),\n"               \
    "                ('control', ctypes.c_void_p), ('controllen', ctypes.c_size_t),\n"             \
    "                ('flags', ctypes.c_int)]\n"                                                   \
    "def command(sock):\n"                                                                         \
    "    buf = ctypes.create_string_buffer(64)\n"                                                  \
    "    cbuf = ctypes.create_string_buffer(256)\n"                                                \
    "    iov = iovec(ctypes.cast(buf, ctypes.c_void_p), 64)\n"                                     \
    "    m = msghdr(None, 0, ctypes.pointer(iov), 1, ctypes.cast(cbuf, ctypes.c_void_p),\n"        \
    "               256, 0)\n"                                                                     \
    "    if libc.recvmsg(sock, ctypes.byref(m), 0) <= 0:\n"                                        \
    "        os._exit(0)\n"                                                                        \
    "    n = (struct.unpack_from('Q', cbuf.raw)[0] - 16) // 4\n"                                   \
    "    return list(struct.unpack_from('i' * n, cbuf.raw, 16))\n"

/* The fork the sandbox lets a session's state make: clone(2) with
 * CLONE_PARENT | SIGCHLD. */
#define SESSION_CLONE "libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0)"

/* CPU that |uid| spends between |from_ms| and |to_ms| after now. */
static double cpu_spent_between(uid_t uid, int from_ms, int to_ms)
{
    pause_ms(from_ms);
    double a = cpu_ms_of(uid);
    pause_ms(to_ms - from_ms);
    return cpu_ms_of(uid) - a;
}

/* A cell says "done" and goes on with its output open: it cannot be
 * kept, it is stopped at once, and its files are not the next cell's. */
static void a_forged_end_is_a_rollback_and_nothing_runs_after_it(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);
    uid_t uid = session_uid(s);
    struct sbx_error err = {0};
    int rc;

    expect_cell(s, "x = 1", "");
    struct sbx_result *r = cell_limited(s,
                                        "import os\n"
                                        "os.write(4, b'D' + bytes(9))\n"
                                        "while True:\n"
                                        "    open('after.txt', 'a').write('.')\n"
                                        "    sum(range(10000))\n",
                                        SBX_ROLLBACK_ON_ERROR, 2.0, 2.0, NULL, 0, &rc, &err);
    double at_answer = cpu_ms_of(uid);
    if (rc == 0) {
        if (!r->rolled_back)
            fail_msg("a cell that said it was done while it ran was kept (%s)",
                     sbx_status_name(r->status));
        sbx_result_free(r);
    } else
        assert_int_equal(rc, -ENOLINK);
    /* Nothing of the session spends CPU once the answer is out. */
    double after = cpu_ms_of(uid) - at_answer + cpu_spent_between(uid, 0, 1000);
    if (after > 100)
        fail_msg("the session used %.0f ms of CPU after the cell's answer", after);
    if (rc == 0)
        expect_cell(s, "print(x, __import__('os').path.exists('after.txt'))", "1 False\n");
    sbx_session_close(s);
}

/* The same with the output closed first, so that the cell looks ended:
 * it is stopped, and once the state is asked to fork, the code that goes
 * on instead has a bounded moment (charged to the next cell), not the
 * rest of the session. */
static void a_forged_end_with_closed_output_runs_for_a_bounded_moment(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);
    uid_t uid = session_uid(s);
    struct sbx_error err = {0};
    int rc;

    struct sbx_result *r = cell_limited(s,
                                        LOOKS_DONE "looks_done()\n"
                                                   "while True:\n"
                                                   "    open('after.txt', 'a').write('.')\n"
                                                   "    sum(range(10000))\n",
                                        SBX_ROLLBACK_ON_ERROR, 2.0, 2.0, NULL, 0, &rc, &err);
    double at_answer = cpu_ms_of(uid);
    if (rc == 0)
        sbx_result_free(r);
    double first = cpu_ms_of(uid) - at_answer + cpu_spent_between(uid, 0, 2500);
    double later = cpu_spent_between(uid, 0, 1000);
    if (first > 1500 || later > 50)
        fail_msg("after the answer the session used %.0f ms of CPU in 2.5 s, then %.0f ms in "
                 "the next second",
                 first, later);
    /* Whatever the next cell finds, the file did not grow while it
     * waited. */
    r = cell_full(s, "import os\nprint(os.path.getsize('after.txt'))", SBX_ROLLBACK_ON_ERROR, 0,
                  NULL, 0, &rc, &err);
    if (rc == 0) {
        struct sbx_result *again = cell_full(s, "import os\nprint(os.path.getsize('after.txt'))",
                                             SBX_ROLLBACK_ON_ERROR, 0, NULL, 0, &rc, &err);
        if (rc == 0) {
            assert_string_equal(r->stdout_text, again->stdout_text);
            sbx_result_free(again);
        }
        sbx_result_free(r);
    } else
        assert_int_equal(rc, -ENOLINK);
    sbx_session_close(s);
    assert_int_equal(processes_of(uid) > 0, 0);
}

/* The state, asked to fork, forks a child of its own that never says a
 * word and spins. The sandbox finds it anyway (the kernel's list of its
 * children), holds it stopped, and kills it with the session. */
static void a_child_the_state_made_itself_is_held_and_dies_with_the_session(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);
    uid_t uid = session_uid(s);
    struct sbx_error err = {0};
    int rc;

    struct sbx_result *r = cell_limited(s,
                                        LOOKS_DONE "looks_done()\n"
                                                   "while True:\n"
                                                   "    if " SESSION_CLONE " == 0:\n"
                                                   "        while True:\n"
                                                   "            pass\n"
                                                   "    time.sleep(0.001)\n",
                                        SBX_ROLLBACK_ON_ERROR, 2.0, 2.0, NULL, 0, &rc, &err);
    if (rc == 0)
        sbx_result_free(r);
    double idle = cpu_spent_between(uid, 1500, 2500);
    if (idle > 50)
        fail_msg("a session between cells used %.0f ms of CPU in a second", idle);
    /* The child is what the next cell runs in: it has that cell's limits. */
    r = cell_limited(s, "print('asked')", SBX_ROLLBACK_ON_ERROR, 1.0, 0.5, NULL, 0, &rc, &err);
    if (rc == 0) {
        if (r->status == SBX_COMPLETED && !r->rolled_back)
            fail_msg("a cell in the state's own child completed and was kept: %s", r->stdout_text);
        assert_true(r->wall_ms < 2000);
        sbx_result_free(r);
    }
    sbx_session_close(s);
    /* Closed: nothing of it is left when the call returns. */
    int left = processes_of(uid);
    if (left > 0)
        fail_msg("%d processes of the session's uid %u outlived it", left, (unsigned)uid);
}

/* The state plays the sandbox's own cell: it takes the cell's pipes from
 * the fork command, forks, and in the child says hello, claims limits of
 * its own, prints what it likes and spins. The cell's limits are the
 * request's, kept by the template; its claim ends the session. */
static void a_cell_cannot_claim_limits_of_its_own(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);
    uid_t uid = session_uid(s);
    struct sbx_error err = {0};
    int rc;

    struct sbx_result *r = cell_limited(
        s,
        LOOKS_DONE COMMAND "looks_done()\n"
                           "while True:\n"
                           "    fds = command(4)\n"
                           "    if " SESSION_CLONE " == 0:\n"
                           /* At 4, where the policy lets a session's process
                            * take messages (elsewhere recvmsg fails, and the
                            * child would end before it could spin). */
                           "        os.dup2(fds[0], 4)\n"
                           "        chan = 4\n"
                           "        os.write(chan, b'H')\n"
                           "        os.write(chan, b'S' + struct.pack('QQQ', 0, 10**18, 0))\n"
                           "        req, out, err = command(chan)[:3]\n"
                           "        os.write(out, b'not what was asked\\n')\n"
                           "        t = time.time()\n"
                           "        while time.time() - t < 4:\n"
                           "            pass\n"
                           "        os.close(out)\n"
                           "        os.close(err)\n"
                           "        os.write(chan, b'D' + bytes(9))\n"
                           "        while True:\n"
                           "            time.sleep(1)\n"
                           "    for f in fds:\n"
                           "        os.close(f)\n",
        SBX_ROLLBACK_ON_ERROR, 2.0, 2.0, NULL, 0, &rc, &err);
    if (rc == 0)
        sbx_result_free(r);
    /* A wall limit past the child's 4 s: only the CPU limit can stop it. */
    r = cell_limited(s, "print('asked')", SBX_ROLLBACK_ON_ERROR, 6.0, 1.0, NULL, 0, &rc, &err);
    if (rc == 0) {
        if (r->status == SBX_COMPLETED)
            fail_msg("the state's own cell completed after %.0f ms: cell %llu, exit %d, rolled "
                     "back %d, reason %s, stdout '%s', stderr '%s'",
                     r->wall_ms, (unsigned long long)r->cell, r->exit_code, r->rolled_back,
                     r->reason ? r->reason : "-", r->stdout_text, r->stderr_text);
        assert_true(r->wall_ms < 3000);
        sbx_result_free(r);
    } else
        assert_int_equal(rc, -ENOLINK);
    sbx_session_close(s);
    assert_int_equal(processes_of(uid) > 0, 0);
}

/* The state says its fork failed, then forks anyway (the template may
 * read the word after it let the clone through): the child is found among
 * the template's children and killed; nothing of the session runs between
 * cells, and nothing of it outlives it. */
static void a_state_that_says_its_fork_failed_and_forks_leaves_no_child(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);
    uid_t uid = session_uid(s);
    struct sbx_error err = {0};
    int rc;

    struct sbx_result *r =
        cell_limited(s,
                     LOOKS_DONE COMMAND "looks_done()\n"
                                        "while True:\n"
                                        "    for f in command(4):\n"
                                        "        os.close(f)\n"
                                        "    os.write(4, b'Fit failed, it says')\n"
                                        "    if " SESSION_CLONE " == 0:\n"
                                        "        while True:\n"
                                        "            pass\n",
                     SBX_ROLLBACK_ON_ERROR, 2.0, 2.0, NULL, 0, &rc, &err);
    if (rc == 0)
        sbx_result_free(r);
    for (int i = 0; i < 3; i++) {
        double idle = cpu_spent_between(uid, 300, 1300);
        if (idle > 50)
            fail_msg("round %d: the session used %.0f ms of CPU in a second between cells", i,
                     idle);
        /* The state, and nothing it made. */
        int n = processes_of(uid);
        if (n > 1)
            fail_msg("round %d: %d processes of the session's uid between cells", i, n);
        r = cell_limited(s, "print('asked')", SBX_ROLLBACK_ON_ERROR, 1.0, 0.5, NULL, 0, &rc, &err);
        if (rc == 0) {
            if (r->status == SBX_COMPLETED)
                fail_msg("a cell ran in a fork its state said had failed: %s", r->stdout_text);
            sbx_result_free(r);
        }
    }
    sbx_session_close(s);
    assert_int_equal(processes_of(uid) > 0, 0);
}

/* What a process told to fork may say is its fork's failure, and nothing
 * else: a word out of turn from it ends the session, with every process.
 * The word goes before the cell's channel is let go: a channel closed
 * first is a fork that failed, after which the process is stopped, and a
 * word it had not yet written would never come. */
static void a_message_out_of_turn_from_the_state_ends_the_session(void **state)
{
    static const char *const said[] = {
        "b'R'",            /* "ready": the first state's word, once */
        "b'D' + bytes(9)", /* "done": a cell's */
        "b'H'",            /* "hello": the next cell's */
        "b'x'",            /* "exported": once a state's answer, never asked now */
        "b'?' * 100",
    };

    for (size_t i = 0; i < sizeof(said) / sizeof(said[0]); i++) {
        struct sbx_session *s = open_session(SBX(state), NULL);
        uid_t uid = session_uid(s);
        struct sbx_error err = {0};
        char code[4096];
        int rc;

        snprintf(code, sizeof(code),
                 LOOKS_DONE COMMAND "looks_done()\n"
                                    "while True:\n"
                                    "    fds = command(4)\n"
                                    "    os.write(4, %s)\n"
                                    "    for f in fds:\n"
                                    "        os.close(f)\n"
                                    "    while True:\n"
                                    "        pass\n",
                 said[i]);
        struct sbx_result *r =
            cell_limited(s, code, SBX_ROLLBACK_ON_ERROR, 2.0, 2.0, NULL, 0, &rc, &err);
        if (rc == 0)
            sbx_result_free(r);
        /* The session is gone: nothing of it runs on. */
        if (wait_processes_of(uid, 0) != 0)
            fail_msg("%s: the session's processes live on", said[i]);
        expect_lost(s, "");
        sbx_session_close(s);
    }
}

/* A cell of |s| that takes over the state's channel and answers every
 * fork command "not here" without forking, keeping what came with it (so
 * that the session lives on, its state never forking). */
static void take_over_refusing_forks(struct sbx_session *s)
{
    struct sbx_error err = {0};
    int rc;
    struct sbx_result *r = cell_limited(s,
                                        LOOKS_DONE COMMAND "looks_done()\n"
                                                           "while True:\n"
                                                           "    fds = command(4)\n"
                                                           "    os.write(4, b'Fnot here')\n",
                                        SBX_ROLLBACK_ON_ERROR, 2.0, 2.0, NULL, 0, &rc, &err);
    if (rc == 0)
        sbx_result_free(r);
}

/* A state is copied (for a branch, or an image) only once the kernel has
 * seen it fork since it became the state: that is when its record (what
 * a copy takes on) is written, and it is never woken to write it. A state
 * that never forks is neither branched nor saved: both are refused at
 * once, saying why, and nothing of it runs meanwhile. */
static void a_state_that_never_forks_is_not_copied(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);
    struct sbx_session *b = NULL;
    uid_t uid = session_uid(s);
    struct sbx_error err = {0};

    take_over_refusing_forks(s);
    double before = cpu_ms_of(uid);
    if (sbx_session_fork(s, &b, &err) == 0)
        fail_msg("a branch of a state that never forked was made");
    assert_null(b);
    if (!strstr(err.message, "has not forked"))
        fail_msg("the branch refused as %s: %s", sbx_error_code_name(err.code), err.message);
    int fd = memfd_create("image", MFD_CLOEXEC);
    assert_true(fd >= 0);
    if (sbx_session_save(s, fd, &err) == 0)
        fail_msg("an image of a state that never forked was made");
    if (!strstr(err.message, "has not forked"))
        fail_msg("the image refused as %s: %s", sbx_error_code_name(err.code), err.message);
    close(fd);
    /* Its state was let run to fork (and said no), for nothing else. */
    double spent = cpu_ms_of(uid) - before + cpu_spent_between(uid, 0, 500);
    if (spent > 100)
        fail_msg("the state used %.0f ms of CPU while it was refused", spent);
    sbx_session_close(s);
    if (processes_of(uid) >= 0)
        assert_int_equal(wait_processes_of(uid, 0), 0);
}

/* The context switches of the processes of |uid|, summed (the kernel's
 * count of each time one stopped running), and in *n how many there are;
 * -1 when one cannot be read. */
static long switches_of(uid_t uid, int *n)
{
    pid_t pids[16];
    long sum = 0;

    *n = pids_of(uid, pids, 16);
    for (int i = 0; i < *n; i++) {
        long v = proc_status_field(pids[i], "\nvoluntary_ctxt_switches:");
        long nv = proc_status_field(pids[i], "\nnonvoluntary_ctxt_switches:");
        if (v < 0 || nv < 0)
            return -1;
        sum += v + nv;
    }
    return sum;
}

/* Between cells a session's processes do not run, and a branch or an image
 * of it changes nothing of that: its state is copied as it is, stopped,
 * never let run for a copy (before, it was woken to export itself, and
 * whatever its code had arranged ran with it). The kernel's count of
 * context switches of every process of the session stays what it was. */
static void the_origin_does_not_run_for_its_copies(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);
    uid_t uid = session_uid(s);
    int n0 = 0, n1 = 0;
    long before = -1;

    if (geteuid() != 0)
        skip(); /* the processes of a uid are told apart only as root */
    expect_cell(s, "x = list(range(1000))", "");
    /* Idle: its next cell made and stopped, nothing of it running. */
    for (int i = 0; i < 40; i++) {
        long a = switches_of(uid, &n0);
        pause_ms(100);
        if (a >= 0 && switches_of(uid, &n1) == a && n1 == n0) {
            before = a;
            break;
        }
    }
    assert_true(before >= 0);
    for (int i = 0; i < 3; i++) {
        struct sbx_session *b = expect_fork(s);
        expect_cell(b, "print(len(x))", "1000\n");
        sbx_session_close(b);
    }
    int fd = memfd_create("image", MFD_CLOEXEC);
    struct sbx_error err = {0};
    assert_true(fd >= 0);
    if (sbx_session_save(s, fd, &err) < 0)
        fail_msg("sbx_session_save: %s: %s", sbx_error_code_name(err.code), err.message);
    close(fd);
    long after = switches_of(uid, &n1);
    if (after != before || n1 != n0)
        fail_msg("the session's %d processes switched %ld times, then its %d processes %ld times "
                 "across three branches and an image",
                 n0, before, n1, after);
    expect_cell(s, "print(len(x))", "1000\n");
    sbx_session_close(s);
}

/* A message a session's process may not send now ends the session (as a
 * privilege-separation monitor treats an unexpected request), and every
 * process of it goes. */
static void a_message_out_of_turn_ends_the_session(void **state)
{
    static const char *const said[] = {
        "os.write(4, b'S' + bytes(24))",         /* "started", with limits */
        "os.write(4, b'R')",                     /* "ready", the first state's word */
        "os.write(4, b'H')",                     /* "hello", a new cell's */
        "os.write(4, b'D' + bytes(10))",         /* "done", the wrong length */
        "os.write(4, b'D' + bytes(8) + b'\\2')", /* "done", past neither 0 nor 1 */
        "os.write(4, b'?' * 100)",
        "os.write(4, b'x')",       /* "exported", a state's answer to an export */
        "os.write(4, b'b')",       /* "branched", a branch's copy resumed */
        "os.write(4, b'Ebroken')", /* a branch's import failed */
    };

    for (size_t i = 0; i < sizeof(said) / sizeof(said[0]); i++) {
        struct sbx_session *s = open_session(SBX(state), NULL);
        uid_t uid = session_uid(s);
        struct sbx_error err = {0};
        char code[256];
        int rc;

        snprintf(code, sizeof(code), "import os, time\n%s\ntime.sleep(2)\nprint('went on')\n",
                 said[i]);
        struct sbx_result *r =
            cell_limited(s, code, SBX_ROLLBACK_ON_ERROR, 5.0, 0, NULL, 0, &rc, &err);
        if (rc == 0) {
            if (strstr(r->stdout_text, "went on"))
                fail_msg("%s: the cell went on (%s)", said[i], sbx_status_name(r->status));
            sbx_result_free(r);
        }
        expect_lost(s, "");
        if (processes_of(uid) > 0 && wait_processes_of(uid, 0) != 0)
            fail_msg("%s: the session's processes live on", said[i]);
        sbx_session_close(s);
    }
}

/* What the code sets for itself is bounded by what the request said: the
 * CPU limit (whatever RLIMIT_CPU it raises) and the session's memory
 * (whatever RLIMIT_AS it asks for), named as the limit that fired. */
static void a_cells_limits_are_the_requests(void **state)
{
    struct sbx_session_limits l;
    struct sbx_error err = {0};
    int rc;

    sbx_session_limits_init(&l);
    l.memory_bytes = 256ULL << 20;
    struct sbx_session *s = open_session(SBX(state), &l);
    struct sbx_result *r =
        cell_limited(s,
                     "import resource\n"
                     "soft, hard = resource.getrlimit(resource.RLIMIT_CPU)\n"
                     "resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))\n"
                     "try:\n"
                     "    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)\n"
                     "    print('raised')\n"
                     "except (ValueError, OSError):\n"
                     "    pass\n"
                     "while True:\n"
                     "    pass\n",
                     SBX_ROLLBACK_ON_ERROR, 10.0, 1.0, NULL, 0, &rc, &err);
    assert_int_equal(rc, 0);
    assert_int_equal(r->status, SBX_TIMEOUT);
    assert_int_equal(r->limit, SBX_LIMIT_CPU);
    assert_true(r->cpu_ms < 2500);
    assert_null(strstr(r->stdout_text, "raised"));
    sbx_result_free(r);

    /* The session's memory is the code's: nearly all of it can be used
     * (not what the template maps). */
    r = cell(s, "b = bytearray(250 << 20)\nprint(len(b) >> 20)\n");
    assert_int_equal(r->status, SBX_COMPLETED);
    assert_string_equal(r->stdout_text, "250\n");
    sbx_result_free(r);

    /* A request's own memory figure does not move the session's. */
    struct sbx_request req;
    sbx_request_init(&req);
    req.code = "b = bytearray(400 << 20)";
    req.code_len = strlen(req.code);
    req.limits.memory_bytes = 1ULL << 30;
    r = NULL;
    assert_int_equal(sbx_session_run(s, &req, SBX_ROLLBACK_ON_ERROR, &r, &err), 0);
    assert_int_equal(r->status, SBX_MEMORY_LIMIT);
    if (!r->reason || !strstr(r->reason, "memory limit of 256 MiB"))
        fail_msg("the reason names another limit: %s", r->reason ? r->reason : "(none)");
    sbx_result_free(r);
    sbx_session_close(s);
}

/* What a cell says of its end (a value and whether it was past 64 bits)
 * only chooses between keep and roll back, as its own exit could, and
 * describes its own cell: a value the code could not have exited with is
 * no more. */
static void a_forged_status_only_keeps_or_rolls_back(void **state)
{
    static const struct {
        const char *said;
        bool kept;
        int exit_code;
        const char *reason;
    } cases[] = {
        {"struct.pack('<qB', 7, 0)", false, 7, "exit status 7"},
        {"struct.pack('<qB', -2 ** 63, 0)", false, 0, "sys.exit(-9223372036854775808)"},
        {"struct.pack('<qB', 5, 1)", false, 5, "a number above 9223372036854775807"},
        {"struct.pack('<qB', 0, 1)", true, 0, NULL},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sbx_session *s = open_session(SBX(state), NULL);
        uid_t uid = session_uid(s);
        struct sbx_error err = {0};
        char code[4096];
        int rc;

        expect_cell(s, "x = 1", "");
        snprintf(code, sizeof(code),
                 LOOKS_DONE "null = os.open('/dev/null', os.O_RDWR)\n"
                            "os.dup2(null, 1)\n"
                            "os.dup2(null, 2)\n"
                            "os.close(null)\n"
                            "os.write(4, b'D' + %s)\n"
                            "time.sleep(60)\n",
                 cases[i].said);
        struct sbx_result *r =
            cell_limited(s, code, SBX_ROLLBACK_ON_ERROR, 5.0, 2.0, NULL, 0, &rc, &err);
        if (rc != 0)
            fail_msg("%s: refused: %s", cases[i].said, err.message);
        if (r->status != SBX_COMPLETED || r->rolled_back == cases[i].kept ||
            r->exit_code != cases[i].exit_code ||
            (cases[i].reason && (!r->reason || !strstr(r->reason, cases[i].reason))))
            fail_msg("%s: %s, exit %d, rolled back %d: %s", cases[i].said,
                     sbx_status_name(r->status), r->exit_code, r->rolled_back,
                     r->reason ? r->reason : "(no reason)");
        sbx_result_free(r);
        sbx_session_close(s);
        assert_int_equal(processes_of(uid) > 0, 0);
    }
}

/* sys.exit(256) is 0 to the kernel's eight bits, and an error to the
 * code: the cell rolls back. */
static void a_nonzero_exit_rolls_back_whatever_its_low_bits(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);

    expect_cell(s, "x = 1", "");
    struct sbx_result *r = cell(s, "x = 2\nimport sys\nsys.exit(256)");
    assert_int_equal(r->status, SBX_COMPLETED);
    if (!r->rolled_back)
        fail_msg("sys.exit(256) was kept (exit code %d)", r->exit_code);
    assert_non_null(r->reason);
    assert_non_null(strstr(r->reason, "256"));
    sbx_result_free(r);
    expect_cell(s, "print(x)", "1\n");
    sbx_session_close(s);
}

#define MAPPINGS                                                                                   \
    "import mmap\n"                                                                                \
    "f = open('m', 'w+b')\n"                                                                       \
    "f.write(b'x' * 4096)\n"                                                                       \
    "f.flush()\n"                                                                                  \
    "def try_map(what, *a, **k):\n"                                                                \
    "    try:\n"                                                                                   \
    "        mmap.mmap(*a, **k).close()\n"                                                         \
    "        print(what, 'mapped')\n"                                                              \
    "    except PermissionError:\n"                                                                \
    "        print(what, 'refused')\n"                                                             \
    "try_map('anonymous shared', -1, 4096)\n"                                                      \
    "try_map('file shared', f.fileno(), 4096)\n"                                                   \
    "try_map('file shared read', f.fileno(), 4096, access=mmap.ACCESS_READ)\n"                     \
    "try_map('file copy', f.fileno(), 4096, access=mmap.ACCESS_COPY)\n"                            \
    "try_map('anonymous private', -1, 4096, flags=mmap.MAP_PRIVATE)\n"                             \
    "f.close()\n"

/* A shared mapping outlives a rollback (a fork shares it): a session
 * refuses it, and says so; a plain run keeps it. */
static void shared_mappings_are_refused_in_a_session(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);

    expect_cell(s, MAPPINGS,
                "anonymous shared refused\nfile shared refused\nfile shared read refused\n"
                "file copy mapped\nanonymous private mapped\n");
    sbx_session_close(s);
    expect_stdout(SBX(state), MAPPINGS,
                  "anonymous shared mapped\nfile shared mapped\nfile shared read mapped\n"
                  "file copy mapped\nanonymous private mapped\n");
}

/* An input file of a later cell replaces what an earlier one put there. */
static void a_later_cells_input_replaces_an_earlier_one(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);
    struct sbx_file a = {"data.csv", "a\n", 2}, b = {"sub/data.csv", "bb\n", 3};
    struct sbx_error err = {0};
    int rc;

    struct sbx_result *r = cell_limited(s, "print(open('data.csv').read().strip())",
                                        SBX_ROLLBACK_ON_ERROR, 0, 0, &a, 1, &rc, &err);
    assert_int_equal(rc, 0);
    expect_completed(r, 0);
    sbx_result_free(r);
    struct sbx_file again[] = {{"data.csv", "bb\n", 3}, b};
    r = cell_limited(s,
                     "print(open('data.csv').read().strip(), open('sub/data.csv').read().strip())",
                     SBX_ROLLBACK_ON_ERROR, 0, 0, again, 2, &rc, &err);
    assert_int_equal(rc, 0);
    expect_completed(r, 0);
    assert_string_equal(r->stdout_text, "bb bb\n");
    sbx_result_free(r);
    sbx_session_close(s);
}

/* Right after its template died, a session is opened on the next one (a
 * few times: five deaths within 30 s put the sandbox down, by design). */
static void a_session_opens_right_after_the_template_died(void **state)
{
    for (int i = 0; i < 4; i++) {
        struct sbx_session *s = NULL;
        struct sbx_error err = {0};

        assert_int_equal(kill(template_pid(), SIGKILL), 0);
        if (sbx_session_open(SBX(state), NULL, &s, &err) < 0)
            fail_msg("try %d: %s: %s", i, sbx_error_code_name(err.code), err.message);
        expect_cell(s, "print(1)", "1\n");
        sbx_session_close(s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_forged_end_is_a_rollback_and_nothing_runs_after_it),
        cmocka_unit_test(a_forged_end_with_closed_output_runs_for_a_bounded_moment),
        cmocka_unit_test(a_child_the_state_made_itself_is_held_and_dies_with_the_session),
        cmocka_unit_test(a_cell_cannot_claim_limits_of_its_own),
        cmocka_unit_test(a_state_that_never_forks_is_not_copied),
        cmocka_unit_test(the_origin_does_not_run_for_its_copies),
        cmocka_unit_test(a_state_that_says_its_fork_failed_and_forks_leaves_no_child),
        cmocka_unit_test(a_message_out_of_turn_from_the_state_ends_the_session),
        cmocka_unit_test(a_message_out_of_turn_ends_the_session),
        cmocka_unit_test(a_cells_limits_are_the_requests),
        cmocka_unit_test(a_nonzero_exit_rolls_back_whatever_its_low_bits),
        cmocka_unit_test(a_forged_status_only_keeps_or_rolls_back),
        cmocka_unit_test(shared_mappings_are_refused_in_a_session),
        cmocka_unit_test(a_later_cells_input_replaces_an_earlier_one),
        cmocka_unit_test(a_session_opens_right_after_the_template_died),
    };
    if (getenv("TEST_FILTER"))
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, fixture_open, fixture_close);
}
