/*
 * The request and answer forms that `pysbx serve` and `pysbx batch` speak:
 * one JSON object per line.
 *
 *   {"id": any, "code": "...", "files": {"name": "text"},
 *    "files_base64": {"name": "b64"}, "limits": {"wall_seconds": 2, ...}}
 *   {"cancel": <the id of a request in flight>}          (serve only)
 *
 * An answer is the result object with the request's id, or
 *   {"id": <id or null>, "error": {"code": "...", "message": "..."}}.
 * The id is echoed as the request wrote it, byte for byte: a JSON parser
 * would turn 1.00000000001 or 2^64 into a different number.
 */
#ifndef PYSBX_REQJSON_H
#define PYSBX_REQJSON_H

#include "pysbx.h"

#include <jansson.h>

struct json_request {
    char *id_text;     /* the id's JSON text as written; "null" when none */
    char *cancel_text; /* a cancel message: the id it names, as written */
    json_t *doc;       /* the parsed line, which holds the code */
    struct sbx_request req;
    struct sbx_file *files;
    size_t n_files;
};

/* Parses one line: a request, or (r->cancel_text set, r->req unfilled) a
 * cancel message. A limit above |ceil| (may be NULL) is refused, and a
 * default above it lowered to it. Returns 0, or -EINVAL with |err| set
 * (r->id_text holds the id whenever the line was a JSON object with one).
 * Free with json_request_free either way. */
int json_request_parse(const char *text, size_t len, const struct sbx_limits *ceil,
                       struct json_request *r, struct sbx_error *err);
/* Fills an already parsed object (for callers that hold one; no id). */
int json_request_from(json_t *o, const struct sbx_limits *ceil, struct json_request *r,
                      struct sbx_error *err);
void json_request_free(struct json_request *r);

/* The library's ranges: a ceiling that adds nothing. */
void json_ceilings_init(struct sbx_limits *ceil);

/* Finds the value of member |key| of the JSON object |text| (which must be
 * valid JSON: scan only what a parser accepted), the last one if the key is
 * repeated, as a parser would. Returns 0 with its text in *val, *vlen, or
 * -ENOENT. */
int json_raw_member(const char *text, size_t len, const char *key, const char **val, size_t *vlen);

/* The answer lines, NUL-terminated and newline-ended; free(). |id_text| is
 * JSON text spliced in as it is (NULL: null). NULL only when out of memory. */
char *json_answer_result(const char *id_text, const struct sbx_result *res);
char *json_answer_error(const char *id_text, const struct sbx_error *err);
/* The refusal of a cancel message: {"id":null,"cancel":<its id>,"error":...}. */
char *json_answer_cancel_error(const char *cancel_text, const struct sbx_error *err);

#endif
