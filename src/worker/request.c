#define _GNU_SOURCE
#include "request.h"

#include "pysbx.h"
#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Input files are copied from the request socket in pieces of this size. */
#define FILE_COPY_CHUNK 65536

static int read_input_files(int fd, int ws_fd, uint32_t n, char *why, size_t cap)
{
    char name[WIRE_FILE_NAME_MAX + 1];
    static char buf[FILE_COPY_CHUNK];

    for (uint32_t i = 0; i < n; i++) {
        struct wire_file f;
        ssize_t got = read_full(fd, &f, sizeof(f));
        if (got != (ssize_t)sizeof(f) || f.name_len == 0 || f.name_len > WIRE_FILE_NAME_MAX)
            return errmsg(why, cap, -EPROTO, "pysbx: malformed request (file header)\n");
        if (read_full(fd, name, f.name_len) != (ssize_t)f.name_len)
            return errmsg(why, cap, -EPROTO, "pysbx: malformed request (file name)\n");
        name[f.name_len] = '\0';
        const char *problem = name_problem(name, f.name_len);
        if (problem)
            return errmsg(why, cap, -EINVAL, "pysbx: input file %s: %s\n", name, problem);
        int out = open_beneath(ws_fd, name, O_WRONLY | O_CREAT | O_EXCL, 0644, true);
        if (out < 0)
            return errmsg(why, cap, out, "pysbx: input file %s: %s\n", name, strerror(-out));
        uint64_t left = f.data_len;
        while (left > 0) {
            size_t want = left < sizeof(buf) ? (size_t)left : sizeof(buf);
            ssize_t r = read_full(fd, buf, want);
            if (r != (ssize_t)want) {
                close(out);
                return errmsg(why, cap, -EPROTO, "pysbx: malformed request (file %s cut short)\n",
                              name);
            }
            int w = write_full(out, buf, want);
            if (w < 0) {
                close(out);
                return errmsg(why, cap, w, "pysbx: input file %s: %s\n", name, strerror(-w));
            }
            left -= want;
        }
        close(out);
    }
    return 0;
}

int request_read(int fd, int ws_fd, struct wire_req *req, char **code, char *why, size_t cap)
{
    ssize_t got = read_full(fd, req, sizeof(*req));
    int rc;

    *code = NULL;
    if (got == 0)
        return -ENODATA;
    if (got != (ssize_t)sizeof(*req) || req->magic != WIRE_REQ_MAGIC ||
        req->version != WIRE_VERSION)
        return errmsg(why, cap, -EPROTO, "pysbx: malformed request header\n");
    if (req->code_len > SBX_MAX_CODE_BYTES)
        return errmsg(why, cap, -E2BIG, "pysbx: code too large\n");
    *code = malloc(req->code_len + 1);
    if (!*code)
        return errmsg(why, cap, -ENOMEM, "pysbx: out of memory reading the code\n");
    if (read_full(fd, *code, req->code_len) != (ssize_t)req->code_len)
        rc = errmsg(why, cap, -EPROTO, "pysbx: malformed request (code cut short)\n");
    else {
        (*code)[req->code_len] = '\0';
        rc = read_input_files(fd, ws_fd, req->n_files, why, cap);
    }
    if (rc < 0) {
        free(*code);
        *code = NULL;
    }
    return rc;
}
