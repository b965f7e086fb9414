/* What the supervisor decodes of the template's messages: the answer to
 * CONFIG (HELLO or FAIL), each WORKER or FAIL (a session's cell's too), the
 * answer to a session's opening, and a worker's status. The
 * decoders read only the bytes they are given, accept only a message of the
 * exact size and type (with all its descriptors), hand back strings that
 * end inside their arrays, and say why in a message that fits and is valid
 * UTF-8 (it becomes an error's message or a result's reason). The first
 * input byte is the descriptor count and the capacity for why. */
#include "fuzz.h"
#include "util.h"
#include "wire.h"

#include <errno.h>
#include <jansson.h>

/* By jansson's reading, not ours: a why goes into JSON. */
static int valid_utf8(const char *s)
{
    json_t *j = json_string(s);
    json_decref(j);
    return j != NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int nfds = data[0] % (WFD_SESSION_COUNT + 2);
    size_t cap = 1 + (size_t)data[0] * 4; /* 1..1021: some cut the message */
    size_t n = size - 1;
    char *buf = fuzz_copy(data + 1, n);
    char *why = malloc(cap);
    struct wire_hdr hdr = {0};
    CHECK(why);
    memcpy(&hdr, buf, n < sizeof(hdr) ? n : sizeof(hdr));

    struct wire_hello hello;
    int rc = wire_decode_hello(buf, n, &hello, why, cap);
    if (rc == 0) {
        CHECK(n == sizeof(hello) && hdr.type == WIRE_HELLO && hdr.version == WIRE_VERSION);
        CHECK(strnlen(hello.python_version, sizeof(hello.python_version)) <
              sizeof(hello.python_version));
        CHECK(strnlen(hello.libseccomp_version, sizeof(hello.libseccomp_version)) <
              sizeof(hello.libseccomp_version));
        for (int i = 0; i < WIRE_LAYERS; i++)
            CHECK(strnlen(hello.layers[i].detail, WIRE_LAYER_DETAIL_MAX) < WIRE_LAYER_DETAIL_MAX);
        CHECK(memcmp(&hello.workspace_bytes, buf + offsetof(struct wire_hello, workspace_bytes),
                     sizeof(hello.workspace_bytes)) == 0);
    } else {
        CHECK(rc == -EIO);
        CHECK(strnlen(why, cap) < cap);
        CHECK(valid_utf8(why));
        if (n >= sizeof(hdr) && hdr.type == WIRE_FAIL && n <= sizeof(struct wire_fail)) {
            /* The FAIL's own words, as far as they and |why| go. */
            size_t len = strnlen(buf + sizeof(hdr), n - sizeof(hdr));
            if (len > WIRE_TEXT_MAX - 1)
                len = WIRE_TEXT_MAX - 1;
            if (len > cap - 1)
                len = cap - 1;
            len = utf8_valid_prefix((const unsigned char *)buf + sizeof(hdr), len);
            CHECK(strlen(why) == len && memcmp(why, buf + sizeof(hdr), len) == 0);
        }
    }

    struct wire_worker w;
    rc = wire_decode_worker(buf, n, nfds, &w, why, cap);
    if (rc == 0) {
        CHECK(n == sizeof(w) && hdr.type == WIRE_WORKER && nfds == WFD_COUNT);
        CHECK(strnlen(w.workspace, sizeof(w.workspace)) < sizeof(w.workspace));
        CHECK(memcmp(&w.pid, buf + offsetof(struct wire_worker, pid), sizeof(w.pid)) == 0);
        CHECK(memcmp(&w.uid, buf + offsetof(struct wire_worker, uid), sizeof(w.uid)) == 0);
        CHECK(memcmp(&w.gid, buf + offsetof(struct wire_worker, gid), sizeof(w.gid)) == 0);
    } else {
        CHECK(rc == -EIO || rc == -EPROTO);
        CHECK(strnlen(why, cap) < cap);
        CHECK(valid_utf8(why));
        CHECK((rc == -EIO) == (hdr.type == WIRE_FAIL && n == sizeof(struct wire_fail)));
    }

    /* A session's cell: the same message with one descriptor more. */
    rc = wire_decode_worker_fds(buf, n, nfds, WFD_SESSION_COUNT, &w, why, cap);
    if (rc == 0)
        CHECK(n == sizeof(w) && hdr.type == WIRE_WORKER && nfds == WFD_SESSION_COUNT &&
              strnlen(w.workspace, sizeof(w.workspace)) < sizeof(w.workspace));
    else
        CHECK((rc == -EIO || rc == -EPROTO) && strnlen(why, cap) < cap && valid_utf8(why));

    struct wire_session sess;
    rc = wire_decode_session(buf, n, &sess, why, cap);
    if (rc == 0)
        CHECK(n == sizeof(sess) && hdr.type == WIRE_SESSION && memcmp(&sess, buf, n) == 0);
    else {
        CHECK(rc == -EIO || rc == -EPROTO);
        CHECK(strnlen(why, cap) < cap);
        CHECK(valid_utf8(why));
        CHECK((rc == -EIO) ==
              ((hdr.type == WIRE_FAIL || hdr.type == WIRE_ENDED) && n == sizeof(struct wire_fail)));
    }

    struct wire_status st;
    rc = wire_decode_status(buf, n, &st);
    if (rc == 0)
        CHECK(n == sizeof(st) && st.magic == WIRE_STATUS_MAGIC && memcmp(&st, buf, n) == 0);
    else
        CHECK(rc == -EPROTO);

    free(why);
    free(buf);
    return 0;
}
