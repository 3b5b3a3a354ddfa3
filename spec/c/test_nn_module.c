/*
 * test_nn_module.c — nn modules and the flat parameter set on the CPU.
 *
 * Parameter set: layout (16-element alignment, no overlap, gradient views
 * at the same offsets), names, counts, optimizer groups, i64 counters,
 * deterministic PyTorch-default init, frozen parameters, version counters;
 * a second set aliasing the first's flat buffers (lucid_param_set_alias).
 * Modules: persistent outputs (same data pointer for the same shape, a new
 * buffer on a shape change), BN running statistics through the module, and
 * float64 finite-difference checks of composite blocks assembled from the
 * modules the way lua/ will (Conv = Conv2d+BN+SiLU; a C2f-like DAG with
 * Split/Add/Concat and gradient accumulation where an output feeds several
 * layers; attention = MatMul+Softmax+MatMul; DFL).  Step h = 1e-6; bound:
 * max|analytic - numeric| / max(max|numeric|, 1e-3) < 1e-6.
 */
#define TEST_NN_SEED 0x2545f4914f6cdd1dull
#include "test_nn_util.h"

// ----------------------------------------------------------------------------
// parameter set layout, names, groups, init

static lucid_status build_small(lucid_param_set *set, lucid_module **m) {
    /* model.0 = Conv(3,16,3,2) (conv + bn), model.1.cv = Conv2d(16,8,1,bias),
     * model.23.dfl = DFL(16) */
    LUCID_TRY(lucid_module_conv2d_create(ctx, set, "model.0.conv", 3, 16, 3, 2, -1,
                                         1, 1, 0, &m[0]));
    LUCID_TRY(lucid_module_batchnorm2d_create(ctx, set, "model.0.bn", 16, 1e-3,
                                              0.03, &m[1]));
    LUCID_TRY(lucid_module_conv2d_create(ctx, set, "model.1.cv", 16, 8, 1, 1, -1, 1,
                                         1, 1, &m[2]));
    LUCID_TRY(lucid_module_dfl_create(ctx, set, "model.23.dfl", 16, &m[3]));
    return LUCID_OK;
}

