/*
 * A session's files roll back exactly, or the cell says why they could
 * not: the ordinary things code does to a workspace (read-only and locked
 * directories, unreadable and write-only files, sparse files, deep trees
 * and long paths, hard links, a file turned into a directory), each made
 * in a kept cell, changed in a failed one, and checked in the next; and
 * the supervisor's memory bounded whatever a cell leaves.
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

/* Three cells: |make| kept, |change| (which ends by raising) rolled back,
 * then |check| must print |want|; the session goes on after. */
static void rolls_back(void **state, const char *make, const char *change, const char *check,
                       const char *want)
{
    struct sbx_session *s = open_session(SBX(state), NULL);

    expect_cell(s, make, "");
    expect_rolled_back(s, change);
    expect_cell(s, check, want);
    /* And the session goes on: the state and its files can be kept again. */
    expect_cell(s, "open('later.txt', 'w').write('l')", "");
    expect_cell(s, "print(open('later.txt').read())", "l\n");
    sbx_session_close(s);
}

/* The same, the middle cell kept: |check| sees what it left. */
static void is_kept(void **state, const char *make, const char *change, const char *check,
                    const char *want)
{
    struct sbx_session *s = open_session(SBX(state), NULL);

    expect_cell(s, make, "");
    expect_cell(s, change, "");
    expect_cell(s, check, want);
    sbx_session_close(s);
}

#define READ_ONLY_DIR                                                                              \
    "import os\n"                                                                                  \
    "os.mkdir('ro')\n"                                                                             \
    "open('ro/f', 'w').write('f')\n"                                                               \
    "os.chmod('ro', 0o555)\n"

static void a_read_only_directory(void **state)
{
    rolls_back(state, READ_ONLY_DIR,
               "import os\n"
               "os.chmod('ro', 0o755)\n"
               "open('ro/g', 'w').write('g')\n"
               "open('ro/f', 'w').write('changed')\n"
               "os.chmod('ro', 0o500)\n",
               "import os\n"
               "print(sorted(os.listdir('ro')), open('ro/f').read(), oct(os.stat('ro').st_mode & "
               "0o7777))\n",
               "['f'] f 0o555\n");
}

#define UNREADABLE                                                                                 \
    "import os\n"                                                                                  \
    "open('secret', 'w').write('s')\n"                                                             \
    "os.chmod('secret', 0)\n"                                                                      \
    "open('wo', 'w').write('w')\n"                                                                 \
    "os.chmod('wo', 0o200)\n"                                                                      \
    "os.makedirs('locked/in')\n"                                                                   \
    "open('locked/in/x', 'w').write('x')\n"                                                        \
    "os.chmod('locked', 0)\n"
#define READ_UNREADABLE                                                                            \
    "import os\n"                                                                                  \
    "modes = [oct(os.stat(p).st_mode & 0o7777) for p in ('secret', 'wo', 'locked')]\n"             \
    "for p in ('secret', 'wo', 'locked'):\n"                                                       \
    "    os.chmod(p, 0o700)\n"                                                                     \
    "print(modes, open('secret').read(), open('wo').read(), open('locked/in/x').read())\n"

static void unreadable_and_write_only_files_and_a_locked_directory(void **state)
{
    rolls_back(state, UNREADABLE,
               "import os\n"
               "for p in ('secret', 'wo', 'locked'):\n"
               "    os.chmod(p, 0o700)\n"
               "open('secret', 'w').write('changed')\n"
               "open('wo', 'w').write('changed')\n"
               "open('locked/in/x', 'w').write('changed')\n"
               "open('locked/in/y', 'w').write('new')\n"
               "os.chmod('secret', 0)\n"
               "os.chmod('locked', 0)\n",
               READ_UNREADABLE, "['0o0', '0o200', '0o0'] s w x\n");
    /* Kept as they are, too. */
    is_kept(state, "x = 1", UNREADABLE, READ_UNREADABLE, "['0o0', '0o200', '0o0'] s w x\n");
}

