/*
 * lua_graph.c — lucid.graph: the Lua binding of engine/train/graph.h (CUDA
 * graph capture and replay, events, recording references). The recorded
 * training step built on it is lua/lucid/recorded_step.lua (docs/STEP.md).
 *
 *   lucid.graph.available([ctx]) -> boolean (a CUDA context that can capture)
 *   lucid.graph.capture_begin([ctx], [keep_shadows], [continue])
 *     (keep_shadows true: LUCID_CAPTURE_KEEP_SHADOWS, engine/train/graph.h:
 *     conv weight shadows fresh now are not cast inside; see the protocol
 *     there; continue true: LUCID_CAPTURE_CONTINUE, the graph always runs
 *     right after the last capture's: its conv column caches stay fresh)
 *   lucid.graph.shadows_stale([ctx])  (every conv weight shadow stale:
 *     lucid_ctx_shadows_stale)
 *   lucid.graph.capture_end([ctx]) -> Graph        (instantiate)
 *   lucid.graph.capture_discard([ctx])             (end + drop; failure path)
 *   lucid.graph.capturing([ctx]) -> boolean
 *   Graph: g:launch(), g:keeps_shadows() -> boolean (the capture kept the
 *     conv weight shadows and cast none: lucid_graph_keeps_shadows; the
 *     caller casts them before each launch), g:free() (also __gc)
 *   lucid.graph.Event([ctx]) -> Event: e:record(), e:synchronize(),
 *     e:wait([ctx]) (the compute stream of ctx, default e's own context,
 *     waits for e's last record: lucid_event_wait_on; another context of
 *     the same device orders two contexts' streams), e:record_node() (the
 *     compute stream only, no lane join; inside a capture an external event
 *     node: lucid_event_record_node), e:free()
 *   lucid.graph.side_copy({dst...}, {src...}, [after], [done])  (copies on
 *     the side copy stream, after Event `after`, then `done` recorded:
 *     lucid_side_copy; the recorded step's next-batch upload)
 *   lucid.graph.Refs(paramset, {cmodule, ...}) -> Refs
 *     r:quick() -> boolean  (true: provably unchanged since the last clean
 *                  check: lucid_graph_refs_quick, O(1))
 *     r:guard() -> function g (a closure over r for the recorded step's
 *                  cheap path: g() returns nothing when r:quick() would say
 *                  true, else true; true too once r is freed. No argument
 *                  and no type check to pay: the closure holds r)
 *     r:check([all_entries]) -> nil | reason, params, modes, epoch
 *                  (lucid_graph_refs_check_ex: nil when unchanged, the
 *                   snapshot refreshed; params: the entries were compared
 *                   field by field (the set's version had moved, or
 *                   all_entries); modes: a recorded module's mode differs;
 *                   epoch: the contract epoch had moved)
 *     r:watch(block, "ema" | "ns_bf16")  (compare these inputs of a
 *                  lucid.ParamBlock's staging at every check, from their
 *                  values now: EMA decay/tau, the MuSGD Newton-Schulz
 *                  precision; the block is kept alive)
 *     r:restore() -> n                  (recorded module buffers reinstalled)
 *     r:counts() -> nmodules, nparams;  r:free() (also __gc)
 *   lucid.graph._test_replace_param(paramset, name)   (tests only: replace
 *     the entry's data tensor by a fresh copy, as a host program could)
 *   lucid.graph.contract_epoch() -> n  (engine/nn/nn.h: moves on every
 *     parameter-set version bump and every lucid.graph.bump_epoch)
 *   lucid.graph.bump_epoch()      (move it: what the Lua library announces,
 *     see docs/STEP.md "Contract")
 *   lucid.graph.clock() -> seconds (CLOCK_MONOTONIC, for the µs timings)
 *   lucid.graph.pinned(shape, dtype, [ctx]) -> Tensor (page-locked CPU
 *     memory on a CUDA context: fixed staging buffers)
 *
 * A ParamSet / CModule userdata is read through the same layout lua_nn.c
 * gives it ({set, ctx} / {module, ctx}; lua_optim.c mirrors it the same way).
 *
 * The recorded step's cheap path (docs/STEP.md, "Contract") is one call of
 * r:guard()'s closure: the engine's O(1) quick test (the contract epoch, the
 * exact count of recorded modules out of their recorded mode, the watched
 * block inputs), without touching any module or parameter.
 * Errors: engine failures raise "lucid <status>: <message>".
 */
