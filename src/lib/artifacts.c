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
#include <sys/stat.h>
#include <unistd.h>

#define PATH_CAP 4096

struct entry {
    char *name; /* as reported: valid UTF-8 */
    char *path; /* the bytes on disk */
};

/* A max-heap on name holds the |cap| smallest names seen so far, so ten
 * thousand files cost no more memory than max_count of them. */
struct heap {
    struct entry *v;
    size_t n;     /* entries held */
    size_t alloc; /* entries allocated */
    size_t cap;   /* entries wanted at most */
};

static void entry_free(struct entry *e)
{
    if (e->path != e->name)
        free(e->path);
    free(e->name);
}

static void sift_down(struct heap *h, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && strcmp(h->v[l].name, h->v[m].name) > 0)
            m = l;
        if (r < h->n && strcmp(h->v[r].name, h->v[m].name) > 0)
            m = r;
        if (m == i)
            return;
        struct entry t = h->v[i];
        h->v[i] = h->v[m];
        h->v[m] = t;
        i = m;
    }
}

static void sift_up(struct heap *h, size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (strcmp(h->v[p].name, h->v[i].name) >= 0)
            return;
        struct entry t = h->v[i];
        h->v[i] = h->v[p];
        h->v[p] = t;
        i = p;
    }
}

/* Offers a candidate; takes ownership of |e| either way. */
static int heap_offer(struct heap *h, struct entry e)
{
    if (h->cap == 0) {
        entry_free(&e);
        return 0;
    }
    if (h->n < h->cap) {
        if (h->n == h->alloc) {
            size_t want = h->alloc ? h->alloc * 2 : 64;
            if (want > h->cap)
                want = h->cap;
            struct entry *v = realloc(h->v, want * sizeof(*v));
            if (!v)
                goto oom;
            h->v = v;
            h->alloc = want;
        }
        h->v[h->n++] = e;
        sift_up(h, h->n - 1);
        return 0;
    }
    if (strcmp(e.name, h->v[0].name) < 0) {
        entry_free(&h->v[0]);
        h->v[0] = e;
        sift_down(h, 0);
    } else
        entry_free(&e);
    return 0;
oom:
    entry_free(&e);
    return -ENOMEM;
}

