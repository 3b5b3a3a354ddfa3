/*
 * lua_hash.c — value-byte hashes for reproducibility checks (bench/fit_pairs.lua).
 *
 *   lucid.hash_tensor(t [, h]) -> "16 hex digits"
 *   lucid.hash_string(s [, h]) -> "16 hex digits"
 *
 * 64-bit FNV-1a (offset basis 0xcbf29ce484222325, prime 0x100000001b3) over
 * the bytes of the tensor's contents in row-major element order (a CUDA or
 * strided tensor is first copied to a contiguous host tensor of the same
 * dtype, so the hash depends only on the values, their dtype width and their
 * order, never on the device or the layout), or over the bytes of a string.
 * The optional h (a previous result) continues that hash instead of starting
 * from the offset basis, so a sequence of tensors hashes as one stream:
 *   local h; for _, t in ipairs(list) do h = lucid.hash_tensor(t, h) end
 * Hashing a CUDA tensor synchronizes (the copy to the host). Errors: a bad h
 * (not 16 hex digits) or a freed tensor raise naming the argument.
 *
 * FNV-1a here rather than a hashing library: the GPU machine gets its Lua
 * modules from a packed runtime (tools/gpu-pack.sh), and a C hash over the
 * tensor memory avoids copying every tensor into a Lua string. It is a
 * fingerprint for "the bytes are identical", not a cryptographic hash.
 */
#include "lua_common.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= FNV_PRIME;
    }
    return h;
}

static uint64_t opt_seed(lua_State *L, int idx) {
    if (lua_isnoneornil(L, idx)) return FNV_OFFSET;
    size_t len;
    const char *s = lua_tolstring(L, idx, &len);
    char *end = NULL;
    uint64_t h = 0;
    if (s && len == 16 && lua_type(L, idx) == LUA_TSTRING)
        h = strtoull(s, &end, 16);
    if (!s || len != 16 || lua_type(L, idx) != LUA_TSTRING || end != s + 16)
        lucid_lua_argerror(L, idx, lua_pushfstring(L, "h: expected a previous hash "
                                                 "(16 hex digits), got %s",
                                              luaL_typename(L, idx)));
    return h;
}

static int push_hash(lua_State *L, uint64_t h) {
    char buf[17];
    snprintf(buf, sizeof buf, "%016" PRIx64, h);
    lua_pushlstring(L, buf, 16);
    return 1;
}

static int l_hash_tensor(lua_State *L) {
    lucid_tensor *t = lucid_lua_check_tensor(L, 1, "t");
    uint64_t h = opt_seed(L, 2);
    size_t n = lucid_tensor_nbytes(t);
    if (n == 0) return push_hash(L, h);
    if (lucid_tensor_device(t).type == LUCID_CPU && lucid_tensor_is_contiguous(t)) {
        h = fnv1a(h, (const unsigned char *)lucid_tensor_data(t), n);
        return push_hash(L, h);
    }
    lucid_ctx *ctx = lucid_tensor_ctx(t);
    lucid_tensor *host = NULL;
    lucid_device cpu = {LUCID_CPU, 0};
    lucid_status s = lucid_tensor_to(ctx, t, cpu, t->dtype, &host);
    if (s == LUCID_OK) s = lucid_ctx_synchronize(ctx);
    if (s != LUCID_OK) {
        if (host) lucid_tensor_release(host);
        return lucid_lua_raise(L, ctx, s);
    }
    h = fnv1a(h, (const unsigned char *)lucid_tensor_data(host),
              lucid_tensor_nbytes(host));
    lucid_tensor_release(host);
    return push_hash(L, h);
}

static int l_hash_string(lua_State *L) {
    size_t n;
    const char *s = lucid_lua_checklstring(L, 1, &n);
    uint64_t h = opt_seed(L, 2);
    return push_hash(L, fnv1a(h, (const unsigned char *)s, n));
}

int lucid_lua_open_hash(lua_State *L) {
    lua_pushcfunction(L, l_hash_tensor);
    lua_setfield(L, -2, "hash_tensor");
    lua_pushcfunction(L, l_hash_string);
    lua_setfield(L, -2, "hash_string");
    return 0;
}
