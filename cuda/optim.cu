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
 *     one (norm + unscale pass: lucid_pb_chain_x; EMA: the decay), else in a
 *     one-block kernel (k_scalar). The chain itself runs in one thread; the
 *     block's other lanes first load the block into shared memory (one
 *     word each) and derive the AdamW slot scalars and the EMA decay in
 *     parallel (lucid_pb_pre), which the chain copies.
 *     "Last block" = the block that draws the last
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
 *   - Chunks (LUCID_OPTIM_CHUNK elements) map to the hardware as follows.
 *     The gradient pass (norm / unscale, k_prepass): one warp per chunk,
 *     each lane holding 8 of the norm's T lanes (see k_prepass), 16-byte
 *     loads. The SGD / AdamW update (k_step): one block of TU threads per
 *     chunk, PU elements per thread: groups of 4 consecutive elements with
 *     16-byte accesses when the buffers are 16-byte aligned and the chunk
 *     starts at a multiple of 4 (every chunk of a layout whose offsets are
 *     multiples of 4, as engine/nn/params.c places them), elementwise
 *     otherwise and for a chunk's last partial group; loads first, then
 *     arithmetic, then stores. Elementwise results do not depend on the
 *     map. The MuSGD kernels, k_clip_*, k_ema: one block of T threads per
 *     chunk, thread t handles chunk elements t + i*T (the norm's lane
 *     order, which the Muon Frobenius partials use).
 *   - The update kernel of lucid_optim_step(_fused) (SGD, AdamW) is
 *     launched with programmatic stream serialization on sm_90+ (pdl_ok;
 *     LUCID_OPTIM_PDL=0 turns it off): the pass / k_scalar before it let
 *     it start as soon as all their blocks run; it loads its operands
 *     (which they do not write), then waits for them to finish
 *     (griddepcontrol.wait: their writes are visible) and reads the block
 *     through L2. So the update's loads overlap the pass's fold and the
 *     scalar chain, and the launch gap between the two disappears.
 *   - Cache policy of the update: operands are loaded and the state / EMA
 *     stored with the streaming hint (evict first), so the gradients the
 *     pass just read (normal policy) tend to stay in L2 for the update.
 *
 * Launches per optimizer step (N = trainable chunks):
 *   lucid_optim_step (SGD, AdamW)            prologue, update           = 2
 *   lucid_optim_step_fused with CLIP_NORM
 *     and/or UNSCALE (SGD, AdamW)            norm/unscale pass (its last
 *                                            block: the scalar chain),
 *                                            update (+ EMA of params,
 *                                            frozen segments, aux)      = 2
 *     (the update launched early, see above)
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

/* Programmatic dependent launch (sm_90+; optim_step launches the update
 * kernel with it, see pdl_ok): the gradient pass and k_scalar let the
 * update grid start early; the update kernel loads its chunk, then waits
 * for them (all their blocks done, their writes visible) before it reads
 * the block. Without the launch attribute the wait returns at once. */
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* ------------------------------------------------------------ scalar work */

/* The scalar work of a one-launch reduction's last block, or of k_scalar;
 * every thread of the (T-thread) block calls it. A coherent copy of the
 * block goes to shared memory, one word per thread through L2 (other
 * blocks set found_inf with atomics; this SM's L1 may hold an older line).
 * PRE_STEP: lanes of warp 1 derive the AdamW scalars of one slot each and a
 * lane of warp 2 the EMA decay (lucid_pb_pre: pure functions of the copy),
 * then thread 0 runs lucid_pb_chain_x with them; else only the unscale /
 * norm parts. Thread 0 stores st and resets the counter (when given). */
