/*
 * nn_norm.cu — BatchNorm2d forward (train/eval) and backward on the GPU, and
 * the per-channel sum used by the conv bias gradient.
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
 * Reductions are deterministic (no float atomics): channel c's M = N*S
 * elements are cut into fixed parts (P parts per plane of S elements, chunk
 * length a function of S only), one block per (part, channel) folds its
 * part in a fixed order (per-thread, then a fixed shuffle/shared tree) and
 * stores the partial in the nn arena.  The partials are then folded in f64
 * in a fixed order (bn_stats_fold: sums shifted by part 0's mean, Chan's
 * merge of all parts at once; bn_grad_fold: plain sums; thread t of a block
 * takes parts t, t+256, ... in turn, then a fixed shuffle tree) by the LAST
 * block to finish channel c ("last block folds", CUDA sample
 * threadFenceReduction): thread 0 of each block stores its partial,
 * __threadfence(), atomicAdd on channel c's arrival counter (nn state,
 * zero between launches); the block that sees parts-1 resets the counter
 * to 0 and folds.  Which block that is varies run to run, but the fold reads
 * the partials by part index with threadIdx-only roles, so the result does
 * not: bitwise identical run to run, eager or replayed from a graph.  When
 * the counters are unavailable (C > LUCID_CUDA_NN_COUNTERS, or the first
 * use is inside a stream capture) a separate final kernel runs the same
 * fold function, one block per channel: the same bits, one launch more.
 * Forward statistics: per-thread shifted sums (shift = the channel's first
 * element) turned into (count, mean, M2) and merged with Chan's formula, so
 * the variance does not suffer from E[x^2]-E[x]^2 cancellation.
 * Launches (counter route; the fallback adds one final per reduction):
 * training forward 2 (stats partial+fold, apply), eval forward 2
 * (stats_eval, apply), training backward 2 (grad partial+fold, dx; 1
 * without dx), eval backward 1 (dx) or 2 with dweight/dbias, the
 * per-channel sum 1.  Every kernel starts with lucid_pdl_wait();
 * lucid_pdl_launch_dependents(); (in every thread, before any early return)
 * and is queued with lucid_launch() (launch.cuh: programmatic dependent
 * launch: a kernel may be scheduled before its predecessor ends, and waits
 * for it before touching memory).
 *
 * Fused BatchNorm2d + SiLU (lucid_cuda_batchnorm2d_silu_*): the same
 * launches with the SiLU inside.  Forward: the statistics kernel above
 * unchanged, then bn_apply<T, true> stores a = z*sigmoid(z) of the f32
 * z = fmaf(x, sc, sh) (z never stored): 2 launches in training (stats
 * partial+fold, apply) instead of 3 for batchnorm then silu, 2 in eval.
 * Backward: bn_grad_partial and bn_dx recompute z from x, the saved
 * statistics, weight and bias, and use g = dy * s * (1 + z*(1-s)) where
 * the plain kernels use dy (g never stored): 2 launches (grad partial+fold,
 * dx) instead of 3.  The partition and the folding order are those of the
 * plain kernels, so the fused results are as deterministic.
 * Source: PyTorch nn.BatchNorm2d docs; Chan, Golub, LeVeque (1979); nn.SiLU
 * docs.
 */
#include "nn_common.cuh"

#include <math.h>

#define BN_THREADS 256
#define BN_CHUNK 4096 /* elements of one plane per block (at most) */

// ----------------------------------------------------------------------------
// geometry of the fixed partition

typedef struct bn_geom {
    int64_t N, C, S;
    int64_t chunk; /* elements per part (<= S) */
    int64_t P;     /* parts per plane */
    int64_t parts; /* N * P */
} bn_geom;

static bn_geom bn_geom_of(int64_t N, int64_t C, int64_t S) {
    bn_geom g;
    g.N = N; g.C = C; g.S = S;
    g.chunk = S < BN_CHUNK ? (S > 0 ? S : 1) : BN_CHUNK;
    g.P = (S + g.chunk - 1) / g.chunk;
    if (g.P < 1) g.P = 1;
    g.parts = N * g.P;
    return g;
}

