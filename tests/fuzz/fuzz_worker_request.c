/* The request stream a worker reads from the supervisor: request_read, the
 * very function the worker runs, writing the input files beneath a fresh
 * workspace. Whatever the bytes: nothing is made outside the workspace; a
 * failure says why in one line for stderr; a success has read exactly the
 * code the stream carried and made exactly its files, with their bytes. */
#define _GNU_SOURCE
#include "fuzz.h"
#include "request.h"
#include "sysutil.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int parent_fd = -1; /* holds the workspace "w" and nothing else */
static int stream_fd = -1; /* the request stream: a memfd */
static char parent_path[4096];

static void cleanup(void)
{
    (void)rmdir(parent_path);
}

static void setup(void)
{
    const char *tmp = getenv("TMPDIR");

    fmt(parent_path, sizeof(parent_path), "%s/pysbx-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    CHECK(mkdtemp(parent_path));
    parent_fd = open(parent_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    CHECK(parent_fd >= 0);
    atexit(cleanup);
    stream_fd = memfd_create("request", MFD_CLOEXEC);
    CHECK(stream_fd >= 0);
}

/* Regular files beneath |dirfd|, counted; each name must pass name_problem. */
static size_t count_files(int dirfd, const char *prefix)
{
    DIR *d = fdopendir(dup(dirfd));
    struct dirent *e;
    size_t count = 0;

    CHECK(d);
    rewinddir(d); /* the offset is shared with |dirfd|, which may have been read */
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char rel[8192];
        fmt(rel, sizeof(rel), "%s%s", prefix, e->d_name);
        CHECK(!name_problem(rel, strlen(rel)));
        struct stat st;
        CHECK(fstatat(dirfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0);
        if (S_ISDIR(st.st_mode)) {
            int sub = openat(dirfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            CHECK(sub >= 0);
            strcat(rel, "/");
            count += count_files(sub, rel);
            close(sub);
        } else {
            CHECK(S_ISREG(st.st_mode));
            count++;
        }
    }
    closedir(d);
    return count;
}

/* A success: the code and each file as the stream spells them. */
static void check_success(const uint8_t *data, size_t size, const struct wire_req *req,
                          const char *code, int ws_fd)
{
    size_t off = sizeof(*req);

    CHECK(size >= off && memcmp(req, data, sizeof(*req)) == 0);
    CHECK(req->magic == WIRE_REQ_MAGIC && req->version == WIRE_VERSION);
    CHECK(req->code_len <= size - off && memcmp(code, data + off, req->code_len) == 0);
    CHECK(code[req->code_len] == '\0');
    off += req->code_len;
    for (uint32_t i = 0; i < req->n_files; i++) {
        struct wire_file f;
        char name[WIRE_FILE_NAME_MAX + 1];
        CHECK(size - off >= sizeof(f));
        memcpy(&f, data + off, sizeof(f));
        off += sizeof(f);
        CHECK(f.name_len > 0 && f.name_len <= WIRE_FILE_NAME_MAX && f.name_len <= size - off);
        memcpy(name, data + off, f.name_len);
        name[f.name_len] = '\0';
        off += f.name_len;
        CHECK(!name_problem(name, f.name_len));
        CHECK(f.data_len <= size - off);
        int fd = openat(ws_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        CHECK(fd >= 0);
        struct stat st;
        CHECK(fstat(fd, &st) == 0 && (uint64_t)st.st_size == f.data_len);
        char *got = malloc(f.data_len + 1);
        CHECK(got && read_full(fd, got, f.data_len) == (ssize_t)f.data_len);
        CHECK(memcmp(got, data + off, f.data_len) == 0);
        free(got);
        close(fd);
        off += f.data_len;
    }
    CHECK(count_files(ws_fd, "") == req->n_files);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct wire_req req;
    char why[WIRE_TEXT_MAX];
    char *code = NULL;

    if (parent_fd < 0)
        setup();
    CHECK(ftruncate(stream_fd, 0) == 0 && lseek(stream_fd, 0, SEEK_SET) == 0);
    CHECK(write_full(stream_fd, data, size) == 0 && lseek(stream_fd, 0, SEEK_SET) == 0);
    CHECK(mkdirat(parent_fd, "w", 0700) == 0);
    int ws_fd = openat(parent_fd, "w", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    CHECK(ws_fd >= 0);

    why[0] = '\0';
    int rc = request_read(stream_fd, ws_fd, false, &req, &code, why, sizeof(why));
    if (rc == 0) {
        check_success(data, size, &req, code, ws_fd);
        /* Then the arguments, the name and stdin: all of them, or a message. */
        struct request_input in;
        why[0] = '\0';
        if (request_read_input(stream_fd, ws_fd, &req, &in, why, sizeof(why)) == 0) {
            CHECK(in.n_args == req.n_args && (req.stdin_len == 0) == (in.stdin_fd < 0));
            for (uint32_t i = 0; i < in.n_args; i++)
                CHECK(in.args[i] != NULL);
            /* The program's name: all of its bytes, none of them NUL. */
            CHECK((req.filename_len == 0) == (in.filename == NULL));
            CHECK(!in.filename || strlen(in.filename) == req.filename_len);
            if (in.stdin_fd >= 0)
                CHECK(lseek(in.stdin_fd, 0, SEEK_END) == (off_t)req.stdin_len);
        } else {
            CHECK(strncmp(why, "pysbx: ", 7) == 0 && strnlen(why, sizeof(why)) < sizeof(why));
        }
        request_input_free(&in);
        CHECK(count_files(ws_fd, "") == req.n_files);
    } else {
        CHECK(code == NULL);
        if (rc == -ENODATA) {
            CHECK(size == 0);
        } else {
            CHECK(strncmp(why, "pysbx: ", 7) == 0 && strnlen(why, sizeof(why)) < sizeof(why));
        }
        (void)count_files(ws_fd, "");
    }
    free(code);
    close(ws_fd);

    /* Nothing but the workspace beside it. */
    DIR *d = fdopendir(dup(parent_fd));
    struct dirent *e;
    CHECK(d);
    while ((e = readdir(d)))
        CHECK(strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
              strcmp(e->d_name, "w") == 0);
    closedir(d);
    CHECK(remove_tree_at(parent_fd, "w") == 0);
    return 0;
}
