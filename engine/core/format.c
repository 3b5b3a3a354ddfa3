/*
 * format.c — lucid_tensor_format: a tensor as text, the way PyTorch prints
 * it (torch/_tensor_str.py, default print options), with lucid's dtype and
 * device names as suffixes:
 *
 *   tensor([[ 0.1000, -2.0000],
 *           [ 3.5000,  4.0000]], dtype=f32, device=cpu)
 *
 * Rules, as in PyTorch: 4 decimals; float tensors whose non-zero finite
 * values are all integers print as "1." ("int mode"); scientific notation
 * ("1.0000e+05") when max/min of the non-zero finite magnitudes exceeds
 * 1000, the max exceeds 1e8, or (outside int mode) the min is below 1e-4;
 * integer dtypes print plain integers. Every element is right-aligned to the
 * widest one. Beyond 1000 elements the output is summarised: 3 edge items
 * per dim around "...". Rows wrap at 80 columns. bf16/f16 values print as
 * the exact values they store (e.g. bf16(0.1) = 0.10009765625 -> 0.1001).
 *
 * CUDA tensors are copied to the CPU first (and the device synchronized).
 */
#include "internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FMT_THRESHOLD 1000 /* summarise beyond this many elements */
#define FMT_EDGE 3         /* items kept at each edge when summarised */
#define FMT_LINEWIDTH 80
#define FMT_PRECISION 4
#define FMT_PREFIX "tensor("

/* ------------------------------------------------------------ string buf */

typedef struct strbuf {
    char *p;
    size_t len, cap;
    int failed; /* an allocation failed; content is truncated */
} strbuf;

static void sb_putn(strbuf *sb, const char *s, size_t n) {
    if (sb->failed) return;
    if (sb->len + n + 1 > sb->cap) {
        size_t cap = sb->cap ? sb->cap : 256;
        while (cap < sb->len + n + 1) cap *= 2;
        char *q = realloc(sb->p, cap);
        if (!q) {
            sb->failed = 1;
            return;
        }
        sb->p = q;
        sb->cap = cap;
    }
    memcpy(sb->p + sb->len, s, n);
    sb->len += n;
    sb->p[sb->len] = '\0';
}

static void sb_puts(strbuf *sb, const char *s) { sb_putn(sb, s, strlen(s)); }

static void sb_spaces(strbuf *sb, int n) {
    for (int i = 0; i < n; i++) sb_putn(sb, " ", 1);
}

/* ------------------------------------------------------------- formatter */

typedef struct fmt_state {
    const lucid_tensor *t; /* a CPU tensor */
    int summarize;
    int is_float;
    int int_mode, sci_mode, max_width;
    int any;          /* saw a non-zero finite value */
    double amin, amax; /* of the non-zero finite magnitudes */
} fmt_state;

/* Element at storage element offset off, as double. */
static double read_at(const lucid_tensor *t, int64_t off) {
    const char *base = t->storage->data;
    switch (t->dtype) {
    case LUCID_F32: return ((const float *)base)[off];
    case LUCID_F64: return ((const double *)base)[off];
    case LUCID_BF16: return lucid_bf16_to_f32(((const uint16_t *)base)[off]);
    case LUCID_F16: return lucid_f16_to_f32(((const uint16_t *)base)[off]);
    case LUCID_U8: return ((const uint8_t *)base)[off];
    case LUCID_I32: return ((const int32_t *)base)[off];
    case LUCID_I64: return (double)((const int64_t *)base)[off];
    default: return 0.0;
    }
}

/* The text of one value (unpadded); returns its length. */
static int value_text(const fmt_state *st, double v, char *out, size_t n) {
    if (!st->is_float) return snprintf(out, n, "%lld", (long long)v);
    if (isnan(v)) return snprintf(out, n, "nan");
    if (isinf(v)) return snprintf(out, n, v > 0 ? "inf" : "-inf");
    if (st->sci_mode) return snprintf(out, n, "%.*e", FMT_PRECISION, v);
    if (st->int_mode) return snprintf(out, n, "%.0f.", v);
    return snprintf(out, n, "%.*f", FMT_PRECISION, v);
}

