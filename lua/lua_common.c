/*
 * lua_common.c — shared helpers of the Lua binding: userdata checkers and
 * pushers, the per-lua_State default context, option and shape parsing, and
 * the one place that turns an engine status into a Lua error.
 *
 * Userdata layout: a Tensor userdata is one `lucid_tensor *` slot, a Context
 * userdata one `lucid_ctx *` slot, each holding one reference. `:free()`
 * releases the reference and stores NULL; the checkers below refuse a NULL
 * slot ("tensor was freed"), and __gc releases only a non-NULL slot, so a
 * double free is harmless.
 *
 * Error rule (style_anchors Absorb 15): every function here raises only
 * after the caller's C temporaries are released — callers must release them
 * before calling a helper that may raise (lucid_lua_raise, the checkers).
 */
#include "lua_common.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Registry key of the default Context userdata of this lua_State. */
#define DEFAULT_CTX_KEY "lucid.default_ctx"

/* -------------------------------------------------------------- type names */

const char *lucid_lua_type_name(lua_State *L, int idx) {
    if (lua_type(L, idx) == LUA_TUSERDATA && lua_getmetatable(L, idx)) {
        lua_getfield(L, -1, "__name");
        const char *name = lua_tostring(L, -1);
        lua_pop(L, 2);
        /* __name strings live in the metatable, which the registry keeps. */
        if (name) return name;
    }
    return luaL_typename(L, idx);
}

/* ------------------------------------------------------------------ errors */

int lucid_lua_raise(lua_State *L, lucid_ctx *ctx, lucid_status s) {
    luaL_where(L, 1);
    lua_pushfstring(L, "lucid %s: %s", lucid_status_name(s),
                    ctx ? lucid_ctx_error(ctx) : "no context");
    lua_concat(L, 2);
    if (ctx) lucid_ctx_clear_error(ctx);
    return lua_error(L);
}

/* ----------------------------------------------------------------- tensors */

lucid_tensor *lucid_lua_to_tensor(lua_State *L, int idx) {
    lucid_tensor **box = luaL_testudata(L, idx, LUCID_LUA_TENSOR_MT);
    return box ? *box : NULL;
}

lucid_tensor *lucid_lua_check_tensor(lua_State *L, int idx,
                                     const char *argname) {
    lucid_tensor **box = luaL_testudata(L, idx, LUCID_LUA_TENSOR_MT);
    if (!box) {
        const char *msg = lua_pushfstring(L, "%s: expected lucid.Tensor, got %s",
                                          argname, lucid_lua_type_name(L, idx));
        lucid_lua_argerror(L, idx, msg);
        return NULL;
    }
    if (!*box) {
        const char *msg = lua_pushfstring(L, "%s: tensor was freed", argname);
        lucid_lua_argerror(L, idx, msg);
        return NULL;
    }
    return *box;
}

void lucid_lua_push_tensor(lua_State *L, lucid_tensor *t) {
    if (!t) {
        lua_pushnil(L);
        return;
    }
    luaL_getmetatable(L, LUCID_LUA_TENSOR_MT);
    if (lua_isnil(L, -1)) {
        lucid_tensor_release(t);
        luaL_error(L, "lucid: the module is not open in this lua_State "
                      "(call require \"lucid\" before pushing tensors)");
    }
    /* lua_newuserdata raises only when the Lua allocator fails, which
     * leaves the state unusable anyway; the reference then leaks. */
    lucid_tensor **box = lua_newuserdata(L, sizeof *box);
    *box = t;
    lua_insert(L, -2);
    lua_setmetatable(L, -2);
}

/* ---------------------------------------------------------------- contexts */

/* The context inside a Context userdata at idx, NULL if idx holds none;
 * raises when the context was freed. */
static lucid_ctx *ctx_from_value(lua_State *L, int idx, int argidx) {
    lucid_ctx **box = luaL_testudata(L, idx, LUCID_LUA_CONTEXT_MT);
    if (!box) return NULL;
    if (!*box) lucid_lua_argerror(L, argidx, "ctx: context was freed");
    return *box;
}

