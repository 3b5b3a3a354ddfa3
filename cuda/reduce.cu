/*
 * reduce.cu — reduce_all and reduce_dim: sum, mean, max, min, norm2, sumsq.
 * The output is overwritten (never accumulated into).
 *
 * Accumulation is f32 in a fixed order, so a result is bitwise identical run
 * to run on the same GPU, whatever the scheduling (no float atomics):
 *   - every thread folds a fixed strided subsequence of the input, then the
 *     block combines its threads in a fixed binary tree in shared memory (or
 *     a fixed xor-shuffle tree inside a warp);
 *   - reduce_all writes one partial per block and a second one-block launch
 *     folds the partials in the same fixed way. The grid size depends only on
 *     the element count, never on the device.
 * Kernel choice for reduce_dim depends only on the shapes: a warp per output
 * when the reduced dim is contiguous, a block per output when there are few
 * outputs and a long reduced dim, else one thread per output folding the dim
 * in order (coalesced across neighbouring outputs).
 *
 * Inputs: any dtype on the device (read as f32); outputs f32, bf16 or f16,
 * rounded once. NaN propagates through every op (max/min included). mean
 * divides the f32 sum by the count in f64; norm2 is sqrt of the f32 sumsq.
 * Empty inputs give 0 for sum, sumsq and norm2 (the dispatch layer rejects
 * empty max, min and mean).
 */
#include "common.cuh"

#include <string.h>

#define RED_THREADS 256
#define RED_MAX_BLOCKS 1024
#define RED_ITEMS_PER_THREAD 8

__device__ __forceinline__ float red_identity(int op) {
    switch (op) {
    case LUCID_REDUCE_MAX: return -INFINITY;
    case LUCID_REDUCE_MIN: return INFINITY;
    default: return 0.0f;
    }
}

/* element -> accumulated value */
__device__ __forceinline__ float red_map(int op, float x) {
    return (op == LUCID_REDUCE_NORM2 || op == LUCID_REDUCE_SUMSQ)
               ? __fmul_rn(x, x)
               : x;
}

__device__ __forceinline__ float red_combine(int op, float a, float b) {
    switch (op) {
    case LUCID_REDUCE_MAX: return (a != a || a > b) ? a : b;
    case LUCID_REDUCE_MIN: return (a != a || a < b) ? a : b;
    default: return __fadd_rn(a, b);
    }
}

__device__ __forceinline__ float red_finish(int op, float acc, int64_t n) {
    switch (op) {
    case LUCID_REDUCE_MEAN: return (float)((double)acc / (double)n);
    case LUCID_REDUCE_NORM2: return __fsqrt_rn(acc);
    default: return acc;
    }
}

/* Fixed-order tree over the block's shared buffer; result in s[0]. */
__device__ __forceinline__ float block_tree(int op, float v, float *s) {
    s[threadIdx.x] = v;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w)
            s[threadIdx.x] = red_combine(op, s[threadIdx.x], s[threadIdx.x + w]);
        __syncthreads();
    }
    return s[0];
}

/* ---------------------------------------------------------------- reduce_all */

/* Stage 1: one partial per block. */
template <bool CONTIG, typename IndexT>
__global__ void reduce_all_partial_kernel(const void *a, int dt, lucid_iter it,
                                          int op, float *partials) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    __shared__ float s[RED_THREADS];
    IndexT n = (IndexT)it.numel;
    IndexT stride = (IndexT)gridDim.x * blockDim.x;
    float acc = red_identity(op);
    for (IndexT i = (IndexT)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        int64_t off;
        if (CONTIG) {
            off = (int64_t)i;
        } else {
            int64_t o[1];
            lucid_iter_offsets<1, IndexT>(it, i, o);
            off = o[0];
        }
        acc = red_combine(op, acc, red_map(op, lucid_load_f32(a, dt, off)));
    }
    float r = block_tree(op, acc, s);
    if (threadIdx.x == 0) partials[blockIdx.x] = r;
}

/* Stage 2: fold the partials and write the result. */
__global__ void reduce_all_final_kernel(const float *partials, int nparts,
                                        int op, int64_t n, void *out,
                                        int dt_out) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    __shared__ float s[RED_THREADS];
    float acc = red_identity(op);
    for (int j = threadIdx.x; j < nparts; j += blockDim.x)
        acc = red_combine(op, acc, partials[j]);
    float r = block_tree(op, acc, s);
    if (threadIdx.x == 0) lucid_store_f32(out, dt_out, 0, red_finish(op, r, n));
}

