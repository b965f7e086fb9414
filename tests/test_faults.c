/*
 * Fault injection in the supervisor: the library is linked with its system
 * calls and allocator wrapped (-Wl,--wrap=...), and the Nth call after a
 * point is made to fail (EINTR, EIO, EAGAIN, a short count, or no memory).
 * Whatever fails, every request ends in exactly one result or one error,
 * and nothing leaks: descriptors are back to their count when the sandbox
 * closes, and the sanitizer build's leak checker sees no lost memory.
 */
#define _GNU_SOURCE
#include "helpers.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* The wrappers the linker substitutes (-Wl,--wrap=NAME). */
ssize_t __wrap_read(int fd, void *buf, size_t n);
ssize_t __wrap_write(int fd, const void *buf, size_t n);
ssize_t __wrap_recvmsg(int fd, struct msghdr *m, int flags);
ssize_t __wrap_sendmsg(int fd, const struct msghdr *m, int flags);
int __wrap_poll(struct pollfd *p, nfds_t n, int timeout);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);

enum fn { F_NONE, F_READ, F_WRITE, F_RECVMSG, F_SENDMSG, F_POLL, F_MALLOC, F_CALLOC };

static __thread bool armed; /* only the calls of the thread under test */
static __thread enum fn target;
static __thread int countdown; /* fail when it reaches 0 */
static __thread int inject;    /* the errno; 0: a short count */
static __thread int injected;

static bool fail_now(enum fn f)
{
    if (!armed || target != f || countdown < 0)
        return false;
    if (countdown-- > 0)
        return false;
    injected++;
    return true;
}

ssize_t __real_read(int fd, void *buf, size_t n);
ssize_t __wrap_read(int fd, void *buf, size_t n)
{
    if (fail_now(F_READ)) {
        if (!inject && n > 1)
            return __real_read(fd, buf, n / 2);
        errno = inject;
        return -1;
    }
    return __real_read(fd, buf, n);
}

ssize_t __real_write(int fd, const void *buf, size_t n);
ssize_t __wrap_write(int fd, const void *buf, size_t n)
{
    if (fail_now(F_WRITE)) {
        if (!inject && n > 1)
            return __real_write(fd, buf, n / 2);
        errno = inject;
        return -1;
    }
    return __real_write(fd, buf, n);
}

ssize_t __real_recvmsg(int fd, struct msghdr *m, int flags);
ssize_t __wrap_recvmsg(int fd, struct msghdr *m, int flags)
{
    if (fail_now(F_RECVMSG)) {
        errno = inject ? inject : EAGAIN;
        return -1;
    }
    return __real_recvmsg(fd, m, flags);
}

ssize_t __real_sendmsg(int fd, const struct msghdr *m, int flags);
ssize_t __wrap_sendmsg(int fd, const struct msghdr *m, int flags)
{
    if (fail_now(F_SENDMSG)) {
        errno = inject ? inject : EAGAIN;
        return -1;
    }
    return __real_sendmsg(fd, m, flags);
}

int __real_poll(struct pollfd *p, nfds_t n, int timeout);
int __wrap_poll(struct pollfd *p, nfds_t n, int timeout)
{
    if (fail_now(F_POLL)) {
        errno = inject ? inject : EINTR;
        return -1;
    }
    return __real_poll(p, n, timeout);
}

void *__real_malloc(size_t n);
void *__wrap_malloc(size_t n)
{
    if (fail_now(F_MALLOC))
        return NULL;
    return __real_malloc(n);
}

void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size)
{
    if (fail_now(F_CALLOC))
        return NULL;
    return __real_calloc(n, size);
}

static const struct {
    enum fn f;
    const char *name;
    int err;
} faults[] = {
    {F_READ, "read EINTR", EINTR},       {F_READ, "read EIO", EIO},
    {F_READ, "read short", 0},           {F_WRITE, "write EINTR", EINTR},
    {F_WRITE, "write EIO", EIO},         {F_WRITE, "write short", 0},
    {F_RECVMSG, "recvmsg EINTR", EINTR}, {F_RECVMSG, "recvmsg EAGAIN", EAGAIN},
    {F_SENDMSG, "sendmsg EIO", EIO},     {F_POLL, "poll EINTR", EINTR},
    {F_POLL, "poll ENOMEM", ENOMEM},     {F_MALLOC, "malloc NULL", 0},
    {F_CALLOC, "calloc NULL", 0},
};

static void every_injected_fault_ends_in_one_answer_and_leaks_nothing(void **state)
{
    (void)state;
    char root[256];
    struct sbx_config cfg;
    struct sbx_error err = {0};
    struct sbx *sbx = NULL;
    unsigned results = 0, errors = 0, fired = 0;

    make_temp_dir(root, sizeof(root));
    chmod(root, 0711);
    int fds_before = count_fds();
    test_config_init(&cfg, root);
    assert_int_equal(sbx_open(&cfg, &sbx, &err), 0);
    const struct sbx_file in = {"in.txt", "input", 5};
    for (size_t k = 0; k < sizeof(faults) / sizeof(faults[0]); k++) {
        for (int nth = 0; nth < 12; nth++) {
            struct sbx_request req;
            struct sbx_result *res = NULL;
            memset(&err, 0, sizeof(err));
            sbx_request_init(&req);
            req.code = "print(open('in.txt').read())\nopen('out', 'w').write('o')\n";
            req.code_len = strlen(req.code);
            req.files = &in;
            req.n_files = 1;
            req.limits.wall_seconds = 5;
            target = faults[k].f;
            countdown = nth;
            inject = faults[k].err;
            injected = 0;
            armed = true;
            int rc = sbx_run(sbx, &req, &res, &err);
            armed = false;
            fired += (unsigned)injected;
            /* Exactly one answer: a result, or an error with a code. */
            if (rc == 0) {
                assert_non_null(res);
                assert_true(res->status <= SBX_SANDBOX_ERROR);
                assert_true((res->status == SBX_COMPLETED) == (res->reason == NULL));
                results++;
            } else {
                assert_null(res);
                assert_true(err.code != SBX_ERR_NONE);
                errors++;
            }
            sbx_result_free(res);
        }
    }
    sbx_close(sbx);
    fprintf(stderr, "faults: %u injected, %u results, %u errors\n", fired, results, errors);
    assert_true(fired > 0);
    assert_int_equal(count_fds(), fds_before);
    assert_int_equal(count_entries(root), 0);
    rmdir(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_injected_fault_ends_in_one_answer_and_leaks_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
