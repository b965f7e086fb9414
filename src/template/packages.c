#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "packages.h"

#include "figures.h"
#include "pysbx.h"
#include "pyrun.h"
#include "root.h"
#include "sysutil.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#define MPL_DIR ".matplotlib"

/* What a run of the packages does first, done once here: the lazy imports
 * and caches of a table, a solve and a chart (fonts found, the PNG writer
 * loaded) then belong to the template, shared by every worker, instead of
 * being paid on each request. */
#define REHEARSAL                                                                                  \
    "import io, sys\n"                                                                             \
    "if 'numpy' in sys.modules:\n"                                                                 \
    "    import numpy as np\n"                                                                     \
    "    a = np.arange(16.0).reshape(4, 4) + 4 * np.eye(4)\n"                                      \
    "    repr(np.linalg.solve(a, np.ones(4))); repr(a.sum(axis=0)); del a\n"                       \
    "if 'pandas' in sys.modules:\n"                                                                \
    "    import pandas as pd\n"                                                                    \
    "    df = pd.DataFrame({'x': range(24), 'y': [v * v for v in range(24)]})\n"                   \
    "    df.groupby(df.x % 3).y.sum().to_string(); repr(df); df.describe().to_string()\n"          \
    "    del df\n"                                                                                 \
    "if 'matplotlib.pyplot' in sys.modules:\n"                                                     \
    "    import matplotlib.pyplot as plt\n"                                                        \
    "    plt.plot([0, 1, 2], [0, 1, 4]); plt.title('t'); plt.xlabel('x'); plt.ylabel('y')\n"       \
    "    plt.savefig(io.BytesIO(), format='png'); plt.close('all')\n"

static const char rehearsal[] = REHEARSAL;

/* The same again in each idle worker, then the font objects it opened let
 * go, as matplotlib itself does after a fork: none of the worker's own
 * descriptors is open when the code starts. */
const char packages_worker_warm_up[] =
    REHEARSAL "if 'matplotlib.font_manager' in sys.modules:\n"
              "    sys.modules['matplotlib.font_manager']._get_font.cache_clear()\n";

static int after_packages(void *arg, char *err, size_t errlen)
{
    const struct tmpl *t = arg;
    PyObject *ns = NULL;
    PyObject *r = NULL;

    /* A template for one run rehearses nothing: its one worker would pay
     * for it here instead of in its own code, and for parts its code may
     * never touch. */
    if (t->single_run)
        return figures_install(err, errlen);
    ns = PyDict_New();
    if (ns && PyDict_SetItemString(ns, "__builtins__", PyEval_GetBuiltins()) == 0)
        r = PyRun_String(rehearsal, Py_file_input, ns, ns);
    Py_XDECREF(ns);
    if (!r)
        return pyrun_error_text("rehearsing the packages", err, errlen);
    Py_DECREF(r);
    return figures_install(err, errlen);
}

/* Under a private root and on the host's tree the fonts a template sees
 * differ: each keeps its own list. */
#define FONTS_ROOT "root"
#define FONTS_HOST "host"

/* A directory |sub| of the font cache, made if missing and opened; -1 when
 * it is not a plain directory of the template's own. */
static int font_subdir(const struct tmpl *t, const char *sub)
{
    int dir = open(t->font_cache, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), fd = -1;
    struct stat st;

    if (dir >= 0 && (mkdirat(dir, sub, 0700) == 0 || errno == EEXIST))
        fd = openat(dir, sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0 && (fstat(fd, &st) < 0 || st.st_uid != geteuid() || (st.st_mode & 022)))
        close_fd(&fd);
    close_fd(&dir);
    return fd;
}

