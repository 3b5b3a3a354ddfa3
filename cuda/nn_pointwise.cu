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
 *             same dtype with beta 0 moves bits with the vector kernel
 *             below, or with one cudaMemcpy2DAsync under
 *             LUCID_CHAN_COPY=memcpy (for A/B timing: a copy node is not a
 *             PDL launch, and was slower in the recorded step).
 *   channel_copy_multi: up to CM_PIECES (16) beta-0 same-dtype copies
 *             (or zero fills) per launch, one block range per piece (see
 *             chan_copy_multi below); bits moved as unsigned integers of
 *             the element size, so identical to channel_copy's. A launch
 *             that holds a sum piece (lucid_chan_piece addends) takes
 *             chan_sum_multi: per element v = src0, then v = round_T(v +
 *             src_j) in f32 (__fadd_rn), the bits of add_fwd /
 *             map_contig_kernel chained; its copy and zero pieces move
 *             bits as chan_copy_multi's. Under LUCID_CHAN_COPY=memcpy:
 *             one cudaMemcpy2DAsync / cudaMemset2DAsync per piece (a sum
 *             piece: its copy, then one beta-1 channel_copy per addend,
 *             fma(1, dst, addend): the same rounding).
 *   upsample: y[i,j] = x[i/s, j/s]; dx[h,w] = sum of the s x s block of dy
 *             (a gather: one thread per dx element, or per half vector of
 *             dx, fixed order: acc = 0, += dy[a][b] row-major, then
 *             beta*dx with one fma, one rounding)
 *   maxpool:  padding -inf, ties to the first maximum in row-major window
 *             order, NaN wins (as the CPU reference); indices i32 h*W+w.
 *             Backward is a gather: one thread per dx element sums, in
 *             output order, dy of the windows whose argmax it is; without
 *             indices the argmax is first recomputed into the nn arena.
 *
 * Vector paths (chosen on the host, 16 bytes = V elements: 8 x bf16/f16,
 * 4 x f32; bits and results identical to the one-element forms):
 *   add:      a, b, y 16-byte aligned: V-element vectors, PW_UNROLL per
 *             thread per grid-stride step, the n % V tail one per thread;
 *             else one element per thread. 32-bit index: pieces of at most
 *             PW_CHUNK (2^30) elements, one launch each.
 *   channel_copy (same dtype): dst and src of every row 16-byte aligned
 *             (base pointers and row strides Cd*S, Cs*S in bytes multiples
 *             of 16): rows on grid y, V-element vectors along the row on
 *             grid x, the len % V tail of each row one per thread; beta 0
 *             moves bits, beta != 0 is fma(beta, dst, src) per element.
 *             Mixed dtypes or unaligned rows: one element per thread, same
 *             grid. No division per element.
 *   upsample s = 2, W a multiple of V/2, x (fwd) / dx (bwd) 8-byte and
 *             y / dy 16-byte aligned: one unit = V/2 consecutive elements of
 *             an input (dx) row r = pl*H + h; forward loads them as 8 bytes
 *             and stores each element twice as one 16-byte vector into
 *             output rows 2r and 2r+1; backward loads those two 16-byte dy
 *             vectors and stores V/2 dx elements as 8 bytes. Other scales,
 *             widths or alignments: one output (dx) element per thread.
 *   Upsample index math is 32-bit when y (dy) has fewer than 2^31
 *   elements, else 64-bit (channel_copy: when dst and src both have), with
 *   no per-element 64-bit division: the vector units divide once by Q, the
 *   one-element forms by the row length and s. Grids are capped at
 *   PW_WAVES waves of full-occupancy blocks on the device's SMs.
 *
 * No atomics: every result is bitwise reproducible.
 */
#include "nn_common.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PW_THREADS 256
#define PW_UNROLL 4                   /* vectors (units) per thread per step */
#define PW_WAVES 2                    /* grid cap, in full-occupancy waves */
#define PW_CHUNK ((int64_t)1 << 30)   /* add: elements per launch (32-bit) */

static unsigned pw_blocks(int64_t n) { return lucid_cuda_blocks(n, PW_THREADS); }

/* N elements of T as one aligned access (N * sizeof(T) = 16 or 8 bytes). */
template <typename T, int N> struct alignas(N * sizeof(T)) pw_pack {
    T e[N];
};

static inline bool pw_aligned(const void *p, unsigned bytes) {
    return ((uintptr_t)p & (uintptr_t)(bytes - 1)) == 0;
}

/* PW_WAVES waves of full-occupancy blocks (2048 resident threads per SM). */
static int64_t pw_cap(const lucid_cuda_state *st) {
    int64_t sms = st->sm_count > 0 ? st->sm_count : 132;
    return sms * (2048 / PW_THREADS) * PW_WAVES;
}

/* Blocks for `items` work items of `per_thread` each (grid-stride kernels):
 * at least 1, at most pw_cap. */
static unsigned pw_grid(const lucid_cuda_state *st, int64_t items, int per_thread) {
    int64_t per_block = (int64_t)PW_THREADS * per_thread;
    int64_t b = (items + per_block - 1) / per_block;
    int64_t cap = pw_cap(st);
    if (b > cap) b = cap;
    if (b < 1) b = 1;
    return (unsigned)b;
}

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

/* y = a + b over n <= PW_CHUNK elements. vec = 1 (a, b, y 16-byte
 * aligned): V-element vectors, all loads of a step before its stores (y may
 * alias a or b), then the n % V tail; vec = 0: one element per thread. */
template <typename T>
static __global__ void add_fwd(const T *a, const T *b, T *y, uint32_t n, int vec) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    constexpr uint32_t V = 16 / sizeof(T);
    typedef pw_pack<T, (int)V> vt;
    const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
    const uint32_t nt = gridDim.x * blockDim.x;
    uint32_t head = 0;
    if (vec) {
        const uint32_t nv = n / V;
        const vt *av = (const vt *)a, *bv = (const vt *)b;
        vt *yv = (vt *)y;
        for (uint32_t v0 = tid; v0 < nv; v0 += nt * PW_UNROLL) {
            vt xa[PW_UNROLL], xb[PW_UNROLL];
#pragma unroll
            for (int u = 0; u < PW_UNROLL; u++) {
                uint32_t v = v0 + (uint32_t)u * nt;
                if (v < nv) {
                    xa[u] = av[v];
                    xb[u] = bv[v];
                }
            }
#pragma unroll
            for (int u = 0; u < PW_UNROLL; u++) {
                uint32_t v = v0 + (uint32_t)u * nt;
                if (v < nv) {
                    vt o;
#pragma unroll
                    for (int k = 0; k < (int)V; k++)
                        lucid_elem<T>::store(o.e, k,
                                             __fadd_rn(lucid_elem<T>::load(xa[u].e, k),
                                                       lucid_elem<T>::load(xb[u].e, k)));
                    yv[v] = o;
                }
            }
        }
        head = nv * V;
    }
    for (uint32_t i = head + tid; i < n; i += nt)
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
    const char *ad = (const char *)lucid_tensor_data(a);
    const char *bd = (const char *)lucid_tensor_data(b);
    char *yd = (char *)lucid_tensor_data(y);
    const int vec = pw_aligned(ad, 16) && pw_aligned(bd, 16) && pw_aligned(yd, 16);
    const size_t es = lucid_dtype_size(a->dtype);
    const int64_t V = 16 / (int64_t)es;
    for (int64_t off = 0; off < n; off += PW_CHUNK) {
        int64_t m = n - off < PW_CHUNK ? n - off : PW_CHUNK;
        size_t bo = (size_t)off * es;
        unsigned blocks = vec ? pw_grid(st, m / V, PW_UNROLL) : pw_grid(st, m, 1);
        NN_DISPATCH(a->dtype, (lucid_launch(add_fwd<T>, blocks, PW_THREADS, 0, st->stream,
                                            (const T *)(ad + bo), (const T *)(bd + bo),
                                            (T *)(yd + bo), (uint32_t)m, vec)));
    }
    CUDA_CHECK_LAUNCH(ctx, "add_fwd");
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// channel_copy

