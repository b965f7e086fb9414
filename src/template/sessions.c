/*
 * Sessions, on the template's side: the one party that may let a session's
 * state fork, and the keeper of which process is the state.
 *
 * The rule: once a session's first cell has run, every process of the
 * session has run the tenant's code. Nothing such a process writes on its
 * channel, reports about itself or leaves in its memory decides anything
 * here. What decides is the kernel (a process reaped or seen stopped by
 * waitid, the sender's pid on a socket, the listener's notifications
 * checked with NOTIF_ID_VALID, /proc of our own pid namespace: the
 * template's children, a process's threads and descriptors, a pipe with no
 * writer left) and the supervisor's requests (a cell and its limits; keep
 * it or not). A message a process may not send in the state it is in ends
 * the session, as a privilege-separation monitor treats a request it did
 * not permit.
 *
 * A session is a first state process, made like a worker (spawn_process)
 * with the session's seccomp program, which hands us one fork,
 * clone(CLONE_PARENT | SIGCHLD), through its listener. Its life is two
 * machines, each moved only by the functions below that name its phases:
 *
 *   the session (enum sess_phase), for its supervisor:
 *     OPENING -READY-> WAITING -CELL-> ASKED -made-> RUNNING
 *     RUNNING -"done"-> STOPPING -seen stopped, checked-> SETTLING (kept?)
 *                                                     or ROLLING (killed)
 *     RUNNING/STOPPING/ROLLING -reaped-> SETTLING -SETTLE-> WAITING
 *     anything -> ENDING (idle, lifetime, a death, a broken rule) -> freed
 *
 *   the next cell's process (enum next_phase), a fork of |from| (the state,
 *   or the cell being settled, so that the fork overlaps the supervisor's
 *   work):
 *     NONE -> FORKING (told to fork; its clone is let through once)
 *          -> FORKED (let through; the child is looked for among our
 *             children: nothing it says is needed to find it)
 *          -> HOLDING (found; |from| is stopped, and the child once it has
 *             copied the pages the last cell wrote, or after WARM_GRACE_NS)
 *          -> MADE (both seen stopped; or |from| seen stopped and a cell
 *             asked for: the child is handed out as it is)
 *     FORKING/FORKED -the fork failed-> FAILING (|from| stopped) -> FAILED
 *
 * A cell's limits come from the supervisor's WIRE_CELL and are armed here
 * when it is handed out: its wall time from then, its CPU time on its own
 * clock from its birth, less what its fork cost |from| (bounded: a second
 * of CPU, ten of wall, or the session ends). Its memory limit is the hard
 * RLIMIT_AS its first state set before any of the tenant's code ran.
 * A cell that says it is done is stopped; its answer goes out only once
 * the kernel has reported it stopped, with one thread, its output pipes
 * without a writer and no descriptor open but its standard streams, its
 * channel and regular files of its workspace that it may keep (kept.h:
 * each later cell gets descriptions of its own of them). Anything else is
 * a rollback. Between cells the state is stopped and seen stopped;
 * SIGCONT is sent only to let it fork the next cell, whose CPU limit that
 * fork is charged to, and the next cell runs ahead of its request only to
 * copy pages (its CPU is its own from its birth).
 *
 * All of a session's processes share its uid; they live in the template's
 * pid namespace (keeper.h). A session ends by killing the processes it
 * knows, then every process of its uid (kill(-1) from a child that is that
 * uid alone), and gives its uid back only once the kernel counts none
 * (sweep_uid).
 */
#define _GNU_SOURCE
#include "branch.h"
#include "kept.h"
#include "pysbx.h"
#include "sysutil.h"
#include "template.h"
#include "util.h"
#include "worker.h"
#include "workspace.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A cell that said it is done while a thread of it was still there gets
 * this long for the thread to finish leaving (a joined thread's kernel
 * side lingers a moment), looked at every RECHECK_NS. */
#define THREAD_GRACE_NS (100ULL * 1000000ULL)
#define RECHECK_NS      (2ULL * 1000000ULL)
/* How long the next cell, found, may take to say it is ready (it copies
 * the pages a run writes meanwhile) before it is stopped anyway. */
#define WARM_GRACE_NS (50ULL * 1000000ULL)
/* How often the child of a fork let through is looked for. */
#define LOOK_NS (1ULL * 1000000ULL)
/* What the process told to fork may spend on it (charged to the next
 * cell); past it the session ends. A fork of a state of some GiB takes
 * tens of ms of CPU. */
#define FORK_CPU_BUDGET_NS  (1000ULL * 1000000ULL)
#define FORK_WALL_BUDGET_NS (10000ULL * 1000000ULL)
/* The most a made-ahead cell copies of what the last one wrote (4 MiB):
 * the interpreter's own pages that every cell writes are far fewer; a
 * cell that wrote more wrote data the next one may not touch again. And
 * the most it maps of the code and constants the last one had mapped
 * (32 MiB; the interpreter's code is some 4 MiB). The plan is learnt
 * again every CELL_PLAN_EVERY kept cells. */
#define CELL_PLAN_MAX_PAGES      1024
#define CELL_PLAN_MAX_READ_PAGES 8192
#define CELL_PLAN_EVERY          16
/* The CPU a branch's copier may use (it copies a state of at most the
 * session's memory limit; past it, it is killed and the branch refused). */
#define BRANCH_COPY_CPU_S 10
/* A copier that has copied a branch of a session (and filled it, if it
 * did) is kept for that session's next branch (copier_kept), for as long
 * as it has used less CPU than this (each job then has BRANCH_COPY_CPU_S
 * still) and has been idle less than COPIER_KEEP_MS. */
#define COPIER_KEEP_CPU_NS (1000ULL * 1000000ULL)
#define COPIER_KEEP_MS     10000
/* What is made ahead (a spare first process, a copier) waits until the
 * loop has had nothing to do for AHEAD_QUIET_NS. An answer just sent wakes
 * its client, and the kernel may queue the client on the CPU the loop
 * runs on: a fork made at once (a millisecond or two of the template's)
 * is then what the client waits behind, the other CPU idle (a scheduler
 * trace of a branch's answer: 1.5 ms). It waits at most AHEAD_LATEST_NS
 * from when it was wanted: then, at the loop's first look with nothing to
 * do. */
#define AHEAD_QUIET_NS  (1ULL * 1000000ULL)
#define AHEAD_LATEST_NS (20ULL * 1000000ULL)
/* How long a branch may take, from its opening to its copy resumed. */
#define BRANCH_BUDGET_NS (10000ULL * 1000000ULL)
/* A process seen stopped may use this much CPU, and 1% of the time since,
 * before it counts as having run (the kernel's own work of waking it into
 * the freezer for a signal, a few microseconds each); its session ends.
 * Stopped processes are looked at every STOPPED_WATCH_NS. */
#define STOPPED_CPU_SLACK_NS (1ULL * 1000000ULL)
#define STOPPED_WATCH_NS     (100ULL * 1000000ULL)
/* A stop not seen this long after it was sent (a SIGCONT discarded it
 * before it took) is sent again. */
#define STOP_AGAIN_NS (10ULL * 1000000ULL)
/* How long an ended session's uid is looked at for a process left; past
 * it the session goes and its uid is never handed out again. */
#define SWEEP_GIVE_UP_NS (1000ULL * 1000000ULL)

enum sess_phase {
    SESS_OPENING,  /* its first process gets ready (trusted until its first cell) */
    SESS_WAITING,  /* between cells: a cell may be asked for */
    SESS_ASKED,    /* a cell is asked for; its process is not made yet */
    SESS_RUNNING,  /* the cell runs, under the request's limits */
    SESS_STOPPING, /* it said its code ended: being stopped, then looked at */
    SESS_SETTLING, /* its status is out: the supervisor says keep or not */
    SESS_ROLLING,  /* killed to roll it back: its status goes out when reaped */
    SESS_ENDING,   /* over: its processes killed; freed once its uid is empty */
};

enum next_phase {
    NEXT_NONE,
    NEXT_FORKING, /* |from| is told to fork; its clone may be let through once */
    NEXT_FORKED,  /* let through: the child is looked for */
    NEXT_HOLDING, /* found: it and |from| are being stopped */
    NEXT_FAILING, /* no child: |from| is being stopped */
    NEXT_MADE,    /* both seen stopped: a cell can be handed out */
    NEXT_FAILED,  /* tried again when a cell is asked for */
};

/* A branch being made (OPENING, with branch_of), or a session restored from
 * an image (restoring): */
enum branch_step {
    BR_NONE,
    BR_READYING, /* its first process gets ready, as any session's */
    BR_IMAGE,    /* restoring: it waits at its import for the image */
    BR_ORIGIN,   /* it waits at its import; the origin's state is not idle yet */
    BR_COPYING,  /* copied by a copier process; its channel is the copier's */
    BR_RESUMING, /* copied: the copy resumes, and says so */
};

/* A session's state being written to an image (WIRE_SAVE), while it waits
 * between cells: as for a branch, the state once it is idle, held, then a
 * copier that writes the image. */
enum save_step {
    SAVE_NONE,
    SAVE_WAIT,    /* until the state is idle (its next cell made, stopped) */
    SAVE_COPYING, /* a copier writes its image */
};

static const char *const sess_names[] = {"opening",  "waiting",  "asked",   "running",
                                         "stopping", "settling", "rolling", "ending"};

struct session_rec {
    struct session_rec *next;
    uint64_t id;
    enum sess_phase phase;
    enum next_phase making;
    int chan;     /* to the supervisor */
    int listener; /* the session's seccomp notifications; -1 until READY */
    int ws_fd;    /* the workspace the state and the cells see */
    int saved_fd; /* the files as of the last kept cell (the supervisor's) */
    unsigned slot;
    uid_t uid;
    gid_t gid;
    bool own_uid; /* the uid is the session's alone: it can be swept */
    char name[WIRE_NAME_MAX];
    uint64_t memory;
    uint64_t idle_ns, lifetime_ns;
    uint64_t opened_ns, idle_since_ns;
    uint64_t recheck_ns; /* look again then (STOPPING, FORKED, ENDING) */
    uint64_t fork_by_ns; /* the fork's wall budget runs out then */
    uint64_t done_ns;    /* the cell said it was done then */
    uint64_t ended_ns;   /* ENDING since then */
    uint64_t warm_by_ns; /* HOLDING: the next cell is stopped then, ready or not */
    uint64_t charge_ns;  /* CPU the next cell's fork cost |from|: the cell's */
    /* The processes by role; a process killed leaves its role and is only
     * counted until it is reaped. */
    struct worker_rec *state;     /* stopped between cells */
    struct worker_rec *candidate; /* a cell that may be kept: stopped, settling */
    struct worker_rec *coming;    /* the next cell's process (|making|) */
    struct worker_rec *from;      /* what |coming| is forked from */
    struct worker_rec *cell;      /* the cell handed out */
    uint64_t coming_of;           /* the id of the process |coming| is a fork of */
    bool forked;                  /* |coming|'s fork was let through */
    /* A fork let through whose child is not wanted any more and was not
     * found yet: killed when found; looked for until its parent (by id) is
     * reaped. Two at once cannot be kept track of: the session ends. */
    struct worker_rec *stray;
    uint64_t stray_from, stray_look_ns;
    bool lost_track;
    unsigned procs; /* its processes not yet reaped */
    /* The cell asked for (WIRE_CELL), and how it ended. */
    uint32_t rollback;
    uint64_t cpu_ms, wall_ms;
    int64_t cell_status; /* the cell's claim (CELL_DONE) */
    bool cell_past;
    uint32_t cell_flags;
    char fork_why[WIRE_TEXT_MAX];
    /* The pages the last kept cell wrote: what the next one copies while
     * it waits (worker.h). */
    struct prefault plan;
    struct prefault reads; /* and the pages of code and constants it ran or read */
    uint64_t kept;         /* cells kept */
    /* A branch: the session it is a copy of, and how far the copy is; its
     * address-space ceiling. */
    uint64_t branch_of;
    uint64_t as_limit;
    enum branch_step branch_step;
    uint64_t branch_by_ns;
    /* An origin whose state a branch holds (its id; 0: none), stopped as
     * it is, until the branch has its copy or has ended: meanwhile no cell
     * is handed out and the state is let run for nothing (a next cell
     * asked for is made after: make_due). */
    uint64_t held_by;
    bool make_due;
    /* BR_COPYING: the copier, and the pipe its result comes on. */
    pid_t copier;
    int copier_fd;
    /* The copier of this session's last branch, kept for its next: it
     * copies this session's states alone, and is warm for them (on a VM
     * that shadows page tables, each page a new process's kernel touches
     * first is a trap of its own). */
    struct copier_ref copier_kept;
    uint64_t copier_kept_ns; /* ... let go then, if it has had no job */
    /* A branch resumed whose copier still puts its pages in (branch_fill):
     * only a cell asked for is made of it until then (fill_make_due: one
     * made ahead was due). */
    bool filling;
    bool fill_make_due;
    /* Its cgroup (freezer.h), frozen while the session is idle. */
    struct freezer_cg cg;
    bool frozen;
    /* Its first process said it is ready (OPENING); a spare, made ahead
     * (t->spare), has no supervisor yet (chan -1). */
    bool ready;
    /* Images (branch.h): a restored session (OPENING, its steps those of a
     * branch, BR_IMAGE), or the state's image being written (saving). The
     * image's descriptor, the supervisor's, until the copier has it. */
    bool restoring;
    enum save_step saving;
    uint64_t save_look_ns; /* SAVE_WAIT: looked at again then */
    int image_fd;
    uint64_t image_max;
    /* The files its state holds open (kept.h), and those of the cell being
     * settled; why the last cell's descriptors could not be kept. A branch
     * whose origin kept files waits for its copies of them (WIRE_ADOPT)
     * before its first cell is made (adopt_due). */
    struct kept_files files, cand_files;
    char fds_why[WIRE_STATUS_WHY_MAX];
    bool adopt_due;
};

/* Room for the fork command being sent (16 KiB: not on the stack). */
static struct session_fork_msg fork_msg;

static struct seccomp_notif *notif;
static struct seccomp_notif_resp *notif_resp;

