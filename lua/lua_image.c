/*
 * lua_image.c — Lua binding of image reading, PNG writing, drawing and the
 * validation letterbox (engine/data/image_io.h).
 *
 * Adds lucid.image = {
 *   read(path [, ctx])            -> Tensor u8 [H,W,3] (RGB, EXIF-oriented),
 *                                    orientation | nil, msg, status
 *   write_png(path, t)            -> true | nil, msg, status
 *                                    t: u8 CPU [H,W,3] or [3,H,W], any strides
 *   draw_pose(t, dets [, opts])   -> t, drawn in place; t: u8 CPU contiguous
 *                                    [H,W,3]; dets: { {box={x1,y1,x2,y2},
 *                                    conf=, cls= (0-based), kpts={x,y,v,...}},
 *                                    ... } (val:detections / decode_nms);
 *                                    opts: kpt_threshold (0.5), boxes (true),
 *                                    labels (true), names ({"person"}),
 *                                    conf (0: draw dets with conf >= this),
 *                                    line_width (auto), radius (auto)
 *   letterbox(t, size)            -> Tensor u8 [size,size,3], ratio_x, pad_x,
 *                                    pad_y, ratio_y — exactly the validation
 *                                    loader's preprocessing (prepared resize
 *                                    to long side `size`, then LetterBox)
 *   geometry(w, h, size)          -> {rx, ry, pad_x, pad_y, uw, uh, pw, ph}:
 *                                    x_net = x * rx + pad_x (same for y)
 *   dataset_image_size(ds, i)     -> w, h: original size of dataset image i
 *                                    (1-based) as decoded at scan time
 * }
 * Error channels as lua_data.c: misuse raises; an environmental failure
 * (unreadable file, unwritable path) returns nil, message (naming the
 * path), status name. No C temporary is alive when an error is raised.
 */
#include "lua_common.h"
#include "data/image_io.h"

#include <stdlib.h>
#include <string.h>

#define DATASET_MT "lucid.Dataset" /* lua_data.c */
typedef struct dataset_box_view { lucid_dataset *ds; } dataset_box_view;

static int push_failure(lua_State *L, lucid_ctx *ctx, lucid_status st) {
    lua_pushnil(L);
    lua_pushstring(L, lucid_ctx_error(ctx));
    lua_pushstring(L, lucid_status_name(st));
    return 3;
}

/* A new CPU u8 [h, w, 3] tensor holding img's pixels (img is freed). */
static int push_image(lua_State *L, lucid_ctx *ctx, lucid_image *img) {
    lucid_device cpu = {LUCID_CPU, 0};
    int64_t shape[3] = {img->h, img->w, 3};
    lucid_tensor *t = NULL;
    lucid_status st = lucid_tensor_empty(ctx, cpu, LUCID_U8, 3, shape, &t);
    if (st == LUCID_OK)
        memcpy(lucid_tensor_data(t), img->data, (size_t)img->w * img->h * 3);
    lucid_image_free(img);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    lucid_lua_push_tensor(L, t);
    return 1;
}

/* The tensor at idx as an image over its own memory: u8, CPU, contiguous
 * [H, W, 3]. Raises otherwise. */
static lucid_tensor *check_hwc(lua_State *L, int idx, const char *fn,
                               lucid_image *img) {
    lucid_tensor *t = lucid_lua_check_tensor(L, idx, "image");
    if (t->dtype != LUCID_U8 || lucid_tensor_device(t).type != LUCID_CPU ||
        t->ndim != 3 || t->shape[2] != 3 || !lucid_tensor_is_contiguous(t)) {
        char sh[64];
        int n = 0;
        sh[0] = '\0';
        for (int d = 0; d < t->ndim && n < 50; d++)
            n += snprintf(sh + n, sizeof sh - n, d ? ",%lld" : "%lld",
                          (long long)t->shape[d]);
        luaL_error(L, "lucid.image.%s: expected a contiguous u8 CPU tensor [H,W,3], "
                      "got %s [%s]%s on %s",
                   fn, lucid_dtype_name(t->dtype), sh,
                   lucid_tensor_is_contiguous(t) ? "" : " (not contiguous)",
                   lucid_tensor_device(t).type == LUCID_CPU ? "cpu" : "cuda");
    }
    img->h = (int32_t)t->shape[0];
    img->w = (int32_t)t->shape[1];
    img->data = lucid_tensor_data(t);
    return t;
}

