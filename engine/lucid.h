/*
 * lucid.h — the public C API of the lucid training engine.
 *
 * This is what a host application embeds. Everything hangs off an explicit
 * context (lucid_ctx): device, streams, library handles, RNG seed, allocators
 * and the last error message. There is no global state, so several contexts
 * (two models, two GPUs) can live in one process.
 *
 * Conventions
 *   - Names are lucid_<object>_<verb>; enums are LUCID_<ENUM>_<VALUE>.
 *   - Every fallible function returns lucid_status; on failure the message is
 *     in lucid_ctx_error(ctx). Nothing here calls exit() or abort().
 *   - Indices are 0-based; layouts are row-major, batch-first (NCHW).
 *   - Strides and offsets are counted in elements, not bytes.
 *   - Objects are reference counted: *_retain / *_release. A function that
 *     returns a new object through an out-pointer hands over one reference.
 */
#ifndef LUCID_H
#define LUCID_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LUCID_VERSION "0.1.0"
#define LUCID_MAX_DIMS 8

/* ---------------------------------------------------------------- status */

typedef enum lucid_status {
    LUCID_OK = 0,
    LUCID_ERR_ARG,         /* bad argument: shape, dtype, device, range */
    LUCID_ERR_OOM,         /* allocation failed (message gives the sizes) */
    LUCID_ERR_DEVICE,      /* CUDA / cuBLAS / cuDNN call failed */
    LUCID_ERR_IO,          /* file could not be opened, read or written */
    LUCID_ERR_FORMAT,      /* malformed file content (image, label, checkpoint) */
    LUCID_ERR_UNSUPPORTED, /* op not available for this dtype/device/build */
    LUCID_ERR_STATE,       /* object used in the wrong state (freed, retired) */
    LUCID_ERR_NONFINITE,   /* a NaN or Inf where a finite value was required */
    LUCID_ERR_CONTRACT     /* a recorded step's contract changed (see step) */
} lucid_status;

/* Short stable name of a status ("ok", "arg", "oom", ...). Never NULL. */
const char *lucid_status_name(lucid_status s);

/* ---------------------------------------------------------------- dtypes */

typedef enum lucid_dtype {
    LUCID_F32 = 0,
    LUCID_F64,  /* CPU only: gradient checks */
    LUCID_BF16,
    LUCID_F16,
    LUCID_U8,   /* images */
    LUCID_I32,  /* indices, counters */
    LUCID_I64,
    LUCID_DTYPE_COUNT
} lucid_dtype;

/* Size in bytes of one element. */
size_t lucid_dtype_size(lucid_dtype dt);
/* "f32", "f64", "bf16", "f16", "u8", "i32", "i64". */
const char *lucid_dtype_name(lucid_dtype dt);
/* Parse a dtype name (also accepts "float32", "float", "bfloat16", "half",
 * "float16", "float64", "double", "uint8", "int32", "int64"). Returns 0 on
 * success, -1 when the name is unknown. */
int lucid_dtype_parse(const char *name, lucid_dtype *out);
int lucid_dtype_is_float(lucid_dtype dt);

/* Scalar conversions, round-to-nearest-even; NaN stays NaN, overflow gives
 * Inf (IEEE 754-2008 binary16; bfloat16 as the top 16 bits of binary32). */
uint16_t lucid_f32_to_bf16(float x);
float lucid_bf16_to_f32(uint16_t h);
uint16_t lucid_f32_to_f16(float x);
float lucid_f16_to_f32(uint16_t h);

/* --------------------------------------------------------------- devices */

typedef enum lucid_device_type {
    LUCID_CPU = 0,
    LUCID_CUDA = 1
} lucid_device_type;

typedef struct lucid_device {
    lucid_device_type type;
    int index; /* CUDA ordinal; 0 for the CPU */
} lucid_device;

/* Parse "cpu", "cuda", "cuda:1", "auto" ("auto" gives cuda:0 when a CUDA
 * device is usable in this build, else cpu). Returns 0 or -1. */
