/*
 * internal.h — private structures of the engine and the backend table.
 *
 * Not part of the public API. engine/ (plain C11) and cuda/ (the CUDA
 * backend, compiled as C++ by nvcc) both include it; it includes no Lua and
 * no CUDA header.
 *
 * Backends: each device type has one lucid_backend table of function
 * pointers. The dispatch layer (engine/core/ops.c) checks arguments, expands
 * broadcasts into stride-0 views and then calls the table of the device the
 * tensors live on, so backend functions receive tensors that already have
 * the same shape (out's shape) and valid dtypes/devices.
 *
 * Errors: a backend function that fails calls lucid_seterr() and returns its
 * status. Nothing calls exit()/abort() on a recoverable error.
 */
#ifndef LUCID_INTERNAL_H
#define LUCID_INTERNAL_H

#include "lucid.h"
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------- switch variables */

/* An A/B switch that "0" turns off (LUCID_GRAD_LANE, LUCID_WCAST_ONCE, ...),
 * read once: *cache starts at -1 and then holds 1 when the variable is set
 * to "0", else 0 (a race between threads reads the same value twice). */
static inline int lucid_env_zero(const char *name, int *cache) {
    if (*cache < 0) {
        const char *e = getenv(name);
        *cache = e && strcmp(e, "0") == 0;
    }
    return *cache;
}

/* A whole-number switch (LUCID_GRAD_LANES, LUCID_WGRAD_BLOCKS, ...), read
 * once: *cache starts at -1 and then holds the variable's value when it is
 * a whole number in [lo, hi] (0 <= lo), else dflt (unset, empty, "12abc",
 * "-5", out of range). */
static inline int lucid_env_int(const char *name, int lo, int hi, int dflt, int *cache) {
    if (*cache < 0) {
        const char *e = getenv(name);
        char *end = NULL;
        long v = e && *e ? strtol(e, &end, 10) : 0;
        *cache = (end && *end == '\0' && v >= lo && v <= hi) ? (int)v : dflt;
    }
    return *cache;
}

/* ------------------------------------------------------------ error helpers */

/* Store a printf-formatted message and status in ctx; returns status.
 * ctx may be NULL (then the message is dropped). */