__device__ __forceinline__ void scalar_tail(lucid_param_values *blk, int mode, int flags,
                                            int kind, float total, unsigned *counter) {
    enum { NW = (int)(sizeof(lucid_param_values) / sizeof(unsigned)) };
    static_assert(sizeof(lucid_param_values) % sizeof(unsigned) == 0, "block words");
    static_assert(NW <= T && 64 < T && 32 + LUCID_PARAM_SLOTS <= 64, "tail lanes");
    __shared__ union {
        lucid_param_values v;
        unsigned w[NW];
    } sv;
    __shared__ lucid_pb_pre pre;
    if ((int)threadIdx.x < NW) sv.w[threadIdx.x] = __ldcg((const unsigned *)blk + threadIdx.x);
    __syncthreads();
    if (mode == PRE_STEP) {
        const int l = (int)threadIdx.x - 32;
        if (kind == LUCID_OPTIM_ADAMW && l >= 0 && l < LUCID_PARAM_SLOTS)
            lucid_pb_adamw_slot(&sv.v, l, sv.v.st.step + 1, &pre.step_size[l], &pre.bc2_sqrt[l],
                                &pre.decay_mul[l]);
        if ((flags & (LUCID_STEP_EMA_BIT | LUCID_STEP_AUX_BIT)) && threadIdx.x == 64)
            lucid_pb_ema_coefs(&sv.v, sv.v.st.ema_updates + 1, &pre.ema_d, &pre.ema_1md);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        if (mode == PRE_STEP) {
            lucid_pb_chain_x(&sv.v, flags, (lucid_optim_kind)kind, total, &pre);
        } else {
            if ((flags & LUCID_STEP_UNSCALE) && sv.v.in.scaler_enabled) lucid_pb_unscale_prep(&sv.v);
            if (flags & LUCID_STEP_CLIP_NORM) lucid_pb_norm_finish(&sv.v, total);
        }
        blk->st = sv.v.st;
        if (counter) *counter = 0;
    }
}

/* One block of T threads: the scalar chain without an element pass
 * (sumsq = 0: the norm of no element). PRE_STEP: lucid_pb_chain; else only
 * the unscale / norm parts (separate calls over a layout without trainable
 * chunks). */
__global__ void __launch_bounds__(T) k_scalar(lucid_param_values *blk, int mode, int flags,
                                              int kind) {
    pdl_trigger();
    scalar_tail(blk, mode, flags, kind, 0.0f, NULL);
}
__global__ void k_ema_prep(lucid_param_values *blk) { lucid_pb_ema_prep(blk); }
__global__ void k_scaler_update(lucid_param_values *blk) { lucid_pb_scaler_update(blk); }

/* ------------------------------------------------------------ grads */

/* Chunks per block of the gradient pass: one warp each. */
#define PW (T / 32)

/* Four consecutive gradient elements as f32 (p: 4 * sizeof(G)-byte
 * aligned); the store (f32 only: lucid_grad_unscale writes f32). */
__device__ __forceinline__ void ld4(const float *p, float *o) {
    const float4 v = *(const float4 *)p;
    o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
}
template <typename H>
__device__ __forceinline__ void ld4(const H *p, float *o) {
    const uint2 r = *(const uint2 *)p;
    H h[4];
    memcpy(h, &r, sizeof r);
#pragma unroll
    for (int k = 0; k < 4; k++) o[k] = lucid_elem<H>::load(h, k);
}
__device__ __forceinline__ void st4(float *p, const float *o) {
    *(float4 *)p = make_float4(o[0], o[1], o[2], o[3]);
}
template <typename H>
__device__ __forceinline__ void st4(H *p, const float *o) {
#pragma unroll
    for (int k = 0; k < 4; k++) lucid_elem<H>::store(p, k, o[k]);
}

/* x[k] = base[e + k] for k < 4, 0 from len on: one ld4 when v4 and all
 * four are below len, else elementwise. */
template <typename G>
__device__ __forceinline__ void ld4_upto(const G *base, int e, int len, int v4, float *x) {
    if (v4 && e + 4 <= len) {
        ld4(base + e, x);
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++) x[k] = e + k < len ? lucid_elem<G>::load(base, e + k) : 0.0f;
    }
}

/* base[e + k] = x[k] for the k < 4 below len: one st4 when v4 and all four
 * are below len, else elementwise. */
template <typename G>
__device__ __forceinline__ void st4_upto(G *base, int e, int len, int v4, const float *x) {
    if (v4 && e + 4 <= len) {
        st4(base + e, x);
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (e + k < len) lucid_elem<G>::store(base, e + k, x[k]);
    }
}

