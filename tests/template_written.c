/*
 * Linked into pysbx-template-written only (-Wl,--wrap=session_import_fd):
 * no session's process has a userfaultfd, as where the kernel has none or
 * a container's seccomp profile refuses the call, so that every branch
 * and restore writes its pages (branch.c's other path).
 */
int __wrap_session_import_fd(void);

int __wrap_session_import_fd(void)
{
    return -1;
}
