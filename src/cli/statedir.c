#define _GNU_SOURCE
#include "statedir.h"

#include "mac.h"
#include "sbxerr.h"
#include "sysutil.h"
#include "util.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HEAD_MAGIC   "PYSBXHIB"
#define HEAD_VERSION 1u
#define LOST_MAGIC   "PYSBXLOST\n"
#define HEX_LEN      (2 * MAC_BYTES)
/* What the copy of an image reads and writes at a time, and the room asked
 * for the pipe it comes through. */
#define COPY_CHUNK (1u << 20)
/* What a tombstone's file may hold. */
#define LOST_MAX_BYTES 512u

/* An image's head. Fields in this machine's byte order: an image restores
 * only in a template of the same build on the same machine anyway. */
struct head {
    char magic[8];
    uint32_t version;
    uint32_t name_len;
    uint8_t build[MAC_BYTES];
    uint8_t tenant[STATE_TENANT_BYTES];
    char pysbx_version[32];
    uint64_t written_ms;    /* when it was written, ms since the epoch */
    uint64_t idle_since_ms; /* when the session's last cell ended */
    uint64_t cells, memory_bytes;
    int64_t max_rss_kb;
    char name[SESSION_NAME_MAX]; /* name_len of them, the rest zeros */
};

/* After the library's image: its length, and the MAC of all before. */
struct tail {
    uint64_t image_bytes;
    uint8_t tag[MAC_BYTES];
};

_Static_assert(sizeof(struct head) ==
                   8 + 8 + MAC_BYTES + STATE_TENANT_BYTES + 32 + 5 * 8 + SESSION_NAME_MAX,
               "an image's head has no padding (all of it is signed)");
_Static_assert(sizeof(struct tail) == 8 + MAC_BYTES, "an image's tail has no padding");

/* What the MACs are of: one domain each. */
#define DOMAIN_IMAGE  "pysbx session image v1"
#define DOMAIN_FILE   "pysbx image file name"
#define DOMAIN_TENANT "pysbx tenant"
#define DOMAIN_BUILD  "pysbx build"

/* An image or a tombstone in the directory. */
struct held {
    struct held *next;
    uint64_t ticket; /* this entry's alone, for state_dir_release */
    char hex[HEX_LEN + 1];
    bool lost;   /* a tombstone */
    bool pinned; /* being restored: not dropped to make room */
    uint64_t at_ms;
    uint8_t tenant[STATE_TENANT_BYTES];
    struct state_session info; /* of an image: from its head */
};

/* An image being written, by its file's name: one at a time per name. */
struct writing {
    struct writing *next;
    char hex[HEX_LEN + 1];
};

struct state_dir {
    int dir_fd, images_fd, lock_fd;
    struct mac_key *key;
    uint8_t build[MAC_BYTES];
    uint64_t max_bytes;
    pthread_mutex_t lock; /* the index and the counts; taken alone */
    struct held *held;
    struct writing *writing;
    uint64_t images, lost; /* entries of each kind */
    uint64_t total;        /* the images' bytes */
    uint64_t reserved;     /* those of images being written, apart */
    uint64_t tickets;
};

static uint64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void to_hex(const uint8_t *raw, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
}

/* The file name of |tenant|'s session |name| (HEX_LEN + 1 bytes). */
static int file_hex(struct state_dir *d, const uint8_t *tenant, const char *name, char *out)
{
    struct mac *m = mac_begin(d->key, DOMAIN_FILE);
    uint8_t tag[MAC_BYTES];

    if (!m)
        return -ENOMEM;
    mac_update(m, tenant, STATE_TENANT_BYTES);
    mac_update(m, name, strlen(name) + 1);
    if (mac_end(m, tag) < 0)
        return -EIO;
    to_hex(tag, sizeof(tag), out);
    return 0;
}

int state_dir_tenant(struct state_dir *d, const char *kind, const char *secret, size_t len,
                     uint8_t out[STATE_TENANT_BYTES])
{
    struct mac *m = mac_begin(d->key, DOMAIN_TENANT);

    if (!m)
        return -ENOMEM;
    mac_update(m, kind, strlen(kind) + 1);
    mac_update(m, secret, len);
    return mac_end(m, out) < 0 ? -ENOMEM : 0;
}

/* --- the index (under d->lock) ---------------------------------------------------- */

static struct held *find_held(struct state_dir *d, const char *hex)
{
    struct held *h = d->held;

    while (h && strcmp(h->hex, hex) != 0)
        h = h->next;
    return h;
}

static void unlink_held(struct state_dir *d, const struct held *h)
{
    char name[HEX_LEN + 8];

    fmt(name, sizeof(name), "%s.%s", h->hex, h->lost ? "lost" : "img");
    (void)unlinkat(d->images_fd, name, 0);
}

