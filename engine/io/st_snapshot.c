/*
 * st_snapshot.c — the host snapshot of a checkpoint's tensors
 * (lucid_st_writer_add_tensors; contract in io/safetensors.h).
 *
 * A checkpoint's tensors are views into a few flat storages (parameters,
 * buffers, EMA, optimizer state, gradients: DESIGN.md decision 3). Copying
 * them one by one costs one device->host transfer and one stream wait per
 * tensor (1832 for the nano pose model with EMA, optimizer state and
 * gradients; they form 7 runs);
 * here contiguous views of one storage whose byte ranges lie within
 * SNAP_GAP of each other are grouped into runs, each run is copied once into
 * a malloc'd block that the writer adopts, and every tensor of the run is
 * added as a pointer into its block (lucid_st_writer_add_borrowed: no second
 * copy). Non-contiguous or empty tensors go through lucid_st_writer_add.
 * The file's tensor order is the caller's order, whatever the grouping.
 *
 * Cost: one copy per run (memcpy on the CPU, one cudaMemcpy on a GPU) and
 * one device synchronization; host memory = the runs' bytes (the tensors'
 * bytes plus gaps of at most SNAP_GAP each).
 */
#include "io/safetensors.h"
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* Largest hole between two views still copied as one run (bytes). */
#define SNAP_GAP ((size_t)64 << 10)

typedef struct {
    int idx;          /* position in the caller's list */
    lucid_storage *s; /* the view's storage */
    size_t lo, hi;    /* byte range of the view in s */
} snap_ref;

static int cmp_ref(const void *a, const void *b) {
    const snap_ref *x = a, *y = b;
    if (x->s != y->s) return (uintptr_t)x->s < (uintptr_t)y->s ? -1 : 1;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    return x->idx - y->idx;
}

/* Copy bytes [lo, lo + n) of storage s into host memory dst. */
static lucid_status copy_range(lucid_ctx *ctx, lucid_storage *s, size_t lo,
                               size_t n, void *dst) {
    if (lucid_storage_device(s).type == LUCID_CPU) {
        memcpy(dst, (const unsigned char *)lucid_storage_data(s) + lo, n);
        return LUCID_OK;
    }
    /* a byte view of the device range and of the host block: one copy */
    const int64_t len = (int64_t)n, one = 1;
    const lucid_device cpu = {LUCID_CPU, 0};
    lucid_tensor *src = NULL, *hst = NULL;
    lucid_storage *hs = NULL;
    lucid_status st = lucid_tensor_from_storage(ctx, s, LUCID_U8, 1, &len, &one,
                                                (int64_t)lo, &src);
    if (st == LUCID_OK) st = lucid_storage_wrap(ctx, cpu, dst, n, &hs);
    if (st == LUCID_OK)
        st = lucid_tensor_from_storage(ctx, hs, LUCID_U8, 1, &len, &one, 0, &hst);
    if (st == LUCID_OK) st = lucid_copy(ctx, hst, src);
    lucid_tensor_release(hst);
    lucid_storage_release(hs);
    lucid_tensor_release(src);
    return st;
}

lucid_status lucid_st_writer_add_tensors(lucid_ctx *ctx, lucid_st_writer *w,
                                         int n, const char *const *names,
                                         const lucid_tensor *const *tensors) {
    if (n < 0)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "safetensors snapshot: %d tensors", n);
    for (int i = 0; i < n; i++)
        if (!tensors[i] || !tensors[i]->storage)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "safetensors snapshot: tensor %d ('%s') is NULL",
                                i, names[i] ? names[i] : "(null)");
    if (n == 0) return LUCID_OK;
    snap_ref *refs = malloc((size_t)n * sizeof *refs);
    const unsigned char **where = calloc((size_t)n, sizeof *where);
    if (!refs || !where) {
        free(refs);
        free(where);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "safetensors snapshot: out of memory");
    }
    int m = 0;
    for (int i = 0; i < n; i++) {
        const lucid_tensor *t = tensors[i];
        int64_t numel = lucid_tensor_numel(t);
        if (numel == 0 || !lucid_tensor_is_contiguous(t)) continue;
        size_t es = lucid_dtype_size(t->dtype);
        refs[m].idx = i;
        refs[m].s = t->storage;
        refs[m].lo = (size_t)t->offset * es;
        refs[m].hi = refs[m].lo + (size_t)numel * es;
        m++;
    }
    qsort(refs, (size_t)m, sizeof *refs, cmp_ref);
    lucid_status st = LUCID_OK;
    int on_device = 0;
    for (int a = 0; st == LUCID_OK && a < m;) {
        size_t lo = refs[a].lo, hi = refs[a].hi;
        int b = a + 1;
        while (b < m && refs[b].s == refs[a].s && refs[b].lo <= hi + SNAP_GAP) {
            if (refs[b].hi > hi) hi = refs[b].hi;
            b++;
        }
        unsigned char *block = malloc(hi - lo);
        if (!block) {
            st = lucid_seterr(ctx, LUCID_ERR_OOM,
                              "safetensors snapshot: out of host memory for %zu bytes",
                              hi - lo);
            break;
        }
        st = lucid_st_writer_adopt_block(ctx, w, block); /* frees it on failure */
        if (st == LUCID_OK) st = copy_range(ctx, refs[a].s, lo, hi - lo, block);
        if (lucid_storage_device(refs[a].s).type != LUCID_CPU) on_device = 1;
        for (int k = a; st == LUCID_OK && k < b; k++)
            where[refs[k].idx] = block + (refs[k].lo - lo);
        a = b;
    }
    /* device->host copies are stream-ordered: wait before the bytes are used */
    if (st == LUCID_OK && on_device) st = lucid_ctx_synchronize(ctx);
    for (int i = 0; st == LUCID_OK && i < n; i++) {
        const lucid_tensor *t = tensors[i];
        st = where[i] ? lucid_st_writer_add_borrowed(ctx, w, names[i], t->dtype, t->ndim,
                                                     t->shape, where[i])
                      : lucid_st_writer_add(ctx, w, names[i], t);
    }
    free(refs);
    free(where);
    return st;
}
