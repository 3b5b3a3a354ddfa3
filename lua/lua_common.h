/*
 * lua_common.h — shared helpers of the Lua binding (lua/ only).
 *
 * lua/ is the only place that includes lua.h and the only place that raises
 * Lua errors. Every binding function frees its C temporaries before it
 * raises. Misuse (wrong type, bad shape, unknown dtype) raises an error that
 * names the argument and the expected and actual values; a runtime failure of
 * the engine raises the context's message prefixed with the status name.
 */
#ifndef LUCID_LUA_COMMON_H
#define LUCID_LUA_COMMON_H

#include <lua.h>
#include <lauxlib.h>
#include "lucid.h"

/* Metatable names in the registry. */
#define LUCID_LUA_TENSOR_MT "lucid.Tensor"
#define LUCID_LUA_CONTEXT_MT "lucid.Context"

/* The context to use: when idx != 0 and the value at idx is a Context
 * userdata (or a table with field ctx holding one), that one; else the
 * default context of this lua_State, created on first use with device
 * "auto" (stored in the registry, never in a C global). Raises on failure. */
lucid_ctx *lucid_lua_ctx(lua_State *L, int idx);

/* The tensor at idx; raises "<fn>: bad argument #idx (<argname>): expected
 * lucid.Tensor, got <type>" or "... tensor was freed" (lucid_lua_argerror). */
lucid_tensor *lucid_lua_check_tensor(lua_State *L, int idx, const char *argname);
/* Like check_tensor but returns NULL when the value is not a tensor. */
lucid_tensor *lucid_lua_to_tensor(lua_State *L, int idx);

/* Push a tensor userdata; takes over one reference of t (the caller must not
 * release it). t may be NULL (pushes nil). */
void lucid_lua_push_tensor(lua_State *L, lucid_tensor *t);

/* Raise the context's last error as a Lua error: "lucid <status>: message".
 * Never returns. */
int lucid_lua_raise(lua_State *L, lucid_ctx *ctx, lucid_status s);

/* Read an optional dtype/device from a Lua options table at idx (fields
 * "dtype", "device"); defaults are used when absent. Raise on unknown names. */
lucid_dtype lucid_lua_opt_dtype(lua_State *L, int idx, const char *field,
                                lucid_dtype def);
lucid_device lucid_lua_opt_device(lua_State *L, int idx, const char *field,
                                  lucid_device def);

/* Shape from a Lua array of positive integers at idx (or from varargs of
 * integers starting at idx when the value there is a number). Returns ndim;
 * raises on bad entries naming the position and value. */
int lucid_lua_check_shape(lua_State *L, int idx, int64_t *shape,
                          const char *argname);
/* The same for a tensor's shape (lucid.zeros, ...): sizes may be 0, as in
 * PyTorch (torch.zeros(0, 3) is an empty (0, 3) tensor); the message says
 * "expected a non-negative integer". */
int lucid_lua_check_tensor_shape(lua_State *L, int idx, int64_t *shape,
                                 const char *argname);
/* Raise "<fn>: bad argument #idx (<argname>): tensor size overflows: {..}
 * of f32 ..." when a contiguous tensor of this shape and dtype cannot be
 * sized in int64 (lucid_shape_bytes): a wrapped count must never reach
 * an allocation. */
void lucid_lua_check_shape_size(lua_State *L, int idx, int ndim,
                                const int64_t *shape, lucid_dtype dt,
                                const char *argname);

/* Push a shape as the engine prints it ("[2,3]", "[]" for a 0-d tensor)
 * and return the string (it lives while it stays on the stack). */
const char *lucid_lua_push_shape(lua_State *L, int ndim, const int64_t *shape);

/* Options tables (the `{...}` argument of constructors and calls).
 * check_options raises "<what>: unknown option '<key>' (expected one of
 * k1, k2, ...)" for a key outside `keys` (NULL-terminated); it does nothing
 * when the value at idx is not a table. opt_number / opt_boolean return the
 * field or `def` when it is absent (or idx is not a table) and raise
 * "<what>: option '<key>': expected a number (a boolean), got <type>". */
void lucid_lua_check_options(lua_State *L, int idx, const char *const *keys,
                             const char *what);
/* The scan both option checks share: 0 when every key of the table at idx
 * is one of `keys` (NULL-terminated); else 1, with the first other key and
 * the comma-separated list of `keys` pushed (the key below the list). */
int lucid_lua_unknown_option(lua_State *L, int idx, const char *const *keys);
double lucid_lua_opt_number(lua_State *L, int idx, const char *key, double def,
                            const char *what);
/* opt_int: opt_number that must also be an integer a C int holds, else
 * "<what>: option '<key>': expected an integer in [-2147483648, 2147483647]
 * (a C int), got <v>" (the callee checks its own range after it). */
int lucid_lua_opt_int(lua_State *L, int idx, const char *key, int def,
                      const char *what);