static void a_sparse_file_stays_sparse(void **state)
{
    rolls_back(state,
               "f = open('sparse', 'wb')\n"
               "f.truncate(512 << 20)\n"
               "f.seek(300 << 20)\n"
               "f.write(b'middle')\n"
               "f.close()\n",
               "f = open('sparse', 'r+b')\n"
               "f.seek(100 << 20)\n"
               "f.write(b'y' * (1 << 20))\n"
               "f.close()\n",
               "import os\n"
               "st = os.stat('sparse')\n"
               "f = open('sparse', 'rb')\n"
               "f.seek(100 << 20)\n"
               "a = f.read(4)\n"
               "f.seek(300 << 20)\n"
               "print(st.st_size >> 20, st.st_blocks * 512 < (16 << 20), a, f.read(6))\n"
               "f.close()\n",
               "512 True b'\\x00\\x00\\x00\\x00' b'middle'\n");
}

static void a_deep_tree_and_a_long_path(void **state)
{
    rolls_back(state,
               "import os\n"
               "os.makedirs('/'.join(['d'] * 70))\n"
               "open('/'.join(['d'] * 70 + ['leaf']), 'w').write('deep')\n"
               /* Longer than PATH_MAX as one path: made a level at a time. */
               "here = os.getcwd()\n"
               "for i in range(20):\n"
               "    os.mkdir(chr(97 + i) * 250)\n"
               "    os.chdir(chr(97 + i) * 250)\n"
               "open('far', 'w').write('far')\n"
               "os.chdir(here)\n",
               "import os\n"
               "open('/'.join(['d'] * 70 + ['leaf']), 'w').write('changed')\n"
               "os.makedirs('/'.join(['d'] * 80))\n"
               "here = os.getcwd()\n"
               "for i in range(20):\n"
               "    os.chdir(chr(97 + i) * 250)\n"
               "open('far', 'w').write('changed')\n"
               "os.chdir(here)\n",
               "import os\n"
               "here = os.getcwd()\n"
               "for i in range(20):\n"
               "    os.chdir(chr(97 + i) * 250)\n"
               "far = open('far').read()\n"
               "os.chdir(here)\n"
               "print(open('/'.join(['d'] * 70 + ['leaf'])).read(), far,\n"
               "      os.path.exists('/'.join(['d'] * 71)))\n",
               "deep far False\n");
}

static void hard_links_stay_one_file(void **state)
{
    static const char check[] =
        "import os\n"
        "a, b, c = os.stat('a'), os.stat('sub/b'), os.stat('c')\n"
        "print(a.st_ino == b.st_ino, a.st_nlink, c.st_ino != a.st_ino, open('sub/b').read())\n";

    rolls_back(state,
               "import os\n"
               "open('a', 'w').write('1')\n"
               "os.mkdir('sub')\n"
               "os.link('a', 'sub/b')\n"
               "open('c', 'w').write('1')\n",
               "open('a', 'w').write('2')\n"
               "__import__('os').link('c', 'd')\n",
               check, "True 2 True 1\n");
    /* A link made by a kept cell is one file in the next. */
    is_kept(state, "open('a', 'w').write('1')\nopen('c', 'w').write('1')",
            "import os\nos.mkdir('sub')\nos.link('a', 'sub/b')\nopen('a', 'w').write('3')\n", check,
            "True 2 True 3\n");
}

static void a_file_becomes_a_directory_and_back(void **state)
{
    static const char make[] = "import os\n"
                               "open('x', 'w').write('file')\n"
                               "os.makedirs('y/z')\n"
                               "open('y/z/f', 'w').write('in y')\n";
    static const char change[] = "import os, shutil\n"
                                 "os.unlink('x')\n"
                                 "os.mkdir('x')\n"
                                 "open('x/inside', 'w').write('now a dir')\n"
                                 "shutil.rmtree('y')\n"
                                 "open('y', 'w').write('now a file')\n"
                                 "os.symlink('x', 'z')\n";

    rolls_back(state, make, change,
               "import os\n"
               "print(open('x').read(), open('y/z/f').read(), os.path.lexists('z'))\n",
               "file in y False\n");
    is_kept(state, make, change,
            "import os\n"
            "print(open('x/inside').read(), open('y').read(), os.readlink('z'))\n",
            "now a dir now a file x\n");
}

