/*
 * test_loss_cuda.c — the pose loss on the GPU (cuda/loss.cu) against the CPU
 * reference (engine/train/loss.c and its phases) on the same inputs:
 *   - total and the five items (f32 outputs: 1e-5 relative; bf16 outputs:
 *     1e-4, both sides reading the same bf16 values),
 *   - the assignment (gt index per anchor identical), n_fg and tss,
 *   - the three gradients (relative Frobenius 1e-5 in f32; bf16 gradients
 *     1e-3, a float ulp may move a bf16 rounding),
 * on hand-made problems (a single box on a single anchor, a box with two
 * candidate anchors, an anchor claimed by two boxes, an image with no
 * instance, all keypoints invisible, a degenerate box), random problems at
 * 64x64 and 640x640 (B 4, 10 and 60 instances per image), and a real batch
 * of the mini dataset (loader, batch 4, 640, max_gt 64) with random network
 * outputs, and exact ties with crowded blocks (case_ties). Also: bitwise
 * determinism (two runs), no allocation inside forward/backward (the
 * device allocator's counters), and no host sync (forward + backward
 * captured into a CUDA graph on the context's stream,
 * replayed, same bits as the eager run). Frozen forward: same values.
 *
 * Kernel switches (cuda/loss.cu: LUCID_LOSS_TOPK, LUCID_LOSS_TERMS): every
 * case also runs the GPU side under all four settings (the spread top-k
 * k_topk2 or the block top-k k_topk; the spread terms k_items + k_loss2 /
 * k_backward2 or k_loss / k_backward), gradients filled with NaN before
 * each run, and checks bitwise equality with the old pair: total, items,
 * the three gradients, the reference layout of the work storage (pos,
 * tgt, tscore, alpha, pos_al, pos_ov, scal, ...), and a frozen forward +
 * backward (case "switch"). Cases for the new paths: 64 gts per image,
 * all-zero align metrics (ties broken by index, candidates at the image's
 * first anchors and a gt covering every anchor), gts with fewer candidate
 * anchors than topk (tiny, on corners, partly outside), topk 1, 13, 16
 * and 20 (above k_topk2's 16: k_topk serves it), 100 gts per image, and
 * the new kernels once more with a single block of foreground items
 * (LUCID_LOSS_ITEM_BLOCKS=1: many items per thread).
 *
 * Without a CUDA device: "skip ...: no CUDA device", exit 0.
 */
#define LUCID_POSE_LOSS_INTERNAL
#include "test.h"
#include "internal.h"
#include "train/loss.h"
#include "train/loss_backend.h"
#include "data/data.h"

#include <sys/stat.h>

static lucid_ctx *ctx;
static const lucid_device CPU = {LUCID_CPU, 0};
static const lucid_device GPU = {LUCID_CUDA, 0};

/* ------------------------------------------------------------ problem */

/* One side (CPU or GPU) of a problem: outputs, gradients, targets. */
typedef struct side {
    lucid_device dev;
    lucid_pose_loss_plan *plan;
    lucid_tensor *pb, *pc, *pk, *gb, *gc, *gk;
    lucid_tensor *tc, *tb, *tk, *tv, *total, *items;
    lucid_pose_targets tg;
} side;

typedef struct prob {
    int B, G, nc, K, A, img;
    int topk; /* 0: the config's default */
    lucid_dtype dt, gdt; /* outputs, gradients */
    /* host masters (f32 outputs before the cast to dt; targets) */
    lucid_tensor *pb, *pc, *pk, *tc, *tb, *tk, *tv;
    side cpu, gpu;
} prob;

static lucid_tensor *mk(lucid_device dev, lucid_dtype dt, int nd, int64_t a,
                        int64_t b, int64_t c, int64_t d) {
    int64_t sh[4] = {a, b, c, d};
    lucid_tensor *t = NULL;
    if (lucid_tensor_zeros(ctx, dev, dt, nd, sh, &t)) return NULL;
    return t;
}

static lucid_tensor *to(const lucid_tensor *t, lucid_device dev,
                        lucid_dtype dt) {
    lucid_tensor *o = NULL;
    if (lucid_tensor_to(ctx, t, dev, dt, &o)) return NULL;
    return o;
}

static void side_free(side *s) {
    lucid_tensor *ts[] = {s->pb, s->pc, s->pk, s->gb, s->gc, s->gk,
                          s->tc, s->tb, s->tk, s->tv, s->total, s->items};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        if (ts[i]) lucid_tensor_release(ts[i]);
    lucid_pose_loss_plan_destroy(s->plan);
    memset(s, 0, sizeof *s);
}

static void prob_free(prob *P) {
    side_free(&P->cpu);
    side_free(&P->gpu);
    lucid_tensor *ts[] = {P->pb, P->pc, P->pk, P->tc, P->tb, P->tk, P->tv};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        if (ts[i]) lucid_tensor_release(ts[i]);
    memset(P, 0, sizeof *P);
}

/* Host masters: zero outputs and empty targets for B images of img x img
 * pixels and G rows. */
static int prob_init(prob *P, int B, int G, int img, lucid_dtype dt,
                     lucid_dtype gdt) {
    memset(P, 0, sizeof *P);
    P->B = B, P->G = G, P->nc = 1, P->K = 17, P->img = img;
    P->dt = dt, P->gdt = gdt;
    int A = 0;
    for (int s = 8; s <= 32; s *= 2) A += (img / s) * (img / s);
    P->A = A;
    P->pb = mk(CPU, LUCID_F32, 3, B, 64, A, 0);
    P->pc = mk(CPU, LUCID_F32, 3, B, 1, A, 0);
    P->pk = mk(CPU, LUCID_F32, 3, B, 51, A, 0);
    P->tc = mk(CPU, LUCID_F32, 2, B, G, 0, 0);
    P->tb = mk(CPU, LUCID_F32, 3, B, G, 4, 0);
    P->tk = mk(CPU, LUCID_F32, 4, B, G, 17, 3);
    P->tv = mk(CPU, LUCID_U8, 2, B, G, 0, 0);
    return P->pb && P->pc && P->pk && P->tc && P->tb && P->tk && P->tv ? 0
                                                                       : -1;
}

