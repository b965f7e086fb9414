/* Collecting a workspace's files: order, caps, and everything that is not a
 * plain file left alone. */
#define _GNU_SOURCE
#include "helpers.h"

#include "artifacts.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct ws {
    char path[256];
    int fd;
    struct artifact_set set; /* the last collection's */
};

static int ws_setup(void **state)
{
    struct ws *w = calloc(1, sizeof(*w));
    make_temp_dir(w->path, sizeof(w->path));
    w->fd = open(w->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    *state = w;
    return w->fd >= 0 ? 0 : -1;
}

static int ws_teardown(void **state)
{
    struct ws *w = *state;
    artifact_set_free(&w->set);
    close(w->fd);
    remove_dir(w->path);
    free(w);
    return 0;
}

static void put(struct ws *w, const char *name, const char *data)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", w->path, name);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", path);
    assert_int_equal(system(cmd), 0);
    *slash = '/';
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(data, f);
    fclose(f);
}

static void collect_total(struct ws *w, uint64_t max_bytes, uint64_t max_count, uint64_t max_total,
                          const struct sbx_file *inputs, size_t n_inputs, struct sbx_artifact **a,
                          size_t *n, uint64_t *dropped)
{
    struct artifact_spec s = {.max_bytes = max_bytes,
                              .max_count = max_count,
                              .max_total = max_total,
                              .inputs = inputs,
                              .n_inputs = n_inputs};
    artifact_set_free(&w->set);
    assert_int_equal(artifacts_collect(w->fd, &s, false, &w->set), 0);
    *a = w->set.v;
    *n = w->set.n;
    *dropped = w->set.dropped;
}

static void collect(struct ws *w, uint64_t max_bytes, uint64_t max_count,
                    const struct sbx_file *inputs, size_t n_inputs, struct sbx_artifact **a,
                    size_t *n, uint64_t *dropped)
{
    collect_total(w, max_bytes, max_count, UINT64_MAX, inputs, n_inputs, a, n, dropped);
}

/* The files returned hold at most max_total bytes together: the first by
 * name that fit, each counted in full or not at all, and a sparse file of
 * a gigabyte is never read past what may be returned. */
static void the_total_is_bounded(void **state)
{
    struct ws *w = *state;
    struct sbx_artifact *a = NULL;
    size_t n = 0;
    uint64_t dropped = 0;

    put(w, "a", "0123456789");
    put(w, "b", "01234567890123456789");
    put(w, "c", "0123");
    int fd = openat(w->fd, "sparse", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 1LL << 30), 0);
    close(fd);
    /* 16 bytes each at most, 36 in all, each name costing twice its
     * length: a (10 + 2) fits, b (16 of its 20, + 2) fits in the 24 left,
     * c (4 + 2) in the 6 left, the sparse file's 16 do not. */
    collect_total(w, 16, 100, 36, NULL, 0, &a, &n, &dropped);
    assert_int_equal(n, 3);
    assert_string_equal(a[0].name, "a");
    assert_string_equal(a[1].name, "b");
    assert_int_equal(a[1].data_len, 16);
    assert_true(a[1].truncated);
    assert_string_equal(a[2].name, "c");
    assert_int_equal(dropped, 1);
    assert_int_equal(w->set.n_gone, 1); /* listed, with why */
    assert_string_equal(w->set.gone[0].name, "sparse");
    assert_int_equal(w->set.gone[0].reason, SBX_DROP_MAX_TOTAL_BYTES);
    assert_int_equal(w->set.gone[0].size, 1ULL << 30);
    /* A total of 0 returns none of them, and counts them all. */
    collect_total(w, 16, 100, 0, NULL, 0, &a, &n, &dropped);
    assert_int_equal(n, 0);
    assert_int_equal(dropped, 4);
}

static void files_come_back_sorted_by_name_bytewise(void **state)
{
    struct ws *w = *state;
    put(w, "b.txt", "b");
    put(w, "a/b", "ab");
    put(w, "a.txt", "a");
    put(w, "plots/a.png", "png");
    put(w, "A", "upper");
    struct sbx_artifact *a;
    size_t n;
    uint64_t dropped;
    collect(w, 1024, 10, NULL, 0, &a, &n, &dropped);
    const char *want[] = {"A", "a.txt", "a/b", "b.txt", "plots/a.png"};
    assert_int_equal(n, 5);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(a[i].name, want[i]);
    assert_int_equal(a[4].size, 3);
    assert_memory_equal(a[4].data, "png", 3);
    assert_int_equal(dropped, 0);
}

