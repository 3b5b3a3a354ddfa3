/*
 * reduce.c — CPU reductions: reduce_all and reduce_dim for SUM, MEAN, MAX,
 * MIN, NORM2 (sqrt of the sum of squares) and SUMSQ.
 *
 * Contract
 *   - Input a: any dtype, any strides; out: a float dtype (checked by ops.c),
 *     overwritten. Accumulation is in f64 in a fixed order (deterministic);
 *     the result is rounded once to out's dtype.
 *   - NaN propagates for every op, MAX/MIN included. Empty input: SUM, SUMSQ
 *     and NORM2 give 0 (MEAN/MAX/MIN of nothing are rejected by ops.c).
 *   - reduce_all: out has one element. reduce_dim: out is in keepdim form
 *     (a's shape with dim set to 1, any strides), as ops.c passes it.
 *   - NORM2 is not rescaled: an f64 input whose squares overflow gives Inf.
 */
#include "cpu.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------- accumulator */

typedef struct racc {
    double s[4];  /* partial sums (SUM, MEAN, SUMSQ, NORM2) */
    double m;     /* running max/min */
    int nan;      /* a NaN was seen (MAX/MIN) */
    int64_t n;    /* elements seen */
} racc;

static void racc_init(racc *r, lucid_reduce_op op) {
    memset(r, 0, sizeof *r);
    r->m = op == LUCID_REDUCE_MAX ? -INFINITY : INFINITY;
}

/* Fold x[0..n) into r. Four partial sums keep the adds pipelined while the
 * order stays fixed. */
static void racc_add(racc *r, lucid_reduce_op op, const double *x, int64_t n) {
    int64_t j = 0;
    r->n += n;
    switch (op) {
    case LUCID_REDUCE_SUM:
    case LUCID_REDUCE_MEAN:
        for (; j + 4 <= n; j += 4) {
            r->s[0] += x[j]; r->s[1] += x[j + 1];
            r->s[2] += x[j + 2]; r->s[3] += x[j + 3];
        }
        for (; j < n; j++) r->s[0] += x[j];
        break;
    case LUCID_REDUCE_SUMSQ:
    case LUCID_REDUCE_NORM2:
        for (; j + 4 <= n; j += 4) {
            r->s[0] += x[j] * x[j]; r->s[1] += x[j + 1] * x[j + 1];
            r->s[2] += x[j + 2] * x[j + 2]; r->s[3] += x[j + 3] * x[j + 3];
        }
        for (; j < n; j++) r->s[0] += x[j] * x[j];
        break;
    case LUCID_REDUCE_MAX:
        for (; j < n; j++) {
            if (x[j] != x[j]) r->nan = 1;
            else if (x[j] > r->m) r->m = x[j];
        }
        break;
    case LUCID_REDUCE_MIN:
        for (; j < n; j++) {
            if (x[j] != x[j]) r->nan = 1;
            else if (x[j] < r->m) r->m = x[j];
        }
        break;
    default: break;
    }
}

static double racc_result(const racc *r, lucid_reduce_op op) {
    double s = (r->s[0] + r->s[1]) + (r->s[2] + r->s[3]);
    switch (op) {
    case LUCID_REDUCE_SUM: return s;
    case LUCID_REDUCE_MEAN: return r->n ? s / (double)r->n : NAN;
    case LUCID_REDUCE_SUMSQ: return s;
    case LUCID_REDUCE_NORM2: return sqrt(s);
    case LUCID_REDUCE_MAX:
    case LUCID_REDUCE_MIN: return r->nan ? NAN : r->m;
    default: return NAN;
    }
}

/* ---------------------------------------------------------- reduce_all */

lucid_status lucid_cpu_reduce_all(lucid_ctx *ctx, lucid_reduce_op op,
                                  lucid_tensor *out, const lucid_tensor *a) {
    racc r;
    racc_init(&r, op);
    const lucid_tensor *ts[1] = {a};
    cpu_rows it;
    if (cpu_rows_init(&it, 1, ts)) {
        double buf[CPU_CHUNK];
        do {
            for (int64_t j0 = 0; j0 < it.len; j0 += CPU_CHUNK) {
                int64_t n = it.len - j0 < CPU_CHUNK ? it.len - j0 : CPU_CHUNK;
                int64_t off = it.off[0] + j0 * it.inner[0];
                const double *x = buf;
                if (a->dtype == LUCID_F64 && it.inner[0] == 1)
                    x = cpu_ptr(a, off);
                else
                    cpu_load_f64(buf, a, off, it.inner[0], n);
                racc_add(&r, op, x, n);
            }
        } while (cpu_rows_next(&it));
    }
    double v = racc_result(&r, op);
    cpu_store_f64(out, out->offset, 1, &v, 1);
    return LUCID_OK;
}

