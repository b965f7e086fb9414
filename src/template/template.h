/*
 * The template process's state, shared by its modules: main.c (start,
 * configuration), pool.c (the pool loop), layers.c (the layer report).
 */
#ifndef PYSBX_TEMPLATE_H
#define PYSBX_TEMPLATE_H

#include "claim.h"
#include "freezer.h"
#include "jail.h"
#include "keeper.h"
#include "landlock.h"
#include "policy.h"
#include "prefault.h"
#include "sweeper.h"
#include "uids.h"
#include "wire.h"

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* The control socket, as the supervisor's posix_spawn placed it. */
#define TEMPLATE_CTL_FD 3
/* The signal a worker's CPU timer raises in the template. */
#define TEMPLATE_CPU_SIGNAL (SIGRTMIN + 1)
/* ... and its wall-clock timer (the supervisor keeps the deadline first;
 * this one holds even when the supervisor is held up). */
#define TEMPLATE_WALL_SIGNAL (SIGRTMIN + 2)

struct session_rec;

/* A copier's process (sessions.c), and the socket it takes jobs on. */
struct copier_ref {
    pid_t pid; /* 0: none (reaped, or never made) */
    int sock;
};

/* A process the template made and will reap: a worker, or a session's
 * process (sessions.c). */
struct worker_rec {
    struct worker_rec *next;
    uint64_t id; /* unique in this template: what a poll slot names it by */
    pid_t pid;
    unsigned slot; /* its ids (uids.h) */
    uid_t uid;
    gid_t gid;
    int ready_fd;           /* read end of the worker's ready pipe (a session's: its channel) */
    int status_fd;          /* write end of the supervisor's status pipe */
    int sup_fds[WFD_COUNT]; /* the supervisor's ends, held until announced */
    bool announced;         /* a WORKER or FAIL message was sent for it */
    bool started;
    bool dead;       /* reaped: nothing more to arm */
    bool has_timer;  /* its CPU timer exists */
    bool cpu_killed; /* the timer fired and we killed it */
    bool limit_lost; /* the CPU limit could not be armed; killed */
    bool has_wall_timer;
    bool wall_killed; /* its wall timer fired and we killed it */
    timer_t timer, wall_timer;
    /* Its own mount namespace, opened while it was ready (-1: none): held
     * so that its exit does not tear the namespace down (an expedited RCU
     * grace period) before its status can be reported; closed after. */
    int mnt_ns_fd;
    /* Its CPU clock when it said its code starts (said before any code of
     * the request ran): its getting ready, not the run's, in its rusage. */
    uint64_t setup_cpu_ns;
    char name[WIRE_NAME_MAX];
    /* A session's process (sessions.c): the slot is the session's, and what
     * it says comes over a socket that sessions.c reads. What sessions.c
     * records of it is what the kernel said, never what it said itself. */
    struct session_rec *session;
    bool stop_sent;        /* SIGSTOP sent since it was last let run */
    bool stop_seen;        /* ... and the kernel has reported it stopped */
    bool hello;            /* it said hello (once, a new cell's first word) */
    ino_t chan_ino;        /* its end of its channel, the one socket it may keep */
    int out_watch[2];      /* a cell out: read ends of its stdout and stderr, to see them hang up */
    uint64_t cont_cpu_ns;  /* its CPU clock when it was last let run to fork */
    uint64_t stop_sent_ns; /* when SIGSTOP was last sent */
    uint64_t stop_cpu_ns;  /* its CPU clock when it was seen stopped */
    uint64_t stop_ns;      /* ... and the time */
    /* The kernel has seen it fork (its clone, a seccomp notification): as
     * a state it had written its record down before (worker.h), and may
     * be copied. */
    bool recorded;
};

struct tmpl {
    int ctl;
    int sigfd;
    int base_fd; /* the work directory */
    int devnull;
    pid_t pid;
    char *base_path;
    unsigned pool_size;
    unsigned outstanding; /* messages not yet taken + workers getting ready */
    int proc_fd;          /* /proc of our own pid namespace (proc_ok), for the template alone */
    bool proc_ok;
    char proc_why[WIRE_LAYER_DETAIL_MAX];
    struct keeper keeper; /* the workers' pid namespace (keeper.h) */
    bool pid_ns;
    bool keeper_gone;      /* it died: so did the namespace; the template stops */
    struct id_claim claim; /* the workers' ids, machine-wide (claim.h) */
    bool claim_lost;       /* its holder died: the ids are not ours; the template stops */
    char pidns_why[WIRE_LAYER_DETAIL_MAX];
    uint64_t next_id;
    struct worker_rec *workers;
    unsigned n_workers;
    char **warm;
    char **module_dirs;
    /* A vetted package set (all NULL without one): see packages.h. */
    char *pkg_path;
    char **pkg_modules;
    char **pkg_places;
    char **pkg_links;
    /* The supervisor's directory for matplotlib's font list (or NULL), and
     * under a private root its subdirectory cloned as a detached mount
     * while the host's tree was in view (or -1): packages.c. */
    char *font_cache;
    int font_tree;
    bool policy_debug;
    /* One run, then closed (sbx_config.single_run): one worker, no
     * rehearsal, no page plan, no replacement. */
    bool single_run;
    /* The confinement every worker gets, decided once. */
    struct jail_config jc;
    struct jail jail;
    bool root;           /* in the private root */
    bool bounding_empty; /* the capability bounding set workers inherit is empty */
    char root_why[WIRE_LAYER_DETAIL_MAX];
    struct uids uids;
    struct sweeper sweeper;
    struct policy policy;
    bool seccomp;
    char seccomp_why[WIRE_LAYER_DETAIL_MAX];
    int landlock; /* ABI, or <= 0 */
    char landlock_why[WIRE_LAYER_DETAIL_MAX];
    struct landlock_base ll_base;
    struct prefault prefault; /* learnt from the first worker to get ready */
    /* Sessions (sessions.c); their program is built at the first. */
    struct session_rec *sessions;
    struct session_rec *spare; /* a session's first process made ahead, or NULL */
    bool spare_due;            /* one to be made when the loop is quiet (sessions.c) */
    /* A copier made ahead, likewise, once a session has been copied. */
    struct copier_ref copier_next;
    bool copier_wanted;
    uint64_t ahead_due_ns; /* when either was last wanted */
    uint64_t busy_ns;      /* when the loop last had something to do (pool.c) */
    struct policy session_policy;
    bool session_policy_built;
    bool idle_warm; /* cells made ahead wait at SCHED_IDLE (sessions.c) */
    /* Sessions between cells frozen (freezer.h), when there is a freezer. */
    struct freezer freezer;
    bool freeze;
    char freeze_why[WIRE_LAYER_DETAIL_MAX];
    uint64_t watch_ns; /* stopped processes are looked at again then */
    uint64_t layout;   /* as it was started (image_layout): an image's layout */
};

