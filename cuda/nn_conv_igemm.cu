/*
 * nn_conv_igemm.cu — implicit-GEMM Conv2d in NCHW on tensor cores (WMMA,
 * bf16/f16 operands, f32 accumulation); the bf16/f16 route of nn_conv.cu for
 * groups == 1.  Interface and guarantees: nn_conv_igemm.cuh.
 *
 * Why: cuDNN's legacy API costs 0.05-0.35 ms per call on this network's small
 * convolutions whatever their size, plus ~34 ms of heuristics per new shape
 * and pass; measured by bench/conv_lab (H200, 2026-11-29) the network's 287
 * conv calls per step took 33.2 ms through cuDNN NCHW and 9.5 ms through
 * implicit-GEMM kernels of this design (NHWC there).  Formulation as in the
 * classic im2col GEMM of Caffe/Torch7 (SpatialConvolutionMM), with the
 * im2col gather done while staging tiles instead of in a buffer.
 *
 * The three GEMMs  C[M][Nc] = sum_k A(m,k) B(k,n):
 *   forward   M = Cout, Nc = N*Ho*Wo, K = Cin*kh*kw
 *             A(co, k)   = w[co][k]                (k = ci,r,q: KCRS order)
 *             B(k, pix)  = x[img][ci][ho*sh-ph+r*dh][wo*sw-pw+q*dw]  (0 outside)
 *             C(co, pix) -> y[img][co][ho][wo] (+ b[co])
 *   backward-data  M = Cin, Nc = N*H*W, K = Cout*kh*kw
 *             A(ci, k)   = w[co][ci][r][q]          (k = co,r,q)
 *             B(k, pix)  = dy[img][co][(h+ph-r*dh)/sh][(w+pw-q*dw)/sw]
 *                          (0 unless both divisions are exact and in range)
 *             C(ci, pix) -> dx[img][ci][h][w] (beta*dx + C)
 *   backward-filter  M = Cout, Nc = Cin*kh*kw, K = N*Ho*Wo (split into
 *             `splits` fixed chunks of whole BK tiles)
 *             A(co, p)   = dy[img][co][ho][wo]     (p = img,ho,wo)
 *             B(p, k)    = x[img][ci][ho*sh-ph+r*dh][wo*sw-pw+q*dw]
 *             C(co, k)   -> dw[co][k] (beta*dw + C; with splits > 1 each
 *                          split writes its f32 partial and reduce_splits
 *                          adds them in split order)
 *
 * Numerics: operands are rounded to the activation dtype once (the f32
 * weights when staged, like the cast of cuDNN's route), products are summed
 * in f32 by the tensor cores (order fixed by the tile schedule), the output
 * is rounded once.  Not bitwise equal to cuDNN; within the CPU-vs-CUDA
 * tolerances of spec/c/test_nn_cuda.c.
 *
 * Tiles: 64x64 output tile per block of 4 warps (each 32x32 = 2x2 WMMA
 * 16x16x16 fragments), k step 32, the next k tile loaded into registers while
 * the current one is multiplied.  Each thread keeps a fixed output column
 * (pixel) of the B tile, so the pixel's decomposition is computed once per
 * block; kernel sizes 1 and 3 are compile-time constants (KS) so the k
 * decomposition divides by constants.  3x3 passes with enough channels run
 * tap-major (KT3, nn_conv_igemm_tile.cuh): one tap per k tile, so the
 * gather's bounds test is made once per tile.  Grids smaller than the GPU
 * are split along K (split-K), the f32 partials folded by a second kernel.
 * The tile code (parameters, loaders, epilogue) is in
 * nn_conv_igemm_tile.cuh; this file holds the kernels and the planning.
 *
 * Strided backward-data (sh or sw > 1, dilation 1) runs one GEMM per
 * stride phase (Phase, nn_conv_igemm_tile.cuh): K = Cout*nR*nQ instead of
 * Cout*kh*kw.  With Cin % 8 == 0 it runs on igemm_dgrad_ph (tile and
 * rationale: nn_conv_igemm_ph.cuh): A from the weight pre-cast and
 * transposed tap-major (wt, lucid_conv_igemm_wt_src: 16-byte loads of 8
 * input channels instead of one strided f32 load per element), k loops of
 * small grids split between 2 or 4 groups of warps of a block (added in
 * group order), 16 x 128 tiles for Cin <= 16.  wt comes from the weight
 * shadow (the group cast writes it once per weight change, cuda/nn_conv.cu)
 * or from a per-call cast into the scratch (igemm_wt_cast; same bits).
 * LUCID_DGRAD_PHASE=0 runs igemm_nchw's phase form instead (bit for bit the
 * former kernel).  Expected on the H200 for YOLO11n-pose's six stride-2
 * 3x3 backward-data passes (0.294 ms on the recorded step's critical path
 * before): not yet measured.
 */
#include "nn_conv_igemm.cuh"
#include "nn_conv_igemm_tile.cuh"
#include "nn_conv_igemm_ph.cuh"
#include "launch.cuh"
#include "internal.h" /* lucid_env_int */

#include <mma.h>
#include <stdlib.h>

namespace wm = nvcuda::wmma;

/* Shared memory of a block: the A and B tiles during the k loop, then the f32
 * output tile (the loop's last __syncthreads ends every read of A and B, so
 * the output tile reuses their bytes: 17.4 KB a block instead of 27.6 KB). */
#define IG_SMEM_AB ((BM * LDA + SB_ELEMS) * 2)
#define IG_SMEM_C (BM * LDC * 4)
#define IG_SMEM (IG_SMEM_AB > IG_SMEM_C ? IG_SMEM_AB : IG_SMEM_C)