/* Build one side from the masters (outputs cast to P->dt). */
static int side_init(prob *P, side *s, lucid_device dev) {
    memset(s, 0, sizeof *s);
    s->dev = dev;
    lucid_pose_loss_config cfg = lucid_pose_loss_config_default();
    cfg.batch = P->B, cfg.nc = P->nc, cfg.max_gt = P->G;
    if (P->topk) cfg.topk = P->topk;
    lucid_pose_loss_config_levels(&cfg, P->img, P->img);
    if (lucid_pose_loss_plan_create(ctx, dev, &cfg, &s->plan)) return -1;
    if (lucid_pose_loss_plan_anchors(s->plan) != P->A) return -1;
    s->pb = to(P->pb, dev, P->dt);
    s->pc = to(P->pc, dev, P->dt);
    s->pk = to(P->pk, dev, P->dt);
    s->gb = mk(dev, P->gdt, 3, P->B, 64, P->A, 0);
    s->gc = mk(dev, P->gdt, 3, P->B, 1, P->A, 0);
    s->gk = mk(dev, P->gdt, 3, P->B, 51, P->A, 0);
    s->tc = to(P->tc, dev, LUCID_F32);
    s->tb = to(P->tb, dev, LUCID_F32);
    s->tk = to(P->tk, dev, LUCID_F32);
    s->tv = to(P->tv, dev, LUCID_U8);
    s->total = mk(dev, LUCID_F32, 1, 1, 0, 0, 0);
    s->items = mk(dev, LUCID_F32, 1, 5, 0, 0, 0);
    s->tg = (lucid_pose_targets){s->tc, s->tb, s->tk, s->tv};
    return s->pb && s->pc && s->pk && s->gb && s->gc && s->gk && s->tc &&
                   s->tb && s->tk && s->tv && s->total && s->items
               ? 0
               : -1;
}

static int prob_sides(prob *P) {
    return side_init(P, &P->cpu, CPU) || side_init(P, &P->gpu, GPU) ? -1 : 0;
}

static lucid_status fwd(side *s) {
    return lucid_pose_loss_forward(ctx, s->plan, s->pb, s->pc, s->pk, &s->tg,
                                   s->total, s->items);
}
static lucid_status bwd(side *s) {
    return lucid_pose_loss_backward(ctx, s->plan, s->pb, s->pc, s->pk, NULL,
                                    s->gb, s->gc, s->gk);
}
static lucid_status fwd_bwd(void *arg) {
    side *s = arg;
    LUCID_TRY(fwd(s));
    return bwd(s);
}

static void set3(lucid_tensor *t, int b, int c, int a, double v) {
    lucid_cpu_set(t, (b * t->shape[1] + c) * t->shape[2] + a, v);
}

/* Box logits of one side at anchor a: bins [lo, hi] = 0, others -1e4. */
static void side_bins(prob *P, int b, int a, int sd, int lo, int hi) {
    for (int i = 0; i < 16; i++)
        set3(P->pb, b, sd * 16 + i, a, (i >= lo && i <= hi) ? 0.0 : -1e4);
}

/* A gt row: class, normalised xywh, all keypoints at (kx, ky, v). */
static void gt_row(prob *P, int b, int g, int valid, double x, double y,
                   double w, double h, double kx, double ky, double v) {
    int64_t r = (int64_t)b * P->G + g;
    lucid_cpu_set(P->tv, r, valid);
    lucid_cpu_set(P->tc, r, 0);
    double bx[4] = {x, y, w, h};
    for (int j = 0; j < 4; j++) lucid_cpu_set(P->tb, r * 4 + j, bx[j]);
    for (int k = 0; k < 17; k++) {
        lucid_cpu_set(P->tk, (r * 17 + k) * 3 + 0, kx);
        lucid_cpu_set(P->tk, (r * 17 + k) * 3 + 1, ky);
        lucid_cpu_set(P->tk, (r * 17 + k) * 3 + 2, v);
    }
}

/* xorshift for the targets (outputs use lucid_rand_uniform) */
static uint64_t rng_s = 88172645463325252ull;
static double urand(void) {
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return (double)(rng_s >> 11) * (1.0 / 9007199254740992.0);
}

/* Random outputs (seeded) and n instances per image (n < 0: random count
 * in [0, G]); some keypoints invisible. */
static void random_problem(prob *P, uint64_t seed, int n) {
    lucid_rand_uniform(ctx, P->pb, seed, 0, -3.0, 3.0);
    lucid_rand_uniform(ctx, P->pc, seed, 1u << 28, -5.0, 1.0);
    lucid_rand_uniform(ctx, P->pk, seed, 2u << 28, -1.0, 1.0);
    rng_s = seed * 2654435761ull + 1;
    for (int b = 0; b < P->B; b++) {
        int cnt = n < 0 ? (int)(urand() * (P->G + 1)) : n;
        if (cnt > P->G) cnt = P->G;
        for (int g = 0; g < P->G; g++) {
            int64_t r = (int64_t)b * P->G + g;
            if (g >= cnt) {
                gt_row(P, b, g, 0, 0, 0, 0, 0, 0, 0, 0);
                continue;
            }
            double w = 0.01 + 0.5 * urand(), h = 0.01 + 0.5 * urand();
            double x = w / 2 + (1 - w) * urand(), y = h / 2 + (1 - h) * urand();
            gt_row(P, b, g, 1, x, y, w, h, 0, 0, 0);
            for (int k = 0; k < 17; k++) {
                double v = urand() < 0.3 ? 0.0 : (urand() < 0.5 ? 1.0 : 2.0);
                double kx = v ? x + (urand() - 0.5) * w : 0;
                double ky = v ? y + (urand() - 0.5) * h : 0;
                lucid_cpu_set(P->tk, (r * 17 + k) * 3 + 0, kx);
                lucid_cpu_set(P->tk, (r * 17 + k) * 3 + 1, ky);
                lucid_cpu_set(P->tk, (r * 17 + k) * 3 + 2, v);
            }
        }
    }
}

/* ------------------------------------------------------------ comparison */

/* Host copy of any tensor as doubles (malloc'd). */
static double *host_f64(const lucid_tensor *t) {
    lucid_tensor *h = to(t, CPU, t->dtype);
    if (!h) return NULL;
    int64_t n = lucid_tensor_numel(h);
    double *v = malloc((size_t)(n ? n : 1) * sizeof(double));
    for (int64_t i = 0; v && i < n; i++) v[i] = lucid_cpu_get(h, i);
    lucid_tensor_release(h);
    return v;
}

