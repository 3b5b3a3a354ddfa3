/*
 * nn_norm.cuh — shared internals of the GPU BatchNorm2d (plain and fused
 * with SiLU) and of the per-channel sum used by the conv bias gradient:
 * the partition of the reductions, the walks, the vector path, the block
 * reductions and the "last block folds" arrival, the routes of the
 * element-wise kernels.  The kernels themselves:
 *   nn_norm_fwd.cu  forward: statistics (training: partial + fold, eval:
 *                   the running ones), apply, the one-pass training
 *                   forward; the nn.h slots lucid_cuda_batchnorm2d_forward
 *                   and lucid_cuda_batchnorm2d_silu_forward; the test hooks
 *   nn_norm_bwd.cu  backward: gradient sums (partial + fold), dx, the
 *                   one-pass training backward; the slots
 *                   lucid_cuda_batchnorm2d_backward and
 *                   lucid_cuda_batchnorm2d_silu_backward; the per-channel
 *                   sum lucid_cuda_nn_channel_sum (nn_common.cuh)
 * Everything here is internal to those two files (static / inline; the
 * launch counters are defined once, in nn_norm_fwd.cu).
 *
 * Contract (nn.h): x, y, dy, dx [N,C,H,W] contiguous, f32/bf16/f16;
 * weight, bias, running_mean, running_var, save_mean, save_invstd,
 * dweight, dbias [C] f32; num_batches_tracked one i64 (or float) element.
 *   forward overwrites y, save_mean, save_invstd; training updates the
 *   running stats in place (momentum, unbiased variance M/(M-1)) and
 *   num_batches_tracked += 1.
 *   backward: dx = beta_input*dx + ...; dweight/dbias = beta_params*(.) + ...
 *   (beta 0 never reads the destination).
 *
 * Partition of the reductions (a function of N and S only, bn_geom_of):
 * channel c's M = N*S elements are N planes of S contiguous elements, C*S
 * apart.  A plane of S >= BN_PART (8192) elements is cut into P =
 * ceil(S/BN_PART) chunks of `chunk` elements (ceil(S/P) rounded up to a
 * multiple of 8, the last chunk shorter), one part per (plane, chunk); a
 * smaller plane is never cut: pp = floor(BN_PART/S) consecutive whole planes
 * (n, n+1, ...) make one part.  parts = ceil(N/pp) * P per channel, each
 * part at most BN_PART elements, part 0 always the largest.  So every
 * channel of at most BN_PART elements (N=4: S <= 2048, e.g. 40x40, 20x20)
 * is ONE part: one block computes the channel's statistics or gradient sums
 * and writes the final results itself (no partial, no counter, no fold).
 * E.g. N=4 (YOLO, 640): 16x320x320 has 52 parts per channel (13 chunks of
 * 7880 per plane), 32x160x160 16 (4 of 6400), 64x80x80 4 (whole planes),
 * 128x40x40 and 256x20x20 1 (one pass: 1 launch forward, 1 backward).
 *
 * Reductions are deterministic (no float atomics).  One block per (part,
 * channel) (grid (parts, min(C, 65535)), channels strided by grid.y) folds
 * its part in a fixed order: thread t takes the part's vectors t, t+256,
 * ... (BN_UNROLL of them loaded before any is used), accumulates in f32,
 * then a fixed shuffle/shared tree.  With parts == 1 thread 0 finishes the
 * channel (f64).  Otherwise it stores the partial in the nn arena and the
 * partials are folded in f64 in a fixed order (bn_stats_fold: sums shifted
 * by part 0's mean, Chan's merge of all parts at once; bn_grad_fold: plain
 * sums; thread t of a block takes parts t, t+256, ... in turn, then one
 * shuffle tree over all the sums at once, and across warps only when
 * parts > 32) by the LAST block to finish channel c ("last block folds",
 * CUDA sample threadFenceReduction): thread 0 of each block stores its
 * partial, __threadfence(), atomicAdd on channel c's arrival counter (nn
 * state, zero between launches); the block that sees parts-1 resets the
 * counter to 0 and folds.  Which block that is varies run to run, but the
 * fold reads the partials by part index with threadIdx-only roles, so the
 * result does not: bitwise identical run to run, eager or replayed from a
 * graph.  When the counters are unavailable (C > LUCID_CUDA_NN_COUNTERS,
 * or the first use is inside a stream capture) a separate final kernel runs
 * the same fold function, one block per channel: the same bits, one launch
 * more (none when parts == 1: that path never folds).
 *
 * Memory access.  Vector path: when S is a multiple of V = 16/sizeof(T)
 * (8 bf16/f16, 4 f32) and every activation pointer of the call is 16-byte
 * aligned (decided on the host; template parameter V), each access is one
 * 16-byte load/store of V elements; otherwise V = 1 (scalar).  Every part
 * then starts on a vector (chunk is a multiple of 8), and the vector
 * choice of the statistics/gradient kernels depends on the shape and the
 * pointers' alignment, never on which outputs are asked (the backward
 * checks x and dy whatever it computes, so dx only / dweight only / dbias
 * only give the full call's bits).  A part's vectors are walked with 32-bit
 * (plane, offset) counters advanced without division (a part holds at most
 * BN_PART elements; plane base offsets are 64-bit).  The element-wise
 * kernels (bn_apply, bn_dx) run flat over the N*C*S elements as N*C*S/V
 * vectors, grid-stride with at most BN_WAVE blocks per SM, BN_UNROLL
 * vectors per thread loaded before use; the channel of a vector, (j/(S/V))
 * % C, is computed once per thread and then advanced with adds and
 * compares (bn_at_next).  32-bit indices when N*C*S <= INT32_MAX, else a
 * 64-bit scalar route (huge tensors; BN_ROUTE_WIDE).  The element-wise
 * kernels have no reduction, so their route never changes bits.
 *
 * One pass (parts == 1).  When a channel is one part, training fuses the
 * two launches of each direction into one kernel, one block per channel
 * (grid (1, min(C, 65535)), channels strided by grid.y), which computes
 * the channel's statistics (forward) or gradient sums (backward) exactly
 * as the partial kernel's one-part path and then, after a barrier, the
 * channel's y or dx with the element-wise kernel's per-element arithmetic
 * (bn_stats_apply1, nn_norm_fwd.cu; bn_grad_dx1, nn_norm_bwd.cu).  Each
 * block reads its channel twice (the second time mostly from L2) but the
 * layer costs one launch per direction: the small late layers are
 * launch-latency bound.  Every value is computed by the same expressions
 * in the same order, so the results equal the two-launch route's bitwise.
 * Only the training forward and the training backward with dx take it
 * (dweight/dbias alone is one launch already, eval has no reduction before
 * the element-wise pass); multi-part channels take the cluster or the
 * cooperative kernels below instead.  LUCID_BN_ONEPASS=0 in the
 * environment (read on each call, bn_onepass; unset or anything else: on)
 * keeps the two-launch route for A/B runs.  The choice depends on the
 * shape and that switch only; the host bookkeeping (arena, counters) is
 * the same either way, so eager calls and captured graphs take the same
 * route.  Test hooks (nn_norm_fwd.cu): lucid_cuda_bn_launch_count() counts
 * the kernels this thread's BatchNorm calls queued (nn_common.cuh),
 * lucid_cuda_bn_wide_count() those of them that took BN_ROUTE_WIDE,
 * lucid_cuda_bn_coop_count() the cooperative ones, lucid_cuda_bn_cluster_count()
 * the cluster ones (below).
 *
 * Cooperative (parts > 1).  The training forward and the training backward
 * with dx of multi-part channels are one launch each too, when the grid is
 * co-resident: bn_stats_apply_coop (nn_norm_fwd.cu) and bn_grad_dx_coop /
 * bn_grad_dx_coop_lean (nn_norm_bwd.cu) run on the partial kernel's grid
 * (block (part, c), the same partition, walk and tree), queued with
 * lucid_launch_coop (launch.cuh: the cooperative attribute, valid for
 * launches and for graph kernel nodes, so a captured launch stays
 * cooperative: every block of the grid is resident at once).  Each block
 * computes and stores its partial exactly as bn_stats_partial /
 * bn_grad_partial, then waits at its channel's barrier (bn_coop_wait:
 * __threadfence, atomicAdd on the channel's counter of the nn state, spin
 * with volatile loads until all `parts` blocks arrived, then a second
 * atomicAdd whose last block, every block having left the spin, sets the
 * counter back to 0: zero between launches, as the last-block-folds route
 * and the next replay need); co-residency is what makes the spin safe.
 * Then EVERY block of the channel runs the same fold function
 * (bn_stats_fold_sums / bn_grad_fold_sums: fixed order, threadIdx-only
 * roles), so all get the same f64 sums; part 0 alone writes the channel's
 * outputs (save_mean, save_invstd, running stats, num_batches_tracked;
 * dweight / dbias with beta), and every block writes y / dx over its own
 * part with the element-wise kernels' per-element arithmetic (bn_y_part,
 * bn_dx_part, shared with the one-pass kernels) from the f32 (mean,
 * invstd) / dx coefficients the finish would store (bn_stats_kept,
 * bn_grad_coef): the results equal the two-launch route's bitwise.  When
 * each part is one round of the walk (bf16/f16 vectors always: a part
 * holds at most 1024 of them; f32 vectors never, a multi-part channel's
 * part holds more than 4096 elements) y / dx are written from the vectors
 * the partial loaded, still in registers (bn_coop_held; LUCID_BN_HELD=0:
 * read again, as on the other paths).  The route is taken when
 * LUCID_BN_COOP is not "0" (read on each call, bn_coop_env), the device is
 * sm_90 or newer with cudaDevAttrCooperativeLaunch (bn_coop_device, asked
 * once per device), the counters exist (as for the last-block-folds route:
 * C <= LUCID_CUDA_NN_COUNTERS and not first requested inside a capture;
 * without them the fallback above) and a grid of one column of `parts`
 * blocks per channel is co-resident: at most
 * cudaOccupancyMaxActiveBlocksPerMultiprocessor times the SM count blocks
 * (bn_coop_cap; the occupancy asked once per kernel instantiation); else
 * the two-launch route, per call.  Rounds: when the full grid, parts x
 * min(C, 65535) blocks, exceeds that capacity, the grid gets fewer channel
 * columns gy (bn_coop_rounds: the fewest rounds ceil(min(C, 65535)/gy),
 * the columns spread evenly over them) and the block (part, y) takes part
 * `part` of the channels y, y+gy, ... in turn, through the kernels'
 * channel loop (the one that strides C > 65535; each channel has its own
 * counter and all its parts in one column, so the barrier is per channel
 * as before).  The partition does not change, nor any value a block
 * computes for a channel: the results equal the full grid's and the
 * two-launch route's bitwise, whatever the device.  LUCID_BN_COOP_LOOP=0
 * (read on each call, bn_coop_round_limit) keeps one round: the full grid
 * or the two-launch route.  A larger cooperative grid is refused by the
 * driver with cudaErrorCooperativeLaunchTooLarge, it never deadlocks:
 * should the driver refuse one that bn_coop_cap allowed, fewer SMs being
 * available than the device has (MPS, green contexts), the kernel is
 * marked unfit and the call goes on with the next one or the two-launch
 * route, bn_coop_refused.  The candidate kernels, in order: the held one,
 * then the one reading x / dy again; the backward's vector-dx ones each
 * uncapped, then as a lean copy compiled for BN_COOP_LEAN blocks per SM
 * (at most 64 registers, some spills).  The choice (bn_coop_sel,
 * bn_coop_choose): the candidate needing the fewest rounds, the first in
 * order among equals; so when one fits with every column (1 round), the
 * first such one, as before the rounds existed.
 * Registers (nvcc 13.0, sm_90; 65536 per SM, allocated per warp in units
 * of 256): forward bf16/f16 held 62 (4 blocks per SM), reading x again 48
 * (plain, 5 per SM) / 58 (SiLU, 4); f32 (never held) 48 / 56; backward
 * held 100 (2 per SM), vector dx reading again 102-107, the lean copies 64 (4 per
 * SM) with 4 (plain held) to 152 bytes of spills per thread.  So on 132
 * SMs (H200), N=4: 64x80x80 (4 parts, 256 blocks) and 32x160x160 (16
 * parts, 512 blocks; backward: the lean copy) take one launch per
 * direction with every column; 16x320x320 (layer 0: 52 parts, 832 blocks,
 * 7 blocks per SM would need at most 32 registers) takes one launch per
 * direction in 2 rounds of 8 columns (416 blocks; forward: the held
 * kernel; backward: the held lean copy), where it took two launches per
 * direction before.  Measured: not yet measured.
 * Concurrency: the CUDA documentation states the grid-size limit and that
 * every block of a cooperative grid can eventually observe the others'
 * execution (cudaLaunchCooperativeKernel; CCCL cuda::experimental::
 * cooperative_launch: "restricted to a number of blocks that can
 * simultaneously execute on the device"); it says nothing explicit about
 * kernels of other streams (the parameter-gradient and branch lanes) that
 * occupy SMs when the cooperative grid starts.  The limit is checked
 * against the whole device, so such a grid may have to wait for the other
 * streams' resident blocks to drain before it is scheduled (a delay, not
 * a deadlock, as far as the documented guarantee goes).  With PDL (eager
 * launches) the grid may be scheduled while its predecessor runs; every
 * block waits in lucid_pdl_wait before it touches memory, and the next
 * grid is scheduled only after all of this grid's blocks ran
 * lucid_pdl_launch_dependents, i.e. once all are resident, so it cannot
 * keep any of them from becoming resident.  Each stream (lane) has its own
 * counters (lane.cu), so two cooperative grids never share one.
 *
 * Clusters (parts > 1, sm_90+).  Before the cooperative kernels, the
 * training forward and the training backward with dx of a channel of 2..128
 * parts run as one launch each on thread-block clusters (CUDA Programming
 * Guide, "Thread Block Clusters", "Distributed Shared Memory"):
 * bn_stats_apply_clu (nn_norm_fwd.cu) and bn_grad_dx_clu (nn_norm_bwd.cu)
 * on the grid (cs, gy) with clusters (cs, 1, 1), queued with
 * lucid_launch_cluster (launch.cuh; the attribute is kept by graph
 * capture).  The cs blocks of one cluster are one grid row and share its
 * channels (y, y + gy, ...: the channel loop of the other kernels; gy =
 * min(C, 65535), bn_clu_columns); the block of cluster rank r computes the
 * partials of parts r, r + cs, r + 2cs, ... exactly as the partial kernels
 * (the same partition, walk, vectors and tree; each part's partial kept
 * apart, in slot part / cs of a shared array), then, after the cluster
 * barrier (barrier.cluster arrive.release / wait.acquire), EVERY block folds
 * the channel's partials, read in part order from the shared memory of the
 * blocks holding them (bn_clu_parts: part i in rank i % cs), with the fold
 * of the other routes (bn_stats_fold_by / bn_grad_fold_by, the loader being
 * the only difference: the same f64 sums in every block), rank 0 finishes
 * the channel (statistics, running stats, num_batches_tracked; dweight /
 * dbias with beta) as the cooperative kernels' part 0 does, and every block
 * writes y / dx over its own parts with the element-wise kernels'
 * per-element arithmetic (bn_y_part, bn_dx_part): every output equals the
 * two-launch route's bitwise.  With one part per block (cs == parts) and
 * that part one round of the walk (bn_coop_held) y / dx are written from
 * the vectors still in registers; else x / dy are read again.  Shared
 * memory lifetime: two partial buffers used in turn by the channel loop
 * (a block overwrites one only after the next channel's barrier, which its
 * peers reach after reading it), and after the last channel each block
 * arrives once its reads are done and waits before it exits.  No global
 * scratch, no counters, no spin: the hardware co-schedules a cluster's
 * blocks on one GPU processing cluster, so nothing needs the whole grid
 * resident, whatever else runs on the device.
 * Cluster size (bn_clu_size): the fewest rounds (parts per block) with at
 * most 16 blocks, rounds = ceil(parts / 16), and the parts spread evenly,
 * cs = ceil(parts / rounds): at N=4, 640 px: 80x80 (4 parts) 4 blocks,
 * 160x160 (16) 16 blocks of one part each (held registers), 320x320 (layer
 * 0, 52) 13 blocks of 4 parts.  A block's parts run one after the other,
 * so the rounds set the kernel's length; among the sizes of that many
 * rounds the smallest leaves the most room on the GPC.  Sizes above 8 are
 * not portable: the kernel's cudaFuncAttributeNonPortableClusterSizeAllowed
 * is set, and cudaOccupancyMaxActiveClusters must find at least one such
 * cluster resident (bn_clu_fits, asked once per kernel and size, never
 * first inside a capture: the eager warm-up asks); else the portable
 * rule's size (at most 8 blocks, e.g. layer 0: 7 rounds of 8) is tried,
 * and when neither runs, or a channel has more than 8 rounds' worth of
 * parts (more than 128), the cooperative / two-launch routes as before.
 * Limits: 8 slots of partials per block (2 x 8 x 12 bytes forward, 2 x 8 x
 * 8 backward), BN_THREADS threads, no dynamic shared memory.  Registers
 * (nvcc 13.0, sm_90): forward 42-64 (held bf16: 64, 4 blocks per SM),
 * backward 56-116 (plain held 72, SiLU held 99-116: 2 per SM), no spills.
 * Switch: LUCID_BN_CLUSTER, read once per process (lucid_cuda_bn_cluster_
 * switch: "1" on; unset, "" or "0" off: the cooperative and two-launch
 * routes; anything else ERR_ARG; opt-in since the H200 measured it slower,
 * session 13 call 3), overridden per context by
 * lucid_cuda_nn_set_bn_cluster (0 follow the switch, 1 off, 2 on); taken
 * only on devices of compute capability 9.0+ with cudaDevAttrClusterLaunch
 * (bn_cluster_device).  Test hooks (nn_norm_fwd.cu):
 * lucid_cuda_bn_cluster_count, lucid_cuda_bn_cluster_last_grid (cluster
 * size, columns), lucid_cuda_bn_cluster_sm_count, and
 * lucid_cuda_bn_cluster_cap_columns (fewer columns: the channel loop on
 * small tensors).  Measured (H200, session 13 call 3, CUPTI per call on the
 * recorded step's path): slower than the cooperative kernels, e.g. backward
 * 4 parts x 64 channels 22.5 us against ~13, 16 x 32 33.1 against ~18,
 * layer 0 71.8 against 46 for the two launches; one default fit 3.667 /
 * 3.674 ms on against 3.545 off.  Hence opt-in.
 *
 * Fused BatchNorm2d + SiLU (lucid_cuda_batchnorm2d_silu_*): the same
 * launches with the SiLU inside (forward: nn_norm_fwd.cu, backward:
 * nn_norm_bwd.cu).  The partition and the folding order are those of the
 * plain kernels, so the fused results are as deterministic.
 *
 * Every kernel starts with lucid_pdl_wait(); lucid_pdl_launch_dependents();
 * (in every thread, before any early return) and is queued with
 * lucid_launch() (launch.cuh: programmatic dependent launch: a kernel may
 * be scheduled before its predecessor ends, and waits for it before
 * touching memory), the cooperative kernels with lucid_launch_coop(), the
 * cluster kernels with lucid_launch_cluster().
 * Source: PyTorch nn.BatchNorm2d docs; Chan, Golub, LeVeque (1979); nn.SiLU
 * docs.
 */
