/*
 * host_standins.h — the engine symbols that the host-only .cu test
 * programs of the cuBLAS conv routes (test_conv_col_maps.cu,
 * test_conv_gemm_split.cu) define instead of linking cuda/backend.cu and
 * engine/core: lucid_seterr keeps the formatted message in g_msg (the
 * tests read it), lucid_dtype_name names the dtypes, and the CUDA / cuBLAS
 * error hooks return ERR_DEVICE.  Include once per program, after lucid.h,
 * cuda_runtime.h and cublas_v2.h.
 */
#ifndef LUCID_SPEC_HOST_STANDINS_H
#define LUCID_SPEC_HOST_STANDINS_H

#include <cstdarg>
#include <cstdio>

static char g_msg[1024];
extern "C" lucid_status lucid_seterr(lucid_ctx *, lucid_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    return s;
}
extern "C" const char *lucid_dtype_name(lucid_dtype dt) {
    return dt == LUCID_F32 ? "f32" : dt == LUCID_BF16 ? "bf16" : dt == LUCID_F16 ? "f16" : "?";
}
lucid_status lucid_cuda_err(lucid_ctx *, cudaError_t, const char *, const char *, int) {
    return LUCID_ERR_DEVICE;
}
lucid_status lucid_cublas_err(lucid_ctx *, cublasStatus_t, const char *, const char *, int) {
    return LUCID_ERR_DEVICE;
}

#endif
