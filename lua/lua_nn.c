/*
 * lua_nn.c — lucid.nn: the Lua binding of engine/nn (parameter sets,
 * parameters, primitive modules).
 *
 * Userdata (metatables in the registry):
 *   lucid.ParamSet  { lucid_param_set *s; lucid_ctx *ctx }   (one ref each)
 *   lucid.Param     { lucid_param_set *s; lucid_param *p }   (ref on s; p is
 *                    owned by s and valid for its lifetime)
 *   lucid.CModule   { lucid_module *m; lucid_ctx *ctx }      (one ref each)
 *
 * Lua API (indices are 1-based; shapes are Lua arrays):
 *   lucid.nn.ParamSet([opts])          opts.ctx: a Context (default ctx)
 *     set:declare(name, kind, shape, [opts]) -> Param
 *          kind "param" | "buffer"; opts: dtype "f32"|"i64", trainable,
 *          group "decay"|"norm"|"bias"|"none", init {kind=, a=, b=, fan_in=}
 *          with kind "zeros"|"ones"|"constant"|"uniform"|"fan_in"|"arange"
 *     set:materialize([opts])          opts.device ("cpu"), opts.dtype ("f32"
 *                                      or "f64" on the cpu)
 *     set:alias(src)                   instead of materialize: views of src's
 *                                      flat buffers (lucid_param_set_alias)
 *     set:count(), set:get(i), set:find(name) (nil when absent), set:list()
 *     set:numel([kind], [trainable_only]), set:zero_grad(), set:reset(),
 *     set:version(), set:is_materialized(), set:flat_params(),
 *     set:flat_grads(), set:device(), set:dtype()
 *   Param fields: name, kind, dtype, shape, numel, trainable (settable),
 *     group, index (1-based), offset, version; methods p:data(), p:grad()
 *     (tensor views into the flat buffers; grad is nil for buffers).
 *   Module constructors (lucid.nn.*):
 *     conv2d(set, prefix, c1, c2, k, [s=1], [p=-1 autopad], [d=1], [g=1],
 *            [bias=false]), batchnorm2d(set, prefix, c, [eps=1e-3],
 *     [momentum=0.03]), silu(), maxpool2d(k, [s=k], [p=0]), upsample(scale),
 *     concat(n), split(n, [sizes]), add(), softmax(), matmul(ta, tb, alpha),
 *     dfl(set, prefix, [reg_max=16])
 *   Fused pair (engine/nn/nn.h lucid_module_batchnorm2d_silu_*):
 *     batchnorm2d_silu_forward(bn, act, x) -> y: BatchNorm2d module bn then
 *       SiLU module act in one pass (y is act's persistent output; bn's
 *       statistics, running stats and mode as bn:forward)
 *     batchnorm2d_silu_backward(bn, act, x, gy) -> gx (bn's persistent grad
 *       input; nil when bn's need_grad_input is off); accumulates into bn's
 *       trainable weight/bias gradients
 *   Conv block backward-data columns (engine/nn/nn.h lucid_conv_dcols):
 *     conv2d_dcols_reserve(conv, x) -> boolean: reserve conv's columns for
 *       its next backward (x: its forward input); false: none (CPU,
 *       geometry, route, LUCID_BN_EMIT_COLS=0)
 *     batchnorm2d_backward_dcols(bn, act | nil, x, gy, conv) -> gx | nil:
 *       bn's backward (act: the fused pair with that SiLU), also writing
 *       conv's reserved columns; conv's next backward then reads them
 *   BatchNorm backward reading dy as a sum of terms (engine/nn/nn.h
 *   lucid_module_batchnorm2d_backward_terms):
 *     batchnorm2d_backward_terms(bn, act | nil, x, pieces) -> taken, gx:
 *       pieces[i] = {c0, nch, src, src_c0 [, add, add_c0]...} (chan_sum's
 *       pieces without the dst); taken false: nothing done (materialise dy)
 *     batchnorm2d_terms_fit(bn, x) -> boolean: whether such a call would
 *       be taken now (aligned sources)
 *   conv_cast_weights({m1, ...}, dtype): the weights of the Conv2d modules
 *     that can take the cuBLAS 1x1 route (1x1, stride 1, padding 0,
 *     dilation 1, groups 1) rounded to dtype ("bf16" | "f16"; "f32" does
 *     nothing) into their weight shadows in one launch, so their next
 *     forward and backward-data cast nothing (engine/nn/nn.h
 *     lucid_nn_conv_cast_weights); a module of another kind is an error
 *   Fused sums (engine/nn/nn.h lucid_chan_piece, lucid_nn_add_n):
 *     chan_sum({{dst, dst_c0, nch [, src, src_c0 [, add, add_c0]...]}, ...}):
 *       one lucid_nn_channel_copy_multi (0-based channel offsets; no
 *       source: zero fill; 1: copy; 2..4: rounded left-to-right sum)
 *     add_n({x1, ..., xn} [, out]) -> y: ((x1 + x2) + ...) rounded after
 *       each addition, n 1..4, in one call (out or a new tensor)
 *     empty_like(like [, channels]) -> a new uninitialised tensor shaped
 *       like `like` (dim 1 = channels when given), same context
 *     m:ensure_buffer("output" | "grad_input", i, like [, channels]) ->
 *       the module's persistent buffer i (1-based), shaped like `like`
 *       (dim 1 = channels when given), for a fused sum to write
 *   Module methods: m:forward(x | {x1, ...}) -> y | {y1, ...};
 *     m:backward(x | {x1, ...}, gy | {gy1, ...}) -> gx | {gx1, ...} (nil
 *     when need_grad_input is off); m:parameters(), m:buffers() -> {Param};
 *     m:train([mode]), m:eval(), m:need_grad_input(flag), m:kind(),
 *     m:describe(); fields training, ninputs, noutputs; tostring(m).
 *   Reading a name lucid.nn does not have raises (never a silent nil that
 *   fails later as "attempt to call field 'Conv' (a nil value)"): for a
 *   block or function of the Lua library (Conv, C2f, materialize, ...)
 *   "lucid.nn.Conv: no such primitive; the nn blocks (Conv, C2f, ...) are
 *   in require "lucid.nn"", else "lucid.nn.x: no such field". Code that
 *   probes for an optional field uses rawget(lucid.nn, "x").
 * Errors: misuse raises a "bad argument" error naming the argument; engine
 * failures raise "lucid <status>: <message>" (lucid_lua_raise).
 */
#include "lua_common.h"
#include "nn/nn.h"

#include <stdio.h>
#include <string.h>

/* lua/lua_io.c: lucid.io (safetensors), opened together with lucid.nn. */
int lucid_lua_open_io(lua_State *L);

#define PARAMSET_MT "lucid.ParamSet"
#define PARAM_MT "lucid.Param"
#define CMODULE_MT "lucid.CModule"
#define MAX_IO 32

typedef struct {
    lucid_param_set *s;
    lucid_ctx *ctx;
} set_box;

typedef struct {
    lucid_param_set *s;
    lucid_param *p;
} param_box;

typedef struct {
    lucid_module *m;
    lucid_ctx *ctx;
} module_box;

/* --------------------------------------------------------------- helpers */

static set_box *check_set(lua_State *L, int idx) {
    set_box *b = lucid_lua_checkudata(L, idx, PARAMSET_MT);
    if (!b->s) lucid_lua_argerror(L, idx, "parameter set was freed");
    return b;
}

static param_box *check_param(lua_State *L, int idx) {
    return lucid_lua_checkudata(L, idx, PARAM_MT);
}

static module_box *check_module(lua_State *L, int idx) {
    module_box *b = lucid_lua_checkudata(L, idx, CMODULE_MT);
    if (!b->m) lucid_lua_argerror(L, idx, "module was freed");
    return b;
}

