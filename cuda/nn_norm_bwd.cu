/*
 * nn_norm_bwd.cu — BatchNorm2d backward on the GPU (training and eval,
 * plain and fused with SiLU): the nn.h slots
 * lucid_cuda_batchnorm2d_backward and lucid_cuda_batchnorm2d_silu_backward;
 * and the per-channel sum of the conv bias gradient,
 * lucid_cuda_nn_channel_sum (nn_common.cuh).  The partition of the
 * reductions, the folds, the vector path and the routes of the element-wise
 * kernels are described (and implemented) in nn_norm.cuh; the forward is
 * nn_norm_fwd.cu.
 *
 * Gradient sums: per channel (sum g, sum g*xhat), xhat = (x - mean)*invstd
 * from the saved f32 statistics, g = dy (or the fused SiLU's g below); one
 * part per block in f32 (bn_grad_partial), the parts of a channel folded in
 * f64 (bn_grad_fold, by the last block or by bn_grad_final), finished in
 * f64 (bn_grad_finish: dweight = beta*dweight + sum g*xhat, dbias =
 * beta*dbias + sum g, and for a training dx the f32 coefficients (k =
 * w*invstd, mean(g), mean(g*xhat)) in the nn arena).  Then bn_dx writes
 * dx = beta*dx + k*(g - mean(g) - xhat*mean(g*xhat)) in training, beta*dx
 * + w*invstd*g in eval, flat over the tensor (route VEC, SCALAR or WIDE,
 * bn_route).
 *
 * One pass (parts == 1, training with dx, LUCID_BN_ONEPASS; see
 * nn_norm.cuh): bn_grad_dx1 computes bn_grad_partial's one-part sums and
 * finish (dweight/dbias with beta) and then the channel's dx with bn_dx's
 * per-element arithmetic from the f32 coefficients bn_grad_finish would
 * have stored (shared memory instead of the arena).
 *
 * Cooperative (parts > 1, training with dx, LUCID_BN_COOP; see
 * nn_norm.cuh): bn_grad_dx_coop (or its lean copy, bn_grad_dx_coop_lean)
 * runs bn_grad_partial's grid (or one of fewer channel columns whose
 * blocks loop over the channels of their column: bn_coop_rounds) with
 * every block resident; each block stores its partial, waits for the
 * channel's other parts (bn_coop_wait), folds all of them
 * (bn_grad_fold_sums, as the last block would), part 0 finishes dweight /
 * dbias, and each block writes dx over its own part (bn_dx_part, bn_dx's
 * arithmetic) from the coefficients bn_grad_finish would have stored.
 *
 * Clusters (2..128 parts, training with dx, sm_90+, LUCID_BN_CLUSTER; see
 * nn_norm.cuh; taken before the cooperative kernels): bn_grad_dx_clu runs
 * a cluster of cs blocks per channel row, each block computing the
 * gradient sums of its parts (r, r + cs, ...) into its shared memory;
 * after the cluster barrier every block folds them from the cluster's
 * shared memory (bn_grad_fold_by with bn_g_cluster: the fold of the other
 * routes), rank 0 finishes dweight / dbias, and each block writes dx over
 * its parts.
 *
 * Launches (counter route, or any route with parts == 1; the fallback adds
 * one final per reduction when parts > 1): training backward 2 (grad
 * partial[+fold], dx; 1 with parts == 1 (one pass; 2 with
 * LUCID_BN_ONEPASS=0); 1 with 2..128 parts on the cluster route
 * (LUCID_BN_CLUSTER=0: as follows); 1 with parts > 1 when a cooperative
 * grid is co-resident, with a column per channel or in rounds (2 with
 * LUCID_BN_COOP=0; see nn_norm.cuh); 1 without dx), eval backward 1
 * (dx) or 2 with dweight/dbias, the per-channel sum 1.
 *
 * Conv columns (the slot lucid_cuda_batchnorm2d_backward_dcols, nn.h
 * lucid_conv_dcols): when the dx of a one-pass call is the grad_output of a
 * 3x3 stride-1 conv on the im2col route, bn_grad_dx1_cols (bn_grad_dx1 with
 * EMIT) also stages each channel's dx planes in shared memory and writes
 * their im2col columns (nn_dcols.cuh) into the conv's scratch, so the
 * conv's backward-data skips its im2col; dx, dweight and dbias keep their
 * bits; one launch, as without.
 *
 * dy as a sum of terms (the slot lucid_cuda_batchnorm2d_backward_terms,
 * nn.h lucid_nn_batchnorm2d_backward_terms; LUCID_BN_DY_TERMS): when a
 * call would take the one-pass route, dy may be given as a gradient
 * description instead of a tensor (up to LUCID_BN_TERMS_PIECES channel
 * pieces, each the rounded sum of 1..LUCID_CHAN_SUM_MAX sources: whole
 * tensors or channel slices of wider ones), passed by value in the kernel
 * parameter; bn_grad_dx1_terms is bn_grad_dx1 whose dy vectors are summed
 * from the sources with chan_sum_multi's per-element arithmetic
 * (bn_dy_chan::load, read by the same part walks bn_grad_part_by /
 * bn_dx_part_by as a tensor's bn_dy_mem), so the bits equal a copy / sum launch into a buffer
 * followed by bn_grad_dx1 (the launch the Lua blocks no longer issue).
 * bn_grad_dx1 itself is unchanged.
 *
 * Fused BatchNorm2d + SiLU (lucid_cuda_batchnorm2d_silu_backward):
 * bn_grad_partial and bn_dx recompute z from x, the saved statistics,
 * weight and bias, and use g = dy * s * (1 + z*(1-s)) where the plain
 * kernels use dy (g never stored): 2 launches (grad partial+fold, dx)
 * instead of 3; with one part per channel bn_grad_dx1<..., true> does the
 * same in 1 launch.
 *
 * Per-channel sum (conv bias gradient): bn_grad_partial without x (sum dy
 * only) finished into the f32 [C] output with beta: out = beta*out +
 * sum(dy).
 * Source: PyTorch nn.BatchNorm2d docs; nn.SiLU docs.
 */
#include "nn_norm.cuh"
#include "nn_dcols.cuh"

static_assert(BN_PART == LUCID_DCOLS_MAX_NS, "the conv reserves columns for one-part channels");

// ----------------------------------------------------------------------------
// backward, and the per-channel sum

/* dL/dz of a = silu(z): dy * s * (1 + z*(1-s)) (the formula of silu_bwd). */
static __device__ __forceinline__ float bn_silu_grad(float dy, float z) {
    float s = nn_sigmoid(z);
    return dy * s * (1.0f + z * (1.0f - s));
}

/* (a, b) summed over the block in a fixed order (xor tree in each warp,
 * then warp 0 over the warps in index order); valid in thread 0.  sh: [32]
 * of the caller. */
static __device__ __forceinline__ void bn_block_sum2(float &a, float &b, float2 *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) sh[wid] = make_float2(a, b);
    __syncthreads();
    if (wid == 0) {
        float2 r = lane < BN_THREADS / 32 ? sh[lane] : make_float2(0.0f, 0.0f);
        a = r.x;
        b = r.y;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            a += __shfl_xor_sync(0xffffffffu, a, o);
            b += __shfl_xor_sync(0xffffffffu, b, o);
        }
    }
}

/* What the gradient finish writes: dweight/dbias with beta, and the dx
 * coefficients coef[c] = (k, mean(g), mean(g*xhat), 0); each nullable. */
typedef struct bn_grad_out {
    const float *w;      /* forward weight (k = w*invstd; NULL: 1) */
    const float *invstd; /* needed with coef */
    float *dweight, *dbias;
    double beta;
    float4 *coef;
} bn_grad_out;

/* Channel c's dx coefficients (k, mean(g), mean(g*xhat), 0) from its sums
 * (sum g, sum g*xhat) in f64. */
static __device__ __forceinline__ float4 bn_grad_coef_of(double sdy, double sdyx,
                                                         const bn_geom &g, float wc, float is) {
    double M = (double)g.N * (double)g.S;
    double k = (double)wc * (double)is;
    return make_float4((float)k, (float)(sdy / M), (float)(sdyx / M), 0.0f);
}

/* The same from the [C] tensors (w NULL: 1). */
static __device__ __forceinline__ float4 bn_grad_coef(double sdy, double sdyx,
                                                      const bn_geom &g, int64_t c,
                                                      const float *w, const float *invstd) {
    return bn_grad_coef_of(sdy, sdyx, g, w ? w[c] : 1.0f, invstd[c]);
}

/* Channel c's results from its sums (sum g, sum g*xhat) in f64 (one
 * thread). */
static __device__ void bn_grad_finish(double sdy, double sdyx, const bn_geom &g, int64_t c,
                                      const bn_grad_out &out) {
    double beta = out.beta;
    if (out.dweight)
        out.dweight[c] =
            (float)(beta != 0.0 ? sdyx + beta * (double)out.dweight[c] : sdyx);
    if (out.dbias)
        out.dbias[c] = (float)(beta != 0.0 ? sdy + beta * (double)out.dbias[c] : sdy);
    if (out.coef) out.coef[c] = bn_grad_coef(sdy, sdyx, g, c, out.w, out.invstd);
}

/* Channel c's sums from its `parts` (> 1) partials, f64 in the fixed order
 * of bn_stats_fold (thread t adds parts t, t+BN_THREADS, ... in that order,
 * then bn_block_sum64 of both sums at once); every thread of a BN_THREADS
 * block calls it, thread 0 gets (sum g, sum g*xhat) (bn_grad_fold_by with
 * the loader ld: ld.at(i), part i's (sum g, sum g*xhat), the same
 * expressions whatever the loader; bn_grad_fold_sums: from global memory,
 * bn_g_global; bn_grad_fold: and finishes).  The last block of
 * bn_grad_partial (whichever it is), the fallback bn_grad_final, every
 * block of bn_grad_dx_coop and every block of bn_grad_dx_clu (from the
 * shared memory of the cluster's blocks, bn_g_cluster) give the same
 * bits. */
struct bn_g_global {
    const float2 *pp;
    __device__ __forceinline__ float2 at(int64_t i) const { return __ldcg(pp + i); }
};

struct bn_g_cluster {
    bn_clu_parts<float2> c;
    __device__ __forceinline__ float2 at(int64_t i) const { return *c.at(i); }
};

template <typename L>
static __device__ void bn_grad_fold_by(const L &ld, int64_t parts, double *sdy, double *sdyx) {
    __shared__ double sh[2][32];
    double v[2] = {0.0, 0.0};
    for (int64_t i = threadIdx.x; i < parts; i += BN_THREADS) {
        float2 q = ld.at(i);
        v[0] += (double)q.x;
        v[1] += (double)q.y;
    }
    bn_block_sum64<2>(v, parts, sh);
    if (threadIdx.x != 0) return;
    *sdy = v[0];
    *sdyx = v[1];
}

static __device__ void bn_grad_fold_sums(const float2 *pp, int64_t parts, double *sdy,
                                         double *sdyx) {
    bn_grad_fold_by(bn_g_global{pp}, parts, sdy, sdyx);
}

static __device__ void bn_grad_fold(const float2 *pp, const bn_geom &g, int64_t c,
                                    const bn_grad_out &out) {
    double sdy = 0.0, sdyx = 0.0;
    bn_grad_fold_sums(pp, g.parts, &sdy, &sdyx);
    if (threadIdx.x == 0) bn_grad_finish(sdy, sdyx, g, c, out);
}

/* Where the part walks (bn_grad_part_by, bn_dx_part_by) read dy: a
 * V-element vector at walk position w, element e of the walk.  bn_dy_mem:
 * a tensor in memory (p + e: e counts from the pointer the caller gave);
 * bn_dy_chan (below): a gradient description's sources of one channel,
 * summed as chan_sum_multi would have written them (it reads w). */
