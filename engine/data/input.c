/*
 * input.c — lucid_input_prepare (contract in input.h): argument checks, the
 * dispatch to a device kernel table, and the CPU reference.
 *
 * The CPU reference walks the pixels of the batch in parallel ranges
 * (cpu_parallel_for); each range builds the HSV tables of the images it
 * touches (hsv_pixel.h, the code the loader uses), so the result does not
 * depend on the split. Values: a 256-entry table of v / 255 in x's dtype.
 */
#include "input.h"
#include "hsv_pixel.h"
#include "internal.h"
#include "cpu/cpu.h"

#include <string.h>

static int same_dev(lucid_device a, lucid_device b) {
    return a.type == b.type && a.index == b.index;
}

static const char *dev_name(lucid_device d) {
    return d.type == LUCID_CPU ? "cpu" : "cuda";
}

static lucid_status check_args(lucid_ctx *ctx, const lucid_tensor *x,
                               const lucid_tensor *images,
                               const lucid_tensor *hsv) {
    char s1[96], s2[96];
    if (!x || !images)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "input_prepare: x and images are required");
    if (images->dtype != LUCID_U8 || images->ndim != 4 || images->shape[1] != 3)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "input_prepare: images must be u8 [N,3,H,W], got "
                            "%s %s",
                            lucid_dtype_name(images->dtype),
                            lucid_shape_str(images->ndim, images->shape, s1,
                                            sizeof s1));
    if (!lucid_tensor_same_shape(x, images))
        return lucid_seterr(
            ctx, LUCID_ERR_ARG,
            "input_prepare: x %s must have the shape of images %s",
            lucid_shape_str(x->ndim, x->shape, s1, sizeof s1),
            lucid_shape_str(images->ndim, images->shape, s2, sizeof s2));
    lucid_device dev = lucid_tensor_device(x);
    int float_ok = x->dtype == LUCID_F32 || x->dtype == LUCID_BF16 ||
                   x->dtype == LUCID_F16 ||
                   (x->dtype == LUCID_F64 && dev.type == LUCID_CPU);
    if (!float_ok)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "input_prepare: x must be f32, bf16 or f16 (f64 "
                            "on the cpu), got %s on %s",
                            lucid_dtype_name(x->dtype), dev_name(dev));
    if (!lucid_tensor_is_contiguous(x) || !lucid_tensor_is_contiguous(images))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "input_prepare: %s must be contiguous",
                            lucid_tensor_is_contiguous(x) ? "images" : "x");
    if (!same_dev(lucid_tensor_device(images), dev))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "input_prepare: images on %s, x on %s (copy the "
                            "images to x's device first)",
                            dev_name(lucid_tensor_device(images)),
                            dev_name(dev));
    if (hsv) {
        if (hsv->dtype != LUCID_F32 || hsv->ndim != 2 ||
            hsv->shape[0] != images->shape[0] || hsv->shape[1] != 3)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "input_prepare: hsv must be f32 [%lld,3] (one "
                                "gain triple per image), got %s %s",
                                (long long)images->shape[0],
                                lucid_dtype_name(hsv->dtype),
                                lucid_shape_str(hsv->ndim, hsv->shape, s1,
                                                sizeof s1));
        if (!lucid_tensor_is_contiguous(hsv))
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "input_prepare: hsv must be contiguous");
        if (!same_dev(lucid_tensor_device(hsv), dev))
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "input_prepare: hsv on %s, x on %s",
                                dev_name(lucid_tensor_device(hsv)),
                                dev_name(dev));
    }
    return LUCID_OK;
}

/* ------------------------------------------------------------ CPU */

typedef struct cpu_job {
    const uint8_t *src;   /* [N,3,H,W] */
    const float *gains;   /* [N,3] or NULL */
    void *dst;
    lucid_dtype dt;
    int64_t plane;        /* H*W */
    union {
        float f32[256];
        uint16_t u16[256];
        double f64[256];
    } val;
} cpu_job;

static void cpu_range(void *arg, int64_t begin, int64_t end) {
    const cpu_job *j = arg;
    const int64_t P = j->plane;
    lucid_hsv_tables t;
    int64_t i = begin;
    while (i < end) {
        int64_t n = i / P, p0 = i % P;
        int64_t p1 = (n + 1) * P < end ? P : end - n * P;
        const uint8_t *s = j->src + n * 3 * P;
        const float *g = j->gains ? j->gains + n * 3 : NULL;
        int hsv = g && (g[0] != 0 || g[1] != 0 || g[2] != 0);
        if (hsv) lucid_hsv_tables_init(&t, g[0], g[1], g[2]);
        int64_t o = n * 3 * P;
        for (int64_t p = p0; p < p1; p++) {
            uint8_t c[3] = {s[p], s[P + p], s[2 * P + p]};
            if (hsv) lucid_hsv_pixel(&t, c[0], c[1], c[2], &c[0], &c[1], &c[2]);
            for (int k = 0; k < 3; k++) {
                int64_t q = o + k * P + p;
                switch (j->dt) {
                case LUCID_F32: ((float *)j->dst)[q] = j->val.f32[c[k]]; break;
                case LUCID_F64: ((double *)j->dst)[q] = j->val.f64[c[k]]; break;
                default: ((uint16_t *)j->dst)[q] = j->val.u16[c[k]]; break;
                }
            }
        }
        i = n * P + p1;
    }
}

static void cpu_prepare(lucid_ctx *ctx, lucid_tensor *x,
                        const lucid_tensor *images, const lucid_tensor *hsv) {
    cpu_job j;
    j.src = lucid_tensor_data(images);
    j.gains = hsv ? lucid_tensor_data(hsv) : NULL;
    j.dst = lucid_tensor_data(x);
    j.dt = x->dtype;
    j.plane = images->shape[2] * images->shape[3];
    for (int v = 0; v < 256; v++) {
        float f = (float)v / 255.0f;
        switch (j.dt) {
        case LUCID_F32: j.val.f32[v] = f; break;
        case LUCID_F64: j.val.f64[v] = v / 255.0; break;
        case LUCID_BF16: j.val.u16[v] = lucid_f32_to_bf16(f); break;
        default: j.val.u16[v] = lucid_f32_to_f16(f); break;
        }
    }
    cpu_parallel_for(ctx, images->shape[0] * j.plane, CPU_GRAIN, cpu_range, &j);
}

/* ------------------------------------------------------------ entry */

lucid_status lucid_input_prepare(lucid_ctx *ctx, lucid_tensor *x,
                                 const lucid_tensor *images,
                                 const lucid_tensor *hsv) {
    LUCID_TRY(check_args(ctx, x, images, hsv));
    lucid_device dev = lucid_tensor_device(x);
    if (dev.type == LUCID_CUDA) {
        const lucid_input_kernels *k = lucid_input_cuda_kernels();
        if (!k)
            return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                                "input_prepare: no input kernels for "
                                "cuda:%d in this build (built with CUDA=0?)",
                                dev.index);
        if (!same_dev(ctx->device, dev))
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "input_prepare: tensors on cuda:%d but the "
                                "context drives %s",
                                dev.index,
                                ctx->device.type == LUCID_CPU ? "the cpu"
                                                              : "another GPU");
        if (lucid_tensor_numel(x) > 0) LUCID_TRY(k->prepare(ctx, x, images, hsv));
    } else if (dev.type == LUCID_CPU) {
        if (lucid_tensor_numel(x) > 0) cpu_prepare(ctx, x, images, hsv);
    } else {
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "input_prepare: unsupported device");
    }
    lucid_storage_bump_version(x->storage);
    return LUCID_OK;
}
