/*
 * Kept files: regular files of its workspace that a session's state holds
 * open from one cell to the next (a sqlite3 connection, a log, a private
 * mapping), through the public API. A cell that fails leaves each one's
 * content, offset and flags as the state had them, whatever it did to them
 * (wrote, seeked, truncated, made them huge, renamed, deleted, replaced
 * them by a link); what cannot be kept (a pipe, a directory, an eventfd,
 * a file outside the workspace, an O_PATH descriptor, a deleted file, a
 * lock, more than 64 files) rolls the cell back, and the reason names the
 * descriptor and what it is; a branch carries kept files as copies of its
 * own.
 *
 * Runs as pid 1 of its own pid namespace (tests/in_pidns.sh).
 */
#define _GNU_SOURCE
#include "session_helpers.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SBX(state) (((struct fixture *)*(state))->sbx)

/* A cell that completes but cannot be kept: its reason has each of |parts|
 * (NULL-ended). */
static void refused(struct sbx_session *s, const char *code, const char *const *parts)
{
    struct sbx_result *r = cell(s, code);

    expect_completed(r, 0);
    if (!r->rolled_back)
        fail_msg("a cell that left what cannot be kept was kept: %s", code);
    for (const char *const *p = parts; *p; p++)
        if (!r->reason || !strstr(r->reason, *p))
            fail_msg("the reason does not say \"%s\": %s\n(code: %s)", *p,
                     r->reason ? r->reason : "(none)", code);
    sbx_result_free(r);
}

/* The state has f at offset 5; a cell writes 100 bytes, seeks, truncates
 * and raises: the next finds the offset and the content the state had, and
 * goes on from there. */
static void a_file_kept_open_rolls_back_its_content_and_offset(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);

    expect_cell(s, "f = open('log.txt', 'w+')\nf.write('hello')\nf.flush()\nprint(f.tell())",
                "5\n");
    expect_rolled_back(s, "f.write('x' * 100)\nf.flush()\nf.seek(2)\nf.truncate()");
    expect_cell(s, "print(f.tell(), repr(open('log.txt').read()))", "5 'hello'\n");
    expect_cell(s, "f.write(' world')\nf.flush()\nprint(f.tell(), open('log.txt').read())",
                "11 hello world\n");
    /* A cell stopped by the sandbox rolls back the same way. */
    int rc;
    struct sbx_error err = {0};
    struct sbx_result *r = cell_full(s, "f.seek(0)\nf.write('X' * 50)\nf.flush()\nwhile True: pass",
                                     SBX_ROLLBACK_ON_ERROR, 1.0, NULL, 0, &rc, &err);
    if (rc < 0 || !r->rolled_back || r->status != SBX_TIMEOUT)
        fail_msg("a cell past its time was not rolled back");
    sbx_result_free(r);
    expect_cell(s, "print(f.tell(), open('log.txt').read())", "11 hello world\n");
    sbx_session_close(s);
}

/* The description's flags (O_APPEND, O_NONBLOCK) and the descriptor's
 * close-on-exec flag come back as the state had them; a kept cell's own
 * changes stay. */
static void flags_and_close_on_exec_are_the_states(void **state)
{
    static const char show[] = "print(bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND), "
                               "os.get_inheritable(fd), os.get_blocking(fd))\n";
    struct sbx_session *s = open_session(SBX(state), NULL);
    char code[512];

    snprintf(code, sizeof(code),
             "import os, fcntl\nf = open('a.log', 'a')\nf.write('1')\nf.flush()\nfd = "
             "f.fileno()\n%s",
             show);
    expect_cell(s, code, "True False True\n");
    expect_rolled_back(
        s, "os.set_blocking(fd, False)\n"
           "os.set_inheritable(fd, True)\n"
           "fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_APPEND)\n"
           "os.lseek(fd, 0, os.SEEK_SET)\n"
           "os.write(fd, b'X')");
    snprintf(code, sizeof(code), "%sf.write('2')\nf.flush()\nprint(open('a.log').read())", show);
    expect_cell(s, code, "True False True\n12\n");
    expect_cell(s, "os.set_inheritable(fd, True)", "");
    expect_cell(s, show, "True True True\n");
    sbx_session_close(s);
}