template <typename T> struct bn_dy_mem {
    const T *__restrict__ p;
    template <int V>
    __device__ __forceinline__ typename bn_vec<T, V>::R load(const bn_walk &, int64_t e) const {
        return bn_vec<T, V>::load(p + e);
    }
};

/* One part's per-thread sums (before the block tree): *a = sum g, *bsum =
 * sum g*xhat (WITH_X), xhat = (x - mu)*is; g = dy, or SILU: dy * silu'(z),
 * z = fmaf(x, zs, zh).  dy: where dy is read (bn_dy_mem from the part's
 * first element in channel c, or a description's sources); xp: the part's
 * first element of x in channel c. */
template <typename T, int V, bool WITH_X, bool SILU, class DY, int U = BN_UNROLL>
static __device__ __forceinline__ void bn_grad_part_by(
    const DY &dy, const T *__restrict__ xp, const bn_part &pt, int64_t CS, float mu, float is,
    float zs, float zh, float *sa, float *sb, typename bn_vec<T, V>::R *keep_dy,
    typename bn_vec<T, V>::R *keep_x) {
    static_assert(U >= 1 && U <= BN_UNROLL, "U: 1..BN_UNROLL");
    /* the kept vectors are one round of BN_UNROLL (the held callers) */
    if (U != BN_UNROLL && (keep_dy != nullptr || keep_x != nullptr)) __trap();
    typedef bn_vec<T, V> Vt;
    typedef typename Vt::R R;
    float a = 0.0f, bsum = 0.0f;
    bn_walk wk = bn_walk_first(pt);
    while (wk.j < pt.total) {
        R rg[U], rx[U];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            ok[u] = wk.j < pt.total;
            rg[u] = R();
            rx[u] = R();
            if (ok[u]) {
                int64_t e = bn_walk_elem<V>(wk, CS);
                rg[u] = dy.template load<V>(wk, e);
                if (WITH_X) rx[u] = Vt::load(xp + e);
            }
            if (keep_dy) keep_dy[u] = rg[u];
            if (keep_x) keep_x[u] = rx[u];
            bn_walk_next(wk, pt);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (!ok[u]) break;
            float gv[V], xv[V];
            Vt::unpack(rg[u], gv);
            if (WITH_X) Vt::unpack(rx[u], xv);
#pragma unroll
            for (int k = 0; k < V; k++) {
                float gk = gv[k];
                if (SILU) gk = bn_silu_grad(gk, fmaf(xv[k], zs, zh));
                a += gk;
                if (WITH_X) {
                    float xh = (xv[k] - mu) * is;
                    bsum = fmaf(gk, xh, bsum);
                }
            }
        }
    }
    *sa = a;
    *sb = bsum;
}

/* bn_grad_part_by with dy read from memory: dyp, the part's first element
 * of dy in channel c. */
template <typename T, int V, bool WITH_X, bool SILU, int U = BN_UNROLL>
static __device__ __forceinline__ void bn_grad_part(
    const T *__restrict__ dyp, const T *__restrict__ xp, const bn_part &pt, int64_t CS,
    float mu, float is, float zs, float zh, float *sa, float *sb,
    typename bn_vec<T, V>::R *keep_dy = nullptr, typename bn_vec<T, V>::R *keep_x = nullptr) {
    bn_grad_part_by<T, V, WITH_X, SILU, bn_dy_mem<T>, U>(bn_dy_mem<T>{dyp}, xp, pt, CS, mu, is, zs,
                                                         zh, sa, sb, keep_dy, keep_x);
}

/* One block per (part, channel): (sum g, sum g*xhat) of the part (the
 * second only when WITH_X), g = dy, or SILU (needs WITH_X): g = dy *
 * silu'(z) with z recomputed from x (w, b: the forward's weight and bias,
 * nullable).  parts == 1: thread 0 finishes the channel.  Otherwise
 * partial[(c*parts + part)] = the sums; with count (the nn state's zeroed
 * arrival counters) the last block of channel c folds its partials
 * (bn_grad_fold); count NULL: bn_grad_final does, in a launch of its own. */
template <typename T, int V, bool WITH_X, bool SILU, int U = BN_UNROLL>
static __global__ void __launch_bounds__(BN_THREADS)
bn_grad_partial(const T *__restrict__ dy, const T *__restrict__ x, const float *mean,
                const float *invstd, const float *w, const float *b, bn_geom g,
                float2 *partial, unsigned int *count, bn_grad_out out) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    static_assert(WITH_X || !SILU, "the fused SiLU gradient needs x");
    __shared__ float2 sh[32];
    __shared__ int last;
    const int64_t part = blockIdx.x;
    const bn_part pt = bn_part_of<V>(g, part);
    for (int64_t c = blockIdx.y; c < g.C; c += gridDim.y) {
        const int64_t base = pt.base + c * g.S;
        const T *dyp = dy + base;
        const T *xp = WITH_X ? x + base : dy;
        float mu = WITH_X ? mean[c] : 0.0f, is = WITH_X ? invstd[c] : 0.0f;
        float zs = 0.0f, zh = 0.0f;
        if (SILU) bn_affine(c, mean, invstd, w, b, &zs, &zh);
        float a, bsum;
        bn_grad_part<T, V, WITH_X, SILU, U>(dyp, xp, pt, g.CS, mu, is, zs, zh, &a, &bsum);
        bn_block_sum2(a, bsum, sh);
        if (!WITH_X) bsum = 0.0f;
        if (g.parts == 1) {
            if (threadIdx.x == 0) bn_grad_finish((double)a, (double)bsum, g, c, out);
            continue;
        }
        /* thread 0: the one bn_arrive fences for */
        if (threadIdx.x == 0) partial[c * g.parts + part] = make_float2(a, bsum);
        if (count && bn_arrive(count + c, g.parts, &last))
            bn_grad_fold(partial + c * g.parts, g, c, out);
    }
}

/* Fallback (no counters, parts > 1): one block per channel folds its
 * partials. */
static __global__ void __launch_bounds__(BN_THREADS)
bn_grad_final(const float2 *partial, bn_geom g, bn_grad_out out) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int64_t c = blockIdx.y; c < g.C; c += gridDim.y)
        bn_grad_fold(partial + c * g.parts, g, c, out);
}

/* Training dx of one element before beta: k*(g - mdy - xhat*mdyx), xhat =
 * (x - mu)*is. */
static __device__ __forceinline__ float bn_dx_train(float g, float xq, float mu, float is,
                                                    float k, float mdy, float mdyx) {
    float xh = (xq - mu) * is;
    return k * (g - mdy - xh * mdyx);
}

/* One vector of the one-pass training dx (bn_grad_dx1): from dy, x and
 * (beta != 0) the old dx, with bn_dx<TRAIN>'s per-element arithmetic:
 * g = dy (SILU: dy * silu'(z), z = fmaf(x, zs, zh)), v = bn_dx_train(g,
 * ...), then fmaf(beta, dx, v). */
template <typename T, int V, bool SILU>
static __device__ __forceinline__ typename bn_vec<T, V>::R bn_dx1_vec(
    const typename bn_vec<T, V>::R &rg, const typename bn_vec<T, V>::R &rx,
    const typename bn_vec<T, V>::R &rd, float zs, float zh, float mu, float is, float4 q,
    float beta) {
    typedef bn_vec<T, V> Vt;
    float gv[V], xv[V], dv[V];
    Vt::unpack(rg, gv);
    Vt::unpack(rx, xv);
    if (beta != 0.0f) Vt::unpack(rd, dv);
#pragma unroll
    for (int k = 0; k < V; k++) {
        float gk = gv[k];
        if (SILU) gk = bn_silu_grad(gk, fmaf(xv[k], zs, zh));
        float v = bn_dx_train(gk, xv[k], mu, is, q.x, q.y, q.z);
        if (beta != 0.0f) v = fmaf(beta, dv[k], v);
        gv[k] = v;
    }
    return Vt::pack(gv);
}

/* dx = beta*dx + k*(g - mdy - xhat*mdyx)   (TRAIN)
 * dx = beta*dx + w*invstd*g                (eval)
 * g = dy, or SILU: dy * silu'(z), z recomputed from x (b: the forward's
 * bias, nullable).  Flat over the N*C*S/V vectors (bn_flat). */
template <typename T, int V, typename I, bool TRAIN, bool SILU, int U = BN_UNROLL>
static __global__ void __launch_bounds__(BN_THREADS)
bn_dx(const T *__restrict__ x, const T *__restrict__ dy, T *dx, bn_flat<I> f,
      const float *mean, const float *invstd, const float *w, const float *b,
      const float4 *coef, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    typedef bn_vec<T, V> Vt;
    typedef typename Vt::R R;
    const bool NX = TRAIN || SILU; /* x is read */
    bn_at<I> a = bn_at_first(f);
    while (a.j < f.nv) {
        R rg[U], rx[U], rd[U];
        I at[U];
        float k[U], mdy[U], mdyx[U], mu[U], is[U];
        float zs[U], zh[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            at[u] = a.j;
            rg[u] = R();
            rx[u] = R();
            rd[u] = R();
            k[u] = mdy[u] = mdyx[u] = mu[u] = is[u] = zs[u] = zh[u] = 0.0f;
            if (a.j < f.nv) {
                size_t e = (size_t)a.j * V;
                int64_t c = (int64_t)a.c;
                rg[u] = Vt::load(dy + e);
                if (NX) rx[u] = Vt::load(x + e);
                if (beta != 0.0f) rd[u] = Vt::load(dx + e);
                if (TRAIN) {
                    float4 q = coef[c];
                    k[u] = q.x;
                    mdy[u] = q.y;
                    mdyx[u] = q.z;
                    mu[u] = mean[c];
                    is[u] = invstd[c];
                } else {
                    k[u] = (w ? w[c] : 1.0f) * invstd[c];
                }
                if (SILU) bn_affine(c, mean, invstd, w, b, &zs[u], &zh[u]);
            }
            bn_at_next(a, f);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (at[u] >= f.nv) break;
            float gv[V], xv[V], dv[V];
            Vt::unpack(rg[u], gv);
            if (NX) Vt::unpack(rx[u], xv);
            if (beta != 0.0f) Vt::unpack(rd[u], dv);
#pragma unroll
            for (int q = 0; q < V; q++) {
                float g = gv[q];
                float xq = NX ? xv[q] : 0.0f;
                if (SILU) g = bn_silu_grad(g, fmaf(xq, zs[u], zh[u]));
                float v;
                if (TRAIN) {
                    v = bn_dx_train(g, xq, mu[u], is[u], k[u], mdy[u], mdyx[u]);
                } else {
                    v = k[u] * g;
                }
                if (beta != 0.0f) v = fmaf(beta, dv[q], v);
                gv[q] = v;
            }
            Vt::store(dx + (size_t)at[u] * V, Vt::pack(gv));
        }
    }
}

/* Stage dx vector v of the part walk's position w (one-part channels: part
 * 0 holds every plane, so plane q is image q) at stage[q*S + off*V]. */
template <typename T, int V>
static __device__ __forceinline__ void bn_stage_put(T *stage, const bn_walk &w,
                                                    const bn_geom &g,
                                                    const typename bn_vec<T, V>::R &v) {
    bn_vec<T, V>::store(stage + (size_t)w.q * (size_t)g.S + (size_t)w.off * V, v);
}

/* dx over one part of channel c with bn_dx<TRAIN>'s per-element
 * arithmetic (bn_dx1_vec with the channel's zs, zh, mu, is and
 * coefficients q; the old dx read only when beta != 0), walked like a part
 * (pa with VA-element vectors; base: the part's first element in channel c,
 * 64-bit plane offsets).  HELD (the part one round of the walk): from
 * hdy[u], hx[u], the vectors the gradient sums loaded at the same walk
 * positions; else dy and x are read again, BN_UNROLL vectors loaded before
 * any is stored (dy where DY reads it: bn_dy_mem at the tensor's element
 * base + walk offset, or a description's sources; unused when HELD). */
