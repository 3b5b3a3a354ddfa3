/*
 * nn_conv_wcols.cuh — the CUDA side of the Conv2d column cache
 * (engine/nn/nn.h lucid_conv_wcols; DECISIONS 38): the switches, the
 * cache's device buffer, the events that order its writes and reads
 * across streams, and the test hooks.  nn_conv.cu decides when a forward
 * writes the cache (its im2col route, or a side build on the cols lane for
 * a forward that builds no columns) and when a filter gradient reads it.
 *
 * A write:  lucid_conv_wcols_write_begin (the buffer, allocated outside
 *           capture within the budget; the current stream waits for the
 *           reads of this epoch since the last write and for the last
 *           write; the record forgotten), the im2col launch into *cols on
 *           some stream, lucid_conv_wcols_write_end on that stream (an
 *           event after it; the record marked fresh for x).
 * A read:   lucid_conv_wcols_read_begin (*cols when fresh for x; the
 *           current stream waits for the last write), the GEMMs on the
 *           current stream, lucid_conv_wcols_read_end (an event after
 *           them, which the next write waits for).
 * Events are waited on only in the epoch (st->wcast_epoch, graph.cu) they
 * were recorded in: within one capture they become graph edges; one
 * recorded outside a capture is never waited on inside it, nor one of a
 * capture afterwards (capture begin joins every lane first and a graph
 * launch orders everything before it, so no wait is needed across an
 * epoch change).
 * Errors: the CUDA error of an event call or the allocation's
 * (ERR_DEVICE / ERR_OOM), set in ctx.  Host-side state only otherwise.
 */
#ifndef LUCID_CUDA_NN_CONV_WCOLS_CUH
#define LUCID_CUDA_NN_CONV_WCOLS_CUH

#include "nn_common.cuh"

/* Modes (LUCID_WCOLS, lucid_cuda_nn_set_wcols; nn.h). */
#define LUCID_WCOLS_OFF 0    /* no cache: exactly the calls without one */
#define LUCID_WCOLS_STABLE 1 /* cache; side builds for x_stable convs (default) */
#define LUCID_WCOLS_SIDE 2   /* cache; side builds for every conv whose forward builds none */
#define LUCID_WCOLS_NOSIDE 3 /* cache; no side builds */

/* LUCID_WCOLS read once per process (lucid_env_int): 0..3 as above;
 * unset, empty or any other value: 1. */
int lucid_conv_wcols_switch(void);

/* The mode in ns: the per-context setting (lucid_cuda_nn_set_wcols: 1 +
 * mode), else lucid_conv_wcols_switch(). */
int lucid_conv_wcols_mode(const lucid_cuda_nn_state *ns);

/* The ceiling of the process's cache bytes in ns: the per-context setting
 * (lucid_cuda_nn_set_wcols_cap, bytes), else LUCID_WCOLS_MAX_MB (read once
 * per process, a whole number of MiB 0 .. 2^20, default 2048) << 20. */
size_t lucid_conv_wcols_cap(const lucid_cuda_nn_state *ns);

/* Begin a write of the columns of x (bytes of them, on x's device):
 * *cols = wc's buffer, after the waits above, or NULL (LUCID_OK) when the
 * cache cannot be used now: no buffer of that size and the stream is
 * being captured (never allocated in a capture), the ceiling would be
 * passed, every retired slot is used, or the buffer is on another device.
 * With *cols set, the record is forgotten until write_end. */
lucid_status lucid_conv_wcols_write_begin(lucid_ctx *ctx, lucid_cuda_state *st,
                                          const lucid_cuda_nn_state *ns, lucid_conv_wcols *wc,
                                          const lucid_tensor *x, size_t bytes, void **cols);

/* End a write queued on `stream` (the current stream, or the cols lane's
 * for a side build): the write event recorded there and the record marked
 * (lucid_conv_wcols_mark with the epoch now; side 1 for the cols lane). */
lucid_status lucid_conv_wcols_write_end(lucid_ctx *ctx, lucid_cuda_state *st,
                                        lucid_conv_wcols *wc, cudaStream_t stream,
                                        const lucid_tensor *x, int kh, int kw,
                                        const lucid_conv2d_params *p, int64_t rows, int side);

/* Begin a read: *cols = the buffer when wc is fresh for (x, kh, kw, p,
 * rows) in the epoch now (lucid_conv_wcols_fresh) and holds `bytes`, the
 * current stream then waiting for the last write (and for the reads since
 * it, so that one event covers them all); else NULL (LUCID_OK). */
lucid_status lucid_conv_wcols_read_begin(lucid_ctx *ctx, lucid_cuda_state *st,
                                         lucid_conv_wcols *wc, const lucid_tensor *x, int kh,
                                         int kw, const lucid_conv2d_params *p, int64_t rows,
                                         size_t bytes, const void **cols);

/* End a read queued on the current stream: the read event recorded there
 * (the next write waits for it); counted by lucid_cuda_conv_wcols_hit_count. */
lucid_status lucid_conv_wcols_read_end(lucid_ctx *ctx, lucid_cuda_state *st,
                                       lucid_conv_wcols *wc);

/* Count a side build (lucid_cuda_conv_wcols_side_count). */
void lucid_conv_wcols_count_side(void);

extern "C" {
/* Filter gradients of the calling thread that read cached columns (their
 * im2col skipped), and im2col launches it queued on the cols lane for a
 * forward that builds no columns, so far, any context, eager or while
 * capturing: test hooks for the cache. */
unsigned long lucid_cuda_conv_wcols_hit_count(void);
unsigned long lucid_cuda_conv_wcols_side_count(void);
}

#endif
