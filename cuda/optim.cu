/*
 * optim.cu — CUDA kernels of the optimizer step (SGD, AdamW, MuSGD), the
 * gradient norm / clips, loss scaling and EMA: the CUDA lucid_optim_kernels
 * table (engine/train/optim_backend.h), found by the engine through the
 * symbol lucid_optim_cuda_kernels_impl (engine/core/cuda_absent.c has
 * the NULL version for CUDA=0 builds).
 *
 * Contract
 *   - Every per-step scalar is read from the device block at run time
 *     (lucid_param_values *blk); no step-varying value is a kernel argument,
 *     so a recorded graph replays while the schedule moves. Kernel
 *     arguments are layout constants (tables, pointers, counts) and the
 *     call's fixed flags (which parts of the step the call runs).
 *   - Scalar work runs through the shared lucid_pb_* helpers (same code as
 *     the CPU): in the last block of a one-launch reduction where there is
 *     one (norm + unscale pass: lucid_pb_chain; EMA: the decay), else in a
 *     one-thread kernel. "Last block" = the block that draws the last
 *     ticket of an int32 counter (layout->counters, reset to 0 by that
 *     block); writers fence before taking a ticket and the last block
 *     reads through L2 (__ldcg), so it sees every partial and found_inf.
 *     Which block is last never changes a result: folds run in the fixed
 *     order of optim_backend.h.
 *   - All work is queued on the context's compute stream; nothing
 *     synchronizes except memcpy_d2h (a read-back). No allocation in a
 *     step: the MuSGD workspace is the optimizer's (sized from the layout's
 *     Muon plan) and cuBLAS uses the context's fixed workspace, so every
 *     step is capturable.
 *   - Bitwise agreement with the CPU reference: elementwise math uses
 *     __fmul_rn/__fadd_rn/__fdiv_rn/__fsqrt_rn (no FMA contraction); the
 *     norms use the fixed lane/tree order of optim_backend.h (no float
 *     atomics; found_inf is an int written with atomicExch, whose result is
 *     order independent). MuSGD's GEMMs go through cuBLAS and are
 *     deterministic but not bitwise equal to OpenBLAS.
 *   - One block of LUCID_OPTIM_THREADS threads per chunk of
 *     LUCID_OPTIM_CHUNK elements; thread t handles chunk elements t + i*T
 *     (i < CHUNK/T, loads first, then arithmetic, then stores), which is
 *     the lane order of the norm.
 *
 * Launches per optimizer step (N = trainable chunks):
 *   lucid_optim_step (SGD, AdamW)            prologue, update           = 2
 *   lucid_optim_step_fused with CLIP_NORM
 *     and/or UNSCALE (SGD, AdamW)            norm/unscale pass (its last
 *                                            block: the scalar chain),
 *                                            update (+ EMA of params,
 *                                            frozen segments, aux)      = 2
 *   separate calls: unscale 1, clip_norm 2 (pass+fold, apply),
 *     EMA 1 per tensor, scaler_update 1.
 *   MuSGD: as above, then pack 1, 5 x (3 GEMMs per bucket + 3
 *     elementwise), apply 1: 4 + 5 (3 nb + 3) with nb buckets.
 *
 * MuSGD (reference §6) over the layout's Muon plan (optim_backend.h):
 *   1. update kernel, muon chunks: m = lerp(m, g, 1-mu), u = rb(nesterov ?
 *      lerp(g, m, mu) : m) written straight into the matrix's padded X
 *      block (transposed when rows > cols), the chunk's u*u partial; the
 *      matrix's last chunk block folds its partials: den = rb(rb(sqrt) +
 *      eps). Other chunks: the SGD branch (+ EMA).
 *   2. pack: X = rb(u / den) in place; padding (and everything, on a
 *      skipped step) = 0.
 *   3. five Newton–Schulz iterations, per bucket one strided-batched GEMM
 *      for each of A = XX^T, B = (cA)A, Y = BX, and one elementwise launch
 *      over all buckets after each GEMM: A = rb(A), T = rb(c A); B =
 *      rb(rb(bA) + rb(B)); X = rb(rb(aX) + rb(Y)).
 *   4. apply (muon chunks): o = X (* shape scale), p += f32(-lr*muon) o,
 *      then the SGD part with its own buffer, then the EMA.
 *   GEMM precision: the host chooses at enqueue time from the staging
 *   in.ns_bf16 (optim.h). 1: X, A, T, B are stored in bf16 (they are
 *   bf16-rounded values, so exactly), GEMMs take bf16 operands with f32
 *   accumulation and f32 outputs, and every rounding of the pipeline is
 *   done (as if the device in.ns_bf16 were 1). 0: everything f32 (no TF32:
 *   the handle's math mode), roundings as the device in.ns_bf16 says.
 *   Cost, YOLO11n-pose (96 matrices, 2.86 M elements; `bench_optim plan`):
 *   per Newton–Schulz iteration a matrix costs 4 m^2 k + 2 m^3 FLOP, 9.6
 *   GFLOP per step unpadded, 14.1 GFLOP padded into 6 buckets (X holds
 *   5.1 M elements, A 1.1 M). bf16 tensor cores at a conservative 100-300
 *   TFLOP/s for these small batched shapes: 50-150 us; the elementwise
 *   traffic (Y written by the third GEMM and read by k_ns_x, X read and
 *   written, five times: ~350 MB) ~100 us at ~3.5 TB/s; 109 launches
 *   (4 + 5 x (3 x 6 + 3)) at ~1.5-3 us each. Expected ~0.3-0.5 ms per step
 *   against 21 ms for the per-matrix loop this replaces (3,264 launches
 *   and a one-block norm per matrix). The f32 path is bound by FP32 FMA
 *   throughput (67 TFLOP/s peak, less on these shapes): ~0.5-1 ms.
 */
#include "common.cuh"
#include <stdlib.h>
#include <string.h>
#include "train/optim_backend.h"

