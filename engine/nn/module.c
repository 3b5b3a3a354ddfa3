/*
 * module.c — modules (Torch7 nn style): the generic object and every kind.
 *
 * Contract (see nn.h):
 *   - A module is a vtable plus fields; forward(in[]) fills m->outputs[],
 *     backward(in[], grad_out[]) fills m->grad_inputs[] (overwritten, skipped
 *     when need_grad_input == 0) and ACCUMULATES (+=) into the gradient views
 *     of its trainable parameters (frozen ones get nothing).
 *   - outputs[] / grad_inputs[] / saved[] are persistent: reallocated only
 *     when the needed shape, dtype or device changes, so the data pointers
 *     are stable across steps of one shape (CUDA-graph capture, issue 8).
 *   - Parameters are views into the flat buffers of a lucid_param_set; the
 *     set is retained and must be materialized before the first forward.
 *   - Every kind works on any device that has an nn kernel table: modules
 *     only allocate and call the checked lucid_nn_* entry points (or core
 *     ops such as lucid_matmul / lucid_copy / lucid_fill).
 */
#include "nn/nn.h"
#include "internal.h"
#include "nn/epoch.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// generic object

/* (Re)allocate *t only when (dev, dtype, shape) differ from what it is. */
static lucid_status ensure(lucid_ctx *ctx, lucid_tensor **t, lucid_device dev,
                           lucid_dtype dt, int ndim, const int64_t *shape) {
    lucid_tensor *c = *t;
    if (c) {
        lucid_device d = lucid_tensor_device(c);
        int same = d.type == dev.type && d.index == dev.index &&
                   c->dtype == dt && c->ndim == ndim;
        for (int i = 0; same && i < ndim; i++) same = c->shape[i] == shape[i];
        if (same) return LUCID_OK;
        lucid_tensor_release(c);
        *t = NULL;
    }
    return lucid_tensor_empty(ctx, dev, dt, ndim, shape, t);
}

static lucid_status ensure_like(lucid_ctx *ctx, lucid_tensor **t,
                                const lucid_tensor *like) {
    return ensure(ctx, t, lucid_tensor_device(like), like->dtype, like->ndim,
                  like->shape);
}

static lucid_status module_new(lucid_ctx *ctx, const lucid_module_vtable *vt,
                               lucid_param_set *set, const char *prefix,
                               int nin, int nout, size_t priv_size,
                               lucid_module **out) {
    *out = NULL;
    lucid_module *m = calloc(1, sizeof *m);
    if (!m) return lucid_seterr(ctx, LUCID_ERR_OOM, "module: out of host memory");
    m->vt = vt;
    m->refcount = 1;
    m->training = 1;
    m->need_grad_input = 1;
    m->ninputs = nin;
    m->noutputs = nout;
    snprintf(m->name, sizeof m->name, "%s", prefix ? prefix : "");
    m->outputs = calloc((size_t)nout, sizeof *m->outputs);
    m->grad_inputs = calloc((size_t)nin, sizeof *m->grad_inputs);
    m->priv = priv_size ? calloc(1, priv_size) : NULL;
    if (!m->outputs || !m->grad_inputs || (priv_size && !m->priv)) {
        free(m->outputs);
        free(m->grad_inputs);
        free(m->priv);
        free(m);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "module: out of host memory");
    }
    if (set) {
        lucid_param_set_retain(set);
        m->set = set;
    }
    *out = m;
    return LUCID_OK;
}

/* Declare "<prefix>.<leaf>" in m's set and append it to m->params. */
static lucid_status declare(lucid_ctx *ctx, lucid_module *m, const char *leaf,
                            lucid_param_kind kind, lucid_dtype dt, int ndim,
                            const int64_t *shape, int trainable, int group,
                            lucid_init_rule init) {
    char name[LUCID_PARAM_NAME_MAX];
    int n = snprintf(name, sizeof name, "%s%s%s", m->name, m->name[0] ? "." : "",
                     leaf);
    if (n < 0 || n >= (int)sizeof name)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "module: name '%s.%s' too long",
                            m->name, leaf);
    if (m->nparams >= (int)(sizeof m->params / sizeof m->params[0]))
        return lucid_seterr(ctx, LUCID_ERR_ARG, "module: too many parameters");
    lucid_param *p = NULL;
    LUCID_TRY(lucid_param_set_declare(ctx, m->set, name, kind, dt, ndim, shape,
                                      trainable, group, &init, &p));
    m->params[m->nparams++] = p;
    return LUCID_OK;
}

void lucid_module_retain(lucid_module *m) {
    if (m) __atomic_add_fetch(&m->refcount, 1, __ATOMIC_RELAXED);
}

void lucid_module_release(lucid_module *m) {
    if (!m) return;
    if (__atomic_sub_fetch(&m->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    if (m->vt && m->vt->free_priv) m->vt->free_priv(m);
    for (int i = 0; i < m->noutputs; i++) lucid_tensor_release(m->outputs[i]);
    for (int i = 0; i < m->ninputs; i++) lucid_tensor_release(m->grad_inputs[i]);
    for (int i = 0; i < 4; i++) lucid_tensor_release(m->saved[i]);
    free(m->outputs);
    free(m->grad_inputs);
    free(m->priv);
    lucid_param_set_release(m->set);
    free(m);
}

/* m a live module of vtable vt: else ERR_STATE "<op>: NULL or freed
 * module" or ERR_ARG "<op>: expected a <kind> module, got <its kind>". */
static lucid_status want_module(lucid_ctx *ctx, const char *op, const lucid_module *m,
                                const lucid_module_vtable *vt) {
    if (!m || !m->vt) return lucid_seterr(ctx, LUCID_ERR_STATE, "%s: NULL or freed module", op);
    if (m->vt != vt)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: expected a %s module, got %s", op, vt->kind,
                            m->vt->kind);
    return LUCID_OK;
}

static lucid_status check_ready(lucid_ctx *ctx, lucid_module *m, int nin,
                                const lucid_tensor *const *in) {
    if (!m || !m->vt)
        return lucid_seterr(ctx, LUCID_ERR_STATE, "module: NULL or freed");
    if (nin != m->ninputs)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s '%s': expected %d input(s), got %d", m->vt->kind,
                            m->name, m->ninputs, nin);
    for (int i = 0; i < nin; i++)
        if (!in || !in[i])
            return lucid_seterr(ctx, LUCID_ERR_ARG, "%s '%s': input %d is NULL",
                                m->vt->kind, m->name, i);
    if (m->set && !lucid_param_set_is_materialized(m->set))
        return lucid_seterr(ctx, LUCID_ERR_STATE,
                            "%s '%s': the parameter set is not materialized "
                            "yet (call lucid_param_set_materialize)",
                            m->vt->kind, m->name);
    return LUCID_OK;
}

lucid_status lucid_module_forward(lucid_ctx *ctx, lucid_module *m, int nin,
                                  const lucid_tensor *const *in) {
    LUCID_TRY(check_ready(ctx, m, nin, in));
    return m->vt->forward(ctx, m, nin, in);
}

lucid_status lucid_module_backward(lucid_ctx *ctx, lucid_module *m, int nin,
                                   const lucid_tensor *const *in, int nout,
                                   const lucid_tensor *const *grad_out) {
    LUCID_TRY(check_ready(ctx, m, nin, in));
    if (nout != m->noutputs)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s '%s': expected %d output gradient(s), got %d",
                            m->vt->kind, m->name, m->noutputs, nout);
    for (int i = 0; i < m->noutputs; i++)
        if (!m->outputs[i])
            return lucid_seterr(ctx, LUCID_ERR_STATE,
                                "%s '%s': backward before forward", m->vt->kind,
                                m->name);
    return m->vt->backward(ctx, m, nin, in, nout, grad_out);
}

