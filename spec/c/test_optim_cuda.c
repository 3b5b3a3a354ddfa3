/*
 * test_optim_cuda.c — every CUDA update kernel against the CPU reference on
 * random data: SGD, AdamW (bitwise), MuSGD (f32 and bf16 Newton–Schulz,
 * tolerance: GEMM summation order differs), gradient norm + clip for
 * f32/bf16/f16 (bitwise), value clip, unscale/found_inf/skip/scale update,
 * EMA. Prints skip lines and exits 0 without a usable GPU.
 *
 * The fused step (lucid_optim_step_fused on CUDA) runs against the
 * separate calls on the CPU over 7 steps: clip with coef < 1, the fp16
 * scaler with unscale, an Inf gradient (scaler skip, Inf norm, NaN grads),
 * value clip, a 1e20 gradient (Inf norm without the scaler), plain steps;
 * EMA of params (frozen segments included) and of a BN-buffer layout;
 * frozen params untouched. SGD/AdamW bitwise; MuSGD within the tolerance
 * of its plain test, on a layout whose Muon matrices of different shapes
 * (one transposed, one with shape scale sqrt(15)) share one padded bucket,
 * with the bf16 (tensor-core) and the f32 GEMM paths; the Muon direction
 * alone (sgd_scale 0) is compared too. Finally the fused step is recorded
 * as a CUDA graph (upload + step) and three replays must equal three eager
 * steps bitwise.
 */
#include "test.h"
#include "internal.h"
#include "train/optim.h"
#include "train/optim_backend.h"
#include "train/loss_backend.h"

/* Offsets: most multiples of 4 (16-byte accesses on CUDA), big.bias not;
 * odd.bias and long.bias start aligned and end inside a group of 4 (the
 * elementwise tail of a vectorised chunk). */
#define NSEG 11
static const lucid_param_segment segs[NSEG] = {
    {"conv.weight", 0, 4608, LUCID_KIND_WEIGHT, 4, {32, 16, 3, 3}, 1, 0},
    {"bn.weight", 4608, 32, LUCID_KIND_NORM, 1, {32}, 1, 0},
    {"bn.bias", 4640, 32, LUCID_KIND_BIAS, 1, {32}, 1, 0},
    {"wide.weight", 4672, 19200, LUCID_KIND_WEIGHT, 2, {64, 300}, 1, 0},
    {"tall.weight", 23872, 6000, LUCID_KIND_WEIGHT, 2, {300, 20}, 1, 1},
    {"cv3.bias", 29872, 300, LUCID_KIND_BIAS, 1, {300}, 1, 1},
    {"bn.running_var", 30172, 32, LUCID_KIND_NORM, 1, {32}, 0, 0},
    {"dfl.weight", 30210, 16, LUCID_KIND_WEIGHT, 4, {1, 16, 1, 1}, 0, 0},
    {"big.bias", 30226, 5000, LUCID_KIND_BIAS, 1, {5000}, 1, 0},
    {"odd.bias", 35228, 51, LUCID_KIND_BIAS, 1, {51}, 1, 0},
    {"long.bias", 35280, 3075, LUCID_KIND_NORM, 1, {3075}, 1, 0},
};
#define TOTAL 38355

static uint64_t rng = 12345;
static float randn(void) {
    double u[2];
    for (int k = 0; k < 2; k++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        u[k] = (double)(rng >> 11) * (1.0 / 9007199254740992.0);
    }
    return (float)(sqrt(-2.0 * log(u[0] + 1e-12)) * cos(6.283185307179586 * u[1]));
}

static lucid_device CPU = {LUCID_CPU, 0}, GPU = {LUCID_CUDA, 0};
static lucid_ctx *ctx;

static lucid_tensor *host(lucid_dtype dt, int64_t n) {
    lucid_tensor *t = NULL;
    lucid_tensor_empty(ctx, CPU, dt, 1, &n, &t);
    memset(lucid_tensor_data(t), 0, lucid_tensor_nbytes(t));
    return t;
}
static lucid_tensor *to_gpu(const lucid_tensor *h) {
    lucid_tensor *t = NULL;
    if (lucid_tensor_to(ctx, h, GPU, h->dtype, &t) != LUCID_OK)
        printf("# to_gpu: %s\n", lucid_ctx_error(ctx));
    return t;
}
static lucid_tensor *to_cpu(const lucid_tensor *d) {
    lucid_tensor *t = NULL;
    lucid_tensor_to(ctx, d, CPU, d->dtype, &t);
    return t;
}
/* max |a-b| / max|ref - base| (base may be NULL: absolute scale 1). */
static double cmp(const lucid_tensor *cpu, const lucid_tensor *gpu, const lucid_tensor *base,
                  int *bitwise) {
    lucid_tensor *g = to_cpu(gpu);
    int64_t n = lucid_tensor_numel(cpu);
    /* bitwise equal, except that any NaN equals any NaN: the payload and
     * sign of a generated NaN differ between x86 (0xffc00000) and the GPU
     * (0x7fffffff), and IEEE 754 leaves them unspecified */
    size_t es = lucid_dtype_size(cpu->dtype);
    const char *pa = lucid_tensor_data(cpu), *pb = lucid_tensor_data(g);
    *bitwise = 1;
    double e = 0, s = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        double a = lucid_cpu_get(cpu, i), b = lucid_cpu_get(g, i);
        if (!(isnan(a) && isnan(b)) && memcmp(pa + i * es, pb + i * es, es) != 0) *bitwise = 0;
        double r = base ? a - lucid_cpu_get(base, i) : 1.0;
        s = fmax(s, fabs(r));
        if (isnan(a) != isnan(b)) e = INFINITY;
        else if (!isnan(a)) e = fmax(e, fabs(a - b));
    }
    lucid_tensor_release(g);
    return e / s;
}