#ifndef LUCID_CUDA_NN_NORM_CUH
#define LUCID_CUDA_NN_NORM_CUH

#include "nn_common.cuh"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>

#define BN_THREADS 256 /* every BN kernel except bn_stats_eval */
#define BN_PART 8192   /* elements per part (at most) of the reductions */
#define BN_UNROLL 4    /* vectors a thread loads before it uses them */
#define BN_WAVE 4      /* element-wise grids: at most this many blocks per SM */
#define BN_COOP_LEAN 4 /* blocks per SM the lean cooperative backward asks for */

#define BN_UNROLL_2L 2 /* bn_unroll's default (DECISIONS 46) */

/* Host: how many vectors a thread of the two-launch route's kernels (the
 * partial sums bn_stats_partial / bn_grad_partial and the element-wise
 * bn_apply / bn_dx, vector path) loads before it uses them: LUCID_BN_UNROLL
 * = 1, 2 or 4 (read once; default BN_UNROLL_2L; another value keeps the
 * default). The one-pass, cooperative and cluster kernels keep BN_UNROLL
 * (their held registers are sized by it). The bits do not depend on it: a
 * thread's vectors are the walk positions j, j + BN_THREADS, ... whatever
 * the unroll, summed in that order, and the element-wise kernels compute
 * each element alone (spec/bn_unroll_gpu_spec.lua). What it changes is
 * registers, hence blocks per SM (nvcc 13.0, sm_90, bf16 with SiLU):
 * bn_grad_partial 79 / 64 / 48 registers at 4 / 2 / 1, bn_dx 107 / 64 / 48
 * (at 4: 3 and 2 blocks of 256 threads per SM; layer 0's 832-block partial
 * grid ran in 3 waves on 132 SMs). bn_grad_partial without x (the conv bias
 * gradient's per-channel sum, lucid_cuda_nn_channel_sum) follows it too. */
