/*
 * test_conv_wshadow.c — the host side of the Conv2d weight shadows
 * (engine/nn/nn.h lucid_conv_wshadow, engine/nn/conv_wshadow.c) on the CPU:
 *   - freshness: a marked shadow is fresh for the same weight view, dtype
 *     and epoch only; an in-place write of the weight's storage (an op,
 *     which bumps the storage version), another tensor of the same shape, a
 *     view at another offset of the same storage, another dtype or another
 *     epoch make it stale; invalidate forgets; a shadow without a buffer is
 *     never fresh;
 *   - the flipped copy's record (mark_flip / flip_off): its offset only for
 *     a fresh shadow and the shape it was made for (a same-data view of
 *     another shape is fresh but gets 0), forgotten by invalidate;
 *   - the stride-phase backward-data's transposed copy (mark_phase /
 *     phase_off, want_phase): the same rule as the flipped copy's, both
 *     records side by side; want_phase is set by want_phase only, kept by
 *     invalidate and by marks, cleared by init;
 *   - mark retains the weight's storage (its address cannot be reused while
 *     the shadow names it) and release drops it and the buffer;
 *   - the entry points: lucid_nn_conv_cast_weights and
 *     lucid_nn_conv2d_cast_shadows argument errors, and nothing done on the
 *     CPU; a 1x1 Conv2d module's forward and backward on the CPU (which pass
 *     the module's shadow) are bitwise the shadow-less entry points.
 * The device side (casts, capture epochs) is spec/c/test_conv_wcast_cuda.c.
 */
#include "test.h"
#include "internal.h"
#include "nn/nn.h"

#include <string.h>

static const lucid_device CPU = {LUCID_CPU, 0};

static int refs(const lucid_storage *s) { return __atomic_load_n(&s->refcount, __ATOMIC_RELAXED); }

