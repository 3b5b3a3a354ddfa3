/*
 * loss_backend.h — private: the kernel table of the pose loss on a device
 * (engine/train/loss.c dispatches to it; cuda/loss.cu provides the CUDA one).
 *
 * Contract
 *   - loss.c keeps every argument check, the plan layout (plan_layout: the
 *     arrays of struct lucid_pose_loss_plan, as views into one storage) and
 *     the frozen/assigned bookkeeping. A plan on the CPU runs the reference
 *     phases inline (assigner.c, loss_box.c, loss_kpt.c, loss_cls.c); a plan
 *     on another device calls the table of that device, found with
 *     lucid_pose_loss_kernels_for().
 *   - The work storage of a device plan is the reference layout followed by
 *     a backend area of extra_bytes(plan) bytes: it starts at
 *     lucid_storage_nbytes(ws) - extra_bytes(plan) (64-byte aligned, since
 *     the layout and extra_bytes are multiples of 64). Nothing else is
 *     allocated: forward, backward and the work buffers come from the one
 *     storage made in plan_create through the context's allocator.
 *   - The "real" arrays of a device plan hold float (the f32 compute type of
 *     f32/bf16/f16 outputs; f64 outputs are CPU-only). scal stays double.
 *   - forward/backward only queue work on the context's compute stream:
 *     no host synchronisation, no allocation, no host read of device data,
 *     so both can be captured into a CUDA graph. Results are bitwise
 *     reproducible (fixed-order reductions, integer atomics only).
 *   - read_assignment copies back and synchronises (tests, debugging).
 *   - capture/time_calls are diagnostic hooks for the tests and the
 *     benchmark (which must build without CUDA headers): capture runs fn
 *     under stream capture of the context's compute stream (global mode),
 *     ends the capture, instantiates the graph and launches it `launches`
 *     times, then synchronises; time_calls runs fn `reps` times with an
 *     event pair on the stream around each call and writes the times (ms).
 *     Both return LUCID_OK or set the error in ctx.
 */
#ifndef LUCID_TRAIN_LOSS_BACKEND_H
#define LUCID_TRAIN_LOSS_BACKEND_H

#include "train/loss.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef lucid_status (*lucid_pose_loss_hook_fn)(void *arg);

typedef struct lucid_pose_loss_kernels {
    const char *name;
    /* Bytes of the backend area at the tail of the work storage. */
    size_t (*extra_bytes)(const lucid_pose_loss_plan *p);
    /* After the layout: zero the storage, fill anc [A*3] and sigmas [K]
     * (host values given, double) on the device. May synchronise. */
    lucid_status (*plan_init)(lucid_ctx *ctx, lucid_pose_loss_plan *p,
                              const double *anc_host,
                              const double *sigmas_host);
    /* Checked arguments (same dtype outputs, shapes, devices); targets
     * ignored when frozen. total/items may be NULL. */
    lucid_status (*forward)(lucid_ctx *ctx, lucid_pose_loss_plan *p,
                            const lucid_tensor *pred_box,
                            const lucid_tensor *pred_cls,
                            const lucid_tensor *pred_kpt,
                            const lucid_pose_targets *targets, int frozen,
                            lucid_tensor *total, lucid_tensor *items);
    lucid_status (*backward)(lucid_ctx *ctx, lucid_pose_loss_plan *p,
                             const lucid_tensor *pred_box,
                             const lucid_tensor *pred_cls,
                             const lucid_tensor *pred_kpt,
                             const lucid_tensor *grad_scale,
                             lucid_tensor *grad_box, lucid_tensor *grad_cls,
                             lucid_tensor *grad_kpt);
    lucid_status (*read_assignment)(lucid_ctx *ctx,
                                    const lucid_pose_loss_plan *p,
                                    int32_t *gt_index, double *score,
                                    double *n_fg, double *tss);
    /* diagnostics (see the top comment) */
    lucid_status (*capture)(lucid_ctx *ctx, lucid_pose_loss_hook_fn fn,
                            void *arg, int launches);
    lucid_status (*time_calls)(lucid_ctx *ctx, lucid_pose_loss_hook_fn fn,
                               void *arg, int reps, float *ms);
} lucid_pose_loss_kernels;

/* The CUDA table (cuda/loss.cu), or NULL in a build without CUDA
 * (engine/core/cuda_absent.c). */
const lucid_pose_loss_kernels *lucid_pose_loss_cuda_kernels(void);

/* Table of a device plan: NULL for the CPU (the inline reference), the CUDA
 * table for the context's CUDA device; else NULL with ERR_UNSUPPORTED /
 * ERR_ARG set in ctx (*err = 1). */
const lucid_pose_loss_kernels *lucid_pose_loss_kernels_for(lucid_ctx *ctx,
                                                           lucid_device dev,
                                                           int *err);

#ifdef __cplusplus
}
#endif
#endif /* LUCID_TRAIN_LOSS_BACKEND_H */
