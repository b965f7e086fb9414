/* The socket shim in place of the built-in _socket (shims/_socket.py). */
#ifndef PYSBX_SHIM_H
#define PYSBX_SHIM_H

/* Points the interpreter's built-in _socket at the shim. Call before the
 * interpreter is initialised. Returns 0 or -ENOMEM. */
int shim_install(void);

#endif