typedef void (*visit_fn)(fmt_state *st, double v);

/* Visit the elements that will be printed, in print order. */
static void visit(fmt_state *st, int dim, int64_t off, visit_fn f) {
    const lucid_tensor *t = st->t;
    if (dim == t->ndim) {
        f(st, read_at(t, off));
        return;
    }
    int64_t n = t->shape[dim], s = t->strides[dim];
    if (st->summarize && n > 2 * FMT_EDGE) {
        for (int64_t i = 0; i < FMT_EDGE; i++) visit(st, dim + 1, off + i * s, f);
        for (int64_t i = n - FMT_EDGE; i < n; i++)
            visit(st, dim + 1, off + i * s, f);
    } else {
        for (int64_t i = 0; i < n; i++) visit(st, dim + 1, off + i * s, f);
    }
}

static void stats_visit(fmt_state *st, double v) {
    if (!st->is_float || !isfinite(v) || v == 0) return;
    double a = fabs(v);
    if (!st->any) {
        st->amin = st->amax = a;
        st->any = 1;
    } else {
        if (a < st->amin) st->amin = a;
        if (a > st->amax) st->amax = a;
    }
    if (v != ceil(v)) st->int_mode = 0;
}

static void width_visit(fmt_state *st, double v) {
    if (st->is_float && (!isfinite(v) || v == 0)) return;
    char buf[64];
    int w = value_text(st, v, buf, sizeof buf);
    if (w > st->max_width) st->max_width = w;
}

/* Decide int/sci mode and the column width (PyTorch's _Formatter). */
static void formatter_init(fmt_state *st) {
    st->int_mode = 1;
    st->sci_mode = 0;
    st->max_width = 1;
    st->any = 0;
    visit(st, 0, st->t->offset, stats_visit);
    if (st->is_float) {
        if (!st->any) return;
        if (st->amax / st->amin > 1000.0 || st->amax > 1.0e8 ||
            (!st->int_mode && st->amin < 1.0e-4))
            st->sci_mode = 1;
    }
    visit(st, 0, st->t->offset, width_visit);
}

static void put_value(const fmt_state *st, strbuf *sb, double v) {
    char buf[64];
    int w = value_text(st, v, buf, sizeof buf);
    sb_spaces(sb, st->max_width - w);
    sb_puts(sb, buf);
}

/* ---------------------------------------------------------------- layout */

/* A 1-D row at dim (the last), wrapped to the line width. */
static void put_vector(const fmt_state *st, strbuf *sb, int dim, int64_t off,
                       int indent) {
    const lucid_tensor *t = st->t;
    int64_t n = t->shape[dim], s = t->strides[dim];
    int elem_len = st->max_width + 2;
    int per_line = (FMT_LINEWIDTH - indent) / elem_len;
    if (per_line < 1) per_line = 1;
    int summarised = st->summarize && n > 2 * FMT_EDGE;
    int64_t items = summarised ? 2 * FMT_EDGE + 1 : n;
    sb_puts(sb, "[");
    for (int64_t k = 0; k < items; k++) {
        if (k > 0) {
            if (k % per_line == 0) {
                sb_puts(sb, ",\n");
                sb_spaces(sb, indent + 1);
            } else {
                sb_puts(sb, ", ");
            }
        }
        int64_t i = k;
        if (summarised) {
            if (k == FMT_EDGE) {
                sb_puts(sb, " ...");
                continue;
            }
            if (k > FMT_EDGE) i = n - (items - k);
        }
        put_value(st, sb, read_at(t, off + i * s));
    }
    sb_puts(sb, "]");
}