/* Takes |h| out of the index and frees it; its file stays. */
static void forget(struct state_dir *d, struct held *h)
{
    for (struct held **pp = &d->held; *pp; pp = &(*pp)->next)
        if (*pp == h) {
            *pp = h->next;
            break;
        }
    if (h->lost)
        d->lost--;
    else {
        d->images--;
        d->total -= h->info.bytes;
    }
    free(h);
}

static void add_held(struct state_dir *d, struct held *h)
{
    h->ticket = ++d->tickets;
    h->next = d->held;
    d->held = h;
    if (h->lost)
        d->lost++;
    else {
        d->images++;
        d->total += h->info.bytes;
    }
}

/* The oldest unpinned entry of a kind; NULL when there is none. */
static struct held *oldest(struct state_dir *d, bool lost)
{
    struct held *o = NULL;

    for (struct held *h = d->held; h; h = h->next)
        if (h->lost == lost && !h->pinned && (!o || h->at_ms < o->at_ms))
            o = h;
    return o;
}

/* A tombstone for |hex| saying |why|, in place of whatever it had. A
 * tombstone that cannot be written is told to no one: the session's next
 * cell then finds nothing and starts afresh. */
static void bury(struct state_dir *d, const char *hex_, const char *why)
{
    char hex[HEX_LEN + 1], name[HEX_LEN + 8];

    /* |hex_| may be the name of the entry this replaces, freed below. */
    memcpy(hex, hex_, sizeof(hex));
    struct held *h = find_held(d, hex);
    if (h) {
        unlink_held(d, h);
        forget(d, h);
    }
    while (d->lost >= STATE_MAX_TOMBSTONES && (h = oldest(d, true))) {
        unlink_held(d, h);
        forget(d, h);
    }
    fmt(name, sizeof(name), "%s.lost", hex);
    int fd =
        openat(d->images_fd, name, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    char text[LOST_MAX_BYTES];
    fmt(text, sizeof(text), "%s%s", LOST_MAGIC, why);
    bool ok = fd >= 0 && write_full(fd, text, strlen(text)) == 0;
    if (fd >= 0)
        close(fd);
    if (!ok || !(h = calloc(1, sizeof(*h)))) {
        (void)unlinkat(d->images_fd, name, 0);
        return;
    }
    memcpy(h->hex, hex, sizeof(h->hex));
    h->lost = true;
    h->at_ms = wall_ms();
    add_held(d, h);
}

/* Room for an image of |n| bytes within the cap: the oldest images not
 * being restored are dropped, each leaving a tombstone, until there is.
 * Returns 0, or -EFBIG when those left do not leave room. */
static int make_room(struct state_dir *d, uint64_t n)
{
    struct held *h;

    while (d->total + n > d->max_bytes && (h = oldest(d, false))) {
        char why[200];
        fmt(why, sizeof(why),
            "its image was dropped: the state directory reached --state-max-bytes (%llu "
            "bytes) and it was the oldest",
            (unsigned long long)d->max_bytes);
        fprintf(stderr, "pysbx: session \"%s\" dropped from the state directory: %s\n",
                h->info.name, "the oldest image past --state-max-bytes");
        bury(d, h->hex, why);
    }
    return d->total + n > d->max_bytes ? -EFBIG : 0;
}

/* |n| more bytes of an image being written, |mine| of it so far: within
 * the cap alone (else -EFBIG), and with the other images being written
 * within the cap too (else -EAGAIN). Images are dropped to make room only
 * once one is written whole, so that one that turns out too large drops
 * none; meanwhile the directory holds at most the cap twice. */
static int reserve(struct state_dir *d, uint64_t mine, uint64_t n)
{
    int rc = 0;

    pthread_mutex_lock(&d->lock);
    if (mine + n > d->max_bytes)
        rc = -EFBIG;
    else if (d->reserved + n > d->max_bytes)
        rc = -EAGAIN;
    else
        d->reserved += n;
    pthread_mutex_unlock(&d->lock);
    return rc;
}

static void unreserve(struct state_dir *d, uint64_t n)
{
    pthread_mutex_lock(&d->lock);
    d->reserved -= n;
    pthread_mutex_unlock(&d->lock);
}

/* --- heads ------------------------------------------------------------------------ */

static void info_of_head(const struct head *h, uint64_t bytes, struct state_session *info)
{
    memset(info, 0, sizeof(*info));
    memcpy(info->name, h->name, h->name_len);
    info->cells = h->cells;
    info->memory_bytes = h->memory_bytes;
    info->max_rss_kb = h->max_rss_kb;
    info->idle_since = (double)h->idle_since_ms / 1e3;
    info->bytes = bytes;
}

/* Why |h| is not an image of this directory's build (NULL: it is one). */
static const char *head_problem(const struct state_dir *d, const struct head *h)
{
    if (memcmp(h->magic, HEAD_MAGIC, sizeof(h->magic)) != 0 || h->version != HEAD_VERSION ||
        h->name_len < 1 || h->name_len > SESSION_NAME_MAX ||
        memchr(h->name, '\0', h->name_len) != NULL)
        return "it is not a session's image of this version (its head is unreadable)";
    if (memcmp(h->build, d->build, sizeof(d->build)) != 0)
        return "it was made by another build of pysbx (another version, or this one rebuilt, "
               "or other --packages or --module-dir)";
    return NULL;
}

/* |h|'s name as a string (SESSION_NAME_MAX + 1 bytes). */
static void head_name(const struct head *h, char *out)
{
    memcpy(out, h->name, h->name_len);
    out[h->name_len] = '\0';
}

/* --- writing an image ----------------------------------------------------------- */

/* The copy of an image from the pipe the library writes it to into its
 * file, signing it as it goes: the image is never read back. */
struct copy {
    struct state_dir *d;
    int from, to;
    struct mac *mac;
    char *buf;
    uint64_t bytes, reserved;
    int rc; /* the first failure; past it, what comes is read and thrown away */
};

static void *copy_main(void *p)
{
    struct copy *c = p;

    for (;;) {
        ssize_t n = read(c->from, c->buf, COPY_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n < 0 && !c->rc)
                c->rc = -errno;
            break;
        }
        /* Read to the end whatever happens: the library's writer must not
         * be left blocked on a full pipe. */
        if (c->rc)
            continue;
        if ((c->rc = reserve(c->d, c->reserved, (uint64_t)n)) < 0)
            continue;
        c->reserved += (uint64_t)n;
        mac_update(c->mac, c->buf, (size_t)n);
        c->rc = write_full(c->to, c->buf, (size_t)n);
        c->bytes += (uint64_t)n;
    }
    return NULL;
}

