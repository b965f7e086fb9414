/*
 * SIGINT, SIGTERM and SIGHUP, turned into a cancellation: the signals are
 * blocked in every thread and one thread waits for them and fires a token,
 * so that the runs in flight end as cancelled and the command goes on to
 * close its sandbox (removing its work directory) and say what it did.
 */
#ifndef PYSBX_STOPPER_H
#define PYSBX_STOPPER_H

#include "pysbx.h"

/* Call before any other thread exists (later calls return the same token).
 * Returns the token to give each run (owned by the stopper), or NULL when
 * one could not be had (the signals then keep their default action). */
struct sbx_cancel *stopper_start(void);

/* A descriptor that becomes readable once stopped (for a poll alongside
 * input), or -1. */
int stopper_fd(void);

/* The signal that stopped us, or 0. */
int stopper_signal(void);

#endif
