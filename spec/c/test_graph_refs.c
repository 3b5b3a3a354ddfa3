/*
 * test_graph_refs.c — the recording references of engine/train/graph.h on
 * the CPU (no graphs needed): what lucid_graph_refs_check reports for the
 * changes a recorded step must see, and what it lets through.
 *
 * Modes: a mode switched and back is no change (and no parameter pass);
 * a mode or need_grad_input left changed is, naming the module. Entries:
 * a trainable flag changed is, with the parameter pass; a version bump
 * with every field equal (values rewritten in place) is not. Watched
 * parameter-block inputs: EMA decay/tau and ns_bf16 changes are, on the
 * watched block only. Restore reinstalls a reallocated module buffer.
 */
#define TEST_NN_SEED 0x51ed2701f3a4c9b5ull
#include "test_nn_util.h"
#include "train/graph.h"
#include "train/optim.h"

/* check r; expect `changed` (0/1), the moved bits `moved` and, when
 * changed, `reason` inside the message */
static void expect(const char *name, lucid_graph_refs *r, int changed, int moved,
                   const char *reason) {
    char why[256];
    int mv = -1;
    int c = lucid_graph_refs_check(r, why, sizeof why, &mv);
    int ok = c == changed && mv == moved && (!changed || strstr(why, reason) != NULL);
    CHECK(name, ok, "changed %d (want %d), moved %d (want %d), why '%s'", c, changed, mv,
          moved, why);
}