typedef struct {
    lucid_param_layout *l;
    lucid_param_block *pb;
} side;

static side make_side(lucid_device dev, const lucid_param_values *v) {
    side s = {0};
    if (lucid_param_layout_create(ctx, dev, TOTAL, segs, NSEG, &s.l) != LUCID_OK ||
        lucid_param_block_create(ctx, dev, v, &s.pb) != LUCID_OK)
        printf("# setup on %s: %s\n", dev.type ? "cuda" : "cpu", lucid_ctx_error(ctx));
    return s;
}
static void free_side(side *s) {
    lucid_param_block_release(s->pb);
    lucid_param_layout_release(s->l);
}

static void test_optim(lucid_optim_kind kind, int ns_bf16, double tol, const char *name) {
    lucid_param_values v;
    lucid_param_values_default(&v);
    v.in.ns_bf16 = ns_bf16;
    side c = make_side(CPU, &v), g = make_side(GPU, &v);
    lucid_optim *oc = NULL, *og = NULL;
    lucid_optim_create(ctx, kind, c.l, &oc);
    if (lucid_optim_create(ctx, kind, g.l, &og) != LUCID_OK) {
        TEST_FAIL(name, "%s", lucid_ctx_error(ctx));
        return;
    }
    lucid_tensor *P = host(LUCID_F32, TOTAL), *G = host(LUCID_F32, TOTAL);
    for (int i = 0; i < TOTAL; i++) ((float *)lucid_tensor_data(P))[i] = 0.3f * randn();
    lucid_tensor *P0 = NULL;
    lucid_tensor_clone(ctx, P, &P0);
    lucid_tensor *Pg = to_gpu(P);
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < TOTAL; i++) ((float *)lucid_tensor_data(G))[i] = randn();
        lucid_tensor *Gg = to_gpu(G);
        for (int s = 0; s < LUCID_PARAM_SLOTS; s++) {
            v.in.lr[s] = 0.01f + 0.002f * (float)(step + s);
            v.in.momentum[s] = kind == LUCID_OPTIM_ADAMW ? 0.9f : 0.8f + 0.05f * (float)step;
        }
        lucid_param_block_update(c.pb, &v.in);
        lucid_param_block_update(g.pb, &v.in);
        lucid_param_block_upload(ctx, c.pb);
        lucid_param_block_upload(ctx, g.pb);
        lucid_optim_step(ctx, oc, c.pb, P, G);
        if (lucid_optim_step(ctx, og, g.pb, Pg, Gg) != LUCID_OK)
            printf("# step: %s\n", lucid_ctx_error(ctx));
        lucid_tensor_release(Gg);
    }
    int bw;
    double e = cmp(P, Pg, P0, &bw);
    if (tol == 0) CHECK(name, bw, "not bitwise equal: max rel diff %.3g", e);
    else CHECK(name, e < tol, "max diff relative to the update %.3g (tol %.1g)", e, tol);
    char nm[128];
    double es = cmp(lucid_optim_state(oc, 0), lucid_optim_state(og, 0), NULL, &bw);
    snprintf(nm, sizeof nm, "%s: state '%s'", name, lucid_optim_state_name(oc, 0));
    if (tol == 0) CHECK(nm, bw, "not bitwise equal: %.3g", es);
    else CHECK(nm, es < tol, "%.3g", es);
    lucid_tensor_release(P); lucid_tensor_release(G); lucid_tensor_release(P0);
    lucid_tensor_release(Pg);
    lucid_optim_release(oc); lucid_optim_release(og);
    free_side(&c); free_side(&g);
}

