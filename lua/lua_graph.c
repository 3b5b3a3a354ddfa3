/*
 * lua_graph.c — lucid.graph: the Lua binding of engine/train/graph.h (CUDA
 * graph capture and replay, events, recording references). The recorded
 * training step built on it is lua/lucid/recorded_step.lua (docs/STEP.md).
 *
 *   lucid.graph.available([ctx]) -> boolean (a CUDA context that can capture)
 *   lucid.graph.capture_begin([ctx])
 *   lucid.graph.capture_end([ctx]) -> Graph        (instantiate)
 *   lucid.graph.capture_discard([ctx])             (end + drop; failure path)
 *   lucid.graph.capturing([ctx]) -> boolean
 *   Graph: g:launch(), g:free() (also __gc)
 *   lucid.graph.Event([ctx]) -> Event: e:record(), e:synchronize(), e:free()
 *   lucid.graph.Refs(paramset, {cmodule, ...}) -> Refs
 *     r:check() -> nil | reason, full, fast, params, modules
 *                  (nil: unchanged; fast: answered from the two counters
 *                   below and the watched block inputs alone; full: the
 *                   engine's check ran instead — every module's mode
 *                   compared with the recorded one — and what it found
 *                   had moved: params, the set's version (the entries
 *                   were compared field by field); modules, the version
 *                   of one of the recorded modules)
 *     r:watch(block, "ema" | "ns_bf16")  (compare these inputs of a
 *                  lucid.ParamBlock's staging at every check, from their
 *                  values now: EMA decay/tau, the MuSGD Newton-Schulz
 *                  precision; the block is kept alive)
 *     r:restore() -> n                  (recorded module buffers reinstalled)
 *     r:counts() -> nmodules, nparams;  r:free() (also __gc)
 *   lucid.graph._test_replace_param(paramset, name)   (tests only: replace
 *     the entry's data tensor by a fresh copy, as a host program could)
 *   lucid.graph.module_epoch() -> n, on  (the counter below; on: cheap path)
 *   lucid.graph.bump_epoch()      (move it: Model:bump_version and
 *                                  Model:train/eval do, see below)
 *   lucid.graph.clock() -> seconds (CLOCK_MONOTONIC, for the µs timings)
 *   lucid.graph.pinned(shape, dtype, [ctx]) -> Tensor (page-locked CPU
 *     memory on a CUDA context: fixed staging buffers)
 *
 * A ParamSet / CModule userdata is read through the same layout lua_nn.c
 * gives it ({set, ctx} / {module, ctx}; lua_optim.c mirrors it the same way).
 *
 * The cheap path of r:check() (docs/STEP.md, "Contract"): it answers
 * "unchanged" from two integers — the parameter set's version and a
 * process-wide module epoch — and the watched parameter-block inputs
 * (r:watch), without touching any module. The epoch moves
 * whenever a C module's version moves (mode, need_grad_input); the only
 * callers of lucid_module_set_training / lucid_module_set_need_grad_input
 * are the CModule methods train / eval / need_grad_input of lua_nn.c, which
 * lucid_lua_open_graph wraps (the wrapper compares m->version before and
 * after). When a counter moved, the engine's lucid_graph_refs_check runs
 * (every module's mode compared with the recorded one; the parameter
 * entries field by field when the set's version moved). If the methods
 * cannot be wrapped (their registration changed), the cheap path is off and
 * every check is the engine's. Lua code whose change a recording must see
 * moves the epoch too (lucid.graph.bump_epoch: Model:bump_version,
 * replace_forward, and Model:train/eval when the mode changes), so that a
 * recorded step's cheap path can leave the model's own counters to the
 * slow path (lua/lucid/recorded_step.lua). The natural home of this epoch is
 * engine/nn/module.c (bumped inside the two setters); until it moves there,
 * a C caller of those setters outside lua_nn.c must bump it too.
 * Errors: engine failures raise "lucid <status>: <message>".
 */
#include "lua_common.h"
#include "nn/nn.h"
#include "train/graph.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GRAPH_MT "lucid.Graph"
#define EVENT_MT "lucid.Event"
#define REFS_MT "lucid.GraphRefs"
#define PARAMSET_MT "lucid.ParamSet"
#define CMODULE_MT "lucid.CModule"
#define PBLOCK_MT "lucid.ParamBlock"

typedef struct { lucid_param_set *s; lucid_ctx *ctx; } set_mirror;
typedef struct { lucid_module *m; lucid_ctx *ctx; } module_mirror;
/* lua_optim.c's ParamBlock userdata (block_box), mirrored the same way. */
typedef struct { lucid_param_block *pb; lucid_ctx *ctx; int dirty; } block_mirror;

