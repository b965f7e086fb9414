/*
 * Images of sessions (sbx_session_save, sbx_session_restore) through the
 * public API: a state written to a descriptor comes back as a session of
 * its own (variables, imports, a half-run generator, files with their
 * links, holes, modes and times, the cell count); an image restores into
 * as many sessions as asked, each its own; a changed, cut or foreign image
 * is refused, saying why, and nothing of it runs; one forged to pass the
 * checks runs confined as any session, reaching nothing; with a fixed
 * layout an image outlives its sandbox; and a state that keeps files open
 * is not written.
 *
 * Runs as pid 1 of its own pid namespace (tests/in_pidns.sh), as the other
 * session tests do.
 */
#define _GNU_SOURCE
#include "session_helpers.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define SBX(state) (((struct fixture *)*(state))->sbx)

/* The variables (session_helpers.h), and files of every kind an image
 * carries: a tree, a hard link, a symbolic link, a FIFO, a sparse file,
 * a mode and a time. */
#define RICH_STATE                                                                                 \
    RICH_VARIABLES                                                                                 \
    "os.makedirs('d/e', exist_ok=True)\n"                                                          \
    "open('d/e/f.txt', 'w').write('deep')\n"                                                       \
    "os.link('d/e/f.txt', 'hard.txt')\n"                                                           \
    "os.symlink('d/e/f.txt', 'soft')\n"                                                            \
    "os.mkfifo('pipe')\n"                                                                          \
    "with open('sparse', 'wb') as f:\n"                                                            \
    "    f.seek(10 << 20); f.write(b'!')\n"                                                        \
    "open('private', 'w').write('p')\n"                                                            \
    "os.chmod('private', 0o640)\n"                                                                 \
    "os.utime('private', (1000000000, 1000000000))\n"
#define RICH_CHECK                                                                                 \
    "import os, stat\n"                                                                            \
    "s = os.stat('sparse')\n"                                                                      \
    "print(" RICH_VARIABLES_SEEN ", open('d/e/f.txt').read(),\n"                                   \
    "      os.stat('hard.txt').st_ino == os.stat('d/e/f.txt').st_ino, os.readlink('soft'),\n"      \
    "      stat.S_ISFIFO(os.lstat('pipe').st_mode), s.st_size, s.st_blocks * 512 < (1 << 20),\n"   \
    "      oct(os.stat('private').st_mode & 0o777), int(os.stat('private').st_mtime))\n"
#define RICH_WANT RICH_VARIABLES_WANT " deep True d/e/f.txt True 10485761 True 0o640 1000000000\n"

/* An image of |s| in a file of its own (unlinked): its descriptor, at 0. */
static int save_of(struct sbx_session *s)
{
    struct sbx_error err = {0};
    int fd = memfd_create("image", MFD_CLOEXEC);

    assert_true(fd >= 0);
    if (sbx_session_save(s, fd, &err) < 0)
        fail_msg("sbx_session_save: %s: %s", sbx_error_code_name(err.code), err.message);
    assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
    return fd;
}

static struct sbx_session *restore_of(struct sbx *sbx, int fd)
{
    struct sbx_session *s = NULL;
    struct sbx_error err = {0};

    assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
    if (sbx_session_restore(sbx, NULL, fd, &s, &err) < 0)
        fail_msg("sbx_session_restore: %s: %s", sbx_error_code_name(err.code), err.message);
    return s;
}

/* Restoring |fd| is refused as lost, saying |why_part|. */
static void expect_refused(struct sbx *sbx, int fd, const char *why_part, const char *what)
{
    struct sbx_session *s = NULL;
    struct sbx_error err = {0};

    assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
    int rc = sbx_session_restore(sbx, NULL, fd, &s, &err);
    if (rc == 0)
        fail_msg("%s: restored", what);
    assert_null(s);
    if (err.code != SBX_ERR_SESSION_LOST || !strstr(err.message, why_part))
        fail_msg("%s: refused as %s: %s", what, sbx_error_code_name(err.code), err.message);
}

/* The state after its last kept cell comes back: memory, files (hard and
 * symbolic links, a FIFO, a hole, a mode, a time), the cell count; and
 * the restored session rolls back to itself. */