/* One pass over the trainable gradients, one warp per chunk (PW chunks per
 * block):
 *   UNSCALE (scaler on): found_inf |= any non-finite; x *= inv (inv =
 *     f32(1/f64(S)), derived per block, committed by the last block) unless
 *     inv == 1; PRE_UNSCALE_WRITE stores x back (lucid_grad_unscale);
 *   CLIP_NORM: the chunk's sum of x*x in the norm order of optim_backend.h
 *     -> part[chunk].
 * Lane w of the warp holds the norm lanes 4w+k and T/2+4w+k (k < 4), so it
 * reads 4 consecutive elements per row of T (16-byte loads when vec and
 * the chunk start is a multiple of 4; elementwise otherwise and past the
 * chunk's end) and sums each of its 8 norm lanes in row order, as the
 * lane order does. The halving tree: h = T/2 inside the lane, h = 64 .. 4
 * by shuffles from lane w + h/4, h = 2, 1 inside lane 0; every step adds
 * the same two values as s[i] += s[i+h]. The last block folds the
 * partials and runs the scalar work (scalar_tail): PRE_STEP the whole
 * chain of a fused step, else unscale/norm only. */
template <typename G>
__global__ void __launch_bounds__(T, 2) k_prepass(const lucid_chunk *chunks, int nchunks,
                                                  lucid_param_values *blk, G *g, float *part,
                                                  unsigned *counter, int mode, int flags,
                                                  int kind, int vec) {
    static_assert(T == 256 && PER == 8, "the lane map below assumes 256 lanes, 8 rows");
    __shared__ float sh[T];
    pdl_trigger();
    const int uns = (flags & LUCID_STEP_UNSCALE) && blk->in.scaler_enabled;
    const float inv = uns ? lucid_pb_inv_scale(blk->st.loss_scale) : 1.0f;
    const int scale = uns && inv != 1.0f;
    const int wr = mode == PRE_UNSCALE_WRITE && scale;
    const int norm = (flags & LUCID_STEP_CLIP_NORM) != 0;
    const int w = (int)(threadIdx.x & 31);
    const int ci = (int)blockIdx.x * PW + (int)(threadIdx.x >> 5);
    if (ci < nchunks) { /* uniform over the warp */
        const lucid_chunk c = chunks[ci];
        G *base = g + c.start;
        const int len = c.len;
        const int v4 = vec && (c.start & 3) == 0;
        float x[PER][2][4]; /* element i*T + h*T/2 + 4w + k */
#pragma unroll
        for (int i = 0; i < PER; i++) {
#pragma unroll
            for (int h = 0; h < 2; h++)
                ld4_upto(base, i * T + h * (T / 2) + 4 * w, len, v4, x[i][h]);
        }
        float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
        int found = 0;
#pragma unroll
        for (int i = 0; i < PER; i++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    if (i * T + h * (T / 2) + 4 * w + k < len) {
                        float v = x[i][h][k];
                        if (uns && !is_finite_f(v)) found = 1;
                        if (scale) v = MUL(v, inv);
                        x[i][h][k] = v;
                        if (norm) s[h][k] = ADD(s[h][k], MUL(v, v));
                    }
                }
            }
        }
        if (wr) {
#pragma unroll
            for (int i = 0; i < PER; i++) {
#pragma unroll
                for (int h = 0; h < 2; h++)
                    st4_upto(base, i * T + h * (T / 2) + 4 * w, len, v4, x[i][h]);
            }
        }
        if (found) {
            atomicExch(&blk->st.found_inf, 1);
            __threadfence();
        }
        if (norm) {
            float t[4];
#pragma unroll
            for (int k = 0; k < 4; k++) t[k] = ADD(s[0][k], s[1][k]); /* h = T/2 */
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) /* h = 4*off: 64 .. 4 */
#pragma unroll
                for (int k = 0; k < 4; k++)
                    t[k] = ADD(t[k], __shfl_down_sync(0xffffffffu, t[k], off));
            t[0] = ADD(t[0], t[2]); /* h = 2 */
            t[1] = ADD(t[1], t[3]);
            t[0] = ADD(t[0], t[1]); /* h = 1 */
            if (w == 0) {
                part[ci] = t[0];
                __threadfence();
            }
        }
    }
    if (!ticket(counter, gridDim.x)) return;
    const float total = norm ? fold_partials_cg(part, nchunks, sh) : 0.0f;
    scalar_tail(blk, mode, flags, kind, total, counter);
}

