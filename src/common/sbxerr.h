/* Filling a caller's struct sbx_error: the library's refusals and the
 * command's front ends speak the same stable codes. */
#ifndef PYSBX_SBXERR_H
#define PYSBX_SBXERR_H

#include "pysbx.h"

/* Sets *err (may be NULL) to |code| and the formatted message; returns |rc|
 * (a negative errno), so a refusal is one line. */
int sbx_fail(struct sbx_error *err, enum sbx_error_code code, int rc, const char *format, ...)
    __attribute__((format(printf, 4, 5)));

#endif
