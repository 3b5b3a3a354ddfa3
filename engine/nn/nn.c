/*
 * nn.c — the checked entry points of the nn kernels and the CPU table.
 *
 * Each lucid_nn_<op>_<pass>() validates its arguments (presence, rank,
 * shape, dtype, device, contiguity), picks the kernel table of the device
 * the tensors live on and calls it; written tensors get their storage
 * version bumped (what recorded steps watch), as in engine/core/ops.c.
 * Kernel functions therefore receive only well-formed arguments.
 */
#include "nn/nn_cpu.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// tables

static const lucid_nn_kernels cpu_table = {
    .name = "cpu",
    .conv2d_forward = cpu_conv2d_forward,
    .conv2d_backward_input = cpu_conv2d_backward_input,
    .conv2d_backward_params = cpu_conv2d_backward_params,
    .batchnorm2d_forward = cpu_batchnorm2d_forward,
    .batchnorm2d_backward = cpu_batchnorm2d_backward,
    .silu_forward = cpu_silu_forward,
    .silu_backward = cpu_silu_backward,
    .maxpool2d_forward = cpu_maxpool2d_forward,
    .maxpool2d_backward = cpu_maxpool2d_backward,
    .upsample_nearest2d_forward = cpu_upsample_nearest2d_forward,
    .upsample_nearest2d_backward = cpu_upsample_nearest2d_backward,
    .channel_copy = cpu_channel_copy,
    .add_forward = cpu_add_forward,
    .softmax_forward = cpu_softmax_forward,
    .softmax_backward = cpu_softmax_backward,
    .dfl_forward = cpu_dfl_forward,
    .dfl_backward = cpu_dfl_backward,
    .batchnorm2d_silu_forward = cpu_batchnorm2d_silu_forward,
    .batchnorm2d_silu_backward = cpu_batchnorm2d_silu_backward,
    .channel_copy_multi = cpu_channel_copy_multi,
};

const lucid_nn_kernels *lucid_nn_cpu_kernels(void) { return &cpu_table; }

const lucid_nn_kernels *lucid_nn_kernels_for(lucid_ctx *ctx, lucid_device dev) {
    if (dev.type == LUCID_CPU) return &cpu_table;
    const lucid_nn_kernels *k = NULL;
    k = lucid_nn_cuda_kernels();
    if (!k) {
        lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                     "nn kernels for cuda:%d are not in this build (CPU-only "
                     "build or cuda/ without the nn table)",
                     dev.index);
        return NULL;
    }
    if (!lucid_backend_for(ctx, dev)) return NULL;
    return k;
}

int64_t lucid_nn_conv_out_size(int64_t in, int k, int stride, int pad,
                               int dilation) {
    if (stride < 1) return 0;
    int64_t span = in + 2 * (int64_t)pad - (int64_t)dilation * (k - 1) - 1;
    if (span < 0) return 0;
    return span / stride + 1;
}

// ----------------------------------------------------------------------------
// argument checks

static int same_dev(const lucid_tensor *a, const lucid_tensor *b) {
    lucid_device x = lucid_tensor_device(a), y = lucid_tensor_device(b);
    return x.type == y.type && x.index == y.index;
}

/* t present (or optional), contiguous, rank ndim (-1: >= 1), on ref's
 * device. */
static lucid_status chk(lucid_ctx *ctx, const char *op, const char *arg,
                        const lucid_tensor *t, int ndim, const lucid_tensor *ref) {
    if (!t) return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: %s is NULL", op, arg);
    if (ndim >= 0 && t->ndim != ndim) {
        char b[128];
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: %s must have rank %d, has shape %s", op, arg,
                            ndim, lucid_shape_str(t->ndim, t->shape, b, sizeof b));
    }
    if (ndim < 0 && t->ndim < 1)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: %s is a scalar", op, arg);
    if (!lucid_tensor_is_contiguous(t))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: %s must be contiguous (clone() it first)", op,
                            arg);
    if (ref && !same_dev(t, ref))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: %s is on another device than the input", op,
                            arg);
    return LUCID_OK;
}

/* activation dtype: float, equal to the reference dtype */
static lucid_status chk_act(lucid_ctx *ctx, const char *op, const char *arg,
                            const lucid_tensor *t, const lucid_tensor *ref) {
    if (!lucid_dtype_is_float(t->dtype))
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "%s: %s has dtype %s; expected f32, bf16, f16 or "
                            "f64",
                            op, arg, lucid_dtype_name(t->dtype));
    if (ref && t->dtype != ref->dtype)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: %s has dtype %s but the input has %s", op, arg,
                            lucid_dtype_name(t->dtype),
                            lucid_dtype_name(ref->dtype));
    return LUCID_OK;
}

static lucid_status chk_param(lucid_ctx *ctx, const char *op, const char *arg,
                              const lucid_tensor *t) {
    if (t->dtype != LUCID_F32 && t->dtype != LUCID_F64)
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "%s: %s has dtype %s; parameters are f32 (f64 on "
                            "the cpu)",
                            op, arg, lucid_dtype_name(t->dtype));
    return LUCID_OK;
}

static lucid_status chk_shape(lucid_ctx *ctx, const char *op, const char *arg,
                              const lucid_tensor *t, int ndim,
                              const int64_t *shape) {
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char a[128], b[128];
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: %s has shape %s, expected %s",
                            op, arg, lucid_shape_str(t->ndim, t->shape, a, sizeof a),
                            lucid_shape_str(ndim, shape, b, sizeof b));
    }
    return LUCID_OK;
}

static void bump(lucid_tensor *t) {
    if (t) lucid_storage_bump_version(t->storage);
}

#define KT(ctx, x)                                                            \
    const lucid_nn_kernels *kt_ = lucid_nn_kernels_for(ctx, lucid_tensor_device(x)); \
    if (!kt_) return lucid_ctx_last_status(ctx)

// ----------------------------------------------------------------------------
// Conv2d

static lucid_status chk_conv(lucid_ctx *ctx, const char *op,
                             const lucid_tensor *x, const lucid_tensor *w,
                             const lucid_conv2d_params *p, int64_t yshape[4]) {
    LUCID_TRY(chk(ctx, op, "x", x, 4, NULL));
    LUCID_TRY(chk_act(ctx, op, "x", x, NULL));
    LUCID_TRY(chk(ctx, op, "weight", w, 4, x));
    LUCID_TRY(chk_param(ctx, op, "weight", w));
    if (!p) return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: params is NULL", op);
    if (p->groups < 1 || p->stride_h < 1 || p->stride_w < 1 ||
        p->dilation_h < 1 || p->dilation_w < 1 || p->pad_h < 0 || p->pad_w < 0)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: need groups, stride, dilation >= 1 and "
                            "padding >= 0 (got groups %d stride %dx%d "
                            "dilation %dx%d padding %dx%d)",
                            op, p->groups, p->stride_h, p->stride_w,
                            p->dilation_h, p->dilation_w, p->pad_h, p->pad_w);
    int64_t Cin = x->shape[1], Cout = w->shape[0];
    if (Cin % p->groups || Cout % p->groups || w->shape[1] != Cin / p->groups)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: input has %lld channels, weight is "
                            "[%lld,%lld,%lld,%lld], groups %d: need C_in and "
                            "C_out divisible by groups and weight dim 1 = "
                            "C_in/groups",
                            op, (long long)Cin, (long long)w->shape[0],
                            (long long)w->shape[1], (long long)w->shape[2],
                            (long long)w->shape[3], p->groups);
    yshape[0] = x->shape[0];
    yshape[1] = Cout;
    yshape[2] = lucid_nn_conv_out_size(x->shape[2], (int)w->shape[2], p->stride_h,
                                       p->pad_h, p->dilation_h);
    yshape[3] = lucid_nn_conv_out_size(x->shape[3], (int)w->shape[3], p->stride_w,
                                       p->pad_w, p->dilation_w);
    if (yshape[2] < 1 || yshape[3] < 1 || w->shape[2] < 1 || w->shape[3] < 1)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: input %lldx%lld is too small for kernel "
                            "%lldx%lld (dilation %d, padding %d)",
                            op, (long long)x->shape[2], (long long)x->shape[3],
                            (long long)w->shape[2], (long long)w->shape[3],
                            p->dilation_h, p->pad_h);
    return LUCID_OK;
}

