/*
 * The embedded interpreter in the template: initialised once, then forked
 * for each worker.
 */
#ifndef PYSBX_INTERP_H
#define PYSBX_INTERP_H

#include <stdbool.h>
#include <stddef.h>

struct interp_config {
    const char *const *warm_modules; /* NULL-terminated; NULL: defaults */
    const char *const *module_dirs;  /* NULL-terminated extra sys.path dirs */
    /* A vetted package set (may be NULL): its directory on sys.path, the
     * modules imported after the warm ones, and work done once they are,
     * before the interpreter's objects are frozen. */
    const char *package_path;
    const char *const *package_modules;
    /* The set's files and directories (NULL-terminated); its .pth files
     * directly in package_path are processed as site does, before the
     * imports. */
    const char *const *package_places;
    /* Leave the set to the one worker of a single-run template, which calls
     * interp_import_packages: what it imports is then its own memory, not
     * the template's pages copied one write fault at a time. */
    bool defer_packages;
    int (*after_packages)(void *arg, char *err, size_t errlen);
    void *arg;
};

/* The modules imported in the template when the caller names none. */
extern const char *const interp_default_warm_modules[];

/* Initialises CPython (isolated, UTF-8 mode, no site, the path set to the
 * standard library and |cfg->module_dirs|), with the socket shim in place of
 * the built-in _socket, and imports the warm modules. Returns 0, or -errno
 * with a message in |err|. Call once, in the template. */
int interp_start(const struct interp_config *cfg, char *err, size_t errlen);

/* The package set's .pth files, its imports and |cfg->after_packages|:
 * interp_start's work unless |cfg->defer_packages|. Returns 0 or -errno with
 * a message. */
int interp_import_packages(const struct interp_config *cfg, char *err, size_t errlen);

/* "3.11.2" on Debian 12, "3.13.5" on 13 */
const char *interp_version(void);

struct prefault;
struct freezer_cg;

/* fork() keeping the interpreter consistent on both sides (PyOS_BeforeFork
 * / AfterFork_Parent / AfterFork_Child). The child first copies the pages in
 * |plan| (may be NULL), before the interpreter's after-fork work writes to
 * them one fault at a time. With |cg|, the child is born in that cgroup. */
int interp_fork(const struct prefault *plan, const struct freezer_cg *cg);

#endif
