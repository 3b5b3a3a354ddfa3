/*
 * test_conv_gemm_split.cu — host checks of the GEMM routes' filter gradient
 * (cuda/nn_conv_gemm.cu, lucid_conv_gemm_backward_filter_rows; the 1x1
 * route calls it with Kout = Cin, the im2col route of nn_conv_col.cu with
 * Cin = K rounded up to 8 and Kout = K): the split of each image's
 * reduction into S chunks (lucid_conv_gemm_wgrad_splits), its switch
 * LUCID_WGRAD_SPLIT, the scratch sizes and the GEMM plan, run on the CPU.
 * Needs nvcc, not a GPU (runs in make test); nothing is launched on any
 * machine.
 *
 * nn_conv_gemm.cu is compiled into this program, so the rule, the switch
 * and the entry point are the engine's own.  cuBLAS is replaced by a host
 * GEMM with cublasGemmStridedBatchedEx's column-major contract (op(A) m x k,
 * op(B) k x n, C m x n, leading dimensions and batch strides; alpha, beta,
 * beta == 0 never reading C), accumulating in f64 and storing f32; each
 * call is recorded, and every element it reads or writes is checked to lie
 * in the buffers the test passed (A in x, B in dy, C in dw or in the
 * scratch bytes that lucid_conv_gemm_wgrad_scratch asked for).  The one
 * kernel the entry point launches after its GEMMs, the partial fold
 * gemm_wgrad_fold, never reaches CUDA: lucid_launch calls
 * lucid_pdl_for_stream before cudaLaunchKernelEx, and this program defines
 * that function to throw; the test catches it and runs the fold's
 * per-thread body (fold_emulated below, the kernel's index map line for
 * line: a __global__ function cannot run on the host) over every element.
 *
 * Checks:
 *   - the rule: lucid_conv_gemm_wgrad_splits = conv_wgrad_splits
 *     (spec/c/conv_wgrad_split.h, derived from the contract: the largest
 *     power of two S <= 64 with P a multiple of 8S, P/S >= L and N*S*Cout*Cin
 *     <= 2^26) over a sweep of N, channel counts and P, with L from this
 *     process's LUCID_WGRAD_SPLIT; 1 for g NULL;
 *   - scratch: lucid_conv_gemm_wgrad_scratch(g, Kout) = N*S*Cout*Cin*4
 *     bytes (256-byte aligned) when N*S > 1 or Kout < Cin, else 0;
 *     lucid_conv_gemm_scratch(g, dt, 2, bias) = wgrad_scratch(g, Cin) in
 *     bf16 and f16, with and without the bias flag;
 *   - refusals of backward_filter_rows before any GEMM or launch: Kout 0,
 *     -1 and Cin + 1 (ERR_ARG naming the columns), f32 (ERR_UNSUPPORTED),
 *     a size over INT_MAX (ERR_UNSUPPORTED);
 *   - the plan and the result, for N 1, 2, 3, S 1 .. 16 (both batchings:
 *     S >= N, one GEMM per image batched over its chunks; S < N, one GEMM
 *     per chunk batched over the images), Kout = Cin and Kout < Cin (the
 *     im2col route's padded rows: x's rows beyond Kout are random, not
 *     zero, so only the fold's compaction keeps them out), beta 0 (dw
 *     poisoned with NaN) and beta 1, bf16 and f16: N*S == 1 with Kout = Cin
 *     is one GEMM straight into dw with cuBLAS's beta and no launch;
 *     otherwise min(N, S) GEMMs of m Cin, n Cout, k P/S, batch max(N, S),
 *     lda = ldb = P, ldc = Cin, beta 0, whose C elements cover the N*S
 *     partials [Cout, Cin] exactly once (partial n*S + s: image n, columns
 *     [s*P/S, (s+1)*P/S)), then the fold (one launch); dw [Cout, Kout] =
 *     beta*dw + sum over images and columns of dY . X^T (f64 reference):
 *     relative Frobenius error <= 1e-6 (f32 partials, f32 fold);
 *     lucid_conv_gemm_backward_filter = the rows variant with Kout = Cin;
 *   - LUCID_WGRAD_SPLIT, read once per process, in child processes (fork
 *     before this process reads it; each child sets the variable, then
 *     calls): unset (S = the literal values of the contract with L 1600:
 *     the 16>32 3x3 160x160 filter gradient of DECISIONS 32 splits 16,
 *     P 4096 and 3200 split 2, P 3184 and 3192 not, layer 0 at 640 splits
 *     64, the 2^26 bound stops at 2 or 1), "" (the same), "0" (S 1, the
 *     single GEMM for N 1), "800" (S 8 for P 6400), and "abc", "-3", "+5",
 *     "12x", " 7", "2147483648" (S 1 from the rule; the filter gradient is
 *     ERR_ARG with a message naming LUCID_WGRAD_SPLIT and the value, before
 *     any GEMM or launch).
 */