template <typename T, int VA, bool SILU, bool HELD, bool EMIT, class DY>
static __device__ __forceinline__ void bn_dx_part_by(
    const DY &dy, const T *__restrict__ x, T *dx, const bn_part &pa, int64_t base, int64_t CS,
    float zs, float zh, float mu, float is, float4 q, float beta,
    const typename bn_vec<T, VA>::R *hdy, const typename bn_vec<T, VA>::R *hx, T *stage,
    const bn_geom *g) {
    typedef bn_vec<T, VA> Vt;
    typedef typename Vt::R R;
    bn_walk wk = bn_walk_first(pa);
    if constexpr (HELD) { /* one round: dy and x are in hdy[], hx[] */
#pragma unroll
        for (int u = 0; u < BN_UNROLL; u++) {
            if (wk.j < pa.total) {
                const int64_t e = base + bn_walk_elem<VA>(wk, CS);
                const R rd = beta != 0.0f ? Vt::load(dx + e) : R();
                const R v = bn_dx1_vec<T, VA, SILU>(hdy[u], hx[u], rd, zs, zh, mu, is, q, beta);
                Vt::store(dx + e, v);
                if constexpr (EMIT) bn_stage_put<T, VA>(stage, wk, *g, v);
            }
            bn_walk_next(wk, pa);
        }
    } else {
        while (wk.j < pa.total) {
            R rg[BN_UNROLL], rx[BN_UNROLL], rd[BN_UNROLL];
            int64_t e[BN_UNROLL];
            bool ok[BN_UNROLL];
            [[maybe_unused]] bn_walk wu[BN_UNROLL]; /* EMIT: where each vector goes */
#pragma unroll
            for (int u = 0; u < BN_UNROLL; u++) {
                ok[u] = wk.j < pa.total;
                rg[u] = R();
                rx[u] = R();
                rd[u] = R();
                e[u] = 0;
                if constexpr (EMIT) wu[u] = wk;
                if (ok[u]) {
                    e[u] = base + bn_walk_elem<VA>(wk, CS);
                    rg[u] = dy.template load<VA>(wk, e[u]);
                    rx[u] = Vt::load(x + e[u]);
                    if (beta != 0.0f) rd[u] = Vt::load(dx + e[u]);
                }
                bn_walk_next(wk, pa);
            }
#pragma unroll
            for (int u = 0; u < BN_UNROLL; u++) {
                if (!ok[u]) break;
                const R v = bn_dx1_vec<T, VA, SILU>(rg[u], rx[u], rd[u], zs, zh, mu, is, q, beta);
                Vt::store(dx + e[u], v);
                if constexpr (EMIT) bn_stage_put<T, VA>(stage, wu[u], *g, v);
            }
        }
    }
}

/* bn_dx_part_by with dy read from memory (dy: the tensor, element base +
 * the walk's offset). */
template <typename T, int VA, bool SILU, bool HELD, bool EMIT = false>
static __device__ __forceinline__ void bn_dx_part(
    const T *__restrict__ dy, const T *__restrict__ x, T *dx, const bn_part &pa, int64_t base,
    int64_t CS, float zs, float zh, float mu, float is, float4 q, float beta,
    const typename bn_vec<T, VA>::R *hdy, const typename bn_vec<T, VA>::R *hx,
    T *stage = nullptr, const bn_geom *g = nullptr) {
    bn_dx_part_by<T, VA, SILU, HELD, EMIT>(bn_dy_mem<T>{dy}, x, dx, pa, base, CS, zs, zh, mu, is,
                                           q, beta, hdy, hx, stage, g);
}

/* Training backward with dx of channels of ONE part (g.parts == 1), the
 * gradient sums and dx in one launch (LUCID_BN_ONEPASS, see the header):
 * block c (grid.y, channels strided) computes channel c's (sum g, sum
 * g*xhat) exactly as bn_grad_partial<T, VS, true, SILU>'s one-part path
 * (bn_grad_part over part 0, bn_block_sum2, bn_grad_finish: dweight /
 * dbias with beta_params, out.coef unused); thread 0 hands the channel's
 * f32 dx coefficients (bn_grad_coef: those bn_grad_finish would store in
 * coef[c]) to the block through shared memory, and after the barrier the
 * block writes dx over the channel with bn_dx<TRAIN>'s per-element
 * arithmetic (bn_silu_grad, bn_dx_train, then beta: fmaf(beta, dx, v), dx
 * read only when beta != 0), VA-element vectors (bn_dx's vector choice).
 * HELD (VS == VA, one round of the walk; bn_held): dx is computed from the
 * dy and x vectors the sums loaded, still in registers (same bits).
 * EMIT (16-byte vectors, VS == VA): each dx vector is also staged in
 * shared memory (stage: N*S elements, bn_stage_put) and, after a barrier,
 * the block writes the channel's conv columns from it (bn_emit_cols, dc);
 * dx, dweight and dbias are those of EMIT false, bit for bit. */
template <typename T, int VS, int VA, bool SILU, bool HELD, bool EMIT>
static __device__ __forceinline__ void bn_grad_dx1_run(
    const T *__restrict__ dy, const T *__restrict__ x, T *dx, const float *mean,
    const float *invstd, const float *w, const float *b, const bn_geom &g,
    const bn_grad_out &out, float beta, T *stage, const bn_dcols &dc) {
    static_assert(!EMIT || (VS == VA && VA * sizeof(T) == 16),
                  "the columns are written from 16-byte dx vectors");
    typedef bn_vec<T, VA> Vt;
    typedef typename Vt::R R;
    __shared__ float2 sh[32];
    __shared__ float4 cf; /* channel c's (k, mean(g), mean(g*xhat), 0) */
    const bn_part ps = bn_part_of<VS>(g, 0), pa = bn_part_of<VA>(g, 0);
    for (int64_t c = blockIdx.y; c < g.C; c += gridDim.y) {
        float mu = mean[c], is = invstd[c];
        const float wcoef = out.w ? out.w[c] : 1.0f; /* the coefficient's weight, loaded early */
        float zs = 0.0f, zh = 0.0f;
        if (SILU) bn_affine(c, mean, invstd, w, b, &zs, &zh);
        float a, bsum;
        R hdy[BN_UNROLL], hx[BN_UNROLL];
        typedef typename bn_vec<T, VS>::R RS;
        bn_grad_part<T, VS, true, SILU>(dy + ps.base + c * g.S, x + ps.base + c * g.S, ps,
                                        g.CS, mu, is, zs, zh, &a, &bsum,
                                        HELD ? (RS *)hdy : nullptr, HELD ? (RS *)hx : nullptr);
        bn_block_sum2(a, bsum, sh);
        /* cf is rewritten only after the next channel's bn_block_sum2
         * barriers, which every thread reaches after reading it below */
        /* thread 0 hands the coefficients over first and accumulates
         * dweight / dbias (global read-modify-writes) after the barrier,
         * while the block writes dx: the same values, written later */
        if (threadIdx.x == 0) cf = bn_grad_coef_of((double)a, (double)bsum, g, wcoef, out.invstd[c]);
        __syncthreads();
        const float4 q = cf;
        if (threadIdx.x == 0) bn_grad_finish((double)a, (double)bsum, g, c, out);
        bn_dx_part<T, VA, SILU, HELD, EMIT>(dy, x, dx, pa, pa.base + c * g.S, g.CS, zs, zh, mu,
                                            is, q, beta, hdy, hx, stage, &g);
        if constexpr (EMIT) {
            __syncthreads(); /* the channel's dx planes are staged */
            bn_emit_cols<T>(stage, dc, g.N, g.C, g.S, c, threadIdx.x, BN_THREADS);
            __syncthreads(); /* the next channel's dx overwrites the stage */
        }
    }
}

/* The kernel of bn_grad_dx1_run (see there). */
template <typename T, int VS, int VA, bool SILU, bool HELD>
static __global__ void __launch_bounds__(BN_THREADS)
bn_grad_dx1(const T *__restrict__ dy, const T *__restrict__ x, T *dx, const float *mean,
            const float *invstd, const float *w, const float *b, bn_geom g, bn_grad_out out,
            float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    bn_grad_dx1_run<T, VS, VA, SILU, HELD, false>(dy, x, dx, mean, invstd, w, b, g, out, beta,
                                                  nullptr, bn_dcols());
}

/* bn_grad_dx1 that also writes the conv's backward-data columns of the dx
 * it computes (bn_emit_cols; nn.h lucid_conv_dcols): V-element vectors
 * (bn_width) for the sums and dx, N*S*sizeof(T) bytes of dynamic shared
 * memory (the channel's dx planes). */
template <typename T, bool SILU, bool HELD>
static __global__ void __launch_bounds__(BN_THREADS)
bn_grad_dx1_cols(const T *__restrict__ dy, const T *__restrict__ x, T *dx, const float *mean,
                 const float *invstd, const float *w, const float *b, bn_geom g,
                 bn_grad_out out, float beta, bn_dcols dc) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    extern __shared__ uint4 bn_cols_stage[];
    const int V = bn_width<T>::V;
    bn_grad_dx1_run<T, V, V, SILU, HELD, true>(dy, x, dx, mean, invstd, w, b, g, out, beta,
                                               reinterpret_cast<T *>(bn_cols_stage), dc);
}

/* Training backward with dx of channels of SEVERAL parts (g.parts > 1),
 * the gradient sums and dx in one cooperative launch (lucid_launch_coop;
 * LUCID_BN_COOP, see the header): the grid of bn_grad_partial (block
 * (part, c), channels strided by grid.y; grid.y may be below min(C,
 * 65535), bn_coop_rounds: a block then runs several channels in turn),
 * every block resident at once.
 * Block (part, c) computes its part's (sum g, sum g*xhat) exactly as
 * bn_grad_partial<T, VS, true, SILU> (bn_grad_part, bn_block_sum2) and
 * stores it in partial[c*parts + part]; bn_coop_wait holds it until every
 * part of channel c has stored its partial; then EVERY block of the channel
 * runs the fold (bn_grad_fold_sums, the same fixed order: the same f64 sums
 * in every block).  Part 0's thread 0 finishes the channel (bn_grad_finish:
 * dweight / dbias with beta_params, out.coef unused); every block takes the
 * f32 dx coefficients from bn_grad_coef (those bn_grad_finish would store
 * in coef[c]) and writes dx over its own part with bn_dx<TRAIN>'s
 * per-element arithmetic (bn_dx_part: bn_silu_grad, bn_dx_train, then
 * fmaf(beta, dx, v); VA-element vectors, bn_dx's vector choice), so every
 * output equals the two-launch route's bitwise.  HELD (VS == VA, each part
 * one round of the walk, bn_coop_held): dx from the dy and x vectors the
 * partial loaded, still in registers; else dy and x are read again.
 * count: the nn state's per-channel counters, zero at the start and again
 * at the end (bn_coop_wait).  The body of the kernels bn_grad_dx_coop and
 * bn_grad_dx_coop_lean (one block's work, every thread). */