/* lucid.image.read(path [, ctx]) */
static int l_read(lua_State *L) {
    const char *path = lucid_lua_checkstring(L, 1);
    lucid_ctx *ctx = lucid_lua_ctx(L, 2);
    lucid_image img;
    int orient = 1;
    lucid_status st = lucid_image_decode_file(ctx, path, &img, &orient);
    if (st != LUCID_OK) return push_failure(L, ctx, st);
    push_image(L, ctx, &img);
    lua_pushinteger(L, orient);
    return 2;
}

/* lucid.image.write_png(path, tensor) */
static int l_write_png(lua_State *L) {
    const char *path = lucid_lua_checkstring(L, 1);
    lucid_tensor *t = lucid_lua_check_tensor(L, 2, "image");
    if (t->dtype != LUCID_U8 || lucid_tensor_device(t).type != LUCID_CPU)
        luaL_error(L, "lucid.image.write_png: expected a u8 CPU tensor, got %s on %s "
                      "(convert with :to(\"cpu\", \"u8\"))",
                   lucid_dtype_name(t->dtype),
                   lucid_tensor_device(t).type == LUCID_CPU ? "cpu" : "cuda");
    int hwc;
    if (t->ndim == 3 && t->shape[2] == 3) hwc = 1;
    else if (t->ndim == 3 && t->shape[0] == 3) hwc = 0;
    else
        return luaL_error(L, "lucid.image.write_png: expected [H,W,3] or [3,H,W], got "
                             "%d dims", t->ndim);
    int64_t H = hwc ? t->shape[0] : t->shape[1], W = hwc ? t->shape[1] : t->shape[2];
    int64_t sy = hwc ? t->strides[0] : t->strides[1];
    int64_t sx = hwc ? t->strides[1] : t->strides[2];
    int64_t sc = hwc ? t->strides[2] : t->strides[0];
    lucid_ctx *ctx = lucid_tensor_ctx(t);
    lucid_image img;
    lucid_status st = lucid_image_alloc(ctx, (int32_t)W, (int32_t)H, &img);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    const uint8_t *src = lucid_tensor_data(t);
    for (int64_t y = 0; y < H; y++)
        for (int64_t x = 0; x < W; x++)
            for (int c = 0; c < 3; c++)
                img.data[(y * W + x) * 3 + c] = src[y * sy + x * sx + c * sc];
    st = lucid_image_write_png(ctx, path, &img);
    lucid_image_free(&img);
    if (st != LUCID_OK) return push_failure(L, ctx, st);
    lua_pushboolean(L, 1);
    return 1;
}

static double opt_num(lua_State *L, int idx, const char *k, double def) {
    return lucid_lua_opt_number(L, idx, k, def, "lucid.image.draw_pose");
}

static int opt_bool(lua_State *L, int idx, const char *k, int def) {
    return lucid_lua_opt_boolean(L, idx, k, def, "lucid.image.draw_pose");
}

/* Read up to n numbers of the array field `key` of the table at idx into
 * out; returns how many there were. Raises on a non-number. */