static void test_norm(lucid_dtype dt, int special) {
    char name[128];
    snprintf(name, sizeof name, "clip_norm %s%s: norm and clipped grads bitwise CPU == CUDA",
             lucid_dtype_name(dt), special == 1 ? " (|g|=1e20)" : special == 2 ? " (NaN)" : "");
    lucid_param_values v;
    lucid_param_values_default(&v);
    side c = make_side(CPU, &v), g = make_side(GPU, &v);
    lucid_tensor *G = host(dt, TOTAL);
    for (int i = 0; i < TOTAL; i++) {
        float x = randn();
        if (special == 1 && i == 100) x = 1e20f;
        if (special == 2 && i == 200) x = NAN;
        if (dt == LUCID_F32) ((float *)lucid_tensor_data(G))[i] = x;
        else ((uint16_t *)lucid_tensor_data(G))[i] =
                 dt == LUCID_BF16 ? lucid_f32_to_bf16(x) : lucid_f32_to_f16(x);
    }
    lucid_tensor *Gg = to_gpu(G);
    lucid_grad_clip_norm(ctx, c.l, c.pb, G, 1);
    lucid_grad_clip_norm(ctx, g.l, g.pb, Gg, 1);
    lucid_param_values vc, vg;
    lucid_param_block_read(ctx, c.pb, &vc);
    lucid_param_block_read(ctx, g.pb, &vg);
    int bw;
    cmp(G, Gg, NULL, &bw);
    int norm_same = memcmp(&vc.st.grad_norm, &vg.st.grad_norm, 4) == 0 ||
                    (isnan(vc.st.grad_norm) && isnan(vg.st.grad_norm));
    CHECK(name, bw && norm_same &&
          vc.st.nonfinite_norms == vg.st.nonfinite_norms,
          "norm cpu %.9g cuda %.9g, grads bitwise %d", vc.st.grad_norm, vg.st.grad_norm, bw);
    lucid_tensor_release(G); lucid_tensor_release(Gg);
    free_side(&c); free_side(&g);
}

static void test_value_scaler_ema(void) {
    lucid_param_values v;
    lucid_param_values_default(&v);
    v.in.clip_value = 0.7f;
    v.in.scaler_enabled = 1;
    v.in.growth_interval = 2;
    side c = make_side(CPU, &v), g = make_side(GPU, &v);
    lucid_tensor *G = host(LUCID_F32, TOTAL);
    float *gp = lucid_tensor_data(G);
    for (int i = 0; i < TOTAL; i++) gp[i] = randn() * 65536.0f;
    gp[17] = INFINITY;
    lucid_tensor *Gg = to_gpu(G);
    lucid_grad_unscale(ctx, c.l, c.pb, G);
    lucid_grad_unscale(ctx, g.l, g.pb, Gg);
    lucid_grad_clip_value(ctx, c.l, c.pb, G);
    lucid_grad_clip_value(ctx, g.l, g.pb, Gg);
    int bw;
    cmp(G, Gg, NULL, &bw);
    CHECK("unscale + clip_value bitwise CPU == CUDA", bw, "differs");
    lucid_param_values vc, vg;
    lucid_param_block_read(ctx, g.pb, &vg);
    CHECK("unscale: found_inf set on the device", vg.st.found_inf == 1, "%d", vg.st.found_inf);
    lucid_optim *og = NULL;
    lucid_optim_create(ctx, LUCID_OPTIM_SGD, g.l, &og);
    lucid_tensor *P = host(LUCID_F32, TOTAL);
    for (int i = 0; i < TOTAL; i++) ((float *)lucid_tensor_data(P))[i] = randn();
    lucid_tensor *Pg = to_gpu(P);
    lucid_optim_step(ctx, og, g.pb, Pg, Gg);
    cmp(P, Pg, NULL, &bw);
    CHECK("CUDA optimizer skips the step when found_inf is set", bw, "params changed");
    for (int k = 0; k < 3; k++) {
        lucid_scaler_update(ctx, c.pb);
        lucid_scaler_update(ctx, g.pb);
    }
    lucid_param_block_read(ctx, c.pb, &vc);
    lucid_param_block_read(ctx, g.pb, &vg);
    CHECK("scaler update (backoff then growth) CPU == CUDA",
          vc.st.loss_scale == vg.st.loss_scale && vc.st.growth_tracker == vg.st.growth_tracker &&
          vg.st.loss_scale == 65536.0f && vg.st.found_inf == 0 && vg.st.skipped_steps == 1,
          "cpu %g/%d cuda %g/%d", vc.st.loss_scale, vc.st.growth_tracker, vg.st.loss_scale,
          vg.st.growth_tracker);
    /* EMA over all segments */
    lucid_ema *ec = NULL, *eg = NULL;
    lucid_ema_create(ctx, c.l, P, &ec);
    lucid_ema_create(ctx, g.l, Pg, &eg);
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i < TOTAL; i++) ((float *)lucid_tensor_data(P))[i] += 0.1f * randn();
        lucid_tensor *Pk = to_gpu(P);
        lucid_ema_update(ctx, ec, c.pb, P);
        lucid_ema_update(ctx, eg, g.pb, Pk);
        lucid_tensor_release(Pk);
    }
    double e = cmp(lucid_ema_tensor(ec), lucid_ema_tensor(eg), NULL, &bw);
    CHECK("EMA 4 updates CPU == CUDA", bw || e < 1e-7, "max diff %.3g", e);
    lucid_tensor *x = host(LUCID_F32, 3);
    ((float *)lucid_tensor_data(x))[1] = 0.75f;
    lucid_tensor *xg = to_gpu(x);
    lucid_scaler_scale(ctx, c.pb, x);
    lucid_scaler_scale(ctx, g.pb, xg);
    cmp(x, xg, NULL, &bw);
    CHECK("scaler_scale CPU == CUDA", bw, "differs");
    lucid_tensor_release(x); lucid_tensor_release(xg);
    lucid_ema_release(ec); lucid_ema_release(eg);
    lucid_optim_release(og);
    lucid_tensor_release(P); lucid_tensor_release(Pg);
    lucid_tensor_release(G); lucid_tensor_release(Gg);
    free_side(&c); free_side(&g);
}

