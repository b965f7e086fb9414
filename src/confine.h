/*
 * The worker's confinement, applied while it is idle, before any request.
 */
#ifndef PYSBX_CONFINE_H
#define PYSBX_CONFINE_H

#include <stddef.h>

/* Drops every capability (bounding, ambient, effective, permitted,
 * inheritable) and sets no_new_privs. Returns 0 or -1 with a message. */
int confine_self(char *err, size_t errlen);

#endif
