#define _GNU_SOURCE
#include "artifacts.h"

#include "outbuf.h"
#include "wire.h"
#include "sysutil.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

/* True when the file at |dfd|/|leaf| holds exactly |f|'s bytes. */
static bool same_as_input(int dfd, const char *leaf, const struct stat *st,
                          const struct sbx_file *f)
{
    unsigned char buf[65536];
    size_t off = 0;
    bool same = false;
    int fd;

    if ((uint64_t)st->st_size != f->len)
        return false;
    fd = openat(dfd, leaf, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return false;
    for (;;) {
        ssize_t n = read_full(fd, buf, sizeof(buf));
        if (n < 0 || off + (size_t)n > f->len ||
            memcmp(buf, (const unsigned char *)f->data + off, (size_t)n) != 0)
            break;
        off += (size_t)n;
        if ((size_t)n < sizeof(buf)) {
            same = off == f->len;
            break;
        }
    }
    close(fd);
    return same;
}

static const struct sbx_file *find_input(const struct artifact_spec *s, const char *name)
{
    for (size_t i = 0; i < s->n_inputs; i++)
        if (strcmp(s->inputs[i].name, name) == 0)
            return &s->inputs[i];
    return NULL;
}

/* An entry of a directory, as its listing gave it. */
struct ent {
    char *name;
    bool dir;
};

/* A directory being walked: its entries sorted, the next to visit. */
struct level {
    struct ent *v;
    size_t n, next;
    size_t path_len; /* the path's length up to and including its '/' */
    dev_t dev;
    ino_t ino;
};

/* The walk's state: the path it is at (grown as needed), what it returns,
 * and what it drops. */
struct walk {
    const struct artifact_spec *s;
    bool private_fs;
    dev_t dev; /* the workspace's file system */
    char *path;
    size_t path_cap;
    struct sbx_artifact *v;
    size_t n, alloc;
    uint64_t left; /* of max_total */
    uint64_t dropped;
    struct sbx_dropped_artifact *gone;
    size_t n_gone;
    size_t gone_bytes; /* of the listed names */
};

/* The byte at |i| of the path this entry adds: its name, then a '/' for a
 * directory, so that sorting the entries sorts the paths beneath. */
static int key_at(const struct ent *e, size_t i, size_t len)
{
    if (i < len)
        return (unsigned char)e->name[i];
    return i == len && e->dir ? '/' : 0;
}

static int cmp_ents(const void *pa, const void *pb)
{
    const struct ent *a = pa, *b = pb;
    size_t la = strlen(a->name), lb = strlen(b->name);

    for (size_t i = 0;; i++) {
        int ca = key_at(a, i, la), cb = key_at(b, i, lb);
        if (ca != cb || ca == 0)
            return ca - cb;
    }
}

static void level_free(struct level *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].name);
    free(l->v);
    l->v = NULL;
    l->n = l->next = 0;
}

/* The directories and regular files of the directory |fd|, sorted. */
static int level_read(int fd, struct level *l)
{
    int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    size_t alloc = 0;
    int rc = 0;

    if (!d) {
        rc = -errno;
        if (dup_fd >= 0)
            close(dup_fd);
        return rc;
    }
    rewinddir(d); /* the offset is shared with |fd|, which may have been read */
    for (struct dirent *e; (e = readdir(d));) {
        const char *n = e->d_name;
        if (n[0] == '.' && (n[1] == '\0' || (n[1] == '.' && n[2] == '\0')))
            continue;
        unsigned char type = e->d_type;
        if (type == DT_UNKNOWN) {
            struct stat st;
            if (fstatat(fd, n, &st, AT_SYMLINK_NOFOLLOW) < 0)
                continue;
            type = S_ISDIR(st.st_mode) ? DT_DIR : S_ISREG(st.st_mode) ? DT_REG : DT_UNKNOWN;
        }
        if (type != DT_DIR && type != DT_REG)
            continue; /* links, FIFOs, sockets, devices: never artifacts */
        if (l->n == alloc) {
            size_t want = alloc ? alloc * 2 : 16;
            struct ent *v = realloc(l->v, want * sizeof(*v));
            if (!v) {
                rc = -ENOMEM;
                break;
            }
            l->v = v;
            alloc = want;
        }
        l->v[l->n].name = strdup(n);
        l->v[l->n].dir = type == DT_DIR;
        if (!l->v[l->n].name) {
            rc = -ENOMEM;
            break;
        }
        l->n++;
    }
    closedir(d);
    if (rc == 0 && l->n > 1)
        qsort(l->v, l->n, sizeof(*l->v), cmp_ents);
    return rc;
}

