/*
 * matmul.c — CPU batched matrix product through OpenBLAS.
 *
 * Contract: out[b] = alpha * op(a[b]) @ op(b[b]) + beta * out[b] for every
 * batch index b (the leading dims, equal for all three; ops.c checked the
 * shapes and that out is contiguous). out is overwritten when beta == 0
 * (its old contents, NaN included, are ignored, as BLAS specifies).
 *   - f32: cblas_sgemm, f64: cblas_dgemm, straight on the tensors' memory
 *     when each operand's inner two dims are row-major (unit column stride)
 *     or column-major (unit row stride) with a leading dimension >= the
 *     row length; batch dims may have any strides. Other layouts (stride-0
 *     broadcasts, gaps in both dims) are first copied to a contiguous temp.
 *   - bf16/f16: a, b (and out when beta != 0) are converted to f32, the
 *     product is an sgemm, and the result is rounded once to out's dtype.
 *   - Threads: OpenBLAS threads itself. When the context's cpu_threads > 0
 *     it is passed to openblas_set_num_threads before each product; that
 *     setting is process-wide in OpenBLAS (the last context to run wins).
 *   - Dims above INT_MAX (BLAS's int) give LUCID_ERR_UNSUPPORTED.
 */
#include "cpu.h"
#include <cblas.h>
#include <limits.h>
#include <string.h>

void openblas_set_num_threads(int num_threads);

/* ---------------------------------------------------------- layouts */

/* How one operand's inner R x C matrix sits in memory for BLAS. */
typedef struct mat_layout {
    int ok;      /* 1 when BLAS can read it in place */
    int trans;   /* 1 when stored column-major (BLAS sees the transpose) */
    int64_t ld;  /* leading dimension */
} mat_layout;

static mat_layout layout_of(const lucid_tensor *t) {
    mat_layout L = {0, 0, 0};
    int n = t->ndim;
    int64_t R = t->shape[n - 2], C = t->shape[n - 1];
    int64_t sr = t->strides[n - 2], sc = t->strides[n - 1];
    int64_t C1 = C > 1 ? C : 1, R1 = R > 1 ? R : 1;
    if ((C == 1 || sc == 1) && (R == 1 || sr >= C1)) {
        L.ok = 1;
        L.ld = R == 1 ? C1 : sr;
    } else if ((R == 1 || sr == 1) && (C == 1 || sc >= R1)) {
        L.ok = 1;
        L.trans = 1;
        L.ld = C == 1 ? R1 : sc;
    }
    if (L.ld < 1 || L.ld > INT_MAX) L.ok = 0;
    return L;
}

/* Element offset of batch index bi (row-major over the leading dims). */
static int64_t batch_offset(const lucid_tensor *t, int64_t bi) {
    int64_t off = t->offset;
    for (int d = t->ndim - 3; d >= 0; d--) {
        off += (bi % t->shape[d]) * t->strides[d];
        bi /= t->shape[d];
    }
    return off;
}

/* New contiguous CPU tensor of t's shape in dtype dt holding t's values. */
static lucid_status to_contiguous(lucid_ctx *ctx, const lucid_tensor *t,
                                  lucid_dtype dt, lucid_tensor **out) {
    lucid_device cpu = {LUCID_CPU, 0};
    LUCID_TRY(lucid_tensor_empty(ctx, cpu, dt, t->ndim, t->shape, out));
    lucid_status s = lucid_cpu_copy(ctx, *out, t);
    if (s != LUCID_OK) {
        lucid_tensor_release(*out);
        *out = NULL;
    }
    return s;
}

/* ------------------------------------------------------------- gemm */

