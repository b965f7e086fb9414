/*
 * Linked into pysbx-template-usermode only (-Wl,--wrap=session_import_fd):
 * every session's process has a userfaultfd of user faults only, as where
 * it may not make one that takes the kernel's faults too (not root, the
 * sysctl vm.unprivileged_userfaultfd 0), so that a branch's pages are all
 * put in before it resumes (branch.c's path without branch_fill), as
 * root the suite would not see.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

int __wrap_session_import_fd(void);

int __wrap_session_import_fd(void)
{
    return (int)syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
}