/* Host bytes of a tensor (same dtype, contiguous; malloc'd). */
static void *host_bytes(const lucid_tensor *t, size_t *nb) {
    lucid_tensor *h = to(t, CPU, t->dtype);
    if (!h) return NULL;
    *nb = lucid_tensor_nbytes(h);
    void *v = malloc(*nb ? *nb : 1);
    if (v) memcpy(v, lucid_tensor_data(h), *nb);
    lucid_tensor_release(h);
    return v;
}

static double frob_rel(const lucid_tensor *got, const lucid_tensor *want,
                       double *maxabs) {
    double *a = host_f64(got), *b = host_f64(want);
    int64_t n = lucid_tensor_numel(want);
    double d2 = 0, w2 = 0, mx = 0;
    for (int64_t i = 0; a && b && i < n; i++) {
        double d = a[i] - b[i];
        if (!isfinite(a[i]) || !isfinite(b[i])) d = INFINITY;
        d2 += d * d;
        w2 += b[i] * b[i];
        if (fabs(d) > mx) mx = fabs(d);
    }
    free(a);
    free(b);
    if (maxabs) *maxabs = mx;
    return w2 > 0 ? sqrt(d2 / w2) : sqrt(d2);
}

/* LUCID_LOSS_CUDA_DUMP=file: append the GPU side's outputs, gradients,
 * assignment and scores of every case to file, for a bitwise A/B of two
 * builds of cuda/loss.cu (cmp the two files). */
static void dump_gpu(prob *P) {
    const char *path = getenv("LUCID_LOSS_CUDA_DUMP");
    if (!path || !*path) return;
    FILE *f = fopen(path, "ab");
    if (!f) return;
    const lucid_tensor *ts[5] = {P->gpu.total, P->gpu.items, P->gpu.gb,
                                 P->gpu.gc, P->gpu.gk};
    for (int j = 0; j < 5; j++) {
        size_t nb = 0;
        void *v = host_bytes(ts[j], &nb);
        if (v) fwrite(v, 1, nb, f);
        free(v);
    }
    const int64_t n = (int64_t)P->B * P->A;
    int32_t *a = malloc(n * sizeof(int32_t));
    double *sc = malloc(n * sizeof(double)), nf = 0, tss = 0;
    if (a && sc &&
        lucid_pose_loss_read_assignment(ctx, P->gpu.plan, a, sc, &nf, &tss) ==
            LUCID_OK) {
        fwrite(a, sizeof(int32_t), (size_t)n, f);
        fwrite(sc, sizeof(double), (size_t)n, f);
        fwrite(&nf, sizeof nf, 1, f);
        fwrite(&tss, sizeof tss, 1, f);
    }
    free(a), free(sc);
    fclose(f);
}

/* CPU vs GPU on one prepared problem: forward + backward on both sides,
 * then values, assignment and gradients. */
static void compare(const char *name, prob *P) {
    char nm[256];
    const int bf = P->dt != LUCID_F32;
    const double ltol = bf ? 1e-4 : 1e-5;
    const double gtol = P->gdt == LUCID_F32 ? 1e-5 : 1e-3;
    lucid_status s1 = fwd(&P->cpu), s2 = fwd(&P->gpu);
    if (s1 == LUCID_OK) s1 = bwd(&P->cpu);
    if (s2 == LUCID_OK) s2 = bwd(&P->gpu);
    snprintf(nm, sizeof nm, "%s: forward+backward on both", name);
    if (s1 != LUCID_OK || s2 != LUCID_OK) {
        TEST_FAIL(nm, "cpu %s gpu %s: %s", lucid_status_name(s1),
                  lucid_status_name(s2), lucid_ctx_error(ctx));
        return;
    }
    TEST_OK(nm);
    double *ic = host_f64(P->cpu.items), *ig = host_f64(P->gpu.items);
    double *tc = host_f64(P->cpu.total), *tg = host_f64(P->gpu.total);
    static const char *nms[5] = {"box", "pose", "kobj", "cls", "dfl"};
    for (int i = 0; i < 5; i++) {
        snprintf(nm, sizeof nm, "%s: %s item", name, nms[i]);
        double e = fabs(ig[i] - ic[i]);
        CHECK(nm, e <= ltol * fabs(ic[i]) + 1e-12 && isfinite(ig[i]),
              "gpu %.9g cpu %.9g (rel %.3g)", ig[i], ic[i],
              test_relerr(ig[i], ic[i]));
    }
    snprintf(nm, sizeof nm, "%s: total", name);
    CHECK(nm, fabs(tg[0] - tc[0]) <= ltol * fabs(tc[0]) + 1e-12 &&
                  isfinite(tg[0]),
          "gpu %.9g cpu %.9g (rel %.3g)", tg[0], tc[0],
          test_relerr(tg[0], tc[0]));
    free(ic), free(ig), free(tc), free(tg);

    const int64_t n = (int64_t)P->B * P->A;
    int32_t *ac = malloc(n * sizeof(int32_t)), *ag = malloc(n * sizeof(int32_t));
    double *sc = malloc(n * sizeof(double)), *sg = malloc(n * sizeof(double));
    double nfc, nfg, tsc, tsg;
    lucid_pose_loss_read_assignment(ctx, P->cpu.plan, ac, sc, &nfc, &tsc);
    s2 = lucid_pose_loss_read_assignment(ctx, P->gpu.plan, ag, sg, &nfg, &tsg);
    int64_t diff = 0, first = -1;
    double smax = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ac[i] != ag[i]) {
            if (first < 0) first = i;
            diff++;
        }
        double e = fabs(sc[i] - sg[i]);
        if (e > smax) smax = e;
    }
    snprintf(nm, sizeof nm, "%s: assignment identical (n_fg %g)", name, nfc);
    CHECK(nm, s2 == LUCID_OK && diff == 0 && nfc == nfg,
          "%lld anchors differ (first %lld: cpu %d gpu %d), n_fg cpu %g gpu %g",
          (long long)diff, (long long)first, first >= 0 ? ac[first] : 0,
          first >= 0 ? ag[first] : 0, nfc, nfg);
    snprintf(nm, sizeof nm, "%s: target scores and tss", name);
    CHECK(nm, smax <= 1e-5 && fabs(tsc - tsg) <= 1e-5 * tsc,
          "max score diff %.3g, tss cpu %.9g gpu %.9g", smax, tsc, tsg);
    free(ac), free(ag), free(sc), free(sg);

    dump_gpu(P);
    const lucid_tensor *gg[3] = {P->gpu.gb, P->gpu.gc, P->gpu.gk};
    const lucid_tensor *gc[3] = {P->cpu.gb, P->cpu.gc, P->cpu.gk};
    static const char *gn[3] = {"box", "cls", "kpt"};
    for (int j = 0; j < 3; j++) {
        double mx;
        double e = frob_rel(gg[j], gc[j], &mx);
        snprintf(nm, sizeof nm, "%s: grad %s", name, gn[j]);
        CHECK(nm, e <= gtol, "relative Frobenius %.3g (max abs diff %.3g)", e,
              mx);
    }
}

