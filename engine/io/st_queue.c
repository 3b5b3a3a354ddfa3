/*
 * st_queue.c — the background safetensors writer (contract in
 * io/st_queue.h).
 *
 * One mutex guards a queue's state; the writer thread sleeps on `work`,
 * waiters sleep on `done`. Jobs finish in order, so "job s is finished" is
 * `completed >= s`. A job's snapshot is freed by the writer thread before
 * the job is marked finished, so a caller that waits and then snapshots the
 * next checkpoint never holds two snapshots. Failures move to a list of
 * unreported failures until a wait covers them.
 *
 * The thread's errors go to a private error-only context (a zeroed struct
 * lucid_ctx: the write path touches nothing but its status and message), so
 * the caller's context is never written from two threads.
 *
 * Every live queue is on a process-wide list; an atexit handler (installed
 * once) waits for each one's jobs, so exit() does not drop a pending write.
 */
#include "io/st_queue.h"
#include "internal.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct st_job {
    uint64_t seq;
    lucid_st_writer *w;
    int npaths;
    char **paths; /* as given */
    char **keys;  /* resolved (canonical_path), for wait_path */
    struct st_job *next;
} st_job;

typedef struct st_failure {
    uint64_t seq;
    lucid_status status;
    int npaths;
    char **keys; /* the job's resolved paths */
    char *msg;
    struct st_failure *next;
} st_failure;

struct lucid_st_queue {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    pthread_t thread;
    int started, stop;
    st_job *head, *tail;    /* queued, not started */
    st_job *running;        /* being written; owned by the thread */
    uint64_t submitted;     /* seq of the last submitted job */
    uint64_t completed;     /* seq of the last finished job */
    st_failure *failures;   /* unreported, oldest first */
    lucid_st_queue_stats stats;
    struct lucid_st_queue *live_next; /* process-wide list (exit drain) */
};

/* ------------------------------------------------------------ helpers */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void free_strings(char **v, int n) {
    if (!v) return;
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
}

/* realpath(dirname(path)) + "/" + basename(path); a copy of path when the
 * directory does not resolve. NULL on OOM. */
static char *canonical_path(const char *path) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t dl = slash ? (size_t)(slash - path) : 0;
    char *dir = malloc(dl + 2);
    if (!dir) return NULL;
    if (slash) {
        memcpy(dir, path, dl);
        dir[dl] = '\0';
        if (dl == 0) strcpy(dir, "/");
    } else {
        strcpy(dir, ".");
    }
    char *real = realpath(dir, NULL);
    free(dir);
    if (!real) return strdup(path);
    size_t n = strlen(real) + strlen(base) + 2;
    char *out = malloc(n);
    if (out) snprintf(out, n, "%s%s%s", real, strcmp(real, "/") ? "/" : "", base);
    free(real);
    return out;
}

static int keys_match(char *const *keys, int n, const char *key) {
    for (int i = 0; i < n; i++)
        if (strcmp(keys[i], key) == 0) return 1;
    return 0;
}

static void job_free(st_job *j) {
    if (!j) return;
    lucid_st_writer_free(j->w);
    free_strings(j->paths, j->npaths);
    free_strings(j->keys, j->npaths);
    free(j);
}

static void failure_free(st_failure *f) {
    free_strings(f->keys, f->npaths);
    free(f->msg);
    free(f);
}

/* ------------------------------------------------------- process exit */

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static lucid_st_queue *live;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

static void exit_drain(void) {
    pthread_mutex_lock(&live_mu);
    for (lucid_st_queue *q = live; q; q = q->live_next) {
        struct lucid_ctx sink;
        memset(&sink, 0, sizeof sink);
        if (lucid_st_queue_wait(&sink, q, 0) != LUCID_OK)
            fprintf(stderr, "lucid: at exit: %s\n", sink.errmsg);
    }
    pthread_mutex_unlock(&live_mu);
}

static void install_exit_drain(void) { atexit(exit_drain); }

/* ------------------------------------------------------- the thread */