#define T LUCID_OPTIM_THREADS
#define PER (LUCID_OPTIM_CHUNK / LUCID_OPTIM_THREADS)

#define MUL __fmul_rn
#define ADD __fadd_rn
#define SUB __fsub_rn
#define DIV __fdiv_rn

typedef __nv_bfloat16 bf16;

/* prepass modes */
enum { PRE_STEP = 0, PRE_ONLY = 1, PRE_UNSCALE_WRITE = 2 };

__device__ __forceinline__ float lerp_aten(float a, float b, float w) {
    return (w < 0.5f && w > -0.5f) ? ADD(a, MUL(w, SUB(b, a)))
                                   : SUB(b, MUL(SUB(b, a), SUB(1.0f, w)));
}

__device__ __forceinline__ float rbf(float x, int on) {
    return on ? __bfloat162float(__float2bfloat16_rn(x)) : x;
}

__device__ __forceinline__ int is_finite_f(float x) { return SUB(x, x) == 0.0f; }

/* Storage of the Newton–Schulz operands: f32 or bf16. */
__device__ __forceinline__ float ld_s(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld_s(const bf16 *p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st_s(float *p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st_s(bf16 *p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

/* Block-wide fold of one value per lane: halving tree in shared memory. */
__device__ __forceinline__ float block_fold(float v, float *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int h = T / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) sh[threadIdx.x] = ADD(sh[threadIdx.x], sh[threadIdx.x + h]);
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

/* The partial fold of optim_backend.h over n partials written by other
 * blocks (read through L2). Every thread of the block calls it. */
__device__ __forceinline__ float fold_partials_cg(const float *part, int n, float *sh) {
    float s = 0.0f;
    for (int j = threadIdx.x; j < n; j += T) s = ADD(s, __ldcg(part + j));
    return block_fold(s, sh);
}

/* Ticket: every thread of the block calls it after the block's last global
 * write that the final block must see (threads that wrote with atomics
 * fenced themselves). Returns 1 in every thread of the block that drew the
 * last of `total` tickets; that block then reads other blocks' results
 * with __ldcg and thread 0 resets the counter. */
__device__ __forceinline__ int ticket(unsigned *counter, unsigned total) {
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        unsigned prev = atomicAdd(counter, 1u);
        last = prev == total - 1;
        if (last) __threadfence();
    }
    __syncthreads();
    return last;
}

/* Thread 0 of a last block: a coherent copy of the block (other blocks set
 * found_inf with atomics; this SM's L1 may hold an older line). */
__device__ __forceinline__ void blk_load_cg(lucid_param_values *dst,
                                            const lucid_param_values *src) {
    const unsigned *s = (const unsigned *)src;
    unsigned *d = (unsigned *)dst;
    for (int i = 0; i < (int)(sizeof(lucid_param_values) / sizeof(unsigned)); i++)
        d[i] = __ldcg(s + i);
}

/* ------------------------------------------------------------ scalar work */

/* One thread: the scalar chain without an element pass (sumsq = 0: the
 * norm of no element). PRE_STEP: lucid_pb_chain; else only the unscale /
 * norm parts (separate calls over a layout without trainable chunks). */
__global__ void k_scalar(lucid_param_values *blk, int mode, int flags, int kind) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    if (mode == PRE_STEP) {
        lucid_pb_chain(blk, flags, (lucid_optim_kind)kind, 0.0f);
        return;
    }
    if ((flags & LUCID_STEP_UNSCALE) && blk->in.scaler_enabled) lucid_pb_unscale_prep(blk);
    if (flags & LUCID_STEP_CLIP_NORM) lucid_pb_norm_finish(blk, 0.0f);
}
__global__ void k_ema_prep(lucid_param_values *blk) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    lucid_pb_ema_prep(blk);
}
__global__ void k_scaler_update(lucid_param_values *blk) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    lucid_pb_scaler_update(blk);
}

/* ------------------------------------------------------------ grads */

/* One pass over the trainable gradients, one block per chunk:
 *   UNSCALE (scaler on): found_inf |= any non-finite; x *= inv (inv =
 *     f32(1/f64(S)), derived per block, committed by the last block) unless
 *     inv == 1; PRE_UNSCALE_WRITE stores x back (lucid_grad_unscale);
 *   CLIP_NORM: the chunk's sum of x*x (lane order) -> part[chunk].
 * The last block folds the partials and runs the scalar work: PRE_STEP the
 * whole lucid_pb_chain of a fused step, else unscale/norm only. */
template <typename G>
__global__ void __launch_bounds__(T, 4) k_prepass(const lucid_chunk *chunks, lucid_param_values *blk, G *g,
                          float *part, unsigned *counter, int mode, int flags, int kind) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    __shared__ float sh[T];
    const lucid_chunk c = chunks[blockIdx.x];
    const int uns = (flags & LUCID_STEP_UNSCALE) && blk->in.scaler_enabled;
    const float inv = uns ? lucid_pb_inv_scale(blk->st.loss_scale) : 1.0f;
    const int scale = uns && inv != 1.0f;
    const int wr = mode == PRE_UNSCALE_WRITE && scale;
    const int norm = (flags & LUCID_STEP_CLIP_NORM) != 0;
    float xv[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int j = threadIdx.x + i * T;
        xv[i] = j < c.len ? lucid_elem<G>::load(g, c.start + j) : 0.0f;
    }
    float s = 0.0f;
    int found = 0;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int j = threadIdx.x + i * T;
        if (j < c.len) {
            float x = xv[i];
            if (uns && !is_finite_f(x)) found = 1;
            if (scale) x = MUL(x, inv);
            if (wr) lucid_elem<G>::store(g, c.start + j, x);
            if (norm) s = ADD(s, MUL(x, x));
        }
    }
    if (found) {
        atomicExch(&blk->st.found_inf, 1);
        __threadfence();
    }
    if (norm) {
        float r = block_fold(s, sh);
        if (threadIdx.x == 0) part[blockIdx.x] = r;
    }
    if (!ticket(counter, gridDim.x)) return;
    float total = norm ? fold_partials_cg(part, (int)gridDim.x, sh) : 0.0f;
    if (threadIdx.x == 0) {
        lucid_param_values v;
        blk_load_cg(&v, blk);
        if (mode == PRE_STEP) {
            lucid_pb_chain(&v, flags, (lucid_optim_kind)kind, total);
        } else {
            if (uns) lucid_pb_unscale_prep(&v);
            if (norm) lucid_pb_norm_finish(&v, total);
        }
        blk->st = v.st;
        *counter = 0;
    }
}

