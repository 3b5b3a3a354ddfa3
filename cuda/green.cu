/*
 * green.cu — an SM partition for the lanes whose work is off the critical
 * path (LUCID_SIDE_SMS; lane.cu): the parameter-gradient lanes, the cast
 * lane and the cols lane get their streams from a green context of n SMs
 * (CUDA driver API, green contexts, CUDA 12.4+), so their kernels can
 * never hold more than n of the device's SMs, while the compute stream and
 * the branch lanes (the chain of the step) keep the whole device.
 *
 * Why: a CUPTI timeline of the recorded step (H200, session 13, 4edf077)
 * had the kernels of the step's measured path running up to 3x longer in
 * the backward than the same kernels alone: the filter-gradient GEMMs and
 * folds of the low-priority lanes hold SMs when a path kernel is launched
 * (stream priorities order the blocks waiting to be scheduled, they do not
 * preempt resident ones). Summed over the path, its kernels took ~0.5 ms
 * more than the fastest instance of the same kernel and grid on the same
 * path. A partition bounds that: at least (SM count - n) SMs never run
 * side work.
 *
 * The kernels are the same on every route, so results are bitwise those of
 * the unpartitioned lanes, as long as cuBLAS picks the same GEMM kernels
 * for a stream of the partition (it sizes its grids from the device, not
 * from the stream's context, on CUDA 13.0 as measured: the fits' hashes).
 *
 * The driver functions are taken through cudaGetDriverEntryPointByVersion
 * (no link against libcuda). Errors: a setting the device cannot honour
 * (no green contexts in the driver, a partition refused) fails the lane's
 * creation with ERR_UNSUPPORTED naming LUCID_SIDE_SMS, the value and the
 * driver call; the caller (lane.cu) then keeps the lane off and the work on
 * the current stream, as for any lane whose creation failed.
 * Source: CUDA Driver API, "Green Contexts" (cuda.h, CUDA 13.0).
 */
#include "common.cuh"

#include <cuda.h>
#include <string.h>

/* the driver functions, resolved once per process (NULL: not available) */
typedef CUresult (*pfn_device_get)(CUdevice *, int);
typedef CUresult (*pfn_get_resource)(CUdevice, CUdevResource *, CUdevResourceType);
typedef CUresult (*pfn_split)(CUdevResource *, unsigned int *, const CUdevResource *,
                              CUdevResource *, unsigned int, unsigned int);
typedef CUresult (*pfn_desc)(CUdevResourceDesc *, CUdevResource *, unsigned int);
typedef CUresult (*pfn_green_create)(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned int);
typedef CUresult (*pfn_green_destroy)(CUgreenCtx);
typedef CUresult (*pfn_green_stream)(CUstream *, CUgreenCtx, unsigned int, int);
typedef CUresult (*pfn_from_green)(CUcontext *, CUgreenCtx);
typedef CUresult (*pfn_push)(CUcontext);
typedef CUresult (*pfn_pop)(CUcontext *);
typedef CUresult (*pfn_node_attr)(CUgraphNode, CUkernelNodeAttrID, const CUkernelNodeAttrValue *);

static struct {
    int resolved;
    pfn_device_get device_get;
    pfn_get_resource get_resource;
    pfn_split split;
    pfn_desc desc;
    pfn_green_create create;
    pfn_green_destroy destroy;
    pfn_green_stream stream;
    pfn_from_green from_green;
    pfn_push push;
    pfn_pop pop;
    pfn_node_attr node_attr;
} drv;

/* the driver's function `sym` with the ABI of the toolkit lucid was built
 * with (CUDA_VERSION; cuGreenCtxStreamCreate is 12.5+), NULL (and *missing
 * = sym, the first one) when the driver has none */
static void *entry(const char *sym, const char **missing) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion(sym, &fn, CUDA_VERSION, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn) {
        (void)cudaGetLastError();
        if (!*missing) *missing = sym;
        return NULL;
    }
    return fn;
}

/* NULL when every function is there, else the name of the first missing */
static const char *resolve(void) {
    static const char *missing = NULL;
    if (!drv.resolved) {
        drv.device_get = (pfn_device_get)entry("cuDeviceGet", &missing);
        drv.get_resource = (pfn_get_resource)entry("cuDeviceGetDevResource", &missing);
        drv.split = (pfn_split)entry("cuDevSmResourceSplitByCount", &missing);
        drv.desc = (pfn_desc)entry("cuDevResourceGenerateDesc", &missing);
        drv.create = (pfn_green_create)entry("cuGreenCtxCreate", &missing);
        drv.destroy = (pfn_green_destroy)entry("cuGreenCtxDestroy", &missing);
        drv.stream = (pfn_green_stream)entry("cuGreenCtxStreamCreate", &missing);
        drv.from_green = (pfn_from_green)entry("cuCtxFromGreenCtx", &missing);
        drv.push = (pfn_push)entry("cuCtxPushCurrent", &missing);
        drv.pop = (pfn_pop)entry("cuCtxPopCurrent", &missing);
        drv.node_attr = (pfn_node_attr)entry("cuGraphKernelNodeSetAttribute", &missing);
        drv.resolved = 1;
    }
    return missing;
}

/* streams created in a side partition so far, any context (test hook) */
static unsigned long g_side_streams;

