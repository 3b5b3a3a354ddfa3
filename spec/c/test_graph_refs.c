/*
 * test_graph_refs.c — the recording references of engine/train/graph.h on
 * the CPU (no graphs needed): what lucid_graph_refs_check reports for the
 * changes a recorded step must see, and what it lets through.
 *
 * quick() (the O(1) test before a replay) and check() (what moved, why).
 * Modes (an exact count kept by the modules' setters): a mode switched and
 * back is no change and moves nothing (quick() stays yes); a mode or
 * need_grad_input left changed is, naming the module; two reference sets
 * on one module count apart, and a released one is unlinked. Entries
 * (through the contract epoch, which every set version bump moves): a
 * trainable flag changed is, with the parameter pass; a version bump with
 * every field equal (values rewritten in place) is not; all_entries forces
 * the pass. Watched parameter-block inputs: EMA decay/tau and ns_bf16
 * changes are, on the watched block only. Restore reinstalls a reallocated
 * module buffer.
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

static void expect_quick(const char *name, const lucid_graph_refs *r, int want) {
    int q = lucid_graph_refs_quick(r);
    CHECK(name, q == want, "quick() %d, want %d", q, want);
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

    expect_quick("refs: created: quick() says unchanged", r, 1);
    expect("refs: nothing moved: unchanged, nothing reported moved", r, 0, 0, "");

    /* a mode round trip (validation's eval/train): the count goes 1, then 0 */
    uint64_t ep = lucid_contract_epoch();
    lucid_module_set_training(m[1], 0);
    expect_quick("refs: a mode switched: quick() says moved", r, 0);
    lucid_module_set_training(m[1], 1);
    CHECK("refs: a module's mode does not move the contract epoch", lucid_contract_epoch() == ep,
          "moved");
    expect_quick("refs: ... and back: quick() says unchanged (exact count, no pass)", r, 1);
    expect("refs: a mode switched and back: unchanged, nothing moved", r, 0, 0, "");

    /* a mode left changed */
    lucid_module_set_training(m[1], 0);
    expect("refs: a mode left changed: changed, naming the module", r, 1,
           LUCID_GRAPH_MOVED_MODES, "model.0.bn (BatchNorm2d): mode train -> eval");
    lucid_module_set_training(m[1], 0); /* the same again: no count */
    lucid_module_set_training(m[1], 1);
    expect_quick("refs: set back: quick() says unchanged", r, 1);
    expect("refs: set back: unchanged again", r, 0, 0, "");
    lucid_module_set_need_grad_input(m[0], 0);
    expect_quick("refs: need_grad_input switched: quick() says moved", r, 0);
    expect("refs: need_grad_input left changed: changed", r, 1, LUCID_GRAPH_MOVED_MODES,
           "need_grad_input 1 -> 0");
    lucid_module_set_need_grad_input(m[0], 1);
    expect("refs: need_grad_input set back: unchanged", r, 0, 0, "");

    /* two reference sets on one module count apart; a released one is unlinked */
    lucid_graph_refs *r2 = NULL;
    lucid_module_set_training(m[1], 0);
    st = lucid_graph_refs_create(ctx, set, 2, m, &r2); /* records m[1] in eval */
    CHECK_STATUS("refs: a second set over the same modules", ctx, st);
    if (st) return;
    expect_quick("refs: the first sees the eval mode", r, 0);
    expect_quick("refs: the second recorded it", r2, 1);
    lucid_module_set_training(m[1], 1);
    expect_quick("refs: back to train: the first is clean", r, 1);
    expect_quick("refs: ... the second sees it", r2, 0);
    lucid_graph_refs_release(r2);
    lucid_module_set_training(m[1], 0);
    lucid_module_set_training(m[1], 1);
    CHECK("refs: a released set is unlinked from its modules", m[1]->watchers &&
          !m[1]->watchers->next && lucid_graph_refs_quick(r), "watchers %p", (void *)m[1]->watchers);

    /* the contract epoch: anything it stands for sends quick() to check() */
    lucid_contract_bump();
    expect_quick("refs: the contract epoch moved: quick() says moved", r, 0);
    expect("refs: ... check() finds nothing of this set: unchanged, refreshed", r, 0,
           LUCID_GRAPH_MOVED_EPOCH, "");
    expect_quick("refs: ... quick() says unchanged again", r, 1);

    /* entries (every set version bump moves the contract epoch) */
    lucid_param *w = lucid_param_set_find(set, "model.0.conv.weight");
    ep = lucid_contract_epoch();
    lucid_param_set_trainable(ctx, set, w, 0);
    CHECK("refs: a set version bump moves the contract epoch", lucid_contract_epoch() > ep, "not moved");
    expect_quick("refs: a frozen parameter: quick() says moved", r, 0);
    expect("refs: a frozen parameter: changed, after the parameter pass", r, 1,
           LUCID_GRAPH_MOVED_PARAMS | LUCID_GRAPH_MOVED_EPOCH, "model.0.conv.weight: trainable 1 -> 0");
    lucid_param_set_trainable(ctx, set, w, 1);
    expect("refs: unfrozen again: every field equal, unchanged (refreshed)", r, 0,
           LUCID_GRAPH_MOVED_PARAMS | LUCID_GRAPH_MOVED_EPOCH, "");
    lucid_param_set_trainable(ctx, set, w, 1); /* the same again: nothing moves */
    expect_quick("refs: a trainable flag set to what it was: quick() says unchanged", r, 1);
    st = lucid_param_set_reset(ctx, set);
    expect("refs: values rewritten in place (set version bumped): unchanged", r, 0,
           LUCID_GRAPH_MOVED_PARAMS | LUCID_GRAPH_MOVED_EPOCH, "");
    expect("refs: ... and refreshed", r, 0, 0, "");
    int mv = 0;
    char why0[64];
    int c0 = lucid_graph_refs_check_ex(r, 1, why0, sizeof why0, &mv);
    CHECK("refs: check_ex(all_entries): the parameter pass without a version move", c0 == 0 &&
          mv == LUCID_GRAPH_MOVED_PARAMS, "changed %d moved %d", c0, mv);

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
    expect_quick("refs: EMA decay changed: quick() says moved", r, 0);
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
    expect_quick("refs: ns_bf16 watched and changed: quick() says moved", r, 0);
    expect("refs: ns_bf16 watched and changed: changed", r, 1, 0, "ns_bf16");
    lucid_param_block_staging(pb)->ns_bf16 = 1;
    expect_quick("refs: ns_bf16 back: quick() says unchanged", r, 1);
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
