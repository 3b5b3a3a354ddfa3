/*
 * optim.h — optimizers, EMA, gradient norm/clipping, loss scaling, the device
 * parameter block and the training schedules (issue 6, engine side).
 *
 * Contract
 *   - Parameters live in ONE flat f32 tensor, gradients in ONE flat tensor
 *     with the same layout (f32; the norm and the clips also take bf16/f16).
 *     Both are contiguous and on the same device. What each element belongs
 *     to is described by a segment table (lucid_param_segment), validated
 *     once into a lucid_param_layout.
 *   - Every value that may change from one step to the next (lr, momentum,
 *     weight decay per group, EMA decay and tau, clip limits, loss-scale
 *     policy) lives in a lucid_param_block: a small struct that kernels READ
 *     from device memory at run time. The host writes the next values into
 *     pinned host memory (lucid_param_block_update) and an async copy
 *     (lucid_param_block_upload, enqueued at the head of the step) moves
 *     them. A recorded step (CUDA graph) therefore replays unchanged while
 *     the schedule moves. On the CPU the same struct sits in ordinary memory
 *     and the same update/upload pair applies, so both routes share one code
 *     path.
 *   - Values the DEVICE owns (loss scale, growth tracker, found_inf, the
 *     optimizer step counter, EMA update counter, last gradient norm, the
 *     non-finite counter) live in the same block but are never overwritten by
 *     an upload; read them with lucid_param_block_read (synchronizes) or set
 *     them for resume with lucid_param_block_set_state.
 *   - The order of one optimizer step (at an accumulation-window boundary):
 *       lucid_param_block_upload        (head of the step; inputs only)
 *       ... forward, loss (seed scaled by lucid_scaler_scale), backward ...
 *       lucid_grad_unscale              (fp16 + scaler only: found_inf, g/S)
 *       lucid_grad_clip_norm            (or lucid_grad_clip_value; optional)
 *       lucid_optim_step                (does nothing when found_inf is set)
 *       lucid_scaler_update             (always: scale policy, resets found_inf)
 *       lucid_ema_update                (after every optimizer step)
 *     This is Ultralytics' optimizer_step order (reference §3.5) and
 *     torch.amp.GradScaler's unscale_ -> clip -> step -> update (clipping
 *     reference §8, §11). Every call is stream-ordered; none synchronizes.
 *     lucid_optim_step_fused runs the same sequence as one call (two
 *     kernel launches on CUDA for SGD/AdamW), bitwise equal to the
 *     separate calls.
 *   - Determinism: no float atomics anywhere; reductions use a fixed
 *     chunk/tree order that the CPU reproduces exactly (gradient norm is
 *     bitwise CPU == CUDA); elementwise updates avoid FMA contraction so
 *     they are bitwise CPU == CUDA too. MuSGD's Newton–Schulz GEMMs are not
 *     (summation order differs), but each device is deterministic.
 *   - Errors: every fallible call returns lucid_status with the message in
 *     the context; nothing exits.
 */
#ifndef LUCID_TRAIN_OPTIM_H
#define LUCID_TRAIN_OPTIM_H

#include "lucid.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ segments */

/* Parameter kinds, Ultralytics build_optimizer order (reference §3.3):
 * weights with decay, normalisation weights (no decay), biases (no decay). */
typedef enum lucid_segment_kind {
    LUCID_KIND_WEIGHT = 0,
    LUCID_KIND_NORM = 1,
    LUCID_KIND_BIAS = 2,
    LUCID_KIND_COUNT = 3
} lucid_segment_kind;

/* Optimizer groups: kind + 3*head. Slots 3..5 are the classification-head
 * split that MuSGD uses (reference §3.3: head groups get lr x 3; the host
 * writes that lr into the block, so every slot's lr is exact under warmup).
 * Optimizers other than MuSGD simply see head = 0 for every segment or give
 * slots 3..5 the same values as 0..2. */
#define LUCID_PARAM_SLOTS 6

