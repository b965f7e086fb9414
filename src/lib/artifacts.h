/*
 * Collecting the files a run left in its workspace, once no user code can
 * run any more, and only regular files: links, FIFOs, sockets and devices
 * are never followed, opened or waited on.
 */
#ifndef PYSBX_ARTIFACTS_H
#define PYSBX_ARTIFACTS_H

#include "pysbx.h"

struct artifact_spec {
    uint64_t max_bytes;            /* per file returned */
    uint64_t max_count;            /* files returned: the first by name */
    uint64_t max_total;            /* bytes returned of all files together */
    const struct sbx_file *inputs; /* returned only if changed */
    size_t n_inputs;
    /* When set: only the files it says yes to (a session's cell: what the
     * cell created or changed). */
    bool (*only)(const void *ctx, const char *path);
    const void *only_ctx;
};

/* What a collection found. */
struct artifact_set {
    struct sbx_artifact *v; /* sorted by their bytes on disk */
    size_t n;
    uint64_t dropped;                  /* files (and directories) not returned */
    struct sbx_dropped_artifact *gone; /* the first of them, with why */
    size_t n_gone;
};

/* Whether the workspace |ws_fd| is a file system of its own (the root of a
 * tmpfs made for the run): everything on it is then the run's, and may be
 * read with the run's owner's rights over it, whatever its mode or links. */
bool artifacts_private_fs(int ws_fd);

/* Walks the workspace |ws_fd| in the order of its names' bytes, reading
 * each file as it comes: the first max_count files, each cut at max_bytes,
 * while their names and bytes fit max_total. Every other regular file is
 * counted in |out|->dropped, and so is each directory not looked into (too
 * deep or unreadable). Files of several names are read only on a private
 * file system (|private_fs|). Returns 0 with |out| filled (free with
 * artifact_set_free), or -errno. */
int artifacts_collect(int ws_fd, const struct artifact_spec *spec, bool private_fs,
                      struct artifact_set *out);
void artifact_set_free(struct artifact_set *set);

/* The value the worker left in WIRE_VALUE_FILE, if any, as text of at most
 * |max_chars| characters (cut as output is). Returns 0 with *text (NULL
 * when there is none; free it), *len and *truncated, or -ENOMEM. */
int artifacts_take_value(int ws_fd, uint64_t max_chars, char **text, size_t *len, bool *truncated);

/* The uncaught exception the worker reported in WIRE_ERROR_FILE, if any,
 * into res->error_type, error_message and error_traceback (each at most
 * |max_chars| characters; all NULL when there is no whole report). Returns
 * 0 or -ENOMEM. */
int artifacts_take_error(int ws_fd, uint64_t max_chars, struct sbx_result *res);

/* The name of the path |raw| as the result gives it (see struct
 * sbx_artifact): |raw| itself when it needs no escaping, else a new string
 * (NULL when out of memory). */
char *artifacts_escape_name(char *raw);

void artifacts_free(struct sbx_artifact *a, size_t n);
void dropped_free(struct sbx_dropped_artifact *d, size_t n);

#endif