template <typename G>
__global__ void k_clip_apply(const lucid_chunk *chunks, const lucid_param_values *blk, G *g) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const lucid_chunk c = chunks[blockIdx.x];
    float coef = blk->st.clip_coef;
    float xv[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int j = threadIdx.x + i * T;
        xv[i] = j < c.len ? lucid_elem<G>::load(g, c.start + j) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int j = threadIdx.x + i * T;
        if (j < c.len) lucid_elem<G>::store(g, c.start + j, MUL(xv[i], coef));
    }
}

template <typename G>
__global__ void k_clip_value(const lucid_chunk *chunks, const lucid_param_values *blk, G *g) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const lucid_chunk c = chunks[blockIdx.x];
    float v = blk->in.clip_value;
    for (int j = threadIdx.x; j < c.len; j += T) {
        int64_t i = c.start + j;
        float x = lucid_elem<G>::load(g, i);
        if (x < -v) x = -v;
        if (x > v) x = v;
        lucid_elem<G>::store(g, i, x);
    }
}

/* ------------------------------------------------------------ the step */

/* Launch constants of one step call (kernel parameter, by value). */
typedef struct step_args {
    const lucid_chunk *chunks;   /* trainable chunks: blocks [0, ntrain) */
    int ntrain;
    const lucid_seg_info *segs;
    lucid_param_values *blk;
    float *p, *g, *s0, *s1;
    int flags;                   /* LUCID_STEP_* | EMA/AUX bits */
    float *ema;                  /* EMA of p, or NULL */
    const lucid_chunk *frozen;   /* EMA-only blocks [ntrain, ntrain+nfrozen) */
    int nfrozen;
    float *aux_ema;              /* aux EMA blocks after those */
    const float *aux;
    const lucid_chunk *aux_chunks;
    int naux;
    /* MuSGD */
    const lucid_muon_mat *mats;
    void *X;                     /* float or bf16, the plan's X array */
    float *mpart, *den;
    unsigned *mcnt;              /* per-matrix tickets */
    int bf16_path;
} step_args;

/* The gradient processing of optim_cpu.c: g*inv, g*coef, clamp. */
struct gproc {
    int scale, norm, value;
    float inv, coef, cv;
    __device__ __forceinline__ float operator()(float x) const {
        if (scale) x = MUL(x, inv);
        if (norm) x = MUL(x, coef);
        if (value) {
            if (x < -cv) x = -cv;
            if (x > cv) x = cv;
        }
        return x;
    }
};

__device__ __forceinline__ gproc make_gproc(const lucid_param_values *blk, int flags) {
    gproc q;
    q.inv = blk->st.inv_scale;
    q.scale = (flags & LUCID_STEP_UNSCALE) && blk->in.scaler_enabled && q.inv != 1.0f;
    q.norm = (flags & LUCID_STEP_CLIP_NORM) != 0;
    q.coef = blk->st.clip_coef;
    q.value = (flags & LUCID_STEP_CLIP_VALUE) != 0;
    q.cv = blk->in.clip_value;
    return q;
}

__device__ __forceinline__ float ema_elem(float e, float p, float d, float omd) {
    return ADD(MUL(e, d), MUL(omd, p));
}

/* e = e*d + (1-d)*p over one chunk (EMA-only blocks). */
__device__ __forceinline__ void ema_chunk(const lucid_chunk c, float *e, const float *p,
                                          float d, float omd) {
    float ev[PER], pv[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int j = threadIdx.x + i * T;
        if (j < c.len) ev[i] = e[c.start + j], pv[i] = p[c.start + j];
    }
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int j = threadIdx.x + i * T;
        if (j < c.len) e[c.start + j] = ema_elem(ev[i], pv[i], d, omd);
    }
}

/* Blocks past the trainable chunks: the EMA of frozen segments and of the
 * aux tensor. Returns 1 when this block was one of them. */
__device__ __forceinline__ int ema_only_block(const step_args &a) {
    int b = (int)blockIdx.x - a.ntrain;
    if (b < 0) return 0;
    float d = a.blk->st.ema_d, omd = a.blk->st.ema_1md;
    if (b < a.nfrozen) ema_chunk(a.frozen[b], a.ema, a.p, d, omd);
    else ema_chunk(a.aux_chunks[b - a.nfrozen], a.aux_ema, a.aux, d, omd);
    return 1;
}

__device__ __forceinline__ float sgd_elem(float p, float g, float *buf, float lr, float mu,
                                          float wd, int nest) {
    float d = g;
    if (wd != 0.0f) d = ADD(d, MUL(wd, p));
    float b = ADD(MUL(*buf, mu), d);
    *buf = b;
    float u = nest ? ADD(d, MUL(mu, b)) : b;
    return ADD(p, MUL(-lr, u));
}

/* SGD / AdamW update of the trainable chunks, gradient processing on the
 * fly, the EMA of each new value; EMA-only blocks after them. A skipped
 * step (st.step_skipped) leaves p and the state alone but still writes the
 * processed grads (KEEP_GRADS) and runs the EMA, as the separate calls. */