static void count_cap_keeps_the_first_by_name(void **state)
{
    struct ws *w = *state;
    const char *names[] = {"e", "d", "c", "b", "a"};
    for (size_t i = 0; i < 5; i++)
        put(w, names[i], "x");
    struct sbx_artifact *a;
    size_t n;
    uint64_t dropped;
    collect(w, 1024, 3, NULL, 0, &a, &n, &dropped);
    assert_int_equal(n, 3);
    assert_string_equal(a[0].name, "a");
    assert_string_equal(a[2].name, "c");
    assert_int_equal(dropped, 2);
    collect(w, 1024, 0, NULL, 0, &a, &n, &dropped);
    assert_int_equal(n, 0);
    assert_int_equal(dropped, 5);
}

static void byte_cap_cuts_and_reports_the_real_size(void **state)
{
    struct ws *w = *state;
    char big[1001];
    memset(big, 'z', 1000);
    big[1000] = '\0';
    put(w, "big", big);
    struct sbx_artifact *a;
    size_t n;
    uint64_t dropped;
    collect(w, 100, 10, NULL, 0, &a, &n, &dropped);
    assert_int_equal(n, 1);
    assert_int_equal(a[0].size, 1000);
    assert_int_equal(a[0].data_len, 100);
    assert_true(a[0].truncated);
}

/* rchar of /proc/self/io: bytes read through read(2) and the like. */
static uint64_t bytes_read(void)
{
    char line[128];
    unsigned long long v = 0;
    FILE *f = fopen("/proc/self/io", "re");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "rchar: %llu", &v) == 1)
            break;
    fclose(f);
    return v;
}

static void huge_sparse_file_costs_only_the_cap(void **state)
{
    struct ws *w = *state;
    int fd = openat(w->fd, "sparse", O_WRONLY | O_CREAT, 0644);
    assert_int_equal(ftruncate(fd, 64LL << 30), 0); /* 64 GiB of hole */
    close(fd);
    struct sbx_artifact *a;
    size_t n;
    uint64_t dropped;
    /* What it costs, measured as the kernel counts it: bytes this process
     * read (the cap, not the 64 GiB). */
    uint64_t before = bytes_read();
    collect(w, 4096, 10, NULL, 0, &a, &n, &dropped);
    uint64_t cost = bytes_read() - before;
    if (cost > 4096 + 65536)
        fail_msg("collecting read %llu bytes for a 4096-byte cap", (unsigned long long)cost);
    assert_int_equal(n, 1);
    assert_int_equal(a[0].size, 64ULL << 30);
    assert_int_equal(a[0].data_len, 4096);
    assert_true(a[0].truncated);
}

static void ten_thousand_files_keep_only_the_cap(void **state)
{
    struct ws *w = *state;
    for (int i = 0; i < 10000; i++) {
        char name[32];
        snprintf(name, sizeof(name), "f%05d", i);
        int fd = openat(w->fd, name, O_WRONLY | O_CREAT, 0644);
        assert_true(fd >= 0);
        close(fd);
    }
    struct sbx_artifact *a;
    size_t n;
    uint64_t dropped;
    collect(w, 1024, 5, NULL, 0, &a, &n, &dropped);
    assert_int_equal(n, 5);
    assert_string_equal(a[0].name, "f00000");
    assert_string_equal(a[4].name, "f00004");
    assert_int_equal(dropped, 9995);
}

/* Links, FIFOs and the like are never artifacts, and are never followed
 * or opened; a file of two names on a workspace that is not a file system
 * of its own may be a host file linked in: not read, but listed. */
