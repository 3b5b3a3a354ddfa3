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
 *     file:load(name, t)  copies tensor `name` into t: t must have the
 *                         stored shape exactly ([2,2] does not load into a
 *                         [4] tensor, nor [] into [1]: "bad argument #2
 *                         (dst)" naming the tensor, the file and both
 *                         shapes); any strides; float dtypes converted,
 *                         others must match; an absent name is the
 *                         engine's format error naming file and tensor
 *     file:metadata()     -> {key = value}
 *     file:checksummed()  -> true when the file carries data checksums
 *                         (verified by the open; false: written without,
 *                         e.g. by PyTorch's safetensors, and unverified)
 *     file:count(), file:path(), file:close() (also __gc)
 *   lucid.io.safetensors_save(path | {path, ...}, entries, [metadata], [opts])
 *     entries: array of {name (string), tensor} written in that order
 *     metadata: table of string -> string (data_crc32 and
 *     data_crc32_tensors are reserved: the writer stores the checksums)
 *     opts: ctx (the Context whose device the tensors are on), async
 *     Every save goes through this Lua state's background writer
 *     (engine/io/st_queue.h, one thread, jobs in order):
 *       1. wait for the previous save (so at most one write is in flight
 *          and one snapshot is held); its failure is raised here;
 *       2. snapshot the tensors into host memory on this thread (device ->
 *          host copies, the device synchronized): the tensors may change
 *          as soon as the call returns;
 *       3. the writer thread computes the CRC-32s and the header once and
 *          writes the same bytes to every path in order, each atomically
 *          (temporary file, fsync, rename): independent, identical files.
 *     async = false (default): returns when every path is written (errors
 *     raised here: "write of <path> failed: ..."). async = true: returns after the snapshot; a failed
 *     write is raised by the next save, lucid.io.wait, or an open of that
 *     path, never dropped (at exit it is printed on stderr).
 *   lucid.io.wait([path])   wait for pending writes (all, or the ones of
 *     path); raises the first unreported failure, naming the file
 *   lucid.io.remove_stale_temps(path) -> n: removes the temporary files a
 *     killed writer left beside path (".<name>.tmp.XXXXXX"), after waiting
 *     for this state's pending writes of path; n removed
 *   lucid.io.pending()      -> number of saves not yet written
 *   lucid.io.writer_stats() -> {jobs, failed, files, bytes, seconds}
 *     (seconds: wall time the writer thread spent writing)
 * safetensors_open waits for pending writes to the same path first.
 * Errors: "lucid <status>: <message>" from the engine (names the file and
 * tensor), or a bad-argument error for misuse.
 */
#include "lua_common.h"
#include "io/safetensors.h"
#include "io/st_queue.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ST_MT "lucid.SafeTensors"
#define WRITER_MT "lucid.io.Writer"
/* Registry key of this Lua state's background writer (a WRITER_MT box). */
#define WRITER_KEY "lucid.io.writer"
/* Most paths one save may write (last + best need two). */
#define ST_MAX_PATHS 8

/* ------------------------------------------------- the background writer */

/* One per Lua state, created by the first save. ctx is a private CPU
 * context that holds the writer's error messages (never the caller's, so
 * a failure read at a wait cannot be overwritten by unrelated work). */
typedef struct {
    lucid_st_queue *q;
    lucid_ctx *ctx;
} writer_box;

/* __gc (lua_close): finish every pending write; a failure nobody waited
 * for is printed, as there is no caller left to raise it to. */
static int l_writer_gc(lua_State *L) {
    writer_box *b = lua_touserdata(L, 1);
    if (b->q) {
        if (lucid_st_queue_close(b->ctx, b->q) != LUCID_OK)
            fprintf(stderr, "lucid: when the Lua state closed: %s\n", lucid_ctx_error(b->ctx));
        b->q = NULL;
    }
    if (b->ctx) lucid_ctx_release(b->ctx);
    b->ctx = NULL;
    return 0;
}

/* This state's writer; created when `create`, else NULL when none yet. */
static writer_box *get_writer(lua_State *L, int create) {
    lua_getfield(L, LUA_REGISTRYINDEX, WRITER_KEY);
    writer_box *b = lua_touserdata(L, -1);
    lua_pop(L, 1);
    if (b || !create) return b;
    b = lua_newuserdata(L, sizeof *b);
    b->q = NULL;
    b->ctx = NULL;
    if (luaL_newmetatable(L, WRITER_MT)) {
        lua_pushliteral(L, WRITER_MT);
        lua_setfield(L, -2, "__name");
        lua_pushcfunction(L, l_writer_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_setmetatable(L, -2);
    lucid_ctx_options o = lucid_ctx_options_default();
    char err[256] = "";
    if (lucid_ctx_create(&o, &b->ctx, err, sizeof err) != LUCID_OK) {
        luaL_where(L, 1);
        lua_pushfstring(L, "lucid io: cannot create the checkpoint writer: %s", err);
        lua_concat(L, 2);
        lua_error(L);
    }
    lucid_status st = lucid_st_queue_create(b->ctx, &b->q);
    if (st != LUCID_OK) /* the box stays on the stack while raising; its __gc
                           * releases the context later */
        lucid_lua_raise(L, b->ctx, st);
    lua_setfield(L, LUA_REGISTRYINDEX, WRITER_KEY);
    return b;
}

/* lucid.io.wait([path]) */
static int l_io_wait(lua_State *L) {
    const char *path = lua_isnoneornil(L, 1) ? NULL : lucid_lua_checkstring(L, 1);
    writer_box *b = get_writer(L, 0);
    if (!b) return 0;
    lucid_status st = path ? lucid_st_queue_wait_path(b->ctx, b->q, path)
                           : lucid_st_queue_wait(b->ctx, b->q, 0);
    if (st != LUCID_OK) return lucid_lua_raise(L, b->ctx, st);
    return 0;
}

/* lucid.io.pending() -> n */
static int l_io_pending(lua_State *L) {
    writer_box *b = get_writer(L, 0);
    lua_pushinteger(L, b ? lucid_st_queue_pending(b->q) : 0);
    return 1;
}

/* lucid.io.writer_stats() -> {jobs, failed, files, bytes, seconds} */
static int l_io_writer_stats(lua_State *L) {
    writer_box *b = get_writer(L, 0);
    lucid_st_queue_stats s = {0};
    if (b) lucid_st_queue_stats_get(b->q, &s);
    lua_createtable(L, 0, 5);
    lua_pushnumber(L, (lua_Number)s.jobs);
    lua_setfield(L, -2, "jobs");
    lua_pushnumber(L, (lua_Number)s.failed);
    lua_setfield(L, -2, "failed");
    lua_pushnumber(L, (lua_Number)s.files);
    lua_setfield(L, -2, "files");
    lua_pushnumber(L, (lua_Number)s.bytes);
    lua_setfield(L, -2, "bytes");
    lua_pushnumber(L, s.seconds);
    lua_setfield(L, -2, "seconds");
    return 1;
}

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
    static const char *const keys[] = {"ctx", NULL};
    lucid_lua_check_nargs(L, 2);
    lucid_lua_check_keys(L, 2, keys);
    lucid_ctx *ctx = lucid_lua_ctx(L, lua_istable(L, 2) ? 2 : 0);
    writer_box *wb = get_writer(L, 0);
    if (wb) { /* a pending (or failed) write of this file comes first */
        lucid_status ws = lucid_st_queue_wait_path(wb->ctx, wb->q, path);
        if (ws != LUCID_OK) return lucid_lua_raise(L, wb->ctx, ws);
    }
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
    /* the engine also takes a contiguous t of the same element count in
     * another shape (row-major); the Lua API needs the stored shape (no
     * caller in lua/ relies on more: they all size t from file:info) */
    int i = lucid_safetensors_find(b->f, name);
    if (i >= 0) {
        const lucid_st_info *in = lucid_safetensors_info(b->f, i);
        int same = in->ndim == t->ndim;
        for (int d = 0; same && d < in->ndim; d++) same = in->shape[d] == t->shape[d];
        if (!same) {
            const char *fs = lucid_lua_push_shape(L, in->ndim, in->shape);
            const char *ts = lucid_lua_push_shape(L, t->ndim, t->shape);
            lucid_lua_argerror(L, 3, lua_pushfstring(L, "dst: tensor '%s' of %s has shape %s; "
                                                        "dst has shape %s (the shapes must be "
                                                        "equal)",
                                                     name, lucid_safetensors_path(b->f), fs, ts));
        }
    }
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

/* safetensors_save(path | {path, ...}, entries, [metadata], [opts]) */
static int l_st_save(lua_State *L) {
    const char *paths[ST_MAX_PATHS];
    int np = 0;
    if (lua_type(L, 1) == LUA_TSTRING) {
        paths[np++] = lua_tostring(L, 1);
    } else if (lua_istable(L, 1)) {
        int n = (int)lua_objlen(L, 1);
        if (n < 1 || n > ST_MAX_PATHS)
            return lucid_lua_argerror(L, 1, lua_pushfstring(L, "path: expected 1 to %d paths, got %d",
                                                            ST_MAX_PATHS, n));
        for (int i = 1; i <= n; i++) {
            lua_rawgeti(L, 1, i);
            if (lua_type(L, -1) != LUA_TSTRING)
                return lucid_lua_argerror(L, 1, lua_pushfstring(L, "path[%d]: expected a string, got %s",
                                                                i, luaL_typename(L, -1)));
            paths[np++] = lua_tostring(L, -1); /* anchored by the table */
            lua_pop(L, 1);
        }
    } else {
        return lucid_lua_argerror(L, 1, lua_pushfstring(L, "path: expected a string or a list of strings, got %s",
                                                        luaL_typename(L, 1)));
    }
    lucid_lua_checktype(L, 2, LUA_TTABLE);
    int n = (int)lua_objlen(L, 2);
    /* an array only: a map {name = tensor} would otherwise write an empty file */
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TNUMBER || lua_tonumber(L, -1) < 1 || lua_tonumber(L, -1) > n ||
            lua_tonumber(L, -1) != (lua_Number)(int)lua_tonumber(L, -1)) {
            const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : luaL_typename(L, -1);
            return lucid_lua_argerror(
                L, 2, lua_pushfstring(L, "entries: expected an array of {name, tensor}, got the key '%s' "
                                         "(write { {\"%s\", t} }, not { %s = t })", k, k, k));
        }
    }
    /* validate every entry before allocating anything */
    for (int i = 1; i <= n; i++) {
        lua_rawgeti(L, 2, i);
        if (!lua_istable(L, -1))
            return lucid_lua_argerror(L, 2, lua_pushfstring(L, "entries[%d]: expected {name, tensor}", i));
        lua_rawgeti(L, -1, 1);
        lua_rawgeti(L, -2, 2);
        if (lua_type(L, -2) != LUA_TSTRING || !lucid_lua_to_tensor(L, -1))
            return lucid_lua_argerror(L, 2, lua_pushfstring(L, "entries[%d]: expected {name, tensor}", i));
        lua_pop(L, 3);
    }
    if (!lua_isnoneornil(L, 3)) lucid_lua_checktype(L, 3, LUA_TTABLE);
    static const char *const opt_keys[] = {"ctx", "async", NULL};
    lucid_lua_check_options(L, 4, opt_keys, "safetensors_save options");
    int async = lucid_lua_opt_boolean(L, 4, "async", 0, "safetensors_save options");
    lucid_ctx *ctx = lucid_lua_ctx(L, lua_istable(L, 4) ? 4 : 0);
    writer_box *wb = get_writer(L, 1);
    /* the previous save first: one write in flight; its failure is raised */
    lucid_status st = lucid_st_queue_wait(wb->ctx, wb->q, 0);
    if (st != LUCID_OK) return lucid_lua_raise(L, wb->ctx, st);

    const char **names = malloc(((size_t)n + 1) * sizeof *names);
    const lucid_tensor **ts = malloc(((size_t)n + 1) * sizeof *ts);
    lucid_st_writer *w = NULL;
    if (!names || !ts) {
        free(names);
        free(ts);
        return luaL_error(L, "lucid out of memory: safetensors_save: %d entries", n);
    }
    for (int i = 1; i <= n; i++) { /* strings and tensors anchored by entries */
        lua_rawgeti(L, 2, i);
        lua_rawgeti(L, -1, 1);
        lua_rawgeti(L, -2, 2);
        names[i - 1] = lua_tostring(L, -2);
        ts[i - 1] = lucid_lua_to_tensor(L, -1);
        lua_pop(L, 3);
    }
    st = lucid_st_writer_create(ctx, &w);
    if (st == LUCID_OK) st = lucid_st_writer_add_tensors(ctx, w, n, names, ts);
    free(names);
    free(ts);
    if (st == LUCID_OK && lua_istable(L, 3)) {
        lua_pushnil(L);
        while (lua_next(L, 3)) {
            if (lua_type(L, -2) == LUA_TSTRING && lua_isstring(L, -1)) {
                st = lucid_st_writer_set_metadata(ctx, w, lua_tostring(L, -2), lua_tostring(L, -1));
                if (st != LUCID_OK) {
                    lua_pop(L, 2);
                    break;
                }
            }
            lua_pop(L, 1);
        }
    }
    if (st != LUCID_OK) {
        lucid_st_writer_free(w);
        return lucid_lua_raise(L, ctx, st);
    }
    uint64_t seq = 0;
    st = lucid_st_queue_submit(wb->ctx, wb->q, w, paths, np, &seq); /* takes w */
    if (st == LUCID_OK && !async) {
        st = lucid_st_queue_wait(wb->ctx, wb->q, seq);
        /* this call's own write failed (an earlier background failure was
         * raised by the wait above): the queue words it "background write
         * of P failed: ..."; a synchronous save says "write of P failed" */
        static const char bg[] = "background write of ";
        const char *m = st != LUCID_OK ? lucid_ctx_error(wb->ctx) : NULL;
        if (m && strncmp(m, bg, sizeof bg - 1) == 0) {
            luaL_where(L, 1);
            lua_pushfstring(L, "lucid %s: %s", lucid_status_name(st), m + sizeof "background " - 1);
            lua_concat(L, 2);
            lucid_ctx_clear_error(wb->ctx);
            return lua_error(L);
        }
    }
    if (st != LUCID_OK) return lucid_lua_raise(L, wb->ctx, st);
    return 0;
}

/* remove_stale_temps(path) -> n */
static int l_io_remove_stale(lua_State *L) {
    const char *path = lucid_lua_checkstring(L, 1);
    lucid_lua_argcheck(L, *path, 1, "path: expected a non-empty string");
    /* this state's own writes of path first: their temp files are live */
    lua_pushcfunction(L, l_io_wait);
    lua_pushvalue(L, 1);
    lua_call(L, 1, 0);
    lucid_ctx *ctx = lucid_lua_ctx(L, 0);
    int n = 0;
    lucid_status st = lucid_atomic_file_remove_stale(ctx, path, &n);
    if (st != LUCID_OK) return lucid_lua_raise(L, ctx, st);
    lua_pushinteger(L, n);
    return 1;
}

static const luaL_Reg st_methods[] = {
    {"names", l_st_names}, {"count", l_st_count},       {"path", l_st_path},
    {"info", l_st_info},   {"load", l_st_load},         {"metadata", l_st_metadata},
    {"checksummed", l_st_checksummed}, {"close", l_st_close}, {NULL, NULL},
};

static const luaL_Reg io_funcs[] = {
    {"safetensors_open", l_st_open},
    {"safetensors_save", l_st_save},
    {"wait", l_io_wait},
    {"remove_stale_temps", l_io_remove_stale},
    {"pending", l_io_pending},
    {"writer_stats", l_io_writer_stats},
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