/* ------------------------------------------------ fused step vs CPU */

/* The segments above plus a depthwise 16x1x3x3 (9 x 16 after the
 * transpose... 16 x 9 view, m = 9) and a 1x64 head conv: with wide
 * (64x300), tall (300x20, transposed, scale sqrt(15)) and conv (32x144)
 * the plan puts Muon matrices of different shapes in one bucket. */
#define FNSEG (NSEG + 2)
#define FTOTAL (TOTAL + 208)
static lucid_param_segment fsegs[FNSEG];
static void make_fsegs(void) {
    for (int i = 0; i < NSEG; i++) fsegs[i] = segs[i];
    fsegs[NSEG] = (lucid_param_segment){"dw.weight", TOTAL, 144, LUCID_KIND_WEIGHT, 4,
                                        {16, 1, 3, 3}, 1, 0};
    fsegs[NSEG + 1] = (lucid_param_segment){"cls.weight", TOTAL + 144, 64, LUCID_KIND_WEIGHT, 4,
                                            {1, 64, 1, 1}, 1, 1};
}
/* BN buffers for the aux EMA (two chunks in the second one, a gap). */
#define BTOTAL 3128
static const lucid_param_segment bsegs[2] = {
    {"bn.running_mean", 0, 100, LUCID_KIND_WEIGHT, 1, {100}, 0, 0},
    {"bn.running_var", 128, 3000, LUCID_KIND_WEIGHT, 1, {3000}, 0, 0},
};

typedef struct fused_rig {
    lucid_device dev;
    lucid_param_layout *l, *bl;
    lucid_param_block *pb, *pbx; /* pbx: the separate route's aux EMA block */
    lucid_optim *o;
    lucid_ema *e, *ea;
    lucid_tensor *P, *G, *B;
} fused_rig;

/* Copy host floats into t (any device). */
static void put(lucid_tensor *t, const float *x, int64_t n) {
    lucid_tensor *h = host(LUCID_F32, n);
    memcpy(lucid_tensor_data(h), x, (size_t)n * sizeof(float));
    if (lucid_copy(ctx, t, h) != LUCID_OK) printf("# put: %s\n", lucid_ctx_error(ctx));
    lucid_tensor_release(h);
}

static int rig_make(fused_rig *r, lucid_device dev, lucid_optim_kind kind,
                    const lucid_param_values *v, const float *p0, const float *b0) {
    memset(r, 0, sizeof *r);
    r->dev = dev;
    int64_t np = FTOTAL, nb = BTOTAL;
    if (lucid_param_layout_create(ctx, dev, FTOTAL, fsegs, FNSEG, &r->l) ||
        lucid_param_layout_create(ctx, dev, BTOTAL, bsegs, 2, &r->bl) ||
        lucid_param_block_create(ctx, dev, v, &r->pb) ||
        lucid_param_block_create(ctx, dev, v, &r->pbx) ||
        lucid_optim_create(ctx, kind, r->l, &r->o) ||
        lucid_tensor_zeros(ctx, dev, LUCID_F32, 1, &np, &r->P) ||
        lucid_tensor_zeros(ctx, dev, LUCID_F32, 1, &np, &r->G) ||
        lucid_tensor_zeros(ctx, dev, LUCID_F32, 1, &nb, &r->B))
        return 0;
    put(r->P, p0, FTOTAL);
    put(r->B, b0, BTOTAL);
    return lucid_ema_create(ctx, r->l, r->P, &r->e) == LUCID_OK &&
           lucid_ema_create(ctx, r->bl, r->B, &r->ea) == LUCID_OK;
}

static void rig_free(fused_rig *r) {
    lucid_ema_release(r->e), lucid_ema_release(r->ea);
    lucid_optim_release(r->o);
    lucid_tensor_release(r->P), lucid_tensor_release(r->G), lucid_tensor_release(r->B);
    lucid_param_block_release(r->pb), lucid_param_block_release(r->pbx);
    lucid_param_layout_release(r->l), lucid_param_layout_release(r->bl);
}

static void rig_inputs(fused_rig *r, const lucid_param_values *v) {
    lucid_param_block_update(r->pb, &v->in);
    lucid_param_block_update(r->pbx, &v->in);
    lucid_param_block_upload(ctx, r->pb);
    lucid_param_block_upload(ctx, r->pbx);
}

static lucid_status rig_separate(fused_rig *r, int flags) {
    lucid_status s = LUCID_OK;
    if (flags & LUCID_STEP_UNSCALE) s = lucid_grad_unscale(ctx, r->l, r->pb, r->G);
    if (!s && (flags & LUCID_STEP_CLIP_NORM)) s = lucid_grad_clip_norm(ctx, r->l, r->pb, r->G, 1);
    if (!s && (flags & LUCID_STEP_CLIP_VALUE)) s = lucid_grad_clip_value(ctx, r->l, r->pb, r->G);
    if (!s) s = lucid_optim_step(ctx, r->o, r->pb, r->P, r->G);
    if (!s && (flags & LUCID_STEP_SCALER_UPDATE)) s = lucid_scaler_update(ctx, r->pb);
    if (!s) s = lucid_ema_update(ctx, r->e, r->pb, r->P);
    if (!s) s = lucid_ema_update(ctx, r->ea, r->pbx, r->B);
    return s;
}