static void test_freshness(lucid_ctx *ctx) {
    int64_t ws[4] = {8, 4, 1, 1}, big[1] = {64};
    lucid_tensor *w = NULL, *w2 = NULL, *flat = NULL, *v0 = NULL, *v1 = NULL;
    lucid_conv_wshadow s;
    lucid_conv_wshadow_init(&s);
    if (lucid_tensor_zeros(ctx, CPU, LUCID_F32, 4, ws, &w) || lucid_tensor_zeros(ctx, CPU, LUCID_F32, 4, ws, &w2) ||
        lucid_tensor_zeros(ctx, CPU, LUCID_F32, 1, big, &flat) ||
        lucid_storage_create(ctx, CPU, 64, 0, &s.buf)) {
        TEST_FAIL("wshadow: setup", "%s", lucid_ctx_error(ctx));
        goto done;
    }
    CHECK("wshadow: empty shadow is not fresh", !lucid_conv_wshadow_fresh(&s, w, LUCID_BF16, 0),
          "fresh");
    int r0 = refs(w->storage);
    lucid_conv_wshadow_mark(&s, w, LUCID_BF16, 7);
    CHECK("wshadow: marked is fresh (same view, dtype, epoch)",
          lucid_conv_wshadow_fresh(&s, w, LUCID_BF16, 7), "stale");
    CHECK("wshadow: mark retains the weight's storage", refs(w->storage) == r0 + 1,
          "refcount %d, expected %d", refs(w->storage), r0 + 1);
    lucid_conv_wshadow_mark(&s, w, LUCID_BF16, 7); /* again: still one reference */
    CHECK("wshadow: a second mark keeps one reference", refs(w->storage) == r0 + 1,
          "refcount %d, expected %d", refs(w->storage), r0 + 1);
    CHECK("wshadow: other dtype is stale", !lucid_conv_wshadow_fresh(&s, w, LUCID_F16, 7),
          "fresh");
    CHECK("wshadow: other epoch is stale", !lucid_conv_wshadow_fresh(&s, w, LUCID_BF16, 8),
          "fresh");
    CHECK("wshadow: other tensor of the same shape is stale",
          !lucid_conv_wshadow_fresh(&s, w2, LUCID_BF16, 7), "fresh");
    /* an in-place op on the weight bumps its storage version */
    uint64_t v = lucid_storage_version(w->storage);
    if (lucid_binary_scalar(ctx, LUCID_OP_MUL, w, w, 0.5, 0) != LUCID_OK) {
        TEST_FAIL("wshadow: in-place op", "%s", lucid_ctx_error(ctx));
        goto done;
    }
    CHECK("wshadow: in-place op bumped the version", lucid_storage_version(w->storage) > v,
          "version %llu", (unsigned long long)lucid_storage_version(w->storage));
    CHECK("wshadow: stale after an in-place write of the weight",
          !lucid_conv_wshadow_fresh(&s, w, LUCID_BF16, 7), "fresh");
    lucid_conv_wshadow_mark(&s, w, LUCID_BF16, 7);
    CHECK("wshadow: fresh again after a new mark", lucid_conv_wshadow_fresh(&s, w, LUCID_BF16, 7),
          "stale");
    /* a write of ANOTHER tensor does not touch w's storage */
    if (lucid_fill(ctx, w2, 1.0) != LUCID_OK) {
        TEST_FAIL("wshadow: fill other", "%s", lucid_ctx_error(ctx));
        goto done;
    }
    CHECK("wshadow: a write elsewhere keeps it fresh", lucid_conv_wshadow_fresh(&s, w, LUCID_BF16, 7),
          "stale");
    /* views of one flat storage (as a parameter set's): offset matters, and
     * a write anywhere in the storage makes every view stale */
    {
        if (lucid_tensor_from_storage(ctx, flat->storage, LUCID_F32, 4, ws, NULL, 0, &v0) ||
            lucid_tensor_from_storage(ctx, flat->storage, LUCID_F32, 4, ws, NULL, 32, &v1)) {
            TEST_FAIL("wshadow: views", "%s", lucid_ctx_error(ctx));
            goto done;
        }
        lucid_conv_wshadow_mark(&s, v0, LUCID_F16, 1);
        CHECK("wshadow: view fresh", lucid_conv_wshadow_fresh(&s, v0, LUCID_F16, 1), "stale");
        CHECK("wshadow: view at another offset of the storage is stale",
              !lucid_conv_wshadow_fresh(&s, v1, LUCID_F16, 1), "fresh");
        if (lucid_fill(ctx, v1, 2.0) != LUCID_OK) {
            TEST_FAIL("wshadow: fill view", "%s", lucid_ctx_error(ctx));
            goto done;
        }
        CHECK("wshadow: a write of another view of the storage makes it stale",
              !lucid_conv_wshadow_fresh(&s, v0, LUCID_F16, 1), "fresh");
    }
    lucid_conv_wshadow_mark(&s, w, LUCID_BF16, 3);
    lucid_conv_wshadow_invalidate(&s);
    CHECK("wshadow: invalidated is stale", !lucid_conv_wshadow_fresh(&s, w, LUCID_BF16, 3),
          "fresh");
    CHECK("wshadow: invalidate drops the reference", refs(w->storage) == r0, "refcount %d, expected %d",
          refs(w->storage), r0);
    CHECK("wshadow: invalidate keeps the buffer", s.buf != NULL, "buffer gone");
    {
        lucid_storage *b = s.buf;
        s.buf = NULL;
        lucid_conv_wshadow_mark(&s, w, LUCID_BF16, 3);
        CHECK("wshadow: no buffer is never fresh", !lucid_conv_wshadow_fresh(&s, w, LUCID_BF16, 3),
              "fresh");
        s.buf = b;
    }
    lucid_conv_wshadow_release(&s);
    CHECK("wshadow: release drops buffer and reference",
          !s.buf && !s.src && !s.valid && refs(w->storage) == r0, "buf %p src %p refcount %d",
          (void *)s.buf, (void *)s.src, refs(w->storage));
done:
    lucid_conv_wshadow_release(&s);
    lucid_tensor_release(w);
    lucid_tensor_release(w2);
    lucid_tensor_release(flat);
    lucid_tensor_release(v0);
    lucid_tensor_release(v1);
}