static void test_param_set(void) {
    lucid_param_set *set = NULL;
    lucid_module *m[4] = {0};
    lucid_status st = lucid_param_set_create(ctx, &set);
    if (!st) st = build_small(set, m);
    CHECK_STATUS("param set: modules declare their parameters", ctx, st);
    if (st) return;

    lucid_tensor *x = mk4(LUCID_F32, 1, 3, 8, 8), *y = NULL;
    fill_rand(x, -1, 1);
    st = lucid_module_forward1(ctx, m[0], x, &y);
    CHECK("param set: forward before materialize is ERR_STATE", st == LUCID_ERR_STATE,
          "status %s", lucid_status_name(st));

    static const char *names[] = {
        "model.0.conv.weight", "model.0.bn.weight", "model.0.bn.bias",
        "model.0.bn.running_mean", "model.0.bn.running_var",
        "model.0.bn.num_batches_tracked", "model.1.cv.weight", "model.1.cv.bias",
        "model.23.dfl.conv.weight"};
    int nok = lucid_param_set_count(set) == 9;
    for (int i = 0; nok && i < 9; i++)
        nok = strcmp(lucid_param_set_get(set, i)->name, names[i]) == 0;
    CHECK("param set: reference names in declaration order", nok, "count %d",
          lucid_param_set_count(set));

    lucid_ctx_rng_set(ctx, 7, 0);
    st = lucid_param_set_materialize(ctx, set, CPU, LUCID_F32);
    CHECK_STATUS("param set: materialize", ctx, st);
    if (st) return;

    /* layout */
    int aligned = 1, disjoint = 1, gradsame = 1;
    int64_t end = 0;
    const float *base = lucid_tensor_data(lucid_param_set_flat_params(set));
    const float *gbase = lucid_tensor_data(lucid_param_set_flat_grads(set));
    for (int i = 0; i < lucid_param_set_count(set); i++) {
        lucid_param *p = lucid_param_set_get(set, i);
        if (p->kind != LUCID_PARAM_KIND_PARAM) continue;
        aligned &= p->offset % LUCID_PARAM_ALIGN == 0;
        disjoint &= p->offset >= end;
        end = p->offset + p->numel;
        gradsame &= (const float *)lucid_tensor_data(p->data) == base + p->offset &&
                    (const float *)lucid_tensor_data(p->grad) == gbase + p->offset;
    }
    CHECK("param set: offsets 16-aligned, disjoint, in order", aligned && disjoint,
          "aligned %d disjoint %d", aligned, disjoint);
    CHECK("param set: data/grad views at the same offsets of the flat buffers",
          gradsame, "view mismatch");
    CHECK("param set: flat buffers padded to a multiple of 16",
          numel(lucid_param_set_flat_params(set)) % 16 == 0 &&
              numel(lucid_param_set_flat_params(set)) >= end,
          "len %lld", (long long)numel(lucid_param_set_flat_params(set)));
    int64_t np = lucid_param_set_numel(set, LUCID_PARAM_KIND_PARAM, 0);
    int64_t nt = lucid_param_set_numel(set, LUCID_PARAM_KIND_PARAM, 1);
    int64_t nb = lucid_param_set_numel(set, LUCID_PARAM_KIND_BUFFER, 0);
    CHECK("param set: counts (Conv(3,16,3,2) = 464 as in the reference table; "
          "DFL 16 frozen)",
          np == 432 + 32 + 136 + 16 && nt == np - 16 && nb == 33,
          "params %lld trainable %lld buffers %lld", (long long)np, (long long)nt,
          (long long)nb);
    lucid_param *nbt = lucid_param_set_find(set, "model.0.bn.num_batches_tracked");
    lucid_param *rv = lucid_param_set_find(set, "model.0.bn.running_var");
    CHECK("param set: buffers (i64 counter, 0-d; f32 running stats; no grad)",
          nbt && nbt->dtype == LUCID_I64 && nbt->data->dtype == LUCID_I64 &&
              nbt->ndim == 0 && !nbt->grad && rv && rv->data->dtype == LUCID_F32 &&
              !rv->grad && !rv->trainable,
          "nbt %p", (void *)nbt);
    CHECK("param set: optimizer groups (conv weight 0, bn weight 1, biases 2)",
          lucid_param_set_find(set, "model.0.conv.weight")->group == 0 &&
              lucid_param_set_find(set, "model.0.bn.weight")->group == 1 &&
              lucid_param_set_find(set, "model.0.bn.bias")->group == 2 &&
              lucid_param_set_find(set, "model.1.cv.bias")->group == 2 &&
              rv->group == LUCID_PARAM_GROUP_NONE,
          "wrong group");

    /* init */
    lucid_param *w0 = lucid_param_set_find(set, "model.0.conv.weight");
    lucid_param *b1 = lucid_param_set_find(set, "model.1.cv.bias");
    double bw = 1 / sqrt(27.0), bb = 1 / sqrt(16.0), mx = 0, mean = 0;
    int inb = 1;
    for (int64_t i = 0; i < w0->numel; i++) {
        double v = get(w0->data, i);
        inb &= fabs(v) <= bw;
        mx = fmax(mx, fabs(v));
        mean += v / (double)w0->numel;
    }
    for (int64_t i = 0; i < b1->numel; i++) inb &= fabs(get(b1->data, i)) <= bb;
    CHECK("init: conv weight/bias U(+-1/sqrt(fan_in)) (kaiming_uniform a=sqrt 5)",
          inb && mx > 0.9 * bw && fabs(mean) < 0.05, "in bounds %d max %g mean %g",
          inb, mx, mean);
    lucid_param *bnw = lucid_param_set_find(set, "model.0.bn.weight");
    lucid_param *bnb = lucid_param_set_find(set, "model.0.bn.bias");
    lucid_param *rm = lucid_param_set_find(set, "model.0.bn.running_mean");
    lucid_param *dfl = lucid_param_set_find(set, "model.23.dfl.conv.weight");
    int bnok = 1;
    for (int i = 0; i < 16; i++)
        bnok &= get(bnw->data, i) == 1 && get(bnb->data, i) == 0 &&
                get(rm->data, i) == 0 && get(rv->data, i) == 1 &&
                get(dfl->data, i) == i;
    CHECK("init: BN weight 1 bias 0, running 0/1, DFL 0..15 frozen",
          bnok && get(nbt->data, 0) == 0 && !dfl->trainable, "bad init");

    /* determinism: the same structure and seed give identical bytes */
    lucid_param_set *set2 = NULL;
    lucid_module *m2[4] = {0};
    lucid_param_set_create(ctx, &set2);
    build_small(set2, m2);
    lucid_ctx_rng_set(ctx, 7, 0);
    lucid_param_set_materialize(ctx, set2, CPU, LUCID_F32);
    lucid_tensor *f1 = lucid_param_set_flat_params(set), *f2 = lucid_param_set_flat_params(set2);
    CHECK("init: deterministic given the seed (bitwise)",
          memcmp(lucid_tensor_data(f1), lucid_tensor_data(f2), lucid_tensor_nbytes(f1)) == 0,
          "flat buffers differ");
    lucid_param_set_reset(ctx, set2); /* continues the generator: new draws */
    CHECK("init: reset redraws from the advanced generator",
          memcmp(lucid_tensor_data(f1), lucid_tensor_data(f2), lucid_tensor_nbytes(f1)) != 0,
          "same bytes");

    /* phase errors */
    lucid_param *dummy = NULL;
    int64_t one = 1;
    st = lucid_param_set_declare(ctx, set, "late", LUCID_PARAM_KIND_PARAM, LUCID_F32,
                                 1, &one, 1, 0, NULL, &dummy);
    CHECK("param set: declare after materialize is ERR_STATE", st == LUCID_ERR_STATE,
          "status %s", lucid_status_name(st));
    st = lucid_param_set_materialize(ctx, set, CPU, LUCID_F32);
    CHECK("param set: a second materialize is ERR_STATE (never re-flatten)",
          st == LUCID_ERR_STATE, "status %s", lucid_status_name(st));
    lucid_param_set *set3 = NULL;
    lucid_param_set_create(ctx, &set3);
    lucid_param_set_declare(ctx, set3, "a", LUCID_PARAM_KIND_PARAM, LUCID_F32, 1, &one,
                            1, 0, NULL, NULL);
    st = lucid_param_set_declare(ctx, set3, "a", LUCID_PARAM_KIND_PARAM, LUCID_F32, 1,
                                 &one, 1, 0, NULL, NULL);
    CHECK("param set: duplicate name is ERR_ARG naming it",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "'a'"), "status %s '%s'",
          lucid_status_name(st), lucid_ctx_error(ctx));

    /* describe */
    char buf[256];
    lucid_module_describe(m[0], buf, sizeof buf);
    CHECK("describe: Conv2d like PyTorch",
          strcmp(buf, "Conv2d(3, 16, kernel_size=(3, 3), stride=(2, 2), "
                      "padding=(1, 1), bias=False)") == 0,
          "got '%s'", buf);
    lucid_module_describe(m[1], buf, sizeof buf);
    CHECK("describe: BatchNorm2d like PyTorch",
          strcmp(buf, "BatchNorm2d(16, eps=0.001, momentum=0.03, affine=True, "
                      "track_running_stats=True)") == 0,
          "got '%s'", buf);

    /* ---- modules on this set: persistent outputs, BN buffers, frozen */
    lucid_tensor *h = NULL, *z = NULL;
    st = lucid_module_forward1(ctx, m[0], x, &y);
    if (!st) st = lucid_module_forward1(ctx, m[1], y, &h);
    CHECK_STATUS("modules: Conv2d -> BatchNorm2d forward", ctx, st);
    CHECK("modules: conv output [1,16,4,4]",
          y && y->shape[0] == 1 && y->shape[1] == 16 && y->shape[2] == 4 &&
              y->shape[3] == 4,
          "bad shape");
    void *yd = lucid_tensor_data(y), *hd = lucid_tensor_data(h);
    lucid_tensor *y2 = NULL, *h2 = NULL;
    fill_rand(x, -1, 1);
    lucid_module_forward1(ctx, m[0], x, &y2);
    lucid_module_forward1(ctx, m[1], y2, &h2);
    CHECK("modules: outputs reused for the same shape (same tensor, same data)",
          y2 == y && h2 == h && lucid_tensor_data(y2) == yd &&
              lucid_tensor_data(h2) == hd,
          "reallocated");
    CHECK("modules: BN running stats live in the flat buffer, 2 batches counted",
          get(nbt->data, 0) == 2 && get(rm->data, 0) != 0, "nbt %g rm0 %g",
          get(nbt->data, 0), get(rm->data, 0));

    /* backward: frozen conv weight gets nothing, BN params do */
    lucid_tensor *dy = mk4(LUCID_F32, 1, 16, 4, 4), *dh = NULL, *dx = NULL;
    fill_rand(dy, -1, 1);
    uint64_t v0 = w0->version, sv0 = lucid_param_set_version(set);
    lucid_param_set_trainable(ctx, set, w0, 0);
    CHECK("frozen: trainable change bumps the parameter and set versions",
          w0->version == v0 + 1 && lucid_param_set_version(set) == sv0 + 1,
          "versions %llu %llu", (unsigned long long)w0->version,
          (unsigned long long)lucid_param_set_version(set));
    lucid_param_set_zero_grad(ctx, set);
    lucid_module_set_need_grad_input(m[0], 0);
    st = lucid_module_backward1(ctx, m[1], y, dy, &dh);
    if (!st) st = lucid_module_backward1(ctx, m[0], x, dh, &dx);
    CHECK_STATUS("frozen: backward runs", ctx, st);
    double gw = 0, gb = 0;
    for (int64_t i = 0; i < w0->numel; i++) gw += fabs(get(w0->grad, i));
    for (int64_t i = 0; i < 16; i++) gb += fabs(get(bnw->grad, i));
    CHECK("frozen: a frozen parameter receives no gradient; others do",
          gw == 0 && gb > 0, "|g conv| %g |g bn| %g", gw, gb);
    CHECK("modules: need_grad_input 0 skips grad_input", dx == NULL &&
              lucid_module_grad_input(m[0], 0) == NULL, "dx %p", (void *)dx);
    lucid_param_set_trainable(ctx, set, w0, 1);
    /* parameter gradients accumulate across backward calls */
    st = lucid_module_backward1(ctx, m[0], x, dh, &dx);
    double g1 = get(w0->grad, 3);
    if (!st) st = lucid_module_backward1(ctx, m[0], x, dh, &dx);
    CHECK("modules: parameter gradients accumulate (+=) across backward calls",
          st == LUCID_OK && g1 != 0 && fabs(get(w0->grad, 3) - 2 * g1) <= 1e-6 * fabs(g1),
          "g1 %g after 2: %g", g1, get(w0->grad, 3));

    /* shape change reallocates; back to the old shape keeps working */
    lucid_tensor *x2 = mk4(LUCID_F32, 2, 3, 6, 6);
    fill_rand(x2, -1, 1);
    lucid_module_forward1(ctx, m[0], x2, &z);
    CHECK("modules: a new input shape gives a new output buffer [2,16,3,3]",
          z && z->shape[0] == 2 && z->shape[2] == 3 && lucid_module_output(m[0], 0) == z,
          "bad realloc");
    lucid_module_set_need_grad_input(m[0], 1);
    lucid_tensor *dz = mk4(LUCID_F32, 2, 16, 3, 3), *dx2 = NULL, *dx3 = NULL;
    fill_rand(dz, -1, 1);
    lucid_module_backward1(ctx, m[0], x2, dz, &dx2);
    lucid_module_backward1(ctx, m[0], x2, dz, &dx3);
    CHECK("modules: grad_input reused for the same shape",
          dx2 && dx2 == dx3 && dx2->shape[0] == 2, "dx2 %p dx3 %p", (void *)dx2,
          (void *)dx3);
    st = lucid_module_forward1(ctx, m[1], x2, &z);
    CHECK("modules: wrong channel count is ERR_ARG naming the module",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "model.0.bn"),
          "status %s '%s'", lucid_status_name(st), lucid_ctx_error(ctx));
    uint64_t mv = m[1]->version;
    lucid_module_set_training(m[1], 0);
    double before = get(nbt->data, 0);
    lucid_module_forward1(ctx, m[1], dy, &h); /* y was freed by the shape change */
    CHECK("modules: eval mode bumps the module version and leaves BN buffers",
          m[1]->version == mv + 1 && get(nbt->data, 0) == before, "nbt %g",
          get(nbt->data, 0));

    lucid_tensor *all[] = {x, dy, x2, dz};
    for (int i = 0; i < 4; i++) lucid_tensor_release(all[i]);
    for (int i = 0; i < 4; i++) {
        lucid_module_release(m[i]);
        lucid_module_release(m2[i]);
    }
    lucid_param_set_release(set);
    lucid_param_set_release(set2);
    lucid_param_set_release(set3);
}

