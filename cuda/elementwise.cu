/*
 * elementwise.cu — copy/cast, fill, binary, binary_scalar, unary and axpy on
 * the GPU. Every kernel overwrites its output (no accumulation), except axpy
 * which does y = alpha * x + y in place.
 *
 * Layout: any strides (up to LUCID_MAX_DIMS dims, stride 0 for broadcast
 * inputs) over one shared shape; neighbouring dims that are contiguous in
 * every operand are merged first, and all-contiguous operands of one dtype
 * take templated fast kernels. Element order is row-major over the shape.
 *
 * Contiguous maps (map_contig_kernel, one dtype, kind and op compile-time):
 *   - every operand 16-byte aligned: the vector path moves 16 bytes per
 *     load/store (8 x bf16/f16, 4 x f32), MAP_UNROLL vectors per thread per
 *     grid-stride step, and the last n % V elements (V elements per vector)
 *     one per thread; any n, including n < V (tail only);
 *   - otherwise (a view starting off a 16-byte boundary): one element per
 *     thread.
 *   Both index in 32 bits: the host splits n into pieces of MAP_CHUNK (2^30)
 *   elements, one launch each (a multiple of every V, so alignment holds in
 *   every piece). The grid is capped at MAP_WAVES waves of full-occupancy
 *   blocks on the device's SMs. Each element is computed exactly as in the
 *   scalar form (same f32 operations, one rounding on store), so the paths
 *   give identical bits; out may alias a or b (a thread reads all its
 *   vectors of a step before it stores any, and no element is shared
 *   between threads).
 *
 * Dtypes: outputs of arithmetic are f32, bf16 or f16; inputs may be any
 * dtype (read as f32). Arithmetic is done in f32 with explicitly rounded
 * operations (__fadd_rn, __fmul_rn, __fdiv_rn: never contracted into an FMA,
 * so results match the CPU's plain f32 arithmetic bit for bit) and rounded
 * once on store with __float2bfloat16_rn / __float2half_rn. NaN propagates
 * through max, min and relu. copy converts between all seven dtypes as the
 * CPU reference does: same dtype moves bits; within {f32, bf16, f16} through
 * f32; otherwise through f64 with bf16/f16 correctly rounded from f64 and
 * integers truncated toward zero and saturated (NaN -> 0).
 *
 * Host <-> device copies run on the context's compute stream:
 *   - both sides contiguous with one dtype: one cudaMemcpyAsync;
 *   - host -> device otherwise: the host side is packed into a pinned staging
 *     block (released with an event, no host wait), copied, then converted /
 *     scattered by a kernel;
 *   - device -> host otherwise: a kernel gathers and converts into a
 *     contiguous device block; a contiguous host destination then gets one
 *     cudaMemcpyAsync, a strided one goes through pinned staging and the host
 *     unpacks it after a stream synchronize (the only op that waits).
 * As with cudaMemcpyAsync itself, a copy into pageable host memory is
 * complete on return; a copy into pinned host memory is complete after
 * lucid_ctx_synchronize().
 */
#include "common.cuh"

#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- iterator */

void lucid_iter_init(lucid_iter *it, int n, const lucid_tensor *const *ts) {
    const lucid_tensor *t0 = ts[0];
    int64_t shape[LUCID_MAX_DIMS];
    int64_t strides[LUCID_CUDA_MAX_OPERANDS][LUCID_MAX_DIMS];
    int nd = 0;
    it->numel = 1;
    for (int d = 0; d < t0->ndim; d++) it->numel *= t0->shape[d];
    for (int d = 0; d < t0->ndim; d++) {
        if (t0->shape[d] == 1) continue;
        shape[nd] = t0->shape[d];
        for (int k = 0; k < n; k++) strides[k][nd] = ts[k]->strides[d];
        nd++;
    }
    /* merge from the innermost dim outwards */
    int64_t rshape[LUCID_MAX_DIMS];
    int64_t rstr[LUCID_CUDA_MAX_OPERANDS][LUCID_MAX_DIMS];
    int rn = 0;
    for (int d = nd - 1; d >= 0; d--) {
        if (rn > 0) {
            int ok = 1;
            for (int k = 0; k < n; k++)
                if (strides[k][d] != rstr[k][rn - 1] * rshape[rn - 1]) ok = 0;
            if (ok) {
                rshape[rn - 1] *= shape[d];
                continue;
            }
        }
        rshape[rn] = shape[d];
        for (int k = 0; k < n; k++) rstr[k][rn] = strides[k][d];
        rn++;
    }
    it->ndim = rn;
    memset(it->shape, 0, sizeof it->shape);
    memset(it->strides, 0, sizeof it->strides);
    for (int d = 0; d < rn; d++) {
        it->shape[d] = rshape[rn - 1 - d];
        for (int k = 0; k < n; k++) it->strides[k][d] = rstr[k][rn - 1 - d];
    }
}

