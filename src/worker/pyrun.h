/*
 * The worker's Python: made ready while idle, then running one request's
 * code and ending the process the way python3 would.
 */
#ifndef PYSBX_PYRUN_H
#define PYSBX_PYRUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* In an idle worker, before any request: points HOME and TMPDIR at the
 * workspace, USER and LOGNAME at |user| (the name /etc/passwd gives its
 * uid) and, with |rehearse|, runs a small snippet of our own so that
 * the copy-on-write faults it takes are not on the request path (a single
 * run, whose request is already waiting, skips that). |devnull| receives
 * the snippet's output. |warm_code| (or NULL): more of our own to run
 * while idle, the package set's rehearsal again, so that this worker's
 * copies of what a table and a chart write are made now. Returns 0 or -errno with a message in
 * |err|. */
int pyrun_prepare(const char *workspace, const char *user, bool rehearse, const char *warm_code,
                  int devnull, char *err, size_t errlen);

/* Compiles and runs |code| as __main__, then ends the process the way
 * python3 would: exit status 0, the sys.exit() code, or 1 after printing an
 * uncaught exception's traceback; non-daemon threads are joined and atexit
 * handlers run first. An uncaught MemoryError ends with WIRE_NOMEM_SIGNAL.
 * When the last statement is an expression, its repr() goes to the
 * supervisor (WIRE_VALUE_FILE) instead of being thrown away; figures left
 * open are saved (figures.h). Takes ownership of |code| (malloc'd).
 * |output_chars|: the run's max_output_chars (pyrun_stdout_install);
 * |args|: sys.argv[1:]; |filename|: the program's name, or NULL (see
 * sbx_request.filename). */
/* A run with host tools: makes the module pysbx (pysbx.tools, call_tool,
 * ToolError) over descriptor |fd|, for the tools of |tools_json|. Before the
 * code runs. Returns 0, or -1 with |err| set. */
int pyrun_tools(int fd, const char *tools_json, char *err, size_t cap);
_Noreturn void pyrun_main(char *code, size_t len, uint64_t output_chars, char *const *args,
                          uint32_t n_args, const char *filename);

/* How a program ended, as Python held it: sys.exit()'s integer (0 for
 * None and a program that ran to its end, 1 for an uncaught exception or
 * sys.exit() of anything but an integer), whole when it fits in 64 bits
 * (sys.exit(256) is 256, not the kernel's 0); past them, |past| is set and
 * |value| is INT64_MAX (above) or -1 (below). Either way its low eight bits
 * are the exit status python3 would end with. */
struct pyrun_exit {
    int64_t value;
    bool past;
};

/* A session's cell: as pyrun_main, but returns how the code ended instead
 * of ending the process (an uncaught MemoryError still ends it), without
 * waiting for threads or running exit hooks. */
struct pyrun_exit pyrun_cell(char *code, size_t len, uint64_t output_chars, char *const *args,
                             uint32_t n_args, const char *filename);

/* In the template: sys.stdout as every run has it, line-buffered for the
 * first |output_chars| characters a run writes (the run's
 * max_output_chars, given to pyrun_main), then in blocks; sys.stdout and
 * sys.stderr both say what python3's say on pipes. Returns 0, or -1 with a
 * Python exception. */
int pyrun_stdout_install(void);

/* The pending Python exception as "|what|: Type: message" in |err|; clears
 * it. Returns -EIO, for `return pyrun_error_text(...)`. */
int pyrun_error_text(const char *what, char *err, size_t errlen);

#endif
