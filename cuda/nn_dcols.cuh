/*
 * nn_dcols.cuh — the im2col columns of a conv's backward-data that the
 * one-pass BatchNorm backward writes beside the dx it computes (engine/nn/
 * nn.h lucid_conv_dcols; the kernel bn_grad_dx1_cols of nn_norm_bwd.cu;
 * the reservation and the GEMM that reads them: nn_conv.cu, nn_conv_col.cu).
 *
 * Layout: dx [N, C, H, W] (the conv's dy: C = Cout, its output H x W), the
 * columns col [N][C*9][H*W], row c*9 + r*3 + q of image n, column p =
 * i*W + j:
 *     col[n][c*9 + r*3 + q][i*W + j] = dx[n][c][i+r-1][j+q-1]   (+0 outside)
 * exactly what nn_conv_col.cu's im2col writes for the backward-data of a
 * 3x3, stride-1, padding-1, dilation-1 conv (the forward of dy with the
 * flipped weight: col_dgrad_geom, Cin' = Cout, padding 1), with Kr' = C*9
 * a multiple of 8 (no padded rows) and H*W a multiple of 8 (16-byte column
 * vectors).  The values are copies: the GEMM gives the bits of the
 * im2col route.
 *
 * The per-thread work is host-callable so that spec/c/test_conv_col_maps.cu
 * runs it on the CPU against the route's own im2col (col_im2col_row8).
 */
#ifndef LUCID_CUDA_NN_DCOLS_CUH
#define LUCID_CUDA_NN_DCOLS_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define DC_HD __host__ __device__ __forceinline__
/* "#pragma unroll" for the device pass only (the host compiler warns about it) */
#if defined(__CUDA_ARCH__)
#define DC_UNROLL _Pragma("unroll")
#else
#define DC_UNROLL
#endif

/* The BatchNorm writes the columns only when its backward is one kernel:
 * one part per channel, N*H*W <= this (BN_PART of nn_norm.cuh, which
 * nn_norm_bwd.cu asserts equal); the conv reserves nothing for larger
 * planes (nn_conv.cu). */
#define LUCID_DCOLS_MAX_NS 8192

/* Where the columns go: col (device; NULL: none), the plane's H x W. */
typedef struct bn_dcols {
    void *col;
    int H, W;
} bn_dcols;

/* Thread tid of nthr's share of channel c's N*9 column rows: stage holds
 * the channel's dx planes (N planes of S = H*W elements, S a multiple of 8;
 * C channels in all).  The rows are N*9 rows of S/8 16-byte vectors, taken
 * row-major as items tid, tid + nthr, ... (consecutive threads store
 * consecutive vectors of a row); each item reads its 8 consecutive columns
 * from the stage one element at a time (+0 outside the plane) and stores
 * them as one 16-byte vector.  32-bit indices within an image (S*9*C <
 * 2^31: the route's limits), 64-bit image and channel bases. */
template <typename T>
DC_HD void bn_emit_cols(const T *stage, const bn_dcols &dc, int64_t N, int64_t C, int64_t S,
                        int64_t c, unsigned tid, unsigned nthr) {
    const unsigned H = (unsigned)dc.H, W = (unsigned)dc.W, P8 = (unsigned)S / 8u;
    const unsigned rows = (unsigned)N * 9u, dq = nthr / P8, dr = nthr - dq * P8;
    const size_t img = (size_t)C * 9u * (size_t)S; /* column elements per image */
    T *col = (T *)dc.col + (size_t)c * 9u * (size_t)S;
    T z;
    memset(&z, 0, sizeof z); /* +0 */
    unsigned row = tid / P8, p8 = tid - row * P8;
    while (row < rows) {
        const unsigned n = row / 9u, rq = row - n * 9u, r = rq / 3u, q = rq - r * 3u;
        const unsigned p0 = p8 * 8u;
        unsigned i = p0 / W, j = p0 - i * W;
        const T *pl = stage + (size_t)n * (size_t)S;
        union {
            T v[8];
            uint4 u;
        } o;
        DC_UNROLL
        for (int k = 0; k < 8; k++) {
            /* i + r - 1 and j + q - 1 wrap around below 0: outside */
            const unsigned hi = i + r - 1u, wj = j + q - 1u;
            o.v[k] = hi < H && wj < W ? pl[hi * W + wj] : z;
            if (++j == W) {
                j = 0;
                ++i;
            }
        }
        *reinterpret_cast<uint4 *>(col + (size_t)n * img + (size_t)rq * (size_t)S + p0) = o.u;
        p8 += dr;
        row += dq;
        if (p8 >= P8) {
            p8 -= P8;
            ++row;
        }
    }
}

#endif /* LUCID_CUDA_NN_DCOLS_CUH */