/* ---------------------------------------------------------------- op math */

enum map_kind { KIND_BINARY = 0, KIND_SCALAR, KIND_UNARY, KIND_AXPY };

__device__ __forceinline__ float nan_max(float a, float b) {
    return (a != a || a > b) ? a : b;
}
__device__ __forceinline__ float nan_min(float a, float b) {
    return (a != a || a < b) ? a : b;
}

__device__ __forceinline__ float apply_binary(int op, float a, float b) {
    switch (op) {
    case LUCID_OP_ADD: return __fadd_rn(a, b);
    case LUCID_OP_SUB: return __fsub_rn(a, b);
    case LUCID_OP_MUL: return __fmul_rn(a, b);
    case LUCID_OP_DIV: return __fdiv_rn(a, b);
    case LUCID_OP_MAX: return nan_max(a, b);
    case LUCID_OP_MIN: return nan_min(a, b);
    case LUCID_OP_POW: return powf(a, b);
    default: return __int_as_float(0x7fc00000);
    }
}

__device__ __forceinline__ float sigmoid_f(float x) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
}

__device__ __forceinline__ float apply_unary(int op, float x) {
    switch (op) {
    case LUCID_OP_NEG: return -x;
    case LUCID_OP_ABS: return fabsf(x);
    case LUCID_OP_EXP: return expf(x);
    case LUCID_OP_LOG: return logf(x);
    case LUCID_OP_SQRT: return __fsqrt_rn(x);
    case LUCID_OP_SIGMOID: return sigmoid_f(x);
    case LUCID_OP_SILU: return __fmul_rn(x, sigmoid_f(x));
    case LUCID_OP_TANH: return tanhf(x);
    case LUCID_OP_RELU: return (x > 0.0f || x != x) ? x : 0.0f;
    case LUCID_OP_SQUARE: return __fmul_rn(x, x);
    default: return __int_as_float(0x7fc00000);
    }
}

/* kind: binary a (op) b; scalar a (op) s, or s (op) a when rev; unary op(a);
 * axpy s * a + b. */
__device__ __forceinline__ float apply_map(int kind, int op, int rev, float a,
                                           float b, float s) {
    switch (kind) {
    case KIND_BINARY: return apply_binary(op, a, b);
    case KIND_SCALAR: return rev ? apply_binary(op, s, a) : apply_binary(op, a, s);
    case KIND_UNARY: return apply_unary(op, a);
    default: return __fadd_rn(__fmul_rn(s, a), b);
    }
}

struct map_args {
    void *out;
    const void *a;
    const void *b;
    int dt_out, dt_a, dt_b;
    int kind, op, rev;
    float s;
};

#define MAP_THREADS 256
#define MAP_UNROLL 4                   /* vectors per thread per step */
#define MAP_WAVES 2                    /* grid cap, in full-occupancy waves */
#define MAP_CHUNK ((int64_t)1 << 30)   /* elements per launch (32-bit index) */

/* Sixteen bytes of T: the unit of the vector paths (one 128-bit access). */
template <typename T> struct alignas(16) ew_vec {
    T e[16 / sizeof(T)];
};

static inline int ew_aligned16(const void *p) {
    return ((uintptr_t)p & 15u) == 0;
}

/* Blocks of MAP_THREADS threads for `items` work items of `per_thread` each,
 * at least 1, at most MAP_WAVES waves of full-occupancy blocks (2048
 * resident threads per SM); the kernels are grid-stride loops. */
static unsigned map_grid(const lucid_cuda_state *st, int64_t items,
                         int per_thread) {
    int64_t per_block = (int64_t)MAP_THREADS * per_thread;
    int64_t b = (items + per_block - 1) / per_block;
    int64_t sms = st->sm_count > 0 ? st->sm_count : 132;
    int64_t cap = sms * (2048 / MAP_THREADS) * MAP_WAVES;
    if (b > cap) b = cap;
    if (b < 1) b = 1;
    return (unsigned)b;
}

/* All operands contiguous and of storage type T; kind/op are compile-time;
 * n <= MAP_CHUNK. vec = 1 (host-checked: out, a, b 16-byte aligned): the
 * first n - n % V elements as V-element vectors, then the tail one element
 * per thread; vec = 0: every element one per thread. */
