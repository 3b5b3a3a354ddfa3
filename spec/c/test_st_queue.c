/*
 * test_st_queue.c — the background safetensors writer (io/st_queue.h) and
 * the grouped snapshot (lucid_st_writer_add_tensors):
 *   - a queued write is byte-identical to lucid_st_writer_save;
 *   - one job, two paths: identical bytes, separate inodes, and a later
 *     write of the first leaves the second as it was;
 *   - the snapshot of views of one storage (offsets, a gap, overlap, a
 *     non-contiguous and an empty view, two dtypes) stores every tensor's
 *     bytes, in the caller's order;
 *   - failures (missing directory, ENOSPC injected, a real EFBIG from
 *     RLIMIT_FSIZE) come back from the next wait naming the file, once;
 *     two failures in one report; a job stops at its first failed path;
 *   - wait_path waits for its own path only (resolved spelling);
 *   - exit() with a write in flight completes it (atexit drain); SIGKILL
 *     in the middle of a write leaves the previous file intact;
 *   - close waits; the counters.
 */
#include "test.h"
#include "io/safetensors.h"
#include "io/st_queue.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char dir[256];
static int snapshot_jobs; /* jobs written by test_snapshot (1 per device) */

static size_t read_file(const char *path, unsigned char **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = malloc(n > 0 ? (size_t)n : 1);
    size_t got = fread(*out, 1, (size_t)n, f);
    fclose(f);
    return got;
}

