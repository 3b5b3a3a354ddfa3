/*
 * lua_tensor.c — the Tensor userdata of the Lua binding: constructors,
 * metadata, views, conversions, arithmetic, reductions, matmul, printing.
 *
 * Conventions (mirror PyTorch / Torch7 naming):
 *   - dims and indices are 1-based in Lua (negative ones count from the
 *     end, -1 = last) and converted to 0-based here, never in engine/;
 *   - shapes are Lua arrays {4,3,640,640} (or varargs of integers);
 *   - opts tables take dtype ("f32" default), device ("cpu" default, or the
 *     device of opts.ctx when a context is given) and ctx;
 *   - ops run on the context of their first tensor operand (its storage
 *     holds a reference to it), so tensors keep their context alive;
 *   - whole-tensor reductions return 0-d tensors (:item() reads them);
 *   - misuse raises "<fn>: bad argument #n (what): expected X, got Y"
 *     (lucid_lua_argerror: "lucid.Tensor:narrow", "lucid.zeros");
 *     engine failures raise "lucid <status>: <fn>: <message>" after every
 *     C temporary of the call has been released (see fail()); <fn> is the
 *     function the user called, never the engine op inside it.
 * The userdata is one `lucid_tensor *` slot holding one reference; :free()
 * releases it early and __gc is the safety net (double free is a no-op).
 */
#include "lua_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ helpers */

/* The engine message without its leading engine op ("view: ", "copy: ",
 * "rand_uniform: ": a lower-case identifier and ": "), which the function
 * the user called replaces. */
static const char *without_op(const char *msg) {
    size_t i = 0;
    while ((msg[i] >= 'a' && msg[i] <= 'z') || msg[i] == '_' ||
           (i > 0 && msg[i] >= '0' && msg[i] <= '9'))
        i++;
    return (i > 0 && msg[i] == ':' && msg[i + 1] == ' ') ? msg + i + 2 : msg;
}

/* Raise the engine error of ctx after releasing up to two temporaries:
 * "lucid <status>: <fn>: <message>", <fn> the function the user called
 * ("lucid.Tensor:reshape", not the engine's "view"). The message is copied
 * onto the Lua stack first, so releasing cannot touch it. */
static int fail(lua_State *L, lucid_ctx *ctx, lucid_status s, lucid_tensor *t1,
                lucid_tensor *t2) {
    luaL_where(L, 1);
    const char *fn = lucid_lua_function_name(L);
    lua_pushfstring(L, "lucid %s: %s: %s", lucid_status_name(s), fn,
                    without_op(lucid_ctx_error(ctx)));
    lua_remove(L, -2);
    lucid_ctx_clear_error(ctx);
    lucid_tensor_release(t1);
    lucid_tensor_release(t2);
    lua_concat(L, 2);
    return lua_error(L);
}

/* Arithmetic (unary, binary, matmul, rand) exists for the float dtypes
 * only: raise naming the argument at idx (argname "self", "other",
 * "opts.dtype") and its dtype otherwise. */
static void check_float_dtype(lua_State *L, int idx, const char *argname,
                              lucid_dtype dt) {
    if (lucid_dtype_is_float(dt)) return;
    lucid_lua_argerror(L, idx,
                       lua_pushfstring(L, "%s: expected a float dtype (f32, f64, "
                                          "bf16 or f16), got %s; convert with "
                                          ":float() first",
                                       argname, lucid_dtype_name(dt)));
}

static lucid_tensor *self_tensor(lua_State *L) {
    return lucid_lua_check_tensor(L, 1, "self");
}

static const char *dev_name(lucid_device d, char *buf, size_t n) {
    if (d.type == LUCID_CPU)
        snprintf(buf, n, "cpu");
    else
        snprintf(buf, n, "cuda:%d", d.index);
    return buf;
}

static int same_device(lucid_device a, lucid_device b) {
    return a.type == b.type && (a.type == LUCID_CPU || a.index == b.index);
}

/* --------------------------------------------------------------- overlap
 *
 * An op that writes a tensor w while it reads an input x elementwise gives
 * wrong values when w and x are different views of overlapping memory (the
 * kernel reads elements it already wrote: b[2..6] = 2 * b[1..5] gave
 * [1,2,4,8,16,32]). As PyTorch, the binding refuses them; it accepts x when
 * it is (a) in another storage, (b) the same view as w (same storage, byte
 * offset, element size, shape and strides -- or both contiguous with the
 * same start and element count: the same memory in row-major order), or
 * (c) in a byte range of the storage disjoint from w's. Anything else
 * (partial overlap, or a permutation of the same memory, as m:t() and m) is
 * refused, even where the element-level memory happens to be disjoint
 * (interleaved strided views): the check is a few integer comparisons, run
 * on every op of the training loop. The engine's C API does not check
 * (internal callers keep their behaviour). */

/* The byte range [*lo, *hi) the elements of t reach in its storage; 0 (no
 * range) when t has no elements. */
static int byte_range(const lucid_tensor *t, int64_t *lo, int64_t *hi) {
    int64_t a = t->offset, b = t->offset;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) return 0;
        int64_t e = (t->shape[i] - 1) * t->strides[i];
        if (e < 0) a += e; else b += e;
    }
    int64_t es = (int64_t)lucid_dtype_size(t->dtype);
    *lo = a * es;
    *hi = (b + 1) * es;
    return 1;
}

/* 1 when writing w elementwise while reading x is unsafe (see above). */
static int partial_overlap(const lucid_tensor *w, const lucid_tensor *x) {
    if (w->storage != x->storage || w == x) return 0;
    size_t es = lucid_dtype_size(w->dtype);
    if (es == lucid_dtype_size(x->dtype) && w->offset == x->offset) {
        int same = w->ndim == x->ndim;
        for (int i = 0; same && i < w->ndim; i++)
            same = w->shape[i] == x->shape[i] && w->strides[i] == x->strides[i];
        if (same) return 0;
        if (lucid_tensor_numel(w) == lucid_tensor_numel(x) &&
            lucid_tensor_is_contiguous(w) && lucid_tensor_is_contiguous(x))
            return 0;
    }
    int64_t wl, wh, xl, xh;
    if (!byte_range(w, &wl, &wh) || !byte_range(x, &xl, &xh)) return 0;
    return wl < xh && xl < wh;
}

/* Raise, as PyTorch, when the input x (stack index idx, argument xname)
 * partially overlaps the written tensor w (wname: "self", "out"). */
static void check_overlap(lua_State *L, const lucid_tensor *w, const char *wname,
                          const lucid_tensor *x, int idx, const char *xname) {
    if (!x || x->storage != w->storage || !partial_overlap(w, x)) return;
    lucid_lua_argerror(L, idx,
                       lua_pushfstring(L, "%s: unsupported operation: some elements of the "
                                          "input tensor (%s) and the written-to tensor (%s) "
                                          "refer to a single memory location. Please clone() "
                                          "the tensor before performing the operation.",
                                       xname, xname, wname));
}

/* Raise, as PyTorch, when the written tensor w (stack index idx, argument
 * wname) has internal overlap: a dim of size > 1 with stride 0 (an
 * expanded view), whose elements all share one memory location. */
static void check_internal_overlap(lua_State *L, const lucid_tensor *w, int idx,
                                   const char *wname) {
    for (int i = 0; i < w->ndim; i++)
        if (w->strides[i] == 0 && w->shape[i] > 1)
            lucid_lua_argerror(L, idx,
                               lua_pushfstring(L, "%s: unsupported operation: more than one "
                                                  "element of the written-to tensor refers to "
                                                  "a single memory location. Please clone() the "
                                                  "tensor before performing the operation.",
                                               wname));
}

/* CUDA-only requests in a build (or on a machine) without CUDA. */
static void check_device_usable(lua_State *L, lucid_device d) {
    if (d.type != LUCID_CUDA) return;
    int n = lucid_cuda_device_count();
    if (n > 0 && d.index < n) return;
    const char *fn = lucid_lua_function_name(L);
    if (n == 0)
        luaL_error(L, "lucid unsupported: %s: device cuda:%d requested but CUDA "
                      "is not available (CPU-only build or no GPU visible)",
                   fn, d.index);
    luaL_error(L, "lucid unsupported: %s: device cuda:%d requested but %d CUDA "
                  "device(s) visible",
               fn, d.index, n);
}

/* 0-based dim from the 1-based (or negative) Lua value at idx. */
static int check_dim(lua_State *L, int idx, int ndim, const char *what) {
    lua_Number x = lucid_lua_checknumber(L, idx);
    int d = (int)x;
    if ((lua_Number)d == x) {
        if (d >= 1 && d <= ndim) return d - 1;
        if (d <= -1 && d >= -ndim) return ndim + d;
    }
    if (ndim == 0)
        lucid_lua_argerror(L, idx, lua_pushfstring(L, "%s: the tensor has no dims, "
                                                 "got %s",
                                              what, lua_tostring(L, idx)));
    lucid_lua_argerror(L, idx,
                  lua_pushfstring(L, "%s: expected 1..%d or -%d..-1, got %s",
                                  what, ndim, ndim, lua_tostring(L, idx)));
    return 0;
}

/* Allocate an uninitialised contiguous tensor; on out-of-memory run a full
 * Lua collection, flush the device cache and retry once (Avoid 4). */
static lucid_tensor *new_tensor(lua_State *L, lucid_ctx *ctx, lucid_device dev,
                                lucid_dtype dt, int ndim, const int64_t *shape) {
    lucid_tensor *t = NULL;
    lucid_status s = lucid_tensor_empty(ctx, dev, dt, ndim, shape, &t);
    if (s == LUCID_ERR_OOM) {
        lua_gc(L, LUA_GCCOLLECT, 0);
        lucid_memory_empty_cache(ctx);
        s = lucid_tensor_empty(ctx, dev, dt, ndim, shape, &t);
    }
    if (s != LUCID_OK) fail(L, ctx, s, NULL, NULL);
    return t;
}

