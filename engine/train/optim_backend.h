/*
 * optim_backend.h — private: layout tables and the kernel table shared by
 * the CPU implementation (clip.c, scaler.c, ema.c, optim_cpu.c) and cuda/optim.cu.
 *
 * Contract
 *   - Launch tables: the trainable chunk list covers every trainable
 *     segment in segment order, cut into chunks of LUCID_OPTIM_CHUNK
 *     elements (the last chunk of a segment may be shorter); the "all" list
 *     does the same over every segment (EMA). One CUDA block per chunk.
 *   - Norm order (bitwise CPU == CUDA): chunk c's partial is the sum over
 *     LUCID_OPTIM_THREADS lanes; lane t sums x*x of elements t, t+T, ... of
 *     the chunk in increasing order (f32, no FMA); the T lane sums are
 *     folded by a halving tree (s[i] += s[i+h], h = T/2 .. 1). The chunk
 *     partials are folded the same way: lane t sums partials t, t+T, ...,
 *     then the halving tree. norm = sqrtf(total).
 *   - The lucid_pb_* helpers below are the single definition of the scalar
 *     per-step arithmetic; they compile as host code here and as
 *     __host__ __device__ code in cuda/optim.cu.
 *   - Included by C11 engine code and by nvcc; includes no CUDA header.
 */
#ifndef LUCID_TRAIN_OPTIM_BACKEND_H
#define LUCID_TRAIN_OPTIM_BACKEND_H

#include "internal.h"
#include "train/optim.h"
#include <math.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LUCID_OPTIM_CHUNK 2048
#define LUCID_OPTIM_THREADS 256

#ifdef __CUDACC__
#define LUCID_HD __host__ __device__
#else
#define LUCID_HD
#endif

enum { LUCID_SEG_TRAINABLE = 1, LUCID_SEG_MUON = 2 };

typedef struct lucid_seg_info {
    int64_t offset, numel;
    int32_t slot;      /* kind + 3*head */
    int32_t flags;     /* LUCID_SEG_* */
    int32_t rows, cols; /* 2-D view for Muon: (shape[0], numel/shape[0]) */
    float muon_shape_scale; /* sqrt(max(1, shape[-2]/shape[-1])) (§6) */
    int32_t pad;
} lucid_seg_info;

typedef struct lucid_chunk {
    int64_t start;     /* absolute element index in the flat buffer */
    int32_t len;       /* <= LUCID_OPTIM_CHUNK */
    int32_t seg;       /* segment index */
} lucid_chunk;

struct lucid_param_layout {
    int refcount;
    lucid_ctx *ctx;          /* owning reference */
    lucid_device dev;
    int64_t total_numel, trainable_numel;
    int nsegs;
    lucid_param_segment *segs; /* host copy; names owned */
    lucid_seg_info *seg_host;
    int nchunks_train, nchunks_all;
    lucid_chunk *chunks_train_host, *chunks_all_host;
    int nmuon;               /* trainable segments with ndim 2 or 4 */
    int32_t *muon_host;      /* their segment indices */
    int64_t muon_max_numel;  /* largest muon segment */
    int64_t muon_max_gram;   /* largest min(rows,cols)^2 */
    /* Device copies (== the host arrays on the CPU). */
    lucid_tensor *dev_tables;   /* CUDA: one byte buffer holding the tables */
    const lucid_seg_info *seg_dev;
    const lucid_chunk *chunks_train_dev, *chunks_all_dev;
    /* Norm workspace: one f32 partial per trainable chunk. */
    lucid_tensor *partials;
};

struct lucid_param_block {
    int refcount;
    lucid_ctx *ctx;             /* owning reference */
    lucid_device dev;
    lucid_tensor *staging;      /* CPU (pinned when dev is CUDA) */
    lucid_tensor *device;       /* on dev (a second CPU copy on the CPU) */
};

static inline lucid_param_values *lucid_pb_host(lucid_param_block *pb) {
    return (lucid_param_values *)lucid_tensor_data(pb->staging);
}
static inline lucid_param_values *lucid_pb_dev(lucid_param_block *pb) {
    return (lucid_param_values *)lucid_tensor_data(pb->device);
}

