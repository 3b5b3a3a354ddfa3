/*
 * lua_eval.c — Lua binding of the pose validator (engine/eval/eval.h).
 *
 *   local val = lucid.PoseValidator{imgsz=640, nc=1, kpt_shape={17,3},
 *                                   conf=0.001, iou=0.7, max_det=300,
 *                                   ap="coco",      -- or "ultralytics"
 *                                   threads=0,      -- images of a batch in
 *                                                   -- parallel (0: the
 *                                                   -- context's CPU threads)
 *                                   reference=false} -- true: the plain path
 *   val:add_batch(pred_box, pred_cls, pred_kpt, targets, n_images)
 *   local m = val:compute()  -- {box={precision=, recall=, map50=,
 *                            --  map50_95=}, pose={...}, images=, fitness=}
 *   local dets = val:detections(i) -- image i (1-based) of the last batch
 *   local t = val:timings()  -- stage times since the last reset
 *   local text, n = val:coco_json(i, image_id, geometry) -- COCO results JSON
 *
 * Head outputs and targets must be contiguous f32 CPU tensors (convert
 * device outputs with :to("cpu", "f32") first). Coordinates are pixels of
 * the imgsz x imgsz network input; targets are normalised to it.
 */
#include "lua_common.h"
#include "eval/eval.h"

#include <stdlib.h>
#include <string.h>

#define VAL_MT "lucid.PoseValidator"

typedef struct val_ud {
    lucid_pose_val *val;
    lucid_ctx *ctx;
    int nkpt;
    float img;
} val_ud;

static val_ud *check_val(lua_State *L, int idx) {
    val_ud *u = lucid_lua_checkudata(L, idx, VAL_MT);
    if (!u->val) lucid_lua_argerror(L, idx, "PoseValidator was freed");
    return u;
}

static double num_field(lua_State *L, int idx, const char *key, double def) {
    return lucid_lua_opt_number(L, idx, key, def, "PoseValidator");
}

static const char *const VAL_KEYS[] = {"imgsz", "nc", "kpt_shape", "reg_max", "conf",
                                       "iou", "max_det", "ap", "reference", "threads",
                                       "ctx", NULL};

/* lucid.PoseValidator{...} (see the file comment). imgsz is required and a
 * multiple of 32; the anchor levels are imgsz/8, /16, /32. */
