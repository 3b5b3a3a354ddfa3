/*
 * lua_args.c — argument checks and argument errors of the Lua binding,
 * naming the function as the user calls it.
 *
 * Why not lauxlib's: luaL_argerror and the luaL_check* family name the
 * function from the call site's bytecode, which knows no name for a tail
 * call (`return t:reshape(s)`), a call through pcall or a local alias, and
 * never the class a method belongs to: the user read "bad argument #1 to
 * '?'". Here the name comes from the function itself: the C function
 * running at level 0 is looked up in a per-lua_State table of qualified
 * names ("lucid.Tensor:reshape", "lucid.io.safetensors_open",
 * "lucid.Tensor.__add"), built from the module table and the lucid.*
 * metatables the first time an error needs it (and rebuilt once on a miss,
 * for a metatable created later).
 *
 * Message: "<where><name>: bad argument #<n> (<arg>): <what>" where <arg>
 * is the leading "name: " of the caller's message (shape, shape[2], opts,
 * ...) when it has one; otherwise "<name>: bad argument #<n>: <msg>".
 * Methods (names with ':') count arguments after self, as Lua does
 * (t:reshape(s): s is #1); a bad self reads "<name>: bad self: <what>".
 * <where> is "file:line: " of the Lua caller when there is one.
 *
 * lua_common.h poisons the lauxlib checkers in lua/, so every binding
 * file goes through these (a compile error otherwise).
 */
#include "lua_common.h"

#include <string.h>

/* Registry keys: the module table (set by luaopen_lucid) and the table
 * lightuserdata(C function) -> name | {name, name, ...}. */
#define MODULE_KEY "lucid.module"
#define NAMES_KEY "lucid.function_names"

/* Tables nested deeper than this below the module are not walked. */
#define MAX_DEPTH 4

/* ------------------------------------------------------------ the names */

/* A C function as a table key (function and object pointers have the same
 * size on the platforms lucid supports; memcpy avoids the cast). */
static void push_fn_key(lua_State *L, lua_CFunction fn) {
    void *key;
    memcpy(&key, &fn, sizeof key);
    lua_pushlightuserdata(L, key);
}

/* names[fn] gets `name` (at stack top; popped) added. */
static void add_name(lua_State *L, int names, lua_CFunction fn) {
    push_fn_key(L, fn);
    lua_rawget(L, names);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        push_fn_key(L, fn);
        lua_pushvalue(L, -2);
        lua_rawset(L, names);
    } else if (lua_isstring(L, -1)) {
        if (lua_rawequal(L, -1, -2)) {
            lua_pop(L, 2);
            return;
        }
        lua_createtable(L, 2, 0);
        lua_insert(L, -2);
        lua_rawseti(L, -2, 1);
        lua_pushvalue(L, -2);
        lua_rawseti(L, -2, 2);
        push_fn_key(L, fn);
        lua_insert(L, -2);
        lua_rawset(L, names);
    } else {
        int n = (int)lua_objlen(L, -1);
        for (int i = 1; i <= n; i++) {
            lua_rawgeti(L, -1, i);
            int same = lua_rawequal(L, -1, -3);
            lua_pop(L, 1);
            if (same) {
                lua_pop(L, 2);
                return;
            }
        }
        lua_pushvalue(L, -2);
        lua_rawseti(L, -2, n + 1);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
}

static void walk_methods(lua_State *L, int names, int tbl, const char *cls);

/* Name the C function at idx `name`, and the C functions among its
 * upvalues too (a wrapper closure calls them: errors raised there get the
 * same name); a table upvalue of an __index closure is a method table. */
static void name_cfunction(lua_State *L, int names, int idx, const char *name,
                           const char *cls_for_upvalue_methods) {
    lua_pushstring(L, name);
    add_name(L, names, lua_tocfunction(L, idx));
    for (int u = 1; lua_getupvalue(L, idx, u); u++) {
        int top = lua_gettop(L);
        if (lua_iscfunction(L, top))
            name_cfunction(L, names, top, name, NULL);
        else if (lua_istable(L, top) && cls_for_upvalue_methods)
            walk_methods(L, names, top, cls_for_upvalue_methods);
        lua_settop(L, top - 1);
    }
}