static void put_block(const fmt_state *st, strbuf *sb, int dim, int64_t off,
                      int indent) {
    const lucid_tensor *t = st->t;
    int rest = t->ndim - dim;
    if (rest == 1) {
        put_vector(st, sb, dim, off, indent);
        return;
    }
    int64_t n = t->shape[dim], s = t->strides[dim];
    int summarised = st->summarize && n > 2 * FMT_EDGE;
    int64_t items = summarised ? 2 * FMT_EDGE + 1 : n;
    sb_puts(sb, "[");
    for (int64_t k = 0; k < items; k++) {
        if (k > 0) {
            sb_puts(sb, ",");
            for (int j = 0; j < rest - 1; j++) sb_puts(sb, "\n");
            sb_spaces(sb, indent + 1);
        }
        int64_t i = k;
        if (summarised) {
            if (k == FMT_EDGE) {
                sb_puts(sb, "...");
                continue;
            }
            if (k > FMT_EDGE) i = n - (items - k);
        }
        put_block(st, sb, dim + 1, off + i * s, indent + 1);
    }
    sb_puts(sb, "]");
}

/* PyTorch's _add_suffixes: ", suffix", or a new line when it would pass
 * the line width. */
static void add_suffix(strbuf *sb, const char *suffix, int indent) {
    if (sb->failed) return;
    const char *nl = strrchr(sb->p, '\n');
    size_t last = nl ? (size_t)(sb->p + sb->len - nl) + 1 : sb->len + 2;
    if (last + strlen(suffix) + 2 > FMT_LINEWIDTH) {
        sb_puts(sb, ",\n");
        sb_spaces(sb, indent);
    } else {
        sb_puts(sb, ", ");
    }
    sb_puts(sb, suffix);
}

static void format_cpu(const lucid_tensor *t, lucid_device dev, strbuf *sb) {
    fmt_state st;
    memset(&st, 0, sizeof st);
    st.t = t;
    st.is_float = lucid_dtype_is_float(t->dtype);
    int64_t numel = lucid_tensor_numel(t);
    st.summarize = numel > FMT_THRESHOLD;
    int indent = (int)strlen(FMT_PREFIX);
    char suffix[160];

    sb_puts(sb, FMT_PREFIX);
    if (numel == 0) {
        sb_puts(sb, "[]");
        if (t->ndim != 1) {
            size_t n = (size_t)snprintf(suffix, sizeof suffix, "size=(");
            for (int i = 0; i < t->ndim && n < sizeof suffix; i++)
                n += (size_t)snprintf(suffix + n, sizeof suffix - n,
                                      i ? ", %lld" : "%lld",
                                      (long long)t->shape[i]);
            if (n < sizeof suffix)
                snprintf(suffix + n, sizeof suffix - n, "%s",
                         t->ndim == 1 ? ",)" : ")");
            add_suffix(sb, suffix, indent);
        }
    } else {
        formatter_init(&st);
        if (t->ndim == 0)
            put_value(&st, sb, read_at(t, t->offset));
        else
            put_block(&st, sb, 0, t->offset, indent);
    }
    snprintf(suffix, sizeof suffix, "dtype=%s", lucid_dtype_name(t->dtype));
    add_suffix(sb, suffix, indent);
    if (dev.type == LUCID_CPU)
        snprintf(suffix, sizeof suffix, "device=cpu");
    else
        snprintf(suffix, sizeof suffix, "device=cuda:%d", dev.index);
    add_suffix(sb, suffix, indent);
    sb_puts(sb, ")");
}

int lucid_tensor_format(lucid_ctx *ctx, const lucid_tensor *t, char *buf,
                        size_t buflen) {
    lucid_device dev = lucid_tensor_device(t);
    lucid_tensor *host = NULL;
    const lucid_tensor *src = t;
    if (dev.type != LUCID_CPU) {
        lucid_device cpu = {LUCID_CPU, 0};
        if (lucid_tensor_to(ctx, t, cpu, t->dtype, &host) != LUCID_OK) return -1;
        if (lucid_ctx_synchronize(ctx) != LUCID_OK) {
            lucid_tensor_release(host);
            return -1;
        }
        src = host;
    }
    strbuf sb = {NULL, 0, 0, 0};
    format_cpu(src, dev, &sb);
    lucid_tensor_release(host);
    if (sb.failed) {
        free(sb.p);
        lucid_seterr(ctx, LUCID_ERR_OOM, "tensor format: out of host memory");
        return -1;
    }
    int n = (int)sb.len;
    if (buf && buflen) snprintf(buf, buflen, "%s", sb.p);
    free(sb.p);
    return n;
}
