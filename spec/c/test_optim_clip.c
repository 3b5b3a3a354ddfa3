/*
 * test_optim_clip.c — gradient norm and clipping (finite, huge |g| = 1e20,
 * Inf, NaN; f32/bf16/f16 grads), value clipping, and fp16 loss scaling
 * (growth, backoff, skipped step), on the CPU, against float64 values and
 * the torch semantics of the clipping reference §1-§4, §8.
 */
#include "test_optim_fixture.h"

static lucid_device CPU = {LUCID_CPU, 0};

static double ref_norm(const float *g) {
    double s = 0;
    for (int i = 0; i < FX_TOTAL; i++)
        if (fx_trainable(i)) s += (double)g[i] * g[i];
    return sqrt(s);
}

static lucid_param_block *block(lucid_ctx *ctx, float max_norm) {
    lucid_param_values v;
    lucid_param_values_default(&v);
    v.in.clip_max_norm = max_norm;
    lucid_param_block *pb = NULL;
    lucid_param_block_create(ctx, CPU, &v, &pb);
    return pb;
}

static lucid_param_values readb(lucid_ctx *ctx, lucid_param_block *pb) {
    lucid_param_values v;
    lucid_param_block_read(ctx, pb, &v);
    return v;
}

static void test_finite(lucid_ctx *ctx, lucid_param_layout *l) {
    lucid_tensor *G = fx_tensor(ctx, LUCID_F32, FX_TOTAL);
    float g0[FX_TOTAL];
    for (int i = 0; i < FX_TOTAL; i++) g0[i] = fx_f(G)[i] = fx_randn();
    for (int i = 183; i < 207; i++) g0[i] = fx_f(G)[i] = 1000.0f; /* frozen */
    double n = ref_norm(g0);
    lucid_param_block *pb = block(ctx, 1.0f);
    CHECK_STATUS("clip_norm finite runs", ctx, lucid_grad_clip_norm(ctx, l, pb, G, 1));
    lucid_param_values v = readb(ctx, pb);
    CHECK("clip_norm: total norm equals f64 (frozen grads excluded)",
          test_relerr(v.st.grad_norm, n) < 1e-6, "norm %.9g vs %.9g", v.st.grad_norm, n);
    double coef = 1.0 / (n + 1e-6);
    double e = 0;
    int frozen_ok = 1;
    for (int i = 0; i < FX_TOTAL; i++) {
        if (fx_trainable(i)) e = fmax(e, test_relerr(fx_f(G)[i], g0[i] * coef));
        else if (fx_f(G)[i] != g0[i]) frozen_ok = 0;
    }
    CHECK("clip_norm: grads scaled by max_norm/(norm+1e-6)", e < 1e-6, "rel err %.3g", e);
    CHECK("clip_norm: frozen grads untouched", frozen_ok, "changed");
    CHECK("clip_norm: finite norm not counted", v.st.nonfinite_norms == 0, "%d",
          v.st.nonfinite_norms);
    /* small norm: coefficient clamps to 1, grads bitwise unchanged */
    lucid_param_block_staging(pb)->clip_max_norm = 1e6f;
    lucid_param_block_upload(ctx, pb);
    memcpy(g0, fx_f(G), sizeof g0);
    lucid_grad_clip_norm(ctx, l, pb, G, 1);
    v = readb(ctx, pb);
    CHECK("clip_norm: coef clamps to 1 and grads are unchanged",
          v.st.clip_coef == 1.0f && memcmp(g0, fx_f(G), sizeof g0) == 0, "coef %g",
          v.st.clip_coef);
    /* apply = 0: norm only */
    lucid_param_block_staging(pb)->clip_max_norm = 1e-3f;
    lucid_param_block_upload(ctx, pb);
    lucid_grad_clip_norm(ctx, l, pb, G, 0);
    CHECK("clip_norm apply=0 leaves grads alone", memcmp(g0, fx_f(G), sizeof g0) == 0,
          "changed");
    /* max_norm = 0 zeroes every trainable grad (torch, no validation) */
    lucid_param_block_staging(pb)->clip_max_norm = 0.0f;
    lucid_param_block_upload(ctx, pb);
    lucid_grad_clip_norm(ctx, l, pb, G, 1);
    int zero = 1;
    for (int i = 0; i < FX_TOTAL; i++) if (fx_trainable(i) && fx_f(G)[i] != 0.0f) zero = 0;
    CHECK("clip_norm max_norm=0 zeroes the grads", zero, "non-zero left");
    lucid_param_block_release(pb);
    lucid_tensor_release(G);
}