typedef struct lucid_param_segment {
    const char *name;      /* for error messages; copied; may be NULL */
    int64_t offset;        /* first element in the flat buffers */
    int64_t numel;         /* elements; must equal the product of shape */
    int kind;              /* lucid_segment_kind (same values as nn.h lucid_param_group) */
    int ndim;              /* 0..4 (MuSGD orthogonalises ndim 2 and 4) */
    int64_t shape[4];
    int trainable;         /* 0: frozen parameter or a buffer (BN running
                              stats): optimizer, norm and clips skip it; the
                              EMA still averages it */
    int head;              /* 1: classification head (MuSGD lr slot 3+kind) */
} lucid_param_segment;

typedef struct lucid_param_layout lucid_param_layout;

/* Validate the table (offsets inside [0,total), no overlaps, numel = product
 * of shape, kind in range, ndim <= 4) and build the launch tables on dev.
 * Errors name the segment. Segments may leave gaps (gaps are never read). */
lucid_status lucid_param_layout_create(lucid_ctx *ctx, lucid_device dev,
                                       int64_t total_numel,
                                       const lucid_param_segment *segs,
                                       int nsegs, lucid_param_layout **out);
void lucid_param_layout_retain(lucid_param_layout *l);
void lucid_param_layout_release(lucid_param_layout *l);
int lucid_param_layout_count(const lucid_param_layout *l);
int64_t lucid_param_layout_numel(const lucid_param_layout *l);
/* Trainable elements (what the norm and optimizers touch). */
int64_t lucid_param_layout_trainable_numel(const lucid_param_layout *l);

/* ------------------------------------------------------- parameter block */

/* Host-written inputs. Every field applies to the NEXT device work enqueued
 * after the upload that carries it (in practice: the step whose head the
 * upload is). Units are plain numbers unless said. */
typedef struct lucid_param_inputs {
    float lr[LUCID_PARAM_SLOTS];     /* learning rate of each group slot for
                                        this step's optimizer update */
    float momentum[LUCID_PARAM_SLOTS]; /* SGD/MuSGD momentum mu (also Muon's
                                        beta); AdamW beta1 */
    float weight_decay[LUCID_PARAM_SLOTS]; /* SGD/MuSGD: L2 added to the
                                        gradient (torch.optim.SGD); AdamW:
                                        decoupled p *= 1 - lr*wd */
    float beta2;          /* AdamW second-moment decay (0.999) */
    float eps;            /* AdamW epsilon (1e-8) */
    float muon_scale;     /* MuSGD weight of the Muon part (0.2) */
    float sgd_scale;      /* MuSGD weight of the SGD part (1.0) */
    double ema_decay;     /* EMA asymptotic decay (0.9999); double so that
                             d = decay (1 - exp(-u/tau)) matches the
                             reference's Python float arithmetic */
    double ema_tau;       /* EMA ramp, in updates (2000) */
    float clip_max_norm;  /* lucid_grad_clip_norm limit (10.0); 0 zeroes the
                             grads and a negative value flips them, exactly
                             as torch (no validation: reference §2.3) */
    float clip_value;     /* lucid_grad_clip_value limit (clamp to ±c) */
    float growth_factor;  /* loss scale x this after growth_interval clean
                             steps (2.0) */
    float backoff_factor; /* loss scale x this on overflow (0.5) */
    int32_t growth_interval; /* clean steps before growth (2000) */
    int32_t nesterov;     /* 1: Nesterov momentum (SGD, MuSGD) */
    int32_t scaler_enabled; /* 1: fp16 dynamic loss scaling is on */
    int32_t ns_bf16;      /* 1: MuSGD Newton–Schulz rounds to bf16 where the
                             reference computes in bf16 (default); 0: f32.
                             Unlike the other inputs this one is also read
                             by the HOST when a MuSGD step is enqueued on
                             CUDA (the staging value): 1 selects bf16 GEMM
                             operands (tensor cores, f32 accumulation, exact
                             for bf16-rounded operands), 0 f32 GEMMs. A
                             recorded step keeps the GEMMs of its recording:
                             switching a recorded MuSGD step from 1 to 0
                             needs a new recording (0 -> 1 is exact either
                             way: f32 GEMMs of bf16 values). */
} lucid_param_inputs;

