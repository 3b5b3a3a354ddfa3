/*
 * graph.h — recorded training steps: CUDA-graph capture and replay on a
 * context's compute stream, events, and the reference set that pins what a
 * recording baked in (DESIGN.md decision 5; docs/STEP.md has the whole
 * design of the recorded step built on top of this in lua/lucid/).
 *
 * Capture
 *   lucid_ctx_capture_begin(ctx) ... queue work through the ordinary API ...
 *   lucid_ctx_capture_end(ctx, &g)      -> an executable graph
 *   lucid_graph_launch(ctx, g)          -> replays the recorded work
 *   lucid_graph_destroy(g)
 * Work queued on the context's compute stream in between is recorded, not
 * run (so the capturing pass itself computes nothing: launch the graph once
 * to run that step). A replay launches the same kernels with the same
 * arguments, i.e. the same device addresses: every buffer the recorded work
 * touches must exist before capture_begin and must outlive the graph
 * (lucid_graph_refs below pins the model's). While capturing, every device
 * allocation of the context fails with LUCID_ERR_STATE ("allocation during
 * graph capture: <bytes>"), cache hits included. A failed capture must be
 * ended with lucid_ctx_capture_end(ctx, NULL), which discards it and leaves
 * the stream out of capture mode (safe to call when no capture is open).
 *
 * Errors: every fallible call returns a status with the message in ctx;
 * LUCID_ERR_UNSUPPORTED on a context without a CUDA device (the CPU route
 * is always eager). Nothing aborts.
 */
#ifndef LUCID_TRAIN_GRAPH_H
#define LUCID_TRAIN_GRAPH_H

#include "lucid.h"
#include "nn/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when ctx drives a device whose backend can capture graphs (CUDA). */
int lucid_ctx_graphs_available(const lucid_ctx *ctx);

/* Start recording the work queued on ctx's compute stream. ERR_STATE when a
 * capture is already open; ERR_UNSUPPORTED without CUDA. Conv weight
 * shadows (nn.h lucid_conv_wshadow) cast before are stale inside: the
 * capture records the casts its convs need, and every replay recasts. */
lucid_status lucid_ctx_capture_begin(lucid_ctx *ctx);

/* Flags of lucid_ctx_capture_begin_ex. */
#define LUCID_CAPTURE_KEEP_SHADOWS 1u
/* LUCID_CAPTURE_CONTINUE: this capture continues the last capture begun on
 * ctx, and the caller promises that every launch of its graph directly
 * follows a launch of that capture's graph on ctx's stream (the pipelined
 * route's B graph after its F graph, lua/lucid/step_pipeline.lua). Conv
 * column caches (nn.h lucid_conv_wcols) written in that capture from an
 * input that did not change since read as fresh inside this one, so the
 * filter gradients reuse the forward's im2col columns across the two
 * graphs; none of that capture's events is waited on (its graph is done
 * when this one starts). */
#define LUCID_CAPTURE_CONTINUE 2u

/* lucid_ctx_capture_begin with flags. LUCID_CAPTURE_KEEP_SHADOWS: conv
 * weight shadows that are fresh now stay fresh inside the capture, so no
 * cast of them is recorded. If the capture then queues no shadow cast at
 * all, the graph keeps the shadows (lucid_graph_keeps_shadows): it reads
 * them and writes neither them nor any weight, and its launches leave them
 * fresh. The protocol (lua/lucid/recorded_step.lua follows it):
 *   lucid_ctx_shadows_stale(ctx); cast the shadows the graph will read
 *   (lucid_nn_conv_cast_weights); lucid_ctx_capture_begin_ex(ctx, KEEP);
 *   ... capture_end; then before EVERY launch of a graph that keeps the
 *   shadows, cast the same list again (see below for what it queues).
 * The recast before a launch queues work for the weights written since
 * their last cast, and for every shadow after anything else made them
 * stale (another graph's launch, another capture, lucid_ctx_shadows_stale).
 * A shadow the capture reads and that list does not refresh would be read
 * stale after a weight update; the stale-making first step ensures every
 * shadow outside the list is cast inside the capture (and the graph then
 * does not keep the shadows).
 * Preconditions (not checked): the captured work writes no conv weight (a
 * graph that updates weights, an optimizer step, must be captured without
 * the flag: its launches must make the shadows stale), and the conv route
 * switches of the context (lucid_cuda_nn_set_conv1x1 / _conv_col / _wcast,
 * the stride-phase backward-data switch) do not change between the capture
 * and its launches (the list the recast writes follows them). Errors as
 * lucid_ctx_capture_begin; ERR_ARG for an unknown flag. */
lucid_status lucid_ctx_capture_begin_ex(lucid_ctx *ctx, unsigned flags);

/* Mark every conv weight shadow of ctx stale: the next cast or read of each
 * recasts it. LUCID_OK (nothing to do) on a context without CUDA. */
lucid_status lucid_ctx_shadows_stale(lucid_ctx *ctx);