lucid_status lucid_module_forward1(lucid_ctx *ctx, lucid_module *m,
                                   const lucid_tensor *x, lucid_tensor **y) {
    if (y) *y = NULL;
    const lucid_tensor *in[1] = {x};
    LUCID_TRY(lucid_module_forward(ctx, m, 1, in));
    if (y) *y = m->outputs[0];
    return LUCID_OK;
}

lucid_status lucid_module_backward1(lucid_ctx *ctx, lucid_module *m,
                                    const lucid_tensor *x,
                                    const lucid_tensor *dy, lucid_tensor **dx) {
    if (dx) *dx = NULL;
    const lucid_tensor *in[1] = {x}, *go[1] = {dy};
    LUCID_TRY(lucid_module_backward(ctx, m, 1, in, 1, go));
    if (dx) *dx = m->grad_inputs[0];
    return LUCID_OK;
}

lucid_tensor *lucid_module_output(const lucid_module *m, int i) {
    return (i >= 0 && i < m->noutputs) ? m->outputs[i] : NULL;
}

lucid_tensor *lucid_module_grad_input(const lucid_module *m, int i) {
    return (i >= 0 && i < m->ninputs) ? m->grad_inputs[i] : NULL;
}

lucid_status lucid_module_ensure_buffer(lucid_ctx *ctx, lucid_module *m, int grad,
                                        int i, lucid_device dev, lucid_dtype dt,
                                        int ndim, const int64_t *shape,
                                        lucid_tensor **out) {
    if (out) *out = NULL;
    int n = grad ? m->ninputs : m->noutputs;
    if (i < 0 || i >= n)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s '%s': %s %d out of range (0..%d)",
                            m->vt->kind, m->name, grad ? "grad_input" : "output", i,
                            n - 1);
    if (ndim < 0 || ndim > LUCID_MAX_DIMS)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s '%s': rank %d (0..%d)", m->vt->kind,
                            m->name, ndim, LUCID_MAX_DIMS);
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0)
            return lucid_seterr(ctx, LUCID_ERR_ARG, "%s '%s': size %lld of dim %d",
                                m->vt->kind, m->name, (long long)shape[d], d);
    lucid_tensor **slot = grad ? &m->grad_inputs[i] : &m->outputs[i];
    LUCID_TRY(ensure(ctx, slot, dev, dt, ndim, shape));
    if (out) *out = *slot;
    return LUCID_OK;
}

const char *lucid_module_kind(const lucid_module *m) { return m->vt->kind; }

// ----------------------------------------------------------------------------
// modes, their watchers, and the contract epoch (nn.h)

_Atomic uint64_t lucid_contract_epoch_counter = 1;

uint64_t lucid_contract_epoch(void) { return lucid_contract_epoch_now(); }

void lucid_contract_bump(void) {
    atomic_fetch_add_explicit(&lucid_contract_epoch_counter, 1, memory_order_relaxed);
}

unsigned lucid_module_mode_bits(const lucid_module *m) {
    return (m->training ? LUCID_MODE_TRAIN : 0u) |
           (m->need_grad_input ? LUCID_MODE_GRAD_INPUT : 0u);
}

/* m's bits went from `before` to what they are now: tell the watchers. */
static void mode_changed(lucid_module *m, unsigned before) {
    unsigned now = lucid_module_mode_bits(m);
    for (lucid_mode_watch *w = m->watchers; w; w = w->next)
        *w->mismatch += (now != w->recorded) - (before != w->recorded);
}

void lucid_module_set_training(lucid_module *m, int training) {
    training = training != 0;
    if (m->training != training) {
        unsigned before = lucid_module_mode_bits(m);
        m->training = training;
        m->version++;
        mode_changed(m, before);
    }
}

void lucid_module_set_need_grad_input(lucid_module *m, int flag) {
    flag = flag != 0;
    if (m->need_grad_input != flag) {
        unsigned before = lucid_module_mode_bits(m);
        m->need_grad_input = flag;
        m->version++;
        mode_changed(m, before);
    }
}

void lucid_module_watch_modes(lucid_module *m, lucid_mode_watch *w) {
    w->recorded = lucid_module_mode_bits(m);
    w->next = m->watchers;
    m->watchers = w;
}

void lucid_module_unwatch_modes(lucid_module *m, lucid_mode_watch *w) {
    for (lucid_mode_watch **p = &m->watchers; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            w->next = NULL;
            return;
        }
}

int lucid_module_describe(const lucid_module *m, char *buf, size_t n) {
    if (m->vt->describe) return m->vt->describe(m, buf, n);
    return snprintf(buf, n, "%s()", m->vt->kind);
}

/* input channel count check shared by the channel-aware kinds */
static lucid_status want_channels(lucid_ctx *ctx, const lucid_module *m,
                                  const lucid_tensor *x, int64_t c) {
    if (x->ndim != 4 || x->shape[1] != c) {
        char b[128];
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s '%s': expected input [N, %lld, H, W], got %s",
                            m->vt->kind, m->name, (long long)c,
                            lucid_shape_str(x->ndim, x->shape, b, sizeof b));
    }
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// Conv2d

/* ws: the weight rounded to the activation dtype for the cuBLAS 1x1 route
 * (nn.h lucid_conv_wshadow): the forward casts it (or finds it cast by
 * lucid_nn_conv_cast_weights), the backward-data reuses it.  dc: the
 * columns of the next backward-data, reserved by
 * lucid_module_conv2d_dcols_reserve and written by
 * lucid_module_batchnorm2d_backward_dcols (nn.h lucid_conv_dcols); the
 * next backward takes them, any forward or backward forgets them.  wc:
 * the forward's im2col columns of x kept for the filter gradient (nn.h
 * lucid_conv_wcols; passed by a training forward of a trainable weight,
 * read by the backward when fresh for its x). */
typedef struct conv_priv {
    int c1, c2, k, s, p, d, g, bias;
    lucid_conv2d_params cp;
    lucid_conv_wshadow ws;
    lucid_conv_dcols dc;
    lucid_conv_wcols wc;
} conv_priv;

static const lucid_module_vtable conv_vt;

static lucid_status conv_forward(lucid_ctx *ctx, lucid_module *m, int nin,
                                 const lucid_tensor *const *in) {
    conv_priv *c = m->priv;
    const lucid_tensor *x = in[0];
    memset(&c->dc, 0, sizeof c->dc); /* reserved for the backward of another forward */
    LUCID_TRY(want_channels(ctx, m, x, c->c1));
    int64_t ys[4] = {x->shape[0], c->c2,
                     lucid_nn_conv_out_size(x->shape[2], c->k, c->s, c->p, c->d),
                     lucid_nn_conv_out_size(x->shape[3], c->k, c->s, c->p, c->d)};
    if (ys[2] < 1 || ys[3] < 1)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "Conv2d '%s': input %lldx%lld too small for kernel "
                            "%d (padding %d, dilation %d)",
                            m->name, (long long)x->shape[2],
                            (long long)x->shape[3], c->k, c->p, c->d);
    LUCID_TRY(ensure(ctx, &m->outputs[0], lucid_tensor_device(x), x->dtype, 4, ys));
    /* the column cache only when a filter gradient follows; a module that
     * computes no input gradient (layer 0: x is the image) says x is
     * stable until then (a hint: the cache's freshness rule checks it) */
    const lucid_param *w = m->params[0];
    lucid_conv_wcols *wc = m->training && w->trainable ? &c->wc : NULL;
    /* no filter gradient follows (evaluation): drop the record's reference
     * on the last training input, which the layer before may just have
     * replaced by a buffer of the evaluation's shape */
    if (!wc) lucid_conv_wcols_invalidate(&c->wc);
    return lucid_nn_conv2d_forward_cols(ctx, x, m->outputs[0], w->data,
                                        c->bias ? m->params[1]->data : NULL, &c->cp, &c->ws,
                                        wc, !m->need_grad_input);
}

