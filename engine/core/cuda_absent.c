/*
 * cuda_absent.c — compiled instead of cuda/ in a build without CUDA (CUDA=0):
 * the engine then has no accelerator backend and every request for a CUDA
 * device is a clear LUCID_ERR_UNSUPPORTED error.
 */
#include "internal.h"

const lucid_backend *lucid_cuda_backend(void) { return NULL; }

int lucid_cuda_backend_device_count(void) { return 0; }