static void test_nonfinite(lucid_ctx *ctx, lucid_param_layout *l) {
    lucid_tensor *G = fx_tensor(ctx, LUCID_F32, FX_TOTAL);
    lucid_param_block *pb = block(ctx, 10.0f);
    /* huge finite: g*g overflows f32 -> Inf norm -> coef 0 -> grads 0 */
    for (int i = 0; i < FX_TOTAL; i++) fx_f(G)[i] = fx_randn();
    fx_f(G)[5] = 1e20f;
    lucid_grad_clip_norm(ctx, l, pb, G, 1);
    lucid_param_values v = readb(ctx, pb);
    int zeros = 1;
    for (int i = 0; i < FX_TOTAL; i++) if (fx_trainable(i) && fx_f(G)[i] != 0.0f) zeros = 0;
    CHECK("clip_norm |g|=1e20: norm is Inf (f32 accumulation, as torch CUDA)",
          isinf(v.st.grad_norm) && v.st.grad_norm > 0, "norm %g", v.st.grad_norm);
    CHECK("clip_norm |g|=1e20: coef 0, every grad becomes 0",
          v.st.clip_coef == 0.0f && zeros, "coef %g", v.st.clip_coef);
    CHECK("clip_norm |g|=1e20: counted as non-finite", v.st.nonfinite_norms == 1, "%d",
          v.st.nonfinite_norms);
    /* Inf grad: coef 0; finite grads -> 0, the Inf grad -> NaN */
    for (int i = 0; i < FX_TOTAL; i++) fx_f(G)[i] = fx_randn();
    fx_f(G)[7] = INFINITY;
    lucid_grad_clip_norm(ctx, l, pb, G, 1);
    v = readb(ctx, pb);
    CHECK("clip_norm Inf grad: Inf grad becomes NaN, others 0",
          isnan(fx_f(G)[7]) && fx_f(G)[8] == 0.0f && isinf(v.st.grad_norm),
          "g7 %g g8 %g", fx_f(G)[7], fx_f(G)[8]);
    /* NaN grad: NaN norm, NaN coef, every trainable grad NaN */
    for (int i = 0; i < FX_TOTAL; i++) fx_f(G)[i] = fx_randn();
    fx_f(G)[9] = NAN;
    float frozen = fx_f(G)[190];
    lucid_grad_clip_norm(ctx, l, pb, G, 1);
    v = readb(ctx, pb);
    int alln = 1;
    for (int i = 0; i < FX_TOTAL; i++) if (fx_trainable(i) && !isnan(fx_f(G)[i])) alln = 0;
    CHECK("clip_norm NaN grad: norm and coef NaN, every grad NaN",
          isnan(v.st.grad_norm) && isnan(v.st.clip_coef) && alln &&
          fx_f(G)[190] == frozen, "norm %g", v.st.grad_norm);
    CHECK("clip_norm: non-finite norms counted (3)", v.st.nonfinite_norms == 3, "%d",
          v.st.nonfinite_norms);
    lucid_param_block_release(pb);
    lucid_tensor_release(G);
}