/* Create the default context (device "auto") and store it in the registry;
 * leaves nothing on the stack. */
static lucid_ctx *default_ctx(lua_State *L) {
    lua_getfield(L, LUA_REGISTRYINDEX, DEFAULT_CTX_KEY);
    lucid_ctx **box = luaL_testudata(L, -1, LUCID_LUA_CONTEXT_MT);
    if (box && *box) {
        lua_pop(L, 1);
        return *box;
    }
    lua_pop(L, 1);
    lucid_ctx_options opt = lucid_ctx_options_default();
    lucid_device_parse("auto", &opt.device);
    box = lua_newuserdata(L, sizeof *box);
    *box = NULL;
    luaL_getmetatable(L, LUCID_LUA_CONTEXT_MT);
    lua_setmetatable(L, -2);
    char err[512];
    lucid_status s = lucid_ctx_create(&opt, box, err, sizeof err);
    if (s != LUCID_OK) {
        luaL_error(L, "lucid %s: default context: %s", lucid_status_name(s),
                   err);
        return NULL;
    }
    lua_setfield(L, LUA_REGISTRYINDEX, DEFAULT_CTX_KEY);
    return *box;
}

lucid_ctx *lucid_lua_ctx(lua_State *L, int idx) {
    if (idx != 0) {
        if (idx < 0 && idx > LUA_REGISTRYINDEX) idx = lua_gettop(L) + idx + 1;
        lucid_ctx *c = ctx_from_value(L, idx, idx);
        if (c) return c;
        if (lua_istable(L, idx)) {
            lua_getfield(L, idx, "ctx");
            if (!lua_isnil(L, -1)) {
                c = ctx_from_value(L, -1, idx);
                if (!c) {
                    const char *msg = lua_pushfstring(
                        L, "ctx: expected lucid.Context, got %s",
                        lucid_lua_type_name(L, -1));
                    lucid_lua_argerror(L, idx, msg);
                }
                lua_pop(L, 1);
                return c;
            }
            lua_pop(L, 1);
        }
    }
    return default_ctx(L);
}

/* shape as text into b (n >= LUCID_MAX_DIMS * 24 + 4 bytes): open, the
 * sizes joined by sep, close ("{2, 3}" as typed in Lua, "[2,3]" in
 * messages about tensors). */
static const char *shape_text(char *b, size_t n, int ndim, const int64_t *shape,
                              char open, const char *sep, char close) {
    size_t k = 0;
    b[k++] = open;
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(b + k, n - k, "%s%lld", i ? sep : "", (long long)shape[i]);
    if (k < n - 1) {
        b[k++] = close;
        b[k] = '\0';
    }
    return b;
}

void lucid_lua_check_shape_size(lua_State *L, int idx, int ndim,
                                const int64_t *shape, lucid_dtype dt,
                                const char *argname) {
    if (lucid_shape_bytes(ndim, shape, dt, NULL, NULL) == 0) return;
    char b[LUCID_MAX_DIMS * 24 + 4];
    shape_text(b, sizeof b, ndim, shape, '{', ", ", '}');
    lucid_lua_argerror(L, idx,
                       lua_pushfstring(L, "%s: tensor size overflows: %s of %s "
                                          "(%d byte%s per element) needs more "
                                          "than 2^63-1 elements or bytes",
                                       argname, b, lucid_dtype_name(dt),
                                       (int)lucid_dtype_size(dt),
                                       lucid_dtype_size(dt) == 1 ? "" : "s"));
}

const char *lucid_lua_push_shape(lua_State *L, int ndim, const int64_t *shape) {
    char b[LUCID_MAX_DIMS * 24 + 4];
    lua_pushstring(L, shape_text(b, sizeof b, ndim, shape, '[', ",", ']'));
    return lua_tostring(L, -1);
}

/* ----------------------------------------------------------------- options */

static const char DTYPE_LIST[] = "f32, f64, bf16, f16, u8, i32, i64";

