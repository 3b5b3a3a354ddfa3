/*
 * nn_norm_fwd.cu — BatchNorm2d forward on the GPU (training and eval, plain
 * and fused with SiLU): the nn.h slots lucid_cuda_batchnorm2d_forward and
 * lucid_cuda_batchnorm2d_silu_forward.  The partition of the reductions,
 * the folds, the vector path and the routes of the element-wise kernels
 * are described (and implemented) in nn_norm.cuh; the backward is
 * nn_norm_bwd.cu.
 *
 * Forward statistics (training): per-thread shifted sums (shift = the
 * channel's first element) turned into (count, mean, M2) and merged with
 * Chan's formula, so the variance does not suffer from E[x^2]-E[x]^2
 * cancellation; one part per block (bn_stats_partial), the parts of a
 * channel folded in f64 (bn_stats_fold, by the last block or by
 * bn_stats_final), finished in f64 (bn_stats_finish: save_mean,
 * save_invstd, the running stats, num_batches_tracked += 1).  Eval:
 * bn_stats_eval takes the running statistics.  Then bn_apply writes
 * y = x*scale + shift (scale = w*invstd, shift = b - mean*scale) flat over
 * the tensor (route VEC, SCALAR or WIDE, bn_route).
 *
 * One pass (parts == 1, LUCID_BN_ONEPASS; see nn_norm.cuh):
 * bn_stats_apply1 computes channel c's statistics exactly as
 * bn_stats_partial's one-part path (same walk, vector width, tree, f64
 * finish, running stats, num_batches_tracked), thread 0 passes the f32
 * save_mean/save_invstd it stored to the block through shared memory, and
 * after a barrier the block writes the channel's y with bn_apply's
 * per-element arithmetic (vectors of the apply's vector choice, walked
 * like a part: plane offsets 64-bit, so no separate route for huge
 * tensors).
 *
 * Cooperative (parts > 1, LUCID_BN_COOP; see nn_norm.cuh):
 * bn_stats_apply_coop runs bn_stats_partial's grid (or one of fewer
 * channel columns whose blocks loop over the channels of their column:
 * bn_coop_rounds) with every block resident; each block stores its
 * partial, waits for the channel's other parts (bn_coop_wait), folds all
 * of them (bn_stats_fold_sums, as the last block would), part 0 finishes
 * the channel, and each block writes y over its own part (bn_y_part,
 * bn_apply's arithmetic).
 *
 * Clusters (2..128 parts, sm_90+, LUCID_BN_CLUSTER; see nn_norm.cuh; taken
 * before the cooperative kernels): bn_stats_apply_clu runs a cluster of cs
 * blocks per channel row, each block computing the partials of its parts
 * (r, r + cs, ...) into its shared memory; after the cluster barrier every
 * block folds them from the cluster's shared memory (bn_stats_fold_by with
 * bn_mv_cluster: the fold of the other routes), rank 0 finishes the
 * channel, and each block writes y over its parts.
 *
 * Launches (counter route, or any route with parts == 1; the fallback adds
 * one final when parts > 1): training forward 2 (stats partial[+fold],
 * apply), 1 with parts == 1 (one pass; 2 with LUCID_BN_ONEPASS=0), 1 with
 * 2..128 parts on the cluster route (LUCID_BN_CLUSTER=0: as follows), 1 with
 * parts > 1 when a cooperative grid is co-resident, with a column per
 * channel or in rounds (2 with LUCID_BN_COOP=0; see nn_norm.cuh), eval
 * forward 2 (stats_eval, apply).
 *
 * Fused BatchNorm2d + SiLU (lucid_cuda_batchnorm2d_silu_forward): the
 * statistics kernel above unchanged, then bn_apply<..., true> stores a =
 * z*sigmoid(z) of the f32 z = fmaf(x, sc, sh) (z never stored): 2 launches
 * in training (stats partial+fold, apply) instead of 3 for batchnorm then
 * silu, 2 in eval; with one part per channel bn_stats_apply1<..., true>
 * does the same in 1 launch.
 *
 * Test hooks (defined here, counted by both directions):
 * lucid_cuda_bn_launch_count() (nn_common.cuh),
 * lucid_cuda_bn_wide_count(), lucid_cuda_bn_coop_count() and
 * lucid_cuda_bn_coop_last_grid() (nn_norm.cuh); lucid_cuda_bn_coop_sm_count()
 * (whether the device takes the cooperative kernels, and its SM count);
 * the cluster route's lucid_cuda_bn_cluster_count(),
 * lucid_cuda_bn_cluster_last_grid(), lucid_cuda_bn_cluster_sm_count() and
 * lucid_cuda_bn_cluster_cap_columns(), and its switch
 * (lucid_cuda_bn_cluster_switch, bn_cluster_device, bn_clu_columns).
 * Source: PyTorch nn.BatchNorm2d docs; Chan, Golub, LeVeque (1979); nn.SiLU
 * docs.
 */
#include "nn_norm.cuh"

#include <stdio.h>

// ----------------------------------------------------------------------------
// the forward's output of one element

/* The forward's output of one element: z = fmaf(x, sc, sh), SILU: z *
 * sigmoid(z) (z kept in f32). */
template <bool SILU>
static __device__ __forceinline__ float bn_out(float x, float sc, float sh) {
    float z = fmaf(x, sc, sh);
    return SILU ? z * nn_sigmoid(z) : z;
}

/* One vector of y from x: bn_out per element (the apply's arithmetic). */
template <typename T, int V, bool SILU>
static __device__ __forceinline__ typename bn_vec<T, V>::R bn_out_vec(
    const typename bn_vec<T, V>::R &rx, float sc, float sh) {
    float v[V];
    bn_vec<T, V>::unpack(rx, v);
#pragma unroll
    for (int k = 0; k < V; k++) v[k] = bn_out<SILU>(v[k], sc, sh);
    return bn_vec<T, V>::pack(v);
}

// ----------------------------------------------------------------------------
// forward statistics

struct bn_mv { float n, mean, m2; };

static __device__ __forceinline__ bn_mv bn_merge(bn_mv a, bn_mv b) {
    float n = a.n + b.n;
    if (b.n == 0.0f) return a;
    if (a.n == 0.0f) return b;
    float d = b.mean - a.mean;
    float fb = b.n / n;
    bn_mv r;
    r.n = n;
    r.mean = a.mean + d * fb;
    r.m2 = a.m2 + b.m2 + d * d * a.n * fb;
    return r;
}

static __device__ __forceinline__ bn_mv bn_shfl(bn_mv v, int o) {
    bn_mv r;
    r.n = __shfl_down_sync(0xffffffffu, v.n, o);
    r.mean = __shfl_down_sync(0xffffffffu, v.mean, o);
    r.m2 = __shfl_down_sync(0xffffffffu, v.m2, o);
    return r;
}

/* What the statistics finish writes (training forward). */
typedef struct bn_stats_out {
    float *save_mean, *save_invstd;
    float *running_mean, *running_var; /* nullable */
    void *nbt;                         /* num_batches_tracked, nullable */
    int nbt_dt;
    double momentum, eps;
} bn_stats_out;

/* Channel c's stored (mean, invstd) in f32 from its (count n, mean, M2)
 * in f64: mean and 1/sqrt(M2/n + eps) (the biased variance normalises). */