/* Push t, or raise the error of a failed call after releasing t. */
static int push_or_fail(lua_State *L, lucid_ctx *ctx, lucid_status s,
                        lucid_tensor *t) {
    if (s != LUCID_OK) return fail(L, ctx, s, t, NULL);
    lucid_lua_push_tensor(L, t);
    return 1;
}

static void push_shape(lua_State *L, const lucid_tensor *t) {
    lua_createtable(L, t->ndim, 0);
    for (int i = 0; i < t->ndim; i++) {
        lua_pushnumber(L, (lua_Number)t->shape[i]);
        lua_rawseti(L, -2, i + 1);
    }
}

/* ------------------------------------------------------- constructor opts */

typedef struct ctor_opts {
    lucid_ctx *ctx;
    lucid_device dev;
    lucid_dtype dt;
} ctor_opts;

/* Check that the table at idx only has keys from `allowed` (NULL-ended). */
static void check_keys(lua_State *L, int idx, const char *const *allowed,
                       const char *list) {
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        int ok = 0;
        if (lua_type(L, -2) == LUA_TSTRING)
            for (const char *const *a = allowed; *a; a++)
                if (strcmp(lua_tostring(L, -2), *a) == 0) ok = 1;
        if (!ok) {
            lua_pushvalue(L, -2);
            const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1)
                                                           : luaL_typename(L, -1);
            lucid_lua_argerror(L, idx,
                          lua_pushfstring(L, "opts: unknown key '%s' (expected "
                                             "%s)",
                                          k, list));
        }
        lua_pop(L, 1);
    }
}

/* Parse the optional opts table at idx {dtype=, device=, ctx=}. The device
 * defaults to the context's when ctx is given explicitly, else to cpu. */
static void check_opts(lua_State *L, int idx, ctor_opts *o) {
    static const char *const keys[] = {"dtype", "device", "ctx", NULL};
    lucid_device cpu = {LUCID_CPU, 0};
    int has = !lua_isnoneornil(L, idx);
    if (has && !lua_istable(L, idx))
        lucid_lua_argerror(L, idx,
                      lua_pushfstring(L, "opts: expected a table, got %s",
                                      luaL_typename(L, idx)));
    if (has) check_keys(L, idx, keys, "dtype, device, ctx");
    int explicit_ctx = 0;
    if (has) {
        lua_getfield(L, idx, "ctx");
        explicit_ctx = !lua_isnil(L, -1);
        lua_pop(L, 1);
    }
    o->ctx = lucid_lua_ctx(L, has ? idx : 0);
    o->dev = lucid_lua_opt_device(L, has ? idx : 0, "device",
                                  explicit_ctx ? lucid_ctx_device(o->ctx) : cpu);
    o->dt = lucid_lua_opt_dtype(L, has ? idx : 0, "dtype", LUCID_F32);
    check_device_usable(L, o->dev);
}

/* Shape (table or varargs) at 1 and opts after it; returns ndim. */
static int shape_and_opts(lua_State *L, int64_t *shape, ctor_opts *o) {
    int varargs = lua_type(L, 1) == LUA_TNUMBER;
    int ndim = lucid_lua_check_tensor_shape(L, 1, shape, "shape");
    check_opts(L, varargs ? 1 + ndim : 2, o);
    lucid_lua_check_shape_size(L, 1, ndim, shape, o->dt, "shape");
    return ndim;
}

/* ------------------------------------------------------------ constructors */

/*
 * lucid.empty(shape, [opts]) / lucid.zeros / lucid.ones
 *   shape: {d1, d2, ...} of non-negative integers (or varargs d1, d2, ...);
 *          a 0 size gives an empty tensor of that shape, as PyTorch:
 *          lucid.zeros({0, 3}) has shape {0, 3} and numel 0 (see
 *          lucid.tensor for the empty tables). Errors: a negative or
 *          fractional size ("shape[2]: expected a non-negative integer").
 *   opts:  {dtype = "f32", device = "cpu", ctx = Context}.
 *   Returns an uninitialised / zero / one-filled contiguous tensor.
 */
static int fill_ctor(lua_State *L, int fill, double value) {
    int64_t shape[LUCID_MAX_DIMS];
    ctor_opts o;
    int ndim = shape_and_opts(L, shape, &o);
    lucid_tensor *t = new_tensor(L, o.ctx, o.dev, o.dt, ndim, shape);
    lucid_status s = fill ? lucid_fill(o.ctx, t, value) : LUCID_OK;
    return push_or_fail(L, o.ctx, s, t);
}

static int l_empty(lua_State *L) { return fill_ctor(L, 0, 0.0); }
static int l_zeros(lua_State *L) { return fill_ctor(L, 1, 0.0); }
static int l_ones(lua_State *L) { return fill_ctor(L, 1, 1.0); }

/* lucid.full(shape, value, [opts]) — shape is a table here (sizes >= 0, as
 * lucid.zeros). */
static int l_full(lua_State *L) {
    int64_t shape[LUCID_MAX_DIMS];
    lucid_lua_checktype(L, 1, LUA_TTABLE);
    int ndim = lucid_lua_check_tensor_shape(L, 1, shape, "shape");
    double v = lucid_lua_checknumber(L, 2);
    ctor_opts o;
    check_opts(L, 3, &o);
    lucid_lua_check_shape_size(L, 1, ndim, shape, o.dt, "shape");
    lucid_tensor *t = new_tensor(L, o.ctx, o.dev, o.dt, ndim, shape);
    lucid_status s = lucid_fill(o.ctx, t, v);
    return push_or_fail(L, o.ctx, s, t);
}

/*
 * lucid.rand(shape, [opts]) — uniform [0, 1); lucid.randn — standard normal.
 *   Draws from the context's counter-based generator (lucid.manual_seed /
 *   ctx:manual_seed), so cpu and cuda give the same values. Float dtypes.
 *   Sizes >= 0, as lucid.zeros (an empty tensor draws nothing).
 */
static int rand_ctor(lua_State *L, int normal) {
    int64_t shape[LUCID_MAX_DIMS];
    ctor_opts o;
    int ndim = shape_and_opts(L, shape, &o);
    check_float_dtype(L, lua_type(L, 1) == LUA_TNUMBER ? 1 + ndim : 2,
                      "opts.dtype", o.dt);
    lucid_tensor *t = new_tensor(L, o.ctx, o.dev, o.dt, ndim, shape);
    uint64_t seed, off;
    lucid_ctx_rng_next(o.ctx, (uint64_t)lucid_tensor_numel(t), &seed, &off);
    lucid_status s = normal ? lucid_rand_normal(o.ctx, t, seed, off, 0.0, 1.0)
                            : lucid_rand_uniform(o.ctx, t, seed, off, 0.0, 1.0);
    return push_or_fail(L, o.ctx, s, t);
}

static int l_rand(lua_State *L) { return rand_ctor(L, 0); }
static int l_randn(lua_State *L) { return rand_ctor(L, 1); }

/* Convert the CPU f64 tensor `host` to (o->dev, o->dt) and push it. */
static int push_converted(lua_State *L, const ctor_opts *o, lucid_tensor *host) {
    if (o->dev.type == LUCID_CPU && o->dt == LUCID_F64) {
        lucid_lua_push_tensor(L, host);
        return 1;
    }
    lucid_tensor *t = NULL;
    lucid_status s = lucid_tensor_to(o->ctx, host, o->dev, o->dt, &t);
    if (s != LUCID_OK) return fail(L, o->ctx, s, host, NULL);
    lucid_tensor_release(host);
    lucid_lua_push_tensor(L, t);
    return 1;
}

/*
 * lucid.arange(n, [opts]) -> [0, 1, ..., n-1]
 * lucid.arange(start, stop, [step], [opts]) -> start, start+step, ... < stop
 *   dtype defaults to f32 (integer dtypes have no arithmetic in the op
 *   table; ask for {dtype="i64"} to get indices).
 */
static int l_arange(lua_State *L) {
    double start = 0, stop, step = 1;
    int nnum = 0;
    while (nnum < 3 && lua_type(L, nnum + 1) == LUA_TNUMBER) nnum++;
    if (nnum == 0) lucid_lua_checknumber(L, 1);
    if (nnum == 1) stop = lua_tonumber(L, 1);
    else {
        start = lua_tonumber(L, 1);
        stop = lua_tonumber(L, 2);
        if (nnum == 3) step = lua_tonumber(L, 3);
    }
    if (step == 0 || !isfinite(start) || !isfinite(stop) || !isfinite(step))
        lucid_lua_argerror(L, nnum, "expected finite start, stop and a non-zero step");
    double cnt = ceil((stop - start) / step);
    if (cnt < 0) cnt = 0;
    if (cnt > 9.0e15) lucid_lua_argerror(L, 1, "range too large");
    ctor_opts o;
    check_opts(L, nnum + 1, &o);
    int64_t n = (int64_t)cnt;
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_tensor *host = new_tensor(L, o.ctx, cpu, LUCID_F64, 1, &n);
    double *p = lucid_tensor_data(host);
    for (int64_t i = 0; i < n; i++) p[i] = start + (double)i * step;
    return push_converted(L, &o, host);
}

/* --- lucid.tensor: nested tables --- */

/* Raise "<fn>: bad argument #1 (data[i][j]): <msg>" for the nested value at
 * path[0..depth) (1-based indices); msg is on top of the stack. */
static void nested_error(lua_State *L, const int64_t *path, int depth) {
    luaL_Buffer b;
    const char *msg = lua_tostring(L, -1);
    luaL_buffinit(L, &b);
    luaL_addstring(&b, "data");
    for (int i = 0; i < depth; i++) {
        lua_pushfstring(L, "[%d]", (int)path[i]);
        luaL_addvalue(&b);
    }
    luaL_addstring(&b, ": ");
    luaL_addstring(&b, msg);
    luaL_pushresult(&b);
    lucid_lua_argerror(L, 1, lua_tostring(L, -1));
}

