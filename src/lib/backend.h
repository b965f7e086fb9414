#ifndef PYSBX_BACKEND_H
#define PYSBX_BACKEND_H

#include "pysbx.h"

int backend_python3_open(const struct sbx_config *cfg, struct sbx_backend *out,
                         struct sbx_error *err);

#endif