static void links_fifos_and_hardlinks_are_never_read(void **state)
{
    struct ws *w = *state;
    char path[512];
    put(w, "real.txt", "real");
    snprintf(path, sizeof(path), "%s/passwd", w->path);
    assert_int_equal(symlink("/etc/passwd", path), 0);
    snprintf(path, sizeof(path), "%s/etc", w->path);
    assert_int_equal(symlink("/etc", path), 0); /* a directory link: not walked */
    snprintf(path, sizeof(path), "%s/pipe", w->path);
    assert_int_equal(mkfifo(path, 0644), 0); /* no writer: opening it would hang */
    char outside[256], target[512];
    make_temp_dir(outside, sizeof(outside));
    snprintf(target, sizeof(target), "%s/host-file", outside);
    FILE *f = fopen(target, "w");
    fputs("host secret", f);
    fclose(f);
    snprintf(path, sizeof(path), "%s/hard", w->path);
    assert_int_equal(link(target, path), 0);

    struct sbx_artifact *a;
    size_t n;
    uint64_t dropped;
    collect(w, 1024, 10, NULL, 0, &a, &n, &dropped);
    assert_int_equal(n, 1);
    assert_string_equal(a[0].name, "real.txt");
    assert_int_equal(dropped, 1);
    assert_int_equal(w->set.n_gone, 1);
    assert_string_equal(w->set.gone[0].name, "hard");
    assert_int_equal(w->set.gone[0].reason, SBX_DROP_LINKED);
    remove_dir(outside);
}

static void unchanged_inputs_are_not_returned(void **state)
{
    struct ws *w = *state;
    put(w, "in/same.csv", "a,b\n");
    put(w, "in/changed.csv", "a,c\n"); /* same size, other bytes */
    put(w, "in/grown.csv", "a,b\nc,d\n");
    put(w, "new.txt", "n");
    const struct sbx_file inputs[] = {
        {"in/same.csv", "a,b\n", 4},
        {"in/changed.csv", "a,b\n", 4},
        {"in/grown.csv", "a,b\n", 4},
        {"in/deleted.csv", "x", 1},
    };
    struct sbx_artifact *a;
    size_t n;
    uint64_t dropped;
    collect(w, 1024, 10, inputs, 4, &a, &n, &dropped);
    assert_int_equal(n, 3);
    assert_string_equal(a[0].name, "in/changed.csv");
    assert_string_equal(a[1].name, "in/grown.csv");
    assert_string_equal(a[2].name, "new.txt");
}

/* Makes |depth| nested directories named |name| under the workspace, and
 * in the deepest a file |leaf|; returns the file's path. */
static char *nest(struct ws *w, int depth, const char *name, const char *leaf)
{
    size_t cap = (size_t)depth * (strlen(name) + 1) + strlen(leaf) + 1;
    char *path = calloc(1, cap);
    int dir = dup(w->fd);
    for (int i = 0; i < depth; i++) {
        assert_true(mkdirat(dir, name, 0755) == 0 || errno == EEXIST);
        int next = openat(dir, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_true(next >= 0);
        close(dir);
        dir = next;
        strcat(strcat(path, name), "/");
    }
    int fd = openat(dir, leaf, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, leaf, strlen(leaf)), (ssize_t)strlen(leaf));
    close(fd);
    close(dir);
    return strcat(path, leaf);
}

/* Deep trees and long paths come back whole; past the depth the walk looks
 * into, the directory is listed as too deep. */
static void deep_trees_and_long_paths(void **state)
{
    struct ws *w = *state;
    char x250[251];
    memset(x250, 'x', 250);
    x250[250] = '\0';
    char *deep = nest(w, 70, "d", "deep.txt");
    char *longp = nest(w, 20, x250, "long.txt"); /* 5,028 bytes */
    char *too = nest(w, SBX_MAX_ARTIFACT_DEPTH + 1, "t", "lost.txt");
    struct sbx_artifact *a;
    size_t n;
    uint64_t dropped;
    collect(w, 1024, 10, NULL, 0, &a, &n, &dropped);
    assert_int_equal(n, 2);
    assert_string_equal(a[0].name, deep);
    assert_memory_equal(a[0].data, "deep.txt", 8);
    assert_string_equal(a[1].name, longp);
    assert_true(strlen(a[1].name) > 4096);
    assert_int_equal(dropped, 1);
    assert_int_equal(w->set.n_gone, 1);
    assert_int_equal(w->set.gone[0].reason, SBX_DROP_TOO_DEEP);
    /* The directory at the depth not looked into: t/ 1025 times. */
    size_t dirs = (size_t)SBX_MAX_ARTIFACT_DEPTH + 1;
    assert_int_equal(strlen(w->set.gone[0].name), 2 * dirs);
    assert_memory_equal(w->set.gone[0].name, too, 2 * dirs);
    free(deep);
    free(longp);
    free(too);
}

