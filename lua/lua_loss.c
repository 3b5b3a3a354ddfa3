/*
 * lua_loss.c — Lua binding of the pose training loss (engine/train/loss.h).
 *
 *   local crit = lucid.PoseLoss{batch=4, imgsz=640, max_gt=64,
 *                               device="cuda", nc=1, kpt_shape={17,3},
 *                               box=7.5, cls=0.5, dfl=1.5, pose=12, kobj=1}
 *   local total, items = crit:forward(pred_box, pred_cls, pred_kpt, targets)
 *   local g_box, g_cls, g_kpt = crit:backward([grad_scale])
 *
 * forward returns device tensors that the criterion owns and reuses:
 * total [1] f32 (the backpropagated loss, batch-scaled as Ultralytics) and
 * items [5] f32 (box, pose, kobj, cls, dfl, gain-scaled, for logging).
 * backward returns the gradients w.r.t. the three outputs, also owned and
 * reused (same shapes and dtype as the outputs), so a recorded step sees
 * the same addresses every time. Nothing is read back to the host.
 */
#include "lua_common.h"
#include "train/loss.h"

#include <string.h>

#define LOSS_MT "lucid.PoseLoss"

typedef struct loss_ud {
    lucid_pose_loss_plan *plan;
    lucid_ctx *ctx;            /* one reference */
    lucid_device device;
    lucid_tensor *total, *items;
    lucid_tensor *grad[3];     /* box, cls, kpt */
    const lucid_tensor *pred_seen[3]; /* identity of the last forward inputs */
    int64_t batch, max_gt;
} loss_ud;

static void loss_release(loss_ud *u) {
    lucid_pose_loss_plan_destroy(u->plan);
    lucid_tensor_release(u->total);
    lucid_tensor_release(u->items);
    for (int i = 0; i < 3; i++) lucid_tensor_release(u->grad[i]);
    if (u->ctx) lucid_ctx_release(u->ctx);
    memset(u, 0, sizeof *u);
}

static loss_ud *check_loss(lua_State *L, int idx) {
    loss_ud *u = lucid_lua_checkudata(L, idx, LOSS_MT);
    if (!u->plan) lucid_lua_argerror(L, idx, "PoseLoss was freed");
    return u;
}

static const char *const LOSS_KEYS[] = {
    "batch", "imgsz", "max_gt", "device", "ctx", "nc", "kpt_shape", "reg_max",
    "topk", "box", "cls", "dfl", "pose", "kobj", "tal_alpha", "tal_beta", NULL};

static double opt_number(lua_State *L, int idx, const char *key, double def) {
    return lucid_lua_opt_number(L, idx, key, def, "PoseLoss");
}

static int opt_int(lua_State *L, int idx, const char *key, int def, int lo) {
    double v = opt_number(L, idx, key, def);
    if (v != (double)(int)v || v < lo)
        luaL_error(L, "PoseLoss: option %s: expected an integer >= %d, got %f",
                   key, lo, v);
    return (int)v;
}

/* lucid.PoseLoss{...}: see the file comment. batch, imgsz and max_gt are
 * required; imgsz is a number (square) or {h, w}, multiples of 32. */