static int write_image(struct state_dir *d, const uint8_t *tenant, const struct state_session *info,
                       const char *hex,
                       int (*save)(struct sbx_session *s, int fd, struct sbx_error *err),
                       struct sbx_session *s, uint64_t *bytes, uint64_t *ticket,
                       struct sbx_error *err);

/* Claims |w|'s name for one writer. Returns whether it was free. */
static bool claim(struct state_dir *d, struct writing *w)
{
    bool free_ = true;

    pthread_mutex_lock(&d->lock);
    for (struct writing *o = d->writing; o && free_; o = o->next)
        free_ = strcmp(o->hex, w->hex) != 0;
    if (free_) {
        w->next = d->writing;
        d->writing = w;
    }
    pthread_mutex_unlock(&d->lock);
    return free_;
}

static void unclaim(struct state_dir *d, struct writing *w)
{
    pthread_mutex_lock(&d->lock);
    for (struct writing **pp = &d->writing; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    pthread_mutex_unlock(&d->lock);
}

int state_dir_save(struct state_dir *d, const uint8_t *tenant, const struct state_session *info,
                   int (*save)(struct sbx_session *s, int fd, struct sbx_error *err),
                   struct sbx_session *s, uint64_t *bytes, uint64_t *ticket, struct sbx_error *err)
{
    struct writing w = {0};

    *ticket = 0;
    if (file_hex(d, tenant, info->name, w.hex) < 0)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
    /* Two writers of one name (a session closed while its image was being
     * written, and a new one of the name hibernated meanwhile) would
     * write one file. */
    if (!claim(d, &w))
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, -EBUSY,
                        "another image of session \"%s\" is being written", info->name);
    int rc = write_image(d, tenant, info, w.hex, save, s, bytes, ticket, err);
    unclaim(d, &w);
    return rc;
}

static int write_image(struct state_dir *d, const uint8_t *tenant, const struct state_session *info,
                       const char *hex,
                       int (*save)(struct sbx_session *s, int fd, struct sbx_error *err),
                       struct sbx_session *s, uint64_t *bytes, uint64_t *ticket,
                       struct sbx_error *err)
{
    struct head head;
    struct tail tail;
    struct copy c = {.d = d, .from = -1, .to = -1};
    char tmp[HEX_LEN + 8], final[HEX_LEN + 8];
    int pipefd[2] = {-1, -1};
    bool created = false, renamed = false;
    pthread_t copier;
    int rc;

