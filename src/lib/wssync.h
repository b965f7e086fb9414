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
 * Exact: regular files (sparse ones stay sparse), directories, symbolic
 * links and FIFOs (the policy lets code make no other kind), with their
 * modes, times and hard links; a file whose inode the state may still map
 * is put back in place, in that inode. Every call runs with the session
 * user's file-system identity and the capabilities that override modes
 * (the caller's fsid_enter_owner), so that a file or directory the code
 * made unreadable is copied too; none follows a link or uses "..", each
 * path is opened a component at a time beneath the root it belongs to.
 *
 * Bounded: the index holds names, not paths, and at most WS_MAX_ENTRIES
 * entries, WS_MAX_NAME_BYTES of names and WS_MAX_DEPTH levels; a workspace
 * past them cannot be indexed, and the cell that made it cannot be kept.
 */
#ifndef PYSBX_WSSYNC_H
#define PYSBX_WSSYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#define WS_MAX_ENTRIES    10000
#define WS_MAX_NAME_BYTES (1u << 20)
#define WS_MAX_DEPTH      128

#define WS_NONE UINT32_MAX

struct ws_node {
    uint32_t parent; /* the directory holding it; WS_NONE: the workspace's top */
    uint32_t kids;   /* a directory's entries: nodes kids .. kids + nkids - 1, by name */
    uint32_t nkids;
    uint32_t name; /* its name: offset in the index's names */
    uint16_t name_len;
    bool changed;  /* a diff's walk: new, or changed since the index */
    bool mark;     /* work of the moment (restore: bring it back) */
    uint32_t twin; /* a diff's walk: the index's entry of the same name and kind, or WS_NONE */
    mode_t mode;
    nlink_t nlink;
    ino_t ino;
    off_t size;
    struct timespec ctime, mtime;
};

/* A tree of the workspace: each directory's entries are consecutive nodes,
 * sorted by name, after the directory's own node. */
struct ws_index {
    struct ws_node *v;
    uint32_t n, cap;
    uint32_t top, ntop; /* the top directory's entries */
    char *names;
    size_t names_len, names_cap;
    struct timespec taken; /* CLOCK_REALTIME when it was taken */
};

/* What a cell changed: the workspace now, its new or changed entries
 * marked, and the entries of |old| that are gone (each the top of what
 * went). */
struct ws_changes {
    struct ws_index now; /* the next index, when the workspace stays as it is */
    const struct ws_index *old;
    uint32_t *gone;
    uint32_t n_gone;
};

/* Indexes the workspace |ws_fd| (after a sync). Returns 0 or -errno with
 * |why| (-E2BIG: past a bound). */
int ws_index_build(int ws_fd, struct ws_index *ix, char *why, size_t cap);
void ws_index_free(struct ws_index *ix);

/* What changed in |ws_fd| since |ix|, comparing with |saved_fd| where the
 * times cannot tell. Returns 0 or -errno with |why|. */
int ws_diff(int ws_fd, int saved_fd, const struct ws_index *ix, struct ws_changes *out, char *why,
            size_t cap);
/* Whether |path| ('/'-separated) is among the new or changed entries. */
bool ws_changed(const struct ws_changes *c, const char *path);
void ws_changes_free(struct ws_changes *c);

/* A kept cell: the saved copy takes the changes. Returns 0 or -errno. */
int ws_commit(int ws_fd, int saved_fd, const struct ws_changes *c);
/* After ws_commit: the index is what ws_diff found (moved out of |c|), so
 * that a kept cell's workspace is walked once, not twice. */
void ws_index_take(struct ws_index *ix, struct ws_changes *c);

/* The regular files of the workspace that the session's state holds open
 * (kept files): |n| descriptors of them (O_PATH will do), in |fds|. A
 * rollback puts each back in its own inode at its names (the state's
 * descriptors name it), even when the cell renamed it or linked it
 * elsewhere; an inode the cell left with no name at all cannot have one
 * again: its content is put back (for the state's mappings of it), its
 * names get a new inode, and adopt[i] (else -1) is a descriptor (O_PATH)
 * of it, for the state to take on in place of the old one. */
struct ws_kept {
    const int *fds;
    unsigned n;
    int *adopt; /* |n| of them; the caller closes those not -1 */
};

/* A rolled-back cell: the workspace gets back what it had, |kept| (may be
 * NULL) in their inodes. Returns 0 or -errno. */
int ws_restore(int ws_fd, int saved_fd, const struct ws_changes *c, struct ws_kept *kept);
/* The same when what changed is not known (the workspace went past a
 * bound): everything goes, and the saved copy comes back whole. */
int ws_restore_all(int ws_fd, int saved_fd);
/* After ws_restore_all: the kept files, whose names all went, put back as
 * ws_restore does an inode left with no name (|old|: the index as of the
 * last sync). Returns 0 or -errno. */
int ws_restore_kept(int ws_fd, int saved_fd, const struct ws_index *old, struct ws_kept *kept);

/* The regular file whose inode is |ino| in |ix|, opened beneath |root|
 * (which holds the files |ix| names, or a copy of them) with |flags|,
 * following no link. Returns a descriptor, -ENOENT when |ix| has none, or
 * -errno. */
int ws_open_ino(int root, const struct ws_index *ix, ino_t ino, int flags);

/* The tree beneath |root| (a saved copy) written to |out| as a stream:
 * every entry (regular files with their holes, directories, symbolic
 * links, FIFOs, hard links as names of one file), its mode and time. A
 * session's image carries its files so. Returns 0 or -errno with |why|. */
int ws_write_stream(int root, int out, char *why, size_t cap);
/* ... and read back beneath |root| (an empty directory), each entry made a
 * component at a time, following no link, after checks of its form; at
 * most |max_bytes| read. The caller holds the session user's identity
 * (fsid_enter_owner). Returns 0 or -errno with |why|. */
int ws_read_stream(int in, int root, uint64_t max_bytes, char *why, size_t cap);

#endif