/* Write job j; on failure *msg is a malloc'd report (NULL on success). */
static lucid_status run_job(st_job *j, lucid_st_queue_stats *stats, char **msg) {
    struct lucid_ctx sink;
    memset(&sink, 0, sizeof sink);
    *msg = NULL;
    unsigned char *hdr = NULL;
    size_t hl = 0;
    size_t data = lucid_st_writer_data_bytes(j->w);
    lucid_status st = lucid_st_writer_encode(&sink, j->w, &hdr, &hl);
    int i = 0;
    for (; st == LUCID_OK && i < j->npaths; i++) {
        st = lucid_st_writer_write_file(&sink, j->w, hdr, hl, j->paths[i]);
        if (st != LUCID_OK) break;
        stats->files++;
        stats->bytes += hl + data;
    }
    free(hdr);
    if (st == LUCID_OK) return st;
    /* "background write of P failed: <why>[; not written either (any
     * previous file there is unchanged): Q, R]" */
    const char *p = j->paths[i < j->npaths ? i : 0];
    size_t n = strlen(p) + strlen(sink.errmsg) + 128;
    for (int k = i + 1; k < j->npaths; k++) n += strlen(j->paths[k]) + 2;
    char *m = malloc(n);
    if (m) {
        int len = snprintf(m, n, "background write of %s failed: %s", p, sink.errmsg);
        for (int k = i + 1; k < j->npaths && len > 0 && (size_t)len < n; k++)
            len += snprintf(m + len, n - (size_t)len, "%s%s",
                            k == i + 1 ? "; not written either (any previous file there is unchanged): "
                                       : ", ",
                            j->paths[k]);
    }
    *msg = m;
    return st;
}

static void *writer_main(void *arg) {
    lucid_st_queue *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->head && !q->stop) pthread_cond_wait(&q->work, &q->mu);
        if (!q->head) break; /* stop requested and nothing left */
        st_job *j = q->head;
        q->head = j->next;
        if (!q->head) q->tail = NULL;
        q->running = j;
        pthread_mutex_unlock(&q->mu);

        lucid_st_queue_stats local = {0};
        double t0 = now_s();
        char *msg = NULL;
        lucid_status st = run_job(j, &local, &msg);
        double dt = now_s() - t0;
        st_failure *f = NULL;
        if (st != LUCID_OK) {
            f = calloc(1, sizeof *f);
            if (!f) /* never dropped silently */
                fprintf(stderr, "lucid: %s\n", msg ? msg : "a background checkpoint write failed");
        }
        /* the snapshot goes before the job is marked finished */
        lucid_st_writer_free(j->w);
        j->w = NULL;

        pthread_mutex_lock(&q->mu);
        q->running = NULL;
        q->completed = j->seq;
        q->stats.jobs++;
        q->stats.files += local.files;
        q->stats.bytes += local.bytes;
        q->stats.seconds += dt;
        if (st != LUCID_OK) q->stats.failed++;
        if (f) {
            f->seq = j->seq;
            f->status = st;
            f->npaths = j->npaths;
            f->keys = j->keys; /* moved: wait_path matches failures by path */
            j->keys = NULL;
            f->msg = msg ? msg : strdup("background write failed (no memory for the message)");
            msg = NULL;
            st_failure **tail = &q->failures;
            while (*tail) tail = &(*tail)->next;
            *tail = f;
        }
        job_free(j);
        free(msg);
        pthread_cond_broadcast(&q->done);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* ------------------------------------------------------------ API */

lucid_status lucid_st_queue_create(lucid_ctx *ctx, lucid_st_queue **out) {
    *out = NULL;
    lucid_st_queue *q = calloc(1, sizeof *q);
    if (!q) return lucid_seterr(ctx, LUCID_ERR_OOM, "checkpoint writer: out of memory");
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->work, NULL);
    pthread_cond_init(&q->done, NULL);
    pthread_once(&exit_once, install_exit_drain);
    pthread_mutex_lock(&live_mu);
    q->live_next = live;
    live = q;
    pthread_mutex_unlock(&live_mu);
    *out = q;
    return LUCID_OK;
}

lucid_status lucid_st_queue_submit(lucid_ctx *ctx, lucid_st_queue *q,
                                   lucid_st_writer *w, const char *const *paths,
                                   int npaths, uint64_t *seq) {
    if (seq) *seq = 0;
    if (npaths < 1) {
        lucid_st_writer_free(w);
        return lucid_seterr(ctx, LUCID_ERR_ARG, "checkpoint writer: no path to write");
    }
    for (int i = 0; i < npaths; i++)
        if (!paths[i] || !*paths[i]) {
            lucid_st_writer_free(w);
            return lucid_seterr(ctx, LUCID_ERR_ARG, "checkpoint writer: path %d is empty", i + 1);
        }
    st_job *j = calloc(1, sizeof *j);
    if (!j) {
        lucid_st_writer_free(w);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "checkpoint writer: out of memory");
    }
    j->w = w;
    j->npaths = npaths;
    j->paths = calloc((size_t)npaths, sizeof *j->paths);
    j->keys = calloc((size_t)npaths, sizeof *j->keys);
    int ok = j->paths && j->keys;
    for (int i = 0; ok && i < npaths; i++) {
        j->paths[i] = strdup(paths[i]);
        j->keys[i] = canonical_path(paths[i]);
        ok = j->paths[i] && j->keys[i];
    }
    if (!ok) {
        job_free(j);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "checkpoint writer: out of memory");
    }
    pthread_mutex_lock(&q->mu);
    if (!q->started) {
        int rc = pthread_create(&q->thread, NULL, writer_main, q);
        if (rc != 0) {
            pthread_mutex_unlock(&q->mu);
            job_free(j);
            return lucid_seterr(ctx, LUCID_ERR_STATE,
                                "checkpoint writer: cannot start its thread: %s",
                                strerror(rc));
        }
        q->started = 1;
    }
    j->seq = ++q->submitted;
    if (q->tail) q->tail->next = j;
    else q->head = j;
    q->tail = j;
    if (seq) *seq = j->seq;
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->mu);
    return LUCID_OK;
}