static inline unsigned bn_grid_y(int64_t C) {
    return (unsigned)(C < 65535 ? C : 65535);
}

/* Channel c's affine map z = fmaf(x, sc, sh) (sc = w*invstd,
 * sh = b - mean*sc; w/b NULL: 1/0): one source expression for every kernel
 * (bn_apply's PTX is unchanged by it), so the fused backward recomputes the
 * forward's z from the same f32 statistics. */
static __device__ __forceinline__ void bn_affine(int64_t c, const float *mean,
                                                 const float *invstd,
                                                 const float *w, const float *b,
                                                 float *sc, float *sh) {
    float k = (w ? w[c] : 1.0f) * invstd[c];
    *sc = k;
    *sh = (b ? b[c] : 0.0f) - mean[c] * k;
}

/* dL/dz of a = silu(z): dy * s * (1 + z*(1-s)) (the formula of silu_bwd). */
static __device__ __forceinline__ float bn_silu_grad(float dy, float z) {
    float s = nn_sigmoid(z);
    return dy * s * (1.0f + z * (1.0f - s));
}

// ----------------------------------------------------------------------------
// the last block folds

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

/* What the statistics fold writes (training forward). */
typedef struct bn_stats_out {
    float *save_mean, *save_invstd;
    float *running_mean, *running_var; /* nullable */
    void *nbt;                         /* num_batches_tracked, nullable */
    int nbt_dt;
    double momentum, eps;
} bn_stats_out;

/* Sum of v over the block in a fixed order (blockDim.x == BN_THREADS):
 * shuffle-down tree inside each warp, then warp 0 over the warp results.
 * Every thread calls it; the result is valid in thread 0.  sh: [32] of
 * the caller, free for this call. */
static __device__ __forceinline__ double bn_block_sum64(double v, double *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    v = 0.0;
    if (wid == 0) {
        v = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    }
    return v;
}

/* Channel c's statistics from its `parts` partials pp[0..parts) = (n_i,
 * mean_i, M2_i): called by every thread of a BN_THREADS block
 * (block-uniform), thread 0 writes save_mean / save_invstd, the running
 * stats and, for c == 0 only, num_batches_tracked += 1 (once per forward).
 * f64 sums shifted by K = mean_0 (part 0 always holds a full chunk):
 *   n = sum n_i, s = sum n_i*(mean_i - K), q = sum M2_i + n_i*(mean_i - K)^2,
 *   mean = K + s/n, M2 = q - s^2/n  (Chan's merge of all parts at once).
 * The cancellation in q - s^2/n is bounded: n_0*(mean_0 - mean)^2 <= M2, so
 * s^2/n <= M2 * n/n_0 <= M2 * parts, a relative error of about
 * parts * 2^-53 on M2 (1e-11 for 1e5 parts), far below the f32 partials'.
 * Fixed order: thread t adds parts t, t+BN_THREADS, ... in that order, then
 * bn_block_sum64.  Nothing depends on blockIdx, so the last-arriving block
 * of bn_stats_partial (whichever it is) and the fallback bn_stats_final
 * give the same bits.  The partials are read with ld.global.cg (L2): other
 * blocks of this grid wrote them. */