static lucid_status conv_backward(lucid_ctx *ctx, lucid_module *m, int nin,
                                  const lucid_tensor *const *in, int nout,
                                  const lucid_tensor *const *go) {
    conv_priv *c = m->priv;
    const lucid_tensor *x = in[0], *dy = go[0];
    lucid_conv_dcols dc = c->dc; /* this backward's, whatever happens */
    memset(&c->dc, 0, sizeof c->dc);
    if (!dy)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "Conv2d '%s': grad_output is NULL",
                            m->name);
    lucid_param *w = m->params[0], *b = c->bias ? m->params[1] : NULL;
    /* The parameter gradients first: with the grad lane on
     * (lucid_ctx_set_grad_lane) they fork off where dy is complete and
     * overlap the input gradient queued after them. */
    lucid_tensor *dw = w->trainable ? w->grad : NULL;
    lucid_tensor *db = (b && b->trainable) ? b->grad : NULL;
    if (dw || db) {
        int lane = 0;
        const void *key = dw ? lucid_tensor_data(dw) : lucid_tensor_data(db);
        LUCID_TRY(lucid_ctx_grad_lane_fork(ctx, lucid_tensor_device(x), key, &lane));
        lucid_status s =
            lucid_nn_conv2d_backward_params_cols(ctx, x, dy, dw, db, &c->cp, 1.0, &c->wc);
        if (lane) lucid_ctx_branch_return(ctx); /* closes the innermost fork: this one */
        LUCID_TRY(s);
    }
    if (m->need_grad_input) {
        LUCID_TRY(ensure_like(ctx, &m->grad_inputs[0], x));
        LUCID_TRY(lucid_nn_conv2d_backward_input_dcols(ctx, x, dy, m->grad_inputs[0],
                                                       w->data, &c->cp, 0.0, &c->ws, &dc));
    }
    return LUCID_OK;
}

lucid_status lucid_module_conv2d_dcols_reserve(lucid_ctx *ctx, lucid_module *conv,
                                               const lucid_tensor *x, int *armed) {
    const char *op = "Conv2d dcols reserve";
    if (armed) *armed = 0;
    LUCID_TRY(want_module(ctx, op, conv, &conv_vt));
    if (!x) return lucid_seterr(ctx, LUCID_ERR_ARG, "%s '%s': input is NULL", op, conv->name);
    if (!lucid_param_set_is_materialized(conv->set))
        return lucid_seterr(ctx, LUCID_ERR_STATE,
                            "%s '%s': the parameter set is not materialized "
                            "yet (call lucid_param_set_materialize)",
                            op, conv->name);
    conv_priv *c = conv->priv;
    memset(&c->dc, 0, sizeof c->dc);
    if (!conv->need_grad_input) return LUCID_OK; /* no backward-data to feed */
    LUCID_TRY(want_channels(ctx, conv, x, c->c1));
    LUCID_TRY(lucid_nn_conv2d_dcols_reserve(ctx, x, conv->params[0]->data, &c->cp, &c->dc));
    if (armed) *armed = c->dc.armed;
    return LUCID_OK;
}

static int conv_describe(const lucid_module *m, char *buf, size_t n) {
    const conv_priv *c = m->priv;
    char extra[96] = "";
    size_t k = 0;
    if (c->d != 1)
        k += (size_t)snprintf(extra + k, sizeof extra - k, ", dilation=(%d, %d)",
                              c->d, c->d);
    if (c->g != 1 && k < sizeof extra)
        snprintf(extra + k, sizeof extra - k, ", groups=%d", c->g);
    return snprintf(buf, n,
                    "Conv2d(%d, %d, kernel_size=(%d, %d), stride=(%d, %d), "
                    "padding=(%d, %d)%s%s)",
                    c->c1, c->c2, c->k, c->k, c->s, c->s, c->p, c->p, extra,
                    c->bias ? "" : ", bias=False");
}

static void conv_free_priv(lucid_module *m) {
    conv_priv *c = m->priv;
    if (c) {
        lucid_conv_wshadow_release(&c->ws);
        lucid_conv_wcols_release(&c->wc);
    }
}

static const lucid_module_vtable conv_vt = {"Conv2d", conv_forward,
                                            conv_backward, conv_describe,
                                            conv_free_priv};

/* 1 when the conv can take a cuBLAS route of cuda/nn_conv.cu: the 1x1 GEMM
 * (stride 1, no padding, dilation 1) or the im2col GEMM (a spatial kernel);
 * groups 1 either way.  The backend casts only the weights its switches
 * actually send there (cuda/nn_conv.cu lucid_cuda_conv2d_cast_shadows). */
static int conv_gemm_shape(const conv_priv *c) {
    if (c->g != 1) return 0;
    return c->k > 1 || (c->k == 1 && c->s == 1 && c->p == 0 && c->d == 1);
}

lucid_status lucid_nn_conv_cast_weights(lucid_ctx *ctx, lucid_module *const *modules,
                                        int n, lucid_dtype dt) {
    if (n < 0 || (n > 0 && !modules))
        return lucid_seterr(ctx, LUCID_ERR_ARG, "conv_cast_weights: %d modules%s", n,
                            n < 0 ? " (n < 0)" : ", array NULL");
    int k = 0;
    for (int i = 0; i < n; i++) {
        lucid_module *m = modules[i];
        if (!m) return lucid_seterr(ctx, LUCID_ERR_ARG, "conv_cast_weights: module %d is NULL", i);
        if (m->vt != &conv_vt)
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "conv_cast_weights: module %d ('%s') is a %s, not a Conv2d", i,
                                m->name, m->vt->kind);
        if (!m->params[0]->data)
            return lucid_seterr(ctx, LUCID_ERR_STATE,
                                "conv_cast_weights: Conv2d '%s': parameters not materialized",
                                m->name);
        k += conv_gemm_shape(m->priv);
    }
    if (k == 0) return LUCID_OK;
    const lucid_tensor **w = malloc((size_t)k * sizeof *w);
    lucid_conv_wshadow **ws = malloc((size_t)k * sizeof *ws);
    if (!w || !ws) {
        free(w);
        free(ws);
        return lucid_seterr(ctx, LUCID_ERR_OOM, "conv_cast_weights: out of host memory");
    }
    k = 0;
    for (int i = 0; i < n; i++) {
        conv_priv *c = modules[i]->priv;
        if (!conv_gemm_shape(c)) continue;
        w[k] = modules[i]->params[0]->data;
        ws[k++] = &c->ws;
    }
    lucid_status st = lucid_nn_conv2d_cast_shadows(ctx, w, ws, k, dt);
    free(w);
    free(ws);
    return st;
}

lucid_status lucid_module_conv2d_create(lucid_ctx *ctx, lucid_param_set *set,
                                        const char *prefix, int c1, int c2,
                                        int k, int s, int p, int d, int g,
                                        int bias, lucid_module **out) {
    *out = NULL;
    if (!set)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "Conv2d '%s': param set is NULL",
                            prefix ? prefix : "");
    if (c1 < 1 || c2 < 1 || k < 1 || s < 1 || d < 1 || g < 1 || c1 % g || c2 % g)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "Conv2d '%s': bad arguments c1=%d c2=%d k=%d s=%d "
                            "d=%d g=%d (need positive values, groups dividing "
                            "both channel counts)",
                            prefix ? prefix : "", c1, c2, k, s, d, g);
    if (p < 0) p = d > 1 ? (d * (k - 1) + 1) / 2 : k / 2; /* Ultralytics autopad */
    lucid_module *m = NULL;
    LUCID_TRY(module_new(ctx, &conv_vt, set, prefix, 1, 1, sizeof(conv_priv), &m));
    conv_priv *c = m->priv;
    c->c1 = c1; c->c2 = c2; c->k = k; c->s = s; c->p = p; c->d = d; c->g = g;
    c->bias = bias != 0;
    c->cp = (lucid_conv2d_params){s, s, p, p, d, d, g};
    lucid_conv_wshadow_init(&c->ws);
    lucid_conv_wcols_init(&c->wc);
    int64_t fan_in = (int64_t)(c1 / g) * k * k;
    int64_t ws[4] = {c2, c1 / g, k, k}, bs[1] = {c2};
    lucid_init_rule fi = {LUCID_INIT_FAN_IN, 0, 0, fan_in};
    lucid_status st = declare(ctx, m, "weight", LUCID_PARAM_KIND_PARAM,
                              LUCID_F32, 4, ws, 1, LUCID_PARAM_GROUP_DECAY, fi);
    if (st == LUCID_OK && c->bias)
        st = declare(ctx, m, "bias", LUCID_PARAM_KIND_PARAM, LUCID_F32, 1, bs, 1,
                     LUCID_PARAM_GROUP_BIAS, fi);
    if (st != LUCID_OK) {
        lucid_module_release(m);
        return st;
    }
    *out = m;
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// BatchNorm2d