typedef struct { lucid_graph *g; lucid_ctx *ctx; } graph_box;
typedef struct { lucid_event *e; lucid_ctx *ctx; } event_box;
/* r: the engine's reference set. set: its parameter set (held through r).
 * set_version / module_epoch: the counters at the last check that found
 * nothing changed (fast: 1 once such a check ran). */
typedef struct {
    lucid_graph_refs *r;
    lucid_param_set *set;
    lucid_ctx *ctx;           /* one reference: errors of r:watch */
    uint64_t set_version, module_epoch;
    int fast;
} refs_box;

/* The module epoch (see the file comment). */
static _Atomic uint64_t g_module_epoch = 1;
/* 1 while every mode setter reachable from Lua is wrapped; 0 turns the
 * cheap path off (once off in any Lua state, off for good). */
static _Atomic int g_epoch_ok = 0, g_epoch_broken = 0;

static uint64_t module_epoch(void) {
    return atomic_load_explicit(&g_module_epoch, memory_order_relaxed);
}

static lucid_ctx *opt_ctx(lua_State *L, int idx) {
    return lucid_lua_ctx(L, lua_isnoneornil(L, idx) ? 0 : idx);
}

static int l_available(lua_State *L) {
    lua_pushboolean(L, lucid_ctx_graphs_available(opt_ctx(L, 1)));
    return 1;
}

static int l_capture_begin(lua_State *L) {
    lucid_ctx *ctx = opt_ctx(L, 1);
    lucid_status st = lucid_ctx_capture_begin(ctx);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    return 0;
}

static int l_capture_end(lua_State *L) {
    lucid_ctx *ctx = opt_ctx(L, 1);
    graph_box *b = lua_newuserdata(L, sizeof *b);
    b->g = NULL;
    b->ctx = NULL;
    luaL_getmetatable(L, GRAPH_MT);
    lua_setmetatable(L, -2);
    lucid_status st = lucid_ctx_capture_end(ctx, &b->g);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    lucid_ctx_retain(ctx);
    b->ctx = ctx;
    return 1;
}

static int l_capture_discard(lua_State *L) {
    lucid_ctx *ctx = opt_ctx(L, 1);
    lucid_status st = lucid_ctx_capture_end(ctx, NULL);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    return 0;
}

static int l_capturing(lua_State *L) {
    lua_pushboolean(L, lucid_ctx_capturing(opt_ctx(L, 1)));
    return 1;
}

static int l_clock(lua_State *L) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    lua_pushnumber(L, (lua_Number)ts.tv_sec + 1e-9 * (lua_Number)ts.tv_nsec);
    return 1;
}

/* ------------------------------------------------------------------ Graph */

static graph_box *check_graph(lua_State *L, int idx) {
    graph_box *b = lucid_lua_checkudata(L, idx, GRAPH_MT);
    if (!b->g) lucid_lua_argerror(L, idx, "graph was freed");
    return b;
}

static int l_graph_launch(lua_State *L) {
    graph_box *b = check_graph(L, 1);
    lucid_status st = lucid_graph_launch(b->ctx, b->g);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->ctx, st);
    return 0;
}

static int l_graph_free(lua_State *L) {
    graph_box *b = lucid_lua_checkudata(L, 1, GRAPH_MT);
    lucid_graph_destroy(b->g);
    b->g = NULL;
    if (b->ctx) lucid_ctx_release(b->ctx);
    b->ctx = NULL;
    return 0;
}

static int l_graph_tostring(lua_State *L) {
    graph_box *b = lucid_lua_checkudata(L, 1, GRAPH_MT);
    lua_pushstring(L, b->g ? "lucid.Graph" : "lucid.Graph (freed)");
    return 1;
}

/* ------------------------------------------------------------------ Event */

static int l_event_new(lua_State *L) {
    lucid_ctx *ctx = opt_ctx(L, 1);
    event_box *b = lua_newuserdata(L, sizeof *b);
    b->e = NULL;
    b->ctx = NULL;
    luaL_getmetatable(L, EVENT_MT);
    lua_setmetatable(L, -2);
    lucid_status st = lucid_event_create(ctx, &b->e);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    lucid_ctx_retain(ctx);
    b->ctx = ctx;
    return 1;
}

static event_box *check_event(lua_State *L, int idx) {
    event_box *b = lucid_lua_checkudata(L, idx, EVENT_MT);
    if (!b->e) lucid_lua_argerror(L, idx, "event was freed");
    return b;
}

static int l_event_record(lua_State *L) {
    event_box *b = check_event(L, 1);
    lucid_status st = lucid_event_record(b->e);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->ctx, st);
    return 0;
}

