/*
 * lua_context.c — the Context userdata and the module-level device and
 * memory functions of the Lua binding.
 *
 * A Context owns a device, its streams and library handles, the allocator
 * and the random generator (engine/lucid.h). The userdata holds one
 * reference; every storage created through it holds another, so tensors keep
 * their context alive after ctx:free() or collection. Module-level functions
 * act on the default context of this lua_State (registry, device "auto").
 */
#include "lua_common.h"

#include <string.h>

/* The live context of the Context userdata at idx; raises when idx holds
 * something else or a freed context. */
static lucid_ctx *check_ctx(lua_State *L, int idx) {
    lucid_ctx **box = luaL_testudata(L, idx, LUCID_LUA_CONTEXT_MT);
    if (!box)
        lucid_lua_argerror(L, idx,
                      lua_pushfstring(L, "expected lucid.Context, got %s",
                                      luaL_typename(L, idx)));
    if (!*box) lucid_lua_argerror(L, idx, "context was freed");
    return *box;
}

static void push_device(lua_State *L, lucid_device d) {
    if (d.type == LUCID_CPU)
        lua_pushliteral(L, "cpu");
    else
        lua_pushfstring(L, "cuda:%d", d.index);
}

/* Device named by the optional string at idx, else def. */
static lucid_device opt_device_arg(lua_State *L, int idx, lucid_device def) {
    if (lua_isnoneornil(L, idx)) return def;
    const char *name = lucid_lua_checkstring(L, idx);
    lucid_device d;
    if (lucid_device_parse(name, &d) != 0)
        lucid_lua_argerror(L, idx,
                      lua_pushfstring(L, "unknown device '%s' (expected cpu, "
                                         "cuda, cuda:N or auto)",
                                      name));
    return d;
}

/* Seed from a Lua number: a non-negative integer below 2^53. */
static uint64_t check_seed(lua_State *L, int idx, const char *what) {
    lua_Number x = lucid_lua_checknumber(L, idx);
    if (!(x >= 0 && x < 9007199254740992.0 && x == (lua_Number)(uint64_t)x))
        lucid_lua_argerror(L, idx,
                      lua_pushfstring(L, "%s: expected a non-negative integer, "
                                         "got %s",
                                      what, lua_tostring(L, idx)));
    return (uint64_t)x;
}

