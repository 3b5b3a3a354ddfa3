/*
 * test_optim_cuda.c — every CUDA update kernel against the CPU reference on
 * random data: SGD, AdamW (bitwise), MuSGD (f32 and bf16 Newton–Schulz,
 * tolerance: GEMM summation order differs), gradient norm + clip for
 * f32/bf16/f16 (bitwise), value clip, unscale/found_inf/skip/scale update,
 * EMA. Prints skip lines and exits 0 without a usable GPU.
 */
#include "test.h"
#include "internal.h"
#include "train/optim.h"

#define NSEG 9
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
};
#define TOTAL 35226

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

int main(void) {
    const char *names[] = {"sgd", "adamw", "musgd f32", "musgd bf16", "clip_norm",
                           "clip_value/unscale/scaler/ema"};
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
    lucid_ctx_release(ctx);
    return test_exit();
}
