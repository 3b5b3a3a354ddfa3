/*
 * atomic_file.c — write a file so that readers see either the complete old
 * contents or the complete new ones, never a mix (DESIGN.md decision 7).
 *
 * Contract
 *   - open: creates "<dir>/.<name>.tmp.XXXXXX" next to the target (same
 *     filesystem, so rename is atomic) with mode 0644.
 *   - write: loops over short writes and EINTR.
 *   - commit: fsync(temp) -> close -> rename(temp, target) -> fsync(dir).
 *     After a successful rename the new file is in place; a failing
 *     directory fsync is still reported (durability unknown).
 *   - Any failure before the rename unlinks the temp file and leaves the
 *     target exactly as it was (absent or old contents). abort does the
 *     same on purpose. Every error names the path and the failing call.
 *   - Test hook: lucid_atomic_file_set_fail_hook installs a process-wide
 *     callback asked before each stage ("open", "write", "fsync", "rename");
 *     a non-zero return makes that stage fail with the errno the hook set
 *     (EIO when it left errno 0; e.g. ENOSPC simulates a full disk). It is
 *     called on the thread that writes (the background checkpoint writer,
 *     io/st_queue.h, for queued saves). Test use only: install or remove it
 *     while no write is in flight.
 */
#include "io/safetensors.h"
#include "internal.h"
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct lucid_atomic_file {
    int fd;
    char *path; /* target */
    char *tmp;  /* temp file */
};

static int (*fail_hook)(const char *stage, void *ud);
static void *fail_ud;

void lucid_atomic_file_set_fail_hook(int (*hook)(const char *stage, void *ud),
                                     void *ud) {
    fail_hook = hook;
    fail_ud = ud;
}

static int injected(const char *stage) {
    if (!fail_hook) return 0;
    errno = 0;
    if (fail_hook(stage, fail_ud)) {
        if (errno == 0) errno = EIO;
        return 1;
    }
    return 0;
}

/* What a failure before the rename left at the target, for the message:
 * the previous file, or nothing (the first write of that path). */
static const char *af_kept(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? "the previous file is unchanged"
                                : "no file was written at that path";
}

static void af_free(lucid_atomic_file *f) {
    if (!f) return;
    free(f->path);
    free(f->tmp);
    free(f);
}

lucid_status lucid_atomic_file_open(lucid_ctx *ctx, const char *path,
                                    lucid_atomic_file **out) {
    *out = NULL;
    if (!path || !*path)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "atomic write: empty path");
    char *d1 = strdup(path), *d2 = strdup(path);
    lucid_atomic_file *f = calloc(1, sizeof *f);
    if (!d1 || !d2 || !f) {
        free(d1);
        free(d2);
        free(f);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "atomic write: out of memory");
    }
    const char *dir = dirname(d1), *base = basename(d2);
    size_t n = strlen(dir) + strlen(base) + 32;
    f->tmp = malloc(n);
    f->path = strdup(path);
    f->fd = -1;
    if (!f->tmp || !f->path) {
        free(d1);
        free(d2);
        af_free(f);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "atomic write: out of memory");
    }
    snprintf(f->tmp, n, "%s/.%s.tmp.XXXXXX", dir, base);
    free(d1);
    free(d2);
    if (!injected("open")) f->fd = mkstemp(f->tmp);
    if (f->fd < 0) {
        lucid_status st = lucid_seterr(ctx, LUCID_ERR_IO,
                                       "%s: cannot create a temporary file "
                                       "next to it (%s): %s",
                                       path, f->tmp, strerror(errno));
        af_free(f);
        return st;
    }
    fchmod(f->fd, 0644);
    *out = f;
    return LUCID_OK;
}

void lucid_atomic_file_abort(lucid_atomic_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    unlink(f->tmp);
    af_free(f);
}

lucid_status lucid_atomic_file_write(lucid_ctx *ctx, lucid_atomic_file *f,
                                     const void *data, size_t n) {
    const char *p = data;
    while (n > 0) {
        ssize_t w = injected("write") ? -1 : write(f->fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            return lucid_seterr(ctx, LUCID_ERR_IO,
                                "%s: write to the temporary file failed: %s (%s)", f->path,
                                strerror(e), af_kept(f->path));
        }
        p += w;
        n -= (size_t)w;
    }
    return LUCID_OK;
}

