/*
 * error.c — status names and the per-context error message.
 *
 * Every fallible function returns a lucid_status and, on failure, leaves a
 * human-readable message in its context through lucid_seterr(). The message
 * names the object, the expected and the actual value.
 */
#include "internal.h"
#include <stdio.h>
#include <string.h>

const char *lucid_status_name(lucid_status s) {
    switch (s) {
    case LUCID_OK: return "ok";
    case LUCID_ERR_ARG: return "argument error";
    case LUCID_ERR_OOM: return "out of memory";
    case LUCID_ERR_DEVICE: return "device error";
    case LUCID_ERR_IO: return "io error";
    case LUCID_ERR_FORMAT: return "format error";
    case LUCID_ERR_UNSUPPORTED: return "unsupported";
    case LUCID_ERR_STATE: return "state error";
    case LUCID_ERR_NONFINITE: return "non-finite value";
    case LUCID_ERR_CONTRACT: return "contract changed";
    }
    return "unknown status";
}

lucid_status lucid_vseterr(lucid_ctx *ctx, lucid_status status,
                           const char *fmt, va_list ap) {
    if (!ctx) return status;
    ctx->last_status = status;
    vsnprintf(ctx->errmsg, sizeof ctx->errmsg, fmt, ap);
    return status;
}

lucid_status lucid_seterr(lucid_ctx *ctx, lucid_status status, const char *fmt,
                          ...) {
    va_list ap;
    va_start(ap, fmt);
    lucid_vseterr(ctx, status, fmt, ap);
    va_end(ap);
    return status;
}

const char *lucid_ctx_error(const lucid_ctx *ctx) {
    return ctx ? ctx->errmsg : "no context";
}

lucid_status lucid_ctx_last_status(const lucid_ctx *ctx) {
    return ctx ? ctx->last_status : LUCID_ERR_STATE;
}

void lucid_ctx_clear_error(lucid_ctx *ctx) {
    if (!ctx) return;
    ctx->last_status = LUCID_OK;
    ctx->errmsg[0] = '\0';
}

const char *lucid_shape_str(int ndim, const int64_t *shape, char *buf,
                            size_t buflen) {
    size_t n = 0;
    if (buflen == 0) return buf;
    n += (size_t)snprintf(buf + n, buflen - n, "[");
    for (int i = 0; i < ndim && n < buflen; i++)
        n += (size_t)snprintf(buf + n, buflen - n, i ? ",%lld" : "%lld",
                              (long long)shape[i]);
    if (n < buflen) snprintf(buf + n, buflen - n, "]");
    return buf;
}
