/*
 * lua_io.c — lucid.io: the Lua binding of engine/io/safetensors (what
 * model:save / model:load need).
 *
 * Userdata lucid.SafeTensors { lucid_safetensors *f; lucid_ctx *ctx }.
 *
 * Lua API:
 *   lucid.io.safetensors_open(path, [opts]) -> file   (opts.ctx)
 *     file:names()        -> {name, ...} in data-offset order
 *     file:info(name)     -> {dtype = "f32", shape = {..}} or nil
 *     file:load(name, t)  copies tensor `name` into t (shapes must match;
 *                         float dtypes converted); error names file/tensor
 *     file:metadata()     -> {key = value}
 *     file:checksummed()  -> true when the file carries data checksums
 *                         (verified by the open; false: written without,
 *                         e.g. by PyTorch's safetensors, and unverified)
 *     file:count(), file:path(), file:close() (also __gc)
 *   lucid.io.safetensors_save(path, entries, [metadata], [opts])
 *     entries: array of {name, tensor} written in that order, atomically
 *     metadata: table of string -> string (data_crc32 and
 *     data_crc32_tensors are reserved: the writer stores the checksums)
 * Errors: "lucid <status>: <message>" from the engine (names the file and
 * tensor), or a bad-argument error for misuse.
 */
#include "lua_common.h"
#include "io/safetensors.h"

#include <string.h>

#define ST_MT "lucid.SafeTensors"

typedef struct {
    lucid_safetensors *f;
    lucid_ctx *ctx;
} st_box;

static st_box *check_file(lua_State *L, int idx) {
    st_box *b = lucid_lua_checkudata(L, idx, ST_MT);
    if (!b->f) lucid_lua_argerror(L, idx, "safetensors file was closed");
    return b;
}

static int l_st_open(lua_State *L) {
    const char *path = lucid_lua_checkstring(L, 1);
    lucid_ctx *ctx = lucid_lua_ctx(L, lua_istable(L, 2) ? 2 : 0);
    st_box *b = lua_newuserdata(L, sizeof *b);
    b->f = NULL;
    b->ctx = NULL;
    luaL_getmetatable(L, ST_MT);
    lua_setmetatable(L, -2);
    lucid_status st = lucid_safetensors_open(ctx, path, &b->f);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    lucid_ctx_retain(ctx);
    b->ctx = ctx;
    return 1;
}

static int l_st_close(lua_State *L) {
    st_box *b = lucid_lua_checkudata(L, 1, ST_MT);
    if (b->f) lucid_safetensors_close(b->f);
    if (b->ctx) lucid_ctx_release(b->ctx);
    b->f = NULL;
    b->ctx = NULL;
    return 0;
}

