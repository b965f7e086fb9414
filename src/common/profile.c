#define _GNU_SOURCE
#include "profile.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

#ifdef PYSBX_PROFILE
/* The names in the report, which bench/phases reads. */
static const char *const prof_names[PROF_COUNT] = {
    "prefault", "afterfork", "fds", "workspace", "prepare", "confine", "request", "started", "ran",
};
static double marks[PROF_COUNT];
static struct prof_spawn spawn;

double prof_now(void)
{
    struct timespec t;

    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) < 0)
        return 0;
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

void prof_mark(enum prof_mark m)
{
    marks[m] = prof_now();
}

void prof_set_spawn(const struct prof_spawn *s)
{
    spawn = *s;
}

void prof_report(int fd)
{
    char line[512];
    int n = snprintf(line, sizeof(line), "pysbx-profile:");

    for (int i = 0; i < PROF_COUNT && n > 0 && (size_t)n < sizeof(line); i++)
        n += snprintf(line + n, sizeof(line) - (size_t)n, " %s=%.0f", prof_names[i], marks[i]);
    if (n > 0 && (size_t)n < sizeof(line))
        n += snprintf(line + n, sizeof(line) - (size_t)n, " tfork=%.0f tspawn=%.0f", spawn.fork_us,
                      spawn.spawn_us);
    if (n > 0 && (size_t)n < sizeof(line) - 1) {
        line[n++] = '\n';
        (void)!write(fd, line, (size_t)n);
    }
}
#endif