static void push_param(lua_State *L, lucid_param_set *s, lucid_param *p) {
    if (!p) {
        lua_pushnil(L);
        return;
    }
    param_box *b = lua_newuserdata(L, sizeof *b);
    b->s = NULL;
    b->p = NULL;
    luaL_getmetatable(L, PARAM_MT);
    lua_setmetatable(L, -2);
    lucid_param_set_retain(s);
    b->s = s;
    b->p = p;
}

static void push_shape(lua_State *L, int ndim, const int64_t *shape) {
    lua_createtable(L, ndim, 0);
    for (int i = 0; i < ndim; i++) {
        lua_pushnumber(L, (lua_Number)shape[i]);
        lua_rawseti(L, -2, i + 1);
    }
}

/* Push a borrowed tensor (takes a new reference). */
static void push_borrowed(lua_State *L, lucid_tensor *t) {
    if (t) lucid_tensor_retain(t);
    lucid_lua_push_tensor(L, t);
}

static int opt_int(lua_State *L, int idx, int def) {
    return lua_isnoneornil(L, idx) ? def : (int)lucid_lua_checkinteger(L, idx);
}

static const char *const group_names[] = {"decay", "norm", "bias", "none", NULL};
static const int group_values[] = {LUCID_PARAM_GROUP_DECAY, LUCID_PARAM_GROUP_NORM,
                                   LUCID_PARAM_GROUP_BIAS, LUCID_PARAM_GROUP_NONE};

static const char *group_name(int g) {
    for (int i = 0; group_names[i]; i++)
        if (group_values[i] == g) return group_names[i];
    return "?";
}

/* ------------------------------------------------------------- ParamSet */

/* lucid.nn.ParamSet([opts]) — an empty parameter set on opts.ctx. */
static int l_set_new(lua_State *L) {
    static const char *const keys[] = {"ctx", NULL};
    lucid_lua_check_nargs(L, 1);
    lucid_lua_check_keys(L, 1, keys);
    lucid_ctx *ctx = lucid_lua_ctx(L, lua_istable(L, 1) ? 1 : 0);
    set_box *b = lua_newuserdata(L, sizeof *b);
    b->s = NULL;
    b->ctx = NULL;
    luaL_getmetatable(L, PARAMSET_MT);
    lua_setmetatable(L, -2);
    lucid_status st = lucid_param_set_create(ctx, &b->s);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    lucid_ctx_retain(ctx);
    b->ctx = ctx;
    return 1;
}

static int l_set_gc(lua_State *L) {
    set_box *b = lucid_lua_checkudata(L, 1, PARAMSET_MT);
    if (b->s) lucid_param_set_release(b->s);
    if (b->ctx) lucid_ctx_release(b->ctx);
    b->s = NULL;
    b->ctx = NULL;
    return 0;
}

static lucid_init_kind check_init_kind(lua_State *L, int idx, const char *name) {
    static const char *const names[] = {"zeros", "ones", "constant", "uniform",
                                        "fan_in", "arange", NULL};
    static const lucid_init_kind kinds[] = {LUCID_INIT_ZEROS, LUCID_INIT_ONES,
                                            LUCID_INIT_CONSTANT, LUCID_INIT_UNIFORM,
                                            LUCID_INIT_FAN_IN, LUCID_INIT_ARANGE};
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], name) == 0) return kinds[i];
    lucid_lua_argerror(L, idx, lua_pushfstring(L, "opts.init.kind: unknown '%s' (zeros, "
                                             "ones, constant, uniform, fan_in, arange)",
                                          name));
    return LUCID_INIT_ZEROS;
}

static double field_number(lua_State *L, int t, const char *k, double def) {
    lua_getfield(L, t, k);
    double v = lua_isnil(L, -1) ? def : lucid_lua_checknumber(L, -1);
    lua_pop(L, 1);
    return v;
}

/* set:declare(name, kind, shape, [opts]) -> Param */
static int l_set_declare(lua_State *L) {
    set_box *b = check_set(L, 1);
    const char *name = lucid_lua_checkstring(L, 2);
    static const char *const kinds[] = {"param", "buffer", NULL};
    int kind = lucid_lua_checkoption(L, 3, NULL, kinds);
    int64_t shape[LUCID_MAX_DIMS];
    int ndim = 0;
    lucid_lua_checktype(L, 4, LUA_TTABLE);
    if (lua_objlen(L, 4) > 0) ndim = lucid_lua_check_shape(L, 4, shape, "shape");
    lucid_dtype dt = LUCID_F32;
    int trainable = kind == 0;
    int group = kind == 0 ? LUCID_PARAM_GROUP_DECAY : LUCID_PARAM_GROUP_NONE;
    lucid_init_rule init = {LUCID_INIT_ZEROS, 0.0, 0.0, 0};
    static const char *const keys[] = {"dtype", "trainable", "group", "init", NULL};
    lucid_lua_check_nargs(L, 5);
    lucid_lua_check_keys(L, 5, keys);
    if (lua_istable(L, 5)) {
        dt = lucid_lua_opt_dtype(L, 5, "dtype", LUCID_F32);
        lua_getfield(L, 5, "trainable");
        if (!lua_isnil(L, -1)) trainable = lua_toboolean(L, -1);
        lua_pop(L, 1);
        lua_getfield(L, 5, "group");
        if (!lua_isnil(L, -1)) group = group_values[lucid_lua_checkoption(L, -1, NULL, group_names)];
        lua_pop(L, 1);
        lua_getfield(L, 5, "init");
        if (lua_istable(L, -1)) {
            int t = lua_gettop(L);
            lua_getfield(L, t, "kind");
            init.kind = check_init_kind(L, 5, lucid_lua_optstring(L, -1, "zeros"));
            lua_pop(L, 1);
            init.a = field_number(L, t, "a", 0.0);
            init.b = field_number(L, t, "b", 0.0);
            init.fan_in = (int64_t)field_number(L, t, "fan_in", 0.0);
        }
        lua_pop(L, 1);
    }
    lucid_param *p = NULL;
    lucid_status st = lucid_param_set_declare(b->ctx, b->s, name,
                                              kind == 0 ? LUCID_PARAM_KIND_PARAM
                                                        : LUCID_PARAM_KIND_BUFFER,
                                              dt, ndim, shape, trainable, group,
                                              &init, &p);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->ctx, st);
    push_param(L, b->s, p);
    return 1;
}

/* set:materialize([opts]) — allocate the flat buffers and run the inits. */
static int l_set_materialize(lua_State *L) {
    set_box *b = check_set(L, 1);
    /* default device as for tensors: the CPU, or the context's device when
     * a context is given explicitly (PyTorch: CPU unless asked) */
    lucid_device dev = {LUCID_CPU, 0};
    lucid_dtype dt = LUCID_F32;
    static const char *const keys[] = {"device", "dtype", "ctx", NULL};
    lucid_lua_check_nargs(L, 2);
    lucid_lua_check_keys(L, 2, keys);
    if (lua_istable(L, 2)) {
        lua_getfield(L, 2, "ctx");
        if (!lua_isnil(L, -1)) dev = lucid_ctx_device(b->ctx);
        lua_pop(L, 1);
        dev = lucid_lua_opt_device(L, 2, "device", dev);
        dt = lucid_lua_opt_dtype(L, 2, "dtype", LUCID_F32);
    }
    lucid_status st = lucid_param_set_materialize(b->ctx, b->s, dev, dt);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->ctx, st);
    lua_settop(L, 1);
    return 1;
}

/* set:alias(src) — materialize as views of src's flat buffers
 * (lucid_param_set_alias: the same declarations required; no init). */