static __device__ __forceinline__ float2 bn_stats_kept(double n, double mean, double m2,
                                                       double eps) {
    if (m2 < 0.0) m2 = 0.0;
    const double var = m2 / n; /* biased: normalisation */
    return make_float2((float)mean, (float)(1.0 / sqrt(var + eps)));
}

/* What channel c's finish stores besides nothing else needing it first:
 * save_mean / save_invstd (kept, from bn_stats_kept), the running stats
 * and, for c == 0 only, num_batches_tracked += 1 (once per forward). */
static __device__ void bn_stats_store(double n, double mean, double m2, int64_t c, float2 kept,
                                      const bn_stats_out &out) {
    if (m2 < 0.0) m2 = 0.0;
    out.save_mean[c] = kept.x;
    out.save_invstd[c] = kept.y;
    if (out.running_mean)
        out.running_mean[c] = (float)((1.0 - out.momentum) * (double)out.running_mean[c] +
                                      out.momentum * mean);
    if (out.running_var)
        out.running_var[c] = (float)((1.0 - out.momentum) * (double)out.running_var[c] +
                                     out.momentum * (m2 / (n - 1.0)));
    if (c == 0 && out.nbt) {
        if (out.nbt_dt == LUCID_I64) ((int64_t *)out.nbt)[0] += 1;
        else if (out.nbt_dt == LUCID_I32) ((int32_t *)out.nbt)[0] += 1;
        else lucid_store_f64(out.nbt, out.nbt_dt, 0, lucid_load_f64(out.nbt, out.nbt_dt, 0) + 1.0);
    }
}

/* Channel c's results from its (count n, mean, M2) in f64 (one thread):
 * save_mean / save_invstd, the running stats and, for c == 0 only,
 * num_batches_tracked += 1 (once per forward).  Returns the f32 (mean,
 * invstd) it stored in save_mean[c] / save_invstd[c]. */
static __device__ float2 bn_stats_finish(double n, double mean, double m2, int64_t c,
                                         const bn_stats_out &out) {
    const float2 kept = bn_stats_kept(n, mean, m2, out.eps);
    bn_stats_store(n, mean, m2, c, kept, out);
    return kept;
}

/* Channel c's statistics from its `parts` (> 1) partials pp[0..parts) =
 * (n_i, mean_i, M2_i): called by every thread of a BN_THREADS block
 * (block-uniform), thread 0 gets the channel's (n, mean, M2) in f64
 * (bn_stats_fold_sums; bn_stats_fold: and finishes, bn_stats_finish).
 * f64 sums shifted by K = mean_0 (part 0 is the largest part):
 *   n = sum n_i, s = sum n_i*(mean_i - K), q = sum M2_i + n_i*(mean_i - K)^2,
 *   mean = K + s/n, M2 = q - s^2/n  (Chan's merge of all parts at once).
 * The cancellation in q - s^2/n is bounded: n_0*(mean_0 - mean)^2 <= M2, so
 * s^2/n <= M2 * n/n_0 <= M2 * parts, a relative error of about
 * parts * 2^-53 on M2 (1e-11 for 1e5 parts), far below the f32 partials'.
 * Fixed order: thread t adds parts t, t+BN_THREADS, ... in that order, then
 * bn_block_sum64 of the three sums at once.  Nothing depends on blockIdx,
 * so the last-arriving block of bn_stats_partial (whichever it is), the
 * fallback bn_stats_final, every block of bn_stats_apply_coop and every
 * block of bn_stats_apply_clu give the same bits.  The partials come from
 * ld (bn_stats_fold_by: ld.at(i, k), component k of part i's (n, mean, M2);
 * the same expressions whatever the loader): bn_mv_global reads them from
 * global memory with ld.global.cg (L2: other blocks of this grid wrote
 * them), bn_mv_cluster from the shared memory of the cluster's blocks. */
struct bn_mv_global {
    const float3 *pp;
    __device__ __forceinline__ float at(int64_t i, int k) const {
        return __ldcg((const float *)(pp + i) + k);
    }
};

struct bn_mv_cluster {
    bn_clu_parts<float3> c;
    __device__ __forceinline__ float at(int64_t i, int k) const {
        return ((const float *)c.at(i))[k];
    }
};

template <typename L>
static __device__ void bn_stats_fold_by(const L &ld, int64_t parts, double *n_out,
                                        double *mean_out, double *m2_out) {
    __shared__ double sh[3][32];
    double K = (double)ld.at(0, 1);
    double v[3] = {0.0, 0.0, 0.0}; /* n, s, q */
    for (int64_t i = threadIdx.x; i < parts; i += BN_THREADS) {
        double ni = (double)ld.at(i, 0), d = (double)ld.at(i, 1) - K;
        double sd = ni * d;
        v[0] += ni;
        v[1] += sd;
        v[2] += (double)ld.at(i, 2) + sd * d;
    }
    bn_block_sum64<3>(v, parts, sh);
    if (threadIdx.x != 0) return;
    double n = v[0], s = v[1], q = v[2];
    *n_out = n;
    *mean_out = K + s / n;
    *m2_out = q - s * (s / n);
}

static __device__ void bn_stats_fold_sums(const float3 *pp, int64_t parts, double *n_out,
                                          double *mean_out, double *m2_out) {
    bn_stats_fold_by(bn_mv_global{pp}, parts, n_out, mean_out, m2_out);
}

static __device__ void bn_stats_fold(const float3 *pp, int64_t parts, int64_t c,
                                     const bn_stats_out &out) {
    double n = 0.0, mean = 0.0, m2 = 0.0;
    bn_stats_fold_sums(pp, parts, &n, &mean, &m2);
    if (threadIdx.x == 0) bn_stats_finish(n, mean, m2, c, out);
}

/* One part of channel c: (count, mean, M2), thread 0 of the block holding
 * it.  K: the channel's shift (its first element).  keep (nullable): the
 * vectors this thread loaded in the walk's last round (all of them when
 * the part is one round, pt.total <= BN_THREADS*BN_UNROLL; only with U ==
 * BN_UNROLL).  U: vectors loaded per round before they are summed (the
 * sums' order does not depend on it, bn_unroll). */
template <typename T, int V, int U = BN_UNROLL>
static __device__ __forceinline__ bn_mv bn_stats_part(
    const T *__restrict__ xp, const bn_part &pt, int64_t CS, float K, bn_mv *sh,
    typename bn_vec<T, V>::R *keep = nullptr) {
    static_assert(U >= 1 && U <= BN_UNROLL, "U: 1..BN_UNROLL");
    /* keep holds one round of BN_UNROLL vectors: with fewer a round, the
     * walk would take several rounds and keep only the last one's */
    if (U != BN_UNROLL && keep != nullptr) __trap();
    typedef bn_vec<T, V> Vt;
    typedef typename Vt::R R;
    float a1 = 0.0f, a2 = 0.0f;
    unsigned nvec = 0;
    bn_walk w = bn_walk_first(pt);
    while (w.j < pt.total) {
        R r[U];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            ok[u] = w.j < pt.total;
            r[u] = R();
            if (ok[u]) r[u] = Vt::load(xp + bn_walk_elem<V>(w, CS));
            if (keep) keep[u] = r[u];
            bn_walk_next(w, pt);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (!ok[u]) break;
            float f[V];
            Vt::unpack(r[u], f);
#pragma unroll
            for (int k = 0; k < V; k++) {
                float d = f[k] - K;
                a1 += d;
                a2 = fmaf(d, d, a2);
            }
            nvec++;
        }
    }
    float cnt = (float)(nvec * V);
    bn_mv v;
    v.n = cnt;
    v.mean = cnt > 0.0f ? K + a1 / cnt : 0.0f;
    v.m2 = cnt > 0.0f ? fmaxf(a2 - a1 * (a1 / cnt), 0.0f) : 0.0f;
    /* fixed tree: shuffle down inside the warp, then warp 0 over warps */
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = bn_merge(v, bn_shfl(v, o));
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    __syncthreads(); /* sh may still be read by a previous channel */
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    bn_mv r = {0.0f, 0.0f, 0.0f};
    if (wid == 0) {
        r = lane < BN_THREADS / 32 ? sh[lane] : bn_mv{0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) r = bn_merge(r, bn_shfl(r, o));
    }
    return r;
}

