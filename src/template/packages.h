/*
 * The template's part of a vetted package set (sbx_config.packages): the
 * environment the packages import under, their rehearsal before the fork,
 * the check that they left the template single-threaded, and the places
 * Landlock grants. The supervisor resolved which places those are.
 */
#ifndef PYSBX_TEMPLATE_PACKAGES_H
#define PYSBX_TEMPLATE_PACKAGES_H

#include "interp.h"
#include "template.h"

#include <stddef.h>

/* What a run of the packages does first, which the template did after the
 * imports, done again by each of its idle workers, so that what a table
 * and a chart write is copied before a request, not on it. */
extern const char packages_worker_warm_up[];

/* Before the private root is entered, with t->font_cache set: clones the
 * directory where templates keep matplotlib's font list, to be mounted
 * once the root is built. Failing, the list is built in a scratch
 * directory instead, as without a cache. */
void packages_font_cache(struct tmpl *t);

/* Before the interpreter starts: native thread pools of one thread, the
 * non-interactive matplotlib backend, its configuration and font cache in
 * a directory of the template's own, kept between templates where the
 * supervisor gave one (workers never see it: they have the font list in
 * memory). Fills |py|'s package fields. Returns 0 or -errno with a
 * message. */
int packages_prepare(struct tmpl *t, struct interp_config *py, char *err, size_t errlen);

/* After the imports (and once any thread of the template's own is
 * joined): unmounts the scratch directory (a single run's worker does, in
 * its own mount namespace), and fails unless the template has one thread. */
int packages_started(struct tmpl *t, char *err, size_t errlen);

/* In the one worker of a single-run template (worker_args.late), before
 * the environment is cleared: imports the set as the template would have,
 * unmounts the scratch directory, fails unless the worker has one thread.
 * Returns 0 or -errno with a message. */
int packages_in_worker(void *t, char *err, size_t errlen);

/* What Landlock grants read-only: the module directories and, with a
 * package set, its places. NULL when out of memory. Call after the root is
 * entered (or not). */
const char *const *packages_read_only(struct tmpl *t);

#endif
