/*
 * bench_optim.c — one optimizer update over the YOLO11n-pose parameters
 * (engine/train/optim.h): SGD (Nesterov), AdamW, MuSGD, the EMA update, the
 * gradient norm + clip, and the step as the trainer runs it
 * (clip_norm -> optim_step -> ema_update of the parameters and of the BN
 * buffers), both as those separate calls and as one
 * lucid_optim_step_fused call (CLIP_NORM, EMA of the parameters, aux EMA
 * of the BN buffers; the gradients are not written back), against issue
 * 6's targets on the H200:
 *     SGD/AdamW update + EMA + norm + clip  < 50 us together
 *     MuSGD (update + EMA + norm + clip)    < 1 ms
 *
 * Layout: the REAL YOLO11n-pose (nc 1, kpt 17x3) parameter set, generated
 * here from the architecture (Ultralytics yolo11-pose.yaml at scale n:
 * Conv / C3k2 / C3k / Bottleneck / SPPF / C2PSA / Pose head, the same
 * module order as lua/lucid/models/yolo11_pose.lua) — no checked-in data:
 *   541 state entries = 280 parameters (279 trainable + the frozen DFL
 *   conv) + 87 BN x (running_mean, running_var, num_batches_tracked);
 *   2,874,462 parameter elements (2,874,446 trainable), with names, shapes
 *   [c_out, c_in/groups, k, k], kinds (conv weights and the head's 1x1
 *   conv weights: decay; BN weights: norm; BN and head biases: bias) and
 *   the MuSGD classification-head flag (model.23.cv3.*).
 *   Flat placement as engine/nn/params.c materializes it: parameter offsets
 *   rounded up to 16 elements; buffers in a byte buffer at 64-byte offsets
 *   (i64 num_batches_tracked included), viewed as f32 for the buffer EMA.
 *   The generator checks its own totals against the numbers above and
 *   refuses to run when they differ; `bench_optim layout` prints the table
 *   in the form of a dump of the Lua model's ParamSet (name, shape, dtype,
 *   trainable, group), and that dump was diffed identical (541 lines)
 *   against lucid.models.yolo11_pose{scale="n", nc=1} when this was written.
 *   The BN buffer EMA runs over the 174 f32 buffers (running_mean/var).
 *
 *   GPU: CUDA events on the context's compute stream around each call
 *        (the pose-loss kernel table's generic time_calls hook, so this file
 *        needs no CUDA header); 20 warm-up calls, median (min, p90) of 200.
 *        Plus, for the combined steps, the per-replay time of the same work
 *        recorded into one CUDA graph (the loss table's capture hook: wall
 *        clock of N+1 replays minus 1 replay, divided by N, median of 3) —
 *        what a recorded training step pays.
 *   CPU: the reference, wall clock, median of 20 (MuSGD: 3).
 * Values: params U(-0.1, 0.1), gradients U(-1e-3, 1e-3) (total norm ~1 <
 * max_norm 10, so the clip multiplies by 1 and repeated calls leave the
 * gradients unchanged; the multiply is done either way), defaults of
 * lucid_param_values_default (lr 0.01, momentum 0.937, wd 5e-4, ...).
 *
 *   run: make bench (or build like bench/run.sh and run build/bench/bench_optim;
 *        argument "gpu": skip the CPU reference; "layout": print the
 *        generated table — name, shape, dtype, trainable, group — in the
 *        format of a Lua dump of the model's ParamSet, for a diff; "plan":
 *        print the MuSGD bucket plan of the layout (padded shape, matrices,
 *        their shapes, GFLOP of the five Newton–Schulz iterations))
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train/loss_backend.h"
#include "train/optim.h"
#include "train/optim_backend.h"

#define WARMUP 20
#define REPS 200
#define CPU_REPS 20
#define CPU_REPS_MUSGD 3

static lucid_ctx *ctx;

static void die(const char *what) {
    fprintf(stderr, "bench_optim: %s: %s\n", what, lucid_ctx_error(ctx));
    exit(1);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}
static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ------------------------------------------------ the YOLO11n-pose layout */

#define MAX_ENTRIES 600
enum { E_PARAM, E_BUF_F32, E_BUF_I64 };

typedef struct entry {
    char name[80];
    int what;          /* E_* */
    int kind;          /* lucid_segment_kind (parameters) */
    int trainable;
    int ndim;
    int64_t shape[4];
} entry;