int lucid_device_parse(const char *s, lucid_device *out);
/* 1 when this build has the CUDA backend and a device is present. */
int lucid_cuda_available(void);
/* Number of CUDA devices visible (0 without the backend or a GPU). */
int lucid_cuda_device_count(void);

/* --------------------------------------------------------------- context */

typedef struct lucid_ctx lucid_ctx;

typedef struct lucid_ctx_options {
    lucid_device device;   /* the accelerator this context drives; cpu = none */
    uint64_t seed;         /* default seed of the context's generator */
    int cpu_threads;       /* threads for CPU kernels and BLAS; 0 = one per
                              core; more than the pool's limit are capped */
} lucid_ctx_options;

/* Defaults: device cpu, seed 0, cpu_threads 0. */
lucid_ctx_options lucid_ctx_options_default(void);

/* Create a context. On failure *out is NULL and, when err/errlen are given,
 * the message is copied there (there is no context to hold it yet). */
lucid_status lucid_ctx_create(const lucid_ctx_options *opt, lucid_ctx **out,
                              char *err, size_t errlen);
void lucid_ctx_retain(lucid_ctx *ctx);
/* Drops one reference; the last one synchronizes the device and frees
 * streams, handles, caches. Storages hold references to their context. */
void lucid_ctx_release(lucid_ctx *ctx);
/* Last error message of this context ("" when none). */
const char *lucid_ctx_error(const lucid_ctx *ctx);
lucid_status lucid_ctx_last_status(const lucid_ctx *ctx);
void lucid_ctx_clear_error(lucid_ctx *ctx);
lucid_device lucid_ctx_device(const lucid_ctx *ctx);
/* Block until all queued work of this context is done. */
lucid_status lucid_ctx_synchronize(lucid_ctx *ctx);

/* Parameter-gradient lane. While on, the weight and bias gradients of
 * Conv2d module backwards (lucid_module_backward; engine/nn/module.c) are
 * queued on a second stream of the context's device, forked from the
 * compute stream where the module's grad_output is complete, so they overlap
 * the input-gradient (critical-path) work that follows; the same kernels run
 * in the same order per gradient buffer, so results are bitwise those of the
 * lane off. Turning it off joins: the compute stream then waits for all lane
 * work, so anything queued after sees complete gradients. Until that join,
 * reading or writing a Conv2d parameter gradient is a data race: turn the
 * lane on only around a model backward (lucid.Step does, lua/lucid/step.lua).
 * ctx_synchronize, graph capture_end and event records join as well.
 * Without effect on the CPU (the flag is kept and reported, nothing forks),
 * and when LUCID_GRAD_LANE=0 is set in the environment
 * (read once per process; for A/B measurements). Errors: the join's CUDA
 * error (LUCID_ERR_DEVICE). Reference: the wgrad/dgrad stream split of
 * cuDNN-based frameworks (e.g. MXNet's and PyTorch DDP's overlap of
 * weight-gradient work with the backward's critical path). */
lucid_status lucid_ctx_set_grad_lane(lucid_ctx *ctx, int on);  /* on: 0 off, else on */
/* 1 while the parameter-gradient lane is on. */
int lucid_ctx_grad_lane(const lucid_ctx *ctx);