static void start_making(struct tmpl *t, struct session_rec *s, struct worker_rec *from);
static void make_if_due(struct tmpl *t, struct session_rec *s);
static void copier_heard(struct tmpl *t, struct session_rec *s);
static void end_session(struct tmpl *t, struct session_rec *s, const char *why);
static void release_hold(struct tmpl *t, struct session_rec *a);

const struct freezer_cg *session_cgroup(const struct session_rec *s)
{
    return s->cg.dir >= 0 ? &s->cg : NULL;
}

static struct session_rec *find_session(struct tmpl *t, uint64_t id)
{
    for (struct session_rec *s = t->sessions; s; s = s->next)
        if (s->id == id)
            return s;
    return NULL;
}

void session_adopt(struct session_rec *s, struct worker_rec *w, int ws_fd)
{
    s->state = w;
    s->slot = w->slot;
    s->uid = w->uid;
    s->gid = w->gid;
    s->ws_fd = ws_fd;
    s->procs = 1;
    fmt(s->name, sizeof(s->name), "%s", w->name);
}

/* FAIL (a cell could not be made, or the opening failed) or ENDED. */
static void send_text(struct session_rec *s, uint32_t type, const char *why)
{
    struct wire_fail m = {.hdr = {type, WIRE_VERSION}};

    fmt(m.text, sizeof(m.text), "%s", why);
    if (s->chan >= 0)
        (void)wire_send(s->chan, &m, sizeof(m), NULL, 0);
}

/* --- what the kernel says of a process ---------------------------------- */

/* The file PID/|name| of our /proc (our own pid namespace's, see keeper.h)
 * in |buf|, NUL-terminated; false when it cannot be read or is empty. */
static bool read_proc(const struct tmpl *t, pid_t pid, const char *name, char *buf, size_t cap)
{
    char path[64];
    ssize_t got = -1;

    fmt(path, sizeof(path), "%d/%s", (int)pid, name);
    int fd = openat(t->proc_fd, path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        got = read_full(fd, buf, cap - 1);
        close(fd);
    }
    if (got <= 0)
        return false;
    buf[got] = '\0';
    return true;
}

/* The line after |field| in /proc/PID/status, in |out|; false when there
 * is none. */
static bool status_line(const struct tmpl *t, pid_t pid, const char *field, char *out, size_t cap)
{
    char buf[4096];

    if (!read_proc(t, pid, "status", buf, sizeof(buf)))
        return false;
    for (char *p = buf; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, field, strlen(field)) == 0) {
            p += strlen(field);
            size_t n = strcspn(p, "\n");
            fmt(out, cap, "%.*s", (int)n, p);
            return true;
        }
    return false;
}

static long status_number(const struct tmpl *t, pid_t pid, const char *field)
{
    char line[128];

    return status_line(t, pid, field, line, sizeof(line)) ? strtol(line, NULL, 10) : -1;
}

/* The last number of a status line: a pid as its own namespace sees it. */
static long status_inner(const struct tmpl *t, pid_t pid, const char *field)
{
    char line[128];

    if (!status_line(t, pid, field, line, sizeof(line)))
        return -1;
    char *p = line + strlen(line);
    while (p > line && (p[-1] == ' ' || p[-1] == '\t'))
        *--p = '\0';
    while (p > line && p[-1] >= '0' && p[-1] <= '9')
        p--;
    return *p ? strtol(p, NULL, 10) : -1;
}

/* The hard RLIMIT_AS of |s|'s state (/proc/PID/limits, which the kernel
 * writes and anyone may read: what its code may have lowered it to
 * included), or 0 when it cannot be read. A session's first process takes
 * its ceiling on as its session begins (session_main), and its supervisor
 * may hear the session is open before it has: until then the kernel says
 * unlimited (which no process of a session can make it, having no
 * privilege to raise it), and the ceiling is the one it is taking. */
static uint64_t as_hard_limit(const struct tmpl *t, const struct session_rec *s)
{
    char buf[4096], soft[32], hard[32];

    if (!s->state || !read_proc(t, s->state->pid, "limits", buf, sizeof(buf)))
        return 0;
    const char *line = strstr(buf, "Max address space");
    if (!line || sscanf(line + strlen("Max address space"), "%31s %31s", soft, hard) != 2)
        return 0;
    if (strcmp(hard, "unlimited") == 0)
        return s->as_limit ? s->as_limit : (uint64_t)worker_memory_limit(s->memory);
    char *end;
    unsigned long long v = strtoull(hard, &end, 10);
    return *end ? 0 : v;
}

