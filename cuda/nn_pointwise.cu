/*
 * nn_pointwise.cu — SiLU, Add, channel_copy, nearest Upsample and MaxPool2d
 * on the GPU, forward and backward.
 *
 * Contract (nn.h): contiguous NCHW (SiLU/Add/channel_copy: any rank),
 * activations f32/bf16/f16 computed in f32 and rounded once on store.
 * Forward outputs are overwritten; backward outputs follow the beta
 * semantics (dx = beta*dx + new; beta 0 never reads dx).
 *   silu:     y = x*s, dx = dy*s*(1 + x*(1-s)), s = 1/(1+exp(-x))
 *   add:      y = a + b (y may alias a or b: elementwise, same index)
 *   channel_copy: dst[:, d0:d0+n] = beta*dst[...] + src[:, s0:s0+n]; the
 *             dtypes of dst and src may differ (converted through f32);
 *             same dtype with beta 0 is one cudaMemcpy2DAsync.
 *   upsample: y[i,j] = x[i/s, j/s]; dx[h,w] = sum of the s x s block of dy
 *             (a gather: one thread per dx element, fixed order)
 *   maxpool:  padding -inf, ties to the first maximum in row-major window
 *             order, NaN wins (as the CPU reference); indices i32 h*W+w.
 *             Backward is a gather: one thread per dx element sums, in
 *             output order, dy of the windows whose argmax it is; without
 *             indices the argmax is first recomputed into the nn arena.
 * No atomics: every result is bitwise reproducible.
 */
#include "nn_common.cuh"

#include <math.h>

#define PW_THREADS 256

static unsigned pw_blocks(int64_t n) { return lucid_cuda_blocks(n, PW_THREADS); }

// ----------------------------------------------------------------------------
// SiLU

template <typename T>
static __global__ void silu_fwd(const T *__restrict__ x, T *__restrict__ y, int64_t n) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float v = lucid_elem<T>::load(x, i);
        lucid_elem<T>::store(y, i, v * nn_sigmoid(v));
    }
}

template <typename T>
static __global__ void silu_bwd(const T *__restrict__ x, const T *__restrict__ dy, T *dx,
                         int64_t n, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float v = lucid_elem<T>::load(x, i), s = nn_sigmoid(v);
        float g = lucid_elem<T>::load(dy, i) * s * (1.0f + v * (1.0f - s));
        if (beta != 0.0f) g = fmaf(beta, lucid_elem<T>::load(dx, i), g);
        lucid_elem<T>::store(dx, i, g);
    }
}