#include "nn_conv_gemm.cu"

#include "conv_wgrad_split.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

/* ------------------------------------------------------------ engine stand-ins
 * Not linked into this host-only program: cuda/backend.cu, engine/core and
 * cuBLAS.  lucid_seterr keeps the message; the error hooks return
 * ERR_DEVICE. */
#include "host_standins.h" /* lucid_seterr (message in g_msg), lucid_dtype_name, error hooks */
extern "C" size_t lucid_dtype_size(lucid_dtype dt) {
    return dt == LUCID_BF16 || dt == LUCID_F16 ? 2 : dt == LUCID_F64 ? 8 : 4;
}

/* lucid_launch's first call: every launch stops here (thrown, caught by
 * the test), so nothing reaches cudaLaunchKernelEx. */
struct launch_stopped {};
static int g_launches = 0;
int lucid_pdl_for_stream(cudaStream_t) {
    g_launches++;
    throw launch_stopped();
}

/* ------------------------------------------------------------ host cuBLAS */

/* The buffers of one call under test: A must lie in x, B in dy, C in dw or
 * in the scratch's first scratch_bytes; writes into scratch counted per
 * float. */
static struct {
    const char *x, *dy, *dw, *scratch;
    size_t x_bytes, dy_bytes, dw_bytes, scratch_bytes;
    std::vector<int> scratch_writes;
    long long outside; /* elements read or written outside those */
} g_buf;

struct gemm_call {
    cublasOperation_t ta, tb;
    int m, n, k, lda, ldb, ldc, batch;
    long long sa, sb, sc;
    cudaDataType at, bt, ct;
    float alpha, beta;
    bool c_in_dw;
};
static std::vector<gemm_call> g_calls;

static bool inside(const char *p, size_t bytes, const char *lo, size_t n) {
    return lo && p >= lo && p + bytes <= lo + n;
}

static double load_elem(const void *base, long long i, cudaDataType t, const char *lo,
                        size_t n) {
    const size_t es = t == CUDA_R_32F ? 4 : 2;
    const char *p = (const char *)base + i * (long long)es;
    if (!inside(p, es, lo, n)) {
        g_buf.outside++;
        return NAN;
    }
    if (t == CUDA_R_16BF) {
        __nv_bfloat16 v;
        memcpy(&v, p, 2);
        return __bfloat162float(v);
    }
    if (t == CUDA_R_16F) {
        __half v;
        memcpy(&v, p, 2);
        return __half2float(v);
    }
    float v;
    memcpy(&v, p, 4);
    return v;
}

extern "C" cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
    const void *alpha, const void *A, cudaDataType at, int lda, long long int sa, const void *B,
    cudaDataType bt, int ldb, long long int sb, const void *beta, void *C, cudaDataType ct,
    int ldc, long long int sc, int batch, cublasComputeType_t, cublasGemmAlgo_t) {
    const float al = *(const float *)alpha, be = *(const float *)beta;
    const bool in_dw = (const char *)C >= g_buf.dw && (const char *)C < g_buf.dw + g_buf.dw_bytes;
    g_calls.push_back(gemm_call{ta, tb, m, n, k, lda, ldb, ldc, batch, sa, sb, sc, at, bt, ct, al,
                                be, in_dw});
    if (ct != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED; /* the filter gradient's f32 C */
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double acc = 0.0;
                for (int l = 0; l < k; l++) {
                    const long long ia = b * sa + (ta == CUBLAS_OP_N ? i + (long long)l * lda
                                                                     : l + (long long)i * lda);
                    const long long ib = b * sb + (tb == CUBLAS_OP_N ? l + (long long)j * ldb
                                                                     : j + (long long)l * ldb);
                    acc += load_elem(A, ia, at, g_buf.x, g_buf.x_bytes) *
                           load_elem(B, ib, bt, g_buf.dy, g_buf.dy_bytes);
                }
                float *c = (float *)C + b * sc + i + (long long)j * ldc;
                const char *cp = (const char *)c;
                if (in_dw ? !inside(cp, 4, g_buf.dw, g_buf.dw_bytes)
                          : !inside(cp, 4, g_buf.scratch, g_buf.scratch_bytes)) {
                    g_buf.outside++;
                    continue;
                }
                if (!in_dw) g_buf.scratch_writes[(size_t)(c - (const float *)g_buf.scratch)]++;
                *c = be != 0.0f ? (float)(al * acc + (double)be * *c) : (float)(al * acc);
            }
    return CUBLAS_STATUS_SUCCESS;
}