/* One block per (part, channel).  parts == 1: thread 0 finishes the
 * channel.  Otherwise partial[(c * parts + part)] = (count, mean, M2) of
 * the part; with count (the nn state's zeroed arrival counters), the last
 * block of channel c folds the channel's partials (bn_stats_fold); count
 * NULL: bn_stats_final does, in a launch of its own. */
template <typename T, int V, int U = BN_UNROLL>
static __global__ void __launch_bounds__(BN_THREADS)
bn_stats_partial(const T *__restrict__ x, bn_geom g, float3 *partial, unsigned int *count,
                 bn_stats_out out) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    __shared__ bn_mv sh[32];
    __shared__ int last;
    const int64_t part = blockIdx.x;
    const bn_part pt = bn_part_of<V>(g, part);
    for (int64_t c = blockIdx.y; c < g.C; c += gridDim.y) {
        float K = lucid_elem<T>::load(x + c * g.S, 0); /* channel shift */
        bn_mv r = bn_stats_part<T, V, U>(x + pt.base + c * g.S, pt, g.CS, K, sh);
        if (g.parts == 1) {
            if (threadIdx.x == 0)
                bn_stats_finish((double)r.n, (double)r.mean, (double)r.m2, c, out);
            continue;
        }
        /* thread 0: the one bn_arrive fences for */
        if (threadIdx.x == 0) partial[c * g.parts + part] = make_float3(r.n, r.mean, r.m2);
        if (count && bn_arrive(count + c, g.parts, &last))
            bn_stats_fold(partial + c * g.parts, g.parts, c, out);
    }
}

/* Fallback (no counters, parts > 1): one block per channel folds its
 * partials. */
static __global__ void __launch_bounds__(BN_THREADS)
bn_stats_final(const float3 *partial, bn_geom g, bn_stats_out out) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int64_t c = blockIdx.y; c < g.C; c += gridDim.y)
        bn_stats_fold(partial + c * g.parts, g.parts, c, out);
}

/* eval: the statistics used are the running ones. */
static __global__ void bn_stats_eval(int64_t C, const float *running_mean,
                              const float *running_var, float *save_mean,
                              float *save_invstd, double eps) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    save_mean[c] = running_mean[c];
    save_invstd[c] = (float)(1.0 / sqrt((double)running_var[c] + eps));
}

/* y = x * scale + shift, scale = w*invstd, shift = b - mean*scale;
 * SILU: y = z * sigmoid(z) of that z (kept in f32).  Flat over the
 * N*C*S/V vectors (bn_flat). */
template <typename T, int V, typename I, bool SILU, int U = BN_UNROLL>
static __global__ void __launch_bounds__(BN_THREADS)
bn_apply(const T *__restrict__ x, T *__restrict__ y, bn_flat<I> f, const float *mean,
         const float *invstd, const float *w, const float *b) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    typedef bn_vec<T, V> Vt;
    typedef typename Vt::R R;
    bn_at<I> a = bn_at_first(f);
    while (a.j < f.nv) {
        R r[U];
        I at[U];
        float sc[U], sh[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            at[u] = a.j;
            r[u] = R();
            sc[u] = sh[u] = 0.0f;
            if (a.j < f.nv) {
                r[u] = Vt::load(x + (size_t)a.j * V);
                bn_affine((int64_t)a.c, mean, invstd, w, b, &sc[u], &sh[u]);
            }
            bn_at_next(a, f);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (at[u] >= f.nv) break;
            Vt::store(y + (size_t)at[u] * V, bn_out_vec<T, V, SILU>(r[u], sc[u], sh[u]));
        }
    }
}

/* y over one part of channel c with bn_apply's per-element arithmetic
 * (bn_out_vec with the channel's sc, shf), walked like a part (pa with
 * VA-element vectors; base: the part's first element in channel c, 64-bit
 * plane offsets).  HELD (the part one round of the walk): from held[u], the
 * vectors the statistics loaded at the same walk positions; else x is read
 * again, BN_UNROLL vectors loaded before any is stored. */
template <typename T, int VA, bool SILU, bool HELD>
static __device__ __forceinline__ void bn_y_part(const T *__restrict__ x, T *__restrict__ y,
                                                 const bn_part &pa, int64_t base, int64_t CS,
                                                 float sc, float shf,
                                                 const typename bn_vec<T, VA>::R *held) {
    typedef bn_vec<T, VA> Vt;
    typedef typename Vt::R R;
    bn_walk wk = bn_walk_first(pa);
    if constexpr (HELD) { /* one round: the vectors are in held[] */
#pragma unroll
        for (int u = 0; u < BN_UNROLL; u++) {
            if (wk.j < pa.total)
                Vt::store(y + base + bn_walk_elem<VA>(wk, CS),
                          bn_out_vec<T, VA, SILU>(held[u], sc, shf));
            bn_walk_next(wk, pa);
        }
    } else {
        while (wk.j < pa.total) {
            R rv[BN_UNROLL];
            int64_t e[BN_UNROLL];
            bool ok[BN_UNROLL];
#pragma unroll
            for (int u = 0; u < BN_UNROLL; u++) {
                ok[u] = wk.j < pa.total;
                rv[u] = R();
                e[u] = 0;
                if (ok[u]) {
                    e[u] = base + bn_walk_elem<VA>(wk, CS);
                    rv[u] = Vt::load(x + e[u]);
                }
                bn_walk_next(wk, pa);
            }
#pragma unroll
            for (int u = 0; u < BN_UNROLL; u++) {
                if (!ok[u]) break;
                Vt::store(y + e[u], bn_out_vec<T, VA, SILU>(rv[u], sc, shf));
            }
        }
    }
}

/* Training forward of channels of ONE part (g.parts == 1), statistics and
 * apply in one launch (LUCID_BN_ONEPASS, see the header): block c (grid.y,
 * channels strided) computes channel c's statistics exactly as
 * bn_stats_partial's one-part path (part 0 walked with VS-element vectors,
 * the same tree and f64 finish, running stats and num_batches_tracked
 * included); thread 0 hands the f32 (mean, invstd) it stored in
 * save_mean[c] / save_invstd[c] to the block through shared memory, and
 * after the barrier the block writes y over the channel with bn_apply's
 * per-element arithmetic (bn_affine_of, bn_out; VA-element vectors, VA the
 * apply's vector choice), so y equals bn_apply's bitwise.  The walk is
 * part 0's (all N planes; plane offsets 64-bit, so huge tensors need no
 * other route).  HELD (VS == VA and the part one round of the walk): the
 * apply uses the vectors the statistics loaded, still in registers,
 * instead of reading x again (same values, same bits). */