/* Branch lanes: run independent branches of a network concurrently.
 *   lucid_ctx_branch_fork(ctx, b, &forked): the ops queued from now until
 *     lucid_ctx_branch_return go to branch lane b (1..LUCID_BRANCHES), a
 *     stream of the context's device that first waits for everything queued
 *     before the fork; forked = 0 (and the ops stay where they were) on the
 *     CPU, with LUCID_BRANCH_LANES=0, when lane b is already open, or when
 *     its resources would have to be created inside a graph capture.
 *   lucid_ctx_branch_return(ctx): closes the innermost open fork (call it
 *     exactly once per fork that returned forked = 1, also on errors).
 *   lucid_ctx_branch_join(ctx, b): the current stream waits for lane b's
 *     work (b = -1: every branch lane that is not open; an open lane b is
 *     ERR_STATE). Until then, reading what a branch
 *     wrote, or writing what it reads, is a data race.
 * Each lane has its own scratch (nn arena, BatchNorm fold counters, cuBLAS
 * handle and workspace), so the same kernels run with the same results as
 * on one stream: bitwise equal to running the branches in sequence. Under
 * graph capture the forks and joins become graph edges. The parameter-
 * gradient lane nests inside branches. Errors: ERR_ARG for a branch out of
 * range, ERR_STATE for joining an open lane, ERR_DEVICE for a CUDA error.
 * Used by the pose head's box / class / keypoint branches
 * (lua/lucid/nn/head.lua). */
#define LUCID_BRANCHES 3
lucid_status lucid_ctx_branch_fork(lucid_ctx *ctx, int branch, int *forked);
void lucid_ctx_branch_return(lucid_ctx *ctx);
lucid_status lucid_ctx_branch_join(lucid_ctx *ctx, int branch);
/* A join in two halves, to release a branch's results piece by piece while
 * it goes on: lucid_ctx_branch_mark(ctx, b, m) records branch b's current
 * position in mark slot m (1..LUCID_BRANCH_MARKS); it must be called inside
 * an open fork of b where b is the innermost fork, and is a no-op when b is
 * not forked (CPU, lanes off). lucid_ctx_branch_wait(ctx, b, m) makes the
 * current stream wait for that mark, once; a slot not marked since its last
 * wait is a no-op. Errors: ERR_ARG out of range, ERR_STATE for a mark under
 * another fork, ERR_DEVICE. A branch_join is still needed before the
 * branch's later work is read (marks cover only what came before them). */
#define LUCID_BRANCH_MARKS 4
lucid_status lucid_ctx_branch_mark(lucid_ctx *ctx, int branch, int mark);
lucid_status lucid_ctx_branch_wait(lucid_ctx *ctx, int branch, int mark);

/* Allocator statistics of the context's device memory, in bytes. For the CPU
 * device the numbers count tensor storage allocated through the context. */
typedef struct lucid_memory_stats {
    uint64_t allocated;      /* bytes in live blocks */
    uint64_t reserved;       /* bytes held from the driver (live + cached) */
    uint64_t peak_allocated; /* high-water mark of allocated */
    uint64_t peak_reserved;
    uint64_t num_allocs;     /* calls that returned a block */
    uint64_t num_device_allocs; /* of which went to the driver (cache miss) */
} lucid_memory_stats;

lucid_status lucid_memory_stats_get(lucid_ctx *ctx, lucid_device dev,
                                    lucid_memory_stats *out);
/* Return cached, unused device blocks to the driver. */
lucid_status lucid_memory_empty_cache(lucid_ctx *ctx);
lucid_status lucid_memory_reset_peak(lucid_ctx *ctx);

/* --------------------------------------------------------------- storage */

typedef struct lucid_storage lucid_storage;

/* Allocate nbytes on dev (uninitialised). CPU storages are 64-byte aligned;
 * with pinned=1 a CPU storage is page-locked host memory (CUDA builds).
 * nbytes above 2^63-1 is ERR_ARG (a wrapped size computation). */
lucid_status lucid_storage_create(lucid_ctx *ctx, lucid_device dev,
                                  size_t nbytes, int pinned,
                                  lucid_storage **out);
void lucid_storage_retain(lucid_storage *s);
void lucid_storage_release(lucid_storage *s);
void *lucid_storage_data(const lucid_storage *s);
size_t lucid_storage_nbytes(const lucid_storage *s);
lucid_device lucid_storage_device(const lucid_storage *s);
lucid_ctx *lucid_storage_ctx(const lucid_storage *s);
/* Version counter: bumped whenever the storage is written through the op
 * table or replaced; recorded steps compare it to detect drift. */
