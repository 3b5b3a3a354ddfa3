/*
 * lua_optim.c — lucid.optim, lucid.EMA, lucid.amp: the Lua binding of
 * engine/train/optim.h (optimizers, the device parameter block, EMA, loss
 * scaling, gradient clipping, the Ultralytics schedule arithmetic).
 *
 * Everything works over a model's lucid_param_set (engine/nn/nn.h): one flat
 * f32 parameter buffer and one flat gradient buffer with the same layout.
 * The binding turns the set's entries into the engine's segment table
 * (lucid_param_segment: offset, shape, kind = the entry's Ultralytics group,
 * trainable flag, classification-head flag for MuSGD) once, at construction.
 *
 * Userdata (metatables in the registry; each holds one reference on every C
 * object it uses, released by __gc; Lua objects it depends on — the
 * ParamSet userdata, the ParamBlock userdata — are kept alive through the
 * userdata's environment table):
 *   lucid.ParamBlock  the device parameter block (lucid_param_block): the
 *                     host staging copy of every step-varying scalar plus the
 *                     device-owned state (loss scale, step counter, EMA
 *                     updates, last gradient norm ...). Optimizer, EMA,
 *                     GradScaler and clipping of one training run share one.
 *   lucid.Optimizer   SGD / AdamW / MuSGD (lucid_optim) + its layout.
 *   lucid.ParamGroup  a live view of one optimizer group (an engine slot).
 *   lucid.EMA         ModelEMA over parameters and f32 buffers.
 *   lucid.GradScaler  torch.amp.GradScaler policy over a ParamBlock.
 *   lucid.ClipState   (internal) layout + block for clipping a bare model.
 *
 * Lua API (see the docstring above each function for details):
 *   lucid.optim.SGD{params=model, lr=0.01, momentum=0.937, nesterov=true,
 *                   weight_decay=5e-4, decay_all=false, block=}
 *   lucid.optim.AdamW{params=, lr=0.001, betas={0.9, 0.999} | momentum=,
 *                   eps=1e-8, weight_decay=5e-4, decay_all=false, block=}
 *   lucid.optim.MuSGD{params=, lr=0.01, momentum=0.937, weight_decay=5e-4,
 *                   muon=0.2, sgd=1.0, head_lr_scale=3, block=}
 *   lucid.optim.build{model=, name='auto', lr0=0.001, momentum=0.9,
 *                   decay=1e-5, iterations=1e5, nc=} -> opt, info
 *   opt:step(), opt:step_fused{scaler=, max_norm=, clip_value=, ema=,
 *   zero_grad=} (unscale, clips, update, scaler update, EMA of parameters
 *   and f32 buffers in one engine call), opt:zero_grad(), opt:upload(),
 *   opt:state_tensors(), opt:state_views(), opt:last_norm(),
 *   opt:set_lr_factor(lf),
 *   opt:warmup(ni, nw, lf, {warmup_bias_lr, warmup_momentum, momentum}),
 *   opt:summary(); fields name, block, param_groups, nesterov, model
 *   group fields: name, lr, initial_lr, weight_decay, momentum (SGD/MuSGD),
 *     betas (AdamW), params, numel, head, slot (lr/initial_lr/weight_decay/
 *     momentum/betas settable)
 *   lucid.optim.ParamBlock{device=, ctx=} -> pb; pb:upload(), pb:state(),
 *     pb:set_state(tbl), pb:read(); input fields get/set (beta2, eps,
 *     muon_scale, sgd_scale, ema_decay, ema_tau, clip_max_norm, clip_value,
 *     growth_factor, backoff_factor, growth_interval, nesterov,
 *     scaler_enabled, ns_bf16)
 *   lucid.optim.clip_grad_norm(model_or_opt, max_norm) -> nothing
 *   lucid.optim.grad_norm(model_or_opt) -> nothing (norm only, no clip)
 *   lucid.optim.clip_grad_value(model_or_opt, clip_value) -> nothing
 *   lucid.optim.last_norm(model_or_opt) -> number (synchronizes)
 *   lucid.optim.schedule.{accumulate, weight_decay, warmup_iters, interp, lf,
 *     in_warmup, warmup_accumulate, warmup_lr, warmup_momentum,
 *     auto_optimizer}
 *   lucid.EMA{model=, decay=0.9999, tau=2000, block=} -> ema; ema:update(),
 *     ema.updates (get/set), ema.decay, ema.tau, ema:tensor(name),
 *     ema:views(), ema:copy_to(model), ema:swap(model), ema:flat()
 *   lucid.amp.GradScaler{init_scale=65536, growth_factor=2,
 *     backoff_factor=0.5, growth_interval=2000, enabled=true, optimizer=}
 *     scaler:bind(opt), scaler:scale(t), scaler:unscale_(opt), scaler:step(opt),
 *     scaler:update(), scaler:get_scale(), scaler:is_enabled(),
 *     scaler:state()
 *   lucid.rng_state([ctx]) -> seed, offset; lucid.set_rng_state(seed,
 *     offset, [ctx]) (registered here when lua_context.c has not)
 *   lucid._test.atomic_fail(stage | nil, [errno "EIO" | "ENOSPC"]) (tests:
 *     make the atomic writer fail at "open" | "write" | "fsync" | "rename")
 *   lucid._test.atomic_stall(stage | nil, [seconds]) (tests: make it sleep
 *     before that stage: a write held in flight)
 *
 * EMA of the f32 buffers (BN running stats): it uses the d of the EMA's
 * block, i.e. the same update counter, decay and tau as the parameter EMA,
 * in opt:step_fused (aux_ema of lucid_optim_step_fused) and in ema:update()
 * (lucid_ema_update_pair) alike, so the two routes can be mixed freely.
 *
 * Host/device protocol: a Lua write to a hyperparameter goes to the host
 * staging copy of the block and marks it dirty; the next opt:step(),
 * opt:step_fused(), ema:update(), clip or scaler call uploads it first
 * (lucid_param_block_upload, stream-ordered, asynchronous on CUDA). Reads
 * of device-owned values (pb:state(), opt:last_norm(), ema.updates,
 * scaler:get_scale()) synchronize. As engine/train/optim.h requires, do not change a
 * hyperparameter while a previous upload may still be pending on the GPU
 * (any synchronization of the previous step, e.g. reading its loss, is
 * enough).
 *
 * Errors: misuse raises "<fn>: bad argument #n (<argument>): <what is
 * wrong>" (lucid_lua_argerror); engine failures raise "lucid <status>:
 * <message>". Every numeric hyperparameter (constructor options, group
 * and block fields, EMA/scaler settings, clip limits, schedule arguments)
 * must be finite and in its range, f32-staged ones within the f32 range:
 * "lucid.optim.SGD: bad argument #1 (lr): expected a finite number >= 0
 * (within the f32 range), got inf" (check_range).
 */
#include "lua_common.h"
#include "io/safetensors.h"
#include "nn/nn.h"
#include "train/optim.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PBLOCK_MT "lucid.ParamBlock"
#define OPTIM_MT "lucid.Optimizer"
#define GROUP_MT "lucid.ParamGroup"
#define EMA_MT "lucid.EMA"
#define SCALER_MT "lucid.GradScaler"
#define CLIPST_MT "lucid.ClipState"
#define PARAMSET_MT "lucid.ParamSet"
/* Registry key of the weak table ParamSet userdata -> ClipState. */
#define CLIP_CACHE_KEY "lucid.optim.clip_cache"

/* Mirror of lua/lua_nn.c's ParamSet userdata (set_box): one reference on
 * the set and one on its context. Kept identical on purpose; a shared
 * accessor lucid_lua_check_param_set() in lua/lua_nn.h would replace it. */
typedef struct {
    lucid_param_set *s;
    lucid_ctx *ctx;
} nn_set_box;

/* ================================================================ helpers */

static int absidx(lua_State *L, int idx) {
    return (idx < 0 && idx > LUA_REGISTRYINDEX) ? lua_gettop(L) + idx + 1 : idx;
}

/* Type name for messages: __name of our userdata, else the Lua type. */
static const char *tname(lua_State *L, int idx) {
    if (lua_type(L, idx) == LUA_TUSERDATA && lua_getmetatable(L, idx)) {
        lua_getfield(L, -1, "__name");
        const char *n = lua_tostring(L, -1);
        lua_pop(L, 2);
        if (n) return n;
    }
    return luaL_typename(L, idx);
}

/* Raise "<fn>: bad argument #arg ..." with the formatted message. */
static int argerr(lua_State *L, int arg, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const char *msg = lua_pushvfstring(L, fmt, ap);
    va_end(ap);
    return lucid_lua_argerror(L, arg, msg);
}

/* Ranges of the numeric hyperparameters. Every value must be finite (an
 * Inf or NaN learning rate, decay or scale is never meant; it would
 * silently turn the parameters into NaN); lo/hi bound it, each end
 * inclusive unless R_LO_OPEN / R_HI_OPEN. Values staged in f32 on the
 * device (lr, momentum, decay, clip limits, eps ...) are bounded by F32_MAX
 * so the f32 copy stays finite too. */
#define R_LO_OPEN 1
#define R_HI_OPEN 2
#define F32_MAX 3.4028234663852886e38

static int in_range(double v, double lo, double hi, int flags) {
    if (!isfinite(v)) return 0;
    if ((flags & R_LO_OPEN) ? !(v > lo) : !(v >= lo)) return 0;
    if ((flags & R_HI_OPEN) ? !(v < hi) : !(v <= hi)) return 0;
    return 1;
}

/* "a finite number >= 0", "a number in [0, 1)", ... (pushed). */
static const char *range_text(lua_State *L, double lo, double hi, int flags) {
    int lo_inf = lo == -HUGE_VAL, hi_inf = hi == HUGE_VAL || hi == F32_MAX;
    const char *f32 = hi == F32_MAX ? " (within the f32 range)" : "";
    if (lo_inf && hi_inf) return lua_pushfstring(L, "a finite number%s", f32);
    if (hi_inf)
        return lua_pushfstring(L, "a finite number %s %f%s",
                               (flags & R_LO_OPEN) ? ">" : ">=", lo, f32);
    if (lo_inf)
        return lua_pushfstring(L, "a finite number %s %f",
                               (flags & R_HI_OPEN) ? "<" : "<=", hi);
    return lua_pushfstring(L, "a number in %s%f, %f%s",
                           (flags & R_LO_OPEN) ? "(" : "[", lo, hi,
                           (flags & R_HI_OPEN) ? ")" : "]");
}

/* Raise "<name>: expected <range>, got <v>" (argument position arg) unless
 * v is finite and within the range; returns v. */
static double check_range(lua_State *L, int arg, const char *name, double v,
                          double lo, double hi, int flags) {
    if (!in_range(v, lo, hi, flags)) {
        const char *want = range_text(L, lo, hi, flags);
        argerr(L, arg, "%s: expected %s, got %f", name, want, v);
    }
    return v;
}

/* Optional number field k of the options table t (argument position arg).
 * Raises naming the field when it is present but not a number, not
 * finite, or outside the range (check_range). */
static double opt_num(lua_State *L, int t, int arg, const char *k, double def,
                      double lo, double hi, int flags) {
    lua_getfield(L, t, k);
    double v = def;
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TNUMBER)
            argerr(L, arg, "%s: expected a number, got %s", k, tname(L, -1));
        v = check_range(L, arg, k, lua_tonumber(L, -1), lo, hi, flags);
    }
    lua_pop(L, 1);
    return v;
}

static int opt_bool(lua_State *L, int t, int arg, const char *k, int def) {
    lua_getfield(L, t, k);
    int v = def;
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TBOOLEAN)
            argerr(L, arg, "%s: expected a boolean, got %s", k, tname(L, -1));
        v = lua_toboolean(L, -1);
    }
    lua_pop(L, 1);
    return v;
}

/* Reject unknown keys of an options table (typos must not pass silently). */
static void check_keys(lua_State *L, int t, int arg, const char *const *keys,
                       const char *list) {
    lua_pushnil(L);
    while (lua_next(L, t)) {
        lua_pop(L, 1);
        int ok = 0;
        if (lua_type(L, -1) == LUA_TSTRING)
            for (int i = 0; keys[i]; i++)
                if (strcmp(keys[i], lua_tostring(L, -1)) == 0) ok = 1;
        if (!ok) {
            const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1)
                                                           : luaL_typename(L, -1);
            argerr(L, arg, "unknown option '%s' (expected one of: %s)", k, list);
        }
    }
}

/* Check the value at idx is a number; message names the argument. */
static double check_num(lua_State *L, int idx, const char *name) {
    if (lua_type(L, idx) != LUA_TNUMBER)
        argerr(L, idx, "%s: expected a number, got %s", name, tname(L, idx));
    return lua_tonumber(L, idx);
}

static int64_t check_int(lua_State *L, int idx, const char *name) {
    double x = check_num(L, idx, name);
    if (x != floor(x) || fabs(x) > 9007199254740992.0)
        argerr(L, idx, "%s: expected an integer, got %s", name,
               lua_tostring(L, idx));
    return (int64_t)x;
}

/* A number at idx, finite and within the range (check_range). */
static double check_num_range(lua_State *L, int idx, const char *name,
                              double lo, double hi, int flags) {
    return check_range(L, idx, name, check_num(L, idx, name), lo, hi, flags);
}

/* An integer at idx in [lo, hi]: "<name>: expected an integer in [lo, hi]
 * (>= lo), got <v>". */
static int64_t check_int_range(lua_State *L, int idx, const char *name,
                               int64_t lo, int64_t hi) {
    int64_t v = check_int(L, idx, name);
    if (v < lo || v > hi) {
        char a[24], b[24];
        snprintf(a, sizeof a, "%lld", (long long)lo);
        snprintf(b, sizeof b, "%lld", (long long)hi);
        if (hi == INT64_MAX)
            argerr(L, idx, "%s: expected an integer >= %s, got %s", name, a,
                   lua_tostring(L, idx));
        argerr(L, idx, "%s: expected an integer in [%s, %s], got %s", name, a,
               b, lua_tostring(L, idx));
    }
    return v;
}

static void push_device(lua_State *L, lucid_device d) {
    if (d.type == LUCID_CPU) lua_pushliteral(L, "cpu");
    else lua_pushfstring(L, "cuda:%d", d.index);
}

static int same_dev(lucid_device a, lucid_device b) {
    return a.type == b.type && (a.type == LUCID_CPU || a.index == b.index);
}

/* Environment table of the userdata at idx: get field k (pushes it). */
static void env_get(lua_State *L, int idx, const char *k) {
    lua_getfenv(L, idx);
    if (lua_istable(L, -1)) {
        lua_getfield(L, -1, k);
        lua_remove(L, -2);
    } else {
        lua_pop(L, 1);
        lua_pushnil(L);
    }
}

/* ============================================================ ParamBlock */

/* Mirrored by lua/lua_graph.c (block_mirror, for r:watch): keep identical. */
typedef struct {
    lucid_param_block *pb;
    lucid_ctx *ctx;
    int dirty; /* staging holds edits not yet uploaded */
} block_box;

static block_box *check_block(lua_State *L, int idx) {
    block_box *b = luaL_testudata(L, idx, PBLOCK_MT);
    if (!b) argerr(L, idx, "block: expected lucid.ParamBlock, got %s", tname(L, idx));
    if (!b->pb) argerr(L, idx, "block: parameter block was freed");
    return b;
}

/* Push a new ParamBlock userdata on dev (defaults of the reference). */
static block_box *new_block(lua_State *L, lucid_ctx *ctx, lucid_device dev) {
    block_box *b = lua_newuserdata(L, sizeof *b);
    b->pb = NULL;
    b->ctx = NULL;
    b->dirty = 0;
    luaL_getmetatable(L, PBLOCK_MT);
    lua_setmetatable(L, -2);
    lucid_status st = lucid_param_block_create(ctx, dev, NULL, &b->pb);
    if (st != LUCID_OK) lucid_lua_raise(L, ctx, st);
    lucid_ctx_retain(ctx);
    b->ctx = ctx;
    return b;
}

