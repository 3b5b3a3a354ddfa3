/*
 * nn_conv_wcols.cu — the CUDA side of the Conv2d column cache: switches,
 * buffer, ordering events and test hooks.  The contract is in
 * nn_conv_wcols.cuh and engine/nn/nn.h (lucid_conv_wcols); nn_conv.cu
 * calls these around its im2col launches and filter-gradient GEMMs.
 *
 * The buffer follows the weight shadows' rule (nn_conv.cu shadow_buffer):
 * allocated on first use outside stream capture (lucid_storage_create on
 * the current stream's cache) and never freed while the cache lives; a
 * call that needs more bytes allocates a larger buffer and the old one is
 * retired, not freed, since a recorded graph may read it.  Its two events
 * are made with the first buffer (outside capture too) and destroyed by
 * lucid_conv_wcols_release through the events_free hook installed here.
 */
#include "nn_conv_wcols.cuh"

#include <string.h>

static thread_local unsigned long g_wcols_hits, g_wcols_sides;

extern "C" unsigned long lucid_cuda_conv_wcols_hit_count(void) { return g_wcols_hits; }
extern "C" unsigned long lucid_cuda_conv_wcols_side_count(void) { return g_wcols_sides; }
void lucid_conv_wcols_count_side(void) { g_wcols_sides++; }

// ----------------------------------------------------------------------------
// switches

int lucid_conv_wcols_switch(void) {
    static int v = -1;
    return lucid_env_int("LUCID_WCOLS", LUCID_WCOLS_OFF, LUCID_WCOLS_NOSIDE, LUCID_WCOLS_STABLE,
                         &v);
}

int lucid_conv_wcols_mode(const lucid_cuda_nn_state *ns) {
    return ns->wcols ? ns->wcols - 1 : lucid_conv_wcols_switch();
}

size_t lucid_conv_wcols_cap(const lucid_cuda_nn_state *ns) {
    static int mb = -1;
    if (ns->wcols_cap) return ns->wcols_cap;
    return (size_t)lucid_env_int("LUCID_WCOLS_MAX_MB", 0, 1 << 20, 2048, &mb) << 20;
}

// ----------------------------------------------------------------------------
// buffer and events

/* the events_free hook of lucid_conv_wcols (nn.h): destroys what was made */
static void wcols_events_free(void **ev) {
    for (int i = 0; i < 2; i++)
        if (ev[i]) {
            if (cudaEventDestroy((cudaEvent_t)ev[i]) != cudaSuccess) (void)cudaGetLastError();
            ev[i] = NULL;
        }
}

/* 1 when the stream is being captured (errors read as "capturing": the
 * caller then takes the route that allocates nothing). */
static bool wcols_capturing(cudaStream_t s) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        return true;
    }
    return cs != cudaStreamCaptureStatusNone;
}

static bool wcols_have_events(const lucid_conv_wcols *wc) {
    return wc->events[0] && wc->events[1];
}

/* *ok when wc has a buffer of at least `bytes` on x's device and its
 * events, made here if need be (outside capture, within the ceiling). */