/* Device-owned state and derived per-step scalars. */
typedef struct lucid_param_state {
    float loss_scale;     /* current scale S (init 65536); the loss seed is
                             multiplied by it, lucid_grad_unscale divides */
    int32_t growth_tracker; /* consecutive clean steps since the last change */
    int32_t found_inf;    /* set by lucid_grad_unscale when a grad is not
                             finite; read by the optimizer (skip) and reset
                             by lucid_scaler_update */
    int32_t nonfinite_norms; /* count of clip_norm calls whose total norm was
                             NaN or Inf (never hidden; for the log) */
    int64_t step;         /* optimizer steps taken (skipped ones excluded);
                             AdamW bias correction uses it */
    int64_t ema_updates;  /* EMA updates done (Ultralytics ModelEMA.updates) */
    int64_t skipped_steps; /* optimizer steps skipped on overflow */
    float grad_norm;      /* total 2-norm before clipping, last clip_norm */
    float clip_coef;      /* coefficient applied by the last clip_norm */
    float inv_scale;      /* derived: f32(1/f64(S)) of the last unscale */
    float ema_d;          /* derived: f32(d) of the last EMA update */
    float ema_1md;        /* derived: f32(1 - d) */
    float step_size[LUCID_PARAM_SLOTS]; /* derived (AdamW): lr / (1-beta1^t) */
    float bc2_sqrt[LUCID_PARAM_SLOTS];  /* derived (AdamW): sqrt(1-beta2^t) */
    float decay_mul[LUCID_PARAM_SLOTS]; /* derived (AdamW): 1 - lr*wd */
    int32_t step_skipped; /* derived: 1 when the last optimizer step was
                             skipped (found_inf at its start); the update
                             kernels read this, not found_inf */
    int32_t reserved[2];
} lucid_param_state;

typedef struct lucid_param_values {
    lucid_param_inputs in;   /* uploaded every step */
    lucid_param_state st;    /* device-owned; never overwritten by upload */
} lucid_param_values;

/* Defaults of the reference: lr 0.01, momentum 0.937, weight decay 0.0005 on
 * the weight slots (0 and 3), 0 elsewhere; beta2 0.999; eps 1e-8; muon 0.2,
 * sgd 1.0; EMA 0.9999/2000; clip 10.0; clip_value 0 (unused unless called);
 * growth 2.0, backoff 0.5, interval 2000; nesterov 1; scaler off; ns_bf16 1.
 * State: scale 65536, everything else 0. */
void lucid_param_values_default(lucid_param_values *v);

typedef struct lucid_param_block lucid_param_block;

/* Create the block on dev (pinned host staging + device copy; on the CPU two
 * ordinary copies), initialised from *init (or the defaults when NULL); the
 * initial values are already "uploaded". */
lucid_status lucid_param_block_create(lucid_ctx *ctx, lucid_device dev,
                                      const lucid_param_values *init,
                                      lucid_param_block **out);
void lucid_param_block_retain(lucid_param_block *pb);
void lucid_param_block_release(lucid_param_block *pb);
/* Write the next step's inputs into the host staging copy. Does not touch
 * the device; the caller must not call it while the previous upload may
 * still be reading the staging memory (any synchronization of the previous
 * step, e.g. reading its loss, suffices; a recorded graph's copy node reads
 * the staging memory when the graph runs). */
lucid_status lucid_param_block_update(lucid_param_block *pb,
                                      const lucid_param_inputs *in);
/* The staging copy, for field-by-field edits before an upload. */
lucid_param_inputs *lucid_param_block_staging(lucid_param_block *pb);
/* Enqueue staging -> device for the inputs part only (async on CUDA). */
lucid_status lucid_param_block_upload(lucid_ctx *ctx, lucid_param_block *pb);
/* Read the whole block back (synchronizes the device). */
lucid_status lucid_param_block_read(lucid_ctx *ctx, lucid_param_block *pb,
                                    lucid_param_values *out);
/* Overwrite the device-owned state (resume from a checkpoint). Synchronous. */
lucid_status lucid_param_block_set_state(lucid_ctx *ctx, lucid_param_block *pb,
                                         const lucid_param_state *st);
/* Device pointer to the block (struct lucid_param_values) for kernels of
 * other modules, e.g. the loss seed reading st.loss_scale. */
void *lucid_param_block_device_ptr(lucid_param_block *pb);
lucid_device lucid_param_block_device(const lucid_param_block *pb);

