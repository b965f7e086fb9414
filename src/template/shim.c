/*
 * The sandbox's _socket. Debian's libpython has _socket built in, so a
 * replacement socket.py would not be enough: code could `import _socket`
 * directly. The built-in table's entry is pointed at the shim before the
 * interpreter exists, so the real module is never initialised in this
 * process (its type would otherwise stay reachable through
 * object.__subclasses__()).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "shim.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "shim_socket.h" /* generated from shims/_socket.py: shim_socket_source */

static int shim_exec(PyObject *module)
{
    PyObject *dict = PyModule_GetDict(module);
    PyObject *code = NULL;
    PyObject *res = NULL;

    if (PyDict_SetItemString(dict, "__builtins__", PyEval_GetBuiltins()) < 0)
        return -1;
    code = Py_CompileString(shim_socket_source, "<sandbox _socket>", Py_file_input);
    if (!code)
        return -1;
    res = PyEval_EvalCode(code, dict, dict);
    Py_DECREF(code);
    if (!res)
        return -1;
    Py_DECREF(res);
    return 0;
}

static PyModuleDef_Slot shim_slots[] = {
    {Py_mod_exec, shim_exec},
    {0, NULL},
};

static struct PyModuleDef shim_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_socket",
    .m_doc = "The sandbox's _socket: there is no network here.",
    .m_size = 0,
    .m_slots = shim_slots,
};

static PyObject *shim_init(void)
{
    return PyModuleDef_Init(&shim_def);
}

int shim_install(void)
{
    size_t n = 0;
    bool found = false;
    struct _inittab *table;

    while (PyImport_Inittab[n].name)
        n++;
    table = calloc(n + 2, sizeof(*table)); /* lives as long as the process */
    if (!table)
        return -ENOMEM;
    memcpy(table, PyImport_Inittab, n * sizeof(*table));
    for (size_t i = 0; i < n; i++) {
        if (strcmp(table[i].name, "_socket") == 0) {
            table[i].initfunc = shim_init;
            found = true;
        }
    }
    if (!found) {
        /* _socket is an extension module in this build: a built-in entry
         * of the same name wins over the path finder. */
        table[n].name = "_socket";
        table[n].initfunc = shim_init;
    }
    PyImport_Inittab = table;
    return 0;
}