/* Upload the staging copy when it holds edits (head of a step). */
static void block_sync(lua_State *L, block_box *b) {
    if (!b->dirty) return;
    lucid_status st = lucid_param_block_upload(b->ctx, b->pb);
    if (st != LUCID_OK) lucid_lua_raise(L, b->ctx, st);
    b->dirty = 0;
}

/* Read the whole block (synchronizes). */
static void block_read(lua_State *L, block_box *b, lucid_param_values *v) {
    lucid_status st = lucid_param_block_read(b->ctx, b->pb, v);
    if (st != LUCID_OK) lucid_lua_raise(L, b->ctx, st);
}

static void block_set_state(lua_State *L, block_box *b, const lucid_param_state *s) {
    lucid_status st = lucid_param_block_set_state(b->ctx, b->pb, s);
    if (st != LUCID_OK) lucid_lua_raise(L, b->ctx, st);
}

/*
 * lucid.optim.ParamBlock([opts]) -> ParamBlock
 *   opts.device: "cpu" | "cuda[:N]" (default: the context's device),
 *   opts.ctx: a Context. Initial values: the reference defaults
 *   (lucid_param_values_default: lr 0.01, momentum 0.937, decay 5e-4 on
 *   the weight slots, EMA 0.9999/2000, clip 10, loss scale 65536 ...).
 */
static int l_block_new(lua_State *L) {
    int has = lua_istable(L, 1);
    lucid_ctx *ctx = lucid_lua_ctx(L, has ? 1 : 0);
    lucid_device dev = lucid_ctx_device(ctx);
    if (has) dev = lucid_lua_opt_device(L, 1, "device", dev);
    new_block(L, ctx, dev);
    return 1;
}

static int l_block_gc(lua_State *L) {
    block_box *b = lucid_lua_checkudata(L, 1, PBLOCK_MT);
    if (b->pb) lucid_param_block_release(b->pb);
    if (b->ctx) lucid_ctx_release(b->ctx);
    b->pb = NULL;
    b->ctx = NULL;
    return 0;
}

/* pb:upload() — enqueue staging -> device now (async on CUDA). */
static int l_block_upload(lua_State *L) {
    block_box *b = check_block(L, 1);
    b->dirty = 1;
    block_sync(L, b);
    return 0;
}