/* Rows n < N (grid y, stride gridDim.y): dst row dst + n*dstride, src row
 * src + n*sstride, len elements each (dst + (n*Cd + d0)*S, src + (n*Cs +
 * s0)*S, len = nch*S); grid x walks the row. Any dtypes, any alignment. */
template <typename D, typename Sx, typename IndexT>
static __global__ void chan_copy(D *dst, const Sx *src, IndexT N, IndexT len,
                                 IndexT dstride, IndexT sstride, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const IndexT tx = (IndexT)blockIdx.x * blockDim.x + threadIdx.x;
    const IndexT ntx = (IndexT)gridDim.x * blockDim.x;
    for (IndexT n = blockIdx.y; n < N; n += gridDim.y) {
        D *dr = dst + n * dstride;
        const Sx *sr = src + n * sstride;
        for (IndexT k = tx; k < len; k += ntx) {
            float v = lucid_elem<Sx>::load(sr, k);
            if (beta != 0.0f) v = fmaf(beta, lucid_elem<D>::load(dr, k), v);
            lucid_elem<D>::store(dr, k, v);
        }
    }
}

/* Same rows, one dtype, every row start 16-byte aligned (host-checked):
 * V-element vectors along the row (PW_UNROLL per thread per step), then the
 * len % V tail one element per thread. beta 0 moves bits; beta != 0 is
 * fma(beta, dst, src) per element, as chan_copy. */
template <typename T, typename IndexT>
static __global__ void chan_copy_vec(T *dst, const T *src, IndexT N, IndexT len,
                                     IndexT dstride, IndexT sstride, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    constexpr int V = 16 / sizeof(T);
    typedef pw_pack<T, V> vt;
    const IndexT tx = (IndexT)blockIdx.x * blockDim.x + threadIdx.x;
    const IndexT ntx = (IndexT)gridDim.x * blockDim.x;
    const IndexT nv = len / V;
    for (IndexT n = blockIdx.y; n < N; n += gridDim.y) {
        T *dr = dst + n * dstride;
        const T *sr = src + n * sstride;
        vt *dv = (vt *)dr;
        const vt *sv = (const vt *)sr;
        for (IndexT v0 = tx; v0 < nv; v0 += ntx * PW_UNROLL) {
            vt xs[PW_UNROLL], xd[PW_UNROLL];
#pragma unroll
            for (int u = 0; u < PW_UNROLL; u++) {
                IndexT v = v0 + (IndexT)u * ntx;
                if (v < nv) {
                    xs[u] = sv[v];
                    if (beta != 0.0f) xd[u] = dv[v];
                }
            }
#pragma unroll
            for (int u = 0; u < PW_UNROLL; u++) {
                IndexT v = v0 + (IndexT)u * ntx;
                if (v < nv) {
                    if (beta != 0.0f) {
#pragma unroll
                        for (int k = 0; k < V; k++)
                            lucid_elem<T>::store(
                                xs[u].e, k,
                                fmaf(beta, lucid_elem<T>::load(xd[u].e, k),
                                     lucid_elem<T>::load(xs[u].e, k)));
                    }
                    dv[v] = xs[u];
                }
            }
        }
        for (IndexT k = nv * V + tx; k < len; k += ntx) {
            if (beta != 0.0f)
                lucid_elem<T>::store(dr, k, fmaf(beta, lucid_elem<T>::load(dr, k),
                                                 lucid_elem<T>::load(sr, k)));
            else
                dr[k] = sr[k];
        }
    }
}

/* Same-dtype beta-0 copies take chan_copy_vec (when aligned) unless
 * LUCID_CHAN_COPY=memcpy sends them to cudaMemcpy2DAsync (the default until
 * session 6: three H200 A/B pairs favoured the kernel, recorded step
 * 6.700 vs 6.779, 5.650 vs 5.756 and 5.377 vs 5.531 ms; docs/PERF.md). Read at each call
 * (a getenv is cheap next to a launch; tests switch it between calls). */
static bool chan_copy_kernel_env(void) {
    const char *e = getenv("LUCID_CHAN_COPY");
    return !(e && strcmp(e, "memcpy") == 0);
}

/* Stream operations queued by this thread's channel_copy and
 * channel_copy_multi calls: the test hook lucid_cuda_chan_copy_op_count
 * (nn_common.cuh); nothing here reads it. */
static thread_local unsigned long chan_copy_ops;

extern "C" unsigned long lucid_cuda_chan_copy_op_count(void) { return chan_copy_ops; }

/* grid: x along a row (`per_thread` elements per item), y over rows */
static dim3 cc_grid(const lucid_cuda_state *st, int64_t N, int64_t row_items,
                    int per_thread) {
    int64_t gy = N < 65535 ? N : 65535;
    int64_t gx = pw_grid(st, row_items, per_thread);
    int64_t gx_cap = pw_cap(st) / gy;
    if (gx > gx_cap) gx = gx_cap;
    if (gx < 1) gx = 1;
    return dim3((unsigned)gx, (unsigned)gy, 1);
}

