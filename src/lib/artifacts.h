/*
 * Collecting the files a run left in its workspace, once no user code can
 * run any more, and only regular files: links, FIFOs, sockets and devices
 * are never followed, opened or waited on.
 */
#ifndef PYSBX_ARTIFACTS_H
#define PYSBX_ARTIFACTS_H

#include "pysbx.h"

/* Directories nested deeper than this are not looked into. */
#define ARTIFACT_MAX_DEPTH 64

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

/* Walks the workspace |ws_fd|. Returns 0 with *out (n_out entries, sorted by
 * name bytewise) and *dropped (regular files past max_count, or whose
 * returned bytes would pass max_total), or -errno. */
int artifacts_collect(int ws_fd, const struct artifact_spec *spec, struct sbx_artifact **out,
                      size_t *n_out, uint64_t *dropped);

/* The value the worker left in WIRE_VALUE_FILE, if any, as text of at most
 * |max_chars| characters (cut as output is). Returns 0 with *text (NULL
 * when there is none; free it), *len and *truncated, or -ENOMEM. */
int artifacts_take_value(int ws_fd, uint64_t max_chars, char **text, size_t *len, bool *truncated);

/* The uncaught exception the worker reported in WIRE_ERROR_FILE, if any,
 * into res->error_type, error_message and error_traceback (each at most
 * |max_chars| characters; all NULL when there is no whole report). Returns
 * 0 or -ENOMEM. */
int artifacts_take_error(int ws_fd, uint64_t max_chars, struct sbx_result *res);

void artifacts_free(struct sbx_artifact *a, size_t n);

#endif