template <typename T, int VS, int VA, bool SILU, bool HELD>
static __global__ void __launch_bounds__(BN_THREADS)
bn_stats_apply1(const T *__restrict__ x, T *__restrict__ y, bn_geom g, bn_stats_out out,
                const float *w, const float *b) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    typedef bn_vec<T, VA> Vt;
    typedef typename Vt::R R;
    __shared__ bn_mv sh[32];
    __shared__ float2 kept; /* channel c's stored (mean, invstd) */
    const bn_part ps = bn_part_of<VS>(g, 0), pa = bn_part_of<VA>(g, 0);
    static_assert(!HELD || VS == VA, "held vectors need one vector width");
    for (int64_t c = blockIdx.y; c < g.C; c += gridDim.y) {
        float K = lucid_elem<T>::load(x + c * g.S, 0); /* channel shift */
        /* loaded before the walk, off the chain the barrier waits for */
        const float wc = w ? w[c] : 1.0f, bc = b ? b[c] : 0.0f;
        R held[BN_UNROLL];
        bn_mv r = bn_stats_part<T, VS>(x + ps.base + c * g.S, ps, g.CS, K, sh,
                                       HELD ? (typename bn_vec<T, VS>::R *)held : nullptr);
        /* kept is rewritten only after the next channel's bn_stats_part
         * barriers, which every thread reaches after reading it below.
         * Thread 0 computes it, and stores the statistics and the running
         * stats (global read-modify-writes) only after the barrier, while
         * the block writes y: the same values, written later */
        if (threadIdx.x == 0) kept = bn_stats_kept((double)r.n, (double)r.mean, (double)r.m2, out.eps);
        __syncthreads();
        const float2 kc = kept;
        if (threadIdx.x == 0) bn_stats_store((double)r.n, (double)r.mean, (double)r.m2, c, kc, out);
        float sc, shf;
        bn_affine_of(kc.x, kc.y, wc, bc, &sc, &shf);
        bn_y_part<T, VA, SILU, HELD>(x, y, pa, pa.base + c * g.S, g.CS, sc, shf, held);
    }
}

/* Training forward of channels of SEVERAL parts (g.parts > 1), statistics
 * and apply in one cooperative launch (lucid_launch_coop; LUCID_BN_COOP, see
 * the header): the grid of bn_stats_partial (block (part, c), channels
 * strided by grid.y; grid.y may be below min(C, 65535), bn_coop_rounds: a
 * block then runs several channels in turn), every block resident at
 * once.  Block (part, c)
 * computes its part's partial exactly as bn_stats_partial (bn_stats_part
 * with VS-element vectors, the same tree) and stores it in
 * partial[c*parts + part]; bn_coop_wait holds it until every part of
 * channel c has stored its partial; then EVERY block of the channel runs
 * the fold (bn_stats_fold_sums, the same fixed order: the same f64 (n,
 * mean, M2) in every block).  Part 0's thread 0 finishes the channel
 * (bn_stats_finish: save_mean, save_invstd, running stats,
 * num_batches_tracked); the other blocks take the same f32 (mean, invstd)
 * from bn_stats_kept.  Then each block writes y over its own part with
 * bn_apply's per-element arithmetic (bn_affine_of, bn_out; VA-element
 * vectors, the apply's vector choice), so every output equals the
 * two-launch route's bitwise.  HELD (VS == VA, each part one round of the
 * walk, bn_coop_held): y is written from the vectors the partial loaded,
 * still in registers; else x is read again (mostly from L2).  count: the
 * nn state's per-channel counters, zero at the start and again at the end
 * (bn_coop_wait). */
template <typename T, int VS, int VA, bool SILU, bool HELD>
static __global__ void __launch_bounds__(BN_THREADS)
bn_stats_apply_coop(const T *__restrict__ x, T *__restrict__ y, bn_geom g, float3 *partial,
                    unsigned int *count, bn_stats_out out, const float *w, const float *b) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    typedef bn_vec<T, VA> Vt;
    typedef typename Vt::R R;
    __shared__ bn_mv sh[32];
    __shared__ float2 kept; /* channel c's (mean, invstd) */
    static_assert(!HELD || VS == VA, "held vectors need one vector width");
    const int64_t part = blockIdx.x;
    const bn_part ps = bn_part_of<VS>(g, part), pa = bn_part_of<VA>(g, part);
    for (int64_t c = blockIdx.y; c < g.C; c += gridDim.y) {
        float K = lucid_elem<T>::load(x + c * g.S, 0); /* channel shift */
        /* loaded before the walk, off the chain the barrier waits for */
        const float wc = w ? w[c] : 1.0f, bc = b ? b[c] : 0.0f;
        R held[BN_UNROLL];
        bn_mv r = bn_stats_part<T, VS>(x + ps.base + c * g.S, ps, g.CS, K, sh,
                                       HELD ? (typename bn_vec<T, VS>::R *)held : nullptr);
        float3 *pp = partial + c * g.parts;
        /* thread 0: the one bn_coop_wait fences for */
        if (threadIdx.x == 0) pp[part] = make_float3(r.n, r.mean, r.m2);
        bn_coop_wait(count + c, g.parts);
        double n = 0.0, mean = 0.0, m2 = 0.0;
        bn_stats_fold_sums(pp, g.parts, &n, &mean, &m2);
        /* kept is rewritten only after the next channel's bn_stats_part
         * barriers, which every thread reaches after reading it below.
         * Part 0's thread 0 stores the statistics and the running stats
         * (bn_stats_store: the bits of bn_stats_finish) after the barrier,
         * while the block writes y */
        if (threadIdx.x == 0) kept = bn_stats_kept(n, mean, m2, out.eps);
        __syncthreads();
        const float2 kc = kept;
        if (threadIdx.x == 0 && part == 0) bn_stats_store(n, mean, m2, c, kc, out);
        float sc, shf;
        {
            bn_affine_of(kc.x, kc.y, wc, bc, &sc, &shf);
        }
        bn_y_part<T, VA, SILU, HELD>(x, y, pa, pa.base + c * g.S, g.CS, sc, shf, held);
    }
}

/* Training forward of channels of SEVERAL parts (g.parts > 1), statistics
 * and apply in one launch on thread-block clusters (lucid_launch_cluster;
 * LUCID_BN_CLUSTER, see the header): grid (cs, gy), clusters (cs, 1, 1), so
 * the blocks of one cluster are the cs blocks (0..cs-1, y) of one grid
 * row and share its channels c = y, y + gy, ... (the channel loop of the
 * other kernels; gy <= min(C, 65535), bn_clu_columns).  The block of
 * cluster rank r (= blockIdx.x) computes the partials of parts r, r + cs,
 * r + 2cs, ... of channel c exactly as bn_stats_partial (bn_stats_part with
 * VS-element vectors, the same tree) and keeps each in its own shared
 * memory, slot (part / cs) of mine[parity of the channel's turn]; after the
 * cluster barrier (release / acquire) EVERY block folds the channel's
 * partials, read in part order from the blocks that hold them (distributed
 * shared memory, bn_mv_cluster), with the fold of the other routes
 * (bn_stats_fold_by: the same f64 (n, mean, M2) in every block).  The
 * block of rank 0 (part 0) finishes the channel (bn_stats_store: the bits
 * of bn_stats_finish: save_mean, save_invstd, running stats,
 * num_batches_tracked); every block takes the f32 (mean, invstd) from
 * bn_stats_kept and writes y over its own parts with bn_apply's
 * per-element arithmetic (bn_y_part: bn_affine_of, bn_out; VA-element
 * vectors, the apply's vector choice), so every output equals the
 * two-launch route's bitwise.  HELD (VS == VA, one part per block, cs ==
 * parts, and that part one round of the walk, bn_coop_held): y is written
 * from the vectors the partial loaded, still in registers; else x is read
 * again (mostly from L2).
 * Shared memory lifetime: a block's partials of one channel are read by
 * its peers after the barrier of that channel; the next channel's partials
 * go to the other buffer, and the one after to this one again only after
 * the next channel's barrier, which every peer reaches after its reads;
 * after the last channel each block arrives at the cluster barrier once
 * its own reads are done and waits for it before it exits, so no block
 * leaves while a peer may still read its shared memory (CUDA Programming
 * Guide, "Distributed Shared Memory").  No global memory but the tensors:
 * no arena, no counters. */