/* Validate the nested value on top of the stack against shape[depth..]. */
static void nested_check(lua_State *L, int ndim, const int64_t *shape,
                         int64_t *path, int depth) {
    int top = lua_gettop(L);
    if (depth == ndim) {
        if (lua_type(L, top) != LUA_TNUMBER) {
            lua_pushfstring(L, "expected a number, got %s",
                            luaL_typename(L, top));
            nested_error(L, path, depth);
        }
        return;
    }
    if (!lua_istable(L, top)) {
        lua_pushfstring(L, "ragged nested table: expected a table of %d "
                           "elements, got %s",
                        (int)shape[depth], luaL_typename(L, top));
        nested_error(L, path, depth);
    }
    int64_t n = (int64_t)lua_objlen(L, top);
    if (n != shape[depth]) {
        lua_pushfstring(L, "ragged nested table: has %d elements, expected %d",
                        (int)n, (int)shape[depth]);
        nested_error(L, path, depth);
    }
    for (int64_t i = 0; i < n; i++) {
        path[depth] = i + 1;
        lua_rawgeti(L, top, (int)(i + 1));
        nested_check(L, ndim, shape, path, depth + 1);
        lua_pop(L, 1);
    }
}

/* Copy the validated nested value on top of the stack into p (row-major). */
static double *nested_fill(lua_State *L, int ndim, const int64_t *shape,
                           int depth, double *p) {
    int top = lua_gettop(L);
    if (depth == ndim) {
        *p++ = lua_tonumber(L, top);
        return p;
    }
    for (int64_t i = 0; i < shape[depth]; i++) {
        lua_rawgeti(L, top, (int)(i + 1));
        p = nested_fill(L, ndim, shape, depth + 1, p);
        lua_pop(L, 1);
    }
    return p;
}

/*
 * lucid.tensor(data, [opts]) — a tensor from a number (0-d) or a nested Lua
 *   table of numbers; the shape is inferred from the first elements and
 *   every sub-table must match it (a ragged table raises naming the path,
 *   e.g. "data[2]: ragged nested table, has 3 elements, expected 2").
 *   Empty tables give empty tensors with PyTorch's shapes: {} is shape {0}
 *   (torch.tensor([])), {{}} is {1, 0}, {{}, {}} is {2, 0}; they equal
 *   lucid.zeros({0}) / lucid.zeros({1, 0}) (numel 0; sum 0; printed
 *   "tensor([], size=(1, 0), ...)"; max/min/mean raise). dtype defaults to
 *   f32.
 */
static int l_tensor(lua_State *L) {
    int64_t shape[LUCID_MAX_DIMS], path[LUCID_MAX_DIMS];
    int ndim = 0;
    lua_settop(L, 2); /* data, opts (nil when absent) */
    if (lua_type(L, 1) != LUA_TNUMBER && !lua_istable(L, 1))
        lucid_lua_argerror(L, 1,
                      lua_pushfstring(L, "data: expected a number or a nested "
                                         "table of numbers, got %s",
                                      luaL_typename(L, 1)));
    /* infer the shape down the first elements */
    lua_pushvalue(L, 1);
    while (lua_istable(L, -1)) {
        if (ndim == LUCID_MAX_DIMS)
            lucid_lua_argerror(L, 1, lua_pushfstring(L, "data: nested deeper than "
                                                   "%d dims",
                                                LUCID_MAX_DIMS));
        shape[ndim++] = (int64_t)lua_objlen(L, -1);
        if (shape[ndim - 1] == 0) break;
        lua_rawgeti(L, -1, 1);
    }
    lua_settop(L, 2);
    ctor_opts o;
    check_opts(L, 2, &o);
    lua_pushvalue(L, 1);
    nested_check(L, ndim, shape, path, 0);
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_tensor *host = new_tensor(L, o.ctx, cpu, LUCID_F64, ndim, shape);
    nested_fill(L, ndim, shape, 0, lucid_tensor_data(host));
    lua_pop(L, 1);
    return push_converted(L, &o, host);
}

/* --------------------------------------------------------------- metadata */

/* t:shape() -> {d1, d2, ...} (a new Lua table; {} for a 0-d tensor) */
static int l_shape(lua_State *L) {
    push_shape(L, self_tensor(L));
    return 1;
}

/* t:size([dim]) -> size of dim (1-based, negative from the end), or the
 *   shape table without dim (Torch7). */
static int l_size(lua_State *L) {
    lucid_tensor *t = self_tensor(L);
    if (lua_isnoneornil(L, 2)) {
        push_shape(L, t);
        return 1;
    }
    lua_pushnumber(L, (lua_Number)t->shape[check_dim(L, 2, t->ndim, "dim")]);
    return 1;
}

/* t:dim() -> number of dims */
static int l_dim(lua_State *L) {
    lua_pushinteger(L, self_tensor(L)->ndim);
    return 1;
}

/* t:numel() -> number of elements */
static int l_numel(lua_State *L) {
    lua_pushnumber(L, (lua_Number)lucid_tensor_numel(self_tensor(L)));
    return 1;
}

/* t:dtype() -> "f32" | "f64" | "bf16" | "f16" | "u8" | "i32" | "i64" */
static int l_dtype(lua_State *L) {
    lua_pushstring(L, lucid_dtype_name(self_tensor(L)->dtype));
    return 1;
}

/* t:device() -> "cpu" | "cuda:N" */
static int l_device(lua_State *L) {
    char b[32];
    lua_pushstring(L, dev_name(lucid_tensor_device(self_tensor(L)), b, sizeof b));
    return 1;
}

/* t:is_contiguous() -> boolean */
static int l_is_contiguous(lua_State *L) {
    lua_pushboolean(L, lucid_tensor_is_contiguous(self_tensor(L)));
    return 1;
}

/* t:storage_version() -> counter bumped by every write through the ops */
static int l_storage_version(lua_State *L) {
    lua_pushnumber(L, (lua_Number)lucid_storage_version(self_tensor(L)->storage));
    return 1;
}

/* t:free() — releases the storage reference now; later use raises "tensor
 *   was freed". A second free (or the later __gc) is a no-op. */
static int l_free(lua_State *L) {
    lucid_tensor **box = lucid_lua_checkudata(L, 1, LUCID_LUA_TENSOR_MT);
    if (*box) {
        lucid_tensor_release(*box);
        *box = NULL;
    }
    return 0;
}

/* ------------------------------------------------------------ conversions */

/* The context to move t to dev: a tensor on the device keeps its own; else
 * the given one or the default one. */
static lucid_ctx *ctx_for_move(lua_State *L, const lucid_tensor *t,
                               lucid_device dev, int optidx) {
    if (optidx) {
        lua_getfield(L, optidx, "ctx");
        int given = !lua_isnil(L, -1);
        lua_pop(L, 1);
        if (given) return lucid_lua_ctx(L, optidx);
    }
    lucid_ctx *own = lucid_tensor_ctx(t);
    if (dev.type == LUCID_CPU || same_device(lucid_ctx_device(own), dev))
        return own;
    return lucid_lua_ctx(L, 0);
}

/* Push t converted to (dev, dt); pushes t itself when nothing changes. */
static int move_to(lua_State *L, lucid_tensor *t, lucid_device dev,
                   lucid_dtype dt, int optidx) {
    if (same_device(lucid_tensor_device(t), dev) && t->dtype == dt) {
        lua_pushvalue(L, 1);
        return 1;
    }
    check_device_usable(L, dev);
    lucid_ctx *ctx = ctx_for_move(L, t, dev, optidx);
    lucid_tensor *out = NULL;
    lucid_status s = lucid_tensor_to(ctx, t, dev, dt, &out);
    return push_or_fail(L, ctx, s, out);
}

/*
 * t:to(device_or_dtype, [dtype]) / t:to{device=, dtype=, ctx=}
 *   Returns t itself when device and dtype already match, else a new
 *   contiguous tensor. Strings: "cpu", "cuda", "cuda:N", "auto" or a dtype.
 */
static int l_to(lua_State *L) {
    lucid_tensor *t = self_tensor(L);
    lucid_device dev = lucid_tensor_device(t);
    lucid_dtype dt = t->dtype;
    if (lua_istable(L, 2)) {
        static const char *const keys[] = {"dtype", "device", "ctx", NULL};
        check_keys(L, 2, keys, "dtype, device, ctx");
        dev = lucid_lua_opt_device(L, 2, "device", dev);
        dt = lucid_lua_opt_dtype(L, 2, "dtype", dt);
        return move_to(L, t, dev, dt, 2);
    }
    const char *a = lucid_lua_checkstring(L, 2);
    if (lucid_device_parse(a, &dev) != 0) {
        if (lucid_dtype_parse(a, &dt) != 0)
            lucid_lua_argerror(L, 2,
                          lua_pushfstring(L, "expected a device (cpu, cuda, "
                                             "cuda:N, auto) or a dtype (f32, "
                                             "f64, bf16, f16, u8, i32, i64), "
                                             "got '%s'",
                                          a));
        return move_to(L, t, dev, dt, 0);
    }
    if (!lua_isnoneornil(L, 3)) {
        const char *b = lucid_lua_checkstring(L, 3);
        if (lucid_dtype_parse(b, &dt) != 0)
            lucid_lua_argerror(L, 3,
                          lua_pushfstring(L, "unknown dtype '%s' (expected one "
                                             "of f32, f64, bf16, f16, u8, i32, "
                                             "i64)",
                                          b));
    }
    return move_to(L, t, dev, dt, 0);
}

static int to_dtype(lua_State *L, lucid_dtype dt) {
    lucid_tensor *t = self_tensor(L);
    return move_to(L, t, lucid_tensor_device(t), dt, 0);
}

/* t:float() / :double() / :bf16() / :half() — dtype conversions */
static int l_float(lua_State *L) { return to_dtype(L, LUCID_F32); }
static int l_double(lua_State *L) { return to_dtype(L, LUCID_F64); }
static int l_bf16(lua_State *L) { return to_dtype(L, LUCID_BF16); }
static int l_half(lua_State *L) { return to_dtype(L, LUCID_F16); }