lucid_dtype lucid_lua_opt_dtype(lua_State *L, int idx, const char *field,
                                lucid_dtype def) {
    if (idx == 0 || !lua_istable(L, idx)) return def;
    lua_getfield(L, idx, field);
    lucid_dtype dt = def;
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TSTRING) {
            const char *msg = lua_pushfstring(L, "%s: expected a dtype name, got %s",
                                              field, lucid_lua_type_name(L, -1));
            lucid_lua_argerror(L, idx, msg);
        }
        const char *name = lua_tostring(L, -1);
        if (lucid_dtype_parse(name, &dt) != 0) {
            const char *msg = lua_pushfstring(
                L, "%s: unknown dtype '%s' (expected one of %s)", field, name,
                DTYPE_LIST);
            lucid_lua_argerror(L, idx, msg);
        }
    }
    lua_pop(L, 1);
    return dt;
}

lucid_device lucid_lua_opt_device(lua_State *L, int idx, const char *field,
                                  lucid_device def) {
    if (idx == 0 || !lua_istable(L, idx)) return def;
    lua_getfield(L, idx, field);
    lucid_device dev = def;
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TSTRING) {
            const char *msg = lua_pushfstring(L, "%s: expected a device name, got %s",
                                              field, lucid_lua_type_name(L, -1));
            lucid_lua_argerror(L, idx, msg);
        }
        const char *name = lua_tostring(L, -1);
        if (lucid_device_parse(name, &dev) != 0) {
            const char *msg = lua_pushfstring(
                L, "%s: unknown device '%s' (expected cpu, cuda, cuda:N or auto)",
                field, name);
            lucid_lua_argerror(L, idx, msg);
        }
    }
    lua_pop(L, 1);
    return dev;
}

/* ------------------------------------------------------------------- shape */

/* One shape entry at stack index v (position pos, 1-based, for messages):
 * an integer >= min (0 or 1). */
static int64_t shape_entry(lua_State *L, int v, int argidx, const char *argname,
                           int pos, int min) {
    const char *want = min > 0 ? "a positive integer" : "a non-negative integer";
    if (lua_type(L, v) == LUA_TNUMBER) {
        lua_Number x = lua_tonumber(L, v);
        if (x >= min && x == (lua_Number)(int64_t)x && x < 9.2e18)
            return (int64_t)x;
        const char *msg = lua_pushfstring(
            L, "%s[%d]: expected %s, got %s", argname, pos, want,
            lua_tostring(L, v) ? lua_tostring(L, v) : "?");
        lucid_lua_argerror(L, argidx, msg);
    }
    const char *msg = lua_pushfstring(L, "%s[%d]: expected %s, got %s",
                                      argname, pos, want, lucid_lua_type_name(L, v));
    lucid_lua_argerror(L, argidx, msg);
    return 0;
}

static int check_shape(lua_State *L, int idx, int64_t *shape,
                       const char *argname, int min) {
    if (idx < 0 && idx > LUA_REGISTRYINDEX) idx = lua_gettop(L) + idx + 1;
    if (lua_type(L, idx) == LUA_TNUMBER) {
        /* varargs form: zeros(2, 3, opts) */
        int n = 0;
        while (lua_type(L, idx + n) == LUA_TNUMBER) {
            if (n == LUCID_MAX_DIMS)
                lucid_lua_argerror(L, idx + n,
                              lua_pushfstring(L, "%s: expected at most %d dims",
                                              argname, LUCID_MAX_DIMS));
            shape[n] = shape_entry(L, idx + n, idx + n, argname, n + 1, min);
            n++;
        }
        return n;
    }
    if (!lua_istable(L, idx)) {
        const char *msg = lua_pushfstring(L, "%s: expected a table of sizes, got %s",
                                          argname, lucid_lua_type_name(L, idx));
        lucid_lua_argerror(L, idx, msg);
    }
    int n = (int)lua_objlen(L, idx);
    if (n > LUCID_MAX_DIMS) {
        const char *msg = lua_pushfstring(L, "%s: expected at most %d dims, got %d",
                                          argname, LUCID_MAX_DIMS, n);
        lucid_lua_argerror(L, idx, msg);
    }
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, idx, i + 1);
        shape[i] = shape_entry(L, lua_gettop(L), idx, argname, i + 1, min);
        lua_pop(L, 1);
    }
    return n;
}

