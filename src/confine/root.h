/*
 * The template's private root, built once and inherited by every worker: a
 * fresh tmpfs holding read-only bind mounts of exactly what the interpreter
 * needs (places.h), the caller's module directories, three devices, and the
 * work directory; then pivot_root. Nothing else of the machine exists there:
 * no /proc, no /etc but the few files written for it, no home directories,
 * no other process's files. bubblewrap's setup_newroot() is the model.
 */
#ifndef PYSBX_ROOT_H
#define PYSBX_ROOT_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct root_spec {
    /* Where the new root's tmpfs is mounted before it becomes "/" (covered
     * in our namespace only); not part of it: workspaces are detached
     * mounts (workspace.h). */
    const char *work_dir;
    const char *const *module_dirs; /* NULL-terminated; read-only, same paths */
    /* A vetted package set: directories or files bound read-only at the same
     * paths, and symbolic links (path, target, ...) made as they are. */
    const char *const *package_places;
    const char *const *package_links;
    /* /etc/passwd and /etc/group name each worker id (root_user_name), with
     * the workspace as its home. */
    bool per_run_ids; /* ids base..base+n-1, workspace w<uid> */
    uid_t uid_base;
    gid_t gid_base;
    unsigned ids;
};

/* An empty directory of the root where the template of a package set
 * mounts a tmpfs of its own while it imports them (matplotlib writes its
 * configuration and font cache there), and unmounts it before any fork. */
#define ROOT_SCRATCH "/.pysbx-scratch"

/* The name /etc/passwd and /etc/group give the worker id base+index:
 * "sandbox" when every worker shares one id, else "sandbox-<index>", so
 * that a name looks up the worker's own id (getpwnam(getpass.getuser()),
 * shutil.chown by name) and not a sibling's. */
void root_user_name(char *buf, size_t cap, bool per_run_ids, unsigned index);

/* The files root_enter writes itself (NULL-terminated): /etc/passwd, ... */
extern const char *const root_written_files[];

/* Builds the root and moves into it (the mount namespace must be private).
 * Returns 0 or -errno with a message. */
int root_enter(const struct root_spec *spec, char *err, size_t errlen);

#endif