inline int bn_unroll(void) { /* inline, not static: one cache per process */
    static int u = -1;
    int v = lucid_env_int("LUCID_BN_UNROLL", 1, 4, BN_UNROLL_2L, &u);
    return v == 3 ? BN_UNROLL_2L : v;
}

/* Host: of a kernel's instances for unroll 1, 2 and 4, the one bn_unroll
 * picks (the launch sites of the four two-launch kernels). */
template <typename K> static inline K bn_by_unroll(K k1, K k2, K k4) {
    const int u = bn_unroll();
    return u == 1 ? k1 : u == 2 ? k2 : k4;
}

// ----------------------------------------------------------------------------
// vectors of V elements (one 16-byte access when V*sizeof(T) == 16)

template <int BYTES> struct bn_raw;
template <> struct bn_raw<16> { typedef uint4 type; };
template <> struct bn_raw<4> { typedef unsigned int type; };
template <> struct bn_raw<2> { typedef unsigned short type; };

/* V elements of type T at p (aligned to V*sizeof(T)) as one raw word, and
 * back; unpack/pack convert to/from f32 (one rounding per element on pack,
 * that of lucid_elem). */
template <typename T, int V> struct bn_vec {
    typedef typename bn_raw<V * (int)sizeof(T)>::type R;
    static __device__ __forceinline__ R load(const T *p) {
        return *reinterpret_cast<const R *>(p);
    }
    static __device__ __forceinline__ void store(T *p, R r) {
        *reinterpret_cast<R *>(p) = r;
    }
    static __device__ __forceinline__ void unpack(const R &r, float *f) {
        T e[V];
        memcpy(e, &r, sizeof r); /* register moves */
#pragma unroll
        for (int k = 0; k < V; k++) f[k] = lucid_elem<T>::load(e, k);
    }
    static __device__ __forceinline__ R pack(const float *f) {
        T e[V];
#pragma unroll
        for (int k = 0; k < V; k++) lucid_elem<T>::store(e, k, f[k]);
        R r;
        memcpy(&r, e, sizeof r); /* register moves */
        return r;
    }
};

/* The vector width of the vector path for T: 16 bytes. */
template <typename T> struct bn_width { static const int V = 16 / (int)sizeof(T); };

static inline bool bn_aligned16(const void *p) {
    return p == NULL || ((uintptr_t)p & 15u) == 0;
}

/* Host: whether the vector path applies (S a multiple of the vector width,
 * every given pointer 16-byte aligned). */