char *artifacts_escape_name(char *raw)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)raw;
    size_t len = strlen(raw), i = 0, extra = 0;
    bool plain = true;

    /* Pass 1 finds the bytes to escape; pass 2 writes them. */
    for (int pass = 0; pass < 2; pass++) {
        char *out = NULL, *o = NULL;
        if (pass == 1) {
            if (plain)
                return raw;
            out = o = malloc(len + extra + 1);
            if (!out)
                return NULL;
        }
        for (i = 0; i < len;) {
            size_t seq = utf8_valid_prefix(s + i, len - i > 4 ? 4 : len - i);
            /* One character: the valid prefix's first. */
            size_t clen = s[i] < 0x80 ? 1 : s[i] < 0xE0 ? 2 : s[i] < 0xF0 ? 3 : 4;
            bool ok =
                seq >= clen && !(clen == 3 && s[i] == 0xEF && s[i + 1] == 0xBF && s[i + 2] == 0xBD);
            size_t take = ok ? clen : (seq >= clen ? clen : 1);
            if (!ok) {
                plain = false;
                extra += take * 4; /* each byte: U+FFFD (3 bytes) + 2 digits, for 1 */
            }
            if (o) {
                if (ok)
                    memcpy(o, s + i, take), o += take;
                else
                    for (size_t k = 0; k < take; k++) {
                        memcpy(o, "\xef\xbf\xbd", 3);
                        o[3] = hex[s[i + k] >> 4];
                        o[4] = hex[s[i + k] & 15];
                        o += 5;
                    }
            }
            i += take;
        }
        if (o) {
            *o = '\0';
            return out;
        }
    }
    return raw;
}

/* Both names of the file at the walk's path: *name escaped, *raw its
 * bytes (the same string when no escaping was needed). */
static int names_of(const struct walk *w, char **name, char **raw)
{
    *raw = strdup(w->path);
    *name = *raw ? artifacts_escape_name(*raw) : NULL;
    if (!*name) {
        free(*raw);
        return -ENOMEM;
    }
    return 0;
}

static void names_free(char *name, char *raw)
{
    if (name != raw)
        free(name);
    free(raw);
}

/* Counts what the walk's path names as not returned, and lists it while
 * the list has room. */
static int drop(struct walk *w, enum sbx_drop_reason why, uint64_t size)
{
    size_t len = strlen(w->path);

    w->dropped++;
    if (w->n_gone == SBX_MAX_DROPPED_LISTED || w->gone_bytes + len > SBX_MAX_DROPPED_NAME_BYTES)
        return 0;
    if (w->n_gone == 0) {
        w->gone = calloc(SBX_MAX_DROPPED_LISTED, sizeof(*w->gone));
        if (!w->gone)
            return -ENOMEM;
    }
    struct sbx_dropped_artifact *d = &w->gone[w->n_gone];
    if (names_of(w, &d->name, &d->raw_name) < 0)
        return -ENOMEM;
    d->size = size;
    d->reason = why;
    w->gone_bytes += len;
    w->n_gone++;
    return 0;
}

/* Reads the regular file |leaf| of the directory |dir| (the walk's path)
 * into a new artifact, or drops it. */