template <int KIND>
__global__ void __launch_bounds__(T, 4) k_step(step_args a) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    if (ema_only_block(a)) return;
    const lucid_param_values *blk = a.blk;
    const lucid_chunk c = a.chunks[blockIdx.x];
    const int s = a.segs[c.seg].slot;
    const int skip = blk->st.step_skipped;
    const gproc q = make_gproc(blk, a.flags);
    const int proc = q.scale || q.norm || q.value;
    const int keep = proc && (a.flags & LUCID_STEP_KEEP_GRADS);
    const int ema = a.ema != NULL;
    const float d = blk->st.ema_d, omd = blk->st.ema_1md;
    float gv[PER], pv[PER], mv[PER], vv[PER], ev[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int j = threadIdx.x + i * T;
        if (j < c.len) {
            int64_t x = c.start + j;
            gv[i] = a.g[x];
            pv[i] = a.p[x];
            mv[i] = a.s0[x];
            if (KIND == LUCID_OPTIM_ADAMW) vv[i] = a.s1[x];
            if (ema) ev[i] = a.ema[x];
        }
    }
    if (KIND == LUCID_OPTIM_SGD) {
        const float lr = blk->in.lr[s], mu = blk->in.momentum[s], wd = blk->in.weight_decay[s];
        const int nest = blk->in.nesterov;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            int j = threadIdx.x + i * T;
            if (j >= c.len) continue;
            int64_t x = c.start + j;
            float gi = proc ? q(gv[i]) : gv[i];
            if (!skip) {
                float b = mv[i];
                pv[i] = sgd_elem(pv[i], gi, &b, lr, mu, wd, nest);
                a.p[x] = pv[i];
                a.s0[x] = b;
            }
            if (ema) a.ema[x] = ema_elem(ev[i], pv[i], d, omd);
            if (keep) a.g[x] = gi;
        }
    } else {
        const float eps = blk->in.eps, b2 = blk->in.beta2;
        const float omb2 = (float)(1.0 - (double)b2);
        const float w1 = (float)(1.0 - (double)blk->in.momentum[s]);
        const float dm = blk->st.decay_mul[s], bc2 = blk->st.bc2_sqrt[s];
        const float nss = -blk->st.step_size[s];
#pragma unroll
        for (int i = 0; i < PER; i++) {
            int j = threadIdx.x + i * T;
            if (j >= c.len) continue;
            int64_t x = c.start + j;
            float gi = proc ? q(gv[i]) : gv[i];
            if (!skip) {
                float pi = MUL(pv[i], dm);
                float mi = lerp_aten(mv[i], gi, w1);
                float vi = ADD(MUL(vv[i], b2), MUL(omb2, MUL(gi, gi)));
                float den = ADD(DIV(__fsqrt_rn(vi), bc2), eps);
                pv[i] = ADD(pi, MUL(nss, DIV(mi, den)));
                a.p[x] = pv[i];
                a.s0[x] = mi;
                a.s1[x] = vi;
            }
            if (ema) a.ema[x] = ema_elem(ev[i], pv[i], d, omd);
            if (keep) a.g[x] = gi;
        }
    }
}

/* ------------------------------------------------------------ MuSGD */

/* Index in X of element j (segment order) of Muon matrix mt. */
__device__ __forceinline__ int64_t muon_pos(const lucid_muon_mat &mt, int64_t j) {
    int64_t r = j / mt.cols, c = j % mt.cols;
    return mt.x_off + (mt.tr ? c * mt.K + r : r * mt.K + c);
}

/* MuSGD part 1 (see the file header): trainable chunks; processed grads
 * are always written back (the apply kernel reads them again). */
template <typename S>
__global__ void __launch_bounds__(T, 4) k_musgd_pre(step_args a) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    __shared__ float sh[T];
    if (ema_only_block(a)) return;
    const lucid_param_values *blk = a.blk;
    const lucid_chunk c = a.chunks[blockIdx.x];
    const lucid_seg_info sg = a.segs[c.seg];
    const int s = sg.slot;
    const int skip = blk->st.step_skipped;
    const gproc q = make_gproc(blk, a.flags);
    const int proc = q.scale || q.norm || q.value;
    const float lr = blk->in.lr[s], mu = blk->in.momentum[s], wd = blk->in.weight_decay[s];
    const int nest = blk->in.nesterov;
    float gv[PER], bv[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int j = threadIdx.x + i * T;
        if (j < c.len) gv[i] = a.g[c.start + j], bv[i] = a.s0[c.start + j];
    }
    if (proc) {
#pragma unroll
        for (int i = 0; i < PER; i++) {
            int j = threadIdx.x + i * T;
            if (j < c.len) a.g[c.start + j] = gv[i] = q(gv[i]);
        }
    }
    if (!(sg.flags & LUCID_SEG_MUON)) {
        const int ema = a.ema != NULL;
        const float d = blk->st.ema_d, omd = blk->st.ema_1md;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            int j = threadIdx.x + i * T;
            if (j >= c.len) continue;
            int64_t x = c.start + j;
            float p = a.p[x];
            if (!skip) {
                float b = bv[i];
                p = sgd_elem(p, gv[i], &b, lr, mu, wd, nest);
                a.p[x] = p;
                a.s0[x] = b;
            }
            if (ema) a.ema[x] = ema_elem(a.ema[x], p, d, omd);
        }
        return;
    }
    if (skip) return; /* uniform over the grid: no ticket is drawn */
    const lucid_muon_mat mt = a.mats[sg.muon];
    const int bf = a.bf16_path ? 1 : blk->in.ns_bf16;
    const float w1 = (float)(1.0 - (double)mu);
    S *X = (S *)a.X;
    float ss = 0.0f;
    const int64_t j0 = c.start - sg.offset;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int j = threadIdx.x + i * T;
        if (j >= c.len) continue;
        float mi = lerp_aten(bv[i], gv[i], w1);
        a.s0[c.start + j] = mi;
        float u = rbf(nest ? lerp_aten(gv[i], mi, mu) : mi, bf);
        st_s(X, muon_pos(mt, j0 + j), u);
        ss = ADD(ss, MUL(u, u));
    }
    float r = block_fold(ss, sh);
    if (threadIdx.x == 0) a.mpart[blockIdx.x] = r;
    if (!ticket(&a.mcnt[sg.muon], (unsigned)mt.nchunks)) return;
    float tot = fold_partials_cg(a.mpart + mt.first_chunk, mt.nchunks, sh);
    if (threadIdx.x == 0) {
        float nrm = rbf(__fsqrt_rn(tot), bf);
        a.den[sg.muon] = rbf(ADD(nrm, LUCID_NS_EPS), bf);
        a.mcnt[sg.muon] = 0;
    }
}