/* Names: vsnprintf, checked (the longest YOLO11n-pose name has 43 characters). */
static void fmt(char *o, size_t n, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    int r = vsnprintf(o, n, f, ap);
    va_end(ap);
    if (r < 0 || (size_t)r >= n) {
        fprintf(stderr, "bench_optim: layout: name too long\n");
        exit(1);
    }
}

static entry ents[MAX_ENTRIES];
static int nents;

static entry *add(const char *name, int what, int kind, int trainable, int ndim,
                  int64_t a, int64_t b, int64_t c, int64_t d) {
    if (nents == MAX_ENTRIES) {
        fprintf(stderr, "bench_optim: layout: too many entries\n");
        exit(1);
    }
    entry *e = &ents[nents++];
    fmt(e->name, sizeof e->name, "%s", name);
    e->what = what, e->kind = kind, e->trainable = trainable, e->ndim = ndim;
    e->shape[0] = a, e->shape[1] = b, e->shape[2] = c, e->shape[3] = d;
    return e;
}

static void sub(char *o, size_t n, const char *p, const char *s) {
    fmt(o, n, "%s.%s", p, s);
}

/* Conv (conv without bias + BatchNorm2d): c2 x c1/g x k x k. */
static void conv(const char *p, int c1, int c2, int k, int g) {
    char n[80];
    sub(n, sizeof n, p, "conv.weight");
    add(n, E_PARAM, LUCID_KIND_WEIGHT, 1, 4, c2, c1 / g, k, k);
    sub(n, sizeof n, p, "bn.weight");
    add(n, E_PARAM, LUCID_KIND_NORM, 1, 1, c2, 0, 0, 0);
    sub(n, sizeof n, p, "bn.bias");
    add(n, E_PARAM, LUCID_KIND_BIAS, 1, 1, c2, 0, 0, 0);
    sub(n, sizeof n, p, "bn.running_mean");
    add(n, E_BUF_F32, 0, 0, 1, c2, 0, 0, 0);
    sub(n, sizeof n, p, "bn.running_var");
    add(n, E_BUF_F32, 0, 0, 1, c2, 0, 0, 0);
    sub(n, sizeof n, p, "bn.num_batches_tracked");
    add(n, E_BUF_I64, 0, 0, 0, 0, 0, 0, 0);
}

/* Plain nn.Conv2d 1x1 with bias (head outputs). */
static void conv2d_bias(const char *p, int c1, int c2) {
    char n[80];
    sub(n, sizeof n, p, "weight");
    add(n, E_PARAM, LUCID_KIND_WEIGHT, 1, 4, c2, c1, 1, 1);
    sub(n, sizeof n, p, "bias");
    add(n, E_PARAM, LUCID_KIND_BIAS, 1, 1, c2, 0, 0, 0);
}

/* Bottleneck(c1, c2, e): cv1 Conv(c1, c_, 3), cv2 Conv(c_, c2, 3). */
static void bottleneck(const char *p, int c1, int c2, double e) {
    char n[80];
    int c_ = (int)(c2 * e);
    sub(n, sizeof n, p, "cv1"), conv(n, c1, c_, 3, 1);
    sub(n, sizeof n, p, "cv2"), conv(n, c_, c2, 3, 1);
}

/* C3k(c1, c2, n=2, e=0.5, k=3): cv1, cv2 Conv(c1, c_, 1), cv3 Conv(2c_, c2,
 * 1), m = n x Bottleneck(c_, c_, e=1). */
static void c3k(const char *p, int c1, int c2, int rep) {
    char n[80];
    int c_ = c2 / 2;
    sub(n, sizeof n, p, "cv1"), conv(n, c1, c_, 1, 1);
    sub(n, sizeof n, p, "cv2"), conv(n, c1, c_, 1, 1);
    sub(n, sizeof n, p, "cv3"), conv(n, 2 * c_, c2, 1, 1);
    for (int i = 0; i < rep; i++) {
        fmt(n, sizeof n, "%s.m.%d", p, i);
        bottleneck(n, c_, c_, 1.0);
    }
}

