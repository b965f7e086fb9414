/*
 * Landlock, where the kernel has it: the workspace read-write, the standard
 * library and the caller's module directories read-only, a few device files,
 * and nothing else; signals and abstract UNIX sockets scoped to the worker.
 */
#ifndef PYSBX_LANDLOCK_H
#define PYSBX_LANDLOCK_H

#include <stdbool.h>
#include <stddef.h>

/* The kernel's Landlock ABI version, or -errno (-ENOSYS: not built in,
 * -EOPNOTSUPP: disabled at boot). */
int landlock_abi(void);

/* Read-only places every worker needs, opened once in the template. */
/* Room for the fixed places, module directories and a vetted package set
 * (its places, each a rule). */
#define LANDLOCK_PLACES_MAX 256

struct landlock_base {
    int abi;
    int n;
    int fds[LANDLOCK_PLACES_MAX];
    unsigned long long access[LANDLOCK_PLACES_MAX];
};

/* Opens the read-only places: |ro_dirs| (NULL-terminated) plus the fixed
 * list (standard library, shared libraries, time zones, devices). A path
 * that does not exist is skipped. |ro_files| (NULL-terminated, may be NULL):
 * more files to read, skipped where missing. With |list_all| (only under
 * the private root, which holds nothing but those places) every directory
 * can be listed, as on any system: `os.listdir("/")`. Returns 0 or -errno
 * with a message. */
int landlock_base_open(struct landlock_base *b, int abi, const char *const *ro_dirs,
                       const char *const *ro_files, bool list_all, char *err, size_t errlen);

/* In the template, for one worker: a ruleset with the base rules and the
 * workspace |ws_fd| read-write. Returns the ruleset fd or -errno with a
 * message. */
int landlock_ruleset_for(const struct landlock_base *b, int ws_fd, char *err, size_t errlen);

/* In the worker: adds its own /proc/<pid> read-only and restricts itself
 * with |ruleset_fd| (closed). no_new_privs must be set. Returns 0 or -errno
 * with a message. */
int landlock_enter(int abi, int ruleset_fd, char *err, size_t errlen);

#endif
