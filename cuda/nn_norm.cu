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
 * Forward statistics: per-thread shifted sums (shift = the channel's first
 * element) turned into (count, mean, M2) and merged with Chan's formula, so
 * the variance does not suffer from E[x^2]-E[x]^2 cancellation.
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
 * 64-bit scalar route (huge tensors).  The element-wise kernels have no
 * reduction, so their route never changes bits.
 *
 * One pass (parts == 1).  When a channel is one part, training fuses the
 * two launches of each direction into one kernel, one block per channel
 * (grid (1, min(C, 65535)), channels strided by grid.y): bn_stats_apply1
 * computes channel c's statistics exactly as bn_stats_partial's one-part
 * path (same walk, vector width, tree, f64 finish, running stats,
 * num_batches_tracked), thread 0 passes the f32 save_mean/save_invstd it
 * stored to the block through shared memory, and after a barrier the
 * block writes the channel's y with bn_apply's per-element arithmetic
 * (vectors of the apply's vector choice, walked like a part: plane
 * offsets 64-bit, so no separate route for huge tensors);
 * bn_grad_dx1 likewise computes bn_grad_partial's one-part sums and
 * finish (dweight/dbias with beta) and then the channel's dx with bn_dx's
 * per-element arithmetic from the f32 coefficients bn_grad_finish would
 * have stored (shared memory instead of the arena).  Each block reads its
 * channel twice (the second time mostly from L2) but the layer costs one
 * launch per direction: the small late layers are launch-latency bound.
 * Every value is computed by the same expressions in the same order, so
 * the results equal the two-launch route's bitwise.  Only the training
 * forward and the training backward with dx take it (dweight/dbias alone
 * is one launch already, eval has no reduction before the element-wise
 * pass); multi-part channels never do.  LUCID_BN_ONEPASS=0 in the
 * environment (read on each call; unset or anything else: on) keeps the
 * two-launch route for A/B runs.  The choice depends on the shape and that
 * switch only; the host bookkeeping (arena, counters) is the same either
 * way, so eager calls and captured graphs take the same route.  Test hook:
 * lucid_cuda_bn_launch_count() counts the kernels this thread's BatchNorm
 * calls queued.
 *
 * Launches (counter route, or any route with parts == 1; the fallback adds
 * one final per reduction when parts > 1): training forward 2 (stats
 * partial[+fold], apply), 1 with parts == 1 (one pass; 2 with
 * LUCID_BN_ONEPASS=0), eval forward 2 (stats_eval, apply), training
 * backward 2 (grad partial[+fold], dx; 1 with parts == 1 (one pass; 2 with
 * LUCID_BN_ONEPASS=0); 1 without dx), eval backward 1 (dx) or 2 with
 * dweight/dbias, the per-channel sum 1.  E.g. N=4 (YOLO, 640):
 * 16x320x320 has 52 parts per channel (13 chunks of 7880 per plane),
 * 32x160x160 16 (4 of 6400), 64x80x80 4 (whole planes), 128x40x40 and
 * 256x20x20 1 (one pass: 1 launch forward, 1 backward).  Every kernel
 * starts with lucid_pdl_wait();
 * lucid_pdl_launch_dependents(); (in every thread, before any early return)
 * and is queued with lucid_launch() (launch.cuh: programmatic dependent
 * launch: a kernel may be scheduled before its predecessor ends, and waits
 * for it before touching memory).
 *
 * Fused BatchNorm2d + SiLU (lucid_cuda_batchnorm2d_silu_*): the same
 * launches with the SiLU inside.  Forward: the statistics kernel above
 * unchanged, then bn_apply<..., true> stores a = z*sigmoid(z) of the f32
 * z = fmaf(x, sc, sh) (z never stored): 2 launches in training (stats
 * partial+fold, apply) instead of 3 for batchnorm then silu, 2 in eval.
 * Backward: bn_grad_partial and bn_dx recompute z from x, the saved
 * statistics, weight and bias, and use g = dy * s * (1 + z*(1-s)) where
 * the plain kernels use dy (g never stored): 2 launches (grad partial+fold,
 * dx) instead of 3.  With one part per channel the one-pass kernels
 * (bn_stats_apply1<..., true>, bn_grad_dx1<..., true>) do the same in 1
 * launch each.  The partition and the folding order are those of the
 * plain kernels, so the fused results are as deterministic.
 * Source: PyTorch nn.BatchNorm2d docs; Chan, Golub, LeVeque (1979); nn.SiLU
 * docs.
 */
