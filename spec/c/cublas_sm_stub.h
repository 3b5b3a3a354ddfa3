/* Link stubs of cublasGetSmCountTarget / cublasSetSmCountTarget for the
 * host tests that compile cuda/nn_conv_gemm.cu against stubbed cuBLAS
 * entry points: LUCID_WGRAD_SM (nn_conv_gemm.cu) reaches them only when the
 * variable is set, which these tests never do. */
#pragma once
#include <cublas_v2.h>

extern "C" cublasStatus_t cublasGetSmCountTarget(cublasHandle_t, int *n) {
    *n = 0;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasSetSmCountTarget(cublasHandle_t, int) {
    return CUBLAS_STATUS_SUCCESS;
}