/* C3k2(c1, c2, n, c3k, e): c = c2*e; cv1 Conv(c1, 2c, 1), cv2 Conv((2+n)c,
 * c2, 1), m = n x (C3k(c, c, 2) | Bottleneck(c, c, e=0.5)). */
static void c3k2(int layer, int c1, int c2, int rep, int use_c3k, double e) {
    char p[32], n[80];
    fmt(p, sizeof p, "model.%d", layer);
    int c = (int)(c2 * e);
    sub(n, sizeof n, p, "cv1"), conv(n, c1, 2 * c, 1, 1);
    sub(n, sizeof n, p, "cv2"), conv(n, (2 + rep) * c, c2, 1, 1);
    for (int i = 0; i < rep; i++) {
        fmt(n, sizeof n, "%s.m.%d", p, i);
        if (use_c3k) c3k(n, c, c, 2);
        else bottleneck(n, c, c, 0.5);
    }
}

static void conv_layer(int layer, int c1, int c2, int k) {
    char p[32];
    fmt(p, sizeof p, "model.%d", layer);
    conv(p, c1, c2, k, 1);
}

/* The nano model: width 0.25 (64 -> 16 ... 1024 -> 256), depth 0.5 (the
 * yaml's repeats of 2 -> 1), nc 1, kpt_shape 17x3, reg_max 16. */
static void build_yolo11n_pose(void) {
    nents = 0;
    conv_layer(0, 3, 16, 3);
    conv_layer(1, 16, 32, 3);
    c3k2(2, 32, 64, 1, 0, 0.25);
    conv_layer(3, 64, 64, 3);
    c3k2(4, 64, 128, 1, 0, 0.25);
    conv_layer(5, 128, 128, 3);
    c3k2(6, 128, 128, 1, 1, 0.5);
    conv_layer(7, 128, 256, 3);
    c3k2(8, 256, 256, 1, 1, 0.5);
    /* 9 SPPF(256, 256, 5): c_ = 128 */
    conv("model.9.cv1", 256, 128, 1, 1);
    conv("model.9.cv2", 512, 256, 1, 1);
    /* 10 C2PSA(256, 256, n=1): c = 128; PSABlock(128, attn_ratio 0.5,
     * heads 2): qkv 128 -> 128 + 2*64, proj, pe (depthwise 3x3), ffn */
    conv("model.10.cv1", 256, 256, 1, 1);
    conv("model.10.cv2", 256, 256, 1, 1);
    conv("model.10.m.0.attn.qkv", 128, 256, 1, 1);
    conv("model.10.m.0.attn.proj", 128, 128, 1, 1);
    conv("model.10.m.0.attn.pe", 128, 128, 3, 128);
    conv("model.10.m.0.ffn.0", 128, 256, 1, 1);
    conv("model.10.m.0.ffn.1", 256, 128, 1, 1);
    /* head (11, 12, 14, 15, 18, 21: upsample/concat, no parameters) */
    c3k2(13, 256 + 128, 128, 1, 0, 0.5);
    c3k2(16, 128 + 128, 64, 1, 0, 0.5);
    conv_layer(17, 64, 64, 3);
    c3k2(19, 64 + 128, 128, 1, 0, 0.5);
    conv_layer(20, 128, 128, 3);
    c3k2(22, 128 + 256, 256, 1, 1, 0.5);
    /* 23 Pose(nc 1, 17x3, ch 64/128/256): c2 = max(16, 64/4, 4*16) = 64,
     * c3 = max(64, min(nc, 100)) = 64, c4 = max(64/4, 51) = 51 */
    const int ch[3] = {64, 128, 256};
    char n[80];
    for (int i = 0; i < 3; i++) {
        fmt(n, sizeof n, "model.23.cv2.%d.0", i), conv(n, ch[i], 64, 3, 1);
        fmt(n, sizeof n, "model.23.cv2.%d.1", i), conv(n, 64, 64, 3, 1);
        fmt(n, sizeof n, "model.23.cv2.%d.2", i), conv2d_bias(n, 64, 64);
    }
    for (int i = 0; i < 3; i++) {
        fmt(n, sizeof n, "model.23.cv3.%d.0.0", i), conv(n, ch[i], ch[i], 3, ch[i]);
        fmt(n, sizeof n, "model.23.cv3.%d.0.1", i), conv(n, ch[i], 64, 1, 1);
        fmt(n, sizeof n, "model.23.cv3.%d.1.0", i), conv(n, 64, 64, 3, 64);
        fmt(n, sizeof n, "model.23.cv3.%d.1.1", i), conv(n, 64, 64, 1, 1);
        fmt(n, sizeof n, "model.23.cv3.%d.2", i), conv2d_bias(n, 64, 1);
    }
    add("model.23.dfl.conv.weight", E_PARAM, LUCID_KIND_WEIGHT, 0, 4, 1, 16, 1, 1);
    for (int i = 0; i < 3; i++) {
        fmt(n, sizeof n, "model.23.cv4.%d.0", i), conv(n, ch[i], 51, 3, 1);
        fmt(n, sizeof n, "model.23.cv4.%d.1", i), conv(n, 51, 51, 3, 1);
        fmt(n, sizeof n, "model.23.cv4.%d.2", i), conv2d_bias(n, 51, 51);
    }
}

