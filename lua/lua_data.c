/*
 * lua_data.c — Lua binding of the data pipeline (engine/data/data.h).
 *
 * Adds lucid.data = {
 *   open_yolo(images_dir, opts)        -> Dataset | nil, msg, status
 *   open_coco(json, images_dir, opts)  -> Dataset | nil, msg, status
 *   read_yaml(path)                    -> table | nil, msg, status
 *       {dir (the YAML's folder), path, train, val (as written, absent when
 *       absent), kpt_shape {K, D}, flip_idx (0-based), nc, names}; errors
 *       name the file, line and key. data.load_yaml resolves the paths.
 *   decode(path [, ctx])               -> Tensor u8 [H,W,3], orientation | nil, msg, status
 *   Loader(dataset, opts)              -> Loader
 *   reject_reasons                     -> { "image_missing", ... }
 * }
 * Dataset: :size() (also #ds), :stats(), :summary(), :rejects(),
 *   :image_path(i), :labels(i) (i 1-based), :sample(i, {epoch, seed, imgsz,
 *   aug}) -> Tensor u8 [S,S,3], instances table; :free().
 * Loader: :start_epoch(epoch, aug), :next() -> batch table | nil at the end,
 *   :num_batches(), :free().
 *
 * Error channels (style_anchors Absorb 14): misuse (wrong type, unknown
 * option key, bad value) raises; an environmental failure opening a dataset
 * or a file returns nil, message, status name; a worker failure during
 * :next() raises the engine's message (it names the file). Indices are
 * 1-based here and converted to the 0-based C API. No C temporary is alive
 * when an error is raised.
 */
#include "lua_common.h"
#include "data/data.h"

#include <string.h>

#define DATASET_MT "lucid.Dataset"
#define LOADER_MT "lucid.Loader"

typedef struct dataset_box { lucid_dataset *ds; } dataset_box;
typedef struct loader_box {
    lucid_loader *ld;
    lucid_ctx *ctx; /* one reference */
} loader_box;

/* ------------------------------------------------------------ options */

/* Raise when the table at idx has a key not in `known` (typos in recipes
 * must not pass silently). */
static void check_keys(lua_State *L, int idx, const char *const *known,
                       const char *what) {
    lucid_lua_check_options(L, idx, known, what);
}

static double opt_num(lua_State *L, int idx, const char *k, double def) {
    return lucid_lua_opt_number(L, idx, k, def, "lucid.data");
}

static int opt_bool(lua_State *L, int idx, const char *k, int def) {
    return lucid_lua_opt_boolean(L, idx, k, def, "lucid.data");
}

static const char *opt_str(lua_State *L, int idx, const char *k,
                           const char *def) {
    if (!lua_istable(L, idx)) return def;
    lua_getfield(L, idx, k);
    const char *v = def;
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TSTRING)
            luaL_error(L, "option '%s': expected string, got %s", k,
                       luaL_typename(L, -1));
        v = lua_tostring(L, -1); /* kept alive by the options table */
    }
    lua_pop(L, 1);
    return v;
}

/* Array of integers at field k into out (max n); returns count or -1 when
 * absent. */
static int opt_int_array(lua_State *L, int idx, const char *k, int *out,
                         int n) {
    if (!lua_istable(L, idx)) return -1;
    lua_getfield(L, idx, k);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        return -1;
    }
    if (!lua_istable(L, -1))
        luaL_error(L, "option '%s': expected an array of integers", k);
    int c = (int)lua_objlen(L, -1);
    if (c > n) luaL_error(L, "option '%s': at most %d entries, got %d", k, n, c);
    for (int i = 0; i < c; i++) {
        lua_rawgeti(L, -1, i + 1);
        if (lua_type(L, -1) != LUA_TNUMBER)
            luaL_error(L, "option '%s'[%d]: expected integer", k, i + 1);
        out[i] = (int)lua_tointeger(L, -1);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return c;
}

static const char *const DATASET_KEYS[] = {
    "imgsz", "cache", "policy", "max_reject_fraction", "exif_labels",
    "threads", "kpt_shape", "flip_idx", "nc", "ctx", NULL};

