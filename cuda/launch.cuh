/*
 * launch.cuh — kernel launches with programmatic dependent launch (PDL).
 *
 * On compute capability 9.0 and newer, a kernel queued behind another kernel
 * on the same stream may be scheduled before its predecessor has finished
 * (CUDA Programming Guide, "Programmatic Dependent Launch and
 * Synchronization"; PTX ISA, griddepcontrol). A train step is ~1,100 short
 * dependent kernels (tools/kernel-census.sh), so hiding each one's launch and
 * ramp behind the previous one's tail is worth measuring.
 *
 * Measured on the H200 (tools/gpu-run.sh ab, 2026-11-29, commit 9992126):
 * eager forward+backward of YOLO11n-pose (bench_model, b4, 640, bf16) 10.72 ms
 * with PDL vs 11.08 ms without; but the recorded (CUDA-graph) training step
 * of a real fit 10.41 ms with PDL edges in the graph vs 9.99 ms without. So
 * by default the attribute is set on eager launches only, not while the
 * stream is being captured. LUCID_PDL=0: never; LUCID_PDL=graph: also in
 * captured graphs (for A/B runs).
 *
 * The rule that keeps this correct: EVERY kernel launched through
 * lucid_launch() calls lucid_pdl_wait() as its first statement, in every
 * thread, before it reads or writes anything in global memory.
 * griddepcontrol.wait blocks until the preceding grid has completed and its
 * memory operations are visible, so the kernel then sees exactly what a plain
 * <<<>>> launch would: results are bitwise identical with PDL on or off, on
 * the eager and the recorded (stream-captured: programmatic graph edges)
 * route alike. Because every such kernel waits for its predecessor, which
 * itself waited for its own, completion is transitive along the stream.
 *
 * lucid_pdl_launch_dependents() (griddepcontrol.launch_dependents) lets the
 * next grid be scheduled once every block of this one has issued it; call it
 * right after lucid_pdl_wait(). Both are no-ops below sm_90 and when the
 * kernel was not launched with the PDL attribute.
 *
 * In the tree: every __global__ function of cuda/ starts with exactly
 *     lucid_pdl_wait();
 *     lucid_pdl_launch_dependents();
 * as its first two statements (before any declaration, early return or
 * branch, so every thread runs them), whether or not it is launched in the
 * train step, and every launch goes through lucid_launch() (or
 * lucid_launch_coop() / lucid_launch_cluster(), the same plus the cooperative
 * or the cluster-dimension attribute). The lint
 * spec/c/test_pdl_rule.sh (checker spec/c/pdl_rule.lua, counted by make test)
 * enforces both over the .cu and .cuh files of cuda/ and names file:line of
 * a violation. Notes:
 *   - Early launch_dependents cannot starve the running grid: the next grid
 *     is scheduled only after every block of this one has executed it, i.e.
 *     every block is resident or done; the next grid's blocks then park in
 *     griddepcontrol.wait. At most two of our grids are in flight.
 *   - Grids launched by cuBLAS / cuDNN, memsets and copies need nothing: a
 *     PDL kernel behind a library kernel still waits for its completion, and
 *     a launch without the attribute (library kernels, memset/memcpy nodes)
 *     is fully serialized as before.
 *   - Arguments: cudaLaunchKernelEx's variadic template converts each one to
 *     the kernel's parameter type, so implicit conversions (int -> int64_t,
 *     double -> float, T* -> const T*) behave as with <<<>>>. A null pointer
 *     constant does not survive the forwarding: NULL (g++'s __null) or 0
 *     arrives as an integer value and fails to compile; pass nullptr.
 *   - The kernel argument must name one function: a template whose arguments
 *     <<<>>> deduced from the call needs them spelled (k<float>, not k). A
 *     template-id with commas inside a macro argument needs parentheses (as
 *     NN_DISPATCH(dt, (lucid_launch(k<T, M>, ...))) already has).
 *   - A kernel without parameters: lucid_launch(k, grid, block, smem, stream)
 *     compiles (KArgs is empty; cudaLaunchKernelEx then builds a zero-length
 *     void *[] — a GNU extension g++ accepts silently, -Wpedantic would warn).
 *     The tree has none today.
 *   - Errors: the launch's status is returned and also recorded for
 *     cudaGetLastError(), so the existing CUDA_CHECK_LAUNCH checks after each
 *     launch keep working unchanged.
 *   - A host-only program that #includes a .cu of cuda/ without linking
 *     cuda/backend.cu (spec/c/test_conv_igemm_maps.cu) must define
 *     lucid_pdl_for_stream() itself.
 */
#ifndef LUCID_CUDA_LAUNCH_CUH
#define LUCID_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>
#include <utility>