static void push_state(lua_State *L, const lucid_param_state *s) {
    lua_createtable(L, 0, 12);
#define SF(name)                                   \
    lua_pushnumber(L, (lua_Number)s->name);        \
    lua_setfield(L, -2, #name)
    SF(loss_scale);
    SF(growth_tracker);
    SF(found_inf);
    SF(nonfinite_norms);
    SF(step);
    SF(ema_updates);
    SF(skipped_steps);
    SF(grad_norm);
    SF(clip_coef);
    SF(inv_scale);
    SF(ema_d);
    SF(ema_1md);
#undef SF
}

/*
 * pb:state() -> {loss_scale, growth_tracker, found_inf, nonfinite_norms,
 *   step, ema_updates, skipped_steps, grad_norm, clip_coef, inv_scale, ema_d,
 *   ema_1md}: the device-owned values (synchronizes). Integers are exact up
 *   to 2^53; floats are the stored f32 values widened to double.
 */
static int l_block_state(lua_State *L) {
    block_box *b = check_block(L, 1);
    lucid_param_values v;
    block_read(L, b, &v);
    push_state(L, &v.st);
    return 1;
}

/*
 * pb:set_state(tbl) — overwrite device-owned values (resume). Fields absent
 *   from tbl keep their current value (read first; synchronizes). Same
 *   field names as pb:state().
 */
/* Push field k of the state table (argument 2); 1 when present, after
 * checking it is a number (errors name argument 2 as "state.<k>"). */
static int state_field(lua_State *L, const char *k) {
    lua_getfield(L, 2, k);
    if (lua_isnil(L, -1)) return 0;
    if (lua_type(L, -1) != LUA_TNUMBER)
        argerr(L, 2, "state.%s: expected a number, got %s", k, tname(L, -1));
    return 1;
}

/* The number on top as a counter in [0, hi] (64-bit counters: up to
 * 2^53, exact in a Lua number). */
#define STATE_INT_MAX ((int64_t)1 << 53)
static int64_t state_int(lua_State *L, const char *k, int64_t hi) {
    double v = lua_tonumber(L, -1);
    if (!(v >= 0 && v <= (double)hi && v == floor(v))) {
        char b[24];
        snprintf(b, sizeof b, "%lld", (long long)hi);
        if (hi >= STATE_INT_MAX)
            argerr(L, 2, "state.%s: expected an integer >= 0, got %f", k, v);
        argerr(L, 2, "state.%s: expected an integer in [0, %s], got %f", k, b, v);
    }
    return (int64_t)v;
}

static int l_block_set_state(lua_State *L) {
    block_box *b = check_block(L, 1);
    lucid_lua_checktype(L, 2, LUA_TTABLE);
    lucid_param_values v;
    block_read(L, b, &v);
    lucid_param_state *s = &v.st;
    /* counters: integers >= 0 (found_inf 0 or 1); the loss scale finite
     * and > 0; grad_norm and clip_coef record what the last step saw (a
     * non-finite norm included), any number */
#define GI(name, type, hi)                                                     \
    if (state_field(L, #name)) s->name = (type)state_int(L, #name, hi);       \
    lua_pop(L, 1)
#define GF(name)                                                               \
    if (state_field(L, #name)) s->name = (float)lua_tonumber(L, -1);          \
    lua_pop(L, 1)
    if (state_field(L, "loss_scale"))
        s->loss_scale = (float)check_range(L, 2, "state.loss_scale", lua_tonumber(L, -1), 0,
                                           F32_MAX, 0);
    lua_pop(L, 1);
    GI(growth_tracker, int32_t, INT32_MAX);
    GI(found_inf, int32_t, 1);
    GI(nonfinite_norms, int32_t, INT32_MAX);
    GI(step, int64_t, STATE_INT_MAX);
    GI(ema_updates, int64_t, STATE_INT_MAX);
    GI(skipped_steps, int64_t, STATE_INT_MAX);
    GF(grad_norm);
    GF(clip_coef);
#undef GI
#undef GF
    block_set_state(L, b, s);
    return 0;
}

/* Scalar input fields of the staging copy reachable by name, with the
 * range a write must respect (check_range; the i32 flags take a boolean,
 * 0 or 1). */
typedef struct {
    const char *name;
    size_t off;
    int is_int; /* 0: f32, 1: i32, 2: f64 */
    double lo, hi;
    int flags;  /* R_LO_OPEN / R_HI_OPEN */
} in_field;

static const in_field IN_FIELDS[] = {
    {"beta2", offsetof(lucid_param_inputs, beta2), 0, 0, 1, R_HI_OPEN},
    {"eps", offsetof(lucid_param_inputs, eps), 0, 0, F32_MAX, 0},
    {"muon_scale", offsetof(lucid_param_inputs, muon_scale), 0, 0, F32_MAX, 0},
    {"sgd_scale", offsetof(lucid_param_inputs, sgd_scale), 0, 0, F32_MAX, 0},
    {"ema_decay", offsetof(lucid_param_inputs, ema_decay), 2, 0, 1, 0},
    {"ema_tau", offsetof(lucid_param_inputs, ema_tau), 2, 0, HUGE_VAL, R_LO_OPEN},
    {"clip_max_norm", offsetof(lucid_param_inputs, clip_max_norm), 0, 0, F32_MAX, 0},
    {"clip_value", offsetof(lucid_param_inputs, clip_value), 0, 0, F32_MAX, 0},
    {"growth_factor", offsetof(lucid_param_inputs, growth_factor), 0, 1, F32_MAX, 0},
    {"backoff_factor", offsetof(lucid_param_inputs, backoff_factor), 0, 0, 1, R_LO_OPEN},
    {"growth_interval", offsetof(lucid_param_inputs, growth_interval), 1, 1, 2147483647.0, 0},
    {"nesterov", offsetof(lucid_param_inputs, nesterov), 1, 0, 1, 0},
    {"scaler_enabled", offsetof(lucid_param_inputs, scaler_enabled), 1, 0, 1, 0},
    {"ns_bf16", offsetof(lucid_param_inputs, ns_bf16), 1, 0, 1, 0},
    {NULL, 0, 0, 0, 0, 0},
};

static const in_field *find_in_field(const char *k) {
    for (int i = 0; IN_FIELDS[i].name; i++)
        if (strcmp(IN_FIELDS[i].name, k) == 0) return &IN_FIELDS[i];
    return NULL;
}

/* pb:read() -> {inputs = {...}, state = {...}} (synchronizes): the device
 * copy, i.e. what the kernels see. */
static int l_block_read(lua_State *L) {
    block_box *b = check_block(L, 1);
    lucid_param_values v;
    block_read(L, b, &v);
    lua_createtable(L, 0, 2);
    lua_createtable(L, 0, 20);
    for (int i = 0; IN_FIELDS[i].name; i++) {
        const char *p = (const char *)&v.in + IN_FIELDS[i].off;
        int kind = IN_FIELDS[i].is_int;
        lua_pushnumber(L, kind == 1   ? (lua_Number) * (const int32_t *)p
                          : kind == 2 ? (lua_Number) * (const double *)p
                                      : (lua_Number) * (const float *)p);
        lua_setfield(L, -2, IN_FIELDS[i].name);
    }
    const char *arrs[3] = {"lr", "momentum", "weight_decay"};
    const float *vals[3] = {v.in.lr, v.in.momentum, v.in.weight_decay};
    for (int a = 0; a < 3; a++) {
        lua_createtable(L, LUCID_PARAM_SLOTS, 0);
        for (int s = 0; s < LUCID_PARAM_SLOTS; s++) {
            lua_pushnumber(L, vals[a][s]);
            lua_rawseti(L, -2, s + 1);
        }
        lua_setfield(L, -2, arrs[a]);
    }
    lua_setfield(L, -2, "inputs");
    push_state(L, &v.st);
    lua_setfield(L, -2, "state");
    return 1;
}

static const luaL_Reg block_methods[] = {
    {"upload", l_block_upload}, {"state", l_block_state},
    {"set_state", l_block_set_state}, {"read", l_block_read},
    {NULL, NULL},
};

/* Methods, then the staging copy's scalar inputs (pb.beta2 ...), then
 * "device". */
static int l_block_index(lua_State *L) {
    block_box *b = check_block(L, 1);
    lua_pushvalue(L, 2);
    lua_rawget(L, lua_upvalueindex(1));
    if (!lua_isnil(L, -1)) return 1;
    lua_pop(L, 1);
    const char *k = lua_tostring(L, 2);
    if (!k) return 0;
    const in_field *f = find_in_field(k);
    if (f) {
        const char *p = (const char *)lucid_param_block_staging(b->pb) + f->off;
        lua_pushnumber(L, f->is_int == 1   ? (lua_Number) * (const int32_t *)p
                          : f->is_int == 2 ? (lua_Number) * (const double *)p
                                           : (lua_Number) * (const float *)p);
        return 1;
    }
    if (strcmp(k, "device") == 0) {
        push_device(L, lucid_param_block_device(b->pb));
        return 1;
    }
    lua_pushnil(L);
    return 1;
}

/* pb.<input> = number: writes the staging copy (f32 or i32) and marks the
 * block dirty (uploaded at the next step or pb:upload()). */
static int l_block_newindex(lua_State *L) {
    block_box *b = check_block(L, 1);
    const char *k = lucid_lua_checkstring(L, 2);
    const in_field *f = find_in_field(k);
    if (!f) {
        luaL_Buffer buf;
        luaL_buffinit(L, &buf);
        for (int i = 0; IN_FIELDS[i].name; i++) {
            if (i) luaL_addstring(&buf, ", ");
            luaL_addstring(&buf, IN_FIELDS[i].name);
        }
        luaL_pushresult(&buf);
        return argerr(L, 2, "ParamBlock field '%s' is not settable (settable: %s)",
                      k, lua_tostring(L, -1));
    }
    char *p = (char *)lucid_param_block_staging(b->pb) + f->off;
    if (f->is_int == 1) {
        if (lua_isboolean(L, 3)) *(int32_t *)p = lua_toboolean(L, 3);
        else *(int32_t *)p = (int32_t)check_int_range(L, 3, k, (int64_t)f->lo,
                                                      (int64_t)f->hi);
    } else if (f->is_int == 2) {
        *(double *)p = check_num_range(L, 3, k, f->lo, f->hi, f->flags);
    } else {
        *(float *)p = (float)check_num_range(L, 3, k, f->lo, f->hi, f->flags);
    }
    b->dirty = 1;
    return 0;
}

/* ============================================================ parameters */

static nn_set_box *test_set(lua_State *L, int idx) {
    return luaL_testudata(L, idx, PARAMSET_MT);
}

/*
 * Resolve the model argument at idx: a lucid.ParamSet, or a table holding
 * one in .params (lucid.model) or ._set (a materialised lucid.nn tree).
 * Pushes the ParamSet userdata. The set must be materialised with dtype f32.
 */
static nn_set_box *push_set_of(lua_State *L, int idx, int arg, const char *name) {
    idx = absidx(L, idx);
    nn_set_box *b = test_set(L, idx);
    if (b) {
        lua_pushvalue(L, idx);
    } else if (lua_istable(L, idx)) {
        lua_getfield(L, idx, "params");
        b = test_set(L, -1);
        if (!b) {
            lua_pop(L, 1);
            lua_getfield(L, idx, "_set");
            b = test_set(L, -1);
        }
        if (!b) {
            lua_pop(L, 1);
            argerr(L, arg, "%s: expected a model (a table whose .params is a "
                           "materialised lucid.ParamSet) or a lucid.ParamSet, "
                           "got a table without one", name);
        }
    } else {
        argerr(L, arg, "%s: expected a model or lucid.ParamSet, got %s", name,
               tname(L, idx));
    }
    if (!b->s) argerr(L, arg, "%s: parameter set was freed", name);
    if (!lucid_param_set_is_materialized(b->s))
        argerr(L, arg, "%s: the parameters are not materialised yet", name);
    if (lucid_param_set_dtype(b->s) != LUCID_F32)
        argerr(L, arg, "%s: optimizers need f32 parameters, the set holds %s", name,
               lucid_dtype_name(lucid_param_set_dtype(b->s)));
    return b;
}

/* Classification-head test for MuSGD (reference §3.3: cv3 / one2one_cv3
 * of the head get lr x 3). The head is the last layer: with reference
 * names "model.<N>.<...>" it is the largest N; its cv3/one2one_cv3 subtree
 * is the head. Without "model." names, top-level cv3/one2one_cv3. Backbone
 * C3k blocks also have a cv3 and are not the head. */
typedef struct {
    char prefix[64];
} head_rule;

static void head_rule_init(head_rule *h, lucid_param_set *set) {
    long best = -1;
    int n = lucid_param_set_count(set);
    for (int i = 0; i < n; i++) {
        const char *nm = lucid_param_set_get(set, i)->name;
        if (strncmp(nm, "model.", 6) != 0) continue;
        char *end = NULL;
        long k = strtol(nm + 6, &end, 10);
        if (end != nm + 6 && *end == '.' && k > best) best = k;
    }
    if (best >= 0) snprintf(h->prefix, sizeof h->prefix, "model.%ld.", best);
    else h->prefix[0] = '\0';
}

static int head_rule_match(const head_rule *h, const char *name) {
    size_t n = strlen(h->prefix);
    if (strncmp(name, h->prefix, n) != 0) return 0;
    const char *r = name + n;
    return strncmp(r, "cv3.", 4) == 0 || strncmp(r, "one2one_cv3.", 12) == 0;
}

/* Build the segment table of the set's parameters (which = 0) or of its
 * f32 buffers over an f32 view of the buffer storage (which = 1). On
 * failure returns NULL with the message in err (nothing to free). */
static lucid_param_layout *make_layout(lucid_ctx *ctx, lucid_param_set *set,
                                       int which, int head_aware, int64_t total,
                                       char *err, size_t errlen,
                                       lucid_status *stout) {
    int n = lucid_param_set_count(set);
    lucid_param_segment *segs = calloc((size_t)(n ? n : 1), sizeof *segs);
    *stout = LUCID_ERR_OOM;
    if (!segs) {
        snprintf(err, errlen, "out of memory for %d segments", n);
        return NULL;
    }
    head_rule hr;
    head_rule_init(&hr, set);
    int k = 0;
    for (int i = 0; i < n; i++) {
        lucid_param *p = lucid_param_set_get(set, i);
        if (which == 0 && p->kind != LUCID_PARAM_KIND_PARAM) continue;
        if (which == 1 && (p->kind != LUCID_PARAM_KIND_BUFFER ||
                           !lucid_dtype_is_float(p->dtype)))
            continue;
        if (p->ndim > 4) {
            *stout = LUCID_ERR_ARG;
            snprintf(err, errlen, "parameter '%s' has %d dims; the optimizer "
                                  "layout supports at most 4", p->name, p->ndim);
            free(segs);
            return NULL;
        }
        lucid_param_segment *s = &segs[k++];
        s->name = p->name;
        s->offset = p->offset;
        s->numel = p->numel;
        s->kind = (which == 0 && p->group >= 0 && p->group < LUCID_KIND_COUNT)
                      ? p->group : LUCID_KIND_WEIGHT;
        s->ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++) s->shape[d] = p->shape[d];
        s->trainable = which == 0 ? p->trainable : 0;
        s->head = (which == 0 && head_aware) ? head_rule_match(&hr, p->name) : 0;
    }
    lucid_param_layout *l = NULL;
    lucid_status st = lucid_param_layout_create(ctx, lucid_param_set_device(set),
                                                total, segs, k, &l);
    free(segs);
    if (st != LUCID_OK) {
        *stout = st;
        snprintf(err, errlen, "%s", lucid_ctx_error(ctx));
        lucid_ctx_clear_error(ctx);
        return NULL;
    }
    *stout = LUCID_OK;
    return l;
}

/* The parameter set bound to an optimizer / EMA / clip state, with the
 * trainable flags captured when the layout was built. */
typedef struct {
    lucid_param_set *set;        /* retained */
    lucid_ctx *ctx;              /* retained */
    lucid_param_layout *layout;  /* over the flat parameters; retained */
    uint64_t version;            /* set version seen last */
    int n;
    unsigned char *trainable;    /* (n) flags at build time */
} pbind;

static void pbind_free(pbind *b) {
    if (b->layout) lucid_param_layout_release(b->layout);
    if (b->set) lucid_param_set_release(b->set);
    if (b->ctx) lucid_ctx_release(b->ctx);
    free(b->trainable);
    memset(b, 0, sizeof *b);
}

/* Fill b from the set (raises on failure; b stays freeable). */
static void pbind_init(lua_State *L, pbind *b, nn_set_box *sb, int head_aware) {
    b->set = sb->s;
    lucid_param_set_retain(sb->s);
    b->ctx = sb->ctx;
    lucid_ctx_retain(sb->ctx);
    b->n = lucid_param_set_count(sb->s);
    b->trainable = calloc((size_t)(b->n ? b->n : 1), 1);
    if (!b->trainable) luaL_error(L, "lucid oom: optimizer: out of memory");
    for (int i = 0; i < b->n; i++)
        b->trainable[i] = (unsigned char)lucid_param_set_get(sb->s, i)->trainable;
    b->version = lucid_param_set_version(sb->s);
    char err[512];
    lucid_status st;
    int64_t total = lucid_tensor_numel(lucid_param_set_flat_params(sb->s));
    b->layout = make_layout(b->ctx, b->set, 0, head_aware, total, err, sizeof err, &st);
    if (!b->layout) luaL_error(L, "lucid %s: param layout: %s", lucid_status_name(st), err);
}

/* Refuse to run on a layout whose trainable flags went stale: freezing or
 * unfreezing after construction needs a new optimizer (its state buffers
 * and launch tables were built for the old flags). */
static void pbind_check(lua_State *L, pbind *b, const char *what) {
    uint64_t v = lucid_param_set_version(b->set);
    if (v == b->version) return;
    int n = lucid_param_set_count(b->set);
    for (int i = 0; i < n && i < b->n; i++) {
        lucid_param *p = lucid_param_set_get(b->set, i);
        if ((unsigned char)p->trainable != b->trainable[i])
            luaL_error(L, "%s: parameter '%s' was %s after the %s was built; build a "
                          "new one", what, p->name,
                       p->trainable ? "unfrozen" : "frozen", what);
    }
    if (n != b->n)
        luaL_error(L, "%s: the parameter set changed size (%d -> %d entries)", what,
                   b->n, n);
    b->version = v;
}

/* View of a flat f32 tensor at a parameter's offset with its shape. */
static lucid_tensor *flat_view(lua_State *L, lucid_ctx *ctx, lucid_tensor *flat,
                               const lucid_param *p) {
    lucid_tensor *v = NULL;
    lucid_status st = lucid_tensor_from_storage(ctx, flat->storage, LUCID_F32, p->ndim,
                                                p->ndim ? p->shape : NULL, NULL,
                                                flat->offset + p->offset, &v);
    if (st != LUCID_OK) lucid_lua_raise(L, ctx, st);
    return v;
}

/* ============================================================ optimizer */

typedef struct {
    lucid_optim *o;
    block_box *blk;          /* kept alive by the environment table */
    pbind bind;
    lucid_optim_kind kind;
    int ngroups;             /* 3 (SGD, AdamW) or 6 (MuSGD: + head groups) */
    double lr[LUCID_PARAM_SLOTS], momentum[LUCID_PARAM_SLOTS];
    double wd[LUCID_PARAM_SLOTS], initial_lr[LUCID_PARAM_SLOTS];
    double beta2, eps;
    int nesterov;
    int count[LUCID_PARAM_SLOTS];     /* parameter tensors per slot */
    int64_t numel[LUCID_PARAM_SLOTS]; /* elements per slot */
    int count_trainable[LUCID_PARAM_SLOTS];
} optim_box;

static const char *const SLOT_NAMES[2][LUCID_PARAM_SLOTS] = {
    {"weight", "bn", "bias", "weight_head", "bn_head", "bias_head"},
    {"muon", "bn", "bias", "muon_head", "bn_head", "bias_head"},
};

static const char *slot_name(const optim_box *b, int s) {
    return SLOT_NAMES[b->kind == LUCID_OPTIM_MUSGD][s];
}

static optim_box *check_optim(lua_State *L, int idx) {
    optim_box *b = luaL_testudata(L, idx, OPTIM_MT);
    if (!b) argerr(L, idx, "optimizer: expected lucid.Optimizer, got %s", tname(L, idx));
    if (!b->o) argerr(L, idx, "optimizer: freed (or its construction failed)");
    return b;
}

/* Copy the host mirror of the groups into the staging copy (f32) and mark
 * it dirty. With 3 groups the head slots 3..5 mirror 0..2. */
static void stage_groups(optim_box *b) {
    lucid_param_inputs *in = lucid_param_block_staging(b->blk->pb);
    for (int s = 0; s < LUCID_PARAM_SLOTS; s++) {
        int g = b->ngroups == 3 ? s % 3 : s;
        in->lr[s] = (float)b->lr[g];
        in->momentum[s] = (float)b->momentum[g];
        in->weight_decay[s] = (float)b->wd[g];
    }
    in->nesterov = b->nesterov;
    in->beta2 = (float)b->beta2;
    in->eps = (float)b->eps;
    b->blk->dirty = 1;
}

static int l_optim_gc(lua_State *L) {
    lucid_lua_check_nargs(L, 1);
    optim_box *b = lucid_lua_checkudata(L, 1, OPTIM_MT);
    if (b->o) lucid_optim_release(b->o);
    b->o = NULL;
    pbind_free(&b->bind);
    return 0;
}

typedef struct {
    double lr, momentum, beta2, eps, wd, muon, sgd, head_scale;
    int nesterov, decay_all;
} optim_cfg;

/* Find or create the block for an optimizer/EMA/scaler from opts.block (a
 * ParamBlock or an Optimizer/EMA sharing theirs). Pushes the block
 * userdata. */
static block_box *push_block_opt(lua_State *L, int t, int arg, lucid_ctx *ctx,
                                 lucid_device dev) {
    lua_getfield(L, t, "block");
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        return new_block(L, ctx, dev);
    }
    int v = lua_gettop(L);
    if (luaL_testudata(L, v, OPTIM_MT) || luaL_testudata(L, v, EMA_MT)) {
        env_get(L, v, "block");
        lua_remove(L, v);
    }
    block_box *b = luaL_testudata(L, -1, PBLOCK_MT);
    if (!b || !b->pb)
        argerr(L, arg, "block: expected a lucid.ParamBlock (or an optimizer/EMA "
                       "sharing one), got %s", tname(L, -1));
    if (!same_dev(lucid_param_block_device(b->pb), dev))
        argerr(L, arg, "block: the block lives on another device than the "
                       "parameters");
    return b;
}

/* Core constructor. The options table is argument 1 and holds params (or
 * model); cfg holds the resolved hyperparameters. Pushes the optimizer. */
static int new_optim(lua_State *L, lucid_optim_kind kind, const optim_cfg *c) {
    const int t = 1;
    lua_getfield(L, t, "params");
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_getfield(L, t, "model");
    }
    if (lua_isnil(L, -1))
        argerr(L, 1, "params: expected a model or lucid.ParamSet, got nil");
    int model_idx = lua_gettop(L);
    nn_set_box *sb = push_set_of(L, model_idx, 1, "params");
    int set_idx = lua_gettop(L);
    lucid_device dev = lucid_param_set_device(sb->s);
    block_box *blk = push_block_opt(L, t, 1, sb->ctx, dev);
    int blk_idx = lua_gettop(L);

    optim_box *b = lua_newuserdata(L, sizeof *b);
    memset(b, 0, sizeof *b);
    luaL_getmetatable(L, OPTIM_MT);
    lua_setmetatable(L, -2);
    int ud = lua_gettop(L);
    lua_createtable(L, 0, 4);
    lua_pushvalue(L, set_idx);
    lua_setfield(L, -2, "set");
    lua_pushvalue(L, blk_idx);
    lua_setfield(L, -2, "block");
    lua_pushvalue(L, model_idx);
    lua_setfield(L, -2, "model");
    lua_setfenv(L, ud);

    b->kind = kind;
    b->blk = blk;
    pbind_init(L, &b->bind, sb, kind == LUCID_OPTIM_MUSGD);
    lucid_status st = lucid_optim_create(b->bind.ctx, kind, b->bind.layout, &b->o);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->bind.ctx, st);

    b->ngroups = kind == LUCID_OPTIM_MUSGD ? 6 : 3;
    b->nesterov = c->nesterov;
    b->beta2 = c->beta2;
    b->eps = c->eps;
    for (int s = 0; s < LUCID_PARAM_SLOTS; s++) {
        int kindof = s % 3, head = s >= 3;
        double lr = c->lr * (head && kind == LUCID_OPTIM_MUSGD ? c->head_scale : 1.0);
        b->lr[s] = b->initial_lr[s] = lr;
        b->momentum[s] = c->momentum;
        b->wd[s] = (kindof == LUCID_KIND_WEIGHT || c->decay_all) ? c->wd : 0.0;
    }
    int n = lucid_param_set_count(sb->s);
    head_rule hr;
    head_rule_init(&hr, sb->s);
    for (int i = 0; i < n; i++) {
        lucid_param *p = lucid_param_set_get(sb->s, i);
        if (p->kind != LUCID_PARAM_KIND_PARAM) continue;
        int kindof = (p->group >= 0 && p->group < 3) ? p->group : 0;
        int head = kind == LUCID_OPTIM_MUSGD && head_rule_match(&hr, p->name);
        int s = kindof + 3 * head;
        b->count[s]++;
        b->numel[s] += p->numel;
        if (p->trainable) b->count_trainable[s]++;
    }
    lucid_param_inputs *in = lucid_param_block_staging(blk->pb);
    in->muon_scale = (float)c->muon;
    in->sgd_scale = (float)c->sgd;
    stage_groups(b);
    return 1;
}

static const char *const SGD_KEYS[] = {"params", "model", "lr", "momentum", "nesterov",
                                       "weight_decay", "decay_all", "block", NULL};
static const char *const ADAMW_KEYS[] = {"params", "model", "lr", "momentum", "betas",
                                         "eps", "weight_decay", "decay_all", "block",
                                         NULL};
static const char *const MUSGD_KEYS[] = {"params", "model", "lr", "momentum",
                                         "nesterov", "weight_decay", "muon", "sgd",
                                         "head_lr_scale", "block", NULL};

static optim_cfg cfg_defaults(void) {
    optim_cfg c = {0.01, 0.937, 0.999, 1e-8, 5e-4, 0.2, 1.0, 3.0, 1, 0};
    return c;
}

/*
 * lucid.optim.SGD{params=model, lr=0.01, momentum=0.937, nesterov=true,
 *                 weight_decay=5e-4, decay_all=false, block=nil} -> Optimizer
 *   torch.optim.SGD (dampening 0; L2 decay added to the gradient:
 *   g' = g + wd*p; buf = mu*buf + g'; update = nesterov ? g' + mu*buf : buf;
 *   p -= lr*update). Parameters are grouped as Ultralytics build_optimizer
 *   does (reference §3.3): "weight" (decay), "bn" (norm weights, decay 0),
 *   "bias" (decay 0); decay_all=true gives every group weight_decay (the
 *   single-group PyTorch behaviour). params: a model (table with .params)
 *   or a lucid.ParamSet, materialised, f32. block: a ParamBlock (or an
 *   optimizer/EMA whose block to share); a new one on the parameters'
 *   device otherwise. Defaults follow Ultralytics default.yaml (lr0,
 *   momentum, weight_decay) and its nesterov=True.
 */
static int l_sgd(lua_State *L) {
    lucid_lua_checktype(L, 1, LUA_TTABLE);
    check_keys(L, 1, 1, SGD_KEYS, "params, model, lr, momentum, nesterov, "
                                  "weight_decay, decay_all, block");
    optim_cfg c = cfg_defaults();
    c.lr = opt_num(L, 1, 1, "lr", c.lr, 0, F32_MAX, 0);
    c.momentum = opt_num(L, 1, 1, "momentum", c.momentum, 0, 1, 0);
    c.nesterov = opt_bool(L, 1, 1, "nesterov", 1);
    c.wd = opt_num(L, 1, 1, "weight_decay", c.wd, 0, F32_MAX, 0);
    c.decay_all = opt_bool(L, 1, 1, "decay_all", 0);
    if (c.nesterov && c.momentum <= 0)
        argerr(L, 1, "nesterov: Nesterov momentum requires momentum > 0");
    return new_optim(L, LUCID_OPTIM_SGD, &c);
}

/*
 * lucid.optim.AdamW{params=, lr=0.001, betas={0.9, 0.999} (or momentum=
 *   beta1), eps=1e-8, weight_decay=5e-4, decay_all=false, block=} ->
 *   Optimizer. torch.optim.AdamW: p *= 1 - lr*wd (decoupled);
 *   m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
 *   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). Groups and decay
 *   as SGD (Ultralytics: betas (momentum, 0.999), decay on "weight" only).
 */
static int l_adamw(lua_State *L) {
    lucid_lua_checktype(L, 1, LUA_TTABLE);
    check_keys(L, 1, 1, ADAMW_KEYS, "params, model, lr, momentum, betas, eps, "
                                    "weight_decay, decay_all, block");
    optim_cfg c = cfg_defaults();
    c.lr = opt_num(L, 1, 1, "lr", 0.001, 0, F32_MAX, 0);
    c.momentum = opt_num(L, 1, 1, "momentum", 0.9, 0, 1, R_HI_OPEN); /* beta1 */
    lua_getfield(L, 1, "betas");
    if (!lua_isnil(L, -1)) {
        if (!lua_istable(L, -1) || lua_objlen(L, -1) != 2)
            argerr(L, 1, "betas: expected {beta1, beta2}, got %s", tname(L, -1));
        lua_rawgeti(L, -1, 1);
        lua_rawgeti(L, -2, 2);
        if (!lua_isnumber(L, -2) || !lua_isnumber(L, -1))
            argerr(L, 1, "betas: expected two numbers");
        c.momentum = lua_tonumber(L, -2);
        c.beta2 = lua_tonumber(L, -1);
        if (!in_range(c.momentum, 0, 1, R_HI_OPEN) || !in_range(c.beta2, 0, 1, R_HI_OPEN))
            argerr(L, 1, "betas: expected values in [0, 1), got {%f, %f}",
                   c.momentum, c.beta2);
        lua_pop(L, 2);
    }
    lua_pop(L, 1);
    c.eps = opt_num(L, 1, 1, "eps", 1e-8, 0, F32_MAX, 0);
    c.wd = opt_num(L, 1, 1, "weight_decay", c.wd, 0, F32_MAX, 0);
    c.decay_all = opt_bool(L, 1, 1, "decay_all", 0);
    c.nesterov = 0;
    return new_optim(L, LUCID_OPTIM_ADAMW, &c);
}

/*
 * lucid.optim.MuSGD{params=, lr=0.01, momentum=0.937, nesterov=true,
 *   weight_decay=5e-4, muon=0.2, sgd=1.0, head_lr_scale=3, block=} ->
 *   Optimizer. Ultralytics MuSGD (reference §6): trainable 2-D/4-D
 *   parameters get the Newton–Schulz (5 steps, bf16) Muon direction times
 *   `muon` plus Nesterov SGD with decay times `sgd`; the rest plain
 *   Nesterov SGD. Six groups: muon, bn, bias and their classification-head
 *   copies (the last layer's cv3/one2one_cv3) with lr x head_lr_scale.
 */
static int l_musgd(lua_State *L) {
    lucid_lua_checktype(L, 1, LUA_TTABLE);
    check_keys(L, 1, 1, MUSGD_KEYS, "params, model, lr, momentum, nesterov, "
                                    "weight_decay, muon, sgd, head_lr_scale, block");
    optim_cfg c = cfg_defaults();
    c.lr = opt_num(L, 1, 1, "lr", c.lr, 0, F32_MAX, 0);
    c.momentum = opt_num(L, 1, 1, "momentum", c.momentum, 0, 1, 0);
    c.nesterov = opt_bool(L, 1, 1, "nesterov", 1);
    c.wd = opt_num(L, 1, 1, "weight_decay", c.wd, 0, F32_MAX, 0);
    c.muon = opt_num(L, 1, 1, "muon", c.muon, 0, F32_MAX, 0);
    c.sgd = opt_num(L, 1, 1, "sgd", c.sgd, 0, F32_MAX, 0);
    c.head_scale = opt_num(L, 1, 1, "head_lr_scale", c.head_scale, 0, F32_MAX, 0);
    return new_optim(L, LUCID_OPTIM_MUSGD, &c);
}

/* Python-style short float repr for log lines ("0.002", "0.0005", "0.0"). */
static void pyfloat(char *buf, size_t n, double x) {
    snprintf(buf, n, "%.15g", x);
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, x);
        if (strtod(buf, NULL) == x) break;
    }
    if (!strpbrk(buf, ".eEn")) strncat(buf, ".0", n - strlen(buf) - 1);
}

