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

/* What _ssl takes from _socket: CPython's socketmodule.h keeps this layout
 * (fields are only ever added at the end), the same in 3.11 and 3.13. */
struct socket_capi {
    PyTypeObject *sock_type;
    PyObject *error;
    PyObject *timeout_error;
};

#define SOCKET_CAPSULE "_socket.CAPI"

/* _ssl's _wrap_socket reads its argument as CPython's own socket object
 * (its descriptor, its timeout) once the argument passes a type check
 * against the capsule's type. The shim's sockets are Python objects of
 * another layout, so the type handed over is one that no object can ever
 * be an instance of: it cannot be instantiated or subclassed, and as a
 * static type it is immutable, so no object's __class__ can be set to it.
 * Every socket given to _wrap_socket is refused with a TypeError; TLS over
 * memory (ssl.MemoryBIO, no socket) works as under python3. */
static PyTypeObject no_socket_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_socket.network_socket",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .tp_doc = "A socket of the network, which this sandbox does not have.",
};

static struct socket_capi socket_capi;

/* The capsule is what makes `import ssl` work (_ssl imports it at its
 * start) and what 3.13's types.CapsuleType is the type of. */
static int add_capsule(PyObject *module)
{
    PyObject *capsule = NULL;

    if (PyType_Ready(&no_socket_type) < 0)
        return -1;
    socket_capi.sock_type = &no_socket_type;
    socket_capi.error = PyExc_OSError;
    socket_capi.timeout_error = PyExc_TimeoutError;
    capsule = PyCapsule_New(&socket_capi, SOCKET_CAPSULE, NULL);
    if (!capsule)
        return -1;
    if (PyModule_AddObject(module, "CAPI", capsule) < 0) {
        Py_DECREF(capsule);
        return -1;
    }
    return 0;
}

static int shim_exec(PyObject *module)
{
    PyObject *dict = PyModule_GetDict(module);
    PyObject *code = NULL;
    PyObject *res = NULL;

    if (PyDict_SetItemString(dict, "__builtins__", PyEval_GetBuiltins()) < 0 ||
        add_capsule(module) < 0)
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