static bool bn_use_vec(lucid_dtype dt, int64_t S, const void *a, const void *b,
                       const void *c) {
    int64_t V = 16 / (int64_t)lucid_dtype_size(dt);
    return V > 1 && S % V == 0 && bn_aligned16(a) && bn_aligned16(b) && bn_aligned16(c);
}

// ----------------------------------------------------------------------------
// geometry of the fixed partition (see the header)

typedef struct bn_geom {
    int64_t N, C, S;
    int64_t CS;    /* C*S: elements between two planes of one channel */
    int64_t chunk; /* plane elements per part (S when planes are whole) */
    int64_t P;     /* parts per plane (chunks) */
    int64_t pp;    /* whole planes per part (1 when P > 1) */
    int64_t parts; /* per channel: ceil(N/pp) * P */
} bn_geom;

static bn_geom bn_geom_of(int64_t N, int64_t C, int64_t S) {
    bn_geom g;
    g.N = N; g.C = C; g.S = S;
    g.CS = C * S;
    if (S >= BN_PART) {
        int64_t p0 = (S + BN_PART - 1) / BN_PART;
        int64_t ch = (S + p0 - 1) / p0;
        g.chunk = (ch + 7) / 8 * 8; /* <= BN_PART (a multiple of 8) */
        g.P = (S + g.chunk - 1) / g.chunk;
        g.pp = 1;
    } else {
        g.chunk = S > 0 ? S : 1;
        g.P = 1;
        g.pp = BN_PART / g.chunk;
        if (g.pp > N) g.pp = N > 0 ? N : 1;
    }
    g.parts = (N + g.pp - 1) / g.pp * g.P;
    if (g.parts < 1) g.parts = 1;
    return g;
}

/* Whether a one-part channel of g is one round of the walk with V-element
 * vectors (at most BN_THREADS*BN_UNROLL vectors): the one-pass kernels then
 * keep the vectors they loaded for the statistics / gradient sums in
 * registers and write y / dx from them (LUCID_BN_HELD=0, read on each
 * call: read x and dy again, as before; same bits either way). */
static inline bool bn_held(const bn_geom &g, int64_t V) {
    const char *e = getenv("LUCID_BN_HELD");
    if (e && strcmp(e, "0") == 0) return false;
    return g.parts == 1 && g.N * g.S / V <= (int64_t)BN_THREADS * BN_UNROLL;
}

/* Whether the parts of a multi-part channel of g are each one round of the
 * walk with V-element vectors (part 0, the largest, at most
 * BN_THREADS*BN_UNROLL vectors): the cooperative kernels then write y / dx
 * from the vectors their partial loaded, still in registers
 * (LUCID_BN_HELD=0, read on each call: read x and dy again; same bits
 * either way).  bf16/f16 vectors always are (a part holds at most BN_PART
 * elements: 1024 vectors of 8); f32 vectors never are (a part of a
 * multi-part channel holds more than 4096 elements), nor scalars. */
static inline bool bn_coop_held(const bn_geom &g, int64_t V) {
    const char *e = getenv("LUCID_BN_HELD");
    if (e && strcmp(e, "0") == 0) return false;
    int64_t npl = g.N < g.pp ? g.N : g.pp, len = g.S < g.chunk ? g.S : g.chunk;
    return npl * (len / V) <= (int64_t)BN_THREADS * BN_UNROLL;
}

static inline unsigned bn_grid_y(int64_t C) {
    return (unsigned)(C < 65535 ? C : 65535);
}

/* One part as a block walks it (V elements per vector): the part's first
 * element (channel 0's coordinates; add c*S), its planes of lenv vectors,
 * and BN_THREADS = sq*lenv + sr for the walk's stride.  Every quantity but
 * base is below BN_PART. */
typedef struct bn_part {
    int64_t base;
    unsigned lenv, total, sq, sr;
} bn_part;

template <int V>
static __device__ __forceinline__ bn_part bn_part_of(const bn_geom &g, int64_t part) {
    int64_t gi = part / g.P, p = part - gi * g.P;
    int64_t n0 = gi * g.pp, s0 = p * g.chunk;
    int64_t npl = g.N - n0 < g.pp ? g.N - n0 : g.pp;
    int64_t len = g.S - s0 < g.chunk ? g.S - s0 : g.chunk;
    bn_part r;
    r.base = n0 * g.CS + s0;
    r.lenv = (unsigned)(len / V);
    r.total = (unsigned)npl * r.lenv;
    r.sq = BN_THREADS / r.lenv;
    r.sr = BN_THREADS - r.sq * r.lenv;
    return r;
}

/* A thread's position in its part's walk: vector j of the part lies in the
 * part's plane q at vector offset off (j = q*lenv + off); next() moves to
 * j + BN_THREADS with adds and one compare. */
typedef struct bn_walk {
    unsigned j, q, off;
} bn_walk;

static __device__ __forceinline__ bn_walk bn_walk_first(const bn_part &pt) {
    bn_walk w;
    w.j = threadIdx.x;
    w.q = w.j / pt.lenv;
    w.off = w.j - w.q * pt.lenv;
    return w;
}

static __device__ __forceinline__ void bn_walk_next(bn_walk &w, const bn_part &pt) {
    w.j += BN_THREADS;
    w.q += pt.sq;
    w.off += pt.sr;
    if (w.off >= pt.lenv) {
        w.off -= pt.lenv;
        w.q += 1;
    }
}

/* Element offset of the walk's vector from the part's first element. */
template <int V>
static __device__ __forceinline__ int64_t bn_walk_elem(const bn_walk &w, int64_t CS) {
    return (int64_t)w.q * CS + (int64_t)w.off * V;
}

/* The flat walk of the element-wise kernels over nv = N*C*S/V vectors
 * (I: uint32_t or uint64_t): grid stride G = gq*Sv + gr, gc = gq % C. */
template <typename I> struct bn_flat {
    I nv, Sv, C, G, gr, gc;
};

template <typename I>
static bn_flat<I> bn_flat_of(int64_t NCS, int64_t C, int64_t S, int V, unsigned grid) {
    bn_flat<I> f;
    int64_t Sv = S / V, G = (int64_t)grid * BN_THREADS;
    f.nv = (I)(NCS / V);
    f.Sv = (I)Sv;
    f.C = (I)C;
    f.G = (I)G;
    f.gr = (I)(G % Sv);
    f.gc = (I)((G / Sv) % C);
    return f;
}

/* A thread's vector j, its offset in its plane (vectors) and its channel. */
template <typename I> struct bn_at {
    I j, off, c;
};

template <typename I>
static __device__ __forceinline__ bn_at<I> bn_at_first(const bn_flat<I> &f) {
    bn_at<I> a;
    a.j = (I)blockIdx.x * BN_THREADS + (I)threadIdx.x;
    I pl = a.j / f.Sv;
    a.off = a.j - pl * f.Sv;
    a.c = pl % f.C;
    return a;
}

/* j += G: off += gr with a carry into the plane, the plane's channel
 * c + gc + carry < 2C wrapped once. */
template <typename I>
static __device__ __forceinline__ void bn_at_next(bn_at<I> &a, const bn_flat<I> &f) {
    a.j += f.G;
    a.off += f.gr;
    a.c += f.gc;
    if (a.off >= f.Sv) {
        a.off -= f.Sv;
        a.c += 1;
    }
    if (a.c >= f.C) a.c -= f.C;
}

/* Host: blocks of an element-wise kernel over nv vectors: one vector per
 * thread, at most BN_WAVE blocks per SM (then each thread loops). */
static unsigned bn_flat_grid(int64_t nv, int sm_count) {
    int64_t b = (nv + BN_THREADS - 1) / BN_THREADS;
    int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 132) * BN_WAVE;
    if (b > cap) b = cap;
    if (b < 1) b = 1;
    return (unsigned)b;
}

/* Routes of the element-wise kernels. */
enum { BN_ROUTE_VEC = 0, BN_ROUTE_SCALAR = 1, BN_ROUTE_WIDE = 2 };