static int l_set_alias(lua_State *L) {
    set_box *b = check_set(L, 1);
    set_box *src = check_set(L, 2);
    lucid_lua_check_nargs(L, 2);
    lucid_status st = lucid_param_set_alias(b->ctx, b->s, src->s);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->ctx, st);
    lua_settop(L, 1);
    return 1;
}

static int l_set_count(lua_State *L) {
    lua_pushinteger(L, lucid_param_set_count(check_set(L, 1)->s));
    return 1;
}

static int l_set_get(lua_State *L) {
    set_box *b = check_set(L, 1);
    int i = (int)lucid_lua_checkinteger(L, 2);
    int n = lucid_param_set_count(b->s);
    if (i < 1 || i > n)
        return lucid_lua_argerror(L, 2, lua_pushfstring(L, "index %d out of range 1..%d", i, n));
    push_param(L, b->s, lucid_param_set_get(b->s, i - 1));
    return 1;
}

static int l_set_find(lua_State *L) {
    set_box *b = check_set(L, 1);
    push_param(L, b->s, lucid_param_set_find(b->s, lucid_lua_checkstring(L, 2)));
    return 1;
}

/* set:list([kind]) -> {Param} in declaration order (kind filters). */
static int l_set_list(lua_State *L) {
    set_box *b = check_set(L, 1);
    static const char *const kinds[] = {"all", "param", "buffer", NULL};
    int k = lucid_lua_checkoption(L, 2, "all", kinds);
    int n = lucid_param_set_count(b->s), j = 0;
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lucid_param *p = lucid_param_set_get(b->s, i);
        if (k == 1 && p->kind != LUCID_PARAM_KIND_PARAM) continue;
        if (k == 2 && p->kind != LUCID_PARAM_KIND_BUFFER) continue;
        push_param(L, b->s, p);
        lua_rawseti(L, -2, ++j);
    }
    return 1;
}

/* set:numel([kind="param"], [trainable_only=false]) */
static int l_set_numel(lua_State *L) {
    set_box *b = check_set(L, 1);
    static const char *const kinds[] = {"param", "buffer", NULL};
    int k = lucid_lua_checkoption(L, 2, "param", kinds);
    lua_pushnumber(L, (lua_Number)lucid_param_set_numel(
                          b->s, k == 0 ? LUCID_PARAM_KIND_PARAM : LUCID_PARAM_KIND_BUFFER,
                          lua_toboolean(L, 3)));
    return 1;
}

static int l_set_zero_grad(lua_State *L) {
    set_box *b = check_set(L, 1);
    lucid_status st = lucid_param_set_zero_grad(b->ctx, b->s);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->ctx, st);
    return 0;
}

static int l_set_reset(lua_State *L) {
    set_box *b = check_set(L, 1);
    lucid_status st = lucid_param_set_reset(b->ctx, b->s);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->ctx, st);
    return 0;
}

static int l_set_version(lua_State *L) {
    lua_pushnumber(L, (lua_Number)lucid_param_set_version(check_set(L, 1)->s));
    return 1;
}

static int l_set_is_materialized(lua_State *L) {
    lua_pushboolean(L, lucid_param_set_is_materialized(check_set(L, 1)->s));
    return 1;
}

static int l_set_flat_params(lua_State *L) {
    push_borrowed(L, lucid_param_set_flat_params(check_set(L, 1)->s));
    return 1;
}

static int l_set_flat_grads(lua_State *L) {
    push_borrowed(L, lucid_param_set_flat_grads(check_set(L, 1)->s));
    return 1;
}

static int l_set_device(lua_State *L) {
    set_box *b = check_set(L, 1);
    lucid_device d = lucid_param_set_device(b->s);
    if (d.type == LUCID_CUDA) lua_pushfstring(L, "cuda:%d", d.index);
    else lua_pushliteral(L, "cpu");
    return 1;
}

static int l_set_dtype(lua_State *L) {
    lua_pushstring(L, lucid_dtype_name(lucid_param_set_dtype(check_set(L, 1)->s)));
    return 1;
}

static int l_set_tostring(lua_State *L) {
    set_box *b = check_set(L, 1);
    lua_pushfstring(L, "ParamSet(%d entries, %f parameters)", lucid_param_set_count(b->s),
                    (lua_Number)lucid_param_set_numel(b->s, LUCID_PARAM_KIND_PARAM, 0));
    return 1;
}

/* ---------------------------------------------------------------- Param */

static int l_param_gc(lua_State *L) {
    param_box *b = lucid_lua_checkudata(L, 1, PARAM_MT);
    if (b->s) lucid_param_set_release(b->s);
    b->s = NULL;
    b->p = NULL;
    return 0;
}

static int l_param_data(lua_State *L) {
    param_box *b = check_param(L, 1);
    if (!b->p->data)
        return luaL_error(L, "param %s: not materialized (call materialize first)",
                          b->p->name);
    push_borrowed(L, b->p->data);
    return 1;
}

static int l_param_grad(lua_State *L) {
    param_box *b = check_param(L, 1);
    if (b->p->kind == LUCID_PARAM_KIND_PARAM && !b->p->grad)
        return luaL_error(L, "param %s: not materialized (call materialize first)",
                          b->p->name);
    push_borrowed(L, b->p->grad);
    return 1;
}

static int l_param_index(lua_State *L) {
    param_box *b = check_param(L, 1);
    const char *k = lucid_lua_checkstring(L, 2);
    const lucid_param *p = b->p;
    if (strcmp(k, "name") == 0) lua_pushstring(L, p->name);
    else if (strcmp(k, "kind") == 0)
        lua_pushstring(L, p->kind == LUCID_PARAM_KIND_PARAM ? "param" : "buffer");
    else if (strcmp(k, "dtype") == 0) lua_pushstring(L, lucid_dtype_name(p->dtype));
    else if (strcmp(k, "shape") == 0) push_shape(L, p->ndim, p->shape);
    else if (strcmp(k, "numel") == 0) lua_pushnumber(L, (lua_Number)p->numel);
    else if (strcmp(k, "trainable") == 0) lua_pushboolean(L, p->trainable);
    else if (strcmp(k, "group") == 0) lua_pushstring(L, group_name(p->group));
    else if (strcmp(k, "index") == 0) lua_pushinteger(L, p->index + 1);
    else if (strcmp(k, "offset") == 0) lua_pushnumber(L, (lua_Number)p->offset);
    else if (strcmp(k, "version") == 0) lua_pushnumber(L, (lua_Number)p->version);
    else if (strcmp(k, "data") == 0) lua_pushcfunction(L, l_param_data);
    else if (strcmp(k, "grad") == 0) lua_pushcfunction(L, l_param_grad);
    else lua_pushnil(L);
    return 1;
}

/* p.trainable = bool (the only settable field). */
static int l_param_newindex(lua_State *L) {
    param_box *b = check_param(L, 1);
    const char *k = lucid_lua_checkstring(L, 2);
    if (strcmp(k, "trainable") != 0)
        return lucid_lua_argerror(L, 2, lua_pushfstring(L, "param field '%s' is read-only "
                                                      "(only 'trainable' is settable)", k));
    if (b->p->kind != LUCID_PARAM_KIND_PARAM)
        return luaL_error(L, "param %s: a buffer cannot be made trainable", b->p->name);
    lucid_ctx *ctx = lucid_lua_ctx(L, 0);
    lucid_status st = lucid_param_set_trainable(ctx, b->s, b->p, lua_toboolean(L, 3));
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    return 0;
}