lucid_status lucid_atomic_file_commit(lucid_ctx *ctx, lucid_atomic_file *f) {
    lucid_status st = LUCID_OK;
    if (injected("fsync") || fsync(f->fd) != 0) {
        int e = errno;
        st = lucid_seterr(ctx, LUCID_ERR_IO, "%s: fsync of the temporary file failed: %s (%s)",
                          f->path, strerror(e), af_kept(f->path));
        lucid_atomic_file_abort(f);
        return st;
    }
    int rc = close(f->fd);
    f->fd = -1;
    if (rc != 0) {
        int e = errno;
        st = lucid_seterr(ctx, LUCID_ERR_IO, "%s: close of the temporary file failed: %s (%s)",
                          f->path, strerror(e), af_kept(f->path));
        lucid_atomic_file_abort(f);
        return st;
    }
    if (injected("rename") || rename(f->tmp, f->path) != 0) {
        int e = errno;
        st = lucid_seterr(ctx, LUCID_ERR_IO, "%s: rename from %s failed: %s (%s)", f->path,
                          f->tmp, strerror(e), af_kept(f->path));
        lucid_atomic_file_abort(f);
        return st;
    }
    char *d = strdup(f->path);
    if (d) {
        int dfd = open(dirname(d), O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) {
            if (fsync(dfd) != 0 && errno != EINVAL)
                st = lucid_seterr(ctx, LUCID_ERR_IO,
                                  "%s: written and renamed, but fsync of its "
                                  "directory failed: %s",
                                  f->path, strerror(errno));
            close(dfd);
        }
        free(d);
    }
    af_free(f);
    return st;
}

lucid_status lucid_atomic_write(lucid_ctx *ctx, const char *path,
                                const void *data, size_t n) {
    lucid_atomic_file *f = NULL;
    LUCID_TRY(lucid_atomic_file_open(ctx, path, &f));
    lucid_status st = lucid_atomic_file_write(ctx, f, data, n);
    if (st != LUCID_OK) {
        lucid_atomic_file_abort(f);
        return st;
    }
    return lucid_atomic_file_commit(ctx, f);
}

/* The names lucid_atomic_file_open gives temp files of `base`:
 * "." base ".tmp." and six mkstemp characters ([A-Za-z0-9]). */
static int is_stale_temp(const char *name, const char *base) {
    size_t nb = strlen(base);
    if (name[0] != '.' || strncmp(name + 1, base, nb) != 0) return 0;
    const char *t = name + 1 + nb;
    if (strncmp(t, ".tmp.", 5) != 0) return 0;
    t += 5;
    size_t k = 0;
    for (; t[k]; k++)
        if (!((t[k] >= 'a' && t[k] <= 'z') || (t[k] >= 'A' && t[k] <= 'Z') ||
              (t[k] >= '0' && t[k] <= '9')))
            return 0;
    return k == 6;
}

lucid_status lucid_atomic_file_remove_stale(lucid_ctx *ctx, const char *path,
                                            int *removed) {
    *removed = 0;
    if (!path || !*path)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "remove stale temporaries: empty path");
    char *d1 = strdup(path), *d2 = strdup(path);
    if (!d1 || !d2) {
        free(d1);
        free(d2);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "remove stale temporaries: out of memory");
    }
    const char *dir = dirname(d1), *base = basename(d2);
    lucid_status st = LUCID_OK;
    DIR *dp = opendir(dir);
    if (!dp) {
        /* no folder yet: nothing stale */
        if (errno != ENOENT)
            st = lucid_seterr(ctx, LUCID_ERR_IO, "%s: cannot list the folder: %s", dir,
                              strerror(errno));
    } else {
        struct dirent *e;
        while ((e = readdir(dp)) != NULL) {
            if (!is_stale_temp(e->d_name, base)) continue;
            size_t n = strlen(dir) + strlen(e->d_name) + 2;
            char *full = malloc(n);
            if (!full) {
                st = lucid_seterr(ctx, LUCID_ERR_OOM, "remove stale temporaries: out of memory");
                break;
            }
            snprintf(full, n, "%s/%s", dir, e->d_name);
            if (unlink(full) == 0) {
                (*removed)++;
            } else if (errno != ENOENT) {
                st = lucid_seterr(ctx, LUCID_ERR_IO, "%s: cannot remove: %s", full, strerror(errno));
                free(full);
                break;
            }
            free(full);
        }
        closedir(dp);
    }
    free(d1);
    free(d2);
    return st;
}