typedef struct bn_priv {
    int c;
    double eps, momentum;
} bn_priv;

static lucid_status bn_forward(lucid_ctx *ctx, lucid_module *m, int nin,
                               const lucid_tensor *const *in) {
    bn_priv *b = m->priv;
    const lucid_tensor *x = in[0];
    LUCID_TRY(want_channels(ctx, m, x, b->c));
    lucid_device dev = lucid_tensor_device(x);
    lucid_dtype pdt = lucid_param_set_dtype(m->set);
    int64_t cs[1] = {b->c};
    LUCID_TRY(ensure_like(ctx, &m->outputs[0], x));
    LUCID_TRY(ensure(ctx, &m->saved[0], dev, pdt, 1, cs));
    LUCID_TRY(ensure(ctx, &m->saved[1], dev, pdt, 1, cs));
    return lucid_nn_batchnorm2d_forward(
        ctx, x, m->outputs[0], m->params[0]->data, m->params[1]->data,
        m->params[2]->data, m->params[3]->data, m->params[4]->data, m->saved[0],
        m->saved[1], m->training, b->momentum, b->eps);
}

/* The backward of BatchNorm2d module m (dc nullable: nn.h lucid_conv_dcols). */
static lucid_status bn_backward_dc(lucid_ctx *ctx, lucid_module *m, const lucid_tensor *x,
                                   const lucid_tensor *dy, lucid_conv_dcols *dc) {
    if (!dy)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "BatchNorm2d '%s': grad_output is NULL", m->name);
    lucid_param *w = m->params[0], *b = m->params[1];
    lucid_tensor *dx = NULL;
    if (m->need_grad_input) {
        LUCID_TRY(ensure_like(ctx, &m->grad_inputs[0], x));
        dx = m->grad_inputs[0];
    }
    lucid_tensor *dw = w->trainable ? w->grad : NULL;
    lucid_tensor *db = b->trainable ? b->grad : NULL;
    if (!dx && !dw && !db) return LUCID_OK;
    if (dc)
        return lucid_nn_batchnorm2d_backward_dcols(ctx, x, dy, dx, w->data, NULL, m->saved[0],
                                                   m->saved[1], dw, db, m->training, 0.0, 1.0,
                                                   0, dc);
    return lucid_nn_batchnorm2d_backward(ctx, x, dy, dx, w->data, m->saved[0],
                                         m->saved[1], dw, db, m->training, 0.0,
                                         1.0);
}

static lucid_status bn_backward(lucid_ctx *ctx, lucid_module *m, int nin,
                                const lucid_tensor *const *in, int nout,
                                const lucid_tensor *const *go) {
    return bn_backward_dc(ctx, m, in[0], go[0], NULL);
}

static int bn_describe(const lucid_module *m, char *buf, size_t n) {
    const bn_priv *b = m->priv;
    return snprintf(buf, n,
                    "BatchNorm2d(%d, eps=%g, momentum=%g, affine=True, "
                    "track_running_stats=True)",
                    b->c, b->eps, b->momentum);
}

static const lucid_module_vtable bn_vt = {"BatchNorm2d", bn_forward, bn_backward,
                                          bn_describe, NULL};

lucid_status lucid_module_batchnorm2d_create(lucid_ctx *ctx,
                                             lucid_param_set *set,
                                             const char *prefix, int c,
                                             double eps, double momentum,
                                             lucid_module **out) {
    *out = NULL;
    if (!set)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "BatchNorm2d '%s': param set is NULL",
                            prefix ? prefix : "");
    if (c < 1 || !(eps > 0) || !(momentum >= 0 && momentum <= 1))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "BatchNorm2d '%s': need c >= 1, eps > 0, momentum "
                            "in [0,1] (got %d, %g, %g)",
                            prefix ? prefix : "", c, eps, momentum);
    lucid_module *m = NULL;
    LUCID_TRY(module_new(ctx, &bn_vt, set, prefix, 1, 1, sizeof(bn_priv), &m));
    bn_priv *b = m->priv;
    b->c = c;
    b->eps = eps;
    b->momentum = momentum;
    int64_t cs[1] = {c}, one[1] = {1};
    lucid_init_rule ones = {LUCID_INIT_ONES, 0, 0, 0};
    lucid_init_rule zeros = {LUCID_INIT_ZEROS, 0, 0, 0};
    lucid_status st = declare(ctx, m, "weight", LUCID_PARAM_KIND_PARAM, LUCID_F32,
                              1, cs, 1, LUCID_PARAM_GROUP_NORM, ones);
    if (st == LUCID_OK)
        st = declare(ctx, m, "bias", LUCID_PARAM_KIND_PARAM, LUCID_F32, 1, cs, 1,
                     LUCID_PARAM_GROUP_BIAS, zeros);
    if (st == LUCID_OK)
        st = declare(ctx, m, "running_mean", LUCID_PARAM_KIND_BUFFER, LUCID_F32,
                     1, cs, 0, LUCID_PARAM_GROUP_NONE, zeros);
    if (st == LUCID_OK)
        st = declare(ctx, m, "running_var", LUCID_PARAM_KIND_BUFFER, LUCID_F32,
                     1, cs, 0, LUCID_PARAM_GROUP_NONE, ones);
    /* PyTorch stores num_batches_tracked as a 0-d int64 tensor */
    if (st == LUCID_OK)
        st = declare(ctx, m, "num_batches_tracked", LUCID_PARAM_KIND_BUFFER,
                     LUCID_I64, 0, one, 0, LUCID_PARAM_GROUP_NONE, zeros);
    if (st != LUCID_OK) {
        lucid_module_release(m);
        return st;
    }
    *out = m;
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// SiLU

static lucid_status silu_fwd(lucid_ctx *ctx, lucid_module *m, int nin,
                             const lucid_tensor *const *in) {
    LUCID_TRY(ensure_like(ctx, &m->outputs[0], in[0]));
    return lucid_nn_silu_forward(ctx, in[0], m->outputs[0]);
}

static lucid_status silu_bwd(lucid_ctx *ctx, lucid_module *m, int nin,
                             const lucid_tensor *const *in, int nout,
                             const lucid_tensor *const *go) {
    if (!m->need_grad_input) return LUCID_OK;
    if (!go[0])
        return lucid_seterr(ctx, LUCID_ERR_ARG, "SiLU '%s': grad_output is NULL",
                            m->name);
    LUCID_TRY(ensure_like(ctx, &m->grad_inputs[0], in[0]));
    return lucid_nn_silu_backward(ctx, in[0], go[0], m->grad_inputs[0], 0.0);
}

static const lucid_module_vtable silu_vt = {"SiLU", silu_fwd, silu_bwd, NULL,
                                            NULL};

lucid_status lucid_module_silu_create(lucid_ctx *ctx, lucid_module **out) {
    return module_new(ctx, &silu_vt, NULL, "", 1, 1, 0, out);
}

// ----------------------------------------------------------------------------
// BatchNorm2d + SiLU on a module pair (fused)