    *bytes = 0;
    memset(&head, 0, sizeof(head));
    memset(&tail, 0, sizeof(tail));
    memcpy(head.magic, HEAD_MAGIC, sizeof(head.magic));
    head.version = HEAD_VERSION;
    head.name_len = (uint32_t)strlen(info->name);
    memcpy(head.build, d->build, sizeof(head.build));
    memcpy(head.tenant, tenant, STATE_TENANT_BYTES);
    fmt(head.pysbx_version, sizeof(head.pysbx_version), "%s", PYSBX_VERSION);
    head.written_ms = wall_ms();
    head.idle_since_ms = (uint64_t)(info->idle_since * 1e3);
    head.cells = info->cells;
    head.memory_bytes = info->memory_bytes;
    head.max_rss_kb = info->max_rss_kb;
    memcpy(head.name, info->name, head.name_len);
    fmt(tmp, sizeof(tmp), "%s.new", hex);
    fmt(final, sizeof(final), "%s.img", hex);

    /* Its head and tail count against the cap as its pages do. */
    if ((rc = reserve(d, 0, sizeof(head) + sizeof(tail))) < 0) {
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, rc,
                      "the state directory has no room: other images being written take "
                      "--state-max-bytes (%llu bytes)",
                      (unsigned long long)d->max_bytes);
        goto out_unreserved;
    }
    c.reserved = sizeof(head) + sizeof(tail);
    (void)unlinkat(d->images_fd, tmp, 0);
    c.to = openat(d->images_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    created = c.to >= 0;
    int e = created ? 0 : errno;
    if (!e && !(c.buf = malloc(COPY_CHUNK)))
        e = ENOMEM;
    if (!e && !(c.mac = mac_begin(d->key, DOMAIN_IMAGE)))
        e = ENOMEM;
    if (!e && pipe2(pipefd, O_CLOEXEC) < 0)
        e = errno;
    if (e) {
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, -e, "writing an image in the state directory: %s",
                      strerror(e));
        goto out;
    }
    (void)fcntl(pipefd[1], F_SETPIPE_SZ, COPY_CHUNK);
    mac_update(c.mac, &head, sizeof(head));
    if ((rc = write_full(c.to, &head, sizeof(head))) < 0) {
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "writing an image in the state directory: %s",
                      strerror(-rc));
        goto out;
    }
    c.from = pipefd[0];
    if ((rc = -pthread_create(&copier, NULL, copy_main, &c)) < 0) {
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "cannot start a thread");
        goto out;
    }
    rc = save(s, pipefd[1], err);
    close_fd(&pipefd[1]); /* the copier's end of input */
    pthread_join(copier, NULL);
    if (rc < 0)
        goto out;
    if (c.rc == -EFBIG || c.rc == -EAGAIN)
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, c.rc, "the session's image is %s (%llu bytes)",
                      c.rc == -EFBIG ? "larger than --state-max-bytes"
                                     : "more than other images being written leave of "
                                       "--state-max-bytes",
                      (unsigned long long)d->max_bytes);
    else if (c.rc < 0)
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, c.rc, "writing an image in the state directory: %s",
                      strerror(-c.rc));
    if (c.rc < 0)
        goto out;
    tail.image_bytes = c.bytes;
    mac_update(c.mac, &tail.image_bytes, sizeof(tail.image_bytes));
    rc = mac_end(c.mac, tail.tag);
    c.mac = NULL;
    if (rc == 0)
        rc = write_full(c.to, &tail, sizeof(tail));
    if (rc == 0 && close(c.to) < 0)
        rc = -errno;
    c.to = -1;
    if (rc < 0) {
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "writing an image in the state directory: %s",
                      strerror(-rc));
        goto out;
    }
    /* Whole: it takes its place among the images, the oldest making room,
     * then its name. */
    struct held *h = calloc(1, sizeof(*h));
    uint64_t size = sizeof(head) + c.bytes + sizeof(tail);
    pthread_mutex_lock(&d->lock);
    d->reserved -= c.reserved;
    c.reserved = 0;
    struct held *old = find_held(d, hex);
    if (old)
        forget(d, old); /* a tombstone: its file is removed below */
    rc = h ? make_room(d, size) : -ENOMEM;
    if (rc == 0) {
        memcpy(h->hex, hex, sizeof(h->hex));
        memcpy(h->tenant, tenant, STATE_TENANT_BYTES);
        h->at_ms = head.written_ms;
        info_of_head(&head, size, &h->info);
        add_held(d, h);
        *bytes = size;
        *ticket = h->ticket;
        h = NULL;
    }
    pthread_mutex_unlock(&d->lock);
    free(h);
    if (old) {
        char lost[HEX_LEN + 8];
        fmt(lost, sizeof(lost), "%s.lost", hex);
        (void)unlinkat(d->images_fd, lost, 0);
    }
    if (rc == 0 && renameat(d->images_fd, tmp, d->images_fd, final) < 0) {
        rc = -errno;
        state_dir_release(d, *ticket, false);
        *ticket = 0;
        *bytes = 0;
    }
    if (rc < 0) {
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "writing an image in the state directory: %s",
                      rc == -EFBIG ? "images being restored take the room" : strerror(-rc));
        goto out;
    }
    renamed = true;