template <int KIND, int OP, typename T>
__global__ void map_contig_kernel(T *out, const T *a, const T *b, float s,
                                  int rev, uint32_t n, int vec) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    constexpr bool HAS_B = KIND == KIND_BINARY || KIND == KIND_AXPY;
    constexpr uint32_t V = 16 / sizeof(T);
    const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
    const uint32_t nt = gridDim.x * blockDim.x;
    uint32_t head = 0;
    if (vec) {
        const uint32_t nv = n / V;
        const ew_vec<T> *av = (const ew_vec<T> *)a;
        const ew_vec<T> *bv = (const ew_vec<T> *)b;
        ew_vec<T> *ov = (ew_vec<T> *)out;
        for (uint32_t v0 = tid; v0 < nv; v0 += nt * MAP_UNROLL) {
            ew_vec<T> x[MAP_UNROLL], y[MAP_UNROLL];
#pragma unroll
            for (int u = 0; u < MAP_UNROLL; u++) {
                uint32_t v = v0 + (uint32_t)u * nt;
                if (v < nv) {
                    x[u] = av[v];
                    if (HAS_B) y[u] = bv[v];
                }
            }
#pragma unroll
            for (int u = 0; u < MAP_UNROLL; u++) {
                uint32_t v = v0 + (uint32_t)u * nt;
                if (v < nv) {
                    ew_vec<T> o;
#pragma unroll
                    for (int k = 0; k < (int)V; k++) {
                        float xa = lucid_elem<T>::load(x[u].e, k);
                        float yb = HAS_B ? lucid_elem<T>::load(y[u].e, k) : 0.0f;
                        lucid_elem<T>::store(o.e, k,
                                             apply_map(KIND, OP, rev, xa, yb, s));
                    }
                    ov[v] = o;
                }
            }
        }
        head = nv * V;
    }
    for (uint32_t i = head + tid; i < n; i += nt) {
        float x = lucid_elem<T>::load(a, i);
        float y = HAS_B ? lucid_elem<T>::load(b, i) : 0.0f;
        lucid_elem<T>::store(out, i, apply_map(KIND, OP, rev, x, y, s));
    }
}

/* Any strides and dtypes. */
template <typename IndexT>
__global__ void map_generic_kernel(lucid_iter it, map_args p) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    IndexT n = (IndexT)it.numel;
    IndexT stride = (IndexT)gridDim.x * blockDim.x;
    const bool has_b = p.kind == KIND_BINARY || p.kind == KIND_AXPY;
    for (IndexT i = (IndexT)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        int64_t off[3];
        lucid_iter_offsets<3, IndexT>(it, i, off);
        float x = lucid_load_f32(p.a, p.dt_a, off[1]);
        float y = has_b ? lucid_load_f32(p.b, p.dt_b, off[2]) : 0.0f;
        lucid_store_f32(p.out, p.dt_out, off[0],
                        apply_map(p.kind, p.op, p.rev, x, y, p.s));
    }
}

template <int KIND, typename T, int OP, int NOPS>
static void launch_contig_op(int op, cudaStream_t stream, unsigned blocks,
                             T *out, const T *a, const T *b, float s, int rev,
                             uint32_t n, int vec) {
    if (op == OP) {
        lucid_launch(map_contig_kernel<KIND, OP, T>, blocks, MAP_THREADS, 0, stream, out, a, b,
                     s, rev, n, vec);
        return;
    }
    if constexpr (OP + 1 < NOPS)
        launch_contig_op<KIND, T, OP + 1, NOPS>(op, stream, blocks, out, a, b,
                                                s, rev, n, vec);
}

/* One launch per MAP_CHUNK elements; the vector path when every operand is
 * 16-byte aligned (b is a for unary and scalar maps). */
template <int KIND, typename T>
static void launch_contig(int op, const lucid_cuda_state *st,
                          const map_args &p, int64_t n) {
    T *out = (T *)p.out;
    const T *a = (const T *)p.a, *b = (const T *)p.b;
    const int vec = ew_aligned16(out) && ew_aligned16(a) && ew_aligned16(b);
    constexpr int64_t V = 16 / sizeof(T);
    for (int64_t off = 0; off < n; off += MAP_CHUNK) {
        int64_t m = n - off < MAP_CHUNK ? n - off : MAP_CHUNK;
        unsigned blocks = vec ? map_grid(st, m / V, MAP_UNROLL)
                              : map_grid(st, m, 1);
        if constexpr (KIND == KIND_UNARY)
            launch_contig_op<KIND, T, 0, LUCID_UNARY_OP_COUNT>(
                op, st->stream, blocks, out + off, a + off, b + off, p.s,
                p.rev, (uint32_t)m, vec);
        else if constexpr (KIND == KIND_AXPY)
            launch_contig_op<KIND, T, 0, 1>(0, st->stream, blocks, out + off,
                                            a + off, b + off, p.s, p.rev,
                                            (uint32_t)m, vec);
        else
            launch_contig_op<KIND, T, 0, LUCID_BINARY_OP_COUNT>(
                op, st->stream, blocks, out + off, a + off, b + off, p.s,
                p.rev, (uint32_t)m, vec);
    }
}