static int l_new(lua_State *L) {
    lucid_lua_checktype(L, 1, LUA_TTABLE);
    lucid_lua_check_options(L, 1, LOSS_KEYS, "PoseLoss");
    lucid_ctx *ctx = lucid_lua_ctx(L, 1);
    lucid_pose_loss_config cfg = lucid_pose_loss_config_default();
    lua_getfield(L, 1, "batch");
    if (lua_isnil(L, -1)) luaL_error(L, "PoseLoss: option batch is required");
    lua_pop(L, 1);
    cfg.batch = opt_int(L, 1, "batch", 0, 1);
    cfg.max_gt = opt_int(L, 1, "max_gt", 64, 1);
    cfg.nc = opt_int(L, 1, "nc", cfg.nc, 1);
    cfg.reg_max = opt_int(L, 1, "reg_max", cfg.reg_max, 1);
    cfg.topk = opt_int(L, 1, "topk", cfg.topk, 1);
    cfg.gain_box = opt_number(L, 1, "box", cfg.gain_box);
    cfg.gain_cls = opt_number(L, 1, "cls", cfg.gain_cls);
    cfg.gain_dfl = opt_number(L, 1, "dfl", cfg.gain_dfl);
    cfg.gain_pose = opt_number(L, 1, "pose", cfg.gain_pose);
    cfg.gain_kobj = opt_number(L, 1, "kobj", cfg.gain_kobj);
    cfg.tal_alpha = opt_number(L, 1, "tal_alpha", cfg.tal_alpha);
    cfg.tal_beta = opt_number(L, 1, "tal_beta", cfg.tal_beta);
    lua_getfield(L, 1, "kpt_shape");
    if (!lua_isnil(L, -1)) {
        lucid_lua_argcheck(L, lua_istable(L, -1), 1, "kpt_shape: expected {K, 3}");
        lua_rawgeti(L, -1, 1);
        lua_rawgeti(L, -2, 2);
        int k = (int)lua_tointeger(L, -2), d = (int)lua_tointeger(L, -1);
        if (k < 1 || d != 3)
            luaL_error(L, "PoseLoss: kpt_shape must be {K, 3} with K >= 1 (got "
                          "{%d, %d}); keypoints carry a visibility",
                       k, d);
        cfg.nkpt = k;
        lua_pop(L, 2);
    }
    lua_pop(L, 1);
    int img_h = 0, img_w = 0;
    lua_getfield(L, 1, "imgsz");
    if (lua_type(L, -1) == LUA_TNUMBER) {
        img_h = img_w = (int)lua_tointeger(L, -1);
    } else if (lua_istable(L, -1)) {
        lua_rawgeti(L, -1, 1);
        lua_rawgeti(L, -2, 2);
        img_h = (int)lua_tointeger(L, -2);
        img_w = (int)lua_tointeger(L, -1);
        lua_pop(L, 2);
    }
    lua_pop(L, 1);
    if (img_h < 32 || img_w < 32 || img_h % 32 || img_w % 32)
        luaL_error(L, "PoseLoss: imgsz must be multiples of 32 (got %d x %d)",
                   img_h, img_w);
    lucid_pose_loss_config_levels(&cfg, img_h, img_w);
    /* default device as for tensors: the CPU, or the device of an explicit ctx */
    lucid_device dev = {LUCID_CPU, 0};
    lua_getfield(L, 1, "ctx");
    if (!lua_isnil(L, -1)) dev = lucid_ctx_device(ctx);
    lua_pop(L, 1);
    dev = lucid_lua_opt_device(L, 1, "device", dev);

    loss_ud *u = lua_newuserdata(L, sizeof *u);
    memset(u, 0, sizeof *u);
    luaL_getmetatable(L, LOSS_MT);
    lua_setmetatable(L, -2);
    lua_newtable(L); /* environment: the outputs of the last forward */
    lua_setfenv(L, -2);
    u->device = dev;
    u->batch = cfg.batch;
    u->max_gt = cfg.max_gt;
    lucid_status s = lucid_pose_loss_plan_create(ctx, dev, &cfg, &u->plan);
    int64_t one = 1, five = LUCID_POSE_LOSS_NITEMS;
    if (s == LUCID_OK)
        s = lucid_tensor_zeros(ctx, dev, LUCID_F32, 1, &one, &u->total);
    if (s == LUCID_OK)
        s = lucid_tensor_zeros(ctx, dev, LUCID_F32, 1, &five, &u->items);
    if (s != LUCID_OK) {
        loss_release(u);
        return lucid_lua_raise(L, ctx, s);
    }
    lucid_ctx_retain(ctx);
    u->ctx = ctx;
    return 1;
}

static const lucid_tensor *target_field(lua_State *L, int idx, const char *key,
                                        int required) {
    lua_getfield(L, idx, key);
    const lucid_tensor *t = NULL;
    if (!lua_isnil(L, -1)) {
        t = lucid_lua_to_tensor(L, -1);
        if (!t)
            luaL_error(L, "PoseLoss:forward: targets.%s: expected lucid.Tensor, "
                          "got %s",
                       key, luaL_typename(L, -1));
    } else if (required) {
        luaL_error(L, "PoseLoss:forward: targets.%s is missing", key);
    }
    lua_pop(L, 1); /* the targets table keeps the userdata alive */
    return t;
}

/* crit:forward(pred_box, pred_cls, pred_kpt, targets) -> total, items.
 * pred_*: [B, 4*reg_max, A], [B, nc, A], [B, K*3, A] on the criterion's
 * device; targets: {cls=[B,G], boxes=[B,G,4], kpts=[B,G,K,3], mask=[B,G]}. */
static int l_forward(lua_State *L) {
    loss_ud *u = check_loss(L, 1);
    const lucid_tensor *pb = lucid_lua_check_tensor(L, 2, "pred_box");
    const lucid_tensor *pc = lucid_lua_check_tensor(L, 3, "pred_cls");
    const lucid_tensor *pk = lucid_lua_check_tensor(L, 4, "pred_kpt");
    lucid_lua_checktype(L, 5, LUA_TTABLE);
    lucid_pose_targets tg;
    tg.cls = target_field(L, 5, "cls", 1);
    tg.boxes = target_field(L, 5, "boxes", 1);
    tg.kpts = target_field(L, 5, "kpts", 1);
    tg.valid = target_field(L, 5, "mask", 1);
    lucid_status s = lucid_pose_loss_forward(u->ctx, u->plan, pb, pc, pk, &tg,
                                             u->total, u->items);
    if (s != LUCID_OK) return lucid_lua_raise(L, u->ctx, s);
    u->pred_seen[0] = pb;
    u->pred_seen[1] = pc;
    u->pred_seen[2] = pk;
    /* keep the outputs alive and findable for backward: the userdata's
     * environment table holds them */
    lua_getfenv(L, 1);
    for (int i = 0; i < 3; i++) {
        lua_pushvalue(L, 2 + i);
        lua_rawseti(L, -2, i + 1);
    }
    lua_pop(L, 1);
    lucid_tensor_retain(u->total);
    lucid_lua_push_tensor(L, u->total);
    lucid_tensor_retain(u->items);
    lucid_lua_push_tensor(L, u->items);
    return 2;
}