template <typename T, int VS, int VA, bool SILU, bool HELD>
static __global__ void __launch_bounds__(BN_THREADS)
bn_stats_apply_clu(const T *__restrict__ x, T *__restrict__ y, bn_geom g, bn_stats_out out,
                   const float *w, const float *b) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    typedef bn_vec<T, VA> Vt;
    typedef typename Vt::R R;
    __shared__ bn_mv sh[32];
    __shared__ float2 kept;                        /* channel c's (mean, invstd) */
    __shared__ float3 mine[2][BN_CLU_ROUNDS];      /* this block's partials */
    static_assert(!HELD || VS == VA, "held vectors need one vector width");
    const unsigned rank = blockIdx.x, cs = gridDim.x; /* the cluster spans grid.x */
    int buf = 0;
    for (int64_t c = blockIdx.y; c < g.C; c += gridDim.y, buf ^= 1) {
        float K = lucid_elem<T>::load(x + c * g.S, 0); /* channel shift */
        /* loaded before the walk, off the chain the barrier waits for */
        const float wc = w ? w[c] : 1.0f, bc = b ? b[c] : 0.0f;
        R held[BN_UNROLL];
        int k = 0;
        for (int64_t part = rank; part < g.parts; part += cs, k++) {
            const bn_part ps = bn_part_of<VS>(g, part);
            bn_mv r = bn_stats_part<T, VS>(x + ps.base + c * g.S, ps, g.CS, K, sh,
                                           HELD ? (typename bn_vec<T, VS>::R *)held : nullptr);
            if (threadIdx.x == 0) mine[buf][k] = make_float3(r.n, r.mean, r.m2);
        }
        bn_clu_sync(); /* every partial of channel c stored, in every block */
        double n = 0.0, mean = 0.0, m2 = 0.0;
        bn_stats_fold_by(bn_mv_cluster{{&mine[buf][0], cs}}, g.parts, &n, &mean, &m2);
        /* the fold's values are in registers: this block's last reads of
         * its peers' shared memory are done (arrive: see the comment) */
        if (c + gridDim.y >= g.C) bn_clu_arrive();
        /* kept is rewritten only after the next channel's bn_stats_part
         * barriers, which every thread reaches after reading it below.
         * Rank 0's thread 0 stores the statistics and the running stats
         * after the barrier, while the block writes y */
        if (threadIdx.x == 0) kept = bn_stats_kept(n, mean, m2, out.eps);
        __syncthreads();
        const float2 kc = kept;
        if (threadIdx.x == 0 && rank == 0) bn_stats_store(n, mean, m2, c, kc, out);
        float sc, shf;
        bn_affine_of(kc.x, kc.y, wc, bc, &sc, &shf);
        for (int64_t part = rank; part < g.parts; part += cs) {
            const bn_part pa = bn_part_of<VA>(g, part);
            bn_y_part<T, VA, SILU, HELD>(x, y, pa, pa.base + c * g.S, g.CS, sc, shf, held);
        }
    }
    bn_clu_wait(); /* every peer has read this block's partials */
}

template <typename T, bool SILU>
static void bn_launch_apply(int route, unsigned grid, int64_t N, int64_t C, int64_t S,
                            cudaStream_t stream, const T *x, T *y, const float *mean,
                            const float *invstd, const float *w, const float *b) {
    const int VV = bn_width<T>::V;
    int64_t NCS = N * C * S;
    if (route == BN_ROUTE_VEC)
        lucid_launch(bn_by_unroll(bn_apply<T, VV, uint32_t, SILU, 1>,
                                  bn_apply<T, VV, uint32_t, SILU, 2>,
                                  bn_apply<T, VV, uint32_t, SILU, 4>),
                     dim3(grid), dim3(BN_THREADS), 0, stream, x, y,
                     bn_flat_of<uint32_t>(NCS, C, S, VV, grid), mean, invstd, w, b);
    else if (route == BN_ROUTE_SCALAR)
        lucid_launch(bn_apply<T, 1, uint32_t, SILU>, dim3(grid), dim3(BN_THREADS), 0, stream,
                     x, y, bn_flat_of<uint32_t>(NCS, C, S, 1, grid), mean, invstd, w, b);
    else
        lucid_launch(bn_apply<T, 1, uint64_t, SILU>, dim3(grid), dim3(BN_THREADS), 0, stream,
                     x, y, bn_flat_of<uint64_t>(NCS, C, S, 1, grid), mean, invstd, w, b);
}

template <typename T>
static void bn_launch_stats(bool vec, dim3 grid, cudaStream_t stream, const T *x,
                            const bn_geom &g, float3 *partial, unsigned int *count,
                            const bn_stats_out &so) {
    const int V = bn_width<T>::V;
    if (vec)
        lucid_launch(bn_by_unroll(bn_stats_partial<T, V, 1>, bn_stats_partial<T, V, 2>,
                                  bn_stats_partial<T, V, 4>),
                     grid, dim3(BN_THREADS), 0, stream, x, g, partial, count, so);
    else
        lucid_launch(bn_stats_partial<T, 1>, grid, dim3(BN_THREADS), 0, stream, x, g, partial,
                     count, so);
}

/* The one-pass training forward's launch (parts == 1): vs, the statistics'
 * vector path (bn_stats_partial's choice), va, the apply's (route
 * BN_ROUTE_VEC; va implies vs: both need S % V == 0 and x aligned). */
template <typename T, bool SILU>
static void bn_launch_stats_apply1(bool vs, bool va, dim3 grid, cudaStream_t stream,
                                   const T *x, T *y, const bn_geom &g,
                                   const bn_stats_out &so, const float *w, const float *b) {
    const int VV = bn_width<T>::V;
    if (vs && va && bn_held(g, VV))
        lucid_launch(bn_stats_apply1<T, VV, VV, SILU, true>, grid, dim3(BN_THREADS), 0, stream,
                     x, y, g, so, w, b);
    else if (vs && va)
        lucid_launch(bn_stats_apply1<T, VV, VV, SILU, false>, grid, dim3(BN_THREADS), 0, stream,
                     x, y, g, so, w, b);
    else if (vs)
        lucid_launch(bn_stats_apply1<T, VV, 1, SILU, false>, grid, dim3(BN_THREADS), 0, stream,
                     x, y, g, so, w, b);
    else
        lucid_launch(bn_stats_apply1<T, 1, 1, SILU, false>, grid, dim3(BN_THREADS), 0, stream,
                     x, y, g, so, w, b);
}

