/* Ceilings every run gets whatever its request says, the same for the
 * embedded workers and the python3 baseline. */
#ifndef PYSBX_WORKER_LIMITS_H
#define PYSBX_WORKER_LIMITS_H

/* File size (RLIMIT_FSIZE) and descriptors (RLIMIT_NOFILE) for user code. */
#define WORKER_FSIZE_LIMIT  (1ULL << 30)
#define WORKER_NOFILE_LIMIT 256
/* Threads of all workers together, when they run under their own uid. */
#define WORKER_NPROC_LIMIT 2048

#endif
