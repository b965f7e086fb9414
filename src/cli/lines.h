/* Reading newline-delimited messages with a bound on their length: a line
 * over the bound is skipped to its end without being held in memory. */
#ifndef PYSBX_LINES_H
#define PYSBX_LINES_H

#include <stdbool.h>
#include <stddef.h>

struct line_reader {
    int fd;
    size_t max; /* longest line accepted, in bytes */
    /* -1, or a descriptor whose becoming readable ends the input: the lines
     * already whole in the buffer are still returned, nothing more is read,
     * and a part line is dropped. */
    int stop_fd;
    char *buf;
    size_t len, cap, start;
    bool discarding, eof, stopped;
};

void line_reader_init(struct line_reader *lr, int fd, size_t max);
void line_reader_free(struct line_reader *lr);

enum line_result { LINE_OK, LINE_TOO_LONG, LINE_END, LINE_ERROR };

/* The next line (without its newline; valid until the next call), or
 * LINE_TOO_LONG once for a line that was skipped, or LINE_END. */
enum line_result line_next(struct line_reader *lr, const char **line, size_t *len);

#endif
