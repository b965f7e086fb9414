/*
 * The work directory of a sandbox or backend: <work_root>/<prefix>XXXXXX,
 * holding one workspace per run, removed (without following any link) when
 * the sandbox closes.
 */
#ifndef PYSBX_WORKDIR_H
#define PYSBX_WORKDIR_H

#include "pysbx.h"

#include <stdbool.h>

struct workdir {
    int root_fd; /* the work root that holds it */
    int fd;
    int owner_fd; /* OWNER_FILE inside, flock-ed for as long as we live */
    char *path;
};

/* Makes the directory under |work_root| (NULL: $TMPDIR, else /tmp), after
 * removing the work directories of |prefix| that owners killed without a
 * chance to clean up left there (ours by uid, their owner lock free). With
 * |other_uids| (workers run under their own uid), checks that they can pass
 * through every directory above it and makes it 0711. Returns 0 or a
 * negative errno with |err| set (SBX_ERR_UNAVAILABLE). */
int workdir_make(struct workdir *wd, const char *work_root, const char *prefix, bool other_uids,
                 struct sbx_error *err);

/* Removes the directory and everything in it; closes the descriptors.
 * Safe on a workdir that was never made, or made in part. */
void workdir_remove(struct workdir *wd);

#endif