/* LUCID_IGEMM_MINB: minimum resident blocks per SM asked of the register
 * allocator (__launch_bounds__'s second argument) for every variant; 0 (the
 * default) takes each variant's own bound, ig_min_blocks (tile header). A
 * build-time knob for bench/conv_lab A/B runs (EXTRA_NVCCFLAGS). */
#ifndef LUCID_IGEMM_MINB
#define LUCID_IGEMM_MINB 0
#endif
#if LUCID_IGEMM_MINB > 0
#define IG_BOUNDS __launch_bounds__(NT, LUCID_IGEMM_MINB)
#else
#define IG_BOUNDS __launch_bounds__(NT, ig_min_blocks(MODE, KS))
#endif

/* WMMA fragment loads from shared memory.  For bf16, nvcc 13's
 * wmma::load_matrix_sync emits the generic-address wmma.load (32 LD.E per
 * k step of a warp instead of 8 LDSM for the f16 builtin, read in the SASS);
 * these issue the .shared form of the same PTX instruction (PTX ISA,
 * "wmma.load"), same fragment layout, so the same values reach the MMA.
 * LUCID_WMMA_GENERIC=1 (build knob, bench/conv_lab EXTRA_NVCCFLAGS) keeps
 * the builtin for an A/B. f16 always takes the builtin. */
