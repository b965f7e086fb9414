/*
 * What a sandbox with packages keeps between processes, so that a one-shot
 * `pysbx run --packages ...` does once what it would otherwise do on every
 * call: the resolution of a package set (two dpkg-query calls and a walk of
 * their files) and matplotlib's font list (read from every font file).
 *
 * Both live in the caller's own cache directory, $XDG_CACHE_HOME/pysbx or
 * else $HOME/.cache/pysbx, keyed to dpkg's database as it stands (any
 * install or removal rewrites it, and a new key starts afresh) and to this
 * version of the library. Without either variable nothing is kept.
 *
 * Trust: a resolution decides what a worker may read, and the font list is
 * read by a template. They are written only by this library and by
 * templates before any tenant code runs, in a directory that must be the
 * caller's own and writable by no one else, as must every directory above
 * it (root's, or sticky, will do), checked on every use as ssh checks
 * ~/.ssh; a directory or file that fails the check is ignored. No
 * worker can reach any of it (the template unmounts the font directory
 * before it forks one).
 */
#ifndef PYSBX_PKGCACHE_H
#define PYSBX_PKGCACHE_H

#include "packages.h"

/* Fills |out| from the kept resolution of |names|: 0, or -errno when there
 * is none to trust (nothing is changed then). */
int pkgcache_load(const char *const *names, struct packages *out);
/* Keeps |p|, the resolution of |names|; failures are silent. */
void pkgcache_store(const char *const *names, const struct packages *p);
/* The directory, made if missing, where templates of |names| keep
 * matplotlib's font list: a malloc'd path, or NULL when there is none. */
char *pkgcache_font_dir(const char *const *names);

#endif
