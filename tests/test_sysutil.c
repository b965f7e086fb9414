/* OS helpers: deleting trees without following links, opening beneath a
 * directory without following links. */
#define _GNU_SOURCE
#include "helpers.h"

#include "sysutil.h"

#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void deep_tree_is_removed_with_few_descriptors(void **state)
{
    (void)state;
    char root[256];
    make_temp_dir(root, sizeof(root));
    int rfd = open(root, O_RDONLY | O_DIRECTORY);
    assert_true(mkdirat(rfd, "t", 0700) == 0);
    int fd = openat(rfd, "t", O_RDONLY | O_DIRECTORY);
    /* Far deeper than any path could name or descriptors could hold. */
    for (int i = 0; i < 3000; i++) {
        assert_int_equal(mkdirat(fd, "d", 0700), 0);
        int f = openat(fd, "file", O_WRONLY | O_CREAT, 0600);
        close(f);
        int next = openat(fd, "d", O_RDONLY | O_DIRECTORY);
        close(fd);
        fd = next;
    }
    close(fd);
    int before = count_fds();
    assert_int_equal(remove_tree_at(rfd, "t"), 0);
    assert_int_equal(count_fds(), before);
    assert_int_equal(count_entries(root), 0);
    close(rfd);
    rmdir(root);
}

static void links_in_the_tree_are_removed_not_followed(void **state)
{
    (void)state;
    char root[256], outside[256], path[512];
    make_temp_dir(root, sizeof(root));
    make_temp_dir(outside, sizeof(outside));
    snprintf(path, sizeof(path), "%s/keep", outside);
    close(open(path, O_WRONLY | O_CREAT, 0600));
    snprintf(path, sizeof(path), "%s/t", root);
    mkdir(path, 0700);
    snprintf(path, sizeof(path), "%s/t/link", root);
    assert_int_equal(symlink(outside, path), 0);
    snprintf(path, sizeof(path), "%s/t/sub", root);
    mkdir(path, 0700);
    snprintf(path, sizeof(path), "%s/t/sub/fifo", root);
    assert_int_equal(mkfifo(path, 0600), 0);
    /* A directory the code made unreadable is still removed. */
    snprintf(path, sizeof(path), "%s/t/sub", root);
    chmod(path, 0);

    int rfd = open(root, O_RDONLY | O_DIRECTORY);
    assert_int_equal(remove_tree_at(rfd, "t"), 0);
    close(rfd);
    assert_int_equal(count_entries(root), 0);
    assert_int_equal(count_entries(outside), 1); /* untouched */
    remove_dir(outside);
    rmdir(root);
}

/* chmod by name never reaches what a link names (the removal and a
 * session's rollback chmod directories the code made and could have
 * turned into links). */