extern "C" lucid_status lucid_cuda_silu_forward(lucid_ctx *ctx,
                                                const lucid_tensor *x,
                                                lucid_tensor *y) {
    LUCID_TRY(nn_check_act(ctx, "silu_forward", x->dtype));
    CUDA_ENTER(ctx, st);
    int64_t n = lucid_tensor_numel(x);
    NN_DISPATCH(x->dtype, (lucid_launch(silu_fwd<T>, pw_blocks(n), PW_THREADS, 0, st->stream,
                                        (const T *)lucid_tensor_data(x),
                                        (T *)lucid_tensor_data(y), n)));
    CUDA_CHECK_LAUNCH(ctx, "silu_fwd");
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_silu_backward(lucid_ctx *ctx,
                                                 const lucid_tensor *x,
                                                 const lucid_tensor *dy,
                                                 lucid_tensor *dx, double beta) {
    LUCID_TRY(nn_check_act(ctx, "silu_backward", x->dtype));
    CUDA_ENTER(ctx, st);
    int64_t n = lucid_tensor_numel(x);
    NN_DISPATCH(x->dtype, (lucid_launch(silu_bwd<T>, pw_blocks(n), PW_THREADS, 0, st->stream,
                                        (const T *)lucid_tensor_data(x),
                                        (const T *)lucid_tensor_data(dy),
                                        (T *)lucid_tensor_data(dx), n, (float)beta)));
    CUDA_CHECK_LAUNCH(ctx, "silu_bwd");
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// Add

template <typename T>
static __global__ void add_fwd(const T *a, const T *b, T *y, int64_t n) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        lucid_elem<T>::store(y, i, __fadd_rn(lucid_elem<T>::load(a, i),
                                             lucid_elem<T>::load(b, i)));
}

extern "C" lucid_status lucid_cuda_add_forward(lucid_ctx *ctx,
                                               const lucid_tensor *a,
                                               const lucid_tensor *b,
                                               lucid_tensor *y) {
    LUCID_TRY(nn_check_act(ctx, "add_forward", a->dtype));
    CUDA_ENTER(ctx, st);
    int64_t n = lucid_tensor_numel(y);
    NN_DISPATCH(a->dtype, (lucid_launch(add_fwd<T>, pw_blocks(n), PW_THREADS, 0, st->stream,
                                        (const T *)lucid_tensor_data(a),
                                        (const T *)lucid_tensor_data(b),
                                        (T *)lucid_tensor_data(y), n)));
    CUDA_CHECK_LAUNCH(ctx, "add_fwd");
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// channel_copy

/* dst row n: dst + (n*Cd + d0)*S, len = nch*S; src row: src + (n*Cs + s0)*S */
template <typename D, typename Sx>
static __global__ void chan_copy(D *dst, const Sx *src, int64_t N, int64_t len,
                          int64_t dstride, int64_t sstride, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    int64_t total = N * len;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = i / len, k = i - n * len;
        int64_t di = n * dstride + k, si = n * sstride + k;
        float v = lucid_elem<Sx>::load(src, si);
        if (beta != 0.0f) v = fmaf(beta, lucid_elem<D>::load(dst, di), v);
        lucid_elem<D>::store(dst, di, v);
    }
}

extern "C" lucid_status lucid_cuda_channel_copy(lucid_ctx *ctx,
                                                lucid_tensor *dst,
                                                int64_t dst_c0,
                                                const lucid_tensor *src,
                                                int64_t src_c0, int64_t nch,
                                                double beta) {
    LUCID_TRY(nn_check_act(ctx, "channel_copy", dst->dtype));
    LUCID_TRY(nn_check_act(ctx, "channel_copy", src->dtype));
    CUDA_ENTER(ctx, st);
    int64_t N = dst->shape[0], Cd = dst->shape[1], Cs = src->shape[1];
    int64_t S = nn_inner(dst, 2);
    int64_t len = nch * S;
    if (N * len == 0) return LUCID_OK;
    char *dd = (char *)lucid_tensor_data(dst);
    const char *sd = (const char *)lucid_tensor_data(src);
    size_t des = lucid_dtype_size(dst->dtype), ses = lucid_dtype_size(src->dtype);
    dd += (size_t)(dst_c0 * S) * des;
    sd += (size_t)(src_c0 * S) * ses;
    if (beta == 0.0 && dst->dtype == src->dtype) {
        CUDA_CHECK(ctx, cudaMemcpy2DAsync(dd, (size_t)(Cd * S) * des, sd,
                                          (size_t)(Cs * S) * ses,
                                          (size_t)len * des, (size_t)N,
                                          cudaMemcpyDeviceToDevice, st->stream));
        return LUCID_OK;
    }
    unsigned blocks = pw_blocks(N * len);
    float b = (float)beta;
#define CC_SRC(D)                                                             \
    switch (src->dtype) {                                                     \
    case LUCID_F32:                                                           \
        lucid_launch(chan_copy<D, float>, blocks, PW_THREADS, 0, st->stream,  \
            (D *)dd, (const float *)sd, N, len, Cd * S, Cs * S, b);           \
        break;                                                                \
    case LUCID_BF16:                                                          \
        lucid_launch(chan_copy<D, __nv_bfloat16>, blocks, PW_THREADS, 0, st->stream, \
            (D *)dd, (const __nv_bfloat16 *)sd, N, len, Cd * S, Cs * S, b);   \
        break;                                                                \
    default:                                                                  \
        lucid_launch(chan_copy<D, __half>, blocks, PW_THREADS, 0, st->stream, \
            (D *)dd, (const __half *)sd, N, len, Cd * S, Cs * S, b);          \
        break;                                                                \
    }
    switch (dst->dtype) {
    case LUCID_F32: CC_SRC(float); break;
    case LUCID_BF16: CC_SRC(__nv_bfloat16); break;
    default: CC_SRC(__half); break;
    }
#undef CC_SRC
    CUDA_CHECK_LAUNCH(ctx, "chan_copy");
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// nearest Upsample

template <typename T>
static __global__ void up_fwd(const T *__restrict__ x, T *__restrict__ y, int64_t NC,
                       int64_t H, int64_t W, int s) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    int64_t Ho = H * s, Wo = W * s, total = NC * Ho * Wo;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t j = i % Wo, r = i / Wo;
        int64_t h = r % Ho, pl = r / Ho;
        y[i] = x[(pl * H + h / s) * W + j / s];
    }
}