static int l_new(lua_State *L) {
    lucid_lua_checktype(L, 1, LUA_TTABLE);
    lucid_lua_check_options(L, 1, VAL_KEYS, "PoseValidator");
    lucid_ctx *ctx = lucid_lua_ctx(L, 1);
    lucid_pose_val_config cfg;
    memset(&cfg, 0, sizeof cfg);
    int imgsz = (int)num_field(L, 1, "imgsz", 0);
    if (imgsz < 32 || imgsz % 32)
        luaL_error(L, "PoseValidator: imgsz must be a multiple of 32, got %d", imgsz);
    cfg.nc = (int)num_field(L, 1, "nc", 1);
    cfg.reg_max = (int)num_field(L, 1, "reg_max", 16);
    cfg.nkpt = 17;
    lua_getfield(L, 1, "kpt_shape");
    if (lua_istable(L, -1)) {
        lua_rawgeti(L, -1, 1);
        cfg.nkpt = (int)lua_tointeger(L, -1);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    cfg.nlevels = 3;
    for (int l = 0; l < 3; l++) {
        int s = 8 << l;
        cfg.levels[l].h = imgsz / s;
        cfg.levels[l].w = imgsz / s;
        cfg.levels[l].stride = (float)s;
    }
    cfg.nms = lucid_nms_opts_default();
    cfg.nms.conf_thres = (float)num_field(L, 1, "conf", cfg.nms.conf_thres);
    cfg.nms.iou_thres = (float)num_field(L, 1, "iou", cfg.nms.iou_thres);
    cfg.nms.max_det = lucid_lua_opt_int(L, 1, "max_det", cfg.nms.max_det, "PoseValidator");
    cfg.ap_method = LUCID_AP_COCO;
    lua_getfield(L, 1, "ap");
    if (!lua_isnil(L, -1)) {
        const char *m = lucid_lua_checkstring(L, -1);
        if (strcmp(m, "ultralytics") == 0) cfg.ap_method = LUCID_AP_ULTRALYTICS;
        else if (strcmp(m, "coco") != 0)
            luaL_error(L, "PoseValidator: ap must be 'coco' or 'ultralytics', got '%s'", m);
    }
    lua_pop(L, 1);
    lua_getfield(L, 1, "reference");
    cfg.reference = lua_toboolean(L, -1);
    lua_pop(L, 1);
    cfg.threads = (int)num_field(L, 1, "threads", 0);
    if (cfg.threads < 0) luaL_error(L, "PoseValidator: threads must be >= 0, got %d", cfg.threads);
    val_ud *u = lua_newuserdata(L, sizeof *u);
    memset(u, 0, sizeof *u);
    luaL_getmetatable(L, VAL_MT);
    lua_setmetatable(L, -2);
    lucid_status s = lucid_pose_val_create(ctx, &cfg, &u->val);
    if (s != LUCID_OK) return lucid_lua_raise(L, ctx, s);
    lucid_ctx_retain(ctx);
    u->ctx = ctx;
    u->nkpt = cfg.nkpt;
    u->img = (float)imgsz;
    return 1;
}

static const lucid_tensor *field_tensor(lua_State *L, int idx, const char *key) {
    lua_getfield(L, idx, key);
    const lucid_tensor *t = lucid_lua_to_tensor(L, -1);
    if (!t)
        luaL_error(L, "PoseValidator:add_batch: targets.%s: expected lucid.Tensor, got %s",
                   key, luaL_typename(L, -1));
    lua_pop(L, 1);
    return t;
}

/* val:add_batch(pred_box, pred_cls, pred_kpt, targets, n_images) */
static int l_add_batch(lua_State *L) {
    val_ud *u = check_val(L, 1);
    lucid_pose_val_batch b;
    memset(&b, 0, sizeof b);
    b.pred_box = lucid_lua_check_tensor(L, 2, "pred_box");
    b.pred_cls = lucid_lua_check_tensor(L, 3, "pred_cls");
    b.pred_kpt = u->nkpt ? lucid_lua_check_tensor(L, 4, "pred_kpt") : NULL;
    lucid_lua_checktype(L, 5, LUA_TTABLE);
    b.cls = field_tensor(L, 5, "cls");
    b.boxes = field_tensor(L, 5, "boxes");
    b.mask = field_tensor(L, 5, "mask");
    if (u->nkpt) b.kpts = field_tensor(L, 5, "kpts");
    b.n_images = (int)lucid_lua_optinteger(L, 6, b.pred_box->shape[0]);
    b.img_w = b.img_h = u->img;
    lucid_status s = lucid_pose_val_add_batch(u->ctx, u->val, &b);
    if (s != LUCID_OK) return lucid_lua_raise(L, u->ctx, s);
    return 0;
}

static void push_ap(lua_State *L, const lucid_ap_result *r) {
    lua_createtable(L, 0, 6);
    lua_pushnumber(L, r->precision);
    lua_setfield(L, -2, "precision");
    lua_pushnumber(L, r->recall);
    lua_setfield(L, -2, "recall");
    lua_pushnumber(L, r->map50);
    lua_setfield(L, -2, "map50");
    lua_pushnumber(L, r->map50_95);
    lua_setfield(L, -2, "map50_95");
    lua_pushnumber(L, (lua_Number)r->n_gt);
    lua_setfield(L, -2, "instances");
    lua_pushnumber(L, (lua_Number)r->n_pred);
    lua_setfield(L, -2, "predictions");
}

/* val:compute() -> {box=..., pose=..., images=n, fitness=x} */
static int l_compute(lua_State *L) {
    val_ud *u = check_val(L, 1);
    lucid_pose_metrics m;
    lucid_status s = lucid_pose_val_compute(u->ctx, u->val, &m);
    if (s != LUCID_OK) return lucid_lua_raise(L, u->ctx, s);
    lua_createtable(L, 0, 4);
    push_ap(L, &m.box);
    lua_setfield(L, -2, "box");
    push_ap(L, &m.pose);
    lua_setfield(L, -2, "pose");
    lua_pushnumber(L, (lua_Number)m.images);
    lua_setfield(L, -2, "images");
    lua_pushnumber(L, m.fitness);
    lua_setfield(L, -2, "fitness");
    return 1;
}

/* val:detections(i) -> { {box={x1,y1,x2,y2}, conf=, cls=, kpts={x,y,v,...}}, ... }
 * for image i (1-based) of the last add_batch; cls is 0-based. */
static int l_detections(lua_State *L) {
    val_ud *u = check_val(L, 1);
    int i = (int)lucid_lua_checkinteger(L, 2);
    int n = 0;
    const lucid_det *d = lucid_pose_val_dets(u->val, i - 1, &n);
    lua_createtable(L, n, 0);
    for (int k = 0; k < n; k++) {
        lua_createtable(L, 0, 4);
        lua_createtable(L, 4, 0);
        for (int j = 0; j < 4; j++) {
            lua_pushnumber(L, d[k].box[j]);
            lua_rawseti(L, -2, j + 1);
        }
        lua_setfield(L, -2, "box");
        lua_pushnumber(L, d[k].conf);
        lua_setfield(L, -2, "conf");
        lua_pushinteger(L, d[k].cls);
        lua_setfield(L, -2, "cls");
        if (d[k].kpts) {
            lua_createtable(L, 3 * u->nkpt, 0);
            for (int j = 0; j < 3 * u->nkpt; j++) {
                lua_pushnumber(L, d[k].kpts[j]);
                lua_rawseti(L, -2, j + 1);
            }
            lua_setfield(L, -2, "kpts");
        }
        lua_rawseti(L, -2, k + 1);
    }
    return 1;
}

static double geom_field(lua_State *L, int idx, const char *k) {
    lua_getfield(L, idx, k);
    if (!lua_isnumber(L, -1))
        luaL_error(L, "PoseValidator:coco_json: geometry.%s: expected a number, got %s", k,
                   luaL_typename(L, -1));
    double v = lua_tonumber(L, -1);
    lua_pop(L, 1);
    return v;
}

/* val:coco_json(i, image_id, g) -> text, n
 * The COCO results entries of image i (1-based) of the last batch in the
 * original image's pixels (g: lucid.image.geometry(w, h, imgsz): rx, ry,
 * pad_x, pad_y, w, h), as predict.unletterbox + predict.coco_entries +
 * cjson.encode would write them, comma-separated without brackets; n is the
 * number of entries. Raises on a NaN or infinite value (as cjson does). */
static int l_coco_json(lua_State *L) {
    val_ud *u = check_val(L, 1);
    int i = (int)lucid_lua_checkinteger(L, 2);
    double image_id = lucid_lua_checknumber(L, 3);
    lucid_lua_checktype(L, 4, LUA_TTABLE);
    lucid_unletterbox g;
    g.rx = geom_field(L, 4, "rx");
    g.ry = geom_field(L, 4, "ry");
    g.pad_x = geom_field(L, 4, "pad_x");
    g.pad_y = geom_field(L, 4, "pad_y");
    g.w = geom_field(L, 4, "w");
    g.h = geom_field(L, 4, "h");
    int n = 0;
    const lucid_det *d = lucid_pose_val_dets(u->val, i - 1, &n);
    char *buf = malloc(lucid_eval_coco_json_bound(n, u->nkpt));
    if (!buf) return luaL_error(L, "PoseValidator:coco_json: out of memory");
    int64_t len = lucid_eval_coco_json(d, n, u->nkpt, image_id, &g, buf);
    if (len < 0) {
        free(buf);
        return luaL_error(L, "PoseValidator:coco_json: image %d has a detection with a NaN or "
                             "infinite value, which JSON cannot hold", i);
    }
    lua_pushlstring(L, buf, (size_t)len);
    free(buf);
    lua_pushinteger(L, n);
    return 2;
}

/* val:timings() -> {select=, decode=, nms=, kpts=, match=, accum= (seconds,
 * summed over images: CPU time when images run in parallel), wall= (the
 * add_batch calls), images=, candidates=, decoded=, kept=} accumulated
 * since the last reset (engine/eval/eval.h lucid_eval_timings). */
static int l_timings(lua_State *L) {
    val_ud *u = check_val(L, 1);
    lucid_eval_timings t;
    lucid_pose_val_timings(u->val, &t);
    lua_createtable(L, 0, 11);
    const struct { const char *k; double v; } f[] = {
        {"select", t.select}, {"decode", t.decode}, {"nms", t.nms},
        {"kpts", t.kpts}, {"match", t.match}, {"accum", t.accum}, {"wall", t.wall},
        {"images", (double)t.images}, {"candidates", (double)t.candidates},
        {"decoded", (double)t.decoded}, {"kept", (double)t.kept}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        lua_pushnumber(L, f[i].v);
        lua_setfield(L, -2, f[i].k);
    }
    return 1;
}

static int l_reset(lua_State *L) {
    lucid_pose_val_reset(check_val(L, 1)->val);
    return 0;
}

static int l_free(lua_State *L) {
    val_ud *u = lucid_lua_checkudata(L, 1, VAL_MT);
    lucid_pose_val_free(u->val);
    u->val = NULL;
    if (u->ctx) lucid_ctx_release(u->ctx);
    u->ctx = NULL;
    return 0;
}

int lucid_lua_open_eval(lua_State *L) {
    static const luaL_Reg methods[] = {{"add_batch", l_add_batch},
                                       {"compute", l_compute},
                                       {"detections", l_detections},
                                       {"timings", l_timings},
                                       {"coco_json", l_coco_json},
                                       {"reset", l_reset},
                                       {"free", l_free},
                                       {NULL, NULL}};
    lucid_lua_register_class(L, VAL_MT, methods, l_free, NULL);
    lua_pushcfunction(L, l_new);
    lua_setfield(L, -2, "PoseValidator");
    return 0;
}