static uint64_t cpu_ns(pid_t pid)
{
    clockid_t c;
    struct timespec ts;

    if (clock_getcpuclockid(pid, &c) != 0 || clock_gettime(c, &ts) < 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

bool known_child(const struct tmpl *t, pid_t pid)
{
    if (pid == t->keeper.pid || pid == t->sweeper.pid || pid == t->claim.holder)
        return true;
    for (const struct worker_rec *w = t->workers; w; w = w->next)
        if (w->pid == pid)
            return true;
    for (const struct session_rec *s = t->sessions; s; s = s->next)
        if (s->copier == pid || (s->copier_kept.pid > 0 && s->copier_kept.pid == pid))
            return true;
    return t->copier_next.pid > 0 && pid == t->copier_next.pid;
}

/* A copier waiting for a job, not wanted any more: killed while it is not
 * reaped (its number is still its own), and its socket closed. */
static void copier_let_go(struct copier_ref *c)
{
    if (c->pid > 0)
        kill(c->pid, SIGKILL); /* reaped as any child of ours */
    c->pid = 0;
    close_fd(&c->sock);
}

bool copier_reaped(struct tmpl *t, pid_t pid)
{
    if (t->copier_next.pid > 0 && pid == t->copier_next.pid) {
        /* The copier made ahead died unused (its number may be another's
         * soon: never signalled again). The next is made when a copy
         * wants one: never in a loop of deaths. */
        t->copier_next.pid = 0;
        t->copier_wanted = false;
        close_fd(&t->copier_next.sock);
        return true;
    }
    for (struct session_rec *s = t->sessions; s; s = s->next)
        if (s->copier_kept.pid > 0 && pid == s->copier_kept.pid) {
            /* Idle too long, or done with its CPU: the next branch has a
             * copier of its own. */
            s->copier_kept.pid = 0;
            close_fd(&s->copier_kept.sock);
            return true;
        }
    return false;
}

/* The directory of process |pid|'s descriptors, /proc/PID/fd, or NULL. */
static DIR *fd_dir(const struct tmpl *t, pid_t pid)
{
    char path[32];

    fmt(path, sizeof(path), "%d/fd", (int)pid);
    int fd = openat(t->proc_fd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d && fd >= 0)
        close(fd);
    return d;
}

/* Whether process |pid| holds the socket whose inode is |ino|. */
static bool holds_socket(const struct tmpl *t, pid_t pid, ino_t ino)
{
    DIR *d = fd_dir(t, pid);
    bool found = false;

    if (!d)
        return false;
    for (struct dirent *e; !found && (e = readdir(d));) {
        struct stat st;
        found = e->d_name[0] != '.' && fstatat(dirfd(d), e->d_name, &st, 0) == 0 &&
                S_ISSOCK(st.st_mode) && st.st_ino == ino;
    }
    closedir(d);
    return found;
}

/* The child of the fork let through for |w| (the next cell, or one no
 * longer wanted): a child of ours that we did not make (the kernel keeps
 * the list; CLONE_PARENT made it ours) and that is the session's: of its
 * uid, when the session has one of its own, else holding |w|'s channel,
 * which it inherited. A fork is let through once, so there is one such
 * child at most. 0 when there is none (yet). */
static pid_t child_of_fork(const struct tmpl *t, const struct session_rec *s,
                           const struct worker_rec *w)
{
    char name[32], buf[8192];

    fmt(name, sizeof(name), "task/%d/children", (int)t->pid);
    if (!read_proc(t, t->pid, name, buf, sizeof(buf)))
        return 0;
    for (char *p = buf, *end; *p; p = end) {
        long pid = strtol(p, &end, 10);
        if (end == p)
            break;
        if (pid <= 0 || known_child(t, (pid_t)pid))
            continue;
        if (s->own_uid ? status_number(t, (pid_t)pid, "Uid:") == (long)s->uid
                       : holds_socket(t, (pid_t)pid, w->chan_ino))
            return (pid_t)pid;
    }
    return 0;
}

/* No process holds a write end of the cell's stdout or stderr any more:
 * what it wrote is all there will be. */
static bool output_closed(const struct worker_rec *w)
{
    struct pollfd p[2] = {{.fd = w->out_watch[0]}, {.fd = w->out_watch[1]}};

    return poll(p, 2, 0) == 2 && (p[0].revents & POLLHUP) && (p[1].revents & POLLHUP);
}

/* The device of the session's workspace: a kept file is a regular file of
 * it. */
static dev_t ws_dev(const struct session_rec *s)
{
    struct stat st;

    return fstat(s->ws_fd, &st) == 0 ? st.st_dev : (dev_t)-1;
}

/* --- processes ------------------------------------------------------------ */

/* Stopped by SIGSTOP, whose stop the kernel reports (waitid); frozen once
 * it is seen stopped (hold_stopped: a frozen process does not take a stop
 * signal). A SIGCONT it arranged for itself, from then on, only wakes it
 * into the freezer; one before that is reported too (CLD_CONTINUED), and
 * ends its session (session_continued); one that came before the stop
 * discarded it, and it is sent again (watch_stopped). */
static void proc_stop(struct worker_rec *w)
{
    if (w && w->pid && !w->dead && !w->stop_sent) {
        w->stop_sent = true;
        w->stop_sent_ns = now_ns();
        kill(w->pid, SIGSTOP);
    }
}

/* Between cells (and while a branch or an image is made of it) nothing of
 * the session runs: every process of it the kernel has reported stopped,
 * none made or being made. Then it is frozen: a SIGCONT its
 * code arranged can end a stop, but not let it run. */
static void maybe_freeze(struct session_rec *s)
{
    bool idle = s->phase == SESS_WAITING && !s->cell && !s->candidate && s->state &&
                s->state->stop_seen && (!s->coming || (s->coming->pid && s->coming->stop_seen)) &&
                (s->making == NEXT_NONE || s->making == NEXT_MADE || s->making == NEXT_FAILED);

    if (idle && !s->frozen && s->cg.freeze >= 0)
        s->frozen = freezer_cg_set(&s->cg, true) == 0;
}

/* Let run again: its session thawed first, or SIGCONT would only wake it
 * into the freezer. */
static void proc_continue(struct tmpl *t, struct worker_rec *w)
{
    siginfo_t si;
    struct session_rec *s = w->session;

    (void)t;
    if (s && s->frozen) {
        (void)freezer_cg_set(&s->cg, false);
        s->frozen = false;
    }
    w->stop_sent = w->stop_seen = false;
    kill(w->pid, SIGCONT);
    /* Our own continue is not reported as another's (the kernel notes it
     * as SIGCONT is sent). */
    (void)waitid(P_PID, (id_t)w->pid, &si, WCONTINUED | WNOHANG);
}

/* Seen stopped: its CPU clock noted, to hold it to having stopped. */
static void hold_stopped(struct worker_rec *w)
{
    w->stop_cpu_ns = cpu_ns(w->pid);
    w->stop_ns = now_ns();
}

/* The CPU |w| used since it was seen stopped, in ns, if that is more than
 * the kernel spends waking a frozen process for the signals it gets (a
 * moment each, never the code's: STOPPED_CPU_SLACK_NS and 1% of the time);
 * else 0. */
static uint64_t ran_while_stopped(const struct worker_rec *w)
{
    if (!w || !w->stop_seen || w->dead || !w->pid)
        return 0;
    uint64_t cpu = cpu_ns(w->pid), now = now_ns();
    uint64_t used = cpu > w->stop_cpu_ns ? cpu - w->stop_cpu_ns : 0;
    return used > STOPPED_CPU_SLACK_NS + (now - w->stop_ns) / 100 ? used : 0;
}

/* Kills the process in |*role| and takes it out of the role: it is counted
 * (procs) until it is reaped. A process never born is forgotten now. */
static void release(struct tmpl *t, struct worker_rec **role)
{
    struct worker_rec *w = *role;

    *role = NULL;
    if (!w)
        return;
    if (!w->pid) {
        struct worker_rec **pp = &t->workers;
        while (*pp && *pp != w)
            pp = &(*pp)->next;
        if (*pp)
            *pp = w->next;
        forget_worker(t, w);
        return;
    }
    if (!w->dead)
        kill(w->pid, SIGKILL);
}

/* |w|, a process record of |s| not yet born, gets the child of its fork,
 * which is then killed: it is counted until it is reaped. */
static void kill_found(struct session_rec *s, struct worker_rec *w, pid_t pid)
{
    w->pid = pid;
    s->procs++;
    kill(pid, SIGKILL);
}

/* The coming cell is given up, and |from| with it (the caller kills or
 * stops |from|). A fork already let through whose child is not found yet
 * leaves that child to be found and killed (the stray), looked for until
 * its parent has been reaped: nothing a session's process makes goes
 * unseen. */
static void drop_coming(struct tmpl *t, struct session_rec *s)
{
    struct worker_rec *w = s->coming;

    if (w && !w->pid && s->forked) {
        pid_t pid = child_of_fork(t, s, w);
        if (pid)
            kill_found(s, w, pid);
        else if (!s->stray && s->from) {
            s->stray = w;
            s->stray_from = s->from->id;
            s->stray_look_ns = now_ns() + LOOK_NS;
            s->coming = NULL;
        } else
            s->lost_track = true; /* the tick ends the session */
    }
    release(t, &s->coming);
    if (s->from)
        disarm_limits(s->from);
    s->from = NULL;
    s->coming_of = 0;
    s->forked = false;
    s->making = NEXT_NONE;
}

/* The stray, looked for again; |last|: its parent is gone, so the fork is
 * over and what is not there now never will be. */
static void look_for_stray(struct tmpl *t, struct session_rec *s, bool last)
{
    struct worker_rec *w = s->stray;
    pid_t pid = w ? child_of_fork(t, s, w) : 0;

    if (!w)
        return;
    if (pid)
        kill_found(s, w, pid);
    if (pid || last) {
        s->stray = NULL;
        release(t, &w);
    } else
        s->stray_look_ns = now_ns() + LOOK_NS;
}

/* Kills every process of the session's uid in our pid namespace, then
 * asks the kernel whether the uid still has any process at all, from a
 * child that is that uid and nothing more (vfork: the template waits the
 * microseconds it takes). kill(-1)'s answer cannot tell: it succeeds when
 * it found anyone, those it may not signal included. The kernel's count of
 * the uid's processes can: with RLIMIT_NPROC at 2 the child can fork one
 * more only if it is the uid's only process (the count holds every task
 * of the uid, threads and processes not yet reaped included, in any pid
 * namespace). Returns 1 when some are left, 0 when none is, or -1 when it
 * could not look. */
static int sweep_uid(uid_t uid, gid_t gid)
{
    int st;
    pid_t pid = vfork();

    if (pid == 0) {
        /* The system calls themselves: glibc's wrappers would talk to
         * threads this child does not have. Taking the uid drops every
         * capability, so the limit below binds. */
        struct rlimit two = {2, 2};
        if (syscall(SYS_setgroups, 0, NULL) != 0 || syscall(SYS_setresgid, gid, gid, gid) != 0 ||
            syscall(SYS_setresuid, uid, uid, uid) != 0 ||
            syscall(SYS_prlimit64, 0, RLIMIT_NPROC, &two, NULL) != 0)
            _exit(3);
        /* kill(-1) reaches the processes of |uid| alone, and only those of
         * our pid namespace. */
        (void)kill(-1, SIGKILL);
        pid_t probe = vfork();
        if (probe == 0)
            _exit(0);
        if (probe < 0)
            _exit(errno == EAGAIN ? 1 : 3);
        while (waitpid(probe, NULL, 0) < 0 && errno == EINTR)
            ;
        _exit(0);
    }
    if (pid < 0)
        return -1;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) <= 1 ? WEXITSTATUS(st) : -1;
}

static void free_session(struct tmpl *t, struct session_rec *s, bool release_uid)
{
    struct session_rec **pp = &t->sessions;

    if (t->spare == s)
        t->spare = NULL;
    while (*pp && *pp != s)
        pp = &(*pp)->next;
    if (*pp)
        *pp = s->next;
    /* Read what the supervisor sent and we will not answer: closing with it
     * unread would reset the channel, and the supervisor would read that
     * before the ENDED we sent it. */
    char drop[256];
    while (s->chan >= 0 && recv(s->chan, drop, sizeof(drop), MSG_DONTWAIT) > 0)
        ; /* descriptors sent with it are released unreceived */
    close_fd(&s->chan);
    close_fd(&s->listener);
    close_fd(&s->ws_fd);
    close_fd(&s->saved_fd);
    close_fd(&s->copier_fd);
    copier_let_go(&s->copier_kept);
    close_fd(&s->image_fd);
    freezer_cg_end(&t->freezer, s->id, &s->cg);
    prefault_free(&s->plan);
    prefault_free(&s->reads);
    if (release_uid)
        uids_release(&t->uids, s->slot);
    free(s);
}

/* An ended session is freed once its processes are reaped and no process
 * holds its uid; its channel's end then tells the supervisor. */
static void maybe_free(struct tmpl *t, struct session_rec *s)
{
    if (s->phase != SESS_ENDING || s->procs > 0)
        return;
    int found = s->own_uid ? sweep_uid(s->uid, s->gid) : 0;
    if (found > 0 && now_ns() < s->ended_ns + SWEEP_GIVE_UP_NS) {
        /* Killed: reaped by us (our children) or the keeper; look again. */
        s->recheck_ns = now_ns() + RECHECK_NS;
        return;
    }
    /* A uid that could not be looked at, or that a process outside our
     * namespace still holds, is not handed out again. */
    free_session(t, s, found == 0);
}

static void end_session(struct tmpl *t, struct session_rec *s, const char *why)
{
    if (s->phase == SESS_ENDING)
        return;
    if (why)
        send_text(s, WIRE_ENDED, why);
    s->phase = SESS_ENDING;
    s->ended_ns = now_ns();
    s->recheck_ns = 0;
    /* Its origin goes on. */
    struct session_rec *a = s->branch_of ? find_session(t, s->branch_of) : NULL;
    if (a && a->held_by == s->id)
        release_hold(t, a);
    /* A branch that resumed and is still filled from our state: the state
     * stays (stopped, as it is) until the fill ends, then goes
     * (release_hold), and we are freed once it is reaped. */
    struct session_rec *b = s->held_by ? find_session(t, s->held_by) : NULL;
    bool lend = b && b->filling && b->phase != SESS_ENDING;
    s->filling = false;
    if (s->copier > 0)
        kill(s->copier, SIGKILL); /* reaped as any child of ours */
    s->copier = 0;
    close_fd(&s->copier_fd);
    copier_let_go(&s->copier_kept);
    close_fd(&s->image_fd);
    s->saving = SAVE_NONE;
    drop_coming(t, s);
    /* Whatever a fork let through made is of the session's uid: the sweep
     * of the uid finds it (maybe_free). */
    if (s->stray)
        release(t, &s->stray);
    if (!lend)
        release(t, &s->state);
    release(t, &s->candidate);
    /* The cell out is killed as by its deadline; its status says the
     * session ended (it stays the cell until it is reaped). */
    if (s->cell && !s->cell->dead)
        kill(s->cell->pid, SIGKILL);
    /* A branch being made of it cannot be made now: it ends at once, not
     * at its budget. */
    if (s->held_by && !lend) {
        s->held_by = 0;
        if (b && b->phase == SESS_OPENING)
            end_session(t, b, "the session branched from ended before its copy was made");
    }
    maybe_free(t, s);
}

/* A session's process said what it may not say now. */
static void broke_the_rule(struct tmpl *t, struct session_rec *s, const char *who, char what)
{
    char why[WIRE_TEXT_MAX];

    fmt(why, sizeof(why),
        "the session ended: its %s sent a message it may not send while the session is %s "
        "('%c'); nothing a session's process says is taken on trust",
        who, sess_names[s->phase], what >= 0x20 && what < 0x7f ? what : '?');
    end_session(t, s, why);
}

/* --- opening ---------------------------------------------------------------- */

/* The probe's stack: it runs in our memory (CLONE_VM) while we wait. */
static char idle_probe_stack[16384] __attribute__((aligned(16)));

__attribute__((no_sanitize("address", "undefined"))) static int idle_probe(void *ok)
{
    struct sched_param none = {0};

    /* Itself alone, through the system calls only (our memory, our errno:
     * we wait meanwhile). */
    *(bool *)ok = syscall(SYS_sched_setscheduler, 0, SCHED_IDLE, &none) == 0 &&
                  syscall(SYS_sched_setscheduler, 0, SCHED_OTHER, &none) == 0;
    syscall(SYS_exit, 0);
    return 0;
}

/* Whether a cell made ahead may warm at the lowest priority (SCHED_IDLE):
 * only if it can be given its own back when it is handed out, which takes
 * our CAP_SYS_NICE or an RLIMIT_NICE of 20 (the kernel's can_nice). Tried
 * once, by a child that shares our memory (a pid namespace of our own
 * allows no thread), which the kernel checks as it would a cell: our
 * capabilities, our limits (which a cell inherits). */
static bool found_idle_warm(void)
{
    bool ok = false;
    pid_t pid = clone(idle_probe, idle_probe_stack + sizeof(idle_probe_stack),
                      CLONE_VM | CLONE_VFORK | SIGCHLD, &ok);

    if (pid < 0)
        return false;
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    return ok;
}

/* A session's record, before it has a supervisor or a process. */
static struct session_rec *session_new(struct tmpl *t, int chan)
{
    struct session_rec *s = calloc(1, sizeof(*s));

    if (!s)
        return NULL;
    *s = (struct session_rec){.chan = chan,
                              .listener = -1,
                              .ws_fd = -1,
                              .saved_fd = -1,
                              .copier_fd = -1,
                              .copier_kept = {.sock = -1},
                              .image_fd = -1,
                              .cg = {.dir = -1, .freeze = -1}};
    s->id = ++t->next_id;
    s->own_uid = t->uids.per_run;
    return s;
}

/* |s|'s first process, made as a worker is (spawn_process), born in a
 * cgroup of the session's own, and the tmpfs of its saved files. Returns 0
 * (|s| linked; if the saved files could not be had, it is ending), or -1
 * with |why| (nothing of it left but |s| itself). */
static int session_spawn(struct tmpl *t, struct session_rec *s, char *why, size_t cap)
{
    /* Its processes are born in a cgroup of its own, frozen between cells. */
    int rc = t->freeze ? freezer_cg_new(&t->freezer, s->id, &s->cg) : 0;
    if (rc < 0) {
        fmt(why, cap, "template: a cgroup for the session: %s", strerror(-rc));
        return -1;
    }
    if (!spawn_process(t, s, why, cap)) {
        freezer_cg_end(&t->freezer, s->id, &s->cg);
        return -1;
    }
    s->next = t->sessions;
    t->sessions = s;
    /* The saved files: a tmpfs of the session's own, mounted nowhere. */
    int mnt = workspace_mount_detached(&t->jail, s->uid, s->gid, why, cap);
    if (mnt >= 0) {
        s->saved_fd = openat(mnt, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        close(mnt);
        if (s->saved_fd < 0)
            fmt(why, cap, "template: opening a session's saved workspace: %s", strerror(errno));
    }
    if (s->saved_fd < 0)
        end_session(t, s, why);
    return 0;
}

/* Whether a session being opened is on its way: its first process getting
 * ready, its copier at work (on this CPU or the other), its copy resuming.
 * What is made ahead waits for it (the loop's time, and a CPU, are its
 * now). Not a session that waits for its image or for its origin's cell
 * to end. */
static bool opening_waits(const struct tmpl *t)
{
    for (const struct session_rec *s = t->sessions; s; s = s->next)
        if (s->phase == SESS_OPENING && s != t->spare && s->branch_step != BR_IMAGE &&
            s->branch_step != BR_ORIGIN)
            return true;
    return false;
}

/* Whether a spare first process or a copier is to be made ahead. */
static bool ahead_due(const struct tmpl *t)
{
    return (t->spare_due || (t->copier_wanted && t->copier_next.pid <= 0)) && !opening_waits(t);
}

/* When it may be made (AHEAD_QUIET_NS). */
static uint64_t ahead_at(const struct tmpl *t)
{
    uint64_t quiet = t->busy_ns + AHEAD_QUIET_NS, latest = t->ahead_due_ns + AHEAD_LATEST_NS;

    return quiet < latest ? quiet : latest;
}

/* |*flag| (spare_due, copier_wanted) set, at the opening or the copy that
 * used what was made ahead: what is made ahead waits from then. */
static void ahead_wanted(struct tmpl *t, bool *flag)
{
    t->ahead_due_ns = now_ns();
    *flag = true;
}

/* A session's first process made ahead, as workers are: spawning and
 * confining one is most of what opening a session (or a branch) costs.
 * Once sessions are used at all; one at a time; when the loop has been
 * quiet a moment and no session is on its way (sessions_tick). */
static void make_spare(struct tmpl *t)
{
    char why[WIRE_TEXT_MAX];

    if (t->spare || !t->session_policy_built || t->single_run)
        return;
    struct session_rec *s = session_new(t, -1);
    if (!s)
        return;
    if (session_spawn(t, s, why, sizeof(why)) < 0) {
        free(s);
        return;
    }
    if (s->phase != SESS_ENDING)
        t->spare = s;
}

static void session_begin(struct tmpl *t, struct session_rec *s);
static void restore_advance(struct tmpl *t, struct session_rec *s);
static void save_advance(struct tmpl *t, struct session_rec *s);

void session_open(struct tmpl *t, const struct wire_session_open *m, int chan)
{
    struct session_rec *s = session_new(t, chan);
    char why[WIRE_TEXT_MAX];

    if (!s) {
        close(chan);
        return;
    }
    s->memory = m->memory_bytes;
    s->idle_ns = m->idle_ms * 1000000ULL;
    s->lifetime_ns = m->lifetime_ms * 1000000ULL;
    s->opened_ns = s->idle_since_ns = now_ns();
    if (m->branch_of) {
        struct session_rec *from = find_session(t, m->branch_of);
        if (!from || from->phase == SESS_ENDING || from->phase == SESS_OPENING || !from->state) {
            fmt(why, sizeof(why), "the session to branch from has ended");
            goto refuse;
        }
        /* The ceiling the origin has (what its code may have lowered it to
         * included), and room for the import's stack. */
        uint64_t as = as_hard_limit(t, from);
        if (!as) {
            fmt(why, sizeof(why), "template: the state's memory limit could not be read");
            goto refuse;
        }
        s->as_limit = as + BRANCH_IMPORT_STACK;
        s->memory = from->memory;
        s->branch_of = from->id;
        s->branch_step = BR_READYING;
        s->branch_by_ns = s->opened_ns + BRANCH_BUDGET_NS;
    } else if (m->restore) {
        s->restoring = true;
        s->branch_step = BR_READYING;
        s->branch_by_ns = s->opened_ns + BRANCH_BUDGET_NS;
    }
    if (!t->root || !t->seccomp || !t->pid_ns || !t->proc_ok) {
        fmt(why, sizeof(why), "%s",
            !t->root      ? "sessions need the private root (the mount namespace): each keeps a "
                            "second workspace mounted nowhere"
            : !t->seccomp ? "sessions need the seccomp layer: it is what lets only the sandbox "
                            "fork a session's state"
            : !t->pid_ns  ? "sessions need a pid namespace (no process of a session may outlive "
                            "the sandbox): "
                          : "sessions need /proc of the sandbox's own pid namespace: ");
        if (t->root && t->seccomp)
            fmt(why + strlen(why), sizeof(why) - strlen(why), "%s",
                !t->pid_ns ? t->pidns_why : t->proc_why);
        goto refuse;
    }
    if (!t->session_policy_built) {
        if (policy_build(&t->session_policy, t->policy_debug, !t->root, true, why, sizeof(why)) < 0)
            goto refuse;
        t->session_policy_built = true;
        t->idle_warm = found_idle_warm();
    }
    if (!notif && seccomp_notify_alloc(&notif, &notif_resp) < 0) {
        fmt(why, sizeof(why), "template: out of memory");
        goto refuse;
    }
    struct session_rec *spare = t->spare;
    if (spare && spare->ready && spare->phase == SESS_OPENING) {
        /* The spare is this session's now: its record gets the request's
         * limits (its process, ready, gets its own when it begins). */
        t->spare = NULL;
        spare->chan = s->chan;
        spare->memory = s->memory;
        spare->idle_ns = s->idle_ns;
        spare->lifetime_ns = s->lifetime_ns;
        spare->opened_ns = spare->idle_since_ns = s->opened_ns;
        spare->as_limit = s->as_limit;
        spare->branch_of = s->branch_of;
        spare->restoring = s->restoring;
        spare->branch_step = s->branch_step;
        spare->branch_by_ns = s->branch_by_ns;
        free(s);
        session_begin(t, spare);
    } else if (session_spawn(t, s, why, sizeof(why)) < 0)
        goto refuse;
    /* The next one's, once this one no longer waits on the loop (making a
     * process takes the loop a millisecond or two). And a copier, if none
     * is made ahead: a session may be branched or saved from now on, and
     * the first copy of a sandbox waited for the fork of one and its
     * buffer's first writes (a branch of a small state 21 to 37 ms, the
     * next 3.5). */
    ahead_wanted(t, &t->spare_due);
    t->copier_wanted = true;
    return;

refuse:
    send_text(s, WIRE_FAIL, why);
    close(chan);
    free(s);
}

/* The first state is confined and hands over its listener. It has run
 * nothing of the tenant's yet: this once, what it sends is taken. A spare
 * then waits to be taken; any other begins its session. */
static void branch_advance(struct tmpl *t, struct session_rec *b);

static void state_ready(struct tmpl *t, struct session_rec *s, int listener)
{
    s->listener = listener;
    s->ready = true;
    if (s->chan >= 0)
        session_begin(t, s);
}

/* Its first process, ready, is told its memory ceiling and what it is:
 * a new session's state (its supervisor hears it is open, and the first
 * cell is made ahead) or a branch's (which then waits for its origin). */
static void session_begin(struct tmpl *t, struct session_rec *s)
{
    struct wire_session m = {.hdr = {WIRE_SESSION, WIRE_VERSION},
                             .pid = s->state->pid,
                             .uid = t->jail.switch_user ? s->uid : 0,
                             .gid = t->jail.switch_user ? s->gid : 0,
                             .id = s->id};
    struct session_begin b = {.cmd = SESSION_BEGIN,
                              .branch = s->branch_of || s->restoring,
                              .memory_bytes = s->memory,
                              .as_limit = s->as_limit};

    if (wire_send(s->state->ready_fd, &b, sizeof(b), NULL, 0) < 0) {
        end_session(t, s, "template: the session's first process does not listen");
        return;
    }
    if (s->branch_of) {
        s->branch_step = BR_ORIGIN;
        branch_advance(t, s);
        return;
    }
    if (s->restoring) {
        s->branch_step = BR_IMAGE;
        restore_advance(t, s);
        return;
    }
    if (wire_send(s->chan, &m, sizeof(m), NULL, 0) < 0) {
        end_session(t, s, NULL);
        return;
    }
    s->phase = SESS_WAITING;
    start_making(t, s, s->state); /* the first cell, made ahead */
}

/* --- making the next cell ------------------------------------------------- */

/* Both ends of a SOCK_SEQPACKET pair whose first end hears who sent what. */
static int channel_pair(int sv[2])
{
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return -errno;
    if (setsockopt(sv[0], SOL_SOCKET, SO_PASSCRED, &(int){1}, sizeof(int)) < 0) {
        int e = -errno;
        close_fds(sv, 2);
        return e;
    }
    return 0;
}

static void made(struct tmpl *t, struct session_rec *s);

/* The next cell cannot be made now: a cell asked for hears why; otherwise
 * the next one asked for tries again. */
static void give_up_making(struct session_rec *s, const char *why)
{
    if (why != s->fork_why)
        fmt(s->fork_why, sizeof(s->fork_why), "%s", why);
    s->making = NEXT_FAILED;
    if (s->phase == SESS_ASKED) {
        s->phase = SESS_WAITING;
        send_text(s, WIRE_FAIL, s->fork_why);
    }
}

/* No child came of the fork: |from| is stopped, then it is FAILED. A fork
 * let through keeps its record until then: once |from| is seen stopped its
 * clone is over, and a child the kernel lists then is killed (made()). */
static void fork_failed(struct tmpl *t, struct session_rec *s, const char *why)
{
    fmt(s->fork_why, sizeof(s->fork_why), "%s", why);
    if (!s->coming || s->coming->pid || !s->forked)
        release(t, &s->coming); /* never forked, or a child not to keep */
    s->making = NEXT_FAILING;
    proc_stop(s->from);
    if (s->from->stop_seen)
        made(t, s);
}

/* The ranges of |plan| added to |m|, until it has |upto|, each start or'ed
 * with |flag|. */
static void plan_ranges(struct session_fork_msg *m, const struct prefault *plan, uint64_t flag,
                        uint32_t upto)
{
    for (size_t i = 0; plan->recorded == 1 && i < plan->n && m->n_ranges < upto; i++) {
        m->ranges[m->n_ranges][0] = plan->ranges[i][0] | flag;
        m->ranges[m->n_ranges][1] = plan->ranges[i][1];
        m->n_ranges++;
    }
}

/* |from| is told to fork the next cell, with the cell's pipes; it runs
 * for that alone, within the fork's budget. */
static void start_making(struct tmpl *t, struct session_rec *s, struct worker_rec *from)
{
    int chan[2] = {-1, -1};
    char why[WIRE_TEXT_MAX];
    struct stat st;

    /* A cell made of a branch whose pages are not all in has its pages
     * put in too (branch_fill follows the fork), which costs a copy of
     * what the branch has not got yet: only a cell asked for is made
     * before the pages are in, not one made ahead. */
    if (s->filling && s->phase != SESS_ASKED) {
        s->fill_make_due = true;
        return;
    }
    s->fill_make_due = false;
    struct worker_rec *w = worker_new(t);
    if (!from || from->dead || s->phase == SESS_ENDING) {
        free(w);
        return;
    }
    if (!w) {
        give_up_making(s, "template: out of memory");
        return;
    }
    if (channel_pair(chan) < 0 || fstat(chan[1], &st) < 0) {
        fmt(why, sizeof(why), "template: making a cell's channel: %s", strerror(errno));
        close_fds(chan, 2);
        free(w); /* never linked: nothing of it is counted */
        give_up_making(s, why);
        return;
    }
    w->session = s;
    w->slot = s->slot;
    w->uid = s->uid;
    w->gid = s->gid;
    w->chan_ino = st.st_ino;
    fmt(w->name, sizeof(w->name), "%s", s->name);
    w->ready_fd = chan[0];
    w->next = t->workers;
    t->workers = w;
    t->n_workers++;
    s->coming = w;
    s->from = from;
    s->coming_of = from->id;
    s->forked = false;
    s->making = NEXT_FORKING;
    s->fork_by_ns = now_ns() + FORK_WALL_BUDGET_NS;
    /* Its fork's CPU is counted from here, and bounded. */
    from->cont_cpu_ns = cpu_ns(from->pid);
    disarm_limits(from);
    struct wire_started budget = {.cpu_used_ns = from->cont_cpu_ns,
                                  .cpu_limit_ns = FORK_CPU_BUDGET_NS};
    arm_cpu_limit(from, &budget);
    proc_continue(t, from);
    /* Its channel alone goes through |from|; its pipes are made when it is
     * handed out and go to the cell itself (announce). */
    struct session_fork_msg *m = &fork_msg;
    m->cmd = SESSION_FORK;
    m->n_ranges = 0;
    /* What it reads first (half the room at most): mapping a page of a
     * file is cheap, a fault on it is not. */
    plan_ranges(m, &s->reads, CELL_PLAN_READ, CELL_PLAN_MAX_RANGES / 2);
    plan_ranges(m, s->plan.recorded == 1 ? &s->plan : &t->prefault, 0, CELL_PLAN_MAX_RANGES);
    int rc =
        wire_send(from->ready_fd, m,
                  offsetof(struct session_fork_msg, ranges) + m->n_ranges * sizeof(m->ranges[0]),
                  &chan[1], 1);
    close(chan[1]);
    if (rc < 0)
        fork_failed(t, s, "the session's process does not listen");
}

/* The fork was let through: is its child there? (Ours by CLONE_PARENT; in
 * the kernel's list of our children once the clone has returned, and it
 * has once |from| or the child says anything.) */
static bool look_for_child(struct tmpl *t, struct session_rec *s)
{
    pid_t pid = s->making == NEXT_FORKED ? child_of_fork(t, s, s->coming) : 0;

    if (!pid)
        return false;
    struct worker_rec *w = s->coming;
    w->pid = pid;
    s->procs++;
    s->recheck_ns = 0;
    w->sup_fds[WFD_PIDFD] = pidfd_open(pid, 0);
    if (w->sup_fds[WFD_PIDFD] < 0) {
        char why[128];
        fmt(why, sizeof(why), "template: pidfd_open of a cell: %s", strerror(errno));
        end_session(t, s, why);
        return true;
    }
    s->making = NEXT_HOLDING;
    /* While it waits it warms at the lowest priority: its pages are worth
     * copying ahead, not at the expense of the runs running now. */
    if (t->idle_warm)
        (void)sched_setscheduler(pid, SCHED_IDLE, &(struct sched_param){0});
    proc_stop(s->from);
    /* The cell copies the pages a run writes while it waits (its CPU is
     * the cell's, counted from its birth): it is stopped when it says it
     * is ready, or after a moment whatever it says. */
    if (w->hello)
        proc_stop(w);
    else
        s->warm_by_ns = now_ns() + WARM_GRACE_NS;
    return true;
}

/* HOLDING or FAILING, and what it waits for is seen stopped. */
static void announce(struct tmpl *t, struct session_rec *s);

static void made(struct tmpl *t, struct session_rec *s)
{
    struct worker_rec *from = s->from;
    /* The next cell is stopped too, unless it is asked for already: then
     * it is handed out as it is (what it does until then is the cell's,
     * counted from its birth); |from| is stopped in any case. */
    bool coming_ready = s->coming && (s->coming->stop_seen || s->phase == SESS_ASKED);

    if (!from->stop_seen || (s->making == NEXT_HOLDING && !coming_ready))
        return;
    disarm_limits(from);
    uint64_t now_cpu = cpu_ns(from->pid);
    s->charge_ns = now_cpu > from->cont_cpu_ns ? now_cpu - from->cont_cpu_ns : 0;
    s->from = NULL;
    if (s->making == NEXT_FAILING) {
        struct worker_rec *w = s->coming;
        pid_t pid = w && !w->pid ? child_of_fork(t, s, w) : 0;
        if (pid)
            kill_found(s, w, pid); /* it said the fork failed: no cell of it */
        release(t, &s->coming);
        s->coming_of = 0;
        give_up_making(s, s->fork_why);
        return;
    }
    s->making = NEXT_MADE;
    if (s->phase == SESS_ASKED && !s->held_by)
        announce(t, s);
    maybe_freeze(s);
}

/* --- a cell ------------------------------------------------------------------ */

/* Room for what a cell is told as it is handed out (not on the stack). */
static struct cell_go cell_go;

/* The pipes of the cell |w| about to run: the supervisor's ends in its
 * sup_fds, the cell's sent to it on its channel, with its own descriptions
 * of the state's kept files (|own|, |n_own| of them, as cell_go says).
 * They are made now, not when the cell was forked: a write end the
 * template held meanwhile would be in every process it forks meanwhile,
 * for a moment each, and the cell's output would not be the cell's alone
 * to end. Returns 0 or -errno. */
static int cell_pipes(struct session_rec *s, struct worker_rec *w, const int *own, int n_own)
{
    int req[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1}, status[2] = {-1, -1};
    int fds[CELL_FDS + WIRE_HELD_MAX];
    int rc = 0;

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, req) < 0 || pipe2(out, O_CLOEXEC) < 0 ||
        pipe2(err, O_CLOEXEC) < 0 || pipe2(status, O_CLOEXEC) < 0 ||
        (w->sup_fds[WFD_WORKSPACE] = fcntl(s->ws_fd, F_DUPFD_CLOEXEC, 0)) < 0 ||
        (w->out_watch[0] = fcntl(out[0], F_DUPFD_CLOEXEC, 0)) < 0 ||
        (w->out_watch[1] = fcntl(err[0], F_DUPFD_CLOEXEC, 0)) < 0)
        rc = -errno;
    else {
        fds[0] = req[1];
        fds[1] = out[1];
        fds[2] = err[1];
        memcpy(fds + CELL_FDS, own, (size_t)n_own * sizeof(int));
        cell_go.cmd = CELL_GO;
        rc = wire_send(w->ready_fd, &cell_go, sizeof(cell_go), fds, CELL_FDS + n_own);
    }
    close_fd(&req[1]);
    close_fd(&out[1]);
    close_fd(&err[1]);
    w->status_fd = status[1];
    w->sup_fds[WFD_REQUEST] = req[0];
    w->sup_fds[WFD_STDOUT] = out[0];
    w->sup_fds[WFD_STDERR] = err[0];
    w->sup_fds[WFD_STATUS] = status[0];
    return rc;
}