static lucid_status fused_pair(lucid_ctx *ctx, const char *op, lucid_module *bn,
                               lucid_module *act, const lucid_tensor *x) {
    if (!bn || !act || !bn->vt || !act->vt)
        return lucid_seterr(ctx, LUCID_ERR_STATE, "%s: NULL or freed module", op);
    if (bn->vt != &bn_vt || act->vt != &silu_vt)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "%s: expected a BatchNorm2d and a SiLU module, got "
                            "%s and %s",
                            op, bn->vt->kind, act->vt->kind);
    if (!x) return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: input is NULL", op);
    if (!lucid_param_set_is_materialized(bn->set))
        return lucid_seterr(ctx, LUCID_ERR_STATE,
                            "%s '%s': the parameter set is not materialized "
                            "yet (call lucid_param_set_materialize)",
                            op, bn->name);
    return want_channels(ctx, bn, x, ((bn_priv *)bn->priv)->c);
}

lucid_status lucid_module_batchnorm2d_silu_forward(lucid_ctx *ctx,
                                                   lucid_module *bn,
                                                   lucid_module *act,
                                                   const lucid_tensor *x,
                                                   lucid_tensor **y) {
    if (y) *y = NULL;
    LUCID_TRY(fused_pair(ctx, "BatchNorm2d+SiLU forward", bn, act, x));
    bn_priv *b = bn->priv;
    lucid_device dev = lucid_tensor_device(x);
    lucid_dtype pdt = lucid_param_set_dtype(bn->set);
    int64_t cs[1] = {b->c};
    LUCID_TRY(ensure_like(ctx, &act->outputs[0], x));
    LUCID_TRY(ensure(ctx, &bn->saved[0], dev, pdt, 1, cs));
    LUCID_TRY(ensure(ctx, &bn->saved[1], dev, pdt, 1, cs));
    LUCID_TRY(lucid_nn_batchnorm2d_silu_forward(
        ctx, x, act->outputs[0], bn->params[0]->data, bn->params[1]->data,
        bn->params[2]->data, bn->params[3]->data, bn->params[4]->data,
        bn->saved[0], bn->saved[1], bn->training, b->momentum, b->eps));
    if (y) *y = act->outputs[0];
    return LUCID_OK;
}

/* The fused pair's backward (dc nullable: nn.h lucid_conv_dcols). */
static lucid_status bn_silu_backward_dc(lucid_ctx *ctx, lucid_module *bn, lucid_module *act,
                                        const lucid_tensor *x, const lucid_tensor *dy,
                                        lucid_conv_dcols *dc, lucid_tensor **dx) {
    const char *op = "BatchNorm2d+SiLU backward";
    if (dx) *dx = NULL;
    LUCID_TRY(fused_pair(ctx, op, bn, act, x));
    if (!dy)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "%s '%s': grad_output is NULL", op,
                            bn->name);
    if (!act->outputs[0] || !bn->saved[0] || !bn->saved[1])
        return lucid_seterr(ctx, LUCID_ERR_STATE, "%s '%s': backward before forward",
                            op, bn->name);
    lucid_param *w = bn->params[0], *b = bn->params[1];
    lucid_tensor *gx = NULL;
    if (bn->need_grad_input) {
        LUCID_TRY(ensure_like(ctx, &bn->grad_inputs[0], x));
        gx = bn->grad_inputs[0];
    }
    lucid_tensor *dw = w->trainable ? w->grad : NULL;
    lucid_tensor *db = b->trainable ? b->grad : NULL;
    if (gx || dw || db)
        LUCID_TRY(lucid_nn_batchnorm2d_backward_dcols(
            ctx, x, dy, gx, w->data, b->data, bn->saved[0], bn->saved[1], dw, db,
            bn->training, 0.0, 1.0, 1, dc));
    if (dx) *dx = gx;
    return LUCID_OK;
}

lucid_status lucid_module_batchnorm2d_silu_backward(lucid_ctx *ctx,
                                                    lucid_module *bn,
                                                    lucid_module *act,
                                                    const lucid_tensor *x,
                                                    const lucid_tensor *dy,
                                                    lucid_tensor **dx) {
    return bn_silu_backward_dc(ctx, bn, act, x, dy, NULL, dx);
}

/* BatchNorm2d module bn (act NULL) or the fused pair (act a SiLU) ready
 * for a backward on x: the checks of the plain module calls.  The fused
 * pair: fused_pair and its forward's outputs; bn alone: a BatchNorm2d,
 * check_ready and its forward's output. */
static lucid_status bn_terms_ready(lucid_ctx *ctx, const char *op, lucid_module *bn,
                                   lucid_module *act, const lucid_tensor *x) {
    if (act) {
        LUCID_TRY(fused_pair(ctx, op, bn, act, x));
        if (!act->outputs[0] || !bn->saved[0] || !bn->saved[1])
            return lucid_seterr(ctx, LUCID_ERR_STATE, "%s '%s': backward before forward", op,
                                bn->name);
        return LUCID_OK;
    }
    LUCID_TRY(want_module(ctx, op, bn, &bn_vt));
    const lucid_tensor *in[1] = {x};
    LUCID_TRY(check_ready(ctx, bn, 1, in));
    if (!bn->outputs[0] || !bn->saved[0] || !bn->saved[1])
        return lucid_seterr(ctx, LUCID_ERR_STATE, "%s '%s': backward before forward", op,
                            bn->name);
    return want_channels(ctx, bn, x, ((bn_priv *)bn->priv)->c);
}

lucid_status lucid_module_batchnorm2d_backward_terms(lucid_ctx *ctx, lucid_module *bn,
                                                     lucid_module *act,
                                                     const lucid_tensor *x, int n,
                                                     const lucid_chan_piece *pieces,
                                                     lucid_tensor **dx, int *taken) {
    const char *op = act ? "BatchNorm2d+SiLU backward (dy as terms)"
                         : "BatchNorm2d backward (dy as terms)";
    if (dx) *dx = NULL;
    if (!taken) return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: taken is NULL", op);
    *taken = 0;
    LUCID_TRY(bn_terms_ready(ctx, op, bn, act, x));
    /* the one-pass route needs dx: without it (need_grad_input off) the
     * caller takes the plain call, which allocates nothing for dx either */
    if (!bn->need_grad_input || !bn->training) return LUCID_OK;
    lucid_param *w = bn->params[0], *b = bn->params[1];
    LUCID_TRY(ensure_like(ctx, &bn->grad_inputs[0], x));
    lucid_tensor *gx = bn->grad_inputs[0];
    lucid_tensor *dw = w->trainable ? w->grad : NULL;
    lucid_tensor *db = b->trainable ? b->grad : NULL;
    LUCID_TRY(lucid_nn_batchnorm2d_backward_terms(ctx, x, n, pieces, gx, w->data,
                                                  act ? b->data : NULL, bn->saved[0],
                                                  bn->saved[1], dw, db, bn->training, 0.0, 1.0,
                                                  act ? 1 : 0, taken));
    if (*taken && dx) *dx = gx;
    return LUCID_OK;
}

lucid_status lucid_module_batchnorm2d_terms_fit(lucid_ctx *ctx, lucid_module *bn,
                                                const lucid_tensor *x, int *fit) {
    const char *op = "BatchNorm2d terms fit";
    if (!fit) return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: fit is NULL", op);
    *fit = 0;
    LUCID_TRY(want_module(ctx, op, bn, &bn_vt));
    if (!x) return lucid_seterr(ctx, LUCID_ERR_ARG, "%s: input is NULL", op);
    if (!bn->need_grad_input || !bn->training) return LUCID_OK;
    return lucid_nn_batchnorm2d_terms_fit(ctx, x, 1, fit);
}