template <int KIND>
static void launch_contig_dtype(const map_args &p, const lucid_cuda_state *st,
                                int64_t n) {
    switch (p.dt_out) {
    case LUCID_F32: launch_contig<KIND, float>(p.op, st, p, n); break;
    case LUCID_BF16: launch_contig<KIND, __nv_bfloat16>(p.op, st, p, n); break;
    default: launch_contig<KIND, __half>(p.op, st, p, n); break;
    }
}

/* Run one elementwise map. out is the first operand, then a, then b (b only
 * for binary and axpy). */
static lucid_status run_map(lucid_ctx *ctx, map_args p, lucid_tensor *out,
                            const lucid_tensor *a, const lucid_tensor *b) {
    CUDA_ENTER(ctx, st);
    if (!lucid_cuda_is_op_dtype(out->dtype))
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "cuda elementwise op: output dtype %s (expected "
                            "f32, bf16 or f16)",
                            lucid_dtype_name(out->dtype));
    const lucid_tensor *ts[3] = {out, a, b ? b : a};
    int nops = b ? 3 : 2;
    lucid_iter it;
    lucid_iter_init(&it, nops, ts);
    if (!b) {
        for (int d = 0; d < it.ndim; d++) it.strides[2][d] = it.strides[1][d];
    }
    if (it.numel == 0) return LUCID_OK;
    p.out = lucid_tensor_data(out);
    p.a = lucid_tensor_data(a);
    p.b = b ? lucid_tensor_data(b) : p.a;
    p.dt_out = out->dtype;
    p.dt_a = a->dtype;
    p.dt_b = b ? b->dtype : a->dtype;
    int same = p.dt_a == p.dt_out && p.dt_b == p.dt_out;
    if (same && lucid_iter_contiguous(&it, nops)) {
        switch (p.kind) {
        case KIND_BINARY: launch_contig_dtype<KIND_BINARY>(p, st, it.numel); break;
        case KIND_SCALAR: launch_contig_dtype<KIND_SCALAR>(p, st, it.numel); break;
        case KIND_UNARY: launch_contig_dtype<KIND_UNARY>(p, st, it.numel); break;
        default: launch_contig_dtype<KIND_AXPY>(p, st, it.numel); break;
        }
        CUDA_CHECK_LAUNCH(ctx, "map_contig_kernel");
        return LUCID_OK;
    }
    unsigned blocks = lucid_cuda_blocks(it.numel, MAP_THREADS);
    if (it.numel <= (int64_t)UINT32_MAX)
        lucid_launch(map_generic_kernel<uint32_t>, blocks, MAP_THREADS, 0, st->stream, it, p);
    else
        lucid_launch(map_generic_kernel<uint64_t>, blocks, MAP_THREADS, 0, st->stream, it, p);
    CUDA_CHECK_LAUNCH(ctx, "map_generic_kernel");
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_binary(lucid_ctx *ctx, lucid_binary_op op,
                                          lucid_tensor *out,
                                          const lucid_tensor *a,
                                          const lucid_tensor *b) {
    map_args p;
    memset(&p, 0, sizeof p);
    p.kind = KIND_BINARY;
    p.op = op;
    return run_map(ctx, p, out, a, b);
}

extern "C" lucid_status lucid_cuda_binary_scalar(lucid_ctx *ctx,
                                                 lucid_binary_op op,
                                                 lucid_tensor *out,
                                                 const lucid_tensor *a,
                                                 double scalar, int reverse) {
    map_args p;
    memset(&p, 0, sizeof p);
    p.kind = KIND_SCALAR;
    p.op = op;
    p.rev = reverse ? 1 : 0;
    p.s = (float)scalar;
    return run_map(ctx, p, out, a, NULL);
}

extern "C" lucid_status lucid_cuda_unary(lucid_ctx *ctx, lucid_unary_op op,
                                         lucid_tensor *out,
                                         const lucid_tensor *a) {
    map_args p;
    memset(&p, 0, sizeof p);
    p.kind = KIND_UNARY;
    p.op = op;
    return run_map(ctx, p, out, a, NULL);
}

