#define _GNU_SOURCE
#include "util.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *path_problem(const char *name, size_t len)
{
    size_t start = 0;

    if (!name || len == 0)
        return "the name is empty";
    if (memchr(name, '\0', len))
        return "the name contains a NUL byte";
    if (name[0] == '/')
        return "the name is an absolute path";
    for (size_t i = 0; i <= len; i++) {
        if (i < len && name[i] != '/')
            continue;
        size_t clen = i - start;
        if (clen == 0)
            return "the name has an empty path component";
        if (clen > 255)
            return "a path component is longer than 255 bytes";
        if ((clen == 1 && name[start] == '.') ||
            (clen == 2 && name[start] == '.' && name[start + 1] == '.'))
            return "the name has a '.' or '..' component";
        start = i + 1;
    }
    return NULL;
}

const char *name_problem(const char *name, size_t len)
{
    if (name && len > 4096)
        return "the name is longer than 4096 bytes";
    if (name && !memchr(name, '\0', len) &&
        utf8_valid_prefix((const unsigned char *)name, len) != len)
        return "the name is not valid UTF-8";
    return path_problem(name, len);
}

size_t utf8_valid_prefix(const unsigned char *s, size_t len)
{
    size_t i = 0;

    while (i < len) {
        unsigned char c = s[i];
        size_t need;
        unsigned char lo = 0x80, hi = 0xBF;

        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF)
            need = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F; /* no UTF-16 surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        } else
            return i;
        if (i + need >= len)
            return i;
        for (size_t k = 1; k <= need; k++) {
            unsigned char b = s[i + k];
            if (b < lo || b > hi)
                return i;
            lo = 0x80;
            hi = 0xBF;
        }
        i += need + 1;
    }
    return i;
}

void utf8_terminate(char *s)
{
    s[utf8_valid_prefix((const unsigned char *)s, strlen(s))] = '\0';
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *base64_encode(const void *data, size_t len, size_t *out_len)
{
    const unsigned char *p = data;
    size_t n = 4 * ((len + 2) / 3);
    char *out = malloc(n + 1);
    size_t o = 0;

    if (!out)
        return NULL;
    for (size_t i = 0; i + 2 < len; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        out[o++] = b64[v >> 18];
        out[o++] = b64[(v >> 12) & 63];
        out[o++] = b64[(v >> 6) & 63];
        out[o++] = b64[v & 63];
    }
    size_t rest = len % 3;
    if (rest) {
        uint32_t v = (uint32_t)p[len - rest] << 16;
        if (rest == 2)
            v |= (uint32_t)p[len - 1] << 8;
        out[o++] = b64[v >> 18];
        out[o++] = b64[(v >> 12) & 63];
        out[o++] = rest == 2 ? b64[(v >> 6) & 63] : '=';
        out[o++] = '=';
    }
    out[o] = '\0';
    if (out_len)
        *out_len = o;
    return out;
}

static int b64_value(unsigned char c)
{
    const char *p = c ? strchr(b64, c) : NULL;
    return p ? (int)(p - b64) : -1;
}

unsigned char *base64_decode(const char *text, size_t len, size_t *out_len)
{
    unsigned char *out;
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;

    while (len > 0 && text[len - 1] == '=')
        len--;
    if (len % 4 == 1) {
        errno = EINVAL;
        return NULL;
    }
    out = malloc(len / 4 * 3 + 3);
    if (!out) {
        errno = ENOMEM;
        return NULL;
    }
    for (size_t i = 0; i < len; i++) {
        int v = b64_value((unsigned char)text[i]);
        if (v < 0) {
            free(out);
            errno = EINVAL;
            return NULL;
        }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    *out_len = o;
    return out;
}

int parse_seconds(const char *text, double *out)
{
    char *end = NULL;
    double v;

    /* Decimal, with an exponent if need be (1e-3): no hexadecimal, no
     * "inf" or "nan", no spaces, which strtod would also take. */
    if (!text || !*text || strspn(text, "0123456789.eE+-") != strlen(text))
        return -EINVAL;
    errno = 0;
    v = strtod(text, &end);
    if (errno || *end || !isfinite(v) || v <= 0)
        return -EINVAL;
    *out = v;
    return 0;
}