/* Reuse a gradient buffer while its shape and dtype still match. */
static lucid_status ensure_grad(lucid_ctx *ctx, lucid_tensor **g,
                                const lucid_tensor *like) {
    if (*g && (*g)->dtype == like->dtype && lucid_tensor_same_shape(*g, like))
        return LUCID_OK;
    lucid_tensor_release(*g);
    *g = NULL;
    return lucid_tensor_empty(ctx, lucid_tensor_device(like), like->dtype,
                              like->ndim, like->shape, g);
}

/* crit:backward([grad_scale]) -> grad_box, grad_cls, grad_kpt.
 * Uses the outputs of the last forward. grad_scale: optional 1-element
 * device tensor multiplying the gradients (the fp16 loss scale). */
static int l_backward(lua_State *L) {
    loss_ud *u = check_loss(L, 1);
    const lucid_tensor *gs = lua_isnoneornil(L, 2) ? NULL
                                                    : lucid_lua_check_tensor(L, 2, "grad_scale");
    const lucid_tensor *pred[3];
    lua_getfenv(L, 1);
    int env = lua_gettop(L);
    for (int i = 0; i < 3; i++) {
        lua_rawgeti(L, env, i + 1);
        pred[i] = lucid_lua_to_tensor(L, -1);
        lua_pop(L, 1);
        if (!pred[i] || pred[i] != u->pred_seen[i])
            luaL_error(L, "PoseLoss:backward: call forward first (or the outputs "
                          "of the last forward were freed)");
    }
    lucid_status s = LUCID_OK;
    for (int i = 0; i < 3 && s == LUCID_OK; i++) s = ensure_grad(u->ctx, &u->grad[i], pred[i]);
    if (s == LUCID_OK)
        s = lucid_pose_loss_backward(u->ctx, u->plan, pred[0], pred[1], pred[2], gs,
                                     u->grad[0], u->grad[1], u->grad[2]);
    if (s != LUCID_OK) return lucid_lua_raise(L, u->ctx, s);
    for (int i = 0; i < 3; i++) {
        lucid_tensor_retain(u->grad[i]);
        lucid_lua_push_tensor(L, u->grad[i]);
    }
    return 3;
}

/* crit:assignment() -> {gt_index = {...}, n_fg = n, target_scores_sum = x}
 * (reads the last assignment back: synchronises; for tests and plots). */
static int l_assignment(lua_State *L) {
    loss_ud *u = check_loss(L, 1);
    int A = lucid_pose_loss_plan_anchors(u->plan);
    size_t n = (size_t)u->batch * (size_t)A;
    int32_t *idx = lua_newuserdata(L, n * sizeof *idx);
    double nfg = 0, tss = 0;
    lucid_status s = lucid_pose_loss_read_assignment(u->ctx, u->plan, idx, NULL, &nfg, &tss);
    if (s != LUCID_OK) return lucid_lua_raise(L, u->ctx, s);
    lua_createtable(L, 0, 3);
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        lua_pushinteger(L, idx[i]);
        lua_rawseti(L, -2, (int)i + 1);
    }
    lua_setfield(L, -2, "gt_index");
    lua_pushnumber(L, nfg);
    lua_setfield(L, -2, "n_fg");
    lua_pushnumber(L, tss);
    lua_setfield(L, -2, "target_scores_sum");
    return 1;
}

static int l_free(lua_State *L) {
    loss_ud *u = lucid_lua_checkudata(L, 1, LOSS_MT);
    loss_release(u);
    return 0;
}

static int l_tostring(lua_State *L) {
    loss_ud *u = lucid_lua_checkudata(L, 1, LOSS_MT);
    if (!u->plan) {
        lua_pushstring(L, "PoseLoss(freed)");
        return 1;
    }
    lua_pushfstring(L, "PoseLoss(batch=%d, max_gt=%d, anchors=%d, device=%s)",
                    (int)u->batch, (int)u->max_gt,
                    lucid_pose_loss_plan_anchors(u->plan),
                    u->device.type == LUCID_CPU ? "cpu" : "cuda");
    return 1;
}

int lucid_lua_open_loss(lua_State *L) {
    static const luaL_Reg methods[] = {{"forward", l_forward},
                                       {"backward", l_backward},
                                       {"assignment", l_assignment},
                                       {"free", l_free},
                                       {NULL, NULL}};
    lucid_lua_register_class(L, LOSS_MT, methods, l_free, l_tostring);
    lua_pushcfunction(L, l_new);
    lua_setfield(L, -2, "PoseLoss");
    return 0;
}