/* The forward with an optional weight shadow and an optional column
 * cache (nn.h; the cache only when the table has the slot). */
static lucid_status conv_fwd(lucid_ctx *ctx, const lucid_tensor *x, lucid_tensor *y,
                             const lucid_tensor *w, const lucid_tensor *b,
                             const lucid_conv2d_params *p, lucid_conv_wshadow *ws,
                             lucid_conv_wcols *wc, int x_stable) {
    const char *op = "conv2d_forward";
    int64_t ys[4];
    LUCID_TRY(chk_conv(ctx, op, x, w, p, ys));
    LUCID_TRY(chk(ctx, op, "y", y, 4, x));
    LUCID_TRY(chk_act(ctx, op, "y", y, x));
    LUCID_TRY(chk_shape(ctx, op, "y", y, 4, ys));
    if (b) {
        LUCID_TRY(chk(ctx, op, "bias", b, 1, x));
        LUCID_TRY(chk_param(ctx, op, "bias", b));
        LUCID_TRY(chk_shape(ctx, op, "bias", b, 1, &ys[1]));
    }
    KT(ctx, x);
    if (lucid_tensor_numel(y) == 0) return LUCID_OK;
    if (wc && kt_->conv2d_forward_cols && kt_->conv2d_backward_params_cols)
        LUCID_TRY(kt_->conv2d_forward_cols(ctx, x, y, w, b, p, ws, wc, x_stable));
    else if (ws && kt_->conv2d_forward_shadow)
        LUCID_TRY(kt_->conv2d_forward_shadow(ctx, x, y, w, b, p, ws));
    else
        LUCID_TRY(kt_->conv2d_forward(ctx, x, y, w, b, p));
    bump(y);
    return LUCID_OK;
}

lucid_status lucid_nn_conv2d_forward(lucid_ctx *ctx, const lucid_tensor *x,
                                     lucid_tensor *y, const lucid_tensor *w,
                                     const lucid_tensor *b,
                                     const lucid_conv2d_params *p) {
    return conv_fwd(ctx, x, y, w, b, p, NULL, NULL, 0);
}

lucid_status lucid_nn_conv2d_forward_shadow(lucid_ctx *ctx, const lucid_tensor *x,
                                            lucid_tensor *y, const lucid_tensor *w,
                                            const lucid_tensor *b,
                                            const lucid_conv2d_params *p,
                                            lucid_conv_wshadow *ws) {
    return conv_fwd(ctx, x, y, w, b, p, ws, NULL, 0);
}

lucid_status lucid_nn_conv2d_forward_cols(lucid_ctx *ctx, const lucid_tensor *x,
                                          lucid_tensor *y, const lucid_tensor *w,
                                          const lucid_tensor *b,
                                          const lucid_conv2d_params *p,
                                          lucid_conv_wshadow *ws, lucid_conv_wcols *wc,
                                          int x_stable) {
    return conv_fwd(ctx, x, y, w, b, p, ws, wc, x_stable);
}

/* The backward-data with an optional weight shadow and optional columns
 * written by the BatchNorm backward (nn.h lucid_conv_dcols; used only when
 * filled and the table has the slot). */
static lucid_status conv_bwd_in(lucid_ctx *ctx, const lucid_tensor *x,
                                const lucid_tensor *dy, lucid_tensor *dx,
                                const lucid_tensor *w, const lucid_conv2d_params *p,
                                double beta, lucid_conv_wshadow *ws,
                                lucid_conv_dcols *dc) {
    const char *op = "conv2d_backward_input";
    int64_t ys[4];
    LUCID_TRY(chk_conv(ctx, op, x, w, p, ys));
    LUCID_TRY(chk(ctx, op, "grad_output", dy, 4, x));
    LUCID_TRY(chk_act(ctx, op, "grad_output", dy, x));
    LUCID_TRY(chk_shape(ctx, op, "grad_output", dy, 4, ys));
    LUCID_TRY(chk(ctx, op, "grad_input", dx, 4, x));
    LUCID_TRY(chk_act(ctx, op, "grad_input", dx, x));
    LUCID_TRY(chk_shape(ctx, op, "grad_input", dx, 4, x->shape));
    KT(ctx, x);
    if (lucid_tensor_numel(dx) == 0) return LUCID_OK;
    if (dc && dc->armed && dc->filled && kt_->conv2d_backward_input_dcols)
        LUCID_TRY(kt_->conv2d_backward_input_dcols(ctx, x, dy, dx, w, p, beta, ws, dc));
    else if (ws && kt_->conv2d_backward_input_shadow)
        LUCID_TRY(kt_->conv2d_backward_input_shadow(ctx, x, dy, dx, w, p, beta, ws));
    else
        LUCID_TRY(kt_->conv2d_backward_input(ctx, x, dy, dx, w, p, beta));
    bump(dx);
    return LUCID_OK;
}

lucid_status lucid_nn_conv2d_backward_input(lucid_ctx *ctx,
                                            const lucid_tensor *x,
                                            const lucid_tensor *dy,
                                            lucid_tensor *dx,
                                            const lucid_tensor *w,
                                            const lucid_conv2d_params *p,
                                            double beta) {
    return conv_bwd_in(ctx, x, dy, dx, w, p, beta, NULL, NULL);
}

lucid_status lucid_nn_conv2d_backward_input_shadow(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, const lucid_tensor *w, const lucid_conv2d_params *p,
    double beta, lucid_conv_wshadow *ws) {
    return conv_bwd_in(ctx, x, dy, dx, w, p, beta, ws, NULL);
}

lucid_status lucid_nn_conv2d_backward_input_dcols(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, const lucid_tensor *w, const lucid_conv2d_params *p,
    double beta, lucid_conv_wshadow *ws, lucid_conv_dcols *dc) {
    return conv_bwd_in(ctx, x, dy, dx, w, p, beta, ws, dc);
}

lucid_status lucid_nn_conv2d_dcols_reserve(lucid_ctx *ctx, const lucid_tensor *x,
                                           const lucid_tensor *w,
                                           const lucid_conv2d_params *p,
                                           lucid_conv_dcols *dc) {
    const char *op = "conv2d_dcols_reserve";
    if (!dc) return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: dcols is NULL", op);
    memset(dc, 0, sizeof *dc);
    int64_t ys[4];
    LUCID_TRY(chk_conv(ctx, op, x, w, p, ys));
    KT(ctx, x);
    if (!kt_->conv2d_dcols_reserve || !kt_->batchnorm2d_backward_dcols ||
        !kt_->conv2d_backward_input_dcols || lucid_tensor_numel(x) == 0 ||
        ys[1] * ys[2] * ys[3] == 0)
        return LUCID_OK;
    LUCID_TRY(kt_->conv2d_dcols_reserve(ctx, x, w, p, dc));
    return LUCID_OK;
}

lucid_status lucid_nn_conv2d_cast_shadows(lucid_ctx *ctx, const lucid_tensor *const *w,
                                          lucid_conv_wshadow *const *ws, int n,
                                          lucid_dtype dt) {
    const char *op = "conv2d_cast_shadows";
    if (n < 0 || (n > 0 && (!w || !ws)))
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: %d weights, arrays %s", op, n,
                            n < 0 ? "(n < 0)" : "NULL");
    if (dt != LUCID_F32 && dt != LUCID_BF16 && dt != LUCID_F16)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: activation dtype %s (expected f32, bf16 or f16)", op,
                            lucid_dtype_name(dt));
    for (int i = 0; i < n; i++) {
        if (!w[i] || !ws[i])
            return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: entry %d: %s is NULL", op, i,
                                !w[i] ? "weight" : "shadow");
        LUCID_TRY(chk(ctx, op, "weight", w[i], -1, w[0]));
        if (w[i]->dtype != LUCID_F32)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "%s: weight %d has dtype %s; device weights are f32", op,
                                i, lucid_dtype_name(w[i]->dtype));
    }
    if (n == 0 || dt == LUCID_F32 || lucid_tensor_device(w[0]).type == LUCID_CPU)
        return LUCID_OK;
    KT(ctx, w[0]);
    if (!kt_->conv2d_cast_shadows) return LUCID_OK;
    return kt_->conv2d_cast_shadows(ctx, w, ws, n, dt);
}