// ----------------------------------------------------------------------------
// composite gradient checks (f64 parameter set)

/* Conv block: Conv2d(bias=False) -> BatchNorm2d (train) -> SiLU */
typedef struct convblk {
    lucid_module *conv, *bn, *act;
    lucid_tensor *x, *r;
} convblk;

static lucid_status convblk_fwd(convblk *b, const lucid_tensor *x, lucid_tensor **y) {
    lucid_tensor *a, *c;
    LUCID_TRY(lucid_module_forward1(ctx, b->conv, x, &a));
    LUCID_TRY(lucid_module_forward1(ctx, b->bn, a, &c));
    return lucid_module_forward1(ctx, b->act, c, y);
}
static lucid_status convblk_bwd(convblk *b, const lucid_tensor *x,
                                const lucid_tensor *dy, lucid_tensor **dx) {
    lucid_tensor *d1, *d2;
    LUCID_TRY(lucid_module_backward1(ctx, b->act, lucid_module_output(b->bn, 0), dy, &d1));
    LUCID_TRY(lucid_module_backward1(ctx, b->bn, lucid_module_output(b->conv, 0), d1, &d2));
    return lucid_module_backward1(ctx, b->conv, x, d2, dx);
}

/* C2f-like DAG: a = cv1(x) [1x1, 4->4]; (y0, y1) = chunk(a, 2);
 * y2 = m(y1) [Conv block 3x3 2->2]; y3 = y1 + y2; c = cat(y0, y1, y3);
 * out = maxpool3s1p1(upsample2(cv2(c) [1x1 6->3])) */
