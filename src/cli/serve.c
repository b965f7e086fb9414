/*
 * pysbx serve: JSON lines in, JSON lines out, over stdin/stdout or a UNIX
 * socket. Requests run concurrently and are answered as they finish, each
 * exactly once; a line that cannot be run is answered with an error and the
 * server goes on.
 */
#define _GNU_SOURCE
#include "commands.h"
#include "detach.h"
#include "lines.h"
#include "reqjson.h"
#include "sbxerr.h"
#include "sysutil.h"
#include "util.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* One input stream and the answers to it. */
struct conn {
    const struct serve_opts *o;
    int in_fd, out_fd;
    pthread_mutex_t lock; /* answers are whole lines, one at a time */
    pthread_cond_t idle;
    unsigned inflight;
};

struct job {
    struct conn *c;
    struct json_request r;
};

/* Queues |line| (taken); when it could not be made, an answer with the
 * request's id all the same, if memory allows. */
static void answer(struct conn *c, const char *id_text, char *line)
{
    if (!line && asprintf(&line,
                          "{\"id\":%s,\"error\":{\"code\":\"sandbox_unavailable\","
                          "\"message\":\"out of memory\"}}\n",
                          id_text ? id_text : "null") < 0)
        line = NULL;
    pthread_mutex_lock(&c->lock);
    if (line)
        (void)write_full(c->out_fd, line, strlen(line));
    pthread_mutex_unlock(&c->lock);
    free(line);
}

static void *run_job(void *p)
{
    struct job *j = p;
    struct conn *c = j->c;
    struct sbx_result *res = NULL;
    struct sbx_error err = {0};

    if (c->o->backend->run(c->o->backend->self, &j->r.req, &res, &err) == 0)
        answer(c, j->r.id_text, json_answer_result(j->r.id_text, res));
    else
        answer(c, j->r.id_text, json_answer_error(j->r.id_text, &err));
    sbx_result_free(res);
    json_request_free(&j->r);
    free(j);
    pthread_mutex_lock(&c->lock);
    c->inflight--;
    pthread_cond_broadcast(&c->idle);
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

static bool blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

/* Reads requests from c->in_fd until its end, then waits for every answer. */
static void serve_conn(struct conn *c)
{
    struct line_reader lr;
    const char *line;
    size_t len;
    enum line_result lres;

    line_reader_init(&lr, c->in_fd, c->o->max_line_bytes);
    while ((lres = line_next(&lr, &line, &len)) != LINE_END && lres != LINE_ERROR) {
        struct sbx_error err = {0};
        if (lres == LINE_TOO_LONG) {
            sbx_fail(&err, SBX_ERR_TOO_LARGE, -E2BIG, "request line longer than %zu bytes",
                     c->o->max_line_bytes);
            answer(c, NULL, json_answer_error(NULL, &err));
            continue;
        }
        if (blank(line, len))
            continue;
        struct job *j = calloc(1, sizeof(*j));
        if (!j) {
            sbx_fail(&err, SBX_ERR_UNAVAILABLE, -ENOMEM, "out of memory");
            answer(c, NULL, json_answer_error(NULL, &err));
            continue;
        }
        j->c = c;
        if (json_request_parse(line, len, &c->o->ceilings, &j->r, &err) < 0) {
            answer(c, j->r.id_text, json_answer_error(j->r.id_text, &err));
            json_request_free(&j->r);
            free(j);
            continue;
        }
        /* At most jobs requests at a time: beyond that, stop reading, and
         * let the writer's own pipe or socket hold it back. */
        pthread_mutex_lock(&c->lock);
        while (c->inflight >= c->o->jobs)
            pthread_cond_wait(&c->idle, &c->lock);
        c->inflight++;
        pthread_mutex_unlock(&c->lock);
        if (start_detached(run_job, j) < 0) {
            pthread_mutex_lock(&c->lock);
            c->inflight--;
            pthread_mutex_unlock(&c->lock);
            sbx_fail(&err, SBX_ERR_UNAVAILABLE, -EAGAIN, "cannot start a thread");
            answer(c, j->r.id_text, json_answer_error(j->r.id_text, &err));
            json_request_free(&j->r);
            free(j);
        }
    }
    line_reader_free(&lr);
    pthread_mutex_lock(&c->lock);
    while (c->inflight > 0)
        pthread_cond_wait(&c->idle, &c->lock);
    pthread_mutex_unlock(&c->lock);
}

static void conn_init(struct conn *c, const struct serve_opts *o, int in_fd, int out_fd)
{
    memset(c, 0, sizeof(*c));
    c->o = o;
    c->in_fd = in_fd;
    c->out_fd = out_fd;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->idle, NULL);
}