template <typename IndexT>
static void launch_chan_copy(const lucid_cuda_state *st, lucid_dtype ddt,
                             lucid_dtype sdt, char *dd, const char *sd,
                             int64_t N, int64_t len, int64_t dstride,
                             int64_t sstride, float b, bool vec) {
    if (vec) {
        dim3 g = cc_grid(st, N, len / (int64_t)(16 / lucid_dtype_size(ddt)), PW_UNROLL);
        NN_DISPATCH(ddt, (lucid_launch(chan_copy_vec<T, IndexT>, g, PW_THREADS, 0,
                                       st->stream, (T *)dd, (const T *)sd, (IndexT)N,
                                       (IndexT)len, (IndexT)dstride, (IndexT)sstride, b)));
        return;
    }
    dim3 g = cc_grid(st, N, len, 1);
#define CC_SRC(D)                                                             \
    switch (sdt) {                                                            \
    case LUCID_F32:                                                           \
        lucid_launch(chan_copy<D, float, IndexT>, g, PW_THREADS, 0, st->stream, \
            (D *)dd, (const float *)sd, (IndexT)N, (IndexT)len,               \
            (IndexT)dstride, (IndexT)sstride, b);                             \
        break;                                                                \
    case LUCID_BF16:                                                          \
        lucid_launch(chan_copy<D, __nv_bfloat16, IndexT>, g, PW_THREADS, 0,   \
            st->stream, (D *)dd, (const __nv_bfloat16 *)sd, (IndexT)N,        \
            (IndexT)len, (IndexT)dstride, (IndexT)sstride, b);                \
        break;                                                                \
    default:                                                                  \
        lucid_launch(chan_copy<D, __half, IndexT>, g, PW_THREADS, 0, st->stream, \
            (D *)dd, (const __half *)sd, (IndexT)N, (IndexT)len,              \
            (IndexT)dstride, (IndexT)sstride, b);                             \
        break;                                                                \
    }
    switch (ddt) {
    case LUCID_F32: CC_SRC(float); break;
    case LUCID_BF16: CC_SRC(__nv_bfloat16); break;
    default: CC_SRC(__half); break;
    }
#undef CC_SRC
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
    const bool same = dst->dtype == src->dtype;
    const bool vec = same && pw_aligned(dd, 16) && pw_aligned(sd, 16) &&
                     ((size_t)(Cd * S) * des) % 16 == 0 &&
                     ((size_t)(Cs * S) * ses) % 16 == 0;
    if (beta == 0.0 && same && !(vec && chan_copy_kernel_env())) {
        CUDA_CHECK(ctx, cudaMemcpy2DAsync(dd, (size_t)(Cd * S) * des, sd,
                                          (size_t)(Cs * S) * ses,
                                          (size_t)len * des, (size_t)N,
                                          cudaMemcpyDeviceToDevice, st->stream));
        chan_copy_ops++;
        return LUCID_OK;
    }
    /* 32-bit when every offset of both tensors fits (the row loop's n*stride
     * + k stays below numel) */
    bool small = lucid_tensor_numel(dst) < ((int64_t)1 << 31) &&
                 lucid_tensor_numel(src) < ((int64_t)1 << 31);
    if (small)
        launch_chan_copy<uint32_t>(st, dst->dtype, src->dtype, dd, sd, N, len,
                                   Cd * S, Cs * S, (float)beta, vec);
    else
        launch_chan_copy<int64_t>(st, dst->dtype, src->dtype, dd, sd, N, len,
                                  Cd * S, Cs * S, (float)beta, vec);
    CUDA_CHECK_LAUNCH(ctx, "chan_copy");
    chan_copy_ops++;
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// channel_copy_multi

#define CM_PIECES 16 /* pieces per launch (Concat / Split of the nano models: <= 5) */

/* One piece of a launch: rows n < N of len elements at dst + n*dstride
 * (from src + n*sstride; src NULL: zero bits), strides in elements; its
 * blocks are [first, first + gx*gy): gx along a row, gy over rows. vec:
 * every dst (and src) row start 16-byte aligned. */
struct cm_piece {
    void *dst;
    const void *src;
    int64_t len, dstride, sstride;
    unsigned first, gx, gy;
    int vec;
};

/* The kernel parameter (passed by value, __grid_constant__): n pieces in
 * block order, one N for all. 912 bytes, well inside the 4 KiB limit. */
struct cm_table {
    cm_piece p[CM_PIECES];
    int64_t N;
    int n;
};

/* Block b belongs to the last piece whose first <= b (a scan of at most
 * CM_PIECES entries, the same for every thread of the block). E is the
 * unsigned integer of the element size: the bits move verbatim (NaN
 * payloads too). vec: V-element vectors along the row (PW_UNROLL per thread
 * per step, loads before stores), then the len % V tail one element per
 * thread; else one element per thread. No division per element. */
template <typename E, typename IndexT>
static __global__ void chan_copy_multi(const __grid_constant__ cm_table t) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    constexpr int V = 16 / sizeof(E);
    typedef pw_pack<E, V> vt;
    int pi = 0;
    while (pi + 1 < t.n && blockIdx.x >= t.p[pi + 1].first) pi++;
    const cm_piece &P = t.p[pi];
    const unsigned b = blockIdx.x - P.first;
    const unsigned by = b / P.gx, bx = b - by * P.gx;
    const IndexT tx = (IndexT)bx * blockDim.x + threadIdx.x;
    const IndexT ntx = (IndexT)P.gx * blockDim.x;
    const IndexT N = (IndexT)t.N, len = (IndexT)P.len;
    const IndexT dstride = (IndexT)P.dstride, sstride = (IndexT)P.sstride;
    const IndexT nv = P.vec ? len / V : 0;
    const E *src = (const E *)P.src;
    for (IndexT n = by; n < N; n += P.gy) {
        E *dr = (E *)P.dst + n * dstride;
        vt *dv = (vt *)dr;
        if (src) {
            const E *sr = src + n * sstride;
            const vt *sv = (const vt *)sr;
            for (IndexT v0 = tx; v0 < nv; v0 += ntx * PW_UNROLL) {
                vt xs[PW_UNROLL];
#pragma unroll
                for (int u = 0; u < PW_UNROLL; u++) {
                    IndexT v = v0 + (IndexT)u * ntx;
                    if (v < nv) xs[u] = sv[v];
                }
#pragma unroll
                for (int u = 0; u < PW_UNROLL; u++) {
                    IndexT v = v0 + (IndexT)u * ntx;
                    if (v < nv) dv[v] = xs[u];
                }
            }
            for (IndexT k = nv * V + tx; k < len; k += ntx) dr[k] = sr[k];
        } else {
            vt z;
#pragma unroll
            for (int k = 0; k < V; k++) z.e[k] = 0;
            for (IndexT v = tx; v < nv; v += ntx) dv[v] = z;
            for (IndexT k = nv * V + tx; k < len; k += ntx) dr[k] = 0;
        }
    }
}

/* LUCID_CHAN_COPY=memcpy: the pieces one by one, copies through
 * lucid_cuda_channel_copy (cudaMemcpy2DAsync when beta 0 and one dtype),
 * zero pieces with one cudaMemset2DAsync each. */
static lucid_status chan_copy_multi_each(lucid_ctx *ctx, const lucid_cuda_state *st,
                                         int n, const lucid_chan_piece *pc) {
    for (int i = 0; i < n; i++) {
        const lucid_chan_piece *p = &pc[i];
        if (p->src) {
            LUCID_TRY(lucid_cuda_channel_copy(ctx, p->dst, p->dst_c0, p->src, p->src_c0,
                                              p->nch, 0.0));
            /* a sum: dst = fma(1, dst, addend), one rounding per addition */
            for (int k = 1; k < lucid_chan_piece_nsrc(p); k++)
                LUCID_TRY(lucid_cuda_channel_copy(ctx, p->dst, p->dst_c0, p->add[k - 1],
                                                  p->add_c0[k - 1], p->nch, 1.0));
            continue;
        }
        int64_t N = p->dst->shape[0], Cd = p->dst->shape[1], S = nn_inner(p->dst, 2);
        size_t es = lucid_dtype_size(p->dst->dtype);
        char *dd = (char *)lucid_tensor_data(p->dst) + (size_t)(p->dst_c0 * S) * es;
        CUDA_CHECK(ctx, cudaMemset2DAsync(dd, (size_t)(Cd * S) * es, 0,
                                          (size_t)(p->nch * S) * es, (size_t)N,
                                          st->stream));
        chan_copy_ops++;
    }
    return LUCID_OK;
}