#include "lua_common.h"
#include "nn/nn.h"
#include "train/graph.h"

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
/* r: the engine's reference set (NULL once freed). */
typedef struct {
    lucid_graph_refs *r;
    lucid_ctx *ctx;           /* one reference: errors of r:watch */
} refs_box;

static lucid_ctx *opt_ctx(lua_State *L, int idx) {
    return lucid_lua_ctx(L, lua_isnoneornil(L, idx) ? 0 : idx);
}

static int l_available(lua_State *L) {
    lua_pushboolean(L, lucid_ctx_graphs_available(opt_ctx(L, 1)));
    return 1;
}

static int l_capture_begin(lua_State *L) {
    lucid_ctx *ctx = opt_ctx(L, 1);
    const unsigned flags = (lua_toboolean(L, 2) ? LUCID_CAPTURE_KEEP_SHADOWS : 0u) |
                           (lua_toboolean(L, 3) ? LUCID_CAPTURE_CONTINUE : 0u);
    lucid_status st = lucid_ctx_capture_begin_ex(ctx, flags);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    return 0;
}

static int l_shadows_stale(lua_State *L) {
    lucid_ctx *ctx = opt_ctx(L, 1);
    lucid_status st = lucid_ctx_shadows_stale(ctx);
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

/* hot: next to the recorded step's guard (l_refs_guard_call) and the
 * engine's quick check, in .text.hot (the check runs with cold caches: one
 * code page for the timed region) */
#if defined(__GNUC__)
__attribute__((hot))
#endif
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

static int l_graph_keeps_shadows(lua_State *L) {
    lua_pushboolean(L, lucid_graph_keeps_shadows(check_graph(L, 1)->g));
    return 1;
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

static int l_event_record_node(lua_State *L) {
    event_box *b = check_event(L, 1);
    lucid_status st = lucid_event_record_node(b->e);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->ctx, st);
    return 0;
}

static int l_event_synchronize(lua_State *L) {
    event_box *b = check_event(L, 1);
    lucid_status st = lucid_event_synchronize(b->e);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->ctx, st);
    return 0;
}

/* e:wait([ctx]): ctx's compute stream (default e's own) waits for e. */
static int l_event_wait(lua_State *L) {
    event_box *b = check_event(L, 1);
    lucid_ctx *waiter = lua_isnoneornil(L, 2) ? b->ctx : lucid_lua_ctx(L, 2);
    lucid_status st = lucid_event_wait_on(b->e, waiter);
    if (st != LUCID_OK) return lucid_lua_raise(L, waiter, st);
    return 0;
}

/* side_copy(dsts, srcs, [after], [done]): lists of equal length (<= 64). */
static int l_side_copy(lua_State *L) {
    lucid_lua_check_nargs(L, 4);
    lucid_lua_checktype(L, 1, LUA_TTABLE);
    lucid_lua_checktype(L, 2, LUA_TTABLE);
    int n = (int)lua_objlen(L, 1);
    lucid_lua_argcheck(L, (int)lua_objlen(L, 2) == n, 2,
                       "expected as many sources as destinations");
    lucid_lua_argcheck(L, n <= 64, 1, "expected at most 64 destinations");
    event_box *after = lua_isnoneornil(L, 3) ? NULL : check_event(L, 3);
    event_box *done = lua_isnoneornil(L, 4) ? NULL : check_event(L, 4);
    lucid_tensor *d[64];
    const lucid_tensor *sp[64];
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 1, i + 1);
        d[i] = lucid_lua_check_tensor(L, -1, "destination");
        lua_rawgeti(L, 2, i + 1);
        sp[i] = lucid_lua_check_tensor(L, -1, "source");
        lua_pop(L, 2);
    }
    lucid_ctx *ctx = n ? lucid_storage_ctx(d[0]->storage) : (after ? after->ctx : NULL);
    if (!ctx) return 0; /* nothing to copy, no event */
    lucid_status st = lucid_side_copy(ctx, n, d, sp, after ? after->e : NULL,
                                      done ? done->e : NULL);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
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
    lucid_status st = lucid_graph_refs_create(ctx, set, n, mods, &b->r);
    free(mods);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    lucid_ctx_retain(ctx);
    b->ctx = ctx;
    return 1;
}

