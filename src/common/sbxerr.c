#include "sbxerr.h"

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
    }
    return rc;
}