/* Determinism, no allocation, graph capture and frozen forward on the GPU
 * side of a problem that already ran once. */
static void gpu_props(const char *name, prob *P) {
    char nm[256];
    side *s = &P->gpu;
    lucid_tensor *outs[5] = {s->total, s->items, s->gb, s->gc, s->gk};
    void *ref[5];
    size_t nb[5];
    for (int j = 0; j < 5; j++) ref[j] = host_bytes(outs[j], &nb[j]);
    const int64_t n = (int64_t)P->B * P->A;
    int32_t *a0 = malloc(n * sizeof(int32_t)), *a1 = malloc(n * sizeof(int32_t));
    lucid_pose_loss_read_assignment(ctx, s->plan, a0, NULL, NULL, NULL);

    /* zero the outputs, run again: same bits */
    for (int j = 0; j < 5; j++) lucid_fill(ctx, outs[j], 0.0);
    lucid_memory_stats m0, m1;
    lucid_ctx_synchronize(ctx);
    lucid_memory_stats_get(ctx, GPU, &m0);
    lucid_status st = fwd_bwd(s);
    lucid_ctx_synchronize(ctx);
    lucid_memory_stats_get(ctx, GPU, &m1);
    snprintf(nm, sizeof nm, "%s: no device allocation in forward+backward",
             name);
    CHECK(nm, st == LUCID_OK && m1.num_allocs == m0.num_allocs,
          "%s; %llu allocations", lucid_status_name(st),
          (unsigned long long)(m1.num_allocs - m0.num_allocs));
    int same = 1;
    for (int j = 0; j < 5; j++) {
        size_t k;
        void *v = host_bytes(outs[j], &k);
        same &= v && k == nb[j] && memcmp(v, ref[j], k) == 0;
        free(v);
    }
    lucid_pose_loss_read_assignment(ctx, s->plan, a1, NULL, NULL, NULL);
    same &= memcmp(a0, a1, n * sizeof(int32_t)) == 0;
    snprintf(nm, sizeof nm, "%s: bitwise identical second run", name);
    CHECK(nm, same, "outputs or assignment differ between two runs");

    /* graph capture of forward + backward, replayed twice */
    const lucid_pose_loss_kernels *k = lucid_pose_loss_cuda_kernels();
    for (int j = 0; j < 5; j++) lucid_fill(ctx, outs[j], 0.0);
    lucid_ctx_synchronize(ctx);
    st = k ? k->capture(ctx, fwd_bwd, s, 2) : LUCID_ERR_UNSUPPORTED;
    snprintf(nm, sizeof nm, "%s: forward+backward captured in a CUDA graph",
             name);
    CHECK(nm, st == LUCID_OK, "%s: %s", lucid_status_name(st),
          lucid_ctx_error(ctx));
    if (st == LUCID_OK) {
        same = 1;
        for (int j = 0; j < 5; j++) {
            size_t kk;
            void *v = host_bytes(outs[j], &kk);
            same &= v && kk == nb[j] && memcmp(v, ref[j], kk) == 0;
            free(v);
        }
        snprintf(nm, sizeof nm, "%s: graph replay gives the same bits", name);
        CHECK(nm, same, "outputs differ after the graph replay");
    }
    lucid_ctx_clear_error(ctx);

    /* frozen forward: the same total */
    lucid_pose_loss_plan_set_frozen(s->plan, 1);
    lucid_fill(ctx, s->total, 0.0);
    st = fwd(s);
    size_t kk;
    void *v = host_bytes(s->total, &kk);
    snprintf(nm, sizeof nm, "%s: frozen forward same total", name);
    CHECK(nm, st == LUCID_OK && v && memcmp(v, ref[0], kk) == 0,
          "%s", lucid_status_name(st));
    free(v);
    lucid_pose_loss_plan_set_frozen(s->plan, 0);

    for (int j = 0; j < 5; j++) free(ref[j]);
    free(a0), free(a1);
}

/* ------------------------------------------------------------ switches */

/* The reference layout of the GPU plan's work storage (everything but the
 * CUDA backend's area: anc, sigmas, scal, gt_*, pbox, pos, tgt, tscore,
 * alpha, pos_al, pos_ov), as host bytes. */
static void *ws_bytes(const lucid_pose_loss_plan *p, size_t *nb) {
    const lucid_pose_loss_kernels *k = lucid_pose_loss_cuda_kernels();
    int64_t n = (int64_t)(lucid_storage_nbytes(p->ws) - k->extra_bytes(p));
    lucid_tensor *t = NULL;
    if (lucid_tensor_from_storage(ctx, p->ws, LUCID_U8, 1, &n, NULL, 0, &t))
        return NULL;
    void *v = host_bytes(t, nb);
    lucid_tensor_release(t);
    return v;
}

#define SNAP_N 11
typedef struct snap {
    void *b[SNAP_N];
    size_t n[SNAP_N];
    lucid_status st;
} snap;

static void snap_free(snap *S) {
    for (int j = 0; j < SNAP_N; j++) free(S->b[j]);
    memset(S, 0, sizeof *S);
}

/* One GPU run under the switches (topk, terms): gradients and outputs
 * NaN first; then forward + backward, the outputs, gradients and work
 * storage; then a frozen forward + backward's outputs and gradients. */