/* The methods of Refs are closures over the metatable (upvalue 1): the
 * type check compares metatables, without the registry lookup of
 * lucid_lua_checkudata. */
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
    int all = lua_toboolean(L, 2);
    char why[512];
    int moved = 0;
    if (lucid_graph_refs_check_ex(b->r, all, why, sizeof why, &moved))
        lua_pushstring(L, why);
    else
        lua_pushnil(L);
    lua_pushboolean(L, moved & LUCID_GRAPH_MOVED_PARAMS);
    lua_pushboolean(L, moved & LUCID_GRAPH_MOVED_MODES);
    lua_pushboolean(L, moved & LUCID_GRAPH_MOVED_EPOCH);
    return 4;
}

static int l_refs_quick(lua_State *L) {
    lua_pushboolean(L, lucid_graph_refs_quick(check_refs(L, 1)->r));
    return 1;
}

/* The closure of r:guard() (upvalue 1: the refs userdata, so no type
 * check): nothing when unchanged, true otherwise. It runs before every
 * replay, with cold caches: one API call, the box, the refs' first line. */
#if defined(__GNUC__)
__attribute__((hot))
#endif
static int l_refs_guard_call(lua_State *L) {
    const refs_box *b = lua_touserdata(L, lua_upvalueindex(1));
    if (b->r && lucid_graph_refs_quick(b->r)) return 0;
    lua_pushboolean(L, 1);
    return 1;
}

static int l_refs_guard(lua_State *L) {
    check_refs(L, 1);
    lua_pushvalue(L, 1);
    lua_pushcclosure(L, l_refs_guard_call, 1);
    return 1;
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
    if (b->ctx) lucid_ctx_release(b->ctx);
    b->ctx = NULL;
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
    lucid_lua_check_shape_size(L, 1, ndim, shape, dt, "shape");
    int64_t n = 1;
    lucid_shape_bytes(ndim, shape, dt, &n, NULL);
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

/* ---------------------------------------------------------- contract epoch */

/* lucid.graph.bump_epoch(): move the contract epoch (see the file comment). */
static int l_bump_epoch(lua_State *L) {
    (void)L;
    lucid_contract_bump();
    return 0;
}

/* lucid.graph.contract_epoch() -> number (tests). */
static int l_contract_epoch(lua_State *L) {
    lua_pushnumber(L, (lua_Number)lucid_contract_epoch());
    return 1;
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
    {"launch", l_graph_launch}, {"keeps_shadows", l_graph_keeps_shadows},
    {"free", l_graph_free}, {NULL, NULL}};
static const luaL_Reg event_methods[] = {
    {"record", l_event_record}, {"record_node", l_event_record_node},
    {"synchronize", l_event_synchronize},
    {"wait", l_event_wait}, {"free", l_event_free}, {NULL, NULL}};
static const luaL_Reg refs_methods[] = {
    {"check", l_refs_check}, {"quick", l_refs_quick}, {"guard", l_refs_guard},
    {"watch", l_refs_watch}, {"restore", l_refs_restore},
    {"counts", l_refs_counts}, {"free", l_refs_free}, {NULL, NULL}};
static const luaL_Reg graph_funcs[] = {
    {"available", l_available},
    {"capture_begin", l_capture_begin},
    {"shadows_stale", l_shadows_stale},
    {"capture_end", l_capture_end},
    {"capture_discard", l_capture_discard},
    {"capturing", l_capturing},
    {"Event", l_event_new},
    {"Refs", l_refs_new},
    {"clock", l_clock},
    {"pinned", l_pinned},
    {"side_copy", l_side_copy},
    {"_test_replace_param", l_test_replace_param},
    {"contract_epoch", l_contract_epoch},
    {"bump_epoch", l_bump_epoch},
    {NULL, NULL}};

/* Registers lucid.graph into the module table at the top of the stack. */
int lucid_lua_open_graph(lua_State *L) {
    new_mt(L, GRAPH_MT, graph_methods, l_graph_free, l_graph_tostring, 0);
    new_mt(L, EVENT_MT, event_methods, l_event_free, NULL, 0);
    new_mt(L, REFS_MT, refs_methods, l_refs_free, NULL, 1);
    lua_newtable(L);
    luaL_register(L, NULL, graph_funcs);
    lua_setfield(L, -2, "graph");
    return 0;
}
