/*
 * bench/conv_lab/conv_lab.cu — conv kernel lab: every distinct conv shape of
 * YOLO11n-pose at batch 4, 640 (bench/conv_lab/shapes.txt), forward,
 * backward-data and backward-filter, bf16 activations, f32 accumulation,
 * through six routes:
 *
 *   dnnNCHW  cuDNN legacy API, NCHW, algorithm = the rule of cuda/nn_conv.cu's
 *            cuDNN route (lucid's bf16 route before the implicit-GEMM kernels;
 *            still its f32 route): first of cudnnGet*Algorithm_v7's ranking
 *            (tensor-op math) that is deterministic, succeeds its workspace
 *            query and needs <= 512 MiB
 *   dnnNHWC  the same rule with CUDNN_TENSOR_NHWC tensors and KRSC filters
 *   dnnFind  NHWC, the fastest deterministic algorithm by cudnnFind*Ex
 *   own      own kernels, NHWC: an implicit-GEMM bf16 WMMA kernel (f32
 *            accumulation) for every dense conv (1x1 and kxk, groups 1;
 *            deterministic split-K with an ordered reduction for the filter
 *            gradient) and a direct depthwise 3x3 kernel (stride 1, pad 1)
 *   cublas   cublasGemmEx (bf16 in, f32 compute) for 1x1 stride-1 convs in
 *            NHWC (a 1x1 conv is [N*H*W, Cin] x [Cin, Cout])
 *   lucid    the engine's own bf16 route, NCHW, f32 KCRS weights, f32 weight
 *            gradient: cuda/nn_conv_igemm.cu for groups 1 and
 *            cuda/nn_conv_dw.cu for depthwise, compiled from the engine's
 *            sources by build.sh and called through their public headers
 *            exactly as cuda/nn_conv.cu calls them (beta 0, no bias); unless
 *            LUCID_CONV1X1=igemm, as in the engine, the 1x1
 *            stride-1 unpadded convs take cuda/nn_conv_gemm.cu (cuBLAS, on a
 *            handle set up as cuda/backend.cu sets the engine's).  The
 *            stride-phase backward-data kernel (strided convs with Cin % 8
 *            == 0, unless LUCID_DGRAD_PHASE=0) gets its transposed weight
 *            made once beforehand, as the engine's weight shadows give it
 *            (lucid_conv_igemm_backward_data_wt): the time is the kernel's;
 *            LAB_DGRAD_WT=0 passes none, so each call also launches the
 *            per-call transposition (the engine's shadow-less route)
 *
 * Checks (before any timing): for each shape, every route runs once on a
 * small geometry (batch 1, spatial size cut to <= 24, same channels, kernel,
 * stride, padding, groups) against a CPU reference (f32 data, double
 * accumulation), and once at the timed geometry (batch 4, full size) against
 * a naive f32 GPU reference, which the small check validates against the CPU
 * as well.  Relative Frobenius error <= 1e-2 passes; NaN fails.  A failed
 * route is reported and not timed.
 *
 * Timing: per route and pass, 5 warm-up calls, then 50 calls queued
 * back-to-back on one stream with an event after each; the median of the 50
 * event intervals.  The two input sets alternate.  An interval is the
 * device time of one call plus any gap while the host was still launching
 * it: the eager per-call cost.
 *
 *   conv_lab [shapes.txt] [iters=50] [csv=PATH] [routes=lucid,dnnNCHW,...]
 *
 * routes= (comma list of the names above, or "all") checks and times only
 * those routes; the tables then show only their columns.
 *
 * Build: bench/conv_lab/build.sh.  README.md beside this says how to read
 * the output.
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <strings.h>
#include <string>
#include <type_traits>
#include <vector>

/* the engine's conv route (engine/ and cuda/ are on the include path) */
#include "internal.h" /* lucid_seterr, lucid_dtype_name: provided below */
#include "nn_conv_dw.cuh"
#include "nn_conv_igemm.cuh"
#include "nn_conv_gemm.cuh"

typedef __nv_bfloat16 bf16;

#define CK(call)                                                                       \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) {                                                       \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_),    \
                    __FILE__, __LINE__, #call);                                        \
            exit(2);                                                                   \
        }                                                                              \
    } while (0)
#define CKL(what) CK(cudaGetLastError())

// ---------------------------------------------------------------------------
// engine symbols.  cuda/nn_conv_igemm.cu needs nothing from the engine;
// cuda/nn_conv_dw.cu needs three error helpers (nm -u of its object):
// lucid_seterr and lucid_dtype_name (engine/core) and lucid_cuda_err
// (cuda/backend.cu); cuda/nn_conv_gemm.cu also lucid_cublas_err,
// lucid_pdl_for_stream (cuda/backend.cu) and lucid_dtype_size (engine/core).  They are defined here instead of linking
// build/libengine.a, which would pull in the whole engine and its host
// libraries (OpenBLAS, libpng, libjpeg, libyaml, cJSON) and need `make` on the
// GPU machine first.  The depthwise functions get ctx = NULL, which
// lucid_seterr accepts (internal.h); the message is kept in lucid_msg for the
// failure list.  Should the engine files ever need more of the engine, the
// link fails naming the symbol.

static char lucid_msg[256];

extern "C" lucid_status lucid_seterr(lucid_ctx *ctx, lucid_status status, const char *fmt, ...) {
    (void)ctx;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(lucid_msg, sizeof lucid_msg, fmt, ap);
    va_end(ap);
    return status;
}

extern "C" const char *lucid_dtype_name(lucid_dtype dt) {
    switch (dt) {
    case LUCID_F32: return "f32";
    case LUCID_F64: return "f64";
    case LUCID_BF16: return "bf16";
    case LUCID_F16: return "f16";
    case LUCID_U8: return "u8";
    case LUCID_I32: return "i32";
    case LUCID_I64: return "i64";
    default: return "?";
    }
}

extern "C" size_t lucid_dtype_size(lucid_dtype dt) {
    switch (dt) {
    case LUCID_F32: case LUCID_I32: return 4;
    case LUCID_F64: case LUCID_I64: return 8;
    case LUCID_BF16: case LUCID_F16: return 2;
    case LUCID_U8: return 1;
    default: return 0;
    }
}

/* declared in cuda/common.cuh (C++ linkage), defined in cuda/backend.cu */
lucid_status lucid_cuda_err(lucid_ctx *ctx, cudaError_t e, const char *call, const char *file, int line);
lucid_status lucid_cuda_err(lucid_ctx *ctx, cudaError_t e, const char *call, const char *file, int line) {
    (void)cudaGetLastError(); /* clear a non-sticky error, as the engine does */
    return lucid_seterr(ctx, e == cudaErrorMemoryAllocation ? LUCID_ERR_OOM : LUCID_ERR_DEVICE,
                        "%s failed at %s:%d: %s: %s", call, file, line, cudaGetErrorName(e),
                        cudaGetErrorString(e));
}

/* declared in cuda/common.cuh (C++ linkage), defined in cuda/backend.cu */
lucid_status lucid_cublas_err(lucid_ctx *ctx, cublasStatus_t e, const char *call, const char *file,
                              int line);
lucid_status lucid_cublas_err(lucid_ctx *ctx, cublasStatus_t e, const char *call, const char *file,
                              int line) {
    (void)cudaGetLastError();
    return lucid_seterr(ctx, e == CUBLAS_STATUS_ALLOC_FAILED ? LUCID_ERR_OOM : LUCID_ERR_DEVICE,
                        "%s failed at %s:%d: %s", call, file, line, cublasGetStatusString(e));
}

/* declared in cuda/launch.cuh, defined in cuda/backend.cu: PDL on sm_90+
 * unless LUCID_PDL=0 (device 0 here; conv_lab captures no graphs) */
int lucid_pdl_for_stream(cudaStream_t);
int lucid_pdl_for_stream(cudaStream_t) {
    static const int on = [] {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess)
            (void)cudaGetLastError();
        const char *e = getenv("LUCID_PDL");
        return major >= 9 && !(e && strcmp(e, "0") == 0) ? 1 : 0;
    }();
    return on;
}

static const size_t WS_CAP = (size_t)512 << 20;
static const double TOL = 1e-2;

// ---------------------------------------------------------------------------
// shapes

struct Shape {
    int N, Cin, H, W, Cout, k, s, p, g, Ho, Wo, count, dgrad;
    double gflop;
    std::string name;
};

static int out_size(int n, int k, int s, int p) { return (n + 2 * p - (k - 1) - 1) / s + 1; }

static std::vector<Shape> read_shapes(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "conv_lab: cannot open %s (run from the repository root, or pass the path)\n",
                path);
        exit(2);
    }
    std::vector<Shape> v;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        Shape s;
        char name[512] = "";
        int n = sscanf(line, "%d %d %d %d %d %d %d %d %d %d %d %d %d %lf %511s", &s.N, &s.Cin, &s.H,
                       &s.W, &s.Cout, &s.k, &s.s, &s.p, &s.g, &s.Ho, &s.Wo, &s.count, &s.dgrad,
                       &s.gflop, name);
        if (n != 15) {
            fprintf(stderr, "conv_lab: bad line in %s: %s", path, line);
            exit(2);
        }
        s.name = name;
        if (out_size(s.H, s.k, s.s, s.p) != s.Ho || out_size(s.W, s.k, s.s, s.p) != s.Wo) {
            fprintf(stderr, "conv_lab: output size mismatch: %s", line);
            exit(2);
        }
        v.push_back(s);
    }
    fclose(f);
    return v;
}