static void snap_run(prob *P, int topk, int terms, snap *S) {
    side *s = &P->gpu;
    lucid_tensor *outs[5] = {s->total, s->items, s->gb, s->gc, s->gk};
    memset(S, 0, sizeof *S);
    setenv("LUCID_LOSS_TOPK", topk ? "1" : "0", 1);
    setenv("LUCID_LOSS_TERMS", terms ? "1" : "0", 1);
    for (int j = 0; j < 5; j++) lucid_fill(ctx, outs[j], NAN);
    S->st = fwd_bwd(s);
    for (int j = 0; j < 5; j++) S->b[j] = host_bytes(outs[j], &S->n[j]);
    S->b[5] = ws_bytes(s->plan, &S->n[5]);
    lucid_pose_loss_plan_set_frozen(s->plan, 1);
    for (int j = 0; j < 5; j++) lucid_fill(ctx, outs[j], NAN);
    if (S->st == LUCID_OK) S->st = fwd_bwd(s);
    for (int j = 0; j < 5; j++) S->b[6 + j] = host_bytes(outs[j], &S->n[6 + j]);
    lucid_pose_loss_plan_set_frozen(s->plan, 0);
}

/* New kernels vs old (the two mixed settings, and the new ones with one
 * item block): the same bits; the caller's settings restored after. */
static void switch_ab(const char *name, prob *P) {
    static const char *what[SNAP_N] = {
        "total", "items", "grad box", "grad cls", "grad kpt", "work storage",
        "frozen total", "frozen items", "frozen grad box", "frozen grad cls",
        "frozen grad kpt"};
    char *env0[3] = {NULL, NULL, NULL};
    const char *envn[3] = {"LUCID_LOSS_TOPK", "LUCID_LOSS_TERMS",
                           "LUCID_LOSS_ITEM_BLOCKS"};
    for (int e = 0; e < 3; e++)
        if (getenv(envn[e])) env0[e] = strdup(getenv(envn[e]));
    unsetenv(envn[2]);
    snap ref, S;
    snap_run(P, 0, 0, &ref);
    char nm[256];
    for (int m = 1; m < 5; m++) {
        const int tk = m & 1 || m == 4, te = m >> 1 || m == 4;
        /* m 4: the new kernels with one block of foreground items (the
         * grid-stride loops, many items per thread) */
        if (m == 4) setenv("LUCID_LOSS_ITEM_BLOCKS", "1", 1);
        snap_run(P, tk, te, &S);
        unsetenv("LUCID_LOSS_ITEM_BLOCKS");
        int bad = -1;
        for (int j = 0; j < SNAP_N && bad < 0; j++)
            if (!S.b[j] || !ref.b[j] || S.n[j] != ref.n[j] ||
                memcmp(S.b[j], ref.b[j], S.n[j]))
                bad = j;
        snprintf(nm, sizeof nm,
                 "%s: switch topk=%s terms=%s%s bitwise the old kernels'",
                 name, tk ? "new" : "old", te ? "new" : "old",
                 m == 4 ? " (1 item block)" : "");
        CHECK(nm, S.st == LUCID_OK && ref.st == LUCID_OK && bad < 0,
              "%s / %s; %s differs", lucid_status_name(S.st),
              lucid_status_name(ref.st), bad >= 0 ? what[bad] : "nothing");
        snap_free(&S);
    }
    /* every gradient element written (NaN-filled before the run) */
    int nan_left = 0;
    for (int j = 2; j < 5; j++) {
        const lucid_tensor *t = j == 2 ? P->gpu.gb : j == 3 ? P->gpu.gc : P->gpu.gk;
        double *v = host_f64(t);
        for (int64_t i = 0; v && i < lucid_tensor_numel(t); i++)
            nan_left += isnan(v[i]) != 0;
        free(v);
    }
    snprintf(nm, sizeof nm, "%s: new kernels write every gradient element", name);
    CHECK(nm, nan_left == 0, "%d elements still NaN", nan_left);
    snap_free(&ref);
    for (int e = 0; e < 3; e++) {
        if (env0[e]) setenv(envn[e], env0[e], 1);
        else unsetenv(envn[e]);
        free(env0[e]);
    }
}

/* ------------------------------------------------------------ cases */

/* 64x64 image: levels 8x8, 4x4, 2x2 = 84 anchors; anchor a = i*8 + j of
 * level 0 sits at pixel (8j + 4, 8i + 4). */

static void run_case(const char *name, prob *P, int props) {
    if (prob_sides(P)) {
        TEST_FAIL(name, "setup: %s", lucid_ctx_error(ctx));
        return;
    }
    compare(name, P);
    if (props) gpu_props(name, P);
    switch_ab(name, P);
}

static void case_single(void) {
    prob P;
    prob_init(&P, 1, 2, 64, LUCID_F32, LUCID_F32);
    side_bins(&P, 0, 9, 0, 0, 1);
    side_bins(&P, 0, 9, 1, 0, 1);
    side_bins(&P, 0, 9, 2, 0, 2);
    side_bins(&P, 0, 9, 3, 0, 1);
    gt_row(&P, 0, 0, 1, 0.1875, 0.1875, 0.125, 0.125, 0.1875, 0.1875, 2);
    gt_row(&P, 0, 1, 0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 2); /* padding */
    run_case("single anchor", &P, 1);
    int32_t idx[84];
    lucid_pose_loss_read_assignment(ctx, P.gpu.plan, idx, NULL, NULL, NULL);
    int others = 0;
    for (int a = 0; a < 84; a++) others += a != 9 && idx[a] != -1;
    CHECK("single anchor: gpu assigns only anchor 9 to gt 0",
          idx[9] == 0 && others == 0, "idx9=%d others=%d", idx[9], others);
    prob_free(&P);
}