/* Block shares of m pieces of one launch: piece i has items[i] work items
 * of per[i] each per row, N rows; each gets the grid cc_grid would size
 * for a launch of its own (gx along a row, gy over rows); when they sum
 * past pw_cap, each is scaled down in proportion, at least one block.
 * Writes gx, gy and first (the piece's first block); returns the blocks. */
static unsigned cm_shares(const lucid_cuda_state *st, int m, int64_t N,
                          const int64_t *items, const int *per, int64_t *gx,
                          int64_t *gy, unsigned *first) {
    const int64_t cap = pw_cap(st);
    int64_t want = 0;
    for (int i = 0; i < m; i++) {
        gy[i] = N < 65535 ? N : 65535;
        gx[i] = pw_grid(st, items[i], per[i]);
        if (gx[i] > cap / gy[i]) gx[i] = cap / gy[i];
        if (gx[i] < 1) gx[i] = 1;
        want += gx[i] * gy[i];
    }
    int64_t f = 0;
    for (int i = 0; i < m; i++) {
        if (want > cap) {
            int64_t share = (int64_t)((double)(gx[i] * gy[i]) * (double)cap / (double)want);
            if (share < 1) share = 1;
            if (gy[i] > share) gy[i] = share;
            if (gx[i] > share / gy[i]) gx[i] = share / gy[i];
            if (gx[i] < 1) gx[i] = 1;
        }
        first[i] = (unsigned)f;
        f += gx[i] * gy[i];
    }
    return (unsigned)f;
}

/* Row j of a piece's source s from channel c0 (S elements per channel, es
 * bytes each): *row its first byte, *stride the elements between two
 * batch items; clears *small for a tensor of 2^31 elements or more.
 * Returns whether the row starts 16-byte aligned with whole 16-byte rows
 * (the vector path). */
static bool cm_src_row(const lucid_tensor *s, int64_t c0, int64_t S, size_t es,
                       const char **row, int64_t *stride, bool *small) {
    const int64_t Cs = s->shape[1];
    *row = (const char *)lucid_tensor_data(s) + (size_t)(c0 * S) * es;
    *stride = Cs * S;
    if (lucid_tensor_numel(s) >= ((int64_t)1 << 31)) *small = false;
    return pw_aligned(*row, 16) && ((size_t)(Cs * S) * es) % 16 == 0;
}

/* The block shares of a planned table t (cm_shares over the pieces' work
 * items) written into t->p[i].first / gx / gy. Returns the blocks. */
template <typename Table>
static unsigned cm_assign(const lucid_cuda_state *st, Table *t, int m, int64_t N,
                          const int64_t *items, const int *per) {
    int64_t gx[CM_PIECES], gy[CM_PIECES];
    unsigned first[CM_PIECES];
    const unsigned blocks = cm_shares(st, m, N, items, per, gx, gy, first);
    for (int i = 0; i < m; i++) {
        t->p[i].first = first[i];
        t->p[i].gx = (unsigned)gx[i];
        t->p[i].gy = (unsigned)gy[i];
    }
    return blocks;
}

/* Fill t.p[0..m) from pc (block shares: cm_shares). Returns the blocks. */
static unsigned cm_plan(const lucid_cuda_state *st, cm_table *t, int m,
                        const lucid_chan_piece *pc, bool *small) {
    const lucid_tensor *ref = pc[0].dst;
    const int64_t N = ref->shape[0], S = nn_inner(ref, 2);
    const size_t es = lucid_dtype_size(ref->dtype);
    const int64_t V = 16 / (int64_t)es;
    int64_t items[CM_PIECES];
    int per[CM_PIECES];
    memset(t, 0, sizeof *t);
    t->N = N;
    t->n = m;
    for (int i = 0; i < m; i++) {
        const lucid_chan_piece *p = &pc[i];
        cm_piece *q = &t->p[i];
        const int64_t Cd = p->dst->shape[1], len = p->nch * S;
        char *dd = (char *)lucid_tensor_data(p->dst) + (size_t)(p->dst_c0 * S) * es;
        const char *sd = NULL;
        bool vec = pw_aligned(dd, 16) && ((size_t)(Cd * S) * es) % 16 == 0;
        if (p->src) vec = cm_src_row(p->src, p->src_c0, S, es, &sd, &q->sstride, small) && vec;
        if (lucid_tensor_numel(p->dst) >= ((int64_t)1 << 31)) *small = false;
        q->dst = dd;
        q->src = sd;
        q->len = len;
        q->dstride = Cd * S;
        q->vec = vec;
        per[i] = vec ? PW_UNROLL : 1;
        items[i] = vec ? len / V : len;
    }
    return cm_assign(st, t, m, N, items, per);
}

// ----------------------------------------------------------------------------
// channel_copy_multi with sum pieces

/* One piece of a launch that holds a sum piece: ns sources (0: zero bits,
 * 1: a copy of src[0], 2..LUCID_CHAN_SUM_MAX: their rounded sum), rows n <
 * N of len elements at dst + n*dstride, source j at src[j] + n*sstride[j]
 * (strides in elements); blocks [first, first + gx*gy) as cm_piece. vec:
 * dst and every source row start 16-byte aligned. */
struct cs_piece {
    void *dst;
    const void *src[LUCID_CHAN_SUM_MAX];
    int64_t len, dstride;
    int64_t sstride[LUCID_CHAN_SUM_MAX];
    unsigned first, gx, gy;
    int vec, ns;
};

/* The kernel parameter (by value, __grid_constant__): 1808 bytes, inside
 * the 4 KiB limit. */
struct cs_table {
    cs_piece p[CM_PIECES];
    int64_t N;
    int n;
};

/* v rounded to T and back to f32 (exact): one rounding per addition. */
template <typename T> __device__ __forceinline__ float cs_round(float v);
template <> __device__ __forceinline__ float cs_round<float>(float v) { return v; }
template <> __device__ __forceinline__ float cs_round<__nv_bfloat16>(float v) {
    return __bfloat162float(__float2bfloat16_rn(v));
}
template <> __device__ __forceinline__ float cs_round<__half>(float v) {
    return __half2float(__float2half_rn(v));
}

/* The unsigned integer of T's size (bit copies). */
template <int B> struct cs_word;
template <> struct cs_word<2> { typedef uint16_t type; };
template <> struct cs_word<4> { typedef uint32_t type; };

