/*
 * iter.c — strided row iteration and dtype gather/scatter for the CPU
 * backend (see cpu.h for the contract).
 *
 * Every CPU op is: walk the operands row by row (cpu_rows), gather each
 * operand row into a contiguous f32/f64 buffer unless it already is one,
 * compute, scatter the result. Conversions round once, to nearest even;
 * f64 -> bf16/f16 goes through a round-to-odd f32 so it is correctly rounded.
 */
#include "cpu.h"
#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- rows */

int cpu_rows_init(cpu_rows *it, int nops, const lucid_tensor *const *ts) {
    const lucid_tensor *t0 = ts[0];
    memset(it, 0, sizeof *it);
    it->nops = nops;
    for (int d = 0; d < t0->ndim; d++)
        if (t0->shape[d] == 0) return 0;
    /* drop size-1 dims, then merge dims contiguous for every operand */
    int nd = 0;
    for (int d = 0; d < t0->ndim; d++) {
        if (t0->shape[d] == 1) continue;
        int merge = nd > 0;
        for (int k = 0; k < nops && merge; k++)
            if (it->strides[k][nd - 1] != ts[k]->strides[d] * t0->shape[d])
                merge = 0;
        if (merge) {
            it->shape[nd - 1] *= t0->shape[d];
            for (int k = 0; k < nops; k++)
                it->strides[k][nd - 1] = ts[k]->strides[d];
        } else {
            it->shape[nd] = t0->shape[d];
            for (int k = 0; k < nops; k++) it->strides[k][nd] = ts[k]->strides[d];
            nd++;
        }
    }
    if (nd == 0) { /* scalar or all dims of size 1 */
        it->shape[0] = 1;
        for (int k = 0; k < nops; k++) it->strides[k][0] = 0;
        nd = 1;
    }
    it->ndim = nd;
    it->len = it->shape[nd - 1];
    it->rows_left = 1;
    for (int d = 0; d < nd - 1; d++) it->rows_left *= it->shape[d];
    it->rows_left -= 1;
    for (int k = 0; k < nops; k++) {
        it->off[k] = ts[k]->offset;
        it->inner[k] = it->strides[k][nd - 1];
    }
    return 1;
}

int cpu_rows_next(cpu_rows *it) {
    if (it->rows_left <= 0) return 0;
    it->rows_left--;
    for (int d = it->ndim - 2; d >= 0; d--) {
        if (++it->idx[d] < it->shape[d]) {
            for (int k = 0; k < it->nops; k++) it->off[k] += it->strides[k][d];
            return 1;
        }
        it->idx[d] = 0;
        for (int k = 0; k < it->nops; k++)
            it->off[k] -= it->strides[k][d] * (it->shape[d] - 1);
    }
    return 1; /* unreachable while rows_left was > 0 */
}

/* --------------------------------------------------------- conversions */

/* f64 -> f32 rounding to odd: the result's last bit records inexactness, so
 * a second rounding to a narrower format (>= 2 bits shorter) is correct. */