static int64_t numel_of(const entry *e) {
    int64_t n = 1;
    for (int d = 0; d < e->ndim; d++) n *= e->shape[d];
    return n;
}

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

typedef struct layout_info {
    lucid_param_segment psegs[MAX_ENTRIES], bsegs[MAX_ENTRIES];
    int np, nb;
    int64_t plen;       /* flat parameter elements (16-aligned offsets) */
    int64_t blen;       /* flat buffer bytes / 4 (the f32 view) */
    int64_t pnumel, ptrain_numel;
    int ntrain, nbn;
} layout_info;

/* Segment tables as engine/nn/params.c places the entries and
 * lua/lua_optim.c describes them (make_layout). Checks the totals. */
static void make_tables(layout_info *L) {
    memset(L, 0, sizeof *L);
    build_yolo11n_pose();
    int64_t plen = 0, bbytes = 0;
    for (int i = 0; i < nents; i++) {
        entry *e = &ents[i];
        int64_t n = numel_of(e);
        if (e->what == E_PARAM) {
            lucid_param_segment *s = &L->psegs[L->np++];
            s->name = e->name, s->offset = plen, s->numel = n, s->kind = e->kind;
            s->ndim = e->ndim;
            for (int d = 0; d < 4; d++) s->shape[d] = e->shape[d];
            s->trainable = e->trainable;
            s->head = strncmp(e->name, "model.23.cv3.", 13) == 0;
            plen = round_up(plen + n, 16);
            L->pnumel += n;
            if (e->trainable) L->ptrain_numel += n, L->ntrain++;
        } else {
            int64_t es = e->what == E_BUF_I64 ? 8 : 4;
            if (e->what == E_BUF_F32) {
                lucid_param_segment *s = &L->bsegs[L->nb++];
                s->name = e->name, s->offset = bbytes / 4, s->numel = n;
                s->kind = LUCID_KIND_WEIGHT, s->ndim = e->ndim;
                for (int d = 0; d < 4; d++) s->shape[d] = e->shape[d];
            } else {
                L->nbn++;
            }
            bbytes = round_up(bbytes + n * es, 64);
        }
    }
    L->plen = plen;
    L->blen = bbytes / 4;
    if (nents != 541 || L->np != 280 || L->ntrain != 279 || L->nbn != 87 ||
        L->pnumel != 2874462 || L->ptrain_numel != 2874446) {
        fprintf(stderr,
                "bench_optim: the generated layout is not YOLO11n-pose: %d entries "
                "(541), %d parameters (280), %d trainable (279), %d BN (87), "
                "%lld elements (2874462), %lld trainable (2874446)\n",
                nents, L->np, L->ntrain, L->nbn, (long long)L->pnumel,
                (long long)L->ptrain_numel);
        exit(1);
    }
}

/* ------------------------------------------------------------- the runs */

typedef struct run {
    lucid_device dev;
    lucid_param_layout *pl, *bl;
    lucid_param_block *pb;
    lucid_optim *opt[LUCID_OPTIM_KIND_COUNT];
    lucid_ema *pema, *bema;
    lucid_tensor *params, *grads, *bufs;
    lucid_optim_kind kind; /* for the hooks */
} run;