/* ------------------------------------------------------------ optimizers */

typedef enum lucid_optim_kind {
    LUCID_OPTIM_SGD = 0,   /* torch.optim.SGD, dampening 0, L2 in the grad */
    LUCID_OPTIM_ADAMW = 1, /* torch.optim.AdamW (decoupled decay) */
    LUCID_OPTIM_MUSGD = 2, /* Ultralytics MuSGD (reference §6) */
    LUCID_OPTIM_KIND_COUNT
} lucid_optim_kind;

const char *lucid_optim_kind_name(lucid_optim_kind k); /* "SGD", "AdamW", "MuSGD" */
int lucid_optim_kind_parse(const char *name, lucid_optim_kind *out);

typedef struct lucid_optim lucid_optim;

/* State buffers (flat, same layout as the parameters, zero-initialised):
 *   SGD:   momentum_buffer
 *   AdamW: exp_avg, exp_avg_sq
 *   MuSGD: momentum_buffer (Muon EMA on muon segments, SGD buffer on the
 *          others), momentum_buffer_SGD (muon segments only; zero elsewhere)
 * plus, for MuSGD, a device workspace for the Newton–Schulz matrices. */
lucid_status lucid_optim_create(lucid_ctx *ctx, lucid_optim_kind kind,
                                lucid_param_layout *layout,
                                lucid_optim **out);
void lucid_optim_retain(lucid_optim *o);
void lucid_optim_release(lucid_optim *o);
lucid_optim_kind lucid_optim_get_kind(const lucid_optim *o);
/* Number of state buffers (1 or 2) and a borrowed pointer to buffer i, for
 * checkpoints; names: "momentum_buffer", "exp_avg", "exp_avg_sq",
 * "momentum_buffer_SGD". */
int lucid_optim_state_count(const lucid_optim *o);
lucid_tensor *lucid_optim_state(lucid_optim *o, int i);
const char *lucid_optim_state_name(const lucid_optim *o, int i);

/* One optimizer update over every trainable segment (frozen ones are not
 * touched). Reads lr/momentum/decay from the block; does nothing (and counts
 * st.skipped_steps) when st.found_inf is set; else st.step += 1 first, so
 * AdamW's bias correction uses t = the new step. */
lucid_status lucid_optim_step(lucid_ctx *ctx, lucid_optim *o,
                              lucid_param_block *pb, lucid_tensor *params,
                              const lucid_tensor *grads);

/* ------------------------------------------------- fused optimizer step */

typedef struct lucid_ema lucid_ema;

/* What lucid_optim_step_fused runs around the update (bit flags). */
enum {
    LUCID_STEP_UNSCALE = 1,       /* lucid_grad_unscale first (nothing at run
                                     time while in.scaler_enabled = 0) */
    LUCID_STEP_CLIP_NORM = 2,     /* then lucid_grad_clip_norm(apply = 1) */
    LUCID_STEP_CLIP_VALUE = 4,    /* then lucid_grad_clip_value */
    LUCID_STEP_SCALER_UPDATE = 8, /* lucid_scaler_update after the update */
    LUCID_STEP_KEEP_GRADS = 16    /* leave the processed (unscaled, clipped)
                                     gradients in `grads`, as the separate
                                     calls do. Without it SGD and AdamW leave
                                     `grads` unchanged (for a caller that
                                     zeroes them next: one pass less); MuSGD
                                     writes them either way. */
};

typedef struct lucid_optim_step_opts {
    int flags;               /* LUCID_STEP_* */
    lucid_ema *ema;          /* EMA of `params` (a layout with the same
                                segment table as the optimizer's), updated
                                right after each new parameter value, or
                                NULL */
    lucid_ema *aux_ema;      /* a second EMA over another layout (the f32
                                BN buffers), updated with the SAME decay d
                                (ema_updates advances once), or NULL;
                                requires ema */
    const lucid_tensor *aux; /* the flat tensor aux_ema averages */
} lucid_optim_step_opts;

