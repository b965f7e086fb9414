#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "packages.h"

#include "figures.h"
#include "pyrun.h"
#include "root.h"
#include "sysutil.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
static const char rehearsal[] =
    "import io, sys\n"
    "if 'numpy' in sys.modules:\n"
    "    import numpy as np\n"
    "    a = np.arange(16.0).reshape(4, 4) + 4 * np.eye(4)\n"
    "    repr(np.linalg.solve(a, np.ones(4))); repr(a.sum(axis=0)); del a\n"
    "if 'pandas' in sys.modules:\n"
    "    import pandas as pd\n"
    "    df = pd.DataFrame({'x': range(24), 'y': [v * v for v in range(24)]})\n"
    "    df.groupby(df.x % 3).y.sum().to_string(); repr(df); df.describe().to_string()\n"
    "    del df\n"
    "if 'matplotlib.pyplot' in sys.modules:\n"
    "    import matplotlib.pyplot as plt\n"
    "    plt.plot([0, 1, 2], [0, 1, 4]); plt.title('t'); plt.xlabel('x'); plt.ylabel('y')\n"
    "    plt.savefig(io.BytesIO(), format='png'); plt.close('all')\n";

static int after_packages(void *arg, char *err, size_t errlen)
{
    PyObject *ns = PyDict_New();
    PyObject *r = NULL;

    (void)arg;
    if (ns && PyDict_SetItemString(ns, "__builtins__", PyEval_GetBuiltins()) == 0)
        r = PyRun_String(rehearsal, Py_file_input, ns, ns);
    Py_XDECREF(ns);
    if (!r)
        return pyrun_error_text("rehearsing the packages", err, errlen);
    Py_DECREF(r);
    return figures_install(err, errlen);
}

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
    /* matplotlib writes its font cache where MPLCONFIGDIR says, once: in the
     * private root, a tmpfs gone before any worker is forked; else in the
     * work directory, which workers cannot reach. */
    if (t->root) {
        if (mount("pysbx-scratch", ROOT_SCRATCH, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  "mode=0700,size=16m") < 0)
            return errmsg(err, errlen, -errno, "template: a tmpfs on " ROOT_SCRATCH ": %s",
                          strerror(errno));
        fmt(dir, sizeof(dir), "%s", ROOT_SCRATCH);
    } else {
        if (mkdirat(t->base_fd, MPL_DIR, 0700) < 0 && errno != EEXIST)
            return errmsg(err, errlen, -errno, "template: %s/" MPL_DIR ": %s", t->base_path,
                          strerror(errno));
        fmt(dir, sizeof(dir), "%s/" MPL_DIR, t->base_path);
    }
    if (setenv("MPLCONFIGDIR", dir, 1) < 0 || setenv("MPLBACKEND", "Agg", 1) < 0)
        return errmsg(err, errlen, -errno, "template: setenv: %s", strerror(errno));
    py->package_path = t->pkg_path;
    py->package_modules = (const char *const *)t->pkg_modules;
    py->after_packages = after_packages;
    py->arg = t;
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
    if (t->root && umount2(ROOT_SCRATCH, MNT_DETACH) < 0)
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