/* gt px (8,8)-(24,16): candidates exactly anchors 9 and 10. */
static void case_two_anchors(void) {
    prob P;
    prob_init(&P, 1, 1, 64, LUCID_F32, LUCID_F32);
    for (int a = 9; a <= 10; a++)
        for (int sd = 0; sd < 4; sd++) side_bins(&P, 0, a, sd, 0, sd == 2 ? 2 : 1);
    gt_row(&P, 0, 0, 1, 0.25, 0.1875, 0.25, 0.125, 0.25, 0.1875, 2);
    run_case("two anchors", &P, 0);
    int32_t idx[84];
    lucid_pose_loss_read_assignment(ctx, P.gpu.plan, idx, NULL, NULL, NULL);
    int fg = 0;
    for (int a = 0; a < 84; a++) fg += idx[a] == 0;
    CHECK("two anchors: gpu assigns anchors 9 and 10", idx[9] == 0 &&
          idx[10] == 0 && fg == 2, "idx9=%d idx10=%d fg=%d", idx[9], idx[10], fg);
    prob_free(&P);
}

/* Two overlapping gts share candidate anchors: claimed twice, resolved by
 * the highest overlap. */
static void case_claimed_twice(void) {
    prob P;
    prob_init(&P, 1, 3, 64, LUCID_F32, LUCID_F32);
    lucid_rand_uniform(ctx, P.pb, 11, 0, -1.0, 1.0);
    lucid_rand_uniform(ctx, P.pc, 11, 1u << 20, -2.0, 2.0);
    lucid_rand_uniform(ctx, P.pk, 11, 2u << 20, -1.0, 1.0);
    gt_row(&P, 0, 0, 1, 0.30, 0.30, 0.40, 0.40, 0.3, 0.3, 2);
    gt_row(&P, 0, 1, 1, 0.38, 0.36, 0.44, 0.40, 0.4, 0.4, 1);
    gt_row(&P, 0, 2, 1, 0.34, 0.33, 0.30, 0.36, 0.3, 0.4, 2);
    run_case("claimed twice", &P, 1);
    prob_free(&P);
}

/* Image 1 has no instance (valid negative). */
static void case_empty_image(void) {
    prob P;
    prob_init(&P, 2, 2, 64, LUCID_F32, LUCID_F32);
    lucid_rand_uniform(ctx, P.pb, 12, 0, -1.0, 1.0);
    lucid_rand_uniform(ctx, P.pc, 12, 1u << 20, -4.0, 0.0);
    lucid_rand_uniform(ctx, P.pk, 12, 2u << 20, -1.0, 1.0);
    gt_row(&P, 0, 0, 1, 0.5, 0.5, 0.5, 0.4, 0.5, 0.5, 2);
    run_case("empty image", &P, 0);
    prob_free(&P);
    /* and a batch without any instance: n_fg = 0 */
    prob_init(&P, 2, 2, 64, LUCID_F32, LUCID_F32);
    lucid_rand_uniform(ctx, P.pc, 13, 0, -4.0, 0.0);
    run_case("no instance at all", &P, 1);
    prob_free(&P);
}

static void case_invisible(void) {
    prob P;
    prob_init(&P, 1, 2, 64, LUCID_F32, LUCID_F32);
    lucid_rand_uniform(ctx, P.pb, 14, 0, -1.0, 1.0);
    lucid_rand_uniform(ctx, P.pk, 14, 2u << 20, -1.0, 1.0);
    gt_row(&P, 0, 0, 1, 0.4, 0.5, 0.5, 0.6, 0, 0, 0);
    gt_row(&P, 0, 1, 1, 0.6, 0.4, 0.3, 0.3, 0, 0, 0);
    run_case("all keypoints invisible", &P, 0);
    prob_free(&P);
}

/* Zero-width box (and a zero-height one): the eps terms keep it finite. */
static void case_degenerate(void) {
    prob P;
    prob_init(&P, 1, 2, 64, LUCID_F32, LUCID_F32);
    lucid_rand_uniform(ctx, P.pb, 15, 0, -1.0, 1.0);
    lucid_rand_uniform(ctx, P.pk, 15, 2u << 20, -1.0, 1.0);
    gt_row(&P, 0, 0, 1, 0.1875, 0.1875, 0.0, 0.125, 0.1875, 0.1875, 2);
    gt_row(&P, 0, 1, 1, 0.6, 0.6, 0.2, 0.0, 0.6, 0.6, 1);
    run_case("degenerate box", &P, 0);
    prob_free(&P);
}

static void case_random(const char *name, int B, int G, int img, int n,
                        uint64_t seed, lucid_dtype dt, lucid_dtype gdt,
                        int props) {
    prob P;
    if (prob_init(&P, B, G, img, dt, gdt)) {
        TEST_FAIL(name, "setup: %s", lucid_ctx_error(ctx));
        prob_free(&P);
        return;
    }
    random_problem(&P, seed, n);
    run_case(name, &P, props);
    prob_free(&P);
}

/* Ties and crowding, against a partition-dependent GPU result (the top-k
 * over a block's threads, the foreground terms spread over a block's
 * threads): constant box and class outputs, so the align metric ties
 * exactly between anchors at mirrored offsets of a gt and between gts
 * with the same box; image 0 has 40 small gts packed along its top rows
 * (the first loss blocks hold far more foreground anchors than one pass of
 * their threads covers) and 8 duplicates of them (claimed twice, overlap
 * ties -> first gt); image 1 has 12 large gts sharing most anchors, 6 of
 * them identical. Assignment identical to the CPU reference, two runs
 * bitwise equal, graph replay equal. */