static int l_param_tostring(lua_State *L) {
    param_box *b = check_param(L, 1);
    const lucid_param *p = b->p;
    char shp[256];
    size_t n = 0;
    shp[0] = '\0';
    for (int i = 0; i < p->ndim && n < sizeof shp - 24; i++)
        n += (size_t)snprintf(shp + n, sizeof shp - n, "%s%lld", i ? ", " : "",
                              (long long)p->shape[i]);
    lua_pushfstring(L, "Param(%s, [%s], %s, %s)", p->name, shp, lucid_dtype_name(p->dtype),
                    p->kind == LUCID_PARAM_KIND_BUFFER ? "buffer"
                    : p->trainable                     ? "trainable"
                                                       : "frozen");
    return 1;
}

static int l_param_eq(lua_State *L) {
    param_box *a = luaL_testudata(L, 1, PARAM_MT), *b = luaL_testudata(L, 2, PARAM_MT);
    lua_pushboolean(L, a && b && a->p == b->p);
    return 1;
}

/* --------------------------------------------------------------- Module */

/* Box a freshly created module (takes over the reference). */
static int push_module(lua_State *L, lucid_ctx *ctx, lucid_status st, lucid_module *m) {
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    module_box *b = lua_newuserdata(L, sizeof *b);
    b->m = m;
    b->ctx = ctx;
    lucid_ctx_retain(ctx);
    luaL_getmetatable(L, CMODULE_MT);
    lua_setmetatable(L, -2);
    return 1;
}

static int l_module_gc(lua_State *L) {
    module_box *b = lucid_lua_checkudata(L, 1, CMODULE_MT);
    if (b->m) lucid_module_release(b->m);
    if (b->ctx) lucid_ctx_release(b->ctx);
    b->m = NULL;
    b->ctx = NULL;
    return 0;
}

static int l_conv2d(lua_State *L) {
    set_box *s = check_set(L, 1);
    const char *prefix = lucid_lua_checkstring(L, 2);
    int c1 = (int)lucid_lua_checkinteger(L, 3), c2 = (int)lucid_lua_checkinteger(L, 4);
    int k = (int)lucid_lua_checkinteger(L, 5);
    int st_ = opt_int(L, 6, 1), p = opt_int(L, 7, -1), d = opt_int(L, 8, 1);
    int g = opt_int(L, 9, 1), bias = lua_toboolean(L, 10);
    lucid_module *m = NULL;
    lucid_status st = lucid_module_conv2d_create(s->ctx, s->s, prefix, c1, c2, k, st_, p,
                                                 d, g, bias, &m);
    return push_module(L, s->ctx, st, m);
}

static int l_batchnorm2d(lua_State *L) {
    set_box *s = check_set(L, 1);
    const char *prefix = lucid_lua_checkstring(L, 2);
    int c = (int)lucid_lua_checkinteger(L, 3);
    double eps = lucid_lua_optnumber(L, 4, 1e-3), mom = lucid_lua_optnumber(L, 5, 0.03);
    lucid_module *m = NULL;
    lucid_status st = lucid_module_batchnorm2d_create(s->ctx, s->s, prefix, c, eps, mom, &m);
    return push_module(L, s->ctx, st, m);
}

static int l_dfl(lua_State *L) {
    set_box *s = check_set(L, 1);
    const char *prefix = lucid_lua_checkstring(L, 2);
    int r = opt_int(L, 3, 16);
    lucid_module *m = NULL;
    lucid_status st = lucid_module_dfl_create(s->ctx, s->s, prefix, r, &m);
    return push_module(L, s->ctx, st, m);
}

/* Parameter-free modules take an optional trailing opts table {ctx=}. */
static lucid_ctx *free_ctx(lua_State *L) {
    int top = lua_gettop(L);
    return lucid_lua_ctx(L, top > 0 && lua_istable(L, top) ? top : 0);
}

static int l_silu(lua_State *L) {
    lucid_ctx *ctx = free_ctx(L);
    lucid_module *m = NULL;
    lucid_status st = lucid_module_silu_create(ctx, &m);
    return push_module(L, ctx, st, m);
}

static int l_maxpool2d(lua_State *L) {
    int k = (int)lucid_lua_checkinteger(L, 1);
    int s = opt_int(L, 2, k), p = opt_int(L, 3, 0);
    lucid_ctx *ctx = free_ctx(L);
    lucid_module *m = NULL;
    lucid_status st = lucid_module_maxpool2d_create(ctx, k, s, p, &m);
    return push_module(L, ctx, st, m);
}

static int l_upsample(lua_State *L) {
    int scale = (int)lucid_lua_checkinteger(L, 1);
    lucid_ctx *ctx = free_ctx(L);
    lucid_module *m = NULL;
    lucid_status st = lucid_module_upsample_create(ctx, scale, &m);
    return push_module(L, ctx, st, m);
}

static int l_concat(lua_State *L) {
    int n = (int)lucid_lua_checkinteger(L, 1);
    lucid_ctx *ctx = free_ctx(L);
    lucid_module *m = NULL;
    lucid_status st = lucid_module_concat_create(ctx, n, &m);
    return push_module(L, ctx, st, m);
}

/* split(n, [sizes]) — sizes: Lua array of n channel counts (nil: chunk). */
static int l_split(lua_State *L) {
    int n = (int)lucid_lua_checkinteger(L, 1);
    int64_t sizes[MAX_IO];
    int have = lua_istable(L, 2) && lua_objlen(L, 2) > 0;
    if (n < 1 || n > MAX_IO)
        return lucid_lua_argerror(L, 1, lua_pushfstring(L, "n: expected 1..%d, got %d", MAX_IO, n));
    if (have) {
        if ((int)lua_objlen(L, 2) != n)
            return lucid_lua_argerror(L, 2, lua_pushfstring(L, "sizes: expected %d entries, got %d",
                                                       n, (int)lua_objlen(L, 2)));
        for (int i = 0; i < n; i++) {
            lua_rawgeti(L, 2, i + 1);
            sizes[i] = (int64_t)lucid_lua_checkinteger(L, -1);
            lua_pop(L, 1);
        }
    }
    lucid_ctx *ctx = free_ctx(L);
    lucid_module *m = NULL;
    lucid_status st = lucid_module_split_create(ctx, n, have ? sizes : NULL, &m);
    return push_module(L, ctx, st, m);
}

static int l_add(lua_State *L) {
    lucid_ctx *ctx = free_ctx(L);
    lucid_module *m = NULL;
    lucid_status st = lucid_module_add_create(ctx, &m);
    return push_module(L, ctx, st, m);
}

static int l_softmax(lua_State *L) {
    lucid_ctx *ctx = free_ctx(L);
    lucid_module *m = NULL;
    lucid_status st = lucid_module_softmax_create(ctx, &m);
    return push_module(L, ctx, st, m);
}

/* matmul(trans_a, trans_b, [alpha=1]) */
static int l_matmul(lua_State *L) {
    int ta = lua_toboolean(L, 1), tb = lua_toboolean(L, 2);
    double alpha = lucid_lua_optnumber(L, 3, 1.0);
    lucid_ctx *ctx = free_ctx(L);
    lucid_module *m = NULL;
    lucid_status st = lucid_module_matmul_create(ctx, ta, tb, alpha, &m);
    return push_module(L, ctx, st, m);
}

/* Gather tensors from idx (a tensor, or an array of tensors; nil entries
 * allowed when nullable) into out[]; returns the count. */
static int gather(lua_State *L, int idx, const char *what, int nullable,
                  const lucid_tensor **out, int expect) {
    if (!lua_istable(L, idx)) {
        if (nullable && lua_isnoneornil(L, idx)) {
            out[0] = NULL;
            return 1;
        }
        out[0] = lucid_lua_check_tensor(L, idx, what);
        return 1;
    }
    int n = expect > 0 ? expect : (int)lua_objlen(L, idx);
    if (n > MAX_IO)
        return lucid_lua_argerror(L, idx, lua_pushfstring(L, "%s: at most %d tensors", what, MAX_IO));
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, idx, i + 1);
        if (nullable && lua_isnil(L, -1)) {
            out[i] = NULL;
        } else {
            lucid_tensor *t = lucid_lua_to_tensor(L, -1);
            if (!t)
                lucid_lua_argerror(L, idx, lua_pushfstring(L, "%s[%d]: expected lucid.Tensor, got %s",
                                                      what, i + 1, luaL_typename(L, -1)));
            out[i] = t;
        }
        lua_pop(L, 1);
    }
    return n;
}