// ---------------------------------------------------------------------------
// helpers

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float urand() { /* xorshift64*, uniform in [-1, 1) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t r = rng_state * 2685821657736338717ull;
    return (float)((r >> 40) * (1.0 / 8388608.0)) - 1.0f;
}
static float bf16_round(float x) { return __bfloat162float(__float2bfloat16(x)); }

/* NCHW index helpers (host) */
static inline size_t ix4(int a, int b, int c, int d, int B, int C, int D) {
    return (((size_t)a * B + b) * C + c) * D + d;
}

/* [N][C][HW] <-> [N][HW][C] on the host */
static void to_nhwc(const std::vector<float> &src, std::vector<bf16> &dst, int N, int C, int HW) {
    dst.resize(src.size());
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            for (int i = 0; i < HW; i++)
                dst[((size_t)n * HW + i) * C + c] = __float2bfloat16(src[((size_t)n * C + c) * HW + i]);
}
static void to_bf16(const std::vector<float> &src, std::vector<bf16> &dst) {
    dst.resize(src.size());
    for (size_t i = 0; i < src.size(); i++) dst[i] = __float2bfloat16(src[i]);
}

static double rel_err(const std::vector<float> &out, const std::vector<float> &ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        double d = (double)out[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    if (!(num == num)) return NAN;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

// ---------------------------------------------------------------------------
// geometry of one run (a shape at its timed size, or its small check size)

struct Geo {
    int N, Cin, H, W, Cout, k, s, p, g, Ho, Wo, Cg;
    size_t nx() const { return (size_t)N * Cin * H * W; }
    size_t ny() const { return (size_t)N * Cout * Ho * Wo; }
    size_t nw() const { return (size_t)Cout * Cg * k * k; }
    bool depthwise() const { return g == Cin && g == Cout && g > 1; }
    bool dense() const { return g == 1; }
    bool pointwise() const { return g == 1 && k == 1 && s == 1 && p == 0; }
};

static Geo geo_full(const Shape &s) {
    Geo g = {s.N, s.Cin, s.H, s.W, s.Cout, s.k, s.s, s.p, s.g, s.Ho, s.Wo, s.Cin / s.g};
    return g;
}
static Geo geo_small(const Shape &s) {
    Geo g = geo_full(s);
    g.N = 1;
    g.H = std::min(s.H, 24);
    g.W = std::min(s.W, 24);
    g.Ho = out_size(g.H, g.k, g.s, g.p);
    g.Wo = out_size(g.W, g.k, g.s, g.p);
    return g;
}

// ---------------------------------------------------------------------------
// CPU reference (NCHW / KCRS f32, double accumulation, groups)

static void cpu_fwd(const Geo &g, const std::vector<float> &x, const std::vector<float> &w,
                    std::vector<float> &y) {
    y.assign(g.ny(), 0.f);
    int Og = g.Cout / g.g;
    for (int n = 0; n < g.N; n++)
        for (int co = 0; co < g.Cout; co++) {
            int gi = co / Og;
            for (int ho = 0; ho < g.Ho; ho++)
                for (int wo = 0; wo < g.Wo; wo++) {
                    double acc = 0;
                    for (int cl = 0; cl < g.Cg; cl++)
                        for (int r = 0; r < g.k; r++) {
                            int hi = ho * g.s - g.p + r;
                            if (hi < 0 || hi >= g.H) continue;
                            for (int q = 0; q < g.k; q++) {
                                int wi = wo * g.s - g.p + q;
                                if (wi < 0 || wi >= g.W) continue;
                                acc += (double)x[ix4(n, gi * g.Cg + cl, hi, wi, g.Cin, g.H, g.W)] *
                                       w[ix4(co, cl, r, q, g.Cg, g.k, g.k)];
                            }
                        }
                    y[ix4(n, co, ho, wo, g.Cout, g.Ho, g.Wo)] = (float)acc;
                }
        }
}

static void cpu_dgrad(const Geo &g, const std::vector<float> &dy, const std::vector<float> &w,
                      std::vector<float> &dx) {
    std::vector<double> acc(g.nx(), 0.0);
    int Og = g.Cout / g.g;
    for (int n = 0; n < g.N; n++)
        for (int co = 0; co < g.Cout; co++) {
            int gi = co / Og;
            for (int ho = 0; ho < g.Ho; ho++)
                for (int wo = 0; wo < g.Wo; wo++) {
                    double d = dy[ix4(n, co, ho, wo, g.Cout, g.Ho, g.Wo)];
                    for (int cl = 0; cl < g.Cg; cl++)
                        for (int r = 0; r < g.k; r++) {
                            int hi = ho * g.s - g.p + r;
                            if (hi < 0 || hi >= g.H) continue;
                            for (int q = 0; q < g.k; q++) {
                                int wi = wo * g.s - g.p + q;
                                if (wi < 0 || wi >= g.W) continue;
                                acc[ix4(n, gi * g.Cg + cl, hi, wi, g.Cin, g.H, g.W)] +=
                                    d * w[ix4(co, cl, r, q, g.Cg, g.k, g.k)];
                            }
                        }
                }
        }
    dx.resize(g.nx());
    for (size_t i = 0; i < acc.size(); i++) dx[i] = (float)acc[i];
}

static void cpu_wgrad(const Geo &g, const std::vector<float> &x, const std::vector<float> &dy,
                      std::vector<float> &dw) {
    std::vector<double> acc(g.nw(), 0.0);
    int Og = g.Cout / g.g;
    for (int n = 0; n < g.N; n++)
        for (int co = 0; co < g.Cout; co++) {
            int gi = co / Og;
            for (int ho = 0; ho < g.Ho; ho++)
                for (int wo = 0; wo < g.Wo; wo++) {
                    double d = dy[ix4(n, co, ho, wo, g.Cout, g.Ho, g.Wo)];
                    for (int cl = 0; cl < g.Cg; cl++)
                        for (int r = 0; r < g.k; r++) {
                            int hi = ho * g.s - g.p + r;
                            if (hi < 0 || hi >= g.H) continue;
                            for (int q = 0; q < g.k; q++) {
                                int wi = wo * g.s - g.p + q;
                                if (wi < 0 || wi >= g.W) continue;
                                acc[ix4(co, cl, r, q, g.Cg, g.k, g.k)] +=
                                    d * x[ix4(n, gi * g.Cg + cl, hi, wi, g.Cin, g.H, g.W)];
                            }
                        }
                }
        }
    dw.resize(g.nw());
    for (size_t i = 0; i < acc.size(); i++) dw[i] = (float)acc[i];
}

// ---------------------------------------------------------------------------
// naive GPU reference (NCHW / KCRS f32): checks the timed geometry

struct GeoD {
    int N, Cin, H, W, Cout, k, s, p, g, Ho, Wo, Cg;
};
static GeoD gd(const Geo &g) {
    GeoD d = {g.N, g.Cin, g.H, g.W, g.Cout, g.k, g.s, g.p, g.g, g.Ho, g.Wo, g.Cg};
    return d;
}

__global__ void ref_fwd(const float *x, const float *w, float *y, GeoD g) {
    size_t ny = (size_t)g.N * g.Cout * g.Ho * g.Wo;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < ny;
         e += (size_t)gridDim.x * blockDim.x) {
        int wo = (int)(e % g.Wo);
        size_t t = e / g.Wo;
        int ho = (int)(t % g.Ho);
        t /= g.Ho;
        int co = (int)(t % g.Cout);
        int n = (int)(t / g.Cout);
        int gi = co / (g.Cout / g.g);
        float acc = 0.f;
        for (int cl = 0; cl < g.Cg; cl++)
            for (int r = 0; r < g.k; r++) {
                int hi = ho * g.s - g.p + r;
                if (hi < 0 || hi >= g.H) continue;
                for (int q = 0; q < g.k; q++) {
                    int wi = wo * g.s - g.p + q;
                    if (wi < 0 || wi >= g.W) continue;
                    acc += x[(((size_t)n * g.Cin + gi * g.Cg + cl) * g.H + hi) * g.W + wi] *
                           w[(((size_t)co * g.Cg + cl) * g.k + r) * g.k + q];
                }
            }
        y[e] = acc;
    }
}

__global__ void ref_dgrad(const float *dy, const float *w, float *dx, GeoD g) {
    size_t nx = (size_t)g.N * g.Cin * g.H * g.W;
    int Og = g.Cout / g.g;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < nx;
         e += (size_t)gridDim.x * blockDim.x) {
        int wi = (int)(e % g.W);
        size_t t = e / g.W;
        int hi = (int)(t % g.H);
        t /= g.H;
        int ci = (int)(t % g.Cin);
        int n = (int)(t / g.Cin);
        int gi = ci / g.Cg, cl = ci % g.Cg;
        float acc = 0.f;
        for (int ol = 0; ol < Og; ol++) {
            int co = gi * Og + ol;
            for (int r = 0; r < g.k; r++) {
                int hn = hi + g.p - r;
                if (hn < 0 || hn % g.s) continue;
                int ho = hn / g.s;
                if (ho >= g.Ho) continue;
                for (int q = 0; q < g.k; q++) {
                    int wn = wi + g.p - q;
                    if (wn < 0 || wn % g.s) continue;
                    int wo = wn / g.s;
                    if (wo >= g.Wo) continue;
                    acc += dy[(((size_t)n * g.Cout + co) * g.Ho + ho) * g.Wo + wo] *
                           w[(((size_t)co * g.Cg + cl) * g.k + r) * g.k + q];
                }
            }
        }
        dx[e] = acc;
    }
}

/* one block per weight element */
__global__ void ref_wgrad(const float *x, const float *dy, float *dw, GeoD g) {
    __shared__ float red[256];
    size_t e = blockIdx.x;
    int q = (int)(e % g.k);
    size_t t = e / g.k;
    int r = (int)(t % g.k);
    t /= g.k;
    int cl = (int)(t % g.Cg);
    int co = (int)(t / g.Cg);
    int ci = (co / (g.Cout / g.g)) * g.Cg + cl;
    size_t P = (size_t)g.N * g.Ho * g.Wo;
    float acc = 0.f;
    for (size_t pix = threadIdx.x; pix < P; pix += blockDim.x) {
        int wo = (int)(pix % g.Wo);
        size_t u = pix / g.Wo;
        int ho = (int)(u % g.Ho);
        int n = (int)(u / g.Ho);
        int hi = ho * g.s - g.p + r, wi = wo * g.s - g.p + q;
        if (hi < 0 || hi >= g.H || wi < 0 || wi >= g.W) continue;
        acc += dy[(((size_t)n * g.Cout + co) * g.Ho + ho) * g.Wo + wo] *
               x[(((size_t)n * g.Cin + ci) * g.H + hi) * g.W + wi];
    }
    red[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) dw[e] = red[0];
}

// ---------------------------------------------------------------------------
// own kernels: implicit GEMM (WMMA bf16, f32 accumulation), NHWC, KRSC weight

namespace wm = nvcuda::wmma;
enum { M_FWD = 0, M_DGRAD = 1, M_WGRAD = 2 };
constexpr int BM = 64, BN = 64, BK = 32, NT = 128;
constexpr int LDA_R = BK + 8; /* A row-major [BM][LDA_R] (fwd, dgrad) */
constexpr int LDA_C = BM + 8; /* A col-major [BK][LDA_C] (wgrad) */
constexpr int LDB_C = BK + 8; /* B col-major [BN][LDB_C] (fwd) */
constexpr int LDB_R = BN + 8; /* B row-major [BK][LDB_R] (dgrad, wgrad) */
constexpr int LDC = BN + 4;
constexpr int SA = BM * LDA_R > BK * LDA_C ? BM * LDA_R : BK * LDA_C;
constexpr int SB = BN * LDB_C > BK * LDB_R ? BN * LDB_C : BK * LDB_R;

/* GEMM C[M][Nc] = sum_k A(m,k) B(k,n):
 *   fwd:   A = x im2col  (m = n,ho,wo; k = r,q,ci)  B(k,n) = w[n][k]      -> y  [M][Cout]
 *   dgrad: A = dy gather (m = n,h,w;   k = r,q,co)  B(k,n) = w[co][r][q][n] -> dx [M][Cin]
 *   wgrad: A(m,k) = dy[k][m] (m = co, k = pixel)    B(k,n) = x im2col (n = r,q,ci)
 *          -> dw [Cout][k*k*Cin] (KRSC), f32, one slice per split */
struct IgP {
    const bf16 *a, *b;
    void *out;
    int N, H, W, Cin, Cout, Ho, Wo, k, s, p;
    int M, Nc, K, kchunk;
};

/* host-callable too, so that the index maps can be checked on a machine
 * without a GPU (a test harness that includes this file) */
#define HD __host__ __device__ __forceinline__
#ifdef __CUDA_ARCH__
#define LDG16(p) __ldg((const uint4 *)(p))
#else
#define LDG16(p) (*(const uint4 *)(p))
#endif
#ifdef __CUDA_ARCH__
#define UNROLL _Pragma("unroll")
#else
#define UNROLL
#endif

HD bf16 bzero() { return __float2bfloat16(0.f); }

template <int MODE>
HD bf16 a_elem(const IgP &P, int m, int k) {
    if (m >= P.M || k >= P.K) return bzero();
    if (MODE == M_FWD) {
        int c = k % P.Cin, rq = k / P.Cin, q = rq % P.k, r = rq / P.k;
        int wo = m % P.Wo, t = m / P.Wo, ho = t % P.Ho, n = t / P.Ho;
        int hi = ho * P.s - P.p + r, wi = wo * P.s - P.p + q;
        if (hi < 0 || hi >= P.H || wi < 0 || wi >= P.W) return bzero();
        return P.a[((size_t)(n * P.H + hi) * P.W + wi) * P.Cin + c];
    } else if (MODE == M_DGRAD) {
        int co = k % P.Cout, rq = k / P.Cout, q = rq % P.k, r = rq / P.k;
        int w = m % P.W, t = m / P.W, h = t % P.H, n = t / P.H;
        int hn = h + P.p - r, wn = w + P.p - q;
        if (hn < 0 || wn < 0 || hn % P.s || wn % P.s) return bzero();
        int ho = hn / P.s, wo = wn / P.s;
        if (ho >= P.Ho || wo >= P.Wo) return bzero();
        return P.a[((size_t)(n * P.Ho + ho) * P.Wo + wo) * P.Cout + co];
    } else {
        return P.a[(size_t)k * P.Cout + m];
    }
}

template <int MODE>
HD bf16 b_elem(const IgP &P, int k, int n) {
    if (k >= P.K || n >= P.Nc) return bzero();
    if (MODE == M_FWD) {
        return P.b[(size_t)n * P.K + k];
    } else if (MODE == M_DGRAD) {
        int co = k % P.Cout, rq = k / P.Cout, q = rq % P.k, r = rq / P.k;
        return P.b[(((size_t)co * P.k + r) * P.k + q) * P.Cin + n];
    } else {
        int c = n % P.Cin, rq = n / P.Cin, q = rq % P.k, r = rq / P.k;
        int wo = k % P.Wo, t = k / P.Wo, ho = t % P.Ho, img = t / P.Ho;
        int hi = ho * P.s - P.p + r, wi = wo * P.s - P.p + q;
        if (hi < 0 || hi >= P.H || wi < 0 || wi >= P.W) return bzero();
        return P.b[((size_t)(img * P.H + hi) * P.W + wi) * P.Cin + c];
    }
}

/* 8 consecutive elements along the contiguous dimension (k for fwd/dgrad A,
 * m for wgrad A); needs Cin % 8 == 0 and Cout % 8 == 0 */
template <int MODE>
HD uint4 a_vec(const IgP &P, int m, int k) {
    const uint4 z = make_uint4(0, 0, 0, 0);
    if (m >= P.M || k >= P.K) return z;
    if (MODE == M_FWD) {
        int c = k % P.Cin, rq = k / P.Cin, q = rq % P.k, r = rq / P.k;
        int wo = m % P.Wo, t = m / P.Wo, ho = t % P.Ho, n = t / P.Ho;
        int hi = ho * P.s - P.p + r, wi = wo * P.s - P.p + q;
        if (hi < 0 || hi >= P.H || wi < 0 || wi >= P.W) return z;
        return LDG16((P.a + ((size_t)(n * P.H + hi) * P.W + wi) * P.Cin + c));
    } else if (MODE == M_DGRAD) {
        int co = k % P.Cout, rq = k / P.Cout, q = rq % P.k, r = rq / P.k;
        int w = m % P.W, t = m / P.W, h = t % P.H, n = t / P.H;
        int hn = h + P.p - r, wn = w + P.p - q;
        if (hn < 0 || wn < 0 || hn % P.s || wn % P.s) return z;
        int ho = hn / P.s, wo = wn / P.s;
        if (ho >= P.Ho || wo >= P.Wo) return z;
        return LDG16((P.a + ((size_t)(n * P.Ho + ho) * P.Wo + wo) * P.Cout + co));
    } else {
        return LDG16((P.a + (size_t)k * P.Cout + m));
    }
}

/* 8 consecutive elements along k (fwd) or n (dgrad, wgrad) */
template <int MODE>
HD uint4 b_vec(const IgP &P, int k, int n) {
    const uint4 z = make_uint4(0, 0, 0, 0);
    if (k >= P.K || n >= P.Nc) return z;
    if (MODE == M_FWD) {
        return LDG16((P.b + (size_t)n * P.K + k));
    } else if (MODE == M_DGRAD) {
        int co = k % P.Cout, rq = k / P.Cout, q = rq % P.k, r = rq / P.k;
        return LDG16((P.b + (((size_t)co * P.k + r) * P.k + q) * P.Cin + n));
    } else {
        int c = n % P.Cin, rq = n / P.Cin, q = rq % P.k, r = rq / P.k;
        int wo = k % P.Wo, t = k / P.Wo, ho = t % P.Ho, img = t / P.Ho;
        int hi = ho * P.s - P.p + r, wi = wo * P.s - P.p + q;
        if (hi < 0 || hi >= P.H || wi < 0 || wi >= P.W) return z;
        return LDG16((P.b + ((size_t)(img * P.H + hi) * P.W + wi) * P.Cin + c));
    }
}

template <int MODE, bool VEC>
struct Stage {
    /* per thread: 2 vectors (or 16 scalars) of A and of B per 64x32 / 32x64 tile */
    uint4 av[VEC ? 2 : 1], bv[VEC ? 2 : 1];
    bf16 as[VEC ? 1 : 16], bs[VEC ? 1 : 16];

    HD void load(const IgP &P, int m0, int n0, int k0, int tid) {
        if (VEC) {
UNROLL
            for (int i = 0; i < 2; i++) {
                int v = tid + i * NT;
                if (MODE != M_WGRAD) av[i] = a_vec<MODE>(P, m0 + (v >> 2), k0 + (v & 3) * 8);
                else av[i] = a_vec<MODE>(P, m0 + (v & 7) * 8, k0 + (v >> 3));
                if (MODE == M_FWD) bv[i] = b_vec<MODE>(P, k0 + (v & 3) * 8, n0 + (v >> 2));
                else bv[i] = b_vec<MODE>(P, k0 + (v >> 3), n0 + (v & 7) * 8);
            }
        } else {
UNROLL
            for (int j = 0; j < 16; j++) {
                int e = tid + j * NT;
                if (MODE != M_WGRAD) as[j] = a_elem<MODE>(P, m0 + e / BK, k0 + e % BK);
                else as[j] = a_elem<MODE>(P, m0 + e % BM, k0 + e / BM);
                if (MODE == M_FWD) bs[j] = b_elem<MODE>(P, k0 + e % BK, n0 + e / BK);
                else bs[j] = b_elem<MODE>(P, k0 + e / BN, n0 + e % BN);
            }
        }
    }

    HD void store(bf16 *sA, bf16 *sB, int tid) {
        if (VEC) {
UNROLL
            for (int i = 0; i < 2; i++) {
                int v = tid + i * NT;
                if (MODE != M_WGRAD) *(uint4 *)(sA + (v >> 2) * LDA_R + (v & 3) * 8) = av[i];
                else *(uint4 *)(sA + (v >> 3) * LDA_C + (v & 7) * 8) = av[i];
                if (MODE == M_FWD) *(uint4 *)(sB + (v >> 2) * LDB_C + (v & 3) * 8) = bv[i];
                else *(uint4 *)(sB + (v >> 3) * LDB_R + (v & 7) * 8) = bv[i];
            }
        } else {
UNROLL
            for (int j = 0; j < 16; j++) {
                int e = tid + j * NT;
                if (MODE != M_WGRAD) sA[(e / BK) * LDA_R + e % BK] = as[j];
                else sA[(e / BM) * LDA_C + e % BM] = as[j];
                if (MODE == M_FWD) sB[(e / BK) * LDB_C + e % BK] = bs[j];
                else sB[(e / BN) * LDB_R + e % BN] = bs[j];
            }
        }
    }
};

template <int MODE, bool VEC>
__global__ void __launch_bounds__(NT) igemm(IgP P) {
    typedef typename std::conditional<MODE == M_WGRAD, wm::col_major, wm::row_major>::type ALay;
    typedef typename std::conditional<MODE == M_FWD, wm::col_major, wm::row_major>::type BLay;
    __shared__ __align__(128) bf16 sA[SA];
    __shared__ __align__(128) bf16 sB[SB];
    __shared__ __align__(128) float sC[BM * LDC];

    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int kbeg = blockIdx.z * P.kchunk;
    const int kend = min(P.K, kbeg + P.kchunk);
    const int warp = threadIdx.x >> 5, wmr = (warp >> 1) * 32, wnc = (warp & 1) * 32;

    wm::fragment<wm::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wm::fill_fragment(acc[i][j], 0.f);

    Stage<MODE, VEC> st;
    if (kbeg < kend) st.load(P, m0, n0, kbeg, threadIdx.x);
    for (int k0 = kbeg; k0 < kend; k0 += BK) {
        st.store(sA, sB, threadIdx.x);
        __syncthreads();
        if (k0 + BK < kend) st.load(P, m0, n0, k0 + BK, threadIdx.x);
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wm::fragment<wm::matrix_a, 16, 16, 16, bf16, ALay> fa[2];
            wm::fragment<wm::matrix_b, 16, 16, 16, bf16, BLay> fb[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                if (MODE != M_WGRAD) wm::load_matrix_sync(fa[i], sA + (wmr + i * 16) * LDA_R + kk, LDA_R);
                else wm::load_matrix_sync(fa[i], sA + kk * LDA_C + wmr + i * 16, LDA_C);
            }
#pragma unroll
            for (int j = 0; j < 2; j++) {
                if (MODE == M_FWD) wm::load_matrix_sync(fb[j], sB + (wnc + j * 16) * LDB_C + kk, LDB_C);
                else wm::load_matrix_sync(fb[j], sB + kk * LDB_R + wnc + j * 16, LDB_R);
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
            wm::store_matrix_sync(sC + (wmr + i * 16) * LDC + wnc + j * 16, acc[i][j], LDC,
                                  wm::mem_row_major);
    __syncthreads();
    if (MODE == M_WGRAD) {
        float *out = (float *)P.out + (size_t)blockIdx.z * P.M * P.Nc;
        for (int e = threadIdx.x; e < BM * BN; e += NT) {
            int r = e / BN, c = e % BN, gm = m0 + r, gn = n0 + c;
            if (gm < P.M && gn < P.Nc) out[(size_t)gm * P.Nc + gn] = sC[r * LDC + c];
        }
    } else if (VEC) { /* Nc % 8 == 0: 8 bf16 per store */
        bf16 *out = (bf16 *)P.out;
        for (int v = threadIdx.x; v < BM * BN / 8; v += NT) {
            int r = v / (BN / 8), c = (v % (BN / 8)) * 8, gm = m0 + r, gn = n0 + c;
            if (gm < P.M && gn < P.Nc) {
                __align__(16) bf16 h[8];
#pragma unroll
                for (int j = 0; j < 8; j++) h[j] = __float2bfloat16(sC[r * LDC + c + j]);
                *(uint4 *)(out + (size_t)gm * P.Nc + gn) = *(const uint4 *)h;
            }
        }
    } else {
        bf16 *out = (bf16 *)P.out;
        for (int e = threadIdx.x; e < BM * BN; e += NT) {
            int r = e / BN, c = e % BN, gm = m0 + r, gn = n0 + c;
            if (gm < P.M && gn < P.Nc) out[(size_t)gm * P.Nc + gn] = __float2bfloat16(sC[r * LDC + c]);
        }
    }
}

/* dw[i] = sum over splits, in split order (deterministic) */
__global__ void reduce_splits(const float *part, float *out, size_t n, int splits) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.f;
        for (int k = 0; k < splits; k++) s += part[(size_t)k * n + i];
        out[i] = s;
    }
}

// ---------------------------------------------------------------------------
// own kernels: depthwise 3x3, stride 1, pad 1, NHWC, C % 8 == 0; weight [C][3][3]

/* FLIP = 0: y = conv(x, w); FLIP = 1: dx = conv(dy, w rotated 180 degrees) */
template <int FLIP>
__global__ void dw3(const bf16 *__restrict__ in, const bf16 *__restrict__ w, bf16 *__restrict__ out,
                    int N, int H, int W, int C) {
    int C8 = C / 8;
    size_t total = (size_t)N * H * W * C8;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        int c0 = (int)(idx % C8) * 8;
        size_t pix = idx / C8;
        int x_ = (int)(pix % W);
        size_t t = pix / W;
        int h = (int)(t % H);
        int n = (int)(t / H);
        float acc[8];
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] = 0.f;
#pragma unroll
        for (int r = 0; r < 3; r++) {
            int hi = FLIP ? h + 1 - r : h - 1 + r;
            if (hi < 0 || hi >= H) continue;
#pragma unroll
            for (int q = 0; q < 3; q++) {
                int wi = FLIP ? x_ + 1 - q : x_ - 1 + q;
                if (wi < 0 || wi >= W) continue;
                uint4 v = __ldg((const uint4 *)(in + (((size_t)n * H + hi) * W + wi) * C + c0));
                const bf16 *hv = (const bf16 *)&v;
#pragma unroll
                for (int j = 0; j < 8; j++)
                    acc[j] += __bfloat162float(hv[j]) * __bfloat162float(w[(c0 + j) * 9 + r * 3 + q]);
            }
        }
        __align__(16) bf16 o[8];
#pragma unroll
        for (int j = 0; j < 8; j++) o[j] = __float2bfloat16(acc[j]);
        *(uint4 *)(out + pix * C + c0) = *(const uint4 *)o;
    }
}