/* Every C function of the method table at tbl: "<cls>:<key>". */
static void walk_methods(lua_State *L, int names, int tbl, const char *cls) {
    lua_pushnil(L);
    while (lua_next(L, tbl)) {
        if (lua_type(L, -2) == LUA_TSTRING && lua_iscfunction(L, -1)) {
            lua_pushfstring(L, "%s:%s", cls, lua_tostring(L, -2));
            name_cfunction(L, names, lua_gettop(L) - 1, lua_tostring(L, -1), NULL);
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
}

/* A class metatable at mt with __name cls: its __index methods first (so
 * they come before metamethods in a name list), then "<cls>.<__meta>". */
static void walk_metatable(lua_State *L, int names, int mt, const char *cls) {
    lua_pushliteral(L, "__index");
    lua_rawget(L, mt);
    int idx = lua_gettop(L);
    if (lua_istable(L, idx)) walk_methods(L, names, idx, cls);
    lua_pop(L, 1);
    lua_pushnil(L);
    while (lua_next(L, mt)) {
        if (lua_type(L, -2) == LUA_TSTRING && lua_iscfunction(L, -1)) {
            const char *k = lua_tostring(L, -2);
            lua_pushfstring(L, "%s.%s", cls, k);
            name_cfunction(L, names, lua_gettop(L) - 1, lua_tostring(L, -1),
                           strcmp(k, "__index") == 0 ? cls : NULL);
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
}

/* Functions of the module table at tbl: "<prefix>.<key>", recursively. */
static void walk_module(lua_State *L, int names, int tbl, const char *prefix,
                        int depth) {
    lua_pushnil(L);
    while (lua_next(L, tbl)) {
        if (lua_type(L, -2) == LUA_TSTRING) {
            int v = lua_gettop(L);
            if (lua_iscfunction(L, v)) {
                lua_pushfstring(L, "%s.%s", prefix, lua_tostring(L, -2));
                name_cfunction(L, names, v, lua_tostring(L, -1), NULL);
                lua_pop(L, 1);
            } else if (lua_istable(L, v) && depth < MAX_DEPTH) {
                lua_pushfstring(L, "%s.%s", prefix, lua_tostring(L, -2));
                walk_module(L, names, v, lua_tostring(L, -1), depth + 1);
                lua_pop(L, 1);
            }
        }
        lua_pop(L, 1);
    }
}

/* Build the names table from the module and every lucid.* metatable of the
 * registry; leaves it on the stack. */
static void build_names(lua_State *L) {
    lua_newtable(L);
    int names = lua_gettop(L);
    lua_getfield(L, LUA_REGISTRYINDEX, MODULE_KEY);
    if (lua_istable(L, -1)) walk_module(L, names, lua_gettop(L), "lucid", 1);
    lua_pop(L, 1);
    lua_pushnil(L);
    while (lua_next(L, LUA_REGISTRYINDEX)) {
        if (lua_type(L, -2) == LUA_TSTRING && lua_istable(L, -1) &&
            strncmp(lua_tostring(L, -2), "lucid.", 6) == 0) {
            lua_pushliteral(L, "__name");
            lua_rawget(L, -2);
            if (lua_type(L, -1) == LUA_TSTRING) {
                const char *cls = lua_tostring(L, -1);
                walk_metatable(L, names, lua_gettop(L) - 1, cls);
            }
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
    lua_pushvalue(L, names);
    lua_setfield(L, LUA_REGISTRYINDEX, NAMES_KEY);
}

void lucid_lua_set_module(lua_State *L, int idx) {
    if (idx < 0 && idx > LUA_REGISTRYINDEX) idx = lua_gettop(L) + idx + 1;
    lua_pushvalue(L, idx);
    lua_setfield(L, LUA_REGISTRYINDEX, MODULE_KEY);
    lua_pushnil(L);
    lua_setfield(L, LUA_REGISTRYINDEX, NAMES_KEY); /* rebuilt on demand */
}

/* The part of a qualified name after its last ':' or '.'. */
static const char *short_name(const char *q) {
    const char *s = q;
    for (const char *p = q; *p; p++)
        if (*p == ':' || *p == '.') s = p + 1;
    return s;
}

/* Is `q` ("Cls:m") a method of the class of argument 1's metatable? */
static int method_of_self(lua_State *L, const char *q) {
    const char *colon = strrchr(q, ':');
    if (!colon || !lua_getmetatable(L, 1)) return 0;
    lua_getfield(L, -1, "__name");
    const char *cls = lua_tostring(L, -1);
    int yes = cls && strlen(cls) == (size_t)(colon - q) &&
              strncmp(cls, q, (size_t)(colon - q)) == 0;
    lua_pop(L, 2);
    return yes;
}

/* Choose among several names of one function (one C function may be a
 * module function, a method and a metamethod: lucid.add, lucid.Tensor:add,
 * lucid.Tensor.__add). Score: the call site's name (4), the call site's
 * kind (2: a method call for "Cls:m", any other call for the rest), and,
 * when the call site is unknown (a tail call), a method of the class of
 * argument 1 (1); ties go to the shortest name, then the first. */
static const char *pick(lua_State *L, int list, const char *ar_name,
                        const char *namewhat) {
    int n = (int)lua_objlen(L, list);
    const char *best = NULL;
    int best_score = -1;
    int known = namewhat && *namewhat;
    int method_call = known && strcmp(namewhat, "method") == 0;
    for (int i = 1; i <= n; i++) {
        lua_rawgeti(L, list, i);
        const char *q = lua_tostring(L, -1); /* kept alive by the list */
        lua_pop(L, 1);
        if (!q) continue;
        int is_method = strchr(q, ':') != NULL;
        int score = 0;
        if (ar_name && strcmp(short_name(q), ar_name) == 0) score += 4;
        if (known && is_method == method_call) score += 2;
        if (!known && is_method && method_of_self(L, q)) score += 1;
        if (score > best_score ||
            (score == best_score && strlen(q) < strlen(best))) {
            best = q;
            best_score = score;
        }
    }
    return best;
}

/* Qualified name of the running C function, or NULL; pushes one value
 * (keeps the returned string alive until the caller raises). */
static const char *lookup(lua_State *L, lua_CFunction fn, const char *ar_name,
                          const char *namewhat, int rebuild) {
    lua_getfield(L, LUA_REGISTRYINDEX, NAMES_KEY);
    if (!lua_istable(L, -1) || rebuild) {
        lua_pop(L, 1);
        build_names(L);
    }
    push_fn_key(L, fn);
    lua_rawget(L, -2);
    lua_remove(L, -2);
    if (lua_type(L, -1) == LUA_TSTRING) return lua_tostring(L, -1);
    if (lua_istable(L, -1)) return pick(L, lua_gettop(L), ar_name, namewhat);
    return NULL;
}

/* Name of the function raising now: qualified when known, else the call
 * site's ("<self class>:<name>" for a method call). Pushes one value. */
static const char *function_name(lua_State *L, int *is_method) {
    lua_Debug ar;
    memset(&ar, 0, sizeof ar);
    const char *q = NULL;
    *is_method = 0;
    if (lua_getstack(L, 0, &ar) && lua_getinfo(L, "nf", &ar)) {
        lua_CFunction fn = lua_tocfunction(L, -1);
        lua_pop(L, 1);
        if (fn) {
            q = lookup(L, fn, ar.name, ar.namewhat, 0);
            if (!q) {
                lua_pop(L, 1);
                q = lookup(L, fn, ar.name, ar.namewhat, 1);
            }
        } else {
            lua_pushnil(L);
        }
    } else {
        lua_pushnil(L);
    }
    if (q) {
        *is_method = strchr(q, ':') != NULL;
        return q;
    }
    lua_pop(L, 1);
    if (ar.name && ar.namewhat && strcmp(ar.namewhat, "method") == 0 &&
        lua_getmetatable(L, 1)) {
        lua_getfield(L, -1, "__name");
        lua_remove(L, -2);
        if (lua_type(L, -1) == LUA_TSTRING) {
            lua_pushfstring(L, "%s:%s", lua_tostring(L, -1), ar.name);
            lua_remove(L, -2);
            *is_method = 1;
            return lua_tostring(L, -1);
        }
        lua_pop(L, 1);
    }
    if (ar.name) {
        lua_pushstring(L, ar.name);
        *is_method = ar.namewhat && strcmp(ar.namewhat, "method") == 0;
        return lua_tostring(L, -1);
    }
    lua_pushliteral(L, "lucid (unnamed function)");
    return lua_tostring(L, -1);
}

const char *lucid_lua_function_name(lua_State *L) {
    int method;
    return function_name(L, &method);
}

/* Length of the leading "<arg>: " of msg when <arg> looks like an argument
 * name (identifier characters, dots, brackets; no spaces), else 0. */
static size_t arg_prefix(const char *msg) {
    size_t i = 0;
    while (msg[i] && msg[i] != ':' && msg[i] != ' ' && msg[i] != '(' &&
           msg[i] != '\'')
        i++;
    return (i > 0 && msg[i] == ':' && msg[i + 1] == ' ') ? i : 0;
}

/* ------------------------------------------------------------------ errors */

int lucid_lua_argerror(lua_State *L, int narg, const char *msg) {
    if (!msg) msg = "invalid value";
    int method;
    const char *fname = function_name(L, &method);
    if (method && narg > 0) narg--;
    size_t pl = arg_prefix(msg);
    size_t fl = strlen(fname);
    int set = fl > 11 && strcmp(fname + fl - 11, ".__newindex") == 0;
    int get = fl > 8 && strcmp(fname + fl - 8, ".__index") == 0;
    luaL_where(L, 1);
    if ((set || get) && lua_type(L, 2) == LUA_TSTRING) {
        /* obj.k = v / obj.k: "<class>: setting 'k': <what>" */
        lua_pushfstring(L, "%s: %s '%s': ", fname, set ? "setting" : "reading",
                        lua_tostring(L, 2));
        /* cut ".__newindex" / ".__index" from the class name */
        const char *head = lua_tostring(L, -1);
        lua_pushlstring(L, head, fl - (set ? 11 : 8));
        lua_pushstring(L, head + fl);
        lua_pushstring(L, pl ? msg + pl + 2 : msg);
        lua_concat(L, 3);
        lua_remove(L, -2);
    } else if (narg == 0 && method) {
        if (pl == 4 && strncmp(msg, "self", 4) == 0)
            lua_pushfstring(L, "%s: bad self: %s", fname, msg + pl + 2);
        else
            lua_pushfstring(L, "%s: bad self: %s", fname, msg);
    } else if (narg < 0) {
        lua_pushfstring(L, "%s: bad value: %s", fname, msg);
    } else if (pl) {
        lua_pushlstring(L, msg, pl);
        lua_pushfstring(L, "%s: bad argument #%d (%s): %s", fname, narg,
                        lua_tostring(L, -1), msg + pl + 2);
        lua_remove(L, -2);
    } else {
        lua_pushfstring(L, "%s: bad argument #%d: %s", fname, narg, msg);
    }
    lua_concat(L, 2);
    return lua_error(L);
}

/* "expected <what>, got <type>" for the argument at narg. */
static int type_error(lua_State *L, int narg, const char *what) {
    return lucid_lua_argerror(
        L, narg, lua_pushfstring(L, "expected %s, got %s", what,
                                 lucid_lua_type_name(L, narg)));
}

/* ---------------------------------------------------------------- checkers */

/* A value as argument errors show an unexpected one: "string 'x'", "5",
 * or its type name. Pushes the text and returns it. */
static const char *describe(lua_State *L, int idx) {
    if (lua_type(L, idx) == LUA_TSTRING)
        return lua_pushfstring(L, "string '%s'", lua_tostring(L, idx));
    if (lua_type(L, idx) == LUA_TNUMBER) {
        lua_pushvalue(L, idx);
        return lua_tostring(L, -1); /* converts the copy only */
    }
    lua_pushstring(L, lucid_lua_type_name(L, idx));
    return lua_tostring(L, -1);
}

void lucid_lua_check_nargs(lua_State *L, int max) {
    int top = lua_gettop(L);
    while (top > max && lua_isnil(L, top)) top--; /* trailing nils: absent */
    if (top <= max) return;
    int method;
    function_name(L, &method);
    lua_pop(L, 1);
    int most = method ? max - 1 : max, got = method ? top - 1 : top;
    const char *extra = describe(L, max + 1);
    if (most == 0)
        lucid_lua_argerror(L, max + 1, lua_pushfstring(L, "expected no arguments, got %d (extra: %s)",
                                                       got, extra));
    lucid_lua_argerror(L, max + 1,
                       lua_pushfstring(L, "expected at most %d argument%s, got %d (extra: %s)", most,
                                       most == 1 ? "" : "s", got, extra));
}

void lucid_lua_check_keys(lua_State *L, int idx, const char *const *keys) {
    if (lua_isnoneornil(L, idx)) return;
    if (!lua_istable(L, idx))
        lucid_lua_argerror(L, idx, lua_pushfstring(L, "opts: expected a table, got %s",
                                                   lucid_lua_type_name(L, idx)));
    if (!lucid_lua_unknown_option(L, idx, keys)) return;
    const char *list = lua_tostring(L, -1);
    if (lua_type(L, -2) == LUA_TSTRING)
        lucid_lua_argerror(L, idx, lua_pushfstring(L, "opts: unknown option '%s' (expected one of %s)",
                                                   lua_tostring(L, -2), list));
    lucid_lua_argerror(L, idx, lua_pushfstring(L, "opts: unexpected %s key (expected one of %s)",
                                               lucid_lua_type_name(L, -2), list));
}

void *lucid_lua_checkudata(lua_State *L, int narg, const char *tname) {
    void *p = luaL_testudata(L, narg, tname);
    if (!p) type_error(L, narg, tname);
    return p;
}

const char *lucid_lua_checklstring(lua_State *L, int narg, size_t *len) {
    const char *s = lua_tolstring(L, narg, len);
    if (!s) type_error(L, narg, "a string");
    return s;
}

const char *lucid_lua_optlstring(lua_State *L, int narg, const char *def,
                                 size_t *len) {
    if (lua_isnoneornil(L, narg)) {
        if (len) *len = def ? strlen(def) : 0;
        return def;
    }
    return lucid_lua_checklstring(L, narg, len);
}

lua_Number lucid_lua_checknumber(lua_State *L, int narg) {
    lua_Number d = lua_tonumber(L, narg);
    if (d == 0 && !lua_isnumber(L, narg)) type_error(L, narg, "a number");
    return d;
}

lua_Number lucid_lua_optnumber(lua_State *L, int narg, lua_Number def) {
    return lua_isnoneornil(L, narg) ? def : lucid_lua_checknumber(L, narg);
}

lua_Integer lucid_lua_checkinteger(lua_State *L, int narg) {
    lucid_lua_checknumber(L, narg); /* the type check: a number */
    return lua_tointeger(L, narg);
}

lua_Integer lucid_lua_optinteger(lua_State *L, int narg, lua_Integer def) {
    return lua_isnoneornil(L, narg) ? def : lucid_lua_checkinteger(L, narg);
}

void lucid_lua_checktype(lua_State *L, int narg, int t) {
    if (lua_type(L, narg) == t) return;
    const char *what = t == LUA_TTABLE      ? "a table"
                       : t == LUA_TFUNCTION ? "a function"
                       : t == LUA_TSTRING   ? "a string"
                       : t == LUA_TNUMBER   ? "a number"
                       : t == LUA_TBOOLEAN  ? "a boolean"
                                            : lua_typename(L, t);
    type_error(L, narg, what);
}

int lucid_lua_checkoption(lua_State *L, int narg, const char *def,
                          const char *const lst[]) {
    const char *name = def ? lucid_lua_optlstring(L, narg, def, NULL)
                           : lucid_lua_checklstring(L, narg, NULL);
    for (int i = 0; lst[i]; i++)
        if (strcmp(lst[i], name) == 0) return i;
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 0; lst[i]; i++) {
        if (i) luaL_addstring(&b, ", ");
        luaL_addstring(&b, lst[i]);
    }
    luaL_pushresult(&b);
    return lucid_lua_argerror(
        L, narg, lua_pushfstring(L, "invalid option '%s' (expected one of %s)",
                                 name, lua_tostring(L, -1)));
}
