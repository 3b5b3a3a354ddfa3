/*
 * lua_predict.c — the validator's head decoding + NMS for prediction
 * (engine/eval/eval.h lucid_eval_decode_nms), as a function.
 *
 *   local dets = lucid.eval.decode_nms(pred_box, pred_cls, pred_kpt,
 *                  {imgsz = 640, conf = 0.25, iou = 0.7, max_det = 300,
 *                   image = 1, reg_max = 16, max_nms = 30000})
 *
 * pred_box [B, 4*reg_max, A], pred_cls [B, nc, A], pred_kpt [B, K*3, A]
 * (or nil for a detection model) — the Pose head's outputs ({boxes, scores,
 * kpts}); [C, A] without the batch dim is accepted too. Any dtype/device:
 * they are converted to contiguous f32 on the CPU here when needed. The
 * anchors are the levels imgsz/8, /16, /32 (imgsz a number, or {h, w});
 * A must match. `image` picks the batch entry (1-based, default 1).
 * Returns the detections of that image sorted by confidence, in pixels of
 * the network input, as val:detections does:
 *   { {box = {x1, y1, x2, y2}, conf =, cls = (0-based), kpts = {x, y, v, ...}}, ... }
 */
#include "lua_common.h"
#include "eval/eval.h"

#include <stdlib.h>
#include <string.h>

/* A contiguous f32 CPU version of t: t itself (retained) or a converted
 * copy. NULL with *st set on failure. */
static lucid_tensor *as_host_f32(lucid_ctx *ctx, lucid_tensor *t, lucid_status *st) {
    if (t->dtype == LUCID_F32 && lucid_tensor_device(t).type == LUCID_CPU &&
        lucid_tensor_is_contiguous(t)) {
        lucid_tensor_retain(t);
        *st = LUCID_OK;
        return t;
    }
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_tensor *out = NULL;
    *st = lucid_tensor_to(ctx, t, cpu, LUCID_F32, &out);
    return *st == LUCID_OK ? out : NULL;
}

static double opt_num(lua_State *L, int idx, const char *k, double def) {
    return lucid_lua_opt_number(L, idx, k, def, "lucid.eval.decode_nms");
}

static const char *const KEYS[] = {"imgsz", "conf", "iou", "max_det", "max_nms",
                                   "image", "reg_max", NULL};

