/*
 * test_loss_ref.c — writes pose-loss problems and lucid's CPU results as
 * .npy files for spec/reference/pose_loss_ref.py (PyTorch, GPU machine).
 *
 *   LUCID_LOSS_DUMP=dir build/tests/test_loss_ref    writes dir/<case>/...
 *   python3 spec/reference/pose_loss_ref.py dir       compares, ok/not ok
 *
 * Without LUCID_LOSS_DUMP it prints a visible skip. Per case directory:
 *   meta.npy        f8 [B, nc, K, G, reg_max, nlevels, h0, w0, s0, ...]
 *   pred_box/cls/kpt.npy   f8 outputs [B, C, A] (values f32-representable)
 *   t_cls, t_boxes, t_kpts, t_valid .npy   f8 targets
 *   c64_total, c64_items, c64_gbox, c64_gcls, c64_gkpt, c64_tgt, c64_score
 *   c32_*           the same from the f32 path (f32 files)
 * Cases: "small" (B=2, 64x64, G=3, nc=2) and "mid" (B=4, 320x320, G=12,
 * nc=1, small boxes that take the widening rule, one image without
 * instances), outputs drawn like an early-training network (class logits
 * near the bias init).
 */
#include "test.h"
#include "internal.h" /* lucid_cpu_get/set */
#include "train/loss.h"
#include <errno.h>
#include <sys/stat.h>