lucid_status lucid_module_batchnorm2d_backward_dcols(lucid_ctx *ctx, lucid_module *bn,
                                                     lucid_module *act,
                                                     const lucid_tensor *x,
                                                     const lucid_tensor *dy,
                                                     lucid_module *conv,
                                                     lucid_tensor **dx) {
    const char *op = "BatchNorm2d backward (conv columns)";
    if (dx) *dx = NULL;
    if (!conv || !conv->vt)
        return lucid_seterr(ctx, LUCID_ERR_STATE, "%s: NULL or freed conv module", op);
    LUCID_TRY(want_module(ctx, op, conv, &conv_vt));
    conv_priv *c = conv->priv;
    lucid_conv_dcols *dc = c->dc.armed ? &c->dc : NULL;
    if (act) return bn_silu_backward_dc(ctx, bn, act, x, dy, dc, dx);
    LUCID_TRY(want_module(ctx, op, bn, &bn_vt));
    const lucid_tensor *in[1] = {x};
    LUCID_TRY(check_ready(ctx, bn, 1, in));
    if (!bn->outputs[0])
        return lucid_seterr(ctx, LUCID_ERR_STATE, "%s '%s': backward before forward", op,
                            bn->name);
    LUCID_TRY(bn_backward_dc(ctx, bn, x, dy, dc));
    if (dx) *dx = bn->need_grad_input ? bn->grad_inputs[0] : NULL;
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// MaxPool2d

typedef struct pool_priv {
    lucid_pool2d_params p;
} pool_priv;

static lucid_status pool_fwd(lucid_ctx *ctx, lucid_module *m, int nin,
                             const lucid_tensor *const *in) {
    pool_priv *pp = m->priv;
    const lucid_tensor *x = in[0];
    if (x->ndim != 4)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "MaxPool2d '%s': input must be NCHW",
                            m->name);
    const lucid_pool2d_params *p = &pp->p;
    int64_t ys[4] = {x->shape[0], x->shape[1],
                     lucid_nn_conv_out_size(x->shape[2], p->kernel_h, p->stride_h, p->pad_h, 1),
                     lucid_nn_conv_out_size(x->shape[3], p->kernel_w, p->stride_w, p->pad_w, 1)};
    if (ys[2] < 1 || ys[3] < 1)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "MaxPool2d '%s': input %lldx%lld too small", m->name,
                            (long long)x->shape[2], (long long)x->shape[3]);
    lucid_device dev = lucid_tensor_device(x);
    LUCID_TRY(ensure(ctx, &m->outputs[0], dev, x->dtype, 4, ys));
    LUCID_TRY(ensure(ctx, &m->saved[0], dev, LUCID_I32, 4, ys));
    return lucid_nn_maxpool2d_forward(ctx, x, m->outputs[0], m->saved[0], p);
}

static lucid_status pool_bwd(lucid_ctx *ctx, lucid_module *m, int nin,
                             const lucid_tensor *const *in, int nout,
                             const lucid_tensor *const *go) {
    pool_priv *pp = m->priv;
    if (!m->need_grad_input) return LUCID_OK;
    if (!go[0])
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "MaxPool2d '%s': grad_output is NULL", m->name);
    LUCID_TRY(ensure_like(ctx, &m->grad_inputs[0], in[0]));
    return lucid_nn_maxpool2d_backward(ctx, in[0], go[0], m->grad_inputs[0],
                                       m->saved[0], &pp->p, 0.0);
}

static int pool_describe(const lucid_module *m, char *buf, size_t n) {
    const pool_priv *pp = m->priv;
    return snprintf(buf, n,
                    "MaxPool2d(kernel_size=%d, stride=%d, padding=%d, "
                    "dilation=1, ceil_mode=False)",
                    pp->p.kernel_h, pp->p.stride_h, pp->p.pad_h);
}

static const lucid_module_vtable pool_vt = {"MaxPool2d", pool_fwd, pool_bwd,
                                            pool_describe, NULL};

lucid_status lucid_module_maxpool2d_create(lucid_ctx *ctx, int k, int s, int p,
                                           lucid_module **out) {
    *out = NULL;
    if (k < 1 || s < 1 || p < 0 || 2 * p > k)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "MaxPool2d: need k, s >= 1 and 0 <= p <= k/2 (got "
                            "k=%d s=%d p=%d)",
                            k, s, p);
    LUCID_TRY(module_new(ctx, &pool_vt, NULL, "", 1, 1, sizeof(pool_priv), out));
    ((pool_priv *)(*out)->priv)->p = (lucid_pool2d_params){k, k, s, s, p, p};
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// Upsample (nearest, integer factor)

static lucid_status up_fwd(lucid_ctx *ctx, lucid_module *m, int nin,
                           const lucid_tensor *const *in) {
    int s = *(int *)m->priv;
    const lucid_tensor *x = in[0];
    if (x->ndim != 4)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "Upsample '%s': input must be NCHW",
                            m->name);
    int64_t ys[4] = {x->shape[0], x->shape[1], x->shape[2] * s, x->shape[3] * s};
    LUCID_TRY(ensure(ctx, &m->outputs[0], lucid_tensor_device(x), x->dtype, 4, ys));
    return lucid_nn_upsample_nearest2d_forward(ctx, x, m->outputs[0], s);
}

static lucid_status up_bwd(lucid_ctx *ctx, lucid_module *m, int nin,
                           const lucid_tensor *const *in, int nout,
                           const lucid_tensor *const *go) {
    int s = *(int *)m->priv;
    if (!m->need_grad_input) return LUCID_OK;
    if (!go[0])
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "Upsample '%s': grad_output is NULL", m->name);
    LUCID_TRY(ensure_like(ctx, &m->grad_inputs[0], in[0]));
    return lucid_nn_upsample_nearest2d_backward(ctx, in[0], go[0],
                                                m->grad_inputs[0], s, 0.0);
}

static int up_describe(const lucid_module *m, char *buf, size_t n) {
    return snprintf(buf, n, "Upsample(scale_factor=%d.0, mode='nearest')",
                    *(const int *)m->priv);
}

static const lucid_module_vtable up_vt = {"Upsample", up_fwd, up_bwd,
                                          up_describe, NULL};

lucid_status lucid_module_upsample_create(lucid_ctx *ctx, int scale,
                                          lucid_module **out) {
    *out = NULL;
    if (scale < 1)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "Upsample: scale %d < 1", scale);
    LUCID_TRY(module_new(ctx, &up_vt, NULL, "", 1, 1, sizeof(int), out));
    *(int *)(*out)->priv = scale;
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// Concat (dim 1)

static lucid_status cat_fwd(lucid_ctx *ctx, lucid_module *m, int nin,
                            const lucid_tensor *const *in) {
    const lucid_tensor *x0 = in[0];
    if (x0->ndim < 2)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "Concat '%s': inputs need rank >= 2",
                            m->name);
    int64_t ys[LUCID_MAX_DIMS];
    memcpy(ys, x0->shape, sizeof ys);
    ys[1] = 0;
    for (int i = 0; i < nin; i++) {
        const lucid_tensor *x = in[i];
        int ok = x->ndim == x0->ndim && x->dtype == x0->dtype &&
                 x->shape[0] == x0->shape[0];
        for (int d = 2; ok && d < x->ndim; d++) ok = x->shape[d] == x0->shape[d];
        if (!ok) {
            char a[128], b[128];
            return lucid_seterr(ctx, LUCID_ERR_ARG,
                                "Concat '%s': input %d %s (%s) does not match "
                                "input 0 %s (%s) outside dim 1",
                                m->name, i,
                                lucid_shape_str(x->ndim, x->shape, a, sizeof a),
                                lucid_dtype_name(x->dtype),
                                lucid_shape_str(x0->ndim, x0->shape, b, sizeof b),
                                lucid_dtype_name(x0->dtype));
        }
        ys[1] += x->shape[1];
    }
    LUCID_TRY(ensure(ctx, &m->outputs[0], lucid_tensor_device(x0), x0->dtype,
                     x0->ndim, ys));
    lucid_chan_piece pc[LUCID_CHAN_PIECES_MAX];
    int64_t off = 0;
    for (int i = 0; i < nin; i++) {
        pc[i] = (lucid_chan_piece){.dst = m->outputs[0], .dst_c0 = off, .src = in[i],
                                   .nch = in[i]->shape[1]};
        off += in[i]->shape[1];
    }
    return lucid_nn_channel_copy_multi(ctx, nin, pc);
}