static lucid_status rig_fused(fused_rig *r, int flags) {
    lucid_optim_step_opts o = {flags, r->e, r->ea, r->B};
    return lucid_optim_step_fused(ctx, r->o, r->pb, r->P, r->G, &o);
}

typedef struct fused_scen {
    int flags;
    float max_norm, clip_value;
    int scaler;
    float gscale;
    int special; /* 0 none, 1 +Inf at one element, 2 1e20 at one element */
} fused_scen;

#define KEEP LUCID_STEP_KEEP_GRADS
#define SCU LUCID_STEP_SCALER_UPDATE
static const fused_scen fscen[] = {
    {LUCID_STEP_CLIP_NORM | SCU | KEEP, 1.0f, 0.0f, 0, 1.0f, 0},  /* coef < 1 */
    {LUCID_STEP_UNSCALE | LUCID_STEP_CLIP_NORM | SCU | KEEP, 10.0f, 0.0f, 1, 65536.0f, 0},
    {LUCID_STEP_UNSCALE | LUCID_STEP_CLIP_NORM | SCU | KEEP, 10.0f, 0.0f, 1, 65536.0f, 1},
    {LUCID_STEP_UNSCALE | LUCID_STEP_CLIP_NORM | LUCID_STEP_CLIP_VALUE | SCU, 2.0f, 0.05f, 1,
     32768.0f, 0},
    {LUCID_STEP_CLIP_NORM | SCU | KEEP, 10.0f, 0.0f, 0, 1.0f, 2}, /* Inf norm, no scaler */
    {LUCID_STEP_CLIP_VALUE | KEEP, 10.0f, 0.1f, 0, 1.0f, 0},
    {0, 10.0f, 0.0f, 0, 1.0f, 0},
};
#define NFSCEN ((int)(sizeof fscen / sizeof *fscen))

static int trainable_f(int64_t i) {
    for (int s = 0; s < FNSEG; s++)
        if (i >= fsegs[s].offset && i < fsegs[s].offset + fsegs[s].numel)
            return fsegs[s].trainable;
    return 0;
}

/* tol 0: bitwise (SGD, AdamW); else MuSGD's tolerance relative to the
 * parameter change. */