static void chmod_by_name_changes_no_links_target(void **state)
{
    (void)state;
    char root[256], path[512];
    struct stat st;
    make_temp_dir(root, sizeof(root));
    snprintf(path, sizeof(path), "%s/target", root);
    close(open(path, O_WRONLY | O_CREAT, 0600));
    snprintf(path, sizeof(path), "%s/dir", root);
    mkdir(path, 0700);
    int rfd = open(root, O_RDONLY | O_DIRECTORY);
    assert_int_equal(symlinkat("target", rfd, "link"), 0);
    assert_int_equal(symlinkat("dir", rfd, "dirlink"), 0);

    assert_true(chmod_nofollow(rfd, "link", 0777) < 0);
    assert_true(chmod_nofollow(rfd, "dirlink", 0777) < 0);
    assert_int_equal(fstatat(rfd, "target", &st, 0), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(fstatat(rfd, "dir", &st, 0), 0);
    assert_int_equal(st.st_mode & 07777, 0700);
    /* What is not a link is changed. */
    assert_int_equal(chmod_nofollow(rfd, "dir", 0750), 0);
    assert_int_equal(fstatat(rfd, "dir", &st, 0), 0);
    assert_int_equal(st.st_mode & 07777, 0750);
    close(rfd);
    remove_dir(root);
}

/* The attack on a walk that climbs with "..": while it is deep in the
 * tree, move the directory it is in (or one above) out of the tree, next to
 * files that are not the tree's. Climbing from there would empty the wrong
 * parent. */
struct renamer {
    char from[512], to[512];
    volatile bool stop;
    unsigned moves;
};

static void *rename_back_and_forth(void *p)
{
    struct renamer *r = p;

    while (!r->stop && r->moves < 2000) {
        if (rename(r->from, r->to) == 0)
            r->moves++;
        if (rename(r->to, r->from) == 0)
            r->moves++;
    }
    return NULL;
}

static void a_rename_race_cannot_lead_removal_outside(void **state)
{
    (void)state;
    unsigned moves = 0;
    for (int round = 0; round < 8; round++) {
        char root[256], path[1024];
        make_temp_dir(root, sizeof(root));
        /* root/outside/keep and root/outside/deep/keep: not the tree's. */
        snprintf(path, sizeof(path), "%s/outside", root);
        mkdir(path, 0700);
        snprintf(path, sizeof(path), "%s/outside/keep", root);
        close(open(path, O_WRONLY | O_CREAT, 0600));
        snprintf(path, sizeof(path), "%s/outside/deep", root);
        mkdir(path, 0700);
        snprintf(path, sizeof(path), "%s/outside/deep/keep", root);
        close(open(path, O_WRONLY | O_CREAT, 0600));
        /* root/ws/a/d/d/.../d, files at every level. */
        int rfd = open(root, O_RDONLY | O_DIRECTORY);
        assert_int_equal(mkdirat(rfd, "ws", 0700), 0);
        int fd = openat(rfd, "ws", O_RDONLY | O_DIRECTORY);
        assert_int_equal(mkdirat(fd, "a", 0700), 0);
        int next = openat(fd, "a", O_RDONLY | O_DIRECTORY);
        close(fd);
        fd = next;
        for (int i = 0; i < 200; i++) {
            for (int f = 0; f < 2; f++) {
                char n[16];
                snprintf(n, sizeof(n), "f%d", f);
                close(openat(fd, n, O_WRONLY | O_CREAT, 0600));
            }
            assert_int_equal(mkdirat(fd, "d", 0700), 0);
            next = openat(fd, "d", O_RDONLY | O_DIRECTORY);
            close(fd);
            fd = next;
        }
        close(fd);
        struct renamer r = {.stop = false};
        snprintf(r.from, sizeof(r.from), "%s/ws/a", root);
        snprintf(r.to, sizeof(r.to), "%s/outside/deep/a", root);
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, rename_back_and_forth, &r), 0);
        (void)remove_tree_at(rfd, "ws"); /* may fail: the tree moves under it */
        r.stop = true;
        pthread_join(th, NULL);
        moves += r.moves;
        snprintf(path, sizeof(path), "%s/outside/keep", root);
        if (access(path, F_OK) != 0)
            fail_msg("round %d: removal reached outside the tree (%s)", round, path);
        snprintf(path, sizeof(path), "%s/outside/deep/keep", root);
        if (access(path, F_OK) != 0)
            fail_msg("round %d: removal reached outside the tree (%s)", round, path);
        close(rfd);
        remove_dir(root);
    }
    assert_true(moves > 0); /* the race did run */
}