static int l_st_names(lua_State *L) {
    st_box *b = check_file(L, 1);
    int n = lucid_safetensors_count(b->f);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushstring(L, lucid_safetensors_info(b->f, i)->name);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

static int l_st_count(lua_State *L) {
    lua_pushinteger(L, lucid_safetensors_count(check_file(L, 1)->f));
    return 1;
}

static int l_st_path(lua_State *L) {
    lua_pushstring(L, lucid_safetensors_path(check_file(L, 1)->f));
    return 1;
}

static int l_st_info(lua_State *L) {
    st_box *b = check_file(L, 1);
    int i = lucid_safetensors_find(b->f, lucid_lua_checkstring(L, 2));
    if (i < 0) {
        lua_pushnil(L);
        return 1;
    }
    const lucid_st_info *in = lucid_safetensors_info(b->f, i);
    lua_createtable(L, 0, 2);
    lua_pushstring(L, lucid_dtype_name(in->dtype));
    lua_setfield(L, -2, "dtype");
    lua_createtable(L, in->ndim, 0);
    for (int d = 0; d < in->ndim; d++) {
        lua_pushnumber(L, (lua_Number)in->shape[d]);
        lua_rawseti(L, -2, d + 1);
    }
    lua_setfield(L, -2, "shape");
    return 1;
}

static int l_st_load(lua_State *L) {
    st_box *b = check_file(L, 1);
    const char *name = lucid_lua_checkstring(L, 2);
    lucid_tensor *t = lucid_lua_check_tensor(L, 3, "dst");
    lucid_ctx *ctx = lucid_tensor_ctx(t);
    lucid_status st = lucid_safetensors_load(ctx, b->f, name, t);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    return 0;
}

static int l_st_metadata(lua_State *L) {
    st_box *b = check_file(L, 1);
    int n = lucid_safetensors_metadata_count(b->f);
    lua_createtable(L, 0, n);
    for (int i = 0; i < n; i++) {
        const char *k = lucid_safetensors_metadata_key(b->f, i);
        lua_pushstring(L, lucid_safetensors_metadata_get(b->f, k));
        lua_setfield(L, -2, k);
    }
    return 1;
}

static int l_st_checksummed(lua_State *L) {
    lua_pushboolean(L, lucid_safetensors_checksummed(check_file(L, 1)->f));
    return 1;
}

/* Raise after freeing the writer. */
static int writer_fail(lua_State *L, lucid_ctx *ctx, lucid_st_writer *w, lucid_status st) {
    lucid_st_writer_free(w);
    return lucid_lua_raise(L, ctx, st);
}

/* safetensors_save(path, entries, [metadata], [opts]) */
static int l_st_save(lua_State *L) {
    const char *path = lucid_lua_checkstring(L, 1);
    lucid_lua_checktype(L, 2, LUA_TTABLE);
    int n = (int)lua_objlen(L, 2);
    /* validate every entry before allocating anything */
    for (int i = 1; i <= n; i++) {
        lua_rawgeti(L, 2, i);
        if (!lua_istable(L, -1))
            return lucid_lua_argerror(L, 2, lua_pushfstring(L, "entries[%d]: expected {name, tensor}", i));
        lua_rawgeti(L, -1, 1);
        lua_rawgeti(L, -2, 2);
        if (!lua_isstring(L, -2) || !lucid_lua_to_tensor(L, -1))
            return lucid_lua_argerror(L, 2, lua_pushfstring(L, "entries[%d]: expected {name, tensor}", i));
        lua_pop(L, 3);
    }
    if (!lua_isnoneornil(L, 3)) lucid_lua_checktype(L, 3, LUA_TTABLE);
    lucid_ctx *ctx = lucid_lua_ctx(L, lua_istable(L, 4) ? 4 : 0);
    lucid_st_writer *w = NULL;
    lucid_status st = lucid_st_writer_create(ctx, &w);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    for (int i = 1; i <= n; i++) {
        lua_rawgeti(L, 2, i);
        lua_rawgeti(L, -1, 1);
        lua_rawgeti(L, -2, 2);
        const char *name = lua_tostring(L, -2);
        lucid_tensor *t = lucid_lua_to_tensor(L, -1);
        st = lucid_st_writer_add(ctx, w, name, t);
        lua_pop(L, 3);
        if (st != LUCID_OK) return writer_fail(L, ctx, w, st);
    }
    if (lua_istable(L, 3)) {
        lua_pushnil(L);
        while (lua_next(L, 3)) {
            if (lua_type(L, -2) == LUA_TSTRING && lua_isstring(L, -1)) {
                st = lucid_st_writer_set_metadata(ctx, w, lua_tostring(L, -2), lua_tostring(L, -1));
                if (st != LUCID_OK) {
                    lua_pop(L, 2);
                    return writer_fail(L, ctx, w, st);
                }
            }
            lua_pop(L, 1);
        }
    }
    st = lucid_st_writer_save(ctx, w, path);
    if (st != LUCID_OK) return writer_fail(L, ctx, w, st);
    lucid_st_writer_free(w);
    return 0;
}

static const luaL_Reg st_methods[] = {
    {"names", l_st_names}, {"count", l_st_count},       {"path", l_st_path},
    {"info", l_st_info},   {"load", l_st_load},         {"metadata", l_st_metadata},
    {"checksummed", l_st_checksummed}, {"close", l_st_close}, {NULL, NULL},
};

static const luaL_Reg io_funcs[] = {
    {"safetensors_open", l_st_open},
    {"safetensors_save", l_st_save},
    {NULL, NULL},
};

/* Adds lucid.io.safetensors_* to the module table on top of the stack. */
int lucid_lua_open_io(lua_State *L) {
    int module = lua_gettop(L);
    luaL_newmetatable(L, ST_MT);
    lua_pushliteral(L, ST_MT);
    lua_setfield(L, -2, "__name");
    lua_pushcfunction(L, l_st_close);
    lua_setfield(L, -2, "__gc");
    lua_newtable(L);
    luaL_setfuncs(L, st_methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
    lua_getfield(L, module, "io");
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        lua_newtable(L);
    }
    luaL_setfuncs(L, io_funcs, 0);
    lua_setfield(L, module, "io");
    return 0;
}