/* filter gradient partials: block = 32 channels x 8 pixel lanes, one pixel
 * range per blockIdx.y; fixed-order reductions (deterministic) */
__global__ void __launch_bounds__(256) dw3_wgrad(const bf16 *__restrict__ x, const bf16 *__restrict__ dy,
                                                 float *__restrict__ part, int N, int H, int W, int C,
                                                 int pchunk) {
    __shared__ float red[8][32][9];
    int lane = threadIdx.x & 31, py = threadIdx.x >> 5;
    int c = blockIdx.x * 32 + lane;
    long P = (long)N * H * W;
    long p0 = (long)blockIdx.y * pchunk, p1 = min(P, p0 + pchunk);
    float acc[9];
#pragma unroll
    for (int t = 0; t < 9; t++) acc[t] = 0.f;
    if (c < C) {
        for (long p = p0 + py; p < p1; p += 8) {
            int w_ = (int)(p % W);
            long t = p / W;
            int h = (int)(t % H);
            int n = (int)(t / H);
            float g = __bfloat162float(dy[p * C + c]);
#pragma unroll
            for (int r = 0; r < 3; r++) {
                int hi = h - 1 + r;
                if (hi < 0 || hi >= H) continue;
#pragma unroll
                for (int q = 0; q < 3; q++) {
                    int wi = w_ - 1 + q;
                    if (wi < 0 || wi >= W) continue;
                    acc[r * 3 + q] += g * __bfloat162float(x[(((long)n * H + hi) * W + wi) * C + c]);
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < 9; t++) red[py][lane][t] = acc[t];
    __syncthreads();
    if (py == 0 && c < C) {
#pragma unroll
        for (int t = 0; t < 9; t++) {
            float s = 0.f;
            for (int y = 0; y < 8; y++) s += red[y][lane][t];
            part[((size_t)blockIdx.y * C + c) * 9 + t] = s;
        }
    }
}

// ---------------------------------------------------------------------------
// layout transpose (the cost of NCHW <-> NHWC per layer): in [n][R][Cc] -> out [n][Cc][R]

__global__ void transpose_bf16(const bf16 *__restrict__ in, bf16 *__restrict__ out, int R, int Cc) {
    __shared__ bf16 tile[32][33];
    size_t base = (size_t)blockIdx.z * R * Cc;
    int c = blockIdx.x * 32 + threadIdx.x;
    for (int j = threadIdx.y; j < 32; j += 8) {
        int r = blockIdx.y * 32 + j;
        if (r < R && c < Cc) tile[j][threadIdx.x] = in[base + (size_t)r * Cc + c];
    }
    __syncthreads();
    int r = blockIdx.y * 32 + threadIdx.x;
    for (int j = threadIdx.y; j < 32; j += 8) {
        int cc = blockIdx.x * 32 + j;
        if (r < R && cc < Cc) out[base + (size_t)cc * R + r] = tile[threadIdx.x][j];
    }
}

static void transpose(cudaStream_t s, const bf16 *in, bf16 *out, int N, int R, int Cc) {
    dim3 grid((Cc + 31) / 32, (R + 31) / 32, N), block(32, 8);
    transpose_bf16<<<grid, block, 0, s>>>(in, out, R, Cc);
}

__global__ void empty_kernel() {}

// ---------------------------------------------------------------------------
// routes

enum { V_NCHW = 0, V_NHWC, V_FIND, V_OWN, V_CUBLAS, V_LUCID, NV };
static const char *VNAME[NV] = {"dnnNCHW", "dnnNHWC", "dnnFind", "own", "cublas", "lucid"};
static const char *VCOL[NV] = {"NCHW", "NHWC", "Find", "own", "blas", "lucid"}; /* column heads */
/* routes that read the NHWC copies (the NCHW ones and lucid do not) */
static bool uses_nhwc(int v) { return v != V_NCHW && v != V_LUCID; }
static const char *PNAME[3] = {"fwd", "dgrad", "wgrad"};
enum { ST_NA = 0, ST_OK, ST_FAIL };

struct Res {
    int st = ST_NA;
    double ms = 0, err_small = -1, err_full = -1;
    int algo = -1;
    char why[320] = "";
};

struct Glob {
    cudaStream_t stream;
    cudnnHandle_t dnn;
    cublasHandle_t blas;
    cublasHandle_t blas_eng; /* set up as cuda/backend.cu's (lucid route, 1x1 GEMMs) */
    void *ws;  /* cuDNN workspace, WS_CAP bytes */
    int sms;
    int iters;
    bool on[NV];    /* routes= selection */
    bool nhwc;      /* some selected route is NHWC: make NHWC copies, time transposes */
};
static Glob G;

/* one geometry's data */
struct Bufs {
    Geo g;
    std::vector<float> hx[2], hdy[2], hw; /* NCHW / KCRS, bf16-exact values */
    bf16 *x_nchw[2], *x_nhwc[2], *dy_nchw[2], *dy_nhwc[2], *w_kcrs, *w_krsc;
    float *w_f32;       /* KCRS f32 (the engine's master weight; lucid route) */
    bf16 *y, *dx, *dwb; /* outputs (bf16) */
    float *dwf;         /* filter gradient, f32 */
    float *part;        /* split partials (own), backward-filter scratch (lucid) */
    size_t part_n;
    bf16 *wt;           /* lucid: the stride-phase backward-data's transposed weight, or NULL */
    bf16 *tx, *ty;      /* transpose targets */
};

template <class T>
static T *dalloc(size_t n) {
    T *p = NULL;
    CK(cudaMalloc((void **)&p, std::max<size_t>(n, 1) * sizeof(T)));
    return p;
}
template <class T>
static T *dupload(const std::vector<T> &h) {
    T *p = dalloc<T>(h.size());
    CK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}

static void bufs_make(Bufs &b, const Geo &g, uint64_t seed) {
    b.g = g;
    rng_state = seed * 0x9E3779B97F4A7C15ull + 12345;
    float wb = 1.0f / sqrtf((float)(g.Cg * g.k * g.k));
    for (int s = 0; s < 2; s++) {
        b.hx[s].resize(g.nx());
        for (auto &v : b.hx[s]) v = bf16_round(urand());
        b.hdy[s].resize(g.ny());
        for (auto &v : b.hdy[s]) v = bf16_round(urand());
    }
    b.hw.resize(g.nw());
    for (auto &v : b.hw) v = bf16_round(wb * urand());
    std::vector<bf16> t;
    for (int s = 0; s < 2; s++) {
        to_bf16(b.hx[s], t);
        b.x_nchw[s] = dupload(t);
        to_bf16(b.hdy[s], t);
        b.dy_nchw[s] = dupload(t);
        b.x_nhwc[s] = b.dy_nhwc[s] = NULL;
        if (!G.nhwc) continue;
        to_nhwc(b.hx[s], t, g.N, g.Cin, g.H * g.W);
        b.x_nhwc[s] = dupload(t);
        to_nhwc(b.hdy[s], t, g.N, g.Cout, g.Ho * g.Wo);
        b.dy_nhwc[s] = dupload(t);
    }
    to_bf16(b.hw, t);
    b.w_kcrs = dupload(t);
    b.w_krsc = NULL;
    if (G.nhwc) {
        to_nhwc(b.hw, t, g.Cout, g.Cg, g.k * g.k); /* KCRS -> KRSC */
        b.w_krsc = dupload(t);
    }
    b.w_f32 = dupload(b.hw);
    b.y = dalloc<bf16>(g.ny());
    b.dx = dalloc<bf16>(g.nx());
    b.dwb = dalloc<bf16>(g.nw());
    b.dwf = dalloc<float>(g.nw());
    b.part = NULL;
    b.part_n = 0;
    b.wt = NULL;
    b.tx = G.nhwc ? dalloc<bf16>(g.nx()) : NULL;
    b.ty = G.nhwc ? dalloc<bf16>(g.ny()) : NULL;
}

static void bufs_free(Bufs &b) {
    for (int s = 0; s < 2; s++) {
        CK(cudaFree(b.x_nchw[s]));
        CK(cudaFree(b.x_nhwc[s]));
        CK(cudaFree(b.dy_nchw[s]));
        CK(cudaFree(b.dy_nhwc[s]));
    }
    CK(cudaFree(b.w_kcrs));
    CK(cudaFree(b.w_krsc));
    CK(cudaFree(b.w_f32));
    CK(cudaFree(b.y));
    CK(cudaFree(b.dx));
    CK(cudaFree(b.dwb));
    CK(cudaFree(b.dwf));
    if (b.part) CK(cudaFree(b.part));
    if (b.wt) CK(cudaFree(b.wt));
    CK(cudaFree(b.tx));
    CK(cudaFree(b.ty));
}

/* fill a buffer with NaN-ish poison (0xFFFF bf16 is NaN) */
static void poison(void *p, size_t bytes) { CK(cudaMemsetAsync(p, 0xFF, bytes, G.stream)); }

// ---- cuDNN plans

struct DnnPlan {
    bool made = false, nhwc = false;
    cudnnTensorDescriptor_t xd = NULL, yd = NULL;
    cudnnFilterDescriptor_t wd = NULL;
    cudnnConvolutionDescriptor_t cd[3] = {NULL, NULL, NULL};
    int algo[3] = {-1, -1, -1};
    size_t ws[3] = {0, 0, 0};
    bool have[3] = {false, false, false};
    char why[3][96];
};

static void dnn_free(DnnPlan &p) {
    if (p.xd) cudnnDestroyTensorDescriptor(p.xd);
    if (p.yd) cudnnDestroyTensorDescriptor(p.yd);
    if (p.wd) cudnnDestroyFilterDescriptor(p.wd);
    for (int i = 0; i < 3; i++)
        if (p.cd[i]) cudnnDestroyConvolutionDescriptor(p.cd[i]);
    p = DnnPlan();
}

#define DNN_OR(call, plan, pass)                                                              \
    do {                                                                                      \
        cudnnStatus_t s_ = (call);                                                            \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                                     \
            snprintf((plan).why[pass], sizeof (plan).why[pass], "%s", cudnnGetErrorString(s_)); \
            return false;                                                                     \
        }                                                                                     \
    } while (0)

static bool dnn_descs(DnnPlan &p, const Geo &g, bool nhwc) {
    p.nhwc = nhwc;
    for (int i = 0; i < 3; i++) snprintf(p.why[i], sizeof p.why[i], "no plan");
    cudnnTensorFormat_t f = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    DNN_OR(cudnnCreateTensorDescriptor(&p.xd), p, 0);
    DNN_OR(cudnnCreateTensorDescriptor(&p.yd), p, 0);
    DNN_OR(cudnnCreateFilterDescriptor(&p.wd), p, 0);
    DNN_OR(cudnnSetTensor4dDescriptor(p.xd, f, CUDNN_DATA_BFLOAT16, g.N, g.Cin, g.H, g.W), p, 0);
    DNN_OR(cudnnSetTensor4dDescriptor(p.yd, f, CUDNN_DATA_BFLOAT16, g.N, g.Cout, g.Ho, g.Wo), p, 0);
    DNN_OR(cudnnSetFilter4dDescriptor(p.wd, CUDNN_DATA_BFLOAT16, f, g.Cout, g.Cg, g.k, g.k), p, 0);
    for (int i = 0; i < 3; i++) {
        DNN_OR(cudnnCreateConvolutionDescriptor(&p.cd[i]), p, 0);
        DNN_OR(cudnnSetConvolution2dDescriptor(p.cd[i], g.p, g.p, g.s, g.s, 1, 1,
                                               CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
               p, 0);
        DNN_OR(cudnnSetConvolutionGroupCount(p.cd[i], g.g), p, 0);
        DNN_OR(cudnnSetConvolutionMathType(p.cd[i], CUDNN_TENSOR_OP_MATH), p, 0);
    }
    p.made = true;
    return true;
}

/* the cuDNN route's rule (cuda/nn_conv.cu plan_fwd/plan_bwd_data/plan_bwd_filter) */
template <class Perf, class GetN, class GetV7, class WsQ>
static bool pick_heur(DnnPlan &p, int pass, GetN getn, GetV7 getv7, WsQ wsq) {
    int n = 0, ret = 0;
    DNN_OR(cudnnSetConvolutionMathType(p.cd[pass], CUDNN_TENSOR_OP_MATH), p, pass);
    DNN_OR(getn(&n), p, pass);
    std::vector<Perf> perf((size_t)(n > 0 ? n : 1));
    DNN_OR(getv7(n, &ret, perf.data()), p, pass);
    for (int i = 0; i < ret; i++) {
        const Perf &q = perf[(size_t)i];
        if (q.status != CUDNN_STATUS_SUCCESS || q.determinism != CUDNN_DETERMINISTIC) continue;
        DNN_OR(cudnnSetConvolutionMathType(p.cd[pass], q.mathType), p, pass);
        size_t ws = 0;
        if (wsq(q.algo, &ws) != CUDNN_STATUS_SUCCESS || ws > WS_CAP) continue;
        p.algo[pass] = (int)q.algo;
        p.ws[pass] = ws;
        p.have[pass] = true;
        return true;
    }
    snprintf(p.why[pass], sizeof p.why[pass], "no deterministic algorithm");
    return false;
}

/* fastest deterministic by cudnnFind*Ex (results come sorted by time) */
template <class Perf, class GetN, class Find, class WsQ>
static bool pick_find(DnnPlan &p, int pass, GetN getn, Find find, WsQ wsq) {
    int n = 0, ret = 0;
    DNN_OR(cudnnSetConvolutionMathType(p.cd[pass], CUDNN_TENSOR_OP_MATH), p, pass);
    DNN_OR(getn(&n), p, pass);
    std::vector<Perf> perf((size_t)(n > 0 ? n : 1));
    DNN_OR(find(n, &ret, perf.data()), p, pass);
    for (int i = 0; i < ret; i++) {
        const Perf &q = perf[(size_t)i];
        if (q.status != CUDNN_STATUS_SUCCESS || q.determinism != CUDNN_DETERMINISTIC ||
            q.memory > WS_CAP)
            continue;
        DNN_OR(cudnnSetConvolutionMathType(p.cd[pass], q.mathType), p, pass);
        size_t ws = 0;
        if (wsq(q.algo, &ws) != CUDNN_STATUS_SUCCESS || ws > WS_CAP) continue;
        p.algo[pass] = (int)q.algo;
        p.ws[pass] = ws;
        p.have[pass] = true;
        return true;
    }
    snprintf(p.why[pass], sizeof p.why[pass], "cudnnFind: no deterministic algorithm");
    return false;
}

static bool dnn_plan_pass(DnnPlan &p, const Bufs &b, int pass, bool find) {
    cudnnHandle_t h = G.dnn;
    const bool nh = p.nhwc;
    const bf16 *x = nh ? b.x_nhwc[0] : b.x_nchw[0];
    const bf16 *dy = nh ? b.dy_nhwc[0] : b.dy_nchw[0];
    const bf16 *w = nh ? b.w_krsc : b.w_kcrs;
    if (pass == 0) {
        auto getn = [&](int *n) { return cudnnGetConvolutionForwardAlgorithmMaxCount(h, n); };
        auto wsq = [&](cudnnConvolutionFwdAlgo_t a, size_t *ws) {
            return cudnnGetConvolutionForwardWorkspaceSize(h, p.xd, p.wd, p.cd[0], p.yd, a, ws);
        };
        if (!find)
            return pick_heur<cudnnConvolutionFwdAlgoPerf_t>(
                p, 0, getn,
                [&](int n, int *r, cudnnConvolutionFwdAlgoPerf_t *pf) {
                    return cudnnGetConvolutionForwardAlgorithm_v7(h, p.xd, p.wd, p.cd[0], p.yd, n, r, pf);
                },
                wsq);
        return pick_find<cudnnConvolutionFwdAlgoPerf_t>(
            p, 0, getn,
            [&](int n, int *r, cudnnConvolutionFwdAlgoPerf_t *pf) {
                return cudnnFindConvolutionForwardAlgorithmEx(h, p.xd, x, p.wd, w, p.cd[0], p.yd, b.y, n,
                                                              r, pf, G.ws, WS_CAP);
            },
            wsq);
    } else if (pass == 1) {
        auto getn = [&](int *n) { return cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, n); };
        auto wsq = [&](cudnnConvolutionBwdDataAlgo_t a, size_t *ws) {
            return cudnnGetConvolutionBackwardDataWorkspaceSize(h, p.wd, p.yd, p.cd[1], p.xd, a, ws);
        };
        if (!find)
            return pick_heur<cudnnConvolutionBwdDataAlgoPerf_t>(
                p, 1, getn,
                [&](int n, int *r, cudnnConvolutionBwdDataAlgoPerf_t *pf) {
                    return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.wd, p.yd, p.cd[1], p.xd, n, r,
                                                                       pf);
                },
                wsq);
        return pick_find<cudnnConvolutionBwdDataAlgoPerf_t>(
            p, 1, getn,
            [&](int n, int *r, cudnnConvolutionBwdDataAlgoPerf_t *pf) {
                return cudnnFindConvolutionBackwardDataAlgorithmEx(h, p.wd, w, p.yd, dy, p.cd[1], p.xd,
                                                                   b.dx, n, r, pf, G.ws, WS_CAP);
            },
            wsq);
    } else {
        auto getn = [&](int *n) { return cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, n); };
        auto wsq = [&](cudnnConvolutionBwdFilterAlgo_t a, size_t *ws) {
            return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p.xd, p.yd, p.cd[2], p.wd, a, ws);
        };
        if (!find)
            return pick_heur<cudnnConvolutionBwdFilterAlgoPerf_t>(
                p, 2, getn,
                [&](int n, int *r, cudnnConvolutionBwdFilterAlgoPerf_t *pf) {
                    return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.xd, p.yd, p.cd[2], p.wd, n, r,
                                                                         pf);
                },
                wsq);
        return pick_find<cudnnConvolutionBwdFilterAlgoPerf_t>(
            p, 2, getn,
            [&](int n, int *r, cudnnConvolutionBwdFilterAlgoPerf_t *pf) {
                return cudnnFindConvolutionBackwardFilterAlgorithmEx(h, p.xd, x, p.yd, dy, p.cd[2], p.wd,
                                                                     b.dwb, n, r, pf, G.ws, WS_CAP);
            },
            wsq);
    }
}

