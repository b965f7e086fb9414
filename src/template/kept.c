/* Kept files, on the template's side: see kept.h (what the worst tenant can
 * do with them, and what holds it). */
#define _GNU_SOURCE
#include "kept.h"

#include "sysutil.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* The flags a cell's own description of a kept file is opened with, of
 * those the kernel shows for the tenant's (O_CREAT and the like are gone
 * once a file is open; O_ASYNC needs an owner no cell may set). */
#define KEPT_OPEN_FLAGS                                                                            \
    (O_ACCMODE | O_APPEND | O_NONBLOCK | O_DSYNC | O_SYNC | O_DIRECT | O_NOATIME)
/* ... and those F_SETFL sets once it is open (O_NONBLOCK, which the open
 * always has, comes off unless the tenant's had it). */
#define KEPT_SETFL_FLAGS (O_APPEND | O_NONBLOCK | O_DIRECT | O_NOATIME)
/* /proc/PID/fdinfo/N of a regular file: pos, flags, mnt_id, ino, then a
 * line per lock taken through it. Its first lines are all that is read. */
#define FDINFO_MAX 4096

/* What /proc/PID/fdinfo/N says of a kept file: its offset and flags, and
 * whether a lock is held through it. Lines out of form are an error, not
 * a guess. Returns 0 or -errno. */