template <typename T>
static __global__ void up_bwd(const T *__restrict__ dy, T *dx, int64_t NC, int64_t H,
                       int64_t W, int s, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    int64_t Wo = W * s, total = NC * H * W;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t w = i % W, r = i / W;
        int64_t h = r % H, pl = r / H;
        const T *row = dy + ((pl * H + h) * s) * Wo + w * s;
        float acc = 0.0f;
        for (int a = 0; a < s; a++)
            for (int b = 0; b < s; b++)
                acc += lucid_elem<T>::load(row, (int64_t)a * Wo + b);
        if (beta != 0.0f) acc = fmaf(beta, lucid_elem<T>::load(dx, i), acc);
        lucid_elem<T>::store(dx, i, acc);
    }
}

extern "C" lucid_status lucid_cuda_upsample_nearest2d_forward(
    lucid_ctx *ctx, const lucid_tensor *x, lucid_tensor *y, int scale) {
    LUCID_TRY(nn_check_act(ctx, "upsample_nearest2d_forward", x->dtype));
    CUDA_ENTER(ctx, st);
    int64_t NC = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t n = NC * H * W * scale * scale;
    NN_DISPATCH(x->dtype, (lucid_launch(up_fwd<T>, pw_blocks(n), PW_THREADS, 0, st->stream,
                                        (const T *)lucid_tensor_data(x),
                                        (T *)lucid_tensor_data(y), NC, H, W, scale)));
    CUDA_CHECK_LAUNCH(ctx, "up_fwd");
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_upsample_nearest2d_backward(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, int scale, double beta) {
    LUCID_TRY(nn_check_act(ctx, "upsample_nearest2d_backward", dx->dtype));
    CUDA_ENTER(ctx, st);
    int64_t NC = dx->shape[0] * dx->shape[1], H = dx->shape[2], W = dx->shape[3];
    int64_t n = NC * H * W;
    NN_DISPATCH(dx->dtype, (lucid_launch(up_bwd<T>, pw_blocks(n), PW_THREADS, 0, st->stream,
                                         (const T *)lucid_tensor_data(dy),
                                         (T *)lucid_tensor_data(dx), NC, H, W, scale,
                                         (float)beta)));
    CUDA_CHECK_LAUNCH(ctx, "up_bwd");
    (void)x;
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// MaxPool2d

typedef struct pool_geom {
    int64_t NC, H, W, Ho, Wo;
    int kh, kw, sh, sw, ph, pw;
} pool_geom;

/* Argmax of window (i, j) of plane xp: flat h*W+w, -1 if all padding. */
template <typename T>
static __device__ __forceinline__ int pool_argmax(const T *xp, const pool_geom &g,
                                           int64_t i, int64_t j, float *mv) {
    int best = -1;
    float m = -INFINITY;
    for (int u = 0; u < g.kh; u++) {
        int64_t hi = i * g.sh - g.ph + u;
        if (hi < 0 || hi >= g.H) continue;
        for (int v = 0; v < g.kw; v++) {
            int64_t wi = j * g.sw - g.pw + v;
            if (wi < 0 || wi >= g.W) continue;
            float val = lucid_elem<T>::load(xp, hi * g.W + wi);
            if (best < 0 || val > m || (isnan(val) && !isnan(m))) {
                m = val;
                best = (int)(hi * g.W + wi);
            }
        }
    }
    *mv = m;
    return best;
}

template <typename T>
static __global__ void pool_fwd(const T *__restrict__ x, T *y, int32_t *idx,
                         pool_geom g) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    int64_t total = g.NC * g.Ho * g.Wo;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < total;
         o += (int64_t)gridDim.x * blockDim.x) {
        int64_t j = o % g.Wo, r = o / g.Wo;
        int64_t i = r % g.Ho, pl = r / g.Ho;
        float m;
        int a = pool_argmax<T>(x + pl * g.H * g.W, g, i, j, &m);
        if (y) lucid_elem<T>::store(y, o, m);
        if (idx) idx[o] = a;
    }
}

/* dx[h,w] = beta*dx + sum over outputs (i,j) whose window holds (h,w) and
 * whose argmax is (h,w), in (i, j) order. */