static void test_fused(lucid_optim_kind kind, int ns_bf16, double tol, const char *name) {
    lucid_param_values v;
    lucid_param_values_default(&v);
    v.in.ns_bf16 = ns_bf16;
    v.in.growth_interval = 2;
    v.in.ema_tau = 3.0;
    float *p0 = malloc(FTOTAL * sizeof(float)), *g = malloc(FTOTAL * sizeof(float));
    float *b = malloc(BTOTAL * sizeof(float));
    for (int i = 0; i < FTOTAL; i++) p0[i] = 0.3f * randn();
    for (int i = 0; i < BTOTAL; i++) b[i] = randn();
    fused_rig C, D;
    if (!rig_make(&C, CPU, kind, &v, p0, b) || !rig_make(&D, GPU, kind, &v, p0, b)) {
        TEST_FAIL(name, "setup: %s", lucid_ctx_error(ctx));
        free(p0), free(g), free(b);
        return;
    }
    lucid_tensor *P0 = host(LUCID_F32, FTOTAL);
    memcpy(lucid_tensor_data(P0), p0, FTOTAL * sizeof(float));
    int ok = 1, grads_ok = 1, untouched_ok = 1;
    for (int k = 0; k < NFSCEN && ok; k++) {
        const fused_scen *sc = &fscen[k];
        for (int s = 0; s < LUCID_PARAM_SLOTS; s++) {
            v.in.lr[s] = 0.01f + 0.002f * (float)(k + s);
            v.in.momentum[s] = kind == LUCID_OPTIM_ADAMW ? 0.9f : 0.8f + 0.02f * (float)k;
        }
        v.in.clip_max_norm = sc->max_norm;
        v.in.clip_value = sc->clip_value;
        v.in.scaler_enabled = sc->scaler;
        rig_inputs(&C, &v);
        rig_inputs(&D, &v);
        for (int i = 0; i < FTOTAL; i++) g[i] = randn() * sc->gscale;
        if (sc->special == 1) g[100] = INFINITY;
        if (sc->special == 2) g[5000] = 1e20f;
        for (int i = 0; i < BTOTAL; i++) b[i] += 0.1f * randn();
        put(C.G, g, FTOTAL), put(D.G, g, FTOTAL);
        put(C.B, b, BTOTAL), put(D.B, b, BTOTAL);
        if (rig_separate(&C, sc->flags) != LUCID_OK || rig_fused(&D, sc->flags) != LUCID_OK) {
            TEST_FAIL(name, "step %d: %s", k, lucid_ctx_error(ctx));
            ok = 0;
            break;
        }
        /* gradients: processed and bitwise equal (KEEP_GRADS, MuSGD),
         * else unchanged; frozen ones never touched */
        lucid_tensor *dg = to_cpu(D.G);
        const float *dgp = lucid_tensor_data(dg), *cgp = lucid_tensor_data(C.G);
        int keep = (sc->flags & KEEP) || kind == LUCID_OPTIM_MUSGD;
        for (int64_t i = 0; i < FTOTAL; i++) {
            const float *want = keep ? &cgp[i] : &g[i];
            if (memcmp(&dgp[i], want, 4) != 0 && !(isnan(dgp[i]) && isnan(*want))) grads_ok = 0;
            if (!trainable_f(i) && memcmp(&dgp[i], &g[i], 4) != 0) untouched_ok = 0;
        }
        lucid_tensor_release(dg);
    }
    if (ok) {
        int bw;
        char nm[192];
        double e = cmp(C.P, D.P, P0, &bw);
        if (tol == 0) CHECK(name, bw, "params not bitwise equal: max rel diff %.3g", e);
        else CHECK(name, e < tol, "params: max diff relative to the update %.3g (tol %.1g)", e, tol);
        for (int i = 0; i < lucid_optim_state_count(C.o); i++) {
            double es = cmp(lucid_optim_state(C.o, i), lucid_optim_state(D.o, i), NULL, &bw);
            snprintf(nm, sizeof nm, "%s: state '%s'", name, lucid_optim_state_name(C.o, i));
            if (tol == 0) CHECK(nm, bw, "not bitwise equal: %.3g", es);
            else CHECK(nm, es < tol, "%.3g", es);
        }
        lucid_param_values vc, vd;
        lucid_param_block_read(ctx, C.pb, &vc);
        lucid_param_block_read(ctx, D.pb, &vd);
        /* the EMA decay comes from exp() in f64 on each device; when the
         * two libms ever round d differently, the EMA may differ by an ulp */
        int same_d = memcmp(&vc.st.ema_d, &vd.st.ema_d, 4) == 0;
        double ee = cmp(lucid_ema_tensor(C.e), lucid_ema_tensor(D.e), NULL, &bw);
        int bw2;
        double ea = cmp(lucid_ema_tensor(C.ea), lucid_ema_tensor(D.ea), NULL, &bw2);
        snprintf(nm, sizeof nm, "%s: EMA of params (frozen included) and of BN buffers", name);
        if (tol == 0 && same_d) CHECK(nm, bw && bw2, "not bitwise: %.3g / %.3g", ee, ea);
        else CHECK(nm, ee < (tol ? tol : 1e-6) && (bw2 || ea < 1e-6), "%.3g / %.3g", ee, ea);
        snprintf(nm, sizeof nm, "%s: gradients bitwise (processed with KEEP_GRADS, else unchanged)", name);
        CHECK(nm, grads_ok, "differ");
        lucid_tensor *dp = to_cpu(D.P);
        for (int64_t i = 0; i < FTOTAL; i++)
            if (!trainable_f(i) && memcmp(&((float *)lucid_tensor_data(dp))[i], &p0[i], 4))
                untouched_ok = 0;
        lucid_tensor_release(dp);
        snprintf(nm, sizeof nm, "%s: frozen params, buffers, gaps and their grads untouched", name);
        CHECK(nm, untouched_ok, "a non-trainable element changed");
        int norm_same = memcmp(&vc.st.grad_norm, &vd.st.grad_norm, 4) == 0 ||
                        (isnan(vc.st.grad_norm) && isnan(vd.st.grad_norm));
        snprintf(nm, sizeof nm, "%s: block state CPU == CUDA (step, skip, scale, norm, EMA)", name);
        CHECK(nm, vc.st.step == vd.st.step && vc.st.skipped_steps == vd.st.skipped_steps &&
                      vd.st.skipped_steps == 1 && vc.st.loss_scale == vd.st.loss_scale &&
                      vc.st.growth_tracker == vd.st.growth_tracker && vd.st.found_inf == 0 &&
                      vc.st.nonfinite_norms == vd.st.nonfinite_norms &&
                      vd.st.nonfinite_norms == 2 && vc.st.ema_updates == vd.st.ema_updates &&
                      vd.st.ema_updates == NFSCEN && norm_same &&
                      vc.st.clip_coef == vd.st.clip_coef &&
                      vc.st.step_skipped == vd.st.step_skipped,
              "step %lld/%lld skipped %lld/%lld scale %g/%g nonfinite %d/%d ema %lld/%lld "
              "norm %.9g/%.9g",
              (long long)vc.st.step, (long long)vd.st.step, (long long)vc.st.skipped_steps,
              (long long)vd.st.skipped_steps, vc.st.loss_scale, vd.st.loss_scale,
              vc.st.nonfinite_norms, vd.st.nonfinite_norms, (long long)vc.st.ema_updates,
              (long long)vd.st.ema_updates, vc.st.grad_norm, vd.st.grad_norm);
    }
    lucid_tensor_release(P0);
    rig_free(&C), rig_free(&D);
    free(p0), free(g), free(b);
}