static void test_entry_points(lucid_ctx *ctx) {
    lucid_param_set *set = NULL;
    lucid_module *c1 = NULL, *c3 = NULL, *act = NULL, *late = NULL;
    lucid_tensor *x = NULL, *dy = NULL, *y2 = NULL, *dx2 = NULL, *w = NULL;
    lucid_param_set *set2 = NULL;
    if (lucid_param_set_create(ctx, &set) ||
        lucid_module_conv2d_create(ctx, set, "c1", 8, 16, 1, 1, -1, 1, 1, 1, &c1) ||
        lucid_module_conv2d_create(ctx, set, "c3", 8, 16, 3, 1, -1, 1, 1, 0, &c3) ||
        lucid_module_silu_create(ctx, &act) || lucid_param_set_create(ctx, &set2) ||
        lucid_module_conv2d_create(ctx, set2, "late", 8, 8, 1, 1, -1, 1, 1, 0, &late)) {
        TEST_FAIL("wshadow entry: setup", "%s", lucid_ctx_error(ctx));
        goto done;
    }
    {
        lucid_module *m[1] = {late};
        lucid_status st = lucid_nn_conv_cast_weights(ctx, m, 1, LUCID_BF16);
        CHECK("conv_cast_weights before materialize is ERR_STATE", st == LUCID_ERR_STATE,
              "status %s", lucid_status_name(st));
    }
    if (lucid_param_set_materialize(ctx, set, CPU, LUCID_F32)) {
        TEST_FAIL("wshadow entry: materialize", "%s", lucid_ctx_error(ctx));
        goto done;
    }
    {
        lucid_module *ok[2] = {c1, c3}, *bad[2] = {c1, act}, *nul[1] = {NULL};
        CHECK_STATUS("conv_cast_weights on the CPU: nothing to do", ctx,
                     lucid_nn_conv_cast_weights(ctx, ok, 2, LUCID_BF16));
        CHECK_STATUS("conv_cast_weights of no module", ctx,
                     lucid_nn_conv_cast_weights(ctx, NULL, 0, LUCID_BF16));
        lucid_status st = lucid_nn_conv_cast_weights(ctx, bad, 2, LUCID_BF16);
        CHECK("conv_cast_weights of a SiLU is ERR_ARG naming it",
              st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "SiLU"), "status %s: %s",
              lucid_status_name(st), lucid_ctx_error(ctx));
        st = lucid_nn_conv_cast_weights(ctx, nul, 1, LUCID_BF16);
        CHECK("conv_cast_weights of NULL is ERR_ARG", st == LUCID_ERR_ARG, "status %s",
              lucid_status_name(st));
        st = lucid_nn_conv_cast_weights(ctx, ok, -1, LUCID_BF16);
        CHECK("conv_cast_weights n < 0 is ERR_ARG", st == LUCID_ERR_ARG, "status %s",
              lucid_status_name(st));
        st = lucid_nn_conv_cast_weights(ctx, ok, 2, LUCID_F64);
        CHECK("conv_cast_weights dtype f64 is ERR_ARG", st == LUCID_ERR_ARG, "status %s",
              lucid_status_name(st));
    }
    {
        lucid_conv_wshadow s, *sp = &s;
        lucid_conv_wshadow_init(&s);
        const lucid_tensor *wv = c1->params[0]->data, *wn[1] = {NULL};
        lucid_status st = lucid_nn_conv2d_cast_shadows(ctx, wn, &sp, 1, LUCID_BF16);
        CHECK("cast_shadows NULL weight is ERR_ARG", st == LUCID_ERR_ARG, "status %s",
              lucid_status_name(st));
        CHECK_STATUS("cast_shadows on the CPU: nothing to do", ctx,
                     lucid_nn_conv2d_cast_shadows(ctx, &wv, &sp, 1, LUCID_BF16));
        CHECK("cast_shadows on the CPU leaves the shadow empty", !s.buf && !s.valid,
              "buf %p valid %d", (void *)s.buf, s.valid);
        lucid_conv_wshadow_release(&s);
    }
    /* the module's CPU forward / backward (shadow passed) = the entry points */
    {
        int64_t xs[4] = {2, 8, 5, 3}, ys[4] = {2, 16, 5, 3};
        lucid_tensor *y = NULL, *dx = NULL;
        if (lucid_tensor_empty(ctx, CPU, LUCID_F32, 4, xs, &x) ||
            lucid_rand_uniform(ctx, x, 11, 0, -1, 1) ||
            lucid_tensor_empty(ctx, CPU, LUCID_F32, 4, ys, &dy) ||
            lucid_rand_uniform(ctx, dy, 11, 1000, -1, 1) ||
            lucid_tensor_empty(ctx, CPU, LUCID_F32, 4, ys, &y2) ||
            lucid_tensor_empty(ctx, CPU, LUCID_F32, 4, xs, &dx2) ||
            lucid_module_forward1(ctx, c1, x, &y) || lucid_module_backward1(ctx, c1, x, dy, &dx)) {
            TEST_FAIL("wshadow entry: module forward/backward", "%s", lucid_ctx_error(ctx));
            goto done;
        }
        w = c1->params[0]->data;
        lucid_conv2d_params p = {1, 1, 0, 0, 1, 1, 1};
        if (lucid_nn_conv2d_forward(ctx, x, y2, w, c1->params[1]->data, &p) ||
            lucid_nn_conv2d_backward_input(ctx, x, dy, dx2, w, &p, 0.0)) {
            TEST_FAIL("wshadow entry: direct calls", "%s", lucid_ctx_error(ctx));
            goto done;
        }
        CHECK("CPU Conv2d module forward = lucid_nn_conv2d_forward (bitwise)",
              memcmp(lucid_tensor_data(y), lucid_tensor_data(y2), lucid_tensor_nbytes(y)) == 0,
              "differs");
        CHECK("CPU Conv2d module backward = lucid_nn_conv2d_backward_input (bitwise)",
              memcmp(lucid_tensor_data(dx), lucid_tensor_data(dx2), lucid_tensor_nbytes(dx)) == 0,
              "differs");
        lucid_conv_wshadow s;
        lucid_conv_wshadow_init(&s);
        CHECK_STATUS("forward_shadow on the CPU", ctx,
                     lucid_nn_conv2d_forward_shadow(ctx, x, y2, w, NULL, &p, &s));
        CHECK_STATUS("backward_input_shadow on the CPU", ctx,
                     lucid_nn_conv2d_backward_input_shadow(ctx, x, dy, dx2, w, &p, 0.0, &s));
        CHECK("the CPU kernels leave the shadow alone", !s.buf && !s.valid, "buf %p valid %d",
              (void *)s.buf, s.valid);
        lucid_conv_wshadow_release(&s);
    }