/* One whole optimizer step at an accumulation-window boundary:
 *     [unscale] [clip_norm] [clip_value] optim_step [scaler_update]
 *     [ema_update(ema, params)] [ema_update(aux_ema, aux), same d]
 * with results bitwise equal to those separate calls on the same device
 * (parameters, state, EMA, block state; gradients too with KEEP_GRADS).
 * grads: flat f32 (unlike lucid_grad_clip_norm, no bf16/f16). On CUDA the
 * gradient processing is applied on the fly inside the update kernel and
 * the EMA right after each new parameter value; the scalar work (clip
 * coefficient, step counter, scaler, EMA decay) runs in the last block of
 * the norm pass (or in one one-thread kernel when there is no norm or
 * unscale pass), so SGD/AdamW take two launches: norm pass, update. No
 * allocation, no host synchronization: capturable in a CUDA graph. */
lucid_status lucid_optim_step_fused(lucid_ctx *ctx, lucid_optim *o,
                                    lucid_param_block *pb,
                                    lucid_tensor *params, lucid_tensor *grads,
                                    const lucid_optim_step_opts *opts);

/* ------------------------------------------------- gradient norm, clips */

/* Total 2-norm over all trainable gradient elements, accumulated in f32
 * (grads f32, bf16 or f16), written to st.grad_norm; then every trainable
 * gradient is multiplied by coef = min(max_norm * (1/(norm + 1e-6)), 1)
 * unconditionally (torch clip_grad_norm_, clipping reference §2-§3): an Inf
 * norm gives coef 0 (finite grads -> 0, Inf grads -> NaN), a NaN norm gives
 * a NaN coef (every grad NaN). A non-finite norm increments
 * st.nonfinite_norms. apply = 0 computes and stores the norm only (torch
 * get_total_norm). */
lucid_status lucid_grad_clip_norm(lucid_ctx *ctx, lucid_param_layout *layout,
                                  lucid_param_block *pb, lucid_tensor *grads,
                                  int apply);
/* Clamp every trainable gradient to [-c, c] with c = in.clip_value, clamp_min
 * first then clamp_max (torch clip_grad_value_, reference §4): NaN stays
 * NaN, ±Inf -> ±c, a negative c makes every element c. */
lucid_status lucid_grad_clip_value(lucid_ctx *ctx, lucid_param_layout *layout,
                                   lucid_param_block *pb, lucid_tensor *grads);

/* ------------------------------------------------------------ loss scale */

/* x *= st.loss_scale (x f32: the loss or its seed gradient). */
lucid_status lucid_scaler_scale(lucid_ctx *ctx, lucid_param_block *pb,
                                lucid_tensor *x);
/* When in.scaler_enabled: st.inv_scale = f32(1/f64(S)); found_inf |= any
 * trainable grad not finite; g *= inv_scale unless inv_scale == 1
 * (torch _amp_foreach_non_finite_check_and_unscale_). f32 grads only. A no-op
 * when the scaler is disabled. */
lucid_status lucid_grad_unscale(lucid_ctx *ctx, lucid_param_layout *layout,
                                lucid_param_block *pb, lucid_tensor *grads);
/* End of an optimizer step, always called: when the scaler is enabled apply
 * torch _amp_update_scale_ (found_inf: S *= backoff, tracker = 0; else
 * tracker+1, and at growth_interval S *= growth if that is finite, tracker =
 * 0); then found_inf = 0. */
lucid_status lucid_scaler_update(lucid_ctx *ctx, lucid_param_block *pb);

/* ------------------------------------------------------------------- EMA */

/* EMA copy of the flat parameter buffer, initialised to params (Ultralytics
 * ModelEMA deep-copies the model). Averages every segment of the layout:
 * parameters, frozen ones and floating buffers (BN running stats). */
lucid_status lucid_ema_create(lucid_ctx *ctx, lucid_param_layout *layout,
                              const lucid_tensor *params, lucid_ema **out);
void lucid_ema_retain(lucid_ema *e);
void lucid_ema_release(lucid_ema *e);
lucid_tensor *lucid_ema_tensor(lucid_ema *e); /* borrowed */
lucid_param_layout *lucid_ema_layout(lucid_ema *e); /* borrowed */
/* updates += 1; d = decay * (1 - exp(-updates/tau)) (in f64, stored as
 * f32 d and f32(1-d)); ema = ema*d + (1-d)*param elementwise in f32, as
 * ModelEMA.update (v *= d; v += (1-d)*p). Runs after every optimizer step,
 * skipped or not, as Ultralytics does. */