static int num_array(lua_State *L, int idx, const char *key, float *out, int n,
                     int det) {
    lua_getfield(L, idx, key);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        return 0;
    }
    if (!lua_istable(L, -1))
        luaL_error(L, "lucid.image.draw_pose: detection %d: %s: expected a table, got %s",
                   det, key, luaL_typename(L, -1));
    int len = (int)lua_objlen(L, -1);
    if (len > n) len = n;
    for (int i = 0; i < len; i++) {
        lua_rawgeti(L, -1, i + 1);
        if (lua_type(L, -1) != LUA_TNUMBER)
            luaL_error(L, "lucid.image.draw_pose: detection %d: %s[%d]: expected a number",
                       det, key, i + 1);
        out[i] = (float)lua_tonumber(L, -1);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return len;
}

static const char *const DRAW_KEYS[] = {"kpt_threshold", "boxes", "labels", "names", "conf",
                                        "line_width", "radius", NULL};

/* lucid.image.draw_pose(t, dets [, opts]) -> t */
static int l_draw_pose(lua_State *L) {
    lucid_image img;
    check_hwc(L, 1, "draw_pose", &img);
    lucid_lua_checktype(L, 2, LUA_TTABLE);
    if (lua_istable(L, 3)) {
        lua_pushnil(L);
        while (lua_next(L, 3)) {
            lua_pop(L, 1);
            int ok = 0;
            for (int i = 0; DRAW_KEYS[i]; i++)
                if (lua_type(L, -1) == LUA_TSTRING && !strcmp(DRAW_KEYS[i], lua_tostring(L, -1)))
                    ok = 1;
            if (!ok)
                luaL_error(L, "lucid.image.draw_pose: unknown option '%s' (expected "
                              "kpt_threshold, boxes, labels, names, conf, line_width, radius)",
                           lua_tostring(L, -1));
        }
    } else if (!lua_isnoneornil(L, 3)) {
        lucid_lua_checktype(L, 3, LUA_TTABLE);
    }
    lucid_pose_draw_opts o = lucid_pose_draw_opts_default();
    o.kpt_threshold = (float)opt_num(L, 3, "kpt_threshold", o.kpt_threshold);
    o.boxes = opt_bool(L, 3, "boxes", 1);
    o.labels = opt_bool(L, 3, "labels", 1);
    o.line_width = (int)opt_num(L, 3, "line_width", 0);
    o.radius = (int)opt_num(L, 3, "radius", 0);
    double min_conf = opt_num(L, 3, "conf", 0);
    int names = 0;
    if (lua_istable(L, 3)) {
        lua_getfield(L, 3, "names");
        if (lua_istable(L, -1)) names = lua_gettop(L);
        else lua_pop(L, 1);
    }
    int n = (int)lua_objlen(L, 2);
    /* draw the lowest confidence first so the best detections end on top */
    for (int d = n; d >= 1; d--) {
        lua_rawgeti(L, 2, d);
        if (!lua_istable(L, -1))
            luaL_error(L, "lucid.image.draw_pose: detection %d: expected a table, got %s", d,
                       luaL_typename(L, -1));
        int di = lua_gettop(L);
        float box[4], kpts[3 * LUCID_MAX_KPT];
        int nb = num_array(L, di, "box", box, 4, d);
        int nk = num_array(L, di, "kpts", kpts, 3 * LUCID_MAX_KPT, d);
        lua_getfield(L, di, "conf");
        float conf = (float)lucid_lua_optnumber(L, -1, 1.0);
        lua_pop(L, 1);
        lua_getfield(L, di, "cls");
        int cls = (int)lucid_lua_optinteger(L, -1, 0);
        lua_pop(L, 1);
        if (conf >= min_conf) {
            char label[64];
            label[0] = '\0';
            if (names) {
                lua_rawgeti(L, names, cls + 1);
                if (lua_isstring(L, -1)) snprintf(label, sizeof label, "%s", lua_tostring(L, -1));
                lua_pop(L, 1);
            }
            if (!label[0]) {
                if (cls == 0 && !names) snprintf(label, sizeof label, "person");
                else snprintf(label, sizeof label, "%d", cls);
            }
            lucid_draw_pose(&img, nb == 4 ? box : NULL, cls, conf, label,
                            nk >= 3 ? kpts : NULL, nk / 3, &o);
        }
        lua_settop(L, di - 1);
    }
    lua_settop(L, 1);
    return 1;
}

