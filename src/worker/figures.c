#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "figures.h"
#include "pyrun.h"

/* Numbered per run (each worker is a fresh fork, counting from 0); a name
 * the code already used is skipped, so its own files are never replaced. A
 * figure the code saved to a file and has not changed since is not saved
 * again: it comes back once, under the code's name. ("Not changed" is
 * matplotlib's `stale`, cleared after the save, since drawing a legend
 * marks it stale during the save itself; any later change sets it.) */
static const char figures_source[] =
    "def _make():\n"
    "    import functools, os\n"
    "    import matplotlib.pyplot as plt\n"
    "    from matplotlib.figure import Figure\n"
    "    count = [0]\n"
    "    savefig = Figure.savefig\n"
    "    @functools.wraps(savefig)\n"
    "    def saved(self, *args, **kwargs):\n"
    "        r = savefig(self, *args, **kwargs)\n"
    "        to = args[0] if args else kwargs.get('fname')\n"
    "        if isinstance(to, (str, bytes, os.PathLike)):\n"
    "            self._pysbx_saved = True\n"
    "            self.stale = False  # as saved; a later change makes it stale again\n"
    "        return r\n"
    "    Figure.savefig = saved\n"
    "    def save_open_figures():\n"
    "        for num in plt.get_fignums():\n"
    "            fig = plt.figure(num)\n"
    "            if getattr(fig, '_pysbx_saved', False) and not fig.stale:\n"
    "                continue\n"
    "            count[0] += 1\n"
    "            while os.path.lexists('figure-%d.png' % count[0]):\n"
    "                count[0] += 1\n"
    "            fig.savefig('figure-%d.png' % count[0], format='png')\n"
    "        plt.close('all')\n"
    "    def show(*args, **kwargs):\n"
    "        save_open_figures()\n"
    "    show.__doc__ = plt.show.__doc__\n"
    "    plt.show = show\n"
    "    return save_open_figures\n";

static PyObject *save_open_figures; /* set in the template, inherited */

int figures_install(char *err, size_t errlen)
{
    PyObject *name = PyUnicode_FromString("matplotlib.pyplot");
    PyObject *plt = name ? PyImport_GetModule(name) : NULL;
    PyObject *ns = NULL, *r = NULL, *make = NULL;
    int rc = 0;

    Py_XDECREF(name);
    if (!plt)
        return PyErr_Occurred() ? pyrun_error_text("figures", err, errlen) : 0;
    ns = PyDict_New();
    if (ns && PyDict_SetItemString(ns, "__builtins__", PyEval_GetBuiltins()) == 0)
        r = PyRun_String(figures_source, Py_file_input, ns, ns);
    make = r ? PyDict_GetItemString(ns, "_make") : NULL; /* borrowed */
    save_open_figures = make ? PyObject_CallNoArgs(make) : NULL;
    if (!save_open_figures)
        rc = pyrun_error_text("installing the figure hook", err, errlen);
    Py_XDECREF(r);
    Py_XDECREF(ns);
    Py_DECREF(plt);
    return rc;
}

void figures_flush(void)
{
    if (!save_open_figures)
        return;
    PyObject *r = PyObject_CallNoArgs(save_open_figures);
    if (!r)
        PyErr_WriteUnraisable(save_open_figures);
    Py_XDECREF(r);
}