/* m:forward(x | {x1, ...}) -> y (one output) | {y1, ...} */
static int l_module_forward(lua_State *L) {
    module_box *b = check_module(L, 1);
    const lucid_tensor *in[MAX_IO];
    int nin = gather(L, 2, "input", 0, in, 0);
    if (nin != b->m->ninputs)
        return lucid_lua_argerror(L, 2, lua_pushfstring(L, "input: %s takes %d input(s), got %d",
                                                   lucid_module_kind(b->m), b->m->ninputs,
                                                   nin));
    lucid_status st = lucid_module_forward(b->ctx, b->m, nin, in);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->ctx, st);
    if (b->m->noutputs == 1) {
        push_borrowed(L, lucid_module_output(b->m, 0));
        return 1;
    }
    lua_createtable(L, b->m->noutputs, 0);
    for (int i = 0; i < b->m->noutputs; i++) {
        push_borrowed(L, lucid_module_output(b->m, i));
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

/* m:backward(x | {x...}, gy | {gy...}) -> gx | {gx...} (nil entries when
 * need_grad_input is off). */
static int l_module_backward(lua_State *L) {
    module_box *b = check_module(L, 1);
    const lucid_tensor *in[MAX_IO], *gout[MAX_IO];
    int nin = gather(L, 2, "input", 0, in, 0);
    if (nin != b->m->ninputs)
        return lucid_lua_argerror(L, 2, lua_pushfstring(L, "input: %s takes %d input(s), got %d",
                                                   lucid_module_kind(b->m), b->m->ninputs,
                                                   nin));
    int nout = b->m->noutputs;
    if (nout == 1 && !lua_istable(L, 3)) gather(L, 3, "grad_output", 1, gout, 0);
    else {
        lucid_lua_checktype(L, 3, LUA_TTABLE);
        gather(L, 3, "grad_output", 1, gout, nout);
    }
    lucid_status st = lucid_module_backward(b->ctx, b->m, nin, in, nout, gout);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->ctx, st);
    if (!b->m->need_grad_input) {
        lua_pushnil(L);
        return 1;
    }
    if (nin == 1 && !lua_istable(L, 2)) {
        push_borrowed(L, lucid_module_grad_input(b->m, 0));
        return 1;
    }
    lua_createtable(L, nin, 0);
    for (int i = 0; i < nin; i++) {
        push_borrowed(L, lucid_module_grad_input(b->m, i));
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

/* batchnorm2d_silu_forward(bn, act, x) -> y */
static int l_bn_silu_forward(lua_State *L) {
    module_box *bn = check_module(L, 1), *act = check_module(L, 2);
    lucid_tensor *x = lucid_lua_check_tensor(L, 3, "input");
    lucid_tensor *y = NULL;
    lucid_status st = lucid_module_batchnorm2d_silu_forward(bn->ctx, bn->m, act->m, x, &y);
    if (st != LUCID_OK) return lucid_lua_raise(L, bn->ctx, st);
    push_borrowed(L, y);
    return 1;
}

/* batchnorm2d_silu_backward(bn, act, x, gy) -> gx | nil */
static int l_bn_silu_backward(lua_State *L) {
    module_box *bn = check_module(L, 1), *act = check_module(L, 2);
    lucid_tensor *x = lucid_lua_check_tensor(L, 3, "input");
    lucid_tensor *gy = lucid_lua_check_tensor(L, 4, "grad_output");
    lucid_tensor *gx = NULL;
    lucid_status st =
        lucid_module_batchnorm2d_silu_backward(bn->ctx, bn->m, act->m, x, gy, &gx);
    if (st != LUCID_OK) return lucid_lua_raise(L, bn->ctx, st);
    if (!gx) lua_pushnil(L);
    else push_borrowed(L, gx);
    return 1;
}

/* conv2d_dcols_reserve(conv, x) -> boolean: step 1 of the BatchNorm
 * backward writing the conv's backward-data columns (engine/nn/nn.h
 * lucid_module_conv2d_dcols_reserve); x is the conv's forward input. */
static int l_conv2d_dcols_reserve(lua_State *L) {
    module_box *conv = check_module(L, 1);
    lucid_tensor *x = lucid_lua_check_tensor(L, 2, "input");
    int armed = 0;
    lucid_status st = lucid_module_conv2d_dcols_reserve(conv->ctx, conv->m, x, &armed);
    if (st != LUCID_OK) return lucid_lua_raise(L, conv->ctx, st);
    lua_pushboolean(L, armed);
    return 1;
}

/* batchnorm2d_backward_dcols(bn, act | nil, x, gy, conv) -> gx | nil: the
 * backward of bn (act nil: BatchNorm2d alone; act a SiLU: the fused pair)
 * writing conv's reserved columns (lucid_module_batchnorm2d_backward_dcols). */
static int l_bn_backward_dcols(lua_State *L) {
    module_box *bn = check_module(L, 1);
    module_box *act = lua_isnoneornil(L, 2) ? NULL : check_module(L, 2);
    lucid_tensor *x = lucid_lua_check_tensor(L, 3, "input");
    lucid_tensor *gy = lucid_lua_check_tensor(L, 4, "grad_output");
    module_box *conv = check_module(L, 5);
    lucid_tensor *gx = NULL;
    lucid_status st = lucid_module_batchnorm2d_backward_dcols(bn->ctx, bn->m, act ? act->m : NULL,
                                                              x, gy, conv->m, &gx);
    if (st != LUCID_OK) return lucid_lua_raise(L, bn->ctx, st);
    if (!gx) lua_pushnil(L);
    else push_borrowed(L, gx);
    return 1;
}

/* conv_cast_weights({m1, ...}, dtype): the weights of the Conv2d modules
 * that can take the cuBLAS 1x1 route, rounded to the activation dtype into
 * their shadows in one launch (engine/nn/nn.h lucid_nn_conv_cast_weights).
 * dtype: "bf16" | "f16" | "f32" (f32: nothing to do).  Every module must be
 * a Conv2d CModule of one context. */
static int l_conv_cast_weights(lua_State *L) {
    lucid_lua_checktype(L, 1, LUA_TTABLE);
    const char *dn = lucid_lua_checkstring(L, 2);
    lucid_dtype dt;
    if (lucid_dtype_parse(dn, &dt) != 0 || (dt != LUCID_F32 && dt != LUCID_BF16 && dt != LUCID_F16))
        return lucid_lua_argerror(L, 2, lua_pushfstring(L, "dtype: expected \"bf16\", \"f16\" or "
                                                            "\"f32\", got '%s'", dn));
    int n = (int)lua_objlen(L, 1);
    if (n == 0) return 0;
    lucid_module **mods = lua_newuserdata(L, (size_t)n * sizeof *mods); /* freed by the GC */
    lucid_ctx *ctx = NULL;
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 1, i + 1);
        module_box *b = luaL_testudata(L, -1, CMODULE_MT);
        if (!b || !b->m)
            return lucid_lua_argerror(L, 1, lua_pushfstring(L, "modules[%d]: expected lucid.CModule, got %s",
                                                            i + 1, luaL_typename(L, -1)));
        if (ctx && b->ctx != ctx)
            return lucid_lua_argerror(L, 1, lua_pushfstring(L, "modules[%d]: belongs to another "
                                                               "context than modules[1]", i + 1));
        ctx = b->ctx;
        mods[i] = b->m;
        lua_pop(L, 1);
    }
    lucid_status st = lucid_nn_conv_cast_weights(ctx, mods, n, dt);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    return 0;
}