static int l_decode_nms(lua_State *L) {
    lucid_tensor *tb = lucid_lua_check_tensor(L, 1, "pred_box");
    lucid_tensor *tc = lucid_lua_check_tensor(L, 2, "pred_cls");
    lucid_tensor *tk = lua_isnoneornil(L, 3) ? NULL : lucid_lua_check_tensor(L, 3, "pred_kpt");
    lucid_lua_checktype(L, 4, LUA_TTABLE);
    lua_pushnil(L);
    while (lua_next(L, 4)) {
        lua_pop(L, 1);
        int ok = 0;
        for (int i = 0; KEYS[i]; i++)
            if (lua_type(L, -1) == LUA_TSTRING && !strcmp(KEYS[i], lua_tostring(L, -1))) ok = 1;
        if (!ok)
            luaL_error(L, "lucid.eval.decode_nms: unknown option '%s' (expected imgsz, conf, "
                          "iou, max_det, max_nms, image, reg_max)",
                       lua_tostring(L, -1));
    }
    int ih, iw;
    lua_getfield(L, 4, "imgsz");
    if (lua_istable(L, -1)) {
        lua_rawgeti(L, -1, 1);
        lua_rawgeti(L, -2, 2);
        ih = (int)lucid_lua_checkinteger(L, -2);
        iw = (int)lucid_lua_checkinteger(L, -1);
        lua_pop(L, 2);
    } else if (lua_type(L, -1) == LUA_TNUMBER) {
        ih = iw = (int)lua_tointeger(L, -1);
    } else {
        return luaL_error(L, "lucid.eval.decode_nms: option 'imgsz' is required (a number or "
                             "{h, w})");
    }
    lua_pop(L, 1);
    if (ih < 32 || iw < 32 || ih % 32 || iw % 32)
        luaL_error(L, "lucid.eval.decode_nms: imgsz must be multiples of 32, got %d x %d", ih,
                   iw);
    lucid_nms_opts nms = lucid_nms_opts_default();
    nms.conf_thres = (float)opt_num(L, 4, "conf", 0.25);
    nms.iou_thres = (float)opt_num(L, 4, "iou", 0.7);
    nms.max_det = lucid_lua_opt_int(L, 4, "max_det", 300, "lucid.eval.decode_nms");
    nms.max_nms = lucid_lua_opt_int(L, 4, "max_nms", nms.max_nms, "lucid.eval.decode_nms");
    int reg_max = (int)opt_num(L, 4, "reg_max", 16);
    int image = (int)opt_num(L, 4, "image", 1);
    if (nms.max_det < 1) luaL_error(L, "lucid.eval.decode_nms: max_det must be >= 1");

    /* shapes: [B, C, A] or [C, A] */
    int batched = tb->ndim == 3;
    if (tb->ndim != 2 + batched || tc->ndim != tb->ndim || (tk && tk->ndim != tb->ndim))
        luaL_error(L, "lucid.eval.decode_nms: expected [B,C,A] (or [C,A]) head outputs, got "
                      "%d, %d and %d dims",
                   tb->ndim, tc->ndim, tk ? tk->ndim : 0);
    int64_t B = batched ? tb->shape[0] : 1;
    int64_t A = tb->shape[tb->ndim - 1];
    int nc = (int)tc->shape[tc->ndim - 2];
    int K = tk ? (int)(tk->shape[tk->ndim - 2] / 3) : 0;
    if (tb->shape[tb->ndim - 2] != 4 * reg_max)
        luaL_error(L, "lucid.eval.decode_nms: pred_box has %d channels, expected 4*reg_max = %d",
                   (int)tb->shape[tb->ndim - 2], 4 * reg_max);
    if (tc->shape[tc->ndim - 1] != A || (tk && tk->shape[tk->ndim - 1] != A) ||
        (batched && (tc->shape[0] != B || (tk && tk->shape[0] != B))))
        luaL_error(L, "lucid.eval.decode_nms: head outputs disagree on batch or anchors");
    if (tk && tk->shape[tk->ndim - 2] % 3)
        luaL_error(L, "lucid.eval.decode_nms: pred_kpt channels %d are not K*3",
                   (int)tk->shape[tk->ndim - 2]);
    lucid_anchor_level lv[3];
    int64_t want = 0;
    for (int l = 0; l < 3; l++) {
        int s = 8 << l;
        lv[l].h = ih / s;
        lv[l].w = iw / s;
        lv[l].stride = (float)s;
        want += (int64_t)lv[l].h * lv[l].w;
    }
    if (want != A)
        luaL_error(L, "lucid.eval.decode_nms: %d anchors, but imgsz %d x %d has %d (strides 8, "
                      "16, 32)",
                   (int)A, ih, iw, (int)want);
    if (image < 1 || image > B)
        luaL_error(L, "lucid.eval.decode_nms: image %d outside 1..%d", image, (int)B);

    /* at most one detection per anchor survives NMS: a larger max_det keeps
     * the same ones, and the buffers below hold max_det detections */
    if (nms.max_det > A) nms.max_det = (int)A;
    lucid_ctx *ctx = lucid_tensor_ctx(tb);
    lucid_status st = LUCID_OK;
    lucid_tensor *hb = NULL, *hc = NULL, *hk = NULL;
    hb = as_host_f32(ctx, tb, &st);
    if (st == LUCID_OK) hc = as_host_f32(ctx, tc, &st);
    if (st == LUCID_OK && tk) hk = as_host_f32(ctx, tk, &st);
    void *scratch = NULL;
    lucid_det *dets = NULL;
    float *kout = NULL;
    if (st == LUCID_OK) {
        scratch = malloc(lucid_eval_scratch_bytes((int)A, nc, K));
        dets = malloc(sizeof *dets * (size_t)nms.max_det);
        kout = malloc(sizeof *kout * ((size_t)nms.max_det * (K ? K * 3 : 1)));
    }
    int n = -1;
    if (st == LUCID_OK && scratch && dets && kout) {
        size_t i = (size_t)(image - 1);
        const float *pb = (const float *)lucid_tensor_data(hb) + i * 4 * reg_max * A;
        const float *pc = (const float *)lucid_tensor_data(hc) + i * nc * A;
        const float *pk = hk ? (const float *)lucid_tensor_data(hk) + i * 3 * K * A : NULL;
        n = lucid_eval_decode_nms(pb, pc, pk, (int)A, reg_max, nc, K, lv, 3, &nms, scratch,
                                  dets, kout);
    }
    if (hb) lucid_tensor_release(hb);
    if (hc) lucid_tensor_release(hc);
    if (hk) lucid_tensor_release(hk);
    free(scratch);
    if (st != LUCID_OK || n < 0) {
        free(dets);
        free(kout);
        if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
        return luaL_error(L, "lucid.eval.decode_nms: out of memory or bad arguments");
    }
    /* push (no raise below except on Lua memory exhaustion) */
    lua_createtable(L, n, 0);
    for (int k = 0; k < n; k++) {
        lua_createtable(L, 0, 4);
        lua_createtable(L, 4, 0);
        for (int j = 0; j < 4; j++) {
            lua_pushnumber(L, dets[k].box[j]);
            lua_rawseti(L, -2, j + 1);
        }
        lua_setfield(L, -2, "box");
        lua_pushnumber(L, dets[k].conf);
        lua_setfield(L, -2, "conf");
        lua_pushinteger(L, dets[k].cls);
        lua_setfield(L, -2, "cls");
        if (K && dets[k].kpts) {
            lua_createtable(L, 3 * K, 0);
            for (int j = 0; j < 3 * K; j++) {
                lua_pushnumber(L, dets[k].kpts[j]);
                lua_rawseti(L, -2, j + 1);
            }
            lua_setfield(L, -2, "kpts");
        }
        lua_rawseti(L, -2, k + 1);
    }
    free(dets);
    free(kout);
    return 1;
}

/* Adds lucid.eval.decode_nms to the module table on top of the stack. */
int lucid_lua_open_predict(lua_State *L) {
    int module = lua_gettop(L);
    lua_getfield(L, module, "eval");
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        lua_newtable(L);
    }
    lua_pushcfunction(L, l_decode_nms);
    lua_setfield(L, -2, "decode_nms");
    lua_setfield(L, module, "eval");
    return 0;
}