static __device__ void bn_stats_fold(const float3 *pp, int64_t parts, int64_t c,
                                     const bn_stats_out &out) {
    __shared__ double sh[32];
    double K = (double)__ldcg((const float *)pp + 1);
    double n = 0.0, s = 0.0, q = 0.0;
    for (int64_t i = threadIdx.x; i < parts; i += blockDim.x) {
        const float *p = (const float *)(pp + i);
        double ni = (double)__ldcg(p), d = (double)__ldcg(p + 1) - K;
        double sd = ni * d;
        n += ni;
        s += sd;
        q += (double)__ldcg(p + 2) + sd * d;
    }
    n = bn_block_sum64(n, sh);
    s = bn_block_sum64(s, sh);
    q = bn_block_sum64(q, sh);
    if (threadIdx.x != 0) return;
    double mean = K + s / n;
    double m2 = q - s * (s / n);
    if (m2 < 0.0) m2 = 0.0;
    double var = m2 / n; /* biased: normalisation */
    out.save_mean[c] = (float)mean;
    out.save_invstd[c] = (float)(1.0 / sqrt(var + out.eps));
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

/* partial[(c * parts + part)] = (count, mean, M2) of the part; with count
 * (the nn state's zeroed arrival counters), the last block of channel c
 * folds the channel's partials (bn_stats_fold); count NULL: bn_stats_final
 * does, in a launch of its own. */
template <typename T>
static __global__ void bn_stats_partial(const T *__restrict__ x, bn_geom g,
                                        float3 *partial, unsigned int *count,
                                        bn_stats_out out) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    __shared__ bn_mv sh[32];
    __shared__ int last;
    for (int64_t c = blockIdx.y; c < g.C; c += gridDim.y) {
        int64_t part = blockIdx.x;
        int64_t n = part / g.P, p = part % g.P;
        int64_t s0 = p * g.chunk;
        int64_t s1 = s0 + g.chunk < g.S ? s0 + g.chunk : g.S;
        const T *xp = x + (n * g.C + c) * g.S;
        float K = lucid_elem<T>::load(x + c * g.S, 0); /* channel shift */
        float a1 = 0.0f, a2 = 0.0f, cnt = 0.0f;
        for (int64_t s = s0 + threadIdx.x; s < s1; s += blockDim.x) {
            float d = lucid_elem<T>::load(xp, s) - K;
            a1 += d;
            a2 = fmaf(d, d, a2);
            cnt += 1.0f;
        }
        bn_mv v;
        v.n = cnt;
        v.mean = cnt > 0.0f ? K + a1 / cnt : 0.0f;
        v.m2 = cnt > 0.0f ? fmaxf(a2 - a1 * (a1 / cnt), 0.0f) : 0.0f;
        /* fixed tree: shuffle down inside the warp, then warp 0 over warps */
        for (int o = 16; o > 0; o >>= 1) v = bn_merge(v, bn_shfl(v, o));
        int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
        __syncthreads();
        if (lane == 0) sh[wid] = v;
        __syncthreads();
        if (wid == 0) {
            int nw = (int)(blockDim.x >> 5);
            bn_mv r = lane < nw ? sh[lane] : bn_mv{0.0f, 0.0f, 0.0f};
            for (int o = 16; o > 0; o >>= 1) r = bn_merge(r, bn_shfl(r, o));
            if (lane == 0) /* thread 0: the one bn_arrive fences for */
                partial[c * g.parts + part] = make_float3(r.n, r.mean, r.m2);
        }
        if (count && bn_arrive(count + c, g.parts, &last))
            bn_stats_fold(partial + c * g.parts, g.parts, c, out);
    }
}

/* Fallback (no counters): one block per channel folds its partials. */
static __global__ void bn_stats_final(const float3 *partial, bn_geom g, bn_stats_out out) {
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
 * SILU: y = z * sigmoid(z) of that z (kept in f32). */
template <typename T, bool SILU>
static __global__ void bn_apply(const T *__restrict__ x, T *__restrict__ y, int64_t C,
                         int64_t S, int64_t NC, const float *mean,
                         const float *invstd, const float *w, const float *b) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int64_t pl = blockIdx.y; pl < NC; pl += gridDim.y) {
        int64_t c = pl % C;
        float sc, sh;
        bn_affine(c, mean, invstd, w, b, &sc, &sh);
        const T *xp = x + pl * S;
        T *yp = y + pl * S;
        for (int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; s < S;
             s += (int64_t)gridDim.x * blockDim.x) {
            float v = fmaf(lucid_elem<T>::load(xp, s), sc, sh);
            if (SILU) v = v * nn_sigmoid(v);
            lucid_elem<T>::store(yp, s, v);
        }
    }
}