static lucid_dataset_options check_dataset_opts(lua_State *L, int idx) {
    check_keys(L, idx, DATASET_KEYS, "dataset options");
    lucid_dataset_options o = lucid_dataset_options_default();
    o.imgsz = (int)opt_num(L, idx, "imgsz", o.imgsz);
    o.cache = opt_bool(L, idx, "cache", o.cache);
    const char *pol = opt_str(L, idx, "policy", "skip");
    if (!strcmp(pol, "skip")) o.policy = LUCID_POLICY_SKIP;
    else if (!strcmp(pol, "fail")) o.policy = LUCID_POLICY_FAIL;
    else luaL_error(L, "option 'policy': expected \"skip\" or \"fail\", got \"%s\"", pol);
    o.max_reject_fraction = opt_num(L, idx, "max_reject_fraction", o.max_reject_fraction);
    const char *ex = opt_str(L, idx, "exif_labels", "display");
    if (!strcmp(ex, "display")) o.exif_labels = LUCID_EXIF_LABELS_DISPLAY;
    else if (!strcmp(ex, "stored")) o.exif_labels = LUCID_EXIF_LABELS_STORED;
    else luaL_error(L, "option 'exif_labels': expected \"display\" or \"stored\", got \"%s\"", ex);
    o.threads = (int)opt_num(L, idx, "threads", 4);
    int ks[2];
    int nks = opt_int_array(L, idx, "kpt_shape", ks, 2);
    if (nks >= 0) {
        if (nks != 2 || ks[0] < 0 || ks[0] > LUCID_MAX_KPT || (ks[1] != 2 && ks[1] != 3))
            luaL_error(L, "option 'kpt_shape': expected {K, D} with 0 <= K <= %d, D 2 or 3",
                       LUCID_MAX_KPT);
        o.spec.nkpt = ks[0];
        o.spec.ndim = ks[1];
        o.spec.has_flip_idx = 0;
    }
    int nf = opt_int_array(L, idx, "flip_idx", o.spec.flip_idx, LUCID_MAX_KPT);
    if (nf >= 0) {
        if (nf != o.spec.nkpt)
            luaL_error(L, "option 'flip_idx': %d entries for %d keypoints", nf, o.spec.nkpt);
        o.spec.has_flip_idx = 1;
    }
    o.spec.nc = (int)opt_num(L, idx, "nc", o.spec.nc);
    if (o.imgsz < 32 || o.threads < 1 || o.spec.nc < 1 ||
        o.max_reject_fraction < 0 || o.max_reject_fraction > 1)
        luaL_error(L, "dataset options: imgsz >= 32, threads >= 1, nc >= 1, "
                      "0 <= max_reject_fraction <= 1 required");
    return o;
}

static const char *const AUG_KEYS[] = {
    "augment", "mosaic", "degrees", "translate", "scale", "shear",
    "perspective", "flipud", "fliplr", "hsv_h", "hsv_s", "hsv_v",
    "hsv_on_cpu", "close_mosaic", NULL};

static lucid_aug_params check_aug(lua_State *L, int idx) {
    check_keys(L, idx, AUG_KEYS, "augmentation");
    lucid_aug_params p = lucid_aug_params_default();
    p.augment = opt_bool(L, idx, "augment", p.augment);
    p.mosaic = (float)opt_num(L, idx, "mosaic", p.mosaic);
    p.degrees = (float)opt_num(L, idx, "degrees", p.degrees);
    p.translate = (float)opt_num(L, idx, "translate", p.translate);
    p.scale = (float)opt_num(L, idx, "scale", p.scale);
    p.shear = (float)opt_num(L, idx, "shear", p.shear);
    p.perspective = (float)opt_num(L, idx, "perspective", p.perspective);
    p.flipud = (float)opt_num(L, idx, "flipud", p.flipud);
    p.fliplr = (float)opt_num(L, idx, "fliplr", p.fliplr);
    p.hsv_h = (float)opt_num(L, idx, "hsv_h", p.hsv_h);
    p.hsv_s = (float)opt_num(L, idx, "hsv_s", p.hsv_s);
    p.hsv_v = (float)opt_num(L, idx, "hsv_v", p.hsv_v);
    p.hsv_on_cpu = opt_bool(L, idx, "hsv_on_cpu", p.hsv_on_cpu);
    if (p.scale >= 1 || p.scale < 0 || p.translate < 0 || p.translate > 1 ||
        p.mosaic < 0 || p.mosaic > 1 || p.fliplr < 0 || p.fliplr > 1 ||
        p.flipud < 0 || p.flipud > 1)
        luaL_error(L, "augmentation: need 0 <= scale < 1, translate, mosaic, "
                      "fliplr, flipud in [0,1]");
    return p;
}