static void conn_destroy(struct conn *c)
{
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->idle);
}

/* --- a UNIX socket: one connection per client -------------------------------- */

struct client {
    struct listener *l;
    struct client *next;
    struct conn c;
    int fd;
};

struct listener {
    pthread_mutex_t lock;
    pthread_cond_t idle;
    unsigned conns;
    struct client *clients;
};

static void *serve_client(void *p)
{
    struct client *cl = p;
    serve_conn(&cl->c);
    struct listener *l = cl->l;
    pthread_mutex_lock(&l->lock);
    for (struct client **pp = &l->clients; *pp; pp = &(*pp)->next)
        if (*pp == cl) {
            *pp = cl->next;
            break;
        }
    l->conns--;
    pthread_cond_broadcast(&l->idle);
    pthread_mutex_unlock(&l->lock);
    close(cl->fd);
    conn_destroy(&cl->c);
    free(cl);
    return NULL;
}

static int listen_on(const struct serve_opts *o)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    struct listener l = {.conns = 0};
    sigset_t stop;
    int sfd = -1, lfd = -1, rc = 1;

    if (strlen(o->listen_path) >= sizeof(addr.sun_path)) {
        fprintf(stderr, "pysbx serve: socket path too long: %s\n", o->listen_path);
        return 2;
    }
    strcpy(addr.sun_path, o->listen_path);
    lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    mode_t old = umask(0177); /* the socket is born 0600 */
    int b = lfd < 0 ? -1 : bind(lfd, (struct sockaddr *)&addr, sizeof(addr));
    umask(old);
    if (b < 0 || listen(lfd, 64) < 0) {
        fprintf(stderr, "pysbx serve: %s: %s\n", o->listen_path, strerror(errno));
        goto out;
    }
    chmod(o->listen_path, o->socket_mode);
    /* SIGINT and SIGTERM end the server: stop accepting, finish what is in
     * flight, remove the socket. */
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    sfd = signalfd(-1, &stop, SFD_CLOEXEC);
    pthread_mutex_init(&l.lock, NULL);
    pthread_cond_init(&l.idle, NULL);
    fprintf(stderr, "pysbx serve: listening on %s (backend %s)\n", o->listen_path,
            o->backend->name);
    for (;;) {
        struct pollfd p[2] = {{lfd, POLLIN, 0}, {sfd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0 && errno != EINTR)
            break;
        if (p[1].revents)
            break;
        if (!p[0].revents)
            continue;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        struct client *cl = calloc(1, sizeof(*cl));
        if (!cl) {
            close(fd);
            continue;
        }
        cl->l = &l;
        cl->fd = fd;
        conn_init(&cl->c, o, fd, fd);
        pthread_mutex_lock(&l.lock);
        l.conns++;
        cl->next = l.clients;
        l.clients = cl;
        pthread_mutex_unlock(&l.lock);
        if (start_detached(serve_client, cl) < 0) {
            pthread_mutex_lock(&l.lock);
            l.conns--;
            l.clients = cl->next;
            pthread_mutex_unlock(&l.lock);
            conn_destroy(&cl->c);
            close(fd);
            free(cl);
        }
    }
    /* No new connections; the open ones read no more, and finish and answer
     * what they were sent. */
    close_fd(&lfd);
    unlink(o->listen_path);
    pthread_mutex_lock(&l.lock);
    for (struct client *cl = l.clients; cl; cl = cl->next)
        shutdown(cl->fd, SHUT_RD);
    while (l.conns > 0)
        pthread_cond_wait(&l.idle, &l.lock);
    pthread_mutex_unlock(&l.lock);
    rc = 0;
out:
    close_fd(&sfd);
    close_fd(&lfd);
    return rc;
}

int serve_main(const struct serve_opts *o)
{
    if (o->listen_path)
        return listen_on(o);
    struct conn c;
    conn_init(&c, o, 0, 1);
    serve_conn(&c);
    conn_destroy(&c);
    return 0;
}