/* X = rb(u / den) on the real block of every matrix, 0 on the padding and
 * everywhere on a skipped step. */
template <typename S>
__global__ void k_muon_pack(const lucid_muon_bucket *buckets, int nb,
                            const lucid_muon_mat *mats, const float *den,
                            const lucid_param_values *blk, int bf16_path, S *X, int64_t nx) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const int skip = blk->st.step_skipped;
    const int bf = bf16_path ? 1 : blk->in.ns_bf16;
    for (int64_t e = blockIdx.x * (int64_t)T + threadIdx.x; e < nx;
         e += (int64_t)gridDim.x * T) {
        float x = 0.0f;
        if (!skip) {
            int b = 0;
            while (b + 1 < nb && buckets[b + 1].x_off <= e) b++;
            const lucid_muon_bucket bk = buckets[b];
            int64_t mk = (int64_t)bk.M * bk.K, loc = e - bk.x_off;
            int mi = bk.first + (int)(loc / mk);
            int64_t w = loc % mk, r = w / bk.K, cc = w % bk.K;
            const lucid_muon_mat &mt = mats[mi];
            if (r < mt.m && cc < mt.k) x = rbf(DIV(ld_s(X, e), den[mi]), bf);
        }
        st_s(X, e, x);
    }
}

/* A = rb(A); As = A; Ts = rb(c*A)   (As == A32 on the f32 path) */
template <typename S>
__global__ void k_ns_a(float *A32, S *As, S *Ts, int64_t n, const lucid_param_values *blk,
                       int bf16_path) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const int bf = bf16_path ? 1 : blk->in.ns_bf16;
    for (int64_t i = blockIdx.x * (int64_t)T + threadIdx.x; i < n; i += (int64_t)gridDim.x * T) {
        float x = rbf(A32[i], bf);
        st_s(As, i, x);
        st_s(Ts, i, rbf(MUL(LUCID_NS_C, x), bf));
    }
}

/* Bs = rb(rb(b*A) + rb(B))   (Bs == B32 on the f32 path) */
template <typename S>
__global__ void k_ns_b(const S *As, const float *B32, S *Bs, int64_t n,
                       const lucid_param_values *blk, int bf16_path) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const int bf = bf16_path ? 1 : blk->in.ns_bf16;
    for (int64_t i = blockIdx.x * (int64_t)T + threadIdx.x; i < n; i += (int64_t)gridDim.x * T)
        st_s(Bs, i, rbf(ADD(rbf(MUL(LUCID_NS_B, ld_s(As, i)), bf), rbf(B32[i], bf)), bf));
}

/* X = rb(rb(a*X) + rb(Y)) */
template <typename S>
__global__ void k_ns_x(S *X, const float *Y, int64_t n, const lucid_param_values *blk,
                       int bf16_path) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const int bf = bf16_path ? 1 : blk->in.ns_bf16;
    for (int64_t i = blockIdx.x * (int64_t)T + threadIdx.x; i < n; i += (int64_t)gridDim.x * T)
        st_s(X, i, rbf(ADD(rbf(MUL(LUCID_NS_A, ld_s(X, i)), bf), rbf(Y[i], bf)), bf));
}

/* Muon chunks: p += f32(-(lr*muon))*O; the SGD part with buffer s1 on the
 * (already processed) grads; the EMA. A skipped step: the EMA only. */
template <typename S>
__global__ void __launch_bounds__(T, 4) k_muon_apply(step_args a) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const lucid_param_values *blk = a.blk;
    const lucid_chunk c = a.chunks[blockIdx.x];
    const lucid_seg_info sg = a.segs[c.seg];
    if (!(sg.flags & LUCID_SEG_MUON)) return;
    const int ema = a.ema != NULL;
    const float d = blk->st.ema_d, omd = blk->st.ema_1md;
    if (blk->st.step_skipped) {
        if (ema) ema_chunk(c, a.ema, a.p, d, omd);
        return;
    }
    const lucid_muon_mat mt = a.mats[sg.muon];
    const int s = sg.slot, bf = a.bf16_path ? 1 : blk->in.ns_bf16, nest = blk->in.nesterov;
    const float lr = blk->in.lr[s], mu = blk->in.momentum[s], wd = blk->in.weight_decay[s];
    const float am = (float)(-((double)lr * (double)blk->in.muon_scale));
    const float as = (float)(-((double)lr * (double)blk->in.sgd_scale));
    const S *X = (const S *)a.X;
    const int64_t j0 = c.start - sg.offset;
    float ov[PER], pv[PER], gv[PER], bv[PER], ev[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int j = threadIdx.x + i * T;
        if (j < c.len) {
            int64_t x = c.start + j;
            ov[i] = ld_s(X, muon_pos(mt, j0 + j));
            pv[i] = a.p[x], gv[i] = a.g[x], bv[i] = a.s1[x];
            if (ema) ev[i] = a.ema[x];
        }
    }
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int j = threadIdx.x + i * T;
        if (j >= c.len) continue;
        int64_t x = c.start + j;
        float o = ov[i];
        if (sg.muon_shape_scale != 1.0f) o = rbf(MUL(o, sg.muon_shape_scale), bf);
        float pi = ADD(pv[i], MUL(am, o));
        float dd = gv[i];
        if (wd != 0.0f) dd = ADD(dd, MUL(wd, pi));
        float b = ADD(MUL(bv[i], mu), dd);
        a.s1[x] = b;
        float u = nest ? ADD(dd, MUL(mu, b)) : b;
        float pn = ADD(pi, MUL(as, u));
        a.p[x] = pn;
        if (ema) a.ema[x] = ema_elem(ev[i], pn, d, omd);
    }
}

