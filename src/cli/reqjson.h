/*
 * The request and answer forms that `pysbx serve` and `pysbx batch` speak:
 * one JSON object per line.
 *
 *   {"id": any, "code": "...", "files": {"name": "text"},
 *    "files_base64": {"name": "b64"}, "limits": {"wall_seconds": 2, ...}}
 *
 * An answer is the result object with the request's id, or
 *   {"id": <id or null>, "error": {"code": "...", "message": "..."}}.
 */
#ifndef PYSBX_REQJSON_H
#define PYSBX_REQJSON_H

#include "pysbx.h"

#include <jansson.h>

struct json_request {
    json_t *id;  /* our reference; JSON null when the request had none */
    json_t *doc; /* the parsed line, which holds the code */
    struct sbx_request req;
    struct sbx_file *files;
    size_t n_files;
};

/* Parses one request. Returns 0, or -EINVAL with |err| set (r->id is set
 * whenever the line was a JSON object with an id). Free with
 * json_request_free either way. */
int json_request_parse(const char *text, size_t len, struct json_request *r, struct sbx_error *err);
/* Fills an already parsed object (for callers that hold one). */
int json_request_from(json_t *o, struct json_request *r, struct sbx_error *err);
void json_request_free(struct json_request *r);

/* The answer lines, NUL-terminated and newline-ended; free(). NULL only when
 * out of memory. */
char *json_answer_result(json_t *id, const struct sbx_result *res);
char *json_answer_error(json_t *id, const struct sbx_error *err);

#endif