lucid_status lucid_ema_update(lucid_ctx *ctx, lucid_ema *e,
                              lucid_param_block *pb,
                              const lucid_tensor *params);
/* Two EMAs advanced by ONE ModelEMA update: e over params (f32, e's
 * layout), then aux over x (f32, aux's layout; e.g. the f32 BN buffers of
 * the same model), with the same d: st.ema_updates of pb advances once and
 * both use d = decay*(1 - exp(-updates/tau)) of that update (in.ema_decay
 * and in.ema_tau of pb). Bitwise what lucid_optim_step_fused's ema +
 * aux_ema produce, for a caller without an optimizer step (the separate
 * route of lucid.EMA:update). scratch: a block on pb's device whose whole
 * content this call overwrites: it receives a device copy of pb right
 * before e's update, so aux's update (run on scratch) derives the same d;
 * pb's own state is what ema_updates/ema_d/ema_1md read back. Stream
 * ordered, no allocation, no host synchronization (capturable: one device
 * copy and two EMA launches). Errors: NULL arguments, scratch == pb, pb and
 * scratch on different devices, any error of lucid_ema_update. */
lucid_status lucid_ema_update_pair(lucid_ctx *ctx, lucid_ema *e,
                                   lucid_param_block *pb,
                                   const lucid_tensor *params, lucid_ema *aux,
                                   lucid_param_block *scratch,
                                   const lucid_tensor *x);

/* ------------------------------------------------------------- schedules
 * Pure host arithmetic of Ultralytics' trainer (reference §3.2-§3.4), in
 * f64. "round" is Python's/NumPy's round-half-to-even. */

/* max(round(nbs / batch), 1). */
int lucid_sched_accumulate(int nbs, int batch);
/* weight_decay * batch * accumulate / nbs. */
double lucid_sched_weight_decay(double weight_decay, int batch, int accumulate,
                                int nbs);
/* Warmup iterations: round(min(warmup_epochs, max(epochs - 1, 0)) * nb). */
int64_t lucid_sched_warmup_iters(double warmup_epochs, int epochs, int64_t nb);
/* numpy.interp(x, [x0, x1], [y0, y1]) for x0 <= x1 (x >= x1 -> y1 first,
 * then x <= x0 -> y0). */
double lucid_sched_interp(double x, double x0, double x1, double y0, double y1);
/* The lr factor lf(epoch): linear max(1 - e/epochs, 0)*(1 - lrf) + lrf, or
 * cosine max((1 - cos(pi*e/epochs))/2, 0)*(lrf - 1) + 1. */
double lucid_sched_lf(int cos_lr, double epoch, int epochs, double lrf);
/* 1 while iteration ni is in the warmup (ni <= nw, as the trainer tests). */
int lucid_sched_in_warmup(int64_t ni, int64_t nw);
/* Warmup accumulate: max(1, round(interp(ni, [0,nw], [1, nbs/batch]))). */
int lucid_sched_warmup_accumulate(int64_t ni, int64_t nw, int nbs, int batch);
/* Warmup lr of a group: interp(ni, [0,nw], [start, initial_lr*lf]) with
 * start = warmup_bias_lr for the bias group (is_bias), else 0. */
double lucid_sched_warmup_lr(int64_t ni, int64_t nw, int is_bias,
                             double warmup_bias_lr, double initial_lr,
                             double lf);
/* Warmup momentum: interp(ni, [0,nw], [warmup_momentum, momentum]). */
double lucid_sched_warmup_momentum(int64_t ni, int64_t nw,
                                   double warmup_momentum, double momentum);
/* optimizer=auto (reference §3.3): iterations = ceil(n_train /
 * max(batch, nbs)) * epochs; > 10000 -> MuSGD lr 0.01 momentum 0.9, else
 * AdamW lr round(0.002*5/(4+nc), 6) momentum 0.9. Writes the choice. */
void lucid_sched_auto_optimizer(int64_t n_train, int batch, int nbs,
                                int epochs, int nc, lucid_optim_kind *kind,
                                double *lr, double *momentum);

#ifdef __cplusplus
}
#endif
#endif /* LUCID_TRAIN_OPTIM_H */