/* A launch of pieces of which at least one is a sum; block b belongs to
 * the last piece whose first <= b (as chan_copy_multi). Sum pieces: per
 * element v = src0, then v = round_T(v + src_j) for j = 1..ns-1 in f32
 * (__fadd_rn: never contracted), stored as T: the bits of the chain
 * src0:add(src1):add(src2)... of add_fwd / map_contig_kernel. vec:
 * V-element vectors along the row (PW_UNROLL per thread per step, every
 * load of a step before its stores), then the len % V tail one element per
 * thread. Copy and zero pieces move bits as unsigned integers, exactly as
 * chan_copy_multi. No division per element. */
template <typename T, typename IndexT>
static __global__ void chan_sum_multi(const __grid_constant__ cs_table t) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    typedef typename cs_word<sizeof(T)>::type E;
    constexpr int V = 16 / sizeof(T);
    typedef pw_pack<T, V> vt;
    typedef pw_pack<E, V> vw;
    int pi = 0;
    while (pi + 1 < t.n && blockIdx.x >= t.p[pi + 1].first) pi++;
    const cs_piece &P = t.p[pi];
    const unsigned b = blockIdx.x - P.first;
    const unsigned by = b / P.gx, bx = b - by * P.gx;
    const IndexT tx = (IndexT)bx * blockDim.x + threadIdx.x;
    const IndexT ntx = (IndexT)P.gx * blockDim.x;
    const IndexT N = (IndexT)t.N, len = (IndexT)P.len, dstride = (IndexT)P.dstride;
    const IndexT nv = P.vec ? len / V : 0;
    const int ns = P.ns;
    for (IndexT n = by; n < N; n += P.gy) {
        if (ns >= 2) {
            T *dr = (T *)P.dst + n * dstride;
            const T *sr[LUCID_CHAN_SUM_MAX];
#pragma unroll
            for (int j = 0; j < LUCID_CHAN_SUM_MAX; j++)
                sr[j] = j < ns ? (const T *)P.src[j] + n * (IndexT)P.sstride[j] : nullptr;
            for (IndexT v0 = tx; v0 < nv; v0 += ntx * PW_UNROLL) {
                float acc[PW_UNROLL][V];
#pragma unroll
                for (int u = 0; u < PW_UNROLL; u++) {
                    IndexT v = v0 + (IndexT)u * ntx;
                    if (v < nv) {
                        vt x = ((const vt *)sr[0])[v];
#pragma unroll
                        for (int k = 0; k < V; k++) acc[u][k] = lucid_elem<T>::load(x.e, k);
                    }
                }
#pragma unroll
                for (int j = 1; j < LUCID_CHAN_SUM_MAX; j++) {
                    if (j >= ns) break;
                    vt xs[PW_UNROLL];
#pragma unroll
                    for (int u = 0; u < PW_UNROLL; u++) {
                        IndexT v = v0 + (IndexT)u * ntx;
                        if (v < nv) xs[u] = ((const vt *)sr[j])[v];
                    }
#pragma unroll
                    for (int u = 0; u < PW_UNROLL; u++) {
                        IndexT v = v0 + (IndexT)u * ntx;
                        if (v < nv) {
#pragma unroll
                            for (int k = 0; k < V; k++)
                                acc[u][k] = cs_round<T>(
                                    __fadd_rn(acc[u][k], lucid_elem<T>::load(xs[u].e, k)));
                        }
                    }
                }
#pragma unroll
                for (int u = 0; u < PW_UNROLL; u++) {
                    IndexT v = v0 + (IndexT)u * ntx;
                    if (v < nv) {
                        vt o;
#pragma unroll
                        for (int k = 0; k < V; k++) lucid_elem<T>::store(o.e, k, acc[u][k]);
                        ((vt *)dr)[v] = o;
                    }
                }
            }
            for (IndexT k = nv * V + tx; k < len; k += ntx) {
                float a = lucid_elem<T>::load(sr[0], k);
#pragma unroll
                for (int j = 1; j < LUCID_CHAN_SUM_MAX; j++) {
                    if (j >= ns) break;
                    a = cs_round<T>(__fadd_rn(a, lucid_elem<T>::load(sr[j], k)));
                }
                lucid_elem<T>::store(dr, k, a);
            }
        } else if (ns == 1) {
            E *dr = (E *)P.dst + n * dstride;
            const E *sr = (const E *)P.src[0] + n * (IndexT)P.sstride[0];
            for (IndexT v0 = tx; v0 < nv; v0 += ntx * PW_UNROLL) {
                vw xs[PW_UNROLL];
#pragma unroll
                for (int u = 0; u < PW_UNROLL; u++) {
                    IndexT v = v0 + (IndexT)u * ntx;
                    if (v < nv) xs[u] = ((const vw *)sr)[v];
                }
#pragma unroll
                for (int u = 0; u < PW_UNROLL; u++) {
                    IndexT v = v0 + (IndexT)u * ntx;
                    if (v < nv) ((vw *)dr)[v] = xs[u];
                }
            }
            for (IndexT k = nv * V + tx; k < len; k += ntx) dr[k] = sr[k];
        } else {
            E *dr = (E *)P.dst + n * dstride;
            vw z;
#pragma unroll
            for (int k = 0; k < V; k++) z.e[k] = 0;
            for (IndexT v = tx; v < nv; v += ntx) ((vw *)dr)[v] = z;
            for (IndexT k = nv * V + tx; k < len; k += ntx) dr[k] = 0;
        }
    }
}

/* Fill t.p[0..m) from pc (block shares: cm_shares; a sum piece's work
 * items are those of a copy of its length). Returns the blocks. */
static unsigned cs_plan(const lucid_cuda_state *st, cs_table *t, int m,
                        const lucid_chan_piece *pc, bool *small) {
    const lucid_tensor *ref = pc[0].dst;
    const int64_t N = ref->shape[0], S = nn_inner(ref, 2);
    const size_t es = lucid_dtype_size(ref->dtype);
    const int64_t V = 16 / (int64_t)es;
    int64_t items[CM_PIECES];
    int per[CM_PIECES];
    memset(t, 0, sizeof *t);
    t->N = N;
    t->n = m;
    for (int i = 0; i < m; i++) {
        const lucid_chan_piece *p = &pc[i];
        cs_piece *q = &t->p[i];
        const int64_t Cd = p->dst->shape[1], len = p->nch * S;
        char *dd = (char *)lucid_tensor_data(p->dst) + (size_t)(p->dst_c0 * S) * es;
        bool vec = pw_aligned(dd, 16) && ((size_t)(Cd * S) * es) % 16 == 0;
        q->ns = lucid_chan_piece_nsrc(p);
        for (int j = 0; j < q->ns; j++) {
            const char *sd = NULL;
            vec = cm_src_row(j ? p->add[j - 1] : p->src, j ? p->add_c0[j - 1] : p->src_c0, S,
                             es, &sd, &q->sstride[j], small) && vec;
            q->src[j] = sd;
        }
        if (lucid_tensor_numel(p->dst) >= ((int64_t)1 << 31)) *small = false;
        q->dst = dd;
        q->len = len;
        q->dstride = Cd * S;
        q->vec = vec;
        per[i] = vec ? PW_UNROLL : 1;
        items[i] = vec ? len / V : len;
    }
    return cm_assign(st, t, m, N, items, per);
}