static void plane_grid(int64_t S, int64_t NC, dim3 *grid) {
    int64_t bx = (S + BN_THREADS - 1) / BN_THREADS;
    if (bx > 1024) bx = 1024;
    if (bx < 1) bx = 1;
    grid->x = (unsigned)bx;
    grid->y = (unsigned)(NC < 65535 ? NC : 65535);
    grid->z = 1;
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
        NN_DISPATCH(x->dtype, (lucid_launch(bn_stats_partial<T>, grid, dim3(BN_THREADS), 0,
                                            st->stream, (const T *)lucid_tensor_data(x), g,
                                            (float3 *)ws, count, so)));
        CUDA_CHECK_LAUNCH(ctx, "bn_stats_partial");
        if (!count) {
            lucid_launch(bn_stats_final, dim3(1, bn_grid_y(C)), dim3(BN_THREADS), 0,
                         st->stream, (const float3 *)ws, g, so);
            CUDA_CHECK_LAUNCH(ctx, "bn_stats_final");
        }
    } else {
        lucid_launch(bn_stats_eval, dim3(cblocks), dim3(128), 0, st->stream, C,
                     (const float *)rm, (const float *)rv, sm, si, eps);
        CUDA_CHECK_LAUNCH(ctx, "bn_stats_eval");
    }
    dim3 grid;
    plane_grid(S, N * C, &grid);
    if (silu)
        NN_DISPATCH(x->dtype, (lucid_launch(bn_apply<T, true>, grid, dim3(BN_THREADS), 0,
                                            st->stream, (const T *)lucid_tensor_data(x),
                                            (T *)lucid_tensor_data(y), C, S, N * C,
                                            (const float *)sm, (const float *)si, w, b)));
    else
        NN_DISPATCH(x->dtype, (lucid_launch(bn_apply<T, false>, grid, dim3(BN_THREADS), 0,
                                            st->stream, (const T *)lucid_tensor_data(x),
                                            (T *)lucid_tensor_data(y), C, S, N * C,
                                            (const float *)sm, (const float *)si, w, b)));
    CUDA_CHECK_LAUNCH(ctx, "bn_apply");
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

// ----------------------------------------------------------------------------
// backward, and the per-channel sum

/* What the gradient fold writes: dweight/dbias with beta, and the dx
 * coefficients coef[c] = (k, mean(g), mean(g*xhat)); each nullable. */
typedef struct bn_grad_out {
    const float *w;      /* forward weight (k = w*invstd; NULL: 1) */
    const float *invstd; /* needed with coef */
    float *dweight, *dbias;
    double beta;
    float3 *coef;
} bn_grad_out;

/* Channel c's sums (sum g, sum g*xhat) from its `parts` partials, f64 in
 * the fixed order of bn_stats_fold (thread t adds parts t, t+BN_THREADS,
 * ... in that order, then bn_block_sum64); every thread of a BN_THREADS
 * block calls it, thread 0 writes.  The last block of bn_grad_partial
 * (whichever it is) and the fallback bn_grad_final give the same bits. */
static __device__ void bn_grad_fold(const float2 *pp, bn_geom g, int64_t c,
                                    const bn_grad_out &out) {
    __shared__ double sh[32];
    double sdy = 0.0, sdyx = 0.0;
    for (int64_t i = threadIdx.x; i < g.parts; i += blockDim.x) {
        float2 q = __ldcg(pp + i);
        sdy += (double)q.x;
        sdyx += (double)q.y;
    }
    sdy = bn_block_sum64(sdy, sh);
    sdyx = bn_block_sum64(sdyx, sh);
    if (threadIdx.x != 0) return;
    double beta = out.beta;
    if (out.dweight)
        out.dweight[c] =
            (float)(beta != 0.0 ? sdyx + beta * (double)out.dweight[c] : sdyx);
    if (out.dbias)
        out.dbias[c] = (float)(beta != 0.0 ? sdy + beta * (double)out.dbias[c] : sdy);
    if (out.coef) {
        double M = (double)g.N * (double)g.S;
        double k = (out.w ? (double)out.w[c] : 1.0) * (double)out.invstd[c];
        out.coef[c] = make_float3((float)k, (float)(sdy / M), (float)(sdyx / M));
    }
}