/* The plan of fsegs: one bucket holds Muon matrices of different shapes. */
static void test_plan_mixed(void) {
    lucid_param_layout *l = NULL;
    if (lucid_param_layout_create(ctx, GPU, FTOTAL, fsegs, FNSEG, &l) != LUCID_OK) {
        TEST_FAIL("muon plan of the test layout", "%s", lucid_ctx_error(ctx));
        return;
    }
    int mixed = 0, tr = 0;
    for (int b = 0; b < l->nbuckets; b++) {
        const lucid_muon_bucket *k = &l->buckets_host[b];
        for (int j = k->first + 1; j < k->first + k->count; j++)
            if (l->mats_host[j].m != l->mats_host[k->first].m ||
                l->mats_host[j].k != l->mats_host[k->first].k)
                mixed = 1;
    }
    for (int j = 0; j < l->nmuon; j++) tr |= l->mats_host[j].tr;
    CHECK("muon plan of the test layout: a bucket mixes shapes (one transposed)",
          mixed && tr && l->nmuon == 5, "%d buckets, %d matrices", l->nbuckets, l->nmuon);
    lucid_param_layout_release(l);
}

/* The Muon direction alone: sgd_scale = 0, so a Muon parameter moves by
 * f32(-lr*muon) * O; max |dp_cuda - dp_cpu| / max |dp_cpu| over them. */
static void test_muon_direction(int ns_bf16, double tol, const char *name) {
    lucid_param_values v;
    lucid_param_values_default(&v);
    v.in.ns_bf16 = ns_bf16;
    v.in.sgd_scale = 0.0f;
    float *p0 = malloc(FTOTAL * sizeof(float)), *g = malloc(FTOTAL * sizeof(float));
    float b[BTOTAL] = {0};
    for (int i = 0; i < FTOTAL; i++) p0[i] = 0.3f * randn(), g[i] = randn();
    fused_rig C, D;
    if (!rig_make(&C, CPU, LUCID_OPTIM_MUSGD, &v, p0, b) ||
        !rig_make(&D, GPU, LUCID_OPTIM_MUSGD, &v, p0, b)) {
        TEST_FAIL(name, "setup: %s", lucid_ctx_error(ctx));
        free(p0), free(g);
        return;
    }
    put(C.G, g, FTOTAL), put(D.G, g, FTOTAL);
    lucid_optim_step(ctx, C.o, C.pb, C.P, C.G);
    lucid_optim_step(ctx, D.o, D.pb, D.P, D.G);
    lucid_tensor *dp = to_cpu(D.P);
    const float *pc = lucid_tensor_data(C.P), *pd = lucid_tensor_data(dp);
    double e = 0, m = 1e-30;
    for (int s = 0; s < FNSEG; s++) {
        if (!fsegs[s].trainable || !(fsegs[s].ndim == 2 || fsegs[s].ndim == 4)) continue;
        for (int64_t i = fsegs[s].offset; i < fsegs[s].offset + fsegs[s].numel; i++) {
            double a = (double)pc[i] - p0[i], bb = (double)pd[i] - p0[i];
            m = fmax(m, fabs(a));
            e = isnan(bb) ? INFINITY : fmax(e, fabs(a - bb));
        }
    }
    CHECK(name, e / m < tol && m > 1e-6, "max diff %.3g of max step %.3g (tol %.1g)", e / m, m,
          tol);
    lucid_tensor_release(dp);
    rig_free(&C), rig_free(&D);
    free(p0), free(g);
}

/* Record upload + fused step as a CUDA graph, replay it 3 times; compare
 * with 3 eager fused steps from the same start (same device: bitwise). */
typedef struct graph_arg {
    fused_rig *r;
    int flags;
} graph_arg;
static lucid_status graph_fn(void *a) {
    graph_arg *ga = a;
    lucid_status s = lucid_param_block_upload(ctx, ga->r->pb);
    return s ? s : rig_fused(ga->r, ga->flags);
}