static int l_event_synchronize(lua_State *L) {
    event_box *b = check_event(L, 1);
    lucid_status st = lucid_event_synchronize(b->e);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->ctx, st);
    return 0;
}

static int l_event_free(lua_State *L) {
    event_box *b = lucid_lua_checkudata(L, 1, EVENT_MT);
    lucid_event_destroy(b->e);
    b->e = NULL;
    if (b->ctx) lucid_ctx_release(b->ctx);
    b->ctx = NULL;
    return 0;
}

/* ------------------------------------------------------------------- Refs */

static lucid_param_set *check_set(lua_State *L, int idx) {
    set_mirror *sb = lucid_lua_checkudata(L, idx, PARAMSET_MT);
    if (!sb->s) lucid_lua_argerror(L, idx, "parameter set was freed");
    return sb->s;
}

static int l_refs_new(lua_State *L) {
    lucid_param_set *set = lua_isnoneornil(L, 1) ? NULL : check_set(L, 1);
    lucid_lua_checktype(L, 2, LUA_TTABLE);
    int n = (int)lua_objlen(L, 2);
    lucid_module **mods = calloc((size_t)(n ? n : 1), sizeof *mods);
    if (!mods) return luaL_error(L, "lucid oom: graph refs: out of host memory");
    lucid_ctx *ctx = NULL;
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 2, i + 1);
        module_mirror *mb = luaL_testudata(L, -1, CMODULE_MT);
        if (!mb || !mb->m) {
            free(mods);
            return lucid_lua_argerror(L, 2, lua_pushfstring(L, "modules[%d]: expected a live lucid.CModule",
                                                       i + 1));
        }
        mods[i] = mb->m;
        if (!ctx) ctx = mb->ctx;
        lua_pop(L, 1);
    }
    if (set) ctx = ((set_mirror *)lua_touserdata(L, 1))->ctx;
    if (!ctx) ctx = lucid_lua_ctx(L, 0);
    refs_box *b = lua_newuserdata(L, sizeof *b);
    memset(b, 0, sizeof *b);
    luaL_getmetatable(L, REFS_MT);
    lua_setmetatable(L, -2);
    uint64_t epoch = module_epoch();
    lucid_status st = lucid_graph_refs_create(ctx, set, n, mods, &b->r);
    free(mods);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    b->set = set;
    lucid_ctx_retain(ctx);
    b->ctx = ctx;
    b->set_version = set ? lucid_param_set_version(set) : 0;
    b->module_epoch = epoch;
    b->fast = 1; /* the create snapshot is a check that found nothing changed */
    return 1;
}

/* The methods of Refs are closures over the metatable (upvalue 1): the
 * type check compares metatables, without the registry lookup of
 * lucid_lua_checkudata (r:check runs before every replay). */
static refs_box *check_refs(lua_State *L, int idx) {
    refs_box *b = lua_touserdata(L, idx);
    int ok = b && lua_getmetatable(L, idx);
    if (ok) {
        ok = lua_rawequal(L, -1, lua_upvalueindex(1));
        lua_pop(L, 1);
    }
    /* not a refs object: the checker of lua_args.c raises the named error */
    if (!ok) b = lucid_lua_checkudata(L, idx, REFS_MT);
    if (!b->r) lucid_lua_argerror(L, idx, "graph refs were freed");
    return b;
}

static int l_refs_check(lua_State *L) {
    refs_box *b = check_refs(L, 1);
    uint64_t epoch = module_epoch();
    uint64_t sv = b->set ? lucid_param_set_version(b->set) : 0;
    char why[512];
    if (b->fast && atomic_load_explicit(&g_epoch_ok, memory_order_relaxed) &&
        epoch == b->module_epoch && sv == b->set_version) {
        if (lucid_graph_refs_check_watched(b->r, why, sizeof why)) {
            b->fast = 0;
            lua_pushstring(L, why);
        } else {
            lua_pushnil(L);
        }
        lua_pushboolean(L, 0);
        lua_pushboolean(L, 1);
        lua_pushboolean(L, 0);
        lua_pushboolean(L, 0);
        return 5;
    }
    int moved = 0;
    if (lucid_graph_refs_check(b->r, why, sizeof why, &moved)) {
        b->fast = 0;
        lua_pushstring(L, why);
    } else {
        /* nothing this recording depends on changed: the counters read
         * before the check become the new cheap-path snapshot */
        b->set_version = sv;
        b->module_epoch = epoch;
        b->fast = 1;
        lua_pushnil(L);
    }
    lua_pushboolean(L, 1);
    lua_pushboolean(L, 0);
    lua_pushboolean(L, moved & LUCID_GRAPH_MOVED_PARAMS);
    lua_pushboolean(L, moved & LUCID_GRAPH_MOVED_MODULES);
    return 5;
}