static void case_ties(void) {
    prob P;
    if (prob_init(&P, 2, 48, 640, LUCID_F32, LUCID_F32)) {
        TEST_FAIL("ties", "setup: %s", lucid_ctx_error(ctx));
        prob_free(&P);
        return;
    }
    lucid_rand_uniform(ctx, P.pk, 21, 2u << 20, -1.0, 1.0);
    for (int g = 0; g < 40; g++) { /* 24 px boxes, 16 px apart, rows 0..3 */
        const double x = (16.0 + 15.5 * g) / 640, y = (g & 1 ? 20.0 : 14.0) / 640;
        gt_row(&P, 0, g, 1, x, y, 24.0 / 640, 24.0 / 640, x, y, 2);
    }
    for (int g = 40; g < 48; g++) { /* duplicates of rows 0, 5, 10, ... */
        const int o = (g - 40) * 5;
        const double x = (16.0 + 15.5 * o) / 640, y = (o & 1 ? 20.0 : 14.0) / 640;
        gt_row(&P, 0, g, 1, x, y, 24.0 / 640, 24.0 / 640, x, y, 1);
    }
    for (int g = 0; g < 12; g++) { /* image 1: large shared boxes */
        const double d = g < 6 ? 0.0 : 0.02 * (g - 5);
        gt_row(&P, 1, g, 1, 0.5 + d, 0.5 - d, 0.6, 0.5, 0.5, 0.5, 2);
    }
    run_case("ties", &P, 1);
    const int64_t n = (int64_t)P.B * P.A;
    int32_t *a0 = malloc(n * sizeof(int32_t));
    int fg0 = 0, fg1 = 0, blk0 = 0;
    if (a0 && lucid_pose_loss_read_assignment(ctx, P.gpu.plan, a0, NULL, NULL,
                                              NULL) == LUCID_OK)
        for (int64_t i = 0; i < n; i++) {
            fg0 += i < P.A && a0[i] >= 0;
            fg1 += i >= P.A && a0[i] >= 0;
            blk0 += i < 256 && a0[i] >= 0;
        }
    CHECK("ties: crowded block and shared anchors are foreground",
          blk0 > 24 && fg0 > 100 && fg1 > 0,
          "fg in anchors 0..255: %d, image 0: %d, image 1: %d", blk0, fg0,
          fg1);
    free(a0);
    prob_free(&P);
}

/* A strided (non-contiguous) output view on the GPU: same results. */
static void case_strided(void) {
    prob P;
    prob_init(&P, 2, 4, 64, LUCID_F32, LUCID_F32);
    random_problem(&P, 21, -1);
    if (prob_sides(&P)) {
        TEST_FAIL("strided outputs", "setup: %s", lucid_ctx_error(ctx));
        prob_free(&P);
        return;
    }
    /* pred_kpt as a [B, 51, A] view of a [B, A, 51] tensor */
    int64_t sh[3] = {P.B, P.A, 51};
    lucid_tensor *t = NULL, *h = NULL, *v = NULL;
    int perm[3] = {0, 2, 1};
    lucid_tensor *hk = to(P.pk, CPU, LUCID_F32);
    lucid_tensor_empty(ctx, CPU, LUCID_F32, 3, sh, &h);
    for (int b = 0; b < P.B; b++)
        for (int c = 0; c < 51; c++)
            for (int a = 0; a < P.A; a++)
                lucid_cpu_set(h, ((int64_t)b * P.A + a) * 51 + c,
                              lucid_cpu_get(hk, ((int64_t)b * 51 + c) * P.A + a));
    t = to(h, GPU, LUCID_F32);
    if (t) lucid_tensor_permute(ctx, t, perm, &v);
    if (!v) {
        TEST_FAIL("strided outputs", "view: %s", lucid_ctx_error(ctx));
    } else {
        lucid_tensor_release(P.gpu.pk);
        P.gpu.pk = v;
        compare("strided outputs", &P);
        switch_ab("strided outputs", &P);
    }
    if (t) lucid_tensor_release(t);
    if (h) lucid_tensor_release(h);
    if (hk) lucid_tensor_release(hk);
    prob_free(&P);
}

/* A gt row in pixels of an img x img image (xyxy), keypoints at its
 * centre, visible. */
static void gt_px(prob *P, int b, int g, double x1, double y1, double x2,
                  double y2) {
    const double S = P->img;
    gt_row(P, b, g, 1, (x1 + x2) / 2 / S, (y1 + y2) / 2 / S, (x2 - x1) / S,
           (y2 - y1) / S, (x1 + x2) / 2 / S, (y1 + y2) / 2 / S, 2);
}

/* Every align metric +0.0 (class logits -200: the sigmoid underflows to
 * 0), so each gt's top-k is its lowest anchor indices: a gt on the
 * image's top-left corner has candidates among them, the others do not;
 * image 1 has a gt covering every anchor (the largest slices of k_topk2,
 * no anchor outside). bf16 outputs. */
static void case_zero_metric(void) {
    prob P;
    if (prob_init(&P, 2, 6, 640, LUCID_BF16, LUCID_F32)) {
        TEST_FAIL("zero metrics", "setup: %s", lucid_ctx_error(ctx));
        prob_free(&P);
        return;
    }
    lucid_rand_uniform(ctx, P.pb, 31, 0, -3.0, 3.0);
    lucid_fill(ctx, P.pc, -200.0);
    lucid_rand_uniform(ctx, P.pk, 31, 2u << 20, -1.0, 1.0);
    gt_px(&P, 0, 0, 0, 0, 40, 30);      /* anchors 0.. are candidates */
    gt_px(&P, 0, 1, 2, 1, 14, 11);      /* tiny, on the corner */
    gt_px(&P, 0, 2, 300, 200, 420, 390);
    gt_px(&P, 0, 3, 600, 610, 650, 660); /* partly outside */
    gt_px(&P, 1, 0, 0, 0, 640, 640);    /* every anchor */
    gt_px(&P, 1, 2, 100, 0, 500, 24);   /* along the top row */
    run_case("zero metrics", &P, 1);
    prob_free(&P);
}

/* Fewer candidate anchors than topk: 1-2 px boxes (widened to stride 16),
 * boxes on the four corners and half outside the image, a box between
 * cell centres; random outputs, f16 with f16 gradients. */
static void case_few_candidates(void) {
    prob P;
    if (prob_init(&P, 2, 10, 640, LUCID_F16, LUCID_F16)) {
        TEST_FAIL("few candidates", "setup: %s", lucid_ctx_error(ctx));
        prob_free(&P);
        return;
    }
    lucid_rand_uniform(ctx, P.pb, 32, 0, -3.0, 3.0);
    lucid_rand_uniform(ctx, P.pc, 32, 1u << 28, -4.0, 2.0);
    lucid_rand_uniform(ctx, P.pk, 32, 2u << 28, -1.0, 1.0);
    gt_px(&P, 0, 0, 100, 100, 101, 101);
    gt_px(&P, 0, 1, 0.5, 0.5, 2.5, 1.5);
    gt_px(&P, 0, 2, 637, 0, 640, 3);
    gt_px(&P, 0, 3, 0, 636, 4, 640);
    gt_px(&P, 0, 4, 630, 630, 650, 650);
    gt_px(&P, 0, 5, -20, 300, 6, 330);
    gt_px(&P, 0, 6, 8, 8, 16, 16);       /* sides on cell centres */
    gt_px(&P, 0, 7, 12.0001, 20, 12.0002, 21);
    gt_px(&P, 1, 3, 320, 320, 321, 322);
    gt_px(&P, 1, 9, 200, 100, 202, 260); /* thin and tall */
    run_case("few candidates", &P, 0);
    prob_free(&P);
}