#include "cublas_sm_stub.h"

/* Linked, never reached: the pointer-array GEMM runs after the pointer
 * kernel's launch, which stops the call (lucid_pdl_for_stream throws). */
static int g_batched_calls = 0;
extern "C" cublasStatus_t cublasGemmBatchedEx(cublasHandle_t, cublasOperation_t,
                                              cublasOperation_t, int, int, int, const void *,
                                              const void *const[], cudaDataType, int,
                                              const void *const[], cudaDataType, int,
                                              const void *, void *const[], cudaDataType, int, int,
                                              cublasComputeType_t, cublasGemmAlgo_t) {
    g_batched_calls++;
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

/* gemm_wgrad_fold's per-thread body (nn_conv_gemm.cu) for every i of its
 * grid-stride loop: dw[o][k] = beta*dw[o][k] + ((part[0] + part[1]) + ...)
 * at [o][k] of each [Cout, Kp] partial, k < Kout. */
static void fold_emulated(const float *part, float *dw, int64_t Cout, int64_t Kout, int64_t Kp,
                          int64_t parts, float beta) {
    const int64_t n = Cout * Kout, np = Cout * Kp;
    for (int64_t i = 0; i < n; i++) {
        const int64_t o = i / Kout, src = i + o * (Kp - Kout);
        float s = part[src];
        for (int64_t k = 1; k < parts; k++) s += part[k * np + src];
        dw[i] = beta != 0.0f ? fmaf(beta, dw[i], s) : s;
    }
}

/* ------------------------------------------------------------ helpers */

#define TAP_HOST_SEED 0x2545f4914f6cdd1dull
#include "tap_host.h"

template <typename T> static T from_float(float v);
template <> __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __half from_float<__half>(float v) { return __float2half_rn(v); }
template <typename T> static float to_float(T v);
template <> float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> float to_float<__half>(__half v) { return __half2float(v); }

/* L of this process: what its LUCID_WGRAD_SPLIT should give */
static int64_t env_chunk(void) { return conv_wgrad_env_chunk(getenv("LUCID_WGRAD_SPLIT")); }

static lucid_conv_gemm_geom geom(int64_t N, int64_t Cin, int64_t Cout, int64_t P) {
    lucid_conv_gemm_geom g = {N, Cin, Cout, P};
    return g;
}

static char g_env[96];
static const char *env_str(void) {
    const char *e = getenv("LUCID_WGRAD_SPLIT");
    if (e) snprintf(g_env, sizeof g_env, "\"%s\"", e);
    else snprintf(g_env, sizeof g_env, "unset");
    return g_env;
}

/* ------------------------------------------------------------ the rule */

static void test_rule(void) {
    static const int64_t NS[] = {1, 2, 3, 4, 8, 64};
    static const int64_t CC[][2] = {{8, 8},     {144, 32},  {32, 16},    {464, 51},
                                    {576, 64},  {2048, 2048}, {4096, 4096}, {8192, 8192}};
    static const int64_t PS[] = {8,     16,    1600,  3184,   3192,   3200,    4096,
                                 6400,  12800, 25600, 102400, 409600, 1048576, 1 << 30};
    const int64_t L = env_chunk();
    int64_t n = 0, bad = 0, first_bad[4] = {0, 0, 0, 0}, got_bad = 0, want_bad = 0;
    for (int64_t N : NS)
        for (const auto &c : CC)
            for (int64_t P : PS) {
                lucid_conv_gemm_geom g = geom(N, c[0], c[1], P);
                const int64_t got = lucid_conv_gemm_wgrad_splits(&g);
                const int64_t want = conv_wgrad_splits(N, c[1], c[0], P, L);
                n++;
                if (got != want && bad++ == 0) {
                    first_bad[0] = N; first_bad[1] = c[0]; first_bad[2] = c[1]; first_bad[3] = P;
                    got_bad = got; want_bad = want;
                }
            }
    ok(bad == 0,
       NAME("wgrad splits = the contract's S over %lld geometries (LUCID_WGRAD_SPLIT %s)",
            (long long)n, env_str()),
       WHY("%lld differ; first N %lld Cin %lld Cout %lld P %lld: %lld, expected %lld",
           (long long)bad, (long long)first_bad[0], (long long)first_bad[1],
           (long long)first_bad[2], (long long)first_bad[3], (long long)got_bad,
           (long long)want_bad));
    ok(lucid_conv_gemm_wgrad_splits(NULL) == 1, "wgrad splits: NULL geometry is 1", "not 1");
}

/* S = these values with L = 1600 (LUCID_WGRAD_SPLIT unset or empty) */
static void test_rule_values(const char *pre) {
    static const struct {
        const char *tag;
        int64_t N, Cin, Cout, P, S;
    } v[] = {
        {"16>32 3x3 160x160 N1 (im2col Kr 144; DECISIONS 32)", 1, 144, 32, 25600, 16},
        {"16>32 3x3 64x64 N2 (P 4096)", 2, 144, 32, 4096, 2},
        {"1x1 N3 P 3200 (chunks of exactly 1600)", 3, 32, 32, 3200, 2},
        {"P 3184 (chunks of 1592 < 1600)", 1, 32, 32, 3184, 1},
        {"P 3192 (not a multiple of 16)", 1, 32, 32, 3192, 1},
        {"64>64 3x3 80x80 N4 (im2col K 576)", 4, 576, 64, 6400, 4},
        {"layer 0 3>16 s2 640 N4 (im2col Kr 32, P 102400)", 4, 32, 16, 102400, 64},
        {"1x1 64>64 N8 at 2^30 columns (S at most 64)", 8, 64, 64, (int64_t)1 << 30, 64},
        {"partials bound: N8 4096>1024 (2^26 at S 2)", 8, 4096, 1024, 409600, 2},
        {"partials bound: N1 8192x8192 (2^26 already)", 1, 8192, 8192, 409600, 1},
        {"P 16", 4, 8, 8, 16, 1},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        lucid_conv_gemm_geom g = geom(v[i].N, v[i].Cin, v[i].Cout, v[i].P);
        const int64_t got = lucid_conv_gemm_wgrad_splits(&g);
        ok(got == v[i].S, NAME("%s: wgrad splits %s = %lld", pre, v[i].tag, (long long)v[i].S),
           WHY("%lld", (long long)got));
    }
}

/* ------------------------------------------------------------ scratch */

/* Whether this process's LUCID_WGRAD_PTRS turns the pointer-array GEMM on */
static bool ptrs_on(void) {
    const char *e = getenv("LUCID_WGRAD_PTRS");
    return !(e && strcmp(e, "0") == 0);
}

static void test_scratch(void) {
    static const int64_t G[][4] = {{1, 16, 24, 64},    {3, 8, 16, 40},   {1, 32, 16, 4096},
                                   {3, 16, 8, 4096},   {2, 8, 8, 25600}, {1, 144, 32, 25600},
                                   {4, 576, 64, 6400}, {2, 464, 51, 400}, {1, 32, 16, 1024}};
    const int64_t L = env_chunk();
    for (size_t i = 0; i < sizeof G / sizeof G[0]; i++) {
        lucid_conv_gemm_geom g = geom(G[i][0], G[i][1], G[i][2], G[i][3]);
        const int64_t S = conv_wgrad_splits(g.N, g.Cout, g.Cin, g.HW, L);
        const size_t parts = nn_align((size_t)(g.N * S * g.Cout * g.Cin) * 4);
        const int64_t kouts[3] = {g.Cin, g.Cin - 5, 1};
        /* the pointer-array GEMM's 3*N*S operand pointers (LUCID_WGRAD_PTRS) */
        const size_t ptrs =
            ptrs_on() && g.N > 1 && S > 1 ? nn_align((size_t)(3 * g.N * S) * sizeof(void *)) : 0;
        for (int k = 0; k < 3; k++) {
            const size_t want = g.N * S > 1 || kouts[k] < g.Cin ? parts + ptrs : 0;
            const size_t got = lucid_conv_gemm_wgrad_scratch(&g, kouts[k]);
            ok(got == want && got % 256 == 0,
               NAME("wgrad scratch: N%lld %lld>%lld P %lld (S %lld) Kout %lld", (long long)g.N,
                    (long long)g.Cin, (long long)g.Cout, (long long)g.HW, (long long)S,
                    (long long)kouts[k]),
               WHY("%zu bytes, expected %zu", got, want));
        }
        bool same = true;
        for (int d = 0; d < 2; d++)
            for (int b = 0; b < 2; b++)
                same = same && lucid_conv_gemm_scratch(&g, d ? LUCID_F16 : LUCID_BF16, 2, b) ==
                                   lucid_conv_gemm_wgrad_scratch(&g, g.Cin);
        ok(same,
           NAME("gemm scratch pass 2 = wgrad scratch (Kout = Cin): N%lld %lld>%lld P %lld",
                (long long)g.N, (long long)g.Cin, (long long)g.Cout, (long long)g.HW),
           "differs");
    }
}

/* ------------------------------------------------------------ refusals */

/* Calls the entry point with the GEMM and launch counters and the message
 * reset; *gemms, *launches: what it queued. */
static lucid_status call_rows(lucid_dtype dt, const lucid_conv_gemm_geom *g, int64_t Kout,
                              const void *x, const void *dy, float *dw, float beta,
                              void *scratch, int *gemms, int *launches) {
    g_calls.clear();
    g_launches = 0;
    g_msg[0] = 0;
    lucid_status st;
    try {
        st = lucid_conv_gemm_backward_filter_rows(NULL, NULL, NULL, dt, g, Kout, x, dy, dw, beta,
                                                  scratch);
    } catch (const launch_stopped &) {
        st = LUCID_OK; /* the launch after the GEMMs: the fold */
    }
    *gemms = (int)g_calls.size();
    *launches = g_launches;
    return st;
}

static void test_refusals(void) {
    lucid_conv_gemm_geom g = geom(2, 16, 8, 64);
    int gemms = 0, launches = 0;
    static const int64_t bad_k[3] = {0, -1, 17};
    for (int i = 0; i < 3; i++) {
        lucid_status st = call_rows(LUCID_BF16, &g, bad_k[i], NULL, NULL, NULL, 0.0f, NULL,
                                    &gemms, &launches);
        ok(st == LUCID_ERR_ARG && strstr(g_msg, "filter columns") && gemms == 0 && launches == 0,
           NAME("wgrad rows: Kout %lld of Cin 16 is ERR_ARG before any GEMM",
                (long long)bad_k[i]),
           WHY("status %d, %d GEMMs, %d launches, message \"%s\"", (int)st, gemms, launches,
               g_msg));
    }
    lucid_status st =
        call_rows(LUCID_F32, &g, 16, NULL, NULL, NULL, 0.0f, NULL, &gemms, &launches);
    ok(st == LUCID_ERR_UNSUPPORTED && strstr(g_msg, "f32") && gemms == 0 && launches == 0,
       "wgrad rows: f32 is ERR_UNSUPPORTED naming the dtype",
       WHY("status %d, %d GEMMs, message \"%s\"", (int)st, gemms, g_msg));
    lucid_conv_gemm_geom big = geom(1, 16, 8, (int64_t)INT_MAX + 1);
    st = call_rows(LUCID_BF16, &big, 16, NULL, NULL, NULL, 0.0f, NULL, &gemms, &launches);
    ok(st == LUCID_ERR_UNSUPPORTED && gemms == 0 && launches == 0,
       "wgrad rows: P over INT_MAX is ERR_UNSUPPORTED", WHY("status %d", (int)st));
}

/* ------------------------------------------------------------ the plan on the host */

typedef struct plan_case {
    const char *tag;
    int64_t N, Cin, Cout, P, Kout;
} plan_case;

static const plan_case PLANS[] = {
    {"N1 16>24 P 64 (one GEMM)", 1, 16, 24, 64, 16},
    {"N3 8>16 P 40 (image fold)", 3, 8, 16, 40, 8},
    {"N1 32>16 P 4096", 1, 32, 16, 4096, 32},
    {"N3 16>8 P 4096 (S < N)", 3, 16, 8, 4096, 16},
    {"N2 8>8 P 25600 (S >= N)", 2, 8, 8, 25600, 8},
    {"N1 24>16 P 3200", 1, 24, 16, 3200, 24},
    {"N3 24>16 P 3200", 3, 24, 16, 3200, 24},
    {"N1 Kr 32 K 27 >16 P 1024 (padded rows)", 1, 32, 16, 1024, 27},
    {"N2 Kr 464 K 459 >51 P 400 (padded rows)", 2, 464, 51, 400, 459},
    {"N3 Kr 32 K 27 >16 P 4096 (padded rows, split)", 3, 32, 16, 4096, 27},
};

/* One plan: x, dy random in T (x's rows >= Kout too), dw beta 0 (NaN) or 1
 * (random); the entry point (the rows variant, or the plain one for Kout =
 * Cin when plain), the recorded GEMMs, the fold emulated, dw against f64. */
template <typename T>
static void run_plan(const plan_case &c, lucid_dtype dt, float beta, bool plain) {
    const char *tname = lucid_dtype_name(dt);
    char pre[300];
    snprintf(pre, sizeof pre, "wgrad plan %s %s beta %g%s (LUCID_WGRAD_SPLIT %s)", c.tag, tname,
             (double)beta, plain ? " (lucid_conv_gemm_backward_filter)" : "", env_str());
    const int64_t N = c.N, Ci = c.Cin, Co = c.Cout, P = c.P, Ko = c.Kout;
    const lucid_conv_gemm_geom g = geom(N, Ci, Co, P);
    const int64_t L = env_chunk();
    std::vector<T> x((size_t)(N * Ci * P)), dy((size_t)(N * Co * P));
    for (auto &v : x) v = from_float<T>((float)urand(-1, 1));
    for (auto &v : dy) v = from_float<T>((float)urand(-1, 1));
    std::vector<float> dw((size_t)(Co * Ko)), dw0;
    for (auto &v : dw) v = beta != 0.0f ? (float)urand(-1, 1) : NAN;
    dw0 = dw;
    const size_t sbytes = lucid_conv_gemm_wgrad_scratch(&g, Ko);
    std::vector<float> scratch(sbytes / 4 + 64, NAN); /* + a guard the GEMMs must not touch */
    g_buf.x = (const char *)x.data(); g_buf.x_bytes = x.size() * sizeof(T);
    g_buf.dy = (const char *)dy.data(); g_buf.dy_bytes = dy.size() * sizeof(T);
    g_buf.dw = (const char *)dw.data(); g_buf.dw_bytes = dw.size() * 4;
    g_buf.scratch = sbytes ? (const char *)scratch.data() : NULL;
    g_buf.scratch_bytes = sbytes;
    g_buf.scratch_writes.assign(sbytes / 4, 0);
    g_buf.outside = 0;
    int gemms = 0, launches = 0;
    lucid_status st;
    if (plain) {
        g_calls.clear();
        g_launches = 0;
        try {
            st = lucid_conv_gemm_backward_filter(NULL, NULL, NULL, dt, &g, x.data(), dy.data(),
                                                 dw.data(), beta,
                                                 sbytes ? scratch.data() : NULL);
        } catch (const launch_stopped &) {
            st = LUCID_OK;
        }
        gemms = (int)g_calls.size();
        launches = g_launches;
    } else {
        st = call_rows(dt, &g, Ko, x.data(), dy.data(), dw.data(), beta,
                       sbytes ? scratch.data() : NULL, &gemms, &launches);
    }
    if (L < 0) {
        ok(st == LUCID_ERR_ARG && gemms == 0 && launches == 0,
           NAME("%s: refused (unknown LUCID_WGRAD_SPLIT)", pre),
           WHY("status %d, %d GEMMs", (int)st, gemms));
        return;
    }
    const int64_t S = conv_wgrad_splits(N, Co, Ci, P, L), parts = N * S;
    const bool direct = parts == 1 && Ko == Ci;
    const int want_gemms = direct ? 1 : (int)(S < N ? S : N);
    const int want_batch = direct ? 1 : (int)(S < N ? N : S);
    ok(st == LUCID_OK && gemms == want_gemms && launches == (direct ? 0 : 1),
       NAME("%s: S %lld, %d GEMM%s%s", pre, (long long)S, want_gemms, want_gemms > 1 ? "s" : "",
            direct ? " straight into dw, no launch" : " + the fold"),
       WHY("status %d (%s), %d GEMMs, %d launches", (int)st, g_msg, gemms, launches));
    if (st != LUCID_OK) return;
    const cudaDataType adt = dt == LUCID_F16 ? CUDA_R_16F : CUDA_R_16BF;
    int64_t bad_shape = 0;
    for (const gemm_call &k : g_calls) {
        const bool good = k.ta == CUBLAS_OP_T && k.tb == CUBLAS_OP_N && k.m == Ci && k.n == Co &&
                          k.k == P / S && k.lda == P && k.ldb == P && k.ldc == Ci &&
                          k.batch == want_batch && k.at == adt && k.bt == adt &&
                          k.ct == CUDA_R_32F && k.alpha == 1.0f &&
                          k.beta == (direct ? beta : 0.0f) && k.c_in_dw == direct;
        bad_shape += !good;
    }
    ok(bad_shape == 0,
       NAME("%s: GEMMs m %lld n %lld k %lld batch %d, ld P / P / Cin, %s", pre, (long long)Ci,
            (long long)Co, (long long)(P / S), want_batch,
            direct ? "beta into dw" : "beta 0 into the partials"),
       WHY("%lld of %d calls differ", (long long)bad_shape, gemms));
    int64_t not_once = 0;
    for (int w : g_buf.scratch_writes) not_once += w != 1;
    const int64_t used = direct ? 0 : parts * Co * Ci;
    for (int64_t i = used; i < (int64_t)g_buf.scratch_writes.size(); i++)
        not_once -= g_buf.scratch_writes[(size_t)i] == 0; /* beyond the partials: untouched */
    bool guard = true;
    for (size_t i = sbytes / 4; i < scratch.size(); i++) guard = guard && std::isnan(scratch[i]);
    ok(g_buf.outside == 0 && not_once == 0 && guard &&
           (direct ? sbytes == 0 : sbytes >= (size_t)used * 4),
       NAME("%s: every access inside x, dy, dw and the scratch; the %lld partial floats "
            "written once each",
            pre, (long long)used),
       WHY("%lld accesses outside, %lld partial floats not written once, guard %s, scratch "
           "%zu bytes",
           (long long)g_buf.outside, (long long)not_once, guard ? "intact" : "written", sbytes));
    if (!direct) fold_emulated(scratch.data(), dw.data(), Co, Ko, Ci, parts, beta);
    /* f64 reference: beta*dw0 + sum_n sum_p dy[n][o][p] * x[n][k][p], k < Kout */
    double num = 0.0, den = 0.0;
    for (int64_t o = 0; o < Co; o++)
        for (int64_t k = 0; k < Ko; k++) {
            double s = beta != 0.0f ? (double)beta * dw0[(size_t)(o * Ko + k)] : 0.0;
            for (int64_t n = 0; n < N; n++) {
                const T *xr = &x[(size_t)((n * Ci + k) * P)];
                const T *dr = &dy[(size_t)((n * Co + o) * P)];
                for (int64_t p = 0; p < P; p++) s += (double)to_float(dr[p]) * to_float(xr[p]);
            }
            const double d = (double)dw[(size_t)(o * Ko + k)] - s;
            num += std::isfinite(d) ? d * d : INFINITY;
            den += s * s;
        }
    const double e = sqrt(num / (den > 0 ? den : 1e-300));
    ok(e <= 1e-6, NAME("%s: dw [%lld, %lld] = beta*dw + sum dY.X^T (rel %.1e)", pre,
                       (long long)Co, (long long)Ko, e),
       WHY("relative error %.3g > 1e-6", e));
}

static void test_plans(void) {
    for (size_t i = 0; i < sizeof PLANS / sizeof PLANS[0]; i++) {
        run_plan<__nv_bfloat16>(PLANS[i], LUCID_BF16, 0.0f, false);
        run_plan<__nv_bfloat16>(PLANS[i], LUCID_BF16, 1.0f, false);
    }
    run_plan<__half>(PLANS[3], LUCID_F16, 0.0f, false);
    run_plan<__half>(PLANS[8], LUCID_F16, 1.0f, false);
    run_plan<__nv_bfloat16>(PLANS[0], LUCID_BF16, 1.0f, true);
    run_plan<__nv_bfloat16>(PLANS[4], LUCID_BF16, 0.0f, true);
}

/* ------------------------------------------------------------ the switch, per process */

/* In a child: LUCID_WGRAD_SPLIT = value (NULL: unset), then the rule, a
 * plan, and for an unknown value the refusal naming it.  The child prints
 * its own lines; its exit status is its failure count (capped). */
static void child_env(const char *value) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (value) setenv("LUCID_WGRAD_SPLIT", value, 1);
        else unsetenv("LUCID_WGRAD_SPLIT");
        char pre[160];
        snprintf(pre, sizeof pre, "LUCID_WGRAD_SPLIT %s%s%s", value ? "\"" : "",
                 value ? value : "unset", value ? "\"" : "");
        const int64_t L = conv_wgrad_env_chunk(value);
        test_rule();
        if (L == 1600) test_rule_values(pre);
        /* 16>32 3x3 160x160 N1 through the im2col route's view: S 16 by
         * default, 1 with "0", 32 with "800" */
        lucid_conv_gemm_geom g = geom(1, 144, 32, 25600);
        const int64_t S = lucid_conv_gemm_wgrad_splits(&g);
        ok(S == conv_wgrad_splits(1, 32, 144, 25600, L),
           NAME("%s: 16>32 3x3 160x160 N1 splits %lld", pre,
                (long long)conv_wgrad_splits(1, 32, 144, 25600, L)),
           WHY("%lld", (long long)S));
        if (L == 800) {
            lucid_conv_gemm_geom g2 = geom(4, 576, 64, 6400);
            ok(lucid_conv_gemm_wgrad_splits(&g2) == 8, NAME("%s: P 6400 splits 8", pre),
               WHY("%lld", (long long)lucid_conv_gemm_wgrad_splits(&g2)));
        }
        if (L == 0)
            ok(lucid_conv_gemm_wgrad_scratch(&g, 144) == 0,
               NAME("%s: no partials for N 1 (no split)", pre), "partials asked for");
        if (L < 0) {
            int gemms = 0, launches = 0;
            lucid_status st = call_rows(LUCID_BF16, &g, 144, NULL, NULL, NULL, 0.0f, NULL,
                                        &gemms, &launches);
            char want[96];
            snprintf(want, sizeof want, "LUCID_WGRAD_SPLIT=\"%s\"", value);
            ok(st == LUCID_ERR_ARG && strstr(g_msg, want) && gemms == 0 && launches == 0,
               NAME("%s: the filter gradient is ERR_ARG naming the value, before any GEMM", pre),
               WHY("status %d, %d GEMMs, %d launches, message \"%s\"", (int)st, gemms,
                   launches, g_msg));
        } else {
            run_plan<__nv_bfloat16>(PLANS[2], LUCID_BF16, 1.0f, false); /* N1 P 4096 */
            run_plan<__nv_bfloat16>(PLANS[9], LUCID_BF16, 0.0f, false); /* N3 Kr 32 P 4096 */
        }
        fflush(stdout);
        _exit(failures > 100 ? 100 : failures);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status)) {
        printf("not ok LUCID_WGRAD_SPLIT %s child: ended by signal %d\n",
               value ? value : "unset", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        failures++;
    } else if (WEXITSTATUS(status) != 0) {
        failures++; /* its not ok lines are above */
    }
}