/* partial[(c*parts + part)] = (sum g, sum g*xhat) of the part (the second
 * only when WITH_X), g = dy, or SILU (needs WITH_X): g = dy * silu'(z) with
 * z recomputed from x (w, b: the forward's weight and bias, nullable).
 * With count (the nn state's zeroed arrival counters) the last block of
 * channel c folds its partials (bn_grad_fold); count NULL: bn_grad_final
 * does, in a launch of its own. */
template <typename T, bool WITH_X, bool SILU>
static __global__ void bn_grad_partial(const T *__restrict__ dy, const T *__restrict__ x,
                                const float *mean, const float *invstd,
                                const float *w, const float *b,
                                bn_geom g, float2 *partial, unsigned int *count,
                                bn_grad_out out) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    static_assert(WITH_X || !SILU, "the fused SiLU gradient needs x");
    __shared__ float sh[32];
    __shared__ int last;
    for (int64_t c = blockIdx.y; c < g.C; c += gridDim.y) {
        int64_t part = blockIdx.x;
        int64_t n = part / g.P, p = part % g.P;
        int64_t s0 = p * g.chunk;
        int64_t s1 = s0 + g.chunk < g.S ? s0 + g.chunk : g.S;
        int64_t base = (n * g.C + c) * g.S;
        float mu = WITH_X ? mean[c] : 0.0f, is = WITH_X ? invstd[c] : 0.0f;
        float zs = 0.0f, zh = 0.0f;
        if (SILU) bn_affine(c, mean, invstd, w, b, &zs, &zh);
        float a = 0.0f, bsum = 0.0f;
        for (int64_t s = s0 + threadIdx.x; s < s1; s += blockDim.x) {
            float gv = lucid_elem<T>::load(dy, base + s), xv = 0.0f;
            if (SILU) {
                xv = lucid_elem<T>::load(x, base + s);
                gv = bn_silu_grad(gv, fmaf(xv, zs, zh));
            }
            a += gv;
            if (WITH_X) {
                float xh = ((SILU ? xv : lucid_elem<T>::load(x, base + s)) - mu) * is;
                bsum = fmaf(gv, xh, bsum);
            }
        }
        float ra = nn_block_sum(a, sh);
        float rb = WITH_X ? nn_block_sum(bsum, sh) : 0.0f;
        /* thread 0: the one bn_arrive fences for */
        if (threadIdx.x == 0) partial[c * g.parts + part] = make_float2(ra, rb);
        if (count && bn_arrive(count + c, g.parts, &last))
            bn_grad_fold(partial + c * g.parts, g, c, out);
    }
}

/* Fallback (no counters): one block per channel folds its partials. */
static __global__ void bn_grad_final(const float2 *partial, bn_geom g, bn_grad_out out) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int64_t c = blockIdx.y; c < g.C; c += gridDim.y)
        bn_grad_fold(partial + c * g.parts, g, c, out);
}

/* dx = beta*dx + k*(g - mdy - xhat*mdyx)   (TRAIN)
 * dx = beta*dx + w*invstd*g                (eval)
 * g = dy, or SILU: dy * silu'(z), z recomputed from x (b: the forward's
 * bias, nullable). */