static int bn_route(lucid_dtype dt, int64_t NCS, int64_t S, const void *a, const void *b,
                    const void *c) {
    if (NCS > (int64_t)INT32_MAX) return BN_ROUTE_WIDE;
    return bn_use_vec(dt, S, a, b, c) ? BN_ROUTE_VEC : BN_ROUTE_SCALAR;
}

/* Channel c's affine map z = fmaf(x, sc, sh) (sc = w*invstd,
 * sh = b - mean*sc; w/b NULL: 1/0): one source expression for every kernel,
 * so the fused backward recomputes the forward's z from the same f32
 * statistics. */
static __device__ __forceinline__ void bn_affine_of(float mean, float invstd, float wc,
                                                    float bc, float *sc, float *sh) {
    float k = wc * invstd;
    *sc = k;
    *sh = bc - mean * k;
}

static __device__ __forceinline__ void bn_affine(int64_t c, const float *mean,
                                                 const float *invstd,
                                                 const float *w, const float *b,
                                                 float *sc, float *sh) {
    float wc = w ? w[c] : 1.0f, is = invstd[c], bc = b ? b[c] : 0.0f;
    bn_affine_of(mean[c], is, wc, bc, sc, sh);
}

// ----------------------------------------------------------------------------
// block reductions and the last block folds

/* Sums of v[0..K) over the block in a fixed order (blockDim.x ==
 * BN_THREADS): shuffle-down tree inside each warp, then (when more than
 * warp 0 holds values: nvals > 32 values were spread over the threads as
 * t, t+BN_THREADS, ...) warp 0 over the warp results.  Every thread calls
 * it (block-uniform nvals); valid in thread 0.  sh: [K][32] of the caller,
 * free for this call. */
template <int K>
static __device__ __forceinline__ void bn_block_sum64(double (&v)[K], int64_t nvals,
                                                      double (*sh)[32]) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int k = 0; k < K; k++) v[k] += __shfl_down_sync(0xffffffffu, v[k], o);
    if (nvals <= 32) return; /* warps 1.. held nothing */
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0)
#pragma unroll
        for (int k = 0; k < K; k++) sh[k][wid] = v[k];
    __syncthreads();
    if (wid == 0) {
#pragma unroll
        for (int k = 0; k < K; k++) v[k] = lane < BN_THREADS / 32 ? sh[k][lane] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int k = 0; k < K; k++) v[k] += __shfl_down_sync(0xffffffffu, v[k], o);
    }
}

/* Arrival of this block at channel c's counter, after thread 0 stored the
 * block's partial for c; every thread of the block calls it (it has a
 * barrier).  Thread 0 makes the partial visible device-wide
 * (__threadfence), counts the arrival, and if it is the last of the `parts`
 * blocks of channel c, sets the counter back to 0 (the next launch, or
 * graph replay, starts from zero: nothing else touches it in this launch,
 * every block arrives exactly once per channel) and fences again so the
 * block's loads of the other partials come after their stores.  Returns,
 * in every thread, whether this block is the last one; *last is a
 * __shared__ int of the caller (read back after the barrier, rewritten only
 * after the caller's next barrier). */
static __device__ __forceinline__ bool bn_arrive(unsigned int *count, int64_t parts,
                                                 int *last) {
    if (threadIdx.x == 0) {
        __threadfence();
        unsigned int prev = atomicAdd(count, 1u);
        int am = prev == (unsigned int)(parts - 1);
        if (am) {
            *count = 0u;
            __threadfence();
        }
        *last = am;
    }
    __syncthreads();
    return *last != 0;
}

/* The channel barrier of the cooperative kernels (all blocks of the grid
 * resident at once, so a block may wait for the others): every thread of
 * the block calls it after thread 0 stored the block's partial for channel
 * c.  Thread 0 makes the partial visible device-wide (__threadfence),
 * arrives (atomicAdd on channel c's counter, zero at the kernel's start),
 * spins until all `parts` blocks of the channel arrived (volatile loads: the
 * other blocks' atomics), fences again so the block's loads of the partials
 * come after their stores, and departs (a second atomicAdd); the block that
 * departs last (sees 2*parts-1: every block of the channel has left the
 * spin) sets the counter back to 0, so the next launch or graph replay, and
 * the "last block folds" kernels sharing the counters, start from zero.  A
 * spinning block only reads the counter while it is below parts, and it
 * stays at parts or more until the last departure, so no block can miss
 * its release.  The barrier after it gives every thread the partials. */
static __device__ __forceinline__ void bn_coop_wait(unsigned int *count, int64_t parts) {
    if (threadIdx.x == 0) {
        const unsigned int n = (unsigned int)parts;
        const volatile unsigned int *seen = count;
        __threadfence();
        atomicAdd(count, 1u);
        while (*seen < n) {
        }
        __threadfence();
        if (atomicAdd(count, 1u) == 2u * n - 1u) *count = 0u;
    }
    __syncthreads();
}

// ----------------------------------------------------------------------------
// host switches and test counters

/* LUCID_BN_ONEPASS, read on each call: "0" = the two-launch route for
 * channels of one part; unset or anything else = the one-pass kernels. */
static bool bn_onepass(void) {
    const char *e = getenv("LUCID_BN_ONEPASS");
    return !(e && strcmp(e, "0") == 0);
}

/* LUCID_BN_COOP, read on each call: "1" = the cooperative kernels for
 * channels of several parts where the device has cooperative launch and is
 * sm_90 or newer (bn_coop_device) and a grid of them is co-resident
 * (bn_coop_choose); unset or anything else = the two-launch route (opt-in
 * since session 13: in three same-call pairs of one recorded fit each on
 * the H200 the two-launch route's steady step was the shorter, 3.562 /
 * 3.529 / 3.409 ms against 3.624 / 3.682 / 3.474 with the cooperative
 * kernels, whose channel barrier spins while the parameter-gradient lanes
 * share the SMs; same bits either way). */
static bool bn_coop_env(void) {
    const char *e = getenv("LUCID_BN_COOP");
    return e && strcmp(e, "1") == 0;
}

/* Host: whether device (a CUDA ordinal) takes the cooperative kernels:
 * compute capability 9.0 or newer and cudaDevAttrCooperativeLaunch.  Asked
 * once per ordinal (below 64; others are asked on each call); an error of
 * the query counts as no (and is cleared). */
static bool bn_coop_device(int device) {
    static std::atomic<int> known[64]; /* 0 unknown, 1 yes, 2 no */
    if (device >= 0 && device < 64) {
        int k = known[device].load(std::memory_order_relaxed);
        if (k != 0) return k == 1;
    }
    int major = 0, coop = 0;
    bool yes = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
                   cudaSuccess &&
               cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device) ==
                   cudaSuccess &&
               major >= 9 && coop != 0;
    if (!yes) (void)cudaGetLastError();
    if (device >= 0 && device < 64) known[device].store(yes ? 1 : 2, std::memory_order_relaxed);
    return yes;
}

/* LUCID_BN_COOP_LOOP, read on each call: "1" = when the cooperative grid
 * of one column of blocks per channel is not co-resident, fewer columns,
 * each block looping over the channels of its column (bn_coop_rounds);
 * unset or anything else (default) = one column per channel: the whole
 * grid co-resident or the two-launch route, as before the loop existed.
 * Opt-in since H200 call 4 of session 12: test_nn_bnsilu_cuda's
 * "bn+silu 300x2x64x72 bf16: train dweight = separate" failed once on the
 * rounds route (600 blocks, 2 rounds; dweight of channel 0 off by 4%)
 * after passing in call 3: an open defect, not found yet.  Returns the
 * rounds a cooperative block may run: 1, or no limit (INT64_MAX). */
static int64_t bn_coop_round_limit(void) {
    const char *e = getenv("LUCID_BN_COOP_LOOP");
    return e && strcmp(e, "1") == 0 ? INT64_MAX : 1;
}