lucid_status lucid_st_queue_wait(lucid_ctx *ctx, lucid_st_queue *q, uint64_t seq) {
    pthread_mutex_lock(&q->mu);
    if (seq == 0 || seq > q->submitted) seq = q->submitted;
    while (q->completed < seq) pthread_cond_wait(&q->done, &q->mu);
    /* take the covered failures out of the list */
    st_failure *first = NULL, *last = NULL, **pp = &q->failures;
    int more = 0;
    while (*pp) {
        st_failure *f = *pp;
        if (f->seq > seq) {
            pp = &f->next;
            continue;
        }
        *pp = f->next;
        f->next = NULL;
        if (!first) first = f;
        else {
            if (last && last != first) failure_free(last);
            last = f;
            more++;
        }
    }
    pthread_mutex_unlock(&q->mu);
    if (!first) return LUCID_OK;
    lucid_status st = first->status;
    const char *m0 = first->msg ? first->msg : "a background write failed";
    if (more)
        lucid_seterr(ctx, st, "%s (and %d more failed background write%s; the last: %s)",
                     m0, more, more == 1 ? "" : "s",
                     last->msg ? last->msg : "a background write failed");
    else
        lucid_seterr(ctx, st, "%s", m0);
    failure_free(first);
    if (last) failure_free(last);
    return st;
}

lucid_status lucid_st_queue_wait_path(lucid_ctx *ctx, lucid_st_queue *q,
                                      const char *path) {
    char *key = canonical_path(path ? path : "");
    if (!key) return lucid_seterr(ctx, LUCID_ERR_OOM, "checkpoint writer: out of memory");
    uint64_t target = 0;
    pthread_mutex_lock(&q->mu);
    if (q->running && keys_match(q->running->keys, q->running->npaths, key))
        target = q->running->seq;
    for (st_job *j = q->head; j; j = j->next)
        if (keys_match(j->keys, j->npaths, key)) target = j->seq;
    for (st_failure *f = q->failures; f; f = f->next)
        if (f->seq > target && keys_match(f->keys, f->npaths, key)) target = f->seq;
    pthread_mutex_unlock(&q->mu);
    free(key);
    return target ? lucid_st_queue_wait(ctx, q, target) : LUCID_OK;
}

int lucid_st_queue_pending(lucid_st_queue *q) {
    pthread_mutex_lock(&q->mu);
    int n = (int)(q->submitted - q->completed);
    pthread_mutex_unlock(&q->mu);
    return n;
}

void lucid_st_queue_stats_get(lucid_st_queue *q, lucid_st_queue_stats *out) {
    pthread_mutex_lock(&q->mu);
    *out = q->stats;
    pthread_mutex_unlock(&q->mu);
}

lucid_status lucid_st_queue_close(lucid_ctx *ctx, lucid_st_queue *q) {
    if (!q) return LUCID_OK;
    lucid_status st = lucid_st_queue_wait(ctx, q, 0);
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_signal(&q->work);
    int started = q->started;
    pthread_mutex_unlock(&q->mu);
    if (started) pthread_join(q->thread, NULL);
    pthread_mutex_lock(&live_mu);
    for (lucid_st_queue **pp = &live; *pp; pp = &(*pp)->live_next)
        if (*pp == q) {
            *pp = q->live_next;
            break;
        }
    pthread_mutex_unlock(&live_mu);
    while (q->failures) { /* submitted after the wait by another thread */
        st_failure *f = q->failures;
        q->failures = f->next;
        failure_free(f);
    }
    pthread_cond_destroy(&q->work);
    pthread_cond_destroy(&q->done);
    pthread_mutex_destroy(&q->mu);
    free(q);
    return st;
}