/* Kernel table: one per device type. Pointers are device pointers; blk is
 * the device block. Shapes and dtypes were checked by the dispatcher. */
typedef struct lucid_optim_kernels {
    lucid_status (*grad_unscale)(lucid_ctx *ctx, const lucid_param_layout *l,
                                 lucid_param_values *blk, float *grad);
    lucid_status (*grad_norm)(lucid_ctx *ctx, const lucid_param_layout *l,
                              lucid_param_values *blk, void *grad,
                              lucid_dtype gdt, int apply);
    lucid_status (*grad_clip_value)(lucid_ctx *ctx, const lucid_param_layout *l,
                                    lucid_param_values *blk, void *grad,
                                    lucid_dtype gdt);
    /* s0/s1: state buffers (s1 NULL for SGD); work: MuSGD workspace. */
    lucid_status (*optim_step)(lucid_ctx *ctx, const lucid_param_layout *l,
                               lucid_param_values *blk, lucid_optim_kind kind,
                               float *param, const float *grad, float *s0,
                               float *s1, float *work);
    lucid_status (*scaler_update)(lucid_ctx *ctx, lucid_param_values *blk);
    lucid_status (*scale)(lucid_ctx *ctx, lucid_param_values *blk, float *x,
                          int64_t n);
    lucid_status (*ema_update)(lucid_ctx *ctx, const lucid_param_layout *l,
                               lucid_param_values *blk, float *ema,
                               const float *param);
    /* Copy nbytes host->device or device->host on the context stream;
     * async when async != 0 (host side must be pinned). */
    lucid_status (*memcpy_h2d)(lucid_ctx *ctx, void *dst, const void *src,
                               size_t nbytes, int async);
    lucid_status (*memcpy_d2h)(lucid_ctx *ctx, void *dst, const void *src,
                               size_t nbytes);
} lucid_optim_kernels;

/* CPU kernels, defined next to their dispatchers (clip.c, scaler.c, ema.c,
 * optim_cpu.c) and gathered into the CPU table in optim_cpu.c. */
lucid_status lucid_cpu_grad_unscale(lucid_ctx *ctx, const lucid_param_layout *l,
                                    lucid_param_values *blk, float *grad);
lucid_status lucid_cpu_grad_norm(lucid_ctx *ctx, const lucid_param_layout *l,
                                 lucid_param_values *blk, void *grad,
                                 lucid_dtype gdt, int apply);
lucid_status lucid_cpu_grad_clip_value(lucid_ctx *ctx,
                                       const lucid_param_layout *l,
                                       lucid_param_values *blk, void *grad,
                                       lucid_dtype gdt);
lucid_status lucid_cpu_scaler_update(lucid_ctx *ctx, lucid_param_values *blk);
lucid_status lucid_cpu_scale(lucid_ctx *ctx, lucid_param_values *blk,
                             float *x, int64_t n);
lucid_status lucid_cpu_ema_update(lucid_ctx *ctx, const lucid_param_layout *l,
                                  lucid_param_values *blk, float *ema,
                                  const float *param);

/* The CPU table (engine/train/optim_cpu.c). */
const lucid_optim_kernels *lucid_optim_cpu_kernels(void);
/* The CUDA table (cuda/optim.cu); NULL when the build has no CUDA kernels. */
const lucid_optim_kernels *lucid_optim_cuda_kernels(void);
/* Defined by cuda/optim.cu (CUDA builds) or engine/core/cuda_absent.c. */
const lucid_optim_kernels *lucid_optim_cuda_kernels_impl(void);
/* The table for dev, or NULL with an error set in ctx. */
const lucid_optim_kernels *lucid_optim_kernels_for(lucid_ctx *ctx,
                                                   lucid_device dev);

/* Check a flat buffer against the layout: contiguous, numel == total,
 * on the layout's device, dtype f32 (or bf16/f16 when allow_half). Also
 * checks that pb (when given) lives on the same device. Error messages
 * start with `what`. */
lucid_status lucid_optim_check_flat(lucid_ctx *ctx, const char *what,
                                    const lucid_param_layout *l,
                                    const lucid_param_block *pb,
                                    const lucid_tensor *t, const char *arg,
                                    int allow_half);