typedef struct dag {
    lucid_param_set *set;
    convblk cv1, m, cv2;
    lucid_module *split, *add, *cat, *up, *pool;
    lucid_tensor *x, *r;
} dag;

static lucid_status dag_fwd(dag *d, lucid_tensor **out) {
    lucid_tensor *a, *y2, *y3, *c, *o, *u;
    LUCID_TRY(convblk_fwd(&d->cv1, d->x, &a));
    LUCID_TRY(lucid_module_forward1(ctx, d->split, a, NULL));
    lucid_tensor *y0 = lucid_module_output(d->split, 0), *y1 = lucid_module_output(d->split, 1);
    LUCID_TRY(convblk_fwd(&d->m, y1, &y2));
    const lucid_tensor *ai[2] = {y1, y2};
    LUCID_TRY(lucid_module_forward(ctx, d->add, 2, ai));
    y3 = lucid_module_output(d->add, 0);
    const lucid_tensor *ci[3] = {y0, y1, y3};
    LUCID_TRY(lucid_module_forward(ctx, d->cat, 3, ci));
    c = lucid_module_output(d->cat, 0);
    LUCID_TRY(convblk_fwd(&d->cv2, c, &o));
    LUCID_TRY(lucid_module_forward1(ctx, d->up, o, &u));
    return lucid_module_forward1(ctx, d->pool, u, out);
}

static double dag_loss(void *vs) {
    dag *d = vs;
    lucid_tensor *out;
    if (dag_fwd(d, &out) != LUCID_OK) return NAN;
    return dot(out, d->r);
}

static lucid_status dag_bwd(dag *d, lucid_tensor **dx) {
    lucid_tensor *du, *do_, *dc, *dtmp;
    LUCID_TRY(lucid_module_backward1(ctx, d->pool, lucid_module_output(d->up, 0), d->r, &du));
    LUCID_TRY(lucid_module_backward1(ctx, d->up, lucid_module_output(d->cv2.act, 0), du, &do_));
    LUCID_TRY(convblk_bwd(&d->cv2, lucid_module_output(d->cat, 0), do_, &dc));
    lucid_tensor *y0 = lucid_module_output(d->split, 0), *y1 = lucid_module_output(d->split, 1);
    const lucid_tensor *ci[3] = {y0, y1, lucid_module_output(d->add, 0)};
    const lucid_tensor *go[1] = {dc};
    LUCID_TRY(lucid_module_backward(ctx, d->cat, 3, ci, 1, go));
    lucid_tensor *dy0 = lucid_module_grad_input(d->cat, 0);
    lucid_tensor *dy1 = lucid_module_grad_input(d->cat, 1); /* accumulate here */
    lucid_tensor *dy3 = lucid_module_grad_input(d->cat, 2);
    const lucid_tensor *ai[2] = {y1, lucid_module_output(d->m.act, 0)};
    const lucid_tensor *ago[1] = {dy3};
    LUCID_TRY(lucid_module_backward(ctx, d->add, 2, ai, 1, ago));
    LUCID_TRY(lucid_nn_channel_copy(ctx, dy1, 0, lucid_module_grad_input(d->add, 0), 0,
                                    dy1->shape[1], 1.0));
    LUCID_TRY(convblk_bwd(&d->m, y1, lucid_module_grad_input(d->add, 1), &dtmp));
    LUCID_TRY(lucid_nn_channel_copy(ctx, dy1, 0, dtmp, 0, dy1->shape[1], 1.0));
    const lucid_tensor *si[1] = {lucid_module_output(d->cv1.act, 0)};
    const lucid_tensor *sgo[2] = {dy0, dy1};
    LUCID_TRY(lucid_module_backward(ctx, d->split, 1, si, 2, sgo));
    return convblk_bwd(&d->cv1, d->x, lucid_module_grad_input(d->split, 0), dx);
}

