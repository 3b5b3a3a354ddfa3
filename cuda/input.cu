/*
 * input.cu — lucid_input_prepare on the GPU (lucid_input_cuda_kernels; the
 * contract and the CPU reference are in engine/data/input.h / input.c).
 *
 * One kernel, queued on the context's compute stream: grid (blocks, N), a
 * block works on pixels of image blockIdx.y. When the image has non-zero
 * gains the block first builds that image's HSV tables in shared memory
 * (entry threadIdx.x of each, from the shared source engine/data/hsv_pixel.h
 * with explicitly rounded double operations, so the same bits as the host),
 * then every thread converts pixels: read R, G, B from the three planes, the
 * integer RGB -> HSV -> RGB of hsv_pixel.h, and v / 255 (__fdiv_rn, the IEEE
 * quotient, from a shared 256-entry table) rounded once to x's dtype. Four
 * pixels per thread (one 32-bit load per plane, one vector store per plane)
 * when H*W % 4 == 0 and the pointers are aligned; one pixel otherwise.
 * No allocation, no host synchronisation: capturable.
 */
#include "common.cuh"
#include "data/hsv_pixel.h"
#include "data/input.h"

#define IN_THREADS 256

template <typename T> struct in_store;
template <> struct in_store<float> {
    static __device__ __forceinline__ void one(float *p, int64_t i, float v) {
        p[i] = v;
    }
    static __device__ __forceinline__ void four(float *p, int64_t i, float a,
                                                float b, float c, float d) {
        *(float4 *)(p + i) = make_float4(a, b, c, d);
    }
};
template <> struct in_store<__nv_bfloat16> {
    static __device__ __forceinline__ void one(__nv_bfloat16 *p, int64_t i,
                                               float v) {
        p[i] = __float2bfloat16_rn(v);
    }
    static __device__ __forceinline__ void four(__nv_bfloat16 *p, int64_t i,
                                                float a, float b, float c,
                                                float d) {
        __nv_bfloat162 lo = __halves2bfloat162(__float2bfloat16_rn(a),
                                               __float2bfloat16_rn(b));
        __nv_bfloat162 hi = __halves2bfloat162(__float2bfloat16_rn(c),
                                               __float2bfloat16_rn(d));
        uint2 u;
        u.x = *(uint32_t *)&lo;
        u.y = *(uint32_t *)&hi;
        *(uint2 *)(p + i) = u;
    }
};
template <> struct in_store<__half> {
    static __device__ __forceinline__ void one(__half *p, int64_t i, float v) {
        p[i] = __float2half_rn(v);
    }
    static __device__ __forceinline__ void four(__half *p, int64_t i, float a,
                                                float b, float c, float d) {
        __half2 lo = __halves2half2(__float2half_rn(a), __float2half_rn(b));
        __half2 hi = __halves2half2(__float2half_rn(c), __float2half_rn(d));
        uint2 u;
        u.x = *(uint32_t *)&lo;
        u.y = *(uint32_t *)&hi;
        *(uint2 *)(p + i) = u;
    }
};

struct in_tables {
    int sdiv[256], hdiv[256];
    uint8_t lut_h[256], lut_s[256], lut_v[256];
    float val[256];
};

__device__ __forceinline__ void in_pixel(const in_tables &t, int hsv, int r,
                                         int g, int b, float *o) {
    uint8_t R = (uint8_t)r, G = (uint8_t)g, B = (uint8_t)b;
    if (hsv)
        lucid_hsv_pixel_t(t.sdiv, t.hdiv, t.lut_h, t.lut_s, t.lut_v, r, g, b,
                          &R, &G, &B);
    o[0] = t.val[R];
    o[1] = t.val[G];
    o[2] = t.val[B];
}