/* ------------------------------------------------------------ EMA, scale */

/* lucid_ema_update in one launch: every block derives d from
 * st.ema_updates + 1 (the same pure function as lucid_pb_ema_prep); the
 * last block commits updates, d and 1-d. */
__global__ void __launch_bounds__(T) k_ema(const lucid_chunk *chunks, lucid_param_values *blk,
                                           float *e, const float *p, unsigned *counter) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    __shared__ float sd[2];
    __shared__ long long su;
    if (threadIdx.x == 0) {
        long long u = blk->st.ema_updates + 1;
        lucid_pb_ema_coefs(blk, u, &sd[0], &sd[1]);
        su = u;
    }
    __syncthreads();
    ema_chunk(chunks[blockIdx.x], e, p, sd[0], sd[1]);
    if (!ticket(counter, gridDim.x)) return;
    if (threadIdx.x == 0) {
        blk->st.ema_updates = su;
        blk->st.ema_d = sd[0];
        blk->st.ema_1md = sd[1];
        *counter = 0;
    }
}

__global__ void k_scale(const lucid_param_values *blk, float *x, int64_t n) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    float s = blk->st.loss_scale;
    for (int64_t i = blockIdx.x * (int64_t)T + threadIdx.x; i < n; i += (int64_t)gridDim.x * T)
        x[i] = MUL(x[i], s);
}

/* ------------------------------------------------------------ host side */

static unsigned grid_for(int64_t n) { return lucid_cuda_blocks(n, T); }

static unsigned *counter0(const lucid_param_layout *l) {
    return (unsigned *)lucid_tensor_data(l->counters);
}

static lucid_status cu_unscale(lucid_ctx *ctx, const lucid_param_layout *l,
                               lucid_param_values *blk, float *g) {
    CUDA_ENTER(ctx, st);
    if (l->nchunks_train == 0) {
        lucid_launch(k_scalar, 1, 1, 0, st->stream, blk, PRE_ONLY, LUCID_STEP_UNSCALE, 0);
        CUDA_CHECK_LAUNCH(ctx, "k_scalar (unscale)");
        return LUCID_OK;
    }
    lucid_launch(k_prepass<float>, l->nchunks_train, T, 0, st->stream, l->chunks_train_dev, blk,
                 g, (float *)lucid_tensor_data(l->partials), counter0(l), PRE_UNSCALE_WRITE,
                 LUCID_STEP_UNSCALE, 0);
    CUDA_CHECK_LAUNCH(ctx, "k_prepass (unscale)");
    return LUCID_OK;
}

template <typename G>
static lucid_status norm_t(lucid_ctx *ctx, lucid_cuda_state *st, const lucid_param_layout *l,
                          lucid_param_values *blk, G *g, int apply) {
    if (l->nchunks_train == 0) {
        lucid_launch(k_scalar, 1, 1, 0, st->stream, blk, PRE_ONLY, LUCID_STEP_CLIP_NORM, 0);
        CUDA_CHECK_LAUNCH(ctx, "k_scalar (norm)");
        return LUCID_OK;
    }
    lucid_launch(k_prepass<G>, l->nchunks_train, T, 0, st->stream, l->chunks_train_dev, blk, g,
                 (float *)lucid_tensor_data(l->partials), counter0(l), PRE_ONLY,
                 LUCID_STEP_CLIP_NORM, 0);
    CUDA_CHECK_LAUNCH(ctx, "k_prepass (norm)");
    if (apply) {
        lucid_launch(k_clip_apply<G>, l->nchunks_train, T, 0, st->stream, l->chunks_train_dev,
                     blk, g);
        CUDA_CHECK_LAUNCH(ctx, "k_clip_apply");
    }
    return LUCID_OK;
}

static lucid_status cu_norm(lucid_ctx *ctx, const lucid_param_layout *l,
                            lucid_param_values *blk, void *g, lucid_dtype dt, int apply) {
    CUDA_ENTER(ctx, st);
    switch (dt) {
    case LUCID_BF16: return norm_t(ctx, st, l, blk, (bf16 *)g, apply);
    case LUCID_F16: return norm_t(ctx, st, l, blk, (__half *)g, apply);
    default: return norm_t(ctx, st, l, blk, (float *)g, apply);
    }
}

static lucid_status cu_clip_value(lucid_ctx *ctx, const lucid_param_layout *l,
                                  lucid_param_values *blk, void *g, lucid_dtype dt) {
    CUDA_ENTER(ctx, st);
    if (l->nchunks_train == 0) return LUCID_OK;
    int n = l->nchunks_train;
    if (dt == LUCID_BF16)
        lucid_launch(k_clip_value<bf16>, n, T, 0, st->stream, l->chunks_train_dev, blk,
                     (bf16 *)g);
    else if (dt == LUCID_F16)
        lucid_launch(k_clip_value<__half>, n, T, 0, st->stream, l->chunks_train_dev, blk,
                     (__half *)g);
    else
        lucid_launch(k_clip_value<float>, n, T, 0, st->stream, l->chunks_train_dev, blk,
                     (float *)g);
    CUDA_CHECK_LAUNCH(ctx, "k_clip_value");
    return LUCID_OK;
}

/* One strided-batched GEMM of row-major operands (see the callers),
 * f32 output, f32 compute; host alpha = 1, beta = 0 (C is not read). */