int lucid_lua_check_shape(lua_State *L, int idx, int64_t *shape,
                          const char *argname) {
    return check_shape(L, idx, shape, argname, 1);
}

int lucid_lua_check_tensor_shape(lua_State *L, int idx, int64_t *shape,
                                 const char *argname) {
    return check_shape(L, idx, shape, argname, 0);
}

/* ----------------------------------------------------------------- options */

int lucid_lua_unknown_option(lua_State *L, int idx, const char *const *keys) {
    if (idx < 0 && idx > LUA_REGISTRYINDEX) idx = lua_gettop(L) + idx + 1;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        int ok = 0;
        for (int i = 0; k && keys[i]; i++)
            if (strcmp(k, keys[i]) == 0) ok = 1;
        if (ok) continue;
        luaL_Buffer b;
        luaL_buffinit(L, &b);
        for (int i = 0; keys[i]; i++) {
            if (i) luaL_addstring(&b, ", ");
            luaL_addstring(&b, keys[i]);
        }
        luaL_pushresult(&b);
        return 1; /* the key, then the list */
    }
    return 0;
}

void lucid_lua_check_options(lua_State *L, int idx, const char *const *keys,
                             const char *what) {
    if (!lua_istable(L, idx)) return;
    if (lucid_lua_unknown_option(L, idx, keys))
        luaL_error(L, "%s: unknown option '%s' (expected one of %s)", what,
                   lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : luaL_typename(L, -2),
                   lua_tostring(L, -1));
}

double lucid_lua_opt_number(lua_State *L, int idx, const char *key, double def,
                            const char *what) {
    if (!lua_istable(L, idx)) return def;
    lua_getfield(L, idx, key);
    double v = def;
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TNUMBER)
            luaL_error(L, "%s: option '%s': expected a number, got %s", what, key,
                       luaL_typename(L, -1));
        v = lua_tonumber(L, -1);
    }
    lua_pop(L, 1);
    return v;
}

int lucid_lua_opt_int(lua_State *L, int idx, const char *key, int def,
                      const char *what) {
    double v = lucid_lua_opt_number(L, idx, key, def, what);
    /* (int)v of a double outside int's range is undefined: batch = 1e12
     * reached the loader as -2147483648 */
    if (!(v >= -2147483648.0 && v <= 2147483647.0) || v != floor(v)) {
        char b[32];
        snprintf(b, sizeof b, "%.14g", v);
        luaL_error(L, "%s: option '%s': expected an integer in [-2147483648, "
                      "2147483647] (a C int), got %s",
                   what, key, b);
    }
    return (int)v;
}

int lucid_lua_opt_boolean(lua_State *L, int idx, const char *key, int def,
                          const char *what) {
    if (!lua_istable(L, idx)) return def;
    lua_getfield(L, idx, key);
    int v = def;
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TBOOLEAN)
            luaL_error(L, "%s: option '%s': expected a boolean, got %s", what, key,
                       luaL_typename(L, -1));
        v = lua_toboolean(L, -1);
    }
    lua_pop(L, 1);
    return v;
}

void lucid_lua_register_class(lua_State *L, const char *name,
                              const luaL_Reg *methods, lua_CFunction gc,
                              lua_CFunction tostring) {
    if (luaL_newmetatable(L, name)) {
        lua_newtable(L);
        luaL_register(L, NULL, methods);
        lua_setfield(L, -2, "__index");
        if (gc) {
            lua_pushcfunction(L, gc);
            lua_setfield(L, -2, "__gc");
        }
        if (tostring) {
            lua_pushcfunction(L, tostring);
            lua_setfield(L, -2, "__tostring");
        }
        lua_pushstring(L, name);
        lua_setfield(L, -2, "__name");
    }
    lua_pop(L, 1);
}
