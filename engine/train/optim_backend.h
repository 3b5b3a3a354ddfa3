/*
 * optim_backend.h — private: layout tables and the kernel table shared by
 * the CPU implementation (clip.c, scaler.c, ema.c, optim_cpu.c) and cuda/optim.cu.
 *
 * Contract
 *   - Launch tables: the trainable chunk list covers every trainable
 *     segment in segment order, cut into chunks of LUCID_OPTIM_CHUNK
 *     elements (the last chunk of a segment may be shorter); the "all" list
 *     does the same over every segment (EMA); the "frozen" list over the
 *     non-trainable segments only (the EMA-only blocks of a fused step).
 *     One CUDA block per chunk.
 *   - Norm order (bitwise CPU == CUDA): chunk c's partial is the sum over
 *     LUCID_OPTIM_THREADS lanes; lane t sums x*x of elements t, t+T, ... of
 *     the chunk in increasing order (f32, no FMA); the T lane sums are
 *     folded by a halving tree (s[i] += s[i+h], h = T/2 .. 1). The chunk
 *     partials are folded the same way: lane t sums partials t, t+T, ...,
 *     then the halving tree. norm = sqrtf(total). On CUDA the partials are
 *     written by one kernel and folded by the last of its blocks to finish
 *     (an integer ticket counter picks that block; the fold order does not
 *     depend on which block it is), so the reduction is one launch.
 *   - MuSGD's Frobenius norm of each Muon matrix uses the SAME order over
 *     the matrix's own chunks (its segment's chunks of the trainable list):
 *     chunk partials of u*u, then the partial fold. CPU (optim_cpu.c) and
 *     CUDA both follow it, so that norm is bitwise equal too.
 *   - The lucid_pb_* helpers below are the single definition of the scalar
 *     per-step arithmetic; they compile as host code here and as
 *     __host__ __device__ code in cuda/optim.cu. lucid_pb_chain is the
 *     scalar part of a whole (fused) optimizer step, in the order of
 *     optim.h: unscale, norm/clip coefficient, optimizer prologue, scaler
 *     update, EMA prologue.
 *   - Muon plan (MuSGD, built with the layout, optim_layout.c): the Muon
 *     matrices, each viewed as X = m x k with m <= k (transposed when the
 *     segment has more rows than columns), are grouped into at most
 *     LUCID_MUON_MAX_BUCKETS buckets of one padded shape M x K (multiples
 *     of LUCID_MUON_ALIGN, M >= m, K >= k of every member). A matrix's X
 *     sits zero-padded at the top left of its M x K block; the blocks of a
 *     bucket are contiguous (stride M*K), the buckets follow each other in
 *     one X array (and the M x M Gram blocks likewise in one A array), so
 *     one strided-batched GEMM serves a bucket and one elementwise launch
 *     serves all buckets. Zero padding is exact for Newton–Schulz: padded
 *     rows/columns of X give zero rows/columns of A = XX^T, of B = bA +
 *     (cA)A and of BX, and a*0 + 0 = 0 (in bf16 too), so the real m x k
 *     block evolves as the unpadded matrix would (up to GEMM summation
 *     order). The grouping minimises an estimated cost (see optim_layout.c).
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
    int32_t muon;      /* index in the Muon matrix table, -1 if none */
} lucid_seg_info;

/* Muon plan (see the contract above). */
#define LUCID_MUON_ALIGN 8
#define LUCID_MUON_MAX_BUCKETS 8

typedef struct lucid_muon_mat {
    int32_t seg;          /* segment index */
    int32_t bucket;       /* bucket index */
    int32_t m, k;         /* X = m x k, m <= k */
    int32_t M, K;         /* the bucket's padded shape */
    int32_t tr;           /* 1: X = U^T (rows > cols) */
    int32_t cols;         /* columns of the segment's (rows, cols) view */
    int32_t first_chunk;  /* its first chunk in the trainable chunk list */
    int32_t nchunks;      /* its chunks (consecutive in that list) */
    int64_t x_off;        /* first element of its M x K block in X */
} lucid_muon_mat;

typedef struct lucid_muon_bucket {
    int32_t M, K;         /* padded shape */
    int32_t first, count; /* matrices [first, first+count) of the table */
    int64_t x_off;        /* first element in X (and Y): count*M*K of them */
    int64_t a_off;        /* first element in A, T, B: count*M*M of them */
} lucid_muon_bucket;

/* Offsets (f32 elements, each a multiple of 64) of the CUDA MuSGD
 * workspace regions: X (X as f32 or bf16), Y = B@X (f32), A = XX^T (f32),
 * T = c*A (f32 or bf16), B (f32), H (bf16 copies of A and B, bf16 GEMM
 * path), den (one f32 per matrix: ||u||_F + eps), part (one f32 per
 * trainable chunk: Frobenius partials). */