done:
    lucid_tensor_release(x);
    lucid_tensor_release(dy);
    lucid_tensor_release(y2);
    lucid_tensor_release(dx2);
    lucid_module_release(c1);
    lucid_module_release(c3);
    lucid_module_release(act);
    lucid_module_release(late);
    lucid_param_set_release(set);
    lucid_param_set_release(set2);
}

/* The flipped copy's record (lucid_conv_wshadow_mark_flip / _flip_off):
 * its offset only while the shadow is fresh for the same weight view AND
 * that view has the shape the copy was made for. */
static void test_flip(lucid_ctx *ctx) {
    int64_t a[4] = {16, 8, 3, 3}, b[4] = {8, 16, 3, 3};
    lucid_tensor *w = NULL, *v = NULL;
    lucid_conv_wshadow s;
    lucid_conv_wshadow_init(&s);
    if (lucid_tensor_zeros(ctx, CPU, LUCID_F32, 4, a, &w) ||
        lucid_tensor_view(ctx, w, 4, b, &v) || lucid_storage_create(ctx, CPU, 64, 0, &s.buf)) {
        TEST_FAIL("wshadow flip: setup", "%s", lucid_ctx_error(ctx));
        goto done;
    }
    lucid_conv_wshadow_mark(&s, w, LUCID_BF16, 5);
    CHECK("wshadow flip: none recorded: 0", lucid_conv_wshadow_flip_off(&s, w, LUCID_BF16, 5) == 0,
          "offset %lld", (long long)lucid_conv_wshadow_flip_off(&s, w, LUCID_BF16, 5));
    lucid_conv_wshadow_mark_flip(&s, w, 1152);
    CHECK("wshadow flip: fresh, same shape: the offset",
          lucid_conv_wshadow_flip_off(&s, w, LUCID_BF16, 5) == 1152, "offset %lld",
          (long long)lucid_conv_wshadow_flip_off(&s, w, LUCID_BF16, 5));
    CHECK("wshadow flip: the view [8,16,3,3] of the same data is fresh",
          lucid_conv_wshadow_fresh(&s, v, LUCID_BF16, 5), "stale");
    CHECK("wshadow flip: ... but not its flipped copy (another shape): 0",
          lucid_conv_wshadow_flip_off(&s, v, LUCID_BF16, 5) == 0, "offset %lld",
          (long long)lucid_conv_wshadow_flip_off(&s, v, LUCID_BF16, 5));
    CHECK("wshadow flip: another epoch: 0", lucid_conv_wshadow_flip_off(&s, w, LUCID_BF16, 6) == 0,
          "offset %lld", (long long)lucid_conv_wshadow_flip_off(&s, w, LUCID_BF16, 6));
    CHECK("wshadow flip: another dtype: 0", lucid_conv_wshadow_flip_off(&s, w, LUCID_F16, 5) == 0,
          "offset %lld", (long long)lucid_conv_wshadow_flip_off(&s, w, LUCID_F16, 5));
    lucid_conv_wshadow_mark(&s, w, LUCID_BF16, 5); /* a re-mark alone keeps the record */
    CHECK("wshadow flip: kept by a re-mark", lucid_conv_wshadow_flip_off(&s, w, LUCID_BF16, 5) == 1152,
          "offset %lld", (long long)lucid_conv_wshadow_flip_off(&s, w, LUCID_BF16, 5));
    lucid_conv_wshadow_invalidate(&s); /* what a plain per-call cast does first */
    lucid_conv_wshadow_mark(&s, w, LUCID_BF16, 5);
    CHECK("wshadow flip: invalidate forgets it", lucid_conv_wshadow_flip_off(&s, w, LUCID_BF16, 5) == 0,
          "offset %lld", (long long)lucid_conv_wshadow_flip_off(&s, w, LUCID_BF16, 5));
done:
    lucid_conv_wshadow_release(&s);
    lucid_tensor_release(v);
    lucid_tensor_release(w);
}