#ifndef LUCID_WMMA_GENERIC
#define LUCID_WMMA_GENERIC 0
#endif
template <typename Frag, typename T>
static __device__ __forceinline__ void ig_ld_a(Frag &f, const T *p, unsigned ldm) {
    wm::load_matrix_sync(f, p, ldm);
}
template <typename Frag, typename T>
static __device__ __forceinline__ void ig_ld_b(Frag &f, const T *p, unsigned ldm) {
    wm::load_matrix_sync(f, p, ldm);
}
#if !LUCID_WMMA_GENERIC
typedef wm::fragment<wm::matrix_a, 16, 16, 16, __nv_bfloat16, wm::row_major> ig_fa_bf16;
typedef wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::row_major> ig_fbr_bf16;
typedef wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::col_major> ig_fbc_bf16;
template <>
__device__ __forceinline__ void ig_ld_a(ig_fa_bf16 &f, const __nv_bfloat16 *p, unsigned ldm) {
    unsigned *r = reinterpret_cast<unsigned *>(f.x);
    asm volatile("wmma.load.a.sync.aligned.row.m16n16k16.shared.bf16 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((unsigned)__cvta_generic_to_shared(p)), "r"(ldm));
}
template <>
__device__ __forceinline__ void ig_ld_b(ig_fbr_bf16 &f, const __nv_bfloat16 *p, unsigned ldm) {
    unsigned *r = reinterpret_cast<unsigned *>(f.x);
    asm volatile("wmma.load.b.sync.aligned.row.m16n16k16.shared.bf16 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((unsigned)__cvta_generic_to_shared(p)), "r"(ldm));
}
template <>
__device__ __forceinline__ void ig_ld_b(ig_fbc_bf16 &f, const __nv_bfloat16 *p, unsigned ldm) {
    unsigned *r = reinterpret_cast<unsigned *>(f.x);
    asm volatile("wmma.load.b.sync.aligned.col.m16n16k16.shared.bf16 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((unsigned)__cvta_generic_to_shared(p)), "r"(ldm));
}
/* col-major A (igemm_dgrad_ph: A(m, k) at k*ldm + m) */
typedef wm::fragment<wm::matrix_a, 16, 16, 16, __nv_bfloat16, wm::col_major> ig_fac_bf16;
template <>
__device__ __forceinline__ void ig_ld_a(ig_fac_bf16 &f, const __nv_bfloat16 *p, unsigned ldm) {
    unsigned *r = reinterpret_cast<unsigned *>(f.x);
    asm volatile("wmma.load.a.sync.aligned.col.m16n16k16.shared.bf16 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((unsigned)__cvta_generic_to_shared(p)), "r"(ldm));
}
#endif

template <typename T, int MODE, int KS>
__global__ void IG_BOUNDS igemm_nchw(IgP P) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    typedef typename std::conditional<MODE == IG_WGRAD, wm::col_major, wm::row_major>::type BLay;
    static_assert(sizeof(T) == 2, "igemm_nchw: 16-bit operands (IG_SMEM counts 2 bytes)");
    __shared__ __align__(128) unsigned char smem[IG_SMEM];
    T *sA = (T *)smem;
    T *sB = sA + BM * LDA;
    float *sC = (float *)smem;

    const int t = threadIdx.x;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
    Phase f;
    if (MODE == IG_DGRAD_PH) {
        f = phase_of(P, blockIdx.z);
        if (n0 >= f.Nc) return; /* grid.x is sized for the largest phase */
    } else {
        f.a = f.b = f.h0 = f.w0 = f.Hp = f.Wp = f.nR = f.nQ = 0;
        f.Nc = P.Nc;
        f.K = P.K;
    }
    int kbeg, kend;
    k_range(P, f, MODE, blockIdx.z, kbeg, kend);
    const int warp = t >> 5, wr = (warp >> 1) * 32, wc = (warp & 1) * 32;

    wm::fragment<wm::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wm::fill_fragment(acc[i][j], 0.0f);

    Stage<T, MODE, KS> st;
    st.init(P, f, n0, kbeg, t);
    if (kbeg < kend) st.load(P, f, m0, n0, kbeg, kend, t);
    for (int k0 = kbeg; k0 < kend; k0 += BK) {
        st.store(sA, sB, t);
        __syncthreads();
        if (k0 + BK < kend) st.load(P, f, m0, n0, k0 + BK, kend, t);
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::row_major> fa[2];
            wm::fragment<wm::matrix_b, 16, 16, 16, T, BLay> fb[2];
#pragma unroll
            for (int i = 0; i < 2; i++)
                ig_ld_a(fa[i], sA + (wr + i * 16) * LDA + kk, LDA);
#pragma unroll
            for (int j = 0; j < 2; j++) {
                if (MODE == IG_WGRAD)
                    ig_ld_b(fb[j], sB + (wc + j * 16) * LDBC + kk, LDBC);
                else
                    ig_ld_b(fb[j], sB + kk * LDBR + wc + j * 16, LDBR);
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wm::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wm::store_matrix_sync(sC + (wr + i * 16) * LDC + wc + j * 16, acc[i][j], LDC,
                                  wm::mem_row_major);
    __syncthreads();

    epilogue<T, MODE>(P, f, m0, n0, blockIdx.z, t, sC);
}

/* dw[i] = beta*dw[i] + sum over splits s = 0, 1, ... of part[s][i] */
__global__ void igemm_reduce_splits(const float *__restrict__ part, float *dw, int n, int splits,
                                    float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float s = part[i];
        for (int k = 1; k < splits; k++) s += part[(size_t)k * n + i];
        dw[i] = beta != 0.0f ? fmaf(beta, dw[i], s) : s;
    }
}

/* The same fold for many splits (> 16): one warp per element, lane l adds
 * splits l, l+32, ... in order, then a fixed xor-shuffle tree (every lane
 * ends with the same value).  A fixed order that depends on the split count
 * only: bitwise identical run to run.  The sequential fold above is a chain
 * of `splits` dependent adds per element, and with few elements (layer 0's
 * 16x27 filter gradient in 528 splits) nothing hides its load latency. */
__global__ void igemm_reduce_splits_warp(const float *__restrict__ part, float *dw, int n,
                                         int splits, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    for (int i = blockIdx.x * wpb + (threadIdx.x >> 5); i < n; i += gridDim.x * wpb) {
        float s = 0.0f;
        for (int k = lane; k < splits; k += 32) s += part[(size_t)k * n + i];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) dw[i] = beta != 0.0f ? fmaf(beta, dw[i], s) : s;
    }
}

/* Split-K forward / backward-data: out[i] = round(sum over splits s = 0, 1,
 * ... of part[s][i] (+ bias[c] | beta*out[i])), c = (i / plane) % M: the
 * same operations, in the same order, as the unsplit epilogue after the
 * f32 sum. */
template <typename T>
__global__ void igemm_reduce_out(const float *__restrict__ part, T *out, int n, int splits,
                                 const float *__restrict__ bias, int plane, int M, float beta) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = part[i];
        for (int k = 1; k < splits; k++) v += part[(size_t)k * n + i];
        if (bias) v += bias[(i / plane) % M];
        else if (beta != 0.0f) v = fmaf(beta, to_f<T>(out[i]), v);
        out[i] = to_t<T>(v);
    }
}

// ---------------------------------------------------------------------------
// stride-phase backward-data: igemm_dgrad_ph (tile: nn_conv_igemm_ph.cuh)

/* The barrier of k-slice g's 128 threads (bar.sync g+1: named barriers 1..4,
 * PTX ISA "bar.sync"); the whole block when there is one slice. */
template <int KS_>
static __device__ __forceinline__ void ph_bar(int g) {
    if (KS_ == 1) __syncthreads();
    else asm volatile("bar.sync %0, %1;" ::"r"(g + 1), "n"(NT) : "memory");
}

/* Minimum resident blocks per SM asked of the register allocator for
 * igemm_dgrad_ph with 1, 2 and 4 k-slices (nvcc 13.0, sm_90, no spills):
 * 5 blocks of 128 threads (96 registers; left free the 64-row tile takes
 * 128, 4 blocks), 2 of 256 and 1 of 512 (127 registers; 3 and 2 blocks
 * would need 85 and 64, which spill 36-300 bytes).  Build-time knobs for A/B
 * runs (bench/conv_lab EXTRA_NVCCFLAGS=-DLUCID_PH_MINB1=4 ...). */
#ifndef LUCID_PH_MINB1
#define LUCID_PH_MINB1 5
#endif
#ifndef LUCID_PH_MINB2
#define LUCID_PH_MINB2 2
#endif
#ifndef LUCID_PH_MINB4
#define LUCID_PH_MINB4 1
#endif
#define PH_MINB(ks) ((ks) == 1 ? LUCID_PH_MINB1 : (ks) == 2 ? LUCID_PH_MINB2 : LUCID_PH_MINB4)

/* dx of stride phase blockIdx.z for input channels m0 .. m0+TM-1 and phase
 * pixels n0 .. n0+TN-1 (nn_conv_igemm_ph.cuh: the GEMM, the tile, the
 * order of the sums), KS_ k-slices of NT threads.  P: plan_backward_data's
 * (lc 5, ct = ceil(Cout/BK)); wt: the transposed weight
 * (lucid_conv_igemm_wt_src), 16-byte aligned. */
template <typename T, int BM_, int KS_>
__global__ void __launch_bounds__(NT * KS_, PH_MINB(KS_))
    igemm_dgrad_ph(IgP P, const T *__restrict__ wt) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    typedef PhCfg<BM_> C;
    __shared__ __align__(128) unsigned char smem[PhSmem<BM_, KS_>::bytes];
    const int t = threadIdx.x, g = t / NT, tg = t - g * NT;
    const int n0 = blockIdx.x * C::TN, m0 = blockIdx.y * C::TM;
    const Phase f = phase_of(P, blockIdx.z);
    if (n0 >= f.Nc) return; /* grid.x is sized for the largest phase */
    int kb, ke;
    ph_slice(f.K / BK, KS_, g, kb, ke);
    T *sA = (T *)(smem + g * C::GSMEM);
    T *sB = sA + BK * C::LA;
    const int warp = tg >> 5;
    const int wr = (warp / C::WN) * (C::FM * 16), wc = (warp % C::WN) * (C::FN * 16);

    wm::fragment<wm::accumulator, 16, 16, 16, float> acc[C::FM][C::FN];
#pragma unroll
    for (int i = 0; i < C::FM; i++)
#pragma unroll
        for (int j = 0; j < C::FN; j++) wm::fill_fragment(acc[i][j], 0.0f);

    PhStage<T, BM_> st;
    if (kb < ke) {
        st.init(P, f, n0, kb, tg);
        st.load(P, f, wt, m0, tg);
    }
    for (int kt = kb; kt < ke; kt++) {
        st.store(sA, sB, tg);
        ph_bar<KS_>(g);
        if (kt + 1 < ke) st.load(P, f, wt, m0, tg);
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::col_major> fa[C::FM];
            wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::row_major> fb[C::FN];
#pragma unroll
            for (int i = 0; i < C::FM; i++) ig_ld_a(fa[i], sA + kk * C::LA + wr + i * 16, C::LA);
#pragma unroll
            for (int j = 0; j < C::FN; j++) ig_ld_b(fb[j], sB + kk * C::LB + wc + j * 16, C::LB);
#pragma unroll
            for (int i = 0; i < C::FM; i++)
#pragma unroll
                for (int j = 0; j < C::FN; j++) wm::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        ph_bar<KS_>(g);
    }
    /* the groups' sums, added in group order into group 0's fragments
     * (the same fragment type: element e of a lane is the same (row, col)
     * in every group); the output tile aliases the A and B tiles, so every
     * group must be past its k loop first */
    float *sC = (float *)smem;
    if (KS_ > 1) {
        __syncthreads();
        for (int s = 1; s < KS_; s++) {
            if (g == s)
#pragma unroll
                for (int i = 0; i < C::FM; i++)
#pragma unroll
                    for (int j = 0; j < C::FN; j++)
                        wm::store_matrix_sync(sC + (wr + i * 16) * C::LC + wc + j * 16, acc[i][j],
                                              C::LC, wm::mem_row_major);
            __syncthreads();
            if (g == 0)
#pragma unroll
                for (int i = 0; i < C::FM; i++)
#pragma unroll
                    for (int j = 0; j < C::FN; j++) {
                        wm::fragment<wm::accumulator, 16, 16, 16, float> o;
                        wm::load_matrix_sync(o, sC + (wr + i * 16) * C::LC + wc + j * 16, C::LC,
                                             wm::mem_row_major);
#pragma unroll
                        for (int e = 0; e < o.num_elements; e++) acc[i][j].x[e] += o.x[e];
                    }
            __syncthreads();
        }
    }
    if (g == 0)
#pragma unroll
        for (int i = 0; i < C::FM; i++)
#pragma unroll
            for (int j = 0; j < C::FN; j++)
                wm::store_matrix_sync(sC + (wr + i * 16) * C::LC + wc + j * 16, acc[i][j], C::LC,
                                      wm::mem_row_major);
    __syncthreads();
    ph_epilogue<T, BM_>(P, f, m0, n0, t, NT * KS_, sC);
}