typedef struct lucid_muon_ws {
    int64_t x, y, a, t, b, h, den, part, total;
} lucid_muon_ws;

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
    int nchunks_frozen;      /* chunks of the non-trainable segments */
    lucid_chunk *chunks_frozen_host;
    int nmuon;               /* trainable segments with ndim 2 or 4 */
    int32_t *muon_host;      /* their segment indices */
    int64_t muon_max_numel;  /* largest muon segment */
    int64_t muon_max_gram;   /* largest min(rows,cols)^2 */
    /* Muon plan: nmuon matrices ordered by bucket, nbuckets buckets. */
    int nbuckets;
    lucid_muon_mat *mats_host;
    lucid_muon_bucket *buckets_host;
    int64_t muon_nx, muon_na; /* elements of X (sum count*M*K), of A (M*M) */
    /* Device copies (== the host arrays on the CPU). */
    lucid_tensor *dev_tables;   /* CUDA: one byte buffer holding the tables */
    const lucid_seg_info *seg_dev;
    const lucid_chunk *chunks_train_dev, *chunks_all_dev, *chunks_frozen_dev;
    const lucid_muon_mat *mats_dev;
    const lucid_muon_bucket *buckets_dev;
    /* Norm workspace: one f32 partial per trainable chunk. */
    lucid_tensor *partials;
    /* CUDA: 1 + nmuon int32 ticket counters, zero between kernels: [0] for
     * the one-launch reductions over this layout's chunks (norm + fold,
     * EMA), [1 + i] for Muon matrix i's Frobenius fold. NULL on the CPU. */
    lucid_tensor *counters;
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

/* What one optimizer-step call runs besides the update: the public
 * LUCID_STEP_* bits of optim.h (UNSCALE, CLIP_NORM, CLIP_VALUE,
 * SCALER_UPDATE, KEEP_GRADS) plus the EMA bits below. */
enum {
    LUCID_STEP_EMA_BIT = 1 << 8,  /* ema != NULL */
    LUCID_STEP_AUX_BIT = 1 << 9,  /* aux_ema != NULL */
};

/* One optimizer-step call. Pointers are device pointers (f32). */
typedef struct lucid_step_call {
    lucid_optim_kind kind;
    int flags;             /* LUCID_STEP_* (optim.h) | the bits above */
    float *param, *grad;   /* flat, layout l */
    float *s0, *s1;        /* state buffers (s1 NULL for SGD) */
    float *work;           /* MuSGD workspace (NULL when no Muon matrix) */
    int ns_bf16_gemm;      /* MuSGD, CUDA: the host's choice at enqueue time
                              (staging in.ns_bf16): 1 = bf16 GEMM operands
                              with f32 accumulation, 0 = f32 GEMMs */
    float *ema;            /* EMA of param (layout l), or NULL */
    const lucid_param_layout *aux_layout; /* aux EMA's layout, or NULL */
    float *aux_ema;        /* aux EMA tensor, or NULL */
    const float *aux;      /* the tensor it averages */
} lucid_step_call;

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
    /* lucid_optim_step (flags 0) and lucid_optim_step_fused. */
    lucid_status (*optim_step)(lucid_ctx *ctx, const lucid_param_layout *l,
                               lucid_param_values *blk,
                               const lucid_step_call *call);
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

/* Words needed by the MuSGD workspace for this layout (f32 elements):
 * on the CPU the per-matrix scratch of optim_cpu.c, on CUDA the regions of
 * lucid_musgd_ws. */
int64_t lucid_musgd_work_numel(const lucid_param_layout *l);
/* The CUDA workspace regions of this layout's Muon plan. */
lucid_muon_ws lucid_musgd_ws(const lucid_param_layout *l);

/* CPU Newton–Schulz on an already normalised, zero-padded X (M x K,
 * row-major; the real matrix is its top-left m x k block, m <= k): the 5
 * iterations of optim_cpu.c in place. gram3: 3*M*M floats of scratch, Y:
 * M*K floats of scratch. bf: round to bf16 where the reference computes in
 * bf16. Used by the CPU MuSGD with M = m, K = k, and by the tests to check
 * that zero padding is exact. */
void lucid_cpu_ns5_iterate(float *X, int M, int K, int bf, float *gram3,
                           float *Y);
/* The Frobenius sum of squares of u (n values, one Muon segment) in the
 * chunked order of the contract above. */
float lucid_cpu_muon_sumsq(const float *u, int64_t n);

/* ------------------------------------------ shared per-step scalar math */

/* Newton–Schulz coefficients (a, b, c), reference §6, fixed for 5 steps. */
#define LUCID_NS_A 3.4445f
#define LUCID_NS_B (-4.7750f)
#define LUCID_NS_C 2.0315f
#define LUCID_NS_STEPS 5
#define LUCID_NS_EPS 1e-7f