template <typename T>
static __global__ void pool_bwd(const T *__restrict__ dy, const int32_t *__restrict__ idx,
                         T *dx, pool_geom g, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    int64_t total = g.NC * g.H * g.W;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t w = e % g.W, r = e / g.W;
        int64_t h = r % g.H, pl = r / g.H;
        int self = (int)(h * g.W + w);
        /* i*sh - ph <= h <= i*sh - ph + kh - 1 */
        int64_t ilo = h + g.ph - g.kh + 1, ihi = h + g.ph;
        ilo = ilo <= 0 ? 0 : (ilo + g.sh - 1) / g.sh;
        ihi = ihi < 0 ? -1 : ihi / g.sh;
        if (ihi > g.Ho - 1) ihi = g.Ho - 1;
        int64_t jlo = w + g.pw - g.kw + 1, jhi = w + g.pw;
        jlo = jlo <= 0 ? 0 : (jlo + g.sw - 1) / g.sw;
        jhi = jhi < 0 ? -1 : jhi / g.sw;
        if (jhi > g.Wo - 1) jhi = g.Wo - 1;
        const int32_t *ip = idx + pl * g.Ho * g.Wo;
        const T *dp = dy + pl * g.Ho * g.Wo;
        float acc = 0.0f;
        for (int64_t i = ilo; i <= ihi; i++)
            for (int64_t j = jlo; j <= jhi; j++) {
                int64_t o = i * g.Wo + j;
                if (ip[o] == self) acc += lucid_elem<T>::load(dp, o);
            }
        if (beta != 0.0f) acc = fmaf(beta, lucid_elem<T>::load(dx, e), acc);
        lucid_elem<T>::store(dx, e, acc);
    }
}

static pool_geom pool_geom_of(const lucid_tensor *x, int64_t Ho, int64_t Wo,
                              const lucid_pool2d_params *p) {
    pool_geom g;
    g.NC = x->shape[0] * x->shape[1];
    g.H = x->shape[2];
    g.W = x->shape[3];
    g.Ho = Ho;
    g.Wo = Wo;
    g.kh = p->kernel_h; g.kw = p->kernel_w;
    g.sh = p->stride_h; g.sw = p->stride_w;
    g.ph = p->pad_h; g.pw = p->pad_w;
    return g;
}

extern "C" lucid_status lucid_cuda_maxpool2d_forward(
    lucid_ctx *ctx, const lucid_tensor *x, lucid_tensor *y,
    lucid_tensor *indices, const lucid_pool2d_params *p) {
    LUCID_TRY(nn_check_act(ctx, "maxpool2d_forward", x->dtype));
    CUDA_ENTER(ctx, st);
    pool_geom g = pool_geom_of(x, y->shape[2], y->shape[3], p);
    int64_t n = g.NC * g.Ho * g.Wo;
    int32_t *idx = indices ? (int32_t *)lucid_tensor_data(indices) : NULL;
    NN_DISPATCH(x->dtype, (lucid_launch(pool_fwd<T>, pw_blocks(n), PW_THREADS, 0, st->stream,
                                        (const T *)lucid_tensor_data(x),
                                        (T *)lucid_tensor_data(y), idx, g)));
    CUDA_CHECK_LAUNCH(ctx, "pool_fwd");
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_maxpool2d_backward(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, const lucid_tensor *indices,
    const lucid_pool2d_params *p, double beta) {
    LUCID_TRY(nn_check_act(ctx, "maxpool2d_backward", x->dtype));
    CUDA_ENTER(ctx, st);
    pool_geom g = pool_geom_of(x, dy->shape[2], dy->shape[3], p);
    int64_t no = g.NC * g.Ho * g.Wo, ni = g.NC * g.H * g.W;
    const int32_t *idx = indices ? (const int32_t *)lucid_tensor_data(indices) : NULL;
    if (!idx) {
        lucid_cuda_nn_state *ns = lucid_cuda_nn_get(ctx, st);
        if (!ns) return ctx->last_status;
        void *ws = NULL;
        LUCID_TRY(lucid_cuda_nn_arena(ctx, st, ns, sizeof(int32_t) * (size_t)no,
                                      "maxpool2d_backward", &ws));
        NN_DISPATCH(x->dtype, (lucid_launch(pool_fwd<T>, pw_blocks(no), PW_THREADS, 0,
                                            st->stream, (const T *)lucid_tensor_data(x),
                                            nullptr, (int32_t *)ws, g)));
        CUDA_CHECK_LAUNCH(ctx, "pool_fwd (argmax)");
        idx = (const int32_t *)ws;
    }
    NN_DISPATCH(x->dtype, (lucid_launch(pool_bwd<T>, pw_blocks(ni), PW_THREADS, 0, st->stream,
                                        (const T *)lucid_tensor_data(dy), idx,
                                        (T *)lucid_tensor_data(dx), g, (float)beta)));
    CUDA_CHECK_LAUNCH(ctx, "pool_bwd");
    return LUCID_OK;
}