static void open_beneath_refuses_symlinked_components(void **state)
{
    (void)state;
    char root[256], outside[256], path[512];
    make_temp_dir(root, sizeof(root));
    make_temp_dir(outside, sizeof(outside));
    snprintf(path, sizeof(path), "%s/link", root);
    assert_int_equal(symlink(outside, path), 0);
    snprintf(path, sizeof(path), "%s/flink", root);
    assert_int_equal(symlink("/etc/hostname", path), 0);
    int rfd = open(root, O_RDONLY | O_DIRECTORY);

    int fd = open_beneath(rfd, "link/x", O_WRONLY | O_CREAT, 0644, true);
    assert_true(fd == -ENOTDIR || fd == -ELOOP);
    assert_int_equal(count_entries(outside), 0);
    fd = open_beneath(rfd, "flink", O_RDONLY, 0, false);
    assert_int_equal(fd, -ELOOP);

    fd = open_beneath(rfd, "a/b/c.txt", O_WRONLY | O_CREAT | O_EXCL, 0644, true);
    assert_true(fd >= 0);
    close(fd);
    snprintf(path, sizeof(path), "%s/a/b/c.txt", root);
    assert_int_equal(access(path, F_OK), 0);
    close(rfd);
    remove_dir(root);
    remove_dir(outside);
}

/* Writes |text| to |dir|/|name| stamped |when|. */
static void stamped_file(const char *dir, const char *name, const char *text, time_t when)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    struct timespec t[2] = {{when, 0}, {when, 0}};
    assert_int_equal(utimensat(AT_FDCWD, path, t, 0), 0);
}

/* The core and the standard library are one build, or the template does
 * not start: another version, or (for a stamped build, the core's time its
 * file's) another stamp, as a half-done security update leaves them. */
static void a_core_and_stdlib_of_two_builds_are_told_apart(void **state)
{
    (void)state;
    char dir[256], why[512];
    make_temp_dir(dir, sizeof(dir));
    const char *info = "main, Apr 28 2025, 14:11:48";
    time_t built = 1745849508; /* 2025-04-28 14:11:48 UTC */
    const char *data = "build_time_vars = {'CC': 'gcc',\n 'VERSION': '3.11',\n}\n";
    stamped_file(dir, "libpython3.11.so.1.0", "", built);
    stamped_file(dir, "_sysconfigdata__x86_64-linux-gnu.py", data, built);
    char lib[512];
    snprintf(lib, sizeof(lib), "%s/libpython3.11.so.1.0", dir);

    assert_int_equal(python_build_problem(dir, "3.11.2", info, lib, why, sizeof(why)), 0);
    /* Another version of the core. */
    assert_int_equal(python_build_problem(dir, "3.12.1", info, lib, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "is Python 3.11, the interpreter core (libpython) 3.12.1"));
    assert_int_equal(python_build_problem(dir, "3.1", info, lib, why, sizeof(why)), -EINVAL);
    /* A standard library from a later build (a security update). */
    stamped_file(dir, "_sysconfigdata__x86_64-linux-gnu.py", data, built + 86400 * 160);
    assert_int_equal(python_build_problem(dir, "3.11.2", info, lib, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "built at 2025-10-05 14:11:48 UTC"));
    assert_non_null(strstr(why, "at 2025-04-28 14:11:48: not one build"));
    /* A build not stamped (its core's file made later than it was built):
     * only the version tells. */
    stamped_file(dir, "libpython3.11.so.1.0", "", built + 60);
    assert_int_equal(python_build_problem(dir, "3.11.2", info, lib, why, sizeof(why)), 0);
    assert_int_equal(python_build_problem(dir, "3.11.2", info, NULL, why, sizeof(why)), 0);
    /* No _sysconfigdata at all: not a standard library. */
    char gone[600];
    snprintf(gone, sizeof(gone), "%s/_sysconfigdata__x86_64-linux-gnu.py", dir);
    unlink(gone);
    assert_int_equal(python_build_problem(dir, "3.11.2", info, lib, why, sizeof(why)), -EINVAL);
    remove_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(deep_tree_is_removed_with_few_descriptors),
        cmocka_unit_test(links_in_the_tree_are_removed_not_followed),
        cmocka_unit_test(chmod_by_name_changes_no_links_target),
        cmocka_unit_test(a_rename_race_cannot_lead_removal_outside),
        cmocka_unit_test(open_beneath_refuses_symlinked_components),
        cmocka_unit_test(a_core_and_stdlib_of_two_builds_are_told_apart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