extern "C" lucid_status lucid_cuda_axpy(lucid_ctx *ctx, lucid_tensor *y,
                                        double alpha, const lucid_tensor *x) {
    map_args p;
    memset(&p, 0, sizeof p);
    p.kind = KIND_AXPY;
    p.s = (float)alpha;
    return run_map(ctx, p, y, x, y);
}

/* ---------------------------------------------------------------- fill */

template <typename W>
__global__ void fill_contig_kernel(W *dst, W v, int64_t n) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride)
        dst[i] = v;
}

template <typename W, typename IndexT>
__global__ void fill_strided_kernel(W *dst, W v, lucid_iter it) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    IndexT n = (IndexT)it.numel;
    IndexT stride = (IndexT)gridDim.x * blockDim.x;
    for (IndexT i = (IndexT)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        int64_t off[1];
        lucid_iter_offsets<1, IndexT>(it, i, off);
        dst[off[0]] = v;
    }
}

template <typename W>
static void launch_fill(cudaStream_t stream, void *dst, uint64_t bits,
                        const lucid_iter &it) {
    W v;
    memcpy(&v, &bits, sizeof v);
    unsigned blocks = lucid_cuda_blocks(it.numel, MAP_THREADS);
    if (lucid_iter_contiguous(&it, 1))
        lucid_launch(fill_contig_kernel<W>, blocks, MAP_THREADS, 0, stream, (W *)dst, v,
                     it.numel);
    else if (it.numel <= (int64_t)UINT32_MAX)
        lucid_launch(fill_strided_kernel<W, uint32_t>, blocks, MAP_THREADS, 0, stream, (W *)dst,
                     v, it);
    else
        lucid_launch(fill_strided_kernel<W, uint64_t>, blocks, MAP_THREADS, 0, stream, (W *)dst,
                     v, it);
}

/* f64 -> f32 rounding to odd on the host (see lucid_f64_to_f32_odd). */
static float host_f64_to_f32_odd(double x) {
    float f = (float)x;
    if (x != x || (double)f == x) return f;
    uint32_t u;
    memcpy(&u, &f, 4);
    if (fabs((double)f) > fabs(x)) u -= 1; /* truncate toward zero */
    u |= 1u;
    memcpy(&f, &u, 4);
    return f;
}

/* The bit pattern of `value` in dtype dt, converted as the CPU reference's
 * fill does (bf16/f16 correctly rounded from f64, integers saturated). */
static uint64_t value_bits(lucid_dtype dt, double v) {
    uint64_t bits = 0;
    switch (dt) {
    case LUCID_F32: { float f = (float)v; memcpy(&bits, &f, 4); break; }
    case LUCID_F64: memcpy(&bits, &v, 8); break;
    case LUCID_BF16: bits = lucid_f32_to_bf16(host_f64_to_f32_odd(v)); break;
    case LUCID_F16: bits = lucid_f32_to_f16(host_f64_to_f32_odd(v)); break;
    case LUCID_U8:
        bits = (v != v || v <= 0.0) ? 0 : v >= 255.0 ? 255 : (uint8_t)v;
        break;
    case LUCID_I32: {
        int32_t x = v != v ? 0
                    : v >= 2147483647.0 ? INT32_MAX
                    : v <= -2147483648.0 ? INT32_MIN
                                         : (int32_t)v;
        memcpy(&bits, &x, 4);
        break;
    }
    case LUCID_I64: {
        int64_t x = v != v ? 0
                    : v >= 9223372036854775807.0 ? INT64_MAX
                    : v <= -9223372036854775808.0 ? INT64_MIN
                                                  : (int64_t)v;
        memcpy(&bits, &x, 8);
        break;
    }
    default: break;
    }
    return bits;
}

extern "C" lucid_status lucid_cuda_fill(lucid_ctx *ctx, lucid_tensor *dst,
                                        double value) {
    CUDA_ENTER(ctx, st);
    const lucid_tensor *ts[1] = {dst};
    lucid_iter it;
    lucid_iter_init(&it, 1, ts);
    if (it.numel == 0) return LUCID_OK;
    uint64_t bits = value_bits(dst->dtype, value);
    void *p = lucid_tensor_data(dst);
    switch (lucid_dtype_size(dst->dtype)) {
    case 1:
        if (lucid_iter_contiguous(&it, 1)) {
            CUDA_CHECK(ctx, cudaMemsetAsync(p, (int)(bits & 0xff),
                                            (size_t)it.numel, st->stream));
            return LUCID_OK;
        }
        launch_fill<uint8_t>(st->stream, p, bits, it);
        break;
    case 2: launch_fill<uint16_t>(st->stream, p, bits, it); break;
    case 4: launch_fill<uint32_t>(st->stream, p, bits, it); break;
    default: launch_fill<uint64_t>(st->stream, p, bits, it); break;
    }
    CUDA_CHECK_LAUNCH(ctx, "fill kernel");
    return LUCID_OK;
}

