/*
 * random.cu — rand_uniform and rand_normal on the GPU; the output is
 * overwritten.
 *
 * The generator is the same Philox-4x32-10 as engine/core/rng.c (key =
 * seed, counter = (lo32, hi32, 0, 0) of offset + i), so element i (row-major
 * logical index over dst's shape, whatever its strides) gets the same draw
 * on both devices. The transforms follow lucid.h exactly, in f64 with
 * explicitly rounded operations (__dadd_rn, __dmul_rn: no FMA contraction,
 * as the CPU computes them) and one correct rounding from f64 to the dtype
 * (lucid_store_f64, the CPU's cpu_store_f64 bit for bit):
 *   uniform: u = (w0 >> 8) * 2^-24;  v = lo + (hi - lo) * u   (bitwise equal
 *            to the CPU)
 *   normal:  u1 = ((w0 >> 8) + 1) * 2^-24, u2 = (w1 >> 8) * 2^-24,
 *            z = sqrt(-2 ln u1) * cos(2 pi u2);  v = mean + std * z
 *            (CUDA's f64 log/cos are within an ulp or two of glibc's, so a
 *            value may differ from the CPU's in the last bit of f32)
 * Dtypes: f32, bf16, f16.
 */
#include "common.cuh"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

__device__ __forceinline__ void philox4x32(uint64_t seed, uint64_t counter,
                                           uint32_t out[4]) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32);
    uint32_t c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
#pragma unroll
    for (int round = 0; round < 10; round++) {
        uint32_t hi0 = __umulhi(PHILOX_M0, c0), lo0 = PHILOX_M0 * c0;
        uint32_t hi1 = __umulhi(PHILOX_M1, c2), lo1 = PHILOX_M1 * c2;
        uint32_t n0 = hi1 ^ c1 ^ k0;
        uint32_t n1 = lo1;
        uint32_t n2 = hi0 ^ c3 ^ k1;
        uint32_t n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

#define TWO_POW_M24 (1.0 / 16777216.0)
#define TWO_PI 6.283185307179586476925286766559

template <bool NORMAL, typename IndexT>
__global__ void rand_kernel(void *dst, int dt, lucid_iter it, uint64_t seed,
                            uint64_t offset, double p0, double p1) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    IndexT n = (IndexT)it.numel;
    IndexT stride = (IndexT)gridDim.x * blockDim.x;
    const double span = __dsub_rn(p1, p0); /* uniform: hi - lo */
    for (IndexT i = (IndexT)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        uint32_t w[4];
        philox4x32(seed, offset + (uint64_t)i, w);
        double v;
        if (NORMAL) {
            double u1 = (double)((w[0] >> 8) + 1u) * TWO_POW_M24;
            double u2 = (double)(w[1] >> 8) * TWO_POW_M24;
            double r = sqrt(__dmul_rn(-2.0, log(u1)));
            double z = __dmul_rn(r, cos(__dmul_rn(TWO_PI, u2)));
            v = __dadd_rn(p0, __dmul_rn(p1, z)); /* mean + std * z */
        } else {
            double u = (double)(w[0] >> 8) * TWO_POW_M24;
            v = __dadd_rn(p0, __dmul_rn(span, u)); /* lo + (hi - lo) * u */
        }
        int64_t off[1];
        lucid_iter_offsets<1, IndexT>(it, i, off);
        lucid_store_f64(dst, dt, off[0], v);
    }
}

static lucid_status launch_rand(lucid_ctx *ctx, lucid_tensor *dst, bool normal,
                                uint64_t seed, uint64_t offset, double p0,
                                double p1) {
    CUDA_ENTER(ctx, st);
    if (!lucid_cuda_is_op_dtype(dst->dtype))
        return lucid_seterr(ctx, LUCID_ERR_UNSUPPORTED,
                            "cuda random: dtype %s (expected f32, bf16 or f16)",
                            lucid_dtype_name(dst->dtype));
    const lucid_tensor *ts[1] = {dst};
    lucid_iter it;
    lucid_iter_init(&it, 1, ts);
    if (it.numel == 0) return LUCID_OK;
    unsigned blocks = lucid_cuda_blocks(it.numel, 256);
    void *p = lucid_tensor_data(dst);
    const bool small = it.numel <= (int64_t)UINT32_MAX;
    if (normal && small)
        lucid_launch(rand_kernel<true, uint32_t>, blocks, 256, 0, st->stream, p, dst->dtype, it,
                     seed, offset, p0, p1);
    else if (normal)
        lucid_launch(rand_kernel<true, uint64_t>, blocks, 256, 0, st->stream, p, dst->dtype, it,
                     seed, offset, p0, p1);
    else if (small)
        lucid_launch(rand_kernel<false, uint32_t>, blocks, 256, 0, st->stream, p, dst->dtype,
                     it, seed, offset, p0, p1);
    else
        lucid_launch(rand_kernel<false, uint64_t>, blocks, 256, 0, st->stream, p, dst->dtype,
                     it, seed, offset, p0, p1);
    CUDA_CHECK_LAUNCH(ctx, "rand_kernel");
    return LUCID_OK;
}

extern "C" lucid_status lucid_cuda_rand_uniform(lucid_ctx *ctx,
                                                lucid_tensor *dst,
                                                uint64_t seed, uint64_t offset,
                                                double lo, double hi) {
    return launch_rand(ctx, dst, false, seed, offset, lo, hi);
}

extern "C" lucid_status lucid_cuda_rand_normal(lucid_ctx *ctx,
                                               lucid_tensor *dst,
                                               uint64_t seed, uint64_t offset,
                                               double mean, double std) {
    return launch_rand(ctx, dst, true, seed, offset, mean, std);
}