/* The parameter gradients with an optional column cache (nn.h; used only
 * when the table has the slot). */
static lucid_status conv_bwd_params(lucid_ctx *ctx, const lucid_tensor *x,
                                    const lucid_tensor *dy, lucid_tensor *dw,
                                    lucid_tensor *db, const lucid_conv2d_params *p,
                                    double beta, lucid_conv_wcols *wc) {
    const char *op = "conv2d_backward_params";
    if (!dw && !db)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: grad_weight and grad_bias are both NULL", op);
    int64_t ys[4];
    if (dw) {
        LUCID_TRY(chk_conv(ctx, op, x, dw, p, ys));
    } else {
        /* bias only: a 1x1 stand-in gives C_out; the spatial check uses dy */
        LUCID_TRY(chk(ctx, op, "x", x, 4, NULL));
        LUCID_TRY(chk_act(ctx, op, "x", x, NULL));
        LUCID_TRY(chk(ctx, op, "grad_output", dy, 4, x));
        ys[0] = x->shape[0]; ys[1] = dy->shape[1];
        ys[2] = dy->shape[2]; ys[3] = dy->shape[3];
        if (!p || p->groups < 1 || x->shape[1] % p->groups ||
            dy->shape[1] % p->groups)
            return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: bad groups", op);
    }
    LUCID_TRY(chk(ctx, op, "grad_output", dy, 4, x));
    LUCID_TRY(chk_act(ctx, op, "grad_output", dy, x));
    LUCID_TRY(chk_shape(ctx, op, "grad_output", dy, 4, ys));
    if (dw) LUCID_TRY(chk(ctx, op, "grad_weight", dw, 4, x));
    if (db) {
        LUCID_TRY(chk(ctx, op, "grad_bias", db, 1, x));
        LUCID_TRY(chk_param(ctx, op, "grad_bias", db));
        LUCID_TRY(chk_shape(ctx, op, "grad_bias", db, 1, &ys[1]));
    }
    KT(ctx, x);
    if (wc && dw && kt_->conv2d_forward_cols && kt_->conv2d_backward_params_cols)
        LUCID_TRY(kt_->conv2d_backward_params_cols(ctx, x, dy, dw, db, p, beta, wc));
    else
        LUCID_TRY(kt_->conv2d_backward_params(ctx, x, dy, dw, db, p, beta));
    bump(dw);
    bump(db);
    return LUCID_OK;
}

lucid_status lucid_nn_conv2d_backward_params(lucid_ctx *ctx,
                                             const lucid_tensor *x,
                                             const lucid_tensor *dy,
                                             lucid_tensor *dw, lucid_tensor *db,
                                             const lucid_conv2d_params *p,
                                             double beta) {
    return conv_bwd_params(ctx, x, dy, dw, db, p, beta, NULL);
}

lucid_status lucid_nn_conv2d_backward_params_cols(lucid_ctx *ctx, const lucid_tensor *x,
                                                  const lucid_tensor *dy, lucid_tensor *dw,
                                                  lucid_tensor *db,
                                                  const lucid_conv2d_params *p,
                                                  double beta, lucid_conv_wcols *wc) {
    return conv_bwd_params(ctx, x, dy, dw, db, p, beta, wc);
}

// ----------------------------------------------------------------------------
// BatchNorm2d

static lucid_status chk_chan(lucid_ctx *ctx, const char *op, const char *arg,
                             const lucid_tensor *t, const lucid_tensor *x) {
    LUCID_TRY(chk(ctx, op, arg, t, 1, x));
    LUCID_TRY(chk_param(ctx, op, arg, t));
    return chk_shape(ctx, op, arg, t, 1, &x->shape[1]);
}

/* The argument checks of the BatchNorm2d forward (plain and fused). */
static lucid_status chk_bn_forward(
    lucid_ctx *ctx, const char *op, const lucid_tensor *x, lucid_tensor *y,
    const lucid_tensor *weight, const lucid_tensor *bias,
    lucid_tensor *running_mean, lucid_tensor *running_var,
    lucid_tensor *num_batches_tracked, lucid_tensor *save_mean,
    lucid_tensor *save_invstd, int training, double momentum, double eps) {
    LUCID_TRY(chk(ctx, op, "x", x, 4, NULL));
    LUCID_TRY(chk_act(ctx, op, "x", x, NULL));
    LUCID_TRY(chk(ctx, op, "y", y, 4, x));
    LUCID_TRY(chk_act(ctx, op, "y", y, x));
    LUCID_TRY(chk_shape(ctx, op, "y", y, 4, x->shape));
    if (weight) LUCID_TRY(chk_chan(ctx, op, "weight", weight, x));
    if (bias) LUCID_TRY(chk_chan(ctx, op, "bias", bias, x));
    if (running_mean) LUCID_TRY(chk_chan(ctx, op, "running_mean", running_mean, x));
    if (running_var) LUCID_TRY(chk_chan(ctx, op, "running_var", running_var, x));
    LUCID_TRY(chk_chan(ctx, op, "save_mean", save_mean, x));
    LUCID_TRY(chk_chan(ctx, op, "save_invstd", save_invstd, x));
    if (num_batches_tracked) {
        if (!same_dev(num_batches_tracked, x))
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "%s: num_batches_tracked is on another device",
                                op);
        if (lucid_tensor_numel(num_batches_tracked) != 1)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "%s: num_batches_tracked must have one element",
                                op);
    }
    if (!training && (!running_mean || !running_var))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: eval mode needs running_mean and running_var",
                            op);
    int64_t M = x->shape[0] * x->shape[2] * x->shape[3];
    if (training && M < 2)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: expected more than 1 value per channel when "
                            "training, got input %lldx%lldx%lldx%lld",
                            op, (long long)x->shape[0], (long long)x->shape[1],
                            (long long)x->shape[2], (long long)x->shape[3]);
    if (!(eps > 0) || !(momentum >= 0 && momentum <= 1))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: need eps > 0 and momentum in [0, 1] (got %g, "
                            "%g)",
                            op, eps, momentum);
    return LUCID_OK;
}

/* The argument checks of the BatchNorm2d backward (plain and fused). */
static lucid_status chk_bn_backward(lucid_ctx *ctx, const char *op,
                                    const lucid_tensor *x,
                                    const lucid_tensor *dy,
                                    const lucid_tensor *dx,
                                    const lucid_tensor *weight,
                                    const lucid_tensor *save_mean,
                                    const lucid_tensor *save_invstd,
                                    const lucid_tensor *dweight,
                                    const lucid_tensor *dbias) {
    LUCID_TRY(chk(ctx, op, "x", x, 4, NULL));
    LUCID_TRY(chk_act(ctx, op, "x", x, NULL));
    LUCID_TRY(chk(ctx, op, "grad_output", dy, 4, x));
    LUCID_TRY(chk_act(ctx, op, "grad_output", dy, x));
    LUCID_TRY(chk_shape(ctx, op, "grad_output", dy, 4, x->shape));
    if (dx) {
        LUCID_TRY(chk(ctx, op, "grad_input", dx, 4, x));
        LUCID_TRY(chk_act(ctx, op, "grad_input", dx, x));
        LUCID_TRY(chk_shape(ctx, op, "grad_input", dx, 4, x->shape));
    }
    if (weight) LUCID_TRY(chk_chan(ctx, op, "weight", weight, x));
    LUCID_TRY(chk_chan(ctx, op, "save_mean", save_mean, x));
    LUCID_TRY(chk_chan(ctx, op, "save_invstd", save_invstd, x));
    if (dweight) LUCID_TRY(chk_chan(ctx, op, "grad_weight", dweight, x));
    if (dbias) LUCID_TRY(chk_chan(ctx, op, "grad_bias", dbias, x));
    return LUCID_OK;
}

