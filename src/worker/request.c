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

/* |name| beneath |ws_fd| made afresh: with |replace|, whatever is there (a
 * file, a link, a FIFO; not a directory) goes first. A session's later
 * cell gets the input it was sent, not the one an earlier cell had. */
static int create_input(int ws_fd, const char *name, bool replace)
{
    int out = open_beneath(ws_fd, name, O_WRONLY | O_CREAT | O_EXCL, 0644, true);

    if (out != -EEXIST || !replace)
        return out;
    const char *slash = strrchr(name, '/');
    int dir = ws_fd;
    if (slash) {
        char parent[WIRE_FILE_NAME_MAX + 1];
        memcpy(parent, name, (size_t)(slash - name));
        parent[slash - name] = '\0';
        dir = open_beneath(ws_fd, parent, O_RDONLY | O_DIRECTORY, 0, false);
        if (dir < 0)
            return dir;
    }
    int rc = unlinkat(dir, slash ? slash + 1 : name, 0) < 0 ? -errno : 0;
    if (dir != ws_fd)
        close(dir);
    if (rc < 0)
        return rc;
    return open_beneath(ws_fd, name, O_WRONLY | O_CREAT | O_EXCL, 0644, true);
}

static int read_input_files(int fd, int ws_fd, uint32_t n, bool replace, char *why, size_t cap)
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
        int out = create_input(ws_fd, name, replace);
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

int request_read(int fd, int ws_fd, bool replace, struct wire_req *req, char **code, char *why,
                 size_t cap)
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
        rc = read_input_files(fd, ws_fd, req->n_files, replace, why, cap);
    }
    if (rc < 0) {
        free(*code);
        *code = NULL;
    }
    return rc;
}

void request_input_free(struct request_input *in)
{
    for (uint32_t i = 0; in->args && i < in->n_args; i++)
        free(in->args[i]);
    free(in->args);
    in->args = NULL;
    in->n_args = 0;
    free(in->filename);
    in->filename = NULL;
    free(in->tools);
    in->tools = NULL;
    if (in->stdin_fd >= 0)
        close(in->stdin_fd);
    in->stdin_fd = -1;
}

/* A file beneath |ws_fd| that has no name, open for reading and writing:
 * O_TMPFILE, else a name taken and let go at once. */
static int unnamed_file(int ws_fd)
{
    int fd = openat(ws_fd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);

    if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR))
        return fd >= 0 ? fd : -errno;
    fd = open_beneath(ws_fd, ".pysbx-stdin", O_RDWR | O_CREAT | O_EXCL, 0600, false);
    if (fd >= 0)
        (void)unlinkat(ws_fd, ".pysbx-stdin", 0);
    return fd;
}

int request_read_input(int fd, int ws_fd, const struct wire_req *req, struct request_input *in,
                       char *why, size_t cap)
{
    static char buf[FILE_COPY_CHUNK];
    uint64_t total = 0;

    *in = (struct request_input){.stdin_fd = -1};
    if (req->n_args > SBX_MAX_ARGS || req->stdin_len > SBX_MAX_REQUEST_BYTES)
        return errmsg(why, cap, -EPROTO, "pysbx: malformed request (input)\n");
    if (req->n_args && !(in->args = calloc(req->n_args, sizeof(char *))))
        return errmsg(why, cap, -ENOMEM, "pysbx: out of memory reading the arguments\n");
    for (uint32_t i = 0; i < req->n_args; i++) {
        uint32_t len;
        if (read_full(fd, &len, sizeof(len)) != (ssize_t)sizeof(len) ||
            (total += len) > SBX_MAX_REQUEST_BYTES)
            return errmsg(why, cap, -EPROTO, "pysbx: malformed request (argument)\n");
        in->n_args = i + 1;
        if (!(in->args[i] = malloc((size_t)len + 1)))
            return errmsg(why, cap, -ENOMEM, "pysbx: out of memory reading the arguments\n");
        if (read_full(fd, in->args[i], len) != (ssize_t)len)
            return errmsg(why, cap, -EPROTO, "pysbx: malformed request (argument cut short)\n");
        in->args[i][len] = '\0';
    }
    if (req->filename_len) {
        if (req->filename_len > WIRE_FILE_NAME_MAX)
            return errmsg(why, cap, -EPROTO, "pysbx: malformed request (file name)\n");
        if (!(in->filename = malloc(req->filename_len + 1)))
            return errmsg(why, cap, -ENOMEM, "pysbx: out of memory reading the file name\n");
        if (read_full(fd, in->filename, req->filename_len) != (ssize_t)req->filename_len ||
            memchr(in->filename, '\0', req->filename_len))
            return errmsg(why, cap, -EPROTO, "pysbx: malformed request (file name cut short)\n");
        in->filename[req->filename_len] = '\0';
    }
    if (req->tools_len) {
        if (req->tools_len > WIRE_TOOLS_MAX)
            return errmsg(why, cap, -EPROTO, "pysbx: malformed request (tools)\n");
        if (!(in->tools = malloc(req->tools_len + 1)))
            return errmsg(why, cap, -ENOMEM, "pysbx: out of memory reading the tools\n");
        if (read_full(fd, in->tools, req->tools_len) != (ssize_t)req->tools_len)
            return errmsg(why, cap, -EPROTO, "pysbx: malformed request (tools cut short)\n");
        in->tools[req->tools_len] = '\0';
    }
    if (!req->stdin_len)
        return 0;
    in->stdin_fd = unnamed_file(ws_fd);
    if (in->stdin_fd < 0)
        return errmsg(why, cap, in->stdin_fd, "pysbx: standard input: %s\n",
                      strerror(-in->stdin_fd));
    for (uint64_t left = req->stdin_len; left > 0;) {
        size_t want = left < sizeof(buf) ? (size_t)left : sizeof(buf);
        if (read_full(fd, buf, want) != (ssize_t)want)
            return errmsg(why, cap, -EPROTO, "pysbx: malformed request (stdin cut short)\n");
        int w = write_full(in->stdin_fd, buf, want);
        if (w < 0)
            return errmsg(why, cap, w, "pysbx: standard input: %s\n", strerror(-w));
        left -= want;
    }
    if (lseek(in->stdin_fd, 0, SEEK_SET) < 0)
        return errmsg(why, cap, -errno, "pysbx: standard input: %s\n", strerror(errno));
    return 0;
}