/* Host: the co-resident capacity of kernel on a device of sm_count
 * multiprocessors: cudaOccupancyMaxActiveBlocksPerMultiprocessor (BN_THREADS
 * threads, no dynamic shared memory) * sm_count, the most blocks a
 * cooperative launch of it may have (CUDA Runtime API,
 * cudaLaunchCooperativeKernel).  *per_sm caches the kernel's occupancy (one
 * cache per kernel instantiation, the caller's static; -1: not asked yet;
 * 0: refused, bn_coop_refused; the devices of a process are assumed of one
 * generation, as for PDL).  *cap: blocks (0 when sm_count <= 0).  Returns
 * the query's error (cleared from cudaGetLastError; *cap 0). */
static cudaError_t bn_coop_cap(const void *kernel, std::atomic<int> *per_sm, int sm_count,
                               int64_t *cap) {
    *cap = 0;
    int n = per_sm->load(std::memory_order_relaxed);
    if (n < 0) {
        cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, BN_THREADS, 0);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return e;
        }
        per_sm->store(n, std::memory_order_relaxed);
    }
    *cap = sm_count > 0 ? (int64_t)n * sm_count : 0;
    return cudaSuccess;
}

/* Host: the shape of a cooperative grid of `parts` blocks per channel
 * (grid.x) over cy channels (min(C, 65535), grid.y of the two-launch
 * route) when at most cap blocks are co-resident.  The grid has gy <= cy
 * columns; the block (part, y) takes part `part` of the channels y, y+gy,
 * y+2gy, ... in turn (the kernels' channel loop, the one that strides
 * C > 65535), so each block runs ceil(cy/gy) rounds, one channel each.
 * Fewest rounds: cols = floor(cap/parts) columns fit, rounds =
 * ceil(cy/cols), and the columns are spread evenly over the rounds: gy =
 * ceil(cy/rounds) <= cols (e.g. 52 parts, 16 channels, cap 528: cols 10,
 * 2 rounds of 8 columns, 416 blocks, rather than 10 columns of which 6 run
 * a second round while 4 sit idle).  rounds 1: gy = cy, the full grid.  Returns
 * the rounds (at least 1) and *gy, or 0 when one column (parts blocks)
 * exceeds cap.  A function of (parts, cy, cap) only; the partition, the
 * partials and every value the kernels compute do not depend on gy (a
 * block's work for channel c is the same in any round), so the results
 * are those of the full grid and of the two-launch route bitwise. */
static int64_t bn_coop_rounds(int64_t parts, int64_t cy, int64_t cap, unsigned *gy) {
    *gy = 0;
    if (parts < 1 || cy < 1 || cap < parts) return 0;
    int64_t cols = cap / parts;
    int64_t rounds = (cy + cols - 1) / cols;
    *gy = (unsigned)((cy + rounds - 1) / rounds);
    return (cy + *gy - 1) / *gy;
}

/* Host: the choice of one direction's cooperative kernel among its
 * candidates (the variant with held vectors, then the one reading x / dy
 * again; the backward's vector-dx ones each uncapped, then lean), visited
 * in that fixed order twice (bn_coop_choose): a probe pass recording the
 * fewest rounds any candidate needs (bn_coop_rounds with its capacity, at
 * most `limit`, bn_coop_round_limit), then a launch pass queuing the first
 * candidate that needs that many (bn_coop_visit).  When a candidate fits
 * with one column per channel (1 round) that is the first such one in the
 * order: the choice made before the loop existed.  The choice depends on
 * (parts, C, the device's SM count and the kernels' occupancy) and the
 * switches only, so eager calls and captured graphs make the same one. */
typedef struct bn_coop_sel {
    int64_t parts;    /* blocks per channel (grid.x) */
    int64_t cy;       /* channel columns of the full grid: min(C, 65535) */
    int sm_count;     /* the stream's device's multiprocessors */
    int64_t limit;    /* rounds allowed (probe); the fewest found (launch) */
    bool probe;       /* probe pass: record, never launch */
    int64_t best;     /* fewest rounds of the probe (0: no candidate fits) */
    bool launched;    /* a candidate was queued (the launch pass) */
    dim3 grid;        /* its grid (parts, gy) */
} bn_coop_sel;

/* Host: a fresh choice for the multi-part channels of g. */
static bn_coop_sel bn_coop_sel_of(const bn_geom &g, int sm_count) {
    bn_coop_sel s;
    s.parts = g.parts;
    s.cy = (int64_t)bn_grid_y(g.C);
    s.sm_count = sm_count;
    s.limit = bn_coop_round_limit();
    s.probe = true;
    s.best = 0;
    s.launched = false;
    s.grid = dim3(1, 1, 1);
    return s;
}

/* Host: one candidate kernel of s (per_sm: its occupancy cache).  Probe
 * pass: its rounds (when 1..limit) folded into s->best; *go false.  Launch
 * pass: *go whether to queue it (its rounds at most s->limit, the fewest
 * found), on *grid = (parts, gy).  Returns the occupancy query's error. */
static cudaError_t bn_coop_visit(const void *kernel, std::atomic<int> *per_sm, bn_coop_sel *s,
                                 dim3 *grid, bool *go) {
    *go = false;
    int64_t cap = 0;
    cudaError_t e = bn_coop_cap(kernel, per_sm, s->sm_count, &cap);
    if (e != cudaSuccess) return e;
    unsigned gy = 0;
    int64_t r = bn_coop_rounds(s->parts, s->cy, cap, &gy);
    if (r < 1 || r > s->limit) return cudaSuccess;
    if (s->probe) {
        if (s->best == 0 || r < s->best) s->best = r;
        return cudaSuccess;
    }
    *grid = dim3((unsigned)s->parts, gy, 1);
    *go = true;
    return cudaSuccess;
}

/* Host: both passes of s over the candidates; visit_all() visits them in
 * order (each with bn_coop_visit; a launched one ends the launch pass) and
 * returns the first error.  s->launched: whether one was queued. */
template <typename F>
static cudaError_t bn_coop_choose(bn_coop_sel *s, F visit_all) {
    s->probe = true;
    s->best = 0;
    s->launched = false;
    cudaError_t e = visit_all();
    if (e != cudaSuccess || s->best == 0) return e;
    s->probe = false;
    s->limit = s->best;
    return visit_all();
}

/* Host: whether a cooperative launch returned e ==
 * cudaErrorCooperativeLaunchTooLarge: the device runs fewer blocks at once
 * than bn_coop_cap counted (e.g. an MPS or green-context share of its
 * SMs).  Then the error is cleared, the kernel's cache set to 0 (never
 * tried again in this process) and the launch pass goes on with the next
 * candidate that needs as few rounds, else the call takes the two-launch
 * route; the next call's probe no longer counts the refused kernel
 * (outside a capture: the eager warm-up meets it first). */
static bool bn_coop_refused(cudaError_t e, std::atomic<int> *per_sm) {
    if (e != cudaErrorCooperativeLaunchTooLarge) return false;
    (void)cudaGetLastError();
    per_sm->store(0, std::memory_order_relaxed);
    return true;
}

/* Host: after the launch pass queued a candidate of s on grid (e: the
 * launch's status; per_sm: the candidate's occupancy cache): s->launched
 * and s->grid, unless the driver refused the grid for size
 * (bn_coop_refused: the pass goes on with the next candidate).  Any other
 * error counts as launched and is left for CUDA_CHECK_LAUNCH (the launch
 * also set cudaGetLastError). */
static void bn_coop_queued(bn_coop_sel *s, cudaError_t e, std::atomic<int> *per_sm, dim3 grid) {
    if (bn_coop_refused(e, per_sm)) return;
    s->launched = true;
    s->grid = grid;
}

/* Kernels queued by this thread's BatchNorm forward / backward calls so far
 * (not the conv bias sum): the test hook lucid_cuda_bn_launch_count
 * (nn_common.cuh); nothing here reads it.  Defined in nn_norm_fwd.cu. */
extern thread_local unsigned long lucid_cuda_bn_launches;

/* Of those, the element-wise launches (bn_apply, bn_dx) that took
 * BN_ROUTE_WIDE (N*C*S > INT32_MAX): the test hook lucid_cuda_bn_wide_count
 * (spec/c/test_nn_cuda.c checks that its huge-tensor case takes the 64-bit
 * route); nothing here reads it.  Defined in nn_norm_fwd.cu. */