/* An integer entry k of the piece table at index t (pieces[i] of argument
 * arg); raises naming the piece and the entry. */
static int64_t piece_int_at(lua_State *L, int arg, int t, int k, int i, const char *what) {
    lua_rawgeti(L, t, k);
    int isnum = lua_type(L, -1) == LUA_TNUMBER;
    lua_Number v = isnum ? lua_tonumber(L, -1) : 0;
    lua_pop(L, 1);
    if (!isnum || v != (lua_Number)(int64_t)v)
        lucid_lua_argerror(L, arg, lua_pushfstring(L, "pieces[%d][%d] (%s): expected an integer",
                                                   i + 1, k, what));
    return (int64_t)v;
}

/* A tensor entry k of the piece table at index t; raises like piece_int_at. */
static lucid_tensor *piece_tensor_at(lua_State *L, int arg, int t, int k, int i,
                                     const char *what) {
    lua_rawgeti(L, t, k);
    lucid_tensor *x = lucid_lua_to_tensor(L, -1);
    if (!x)
        lucid_lua_argerror(L, arg, lua_pushfstring(L, "pieces[%d][%d] (%s): expected lucid.Tensor, "
                                                      "got %s",
                                                   i + 1, k, what, luaL_typename(L, -1)));
    lua_pop(L, 1); /* the piece table holds a reference */
    return x;
}

/* The same for argument 1 (chan_sum's pieces). */
static int64_t piece_int(lua_State *L, int t, int k, int i, const char *what) {
    return piece_int_at(L, 1, t, k, i, what);
}
static lucid_tensor *piece_tensor(lua_State *L, int t, int k, int i, const char *what) {
    return piece_tensor_at(L, 1, t, k, i, what);
}

/* chan_sum(pieces): lucid_nn_channel_copy_multi (engine/nn/nn.h) over
 * pieces[i] = {dst, dst_c0, nch [, src, src_c0 [, add, add_c0]...]}
 * (channel offsets 0-based, 1..LUCID_CHAN_PIECES_MAX pieces): no source
 * zeroes dst's channels [dst_c0, dst_c0+nch), one copies src's, 2..4 write
 * their rounded left-to-right sum (the bits of src:add(add1):add(add2)...).
 * One launch on the GPU per 16 pieces. Returns nothing; engine errors
 * (overlap, shapes, dtypes) raise. */
static int l_chan_sum(lua_State *L) {
    lucid_lua_checktype(L, 1, LUA_TTABLE);
    int n = (int)lua_objlen(L, 1);
    if (n < 1 || n > LUCID_CHAN_PIECES_MAX)
        return lucid_lua_argerror(L, 1, lua_pushfstring(L, "pieces: expected 1..%d pieces, got %d",
                                                        LUCID_CHAN_PIECES_MAX, n));
    lucid_chan_piece pc[LUCID_CHAN_PIECES_MAX];
    memset(pc, 0, sizeof pc);
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 1, i + 1);
        int t = lua_gettop(L);
        int len = lua_istable(L, t) ? (int)lua_objlen(L, t) : -1;
        if (len < 3 || (len - 3) % 2 != 0 || (len - 3) / 2 > LUCID_CHAN_SUM_MAX)
            return lucid_lua_argerror(L, 1, lua_pushfstring(L, "pieces[%d]: expected {dst, dst_c0, nch "
                                                               "[, src, src_c0 [, add, add_c0]...]} "
                                                               "with at most %d sources",
                                                            i + 1, LUCID_CHAN_SUM_MAX));
        lucid_chan_piece *p = &pc[i];
        p->dst = piece_tensor(L, t, 1, i, "dst");
        p->dst_c0 = piece_int(L, t, 2, i, "dst_c0");
        p->nch = piece_int(L, t, 3, i, "nch");
        for (int k = 0; k < (len - 3) / 2; k++) {
            lucid_tensor *x = piece_tensor(L, t, 4 + 2 * k, i, k ? "add" : "src");
            int64_t c0 = piece_int(L, t, 5 + 2 * k, i, k ? "add_c0" : "src_c0");
            if (k == 0) {
                p->src = x;
                p->src_c0 = c0;
            } else {
                p->add[k - 1] = x;
                p->add_c0[k - 1] = c0;
            }
        }
        lua_pop(L, 1);
    }
    lucid_ctx *ctx = lucid_tensor_ctx(pc[0].dst);
    lucid_status st = lucid_nn_channel_copy_multi(ctx, n, pc);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    return 0;
}

/* add_n({x1, ..., xn} [, out]) -> y: ((x1 + x2) + x3) + ..., one rounding
 * per addition (the bits of x1:add(x2):add(x3)...), in one call
 * (engine/nn/nn.h lucid_nn_add_n: n in 1..4, one shape of rank >= 2, one
 * float dtype, one device). y: out (written, returned) or a new tensor. */
static int l_add_n(lua_State *L) {
    lucid_lua_checktype(L, 1, LUA_TTABLE);
    int n = (int)lua_objlen(L, 1);
    if (n < 1 || n > LUCID_CHAN_SUM_MAX)
        return lucid_lua_argerror(L, 1, lua_pushfstring(L, "x: expected 1..%d tensors, got %d",
                                                        LUCID_CHAN_SUM_MAX, n));
    const lucid_tensor *x[LUCID_CHAN_SUM_MAX];
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 1, i + 1);
        x[i] = lucid_lua_to_tensor(L, -1);
        if (!x[i])
            return lucid_lua_argerror(L, 1, lua_pushfstring(L, "x[%d]: expected lucid.Tensor, got %s",
                                                            i + 1, luaL_typename(L, -1)));
        lua_pop(L, 1);
    }
    lucid_ctx *ctx = lucid_tensor_ctx(x[0]);
    if (!lua_isnoneornil(L, 2)) {
        lucid_tensor *y = lucid_lua_check_tensor(L, 2, "out");
        lucid_status st = lucid_nn_add_n(ctx, n, x, y);
        if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
        lua_settop(L, 2);
        return 1;
    }
    lucid_tensor *y = NULL;
    lucid_status st = lucid_tensor_empty(ctx, lucid_tensor_device(x[0]), x[0]->dtype, x[0]->ndim,
                                         x[0]->shape, &y);
    if (st == LUCID_OK) st = lucid_nn_add_n(ctx, n, x, y);
    if (st != LUCID_OK) {
        lucid_tensor_release(y);
        return lucid_lua_raise(L, ctx, st);
    }
    lucid_lua_push_tensor(L, y);
    return 1;
}

/* batchnorm2d_backward_terms(bn, act | nil, x, pieces) -> taken, gx | nil:
 * the backward of BatchNorm2d module bn (act nil) or of the fused pair (act
 * a SiLU) with its grad_output given as a gradient description (engine/nn/
 * nn.h lucid_module_batchnorm2d_backward_terms): pieces[i] = {c0, nch, src,
 * src_c0 [, add, add_c0]...} (chan_sum's piece without the dst: channels
 * [c0, c0 + nch) of dy, 0-based, are src's channels from src_c0, or the
 * rounded left-to-right sum of 2..4 sources), the pieces tiling dy's
 * channels in order, at most LUCID_BN_TERMS_PIECES.  taken true: bn's
 * persistent grad input gx (nil when its need_grad_input is off) and the
 * parameter gradients accumulated; false: nothing was done (the CPU, eval,
 * multi-part channels, LUCID_BN_DY_TERMS=0, ...): materialise dy and call
 * the plain backward.  Malformed pieces and engine errors raise. */