/* wt[i] = T(w[lucid_conv_igemm_wt_src(i, Cin, Cout, KK)]) for i < n (one
 * rounding, to nearest even: the bits of the weight shadows' group cast) */
template <typename T>
__global__ void igemm_wt_cast(const float *__restrict__ w, T *__restrict__ wt, int n, int Cin,
                              int Cout, int KK) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        wt[i] = to_t<T>(w[lucid_conv_igemm_wt_src(i, Cin, Cout, KK)]);
}

// ---------------------------------------------------------------------------
// host side

static IgP params_of(const lucid_igemm_geom *g) {
    IgP P;
    P.a = P.b = NULL;
    P.out = NULL;
    P.bias = NULL;
    P.beta = 0.0f;
    P.N = g->N; P.Cin = g->Cin; P.H = g->H; P.W = g->W; P.Cout = g->Cout;
    P.Ho = g->Ho; P.Wo = g->Wo; P.kh = g->kh; P.kw = g->kw;
    P.sh = g->sh; P.sw = g->sw; P.ph = g->ph; P.pw = g->pw; P.dh = g->dh; P.dw = g->dw;
    P.M = P.Nc = P.K = 0;
    P.kchunk = 0;
    P.direct = 1;
    P.part_n = 0;
    P.ct = 0;
    P.lc = 0;
    return P;
}

static bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Kernel variant of a pass: KV1 needs a 1x1 stride-1 unpadded conv whose
 * planes hold a multiple of 8 elements and 16-byte aligned operands that
 * are read by vectors (p1, p2; the weight is read by scalars). */
static int ks_of(const lucid_igemm_geom *g, const void *p1, const void *p2) {
    if (g->kh == 1 && g->kw == 1) {
        bool v = g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0 &&
                 ((long)g->H * g->W) % 8 == 0 && al16(p1) && (!p2 || al16(p2));
        return v ? KV1 : 1;
    }
    if (g->kh == 3 && g->kw == 3) return 3;
    return 0;
}

/* Smallest reduction channel count (fwd: Cin, dgrad: Cout) for which a 3x3
 * pass runs tap-major (every count: the slots shrink with it; stride-phase
 * backward-data from 16, one tap per k tile), and the smallest Cin for the
 * tap-major filter gradient (every Cin).  LUCID_IGEMM_TAP_MIN_C /
 * LUCID_IGEMM_TAP_MIN_CW override them (bench/conv_lab comparisons; a huge
 * value turns the variant off); read once. */
static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}
static int tap_min_c(void) {
    static int v = -1;
    if (v < 0) v = env_int("LUCID_IGEMM_TAP_MIN_C", 1);
    return v;
}
static int tap_min_cw(void) {
    static int v = -1;
    if (v < 0) v = env_int("LUCID_IGEMM_TAP_MIN_CW", 1);
    return v;
}
static bool is3x3(const lucid_igemm_geom *g) { return g->kh == 3 && g->kw == 3; }

