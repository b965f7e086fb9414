/*
 * Kept files: the regular files of its workspace that a session's state
 * holds open from one cell to the next (a sqlite3 connection, a log opened
 * for appending, a private mapping's file), on the template's side.
 *
 * A cell is a fork of the state, so it would share the state's open file
 * descriptions: a failed cell's seeks, writes' offsets and flags would
 * outlive its rollback. So a cell never uses the state's: before its code
 * runs it gets a description of its own of each kept file, opened here by
 * the template from what the kernel says the state holds, at the offset
 * and with the flags the kernel said the kept cell left (recorded when the
 * cell was looked at; the state runs no code of the tenant's after that
 * but its fork). The files' contents are put back by the supervisor, in
 * their own inodes (wssync.c). Everything else a cell may leave open
 * (pipes, sockets, directories, anything not a regular file of this
 * session's workspace) still rolls it back, and the reason names it.
 *
 * What the worst tenant can do with kept files, and what holds it:
 * - Keep many: a cell that leaves more than WIRE_HELD_MAX is rolled back.
 *   A cell's fds are bounded by RLIMIT_NOFILE (256) anyway.
 * - Keep what is not a regular file of its own workspace (a pipe, an
 *   eventfd, a directory, a file of the read-only stdlib, a memfd, which
 *   memfd_create refuses anyway, a file of another session, which its
 *   mount namespace cannot name): the kernel's stat of the descriptor
 *   (type, and the device of this session's workspace tmpfs) refuses it;
 *   an O_PATH descriptor (fdinfo's flags), a file it deleted (no name:
 *   nothing to put back) and a file it holds a lock on (a lock cannot be
 *   handed to the next cell) too. The saved copy is another tmpfs, mounted
 *   nowhere: no descriptor, link or name of the session's reaches it.
 * - Change the state's descriptors behind the template's back (its memory
 *   is the tenant's: while it forks a cell it could dup2 anything onto a
 *   kept number, a FIFO included): a cell is given only what, opened
 *   O_PATH (which never blocks) and looked at, is a regular file of this
 *   workspace with the inode recorded, reopened with the access the kernel
 *   recorded for the tenant's own descriptor (nothing it did not have),
 *   O_NONBLOCK (no lease can hold the open). Anything else is not given,
 *   and the cell closes that number.
 * - Change a kept file between cells (truncate it, make it sparse or
 *   huge, delete or rename it, put a link to elsewhere at its name): only
 *   a cell can, and a rolled-back cell's changes are undone by the
 *   supervisor with the session's processes stopped, by its own
 *   descriptors, following no link, within the workspace's size. A file
 *   the cell deleted or replaced (its inode has no name to be put back
 *   at) comes back as a new inode that the state takes on (adopt).
 * - Keep open a file the sandbox removes after the cell (the report of its
 *   value, WIRE_VALUE_FILE, made by its own code): no cell is given a file
 *   with no name (kept_hand_out), nor a branch (kept_prune); the number is
 *   closed in later cells.
 * - Do anything with what it is given: it is its own file, and what a cell
 *   does with it is the tenant's business, within its own session.
 */
#ifndef PYSBX_KEPT_H
#define PYSBX_KEPT_H

#include "wire.h"
#include "worker.h"

#include <stdint.h>
#include <sys/types.h>

struct kept_file {
    int32_t num;    /* its number in the state */
    uint32_t flags; /* the description's flags, and O_CLOEXEC for the descriptor's */
    int64_t pos;    /* the description's offset */
    uint64_t ino;   /* the file (on the session's workspace tmpfs) */
};

struct kept_files {
    uint32_t n;
    struct kept_file v[WIRE_HELD_MAX];
};

/* Looks at the descriptors of |pid|, stopped, under /proc (|proc_fd|): it
 * may hold its standard streams on /dev/null, its channel (the socket
 * |chan_ino|) and at most WIRE_HELD_MAX regular files of the tmpfs
 * |ws_dev| (named, unlocked, not O_PATH), which go into |out|. Returns 0,
 * or -EPERM with |why| (a reason for a result: which descriptor, and why
 * it cannot be kept). */
int kept_look(int proc_fd, pid_t pid, ino_t chan_ino, dev_t ws_dev, struct kept_files *out,
              char *why, size_t cap);

/* A cell's own descriptions of the kept files |k| of the stopped state
 * |state|, opened through /proc (|proc_fd|, where the template is |self|):
 * into |cell_fds| (for the cell, in go->held's order, those given) and,
 * for the supervisor, the files themselves (O_PATH) into |sup_fds|. A kept
 * file that is not what was kept any more is not given (the cell closes
 * its number) and leaves |k|. Returns how many were given, or -errno when
 * the template could not (then nothing is left open). */
int kept_hand_out(int proc_fd, pid_t self, pid_t state, dev_t ws_dev, struct kept_files *k,
                  struct cell_go *go, int *cell_fds, int *sup_fds);

/* |k| without the kept files that the stopped state |state| does not
 * hold as they were kept (as kept_hand_out finds them). */
void kept_prune(int proc_fd, pid_t state, dev_t ws_dev, struct kept_files *k);

/* The state (on its channel |state_chan|) takes on the |nfds| files |fds|
 * (regular files of the tmpfs |ws_dev|) at the numbers of the kept files
 * |a| says they replace; |k| records their inodes. Returns 0, or -EPROTO
 * when |a| and |fds| do not match |k| (nothing sent then), or -errno. */
int kept_adopt(int state_chan, dev_t ws_dev, struct kept_files *k, const struct wire_adopt *a,
               const int *fds, int nfds);

#endif
