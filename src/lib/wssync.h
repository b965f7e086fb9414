/*
 * A session's files: its workspace (what the cells see) and a saved copy of
 * it as of the last kept cell, which no process of the session can reach.
 * After each cell the workspace is compared with an index of it taken at
 * the last sync: an entry whose inode and change time (which no code can
 * set) are what the index says is the same; where the change time could
 * be from the same clock tick as the index, its content is compared with
 * the saved copy instead. Then only what changed is copied: into the saved
 * copy when the cell is kept (commit), back out of it when it is rolled
 * back (restore). A cell's cost is the files it touched, not the
 * workspace's size.
 *
 * Every call runs with the file-system identity of the session's user (the
 * caller's fsid_enter) and never follows a link; regular files, directories,
 * symbolic links and FIFOs are kept, nothing else (the policy lets code
 * make no other kind). Hard links are copied as separate files.
 */
#ifndef PYSBX_WSSYNC_H
#define PYSBX_WSSYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

struct ws_node {
    char *path; /* relative, '/'-separated */
    mode_t mode;
    ino_t ino;
    struct timespec ctime;
};

/* The workspace as of the last sync, sorted by path. */
struct ws_index {
    struct ws_node *v;
    size_t n;
    struct timespec taken; /* CLOCK_REALTIME when it was taken */
};

/* What a cell changed: entries new or changed since the index, and entries
 * gone; each list sorted by path. */
struct ws_changes {
    struct ws_node *changed;
    size_t n_changed;
    struct ws_node *gone;
    size_t n_gone;
    /* Every entry the walk found, and when: the next index, when the
     * workspace stays as it is (a kept cell's). */
    struct ws_node *now;
    size_t n_now;
    struct timespec walked;
};

/* Indexes the workspace |ws_fd| (after a sync). Returns 0 or -errno. */
int ws_index_build(int ws_fd, struct ws_index *ix);
void ws_index_free(struct ws_index *ix);

/* What changed in |ws_fd| since |ix|, comparing with |saved_fd| where the
 * times cannot tell. Returns 0 or -errno. */
int ws_diff(int ws_fd, int saved_fd, const struct ws_index *ix, struct ws_changes *out);
/* Whether |path| is among the new or changed entries. */
bool ws_changed(const struct ws_changes *c, const char *path);
void ws_changes_free(struct ws_changes *c);

/* A kept cell: the saved copy takes the changes. Returns 0 or -errno. */
int ws_commit(int ws_fd, int saved_fd, const struct ws_changes *c);
/* After ws_commit: the index is what ws_diff found (moved out of |c|), so
 * that a kept cell's workspace is walked once, not twice. */
void ws_index_take(struct ws_index *ix, struct ws_changes *c);

/* A rolled-back cell: the workspace gets back what it had. Returns 0 or
 * -errno. */
int ws_restore(int ws_fd, int saved_fd, const struct ws_changes *c);

#endif