/* ---------------------------------------------------------- reduce_dim */

/* acc[j*as] (op)= x[j], j < n; as = 0 folds the whole row into acc[0]. */
static void fold_row(lucid_reduce_op op, double *acc, int64_t as,
                     const double *x, int64_t n) {
    if (as == 0) { /* the row runs along the reduced dim: fold it locally */
        racc r;
        racc_init(&r, op);
        racc_add(&r, op, x, n);
        if (op == LUCID_REDUCE_MAX || op == LUCID_REDUCE_MIN) {
            double v = racc_result(&r, op);
            fold_row(op, acc, 1, &v, 1);
        } else { /* a partial sum (of squares); MEAN/NORM2 finish later */
            *acc += (r.s[0] + r.s[1]) + (r.s[2] + r.s[3]);
        }
        return;
    }
    switch (op) {
    case LUCID_REDUCE_SUM:
    case LUCID_REDUCE_MEAN:
        for (int64_t j = 0; j < n; j++) acc[j * as] += x[j];
        break;
    case LUCID_REDUCE_SUMSQ:
    case LUCID_REDUCE_NORM2:
        for (int64_t j = 0; j < n; j++) acc[j * as] += x[j] * x[j];
        break;
    case LUCID_REDUCE_MAX:
        for (int64_t j = 0; j < n; j++) {
            double *p = &acc[j * as];
            if (x[j] != x[j] || x[j] > *p) *p = x[j];
        }
        break;
    case LUCID_REDUCE_MIN:
        for (int64_t j = 0; j < n; j++) {
            double *p = &acc[j * as];
            if (x[j] != x[j] || x[j] < *p) *p = x[j];
        }
        break;
    default: break;
    }
}

lucid_status lucid_cpu_reduce_dim(lucid_ctx *ctx, lucid_reduce_op op,
                                  lucid_tensor *out, const lucid_tensor *a,
                                  int dim) {
    int64_t nout = lucid_tensor_numel(out);
    if (nout == 0) return LUCID_OK;
    double *acc = malloc((size_t)nout * sizeof *acc);
    if (!acc)
        return lucid_seterr(ctx, LUCID_ERR_OOM,
                            "reduce_dim: cannot allocate %lld accumulator "
                            "bytes",
                            (long long)(nout * (int64_t)sizeof *acc));
    double init = op == LUCID_REDUCE_MAX ? -INFINITY
                : op == LUCID_REDUCE_MIN ? INFINITY : 0.0;
    for (int64_t i = 0; i < nout; i++) acc[i] = init;

    /* the accumulator as an f64 tensor of out's (keepdim) shape, contiguous;
     * seen with a's shape it is broadcast along dim (stride 0) */
    lucid_storage st;
    memset(&st, 0, sizeof st);
    st.data = acc;
    st.nbytes = (size_t)nout * sizeof *acc;
    lucid_tensor acct;
    memset(&acct, 0, sizeof acct);
    acct.storage = &st;
    acct.dtype = LUCID_F64;
    acct.ndim = out->ndim;
    memcpy(acct.shape, out->shape, sizeof acct.shape);
    lucid_contiguous_strides(acct.ndim, acct.shape, acct.strides);
    lucid_tensor accb = acct;
    memcpy(accb.shape, a->shape, sizeof accb.shape);
    accb.strides[dim] = 0;

    const lucid_tensor *ts[2] = {&accb, a};
    cpu_rows it;
    if (cpu_rows_init(&it, 2, ts)) {
        double buf[CPU_CHUNK];
        do {
            for (int64_t j0 = 0; j0 < it.len; j0 += CPU_CHUNK) {
                int64_t n = it.len - j0 < CPU_CHUNK ? it.len - j0 : CPU_CHUNK;
                cpu_load_f64(buf, a, it.off[1] + j0 * it.inner[1], it.inner[1], n);
                fold_row(op, acc + it.off[0] + j0 * it.inner[0], it.inner[0],
                         buf, n);
            }
        } while (cpu_rows_next(&it));
    }
    int64_t size = a->shape[dim];
    if (op == LUCID_REDUCE_MEAN)
        for (int64_t i = 0; i < nout; i++) acc[i] /= (double)size;
    else if (op == LUCID_REDUCE_NORM2)
        for (int64_t i = 0; i < nout; i++) acc[i] = sqrt(acc[i]);
    lucid_status s = lucid_cpu_copy(ctx, out, &acct);
    free(acc);
    return s;
}