static int same_file_bytes(const char *a, const char *b) {
    unsigned char *x, *y;
    size_t nx = read_file(a, &x), ny = read_file(b, &y);
    int same = nx > 0 && nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

static int temps_in(const char *d) {
    DIR *dd = opendir(d);
    int n = 0;
    struct dirent *e;
    while (dd && (e = readdir(dd)))
        if (strstr(e->d_name, ".tmp.")) n++;
    if (dd) closedir(dd);
    return n;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* A writer with one f32 tensor of n values v, v+1, ... and one metadata key. */
static lucid_st_writer *writer_of(lucid_ctx *ctx, int64_t n, float v) {
    lucid_st_writer *w = NULL;
    lucid_st_writer_create(ctx, &w);
    float *d = malloc((size_t)n * sizeof *d);
    for (int64_t i = 0; i < n; i++) d[i] = v + (float)i;
    lucid_st_writer_add_raw(ctx, w, "w", LUCID_F32, 1, &n, d);
    lucid_st_writer_set_metadata(ctx, w, "note", "test");
    free(d);
    return w;
}

/* First value of tensor "w" of a file, or -1. */
static float first_value(lucid_ctx *ctx, const char *path) {
    lucid_safetensors *f = NULL;
    if (lucid_safetensors_open(ctx, path, &f) != LUCID_OK) return -1;
    float v;
    memcpy(&v, lucid_safetensors_bytes(f, 0), sizeof v);
    lucid_safetensors_close(f);
    return v;
}

/* Test hooks of the atomic writer (run on the writer thread). */
static const char *stall_stage, *fail_stage;
static double stall_s;
static int fail_errno;
static int hook(const char *stage, void *ud) {
    (void)ud;
    if (stall_stage && strcmp(stage, stall_stage) == 0) sleep_s(stall_s);
    if (fail_stage && strcmp(stage, fail_stage) == 0) {
        errno = fail_errno;
        return 1;
    }
    return 0;
}
static void set_hook(const char *stall, double s, const char *fail, int e) {
    stall_stage = stall;
    stall_s = s;
    fail_stage = fail;
    fail_errno = e;
    lucid_atomic_file_set_fail_hook(stall || fail ? hook : NULL, NULL);
}


/* --------------------------------------------- separate processes first
 * (fork before this process has a queue thread of its own) */

static void test_exit_and_kill(void) {
    char p[320], k[320];
    snprintf(p, sizeof p, "%s/exit.safetensors", dir);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) { /* a write held 0.3 s before its fsync, then exit() */
        lucid_ctx *ctx = test_cpu_ctx();
        lucid_st_queue *q = NULL;
        lucid_st_queue_create(ctx, &q);
        set_hook("fsync", 0.3, NULL, 0);
        const char *paths[1] = {p};
        lucid_st_queue_submit(ctx, q, writer_of(ctx, 1000, 5), paths, 1, NULL);
        exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    lucid_ctx *ctx = test_cpu_ctx();
    CHECK("exit() with a write in flight waits for it (atexit drain)",
          WIFEXITED(status) && WEXITSTATUS(status) == 0 && first_value(ctx, p) == 5.0f,
          "status %d, value %g", status, first_value(ctx, p));

    snprintf(k, sizeof k, "%s/kill.safetensors", dir);
    lucid_st_writer *w = writer_of(ctx, 1000, 1);
    lucid_st_writer_save(ctx, w, k);
    lucid_st_writer_free(w);
    int before = temps_in(dir);
    fflush(stdout);
    pid = fork();
    if (pid == 0) { /* the new file complete in its temp, held before rename */
        lucid_ctx *c2 = test_cpu_ctx();
        lucid_st_queue *q = NULL;
        lucid_st_queue_create(c2, &q);
        set_hook("rename", 30, NULL, 0);
        const char *paths[1] = {k};
        lucid_st_queue_submit(c2, q, writer_of(c2, 1000, 2), paths, 1, NULL);
        lucid_st_queue_wait(c2, q, 0);
        _exit(1);
    }
    for (int i = 0; i < 500 && temps_in(dir) == before; i++) sleep_s(0.01);
    sleep_s(0.05);
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    CHECK("SIGKILL during a background write keeps the previous file",
          WIFSIGNALED(status) && first_value(ctx, k) == 1.0f && temps_in(dir) == before + 1,
          "status %d, value %g, temps %d", status, first_value(ctx, k), temps_in(dir));
    lucid_ctx_release(ctx);
}

/* -------------------------------------------------------------- queue */

static void test_bytes_and_copies(lucid_ctx *ctx, lucid_st_queue *q) {
    char a[320], b[320], c[320];
    snprintf(a, sizeof a, "%s/sync.safetensors", dir);
    snprintf(b, sizeof b, "%s/last.safetensors", dir);
    snprintf(c, sizeof c, "%s/best.safetensors", dir);
    lucid_st_writer *w = writer_of(ctx, 70000, 3);
    lucid_st_writer_save(ctx, w, a);
    lucid_st_writer_free(w);
    const char *two[2] = {b, c};
    uint64_t seq = 0;
    CHECK_STATUS("submit a job with two paths", ctx,
                 lucid_st_queue_submit(ctx, q, writer_of(ctx, 70000, 3), two, 2, &seq));
    CHECK_STATUS("wait for it", ctx, lucid_st_queue_wait(ctx, q, seq));
    CHECK("queued write is byte-identical to lucid_st_writer_save",
          same_file_bytes(a, b) && same_file_bytes(b, c), "files differ");
    struct stat sb, sc;
    stat(b, &sb);
    stat(c, &sc);
    CHECK("the two paths are separate files (inodes)", sb.st_ino != sc.st_ino, "same inode");
    const char *one[1] = {b};
    lucid_st_queue_submit(ctx, q, writer_of(ctx, 70000, 9), one, 1, NULL);
    lucid_st_queue_wait(ctx, q, 0);
    CHECK("a later write of the first path leaves the second as it was",
          first_value(ctx, b) == 9.0f && same_file_bytes(a, c), "b %g", first_value(ctx, b));
    CHECK("nothing pending after wait", lucid_st_queue_pending(q) == 0, "%d",
          lucid_st_queue_pending(q));
}

/* Views into one storage of 200000 f32 on dev (values i * 0.5). */
static void test_snapshot(lucid_ctx *ctx, lucid_st_queue *q, lucid_device dev,
                          const char *tag) {
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_storage *s = NULL;
    int64_t nall = 200000;
    lucid_tensor *host = NULL, *all = NULL;
    lucid_tensor_empty(ctx, cpu, LUCID_F32, 1, &nall, &host);
    float *d = lucid_tensor_data(host);
    for (int i = 0; i < 200000; i++) d[i] = (float)i * 0.5f;
    lucid_storage_create(ctx, dev, 200000 * 4, 0, &s);
    lucid_tensor_from_storage(ctx, s, LUCID_F32, 1, &nall, NULL, 0, &all);
    lucid_copy(ctx, all, host);
    lucid_tensor *t[7];
    int64_t sh2[2] = {3, 4}, st_t[2] = {1, 3}, n1 = 10, n0 = 0, n5 = 5, n8 = 8;
    lucid_tensor_from_storage(ctx, s, LUCID_F32, 2, sh2, NULL, 100, &t[0]);    /* [100,112) */
    lucid_tensor_from_storage(ctx, s, LUCID_F32, 1, &n1, NULL, 0, &t[1]);      /* [0,10) */
    lucid_tensor_from_storage(ctx, s, LUCID_F32, 1, &n1, NULL, 105, &t[2]);    /* overlaps t0 */
    lucid_tensor_from_storage(ctx, s, LUCID_F32, 1, &n5, NULL, 150000, &t[3]); /* past a gap */
    lucid_tensor_from_storage(ctx, s, LUCID_F32, 2, sh2, st_t, 300, &t[4]);   /* transposed */
    lucid_tensor_from_storage(ctx, s, LUCID_F32, 1, &n0, NULL, 50, &t[5]);     /* empty */
    lucid_tensor_from_storage(ctx, s, LUCID_I64, 1, &n8, NULL, 40, &t[6]);     /* i64 bytes */
    const char *names[7] = {"t0", "t1", "t2", "t3", "t4", "t5", "t6"};
    /* the expected bytes, read before the storage changes */
    lucid_tensor *want[7];
    for (int i = 0; i < 7; i++) lucid_tensor_to(ctx, t[i], cpu, t[i]->dtype, &want[i]);
    lucid_st_writer *w = NULL;
    lucid_st_writer_create(ctx, &w);
    char name[160];
    snprintf(name, sizeof name, "%s: snapshot of seven views of one storage", tag);
    CHECK_STATUS(name, ctx,
                 lucid_st_writer_add_tensors(ctx, w, 7, names, (const lucid_tensor *const *)t));
    lucid_fill(ctx, all, -1.0); /* changes after the snapshot */
    char p[320];
    snprintf(p, sizeof p, "%s/views_%s.safetensors", dir, tag);
    const char *one[1] = {p};
    lucid_st_queue_submit(ctx, q, w, one, 1, NULL);
    lucid_st_queue_wait(ctx, q, 0);
    snapshot_jobs++;
    lucid_safetensors *f = NULL;
    lucid_safetensors_open(ctx, p, &f);
    int ok = f && lucid_safetensors_count(f) == 7;
    for (int i = 0; ok && i < 7; i++) {
        const lucid_st_info *in = lucid_safetensors_info(f, i); /* data-offset order */
        size_t nb = lucid_tensor_nbytes(want[i]);
        ok = strcmp(in->name, names[i]) == 0 && in->dtype == t[i]->dtype &&
             in->end - in->begin == nb &&
             memcmp(lucid_safetensors_bytes(f, i), lucid_tensor_data(want[i]), nb) == 0;
        if (!ok) printf("# %s: tensor %s differs\n", tag, names[i]);
    }
    snprintf(name, sizeof name,
             "%s: the snapshot holds every view's bytes as they were, in the caller's order", tag);
    CHECK(name, ok, "mismatch");
    lucid_safetensors_close(f);
    for (int i = 0; i < 7; i++) {
        lucid_tensor_release(t[i]);
        lucid_tensor_release(want[i]);
    }
    lucid_tensor_release(all);
    lucid_tensor_release(host);
    lucid_storage_release(s);
}

static void test_failures(lucid_ctx *ctx, lucid_st_queue *q) {
    char bad[320], p[320], keep[320];
    snprintf(bad, sizeof bad, "%s/missing/last.safetensors", dir);
    const char *one[1] = {bad};
    CHECK_STATUS("submit into a missing directory succeeds (the write is later)", ctx,
                 lucid_st_queue_submit(ctx, q, writer_of(ctx, 10, 1), one, 1, NULL));
    lucid_status st = lucid_st_queue_wait(ctx, q, 0);
    char want[400];
    snprintf(want, sizeof want, "background write of %s failed", bad);
    CHECK("the failure comes back from the wait, naming the file",
          st == LUCID_ERR_IO && strstr(lucid_ctx_error(ctx), want), "%d %s", st,
          lucid_ctx_error(ctx));
    CHECK("a failure is reported once", lucid_st_queue_wait(ctx, q, 0) == LUCID_OK, "%s",
          lucid_ctx_error(ctx));

    /* ENOSPC at the write: old file kept, no temp left */
    snprintf(p, sizeof p, "%s/full.safetensors", dir);
    lucid_st_writer *w = writer_of(ctx, 10, 1);
    lucid_st_writer_save(ctx, w, p);
    lucid_st_writer_free(w);
    int temps = temps_in(dir);
    set_hook(NULL, 0, "write", ENOSPC);
    const char *fp[1] = {p};
    lucid_st_queue_submit(ctx, q, writer_of(ctx, 10, 2), fp, 1, NULL);
    st = lucid_st_queue_wait_path(ctx, q, p);
    set_hook(NULL, 0, NULL, 0);
    CHECK("a full disk (ENOSPC) is reported by wait_path; the old file stays",
          st == LUCID_ERR_IO && strstr(lucid_ctx_error(ctx), "No space left on device") &&
              first_value(ctx, p) == 1.0f && temps_in(dir) == temps,
          "%d %s", st, lucid_ctx_error(ctx));

    /* a real write(2) failure on the writer thread: the file size limit */
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 64 << 10;
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &lim);
    lucid_st_queue_submit(ctx, q, writer_of(ctx, 100000, 3), fp, 1, NULL);
    st = lucid_st_queue_wait(ctx, q, 0);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, SIG_DFL);
    CHECK("a real write error (EFBIG past RLIMIT_FSIZE) is reported naming the file",
          st == LUCID_ERR_IO && strstr(lucid_ctx_error(ctx), p) &&
              strstr(lucid_ctx_error(ctx), "File too large") && first_value(ctx, p) == 1.0f,
          "%d %s", st, lucid_ctx_error(ctx));

    /* two failures, one report */
    lucid_st_queue_submit(ctx, q, writer_of(ctx, 10, 1), one, 1, NULL);
    lucid_st_queue_submit(ctx, q, writer_of(ctx, 10, 1), one, 1, NULL);
    st = lucid_st_queue_wait(ctx, q, 0);
    CHECK("two failed jobs: one report that counts the second",
          st == LUCID_ERR_IO && strstr(lucid_ctx_error(ctx), "(and 1 more failed background write;"),
          "%s", lucid_ctx_error(ctx));

    /* a job stops at its first failed path */
    snprintf(keep, sizeof keep, "%s/keep.safetensors", dir);
    w = writer_of(ctx, 10, 4);
    lucid_st_writer_save(ctx, w, keep);
    lucid_st_writer_free(w);
    const char *two[2] = {bad, keep};
    lucid_st_queue_submit(ctx, q, writer_of(ctx, 10, 5), two, 2, NULL);
    st = lucid_st_queue_wait(ctx, q, 0);
    CHECK("a job stops at its first failed path and names the ones not written",
          st == LUCID_ERR_IO && strstr(lucid_ctx_error(ctx), "not written either") &&
              strstr(lucid_ctx_error(ctx), keep) && first_value(ctx, keep) == 4.0f,
          "%s", lucid_ctx_error(ctx));
    CHECK("submit refuses an empty path list",
          lucid_st_queue_submit(ctx, q, writer_of(ctx, 1, 0), two, 0, NULL) == LUCID_ERR_ARG,
          "accepted");
}