extern "C" lucid_status lucid_cuda_channel_copy_multi(lucid_ctx *ctx, int n,
                                                      const lucid_chan_piece *pc) {
    const lucid_dtype dt = pc[0].dst->dtype;
    LUCID_TRY(nn_check_act(ctx, "channel_copy_multi", dt));
    CUDA_ENTER(ctx, st);
    if (!chan_copy_kernel_env()) return chan_copy_multi_each(ctx, st, n, pc);
    for (int c0 = 0; c0 < n; c0 += CM_PIECES) {
        const int m = n - c0 < CM_PIECES ? n - c0 : CM_PIECES;
        bool sums = false, small = true;
        for (int i = 0; i < m; i++) sums = sums || lucid_chan_piece_nsrc(&pc[c0 + i]) > 1;
        if (sums) {
            cs_table t;
            const unsigned blocks = cs_plan(st, &t, m, pc + c0, &small);
#define CS_LAUNCH(T)                                                          \
    do {                                                                      \
        if (small)                                                            \
            lucid_launch(chan_sum_multi<T, uint32_t>, blocks, PW_THREADS, 0,  \
                         st->stream, t);                                      \
        else                                                                  \
            lucid_launch(chan_sum_multi<T, int64_t>, blocks, PW_THREADS, 0,   \
                         st->stream, t);                                      \
    } while (0)
            switch (dt) {
            case LUCID_F32: CS_LAUNCH(float); break;
            case LUCID_BF16: CS_LAUNCH(__nv_bfloat16); break;
            default: CS_LAUNCH(__half); break;
            }
#undef CS_LAUNCH
            CUDA_CHECK_LAUNCH(ctx, "chan_sum_multi");
            chan_copy_ops++;
            continue;
        }
        cm_table t;
        const unsigned blocks = cm_plan(st, &t, m, pc + c0, &small);
        if (lucid_dtype_size(dt) == 2) {
            if (small)
                lucid_launch(chan_copy_multi<uint16_t, uint32_t>, blocks, PW_THREADS, 0,
                             st->stream, t);
            else
                lucid_launch(chan_copy_multi<uint16_t, int64_t>, blocks, PW_THREADS, 0,
                             st->stream, t);
        } else {
            if (small)
                lucid_launch(chan_copy_multi<uint32_t, uint32_t>, blocks, PW_THREADS, 0,
                             st->stream, t);
            else
                lucid_launch(chan_copy_multi<uint32_t, int64_t>, blocks, PW_THREADS, 0,
                             st->stream, t);
        }
        CUDA_CHECK_LAUNCH(ctx, "chan_copy_multi");
        chan_copy_ops++;
    }
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// nearest Upsample

/* Any scale, any alignment: one output element per thread. Output row
 * r = pl*Ho + i reads input row r / s = pl*H + i/s (pl*H*s divides by s). */
template <typename T, typename IndexT>
static __global__ void up_fwd(const T *__restrict__ x, T *__restrict__ y,
                              IndexT total, IndexT W, IndexT Wo, IndexT s) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (IndexT i = (IndexT)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (IndexT)gridDim.x * blockDim.x) {
        IndexT r = i / Wo, j = i - r * Wo;
        y[i] = x[(r / s) * W + j / s];
    }
}

/* s = 2, W % (V/2) == 0 (V = 16 / sizeof(T)), x 8-byte and y 16-byte
 * aligned: unit u = the V/2 elements x[u*V/2 ..] of input row r = u / Q
 * (Q = W / (V/2) units per row, column unit c = u - r*Q); each element is
 * stored twice (bits moved) as the V-element vector c of output rows 2r and
 * 2r+1, i.e. output vectors 2r*Q + c = u + r*Q and that + Q. */
template <typename T, typename IndexT>
static __global__ void up2_fwd_vec(const T *__restrict__ x, T *__restrict__ y,
                                   IndexT units, IndexT Q) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    constexpr int V = 16 / sizeof(T), H2 = V / 2;
    typedef pw_pack<T, V> vt;
    typedef pw_pack<T, H2> ht;
    const ht *xh = (const ht *)x;
    vt *yv = (vt *)y;
    const IndexT tid = (IndexT)blockIdx.x * blockDim.x + threadIdx.x;
    const IndexT nt = (IndexT)gridDim.x * blockDim.x;
    for (IndexT u0 = tid; u0 < units; u0 += nt * PW_UNROLL) {
        ht in[PW_UNROLL];
#pragma unroll
        for (int k = 0; k < PW_UNROLL; k++) {
            IndexT u = u0 + (IndexT)k * nt;
            if (u < units) in[k] = xh[u];
        }
#pragma unroll
        for (int k = 0; k < PW_UNROLL; k++) {
            IndexT u = u0 + (IndexT)k * nt;
            if (u < units) {
                vt o;
#pragma unroll
                for (int e = 0; e < H2; e++) o.e[2 * e] = o.e[2 * e + 1] = in[k].e[e];
                IndexT ov = u + (u / Q) * Q;
                yv[ov] = o;
                yv[ov + Q] = o;
            }
        }
    }
}

/* Any scale, any alignment: one dx element per thread; dx row r = pl*H + h
 * gathers dy rows r*s .. r*s+s-1 (pl*Ho + h*s = r*s), columns w*s ... */
template <typename T, typename IndexT>
static __global__ void up_bwd(const T *__restrict__ dy, T *dx, IndexT total,
                              IndexT W, IndexT Wo, int s, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (IndexT i = (IndexT)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (IndexT)gridDim.x * blockDim.x) {
        IndexT r = i / W, w = i - r * W;
        const T *row = dy + (r * (IndexT)s) * Wo + w * (IndexT)s;
        float acc = 0.0f;
        for (int a = 0; a < s; a++)
            for (int b = 0; b < s; b++)
                acc += lucid_elem<T>::load(row, (IndexT)a * Wo + (IndexT)b);
        if (beta != 0.0f) acc = fmaf(beta, lucid_elem<T>::load(dx, i), acc);
        lucid_elem<T>::store(dx, i, acc);
    }
}

/* s = 2, W % (V/2) == 0, dy 16-byte and dx 8-byte aligned: unit u = the V/2
 * elements dx[u*V/2 ..] of dx row r = u / Q (Q = W / (V/2)); it reads the
 * dy vectors u + r*Q (row 2r) and that + Q (row 2r+1) and sums each 2 x 2
 * block in the order of up_bwd: acc = 0, + row 2r (b = 0, 1), + row 2r+1
 * (b = 0, 1), then fma(beta, dx, acc), one rounding. */