static lucid_status cat_bwd(lucid_ctx *ctx, lucid_module *m, int nin,
                            const lucid_tensor *const *in, int nout,
                            const lucid_tensor *const *go) {
    if (!m->need_grad_input) return LUCID_OK;
    if (!go[0])
        return lucid_seterr(ctx, LUCID_ERR_ARG, "Concat '%s': grad_output is NULL",
                            m->name);
    lucid_chan_piece pc[LUCID_CHAN_PIECES_MAX];
    int64_t off = 0;
    for (int i = 0; i < nin; i++) {
        LUCID_TRY(ensure_like(ctx, &m->grad_inputs[i], in[i]));
        pc[i] = (lucid_chan_piece){.dst = m->grad_inputs[i], .src = go[0], .src_c0 = off,
                                   .nch = in[i]->shape[1]};
        off += in[i]->shape[1];
    }
    return lucid_nn_channel_copy_multi(ctx, nin, pc);
}

static int cat_describe(const lucid_module *m, char *buf, size_t n) {
    return snprintf(buf, n, "Concat(dim=1, inputs=%d)", m->ninputs);
}

static const lucid_module_vtable cat_vt = {"Concat", cat_fwd, cat_bwd,
                                           cat_describe, NULL};

lucid_status lucid_module_concat_create(lucid_ctx *ctx, int ninputs,
                                        lucid_module **out) {
    *out = NULL;
    if (ninputs < 1 || ninputs > 64)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "Concat: %d inputs (1..64)",
                            ninputs);
    return module_new(ctx, &cat_vt, NULL, "", ninputs, 1, 0, out);
}

// ----------------------------------------------------------------------------
// Split / Chunk (dim 1)

typedef struct split_priv {
    int equal;        /* torch.chunk: sizes from C / noutputs */
    int64_t sizes[64];
} split_priv;

static lucid_status split_sizes(lucid_ctx *ctx, lucid_module *m,
                                const lucid_tensor *x, int64_t *sizes) {
    split_priv *sp = m->priv;
    if (x->ndim < 2)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "Split '%s': input needs rank >= 2",
                            m->name);
    int64_t C = x->shape[1], total = 0;
    for (int i = 0; i < m->noutputs; i++) {
        sizes[i] = sp->equal ? C / m->noutputs : sp->sizes[i];
        total += sizes[i];
    }
    if (total != C || (sp->equal && C % m->noutputs))
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "Split '%s': %lld input channels do not split into "
                            "the %d requested pieces",
                            m->name, (long long)C, m->noutputs);
    return LUCID_OK;
}

static lucid_status split_fwd(lucid_ctx *ctx, lucid_module *m, int nin,
                              const lucid_tensor *const *in) {
    const lucid_tensor *x = in[0];
    int64_t sizes[64];
    LUCID_TRY(split_sizes(ctx, m, x, sizes));
    int64_t off = 0, ys[LUCID_MAX_DIMS];
    memcpy(ys, x->shape, sizeof ys);
    lucid_chan_piece pc[LUCID_CHAN_PIECES_MAX];
    for (int i = 0; i < m->noutputs; i++) {
        ys[1] = sizes[i];
        LUCID_TRY(ensure(ctx, &m->outputs[i], lucid_tensor_device(x), x->dtype,
                         x->ndim, ys));
        pc[i] = (lucid_chan_piece){.dst = m->outputs[i], .src = x, .src_c0 = off,
                                   .nch = sizes[i]};
        off += sizes[i];
    }
    return lucid_nn_channel_copy_multi(ctx, m->noutputs, pc);
}

static lucid_status split_bwd(lucid_ctx *ctx, lucid_module *m, int nin,
                              const lucid_tensor *const *in, int nout,
                              const lucid_tensor *const *go) {
    if (!m->need_grad_input) return LUCID_OK;
    const lucid_tensor *x = in[0];
    int64_t sizes[64];
    LUCID_TRY(split_sizes(ctx, m, x, sizes));
    LUCID_TRY(ensure_like(ctx, &m->grad_inputs[0], x));
    lucid_tensor *dx = m->grad_inputs[0];
    lucid_chan_piece pc[LUCID_CHAN_PIECES_MAX];
    int64_t off = 0;
    for (int i = 0; i < m->noutputs; i++) { /* unused output (go NULL): zeros */
        pc[i] = (lucid_chan_piece){.dst = dx, .dst_c0 = off, .src = go[i], .nch = sizes[i]};
        off += sizes[i];
    }
    return lucid_nn_channel_copy_multi(ctx, m->noutputs, pc);
}

static int split_describe(const lucid_module *m, char *buf, size_t n) {
    const split_priv *sp = m->priv;
    if (sp->equal) return snprintf(buf, n, "Chunk(chunks=%d, dim=1)", m->noutputs);
    size_t k = (size_t)snprintf(buf, n, "Split(sizes=[");
    for (int i = 0; i < m->noutputs && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld",
                              (long long)sp->sizes[i]);
    if (k < n) k += (size_t)snprintf(buf + k, n - k, "], dim=1)");
    return (int)k;
}

static const lucid_module_vtable split_vt = {"Split", split_fwd, split_bwd,
                                             split_describe, NULL};

lucid_status lucid_module_split_create(lucid_ctx *ctx, int noutputs,
                                       const int64_t *sizes,
                                       lucid_module **out) {
    *out = NULL;
    if (noutputs < 1 || noutputs > 64)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "Split: %d outputs (1..64)",
                            noutputs);
    if (sizes)
        for (int i = 0; i < noutputs; i++)
            if (sizes[i] < 0)
                return lucid_seterr(ctx, LUCID_ERR_ARG,
                                    "Split: size %d is negative", i);
    LUCID_TRY(module_new(ctx, &split_vt, NULL, "", 1, noutputs,
                         sizeof(split_priv), out));
    split_priv *sp = (*out)->priv;
    sp->equal = sizes == NULL;
    if (sizes)
        for (int i = 0; i < noutputs; i++) sp->sizes[i] = sizes[i];
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// Add

static lucid_status add_fwd(lucid_ctx *ctx, lucid_module *m, int nin,
                            const lucid_tensor *const *in) {
    LUCID_TRY(ensure_like(ctx, &m->outputs[0], in[0]));
    return lucid_nn_add_forward(ctx, in[0], in[1], m->outputs[0]);
}

static lucid_status add_bwd(lucid_ctx *ctx, lucid_module *m, int nin,
                            const lucid_tensor *const *in, int nout,
                            const lucid_tensor *const *go) {
    if (!m->need_grad_input) return LUCID_OK;
    if (!go[0])
        return lucid_seterr(ctx, LUCID_ERR_ARG, "Add '%s': grad_output is NULL",
                            m->name);
    for (int i = 0; i < 2; i++) {
        LUCID_TRY(ensure_like(ctx, &m->grad_inputs[i], in[i]));
        LUCID_TRY(lucid_copy(ctx, m->grad_inputs[i], go[0]));
    }
    return LUCID_OK;
}

static const lucid_module_vtable add_vt = {"Add", add_fwd, add_bwd, NULL, NULL};

lucid_status lucid_module_add_create(lucid_ctx *ctx, lucid_module **out) {
    return module_new(ctx, &add_vt, NULL, "", 2, 1, 0, out);
}

// ----------------------------------------------------------------------------
// Softmax (last dim)