template <typename T, int MODE>
static void launch(const IgP &P, int ks, dim3 grid, cudaStream_t s) {
    switch (ks) {
    case KV1: lucid_launch(igemm_nchw<T, MODE, KV1>, grid, NT, 0, s, P); break;
    case 1: lucid_launch(igemm_nchw<T, MODE, 1>, grid, NT, 0, s, P); break;
    case 3: lucid_launch(igemm_nchw<T, MODE, 3>, grid, NT, 0, s, P); break;
    case KT3: lucid_launch(igemm_nchw<T, MODE, KT3>, grid, NT, 0, s, P); break;
    default: lucid_launch(igemm_nchw<T, MODE, 0>, grid, NT, 0, s, P); break;
    }
}

template <int MODE>
static cudaError_t launch_dt(lucid_dtype dt, const IgP &P, int ks, dim3 grid, cudaStream_t s) {
    if (dt == LUCID_BF16) launch<__nv_bfloat16, MODE>(P, ks, grid, s);
    else if (dt == LUCID_F16) launch<__half, MODE>(P, ks, grid, s);
    else return cudaErrorInvalidValue;
    return cudaGetLastError();
}

static unsigned tiles(int n, int t) { return (unsigned)((n + t - 1) / t); }

int lucid_conv_igemm_fits(const lucid_igemm_geom *g) {
    const int64_t lim = INT32_MAX;
    int64_t kk = (int64_t)g->kh * g->kw;
    int64_t nx = (int64_t)g->N * g->Cin * g->H * g->W;
    int64_t ny = (int64_t)g->N * g->Cout * g->Ho * g->Wo;
    int64_t nw = (int64_t)g->Cout * g->Cin * kk;
    return g->N > 0 && g->Cin > 0 && g->Cout > 0 && g->Ho > 0 && g->Wo > 0 && kk > 0 &&
           g->sh > 0 && g->sw > 0 && g->dh > 0 && g->dw > 0 && nx < lim && ny < lim &&
           nw < lim;
}

/* Splits of the backward-filter GEMM: enough blocks to cover the H200's 132
 * SMs about four times, each split at least 2 k tiles (64 pixels) long (a
 * short grid is latency-bound: each k tile is a dependent global load), at
 * most 1024 splits. */
/* Blocks a split filter-gradient grid aims at: LUCID_WGRAD_BLOCKS (read
 * once; default 132, one per SM of the H200).  The filter gradients run on
 * the parameter-gradient lanes beside the input-gradient chain, so their
 * grid size also sets how many SMs they take from it: measured on the H200
 * (recorded steady step of one default fit, 2026-11-30), 528 blocks (the
 * former aim, 4 per SM) 4.447 ms, 264 4.351, 132 4.316 / 4.315, 96 4.352,
 * 66 4.466.  The split count, hence the summation order and the bits of the
 * weight gradients, follow it. */
static int wgrad_blocks(void) {
    static int v = -1;
    return lucid_env_int("LUCID_WGRAD_BLOCKS", 1, 1 << 20, 132, &v);
}

int lucid_conv_igemm_wgrad_splits(const lucid_igemm_geom *g) {
    int M = g->Cout, Nc = g->Cin * g->kh * g->kw, K = g->N * g->Ho * g->Wo;
    long blocks = (long)tiles(M, BM) * tiles(Nc, BN);
    long want = (wgrad_blocks() + blocks - 1) / blocks;
    long maxs = (K + 2 * BK - 1) / (2 * BK);
    long s = want < maxs ? want : maxs;
    if (s > 1024) s = 1024;
    return s < 1 ? 1 : (int)s;
}

/* Split-K of forward / backward-data (not the stride-phase form): only a
 * grid that leaves SMs idle (< 132 blocks) is split, into up to 16 ranges
 * of at least 2 k tiles, for about 2 blocks per SM (LUCID_FD_BLOCKS, 264).  A function of the
 * geometry only.  M, Nc, K: the pass's GEMM. */
static int fd_blocks(void) { /* LUCID_FD_BLOCKS (read once; default 264): A/B runs */
    static int v = -1;
    return lucid_env_int("LUCID_FD_BLOCKS", 1, 1 << 20, 264, &v);
}

static int fd_splits(int M, int Nc, int K) {
    long blocks = (long)tiles(Nc, BN) * tiles(M, BM);
    if (blocks >= 132) return 1;
    long want = (fd_blocks() + blocks - 1) / blocks;
    long maxs = (K + BK - 1) / BK / 2;
    long s = want < maxs ? want : maxs;
    if (s > 16) s = 16;
    return s < 1 ? 1 : (int)s;
}

static int chunk_of(int K, int splits) {
    int per = (K + splits - 1) / splits;
    return (per + BK - 1) / BK * BK;
}

static int wgrad_chunk(const lucid_igemm_geom *g, int splits) {
    int K = g->N * g->Ho * g->Wo;
    int per = (K + splits - 1) / splits;
    return (per + BK - 1) / BK * BK;
}

size_t lucid_conv_igemm_wgrad_scratch(const lucid_igemm_geom *g) {
    int s = lucid_conv_igemm_wgrad_splits(g);
    if (s <= 1) return 0;
    return (size_t)s * g->Cout * g->Cin * g->kh * g->kw * sizeof(float);
}

/* One pass ready to launch: parameters, grid, GEMM mode and kernel variant
 * (shared by the launchers below and the host emulation test). */
struct IgLaunch {
    IgP P;
    dim3 grid;
    int mode, ks, splits; /* IG_DGRAD_PH2: ks = k-slices per block (1, 2, 4) */
    int bm;               /* IG_DGRAD_PH2: tile rows (PhCfg: 16 or 64) */
};