static void test_wait_path(lucid_ctx *ctx, lucid_st_queue *q) {
    char p[320], spelled[340], other[320];
    snprintf(p, sizeof p, "%s/held.safetensors", dir);
    snprintf(spelled, sizeof spelled, "%s/./held.safetensors", dir);
    snprintf(other, sizeof other, "%s/other.safetensors", dir);
    set_hook("fsync", 0.3, NULL, 0);
    const char *one[1] = {p};
    lucid_st_queue_submit(ctx, q, writer_of(ctx, 10, 6), one, 1, NULL);
    lucid_status st = lucid_st_queue_wait_path(ctx, q, other);
    int pending_after_other = lucid_st_queue_pending(q);
    CHECK("wait_path of another path does not wait", st == LUCID_OK && pending_after_other == 1,
          "pending %d", pending_after_other);
    st = lucid_st_queue_wait_path(ctx, q, spelled);
    set_hook(NULL, 0, NULL, 0);
    CHECK("wait_path of the same file (other spelling) waits for its write",
          st == LUCID_OK && lucid_st_queue_pending(q) == 0 && first_value(ctx, p) == 6.0f,
          "%d pending %d", st, lucid_st_queue_pending(q));
}

int main(void) {
    if (!test_tmpdir(dir, sizeof dir, "lucid_st_queue")) return 1;
    test_exit_and_kill();
    lucid_ctx *ctx = test_cpu_ctx();
    lucid_st_queue *q = NULL;
    CHECK_STATUS("create a queue", ctx, lucid_st_queue_create(ctx, &q));
    test_bytes_and_copies(ctx, q);
    lucid_device cpu = {LUCID_CPU, 0};
    test_snapshot(ctx, q, cpu, "cpu");
    if (lucid_cuda_available()) {
        lucid_ctx_options o = lucid_ctx_options_default();
        o.device.type = LUCID_CUDA;
        o.device.index = 0;
        lucid_ctx *gctx = NULL;
        if (lucid_ctx_create(&o, &gctx, NULL, 0) == LUCID_OK) {
            test_snapshot(gctx, q, o.device, "cuda");
            lucid_ctx_release(gctx);
        } else {
            TEST_FAIL("cuda: snapshot", "cannot create a CUDA context");
        }
    } else {
        TEST_SKIP("cuda: snapshot of views of one device storage", "no CUDA device");
    }
    test_failures(ctx, q);
    test_wait_path(ctx, q);
    lucid_st_queue_stats s;
    lucid_st_queue_stats_get(q, &s);
    CHECK("counters: jobs, failures, files, bytes, seconds",
          s.jobs == 9u + (unsigned)snapshot_jobs && s.failed == 6 &&
              s.files == 4u + (unsigned)snapshot_jobs && s.bytes > 560000 && s.seconds > 0,
          "jobs %llu failed %llu files %llu bytes %llu", (unsigned long long)s.jobs,
          (unsigned long long)s.failed, (unsigned long long)s.files, (unsigned long long)s.bytes);
    /* close waits for a pending job */
    char p[320];
    snprintf(p, sizeof p, "%s/close.safetensors", dir);
    const char *one[1] = {p};
    set_hook("fsync", 0.2, NULL, 0);
    lucid_st_queue_submit(ctx, q, writer_of(ctx, 10, 8), one, 1, NULL);
    CHECK_STATUS("close waits for the pending job", ctx, lucid_st_queue_close(ctx, q));
    set_hook(NULL, 0, NULL, 0);
    CHECK("its file is written", first_value(ctx, p) == 8.0f, "%g", first_value(ctx, p));
    lucid_ctx_release(ctx);
    test_rmdir(dir);
    return test_exit();
}