/* ------------------------------------------------------------ Dataset */

static lucid_dataset *check_dataset(lua_State *L, int idx) {
    dataset_box *b = lucid_lua_checkudata(L, idx, DATASET_MT);
    if (!b->ds) lucid_lua_argerror(L, idx, "dataset was freed");
    return b->ds;
}

static int push_dataset(lua_State *L, lucid_dataset *ds) {
    dataset_box *b = lua_newuserdata(L, sizeof *b);
    b->ds = ds;
    luaL_getmetatable(L, DATASET_MT);
    lua_setmetatable(L, -2);
    return 1;
}

static int push_failure(lua_State *L, lucid_ctx *ctx, lucid_status st) {
    lua_pushnil(L);
    lua_pushstring(L, lucid_ctx_error(ctx));
    lua_pushstring(L, lucid_status_name(st));
    lucid_ctx_clear_error(ctx);
    return 3;
}

static int l_open_yolo(lua_State *L) {
    const char *dir = lucid_lua_checkstring(L, 1);
    lucid_dataset_options o = check_dataset_opts(L, 2);
    lucid_ctx *ctx = lucid_lua_ctx(L, 2);
    lucid_dataset *ds = NULL;
    lucid_status st = lucid_dataset_open_yolo(ctx, dir, &o, &ds);
    if (st != LUCID_OK) return push_failure(L, ctx, st);
    return push_dataset(L, ds);
}

static int l_open_coco(lua_State *L) {
    const char *json = lucid_lua_checkstring(L, 1);
    const char *dir = lucid_lua_checkstring(L, 2);
    lucid_dataset_options o = check_dataset_opts(L, 3);
    lucid_ctx *ctx = lucid_lua_ctx(L, 3);
    lucid_dataset *ds = NULL;
    lucid_status st = lucid_dataset_open_coco(ctx, json, dir, &o, &ds);
    if (st != LUCID_OK) return push_failure(L, ctx, st);
    return push_dataset(L, ds);
}

static int l_ds_size(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)lucid_dataset_size(check_dataset(L, 1)));
    return 1;
}

static void setnum(lua_State *L, const char *name, double v) {
    lua_pushnumber(L, v);
    lua_setfield(L, -2, name);
}

static int l_ds_stats(lua_State *L) {
    lucid_dataset_stats s;
    lucid_dataset_get_stats(check_dataset(L, 1), &s);
    lua_createtable(L, 0, 14);
    setnum(L, "total", (double)s.total);
    setnum(L, "kept", (double)s.kept);
    setnum(L, "rejected", (double)s.rejected);
    setnum(L, "instances", (double)s.instances);
    setnum(L, "missing_labels", (double)s.missing_labels);
    setnum(L, "empty_labels", (double)s.empty_labels);
    setnum(L, "duplicates", (double)s.duplicates);
    setnum(L, "crowd", (double)s.crowd);
    setnum(L, "no_keypoints", (double)s.no_keypoints);
    setnum(L, "max_instances", (double)s.max_instances);
    setnum(L, "cache_bytes", (double)s.cache_bytes);
    lua_newtable(L);
    for (int r = 1; r < LUCID_REJECT_COUNT; r++) {
        lua_pushnumber(L, (lua_Number)s.reject_count[r]);
        lua_setfield(L, -2, lucid_reject_name((lucid_reject)r));
    }
    lua_setfield(L, -2, "rejects");
    return 1;
}