/* Grid and split-K of a forward / backward-data plan (L.P's M, Nc, K set);
 * nout: output elements.  With splits > 1 the kernel writes partials to the
 * scratch (L.P.out is then set by the caller) and igemm_reduce_out finishes. */
static void split_fd(IgLaunch &L, long nout) {
    L.splits = fd_splits(L.P.M, L.P.Nc, L.P.K);
    if (L.splits > 1) {
        L.P.kchunk = chunk_of(L.P.K, L.splits);
        L.splits = (L.P.K + L.P.kchunk - 1) / L.P.kchunk;
    }
    if (L.splits > 1) {
        L.P.direct = 0;
        L.P.part_n = (int)nout;
    } else {
        L.P.kchunk = 0;
    }
    L.grid = dim3(tiles(L.P.Nc, BN), tiles(L.P.M, BM), (unsigned)L.splits);
}

/* Tap-major k of a 3x3 forward / stride-1 backward-data GEMM over C
 * channels: slots of cpt = 2^lc channels (the power of two >= C, 4 .. 32),
 * BK/cpt taps per k tile, K padded to whole tiles. */
static void tap_major_k(IgLaunch &L, int C) {
    int lc = 2;
    while (lc < 5 && (1 << lc) < C) lc++;
    L.ks = KT3;
    L.P.lc = lc;
    L.P.ct = (int)tiles(C, 1 << lc);
    L.P.K = (int)tiles(9, BK >> lc) * L.P.ct * BK;
}

/* The stride-phase kernel's switch (nn_conv_igemm.cuh): LUCID_DGRAD_PHASE
 * read once, or the test hook's value. */
static int g_ph_override = -1;

extern "C" void lucid_conv_igemm_set_dgrad_phase(int v) { g_ph_override = v < 0 ? -1 : v != 0; }

extern "C" int lucid_conv_igemm_dgrad_phase(void) {
    if (g_ph_override >= 0) return g_ph_override;
    static int off = -1;
    return !lucid_env_zero("LUCID_DGRAD_PHASE", &off);
}

/* igemm_wt_cast launches queued by this thread (nn_conv_igemm.cuh) */
static thread_local unsigned long g_wt_casts;

extern "C" unsigned long lucid_conv_igemm_wt_cast_count(void) { return g_wt_casts; }

/* Whether the backward-data of a strided, undilated g runs igemm_dgrad_ph:
 * the switch on, Cin a multiple of 8 (whole 16-byte vectors of wt rows) and
 * a grid.y within CUDA's 65535. */
static bool ph_takes(const lucid_igemm_geom *g) {
    return (g->sh > 1 || g->sw > 1) && g->dh == 1 && g->dw == 1 && g->Cin % 8 == 0 &&
           tiles(g->Cin, 16) <= 65535 && lucid_conv_igemm_dgrad_phase();
}

/* Warp groups (k-slices x blocks) that a stride-phase grid may reach by
 * splitting its k loops: LUCID_DGRAD_PHASE_GROUPS, read once (default 1600,
 * about 12 groups of 4 warps per SM of the H200), for A/B runs.  The
 * slices, hence the summation order and the bits of dx, follow it. */
static int ph_groups(void) {
    static int v = -1;
    return lucid_env_int("LUCID_DGRAD_PHASE_GROUPS", 1, 1 << 20, 1600, &v);
}

/* Plan of igemm_dgrad_ph (Hp, Wp: the largest phase's grid).  Tiles of 64
 * input channels x 64 phase pixels, or 16 x 128 when Cin <= 16.  The
 * k-slices KS: doubled (up to 4) while the grid's blocks times 2*KS stay
 * within ph_groups() and the largest phase keeps at least 4 k tiles per
 * slice: a grid too small to fill the GPU then runs each phase's k loop as
 * 2 or 4 shorter chains instead of one (YOLO11n-pose at batch 4, 640:
 * 128 -> 256 at 40x40 has 200 blocks and 32 k tiles in its largest phase:
 * 4 slices of 8; 16 -> 32 at 320x320 has 3200 blocks: 1 slice).  A
 * function of the geometry (and the knob) only. */
static void ph_plan(IgLaunch &L, const lucid_igemm_geom *g, int Hp, int Wp) {
    L.mode = IG_DGRAD_PH2;
    L.bm = g->Cin <= 16 ? 16 : 64;
    const int bn = L.bm == 16 ? PhCfg<16>::TN : PhCfg<64>::TN;
    L.P.lc = 5; /* one tap per k tile */
    L.P.ct = (int)tiles(g->Cout, BK);
    L.grid = dim3(tiles(g->N * Hp * Wp, bn), tiles(g->Cin, L.bm), (unsigned)(g->sh * g->sw));
    const long blocks = (long)L.grid.x * L.grid.y * L.grid.z;
    const long taps = (long)((g->kh + g->sh - 1) / g->sh) * ((g->kw + g->sw - 1) / g->sw);
    const long ntmax = taps * L.P.ct; /* k tiles of the largest phase */
    int ks = 1;
    while (ks < 4 && blocks * ks * 2 <= ph_groups() && ntmax >= 8L * ks) ks *= 2;
    L.ks = ks;
    L.splits = 1;
    L.P.kchunk = 0;
    L.P.direct = 1;
}