template <typename T, int VS, int VA, bool SILU, bool HELD>
static __device__ __forceinline__ void bn_grad_dx_coop_body(
    const T *__restrict__ dy, const T *__restrict__ x, T *dx, const float *mean,
    const float *invstd, const float *w, const float *b, const bn_geom &g, float2 *partial,
    unsigned int *count, const bn_grad_out &out, float beta) {
    typedef bn_vec<T, VA> Vt;
    typedef typename Vt::R R;
    __shared__ float2 sh[32];
    __shared__ float4 cf; /* channel c's (k, mean(g), mean(g*xhat), 0) */
    static_assert(!HELD || VS == VA, "held vectors need one vector width");
    const int64_t part = blockIdx.x;
    const bn_part ps = bn_part_of<VS>(g, part), pa = bn_part_of<VA>(g, part);
    for (int64_t c = blockIdx.y; c < g.C; c += gridDim.y) {
        float mu = mean[c], is = invstd[c];
        const float wcoef = out.w ? out.w[c] : 1.0f; /* the coefficient's weight, loaded early */
        float zs = 0.0f, zh = 0.0f;
        if (SILU) bn_affine(c, mean, invstd, w, b, &zs, &zh);
        float a, bsum;
        R hdy[BN_UNROLL], hx[BN_UNROLL];
        typedef typename bn_vec<T, VS>::R RS;
        bn_grad_part<T, VS, true, SILU>(dy + ps.base + c * g.S, x + ps.base + c * g.S, ps,
                                        g.CS, mu, is, zs, zh, &a, &bsum,
                                        HELD ? (RS *)hdy : nullptr, HELD ? (RS *)hx : nullptr);
        bn_block_sum2(a, bsum, sh);
        float2 *pp = partial + c * g.parts;
        /* thread 0: the one bn_coop_wait fences for */
        if (threadIdx.x == 0) pp[part] = make_float2(a, bsum);
        bn_coop_wait(count + c, g.parts);
        double sdy = 0.0, sdyx = 0.0;
        bn_grad_fold_sums(pp, g.parts, &sdy, &sdyx);
        /* cf is rewritten only after the next channel's bn_block_sum2
         * barriers, which every thread reaches after reading it below */
        /* thread 0 hands the coefficients over first; part 0's thread 0
         * accumulates dweight / dbias after the barrier (same values) */
        if (threadIdx.x == 0) {
            cf = bn_grad_coef_of(sdy, sdyx, g, wcoef, out.invstd[c]);
        }
        __syncthreads();
        const float4 q = cf;
        if (threadIdx.x == 0 && part == 0) bn_grad_finish(sdy, sdyx, g, c, out);
        bn_dx_part<T, VA, SILU, HELD>(dy, x, dx, pa, pa.base + c * g.S, g.CS, zs, zh, mu, is, q,
                                      beta, hdy, hx);
    }
}

/* The cooperative training backward (bn_grad_dx_coop_body) as compiled
 * without a register cap. */
template <typename T, int VS, int VA, bool SILU, bool HELD>
static __global__ void __launch_bounds__(BN_THREADS)
bn_grad_dx_coop(const T *__restrict__ dy, const T *__restrict__ x, T *dx, const float *mean,
                const float *invstd, const float *w, const float *b, bn_geom g,
                float2 *partial, unsigned int *count, bn_grad_out out, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    bn_grad_dx_coop_body<T, VS, VA, SILU, HELD>(dy, x, dx, mean, invstd, w, b, g, partial, count,
                                                out, beta);
}

/* The same with BN_COOP_LEAN blocks per SM asked of the compiler (at most
 * 64 registers, at the price of some spills to local memory), so that a
 * grid of up to BN_COOP_LEAN blocks per SM is co-resident (N=4 on 132
 * SMs: the 512 blocks of 32x160x160, 16 parts of 32 channels, and layer
 * 0's 16x320x320 in 2 rounds of 8 columns of 52 parts, 416 blocks); the
 * same arithmetic. */
template <typename T, int VS, int VA, bool SILU, bool HELD>
static __global__ void __launch_bounds__(BN_THREADS, BN_COOP_LEAN)
bn_grad_dx_coop_lean(const T *__restrict__ dy, const T *__restrict__ x, T *dx,
                     const float *mean, const float *invstd, const float *w, const float *b,
                     bn_geom g, float2 *partial, unsigned int *count, bn_grad_out out,
                     float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    bn_grad_dx_coop_body<T, VS, VA, SILU, HELD>(dy, x, dx, mean, invstd, w, b, g, partial, count,
                                                out, beta);
}

/* Training backward with dx of channels of SEVERAL parts (g.parts > 1),
 * the gradient sums and dx in one launch on thread-block clusters
 * (lucid_launch_cluster; LUCID_BN_CLUSTER, see the header): grid (cs, gy),
 * clusters (cs, 1, 1), the cs blocks of a grid row one cluster sharing its
 * channels c = y, y + gy, ... (gy <= min(C, 65535), bn_clu_columns).  The
 * block of cluster rank r (= blockIdx.x) computes the (sum g, sum g*xhat)
 * of parts r, r + cs, r + 2cs, ... of channel c exactly as
 * bn_grad_partial<T, VS, true, SILU> (bn_grad_part, bn_block_sum2) and
 * keeps each in its own shared memory, slot (part / cs) of mine[parity of
 * the channel's turn]; after the cluster barrier EVERY block folds the
 * channel's partials in part order from the blocks that hold them
 * (distributed shared memory, bn_g_cluster) with the fold of the other
 * routes (bn_grad_fold_by: the same f64 sums in every block).  The block
 * of rank 0 (part 0) finishes the channel (bn_grad_finish: dweight / dbias
 * with beta_params, out.coef unused); every block takes the f32 dx
 * coefficients from bn_grad_coef_of (those bn_grad_finish would store in
 * coef[c]) and writes dx over its own parts with bn_dx<TRAIN>'s
 * per-element arithmetic (bn_dx_part: bn_silu_grad, bn_dx_train, then
 * fmaf(beta, dx, v); VA-element vectors, bn_dx's vector choice), so every
 * output equals the two-launch route's bitwise.  HELD (VS == VA, one part
 * per block, and that part one round of the walk, bn_coop_held): dx from
 * the dy and x vectors the partial loaded, still in registers; else dy and
 * x are read again.  The shared memory's lifetime is kept as in
 * bn_stats_apply_clu (two partial buffers, an arrive after the last fold's
 * reads and a wait before the exit); no arena, no counters. */
template <typename T, int VS, int VA, bool SILU, bool HELD>
static __global__ void __launch_bounds__(BN_THREADS)
bn_grad_dx_clu(const T *__restrict__ dy, const T *__restrict__ x, T *dx, const float *mean,
               const float *invstd, const float *w, const float *b, bn_geom g,
               bn_grad_out out, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    typedef bn_vec<T, VA> Vt;
    typedef typename Vt::R R;
    typedef typename bn_vec<T, VS>::R RS;
    __shared__ float2 sh[32];
    __shared__ float4 cf;                     /* channel c's (k, mean(g), mean(g*xhat), 0) */
    __shared__ float2 mine[2][BN_CLU_ROUNDS]; /* this block's partials */
    static_assert(!HELD || VS == VA, "held vectors need one vector width");
    const unsigned rank = blockIdx.x, cs = gridDim.x; /* the cluster spans grid.x */
    int buf = 0;
    for (int64_t c = blockIdx.y; c < g.C; c += gridDim.y, buf ^= 1) {
        float mu = mean[c], is = invstd[c];
        const float wcoef = out.w ? out.w[c] : 1.0f; /* the coefficient's weight, loaded early */
        float zs = 0.0f, zh = 0.0f;
        if (SILU) bn_affine(c, mean, invstd, w, b, &zs, &zh);
        R hdy[BN_UNROLL], hx[BN_UNROLL];
        int k = 0;
        for (int64_t part = rank; part < g.parts; part += cs, k++) {
            const bn_part ps = bn_part_of<VS>(g, part);
            float a, bsum;
            bn_grad_part<T, VS, true, SILU>(dy + ps.base + c * g.S, x + ps.base + c * g.S, ps,
                                            g.CS, mu, is, zs, zh, &a, &bsum,
                                            HELD ? (RS *)hdy : nullptr,
                                            HELD ? (RS *)hx : nullptr);
            bn_block_sum2(a, bsum, sh);
            if (threadIdx.x == 0) mine[buf][k] = make_float2(a, bsum);
        }
        bn_clu_sync(); /* every partial of channel c stored, in every block */
        double sdy = 0.0, sdyx = 0.0;
        bn_grad_fold_by(bn_g_cluster{{&mine[buf][0], cs}}, g.parts, &sdy, &sdyx);
        /* this block's last reads of its peers' shared memory are done */
        if (c + gridDim.y >= g.C) bn_clu_arrive();
        /* cf is rewritten only after the next channel's bn_block_sum2
         * barriers, which every thread reaches after reading it below;
         * thread 0 hands the coefficients over first, rank 0's thread 0
         * accumulates dweight / dbias after the barrier (same values) */
        if (threadIdx.x == 0) cf = bn_grad_coef_of(sdy, sdyx, g, wcoef, out.invstd[c]);
        __syncthreads();
        const float4 q = cf;
        if (threadIdx.x == 0 && rank == 0) bn_grad_finish(sdy, sdyx, g, c, out);
        for (int64_t part = rank; part < g.parts; part += cs) {
            const bn_part pa = bn_part_of<VA>(g, part);
            bn_dx_part<T, VA, SILU, HELD>(dy, x, dx, pa, pa.base + c * g.S, g.CS, zs, zh, mu, is,
                                          q, beta, hdy, hx);
        }
    }
    bn_clu_wait(); /* every peer has read this block's partials */
}

template <typename T, bool TRAIN, bool SILU>
static void bn_launch_dx(int route, unsigned grid, int64_t N, int64_t C, int64_t S,
                         cudaStream_t stream, const T *x, const T *dy, T *dx,
                         const float *mean, const float *invstd, const float *w,
                         const float *b, const float4 *coef, float beta) {
    const int VV = bn_width<T>::V;
    int64_t NCS = N * C * S;
    if (route == BN_ROUTE_VEC)
        lucid_launch(bn_by_unroll(bn_dx<T, VV, uint32_t, TRAIN, SILU, 1>,
                                  bn_dx<T, VV, uint32_t, TRAIN, SILU, 2>,
                                  bn_dx<T, VV, uint32_t, TRAIN, SILU, 4>),
                     dim3(grid), dim3(BN_THREADS), 0, stream, x, dy, dx,
                     bn_flat_of<uint32_t>(NCS, C, S, VV, grid), mean, invstd, w, b, coef, beta);
    else if (route == BN_ROUTE_SCALAR)
        lucid_launch(bn_dx<T, 1, uint32_t, TRAIN, SILU>, dim3(grid), dim3(BN_THREADS), 0,
                     stream, x, dy, dx, bn_flat_of<uint32_t>(NCS, C, S, 1, grid), mean,
                     invstd, w, b, coef, beta);
    else
        lucid_launch(bn_dx<T, 1, uint64_t, TRAIN, SILU>, dim3(grid), dim3(BN_THREADS), 0,
                     stream, x, dy, dx, bn_flat_of<uint64_t>(NCS, C, S, 1, grid), mean,
                     invstd, w, b, coef, beta);
}

/* The gradient sums' launch: g = dy (WITH_X: also g*xhat), or the fused
 * SiLU's g; vec: the vector path. */
template <typename T, bool WITH_X, bool SILU>
static void bn_launch_grad(bool vec, dim3 grid, cudaStream_t stream, const T *dy,
                           const T *x, const float *mean, const float *invstd,
                           const float *w, const float *b, const bn_geom &g,
                           float2 *partial, unsigned int *count, const bn_grad_out &go) {
    const int V = bn_width<T>::V;
    if (vec)
        lucid_launch(bn_by_unroll(bn_grad_partial<T, V, WITH_X, SILU, 1>,
                                  bn_grad_partial<T, V, WITH_X, SILU, 2>,
                                  bn_grad_partial<T, V, WITH_X, SILU, 4>),
                     grid, dim3(BN_THREADS), 0, stream, dy, x, mean, invstd, w, b, g, partial,
                     count, go);
    else
        lucid_launch(bn_grad_partial<T, 1, WITH_X, SILU>, grid, dim3(BN_THREADS), 0, stream,
                     dy, x, mean, invstd, w, b, g, partial, count, go);
}

