/*
 * cuda_absent.c — compiled instead of cuda/ in a build without CUDA (CUDA=0):
 * the engine then has no accelerator backend and every request for a CUDA
 * device is a clear LUCID_ERR_UNSUPPORTED error. Each getter that a cuda/
 * file defines in a CUDA build has its NULL twin here, so the engine refers
 * to them with ordinary (strong) references and static links pull the CUDA
 * objects in.
 */
#include "internal.h"
#include "nn/nn.h"
#include "train/optim_backend.h"
#include "train/loss_backend.h"
#include "data/input.h"

const lucid_backend *lucid_cuda_backend(void) { return NULL; }

int lucid_cuda_backend_device_count(void) { return 0; }

/* Kernel tables of the other layers that cuda/ provides in a CUDA build. */
const lucid_optim_kernels *lucid_optim_cuda_kernels_impl(void) { return NULL; }
const lucid_nn_kernels *lucid_nn_cuda_kernels(void) { return NULL; }
const lucid_pose_loss_kernels *lucid_pose_loss_cuda_kernels(void) { return NULL; }
const lucid_input_kernels *lucid_input_cuda_kernels(void) { return NULL; }