/* ---------------------------------------------------------------- copy / cast */

/* Same dtype, any strides: move raw elements of W bytes. */
template <typename W, typename IndexT>
__global__ void copy_raw_kernel(W *dst, const W *src, lucid_iter it) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    IndexT n = (IndexT)it.numel;
    IndexT stride = (IndexT)gridDim.x * blockDim.x;
    for (IndexT i = (IndexT)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        int64_t off[2];
        lucid_iter_offsets<2, IndexT>(it, i, off);
        dst[off[0]] = src[off[1]];
    }
}

/* Contiguous float -> float conversion (the mixed-precision hot path). */
template <typename D, typename S>
__global__ void cast_contig_kernel(D *dst, const S *src, int64_t n) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride)
        lucid_elem<D>::store(dst, i, lucid_elem<S>::load(src, i));
}

/* Any dtypes, any strides. */
template <typename IndexT>
__global__ void cast_generic_kernel(void *dst, int ddt, const void *src,
                                    int sdt, lucid_iter it) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    IndexT n = (IndexT)it.numel;
    IndexT stride = (IndexT)gridDim.x * blockDim.x;
    const bool floats = (ddt == LUCID_F32 || ddt == LUCID_BF16 ||
                         ddt == LUCID_F16) &&
                        (sdt == LUCID_F32 || sdt == LUCID_BF16 ||
                         sdt == LUCID_F16);
    for (IndexT i = (IndexT)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        int64_t off[2];
        lucid_iter_offsets<2, IndexT>(it, i, off);
        if (floats)
            lucid_store_f32(dst, ddt, off[0], lucid_load_f32(src, sdt, off[1]));
        else
            lucid_store_f64(dst, ddt, off[0], lucid_load_f64(src, sdt, off[1]));
    }
}

template <typename W>
static void launch_copy_raw(cudaStream_t stream, void *dst, const void *src,
                            const lucid_iter &it) {
    unsigned blocks = lucid_cuda_blocks(it.numel, MAP_THREADS);
    if (it.numel <= (int64_t)UINT32_MAX)
        lucid_launch(copy_raw_kernel<W, uint32_t>, blocks, MAP_THREADS, 0, stream, (W *)dst,
                     (const W *)src, it);
    else
        lucid_launch(copy_raw_kernel<W, uint64_t>, blocks, MAP_THREADS, 0, stream, (W *)dst,
                     (const W *)src, it);
}

template <typename D>
static bool launch_cast_contig_from(cudaStream_t stream, D *dst,
                                    const void *src, int sdt, int64_t n) {
    unsigned blocks = lucid_cuda_blocks(n, MAP_THREADS);
    switch (sdt) {
    case LUCID_F32:
        lucid_launch(cast_contig_kernel<D, float>, blocks, MAP_THREADS, 0, stream, dst,
                     (const float *)src, n);
        return true;
    case LUCID_BF16:
        lucid_launch(cast_contig_kernel<D, __nv_bfloat16>, blocks, MAP_THREADS, 0, stream, dst,
                     (const __nv_bfloat16 *)src, n);
        return true;
    case LUCID_F16:
        lucid_launch(cast_contig_kernel<D, __half>, blocks, MAP_THREADS, 0, stream, dst,
                     (const __half *)src, n);
        return true;
    default: return false;
    }
}

/* Device-to-device element copy with conversion: dst and src are raw device
 * views (data pointer of element 0, dtype, strides of `it`). */
