/*
 * matmul.cu — batched matrix product through cuBLAS:
 *     out[b] = alpha * op(a[b]) @ op(b[b]) + beta * out[b]
 * out is overwritten when beta == 0 (its old contents, NaN included, are
 * ignored), accumulated into otherwise.
 *
 * One cublasGemmStridedBatchedEx call with compute type CUBLAS_COMPUTE_32F
 * for every dtype: f32 stays true f32 (no TF32; the handle's math mode also
 * forbids reduced-precision reductions), bf16/f16 inputs and outputs
 * accumulate in f32. Row-major is handled by computing the column-major
 * product out^T = op(b)^T op(a)^T, i.e. swapping the operands.
 *
 * Layout: out contiguous (checked by the dispatch layer); the inner two dims
 * of a and b row-major with any leading dimension, or transposed-contiguous
 * (a transposed view), and the batch dims collapsible to one stride
 * (stride 0 broadcasts). Any other operand is first copied to a contiguous
 * scratch block on the stream.
 */
#include "common.cuh"

#include <limits.h>
#include <string.h>

typedef struct mm_operand {
    const void *ptr;
    cublasOperation_t op; /* for the column-major call */
    int64_t ld;
    int64_t batch_stride;
} mm_operand;

/* Batch stride of the leading dims [0, n-2) when they collapse to one
 * stride; 0 for a single (or broadcast) batch. Returns 0 on failure. */
static int batch_stride_of(const lucid_tensor *x, int64_t *out) {
    int n = x->ndim;
    int64_t shape[LUCID_MAX_DIMS], stride[LUCID_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < n - 2; i++) {
        if (x->shape[i] == 1) continue;
        shape[k] = x->shape[i];
        stride[k] = x->strides[i];
        k++;
    }
    if (k == 0) {
        *out = 0;
        return 1;
    }
    for (int i = 0; i + 1 < k; i++)
        if (stride[i] != stride[i + 1] * shape[i + 1]) return 0;
    *out = stride[k - 1];
    return 1;
}

/* Describe x (logical inner shape [r, c]) for cuBLAS, with user transpose
 * flag t. Returns 0 when the layout needs a contiguous copy. */
static int describe(const lucid_tensor *x, int t, mm_operand *d) {
    int n = x->ndim;
    int64_t r = x->shape[n - 2], c = x->shape[n - 1];
    int64_t sr = x->strides[n - 2], sc = x->strides[n - 1];
    int rowmajor;
    if ((c == 1 || sc == 1) && (r == 1 || sr >= c)) {
        rowmajor = 1;
        d->ld = r == 1 ? (c > 1 ? c : 1) : sr;
        if (d->ld < (c > 1 ? c : 1)) d->ld = c > 1 ? c : 1;
    } else if ((r == 1 || sr == 1) && (c == 1 || sc >= r)) {
        rowmajor = 0;
        d->ld = c == 1 ? (r > 1 ? r : 1) : sc;
        if (d->ld < (r > 1 ? r : 1)) d->ld = r > 1 ? r : 1;
    } else {
        return 0;
    }
    if (d->ld > INT_MAX) return 0;
    if (!batch_stride_of(x, &d->batch_stride)) return 0;
    /* column-major view of the pointer is x^T when row-major, x otherwise;
     * the call needs op(x)^T */
    d->op = (rowmajor != (t != 0)) ? CUBLAS_OP_N : CUBLAS_OP_T;
    d->ptr = lucid_tensor_data(x);
    return 1;
}

/* Contiguous copy of x in scratch memory; view/stor describe it. */
static lucid_status contiguous_copy(lucid_ctx *ctx, lucid_cuda_state *st,
                                    const lucid_tensor *x, void **scratch,
                                    lucid_storage *stor, lucid_tensor *view) {
    size_t nbytes = lucid_tensor_nbytes(x);
    LUCID_TRY(lucid_cuda_scratch(ctx, st, nbytes ? nbytes : 1, scratch));
    memset(stor, 0, sizeof *stor);
    stor->refcount = 1;
    stor->ctx = ctx;
    stor->device = x->storage->device;
    stor->data = *scratch;
    stor->nbytes = nbytes;
    stor->external = 1;
    *view = *x;
    view->storage = stor;
    view->offset = 0;
    lucid_contiguous_strides(view->ndim, view->shape, view->strides);
    return lucid_cuda_copy(ctx, view, x);
}

extern "C" lucid_status lucid_cuda_matmul(lucid_ctx *ctx, lucid_tensor *out,
                                          const lucid_tensor *a,
                                          const lucid_tensor *b, int trans_a,
                                          int trans_b, double alpha,
                                          double beta) {
    CUDA_ENTER(ctx, st);
    if (!lucid_cuda_is_op_dtype(out->dtype))
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "cuda matmul: dtype %s (expected f32, bf16 or f16)",
                            lucid_dtype_name(out->dtype));
    const int n = a->ndim;
    const int64_t M = out->shape[n - 2], N = out->shape[n - 1];
    const int64_t K = trans_a ? a->shape[n - 2] : a->shape[n - 1];
    int64_t batch = 1;
    for (int i = 0; i < n - 2; i++) batch *= out->shape[i];
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || batch > INT_MAX)
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "cuda matmul: sizes M=%lld N=%lld K=%lld batch=%lld "
                            "exceed the 32-bit cuBLAS interface",
                            (long long)M, (long long)N, (long long)K,
                            (long long)batch);

    void *sa = NULL, *sb = NULL;
    lucid_storage stor_a, stor_b;
    lucid_tensor va, vb;
    mm_operand da, db;
    lucid_status s = LUCID_OK;
    if (!describe(a, trans_a, &da)) {
        s = contiguous_copy(ctx, st, a, &sa, &stor_a, &va);
        if (s == LUCID_OK && !describe(&va, trans_a, &da))
            s = lucid_seterr(ctx, LUCID_ERR_ARG, "cuda matmul: bad layout of a");
    }
    if (s == LUCID_OK && !describe(b, trans_b, &db)) {
        s = contiguous_copy(ctx, st, b, &sb, &stor_b, &vb);
        if (s == LUCID_OK && !describe(&vb, trans_b, &db))
            s = lucid_seterr(ctx, LUCID_ERR_ARG, "cuda matmul: bad layout of b");
    }
    if (s == LUCID_OK) {
        const float alpha_f = (float)alpha, beta_f = (float)beta;
        const cudaDataType_t dt = lucid_cuda_datatype(out->dtype);
        cublasStatus_t e = cublasGemmStridedBatchedEx(
            st->cublas, db.op, da.op, (int)N, (int)M, (int)K, &alpha_f, db.ptr,
            dt, (int)db.ld, (long long)db.batch_stride, da.ptr, dt, (int)da.ld,
            (long long)da.batch_stride, &beta_f, lucid_tensor_data(out), dt,
            (int)N, (long long)(M * N), (int)batch, CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT);
        if (e != CUBLAS_STATUS_SUCCESS)
            s = lucid_cublas_err(ctx, e, "cublasGemmStridedBatchedEx", __FILE__,
                                 __LINE__);
    }
    lucid_cuda_scratch_free(st, sa);
    lucid_cuda_scratch_free(st, sb);
    return s;
}