typedef struct lucid_graph lucid_graph;

/* End the capture. out != NULL: instantiate the recorded work into *out
 * (one reference on ctx is held by the graph). out == NULL: discard it (the
 * failure path; LUCID_OK also when no capture was open). The stream leaves
 * capture mode in every case. An invalidated capture (an unsupported call
 * while recording) is reported as LUCID_ERR_DEVICE naming it. */
lucid_status lucid_ctx_capture_end(lucid_ctx *ctx, lucid_graph **out);

/* 1 while a capture of ctx is open. */
int lucid_ctx_capturing(lucid_ctx *ctx);

/* Replay g on its context's compute stream (asynchronous). */
lucid_status lucid_graph_launch(lucid_ctx *ctx, lucid_graph *g);

/* 1 when g's capture (begun with LUCID_CAPTURE_KEEP_SHADOWS) queued no
 * conv weight shadow cast: g reads the shadows as they are at its launch;
 * 0 otherwise (and for NULL). */
int lucid_graph_keeps_shadows(const lucid_graph *g);

/* Destroy g (NULL is a no-op). Launches in flight complete. */
void lucid_graph_destroy(lucid_graph *g);

/* ------------------------------------------------------------- events */

typedef struct lucid_event lucid_event;

/* An event on ctx's compute stream (not yet recorded). */
lucid_status lucid_event_create(lucid_ctx *ctx, lucid_event **out);
/* Record it at the current tail of the compute stream. */
lucid_status lucid_event_record(lucid_event *e);
/* Record e at the current tail of the compute stream only (the lanes are
 * not joined, unlike lucid_event_record); inside a capture of ctx's stream
 * as an external event record node of the graph, so each replay records e
 * where the capture reached this call (CUDA: cudaEventRecordWithFlags with
 * cudaEventRecordExternal), and a wait issued after the graph's launch waits
 * for that point of that replay. The recorded step's ev_fb after the loss
 * (LUCID_FB_EVENT=graph, lua/lucid/recorded_step.lua). Errors:
 * ERR_UNSUPPORTED on a backend without it (the CPU), ERR_DEVICE. */
lucid_status lucid_event_record_node(lucid_event *e);
/* Block the host until the work before the last record is done (returns at
 * once when never recorded). */
lucid_status lucid_event_synchronize(lucid_event *e);
void lucid_event_destroy(lucid_event *e);
/* Make the compute stream wait for the work before e's last record (a
 * record on the compute stream, or the `done` of lucid_side_copy); returns
 * at once when e was never recorded. Errors: ERR_DEVICE. */
lucid_status lucid_event_wait(lucid_event *e);
/* Make the compute stream of `waiter` (a context of the same device as e's,
 * or e's own) wait for the work before e's last record, as
 * lucid_event_wait does for e's own context: two contexts' streams ordered
 * (the pipelined recorded step, docs/PIPELINE.md). The wait takes the
 * record at the time of this call (cudaStreamWaitEvent). Errors: ERR_ARG
 * (no waiter, another device or backend), ERR_UNSUPPORTED, ERR_DEVICE. */
lucid_status lucid_event_wait_on(lucid_event *e, lucid_ctx *waiter);

/* Side copies: dst[i] = src[i] for i < n, queued on the context's side copy
 * stream so that they overlap the compute stream's work (the recorded
 * step's next-batch upload: lua/lucid/recorded_step.lua). The copy stream
 * first waits for `after`'s last record (NULL or never recorded: nothing),
 * then copies, then records `done` (NULL: none). The compute stream does not
 * wait for them: lucid_event_wait(done) before it reads dst;
 * lucid_event_synchronize(done) before the host overwrites src. The
 * tensors: contiguous, the same dtype and element count, every dst on ctx's
 * CUDA device, src on the host (pinned memory, lucid.graph.pinned, for a
 * truly asynchronous copy) or that device; dst's storage version is bumped.
 * Errors: ERR_ARG (n outside 0..64, a NULL, a mismatch: the message names the
 * pair), ERR_UNSUPPORTED without a CUDA device, ERR_STATE during a capture,
 * ERR_DEVICE. */
lucid_status lucid_side_copy(lucid_ctx *ctx, int n, lucid_tensor *const *dst,
                             const lucid_tensor *const *src, lucid_event *after,
                             lucid_event *done);

