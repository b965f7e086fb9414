/* OS helpers: deleting trees without following links, opening beneath a
 * directory without following links. */
#define _GNU_SOURCE
#include "helpers.h"

#include "sysutil.h"

#include <errno.h>
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(deep_tree_is_removed_with_few_descriptors),
        cmocka_unit_test(links_in_the_tree_are_removed_not_followed),
        cmocka_unit_test(open_beneath_refuses_symlinked_components),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