template <typename G>
__global__ void k_clip_apply(const lucid_chunk *chunks, const lucid_param_values *blk, G *g) {
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
    /* SGD / AdamW: p, g, s0 (s1, ema when used) are 16-byte aligned */
    int vec;
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

/* make_gproc reading the block through L2 (the update kernel, after the
 * dependency wait). */
__device__ __forceinline__ gproc make_gproc_cg(const lucid_param_values *blk, int flags) {
    gproc q;
    q.inv = __ldcg(&blk->st.inv_scale);
    q.scale = (flags & LUCID_STEP_UNSCALE) && __ldcg(&blk->in.scaler_enabled) && q.inv != 1.0f;
    q.norm = (flags & LUCID_STEP_CLIP_NORM) != 0;
    q.coef = __ldcg(&blk->st.clip_coef);
    q.value = (flags & LUCID_STEP_CLIP_VALUE) != 0;
    q.cv = __ldcg(&blk->in.clip_value);
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

/* The SGD / AdamW update kernel: TU threads per chunk, PU elements each. */
#define TU 512
#define PU (LUCID_OPTIM_CHUNK / TU)

/* Chunk element of a thread's slot i (i < PU) in the update kernel.
 * VEC (16-byte accesses): groups of 4 consecutive elements, group t, t +
 * TU, ... (element 4(t + (i/4) TU) + i%4); else t + i TU. */
template <int VEC>
__device__ __forceinline__ int elem_at(int i) {
    return VEC ? 4 * ((int)threadIdx.x + (i / 4) * TU) + (i % 4) : (int)threadIdx.x + i * TU;
}

/* Slot groups: VEC: PU/4 groups of 4 slots (one 16-byte access each),
 * else PU groups of one slot. */
template <int VEC>
struct slot_groups {
    enum { N = VEC ? PU / 4 : PU, S = VEC ? 4 : 1 };
};

/* One operand of a chunk into registers (0 past len), streaming loads
 * (evict first: each element is read once per step). */
template <int VEC>
__device__ __forceinline__ void ld_chunk(float (&v)[PU], const float *p, int len) {
    if (VEC) {
#pragma unroll
        for (int q = 0; q < PU / 4; q++) {
            const int e = elem_at<1>(4 * q);
            if (e + 4 <= len) {
                const float4 f = __ldcs((const float4 *)(p + e));
                v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
            } else {
#pragma unroll
                for (int k = 0; k < 4; k++) v[4 * q + k] = e + k < len ? __ldcs(p + e + k) : 0.0f;
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < PU; i++) {
            const int e = elem_at<0>(i);
            v[i] = e < len ? __ldcs(p + e) : 0.0f;
        }
    }
}

__device__ __forceinline__ void st1(float *p, float v, int cs) {
    if (cs) __stcs(p, v);
    else *p = v;
}

/* Group q of one operand back to memory, its elements below len (CS:
 * streaming stores). */
template <int VEC, int CS>
__device__ __forceinline__ void st_group(float *p, const float (&v)[PU], int q, int len) {
    if (VEC) {
        const int e = elem_at<1>(4 * q);
        if (e + 4 <= len) {
            const float4 f = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
            if (CS) __stcs((float4 *)(p + e), f);
            else *(float4 *)(p + e) = f;
        } else {
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (e + k < len) st1(p + e + k, v[4 * q + k], CS);
        }
    } else {
        const int e = elem_at<0>(q);
        if (e < len) st1(p + e, v[q], CS);
    }
}

/* The whole chunk of one operand (every group). */
template <int VEC, int CS>
__device__ __forceinline__ void st_chunk(float *p, const float (&v)[PU], int len) {
#pragma unroll
    for (int q = 0; q < slot_groups<VEC>::N; q++) st_group<VEC, CS>(p, v, q, len);
}

/* Blocks past the trainable chunks of the update kernel: the EMA of frozen
 * segments and of the aux tensor (elementwise; loads before the wait). */
__device__ __forceinline__ void step_ema_only(const step_args &a, int b) {
    const int fz = b < a.nfrozen;
    const lucid_chunk c = fz ? a.frozen[b] : a.aux_chunks[b - a.nfrozen];
    float *e = (fz ? a.ema : a.aux_ema) + c.start;
    const float *p = (fz ? a.p : a.aux) + c.start;
    float ev[PU], pv[PU];
    ld_chunk<0>(ev, e, c.len);
    ld_chunk<0>(pv, p, c.len);
    pdl_wait();
    const float d = __ldcg(&a.blk->st.ema_d), omd = __ldcg(&a.blk->st.ema_1md);
#pragma unroll
    for (int i = 0; i < PU; i++) ev[i] = ema_elem(ev[i], pv[i], d, omd);
    st_chunk<0, 1>(e, ev, c.len);
}

/* One trainable chunk of the update kernel: every operand is loaded, then
 * the kernel waits for the scalar chain (pdl_wait) and reads the block
 * through L2; the arithmetic of each element is that of optim_cpu.c (and
 * of the previous per-element loop), done on all PU slots (past the
 * chunk's end on zeros, never stored). */
template <int KIND, int VEC>
__device__ __forceinline__ void step_chunk(const step_args &a, const lucid_chunk c, int s) {
    const int len = c.len;
    const int ema = a.ema != NULL;
    float *p = a.p + c.start, *g = a.g + c.start, *m = a.s0 + c.start;
    float gv[PU], pv[PU], mv[PU], vv[PU] = {}, ev[PU] = {};
    ld_chunk<VEC>(gv, g, len);
    ld_chunk<VEC>(pv, p, len);
    ld_chunk<VEC>(mv, m, len);
    if (KIND == LUCID_OPTIM_ADAMW) ld_chunk<VEC>(vv, a.s1 + c.start, len);
    if (ema) ld_chunk<VEC>(ev, a.ema + c.start, len);
    pdl_wait();
    const lucid_param_values *blk = a.blk;
    const int skip = __ldcg(&blk->st.step_skipped);
    const gproc q_ = make_gproc_cg(blk, a.flags);
    const int proc = q_.scale || q_.norm || q_.value;
    const int keep = proc && (a.flags & LUCID_STEP_KEEP_GRADS);
    const float d = __ldcg(&blk->st.ema_d), omd = __ldcg(&blk->st.ema_1md);
    typedef slot_groups<VEC> SG;
    float *v2 = KIND == LUCID_OPTIM_ADAMW ? a.s1 + c.start : NULL;
    float *e2 = ema ? a.ema + c.start : NULL;
    /* the step's scalars of KIND (those of the other kind stay 0, unused) */
    float lr = 0.0f, mu = 0.0f, wd = 0.0f;
    int nest = 0;
    float eps = 0.0f, b2 = 0.0f, omb2 = 0.0f, w1 = 0.0f, dm = 0.0f, bc2 = 0.0f, nss = 0.0f;
    if (KIND == LUCID_OPTIM_SGD) {
        lr = __ldcg(&blk->in.lr[s]);
        mu = __ldcg(&blk->in.momentum[s]);
        wd = __ldcg(&blk->in.weight_decay[s]);
        nest = __ldcg(&blk->in.nesterov);
    } else {
        eps = __ldcg(&blk->in.eps);
        b2 = __ldcg(&blk->in.beta2);
        omb2 = (float)(1.0 - (double)b2);
        w1 = (float)(1.0 - (double)__ldcg(&blk->in.momentum[s]));
        dm = __ldcg(&blk->st.decay_mul[s]);
        bc2 = __ldcg(&blk->st.bc2_sqrt[s]);
        nss = -__ldcg(&blk->st.step_size[s]);
    }
    /* each group is stored as soon as it is computed (fewer live values) */
#pragma unroll
    for (int q = 0; q < SG::N; q++) {
#pragma unroll
        for (int k = 0; k < SG::S; k++) {
            const int i = q * SG::S + k;
            const float gi = proc ? q_(gv[i]) : gv[i];
            gv[i] = gi;
            if (!skip && KIND == LUCID_OPTIM_SGD) {
                float b = mv[i];
                pv[i] = sgd_elem(pv[i], gi, &b, lr, mu, wd, nest);
                mv[i] = b;
            } else if (!skip) {
                float pi = MUL(pv[i], dm);
                float mi = lerp_aten(mv[i], gi, w1);
                float vi = ADD(MUL(vv[i], b2), MUL(omb2, MUL(gi, gi)));
                float den = ADD(DIV(__fsqrt_rn(vi), bc2), eps);
                pv[i] = ADD(pi, MUL(nss, DIV(mi, den)));
                mv[i] = mi;
                vv[i] = vi;
            }
            if (ema) ev[i] = ema_elem(ev[i], pv[i], d, omd);
        }
        if (!skip) {
            st_group<VEC, 0>(p, pv, q, len);
            st_group<VEC, 1>(m, mv, q, len);
            if (KIND != LUCID_OPTIM_SGD) st_group<VEC, 1>(v2, vv, q, len);
        }
        if (ema) st_group<VEC, 1>(e2, ev, q, len);
        if (keep) st_group<VEC, 0>(g, gv, q, len);
    }
}

/* SGD / AdamW update of the trainable chunks, gradient processing on the
 * fly, the EMA of each new value; EMA-only blocks after them. A skipped
 * step (st.step_skipped) leaves p and the state alone but still writes the
 * processed grads (KEEP_GRADS) and runs the EMA, as the separate calls.
 * Every block waits for the previous kernel (pdl_wait) before it reads the
 * block, so the kernel ends after it even when launched early. */
template <int KIND>
__global__ void __launch_bounds__(TU, KIND == LUCID_OPTIM_SGD ? 3 : 2) k_step(step_args a) {
    const int b = (int)blockIdx.x;
    if (b >= a.ntrain) {
        step_ema_only(a, b - a.ntrain);
        return;
    }
    const lucid_chunk c = a.chunks[b];
    const int s = a.segs[c.seg].slot;
    if (a.vec && (c.start & 3) == 0) step_chunk<KIND, 1>(a, c, s);
    else step_chunk<KIND, 0>(a, c, s);
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
    const int bf = bf16_path ? 1 : blk->in.ns_bf16;
    for (int64_t i = blockIdx.x * (int64_t)T + threadIdx.x; i < n; i += (int64_t)gridDim.x * T)
        st_s(Bs, i, rbf(ADD(rbf(MUL(LUCID_NS_B, ld_s(As, i)), bf), rbf(B32[i], bf)), bf));
}

/* X = rb(rb(a*X) + rb(Y)) */
template <typename S>
__global__ void k_ns_x(S *X, const float *Y, int64_t n, const lucid_param_values *blk,
                       int bf16_path) {
    const int bf = bf16_path ? 1 : blk->in.ns_bf16;
    for (int64_t i = blockIdx.x * (int64_t)T + threadIdx.x; i < n; i += (int64_t)gridDim.x * T)
        st_s(X, i, rbf(ADD(rbf(MUL(LUCID_NS_A, ld_s(X, i)), bf), rbf(Y[i], bf)), bf));
}

/* Muon chunks: p += f32(-(lr*muon))*O; the SGD part with buffer s1 on the
 * (already processed) grads; the EMA. A skipped step: the EMA only. */
template <typename S>
__global__ void __launch_bounds__(T, 4) k_muon_apply(step_args a) {
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
    float s = blk->st.loss_scale;
    for (int64_t i = blockIdx.x * (int64_t)T + threadIdx.x; i < n; i += (int64_t)gridDim.x * T)
        x[i] = MUL(x[i], s);
}

/* ------------------------------------------------------------ host side */

static unsigned grid_for(int64_t n) { return lucid_cuda_blocks(n, T); }

static unsigned *counter0(const lucid_param_layout *l) {
    return (unsigned *)lucid_tensor_data(l->counters);
}

static int aligned(const void *p, size_t n) { return ((uintptr_t)p % n) == 0; }

/* The gradient pass over the layout's trainable chunks (nchunks_train > 0):
 * PW chunks per block; 4-element loads where g allows. */
template <typename G>
static void launch_prepass(lucid_cuda_state *st, const lucid_param_layout *l,
                           lucid_param_values *blk, G *g, int mode, int flags, int kind) {
    const int n = l->nchunks_train;
    k_prepass<G><<<(unsigned)((n + PW - 1) / PW), T, 0, st->stream>>>(
        l->chunks_train_dev, n, blk, g, (float *)lucid_tensor_data(l->partials), counter0(l),
        mode, flags, kind, aligned(g, 4 * sizeof(G)));
}

/* Whether the update kernel may be launched with programmatic stream
 * serialization: a device of compute capability 9 or later running this
 * file's kernels compiled for it (PTX 9.0+: the griddepcontrol
 * instructions are in them), unless LUCID_OPTIM_PDL=0 (an A/B switch for
 * benchmarks). Cached per device ordinal. */
static int pdl_ok(const lucid_cuda_state *st) {
    static int env = -1, ptx = -1;
    static int cc[64];
    if (env < 0) {
        const char *e = getenv("LUCID_OPTIM_PDL");
        env = !(e && strcmp(e, "0") == 0);
    }
    if (!env || st->device < 0 || st->device >= 64) return 0;
    if (ptx < 0) {
        cudaFuncAttributes fa;
        ptx = cudaFuncGetAttributes(&fa, k_step<LUCID_OPTIM_SGD>) == cudaSuccess ? fa.ptxVersion
                                                                                : 0;
        (void)cudaGetLastError();
    }
    int *c = &cc[st->device];
    if (*c == 0) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, st->device) !=
            cudaSuccess)
            major = 0;
        (void)cudaGetLastError();
        *c = major > 0 ? major : -1;
    }
    return ptx >= 90 && *c >= 9;
}