static int l_bn_backward_terms(lua_State *L) {
    module_box *bn = check_module(L, 1);
    module_box *act = lua_isnoneornil(L, 2) ? NULL : check_module(L, 2);
    lucid_tensor *x = lucid_lua_check_tensor(L, 3, "input");
    lucid_lua_checktype(L, 4, LUA_TTABLE);
    int n = (int)lua_objlen(L, 4);
    if (n < 1 || n > LUCID_BN_TERMS_PIECES) {
        /* more pieces than the engine reads: never taken */
        if (n > LUCID_BN_TERMS_PIECES) {
            lua_pushboolean(L, 0);
            return 1;
        }
        return lucid_lua_argerror(L, 4, "pieces: expected 1 or more pieces, got none");
    }
    lucid_chan_piece pc[LUCID_BN_TERMS_PIECES];
    memset(pc, 0, sizeof pc);
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 4, i + 1);
        int t = lua_gettop(L);
        int len = lua_istable(L, t) ? (int)lua_objlen(L, t) : -1;
        if (len < 4 || (len - 2) % 2 != 0 || (len - 2) / 2 > LUCID_CHAN_SUM_MAX)
            return lucid_lua_argerror(L, 4, lua_pushfstring(L, "pieces[%d]: expected {c0, nch, src, "
                                                               "src_c0 [, add, add_c0]...} with 1 "
                                                               "to %d sources",
                                                            i + 1, LUCID_CHAN_SUM_MAX));
        lucid_chan_piece *p = &pc[i];
        p->dst_c0 = piece_int_at(L, 4, t, 1, i, "c0");
        p->nch = piece_int_at(L, 4, t, 2, i, "nch");
        for (int k = 0; k < (len - 2) / 2; k++) {
            lucid_tensor *s = piece_tensor_at(L, 4, t, 3 + 2 * k, i, k ? "add" : "src");
            int64_t c0 = piece_int_at(L, 4, t, 4 + 2 * k, i, k ? "add_c0" : "src_c0");
            if (k == 0) {
                p->src = s;
                p->src_c0 = c0;
            } else {
                p->add[k - 1] = s;
                p->add_c0[k - 1] = c0;
            }
        }
        lua_pop(L, 1);
    }
    lucid_tensor *gx = NULL;
    int taken = 0;
    lucid_status st = lucid_module_batchnorm2d_backward_terms(bn->ctx, bn->m, act ? act->m : NULL,
                                                              x, n, pc, &gx, &taken);
    if (st != LUCID_OK) return lucid_lua_raise(L, bn->ctx, st);
    lua_pushboolean(L, taken);
    if (!taken) return 1;
    if (!gx) lua_pushnil(L);
    else push_borrowed(L, gx);
    return 2;
}

/* batchnorm2d_terms_fit(bn, x) -> boolean: whether
 * batchnorm2d_backward_terms would take a call on bn with input x now and
 * 16-byte aligned sources (lucid_module_batchnorm2d_terms_fit). */
static int l_bn_terms_fit(lua_State *L) {
    module_box *bn = check_module(L, 1);
    lucid_tensor *x = lucid_lua_check_tensor(L, 2, "input");
    int fit = 0;
    lucid_status st = lucid_module_batchnorm2d_terms_fit(bn->ctx, bn->m, x, &fit);
    if (st != LUCID_OK) return lucid_lua_raise(L, bn->ctx, st);
    lua_pushboolean(L, fit);
    return 1;
}

/* empty_like(like [, channels]) -> tensor: a new uninitialised contiguous
 * tensor of like's context, device, dtype and shape (dim 1 = channels when
 * given): the result buffer of a fused sum (lucid.nn.containers.sum). */
static int l_empty_like(lua_State *L) {
    lucid_tensor *like = lucid_lua_check_tensor(L, 1, "like");
    int64_t shape[LUCID_MAX_DIMS];
    memcpy(shape, like->shape, sizeof(int64_t) * (size_t)like->ndim);
    if (!lua_isnoneornil(L, 2)) {
        lua_Integer c = lucid_lua_checkinteger(L, 2);
        if (like->ndim < 2 || c < 0)
            return lucid_lua_argerror(L, 2, lua_pushfstring(L, "channels: expected an integer >= 0 for "
                                                               "a like of rank >= 2"));
        shape[1] = (int64_t)c;
    }
    lucid_ctx *ctx = lucid_tensor_ctx(like);
    lucid_tensor *t = NULL;
    lucid_status st = lucid_tensor_empty(ctx, lucid_tensor_device(like), like->dtype, like->ndim,
                                         shape, &t);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    lucid_lua_push_tensor(L, t);
    return 1;
}

/* m:ensure_buffer(kind, i, like [, channels]) -> tensor: the module's
 * persistent outputs[i] (kind "output") or grad_inputs[i] ("grad_input"),
 * i 1-based, made to have like's device, dtype and shape (dim 1 replaced by
 * channels when given) as the module's own passes do
 * (lucid_module_ensure_buffer: kept when it already matches, else
 * reallocated, uninitialised). The buffer of a Concat / Split helper that a
 * block's fused sum writes itself. */
static int l_module_ensure_buffer(lua_State *L) {
    module_box *b = check_module(L, 1);
    static const char *const kinds[] = {"output", "grad_input", NULL};
    int grad = lucid_lua_checkoption(L, 2, NULL, kinds);
    lua_Integer i = lucid_lua_checkinteger(L, 3);
    const int count = grad ? b->m->ninputs : b->m->noutputs;
    if (i < 1 || i > count) /* 1-based here; the engine's slots are 0-based */
        return lucid_lua_argerror(L, 3, lua_pushfstring(L, "%s slot: expected 1..%d, got %s",
                                                       kinds[grad], count,
                                                       lua_tostring(L, 3)));
    lucid_tensor *like = lucid_lua_check_tensor(L, 4, "like");
    int64_t shape[LUCID_MAX_DIMS];
    memcpy(shape, like->shape, sizeof(int64_t) * (size_t)like->ndim);
    if (!lua_isnoneornil(L, 5)) {
        lua_Integer c = lucid_lua_checkinteger(L, 5);
        if (like->ndim < 2 || c < 0)
            return lucid_lua_argerror(L, 5, lua_pushfstring(L, "channels: expected an integer >= 0 for "
                                                               "a like of rank >= 2"));
        shape[1] = (int64_t)c;
    }
    lucid_tensor *t = NULL;
    lucid_status st = lucid_module_ensure_buffer(b->ctx, b->m, grad, (int)i - 1, lucid_tensor_device(like),
                                                 like->dtype, like->ndim, shape, &t);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->ctx, st);
    push_borrowed(L, t);
    return 1;
}

static int push_params_of(lua_State *L, lucid_module *m, lucid_param_kind kind) {
    lua_newtable(L);
    int j = 0;
    for (int i = 0; i < m->nparams; i++) {
        if (m->params[i]->kind != kind) continue;
        push_param(L, m->set, m->params[i]);
        lua_rawseti(L, -2, ++j);
    }
    return 1;
}

static int l_module_parameters(lua_State *L) {
    return push_params_of(L, check_module(L, 1)->m, LUCID_PARAM_KIND_PARAM);
}

static int l_module_buffers(lua_State *L) {
    return push_params_of(L, check_module(L, 1)->m, LUCID_PARAM_KIND_BUFFER);
}

/* m:train([mode]) — mode: a boolean (nothing: true), as torch's
 * train(mode=True); another value (a string, 0) is an error, not "true". */