static lucid_status wcols_buffer(lucid_ctx *ctx, lucid_cuda_state *st,
                                 const lucid_cuda_nn_state *ns, lucid_conv_wcols *wc,
                                 const lucid_tensor *x, size_t bytes, bool *ok) {
    *ok = false;
    const lucid_device dev = lucid_tensor_device(x);
    if (wc->buf) {
        const lucid_device bd = lucid_storage_device(wc->buf);
        if (bd.type != dev.type || bd.index != dev.index) return LUCID_OK;
        if (lucid_storage_nbytes(wc->buf) >= bytes && wcols_have_events(wc)) {
            *ok = true;
            return LUCID_OK;
        }
    }
    if (wcols_capturing(st->stream)) return LUCID_OK;
    if (!wcols_have_events(wc)) {
        wc->events_free = wcols_events_free;
        for (int i = 0; i < 2; i++)
            if (!wc->events[i])
                CUDA_CHECK(ctx, cudaEventCreateWithFlags((cudaEvent_t *)&wc->events[i],
                                                         cudaEventDisableTiming));
    }
    if (wc->buf && lucid_storage_nbytes(wc->buf) >= bytes) {
        *ok = true;
        return LUCID_OK;
    }
    if (wc->buf) { /* a larger buffer: the old one is retired, if a slot is free */
        bool slot = false;
        for (int i = 0; i < LUCID_CONV_WCOLS_RETIRED; i++) slot = slot || !wc->retired[i];
        if (!slot) return LUCID_OK;
    }
    if (!lucid_conv_wcols_budget_take(bytes, lucid_conv_wcols_cap(ns))) return LUCID_OK;
    lucid_storage *buf = NULL;
    lucid_status s = lucid_storage_create(ctx, dev, bytes, 0, &buf);
    if (s != LUCID_OK) {
        lucid_conv_wcols_budget_give(bytes);
        return s;
    }
    if (!lucid_conv_wcols_adopt(wc, buf, bytes)) { /* (checked above) */
        lucid_storage_release(buf);
        lucid_conv_wcols_budget_give(bytes);
        return LUCID_OK;
    }
    *ok = true;
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// writes and reads

lucid_status lucid_conv_wcols_write_begin(lucid_ctx *ctx, lucid_cuda_state *st,
                                          const lucid_cuda_nn_state *ns, lucid_conv_wcols *wc,
                                          const lucid_tensor *x, size_t bytes, void **cols) {
    *cols = NULL;
    if (!wc) return LUCID_OK;
    bool ok = false;
    LUCID_TRY(wcols_buffer(ctx, st, ns, wc, x, bytes, &ok));
    if (!ok) return LUCID_OK;
    const uint64_t ep = st->wcast_epoch;
    /* a filter gradient of this epoch (a parameter-gradient lane) may still
     * read the buffer, and the last write (the cols lane) may still run */
    if (wc->read_pending && wc->read_epoch == ep)
        CUDA_CHECK(ctx, cudaStreamWaitEvent(st->stream, (cudaEvent_t)wc->events[1], 0));
    if (wc->write_pending && wc->write_epoch == ep)
        CUDA_CHECK(ctx, cudaStreamWaitEvent(st->stream, (cudaEvent_t)wc->events[0], 0));
    wc->read_pending = 0; /* the reads of the new columns wait for this write */
    lucid_conv_wcols_invalidate(wc); /* until the write is queued */
    *cols = lucid_storage_data(wc->buf);
    return LUCID_OK;
}

lucid_status lucid_conv_wcols_write_end(lucid_ctx *ctx, lucid_cuda_state *st,
                                        lucid_conv_wcols *wc, cudaStream_t stream,
                                        const lucid_tensor *x, int kh, int kw,
                                        const lucid_conv2d_params *p, int64_t rows, int side) {
    const uint64_t ep = st->wcast_epoch;
    CUDA_CHECK(ctx, cudaEventRecord((cudaEvent_t)wc->events[0], stream));
    wc->write_pending = 1;
    wc->write_epoch = ep;
    lucid_conv_wcols_mark(wc, x, kh, kw, p, rows, ep, side);
    return LUCID_OK;
}

lucid_status lucid_conv_wcols_read_begin(lucid_ctx *ctx, lucid_cuda_state *st,
                                         lucid_conv_wcols *wc, const lucid_tensor *x, int kh,
                                         int kw, const lucid_conv2d_params *p, int64_t rows,
                                         size_t bytes, const void **cols) {
    *cols = NULL;
    const uint64_t ep = st->wcast_epoch;
    /* fresh in this epoch, or (in a continuing capture) in the previous
     * capture's: its writes are in the graph launched right before this
     * one's, and its events (write_epoch, read_epoch != ep) are not waited on */
    if (!wc || !wcols_have_events(wc) ||
        !(lucid_conv_wcols_fresh(wc, x, kh, kw, p, rows, ep) ||
          (st->wcast_alias && lucid_conv_wcols_fresh(wc, x, kh, kw, p, rows, st->wcast_alias))) ||
        lucid_storage_nbytes(wc->buf) < bytes)
        return LUCID_OK;
    if (wc->write_pending && wc->write_epoch == ep)
        CUDA_CHECK(ctx, cudaStreamWaitEvent(st->stream, (cudaEvent_t)wc->events[0], 0));
    if (wc->read_pending && wc->read_epoch == ep) /* one event after every read */
        CUDA_CHECK(ctx, cudaStreamWaitEvent(st->stream, (cudaEvent_t)wc->events[1], 0));
    *cols = lucid_storage_data(wc->buf);
    return LUCID_OK;
}

lucid_status lucid_conv_wcols_read_end(lucid_ctx *ctx, lucid_cuda_state *st,
                                       lucid_conv_wcols *wc) {
    CUDA_CHECK(ctx, cudaEventRecord((cudaEvent_t)wc->events[1], st->stream));
    wc->read_pending = 1;
    wc->read_epoch = st->wcast_epoch;
    g_wcols_hits++;
    return LUCID_OK;
}