/* Tells the supervisor that a worker could not be made (or the template
 * could not start). */
void template_send_fail(struct tmpl *t, const char *text);

/* Fills the pool, then serves the control socket and the workers until the
 * supervisor goes away; kills and reaps every worker before it returns. */
void pool_run(struct tmpl *t);

/* Forks a process for the pool (|session| NULL: announced on the control
 * socket once ready) or a session's first state process. Returns it, linked
 * into t->workers, or NULL after saying why (to the supervisor for the
 * pool, into |why| for a session). */
struct worker_rec *spawn_process(struct tmpl *t, struct session_rec *session, char *why,
                                 size_t whylen);

/* Arms the CPU and wall limits of |w|, whose code starts now: a timer at
 * st->cpu_used_ns + st->cpu_limit_ns on its CPU clock, and (when
 * st->wall_limit_ns) one that long from now. */
void arm_cpu_limit(struct worker_rec *w, const struct wire_started *st);
/* Deletes them. */
void disarm_limits(struct worker_rec *w);

/* A new worker record, its descriptors -1, its id its own. */
struct worker_rec *worker_new(struct tmpl *t);

/* The status of a process reaped, for its supervisor. */
struct wire_status status_of(const struct worker_rec *w, int wait_status, const struct rusage *ru);

/* Sessions (sessions.c). */
void session_open(struct tmpl *t, const struct wire_session_open *m, int chan);
/* Adds the descriptors the sessions wait on to |pfd| (at most |cap|), the
 * session each belongs to in |ids|, returning the new count; and handles
 * what they have (a session that ended meanwhile is not there to find). */
size_t sessions_poll_fds(struct tmpl *t, struct pollfd *pfd, uint64_t *ids, size_t n, size_t cap);
void sessions_handle(struct tmpl *t, const struct pollfd *pfd, const uint64_t *ids, size_t from,
                     size_t n);
/* How long poll may sleep before a session's timer (ms; -1: none). */
int sessions_timeout_ms(struct tmpl *t);
/* Ends sessions whose time is up; looks again where it waits on the
 * kernel (a thread to leave, a child to find, a uid to empty); and, when
 * the poll before found nothing to do (|idle|), makes what is made ahead. */
void sessions_tick(struct tmpl *t, bool idle);
/* |w|, a session's process, was reaped with |wait_status| (and unlinked). */
void session_reaped(struct tmpl *t, struct worker_rec *w, int wait_status, const struct rusage *ru);
/* |w|, a session's process, is stopped: the kernel said so. */
void session_stopped(struct tmpl *t, struct worker_rec *w);
/* |w|, a session's process told to stop, was continued by another than the
 * template: the kernel said so. */
void session_continued(struct tmpl *t, struct worker_rec *w);
/* The number of sessions' descriptors poll may need. */
size_t sessions_fd_count(const struct tmpl *t);
void sessions_shutdown(struct tmpl *t);
/* |w|, a session's process, has something on its channel. */
void session_said(struct tmpl *t, struct worker_rec *w);
/* For spawn_process: taking a session's first state process |w| and
 * workspace |ws_fd| (which becomes the session's). */
/* Whether the template reads |w|'s channel now (not while a copier of a
 * branch talks on it). */
bool session_heard(const struct worker_rec *w);
/* The cgroup a session's first process is born in (freezer.h), or NULL. */
const struct freezer_cg *session_cgroup(const struct session_rec *s);
void session_adopt(struct session_rec *s, struct worker_rec *w, int ws_fd);
/* Closes what |w| holds and frees it (unlinked already). */
void forget_worker(struct tmpl *t, struct worker_rec *w);
/* Whether |pid| is a process the template knows (a worker, a session's,
 * the keeper, the sweeper). */
bool known_child(const struct tmpl *t, pid_t pid);
/* Whether |pid|, just reaped, was a copier waiting for a job (made ahead,
 * or kept for a session's next branch): then it is forgotten. */
bool copier_reaped(struct tmpl *t, pid_t pid);

/* The report the supervisor gets at start: versions, and each layer as
 * active or not with the reason. */
void layers_describe(const struct tmpl *t, struct wire_hello *h);

#endif