static lucid_tensor *filled(lucid_device dev, int64_t n, uint64_t seed,
                            double lo, double hi) {
    const lucid_device cpu = {LUCID_CPU, 0};
    lucid_tensor *h, *d;
    if (lucid_tensor_zeros(ctx, cpu, LUCID_F32, 1, &n, &h)) die("alloc");
    if (lucid_rand_uniform(ctx, h, seed, 0, lo, hi)) die("rand");
    if (lucid_tensor_to(ctx, h, dev, LUCID_F32, &d)) die("copy");
    lucid_tensor_release(h);
    return d;
}

static void setup(run *R, lucid_device dev, const layout_info *L) {
    memset(R, 0, sizeof *R);
    R->dev = dev;
    if (lucid_param_layout_create(ctx, dev, L->plen, L->psegs, L->np, &R->pl))
        die("parameter layout");
    if (lucid_param_layout_create(ctx, dev, L->blen, L->bsegs, L->nb, &R->bl))
        die("buffer layout");
    if (lucid_param_block_create(ctx, dev, NULL, &R->pb)) die("parameter block");
    for (int k = 0; k < LUCID_OPTIM_KIND_COUNT; k++)
        if (lucid_optim_create(ctx, (lucid_optim_kind)k, R->pl, &R->opt[k]))
            die("optimizer");
    R->params = filled(dev, L->plen, 11, -0.1, 0.1);
    R->grads = filled(dev, L->plen, 12, -1e-3, 1e-3);
    R->bufs = filled(dev, L->blen, 13, 0.0, 1.0);
    if (lucid_ema_create(ctx, R->pl, R->params, &R->pema)) die("EMA");
    if (lucid_ema_create(ctx, R->bl, R->bufs, &R->bema)) die("buffer EMA");
}

static void teardown(run *R) {
    for (int k = 0; k < LUCID_OPTIM_KIND_COUNT; k++) lucid_optim_release(R->opt[k]);
    lucid_ema_release(R->pema), lucid_ema_release(R->bema);
    lucid_tensor_release(R->params), lucid_tensor_release(R->grads);
    lucid_tensor_release(R->bufs);
    lucid_param_block_release(R->pb);
    lucid_param_layout_release(R->pl), lucid_param_layout_release(R->bl);
}

static lucid_status h_optim(void *a) {
    run *R = a;
    return lucid_optim_step(ctx, R->opt[R->kind], R->pb, R->params, R->grads);
}
static lucid_status h_ema(void *a) {
    run *R = a;
    lucid_status s = lucid_ema_update(ctx, R->pema, R->pb, R->params);
    return s ? s : lucid_ema_update(ctx, R->bema, R->pb, R->bufs);
}
static lucid_status h_clip(void *a) {
    run *R = a;
    return lucid_grad_clip_norm(ctx, R->pl, R->pb, R->grads, 1);
}
static lucid_status h_upload(void *a) {
    run *R = a;
    return lucid_param_block_upload(ctx, R->pb);
}
/* The trainer's order at a window boundary (optim.h): clip -> step -> EMA. */
static lucid_status h_combined(void *a) {
    lucid_status s = h_clip(a);
    if (!s) s = h_optim(a);
    if (!s) s = h_ema(a);
    return s;
}
/* The same as one fused call. */
static lucid_status h_fused(void *a) {
    run *R = a;
    lucid_optim_step_opts o = {LUCID_STEP_CLIP_NORM, R->pema, R->bema, R->bufs};
    return lucid_optim_step_fused(ctx, R->opt[R->kind], R->pb, R->params, R->grads, &o);
}

typedef lucid_status (*hook)(void *);

typedef struct row {
    const char *label;
    hook fn;
    lucid_optim_kind kind;
    int target;     /* 0 none, 1: 50 us, 2: 1 ms */
    int graph;      /* also time a recorded replay */
} row;