static lucid_status no_fused(lucid_ctx *ctx, const char *op,
                             const lucid_nn_kernels *k) {
    return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                        "%s: the %s kernel table has no fused BatchNorm2d+SiLU "
                        "(use batchnorm2d then silu)",
                        op, k->name);
}

/* The BatchNorm2d forward, plain or (silu) fused with SiLU: the checks, the
 * kernel of x's device table, the version bumps of what it wrote. */
static lucid_status bn_forward_entry(
    lucid_ctx *ctx, const char *op, int silu, const lucid_tensor *x,
    lucid_tensor *y, const lucid_tensor *weight, const lucid_tensor *bias,
    lucid_tensor *running_mean, lucid_tensor *running_var,
    lucid_tensor *num_batches_tracked, lucid_tensor *save_mean,
    lucid_tensor *save_invstd, int training, double momentum, double eps) {
    LUCID_TRY(chk_bn_forward(ctx, op, x, y, weight, bias, running_mean,
                             running_var, num_batches_tracked, save_mean,
                             save_invstd, training, momentum, eps));
    KT(ctx, x);
    if (silu && !kt_->batchnorm2d_silu_forward) return no_fused(ctx, op, kt_);
    LUCID_TRY((silu ? kt_->batchnorm2d_silu_forward : kt_->batchnorm2d_forward)(
        ctx, x, y, weight, bias, running_mean, running_var, num_batches_tracked,
        save_mean, save_invstd, training, momentum, eps));
    bump(y);
    bump(save_mean);
    bump(save_invstd);
    if (training) {
        bump(running_mean);
        bump(running_var);
        bump(num_batches_tracked);
    }
    return LUCID_OK;
}

/* The BatchNorm2d backward, plain (bias NULL) or (silu) fused with SiLU:
 * the checks, the kernel of x's device table (none for an empty x), the
 * version bumps of what it wrote. */
static lucid_status bn_backward_entry(
    lucid_ctx *ctx, const char *op, int silu, const lucid_tensor *x,
    const lucid_tensor *dy, lucid_tensor *dx, const lucid_tensor *weight,
    const lucid_tensor *bias, const lucid_tensor *save_mean,
    const lucid_tensor *save_invstd, lucid_tensor *dweight,
    lucid_tensor *dbias, int training, double beta_input,
    double beta_params, lucid_conv_dcols *dc) {
    if (dc) dc->filled = 0;
    LUCID_TRY(chk_bn_backward(ctx, op, x, dy, dx, weight, save_mean,
                              save_invstd, dweight, dbias));
    if (bias) LUCID_TRY(chk_chan(ctx, op, "bias", bias, x));
    KT(ctx, x);
    if (silu && !kt_->batchnorm2d_silu_backward) return no_fused(ctx, op, kt_);
    if (lucid_tensor_numel(x) == 0) return LUCID_OK;
    if (dc && dc->armed && dx && kt_->batchnorm2d_backward_dcols)
        LUCID_TRY(kt_->batchnorm2d_backward_dcols(ctx, x, dy, dx, weight, bias, save_mean,
                                                  save_invstd, dweight, dbias, training,
                                                  beta_input, beta_params, silu, dc));
    else if (silu)
        LUCID_TRY(kt_->batchnorm2d_silu_backward(ctx, x, dy, dx, weight, bias,
                                                 save_mean, save_invstd,
                                                 dweight, dbias, training,
                                                 beta_input, beta_params));
    else
        LUCID_TRY(kt_->batchnorm2d_backward(ctx, x, dy, dx, weight, save_mean,
                                            save_invstd, dweight, dbias,
                                            training, beta_input,
                                            beta_params));
    bump(dx);
    bump(dweight);
    bump(dbias);
    return LUCID_OK;
}

lucid_status lucid_nn_batchnorm2d_forward(
    lucid_ctx *ctx, const lucid_tensor *x, lucid_tensor *y,
    const lucid_tensor *weight, const lucid_tensor *bias,
    lucid_tensor *running_mean, lucid_tensor *running_var,
    lucid_tensor *num_batches_tracked, lucid_tensor *save_mean,
    lucid_tensor *save_invstd, int training, double momentum, double eps) {
    return bn_forward_entry(ctx, "batchnorm2d_forward", 0, x, y, weight, bias,
                            running_mean, running_var, num_batches_tracked,
                            save_mean, save_invstd, training, momentum, eps);
}

lucid_status lucid_nn_batchnorm2d_backward(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, const lucid_tensor *weight,
    const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
    lucid_tensor *dweight, lucid_tensor *dbias, int training,
    double beta_input, double beta_params) {
    return bn_backward_entry(ctx, "batchnorm2d_backward", 0, x, dy, dx, weight,
                             NULL, save_mean, save_invstd, dweight, dbias,
                             training, beta_input, beta_params, NULL);
}

lucid_status lucid_nn_batchnorm2d_backward_dcols(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, const lucid_tensor *weight, const lucid_tensor *bias,
    const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
    lucid_tensor *dweight, lucid_tensor *dbias, int training,
    double beta_input, double beta_params, int silu, lucid_conv_dcols *dc) {
    return bn_backward_entry(ctx, silu ? "batchnorm2d_silu_backward" : "batchnorm2d_backward",
                             silu ? 1 : 0, x, dy, dx, weight, silu ? bias : NULL, save_mean,
                             save_invstd, dweight, dbias, training, beta_input, beta_params,
                             dc);
}

// ----------------------------------------------------------------------------
// BatchNorm2d + SiLU (fused)

lucid_status lucid_nn_batchnorm2d_silu_forward(
    lucid_ctx *ctx, const lucid_tensor *x, lucid_tensor *y,
    const lucid_tensor *weight, const lucid_tensor *bias,
    lucid_tensor *running_mean, lucid_tensor *running_var,
    lucid_tensor *num_batches_tracked, lucid_tensor *save_mean,
    lucid_tensor *save_invstd, int training, double momentum, double eps) {
    return bn_forward_entry(ctx, "batchnorm2d_silu_forward", 1, x, y, weight,
                            bias, running_mean, running_var,
                            num_batches_tracked, save_mean, save_invstd,
                            training, momentum, eps);
}

lucid_status lucid_nn_batchnorm2d_silu_backward(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, const lucid_tensor *weight, const lucid_tensor *bias,
    const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
    lucid_tensor *dweight, lucid_tensor *dbias, int training,
    double beta_input, double beta_params) {
    return bn_backward_entry(ctx, "batchnorm2d_silu_backward", 1, x, dy, dx,
                             weight, bias, save_mean, save_invstd, dweight,
                             dbias, training, beta_input, beta_params, NULL);
}

// ----------------------------------------------------------------------------
// BatchNorm2d backward reading dy as a sum of terms (nn.h)

static int cc_overlap(const lucid_tensor *a, int64_t a0, const lucid_tensor *b,
                      int64_t b0, int64_t nch_a, int64_t nch_b);

/* LUCID_BN_DY_TERMS: "0" = never taken; read once per process.  The
 * override (a test hook) wins while it is >= 0. */
static int dy_terms_env = -1, dy_terms_override = -1;

int lucid_nn_bn_dy_terms_override(int mode) {
    int prev = dy_terms_override;
    dy_terms_override = mode < 0 ? -1 : mode != 0;
    return prev;
}

int lucid_nn_bn_dy_terms_on(void) {
    if (dy_terms_override >= 0) return dy_terms_override;
    return !lucid_env_zero("LUCID_BN_DY_TERMS", &dy_terms_env);
}

/* Source k (0: src, then the addends) of piece p and its first channel. */
static const lucid_tensor *terms_src(const lucid_chan_piece *p, int k, int64_t *c0) {
    *c0 = k ? p->add_c0[k - 1] : p->src_c0;
    return k ? p->add[k - 1] : p->src;
}

/* The checks of the pieces of a gradient description against x (dy's
 * shape) and dx (nullable). */
