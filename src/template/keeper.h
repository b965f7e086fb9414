/*
 * The workers' pid namespace and its init, the keeper.
 *
 * The template enters a new pid namespace for its children (unshare, after
 * the last thread it will ever start is joined) and forks the keeper, which
 * becomes the namespace's pid 1: it reaps what is orphaned there and
 * otherwise waits for the template to go. Every worker, session process and
 * cell after it is born in the namespace. When the keeper ends, by the
 * template's end or anything else, the kernel kills every process of the
 * namespace: nothing a run or a session made, said hello or not, outlives
 * its template. kill(-1) from a process in the namespace reaches that
 * namespace alone (how a session's uid is swept, sessions.c).
 */
#ifndef PYSBX_KEEPER_H
#define PYSBX_KEEPER_H

#include <stddef.h>
#include <sys/types.h>

struct keeper {
    pid_t pid; /* the namespace's init, our child; -1 without one */
    int life;  /* our end of a pipe whose hang-up tells the keeper we are gone */
};

/* Enters the new pid namespace and forks the keeper. Returns 1 when it
 * runs; 0 when the kernel gives no pid namespace (|why| says why, and
 * children stay in ours); -errno with |why| when the namespace was entered
 * but its init could not be made (the template cannot go on: no process
 * could be forked there any more). */
int keeper_start(struct keeper *k, char *why, size_t cap);

/* Tells the keeper to end and reaps it (and whatever else of ours ends
 * meanwhile): the namespace is gone when this returns. */
void keeper_stop(struct keeper *k);

/* /proc of this process's own pid namespace (O_PATH), or -1 with |why|:
 * the one mounted at /proc may be another namespace's, whose numbers name
 * other processes (a pid namespace entered without its own /proc). */
int proc_open_own(char *why, size_t cap);

#endif