static int take_file(struct walk *w, int dir, const char *leaf, bool top)
{
    const struct artifact_spec *s = w->s;
    struct stat st;

    if (top && (strcmp(leaf, WIRE_VALUE_FILE) == 0 || strcmp(leaf, WIRE_ERROR_FILE) == 0))
        return 0; /* the value or the error, not an artifact */
    if (s->only && !s->only(s->only_ctx, w->path))
        return 0;
    if (fstatat(dir, leaf, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
        return 0; /* gone, or not a file any more */
    const struct sbx_file *in = find_input(s, w->path);
    if (in && same_as_input(dir, leaf, &st, in))
        return 0;
    if (w->n >= s->max_count)
        return drop(w, SBX_DROP_MAX_ARTIFACTS, (uint64_t)st.st_size);
    /* Without a file system of its own, a file of several names may be a
     * file from outside linked in: not read. */
    if (st.st_nlink != 1 && !w->private_fs)
        return drop(w, SBX_DROP_LINKED, (uint64_t)st.st_size);
    uint64_t want = (uint64_t)st.st_size < s->max_bytes ? (uint64_t)st.st_size : s->max_bytes;
    /* The names cost what bytes do (its bytes and the form shown, or twice
     * a plain name): no run makes the supervisor hold more than the total,
     * however long or odd its paths. */
    char *name, *raw;
    if (names_of(w, &name, &raw) < 0)
        return -ENOMEM;
    uint64_t names = strlen(raw) + strlen(name);
    if (want + names > w->left) {
        names_free(name, raw);
        return drop(w, SBX_DROP_MAX_TOTAL_BYTES, (uint64_t)st.st_size);
    }

    int fd = openat(dir, leaf, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    struct stat now;
    if (fd < 0 || fstat(fd, &now) < 0 || !S_ISREG(now.st_mode) || now.st_ino != st.st_ino ||
        now.st_dev != w->dev || (now.st_nlink != 1 && !w->private_fs)) {
        if (fd >= 0)
            close(fd);
        names_free(name, raw);
        return drop(w, SBX_DROP_UNREADABLE, (uint64_t)st.st_size);
    }
    if (w->n == w->alloc) {
        size_t want_n = w->alloc ? w->alloc * 2 : 16;
        struct sbx_artifact *v = realloc(w->v, want_n * sizeof(*v));
        if (!v) {
            close(fd);
            names_free(name, raw);
            return -ENOMEM;
        }
        w->v = v;
        w->alloc = want_n;
    }
    struct sbx_artifact *a = &w->v[w->n];
    memset(a, 0, sizeof(*a));
    /* At most what was counted against the total, whatever the size now. */
    a->data = malloc(want ? want : 1);
    ssize_t got = a->data ? read_full(fd, a->data, (size_t)want) : -ENOMEM;
    close(fd);
    if (got < 0) {
        free(a->data);
        a->data = NULL;
        names_free(name, raw);
        return got == -ENOMEM ? -ENOMEM : drop(w, SBX_DROP_UNREADABLE, (uint64_t)now.st_size);
    }
    a->name = name;
    a->raw_name = raw;
    a->data_len = (size_t)got;
    a->size = (uint64_t)now.st_size;
    a->truncated = a->size > a->data_len;
    w->left -= a->data_len + names;
    w->n++;
    return 0;
}

/* Sets the walk's path to |len| bytes of what it was, then |name|, then
 * '/' when |dir|. */
static int path_set(struct walk *w, size_t len, const char *name, bool dir)
{
    size_t nlen = strlen(name), need = len + nlen + 2;

    if (need > w->path_cap) {
        size_t cap = w->path_cap ? w->path_cap : 256;
        while (cap < need)
            cap *= 2;
        char *p = realloc(w->path, cap);
        if (!p)
            return -ENOMEM;
        w->path = p;
        w->path_cap = cap;
    }
    memcpy(w->path + len, name, nlen);
    if (dir)
        w->path[len + nlen++] = '/';
    w->path[len + nlen] = '\0';
    return 0;
}

/* Walks |ws_fd| depth first in the order of the paths' bytes, holding one
 * directory open at a time: a directory is left by "..", checked to be the
 * one the walk came from (nothing changes the workspace now; should it,
 * the walk stops rather than go astray). */
static int walk(int ws_fd, struct walk *w)
{
    size_t depth = 0, alloc = 16;
    struct level *lv = calloc(alloc, sizeof(*lv));
    struct stat st;
    int cur = fcntl(ws_fd, F_DUPFD_CLOEXEC, 0);
    int rc = 0;

    if (!lv || cur < 0 || fstat(cur, &st) < 0) {
        rc = !lv ? -ENOMEM : -errno;
        goto out;
    }
    w->dev = st.st_dev;
    lv[0].dev = st.st_dev;
    lv[0].ino = st.st_ino;
    rc = path_set(w, 0, "", false);
    if (rc == 0)
        rc = level_read(cur, &lv[0]);
    while (rc == 0) {
        struct level *l = &lv[depth];
        if (l->next == l->n) {
            level_free(l);
            if (depth == 0)
                break;
            int up = openat(cur, "..", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (up < 0 || fstat(up, &st) < 0 || st.st_dev != lv[depth - 1].dev ||
                st.st_ino != lv[depth - 1].ino) {
                rc = up < 0 ? -errno : -ESTALE;
                if (up >= 0)
                    close(up);
                break;
            }
            close(cur);
            cur = up;
            depth--;
            continue;
        }
        struct ent *e = &l->v[l->next++];
        rc = path_set(w, l->path_len, e->name, e->dir);
        if (rc < 0)
            break;
        if (!e->dir) {
            rc = take_file(w, cur, e->name, depth == 0);
            continue;
        }
        if (depth + 1 > SBX_MAX_ARTIFACT_DEPTH) {
            rc = drop(w, SBX_DROP_TOO_DEEP, 0);
            continue;
        }
        int sub = openat(cur, e->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0 || fstat(sub, &st) < 0 || st.st_dev != w->dev) {
            if (sub >= 0)
                close(sub);
            rc = drop(w, SBX_DROP_UNREADABLE, 0);
            continue;
        }
        if (depth + 1 == alloc) {
            struct level *more = realloc(lv, alloc * 2 * sizeof(*lv));
            if (!more) {
                close(sub);
                rc = -ENOMEM;
                break;
            }
            lv = more;
            memset(lv + alloc, 0, alloc * sizeof(*lv));
            alloc *= 2;
        }
        struct level *next = &lv[depth + 1];
        *next = (struct level){.path_len = strlen(w->path), .dev = st.st_dev, .ino = st.st_ino};
        rc = level_read(sub, next);
        if (rc < 0) {
            level_free(next);
            close(sub);
            if (rc == -ENOMEM)
                break;
            rc = drop(w, SBX_DROP_UNREADABLE, 0);
            continue;
        }
        close(cur);
        cur = sub;
        depth++;
    }
out:
    for (size_t i = 0; lv && i <= depth && i < alloc; i++)
        level_free(&lv[i]);
    free(lv);
    if (cur >= 0)
        close(cur);
    return rc;
}

bool artifacts_private_fs(int ws_fd)
{
    struct statfs sf;
    struct statx sx;

    return fstatfs(ws_fd, &sf) == 0 && sf.f_type == TMPFS_MAGIC &&
           statx(ws_fd, "", AT_EMPTY_PATH, STATX_BASIC_STATS, &sx) == 0 &&
           (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) &&
           (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT);
}

int artifacts_collect(int ws_fd, const struct artifact_spec *s, bool private_fs,
                      struct artifact_set *out)
{
    struct walk w = {.s = s, .private_fs = private_fs, .left = s->max_total};
    int rc = walk(ws_fd, &w);

    free(w.path);
    if (rc < 0) {
        artifacts_free(w.v, w.n);
        dropped_free(w.gone, w.n_gone);
        memset(out, 0, sizeof(*out));
        return rc;
    }
    *out = (struct artifact_set){
        .v = w.v, .n = w.n, .dropped = w.dropped, .gone = w.gone, .n_gone = w.n_gone};
    return 0;
}

void artifact_set_free(struct artifact_set *set)
{
    artifacts_free(set->v, set->n);
    dropped_free(set->gone, set->n_gone);
    memset(set, 0, sizeof(*set));
}

/* The report |name| the worker left, open for reading; -1 when there is
 * none (or it is not a regular file of one name). */
static int open_report(int ws_fd, const char *name)
{
    int fd = open_beneath(ws_fd, name, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0, false);
    struct stat st;

    if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1))
        close_fd(&fd);
    return fd;
}

int artifacts_take_value(int ws_fd, uint64_t max_chars, char **text, size_t *len, bool *truncated)
{
    int fd = open_report(ws_fd, WIRE_VALUE_FILE);
    struct outbuf ob;
    char buf[65536];
    ssize_t n;

    *text = NULL;
    if (fd < 0)
        return 0;
    outbuf_init(&ob, max_chars);
    while ((n = read(fd, buf, sizeof(buf))) > 0)
        outbuf_feed(&ob, buf, (size_t)n);
    close(fd);
    *text = outbuf_finish(&ob, len, truncated);
    outbuf_free(&ob);
    return *text ? 0 : -ENOMEM;
}

/* The parts of an error report: its type, its message and its traceback. */
#define ERROR_PARTS 3

int artifacts_take_error(int ws_fd, uint64_t max_chars, struct sbx_result *res)
{
    int fd = open_report(ws_fd, WIRE_ERROR_FILE);
    struct outbuf ob[ERROR_PARTS];
    char *text[ERROR_PARTS] = {NULL};
    char buf[65536];
    ssize_t n;
    int part = 0, rc = 0;

    if (fd < 0)
        return 0;
    /* Each part is cut to max_chars as it is read, apart: a part longer than
     * a bound on the whole would push the NULs that end the others out of
     * what is kept, and the whole report would be lost. */
    for (int i = 0; i < ERROR_PARTS; i++)
        outbuf_init(&ob[i], max_chars);
    while (part < ERROR_PARTS && (n = read(fd, buf, sizeof(buf))) > 0)
        for (const char *at = buf, *end = buf + n; at < end && part < ERROR_PARTS;) {
            const char *nul = memchr(at, '\0', (size_t)(end - at));
            outbuf_feed(&ob[part], at, (size_t)((nul ? nul : end) - at));
            if (!nul)
                break;
            part++;
            at = nul + 1;
        }
    close(fd);
    /* Three parts each ended by its NUL, or it is not the worker's report
     * (or one cut short, the workspace full): none, rather than half of one. */
    for (int i = 0; i < ERROR_PARTS; i++) {
        size_t len;
        bool cut;
        if (part == ERROR_PARTS && rc == 0 && !(text[i] = outbuf_finish_quiet(&ob[i], &len, &cut)))
            rc = -ENOMEM;
        outbuf_free(&ob[i]);
    }
    if (part == ERROR_PARTS && rc == 0) {
        res->error_type = text[0];
        res->error_message = text[1];
        res->error_traceback = text[2];
        return 0;
    }
    for (int i = 0; i < ERROR_PARTS; i++)
        free(text[i]);
    return rc;
}

void artifacts_free(struct sbx_artifact *a, size_t n)
{
    for (size_t i = 0; a && i < n; i++) {
        names_free(a[i].name, a[i].raw_name);
        free(a[i].data);
    }
    free(a);
}

void dropped_free(struct sbx_dropped_artifact *d, size_t n)
{
    for (size_t i = 0; d && i < n; i++)
        names_free(d[i].name, d[i].raw_name);
    free(d);
}