/* ------------------------------------------------- recording references
 * What a recording of a model's step baked in, on the C side: for every
 * entry of the parameter set its storage, data pointer, offset, shape,
 * strides, dtype, device and trainability; for every module its mode
 * (training, need_grad_input) and the identity of its persistent
 * outputs[], grad_inputs[] and saved[] tensors. It holds a reference on
 * every one of those tensors (and the set and modules), so nothing a graph
 * reads or writes can be freed and reused under it. Optionally it also
 * watches inputs of a parameter block that the recorded step treats as
 * part of its contract (lucid_graph_refs_watch_block).
 *
 * Its modes are watched exactly and in O(1): every recorded module carries
 * a watcher (nn.h, lucid_module_watch_modes) whose updates keep a count of
 * the recorded modules whose mode bits differ from the recorded ones (a
 * mode switched and back, as around a validation pass, leaves it zero).
 * Everything else of the contract that the engine sees moves the contract
 * epoch (nn.h: any parameter set's version bump; the Lua library's
 * announced changes).
 *
 * quick() is the test before a replay, O(1) in the size of the model: the
 * epoch of the last clean check still current, the mode count zero, the
 * watched block inputs equal (one cache line of the refs, the epoch, and
 * the watched staging). When it says no, check() tells what: the watched
 * block inputs; the entries field by field when the set's version moved
 * (every entry change bumps it; a bump with every field equal, a load in
 * place, refreshes the snapshot and the recording stays valid); the first
 * module whose mode differs, by name. A clean check() takes the epoch now
 * as the new snapshot (quick() answers yes again).
 *
 * restore() puts the recorded persistent tensors back into every module
 * whose outputs/grad_inputs/saved were reallocated by an eager pass with
 * other shapes (a short last batch, validation), so the graph's addresses
 * are again the module's buffers.
 */
typedef struct lucid_graph_refs lucid_graph_refs;
typedef struct lucid_param_block lucid_param_block; /* train/optim.h */

lucid_status lucid_graph_refs_create(lucid_ctx *ctx, lucid_param_set *set,
                                     int nmodules, lucid_module *const *modules,
                                     lucid_graph_refs **out);
/* What check() found had moved since the last clean check (*moved bits). */
enum {
    LUCID_GRAPH_MOVED_PARAMS = 1,  /* the set's version (or all_entries): the
                                      entries were compared field by field */
    LUCID_GRAPH_MOVED_MODES = 2,   /* a recorded module's mode differs */
    LUCID_GRAPH_MOVED_EPOCH = 4    /* the contract epoch (anything anywhere
                                      that bumps it: nn.h) */
};
/* 1 when provably unchanged since the last clean check (or creation):
 * the contract epoch equal, no module's mode different, the watched block
 * inputs equal. 0 says only "run check()". No allocation, no string. */
int lucid_graph_refs_quick(const lucid_graph_refs *r)
#if defined(__GNUC__)
    /* with the binding's caller and clock, in .text.hot: one code page for
     * a check that runs with cold caches (docs/STEP.md, "Contract") */
    __attribute__((hot))
#endif
    ;
/* 0: unchanged (nothing moved, or moved with every field equal: a load in
 * place; the snapshot is refreshed, quick() says 1 again). 1: changed; a
 * one-line reason ("model.3.conv.weight: trainable 1 -> 0", "module
 * model.2.m.0 (BatchNorm2d): mode train -> eval", "EMA decay/tau changed",
 * ...) is written to why. *moved (may be NULL) receives
 * LUCID_GRAPH_MOVED_* bits. */
int lucid_graph_refs_check(lucid_graph_refs *r, char *why, size_t whylen,
                           int *moved);
/* check(), comparing every entry field by field when all_entries is set
 * (whether or not the set's version moved). */
int lucid_graph_refs_check_ex(lucid_graph_refs *r, int all_entries, char *why,
                              size_t whylen, int *moved);

/* Block inputs a recording may watch (bits of `what`):
 *   LUCID_GRAPH_WATCH_EMA      staging ema_decay and ema_tau
 *   LUCID_GRAPH_WATCH_NS_BF16  staging ns_bf16 (read by the host when a
 *                              MuSGD step is enqueued: baked into a graph) */
enum {
    LUCID_GRAPH_WATCH_EMA = 1,
    LUCID_GRAPH_WATCH_NS_BF16 = 2,
    LUCID_GRAPH_WATCH_ALL = 3
};
/* Watch `what` of pb's staging inputs from their values now (the bits add
 * up over calls; watching a bit again re-snapshots it, from pb). Holds a
 * reference on pb until the refs are released. */
lucid_status lucid_graph_refs_watch_block(lucid_ctx *ctx, lucid_graph_refs *r,
                                          lucid_param_block *pb, unsigned what);
/* The watched block inputs alone (part of check(); a few compares, for a
 * caller's own cheap path): 1 + reason in why when one changed. */
int lucid_graph_refs_check_watched(const lucid_graph_refs *r, char *why,
                                   size_t whylen);
/* Reinstall the recorded persistent tensors where a module's differ;
 * returns how many slots were reinstalled. */
int lucid_graph_refs_restore(lucid_graph_refs *r);
/* Counts for stats: modules and parameter-set entries pinned. */
int lucid_graph_refs_nmodules(const lucid_graph_refs *r);
int lucid_graph_refs_nparams(const lucid_graph_refs *r);
void lucid_graph_refs_release(lucid_graph_refs *r);

#ifdef __cplusplus
}
#endif
#endif /* LUCID_TRAIN_GRAPH_H */