static void test_half(lucid_ctx *ctx, lucid_param_layout *l, lucid_dtype dt) {
    char nm[96];
    lucid_tensor *G = fx_tensor(ctx, dt, FX_TOTAL);
    uint16_t *h = lucid_tensor_data(G);
    float dec[FX_TOTAL];
    for (int i = 0; i < FX_TOTAL; i++) {
        float x = fx_randn() * 300.0f; /* total norm > 65504 is fine in f32 */
        h[i] = dt == LUCID_BF16 ? lucid_f32_to_bf16(x) : lucid_f32_to_f16(x);
        dec[i] = dt == LUCID_BF16 ? lucid_bf16_to_f32(h[i]) : lucid_f16_to_f32(h[i]);
    }
    double n = ref_norm(dec);
    lucid_param_block *pb = block(ctx, 1.0f);
    lucid_grad_clip_norm(ctx, l, pb, G, 1);
    lucid_param_values v = readb(ctx, pb);
    snprintf(nm, sizeof nm, "clip_norm %s grads: norm accumulated in f32", lucid_dtype_name(dt));
    CHECK(nm, test_relerr(v.st.grad_norm, n) < 1e-5, "norm %.9g vs %.9g", v.st.grad_norm, n);
    double e = 0;
    for (int i = 0; i < FX_TOTAL; i++) {
        if (!fx_trainable(i)) continue;
        float got = dt == LUCID_BF16 ? lucid_bf16_to_f32(h[i]) : lucid_f16_to_f32(h[i]);
        float want = dec[i] * v.st.clip_coef;
        float wr = dt == LUCID_BF16 ? lucid_bf16_to_f32(lucid_f32_to_bf16(want))
                                    : lucid_f16_to_f32(lucid_f32_to_f16(want));
        if (got != wr) e = 1;
    }
    snprintf(nm, sizeof nm, "clip_norm %s grads: product rounded once", lucid_dtype_name(dt));
    CHECK(nm, e == 0, "mismatch");
    lucid_param_block_release(pb);
    lucid_tensor_release(G);
}

static void test_value(lucid_ctx *ctx, lucid_param_layout *l) {
    lucid_tensor *G = fx_tensor(ctx, LUCID_F32, FX_TOTAL);
    lucid_param_values v;
    lucid_param_values_default(&v);
    v.in.clip_value = 0.5f;
    lucid_param_block *pb = NULL;
    lucid_param_block_create(ctx, CPU, &v, &pb);
    float *g = fx_f(G);
    g[0] = 2.0f; g[1] = -3.0f; g[2] = 0.25f; g[3] = INFINITY; g[4] = -INFINITY; g[5] = NAN;
    g[190] = 7.0f;
    lucid_grad_clip_value(ctx, l, pb, G);
    CHECK("clip_value clamps to ±c, Inf -> ±c, NaN stays, frozen untouched",
          g[0] == 0.5f && g[1] == -0.5f && g[2] == 0.25f && g[3] == 0.5f &&
          g[4] == -0.5f && isnan(g[5]) && g[190] == 7.0f,
          "%g %g %g %g %g %g", g[0], g[1], g[2], g[3], g[4], g[5]);
    lucid_param_block_staging(pb)->clip_value = -1.0f;
    lucid_param_block_upload(ctx, pb);
    g[0] = 2.0f; g[1] = -3.0f;
    lucid_grad_clip_value(ctx, l, pb, G);
    CHECK("clip_value with negative c makes every element c (clamp order)",
          g[0] == -1.0f && g[1] == -1.0f, "%g %g", g[0], g[1]);
    lucid_param_block_release(pb);
    lucid_tensor_release(G);
}

