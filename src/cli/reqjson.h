/*
 * The request and answer forms that `pysbx serve` and `pysbx batch` speak:
 * one JSON object per line.
 *
 *   {"id": any, "code": "...", "files": {"name": "text"},
 *    "files_base64": {"name": "b64"}, "limits": {"wall_seconds": 2, ...},
 *    "session": "NAME", "rollback": "on_error", "cell": N}  (a session: serve only)
 *   {"cancel": <the id of a request in flight>}          (serve only)
 *   {"id": any, "session_close": "NAME"}                 (serve only)
 *   {"id": any, "session_fork": {"from": "A", "to": "B"}} (serve only)
 *   {"id": any, "session_hibernate": "NAME"}             (serve only)
 *
 * An answer is the result object with the request's id (and, for a cell of
 * a session, "session": {"name", "cell", "rolled_back"}), or
 *   {"id": <id or null>, "error": {"code": "...", "message": "..."}}.
 * The id is echoed as the request wrote it, byte for byte: a JSON parser
 * would turn 1.00000000001 or 2^64 into a different number.
 */
#ifndef PYSBX_REQJSON_H
#define PYSBX_REQJSON_H

#include "pysbx.h"

#include <jansson.h>

/* A session's name, as a request ("session") or the MCP tool ("session_id")
 * gives it: a non-empty string of at most this many bytes, without NUL. */
#define SESSION_NAME_MAX 128

struct json_request {
    char *id_text;     /* the id's JSON text as written; "null" when none */
    char *cancel_text; /* a cancel message: the id it names, as written */
    json_t *doc;       /* the parsed line, which holds the code */
    struct sbx_request req;
    struct sbx_file *files;
    size_t n_files;
    void *stdin_decoded; /* stdin_base64, decoded (malloc'd) */
    const char **args;   /* argv's strings (in |doc|), malloc'd array */
    /* In |doc|: the session the request is a cell of (NULL: none), and
     * what a cell that fails does to it. */
    const char *session;
    enum sbx_rollback rollback;
    uint64_t cell; /* "cell": the number the cell says it is; 0: not said */
    /* In |doc|: a session_close message's name (r->req unfilled). */
    const char *session_close;
    /* In |doc|: a session_fork message's names (r->req unfilled). */
    const char *fork_from, *fork_to;
    /* In |doc|: a session_hibernate message's name (r->req unfilled). */
    const char *session_hibernate;
    /* "stream": true: the output as events before the answer. */
    bool stream;
    /* "tools": the host tools it declares (names and descriptions in
     * |doc|), into r->req. */
    struct sbx_tool *tools;
    /* A tool_result message (r->req unfilled): the call it answers, and
     * in |doc| its content (JSON) or its error (a string). */
    bool is_tool_result;
    uint64_t result_call;
    json_t *result_content;
    const char *result_error;
};

/* Parses one line: a request, or (r->cancel_text or r->session_close set,
 * r->req unfilled) a cancel or session_close message. A limit above |ceil| (may be NULL) is
 * refused, and a default above it lowered to it. Returns 0, or -EINVAL with |err| set (r->id_text
 * holds the id whenever the line was a JSON object with one). Free with json_request_free either
 * way. */
int json_request_parse(const char *text, size_t len, const struct sbx_limits *ceil,
                       struct json_request *r, struct sbx_error *err);

/* Parses a request for a cell of the session |session| (the path names it,
 * over HTTP): as json_request_parse, but only a request, without a
 * "session" of its own. */
int json_request_parse_cell(const char *text, size_t len, const char *session,
                            const struct sbx_limits *ceil, struct json_request *r,
                            struct sbx_error *err);
/* Fills an already parsed object (for callers that hold one; no id). */
int json_request_from(json_t *o, const struct sbx_limits *ceil, struct json_request *r,
                      struct sbx_error *err);
void json_request_free(struct json_request *r);
/* The limits of a request, in the order of struct sbx_limits: wall and CPU
 * seconds, memory bytes, output characters, artifact bytes, artifacts,
 * artifacts' total bytes. */
#define REQUEST_LIMIT_COUNT 7
/* Where bit i of |given| is set and the request's "limits" does not name
 * the i-th limit, that limit is |defaults|' (the command line's limits are
 * the defaults of `pysbx batch`'s request lines; a line's own win). */
void json_request_default_limits(struct json_request *r, const struct sbx_limits *defaults,
                                 unsigned given);
/* Refuses (-EINVAL, invalid_request) a request or message that names a
 * session, for the front ends that serve none (HTTP, batch). */
int json_request_no_session(const struct json_request *r, struct sbx_error *err);

/* Member |field| of |o|, a session's name: 0 with *name pointing into |o|,
 * or -EINVAL (invalid_request) saying what a name is. */
int json_session_name(json_t *o, const char *field, const char **name, struct sbx_error *err);
/* The session of a request or tool call: its name in |field| (none: *name
 * NULL) and "rollback" ("on_error" when not given; given alone, refused). */
int json_session_fields(json_t *o, const char *field, const char **name,
                        enum sbx_rollback *rollback, struct sbx_error *err);

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
/* A session cell's result: the result object with the id, then
 * "session": {"name": |name|, "cell": N, "rolled_back": bool}, and
 * "restored": true when the session was restored from its image for it. */
char *json_answer_session(const char *id_text, const struct sbx_result *res, const char *name,
                          bool restored);
/* {"id": ..., "session_closed": |name|}. */
char *json_answer_session_closed(const char *id_text, const char *name);
/* {"id": ..., "session_hibernated": {"name": |name|, "bytes": |bytes|}}. */
char *json_answer_session_hibernated(const char *id_text, const char *name, uint64_t bytes);
/* {"id": ..., "session_forked": {"from": |from|, "to": |to|, "cell": |cells|}}. */
char *json_answer_session_forked(const char *id_text, const char *from, const char *to,
                                 uint64_t cells);
/* Streaming: {"id": ..., "event": "stdout" | "stderr", "data": |text|}
 * for |stream| 1 or 2 (|text| valid UTF-8, as on_output gives it); and
 * {"id": ..., "event": "dropped", "stdout": N, "stderr": M}, the bytes of
 * events a reader too slow to take them did not get (the answer holds
 * them all). */
char *json_event_output(const char *id_text, int stream, const char *text, size_t len);
char *json_event_dropped(const char *id_text, const uint64_t dropped[2]);
/* A host tool's call: {"id": ..., "event": "tool_call", "call": N, "name":
 * |name|, "arguments": <|arguments|, a JSON object>}. */
char *json_event_tool_call(const char *id_text, uint64_t call, const char *name,
                           const char *arguments, size_t len);
/* Over HTTP, a run with tools: {"id": ..., "event": "started", "run_id": |run_id|}. */
char *json_event_started(const char *id_text, const char *run_id);
/* The refusal of a tool_result message: {"id": null, "tool_result": {"id":
 * <its id>, "call": N}, "error": ...} (never mistaken for the answer to the
 * request of that id). */
char *json_answer_tool_result_error(const char *id_text, uint64_t call,
                                    const struct sbx_error *err);
/* The refusal of a cancel message: {"id":null,"cancel":<its id>,"error":...}. */
char *json_answer_cancel_error(const char *cancel_text, const struct sbx_error *err);

#endif