/* f32/f64 product over tensors whose dtype is F32 or F64 (all the same). */
static lucid_status gemm_native(lucid_ctx *ctx, lucid_tensor *out,
                                const lucid_tensor *a, const lucid_tensor *b,
                                int trans_a, int trans_b, double alpha,
                                double beta) {
    int n = out->ndim;
    int64_t M = out->shape[n - 2], N = out->shape[n - 1];
    int64_t K = trans_a ? a->shape[n - 2] : a->shape[n - 1];
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "matmul: dims M=%lld N=%lld K=%lld exceed BLAS's "
                            "int range",
                            (long long)M, (long long)N, (long long)K);
    lucid_tensor *ta = NULL, *tb = NULL;
    mat_layout La = layout_of(a), Lb = layout_of(b);
    lucid_status s = LUCID_OK;
    if (!La.ok) {
        s = to_contiguous(ctx, a, a->dtype, &ta);
        if (s != LUCID_OK) return s;
        a = ta;
        La = layout_of(a);
    }
    if (!Lb.ok) {
        s = to_contiguous(ctx, b, b->dtype, &tb);
        if (s != LUCID_OK) {
            lucid_tensor_release(ta);
            return s;
        }
        b = tb;
        Lb = layout_of(b);
    }
    if (ctx->cpu_threads > 0) openblas_set_num_threads(ctx->cpu_threads);
    /* A stored column-major is its transpose stored row-major: flip. */
    enum CBLAS_TRANSPOSE opa = (trans_a != La.trans) ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE opb = (trans_b != Lb.trans) ? CblasTrans : CblasNoTrans;
    int64_t batch = 1;
    for (int d = 0; d < n - 2; d++) batch *= out->shape[d];
    int ldc = N > 1 ? (int)N : 1;
    for (int64_t bi = 0; bi < batch; bi++) {
        int64_t oa = batch_offset(a, bi), ob = batch_offset(b, bi);
        int64_t oc = out->offset + bi * M * N;
        if (out->dtype == LUCID_F64)
            cblas_dgemm(CblasRowMajor, opa, opb, (int)M, (int)N, (int)K, alpha,
                        cpu_ptr(a, oa), (int)La.ld, cpu_ptr(b, ob), (int)Lb.ld,
                        beta, cpu_ptr(out, oc), ldc);
        else
            cblas_sgemm(CblasRowMajor, opa, opb, (int)M, (int)N, (int)K,
                        (float)alpha, cpu_ptr(a, oa), (int)La.ld, cpu_ptr(b, ob),
                        (int)Lb.ld, (float)beta, cpu_ptr(out, oc), ldc);
    }
    lucid_tensor_release(ta);
    lucid_tensor_release(tb);
    return LUCID_OK;
}

lucid_status lucid_cpu_matmul(lucid_ctx *ctx, lucid_tensor *out,
                              const lucid_tensor *a, const lucid_tensor *b,
                              int trans_a, int trans_b, double alpha,
                              double beta) {
    if (out->dtype == LUCID_F32 || out->dtype == LUCID_F64)
        return gemm_native(ctx, out, a, b, trans_a, trans_b, alpha, beta);
    if (out->dtype != LUCID_BF16 && out->dtype != LUCID_F16)
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "matmul: dtype %s not supported on the cpu",
                            lucid_dtype_name(out->dtype));
    /* half types: f32 copies, one sgemm, round once on the way back */
    lucid_tensor *a32 = NULL, *b32 = NULL, *o32 = NULL;
    lucid_status s = to_contiguous(ctx, a, LUCID_F32, &a32);
    if (s == LUCID_OK) s = to_contiguous(ctx, b, LUCID_F32, &b32);
    if (s == LUCID_OK) {
        if (beta != 0.0)
            s = to_contiguous(ctx, out, LUCID_F32, &o32);
        else
            s = lucid_tensor_empty(ctx, lucid_tensor_device(out), LUCID_F32,
                                   out->ndim, out->shape, &o32);
    }
    if (s == LUCID_OK)
        s = gemm_native(ctx, o32, a32, b32, trans_a, trans_b, alpha, beta);
    if (s == LUCID_OK) s = lucid_cpu_copy(ctx, out, o32);
    lucid_tensor_release(a32);
    lucid_tensor_release(b32);
    lucid_tensor_release(o32);
    return s;
}