/* r:watch(block, "ema" | "ns_bf16") (see the file comment). */
static int l_refs_watch(lua_State *L) {
    static const char *const names[] = {"ema", "ns_bf16", NULL};
    static const unsigned bits[] = {LUCID_GRAPH_WATCH_EMA, LUCID_GRAPH_WATCH_NS_BF16};
    refs_box *b = check_refs(L, 1);
    block_mirror *bb = lucid_lua_checkudata(L, 2, PBLOCK_MT);
    if (!bb->pb) return lucid_lua_argerror(L, 2, "parameter block was freed");
    int w = lucid_lua_checkoption(L, 3, NULL, names);
    lucid_status st = lucid_graph_refs_watch_block(b->ctx, b->r, bb->pb, bits[w]);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->ctx, st);
    return 0;
}

static int l_refs_restore(lua_State *L) {
    lua_pushinteger(L, lucid_graph_refs_restore(check_refs(L, 1)->r));
    return 1;
}

static int l_refs_counts(lua_State *L) {
    refs_box *b = check_refs(L, 1);
    lua_pushinteger(L, lucid_graph_refs_nmodules(b->r));
    lua_pushinteger(L, lucid_graph_refs_nparams(b->r));
    return 2;
}

static int l_refs_free(lua_State *L) {
    refs_box *b = lucid_lua_checkudata(L, 1, REFS_MT);
    lucid_graph_refs_release(b->r);
    b->r = NULL;
    b->set = NULL;
    if (b->ctx) lucid_ctx_release(b->ctx);
    b->ctx = NULL;
    b->fast = 0;
    return 0;
}

/* Tests only: give entry `name` a new data tensor (a fresh storage holding
 * the same values) and bump its version, as a host program replacing a
 * parameter would. */
static int l_test_replace_param(lua_State *L) {
    set_mirror *sb = lucid_lua_checkudata(L, 1, PARAMSET_MT);
    const char *name = lucid_lua_checkstring(L, 2);
    if (!sb->s) return lucid_lua_argerror(L, 1, "parameter set was freed");
    lucid_param *p = lucid_param_set_find(sb->s, name);
    if (!p || !p->data) return lucid_lua_argerror(L, 2, "no such materialized entry");
    lucid_tensor *t = NULL;
    lucid_status st = lucid_tensor_clone(sb->ctx, p->data, &t);
    if (st != LUCID_OK) return lucid_lua_raise(L, sb->ctx, st);
    lucid_tensor_release(p->data);
    p->data = t;
    lucid_param_bump_version(sb->s, p);
    return 0;
}

/* lucid.graph.pinned(shape, dtype, [ctx]) -> Tensor: a contiguous CPU tensor
 * in page-locked memory when ctx drives a CUDA device (ordinary memory
 * otherwise): the fixed staging buffers of a recorded step. */
static int l_pinned(lua_State *L) {
    int64_t shape[LUCID_MAX_DIMS];
    int ndim = lucid_lua_check_shape(L, 1, shape, "shape");
    lucid_dtype dt;
    if (lucid_dtype_parse(lucid_lua_checkstring(L, 2), &dt) != 0)
        return lucid_lua_argerror(L, 2, "dtype: unknown name");
    lucid_ctx *ctx = opt_ctx(L, 3);
    int pinned = lucid_ctx_device(ctx).type == LUCID_CUDA;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_storage *s = NULL;
    size_t nbytes = (size_t)(n ? n : 1) * lucid_dtype_size(dt);
    lucid_status st = lucid_storage_create(ctx, cpu, nbytes, pinned, &s);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    lucid_tensor *t = NULL;
    st = lucid_tensor_from_storage(ctx, s, dt, ndim, shape, NULL, 0, &t);
    lucid_storage_release(s);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    lucid_lua_push_tensor(L, t);
    return 1;
}

/* ------------------------------------------------------------ module epoch */

/* Wrapper of a CModule mode setter (upvalue 1: the original C function):
 * calls it and moves the module epoch when the module's version moved. */
static int l_module_mode_hook(lua_State *L) {
    module_mirror *mb = luaL_testudata(L, 1, CMODULE_MT);
    lucid_module *m = mb ? mb->m : NULL;
    uint64_t v = m ? m->version : 0;
    int n = lua_gettop(L);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, n, LUA_MULTRET);
    if (!m || m->version != v)
        atomic_fetch_add_explicit(&g_module_epoch, 1, memory_order_relaxed);
    return lua_gettop(L);
}