static lucid_status chk_terms(lucid_ctx *ctx, const char *op, const lucid_tensor *x, int n,
                              const lucid_chan_piece *pieces, const lucid_tensor *dx) {
    if (n < 1 || !pieces)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: expected 1 or more pieces, got %d%s", op,
                            n, pieces ? "" : " (pieces NULL)");
    int64_t next = 0;
    for (int i = 0; i < n; i++) {
        const lucid_chan_piece *p = &pieces[i];
        if (p->dst)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "%s: piece %d has a dst (a gradient description has none: "
                                "dst_c0 is the channel in dy)",
                                op, i);
        if (!p->src)
            return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: piece %d has no source", op, i);
        for (int k = 1; k < LUCID_CHAN_SUM_MAX - 1; k++)
            if (p->add[k] && !p->add[k - 1])
                return lucid_seterr(ctx, LUCID_ERR_ARG,
                                    "%s: piece %d: addend %d follows a NULL addend (the list "
                                    "ends at the first NULL)",
                                    op, i, k);
        if (p->dst_c0 != next || p->nch < 1)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "%s: piece %d covers channels [%lld, %lld) of dy; expected "
                                "pieces tiling [0, %lld) in order (this one starting at %lld, "
                                "at least one channel)",
                                op, i, (long long)p->dst_c0, (long long)(p->dst_c0 + p->nch),
                                (long long)x->shape[1], (long long)next);
        next += p->nch;
        for (int k = 0; k < lucid_chan_piece_nsrc(p); k++) {
            int64_t c0;
            const lucid_tensor *t = terms_src(p, k, &c0);
            char arg[48];
            snprintf(arg, sizeof arg, "piece %d source %d", i, k);
            LUCID_TRY(chk(ctx, op, arg, t, 4, x));
            LUCID_TRY(chk_act(ctx, op, arg, t, x));
            if (t->shape[0] != x->shape[0] || t->shape[2] != x->shape[2] ||
                t->shape[3] != x->shape[3]) {
                char a[128], b[128];
                return lucid_seterr(ctx, LUCID_ERR_ARG,
                                    "%s: %s has shape %s; expected [%lld,*,%lld,%lld] "
                                    "like the input %s",
                                    op, arg, lucid_shape_str(t->ndim, t->shape, a, sizeof a),
                                    (long long)x->shape[0], (long long)x->shape[2],
                                    (long long)x->shape[3],
                                    lucid_shape_str(x->ndim, x->shape, b, sizeof b));
            }
            if (c0 < 0 || c0 + p->nch > t->shape[1])
                return lucid_seterr(ctx, LUCID_ERR_ARG,
                                    "%s: %s: channels [%lld, %lld) out of range (%lld)", op,
                                    arg, (long long)c0, (long long)(c0 + p->nch),
                                    (long long)t->shape[1]);
            if (dx && cc_overlap(dx, 0, t, c0, dx->shape[1], p->nch))
                return lucid_seterr(ctx, LUCID_ERR_ARG,
                                    "%s: grad_input may overlap %s (the kernel reads dy "
                                    "while it writes dx)",
                                    op, arg);
        }
    }
    if (next != x->shape[1])
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: the pieces cover channels [0, %lld) of dy; expected [0, %lld)",
                            op, (long long)next, (long long)x->shape[1]);
    return LUCID_OK;
}

lucid_status lucid_nn_batchnorm2d_backward_terms(
    lucid_ctx *ctx, const lucid_tensor *x, int n, const lucid_chan_piece *pieces,
    lucid_tensor *dx, const lucid_tensor *weight, const lucid_tensor *bias,
    const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
    lucid_tensor *dweight, lucid_tensor *dbias, int training, double beta_input,
    double beta_params, int silu, int *taken) {
    const char *op = silu ? "batchnorm2d_silu_backward (dy as terms)"
                          : "batchnorm2d_backward (dy as terms)";
    if (!taken) return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: taken is NULL", op);
    *taken = 0;
    LUCID_TRY(chk(ctx, op, "x", x, 4, NULL));
    LUCID_TRY(chk_act(ctx, op, "x", x, NULL));
    LUCID_TRY(chk_terms(ctx, op, x, n, pieces, dx));
    /* the plain backward's checks, with a source standing in for dy (the
     * shape and dtype rules of dy are the pieces' above) */
    LUCID_TRY(chk_bn_backward(ctx, op, x, x, dx, weight, save_mean, save_invstd, dweight,
                              dbias));
    if (silu && bias) LUCID_TRY(chk_chan(ctx, op, "bias", bias, x));
    KT(ctx, x);
    if (!kt_->batchnorm2d_backward_terms || !lucid_nn_bn_dy_terms_on() || !training || !dx ||
        n > LUCID_BN_TERMS_PIECES || lucid_tensor_numel(x) == 0)
        return LUCID_OK;
    LUCID_TRY(kt_->batchnorm2d_backward_terms(ctx, x, n, pieces, dx, weight,
                                              silu ? bias : NULL, save_mean, save_invstd,
                                              dweight, dbias, beta_input, beta_params, silu,
                                              taken));
    if (*taken) {
        bump(dx);
        bump(dweight);
        bump(dbias);
    }
    return LUCID_OK;
}

lucid_status lucid_nn_batchnorm2d_terms_fit(lucid_ctx *ctx, const lucid_tensor *x,
                                            int training, int *fit) {
    const char *op = "batchnorm2d_terms_fit";
    if (!fit) return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: fit is NULL", op);
    *fit = 0;
    LUCID_TRY(chk(ctx, op, "x", x, 4, NULL));
    LUCID_TRY(chk_act(ctx, op, "x", x, NULL));
    KT(ctx, x);
    if (!kt_->batchnorm2d_backward_terms || !lucid_nn_bn_dy_terms_on() || !training ||
        lucid_tensor_numel(x) == 0)
        return LUCID_OK;
    return kt_->batchnorm2d_backward_terms(ctx, x, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                           NULL, 0.0, 0.0, 0, fit);
}

// ----------------------------------------------------------------------------
// SiLU

static lucid_status chk_same(lucid_ctx *ctx, const char *op, const char *arg,
                             const lucid_tensor *t, const lucid_tensor *x) {
    LUCID_TRY(chk(ctx, op, arg, t, x->ndim, x));
    LUCID_TRY(chk_act(ctx, op, arg, t, x));
    return chk_shape(ctx, op, arg, t, x->ndim, x->shape);
}

lucid_status lucid_nn_silu_forward(lucid_ctx *ctx, const lucid_tensor *x,
                                   lucid_tensor *y) {
    const char *op = "silu_forward";
    LUCID_TRY(chk(ctx, op, "x", x, -1, NULL));
    LUCID_TRY(chk_act(ctx, op, "x", x, NULL));
    LUCID_TRY(chk_same(ctx, op, "y", y, x));
    KT(ctx, x);
    if (lucid_tensor_numel(x) == 0) return LUCID_OK;
    LUCID_TRY(kt_->silu_forward(ctx, x, y));
    bump(y);
    return LUCID_OK;
}