extern "C" lucid_status lucid_cuda_reduce_all(lucid_ctx *ctx,
                                              lucid_reduce_op op,
                                              lucid_tensor *out,
                                              const lucid_tensor *a) {
    CUDA_ENTER(ctx, st);
    if (!lucid_cuda_is_op_dtype(out->dtype))
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "cuda reduce: output dtype %s (expected f32, bf16 "
                            "or f16)",
                            lucid_dtype_name(out->dtype));
    const lucid_tensor *ts[1] = {a};
    lucid_iter it;
    lucid_iter_init(&it, 1, ts);
    const int64_t n = it.numel;
    int64_t per_block = (int64_t)RED_THREADS * RED_ITEMS_PER_THREAD;
    int64_t g = (n + per_block - 1) / per_block;
    if (g < 1) g = 1;
    if (g > RED_MAX_BLOCKS) g = RED_MAX_BLOCKS;
    float *partials = NULL;
    LUCID_TRY(lucid_cuda_scratch(ctx, st, (size_t)g * sizeof(float),
                                 (void **)&partials));
    const void *ap = lucid_tensor_data(a);
    const bool contig = lucid_iter_contiguous(&it, 1);
    if (contig && n <= (int64_t)UINT32_MAX)
        lucid_launch(reduce_all_partial_kernel<true, uint32_t>, (unsigned)g, RED_THREADS, 0,
                     st->stream, ap, a->dtype, it, op, partials);
    else if (contig)
        lucid_launch(reduce_all_partial_kernel<true, uint64_t>, (unsigned)g, RED_THREADS, 0,
                     st->stream, ap, a->dtype, it, op, partials);
    else if (n <= (int64_t)UINT32_MAX)
        lucid_launch(reduce_all_partial_kernel<false, uint32_t>, (unsigned)g, RED_THREADS, 0,
                     st->stream, ap, a->dtype, it, op, partials);
    else
        lucid_launch(reduce_all_partial_kernel<false, uint64_t>, (unsigned)g, RED_THREADS, 0,
                     st->stream, ap, a->dtype, it, op, partials);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) {
        lucid_launch(reduce_all_final_kernel, 1, RED_THREADS, 0, st->stream, partials, (int)g,
                     op, n, lucid_tensor_data(out), out->dtype);
        e = cudaGetLastError();
    }
    lucid_cuda_scratch_free(st, partials);
    if (e != cudaSuccess)
        return lucid_cuda_err(ctx, e, "launch of reduce_all kernels", __FILE__,
                              __LINE__);
    return LUCID_OK;
}

/* ---------------------------------------------------------------- reduce_dim */

/* it iterates the outputs: operand 0 = out, operand 1 = a at r = 0. */

template <typename IndexT>
__global__ void reduce_dim_thread_kernel(void *out, int dt_out, const void *a,
                                         int dt_a, lucid_iter it, int64_t R,
                                         int64_t rs, int op) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    IndexT n = (IndexT)it.numel;
    IndexT stride = (IndexT)gridDim.x * blockDim.x;
    for (IndexT i = (IndexT)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        int64_t off[2];
        lucid_iter_offsets<2, IndexT>(it, i, off);
        float acc = red_identity(op);
        for (int64_t r = 0; r < R; r++)
            acc = red_combine(op, acc,
                              red_map(op, lucid_load_f32(a, dt_a, off[1] + r * rs)));
        lucid_store_f32(out, dt_out, off[0], red_finish(op, acc, R));
    }
}

template <typename IndexT>
__global__ void reduce_dim_warp_kernel(void *out, int dt_out, const void *a,
                                       int dt_a, lucid_iter it, int64_t R,
                                       int64_t rs, int op) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const int lane = threadIdx.x & 31;
    const int warps_per_block = blockDim.x >> 5;
    IndexT n = (IndexT)it.numel;
    IndexT stride = (IndexT)gridDim.x * warps_per_block;
    for (IndexT i = (IndexT)blockIdx.x * warps_per_block + (threadIdx.x >> 5);
         i < n; i += stride) {
        int64_t off[2];
        lucid_iter_offsets<2, IndexT>(it, i, off);
        float acc = red_identity(op);
        for (int64_t r = lane; r < R; r += 32)
            acc = red_combine(op, acc,
                              red_map(op, lucid_load_f32(a, dt_a, off[1] + r * rs)));
        for (int m = 16; m > 0; m >>= 1)
            acc = red_combine(op, acc, __shfl_xor_sync(0xffffffffu, acc, m));
        if (lane == 0) lucid_store_f32(out, dt_out, off[0], red_finish(op, acc, R));
    }
}