out:
    if (c.reserved)
        unreserve(d, c.reserved);
out_unreserved:
    if (created && !renamed)
        (void)unlinkat(d->images_fd, tmp, 0);
    close_fd(&c.to);
    close_fds(pipefd, 2);
    mac_abandon(c.mac);
    free(c.buf);
    return rc;
}

/* --- reading an image ----------------------------------------------------------- */

/* Why the image on |fd| (|size| bytes; its head in |h|, read) is not
 * |tenant|'s |name| or fails its MAC; NULL when it passes. Reads all of
 * it, |buf| (COPY_CHUNK) at a time. */
static const char *check_image(struct state_dir *d, int fd, uint64_t size, const struct head *h,
                               const uint8_t *tenant, const char *name, char *buf)
{
    const char *why = head_problem(d, h);
    char hname[SESSION_NAME_MAX + 1];
    struct tail tail;

    if (why)
        return why;
    if (memcmp(h->tenant, tenant, STATE_TENANT_BYTES) != 0)
        return "it is not this tenant's (another tenant's, or signed with another key)";
    head_name(h, hname);
    if (strcmp(hname, name) != 0)
        return "it is another session's";
    if (size < sizeof(*h) + sizeof(tail))
        return "it failed its check (cut short)";
    struct mac *m = mac_begin(d->key, DOMAIN_IMAGE);
    if (!m)
        return "out of memory";
    uint64_t image = size - sizeof(*h) - sizeof(tail);
    mac_update(m, h, sizeof(*h));
    for (uint64_t done = 0; done < image;) {
        size_t want = image - done < COPY_CHUNK ? (size_t)(image - done) : COPY_CHUNK;
        ssize_t got = read_full(fd, buf, want);
        if (got != (ssize_t)want) {
            mac_abandon(m);
            return "it failed its check (cut short, or unreadable)";
        }
        mac_update(m, buf, want);
        done += want;
    }
    uint8_t tag[MAC_BYTES];
    if (read_full(fd, &tail, sizeof(tail)) != (ssize_t)sizeof(tail)) {
        mac_abandon(m);
        return "it failed its check (cut short, or unreadable)";
    }
    mac_update(m, &tail.image_bytes, sizeof(tail.image_bytes));
    if (mac_end(m, tag) < 0)
        return "out of memory";
    if (!mac_equal(tag, tail.tag) || tail.image_bytes != image)
        return "it failed its check (changed, cut short, or signed with another key)";
    return NULL;
}

int state_dir_take(struct state_dir *d, const uint8_t *tenant, const char *name,
                   struct state_session *info, uint64_t *ticket, struct sbx_error *err)
{
    char hex[HEX_LEN + 1], file[HEX_LEN + 8];
    const char *why = NULL;
    struct head head;
    struct stat st;
    char *buf = NULL;
    int fd = -1, rc;

    *ticket = 0;
    if ((rc = file_hex(d, tenant, name, hex)) < 0)
        return sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "out of memory");
    pthread_mutex_lock(&d->lock);
    struct held *h = find_held(d, hex);
    if (h && !h->lost) {
        h->pinned = true;
        *ticket = h->ticket;
    }
    pthread_mutex_unlock(&d->lock);
    if (!*ticket)
        return -ENOENT;
    fmt(file, sizeof(file), "%s.img", hex);
    fd = openat(d->images_fd, file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (!(buf = malloc(COPY_CHUNK)))
        why = "out of memory";
    else if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
        why = "its file could not be read";
    else if ((uint64_t)st.st_size > d->max_bytes)
        why = "it is larger than the state directory may hold";
    else if (read_full(fd, &head, sizeof(head)) != (ssize_t)sizeof(head))
        why = "it failed its check (cut short)";
    else
        why = check_image(d, fd, (uint64_t)st.st_size, &head, tenant, name, buf);
    if (!why && lseek(fd, (off_t)sizeof(head), SEEK_SET) < 0)
        why = "its file could not be read";
    free(buf);
    if (why) {
        close_fd(&fd);
        fprintf(stderr,
                "pysbx serve: an image in the state directory was refused and removed "
                "(%s): %s\n",
                file, why);
        state_dir_release(d, *ticket, false);
        *ticket = 0;
        return sbx_fail(err, SBX_ERR_SESSION_LOST, -EBADMSG,
                        "the image of session \"%s\" was refused and removed: %s", name, why);
    }
    info_of_head(&head, (uint64_t)st.st_size, info);
    return fd;
}

void state_dir_release(struct state_dir *d, uint64_t ticket, bool keep)
{
    pthread_mutex_lock(&d->lock);
    struct held *h = d->held;
    while (h && h->ticket != ticket)
        h = h->next;
    if (h && keep)
        h->pinned = false;
    else if (h) {
        unlink_held(d, h);
        forget(d, h);
    }
    pthread_mutex_unlock(&d->lock);
}