/* topk other than 10: 1, 13, 16 (k_topk2's largest), 20 (k_topk). */
static void case_topk(int k, uint64_t seed) {
    char nm[64];
    snprintf(nm, sizeof nm, "topk %d", k);
    prob P;
    if (prob_init(&P, 2, 12, 640, LUCID_F32, LUCID_F32)) {
        TEST_FAIL(nm, "setup: %s", lucid_ctx_error(ctx));
        prob_free(&P);
        return;
    }
    P.topk = k;
    random_problem(&P, seed, -1);
    run_case(nm, &P, 0);
    prob_free(&P);
}

/* ------------------------------------------------------------ real batch */

static const char *find_dataset(char *buf, size_t len) {
    const char *env = getenv("LUCID_DATASETS");
    const char *c[4] = {env, "../shared/datasets", "datasets", ".data"};
    for (int i = 0; i < 4; i++) {
        if (!c[i]) continue;
        snprintf(buf, len, "%s/coco-pose-mini/images/train", c[i]);
        struct stat sb;
        if (stat(buf, &sb) == 0) return buf;
    }
    return NULL;
}

static void case_real_batch(void) {
    const char *name = "real batch (640, B 4, max_gt 64)";
    char buf[512];
    const char *dir = find_dataset(buf, sizeof buf);
    if (!dir) {
        TEST_SKIP(name, "coco-pose-mini not found ($LUCID_DATASETS, "
                        "../shared/datasets, datasets, .data)");
        return;
    }
    lucid_dataset_options o = lucid_dataset_options_default();
    o.threads = 4;
    lucid_dataset *ds = NULL;
    if (lucid_dataset_open_yolo(ctx, dir, &o, &ds) != LUCID_OK) {
        TEST_FAIL(name, "dataset: %s", lucid_ctx_error(ctx));
        return;
    }
    lucid_loader_options lo = lucid_loader_options_default();
    lo.batch = 4, lo.imgsz = 640, lo.max_gt = 64, lo.threads = 2;
    lo.prefetch = 2, lo.seed = 7;
    lucid_loader *ld = NULL;
    lucid_aug_params ap = lucid_aug_params_default();
    lucid_batch *bt = NULL;
    if (lucid_loader_create(ctx, ds, &lo, &ld) != LUCID_OK ||
        lucid_loader_start_epoch(ld, 0, &ap) != LUCID_OK) {
        TEST_FAIL(name, "loader: %s", lucid_ctx_error(ctx));
        if (ld) lucid_loader_release(ld);
        lucid_dataset_release(ds);
        return;
    }
    for (int nb = 0; nb < 2; nb++) {
        if (lucid_loader_next(ld, &bt) != LUCID_OK || !bt) {
            TEST_FAIL(name, "loader_next: %s", lucid_ctx_error(ctx));
            break;
        }
        prob P;
        prob_init(&P, 4, 64, 640, nb ? LUCID_BF16 : LUCID_F32,
                  LUCID_F32);
        lucid_rand_uniform(ctx, P.pb, 100 + nb, 0, -3.0, 3.0);
        lucid_rand_uniform(ctx, P.pc, 100 + nb, 1u << 28, -6.0, 1.0);
        lucid_rand_uniform(ctx, P.pk, 100 + nb, 2u << 28, -1.0, 1.0);
        lucid_copy(ctx, P.tc, bt->cls);
        lucid_copy(ctx, P.tb, bt->boxes);
        lucid_copy(ctx, P.tk, bt->kpts);
        lucid_copy(ctx, P.tv, bt->mask);
        char nm[256];
        snprintf(nm, sizeof nm, "%s #%d %s (%d instances max, overflow %d)",
                 name, nb, nb ? "bf16" : "f32", bt->max_count, bt->overflow);
        run_case(nm, &P, nb == 0);
        prob_free(&P);
    }
    lucid_loader_release(ld);
    lucid_dataset_release(ds);
}

/* ------------------------------------------------------------ main */

int main(void) {
    if (!lucid_cuda_available()) {
        printf("skip test_loss_cuda: no CUDA device\n");
        return 0;
    }
    lucid_ctx_options opt = lucid_ctx_options_default();
    opt.device = GPU;
    char err[256];
    if (lucid_ctx_create(&opt, &ctx, err, sizeof err) != LUCID_OK) {
        printf("not ok context: %s\n", err);
        return 1;
    }
    case_single();
    case_two_anchors();
    case_claimed_twice();
    case_empty_image();
    case_invisible();
    case_degenerate();
    case_strided();
    case_ties();
    case_random("random 64 f32", 3, 6, 64, -1, 1, LUCID_F32, LUCID_F32, 0);
    case_random("random 64 bf16", 3, 6, 64, -1, 2, LUCID_BF16, LUCID_F32, 0);
    case_random("random 64 f16 grads f16", 2, 5, 64, -1, 3, LUCID_F16,
                LUCID_F16, 0);
    case_random("random 640 f32 10/img", 4, 10, 640, 10, 4, LUCID_F32,
                LUCID_F32, 1);
    case_random("random 640 f32 60/img", 4, 60, 640, 60, 5, LUCID_F32,
                LUCID_F32, 1);
    case_random("random 640 bf16 10/img", 4, 10, 640, 10, 6, LUCID_BF16,
                LUCID_F32, 0);
    case_random("random 640 bf16 grads bf16", 4, 16, 640, -1, 7, LUCID_BF16,
                LUCID_BF16, 1);
    case_random("random 640 f32 64/img", 2, 64, 640, 64, 8, LUCID_F32,
                LUCID_F32, 1);
    case_random("random 640 f16 100/img", 4, 100, 640, 100, 9, LUCID_F16,
                LUCID_F32, 0);
    case_zero_metric();
    case_few_candidates();
    case_topk(1, 41);
    case_topk(13, 42);
    case_topk(16, 43);
    case_topk(20, 44);
    case_real_batch();
    lucid_ctx_release(ctx);
    return test_exit();
}
