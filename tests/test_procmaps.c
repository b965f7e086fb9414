/*
 * The template's reader of a process's memory map (src/template/procmaps.c),
 * against the kernel (PROCMAP_QUERY where the kernel has it) and against
 * the text form older kernels give, fed from files shaped as a tenant
 * could shape its own map's names: a name too long, a line without its
 * newline, a range out of order, overlapping, unaligned or past the end of
 * user addresses, more mappings than the caller allows. Each is refused
 * whole, never read as mappings of its own.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "procmaps.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* procmaps_read of |text| as the map of process 7 of a directory shaped
 * as /proc (a regular file, on which PROCMAP_QUERY fails, so the text is
 * read): its return, the mappings in *out. */
static int read_fake(const char *text, size_t max, struct procmap **out, size_t *n)
{
    char why[256] = "";
    char dir[] = "/tmp/procmaps-XXXXXX", path[64];

    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/7", dir);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof(path), "%s/7/maps", dir);
    FILE *f = fopen(path, "we");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(fd >= 0);
    int rc = procmaps_read(fd, 7, max, false, out, n, why, sizeof(why));
    close(fd);
    unlink(path);
    snprintf(path, sizeof(path), "%s/7", dir);
    rmdir(path);
    rmdir(dir);
    if (rc < 0)
        assert_true(why[0] != '\0');
    return rc;
}

#define LINE(lo, hi, perms, ino, name)                                                             \
    lo "-" hi " " perms " 00000000 fe:00 " ino "                   " name "\n"