/* In a child with LUCID_WGRAD_PTRS unset (on): the scratch sizes hold the
 * 3*N*S pointers, and a split filter gradient with N > 1 and S > 1 queues
 * the pointer kernel before any GEMM (the launch stops the call here: no
 * strided-batched GEMM, no pointer-array GEMM reached); N 1 keeps the
 * strided-batched GEMM.  The GEMMs' arithmetic is cuBLAS's; the GPU tests
 * (test_conv_col_cuda, test_nn_cuda) check the route's results. */
static void child_ptrs(void) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        unsetenv("LUCID_WGRAD_PTRS");
        unsetenv("LUCID_WGRAD_SPLIT");
        test_scratch();
        lucid_conv_gemm_geom g = geom(4, 32, 16, 25600); /* N4, S 16 */
        int gemms = 0, launches = 0;
        g_batched_calls = 0;
        lucid_status st = call_rows(LUCID_BF16, &g, 27, NULL, NULL, NULL, 0.0f, NULL, &gemms,
                                    &launches);
        ok(st == LUCID_OK && gemms == 0 && launches == 1 && g_batched_calls == 0,
           "LUCID_WGRAD_PTRS on: N4 S16 queues the pointer kernel first",
           WHY("status %d, %d strided GEMMs, %d launches, %d batched", (int)st, gemms, launches,
               g_batched_calls));
        fflush(stdout);
        _exit(failures > 100 ? 100 : failures);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failures++;
}

int main() {
    child_ptrs();
    /* the plans below emulate the strided-batched GEMMs: every process from
     * here on takes them (LUCID_WGRAD_PTRS=0, read once per process) */
    setenv("LUCID_WGRAD_PTRS", "0", 1);
    /* the children first: nothing in this process has read LUCID_WGRAD_SPLIT yet */
    static const char *VALUES[] = {"", "0", "800", "abc", "-3", "+5", "12x", " 7", "2147483648"};
    child_env(NULL);
    for (size_t i = 0; i < sizeof VALUES / sizeof VALUES[0]; i++) child_env(VALUES[i]);
    /* this process: as its environment says */
    {
        const char *v = NULL;
        const int64_t L = wgrad_chunk(&v);
        const char *env = getenv("LUCID_WGRAD_SPLIT");
        ok(L == env_chunk() && v && strcmp(v, env ? env : "") == 0,
           NAME("LUCID_WGRAD_SPLIT %s read as %lld", env_str(), (long long)env_chunk()),
           WHY("%lld, value \"%s\"", (long long)L, v ? v : "(null)"));
    }
    test_rule();
    test_scratch();
    test_refusals();
    test_plans();
    return failures != 0;
}
