/*
 * lua_input.c — Lua binding of the fused network-input op
 * (engine/data/input.h):
 *
 *   lucid.input_prepare(x, images, [hsv]) -> x
 *     images u8 [N,3,H,W] (on x's device), hsv f32 [N,3] gains or nil;
 *     x (f32/bf16/f16, f64 on the cpu) [N,3,H,W] = HSV(images) / 255.
 *
 * Runs on the context of x (the context that created its storage). Errors
 * of the engine are raised as "lucid ERR_...: input_prepare: ...".
 */
#include "lua_common.h"
#include "data/input.h"

static int l_input_prepare(lua_State *L) {
    lucid_tensor *x = lucid_lua_check_tensor(L, 1, "x");
    lucid_tensor *images = lucid_lua_check_tensor(L, 2, "images");
    lucid_tensor *hsv = lua_isnoneornil(L, 3) ? NULL
                                              : lucid_lua_check_tensor(L, 3, "hsv");
    lucid_ctx *ctx = lucid_tensor_ctx(x);
    lucid_status s = lucid_input_prepare(ctx, x, images, hsv);
    if (s != LUCID_OK) return lucid_lua_raise(L, ctx, s);
    lua_pushvalue(L, 1);
    return 1;
}

int lucid_lua_open_input(lua_State *L) {
    lua_pushcfunction(L, l_input_prepare);
    lua_setfield(L, -2, "input_prepare");
    return 0;
}