static void a_state_comes_back_from_its_image(void **state)
{
    struct sbx_session *a = open_session(SBX(state), NULL);

    expect_cell(a, RICH_STATE, "");
    struct sbx_result *r = cell(a, "x = 99\nraise ValueError");
    assert_true(r->rolled_back);
    sbx_result_free(r);
    int fd = save_of(a);
    /* The session goes on after its image was written. */
    expect_cell(a, "x = 'after'", "");
    sbx_session_close(a);
    struct sbx_session *b = restore_of(SBX(state), fd);
    r = cell(b, RICH_CHECK);
    expect_completed(r, 0);
    if (strcmp(r->stdout_text, RICH_WANT) != 0)
        fail_msg("restored: %s%s", r->stdout_text, r->stderr_text);
    assert_int_equal(r->cell, 3); /* the two before its image, then this */
    sbx_result_free(r);
    r = cell(b, "x = 0\nopen('d/e/f.txt', 'w').write('gone')\nraise ValueError");
    assert_true(r->rolled_back);
    sbx_result_free(r);
    expect_cell(b, "print(x, open('d/e/f.txt').read())", "1 deep\n");
    sbx_session_close(b);
    close(fd);
}

/* Memory of a mapping the restoring process makes afresh comes back page
 * for page: what the state wrote, zeros where it has nothing; and nothing
 * of the restored session holds the userfaultfd it came in through. */
static void a_sparse_mapping_comes_back_page_for_page(void **state)
{
    struct sbx_session_limits l;
    sbx_session_limits_init(&l);
    l.memory_bytes = 1ULL << 30;
    struct sbx_session *a = open_session(SBX(state), &l);

    expect_cell(a, SPARSE_STATE, "");
    int fd = save_of(a);
    sbx_session_close(a);
    struct sbx_session *b = restore_of(SBX(state), fd);
    expect_cell(b, SPARSE_CHECK "print(m[0], m[4096], m[300 * 4096])",
                "5461 True\nb'0' b'\\x00' b'\\x00'\n");
    assert_true(descriptors_of(session_uid(b), "anon_inode:[userfaultfd]") <= 0);
    sbx_session_close(b);
    close(fd);
}

/* One image, two sessions: each its own uid, and neither sees the other. */
static void an_image_restores_into_sessions_of_their_own(void **state)
{
    struct sbx_session *a = open_session(SBX(state), NULL);

    expect_cell(a, "x = [1]\nopen('f', 'w').write('a')", "");
    int fd = save_of(a);
    struct sbx_session *b = restore_of(SBX(state), fd), *c = restore_of(SBX(state), fd);
    expect_cell(b, "x.append(2)\nopen('f', 'w').write('b')", "");
    expect_cell(c, "print(x, open('f').read())", "[1] a\n");
    expect_cell(a, "print(x, open('f').read())", "[1] a\n");
    if (geteuid() == 0) {
        uid_t ua = session_uid(a), ub = session_uid(b), uc = session_uid(c);
        assert_true(ua != ub && ub != uc && ua != uc);
    }
    sbx_session_close(a);
    sbx_session_close(b);
    sbx_session_close(c);
    close(fd);
}

/* A copy of the image in |fd| (|n| bytes) with byte |at| flipped, or cut
 * to |at| bytes: a new descriptor. */
static int changed_copy(int fd, size_t n, size_t at, bool cut)
{
    char *buf = malloc(n);
    int out = memfd_create("changed", MFD_CLOEXEC);

    assert_non_null(buf);
    assert_int_equal(pread(fd, buf, n, 0), (ssize_t)n);
    if (!cut)
        buf[at] ^= 0x20;
    assert_int_equal(write(out, buf, cut ? at : n), (ssize_t)(cut ? at : n));
    free(buf);
    return out;
}

/* Any byte of it changed, or the image cut anywhere: refused, and the
 * sandbox goes on. */