/* t:cuda([index]) — to the tensor context's GPU, else cuda:index (0). */
static int l_cuda(lua_State *L) {
    lucid_tensor *t = self_tensor(L);
    lucid_device dev = {LUCID_CUDA, 0};
    lucid_device own = lucid_ctx_device(lucid_tensor_ctx(t));
    if (!lua_isnoneornil(L, 2))
        dev.index = (int)lucid_lua_checkinteger(L, 2);
    else if (own.type == LUCID_CUDA)
        dev = own;
    return move_to(L, t, dev, t->dtype, 0);
}

/* t:cpu() */
static int l_cpu(lua_State *L) {
    lucid_tensor *t = self_tensor(L);
    lucid_device cpu = {LUCID_CPU, 0};
    return move_to(L, t, cpu, t->dtype, 0);
}

/* t:clone() — a new contiguous copy (same dtype and device). */
static int l_clone(lua_State *L) {
    lucid_tensor *t = self_tensor(L), *out = NULL;
    lucid_ctx *ctx = lucid_tensor_ctx(t);
    lucid_status s = lucid_tensor_clone(ctx, t, &out);
    return push_or_fail(L, ctx, s, out);
}

/* t:contiguous() — t itself when contiguous, else a contiguous copy. */
static int l_contiguous(lua_State *L) {
    lucid_tensor *t = self_tensor(L);
    if (lucid_tensor_is_contiguous(t)) {
        lua_pushvalue(L, 1);
        return 1;
    }
    return l_clone(L);
}

/* ------------------------------------------------------------------- views */

/* Shape for view/reshape at idx (table or varargs) of non-negative sizes
 * (0: an empty tensor, as PyTorch's view(0, 3)); one entry may be -1 and is
 * inferred from numel (an error when the other sizes multiply to 0: the
 * size is ambiguous). */
static int view_shape(lua_State *L, int idx, const lucid_tensor *t,
                      int64_t *shape) {
    int n = 0, infer = -1;
    int varargs = lua_type(L, idx) == LUA_TNUMBER;
    if (!varargs && !lua_istable(L, idx))
        lucid_lua_argerror(L, idx,
                      lua_pushfstring(L, "shape: expected a table of sizes, got "
                                         "%s",
                                      luaL_typename(L, idx)));
    int count = varargs ? lua_gettop(L) - idx + 1 : (int)lua_objlen(L, idx);
    if (count > LUCID_MAX_DIMS)
        lucid_lua_argerror(L, idx, lua_pushfstring(L, "shape: expected at most %d "
                                                 "dims, got %d",
                                              LUCID_MAX_DIMS, count));
    int64_t known = 1;
    int wraps = 0; /* the product of the given sizes overflowed int64 */
    for (n = 0; n < count; n++) {
        if (!varargs) lua_rawgeti(L, idx, n + 1);
        int v = varargs ? idx + n : lua_gettop(L);
        lua_Number x = lua_type(L, v) == LUA_TNUMBER ? lua_tonumber(L, v) : 0;
        int ok = lua_type(L, v) == LUA_TNUMBER && x == floor(x) &&
                 (x >= 0 || (x == -1 && infer < 0)) && x < 9.0e18;
        if (!ok)
            lucid_lua_argerror(L, varargs ? v : idx,
                          lua_pushfstring(L, "shape[%d]: expected a non-negative "
                                             "integer or one -1, got %s",
                                          n + 1,
                                          lua_type(L, v) == LUA_TNUMBER
                                              ? lua_tostring(L, v)
                                              : luaL_typename(L, v)));
        if (x == -1) {
            infer = n;
            shape[n] = 1;
        } else {
            shape[n] = (int64_t)x;
            if (__builtin_mul_overflow(known, shape[n], &known)) wraps = 1;
        }
        if (!varargs) lua_pop(L, 1);
    }
    if (wraps) /* never reaches the engine as a wrapped count */
        lucid_lua_check_shape_size(L, idx, count, shape, t->dtype, "shape");
    if (infer >= 0) {
        int64_t numel = lucid_tensor_numel(t);
        if (known == 0 || numel % known != 0) {
            char b[32];
            snprintf(b, sizeof b, "%lld", (long long)numel);
            lucid_lua_argerror(L, idx,
                          lua_pushfstring(L, "shape: cannot infer -1 for %s "
                                             "elements",
                                          b));
        }
        shape[infer] = numel / known;
    } else if (known != lucid_tensor_numel(t)) {
        char a[24], b[24];
        snprintf(a, sizeof a, "%lld", (long long)known);
        snprintf(b, sizeof b, "%lld", (long long)lucid_tensor_numel(t));
        const char *gs = lucid_lua_push_shape(L, count, shape);
        const char *ts = lucid_lua_push_shape(L, t->ndim, t->shape);
        lucid_lua_argerror(L, idx, lua_pushfstring(L, "shape: %s has %s elements but the "
                                                      "tensor %s has %s",
                                                   gs, a, ts, b));
    }
    return count;
}

/* t:view(shape) — same storage, new shape (one -1 entry is inferred).
 *   Varargs t:view(2, 3) work too. Errors: "bad argument #1 (shape)" for
 *   another element count, "bad self: the tensor is not contiguous" (use
 *   reshape, which copies then). */
static int l_view(lua_State *L) {
    lucid_tensor *t = self_tensor(L), *out = NULL;
    int64_t shape[LUCID_MAX_DIMS];
    int n = view_shape(L, 2, t, shape);
    if (!lucid_tensor_is_contiguous(t))
        lucid_lua_argerror(L, 1, "self: the tensor is not contiguous; use reshape(), or "
                                 "clone() it first");
    lucid_ctx *ctx = lucid_tensor_ctx(t);
    lucid_status s = lucid_tensor_view(ctx, t, n, shape, &out);
    return push_or_fail(L, ctx, s, out);
}

/* t:reshape(shape) — a view when t is contiguous, else a copy. */
static int l_reshape(lua_State *L) {
    lucid_tensor *t = self_tensor(L), *out = NULL, *c = NULL;
    int64_t shape[LUCID_MAX_DIMS];
    int n = view_shape(L, 2, t, shape);
    lucid_ctx *ctx = lucid_tensor_ctx(t);
    lucid_status s;
    if (lucid_tensor_is_contiguous(t)) {
        s = lucid_tensor_view(ctx, t, n, shape, &out);
        return push_or_fail(L, ctx, s, out);
    }
    s = lucid_tensor_clone(ctx, t, &c);
    if (s != LUCID_OK) return fail(L, ctx, s, c, NULL);
    s = lucid_tensor_view(ctx, c, n, shape, &out);
    lucid_tensor_release(c);
    return push_or_fail(L, ctx, s, out);
}

/* t:narrow(dim, start, length) — view of indices start..start+length-1
 *   (1-based) along dim: start in 1..size, length in 0..size-start+1; a
 *   zero-length view may also start at size+1 (PyTorch's 0-based start ==
 *   size), so an empty dim narrows to length 0 at start 1. */
static int l_narrow(lua_State *L) {
    lucid_tensor *t = self_tensor(L), *out = NULL;
    int d = check_dim(L, 2, t->ndim, "dim");
    int64_t size = t->shape[d];
    lua_Number start = lucid_lua_checknumber(L, 3), len = lucid_lua_checknumber(L, 4);
    if (!(start >= 1 && start <= (lua_Number)size + 1 && start == floor(start))) {
        if (size == 0)
            lucid_lua_argerror(L, 3, lua_pushfstring(L, "start: expected 1 (with length 0: the "
                                                        "dim is empty), got %s",
                                                     lua_tostring(L, 3)));
        lucid_lua_argerror(L, 3, lua_pushfstring(L, "start: expected 1..%d (%d only with "
                                                    "length 0), got %s",
                                                 (int)size + 1, (int)size + 1,
                                                 lua_tostring(L, 3)));
    }
    if (!(len >= 0 && len <= (lua_Number)size - start + 1 && len == floor(len)))
        lucid_lua_argerror(L, 4,
                      lua_pushfstring(L, "length: expected 0..%d, got %s",
                                      (int)(size - (int64_t)start + 1),
                                      lua_tostring(L, 4)));
    lucid_ctx *ctx = lucid_tensor_ctx(t);
    lucid_status s = lucid_tensor_narrow(ctx, t, d, (int64_t)start - 1,
                                         (int64_t)len, &out);
    return push_or_fail(L, ctx, s, out);
}

/* 0-based index along dim d from the 1-based (or negative) value at idx. */
static int64_t check_index(lua_State *L, int idx, const lucid_tensor *t, int d) {
    lua_Number x = lucid_lua_checknumber(L, idx);
    int64_t size = t->shape[d];
    if (x == floor(x)) {
        if (x >= 1 && x <= (lua_Number)size) return (int64_t)x - 1;
        if (x <= -1 && x >= -(lua_Number)size) return size + (int64_t)x;
    }
    lucid_lua_argerror(L, idx,
                  lua_pushfstring(L, "index: expected 1..%d or -%d..-1 for dim "
                                     "%d of size %d, got %s",
                                  (int)size, (int)size, d + 1, (int)size,
                                  lua_tostring(L, idx)));
    return 0;
}

/* t:select(dim, index) — view with dim removed at index (1-based). */
static int l_select(lua_State *L) {
    lucid_tensor *t = self_tensor(L), *out = NULL;
    int d = check_dim(L, 2, t->ndim, "dim");
    int64_t i = check_index(L, 3, t, d);
    lucid_ctx *ctx = lucid_tensor_ctx(t);
    lucid_status s = lucid_tensor_select(ctx, t, d, i, &out);
    return push_or_fail(L, ctx, s, out);
}

/* t:transpose(dim0, dim1) — view with two dims swapped. */
static int l_transpose(lua_State *L) {
    lucid_tensor *t = self_tensor(L), *out = NULL;
    int d0 = check_dim(L, 2, t->ndim, "dim0");
    int d1 = check_dim(L, 3, t->ndim, "dim1");
    lucid_ctx *ctx = lucid_tensor_ctx(t);
    lucid_status s = lucid_tensor_transpose(ctx, t, d0, d1, &out);
    return push_or_fail(L, ctx, s, out);
}