extern thread_local unsigned long lucid_cuda_bn_wide_launches;
extern "C" unsigned long lucid_cuda_bn_wide_count(void);

/* Of those, the cooperative launches (bn_stats_apply_coop,
 * bn_grad_dx_coop): the test hook lucid_cuda_bn_coop_count (a test learns
 * whether a call took the one-launch route of multi-part channels, which
 * depends on the device's occupancy); nothing here reads it.  Defined in
 * nn_norm_fwd.cu. */
extern thread_local unsigned long lucid_cuda_bn_coop_launches;
extern "C" unsigned long lucid_cuda_bn_coop_count(void);
extern "C" int lucid_cuda_bn_coop_sm_count(void);

/* The grid (parts, gy) of this thread's last cooperative launch (0 x 0
 * before the first; bn_coop_note): the test hook
 * lucid_cuda_bn_coop_last_grid (a test learns how many channel columns,
 * hence rounds, bn_coop_rounds chose); nothing here reads it.  Defined in
 * nn_norm_fwd.cu. */
extern thread_local unsigned lucid_cuda_bn_coop_gx, lucid_cuda_bn_coop_gy;
extern "C" void lucid_cuda_bn_coop_last_grid(unsigned *gx, unsigned *gy);

/* Host: count a cooperative launch of s (s->launched) in the test hooks. */
static inline void bn_coop_note(const bn_coop_sel &s) {
    lucid_cuda_bn_launches += 1;
    lucid_cuda_bn_coop_launches += 1;
    lucid_cuda_bn_coop_gx = s.grid.x;
    lucid_cuda_bn_coop_gy = s.grid.y;
}

// ----------------------------------------------------------------------------
// thread-block clusters (parts > 1, LUCID_BN_CLUSTER; see the header)

/* The largest cluster tried (non-portable on sm_90: needs
 * cudaFuncAttributeNonPortableClusterSizeAllowed), the portable one, and
 * the most parts one block of a cluster computes (its partials' slots in
 * shared memory, two buffers of them). */
#define BN_CLU_MAX 16
#define BN_CLU_PORTABLE 8
#define BN_CLU_ROUNDS 8

/* Device: the cluster barrier, split (arrive, then wait) or whole; arrive
 * has release and wait acquire semantics at cluster scope (PTX
 * barrier.cluster), so what a block stored in its shared memory before it
 * arrived is seen by every block of the cluster after its wait.  Every
 * thread of every block of the cluster calls them, arrive and wait in
 * turn.  bn_clu_peer: the address of ptr (this block's shared memory) in
 * the block of cluster rank `rank` (distributed shared memory: generic
 * loads through it read that block's copy).  Compiled only for sm_90+
 * (below, empty stubs: the host never launches a cluster kernel on a
 * device without cluster launch, bn_cluster_device). */
static __device__ __forceinline__ void bn_clu_arrive(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __cluster_barrier_arrive();
#endif
}

static __device__ __forceinline__ void bn_clu_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __cluster_barrier_wait();
#endif
}

static __device__ __forceinline__ void bn_clu_sync(void) {
    bn_clu_arrive();
    bn_clu_wait();
}

template <typename P>
static __device__ __forceinline__ const P *bn_clu_peer(const P *ptr, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return (const P *)__cluster_map_shared_rank((const void *)ptr, rank);
#else
    (void)rank;
    return ptr;
#endif
}

/* The partials of one channel as the blocks of a cluster of cs blocks hold
 * them: part i of the channel was computed by the block of rank i % cs, as
 * its (i / cs)-th part, and stored in slot i / cs of its array `mine` (the
 * same shared array in every block; this block's copy given).  at(i): the
 * address of part i's partial in its block's shared memory (distributed
 * shared memory).  i < parts <= cs * BN_CLU_ROUNDS. */
template <typename P> struct bn_clu_parts {
    const P *mine;
    unsigned cs;
    __device__ __forceinline__ const P *at(int64_t i) const {
        const unsigned u = (unsigned)i;
        return bn_clu_peer(mine + u / cs, u % cs);
    }
};

/* Host: the cluster of a channel of `parts` (> 1) parts when clusters of at
 * most csmax blocks may be launched: the fewest rounds, rounds =
 * ceil(parts / csmax) parts per block at most, and the parts spread evenly
 * over the blocks, cs = ceil(parts / rounds) <= csmax (e.g. 52 parts,
 * csmax 16: 4 rounds of 13 blocks; 17 parts: 2 rounds of 9 blocks, block 8
 * with one part; 4 or 16 parts: one part per block).  Block r of the
 * cluster computes parts r, r + cs, r + 2cs, ... (every block at least one,
 * at most `rounds`).  Why: a block's parts run one after the other, so the
 * rounds set the kernel's length; among the cluster sizes of that many
 * rounds the smallest occupies the fewest SMs of a GPC and keeps every
 * block busy for about the same time.  Returns cs and *rounds, or 0 (and
 * *rounds 0) when parts < 2, csmax < 2 or rounds > BN_CLU_ROUNDS (the
 * partials' slots a block has: e.g. more than 128 parts at csmax 16; such
 * channels keep the cooperative or two-launch route).  Pure. */
static inline unsigned bn_clu_size(int64_t parts, unsigned csmax, unsigned *rounds) {
    *rounds = 0;
    if (parts < 2 || csmax < 2) return 0;
    const int64_t r = (parts + csmax - 1) / csmax;
    if (r > BN_CLU_ROUNDS) return 0;
    *rounds = (unsigned)r;
    return (unsigned)((parts + r - 1) / r);
}

/* The process switch LUCID_BN_CLUSTER, read once (the first call, either
 * direction): "1": 1 (the cluster route where the device and the shape
 * allow it; opt-in: slower on the H200, DECISIONS 39); unset, "" or "0": 0
 * (the cooperative / two-launch routes);
 * anything else: -1, *value (when not NULL) set to the text so that the
 * caller can name it in an ERR_ARG.  bn_cluster_parse is the rule (pure);
 * lucid_cuda_bn_cluster_switch (nn_norm_fwd.cu) the cached reading. */
static inline int bn_cluster_parse(const char *v) {
    if (!v || !v[0] || strcmp(v, "0") == 0) return 0;
    return strcmp(v, "1") == 0 ? 1 : -1;
}
int lucid_cuda_bn_cluster_switch(const char **value);

/* Host: whether device (a CUDA ordinal) takes cluster launches: compute
 * capability 9.0 or newer and cudaDevAttrClusterLaunch.  Asked once per
 * ordinal below 64 (others on each call); a query's error counts as no
 * (and is cleared).  Defined in nn_norm_fwd.cu. */
bool bn_cluster_device(int device);

/* Host: the columns (grid.y) of a cluster launch over C channels:
 * min(C, 65535), or less when a test capped them
 * (lucid_cuda_bn_cluster_cap_columns, nn_norm_fwd.cu: the channel loop with
 * several channels per block); at least 1. */
unsigned bn_clu_columns(int64_t C);

/* Host: whether this call's multi-part channels may take the cluster
 * route: the context's setting (ns->bn_cluster, lucid_cuda_nn_set_bn_cluster:
 * 2 on, 1 off, 0 the process switch LUCID_BN_CLUSTER) and the device
 * (bn_cluster_device).  ERR_ARG (naming op and the text) when the setting
 * follows a LUCID_BN_CLUSTER that is neither unset, "", "0" nor "1". */
static lucid_status bn_cluster_on(lucid_ctx *ctx, const lucid_cuda_nn_state *ns, int device,
                                  const char *op, bool *on) {
    *on = false;
    int m = ns->bn_cluster;
    if (m == 1) return LUCID_OK;
    if (m != 2) {
        const char *v = "";
        int sw = lucid_cuda_bn_cluster_switch(&v);
        if (sw < 0)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "%s: LUCID_BN_CLUSTER=\"%s\" (expected 0 or 1)", op, v);
        if (sw == 0) return LUCID_OK;
    }
    *on = bn_cluster_device(device);
    return LUCID_OK;
}