/* Hands the made cell to the supervisor under the request's limits, and
 * lets it run. */
static void announce(struct tmpl *t, struct session_rec *s)
{
    struct worker_rec *w = s->coming;
    struct wire_worker m = {.hdr = {WIRE_WORKER, WIRE_VERSION}, .pid = w->pid};
    int fds[WFD_SESSION_COUNT + WIRE_HELD_MAX], own[WIRE_HELD_MAX];
    char why[WIRE_TEXT_MAX];

    /* The cell's own descriptions of the kept files, from the state it is
     * a fork of (stopped); the supervisor gets the files. */
    int n_kept = kept_hand_out(t->proc_fd, t->pid, s->state ? s->state->pid : 0, ws_dev(s),
                               &s->files, &cell_go, own, fds + WFD_SESSION_COUNT);
    int rc = n_kept < 0 ? n_kept : cell_pipes(s, w, own, n_kept);
    if (n_kept > 0)
        close_fds(own, (size_t)n_kept);
    if (rc < 0) {
        if (n_kept > 0)
            close_fds(fds + WFD_SESSION_COUNT, (size_t)n_kept);
        /* The cell goes; the next one asked for is made afresh. */
        fmt(why, sizeof(why), "template: making a cell's pipes: %s", strerror(-rc));
        release(t, &s->coming);
        s->making = NEXT_NONE;
        give_up_making(s, why);
        return;
    }
    s->coming = NULL;
    s->coming_of = 0;
    s->making = NEXT_NONE;
    s->cell = w;
    s->cell_flags = 0;
    s->cell_status = 0;
    s->cell_past = false;
    if (t->jail.switch_user) {
        m.uid = w->uid;
        m.gid = w->gid;
    }
    fmt(m.workspace, sizeof(m.workspace), "%s", w->name);
    memcpy(fds, w->sup_fds, sizeof(w->sup_fds));
    fds[WFD_SAVED] = s->saved_fd;
    /* Its own priority again, before the supervisor has its pipes: a cell
     * still warming is not stopped, and runs its code as soon as the
     * supervisor writes it (found_idle_warm: this can only fail if its
     * code lowered its own RLIMIT_NICE, which slows it alone). */
    if (t->idle_warm)
        (void)sched_setscheduler(w->pid, SCHED_OTHER, &(struct sched_param){0});
    rc = wire_send(s->chan, &m, sizeof(m), fds, WFD_SESSION_COUNT + n_kept);
    close_fds(w->sup_fds, WFD_COUNT);
    if (n_kept > 0)
        close_fds(fds + WFD_SESSION_COUNT, (size_t)n_kept);
    w->announced = true;
    w->started = true; /* the tenant's process: anything may have run */
    s->phase = SESS_RUNNING;
    if (rc < 0) {
        end_session(t, s, NULL); /* the supervisor is gone */
        return;
    }
    /* Its CPU time from its birth, the fork's cost included. */
    uint64_t cpu = s->cpu_ms * 1000000ULL;
    struct wire_started limits = {
        .cpu_used_ns = 0,
        .cpu_limit_ns = cpu > s->charge_ns ? cpu - s->charge_ns : 1,
        .wall_limit_ns = s->wall_ms * 1000000ULL,
    };
    arm_cpu_limit(w, &limits);
    proc_continue(t, w);
}