static cudnnStatus_t dnn_run(const DnnPlan &p, const Bufs &b, int pass, int set) {
    const float one = 1.f, zero = 0.f;
    const bool nh = p.nhwc;
    const bf16 *x = nh ? b.x_nhwc[set] : b.x_nchw[set];
    const bf16 *dy = nh ? b.dy_nhwc[set] : b.dy_nchw[set];
    const bf16 *w = nh ? b.w_krsc : b.w_kcrs;
    if (pass == 0)
        return cudnnConvolutionForward(G.dnn, &one, p.xd, x, p.wd, w, p.cd[0],
                                       (cudnnConvolutionFwdAlgo_t)p.algo[0], G.ws, p.ws[0], &zero, p.yd,
                                       b.y);
    if (pass == 1)
        return cudnnConvolutionBackwardData(G.dnn, &one, p.wd, w, p.yd, dy, p.cd[1],
                                            (cudnnConvolutionBwdDataAlgo_t)p.algo[1], G.ws, p.ws[1], &zero,
                                            p.xd, b.dx);
    return cudnnConvolutionBackwardFilter(G.dnn, &one, p.xd, x, p.yd, dy, p.cd[2],
                                          (cudnnConvolutionBwdFilterAlgo_t)p.algo[2], G.ws, p.ws[2], &zero,
                                          p.wd, b.dwb);
}