static int l_ds_summary(lua_State *L) {
    char buf[1024];
    lucid_dataset_summary(check_dataset(L, 1), buf, sizeof buf);
    lua_pushstring(L, buf);
    return 1;
}

static int l_ds_rejects(lua_State *L) {
    lucid_dataset *ds = check_dataset(L, 1);
    int64_t n = lucid_dataset_num_rejects(ds);
    lua_createtable(L, (int)n, 0);
    for (int64_t k = 0; k < n; k++) {
        lua_pushstring(L, lucid_dataset_reject_message(ds, k));
        lua_rawseti(L, -2, (int)k + 1);
    }
    return 1;
}

static int64_t check_index(lua_State *L, lucid_dataset *ds, int idx) {
    lua_Integer i = lucid_lua_checkinteger(L, idx);
    if (i < 1 || i > lucid_dataset_size(ds))
        lucid_lua_argerror(L, idx, lua_pushfstring(L, "index %d outside 1..%d", (int)i,
                                              (int)lucid_dataset_size(ds)));
    return (int64_t)i - 1;
}

static int l_ds_image_path(lua_State *L) {
    lucid_dataset *ds = check_dataset(L, 1);
    lua_pushstring(L, lucid_dataset_image_path(ds, check_index(L, ds, 2)));
    return 1;
}

/* {cls = {...}, box = {{cx,cy,w,h},...}, kpts = {{{x,y,v},...},...}} */
static void push_instances(lua_State *L, int n, int K, const float *cls,
                           const float *box, const float *kpts) {
    lua_createtable(L, 0, 3);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushnumber(L, cls[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "cls");
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_createtable(L, 4, 0);
        for (int c = 0; c < 4; c++) {
            lua_pushnumber(L, box[i * 4 + c]);
            lua_rawseti(L, -2, c + 1);
        }
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "box");
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_createtable(L, K, 0);
        for (int k = 0; k < K; k++) {
            lua_createtable(L, 3, 0);
            for (int c = 0; c < 3; c++) {
                lua_pushnumber(L, kpts[((size_t)i * K + k) * 3 + c]);
                lua_rawseti(L, -2, c + 1);
            }
            lua_rawseti(L, -2, k + 1);
        }
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "kpts");
}

static int l_ds_labels(lua_State *L) {
    lucid_dataset *ds = check_dataset(L, 1);
    const lucid_labels *l = lucid_dataset_labels(ds, check_index(L, ds, 2));
    push_instances(L, l->n, lucid_dataset_opts(ds)->spec.nkpt, l->cls, l->box,
                   l->kpts);
    return 1;
}

/* ds:sample(i, {epoch=0, seed=0, imgsz=, aug={...}}) -> Tensor u8 [S,S,3]
 * (HWC), instances in pixels {cls, box xyxy, kpts}. For inspection and
 * tests, not for training loops. */
static int l_ds_sample(lua_State *L) {
    lucid_dataset *ds = check_dataset(L, 1);
    int64_t i = check_index(L, ds, 2);
    static const char *const keys[] = {"epoch", "seed", "imgsz", "aug", "ctx", NULL};
    check_keys(L, 3, keys, "sample options");
    uint64_t epoch = (uint64_t)opt_num(L, 3, "epoch", 0);
    uint64_t seed = (uint64_t)opt_num(L, 3, "seed", 0);
    int S = (int)opt_num(L, 3, "imgsz", lucid_dataset_opts(ds)->imgsz);
    lucid_aug_params p = lucid_aug_params_default();
    if (lua_istable(L, 3)) {
        lua_getfield(L, 3, "aug");
        if (!lua_isnil(L, -1)) p = check_aug(L, lua_gettop(L));
        lua_pop(L, 1);
    }
    if (S < 32 || S % 2) luaL_error(L, "sample: imgsz must be even and >= 32");
    lucid_ctx *ctx = lucid_lua_ctx(L, 3);
    lucid_device cpu = {LUCID_CPU, 0};
    int64_t shape[3] = {S, S, 3};
    lucid_tensor *t = NULL;
    lucid_status st = lucid_tensor_empty(ctx, cpu, LUCID_U8, 3, shape, &t);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    lucid_image img = {S, S, lucid_tensor_data(t)};
    lucid_instances in;
    memset(&in, 0, sizeof in);
    st = lucid_augment_sample(ctx, ds, &p, S, seed, epoch, i, NULL, &img, &in,
                              NULL);
    if (st != LUCID_OK) {
        lucid_tensor_release(t);
        lucid_instances_free(&in);
        return lucid_lua_raise(L, ctx, st);
    }
    lucid_lua_push_tensor(L, t);
    /* copy the instances into Lua before freeing them: push_instances does
     * not raise except on memory exhaustion */
    push_instances(L, in.n, in.nkpt, in.cls, in.box, in.kpts);
    lucid_instances_free(&in);
    return 2;
}