enum state_kind state_dir_find(struct state_dir *d, const uint8_t *tenant, const char *name,
                               struct state_session *info, char *why, size_t cap)
{
    char hex[HEX_LEN + 1], file[HEX_LEN + 8], text[LOST_MAX_BYTES + 1];
    enum state_kind kind = STATE_NONE;

    if (file_hex(d, tenant, name, hex) < 0)
        return STATE_NONE;
    pthread_mutex_lock(&d->lock);
    struct held *h = find_held(d, hex);
    if (h && !h->lost) {
        kind = STATE_IMAGE;
        *info = h->info;
    } else if (h)
        kind = STATE_LOST;
    pthread_mutex_unlock(&d->lock);
    if (kind != STATE_LOST || !why || !cap)
        return kind;
    /* A tombstone's words, from its file (a few hundred bytes). */
    fmt(file, sizeof(file), "%s.lost", hex);
    fmt(why, cap, "its image is gone from the state directory");
    int fd = openat(d->images_fd, file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read_full(fd, text, LOST_MAX_BYTES) : -1;
    if (fd >= 0)
        close(fd);
    size_t m = strlen(LOST_MAGIC);
    if (n > (ssize_t)m && memcmp(text, LOST_MAGIC, m) == 0) {
        text[n] = '\0';
        utf8_terminate(text + m);
        fmt(why, cap, "%s", text + m);
    }
    return kind;
}

bool state_dir_drop(struct state_dir *d, const uint8_t *tenant, const char *name)
{
    char hex[HEX_LEN + 1];

    if (file_hex(d, tenant, name, hex) < 0)
        return false;
    pthread_mutex_lock(&d->lock);
    struct held *h = find_held(d, hex);
    if (h) {
        unlink_held(d, h);
        forget(d, h);
    }
    pthread_mutex_unlock(&d->lock);
    return h != NULL;
}

void state_dir_bury(struct state_dir *d, const uint8_t *tenant, const char *name, const char *why)
{
    char hex[HEX_LEN + 1];

    if (file_hex(d, tenant, name, hex) < 0)
        return;
    pthread_mutex_lock(&d->lock);
    bury(d, hex, why);
    pthread_mutex_unlock(&d->lock);
}

size_t state_dir_list(struct state_dir *d, const uint8_t *tenant, struct state_session *out,
                      size_t cap)
{
    size_t n = 0;

    pthread_mutex_lock(&d->lock);
    for (const struct held *h = d->held; h; h = h->next)
        if (!h->lost && memcmp(h->tenant, tenant, STATE_TENANT_BYTES) == 0) {
            if (n < cap)
                out[n] = h->info;
            n++;
        }
    pthread_mutex_unlock(&d->lock);
    return n;
}

void state_dir_totals(struct state_dir *d, uint64_t *images, uint64_t *bytes)
{
    pthread_mutex_lock(&d->lock);
    *images = d->images;
    *bytes = d->total;
    pthread_mutex_unlock(&d->lock);
}

/* --- opening ---------------------------------------------------------------------- */

/* Whether |name| is HEX followed by |suffix|; HEX into |hex|. */
static bool hex_named(const char *name, const char *suffix, char *hex)
{
    size_t n = strlen(name);

    if (n != HEX_LEN + strlen(suffix) || strcmp(name + HEX_LEN, suffix) != 0)
        return false;
    for (size_t i = 0; i < HEX_LEN; i++)
        if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
            return false;
    memcpy(hex, name, HEX_LEN);
    hex[HEX_LEN] = '\0';
    return true;
}

/* One entry of images/ at start. Under no lock: nothing else runs yet. */
static void index_one(struct state_dir *d, const char *name)
{
    char hex[HEX_LEN + 1], want[HEX_LEN + 1], hname[SESSION_NAME_MAX + 1];
    struct head head;
    struct stat st;
    struct held *h;

    if (hex_named(name, ".lost", hex)) {
        if (fstatat(d->images_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
            find_held(d, hex) || !(h = calloc(1, sizeof(*h))))
            return;
        memcpy(h->hex, hex, sizeof(h->hex));
        h->lost = true;
        h->at_ms = (uint64_t)st.st_mtim.tv_sec * 1000 + (uint64_t)st.st_mtim.tv_nsec / 1000000;
        add_held(d, h);
        return;
    }
    if (!hex_named(name, ".img", hex)) {
        /* An image cut short by a crash while it was written. */
        if (hex_named(name, ".new", hex))
            (void)unlinkat(d->images_fd, name, 0);
        return;
    }
    int fd = openat(d->images_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    const char *why = NULL;
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
        read_full(fd, &head, sizeof(head)) != (ssize_t)sizeof(head))
        why = "it is not a session's image (unreadable)";
    else
        why = head_problem(d, &head);
    if (fd >= 0)
        close(fd);
    if (!why) {
        head_name(&head, hname);
        if (file_hex(d, head.tenant, hname, want) < 0 || strcmp(want, hex) != 0)
            why = "it is another session's (its file was moved)";
    }
    if (why || !(h = calloc(1, sizeof(*h)))) {
        char text[LOST_MAX_BYTES];
        fmt(text, sizeof(text), "its image was refused and removed: %s",
            why ? why : "out of memory");
        fprintf(stderr, "pysbx serve: %s in the state directory: %s\n", name, text);
        (void)unlinkat(d->images_fd, name, 0);
        bury(d, hex, text);
        return;
    }
    struct held *old = find_held(d, hex);
    if (old) { /* a tombstone the image was written over */
        unlink_held(d, old);
        forget(d, old);
    }
    memcpy(h->hex, hex, sizeof(h->hex));
    memcpy(h->tenant, head.tenant, STATE_TENANT_BYTES);
    h->at_ms = head.written_ms;
    info_of_head(&head, (uint64_t)st.st_size, &h->info);
    add_held(d, h);
}

static int index_images(struct state_dir *d, char *why, size_t cap)
{
    int dfd = dup(d->images_fd);
    DIR *dir = dfd >= 0 ? fdopendir(dfd) : NULL;
    struct dirent *e;

    if (!dir) {
        int rc = -errno;
        close_fd(&dfd);
        return errmsg(why, cap, rc, "reading the state directory: %s", strerror(-rc));
    }
    while ((e = readdir(dir)))
        if (e->d_name[0] != '.')
            index_one(d, e->d_name);
    closedir(dir);
    /* A cap lowered since the images were written: the oldest go now. */
    struct held *h;
    while (d->total > d->max_bytes && (h = oldest(d, false)))
        bury(d, h->hex,
             "its image was dropped: the state directory was past --state-max-bytes when "
             "the server started, and it was the oldest");
    return 0;
}

/* Adds the contents of |path| to |m|. Returns 0 or -errno. */
static int mac_file(struct mac *m, const char *path, char *buf)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n;

    if (fd < 0)
        return -errno;
    while ((n = read(fd, buf, COPY_CHUNK)) > 0)
        mac_update(m, buf, (size_t)n);
    int rc = n < 0 ? -errno : 0;
    close(fd);
    return rc;
}

/* The build images are bound to: this version, the bytes of this program,
 * of the library and of the template, and the packages and module
 * directories the template loads. Under a key everyone knows (a hash). */
static int build_id(const struct state_dir_config *c, uint8_t out[MAC_BYTES], char *why, size_t cap)
{
    static const uint8_t public_key[MAC_KEY_BYTES];
    struct mac_key *k = NULL;
    struct mac *m = NULL;
    Dl_info lib = {0};
    char *buf = malloc(COPY_CHUNK);
    int rc = buf ? mac_key_new(public_key, &k, why, cap) : -ENOMEM;

    if (rc == 0 && !(m = mac_begin(k, DOMAIN_BUILD)))
        rc = -ENOMEM;
    if (rc == -ENOMEM)
        fmt(why, cap, "out of memory");
    if (rc < 0)
        goto out;
    mac_update(m, PYSBX_VERSION, sizeof(PYSBX_VERSION));
    const char *files[] = {
        "/proc/self/exe",
        dladdr((void *)sbx_session_restore, &lib) && lib.dli_fname ? lib.dli_fname : NULL,
        c->template_path};
    for (size_t i = 0; i < ARRAY_SIZE(files); i++)
        if (files[i] && (rc = mac_file(m, files[i], buf)) < 0) {
            errmsg(why, cap, rc, "reading %s, which images are bound to: %s", files[i],
                   strerror(-rc));
            goto out;
        }
    for (size_t i = 0; c->packages && c->packages[i]; i++)
        mac_update(m, c->packages[i], strlen(c->packages[i]) + 1);
    mac_update(m, "", 1);
    for (size_t i = 0; c->module_dirs && c->module_dirs[i]; i++)
        mac_update(m, c->module_dirs[i], strlen(c->module_dirs[i]) + 1);
    rc = mac_end(m, out);
    m = NULL;
    if (rc < 0)
        fmt(why, cap, "out of memory");
out:
    mac_abandon(m);
    mac_key_free(k);
    free(buf);
    return rc;
}

/* DIR/key: read, or made (32 random bytes, 0600). A key another user
 * could read is refused: images signed with it prove nothing. */
static int load_key(int dir_fd, uint8_t key[MAC_KEY_BYTES], char *why, size_t cap)
{
    struct stat st;
    int fd = openat(dir_fd, "key", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    int rc = 0;

    if (fd < 0 && errno == ENOENT) {
        /* Written whole under another name, then linked into place. */
        uint8_t fresh[MAC_KEY_BYTES];
        (void)unlinkat(dir_fd, "key.new", 0);
        int nfd =
            openat(dir_fd, "key.new", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (nfd < 0 || getrandom(fresh, sizeof(fresh), 0) != (ssize_t)sizeof(fresh) ||
            (rc = write_full(nfd, fresh, sizeof(fresh))) < 0 || fsync(nfd) < 0 ||
            linkat(dir_fd, "key.new", dir_fd, "key", 0) < 0)
            rc = rc ? rc : -errno;
        if (nfd >= 0)
            close(nfd);
        (void)unlinkat(dir_fd, "key.new", 0);
        if (rc < 0)
            return errmsg(why, cap, rc, "making the state directory's key: %s", strerror(-rc));
        fd = openat(dir_fd, "key", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (fd < 0)
        return errmsg(why, cap, -errno, "reading the state directory's key: %s", strerror(errno));
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size != MAC_KEY_BYTES)
        rc = errmsg(why, cap, -EINVAL, "the state directory's key is not %d bytes", MAC_KEY_BYTES);
    else if (st.st_uid != geteuid() || (st.st_mode & 077))
        rc = errmsg(why, cap, -EPERM,
                    "the state directory's key is not this user's alone (mode %04o, owner %u): "
                    "refused",
                    (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
    else if (read_full(fd, key, MAC_KEY_BYTES) != MAC_KEY_BYTES)
        rc = errmsg(why, cap, -EIO, "reading the state directory's key: %s", strerror(errno));
    close(fd);
    return rc;
}

/* |name| beneath |parent| (|parent| -1: a path), made 0700 if missing; it
 * must be a directory of this user's, and is made 0700 if it was not.
 * Returns its descriptor or -errno with why (which names it as |what|). */
static int own_dir(int parent, const char *name, const char *what, char *why, size_t cap)
{
    struct stat st;
    int fd;

    if ((parent < 0 ? mkdir(name, 0700) : mkdirat(parent, name, 0700)) < 0 && errno != EEXIST)
        return errmsg(why, cap, -errno, "%s: %s", what, strerror(errno));
    fd = parent < 0 ? open(name, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                    : openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errmsg(why, cap, -errno, "%s: %s", what, strerror(errno));
    if (fstat(fd, &st) < 0 || st.st_uid != geteuid()) {
        close(fd);
        return errmsg(why, cap, -EPERM, "%s is not this user's", what);
    }
    if ((st.st_mode & 077) && fchmod(fd, 0700) < 0) {
        int rc = -errno;
        close(fd);
        return errmsg(why, cap, rc, "%s: making it 0700: %s", what, strerror(-rc));
    }
    return fd;
}

int state_dir_open(const struct state_dir_config *c, struct state_dir **out, char *why, size_t cap)
{
    struct state_dir *d = calloc(1, sizeof(*d));
    uint8_t key[MAC_KEY_BYTES];
    int rc;

    *out = NULL;
    if (!d)
        return errmsg(why, cap, -ENOMEM, "out of memory");
    d->dir_fd = d->images_fd = d->lock_fd = -1;
    d->max_bytes = c->max_bytes;
    pthread_mutex_init(&d->lock, NULL);
    if ((rc = d->dir_fd = own_dir(-1, c->path, "the directory", why, cap)) < 0)
        goto fail;
    d->lock_fd = openat(d->dir_fd, "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (d->lock_fd < 0 || flock(d->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
        errmsg(why, cap, rc, "%s",
               rc == -EBUSY ? "another server uses this state directory" : strerror(-rc));
        goto fail;
    }
    if ((rc = load_key(d->dir_fd, key, why, cap)) < 0 ||
        (rc = mac_key_new(key, &d->key, why, cap)) < 0 ||
        (rc = build_id(c, d->build, why, cap)) < 0)
        goto fail;
    if ((rc = d->images_fd = own_dir(d->dir_fd, "images", "its images/", why, cap)) < 0 ||
        (rc = index_images(d, why, cap)) < 0)
        goto fail;
    explicit_bzero(key, sizeof(key));
    *out = d;
    return 0;
fail:
    explicit_bzero(key, sizeof(key));
    state_dir_close(d);
    return rc;
}

void state_dir_close(struct state_dir *d)
{
    if (!d)
        return;
    while (d->held) {
        struct held *h = d->held;
        d->held = h->next;
        free(h);
    }
    mac_key_free(d->key);
    close_fd(&d->images_fd);
    close_fd(&d->lock_fd); /* the lock goes with it */
    close_fd(&d->dir_fd);
    pthread_mutex_destroy(&d->lock);
    free(d);
}
