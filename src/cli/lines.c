#include "lines.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void line_reader_init(struct line_reader *lr, int fd, size_t max)
{
    memset(lr, 0, sizeof(*lr));
    lr->fd = fd;
    lr->max = max;
    lr->stop_fd = -1;
}

/* Waits until |lr|'s descriptor can be read; false once stop_fd says to stop. */
static bool may_read(struct line_reader *lr)
{
    struct pollfd p[2] = {{lr->fd, POLLIN, 0}, {lr->stop_fd, POLLIN, 0}};

    if (lr->stop_fd < 0)
        return true;
    while (poll(p, 2, -1) < 0)
        if (errno != EINTR)
            return true; /* let read() say what is wrong */
    if (p[1].revents)
        lr->stopped = true;
    return !lr->stopped;
}

void line_reader_free(struct line_reader *lr)
{
    free(lr->buf);
    lr->buf = NULL;
}

enum line_result line_next(struct line_reader *lr, const char **line, size_t *len)
{
    for (;;) {
        /* A whole line in the buffer? */
        char *nl =
            lr->len > lr->start ? memchr(lr->buf + lr->start, '\n', lr->len - lr->start) : NULL;
        if (nl) {
            size_t n = (size_t)(nl - (lr->buf + lr->start));
            *line = lr->buf + lr->start;
            *len = n;
            lr->start += n + 1;
            if (lr->discarding) {
                lr->discarding = false;
                continue; /* the end of a line already reported as too long */
            }
            if (n > lr->max)
                return LINE_TOO_LONG;
            return LINE_OK;
        }
        if (lr->stopped)
            return LINE_END;
        if (lr->eof) {
            if (lr->len > lr->start && !lr->discarding) {
                /* A last line without its newline. */
                *line = lr->buf + lr->start;
                *len = lr->len - lr->start;
                lr->start = lr->len;
                return *len > lr->max ? LINE_TOO_LONG : LINE_OK;
            }
            return LINE_END;
        }
        /* Keep only the unread part. */
        if (lr->start) {
            memmove(lr->buf, lr->buf + lr->start, lr->len - lr->start);
            lr->len -= lr->start;
            lr->start = 0;
        }
        if (lr->len > lr->max) {
            /* Too long: forget it, skip to its newline, say so once. */
            bool first = !lr->discarding;
            lr->discarding = true;
            lr->len = 0;
            if (first)
                return LINE_TOO_LONG;
        }
        if (lr->len == lr->cap) {
            size_t cap = lr->cap ? lr->cap * 2 : 65536;
            char *b = realloc(lr->buf, cap);
            if (!b)
                return LINE_ERROR;
            lr->buf = b;
            lr->cap = cap;
        }
        if (!may_read(lr))
            continue; /* stopped: what is whole in the buffer, then the end */
        ssize_t n = read(lr->fd, lr->buf + lr->len, lr->cap - lr->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return LINE_ERROR;
        if (n == 0)
            lr->eof = true;
        lr->len += (size_t)n;
    }
}