/* Wrap train / eval / need_grad_input in the CModule method table (the
 * upvalue of its __index closure, or __index itself when a table). */
static void hook_module_modes(lua_State *L) {
    static const char *const names[] = {"train", "eval", "need_grad_input"};
    int ok = 0;
    int top = lua_gettop(L);
    luaL_getmetatable(L, CMODULE_MT);
    if (lua_istable(L, -1)) {
        lua_getfield(L, -1, "__index");
        if (lua_iscfunction(L, -1)) {
            if (!lua_getupvalue(L, -1, 1)) lua_pushnil(L);
        } else {
            lua_pushvalue(L, -1);
        }
        if (lua_istable(L, -1)) {
            ok = 1;
            for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
                lua_getfield(L, -1, names[i]);
                if (lua_tocfunction(L, -1) == l_module_mode_hook) { /* opened twice */
                    lua_pop(L, 1);
                    continue;
                }
                if (!lua_iscfunction(L, -1)) {
                    ok = 0;
                    lua_pop(L, 1);
                    continue;
                }
                lua_pushcclosure(L, l_module_mode_hook, 1);
                lua_setfield(L, -2, names[i]);
            }
        }
    }
    lua_settop(L, top);
    if (!ok) atomic_store(&g_epoch_broken, 1);
    atomic_store(&g_epoch_ok, !atomic_load(&g_epoch_broken));
}

/* lucid.graph.bump_epoch(): move the module epoch (see the file comment). */
static int l_bump_epoch(lua_State *L) {
    (void)L;
    atomic_fetch_add_explicit(&g_module_epoch, 1, memory_order_relaxed);
    return 0;
}

/* lucid.graph.module_epoch() -> integer, fast_path -> boolean (tests). */
static int l_module_epoch(lua_State *L) {
    lua_pushnumber(L, (lua_Number)module_epoch());
    lua_pushboolean(L, atomic_load(&g_epoch_ok));
    return 2;
}

/* ---------------------------------------------------------------- register */

/* A metatable `name` with __index = methods; mt_upvalue: every method is
 * a closure over the metatable (check_refs). */
static void new_mt(lua_State *L, const char *name, const luaL_Reg *methods,
                   lua_CFunction gc, lua_CFunction tostring, int mt_upvalue) {
    if (luaL_newmetatable(L, name)) {
        lua_pushstring(L, name);
        lua_setfield(L, -2, "__name");
        lua_newtable(L);
        if (mt_upvalue) {
            lua_pushvalue(L, -2);
            luaL_openlib(L, NULL, methods, 1);
        } else {
            luaL_register(L, NULL, methods);
        }
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, gc);
        lua_setfield(L, -2, "__gc");
        if (tostring) {
            lua_pushcfunction(L, tostring);
            lua_setfield(L, -2, "__tostring");
        }
    }
    lua_pop(L, 1);
}

static const luaL_Reg graph_methods[] = {
    {"launch", l_graph_launch}, {"free", l_graph_free}, {NULL, NULL}};
static const luaL_Reg event_methods[] = {
    {"record", l_event_record}, {"synchronize", l_event_synchronize},
    {"free", l_event_free}, {NULL, NULL}};
static const luaL_Reg refs_methods[] = {
    {"check", l_refs_check}, {"watch", l_refs_watch}, {"restore", l_refs_restore},
    {"counts", l_refs_counts}, {"free", l_refs_free}, {NULL, NULL}};
static const luaL_Reg graph_funcs[] = {
    {"available", l_available},
    {"capture_begin", l_capture_begin},
    {"capture_end", l_capture_end},
    {"capture_discard", l_capture_discard},
    {"capturing", l_capturing},
    {"Event", l_event_new},
    {"Refs", l_refs_new},
    {"clock", l_clock},
    {"pinned", l_pinned},
    {"_test_replace_param", l_test_replace_param},
    {"module_epoch", l_module_epoch},
    {"bump_epoch", l_bump_epoch},
    {NULL, NULL}};

/* Registers lucid.graph into the module table at the top of the stack. */
int lucid_lua_open_graph(lua_State *L) {
    new_mt(L, GRAPH_MT, graph_methods, l_graph_free, l_graph_tostring, 0);
    new_mt(L, EVENT_MT, event_methods, l_event_free, NULL, 0);
    new_mt(L, REFS_MT, refs_methods, l_refs_free, NULL, 1);
    hook_module_modes(L);
    lua_newtable(L);
    luaL_register(L, NULL, graph_funcs);
    lua_setfield(L, -2, "graph");
    return 0;
}