static lucid_status mk_convblk(lucid_param_set *set, const char *pfx, int c1, int c2,
                               int k, convblk *b) {
    char n1[64], n2[64];
    snprintf(n1, sizeof n1, "%s.conv", pfx);
    snprintf(n2, sizeof n2, "%s.bn", pfx);
    LUCID_TRY(lucid_module_conv2d_create(ctx, set, n1, c1, c2, k, 1, -1, 1, 1, 0, &b->conv));
    LUCID_TRY(lucid_module_batchnorm2d_create(ctx, set, n2, c2, 1e-3, 0.03, &b->bn));
    return lucid_module_silu_create(ctx, &b->act);
}

static void free_convblk(convblk *b) {
    lucid_module_release(b->conv);
    lucid_module_release(b->bn);
    lucid_module_release(b->act);
}

static void test_dag(void) {
    dag d;
    memset(&d, 0, sizeof d);
    lucid_status st = lucid_param_set_create(ctx, &d.set);
    if (!st) st = mk_convblk(d.set, "model.2.cv1", 4, 4, 1, &d.cv1);
    if (!st) st = mk_convblk(d.set, "model.2.m.0", 2, 2, 3, &d.m);
    if (!st) st = mk_convblk(d.set, "model.2.cv2", 6, 3, 1, &d.cv2);
    if (!st) st = lucid_module_split_create(ctx, 2, NULL, &d.split);
    if (!st) st = lucid_module_add_create(ctx, &d.add);
    if (!st) st = lucid_module_concat_create(ctx, 3, &d.cat);
    if (!st) st = lucid_module_upsample_create(ctx, 2, &d.up);
    if (!st) st = lucid_module_maxpool2d_create(ctx, 3, 1, 1, &d.pool);
    if (!st) st = lucid_param_set_materialize(ctx, d.set, CPU, LUCID_F64);
    CHECK_STATUS("dag: build a C2f-like block on an f64 parameter set", ctx, st);
    if (st) return;
    /* random BN affine parameters so their gradients are generic */
    for (int i = 0; i < lucid_param_set_count(d.set); i++) {
        lucid_param *p = lucid_param_set_get(d.set, i);
        if (strstr(p->name, "bn.weight")) fill_rand(p->data, 0.5, 1.5);
        if (strstr(p->name, "bn.bias")) fill_rand(p->data, -0.5, 0.5);
    }
    d.x = mk4(LUCID_F64, 2, 4, 3, 4);
    d.r = mk4(LUCID_F64, 2, 3, 6, 8);
    fill_rand(d.x, -2, 2);
    fill_rand(d.r, -1, 1);
    lucid_tensor *dx = NULL;
    st = dag_loss(&d) == dag_loss(&d) ? LUCID_OK : LUCID_ERR_ARG;
    if (!st) st = lucid_param_set_zero_grad(ctx, d.set);
    if (!st) st = dag_bwd(&d, &dx);
    CHECK_STATUS("dag: forward and backward (gradient accumulated where y1 feeds "
                 "three layers)", ctx, st);
    if (st) return;
    lucid_tensor *dxc = NULL;
    lucid_tensor_clone(ctx, dx, &dxc);
    lucid_tensor *gflat = NULL;
    lucid_tensor_clone(ctx, lucid_param_set_flat_grads(d.set), &gflat);
    check_grad("dag: gradcheck input (Conv/BN/SiLU/Split/Add/Concat/Upsample/MaxPool)",
               dag_loss, &d, d.x, dxc);
    check_grad("dag: gradcheck every parameter through the flat buffers", dag_loss,
               &d, lucid_param_set_flat_params(d.set), gflat);
    lucid_tensor_release(dxc);
    lucid_tensor_release(gflat);
    lucid_tensor_release(d.x);
    lucid_tensor_release(d.r);
    free_convblk(&d.cv1);
    free_convblk(&d.m);
    free_convblk(&d.cv2);
    lucid_module *ms[] = {d.split, d.add, d.cat, d.up, d.pool};
    for (int i = 0; i < 5; i++) lucid_module_release(ms[i]);
    lucid_param_set_release(d.set);
}

/* attention core: out = v @ softmax(scale * q^T k)^T  (Ultralytics Attention) */
typedef struct attn {
    lucid_module *qk, *sm, *av;
    lucid_tensor *q, *k, *v, *r;
} attn;

static double attn_loss(void *vs) {
    attn *a = vs;
    const lucid_tensor *i1[2] = {a->q, a->k};
    if (lucid_module_forward(ctx, a->qk, 2, i1)) return NAN;
    if (lucid_module_forward1(ctx, a->sm, lucid_module_output(a->qk, 0), NULL)) return NAN;
    const lucid_tensor *i2[2] = {a->v, lucid_module_output(a->sm, 0)};
    if (lucid_module_forward(ctx, a->av, 2, i2)) return NAN;
    return dot(lucid_module_output(a->av, 0), a->r);
}

