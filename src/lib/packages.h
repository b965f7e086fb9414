/*
 * The vetted packages of a sandbox (sbx_config.packages): from the names a
 * caller gives to the places of the machine a worker may then read.
 */
#ifndef PYSBX_PACKAGES_H
#define PYSBX_PACKAGES_H

#include "pysbx.h"

/* Where Debian installs the Python distributions it packages. */
#define PACKAGES_DIST_DIR "/usr/lib/python3/dist-packages"

struct packages {
    /* Modules the template imports (NULL-terminated). */
    char **modules;
    /* Paths a worker may read (NULL-terminated): directories or files. */
    char **places;
    /* Symbolic links to recreate in the private root, as path, target,
     * path, target, ... (NULL-terminated): the library alternatives the
     * dynamic loader follows (/etc/alternatives/libblas.so.3-...). */
    char **links;
    /* Where templates keep matplotlib's font list (pkgcache.h), or NULL. */
    char *font_cache;
};

/* Resolves |names| (Debian's python3-NAME for each) by the Debian
 * packages' own relations: the closure of their Depends and Pre-Depends
 * through installed alternatives, as dpkg-query reports them. The places
 * are each package's top-level entries of PACKAGES_DIST_DIR, the data
 * directories under /usr/share its files fill wholly (else the files), its
 * regular files in /etc. Returns 0 or -errno with |err| (invalid_request
 * for a name that is not an installed package). */
/* A resolution kept by an earlier process for the same dpkg database is
 * used instead (pkgcache.h). */
int packages_resolve(const char *const *names, struct packages *out, struct sbx_error *err);
void packages_free(struct packages *p);

#endif
