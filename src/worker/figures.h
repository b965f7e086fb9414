/*
 * Charts come back: when a run calls plt.show() or ends with figures open,
 * each is written once to its workspace as figure-N.png, an artifact like
 * any file the code writes.
 */
#ifndef PYSBX_FIGURES_H
#define PYSBX_FIGURES_H

#include <stddef.h>

/* In the template, once matplotlib.pyplot is imported (nothing to do if it
 * is not): replaces plt.show with a function that saves and closes every
 * open figure. Returns 0 or -errno with a message. */
int figures_install(char *err, size_t errlen);

/* In the worker, when the code has ended: saves the figures still open.
 * A failure is reported on stderr; it does not change the exit status. */
void figures_flush(void);

#endif