static int l_module_train(lua_State *L) {
    module_box *b = check_module(L, 1);
    if (!lua_isnoneornil(L, 2) && !lua_isboolean(L, 2))
        return lucid_lua_argerror(L, 2, lua_pushfstring(L, "mode: expected a boolean (or nothing for "
                                                           "true), got %s",
                                                        lucid_lua_type_name(L, 2)));
    lucid_module_set_training(b->m, lua_isnoneornil(L, 2) ? 1 : lua_toboolean(L, 2));
    lua_settop(L, 1);
    return 1;
}

static int l_module_eval(lua_State *L) {
    module_box *b = check_module(L, 1);
    lucid_module_set_training(b->m, 0);
    lua_settop(L, 1);
    return 1;
}

static int l_module_need_grad_input(lua_State *L) {
    module_box *b = check_module(L, 1);
    lucid_module_set_need_grad_input(b->m, lua_toboolean(L, 2));
    lua_settop(L, 1);
    return 1;
}

static int l_module_kind(lua_State *L) {
    lua_pushstring(L, lucid_module_kind(check_module(L, 1)->m));
    return 1;
}

static int l_module_describe(lua_State *L) {
    module_box *b = check_module(L, 1);
    char buf[512];
    lucid_module_describe(b->m, buf, sizeof buf);
    lua_pushstring(L, buf);
    return 1;
}

static const luaL_Reg module_methods[] = {
    {"forward", l_module_forward},     {"backward", l_module_backward},
    {"parameters", l_module_parameters}, {"buffers", l_module_buffers},
    {"train", l_module_train},         {"eval", l_module_eval},
    {"need_grad_input", l_module_need_grad_input},
    {"kind", l_module_kind},           {"describe", l_module_describe},
    {"ensure_buffer", l_module_ensure_buffer},
    {NULL, NULL},
};

/* Methods first (upvalue table), then the fields training/ninputs/noutputs. */
static int l_module_index(lua_State *L) {
    module_box *b = check_module(L, 1);
    lua_pushvalue(L, 2);
    lua_rawget(L, lua_upvalueindex(1));
    if (!lua_isnil(L, -1)) return 1;
    lua_pop(L, 1);
    const char *k = lua_tostring(L, 2);
    if (!k) lua_pushnil(L);
    else if (strcmp(k, "training") == 0) lua_pushboolean(L, b->m->training);
    else if (strcmp(k, "ninputs") == 0) lua_pushinteger(L, b->m->ninputs);
    else if (strcmp(k, "noutputs") == 0) lua_pushinteger(L, b->m->noutputs);
    else if (strcmp(k, "name") == 0) lua_pushstring(L, b->m->name);
    else lua_pushnil(L);
    return 1;
}

/* ------------------------------------------------------------- register */

static const luaL_Reg set_methods[] = {
    {"declare", l_set_declare},     {"materialize", l_set_materialize},
    {"alias", l_set_alias},
    {"count", l_set_count},         {"get", l_set_get},
    {"find", l_set_find},           {"list", l_set_list},
    {"numel", l_set_numel},         {"zero_grad", l_set_zero_grad},
    {"reset", l_set_reset},         {"version", l_set_version},
    {"is_materialized", l_set_is_materialized},
    {"flat_params", l_set_flat_params}, {"flat_grads", l_set_flat_grads},
    {"device", l_set_device},       {"dtype", l_set_dtype},
    {NULL, NULL},
};

static const luaL_Reg nn_funcs[] = {
    {"ParamSet", l_set_new},     {"conv2d", l_conv2d},   {"batchnorm2d", l_batchnorm2d},
    {"dfl", l_dfl},              {"silu", l_silu},       {"maxpool2d", l_maxpool2d},
    {"upsample", l_upsample},    {"concat", l_concat},   {"split", l_split},
    {"add", l_add},              {"softmax", l_softmax}, {"matmul", l_matmul},
    {"batchnorm2d_silu_forward", l_bn_silu_forward},
    {"batchnorm2d_silu_backward", l_bn_silu_backward},
    {"conv_cast_weights", l_conv_cast_weights},
    {"chan_sum", l_chan_sum},    {"add_n", l_add_n},     {"empty_like", l_empty_like},
    {"conv2d_dcols_reserve", l_conv2d_dcols_reserve},
    {"batchnorm2d_backward_dcols", l_bn_backward_dcols},
    {"batchnorm2d_backward_terms", l_bn_backward_terms},
    {"batchnorm2d_terms_fit", l_bn_terms_fit},
    {NULL, NULL},
};

/* __index of lucid.nn (called for names the table does not have): raise
 * naming the name, pointing at the Lua library when the name is one of
 * its blocks or functions (require "lucid.nn", loaded here when it can be;
 * a failure to load it just gives the plain message). Non-string keys read
 * nil. */
static int l_nn_index(lua_State *L) {
    if (lua_type(L, 2) != LUA_TSTRING) {
        lua_pushnil(L);
        return 1;
    }
    const char *k = lua_tostring(L, 2);
    int in_lib = 0, is_block = 0;
    lua_getglobal(L, "require");
    lua_pushliteral(L, "lucid.nn");
    if (lua_isfunction(L, -2) && lua_pcall(L, 1, 1, 0) == 0 && lua_istable(L, -1)) {
        int lib = lua_gettop(L);
        lua_pushvalue(L, 2);
        lua_rawget(L, lib);
        in_lib = !lua_isnil(L, -1);
        lua_pop(L, 1);
        lua_pushliteral(L, "classes");
        lua_rawget(L, lib);
        if (lua_istable(L, -1)) {
            lua_pushvalue(L, 2);
            lua_rawget(L, -2);
            is_block = !lua_isnil(L, -1);
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
    if (is_block)
        return luaL_error(L, "lucid.nn.%s: no such primitive; the nn blocks (Conv, C2f, ...) are "
                             "in require \"lucid.nn\"",
                          k);
    if (in_lib)
        return luaL_error(L, "lucid.nn.%s: no such primitive; %s is in the Lua library: "
                             "require \"lucid.nn\"",
                          k, k);
    return luaL_error(L, "lucid.nn.%s: no such field", k);
}

/* Adds lucid.nn (the table above) and lucid.io (lua_io.c) to the module
 * table on top of the stack. */
int lucid_lua_open_nn(lua_State *L) {
    int module = lua_gettop(L);

    luaL_newmetatable(L, PARAMSET_MT);
    lua_pushliteral(L, PARAMSET_MT);
    lua_setfield(L, -2, "__name");
    lua_pushcfunction(L, l_set_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, l_set_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_newtable(L);
    luaL_setfuncs(L, set_methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);

    luaL_newmetatable(L, PARAM_MT);
    lua_pushliteral(L, PARAM_MT);
    lua_setfield(L, -2, "__name");
    lua_pushcfunction(L, l_param_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, l_param_index);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_param_newindex);
    lua_setfield(L, -2, "__newindex");
    lua_pushcfunction(L, l_param_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pushcfunction(L, l_param_eq);
    lua_setfield(L, -2, "__eq");
    lua_pop(L, 1);

    luaL_newmetatable(L, CMODULE_MT);
    lua_pushliteral(L, CMODULE_MT);
    lua_setfield(L, -2, "__name");
    lua_pushcfunction(L, l_module_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, l_module_describe);
    lua_setfield(L, -2, "__tostring");
    lua_newtable(L);
    luaL_setfuncs(L, module_methods, 0);
    lua_pushcclosure(L, l_module_index, 1);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);

    lua_getfield(L, module, "nn");
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        lua_newtable(L);
    }
    luaL_setfuncs(L, nn_funcs, 0);
    /* unknown names raise (l_nn_index) */
    lua_newtable(L);
    lua_pushcfunction(L, l_nn_index);
    lua_setfield(L, -2, "__index");
    lua_setmetatable(L, -2);
    lua_setfield(L, module, "nn");
    lua_settop(L, module);
    return lucid_lua_open_io(L);
}
