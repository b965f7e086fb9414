/*
 * Resolving sbx_config.packages. Debian's installed Python metadata leaves
 * most requirements out (pandas' lists no numpy), so the dependencies that
 * hold are the Debian packages' own: dpkg-query gives every installed
 * package with its relations in one call, and the files of the closure in
 * a second. Only the places those files name become visible to a worker.
 */
#define _GNU_SOURCE
#include "packages.h"

#include "pkgcache.h"
#include "sbxerr.h"
#include "sysutil.h"
#include "util.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define DPKG_QUERY "/usr/bin/dpkg-query"
/* What dpkg-query may print before we stop reading: the whole database of a
 * large system is a few MiB. */
#define CAPTURE_MAX  (64u << 20)
#define NAME_MAX_LEN 64
/* Places beyond this are a package set too large to confine cheaply (each
 * is a bind mount and a Landlock rule). */
#define PLACES_MAX      192
#define OWNED_DEPTH_MAX 16

struct strv {
    char **v;
    size_t n, cap;
};

static int strv_push(struct strv *s, const char *text, size_t len)
{
    if (s->n + 2 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        char **v = realloc(s->v, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        s->v = v;
        s->cap = cap;
    }
    if (!(s->v[s->n] = strndup(text, len)))
        return -ENOMEM;
    s->v[++s->n] = NULL;
    return 0;
}

static bool strv_has(const struct strv *s, const char *text)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->v[i], text) == 0)
            return true;
    return false;
}

static void strv_free(struct strv *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
    *s = (struct strv){0};
}

/* Runs |argv| (an absolute path, no shell) with an empty environment but a
 * C locale, and returns what it printed on stdout. */
