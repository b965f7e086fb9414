/*
 * The places of the machine a worker may see: what the interpreter and the
 * extension modules it loads need, and nothing else. Landlock grants them
 * (read-only, but /dev/null) and the private root binds them, from this one
 * list.
 */
#ifndef PYSBX_PLACES_H
#define PYSBX_PLACES_H

#include <stddef.h>

enum place_kind {
    PLACE_DIR,      /* a directory tree, read-only */
    PLACE_FILE,     /* one file, read-only */
    PLACE_DEVICE,   /* a device node, read-only */
    PLACE_DEVICE_RW /* a device node, read-write (/dev/null) */
};

struct place {
    const char *path;
    enum place_kind kind;
    const char *why;
};

extern const struct place places[];
extern const size_t n_places;

#endif