template <typename T, typename IndexT>
static __global__ void up2_bwd_vec(const T *__restrict__ dy, T *dx, IndexT units,
                                   IndexT Q, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    constexpr int V = 16 / sizeof(T), H2 = V / 2;
    typedef pw_pack<T, V> vt;
    typedef pw_pack<T, H2> ht;
    const vt *dyv = (const vt *)dy;
    ht *dxh = (ht *)dx;
    const IndexT tid = (IndexT)blockIdx.x * blockDim.x + threadIdx.x;
    const IndexT nt = (IndexT)gridDim.x * blockDim.x;
    for (IndexT u0 = tid; u0 < units; u0 += nt * PW_UNROLL) {
        vt r0[PW_UNROLL], r1[PW_UNROLL];
        ht old[PW_UNROLL];
#pragma unroll
        for (int k = 0; k < PW_UNROLL; k++) {
            IndexT u = u0 + (IndexT)k * nt;
            if (u < units) {
                IndexT v = u + (u / Q) * Q;
                r0[k] = dyv[v];
                r1[k] = dyv[v + Q];
                if (beta != 0.0f) old[k] = dxh[u];
            }
        }
#pragma unroll
        for (int k = 0; k < PW_UNROLL; k++) {
            IndexT u = u0 + (IndexT)k * nt;
            if (u < units) {
                ht o;
#pragma unroll
                for (int e = 0; e < H2; e++) {
                    float acc = 0.0f;
                    acc += lucid_elem<T>::load(r0[k].e, 2 * e);
                    acc += lucid_elem<T>::load(r0[k].e, 2 * e + 1);
                    acc += lucid_elem<T>::load(r1[k].e, 2 * e);
                    acc += lucid_elem<T>::load(r1[k].e, 2 * e + 1);
                    if (beta != 0.0f) acc = fmaf(beta, lucid_elem<T>::load(old[k].e, e), acc);
                    lucid_elem<T>::store(o.e, e, acc);
                }
                dxh[u] = o;
            }
        }
    }
}

/* The s = 2 vector route applies: W a multiple of V/2, the small side
 * (x / dx) 8-byte and the large side (y / dy) 16-byte aligned. */
static bool up2_vec_ok(lucid_dtype dt, int64_t W, int scale, const void *small,
                       const void *large) {
    int64_t half = 8 / (int64_t)lucid_dtype_size(dt);
    return scale == 2 && W % half == 0 && pw_aligned(small, 8) && pw_aligned(large, 16);
}