/* Push the Ultralytics build_optimizer log line of b. */
static void push_summary(lua_State *L, optim_box *b) {
    char lr[32], mom[32], wd[32];
    pyfloat(lr, sizeof lr, b->initial_lr[0]);
    pyfloat(mom, sizeof mom, b->momentum[0]);
    pyfloat(wd, sizeof wd, b->wd[0]);
    int g0 = b->count[0] + b->count[3], g1 = b->count[1] + b->count[4],
        g2 = b->count[2] + b->count[5];
    lua_pushfstring(L, "%s(lr=%s, momentum=%s) with parameter groups %d weight(decay=0.0), "
                       "%d weight(decay=%s), %d bias(decay=0.0)",
                    lucid_optim_kind_name(b->kind), lr, mom, g1, g0, wd, g2);
}

/*
 * lucid.optim.build{model=, name='auto', lr0=0.001, momentum=0.9,
 *   decay=1e-5, iterations=1e5, nc=model.nc or 80, block=} -> opt, info
 *   Ultralytics BaseTrainer.build_optimizer (reference §3.3). decay is the
 *   already-scaled weight decay (weight_decay*batch*accumulate/nbs).
 *   name 'auto': iterations > 10000 -> MuSGD(lr 0.01, momentum 0.9), else
 *   AdamW(lr round(0.002*5/(4+nc), 6), beta1 0.9); info.warmup_bias_lr = 0.
 *   SGD/MuSGD are Nesterov; AdamW uses betas (momentum, 0.999).
 *   info = {name, lr, momentum, decay, warmup_bias_lr (auto only), log}
 *   where log is the reference's "<Name>(lr=, momentum=) with parameter
 *   groups N weight(decay=0.0), N weight(decay=D), N bias(decay=0.0)".
 */
static int l_build(lua_State *L) {
    static const char *const keys[] = {"model", "params", "name", "lr0", "lr",
                                       "momentum", "decay", "iterations", "nc",
                                       "block", NULL};
    lucid_lua_checktype(L, 1, LUA_TTABLE);
    check_keys(L, 1, 1, keys, "model, params, name, lr0, lr, momentum, decay, "
                              "iterations, nc, block");
    lua_getfield(L, 1, "name");
    const char *name = lua_isnil(L, -1) ? "auto" : lua_tostring(L, -1);
    if (!name) argerr(L, 1, "name: expected a string, got %s", tname(L, -1));
    lua_pop(L, 1);
    double lr = opt_num(L, 1, 1, "lr0", 0.001, 0, F32_MAX, 0);
    lr = opt_num(L, 1, 1, "lr", lr, 0, F32_MAX, 0);
    double momentum = opt_num(L, 1, 1, "momentum", 0.9, 0, 1, 0);
    double decay = opt_num(L, 1, 1, "decay", 1e-5, 0, F32_MAX, 0);
    double iterations = opt_num(L, 1, 1, "iterations", 1e5, 0, HUGE_VAL, 0);
    double nc = 80;
    lua_getfield(L, 1, "nc");
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_getfield(L, 1, "model");
        if (lua_istable(L, -1)) {
            lua_getfield(L, -1, "nc");
            if (lua_isnumber(L, -1)) nc = lua_tonumber(L, -1);
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    } else {
        nc = check_num(L, lua_gettop(L), "nc");
        if (!(nc >= 1 && nc < 2147483648.0 && nc == floor(nc)))
            argerr(L, 1, "nc: expected an integer >= 1 (the number of classes), "
                         "got %f", nc);
        lua_pop(L, 1);
    }
    int is_auto = strcmp(name, "auto") == 0;
    lucid_optim_kind kind;
    if (is_auto) {
        momentum = 0.9;
        if (iterations > 10000) {
            kind = LUCID_OPTIM_MUSGD;
            lr = 0.01;
        } else {
            kind = LUCID_OPTIM_ADAMW;
            lr = rint(0.002 * 5.0 / (4.0 + nc) * 1e6) / 1e6;
        }
    } else if (lucid_optim_kind_parse(name, &kind) != 0) {
        return argerr(L, 1, "name: unknown optimizer '%s' (expected auto, SGD, "
                            "AdamW or MuSGD)", name);
    }
    optim_cfg c = cfg_defaults();
    c.lr = lr;
    c.momentum = momentum;
    c.wd = decay;
    c.nesterov = kind != LUCID_OPTIM_ADAMW;
    c.beta2 = 0.999;
    new_optim(L, kind, &c);
    optim_box *b = lua_touserdata(L, -1);
    lua_createtable(L, 0, 6);
    lua_pushstring(L, lucid_optim_kind_name(kind));
    lua_setfield(L, -2, "name");
    lua_pushnumber(L, lr);
    lua_setfield(L, -2, "lr");
    lua_pushnumber(L, momentum);
    lua_setfield(L, -2, "momentum");
    lua_pushnumber(L, decay);
    lua_setfield(L, -2, "decay");
    if (is_auto) {
        lua_pushnumber(L, 0.0);
        lua_setfield(L, -2, "warmup_bias_lr");
    }
    push_summary(L, b);
    lua_setfield(L, -2, "log");
    return 2;
}

/* Flat params/grads of the bound set (raise when missing). */
static void bind_flats(lua_State *L, pbind *pb, lucid_tensor **params,
                       lucid_tensor **grads) {
    *params = lucid_param_set_flat_params(pb->set);
    if (grads) *grads = lucid_param_set_flat_grads(pb->set);
    if (!*params || (grads && !*grads))
        luaL_error(L, "optimizer: the parameter set has no flat buffers");
}

/*
 * opt:step() — one optimizer update over every trainable parameter: uploads
 *   pending hyperparameter edits, then lucid_optim_step (does nothing but
 *   count a skipped step when the scaler found a non-finite gradient).
 *   Returns nothing and does not synchronize. Raises when a parameter was
 *   frozen/unfrozen since construction.
 */
static int l_optim_step(lua_State *L) {
    lucid_lua_check_nargs(L, 1);
    optim_box *b = check_optim(L, 1);
    pbind_check(L, &b->bind, "optimizer");
    block_sync(L, b->blk);
    lucid_tensor *p, *g;
    bind_flats(L, &b->bind, &p, &g);
    lucid_status st = lucid_optim_step(b->bind.ctx, b->o, b->blk->pb, p, g);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->bind.ctx, st);
    return 0;
}

/* opt:zero_grad() — zero the whole flat gradient buffer (one fill). */
static int l_optim_zero_grad(lua_State *L) {
    lucid_lua_check_nargs(L, 1);
    optim_box *b = check_optim(L, 1);
    lucid_status st = lucid_param_set_zero_grad(b->bind.ctx, b->bind.set);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->bind.ctx, st);
    return 0;
}

/* opt:upload() — push the staged hyperparameters to the device now. */
static int l_optim_upload(lua_State *L) {
    lucid_lua_check_nargs(L, 1);
    optim_box *b = check_optim(L, 1);
    b->blk->dirty = 1;
    block_sync(L, b->blk);
    return 0;
}

/*
 * opt:state_tensors() -> {<state name> = Tensor}: the flat f32 state
 *   buffers (same layout and length as the flat parameters):
 *   SGD momentum_buffer; AdamW exp_avg, exp_avg_sq; MuSGD momentum_buffer,
 *   momentum_buffer_SGD. The tensors alias the optimizer's memory.
 */
static int l_optim_state_tensors(lua_State *L) {
    lucid_lua_check_nargs(L, 1);
    optim_box *b = check_optim(L, 1);
    int n = lucid_optim_state_count(b->o);
    lua_createtable(L, 0, n);
    for (int i = 0; i < n; i++) {
        lucid_tensor *t = lucid_optim_state(b->o, i);
        lucid_tensor_retain(t);
        lucid_lua_push_tensor(L, t);
        lua_setfield(L, -2, lucid_optim_state_name(b->o, i));
    }
    return 1;
}

/*
 * opt:state_views() -> {{name = "<param>.<state>", tensor = view}, ...}:
 *   per-parameter views (the parameter's shape, f32) into the state
 *   buffers, for every trainable parameter in set order, state by state.
 *   Used by checkpoints ("optimizer.<param>.<state>"); the views alias the
 *   optimizer's memory, so copying into them restores the state.
 */
static int l_optim_state_views(lua_State *L) {
    lucid_lua_check_nargs(L, 1);
    optim_box *b = check_optim(L, 1);
    int ns = lucid_optim_state_count(b->o);
    int n = lucid_param_set_count(b->bind.set), k = 0;
    lua_newtable(L);
    for (int j = 0; j < ns; j++) {
        lucid_tensor *flat = lucid_optim_state(b->o, j);
        for (int i = 0; i < n; i++) {
            lucid_param *p = lucid_param_set_get(b->bind.set, i);
            if (p->kind != LUCID_PARAM_KIND_PARAM || !b->bind.trainable[i]) continue;
            lua_createtable(L, 0, 2);
            lua_pushfstring(L, "%s.%s", p->name, lucid_optim_state_name(b->o, j));
            lua_setfield(L, -2, "name");
            lucid_lua_push_tensor(L, flat_view(L, b->bind.ctx, flat, p));
            lua_setfield(L, -2, "tensor");
            lua_rawseti(L, -2, ++k);
        }
    }
    return 1;
}

/* opt:last_norm() -> the total gradient 2-norm before the last clip
 * (synchronizes; NaN/Inf when the gradients were not finite). */
static int l_optim_last_norm(lua_State *L) {
    lucid_lua_check_nargs(L, 1);
    optim_box *b = check_optim(L, 1);
    lucid_param_values v;
    block_read(L, b->blk, &v);
    lua_pushnumber(L, v.st.grad_norm);
    return 1;
}

/* opt:set_lr_factor(lf) — every group's lr = initial_lr * lf (the
 * LambdaLR step Ultralytics runs at the start of each epoch). */
static int l_optim_set_lr_factor(lua_State *L) {
    lucid_lua_check_nargs(L, 2);
    optim_box *b = check_optim(L, 1);
    double lf = check_num_range(L, 2, "lf", 0, F32_MAX, 0);
    for (int s = 0; s < LUCID_PARAM_SLOTS; s++) b->lr[s] = b->initial_lr[s] * lf;
    stage_groups(b);
    return 0;
}

/*
 * opt:warmup(ni, nw, lf, [opts]) — the per-iteration warmup of the
 *   Ultralytics trainer (reference §3.4), for ni <= nw: every group's
 *   lr = interp(ni, [0, nw], [start, initial_lr*lf]) with start =
 *   opts.warmup_bias_lr (0.1) for the bias groups and 0 otherwise; for
 *   SGD/MuSGD also momentum = interp(ni, [0, nw], [opts.warmup_momentum
 *   (0.8), opts.momentum (0.937)]). AdamW's beta1 is not touched.
 */
static int l_optim_warmup(lua_State *L) {
    lucid_lua_check_nargs(L, 5);
    optim_box *b = check_optim(L, 1);
    int64_t ni = check_int(L, 2, "ni"), nw = check_int_range(L, 3, "nw", 0, INT64_MAX);
    double lf = check_num_range(L, 4, "lf", 0, F32_MAX, 0);
    double wbl = 0.1, wm = 0.8, m = 0.937;
    if (!lua_isnoneornil(L, 5)) {
        static const char *const keys[] = {"warmup_bias_lr", "warmup_momentum", "momentum", NULL};
        lucid_lua_checktype(L, 5, LUA_TTABLE);
        lucid_lua_check_keys(L, 5, keys);
        wbl = opt_num(L, 5, 5, "warmup_bias_lr", wbl, 0, F32_MAX, 0);
        wm = opt_num(L, 5, 5, "warmup_momentum", wm, 0, 1, 0);
        m = opt_num(L, 5, 5, "momentum", m, 0, 1, 0);
    }
    for (int s = 0; s < LUCID_PARAM_SLOTS; s++) {
        b->lr[s] = lucid_sched_warmup_lr(ni, nw, s % 3 == LUCID_KIND_BIAS, wbl,
                                         b->initial_lr[s], lf);
        if (b->kind != LUCID_OPTIM_ADAMW)
            b->momentum[s] = lucid_sched_warmup_momentum(ni, nw, wm, m);
    }
    stage_groups(b);
    return 0;
}