/* A sqlite3 connection kept in a variable: the next cells query it; a cell
 * that committed and then failed leaves the database as the state had it;
 * a transaction left open is a lock the next cell could not hold, and says
 * so. */
static void a_sqlite_connection_is_kept(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);

    expect_cell(s,
                "import sqlite3\nc = sqlite3.connect('db.sqlite')\n"
                "c.execute('create table t (x)')\nc.execute('insert into t values (1)')\n"
                "c.commit()",
                "");
    expect_rolled_back(s, "c.execute('insert into t values (2)')\nc.commit()\n"
                          "print(c.execute('select count(*) from t').fetchone()[0])");
    expect_cell(s,
                "print(c.execute('select x from t').fetchall())\n"
                "c.execute('insert into t values (3)')\nc.commit()\n"
                "print(c.execute('select x from t').fetchall())",
                "[(1,)]\n[(1,), (3,)]\n");
    refused(s, "c.execute('insert into t values (4)')",
            (const char *const[]){"lock", "transaction", NULL});
    expect_cell(s, "print(c.in_transaction, c.execute('select x from t').fetchall())",
                "False [(1,), (3,)]\n");
    expect_cell(s,
                "print(sqlite3.connect('db.sqlite').execute('select count(*) from t').fetchone())",
                "(2,)\n");
    sbx_session_close(s);
}

/* A private mapping of a file (mmap with MAP_PRIVATE, whose object keeps
 * a descriptor): a failed cell's writes to the file are undone under it. */
static void a_private_mapping_of_a_kept_file(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);

    expect_cell(s,
                "import mmap, os\nopen('m.bin', 'wb').write(b'abcdef')\n"
                "fd = os.open('m.bin', os.O_RDONLY)\n"
                "m = mmap.mmap(fd, 0, mmap.MAP_PRIVATE, mmap.PROT_READ)\nos.close(fd)\n"
                "print(m[:])",
                "b'abcdef'\n");
    expect_rolled_back(
        s, "with open('m.bin', 'r+b') as g:\n    g.write(b'XYZ')\nassert m[:3] == b'XYZ'");
    expect_cell(s, "print(m[:], open('m.bin', 'rb').read())", "b'abcdef' b'abcdef'\n");
    sbx_session_close(s);
}

/* A failed cell renames a kept file, links it elsewhere, deletes it,
 * replaces it by a symbolic link: the file comes back at its name, as the
 * state's descriptor's file (in its own inode wherever the cell left the
 * inode a name; a new one, which the state takes on, where it left none),
 * with its content and offset. */
static void a_kept_file_renamed_or_deleted_comes_back(void **state)
{
    static const char check[] =
        "print(os.fstat(f.fileno()).st_ino == os.stat('k.txt').st_ino, f.tell(), "
        "open('k.txt').read(), sorted(os.listdir('.')))";
    struct sbx_session *s = open_session(SBX(state), NULL);
    char code[512];

    expect_cell(s,
                "import os\nf = open('k.txt', 'w+')\nf.write('kept')\nf.flush()\n"
                "ino = os.fstat(f.fileno()).st_ino",
                "");
    expect_rolled_back(s, "os.rename('k.txt', 'moved.txt')\nf.write(' more')\nf.flush()");
    snprintf(code, sizeof(code), "print(os.stat('k.txt').st_ino == ino)\n%s", check);
    expect_cell(s, code, "True\nTrue 4 kept ['k.txt']\n");
    expect_rolled_back(
        s, "os.mkdir('d')\nos.link('k.txt', 'd/k2.txt')\nos.remove('k.txt')\nf.write('?')\n"
           "f.flush()");
    expect_cell(s, code, "True\nTrue 4 kept ['k.txt']\n");
    expect_rolled_back(s, "os.remove('k.txt')\nf.write(' gone')\nf.flush()");
    expect_cell(s, check, "True 4 kept ['k.txt']\n");
    expect_cell(s, "f.write('!')\nf.flush()\nprint(open('k.txt').read())", "kept!\n");
    expect_rolled_back(s, "os.remove('k.txt')\nos.symlink('/etc/passwd', 'k.txt')");
    expect_cell(s,
                "print(os.path.islink('k.txt'))\n"
                "f.seek(0)\nprint(f.read())",
                "False\nkept!\n");
    sbx_session_close(s);
}