static void push_stats(lua_State *L, const lucid_memory_stats *st) {
    lua_createtable(L, 0, 6);
#define FIELD(name)                                                           \
    lua_pushnumber(L, (lua_Number)st->name);                                  \
    lua_setfield(L, -2, #name)
    FIELD(allocated);
    FIELD(reserved);
    FIELD(peak_allocated);
    FIELD(peak_reserved);
    FIELD(num_allocs);
    FIELD(num_device_allocs);
#undef FIELD
}

/* ----------------------------------------------------------- constructor */

/*
 * lucid.Context{device = "cpu"|"cuda"|"cuda:N"|"auto", seed = 0, threads = 0}
 *   Creates a context. All fields are optional (device defaults to "cpu").
 *   Errors: unknown keys or devices (bad argument #1), a CUDA device in a
 *   CPU-only build or one that is not present ("lucid unsupported: ...").
 */
static int l_context_new(lua_State *L) {
    lucid_ctx_options opt = lucid_ctx_options_default();
    if (!lua_isnoneornil(L, 1)) {
        lucid_lua_checktype(L, 1, LUA_TTABLE);
        lua_pushnil(L);
        while (lua_next(L, 1)) {
            const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
            if (!k || (strcmp(k, "device") && strcmp(k, "seed") &&
                       strcmp(k, "threads")))
                lucid_lua_argerror(L, 1,
                              lua_pushfstring(L, "unknown option '%s' (expected "
                                                 "device, seed, threads)",
                                              k ? k : luaL_typename(L, -2)));
            lua_pop(L, 1);
        }
        opt.device = lucid_lua_opt_device(L, 1, "device", opt.device);
        lua_getfield(L, 1, "seed");
        if (!lua_isnil(L, -1)) opt.seed = check_seed(L, lua_gettop(L), "seed");
        lua_pop(L, 1);
        lua_getfield(L, 1, "threads");
        if (!lua_isnil(L, -1)) {
            lua_Integer n = lucid_lua_checkinteger(L, -1);
            if (n < 0) lucid_lua_argerror(L, 1, "threads: expected >= 0");
            opt.cpu_threads = (int)n;
        }
        lua_pop(L, 1);
    }
    lucid_ctx **box = lua_newuserdata(L, sizeof *box);
    *box = NULL;
    luaL_getmetatable(L, LUCID_LUA_CONTEXT_MT);
    lua_setmetatable(L, -2);
    char err[512];
    lucid_status s = lucid_ctx_create(&opt, box, err, sizeof err);
    if (s != LUCID_OK)
        return luaL_error(L, "lucid %s: %s", lucid_status_name(s), err);
    return 1;
}

/* ---------------------------------------------------------------- methods */

/* ctx:device() -> "cpu" | "cuda:N" */
static int l_ctx_device(lua_State *L) {
    push_device(L, lucid_ctx_device(check_ctx(L, 1)));
    return 1;
}

/* ctx:grad_lane([on]) -> boolean: the parameter-gradient lane's state
 * before the call; with a boolean argument, turns it on or off (off joins:
 * the compute stream then waits for the lane's work). See
 * lucid_ctx_set_grad_lane (engine/lucid.h): while it is on, Conv2d weight and
 * bias gradients are written asynchronously on a second CUDA stream, so
 * reading them before turning it off is a race. On the CPU the flag is
 * kept and reported, and nothing forks.
 * Errors: a non-boolean argument; the join's CUDA error. */
static int l_ctx_grad_lane(lua_State *L) {
    lucid_ctx *ctx = check_ctx(L, 1);
    int was = lucid_ctx_grad_lane(ctx);
    if (!lua_isnoneornil(L, 2)) {
        lucid_lua_checktype(L, 2, LUA_TBOOLEAN);
        lucid_lua_check_nargs(L, 2);
        lucid_status s = lucid_ctx_set_grad_lane(ctx, lua_toboolean(L, 2));
        if (s != LUCID_OK) return lucid_lua_raise(L, ctx, s);
    }
    lua_pushboolean(L, was);
    return 1;
}

/* ctx:branch_fork(b) -> boolean: the ops that follow, until
 * ctx:branch_return(), queue on branch lane b (an integer 1..3) of the
 * context's device; false when they stay where they were (CPU context,
 * LUCID_BRANCH_LANES=0, lane b already open, or first use inside a graph
 * capture). ctx:branch_join([b]) makes the current stream wait for lane b
 * (all branch lanes without b). See lucid_ctx_branch_fork (engine/lucid.h)
 * and lucid.nn.lanes (lua/lucid/nn/lanes.lua), which pairs them safely.
 * Errors: b out of range; joining an open lane; CUDA errors. */
/* Argument idx: a whole number in lo..hi (what names it in the error). */
static int check_whole(lua_State *L, int idx, int lo, int hi, const char *what) {
    lua_Number v = lucid_lua_checknumber(L, idx);
    if (!(v >= lo && v <= hi && v == (lua_Number)(int)v))
        lucid_lua_argerror(L, idx, lua_pushfstring(L, "expected %s %d..%d, got %s", what, lo, hi,
                                                   lua_tostring(L, idx)));
    return (int)v;
}

static int l_ctx_branch_fork(lua_State *L) {
    lucid_ctx *ctx = check_ctx(L, 1);
    int b = check_whole(L, 2, 1, LUCID_BRANCHES, "a branch");
    lucid_lua_check_nargs(L, 2);
    int forked = 0;
    lucid_status s = lucid_ctx_branch_fork(ctx, (int)b, &forked);
    if (s != LUCID_OK) return lucid_lua_raise(L, ctx, s);
    lua_pushboolean(L, forked);
    return 1;
}

/* ctx:branch_return(): closes the innermost fork that returned true. */
static int l_ctx_branch_return(lua_State *L) {
    lucid_ctx *ctx = check_ctx(L, 1);
    lucid_lua_check_nargs(L, 1);
    lucid_ctx_branch_return(ctx);
    return 0;
}

/* ctx:branch_join([b]) (see ctx:branch_fork). */
static int l_ctx_branch_join(lua_State *L) {
    lucid_ctx *ctx = check_ctx(L, 1);
    int b = lua_isnoneornil(L, 2) ? -1 : check_whole(L, 2, 1, LUCID_BRANCHES, "a branch");
    lucid_lua_check_nargs(L, 2);
    lucid_status s = lucid_ctx_branch_join(ctx, (int)b);
    if (s != LUCID_OK) return lucid_lua_raise(L, ctx, s);
    return 0;
}

/* ctx:branch_mark(b, m) / ctx:branch_wait(b, m): a join in two halves
 * (lucid_ctx_branch_mark / _wait, engine/lucid.h): mark slot m (1..4) of
 * branch b (1..3) records b's position (inside b's open fork; else a
 * no-op); wait makes the current stream wait for it once. */
static int branch_mark_or_wait(lua_State *L, int wait) {
    lucid_ctx *ctx = check_ctx(L, 1);
    int b = check_whole(L, 2, 1, LUCID_BRANCHES, "a branch");
    int m = check_whole(L, 3, 1, LUCID_BRANCH_MARKS, "a mark");
    lucid_lua_check_nargs(L, 3);
    lucid_status s = wait ? lucid_ctx_branch_wait(ctx, (int)b, (int)m)
                          : lucid_ctx_branch_mark(ctx, (int)b, (int)m);
    if (s != LUCID_OK) return lucid_lua_raise(L, ctx, s);
    return 0;
}
static int l_ctx_branch_mark(lua_State *L) { return branch_mark_or_wait(L, 0); }
static int l_ctx_branch_wait(lua_State *L) { return branch_mark_or_wait(L, 1); }

/* ctx:synchronize() — waits for all queued work of the context. */
static int l_ctx_synchronize(lua_State *L) {
    lucid_ctx *ctx = check_ctx(L, 1);
    lucid_status s = lucid_ctx_synchronize(ctx);
    if (s != LUCID_OK) return lucid_lua_raise(L, ctx, s);
    return 0;
}

/* ctx:memory_stats([device]) -> {allocated, reserved, peak_allocated,
 *   peak_reserved, num_allocs, num_device_allocs} in bytes/counts, for the
 *   context's device (or the named one: "cpu" counts tensor storage). */
static int l_ctx_memory_stats(lua_State *L) {
    lucid_ctx *ctx = check_ctx(L, 1);
    lucid_device d = opt_device_arg(L, 2, lucid_ctx_device(ctx));
    lucid_memory_stats st;
    lucid_status s = lucid_memory_stats_get(ctx, d, &st);
    if (s != LUCID_OK) return lucid_lua_raise(L, ctx, s);
    push_stats(L, &st);
    return 1;
}

/* ctx:empty_cache() — returns cached, unused device blocks to the driver. */
static int l_ctx_empty_cache(lua_State *L) {
    lucid_ctx *ctx = check_ctx(L, 1);
    lucid_status s = lucid_memory_empty_cache(ctx);
    if (s != LUCID_OK) return lucid_lua_raise(L, ctx, s);
    return 0;
}

/* ctx:manual_seed(n) — reseeds the context's generator (offset 0). */
static int l_ctx_manual_seed(lua_State *L) {
    lucid_ctx *ctx = check_ctx(L, 1);
    lucid_ctx_rng_set(ctx, check_seed(L, 2, "seed"), 0);
    return 0;
}

/* ctx:rng_state() -> seed, offset of the context's generator. */
static int l_ctx_rng_state(lua_State *L) {
    uint64_t seed, off;
    lucid_ctx_rng_get(check_ctx(L, 1), &seed, &off);
    lua_pushnumber(L, (lua_Number)seed);
    lua_pushnumber(L, (lua_Number)off);
    return 2;
}

/* ctx:free() — drops this handle's reference now. Tensors created through
 * the context keep it alive; further calls on the handle raise "context was
 * freed". A second free is a no-op. */
static int l_ctx_free(lua_State *L) {
    lucid_ctx **box = lucid_lua_checkudata(L, 1, LUCID_LUA_CONTEXT_MT);
    if (*box) {
        lucid_ctx_release(*box);
        *box = NULL;
    }
    return 0;
}

/* __gc: safety net; only drops the reference (never calls into Lua). */
static int l_ctx_gc(lua_State *L) { return l_ctx_free(L); }

static int l_ctx_tostring(lua_State *L) {
    lucid_ctx **box = lucid_lua_checkudata(L, 1, LUCID_LUA_CONTEXT_MT);
    if (!*box) {
        lua_pushliteral(L, "lucid.Context(freed)");
        return 1;
    }
    lua_pushliteral(L, "lucid.Context(device=");
    push_device(L, lucid_ctx_device(*box));
    lua_pushliteral(L, ")");
    lua_concat(L, 3);
    return 1;
}

/* --------------------------------------------------------- module level */

/* lucid.default_context() -> Context of this lua_State (device "auto"). */
static int l_default_context(lua_State *L) {
    lucid_lua_ctx(L, 0);
    lua_getfield(L, LUA_REGISTRYINDEX, "lucid.default_ctx");
    return 1;
}

/* lucid.cuda_available() -> boolean */
static int l_cuda_available(lua_State *L) {
    lua_pushboolean(L, lucid_cuda_available());
    return 1;
}

/* lucid.cuda_device_count() -> integer */
static int l_cuda_device_count(lua_State *L) {
    lua_pushinteger(L, lucid_cuda_device_count());
    return 1;
}

/* lucid.memory_stats([device]) — ctx:memory_stats of the default context. */
static int l_memory_stats(lua_State *L) {
    lucid_ctx *ctx = lucid_lua_ctx(L, 0);
    lucid_device d = opt_device_arg(L, 1, lucid_ctx_device(ctx));
    lucid_memory_stats st;
    lucid_status s = lucid_memory_stats_get(ctx, d, &st);
    if (s != LUCID_OK) return lucid_lua_raise(L, ctx, s);
    push_stats(L, &st);
    return 1;
}

/* lucid.empty_cache() — ctx:empty_cache() of the default context. */
static int l_empty_cache(lua_State *L) {
    lucid_ctx *ctx = lucid_lua_ctx(L, 0);
    lucid_status s = lucid_memory_empty_cache(ctx);
    if (s != LUCID_OK) return lucid_lua_raise(L, ctx, s);
    return 0;
}

/* lucid.manual_seed(n) — reseeds the default context's generator. */
static int l_manual_seed(lua_State *L) {
    uint64_t seed = check_seed(L, 1, "seed");
    lucid_ctx_rng_set(lucid_lua_ctx(L, 0), seed, 0);
    return 0;
}

static const luaL_Reg ctx_methods[] = {
    {"device", l_ctx_device},
    {"synchronize", l_ctx_synchronize},
    {"grad_lane", l_ctx_grad_lane},
    {"branch_fork", l_ctx_branch_fork},
    {"branch_return", l_ctx_branch_return},
    {"branch_join", l_ctx_branch_join},
    {"branch_mark", l_ctx_branch_mark},
    {"branch_wait", l_ctx_branch_wait},
    {"memory_stats", l_ctx_memory_stats},
    {"empty_cache", l_ctx_empty_cache},
    {"manual_seed", l_ctx_manual_seed},
    {"rng_state", l_ctx_rng_state},
    {"free", l_ctx_free},
    {NULL, NULL},
};

static const luaL_Reg module_funcs[] = {
    {"Context", l_context_new},
    {"default_context", l_default_context},
    {"cuda_available", l_cuda_available},
    {"cuda_device_count", l_cuda_device_count},
    {"memory_stats", l_memory_stats},
    {"empty_cache", l_empty_cache},
    {"manual_seed", l_manual_seed},
    {NULL, NULL},
};

int lucid_lua_open_context(lua_State *L) {
    luaL_newmetatable(L, LUCID_LUA_CONTEXT_MT);
    lua_pushliteral(L, LUCID_LUA_CONTEXT_MT);
    lua_setfield(L, -2, "__name");
    lua_pushcfunction(L, l_ctx_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, l_ctx_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_newtable(L);
    luaL_setfuncs(L, ctx_methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
    luaL_setfuncs(L, module_funcs, 0);
    return 0;
}