static void cell_asked(struct tmpl *t, struct session_rec *s, const struct wire_cell *c)
{
    s->rollback = c->rollback;
    s->cpu_ms = c->cpu_ms ? c->cpu_ms : 1;
    s->wall_ms = c->wall_ms ? c->wall_ms : 1;
    s->phase = SESS_ASKED;
    if (s->held_by) {
        /* A branch is being made of the state: the cell comes after. */
        s->make_due = s->making == NEXT_FAILED || s->making == NEXT_NONE;
        return;
    }
    if (s->making == NEXT_MADE)
        announce(t, s);
    else if (s->making == NEXT_HOLDING)
        made(t, s); /* once |from| is seen stopped */
    else if (s->making == NEXT_FAILED || s->making == NEXT_NONE)
        start_making(t, s, s->state);
}

/* The cell, stopped and seen stopped, may be kept: its status says so, and
 * the supervisor settles. Meanwhile the next cell is forked from it. */
static void keep_candidate(struct tmpl *t, struct session_rec *s, long hwm_kb)
{
    struct worker_rec *w = s->cell;
    struct wire_status st = {
        .magic = WIRE_STATUS_MAGIC,
        .wait_status = W_EXITCODE(s->cell_status & 0xff, 0),
        .started = 1,
        .flags = WIRE_STATUS_KEPT | (s->cell_past ? WIRE_STATUS_EXIT_PAST : 0),
        .utime_us = (int64_t)(cpu_ns(w->pid) / 1000),
        .maxrss_kb = hwm_kb,
        .cell_status = s->cell_status,
    };

    disarm_limits(w);
    (void)write_full(w->status_fd, &st, sizeof(st));
    close_fd(&w->status_fd);
    close_fds(w->out_watch, 2);
    /* Off the answer's path: which pages it wrote and read, for the cells after it
     * (learnt again now and then: reading a state's page map takes a
     * millisecond or more). */
    if (s->kept++ % CELL_PLAN_EVERY == 0) {
        prefault_free(&s->plan);
        prefault_free(&s->reads);
        (void)prefault_record(t->proc_fd, w->pid, CELL_PLAN_MAX_PAGES, PREFAULT_WRITTEN, &s->plan);
        (void)prefault_record(t->proc_fd, w->pid, CELL_PLAN_MAX_READ_PAGES, PREFAULT_READ,
                              &s->reads);
    }
    s->candidate = w;
    s->cell = NULL;
    s->phase = SESS_SETTLING;
    start_making(t, s, w);
}

/* The cell said its code ended, and the kernel says it is stopped: what
 * is it left with? */
static void cell_looked_at(struct tmpl *t, struct session_rec *s)
{
    static const char *const fields[] = {"Threads:", "VmHWM:"};
    struct worker_rec *w = s->cell;
    long got[2];

    copier_heard(t, s);
    if (s->phase == SESS_ENDING)
        return; /* the cell was killed with it, and is answered for as reaped */
    for (int i = 0; i < 2; i++)
        got[i] = status_number(t, w->pid, fields[i]);
    s->recheck_ns = 0;
    /* Threads still leaving are the kernel's work of ending them, on the
     * process's CPU clock after its stop was seen: its clock is held from
     * each look (watch_stopped leaves it alone meanwhile). */
    hold_stopped(w);
    if (got[0] != 1 && now_ns() < s->done_ns + THREAD_GRACE_NS) {
        s->recheck_ns = now_ns() + RECHECK_NS;
        return;
    }
    uint32_t flags = 0;
    if (got[0] != 1)
        flags |= WIRE_STATUS_THREADS_LEFT;
    if (!output_closed(w))
        flags |= WIRE_STATUS_OUTPUT_OPEN;
    if (kept_look(t->proc_fd, w->pid, w->chan_ino, ws_dev(s), &s->cand_files, s->fds_why,
                  sizeof(s->fds_why)) < 0)
        flags |= WIRE_STATUS_FDS_LEFT;
    bool wanted = s->cell_status == 0 || s->rollback != SBX_ROLLBACK_ON_ERROR;
    if (!flags && wanted) {
        keep_candidate(t, s, got[1]);
        return;
    }
    s->cell_flags = WIRE_STATUS_ROLLED_BACK | flags;
    s->phase = SESS_ROLLING;
    kill(w->pid, SIGKILL); /* its status goes out when it is reaped */
}

/* The supervisor's word on the cell settling: keep it, or not; then
 * |adopt| (with |nfds| descriptors) says which kept files it put back in
 * new inodes. */
static void settle(struct tmpl *t, struct session_rec *s, bool keep, const struct wire_adopt *adopt,
                   const int *fds, int nfds)
{
    if (keep) {
        if (!s->candidate) {
            end_session(t, s, "template: a cell was kept that could not be");
            return;
        }
        release(t, &s->state); /* the state it replaces */
        s->state = s->candidate;
        s->candidate = NULL;
        s->files = s->cand_files;
    } else {
        /* What was made or is being made of it goes with it. */
        bool remake = s->candidate || s->making == NEXT_NONE;
        if (s->candidate && s->coming_of == s->candidate->id)
            drop_coming(t, s);
        release(t, &s->candidate);
        /* Kept files the supervisor put back in new inodes: the state
         * takes them on before it forks the next cell (session_reaped
         * waits for this when the state keeps files). */
        int rc =
            adopt->n ? kept_adopt(s->state->ready_fd, ws_dev(s), &s->files, adopt, fds, nfds) : 0;
        if (rc < 0) {
            end_session(t, s,
                        "template: the supervisor's files for the session's kept files "
                        "could not be given to its state");
            return;
        }
        if (remake)
            start_making(t, s, s->state);
    }
    s->phase = SESS_WAITING;
    s->idle_since_ns = now_ns();
    make_if_due(t, s);
    maybe_freeze(s);
}

/* --- branching ------------------------------------------------------------ */

/* What the copier says when it is done. */
struct copier_result {
    int32_t rc;
    uint16_t filling; /* a branch resumed: its pages are being put in (a result follows) */
    uint16_t again;   /* the copier waits for another job (its socket closed: it ends) */
    uint64_t bytes;   /* an image written */
    char why[WIRE_TEXT_MAX];
};

/* What a copier makes: a branch of a live state, an image of a state, a
 * state of an image. */
enum copy_job { COPY_BRANCH, COPY_SAVE, COPY_RESTORE };

/* What the template asks of a copier: the job, the processes (as the
 * copier's pid namespace numbers them) and, for an image, what it needs;
 * with the copied-into process's channel (BRANCH, RESTORE) and the image's
 * descriptor (SAVE, RESTORE), in that order. Both ends are the template's
 * code: the copier never runs anything of a tenant's. */
struct copier_job {
    int32_t job; /* enum copy_job */
    uint32_t reserved;
    struct branch_pids pids;
    struct image_req req;
};

/* A copier's process, forked ahead when the loop is quiet (sessions_tick),
 * as the spare session's process is, once a session has opened: it holds
 * nothing but /proc (at 3) and its end of a socket (at 5), on which it
 * takes a job and answers; its buffer is in memory already
 * (branch_buffer_ready: each page of it written first during a copy is a
 * fault, about 3 to 5 us each on a VM we measured), its second thread
 * made, which copies beside the first (branch.c: it never runs anything
 * of a tenant's), and a copy rehearsed on its own memory. A branch copied (and
 * filled, if it was), it may take another (the template gives it the
 * same origin's next branch, copier_kept), with nothing of the last job's
 * but what it read of that origin's state, and warm for it; an image's
 * job is its last. It dies with us, and of its CPU (from its fork:
 * BRANCH_COPY_CPU_S for each job at least). */
static void copier_job(void);

_Noreturn static void copier_main(void)
{
    branch_buffer_ready(3);
    for (;;)
        copier_job();
}

/* One job of copier_main's; returns if another may come. */
static void copier_job(void)
{
    struct copier_job j;
    struct copier_result r = {0};
    struct branch_stats st;
    int fds[2] = {-1, -1}, got = 0;

    ssize_t n = wire_recv(5, &j, sizeof(j), fds, 2, &got);
    if (n != (ssize_t)sizeof(j))
        _exit(0); /* the template is gone, or closed our socket */
    /* The copied-into process's channel at 4, the image at 6 (moved out of
     * the way first: either may have come at the other's number). */
    int at[2] = {j.pids.to > 0 ? 4 : -1, j.job != COPY_BRANCH ? 6 : -1}, k = 0;
    if (got != (at[0] > 0) + (at[1] > 0))
        _exit(1);
    for (int i = 0; i < got; i++) {
        int moved = fcntl(fds[i], F_DUPFD, 64);
        close(fds[i]);
        fds[i] = moved;
    }
    for (int i = 0; i < 2; i++)
        if (at[i] > 0 && (fds[k] < 0 || dup2(fds[k++], at[i]) < 0))
            _exit(1);
    close_fds(fds, (size_t)got);
    struct branch_fill lazy;
    r.rc = j.job == COPY_BRANCH ? branch_copy(3, &j.pids, 4, &lazy, &st, r.why, sizeof(r.why))
           : j.job == COPY_SAVE ? image_save(3, &j.pids, &j.req, 6, &r.bytes, r.why, sizeof(r.why))
                                : image_restore(3, &j.pids, 4, &j.req, 6, r.why, sizeof(r.why));
    int out = 5;
    if (j.job == COPY_BRANCH && r.rc == 0 && lazy.n_runs) {
        /* Our socket above every userfaultfd we hold or will (a fork's
         * comes at the lowest number free): a process ending releases its
         * descriptors from the highest down (close_files closes them in
         * order, each released by task work, which runs last-in first),
         * so that if we die the template sees our end before any process
         * of the branch can read a page not put in as zeros (on_copier's
         * check as a cell ends). */
        struct rlimit nofile;
        if (getrlimit(RLIMIT_NOFILE, &nofile) < 0 || nofile.rlim_cur < 64 ||
            (out = dup3(5, (int)(nofile.rlim_cur > 4096 ? 4096 : nofile.rlim_cur) - 1, O_CLOEXEC)) <
                0)
            _exit(1);
        close(5);
        /* The branch resumed: its answer need not wait for the rest. */
        close(4);
        r.filling = 1;
        if (write_full(out, &r, sizeof(r)) < 0)
            _exit(1);
        r.filling = 0;
        r.rc = branch_fill(&lazy, r.why, sizeof(r.why));
        /* Its processes' userfaultfds closed before we say so: a fork
         * made after it waits on none. */
        branch_fill_free(&lazy);
    }
    struct timespec cpu;
    r.again = j.job == COPY_BRANCH && r.rc == 0 &&
              clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu) == 0 &&
              (uint64_t)cpu.tv_sec * 1000000000ULL + (uint64_t)cpu.tv_nsec < COPIER_KEEP_CPU_NS;
    if (write_full(out, &r, sizeof(r)) < 0 || !r.again)
        _exit(0);
    /* Nothing of the branch's kept: its channel (and, had it been filled,
     * the userfaultfds) was all of it. */
    close(4);
    if (out != 5 && (dup2(out, 5) < 0 || close(out) < 0))
        _exit(0);
}

