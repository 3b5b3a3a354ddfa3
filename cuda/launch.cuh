/*
 * launch.cuh — kernel launches with programmatic dependent launch (PDL).
 *
 * On compute capability 9.0 and newer, a kernel queued behind another kernel
 * on the same stream may be scheduled before its predecessor has finished
 * (CUDA Programming Guide, "Programmatic Dependent Launch and
 * Synchronization"; PTX ISA, griddepcontrol). A train step is ~1,100 short
 * dependent kernels (tools/kernel-census.sh), so hiding each one's launch and
 * ramp behind the previous one's tail is worth measuring (LUCID_PDL=0 turns
 * it off for an A/B in one process tree).
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
 * spec/c/test_pdl_rule.sh checks the rule over cuda/*.cu.
 *
 * lucid_pdl_launch_dependents() (griddepcontrol.launch_dependents) lets the
 * next grid be scheduled once every block of this one has issued it; call it
 * right after lucid_pdl_wait(). Both are no-ops below sm_90 and when the
 * kernel was not launched with the PDL attribute.
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

/* 1 when launches carry the PDL attribute: the current device is sm_90+ and
 * the environment does not say LUCID_PDL=0. Read once per process (all
 * devices of one process are assumed to be of one generation; a device below
 * 9.0 never gets the attribute because the first query sees it). */
int lucid_pdl_enabled(void);

/* Queue kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute
 * when lucid_pdl_enabled(). Arguments are converted to the kernel's parameter
 * types as by <<<>>>. Returns the launch's cudaError_t (check it with
 * CUDA_CHECK or CUDA_CHECK_LAUNCH's cudaGetLastError, which it also sets). */
template <typename... KArgs, typename... Args>
static inline cudaError_t lucid_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block,
                                       size_t smem, cudaStream_t stream, Args &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    if (lucid_pdl_enabled()) {
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

#endif