/* t:t() — transpose of a matrix (a 1-D or 0-d tensor is returned as is). */
static int l_t(lua_State *L) {
    lucid_tensor *t = self_tensor(L), *out = NULL;
    if (t->ndim > 2)
        lucid_lua_argerror(L, 1, lua_pushfstring(L, "self: expected at most 2 dims, "
                                               "got %d (use transpose)",
                                            t->ndim));
    if (t->ndim < 2) {
        lua_pushvalue(L, 1);
        return 1;
    }
    lucid_ctx *ctx = lucid_tensor_ctx(t);
    lucid_status s = lucid_tensor_transpose(ctx, t, 0, 1, &out);
    return push_or_fail(L, ctx, s, out);
}

/* t:permute(d1, d2, ...) or t:permute{d1, d2, ...} — dims 1-based. */
static int l_permute(lua_State *L) {
    lucid_tensor *t = self_tensor(L), *out = NULL;
    int perm[LUCID_MAX_DIMS], seen[LUCID_MAX_DIMS] = {0};
    int table = lua_istable(L, 2);
    int n = table ? (int)lua_objlen(L, 2) : lua_gettop(L) - 1;
    if (n != t->ndim)
        lucid_lua_argerror(L, 2, lua_pushfstring(L, "dims: expected %d dims, got %d",
                                            t->ndim, n));
    for (int i = 0; i < n; i++) {
        int v = 2 + i;
        if (table) {
            lua_rawgeti(L, 2, i + 1);
            v = lua_gettop(L);
        }
        perm[i] = check_dim(L, v, t->ndim, "dims");
        if (seen[perm[i]])
            lucid_lua_argerror(L, table ? 2 : v,
                          lua_pushfstring(L, "dims: dim %d repeated",
                                          perm[i] + 1));
        seen[perm[i]] = 1;
        if (table) lua_pop(L, 1);
    }
    lucid_ctx *ctx = lucid_tensor_ctx(t);
    lucid_status s = lucid_tensor_permute(ctx, t, perm, &out);
    return push_or_fail(L, ctx, s, out);
}

/* ----------------------------------------------------- in-place and values */

/* t:fill_(value) -> t */
static int l_fill_(lua_State *L) {
    lucid_tensor *t = self_tensor(L);
    double v = lucid_lua_checknumber(L, 2);
    lucid_ctx *ctx = lucid_tensor_ctx(t);
    lucid_status s = lucid_fill(ctx, t, v);
    if (s != LUCID_OK) return fail(L, ctx, s, NULL, NULL);
    lua_settop(L, 1);
    return 1;
}

/* t:zero_() -> t */
static int l_zero_(lua_State *L) {
    lua_settop(L, 1);
    lua_pushnumber(L, 0);
    return l_fill_(L);
}

/* Checks of a copy of src (stack index src_idx) into dst (self at 1, or
 * the view t[i] of it: dst_name), before lucid_copy: the engine copies
 * equal shapes (any strides), or equal element counts when both tensors
 * are contiguous (row-major order: Torch7's copy, "the number of elements
 * must match, but the sizes might be different"); a refusal names the
 * counts or the shapes. Then the overlap checks of a written tensor. */
static void check_copy(lua_State *L, const lucid_tensor *dst, const char *dst_name,
                       const lucid_tensor *src, int src_idx, const char *src_name,
                       const char *what) {
    if (!lucid_tensor_same_shape(dst, src)) {
        int64_t nd = lucid_tensor_numel(dst), ns = lucid_tensor_numel(src);
        const char *ds = lucid_lua_push_shape(L, dst->ndim, dst->shape);
        const char *ss = lucid_lua_push_shape(L, src->ndim, src->shape);
        if (nd != ns) {
            char a[24], b[24];
            snprintf(a, sizeof a, "%lld", (long long)ns);
            snprintf(b, sizeof b, "%lld", (long long)nd);
            lucid_lua_argerror(L, src_idx,
                               lua_pushfstring(L, "%s: %s elements (%s) but %s has %s (%s); %s "
                                                  "needs equal element counts (copied in "
                                                  "row-major order, shapes may differ as in "
                                                  "Torch7's copy)",
                                               src_name, a, ss, dst_name, b, ds, what));
        }
        int sc = lucid_tensor_is_contiguous(src);
        if (!sc || !lucid_tensor_is_contiguous(dst))
            lucid_lua_argerror(L, src_idx,
                               lua_pushfstring(L, "%s: shape %s differs from %s's %s and %s is "
                                                  "not contiguous; a copy between different "
                                                  "shapes needs both tensors contiguous "
                                                  "(reshape %s to %s's shape first)",
                                               src_name, ss, dst_name, ds,
                                               sc ? dst_name : src_name, src_name, dst_name));
        lua_pop(L, 2);
    }
    check_internal_overlap(L, dst, 1, "self");
    check_overlap(L, dst, dst_name, src, src_idx, src_name);
}

/* t:copy_(src) -> t — copies src (any dtype, any device of the contexts
 *   involved) into t. src has t's shape (any strides), or -- both
 *   contiguous -- t's element count in another shape: the elements are
 *   copied in row-major order (Torch7's copy: "the number of elements must
 *   match, but the sizes might be different"). Errors name src: another
 *   element count, another shape with a non-contiguous tensor, or (as
 *   PyTorch) a src that partially overlaps t (see partial_overlap). */
static int l_copy_(lua_State *L) {
    lucid_tensor *t = self_tensor(L);
    lucid_tensor *src = lucid_lua_check_tensor(L, 2, "src");
    check_copy(L, t, "self", src, 2, "src", "copy_");
    lucid_ctx *ctx = lucid_tensor_device(src).type == LUCID_CUDA
                         ? lucid_tensor_ctx(src)
                         : lucid_tensor_ctx(t);
    lucid_status s = lucid_copy(ctx, t, src);
    if (s != LUCID_OK) return fail(L, ctx, s, NULL, NULL);
    lua_settop(L, 1);
    return 1;
}

/* t:item() -> number (t must have exactly one element; synchronizes). */
static int l_item(lua_State *L) {
    lucid_tensor *t = self_tensor(L);
    int64_t n = lucid_tensor_numel(t);
    if (n != 1)
        lucid_lua_argerror(L, 1, lua_pushfstring(L, "self: expected a tensor with one "
                                               "element, got %d elements",
                                            (int)n));
    lucid_ctx *ctx = lucid_tensor_ctx(t);
    double v;
    lucid_status s = lucid_tensor_item(ctx, t, &v);
    if (s != LUCID_OK) return fail(L, ctx, s, NULL, NULL);
    lua_pushnumber(L, v);
    return 1;
}

static void totable_rec(lua_State *L, const lucid_tensor *h, int d,
                        const double **p) {
    lua_createtable(L, (int)h->shape[d], 0);
    for (int64_t i = 0; i < h->shape[d]; i++) {
        if (d == h->ndim - 1)
            lua_pushnumber(L, *(*p)++);
        else
            totable_rec(L, h, d + 1, p);
        lua_rawseti(L, -2, (int)(i + 1));
    }
}

/* t:totable() -> nested Lua table of numbers (a number for a 0-d tensor).
 *   Copies to the CPU. Not for hot loops. */
static int l_totable(lua_State *L) {
    lucid_tensor *t = self_tensor(L), *h = NULL;
    lucid_ctx *ctx = lucid_tensor_ctx(t);
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_status s = lucid_tensor_to(ctx, t, cpu, LUCID_F64, &h);
    if (s == LUCID_OK) s = lucid_ctx_synchronize(ctx);
    if (s != LUCID_OK) return fail(L, ctx, s, h, NULL);
    const double *p = lucid_tensor_data(h);
    /* lua_createtable can only fail on Lua OOM; h is then leaked, which a
     * protected call would avoid at the cost of one pcall per totable. */
    if (h->ndim == 0)
        lua_pushnumber(L, p[0]);
    else
        totable_rec(L, h, 0, &p);
    lucid_tensor_release(h);
    return 1;
}

/* -------------------------------------------------------------- arithmetic */

/* Result dtype of a binary op on two tensors. */
static lucid_dtype promote(lucid_dtype a, lucid_dtype b) {
    if (a == b) return a;
    int fa = lucid_dtype_is_float(a), fb = lucid_dtype_is_float(b);
    if (fa && !fb) return a;
    if (fb && !fa) return b;
    if (fa && fb) {
        if (a == LUCID_F64 || b == LUCID_F64) return LUCID_F64;
        return LUCID_F32; /* f32 with a half type, or bf16 with f16 */
    }
    if (a == LUCID_I64 || b == LUCID_I64) return LUCID_I64;
    return LUCID_I32;
}

/* NumPy broadcast of a and b; raises naming both shapes. */
static int broadcast_shape(lua_State *L, const lucid_tensor *a,
                           const lucid_tensor *b, int64_t *shape) {
    int n = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int i = 0; i < n; i++) {
        int ia = i - (n - a->ndim), ib = i - (n - b->ndim);
        int64_t x = ia >= 0 ? a->shape[ia] : 1, y = ib >= 0 ? b->shape[ib] : 1;
        if (x != y && x != 1 && y != 1) {
            luaL_Buffer buf;
            luaL_buffinit(L, &buf);
            for (int k = 0; k < 2; k++) {
                const lucid_tensor *t = k ? b : a;
                luaL_addstring(&buf, k ? " and " : "shapes ");
                luaL_addchar(&buf, '{');
                for (int j = 0; j < t->ndim; j++) {
                    lua_pushfstring(L, j ? ",%d" : "%d", (int)t->shape[j]);
                    luaL_addvalue(&buf);
                }
                luaL_addchar(&buf, '}');
            }
            luaL_addstring(&buf, " do not broadcast");
            luaL_pushresult(&buf);
            lucid_lua_argerror(L, 2, lua_tostring(L, -1));
        }
        shape[i] = x == 1 ? y : x;
    }
    return n;
}

