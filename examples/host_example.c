/*
 * host_example.c — a minimal host application embedding lucid.
 *
 * It creates a context and a tensor through the engine's C API
 * (engine/lucid.h), opens the Lua module through the Lua C API, hands the
 * tensor to a Lua chunk that builds more tensors and computes a value, then
 * reads the results back two ways: the returned number through the Lua C
 * API, and the returned tensor through the engine C API (lucid_reduce_item,
 * lucid_tensor_to + lucid_tensor_data). It prints both and exits non-zero
 * when either differs from the value computed by hand.
 *
 *   build/examples/host_example        (built by `make`)
 */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lua_common.h" /* lucid_lua_push_tensor / lucid_lua_to_tensor */
#include "lucid.h"

int luaopen_lucid(lua_State *L);

/* x is the host's tensor: 2x2 filled with 0.5. */
static const char CHUNK[] =
    "local lucid = require 'lucid'\n"
    "local x = ...\n"
    "local a = lucid.tensor{{1, 2}, {3, 4}}\n"
    "local b = lucid.tensor{{5, 6}, {7, 8}}\n"
    "local c = a:matmul(b) + x   -- {{19.5, 22.5}, {43.5, 50.5}}\n"
    "return c:sum():item(), c\n";

/* Hand-computed: sum of {{19,22},{43,50}} + 4 * 0.5. */
static const double EXPECTED_SUM = 136.0;
static const double EXPECTED_C[4] = {19.5, 22.5, 43.5, 50.5};

static int check(const char *what, double got, double want) {
    int ok = fabs(got - want) <= 1e-5 * (1 + fabs(want));
    printf("%-32s %10.4f  (expected %.4f) %s\n", what, got, want,
           ok ? "ok" : "MISMATCH");
    return ok;
}

int main(void) {
    int ok = 1;
    /* 1. engine C API: a context and a tensor */
    lucid_ctx *ctx = NULL;
    char err[256];
    lucid_ctx_options opt = lucid_ctx_options_default();
    if (lucid_ctx_create(&opt, &ctx, err, sizeof err) != LUCID_OK) {
        fprintf(stderr, "host_example: context: %s\n", err);
        return 1;
    }
    int64_t shape[2] = {2, 2};
    lucid_tensor *x = NULL;
    if (lucid_tensor_empty(ctx, opt.device, LUCID_F32, 2, shape, &x) != LUCID_OK ||
        lucid_fill(ctx, x, 0.5) != LUCID_OK) {
        fprintf(stderr, "host_example: %s\n", lucid_ctx_error(ctx));
        lucid_tensor_release(x);
        lucid_ctx_release(ctx);
        return 1;
    }

    /* 2. Lua C API: a state with the standard libraries and lucid */
    lua_State *L = luaL_newstate();
    if (!L) {
        fprintf(stderr, "host_example: cannot create a Lua state\n");
        lucid_tensor_release(x);
        lucid_ctx_release(ctx);
        return 1;
    }
    luaL_openlibs(L);
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "preload");
    lua_pushcfunction(L, luaopen_lucid);
    lua_setfield(L, -2, "lucid");
    lua_pop(L, 2);
    lua_getglobal(L, "require"); /* open the module (registers the types) */
    lua_pushliteral(L, "lucid");
    if (lua_pcall(L, 1, 0, 0) != 0) {
        fprintf(stderr, "host_example: %s\n", lua_tostring(L, -1));
        ok = 0;
        goto done;
    }

    /* 3. run the chunk with the host's tensor as its argument */
    if (luaL_loadbuffer(L, CHUNK, sizeof CHUNK - 1, "=host_chunk") != 0) {
        fprintf(stderr, "host_example: %s\n", lua_tostring(L, -1));
        ok = 0;
        goto done;
    }
    lucid_tensor_retain(x); /* the userdata takes this reference */
    lucid_lua_push_tensor(L, x);
    if (lua_pcall(L, 1, 2, 0) != 0) {
        fprintf(stderr, "host_example: %s\n", lua_tostring(L, -1));
        ok = 0;
        goto done;
    }

    /* 4a. read the number back through the Lua C API */
    ok &= check("sum via Lua (lua_tonumber)", lua_tonumber(L, -2), EXPECTED_SUM);

    /* 4b. read the tensor back through the engine C API */
    lucid_tensor *c = lucid_lua_to_tensor(L, -1);
    if (!c) {
        fprintf(stderr, "host_example: the chunk did not return a tensor\n");
        ok = 0;
        goto done;
    }
    lucid_ctx *cctx = lucid_tensor_ctx(c);
    double sum = 0;
    if (lucid_reduce_item(cctx, LUCID_REDUCE_SUM, c, &sum) != LUCID_OK) {
        fprintf(stderr, "host_example: %s\n", lucid_ctx_error(cctx));
        ok = 0;
        goto done;
    }
    ok &= check("sum via C (lucid_reduce_item)", sum, EXPECTED_SUM);
    lucid_tensor *host = NULL;
    lucid_device cpu = {LUCID_CPU, 0};
    if (lucid_tensor_to(cctx, c, cpu, LUCID_F64, &host) != LUCID_OK) {
        fprintf(stderr, "host_example: %s\n", lucid_ctx_error(cctx));
        ok = 0;
        goto done;
    }
    const double *v = lucid_tensor_data(host);
    for (int i = 0; i < 4; i++) {
        char what[48];
        snprintf(what, sizeof what, "c[%d][%d] via C (tensor data)", i / 2 + 1,
                 i % 2 + 1);
        ok &= check(what, v[i], EXPECTED_C[i]);
    }
    lucid_tensor_release(host);

done:
    lua_close(L); /* collects the userdata: their references drop here */
    lucid_tensor_release(x);
    lucid_ctx_release(ctx);
    printf("%s\n", ok ? "host_example: ok" : "host_example: FAILED");
    return ok ? 0 : 1;
}