static int capture(char *const argv[], char **out, size_t *len)
{
    static char *const env[] = {"LC_ALL=C", "PATH=/usr/bin:/bin", NULL};
    posix_spawn_file_actions_t fa;
    int p[2] = {-1, -1};
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    pid_t pid = -1;
    int rc = 0, status;

    if (!buf || pipe2(p, O_CLOEXEC) < 0) {
        free(buf);
        return buf ? -errno : -ENOMEM;
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    rc = -posix_spawn(&pid, argv[0], &fa, NULL, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    close_fd(&p[1]);
    while (rc == 0) {
        if (n + 1 >= cap) {
            char *b = cap < CAPTURE_MAX ? realloc(buf, cap * 2) : NULL;
            if (!b) {
                rc = cap < CAPTURE_MAX ? -ENOMEM : -EFBIG;
                break;
            }
            buf = b;
            cap *= 2;
        }
        ssize_t r = read(p[0], buf + n, cap - n - 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = r < 0 ? -errno : 0;
            break;
        }
        n += (size_t)r;
    }
    close_fd(&p[0]);
    if (pid > 0) {
        while (waitpid(pid, &status, 0) < 0)
            if (errno != EINTR) {
                status = -1;
                break;
            }
        if (rc == 0 && (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) > 1))
            rc = -EIO; /* 1: some package has no files; the rest are there */
    }
    if (rc < 0) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

/* One installed package: its name and its relations as dpkg-query prints
 * them ("a (>= 1), b | c, d:any"). */
struct pkg {
    char *name;
    char *depends;
    char *provides;
    bool in; /* in the closure */
};

struct db {
    char *text; /* owns the strings */
    struct pkg *pkgs;
    size_t n;
};

static struct pkg *db_find(const struct db *db, const char *name, size_t len)
{
    for (size_t i = 0; i < db->n; i++)
        if (strlen(db->pkgs[i].name) == len && memcmp(db->pkgs[i].name, name, len) == 0)
            return &db->pkgs[i];
    /* A virtual package: the first installed one that provides it. */
    for (size_t i = 0; i < db->n; i++)
        for (const char *p = db->pkgs[i].provides; p && *p;) {
            p += strspn(p, " ,");
            size_t l = strcspn(p, " ,(:");
            if (l == len && memcmp(p, name, len) == 0)
                return &db->pkgs[i];
            p += strcspn(p, ",");
        }
    return NULL;
}

static int db_load(struct db *db)
{
    char *argv[] = {DPKG_QUERY, "-W", "-f",
                    "${db:Status-Abbrev}\t${Package}\t${Depends}, ${Pre-Depends}\t${Provides}\n",
                    NULL};
    size_t len, cap = 0;
    int rc = capture(argv, &db->text, &len);

    if (rc < 0)
        return rc;
    for (char *line = db->text, *next; *line; line = next) {
        next = line + strcspn(line, "\n");
        if (*next)
            *next++ = '\0';
        char *f[4] = {line, NULL, NULL, NULL};
        for (int i = 1; i < 4 && f[i - 1]; i++) {
            char *tab = strchr(f[i - 1], '\t');
            if (tab) {
                *tab = '\0';
                f[i] = tab + 1;
            }
        }
        if (!f[3] || strncmp(f[0], "ii", 2) != 0)
            continue;
        if (db->n == cap) {
            cap = cap ? cap * 2 : 256;
            struct pkg *p = realloc(db->pkgs, cap * sizeof(*p));
            if (!p)
                return -ENOMEM;
            db->pkgs = p;
        }
        db->pkgs[db->n++] = (struct pkg){.name = f[1], .depends = f[2], .provides = f[3]};
    }
    return 0;
}

/* The interpreter itself: the worker has its standard library already. */
static bool is_interpreter(const char *name)
{
    return strcmp(name, "python3") == 0 || strncmp(name, "python3.", 8) == 0 ||
           strcmp(name, "python3-minimal") == 0 || strncmp(name, "libpython3", 10) == 0;
}

/* A Python distribution (python3-numpy) or its data (python-matplotlib-data):
 * its relations are followed. Anything else it needs (a C library, fonts)
 * is taken, but not what that needs in turn: the C-level stack below is
 * the system's, and the shared libraries are visible to every worker. */
static bool is_python(const char *name)
{
    return strncmp(name, "python3-", 8) == 0 || strncmp(name, "python-", 7) == 0;
}

/* Marks |root| and what it depends on (see is_python); |order| gets each
 * once. For "a | b" the first alternative that is installed counts. */
static int closure(struct db *db, struct pkg *root, struct strv *order)
{
    int rc;

    if (root->in || is_interpreter(root->name))
        return 0;
    root->in = true;
    if ((rc = strv_push(order, root->name, strlen(root->name))) < 0)
        return rc;
    if (!is_python(root->name))
        return 0;
    for (const char *d = root->depends; *d;) {
        size_t group = strcspn(d, ",");
        struct pkg *dep = NULL;
        for (const char *a = d; a < d + group && !dep;) {
            a += strspn(a, " |");
            size_t l = strcspn(a, " ,|(:");
            if (l)
                dep = db_find(db, a, l);
            a += strcspn(a, ",|");
        }
        if (dep && (rc = closure(db, dep, order)) < 0)
            return rc;
        d += group + (d[group] == ',');
    }
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool owned(char *const *files, size_t n, const char *path)
{
    return bsearch(&path, files, n, sizeof(*files), cmp_str) != NULL;
}

/* Whether every entry beneath |dir|, at any depth, is a file of the
 * package set: then the directory as a whole shows nothing else. */
static bool owned_tree(char *const *files, size_t n, const char *dir, int depth)
{
    DIR *d = depth < OWNED_DEPTH_MAX ? opendir(dir) : NULL;
    struct dirent *e;
    bool ok = d != NULL;

    while (ok && (e = readdir(d))) {
        char path[PATH_MAX];
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        fmt(path, sizeof(path), "%s/%s", dir, e->d_name);
        ok =
            owned(files, n, path) && (e->d_type != DT_DIR || owned_tree(files, n, path, depth + 1));
    }
    if (d)
        closedir(d);
    return ok;
}

static bool covered(const struct strv *places, const char *path)
{
    for (size_t i = 0; i < places->n; i++) {
        size_t l = strlen(places->v[i]);
        if (strncmp(path, places->v[i], l) == 0 && (path[l] == '/' || path[l] == '\0'))
            return true;
    }
    return false;
}

/* Parts of /usr/share that are for people or desktops, not for code. */
static bool share_for_code(const char *path)
{
    static const char *const skip[] = {"doc",     "doc-base", "man",          "info",
                                       "lintian", "bug",      "locale",       "bash-completion",
                                       "menu",    "pixmaps",  "applications", "icons"};
    const char *rest = path + strlen("/usr/share/");
    size_t l = strcspn(rest, "/");

    if (!rest[l])
        return false; /* a file of /usr/share itself */
    for (size_t i = 0; i < ARRAY_SIZE(skip); i++)
        if (strlen(skip[i]) == l && strncmp(rest, skip[i], l) == 0)
            return false;
    return true;
}

/* The place that shows |path| (a data file) and nothing foreign: the
 * highest directory below /usr/share/X whose tree the set fills, else the
 * file alone. */
static int add_data(struct strv *places, char *const *files, size_t n, const char *path)
{
    char dir[PATH_MAX], best[PATH_MAX] = "";

    fmt(dir, sizeof(dir), "%s", path);
    for (;;) {
        char *slash = strrchr(dir, '/');
        *slash = '\0';
        if (strcmp(dir, "/usr/share") == 0 || !owned_tree(files, n, dir, 0))
            break;
        fmt(best, sizeof(best), "%s", dir);
    }
    return best[0] ? strv_push(places, best, strlen(best)) : strv_push(places, path, strlen(path));
}

/* Configuration a package reads at run time (/etc/matplotlibrc); not what
 * the system's own tools keep there, nor the files the private root writes. */
static bool etc_for_code(const char *path)
{
    static const char *const skip[] = {"X11",    "alternatives", "apt",          "cron.daily",
                                       "dpkg",   "init.d",       "logrotate.d",  "ld.so.conf.d",
                                       "passwd", "group",        "nsswitch.conf"};
    const char *rest = path + strlen("/etc/");
    size_t l = strcspn(rest, "/");

    for (size_t i = 0; i < ARRAY_SIZE(skip); i++)
        if (strlen(skip[i]) == l && strncmp(rest, skip[i], l) == 0)
            return false;
    return true;
}

static int add_places(struct strv *places, char *const *files, size_t n)
{
    static const char dist[] = PACKAGES_DIST_DIR "/";
    int rc = 0;

    for (size_t i = 0; rc == 0 && i < n; i++) {
        const char *p = files[i];
        struct stat st;
        if (covered(places, p) || lstat(p, &st) < 0)
            continue;
        if (strncmp(p, dist, sizeof(dist) - 1) == 0) {
            if (!strchr(p + sizeof(dist) - 1, '/'))
                rc = strv_push(places, p, strlen(p));
        } else if (S_ISDIR(st.st_mode)) {
            continue;
        } else if (strncmp(p, "/usr/share/", 11) == 0 && share_for_code(p)) {
            rc = add_data(places, files, n, p);
        } else if (strncmp(p, "/etc/", 5) == 0 && S_ISREG(st.st_mode) && etc_for_code(p)) {
            rc = strv_push(places, p, strlen(p));
        }
    }
    return rc;
}

/* /etc/alternatives entries that lead to shared libraries: the loader
 * follows them (libblas.so.3 -> /etc/alternatives/... -> the chosen BLAS). */
static int add_links(struct strv *links)
{
    DIR *d = opendir("/etc/alternatives");
    struct dirent *e;
    int rc = 0;

    while (d && rc == 0 && (e = readdir(d))) {
        char path[PATH_MAX], target[PATH_MAX];
        fmt(path, sizeof(path), "/etc/alternatives/%s", e->d_name);
        ssize_t l = readlink(path, target, sizeof(target) - 1);
        if (l <= 0)
            continue;
        target[l] = '\0';
        if (strncmp(target, "/usr/lib/", 9) != 0 || !strstr(target, ".so"))
            continue;
        rc = strv_push(links, path, strlen(path));
        if (rc == 0)
            rc = strv_push(links, target, (size_t)l);
    }
    if (d)
        closedir(d);
    return rc;
}

static bool name_ok(const char *name)
{
    size_t l = strlen(name);

    if (l == 0 || l > NAME_MAX_LEN || !islower((unsigned char)name[0]))
        return false;
    for (size_t i = 0; i < l; i++)
        if (!islower((unsigned char)name[i]) && !isdigit((unsigned char)name[i]) &&
            !strchr("-_.", name[i]))
            return false;
    return true;
}

/* The file list of the closure, sorted, without duplicates. */
static int list_files(const struct strv *pkgs, char **text, struct strv *files)
{
    char **argv = calloc(pkgs->n + 3, sizeof(*argv));
    size_t len;
    int rc;

    if (!argv)
        return -ENOMEM;
    argv[0] = DPKG_QUERY;
    argv[1] = "-L";
    memcpy(argv + 2, pkgs->v, pkgs->n * sizeof(*argv));
    rc = capture(argv, text, &len);
    free(argv);
    for (char *line = rc == 0 ? *text : "", *next; rc == 0 && *line; line = next) {
        next = line + strcspn(line, "\n");
        if (*next)
            *next++ = '\0';
        if (line[0] == '/' && line[1])
            rc = strv_push(files, line, strlen(line));
    }
    if (rc == 0 && files->n)
        qsort(files->v, files->n, sizeof(*files->v), cmp_str);
    return rc;
}

int packages_resolve(const char *const *names, struct packages *out, struct sbx_error *err)
{
    struct db db = {0};
    struct strv order = {0}, files = {0}, places = {0}, links = {0}, modules = {0};
    char *list_text = NULL;
    int rc = 0;

    memset(out, 0, sizeof(*out));
    for (const char *const *n = names; *n; n++)
        if (!name_ok(*n))
            return sbx_fail(err, SBX_ERR_INVALID_REQUEST, -EINVAL,
                            "package '%s': a distribution name in lower case, such as numpy", *n);
    if (pkgcache_load(names, out) == 0)
        goto fonts;
    rc = db_load(&db);
    if (rc < 0) {
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "packages: %s: %s", DPKG_QUERY, strerror(-rc));
        goto out;
    }
    for (const char *const *n = names; rc == 0 && *n; n++) {
        char deb[NAME_MAX_LEN + 16];
        fmt(deb, sizeof(deb), "python3-%s", *n);
        for (char *c = deb; *c; c++)
            if (*c == '_')
                *c = '-';
        struct pkg *p = db_find(&db, deb, strlen(deb));
        if (!p) {
            rc = sbx_fail(err, SBX_ERR_INVALID_REQUEST, -ENOENT,
                          "package '%s': the Debian package %s is not installed", *n, deb);
            goto out;
        }
        rc = closure(&db, p, &order);
        /* What code imports; pyplot is what matplotlib's users use. */
        if (rc == 0 && !strv_has(&modules, *n))
            rc = strv_push(&modules, *n, strlen(*n));
        if (rc == 0 && strcmp(*n, "matplotlib") == 0 && !strv_has(&modules, "matplotlib.pyplot"))
            rc = strv_push(&modules, "matplotlib.pyplot", strlen("matplotlib.pyplot"));
    }
    if (rc == 0)
        rc = list_files(&order, &list_text, &files);
    if (rc == 0)
        rc = add_places(&places, files.v, files.n);
    if (rc == 0)
        rc = add_links(&links);
    if (rc == 0 && places.n > PLACES_MAX)
        rc = sbx_fail(err, SBX_ERR_INVALID_REQUEST, -E2BIG,
                      "packages: %zu places to show, more than %u", places.n, PLACES_MAX);
    else if (rc < 0)
        rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, rc, "packages: listing their files: %s",
                      strerror(-rc));
    if (rc == 0) {
        out->modules = modules.v;
        out->places = places.v;
        out->links = links.v;
        modules = places = links = (struct strv){0};
        /* Lists that are empty are still lists. */
        if (!out->places)
            out->places = calloc(1, sizeof(char *));
        if (!out->links)
            out->links = calloc(1, sizeof(char *));
        if (!out->modules || !out->places || !out->links) {
            packages_free(out);
            rc = sbx_fail(err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
        } else {
            pkgcache_store(names, out);
        }
    }
fonts:
    for (char **m = rc == 0 ? out->modules : NULL; m && *m; m++)
        if (strcmp(*m, "matplotlib") == 0)
            out->font_cache = pkgcache_font_dir(names);
out:
    strv_free(&order);
    strv_free(&files);
    strv_free(&places);
    strv_free(&links);
    strv_free(&modules);
    free(list_text);
    free(db.pkgs);
    free(db.text);
    return rc;
}

static void free_vec(char **v)
{
    for (size_t i = 0; v && v[i]; i++)
        free(v[i]);
    free(v);
}

void packages_free(struct packages *p)
{
    free_vec(p->modules);
    free_vec(p->places);
    free_vec(p->links);
    free(p->font_cache);
    memset(p, 0, sizeof(*p));
}