static IgLaunch plan_forward(const lucid_igemm_geom *g, const void *x, const float *w,
                             const float *b, void *y) {
    IgLaunch L;
    L.P = params_of(g);
    L.P.a = w;
    L.P.b = x;
    L.P.out = y;
    L.P.bias = b;
    L.P.M = g->Cout;
    L.P.Nc = g->N * g->Ho * g->Wo;
    L.P.K = g->Cin * g->kh * g->kw;
    L.mode = IG_FWD;
    L.ks = ks_of(g, x, NULL);
    /* a K of one k tile (Cin <= 3) stays channel-major: tap-major would
     * take two (layer 0: 0.073 vs 0.089 ms, H200 conv_lab) */
    if (is3x3(g) && g->Cin * 9 > BK && g->Cin >= tap_min_c()) tap_major_k(L, g->Cin);
    split_fd(L, (long)g->N * g->Cout * g->Ho * g->Wo);
    return L;
}

static IgLaunch plan_backward_data(const lucid_igemm_geom *g, const void *dy, const float *w,
                                   void *dx, float beta) {
    IgLaunch L;
    L.P = params_of(g);
    L.P.a = w;
    L.P.b = dy;
    L.P.out = dx;
    L.P.beta = beta;
    L.P.M = g->Cin;
    L.P.Nc = g->N * g->H * g->W;
    L.P.K = g->Cout * g->kh * g->kw;
    L.splits = 1;
    L.bm = 0;
    if ((g->sh > 1 || g->sw > 1) && g->dh == 1 && g->dw == 1) {
        /* one z slice per stride phase; grid.x for the largest phase */
        int Hp = (g->H + g->sh - 1) / g->sh, Wp = (g->W + g->sw - 1) / g->sw;
        if (ph_takes(g)) {
            ph_plan(L, g, Hp, Wp);
            return L;
        }
        L.grid = dim3(tiles(g->N * Hp * Wp, BN), tiles(L.P.M, BM), (unsigned)(g->sh * g->sw));
        L.mode = IG_DGRAD_PH;
        L.ks = is3x3(g) ? 3 : 0;
        if (is3x3(g) && g->Cout >= 16 && g->Cout >= tap_min_c()) {
            L.ks = KT3;
            L.P.lc = 5; /* one tap per k tile */
            L.P.ct = (int)tiles(g->Cout, BK); /* phase K: nR*nQ*ct*BK (phase_of) */
        }
    } else {
        L.mode = IG_DGRAD;
        L.ks = ks_of(g, dy, NULL);
        if (is3x3(g) && g->sh == 1 && g->sw == 1 && g->Cout * 9 > BK && g->Cout >= tap_min_c())
            tap_major_k(L, g->Cout);
        split_fd(L, (long)g->N * g->Cin * g->H * g->W);
    }
    return L;
}

static IgLaunch plan_backward_filter(const lucid_igemm_geom *g, const void *x, const void *dy,
                                     float *dw, float beta, void *scratch) {
    IgLaunch L;
    L.P = params_of(g);
    L.P.a = dy;
    L.P.b = x;
    L.P.beta = beta;
    L.P.M = g->Cout;
    L.P.Nc = g->Cin * g->kh * g->kw;
    L.P.K = g->N * g->Ho * g->Wo;
    int splits = lucid_conv_igemm_wgrad_splits(g);
    L.P.kchunk = wgrad_chunk(g, splits);
    /* the last chunks may be empty after rounding to whole tiles: trim */
    L.splits = (L.P.K + L.P.kchunk - 1) / L.P.kchunk;
    L.P.direct = L.splits == 1;
    L.P.out = L.P.direct ? (void *)dw : scratch;
    L.grid = dim3(tiles(L.P.Nc, BN), tiles(L.P.M, BM), (unsigned)L.splits);
    L.mode = IG_WGRAD;
    L.ks = ks_of(g, x, dy);
    if (is3x3(g) && g->Cin >= tap_min_cw()) {
        /* columns in slots of cpt = 2^lc channels (the power of two >= Cin,
         * 4 .. 64), BN/cpt taps per column tile */
        int lc = 2;
        while (lc < 6 && (1 << lc) < g->Cin) lc++;
        L.ks = KT3;
        L.P.lc = lc;
        L.P.ct = (int)tiles(g->Cin, 1 << lc);
        int tpt = BN >> lc;
        L.P.Nc = (int)tiles(9, tpt) * L.P.ct * BN; /* padded columns; dw's are Cin*9 */
        L.grid.x = tiles(L.P.Nc, BN);
    }
    return L;
}

static cudaError_t launch_plan(lucid_dtype dt, const IgLaunch &L, cudaStream_t s) {
    switch (L.mode) {
    case IG_FWD: return launch_dt<IG_FWD>(dt, L.P, L.ks, L.grid, s);
    case IG_DGRAD: return launch_dt<IG_DGRAD>(dt, L.P, L.ks, L.grid, s);
    case IG_DGRAD_PH: return launch_dt<IG_DGRAD_PH>(dt, L.P, L.ks, L.grid, s);
    default: return launch_dt<IG_WGRAD>(dt, L.P, L.ks, L.grid, s);
    }
}

/* Finishes a split forward / backward-data: the fold of the partials. */
template <typename T>
static void reduce_out(const IgLaunch &L, void *out, const float *bias, float beta,
                       cudaStream_t s) {
    int n = L.P.part_n;
    unsigned blocks = tiles(n, 256);
    if (blocks > 2048) blocks = 2048;
    int plane = L.mode == IG_FWD ? L.P.Ho * L.P.Wo : L.P.H * L.P.W;
    lucid_launch(igemm_reduce_out<T>, blocks, 256, 0, s, (const float *)L.P.out, (T *)out, n,
                 L.splits, bias, plane, L.P.M, beta);
}

static cudaError_t launch_fd(lucid_dtype dt, IgLaunch L, void *out, const float *bias,
                             float beta, void *scratch, cudaStream_t s) {
    if (L.P.direct) return launch_plan(dt, L, s);
    if (!scratch) return cudaErrorInvalidValue;
    L.P.out = scratch;
    cudaError_t e = launch_plan(dt, L, s);
    if (e != cudaSuccess) return e;
    if (dt == LUCID_BF16) reduce_out<__nv_bfloat16>(L, out, bias, beta, s);
    else reduce_out<__half>(L, out, bias, beta, s);
    return cudaGetLastError();
}