lucid_status lucid_nn_silu_backward(lucid_ctx *ctx, const lucid_tensor *x,
                                    const lucid_tensor *dy, lucid_tensor *dx,
                                    double beta) {
    const char *op = "silu_backward";
    LUCID_TRY(chk(ctx, op, "x", x, -1, NULL));
    LUCID_TRY(chk_act(ctx, op, "x", x, NULL));
    LUCID_TRY(chk_same(ctx, op, "grad_output", dy, x));
    LUCID_TRY(chk_same(ctx, op, "grad_input", dx, x));
    KT(ctx, x);
    if (lucid_tensor_numel(x) == 0) return LUCID_OK;
    LUCID_TRY(kt_->silu_backward(ctx, x, dy, dx, beta));
    bump(dx);
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// MaxPool2d

static lucid_status chk_pool(lucid_ctx *ctx, const char *op,
                             const lucid_tensor *x,
                             const lucid_pool2d_params *p, int64_t ys[4]) {
    LUCID_TRY(chk(ctx, op, "x", x, 4, NULL));
    LUCID_TRY(chk_act(ctx, op, "x", x, NULL));
    if (!p) return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: params is NULL", op);
    if (p->kernel_h < 1 || p->kernel_w < 1 || p->stride_h < 1 ||
        p->stride_w < 1 || p->pad_h < 0 || p->pad_w < 0 ||
        2 * p->pad_h > p->kernel_h || 2 * p->pad_w > p->kernel_w)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: need kernel, stride >= 1 and 0 <= pad <= "
                            "kernel/2 (kernel %dx%d stride %dx%d pad %dx%d)",
                            op, p->kernel_h, p->kernel_w, p->stride_h,
                            p->stride_w, p->pad_h, p->pad_w);
    ys[0] = x->shape[0];
    ys[1] = x->shape[1];
    ys[2] = lucid_nn_conv_out_size(x->shape[2], p->kernel_h, p->stride_h, p->pad_h, 1);
    ys[3] = lucid_nn_conv_out_size(x->shape[3], p->kernel_w, p->stride_w, p->pad_w, 1);
    if (ys[2] < 1 || ys[3] < 1)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: input %lldx%lld too small for kernel %dx%d",
                            op, (long long)x->shape[2], (long long)x->shape[3],
                            p->kernel_h, p->kernel_w);
    if (x->shape[2] * x->shape[3] > INT32_MAX)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: plane too large for i32 "
                            "indices", op);
    return LUCID_OK;
}

static lucid_status chk_indices(lucid_ctx *ctx, const char *op,
                                const lucid_tensor *idx, const lucid_tensor *x,
                                const int64_t ys[4]) {
    LUCID_TRY(chk(ctx, op, "indices", idx, 4, x));
    if (idx->dtype != LUCID_I32)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: indices must be i32, is %s",
                            op, lucid_dtype_name(idx->dtype));
    return chk_shape(ctx, op, "indices", idx, 4, ys);
}

lucid_status lucid_nn_maxpool2d_forward(lucid_ctx *ctx, const lucid_tensor *x,
                                        lucid_tensor *y, lucid_tensor *indices,
                                        const lucid_pool2d_params *p) {
    const char *op = "maxpool2d_forward";
    int64_t ys[4];
    LUCID_TRY(chk_pool(ctx, op, x, p, ys));
    LUCID_TRY(chk(ctx, op, "y", y, 4, x));
    LUCID_TRY(chk_act(ctx, op, "y", y, x));
    LUCID_TRY(chk_shape(ctx, op, "y", y, 4, ys));
    if (indices) LUCID_TRY(chk_indices(ctx, op, indices, x, ys));
    KT(ctx, x);
    if (lucid_tensor_numel(y) == 0) return LUCID_OK;
    LUCID_TRY(kt_->maxpool2d_forward(ctx, x, y, indices, p));
    bump(y);
    bump(indices);
    return LUCID_OK;
}

lucid_status lucid_nn_maxpool2d_backward(lucid_ctx *ctx, const lucid_tensor *x,
                                         const lucid_tensor *dy,
                                         lucid_tensor *dx,
                                         const lucid_tensor *indices,
                                         const lucid_pool2d_params *p,
                                         double beta) {
    const char *op = "maxpool2d_backward";
    int64_t ys[4];
    LUCID_TRY(chk_pool(ctx, op, x, p, ys));
    LUCID_TRY(chk(ctx, op, "grad_output", dy, 4, x));
    LUCID_TRY(chk_act(ctx, op, "grad_output", dy, x));
    LUCID_TRY(chk_shape(ctx, op, "grad_output", dy, 4, ys));
    LUCID_TRY(chk_same(ctx, op, "grad_input", dx, x));
    if (indices) LUCID_TRY(chk_indices(ctx, op, indices, x, ys));
    KT(ctx, x);
    if (lucid_tensor_numel(x) == 0) return LUCID_OK;
    LUCID_TRY(kt_->maxpool2d_backward(ctx, x, dy, dx, indices, p, beta));
    bump(dx);
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// Upsample

lucid_status lucid_nn_upsample_nearest2d_forward(lucid_ctx *ctx,
                                                 const lucid_tensor *x,
                                                 lucid_tensor *y, int scale) {
    const char *op = "upsample_nearest2d_forward";
    LUCID_TRY(chk(ctx, op, "x", x, 4, NULL));
    LUCID_TRY(chk_act(ctx, op, "x", x, NULL));
    if (scale < 1)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: scale %d < 1", op, scale);
    int64_t ys[4] = {x->shape[0], x->shape[1], x->shape[2] * scale,
                     x->shape[3] * scale};
    LUCID_TRY(chk(ctx, op, "y", y, 4, x));
    LUCID_TRY(chk_act(ctx, op, "y", y, x));
    LUCID_TRY(chk_shape(ctx, op, "y", y, 4, ys));
    KT(ctx, x);
    if (lucid_tensor_numel(y) == 0) return LUCID_OK;
    LUCID_TRY(kt_->upsample_nearest2d_forward(ctx, x, y, scale));
    bump(y);
    return LUCID_OK;
}

lucid_status lucid_nn_upsample_nearest2d_backward(lucid_ctx *ctx,
                                                  const lucid_tensor *x,
                                                  const lucid_tensor *dy,
                                                  lucid_tensor *dx, int scale,
                                                  double beta) {
    const char *op = "upsample_nearest2d_backward";
    LUCID_TRY(chk(ctx, op, "x", x, 4, NULL));
    LUCID_TRY(chk_act(ctx, op, "x", x, NULL));
    if (scale < 1)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: scale %d < 1", op, scale);
    int64_t ys[4] = {x->shape[0], x->shape[1], x->shape[2] * scale,
                     x->shape[3] * scale};
    LUCID_TRY(chk(ctx, op, "grad_output", dy, 4, x));
    LUCID_TRY(chk_act(ctx, op, "grad_output", dy, x));
    LUCID_TRY(chk_shape(ctx, op, "grad_output", dy, 4, ys));
    LUCID_TRY(chk_same(ctx, op, "grad_input", dx, x));
    KT(ctx, x);
    if (lucid_tensor_numel(x) == 0) return LUCID_OK;
    LUCID_TRY(kt_->upsample_nearest2d_backward(ctx, x, dy, dx, scale, beta));
    bump(dx);
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// channel copy, Add

lucid_status lucid_nn_channel_copy(lucid_ctx *ctx, lucid_tensor *dst,
                                   int64_t dst_c0, const lucid_tensor *src,
                                   int64_t src_c0, int64_t nch, double beta) {
    const char *op = "channel_copy";
    LUCID_TRY(chk(ctx, op, "src", src, -1, NULL));
    LUCID_TRY(chk_act(ctx, op, "src", src, NULL));
    LUCID_TRY(chk(ctx, op, "dst", dst, src->ndim, src));
    LUCID_TRY(chk_act(ctx, op, "dst", dst, NULL));
    if (src->ndim < 2)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: need rank >= 2 (N, C, ...)",
                            op);
    int ok = dst->shape[0] == src->shape[0];
    for (int i = 2; ok && i < src->ndim; i++) ok = dst->shape[i] == src->shape[i];
    if (!ok) {
        char a[128], b[128];
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: dst %s and src %s differ outside dim 1", op,
                            lucid_shape_str(dst->ndim, dst->shape, a, sizeof a),
                            lucid_shape_str(src->ndim, src->shape, b, sizeof b));
    }
    if (nch < 0 || dst_c0 < 0 || src_c0 < 0 || dst_c0 + nch > dst->shape[1] ||
        src_c0 + nch > src->shape[1])
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: channels [%lld, %lld) of src (%lld) into "
                            "[%lld, %lld) of dst (%lld) out of range",
                            op, (long long)src_c0, (long long)(src_c0 + nch),
                            (long long)src->shape[1], (long long)dst_c0,
                            (long long)(dst_c0 + nch), (long long)dst->shape[1]);
    KT(ctx, src);
    if (nch == 0 || lucid_tensor_numel(dst) == 0) return LUCID_OK;
    LUCID_TRY(kt_->channel_copy(ctx, dst, dst_c0, src, src_c0, nch, beta));
    bump(dst);
    return LUCID_OK;
}

