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
 *     so a recorded graph replays while the schedule moves. Scalar
 *     prologues/epilogues run in one-thread kernels through the shared
 *     lucid_pb_* helpers (same code as the CPU).
 *   - All work is queued on the context's compute stream; nothing
 *     synchronizes except memcpy_d2h (a read-back).
 *   - Bitwise agreement with the CPU reference: elementwise math uses
 *     __fmul_rn/__fadd_rn/__fdiv_rn/__fsqrt_rn (no FMA contraction); the
 *     norm uses the fixed lane/tree order of optim_backend.h (no float
 *     atomics; found_inf is an int written with atomicExch, whose result is
 *     order independent). MuSGD's GEMMs go through cuBLAS (f32, no TF32 per
 *     the backend's math mode) and are deterministic but not bitwise equal
 *     to OpenBLAS.
 *   - One block of LUCID_OPTIM_THREADS threads per chunk of
 *     LUCID_OPTIM_CHUNK elements.
 */
#include "common.cuh"
#include <stdlib.h>
#include <string.h>
#include "train/optim_backend.h"

#define T LUCID_OPTIM_THREADS

#define MUL __fmul_rn
#define ADD __fadd_rn
#define SUB __fsub_rn
#define DIV __fdiv_rn

__device__ __forceinline__ float lerp_aten(float a, float b, float w) {
    return (w < 0.5f && w > -0.5f) ? ADD(a, MUL(w, SUB(b, a)))
                                   : SUB(b, MUL(SUB(b, a), SUB(1.0f, w)));
}

__device__ __forceinline__ float rbf(float x, int on) {
    return on ? __bfloat162float(__float2bfloat16_rn(x)) : x;
}

__device__ __forceinline__ int is_finite_f(float x) { return SUB(x, x) == 0.0f; }

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

/* ------------------------------------------------------------ prologues */

__global__ void k_optim_prep(lucid_param_values *blk, int kind) {
    lucid_pb_optim_prep(blk, (lucid_optim_kind)kind);
}
__global__ void k_ema_prep(lucid_param_values *blk) { lucid_pb_ema_prep(blk); }
__global__ void k_unscale_prep(lucid_param_values *blk) {
    if (blk->in.scaler_enabled) lucid_pb_unscale_prep(blk);
}
__global__ void k_scaler_update(lucid_param_values *blk) { lucid_pb_scaler_update(blk); }

/* ------------------------------------------------------------ grads */

__global__ void k_unscale(const lucid_chunk *chunks, lucid_param_values *blk, float *g) {
    if (!blk->in.scaler_enabled) return;
    const lucid_chunk c = chunks[blockIdx.x];
    float inv = blk->st.inv_scale;
    int found = 0;
    for (int j = threadIdx.x; j < c.len; j += T) {
        float x = g[c.start + j];
        if (!is_finite_f(x)) found = 1;
        if (inv != 1.0f) g[c.start + j] = MUL(x, inv);
    }
    if (found) atomicExch(&blk->st.found_inf, 1);
}

