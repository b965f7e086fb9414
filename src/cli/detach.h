/* Work handed to a thread of its own that nobody joins. */
#ifndef PYSBX_DETACH_H
#define PYSBX_DETACH_H

/* Starts fn(arg) on a detached thread. Returns 0 or -errno (then fn never
 * runs and |arg| is still the caller's). */
int start_detached(void *(*fn)(void *), void *arg);

/* The same, on a thread kept from an earlier task when one is idle: a
 * thread that has run its task waits a while for another before it ends,
 * so that a server's requests one after another do not each make and end
 * a thread (about 30 us of CPU each, on the request's path). For tasks
 * that keep nothing of theirs in the thread (no thread-local state left
 * set, no signal mask changed). */
int start_pooled(void *(*fn)(void *), void *arg);

#endif