/* Wait for the preceding grid on the stream (completion + memory flush). */
static __device__ __forceinline__ void lucid_pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Allow the next grid on the stream to be scheduled early. */
static __device__ __forceinline__ void lucid_pdl_launch_dependents(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* 1 when a launch on `stream` carries the PDL attribute: the device of the
 * first CUDA context is sm_90+, LUCID_PDL is not "0", and the stream is not
 * being captured (unless LUCID_PDL=graph). The mode is read once per process
 * at the first context's creation (cuda/backend.cu; all devices of one
 * process are assumed to be of one generation). */
int lucid_pdl_for_stream(cudaStream_t stream);

/* Queue kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute
 * when lucid_pdl_for_stream(stream), with the cooperative attribute when
 * cooperative is nonzero (lucid_launch_coop), and with the cluster dimension
 * (cluster_x, 1, 1) when cluster_x > 1 (lucid_launch_cluster). Arguments are
 * converted to the kernel's parameter types as by <<<>>>. Returns the
 * launch's cudaError_t (check it with CUDA_CHECK or CUDA_CHECK_LAUNCH's
 * cudaGetLastError, which it also sets). */
template <typename... KArgs, typename... Args>
static inline cudaError_t lucid_launch_attrs(void (*kernel)(KArgs...), dim3 grid, dim3 block,
                                             size_t smem, cudaStream_t stream, int cooperative,
                                             unsigned cluster_x, Args &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[3];
    unsigned n = 0;
    if (lucid_pdl_for_stream(stream)) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    if (cooperative) {
        attr[n].id = cudaLaunchAttributeCooperative;
        attr[n].val.cooperative = 1;
        n++;
    }
    if (cluster_x > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster_x;
        attr[n].val.clusterDim.y = 1;
        attr[n].val.clusterDim.z = 1;
        n++;
    }
    if (n > 0) {
        cfg.attrs = attr;
        cfg.numAttrs = n;
    }
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

/* lucid_launch_attrs without the cooperative and cluster attributes: the
 * launch of every kernel of cuda/. */
template <typename... KArgs, typename... Args>
static inline cudaError_t lucid_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block,
                                       size_t smem, cudaStream_t stream, Args &&...args) {
    return lucid_launch_attrs(kernel, grid, block, smem, stream, 0, 0u,
                              std::forward<Args>(args)...);
}

/* lucid_launch with the cooperative attribute too (cudaLaunchAttributeCooperative:
 * the semantics of cudaLaunchCooperativeKernel; valid for launches and for
 * graph kernel nodes, so a captured launch keeps it): every block of the
 * grid is resident at once, so blocks may wait on one another (a spin on a
 * global counter).  The device must have cudaDevAttrCooperativeLaunch, and
 * the grid at most cudaOccupancyMaxActiveBlocksPerMultiprocessor(kernel,
 * block, smem) times cudaDevAttrMultiProcessorCount blocks (else
 * cudaErrorCooperativeLaunchTooLarge): the caller checks both (CUDA Runtime
 * API, cudaLaunchCooperativeKernel). */
template <typename... KArgs, typename... Args>
static inline cudaError_t lucid_launch_coop(void (*kernel)(KArgs...), dim3 grid, dim3 block,
                                            size_t smem, cudaStream_t stream, Args &&...args) {
    return lucid_launch_attrs(kernel, grid, block, smem, stream, 1, 0u,
                              std::forward<Args>(args)...);
}

/* lucid_launch with the cluster-dimension attribute too
 * (cudaLaunchAttributeClusterDimension = (cluster_x, 1, 1); valid for
 * launches and for graph kernel nodes, so a captured launch keeps its
 * clusters): the grid's blocks are grouped in clusters of cluster_x
 * consecutive blocks along x, all blocks of a cluster co-scheduled on one
 * GPU processing cluster, so they may wait on one another at the cluster
 * barrier and read one another's shared memory (CUDA Programming Guide,
 * "Thread Block Clusters", "Distributed Shared Memory").  grid.x must be a
 * multiple of cluster_x; the device must have cudaDevAttrClusterLaunch
 * (compute capability 9.0+); a cluster_x above 8 (the portable size) needs
 * the kernel's cudaFuncAttributeNonPortableClusterSizeAllowed set first,
 * and whether a size can run at all is told by
 * cudaOccupancyMaxActiveClusters (> 0): the caller checks these (else the
 * launch returns cudaErrorInvalidClusterSize or another error).  cluster_x
 * 0 or 1: a plain lucid_launch. */
template <typename... KArgs, typename... Args>
static inline cudaError_t lucid_launch_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block,
                                               size_t smem, cudaStream_t stream,
                                               unsigned cluster_x, Args &&...args) {
    return lucid_launch_attrs(kernel, grid, block, smem, stream, 0, cluster_x,
                              std::forward<Args>(args)...);
}

#endif