/* What a cluster kernel instantiation is known to run (one cache per
 * instantiation, the launcher's static; zero-initialised): np, the
 * non-portable attribute (0 not asked, 1 set, 2 refused); fit[cs], clusters
 * of cs blocks (0 not asked, 1 at least one is resident at a time,
 * cudaOccupancyMaxActiveClusters > 0; 2 none, or refused). */
typedef struct bn_clu_cache {
    std::atomic<int> np;
    std::atomic<int> fit[BN_CLU_MAX + 1];
} bn_clu_cache;

/* Whether a query's error means "this cluster shape cannot run here" (the
 * route falls back) rather than a failure to report. */
static inline bool bn_clu_refusal(cudaError_t e) {
    return e == cudaErrorInvalidClusterSize || e == cudaErrorNotSupported ||
           e == cudaErrorNotPermitted || e == cudaErrorInvalidValue;
}

/* Host: whether kernel (BN_THREADS threads a block, no dynamic shared
 * memory) runs in clusters of cs (2..BN_CLU_MAX) blocks along x on the
 * current device: above BN_CLU_PORTABLE the non-portable attribute is set
 * first (cudaFuncSetAttribute, once), then cudaOccupancyMaxActiveClusters
 * for a grid of one cluster must be at least 1 (asked once per cs; the
 * answer cached in cc; the devices of a process are assumed of one
 * generation, as for PDL and the cooperative route).  capturing: the
 * stream is being captured; a question not asked yet is then not asked
 * (*fits false: the call takes the other routes; the eager warm-up asks
 * it first).  A refusal (bn_clu_refusal) is cached as no and cleared;
 * another error is returned (and cleared from cudaGetLastError). */
static cudaError_t bn_clu_fits(const void *kernel, bn_clu_cache *cc, unsigned cs, bool capturing,
                               bool *fits) {
    *fits = false;
    if (cs < 2 || cs > BN_CLU_MAX) return cudaSuccess;
    if (cs > BN_CLU_PORTABLE) {
        int np = cc->np.load(std::memory_order_relaxed);
        if (np == 0) {
            if (capturing) return cudaSuccess;
            cudaError_t e =
                cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                if (!bn_clu_refusal(e)) return e;
            }
            np = e == cudaSuccess ? 1 : 2;
            cc->np.store(np, std::memory_order_relaxed);
        }
        if (np != 1) return cudaSuccess;
    }
    int k = cc->fit[cs].load(std::memory_order_relaxed);
    if (k == 0) {
        if (capturing) return cudaSuccess;
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr;
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = cs;
        attr.val.clusterDim.y = 1;
        attr.val.clusterDim.z = 1;
        cfg.gridDim = dim3(cs, 1, 1);
        cfg.blockDim = dim3(BN_THREADS, 1, 1);
        cfg.dynamicSmemBytes = 0;
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        int n = 0;
        cudaError_t e = cudaOccupancyMaxActiveClusters(&n, kernel, &cfg);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            if (!bn_clu_refusal(e)) return e;
            n = 0;
        }
        k = n > 0 ? 1 : 2;
        cc->fit[cs].store(k, std::memory_order_relaxed);
    }
    *fits = k == 1;
    return cudaSuccess;
}

/* Host: the choice of one direction's cluster launch (parts > 1).  The
 * cluster sizes tried, in order: bn_clu_size(parts, BN_CLU_MAX), then
 * bn_clu_size(parts, BN_CLU_PORTABLE) when it differs (each 0 is skipped);
 * for each, the direction's kernel for that many rounds (the held variant
 * only with one part per block) when bn_clu_fits, on the grid (cs, gy)
 * with clusters (cs, 1, 1).  The choice depends on (parts, C, the kernels'
 * cluster occupancy, the capture state before the first question) only,
 * so an eager call and a captured one make the same one once the eager
 * warm-up asked. */
typedef struct bn_clu_sel {
    int64_t parts;  /* per channel (> 1) */
    unsigned gy;    /* channel columns, bn_clu_columns(C) */
    bool capturing; /* the stream is being captured */
    bool launched;  /* a kernel was queued */
    unsigned cs;    /* its cluster size (= grid.x) */
    unsigned rounds;
} bn_clu_sel;

static bn_clu_sel bn_clu_sel_of(const bn_geom &g, bool capturing) {
    bn_clu_sel s;
    s.parts = g.parts;
    s.gy = bn_clu_columns(g.C);
    s.capturing = capturing;
    s.launched = false;
    s.cs = 0;
    s.rounds = 0;
    return s;
}

/* Host: the sizes of s in their order; try_size(cs, rounds) tries one (its
 * kernel's bn_clu_fits, then the launch; bn_clu_queued) and returns the
 * first error; stops at the first launched. */
template <typename F>
static cudaError_t bn_clu_choose(bn_clu_sel *s, F try_size) {
    unsigned r16 = 0, r8 = 0;
    const unsigned c16 = bn_clu_size(s->parts, BN_CLU_MAX, &r16);
    const unsigned c8 = bn_clu_size(s->parts, BN_CLU_PORTABLE, &r8);
    if (c16) {
        cudaError_t e = try_size(c16, r16);
        if (e != cudaSuccess || s->launched) return e;
    }
    if (c8 && c8 != c16) return try_size(c8, r8);
    return cudaSuccess;
}

/* Host: after a cluster launch of cs blocks (e: its status; cc: the
 * kernel's cache): s->launched, s->cs, s->rounds, unless the driver refused
 * the cluster shape (cudaErrorInvalidClusterSize: cleared, the size cached
 * as not running, and bn_clu_choose goes on with the next size or the call
 * with the other routes).  Any other error counts as launched and is left
 * for CUDA_CHECK_LAUNCH (the launch also set cudaGetLastError). */
static void bn_clu_queued(bn_clu_sel *s, cudaError_t e, bn_clu_cache *cc, unsigned cs,
                          unsigned rounds) {
    if (e == cudaErrorInvalidClusterSize) {
        (void)cudaGetLastError();
        cc->fit[cs].store(2, std::memory_order_relaxed);
        return;
    }
    s->launched = true;
    s->cs = cs;
    s->rounds = rounds;
}

/* Of this thread's BatchNorm launches, the cluster ones
 * (bn_stats_apply_clu, bn_grad_dx_clu): the test hook
 * lucid_cuda_bn_cluster_count; and the cluster size and columns (grid
 * (cs, gy)) of the last one, lucid_cuda_bn_cluster_last_grid (0 x 0 before
 * the first).  Nothing here reads them.  Defined in nn_norm_fwd.cu. */
extern thread_local unsigned long lucid_cuda_bn_cluster_launches;
extern thread_local unsigned lucid_cuda_bn_cluster_cs, lucid_cuda_bn_cluster_gy;
extern "C" unsigned long lucid_cuda_bn_cluster_count(void);
extern "C" void lucid_cuda_bn_cluster_last_grid(unsigned *cs, unsigned *gy);
extern "C" int lucid_cuda_bn_cluster_sm_count(void);
extern "C" unsigned lucid_cuda_bn_cluster_cap_columns(unsigned n);

/* Host: count a cluster launch of s (s->launched) in the test hooks. */
static inline void bn_clu_note(const bn_clu_sel &s) {
    lucid_cuda_bn_launches += 1;
    lucid_cuda_bn_cluster_launches += 1;
    lucid_cuda_bn_cluster_cs = s.cs;
    lucid_cuda_bn_cluster_gy = s.gy;
}

/* Host: whether st's stream is being captured (*capturing); the query's
 * error is returned (and cleared). */
static cudaError_t bn_capturing(cudaStream_t stream, bool *capturing) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(stream, &cs);
    if (e != cudaSuccess) (void)cudaGetLastError();
    *capturing = cs != cudaStreamCaptureStatusNone;
    return e;
}

#endif /* LUCID_CUDA_NN_NORM_CUH */