static int l_ds_free(lua_State *L) {
    dataset_box *b = lucid_lua_checkudata(L, 1, DATASET_MT);
    if (b->ds) lucid_dataset_release(b->ds);
    b->ds = NULL;
    return 0;
}

static int l_ds_tostring(lua_State *L) {
    dataset_box *b = lucid_lua_checkudata(L, 1, DATASET_MT);
    if (!b->ds) lua_pushliteral(L, "lucid.Dataset(freed)");
    else lua_pushfstring(L, "lucid.Dataset(%d images, imgsz %d)",
                         (int)lucid_dataset_size(b->ds),
                         lucid_dataset_opts(b->ds)->imgsz);
    return 1;
}

/* ------------------------------------------------------------- Loader */

static loader_box *check_loader(lua_State *L, int idx) {
    loader_box *b = lucid_lua_checkudata(L, idx, LOADER_MT);
    if (!b->ld) lucid_lua_argerror(L, idx, "loader was freed");
    return b;
}

static const char *const LOADER_KEYS[] = {
    "batch", "imgsz", "max_gt", "threads", "prefetch", "shuffle",
    "drop_last", "seed", "ctx", NULL};

static int l_loader_new(lua_State *L) {
    lucid_dataset *ds = check_dataset(L, 1);
    check_keys(L, 2, LOADER_KEYS, "loader options");
    lucid_loader_options o = lucid_loader_options_default();
    o.batch = lucid_lua_opt_int(L, 2, "batch", o.batch, "loader options");
    o.imgsz = lucid_lua_opt_int(L, 2, "imgsz", o.imgsz, "loader options");
    o.max_gt = lucid_lua_opt_int(L, 2, "max_gt", o.max_gt, "loader options");
    o.threads = lucid_lua_opt_int(L, 2, "threads", o.threads, "loader options");
    o.prefetch = lucid_lua_opt_int(L, 2, "prefetch", o.prefetch, "loader options");
    o.shuffle = opt_bool(L, 2, "shuffle", o.shuffle);
    o.drop_last = opt_bool(L, 2, "drop_last", o.drop_last);
    o.seed = (uint64_t)opt_num(L, 2, "seed", 0);
    lucid_ctx *ctx = lucid_lua_ctx(L, 2);
    loader_box *b = lua_newuserdata(L, sizeof *b);
    b->ld = NULL;
    b->ctx = NULL;
    luaL_getmetatable(L, LOADER_MT);
    lua_setmetatable(L, -2);
    lucid_status st = lucid_loader_create(ctx, ds, &o, &b->ld);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    lucid_ctx_retain(ctx);
    b->ctx = ctx;
    return 1;
}

static int l_loader_start_epoch(lua_State *L) {
    loader_box *b = check_loader(L, 1);
    lua_Integer e = lucid_lua_checkinteger(L, 2);
    if (e < 0) lucid_lua_argerror(L, 2, "epoch must be >= 0");
    lucid_aug_params p = check_aug(L, 3);
    lucid_status st = lucid_loader_start_epoch(b->ld, (uint64_t)e, &p);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->ctx, st);
    return 0;
}