template <typename IndexT>
__global__ void reduce_dim_block_kernel(void *out, int dt_out, const void *a,
                                        int dt_a, lucid_iter it, int64_t R,
                                        int64_t rs, int op) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    __shared__ float s[RED_THREADS];
    IndexT n = (IndexT)it.numel;
    for (IndexT i = blockIdx.x; i < n; i += gridDim.x) {
        int64_t off[2];
        lucid_iter_offsets<2, IndexT>(it, i, off);
        float acc = red_identity(op);
        for (int64_t r = threadIdx.x; r < R; r += blockDim.x)
            acc = red_combine(op, acc,
                              red_map(op, lucid_load_f32(a, dt_a, off[1] + r * rs)));
        float v = block_tree(op, acc, s);
        if (threadIdx.x == 0)
            lucid_store_f32(out, dt_out, off[0], red_finish(op, v, R));
        __syncthreads(); /* s[] is reused by the next output */
    }
}

extern "C" lucid_status lucid_cuda_reduce_dim(lucid_ctx *ctx,
                                              lucid_reduce_op op,
                                              lucid_tensor *out,
                                              const lucid_tensor *a, int dim) {
    CUDA_ENTER(ctx, st);
    if (!lucid_cuda_is_op_dtype(out->dtype))
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "cuda reduce_dim: output dtype %s (expected f32, "
                            "bf16 or f16)",
                            lucid_dtype_name(out->dtype));
    const int64_t R = a->shape[dim];
    const int64_t rs = a->strides[dim];
    lucid_tensor av = *a;
    av.shape[dim] = 1;
    const lucid_tensor *ts[2] = {out, &av};
    lucid_iter it;
    lucid_iter_init(&it, 2, ts);
    const int64_t nout = it.numel;
    if (nout == 0) return LUCID_OK;
    void *op_ = lucid_tensor_data(out);
    const void *ap = lucid_tensor_data(a);
    const bool small = nout <= (int64_t)UINT32_MAX;
    if (nout < 1024 && R >= 2048) {
        unsigned blocks = (unsigned)(nout < 65535 ? nout : 65535);
        if (small)
            lucid_launch(reduce_dim_block_kernel<uint32_t>, blocks, RED_THREADS, 0, st->stream,
                         op_, out->dtype, ap, a->dtype, it, R, rs, op);
        else
            lucid_launch(reduce_dim_block_kernel<uint64_t>, blocks, RED_THREADS, 0, st->stream,
                         op_, out->dtype, ap, a->dtype, it, R, rs, op);
    } else if (rs == 1 && R >= 32) {
        unsigned blocks = lucid_cuda_blocks(nout, RED_THREADS / 32);
        if (small)
            lucid_launch(reduce_dim_warp_kernel<uint32_t>, blocks, RED_THREADS, 0, st->stream,
                         op_, out->dtype, ap, a->dtype, it, R, rs, op);
        else
            lucid_launch(reduce_dim_warp_kernel<uint64_t>, blocks, RED_THREADS, 0, st->stream,
                         op_, out->dtype, ap, a->dtype, it, R, rs, op);
    } else {
        unsigned blocks = lucid_cuda_blocks(nout, RED_THREADS);
        if (small)
            lucid_launch(reduce_dim_thread_kernel<uint32_t>, blocks, RED_THREADS, 0, st->stream,
                         op_, out->dtype, ap, a->dtype, it, R, rs, op);
        else
            lucid_launch(reduce_dim_thread_kernel<uint64_t>, blocks, RED_THREADS, 0, st->stream,
                         op_, out->dtype, ap, a->dtype, it, R, rs, op);
    }
    CUDA_CHECK_LAUNCH(ctx, "reduce_dim kernel");
    return LUCID_OK;
}
