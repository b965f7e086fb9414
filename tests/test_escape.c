/*
 * The escape suite: each test is one way out an attacker would try, run
 * through the public API, asserting what the caller sees (an OSError inside
 * the code and a normal result, or the run stopped with the right status)
 * and that the host is untouched.
 *
 * This program runs as pid 1 of its own pid namespace (tests/in_pidns.sh),
 * so that if a layer were broken, kill(-1) or a fork bomb would take down
 * this namespace, not the machine running the suite.
 */
#define _GNU_SOURCE
#include "helpers.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SBX(state) (((struct fixture *)*(state))->sbx)

static char host_dir[512];    /* a directory outside any workspace */
static char marker[600];      /* a file no run may create */
static char secret_file[600]; /* world-readable, in the host's home */
static int inherited_fd = -1; /* open in the host before sbx_open */

static struct sbx_result *run(void **state, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

static struct sbx_result *run(void **state, const char *format, ...)
{
    static char code[8192];
    va_list ap;
    va_start(ap, format);
    vsnprintf(code, sizeof(code), format, ap);
    va_end(ap);
    struct sbx_limits l;
    sbx_limits_init(&l);
    l.wall_seconds = 5;
    return run_with(SBX(state), code, &l, NULL, 0);
}

static void expect_output(struct sbx_result *r, const char *out)
{
    expect_completed(r, 0);
    if (strcmp(r->stdout_text, out) != 0)
        fail_msg("stdout:\n%s\nexpected:\n%s\nstderr:\n%s", r->stdout_text, out, r->stderr_text);
    sbx_result_free(r);
}

static void expect_policy_kill(struct sbx_result *r)
{
    if (r->status != SBX_CRASHED || r->signal != SIGSYS)
        fail_msg("expected crashed/SIGSYS, got %s signal %d\n%s", sbx_status_name(r->status),
                 r->signal, r->stderr_text);
    assert_string_equal(r->stdout_text, "before\n");
    sbx_result_free(r);
}

static void host_untouched(void)
{
    assert_int_equal(access(marker, F_OK), -1);
    assert_int_equal(errno, ENOENT);
}

#define CTYPES "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
#define TRY_SYSCALL(expr)                                                                          \
    "r = " expr "\nprint(r, os.strerror(ctypes.get_errno()) if r == -1 else '')\n"

/* --- the network ----------------------------------------------------------- */

static void raw_inet_socket_via_ctypes_is_refused(void **state)
{
    expect_output(run(state, CTYPES TRY_SYSCALL("libc.socket(2, 1, 0)")),
                  "-1 Operation not permitted\n");
}

static void unix_socket_via_ctypes_is_refused(void **state)
{
    expect_output(run(state, CTYPES TRY_SYSCALL("libc.socket(1, 1, 0)")
                                 TRY_SYSCALL("libc.socketpair(1, 1, 0, (ctypes.c_int * 2)())")),
                  "-1 Operation not permitted\n-1 Operation not permitted\n");
}

static void netlink_socket_via_ctypes_is_refused(void **state)
{
    expect_output(run(state, CTYPES TRY_SYSCALL("libc.socket(16, 3, 0)")),
                  "-1 Operation not permitted\n");
}

static void real_socket_module_restored_still_cannot_connect(void **state)
{
    /* Through the import machinery: the built-in table holds the shim. */
    expect_output(run(state,
                      "import importlib.util, _imp\n"
                      "m = _imp.create_builtin(importlib.util.find_spec('_socket'))\n"
                      "_imp.exec_builtin(m)\n"
                      "try:\n    m.socket(m.AF_INET, m.SOCK_STREAM)\n"
                      "except OSError as e:\n    print('shim:', e.errno)\n"
                      /* Calling CPython's own init through ctypes gives the real
                       * module (from 3.12 its definition, made into the module
                       * as the import system would); seccomp refuses its
                       * socket(2). */
                      "import ctypes\n"
                      "api = ctypes.pythonapi\n"
                      "init = api.PyInit__socket\n"
                      "init.restype = ctypes.py_object\n"
                      "real = init()\n"
                      "if type(real).__name__ == 'moduledef':\n"
                      "    make, run = api.PyModule_FromDefAndSpec2, api.PyModule_ExecDef\n"
                      "    make.restype = ctypes.py_object\n"
                      "    make.argtypes = (ctypes.py_object, ctypes.py_object, ctypes.c_int)\n"
                      "    run.argtypes = (ctypes.py_object, ctypes.py_object)\n"
                      "    spec = importlib.util.spec_from_loader('_socket', None)\n"
                      "    module = make(real, spec, 1013)\n"
                      "    assert run(module, real) == 0\n"
                      "    real = module\n"
                      "print(type(real.socket).__name__)\n"
                      "try:\n    real.socket(real.AF_INET, real.SOCK_STREAM)\n"
                      "except OSError as e:\n    print('real:', e.strerror)\n"),
                  "shim: 13\ntype\nreal: Operation not permitted\n");
}

/* _ssl reads what _wrap_socket is given as CPython's socket object (a
 * descriptor at a fixed offset): were anything else accepted, that would
 * be a read and a write of memory the code chose. The shim's capsule names
 * a type that no object can be made into, found however it is looked for. */
static void ssl_takes_nothing_for_a_kernel_socket(void **state)
{
    expect_output(run(state,
                      "import gc, socket, ssl, _socket, _ssl\n"
                      "ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)\n"
                      "T = [o for o in gc.get_referents(_ssl) if isinstance(o, type)\n"
                      "     and o.__name__ == 'network_socket'][0]\n"
                      "class Plain:\n    pass\n"
                      "tries = {'new': lambda: T(), 'object.__new__': lambda: object.__new__(T),\n"
                      "         'subclass': lambda: type('S', (T,), {}),\n"
                      "         'class': lambda: setattr(Plain(), '__class__', T)}\n"
                      "for what, do in tries.items():\n"
                      "    try:\n        do()\n        print(what, 'MADE')\n"
                      "    except TypeError:\n        print(what, 'refused')\n"
                      "a, b = socket.socketpair()\n"
                      "for sock in (a, socket.socket, 3, bytearray(64), T, ctx):\n"
                      "    try:\n        ctx._wrap_socket(sock, True)\n"
                      "        print('WRAPPED')\n"
                      "    except TypeError:\n        pass\n"
                      "print('none wrapped')\n"),
                  "new refused\nobject.__new__ refused\nsubclass refused\nclass refused\n"
                  "none wrapped\n");
}

static void io_uring_is_not_there(void **state)
{
    expect_output(run(state, CTYPES TRY_SYSCALL("libc.syscall(425, 8, ctypes.c_void_p(0))")),
                  "-1 Function not implemented\n");
}

/* --- other processes --------------------------------------------------------- */

static void fork_fails(void **state)
{
    expect_output(run(state, "import os\ntry:\n    os.fork()\n    print('forked')\n"
                             "except OSError as e:\n    print(e.strerror)\n"),
                  "Operation not permitted\n");
}

static void vfork_fails(void **state)
{
    expect_output(run(state, CTYPES TRY_SYSCALL("libc.syscall(58)")),
                  "-1 Operation not permitted\n");
}

static void clone3_is_not_there(void **state)
{
    expect_output(run(state, CTYPES TRY_SYSCALL("libc.syscall(435, ctypes.c_void_p(0), 88)")),
                  "-1 Function not implemented\n");
}

static void subprocess_fails_and_nothing_runs(void **state)
{
    expect_output(run(state,
                      "import subprocess\n"
                      "try:\n    subprocess.run(['/bin/sh', '-c', 'echo x > %s'])\n"
                      "except OSError as e:\n    print(e.strerror)\n",
                      marker),
                  "Operation not permitted\n");
    host_untouched();
}

static void os_system_runs_nothing(void **state)
{
    expect_output(run(state, "import os\nprint(os.system('touch %s') != 0)\n", marker), "True\n");
    host_untouched();
}

static void posix_spawn_fails(void **state)
{
    expect_output(run(state, "import os\n"
                             "try:\n    os.posix_spawn('/bin/true', ['true'], {})\n"
                             "except OSError as e:\n    print(e.strerror)\n"),
                  "Operation not permitted\n");
}

static void execv_fails_and_the_code_goes_on(void **state)
{
    expect_output(run(state, "import os\n"
                             "try:\n    os.execv('/bin/sh', ['sh', '-c', 'true'])\n"
                             "except OSError as e:\n    print(e.strerror)\n"
                             "print('still here')\n"),
                  "Operation not permitted\nstill here\n");
}

static void x32_system_call_kills(void **state)
{
    expect_policy_kill(run(state, CTYPES "print('before', flush=True)\n"
                                         "libc.syscall(0x40000000 | 39)\nprint('after')\n"));
}

static void unshare_kills(void **state)
{
    expect_policy_kill(run(state, CTYPES "print('before', flush=True)\n"
                                         "libc.unshare(0x10000000)\nprint('after')\n"));
}

static void ptrace_of_the_parent_kills(void **state)
{
    expect_policy_kill(run(state, CTYPES "print('before', flush=True)\n"
                                         "libc.ptrace(16, os.getppid(), 0, 0)\nprint('after')\n"));
}

static void mount_kills(void **state)
{
    expect_policy_kill(run(state, CTYPES "print('before', flush=True)\n"
                                         "libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)\n"));
}

static void killing_the_parent_pid_1_and_everyone_is_refused(void **state)
{
    expect_output(run(state,
                      "import os, signal\n"
                      "# The parent is outside the run's pid namespace (0) or the template.\n"
                      "for pid in (os.getppid() or 1, 1, -1, %d):\n"
                      "    try:\n        os.kill(pid, signal.SIGKILL)\n"
                      "        print('sent', pid)\n"
                      "    except OSError as e:\n        print(e.strerror)\n",
                      (int)getpid()),
                  "Operation not permitted\nOperation not permitted\n"
                  "Operation not permitted\nOperation not permitted\n");
    /* The template and this process are alive: another run works. */
    expect_output(run(state, "print('alive')\n"), "alive\n");
}

/* --- limits ----------------------------------------------------------------- */

static void raising_rlimits_is_refused(void **state)
{
    expect_output(run(state, "import resource\n"
                             "for r in (resource.RLIMIT_AS, resource.RLIMIT_CPU,\n"
                             "          resource.RLIMIT_NOFILE, resource.RLIMIT_FSIZE):\n"
                             "    soft, hard = resource.getrlimit(r)\n"
                             "    try:\n"
                             "        resource.setrlimit(r, (resource.RLIM_INFINITY,"
                             " resource.RLIM_INFINITY))\n"
                             "        print('raised', r)\n"
                             "    except (ValueError, OSError):\n"
                             "        print('refused')\n"),
                  "refused\nrefused\nrefused\nrefused\n");
}

static void ignoring_sigterm_does_not_stop_the_deadline(void **state)
{
    struct sbx_limits l;
    sbx_limits_init(&l);
    l.wall_seconds = 0.5;
    struct sbx_result *r = run_with(SBX(state),
                                    "import signal\n"
                                    "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
                                    "    signal.signal(s, signal.SIG_IGN)\n"
                                    "import time\ntime.sleep(60)\n",
                                    &l, NULL, 0);
    assert_int_equal(r->status, SBX_TIMEOUT);
    assert_int_equal(r->limit, SBX_LIMIT_WALL);
    sbx_result_free(r);
}

static void thread_bomb_is_bounded(void **state)
{
    struct sbx_limits l;
    sbx_limits_init(&l);
    l.wall_seconds = 5; /* a thread that dies of MemoryError as it starts leaves start() waiting */
    struct sbx_result *r = run_with(SBX(state),
                                    "import threading, time\n"
                                    "threading.stack_size(65536)\n"
                                    "n = 0\n"
                                    "try:\n"
                                    "    while True:\n"
                                    "        threading.Thread(target=time.sleep, args=(30,),"
                                    " daemon=True).start()\n"
                                    "        n += 1\n"
                                    "except (RuntimeError, MemoryError) as e:\n"
                                    "    print('stopped at', 'many' if n > 10 else n, flush=True)\n"
                                    "import os\nos._exit(0)\n",
                                    &l, NULL, 0);
    /* Refused, out of memory or out of time: bounded, whichever comes first. */
    if (r->status != SBX_MEMORY_LIMIT && r->status != SBX_TIMEOUT)
        expect_output(r, "stopped at many\n");
    else
        sbx_result_free(r);
    expect_output(run(state, "print('alive')\n"), "alive\n");
}

static void deep_recursion_ends_the_run_only(void **state)
{
    /* Python frames: memory runs out, or the recursion limit is met. */
    struct sbx_limits l;
    sbx_limits_init(&l);
    l.memory_bytes = 64 << 20;
    l.cpu_seconds = 20;
    l.wall_seconds = 20;
    struct sbx_result *r = run_with(SBX(state),
                                    "import sys\nsys.setrecursionlimit(10**8)\n"
                                    "def f(n):\n    return f(n + 1) + 1\nf(0)\n",
                                    &l, NULL, 0);
    if (!(r->status == SBX_MEMORY_LIMIT || (r->status == SBX_COMPLETED && r->exit_code == 1) ||
          (r->status == SBX_CRASHED && r->signal == SIGSEGV)))
        fail_msg("Python recursion: %s (%s)", sbx_status_name(r->status), r->reason);
    sbx_result_free(r);
    /* C recursion past the stack: the worker dies of SIGSEGV, alone. */
    r = run(state, "import sys\nsys.setrecursionlimit(10**8)\n"
                   "x = []\nfor _ in range(10**6):\n    x = [x]\nrepr(x)\n");
    if (!(r->status == SBX_CRASHED && r->signal == SIGSEGV) &&
        !(r->status == SBX_COMPLETED && r->exit_code == 1))
        fail_msg("C recursion: %s (%s)", sbx_status_name(r->status), r->reason);
    sbx_result_free(r);
    expect_output(run(state, "print('alive')\n"), "alive\n");
}

static void mmap_of_64_gib_is_refused(void **state)
{
    expect_output(run(state, "import mmap\n"
                             "try:\n    m = mmap.mmap(-1, 64 << 30)\n    print('mapped')\n"
                             "except (OSError, MemoryError) as e:\n    print('refused')\n"),
                  "refused\n");
}

/* --- the host's files and memory ------------------------------------------- */

static void world_readable_host_files_are_out_of_reach(void **state)
{
    /* Files ordinary permissions let anyone read: only the file-system
     * confinement keeps them from the code. (/etc/passwd under the private
     * root is the sandbox's own, naming its users, root and nobody; every
     * Debian host's names daemon.) */
    expect_output(run(state, "hits = []\n"
                             "for p in ('/etc/hostname', '/etc/os-release', '/etc/fstab',\n"
                             "          '/usr/share/common-licenses/GPL-3', '/etc/passwd'):\n"
                             "    try:\n"
                             "        text = open(p).read()\n"
                             "        if p != '/etc/passwd' or 'daemon:' in text:\n"
                             "            hits.append(p)\n"
                             "    except OSError:\n"
                             "        pass\n"
                             "print(hits)\n"),
                  "[]\n");
}

static void a_run_cannot_fake_a_policy_stop(void **state)
{
    /* SIGSYS ends a run only when the policy stops it: the code cannot
     * send it to itself. */
    expect_output(run(state, "import os, signal\n"
                             "for f in (lambda: os.kill(os.getpid(), signal.SIGSYS),\n"
                             "          lambda: os.kill(0, signal.SIGSYS),\n"
                             "          lambda: signal.raise_signal(signal.SIGSYS)):\n"
                             "    try:\n"
                             "        f()\n"
                             "    except OSError:\n"
                             "        print('refused')\n"),
                  "refused\nrefused\nrefused\n");
}

static void a_file_planted_in_the_hosts_home_is_unreadable(void **state)
{
    /* World-readable, so only the file system confinement stands between. */
    expect_output(run(state,
                      "import os\n"
                      "try:\n    open('%s').read()\n    print('read')\n"
                      "except (PermissionError, FileNotFoundError):\n    print('refused')\n"
                      "try:\n    os.listdir('%s')\n    print('listed')\n"
                      "except (PermissionError, FileNotFoundError):\n    print('refused')\n",
                      secret_file, host_dir),
                  "refused\nrefused\n");
}

static void writing_outside_the_workspace_is_refused(void **state)
{
    expect_output(run(state,
                      "import os\n"
                      "for p in ('%s', '/tmp/pysbx-escape-marker', '/dev/shm/x', '/var/tmp/x'):\n"
                      "    try:\n        open(p, 'w').write('x')\n        print('wrote', p)\n"
                      "    except OSError:\n        print('refused')\n",
                      marker),
                  "refused\nrefused\nrefused\nrefused\n");
    host_untouched();
    assert_int_equal(access("/tmp/pysbx-escape-marker", F_OK), -1);
}

static void other_processes_environ_is_unreadable(void **state)
{
    expect_output(run(state,
                      "import os\n"
                      "for pid in (os.getppid(), 1, %d):\n"
                      "    try:\n        open(f'/proc/{pid}/environ', 'rb').read()\n"
                      "        print('read')\n"
                      "    except OSError:\n        print('refused')\n",
                      (int)getpid()),
                  "refused\nrefused\nrefused\n");
}

static void an_inherited_descriptor_is_not_there(void **state)
{
    expect_output(run(state,
                      "import os\n"
                      "try:\n    os.read(%d, 100)\n    print('read')\n"
                      "except OSError as e:\n    print(e.strerror)\n"
                      "open_fds = []\n"
                      "for fd in range(3, 1024):\n"
                      "    try:\n        os.fstat(fd)\n        open_fds.append(fd)\n"
                      "    except OSError:\n        pass\n"
                      "print(open_fds)\n",
                      inherited_fd),
                  /* A session's cell has one more, its own: the channel
                   * on which it tells the template how it ended (what it
                   * may send there is in the security model). */
                  getenv("PYSBX_TEST_SESSION") ? "Bad file descriptor\n[4]\n"
                                               : "Bad file descriptor\n[]\n");
}

static void closing_stdout_and_stderr_then_sleeping_still_times_out(void **state)
{
    struct sbx_limits l;
    sbx_limits_init(&l);
    l.wall_seconds = 0.5;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct sbx_result *r = run_with(SBX(state),
                                    "import os, time\nprint('bye', flush=True)\n"
                                    "os.close(1)\nos.close(2)\ntime.sleep(60)\n",
                                    &l, NULL, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_int_equal(r->status, SBX_TIMEOUT);
    assert_string_equal(r->stdout_text, "bye\n");
    assert_true(t1.tv_sec - t0.tv_sec < 5);
    sbx_result_free(r);
}

static void fake_result_bytes_on_every_descriptor_change_nothing(void **state)
{
    /* A session's cell has its channel to the template at 4, where a
     * message out of turn ends the session (test_session_trust). */
    struct sbx_result *r =
        run(state,
            "import os, struct, sys\n"
            "fake_json = b'{\"status\":\"completed\",\"exit_code\":0}\\n'\n"
            /* a status message as the template would write it */
            "fake_status = struct.pack('<IiIIqqq', 0x70737473, 0, 1, 0, 0, 0, 0)\n"
            "for fd in range(0, 64):\n"
            "    for b in (fake_json, fake_status):\n"
            "        try:\n            fd != %d and os.write(fd, b)\n"
            "        except OSError:\n            pass\n"
            "sys.exit(3)\n",
            getenv("PYSBX_TEST_SESSION") ? 4 : -1);
    expect_completed(r, 3);
    sbx_result_free(r);
    r = run(state, "import os, signal\nos.write(1, b'exit_code 0\\n')\n"
                   "os.kill(os.getpid(), signal.SIGSEGV)\n");
    assert_int_equal(r->status, SBX_CRASHED);
    assert_int_equal(r->signal, SIGSEGV);
    sbx_result_free(r);
}

static void other_devices_are_refused(void **state)
{
    expect_output(run(state, "for p in ('/dev/mem', '/dev/kmsg', '/dev/sda', '/dev/tty'):\n"
                             "    try:\n        open(p, 'rb').read(1)\n        print('read', p)\n"
                             "    except OSError:\n        print('refused')\n"
                             "print(len(open('/dev/urandom', 'rb').read(8)))\n"),
                  "refused\nrefused\nrefused\nrefused\n8\n");
}

/* Without the private root the workspace's parent is the work root, whose
 * listing is refused; under it, "/" of the private root, which may be
 * listed and holds only the fixed places: no other workspace either way. */
static void the_work_root_and_other_workspaces_are_not_listable(void **state)
{
    expect_output(run(state,
                      "import os\n"
                      "fixed = {'dev', 'etc', 'lib', 'lib32', 'lib64', 'libx32', 'sys', 'usr',\n"
                      "         'workspace', '.pysbx-scratch'}\n"
                      "try:\n"
                      "    names = os.listdir(os.path.dirname(os.getcwd()))\n"
                      "except PermissionError:\n"
                      "    print('no other workspace')\n"
                      "else:\n"
                      "    print(sorted(set(names) - fixed) or 'no other workspace')\n"),
                  "no other workspace\n");
}

int main(void)
{
    if (getpid() != 1) {
        fprintf(stderr, "test_escape must run as pid 1 of its own pid namespace "
                        "(tests/in_pidns.sh): a broken layer could otherwise hurt this host\n");
        return 1;
    }
    /* Host state an escape would reach: a directory and a secret outside any
     * workspace, and a descriptor open in the host. */
    const char *home = getenv("HOME");
    snprintf(host_dir, sizeof(host_dir), "%s/.pysbx-escape-XXXXXX",
             home && access(home, W_OK) == 0 ? home : "/tmp");
    if (!mkdtemp(host_dir))
        return 1;
    chmod(host_dir, 0755);
    snprintf(marker, sizeof(marker), "%s/marker", host_dir);
    snprintf(secret_file, sizeof(secret_file), "%s/secret.txt", host_dir);
    FILE *f = fopen(secret_file, "w");
    fputs("host secret\n", f);
    fclose(f);
    chmod(secret_file, 0644);
    /* Deliberately inheritable, and above the numbers a worker or a
     * session's cell uses for its own (0 to 7), which it would find open
     * for a reason unrelated to the host's. */
    int fd = open(secret_file, O_RDONLY);
    inherited_fd = fd >= 0 ? fcntl(fd, F_DUPFD, 100) : -1;
    if (fd >= 0)
        close(fd);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(raw_inet_socket_via_ctypes_is_refused),
        cmocka_unit_test(unix_socket_via_ctypes_is_refused),
        cmocka_unit_test(netlink_socket_via_ctypes_is_refused),
        cmocka_unit_test(real_socket_module_restored_still_cannot_connect),
        cmocka_unit_test(ssl_takes_nothing_for_a_kernel_socket),
        cmocka_unit_test(io_uring_is_not_there),
        cmocka_unit_test(fork_fails),
        cmocka_unit_test(vfork_fails),
        cmocka_unit_test(clone3_is_not_there),
        cmocka_unit_test(subprocess_fails_and_nothing_runs),
        cmocka_unit_test(os_system_runs_nothing),
        cmocka_unit_test(posix_spawn_fails),
        cmocka_unit_test(execv_fails_and_the_code_goes_on),
        cmocka_unit_test(x32_system_call_kills),
        cmocka_unit_test(unshare_kills),
        cmocka_unit_test(ptrace_of_the_parent_kills),
        cmocka_unit_test(mount_kills),
        cmocka_unit_test(killing_the_parent_pid_1_and_everyone_is_refused),
        cmocka_unit_test(raising_rlimits_is_refused),
        cmocka_unit_test(ignoring_sigterm_does_not_stop_the_deadline),
        cmocka_unit_test(thread_bomb_is_bounded),
        cmocka_unit_test(deep_recursion_ends_the_run_only),
        cmocka_unit_test(mmap_of_64_gib_is_refused),
        cmocka_unit_test(world_readable_host_files_are_out_of_reach),
        cmocka_unit_test(a_run_cannot_fake_a_policy_stop),
        cmocka_unit_test(a_file_planted_in_the_hosts_home_is_unreadable),
        cmocka_unit_test(writing_outside_the_workspace_is_refused),
        cmocka_unit_test(other_processes_environ_is_unreadable),
        cmocka_unit_test(an_inherited_descriptor_is_not_there),
        cmocka_unit_test(closing_stdout_and_stderr_then_sleeping_still_times_out),
        cmocka_unit_test(fake_result_bytes_on_every_descriptor_change_nothing),
        cmocka_unit_test(other_devices_are_refused),
        cmocka_unit_test(the_work_root_and_other_workspaces_are_not_listable),
    };
    int rc = cmocka_run_group_tests(tests, fixture_open, fixture_close);
    close(inherited_fd);
    remove_dir(host_dir);
    return rc;
}
