/*
 * The embedded interpreter in the template: initialised once, with the
 * socket shim in place and the warm modules imported, then forked for each
 * worker.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "interp.h"

#include "freezer.h"
#include "prefault.h"
#include "profile.h"
#include "pyrun.h"
#include "shim.h"
#include "sysutil.h"
#include "util.h"

#include <dlfcn.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

const char *const interp_default_warm_modules[] = {
    "json",        "re",      "math",      "collections", "itertools", "functools",
    "datetime",    "decimal", "fractions", "statistics",  "random",    "string",
    "textwrap",    "csv",     "io",        "base64",      "hashlib",   "typing",
    "dataclasses", "enum",    "traceback", "linecache",   "socket",    NULL,
};

static char version[32];

static int status_message(PyStatus st, const char *what, char *err, size_t errlen)
{
    return errmsg(err, errlen, -EIO, "%s: %s%s%s", what, st.func ? st.func : "",
                  st.func ? ": " : "", st.err_msg ? st.err_msg : "failed");
}

static PyStatus append_path(PyConfig *cfg, const char *dir)
{
    wchar_t *w = Py_DecodeLocale(dir, NULL);
    PyStatus st;

    if (!w)
        return PyStatus_NoMemory();
    st = PyWideStringList_Append(&cfg->module_search_paths, w);
    PyMem_RawFree(w);
    return st;
}

static int import_all(const char *const *names, char *err, size_t errlen)
{
    for (; names && *names; names++) {
        PyObject *m = PyImport_ImportModule(*names);
        if (!m) {
            char what[128];
            fmt(what, sizeof(what), "importing warm module %s", *names);
            return pyrun_error_text(what, err, errlen);
        }
        Py_DECREF(m);
    }
    return 0;
}

/* python3's site processes the .pth files of dist-packages; ours runs with
 * -S, so those of the vetted set are processed here, by site's own
 * addpackage: matplotlib's nspkg.pth makes mpl_toolkits a namespace
 * without running its __init__.py, which would import pkg_resources (a
 * tenth of a second, and not what python3 does). Only the set's own files:
 * the .pth of a package outside it never runs. site leaves sys.modules as
 * -S has it. */
static int package_pth(const char *dir, const char *const *places)
{
    size_t dl = strlen(dir);
    PyObject *site = NULL;
    bool had_site = PyDict_GetItemString(PySys_GetObject("modules"), "site") != NULL;
    int rc = 0;

    for (; places && *places && rc == 0; places++) {
        const char *p = *places, *name = p + dl + 1;
        size_t l = strlen(p);
        if (strncmp(p, dir, dl) != 0 || p[dl] != '/' || strchr(name, '/') || l < 4 ||
            strcmp(p + l - 4, ".pth") != 0)
            continue;
        if (!site && !(site = PyImport_ImportModule("site")))
            rc = -1;
        PyObject *r =
            site ? PyObject_CallMethod(site, "addpackage", "ssO", dir, name, Py_None) : NULL;
        if (!r)
            rc = -1;
        Py_XDECREF(r);
    }
    Py_XDECREF(site);
    if (site && !had_site && PyDict_DelItemString(PySys_GetObject("modules"), "site") < 0)
        rc = -1;
    return rc;
}

/* The frozen modules (os, codecs, io, ...) have a __file__ under python3,
 * found from the standard library's directory, which Python computes only
 * when it computes the path too (ours is set: it then leaves
 * sys._stdlib_dir None). Set it, and give the modules imported while the
 * interpreter started the files they would have had. */