/* lucid.image.letterbox(t, size) -> out, ratio_x, pad_x, pad_y, ratio_y */
static int l_letterbox(lua_State *L) {
    lucid_image src;
    lucid_tensor *t = check_hwc(L, 1, "letterbox", &src);
    int size = (int)lucid_lua_checkinteger(L, 2);
    if (size < 1) lucid_lua_argerror(L, 2, "size: expected a positive integer");
    lucid_ctx *ctx = lucid_tensor_ctx(t);
    lucid_image dst;
    lucid_letterbox_geom g;
    lucid_status st = lucid_image_letterbox_val(ctx, &src, size, &dst, &g);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    push_image(L, ctx, &dst);
    lua_pushnumber(L, g.rx);
    lua_pushinteger(L, g.pad_x);
    lua_pushinteger(L, g.pad_y);
    lua_pushnumber(L, g.ry);
    return 5;
}

static void set_num(lua_State *L, const char *k, double v) {
    lua_pushnumber(L, v);
    lua_setfield(L, -2, k);
}

/* lucid.image.geometry(w, h, size) -> table */
static int l_geometry(lua_State *L) {
    int w = (int)lucid_lua_checkinteger(L, 1), h = (int)lucid_lua_checkinteger(L, 2);
    int size = (int)lucid_lua_checkinteger(L, 3);
    if (w < 1 || h < 1 || size < 1)
        luaL_error(L, "lucid.image.geometry: sizes must be positive, got %d x %d -> %d", w, h,
                   size);
    lucid_letterbox_geom g;
    lucid_letterbox_geometry(w, h, size, &g);
    lua_createtable(L, 0, 10);
    set_num(L, "rx", g.rx);
    set_num(L, "ry", g.ry);
    set_num(L, "pad_x", g.pad_x);
    set_num(L, "pad_y", g.pad_y);
    set_num(L, "uw", g.uw);
    set_num(L, "uh", g.uh);
    set_num(L, "pw", g.pw);
    set_num(L, "ph", g.ph);
    set_num(L, "w", w);
    set_num(L, "h", h);
    return 1;
}

/* lucid.image.dataset_image_size(ds, i) -> w, h */
static int l_dataset_image_size(lua_State *L) {
    dataset_box_view *b = lucid_lua_checkudata(L, 1, DATASET_MT);
    if (!b->ds) lucid_lua_argerror(L, 1, "dataset was freed");
    int64_t n = lucid_dataset_size(b->ds);
    lua_Number i = lucid_lua_checknumber(L, 2);
    if (!(i >= 1 && i <= (lua_Number)n && i == (lua_Number)(int64_t)i))
        lucid_lua_argerror(L, 2, lua_pushfstring(L, "index: expected 1..%d, got %s", (int)n,
                                            lua_tostring(L, 2)));
    int w = 0, h = 0;
    lucid_dataset_orig_size(NULL, b->ds, (int64_t)i - 1, &w, &h);
    lua_pushinteger(L, w);
    lua_pushinteger(L, h);
    return 2;
}

static const luaL_Reg image_funcs[] = {
    {"read", l_read},
    {"write_png", l_write_png},
    {"draw_pose", l_draw_pose},
    {"letterbox", l_letterbox},
    {"geometry", l_geometry},
    {"dataset_image_size", l_dataset_image_size},
    {NULL, NULL}};

/* Adds lucid.image to the module table on top of the stack. */
int lucid_lua_open_image(lua_State *L) {
    int module = lua_gettop(L);
    lua_getfield(L, module, "image");
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        lua_newtable(L);
    }
    luaL_register(L, NULL, image_funcs);
    lua_setfield(L, module, "image");
    return 0;
}