void packages_font_cache(struct tmpl *t)
{
    bool will_root = !(t->jc.disable & SBX_LAYER_ROOT) && t->jail.mount_ns;
    int fd;

    if (!will_root)
        return; /* the host's tree stays in view: packages_prepare */
    fd = font_subdir(t, FONTS_ROOT);
    if (fd >= 0)
        t->font_tree = open_tree(fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
    close_fd(&fd);
}

/* matplotlib's configuration and font cache directory: where MPLCONFIGDIR
 * says. Kept between templates where the supervisor gave a place for it
 * (the font list is read from every font file, a tenth of a second, else
 * paid by each template); else in a scratch tmpfs of the private root,
 * gone before any worker is forked, or in the work directory, which
 * workers cannot reach. */
static int font_place(struct tmpl *t, char *dir, size_t cap, char *err, size_t errlen)
{
    if (t->root && t->font_tree >= 0 &&
        move_mount(t->font_tree, "", AT_FDCWD, ROOT_SCRATCH, MOVE_MOUNT_F_EMPTY_PATH) == 0) {
        fmt(dir, cap, "%s", ROOT_SCRATCH);
        return 0;
    }
    if (t->root) {
        if (mount("pysbx-scratch", ROOT_SCRATCH, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  "mode=0700,size=16m") < 0)
            return errmsg(err, errlen, -errno, "template: a tmpfs on " ROOT_SCRATCH ": %s",
                          strerror(errno));
        fmt(dir, cap, "%s", ROOT_SCRATCH);
        return 0;
    }
    int fd = t->font_cache ? font_subdir(t, FONTS_HOST) : -1;
    if (fd >= 0) {
        close_fd(&fd);
        fmt(dir, cap, "%s/" FONTS_HOST, t->font_cache);
        return 0;
    }
    if (mkdirat(t->base_fd, MPL_DIR, 0700) < 0 && errno != EEXIST)
        return errmsg(err, errlen, -errno, "template: %s/" MPL_DIR ": %s", t->base_path,
                      strerror(errno));
    fmt(dir, cap, "%s/" MPL_DIR, t->base_path);
    return 0;
}

/* A single-run template's package work, which its one worker does
 * (packages_in_worker). */
static struct interp_config deferred;

int packages_prepare(struct tmpl *t, struct interp_config *py, char *err, size_t errlen)
{
    /* One thread each: the template forks, so it must hold no pool, and a
     * run's CPU limit counts every thread it starts. */
    static const char *const one_thread[] = {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                             "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"};
    char dir[PATH_MAX];

    for (size_t i = 0; i < ARRAY_SIZE(one_thread); i++)
        if (setenv(one_thread[i], "1", 1) < 0)
            return errmsg(err, errlen, -errno, "template: setenv: %s", strerror(errno));
    int rc = font_place(t, dir, sizeof(dir), err, errlen);
    close_fd(&t->font_tree);
    if (rc < 0)
        return rc;
    if (setenv("MPLCONFIGDIR", dir, 1) < 0 || setenv("MPLBACKEND", "Agg", 1) < 0)
        return errmsg(err, errlen, -errno, "template: setenv: %s", strerror(errno));
    py->package_path = t->pkg_path;
    py->package_modules = (const char *const *)t->pkg_modules;
    py->package_places = (const char *const *)t->pkg_places;
    py->after_packages = after_packages;
    py->arg = t;
    py->defer_packages = t->single_run;
    deferred = *py;
    return 0;
}

int packages_in_worker(void *arg, char *err, size_t errlen)
{
    const struct tmpl *t = arg;
    int rc = interp_import_packages(&deferred, err, errlen);

    if (rc < 0)
        return rc;
    /* The scratch directory goes before any of the tenant's code, from this
     * worker's mount namespace (the template's keeps it: nothing of a
     * tenant's runs there). */
    if (t->root && umount2(ROOT_SCRATCH, MNT_DETACH) < 0)
        return errmsg(err, errlen, -errno, "worker: unmounting " ROOT_SCRATCH ": %s",
                      strerror(errno));
    /* One thread, as the template checks of itself: Landlock confines only
     * the thread that asks. The kernel lets unshare(CLONE_THREAD) succeed,
     * doing nothing, only in a process of one thread. */
    if (unshare(CLONE_THREAD) < 0)
        return errmsg(err, errlen, -EBUSY,
                      "worker: importing the packages left threads running (%s); a worker "
                      "confines itself with one",
                      strerror(errno));
    return 0;
}

static int check_threads(struct tmpl *t, char *err, size_t errlen)
{
    int fd = openat(t->proc_fd, "self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    struct dirent *e;
    int n = 0;

    if (!d) {
        int e2 = errno;
        if (fd >= 0)
            close(fd);
        return errmsg(err, errlen, -e2, "template: counting its threads: %s", strerror(e2));
    }
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    if (n != 1)
        return errmsg(err, errlen, -EBUSY,
                      "template: %d threads after importing the packages; workers are forked "
                      "from it and must inherit one",
                      n);
    return 0;
}

int packages_started(struct tmpl *t, char *err, size_t errlen)
{
    /* A single run's worker imports after the fork, and unmounts it in its
     * own namespace. */
    if (t->root && !t->single_run && umount2(ROOT_SCRATCH, MNT_DETACH) < 0)
        return errmsg(err, errlen, -errno, "template: unmounting " ROOT_SCRATCH ": %s",
                      strerror(errno));
    return check_threads(t, err, errlen);
}

static bool beneath(const char *path, const char *dir)
{
    size_t l = strlen(dir);

    return strncmp(path, dir, l) == 0 && path[l] == '/';
}

const char *const *packages_read_only(struct tmpl *t)
{
    char **merged;
    size_t a = 0, b = 0, n = 0;

    if (!t->pkg_places)
        return (const char *const *)t->module_dirs;
    while (t->module_dirs[a])
        a++;
    while (t->pkg_places[b])
        b++;
    merged = calloc(a + b + 2, sizeof(*merged));
    if (!merged)
        return NULL;
    memcpy(merged, t->module_dirs, a * sizeof(*merged));
    n = a;
    /* Under the private root the package directory holds the set's entries
     * and nothing else: granted whole, it can be listed, as
     * importlib.metadata does. On the host's tree only each entry. */
    if (t->root)
        merged[n++] = t->pkg_path;
    for (size_t i = 0; i < b; i++)
        if (!t->root || !beneath(t->pkg_places[i], t->pkg_path))
            merged[n++] = t->pkg_places[i];
    return (const char *const *)merged;
}
