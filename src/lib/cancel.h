#ifndef PYSBX_CANCEL_H
#define PYSBX_CANCEL_H

#include "pysbx.h"

/* The eventfd that becomes readable when |c| fires, or -1 for NULL. */
int cancel_fd(const struct sbx_cancel *c);

#endif