/* Names that are not UTF-8 (or hold U+FFFD) are escaped so that no two
 * files share one, and carry their bytes; order is by the bytes. */
static void odd_names_stay_apart(void **state)
{
    struct ws *w = *state;
    put(w, "ok", "0");
    put(w, "\xff", "1");
    put(w, "\xfe", "2");
    put(w, "\xef\xbf\xbd", "3");         /* U+FFFD, valid UTF-8 */
    put(w, "caf\xc3\xa9/\xe2\x82", "4"); /* a cut character */
    struct sbx_artifact *a;
    size_t n;
    uint64_t dropped;
    collect(w, 1024, 10, NULL, 0, &a, &n, &dropped);
    assert_int_equal(n, 5);
    static const char *const want[][2] = {
        {"caf\xc3\xa9/\xef\xbf\xbd"
         "e2\xef\xbf\xbd"
         "82",
         "caf\xc3\xa9/\xe2\x82"},
        {"ok", "ok"},
        {"\xef\xbf\xbd"
         "ef\xef\xbf\xbd"
         "bf\xef\xbf\xbd"
         "bd",
         "\xef\xbf\xbd"},
        {"\xef\xbf\xbd"
         "fe",
         "\xfe"},
        {"\xef\xbf\xbd"
         "ff",
         "\xff"},
    };
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(a[i].name, want[i][0]);
        assert_string_equal(a[i].raw_name, want[i][1]);
        assert_int_equal(a[i].name == a[i].raw_name, strcmp(want[i][0], want[i][1]) == 0);
    }
    assert_memory_equal(a[4].data, "1", 1);
}

/* A name costs what it holds against the total: its bytes and, when it
 * had to be escaped, the escaped form (five bytes for each odd one). */
static void escaped_names_cost_what_they_hold(void **state)
{
    struct ws *w = *state;
    struct sbx_artifact *a;
    size_t n;
    uint64_t dropped;
    put(w, "\xff\xff\xff\xff", "x"); /* 1 byte, a name of 4 + 20 */
    collect_total(w, 16, 10, 24, NULL, 0, &a, &n, &dropped);
    assert_int_equal(n, 0);
    assert_int_equal(dropped, 1);
    assert_int_equal(w->set.gone[0].reason, SBX_DROP_MAX_TOTAL_BYTES);
    collect_total(w, 16, 10, 25, NULL, 0, &a, &n, &dropped);
    assert_int_equal(n, 1);
    assert_int_equal(strlen(a[0].name), 20);
}

/* Every file not returned is counted; the first are listed, no more. */
static void the_dropped_list_is_bounded(void **state)
{
    struct ws *w = *state;
    for (int i = 0; i < SBX_MAX_DROPPED_LISTED + 44; i++) {
        char name[32];
        snprintf(name, sizeof(name), "f%04d", i);
        put(w, name, "x");
    }
    struct sbx_artifact *a;
    size_t n;
    uint64_t dropped;
    collect(w, 1024, 4, NULL, 0, &a, &n, &dropped);
    assert_int_equal(n, 4);
    assert_int_equal(dropped, SBX_MAX_DROPPED_LISTED + 40);
    assert_int_equal(w->set.n_gone, SBX_MAX_DROPPED_LISTED);
    assert_string_equal(w->set.gone[0].name, "f0004");
    assert_int_equal(w->set.gone[0].reason, SBX_DROP_MAX_ARTIFACTS);
    assert_int_equal(w->set.gone[0].size, 1);
}

#define T(f) cmocka_unit_test_setup_teardown(f, ws_setup, ws_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(the_total_is_bounded),
        T(files_come_back_sorted_by_name_bytewise),
        T(count_cap_keeps_the_first_by_name),
        T(byte_cap_cuts_and_reports_the_real_size),
        T(huge_sparse_file_costs_only_the_cap),
        T(ten_thousand_files_keep_only_the_cap),
        T(links_fifos_and_hardlinks_are_never_read),
        T(unchanged_inputs_are_not_returned),
        T(deep_trees_and_long_paths),
        T(odd_names_stay_apart),
        T(the_dropped_list_is_bounded),
        T(escaped_names_cost_what_they_hold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