/* The update kernel, with programmatic stream serialization when pdl. */
static cudaError_t launch_step(void (*kern)(step_args), unsigned grid, cudaStream_t stream,
                               int pdl, const step_args &a) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(TU);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    cudaLaunchAttribute at[1] = {};
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kern, a);
}

static lucid_status cu_unscale(lucid_ctx *ctx, const lucid_param_layout *l,
                               lucid_param_values *blk, float *g) {
    CUDA_ENTER(ctx, st);
    if (l->nchunks_train == 0) {
        k_scalar<<<1, T, 0, st->stream>>>(blk, PRE_ONLY, LUCID_STEP_UNSCALE, 0);
        CUDA_CHECK_LAUNCH(ctx, "k_scalar (unscale)");
        return LUCID_OK;
    }
    launch_prepass<float>(st, l, blk, g, PRE_UNSCALE_WRITE, LUCID_STEP_UNSCALE, 0);
    CUDA_CHECK_LAUNCH(ctx, "k_prepass (unscale)");
    return LUCID_OK;
}

template <typename G>
static lucid_status norm_t(lucid_ctx *ctx, lucid_cuda_state *st, const lucid_param_layout *l,
                          lucid_param_values *blk, G *g, int apply) {
    if (l->nchunks_train == 0) {
        k_scalar<<<1, T, 0, st->stream>>>(blk, PRE_ONLY, LUCID_STEP_CLIP_NORM, 0);
        CUDA_CHECK_LAUNCH(ctx, "k_scalar (norm)");
        return LUCID_OK;
    }
    launch_prepass<G>(st, l, blk, g, PRE_ONLY, LUCID_STEP_CLIP_NORM, 0);
    CUDA_CHECK_LAUNCH(ctx, "k_prepass (norm)");
    if (apply) {
        k_clip_apply<G><<<l->nchunks_train, T, 0, st->stream>>>(l->chunks_train_dev, blk, g);
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
        k_clip_value<<<n, T, 0, st->stream>>>(l->chunks_train_dev, blk, (bf16 *)g);
    else if (dt == LUCID_F16)
        k_clip_value<<<n, T, 0, st->stream>>>(l->chunks_train_dev, blk, (__half *)g);
    else
        k_clip_value<<<n, T, 0, st->stream>>>(l->chunks_train_dev, blk, (float *)g);
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
    k_muon_pack<S><<<grid_for(nx), T, 0, st->stream>>>(l->buckets_dev, l->nbuckets, l->mats_dev,
                                                       a.den, a.blk, bfp, X, nx);
    CUDA_CHECK_LAUNCH(ctx, "k_muon_pack");
    for (int it = 0; it < LUCID_NS_STEPS; it++) {
        for (int b = 0; b < l->nbuckets; b++) { /* A = X X^T */
            const lucid_muon_bucket &k = l->buckets_host[b];
            LUCID_TRY(gemm_sb(ctx, st, CUBLAS_OP_T, k.M, k.M, k.K, X + k.x_off, k.K,
                              (long long)k.M * k.K, X + k.x_off, k.K, (long long)k.M * k.K,
                              A32 + k.a_off, k.M, (long long)k.M * k.M, k.count, dt));
        }
        k_ns_a<S><<<grid_for(na), T, 0, st->stream>>>(A32, As, Ts, na, a.blk, bfp);
        CUDA_CHECK_LAUNCH(ctx, "k_ns_a");
        for (int b = 0; b < l->nbuckets; b++) { /* B = (cA) A */
            const lucid_muon_bucket &k = l->buckets_host[b];
            LUCID_TRY(gemm_sb(ctx, st, CUBLAS_OP_N, k.M, k.M, k.M, As + k.a_off, k.M,
                              (long long)k.M * k.M, Ts + k.a_off, k.M, (long long)k.M * k.M,
                              B32 + k.a_off, k.M, (long long)k.M * k.M, k.count, dt));
        }
        k_ns_b<S><<<grid_for(na), T, 0, st->stream>>>(As, B32, Bs, na, a.blk, bfp);
        CUDA_CHECK_LAUNCH(ctx, "k_ns_b");
        for (int b = 0; b < l->nbuckets; b++) { /* Y = B X */
            const lucid_muon_bucket &k = l->buckets_host[b];
            LUCID_TRY(gemm_sb(ctx, st, CUBLAS_OP_N, k.K, k.M, k.M, X + k.x_off, k.K,
                              (long long)k.M * k.K, Bs + k.a_off, k.M, (long long)k.M * k.M,
                              Y + k.x_off, k.K, (long long)k.M * k.K, k.count, dt));
        }
        k_ns_x<S><<<grid_for(nx), T, 0, st->stream>>>(X, Y, nx, a.blk, bfp);
        CUDA_CHECK_LAUNCH(ctx, "k_ns_x");
    }
    k_muon_apply<S><<<l->nchunks_train, T, 0, st->stream>>>(a);
    CUDA_CHECK_LAUNCH(ctx, "k_muon_apply");
    return LUCID_OK;
}

template <typename S>
static lucid_status musgd_t(lucid_ctx *ctx, lucid_cuda_state *st, const lucid_param_layout *l,
                            step_args a, unsigned grid, float *work) {
    if (grid > 0) {
        k_musgd_pre<S><<<grid, T, 0, st->stream>>>(a);
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
        launch_prepass<float>(st, l, blk, call->grad, PRE_STEP, f, kind);
        CUDA_CHECK_LAUNCH(ctx, "k_prepass (step)");
    } else {
        k_scalar<<<1, T, 0, st->stream>>>(blk, PRE_STEP, f, kind);
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
    a.vec = aligned(a.p, 16) && aligned(a.g, 16) && aligned(a.s0, 16) &&
            (call->kind != LUCID_OPTIM_ADAMW || aligned(a.s1, 16)) &&
            (!a.ema || aligned(a.ema, 16));
    switch (call->kind) {
    case LUCID_OPTIM_SGD:
    case LUCID_OPTIM_ADAMW: {
        if (!grid) break;
        /* launched early behind the pass / k_scalar just queued (their
         * blocks trigger it); it waits for them before reading blk */
        cudaError_t e = launch_step(call->kind == LUCID_OPTIM_SGD ? k_step<LUCID_OPTIM_SGD>
                                                                 : k_step<LUCID_OPTIM_ADAMW>,
                                    grid, st->stream, pdl_ok(st), a);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return lucid_cuda_err(ctx, e, "launch of optimizer update", __FILE__, __LINE__);
        }
        break;
    }
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
    k_scaler_update<<<1, 1, 0, st->stream>>>(blk);
    CUDA_CHECK_LAUNCH(ctx, "k_scaler_update");
    return LUCID_OK;
}

static lucid_status cu_scale(lucid_ctx *ctx, lucid_param_values *blk, float *x, int64_t n) {
    CUDA_ENTER(ctx, st);
    if (n == 0) return LUCID_OK;
    k_scale<<<grid_for(n), T, 0, st->stream>>>(blk, x, n);
    CUDA_CHECK_LAUNCH(ctx, "k_scale");
    return LUCID_OK;
}

static lucid_status cu_ema(lucid_ctx *ctx, const lucid_param_layout *l, lucid_param_values *blk,
                           float *e, const float *p) {
    CUDA_ENTER(ctx, st);
    if (l->nchunks_all == 0) {
        k_ema_prep<<<1, 1, 0, st->stream>>>(blk);
        CUDA_CHECK_LAUNCH(ctx, "k_ema_prep");
        return LUCID_OK;
    }
    k_ema<<<l->nchunks_all, T, 0, st->stream>>>(l->chunks_all_dev, blk, e, p, counter0(l));
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
