/* Work handed to a thread of its own that nobody joins. */
#ifndef PYSBX_DETACH_H
#define PYSBX_DETACH_H

/* Starts fn(arg) on a detached thread. Returns 0 or -errno (then fn never
 * runs and |arg| is still the caller's). */
int start_detached(void *(*fn)(void *), void *arg);

#endif