/* opt:summary() -> the reference's build_optimizer log line. */
static int l_optim_summary(lua_State *L) {
    lucid_lua_check_nargs(L, 1);
    push_summary(L, check_optim(L, 1));
    return 1;
}

static int l_optim_tostring(lua_State *L) {
    optim_box *b = lucid_lua_checkudata(L, 1, OPTIM_MT);
    if (!b->o) {
        lua_pushliteral(L, "Optimizer(uninitialised)");
        return 1;
    }
    push_summary(L, b);
    return 1;
}

/* ----------------------------------------------------------- ParamGroup */

typedef struct {
    optim_box *ob; /* kept alive by the environment table (the optimizer) */
    int slot;
} group_box;

static void push_groups(lua_State *L, int opt_idx) {
    optim_box *b = lua_touserdata(L, opt_idx);
    env_get(L, opt_idx, "param_groups");
    if (!lua_isnil(L, -1)) return;
    lua_pop(L, 1);
    lua_createtable(L, b->ngroups, 0);
    for (int s = 0; s < b->ngroups; s++) {
        group_box *g = lua_newuserdata(L, sizeof *g);
        g->ob = b;
        g->slot = s;
        luaL_getmetatable(L, GROUP_MT);
        lua_setmetatable(L, -2);
        lua_createtable(L, 0, 1);
        lua_pushvalue(L, opt_idx);
        lua_setfield(L, -2, "optimizer");
        lua_setfenv(L, -2);
        lua_rawseti(L, -2, s + 1);
    }
    lua_getfenv(L, opt_idx);
    lua_pushvalue(L, -2);
    lua_setfield(L, -2, "param_groups");
    lua_pop(L, 1);
}

/* group.<field>: name, lr, initial_lr, weight_decay, momentum (SGD/MuSGD),
 * betas (AdamW: {beta1, beta2}), nesterov, params (tensor count, frozen
 * included), trainable (trainable tensor count), numel, head, slot (0-based
 * engine slot). Values are the host mirror (doubles as set). */
static int l_group_index(lua_State *L) {
    group_box *g = lucid_lua_checkudata(L, 1, GROUP_MT);
    optim_box *b = g->ob;
    int s = g->slot;
    const char *k = lucid_lua_checkstring(L, 2);
    if (strcmp(k, "name") == 0) lua_pushstring(L, slot_name(b, s));
    else if (strcmp(k, "lr") == 0) lua_pushnumber(L, b->lr[s]);
    else if (strcmp(k, "initial_lr") == 0) lua_pushnumber(L, b->initial_lr[s]);
    else if (strcmp(k, "weight_decay") == 0) lua_pushnumber(L, b->wd[s]);
    else if (strcmp(k, "momentum") == 0) {
        if (b->kind == LUCID_OPTIM_ADAMW) lua_pushnil(L);
        else lua_pushnumber(L, b->momentum[s]);
    } else if (strcmp(k, "betas") == 0) {
        if (b->kind != LUCID_OPTIM_ADAMW) lua_pushnil(L);
        else {
            lua_createtable(L, 2, 0);
            lua_pushnumber(L, b->momentum[s]);
            lua_rawseti(L, -2, 1);
            lua_pushnumber(L, b->beta2);
            lua_rawseti(L, -2, 2);
        }
    } else if (strcmp(k, "nesterov") == 0) lua_pushboolean(L, b->nesterov);
    else if (strcmp(k, "params") == 0) lua_pushinteger(L, b->count[s]);
    else if (strcmp(k, "trainable") == 0) lua_pushinteger(L, b->count_trainable[s]);
    else if (strcmp(k, "numel") == 0) lua_pushnumber(L, (lua_Number)b->numel[s]);
    else if (strcmp(k, "head") == 0) lua_pushboolean(L, s >= 3);
    else if (strcmp(k, "slot") == 0) lua_pushinteger(L, s);
    else lua_pushnil(L);
    return 1;
}

/* group.lr / initial_lr / weight_decay / momentum / betas = value: host
 * mirror + staging (uploaded at the next step). */
static int l_group_newindex(lua_State *L) {
    group_box *g = lucid_lua_checkudata(L, 1, GROUP_MT);
    optim_box *b = g->ob;
    int s = g->slot;
    const char *k = lucid_lua_checkstring(L, 2);
    if (strcmp(k, "betas") == 0) {
        if (b->kind != LUCID_OPTIM_ADAMW)
            return argerr(L, 3, "betas: only AdamW groups have betas (use momentum)");
        if (!lua_istable(L, 3)) return argerr(L, 3, "betas: expected {beta1, beta2}");
        lua_rawgeti(L, 3, 1);
        lua_rawgeti(L, 3, 2);
        double b1 = check_num(L, -2, "betas[1]"), b2 = check_num(L, -1, "betas[2]");
        if (!in_range(b1, 0, 1, R_HI_OPEN) || !in_range(b2, 0, 1, R_HI_OPEN))
            return argerr(L, 3, "betas: expected values in [0, 1), got {%f, %f}", b1, b2);
        b->momentum[s] = b1;
        b->beta2 = b2;
        lua_pop(L, 2);
    } else {
        double v = check_num(L, 3, k);
        int known = strcmp(k, "lr") == 0 || strcmp(k, "initial_lr") == 0 ||
                    strcmp(k, "weight_decay") == 0 || strcmp(k, "momentum") == 0;
        if (known) /* momentum in [0, 1]; the others >= 0, all finite */
            check_range(L, 3, k, v, 0, strcmp(k, "momentum") == 0 ? 1 : F32_MAX, 0);
        if (strcmp(k, "lr") == 0) b->lr[s] = v;
        else if (strcmp(k, "initial_lr") == 0) b->initial_lr[s] = v;
        else if (strcmp(k, "weight_decay") == 0) b->wd[s] = v;
        else if (strcmp(k, "momentum") == 0) {
            if (b->kind == LUCID_OPTIM_ADAMW)
                return argerr(L, 2, "momentum: AdamW groups have betas, not momentum");
            b->momentum[s] = v;
        } else {
            return argerr(L, 2, "param group field '%s' is not settable (lr, "
                                "initial_lr, weight_decay, momentum, betas)", k);
        }
    }
    stage_groups(b);
    return 0;
}

static int l_group_tostring(lua_State *L) {
    group_box *g = lucid_lua_checkudata(L, 1, GROUP_MT);
    char lr[32], wd[32];
    pyfloat(lr, sizeof lr, g->ob->lr[g->slot]);
    pyfloat(wd, sizeof wd, g->ob->wd[g->slot]);
    lua_pushfstring(L, "ParamGroup(%s, %d params, lr=%s, weight_decay=%s)",
                    slot_name(g->ob, g->slot), g->ob->count[g->slot], lr, wd);
    return 1;
}

static int l_optim_step_fused(lua_State *L); /* after the GradScaler section */

static const luaL_Reg optim_methods[] = {
    {"step", l_optim_step},
    {"step_fused", l_optim_step_fused},
    {"zero_grad", l_optim_zero_grad},
    {"upload", l_optim_upload},
    {"state_tensors", l_optim_state_tensors},
    {"state_views", l_optim_state_views},
    {"last_norm", l_optim_last_norm},
    {"set_lr_factor", l_optim_set_lr_factor},
    {"warmup", l_optim_warmup},
    {"summary", l_optim_summary},
    {"free", l_optim_gc}, /* release the state buffers now (idempotent) */
    {NULL, NULL},
};

/* Methods, then the fields name, block, param_groups, nesterov, model,
 * set. */
static int l_optim_index(lua_State *L) {
    optim_box *b = check_optim(L, 1);
    lua_pushvalue(L, 2);
    lua_rawget(L, lua_upvalueindex(1));
    if (!lua_isnil(L, -1)) return 1;
    lua_pop(L, 1);
    const char *k = lua_tostring(L, 2);
    if (!k) return 0;
    if (strcmp(k, "name") == 0) lua_pushstring(L, lucid_optim_kind_name(b->kind));
    else if (strcmp(k, "param_groups") == 0) push_groups(L, 1);
    else if (strcmp(k, "nesterov") == 0) lua_pushboolean(L, b->nesterov);
    else if (strcmp(k, "block") == 0 || strcmp(k, "model") == 0 || strcmp(k, "set") == 0)
        env_get(L, 1, k);
    else lua_pushnil(L);
    return 1;
}

/* ============================================================== clipping */

typedef struct {
    pbind bind;
    block_box *blk; /* kept alive by the environment table */
} clip_box;

static int l_clip_gc(lua_State *L) {
    clip_box *c = lucid_lua_checkudata(L, 1, CLIPST_MT);
    pbind_free(&c->bind);
    return 0;
}

/* Resolve model_or_opt at idx to (bind, block). For a model, the clip state
 * (layout + own block) is created once per ParamSet and cached in a weak
 * registry table. */
static void clip_target(lua_State *L, int idx, pbind **bind, block_box **blk) {
    optim_box *ob = luaL_testudata(L, idx, OPTIM_MT);
    if (ob && ob->o) {
        *bind = &ob->bind;
        *blk = ob->blk;
        return;
    }
    nn_set_box *sb = push_set_of(L, idx, idx, "model_or_opt");
    int set_idx = lua_gettop(L);
    lua_getfield(L, LUA_REGISTRYINDEX, CLIP_CACHE_KEY);
    int cache = lua_gettop(L);
    lua_pushvalue(L, set_idx);
    lua_rawget(L, cache);
    clip_box *c = luaL_testudata(L, -1, CLIPST_MT);
    if (!c) {
        lua_pop(L, 1);
        c = lua_newuserdata(L, sizeof *c);
        memset(c, 0, sizeof *c);
        luaL_getmetatable(L, CLIPST_MT);
        lua_setmetatable(L, -2);
        int ud = lua_gettop(L);
        block_box *blk2 = new_block(L, sb->ctx, lucid_param_set_device(sb->s));
        lua_createtable(L, 0, 1);
        lua_pushvalue(L, -2);
        lua_setfield(L, -2, "block");
        lua_setfenv(L, ud);
        lua_pop(L, 1);
        c->blk = blk2;
        pbind_init(L, &c->bind, sb, 0);
        lua_pushvalue(L, set_idx);
        lua_pushvalue(L, ud);
        lua_rawset(L, cache);
    }
    /* the cache keeps c alive as long as the set userdata lives, and the
     * caller's argument keeps the set alive during this call */
    lua_settop(L, set_idx - 1);
    *bind = &c->bind;
    *blk = c->blk;
}

static void clip_run(lua_State *L, pbind *bind, block_box *blk, int mode) {
    pbind_check(L, bind, "clip");
    block_sync(L, blk);
    lucid_tensor *p, *g;
    bind_flats(L, bind, &p, &g);
    lucid_status st = mode == 2 ? lucid_grad_clip_value(bind->ctx, bind->layout, blk->pb, g)
                                : lucid_grad_clip_norm(bind->ctx, bind->layout, blk->pb, g,
                                                       mode == 1);
    if (st != LUCID_OK) lucid_lua_raise(L, bind->ctx, st);
}

/*
 * lucid.optim.clip_grad_norm(model_or_opt, max_norm) — torch
 *   clip_grad_norm_ over every trainable gradient: total 2-norm N in f32
 *   (fixed-order reduction), then g *= min(max_norm/(N + 1e-6), 1)
 *   unconditionally (clipping reference §2-§3; a non-finite N is counted in
 *   the block's nonfinite_norms and propagates as torch does). Returns
 *   nothing and does not synchronize; the pre-clip norm stays on the device
 *   (lucid.optim.last_norm / opt:last_norm read it). max_norm goes to the
 *   block (uploaded with the other inputs).
 */
static int l_clip_grad_norm(lua_State *L) {
    pbind *bind;
    block_box *blk;
    clip_target(L, 1, &bind, &blk);
    double m = check_num_range(L, 2, "max_norm", 0, F32_MAX, 0);
    lucid_param_inputs *in = lucid_param_block_staging(blk->pb);
    if (in->clip_max_norm != (float)m) {
        in->clip_max_norm = (float)m;
        blk->dirty = 1;
    }
    clip_run(L, bind, blk, 1);
    return 0;
}

/* lucid.optim.grad_norm(model_or_opt) — the total norm only (torch
 * get_total_norm), stored on the device for last_norm; no clipping. */
static int l_grad_norm(lua_State *L) {
    pbind *bind;
    block_box *blk;
    clip_target(L, 1, &bind, &blk);
    clip_run(L, bind, blk, 0);
    return 0;
}

/* lucid.optim.clip_grad_value(model_or_opt, clip_value) — torch
 * clip_grad_value_: clamp every trainable gradient to [-c, c] (NaN stays
 * NaN). Returns nothing. */
static int l_clip_grad_value(lua_State *L) {
    pbind *bind;
    block_box *blk;
    clip_target(L, 1, &bind, &blk);
    double c = check_num_range(L, 2, "clip_value", 0, F32_MAX, 0);
    lucid_param_inputs *in = lucid_param_block_staging(blk->pb);
    if (in->clip_value != (float)c) {
        in->clip_value = (float)c;
        blk->dirty = 1;
    }
    clip_run(L, bind, blk, 2);
    return 0;
}

/* lucid.optim.last_norm(model_or_opt) -> number: the pre-clip total norm of
 * the last clip_grad_norm/grad_norm on that target (synchronizes). */
static int l_last_norm(lua_State *L) {
    pbind *bind;
    block_box *blk;
    clip_target(L, 1, &bind, &blk);
    lucid_param_values v;
    block_read(L, blk, &v);
    lua_pushnumber(L, v.st.grad_norm);
    return 1;
}

/* =================================================================== EMA */

typedef struct {
    pbind bind;
    block_box *blk;               /* shared block (kept alive by env) */
    lucid_ema *pe;                /* EMA of the flat parameters */
    lucid_param_layout *blayout;  /* f32 buffers over the buffer view */
    lucid_tensor *bview;          /* f32 view of the set's flat buffers */
    lucid_param_block *bpb;       /* scratch block of the separate buffer
                                     update (lucid_ema_update_pair: a device
                                     copy of blk taken before each update,
                                     so both EMAs use one d); no state of
                                     its own */
    lucid_ema *be;                /* EMA of the f32 buffers (NULL if none) */
} ema_box;

static ema_box *check_ema(lua_State *L, int idx) {
    ema_box *e = luaL_testudata(L, idx, EMA_MT);
    if (!e) argerr(L, idx, "ema: expected lucid.EMA, got %s", tname(L, idx));
    if (!e->pe) argerr(L, idx, "ema: freed (or its construction failed)");
    return e;
}

static int l_ema_gc(lua_State *L) {
    lucid_lua_check_nargs(L, 1);
    ema_box *e = lucid_lua_checkudata(L, 1, EMA_MT);
    if (e->pe) lucid_ema_release(e->pe);
    if (e->be) lucid_ema_release(e->be);
    if (e->bpb) lucid_param_block_release(e->bpb);
    if (e->blayout) lucid_param_layout_release(e->blayout);
    if (e->bview) lucid_tensor_release(e->bview);
    e->pe = NULL;
    e->be = NULL;
    e->bpb = NULL;
    e->blayout = NULL;
    e->bview = NULL;
    pbind_free(&e->bind);
    return 0;
}