static void test_scaler(lucid_ctx *ctx, lucid_param_layout *l) {
    lucid_param_values v;
    lucid_param_values_default(&v);
    v.in.scaler_enabled = 1;
    v.in.growth_interval = 3;
    lucid_param_block *pb = NULL;
    lucid_param_block_create(ctx, CPU, &v, &pb);
    lucid_optim *o = NULL;
    lucid_optim_create(ctx, LUCID_OPTIM_SGD, l, &o);
    lucid_tensor *P = fx_tensor(ctx, LUCID_F32, FX_TOTAL);
    lucid_tensor *G = fx_tensor(ctx, LUCID_F32, FX_TOTAL);
    lucid_tensor *loss = fx_tensor(ctx, LUCID_F32, 1);
    fx_f(loss)[0] = 1.5f;
    lucid_scaler_scale(ctx, pb, loss);
    CHECK("scaler: loss scaled by 65536", fx_f(loss)[0] == 1.5f * 65536.0f, "%g", fx_f(loss)[0]);
    float g0[FX_TOTAL];
    for (int step = 1; step <= 3; step++) {
        for (int i = 0; i < FX_TOTAL; i++) fx_f(G)[i] = g0[i] = fx_randn();
        v = readb(ctx, pb);
        for (int i = 0; i < FX_TOTAL; i++)
            if (fx_trainable(i)) fx_f(G)[i] = g0[i] * v.st.loss_scale;
        lucid_grad_unscale(ctx, l, pb, G);
        int exact = 1;
        for (int i = 0; i < FX_TOTAL; i++) if (fx_f(G)[i] != g0[i]) exact = 0;
        if (step == 1) CHECK("scaler: unscale restores grads exactly (power of two)", exact, "differs");
        lucid_optim_step(ctx, o, pb, P, G);
        lucid_scaler_update(ctx, pb);
    }
    v = readb(ctx, pb);
    CHECK("scaler: x2 after growth_interval clean steps, tracker reset",
          v.st.loss_scale == 131072.0f && v.st.growth_tracker == 0 && v.st.step == 3,
          "scale %g tracker %d step %lld", v.st.loss_scale, v.st.growth_tracker,
          (long long)v.st.step);
    /* overflow: Inf grad -> found_inf, skipped step, scale x0.5 */
    float p_before[FX_TOTAL];
    memcpy(p_before, fx_f(P), sizeof p_before);
    for (int i = 0; i < FX_TOTAL; i++) fx_f(G)[i] = 1.0f;
    fx_f(G)[3] = INFINITY;
    lucid_grad_unscale(ctx, l, pb, G);
    v = readb(ctx, pb);
    CHECK("scaler: non-finite grad sets found_inf on the device", v.st.found_inf == 1, "%d",
          v.st.found_inf);
    lucid_optim_step(ctx, o, pb, P, G);
    lucid_scaler_update(ctx, pb);
    v = readb(ctx, pb);
    CHECK("scaler: overflow step skipped (params bitwise unchanged)",
          memcmp(p_before, fx_f(P), sizeof p_before) == 0 && v.st.step == 3 &&
          v.st.skipped_steps == 1, "step %lld skipped %lld", (long long)v.st.step,
          (long long)v.st.skipped_steps);
    CHECK("scaler: backoff x0.5, tracker 0, found_inf reset",
          v.st.loss_scale == 65536.0f && v.st.growth_tracker == 0 && v.st.found_inf == 0,
          "scale %g tracker %d found %d", v.st.loss_scale, v.st.growth_tracker, v.st.found_inf);
    /* growth that would overflow f32 keeps the scale */
    lucid_param_state st = v.st;
    st.loss_scale = 3e38f;
    st.growth_tracker = 2;
    lucid_param_block_set_state(ctx, pb, &st);
    lucid_scaler_update(ctx, pb);
    v = readb(ctx, pb);
    CHECK("scaler: growth to Inf is refused, tracker still resets",
          v.st.loss_scale == 3e38f && v.st.growth_tracker == 0, "scale %g", v.st.loss_scale);
    /* disabled scaler: unscale is a no-op, grads untouched, never skips */
    lucid_param_block_staging(pb)->scaler_enabled = 0;
    lucid_param_block_upload(ctx, pb);
    fx_f(G)[3] = INFINITY;
    fx_f(G)[4] = 8.0f;
    lucid_grad_unscale(ctx, l, pb, G);
    v = readb(ctx, pb);
    CHECK("scaler disabled: unscale does nothing", v.st.found_inf == 0 && fx_f(G)[4] == 8.0f,
          "found %d g %g", v.st.found_inf, fx_f(G)[4]);
    lucid_tensor *G16 = fx_tensor(ctx, LUCID_F16, FX_TOTAL);
    lucid_status s = lucid_grad_unscale(ctx, l, pb, G16);
    CHECK("scaler: f16 grads refused (fp32 master grads required)",
          s == LUCID_ERR_UNSUPPORTED, "status %d", s);
    lucid_tensor_release(G16);
    lucid_tensor_release(loss);
    lucid_tensor_release(P);
    lucid_tensor_release(G);
    lucid_optim_release(o);
    lucid_param_block_release(pb);
}

int main(void) {
    lucid_ctx *ctx = fx_ctx();
    lucid_param_layout *l = fx_layout(ctx, CPU);
    test_finite(ctx, l);
    test_nonfinite(ctx, l);
    test_half(ctx, l, LUCID_BF16);
    test_half(ctx, l, LUCID_F16);
    test_value(ctx, l);
    test_scaler(ctx, l);
    lucid_param_layout_release(l);
    lucid_ctx_release(ctx);
    return test_exit();
}