/* One candidate of the cooperative training forward (parts > 1), visited
 * for the choice s (bn_coop_visit: its occupancy cached in this
 * instantiation's static): in the launch pass, queued with
 * lucid_launch_coop on the grid (parts, gy) the choice gives it
 * (bn_coop_queued; the launch's own error is left for CUDA_CHECK_LAUNCH,
 * except a refusal for size).  Returns the occupancy query's error. */
template <typename T, int VS, int VA, bool SILU, bool HELD>
static cudaError_t bn_try_stats_apply_coop(bn_coop_sel *s, cudaStream_t stream, const T *x,
                                           T *y, const bn_geom &g, float3 *partial,
                                           unsigned int *count, const bn_stats_out &so,
                                           const float *w, const float *b) {
    static std::atomic<int> per_sm(-1);
    auto k = bn_stats_apply_coop<T, VS, VA, SILU, HELD>;
    dim3 grid;
    bool go = false;
    cudaError_t e = bn_coop_visit((const void *)k, &per_sm, s, &grid, &go);
    if (e != cudaSuccess || !go) return e;
    e = lucid_launch_coop(k, grid, dim3(BN_THREADS), 0, stream, x, y, g, partial, count, so, w,
                          b);
    bn_coop_queued(s, e, &per_sm, grid);
    return cudaSuccess;
}

/* The candidates of the cooperative training forward in their order (vs /
 * va as for bn_launch_stats_apply1, held: the vectors may stay in
 * registers, bn_coop_held): the held variant when asked for, then the
 * variant that reads x again (the one vector choice vs / va allow); a
 * launched one ends the visit. */
template <typename T, bool SILU>
static cudaError_t bn_visit_stats_apply_coop(bool vs, bool va, bool held, bn_coop_sel *s,
                                             cudaStream_t stream, const T *x, T *y,
                                             const bn_geom &g, float3 *partial,
                                             unsigned int *count, const bn_stats_out &so,
                                             const float *w, const float *b) {
    const int VV = bn_width<T>::V;
    if (vs && va && held) {
        cudaError_t e = bn_try_stats_apply_coop<T, VV, VV, SILU, true>(s, stream, x, y, g,
                                                                       partial, count, so, w, b);
        if (e != cudaSuccess || s->launched) return e;
    }
    if (vs && va)
        return bn_try_stats_apply_coop<T, VV, VV, SILU, false>(s, stream, x, y, g, partial,
                                                               count, so, w, b);
    if (vs)
        return bn_try_stats_apply_coop<T, VV, 1, SILU, false>(s, stream, x, y, g, partial,
                                                              count, so, w, b);
    return bn_try_stats_apply_coop<T, 1, 1, SILU, false>(s, stream, x, y, g, partial, count,
                                                         so, w, b);
}

/* The cooperative training forward's launch (parts > 1): the candidate
 * needing the fewest rounds (bn_coop_choose; the first in order among
 * equals), on its grid (parts, gy).  s->launched false: none is
 * co-resident even with one channel column, or none within the rounds
 * LUCID_BN_COOP_LOOP allows (the caller takes the two-launch route).
 * Returns the occupancy queries' first error. */
template <typename T, bool SILU>
static cudaError_t bn_launch_stats_apply_coop(bool vs, bool va, bool held, bn_coop_sel *s,
                                              cudaStream_t stream, const T *x, T *y,
                                              const bn_geom &g, float3 *partial,
                                              unsigned int *count, const bn_stats_out &so,
                                              const float *w, const float *b) {
    return bn_coop_choose(s, [&]() {
        return bn_visit_stats_apply_coop<T, SILU>(vs, va, held, s, stream, x, y, g, partial,
                                                  count, so, w, b);
    });
}

/* One candidate of the cluster training forward (parts > 1) for clusters
 * of cs blocks (rounds: the most parts a block computes): when its kernel
 * runs such clusters (bn_clu_fits, cached in this instantiation's static),
 * queued with lucid_launch_cluster on the grid (cs, s->gy) (bn_clu_queued;
 * the launch's own error is left for CUDA_CHECK_LAUNCH, except a refusal
 * of the cluster size).  Returns the queries' error. */
template <typename T, int VS, int VA, bool SILU, bool HELD>
static cudaError_t bn_try_stats_apply_clu(bn_clu_sel *s, unsigned cs, unsigned rounds,
                                          cudaStream_t stream, const T *x, T *y,
                                          const bn_geom &g, const bn_stats_out &so,
                                          const float *w, const float *b) {
    static bn_clu_cache cache;
    auto k = bn_stats_apply_clu<T, VS, VA, SILU, HELD>;
    bool fits = false;
    cudaError_t e = bn_clu_fits((const void *)k, &cache, cs, s->capturing, &fits);
    if (e != cudaSuccess || !fits) return e;
    e = lucid_launch_cluster(k, dim3(cs, s->gy), dim3(BN_THREADS), 0, stream, cs, x, y, g, so, w,
                             b);
    bn_clu_queued(s, e, &cache, cs, rounds);
    return cudaSuccess;
}

/* The cluster training forward's launch (parts > 1; vs / va as for
 * bn_launch_stats_apply1, held: the vectors may stay in registers,
 * bn_coop_held): for each cluster size of bn_clu_choose, the held kernel
 * when a block holds one part (rounds 1) and held, then the kernel reading
 * x again (the one vector choice vs / va allow).  s->launched false: no
 * candidate runs (the caller takes the cooperative or two-launch route).
 * Returns the queries' first error. */
template <typename T, bool SILU>
static cudaError_t bn_launch_stats_apply_clu(bool vs, bool va, bool held, bn_clu_sel *s,
                                             cudaStream_t stream, const T *x, T *y,
                                             const bn_geom &g, const bn_stats_out &so,
                                             const float *w, const float *b) {
    const int VV = bn_width<T>::V;
    return bn_clu_choose(s, [&](unsigned cs, unsigned rounds) -> cudaError_t {
        if (vs && va && held && rounds == 1) {
            cudaError_t e = bn_try_stats_apply_clu<T, VV, VV, SILU, true>(s, cs, rounds, stream,
                                                                          x, y, g, so, w, b);
            if (e != cudaSuccess || s->launched) return e;
        }
        if (vs && va)
            return bn_try_stats_apply_clu<T, VV, VV, SILU, false>(s, cs, rounds, stream, x, y, g,
                                                                  so, w, b);
        if (vs)
            return bn_try_stats_apply_clu<T, VV, 1, SILU, false>(s, cs, rounds, stream, x, y, g,
                                                                 so, w, b);
        return bn_try_stats_apply_clu<T, 1, 1, SILU, false>(s, cs, rounds, stream, x, y, g, so,
                                                            w, b);
    });
}

/* The counters declared in nn_norm.cuh (both directions add to them). */
thread_local unsigned long lucid_cuda_bn_launches;
thread_local unsigned long lucid_cuda_bn_wide_launches;
thread_local unsigned long lucid_cuda_bn_coop_launches;
thread_local unsigned lucid_cuda_bn_coop_gx, lucid_cuda_bn_coop_gy;

extern "C" unsigned long lucid_cuda_bn_launch_count(void) { return lucid_cuda_bn_launches; }

extern "C" unsigned long lucid_cuda_bn_wide_count(void) { return lucid_cuda_bn_wide_launches; }

extern "C" unsigned long lucid_cuda_bn_coop_count(void) { return lucid_cuda_bn_coop_launches; }