/* vec4: P % 4 == 0 and src/dst aligned for 4-pixel accesses. */
template <typename T, bool VEC4>
__global__ void __launch_bounds__(IN_THREADS)
    input_prepare_kernel(T *__restrict__ dst, const uint8_t *__restrict__ src,
                         const float *__restrict__ gains, int64_t P) {
    lucid_pdl_wait();
    lucid_pdl_launch_dependents();
    __shared__ in_tables t;
    const int n = blockIdx.y;
    const int tid = threadIdx.x; /* blockDim.x == IN_THREADS == 256 */
    int hsv = 0;
    if (gains) {
        float gh = gains[n * 3], gs = gains[n * 3 + 1], gv = gains[n * 3 + 2];
        hsv = gh != 0.0f || gs != 0.0f || gv != 0.0f; /* uniform per block */
        if (hsv) {
            t.sdiv[tid] = lucid_hsv_sdiv(tid);
            t.hdiv[tid] = lucid_hsv_hdiv(tid);
            t.lut_h[tid] = lucid_hsv_lut_h(tid, (double)gh);
            t.lut_s[tid] = tid == 0 ? 0 : lucid_hsv_lut_clip(tid, (double)gs);
            t.lut_v[tid] = lucid_hsv_lut_clip(tid, (double)gv);
        }
    }
    t.val[tid] = __fdiv_rn((float)tid, 255.0f);
    __syncthreads();
    const uint8_t *s0 = src + (int64_t)n * 3 * P;
    const uint8_t *s1 = s0 + P, *s2 = s1 + P;
    T *d0 = dst + (int64_t)n * 3 * P;
    T *d1 = d0 + P, *d2 = d1 + P;
    const int64_t stride = (int64_t)gridDim.x * IN_THREADS;
    if (VEC4) {
        const int64_t Q = P / 4;
        for (int64_t q = (int64_t)blockIdx.x * IN_THREADS + tid; q < Q;
             q += stride) {
            uint32_t a = ((const uint32_t *)s0)[q];
            uint32_t b = ((const uint32_t *)s1)[q];
            uint32_t c = ((const uint32_t *)s2)[q];
            float o[4][3];
#pragma unroll
            for (int k = 0; k < 4; k++)
                in_pixel(t, hsv, (a >> (8 * k)) & 255, (b >> (8 * k)) & 255,
                         (c >> (8 * k)) & 255, o[k]);
            in_store<T>::four(d0, q * 4, o[0][0], o[1][0], o[2][0], o[3][0]);
            in_store<T>::four(d1, q * 4, o[0][1], o[1][1], o[2][1], o[3][1]);
            in_store<T>::four(d2, q * 4, o[0][2], o[1][2], o[2][2], o[3][2]);
        }
    } else {
        for (int64_t p = (int64_t)blockIdx.x * IN_THREADS + tid; p < P;
             p += stride) {
            float o[3];
            in_pixel(t, hsv, s0[p], s1[p], s2[p], o);
            in_store<T>::one(d0, p, o[0]);
            in_store<T>::one(d1, p, o[1]);
            in_store<T>::one(d2, p, o[2]);
        }
    }
}

template <typename T>
static void launch(cudaStream_t stream, dim3 grid, void *dst,
                   const uint8_t *src, const float *gains, int64_t P,
                   bool vec4) {
    if (vec4)
        lucid_launch(input_prepare_kernel<T, true>, grid, IN_THREADS, 0, stream, (T *)dst, src,
                     gains, P);
    else
        lucid_launch(input_prepare_kernel<T, false>, grid, IN_THREADS, 0, stream, (T *)dst, src,
                     gains, P);
}

static lucid_status cuda_input_prepare(lucid_ctx *ctx, lucid_tensor *x,
                                       const lucid_tensor *images,
                                       const lucid_tensor *hsv) {
    CUDA_ENTER(ctx, st);
    const int64_t N = images->shape[0];
    const int64_t P = images->shape[2] * images->shape[3];
    if (N > 65535)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "input_prepare: at most 65535 images per call, "
                            "got %lld",
                            (long long)N);
    void *dst = lucid_tensor_data(x);
    const uint8_t *src = (const uint8_t *)lucid_tensor_data(images);
    const float *gains = hsv ? (const float *)lucid_tensor_data(hsv) : NULL;
    const size_t es = lucid_dtype_size(x->dtype);
    bool vec4 = P % 4 == 0 && ((uintptr_t)src % 4) == 0 &&
                ((uintptr_t)dst % (4 * es)) == 0;
    /* about 4 blocks per SM over the whole batch, each looping */
    int64_t units = vec4 ? P / 4 : P;
    int64_t want = ((int64_t)st->sm_count * 4 + N - 1) / N;
    int64_t need = (units + IN_THREADS - 1) / IN_THREADS;
    int64_t bx = want < need ? want : need;
    if (bx < 1) bx = 1;
    dim3 grid((unsigned)bx, (unsigned)N);
    switch (x->dtype) {
    case LUCID_F32: launch<float>(st->stream, grid, dst, src, gains, P, vec4); break;
    case LUCID_BF16:
        launch<__nv_bfloat16>(st->stream, grid, dst, src, gains, P, vec4);
        break;
    case LUCID_F16: launch<__half>(st->stream, grid, dst, src, gains, P, vec4); break;
    default:
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "input_prepare: x dtype %s on the GPU",
                            lucid_dtype_name(x->dtype));
    }
    CUDA_CHECK_LAUNCH(ctx, "input_prepare_kernel");
    return LUCID_OK;
}

static const lucid_input_kernels cuda_input_table = {
    "cuda",
    cuda_input_prepare,
};

extern "C" const lucid_input_kernels *lucid_input_cuda_kernels(void) {
    return &cuda_input_table;
}