static void test_attention(void) {
    attn a;
    memset(&a, 0, sizeof a);
    double scale = 1 / sqrt(3.0);
    lucid_status st = lucid_module_matmul_create(ctx, 1, 0, scale, &a.qk);
    if (!st) st = lucid_module_softmax_create(ctx, &a.sm);
    if (!st) st = lucid_module_matmul_create(ctx, 0, 1, 1.0, &a.av);
    /* B=2, heads=2, key_dim=3, head_dim=4, N=5 */
    int64_t qs[4] = {2, 2, 3, 5}, vs[4] = {2, 2, 4, 5}, os[4] = {2, 2, 4, 5};
    a.q = mk(LUCID_F64, 4, qs); a.k = mk(LUCID_F64, 4, qs);
    a.v = mk(LUCID_F64, 4, vs); a.r = mk(LUCID_F64, 4, os);
    fill_rand(a.q, -1, 1); fill_rand(a.k, -1, 1);
    fill_rand(a.v, -1, 1); fill_rand(a.r, -1, 1);
    if (!st && isnan(attn_loss(&a))) st = lucid_ctx_last_status(ctx);
    const lucid_tensor *i2[2] = {a.v, lucid_module_output(a.sm, 0)};
    const lucid_tensor *g2[1] = {a.r};
    if (!st) st = lucid_module_backward(ctx, a.av, 2, i2, 1, g2);
    if (!st) st = lucid_module_backward1(ctx, a.sm, lucid_module_output(a.qk, 0),
                                         lucid_module_grad_input(a.av, 1), NULL);
    const lucid_tensor *i1[2] = {a.q, a.k};
    const lucid_tensor *g1[1] = {lucid_module_grad_input(a.sm, 0)};
    if (!st) st = lucid_module_backward(ctx, a.qk, 2, i1, 1, g1);
    CHECK_STATUS("attention: MatMul(q^T k * scale) -> Softmax -> MatMul(v, attn^T)", ctx, st);
    if (st) return;
    lucid_tensor *dq = NULL, *dk = NULL, *dv = NULL;
    lucid_tensor_clone(ctx, lucid_module_grad_input(a.qk, 0), &dq);
    lucid_tensor_clone(ctx, lucid_module_grad_input(a.qk, 1), &dk);
    lucid_tensor_clone(ctx, lucid_module_grad_input(a.av, 0), &dv);
    check_grad("attention: gradcheck q", attn_loss, &a, a.q, dq);
    check_grad("attention: gradcheck k", attn_loss, &a, a.k, dk);
    check_grad("attention: gradcheck v", attn_loss, &a, a.v, dv);
    lucid_tensor *all[] = {a.q, a.k, a.v, a.r, dq, dk, dv};
    for (int i = 0; i < 7; i++) lucid_tensor_release(all[i]);
    lucid_module_release(a.qk);
    lucid_module_release(a.sm);
    lucid_module_release(a.av);
}

/* DFL module and an explicit split with sizes and an unused output */
typedef struct dflst {
    lucid_module *dfl, *split;
    lucid_tensor *x, *r;
} dflst;

static double dfl_loss(void *vs) {
    dflst *s = vs;
    if (lucid_module_forward1(ctx, s->split, s->x, NULL)) return NAN;
    if (lucid_module_forward1(ctx, s->dfl, lucid_module_output(s->split, 1), NULL))
        return NAN;
    return dot(lucid_module_output(s->dfl, 0), s->r);
}

static void test_dfl_split(void) {
    dflst s;
    memset(&s, 0, sizeof s);
    lucid_param_set *set = NULL;
    int64_t sizes[2] = {3, 64};
    lucid_status st = lucid_param_set_create(ctx, &set);
    if (!st) st = lucid_module_dfl_create(ctx, set, "model.23.dfl", 16, &s.dfl);
    if (!st) st = lucid_module_split_create(ctx, 2, sizes, &s.split);
    if (!st) st = lucid_param_set_materialize(ctx, set, CPU, LUCID_F64);
    int64_t xs[3] = {2, 67, 6}, rs[3] = {2, 4, 6};
    s.x = mk(LUCID_F64, 3, xs);
    s.r = mk(LUCID_F64, 3, rs);
    fill_rand(s.x, -2, 2);
    fill_rand(s.r, -1, 1);
    if (!st && isnan(dfl_loss(&s))) st = lucid_ctx_last_status(ctx);
    lucid_tensor *dd = NULL;
    if (!st) st = lucid_module_backward1(ctx, s.dfl, lucid_module_output(s.split, 1),
                                         s.r, &dd);
    const lucid_tensor *si[1] = {s.x}, *sg[2] = {NULL, dd};
    if (!st) st = lucid_module_backward(ctx, s.split, 1, si, 2, sg);
    CHECK_STATUS("dfl + split(sizes [3,64], first output unused)", ctx, st);
    if (st) return;
    lucid_tensor *dx = NULL;
    lucid_tensor_clone(ctx, lucid_module_grad_input(s.split, 0), &dx);
    check_grad("dfl + split: gradcheck input (unused split output: zero gradient)",
               dfl_loss, &s, s.x, dx);
    char buf[128];
    lucid_module_describe(s.split, buf, sizeof buf);
    CHECK("describe: Split", strcmp(buf, "Split(sizes=[3, 64], dim=1)") == 0, "got '%s'",
          buf);
    lucid_tensor_release(dx);
    lucid_tensor_release(s.x);
    lucid_tensor_release(s.r);
    lucid_module_release(s.dfl);
    lucid_module_release(s.split);
    lucid_param_set_release(set);
}