static lucid_status gemm_sb(lucid_ctx *ctx, lucid_cuda_state *st, cublasOperation_t ta,
                            int m, int n, int k, const void *A, int lda, long long sa,
                            const void *B, int ldb, long long sb, float *C, int ldc,
                            long long sc, int batch, cudaDataType_t dt) {
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(ctx, cublasGemmStridedBatchedEx(st->cublas, ta, CUBLAS_OP_N, m, n, k, &one, A,
                                                 dt, lda, sa, B, dt, ldb, sb, &zero, C,
                                                 CUDA_R_32F, ldc, sc, batch,
                                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return LUCID_OK;
}

/* Steps 2-4 of MuSGD (the file header) with operand storage S. */
template <typename S>
static lucid_status musgd_ns(lucid_ctx *ctx, lucid_cuda_state *st, const lucid_param_layout *l,
                             const step_args &a, float *work) {
    const lucid_muon_ws ws = lucid_musgd_ws(l);
    const int bfp = a.bf16_path;
    const cudaDataType_t dt = bfp ? CUDA_R_16BF : CUDA_R_32F;
    const int64_t nx = l->muon_nx, na = l->muon_na;
    S *X = (S *)(work + ws.x);
    float *Y = work + ws.y, *A32 = work + ws.a, *B32 = work + ws.b;
    S *Ts = (S *)(work + ws.t);
    S *As = bfp ? (S *)(work + ws.h) : (S *)A32;
    S *Bs = bfp ? (S *)(work + ws.h) + na : (S *)B32;
    lucid_launch(k_muon_pack<S>, grid_for(nx), T, 0, st->stream, l->buckets_dev, l->nbuckets,
                 l->mats_dev, a.den, a.blk, bfp, X, nx);
    CUDA_CHECK_LAUNCH(ctx, "k_muon_pack");
    for (int it = 0; it < LUCID_NS_STEPS; it++) {
        for (int b = 0; b < l->nbuckets; b++) { /* A = X X^T */
            const lucid_muon_bucket &k = l->buckets_host[b];
            LUCID_TRY(gemm_sb(ctx, st, CUBLAS_OP_T, k.M, k.M, k.K, X + k.x_off, k.K,
                              (long long)k.M * k.K, X + k.x_off, k.K, (long long)k.M * k.K,
                              A32 + k.a_off, k.M, (long long)k.M * k.M, k.count, dt));
        }
        lucid_launch(k_ns_a<S>, grid_for(na), T, 0, st->stream, A32, As, Ts, na, a.blk, bfp);
        CUDA_CHECK_LAUNCH(ctx, "k_ns_a");
        for (int b = 0; b < l->nbuckets; b++) { /* B = (cA) A */
            const lucid_muon_bucket &k = l->buckets_host[b];
            LUCID_TRY(gemm_sb(ctx, st, CUBLAS_OP_N, k.M, k.M, k.M, As + k.a_off, k.M,
                              (long long)k.M * k.M, Ts + k.a_off, k.M, (long long)k.M * k.M,
                              B32 + k.a_off, k.M, (long long)k.M * k.M, k.count, dt));
        }
        lucid_launch(k_ns_b<S>, grid_for(na), T, 0, st->stream, As, B32, Bs, na, a.blk, bfp);
        CUDA_CHECK_LAUNCH(ctx, "k_ns_b");
        for (int b = 0; b < l->nbuckets; b++) { /* Y = B X */
            const lucid_muon_bucket &k = l->buckets_host[b];
            LUCID_TRY(gemm_sb(ctx, st, CUBLAS_OP_N, k.K, k.M, k.M, X + k.x_off, k.K,
                              (long long)k.M * k.K, Bs + k.a_off, k.M, (long long)k.M * k.M,
                              Y + k.x_off, k.K, (long long)k.M * k.K, k.count, dt));
        }
        lucid_launch(k_ns_x<S>, grid_for(nx), T, 0, st->stream, X, Y, nx, a.blk, bfp);
        CUDA_CHECK_LAUNCH(ctx, "k_ns_x");
    }
    lucid_launch(k_muon_apply<S>, l->nchunks_train, T, 0, st->stream, a);
    CUDA_CHECK_LAUNCH(ctx, "k_muon_apply");
    return LUCID_OK;
}

template <typename S>
static lucid_status musgd_t(lucid_ctx *ctx, lucid_cuda_state *st, const lucid_param_layout *l,
                            step_args a, unsigned grid, float *work) {
    if (grid > 0) {
        lucid_launch(k_musgd_pre<S>, grid, T, 0, st->stream, a);
        CUDA_CHECK_LAUNCH(ctx, "k_musgd_pre");
    }
    if (l->nmuon == 0) return LUCID_OK;
    return musgd_ns<S>(ctx, st, l, a, work);
}

static lucid_status cu_optim_step(lucid_ctx *ctx, const lucid_param_layout *l,
                                  lucid_param_values *blk, const lucid_step_call *call) {
    CUDA_ENTER(ctx, st);
    const int f = call->flags, kind = (int)call->kind;
    if ((unsigned)kind >= LUCID_OPTIM_KIND_COUNT)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "optimizer: unknown kind %d", kind);
    /* 1. the gradient pass whose last block runs the scalar chain, or the
     *    chain alone */
    if ((f & (LUCID_STEP_UNSCALE | LUCID_STEP_CLIP_NORM)) && l->nchunks_train > 0) {
        lucid_launch(k_prepass<float>, l->nchunks_train, T, 0, st->stream, l->chunks_train_dev,
                     blk, call->grad, (float *)lucid_tensor_data(l->partials), counter0(l),
                     PRE_STEP, f, kind);
        CUDA_CHECK_LAUNCH(ctx, "k_prepass (step)");
    } else {
        lucid_launch(k_scalar, 1, 1, 0, st->stream, blk, PRE_STEP, f, kind);
        CUDA_CHECK_LAUNCH(ctx, "k_scalar (step)");
    }
    /* 2. the update (+ EMA) */
    step_args a;
    memset(&a, 0, sizeof a);
    a.chunks = l->chunks_train_dev;
    a.ntrain = l->nchunks_train;
    a.segs = l->seg_dev;
    a.blk = blk;
    a.p = call->param, a.g = call->grad, a.s0 = call->s0, a.s1 = call->s1;
    a.flags = f;
    if (f & LUCID_STEP_EMA_BIT) {
        a.ema = call->ema;
        a.frozen = l->chunks_frozen_dev;
        a.nfrozen = l->nchunks_frozen;
    }
    if (f & LUCID_STEP_AUX_BIT) {
        a.aux_ema = call->aux_ema;
        a.aux = call->aux;
        a.aux_chunks = call->aux_layout->chunks_all_dev;
        a.naux = call->aux_layout->nchunks_all;
    }
    unsigned grid = (unsigned)(a.ntrain + a.nfrozen + a.naux);
    switch (call->kind) {
    case LUCID_OPTIM_SGD:
        if (grid) lucid_launch(k_step<LUCID_OPTIM_SGD>, grid, T, 0, st->stream, a);
        break;
    case LUCID_OPTIM_ADAMW:
        if (grid) lucid_launch(k_step<LUCID_OPTIM_ADAMW>, grid, T, 0, st->stream, a);
        break;
    default: {
        if (l->nmuon > 0 && !call->work)
            return lucid_seterr(ctx, LUCID_ERR_ARG, "MuSGD: no Newton–Schulz workspace");
        const lucid_muon_ws ws = lucid_musgd_ws(l);
        a.mats = l->mats_dev;
        a.X = call->work ? (void *)(call->work + ws.x) : NULL;
        a.mpart = call->work ? call->work + ws.part : NULL;
        a.den = call->work ? call->work + ws.den : NULL;
        a.mcnt = counter0(l) + 1;
        a.bf16_path = call->ns_bf16_gemm != 0;
        return a.bf16_path ? musgd_t<bf16>(ctx, st, l, a, grid, call->work)
                           : musgd_t<float>(ctx, st, l, a, grid, call->work);
    }
    }
    CUDA_CHECK_LAUNCH(ctx, "optimizer update");
    return LUCID_OK;
}

static lucid_status cu_scaler_update(lucid_ctx *ctx, lucid_param_values *blk) {
    CUDA_ENTER(ctx, st);
    lucid_launch(k_scaler_update, 1, 1, 0, st->stream, blk);
    CUDA_CHECK_LAUNCH(ctx, "k_scaler_update");
    return LUCID_OK;
}

static lucid_status cu_scale(lucid_ctx *ctx, lucid_param_values *blk, float *x, int64_t n) {
    CUDA_ENTER(ctx, st);
    if (n == 0) return LUCID_OK;
    lucid_launch(k_scale, grid_for(n), T, 0, st->stream, blk, x, n);
    CUDA_CHECK_LAUNCH(ctx, "k_scale");
    return LUCID_OK;
}

static lucid_status cu_ema(lucid_ctx *ctx, const lucid_param_layout *l, lucid_param_values *blk,
                           float *e, const float *p) {
    CUDA_ENTER(ctx, st);
    if (l->nchunks_all == 0) {
        lucid_launch(k_ema_prep, 1, 1, 0, st->stream, blk);
        CUDA_CHECK_LAUNCH(ctx, "k_ema_prep");
        return LUCID_OK;
    }
    lucid_launch(k_ema, l->nchunks_all, T, 0, st->stream, l->chunks_all_dev, blk, e, p,
                 counter0(l));
    CUDA_CHECK_LAUNCH(ctx, "k_ema");
    return LUCID_OK;
}

/* Host -> device copy of a parameter block (a few hundred bytes).
 * Asynchronous copies from the pinned staging copy would read it when the
 * stream reaches them, so a host that rewrites the staging for the next
 * step (warmup changes lr every iteration) before the GPU got there would
 * race. Outside a graph capture the source is therefore first copied into
 * pageable memory: cudaMemcpyAsync from pageable memory has consumed its
 * source when it returns (staged or synchronous; CUDA runtime "API
 * synchronization behavior"), so the staging is free to change at once.
 * While capturing, the graph's copy node reads the pinned staging when it
 * replays (the recorded step uploads eagerly and waits on an event). */
static lucid_status cu_h2d(lucid_ctx *ctx, void *dst, const void *src, size_t n, int async) {
    CUDA_ENTER(ctx, st);
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    CUDA_CHECK(ctx, cudaStreamIsCapturing(st->stream, &cap));
    if (async && cap == cudaStreamCaptureStatusNone) {
        void *bounce = malloc(n ? n : 1);
        if (!bounce)
            return lucid_seterr(ctx, LUCID_ERR_OOM, "parameter block upload: out of host memory (%zu bytes)", n);
        memcpy(bounce, src, n);
        cudaError_t e = cudaMemcpyAsync(dst, bounce, n, cudaMemcpyHostToDevice, st->stream);
        free(bounce);
        if (e != cudaSuccess)
            return lucid_seterr(ctx, LUCID_ERR_DEVICE, "cudaMemcpyAsync (parameter block upload, %zu bytes): %s",
                                n, cudaGetErrorString(e));
        return LUCID_OK;
    }
    CUDA_CHECK(ctx, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, st->stream));
    if (!async) CUDA_CHECK(ctx, cudaStreamSynchronize(st->stream));
    return LUCID_OK;
}

static lucid_status cu_d2h(lucid_ctx *ctx, void *dst, const void *src, size_t n) {
    CUDA_ENTER(ctx, st);
    CUDA_CHECK(ctx, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, st->stream));
    CUDA_CHECK(ctx, cudaStreamSynchronize(st->stream));
    return LUCID_OK;
}

static const lucid_optim_kernels cuda_table = {
    cu_unscale, cu_norm, cu_clip_value, cu_optim_step, cu_scaler_update,
    cu_scale,   cu_ema,  cu_h2d,        cu_d2h,
};

extern "C" const lucid_optim_kernels *lucid_optim_cuda_kernels_impl(void) {
    return &cuda_table;
}