static int read_fdinfo(int proc_fd, pid_t pid, int num, struct kept_file *f, bool *locked)
{
    char path[48], buf[FDINFO_MAX];
    bool have_pos = false, have_flags = false;

    fmt(path, sizeof(path), "%d/fdinfo/%d", (int)pid, num);
    int fd = openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t got = read_full(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (got <= 0)
        return got < 0 ? (int)got : -ENODATA;
    buf[got] = '\0';
    *locked = false;
    for (char *line = buf, *next; *line; line = next) {
        size_t len = strcspn(line, "\n");
        next = line[len] ? line + len + 1 : line + len;
        line[len] = '\0';
        char *end = NULL;
        errno = 0;
        if (strncmp(line, "pos:\t", 5) == 0) {
            long long pos = strtoll(line + 5, &end, 10);
            if (errno || end == line + 5 || *end || pos < 0)
                return -EPROTO;
            f->pos = pos;
            have_pos = true;
        } else if (strncmp(line, "flags:\t", 7) == 0) {
            unsigned long flags = strtoul(line + 7, &end, 8);
            if (errno || end == line + 7 || *end || flags > UINT32_MAX)
                return -EPROTO;
            f->flags = (uint32_t)flags;
            have_flags = true;
        } else if (strncmp(line, "lock:", 5) == 0)
            *locked = true;
    }
    return have_pos && have_flags ? 0 : -EPROTO;
}

/* What kind of thing descriptor |name| of |dir| (a /proc/PID/fd) is, for a
 * reason: from the kernel's stat of it, and for the kernel's own objects
 * (an eventfd, an epoll, a timer) the name the kernel gives them. */
static void describe(int dir, const char *name, const struct stat *st, char *out, size_t cap)
{
    char link[64] = "";
    ssize_t n = readlinkat(dir, name, link, sizeof(link) - 1);

    link[n > 0 ? n : 0] = '\0';
    switch (st->st_mode & S_IFMT) {
    case S_IFIFO:
        fmt(out, cap, "%s", strncmp(link, "pipe:", 5) == 0 ? "a pipe" : "a FIFO");
        return;
    case S_IFSOCK:
        fmt(out, cap, "a socket");
        return;
    case S_IFDIR:
        fmt(out, cap, "a directory");
        return;
    case S_IFCHR:
    case S_IFBLK:
        fmt(out, cap, "a device");
        return;
    case S_IFLNK:
        fmt(out, cap, "a symbolic link (O_PATH)");
        return;
    case S_IFREG:
        fmt(out, cap, "a file outside the session's workspace");
        return;
    }
    /* The kernel's objects: "anon_inode:[eventfd]", "anon_inode:inotify". */
    bool plain = strncmp(link, "anon_inode:", 11) == 0;
    for (const char *p = link; plain && *p; p++)
        plain = *p > 0x20 && *p < 0x7f;
    fmt(out, cap, "%s%s%s", plain ? "the kernel's " : "a descriptor of the kernel's",
        plain ? link + 11 : "", plain ? " object" : "");
}

int kept_look(int proc_fd, pid_t pid, ino_t chan_ino, dev_t ws_dev, struct kept_files *out,
              char *why, size_t cap)
{
    char path[32], what[96] = "";
    unsigned own = 0, bad = 0, files = 0;
    int first_bad = INT_MAX, locked_fd = -1;

    out->n = 0;
    fmt(path, sizeof(path), "%d/fd", (int)pid);
    int fd = openat(proc_fd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return errmsg(why, cap, -EPERM, "the sandbox could not look at the cell's descriptors");
    }
    for (struct dirent *e; (e = readdir(d));) {
        char *end;
        long num = strtol(e->d_name, &end, 10);
        if (e->d_name[0] == '.' || *end || num < 0 || num > INT_MAX)
            continue;
        struct stat st;
        char kind[96] = "";
        bool ok = false;
        if (fstatat(dirfd(d), e->d_name, &st, 0) < 0)
            fmt(kind, sizeof(kind), "a descriptor the sandbox could not look at");
        else if (num == FD_STDIN || num == FD_STDOUT || num == FD_STDERR)
            ok = S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3);
        else if (num == FD_READY)
            ok = S_ISSOCK(st.st_mode) && st.st_ino == chan_ino;
        else if (S_ISREG(st.st_mode) && st.st_dev == ws_dev) {
            struct kept_file f = {.num = (int32_t)num, .ino = st.st_ino};
            bool locked = false;
            if (read_fdinfo(proc_fd, pid, (int)num, &f, &locked) < 0)
                fmt(kind, sizeof(kind), "a file the sandbox could not look at");
            else if (f.flags & O_PATH)
                fmt(kind, sizeof(kind), "an O_PATH descriptor");
            else if (st.st_nlink == 0)
                fmt(kind, sizeof(kind),
                    "a file deleted from its workspace, which no rollback "
                    "could put back");
            else if (locked) {
                if (locked_fd < 0 || num < locked_fd)
                    locked_fd = (int)num;
                continue;
            } else {
                if (++files <= WIRE_HELD_MAX)
                    out->v[out->n++] = f;
                continue;
            }
        }
        if (num == FD_STDIN || num == FD_STDOUT || num == FD_STDERR || num == FD_READY) {
            if (ok) {
                own++;
                continue;
            }
            if (!kind[0])
                fmt(kind, sizeof(kind), "%s, which may only be the sandbox's",
                    num == FD_READY ? "its channel" : "a standard stream");
        } else if (!kind[0])
            describe(dirfd(d), e->d_name, &st, kind, sizeof(kind));
        if ((int)num < first_bad) {
            first_bad = (int)num;
            fmt(what, sizeof(what), "%s", kind);
        }
        bad++;
    }
    closedir(d);
    if (bad)
        return errmsg(why, cap, -EPERM,
                      "the cell left a descriptor open that a session cannot keep: fd %d (%s)%s; "
                      "a cell may leave open only regular files of its workspace: close it "
                      "before the cell ends",
                      first_bad, what, bad > 1 ? ", and others" : "");
    if (locked_fd >= 0)
        return errmsg(why, cap, -EPERM,
                      "the cell left a lock held through fd %d, a file of its workspace (a "
                      "database transaction left open? commit it): the next cell could not hold "
                      "it",
                      locked_fd);
    if (files > WIRE_HELD_MAX)
        return errmsg(why, cap, -EPERM,
                      "the cell left %u files of its workspace open; a session keeps at most %d "
                      "from one cell to the next",
                      files, WIRE_HELD_MAX);
    if (own != 4)
        return errmsg(why, cap, -EPERM,
                      "the cell closed a descriptor the sandbox gives every cell (its standard "
                      "streams or its channel)");
    return 0;
}

