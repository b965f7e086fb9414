#include "sbxerr.h"

#include "util.h"

#include <stdarg.h>
#include <stdio.h>

int sbx_fail(struct sbx_error *err, enum sbx_error_code code, int rc, const char *format, ...)
{
    va_list ap;

    if (err) {
        err->code = code;
        va_start(ap, format);
        vsnprintf(err->message, sizeof(err->message), format, ap);
        va_end(ap);
        /* The message goes out as a JSON string (serve's and batch's
         * answers, MCP's replies), which must be UTF-8: cutting it to its
         * size can split a character of a file name, and an argument (a
         * path, the template's words) may hold any bytes. Keep the valid
         * part; otherwise the answer could not be encoded at all. */
        utf8_terminate(err->message);
    }
    return rc;
}
