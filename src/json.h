/* The result as a JSON object (jansson), for the command line and servers. */
#ifndef PYSBX_JSON_H
#define PYSBX_JSON_H

#include "pysbx.h"

#include <jansson.h>

/* A new object with every field of the design's result; NULL when out of
 * memory. */
json_t *result_json(const struct sbx_result *res);

#endif