/* Kept file |f| of |state|, as the state holds it now: the file itself
 * (O_PATH, which opens nothing and never blocks) if it is a regular file
 * of |ws_dev| with the inode recorded, still named; else -ESTALE. */
static int kept_path(int proc_fd, pid_t state, dev_t ws_dev, const struct kept_file *f)
{
    char path[48];
    struct stat st;

    fmt(path, sizeof(path), "%d/fd/%d", (int)state, f->num);
    int fd = openat(proc_fd, path, O_PATH | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? -ESTALE : -errno;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_dev != ws_dev || st.st_ino != f->ino ||
        st.st_nlink == 0) {
        close(fd);
        return -ESTALE;
    }
    return fd;
}

/* A description of |file| (O_PATH, ours) of its own, as the kept |f| was:
 * its access, flags and offset. Returns it or -errno. */
static int reopen(int proc_fd, pid_t self, int file, const struct kept_file *f)
{
    char path[48];

    fmt(path, sizeof(path), "%d/fd/%d", (int)self, file);
    int fd = openat(proc_fd, path,
                    (int)(f->flags & KEPT_OPEN_FLAGS) | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if ((!(f->flags & O_NONBLOCK) && fcntl(fd, F_SETFL, (int)(f->flags & KEPT_SETFL_FLAGS)) < 0) ||
        lseek(fd, (off_t)f->pos, SEEK_SET) < 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    return fd;
}

int kept_hand_out(int proc_fd, pid_t self, pid_t state, dev_t ws_dev, struct kept_files *k,
                  struct cell_go *go, int *cell_fds, int *sup_fds)
{
    uint32_t kept = 0;
    int given = 0, rc = 0;

    go->n_held = 0;
    for (uint32_t i = 0; rc == 0 && i < k->n; i++) {
        struct kept_file f = k->v[i];
        struct cell_held *h = &go->held[go->n_held++];
        *h = (struct cell_held){.num = f.num, .cloexec = (f.flags & O_CLOEXEC) != 0};
        int file = kept_path(proc_fd, state, ws_dev, &f);
        if (file == -ESTALE)
            continue; /* not given: the cell closes its number */
        int own = file >= 0 ? reopen(proc_fd, self, file, &f) : file;
        if (own < 0) {
            if (file >= 0)
                close(file);
            rc = own;
            break;
        }
        h->given = 1;
        cell_fds[given] = own;
        sup_fds[given++] = file;
        k->v[kept++] = f;
    }
    if (rc < 0) {
        close_fds(cell_fds, (size_t)given);
        close_fds(sup_fds, (size_t)given);
        return rc;
    }
    k->n = kept;
    return given;
}

void kept_prune(int proc_fd, pid_t state, dev_t ws_dev, struct kept_files *k)
{
    uint32_t kept = 0;

    for (uint32_t i = 0; i < k->n; i++) {
        int file = kept_path(proc_fd, state, ws_dev, &k->v[i]);
        if (file >= 0)
            close(file);
        if (file != -ESTALE)
            k->v[kept++] = k->v[i];
    }
    k->n = kept;
}

int kept_adopt(int state_chan, dev_t ws_dev, struct kept_files *k, const struct wire_adopt *a,
               const int *fds, int nfds)
{
    struct stat st[WIRE_HELD_MAX];

    if (a->n != (uint32_t)nfds || a->n > k->n)
        return -EPROTO;
    for (uint32_t i = 0; i < a->n; i++)
        if (a->which[i] >= k->n || fstat(fds[i], &st[i]) < 0 || !S_ISREG(st[i].st_mode) ||
            st[i].st_dev != ws_dev)
            return -EPROTO;
    for (uint32_t i = 0; i < a->n; i++) {
        struct kept_file *f = &k->v[a->which[i]];
        struct session_adopt_msg m = {
            .cmd = SESSION_ADOPT, .cloexec = (f->flags & O_CLOEXEC) != 0, .num = f->num};
        int rc = wire_send(state_chan, &m, sizeof(m), &fds[i], 1);
        if (rc < 0)
            return rc;
        f->ino = st[i].st_ino;
    }
    return 0;
}