extern "C" lucid_status lucid_cuda_upsample_nearest2d_forward(
    lucid_ctx *ctx, const lucid_tensor *x, lucid_tensor *y, int scale) {
    LUCID_TRY(nn_check_act(ctx, "upsample_nearest2d_forward", x->dtype));
    CUDA_ENTER(ctx, st);
    int64_t NC = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t Wo = W * scale;
    int64_t n = NC * H * W * scale * scale;
    if (n == 0) return LUCID_OK;
    const void *xd = lucid_tensor_data(x);
    void *yd = lucid_tensor_data(y);
    const bool small = n < ((int64_t)1 << 31);
    if (up2_vec_ok(x->dtype, W, scale, xd, yd)) {
        int64_t half = 8 / (int64_t)lucid_dtype_size(x->dtype);
        int64_t units = NC * H * W / half, Q = W / half;
        unsigned blocks = pw_grid(st, units, PW_UNROLL);
        if (small)
            NN_DISPATCH(x->dtype, (lucid_launch(up2_fwd_vec<T, uint32_t>, blocks, PW_THREADS,
                                                0, st->stream, (const T *)xd, (T *)yd,
                                                (uint32_t)units, (uint32_t)Q)));
        else
            NN_DISPATCH(x->dtype, (lucid_launch(up2_fwd_vec<T, int64_t>, blocks, PW_THREADS,
                                                0, st->stream, (const T *)xd, (T *)yd,
                                                units, Q)));
        CUDA_CHECK_LAUNCH(ctx, "up2_fwd_vec");
        return LUCID_OK;
    }
    unsigned blocks = pw_grid(st, n, 1);
    if (small)
        NN_DISPATCH(x->dtype, (lucid_launch(up_fwd<T, uint32_t>, blocks, PW_THREADS, 0,
                                            st->stream, (const T *)xd, (T *)yd,
                                            (uint32_t)n, (uint32_t)W, (uint32_t)Wo,
                                            (uint32_t)scale)));
    else
        NN_DISPATCH(x->dtype, (lucid_launch(up_fwd<T, int64_t>, blocks, PW_THREADS, 0,
                                            st->stream, (const T *)xd, (T *)yd, n, W,
                                            Wo, (int64_t)scale)));
    CUDA_CHECK_LAUNCH(ctx, "up_fwd");
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_upsample_nearest2d_backward(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, int scale, double beta) {
    LUCID_TRY(nn_check_act(ctx, "upsample_nearest2d_backward", dx->dtype));
    CUDA_ENTER(ctx, st);
    int64_t NC = dx->shape[0] * dx->shape[1], H = dx->shape[2], W = dx->shape[3];
    int64_t Wo = W * scale;
    int64_t n = NC * H * W;
    if (n == 0) return LUCID_OK;
    const void *dyd = lucid_tensor_data(dy);
    void *dxd = lucid_tensor_data(dx);
    /* 32-bit when every dy offset fits */
    const bool small = n * scale * scale < ((int64_t)1 << 31);
    const float b = (float)beta;
    if (up2_vec_ok(dx->dtype, W, scale, dxd, dyd)) {
        int64_t half = 8 / (int64_t)lucid_dtype_size(dx->dtype);
        int64_t units = n / half, Q = W / half;
        unsigned blocks = pw_grid(st, units, PW_UNROLL);
        if (small)
            NN_DISPATCH(dx->dtype, (lucid_launch(up2_bwd_vec<T, uint32_t>, blocks, PW_THREADS,
                                                 0, st->stream, (const T *)dyd, (T *)dxd,
                                                 (uint32_t)units, (uint32_t)Q, b)));
        else
            NN_DISPATCH(dx->dtype, (lucid_launch(up2_bwd_vec<T, int64_t>, blocks, PW_THREADS,
                                                 0, st->stream, (const T *)dyd, (T *)dxd,
                                                 units, Q, b)));
        CUDA_CHECK_LAUNCH(ctx, "up2_bwd_vec");
        return LUCID_OK;
    }
    unsigned blocks = pw_grid(st, n, 1);
    if (small)
        NN_DISPATCH(dx->dtype, (lucid_launch(up_bwd<T, uint32_t>, blocks, PW_THREADS, 0,
                                             st->stream, (const T *)dyd, (T *)dxd,
                                             (uint32_t)n, (uint32_t)W, (uint32_t)Wo,
                                             scale, b)));
    else
        NN_DISPATCH(dx->dtype, (lucid_launch(up_bwd<T, int64_t>, blocks, PW_THREADS, 0,
                                             st->stream, (const T *)dyd, (T *)dxd, n, W,
                                             Wo, scale, b)));
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

/* Plane route (pool_plane_ok): one block per (image, channel) plane at a
 * time, the plane staged in shared memory — forward: x as f32 (exact for
 * bf16/f16/f32), then each output's window scanned from there; backward:
 * the plane's dy (as f32) and indices, then each dx element gathers from
 * there.  Same scan order, tie rule, summation order and rounding as
 * pool_fwd / pool_bwd above, so the same bits; only the index arithmetic
 * (32-bit, no 64-bit division per element) and the loads (each input read
 * once from global memory instead of up to kh*kw times) differ.  Why:
 * SPPF's 5x5 pools at 20x20 are on the training step's critical path,
 * 10.8 us (forward) and 11.6 us (backward) a call on the generic kernels
 * (H200, Nsight Compute census, 2026-11-30). */
#define POOL_PLANE_MAX 4096 /* elements of a staged plane: 16 KiB of f32 */
#define POOL_PLANE_THREADS 256

static bool pool_plane_ok(const pool_geom &g) {
    return g.H * g.W <= POOL_PLANE_MAX && g.Ho * g.Wo <= POOL_PLANE_MAX && g.NC <= INT32_MAX &&
           g.NC * g.H * g.W <= INT32_MAX && g.NC * g.Ho * g.Wo <= INT32_MAX;
}

static unsigned pool_plane_grid(const pool_geom &g) {
    return (unsigned)(g.NC < 8192 ? g.NC : 8192);
}

template <typename T>
static __global__ void __launch_bounds__(POOL_PLANE_THREADS)
pool_fwd_plane(const T *__restrict__ x, T *y, int32_t *idx, pool_geom g) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    __shared__ float px[POOL_PLANE_MAX];
    const int H = (int)g.H, W = (int)g.W, Ho = (int)g.Ho, Wo = (int)g.Wo;
    const int HW = H * W, P = Ho * Wo, NC = (int)g.NC;
    for (int pl = blockIdx.x; pl < NC; pl += gridDim.x) {
        const T *xp = x + (size_t)pl * HW;
        __syncthreads(); /* the previous plane's reads are done */
        for (int e = threadIdx.x; e < HW; e += blockDim.x) px[e] = lucid_elem<T>::load(xp, e);
        __syncthreads();
        for (int o = threadIdx.x; o < P; o += blockDim.x) {
            const int i = o / Wo, j = o - (o / Wo) * Wo;
            int best = -1;
            float m = -INFINITY;
            for (int u = 0; u < g.kh; u++) {
                const int hi = i * g.sh - g.ph + u;
                if (hi < 0 || hi >= H) continue;
                for (int v = 0; v < g.kw; v++) {
                    const int wi = j * g.sw - g.pw + v;
                    if (wi < 0 || wi >= W) continue;
                    const float val = px[hi * W + wi];
                    if (best < 0 || val > m || (isnan(val) && !isnan(m))) {
                        m = val;
                        best = hi * W + wi;
                    }
                }
            }
            const size_t at = (size_t)pl * P + o;
            if (y) lucid_elem<T>::store(y, at, m);
            if (idx) idx[at] = best;
        }
    }
}

template <typename T>
static __global__ void __launch_bounds__(POOL_PLANE_THREADS)
pool_bwd_plane(const T *__restrict__ dy, const int32_t *__restrict__ idx, T *dx, pool_geom g,
               float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    __shared__ float pg[POOL_PLANE_MAX];
    __shared__ int32_t pi[POOL_PLANE_MAX];
    const int H = (int)g.H, W = (int)g.W, Ho = (int)g.Ho, Wo = (int)g.Wo;
    const int HW = H * W, P = Ho * Wo, NC = (int)g.NC;
    for (int pl = blockIdx.x; pl < NC; pl += gridDim.x) {
        __syncthreads();
        for (int o = threadIdx.x; o < P; o += blockDim.x) {
            pg[o] = lucid_elem<T>::load(dy, (size_t)pl * P + o);
            pi[o] = idx[(size_t)pl * P + o];
        }
        __syncthreads();
        for (int e = threadIdx.x; e < HW; e += blockDim.x) {
            const int h = e / W, w = e - (e / W) * W;
            /* i*sh - ph <= h <= i*sh - ph + kh - 1 (as pool_bwd) */
            int ilo = h + g.ph - g.kh + 1, ihi = h + g.ph;
            ilo = ilo <= 0 ? 0 : (ilo + g.sh - 1) / g.sh;
            ihi = ihi < 0 ? -1 : ihi / g.sh;
            if (ihi > Ho - 1) ihi = Ho - 1;
            int jlo = w + g.pw - g.kw + 1, jhi = w + g.pw;
            jlo = jlo <= 0 ? 0 : (jlo + g.sw - 1) / g.sw;
            jhi = jhi < 0 ? -1 : jhi / g.sw;
            if (jhi > Wo - 1) jhi = Wo - 1;
            float acc = 0.0f;
            for (int i = ilo; i <= ihi; i++)
                for (int j = jlo; j <= jhi; j++) {
                    const int o = i * Wo + j;
                    if (pi[o] == e) acc += pg[o];
                }
            const size_t at = (size_t)pl * HW + e;
            if (beta != 0.0f) acc = fmaf(beta, lucid_elem<T>::load(dx, at), acc);
            lucid_elem<T>::store(dx, at, acc);
        }
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
    if (pool_plane_ok(g))
        NN_DISPATCH(x->dtype, (lucid_launch(pool_fwd_plane<T>, pool_plane_grid(g),
                                            POOL_PLANE_THREADS, 0, st->stream,
                                            (const T *)lucid_tensor_data(x),
                                            (T *)lucid_tensor_data(y), idx, g)));
    else
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
        if (pool_plane_ok(g))
            NN_DISPATCH(x->dtype, (lucid_launch(pool_fwd_plane<T>, pool_plane_grid(g),
                                                POOL_PLANE_THREADS, 0, st->stream,
                                                (const T *)lucid_tensor_data(x), nullptr,
                                                (int32_t *)ws, g)));
        else
            NN_DISPATCH(x->dtype, (lucid_launch(pool_fwd<T>, pw_blocks(no), PW_THREADS, 0,
                                                st->stream, (const T *)lucid_tensor_data(x),
                                                nullptr, (int32_t *)ws, g)));
        CUDA_CHECK_LAUNCH(ctx, "pool_fwd (argmax)");
        idx = (const int32_t *)ws;
    }
    if (pool_plane_ok(g))
        NN_DISPATCH(x->dtype, (lucid_launch(pool_bwd_plane<T>, pool_plane_grid(g),
                                            POOL_PLANE_THREADS, 0, st->stream,
                                            (const T *)lucid_tensor_data(dy), idx,
                                            (T *)lucid_tensor_data(dx), g, (float)beta)));
    else
        NN_DISPATCH(x->dtype, (lucid_launch(pool_bwd<T>, pw_blocks(ni), PW_THREADS, 0,
                                            st->stream, (const T *)lucid_tensor_data(dy), idx,
                                            (T *)lucid_tensor_data(dx), g, (float)beta)));
    CUDA_CHECK_LAUNCH(ctx, "pool_bwd");
    return LUCID_OK;
}
