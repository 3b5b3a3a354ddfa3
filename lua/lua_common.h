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

/* The tensor at idx; raises "bad argument #idx to 'fn' (<argname>: expected
 * lucid.Tensor, got <type>)" or "... tensor was freed". */
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

/* Options tables (the `{...}` argument of constructors and calls).
 * check_options raises "<what>: unknown option '<key>' (expected one of
 * k1, k2, ...)" for a key outside `keys` (NULL-terminated); it does nothing
 * when the value at idx is not a table. opt_number / opt_boolean return the
 * field or `def` when it is absent (or idx is not a table) and raise
 * "<what>: option '<key>': expected a number (a boolean), got <type>". */
void lucid_lua_check_options(lua_State *L, int idx, const char *const *keys,
                             const char *what);
double lucid_lua_opt_number(lua_State *L, int idx, const char *key, double def,
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

#endif