/* decay and tau live in the EMA's (shared) block only: the buffer EMA uses
 * that block's d, in the fused step and in ema:update() alike. */
static void ema_set_hyper(ema_box *e, double decay, double tau) {
    lucid_param_inputs *in = lucid_param_block_staging(e->blk->pb);
    in->ema_decay = decay;
    in->ema_tau = tau;
    e->blk->dirty = 1;
}

/*
 * lucid.EMA{model=, decay=0.9999, tau=2000, block=} -> EMA
 *   Ultralytics ModelEMA (reference §3.5): a copy of every parameter
 *   (trainable and frozen) and every floating buffer (BN running mean/var;
 *   not the i64 num_batches_tracked), taken now. ema:update() after each
 *   optimizer step: updates += 1; d = decay*(1 - exp(-updates/tau)) (f64);
 *   v = v*d + (1-d)*p in f32, parameters and f32 buffers with the same d.
 *   block: share the optimizer's block (block=opt) so the EMA counter sits
 *   with the rest of the run's state and opt:step_fused{ema=} runs the
 *   update inside the optimizer step; a new block otherwise. decay and tau
 *   live in the block (settable: ema.decay = x).
 */
static int l_ema_new(lua_State *L) {
    static const char *const keys[] = {"model", "params", "decay", "tau", "block", NULL};
    lucid_lua_checktype(L, 1, LUA_TTABLE);
    check_keys(L, 1, 1, keys, "model, params, decay, tau, block");
    double decay = opt_num(L, 1, 1, "decay", 0.9999, 0, 1, 0);
    double tau = opt_num(L, 1, 1, "tau", 2000, 0, HUGE_VAL, R_LO_OPEN);
    lua_getfield(L, 1, "model");
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_getfield(L, 1, "params");
    }
    if (lua_isnil(L, -1)) argerr(L, 1, "model: expected a model or lucid.ParamSet, got nil");
    int model_idx = lua_gettop(L);
    nn_set_box *sb = push_set_of(L, model_idx, 1, "model");
    int set_idx = lua_gettop(L);
    lucid_device dev = lucid_param_set_device(sb->s);
    block_box *blk = push_block_opt(L, 1, 1, sb->ctx, dev);
    int blk_idx = lua_gettop(L);

    ema_box *e = lua_newuserdata(L, sizeof *e);
    memset(e, 0, sizeof *e);
    luaL_getmetatable(L, EMA_MT);
    lua_setmetatable(L, -2);
    int ud = lua_gettop(L);
    lua_createtable(L, 0, 3);
    lua_pushvalue(L, set_idx);
    lua_setfield(L, -2, "set");
    lua_pushvalue(L, blk_idx);
    lua_setfield(L, -2, "block");
    lua_pushvalue(L, model_idx);
    lua_setfield(L, -2, "model");
    lua_setfenv(L, ud);
    e->blk = blk;
    pbind_init(L, &e->bind, sb, 0);
    lucid_ctx *ctx = e->bind.ctx;
    lucid_tensor *flat = lucid_param_set_flat_params(sb->s);
    lucid_status st = lucid_ema_create(ctx, e->bind.layout, flat, &e->pe);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);

    /* buffers: f32 entries of the byte buffer, through an f32 view */
    lucid_tensor *fb = lucid_param_set_flat_buffers(sb->s);
    int nbuf = 0;
    for (int i = 0; i < lucid_param_set_count(sb->s); i++) {
        lucid_param *p = lucid_param_set_get(sb->s, i);
        if (p->kind == LUCID_PARAM_KIND_BUFFER && lucid_dtype_is_float(p->dtype)) nbuf++;
    }
    if (fb && nbuf > 0) {
        int64_t n = (int64_t)(lucid_tensor_nbytes(fb) / sizeof(float));
        st = lucid_tensor_from_storage(ctx, fb->storage, LUCID_F32, 1, &n, NULL,
                                       fb->offset / (int64_t)sizeof(float), &e->bview);
        if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
        char err[512];
        e->blayout = make_layout(ctx, sb->s, 1, 0, n, err, sizeof err, &st);
        if (!e->blayout) return luaL_error(L, "lucid %s: EMA buffer layout: %s",
                                           lucid_status_name(st), err);
        st = lucid_ema_create(ctx, e->blayout, e->bview, &e->be);
        if (st == LUCID_OK) st = lucid_param_block_create(ctx, dev, NULL, &e->bpb);
        if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    }
    ema_set_hyper(e, decay, tau);
    /* a fresh EMA starts at updates = 0 (also when sharing a block that
     * already counted updates of an earlier EMA) */
    lucid_param_values v;
    block_read(L, blk, &v);
    v.st.ema_updates = 0;
    block_set_state(L, blk, &v.st);
    lua_settop(L, ud);
    return 1;
}

/* The separate EMA update of e (ema:update(), and opt:step_fused's
 * fallback for an EMA that does not share the optimizer's block): uploads
 * pending edits of its block, then lucid_ema_update over the parameters,
 * or lucid_ema_update_pair over parameters and f32 buffers (one update
 * counter, one d: bitwise what the fused step's EMA does). */
static void ema_update_run(lua_State *L, ema_box *e) {
    lucid_ctx *ctx = e->bind.ctx;
    block_sync(L, e->blk);
    lucid_tensor *flat = lucid_param_set_flat_params(e->bind.set);
    lucid_status st = e->be ? lucid_ema_update_pair(ctx, e->pe, e->blk->pb, flat, e->be,
                                                    e->bpb, e->bview)
                            : lucid_ema_update(ctx, e->pe, e->blk->pb, flat);
    if (st != LUCID_OK) lucid_lua_raise(L, ctx, st);
}

/*
 * ema:update() — one ModelEMA update from the model's current parameters
 *   and f32 buffers (reference §3.5): updates += 1 (once, in the EMA's
 *   block); d = decay*(1 - exp(-updates/tau)) in f64; v = v*f32(d) +
 *   f32(1-d)*p in f32 for every parameter and f32 buffer element, both
 *   with the same d. Stream-ordered; no synchronization. opt:step_fused
 *   with ema= does the same inside the optimizer step (bitwise equal).
 */
static int l_ema_update(lua_State *L) {
    lucid_lua_check_nargs(L, 1);
    ema_update_run(L, check_ema(L, 1));
    return 0;
}

/* The EMA tensor (params or buffers) holding entry p, or NULL. */
static lucid_tensor *ema_flat_for(ema_box *e, const lucid_param *p) {
    if (p->kind == LUCID_PARAM_KIND_PARAM) return lucid_ema_tensor(e->pe);
    if (e->be && lucid_dtype_is_float(p->dtype)) return lucid_ema_tensor(e->be);
    return NULL;
}

/* ema:tensor(name) -> Tensor view (the entry's shape, f32) of the EMA value
 * of parameter/buffer `name`; nil for names the EMA does not cover (unknown
 * names, integer buffers). The view aliases the EMA. */
static int l_ema_tensor(lua_State *L) {
    lucid_lua_check_nargs(L, 2);
    ema_box *e = check_ema(L, 1);
    const char *name = lucid_lua_checkstring(L, 2);
    lucid_param *p = lucid_param_set_find(e->bind.set, name);
    lucid_tensor *flat = p ? ema_flat_for(e, p) : NULL;
    if (!flat) {
        lua_pushnil(L);
        return 1;
    }
    lucid_lua_push_tensor(L, flat_view(L, e->bind.ctx, flat, p));
    return 1;
}

/* ema:views() -> {{name = <reference name>, tensor = view}, ...} for every
 * entry the EMA covers, in set (state-dict) order. */
static int l_ema_views(lua_State *L) {
    lucid_lua_check_nargs(L, 1);
    ema_box *e = check_ema(L, 1);
    int n = lucid_param_set_count(e->bind.set), k = 0;
    lua_newtable(L);
    for (int i = 0; i < n; i++) {
        lucid_param *p = lucid_param_set_get(e->bind.set, i);
        lucid_tensor *flat = ema_flat_for(e, p);
        if (!flat) continue;
        lua_createtable(L, 0, 2);
        lua_pushstring(L, p->name);
        lua_setfield(L, -2, "name");
        lucid_lua_push_tensor(L, flat_view(L, e->bind.ctx, flat, p));
        lua_setfield(L, -2, "tensor");
        lua_rawseti(L, -2, ++k);
    }
    return 1;
}

/* Target set for copy_to/swap: the argument at idx or the EMA's model; must
 * have the same entries (names, shapes) as the EMA's set. */
static lucid_param_set *ema_target(lua_State *L, ema_box *e, int idx) {
    if (lua_isnoneornil(L, idx)) return e->bind.set;
    nn_set_box *sb = push_set_of(L, idx, idx, "model");
    lua_pop(L, 1);
    lucid_param_set *s = sb->s;
    if (s == e->bind.set) return s;
    int n = lucid_param_set_count(s);
    if (n != lucid_param_set_count(e->bind.set))
        argerr(L, idx, "model: %d entries, the EMA has %d", n,
               lucid_param_set_count(e->bind.set));
    for (int i = 0; i < n; i++) {
        lucid_param *a = lucid_param_set_get(s, i), *b = lucid_param_set_get(e->bind.set, i);
        int same = strcmp(a->name, b->name) == 0 && a->ndim == b->ndim &&
                   a->offset == b->offset && a->dtype == b->dtype;
        for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
        if (!same)
            argerr(L, idx, "model: entry %d is '%s', the EMA's is '%s' (different "
                           "architecture or layout)", i + 1, a->name, b->name);
    }
    if (lucid_param_set_device(s).type != lucid_param_set_device(e->bind.set).type)
        argerr(L, idx, "model: on another device than the EMA");
    return s;
}

/* Copy (swap=0) or exchange (swap=1) the EMA values with the set's entries:
 * the flat parameters in one go, the f32 buffers entry by entry (integer
 * buffers untouched). */
static void ema_transfer(lua_State *L, ema_box *e, lucid_param_set *s, int swap) {
    lucid_ctx *ctx = e->bind.ctx;
    lucid_tensor *tmp = NULL;
    lucid_tensor *flat = lucid_param_set_flat_params(s), *ev = lucid_ema_tensor(e->pe);
    lucid_status st = LUCID_OK;
    if (swap) st = lucid_tensor_clone(ctx, flat, &tmp);
    if (st == LUCID_OK) st = lucid_copy(ctx, flat, ev);
    if (st == LUCID_OK && swap) st = lucid_copy(ctx, ev, tmp);
    if (tmp) lucid_tensor_release(tmp);
    tmp = NULL;
    int n = lucid_param_set_count(s);
    for (int i = 0; i < n && st == LUCID_OK && e->be; i++) {
        lucid_param *p = lucid_param_set_get(s, i);
        if (p->kind != LUCID_PARAM_KIND_BUFFER || !lucid_dtype_is_float(p->dtype)) continue;
        lucid_tensor *v = NULL;
        st = lucid_tensor_from_storage(ctx, lucid_ema_tensor(e->be)->storage, LUCID_F32,
                                       p->ndim, p->ndim ? p->shape : NULL, NULL,
                                       lucid_ema_tensor(e->be)->offset + p->offset, &v);
        if (st != LUCID_OK) break;
        if (swap) st = lucid_tensor_clone(ctx, p->data, &tmp);
        if (st == LUCID_OK) st = lucid_copy(ctx, p->data, v);
        if (st == LUCID_OK && swap) st = lucid_copy(ctx, v, tmp);
        if (tmp) lucid_tensor_release(tmp);
        tmp = NULL;
        lucid_tensor_release(v);
    }
    if (st != LUCID_OK) lucid_lua_raise(L, ctx, st);
}

/* ema:copy_to([model]) — write the EMA values into model's parameters and
 * f32 buffers (default: the EMA's own model), e.g. before validation or
 * export. The EMA is unchanged. */
static int l_ema_copy_to(lua_State *L) {
    lucid_lua_check_nargs(L, 2);
    ema_box *e = check_ema(L, 1);
    ema_transfer(L, e, ema_target(L, e, 2), 0);
    return 0;
}

/* ema:swap([model]) — exchange EMA and model values (bitwise); calling it
 * again restores both. Validation on the EMA weights: swap, validate,
 * swap. */
static int l_ema_swap(lua_State *L) {
    lucid_lua_check_nargs(L, 2);
    ema_box *e = check_ema(L, 1);
    ema_transfer(L, e, ema_target(L, e, 2), 1);
    return 0;
}

/* ema:flat() -> the flat EMA parameter tensor, ema:flat("buffers") -> the
 * f32 view of the buffer EMA (nil when the model has no f32 buffers). */
static int l_ema_flat(lua_State *L) {
    lucid_lua_check_nargs(L, 2);
    ema_box *e = check_ema(L, 1);
    static const char *const which[] = {"params", "buffers", NULL};
    int w = lucid_lua_checkoption(L, 2, "params", which);
    lucid_tensor *t = w == 0 ? lucid_ema_tensor(e->pe) : (e->be ? lucid_ema_tensor(e->be) : NULL);
    if (t) lucid_tensor_retain(t);
    lucid_lua_push_tensor(L, t);
    return 1;
}

static const luaL_Reg ema_methods[] = {
    {"update", l_ema_update}, {"tensor", l_ema_tensor}, {"views", l_ema_views},
    {"copy_to", l_ema_copy_to}, {"swap", l_ema_swap}, {"flat", l_ema_flat},
    {"free", l_ema_gc}, /* release the EMA buffers now (idempotent) */
    {NULL, NULL},
};

/* Methods, then updates (synchronizes), decay, tau, block, model. */
static int l_ema_index(lua_State *L) {
    ema_box *e = check_ema(L, 1);
    lua_pushvalue(L, 2);
    lua_rawget(L, lua_upvalueindex(1));
    if (!lua_isnil(L, -1)) return 1;
    lua_pop(L, 1);
    const char *k = lua_tostring(L, 2);
    if (!k) return 0;
    if (strcmp(k, "updates") == 0) {
        lucid_param_values v;
        block_read(L, e->blk, &v);
        lua_pushnumber(L, (lua_Number)v.st.ema_updates);
    } else if (strcmp(k, "decay") == 0) {
        lua_pushnumber(L, lucid_param_block_staging(e->blk->pb)->ema_decay);
    } else if (strcmp(k, "tau") == 0) {
        lua_pushnumber(L, lucid_param_block_staging(e->blk->pb)->ema_tau);
    } else if (strcmp(k, "block") == 0 || strcmp(k, "model") == 0) {
        env_get(L, 1, k);
    } else {
        lua_pushnil(L);
    }
    return 1;
}

/* ema.updates = n (resume; synchronous), ema.decay = d, ema.tau = t. */
static int l_ema_newindex(lua_State *L) {
    ema_box *e = check_ema(L, 1);
    const char *k = lucid_lua_checkstring(L, 2);
    lucid_param_inputs *in = lucid_param_block_staging(e->blk->pb);
    if (strcmp(k, "updates") == 0) {
        int64_t n = check_int(L, 3, "updates");
        if (n < 0) return argerr(L, 3, "updates: expected >= 0, got %d", (int)n);
        lucid_param_values v;
        block_read(L, e->blk, &v);
        v.st.ema_updates = n;
        block_set_state(L, e->blk, &v.st);
    } else if (strcmp(k, "decay") == 0) {
        double d = check_num_range(L, 3, "decay", 0, 1, 0);
        ema_set_hyper(e, d, in->ema_tau);
    } else if (strcmp(k, "tau") == 0) {
        double t = check_num_range(L, 3, "tau", 0, HUGE_VAL, R_LO_OPEN);
        ema_set_hyper(e, in->ema_decay, t);
    } else {
        return argerr(L, 2, "EMA field '%s' is not settable (updates, decay, tau)", k);
    }
    return 0;
}

/* ============================================================ GradScaler */