static void push_view(lua_State *L, lucid_tensor *t, const char *name) {
    lucid_tensor_retain(t);
    lucid_lua_push_tensor(L, t);
    lua_setfield(L, -2, name);
}

/* The tensors of the returned table are views of the loader's buffers:
 * valid until the next :next() / :start_epoch() (copy them to keep). */
static int l_loader_next(lua_State *L) {
    loader_box *b = check_loader(L, 1);
    lucid_batch *bt = NULL;
    lucid_status st = lucid_loader_next(b->ld, &bt);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->ctx, st);
    if (!bt) {
        lua_pushnil(L);
        return 1;
    }
    lua_createtable(L, 0, 14);
    push_view(L, bt->images, "images");
    push_view(L, bt->cls, "cls");
    push_view(L, bt->boxes, "boxes");
    push_view(L, bt->kpts, "kpts");
    push_view(L, bt->mask, "mask");
    push_view(L, bt->counts, "counts");
    push_view(L, bt->hsv, "hsv");
    lua_pushinteger(L, bt->n);
    lua_setfield(L, -2, "n");
    lua_pushinteger(L, (lua_Integer)bt->index + 1);
    lua_setfield(L, -2, "index");
    lua_pushinteger(L, (lua_Integer)bt->epoch);
    lua_setfield(L, -2, "epoch");
    lua_pushinteger(L, bt->overflow);
    lua_setfield(L, -2, "overflow");
    lua_pushinteger(L, bt->max_count);
    lua_setfield(L, -2, "max_count");
    int B = (int)bt->images->shape[0];
    lua_createtable(L, B, 0);
    for (int j = 0; j < B; j++) {
        lua_pushinteger(L, bt->sample_index[j] >= 0 ? (lua_Integer)bt->sample_index[j] + 1 : 0);
        lua_rawseti(L, -2, j + 1);
    }
    lua_setfield(L, -2, "sample_index");
    return 1;
}

static int l_loader_num_batches(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)lucid_loader_num_batches(check_loader(L, 1)->ld));
    return 1;
}

static int l_loader_free(lua_State *L) {
    loader_box *b = lucid_lua_checkudata(L, 1, LOADER_MT);
    if (b->ld) lucid_loader_release(b->ld);
    if (b->ctx) lucid_ctx_release(b->ctx);
    b->ld = NULL;
    b->ctx = NULL;
    return 0;
}

static int l_loader_tostring(lua_State *L) {
    loader_box *b = lucid_lua_checkudata(L, 1, LOADER_MT);
    if (!b->ld) lua_pushliteral(L, "lucid.Loader(freed)");
    else lua_pushfstring(L, "lucid.Loader(%d batches)",
                         (int)lucid_loader_num_batches(b->ld));
    return 1;
}

/* ------------------------------------------------------------ functions */