/* Parameter shapes whose size overflows, and flat buffers whose summed
 * length would: named ERR_ARG ("tensor size overflows"), never a wrapped
 * tiny allocation; sizes that fit declare (negative control). */
static void test_param_size_overflow(void) {
    lucid_param_set *s = NULL;
    lucid_param_set_create(ctx, &s);
    int64_t big[2] = {(int64_t)1 << 31, (int64_t)1 << 31}; /* 2^62 elements: 2^65 f64 bytes */
    lucid_status st = lucid_param_set_declare(ctx, s, "w", LUCID_PARAM_KIND_PARAM, LUCID_F32, 2,
                                              big, 1, 0, NULL, NULL);
    CHECK("param size: a shape past int64 bytes is refused at declare",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "tensor size overflows") &&
              strstr(lucid_ctx_error(ctx), "'w'"),
          "status %s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
    /* nine entries of 2^59 elements: each fits, their flat sum (> 2^62) not */
    int64_t part[1] = {(int64_t)1 << 59};
    int ok = 1;
    for (int i = 0; i < 9 && ok; i++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        ok = lucid_param_set_declare(ctx, s, name, LUCID_PARAM_KIND_PARAM, LUCID_F32, 1, part, 1,
                                     0, NULL, NULL) == LUCID_OK;
    }
    CHECK("param size: entries that fit declare (control)", ok, "%s", lucid_ctx_error(ctx));
    st = lucid_param_set_materialize(ctx, s, CPU, LUCID_F32);
    CHECK("param size: a flat length past 2^62 is refused at materialize",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "tensor size overflows"),
          "status %s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
    lucid_param_set_release(s);
}

/* lucid_param_set_alias: a second set declared like the first becomes views
 * of its flat buffers (the same addresses, offsets and trainable flags; a
 * write through one is read through the other; a backward of the twin module
 * accumulates into the first set's gradients; nothing initialised), and
 * refuses itself, a source not materialized, an alias twice, and
 * declarations that differ (named). */
