/* What the session tests share: opening sessions, running cells, and what
 * /proc says of a session's processes (the tests run as pid 1 of a pid
 * namespace of their own, whose /proc shows the sandbox's processes). */
#ifndef PYSBX_TEST_SESSION_HELPERS_H
#define PYSBX_TEST_SESSION_HELPERS_H

#include "helpers.h"

#include <stdbool.h>
#include <sys/types.h>

struct sbx_session *open_session(struct sbx *sbx, const struct sbx_session_limits *l);

/* One cell with |wall| (and |cpu|, when > 0) seconds; *rc gets what
 * sbx_session_run returned (NULL result if < 0). */
struct sbx_result *cell_limited(struct sbx_session *s, const char *code, enum sbx_rollback rb,
                                double wall, double cpu, const struct sbx_file *files,
                                size_t n_files, int *rc, struct sbx_error *err);
struct sbx_result *cell_full(struct sbx_session *s, const char *code, enum sbx_rollback rb,
                             double wall, const struct sbx_file *files, size_t n_files, int *rc,
                             struct sbx_error *err);
/* A cell that must not be refused. */
struct sbx_result *cell_rb(struct sbx_session *s, const char *code, enum sbx_rollback rb);
struct sbx_result *cell(struct sbx_session *s, const char *code);
/* A cell that must complete, be kept, and print |want|. */
void expect_cell(struct sbx_session *s, const char *code, const char *want);
/* |code| then a raise, as a cell that must be rolled back, its files put
 * back (no "could not" in its reason). */
void expect_rolled_back(struct sbx_session *s, const char *code);
/* A branch of |from| that must be made. */
struct sbx_session *expect_fork(struct sbx_session *from);
/* The next cell is refused as session_lost, with |why_part| in the reason,
 * and so is the one after. */
void expect_lost(struct sbx_session *s, const char *why_part);

/* The session's uid as its code sees it (a cell that prints it). */
uid_t session_uid(struct sbx_session *s);
/* Processes of |uid| (a session's own, when the sandbox gives each its own
 * uid); -1 when not root (uids shared: this cannot tell). */
int processes_of(uid_t uid);
/* Waits (a second at most) until |uid| has |n| processes; returns the
 * count then. */
int wait_processes_of(uid_t uid, int n);
/* The largest stack (VmStk, KiB) of a process of |uid|; -1 when not root
 * or there is none. */
long stack_kb_of(uid_t uid);
/* The pids (in our /proc) of the processes of |uid|, at most |cap|. */
int pids_of(uid_t uid, pid_t *out, int cap);
/* How many descriptors the processes of |uid| hold that the kernel names
 * |name| (say "anon_inode:[userfaultfd]"); -1 when not root. */
int descriptors_of(uid_t uid, const char *name);
/* How many descriptors process |pid| holds that the kernel names |name|. */
int descriptors_of_pid(pid_t pid, const char *name);
/* The same, or with |prefix| those whose name starts with |name|; in *all
 * (unless NULL) how many descriptors it holds. */
int descriptors_named(pid_t pid, const char *name, bool prefix, int *all);
/* The pids of the processes that call themselves |name| (their comm), at
 * most |cap|. */
int pids_named(const char *name, pid_t *out, int cap);
/* The number after |field| (say "\nPPid:") in /proc/PID/status, or -1. */
long proc_status_field(pid_t pid, const char *field);
/* User and system CPU time of every process of |uid|, in ms. */
double cpu_ms_of(uid_t uid);
/* The pids of processes in state T (stopped), at most |cap|. */
int stopped_processes(pid_t *out, int cap);
/* Waits (a second at most) until |n| processes are stopped. */
int wait_stopped(pid_t *out, int cap, int n);
/* The pid (in our /proc) of the process of |uid| that calls itself |inner|
 * in its own pid namespace; -1 when there is none. */
pid_t pid_from_inside(uid_t uid, pid_t inner);
/* The template's pid, from /proc. */
int template_pid(void);
/* This process's resident memory, KiB. */
long rss_kb(void);

/* A state with more than variables in it, for the copies of a state (a
 * branch, an image) to be checked against: a module the template had not
 * loaded (an extension's code and data mapped by the state alone), a
 * generator part-way through, a class, a large list. What each test adds
 * (files, a closure) follows it; RICH_VARIABLES_SEEN prints them back as
 * RICH_VARIABLES_WANT, drawing the generator's next value. */
#define RICH_VARIABLES                                                                             \
    "import decimal, json, os, collections\n"                                                      \
    "x = 1\n"                                                                                      \
    "big = list(range(200000))\n"                                                                  \
    "d = decimal.Decimal('1.10') * 3\n"                                                            \
    "def gen():\n"                                                                                 \
    "    yield from range(100)\n"                                                                  \
    "g = gen(); next(g); next(g)\n"                                                                \
    "class P(collections.namedtuple('P', 'a b')): pass\n"                                          \
    "p = P(1, 2)\n"
#define RICH_VARIABLES_SEEN "x, len(big), big[-1], d, next(g), p"
#define RICH_VARIABLES_WANT "1 200000 199999 3.30 2 P(a=1, b=2)"

/* A state with a mapping of its own, 64 MiB of no file: every third page
 * written (its number), one of them given back (zeros again), the rest
 * never touched. A branch or a restored image maps it afresh, and the
 * pages go in through the new process's userfaultfd (branch.c): what the
 * state wrote, and nothing where it has nothing. SPARSE_CHECK prints the
 * pages written (5461) and whether they are the state's. */
#define SPARSE_STATE                                                                               \
    "import ctypes, hashlib\n"                                                                     \
    "libc = ctypes.CDLL(None)\n"                                                                   \
    "libc.mmap.restype = ctypes.c_void_p\n"                                                        \
    "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,\n"        \
    "                      ctypes.c_int, ctypes.c_long]\n"                                         \
    "n = 64 << 20\n"                                                                               \
    "p = libc.mmap(None, n, 3, 0x22, -1, 0)  # read-write, private and anonymous\n"                \
    "m = (ctypes.c_char * n).from_address(p)\n"                                                    \
    "for i in range(0, n, 3 * 4096):\n"                                                            \
    "    m[i:i + 8] = b'%08d' % (i // 4096)\n"                                                     \
    "libc.madvise(ctypes.c_void_p(p + 300 * 4096), 4096, 4)  # MADV_DONTNEED: page 300\n"          \
    "def pages():\n"                                                                               \
    "    b = ctypes.string_at(p, n)\n"                                                             \
    "    written = sum(1 for i in range(0, n, 4096) if b[i:i + 4096].strip(b'\\0'))\n"             \
    "    return written, hashlib.sha256(b).hexdigest()\n"                                          \
    "want = pages()\n"
#define SPARSE_CHECK "print(want[0], pages() == want)\n"

#endif