static void the_kernels_map_of_this_process(void **state)
{
    (void)state;
    int proc = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct procmap *v = NULL;
    size_t n = 0;
    char why[256];
    /* A mapping of ours to find, with a name no line buffer holds. */
    void *p = mmap(NULL, 3 * 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    assert_true(p != MAP_FAILED);
    assert_true(proc >= 0);
    assert_int_equal(procmaps_read(proc, getpid(), 100000, false, &v, &n, why, sizeof(why)), 0);
    bool stack = false, mine = false;
    for (size_t i = 0; i < n; i++) {
        assert_true(v[i].lo < v[i].hi);
        assert_int_equal(v[i].lo % 4096, 0);
        if (i)
            assert_true(v[i].lo >= v[i - 1].hi);
        stack |= v[i].kind == PROCMAP_STACK;
        mine |= v[i].lo <= (uintptr_t)p && (uintptr_t)p + 3 * 4096 <= v[i].hi &&
                v[i].prot == PROT_READ && !v[i].ino;
    }
    assert_true(stack && mine);
    free(v);
    /* Past |max|: refused, not cut. */
    assert_int_equal(procmaps_read(proc, getpid(), 3, false, &v, &n, why, sizeof(why)), -E2BIG);
    assert_null(v);
    assert_int_equal(procmaps_read(proc, getpid(), 3, true, &v, &n, why, sizeof(why)), -E2BIG);
    assert_null(v);
    munmap(p, 3 * 4096);
    close(proc);
}

static void the_text_form_read_strictly(void **state)
{
    (void)state;
    struct procmap *v = NULL;
    size_t n = 0;

    const char *ok = LINE("55d0c0000000", "55d0c0001000", "r-xp", "123", "/usr/bin/python3")
        LINE("55d0c0001000", "55d0c0003000", "rw-p", "0", "[heap]")
            LINE("7ffd00000000", "7ffd00021000", "rw-p", "0", "[stack]")
                LINE("7ffd00100000", "7ffd00102000", "r--p", "0",
                     "[vvar]") "7ffd00102000-7ffd00104000 r-xp 00000000 00:00 0 \n"
        /* the kernel's vsyscall page (not a mapping of the process's) */
        LINE("ffffffffff600000", "ffffffffff601000", "--xp", "0", "[vsyscall]");
    assert_int_equal(read_fake(ok, 100, &v, &n), 0);
    assert_int_equal(n, 5);
    assert_int_equal(v[0].prot, PROT_READ | PROT_EXEC);
    assert_int_equal(v[0].ino, 123);
    assert_int_equal(v[1].kind, PROCMAP_HEAP);
    assert_int_equal(v[2].kind, PROCMAP_STACK);
    assert_int_equal(v[3].kind, PROCMAP_KERNEL);
    assert_int_equal(v[4].kind, PROCMAP_PLAIN);
    free(v);
    /* A file called "[stack]" is a file (its inode says so). */
    assert_int_equal(read_fake(LINE("1000", "2000", "rw-p", "77", "[stack]"), 10, &v, &n), 0);
    assert_int_equal(v[0].kind, PROCMAP_PLAIN);
    free(v);
    /* A name that holds a mapping's fields is one name. */
    assert_int_equal(
        read_fake(LINE("1000", "2000", "r--p", "5", "/w/  0-20000000000 rw-p 0 0:0 0 [stack]"), 10,
                  &v, &n),
        0);
    assert_int_equal(n, 1);
    assert_int_equal(v[0].hi, 0x2000);
    free(v);
}

/* A directory |depth| levels of 255-character names deep under |dir|, a
 * file of one page in it (*fd), its path's length in *len. */
static void deep_file(int dir, int depth, int *fd, size_t *len)
{
    char name[256];
    int at = fcntl(dir, F_DUPFD_CLOEXEC, 0);

    memset(name, 'd', 255);
    name[255] = '\0';
    *len = 0;
    for (int i = 0; i < depth; i++) {
        assert_int_equal(mkdirat(at, name, 0700), 0);
        int next = openat(at, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_true(next >= 0);
        close(at);
        at = next;
        *len += 256;
    }
    *fd = openat(at, "f", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    assert_true(*fd >= 0);
    assert_int_equal(ftruncate(*fd, 4096), 0);
    close(at);
}

static void rm_deep(int dir, int depth)
{
    char path[256 * 40 + 8], *end = path;

    for (int i = 0; i < depth; i++) {
        memset(end, 'd', 255);
        end[255] = '/';
        end += 256;
    }
    strcpy(end, "f");
    unlinkat(dir, path, 0);
    for (int i = depth; i > 0; i--) {
        path[i * 256 - 1] = '\0';
        unlinkat(dir, path, AT_REMOVEDIR);
    }
}

/* The length of |pid|'s map as text. */
static size_t text_length(int proc, pid_t pid)
{
    char path[32], buf[65536];
    size_t len = 0;
    ssize_t got;

    snprintf(path, sizeof(path), "%d/maps", (int)pid);
    int fd = openat(proc, path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    while ((got = read(fd, buf, sizeof(buf))) > 0)
        len += (size_t)got;
    close(fd);
    return len;
}

/* Both readers of a waiting child's map (text first, and field by field)
 * give the same mappings. */
static void both_readers_agree(int proc, pid_t pid, size_t want_at_least)
{
    struct procmap *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    char why[256];

    assert_int_equal(procmaps_read(proc, pid, 1U << 17, true, &a, &na, why, sizeof(why)), 0);
    assert_int_equal(procmaps_read(proc, pid, 1U << 17, false, &b, &nb, why, sizeof(why)), 0);
    assert_true(na >= want_at_least);
    assert_int_equal(na, nb);
    for (size_t i = 0; i < na; i++)
        if (a[i].lo != b[i].lo || a[i].hi != b[i].hi || a[i].off != b[i].off ||
            a[i].ino != b[i].ino || a[i].dev_major != b[i].dev_major ||
            a[i].dev_minor != b[i].dev_minor || a[i].prot != b[i].prot ||
            a[i].shared != b[i].shared || a[i].kind != b[i].kind)
            fail_msg("mapping %zu: %#llx-%#llx kind %d, and %#llx-%#llx kind %d", i,
                     (unsigned long long)a[i].lo, (unsigned long long)a[i].hi, a[i].kind,
                     (unsigned long long)b[i].lo, (unsigned long long)b[i].hi, b[i].kind);
    free(a);
    free(b);
}

/* The text asked for first (what a copier reads) gives what the kernel's
 * fields give: of a map whose lines are all in form, of one with a path
 * longer than a line may be and a name holding a newline (the text is
 * left for the fields), and of one whose text is past the budget. */
static void the_text_first_is_the_same_map(void **state)
{
    (void)state;
    int proc = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    char dir[] = "/tmp/procmaps-deep-XXXXXX";
    int depth = PROCMAPS_LINE_MAX / 256 + 2, deep, nl;
    size_t len;

    assert_true(proc >= 0);
    assert_non_null(mkdtemp(dir));
    int d = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(d >= 0);
    deep_file(d, depth, &deep, &len);
    assert_true(len > PROCMAPS_LINE_MAX);
    nl = openat(d, "a\nb 0-20000000000 rw-p 0 0:0 0 [stack]", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    assert_true(nl >= 0);
    assert_int_equal(ftruncate(nl, 4096), 0);
    int sv[2];
    assert_int_equal(pipe2(sv, O_CLOEXEC), 0);
    for (int round = 0; round < 3; round++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            /* Gone with the test, whatever fails there. */
            if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() == 1)
                _exit(1);
            /* 0: as it is; 1: the two files mapped; 2: 30,000 mappings
             * more, of alternating protection (none merges), some 1.5 MB
             * of text. */
            if (round == 1 && (mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, deep, 0) == MAP_FAILED ||
                               mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, nl, 0) == MAP_FAILED))
                _exit(1);
            char *p = round == 2 ? mmap(NULL, 30000 * 4096ULL, PROT_READ,
                                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                                 : NULL;
            if (p == MAP_FAILED)
                _exit(1);
            for (int i = 0; p && i < 30000; i += 2)
                if (mprotect(p + i * 4096ULL, 4096, PROT_READ | PROT_WRITE) < 0)
                    _exit(1);
            if (write(sv[1], "k", 1) != 1)
                _exit(1);
            pause();
            _exit(0);
        }
        char k;
        assert_int_equal(read(sv[0], &k, 1), 1);
        /* What each round is about: a line too long, the budget passed. */
        if (round == 2)
            assert_true(text_length(proc, pid) > PROCMAPS_TEXT_BUDGET);
        both_readers_agree(proc, pid, round == 2 ? 30000 : 10);
        kill(pid, SIGKILL);
        assert_int_equal(waitpid(pid, NULL, 0), pid);
    }
    close(sv[0]);
    close(sv[1]);
    close(deep);
    close(nl);
    unlinkat(d, "a\nb 0-20000000000 rw-p 0 0:0 0 [stack]", 0);
    rm_deep(d, depth);
    close(d);
    rmdir(dir);
    close(proc);
}

static void what_the_text_form_refuses(void **state)
{
    (void)state;
    struct procmap *v = NULL;
    size_t n = 0;
    static const char *const bad[] = {
        /* unaligned, at the top of the space */
        LINE("fffffffffffff001", "ffffffffffffffff", "rw-p", "0", "[stack]"),
        /* past the last user address */
        LINE("200000000000000", "200000001000000", "rw-p", "0", ""),
        /* out of order, and overlapping */
        LINE("3000", "4000", "rw-p", "0", "") LINE("1000", "2000", "rw-p", "0", ""),
        LINE("1000", "3000", "rw-p", "0", "") LINE("2000", "4000", "rw-p", "0", ""),
        /* empty, and backwards */
        LINE("1000", "1000", "rw-p", "0", ""),
        LINE("2000", "1000", "rw-p", "0", ""),
        /* fields out of form */
        "1000-2000 rwxq 00000000 fe:00 0\n",
        "1000-2000 rw-p 00000000 fe00 0\n",
        "1000 2000 rw-p 00000000 fe:00 0\n",
        "10000000000000000-10000000001000000 rw-p 00000000 fe:00 0\n",
        "1000-2000 rw-p 00000000 fe:00 x\n",
        "\n",
        /* the last line without its newline */
        "1000-2000 rw-p 00000000 fe:00 0 /a",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = read_fake(bad[i], 10, &v, &n);
        if (rc != -EPROTO)
            fail_msg("case %zu (%.60s): %d, %zu mappings", i, bad[i], rc, n);
        assert_null(v);
        assert_int_equal(n, 0);
    }
    /* A line longer than the reader takes. */
    size_t long_len = PROCMAPS_LINE_MAX + 100;
    char *longline = malloc(long_len + 64);
    assert_non_null(longline);
    int k = snprintf(longline, 64, "1000-2000 r--p 00000000 fe:00 5 /");
    memset(longline + k, 'a', long_len - (size_t)k);
    strcpy(longline + long_len, "\n");
    assert_int_equal(read_fake(longline, 10, &v, &n), -EPROTO);
    /* ... whatever follows it. */
    strcpy(longline + long_len, " 0-20000000000 rw-p 0 0:0 0 [stack]\n");
    assert_int_equal(read_fake(longline, 10, &v, &n), -EPROTO);
    free(longline);
    /* More mappings than allowed. */
    assert_int_equal(read_fake(LINE("1000", "2000", "rw-p", "0", "")
                                   LINE("2000", "3000", "rw-p", "0", ""),
                               1, &v, &n),
                     -E2BIG);
    assert_null(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_kernels_map_of_this_process),
        cmocka_unit_test(the_text_form_read_strictly),
        cmocka_unit_test(what_the_text_form_refuses),
        cmocka_unit_test(the_text_first_is_the_same_map),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