/* The one-pass training backward's launch (parts == 1, dx asked): vs, the
 * gradient sums' vector path (bn_grad_partial's choice), va, dx's (route
 * BN_ROUTE_VEC; va implies vs). */
template <typename T, bool SILU>
static void bn_launch_grad_dx1(bool vs, bool va, dim3 grid, cudaStream_t stream, const T *dy,
                               const T *x, T *dx, const float *mean, const float *invstd,
                               const float *w, const float *b, const bn_geom &g,
                               const bn_grad_out &go, float beta) {
    const int VV = bn_width<T>::V;
    if (vs && va && bn_held(g, VV))
        lucid_launch(bn_grad_dx1<T, VV, VV, SILU, true>, grid, dim3(BN_THREADS), 0, stream, dy, x,
                     dx, mean, invstd, w, b, g, go, beta);
    else if (vs && va)
        lucid_launch(bn_grad_dx1<T, VV, VV, SILU, false>, grid, dim3(BN_THREADS), 0, stream, dy,
                     x, dx, mean, invstd, w, b, g, go, beta);
    else if (vs)
        lucid_launch(bn_grad_dx1<T, VV, 1, SILU, false>, grid, dim3(BN_THREADS), 0, stream, dy,
                     x, dx, mean, invstd, w, b, g, go, beta);
    else
        lucid_launch(bn_grad_dx1<T, 1, 1, SILU, false>, grid, dim3(BN_THREADS), 0, stream, dy, x,
                     dx, mean, invstd, w, b, g, go, beta);
}

/* One candidate of the cooperative training backward with dx (parts > 1),
 * visited for the choice s (bn_coop_visit: its occupancy cached in this
 * instantiation's static): in the launch pass, queued with
 * lucid_launch_coop on the grid (parts, gy) the choice gives it
 * (bn_coop_queued; the launch's own error is left for CUDA_CHECK_LAUNCH,
 * except a refusal for size).  LEAN: bn_grad_dx_coop_lean.  Returns the
 * occupancy query's error. */
template <typename T, int VS, int VA, bool SILU, bool HELD, bool LEAN>
static cudaError_t bn_try_grad_dx_coop(bn_coop_sel *s, cudaStream_t stream, const T *dy,
                                       const T *x, T *dx, const float *mean,
                                       const float *invstd, const float *w, const float *b,
                                       const bn_geom &g, float2 *partial, unsigned int *count,
                                       const bn_grad_out &go, float beta) {
    static std::atomic<int> per_sm(-1);
    auto k = LEAN ? bn_grad_dx_coop_lean<T, VS, VA, SILU, HELD>
                  : bn_grad_dx_coop<T, VS, VA, SILU, HELD>;
    dim3 grid;
    bool run = false;
    cudaError_t e = bn_coop_visit((const void *)k, &per_sm, s, &grid, &run);
    if (e != cudaSuccess || !run) return e;
    e = lucid_launch_coop(k, grid, dim3(BN_THREADS), 0, stream, dy, x, dx, mean, invstd, w, b, g,
                          partial, count, go, beta);
    bn_coop_queued(s, e, &per_sm, grid);
    return cudaSuccess;
}

/* One vector choice of the cooperative training backward (vector dx):
 * the variant without a register cap, then the BN_COOP_LEAN one (more
 * blocks per SM); a launched one ends the visit. */
template <typename T, int VS, int VA, bool SILU, bool HELD>
static cudaError_t bn_try_grad_dx_coop2(bn_coop_sel *s, cudaStream_t stream, const T *dy,
                                        const T *x, T *dx, const float *mean,
                                        const float *invstd, const float *w, const float *b,
                                        const bn_geom &g, float2 *partial, unsigned int *count,
                                        const bn_grad_out &go, float beta) {
    cudaError_t e = bn_try_grad_dx_coop<T, VS, VA, SILU, HELD, false>(
        s, stream, dy, x, dx, mean, invstd, w, b, g, partial, count, go, beta);
    if (e != cudaSuccess || s->launched) return e;
    return bn_try_grad_dx_coop<T, VS, VA, SILU, HELD, true>(s, stream, dy, x, dx, mean, invstd,
                                                            w, b, g, partial, count, go, beta);
}

/* The candidates of the cooperative training backward in their order (vs
 * / va as for bn_launch_grad_dx1, held: the vectors may stay in registers,
 * bn_coop_held): the held variants when asked for (uncapped, lean), then
 * those that read dy and x again (the one vector choice vs / va allow;
 * uncapped, lean for a vector dx); a launched one ends the visit. */
template <typename T, bool SILU>
static cudaError_t bn_visit_grad_dx_coop(bool vs, bool va, bool held, bn_coop_sel *s,
                                         cudaStream_t stream, const T *dy, const T *x, T *dx,
                                         const float *mean, const float *invstd, const float *w,
                                         const float *b, const bn_geom &g, float2 *partial,
                                         unsigned int *count, const bn_grad_out &go,
                                         float beta) {
    const int VV = bn_width<T>::V;
    if (vs && va && held) {
        cudaError_t e = bn_try_grad_dx_coop2<T, VV, VV, SILU, true>(
            s, stream, dy, x, dx, mean, invstd, w, b, g, partial, count, go, beta);
        if (e != cudaSuccess || s->launched) return e;
    }
    if (vs && va)
        return bn_try_grad_dx_coop2<T, VV, VV, SILU, false>(s, stream, dy, x, dx, mean, invstd,
                                                            w, b, g, partial, count, go, beta);
    /* scalar dx (a misaligned or odd-sized tensor, not the training
     * step's shapes): no lean copies */
    if (vs)
        return bn_try_grad_dx_coop<T, VV, 1, SILU, false, false>(
            s, stream, dy, x, dx, mean, invstd, w, b, g, partial, count, go, beta);
    return bn_try_grad_dx_coop<T, 1, 1, SILU, false, false>(s, stream, dy, x, dx, mean, invstd,
                                                            w, b, g, partial, count, go, beta);
}

/* The cooperative training backward's launch (parts > 1, dx asked): the
 * candidate needing the fewest rounds (bn_coop_choose; the first in order
 * among equals), on its grid (parts, gy).  s->launched false: none is
 * co-resident even with one channel column, or none within the rounds
 * LUCID_BN_COOP_LOOP allows (the caller takes the two-launch route).
 * Returns the occupancy queries' first error. */
template <typename T, bool SILU>
static cudaError_t bn_launch_grad_dx_coop(bool vs, bool va, bool held, bn_coop_sel *s,
                                          cudaStream_t stream, const T *dy, const T *x, T *dx,
                                          const float *mean, const float *invstd,
                                          const float *w, const float *b, const bn_geom &g,
                                          float2 *partial, unsigned int *count,
                                          const bn_grad_out &go, float beta) {
    return bn_coop_choose(s, [&]() {
        return bn_visit_grad_dx_coop<T, SILU>(vs, va, held, s, stream, dy, x, dx, mean, invstd,
                                              w, b, g, partial, count, go, beta);
    });
}

/* One candidate of the cluster training backward with dx (parts > 1) for
 * clusters of cs blocks (rounds: the most parts a block computes): when
 * its kernel runs such clusters (bn_clu_fits, cached in this
 * instantiation's static), queued with lucid_launch_cluster on the grid
 * (cs, s->gy) (bn_clu_queued; the launch's own error is left for
 * CUDA_CHECK_LAUNCH, except a refusal of the cluster size).  Returns the
 * queries' error. */
template <typename T, int VS, int VA, bool SILU, bool HELD>
static cudaError_t bn_try_grad_dx_clu(bn_clu_sel *s, unsigned cs, unsigned rounds,
                                      cudaStream_t stream, const T *dy, const T *x, T *dx,
                                      const float *mean, const float *invstd, const float *w,
                                      const float *b, const bn_geom &g, const bn_grad_out &go,
                                      float beta) {
    static bn_clu_cache cache;
    auto k = bn_grad_dx_clu<T, VS, VA, SILU, HELD>;
    bool fits = false;
    cudaError_t e = bn_clu_fits((const void *)k, &cache, cs, s->capturing, &fits);
    if (e != cudaSuccess || !fits) return e;
    e = lucid_launch_cluster(k, dim3(cs, s->gy), dim3(BN_THREADS), 0, stream, cs, dy, x, dx,
                             mean, invstd, w, b, g, go, beta);
    bn_clu_queued(s, e, &cache, cs, rounds);
    return cudaSuccess;
}

/* The cluster training backward's launch (parts > 1, dx asked; vs / va as
 * for bn_launch_grad_dx1, held: the vectors may stay in registers,
 * bn_coop_held): for each cluster size of bn_clu_choose, the held kernel
 * when a block holds one part (rounds 1) and held, then the kernel reading
 * dy and x again (the one vector choice vs / va allow).  s->launched false:
 * no candidate runs (the caller takes the cooperative or two-launch
 * route).  Returns the queries' first error. */
template <typename T, bool SILU>
static cudaError_t bn_launch_grad_dx_clu(bool vs, bool va, bool held, bn_clu_sel *s,
                                         cudaStream_t stream, const T *dy, const T *x, T *dx,
                                         const float *mean, const float *invstd, const float *w,
                                         const float *b, const bn_geom &g,
                                         const bn_grad_out &go, float beta) {
    const int VV = bn_width<T>::V;
    return bn_clu_choose(s, [&](unsigned cs, unsigned rounds) -> cudaError_t {
        if (vs && va && held && rounds == 1) {
            cudaError_t e = bn_try_grad_dx_clu<T, VV, VV, SILU, true>(
                s, cs, rounds, stream, dy, x, dx, mean, invstd, w, b, g, go, beta);
            if (e != cudaSuccess || s->launched) return e;
        }
        if (vs && va)
            return bn_try_grad_dx_clu<T, VV, VV, SILU, false>(s, cs, rounds, stream, dy, x, dx,
                                                              mean, invstd, w, b, g, go, beta);
        if (vs)
            return bn_try_grad_dx_clu<T, VV, 1, SILU, false>(s, cs, rounds, stream, dy, x, dx,
                                                             mean, invstd, w, b, g, go, beta);
        return bn_try_grad_dx_clu<T, 1, 1, SILU, false>(s, cs, rounds, stream, dy, x, dx, mean,
                                                        invstd, w, b, g, go, beta);
    });
}

/* The dtype checks of every training / eval backward entry: the activation
 * dtype dt (nn_check_act) and the f32 parameter-side tensors (weight, bias,
 * save_mean, save_invstd, grad_weight, grad_bias; NULL ones pass), each
 * error naming op and the tensor. */
static lucid_status bn_backward_check(lucid_ctx *ctx, const char *op, lucid_dtype dt,
                                      const lucid_tensor *weight, const lucid_tensor *bias,
                                      const lucid_tensor *save_mean,
                                      const lucid_tensor *save_invstd,
                                      const lucid_tensor *dweight, const lucid_tensor *dbias) {
    LUCID_TRY(nn_check_act(ctx, op, dt));
    LUCID_TRY(nn_check_f32(ctx, op, "weight", weight));
    LUCID_TRY(nn_check_f32(ctx, op, "bias", bias));
    LUCID_TRY(nn_check_f32(ctx, op, "save_mean", save_mean));
    LUCID_TRY(nn_check_f32(ctx, op, "save_invstd", save_invstd));
    LUCID_TRY(nn_check_f32(ctx, op, "grad_weight", dweight));
    LUCID_TRY(nn_check_f32(ctx, op, "grad_bias", dbias));
    return LUCID_OK;
}