static void test_fused_graph(lucid_optim_kind kind, const char *name) {
    const lucid_pose_loss_kernels *lk = lucid_pose_loss_cuda_kernels();
    if (!lk) {
        TEST_SKIP(name, "no capture hook in this build");
        return;
    }
    lucid_param_values v;
    lucid_param_values_default(&v);
    v.in.clip_max_norm = 1.0f;
    float *p0 = malloc(FTOTAL * sizeof(float)), *g = malloc(FTOTAL * sizeof(float));
    float *b = malloc(BTOTAL * sizeof(float));
    for (int i = 0; i < FTOTAL; i++) p0[i] = 0.3f * randn(), g[i] = randn();
    for (int i = 0; i < BTOTAL; i++) b[i] = randn();
    fused_rig E, R;
    if (!rig_make(&E, GPU, kind, &v, p0, b) || !rig_make(&R, GPU, kind, &v, p0, b)) {
        TEST_FAIL(name, "setup: %s", lucid_ctx_error(ctx));
        free(p0), free(g), free(b);
        return;
    }
    put(E.G, g, FTOTAL), put(R.G, g, FTOTAL);
    const int flags = LUCID_STEP_CLIP_NORM | LUCID_STEP_SCALER_UPDATE;
    for (int k = 0; k < 3; k++) {
        lucid_param_block_upload(ctx, E.pb);
        rig_fused(&E, flags);
    }
    graph_arg ga = {&R, flags};
    lucid_status st = lk->capture(ctx, graph_fn, &ga, 3);
    if (st != LUCID_OK) {
        TEST_FAIL(name, "capture: %s", lucid_ctx_error(ctx));
    } else {
        int b1, b2, b3, b4;
        lucid_tensor *ep = to_cpu(E.P), *ee = to_cpu(lucid_ema_tensor(E.e));
        lucid_tensor *es = to_cpu(lucid_optim_state(E.o, 0)), *ea = to_cpu(lucid_ema_tensor(E.ea));
        cmp(ep, R.P, NULL, &b1);
        cmp(ee, lucid_ema_tensor(R.e), NULL, &b2);
        cmp(es, lucid_optim_state(R.o, 0), NULL, &b3);
        cmp(ea, lucid_ema_tensor(R.ea), NULL, &b4);
        lucid_param_values ve, vr;
        lucid_param_block_read(ctx, E.pb, &ve);
        lucid_param_block_read(ctx, R.pb, &vr);
        CHECK(name, b1 && b2 && b3 && b4 && memcmp(&ve.st, &vr.st, sizeof ve.st) == 0 &&
                        vr.st.step == 3 && vr.st.ema_updates == 3,
              "params %d ema %d state %d aux %d, step %lld ema_updates %lld", b1, b2, b3, b4,
              (long long)vr.st.step, (long long)vr.st.ema_updates);
        lucid_tensor_release(ep), lucid_tensor_release(ee);
        lucid_tensor_release(es), lucid_tensor_release(ea);
    }
    rig_free(&E), rig_free(&R);
    free(p0), free(g), free(b);
}

int main(void) {
    const char *names[] = {"sgd", "adamw", "musgd f32", "musgd bf16", "clip_norm",
                           "clip_value/unscale/scaler/ema", "fused sgd", "fused adamw",
                           "fused musgd (bf16 and f32 GEMMs)", "muon plan", "muon direction",
                           "fused step as a CUDA graph"};
    if (!lucid_cuda_available()) {
        for (size_t i = 0; i < sizeof names / sizeof *names; i++)
            TEST_SKIP(names[i], "no CUDA device in this build/machine");
        return 0;
    }
    lucid_ctx_options o = lucid_ctx_options_default();
    o.device = GPU;
    char err[256];
    if (lucid_ctx_create(&o, &ctx, err, sizeof err) != LUCID_OK) {
        printf("not ok cuda context: %s\n", err);
        return 1;
    }
    lucid_param_layout *probe = NULL;
    if (lucid_param_layout_create(ctx, GPU, TOTAL, segs, NSEG, &probe) != LUCID_OK) {
        for (size_t i = 0; i < sizeof names / sizeof *names; i++)
            TEST_SKIP(names[i], "%s", lucid_ctx_error(ctx));
        lucid_ctx_release(ctx);
        return 0;
    }
    lucid_param_layout_release(probe);
    test_optim(LUCID_OPTIM_SGD, 1, 0, "SGD 3 steps bitwise CPU == CUDA");
    test_optim(LUCID_OPTIM_ADAMW, 1, 0, "AdamW 3 steps bitwise CPU == CUDA");
    test_optim(LUCID_OPTIM_MUSGD, 0, 1e-4, "MuSGD f32 NS 3 steps CPU ~ CUDA");
    test_optim(LUCID_OPTIM_MUSGD, 1, 3e-2, "MuSGD bf16 NS 3 steps CPU ~ CUDA");
    for (int s = 0; s < 3; s++) test_norm(LUCID_F32, s);
    test_norm(LUCID_BF16, 0);
    test_norm(LUCID_F16, 0);
    test_value_scaler_ema();
    make_fsegs();
    test_plan_mixed();
    test_fused(LUCID_OPTIM_SGD, 1, 0, "fused SGD step (CUDA) == separate calls (CPU), 7 steps bitwise");
    test_fused(LUCID_OPTIM_ADAMW, 1, 0, "fused AdamW step (CUDA) == separate calls (CPU), 7 steps bitwise");
    test_fused(LUCID_OPTIM_MUSGD, 0, 1e-4, "fused MuSGD step, f32 GEMMs (CUDA) ~ separate calls (CPU)");
    test_fused(LUCID_OPTIM_MUSGD, 1, 3e-2, "fused MuSGD step, bf16 GEMMs (CUDA) ~ separate calls (CPU)");
    test_muon_direction(0, 1e-3, "Muon direction alone, f32 GEMMs, mixed-shape bucket: CUDA ~ CPU");
    test_muon_direction(1, 1e-1, "Muon direction alone, bf16 GEMMs, mixed-shape bucket: CUDA ~ CPU");
    test_fused_graph(LUCID_OPTIM_SGD, "fused SGD step recorded as a CUDA graph: 3 replays == 3 eager steps");
    test_fused_graph(LUCID_OPTIM_ADAMW, "fused AdamW step recorded as a CUDA graph: 3 replays == 3 eager steps");
    test_fused_graph(LUCID_OPTIM_MUSGD, "fused MuSGD step recorded as a CUDA graph: 3 replays == 3 eager steps");
    lucid_ctx_release(ctx);
    return test_exit();
}
