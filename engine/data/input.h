/*
 * input.h — the network input of a loader batch in one pass, on the device
 * the tensors live on: u8 RGB images -> (optional RandomHSV) -> pixel / 255
 * in the activation dtype.
 *
 *   lucid_input_prepare(ctx, x, images, hsv)
 *     images  u8  [N, 3, H, W]  RGB planes (the loader's layout), contiguous
 *     hsv     f32 [N, 3]        per-image gains (r_h, r_s, r_v) or NULL
 *     x       f32 | bf16 | f16 (f64 too on the CPU) [N, 3, H, W], contiguous
 *
 * Contract
 *   - HSV (hsv != NULL): image n gets Ultralytics' RandomHSV with the gains
 *     hsv[n] exactly as the CPU loader applies them (engine/data/augment.c,
 *     sample.c): the same LUTs from the same f32 gains and the same integer
 *     RGB <-> HSV code (engine/data/hsv_pixel.h is shared by both), so a
 *     batch made with hsv_on_cpu = 0 and passed through here equals, byte
 *     for byte before the division, the batch made with hsv_on_cpu = 1.
 *     An image whose three gains are all exactly 0 is left as it is — what
 *     the loader does when augmentation or all HSV gains are off (and what
 *     its zero pad rows need). (A drawn gain triple of exactly (0, 0, 0)
 *     with non-zero hyper-parameters, probability ~2^-150, would be
 *     transformed by the CPU path and not here.)
 *   - x = v / 255 rounded once to x's dtype: f32 is the IEEE quotient
 *     (float)v / 255.0f; bf16/f16 round that f32 to nearest even, which is
 *     also the correctly rounded v/255 (v/255 is never near a bf16/f16 tie;
 *     spec/c/test_input.c checks all 256 values); f64 is v / 255.0.
 *   - CPU tensors: the reference (engine/data/input.c), threads over pixels.
 *     CUDA tensors (the context's device): one kernel queued on the
 *     compute stream — no host synchronisation, no allocation, no host read
 *     of device data — so it can be captured into a CUDA graph.
 *   - Errors (nothing written): ERR_ARG for a dtype, shape, contiguity or
 *     mixed-device problem (the message names the argument);
 *     ERR_UNSUPPORTED for CUDA tensors in a build without CUDA.
 *   - x's storage version is bumped (like every op's output).
 */
#ifndef LUCID_DATA_INPUT_H
#define LUCID_DATA_INPUT_H

#include "lucid.h"

#ifdef __cplusplus
extern "C" {
#endif

lucid_status lucid_input_prepare(lucid_ctx *ctx, lucid_tensor *x,
                                 const lucid_tensor *images,
                                 const lucid_tensor *hsv);

/* ------------------------------------------------- private: device tables
 * A device kernel table (cuda/input.cu provides the CUDA one). prepare gets
 * checked arguments: shapes as above, all contiguous, all on the context's
 * device, x's dtype f32/bf16/f16, N*H*W > 0. */
typedef struct lucid_input_kernels {
    const char *name;
    lucid_status (*prepare)(lucid_ctx *ctx, lucid_tensor *x,
                            const lucid_tensor *images,
                            const lucid_tensor *hsv);
} lucid_input_kernels;

/* The CUDA table, or NULL in a build without CUDA
 * (engine/core/cuda_absent.c). */
const lucid_input_kernels *lucid_input_cuda_kernels(void);

#ifdef __cplusplus
}
#endif
#endif /* LUCID_DATA_INPUT_H */
