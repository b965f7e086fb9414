#include "outbuf.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const unsigned char replacement[3] = {0xEF, 0xBF, 0xBD};

void outbuf_init(struct outbuf *ob, uint64_t max_chars)
{
    memset(ob, 0, sizeof(*ob));
    ob->max_chars = max_chars;
}

static void append(struct outbuf *ob, const unsigned char *p, size_t n)
{
    if (ob->oom)
        return;
    if (ob->len + n + 1 > ob->cap) {
        size_t cap = ob->cap ? ob->cap : 256;
        while (cap < ob->len + n + 1)
            cap *= 2;
        char *d = realloc(ob->data, cap);
        if (!d) {
            ob->oom = true;
            return;
        }
        ob->data = d;
        ob->cap = cap;
    }
    memcpy(ob->data + ob->len, p, n);
    ob->len += n;
}

static void emit(struct outbuf *ob, const unsigned char *p, size_t n)
{
    if (ob->kept_chars < ob->max_chars) {
        append(ob, p, n);
        ob->kept_chars++;
    } else
        ob->cut_chars++;
}

void outbuf_feed(struct outbuf *ob, const void *bytes, size_t len)
{
    const unsigned char *p = bytes;
    size_t i = 0;

    while (i < len) {
        unsigned char c = p[i];

        if (ob->need == 0) {
            /* Fast path: a run of ASCII. */
            if (c < 0x80) {
                size_t j = i;
                while (j < len && p[j] < 0x80)
                    j++;
                size_t run = j - i;
                uint64_t room = ob->max_chars - ob->kept_chars;
                size_t keep = run < room ? run : (size_t)room;
                append(ob, p + i, keep);
                ob->kept_chars += keep;
                ob->cut_chars += run - keep;
                i = j;
                continue;
            }
            ob->lo = 0x80;
            ob->hi = 0xBF;
            if (c >= 0xC2 && c <= 0xDF)
                ob->need = 1;
            else if (c >= 0xE0 && c <= 0xEF) {
                ob->need = 2;
                if (c == 0xE0)
                    ob->lo = 0xA0;
                else if (c == 0xED)
                    ob->hi = 0x9F;
            } else if (c >= 0xF0 && c <= 0xF4) {
                ob->need = 3;
                if (c == 0xF0)
                    ob->lo = 0x90;
                else if (c == 0xF4)
                    ob->hi = 0x8F;
            } else {
                emit(ob, replacement, sizeof(replacement));
                i++;
                continue;
            }
            ob->seq[0] = c;
            ob->seq_len = 1;
            i++;
            continue;
        }
        if (c < ob->lo || c > ob->hi) {
            /* The sequence so far is invalid; reconsider |c| as a new lead. */
            emit(ob, replacement, sizeof(replacement));
            ob->need = 0;
            ob->seq_len = 0;
            continue;
        }
        ob->seq[ob->seq_len++] = c;
        ob->lo = 0x80;
        ob->hi = 0xBF;
        if (--ob->need == 0) {
            emit(ob, ob->seq, ob->seq_len);
            ob->seq_len = 0;
        }
        i++;
    }
}

static char *finish(struct outbuf *ob, size_t *len, bool *truncated, bool say_cut)
{
    char *text;

    if (ob->need) {
        emit(ob, replacement, sizeof(replacement));
        ob->need = 0;
        ob->seq_len = 0;
    }
    *truncated = ob->cut_chars > 0;
    if (ob->cut_chars && say_cut) {
        char note[96];
        bool nl = ob->len == 0 || ob->data[ob->len - 1] == '\n';
        int n = snprintf(note, sizeof(note), "%s[pysbx: output cut, %" PRIu64 " more characters]\n",
                         nl ? "" : "\n", ob->cut_chars);
        append(ob, (const unsigned char *)note, (size_t)n);
    }
    append(ob, (const unsigned char *)"", 0);
    if (ob->oom) {
        outbuf_free(ob);
        return NULL;
    }
    if (!ob->data) {
        ob->data = calloc(1, 1);
        if (!ob->data)
            return NULL;
    }
    ob->data[ob->len] = '\0';
    text = ob->data;
    *len = ob->len;
    ob->data = NULL;
    outbuf_free(ob);
    return text;
}

char *outbuf_finish(struct outbuf *ob, size_t *len, bool *truncated)
{
    return finish(ob, len, truncated, true);
}

char *outbuf_finish_quiet(struct outbuf *ob, size_t *len, bool *truncated)
{
    return finish(ob, len, truncated, false);
}

void outbuf_free(struct outbuf *ob)
{
    free(ob->data);
    uint64_t max = ob->max_chars;
    memset(ob, 0, sizeof(*ob));
    ob->max_chars = max;
}