uint64_t lucid_storage_version(const lucid_storage *s);
void lucid_storage_bump_version(lucid_storage *s);

/* ---------------------------------------------------------------- tensor */

typedef struct lucid_tensor {
    lucid_storage *storage;   /* owning reference */
    lucid_dtype dtype;
    int ndim;                 /* 0 .. LUCID_MAX_DIMS (0 = scalar) */
    int64_t shape[LUCID_MAX_DIMS];
    int64_t strides[LUCID_MAX_DIMS]; /* in elements */
    int64_t offset;           /* in elements from the storage start */
    int refcount;
} lucid_tensor;

/* New contiguous tensor on dev, uninitialised. shape may be NULL if ndim=0. */
lucid_status lucid_tensor_empty(lucid_ctx *ctx, lucid_device dev,
                                lucid_dtype dt, int ndim,
                                const int64_t *shape, lucid_tensor **out);
/* As lucid_tensor_empty, filled with zeros. */
lucid_status lucid_tensor_zeros(lucid_ctx *ctx, lucid_device dev,
                                lucid_dtype dt, int ndim,
                                const int64_t *shape, lucid_tensor **out);
/* A tensor over an existing storage (takes a new reference to it). The view
 * must fit: offset + max index < storage elements. strides NULL: contiguous.
 * Errors (ERR_ARG): a negative stride or offset (as in PyTorch, strides
 * count forward from the offset), a view past the storage's end, a size
 * that overflows. */
lucid_status lucid_tensor_from_storage(lucid_ctx *ctx, lucid_storage *s,
                                       lucid_dtype dt, int ndim,
                                       const int64_t *shape,
                                       const int64_t *strides, int64_t offset,
                                       lucid_tensor **out);
void lucid_tensor_retain(lucid_tensor *t);
void lucid_tensor_release(lucid_tensor *t);

int64_t lucid_tensor_numel(const lucid_tensor *t);
size_t lucid_tensor_nbytes(const lucid_tensor *t); /* numel * dtype size */
/* Elements and bytes of a contiguous tensor of this shape and dtype, every
 * product checked: numel, the row-major strides (products of the trailing
 * sizes, a zero size counted as 1) and numel * dtype size must all fit in
 * int64. Returns 0 (outputs may be NULL), or -1 when ndim is out of range,
 * a size is negative, the dtype is unknown or a product overflows — the
 * shapes lucid_tensor_empty and the views reject with "tensor size
 * overflows". */
int lucid_shape_bytes(int ndim, const int64_t *shape, lucid_dtype dt,
                      int64_t *numel, int64_t *nbytes);
/* 1 when t's elements are dense in row-major order (sizes 1 ignored); an
 * empty tensor (a size 0) is always contiguous, as in PyTorch. */
int lucid_tensor_is_contiguous(const lucid_tensor *t);
lucid_device lucid_tensor_device(const lucid_tensor *t);
lucid_ctx *lucid_tensor_ctx(const lucid_tensor *t);
/* Pointer to element [0,...,0] (storage data + offset * elem size). */
void *lucid_tensor_data(const lucid_tensor *t);
int lucid_tensor_same_shape(const lucid_tensor *a, const lucid_tensor *b);

/* Views share storage. Errors: ERR_ARG naming the dim and sizes. */
lucid_status lucid_tensor_view(lucid_ctx *ctx, const lucid_tensor *t, int ndim,
                               const int64_t *shape, lucid_tensor **out);
/* dim in [0, ndim); start in [0, size); length >= 0; start+length <= size. */
lucid_status lucid_tensor_narrow(lucid_ctx *ctx, const lucid_tensor *t, int dim,
                                 int64_t start, int64_t length,
                                 lucid_tensor **out);
/* Selects index i along dim, removing the dim. */
lucid_status lucid_tensor_select(lucid_ctx *ctx, const lucid_tensor *t, int dim,
                                 int64_t index, lucid_tensor **out);