/* A failed cell makes a kept file huge and sparse: it comes back small,
 * and the descriptor where it was. */
static void a_kept_file_made_huge_comes_back(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);

    expect_cell(s, "import os\nf = open('h.bin', 'w+b')\nf.write(b'small')\nf.flush()", "");
    expect_rolled_back(s, "f.truncate(100 << 20)\nf.seek(99 << 20)\nf.write(b'end')\nf.flush()");
    expect_cell(s, "print(os.stat('h.bin').st_size, f.tell(), open('h.bin', 'rb').read())",
                "5 5 b'small'\n");
    sbx_session_close(s);
}

/* 64 files kept, each at its own offset, through a failed cell that moved
 * every one. */
static void sixty_four_files_are_kept(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);

    expect_cell(s,
                "fs = [open('f%02d' % i, 'w+') for i in range(64)]\n"
                "for i, f in enumerate(fs):\n    f.write('x' * i)\n    f.flush()",
                "");
    expect_rolled_back(s, "for f in fs:\n    f.seek(0)\n    f.write('changed')\n    f.flush()");
    expect_cell(s,
                "print(all(f.tell() == i for i, f in enumerate(fs)),\n"
                "      all(open('f%02d' % i).read() == 'x' * i for i in range(64)))",
                "True True\n");
    sbx_session_close(s);
}

/* What a session cannot keep rolls the cell back, and the reason names
 * the descriptor (the number the code printed) and what it is. */
static void what_cannot_be_kept_is_named(void **state)
{
    static const struct {
        const char *code, *what;
    } cases[] = {
        {"import os\nr, w = os.pipe()\nprint(r)", "a pipe"},
        {"import os\nd = os.open('.', os.O_RDONLY)\nprint(d)", "a directory"},
        {"import os\nopen('p', 'w').close()\nd = os.open('p', os.O_PATH)\nprint(d)", "O_PATH"},
        {"import os\ne = os.eventfd(0)\nprint(e)", "eventfd"},
        {"import os\ng = open(os.__file__)\nprint(g.fileno())", "outside the session's workspace"},
        {"import os\nd = os.dup(0)\nprint(d)", "a device"},
        {"import os\nf = open('gone.txt', 'w')\nos.remove('gone.txt')\nprint(f.fileno())",
         "deleted"},
        {"import tempfile\nt = tempfile.TemporaryFile()\nprint(t.fileno())", "deleted"},
        /* The sandbox's own report of a value is written afresh at the
         * cell's end: a descriptor of one the code made is of a deleted
         * file by then. */
        {"f = open('.pysbx-value', 'w')\nprint(f.fileno())", "deleted"},
    };
    struct sbx_session *s = open_session(SBX(state), NULL);

    expect_cell(s, "x = 1", "");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sbx_result *r = cell(s, cases[i].code);
        char fd[32];
        expect_completed(r, 0);
        snprintf(fd, sizeof(fd), "fd %d (", atoi(r->stdout_text));
        if (!r->rolled_back || !r->reason || !strstr(r->reason, fd) ||
            !strstr(r->reason, cases[i].what))
            fail_msg("%s\nrolled back %d, reason: %s (wanted \"%s\" and \"%s\")", cases[i].code,
                     r->rolled_back, r->reason ? r->reason : "(none)", fd, cases[i].what);
        sbx_result_free(r);
    }
    refused(s, "fs = [open('f%d' % i, 'w') for i in range(65)]",
            (const char *const[]){"65 files", "at most 64", NULL});
    refused(s, "import fcntl\nh = open('l', 'w')\nfcntl.flock(h, fcntl.LOCK_EX)",
            (const char *const[]){"lock", NULL});
    refused(s, "import fcntl\nh = open('l', 'w')\nfcntl.lockf(h, fcntl.LOCK_EX)",
            (const char *const[]){"lock", NULL});
    /* None of them left anything behind, and what may be kept is. */
    expect_cell(s,
                "import os\ntry:\n    os.memfd_create('m')\nexcept PermissionError:\n"
                "    print('refused')\nprint(x, sorted(os.listdir('.')))",
                "refused\n1 []\n");
    sbx_session_close(s);
}