/* Bytes of the per-call transposed weight in the scratch of igemm_dgrad_ph
 * (2-byte dtypes), a multiple of 256. */
static size_t wt_bytes(const lucid_igemm_geom *g) {
    size_t n = (size_t)g->Cout * g->Cin * g->kh * g->kw * 2;
    return (n + 255) / 256 * 256;
}

size_t lucid_conv_igemm_scratch(const lucid_igemm_geom *g, int pass) {
    if (pass == 2) return lucid_conv_igemm_wgrad_scratch(g);
    IgLaunch L = pass == 0 ? plan_forward(g, NULL, NULL, NULL, NULL)
                           : plan_backward_data(g, NULL, NULL, NULL, 0.0f);
    if (L.mode == IG_DGRAD_PH2) return wt_bytes(g);
    return L.P.direct ? 0 : (size_t)L.splits * L.P.part_n * sizeof(float);
}

int64_t lucid_conv_igemm_dgrad_wt_elems(const lucid_igemm_geom *g) {
    IgLaunch L = plan_backward_data(g, NULL, NULL, NULL, 0.0f);
    return L.mode == IG_DGRAD_PH2 ? (int64_t)g->Cout * g->Cin * g->kh * g->kw : 0;
}

template <typename T, int BM_>
static void launch_ph_bm(const IgLaunch &L, const T *wt, cudaStream_t s) {
    switch (L.ks) {
    case 4: lucid_launch(igemm_dgrad_ph<T, BM_, 4>, L.grid, NT * 4, 0, s, L.P, wt); break;
    case 2: lucid_launch(igemm_dgrad_ph<T, BM_, 2>, L.grid, NT * 2, 0, s, L.P, wt); break;
    default: lucid_launch(igemm_dgrad_ph<T, BM_, 1>, L.grid, NT, 0, s, L.P, wt); break;
    }
}

/* igemm_dgrad_ph of plan L; wt NULL or unaligned: cast into scratch first */
template <typename T>
static cudaError_t launch_ph(const IgLaunch &L, const float *w, const void *wt, void *scratch,
                             cudaStream_t s) {
    if (!wt || !al16(wt)) {
        if (!scratch || !al16(scratch) || !w) return cudaErrorInvalidValue;
        const int n = L.P.Cout * L.P.Cin * L.P.kh * L.P.kw;
        unsigned blocks = tiles(n, 256);
        if (blocks > 1024) blocks = 1024;
        lucid_launch(igemm_wt_cast<T>, blocks, 256, 0, s, w, (T *)scratch, n, L.P.Cin, L.P.Cout,
                     L.P.kh * L.P.kw);
        g_wt_casts++;
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
        wt = scratch;
    }
    if (L.bm == 16) launch_ph_bm<T, 16>(L, (const T *)wt, s);
    else launch_ph_bm<T, 64>(L, (const T *)wt, s);
    return cudaGetLastError();
}

cudaError_t lucid_conv_igemm_forward(lucid_dtype dt, const void *x, const float *w,
                                     const float *b, void *y, void *scratch,
                                     const lucid_igemm_geom *g, cudaStream_t stream) {
    return launch_fd(dt, plan_forward(g, x, w, b, y), y, b, 0.0f, scratch, stream);
}

cudaError_t lucid_conv_igemm_backward_data(lucid_dtype dt, const void *dy, const float *w,
                                           void *dx, float beta, void *scratch,
                                           const lucid_igemm_geom *g, cudaStream_t stream) {
    return lucid_conv_igemm_backward_data_wt(dt, dy, w, NULL, dx, beta, scratch, g, stream);
}

cudaError_t lucid_conv_igemm_backward_data_wt(lucid_dtype dt, const void *dy, const float *w,
                                              const void *wt, void *dx, float beta,
                                              void *scratch, const lucid_igemm_geom *g,
                                              cudaStream_t stream) {
    IgLaunch L = plan_backward_data(g, dy, w, dx, beta);
    if (L.mode != IG_DGRAD_PH2) return launch_fd(dt, L, dx, NULL, beta, scratch, stream);
    if (dt == LUCID_BF16) return launch_ph<__nv_bfloat16>(L, w, wt, scratch, stream);
    if (dt == LUCID_F16) return launch_ph<__half>(L, w, wt, scratch, stream);
    return cudaErrorInvalidValue;
}

cudaError_t lucid_conv_igemm_backward_filter(lucid_dtype dt, const void *x, const void *dy,
                                             float *dw, float beta, void *scratch,
                                             const lucid_igemm_geom *g, cudaStream_t stream) {
    IgLaunch L = plan_backward_filter(g, x, dy, dw, beta, scratch);
    if (!L.P.direct && !scratch) return cudaErrorInvalidValue;
    cudaError_t e = launch_plan(dt, L, stream);
    if (e != cudaSuccess || L.P.direct) return e;
    int n = g->Cout * g->Cin * g->kh * g->kw;
    if (L.splits > 16) {
        unsigned blocks = tiles(n, 8); /* 8 warps of 256 threads, one per element */
        if (blocks > 4096) blocks = 4096;
        lucid_launch(igemm_reduce_splits_warp, blocks, 256, 0, stream, (const float *)scratch,
                     dw, n, L.splits, beta);
        return cudaGetLastError();
    }
    unsigned blocks = tiles(n, 256);
    if (blocks > 1024) blocks = 1024;
    lucid_launch(igemm_reduce_splits, blocks, 256, 0, stream, (const float *)scratch, dw, n,
                 L.splits, beta);
    return cudaGetLastError();
}