static int l_read_yaml(lua_State *L) {
    const char *path = lucid_lua_checkstring(L, 1);
    lucid_ctx *ctx = lucid_lua_ctx(L, 0);
    lucid_data_yaml y;
    lucid_status st = lucid_data_yaml_read(ctx, path, &y);
    if (st != LUCID_OK) return push_failure(L, ctx, st);
    /* no Lua error can happen below except memory exhaustion */
    lua_createtable(L, 0, 9);
    lua_pushstring(L, y.dir);
    lua_setfield(L, -2, "dir");
    if (y.path) { lua_pushstring(L, y.path); lua_setfield(L, -2, "path"); }
    if (y.train) { lua_pushstring(L, y.train); lua_setfield(L, -2, "train"); }
    if (y.val) { lua_pushstring(L, y.val); lua_setfield(L, -2, "val"); }
    if (y.kpt_shape[0] > 0) {
        lua_createtable(L, 2, 0);
        lua_pushinteger(L, y.kpt_shape[0]); lua_rawseti(L, -2, 1);
        lua_pushinteger(L, y.kpt_shape[1]); lua_rawseti(L, -2, 2);
        lua_setfield(L, -2, "kpt_shape");
    }
    if (y.has_flip_idx) {
        lua_createtable(L, y.nflip, 0);
        for (int i = 0; i < y.nflip; i++) {
            lua_pushinteger(L, y.flip_idx[i]);
            lua_rawseti(L, -2, i + 1);
        }
        lua_setfield(L, -2, "flip_idx");
    }
    lua_pushinteger(L, y.nc);
    lua_setfield(L, -2, "nc");
    lua_createtable(L, y.nc, 0);
    for (int i = 0; i < y.nc; i++) {
        lua_pushstring(L, y.names[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "names");
    lucid_data_yaml_free(&y);
    return 1;
}

static int l_decode(lua_State *L) {
    const char *path = lucid_lua_checkstring(L, 1);
    lucid_ctx *ctx = lucid_lua_ctx(L, 2);
    lucid_image img;
    int orient = 1;
    lucid_status st = lucid_image_decode_file(ctx, path, &img, &orient);
    if (st != LUCID_OK) return push_failure(L, ctx, st);
    lucid_device cpu = {LUCID_CPU, 0};
    int64_t shape[3] = {img.h, img.w, 3};
    lucid_tensor *t = NULL;
    st = lucid_tensor_empty(ctx, cpu, LUCID_U8, 3, shape, &t);
    if (st == LUCID_OK) memcpy(lucid_tensor_data(t), img.data, (size_t)img.w * img.h * 3);
    lucid_image_free(&img);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    lucid_lua_push_tensor(L, t);
    lua_pushinteger(L, orient);
    return 2;
}

/* ------------------------------------------------------------ register */

static const luaL_Reg dataset_methods[] = {
    {"size", l_ds_size},           {"stats", l_ds_stats},
    {"summary", l_ds_summary},     {"rejects", l_ds_rejects},
    {"image_path", l_ds_image_path}, {"labels", l_ds_labels},
    {"sample", l_ds_sample},       {"free", l_ds_free},
    {NULL, NULL}};

static const luaL_Reg loader_methods[] = {
    {"start_epoch", l_loader_start_epoch}, {"next", l_loader_next},
    {"num_batches", l_loader_num_batches}, {"free", l_loader_free},
    {NULL, NULL}};

static const luaL_Reg data_funcs[] = {
    {"open_yolo", l_open_yolo}, {"open_coco", l_open_coco},
    {"read_yaml", l_read_yaml}, {"decode", l_decode},
    {"Loader", l_loader_new},   {NULL, NULL}};

static void new_metatable(lua_State *L, const char *name, const luaL_Reg *m,
                          lua_CFunction gc, lua_CFunction tostring,
                          lua_CFunction len) {
    luaL_newmetatable(L, name);
    lua_pushstring(L, name);
    lua_setfield(L, -2, "__name");
    lua_pushcfunction(L, gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, tostring);
    lua_setfield(L, -2, "__tostring");
    if (len) {
        lua_pushcfunction(L, len);
        lua_setfield(L, -2, "__len");
    }
    lua_newtable(L);
    luaL_setfuncs(L, m, 0);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
}

/* Adds lucid.data to the module table on top of the stack. */
int lucid_lua_open_data(lua_State *L) {
    int module = lua_gettop(L);
    new_metatable(L, DATASET_MT, dataset_methods, l_ds_free, l_ds_tostring,
                  l_ds_size);
    new_metatable(L, LOADER_MT, loader_methods, l_loader_free,
                  l_loader_tostring, NULL);
    lua_getfield(L, module, "data");
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        lua_newtable(L);
    }
    luaL_setfuncs(L, data_funcs, 0);
    lua_createtable(L, LUCID_REJECT_COUNT - 1, 0);
    for (int r = 1; r < LUCID_REJECT_COUNT; r++) {
        lua_pushstring(L, lucid_reject_name((lucid_reject)r));
        lua_rawseti(L, -2, r);
    }
    lua_setfield(L, -2, "reject_reasons");
    lua_setfield(L, module, "data");
    return 0;
}