// ---- own route

struct OwnPlan {
    bool vec = false;
    IgP P[3];
    int splits = 1;         /* wgrad splits (dense) */
    int dw_splits = 1, dw_pchunk = 0;
};

static bool own_applicable(const Geo &g) {
    if (g.dense()) return true;
    return g.depthwise() && g.k == 3 && g.s == 1 && g.p == 1 && g.Cin % 8 == 0;
}

static void own_plan(OwnPlan &o, Bufs &b) {
    const Geo &g = b.g;
    if (g.dense()) {
        o.vec = g.Cin % 8 == 0 && g.Cout % 8 == 0;
        IgP base;
        memset(&base, 0, sizeof base);
        base.N = g.N; base.H = g.H; base.W = g.W; base.Cin = g.Cin; base.Cout = g.Cout;
        base.Ho = g.Ho; base.Wo = g.Wo; base.k = g.k; base.s = g.s; base.p = g.p;
        IgP f = base; /* forward */
        f.M = g.N * g.Ho * g.Wo; f.Nc = g.Cout; f.K = g.k * g.k * g.Cin; f.kchunk = f.K;
        IgP d = base; /* backward-data */
        d.M = g.N * g.H * g.W; d.Nc = g.Cin; d.K = g.k * g.k * g.Cout; d.kchunk = d.K;
        IgP w = base; /* backward-filter */
        w.M = g.Cout; w.Nc = g.k * g.k * g.Cin; w.K = g.N * g.Ho * g.Wo;
        int tiles = ((w.M + BM - 1) / BM) * ((w.Nc + BN - 1) / BN);
        int want = std::max(1, (2 * G.sms + tiles - 1) / tiles);
        int maxs = std::max(1, w.K / (BK * 8)); /* at least 8 k-tiles per split */
        int splits = std::min(want, maxs);
        int chunk = (w.K + splits - 1) / splits;
        chunk = (chunk + BK - 1) / BK * BK;
        o.splits = (w.K + chunk - 1) / chunk;
        w.kchunk = chunk;
        o.P[0] = f; o.P[1] = d; o.P[2] = w;
        size_t need = o.splits > 1 ? (size_t)o.splits * w.M * w.Nc : 0;
        if (need > b.part_n) {
            if (b.part) CK(cudaFree(b.part));
            b.part = dalloc<float>(need);
            b.part_n = need;
        }
    } else {
        long P = (long)g.N * g.H * g.W;
        int cblocks = (g.Cin + 31) / 32;
        int want = std::max(1, (2 * G.sms + cblocks - 1) / cblocks);
        int maxs = (int)std::max<long>(1, P / 64);
        int splits = std::min(want, maxs);
        o.dw_pchunk = (int)((P + splits - 1) / splits);
        o.dw_splits = (int)((P + o.dw_pchunk - 1) / o.dw_pchunk);
        size_t need = o.dw_splits > 1 ? (size_t)o.dw_splits * g.Cin * 9 : 0;
        if (need > b.part_n) {
            if (b.part) CK(cudaFree(b.part));
            b.part = dalloc<float>(need);
            b.part_n = need;
        }
    }
}

template <int MODE>
static void igemm_launch(const IgP &P, bool vec, int splits) {
    dim3 grid((P.M + BM - 1) / BM, (P.Nc + BN - 1) / BN, splits);
    if (vec) igemm<MODE, true><<<grid, NT, 0, G.stream>>>(P);
    else igemm<MODE, false><<<grid, NT, 0, G.stream>>>(P);
}

static unsigned grid1(size_t n, int t) {
    size_t b = (n + t - 1) / t;
    return (unsigned)std::min<size_t>(b, (size_t)G.sms * 32);
}

static void own_run(const OwnPlan &o, const Bufs &b, int pass, int set) {
    const Geo &g = b.g;
    if (g.dense()) {
        IgP P = o.P[pass];
        if (pass == 0) {
            P.a = b.x_nhwc[set]; P.b = b.w_krsc; P.out = b.y;
            igemm_launch<M_FWD>(P, o.vec, 1);
        } else if (pass == 1) {
            P.a = b.dy_nhwc[set]; P.b = b.w_krsc; P.out = b.dx;
            igemm_launch<M_DGRAD>(P, o.vec, 1);
        } else {
            P.a = b.dy_nhwc[set]; P.b = b.x_nhwc[set];
            P.out = o.splits > 1 ? (void *)b.part : (void *)b.dwf;
            igemm_launch<M_WGRAD>(P, o.vec, o.splits);
            if (o.splits > 1) {
                size_t n = g.nw();
                reduce_splits<<<grid1(n, 256), 256, 0, G.stream>>>(b.part, b.dwf, n, o.splits);
            }
        }
    } else {
        size_t n = (size_t)g.N * g.H * g.W * (g.Cin / 8);
        if (pass == 0) dw3<0><<<grid1(n, 256), 256, 0, G.stream>>>(b.x_nhwc[set], b.w_krsc, b.y, g.N, g.H, g.W, g.Cin);
        else if (pass == 1) dw3<1><<<grid1(n, 256), 256, 0, G.stream>>>(b.dy_nhwc[set], b.w_krsc, b.dx, g.N, g.H, g.W, g.Cin);
        else {
            dim3 grid((g.Cin + 31) / 32, o.dw_splits);
            float *dst = o.dw_splits > 1 ? b.part : b.dwf;
            dw3_wgrad<<<grid, 256, 0, G.stream>>>(b.x_nhwc[set], b.dy_nhwc[set], dst, g.N, g.H, g.W, g.Cin,
                                                  o.dw_pchunk);
            if (o.dw_splits > 1) {
                size_t nw = (size_t)g.Cin * 9;
                reduce_splits<<<grid1(nw, 256), 256, 0, G.stream>>>(b.part, b.dwf, nw, o.dw_splits);
            }
        }
    }
}