/* LUCID_CHAN_COPY_MULTI: "0" = piece by piece; read once per process.
 * The override (a test hook) wins while it is >= 0. */
static int cc_multi_env = -1, cc_multi_override = -1;

int lucid_nn_chan_copy_multi_override(int mode) {
    int prev = cc_multi_override;
    cc_multi_override = mode < 0 ? -1 : mode != 0;
    return prev;
}

int lucid_nn_chan_copy_multi_on(void) {
    if (cc_multi_override >= 0) return cc_multi_override;
    return !lucid_env_zero("LUCID_CHAN_COPY_MULTI", &cc_multi_env);
}

/* 1 when channels [a0, a0+nch_a) of a and [b0, b0+nch_b) of b may share
 * memory: exact for two views of one layout (same storage, same first
 * element, same channel count: the channel ranges intersect), else
 * conservative (same storage and the tensors' whole extents intersect). */
static int cc_overlap(const lucid_tensor *a, int64_t a0, const lucid_tensor *b,
                      int64_t b0, int64_t nch_a, int64_t nch_b) {
    if (a->storage != b->storage || nch_a == 0 || nch_b == 0) return 0;
    if (lucid_tensor_data(a) == lucid_tensor_data(b) && a->shape[1] == b->shape[1])
        return a0 < b0 + nch_b && b0 < a0 + nch_a; /* one layout: channels */
    uintptr_t pa = (uintptr_t)lucid_tensor_data(a), pb = (uintptr_t)lucid_tensor_data(b);
    uintptr_t ea = pa + (uintptr_t)lucid_tensor_numel(a) * lucid_dtype_size(a->dtype);
    uintptr_t eb = pb + (uintptr_t)lucid_tensor_numel(b) * lucid_dtype_size(b->dtype);
    return pa < eb && pb < ea;
}

/* The reference route: one lucid_nn_channel_copy per copy piece (then one
 * beta-1 lucid_nn_channel_copy per addend of a sum piece: dst = 1*dst +
 * addend, one rounding per addition as a:add(b)), a lucid_fill(0) of the
 * narrowed dst per zero piece. */
static lucid_status cc_multi_each(lucid_ctx *ctx, int n, const lucid_chan_piece *pc) {
    for (int i = 0; i < n; i++) {
        const lucid_chan_piece *p = &pc[i];
        if (p->src) {
            LUCID_TRY(lucid_nn_channel_copy(ctx, p->dst, p->dst_c0, p->src,
                                            p->src_c0, p->nch, 0.0));
            for (int k = 1; k < lucid_chan_piece_nsrc(p); k++)
                LUCID_TRY(lucid_nn_channel_copy(ctx, p->dst, p->dst_c0, p->add[k - 1],
                                                p->add_c0[k - 1], p->nch, 1.0));
        } else if (p->nch > 0) {
            lucid_tensor *v = NULL;
            LUCID_TRY(lucid_tensor_narrow(ctx, p->dst, 1, p->dst_c0, p->nch, &v));
            lucid_status st = lucid_fill(ctx, v, 0.0);
            lucid_tensor_release(v);
            LUCID_TRY(st);
        }
    }
    return LUCID_OK;
}

/* One tensor of a piece against the reference (piece 0's dst; NULL for
 * piece 0's dst itself); dtype: ref's (dst) or any float (src). */
static lucid_status cc_multi_chk(lucid_ctx *ctx, const char *op, int i,
                                 const char *role, const lucid_tensor *t,
                                 const lucid_tensor *ref, int same_dtype) {
    char arg[48];
    snprintf(arg, sizeof arg, "piece %d %s", i, role);
    LUCID_TRY(chk(ctx, op, arg, t, -1, ref));
    LUCID_TRY(chk_act(ctx, op, arg, t, same_dtype ? ref : NULL));
    if (t->ndim < 2)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: %s needs rank >= 2 (N, C, ...)",
                            op, arg);
    int ok = ref == NULL || (t->ndim == ref->ndim && t->shape[0] == ref->shape[0]);
    for (int d = 2; ok && ref && d < t->ndim; d++) ok = t->shape[d] == ref->shape[d];
    if (!ok) {
        char a[128], b[128];
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: %s %s and piece 0 dst %s differ outside dim 1",
                            op, arg, lucid_shape_str(t->ndim, t->shape, a, sizeof a),
                            lucid_shape_str(ref->ndim, ref->shape, b, sizeof b));
    }
    return LUCID_OK;
}

lucid_status lucid_nn_channel_copy_multi(lucid_ctx *ctx, int n,
                                         const lucid_chan_piece *pieces) {
    const char *op = "channel_copy_multi";
    if (n < 0 || n > LUCID_CHAN_PIECES_MAX)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: %d pieces (0..%d)", op, n,
                            LUCID_CHAN_PIECES_MAX);
    if (n == 0) return LUCID_OK;
    if (!pieces)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: pieces is NULL (n = %d)", op, n);
    const lucid_tensor *ref = pieces[0].dst;
    for (int i = 0; i < n; i++) {
        const lucid_chan_piece *p = &pieces[i];
        const int ns = lucid_chan_piece_nsrc(p);
        LUCID_TRY(cc_multi_chk(ctx, op, i, "dst", p->dst, i ? ref : NULL, 1));
        if (!p->src && p->add[0])
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "%s: piece %d has addends but no src (a sum needs a src)",
                                op, i);
        for (int k = 1; k < LUCID_CHAN_SUM_MAX - 1; k++)
            if (p->add[k] && !p->add[k - 1])
                return lucid_seterr(ctx, LUCID_ERR_ARG,
                                    "%s: piece %d: addend %d follows a NULL addend "
                                    "(the list ends at the first NULL)",
                                    op, i, k);
        if (p->src) LUCID_TRY(cc_multi_chk(ctx, op, i, "src", p->src, ref, ns > 1));
        for (int k = 1; k < ns; k++) {
            char role[24];
            snprintf(role, sizeof role, "addend %d", k - 1);
            LUCID_TRY(cc_multi_chk(ctx, op, i, role, p->add[k - 1], ref, 1));
            const lucid_tensor *a = p->add[k - 1];
            int64_t a0 = p->add_c0[k - 1];
            if (p->nch < 0 || a0 < 0 || a0 + p->nch > a->shape[1])
                return lucid_seterr(ctx, LUCID_ERR_ARG,
                                    "%s: piece %d: channels [%lld, %lld) of addend %d "
                                    "(%lld) out of range",
                                    op, i, (long long)a0, (long long)(a0 + p->nch), k - 1,
                                    (long long)a->shape[1]);
        }
        int64_t Cs = p->src ? p->src->shape[1] : 0, s0 = p->src ? p->src_c0 : 0;
        if (p->nch < 0 || p->dst_c0 < 0 || s0 < 0 || p->dst_c0 + p->nch > p->dst->shape[1] ||
            (p->src && s0 + p->nch > Cs)) {
            if (p->src)
                return lucid_seterr(ctx, LUCID_ERR_ARG,
                                    "%s: piece %d: channels [%lld, %lld) of src (%lld) "
                                    "into [%lld, %lld) of dst (%lld) out of range",
                                    op, i, (long long)s0, (long long)(s0 + p->nch),
                                    (long long)Cs, (long long)p->dst_c0,
                                    (long long)(p->dst_c0 + p->nch),
                                    (long long)p->dst->shape[1]);
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "%s: piece %d: zero fill of channels [%lld, %lld) "
                                "of dst (%lld) out of range",
                                op, i, (long long)p->dst_c0,
                                (long long)(p->dst_c0 + p->nch),
                                (long long)p->dst->shape[1]);
        }
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            const lucid_chan_piece *a = &pieces[i], *b = &pieces[j];
            const char *what = NULL;
            if (j > i && cc_overlap(a->dst, a->dst_c0, b->dst, b->dst_c0, a->nch, b->nch))
                what = "dst";
            else if (b->src &&
                     cc_overlap(a->dst, a->dst_c0, b->src, b->src_c0, a->nch, b->nch))
                what = "src";
            for (int k = 1; !what && k < lucid_chan_piece_nsrc(b); k++)
                if (cc_overlap(a->dst, a->dst_c0, b->add[k - 1], b->add_c0[k - 1], a->nch,
                               b->nch))
                    what = "addend";
            if (what)
                return lucid_seterr(ctx, LUCID_ERR_ARG,
                                    "%s: piece %d's dst may overlap piece %d's %s "
                                    "(pieces must not interfere)",
                                    op, i, j, what);
        }
    int64_t NS = ref->shape[0]; /* N * S: 0 makes every piece empty */
    for (int d = 2; d < ref->ndim; d++) NS *= ref->shape[d];
    if (NS == 0) return LUCID_OK;
    KT(ctx, ref);
    if (!lucid_nn_chan_copy_multi_on() || !kt_->channel_copy_multi)
        return cc_multi_each(ctx, n, pieces);
    lucid_chan_piece live[LUCID_CHAN_PIECES_MAX];
    int m = 0;
    for (int i = 0; i < n; i++) {
        const lucid_chan_piece *p = &pieces[i];
        if (p->nch == 0) continue;
        if (p->src && p->src->dtype != p->dst->dtype) /* a conversion (never a sum) */
            LUCID_TRY(lucid_nn_channel_copy(ctx, p->dst, p->dst_c0, p->src,
                                            p->src_c0, p->nch, 0.0));
        else
            live[m++] = *p;
    }
    if (m == 0) return LUCID_OK;
    LUCID_TRY(kt_->channel_copy_multi(ctx, m, live));
    for (int i = 0; i < m; i++) bump(live[i].dst);
    return LUCID_OK;
}