static int cmp_entries(const void *a, const void *b)
{
    return strcmp(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

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

/* The name as UTF-8; invalid bytes become U+FFFD. Returns |path| itself when
 * it is valid already. */
static char *display_name(char *path)
{
    size_t len = strlen(path);
    struct outbuf ob;
    bool cut;

    if (utf8_valid_prefix((const unsigned char *)path, len) == len)
        return path;
    outbuf_init(&ob, len);
    outbuf_feed(&ob, path, len);
    return outbuf_finish(&ob, &len, &cut);
}

struct frame {
    DIR *dir;
    size_t path_len; /* length of the path up to and including this dir's '/' */
};

static int walk(int ws_fd, const struct artifact_spec *s, struct heap *h, uint64_t *total)
{
    struct frame stack[ARTIFACT_MAX_DEPTH + 1];
    char path[PATH_CAP + 1];
    int depth = 0;
    int rc = 0;
    int fd = fcntl(ws_fd, F_DUPFD_CLOEXEC, 0);

    if (fd < 0)
        return -errno;
    stack[0].dir = fdopendir(fd);
    if (!stack[0].dir) {
        close(fd);
        return -errno;
    }
    rewinddir(stack[0].dir);
    stack[0].path_len = 0;

    while (depth >= 0 && rc == 0) {
        struct frame *f = &stack[depth];
        struct dirent *e = readdir(f->dir);
        if (!e) {
            closedir(f->dir);
            depth--;
            continue;
        }
        const char *n = e->d_name;
        if (n[0] == '.' && (n[1] == '\0' || (n[1] == '.' && n[2] == '\0')))
            continue;
        size_t nlen = strlen(n);
        if (f->path_len + nlen + 1 > PATH_CAP)
            continue;
        struct stat st;
        if (fstatat(dirfd(f->dir), n, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        memcpy(path + f->path_len, n, nlen + 1);
        if (S_ISDIR(st.st_mode)) {
            if (depth >= ARTIFACT_MAX_DEPTH)
                continue;
            int sub = openat(dirfd(f->dir), n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            DIR *d = sub >= 0 ? fdopendir(sub) : NULL;
            if (!d) {
                if (sub >= 0)
                    close(sub);
                continue;
            }
            depth++;
            stack[depth].dir = d;
            path[f->path_len + nlen] = '/';
            stack[depth].path_len = f->path_len + nlen + 1;
            continue;
        }
        /* A file with another link may be a host file linked in: skip it,
         * with everything that is not a plain file. */
        if (!S_ISREG(st.st_mode) || st.st_nlink != 1)
            continue;
        if (depth == 0 && (strcmp(n, WIRE_VALUE_FILE) == 0 || strcmp(n, WIRE_ERROR_FILE) == 0))
            continue; /* the value or the error, not an artifact */
        if (s->only && !s->only(s->only_ctx, path))
            continue;
        const struct sbx_file *in = find_input(s, path);
        if (in && same_as_input(dirfd(f->dir), n, &st, in))
            continue;
        (*total)++;
        struct entry ent = {.path = strdup(path)};
        ent.name = ent.path ? display_name(ent.path) : NULL;
        if (!ent.name) {
            free(ent.path);
            rc = -ENOMEM;
            break;
        }
        rc = heap_offer(h, ent);
    }
    while (depth >= 0)
        closedir(stack[depth--].dir);
    return rc;
}

/* |e|'s first |max_bytes| into |a|; -EFBIG, without reading a byte, when
 * that is more than |left| (what remains of the run's total). */
static int read_artifact(int ws_fd, const struct entry *e, uint64_t max_bytes, uint64_t left,
                         struct sbx_artifact *a)
{
    struct stat st;
    int fd = open_beneath(ws_fd, e->path, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0, false);
    int rc = 0;

    if (fd < 0)
        return fd;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
        rc = -EPERM;
        goto out;
    }
    uint64_t want = (uint64_t)st.st_size < max_bytes ? (uint64_t)st.st_size : max_bytes;
    if (want > left) {
        rc = -EFBIG;
        goto out;
    }
    a->data = malloc(want ? want : 1);
    if (!a->data) {
        rc = -ENOMEM;
        goto out;
    }
    ssize_t n = read_full(fd, a->data, (size_t)want);
    if (n < 0) {
        rc = (int)n;
        goto out;
    }
    a->data_len = (size_t)n;
    a->size = (uint64_t)st.st_size;
    a->truncated = a->size > a->data_len;
out:
    close(fd);
    return rc;
}

int artifacts_collect(int ws_fd, const struct artifact_spec *s, struct sbx_artifact **out,
                      size_t *n_out, uint64_t *dropped)
{
    struct heap h = {.cap = s->max_count};
    struct sbx_artifact *arts = NULL;
    uint64_t total = 0;
    size_t n = 0;
    int rc;

    *out = NULL;
    *n_out = 0;
    *dropped = 0;
    rc = walk(ws_fd, s, &h, &total);
    if (rc < 0)
        goto out;
    if (h.n > 1)
        qsort(h.v, h.n, sizeof(*h.v), cmp_entries);
    arts = calloc(h.n ? h.n : 1, sizeof(*arts));
    if (!arts) {
        rc = -ENOMEM;
        goto out;
    }
    uint64_t left = s->max_total;
    for (size_t i = 0; i < h.n; i++) {
        struct sbx_artifact *a = &arts[n];
        int got = read_artifact(ws_fd, &h.v[i], s->max_bytes, left, a);
        if (got == -EFBIG) {
            memset(a, 0, sizeof(*a));
            continue; /* past the total: counted as dropped */
        }
        if (got < 0) {
            free(a->data);
            memset(a, 0, sizeof(*a));
            total--; /* gone or changed kind: not a file any more */
            continue;
        }
        left -= a->data_len;
        a->name = h.v[i].name;
        if (h.v[i].path != h.v[i].name)
            free(h.v[i].path);
        h.v[i].name = h.v[i].path = NULL;
        n++;
    }
    *out = arts;
    arts = NULL;
    *n_out = n;
    *dropped = total - n;
out:
    for (size_t i = 0; i < h.n; i++)
        entry_free(&h.v[i]);
    free(h.v);
    free(arts);
    return rc;
}

/* The report |name| the worker left, as text of at most |max_chars|
 * characters; *text NULL when there is none. Returns 0 or -ENOMEM. */
static int take_report(int ws_fd, const char *name, uint64_t max_chars, char **text, size_t *len,
                       bool *truncated)
{
    int fd = open_beneath(ws_fd, name, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0, false);
    struct outbuf ob;
    struct stat st;
    char buf[65536];
    ssize_t n = 0;

    *text = NULL;
    if (fd < 0)
        return 0;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
        close(fd);
        return 0;
    }
    outbuf_init(&ob, max_chars);
    while ((n = read(fd, buf, sizeof(buf))) > 0)
        outbuf_feed(&ob, buf, (size_t)n);
    close(fd);
    *text = outbuf_finish(&ob, len, truncated);
    outbuf_free(&ob);
    return *text ? 0 : -ENOMEM;
}

int artifacts_take_value(int ws_fd, uint64_t max_chars, char **text, size_t *len, bool *truncated)
{
    return take_report(ws_fd, WIRE_VALUE_FILE, max_chars, text, len, truncated);
}

/* How much of each part of an error report is read at least. */
#define ERROR_PART_READ 65536

/* |s| (valid UTF-8) ended after |max_chars| characters. */
static void cut_chars(char *s, uint64_t max_chars)
{
    uint64_t chars = 0;

    for (char *p = s; *p; p++)
        if (((unsigned char)*p & 0xC0) != 0x80 && chars++ == max_chars) {
            *p = '\0';
            return;
        }
}

/* The next NUL-ended part of [*at, end), copied (NULL when it has no NUL:
 * the report was cut, or is not one). */
static char *report_field(const char **at, const char *end)
{
    const char *nul = *at < end ? memchr(*at, '\0', (size_t)(end - *at)) : NULL;
    char *copy = nul ? strndup(*at, (size_t)(nul - *at)) : NULL;

    if (nul)
        *at = nul + 1;
    return copy;
}

int artifacts_take_error(int ws_fd, uint64_t max_chars, struct sbx_result *res)
{
    char *text = NULL;
    size_t len = 0;
    bool truncated;
    /* Three parts, each cut to max_chars below: read enough that a small
     * max_chars still gets the type and the message whole. */
    uint64_t part = max_chars > ERROR_PART_READ ? max_chars : ERROR_PART_READ;
    int rc = take_report(ws_fd, WIRE_ERROR_FILE, 3 * part + 3, &text, &len, &truncated);

    if (rc < 0 || !text)
        return rc;
    const char *at = text, *end = text + len;
    res->error_type = report_field(&at, end);
    res->error_message = res->error_type ? report_field(&at, end) : NULL;
    res->error_traceback = res->error_message ? report_field(&at, end) : NULL;
    /* A traceback cut on the way: what came of it. */
    if (res->error_message && !res->error_traceback && truncated)
        res->error_traceback = strndup(at, (size_t)(end - at));
    free(text);
    if (!res->error_traceback) {
        /* Not the worker's report (or cut): none, rather than half of one. */
        free(res->error_type);
        free(res->error_message);
        res->error_type = res->error_message = NULL;
        return 0;
    }
    /* Each part as long as a stream may be. */
    char **parts[3] = {&res->error_type, &res->error_message, &res->error_traceback};
    for (int i = 0; i < 3; i++)
        cut_chars(*parts[i], max_chars);
    return 0;
}

void artifacts_free(struct sbx_artifact *a, size_t n)
{
    for (size_t i = 0; a && i < n; i++) {
        free(a[i].name);
        free(a[i].data);
    }
    free(a);
}