static lucid_status device_copy(lucid_ctx *ctx, lucid_cuda_state *st,
                                void *dst, lucid_dtype ddt, const void *src,
                                lucid_dtype sdt, const lucid_iter &it) {
    if (it.numel == 0) return LUCID_OK;
    const bool contig = lucid_iter_contiguous(&it, 2);
    if (ddt == sdt) {
        size_t es = lucid_dtype_size(ddt);
        if (contig) {
            CUDA_CHECK(ctx, cudaMemcpyAsync(dst, src, (size_t)it.numel * es,
                                            cudaMemcpyDeviceToDevice,
                                            st->stream));
            return LUCID_OK;
        }
        switch (es) {
        case 1: launch_copy_raw<uint8_t>(st->stream, dst, src, it); break;
        case 2: launch_copy_raw<uint16_t>(st->stream, dst, src, it); break;
        case 4: launch_copy_raw<uint32_t>(st->stream, dst, src, it); break;
        default: launch_copy_raw<uint64_t>(st->stream, dst, src, it); break;
        }
        CUDA_CHECK_LAUNCH(ctx, "copy_raw_kernel");
        return LUCID_OK;
    }
    bool done = false;
    if (contig) {
        switch (ddt) {
        case LUCID_F32:
            done = launch_cast_contig_from<float>(st->stream, (float *)dst, src,
                                                  sdt, it.numel);
            break;
        case LUCID_BF16:
            done = launch_cast_contig_from<__nv_bfloat16>(
                st->stream, (__nv_bfloat16 *)dst, src, sdt, it.numel);
            break;
        case LUCID_F16:
            done = launch_cast_contig_from<__half>(st->stream, (__half *)dst,
                                                   src, sdt, it.numel);
            break;
        default: break;
        }
    }
    if (!done) {
        unsigned blocks = lucid_cuda_blocks(it.numel, MAP_THREADS);
        if (it.numel <= (int64_t)UINT32_MAX)
            lucid_launch(cast_generic_kernel<uint32_t>, blocks, MAP_THREADS, 0, st->stream, dst,
                         ddt, src, sdt, it);
        else
            lucid_launch(cast_generic_kernel<uint64_t>, blocks, MAP_THREADS, 0, st->stream, dst,
                         ddt, src, sdt, it);
    }
    CUDA_CHECK_LAUNCH(ctx, "cast kernel");
    return LUCID_OK;
}

/* Host-side gather of a strided CPU tensor into a contiguous buffer, and the
 * reverse scatter; row-major order, raw element bytes. */
static void host_pack(const lucid_tensor *t, void *out) {
    const size_t es = lucid_dtype_size(t->dtype);
    const char *base = (const char *)lucid_tensor_data(t);
    char *o = (char *)out;
    int64_t n = lucid_tensor_numel(t);
    if (n == 0) return;
    int64_t idx[LUCID_MAX_DIMS] = {0};
    int64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        memcpy(o + (size_t)i * es, base + off * (int64_t)es, es);
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) {
                off += t->strides[d];
                break;
            }
            off -= (t->shape[d] - 1) * t->strides[d];
            idx[d] = 0;
        }
    }
}

static void host_unpack(lucid_tensor *t, const void *in) {
    const size_t es = lucid_dtype_size(t->dtype);
    char *base = (char *)lucid_tensor_data(t);
    const char *s = (const char *)in;
    int64_t n = lucid_tensor_numel(t);
    if (n == 0) return;
    int64_t idx[LUCID_MAX_DIMS] = {0};
    int64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        memcpy(base + off * (int64_t)es, s + (size_t)i * es, es);
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) {
                off += t->strides[d];
                break;
            }
            off -= (t->shape[d] - 1) * t->strides[d];
            idx[d] = 0;
        }
    }
}

/* A contiguous description of n elements (one dim, stride 1) paired with a
 * strided tensor: iterator over (strided, contiguous). */
static void iter_with_contig(lucid_iter *it, const lucid_tensor *t,
                             int strided_first) {
    lucid_tensor c = *t;
    lucid_contiguous_strides(c.ndim, c.shape, c.strides);
    const lucid_tensor *ts[2];
    if (strided_first) {
        ts[0] = t;
        ts[1] = &c;
    } else {
        ts[0] = &c;
        ts[1] = t;
    }
    lucid_iter_init(it, 2, ts);
}