lucid_status lucid_nn_add_n(lucid_ctx *ctx, int n, const lucid_tensor *const *x,
                            lucid_tensor *y) {
    const char *op = "add_n";
    if (n < 1 || n > LUCID_CHAN_SUM_MAX)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: %d inputs (1..%d)", op, n,
                            LUCID_CHAN_SUM_MAX);
    if (!x) return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: x is NULL (n = %d)", op, n);
    LUCID_TRY(chk(ctx, op, "y", y, -1, NULL));
    LUCID_TRY(chk_act(ctx, op, "y", y, NULL));
    if (y->ndim < 2)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: need rank >= 2, y has %d", op,
                            y->ndim);
    /* inputs are named 1-based ("input 2 of 3"), so the message reads the
     * same from C and from the Lua binding's list */
    for (int i = 0; i < n; i++) {
        char arg[32];
        snprintf(arg, sizeof arg, "input %d of %d", i + 1, n);
        LUCID_TRY(chk_same(ctx, op, arg, x[i], y));
        if (cc_overlap(y, 0, x[i], 0, y->shape[1], y->shape[1]))
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "%s: the output may overlap input %d of %d (write the sum to "
                                "another tensor)",
                                op, i + 1, n);
    }
    lucid_chan_piece p = {.dst = y, .src = x[0], .nch = y->shape[1]};
    for (int i = 1; i < n; i++) p.add[i - 1] = x[i];
    return lucid_nn_channel_copy_multi(ctx, 1, &p);
}

lucid_status lucid_nn_add_forward(lucid_ctx *ctx, const lucid_tensor *a,
                                  const lucid_tensor *b, lucid_tensor *y) {
    const char *op = "add_forward";
    LUCID_TRY(chk(ctx, op, "a", a, -1, NULL));
    LUCID_TRY(chk_act(ctx, op, "a", a, NULL));
    LUCID_TRY(chk_same(ctx, op, "b", b, a));
    LUCID_TRY(chk_same(ctx, op, "y", y, a));
    KT(ctx, a);
    if (lucid_tensor_numel(y) == 0) return LUCID_OK;
    LUCID_TRY(kt_->add_forward(ctx, a, b, y));
    bump(y);
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// softmax

lucid_status lucid_nn_softmax_forward(lucid_ctx *ctx, const lucid_tensor *x,
                                      lucid_tensor *y) {
    const char *op = "softmax_forward";
    LUCID_TRY(chk(ctx, op, "x", x, -1, NULL));
    LUCID_TRY(chk_act(ctx, op, "x", x, NULL));
    LUCID_TRY(chk_same(ctx, op, "y", y, x));
    KT(ctx, x);
    if (lucid_tensor_numel(x) == 0) return LUCID_OK;
    LUCID_TRY(kt_->softmax_forward(ctx, x, y));
    bump(y);
    return LUCID_OK;
}

lucid_status lucid_nn_softmax_backward(lucid_ctx *ctx, const lucid_tensor *y,
                                       const lucid_tensor *dy,
                                       lucid_tensor *dx, double beta) {
    const char *op = "softmax_backward";
    LUCID_TRY(chk(ctx, op, "y", y, -1, NULL));
    LUCID_TRY(chk_act(ctx, op, "y", y, NULL));
    LUCID_TRY(chk_same(ctx, op, "grad_output", dy, y));
    LUCID_TRY(chk_same(ctx, op, "grad_input", dx, y));
    KT(ctx, y);
    if (lucid_tensor_numel(y) == 0) return LUCID_OK;
    LUCID_TRY(kt_->softmax_backward(ctx, y, dy, dx, beta));
    bump(dx);
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// DFL

static lucid_status chk_dfl(lucid_ctx *ctx, const char *op,
                            const lucid_tensor *x, int reg_max,
                            int64_t ys[LUCID_MAX_DIMS]) {
    LUCID_TRY(chk(ctx, op, "x", x, -1, NULL));
    LUCID_TRY(chk_act(ctx, op, "x", x, NULL));
    if (reg_max < 1 || x->ndim < 2 || x->shape[1] != 4 * (int64_t)reg_max)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: x must be [B, 4*reg_max, ...] with reg_max "
                            "%d, has %d dims and %lld channels",
                            op, reg_max, x->ndim,
                            (long long)(x->ndim > 1 ? x->shape[1] : 0));
    memcpy(ys, x->shape, sizeof(int64_t) * LUCID_MAX_DIMS);
    ys[1] = 4;
    return LUCID_OK;
}

lucid_status lucid_nn_dfl_forward(lucid_ctx *ctx, const lucid_tensor *x,
                                  lucid_tensor *y, int reg_max) {
    const char *op = "dfl_forward";
    int64_t ys[LUCID_MAX_DIMS];
    LUCID_TRY(chk_dfl(ctx, op, x, reg_max, ys));
    LUCID_TRY(chk(ctx, op, "y", y, x->ndim, x));
    LUCID_TRY(chk_act(ctx, op, "y", y, x));
    LUCID_TRY(chk_shape(ctx, op, "y", y, x->ndim, ys));
    KT(ctx, x);
    if (lucid_tensor_numel(y) == 0) return LUCID_OK;
    LUCID_TRY(kt_->dfl_forward(ctx, x, y, reg_max));
    bump(y);
    return LUCID_OK;
}

lucid_status lucid_nn_dfl_backward(lucid_ctx *ctx, const lucid_tensor *x,
                                   const lucid_tensor *dy, lucid_tensor *dx,
                                   int reg_max, double beta) {
    const char *op = "dfl_backward";
    int64_t ys[LUCID_MAX_DIMS];
    LUCID_TRY(chk_dfl(ctx, op, x, reg_max, ys));
    LUCID_TRY(chk(ctx, op, "grad_output", dy, x->ndim, x));
    LUCID_TRY(chk_act(ctx, op, "grad_output", dy, x));
    LUCID_TRY(chk_shape(ctx, op, "grad_output", dy, x->ndim, ys));
    LUCID_TRY(chk_same(ctx, op, "grad_input", dx, x));
    KT(ctx, x);
    if (lucid_tensor_numel(x) == 0) return LUCID_OK;
    LUCID_TRY(kt_->dfl_backward(ctx, x, dy, dx, reg_max, beta));
    bump(dx);
    return LUCID_OK;
}
