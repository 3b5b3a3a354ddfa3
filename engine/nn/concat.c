/*
 * concat.c — channel-slice copy (Concat, Split/Chunk both ways, Add's
 * backward) and Add on the CPU.
 *
 * Contract (see nn.h):
 *   channel_copy: dst [N,Cd,*S], src [N,Cs,*S] contiguous;
 *     dst[:, d0:d0+n] = beta*dst[:, d0:d0+n] + src[:, s0:s0+n]
 *     (dtypes may differ: converted through f64; same dtype and beta 0 is a
 *     plain memcpy per batch item).
 *   add_forward: y = a + b, same shape and dtype (y may alias a or b).
 * Source: torch.cat / torch.chunk / torch.split along dim 1.
 */
#include "nn/nn_cpu.h"
#include <string.h>

lucid_status cpu_channel_copy(lucid_ctx *ctx, lucid_tensor *dst,
                              int64_t dst_c0, const lucid_tensor *src,
                              int64_t src_c0, int64_t nch, double beta) {
    int64_t N = dst->shape[0], Cd = dst->shape[1], Cs = src->shape[1];
    int64_t S = 1;
    for (int i = 2; i < dst->ndim; i++) S *= dst->shape[i];
    char *dd = lucid_tensor_data(dst);
    const char *sd = lucid_tensor_data(src);
    size_t des = lucid_dtype_size(dst->dtype), ses = lucid_dtype_size(src->dtype);
    int64_t len = nch * S;
    for (int64_t n = 0; n < N; n++) {
        char *d = dd + (size_t)((n * Cd + dst_c0) * S) * des;
        const char *s = sd + (size_t)((n * Cs + src_c0) * S) * ses;
        if (beta == 0.0 && dst->dtype == src->dtype) {
            memmove(d, s, (size_t)len * des);
            continue;
        }
        for (int64_t i = 0; i < len; i++)
            nn_st_beta(d, dst->dtype, i, nn_ld(s, src->dtype, i), beta);
    }
    (void)ctx;
    return LUCID_OK;
}

lucid_status cpu_add_forward(lucid_ctx *ctx, const lucid_tensor *a,
                             const lucid_tensor *b, lucid_tensor *y) {
    int64_t n = lucid_tensor_numel(y);
    const void *ad = lucid_tensor_data(a), *bd = lucid_tensor_data(b);
    void *yd = lucid_tensor_data(y);
    for (int64_t i = 0; i < n; i++)
        nn_st(yd, y->dtype, i, nn_ld(ad, a->dtype, i) + nn_ld(bd, b->dtype, i));
    (void)ctx;
    return LUCID_OK;
}