static lucid_status copy_h2d(lucid_ctx *ctx, lucid_cuda_state *st,
                             lucid_tensor *dst, const lucid_tensor *src) {
    const int64_t n = lucid_tensor_numel(dst);
    const size_t ses = lucid_dtype_size(src->dtype);
    const size_t sbytes = (size_t)n * ses;
    const int src_contig = lucid_tensor_is_contiguous(src);
    const int dst_contig = lucid_tensor_is_contiguous(dst);
    if (src_contig && dst_contig && src->dtype == dst->dtype) {
        CUDA_CHECK(ctx, cudaMemcpyAsync(lucid_tensor_data(dst),
                                        lucid_tensor_data(src), sbytes,
                                        cudaMemcpyHostToDevice, st->stream));
        return LUCID_OK;
    }
    /* host side as one contiguous block in the source dtype */
    const void *host = lucid_tensor_data(src);
    void *pinned = NULL;
    if (!src_contig) {
        LUCID_TRY(lucid_cuda_host_malloc(ctx, st->alloc, sbytes, &pinned));
        host_pack(src, pinned);
        host = pinned;
    }
    lucid_status s = LUCID_OK;
    if (dst_contig && src->dtype == dst->dtype) {
        cudaError_t e = cudaMemcpyAsync(lucid_tensor_data(dst), host, sbytes,
                                        cudaMemcpyHostToDevice, st->stream);
        if (e != cudaSuccess)
            s = lucid_cuda_err(ctx, e, "cudaMemcpyAsync (host to device)",
                               __FILE__, __LINE__);
    } else {
        void *tmp = NULL;
        s = lucid_cuda_scratch(ctx, st, sbytes, &tmp);
        if (s == LUCID_OK) {
            cudaError_t e = cudaMemcpyAsync(tmp, host, sbytes,
                                            cudaMemcpyHostToDevice, st->stream);
            if (e != cudaSuccess) {
                s = lucid_cuda_err(ctx, e, "cudaMemcpyAsync (host to device)",
                                   __FILE__, __LINE__);
            } else {
                lucid_iter it;
                iter_with_contig(&it, dst, 1);
                s = device_copy(ctx, st, lucid_tensor_data(dst), dst->dtype,
                                tmp, src->dtype, it);
            }
            lucid_cuda_scratch_free(st, tmp);
        }
    }
    if (pinned) lucid_cuda_host_free(st->alloc, pinned, st->stream);
    return s;
}

static lucid_status copy_d2h(lucid_ctx *ctx, lucid_cuda_state *st,
                             lucid_tensor *dst, const lucid_tensor *src) {
    const int64_t n = lucid_tensor_numel(dst);
    const size_t des = lucid_dtype_size(dst->dtype);
    const size_t dbytes = (size_t)n * des;
    const int src_contig = lucid_tensor_is_contiguous(src);
    const int dst_contig = lucid_tensor_is_contiguous(dst);
    /* device side as one contiguous block in the destination dtype */
    const void *dev = lucid_tensor_data(src);
    void *tmp = NULL;
    if (!(src_contig && src->dtype == dst->dtype)) {
        LUCID_TRY(lucid_cuda_scratch(ctx, st, dbytes, &tmp));
        lucid_iter it;
        iter_with_contig(&it, src, 0);
        lucid_status s = device_copy(ctx, st, tmp, dst->dtype,
                                     lucid_tensor_data(src), src->dtype, it);
        if (s != LUCID_OK) {
            lucid_cuda_scratch_free(st, tmp);
            return s;
        }
        dev = tmp;
    }
    lucid_status s = LUCID_OK;
    if (dst_contig) {
        cudaError_t e = cudaMemcpyAsync(lucid_tensor_data(dst), dev, dbytes,
                                        cudaMemcpyDeviceToHost, st->stream);
        if (e != cudaSuccess)
            s = lucid_cuda_err(ctx, e, "cudaMemcpyAsync (device to host)",
                               __FILE__, __LINE__);
    } else {
        void *pinned = NULL;
        s = lucid_cuda_host_malloc(ctx, st->alloc, dbytes, &pinned);
        if (s == LUCID_OK) {
            cudaError_t e = cudaMemcpyAsync(pinned, dev, dbytes,
                                            cudaMemcpyDeviceToHost, st->stream);
            if (e == cudaSuccess) e = cudaStreamSynchronize(st->stream);
            if (e != cudaSuccess)
                s = lucid_cuda_err(ctx, e,
                                   "cudaMemcpyAsync (device to host, staged)",
                                   __FILE__, __LINE__);
            else
                host_unpack(dst, pinned);
            lucid_cuda_host_free(st->alloc, pinned, st->stream);
        }
    }
    lucid_cuda_scratch_free(st, tmp);
    return s;
}

extern "C" lucid_status lucid_cuda_copy(lucid_ctx *ctx, lucid_tensor *dst,
                                        const lucid_tensor *src) {
    CUDA_ENTER(ctx, st);
    if (lucid_tensor_numel(dst) == 0) return LUCID_OK;
    const int dcuda = lucid_tensor_device(dst).type == LUCID_CUDA;
    const int scuda = lucid_tensor_device(src).type == LUCID_CUDA;
    if (dcuda && scuda) {
        const lucid_tensor *ts[2] = {dst, src};
        lucid_iter it;
        lucid_iter_init(&it, 2, ts);
        return device_copy(ctx, st, lucid_tensor_data(dst), dst->dtype,
                           lucid_tensor_data(src), src->dtype, it);
    }
    if (dcuda) return copy_h2d(ctx, st, dst, src);
    if (scuda) return copy_d2h(ctx, st, dst, src);
    return lucid_seterr(ctx, LUCID_ERR_ARG,
                        "cuda copy called with two CPU tensors");
}