/* A tensor operand or a number at idx (a number sets *num, returns NULL). */
static lucid_tensor *tensor_or_number(lua_State *L, int idx, double *num,
                                      const char *name) {
    if (lua_type(L, idx) == LUA_TNUMBER) {
        *num = lua_tonumber(L, idx);
        return NULL;
    }
    if (!luaL_testudata(L, idx, LUCID_LUA_TENSOR_MT))
        lucid_lua_argerror(L, idx,
                      lua_pushfstring(L, "%s: expected lucid.Tensor or number, "
                                         "got %s",
                                      name, luaL_typename(L, idx)));
    return lucid_lua_check_tensor(L, idx, name);
}

/* The options table of the binary ops (argument 3): only `out`; a string
 * key is an unknown option, a positional entry ({r} for {out = r}) is
 * named as such. */
static void check_out_keys(lua_State *L) {
    static const char *const keys[] = {"out", NULL};
    if (!lucid_lua_unknown_option(L, 3, keys)) return;
    const char *list = lua_tostring(L, -1);
    int kt = lua_type(L, -2);
    if (kt == LUA_TSTRING)
        lucid_lua_argerror(L, 3, lua_pushfstring(L, "opts: unknown option '%s' (expected one of %s)",
                                                 lua_tostring(L, -2), list));
    if (kt == LUA_TNUMBER) {
        lua_pushvalue(L, -2);
        lua_gettable(L, 3);
        const char *vt = lucid_lua_type_name(L, -1);
        lua_pushvalue(L, -3);
        const char *k = lua_tostring(L, -1); /* converts the copy only */
        lucid_lua_argerror(L, 3, lua_pushfstring(L, "opts: positional entry [%s] (a %s) in the "
                                                    "options table; options are named: "
                                                    "{out = tensor}",
                                                 k, vt));
    }
    lucid_lua_argerror(L, 3, lua_pushfstring(L, "opts: unexpected %s key in the options table "
                                                "(expected one of %s)",
                                             lucid_lua_type_name(L, -2), list));
}

/* The `out` option of the out-of-place binary ops ({out = t} as argument
 * 3): NULL (nothing pushed) when absent; else t, its userdata pushed, after
 * checking that it has the result's shape and dtype and lives on base's
 * device (type and index: the engine's requirement for every operand; a
 * tensor of another context on that device is accepted, as the inputs
 * are, and the op runs on the context of its first tensor operand). The
 * result is written into it, so nothing is allocated. Raises "bad argument
 * #3 (out): ..." (#2 in the method form) naming what differs; unknown
 * option keys are refused. */
static lucid_tensor *binary_out(lua_State *L, const lucid_tensor *base,
                                lucid_dtype dt, int ndim, const int64_t *shape) {
    if (lua_type(L, 3) != LUA_TTABLE) {
        if (!lua_isnoneornil(L, 3))
            lucid_lua_argerror(L, 3, lua_pushfstring(L, "opts: expected an options table "
                                                        "{out = tensor}, got %s",
                                                     lucid_lua_type_name(L, 3)));
        return NULL;
    }
    check_out_keys(L);
    lua_getfield(L, 3, "out");
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        return NULL;
    }
    lucid_tensor **box = luaL_testudata(L, -1, LUCID_LUA_TENSOR_MT);
    if (!box)
        lucid_lua_argerror(L, 3, lua_pushfstring(L, "out: expected lucid.Tensor, got %s",
                                                 lucid_lua_type_name(L, -1)));
    if (!*box) lucid_lua_argerror(L, 3, "out: tensor was freed");
    lucid_tensor *out = *box;
    int same = out->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = out->shape[i] == shape[i];
    if (!same) lucid_lua_argerror(L, 3, "out: its shape differs from the result's");
    if (out->dtype != dt)
        lucid_lua_argerror(L, 3, lua_pushfstring(L, "out: dtype %s, the result is %s",
                                                 lucid_dtype_name(out->dtype),
                                                 lucid_dtype_name(dt)));
    lucid_device od = lucid_tensor_device(out), bd = lucid_tensor_device(base);
    if (od.type != bd.type || od.index != bd.index) {
        char x[32], y[32];
        lucid_lua_argerror(L, 3, lua_pushfstring(L, "out: on another device (%s; the result "
                                                    "is on %s)",
                                                 dev_name(od, x, sizeof x),
                                                 dev_name(bd, y, sizeof y)));
    }
    check_internal_overlap(L, out, 3, "out");
    return out;
}

/* out = a (op) b for tensors/numbers at 1 and 2, broadcasting; in place
 * (into the tensor at 1) when inplace. */
static int binary(lua_State *L, lucid_binary_op op, int inplace) {
    double na = 0, nb = 0;
    lucid_tensor *a = tensor_or_number(L, 1, &na, "self");
    lucid_tensor *b = tensor_or_number(L, 2, &nb, "other");
    if (!a && !b) lucid_lua_argerror(L, 1, "expected at least one lucid.Tensor");
    if (inplace && !a) lucid_lua_argerror(L, 1, "self: expected lucid.Tensor");
    const lucid_tensor *base = a ? a : b;
    if (inplace) check_float_dtype(L, 1, "self", a->dtype);
    else if (!lucid_dtype_is_float(a && b ? promote(a->dtype, b->dtype) : base->dtype))
        check_float_dtype(L, a ? 1 : 2, a ? "self" : "other", base->dtype);
    lucid_ctx *ctx = lucid_tensor_ctx(base);
    lucid_status s;
    if (inplace) {
        check_internal_overlap(L, a, 1, "self");
        check_overlap(L, a, "self", b, 2, "other");
        s = b ? lucid_binary(ctx, op, a, a, b)
              : lucid_binary_scalar(ctx, op, a, a, nb, 0);
        if (s != LUCID_OK) return fail(L, ctx, s, NULL, NULL);
        lua_settop(L, 1);
        return 1;
    }
    int64_t shape[LUCID_MAX_DIMS];
    int ndim = base->ndim;
    lucid_dtype dt = base->dtype;
    if (a && b) {
        ndim = broadcast_shape(L, a, b, shape);
        dt = promote(a->dtype, b->dtype);
    } else {
        memcpy(shape, base->shape, sizeof shape);
    }
    lucid_tensor *into = binary_out(L, base, dt, ndim, shape);
    if (into) { /* the out option: written in place, its own userdata returned */
        int idx = lua_gettop(L);
        check_overlap(L, into, "out", a, 1, "self");
        check_overlap(L, into, "out", b, 2, "other");
        s = a && b ? lucid_binary(ctx, op, into, a, b)
            : a    ? lucid_binary_scalar(ctx, op, into, a, nb, 0)
                   : lucid_binary_scalar(ctx, op, into, b, na, 1);
        if (s != LUCID_OK) return fail(L, ctx, s, NULL, NULL);
        lua_pushvalue(L, idx);
        return 1;
    }
    lucid_tensor *out = new_tensor(L, ctx, lucid_tensor_device(base), dt, ndim, shape);
    if (a && b)
        s = lucid_binary(ctx, op, out, a, b);
    else if (a)
        s = lucid_binary_scalar(ctx, op, out, a, nb, 0);
    else
        s = lucid_binary_scalar(ctx, op, out, b, na, 1);
    return push_or_fail(L, ctx, s, out);
}

/*
 * t:add(x [, {out = r}]) / :sub / :mul / :div / :pow / :maximum / :minimum
 *   x: tensor (NumPy broadcasting; the result dtype is the wider float
 *   dtype) or number. Also the metamethods + - * / ^ (a number may come
 *   first: 2 - t) and lucid.add(a, b [, {out = r}]) ... In place:
 *   :add_(x) / :sub_ / :mul_ / :div_ return t (x broadcasts to t's shape).
 *   out (as torch.add's out=): a tensor of the result's shape, dtype and
 *   device (type and index; its context may be another one, as the
 *   inputs') that receives the result and is returned; the values are those
 *   of the call without out, bit for bit.
 *   Errors: "bad argument #2 (out)" (#3 in lucid.add) for an out that is no
 *   tensor (or freed) or has another shape, dtype or device; "bad argument
 *   #2 (opts)" for an unknown option key or a positional entry ({r});
 *   PyTorch's "unsupported operation: some elements of the input tensor
 *   (...) and the written-to tensor (...) refer to a single memory
 *   location. Please clone() ..." naming the input (self / other) when it
 *   partially overlaps the written tensor (out, or self in place): only
 *   another storage, the identical view (out = self, a:add_(a)) or a
 *   disjoint byte range of the same storage are accepted (see
 *   partial_overlap); "more than one element of the written-to tensor
 *   refers to a single memory location" for a written tensor with a
 *   stride-0 dim.
 */
static int l_add(lua_State *L) { return binary(L, LUCID_OP_ADD, 0); }
static int l_sub(lua_State *L) { return binary(L, LUCID_OP_SUB, 0); }
static int l_mul(lua_State *L) { return binary(L, LUCID_OP_MUL, 0); }
static int l_div(lua_State *L) { return binary(L, LUCID_OP_DIV, 0); }
static int l_pow(lua_State *L) { return binary(L, LUCID_OP_POW, 0); }
static int l_maximum(lua_State *L) { return binary(L, LUCID_OP_MAX, 0); }
static int l_minimum(lua_State *L) { return binary(L, LUCID_OP_MIN, 0); }
static int l_add_(lua_State *L) { return binary(L, LUCID_OP_ADD, 1); }
static int l_sub_(lua_State *L) { return binary(L, LUCID_OP_SUB, 1); }
static int l_mul_(lua_State *L) { return binary(L, LUCID_OP_MUL, 1); }
static int l_div_(lua_State *L) { return binary(L, LUCID_OP_DIV, 1); }

/* t:exp() / :log() / :sqrt() / :abs() / :neg() / :sigmoid() / :silu() /
 *   :tanh() / :relu() / :square() — elementwise, same shape and dtype
 *   (float dtypes). */