lucid_status lucid_seterr(lucid_ctx *ctx, lucid_status status, const char *fmt,
                          ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
lucid_status lucid_vseterr(lucid_ctx *ctx, lucid_status status,
                           const char *fmt, va_list ap);

/* Propagate a failed status. */
#define LUCID_TRY(expr)                                                       \
    do {                                                                      \
        lucid_status lucid_try_s_ = (expr);                                   \
        if (lucid_try_s_ != LUCID_OK) return lucid_try_s_;                    \
    } while (0)

/* Format a shape as "[2,3,4]" into buf (returns buf). */
const char *lucid_shape_str(int ndim, const int64_t *shape, char *buf,
                            size_t buflen);

/* ---------------------------------------------------------------- backend */

typedef struct lucid_backend {
    const char *name;

    /* Lifetime of the per-context state of this backend (streams, handles,
     * allocator). init stores its state in ctx->backend_state. */
    lucid_status (*init)(lucid_ctx *ctx, int device_index);
    void (*shutdown)(lucid_ctx *ctx);
    lucid_status (*synchronize)(lucid_ctx *ctx);

    /* Device memory (through the backend's caching allocator). */
    lucid_status (*alloc)(lucid_ctx *ctx, size_t nbytes, void **ptr);
    void (*free)(lucid_ctx *ctx, void *ptr, size_t nbytes);
    /* Page-locked host memory (NULL when unsupported). */
    lucid_status (*host_alloc_pinned)(lucid_ctx *ctx, size_t nbytes,
                                      void **ptr);
    void (*host_free_pinned)(lucid_ctx *ctx, void *ptr);
    lucid_status (*memory_stats)(lucid_ctx *ctx, lucid_memory_stats *out);
    lucid_status (*empty_cache)(lucid_ctx *ctx);
    lucid_status (*reset_peak)(lucid_ctx *ctx);

    /* Ops. Shapes already checked and broadcast by the dispatch layer. */
    /* copy: dst and src have the same shape; either may be on the CPU when
     * this is the CUDA backend (host<->device copies), any dtypes. */
    lucid_status (*copy)(lucid_ctx *ctx, lucid_tensor *dst,
                         const lucid_tensor *src);
    lucid_status (*fill)(lucid_ctx *ctx, lucid_tensor *dst, double value);
    /* out, a, b same shape (a/b may carry stride-0 dims). */
    lucid_status (*binary)(lucid_ctx *ctx, lucid_binary_op op,
                           lucid_tensor *out, const lucid_tensor *a,
                           const lucid_tensor *b);
    lucid_status (*binary_scalar)(lucid_ctx *ctx, lucid_binary_op op,
                                  lucid_tensor *out, const lucid_tensor *a,
                                  double scalar, int reverse);
    lucid_status (*unary)(lucid_ctx *ctx, lucid_unary_op op, lucid_tensor *out,
                          const lucid_tensor *a);
    lucid_status (*axpy)(lucid_ctx *ctx, lucid_tensor *y, double alpha,
                         const lucid_tensor *x);
    /* out has one element. */
    lucid_status (*reduce_all)(lucid_ctx *ctx, lucid_reduce_op op,
                               lucid_tensor *out, const lucid_tensor *a);
    /* out has a's shape with dim set to 1 (keepdim form). */
    lucid_status (*reduce_dim)(lucid_ctx *ctx, lucid_reduce_op op,
                               lucid_tensor *out, const lucid_tensor *a,
                               int dim);
    /* Shapes checked; batch = product of leading dims. */
    lucid_status (*matmul)(lucid_ctx *ctx, lucid_tensor *out,
                           const lucid_tensor *a, const lucid_tensor *b,
                           int trans_a, int trans_b, double alpha,
                           double beta);
    lucid_status (*rand_uniform)(lucid_ctx *ctx, lucid_tensor *dst,
                                 uint64_t seed, uint64_t offset, double lo,
                                 double hi);
    lucid_status (*rand_normal)(lucid_ctx *ctx, lucid_tensor *dst,
                                uint64_t seed, uint64_t offset, double mean,
                                double std);

    /* CUDA graphs (engine/train/graph.h; NULL on backends without them, so
     * tables that end above stay valid). Capture records the work queued on
     * the context's compute stream; while capturing, the backend's allocator
     * refuses every device allocation. capture_end with graph_exec == NULL
     * ends and discards the capture (the failure path); otherwise it
     * instantiates the graph into *graph_exec and sets *keeps (1: the
     * capture, begun with LUCID_CAPTURE_KEEP_SHADOWS in flags, queued no
     * conv weight shadow cast; train/graph.h), which graph_launch is given
     * back. capturing returns 1 while a capture of this context is open. */
    lucid_status (*capture_begin)(lucid_ctx *ctx, unsigned flags);
    lucid_status (*capture_end)(lucid_ctx *ctx, void **graph_exec, int *keeps);
    lucid_status (*graph_launch)(lucid_ctx *ctx, void *graph_exec, int keeps);
    void (*graph_destroy)(lucid_ctx *ctx, void *graph_exec);
    int (*capturing)(lucid_ctx *ctx);
    /* Events on the compute stream (created by the first record). */
    lucid_status (*event_record)(lucid_ctx *ctx, void **event);
    lucid_status (*event_synchronize)(lucid_ctx *ctx, void *event);
    void (*event_destroy)(lucid_ctx *ctx, void *event);

    /* Lanes (cuda/lane.cu; NULL on the CPU): side streams of the device.
     * lane_fork(lane) queues a fork point on the current stream and
     * redirects the ops that follow, until lane_return, to the lane's stream
     * (*forked = 1; 0 when the lane cannot be used now: switched off, already
     * open, or its resources would have to be created during a capture; the
     * ops then stay on the current stream). Forks nest; lane_return closes
     * the innermost. lane_join(lane) makes the current stream wait for the
     * lane's queued work (lane -1: every lane; a no-op without pending work).
     * Lane 0 is the parameter-gradient lane (lucid_ctx_set_grad_lane), lanes
     * 1..3 the branch lanes (lucid_ctx_branch_fork), both in lucid.h. A
     * fork of lane 0 passes `key`, the gradient buffer its work writes: a
     * backend with several parameter-gradient streams runs all the work of
     * one key on the same one (NULL for the branch lanes). lane_join(0)
     * joins every parameter-gradient stream. */
    lucid_status (*lane_fork)(lucid_ctx *ctx, int lane, const void *key, int *forked);
    void (*lane_return)(lucid_ctx *ctx);
    lucid_status (*lane_join)(lucid_ctx *ctx, int lane);
    /* A join in two halves: mark records the lane's position in a slot
     * (inside an open fork of that lane only), wait makes the current stream
     * wait for it once (lucid_ctx_branch_mark / _wait, lucid.h). */
    lucid_status (*lane_mark)(lucid_ctx *ctx, int lane, int slot);
    lucid_status (*lane_wait)(lucid_ctx *ctx, int lane, int slot);
    /* The current stream waits for the work before event's last record (a
     * NULL event, never recorded, is a no-op). */
    lucid_status (*event_wait)(lucid_ctx *ctx, void *event);
    /* n copies of bytes[i] from src[i] to dst[i] (device pointers or host
     * ones, pinned for overlap) on the side copy stream: it first waits for
     * `after` (NULL: nothing), then copies, then records *done (created on
     * first use; done NULL: none). ERR_STATE during a capture. */
    lucid_status (*side_copy)(lucid_ctx *ctx, int n, void *const *dst, const void *const *src,
                              const size_t *bytes, void *after, void **done);
    /* Record *event (created on first use) at the current tail of the
     * compute stream without joining the lanes; while a capture is open, as
     * an external event record node of the graph (each replay records it at
     * that point). NULL: not supported. */
    lucid_status (*event_record_node)(lucid_ctx *ctx, void **event);
    /* Every conv weight shadow of the context stale (train/graph.h
     * lucid_ctx_shadows_stale). NULL: nothing to do. */
    lucid_status (*shadows_stale)(lucid_ctx *ctx);
} lucid_backend;

/* The CPU backend (engine/cpu/). Always present. */
const lucid_backend *lucid_cpu_backend(void);
/* The CUDA backend (cuda/), or NULL in a build without CUDA. */
const lucid_backend *lucid_cuda_backend(void);
/* Devices visible to the CUDA backend (0 in a build without CUDA). */
int lucid_cuda_backend_device_count(void);

/* Backend for a device of this context: the CPU table for LUCID_CPU, the
 * CUDA table when dev is the context's CUDA device; else NULL and an error
 * is set in ctx. */
const lucid_backend *lucid_backend_for(lucid_ctx *ctx, lucid_device dev);

/* ---------------------------------------------------------------- structs */

struct lucid_ctx {
    int refcount;                 /* atomic ops via __atomic builtins */
    lucid_device device;          /* accelerator driven by this context */
    const lucid_backend *accel;   /* backend of `device` (NULL for cpu) */
    void *backend_state;          /* owned by accel (streams, allocator, ...) */
    int cpu_threads;
    int grad_lane;                /* lucid_ctx_set_grad_lane */
    uint64_t rng_seed, rng_offset;
    lucid_memory_stats cpu_stats; /* CPU storage accounting */
    lucid_status last_status;
    char errmsg[2048];
};

struct lucid_storage {
    int refcount;
    lucid_ctx *ctx;      /* owning reference */
    lucid_device device;
    void *data;
    size_t nbytes;
    int pinned;          /* CPU page-locked memory */
    int external;        /* data not owned (wrapping caller memory) */
    uint64_t version;
};

/* Fork the parameter-gradient lane (lane 0) for the ops that follow when
 * the grad lane is on (lucid_ctx_set_grad_lane) and tensors on dev run on
 * the context's accelerator; *forked says whether it did. key: the
 * gradient buffer the forked work writes (its data pointer); work on the
 * same key always goes to the same stream of the lane, so accumulations
 * into one buffer keep their order. Every fork that returned *forked = 1
 * must be closed by lucid_ctx_branch_return before the caller returns (the
 * lane then stays pending until the next join). */
lucid_status lucid_ctx_grad_lane_fork(lucid_ctx *ctx, lucid_device dev, const void *key,
                                      int *forked);

/* Wrap caller-owned memory as a storage (never freed by lucid). */
lucid_status lucid_storage_wrap(lucid_ctx *ctx, lucid_device dev, void *data,
                                size_t nbytes, lucid_storage **out);

/* Elements covered by a view: 1 + sum((shape-1)*|stride|), 0 if empty. */
int64_t lucid_tensor_span(const lucid_tensor *t);
/* A view of t with its shape broadcast to (ndim, shape) by NumPy rules
 * (missing leading dims and size-1 dims get stride 0). Fills *view in place
 * (no refcount taken on the storage: the view must not outlive t). */
lucid_status lucid_tensor_broadcast_view(lucid_ctx *ctx, const lucid_tensor *t,
                                         int ndim, const int64_t *shape,
                                         lucid_tensor *view);
/* Row-major contiguous strides for shape. */
void lucid_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);

/* Philox-4x32-10 block function over a full 4-word counter and 2-word key
 * (Random123's philox4x32_R(10, ctr, key)); lucid_philox4x32 is this with
 * ctr = (lo32(counter), hi32(counter), 0, 0), key = (lo32(seed), hi32(seed)). */
void lucid_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
                         uint32_t out[4]);

/* Read element at linear (row-major logical) index i of any CPU tensor as
 * double; write likewise. Slow paths for reference code and tests. */
double lucid_cpu_get(const lucid_tensor *t, int64_t i);
void lucid_cpu_set(lucid_tensor *t, int64_t i, double v);
/* Byte offset of logical index i (row-major over shape) in t's storage
 * data, element units. */
int64_t lucid_tensor_elem_offset(const lucid_tensor *t, int64_t i);

#ifdef __cplusplus
}
#endif
#endif /* LUCID_INTERNAL_H */
