/* The layer report: what is active in this template, and why not where it
 * is not. `pysbx doctor` prints it; sbx_open holds it against the caller's
 * required layers. */
#define _GNU_SOURCE
#include "interp.h"
#include "pysbx.h"
#include "template.h"
#include "util.h"
#include "worker_limits.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void layer(struct wire_hello *h, enum sbx_layer which, bool active, const char *detail)
{
    int i = __builtin_ctz(which);
    h->layers[i].active = active;
    fmt(h->layers[i].detail, sizeof(h->layers[i].detail), "%s", detail);
}

/* What the template has mapped (VmSize, through its own /proc), or 0. */
static uint64_t own_vm_bytes(const struct tmpl *t)
{
    char buf[128];
    unsigned long long pages = 0;
    int fd = t->proc_fd >= 0 ? openat(t->proc_fd, "self/statm", O_RDONLY | O_CLOEXEC) : -1;
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;

    if (fd >= 0)
        close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    if (sscanf(buf, "%llu", &pages) != 1)
        return 0;
    return (uint64_t)pages * (uint64_t)sysconf(_SC_PAGESIZE);
}

void layers_describe(const struct tmpl *t, struct wire_hello *h)
{
    const struct jail *j = &t->jail;
    char rl[WIRE_LAYER_DETAIL_MAX];

    memset(h, 0, sizeof(*h));
    h->hdr = (struct wire_hdr){WIRE_HELLO, WIRE_VERSION};
    fmt(h->python_version, sizeof(h->python_version), "%s", interp_version());
    fmt(h->libseccomp_version, sizeof(h->libseccomp_version), "%s", policy_libseccomp_version());
    h->workspace_bytes = j->mount_ns ? j->workspace_bytes : 0;
    layer(h, SBX_LAYER_SECCOMP, t->seccomp, t->seccomp_why);
    layer(h, SBX_LAYER_LANDLOCK, t->landlock > 0, t->landlock_why);
    layer(h, SBX_LAYER_NETNS, j->net_ns, j->net_why);
    layer(h, SBX_LAYER_MOUNTNS, j->mount_ns, j->mount_why);
    layer(h, SBX_LAYER_IPCNS, j->ipc_ns, j->ipc_why);
    layer(h, SBX_LAYER_UTSNS, j->uts_ns, j->uts_why);
    layer(h, SBX_LAYER_USER, j->switch_user, j->user_why);
    char mapped[48] = "";
    uint64_t vm = own_vm_bytes(t);
    if (vm)
        fmt(mapped, sizeof(mapped), " (here %llu MiB)", (unsigned long long)(vm >> 20));
    fmt(rl, sizeof(rl),
        "CPU (the template's timer; RLIMIT_CPU behind it), memory_bytes of address space past "
        "what the template maps%s, file size %llu MiB, %d descriptors, no core%s",
        mapped, (unsigned long long)(WORKER_FSIZE_LIMIT >> 20), WORKER_NOFILE_LIMIT,
        j->switch_user ? ", " PYSBX_STR(WORKER_NPROC_LIMIT) " threads per uid" : "");
    layer(h, SBX_LAYER_RLIMITS, true, rl);
    layer(h, SBX_LAYER_CAPS, true,
          t->bounding_empty ? "every capability dropped (bounding set too), no_new_privs"
                            : "every capability dropped, no_new_privs (the bounding set stays: "
                              "no CAP_SETPCAP to empty it; no_new_privs keeps exec from using it)");
    layer(h, SBX_LAYER_ROOT, t->root, t->root_why);
    /* Where processes are told apart, so is their namespace. */
    char run[WIRE_LAYER_DETAIL_MAX];
    fmt(run, sizeof(run), "%s, %s; %s%s", j->uidrun_why, t->claim.why,
        t->pid_ns ? "" : "no pid namespace: ", t->pidns_why);
    layer(h, SBX_LAYER_UIDRUN, j->uid_per_run, run);
    layer(h, SBX_LAYER_FREEZE, t->freeze, t->freeze_why);
}