extern "C" int lucid_cuda_side_sms_switch(void) {
    static int n = -1;
    return lucid_env_int("LUCID_SIDE_SMS", 0, 1 << 20, 0, &n);
}

static lucid_status drv_err(lucid_ctx *ctx, int want, const char *call, CUresult r) {
    return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                        "LUCID_SIDE_SMS=%d: %s failed (CUresult %d): no SM partition for the "
                        "side lanes on this device (unset LUCID_SIDE_SMS)",
                        want, call, (int)r);
}

/* The partition of st (created on first use): st->side_green, with
 * st->side_sms its SM count. want >= the device's SM count: no partition
 * (side_sms = 0, LUCID_OK). */
static lucid_status side_green(lucid_ctx *ctx, lucid_cuda_state *st, int want) {
    if (st->side_green || st->side_sms < 0) return LUCID_OK;
    if (want >= st->sm_count) {
        st->side_sms = -1; /* nothing to partition: plain streams */
        return LUCID_OK;
    }
    const char *missing = resolve();
    if (missing)
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "LUCID_SIDE_SMS=%d: the CUDA driver has no %s (green contexts, "
                            "ABI %d); unset LUCID_SIDE_SMS",
                            want, missing, CUDA_VERSION);
    CUdevice dev;
    CUresult r = drv.device_get(&dev, st->device);
    if (r != CUDA_SUCCESS) return drv_err(ctx, want, "cuDeviceGet", r);
    CUdevResource all, part, rest;
    memset(&all, 0, sizeof all);
    memset(&part, 0, sizeof part);
    memset(&rest, 0, sizeof rest);
    r = drv.get_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM);
    if (r != CUDA_SUCCESS) return drv_err(ctx, want, "cuDeviceGetDevResource", r);
    unsigned int groups = 1;
    r = drv.split(&part, &groups, &all, &rest, 0, (unsigned int)want);
    if (r != CUDA_SUCCESS || groups != 1)
        return drv_err(ctx, want, "cuDevSmResourceSplitByCount", r);
    CUdevResourceDesc desc;
    r = drv.desc(&desc, &part, 1);
    if (r != CUDA_SUCCESS) return drv_err(ctx, want, "cuDevResourceGenerateDesc", r);
    CUgreenCtx g = NULL;
    r = drv.create(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM);
    if (r != CUDA_SUCCESS) return drv_err(ctx, want, "cuGreenCtxCreate", r);
    st->side_green = (void *)g;
    st->side_sms = (int)part.sm.smCount;
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_side_stream_create(lucid_ctx *ctx, lucid_cuda_state *st,
                                                      int priority, cudaStream_t *stream) {
    int want = lucid_cuda_side_sms_switch();
    if (want > 0) LUCID_TRY(side_green(ctx, st, want));
    if (!st->side_green) {
        CUDA_CHECK(ctx, cudaStreamCreateWithPriority(stream, cudaStreamNonBlocking, priority));
        return LUCID_OK;
    }
    CUstream s = NULL;
    CUresult r = drv.stream(&s, (CUgreenCtx)st->side_green, CU_STREAM_NON_BLOCKING, priority);
    if (r != CUDA_SUCCESS) return drv_err(ctx, want, "cuGreenCtxStreamCreate", r);
    *stream = (cudaStream_t)s;
    __atomic_add_fetch(&g_side_streams, 1UL, __ATOMIC_RELAXED);
    return LUCID_OK;
}

extern "C" unsigned long lucid_cuda_side_stream_count(void) {
    return __atomic_load_n(&g_side_streams, __ATOMIC_RELAXED);
}

extern "C" lucid_status lucid_cuda_side_node_priority(lucid_ctx *ctx, lucid_cuda_state *st,
                                                      void *node, int priority) {
    if (!st->side_green)
        return lucid_seterr(ctx, LUCID_ERR_STATE, "side node priority: no side partition");
    CUcontext c = NULL, prev = NULL;
    CUresult r = drv.from_green(&c, (CUgreenCtx)st->side_green);
    if (r != CUDA_SUCCESS) return drv_err(ctx, st->side_sms, "cuCtxFromGreenCtx", r);
    r = drv.push(c);
    if (r != CUDA_SUCCESS) return drv_err(ctx, st->side_sms, "cuCtxPushCurrent", r);
    CUkernelNodeAttrValue v;
    memset(&v, 0, sizeof v);
    v.priority = priority;
    r = drv.node_attr((CUgraphNode)node, CU_LAUNCH_ATTRIBUTE_PRIORITY, &v);
    CUresult rp = drv.pop(&prev);
    if (r != CUDA_SUCCESS) return drv_err(ctx, st->side_sms, "cuGraphKernelNodeSetAttribute", r);
    if (rp != CUDA_SUCCESS) return drv_err(ctx, st->side_sms, "cuCtxPopCurrent", rp);
    return LUCID_OK;
}

extern "C" void lucid_cuda_side_green_destroy(lucid_cuda_state *st) {
    if (st->side_green && drv.destroy) drv.destroy((CUgreenCtx)st->side_green);
    st->side_green = NULL;
    st->side_sms = 0;
}

extern "C" int lucid_cuda_side_sms(lucid_ctx *ctx) {
    if (!ctx || !ctx->accel || !ctx->backend_state) return 0;
    const lucid_cuda_state *st = (const lucid_cuda_state *)ctx->backend_state;
    return st->side_green ? st->side_sms : 0;
}