/* A cell that fills the workspace with names the supervisor would have to
 * hold: the supervisor's memory does not follow (the index is bounded and
 * said), and the session goes on. */
static void many_files_under_long_paths_do_not_grow_the_supervisor(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);

    expect_cell(s, "x = 1", "");
    long before = rss_kb();
    struct sbx_result *r = cell(s, "import os\n"
                                   "here = os.getcwd()\n"
                                   "for i in range(12):\n"
                                   "    os.mkdir(str(i % 10) * 250)\n"
                                   "    os.chdir(str(i % 10) * 250)\n"
                                   "n = 0\n"
                                   "try:\n"
                                   "    for n in range(32000):\n"
                                   "        open('f%05d' % n, 'w').close()\n"
                                   "except OSError as e:\n"
                                   "    print('stopped at', n, e.strerror)\n"
                                   "os.chdir(here)\n"
                                   "x = 2\n");
    long grown = rss_kb() - before;
    if (grown > 16 * 1024)
        fail_msg("a cell's 32,000 files grew the supervisor by %ld KiB", grown);
    /* Refused with its reason, or kept within the bound. */
    if (r->rolled_back && (!r->reason || !strstr(r->reason, "entries")))
        fail_msg("rolled back without saying why: %s", r->reason ? r->reason : "(none)");
    bool kept = !r->rolled_back;
    sbx_result_free(r);
    expect_cell(s, "print(x)", kept ? "2\n" : "1\n");
    sbx_session_close(s);
}

/* A pipe the cell leaves open would be shared with every fork of the
 * state (its content): the cell rolls back and says why, naming it;
 * closed, the same work is kept. (Regular files of the workspace may be
 * kept open: test_session_kept.c.) */
static void a_pipe_left_open_rolls_back_and_says_why(void **state)
{
    struct sbx_session *s = open_session(SBX(state), NULL);

    expect_cell(s, "x = 1", "");
    struct sbx_result *r = cell(s, "x = 2\nimport os\nr, w = os.pipe()\nos.write(w, b'hi')");
    expect_completed(r, 0);
    if (!r->rolled_back)
        fail_msg("a cell that left a pipe open was kept");
    if (!r->reason || !strstr(r->reason, "descriptor open") || !strstr(r->reason, "a pipe"))
        fail_msg("the reason does not say why: %s", r->reason ? r->reason : "(none)");
    sbx_result_free(r);
    expect_cell(s, "print(x, 'os' in globals())", "1 False\n");
    expect_cell(s,
                "import os\nr, w = os.pipe()\nos.write(w, b'hi')\nx = 3\nos.close(w)\n"
                "print(os.read(r, 2))\nos.close(r)",
                "b'hi'\n");
    expect_cell(s, "print(x)", "3\n");
    sbx_session_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_read_only_directory),
        cmocka_unit_test(unreadable_and_write_only_files_and_a_locked_directory),
        cmocka_unit_test(a_sparse_file_stays_sparse),
        cmocka_unit_test(a_deep_tree_and_a_long_path),
        cmocka_unit_test(hard_links_stay_one_file),
        cmocka_unit_test(a_file_becomes_a_directory_and_back),
        cmocka_unit_test(many_files_under_long_paths_do_not_grow_the_supervisor),
        cmocka_unit_test(a_pipe_left_open_rolls_back_and_says_why),
    };
    if (getenv("TEST_FILTER"))
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, fixture_open, fixture_close);
}
