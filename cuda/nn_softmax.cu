/*
 * nn_softmax.cu — softmax over the last dim and the DFL projection on the
 * GPU, forward and backward.
 *
 * Contract (nn.h): contiguous tensors, activations f32/bf16/f16 computed in
 * f32 (expf, full precision), rounded once on store.  Forward overwrites;
 * backward dx = beta*dx + new (beta 0 never reads dx).
 *   softmax: viewed as [rows, L]; one warp per row, three passes over the
 *            row (max, sum of exp, write), lane-strided and folded by a
 *            fixed xor-shuffle tree: deterministic.
 *            backward (takes y): dx = y * (dy - sum(dy*y)).
 *   dfl:     x [B, 4R, S] -> y [B, 4, S]; one thread per (b, j, s) runs the
 *            R bins in order (coalesced across s):
 *            p = softmax_k x[b, j*R+k, s], y = sum_k k*p_k,
 *            dx[b, j*R+k, s] = dy[b,j,s] * p_k * (k - y).
 */
#include "nn_common.cuh"

#include <math.h>

#define SM_THREADS 256 /* 8 rows per block */

static __device__ __forceinline__ float nn_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = (u > v || isnan(u)) ? u : v;
    }
    return v;
}

template <typename T>
static __global__ void softmax_fwd(const T *__restrict__ x, T *__restrict__ y,
                            int64_t rows, int64_t L) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    int lane = threadIdx.x & 31;
    int64_t wpb = blockDim.x >> 5;
    for (int64_t r = (int64_t)blockIdx.x * wpb + (threadIdx.x >> 5); r < rows;
         r += (int64_t)gridDim.x * wpb) {
        const T *xr = x + r * L;
        T *yr = y + r * L;
        float m = -INFINITY;
        for (int64_t i = lane; i < L; i += 32) {
            float v = lucid_elem<T>::load(xr, i);
            m = (v > m || isnan(v)) ? v : m;
        }
        m = nn_warp_max(m);
        float s = 0.0f;
        for (int64_t i = lane; i < L; i += 32) s += expf(lucid_elem<T>::load(xr, i) - m);
        s = nn_warp_sum(s);
        for (int64_t i = lane; i < L; i += 32)
            lucid_elem<T>::store(yr, i, expf(lucid_elem<T>::load(xr, i) - m) / s);
    }
}

template <typename T>
static __global__ void softmax_bwd(const T *__restrict__ y, const T *__restrict__ dy,
                            T *dx, int64_t rows, int64_t L, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    int lane = threadIdx.x & 31;
    int64_t wpb = blockDim.x >> 5;
    for (int64_t r = (int64_t)blockIdx.x * wpb + (threadIdx.x >> 5); r < rows;
         r += (int64_t)gridDim.x * wpb) {
        const T *yr = y + r * L, *gr = dy + r * L;
        T *dr = dx + r * L;
        float dot = 0.0f;
        for (int64_t i = lane; i < L; i += 32)
            dot = fmaf(lucid_elem<T>::load(gr, i), lucid_elem<T>::load(yr, i), dot);
        dot = nn_warp_sum(dot);
        for (int64_t i = lane; i < L; i += 32) {
            float v = lucid_elem<T>::load(yr, i) * (lucid_elem<T>::load(gr, i) - dot);
            if (beta != 0.0f) v = fmaf(beta, lucid_elem<T>::load(dr, i), v);
            lucid_elem<T>::store(dr, i, v);
        }
    }
}

static unsigned sm_blocks(int64_t rows) {
    int64_t b = (rows + 7) / 8;
    if (b < 1) b = 1;
    if (b > (1 << 20)) b = 1 << 20;
    return (unsigned)b;
}