template <typename G>
__global__ void k_norm_partial(const lucid_chunk *chunks, const G *g, float *part) {
    __shared__ float sh[T];
    const lucid_chunk c = chunks[blockIdx.x];
    float s = 0.0f;
    for (int j = threadIdx.x; j < c.len; j += T) {
        float x = lucid_elem<G>::load(g, c.start + j);
        s = ADD(s, MUL(x, x));
    }
    float r = block_fold(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = r;
}

__global__ void k_norm_finish(const float *part, int n, lucid_param_values *blk) {
    __shared__ float sh[T];
    float s = 0.0f;
    for (int j = threadIdx.x; j < n; j += T) s = ADD(s, part[j]);
    float r = block_fold(s, sh);
    if (threadIdx.x == 0) lucid_pb_norm_finish(blk, r);
}

template <typename G>
__global__ void k_clip_apply(const lucid_chunk *chunks, const lucid_param_values *blk, G *g) {
    const lucid_chunk c = chunks[blockIdx.x];
    float coef = blk->st.clip_coef;
    for (int j = threadIdx.x; j < c.len; j += T) {
        int64_t i = c.start + j;
        lucid_elem<G>::store(g, i, MUL(lucid_elem<G>::load(g, i), coef));
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

/* ------------------------------------------------------------ updates */

__device__ __forceinline__ float sgd_elem(float p, float g, float *buf, float lr, float mu,
                                          float wd, int nest) {
    float d = g;
    if (wd != 0.0f) d = ADD(d, MUL(wd, p));
    float b = ADD(MUL(*buf, mu), d);
    *buf = b;
    float u = nest ? ADD(d, MUL(mu, b)) : b;
    return ADD(p, MUL(-lr, u));
}

/* skip_muon: MuSGD's SGD branch (muon segments are handled separately). */
__global__ void k_sgd(const lucid_chunk *chunks, const lucid_seg_info *segs,
                      const lucid_param_values *blk, float *p, const float *g, float *buf,
                      int skip_muon) {
    if (blk->st.found_inf) return;
    const lucid_chunk c = chunks[blockIdx.x];
    const lucid_seg_info sg = segs[c.seg];
    if (skip_muon && (sg.flags & LUCID_SEG_MUON)) return;
    int s = sg.slot;
    float lr = blk->in.lr[s], mu = blk->in.momentum[s], wd = blk->in.weight_decay[s];
    int nest = blk->in.nesterov;
    for (int j = threadIdx.x; j < c.len; j += T) {
        int64_t i = c.start + j;
        p[i] = sgd_elem(p[i], g[i], &buf[i], lr, mu, wd, nest);
    }
}

__global__ void k_adamw(const lucid_chunk *chunks, const lucid_seg_info *segs,
                        const lucid_param_values *blk, float *p, const float *g, float *m,
                        float *v) {
    if (blk->st.found_inf) return;
    const lucid_chunk c = chunks[blockIdx.x];
    int s = segs[c.seg].slot;
    float eps = blk->in.eps, b2 = blk->in.beta2;
    float omb2 = (float)(1.0 - (double)b2);
    float w1 = (float)(1.0 - (double)blk->in.momentum[s]);
    float dm = blk->st.decay_mul[s], bc2 = blk->st.bc2_sqrt[s], nss = -blk->st.step_size[s];
    for (int j = threadIdx.x; j < c.len; j += T) {
        int64_t i = c.start + j;
        float gi = g[i];
        float pi = MUL(p[i], dm);
        float mi = lerp_aten(m[i], gi, w1);
        float vi = ADD(MUL(v[i], b2), MUL(omb2, MUL(gi, gi)));
        float den = ADD(DIV(__fsqrt_rn(vi), bc2), eps);
        p[i] = ADD(pi, MUL(nss, DIV(mi, den)));
        m[i] = mi;
        v[i] = vi;
    }
}

/* ------------------------------------------------------------ MuSGD */

/* Momentum + Nesterov mix of one muon segment into U (bf16-rounded when
 * ns_bf16, as X = G.bfloat16()). */
__global__ void k_muon_momentum(lucid_seg_info sg, const lucid_param_values *blk,
                                const float *g, float *buf, float *U) {
    if (blk->st.found_inf) return;
    float mu = blk->in.momentum[sg.slot];
    float w1 = (float)(1.0 - (double)mu);
    int nest = blk->in.nesterov, bf = blk->in.ns_bf16;
    for (int64_t j = blockIdx.x * (int64_t)T + threadIdx.x; j < sg.numel;
         j += (int64_t)gridDim.x * T) {
        float gi = g[sg.offset + j];
        float mi = lerp_aten(buf[sg.offset + j], gi, w1);
        buf[sg.offset + j] = mi;
        U[j] = rbf(nest ? lerp_aten(gi, mi, mu) : mi, bf);
    }
}

/* Frobenius norm of U (one block, fixed order) -> X = U/den, transposed to
 * m x k when rows > cols. Scalar den kept in sc[0]. */
__global__ void k_muon_norm(const float *U, int64_t n, const lucid_param_values *blk,
                            float *sc) {
    __shared__ float sh[T];
    if (blk->st.found_inf) return;
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += T) s = ADD(s, MUL(U[j], U[j]));
    float r = block_fold(s, sh);
    if (threadIdx.x == 0) {
        int bf = blk->in.ns_bf16;
        float nrm = rbf(__fsqrt_rn(r), bf);
        sc[0] = rbf(ADD(nrm, LUCID_NS_EPS), bf);
    }
}

__global__ void k_muon_scale_in(const float *U, int rows, int cols, const float *sc,
                                const lucid_param_values *blk, float *X) {
    if (blk->st.found_inf) return;
    int bf = blk->in.ns_bf16, tr = rows > cols;
    float den = sc[0];
    int64_t n = (int64_t)rows * cols;
    for (int64_t j = blockIdx.x * (int64_t)T + threadIdx.x; j < n; j += (int64_t)gridDim.x * T) {
        int64_t r = j / cols, c = j % cols;
        float x = rbf(DIV(U[j], den), bf);
        X[tr ? c * rows + r : j] = x;
    }
}

/* A = rb(A); T = rb(c*A) */
__global__ void k_ns_a(float *A, float *Tm, int64_t n, const lucid_param_values *blk) {
    if (blk->st.found_inf) return;
    int bf = blk->in.ns_bf16;
    for (int64_t i = blockIdx.x * (int64_t)T + threadIdx.x; i < n; i += (int64_t)gridDim.x * T) {
        float a = rbf(A[i], bf);
        A[i] = a;
        Tm[i] = rbf(MUL(LUCID_NS_C, a), bf);
    }
}

/* B = rb(rb(b*A) + rb(B)) */
__global__ void k_ns_b(const float *A, float *B, int64_t n, const lucid_param_values *blk) {
    if (blk->st.found_inf) return;
    int bf = blk->in.ns_bf16;
    for (int64_t i = blockIdx.x * (int64_t)T + threadIdx.x; i < n; i += (int64_t)gridDim.x * T)
        B[i] = rbf(ADD(rbf(MUL(LUCID_NS_B, A[i]), bf), rbf(B[i], bf)), bf);
}

/* X = rb(rb(a*X) + rb(Y)) */
__global__ void k_ns_x(float *X, const float *Y, int64_t n, const lucid_param_values *blk) {
    if (blk->st.found_inf) return;
    int bf = blk->in.ns_bf16;
    for (int64_t i = blockIdx.x * (int64_t)T + threadIdx.x; i < n; i += (int64_t)gridDim.x * T)
        X[i] = rbf(ADD(rbf(MUL(LUCID_NS_A, X[i]), bf), rbf(Y[i], bf)), bf);
}

/* p += f32(-(lr*muon))*O; then the SGD part with buffer bs. */
__global__ void k_muon_apply(lucid_seg_info sg, const lucid_param_values *blk, const float *X,
                             float *p, const float *g, float *bs) {
    if (blk->st.found_inf) return;
    int s = sg.slot, bf = blk->in.ns_bf16, nest = blk->in.nesterov;
    float lr = blk->in.lr[s], mu = blk->in.momentum[s], wd = blk->in.weight_decay[s];
    float am = (float)(-((double)lr * (double)blk->in.muon_scale));
    float as = (float)(-((double)lr * (double)blk->in.sgd_scale));
    int rows = sg.rows, cols = sg.cols, tr = rows > cols;
    for (int64_t j = blockIdx.x * (int64_t)T + threadIdx.x; j < sg.numel;
         j += (int64_t)gridDim.x * T) {
        int64_t r = j / cols, c = j % cols;
        float o = X[tr ? c * rows + r : j];
        if (sg.muon_shape_scale != 1.0f) o = rbf(MUL(o, sg.muon_shape_scale), bf);
        int64_t i = sg.offset + j;
        float pi = ADD(p[i], MUL(am, o));
        float d = g[i];
        if (wd != 0.0f) d = ADD(d, MUL(wd, pi));
        float b = ADD(MUL(bs[i], mu), d);
        bs[i] = b;
        float u = nest ? ADD(d, MUL(mu, b)) : b;
        p[i] = ADD(pi, MUL(as, u));
    }
}

/* ------------------------------------------------------------ EMA, scale */

__global__ void k_ema(const lucid_chunk *chunks, const lucid_param_values *blk, float *e,
                      const float *p) {
    const lucid_chunk c = chunks[blockIdx.x];
    float d = blk->st.ema_d, omd = blk->st.ema_1md;
    for (int j = threadIdx.x; j < c.len; j += T) {
        int64_t i = c.start + j;
        e[i] = ADD(MUL(e[i], d), MUL(omd, p[i]));
    }
}

__global__ void k_scale(const lucid_param_values *blk, float *x, int64_t n) {
    float s = blk->st.loss_scale;
    for (int64_t i = blockIdx.x * (int64_t)T + threadIdx.x; i < n; i += (int64_t)gridDim.x * T)
        x[i] = MUL(x[i], s);
}

/* ------------------------------------------------------------ host side */

static unsigned grid_for(int64_t n) { return lucid_cuda_blocks(n, T); }

static lucid_status cu_unscale(lucid_ctx *ctx, const lucid_param_layout *l,
                               lucid_param_values *blk, float *g) {
    CUDA_ENTER(ctx, st);
    k_unscale_prep<<<1, 1, 0, st->stream>>>(blk);
    CUDA_CHECK_LAUNCH(ctx, "k_unscale_prep");
    if (l->nchunks_train == 0) return LUCID_OK;
    k_unscale<<<l->nchunks_train, T, 0, st->stream>>>(l->chunks_train_dev, blk, g);
    CUDA_CHECK_LAUNCH(ctx, "k_unscale");
    return LUCID_OK;
}

template <typename G>
static lucid_status norm_t(lucid_ctx *ctx, lucid_cuda_state *st, const lucid_param_layout *l,
                          lucid_param_values *blk, G *g, int apply) {
    float *part = (float *)lucid_tensor_data(l->partials);
    if (l->nchunks_train > 0) {
        k_norm_partial<G><<<l->nchunks_train, T, 0, st->stream>>>(l->chunks_train_dev, g, part);
        CUDA_CHECK_LAUNCH(ctx, "k_norm_partial");
    }
    k_norm_finish<<<1, T, 0, st->stream>>>(part, l->nchunks_train, blk);
    CUDA_CHECK_LAUNCH(ctx, "k_norm_finish");
    if (apply && l->nchunks_train > 0) {
        k_clip_apply<G><<<l->nchunks_train, T, 0, st->stream>>>(l->chunks_train_dev, blk, g);
        CUDA_CHECK_LAUNCH(ctx, "k_clip_apply");
    }
    return LUCID_OK;
}

static lucid_status cu_norm(lucid_ctx *ctx, const lucid_param_layout *l,
                            lucid_param_values *blk, void *g, lucid_dtype dt, int apply) {
    CUDA_ENTER(ctx, st);
    switch (dt) {
    case LUCID_BF16: return norm_t(ctx, st, l, blk, (__nv_bfloat16 *)g, apply);
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
        k_clip_value<<<n, T, 0, st->stream>>>(l->chunks_train_dev, blk, (__nv_bfloat16 *)g);
    else if (dt == LUCID_F16)
        k_clip_value<<<n, T, 0, st->stream>>>(l->chunks_train_dev, blk, (__half *)g);
    else
        k_clip_value<<<n, T, 0, st->stream>>>(l->chunks_train_dev, blk, (float *)g);
    CUDA_CHECK_LAUNCH(ctx, "k_clip_value");
    return LUCID_OK;
}

/* Row-major C[M x N] = A[M x K] * op(B) through column-major cuBLAS:
 * C^T = op(B)^T A^T. transb: B is given as N x K (row-major) and used
 * transposed. */
static lucid_status gemm_rm(lucid_ctx *ctx, lucid_cuda_state *st, int M, int N, int K,
                            const float *A, const float *B, int transb, float *C) {
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(ctx, cublasSgemm(st->cublas, transb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  CUBLAS_OP_N, N, M, K, &one, B, transb ? K : N, A, K,
                                  &zero, C, N));
    return LUCID_OK;
}

static lucid_status cu_musgd(lucid_ctx *ctx, lucid_cuda_state *st, const lucid_param_layout *l,
                             lucid_param_values *blk, float *p, const float *g, float *buf,
                             float *bs, float *work) {
    if (l->nchunks_train > 0) {
        k_sgd<<<l->nchunks_train, T, 0, st->stream>>>(l->chunks_train_dev, l->seg_dev, blk, p,
                                                      g, buf, 1);
        CUDA_CHECK_LAUNCH(ctx, "k_sgd (MuSGD)");
    }
    /* cuBLAS host pointer mode keeps alpha/beta constants on the host; the
     * step-varying scalars stay in the block. A skipped step (found_inf)
     * still runs the GEMMs on stale data, but every kernel that writes
     * parameters or state returns early. */
    for (int k = 0; k < l->nmuon; k++) {
        const lucid_seg_info sg = l->seg_host[l->muon_host[k]];
        int64_t n = sg.numel;
        int tr = sg.rows > sg.cols;
        int m = tr ? sg.cols : sg.rows, kk = tr ? sg.rows : sg.cols;
        int64_t mm = (int64_t)m * m;
        float *U = work, *X = U + n, *A = X + n, *Tm = A + mm, *B = Tm + mm;
        float *sc = B + mm;
        unsigned gr = grid_for(n), gm = grid_for(mm);
        k_muon_momentum<<<gr, T, 0, st->stream>>>(sg, blk, g, buf, U);
        k_muon_norm<<<1, T, 0, st->stream>>>(U, n, blk, sc);
        k_muon_scale_in<<<gr, T, 0, st->stream>>>(U, sg.rows, sg.cols, sc, blk, X);
        CUDA_CHECK_LAUNCH(ctx, "muon prologue");
        float *Y = U; /* U is free once X is built */
        for (int it = 0; it < LUCID_NS_STEPS; it++) {
            LUCID_TRY(gemm_rm(ctx, st, m, m, kk, X, X, 1, A));   /* A = X X^T */
            k_ns_a<<<gm, T, 0, st->stream>>>(A, Tm, mm, blk);
            LUCID_TRY(gemm_rm(ctx, st, m, m, m, Tm, A, 0, B));   /* B = (cA) A */
            k_ns_b<<<gm, T, 0, st->stream>>>(A, B, mm, blk);
            LUCID_TRY(gemm_rm(ctx, st, m, kk, m, B, X, 0, Y));   /* Y = B X */
            k_ns_x<<<gr, T, 0, st->stream>>>(X, Y, n, blk);
            CUDA_CHECK_LAUNCH(ctx, "newton-schulz step");
        }
        k_muon_apply<<<gr, T, 0, st->stream>>>(sg, blk, X, p, g, bs);
        CUDA_CHECK_LAUNCH(ctx, "k_muon_apply");
    }
    return LUCID_OK;
}

static lucid_status cu_optim_step(lucid_ctx *ctx, const lucid_param_layout *l,
                                  lucid_param_values *blk, lucid_optim_kind kind, float *p,
                                  const float *g, float *s0, float *s1, float *work) {
    CUDA_ENTER(ctx, st);
    k_optim_prep<<<1, 1, 0, st->stream>>>(blk, (int)kind);
    CUDA_CHECK_LAUNCH(ctx, "k_optim_prep");
    int n = l->nchunks_train;
    switch (kind) {
    case LUCID_OPTIM_SGD:
        if (n) k_sgd<<<n, T, 0, st->stream>>>(l->chunks_train_dev, l->seg_dev, blk, p, g, s0, 0);
        break;
    case LUCID_OPTIM_ADAMW:
        if (n) k_adamw<<<n, T, 0, st->stream>>>(l->chunks_train_dev, l->seg_dev, blk, p, g, s0, s1);
        break;
    case LUCID_OPTIM_MUSGD: return cu_musgd(ctx, st, l, blk, p, g, s0, s1, work);
    default: return lucid_seterr(ctx, LUCID_ERR_ARG, "optimizer: unknown kind %d", (int)kind);
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
    k_ema_prep<<<1, 1, 0, st->stream>>>(blk);
    CUDA_CHECK_LAUNCH(ctx, "k_ema_prep");
    if (l->nchunks_all == 0) return LUCID_OK;
    k_ema<<<l->nchunks_all, T, 0, st->stream>>>(l->chunks_all_dev, blk, e, p);
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