static uint64_t rng_s;
static double urand(void) {
    rng_s ^= rng_s >> 12, rng_s ^= rng_s << 25, rng_s ^= rng_s >> 27;
    return (double)((rng_s * 2685821657736338717ull) >> 11) * 0x1.0p-53;
}
static double nrand(void) {
    double u = urand() + 1e-12, v = urand();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* Write a C-order .npy (descr "<f8", "<f4", "<i4"). Returns 0 on success. */
static int npy_write(const char *dir, const char *name, const char *descr,
                     int nd, const int64_t *shape, const void *data,
                     size_t esize) {
    char path[512], hdr[256], shp[128] = "";
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t n = 1, o = 0;
    for (int d = 0; d < nd; d++) {
        o += (size_t)snprintf(shp + o, sizeof shp - o, "%lld,", (long long)shape[d]);
        n *= (size_t)shape[d];
    }
    int hl = snprintf(hdr, sizeof hdr,
                      "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                      descr, shp);
    int total = 10 + hl + 1, pad = (64 - total % 64) % 64;
    for (int i = 0; i < pad; i++) hdr[hl++] = ' ';
    hdr[hl++] = '\n';
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                             (unsigned char)(hl & 0xff), (unsigned char)(hl >> 8)};
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(hdr, 1, (size_t)hl, f) == (size_t)hl &&
             fwrite(data, esize, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* Tensor as f64 (or f32) .npy. */
static int dump_t(const char *dir, const char *name, const lucid_tensor *t, int f32) {
    int64_t n = lucid_tensor_numel(t);
    void *buf = malloc((size_t)n * 8);
    if (!buf) return -1;
    for (int64_t i = 0; i < n; i++) {
        if (f32) ((float *)buf)[i] = (float)lucid_cpu_get(t, i);
        else ((double *)buf)[i] = lucid_cpu_get(t, i);
    }
    int r = npy_write(dir, name, f32 ? "<f4" : "<f8", t->ndim, t->shape, buf, f32 ? 4 : 8);
    free(buf);
    return r;
}

static lucid_tensor *mk(lucid_ctx *ctx, lucid_dtype dt, int nd, int64_t a,
                        int64_t b, int64_t c, int64_t d) {
    int64_t sh[4] = {a, b, c, d};
    lucid_tensor *t = NULL;
    lucid_tensor_zeros(ctx, (lucid_device){LUCID_CPU, 0}, dt, nd, sh, &t);
    return t;
}

typedef struct spec {
    const char *name;
    int B, img, G, nc;
    uint64_t seed;
} spec;

static void run_case(lucid_ctx *ctx, const char *root, const spec *sp) {
    char dir[400], nm[600];
    snprintf(dir, sizeof dir, "%s/%s", root, sp->name);
    mkdir(root, 0755);
    mkdir(dir, 0755);
    const int B = sp->B, G = sp->G, nc = sp->nc, K = 17;
    lucid_pose_loss_config cfg = lucid_pose_loss_config_default();
    cfg.batch = B, cfg.nc = nc, cfg.max_gt = G;
    lucid_pose_loss_config_levels(&cfg, sp->img, sp->img);
    lucid_pose_loss_plan *p64 = NULL, *p32 = NULL;
    snprintf(nm, sizeof nm, "ref %s: plans", sp->name);
    CHECK_STATUS(nm, ctx,
                 lucid_pose_loss_plan_create(ctx, (lucid_device){LUCID_CPU, 0}, &cfg, &p64));
    if (!p64) return;
    if (lucid_pose_loss_plan_create(ctx, (lucid_device){LUCID_CPU, 0}, &cfg, &p32)) return;
    const int A = lucid_pose_loss_plan_anchors(p64);
    lucid_tensor *o64[3], *o32[3], *g64[3], *g32[3];
    const int C[3] = {64, nc, 3 * K};
    for (int j = 0; j < 3; j++) {
        o64[j] = mk(ctx, LUCID_F64, 3, B, C[j], A, 0);
        g64[j] = mk(ctx, LUCID_F64, 3, B, C[j], A, 0);
        o32[j] = mk(ctx, LUCID_F32, 3, B, C[j], A, 0);
        g32[j] = mk(ctx, LUCID_F32, 3, B, C[j], A, 0);
    }
    lucid_tensor *tc = mk(ctx, LUCID_F32, 2, B, G, 0, 0);
    lucid_tensor *tb = mk(ctx, LUCID_F32, 3, B, G, 4, 0);
    lucid_tensor *tk = mk(ctx, LUCID_F32, 4, B, G, K, 3);
    lucid_tensor *tv = mk(ctx, LUCID_F32, 2, B, G, 0, 0);
    lucid_tensor *tot64 = mk(ctx, LUCID_F64, 1, 1, 0, 0, 0), *it64 = mk(ctx, LUCID_F64, 1, 5, 0, 0, 0);
    lucid_tensor *tot32 = mk(ctx, LUCID_F32, 1, 1, 0, 0, 0), *it32 = mk(ctx, LUCID_F32, 1, 5, 0, 0, 0);
    lucid_pose_targets tg = {tc, tb, tk, tv};

    rng_s = sp->seed;
    for (int j = 0; j < 3; j++)
        for (int64_t i = 0; i < lucid_tensor_numel(o64[j]); i++) {
            int64_t c = (i / A) % C[j];
            double v = j == 0 ? nrand() - 0.3 * (double)(c % 16)
                     : j == 1 ? -4.0 + 1.5 * nrand()
                              : 0.6 * nrand();
            v = (double)(float)v;
            lucid_cpu_set(o64[j], i, v);
            lucid_cpu_set(o32[j], i, v);
        }
    for (int b = 0; b < B; b++) {
        int nvalid = b == B - 1 && B > 2 ? 0 : G - (b % 3); /* last image: none */
        for (int g = 0; g < G; g++) {
            int64_t r = (int64_t)b * G + g;
            int small = g % 4 == 3; /* below 8 px on one side */
            double w = small ? 4.0 / sp->img : 0.05 + 0.4 * urand();
            double h = 0.05 + 0.4 * urand();
            double x = w / 2 + (1 - w) * urand(), y = h / 2 + (1 - h) * urand();
            double bx[4] = {x, y, w, h};
            lucid_cpu_set(tv, r, g < nvalid);
            lucid_cpu_set(tc, r, (int)(nc * urand()));
            for (int q = 0; q < 4; q++) lucid_cpu_set(tb, r * 4 + q, (float)bx[q]);
            for (int k = 0; k < K; k++) {
                lucid_cpu_set(tk, (r * K + k) * 3 + 0, (float)(x + w * (urand() - 0.5)));
                lucid_cpu_set(tk, (r * K + k) * 3 + 1, (float)(y + h * (urand() - 0.5)));
                lucid_cpu_set(tk, (r * K + k) * 3 + 2, (int)(3 * urand()));
            }
        }
    }
    snprintf(nm, sizeof nm, "ref %s: f64 forward/backward", sp->name);
    lucid_status st = lucid_pose_loss_forward(ctx, p64, o64[0], o64[1], o64[2], &tg, tot64, it64);
    if (!st) st = lucid_pose_loss_backward(ctx, p64, o64[0], o64[1], o64[2], NULL, g64[0], g64[1], g64[2]);
    CHECK_STATUS(nm, ctx, st);
    snprintf(nm, sizeof nm, "ref %s: f32 forward/backward", sp->name);
    st = lucid_pose_loss_forward(ctx, p32, o32[0], o32[1], o32[2], &tg, tot32, it32);
    if (!st) st = lucid_pose_loss_backward(ctx, p32, o32[0], o32[1], o32[2], NULL, g32[0], g32[1], g32[2]);
    CHECK_STATUS(nm, ctx, st);

    double meta[8 + 3 * LUCID_POSE_LOSS_MAX_LEVELS] = {B, nc, K, G, 16, cfg.nlevels};
    for (int l = 0; l < cfg.nlevels; l++) {
        meta[6 + 3 * l] = cfg.level_h[l];
        meta[7 + 3 * l] = cfg.level_w[l];
        meta[8 + 3 * l] = cfg.strides[l];
    }
    int64_t mshape[1] = {6 + 3 * cfg.nlevels};
    int err = npy_write(dir, "meta", "<f8", 1, mshape, meta, 8);
    static const char *on[3] = {"pred_box", "pred_cls", "pred_kpt"};
    static const char *gn[3] = {"gbox", "gcls", "gkpt"};
    for (int j = 0; j < 3; j++) {
        char a[32];
        err |= dump_t(dir, on[j], o64[j], 0);
        snprintf(a, sizeof a, "c64_%s", gn[j]);
        err |= dump_t(dir, a, g64[j], 0);
        snprintf(a, sizeof a, "c32_%s", gn[j]);
        err |= dump_t(dir, a, g32[j], 1);
    }
    err |= dump_t(dir, "t_cls", tc, 0) | dump_t(dir, "t_boxes", tb, 0);
    err |= dump_t(dir, "t_kpts", tk, 0) | dump_t(dir, "t_valid", tv, 0);
    err |= dump_t(dir, "c64_total", tot64, 0) | dump_t(dir, "c64_items", it64, 0);
    err |= dump_t(dir, "c32_total", tot32, 1) | dump_t(dir, "c32_items", it32, 1);
    int32_t *idx = malloc((size_t)B * A * 4);
    double *sc = malloc((size_t)B * A * 8);
    int64_t ashape[2] = {B, A};
    if (!idx || !sc) err = 1;
    else {
        lucid_pose_loss_read_assignment(ctx, p64, idx, sc, NULL, NULL);
        err |= npy_write(dir, "c64_tgt", "<i4", 2, ashape, idx, 4);
        err |= npy_write(dir, "c64_score", "<f8", 2, ashape, sc, 8);
        lucid_pose_loss_read_assignment(ctx, p32, idx, sc, NULL, NULL);
        err |= npy_write(dir, "c32_tgt", "<i4", 2, ashape, idx, 4);
        err |= npy_write(dir, "c32_score", "<f8", 2, ashape, sc, 8);
    }
    free(idx), free(sc);
    double nfg;
    lucid_pose_loss_read_assignment(ctx, p64, NULL, NULL, &nfg, NULL);
    snprintf(nm, sizeof nm, "ref %s: wrote %s", sp->name, dir);
    CHECK(nm, !err, "write failed: %s", strerror(errno));
    printf("# %s: A=%d n_fg=%g total f64 %.12g f32 %.9g\n", sp->name, A, nfg,
           lucid_cpu_get(tot64, 0), lucid_cpu_get(tot32, 0));
    lucid_tensor *all[] = {o64[0], o64[1], o64[2], o32[0], o32[1], o32[2],
                           g64[0], g64[1], g64[2], g32[0], g32[1], g32[2],
                           tc, tb, tk, tv, tot64, it64, tot32, it32};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) lucid_tensor_release(all[i]);
    lucid_pose_loss_plan_destroy(p64);
    lucid_pose_loss_plan_destroy(p32);
}

int main(void) {
    const char *root = getenv("LUCID_LOSS_DUMP");
    if (!root || !*root) {
        TEST_SKIP("pose loss reference dump",
                  "set LUCID_LOSS_DUMP=dir, then run spec/reference/pose_loss_ref.py dir");
        return 0;
    }
    lucid_ctx *ctx = NULL;
    lucid_ctx_options opt = lucid_ctx_options_default();
    char err[256];
    if (lucid_ctx_create(&opt, &ctx, err, sizeof err) != LUCID_OK) {
        printf("not ok context: %s\n", err);
        return 1;
    }
    static const spec cases[] = {{"small", 2, 64, 3, 2, 0x1234567ull},
                                 {"mid", 4, 320, 12, 1, 0xABCDEF1ull}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(ctx, root, &cases[i]);
    lucid_ctx_release(ctx);
    return test_exit();
}