// ---- cuBLAS route (1x1, stride 1, pad 0, groups 1; NHWC; w [Cout][Cin])

static cublasStatus_t blas_run(const Bufs &b, int pass, int set) {
    const Geo &g = b.g;
    const float one = 1.f, zero = 0.f;
    int M = g.N * g.H * g.W;
    if (pass == 0) /* y^T[Cout x M] = W[Cout x Cin] . x^T[Cin x M]  (column-major view) */
        return cublasGemmEx(G.blas, CUBLAS_OP_T, CUBLAS_OP_N, g.Cout, M, g.Cin, &one, b.w_krsc,
                            CUDA_R_16BF, g.Cin, b.x_nhwc[set], CUDA_R_16BF, g.Cin, &zero, b.y, CUDA_R_16BF,
                            g.Cout, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (pass == 1) /* dx^T[Cin x M] = W^T[Cin x Cout] . dy^T[Cout x M] */
        return cublasGemmEx(G.blas, CUBLAS_OP_N, CUBLAS_OP_N, g.Cin, M, g.Cout, &one, b.w_krsc,
                            CUDA_R_16BF, g.Cin, b.dy_nhwc[set], CUDA_R_16BF, g.Cout, &zero, b.dx,
                            CUDA_R_16BF, g.Cin, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    /* dW^T[Cin x Cout] = x^T[Cin x M] . dy[M x Cout], f32 out */
    return cublasGemmEx(G.blas, CUBLAS_OP_N, CUBLAS_OP_T, g.Cin, g.Cout, M, &one, b.x_nhwc[set],
                        CUDA_R_16BF, g.Cin, b.dy_nhwc[set], CUDA_R_16BF, g.Cout, &zero, b.dwf, CUDA_R_32F,
                        g.Cin, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

// ---- lucid route: the engine's kernels (cuda/nn_conv_igemm.cu, cuda/nn_conv_dw.cu), NCHW

/* What cuda/nn_conv.cu's conv_route takes for a bf16 conv in mode 0 (auto):
 * the implicit GEMM for groups 1 when lucid_conv_igemm_fits, the depthwise
 * kernels for groups == Cin == Cout; anything else goes to cuDNN there and
 * is '-' here. */
struct LucidPlan {
    bool dense = false;
    bool gemm = false; /* 1x1 through cuda/nn_conv_gemm.cu (as the engine: LUCID_CONV1X1=auto|gemm|igemm) */
    lucid_conv_gemm_geom gg;
    lucid_igemm_geom ig;
    lucid_conv_dw_geom dg;
    size_t scratch = 0; /* backward-filter scratch, bytes (in Bufs::part) */
};

static bool lucid_applicable(const Geo &g) { return g.dense() || g.depthwise(); }

static bool lucid_plan(LucidPlan &lp, Bufs &b, char *why, size_t nwhy) {
    const Geo &g = b.g;
    lp.dense = g.dense();
    lp.gemm = false;
    if (lp.dense && g.k == 1 && g.s == 1 && g.p == 0) {
        const char *v = "";
        int sw = lucid_conv1x1_switch(&v);
        if (sw < 0) {
            snprintf(why, nwhy, "LUCID_CONV1X1=\"%s\" (expected auto, gemm or igemm)", v);
            return false;
        }
        lp.gg = lucid_conv_gemm_geom{g.N, g.Cin, g.Cout, (int64_t)g.H * g.W};
        lp.gemm = (sw == 1 || (sw == 2 && lucid_conv_gemm_preferred(&lp.gg))) &&
                  lucid_conv_gemm_fits(&lp.gg);
    }
    if (lp.gemm) {
        lp.scratch = 0; /* the largest of the three passes' (no bias) */
        for (int ps = 0; ps < 3; ps++) {
            size_t n = lucid_conv_gemm_scratch(&lp.gg, LUCID_BF16, ps, 0);
            if (n > lp.scratch) lp.scratch = n;
        }
    } else if (lp.dense) {
        lp.ig = lucid_igemm_geom{g.N, g.Cin, g.H, g.W, g.Cout, g.Ho, g.Wo, g.k, g.k, g.s, g.s, g.p, g.p, 1, 1};
        if (!lucid_conv_igemm_fits(&lp.ig)) {
            snprintf(why, nwhy, "lucid_conv_igemm_fits: no (the engine takes cuDNN here)");
            return false;
        }
        lp.scratch = 0; /* the largest of the three passes' split-K partials */
        for (int ps = 0; ps < 3; ps++) {
            size_t n = lucid_conv_igemm_scratch(&lp.ig, ps);
            if (n > lp.scratch) lp.scratch = n;
        }
        /* the stride-phase backward-data's transposed weight, made once as
         * the engine's group cast makes it (LAB_DGRAD_WT=0: none) */
        const int64_t nwt = lucid_conv_igemm_dgrad_wt_elems(&lp.ig);
        const char *ev = getenv("LAB_DGRAD_WT");
        if (b.wt) CK(cudaFree(b.wt));
        b.wt = NULL;
        if (nwt > 0 && !(ev && strcmp(ev, "0") == 0)) {
            std::vector<float> t((size_t)nwt);
            for (int64_t i = 0; i < nwt; i++)
                t[(size_t)i] = b.hw[(size_t)lucid_conv_igemm_wt_src(i, g.Cin, g.Cout, g.k * g.k)];
            std::vector<bf16> tb;
            to_bf16(t, tb);
            b.wt = dupload(tb);
        }
    } else {
        lp.dg = lucid_conv_dw_geom{g.N, g.Cin, g.H, g.W, g.Ho, g.Wo, g.k, g.k, g.s, g.s, g.p, g.p, 1, 1};
        lp.scratch = lucid_conv_dw_wgrad_scratch_bytes(&lp.dg);
    }
    size_t need = (lp.scratch + sizeof(float) - 1) / sizeof(float);
    if (need > b.part_n) {
        if (b.part) CK(cudaFree(b.part));
        b.part = dalloc<float>(need); /* cudaMalloc: 256-byte aligned */
        b.part_n = need;
    }
    return true;
}

/* one call as cuda/nn_conv.cu makes it (bias NULL, beta 0); false with why */
static bool lucid_run(const LucidPlan &lp, const Bufs &b, int pass, int set, char *why, size_t nwhy) {
    void *scratch = lp.scratch ? (void *)b.part : NULL;
    if (lp.gemm) {
        lucid_status st;
        if (pass == 0)
            st = lucid_conv_gemm_forward(NULL, G.blas_eng, G.stream, LUCID_BF16, &lp.gg, b.x_nchw[set],
                                         b.w_f32, NULL, b.y, scratch);
        else if (pass == 1)
            st = lucid_conv_gemm_backward_data(NULL, G.blas_eng, G.stream, LUCID_BF16, &lp.gg,
                                               b.dy_nchw[set], b.w_f32, b.dx, 0.f, scratch);
        else
            st = lucid_conv_gemm_backward_filter(NULL, G.blas_eng, G.stream, LUCID_BF16, &lp.gg,
                                                 b.x_nchw[set], b.dy_nchw[set], b.dwf, 0.f, scratch);
        if (st == LUCID_OK) return true;
        snprintf(why, nwhy, "gemm %s: %s", PNAME[pass], lucid_msg);
        return false;
    }
    if (lp.dense) {
        cudaError_t e;
        if (pass == 0)
            e = lucid_conv_igemm_forward(LUCID_BF16, b.x_nchw[set], b.w_f32, NULL, b.y, scratch, &lp.ig,
                                         G.stream);
        else if (pass == 1)
            e = lucid_conv_igemm_backward_data_wt(LUCID_BF16, b.dy_nchw[set], b.w_f32, b.wt, b.dx, 0.f,
                                                  scratch, &lp.ig, G.stream);
        else
            e = lucid_conv_igemm_backward_filter(LUCID_BF16, b.x_nchw[set], b.dy_nchw[set], b.dwf, 0.f,
                                                 scratch, &lp.ig, G.stream);
        if (e == cudaSuccess) return true;
        snprintf(why, nwhy, "igemm %s: %s", PNAME[pass], cudaGetErrorString(e));
        return false;
    }
    lucid_status st;
    if (pass == 0)
        st = lucid_conv_dw_forward(NULL, (void *)G.stream, LUCID_BF16, &lp.dg, b.x_nchw[set], b.w_f32, NULL,
                                   b.y);
    else if (pass == 1)
        st = lucid_conv_dw_backward_data(NULL, (void *)G.stream, LUCID_BF16, &lp.dg, b.dy_nchw[set], b.w_f32,
                                         b.dx, 0.0);
    else
        st = lucid_conv_dw_backward_filter(NULL, (void *)G.stream, LUCID_BF16, &lp.dg, b.x_nchw[set],
                                           b.dy_nchw[set], b.dwf, 0.0, scratch, lp.scratch);
    if (st == LUCID_OK) return true;
    snprintf(why, nwhy, "dw %s: %s", PNAME[pass], lucid_msg);
    return false;
}

// ---------------------------------------------------------------------------
// fetch an output as NCHW / KCRS f32

static void fetch_bf16(const bf16 *d, size_t n, std::vector<float> &h) {
    std::vector<bf16> t(n);
    CK(cudaMemcpy(t.data(), d, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    h.resize(n);
    for (size_t i = 0; i < n; i++) h[i] = __bfloat162float(t[i]);
}
static void fetch_f32(const float *d, size_t n, std::vector<float> &h) {
    h.resize(n);
    CK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
}
/* [A][B][C] (channels last, C = channels) -> [A][C][B] */
static void from_last(std::vector<float> &v, int A, int Bsp, int C) {
    std::vector<float> o(v.size());
    for (int a = 0; a < A; a++)
        for (int i = 0; i < Bsp; i++)
            for (int c = 0; c < C; c++) o[((size_t)a * C + c) * Bsp + i] = v[((size_t)a * Bsp + i) * C + c];
    v.swap(o);
}

static void fetch_out(int v, const Bufs &b, int pass, std::vector<float> &h) {
    const Geo &g = b.g;
    bool nhwc = uses_nhwc(v);
    if (pass == 0) {
        fetch_bf16(b.y, g.ny(), h);
        if (nhwc) from_last(h, g.N, g.Ho * g.Wo, g.Cout);
    } else if (pass == 1) {
        fetch_bf16(b.dx, g.nx(), h);
        if (nhwc) from_last(h, g.N, g.H * g.W, g.Cin);
    } else {
        if (v == V_OWN || v == V_CUBLAS || v == V_LUCID) fetch_f32(b.dwf, g.nw(), h);
        else fetch_bf16(b.dwb, g.nw(), h);
        if (nhwc) from_last(h, g.Cout, g.k * g.k, g.Cg);
    }
}

static void poison_out(const Bufs &b, int pass) {
    const Geo &g = b.g;
    if (pass == 0) poison(b.y, g.ny() * sizeof(bf16));
    else if (pass == 1) poison(b.dx, g.nx() * sizeof(bf16));
    else {
        poison(b.dwb, g.nw() * sizeof(bf16));
        poison(b.dwf, g.nw() * sizeof(float));
    }
}

// ---------------------------------------------------------------------------
// timing

static cudaEvent_t EV[1024];

template <class F>
static double time_median(F f) {
    for (int i = 0; i < 5; i++) f(i);
    CK(cudaEventRecord(EV[0], G.stream));
    for (int i = 0; i < G.iters; i++) {
        f(i);
        CK(cudaEventRecord(EV[i + 1], G.stream));
    }
    CK(cudaStreamSynchronize(G.stream));
    CKL("timed calls");
    std::vector<float> t((size_t)G.iters);
    for (int i = 0; i < G.iters; i++) CK(cudaEventElapsedTime(&t[(size_t)i], EV[i], EV[i + 1]));
    std::sort(t.begin(), t.end());
    return t[(size_t)G.iters / 2];
}

// ---------------------------------------------------------------------------
// one shape

struct ShapeRes {
    Res r[NV][3];
    double xpose_in = 0, xpose_out = 0; /* ms: x NCHW->NHWC, y NHWC->NCHW */
    double ref_err[3] = {-1, -1, -1};   /* naive GPU reference vs CPU (small geometry) */
};

static bool route_applies(int v, const Geo &g) {
    switch (v) {
    case V_OWN: return own_applicable(g);
    case V_CUBLAS: return g.pointwise();
    case V_LUCID: return lucid_applicable(g);
    default: return true;
    }
}

/* run each route once on b (poisoned outputs), compare with ref[pass]; when
 * timing, time the routes that pass */
static void run_routes(const Shape &sh, Bufs &b, std::vector<float> ref[3], ShapeRes &R, bool full) {
    const Geo &g = b.g;
    std::vector<float> out;
    for (int v = 0; v < NV; v++) {
        if (!G.on[v] || !route_applies(v, g)) continue;
        DnnPlan dp;
        OwnPlan op;
        LucidPlan lp;
        bool dnn = v == V_NCHW || v == V_NHWC || v == V_FIND;
        if (dnn && !dnn_descs(dp, g, v != V_NCHW)) {
            for (int pass = 0; pass < 3; pass++) {
                R.r[v][pass].st = ST_FAIL;
                snprintf(R.r[v][pass].why, sizeof R.r[v][pass].why, "descriptors: %s", dp.why[0]);
            }
            dnn_free(dp);
            continue;
        }
        if (v == V_OWN) own_plan(op, b);
        char lwhy[sizeof R.r[v][0].why] = "";
        bool lucid_ok = v != V_LUCID || lucid_plan(lp, b, lwhy, sizeof lwhy);
        for (int pass = 0; pass < 3; pass++) {
            if (pass == 1 && sh.dgrad == 0) continue; /* layer 0: no input gradient */
            Res &r = R.r[v][pass];
            if (r.st == ST_FAIL) continue; /* failed on the small geometry */
            if (!lucid_ok) {
                r.st = ST_FAIL;
                snprintf(r.why, sizeof r.why, "%s", lwhy);
                continue;
            }
            if (dnn && !dnn_plan_pass(dp, b, pass, v == V_FIND)) {
                r.st = ST_FAIL;
                snprintf(r.why, sizeof r.why, "%s", dp.why[pass]);
                continue;
            }
            if (dnn) r.algo = dp.algo[pass];
            auto launch = [&](int i) -> bool {
                int set = i & 1;
                if (dnn) {
                    cudnnStatus_t s = dnn_run(dp, b, pass, set);
                    if (s != CUDNN_STATUS_SUCCESS) {
                        snprintf(r.why, sizeof r.why, "run: %s", cudnnGetErrorString(s));
                        return false;
                    }
                } else if (v == V_OWN) {
                    own_run(op, b, pass, set);
                } else if (v == V_LUCID) {
                    if (!lucid_run(lp, b, pass, set, r.why, sizeof r.why)) return false;
                } else {
                    cublasStatus_t s = blas_run(b, pass, set);
                    if (s != CUBLAS_STATUS_SUCCESS) {
                        snprintf(r.why, sizeof r.why, "cublas status %d", (int)s);
                        return false;
                    }
                }
                return true;
            };
            poison_out(b, pass);
            bool ok = launch(0);
            cudaError_t ce = cudaStreamSynchronize(G.stream);
            if (ce == cudaSuccess) ce = cudaGetLastError();
            if (ce != cudaSuccess) {
                fprintf(stderr, "conv_lab: %s %s %s: %s\n", sh.name.c_str(), VNAME[v], PNAME[pass],
                        cudaGetErrorString(ce));
                exit(2);
            }
            if (!ok) {
                r.st = ST_FAIL;
                continue;
            }
            fetch_out(v, b, pass, out);
            double e = rel_err(out, ref[pass]);
            if (full) r.err_full = e; else r.err_small = e;
            if (!(e <= TOL)) {
                r.st = ST_FAIL;
                snprintf(r.why, sizeof r.why, "%s check: rel err %.3g", full ? "full" : "small", e);
                continue;
            }
            r.st = ST_OK;
            if (full) {
                bool good = true;
                r.ms = time_median([&](int i) {
                    if (!launch(i)) good = false;
                });
                if (!good) r.st = ST_FAIL;
            }
        }
        if (dnn) dnn_free(dp);
    }
}

static void run_shape(int idx, const Shape &sh, ShapeRes &R) {
    /* small geometry: CPU reference */
    {
        Geo g = geo_small(sh);
        Bufs b;
        bufs_make(b, g, 1000 + idx);
        std::vector<float> ref[3], out;
        cpu_fwd(g, b.hx[0], b.hw, ref[0]);
        cpu_dgrad(g, b.hdy[0], b.hw, ref[1]);
        cpu_wgrad(g, b.hx[0], b.hdy[0], ref[2]);
        /* the naive GPU reference against the CPU */
        float *fx = dupload(b.hx[0]), *fdy = dupload(b.hdy[0]), *fw = dupload(b.hw);
        float *fy = dalloc<float>(g.ny()), *fdx = dalloc<float>(g.nx()), *fdw = dalloc<float>(g.nw());
        ref_fwd<<<grid1(g.ny(), 256), 256, 0, G.stream>>>(fx, fw, fy, gd(g));
        ref_dgrad<<<grid1(g.nx(), 256), 256, 0, G.stream>>>(fdy, fw, fdx, gd(g));
        ref_wgrad<<<(unsigned)g.nw(), 256, 0, G.stream>>>(fx, fdy, fdw, gd(g));
        CK(cudaStreamSynchronize(G.stream));
        CKL("reference kernels");
        fetch_f32(fy, g.ny(), out);
        R.ref_err[0] = rel_err(out, ref[0]);
        fetch_f32(fdx, g.nx(), out);
        R.ref_err[1] = rel_err(out, ref[1]);
        fetch_f32(fdw, g.nw(), out);
        R.ref_err[2] = rel_err(out, ref[2]);
        for (int i = 0; i < 3; i++)
            if (!(R.ref_err[i] <= 1e-4)) {
                fprintf(stderr, "conv_lab: naive GPU reference disagrees with the CPU on %s %s: %.3g\n",
                        sh.name.c_str(), PNAME[i], R.ref_err[i]);
                exit(2);
            }
        CK(cudaFree(fx)); CK(cudaFree(fdy)); CK(cudaFree(fw));
        CK(cudaFree(fy)); CK(cudaFree(fdx)); CK(cudaFree(fdw));
        run_routes(sh, b, ref, R, false);
        bufs_free(b);
    }
    /* full geometry: naive GPU reference, then check and time */
    {
        Geo g = geo_full(sh);
        Bufs b;
        bufs_make(b, g, 2000 + idx);
        std::vector<float> ref[3];
        float *fx = dupload(b.hx[0]), *fdy = dupload(b.hdy[0]), *fw = dupload(b.hw);
        float *fy = dalloc<float>(g.ny()), *fdx = dalloc<float>(g.nx()), *fdw = dalloc<float>(g.nw());
        ref_fwd<<<grid1(g.ny(), 256), 256, 0, G.stream>>>(fx, fw, fy, gd(g));
        ref_dgrad<<<grid1(g.nx(), 256), 256, 0, G.stream>>>(fdy, fw, fdx, gd(g));
        ref_wgrad<<<(unsigned)g.nw(), 256, 0, G.stream>>>(fx, fdy, fdw, gd(g));
        CK(cudaStreamSynchronize(G.stream));
        CKL("reference kernels");
        fetch_f32(fy, g.ny(), ref[0]);
        fetch_f32(fdx, g.nx(), ref[1]);
        fetch_f32(fdw, g.nw(), ref[2]);
        CK(cudaFree(fx)); CK(cudaFree(fdy)); CK(cudaFree(fw));
        CK(cudaFree(fy)); CK(cudaFree(fdx)); CK(cudaFree(fdw));
        run_routes(sh, b, ref, R, true);
        /* layout cost if the rest of the network stayed NCHW: x in, y out
         * (only when an NHWC route is selected) */
        if (G.nhwc) {
            std::vector<float> chk;
            transpose(G.stream, b.x_nchw[0], b.tx, g.N, g.Cin, g.H * g.W);
            CK(cudaStreamSynchronize(G.stream));
            CKL("transpose");
            fetch_bf16(b.tx, g.nx(), chk);
            from_last(chk, g.N, g.H * g.W, g.Cin);
            if (rel_err(chk, b.hx[0]) != 0.0) {
                fprintf(stderr, "conv_lab: transpose check failed on %s\n", sh.name.c_str());
                exit(2);
            }
            R.xpose_in = time_median([&](int i) {
                transpose(G.stream, b.x_nchw[i & 1], b.tx, g.N, g.Cin, g.H * g.W);
            });
            R.xpose_out = time_median([&](int i) {
                transpose(G.stream, b.dy_nhwc[i & 1], b.ty, g.N, g.Ho * g.Wo, g.Cout);
            });
        }
        bufs_free(b);
    }
}

// ---------------------------------------------------------------------------
// report

static void cell(char *buf, size_t n, const Res &r) {
    if (r.st == ST_NA) snprintf(buf, n, "%7s", "-");
    else if (r.st == ST_FAIL) snprintf(buf, n, "%7s", "FAIL");
    else snprintf(buf, n, "%7.3f", r.ms);
}

static std::string shape_label(const Shape &s) {
    char b[96];
    snprintf(b, sizeof b, "%dx%d%s %3d>%-3d %3d^2 s%d", s.k, s.k, s.g > 1 ? "dw" : "  ", s.Cin, s.Cout, s.H,
             s.s);
    return b;
}

/* routes=a,b,...: names of VNAME or VCOL (any case) or "all" */
static void parse_routes(const char *list) {
    for (int v = 0; v < NV; v++) G.on[v] = false;
    std::string l(list);
    size_t pos = 0;
    int n = 0;
    while (pos <= l.size()) {
        size_t e = l.find(',', pos);
        if (e == std::string::npos) e = l.size();
        std::string t = l.substr(pos, e - pos);
        pos = e + 1;
        if (t.empty()) continue;
        bool found = false;
        for (int v = 0; v < NV; v++)
            if (!strcasecmp(t.c_str(), VNAME[v]) || !strcasecmp(t.c_str(), VCOL[v]) ||
                !strcasecmp(t.c_str(), "all")) {
                G.on[v] = true;
                found = true;
            }
        if (!found) {
            fprintf(stderr, "conv_lab: unknown route '%s' in routes= (known:", t.c_str());
            for (int v = 0; v < NV; v++) fprintf(stderr, " %s", VNAME[v]);
            fprintf(stderr, ", or all)\n");
            exit(2);
        }
        n++;
    }
    if (!n) {
        fprintf(stderr, "conv_lab: routes= names no route\n");
        exit(2);
    }
}

int main(int argc, char **argv) {
    const char *path = "bench/conv_lab/shapes.txt";
    std::string csv;
    G.iters = 50;
    for (int v = 0; v < NV; v++) G.on[v] = true;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "iters=", 6)) G.iters = atoi(argv[i] + 6);
        else if (!strncmp(argv[i], "csv=", 4)) csv = argv[i] + 4;
        else if (!strncmp(argv[i], "routes=", 7)) parse_routes(argv[i] + 7);
        else if (strchr(argv[i], '=')) {
            fprintf(stderr, "conv_lab: unknown option %s (usage: conv_lab [shapes.txt] [iters=50] [csv=PATH] "
                            "[routes=lucid,dnnNCHW,...])\n", argv[i]);
            return 2;
        } else path = argv[i];
    }
    G.iters = std::max(3, std::min(G.iters, 1000));
    std::vector<int> sel; /* selected routes, in column order */
    G.nhwc = false;
    for (int v = 0; v < NV; v++)
        if (G.on[v]) {
            sel.push_back(v);
            G.nhwc = G.nhwc || uses_nhwc(v);
        }
    const int ns = (int)sel.size();
    if (csv.empty()) {
        const char *o = getenv("OUT");
        csv = std::string(o && *o ? o : "build/conv_lab") + "/conv_lab.csv";
    }
    std::vector<Shape> shapes = read_shapes(path);

    int ndev = 0;
    cudaError_t de = cudaGetDeviceCount(&ndev);
    if (de != cudaSuccess || ndev < 1) {
        fprintf(stderr,
                "conv_lab: no usable CUDA GPU here (cudaGetDeviceCount: %s). conv_lab checks and times "
                "kernels on a GPU: run it on the GPU machine (bench/conv_lab/README.md).\n",
                de != cudaSuccess ? cudaGetErrorString(de) : "0 devices");
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    G.sms = prop.multiProcessorCount;
    CK(cudaStreamCreateWithFlags(&G.stream, cudaStreamNonBlocking));
    if (cudnnCreate(&G.dnn) != CUDNN_STATUS_SUCCESS) { fprintf(stderr, "cudnnCreate failed\n"); return 2; }
    cudnnSetStream(G.dnn, G.stream);
    if (cublasCreate(&G.blas) != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasCreate failed\n"); return 2; }
    cublasSetStream(G.blas, G.stream);
    {   /* the engine's handle setup (cuda/backend.cu): math mode, no atomics, 32 MiB workspace */
        void *bws = NULL;
        CK(cudaMalloc(&bws, (size_t)32 << 20));
        if (cublasCreate(&G.blas_eng) != CUBLAS_STATUS_SUCCESS ||
            cublasSetStream(G.blas_eng, G.stream) != CUBLAS_STATUS_SUCCESS ||
            cublasSetMathMode(G.blas_eng, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                                         CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)) !=
                CUBLAS_STATUS_SUCCESS ||
            cublasSetAtomicsMode(G.blas_eng, CUBLAS_ATOMICS_NOT_ALLOWED) != CUBLAS_STATUS_SUCCESS ||
            cublasSetWorkspace(G.blas_eng, bws, (size_t)32 << 20) != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "cuBLAS setup (engine handle) failed\n");
            return 2;
        }
    }
    CK(cudaMalloc(&G.ws, WS_CAP));
    for (int i = 0; i <= G.iters; i++) CK(cudaEventCreate(&EV[i]));
    printf("conv_lab: %s, %d SMs, cuDNN %zu, cuBLAS %d, %zu shapes from %s, median of %d; routes:", prop.name,
           G.sms, cudnnGetVersion(), CUBLAS_VERSION, shapes.size(), path, G.iters);
    for (int v : sel) printf(" %s", VNAME[v]);
    printf("\n");

    double t_empty = time_median([&](int) { empty_kernel<<<1, 32, 0, G.stream>>>(); });

    std::vector<ShapeRes> R(shapes.size());
    printf("\nper call, ms (median); '-' not applicable, FAIL see the failures list\n");
    {
        std::string h1, h2;
        char b[64];
        for (int pass = 0; pass < 3; pass++) {
            snprintf(b, sizeof b, "| %-*s ", 7 * ns, PNAME[pass]);
            h1 += b;
            h2 += "| ";
            for (int v : sel) {
                snprintf(b, sizeof b, "%7s", VCOL[v]);
                h2 += b;
            }
            h2 += " ";
        }
        printf("%-3s %-24s %4s %s| %s\n", "#", "shape (k Cin>Cout H s)", "cnt", h1.c_str(),
               G.nhwc ? "xpose" : "");
        printf("%-3s %-24s %4s %s| %s\n", "", "", "", h2.c_str(), G.nhwc ? "in+out" : "");
    }
    for (size_t i = 0; i < shapes.size(); i++) {
        run_shape((int)i, shapes[i], R[i]);
        std::string line;
        char b[64];
        for (int pass = 0; pass < 3; pass++) {
            line += "| ";
            for (int v : sel) {
                cell(b, sizeof b, R[i].r[v][pass]);
                line += b;
            }
            line += " ";
        }
        if (G.nhwc) snprintf(b, sizeof b, "%6.3f", R[i].xpose_in + R[i].xpose_out);
        else snprintf(b, sizeof b, "%6s", "-");
        printf("%-3zu %-24s %4d %s| %s\n", i, shape_label(shapes[i]).c_str(), shapes[i].count, line.c_str(), b);
        fflush(stdout);
    }

    /* CSV */
    FILE *f = fopen(csv.c_str(), "w");
    if (f) {
        fprintf(f, "idx,name,N,Cin,H,W,Cout,k,s,p,g,count,dgrad_count,gflop,route,pass,status,ms,algo,err_small,"
                   "err_full,why\n");
        for (size_t i = 0; i < shapes.size(); i++) {
            const Shape &s = shapes[i];
            for (int v : sel)
                for (int pass = 0; pass < 3; pass++) {
                    const Res &r = R[i].r[v][pass];
                    fprintf(f, "%zu,%s,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%.4f,%s,%s,%s,%.5f,%d,%.3g,%.3g,\"%s\"\n", i,
                            s.name.c_str(), s.N, s.Cin, s.H, s.W, s.Cout, s.k, s.s, s.p, s.g, s.count, s.dgrad,
                            s.gflop, VNAME[v], PNAME[pass],
                            r.st == ST_OK ? "ok" : r.st == ST_FAIL ? "fail" : "na", r.ms, r.algo, r.err_small,
                            r.err_full, r.why);
                }
            if (G.nhwc)
                fprintf(f, "%zu,%s,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%.4f,xpose,in+out,ok,%.5f,-1,0,0,\"\"\n", i,
                        s.name.c_str(), s.N, s.Cin, s.H, s.W, s.Cout, s.k, s.s, s.p, s.g, s.count, s.dgrad,
                        s.gflop, R[i].xpose_in + R[i].xpose_out);
        }
        fclose(f);
        printf("\nfull results: %s\n", csv.c_str());
    } else {
        printf("\n(cannot write %s)\n", csv.c_str());
    }

    /* check errors (cuDNN algorithm numbers and every error are in the CSV) */
    printf("\nworst check error (rel. Frobenius; small geometry vs CPU / full geometry vs naive GPU):");
    for (int v : sel) {
        double ws = 0, wf = 0;
        for (size_t i = 0; i < shapes.size(); i++)
            for (int pass = 0; pass < 3; pass++)
                if (R[i].r[v][pass].st == ST_OK) {
                    ws = std::max(ws, R[i].r[v][pass].err_small);
                    wf = std::max(wf, R[i].r[v][pass].err_full);
                }
        printf(" %s %.1e/%.1e", VNAME[v], ws, wf);
    }
    printf("\n");
    int nfail = 0;
    for (size_t i = 0; i < shapes.size(); i++)
        for (int v : sel)
            for (int pass = 0; pass < 3; pass++)
                if (R[i].r[v][pass].st == ST_FAIL) {
                    if (!nfail++) printf("\nfailures (not timed):\n");
                    printf("  #%zu %-36s %-8s %-6s %s\n", i, shapes[i].name.c_str(), VNAME[v], PNAME[pass],
                           R[i].r[v][pass].why);
                }
    if (!nfail) printf("\nfailures: none (every applicable route passed both checks)\n");

    /* network totals, weighted by multiplicity */
    int calls[3] = {0, 0, 0};
    for (auto &s : shapes) {
        calls[0] += s.count;
        calls[1] += s.dgrad;
        calls[2] += s.count;
    }
    auto mult = [&](const Shape &s, int pass) { return pass == 1 ? s.dgrad : s.count; };
    enum { C_PW = 0, C_DW, C_KXK, C_ALL, NCLS };
    const char *CNAME[NCLS] = {"1x1", "dw3x3", "dense kxk", "all"};
    auto cls = [&](const Shape &s) { return s.g > 1 ? C_DW : s.k == 1 ? C_PW : C_KXK; };
    /* tot[route][pass][class], cover[route][pass] calls; rows NV (best of the
     * selected routes) and NV + 1 (the own|blas, else NHWC mix) */
    double tot[NV + 2][3][NCLS];
    int cover[NV + 2][3];
    memset(tot, 0, sizeof tot);
    memset(cover, 0, sizeof cover);
    for (size_t i = 0; i < shapes.size(); i++) {
        const Shape &s = shapes[i];
        for (int pass = 0; pass < 3; pass++) {
            int m = mult(s, pass);
            if (!m) continue;
            double best = 1e30;
            for (int v : sel) {
                const Res &r = R[i].r[v][pass];
                if (r.st != ST_OK) continue;
                best = std::min(best, r.ms);
                tot[v][pass][cls(s)] += m * r.ms;
                tot[v][pass][C_ALL] += m * r.ms;
                cover[v][pass] += m;
            }
            if (best < 1e30) {
                tot[NV][pass][cls(s)] += m * best;
                tot[NV][pass][C_ALL] += m * best;
                cover[NV][pass] += m;
            }
            /* mix: the faster of own / cublas where they apply, else dnnNHWC */
            double mix = 1e30;
            for (int v : {V_OWN, V_CUBLAS})
                if (R[i].r[v][pass].st == ST_OK) mix = std::min(mix, R[i].r[v][pass].ms);
            if (mix >= 1e30 && R[i].r[V_NHWC][pass].st == ST_OK) mix = R[i].r[V_NHWC][pass].ms;
            if (mix < 1e30) {
                tot[NV + 1][pass][cls(s)] += m * mix;
                tot[NV + 1][pass][C_ALL] += m * mix;
                cover[NV + 1][pass] += m;
            }
        }
    }
    double xp_f = 0, xp_b = 0;
    for (size_t i = 0; i < shapes.size(); i++) {
        xp_f += shapes[i].count * (R[i].xpose_in + R[i].xpose_out);
        xp_b += shapes[i].dgrad * (R[i].xpose_in + R[i].xpose_out);
    }
    const char *RNAME[NV + 2] = {"dnnNCHW (cuDNN)", "dnnNHWC",           "dnnFind (NHWC)", "own (igemm+dw)",
                                 "cublas (1x1 only)", "lucid (engine)", "best of all",    "own|blas, else NHWC"};
    /* rows: the selected routes, best of all, and the mix when one of its routes ran */
    std::vector<int> rows = sel;
    rows.push_back(NV);
    if (G.on[V_OWN] || G.on[V_CUBLAS] || G.on[V_NHWC]) rows.push_back(NV + 1);

    printf("\nnetwork conv time per step by class, ms (fwd+dgrad+wgrad, weighted by multiplicity; "
           "partial routes cover only their shapes)\n");
    printf("%-20s", "route");
    for (int c = 0; c < NCLS; c++) printf(" %10s", CNAME[c]);
    printf("\n");
    for (int v : rows) {
        printf("%-20s", RNAME[v]);
        for (int c = 0; c < NCLS; c++) printf(" %10.3f", tot[v][0][c] + tot[v][1][c] + tot[v][2][c]);
        printf("\n");
    }

    printf("\n== conv_lab summary: YOLO11n-pose convs at batch 4, 640, bf16; %d fwd + %d dgrad + %d wgrad calls "
           "per step; target <= ~8 ms of conv time per step\n",
           calls[0], calls[1], calls[2]);
    printf("%-20s %8s %8s %8s %8s  %s\n", "route", "fwd", "dgrad", "wgrad", "sum", "calls covered (of f/d/w)");
    for (int v : rows) {
        double sum = tot[v][0][C_ALL] + tot[v][1][C_ALL] + tot[v][2][C_ALL];
        printf("%-20s %8.3f %8.3f %8.3f %8.3f  %d/%d/%d\n", RNAME[v], tot[v][0][C_ALL], tot[v][1][C_ALL],
               tot[v][2][C_ALL], sum, cover[v][0], cover[v][1], cover[v][2]);
    }
    if (G.nhwc)
        printf("%-20s %8.3f %8.3f %8s %8.3f  (x to NHWC + y to NCHW per conv; dy in + dx out per dgrad)\n",
               "NCHW<->NHWC xpose", xp_f, xp_b, "-", xp_f + xp_b);
    printf("%-20s %8.4f ms per launch -> %.2f ms for %d launches (the eager floor of one kernel per call)\n",
           "empty kernel", t_empty, t_empty * (calls[0] + calls[1] + calls[2]), calls[0] + calls[1] + calls[2]);
    printf("failures: %d (listed above)\n", nfail);
    return 0;
}