/* A copier forked, into t->copier_next. Returns 0, or -errno with |why|. */
static int copier_fork(struct tmpl *t, char *why, size_t cap)
{
    int sv[2];

    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return errmsg(why, cap, -errno, "template: a socket for a copier: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close_fds(sv, 2);
        return errmsg(why, cap, -e, "template: fork of a copier: %s", strerror(e));
    }
    if (pid == 0) {
        int keep[2] = {fcntl(t->proc_fd, F_DUPFD, 64), fcntl(sv[1], F_DUPFD, 65)};
        struct rlimit cpu = {BRANCH_COPY_CPU_S + COPIER_KEEP_CPU_NS / 1000000000ULL,
                             BRANCH_COPY_CPU_S + COPIER_KEEP_CPU_NS / 1000000000ULL};
        /* /proc at 3 and the socket at 5; nothing else of ours. */
        if (keep[0] < 0 || keep[1] < 0 || dup2(keep[0], 3) < 0 || dup2(keep[1], 5) < 0 ||
            close_range(4, 4, 0) < 0 || close_range(6, ~0U, 0) < 0 ||
            prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || setrlimit(RLIMIT_CPU, &cpu) < 0)
            _exit(1);
        prctl(PR_SET_NAME, "pysbx-copier");
        copier_main();
    }
    close(sv[1]);
    t->copier_next.pid = pid;
    t->copier_next.sock = sv[0];
    return 0;
}

/* The copier made ahead, if any, gone. */
static void copier_drop(struct tmpl *t)
{
    copier_let_go(&t->copier_next);
}

/* A copy of |s|'s (the branch's, the saved or the restored session's) by
 * a copier (copier_main): for a branch, the one kept by its origin |a|;
 * else the one made ahead, or one forked now. It gets
 * the channel of the process copied into (which we do not read meanwhile:
 * session_heard) and the image's descriptor. |from| is the state copied
 * (BRANCH, SAVE). Returns 0, or -errno with |why|. */
static int start_copier(struct tmpl *t, struct session_rec *s, struct session_rec *a,
                        enum copy_job job, pid_t from, char *why, size_t cap)
{
    pid_t to = job == COPY_SAVE ? 0 : s->state->pid;
    /* The copier is in the pid namespace of our children (keeper.h): the
     * processes by the numbers it sees them by. */
    struct copier_job j = {
        .job = job,
        .pids = {from, to, to ? (pid_t)status_inner(t, to, "NSpid:") : 0},
        .req = {.tmpl = t->pid,
                .layout = t->layout,
                .max_bytes = s->image_max,
                .as_limit = job == COPY_SAVE ? as_hard_limit(t, s) : 0},
    };
    int fds[2], nfds = 0;

    if (to && j.pids.vm_to <= 0)
        return errmsg(why, cap, -ESRCH, "template: the state or its copy is gone");
    if (job != COPY_BRANCH && !j.req.layout)
        return errmsg(why, cap, -EIO, "template: its layout could not be read when it started");
    if (to)
        fds[nfds++] = s->state->ready_fd;
    if (job != COPY_BRANCH)
        fds[nfds++] = s->image_fd;
    /* The origin's, if it kept one that is still there (it may have gone
     * idle meanwhile: then another). */
    if (a && a->copier_kept.pid > 0) {
        if (wire_send(a->copier_kept.sock, &j, sizeof(j), fds, nfds) == 0) {
            s->copier = a->copier_kept.pid;
            s->copier_fd = a->copier_kept.sock;
            a->copier_kept = (struct copier_ref){.sock = -1};
            return 0;
        }
        copier_let_go(&a->copier_kept);
    }
    ahead_wanted(t, &t->copier_wanted);
    /* The one made ahead may have died meanwhile: then one forked now. */
    for (int attempt = 0; attempt < 2; attempt++) {
        int rc = t->copier_next.pid > 0 ? 0 : copier_fork(t, why, cap);
        if (rc < 0)
            return rc;
        rc = wire_send(t->copier_next.sock, &j, sizeof(j), fds, nfds);
        if (rc == 0) {
            s->copier = t->copier_next.pid;
            s->copier_fd = t->copier_next.sock;
            t->copier_next = (struct copier_ref){.sock = -1};
            return 0;
        }
        copier_drop(t);
        errmsg(why, cap, rc, "template: the copier does not listen: %s", strerror(-rc));
    }
    return -EPIPE;
}

static void save_done(struct tmpl *t, struct session_rec *s, int rc, uint64_t bytes,
                      const char *why);

static void fill_ended(struct tmpl *t, struct session_rec *b, int rc, const char *why);

/* The next cell, made ahead once a branch's pages are all in, if one was
 * due meanwhile (start_making) and the session is between cells with none
 * made or being made. With a cell out or being settled, its end or its
 * settling makes the next, as it does for any session. */
static void make_if_due(struct tmpl *t, struct session_rec *s)
{
    if (!s->fill_make_due || s->filling || (s->phase != SESS_WAITING && s->phase != SESS_ASKED) ||
        s->making != NEXT_NONE)
        return;
    start_making(t, s, s->state);
}

/* The copier's answer (or its end without one). The copier is the
 * template's code and has run nothing of a tenant's; what a branch's
 * process made it do is bounded by its CPU limit (BRANCH_COPY_CPU_S). */
static void on_copier(struct tmpl *t, struct session_rec *s)
{
    struct copier_result r;
    ssize_t got = read_full(s->copier_fd, &r, sizeof(r));

    if (got == (ssize_t)sizeof(r) && r.rc == 0 && r.filling && s->branch_step == BR_COPYING &&
        !s->saving && !s->restoring) {
        /* Resumed; the copier goes on, and its next word is its last. */
        s->filling = true;
        s->branch_step = BR_RESUMING;
        return;
    }
    /* A copier that copied a branch (only a branch's says again) and may
     * take another job waits for the origin's next branch (its socket
     * closed, it ends). */
    struct session_rec *a = s->branch_of ? find_session(t, s->branch_of) : NULL;
    if (got == (ssize_t)sizeof(r) && r.rc == 0 && r.again && a && a->phase != SESS_ENDING &&
        a->copier_kept.pid <= 0) {
        a->copier_kept = (struct copier_ref){.pid = s->copier, .sock = s->copier_fd};
        a->copier_kept_ns = now_ns() + COPIER_KEEP_MS * 1000000ULL;
        s->copier_fd = -1;
    }
    close_fd(&s->copier_fd);
    close_fd(&s->image_fd);
    s->copier = 0; /* reaped as any child of ours */
    if (got != (ssize_t)sizeof(r)) {
        r.rc = -EPIPE;
        r.filling = 0;
        fmt(r.why, sizeof(r.why), "the copy ended before it was made");
    }
    r.why[sizeof(r.why) - 1] = '\0';
    if (s->saving == SAVE_COPYING) {
        save_done(t, s, r.rc, r.bytes, r.why);
        return;
    }
    if (s->filling) {
        fill_ended(t, s, r.filling ? -EPROTO : r.rc, r.why);
        return;
    }
    if (r.rc < 0) {
        end_session(t, s, r.why);
        return;
    }
    s->branch_step = BR_RESUMING;
}

/* A branch whose pages are being put in: its copier's word, if it has
 * said one or ended, taken before a cell of it is answered for. Its end
 * shows before any process of the branch can read a page it did not put
 * in (copier_main puts its socket above its userfaultfds), so a cell that
 * ended after reading such a page is answered for as the session's end. */
static void copier_heard(struct tmpl *t, struct session_rec *s)
{
    struct pollfd p = {.fd = s->copier_fd, .events = POLLIN};

    if (s->filling && s->copier_fd >= 0 && poll(&p, 1, 0) == 1)
        on_copier(t, s);
}

bool session_heard(const struct worker_rec *w)
{
    return !(w->session && w == w->session->state && w->session->branch_step == BR_COPYING);
}

/* Whether |a|'s state may be copied now (for a branch, or an image): idle
 * (waiting, its next cell made, stopped), held by none, and seen by the
 * kernel to fork since it became the state, which a state does only once
 * it has written down its record (worker.h). It is copied as it is,
 * stopped: never let run for a copy. */
static bool copyable(const struct session_rec *a)
{
    return a->phase == SESS_WAITING && a->state && a->state->stop_seen && a->state->recorded &&
           !a->held_by && !a->adopt_due && !a->filling &&
           !(a->making >= NEXT_FORKING && a->making <= NEXT_FAILING);
}

/* |a|'s state is idle but has not forked since it became the state: a
 * fork of it is started if none was tried (its clone is the kernel's word
 * that its record is written), and if its last one failed before it
 * forked, why no copy can be made now (a cell asked for tries again), in
 * |why|. Returns true when the copy is refused. */
static bool unrecorded(struct tmpl *t, struct session_rec *a, char *why, size_t cap)
{
    if (a->phase != SESS_WAITING || !a->state || a->state->recorded || a->filling || a->adopt_due ||
        a->held_by)
        return false;
    if (a->making == NEXT_NONE)
        start_making(t, a, a->state);
    if (a->making != NEXT_FAILED)
        return false;
    fmt(why, cap, "the session's state has not forked a cell since it became the state (%.200s)",
        a->fork_why);
    utf8_terminate(why);
    return true;
}

/* A branch is a session whose first process, once confined, waits at its
 * import (branch.h) until the origin's state is idle (WAITING, its next
 * cell made, stopped: copyable); the state is then held, stopped as it is,
 * and copied. Its copy says when it has resumed; only then, with the
 * kernel's word that it has one thread and no descriptor but its own, is
 * the branch ready and its supervisor told (WIRE_SESSION, with the
 * workspaces whose files it copies). The origin only ever stops a moment
 * longer than it would, and runs nothing for the copy. */
static void branch_advance(struct tmpl *t, struct session_rec *b)
{
    struct session_rec *a = find_session(t, b->branch_of);
    char why[WIRE_TEXT_MAX];

    if (b->phase != SESS_OPENING)
        return;
    if (!a || a->phase == SESS_ENDING || !a->state) {
        end_session(t, b, "the session branched from ended before its copy was made");
        return;
    }
    if (b->branch_step != BR_ORIGIN)
        return;
    if (unrecorded(t, a, why, sizeof(why))) {
        end_session(t, b, why);
        return;
    }
    if (!copyable(a)) {
        b->recheck_ns = now_ns() + RECHECK_NS;
        return;
    }
    /* What the copy costs is the tenant's to size (its mappings, its
     * pages): never the loop's. */
    a->held_by = b->id;
    if (start_copier(t, b, a, COPY_BRANCH, a->state->pid, why, sizeof(why)) < 0)
        end_session(t, b, why);
    else
        b->branch_step = BR_COPYING;
}

/* The branch (or the image) holding |a| is done with it (it has its copy,
 * or ended): |a| goes on with what waited for it. */
static void release_hold(struct tmpl *t, struct session_rec *a)
{
    if (!a->held_by)
        return;
    a->held_by = 0;
    if (a->phase == SESS_ENDING) {
        /* Its state, kept for a branch's fill (end_session), goes now. */
        release(t, &a->state);
        return;
    }
    if (!a->state)
        return;
    if (a->make_due) {
        a->make_due = false;
        start_making(t, a, a->state);
    } else if (a->phase == SESS_ASKED && a->making == NEXT_MADE)
        announce(t, a);
}

/* The copy says it resumed: the branch is a session like any other. */
static void branch_resumed(struct tmpl *t, struct session_rec *b)
{
    struct session_rec *a = b->restoring ? NULL : find_session(t, b->branch_of);
    struct wire_session m = {.hdr = {WIRE_SESSION, WIRE_VERSION},
                             .pid = b->state->pid,
                             .uid = t->jail.switch_user ? b->uid : 0,
                             .gid = t->jail.switch_user ? b->gid : 0,
                             .id = b->id};

    if (!b->restoring && (!a || a->phase == SESS_ENDING || a->saved_fd < 0)) {
        end_session(t, b, "the session branched from ended before its files were copied");
        return;
    }
    char why[WIRE_STATUS_WHY_MAX];
    if (status_number(t, b->state->pid, "Threads:") != 1 ||
        kept_look(t->proc_fd, b->state->pid, b->state->chan_ino, ws_dev(b), &b->files, why,
                  sizeof(why)) < 0 ||
        b->files.n) {
        end_session(t, b,
                    "the branch's copy of the state holds a thread or a descriptor that a "
                    "state may not");
        return;
    }
    /* The origin's kept files: the branch's state takes on its own copies
     * of them (its supervisor sends them once it has copied the files),
     * before its first cell is made. A restored state has none: an image
     * is made of a state that keeps none (save_advance). */
    if (a) {
        b->files = a->files;
        kept_prune(t->proc_fd, a->state->pid, ws_dev(a), &b->files);
    }
    m.held = b->files.n;
    for (uint32_t i = 0; i < b->files.n; i++)
        m.held_ino[i] = b->files.v[i].ino;
    b->adopt_due = b->files.n > 0;
    b->branch_step = BR_NONE;
    /* A branch still being filled holds its origin until it is. */
    if (a && !b->filling)
        release_hold(t, a);
    if (wire_send(b->chan, &m, sizeof(m),
                  (const int[]){b->ws_fd, b->saved_fd, a ? a->saved_fd : -1},
                  a ? WIRE_BRANCH_FDS : WIRE_RESTORE_FDS) < 0) {
        end_session(t, b, NULL);
        return;
    }
    b->phase = SESS_WAITING;
    b->idle_since_ns = now_ns();
    if (b->adopt_due)
        proc_stop(b->state); /* nothing of it runs until then */
    else
        start_making(t, b, b->state);
}

/* The copier of branch |b| is done putting its pages in (|rc| 0), or is
 * not (an error, or its end: a page not put in would read as zeros, so
 * the branch is not a copy and ends). Its origin goes on, and a cell due
 * is made. */
static void fill_ended(struct tmpl *t, struct session_rec *b, int rc, const char *why)
{
    char msg[WIRE_TEXT_MAX];
    struct session_rec *a = find_session(t, b->branch_of);

    b->filling = false;
    if (rc < 0) {
        fmt(msg, sizeof(msg), "the branch's pages could not all be copied: %s",
            why[0] ? why : "its copier ended");
        end_session(t, b, msg);
        return;
    }
    /* Before its copy said it resumed, branch_resumed lets go of the
     * origin. */
    if (a && a->held_by == b->id && b->phase != SESS_OPENING)
        release_hold(t, a);
    make_if_due(t, b);
}

/* --- images --------------------------------------------------------------- */

/* Saving (WIRE_SAVE): once the state may be copied, as for a branch, the
 * session is held (no cell meanwhile) and a copier writes its image. */
