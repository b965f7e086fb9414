/*
 * The one request a worker reads: its header, its code, then its input
 * files, each written beneath the workspace as it arrives. Apart from the
 * worker's fixed descriptors, so that a fuzzer runs this very code.
 */
#ifndef PYSBX_REQUEST_H
#define PYSBX_REQUEST_H

#include "wire.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Reads the request from |fd| and writes its files beneath |ws_fd|. Returns
 * 0 with *code (malloc'd, NUL-terminated, req->code_len bytes before the
 * NUL); -ENODATA when the stream ended before its first byte (the
 * supervisor had nothing for us); or another -errno with |why| set to the
 * line, newline included, that the worker writes on its stderr. Files
 * written before a failure stay. With |replace| (a session's cell), an
 * input file replaces what is at its name. */
int request_read(int fd, int ws_fd, bool replace, struct wire_req *req, char **code, char *why,
                 size_t cap);

/* What follows the files: the program's arguments and its standard input. */
struct request_input {
    char **args; /* n_args NUL-terminated strings, malloc'd (request_input_free) */
    uint32_t n_args;
    int stdin_fd;   /* an unnamed file beneath the workspace holding it, at its start; or -1 */
    char *filename; /* the program's name, malloc'd; or NULL */
    char *tools;    /* the host tools' JSON text, malloc'd; or NULL */
};

/* After request_read: reads the arguments and the standard input (into a
 * file of the workspace that has no name, so it is never an artifact).
 * Returns 0 or -errno with |why| set as request_read's. */
int request_read_input(int fd, int ws_fd, const struct wire_req *req, struct request_input *in,
                       char *why, size_t cap);
void request_input_free(struct request_input *in);

#endif