int parse_u64(const char *text, uint64_t *out)
{
    char *end = NULL;
    unsigned long long v;

    if (!text || !*text || strspn(text, "0123456789") != strlen(text))
        return -EINVAL;
    errno = 0;
    v = strtoull(text, &end, 10);
    if (errno || *end)
        return -EINVAL;
    *out = v;
    return 0;
}

void fmt_size(char *buf, size_t cap, uint64_t bytes)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
    int u = -1;

    while (u + 1 < (int)ARRAY_SIZE(units) && bytes && bytes % 1024 == 0) {
        bytes /= 1024;
        u++;
    }
    if (u < 0)
        fmt(buf, cap, "%llu byte%s", (unsigned long long)bytes, bytes == 1 ? "" : "s");
    else
        fmt(buf, cap, "%llu %s", (unsigned long long)bytes, units[u]);
}

void fmt(char *buf, size_t cap, const char *format, ...)
{
    va_list ap;

    if (cap == 0)
        return;
    va_start(ap, format);
    if (vsnprintf(buf, cap, format, ap) < 0)
        buf[0] = '\0';
    va_end(ap);
}

int errmsg(char *buf, size_t cap, int rc, const char *format, ...)
{
    va_list ap;

    if (buf && cap) {
        va_start(ap, format);
        vsnprintf(buf, cap, format, ap);
        va_end(ap);
    }
    return rc;
}

int cmp_strings(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int cmp_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double percentile(const double *sorted, size_t n, double p)
{
    double rank = p / 100.0 * (double)n;
    size_t k = (size_t)rank;

    if ((double)k < rank)
        k++; /* the ceiling, without libm */
    return sorted[k == 0 ? 0 : (k > n ? n : k) - 1];
}

int parse_size(const char *text, uint64_t *out)
{
    static const char units[] = "KMGT";
    uint64_t v = 0;
    const char *p = text;
    unsigned shift = 0;

    if (!text || *p < '0' || *p > '9')
        return -EINVAL;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (UINT64_MAX - 9) / 10)
            return -EINVAL;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (*p) {
        const char *u = strchr(units, *p >= 'a' ? *p - 'a' + 'A' : *p);
        if (!u || !*u)
            return -EINVAL;
        shift = 10 * (unsigned)(u - units + 1);
        p++;
        if (*p == 'i')
            p++;
        if (*p == 'B')
            p++;
        if (*p)
            return -EINVAL;
    }
    if (shift && v > (UINT64_MAX >> shift))
        return -EINVAL;
    *out = v << shift;
    return 0;
}

const char *signal_name(int sig)
{
    static const struct {
        int sig;
        const char *name;
    } names[] = {
        {SIGHUP, "SIGHUP"},       {SIGINT, "SIGINT"},       {SIGQUIT, "SIGQUIT"},
        {SIGILL, "SIGILL"},       {SIGTRAP, "SIGTRAP"},     {SIGABRT, "SIGABRT"},
        {SIGBUS, "SIGBUS"},       {SIGFPE, "SIGFPE"},       {SIGKILL, "SIGKILL"},
        {SIGUSR1, "SIGUSR1"},     {SIGSEGV, "SIGSEGV"},     {SIGUSR2, "SIGUSR2"},
        {SIGPIPE, "SIGPIPE"},     {SIGALRM, "SIGALRM"},     {SIGTERM, "SIGTERM"},
        {SIGSTKFLT, "SIGSTKFLT"}, {SIGCHLD, "SIGCHLD"},     {SIGCONT, "SIGCONT"},
        {SIGSTOP, "SIGSTOP"},     {SIGTSTP, "SIGTSTP"},     {SIGTTIN, "SIGTTIN"},
        {SIGTTOU, "SIGTTOU"},     {SIGURG, "SIGURG"},       {SIGXCPU, "SIGXCPU"},
        {SIGXFSZ, "SIGXFSZ"},     {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"},
        {SIGWINCH, "SIGWINCH"},   {SIGIO, "SIGIO"},         {SIGPWR, "SIGPWR"},
        {SIGSYS, "SIGSYS"},
    };
    for (size_t i = 0; i < ARRAY_SIZE(names); i++)
        if (names[i].sig == sig)
            return names[i].name;
    return NULL;
}
