/*
 * The kept resolutions and font lists of package sets (pkgcache.h). Each
 * entry's name carries two hashes: of dpkg's database as it stands and of
 * the rest of its key. An entry of another database is stale; the next
 * store removes it. A resolution file holds its whole key on its first
 * line and "end" on its last, so a collision or a cut file is not used.
 */
#define _GNU_SOURCE
#include "pkgcache.h"

#include "sysutil.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DPKG_STATUS "/var/lib/dpkg/status"
#define KEY_MAX     4096
/* A resolution is a few KiB; anything much larger is not ours. */
#define FILE_MAX (1u << 20)

struct key {
    char dpkg[160]; /* dpkg's database and this library's version */
    char full[KEY_MAX];
    char stem[64]; /* "<hash of dpkg>-<hash of full>" */
};

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;

    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static int make_key(const char *const *names, struct key *k)
{
    struct stat st;
    size_t n;

    if (stat(DPKG_STATUS, &st) < 0)
        return -errno;
    fmt(k->dpkg, sizeof(k->dpkg), "pysbx %s dpkg %ju:%ju:%jd:%jd.%09ld", PYSBX_VERSION,
        (uintmax_t)st.st_dev, (uintmax_t)st.st_ino, (intmax_t)st.st_size,
        (intmax_t)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    n = (size_t)snprintf(k->full, sizeof(k->full), "%s packages", k->dpkg);
    for (; *names && n < sizeof(k->full); names++)
        n += (size_t)snprintf(k->full + n, sizeof(k->full) - n, " %s", *names);
    if (n >= sizeof(k->full))
        return -ENAMETOOLONG;
    fmt(k->stem, sizeof(k->stem), "%016" PRIx64 "-%016" PRIx64, fnv1a(k->dpkg), fnv1a(k->full));
    return 0;
}

/* Whether |fd| is the caller's and writable by it alone. */
static bool private_to_us(int fd, mode_t type)
{
    struct stat st;

    return fstat(fd, &st) == 0 && (st.st_mode & S_IFMT) == type && st.st_uid == geteuid() &&
           !(st.st_mode & 022);
}

/* Whether no one but the caller and root can change what |path| (absolute,
 * without links) names: each directory from it up to / is theirs and
 * writable by no one else, unless sticky (/tmp), as ssh checks. Else another
 * user could swap a directory of the path, between this library's checks
 * and the template's use of the path, for one of theirs. */
static bool secure_chain(const char *path)
{
    char p[PATH_MAX];
    struct stat st;

    fmt(p, sizeof(p), "%s", path);
    for (;;) {
        if (lstat(p, &st) < 0 || !S_ISDIR(st.st_mode) ||
            (st.st_uid != 0 && st.st_uid != geteuid()) ||
            ((st.st_mode & 022) && !(st.st_mode & S_ISVTX)))
            return false;
        char *slash = strrchr(p, '/');
        if (!slash || (slash == p && !p[1]))
            return slash != NULL;
        slash[slash == p] = '\0'; /* "/a" -> "/", "/a/b" -> "/a" */
    }
}

/* The cache directory, made if missing: its descriptor (and its path, with
 * no link in it, in |path|), or -errno. */
static int cache_dir(char *path, size_t cap)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char given[PATH_MAX], base[PATH_MAX];
    int b, d, rc;

    if (xdg && xdg[0] == '/')
        fmt(given, sizeof(given), "%s", xdg);
    else if (home && home[0] == '/')
        fmt(given, sizeof(given), "%s/.cache", home);
    else
        return -ENOENT;
    if (mkdir(given, 0700) < 0 && errno != EEXIST)
        return -errno;
    if (!realpath(given, base))
        return -errno;
    if (!secure_chain(base))
        return -EPERM;
    b = open(base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (b < 0)
        return -errno;
    rc = mkdirat(b, "pysbx", 0700) < 0 && errno != EEXIST ? -errno : 0;
    d = rc == 0 ? openat(b, "pysbx", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
    if (rc == 0 && d < 0)
        rc = -errno;
    close(b);
    if (rc == 0 && !private_to_us(d, S_IFDIR))
        rc = -EPERM;
    if (rc < 0) {
        close_fd(&d);
        return rc;
    }
    fmt(path, cap, "%s/pysbx", base);
    return d;
}

static char *read_small(int dir, const char *name)
{
    int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    char *buf = NULL;
    size_t n = 0;

    if (fd < 0)
        return NULL;
    if (!private_to_us(fd, S_IFREG) || fstat(fd, &st) < 0 || st.st_size > (off_t)FILE_MAX ||
        !(buf = malloc((size_t)st.st_size + 1)))
        goto out;
    while (n < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + n, (size_t)st.st_size - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    if (n != (size_t)st.st_size) {
        free(buf);
        buf = NULL;
        goto out;
    }
    buf[n] = '\0';
out:
    close(fd);
    return buf;
}

/* The lines of |text| that start with "|tag| ", as a NULL-terminated copy. */
static char **lines_of(const char *text, char tag)
{
    size_t n = 0, i = 0;
    char **v;

    for (const char *l = text; *l; l += strcspn(l, "\n") + (l[strcspn(l, "\n")] != '\0'))
        n += l[0] == tag && l[1] == ' ';
    v = calloc(n + 1, sizeof(*v));
    for (const char *l = text; v && *l; l += strcspn(l, "\n") + (l[strcspn(l, "\n")] != '\0')) {
        if (l[0] != tag || l[1] != ' ')
            continue;
        v[i] = strndup(l + 2, strcspn(l, "\n") - 2);
        if (!v[i++]) {
            for (size_t j = 0; j < i; j++)
                free(v[j]);
            free(v);
            return NULL;
        }
    }
    return v;
}

static size_t count(char *const *v)
{
    size_t n = 0;

    while (v && v[n])
        n++;
    return n;
}

int pkgcache_load(const char *const *names, struct packages *out)
{
    char path[PATH_MAX], file[96];
    struct key k;
    struct packages p = {0};
    char *text = NULL;
    int dir, rc;

    if ((rc = make_key(names, &k)) < 0)
        return rc;
    if ((dir = cache_dir(path, sizeof(path))) < 0)
        return dir;
    fmt(file, sizeof(file), "packages-%s", k.stem);
    text = read_small(dir, file);
    close(dir);
    size_t kl = strlen(k.full), tl = text ? strlen(text) : 0;
    /* The whole key first, every line whole, "end" last. */
    if (!text || strncmp(text, k.full, kl) != 0 || text[kl] != '\n' || tl < kl + 5 ||
        strcmp(text + tl - 5, "\nend\n") != 0) {
        free(text);
        return -ENOENT;
    }
    text[tl - 4] = '\0';
    p.modules = lines_of(text + kl + 1, 'm');
    p.places = lines_of(text + kl + 1, 'p');
    p.links = lines_of(text + kl + 1, 'l');
    free(text);
    bool ok = p.modules && p.places && p.links && p.modules[0] && count(p.links) % 2 == 0;
    for (size_t i = 0; ok && p.places[i]; i++)
        ok = p.places[i][0] == '/';
    for (size_t i = 0; ok && p.links[i]; i++)
        ok = p.links[i][0] == '/';
    if (!ok) {
        packages_free(&p);
        return -EINVAL;
    }
    *out = p;
    return 0;
}

/* Removes the entries of other dpkg databases than |k|'s. */
static void prune(int dir, const struct key *k)
{
    int fd = fcntl(dir, F_DUPFD_CLOEXEC, 0);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    struct dirent *e;
    char ours[24];

    if (!d) {
        close_fd(&fd);
        return;
    }
    fmt(ours, sizeof(ours), "%.16s", k->stem);
    while ((e = readdir(d))) {
        const char *h = !strncmp(e->d_name, "packages-", 9) ? e->d_name + 9
                        : !strncmp(e->d_name, "fonts-", 6)  ? e->d_name + 6
                                                            : NULL;
        if (h && strncmp(h, ours, 16) != 0)
            (void)remove_tree_at(dir, e->d_name);
    }
    closedir(d);
}

static bool put_lines(FILE *f, char tag, char *const *v)
{
    for (; v && *v; v++)
        if (strchr(*v, '\n') || fprintf(f, "%c %s\n", tag, *v) < 0)
            return false;
    return true;
}

void pkgcache_store(const char *const *names, const struct packages *p)
{
    char path[PATH_MAX], file[96], tmp[128];
    struct key k;
    int dir, fd;
    FILE *f;

    if (make_key(names, &k) < 0 || (dir = cache_dir(path, sizeof(path))) < 0)
        return;
    prune(dir, &k);
    fmt(file, sizeof(file), "packages-%s", k.stem);
    fmt(tmp, sizeof(tmp), ".%s.%ld", file, (long)getpid());
    fd = openat(dir, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        close_fd(&fd);
        close(dir);
        return;
    }
    bool ok = fprintf(f, "%s\n", k.full) > 0 && put_lines(f, 'm', p->modules) &&
              put_lines(f, 'p', p->places) && put_lines(f, 'l', p->links) && fputs("end\n", f) >= 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || renameat(dir, tmp, dir, file) < 0)
        unlinkat(dir, tmp, 0);
    close(dir);
}

char *pkgcache_font_dir(const char *const *names)
{
    char path[PATH_MAX], file[96], *out = NULL;
    struct key k;
    int dir, fd = -1;

    if (make_key(names, &k) < 0 || (dir = cache_dir(path, sizeof(path))) < 0)
        return NULL;
    fmt(file, sizeof(file), "fonts-%s", k.stem);
    if (mkdirat(dir, file, 0700) == 0 || errno == EEXIST)
        fd = openat(dir, file, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0 && private_to_us(fd, S_IFDIR) && asprintf(&out, "%s/%s", path, file) < 0)
        out = NULL;
    close_fd(&fd);
    close(dir);
    return out;
}