extern "C" lucid_status lucid_cuda_softmax_forward(lucid_ctx *ctx,
                                                   const lucid_tensor *x,
                                                   lucid_tensor *y) {
    LUCID_TRY(nn_check_act(ctx, "softmax_forward", x->dtype));
    CUDA_ENTER(ctx, st);
    int64_t L = x->shape[x->ndim - 1];
    int64_t rows = L ? lucid_tensor_numel(x) / L : 0;
    if (rows == 0) return LUCID_OK;
    NN_DISPATCH(x->dtype, (lucid_launch(softmax_fwd<T>, sm_blocks(rows), SM_THREADS, 0,
                                        st->stream, (const T *)lucid_tensor_data(x),
                                        (T *)lucid_tensor_data(y), rows, L)));
    CUDA_CHECK_LAUNCH(ctx, "softmax_fwd");
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_softmax_backward(lucid_ctx *ctx,
                                                    const lucid_tensor *y,
                                                    const lucid_tensor *dy,
                                                    lucid_tensor *dx,
                                                    double beta) {
    LUCID_TRY(nn_check_act(ctx, "softmax_backward", y->dtype));
    CUDA_ENTER(ctx, st);
    int64_t L = y->shape[y->ndim - 1];
    int64_t rows = L ? lucid_tensor_numel(y) / L : 0;
    if (rows == 0) return LUCID_OK;
    NN_DISPATCH(y->dtype, (lucid_launch(softmax_bwd<T>, sm_blocks(rows), SM_THREADS, 0,
                                        st->stream, (const T *)lucid_tensor_data(y),
                                        (const T *)lucid_tensor_data(dy),
                                        (T *)lucid_tensor_data(dx), rows, L, (float)beta)));
    CUDA_CHECK_LAUNCH(ctx, "softmax_bwd");
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// DFL

#define DFL_MAX_R 64 /* register array bound (Ultralytics: reg_max 16) */

template <typename T, int RMAX>
static __global__ void dfl_kernel(const T *__restrict__ x, const T *__restrict__ dy,
                           T *out, int64_t B, int64_t S, int R, float beta,
                           int backward) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    int64_t total = B * 4 * S;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        int64_t s = t % S, bj = t / S; /* bj = b*4 + j */
        int64_t base = bj * R * S + s;  /* x[b, j*R + 0, s] */
        float p[RMAX];
        float m = -INFINITY;
#pragma unroll
        for (int k = 0; k < RMAX; k++) {
            if (k < R) {
                p[k] = lucid_elem<T>::load(x, base + (int64_t)k * S);
                m = (p[k] > m || isnan(p[k])) ? p[k] : m;
            }
        }
        float z = 0.0f;
#pragma unroll
        for (int k = 0; k < RMAX; k++)
            if (k < R) {
                p[k] = expf(p[k] - m);
                z += p[k];
            }
        float e = 0.0f;
#pragma unroll
        for (int k = 0; k < RMAX; k++)
            if (k < R) {
                p[k] = p[k] / z;
                e = fmaf((float)k, p[k], e);
            }
        if (!backward) {
            lucid_elem<T>::store(out, t, e);
            continue;
        }
        float g = lucid_elem<T>::load(dy, t);
#pragma unroll
        for (int k = 0; k < RMAX; k++)
            if (k < R) {
                int64_t o = base + (int64_t)k * S;
                float v = g * p[k] * ((float)k - e);
                if (beta != 0.0f) v = fmaf(beta, lucid_elem<T>::load(out, o), v);
                lucid_elem<T>::store(out, o, v);
            }
    }
}

static lucid_status dfl_launch(lucid_ctx *ctx, const char *op,
                               const lucid_tensor *x, const lucid_tensor *dy,
                               lucid_tensor *out, int R, double beta,
                               int backward) {
    LUCID_TRY(nn_check_act(ctx, op, x->dtype));
    if (R > DFL_MAX_R)
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "%s on cuda: reg_max %d > %d is not supported", op,
                            R, DFL_MAX_R);
    CUDA_ENTER(ctx, st);
    int64_t B = x->shape[0], S = nn_inner(x, 2);
    int64_t total = B * 4 * S;
    if (total == 0) return LUCID_OK;
    unsigned blocks = lucid_cuda_blocks(total, 128);
    const void *dyp = dy ? lucid_tensor_data(dy) : NULL;
#define DFL_GO(RM)                                                            \
    NN_DISPATCH(x->dtype, (lucid_launch(dfl_kernel<T, RM>, blocks, 128, 0, st->stream, \
                              (const T *)lucid_tensor_data(x), (const T *)dyp, \
                              (T *)lucid_tensor_data(out), B, S, R,           \
                              (float)beta, backward)))
    if (R <= 16) DFL_GO(16);
    else DFL_GO(DFL_MAX_R);
#undef DFL_GO
    CUDA_CHECK_LAUNCH(ctx, "dfl_kernel");
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_dfl_forward(lucid_ctx *ctx,
                                               const lucid_tensor *x,
                                               lucid_tensor *y, int reg_max) {
    return dfl_launch(ctx, "dfl_forward", x, NULL, y, reg_max, 0.0, 0);
}

extern "C" lucid_status lucid_cuda_dfl_backward(lucid_ctx *ctx,
                                                const lucid_tensor *x,
                                                const lucid_tensor *dy,
                                                lucid_tensor *dx, int reg_max,
                                                double beta) {
    return dfl_launch(ctx, "dfl_backward", x, dy, dx, reg_max, beta, 1);
}