static const row rows[] = {
    {"SGD (Nesterov) update", h_optim, LUCID_OPTIM_SGD, 0, 0},
    {"AdamW update", h_optim, LUCID_OPTIM_ADAMW, 0, 0},
    {"MuSGD update", h_optim, LUCID_OPTIM_MUSGD, 0, 0},
    {"EMA update (params + BN buffers)", h_ema, LUCID_OPTIM_SGD, 0, 0},
    {"grad norm + clip (f32)", h_clip, LUCID_OPTIM_SGD, 0, 0},
    {"param block upload", h_upload, LUCID_OPTIM_SGD, 0, 0},
    {"SGD + EMA + norm + clip", h_combined, LUCID_OPTIM_SGD, 1, 1},
    {"SGD + EMA + norm + clip, fused", h_fused, LUCID_OPTIM_SGD, 1, 1},
    {"AdamW + EMA + norm + clip", h_combined, LUCID_OPTIM_ADAMW, 1, 1},
    {"AdamW + EMA + norm + clip, fused", h_fused, LUCID_OPTIM_ADAMW, 1, 1},
    {"MuSGD + EMA + norm + clip", h_combined, LUCID_OPTIM_MUSGD, 2, 1},
    {"MuSGD + EMA + norm + clip, fused", h_fused, LUCID_OPTIM_MUSGD, 2, 1},
};
#define NROWS ((int)(sizeof rows / sizeof *rows))

static const char *verdict(int target, double us) {
    if (target == 1) return us < 50.0 ? "  [target < 50 us: met]" : "  [target < 50 us: MISSED]";
    if (target == 2) return us < 1000.0 ? "  [target < 1 ms: met]" : "  [target < 1 ms: MISSED]";
    return "";
}

/* Per-replay time of fn recorded into one graph: wall clock of (n + 1)
 * launches minus 1 launch (capture and instantiation cancel), / n; median of
 * 3. Returns < 0 when the capture fails (message printed). */
static double graph_us(const lucid_pose_loss_kernels *k, run *R, hook fn, int n) {
    double d[3];
    for (int r = 0; r < 3; r++) {
        double t0 = now();
        if (k->capture(ctx, fn, R, 1)) goto fail;
        double t1 = now();
        if (k->capture(ctx, fn, R, n + 1)) goto fail;
        double t2 = now();
        d[r] = ((t2 - t1) - (t1 - t0)) / n * 1e6;
    }
    qsort(d, 3, sizeof *d, cmp_d);
    return d[1];
fail:
    printf("      (graph capture failed: %s)\n", lucid_ctx_error(ctx));
    lucid_ctx_clear_error(ctx);
    return -1;
}