template <typename T, bool TRAIN, bool SILU>
static __global__ void bn_dx(const T *__restrict__ x, const T *__restrict__ dy,
                      T *dx, int64_t C, int64_t S, int64_t NC,
                      const float *mean, const float *invstd, const float *w,
                      const float *b, const float3 *coef, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int64_t pl = blockIdx.y; pl < NC; pl += gridDim.y) {
        int64_t c = pl % C;
        float k, mdy = 0.0f, mdyx = 0.0f, mu = 0.0f, is = 0.0f;
        if (TRAIN) {
            float3 q = coef[c];
            k = q.x; mdy = q.y; mdyx = q.z;
            mu = mean[c]; is = invstd[c];
        } else {
            k = (w ? w[c] : 1.0f) * invstd[c];
        }
        float zs = 0.0f, zh = 0.0f;
        if (SILU) bn_affine(c, mean, invstd, w, b, &zs, &zh);
        int64_t base = pl * S;
        for (int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; s < S;
             s += (int64_t)gridDim.x * blockDim.x) {
            float gv = lucid_elem<T>::load(dy, base + s);
            float xv = (TRAIN || SILU) ? lucid_elem<T>::load(x, base + s) : 0.0f;
            if (SILU) gv = bn_silu_grad(gv, fmaf(xv, zs, zh));
            float v;
            if (TRAIN) {
                float xh = (xv - mu) * is;
                v = k * (gv - mdy - xh * mdyx);
            } else {
                v = k * gv;
            }
            if (beta != 0.0f) v = fmaf(beta, lucid_elem<T>::load(dx, base + s), v);
            lucid_elem<T>::store(dx, base + s, v);
        }
    }
}