static void test_refs(void) {
    lucid_param_set *set = NULL;
    lucid_module *m[2] = {0};
    lucid_status st = lucid_param_set_create(ctx, &set);
    if (!st) st = lucid_module_conv2d_create(ctx, set, "model.0.conv", 3, 8, 3, 1, -1, 1, 1, 0, &m[0]);
    if (!st) st = lucid_module_batchnorm2d_create(ctx, set, "model.0.bn", 8, 1e-3, 0.03, &m[1]);
    if (!st) st = lucid_param_set_materialize(ctx, set, CPU, LUCID_F32);
    lucid_tensor *x = mk4(LUCID_F32, 1, 3, 6, 6), *y = NULL, *z = NULL;
    fill_rand(x, -1, 1);
    if (!st) st = lucid_module_forward1(ctx, m[0], x, &y);
    if (!st) st = lucid_module_forward1(ctx, m[1], y, &z);
    lucid_graph_refs *r = NULL;
    if (!st) st = lucid_graph_refs_create(ctx, set, 2, m, &r);
    CHECK_STATUS("refs: created over a conv + BN and their parameter set", ctx, st);
    if (st) return;

    expect("refs: nothing moved: unchanged, nothing reported moved", r, 0, 0, "");

    /* a mode round trip (validation's eval/train) */
    lucid_module_set_training(m[1], 0);
    lucid_module_set_training(m[1], 1);
    expect("refs: a mode switched and back: unchanged, the module pass only (no parameter pass)",
           r, 0, LUCID_GRAPH_MOVED_MODULES, "");
    expect("refs: ... and refreshed: nothing moved on the next check", r, 0, 0, "");

    /* a mode left changed */
    lucid_module_set_training(m[1], 0);
    expect("refs: a mode left changed: changed, naming the module", r, 1,
           LUCID_GRAPH_MOVED_MODULES, "model.0.bn (BatchNorm2d): mode train -> eval");
    lucid_module_set_training(m[1], 1);
    expect("refs: set back: unchanged again", r, 0, LUCID_GRAPH_MOVED_MODULES, "");
    lucid_module_set_need_grad_input(m[0], 0);
    expect("refs: need_grad_input left changed: changed", r, 1, LUCID_GRAPH_MOVED_MODULES,
           "need_grad_input 1 -> 0");
    lucid_module_set_need_grad_input(m[0], 1);
    expect("refs: need_grad_input set back: unchanged", r, 0, LUCID_GRAPH_MOVED_MODULES, "");

    /* entries */
    lucid_param *w = lucid_param_set_find(set, "model.0.conv.weight");
    lucid_param_set_trainable(ctx, set, w, 0);
    expect("refs: a frozen parameter: changed, after the parameter pass", r, 1,
           LUCID_GRAPH_MOVED_PARAMS, "model.0.conv.weight: trainable 1 -> 0");
    lucid_param_set_trainable(ctx, set, w, 1);
    expect("refs: unfrozen again: every field equal, unchanged (refreshed)", r, 0,
           LUCID_GRAPH_MOVED_PARAMS, "");
    st = lucid_param_set_reset(ctx, set);
    expect("refs: values rewritten in place (set version bumped): unchanged", r, 0,
           LUCID_GRAPH_MOVED_PARAMS, "");
    expect("refs: ... and refreshed", r, 0, 0, "");

    /* watched parameter-block inputs */
    lucid_param_block *pb = NULL, *other = NULL;
    st = lucid_param_block_create(ctx, CPU, NULL, &pb);
    if (!st) st = lucid_param_block_create(ctx, CPU, NULL, &other);
    if (!st) st = lucid_graph_refs_watch_block(ctx, r, pb, LUCID_GRAPH_WATCH_EMA);
    CHECK_STATUS("refs: watch a block's EMA decay/tau", ctx, st);
    if (st) goto out;
    expect("refs: watched, nothing moved: unchanged", r, 0, 0, "");
    char why[64];
    CHECK("refs: check_watched alone: unchanged", !lucid_graph_refs_check_watched(r, why, sizeof why),
          "%s", why);
    lucid_param_block_staging(pb)->ema_decay = 0.999;
    expect("refs: EMA decay changed: changed", r, 1, 0, "EMA decay/tau changed");
    CHECK("refs: check_watched alone sees it too", lucid_graph_refs_check_watched(r, why, sizeof why) &&
          strstr(why, "EMA"), "%s", why);
    lucid_param_block_staging(pb)->ema_decay = 0.9999;
    lucid_param_block_staging(pb)->ema_tau = 1000;
    expect("refs: EMA tau changed: changed", r, 1, 0, "EMA decay/tau changed");
    lucid_param_block_staging(pb)->ema_tau = 2000;
    lucid_param_block_staging(pb)->ns_bf16 = 0;
    expect("refs: ns_bf16 not watched yet: unchanged", r, 0, 0, "");
    lucid_param_block_staging(pb)->ns_bf16 = 1;
    lucid_param_block_staging(other)->ema_decay = 0.5;
    expect("refs: another block's EMA decay: unchanged", r, 0, 0, "");
    st = lucid_graph_refs_watch_block(ctx, r, pb, LUCID_GRAPH_WATCH_NS_BF16);
    lucid_param_block_staging(pb)->ns_bf16 = 0;
    expect("refs: ns_bf16 watched and changed: changed", r, 1, 0, "ns_bf16");
    lucid_param_block_staging(pb)->ns_bf16 = 1;
    CHECK("refs: watch_block refuses unknown bits",
          lucid_graph_refs_watch_block(ctx, r, pb, 8) == LUCID_ERR_ARG, "accepted");
    /* the refs hold the block: released by the caller first, still readable */
    lucid_param_block_release(pb);
    pb = NULL;
    expect("refs: the watched block outlives its caller's reference", r, 0, 0, "");

    /* restore: a module buffer reallocated by another shape comes back */
    lucid_tensor *y0 = y, *x2 = mk4(LUCID_F32, 2, 3, 6, 6), *y2 = NULL;
    fill_rand(x2, -1, 1);
    st = lucid_module_forward1(ctx, m[0], x2, &y2);
    int n = lucid_graph_refs_restore(r);
    CHECK("refs: restore reinstalls the recorded output", st == LUCID_OK && y2 != y0 && n >= 1 &&
          lucid_module_output(m[0], 0) == y0, "n %d", n);
    lucid_tensor_release(x2);
out:
    lucid_param_block_release(pb);
    lucid_param_block_release(other);
    lucid_graph_refs_release(r);
    lucid_tensor_release(x);
    lucid_module_release(m[0]);
    lucid_module_release(m[1]);
    lucid_param_set_release(set);
}

int main(void) {
    lucid_ctx_options o = lucid_ctx_options_default();
    char err[256];
    if (lucid_ctx_create(&o, &ctx, err, sizeof err) != LUCID_OK) {
        printf("not ok context: %s\n", err);
        return 1;
    }
    test_refs();
    lucid_ctx_release(ctx);
    return test_exit();
}