static lucid_status sm_fwd(lucid_ctx *ctx, lucid_module *m, int nin,
                           const lucid_tensor *const *in) {
    LUCID_TRY(ensure_like(ctx, &m->outputs[0], in[0]));
    return lucid_nn_softmax_forward(ctx, in[0], m->outputs[0]);
}

static lucid_status sm_bwd(lucid_ctx *ctx, lucid_module *m, int nin,
                           const lucid_tensor *const *in, int nout,
                           const lucid_tensor *const *go) {
    if (!m->need_grad_input) return LUCID_OK;
    if (!go[0])
        return lucid_seterr(ctx, LUCID_ERR_ARG, "Softmax '%s': grad_output is NULL",
                            m->name);
    LUCID_TRY(ensure_like(ctx, &m->grad_inputs[0], in[0]));
    return lucid_nn_softmax_backward(ctx, m->outputs[0], go[0],
                                     m->grad_inputs[0], 0.0);
}

static int sm_describe(const lucid_module *m, char *buf, size_t n) {
    return snprintf(buf, n, "Softmax(dim=-1)");
}

static const lucid_module_vtable sm_vt = {"Softmax", sm_fwd, sm_bwd, sm_describe,
                                          NULL};

lucid_status lucid_module_softmax_create(lucid_ctx *ctx, lucid_module **out) {
    return module_new(ctx, &sm_vt, NULL, "", 1, 1, 0, out);
}

// ----------------------------------------------------------------------------
// MatMul (2 inputs, through the core op lucid_matmul)

typedef struct mm_priv {
    int ta, tb;
    double alpha;
} mm_priv;

static lucid_status mm_fwd(lucid_ctx *ctx, lucid_module *m, int nin,
                           const lucid_tensor *const *in) {
    mm_priv *p = m->priv;
    const lucid_tensor *a = in[0], *b = in[1];
    if (a->ndim < 2 || b->ndim != a->ndim)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "MatMul '%s': inputs need equal ranks >= 2 (got %d "
                            "and %d)",
                            m->name, a->ndim, b->ndim);
    int n = a->ndim;
    int64_t ys[LUCID_MAX_DIMS];
    memcpy(ys, a->shape, sizeof ys);
    ys[n - 2] = p->ta ? a->shape[n - 1] : a->shape[n - 2];
    ys[n - 1] = p->tb ? b->shape[n - 2] : b->shape[n - 1];
    LUCID_TRY(ensure(ctx, &m->outputs[0], lucid_tensor_device(a), a->dtype, n, ys));
    return lucid_matmul(ctx, m->outputs[0], a, b, p->ta, p->tb, p->alpha, 0.0);
}

static lucid_status mm_bwd(lucid_ctx *ctx, lucid_module *m, int nin,
                           const lucid_tensor *const *in, int nout,
                           const lucid_tensor *const *go) {
    mm_priv *p = m->priv;
    if (!m->need_grad_input) return LUCID_OK;
    const lucid_tensor *a = in[0], *b = in[1], *dc = go[0];
    if (!dc)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "MatMul '%s': grad_output is NULL",
                            m->name);
    LUCID_TRY(ensure_like(ctx, &m->grad_inputs[0], a));
    LUCID_TRY(ensure_like(ctx, &m->grad_inputs[1], b));
    lucid_tensor *da = m->grad_inputs[0], *db = m->grad_inputs[1];
    double al = p->alpha;
    /* C = al * A' B' (A' = op(A), B' = op(B)); dA' = al dC B'^T,
     * dB' = al A'^T dC; transpose back where op transposed. */
    if (!p->ta) {
        LUCID_TRY(lucid_matmul(ctx, da, dc, b, 0, !p->tb, al, 0.0));
    } else {
        LUCID_TRY(lucid_matmul(ctx, da, b, dc, p->tb, 1, al, 0.0));
    }
    if (!p->tb) {
        LUCID_TRY(lucid_matmul(ctx, db, a, dc, !p->ta, 0, al, 0.0));
    } else {
        LUCID_TRY(lucid_matmul(ctx, db, dc, a, 1, p->ta, al, 0.0));
    }
    return LUCID_OK;
}

static int mm_describe(const lucid_module *m, char *buf, size_t n) {
    const mm_priv *p = m->priv;
    return snprintf(buf, n, "MatMul(trans_a=%s, trans_b=%s, alpha=%g)",
                    p->ta ? "True" : "False", p->tb ? "True" : "False", p->alpha);
}

static const lucid_module_vtable mm_vt = {"MatMul", mm_fwd, mm_bwd, mm_describe,
                                          NULL};

lucid_status lucid_module_matmul_create(lucid_ctx *ctx, int trans_a,
                                        int trans_b, double alpha,
                                        lucid_module **out) {
    LUCID_TRY(module_new(ctx, &mm_vt, NULL, "", 2, 1, sizeof(mm_priv), out));
    mm_priv *p = (*out)->priv;
    p->ta = trans_a != 0;
    p->tb = trans_b != 0;
    p->alpha = alpha;
    return LUCID_OK;
}

// ----------------------------------------------------------------------------
// DFL

static lucid_status dfl_fwd(lucid_ctx *ctx, lucid_module *m, int nin,
                            const lucid_tensor *const *in) {
    int R = *(int *)m->priv;
    const lucid_tensor *x = in[0];
    if (x->ndim < 2 || x->shape[1] != 4 * (int64_t)R)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "DFL '%s': input must be [B, %d, ...]", m->name, 4 * R);
    int64_t ys[LUCID_MAX_DIMS];
    memcpy(ys, x->shape, sizeof ys);
    ys[1] = 4;
    LUCID_TRY(ensure(ctx, &m->outputs[0], lucid_tensor_device(x), x->dtype,
                     x->ndim, ys));
    return lucid_nn_dfl_forward(ctx, x, m->outputs[0], R);
}

static lucid_status dfl_bwd(lucid_ctx *ctx, lucid_module *m, int nin,
                            const lucid_tensor *const *in, int nout,
                            const lucid_tensor *const *go) {
    int R = *(int *)m->priv;
    if (!m->need_grad_input) return LUCID_OK;
    if (!go[0])
        return lucid_seterr(ctx, LUCID_ERR_ARG, "DFL '%s': grad_output is NULL",
                            m->name);
    LUCID_TRY(ensure_like(ctx, &m->grad_inputs[0], in[0]));
    return lucid_nn_dfl_backward(ctx, in[0], go[0], m->grad_inputs[0], R, 0.0);
}

static int dfl_describe(const lucid_module *m, char *buf, size_t n) {
    int R = *(const int *)m->priv;
    return snprintf(buf, n,
                    "DFL(\n  (conv): Conv2d(%d, 1, kernel_size=(1, 1), "
                    "stride=(1, 1), bias=False)\n)",
                    R);
}

static const lucid_module_vtable dfl_vt = {"DFL", dfl_fwd, dfl_bwd, dfl_describe,
                                           NULL};

lucid_status lucid_module_dfl_create(lucid_ctx *ctx, lucid_param_set *set,
                                     const char *prefix, int reg_max,
                                     lucid_module **out) {
    *out = NULL;
    if (!set)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "DFL '%s': param set is NULL",
                            prefix ? prefix : "");
    if (reg_max < 1)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "DFL: reg_max %d < 1", reg_max);
    lucid_module *m = NULL;
    LUCID_TRY(module_new(ctx, &dfl_vt, set, prefix, 1, 1, sizeof(int), &m));
    *(int *)m->priv = reg_max;
    int64_t ws[4] = {1, reg_max, 1, 1};
    lucid_init_rule ar = {LUCID_INIT_ARANGE, 0, 0, 0};
    lucid_status st = declare(ctx, m, "conv.weight", LUCID_PARAM_KIND_PARAM,
                              LUCID_F32, 4, ws, 0, LUCID_PARAM_GROUP_DECAY, ar);
    if (st != LUCID_OK) {
        lucid_module_release(m);
        return st;
    }
    *out = m;
    return LUCID_OK;
}