lucid_status lucid_tensor_transpose(lucid_ctx *ctx, const lucid_tensor *t,
                                    int d0, int d1, lucid_tensor **out);
lucid_status lucid_tensor_permute(lucid_ctx *ctx, const lucid_tensor *t,
                                  const int *perm, lucid_tensor **out);
/* Copy to a new contiguous tensor (same dtype/device). */
lucid_status lucid_tensor_clone(lucid_ctx *ctx, const lucid_tensor *t,
                                lucid_tensor **out);
/* Copy/cast to (dev, dt) into a new contiguous tensor. */
lucid_status lucid_tensor_to(lucid_ctx *ctx, const lucid_tensor *t,
                             lucid_device dev, lucid_dtype dt,
                             lucid_tensor **out);
/* Format t the way PyTorch prints a tensor ("tensor([[1.0000, 2.0000]],
 * dtype=f32, device=cpu)"; 4 decimals, scientific when the range asks for
 * it, summarised with "..." beyond 1000 elements; rules in
 * engine/core/format.c) into buf; CUDA tensors are copied to the host first.
 * Returns the number of characters needed (like snprintf). */
int lucid_tensor_format(lucid_ctx *ctx, const lucid_tensor *t, char *buf,
                        size_t buflen);

/* ------------------------------------------------------------------- ops
 * Every op dispatches on the device of its tensors through the backend
 * table; all tensors of one call must be on the same device (except copy).
 * Output tensors are written in place and must already have the right shape.
 * Arithmetic on bf16/f16 is done in f32 and rounded once on store.
 */

/* dst[...] = value (cast to dst dtype). */
lucid_status lucid_fill(lucid_ctx *ctx, lucid_tensor *dst, double value);
/* dst = src with dtype conversion; any device pair; shapes must match
 * (numel equal when both are contiguous). */
lucid_status lucid_copy(lucid_ctx *ctx, lucid_tensor *dst,
                        const lucid_tensor *src);

typedef enum lucid_binary_op {
    LUCID_OP_ADD = 0, LUCID_OP_SUB, LUCID_OP_MUL, LUCID_OP_DIV,
    LUCID_OP_MAX, LUCID_OP_MIN, LUCID_OP_POW,
    LUCID_BINARY_OP_COUNT
} lucid_binary_op;

typedef enum lucid_unary_op {
    LUCID_OP_NEG = 0, LUCID_OP_ABS, LUCID_OP_EXP, LUCID_OP_LOG,
    LUCID_OP_SQRT, LUCID_OP_SIGMOID, LUCID_OP_SILU, LUCID_OP_TANH,
    LUCID_OP_RELU, LUCID_OP_SQUARE,
    LUCID_UNARY_OP_COUNT
} lucid_unary_op;

/* out = a (op) b, with NumPy broadcasting of a and b to out's shape.
 * Errors: ERR_ARG when shapes do not broadcast to out. */
lucid_status lucid_binary(lucid_ctx *ctx, lucid_binary_op op, lucid_tensor *out,
                          const lucid_tensor *a, const lucid_tensor *b);
/* out = a (op) scalar ("reverse" puts the scalar first: scalar (op) a). */
lucid_status lucid_binary_scalar(lucid_ctx *ctx, lucid_binary_op op,
                                 lucid_tensor *out, const lucid_tensor *a,
                                 double scalar, int reverse);
lucid_status lucid_unary(lucid_ctx *ctx, lucid_unary_op op, lucid_tensor *out,
                         const lucid_tensor *a);
/* y = alpha * x + y  (same shapes). */
lucid_status lucid_axpy(lucid_ctx *ctx, lucid_tensor *y, double alpha,
                        const lucid_tensor *x);

typedef enum lucid_reduce_op {
    LUCID_REDUCE_SUM = 0, LUCID_REDUCE_MEAN, LUCID_REDUCE_MAX,
    LUCID_REDUCE_MIN, LUCID_REDUCE_NORM2, LUCID_REDUCE_SUMSQ,
    LUCID_REDUCE_OP_COUNT
} lucid_reduce_op;