static lucid_status bn_backward(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, const lucid_tensor *weight, const lucid_tensor *bias,
    const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
    lucid_tensor *dweight, lucid_tensor *dbias, int training,
    double beta_input, double beta_params, bool silu) {
    const char *op = silu ? "batchnorm2d_silu_backward" : "batchnorm2d_backward";
    LUCID_TRY(bn_backward_check(ctx, op, x->dtype, weight, bias, save_mean, save_invstd, dweight,
                                dbias));
    CUDA_ENTER(ctx, st);
    int64_t N = x->shape[0], C = x->shape[1], S = x->shape[2] * x->shape[3];
    if (N * C * S == 0) return LUCID_OK;
    const void *xd = lucid_tensor_data(x), *dyd = lucid_tensor_data(dy);
    const float *sm = (const float *)lucid_tensor_data(save_mean);
    const float *si = (const float *)lucid_tensor_data(save_invstd);
    const float *w = weight ? (const float *)lucid_tensor_data(weight) : NULL;
    const float *b = (silu && bias) ? (const float *)lucid_tensor_data(bias) : NULL;
    bool need_sums = dweight || dbias || (dx && training);
    float4 *coef = NULL;
    if (need_sums) {
        lucid_cuda_nn_state *ns = lucid_cuda_nn_get(ctx, st);
        if (!ns) return ctx->last_status;
        bn_geom g = bn_geom_of(N, C, S);
        if (g.parts > INT32_MAX)
            return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: batch too large", op);
        size_t pbytes = nn_align(sizeof(float2) * (size_t)(g.parts * C));
        void *ws = NULL;
        LUCID_TRY(lucid_cuda_nn_arena(ctx, st, ns,
                                      pbytes + sizeof(float4) * (size_t)C, op,
                                      &ws));
        unsigned int *count = NULL; /* NULL: the two-launch fallback */
        LUCID_TRY(lucid_cuda_nn_counters(ctx, st, ns, C, &count));
        float2 *part = (float2 *)ws;
        coef = (dx && training) ? (float4 *)((char *)ws + pbytes) : NULL;
        bn_grad_out go;
        go.w = w;
        go.invstd = si;
        go.dweight = dweight ? (float *)lucid_tensor_data(dweight) : NULL;
        go.dbias = dbias ? (float *)lucid_tensor_data(dbias) : NULL;
        go.beta = beta_params;
        go.coef = coef;
        dim3 grid((unsigned)g.parts, bn_grid_y(C));
        bool with_x = dweight || (dx && training);
        /* x and dy decide, whatever is asked: the same partition (bits) for
         * every subset of the outputs */
        bool vec = bn_use_vec(x->dtype, S, xd, dyd, NULL);
        const float *nof = NULL;
        if (dx && training && g.parts == 1 && bn_onepass()) {
            /* one part per channel: the sums and dx in one launch; the
             * coefficients stay in shared memory */
            void *dxd = lucid_tensor_data(dx);
            bool va = bn_route(x->dtype, N * C * S, S, xd, dyd, dxd) == BN_ROUTE_VEC;
            float bi = (float)beta_input;
            go.coef = NULL;
            if (silu)
                NN_DISPATCH(x->dtype, (bn_launch_grad_dx1<T, true>(
                                          vec, va, grid, st->stream, (const T *)dyd,
                                          (const T *)xd, (T *)dxd, sm, si, w, b, g, go, bi)));
            else
                NN_DISPATCH(x->dtype, (bn_launch_grad_dx1<T, false>(
                                          vec, va, grid, st->stream, (const T *)dyd,
                                          (const T *)xd, (T *)dxd, sm, si, nof, nof, g, go,
                                          bi)));
            CUDA_CHECK_LAUNCH(ctx, "bn_grad_dx1");
            lucid_cuda_bn_launches += 1;
            return LUCID_OK;
        }
        if (dx && training && g.parts > 1) {
            /* several parts per channel: the sums and dx in one launch on
             * thread-block clusters (a cluster per channel row); the
             * coefficients stay in shared memory */
            bool clu = false;
            LUCID_TRY(bn_cluster_on(ctx, ns, st->device, op, &clu));
            if (clu) {
                bool capturing = false;
                cudaError_t e = bn_capturing(st->stream, &capturing);
                if (e != cudaSuccess)
                    return lucid_cuda_err(ctx, e, "cudaStreamIsCapturing (bn_grad_dx_clu)",
                                          __FILE__, __LINE__);
                void *dxd = lucid_tensor_data(dx);
                bool va = bn_route(x->dtype, N * C * S, S, xd, dyd, dxd) == BN_ROUTE_VEC;
                bool held =
                    vec && va && bn_coop_held(g, 16 / (int64_t)lucid_dtype_size(x->dtype));
                float bi = (float)beta_input;
                bn_grad_out gc = go;
                gc.coef = NULL;
                bn_clu_sel cl = bn_clu_sel_of(g, capturing);
                if (silu)
                    NN_DISPATCH(x->dtype, (e = bn_launch_grad_dx_clu<T, true>(
                                               vec, va, held, &cl, st->stream, (const T *)dyd,
                                               (const T *)xd, (T *)dxd, sm, si, w, b, g, gc,
                                               bi)));
                else
                    NN_DISPATCH(x->dtype, (e = bn_launch_grad_dx_clu<T, false>(
                                               vec, va, held, &cl, st->stream, (const T *)dyd,
                                               (const T *)xd, (T *)dxd, sm, si, nof, nof, g, gc,
                                               bi)));
                if (e != cudaSuccess)
                    return lucid_cuda_err(ctx, e, "cudaOccupancyMaxActiveClusters"
                                          " (bn_grad_dx_clu)", __FILE__, __LINE__);
                if (cl.launched) {
                    CUDA_CHECK_LAUNCH(ctx, "bn_grad_dx_clu");
                    bn_clu_note(cl);
                    return LUCID_OK;
                }
            }
        }
        if (dx && training && g.parts > 1 && count && bn_coop_env() &&
            bn_coop_device(st->device)) {
            /* several parts per channel: the sums and dx in one cooperative
             * launch when a grid is co-resident (a column per channel, or
             * fewer columns in rounds); the coefficients stay in shared
             * memory */
            void *dxd = lucid_tensor_data(dx);
            bool va = bn_route(x->dtype, N * C * S, S, xd, dyd, dxd) == BN_ROUTE_VEC;
            bool held = vec && va && bn_coop_held(g, 16 / (int64_t)lucid_dtype_size(x->dtype));
            float bi = (float)beta_input;
            bn_grad_out gc = go;
            gc.coef = NULL;
            bn_coop_sel cs = bn_coop_sel_of(g, st->sm_count);
            cudaError_t e = cudaSuccess;
            if (silu)
                NN_DISPATCH(x->dtype, (e = bn_launch_grad_dx_coop<T, true>(
                                           vec, va, held, &cs, st->stream, (const T *)dyd,
                                           (const T *)xd, (T *)dxd, sm, si, w, b, g, part,
                                           count, gc, bi)));
            else
                NN_DISPATCH(x->dtype, (e = bn_launch_grad_dx_coop<T, false>(
                                           vec, va, held, &cs, st->stream, (const T *)dyd,
                                           (const T *)xd, (T *)dxd, sm, si, nof, nof, g, part,
                                           count, gc, bi)));
            if (e != cudaSuccess)
                return lucid_cuda_err(ctx, e, "cudaOccupancyMaxActiveBlocksPerMultiprocessor"
                                      " (bn_grad_dx_coop)", __FILE__, __LINE__);
            if (cs.launched) {
                CUDA_CHECK_LAUNCH(ctx, "bn_grad_dx_coop");
                bn_coop_note(cs);
                return LUCID_OK;
            }
        }
        if (silu) /* g needs x whatever is asked */
            NN_DISPATCH(x->dtype, (bn_launch_grad<T, true, true>(
                                      vec, grid, st->stream, (const T *)dyd, (const T *)xd,
                                      sm, si, w, b, g, part, count, go)));
        else if (with_x)
            NN_DISPATCH(x->dtype, (bn_launch_grad<T, true, false>(
                                      vec, grid, st->stream, (const T *)dyd, (const T *)xd,
                                      sm, si, nof, nof, g, part, count, go)));
        else
            NN_DISPATCH(x->dtype, (bn_launch_grad<T, false, false>(
                                      vec, grid, st->stream, (const T *)dyd, (const T *)NULL,
                                      sm, si, nof, nof, g, part, count, go)));
        CUDA_CHECK_LAUNCH(ctx, "bn_grad_partial");
        lucid_cuda_bn_launches += 1;
        if (!count && g.parts > 1) {
            lucid_launch(bn_grad_final, dim3(1, bn_grid_y(C)), dim3(BN_THREADS), 0,
                         st->stream, (const float2 *)part, g, go);
            CUDA_CHECK_LAUNCH(ctx, "bn_grad_final");
            lucid_cuda_bn_launches += 1;
        }
    }
    if (!dx) return LUCID_OK;
    void *dxd = lucid_tensor_data(dx);
    int route = bn_route(x->dtype, N * C * S, S, xd, dyd, dxd);
    int64_t nv = N * C * S / (route == BN_ROUTE_VEC ? 16 / (int64_t)lucid_dtype_size(x->dtype) : 1);
    unsigned grid = bn_flat_grid(nv, st->sm_count);
    float bi = (float)beta_input;
    const float4 *cf = coef;
    if (training && silu)
        NN_DISPATCH(x->dtype, (bn_launch_dx<T, true, true>(route, grid, N, C, S, st->stream,
                                                           (const T *)xd, (const T *)dyd,
                                                           (T *)dxd, sm, si, w, b, cf, bi)));
    else if (training)
        NN_DISPATCH(x->dtype, (bn_launch_dx<T, true, false>(route, grid, N, C, S, st->stream,
                                                            (const T *)xd, (const T *)dyd,
                                                            (T *)dxd, sm, si, w, b, cf, bi)));
    else if (silu)
        NN_DISPATCH(x->dtype, (bn_launch_dx<T, false, true>(route, grid, N, C, S, st->stream,
                                                            (const T *)xd, (const T *)dyd,
                                                            (T *)dxd, sm, si, w, b, cf, bi)));
    else
        NN_DISPATCH(x->dtype, (bn_launch_dx<T, false, false>(route, grid, N, C, S, st->stream,
                                                             (const T *)xd, (const T *)dyd,
                                                             (T *)dxd, sm, si, w, b, cf, bi)));
    CUDA_CHECK_LAUNCH(ctx, "bn_dx");
    lucid_cuda_bn_launches += 1;
    if (route == BN_ROUTE_WIDE) lucid_cuda_bn_wide_launches += 1;
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_batchnorm2d_backward(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, const lucid_tensor *weight,
    const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
    lucid_tensor *dweight, lucid_tensor *dbias, int training,
    double beta_input, double beta_params) {
    return bn_backward(ctx, x, dy, dx, weight, NULL, save_mean, save_invstd,
                       dweight, dbias, training, beta_input, beta_params, false);
}

extern "C" lucid_status lucid_cuda_batchnorm2d_silu_backward(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, const lucid_tensor *weight, const lucid_tensor *bias,
    const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
    lucid_tensor *dweight, lucid_tensor *dbias, int training,
    double beta_input, double beta_params) {
    return bn_backward(ctx, x, dy, dx, weight, bias, save_mean, save_invstd,
                       dweight, dbias, training, beta_input, beta_params, true);
}

// ----------------------------------------------------------------------------
// the one-pass backward that also writes a conv's backward-data columns

/* The columns' kernel (bn_grad_dx1_cols), held vectors or not (bn_held). */
template <typename T, bool SILU>
static cudaError_t bn_launch_grad_dx1_cols(dim3 grid, size_t smem, cudaStream_t stream,
                                           const T *dy, const T *x, T *dx, const float *mean,
                                           const float *invstd, const float *w, const float *b,
                                           const bn_geom &g, const bn_grad_out &go, float beta,
                                           const bn_dcols &dc) {
    if (bn_held(g, bn_width<T>::V))
        return lucid_launch(bn_grad_dx1_cols<T, SILU, true>, grid, dim3(BN_THREADS), smem,
                            stream, dy, x, dx, mean, invstd, w, b, g, go, beta, dc);
    return lucid_launch(bn_grad_dx1_cols<T, SILU, false>, grid, dim3(BN_THREADS), smem, stream,
                        dy, x, dx, mean, invstd, w, b, g, go, beta, dc);
}

/* The nn.h slot batchnorm2d_backward_dcols (an armed dc, dx given): the
 * one-pass training backward that also writes dc's columns (bn_grad_dx1_cols)
 * when the call takes the one-pass route with 16-byte vectors (training,
 * bf16/f16 of dc's dtype, x of dc's shape [N, C, H, W], one part per
 * channel, LUCID_BN_ONEPASS on, x, dy, dx and the columns 16-byte aligned,
 * S = H*W a multiple of 8) and the columns lie in this stream's scratch as
 * reserved (same stream, arena base, room): then dc->filled = 1 and dc->dy
 * = dx's data.  Otherwise exactly bn_backward (dc->filled = 0).  One
 * launch either way for the shapes that fuse; dx, dweight and dbias have
 * the bits of bn_backward. */
extern "C" lucid_status lucid_cuda_batchnorm2d_backward_dcols(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy, lucid_tensor *dx,
    const lucid_tensor *weight, const lucid_tensor *bias, const lucid_tensor *save_mean,
    const lucid_tensor *save_invstd, lucid_tensor *dweight, lucid_tensor *dbias, int training,
    double beta_input, double beta_params, int silu, lucid_conv_dcols *dc) {
    const char *op = silu ? "batchnorm2d_silu_backward" : "batchnorm2d_backward";
    dc->filled = 0;
    const lucid_tensor *bs = silu ? bias : NULL;
    const int64_t N = x->shape[0], C = x->shape[1], S = x->shape[2] * x->shape[3];
    const lucid_dtype dt = x->dtype;
    bool fits = dc->armed && dx && training && (dt == LUCID_BF16 || dt == LUCID_F16) &&
                dt == dc->dtype && N == dc->N && C == dc->C && x->shape[2] == dc->H &&
                x->shape[3] == dc->W && N * C * S > 0 && S % 8 == 0 && bn_onepass() &&
                bn_aligned16(dc->data) && dc->data &&
                (size_t)(N * S) * lucid_dtype_size(dt) <= (size_t)48 * 1024;
    bn_geom g = bn_geom_of(N, C, S);
    fits = fits && g.parts == 1;
    const void *xd = lucid_tensor_data(x), *dyd = lucid_tensor_data(dy);
    void *dxd = dx ? lucid_tensor_data(dx) : NULL;
    fits = fits && bn_use_vec(dt, S, xd, dyd, NULL) &&
           bn_route(dt, N * C * S, S, xd, dyd, dxd) == BN_ROUTE_VEC;
    if (!fits)
        return bn_backward(ctx, x, dy, dx, weight, bs, save_mean, save_invstd, dweight, dbias,
                           training, beta_input, beta_params, silu != 0);
    LUCID_TRY(bn_backward_check(ctx, op, dt, weight, bs, save_mean, save_invstd, dweight,
                                dbias));
    CUDA_ENTER(ctx, st);
    lucid_cuda_nn_state *ns = lucid_cuda_nn_get(ctx, st);
    if (!ns) return ctx->last_status;
    /* the columns must still be in this stream's scratch (no lane switch,
     * no growth since the reservation): else they would land in memory
     * another stream may use, or be read from a stale region */
    if (dc->stream != (const void *)st->stream || dc->base != ns->arena ||
        (const char *)dc->data != (const char *)dc->base + dc->off ||
        dc->off + dc->bytes > ns->arena_bytes)
        return bn_backward(ctx, x, dy, dx, weight, bs, save_mean, save_invstd, dweight, dbias,
                           training, beta_input, beta_params, silu != 0);
    const float *sm = (const float *)lucid_tensor_data(save_mean);
    const float *si = (const float *)lucid_tensor_data(save_invstd);
    const float *w = weight ? (const float *)lucid_tensor_data(weight) : NULL;
    const float *b = bs ? (const float *)lucid_tensor_data(bs) : NULL;
    const float *nof = NULL;
    bn_grad_out go;
    go.w = w;
    go.invstd = si;
    go.dweight = dweight ? (float *)lucid_tensor_data(dweight) : NULL;
    go.dbias = dbias ? (float *)lucid_tensor_data(dbias) : NULL;
    go.beta = beta_params;
    go.coef = NULL;
    bn_dcols d;
    d.col = dc->data;
    d.H = (int)dc->H;
    d.W = (int)dc->W;
    const dim3 grid(1, bn_grid_y(C));
    const size_t smem = (size_t)(N * S) * lucid_dtype_size(dt);
    const float bi = (float)beta_input;
    cudaError_t e;
    if (dt == LUCID_BF16) {
        typedef __nv_bfloat16 T;
        e = silu ? bn_launch_grad_dx1_cols<T, true>(grid, smem, st->stream, (const T *)dyd,
                                                    (const T *)xd, (T *)dxd, sm, si, w, b, g,
                                                    go, bi, d)
                 : bn_launch_grad_dx1_cols<T, false>(grid, smem, st->stream, (const T *)dyd,
                                                     (const T *)xd, (T *)dxd, sm, si, nof, nof,
                                                     g, go, bi, d);
    } else {
        typedef __half T;
        e = silu ? bn_launch_grad_dx1_cols<T, true>(grid, smem, st->stream, (const T *)dyd,
                                                    (const T *)xd, (T *)dxd, sm, si, w, b, g,
                                                    go, bi, d)
                 : bn_launch_grad_dx1_cols<T, false>(grid, smem, st->stream, (const T *)dyd,
                                                     (const T *)xd, (T *)dxd, sm, si, nof, nof,
                                                     g, go, bi, d);
    }
    CUDA_CHECK(ctx, e);
    lucid_cuda_bn_launches += 1;
    dc->filled = 1;
    dc->dy = dxd;
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// the one-pass backward reading dy as a sum of terms (nn.h
// lucid_nn_batchnorm2d_backward_terms)

/* One piece of a gradient description as the kernel reads it: channels
 * [c0, the next piece's c0) of dy are the rounded sum of ns sources
 * (1..LUCID_CHAN_SUM_MAX); source j's element of channel c0, image 0, at
 * src[j] (its first channel already added), image n at + n*stride[j]
 * (elements: its channel count times S). */
struct bn_dy_piece {
    const void *src[LUCID_CHAN_SUM_MAX];
    int64_t stride[LUCID_CHAN_SUM_MAX];
    int64_t c0;
    int ns;
};

/* The kernel parameter, passed by value (__grid_constant__): a recorded
 * graph node holds its own copy, so every replay reads what the capture
 * saw and no host memory is read after the launch. 648 bytes. */
struct bn_dy_terms {
    bn_dy_piece p[LUCID_BN_TERMS_PIECES];
    int n;
};

/* v rounded to T and back to f32 (exact): one rounding per addition, as
 * chan_sum_multi's cs_round (cuda/nn_pointwise.cu). */
template <typename T> __device__ __forceinline__ float bn_terms_round(float v);
template <> __device__ __forceinline__ float bn_terms_round<float>(float v) { return v; }
template <> __device__ __forceinline__ float bn_terms_round<__nv_bfloat16>(float v) {
    return __bfloat162float(__float2bfloat16_rn(v));
}
template <> __device__ __forceinline__ float bn_terms_round<__half>(float v) {
    return __half2float(__float2half_rn(v));
}

/* Channel c's sources: those of the piece holding c (the last piece whose
 * c0 <= c, a scan of at most LUCID_BN_TERMS_PIECES entries, the same for
 * every thread of the block), moved to channel c (S elements a channel). */
template <typename T> struct bn_dy_chan {
    const T *src[LUCID_CHAN_SUM_MAX];
    int64_t stride[LUCID_CHAN_SUM_MAX];
    int ns;

    /* dy's V-element vector at the walk position w of a ONE-part channel
     * (part 0 holds every image: plane w.q is image w.q, base 0; the
     * element index is not used): the sources' vectors, all loaded first;
     * one source: its bits as loaded (a copy); more: source 0, then each
     * next one added in f32 (__fadd_rn: never contracted) and rounded to T,
     * repacked: per element the arithmetic of chan_sum_multi (lucid_elem
     * loads, __fadd_rn, cs_round, lucid_elem store), i.e. the bits a dy
     * materialised by lucid_nn_channel_copy_multi holds there. */
    template <int V>
    __device__ __forceinline__ typename bn_vec<T, V>::R load(const bn_walk &w, int64_t) const {
        typedef bn_vec<T, V> Vt;
        typedef typename Vt::R R;
        R r[LUCID_CHAN_SUM_MAX];
#pragma unroll
        for (int j = 0; j < LUCID_CHAN_SUM_MAX; j++)
            r[j] = j < ns ? Vt::load(src[j] + (int64_t)w.q * stride[j] + (int64_t)w.off * V)
                          : R();
        if (ns == 1) return r[0];
        float acc[V];
        Vt::unpack(r[0], acc);
#pragma unroll
        for (int j = 1; j < LUCID_CHAN_SUM_MAX; j++) {
            if (j >= ns) break;
            float v[V];
            Vt::unpack(r[j], v);
#pragma unroll
            for (int k = 0; k < V; k++) acc[k] = bn_terms_round<T>(__fadd_rn(acc[k], v[k]));
        }
        return Vt::pack(acc);
    }
};

template <typename T>
static __device__ __forceinline__ bn_dy_chan<T> bn_dy_chan_of(const bn_dy_terms &t, int64_t c,
                                                              int64_t S) {
    int pi = 0;
    while (pi + 1 < t.n && c >= t.p[pi + 1].c0) pi++;
    const bn_dy_piece &P = t.p[pi];
    bn_dy_chan<T> d;
    d.ns = P.ns;
#pragma unroll
    for (int j = 0; j < LUCID_CHAN_SUM_MAX; j++) {
        d.src[j] = j < P.ns ? (const T *)P.src[j] + (c - P.c0) * S : nullptr;
        d.stride[j] = P.stride[j];
    }
    return d;
}

/* bn_grad_dx1 (see bn_grad_dx1_run) with dy given as a gradient
 * description t instead of a tensor: block c (grid.y, channels strided)
 * resolves channel c's sources (bn_dy_chan_of), computes the channel's
 * (sum g, sum g*xhat) with bn_grad_part_by, finishes as bn_grad_dx1_run
 * (bn_block_sum2, the coefficients through shared memory, bn_grad_finish:
 * dweight / dbias with beta_params) and writes dx with bn_dx1_vec: from the
 * summed dy vectors it held (HELD, one round of the walk: bn_dx_part's held
 * branch, which never reads dy) or summing them again (bn_dx_part_by).
 * Every value equals bn_grad_dx1's on a dy that lucid_nn_channel_copy_multi
 * wrote from the same pieces, bitwise: the same partition, vector widths
 * and expressions, and dy's vectors hold the same bits. */
template <typename T, int VS, int VA, bool SILU, bool HELD>
static __global__ void __launch_bounds__(BN_THREADS)
bn_grad_dx1_terms(const __grid_constant__ bn_dy_terms t, const T *__restrict__ x, T *dx,
                  const float *mean, const float *invstd, const float *w, const float *b,
                  bn_geom g, bn_grad_out out, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    static_assert(!HELD || VS == VA, "held vectors need one vector width");
    typedef bn_vec<T, VA> Vt;
    typedef typename Vt::R R;
    __shared__ float2 sh[32];
    __shared__ float4 cf; /* channel c's (k, mean(g), mean(g*xhat), 0) */
    const bn_part ps = bn_part_of<VS>(g, 0), pa = bn_part_of<VA>(g, 0);
    for (int64_t c = blockIdx.y; c < g.C; c += gridDim.y) {
        const bn_dy_chan<T> d = bn_dy_chan_of<T>(t, c, g.S);
        float mu = mean[c], is = invstd[c];
        const float wcoef = out.w ? out.w[c] : 1.0f; /* the coefficient's weight, loaded early */
        float zs = 0.0f, zh = 0.0f;
        if (SILU) bn_affine(c, mean, invstd, w, b, &zs, &zh);
        float a, bsum;
        R hdy[BN_UNROLL], hx[BN_UNROLL];
        typedef typename bn_vec<T, VS>::R RS;
        bn_grad_part_by<T, VS, true, SILU>(d, x + ps.base + c * g.S, ps, g.CS, mu, is, zs, zh,
                                           &a, &bsum, HELD ? (RS *)hdy : nullptr,
                                           HELD ? (RS *)hx : nullptr);
        bn_block_sum2(a, bsum, sh);
        /* as bn_grad_dx1_run: cf is rewritten only after the next channel's
         * bn_block_sum2 barriers; thread 0 accumulates dweight / dbias after
         * handing the coefficients over */
        if (threadIdx.x == 0) cf = bn_grad_coef_of((double)a, (double)bsum, g, wcoef, out.invstd[c]);
        __syncthreads();
        const float4 q = cf;
        if (threadIdx.x == 0) bn_grad_finish((double)a, (double)bsum, g, c, out);
        if constexpr (HELD)
            bn_dx_part<T, VA, SILU, true>(nullptr, x, dx, pa, pa.base + c * g.S, g.CS, zs, zh, mu,
                                          is, q, beta, hdy, hx);
        else
            bn_dx_part_by<T, VA, SILU, false, false>(d, x, dx, pa, pa.base + c * g.S, g.CS, zs, zh,
                                                     mu, is, q, beta, nullptr, nullptr, nullptr,
                                                     nullptr);
    }
}

/* The launch of bn_grad_dx1_terms: the vector choices of bn_launch_grad_dx1
 * (vs: the gradient sums', va: dx's; va implies vs; held when one round). */
template <typename T, bool SILU>
static void bn_launch_grad_dx1_terms(bool vs, bool va, dim3 grid, cudaStream_t stream,
                                     const bn_dy_terms &t, const T *x, T *dx, const float *mean,
                                     const float *invstd, const float *w, const float *b,
                                     const bn_geom &g, const bn_grad_out &go, float beta) {
    const int VV = bn_width<T>::V;
    if (vs && va && bn_held(g, VV))
        lucid_launch(bn_grad_dx1_terms<T, VV, VV, SILU, true>, grid, dim3(BN_THREADS), 0, stream,
                     t, x, dx, mean, invstd, w, b, g, go, beta);
    else if (vs && va)
        lucid_launch(bn_grad_dx1_terms<T, VV, VV, SILU, false>, grid, dim3(BN_THREADS), 0, stream,
                     t, x, dx, mean, invstd, w, b, g, go, beta);
    else if (vs)
        lucid_launch(bn_grad_dx1_terms<T, VV, 1, SILU, false>, grid, dim3(BN_THREADS), 0, stream,
                     t, x, dx, mean, invstd, w, b, g, go, beta);
    else
        lucid_launch(bn_grad_dx1_terms<T, 1, 1, SILU, false>, grid, dim3(BN_THREADS), 0, stream,
                     t, x, dx, mean, invstd, w, b, g, go, beta);
}

static thread_local unsigned long bn_terms_launches;

extern "C" unsigned long lucid_cuda_bn_terms_count(void) { return bn_terms_launches; }

/* Host: whether bn_backward would take its one-pass route for x of this
 * shape and dtype with dx given in training (bn_grad_dx1's conditions:
 * f32/bf16/f16, one part per channel, LUCID_BN_ONEPASS on). */
static bool bn_terms_shape_fits(const lucid_tensor *x) {
    const lucid_dtype dt = x->dtype;
    if (dt != LUCID_F32 && dt != LUCID_BF16 && dt != LUCID_F16) return false;
    const int64_t N = x->shape[0], C = x->shape[1], S = x->shape[2] * x->shape[3];
    if (N * C * S == 0 || !bn_onepass()) return false;
    const bn_geom g = bn_geom_of(N, C, S);
    return g.parts == 1;
}

/* The nn.h slot batchnorm2d_backward_terms (lucid_nn_batchnorm2d_backward_
 * terms): taken when bn_backward would run bn_grad_dx1 on a materialised dy
 * (bn_terms_shape_fits) and, when the gradient sums take the vector path on
 * such a dy (bn_use_vec of x and a 16-byte aligned dy), every source row is
 * 16-byte aligned; then one bn_grad_dx1_terms launch with bn_backward's
 * vector choices (vs from x alone, a materialised dy being aligned; va
 * from x and dx) and its host bookkeeping (the nn arena and counters asked
 * for as bn_backward asks, so eager calls and captures evolve the state
 * alike).  n == 0: the query (nothing queued). */
extern "C" lucid_status lucid_cuda_batchnorm2d_backward_terms(
    lucid_ctx *ctx, const lucid_tensor *x, int n, const lucid_chan_piece *pieces,
    lucid_tensor *dx, const lucid_tensor *weight, const lucid_tensor *bias,
    const lucid_tensor *save_mean, const lucid_tensor *save_invstd, lucid_tensor *dweight,
    lucid_tensor *dbias, double beta_input, double beta_params, int silu, int *taken) {
    const char *op = silu ? "batchnorm2d_silu_backward" : "batchnorm2d_backward";
    *taken = 0;
    if (!bn_terms_shape_fits(x)) return LUCID_OK;
    if (n == 0) {
        *taken = 1;
        return LUCID_OK;
    }
    if (n < 0 || n > LUCID_BN_TERMS_PIECES || !dx) return LUCID_OK;
    const lucid_dtype dt = x->dtype;
    const int64_t N = x->shape[0], C = x->shape[1], S = x->shape[2] * x->shape[3];
    const size_t es = lucid_dtype_size(dt);
    const void *xd = lucid_tensor_data(x);
    void *dxd = lucid_tensor_data(dx);
    /* bn_backward's choices on a materialised (aligned) dy */
    const bool vs = bn_use_vec(dt, S, xd, NULL, NULL);
    const bool va = bn_route(dt, N * C * S, S, xd, NULL, dxd) == BN_ROUTE_VEC;
    bn_dy_terms t;
    memset(&t, 0, sizeof t);
    t.n = n;
    for (int i = 0; i < n; i++) {
        const lucid_chan_piece *p = &pieces[i];
        bn_dy_piece *q = &t.p[i];
        q->c0 = p->dst_c0;
        q->ns = lucid_chan_piece_nsrc(p);
        for (int j = 0; j < q->ns; j++) {
            const lucid_tensor *src = j ? p->add[j - 1] : p->src;
            const int64_t c0 = j ? p->add_c0[j - 1] : p->src_c0;
            const char *row = (const char *)lucid_tensor_data(src) + (size_t)(c0 * S) * es;
            q->src[j] = row;
            q->stride[j] = src->shape[1] * S;
            /* a vector load of every row of every channel of the piece:
             * S a multiple of the vector (vs), so the row start and the
             * batch stride in bytes must be multiples of 16 */
            if (vs && (!bn_aligned16(row) || ((size_t)q->stride[j] * es) % 16 != 0))
                return LUCID_OK;
        }
    }
    LUCID_TRY(bn_backward_check(ctx, op, dt, weight, bias, save_mean, save_invstd, dweight,
                                dbias));
    CUDA_ENTER(ctx, st);
    lucid_cuda_nn_state *ns = lucid_cuda_nn_get(ctx, st);
    if (!ns) return ctx->last_status;
    const bn_geom g = bn_geom_of(N, C, S);
    /* bn_backward's bookkeeping (unused by the one-pass kernel) */
    const size_t pbytes = nn_align(sizeof(float2) * (size_t)(g.parts * C));
    void *ws = NULL;
    LUCID_TRY(lucid_cuda_nn_arena(ctx, st, ns, pbytes + sizeof(float4) * (size_t)C, op, &ws));
    unsigned int *count = NULL;
    LUCID_TRY(lucid_cuda_nn_counters(ctx, st, ns, C, &count));
    const float *sm = (const float *)lucid_tensor_data(save_mean);
    const float *si = (const float *)lucid_tensor_data(save_invstd);
    const float *w = weight ? (const float *)lucid_tensor_data(weight) : NULL;
    const float *b = (silu && bias) ? (const float *)lucid_tensor_data(bias) : NULL;
    const float *nof = NULL;
    bn_grad_out go;
    go.w = w;
    go.invstd = si;
    go.dweight = dweight ? (float *)lucid_tensor_data(dweight) : NULL;
    go.dbias = dbias ? (float *)lucid_tensor_data(dbias) : NULL;
    go.beta = beta_params;
    go.coef = NULL;
    const dim3 grid(1, bn_grid_y(C));
    const float bi = (float)beta_input;
    if (silu)
        NN_DISPATCH(dt, (bn_launch_grad_dx1_terms<T, true>(vs, va, grid, st->stream, t,
                                                           (const T *)xd, (T *)dxd, sm, si, w, b,
                                                           g, go, bi)));
    else
        NN_DISPATCH(dt, (bn_launch_grad_dx1_terms<T, false>(vs, va, grid, st->stream, t,
                                                            (const T *)xd, (T *)dxd, sm, si, nof,
                                                            nof, g, go, bi)));
    CUDA_CHECK_LAUNCH(ctx, "bn_grad_dx1_terms");
    lucid_cuda_bn_launches += 1;
    bn_terms_launches += 1;
    *taken = 1;
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// per-channel sum (conv bias gradient)

lucid_status lucid_cuda_nn_channel_sum(lucid_ctx *ctx, lucid_cuda_state *st,
                                       lucid_cuda_nn_state *ns, const void *dy,
                                       lucid_dtype dt, int64_t N, int64_t C,
                                       int64_t S, float *out, double beta) {
    bn_geom g = bn_geom_of(N, C, S);
    if (g.parts > INT32_MAX)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "conv2d bias gradient: batch too large");
    void *ws = NULL;
    LUCID_TRY(lucid_cuda_nn_arena(ctx, st, ns, sizeof(float2) * (size_t)(g.parts * C),
                                  "conv2d_backward_params (bias)", &ws));
    unsigned int *count = NULL; /* NULL: the two-launch fallback */
    LUCID_TRY(lucid_cuda_nn_counters(ctx, st, ns, C, &count));
    bn_grad_out go;
    go.w = NULL;
    go.invstd = NULL;
    go.dweight = NULL;
    go.dbias = out;
    go.beta = beta;
    go.coef = NULL;
    dim3 grid((unsigned)g.parts, bn_grid_y(C));
    bool vec = bn_use_vec(dt, S, dy, NULL, NULL);
    const float *nof = NULL;
    NN_DISPATCH(dt, (bn_launch_grad<T, false, false>(vec, grid, st->stream, (const T *)dy,
                                                     (const T *)NULL, nof, nof, nof, nof, g,
                                                     (float2 *)ws, count, go)));
    CUDA_CHECK_LAUNCH(ctx, "bn_grad_partial (bias)");
    if (!count && g.parts > 1) {
        lucid_launch(bn_grad_final, dim3(1, bn_grid_y(C)), dim3(BN_THREADS), 0, st->stream,
                     (const float2 *)ws, g, go);
        CUDA_CHECK_LAUNCH(ctx, "bn_grad_final (bias)");
    }
    return LUCID_OK;
}