static float f64_to_f32_odd(double x) {
    float f = (float)x;
    if (isnan(x) || (double)f == x) return f;
    uint32_t u;
    memcpy(&u, &f, 4);
    if (fabs((double)f) > fabs(x)) u -= 1; /* truncate toward zero */
    u |= 1u;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t cpu_f64_to_bf16(double x) { return lucid_f32_to_bf16(f64_to_f32_odd(x)); }
uint16_t cpu_f64_to_f16(double x) { return lucid_f32_to_f16(f64_to_f32_odd(x)); }

int64_t cpu_f64_to_i64(double x) {
    if (isnan(x)) return 0;
    if (x >= 9223372036854775807.0) return INT64_MAX;
    if (x <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)x;
}

int32_t cpu_f64_to_i32(double x) {
    if (isnan(x)) return 0;
    if (x >= 2147483647.0) return INT32_MAX;
    if (x <= -2147483648.0) return INT32_MIN;
    return (int32_t)x;
}

uint8_t cpu_f64_to_u8(double x) {
    if (isnan(x) || x <= 0.0) return 0;
    if (x >= 255.0) return 255;
    return (uint8_t)x;
}

/* ------------------------------------------------------- gather/scatter */

void cpu_load_f32(float *dst, const lucid_tensor *t, int64_t off,
                  int64_t stride, int64_t n) {
    const void *p = cpu_ptr(t, off);
    switch (t->dtype) {
    case LUCID_F32: {
        const float *s = p;
        if (stride == 1) memcpy(dst, s, (size_t)n * sizeof *s);
        else for (int64_t j = 0; j < n; j++) dst[j] = s[j * stride];
        break;
    }
    case LUCID_F64: {
        const double *s = p;
        for (int64_t j = 0; j < n; j++) dst[j] = (float)s[j * stride];
        break;
    }
    case LUCID_BF16: {
        const uint16_t *s = p;
        for (int64_t j = 0; j < n; j++) dst[j] = lucid_bf16_to_f32(s[j * stride]);
        break;
    }
    case LUCID_F16: {
        const uint16_t *s = p;
        for (int64_t j = 0; j < n; j++) dst[j] = lucid_f16_to_f32(s[j * stride]);
        break;
    }
    case LUCID_U8: {
        const uint8_t *s = p;
        for (int64_t j = 0; j < n; j++) dst[j] = (float)s[j * stride];
        break;
    }
    case LUCID_I32: {
        const int32_t *s = p;
        for (int64_t j = 0; j < n; j++) dst[j] = (float)s[j * stride];
        break;
    }
    case LUCID_I64: {
        const int64_t *s = p;
        for (int64_t j = 0; j < n; j++) dst[j] = (float)s[j * stride];
        break;
    }
    default: break;
    }
}

void cpu_load_f64(double *dst, const lucid_tensor *t, int64_t off,
                  int64_t stride, int64_t n) {
    const void *p = cpu_ptr(t, off);
    switch (t->dtype) {
    case LUCID_F32: {
        const float *s = p;
        for (int64_t j = 0; j < n; j++) dst[j] = s[j * stride];
        break;
    }
    case LUCID_F64: {
        const double *s = p;
        if (stride == 1) memcpy(dst, s, (size_t)n * sizeof *s);
        else for (int64_t j = 0; j < n; j++) dst[j] = s[j * stride];
        break;
    }
    case LUCID_BF16: {
        const uint16_t *s = p;
        for (int64_t j = 0; j < n; j++) dst[j] = lucid_bf16_to_f32(s[j * stride]);
        break;
    }
    case LUCID_F16: {
        const uint16_t *s = p;
        for (int64_t j = 0; j < n; j++) dst[j] = lucid_f16_to_f32(s[j * stride]);
        break;
    }
    case LUCID_U8: {
        const uint8_t *s = p;
        for (int64_t j = 0; j < n; j++) dst[j] = s[j * stride];
        break;
    }
    case LUCID_I32: {
        const int32_t *s = p;
        for (int64_t j = 0; j < n; j++) dst[j] = s[j * stride];
        break;
    }
    case LUCID_I64: {
        const int64_t *s = p;
        for (int64_t j = 0; j < n; j++) dst[j] = (double)s[j * stride];
        break;
    }
    default: break;
    }
}

void cpu_store_f32(lucid_tensor *t, int64_t off, int64_t stride,
                   const float *src, int64_t n) {
    void *p = cpu_ptr(t, off);
    switch (t->dtype) {
    case LUCID_F32: {
        float *d = p;
        if (stride == 1) memmove(d, src, (size_t)n * sizeof *d);
        else for (int64_t j = 0; j < n; j++) d[j * stride] = src[j];
        break;
    }
    case LUCID_F64: {
        double *d = p;
        for (int64_t j = 0; j < n; j++) d[j * stride] = src[j];
        break;
    }
    case LUCID_BF16: {
        uint16_t *d = p;
        for (int64_t j = 0; j < n; j++) d[j * stride] = lucid_f32_to_bf16(src[j]);
        break;
    }
    case LUCID_F16: {
        uint16_t *d = p;
        for (int64_t j = 0; j < n; j++) d[j * stride] = lucid_f32_to_f16(src[j]);
        break;
    }
    case LUCID_U8: {
        uint8_t *d = p;
        for (int64_t j = 0; j < n; j++) d[j * stride] = cpu_f64_to_u8(src[j]);
        break;
    }
    case LUCID_I32: {
        int32_t *d = p;
        for (int64_t j = 0; j < n; j++) d[j * stride] = cpu_f64_to_i32(src[j]);
        break;
    }
    case LUCID_I64: {
        int64_t *d = p;
        for (int64_t j = 0; j < n; j++) d[j * stride] = cpu_f64_to_i64(src[j]);
        break;
    }
    default: break;
    }
}

void cpu_store_f64(lucid_tensor *t, int64_t off, int64_t stride,
                   const double *src, int64_t n) {
    void *p = cpu_ptr(t, off);
    switch (t->dtype) {
    case LUCID_F32: {
        float *d = p;
        for (int64_t j = 0; j < n; j++) d[j * stride] = (float)src[j];
        break;
    }
    case LUCID_F64: {
        double *d = p;
        if (stride == 1) memmove(d, src, (size_t)n * sizeof *d);
        else for (int64_t j = 0; j < n; j++) d[j * stride] = src[j];
        break;
    }
    case LUCID_BF16: {
        uint16_t *d = p;
        for (int64_t j = 0; j < n; j++) d[j * stride] = cpu_f64_to_bf16(src[j]);
        break;
    }
    case LUCID_F16: {
        uint16_t *d = p;
        for (int64_t j = 0; j < n; j++) d[j * stride] = cpu_f64_to_f16(src[j]);
        break;
    }
    case LUCID_U8: {
        uint8_t *d = p;
        for (int64_t j = 0; j < n; j++) d[j * stride] = cpu_f64_to_u8(src[j]);
        break;
    }
    case LUCID_I32: {
        int32_t *d = p;
        for (int64_t j = 0; j < n; j++) d[j * stride] = cpu_f64_to_i32(src[j]);
        break;
    }
    case LUCID_I64: {
        int64_t *d = p;
        for (int64_t j = 0; j < n; j++) d[j * stride] = cpu_f64_to_i64(src[j]);
        break;
    }
    default: break;
    }
}