/* Optimizer prologue (one thread): returns 0 when the step is skipped
 * (found_inf); else advances st.step and derives the AdamW scalars as
 * torch.optim.AdamW does in Python floats (f64), rounded once to f32.
 * st.step_skipped records the decision: the update kernels read it (not
 * found_inf, which a fused step's scaler update may reset before them). */
static inline LUCID_HD int lucid_pb_optim_prep(lucid_param_values *v,
                                               lucid_optim_kind kind) {
    if (v->st.found_inf) {
        v->st.skipped_steps += 1;
        v->st.step_skipped = 1;
        return 0;
    }
    v->st.step_skipped = 0;
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

/* EMA decay after `updates` updates: d = decay*(1 - exp(-updates/tau))
 * (f64, Ultralytics ModelEMA), rounded once: *d = f32(d), *omd = f32(1-d). */
static inline LUCID_HD void lucid_pb_ema_coefs(const lucid_param_values *v,
                                               int64_t updates, float *d,
                                               float *omd) {
    double x = (double)v->in.ema_decay *
               (1.0 - exp(-(double)updates / (double)v->in.ema_tau));
    *d = (float)x;
    *omd = (float)(1.0 - x);
}

/* EMA prologue: updates += 1, then lucid_pb_ema_coefs. */
static inline LUCID_HD void lucid_pb_ema_prep(lucid_param_values *v) {
    v->st.ema_updates += 1;
    lucid_pb_ema_coefs(v, v->st.ema_updates, &v->st.ema_d, &v->st.ema_1md);
}

/* inv = f32(1/f64(S)) (torch GradScaler.unscale_). */
static inline LUCID_HD float lucid_pb_inv_scale(float loss_scale) {
    return (float)(1.0 / (double)loss_scale);
}

/* Unscale prologue: st.inv_scale from the current scale. */
static inline LUCID_HD void lucid_pb_unscale_prep(lucid_param_values *v) {
    v->st.inv_scale = lucid_pb_inv_scale(v->st.loss_scale);
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

/* The scalar part of one optimizer-step call, in the order of optim.h
 * (flags: LUCID_STEP_* | LUCID_STEP_EMA_BIT | LUCID_STEP_AUX_BIT):
 *   UNSCALE (scaler enabled): st.inv_scale (found_inf was already or-ed in
 *     by the element pass);
 *   CLIP_NORM: lucid_pb_norm_finish(sumsq);
 *   the optimizer prologue (skip decision, step, AdamW scalars);
 *   SCALER_UPDATE: lucid_pb_scaler_update (resets found_inf);
 *   EMA: lucid_pb_ema_prep.
 * The update kernels then read everything they need from the block. */
static inline LUCID_HD void lucid_pb_chain(lucid_param_values *v, int flags,
                                           lucid_optim_kind kind, float sumsq) {
    if ((flags & LUCID_STEP_UNSCALE) && v->in.scaler_enabled)
        lucid_pb_unscale_prep(v);
    if (flags & LUCID_STEP_CLIP_NORM) lucid_pb_norm_finish(v, sumsq);
    lucid_pb_optim_prep(v, kind);
    if (flags & LUCID_STEP_SCALER_UPDATE) lucid_pb_scaler_update(v);
    if (flags & (LUCID_STEP_EMA_BIT | LUCID_STEP_AUX_BIT)) lucid_pb_ema_prep(v);
}

/* The halving tree of the norm order over T lane sums (in place). */
static inline float lucid_fold_tree(float *lanes) {
    for (int h = LUCID_OPTIM_THREADS / 2; h > 0; h >>= 1)
        for (int t = 0; t < h; t++) lanes[t] = lanes[t] + lanes[t + h];
    return lanes[0];
}

/* Chunk partial: lane t sums x[j]*x[j], j = t, t+T, ... < n; then the tree. */
static inline float lucid_fold_sumsq(const float *x, int64_t n) {
    float lanes[LUCID_OPTIM_THREADS];
    for (int t = 0; t < LUCID_OPTIM_THREADS; t++) {
        float s = 0.0f;
        for (int64_t j = t; j < n; j += LUCID_OPTIM_THREADS) {
            float sq = x[j] * x[j];
            s = s + sq;
        }
        lanes[t] = s;
    }
    return lucid_fold_tree(lanes);
}

/* Partial fold: lane t sums p[t], p[t+T], ...; then the tree. */
static inline float lucid_fold_sum(const float *p, int64_t n) {
    float lanes[LUCID_OPTIM_THREADS];
    for (int t = 0; t < LUCID_OPTIM_THREADS; t++) {
        float s = 0.0f;
        for (int64_t j = t; j < n; j += LUCID_OPTIM_THREADS) s = s + p[j];
        lanes[t] = s;
    }
    return lucid_fold_tree(lanes);
}

#ifdef __cplusplus
}
#endif
#endif /* LUCID_TRAIN_OPTIM_BACKEND_H */