static int frozen_files(void)
{
    static const char fix[] =
        "def _fix(stdlib):\n"
        "    import sys\n"
        "    from _frozen_importlib import FrozenImporter as F\n"
        "    sys._stdlib_dir = stdlib\n"
        "    for name, m in list(sys.modules.items()):\n"
        "        spec = getattr(m, '__spec__', None)\n"
        "        state = getattr(spec, 'loader_state', None)\n"
        "        if (spec is None or spec.loader is not F or state is None or state.filename\n"
        "                or name == '_frozen_importlib'):\n"
        "            continue\n"
        "        state.filename = F._resolve_filename(state.origname, name,\n"
        "                                             hasattr(m, '__path__'))[0]\n"
        "        if state.filename:\n"
        "            m.__file__ = state.filename\n";
    PyObject *ns = PyDict_New(), *r = NULL;

    if (ns && PyDict_SetItemString(ns, "__builtins__", PyEval_GetBuiltins()) == 0)
        r = PyRun_String(fix, Py_file_input, ns, ns);
    Py_XDECREF(r);
    PyObject *f = r ? PyDict_GetItemString(ns, "_fix") : NULL; /* borrowed */
    r = f ? PyObject_CallFunction(f, "s", PYSBX_PY_STDLIB) : NULL;
    Py_XDECREF(ns);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

int interp_start(const struct interp_config *c, char *err, size_t errlen)
{
    PyPreConfig pre;
    PyConfig cfg;
    PyStatus st;
    char *const argv[] = {"", NULL};
    const char *const *warm = c->warm_modules ? c->warm_modules : interp_default_warm_modules;

    if (shim_install() < 0)
        return errmsg(err, errlen, -ENOMEM, "out of memory installing the socket shim");

    /* The core is the system's libpython as it is now; the standard library
     * must be the same build (an upgrade half done, a library from
     * elsewhere on the loader's path): refuse rather than run a mix. */
    Dl_info lib = {0};
    char core[32];
    fmt(core, sizeof(core), "%.*s", (int)strcspn(Py_GetVersion(), " "), Py_GetVersion());
    int rc = python_build_problem(PYSBX_PY_STDLIB, core, Py_GetBuildInfo(),
                                  dladdr((void *)Py_GetVersion, &lib) ? lib.dli_fname : NULL, err,
                                  errlen);
    if (rc < 0)
        return rc;

    /* UTF-8 whatever the locale, as `python3 -X utf8`: the worker's locale
     * is C.UTF-8 and its streams must not fall back to ASCII. */
    PyPreConfig_InitIsolatedConfig(&pre);
    pre.utf8_mode = 1;
    st = Py_PreInitialize(&pre);
    if (PyStatus_Exception(st))
        return status_message(st, "Python pre-initialisation", err, errlen);

    PyConfig_InitIsolatedConfig(&cfg);
    cfg.site_import = 0;         /* -S: no site, no site-packages */
    cfg.user_site_directory = 0; /* -s */
    cfg.safe_path = 1;           /* -P: no script directory on the path */
    cfg.write_bytecode = 0;      /* never write .pyc from a worker */
    cfg.parse_argv = 0;
    cfg.pathconfig_warnings = 0;
    cfg.install_signal_handlers = 1; /* as python3: SIGPIPE and SIGXFSZ ignored */
    cfg.buffered_stdio = 1;
    st = PyConfig_SetBytesString(&cfg, &cfg.program_name, "python3");
    if (!PyStatus_Exception(st))
        st = PyConfig_SetBytesString(&cfg, &cfg.home, PYSBX_PY_PREFIX);
    /* As python3 has it: sys.executable names the interpreter, though a run
     * may start no process with it. */
    if (!PyStatus_Exception(st))
        st = PyConfig_SetBytesString(&cfg, &cfg.executable, PYSBX_PY_PREFIX "/bin/python3");
    if (!PyStatus_Exception(st))
        st = PyConfig_SetBytesArgv(&cfg, 1, argv);
    /* The path is ours, not computed: the standard library and what the
     * caller named, nothing from the environment or the disk around us. */
    cfg.module_search_paths_set = 1;
    if (!PyStatus_Exception(st))
        st = append_path(&cfg, PYSBX_PY_STDLIB);
    if (!PyStatus_Exception(st))
        st = append_path(&cfg, PYSBX_PY_DYNLOAD);
    for (const char *const *d = c->module_dirs; d && *d && !PyStatus_Exception(st); d++)
        st = append_path(&cfg, *d);
    if (c->package_path && !PyStatus_Exception(st))
        st = append_path(&cfg, c->package_path);
    if (!PyStatus_Exception(st))
        st = Py_InitializeFromConfig(&cfg);
    PyConfig_Clear(&cfg);
    if (PyStatus_Exception(st))
        return status_message(st, "Python initialisation", err, errlen);

    if (frozen_files() < 0)
        return pyrun_error_text("the frozen modules' files", err, errlen);
    if (pyrun_stdout_install() < 0)
        return pyrun_error_text("sys.stdout", err, errlen);
    if (import_all(warm, err, errlen) < 0)
        return -EIO;
    if (!c->defer_packages && (rc = interp_import_packages(c, err, errlen)) < 0)
        return rc;
    /* Every object that exists now is shared with every worker. Keep the
     * collector from ever walking them: a walk writes to each object's
     * header, and each write copies a page into the worker. */
    PyObject *gc = PyImport_ImportModule("gc");
    PyObject *r = gc ? PyObject_CallMethod(gc, "freeze", NULL) : NULL;
    Py_XDECREF(gc);
    if (!r)
        return pyrun_error_text("gc.freeze", err, errlen);
    Py_DECREF(r);
    /* The running library's version, which may differ from the headers'. */
    fmt(version, sizeof(version), "%.*s", (int)strcspn(Py_GetVersion(), " "), Py_GetVersion());
    return 0;
}

int interp_import_packages(const struct interp_config *c, char *err, size_t errlen)
{
    if (c->package_path && package_pth(c->package_path, c->package_places) < 0)
        return pyrun_error_text("the packages' .pth files", err, errlen);
    if (import_all(c->package_modules, err, errlen) < 0)
        return -EIO;
    if (c->after_packages && c->after_packages(c->arg, err, errlen) < 0)
        return -EIO;
    return 0;
}

const char *interp_version(void)
{
    return version;
}

int interp_fork(const struct prefault *plan, const struct freezer_cg *cg)
{
    int pid;

    PyOS_BeforeFork();
    pid = cg ? freezer_fork_into(cg) : fork();
    if (pid == 0) {
        if (plan)
            prefault_apply(plan);
        prof_mark(PROF_PREFAULT);
        PyOS_AfterFork_Child();
        prof_mark(PROF_AFTERFORK);
    } else
        PyOS_AfterFork_Parent();
    return pid;
}