static void save_advance(struct tmpl *t, struct session_rec *s)
{
    char why[WIRE_TEXT_MAX];

    if (s->saving == SAVE_WAIT) {
        if (unrecorded(t, s, why, sizeof(why))) {
            save_done(t, s, -EAGAIN, 0, why);
            return;
        }
        if (!copyable(s)) {
            s->save_look_ns = now_ns() + RECHECK_NS;
            return;
        }
        s->save_look_ns = 0;
        /* An image is the state's memory and its workspace's files: no
         * open file goes into it, and a state restored without the files
         * it holds would use numbers that name nothing, or another's. */
        if (s->files.n) {
            fmt(why, sizeof(why),
                "the state keeps %u file%s open from one cell to the next, and an image holds "
                "no open file: close %s in a cell, then save",
                s->files.n, s->files.n == 1 ? "" : "s", s->files.n == 1 ? "it" : "them");
            save_done(t, s, -EBUSY, 0, why);
            return;
        }
        s->held_by = s->id;
        if (start_copier(t, s, NULL, COPY_SAVE, s->state->pid, why, sizeof(why)) < 0)
            save_done(t, s, -EIO, 0, why);
        else
            s->saving = SAVE_COPYING;
    }
}

/* The image is written (or not, |rc|): the supervisor hears it, with the
 * saved copy of the files to write after it, and the session goes on. */
static void save_done(struct tmpl *t, struct session_rec *s, int rc, uint64_t bytes,
                      const char *why)
{
    struct wire_saved m = {.hdr = {WIRE_SAVED, WIRE_VERSION}, .rc = rc, .bytes = bytes};

    fmt(m.why, sizeof(m.why), "%s", why ? why : "");
    utf8_terminate(m.why);
    s->saving = SAVE_NONE;
    close_fd(&s->image_fd);
    if (wire_send(s->chan, &m, sizeof(m), rc == 0 ? &s->saved_fd : NULL, rc == 0 ? 1 : 0) < 0) {
        end_session(t, s, NULL);
        return;
    }
    release_hold(t, s);
    maybe_freeze(s);
}

/* A restored session's first process, ready at its import, and its image
 * there (WIRE_RESTORE): a copier makes it the image's state. */
static void restore_advance(struct tmpl *t, struct session_rec *s)
{
    char why[WIRE_TEXT_MAX];

    if (s->branch_step != BR_IMAGE || s->image_fd < 0)
        return;
    if (start_copier(t, s, NULL, COPY_RESTORE, 0, why, sizeof(why)) < 0)
        end_session(t, s, why);
    else
        s->branch_step = BR_COPYING;
}

/* --- what the kernel reports ----------------------------------------------- */

void session_stopped(struct tmpl *t, struct worker_rec *w)
{
    struct session_rec *s = w->session;

    hold_stopped(w);
    if (s->phase == SESS_STOPPING && w == s->cell)
        cell_looked_at(t, s);
    if ((s->making == NEXT_HOLDING || s->making == NEXT_FAILING) &&
        (w == s->from || w == s->coming))
        made(t, s);
    maybe_freeze(s); /* |w| is its, alive: |s| is not freed above */
}

void session_continued(struct tmpl *t, struct worker_rec *w)
{
    struct session_rec *s = w->session;
    char why[WIRE_TEXT_MAX];

    /* Frozen already: it only woke into the freezer (the CPU watch holds
     * it to that). */
    if (s->frozen || s->phase == SESS_ENDING)
        return;
    fmt(why, sizeof(why),
        "the session ended: its %s was let run while the sandbox held it stopped (a SIGCONT "
        "its code arranged)",
        w == s->state       ? "state"
        : w == s->cell      ? "cell"
        : w == s->candidate ? "kept cell"
        : w == s->coming    ? "next cell's process"
                            : "process");
    end_session(t, s, why);
}

void session_reaped(struct tmpl *t, struct worker_rec *w, int wait_status, const struct rusage *ru)
{
    struct session_rec *s = w->session;
    char why[WIRE_TEXT_MAX];
    const char *end = NULL;

    w->dead = true; /* reaped: nothing kills its pid now */
    if (w == s->cell)
        copier_heard(t, s); /* while it is still counted: |s| stays */
    s->procs--;
    if (w == s->from && s->making != NEXT_NONE && w->cpu_killed) {
        fmt(why, sizeof(why),
            "the session ended: its process did not fork the next cell within %llu ms of CPU",
            (unsigned long long)(FORK_CPU_BUDGET_NS / 1000000ULL));
        end = why;
    }
    if (w == s->cell) {
        struct wire_status st = status_of(w, wait_status, ru);
        if (s->phase == SESS_ROLLING) {
            /* It ended by itself; we killed it to roll it back. */
            st.wait_status = W_EXITCODE(s->cell_status & 0xff, 0);
            st.flags |= s->cell_flags;
            if (s->cell_flags & WIRE_STATUS_FDS_LEFT)
                fmt(st.fds_why, sizeof(st.fds_why), "%s", s->fds_why);
        }
        st.cell_status = s->cell_status;
        if (s->cell_past)
            st.flags |= WIRE_STATUS_EXIT_PAST;
        if (s->phase == SESS_ENDING)
            st.flags |= WIRE_STATUS_SESSION_ENDED;
        (void)write_full(w->status_fd, &st, sizeof(st));
        s->cell = NULL;
        s->recheck_ns = 0;
        if (s->phase != SESS_ENDING) {
            s->phase = SESS_SETTLING;
            /* A state that keeps files may have to take some on first, if
             * the cell deleted or replaced them (settle). */
            if (!s->files.n)
                start_making(t, s, s->state);
        }
    } else if (w == s->state) {
        s->state = NULL;
        if (!end) {
            fmt(why, sizeof(why), "the session's process died (%s %d)",
                WIFSIGNALED(wait_status) ? "signal" : "exit status",
                WIFSIGNALED(wait_status) ? WTERMSIG(wait_status) : WEXITSTATUS(wait_status));
            end = why;
        }
    } else if (w == s->candidate) {
        s->candidate = NULL;
        if (!end)
            end = "the session ended: the cell's process died as it was being kept";
    } else if (w == s->coming) {
        s->coming = NULL;
        if (s->making == NEXT_HOLDING)
            fork_failed(t, s, "the next cell's process died before it was handed out");
        else if (s->making == NEXT_MADE) {
            s->coming_of = 0;
            give_up_making(s, "the next cell's process died before it was handed out");
        }
    }
    if (w == s->from && !end && s->making != NEXT_NONE)
        end = "the session ended: its process died while it forked the next cell";
    if (s->stray && w->id == s->stray_from)
        look_for_stray(t, s, true); /* its fork is over: the child is there or never will be */
    forget_worker(t, w);
    if (end && s->phase != SESS_ENDING)
        end_session(t, s, end);
    else
        maybe_free(t, s);
}

/* --- what the session's processes say -------------------------------------- */

/* One message from |w|'s channel: its bytes in |buf| (|n|), the sender's
 * pid as the kernel gave it, a descriptor attached (or -1). Returns the
 * length, 0 at its end, -EAGAIN when there is none. */