static lucid_status bn_backward(
    lucid_ctx *ctx, const lucid_tensor *x, const lucid_tensor *dy,
    lucid_tensor *dx, const lucid_tensor *weight, const lucid_tensor *bias,
    const lucid_tensor *save_mean, const lucid_tensor *save_invstd,
    lucid_tensor *dweight, lucid_tensor *dbias, int training,
    double beta_input, double beta_params, bool silu) {
    const char *op = silu ? "batchnorm2d_silu_backward" : "batchnorm2d_backward";
    LUCID_TRY(nn_check_act(ctx, op, x->dtype));
    LUCID_TRY(nn_check_f32(ctx, op, "weight", weight));
    LUCID_TRY(nn_check_f32(ctx, op, "bias", bias));
    LUCID_TRY(nn_check_f32(ctx, op, "save_mean", save_mean));
    LUCID_TRY(nn_check_f32(ctx, op, "save_invstd", save_invstd));
    LUCID_TRY(nn_check_f32(ctx, op, "grad_weight", dweight));
    LUCID_TRY(nn_check_f32(ctx, op, "grad_bias", dbias));
    CUDA_ENTER(ctx, st);
    int64_t N = x->shape[0], C = x->shape[1], S = x->shape[2] * x->shape[3];
    if (N * C * S == 0) return LUCID_OK;
    const float *sm = (const float *)lucid_tensor_data(save_mean);
    const float *si = (const float *)lucid_tensor_data(save_invstd);
    const float *w = weight ? (const float *)lucid_tensor_data(weight) : NULL;
    const float *b = (silu && bias) ? (const float *)lucid_tensor_data(bias) : NULL;
    bool need_sums = dweight || dbias || (dx && training);
    float3 *coef = NULL;
    if (need_sums) {
        lucid_cuda_nn_state *ns = lucid_cuda_nn_get(ctx, st);
        if (!ns) return ctx->last_status;
        bn_geom g = bn_geom_of(N, C, S);
        if (g.parts > INT32_MAX)
            return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: batch too large", op);
        size_t pbytes = nn_align(sizeof(float2) * (size_t)(g.parts * C));
        void *ws = NULL;
        LUCID_TRY(lucid_cuda_nn_arena(ctx, st, ns,
                                      pbytes + sizeof(float3) * (size_t)C, op,
                                      &ws));
        unsigned int *count = NULL; /* NULL: the two-launch fallback */
        LUCID_TRY(lucid_cuda_nn_counters(ctx, st, ns, C, &count));
        float2 *part = (float2 *)ws;
        coef = (dx && training) ? (float3 *)((char *)ws + pbytes) : NULL;
        bn_grad_out go;
        go.w = w;
        go.invstd = si;
        go.dweight = dweight ? (float *)lucid_tensor_data(dweight) : NULL;
        go.dbias = dbias ? (float *)lucid_tensor_data(dbias) : NULL;
        go.beta = beta_params;
        go.coef = coef;
        dim3 grid((unsigned)g.parts, bn_grid_y(C));
        bool with_x = dweight || (dx && training);
        const float *nof = NULL;
        if (silu) /* g needs x whatever is asked */
            NN_DISPATCH(x->dtype, (lucid_launch(bn_grad_partial<T, true, true>, grid,
                                                dim3(BN_THREADS), 0, st->stream,
                                                (const T *)lucid_tensor_data(dy),
                                                (const T *)lucid_tensor_data(x), sm, si, w,
                                                b, g, part, count, go)));
        else if (with_x)
            NN_DISPATCH(x->dtype, (lucid_launch(bn_grad_partial<T, true, false>, grid,
                                                dim3(BN_THREADS), 0, st->stream,
                                                (const T *)lucid_tensor_data(dy),
                                                (const T *)lucid_tensor_data(x), sm, si, nof,
                                                nof, g, part, count, go)));
        else
            NN_DISPATCH(x->dtype, (lucid_launch(bn_grad_partial<T, false, false>, grid,
                                                dim3(BN_THREADS), 0, st->stream,
                                                (const T *)lucid_tensor_data(dy),
                                                (const T *)NULL, sm, si, nof, nof, g, part,
                                                count, go)));
        CUDA_CHECK_LAUNCH(ctx, "bn_grad_partial");
        if (!count) {
            lucid_launch(bn_grad_final, dim3(1, bn_grid_y(C)), dim3(BN_THREADS), 0,
                         st->stream, (const float2 *)part, g, go);
            CUDA_CHECK_LAUNCH(ctx, "bn_grad_final");
        }
    }
    if (!dx) return LUCID_OK;
    dim3 grid;
    plane_grid(S, N * C, &grid);
    float bi = (float)beta_input;
#define BN_DX_LAUNCH(TR, SI)                                                  \
    NN_DISPATCH(x->dtype, (lucid_launch(bn_dx<T, TR, SI>, grid, dim3(BN_THREADS), 0, \
                                        st->stream, (const T *)lucid_tensor_data(x), \
                                        (const T *)lucid_tensor_data(dy),     \
                                        (T *)lucid_tensor_data(dx), C, S, N * C, sm, \
                                        si, w, b, (const float3 *)coef, bi)))
    if (training && silu) BN_DX_LAUNCH(true, true);
    else if (training) BN_DX_LAUNCH(true, false);
    else if (silu) BN_DX_LAUNCH(false, true);
    else BN_DX_LAUNCH(false, false);
#undef BN_DX_LAUNCH
    CUDA_CHECK_LAUNCH(ctx, "bn_dx");
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
    const float *nof = NULL;
    NN_DISPATCH(dt, (lucid_launch(bn_grad_partial<T, false, false>, grid, dim3(BN_THREADS), 0,
                                  st->stream, (const T *)dy, (const T *)NULL, nof, nof, nof,
                                  nof, g, (float2 *)ws, count, go)));
    CUDA_CHECK_LAUNCH(ctx, "bn_grad_partial (bias)");
    if (!count) {
        lucid_launch(bn_grad_final, dim3(1, bn_grid_y(C)), dim3(BN_THREADS), 0, st->stream,
                     (const float2 *)ws, g, go);
        CUDA_CHECK_LAUNCH(ctx, "bn_grad_final (bias)");
    }
    return LUCID_OK;
}