static void test_param_alias(void) {
    lucid_param_set *a = NULL, *b = NULL, *c = NULL;
    lucid_module *ma[4] = {0}, *mb[4] = {0}, *mc[1] = {0};
    lucid_status st = lucid_param_set_create(ctx, &a);
    if (!st) st = build_small(a, ma);
    if (!st) st = lucid_param_set_create(ctx, &b);
    if (!st) st = build_small(b, mb);
    CHECK_STATUS("param alias: two sets declared alike", ctx, st);
    if (st) return;
    st = lucid_param_set_alias(ctx, b, a);
    CHECK("param alias: a source not materialized is ERR_STATE",
          st == LUCID_ERR_STATE && strstr(lucid_ctx_error(ctx), "not materialized"), "status %s: %s",
          lucid_status_name(st), lucid_ctx_error(ctx));
    lucid_ctx_rng_set(ctx, 7, 0);
    st = lucid_param_set_materialize(ctx, a, CPU, LUCID_F32);
    if (!st) lucid_param_set_get(a, 6)->trainable = 0; /* model.1.cv.weight frozen */
    if (!st) st = lucid_param_set_alias(ctx, b, a);
    CHECK_STATUS("param alias: materialize, then alias", ctx, st);
    if (st) return;
    int same = lucid_param_set_count(b) == lucid_param_set_count(a);
    for (int i = 0; same && i < lucid_param_set_count(a); i++) {
        const lucid_param *p = lucid_param_set_get(b, i), *q = lucid_param_set_get(a, i);
        same = p->offset == q->offset && lucid_tensor_data(p->data) == lucid_tensor_data(q->data) &&
               (q->grad ? p->grad && lucid_tensor_data(p->grad) == lucid_tensor_data(q->grad)
                        : !p->grad) &&
               p->trainable == q->trainable;
    }
    CHECK("param alias: every entry at the source's address, offset and trainable flag", same,
          "entry mismatch");
    CHECK("param alias: the same flat buffers",
          lucid_tensor_data(lucid_param_set_flat_params(b)) ==
                  lucid_tensor_data(lucid_param_set_flat_params(a)) &&
              lucid_tensor_data(lucid_param_set_flat_grads(b)) ==
                  lucid_tensor_data(lucid_param_set_flat_grads(a)),
          "flat buffers differ");
    /* the twin conv's backward accumulates into a's gradient */
    lucid_tensor *x = mk4(LUCID_F32, 2, 3, 8, 8), *y = NULL, *gy = NULL;
    fill_rand(x, -1, 1);
    st = lucid_module_forward1(ctx, ma[0], x, &y);
    if (!st) {
        gy = mk4(LUCID_F32, 2, 16, 4, 4);
        fill_rand(gy, -1, 1);
        lucid_tensor *dx = NULL;
        st = lucid_module_backward1(ctx, ma[0], x, gy, &dx);
    }
    lucid_tensor *g1 = NULL;
    if (!st) st = lucid_tensor_clone(ctx, lucid_param_set_get(a, 0)->grad, &g1);
    lucid_tensor *yb = NULL;
    if (!st) st = lucid_module_forward1(ctx, mb[0], x, &yb);
    lucid_tensor *dxb = NULL;
    if (!st) st = lucid_module_backward1(ctx, mb[0], x, gy, &dxb);
    CHECK_STATUS("param alias: forward and backward through both trees", ctx, st);
    if (!st) {
        CHECK("param alias: the twin's output is its own buffer, equal to the first's",
              yb != y && lucid_tensor_data(yb) != lucid_tensor_data(y) && max_abs_diff(y, yb) == 0.0,
              "diff %g", max_abs_diff(y, yb));
        const float *g = lucid_tensor_data(lucid_param_set_get(a, 0)->grad);
        const float *h = lucid_tensor_data(g1);
        int doubled = 1;
        for (int64_t i = 0; i < numel(g1); i++) doubled &= g[i] == h[i] + h[i];
        CHECK("param alias: the twin's backward accumulates into the first set's gradient",
              doubled, "not 2x");
        float *w = (float *)lucid_tensor_data(lucid_param_set_get(a, 1)->data);
        w[0] = 42.0f;
        CHECK("param alias: a write through one set is read through the other",
              ((const float *)lucid_tensor_data(lucid_param_set_get(b, 1)->data))[0] == 42.0f,
              "not shared");
    }
    st = lucid_param_set_alias(ctx, b, a);
    CHECK("param alias: twice is ERR_STATE", st == LUCID_ERR_STATE, "status %s",
          lucid_status_name(st));
    st = lucid_param_set_reset(ctx, b);
    CHECK("param alias: reset of an alias is ERR_STATE (its values are the source's)",
          st == LUCID_ERR_STATE && strstr(lucid_ctx_error(ctx), "reset of an alias"), "status %s: %s",
          lucid_status_name(st), lucid_ctx_error(ctx));
    st = lucid_param_set_alias(ctx, a, a);
    CHECK("param alias: itself is ERR_ARG", st == LUCID_ERR_ARG, "status %s",
          lucid_status_name(st));
    /* declarations that differ: one conv of other channels */
    st = lucid_param_set_create(ctx, &c);
    if (!st) st = lucid_module_conv2d_create(ctx, c, "model.0.conv", 3, 8, 3, 2, -1, 1, 1, 0, &mc[0]);
    if (!st) st = lucid_param_set_alias(ctx, c, a);
    CHECK("param alias: another count of entries is ERR_ARG, both counts named",
          st == LUCID_ERR_ARG && strstr(lucid_ctx_error(ctx), "1 entries, the source has 9"),
          "status %s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
    lucid_param_set *d = NULL;
    lucid_module *md[4] = {0};
    st = lucid_param_set_create(ctx, &d);
    if (!st) st = lucid_module_conv2d_create(ctx, d, "model.0.conv", 3, 8, 3, 2, -1, 1, 1, 0, &md[0]);
    if (!st) st = lucid_module_batchnorm2d_create(ctx, d, "model.0.bn", 8, 1e-3, 0.03, &md[1]);
    if (!st) st = lucid_module_conv2d_create(ctx, d, "model.1.cv", 8, 8, 1, 1, -1, 1, 1, 1, &md[2]);
    if (!st) st = lucid_module_dfl_create(ctx, d, "model.23.dfl", 16, &md[3]);
    if (!st) st = lucid_param_set_alias(ctx, d, a);
    CHECK("param alias: another shape is ERR_ARG naming the first entry that differs",
          st == LUCID_ERR_ARG &&
              strstr(lucid_ctx_error(ctx), "entry 0 ('model.0.conv.weight')") &&
              strstr(lucid_ctx_error(ctx), "in shape"),
          "status %s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
    /* the source released first: the alias keeps the flat buffers alive */
    lucid_tensor *w1 = NULL;
    st = lucid_tensor_clone(ctx, lucid_param_set_get(b, 0)->data, &w1);
    for (int i = 0; i < 4; i++) {
        lucid_module_release(ma[i]);
        ma[i] = NULL;
    }
    lucid_param_set_release(a);
    a = NULL;
    lucid_tensor *yb2 = NULL, *dxb2 = NULL;
    if (!st) st = lucid_module_forward1(ctx, mb[0], x, &yb2);
    if (!st) st = lucid_module_backward1(ctx, mb[0], x, gy, &dxb2);
    CHECK("param alias: the source set released first, the alias still computes on the same values",
          st == LUCID_OK && max_abs_diff(w1, lucid_param_set_get(b, 0)->data) == 0.0,
          "status %s: %s", lucid_status_name(st), lucid_ctx_error(ctx));
    lucid_tensor_release(w1);
    lucid_tensor_release(x);
    lucid_tensor_release(gy);
    lucid_tensor_release(g1);
    for (int i = 0; i < 4; i++) {
        lucid_module_release(ma[i]);
        lucid_module_release(mb[i]);
        lucid_module_release(md[i]);
    }
    lucid_module_release(mc[0]);
    lucid_param_set_release(a);
    lucid_param_set_release(b);
    lucid_param_set_release(c);
    lucid_param_set_release(d);
}

int main(void) {
    lucid_ctx_options o = lucid_ctx_options_default();
    char err[256];
    if (lucid_ctx_create(&o, &ctx, err, sizeof err) != LUCID_OK) {
        printf("not ok context: %s\n", err);
        return 1;
    }
    test_param_set();
    test_dag();
    test_attention();
    test_dfl_split();
    test_param_size_overflow();
    test_param_alias();
    lucid_ctx_release(ctx);
    return test_exit();
}