typedef struct {
    block_box *blk;    /* NULL until bound; kept alive by env */
    double init_scale, growth_factor, backoff_factor;
    int growth_interval, enabled, unscaled;
} scaler_box;

static scaler_box *check_scaler(lua_State *L, int idx) {
    scaler_box *s = luaL_testudata(L, idx, SCALER_MT);
    if (!s) argerr(L, idx, "scaler: expected lucid.GradScaler, got %s", tname(L, idx));
    return s;
}

/* Bind the scaler at sidx to the block of the optimizer at oidx (first
 * use), or check it is the same block. Writes the policy into the block and
 * resets its scale to init_scale. */
static optim_box *scaler_bind(lua_State *L, int sidx, int oidx) {
    scaler_box *s = check_scaler(L, sidx);
    optim_box *ob = check_optim(L, oidx);
    if (s->blk) {
        if (s->blk != ob->blk)
            argerr(L, oidx, "optimizer: uses another parameter block than the one "
                            "this GradScaler is bound to");
        return ob;
    }
    env_get(L, oidx, "block");
    lua_getfenv(L, sidx);
    lua_pushvalue(L, -2);
    lua_setfield(L, -2, "block");
    lua_pop(L, 2);
    s->blk = ob->blk;
    lucid_param_inputs *in = lucid_param_block_staging(s->blk->pb);
    in->scaler_enabled = s->enabled;
    in->growth_factor = (float)s->growth_factor;
    in->backoff_factor = (float)s->backoff_factor;
    in->growth_interval = s->growth_interval;
    s->blk->dirty = 1;
    lucid_param_values v;
    block_read(L, s->blk, &v);
    v.st.loss_scale = (float)s->init_scale;
    v.st.growth_tracker = 0;
    v.st.found_inf = 0;
    block_set_state(L, s->blk, &v.st);
    return ob;
}

/*
 * lucid.amp.GradScaler{init_scale=65536, growth_factor=2.0,
 *   backoff_factor=0.5, growth_interval=2000, enabled=true, optimizer=}
 *   -> GradScaler. torch.amp.GradScaler's dynamic loss scale, decided on
 *   the device: unscale_ sets found_inf when a gradient is not finite; the
 *   optimizer step is skipped then; update() halves the scale (and resets
 *   the tracker) after an overflow, doubles it after growth_interval clean
 *   steps. The scaler lives in the optimizer's parameter block: it binds to
 *   opts.optimizer now, or to the first optimizer passed to unscale_/step.
 *   enabled=false makes every call a no-op pass-through (fp32/bf16).
 */
static int l_scaler_new(lua_State *L) {
    static const char *const keys[] = {"init_scale", "growth_factor", "backoff_factor",
                                       "growth_interval", "enabled", "optimizer", NULL};
    lua_settop(L, 1);
    int has = lua_istable(L, 1);
    if (!lua_isnil(L, 1) && !has)
        return argerr(L, 1, "opts: expected a table, got %s", tname(L, 1));
    if (!has) {
        lua_newtable(L);
        lua_replace(L, 1);
    }
    check_keys(L, 1, 1, keys, "init_scale, growth_factor, backoff_factor, "
                              "growth_interval, enabled, optimizer");
    double init = opt_num(L, 1, 1, "init_scale", 65536.0, 0, F32_MAX, R_LO_OPEN);
    double gf = opt_num(L, 1, 1, "growth_factor", 2.0, 1.0, F32_MAX, 0);
    double bf = opt_num(L, 1, 1, "backoff_factor", 0.5, 0, 1.0, R_LO_OPEN);
    double gi = opt_num(L, 1, 1, "growth_interval", 2000, 1, 2147483647.0, 0);
    if (gi != floor(gi))
        return argerr(L, 1, "growth_interval: expected an integer in [1, 2147483647], got %f", gi);
    int en = opt_bool(L, 1, 1, "enabled", 1);
    scaler_box *s = lua_newuserdata(L, sizeof *s);
    memset(s, 0, sizeof *s);
    s->init_scale = init;
    s->growth_factor = gf;
    s->backoff_factor = bf;
    s->growth_interval = (int)gi;
    s->enabled = en;
    luaL_getmetatable(L, SCALER_MT);
    lua_setmetatable(L, -2);
    int ud = lua_gettop(L);
    lua_newtable(L);
    lua_setfenv(L, ud);
    lua_getfield(L, 1, "optimizer");
    if (!lua_isnil(L, -1)) scaler_bind(L, ud, lua_gettop(L));
    lua_settop(L, ud);
    return 1;
}

static void scaler_need(lua_State *L, scaler_box *s, const char *what) {
    if (!s->blk)
        luaL_error(L, "GradScaler:%s: not bound to an optimizer yet (pass "
                      "optimizer= at construction, or call unscale_/step(opt) first)",
                   what);
}

/* scaler:scale(t) -> t: t *= current loss scale, in place, read on the
 * device (t: f32, the loss or its seed gradient). Identity when disabled. */
static int l_scaler_scale(lua_State *L) {
    lucid_lua_check_nargs(L, 2);
    scaler_box *s = check_scaler(L, 1);
    lucid_tensor *t = lucid_lua_check_tensor(L, 2, "outputs");
    lua_settop(L, 2);
    if (!s->enabled) return 1;
    scaler_need(L, s, "scale");
    block_sync(L, s->blk);
    lucid_ctx *ctx = lucid_tensor_ctx(t);
    lucid_status st = lucid_scaler_scale(ctx, s->blk->pb, t);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    return 1;
}

/* scaler:unscale_(opt) — found_inf |= any gradient not finite; g *= 1/S
 * (torch GradScaler.unscale_). At most once per step. */
static int l_scaler_unscale(lua_State *L) {
    lucid_lua_check_nargs(L, 2);
    scaler_box *s = check_scaler(L, 1);
    optim_box *ob = scaler_bind(L, 1, 2);
    if (!s->enabled || s->unscaled) return 0;
    block_sync(L, s->blk);
    lucid_tensor *p, *g;
    bind_flats(L, &ob->bind, &p, &g);
    lucid_status st = lucid_grad_unscale(ob->bind.ctx, ob->bind.layout, s->blk->pb, g);
    if (st != LUCID_OK) return lucid_lua_raise(L, ob->bind.ctx, st);
    s->unscaled = 1;
    return 0;
}

/* scaler:step(opt) — unscale_ unless already done this step, then
 * opt:step() (which the device skips when found_inf is set). */
static int l_scaler_step(lua_State *L) {
    lucid_lua_check_nargs(L, 2);
    l_scaler_unscale(L);
    lua_settop(L, 2);
    lua_remove(L, 1);
    return l_optim_step(L);
}

/* scaler:update() — the end of every optimizer step: scale policy on the
 * device, found_inf reset (lucid_scaler_update). */
static int l_scaler_update(lua_State *L) {
    lucid_lua_check_nargs(L, 1);
    scaler_box *s = check_scaler(L, 1);
    s->unscaled = 0;
    if (!s->blk) return 0;
    block_sync(L, s->blk);
    lucid_status st = lucid_scaler_update(s->blk->ctx, s->blk->pb);
    if (st != LUCID_OK) return lucid_lua_raise(L, s->blk->ctx, st);
    return 0;
}

/* scaler:get_scale() -> number (synchronizes; 1.0 when disabled). */
static int l_scaler_get_scale(lua_State *L) {
    lucid_lua_check_nargs(L, 1);
    scaler_box *s = check_scaler(L, 1);
    if (!s->enabled) {
        lua_pushnumber(L, 1.0);
        return 1;
    }
    if (!s->blk) {
        lua_pushnumber(L, s->init_scale);
        return 1;
    }
    lucid_param_values v;
    block_read(L, s->blk, &v);
    lua_pushnumber(L, v.st.loss_scale);
    return 1;
}

static int l_scaler_is_enabled(lua_State *L) {
    lucid_lua_check_nargs(L, 1);
    lua_pushboolean(L, check_scaler(L, 1)->enabled);
    return 1;
}

/* scaler:state() -> {scale, growth_tracker, found_inf, skipped_steps}
 * (synchronizes; torch state_dict-like). */
static int l_scaler_state(lua_State *L) {
    lucid_lua_check_nargs(L, 1);
    scaler_box *s = check_scaler(L, 1);
    scaler_need(L, s, "state");
    lucid_param_values v;
    block_read(L, s->blk, &v);
    lua_createtable(L, 0, 4);
    lua_pushnumber(L, v.st.loss_scale);
    lua_setfield(L, -2, "scale");
    lua_pushnumber(L, v.st.growth_tracker);
    lua_setfield(L, -2, "growth_tracker");
    lua_pushnumber(L, v.st.found_inf);
    lua_setfield(L, -2, "found_inf");
    lua_pushnumber(L, (lua_Number)v.st.skipped_steps);
    lua_setfield(L, -2, "skipped_steps");
    return 1;
}

/* scaler:bind(opt) — bind to opt's parameter block now (writes the policy
 * and resets the scale to init_scale); a no-op when already bound to it,
 * an error when bound to another block. Bind before restoring a
 * checkpoint so the restored scale is not reset later. */
static int l_scaler_bind(lua_State *L) {
    lucid_lua_check_nargs(L, 2);
    scaler_bind(L, 1, 2);
    return 0;
}

static const luaL_Reg scaler_methods[] = {
    {"bind", l_scaler_bind},           {"scale", l_scaler_scale},         {"unscale_", l_scaler_unscale},
    {"step", l_scaler_step},           {"update", l_scaler_update},
    {"get_scale", l_scaler_get_scale}, {"is_enabled", l_scaler_is_enabled},
    {"state", l_scaler_state},         {NULL, NULL},
};

/* ====================================================== fused step */

/* Same parameter set and trainable flags at build time: the EMA's layout
 * has the optimizer's segment table (what lucid_optim_step_fused requires
 * of its ema). */
static int ema_fusable(const ema_box *e, const optim_box *ob) {
    if (e->blk != ob->blk || e->bind.set != ob->bind.set || e->bind.n != ob->bind.n)
        return 0;
    return e->bind.n == 0 ||
           memcmp(e->bind.trainable, ob->bind.trainable, (size_t)e->bind.n) == 0;
}

/* Optional number field k of the table at t: 1 and *v when present; raises
 * naming the field when it is not a number. */
static int opt_present_num(lua_State *L, int t, const char *k, double *v) {
    lua_getfield(L, t, k);
    int has = !lua_isnil(L, -1);
    if (has) {
        if (lua_type(L, -1) != LUA_TNUMBER)
            argerr(L, t, "%s: expected a number, got %s", k, tname(L, -1));
        /* the clip limits: finite, >= 0, f32 */
        *v = check_range(L, t, k, lua_tonumber(L, -1), 0, F32_MAX, 0);
    }
    lua_pop(L, 1);
    return has;
}

/*
 * opt:step_fused{scaler=, max_norm=, clip_value=, ema=, zero_grad=false}
 *   One whole optimizer step at an accumulation-window boundary as ONE
 *   engine call, lucid_optim_step_fused (engine/train/optim.h; two kernel
 *   launches on CUDA for SGD/AdamW), bitwise equal to the separate calls
 *       scaler:unscale_(opt)                      (scaler given, enabled,
 *                                                  not unscaled this step)
 *       lucid.optim.clip_grad_norm(opt, max_norm) (max_norm given)
 *       lucid.optim.clip_grad_value(opt, clip_value) (clip_value given)
 *       opt:step() / scaler:step(opt)             (skipped on the device
 *                                                  when found_inf)
 *       scaler:update()                           (scaler given)
 *       ema:update()                              (ema given)
 *       opt:zero_grad()                           (zero_grad = true)
 *   in that order (Ultralytics optimizer_step, torch GradScaler unscale_ ->
 *   clip -> step -> update; formulas: optim.h, clipping reference §2-§4,
 *   §8). Operates on the bound set's flat f32 parameters and gradients.
 *   scaler: a lucid.GradScaler (bound to this optimizer now if it is not
 *     yet; refused when bound to another block); a scaler:unscale_(opt)
 *     already done this step (e.g. before a user clipping function) is not
 *     repeated; the scaler's host flag is reset as scaler:update() does.
 *   max_norm, clip_value: numbers written to the block (as the clip
 *     functions do; not validated, as torch); the pre-clip norm stays on the
 *     device (opt:last_norm(), pb:state().grad_norm), a NaN/Inf norm counts
 *     in nonfinite_norms, a skipped fp16 step in skipped_steps.
 *   ema: a lucid.EMA. When it shares this optimizer's block (lucid.EMA{
 *     block = opt}) and parameter set, its parameter and f32-buffer
 *     averages run inside the step with one d (ema_updates advances once);
 *     otherwise ema:update() runs right after the step (same values).
 *   zero_grad: true zeroes the flat gradients after the step (one fill);
 *     false/nil leaves the processed (unscaled, clipped) gradients there,
 *     as the separate calls do.
 *   Uploads pending hyperparameter edits first; returns nothing; does not
 *   synchronize; capturable in a CUDA graph (no allocation, no host read).
 *   Raises on unknown options, wrong types, a parameter frozen/unfrozen
 *   since construction, or an engine error ("lucid <status>: ...").
 */
static int l_optim_step_fused(lua_State *L) {
    static const char *const keys[] = {"scaler", "max_norm", "clip_value", "ema",
                                       "zero_grad", NULL};
    lucid_lua_check_nargs(L, 2);
    optim_box *b = check_optim(L, 1);
    if (lua_isnoneornil(L, 2)) {
        lua_settop(L, 1);
        lua_newtable(L);
    }
    if (!lua_istable(L, 2))
        return argerr(L, 2, "opts: expected a table, got %s", tname(L, 2));
    lua_settop(L, 2);
    check_keys(L, 2, 2, keys, "scaler, max_norm, clip_value, ema, zero_grad");
    pbind_check(L, &b->bind, "optimizer");
    lucid_param_inputs *in = lucid_param_block_staging(b->blk->pb);
    lucid_optim_step_opts o;
    memset(&o, 0, sizeof o);
    /* scaler (slot 3) */
    scaler_box *sc = NULL;
    lua_getfield(L, 2, "scaler");
    if (!lua_isnil(L, 3)) {
        sc = luaL_testudata(L, 3, SCALER_MT);
        if (!sc) return argerr(L, 2, "scaler: expected lucid.GradScaler, got %s", tname(L, 3));
        scaler_bind(L, 3, 1);
        o.flags |= LUCID_STEP_SCALER_UPDATE;
        if (sc->enabled && !sc->unscaled) o.flags |= LUCID_STEP_UNSCALE;
    }
    double m;
    if (opt_present_num(L, 2, "max_norm", &m)) {
        if (in->clip_max_norm != (float)m) {
            in->clip_max_norm = (float)m;
            b->blk->dirty = 1;
        }
        o.flags |= LUCID_STEP_CLIP_NORM;
    }
    if (opt_present_num(L, 2, "clip_value", &m)) {
        if (in->clip_value != (float)m) {
            in->clip_value = (float)m;
            b->blk->dirty = 1;
        }
        o.flags |= LUCID_STEP_CLIP_VALUE;
    }
    /* ema (slot 4) */
    ema_box *e = NULL;
    int ema_after = 0;
    lua_getfield(L, 2, "ema");
    if (!lua_isnil(L, 4)) {
        e = luaL_testudata(L, 4, EMA_MT);
        if (!e) return argerr(L, 2, "ema: expected lucid.EMA, got %s", tname(L, 4));
        if (!e->pe) return argerr(L, 2, "ema: freed (or its construction failed)");
        if (ema_fusable(e, b)) {
            o.ema = e->pe;
            o.aux_ema = e->be;
            o.aux = e->bview;
        } else {
            ema_after = 1;
        }
    }
    lua_getfield(L, 2, "zero_grad");
    int zero = 0;
    if (!lua_isnil(L, 5)) {
        if (!lua_isboolean(L, 5))
            return argerr(L, 2, "zero_grad: expected a boolean, got %s", tname(L, 5));
        zero = lua_toboolean(L, 5);
    }
    if (!zero) o.flags |= LUCID_STEP_KEEP_GRADS;
    block_sync(L, b->blk);
    lucid_tensor *p, *g;
    bind_flats(L, &b->bind, &p, &g);
    lucid_ctx *ctx = b->bind.ctx;
    lucid_status st = lucid_optim_step_fused(ctx, b->o, b->blk->pb, p, g, &o);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    if (sc) sc->unscaled = 0;
    if (ema_after) ema_update_run(L, e);
    if (zero) {
        st = lucid_param_set_zero_grad(ctx, b->bind.set);
        if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    }
    return 0;
}