static ssize_t hear(struct worker_rec *w, char *buf, size_t cap, pid_t *from, int *fd)
{
    union {
        char buf[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } c;
    struct iovec iov = {.iov_base = buf, .iov_len = cap};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf, .msg_controllen = sizeof(c.buf)};
    ssize_t n = recvmsg(w->ready_fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

    *from = 0;
    *fd = -1;
    if (n < 0)
        return errno == EINTR || errno == EAGAIN ? -EAGAIN : 0;
    for (struct cmsghdr *h = CMSG_FIRSTHDR(&msg); h; h = CMSG_NXTHDR(&msg, h)) {
        if (h->cmsg_level != SOL_SOCKET)
            continue;
        if (h->cmsg_type == SCM_CREDENTIALS && h->cmsg_len >= CMSG_LEN(sizeof(struct ucred))) {
            struct ucred cr;
            memcpy(&cr, CMSG_DATA(h), sizeof(cr));
            *from = cr.pid;
        } else if (h->cmsg_type == SCM_RIGHTS) {
            size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < k; i++) {
                int got;
                memcpy(&got, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
                if (*fd < 0 && i == 0)
                    *fd = got;
                else
                    close(got);
            }
        }
    }
    /* A message cut to the buffer is not a message we know. */
    if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
        return (ssize_t)cap + 1;
    return n;
}

/*
 * Each message, what the worst sender can do with it, and what it may do:
 *
 *   READY + listener, the first state, while OPENING: taken (it has run
 *     nothing of the tenant's yet). At any other time it ends the session.
 *   FORK_FAILED, from the process told to fork, while FORKING or FORKED: a
 *     hint to look at the kernel's list of our children; a child there is
 *     the next cell whatever the message says. A lie costs the tenant its
 *     own next cell.
 *   FORKED, from the state or the kept cell, at any time: a hint to look
 *     for the child now, acted on only while a fork it was let make is not
 *     found yet (it may come late: the process can be stopped before it
 *     says it). At worst a moment of the template's time per message, as
 *     any message is.
 *   HELLO, once, from the next cell's process (the sender's pid must be
 *     the child the kernel lists): a hint to look for it sooner.
 *   DONE + status, from the running cell: it is stopped and looked at; it
 *     can end its cell early (as sys.exit could), never extend it, and its
 *     status (64 bits and a flag for a value past them: any of them, a
 *     value the code could never have exited with included) can only
 *     choose between keep and roll back, as the code's own exit could, and
 *     misdescribe the cell's own end.
 *   Anything else, from anyone, at any time: the session ends.
 */
void session_said(struct tmpl *t, struct worker_rec *w)
{
    struct session_rec *s = w->session;
    char buf[WIRE_TEXT_MAX];
    pid_t from;
    int fd;
    ssize_t n = hear(w, buf, sizeof(buf) - 1, &from, &fd);

    if (n == -EAGAIN)
        return;
    if (n <= 0) {
        close_fd(&w->ready_fd);
        /* The last holder of an unborn cell's channel let go: no child is
         * coming of it, unless the kernel lists one. */
        if (w == s->coming && !w->pid &&
            (s->making == NEXT_FORKING || (s->making == NEXT_FORKED && !look_for_child(t, s))))
            fork_failed(t, s, "the session's process did not fork the cell");
        return;
    }
    buf[n < (ssize_t)sizeof(buf) ? n : (ssize_t)sizeof(buf) - 1] = '\0';
    /* A process killed (out of its role, not yet reaped) is not heard; a
     * stray's word is a hint to look for it now. */
    if (s->phase == SESS_ENDING || w->dead ||
        (w != s->state && w != s->candidate && w != s->coming && w != s->cell)) {
        close_fd(&fd);
        if (w == s->stray && s->phase != SESS_ENDING)
            look_for_stray(t, s, false);
        return;
    }
    if (w == s->state && s->phase == SESS_OPENING && n == 1 && buf[0] == SESSION_READY && fd >= 0 &&
        from == w->pid) {
        state_ready(t, s, fd);
        return;
    }
    close_fd(&fd);
    /* A branch's copy says it resumed, or that its import failed. It is
     * the tenant's process from its resumption: what it says only chooses
     * between its branch being ready (then the kernel is asked whether it
     * may be) and its end. */
    if (w == s->state && s->phase == SESS_OPENING && s->branch_step == BR_RESUMING &&
        from == w->pid && n >= 1 && (buf[0] == SESSION_BRANCHED || buf[0] == BRANCH_FAILED)) {
        char why[WIRE_TEXT_MAX];
        if (n == 1 && buf[0] == SESSION_BRANCHED) {
            branch_resumed(t, s);
            return;
        }
        fmt(why, sizeof(why), "the branch could not take the state: %.*s", 200, buf + 1);
        utf8_terminate(why);
        end_session(t, s, why);
        return;
    }
    if ((w == s->from || w == s->state || w == s->candidate) && n == 1 &&
        buf[0] == SESSION_FORKED && from == w->pid) {
        /* A hint, maybe late (the process may be stopped before it says
         * it): found or not, the kernel's list decides. */
        if (w == s->from && s->making == NEXT_FORKED)
            look_for_child(t, s);
        return;
    }
    if (w == s->from && (s->making == NEXT_FORKING || s->making == NEXT_FORKED) &&
        buf[0] == SESSION_FORK_FAILED && from == w->pid) {
        if (!look_for_child(t, s)) {
            char why[WIRE_TEXT_MAX];
            fmt(why, sizeof(why), "the session's process could not fork the cell: %.*s", 200,
                buf + 1);
            utf8_terminate(why);
            fork_failed(t, s, why);
        }
        return;
    }
    if (w == s->coming && n == 1 && buf[0] == CELL_HELLO && !w->hello) {
        if (!w->pid)
            look_for_child(t, s);
        if (w->pid && from == w->pid) {
            w->hello = true;
            s->warm_by_ns = 0;
            proc_stop(w);
            return;
        }
    }
    if (w == s->cell && n == 1 && buf[0] == CELL_HELLO && !w->hello && from == w->pid) {
        w->hello = true; /* read late: it was said before the cell ran */
        return;
    }
    if (w == s->cell && s->phase == SESS_RUNNING && n == CELL_DONE_LEN && buf[0] == CELL_DONE &&
        (unsigned char)buf[CELL_DONE_LEN - 1] <= 1 && from == w->pid) {
        memcpy(&s->cell_status, buf + 1, sizeof(s->cell_status));
        s->cell_past = buf[CELL_DONE_LEN - 1];
        s->done_ns = now_ns();
        s->phase = SESS_STOPPING;
        proc_stop(w);
        if (w->stop_seen)
            cell_looked_at(t, s);
        return;
    }
    broke_the_rule(t, s,
                   w == s->cell        ? "cell"
                   : w == s->coming    ? "next cell's process"
                   : w == s->candidate ? "kept cell"
                   : w == s->state     ? "state"
                                       : "process",
                   buf[0]);
}

/* --- the supervisor's requests ----------------------------------------------- */

/* A branch's copies of its origin's kept files, from its supervisor: its
 * state takes them on, then its first cell is made. */
static void branch_adopt(struct tmpl *t, struct session_rec *b, const struct wire_adopt *a,
                         const int *fds, int nfds)
{
    if (a->n != b->files.n ||
        kept_adopt(b->state->ready_fd, ws_dev(b), &b->files, a, fds, nfds) < 0) {
        end_session(t, b, "template: the branch's kept files could not be given to its state");
        return;
    }
    b->adopt_due = false;
    start_making(t, b, b->state);
}

static void on_channel(struct tmpl *t, struct session_rec *s)
{
    union {
        struct wire_hdr h;
        struct wire_cell cell;
        struct wire_settle settle;
        struct wire_image image;
        struct wire_adopt_msg adopt;
    } m;
    int fds[WIRE_HELD_MAX], nfds = 0;
    ssize_t n = wire_recv(s->chan, &m, sizeof(m), fds, WIRE_HELD_MAX, &nfds);

    /* An image's descriptor: to write a waiting session's state to, or to
     * read a restored one's from. */
    if (n == (ssize_t)sizeof(m.image) && nfds == 1 && s->image_fd < 0 &&
        ((m.h.type == WIRE_SAVE && s->phase == SESS_WAITING && !s->saving && !s->held_by) ||
         (m.h.type == WIRE_RESTORE && s->restoring && s->phase == SESS_OPENING))) {
        s->image_fd = fds[0];
        s->image_max = m.image.max_bytes;
        if (m.h.type == WIRE_SAVE) {
            s->saving = SAVE_WAIT;
            save_advance(t, s);
        } else
            restore_advance(t, s);
        return;
    }
    if (n == -EINTR || n == -EAGAIN)
        return;
    if (n <= 0) {
        end_session(t, s, NULL); /* the supervisor closed it */
        return;
    }
    if (n == (ssize_t)sizeof(m.cell) && m.h.type == WIRE_CELL && s->phase == SESS_WAITING &&
        !s->adopt_due && m.cell.rollback <= SBX_ROLLBACK_NEVER && nfds == 0) {
        cell_asked(t, s, &m.cell);
        return;
    }
    if (n == (ssize_t)sizeof(m.settle) && m.h.type == WIRE_SETTLE && s->phase == SESS_SETTLING &&
        m.settle.keep <= 1 && (m.settle.keep == 0 || nfds == 0)) {
        settle(t, s, m.settle.keep == 1, &m.settle.adopt, fds, nfds);
        close_fds(fds, (size_t)nfds);
        return;
    }
    if (n == (ssize_t)sizeof(m.adopt) && m.h.type == WIRE_ADOPT && s->phase == SESS_WAITING &&
        s->adopt_due) {
        branch_adopt(t, s, &m.adopt.adopt, fds, nfds);
        close_fds(fds, (size_t)nfds);
        return;
    }
    close_fds(fds, (size_t)nfds);
    end_session(t, s, "template: the supervisor asked out of turn");
}

/* --- the listener ------------------------------------------------------------- */

/* A call about a process by pid (a signal, a priority, an affinity; see
 * policy_self_arg) is let through only about the caller's own process or
 * thread, by the numbers of its own pid namespace; kill(0, sig), which
 * names the caller's process group, is done here as a signal to the
 * caller's process alone (a cell leads its own group, but a process whose
 * memory the tenant wrote need not); the session's fork only to the
 * process told to fork, its only thread, once. Anything else: EPERM. The
 * arguments are registers, which the caller cannot change while it waits,
 * and the notification is checked to be alive after /proc was read, so
 * that the pid read is still the caller's (and, being our child or our
 * child's, cannot be another's until we reap it). */
static void on_notification(struct tmpl *t, struct session_rec *s)
{
    memset(notif, 0, sizeof(*notif));
    if (seccomp_notify_receive(s->listener, notif) < 0)
        return; /* the caller is gone already */
    pid_t tid = (pid_t)notif->pid;
    int nr = notif->data.nr;
    bool allow = false;
    int emulate = -1; /* a signal to send the caller's process ourselves */
    long tgid = status_number(t, tid, "Tgid:");

    if (nr == SYS_clone) {
        struct worker_rec *f = s->from;
        allow = s->making == NEXT_FORKING && f && !f->dead && tid == f->pid &&
                notif->data.args[0] == POLICY_SESSION_FORK &&
                status_number(t, f->pid, "Threads:") == 1;
    } else if (nr == SYS_kill && notif->data.args[0] == 0) {
        emulate = (int)notif->data.args[1];
    } else if (policy_self_arg(nr) >= 0) {
        long pid = (long)(int)notif->data.args[policy_self_arg(nr)];
        allow = pid > 0 &&
                (pid == status_inner(t, tid, "NStgid:") || pid == status_inner(t, tid, "NSpid:"));
    }
    bool valid = seccomp_notify_id_valid(s->listener, notif->id) == 0;
    memset(notif_resp, 0, sizeof(*notif_resp));
    notif_resp->id = notif->id;
    if (valid && emulate >= 0 && tgid > 0)
        notif_resp->error = kill((pid_t)tgid, emulate) == 0 ? 0 : -errno;
    else if (valid && allow) {
        notif_resp->flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
        if (nr == SYS_clone) {
            s->from->recorded = true; /* it forks only once it wrote it */
            s->making = NEXT_FORKED;  /* the permit is spent */
            s->forked = true;
            s->recheck_ns = now_ns() + LOOK_NS;
        }
    } else
        notif_resp->error = -EPERM;
    (void)seccomp_notify_respond(s->listener, notif_resp);
}

/* --- the loop's side --------------------------------------------------------- */

size_t sessions_fd_count(const struct tmpl *t)
{
    size_t n = 0;

    for (const struct session_rec *s = t->sessions; s; s = s->next)
        n += 3;
    return n;
}

size_t sessions_poll_fds(struct tmpl *t, struct pollfd *pfd, uint64_t *ids, size_t n, size_t cap)
{
    for (struct session_rec *s = t->sessions; s && n + 3 <= cap; s = s->next) {
        bool open = s->phase != SESS_ENDING;
        ids[n] = s->id;
        pfd[n++] = (struct pollfd){.fd = open ? s->chan : -1, .events = POLLIN};
        ids[n] = s->id;
        pfd[n++] = (struct pollfd){.fd = open ? s->listener : -1, .events = POLLIN};
        ids[n] = s->id;
        pfd[n++] = (struct pollfd){.fd = open ? s->copier_fd : -1, .events = POLLIN};
    }
    return n;
}

void sessions_handle(struct tmpl *t, const struct pollfd *pfd, const uint64_t *ids, size_t from,
                     size_t n)
{
    for (size_t i = from; i < n; i++) {
        if (!pfd[i].revents || pfd[i].fd < 0)
            continue;
        /* Handling one may have ended another: look each up again, by the
         * id it was polled for (a descriptor number may be another's now). */
        struct session_rec *s = t->sessions;
        while (s && s->id != ids[i])
            s = s->next;
        if (!s || s->phase == SESS_ENDING)
            continue;
        if ((i - from) % 3 == 0 && s->chan == pfd[i].fd)
            on_channel(t, s);
        else if ((i - from) % 3 == 1 && s->listener == pfd[i].fd && (pfd[i].revents & POLLIN))
            on_notification(t, s);
        else if ((i - from) % 3 == 2 && s->copier_fd == pfd[i].fd)
            on_copier(t, s);
    }
}

static uint64_t soonest(uint64_t a, uint64_t b)
{
    return !a ? b : !b ? a : a < b ? a : b;
}

static uint64_t next_deadline(const struct session_rec *s)
{
    uint64_t d = soonest(s->recheck_ns, s->stray ? s->stray_look_ns : 0);

    if (s->lost_track)
        return 1;
    if (s->copier_kept.pid > 0)
        d = soonest(d, s->copier_kept_ns);
    if (s->saving == SAVE_WAIT)
        d = soonest(d, s->save_look_ns);
    if (s->phase == SESS_OPENING && (s->branch_of || s->restoring))
        return soonest(d, s->branch_by_ns);
    if (s->phase == SESS_ENDING || s->phase == SESS_OPENING)
        return d;
    if (s->making >= NEXT_FORKING && s->making <= NEXT_FAILING)
        d = soonest(d, s->fork_by_ns);
    if (s->making == NEXT_HOLDING)
        d = soonest(d, s->warm_by_ns);
    if (s->phase == SESS_WAITING)
        d = soonest(d, soonest(s->idle_since_ns + s->idle_ns, s->opened_ns + s->lifetime_ns));
    return d;
}

int sessions_timeout_ms(struct tmpl *t)
{
    uint64_t first = t->sessions ? t->watch_ns : 0, now = now_ns();

    /* Something to make ahead: when the loop has been quiet (sessions_tick). */
    if (ahead_due(t))
        first = soonest(first, ahead_at(t));
    for (struct session_rec *s = t->sessions; s; s = s->next)
        first = soonest(first, next_deadline(s));
    if (!first)
        return -1;
    if (first <= now)
        return 0;
    uint64_t ms = (first - now + 999999) / 1000000;
    return ms > 60000 ? 60000 : (int)ms;
}

/* Every process of every session that the kernel said was stopped, held
 * to it: one that ran since (resumed by a signal it arranged for itself,
 * where there is no freezer; or anything the freezer missed) ends its
 * session. All sessions at once, every STOPPED_WATCH_NS. */
static void watch_stopped(struct tmpl *t)
{
    for (struct session_rec *s = t->sessions, *next; s; s = next) {
        next = s->next;
        static const char *const roles[] = {"state", "kept cell", "next cell's process", "process",
                                            "cell"};
        struct worker_rec *procs[] = {s->state, s->candidate, s->coming, s->from, s->cell};
        for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]) && s->phase != SESS_ENDING; i++) {
            struct worker_rec *w = procs[i];
            if (w && w->stop_sent && !w->stop_seen && !w->dead && w->pid &&
                now_ns() > w->stop_sent_ns + STOP_AGAIN_NS) {
                w->stop_sent_ns = now_ns();
                kill(w->pid, SIGSTOP);
            }
            /* A cell killed to roll it back (or by its limits) runs only
             * the kernel's exit until it is reaped, which its CPU clock
             * counts: freeing a large address space takes milliseconds. */
            if (w && w == s->cell && (s->phase == SESS_ROLLING || w->cpu_killed || w->wall_killed))
                continue;
            /* A cell whose threads are still leaving is looked at again
             * meanwhile (cell_looked_at); it is a moment, and a SIGCONT
             * that lets it run is reported all the same. */
            uint64_t used = w == s->cell && s->recheck_ns ? 0 : ran_while_stopped(w);
            if (!used)
                continue;
            char why[WIRE_TEXT_MAX];
            fmt(why, sizeof(why),
                "the session ended: its %s ran while it was stopped between cells (%.1f ms of "
                "CPU)",
                roles[i], (double)used / 1e6);
            end_session(t, s, why); /* may free it */
            break;
        }
    }
    t->watch_ns = now_ns() + STOPPED_WATCH_NS;
}

void sessions_tick(struct tmpl *t, bool idle)
{
    uint64_t now = now_ns();

    if (idle && ahead_due(t) && now >= ahead_at(t)) {
        char why[WIRE_TEXT_MAX];
        if (t->spare_due)
            make_spare(t);
        else if (copier_fork(t, why, sizeof(why)) < 0)
            t->copier_wanted = false; /* until the next copy */
        t->spare_due = false;
    }
    if (!t->sessions)
        t->watch_ns = 0;
    else if (!t->watch_ns)
        t->watch_ns = now + STOPPED_WATCH_NS;
    else if (now >= t->watch_ns)
        watch_stopped(t); /* may free sessions: the loop below looks again */

    for (struct session_rec *s = t->sessions, *next; s; s = next) {
        next = s->next;
        uint64_t d = next_deadline(s);
        if (!d || d > now)
            continue;
        if (s->lost_track && s->phase != SESS_ENDING) {
            end_session(t, s, "the session ended: the sandbox lost track of a process it let fork");
            continue;
        }
        if (s->stray && s->stray_look_ns <= now)
            look_for_stray(t, s, false);
        if (s->copier_kept.pid > 0 && s->copier_kept_ns <= now)
            copier_let_go(&s->copier_kept);
        if (s->saving == SAVE_WAIT && s->save_look_ns && s->save_look_ns <= now)
            save_advance(t, s);
        if (s->making == NEXT_HOLDING && s->warm_by_ns && s->warm_by_ns <= now) {
            s->warm_by_ns = 0;
            proc_stop(s->coming);
        }
        if (s->recheck_ns && s->recheck_ns <= now) {
            s->recheck_ns = 0;
            if (s->phase == SESS_ENDING) {
                maybe_free(t, s); /* may free it */
                continue;
            }
            if (s->phase == SESS_STOPPING && s->cell && s->cell->stop_seen)
                cell_looked_at(t, s);
            if (s->phase == SESS_OPENING && s->branch_step == BR_ORIGIN)
                branch_advance(t, s);

            if (s->making == NEXT_FORKED && !look_for_child(t, s))
                s->recheck_ns = now + LOOK_NS;
        }
        char why[160];
        if (s->phase == SESS_OPENING && (s->branch_of || s->restoring) && now >= s->branch_by_ns) {
            fmt(why, sizeof(why), "the branch was not made within %llu s",
                (unsigned long long)(BRANCH_BUDGET_NS / 1000000000ULL));
            end_session(t, s, why);
            continue;
        }
        if (s->making >= NEXT_FORKING && s->making <= NEXT_FAILING && now >= s->fork_by_ns) {
            fmt(why, sizeof(why),
                "the session ended: its process did not fork the next cell within %llu s",
                (unsigned long long)(FORK_WALL_BUDGET_NS / 1000000000ULL));
            end_session(t, s, why);
        } else if (s->phase == SESS_WAITING && now >= s->opened_ns + s->lifetime_ns) {
            fmt(why, sizeof(why), "the session ended: its lifetime (%llu s) is over",
                (unsigned long long)(s->lifetime_ns / 1000000000ULL));
            end_session(t, s, why);
        } else if (s->phase == SESS_WAITING && now >= s->idle_since_ns + s->idle_ns) {
            fmt(why, sizeof(why), "the session ended: no cell for %llu s",
                (unsigned long long)(s->idle_ns / 1000000000ULL));
            end_session(t, s, why);
        }
    }
}

void sessions_shutdown(struct tmpl *t)
{
    /* After shutdown_workers has killed and reaped every process (and the
     * keeper takes whatever else is left when we exit). */
    while (t->sessions)
        free_session(t, t->sessions, false);
    copier_drop(t);
}