/* Words needed by the MuSGD workspace for this layout (f32 elements). */
int64_t lucid_musgd_work_numel(const lucid_param_layout *l);

/* ------------------------------------------ shared per-step scalar math */

/* Newton–Schulz coefficients (a, b, c), reference §6, fixed for 5 steps. */
#define LUCID_NS_A 3.4445f
#define LUCID_NS_B (-4.7750f)
#define LUCID_NS_C 2.0315f
#define LUCID_NS_STEPS 5
#define LUCID_NS_EPS 1e-7f

/* Optimizer prologue (one thread): returns 0 when the step is skipped
 * (found_inf); else advances st.step and derives the AdamW scalars as
 * torch.optim.AdamW does in Python floats (f64), rounded once to f32. */
static inline LUCID_HD int lucid_pb_optim_prep(lucid_param_values *v,
                                               lucid_optim_kind kind) {
    if (v->st.found_inf) {
        v->st.skipped_steps += 1;
        return 0;
    }
    v->st.step += 1;
    if (kind == LUCID_OPTIM_ADAMW) {
        double t = (double)v->st.step;
        for (int s = 0; s < LUCID_PARAM_SLOTS; s++) {
            double lr = v->in.lr[s], b1 = v->in.momentum[s];
            double b2 = v->in.beta2, wd = v->in.weight_decay[s];
            double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
            v->st.step_size[s] = (float)(lr / bc1);
            v->st.bc2_sqrt[s] = (float)sqrt(bc2);
            v->st.decay_mul[s] = (float)(1.0 - lr * wd);
        }
    }
    return 1;
}

/* EMA prologue: updates += 1 and d = decay*(1 - exp(-updates/tau)) (f64,
 * Ultralytics ModelEMA). */
static inline LUCID_HD void lucid_pb_ema_prep(lucid_param_values *v) {
    v->st.ema_updates += 1;
    double d = (double)v->in.ema_decay *
               (1.0 - exp(-(double)v->st.ema_updates / (double)v->in.ema_tau));
    v->st.ema_d = (float)d;
    v->st.ema_1md = (float)(1.0 - d);
}

/* Unscale prologue: inv = f32(1/f64(S)) (torch GradScaler.unscale_). */
static inline LUCID_HD void lucid_pb_unscale_prep(lucid_param_values *v) {
    v->st.inv_scale = (float)(1.0 / (double)v->st.loss_scale);
}

/* Norm epilogue: store the norm, count non-finite ones, derive the clip
 * coefficient as torch: (1/(norm + 1e-6)) * max_norm, clamp(max=1) with
 * NaN passing through (reference §2.2-§2.3; Tensor.__rtruediv__ is
 * reciprocal() * other). */
static inline LUCID_HD float lucid_pb_norm_finish(lucid_param_values *v,
                                                  float sumsq) {
    float norm = sqrtf(sumsq);
    v->st.grad_norm = norm;
    if (!(norm - norm == 0.0f)) v->st.nonfinite_norms += 1;
    float denom = norm + 1e-6f;
    float coef = (1.0f / denom) * v->in.clip_max_norm;
    if (coef > 1.0f) coef = 1.0f;
    v->st.clip_coef = coef;
    return coef;
}

/* torch _amp_update_scale_ + found_inf reset. */
static inline LUCID_HD void lucid_pb_scaler_update(lucid_param_values *v) {
    if (v->in.scaler_enabled) {
        if (v->st.found_inf) {
            v->st.loss_scale = v->st.loss_scale * v->in.backoff_factor;
            v->st.growth_tracker = 0;
        } else {
            int32_t t = v->st.growth_tracker + 1;
            if (t == v->in.growth_interval) {
                float cand = v->st.loss_scale * v->in.growth_factor;
                if (cand - cand == 0.0f) v->st.loss_scale = cand;
                t = 0;
            }
            v->st.growth_tracker = t;
        }
    }
    v->st.found_inf = 0;
}

#ifdef __cplusplus
}
#endif
#endif /* LUCID_TRAIN_OPTIM_BACKEND_H */
