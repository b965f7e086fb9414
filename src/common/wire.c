#define _GNU_SOURCE
#include "wire.h"

#include "util.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A cell's WIRE_WORKER: its own, and one for each kept file. */
#define WIRE_MAX_FDS (WFD_SESSION_COUNT + WIRE_HELD_MAX)

int wire_send(int sock, const void *msg, size_t len, const int *fds, int nfds)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * WIRE_MAX_FDS)];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = (void *)msg, .iov_len = len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

    if (nfds < 0 || nfds > WIRE_MAX_FDS)
        return -EINVAL;
    if (nfds > 0) {
        memset(&ctl, 0, sizeof(ctl));
        mh.msg_control = ctl.buf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    for (;;) {
        ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL);
        if (n >= 0)
            return (size_t)n == len ? 0 : -EMSGSIZE;
        if (errno != EINTR)
            return -errno;
    }
}

ssize_t wire_recv_one(int sock, void *buf, size_t cap, int *fd)
{
    int nfds = 0;
    ssize_t n = wire_recv(sock, buf, cap, fd, 1, &nfds);

    if (nfds == 0)
        *fd = -1;
    return n;
}

ssize_t wire_recv(int sock, void *buf, size_t cap, int *fds, int maxfds, int *nfds)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * WIRE_MAX_FDS)];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = cap};
    struct msghdr mh = {
        .msg_iov = &iov,
        .msg_iovlen = 1,
        .msg_control = ctl.buf,
        .msg_controllen = sizeof(ctl.buf),
    };
    ssize_t n;
    int got = 0;
    int rc;

    *nfds = 0;
    do {
        n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;

    rc = (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ? -EMSGSIZE : 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const unsigned char *p = CMSG_DATA(c);
        for (size_t i = 0; i < count; i++) {
            int fd;
            memcpy(&fd, p + i * sizeof(int), sizeof(int));
            if (got < maxfds)
                fds[got++] = fd;
            else {
                /* More than the message may carry: never leak them. */
                close(fd);
                rc = -EMSGSIZE;
            }
        }
    }
    *nfds = got;
    if (rc < 0) {
        for (int i = 0; i < got; i++)
            close(fds[i]);
        *nfds = 0;
        return rc;
    }
    return n;
}

/* A FAIL's text as |why|. It becomes an error's message or a result's
 * reason, both JSON strings: only its valid UTF-8 is kept (it may name a
 * path of any bytes, and |cap| may cut it inside a character). */
static int fail_text(struct wire_fail *f, char *why, size_t cap)
{
    f->text[sizeof(f->text) - 1] = '\0';
    errmsg(why, cap, -EIO, "%s", f->text);
    if (why && cap)
        utf8_terminate(why);
    return -EIO;
}

int wire_decode_hello(const void *buf, size_t n, struct wire_hello *out, char *why, size_t cap)
{
    union {
        struct wire_hello hello;
        struct wire_fail fail;
    } m;

    /* What was not sent reads as zeros, so a short FAIL's text ends. */
    memset(&m, 0, sizeof(m));
    memcpy(&m, buf, n < sizeof(m) ? n : sizeof(m));
    if (n >= sizeof(struct wire_hdr) && n <= sizeof(m) && m.hello.hdr.type == WIRE_FAIL)
        return fail_text(&m.fail, why, cap);
    if (n != sizeof(m.hello) || m.hello.hdr.type != WIRE_HELLO ||
        m.hello.hdr.version != WIRE_VERSION)
        return errmsg(why, cap, -EIO,
                      "the template ended before it was ready (is it the same version?)");
    m.hello.python_version[sizeof(m.hello.python_version) - 1] = '\0';
    m.hello.libseccomp_version[sizeof(m.hello.libseccomp_version) - 1] = '\0';
    for (int i = 0; i < WIRE_LAYERS; i++)
        m.hello.layers[i].detail[sizeof(m.hello.layers[i].detail) - 1] = '\0';
    *out = m.hello;
    return 0;
}

int wire_decode_worker(const void *buf, size_t n, int nfds, struct wire_worker *out, char *why,
                       size_t cap)
{
    return wire_decode_worker_fds(buf, n, nfds, WFD_COUNT, out, why, cap);
}

/* |buf| of |n| bytes, from the template: the message of |type|, exactly
 * |size| bytes, copied to |out| (1); or a failure it sent (WIRE_FAIL, or
 * |fail_too| when not 0), its text in |why| (-EIO); or anything else
 * (-EPROTO). */
static int decode_reply(const void *buf, size_t n, uint32_t type, size_t size, uint32_t fail_too,
                        void *out, char *why, size_t cap)
{
    struct wire_hdr h = {0};
    struct wire_fail f;

    memcpy(&h, buf, n < sizeof(h) ? n : sizeof(h));
    if (n > 0 && h.type == type && n == size) {
        memcpy(out, buf, size);
        return 1;
    }
    if ((h.type == WIRE_FAIL || (fail_too && h.type == fail_too)) && n == sizeof(f)) {
        memcpy(&f, buf, sizeof(f));
        return fail_text(&f, why, cap);
    }
    return errmsg(why, cap, -EPROTO, "malformed message from the template");
}

int wire_decode_worker_fds(const void *buf, size_t n, int nfds, int want, struct wire_worker *out,
                           char *why, size_t cap)
{
    struct wire_worker w;
    int rc = decode_reply(buf, n, WIRE_WORKER, sizeof(w), 0, &w, why, cap);

    if (rc == 1 && nfds != want)
        rc = errmsg(why, cap, -EPROTO, "malformed message from the template");
    if (rc == 1) {
        w.workspace[sizeof(w.workspace) - 1] = '\0';
        *out = w;
        rc = 0;
    }
    return rc;
}

int wire_decode_session(const void *buf, size_t n, struct wire_session *out, char *why, size_t cap)
{
    struct wire_session s;
    int rc = decode_reply(buf, n, WIRE_SESSION, sizeof(s), WIRE_ENDED, &s, why, cap);

    if (rc == 1) {
        *out = s;
        rc = 0;
    }
    return rc;
}

int wire_decode_status(const void *buf, size_t n, struct wire_status *out)
{
    struct wire_status st;

    if (n != sizeof(st))
        return -EPROTO;
    memcpy(&st, buf, sizeof(st));
    if (st.magic != WIRE_STATUS_MAGIC)
        return -EPROTO;
    *out = st;
    return 0;
}