/* The stride-phase backward-data's transposed copy (lucid_conv_wshadow_
 * mark_phase / _phase_off / _want_phase): its offset under the flipped
 * copy's rule, independent of the flipped record; want_phase sticky. */
static void test_phase(lucid_ctx *ctx) {
    int64_t a[4] = {16, 8, 3, 3}, b[4] = {8, 16, 3, 3};
    lucid_tensor *w = NULL, *v = NULL;
    lucid_conv_wshadow s;
    lucid_conv_wshadow_init(&s);
    if (lucid_tensor_zeros(ctx, CPU, LUCID_F32, 4, a, &w) ||
        lucid_tensor_view(ctx, w, 4, b, &v) || lucid_storage_create(ctx, CPU, 64, 0, &s.buf)) {
        TEST_FAIL("wshadow phase: setup", "%s", lucid_ctx_error(ctx));
        goto done;
    }
    CHECK("wshadow phase: init: not wanted", s.phase_want == 0, "want %d", s.phase_want);
    lucid_conv_wshadow_mark(&s, w, LUCID_BF16, 5);
    CHECK("wshadow phase: none recorded: 0", lucid_conv_wshadow_phase_off(&s, w, LUCID_BF16, 5) == 0,
          "offset %lld", (long long)lucid_conv_wshadow_phase_off(&s, w, LUCID_BF16, 5));
    lucid_conv_wshadow_mark_flip(&s, w, 1152);
    CHECK("wshadow phase: the flipped record is not the phase record",
          lucid_conv_wshadow_phase_off(&s, w, LUCID_BF16, 5) == 0, "offset %lld",
          (long long)lucid_conv_wshadow_phase_off(&s, w, LUCID_BF16, 5));
    lucid_conv_wshadow_mark_phase(&s, w, 2304);
    CHECK("wshadow phase: fresh, same shape: the offset",
          lucid_conv_wshadow_phase_off(&s, w, LUCID_BF16, 5) == 2304, "offset %lld",
          (long long)lucid_conv_wshadow_phase_off(&s, w, LUCID_BF16, 5));
    CHECK("wshadow phase: ... and the flipped one's still",
          lucid_conv_wshadow_flip_off(&s, w, LUCID_BF16, 5) == 1152, "offset %lld",
          (long long)lucid_conv_wshadow_flip_off(&s, w, LUCID_BF16, 5));
    CHECK("wshadow phase: a view of another shape: 0",
          lucid_conv_wshadow_phase_off(&s, v, LUCID_BF16, 5) == 0, "offset %lld",
          (long long)lucid_conv_wshadow_phase_off(&s, v, LUCID_BF16, 5));
    CHECK("wshadow phase: another epoch: 0", lucid_conv_wshadow_phase_off(&s, w, LUCID_BF16, 6) == 0,
          "offset %lld", (long long)lucid_conv_wshadow_phase_off(&s, w, LUCID_BF16, 6));
    CHECK("wshadow phase: another dtype: 0", lucid_conv_wshadow_phase_off(&s, w, LUCID_F16, 5) == 0,
          "offset %lld", (long long)lucid_conv_wshadow_phase_off(&s, w, LUCID_F16, 5));
    lucid_conv_wshadow_want_phase(&s);
    CHECK("wshadow phase: want_phase sets it", s.phase_want == 1, "want %d", s.phase_want);
    lucid_conv_wshadow_invalidate(&s);
    lucid_conv_wshadow_mark(&s, w, LUCID_BF16, 5);
    CHECK("wshadow phase: invalidate forgets the copy",
          lucid_conv_wshadow_phase_off(&s, w, LUCID_BF16, 5) == 0, "offset %lld",
          (long long)lucid_conv_wshadow_phase_off(&s, w, LUCID_BF16, 5));
    CHECK("wshadow phase: ... but keeps want_phase", s.phase_want == 1, "want %d", s.phase_want);
    lucid_conv_wshadow_mark_phase(&s, w, 0); /* no offset: nothing recorded */
    CHECK("wshadow phase: offset 0 records nothing",
          lucid_conv_wshadow_phase_off(&s, w, LUCID_BF16, 5) == 0, "offset %lld",
          (long long)lucid_conv_wshadow_phase_off(&s, w, LUCID_BF16, 5));
    lucid_conv_wshadow_release(&s);
    lucid_conv_wshadow_init(&s);
    CHECK("wshadow phase: init clears want_phase", s.phase_want == 0, "want %d", s.phase_want);
done:
    lucid_conv_wshadow_release(&s);
    lucid_tensor_release(v);
    lucid_tensor_release(w);
}

int main(void) {
    lucid_ctx *ctx = test_cpu_ctx();
    if (!ctx) return 1;
    test_freshness(ctx);
    test_flip(ctx);
    test_phase(ctx);
    test_entry_points(ctx);
    lucid_ctx_release(ctx);
    return test_exit();
}
