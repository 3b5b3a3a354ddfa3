/*
 * st_queue.h — background safetensors writes (checkpoints off the training
 * loop's critical path; docs/DECISIONS.md, "Background checkpoint
 * writes").
 *
 * A queue owns one writer thread (pthreads, started on the first submit)
 * that runs jobs in submission order. A job is a finished lucid_st_writer
 * (its tensors already snapshotted to host memory on the caller's thread:
 * lucid_st_writer_add_tensors) and one or more target paths. The thread
 * computes the CRC-32s and the header once (lucid_st_writer_encode) and
 * writes the same bytes to each path in order through the atomic writer
 * (temporary file, fsync, rename, directory fsync): the files are
 * byte-identical and independent (separate inodes: a later write to one
 * never changes another). A job stops at its first failed path; the paths
 * after it are not written and keep their previous contents.
 *
 * Guarantees
 *   - Killing the process at any moment leaves every target either with its
 *     previous contents or with the complete new file (atomic rename after
 *     fsync); a killed write leaves at most a ".<name>.tmp.XXXXXX" file.
 *   - A failed write is never lost: it is kept until a wait that covers the
 *     job reports it (LUCID_ERR_IO or LUCID_ERR_OOM; the message starts
 *     "background write of <path> failed: " and names every path of the job
 *     that was not written). Each failure is reported once.
 *   - Process exit through exit() (LuaJIT's os.exit, a host's return from
 *     main) waits for every queue's pending jobs (an atexit handler) and
 *     prints an unreported failure on stderr ("lucid: ..."), since there is
 *     nobody left to return it to. A signal that kills the process does not.
 *
 * Threading: submit, wait, wait_path, pending, stats and close may be called
 * from any thread but the writer's; one queue is meant to be driven by one
 * caller thread (a Lua state). Jobs hold no context and touch no device.
 */
#ifndef LUCID_IO_ST_QUEUE_H
#define LUCID_IO_ST_QUEUE_H

#include "io/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lucid_st_queue lucid_st_queue;

typedef struct lucid_st_queue_stats {
    uint64_t jobs;          /* jobs finished (written or failed) */
    uint64_t failed;        /* jobs that failed */
    uint64_t files;         /* files written (renamed into place) */
    uint64_t bytes;         /* bytes written to those files */
    double seconds;         /* wall seconds the writer thread spent on jobs */
} lucid_st_queue_stats;

/* A new, idle queue (no thread until the first submit). Errors: OOM. */
lucid_status lucid_st_queue_create(lucid_ctx *ctx, lucid_st_queue **out);

/* Queue w (taken over in every case: freed by the queue, or here on
 * failure) to be written to paths[0 .. npaths) in that order. Returns at
 * once (no I/O here); *seq (may be NULL) receives the job's number (1, 2,
 * ... in submission order) for lucid_st_queue_wait. Paths are copied.
 * Errors: ERR_ARG (no path, an empty path), OOM, ERR_STATE (the thread
 * could not be started). */
lucid_status lucid_st_queue_submit(lucid_ctx *ctx, lucid_st_queue *q,
                                   lucid_st_writer *w, const char *const *paths,
                                   int npaths, uint64_t *seq);

/* Block until job seq and every job before it are finished (seq 0: every
 * job submitted so far). Returns LUCID_OK, or the first unreported failure
 * among those jobs (its status; the message names the file, and how many
 * more failed), which is then cleared. */
lucid_status lucid_st_queue_wait(lucid_ctx *ctx, lucid_st_queue *q, uint64_t seq);

/* Block until the queued or running jobs that write `path` are finished
 * (and the jobs before them), then report as lucid_st_queue_wait; also
 * reports an unreported failure of an earlier write to `path`. Paths are
 * compared after resolving their directory (realpath), so "./a/x" and
 * "a/x" match. LUCID_OK at once when nothing concerns path. */
lucid_status lucid_st_queue_wait_path(lucid_ctx *ctx, lucid_st_queue *q,
                                      const char *path);

/* Jobs submitted and not yet finished. */
int lucid_st_queue_pending(lucid_st_queue *q);

/* Counters since the queue was created. */
void lucid_st_queue_stats_get(lucid_st_queue *q, lucid_st_queue_stats *out);

/* Wait for every job (as lucid_st_queue_wait(ctx, q, 0)), stop the thread
 * and free q (NULL: nothing). Returns the wait's status: an unreported
 * failure is the caller's to show. */
lucid_status lucid_st_queue_close(lucid_ctx *ctx, lucid_st_queue *q);

#ifdef __cplusplus
}
#endif
#endif /* LUCID_IO_ST_QUEUE_H */