/* ============================================================ schedules */

/* Arguments of the schedule functions: counts are integers in
 * [lo, 2^31-1] (they are C ints), the rest finite numbers. */
#define I31 2147483647
static int sched_int(lua_State *L, int idx, const char *name, int lo) {
    return (int)check_int_range(L, idx, name, lo, I31);
}
static double sched_num(lua_State *L, int idx, const char *name, double lo,
                        double hi) {
    return check_num_range(L, idx, name, lo, hi, 0);
}

/* schedule.accumulate(nbs, batch) -> max(round(nbs/batch), 1) */
static int l_s_accumulate(lua_State *L) {
    lua_pushinteger(L, lucid_sched_accumulate(sched_int(L, 1, "nbs", 1),
                                              sched_int(L, 2, "batch", 1)));
    return 1;
}

/* schedule.weight_decay(wd, batch, accumulate, nbs) -> wd*batch*acc/nbs */
static int l_s_weight_decay(lua_State *L) {
    lua_pushnumber(L, lucid_sched_weight_decay(sched_num(L, 1, "weight_decay", 0, F32_MAX),
                                               sched_int(L, 2, "batch", 1),
                                               sched_int(L, 3, "accumulate", 1),
                                               sched_int(L, 4, "nbs", 1)));
    return 1;
}

/* schedule.warmup_iters(warmup_epochs, epochs, nb) ->
 * round(min(warmup_epochs, max(epochs-1, 0)) * nb) */
static int l_s_warmup_iters(lua_State *L) {
    lua_pushnumber(L, (lua_Number)lucid_sched_warmup_iters(
                          sched_num(L, 1, "warmup_epochs", 0, HUGE_VAL),
                          sched_int(L, 2, "epochs", 0), sched_int(L, 3, "nb", 0)));
    return 1;
}

/* schedule.interp(x, x0, x1, y0, y1) -> numpy.interp(x, [x0,x1], [y0,y1]) */
static int l_s_interp(lua_State *L) {
    double x0 = sched_num(L, 2, "x0", -HUGE_VAL, HUGE_VAL);
    double x1 = sched_num(L, 3, "x1", x0, HUGE_VAL); /* increasing, as numpy needs */
    lua_pushnumber(L, lucid_sched_interp(sched_num(L, 1, "x", -HUGE_VAL, HUGE_VAL), x0, x1,
                                         sched_num(L, 4, "y0", -HUGE_VAL, HUGE_VAL),
                                         sched_num(L, 5, "y1", -HUGE_VAL, HUGE_VAL)));
    return 1;
}

/* schedule.lf(kind, epoch, epochs, lrf) — kind "linear" | "cos" (or a
 * boolean cos_lr): the Ultralytics lr factor of an epoch. */
static int l_s_lf(lua_State *L) {
    int cos_lr;
    if (lua_isboolean(L, 1)) cos_lr = lua_toboolean(L, 1);
    else {
        static const char *const kinds[] = {"linear", "cos", NULL};
        cos_lr = lucid_lua_checkoption(L, 1, NULL, kinds);
    }
    lua_pushnumber(L, lucid_sched_lf(cos_lr, sched_num(L, 2, "epoch", 0, HUGE_VAL),
                                     sched_int(L, 3, "epochs", 1),
                                     sched_num(L, 4, "lrf", 0, F32_MAX)));
    return 1;
}

/* schedule.in_warmup(ni, nw) -> ni <= nw */
static int l_s_in_warmup(lua_State *L) {
    lua_pushboolean(L, lucid_sched_in_warmup(check_int(L, 1, "ni"), check_int(L, 2, "nw")));
    return 1;
}

/* schedule.warmup_accumulate(ni, nw, nbs, batch) ->
 * max(1, round(interp(ni, [0,nw], [1, nbs/batch]))) */
static int l_s_warmup_accumulate(lua_State *L) {
    lua_pushinteger(L, lucid_sched_warmup_accumulate(
                           check_int(L, 1, "ni"), check_int_range(L, 2, "nw", 0, INT64_MAX),
                           sched_int(L, 3, "nbs", 1), sched_int(L, 4, "batch", 1)));
    return 1;
}

/* schedule.warmup_lr(ni, nw, is_bias, warmup_bias_lr, initial_lr, lf) */
static int l_s_warmup_lr(lua_State *L) {
    lua_pushnumber(L, lucid_sched_warmup_lr(check_int(L, 1, "ni"),
                                            check_int_range(L, 2, "nw", 0, INT64_MAX),
                                            lua_toboolean(L, 3),
                                            sched_num(L, 4, "warmup_bias_lr", 0, F32_MAX),
                                            sched_num(L, 5, "initial_lr", 0, F32_MAX),
                                            sched_num(L, 6, "lf", 0, F32_MAX)));
    return 1;
}

/* schedule.warmup_momentum(ni, nw, warmup_momentum, momentum) */
static int l_s_warmup_momentum(lua_State *L) {
    lua_pushnumber(L, lucid_sched_warmup_momentum(check_int(L, 1, "ni"),
                                                  check_int_range(L, 2, "nw", 0, INT64_MAX),
                                                  sched_num(L, 3, "warmup_momentum", 0, 1),
                                                  sched_num(L, 4, "momentum", 0, 1)));
    return 1;
}

/* schedule.auto_optimizer(n_train, batch, nbs, epochs, nc) -> name, lr,
 * momentum (optimizer=auto rule of the reference). */
static int l_s_auto_optimizer(lua_State *L) {
    lucid_optim_kind k;
    double lr, m;
    lucid_sched_auto_optimizer(sched_int(L, 1, "n_train", 0),
                               sched_int(L, 2, "batch", 1), sched_int(L, 3, "nbs", 1),
                               sched_int(L, 4, "epochs", 0), sched_int(L, 5, "nc", 1), &k,
                               &lr, &m);
    lua_pushstring(L, lucid_optim_kind_name(k));
    lua_pushnumber(L, lr);
    lua_pushnumber(L, m);
    return 3;
}

static const luaL_Reg schedule_funcs[] = {
    {"accumulate", l_s_accumulate},
    {"weight_decay", l_s_weight_decay},
    {"warmup_iters", l_s_warmup_iters},
    {"interp", l_s_interp},
    {"lf", l_s_lf},
    {"in_warmup", l_s_in_warmup},
    {"warmup_accumulate", l_s_warmup_accumulate},
    {"warmup_lr", l_s_warmup_lr},
    {"warmup_momentum", l_s_warmup_momentum},
    {"auto_optimizer", l_s_auto_optimizer},
    {NULL, NULL},
};

/* ================================================================== misc */

/* lucid.rng_state([ctx]) -> seed, offset of the context generator (Lua
 * numbers: exact below 2^53). */
static int l_rng_state(lua_State *L) {
    lucid_ctx *ctx = lucid_lua_ctx(L, lua_isnoneornil(L, 1) ? 0 : 1);
    uint64_t seed, off;
    lucid_ctx_rng_get(ctx, &seed, &off);
    lua_pushnumber(L, (lua_Number)seed);
    lua_pushnumber(L, (lua_Number)off);
    return 2;
}

/* lucid.set_rng_state(seed, offset, [ctx]) — restore the generator
 * (resume): the next draw continues exactly where the saved run was. */
static int l_set_rng_state(lua_State *L) {
    int64_t seed = check_int(L, 1, "seed"), off = check_int(L, 2, "offset");
    if (seed < 0) return argerr(L, 1, "seed: expected >= 0");
    if (off < 0) return argerr(L, 2, "offset: expected >= 0");
    lucid_ctx *ctx = lucid_lua_ctx(L, lua_isnoneornil(L, 3) ? 0 : 3);
    lucid_ctx_rng_set(ctx, (uint64_t)seed, (uint64_t)off);
    return 0;
}

/* Test hook of the atomic writer: stall and/or fail at named stages. It
 * runs on the thread that writes (the background checkpoint writer). */
static char fail_stage[16], stall_stage[16];
static int fail_errno;
static double stall_seconds;

static int fail_hook(const char *stage, void *ud) {
    (void)ud;
    if (stall_stage[0] && strcmp(stage, stall_stage) == 0 && stall_seconds > 0) {
        struct timespec ts;
        ts.tv_sec = (time_t)stall_seconds;
        ts.tv_nsec = (long)((stall_seconds - (double)ts.tv_sec) * 1e9);
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    if (fail_stage[0] && strcmp(stage, fail_stage) == 0) {
        errno = fail_errno;
        return 1;
    }
    return 0;
}

static void update_hook(void) {
    lucid_atomic_file_set_fail_hook(fail_stage[0] || stall_stage[0] ? fail_hook : NULL, NULL);
}

static const char *const atomic_stages[] = {"open", "write", "fsync", "rename", NULL};

/* lucid._test.atomic_fail(stage | nil, [errno]) — make every atomic file
 * write fail at "open", "write", "fsync" or "rename" with errno "EIO"
 * (default) or "ENOSPC" (a full disk); process-wide, tests only; nil
 * removes it. Change it only while no write is pending (lucid.io.wait). */
static int l_test_atomic_fail(lua_State *L) {
    if (lua_isnoneornil(L, 1)) {
        fail_stage[0] = '\0';
        update_hook();
        return 0;
    }
    int i = lucid_lua_checkoption(L, 1, NULL, atomic_stages);
    static const char *const errs[] = {"EIO", "ENOSPC", NULL};
    int e = lucid_lua_checkoption(L, 2, "EIO", errs);
    fail_errno = e == 0 ? EIO : ENOSPC;
    snprintf(fail_stage, sizeof fail_stage, "%s", atomic_stages[i]);
    update_hook();
    return 0;
}

/* lucid._test.atomic_stall(stage | nil, [seconds = 0.5]) — make every
 * atomic file write sleep before that stage (a write held in flight, for
 * kill and wait tests); nil removes it. */
static int l_test_atomic_stall(lua_State *L) {
    if (lua_isnoneornil(L, 1)) {
        stall_stage[0] = '\0';
        update_hook();
        return 0;
    }
    int i = lucid_lua_checkoption(L, 1, NULL, atomic_stages);
    stall_seconds = lucid_lua_optnumber(L, 2, 0.5);
    snprintf(stall_stage, sizeof stall_stage, "%s", atomic_stages[i]);
    update_hook();
    return 0;
}

/* ============================================================= register */

static const luaL_Reg optim_funcs[] = {
    {"SGD", l_sgd},
    {"AdamW", l_adamw},
    {"MuSGD", l_musgd},
    {"build", l_build},
    {"ParamBlock", l_block_new},
    {"clip_grad_norm", l_clip_grad_norm},
    {"grad_norm", l_grad_norm},
    {"clip_grad_value", l_clip_grad_value},
    {"last_norm", l_last_norm},
    {NULL, NULL},
};

/* New metatable `name` with __name, __gc, and either a method table as
 * __index or an __index closure over the method table (index != NULL). */
static void def_mt(lua_State *L, const char *name, lua_CFunction gc,
                   const luaL_Reg *methods, lua_CFunction index,
                   lua_CFunction newindex, lua_CFunction tostring) {
    luaL_newmetatable(L, name);
    lua_pushstring(L, name);
    lua_setfield(L, -2, "__name");
    if (gc) {
        lua_pushcfunction(L, gc);
        lua_setfield(L, -2, "__gc");
    }
    if (index) {
        lua_newtable(L);
        if (methods) luaL_setfuncs(L, methods, 0);
        lua_pushcclosure(L, index, 1);
        lua_setfield(L, -2, "__index");
    } else if (methods) {
        lua_newtable(L);
        luaL_setfuncs(L, methods, 0);
        lua_setfield(L, -2, "__index");
    }
    if (newindex) {
        lua_pushcfunction(L, newindex);
        lua_setfield(L, -2, "__newindex");
    }
    if (tostring) {
        lua_pushcfunction(L, tostring);
        lua_setfield(L, -2, "__tostring");
    }
    lua_pop(L, 1);
}

/* Sub-table `name` of the table at idx (created when absent); pushed. */
static void subtable(lua_State *L, int idx, const char *name) {
    lua_getfield(L, idx, name);
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_setfield(L, idx, name);
    }
}

/*
 * Adds lucid.optim (+ .schedule), lucid.EMA, lucid.amp.GradScaler,
 * lucid.rng_state / lucid.set_rng_state (unless already defined) and
 * lucid._test.atomic_fail to the module table on top of the stack.
 */
int lucid_lua_open_optim(lua_State *L) {
    int module = lua_gettop(L);
    def_mt(L, PBLOCK_MT, l_block_gc, block_methods, l_block_index, l_block_newindex, NULL);
    def_mt(L, OPTIM_MT, l_optim_gc, optim_methods, l_optim_index, NULL, l_optim_tostring);
    def_mt(L, GROUP_MT, NULL, NULL, NULL, NULL, l_group_tostring);
    luaL_getmetatable(L, GROUP_MT);
    lua_pushcfunction(L, l_group_index);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_group_newindex);
    lua_setfield(L, -2, "__newindex");
    lua_pop(L, 1);
    def_mt(L, EMA_MT, l_ema_gc, ema_methods, l_ema_index, l_ema_newindex, NULL);
    def_mt(L, SCALER_MT, NULL, scaler_methods, NULL, NULL, NULL);
    def_mt(L, CLIPST_MT, l_clip_gc, NULL, NULL, NULL, NULL);

    /* weak-keyed cache ParamSet userdata -> ClipState */
    lua_getfield(L, LUA_REGISTRYINDEX, CLIP_CACHE_KEY);
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_createtable(L, 0, 1);
        lua_pushliteral(L, "k");
        lua_setfield(L, -2, "__mode");
        lua_setmetatable(L, -2);
        lua_setfield(L, LUA_REGISTRYINDEX, CLIP_CACHE_KEY);
    } else {
        lua_pop(L, 1);
    }

    subtable(L, module, "optim");
    luaL_setfuncs(L, optim_funcs, 0);
    subtable(L, lua_gettop(L), "schedule");
    luaL_setfuncs(L, schedule_funcs, 0);
    lua_settop(L, module);

    lua_pushcfunction(L, l_ema_new);
    lua_setfield(L, module, "EMA");
    subtable(L, module, "amp");
    lua_pushcfunction(L, l_scaler_new);
    lua_setfield(L, -2, "GradScaler");
    lua_settop(L, module);

    lua_getfield(L, module, "rng_state");
    if (lua_isnil(L, -1)) {
        lua_pushcfunction(L, l_rng_state);
        lua_setfield(L, module, "rng_state");
    }
    lua_getfield(L, module, "set_rng_state");
    if (lua_isnil(L, -1)) {
        lua_pushcfunction(L, l_set_rng_state);
        lua_setfield(L, module, "set_rng_state");
    }
    lua_settop(L, module);
    subtable(L, module, "_test");
    lua_pushcfunction(L, l_test_atomic_fail);
    lua_setfield(L, -2, "atomic_fail");
    lua_pushcfunction(L, l_test_atomic_stall);
    lua_setfield(L, -2, "atomic_stall");
    lua_settop(L, module);
    return 0;
}