/* Test hook: the grid (parts per channel, channel columns) of this
 * thread's last cooperative BatchNorm launch, either direction (0 x 0
 * before the first).  gx / gy nullable. */
extern "C" void lucid_cuda_bn_coop_last_grid(unsigned *gx, unsigned *gy) {
    if (gx) *gx = lucid_cuda_bn_coop_gx;
    if (gy) *gy = lucid_cuda_bn_coop_gy;
}

/* Test hook: the multiprocessors of the current CUDA device when it takes
 * the cooperative kernels (bn_coop_device: sm_90+ with cooperative
 * launch), else 0; LUCID_BN_COOP is not read.  Errors count as 0 (and are
 * cleared). */
extern "C" int lucid_cuda_bn_coop_sm_count(void) {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    if (!bn_coop_device(dev)) return 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/* The cluster route's test hooks and host helpers (nn_norm.cuh). */
thread_local unsigned long lucid_cuda_bn_cluster_launches;
thread_local unsigned lucid_cuda_bn_cluster_cs, lucid_cuda_bn_cluster_gy;
static std::atomic<unsigned> bn_clu_cap_cols(0); /* 0: no cap */

extern "C" unsigned long lucid_cuda_bn_cluster_count(void) {
    return lucid_cuda_bn_cluster_launches;
}

/* Test hook: the cluster size (= grid.x) and the channel columns (grid.y)
 * of this thread's last cluster BatchNorm launch, either direction (0 x 0
 * before the first).  cs / gy nullable. */
extern "C" void lucid_cuda_bn_cluster_last_grid(unsigned *cs, unsigned *gy) {
    if (cs) *cs = lucid_cuda_bn_cluster_cs;
    if (gy) *gy = lucid_cuda_bn_cluster_gy;
}

/* Test hook: at most n channel columns (grid.y) for the cluster launches
 * queued from now on, by any thread (0: no cap, min(C, 65535) as
 * always), so that a test runs the kernels' channel loop (several channels
 * per cluster, the two partial buffers in turn) on small tensors; the bits
 * do not depend on it.  Returns the previous cap. */
extern "C" unsigned lucid_cuda_bn_cluster_cap_columns(unsigned n) {
    return bn_clu_cap_cols.exchange(n, std::memory_order_relaxed);
}

unsigned bn_clu_columns(int64_t C) {
    unsigned gy = bn_grid_y(C);
    const unsigned cap = bn_clu_cap_cols.load(std::memory_order_relaxed);
    if (cap > 0 && gy > cap) gy = cap;
    return gy > 0 ? gy : 1;
}

/* LUCID_BN_CLUSTER as read once: the switch and a copy of its text. */
typedef struct bn_clu_env {
    int sw;
    char value[64];
} bn_clu_env;

static bn_clu_env bn_clu_env_read(void) {
    bn_clu_env e;
    const char *v = getenv("LUCID_BN_CLUSTER");
    e.sw = bn_cluster_parse(v);
    snprintf(e.value, sizeof e.value, "%s", v ? v : "");
    return e;
}

int lucid_cuda_bn_cluster_switch(const char **value) {
    static const bn_clu_env e = bn_clu_env_read(); /* once, thread-safe */
    if (value) *value = e.value;
    return e.sw;
}

bool bn_cluster_device(int device) {
    static std::atomic<int> known[64]; /* 0 unknown, 1 yes, 2 no */
    if (device >= 0 && device < 64) {
        int k = known[device].load(std::memory_order_relaxed);
        if (k != 0) return k == 1;
    }
    int major = 0, clu = 0;
    bool yes = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
                   cudaSuccess &&
               cudaDeviceGetAttribute(&clu, cudaDevAttrClusterLaunch, device) == cudaSuccess &&
               major >= 9 && clu != 0;
    if (!yes) (void)cudaGetLastError();
    if (device >= 0 && device < 64) known[device].store(yes ? 1 : 2, std::memory_order_relaxed);
    return yes;
}

/* Test hook: the multiprocessors of the current CUDA device when it takes
 * cluster launches (bn_cluster_device: sm_90+ with cudaDevAttrClusterLaunch),
 * else 0; LUCID_BN_CLUSTER is not read.  Errors count as 0 (and are
 * cleared). */
extern "C" int lucid_cuda_bn_cluster_sm_count(void) {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    if (!bn_cluster_device(dev)) return 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

static lucid_status bn_forward(
    lucid_ctx *ctx, const lucid_tensor *x, lucid_tensor *y,
    const lucid_tensor *weight, const lucid_tensor *bias,
    lucid_tensor *running_mean, lucid_tensor *running_var,
    lucid_tensor *num_batches_tracked, lucid_tensor *save_mean,
    lucid_tensor *save_invstd, int training, double momentum, double eps,
    bool silu) {
    const char *op = silu ? "batchnorm2d_silu_forward" : "batchnorm2d_forward";
    LUCID_TRY(nn_check_act(ctx, op, x->dtype));
    LUCID_TRY(nn_check_f32(ctx, op, "weight", weight));
    LUCID_TRY(nn_check_f32(ctx, op, "bias", bias));
    LUCID_TRY(nn_check_f32(ctx, op, "running_mean", running_mean));
    LUCID_TRY(nn_check_f32(ctx, op, "running_var", running_var));
    LUCID_TRY(nn_check_f32(ctx, op, "save_mean", save_mean));
    LUCID_TRY(nn_check_f32(ctx, op, "save_invstd", save_invstd));
    CUDA_ENTER(ctx, st);
    int64_t N = x->shape[0], C = x->shape[1], S = x->shape[2] * x->shape[3];
    if (N * C * S == 0) return LUCID_OK;
    const void *xd = lucid_tensor_data(x);
    void *yd = lucid_tensor_data(y);
    float *sm = (float *)lucid_tensor_data(save_mean);
    float *si = (float *)lucid_tensor_data(save_invstd);
    float *rm = running_mean ? (float *)lucid_tensor_data(running_mean) : NULL;
    float *rv = running_var ? (float *)lucid_tensor_data(running_var) : NULL;
    const float *w = weight ? (const float *)lucid_tensor_data(weight) : NULL;
    const float *b = bias ? (const float *)lucid_tensor_data(bias) : NULL;
    unsigned cblocks = (unsigned)((C + 127) / 128);
    if (training) {
        lucid_cuda_nn_state *ns = lucid_cuda_nn_get(ctx, st);
        if (!ns) return ctx->last_status;
        bn_geom g = bn_geom_of(N, C, S);
        if (g.parts > INT32_MAX)
            return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: batch too large", op);
        void *ws = NULL;
        LUCID_TRY(lucid_cuda_nn_arena(ctx, st, ns,
                                      sizeof(float3) * (size_t)(g.parts * C),
                                      op, &ws));
        unsigned int *count = NULL; /* NULL: the two-launch fallback */
        LUCID_TRY(lucid_cuda_nn_counters(ctx, st, ns, C, &count));
        bn_stats_out so;
        so.save_mean = sm;
        so.save_invstd = si;
        so.running_mean = rm;
        so.running_var = rv;
        so.nbt = num_batches_tracked ? lucid_tensor_data(num_batches_tracked) : NULL;
        so.nbt_dt = num_batches_tracked ? (int)num_batches_tracked->dtype : 0;
        so.momentum = momentum;
        so.eps = eps;
        dim3 grid((unsigned)g.parts, bn_grid_y(C));
        bool vec = bn_use_vec(x->dtype, S, xd, NULL, NULL);
        if (g.parts == 1 && bn_onepass()) {
            /* one part per channel: statistics and apply in one launch */
            bool va = bn_route(x->dtype, N * C * S, S, xd, yd, NULL) == BN_ROUTE_VEC;
            if (silu)
                NN_DISPATCH(x->dtype, (bn_launch_stats_apply1<T, true>(
                                          vec, va, grid, st->stream, (const T *)xd, (T *)yd,
                                          g, so, w, b)));
            else
                NN_DISPATCH(x->dtype, (bn_launch_stats_apply1<T, false>(
                                          vec, va, grid, st->stream, (const T *)xd, (T *)yd,
                                          g, so, w, b)));
            CUDA_CHECK_LAUNCH(ctx, "bn_stats_apply1");
            lucid_cuda_bn_launches += 1;
            return LUCID_OK;
        }
        if (g.parts > 1) {
            /* several parts per channel: statistics and apply in one launch
             * on thread-block clusters (a cluster per channel row) */
            bool clu = false;
            LUCID_TRY(bn_cluster_on(ctx, ns, st->device, op, &clu));
            if (clu) {
                bool capturing = false;
                cudaError_t e = bn_capturing(st->stream, &capturing);
                if (e != cudaSuccess)
                    return lucid_cuda_err(ctx, e, "cudaStreamIsCapturing (bn_stats_apply_clu)",
                                          __FILE__, __LINE__);
                bool va = bn_route(x->dtype, N * C * S, S, xd, yd, NULL) == BN_ROUTE_VEC;
                bool held =
                    vec && va && bn_coop_held(g, 16 / (int64_t)lucid_dtype_size(x->dtype));
                bn_clu_sel cl = bn_clu_sel_of(g, capturing);
                if (silu)
                    NN_DISPATCH(x->dtype, (e = bn_launch_stats_apply_clu<T, true>(
                                               vec, va, held, &cl, st->stream, (const T *)xd,
                                               (T *)yd, g, so, w, b)));
                else
                    NN_DISPATCH(x->dtype, (e = bn_launch_stats_apply_clu<T, false>(
                                               vec, va, held, &cl, st->stream, (const T *)xd,
                                               (T *)yd, g, so, w, b)));
                if (e != cudaSuccess)
                    return lucid_cuda_err(ctx, e, "cudaOccupancyMaxActiveClusters"
                                          " (bn_stats_apply_clu)", __FILE__, __LINE__);
                if (cl.launched) {
                    CUDA_CHECK_LAUNCH(ctx, "bn_stats_apply_clu");
                    bn_clu_note(cl);
                    return LUCID_OK;
                }
            }
        }
        if (g.parts > 1 && count && bn_coop_env() && bn_coop_device(st->device)) {
            /* several parts per channel: statistics and apply in one
             * cooperative launch when a grid is co-resident (a column per
             * channel, or fewer columns in rounds) */
            bool va = bn_route(x->dtype, N * C * S, S, xd, yd, NULL) == BN_ROUTE_VEC;
            bool held = vec && va && bn_coop_held(g, 16 / (int64_t)lucid_dtype_size(x->dtype));
            bn_coop_sel cs = bn_coop_sel_of(g, st->sm_count);
            cudaError_t e = cudaSuccess;
            if (silu)
                NN_DISPATCH(x->dtype, (e = bn_launch_stats_apply_coop<T, true>(
                                           vec, va, held, &cs, st->stream, (const T *)xd,
                                           (T *)yd, g, (float3 *)ws, count, so, w, b)));
            else
                NN_DISPATCH(x->dtype, (e = bn_launch_stats_apply_coop<T, false>(
                                           vec, va, held, &cs, st->stream, (const T *)xd,
                                           (T *)yd, g, (float3 *)ws, count, so, w, b)));
            if (e != cudaSuccess)
                return lucid_cuda_err(ctx, e, "cudaOccupancyMaxActiveBlocksPerMultiprocessor"
                                      " (bn_stats_apply_coop)", __FILE__, __LINE__);
            if (cs.launched) {
                CUDA_CHECK_LAUNCH(ctx, "bn_stats_apply_coop");
                bn_coop_note(cs);
                return LUCID_OK;
            }
        }
        NN_DISPATCH(x->dtype, bn_launch_stats<T>(vec, grid, st->stream, (const T *)xd, g,
                                                 (float3 *)ws, count, so));
        CUDA_CHECK_LAUNCH(ctx, "bn_stats_partial");
        lucid_cuda_bn_launches += 1;
        if (!count && g.parts > 1) {
            lucid_launch(bn_stats_final, dim3(1, bn_grid_y(C)), dim3(BN_THREADS), 0,
                         st->stream, (const float3 *)ws, g, so);
            CUDA_CHECK_LAUNCH(ctx, "bn_stats_final");
            lucid_cuda_bn_launches += 1;
        }
    } else {
        lucid_launch(bn_stats_eval, dim3(cblocks), dim3(128), 0, st->stream, C,
                     (const float *)rm, (const float *)rv, sm, si, eps);
        CUDA_CHECK_LAUNCH(ctx, "bn_stats_eval");
        lucid_cuda_bn_launches += 1;
    }
    int route = bn_route(x->dtype, N * C * S, S, xd, yd, NULL);
    int64_t nv = N * C * S / (route == BN_ROUTE_VEC ? 16 / (int64_t)lucid_dtype_size(x->dtype) : 1);
    unsigned grid = bn_flat_grid(nv, st->sm_count);
    if (silu)
        NN_DISPATCH(x->dtype, (bn_launch_apply<T, true>(route, grid, N, C, S, st->stream,
                                                        (const T *)xd, (T *)yd, sm, si, w, b)));
    else
        NN_DISPATCH(x->dtype, (bn_launch_apply<T, false>(route, grid, N, C, S, st->stream,
                                                         (const T *)xd, (T *)yd, sm, si, w, b)));
    CUDA_CHECK_LAUNCH(ctx, "bn_apply");
    lucid_cuda_bn_launches += 1;
    if (route == BN_ROUTE_WIDE) lucid_cuda_bn_wide_launches += 1;
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_batchnorm2d_forward(
    lucid_ctx *ctx, const lucid_tensor *x, lucid_tensor *y,
    const lucid_tensor *weight, const lucid_tensor *bias,
    lucid_tensor *running_mean, lucid_tensor *running_var,
    lucid_tensor *num_batches_tracked, lucid_tensor *save_mean,
    lucid_tensor *save_invstd, int training, double momentum, double eps) {
    return bn_forward(ctx, x, y, weight, bias, running_mean, running_var,
                      num_batches_tracked, save_mean, save_invstd, training,
                      momentum, eps, false);
}

extern "C" lucid_status lucid_cuda_batchnorm2d_silu_forward(
    lucid_ctx *ctx, const lucid_tensor *x, lucid_tensor *y,
    const lucid_tensor *weight, const lucid_tensor *bias,
    lucid_tensor *running_mean, lucid_tensor *running_var,
    lucid_tensor *num_batches_tracked, lucid_tensor *save_mean,
    lucid_tensor *save_invstd, int training, double momentum, double eps) {
    return bn_forward(ctx, x, y, weight, bias, running_mean, running_var,
                      num_batches_tracked, save_mean, save_invstd, training,
                      momentum, eps, true);
}