static int unary(lua_State *L, lucid_unary_op op) {
    lucid_tensor *a = self_tensor(L);
    check_float_dtype(L, 1, "self", a->dtype);
    lucid_ctx *ctx = lucid_tensor_ctx(a);
    lucid_tensor *out = new_tensor(L, ctx, lucid_tensor_device(a), a->dtype,
                                   a->ndim, a->shape);
    lucid_status s = lucid_unary(ctx, op, out, a);
    return push_or_fail(L, ctx, s, out);
}

static int l_exp(lua_State *L) { return unary(L, LUCID_OP_EXP); }
static int l_log(lua_State *L) { return unary(L, LUCID_OP_LOG); }
static int l_sqrt(lua_State *L) { return unary(L, LUCID_OP_SQRT); }
static int l_abs(lua_State *L) { return unary(L, LUCID_OP_ABS); }
static int l_neg(lua_State *L) { return unary(L, LUCID_OP_NEG); }
static int l_sigmoid(lua_State *L) { return unary(L, LUCID_OP_SIGMOID); }
static int l_silu(lua_State *L) { return unary(L, LUCID_OP_SILU); }
static int l_tanh(lua_State *L) { return unary(L, LUCID_OP_TANH); }
static int l_relu(lua_State *L) { return unary(L, LUCID_OP_RELU); }
static int l_square(lua_State *L) { return unary(L, LUCID_OP_SQUARE); }

/* ---------------------------------------------------------------- reduce */

/*
 * t:sum([dim], [keepdim]) / :mean / :max / :min
 *   Without dim: a 0-d tensor over all elements. With dim (1-based): the
 *   shape with dim removed (or kept as 1). max/min return values only.
 *   Float inputs keep their dtype; integer inputs reduce into f32.
 *   Empty tensors follow PyTorch: the sum of no elements is 0, their mean
 *   nan (t:mean() of a [0,3] tensor is nan, t:mean(1) is [nan,nan,nan]);
 *   max/min of no elements raise ("bad self: expected reduction dim to be
 *   specified for an empty tensor", or "bad argument #1 (dim): expected
 *   reduction dim 1 to have non-zero size").
 */
static int reduce(lua_State *L, lucid_reduce_op op) {
    lucid_tensor *a = self_tensor(L);
    lucid_ctx *ctx = lucid_tensor_ctx(a);
    lucid_dtype dt = lucid_dtype_is_float(a->dtype) ? a->dtype : LUCID_F32;
    int minmax = op == LUCID_REDUCE_MAX || op == LUCID_REDUCE_MIN;
    const char *opname = op == LUCID_REDUCE_MAX ? "max" : "min";
    lucid_status s;
    if (lua_isnoneornil(L, 2)) {
        int empty = lucid_tensor_numel(a) == 0;
        if (empty && minmax)
            lucid_lua_argerror(L, 1, lua_pushfstring(L, "self: expected reduction dim to be "
                                                        "specified for an empty tensor (%s, 0 "
                                                        "elements); %s of no elements is "
                                                        "undefined (as in PyTorch)",
                                                     lucid_lua_push_shape(L, a->ndim, a->shape),
                                                     opname));
        lucid_tensor *out = new_tensor(L, ctx, lucid_tensor_device(a), dt, 0,
                                       NULL);
        if (empty && op == LUCID_REDUCE_MEAN)
            s = lucid_fill(ctx, out, NAN); /* 0/0, as torch.mean */
        else
            s = lucid_reduce_all(ctx, op, out, a);
        return push_or_fail(L, ctx, s, out);
    }
    int d = check_dim(L, 2, a->ndim, "dim");
    int keep = lua_toboolean(L, 3);
    int empty = a->shape[d] == 0;
    if (empty && minmax)
        lucid_lua_argerror(L, 2, lua_pushfstring(L, "dim: expected reduction dim %s to have "
                                                    "non-zero size, the tensor is %s",
                                                 lua_tostring(L, 2),
                                                 lucid_lua_push_shape(L, a->ndim, a->shape)));
    int64_t shape[LUCID_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < a->ndim; i++) {
        if (i == d && !keep) continue;
        shape[n++] = i == d ? 1 : a->shape[i];
    }
    lucid_tensor *out = new_tensor(L, ctx, lucid_tensor_device(a), dt, n, shape);
    if (empty && op == LUCID_REDUCE_MEAN)
        s = lucid_fill(ctx, out, NAN);
    else
        s = lucid_reduce_dim(ctx, op, out, a, d, keep);
    return push_or_fail(L, ctx, s, out);
}

static int l_sum(lua_State *L) { return reduce(L, LUCID_REDUCE_SUM); }
static int l_mean(lua_State *L) { return reduce(L, LUCID_REDUCE_MEAN); }
static int l_max(lua_State *L) { return reduce(L, LUCID_REDUCE_MAX); }
static int l_min(lua_State *L) { return reduce(L, LUCID_REDUCE_MIN); }

/* t:norm([p]) -> 0-d tensor, the 2-norm over all elements (p must be 2). */
static int l_norm(lua_State *L) {
    lucid_tensor *a = self_tensor(L);
    if (!lua_isnoneornil(L, 2) && lucid_lua_checknumber(L, 2) != 2)
        lucid_lua_argerror(L, 2, lua_pushfstring(L, "p: only the 2-norm is "
                                               "implemented, got %s",
                                            lua_tostring(L, 2)));
    lua_settop(L, 1);
    (void)a;
    return reduce(L, LUCID_REDUCE_NORM2);
}

/* ---------------------------------------------------------------- matmul */

/* A contiguous operand for lucid_matmul: x itself, its transpose with
 * *trans = 1, or a contiguous copy. */
static lucid_status matmul_operand(lucid_ctx *ctx, const lucid_tensor *x,
                                   lucid_tensor **use, int *trans) {
    *trans = 0;
    if (lucid_tensor_is_contiguous(x)) {
        lucid_tensor_retain((lucid_tensor *)x);
        *use = (lucid_tensor *)x;
        return LUCID_OK;
    }
    lucid_tensor *tv = NULL;
    lucid_status s = lucid_tensor_transpose(ctx, x, x->ndim - 2, x->ndim - 1, &tv);
    if (s != LUCID_OK) return s;
    if (lucid_tensor_is_contiguous(tv)) {
        *use = tv;
        *trans = 1;
        return LUCID_OK;
    }
    lucid_tensor_release(tv);
    return lucid_tensor_clone(ctx, x, use);
}

/* A view of x with a size-1 dim inserted at position d (0 or 1), for 1-D
 * operands. */
static lucid_status unsqueeze(lucid_ctx *ctx, const lucid_tensor *x, int d,
                              lucid_tensor **out) {
    int64_t shape[2];
    shape[d] = 1;
    shape[1 - d] = x->shape[0];
    int64_t strides[2] = {x->strides[0], x->strides[0]};
    return lucid_tensor_from_storage(ctx, x->storage, x->dtype, 2, shape,
                                     strides, x->offset, out);
}

/*
 * a:matmul(b) / lucid.matmul(a, b) — matrix product.
 *   a [..., M, K] @ b [..., K, N] -> [..., M, N] (equal batch dims), or with
 *   1-D operands: [K] @ [K, N] -> [N], [M, K] @ [K] -> [M], [K] @ [K] -> 0-d.
 *   Same float dtype on both; transposed views are used without a copy.
 */
static int l_matmul(lua_State *L) {
    lucid_tensor *a = lucid_lua_check_tensor(L, 1, "self");
    lucid_tensor *b = lucid_lua_check_tensor(L, 2, "other");
    if (a->ndim == 0 || b->ndim == 0)
        lucid_lua_argerror(L, a->ndim == 0 ? 1 : 2, "expected at least 1 dim, got a "
                                                "0-d tensor");
    if (a->ndim > 2 && b->ndim != a->ndim)
        lucid_lua_argerror(L, 2, lua_pushfstring(L, "other: expected %d dims like "
                                               "self, got %d",
                                            a->ndim, b->ndim));
    if (b->ndim > 2 && a->ndim != b->ndim)
        lucid_lua_argerror(L, 2, lua_pushfstring(L, "other: %d dims but self has %d",
                                            b->ndim, a->ndim));
    check_float_dtype(L, 1, "self", a->dtype);
    check_float_dtype(L, 2, "other", b->dtype);
    lucid_ctx *ctx = lucid_tensor_ctx(a);
    lucid_tensor *a2 = NULL, *b2 = NULL, *ua = NULL, *ub = NULL, *out = NULL;
    int ta = 0, tb = 0;
    lucid_status s = LUCID_OK;
    /* 1-D operands become [1,K] and [K,1] views */
    if (a->ndim == 1) s = unsqueeze(ctx, a, 0, &a2);
    else { lucid_tensor_retain(a); a2 = a; }
    if (s == LUCID_OK) {
        if (b->ndim == 1) s = unsqueeze(ctx, b, 1, &b2);
        else { lucid_tensor_retain(b); b2 = b; }
    }
    if (s == LUCID_OK) s = matmul_operand(ctx, a2, &ua, &ta);
    if (s == LUCID_OK) s = matmul_operand(ctx, b2, &ub, &tb);
    lucid_tensor_release(a2);
    lucid_tensor_release(b2);
    if (s != LUCID_OK) return fail(L, ctx, s, ua, ub);
    int n = ua->ndim;
    int64_t shape[LUCID_MAX_DIMS];
    memcpy(shape, ua->shape, sizeof shape);
    shape[n - 2] = ta ? ua->shape[n - 1] : ua->shape[n - 2];
    shape[n - 1] = tb ? ub->shape[n - 2] : ub->shape[n - 1];
    s = lucid_tensor_zeros(ctx, lucid_tensor_device(a), a->dtype, n, shape, &out);
    if (s == LUCID_OK) s = lucid_matmul(ctx, out, ua, ub, ta, tb, 1.0, 0.0);
    lucid_tensor_release(ua);
    lucid_tensor_release(ub);
    if (s != LUCID_OK) return fail(L, ctx, s, out, NULL);
    if (a->ndim == 1 || b->ndim == 1) { /* drop the inserted dims */
        int64_t rs[1];
        int rn = 0;
        if (a->ndim != 1) rs[rn++] = shape[0];
        if (b->ndim != 1) rs[rn++] = shape[1];
        lucid_tensor *v = NULL;
        s = lucid_tensor_view(ctx, out, rn, rs, &v);
        lucid_tensor_release(out);
        out = v;
    }
    return push_or_fail(L, ctx, s, out);
}

