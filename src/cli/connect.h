/*
 * pysbx run --connect SOCKET (or PYSBX_CONNECT): the program goes to a
 * running `pysbx serve --listen SOCKET` as one JSON-lines request, and the
 * answer comes back as the library's result, so that the command prints the
 * same output and exits with the same status as a local run.
 */
#ifndef PYSBX_CONNECT_H
#define PYSBX_CONNECT_H

#include "pysbx.h"

/* Sends |req| (code, files, the limits whose GIVEN_* bit (options.h) is set
 * in |given|) to the server at the UNIX
 * socket |path| and waits for its answer. Returns 0 with *res (free with
 * sbx_result_free), or a negative errno with |err| set: the server refused
 * the request (its error code), or could not be reached or answered
 * something else (SBX_ERR_UNAVAILABLE). */
int remote_run(const char *path, const struct sbx_request *req, unsigned given,
               struct sbx_result **res, struct sbx_error *err);

#endif