int lucid_lua_opt_boolean(lua_State *L, int idx, const char *key, int def,
                          const char *what);

/* Create (once per lua_State) the metatable `name` of a userdata class with
 * __index = methods, __gc (may be NULL), __tostring (may be NULL) and
 * __name = name. Leaves the stack unchanged. */
void lucid_lua_register_class(lua_State *L, const char *name,
                              const luaL_Reg *methods, lua_CFunction gc,
                              lua_CFunction tostring);

/* Registration of sub-libraries into the module table at the top of stack. */
int lucid_lua_open_tensor(lua_State *L);
int lucid_lua_open_context(lua_State *L);

/* "lucid.Tensor" / "lucid.Context" ... (the __name of a lucid userdata's
 * metatable) for our userdata, else the Lua type name ("no value" for an
 * absent argument). */
const char *lucid_lua_type_name(lua_State *L, int idx);

/* ------------------------------------------------- arguments (lua_args.c)
 *
 * Argument errors name the function as the user calls it:
 *   "file:line: lucid.Tensor:reshape: bad argument #1 (shape): expected a
 *    table of sizes, got string"
 * <arg> in parentheses is the leading "name: " of msg when it has one.
 * Methods count arguments after self (t:reshape(s): s is #1); a bad self
 * reads "<fn>: bad self: <what>"; a negative (stack-relative) narg "<fn>:
 * bad value: <msg>". The name is found from the running C function (see
 * lua_args.c), so tail calls, pcall and aliases name it too. Never return.
 *
 * The checkers mirror lauxlib's (same arguments, same conversions) and
 * raise through lucid_lua_argerror with "expected <what>, got <type>";
 * checkoption lists the valid options. lauxlib's own argument checkers
 * are poisoned below for every file of lua/ (they cannot name functions
 * registered in tables and metatables). */
int lucid_lua_argerror(lua_State *L, int narg, const char *msg);
#define lucid_lua_argcheck(L, cond, narg, msg) \
    ((void)((cond) || lucid_lua_argerror(L, (narg), (msg))))
void *lucid_lua_checkudata(lua_State *L, int narg, const char *tname);
const char *lucid_lua_checklstring(lua_State *L, int narg, size_t *len);
#define lucid_lua_checkstring(L, n) lucid_lua_checklstring(L, (n), NULL)
const char *lucid_lua_optlstring(lua_State *L, int narg, const char *def,
                                 size_t *len);
#define lucid_lua_optstring(L, n, d) lucid_lua_optlstring(L, (n), (d), NULL)
lua_Number lucid_lua_checknumber(lua_State *L, int narg);
lua_Number lucid_lua_optnumber(lua_State *L, int narg, lua_Number def);
lua_Integer lucid_lua_checkinteger(lua_State *L, int narg);
lua_Integer lucid_lua_optinteger(lua_State *L, int narg, lua_Integer def);
void lucid_lua_checktype(lua_State *L, int narg, int t);
int lucid_lua_checkoption(lua_State *L, int narg, const char *def,
                          const char *const lst[]);

/* Fixed argument sets: raise "<fn>: bad argument #k: expected at most N
 * arguments, got M (extra: <value>)" ("expected no arguments" for N = 0)
 * when a non-nil argument follows stack position max (self included:
 * opt:step() is lucid_lua_check_nargs(L, 1)). Trailing nils are absent
 * arguments. */
void lucid_lua_check_nargs(lua_State *L, int max);

/* An options table at idx (nil/none: nothing to check): raise "<fn>: bad
 * argument #idx (opts): unknown option 'k' (expected one of a, b)" for a
 * key outside `keys` (NULL-terminated), or "opts: expected a table, got
 * <type>" for a value that is not a table. */
void lucid_lua_check_keys(lua_State *L, int idx, const char *const *keys);

/* The name of the running C function as the user calls it
 * ("lucid.Tensor:reshape", "lucid.rand"; the names argument errors use),
 * pushed on the stack (the string lives while it stays there) and
 * returned. For errors that are not about one argument (an engine failure
 * of the call). */
const char *lucid_lua_function_name(lua_State *L);

/* Record the module table at idx (luaopen_lucid): the names of its
 * functions, and of the methods of the lucid.* metatables, are what
 * argument errors use (built on the first error). */
void lucid_lua_set_module(lua_State *L, int idx);

#undef luaL_checkstring
#undef luaL_optstring
#undef luaL_argcheck
#undef luaL_checkint
#undef luaL_optint
#undef luaL_checklong
#undef luaL_optlong
#pragma GCC poison luaL_argerror luaL_typerror luaL_checkudata \
    luaL_checklstring luaL_checkstring luaL_optlstring luaL_optstring \
    luaL_checknumber luaL_optnumber luaL_checkinteger luaL_optinteger \
    luaL_checktype luaL_checkany luaL_checkoption luaL_argcheck \
    luaL_checkint luaL_optint luaL_checklong luaL_optlong

#endif