static void a_changed_or_cut_image_is_refused(void **state)
{
    struct sbx_session *a = open_session(SBX(state), NULL);

    expect_cell(a, "x = 'x' * 100000\nopen('f', 'w').write('f' * 5000)", "");
    int fd = save_of(a);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    size_t n = (size_t)st.st_size;
    /* Its head, the memory's head and map, pages, the files, the end. */
    size_t at[] = {3, 60, 200, 5000, n / 3, n / 2, n - 6000, n - 100, n - 3};
    for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++)
        for (int cut = 0; cut < 2; cut++) {
            int bad = changed_copy(fd, n, at[i], cut);
            char what[64];
            snprintf(what, sizeof(what), "%s at %zu of %zu", cut ? "cut" : "flipped", at[i], n);
            expect_refused(SBX(state), bad, "", what);
            close(bad);
        }
    /* The sandbox goes on, and the image itself still restores. */
    struct sbx_session *b = restore_of(SBX(state), fd);
    expect_cell(b, "print(len(x), len(open('f').read()))", "100000 5000\n");
    sbx_session_close(b);
    sbx_session_close(a);
    close(fd);
}

/* An image forged to pass every check (its hashes made again over what
 * was changed) but mapping what no state maps: refused, or run confined
 * as any session, reaching nothing of another. */
static void a_forged_image_stays_in_its_session(void **state)
{
    struct sbx_session *a = open_session(SBX(state), NULL);

    expect_cell(a, "x = 1\nopen('f', 'w').write('mine')", "");
    uid_t ua = session_uid(a);
    int fd = save_of(a);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    size_t n = (size_t)st.st_size;
    char *img = malloc(n);
    assert_int_equal(pread(fd, img, n, 0), (ssize_t)n);
    /* The layout of it: the session's head (64 bytes), the memory's
     * (40: magic, version, regions, layout, limit, its length), then its
     * regions (56 bytes each: lo, hi, off, ino, devices, prot, kind, how,
     * runs). */
    const size_t head = 56, mem = head, regions = mem + 40;
    uint32_t n_regions;
    uint64_t mem_bytes;
    memcpy(&n_regions, img + mem + 12, sizeof(n_regions));
    memcpy(&mem_bytes, img + mem + 32, sizeof(mem_bytes));
    assert_true(n_regions > 10 && mem + mem_bytes < n);
    static const char *const forgeries[] = {
        "a region past the last user address",
        "regions out of order",
        "a region of the kernel's pages moved",
        "runs past their region",
    };
    for (size_t f = 0; f < sizeof(forgeries) / sizeof(forgeries[0]); f++) {
        char *copy = malloc(n);
        memcpy(copy, img, n);
        char *r0 = copy + regions, *rl = copy + regions + (n_regions - 1) * 56;
        uint64_t v;
        switch (f) {
        case 0:
            v = 1ULL << 60;
            memcpy(rl + 8, &v, 8);
            break;
        case 1:
            memcpy(&v, rl, 8);
            memcpy(r0, &v, 8);
            break;
        case 2:
            for (uint32_t i = 0; i < n_regions; i++) {
                char *r = copy + regions + i * 56;
                if (r[44] == 3) { /* PROCMAP_KERNEL */
                    memcpy(&v, r, 8);
                    v += 1ULL << 30;
                    memcpy(r, &v, 8);
                    memcpy(&v, r + 8, 8);
                    v += 1ULL << 30;
                    memcpy(r + 8, &v, 8);
                    break;
                }
            }
            break;
        default: {
            /* The first run of the first region that has one, made long. */
            size_t at = regions + n_regions * 56;
            for (uint32_t i = 0; i < n_regions; i++) {
                uint64_t runs;
                memcpy(&runs, copy + regions + i * 56 + 48, 8);
                if (runs) {
                    v = 1ULL << 40;
                    memcpy(copy + at + 8, &v, 8);
                    break;
                }
            }
            break;
        }
        }
        /* The memory's hash made again over the change. */
        uint64_t hash = XXH3_64bits(copy + mem, mem_bytes - 16);
        memcpy(copy + mem + mem_bytes - 8, &hash, 8);
        int bad = memfd_create("forged", MFD_CLOEXEC);
        assert_int_equal(write(bad, copy, n), (ssize_t)n);
        expect_refused(SBX(state), bad, "", forgeries[f]);
        close(bad);
        free(copy);
    }
    free(img);
    /* And one that passes: its code reaches nothing of another session. */
    struct sbx_session *b = restore_of(SBX(state), fd);
    int before = geteuid() == 0 ? processes_of(ua) : -1;
    expect_cell(b,
                "import os, signal\n"
                "me = os.getpid()\n"
                "read = 0\n"
                "for p in range(1, 4096):\n"
                "    if p == me: continue\n"
                "    for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM):\n"
                "        try: os.kill(p, sig)\n"
                "        except OSError: pass\n"
                "    for what in ('mem', 'environ', 'root/f', 'cwd/f', 'maps'):\n"
                "        try: open(f'/proc/{p}/{what}', 'rb').read(1); read += 1\n"
                "        except OSError: pass\n"
                "try: os.kill(-1, signal.SIGKILL)\n"
                "except OSError: pass\n"
                "print(read)",
                "0\n");
    if (before > 0)
        assert_int_equal(processes_of(ua), before);
    expect_cell(a, "print(x, open('f').read())", "1 mine\n");
    sbx_session_close(b);
    sbx_session_close(a);
    close(fd);
}

