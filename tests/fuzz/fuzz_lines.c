/* The bounded line reader under serve, batch and mcp: the first input byte
 * sets the longest line accepted, the rest is the stream. It hands back
 * exactly the stream's lines in order, each within the bound, and reports
 * each longer one once as LINE_TOO_LONG without holding it; then LINE_END. */
#define _GNU_SOURCE
#include "fuzz.h"
#include "lines.h"
#include "sysutil.h"

#include <sys/mman.h>
#include <unistd.h>

static int stream_fd = -1;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct line_reader lr;

    if (size < 1)
        return 0;
    if (stream_fd < 0)
        CHECK((stream_fd = memfd_create("lines", MFD_CLOEXEC)) >= 0);
    size_t max = data[0];
    data++;
    size--;
    CHECK(ftruncate(stream_fd, 0) == 0 && lseek(stream_fd, 0, SEEK_SET) == 0);
    CHECK(write_full(stream_fd, data, size) == 0 && lseek(stream_fd, 0, SEEK_SET) == 0);

    line_reader_init(&lr, stream_fd, max);
    size_t start = 0;
    for (;;) {
        const char *line = NULL;
        size_t len = 0;
        enum line_result r = line_next(&lr, &line, &len);
        if (start >= size) {
            CHECK(r == LINE_END);
            break;
        }
        /* The next line of the stream, read independently. */
        const uint8_t *nl = memchr(data + start, '\n', size - start);
        size_t want = nl ? (size_t)(nl - (data + start)) : size - start;
        if (want > max) {
            CHECK(r == LINE_TOO_LONG);
        } else {
            CHECK(r == LINE_OK);
            CHECK(len == want && (len == 0 || memcmp(line, data + start, len) == 0));
        }
        start += want + 1;
    }
    line_reader_free(&lr);
    return 0;
}