int main(int argc, char **argv) {
    const int gpu = lucid_cuda_available();
    const int skip_cpu = argc > 1 && strcmp(argv[1], "gpu") == 0;
    lucid_ctx_options opt = lucid_ctx_options_default();
    if (gpu) opt.device = (lucid_device){LUCID_CUDA, 0};
    char err[256];
    if (lucid_ctx_create(&opt, &ctx, err, sizeof err) != LUCID_OK) {
        fprintf(stderr, "bench_optim: context: %s\n", err);
        return 1;
    }
    static layout_info L;
    make_tables(&L);
    if (argc > 1 && strcmp(argv[1], "layout") == 0) {
        /* name, shape, dtype, T/- (trainable), group: compare with the Lua
         * model's ParamSet list (lucid.models.yolo11_pose) */
        static const char *kinds[] = {"decay", "norm", "bias"};
        for (int i = 0; i < nents; i++) {
            const entry *e = &ents[i];
            char sh[64] = "";
            for (int d = 0; d < e->ndim; d++)
                fmt(sh + strlen(sh), sizeof sh - strlen(sh), d ? "x%lld" : "%lld",
                    (long long)e->shape[d]);
            printf("%s\t%s\t%s\t%s\t%s\n", e->name, sh,
                   e->what == E_BUF_I64 ? "i64" : "f32", e->trainable ? "T" : "-",
                   e->what == E_PARAM ? kinds[e->kind] : "none");
        }
        lucid_ctx_release(ctx);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "plan") == 0) {
        lucid_param_layout *pl = NULL;
        if (lucid_param_layout_create(ctx, (lucid_device){LUCID_CPU, 0}, L.plen, L.psegs,
                                      L.np, &pl))
            die("parameter layout");
        double gf = 0, gf_real = 0;
        for (int b = 0; b < pl->nbuckets; b++) {
            const lucid_muon_bucket *k = &pl->buckets_host[b];
            double M = k->M, K = k->K;
            double f = 5.0 * k->count * (4 * M * M * K + 2 * M * M * M) / 1e9;
            gf += f;
            printf("bucket %d: %d x %d, %d matrices, %.3f GFLOP padded:", b, k->M, k->K,
                   k->count, f);
            for (int j = k->first; j < k->first + k->count; j++) {
                const lucid_muon_mat *mt = &pl->mats_host[j];
                double m = mt->m, kk = mt->k;
                gf_real += 5.0 * (4 * m * m * kk + 2 * m * m * m) / 1e9;
                printf(" %dx%d%s", mt->m, mt->k, mt->tr ? "t" : "");
            }
            printf("\n");
        }
        printf("%d Muon matrices in %d buckets: %.2f GFLOP per step (%.2f unpadded); X %lld "
               "elements, A %lld\n",
               pl->nmuon, pl->nbuckets, gf, gf_real, (long long)pl->muon_nx,
               (long long)pl->muon_na);
        lucid_param_layout_release(pl);
        lucid_ctx_release(ctx);
        return 0;
    }
    printf("optimizer step over YOLO11n-pose: %d parameter tensors (%d trainable, "
           "%lld elements, %lld trainable; flat %lld), %d BN buffers (flat %lld "
           "f32), f32 grads\n",
           L.np, L.ntrain, (long long)L.pnumel, (long long)L.ptrain_numel,
           (long long)L.plen, L.nb, (long long)L.blen);
    if (!gpu) printf("(no CUDA device: CPU reference only; the GPU rows and targets are "
                     "SKIPPED)\n");
    if (!skip_cpu) {
        run R;
        setup(&R, (lucid_device){LUCID_CPU, 0}, &L);
        for (int i = 0; i < NROWS; i++) {
            const row *w = &rows[i];
            int reps = w->kind == LUCID_OPTIM_MUSGD && w->fn != h_ema &&
                               w->fn != h_clip && w->fn != h_upload
                           ? CPU_REPS_MUSGD : CPU_REPS;
            R.kind = w->kind;
            if (w->fn(&R)) die("cpu warm-up");
            double t[CPU_REPS];
            for (int r = 0; r < reps; r++) {
                double t0 = now();
                if (w->fn(&R)) die(w->label);
                t[r] = (now() - t0) * 1e6;
            }
            qsort(t, (size_t)reps, sizeof *t, cmp_d);
            printf("  cpu  %-34s %12.1f us (median of %d)\n", w->label, t[reps / 2], reps);
        }
        teardown(&R);
    }
    if (gpu) {
        const lucid_pose_loss_kernels *k = lucid_pose_loss_cuda_kernels();
        if (!k) die("no CUDA timing hook (pose loss kernel table)");
        run R;
        setup(&R, (lucid_device){LUCID_CUDA, 0}, &L);
        for (int i = 0; i < NROWS; i++) {
            const row *w = &rows[i];
            R.kind = w->kind;
            for (int r = 0; r < WARMUP; r++)
                if (w->fn(&R)) die(w->label);
            if (lucid_ctx_synchronize(ctx)) die("synchronize");
            float ms[REPS];
            if (k->time_calls(ctx, w->fn, &R, REPS, ms)) die("timing");
            qsort(ms, REPS, sizeof *ms, cmp_f);
            double med = ms[REPS / 2] * 1e3;
            printf("  cuda %-34s %9.1f us median (min %.1f, p90 %.1f) of %d%s\n",
                   w->label, med, ms[0] * 1e3, ms[REPS * 9 / 10] * 1e3, REPS,
                   verdict(w->target, med));
            if (w->graph) {
                double g = graph_us(k, &R, w->fn, w->kind == LUCID_OPTIM_MUSGD ? 100 : 500);
                if (g >= 0)
                    printf("  cuda %-34s %9.1f us per replay (one CUDA graph)%s\n",
                           "  ... recorded", g, verdict(w->target, g));
            }
        }
        /* the state must still be finite after all those steps */
        lucid_param_values v;
        if (lucid_param_block_read(ctx, R.pb, &v)) die("read block");
        printf("  (block after the runs: step %lld, ema_updates %lld, grad_norm %g, "
               "nonfinite_norms %d)\n",
               (long long)v.st.step, (long long)v.st.ema_updates, v.st.grad_norm,
               v.st.nonfinite_norms);
        if (!(v.st.grad_norm > 0 && v.st.grad_norm < 10) || v.st.nonfinite_norms) {
            fprintf(stderr, "bench_optim: unexpected gradient norm after the runs\n");
            return 1;
        }
        teardown(&R);
    }
    lucid_ctx_release(ctx);
    return 0;
}