/* A sandbox of its own, with or without a fixed layout. */
static struct sbx *another(bool fixed, const char *root)
{
    struct sbx_config cfg;
    struct sbx_error err = {0};
    struct sbx *sbx = NULL;

    test_config_init(&cfg, root);
    cfg.fixed_layout = fixed;
    if (sbx_open(&cfg, &sbx, &err) < 0)
        fail_msg("sbx_open: %s", err.message);
    return sbx;
}

/* An image restores in a sandbox started after its own was closed, when
 * both have the fixed layout; in one without it, it is refused, saying so. */
static void an_image_outlives_its_sandbox_with_a_fixed_layout(void **state)
{
    char root[256];

    (void)state;
    make_temp_dir(root, sizeof(root));
    chmod(root, 0711);
    struct sbx *first = another(true, root);
    struct sbx_session *a = open_session(first, NULL);
    expect_cell(a, "import json\nx = {'k': [1, 2]}\nopen('f', 'w').write('kept')", "");
    int fd = save_of(a);
    sbx_session_close(a);
    sbx_close(first);
    struct sbx *loose = another(false, root);
    expect_refused(loose, fd, "layout", "a sandbox without a fixed layout");
    sbx_close(loose);
    struct sbx *second = another(true, root);
    struct sbx_session *b = restore_of(second, fd);
    expect_cell(b, "print(json.dumps(x), open('f').read())", "{\"k\": [1, 2]} kept\n");
    sbx_session_close(b);
    sbx_close(second);
    close(fd);
    remove_dir(root);
}

/* A state that keeps a file open (a sqlite3 connection) is not written:
 * an image holds no open file, and a state restored without it would use
 * a number that names nothing. The caller hears why, as a request it
 * can change, and the session goes on with its connection; once the
 * connection is closed in a cell, its image is written and restores. */
static void a_state_that_keeps_files_is_not_imaged(void **state)
{
    struct sbx_session *a = open_session(SBX(state), NULL);
    struct sbx_error err = {0};
    int fd = memfd_create("image", MFD_CLOEXEC);

    assert_true(fd >= 0);
    expect_cell(a,
                "import sqlite3\ndb = sqlite3.connect('t.db')\n"
                "db.execute('create table t (v)'); db.execute('insert into t values (7)')\n"
                "db.commit()\n",
                "");
    int rc = sbx_session_save(a, fd, &err);
    assert_true(rc < 0);
    if (err.code != SBX_ERR_INVALID_REQUEST || !strstr(err.message, "keeps 1 file open"))
        fail_msg("refused as %s: %s", sbx_error_code_name(err.code), err.message);
    expect_cell(a, "print(db.execute('select v from t').fetchone()[0])", "7\n");
    expect_cell(a, "db.close()", "");
    close(fd);
    fd = save_of(a);
    sbx_session_close(a);
    struct sbx_session *b = restore_of(SBX(state), fd);
    expect_cell(b,
                "db = sqlite3.connect('t.db')\nprint(db.execute('select v from t').fetchone()[0])",
                "7\n");
    sbx_session_close(b);
    close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_state_comes_back_from_its_image),
        cmocka_unit_test(a_sparse_mapping_comes_back_page_for_page),
        cmocka_unit_test(an_image_restores_into_sessions_of_their_own),
        cmocka_unit_test(a_changed_or_cut_image_is_refused),
        cmocka_unit_test(a_forged_image_stays_in_its_session),
        cmocka_unit_test(an_image_outlives_its_sandbox_with_a_fixed_layout),
        cmocka_unit_test(a_state_that_keeps_files_is_not_imaged),
    };
    if (getenv("TEST_FILTER"))
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, fixture_open, fixture_close);
}