/* The state's memory is the tenant's, and so is what it does while it is
 * let run to fork the next cell: here a SIGCONT handler of its own (a C
 * callback, through ctypes) puts a FIFO at its kept file's number. The
 * template gives the cell only what, looked at, is the regular file that
 * was kept: the cell finds that number closed, never the FIFO, and the
 * sandbox goes on (a plain run meanwhile answers). */
static void a_state_that_swaps_a_kept_descriptor_is_not_believed(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);

    expect_cell(s,
                "import ctypes, os, signal, stat\n"
                "open('k.txt', 'w').write('kept')\n"
                "f = open('k.txt')\n"
                "os.mkfifo('fifo')\n"
                "N = f.fileno()\n"
                "def swap(sig):\n"
                "    fd = os.open('fifo', os.O_RDWR | os.O_NONBLOCK)\n"
                "    os.dup2(fd, N)\n"
                "    os.close(fd)\n"
                "handler = ctypes.CFUNCTYPE(None, ctypes.c_int)(swap)\n"
                "libc = ctypes.CDLL(None)\n"
                "libc.signal.restype = ctypes.c_void_p\n"
                "libc.signal(signal.SIGCONT, handler)",
                "");
    expect_stdout(SBX(state), "print(6 * 7)", "42\n");
    expect_cell(s,
                "try:\n"
                "    print(stat.S_ISFIFO(os.fstat(N).st_mode), f.read())\n"
                "except OSError as e:\n"
                "    print(e.errno == __import__('errno').EBADF)",
                "True\n");
    expect_stdout(SBX(state), "print(6 * 7)", "42\n");
    sbx_session_close(s);
}

/* A branch of a state with kept files carries them as copies of its own:
 * its writes, seeks and rollbacks are its own, and its origin's are the
 * origin's. */
static void a_branch_carries_kept_files(void **state)
{
    static const char show[] = "print(c.execute('select x from t').fetchall(), f.tell(), "
                               "open('log.txt').read())";
    struct sbx_session *a = open_session(SBX(state), NULL);

    expect_cell(a,
                "import sqlite3\nc = sqlite3.connect('db.sqlite')\n"
                "c.execute('create table t (x)')\nc.execute('insert into t values (1)')\n"
                "c.commit()\nf = open('log.txt', 'w+')\nf.write('hello')\nf.flush()",
                "");
    struct sbx_session *b = expect_fork(a);
    expect_cell(b,
                "c.execute('insert into t values (2)')\nc.commit()\nf.write(' from b')\n"
                "f.flush()\nprint(c.execute('select x from t').fetchall(), f.tell(), "
                "open('log.txt').read())",
                "[(1,), (2,)] 12 hello from b\n");
    expect_cell(a, show, "[(1,)] 5 hello\n");
    expect_rolled_back(
        b, "f.seek(0)\nf.write('XXXXX')\nf.flush()\nc.execute('delete from t')\nc.commit()");
    expect_cell(b, show, "[(1,), (2,)] 12 hello from b\n");
    struct sbx_session *c = expect_fork(b);
    expect_cell(c,
                "f.write('!')\nf.flush()\n"
                "print(open('log.txt').read())",
                "hello from b!\n");
    expect_cell(b, show, "[(1,), (2,)] 12 hello from b\n");
    sbx_session_close(c);
    sbx_session_close(b);
    sbx_session_close(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_file_kept_open_rolls_back_its_content_and_offset),
        cmocka_unit_test(flags_and_close_on_exec_are_the_states),
        cmocka_unit_test(a_sqlite_connection_is_kept),
        cmocka_unit_test(a_private_mapping_of_a_kept_file),
        cmocka_unit_test(a_kept_file_renamed_or_deleted_comes_back),
        cmocka_unit_test(a_kept_file_made_huge_comes_back),
        cmocka_unit_test(sixty_four_files_are_kept),
        cmocka_unit_test(what_cannot_be_kept_is_named),
        cmocka_unit_test(a_state_that_swaps_a_kept_descriptor_is_not_believed),
        cmocka_unit_test(a_branch_carries_kept_files),
    };
    if (getenv("TEST_FILTER"))
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, fixture_open, fixture_close);
}
