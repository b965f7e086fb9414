/*
 * The embedded interpreter: initialised once in the template, then used by
 * each worker forked from it.
 */
#ifndef PYSBX_PYHOST_H
#define PYSBX_PYHOST_H

#include <stddef.h>

/* A worker that ends because of an uncaught MemoryError ends with this
 * signal, so the supervisor can tell it from an ordinary exit status. */
#define PYHOST_NOMEM_SIGNAL (SIGRTMAX)

struct pyhost_config {
    const char *const *warm_modules; /* NULL-terminated; NULL: defaults */
    const char *const *module_dirs;  /* NULL-terminated extra sys.path dirs */
};

/* The modules imported in the template when the caller names none. */
extern const char *const pyhost_default_warm_modules[];

/* Initialises CPython (isolated, UTF-8 mode, no site, the path set to the
 * standard library and |cfg->module_dirs|), with the socket shim in place of
 * the built-in _socket, and imports the warm modules. Returns 0, or -1 with
 * a message in |err|. Call once, in the template. */
int pyhost_start(const struct pyhost_config *cfg, char *err, size_t errlen);

/* "3.11.2" */
const char *pyhost_version(void);

struct prefault;

/* fork() keeping the interpreter consistent on both sides (PyOS_BeforeFork
 * / AfterFork_Parent / AfterFork_Child). The child first copies the pages in
 * |plan| (may be NULL), before the interpreter's after-fork work writes to
 * them one fault at a time. */
int pyhost_fork(const struct prefault *plan);

/* In an idle worker, before any request: points HOME and TMPDIR at the
 * workspace and runs a small snippet of our own so that the copy-on-write
 * faults it takes are not on the request path. |devnull| receives the
 * snippet's output. Returns 0 or -1 with a message in |err|. */
int pyhost_prepare_worker(const char *workspace, int devnull, char *err, size_t errlen);

/* Compiles and runs |code| as __main__, then ends the process the way
 * python3 would: exit status 0, the sys.exit() code, or 1 after printing an
 * uncaught exception's traceback; non-daemon threads are joined and atexit
 * handlers run first. An uncaught MemoryError ends with
 * PYHOST_NOMEM_SIGNAL. Takes ownership of |code| (malloc'd). */
_Noreturn void pyhost_run(char *code, size_t len);

#endif
