/*
 * Host tools: the channel between a run's code and its caller's tools.
 *
 * The code (pysbx.call_tool in the worker) writes calls on the worker's
 * request socket, which a run with tools keeps open; the supervisor reads
 * them here, numbers them, refuses what the run does not allow and hands
 * the rest to the caller's on_tool_call; the caller's answers
 * (sbx_tool_answer, from any thread) come back through the run's
 * sbx_tool_answers and are written to the code. Frames both ways: a
 * little-endian uint32 length, then that many bytes of JSON.
 *
 * The worst sender: the code has run, so everything on the socket is the
 * code's to forge. What it can do with it: make calls (numbered by the
 * supervisor in the order read, never by what the code says), at most
 * max_tool_calls of them reaching the caller, each with a JSON object of
 * arguments of at most max_tool_bytes, nested at most SBX_MAX_TOOL_DEPTH
 * deep, under a name the caller declared;
 * anything else (an unknown name, a frame that is not such an object) is
 * answered to the code as an error and reaches no one, and a frame longer
 * than max_tool_bytes closes the channel. It cannot answer a call (answers
 * come from the caller only), make the supervisor wait (the socket is
 * non-blocking both ways) or grow its memory without bound (while more
 * than 64 KiB of answers wait for the code to read them, its calls are not
 * read: it blocks on its own writes; the caller's answers are bounded by
 * max_tool_calls and max_tool_bytes), nor pass descriptors (read without
 * room for them, the kernel drops them).
 */
#ifndef PYSBX_TOOLS_H
#define PYSBX_TOOLS_H

#include "pysbx.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tool_chan {
    const struct sbx_request *req;
    int fd;            /* the worker's request socket, non-blocking; -1 when done */
    bool reading;      /* calls are still read */
    uint64_t calls;    /* frames read: each call's number */
    unsigned char *in; /* the frame being read: its length, then its body */
    size_t in_len, in_need;
    char *out; /* frames on their way to the code */
    size_t out_len, out_off, out_cap;
};

/* Whether |a| is attached to a run in flight (a request may not share it). */
bool tool_answers_busy(struct sbx_tool_answers *a);
/* Nothing attached: no tools, or none yet. */
void tool_chan_init(struct tool_chan *t, const struct sbx_request *req);
/* Takes |fd| (the request socket, the request written) for the run's calls,
 * and makes the request's answers the run's. Returns 0 or -errno (|fd|
 * closed). */
int tool_chan_start(struct tool_chan *t, int fd);
/* What poll() should watch on t->fd (0: nothing), and the answers'
 * eventfd (-1: none). */
short tool_chan_events(const struct tool_chan *t);
int tool_chan_answers_fd(const struct tool_chan *t);
/* The socket is ready (|revents|), or the answers' eventfd is (|answers|):
 * reads calls and hands them on, moves answers out, writes what it can. */
void tool_chan_ready(struct tool_chan *t, short revents, bool answers);
/* The run is over: its calls can no longer be answered; closes the socket
 * and frees the buffers. */
void tool_chan_end(struct tool_chan *t);

#endif
