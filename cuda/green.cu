/*
 * green.cu — an SM partition for the lanes whose work is off the critical
 * path (LUCID_SIDE_SMS, opt-in; lane.cu): the parameter-gradient lanes, the
 * cast lane and the cols lane get their streams from a green context of n
 * SMs (CUDA driver API, green contexts; cuGreenCtxStreamCreate is CUDA
 * 12.5+), so their kernels never run on more SMs than the partition holds
 * (n rounded up by the driver to its partition granularity: 8 SMs on sm_90),
 * while the compute stream and the branch lanes (the chain of the step) keep
 * the whole device.
 *
 * Why it was built: a CUPTI timeline of the recorded step (H200, session 13)
 * had the step's path kernels running up to 3x longer in the backward than
 * the same kernels alone, beside the filter-gradient GEMMs and folds of the
 * low-priority lanes (stream priorities order the blocks waiting to be
 * scheduled; they do not preempt resident ones). What it measured (session
 * 14, DECISIONS 43): no gain at 64, 96 or 112 SMs, so that inflation is not
 * SMs held by side blocks. Kept as an A/B knob.
 *
 * The kernels are the same on every route, so results are bitwise those of
 * the unpartitioned lanes as long as cuBLAS picks the same GEMM kernels for
 * a stream of the partition (measured on CUDA 13.0: the fits' hashes and
 * spec/side_sms_spec.lua).
 *
 * The driver functions are taken through cudaGetDriverEntryPointByVersion
 * at the toolkit's ABI (no link against libcuda). Errors: LUCID_SIDE_SMS
 * not a whole number 0..2^20 is ERR_ARG naming the value; a partition the
 * device cannot give (no green contexts in the driver, a count the split
 * refuses, e.g. one that rounds up past the device) is ERR_UNSUPPORTED
 * naming the setting and the driver call. Either error fails the lane's
 * creation, so the op that forked the lane fails with it (a run asked for a
 * partition never runs silently without one); a lane whose creation failed
 * stays off (lane.cu), and every other lane's creation fails the same way.
 * Known limit: the runtime's kernel-node calls refuse nodes captured from
 * the partition's streams (cudaErrorDeviceUninitialized), so the slack
 * priorities set theirs through the driver (lucid_cuda_side_node_priority)
 * and LUCID_GRAPH_STATS may count them as unreadable.
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
    static int n = -2;
    if (n == -2) {
        const char *e = getenv("LUCID_SIDE_SMS");
        char *end = NULL;
        long v = e && *e ? strtol(e, &end, 10) : 0;
        n = (!e || !*e) ? 0 : (end && *end == '\0' && v >= 0 && v <= (1L << 20)) ? (int)v : -1;
    }
    return n;
}

static lucid_status drv_err(lucid_ctx *ctx, int want, const char *call, CUresult r) {
    return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                        "LUCID_SIDE_SMS=%d: %s failed (CUresult %d): no SM partition for the "
                        "side lanes on this device (unset LUCID_SIDE_SMS)",
                        want, call, (int)r);
}

/* The partition of st (created on first use): st->side_green, with
 * st->side_sms its SM count. want >= the device's SM count: no partition
 * (side_sms = -1: plain streams, LUCID_OK). */
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
    if (r != CUDA_SUCCESS) return drv_err(ctx, want, "cuDevSmResourceSplitByCount", r);
    if (groups != 1)
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "LUCID_SIDE_SMS=%d: cuDevSmResourceSplitByCount made no partition "
                            "of %d SMs (partitions of at least %u SMs, in steps of %u; %u "
                            "in all): ask for fewer, or unset LUCID_SIDE_SMS",
                            want, want, all.sm.minSmPartitionSize, all.sm.smCoscheduledAlignment,
                            all.sm.smCount);
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
    if (want < 0)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "LUCID_SIDE_SMS=\"%s\": expected a whole number of SMs, 0 to "
                            "1048576 (0 or unset: no partition)",
                            getenv("LUCID_SIDE_SMS") ? getenv("LUCID_SIDE_SMS") : "");
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