/* ------------------------------------------------------------ metamethods */

static int l_gc(lua_State *L) { return l_free(L); }

/* tostring(t) — PyTorch-style text (engine/core/format.c). */
static int l_tostring(lua_State *L) {
    lucid_tensor **box = lucid_lua_checkudata(L, 1, LUCID_LUA_TENSOR_MT);
    if (!*box) {
        lua_pushliteral(L, "lucid.Tensor(freed)");
        return 1;
    }
    lucid_tensor *t = *box;
    lucid_ctx *ctx = lucid_tensor_ctx(t);
    char small[1024];
    int n = lucid_tensor_format(ctx, t, small, sizeof small);
    if (n < 0) return fail(L, ctx, lucid_ctx_last_status(ctx), NULL, NULL);
    if ((size_t)n < sizeof small) {
        lua_pushlstring(L, small, (size_t)n);
        return 1;
    }
    char *big = lua_newuserdata(L, (size_t)n + 1); /* GC-owned scratch */
    int m = lucid_tensor_format(ctx, t, big, (size_t)n + 1);
    if (m < 0) return fail(L, ctx, lucid_ctx_last_status(ctx), NULL, NULL);
    lua_pushlstring(L, big, (size_t)(m < n ? m : n));
    return 1;
}

/* #t — size of the first dim. */
static int l_len(lua_State *L) {
    lucid_tensor *t = self_tensor(L);
    if (t->ndim == 0)
        lucid_lua_argerror(L, 1, "self: length of a 0-d tensor");
    lua_pushnumber(L, (lua_Number)t->shape[0]);
    return 1;
}

/* a == b — identity (the same tensor object). */
static int l_eq(lua_State *L) {
    lucid_tensor *a = lucid_lua_to_tensor(L, 1), *b = lucid_lua_to_tensor(L, 2);
    lua_pushboolean(L, lua_rawequal(L, 1, 2) || (a && a == b));
    return 1;
}

static int l_unm(lua_State *L) {
    lua_settop(L, 1);
    return l_neg(L);
}

/* t[i] — i (1-based, negative from the end) along the first dim: a view,
 *   or a number for a 1-D tensor. t.name — methods. */
static int l_index(lua_State *L) {
    if (lua_type(L, 2) == LUA_TNUMBER) {
        lucid_tensor *t = self_tensor(L), *out = NULL;
        if (t->ndim == 0) lucid_lua_argerror(L, 2, "index: a 0-d tensor has no dims");
        int64_t i = check_index(L, 2, t, 0);
        lucid_ctx *ctx = lucid_tensor_ctx(t);
        lucid_status s = lucid_tensor_select(ctx, t, 0, i, &out);
        if (s != LUCID_OK) return fail(L, ctx, s, NULL, NULL);
        if (out->ndim > 0) {
            lucid_lua_push_tensor(L, out);
            return 1;
        }
        double v;
        s = lucid_tensor_item(ctx, out, &v);
        lucid_tensor_release(out);
        if (s != LUCID_OK) return fail(L, ctx, s, NULL, NULL);
        lua_pushnumber(L, v);
        return 1;
    }
    lua_pushvalue(L, 2);
    lua_rawget(L, lua_upvalueindex(1));
    return 1;
}

/* t[i] = x — fills (number x) or copies into (tensor x) the view t[i]
 *   (as t[i]:copy_(x): t[i]'s shape, or its element count with both
 *   contiguous; an x that partially overlaps t[i] is refused). */
static int l_newindex(lua_State *L) {
    lucid_tensor *t = self_tensor(L), *row = NULL;
    if (lua_type(L, 2) != LUA_TNUMBER)
        lucid_lua_argerror(L, 2, lua_pushfstring(L, "key: expected a number index, "
                                               "got %s (tensor fields are "
                                               "read-only)",
                                            luaL_typename(L, 2)));
    if (t->ndim == 0) lucid_lua_argerror(L, 2, "index: a 0-d tensor has no dims");
    int64_t i = check_index(L, 2, t, 0);
    double v = 0;
    lucid_tensor *src = tensor_or_number(L, 3, &v, "value");
    lucid_ctx *ctx = src && lucid_tensor_device(src).type == LUCID_CUDA
                         ? lucid_tensor_ctx(src)
                         : lucid_tensor_ctx(t);
    lucid_status s = lucid_tensor_select(ctx, t, 0, i, &row);
    if (s == LUCID_OK && src) {
        /* row is a C temporary: keep it in a userdata while the checks may raise */
        lucid_lua_push_tensor(L, row);
        check_copy(L, row, "t[i]", src, 3, "value", "t[i] = x");
        lucid_tensor_retain(row);
        lua_pop(L, 1);
    }
    if (s == LUCID_OK) s = src ? lucid_copy(ctx, row, src) : lucid_fill(ctx, row, v);
    if (s != LUCID_OK) return fail(L, ctx, s, row, NULL);
    lucid_tensor_release(row);
    return 0;
}

/* ----------------------------------------------------------- registration */

/* lucid.is_tensor(x) -> boolean (true for freed tensors too) */
static int l_is_tensor(lua_State *L) {
    lua_pushboolean(L, luaL_testudata(L, 1, LUCID_LUA_TENSOR_MT) != NULL);
    return 1;
}

static const luaL_Reg tensor_methods[] = {
    /* metadata */
    {"shape", l_shape}, {"size", l_size}, {"dim", l_dim}, {"numel", l_numel},
    {"dtype", l_dtype}, {"device", l_device}, {"is_contiguous", l_is_contiguous},
    {"storage_version", l_storage_version}, {"free", l_free},
    /* conversions */
    {"to", l_to}, {"float", l_float}, {"double", l_double}, {"bf16", l_bf16},
    {"half", l_half}, {"cuda", l_cuda}, {"cpu", l_cpu}, {"clone", l_clone},
    {"contiguous", l_contiguous},
    /* views */
    {"view", l_view}, {"reshape", l_reshape}, {"narrow", l_narrow},
    {"select", l_select}, {"transpose", l_transpose}, {"permute", l_permute},
    {"t", l_t},
    /* values */
    {"fill_", l_fill_}, {"zero_", l_zero_}, {"copy_", l_copy_},
    {"item", l_item}, {"totable", l_totable},
    /* arithmetic */
    {"add", l_add}, {"sub", l_sub}, {"mul", l_mul}, {"div", l_div},
    {"pow", l_pow}, {"maximum", l_maximum}, {"minimum", l_minimum},
    {"add_", l_add_}, {"sub_", l_sub_}, {"mul_", l_mul_}, {"div_", l_div_},
    {"exp", l_exp}, {"log", l_log}, {"sqrt", l_sqrt}, {"abs", l_abs},
    {"neg", l_neg}, {"sigmoid", l_sigmoid}, {"silu", l_silu},
    {"tanh", l_tanh}, {"relu", l_relu}, {"square", l_square},
    /* reductions, products */
    {"sum", l_sum}, {"mean", l_mean}, {"max", l_max}, {"min", l_min},
    {"norm", l_norm}, {"matmul", l_matmul},
    {NULL, NULL},
};

static const luaL_Reg tensor_meta[] = {
    {"__gc", l_gc}, {"__tostring", l_tostring}, {"__len", l_len},
    {"__eq", l_eq}, {"__unm", l_unm}, {"__add", l_add}, {"__sub", l_sub},
    {"__mul", l_mul}, {"__div", l_div}, {"__pow", l_pow},
    {"__newindex", l_newindex},
    {NULL, NULL},
};

static const luaL_Reg module_funcs[] = {
    {"empty", l_empty}, {"zeros", l_zeros}, {"ones", l_ones}, {"full", l_full},
    {"tensor", l_tensor}, {"rand", l_rand}, {"randn", l_randn},
    {"arange", l_arange}, {"is_tensor", l_is_tensor},
    /* functional forms: lucid.add(a, b) == a:add(b), ... */
    {"matmul", l_matmul}, {"add", l_add}, {"sub", l_sub}, {"mul", l_mul},
    {"div", l_div}, {"pow", l_pow}, {"maximum", l_maximum},
    {"minimum", l_minimum}, {"exp", l_exp}, {"log", l_log}, {"sqrt", l_sqrt},
    {"abs", l_abs}, {"neg", l_neg}, {"sigmoid", l_sigmoid}, {"silu", l_silu},
    {"tanh", l_tanh}, {"relu", l_relu}, {"sum", l_sum}, {"mean", l_mean},
    {"norm", l_norm},
    {NULL, NULL},
};

/* Registers the Tensor metatable (methods reachable through __index, which
 * also serves numeric indexing) and the constructors into the module table
 * on top of the stack. The method table is also exposed as lucid.Tensor so
 * Lua code can add methods; opening the module again in the same lua_State
 * reuses the registered metatable and method table. */
#define METHODS_KEY "lucid.Tensor.methods"
int lucid_lua_open_tensor(lua_State *L) {
    int module = lua_gettop(L);
    if (luaL_newmetatable(L, LUCID_LUA_TENSOR_MT)) {
        lua_pushliteral(L, LUCID_LUA_TENSOR_MT);
        lua_setfield(L, -2, "__name");
        luaL_setfuncs(L, tensor_meta, 0);
        lua_newtable(L);
        luaL_setfuncs(L, tensor_methods, 0);
        lua_pushvalue(L, -1);
        lua_setfield(L, LUA_REGISTRYINDEX, METHODS_KEY);
        lua_pushcclosure(L, l_index, 1);
        lua_setfield(L, -2, "__index");
    }
    lua_pop(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, METHODS_KEY);
    lua_setfield(L, module, "Tensor");
    luaL_setfuncs(L, module_funcs, 0);
    return 0;
}