#include "nn_common.cuh"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BN_THREADS 256 /* every kernel here except bn_stats_eval */
#define BN_PART 8192   /* elements per part (at most) of the reductions */
#define BN_UNROLL 4    /* vectors a thread loads before it uses them */
#define BN_WAVE 4      /* element-wise grids: at most this many blocks per SM */

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

/* The forward's output of one element: z = fmaf(x, sc, sh), SILU: z *
 * sigmoid(z) (z kept in f32). */
template <bool SILU>
static __device__ __forceinline__ float bn_out(float x, float sc, float sh) {
    float z = fmaf(x, sc, sh);
    return SILU ? z * nn_sigmoid(z) : z;
}

/* dL/dz of a = silu(z): dy * s * (1 + z*(1-s)) (the formula of silu_bwd). */
static __device__ __forceinline__ float bn_silu_grad(float dy, float z) {
    float s = nn_sigmoid(z);
    return dy * s * (1.0f + z * (1.0f - s));
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

/* What the statistics finish writes (training forward). */
typedef struct bn_stats_out {
    float *save_mean, *save_invstd;
    float *running_mean, *running_var; /* nullable */
    void *nbt;                         /* num_batches_tracked, nullable */
    int nbt_dt;
    double momentum, eps;
} bn_stats_out;

/* Channel c's results from its (count n, mean, M2) in f64 (one thread):
 * save_mean / save_invstd, the running stats and, for c == 0 only,
 * num_batches_tracked += 1 (once per forward).  Returns the f32 (mean,
 * invstd) it stored in save_mean[c] / save_invstd[c]. */
static __device__ float2 bn_stats_finish(double n, double mean, double m2, int64_t c,
                                         const bn_stats_out &out) {
    if (m2 < 0.0) m2 = 0.0;
    double var = m2 / n; /* biased: normalisation */
    float2 kept;
    kept.x = (float)mean;
    out.save_mean[c] = kept.x;
    kept.y = (float)(1.0 / sqrt(var + out.eps));
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
    return kept;
}

/* Channel c's statistics from its `parts` (> 1) partials pp[0..parts) =
 * (n_i, mean_i, M2_i): called by every thread of a BN_THREADS block
 * (block-uniform), thread 0 finishes (bn_stats_finish).
 * f64 sums shifted by K = mean_0 (part 0 is the largest part):
 *   n = sum n_i, s = sum n_i*(mean_i - K), q = sum M2_i + n_i*(mean_i - K)^2,
 *   mean = K + s/n, M2 = q - s^2/n  (Chan's merge of all parts at once).
 * The cancellation in q - s^2/n is bounded: n_0*(mean_0 - mean)^2 <= M2, so
 * s^2/n <= M2 * n/n_0 <= M2 * parts, a relative error of about
 * parts * 2^-53 on M2 (1e-11 for 1e5 parts), far below the f32 partials'.
 * Fixed order: thread t adds parts t, t+BN_THREADS, ... in that order, then
 * bn_block_sum64 of the three sums at once.  Nothing depends on blockIdx,
 * so the last-arriving block of bn_stats_partial (whichever it is) and the
 * fallback bn_stats_final give the same bits.  The partials are read with
 * ld.global.cg (L2): other blocks of this grid wrote them. */
static __device__ void bn_stats_fold(const float3 *pp, int64_t parts, int64_t c,
                                     const bn_stats_out &out) {
    __shared__ double sh[3][32];
    double K = (double)__ldcg((const float *)pp + 1);
    double v[3] = {0.0, 0.0, 0.0}; /* n, s, q */
    for (int64_t i = threadIdx.x; i < parts; i += BN_THREADS) {
        const float *p = (const float *)(pp + i);
        double ni = (double)__ldcg(p), d = (double)__ldcg(p + 1) - K;
        double sd = ni * d;
        v[0] += ni;
        v[1] += sd;
        v[2] += (double)__ldcg(p + 2) + sd * d;
    }
    bn_block_sum64<3>(v, parts, sh);
    if (threadIdx.x != 0) return;
    double n = v[0], s = v[1], q = v[2];
    bn_stats_finish(n, K + s / n, q - s * (s / n), c, out);
}

/* One part of channel c: (count, mean, M2), thread 0 of the block holding
 * it.  K: the channel's shift (its first element). */
template <typename T, int V>
static __device__ __forceinline__ bn_mv bn_stats_part(const T *__restrict__ xp,
                                                      const bn_part &pt, int64_t CS,
                                                      float K, bn_mv *sh) {
    typedef bn_vec<T, V> Vt;
    typedef typename Vt::R R;
    float a1 = 0.0f, a2 = 0.0f;
    unsigned nvec = 0;
    bn_walk w = bn_walk_first(pt);
    while (w.j < pt.total) {
        R r[BN_UNROLL];
        bool ok[BN_UNROLL];
#pragma unroll
        for (int u = 0; u < BN_UNROLL; u++) {
            ok[u] = w.j < pt.total;
            r[u] = R();
            if (ok[u]) r[u] = Vt::load(xp + bn_walk_elem<V>(w, CS));
            bn_walk_next(w, pt);
        }
#pragma unroll
        for (int u = 0; u < BN_UNROLL; u++) {
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
template <typename T, int V>
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
        bn_mv r = bn_stats_part<T, V>(x + pt.base + c * g.S, pt, g.CS, K, sh);
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
template <typename T, int V, typename I, bool SILU>
static __global__ void __launch_bounds__(BN_THREADS)
bn_apply(const T *__restrict__ x, T *__restrict__ y, bn_flat<I> f, const float *mean,
         const float *invstd, const float *w, const float *b) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    typedef bn_vec<T, V> Vt;
    typedef typename Vt::R R;
    bn_at<I> a = bn_at_first(f);
    while (a.j < f.nv) {
        R r[BN_UNROLL];
        I at[BN_UNROLL];
        float sc[BN_UNROLL], sh[BN_UNROLL];
#pragma unroll
        for (int u = 0; u < BN_UNROLL; u++) {
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
        for (int u = 0; u < BN_UNROLL; u++) {
            if (at[u] >= f.nv) break;
            float v[V];
            Vt::unpack(r[u], v);
#pragma unroll
            for (int k = 0; k < V; k++) v[k] = bn_out<SILU>(v[k], sc[u], sh[u]);
            Vt::store(y + (size_t)at[u] * V, Vt::pack(v));
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
 * other route). */
template <typename T, int VS, int VA, bool SILU>
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
    for (int64_t c = blockIdx.y; c < g.C; c += gridDim.y) {
        float K = lucid_elem<T>::load(x + c * g.S, 0); /* channel shift */
        bn_mv r = bn_stats_part<T, VS>(x + ps.base + c * g.S, ps, g.CS, K, sh);
        /* kept is rewritten only after the next channel's bn_stats_part
         * barriers, which every thread reaches after reading it below */
        if (threadIdx.x == 0)
            kept = bn_stats_finish((double)r.n, (double)r.mean, (double)r.m2, c, out);
        __syncthreads();
        float sc, shf;
        {
            float wc = w ? w[c] : 1.0f, is = kept.y, bc = b ? b[c] : 0.0f;
            bn_affine_of(kept.x, is, wc, bc, &sc, &shf);
        }
        const int64_t base = pa.base + c * g.S;
        bn_walk wk = bn_walk_first(pa);
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
                    e[u] = base + bn_walk_elem<VA>(wk, g.CS);
                    rv[u] = Vt::load(x + e[u]);
                }
                bn_walk_next(wk, pa);
            }
#pragma unroll
            for (int u = 0; u < BN_UNROLL; u++) {
                if (!ok[u]) break;
                float v[VA];
                Vt::unpack(rv[u], v);
#pragma unroll
                for (int k = 0; k < VA; k++) v[k] = bn_out<SILU>(v[k], sc, shf);
                Vt::store(y + e[u], Vt::pack(v));
            }
        }
    }
}

template <typename T, bool SILU>
static void bn_launch_apply(int route, unsigned grid, int64_t N, int64_t C, int64_t S,
                            cudaStream_t stream, const T *x, T *y, const float *mean,
                            const float *invstd, const float *w, const float *b) {
    const int VV = bn_width<T>::V;
    int64_t NCS = N * C * S;
    if (route == BN_ROUTE_VEC)
        lucid_launch(bn_apply<T, VV, uint32_t, SILU>, dim3(grid), dim3(BN_THREADS), 0, stream,
                     x, y, bn_flat_of<uint32_t>(NCS, C, S, VV, grid), mean, invstd, w, b);
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
    if (vec)
        lucid_launch(bn_stats_partial<T, bn_width<T>::V>, grid, dim3(BN_THREADS), 0, stream, x,
                     g, partial, count, so);
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
    if (vs && va)
        lucid_launch(bn_stats_apply1<T, VV, VV, SILU>, grid, dim3(BN_THREADS), 0, stream, x, y,
                     g, so, w, b);
    else if (vs)
        lucid_launch(bn_stats_apply1<T, VV, 1, SILU>, grid, dim3(BN_THREADS), 0, stream, x, y,
                     g, so, w, b);
    else
        lucid_launch(bn_stats_apply1<T, 1, 1, SILU>, grid, dim3(BN_THREADS), 0, stream, x, y,
                     g, so, w, b);
}

/* LUCID_BN_ONEPASS, read on each call: "0" = the two-launch route for
 * channels of one part; unset or anything else = the one-pass kernels. */
static bool bn_onepass(void) {
    const char *e = getenv("LUCID_BN_ONEPASS");
    return !(e && strcmp(e, "0") == 0);
}

/* Kernels queued by this thread's BatchNorm forward / backward calls so far
 * (not the conv bias sum): the test hook lucid_cuda_bn_launch_count
 * (nn_common.cuh); nothing here reads it. */
static thread_local unsigned long bn_launches;

extern "C" unsigned long lucid_cuda_bn_launch_count(void) { return bn_launches; }

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
            bn_launches += 1;
            return LUCID_OK;
        }
        NN_DISPATCH(x->dtype, bn_launch_stats<T>(vec, grid, st->stream, (const T *)xd, g,
                                                 (float3 *)ws, count, so));
        CUDA_CHECK_LAUNCH(ctx, "bn_stats_partial");
        bn_launches += 1;
        if (!count && g.parts > 1) {
            lucid_launch(bn_stats_final, dim3(1, bn_grid_y(C)), dim3(BN_THREADS), 0,
                         st->stream, (const float3 *)ws, g, so);
            CUDA_CHECK_LAUNCH(ctx, "bn_stats_final");
            bn_launches += 1;
        }
    } else {
        lucid_launch(bn_stats_eval, dim3(cblocks), dim3(128), 0, st->stream, C,
                     (const float *)rm, (const float *)rv, sm, si, eps);
        CUDA_CHECK_LAUNCH(ctx, "bn_stats_eval");
        bn_launches += 1;
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
    bn_launches += 1;
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
static __device__ __forceinline__ float4 bn_grad_coef(double sdy, double sdyx,
                                                      const bn_geom &g, int64_t c,
                                                      const float *w, const float *invstd) {
    double M = (double)g.N * (double)g.S;
    double k = (w ? (double)w[c] : 1.0) * (double)invstd[c];
    return make_float4((float)k, (float)(sdy / M), (float)(sdyx / M), 0.0f);
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
 * block calls it, thread 0 finishes.  The last block of bn_grad_partial
 * (whichever it is) and the fallback bn_grad_final give the same bits. */
static __device__ void bn_grad_fold(const float2 *pp, const bn_geom &g, int64_t c,
                                    const bn_grad_out &out) {
    __shared__ double sh[2][32];
    double v[2] = {0.0, 0.0};
    for (int64_t i = threadIdx.x; i < g.parts; i += BN_THREADS) {
        float2 q = __ldcg(pp + i);
        v[0] += (double)q.x;
        v[1] += (double)q.y;
    }
    bn_block_sum64<2>(v, g.parts, sh);
    if (threadIdx.x != 0) return;
    bn_grad_finish(v[0], v[1], g, c, out);
}

/* One part's per-thread sums (before the block tree): *a = sum g, *bsum =
 * sum g*xhat (WITH_X), xhat = (x - mu)*is; g = dy, or SILU: dy * silu'(z),
 * z = fmaf(x, zs, zh).  dyp, xp: the part's first element in channel c. */
template <typename T, int V, bool WITH_X, bool SILU>
static __device__ __forceinline__ void bn_grad_part(const T *__restrict__ dyp,
                                                    const T *__restrict__ xp,
                                                    const bn_part &pt, int64_t CS, float mu,
                                                    float is, float zs, float zh, float *sa,
                                                    float *sb) {
    typedef bn_vec<T, V> Vt;
    typedef typename Vt::R R;
    float a = 0.0f, bsum = 0.0f;
    bn_walk wk = bn_walk_first(pt);
    while (wk.j < pt.total) {
        R rg[BN_UNROLL], rx[BN_UNROLL];
        bool ok[BN_UNROLL];
#pragma unroll
        for (int u = 0; u < BN_UNROLL; u++) {
            ok[u] = wk.j < pt.total;
            rg[u] = R();
            rx[u] = R();
            if (ok[u]) {
                int64_t e = bn_walk_elem<V>(wk, CS);
                rg[u] = Vt::load(dyp + e);
                if (WITH_X) rx[u] = Vt::load(xp + e);
            }
            bn_walk_next(wk, pt);
        }
#pragma unroll
        for (int u = 0; u < BN_UNROLL; u++) {
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

/* One block per (part, channel): (sum g, sum g*xhat) of the part (the
 * second only when WITH_X), g = dy, or SILU (needs WITH_X): g = dy *
 * silu'(z) with z recomputed from x (w, b: the forward's weight and bias,
 * nullable).  parts == 1: thread 0 finishes the channel.  Otherwise
 * partial[(c*parts + part)] = the sums; with count (the nn state's zeroed
 * arrival counters) the last block of channel c folds its partials
 * (bn_grad_fold); count NULL: bn_grad_final does, in a launch of its own. */
template <typename T, int V, bool WITH_X, bool SILU>
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
        bn_grad_part<T, V, WITH_X, SILU>(dyp, xp, pt, g.CS, mu, is, zs, zh, &a, &bsum);
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

/* dx = beta*dx + k*(g - mdy - xhat*mdyx)   (TRAIN)
 * dx = beta*dx + w*invstd*g                (eval)
 * g = dy, or SILU: dy * silu'(z), z recomputed from x (b: the forward's
 * bias, nullable).  Flat over the N*C*S/V vectors (bn_flat). */
template <typename T, int V, typename I, bool TRAIN, bool SILU>
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
        R rg[BN_UNROLL], rx[BN_UNROLL], rd[BN_UNROLL];
        I at[BN_UNROLL];
        float k[BN_UNROLL], mdy[BN_UNROLL], mdyx[BN_UNROLL], mu[BN_UNROLL], is[BN_UNROLL];
        float zs[BN_UNROLL], zh[BN_UNROLL];
#pragma unroll
        for (int u = 0; u < BN_UNROLL; u++) {
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
        for (int u = 0; u < BN_UNROLL; u++) {
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
 * read only when beta != 0), VA-element vectors (bn_dx's vector choice). */
template <typename T, int VS, int VA, bool SILU>
static __global__ void __launch_bounds__(BN_THREADS)
bn_grad_dx1(const T *__restrict__ dy, const T *__restrict__ x, T *dx, const float *mean,
            const float *invstd, const float *w, const float *b, bn_geom g, bn_grad_out out,
            float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    typedef bn_vec<T, VA> Vt;
    typedef typename Vt::R R;
    __shared__ float2 sh[32];
    __shared__ float4 cf; /* channel c's (k, mean(g), mean(g*xhat), 0) */
    const bn_part ps = bn_part_of<VS>(g, 0), pa = bn_part_of<VA>(g, 0);
    for (int64_t c = blockIdx.y; c < g.C; c += gridDim.y) {
        float mu = mean[c], is = invstd[c];
        float zs = 0.0f, zh = 0.0f;
        if (SILU) bn_affine(c, mean, invstd, w, b, &zs, &zh);
        float a, bsum;
        bn_grad_part<T, VS, true, SILU>(dy + ps.base + c * g.S, x + ps.base + c * g.S, ps,
                                        g.CS, mu, is, zs, zh, &a, &bsum);
        bn_block_sum2(a, bsum, sh);
        /* cf is rewritten only after the next channel's bn_block_sum2
         * barriers, which every thread reaches after reading it below */
        if (threadIdx.x == 0) {
            bn_grad_finish((double)a, (double)bsum, g, c, out);
            cf = bn_grad_coef((double)a, (double)bsum, g, c, out.w, out.invstd);
        }
        __syncthreads();
        const float4 q = cf;
        const int64_t base = pa.base + c * g.S;
        bn_walk wk = bn_walk_first(pa);
        while (wk.j < pa.total) {
            R rg[BN_UNROLL], rx[BN_UNROLL], rd[BN_UNROLL];
            int64_t e[BN_UNROLL];
            bool ok[BN_UNROLL];
#pragma unroll
            for (int u = 0; u < BN_UNROLL; u++) {
                ok[u] = wk.j < pa.total;
                rg[u] = R();
                rx[u] = R();
                rd[u] = R();
                e[u] = 0;
                if (ok[u]) {
                    e[u] = base + bn_walk_elem<VA>(wk, g.CS);
                    rg[u] = Vt::load(dy + e[u]);
                    rx[u] = Vt::load(x + e[u]);
                    if (beta != 0.0f) rd[u] = Vt::load(dx + e[u]);
                }
                bn_walk_next(wk, pa);
            }
#pragma unroll
            for (int u = 0; u < BN_UNROLL; u++) {
                if (!ok[u]) break;
                float gv[VA], xv[VA], dv[VA];
                Vt::unpack(rg[u], gv);
                Vt::unpack(rx[u], xv);
                if (beta != 0.0f) Vt::unpack(rd[u], dv);
#pragma unroll
                for (int k = 0; k < VA; k++) {
                    float gk = gv[k];
                    if (SILU) gk = bn_silu_grad(gk, fmaf(xv[k], zs, zh));
                    float v = bn_dx_train(gk, xv[k], mu, is, q.x, q.y, q.z);
                    if (beta != 0.0f) v = fmaf(beta, dv[k], v);
                    gv[k] = v;
                }
                Vt::store(dx + e[u], Vt::pack(gv));
            }
        }
    }
}

template <typename T, bool TRAIN, bool SILU>
static void bn_launch_dx(int route, unsigned grid, int64_t N, int64_t C, int64_t S,
                         cudaStream_t stream, const T *x, const T *dy, T *dx,
                         const float *mean, const float *invstd, const float *w,
                         const float *b, const float4 *coef, float beta) {
    const int VV = bn_width<T>::V;
    int64_t NCS = N * C * S;
    if (route == BN_ROUTE_VEC)
        lucid_launch(bn_dx<T, VV, uint32_t, TRAIN, SILU>, dim3(grid), dim3(BN_THREADS), 0,
                     stream, x, dy, dx, bn_flat_of<uint32_t>(NCS, C, S, VV, grid), mean,
                     invstd, w, b, coef, beta);
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
    if (vec)
        lucid_launch(bn_grad_partial<T, bn_width<T>::V, WITH_X, SILU>, grid, dim3(BN_THREADS),
                     0, stream, dy, x, mean, invstd, w, b, g, partial, count, go);
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
    if (vs && va)
        lucid_launch(bn_grad_dx1<T, VV, VV, SILU>, grid, dim3(BN_THREADS), 0, stream, dy, x, dx,
                     mean, invstd, w, b, g, go, beta);
    else if (vs)
        lucid_launch(bn_grad_dx1<T, VV, 1, SILU>, grid, dim3(BN_THREADS), 0, stream, dy, x, dx,
                     mean, invstd, w, b, g, go, beta);
    else
        lucid_launch(bn_grad_dx1<T, 1, 1, SILU>, grid, dim3(BN_THREADS), 0, stream, dy, x, dx,
                     mean, invstd, w, b, g, go, beta);
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
            bn_launches += 1;
            return LUCID_OK;
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
        bn_launches += 1;
        if (!count && g.parts > 1) {
            lucid_launch(bn_grad_final, dim3(1, bn_grid_y(C)), dim3(BN_THREADS), 0,
                         st->stream, (const float2 *)part, g, go);
            CUDA_CHECK_LAUNCH(ctx, "bn_grad_final");
            bn_launches += 1;
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
    bn_launches += 1;
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