/* Reduce over all elements into out, a 1-element tensor (any float dtype).
 * Accumulation is in f64 on the CPU and f32 (pairwise, fixed order, so
 * deterministic) on CUDA. NaN propagates. */
lucid_status lucid_reduce_all(lucid_ctx *ctx, lucid_reduce_op op,
                              lucid_tensor *out, const lucid_tensor *a);
/* Reduce along one dim; out has a's shape with that dim removed
 * (keepdim=0) or set to 1 (keepdim=1). */
lucid_status lucid_reduce_dim(lucid_ctx *ctx, lucid_reduce_op op,
                              lucid_tensor *out, const lucid_tensor *a,
                              int dim, int keepdim);
/* Reduce and read back as a double (synchronizes the device). */
lucid_status lucid_reduce_item(lucid_ctx *ctx, lucid_reduce_op op,
                               const lucid_tensor *a, double *out);
/* The value of a one-element tensor as double (synchronizes). ERR_ARG for
 * another element count (PyTorch's Tensor.item) or a NULL out. */
lucid_status lucid_tensor_item(lucid_ctx *ctx, const lucid_tensor *t,
                               double *out);

/* Batched matrix product: out[b] = alpha * op(a[b]) @ op(b[b]) + beta * out[b]
 * with op = transpose when trans_* != 0. a: [..., M, K] (or [..., K, M]
 * when trans_a), b: [..., K, N] (or [..., N, K]), out: [..., M, N]. Leading
 * (batch) dims must be equal. f32/f64 (CPU, OpenBLAS), f32/bf16/f16 (CUDA,
 * cuBLAS with f32 accumulation). Inner two dims must be contiguous or
 * transposed-contiguous. */
lucid_status lucid_matmul(lucid_ctx *ctx, lucid_tensor *out,
                          const lucid_tensor *a, const lucid_tensor *b,
                          int trans_a, int trans_b, double alpha, double beta);

/* ---------------------------------------------------------------- random
 * Counter-based generator: Philox-4x32-10 (Salmon et al., "Parallel random
 * numbers: as easy as 1, 2, 3", SC'11). Element i of a contiguous fill draws
 * from counter (offset + i) under key seed, so the CPU and the GPU produce the
 * same values for the same (seed, offset), in any order or thread count.
 *   uniform: u = (philox(seed, offset+i)[0] >> 8) * 2^-24 in [0,1), then
 *            lo + (hi-lo)*u computed in f64 and rounded to the dtype.
 *   normal:  Box–Muller in f64 from words w0, w1 of the same draw:
 *            u1 = ((w0 >> 8) + 1) * 2^-24 in (0,1], u2 = (w1 >> 8) * 2^-24,
 *            z = sqrt(-2 ln u1) * cos(2 pi u2); value = mean + std * z,
 *            rounded once to the dtype.
 */
void lucid_philox4x32(uint64_t seed, uint64_t counter, uint32_t out[4]);
lucid_status lucid_rand_uniform(lucid_ctx *ctx, lucid_tensor *dst,
                                uint64_t seed, uint64_t offset, double lo,
                                double hi);
lucid_status lucid_rand_normal(lucid_ctx *ctx, lucid_tensor *dst,
                               uint64_t seed, uint64_t offset, double mean,
                               double std);
/* The context's own generator: returns (seed, offset) and advances offset by
 * n (so successive fills never overlap). */
void lucid_ctx_rng_next(lucid_ctx *ctx, uint64_t n, uint64_t *seed,
                        uint64_t *offset);
void lucid_ctx_rng_set(lucid_ctx *ctx, uint64_t seed, uint64_t offset);
void lucid_ctx_rng_get(const lucid_ctx *ctx, uint64_t *seed, uint64_t *offset);

#ifdef __cplusplus
}
#endif
#endif /* LUCID_H */
