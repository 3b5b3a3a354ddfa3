/*
 * test_core.c — C unit tests of the tensor core (engine/core/): Philox
 * known answers, f16/bf16 conversions, views and their error messages,
 * broadcasting, contexts, storage refcounts and CPU memory statistics.
 *
 * Each check prints "ok <name>" or "not ok <name>: <reason>" (spec/c/test.h);
 * the exit status is non-zero when any check failed.
 */
#include "test.h"
#include "internal.h"
#include <stdint.h>

static lucid_ctx *ctx_;
static const lucid_device CPU = {LUCID_CPU, 0};

static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* "ok" when the context's message contains every one of the strings. */
static int msg_has(const char *a, const char *b, const char *c) {
    const char *m = lucid_ctx_error(ctx_);
    return strstr(m, a) && (!b || strstr(m, b)) && (!c || strstr(m, c));
}

/* ------------------------------------------------------------- philox */

static void test_philox(void) {
    static const struct { uint32_t ctr[4], key[2], want[4]; } kat[3] = {
        {{0, 0, 0, 0}, {0, 0},
         {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
        {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
         {0xffffffffu, 0xffffffffu},
         {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
        {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
         {0xa4093822u, 0x299f31d0u},
         {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
    };
    const char *names[3] = {"philox.kat_zero", "philox.kat_ones", "philox.kat_pi"};
    for (int k = 0; k < 3; k++) {
        uint32_t out[4];
        lucid_philox4x32_10(kat[k].ctr, kat[k].key, out);
        CHECK(names[k], memcmp(out, kat[k].want, sizeof out) == 0,
              "got %08x %08x %08x %08x want %08x %08x %08x %08x", out[0],
              out[1], out[2], out[3], kat[k].want[0], kat[k].want[1],
              kat[k].want[2], kat[k].want[3]);
    }
    uint32_t out[4];
    lucid_philox4x32(0, 0, out);
    CHECK("philox.api_zero", memcmp(out, kat[0].want, sizeof out) == 0,
          "lucid_philox4x32(0,0) = %08x %08x %08x %08x", out[0], out[1],
          out[2], out[3]);
    /* the 64-bit API maps counter -> (lo, hi, 0, 0), seed -> (lo, hi) */
    uint64_t seed = 0x0123456789abcdefull, ctr = 0xfedcba9876543210ull;
    uint32_t c4[4] = {0x76543210u, 0xfedcba98u, 0, 0};
    uint32_t k2[2] = {0x89abcdefu, 0x01234567u};
    uint32_t ref[4];
    lucid_philox4x32_10(c4, k2, ref);
    lucid_philox4x32(seed, ctr, out);
    CHECK("philox.api_word_mapping", memcmp(out, ref, sizeof out) == 0,
          "64-bit API does not map to (lo,hi,0,0)/(lo,hi)");
}

/* ------------------------------------------------------------- f16 */

/* Value of an f16 bit pattern computed independently in double. */
static double f16_ref(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) v = ldexp((double)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexp((double)(m + 1024), e - 25);
    return s ? -v : v;
}

static void test_f16(void) {
    int bad_val = 0, bad_rt = 0, first = -1;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = lucid_f16_to_f32((uint16_t)h);
        double r = f16_ref((uint16_t)h);
        int is_nan = ((h >> 10) & 31) == 31 && (h & 1023);
        if (is_nan) {
            uint16_t back = lucid_f32_to_f16(f);
            if (!isnan(f)) bad_val++;
            if (!(((back >> 10) & 31) == 31 && (back & 1023)) ||
                (back & 0x8000) != (h & 0x8000))
                bad_rt++;
            continue;
        }
        if ((double)f != r || !signbit(f) != !signbit(r)) {
            bad_val++;
            if (first < 0) first = (int)h;
        }
        if (lucid_f32_to_f16(f) != h) {
            bad_rt++;
            if (first < 0) first = (int)h;
        }
    }
    CHECK("f16.exhaustive_values", bad_val == 0,
          "%d of 65536 patterns decode wrongly (first 0x%04x)", bad_val, first);
    CHECK("f16.exhaustive_round_trip", bad_rt == 0,
          "%d of 65536 patterns do not round-trip (first 0x%04x)", bad_rt, first);

    /* round to nearest even at every midpoint between adjacent finite f16 */
    int bad_tie = 0;
    for (uint32_t h = 0; h < 0x7bff; h++) {
        double lo = f16_ref((uint16_t)h), hi = f16_ref((uint16_t)(h + 1));
        float mid = (float)((lo + hi) / 2); /* exact: 12 significant bits */
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        if (lucid_f32_to_f16(mid) != even) bad_tie++;
        if (lucid_f32_to_f16(nextafterf(mid, INFINITY)) != h + 1) bad_tie++;
        if (lucid_f32_to_f16(nextafterf(mid, 0)) != h) bad_tie++;
        if (lucid_f32_to_f16(-mid) != (even | 0x8000)) bad_tie++;
    }
    CHECK("f16.round_nearest_even_all_midpoints", bad_tie == 0,
          "%d midpoint roundings wrong", bad_tie);
    CHECK("f16.overflow",
          lucid_f32_to_f16(65504.0f) == 0x7bff &&
              lucid_f32_to_f16(nextafterf(65520.0f, 0)) == 0x7bff &&
              lucid_f32_to_f16(65520.0f) == 0x7c00 &&
              lucid_f32_to_f16(1e6f) == 0x7c00 &&
              lucid_f32_to_f16(-1e6f) == 0xfc00 &&
              lucid_f32_to_f16(INFINITY) == 0x7c00 &&
              lucid_f32_to_f16(bits_f32(0x7f7fffffu)) == 0x7c00,
          "overflow does not give Inf");
    CHECK("f16.underflow_subnormal",
          lucid_f32_to_f16(ldexpf(1, -25)) == 0x0000 &&
              lucid_f32_to_f16(nextafterf(ldexpf(1, -25), 1)) == 0x0001 &&
              lucid_f32_to_f16(ldexpf(3, -25)) == 0x0002 &&
              lucid_f32_to_f16(ldexpf(1, -26)) == 0x0000 &&
              lucid_f32_to_f16(-ldexpf(1, -25)) == 0x8000 &&
              lucid_f32_to_f16(ldexpf(1, -14)) == 0x0400 &&
              lucid_f32_to_f16(nextafterf(ldexpf(1, -14), 0)) == 0x0400 &&
              lucid_f32_to_f16(bits_f32(1)) == 0,
          "subnormal rounding wrong");
    uint16_t qn = lucid_f32_to_f16(NAN), sn = lucid_f32_to_f16(bits_f32(0x7f800001u));
    uint16_t nn = lucid_f32_to_f16(-NAN);
    CHECK("f16.nan", (qn & 0x7c00) == 0x7c00 && (qn & 0x3ff) &&
                         (sn & 0x7c00) == 0x7c00 && (sn & 0x3ff) &&
                         (nn & 0x8000) && (nn & 0x3ff),
          "NaN not kept: 0x%04x 0x%04x 0x%04x", qn, sn, nn);
}

/* ------------------------------------------------------------ bf16 */

static void test_bf16(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = lucid_bf16_to_f32((uint16_t)h);
        if (f32_bits(f) != h << 16) bad++;
        int is_nan = ((h >> 7) & 0xff) == 0xff && (h & 0x7f);
        uint16_t back = lucid_f32_to_bf16(f);
        if (is_nan) {
            if (!(((back >> 7) & 0xff) == 0xff && (back & 0x7f))) bad++;
        } else if (back != h) {
            bad++;
        }
    }
    CHECK("bf16.exhaustive_round_trip", bad == 0, "%d patterns wrong", bad);
    int bad_tie = 0;
    for (uint32_t h = 0; h < 0x7f7f; h++) { /* every pair of finite values */
        uint32_t mid = (h << 16) | 0x8000u;
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        if (lucid_f32_to_bf16(bits_f32(mid)) != even) bad_tie++;
        if (lucid_f32_to_bf16(bits_f32(mid + 1)) != h + 1) bad_tie++;
        if (lucid_f32_to_bf16(bits_f32(mid - 1)) != h) bad_tie++;
        if (lucid_f32_to_bf16(bits_f32(mid | 0x80000000u)) != (even | 0x8000))
            bad_tie++;
    }
    CHECK("bf16.round_nearest_even_all_midpoints", bad_tie == 0,
          "%d midpoint roundings wrong", bad_tie);
    CHECK("bf16.ties_examples",
          lucid_f32_to_bf16(bits_f32(0x3f808000u)) == 0x3f80 &&
              lucid_f32_to_bf16(bits_f32(0x3f818000u)) == 0x3f82 &&
              lucid_f32_to_bf16(bits_f32(0x00008000u)) == 0x0000 &&
              lucid_f32_to_bf16(bits_f32(0x00018000u)) == 0x0002,
          "tie examples wrong");
    CHECK("bf16.overflow",
          lucid_f32_to_bf16(bits_f32(0x7f7fffffu)) == 0x7f80 &&
              lucid_f32_to_bf16(bits_f32(0x7f7f8000u)) == 0x7f80 &&
              lucid_f32_to_bf16(bits_f32(0x7f7f7fffu)) == 0x7f7f &&
              lucid_f32_to_bf16(-INFINITY) == 0xff80 &&
              lucid_f32_to_bf16(INFINITY) == 0x7f80,
          "overflow wrong");
    uint16_t sn = lucid_f32_to_bf16(bits_f32(0x7f800001u)); /* low-bit NaN */
    uint16_t qn = lucid_f32_to_bf16(NAN);
    uint16_t nn = lucid_f32_to_bf16(bits_f32(0xff800001u));
    CHECK("bf16.nan_stays_nan",
          (sn & 0x7f80) == 0x7f80 && (sn & 0x7f) && (qn & 0x7f80) == 0x7f80 &&
              (qn & 0x7f) && (nn & 0x8000) && (nn & 0x7f),
          "NaN became 0x%04x / 0x%04x / 0x%04x", sn, qn, nn);
    CHECK("bf16.subnormal",
          lucid_f32_to_bf16(bits_f32(0x00010000u)) == 0x0001 &&
              lucid_f32_to_bf16(bits_f32(0x00007fffu)) == 0x0000 &&
              lucid_f32_to_bf16(bits_f32(0x007f8000u)) == 0x0080,
          "subnormal rounding wrong");
}

/* ------------------------------------------------------------ dtypes */

static void test_dtype_names(void) {
    lucid_dtype d;
    int ok = 1;
    for (int i = 0; i < LUCID_DTYPE_COUNT; i++) {
        if (lucid_dtype_parse(lucid_dtype_name((lucid_dtype)i), &d) != 0 || (int)d != i)
            ok = 0;
    }
    ok = ok && lucid_dtype_parse("bfloat16", &d) == 0 && d == LUCID_BF16;
    ok = ok && lucid_dtype_parse("half", &d) == 0 && d == LUCID_F16;
    ok = ok && lucid_dtype_parse("f8", &d) == -1 && lucid_dtype_parse(NULL, &d) == -1;
    ok = ok && lucid_dtype_size(LUCID_BF16) == 2 && lucid_dtype_size(LUCID_I64) == 8 &&
         lucid_dtype_size(LUCID_U8) == 1;
    CHECK("dtype.names_parse_sizes", ok, "name/parse/size table inconsistent");
    lucid_device dev;
    int dok = lucid_device_parse("cpu", &dev) == 0 && dev.type == LUCID_CPU &&
              lucid_device_parse("cuda:3", &dev) == 0 && dev.type == LUCID_CUDA &&
              dev.index == 3 && lucid_device_parse("cuda:x", &dev) == -1 &&
              lucid_device_parse("tpu", &dev) == -1;
    CHECK("device.parse", dok, "device parsing wrong");
}

/* ------------------------------------------------------------- views */

/* [2,3,4] f32 tensor with t[i] = i (row-major). */
static lucid_tensor *iota3(void) {
    int64_t shape[3] = {2, 3, 4};
    lucid_tensor *t = NULL;
    if (lucid_tensor_empty(ctx_, CPU, LUCID_F32, 3, shape, &t) != LUCID_OK) return NULL;
    for (int64_t i = 0; i < 24; i++) ((float *)lucid_tensor_data(t))[i] = (float)i;
    return t;
}

static void test_views(void) {
    lucid_tensor *t = iota3(), *v = NULL;
    if (!t) { TEST_FAIL("views.setup", "%s", lucid_ctx_error(ctx_)); return; }
    CHECK("views.contiguous", lucid_tensor_is_contiguous(t) &&
                                  lucid_tensor_numel(t) == 24 &&
                                  lucid_tensor_nbytes(t) == 96,
          "fresh tensor not contiguous or wrong size");

    /* narrow: dim 2, [1, 3) */
    CHECK_STATUS("views.narrow", ctx_, lucid_tensor_narrow(ctx_, t, 2, 1, 2, &v));
    if (v) {
        int ok = v->shape[2] == 2 && v->offset == 1 && !lucid_tensor_is_contiguous(v);
        for (int64_t i = 0; i < 12 && ok; i++) {
            int64_t a = i / 6, b = (i / 2) % 3, c = i % 2;
            ok = lucid_cpu_get(v, i) == (double)(a * 12 + b * 4 + c + 1);
        }
        CHECK("views.narrow_values", ok, "narrowed view reads wrong elements");
        lucid_tensor_release(v);
        v = NULL;
    }
    lucid_status s = lucid_tensor_narrow(ctx_, t, 1, 2, 3, &v);
    CHECK("views.narrow_error", s == LUCID_ERR_ARG && !v &&
                                    msg_has("dim 1", "size 3", "start 2"),
          "status %d, message '%s'", s, lucid_ctx_error(ctx_));
    s = lucid_tensor_narrow(ctx_, t, 3, 0, 1, &v);
    CHECK("views.narrow_bad_dim", s == LUCID_ERR_ARG && msg_has("dim 3", "rank 3", NULL),
          "message '%s'", lucid_ctx_error(ctx_));

    /* select: dim 1, index 2 -> [2,4] */
    CHECK_STATUS("views.select", ctx_, lucid_tensor_select(ctx_, t, 1, 2, &v));
    if (v) {
        int ok = v->ndim == 2 && v->shape[0] == 2 && v->shape[1] == 4;
        for (int64_t i = 0; i < 8 && ok; i++)
            ok = lucid_cpu_get(v, i) == (double)((i / 4) * 12 + 8 + i % 4);
        CHECK("views.select_values", ok, "selected view reads wrong elements");
        lucid_tensor_release(v);
        v = NULL;
    }
    s = lucid_tensor_select(ctx_, t, 0, 2, &v);
    CHECK("views.select_error", s == LUCID_ERR_ARG && msg_has("index 2", "dim 0", "0..1"),
          "message '%s'", lucid_ctx_error(ctx_));

    /* transpose 0,2 -> [4,3,2] */
    CHECK_STATUS("views.transpose", ctx_, lucid_tensor_transpose(ctx_, t, 0, 2, &v));
    if (v) {
        int ok = v->shape[0] == 4 && v->shape[2] == 2 && !lucid_tensor_is_contiguous(v);
        for (int64_t i = 0; i < 24 && ok; i++) {
            int64_t c = i / 6, b = (i / 2) % 3, a = i % 2;
            ok = lucid_cpu_get(v, i) == (double)(a * 12 + b * 4 + c);
        }
        CHECK("views.transpose_values", ok, "transposed view reads wrong elements");
        lucid_tensor_release(v);
        v = NULL;
    }
    s = lucid_tensor_transpose(ctx_, t, 0, 5, &v);
    CHECK("views.transpose_error", s == LUCID_ERR_ARG && msg_has("dim 5", "rank 3", NULL),
          "message '%s'", lucid_ctx_error(ctx_));

    /* permute (2,0,1) -> [4,2,3] */
    int perm[3] = {2, 0, 1};
    CHECK_STATUS("views.permute", ctx_, lucid_tensor_permute(ctx_, t, perm, &v));
    if (v) {
        int ok = v->shape[0] == 4 && v->shape[1] == 2 && v->shape[2] == 3;
        for (int64_t i = 0; i < 24 && ok; i++) {
            int64_t c = i / 6, a = (i / 3) % 2, b = i % 3;
            ok = lucid_cpu_get(v, i) == (double)(a * 12 + b * 4 + c);
        }
        CHECK("views.permute_values", ok, "permuted view reads wrong elements");
        lucid_tensor_release(v);
        v = NULL;
    }
    int badperm[3] = {0, 0, 1};
    s = lucid_tensor_permute(ctx_, t, badperm, &v);
    CHECK("views.permute_error", s == LUCID_ERR_ARG && msg_has("permute", "entry 1", NULL),
          "message '%s'", lucid_ctx_error(ctx_));

    /* view */
    int64_t sh2[2] = {6, 4}, bad2[2] = {5, 5};
    CHECK_STATUS("views.view", ctx_, lucid_tensor_view(ctx_, t, 2, sh2, &v));
    if (v) {
        CHECK("views.view_shares_storage", v->storage == t->storage &&
                                               lucid_cpu_get(v, 23) == 23.0,
              "view does not share storage");
        lucid_tensor_release(v);
        v = NULL;
    }
    s = lucid_tensor_view(ctx_, t, 2, bad2, &v);
    CHECK("views.view_numel_error",
          s == LUCID_ERR_ARG && msg_has("[5,5]", "[2,3,4]", "25"),
          "message '%s'", lucid_ctx_error(ctx_));
    lucid_tensor *tt = NULL;
    lucid_tensor_transpose(ctx_, t, 0, 1, &tt);
    int64_t flat[1] = {24};
    s = lucid_tensor_view(ctx_, tt, 1, flat, &v);
    CHECK("views.view_noncontiguous_error",
          s == LUCID_ERR_ARG && msg_has("not contiguous", NULL, NULL),
          "message '%s'", lucid_ctx_error(ctx_));
    lucid_tensor_release(tt);

    /* from_storage bounds */
    int64_t big[1] = {25};
    s = lucid_tensor_from_storage(ctx_, t->storage, LUCID_F32, 1, big, NULL, 0, &v);
    CHECK("views.from_storage_bounds",
          s == LUCID_ERR_ARG && msg_has("100 bytes", "96", NULL),
          "message '%s'", lucid_ctx_error(ctx_));
    /* negative strides and offsets are refused (they used to pass the
     * bounds check and reach outside the storage: tryout 3) */
    int64_t four[1] = {4}, mone[1] = {-1};
    s = lucid_tensor_from_storage(ctx_, t->storage, LUCID_F32, 1, four, mone, 0, &v);
    CHECK("views.negative_stride_refused",
          s == LUCID_ERR_ARG && !v && msg_has("stride -1 of dim 0", "negative", NULL),
          "status %s, message '%s'", lucid_status_name(s), lucid_ctx_error(ctx_));
    s = lucid_tensor_from_storage(ctx_, t->storage, LUCID_F32, 1, four, mone, 3, &v);
    CHECK("views.negative_stride_refused_at_offset",
          s == LUCID_ERR_ARG && !v && msg_has("stride -1", "negative", NULL),
          "status %s, message '%s'", lucid_status_name(s), lucid_ctx_error(ctx_));
    s = lucid_tensor_from_storage(ctx_, t->storage, LUCID_F32, 1, four, NULL, -1, &v);
    CHECK("views.negative_offset_refused",
          s == LUCID_ERR_ARG && !v && msg_has("offset -1", "negative", NULL),
          "status %s, message '%s'", lucid_status_name(s), lucid_ctx_error(ctx_));
    s = lucid_tensor_from_storage(ctx_, t->storage, LUCID_F32, 0, NULL, NULL, -2, &v);
    CHECK("views.negative_offset_refused_0d",
          s == LUCID_ERR_ARG && !v && msg_has("offset -2", NULL, NULL),
          "status %s, message '%s'", lucid_status_name(s), lucid_ctx_error(ctx_));
    lucid_ctx_clear_error(ctx_);
    s = lucid_tensor_empty(ctx_, CPU, LUCID_F32, 2, NULL, &v);
    CHECK("views.null_shape_refused", s == LUCID_ERR_ARG && !v && msg_has("shape is NULL", NULL, NULL),
          "status %s, message '%s'", lucid_status_name(s), lucid_ctx_error(ctx_));
    lucid_ctx_clear_error(ctx_);
    int64_t neg[1] = {-1};
    s = lucid_tensor_empty(ctx_, CPU, LUCID_F32, 1, neg, &v);
    CHECK("views.negative_shape", s == LUCID_ERR_ARG && msg_has("shape[0]", "-1", NULL),
          "message '%s'", lucid_ctx_error(ctx_));
    lucid_tensor_release(t);
}

/* -------------------------------------------------------- broadcasting */

static void test_broadcast(void) {
    int64_t s31[2] = {3, 1}, s234[3] = {2, 3, 4}, s32[2] = {3, 2}, s34[2] = {3, 4};
    lucid_tensor *a = NULL, *b = NULL;
    lucid_tensor_empty(ctx_, CPU, LUCID_F32, 2, s31, &a);
    lucid_tensor_empty(ctx_, CPU, LUCID_F32, 2, s32, &b);
    lucid_tensor v;
    lucid_status s = lucid_tensor_broadcast_view(ctx_, a, 3, s234, &v);
    CHECK("broadcast.view_strides",
          s == LUCID_OK && v.ndim == 3 && v.strides[0] == 0 && v.strides[1] == 1 &&
              v.strides[2] == 0 && v.shape[2] == 4,
          "strides %lld %lld %lld", (long long)v.strides[0],
          (long long)v.strides[1], (long long)v.strides[2]);
    s = lucid_tensor_broadcast_view(ctx_, b, 2, s34, &v);
    CHECK("broadcast.error_message",
          s == LUCID_ERR_ARG && msg_has("[3,2]", "[3,4]", "broadcast"),
          "message '%s'", lucid_ctx_error(ctx_));
    s = lucid_tensor_broadcast_view(ctx_, a, 1, s234 + 2, &v);
    CHECK("broadcast.rank_error", s == LUCID_ERR_ARG, "rank 2 -> 1 accepted");
    /* an op whose operands do not broadcast names both shapes */
    lucid_tensor *o = NULL;
    lucid_tensor_empty(ctx_, CPU, LUCID_F32, 2, s34, &o);
    s = lucid_binary(ctx_, LUCID_OP_ADD, o, b, a);
    CHECK("broadcast.binary_error", s == LUCID_ERR_ARG && msg_has("[3,2]", "[3,4]", NULL),
          "message '%s'", lucid_ctx_error(ctx_));
    lucid_tensor_release(a);
    lucid_tensor_release(b);
    lucid_tensor_release(o);
}

/* ----------------------------------------------------------- contexts */

static void test_context_errors(void) {
    lucid_ctx_options o = lucid_ctx_options_default();
    o.device.type = LUCID_CUDA;
    o.device.index = 0;
    lucid_ctx *c = NULL;
    char err[256] = "";
    lucid_status s = lucid_ctx_create(&o, &c, err, sizeof err);
    if (!lucid_cuda_backend()) {
        CHECK("ctx.cuda_in_cpu_build", s == LUCID_ERR_UNSUPPORTED && !c &&
                                           strstr(err, "cuda") && strstr(err, "CUDA"),
              "status %s, message '%s'", lucid_status_name(s), err);
    } else if (lucid_cuda_device_count() == 0) {
        CHECK("ctx.cuda_without_device", s != LUCID_OK && !c && err[0],
              "status %s, message '%s'", lucid_status_name(s), err);
    } else {
        TEST_SKIP("ctx.cuda_in_cpu_build", "this build has CUDA and a device");
        if (c) lucid_ctx_release(c);
        c = NULL;
    }
    o.device.index = 99;
    err[0] = 0;
    s = lucid_ctx_create(&o, &c, err, sizeof err);
    CHECK("ctx.cuda_bad_index", s != LUCID_OK && !c && err[0],
          "cuda:99 accepted (status %s)", lucid_status_name(s));
    CHECK("ctx.cpu_build_no_cuda",
          lucid_cuda_backend() || (!lucid_cuda_available() && lucid_cuda_device_count() == 0),
          "cuda reported available without a backend");
    /* a CPU tensor op on a cuda device tensor is impossible here; an f64
     * request on cuda is refused before any device work */
    lucid_device cuda = {LUCID_CUDA, 0};
    lucid_tensor *t = NULL;
    s = lucid_tensor_empty(ctx_, cuda, LUCID_F64, 0, NULL, &t);
    CHECK("ctx.f64_on_cuda_refused", s == LUCID_ERR_UNSUPPORTED && !t &&
                                         msg_has("f64", "CPU-only", NULL),
          "status %s, message '%s'", lucid_status_name(s), lucid_ctx_error(ctx_));
    lucid_ctx_clear_error(ctx_);
    CHECK("ctx.clear_error", lucid_ctx_last_status(ctx_) == LUCID_OK &&
                                 lucid_ctx_error(ctx_)[0] == 0,
          "error not cleared");
    CHECK("ctx.status_names", strcmp(lucid_status_name(LUCID_OK), "ok") == 0 &&
                                  lucid_status_name((lucid_status)999) != NULL,
          "status names wrong");
    /* options a host application could get wrong (tryout 3) */
    struct { int type, index, threads; const char *want; } bad[3] = {
        {7, 0, 0, "device type 7"}, {LUCID_CPU, 3, 0, "cpu:3"}, {LUCID_CPU, 0, -4, "cpu_threads -4"}};
    for (int i = 0; i < 3; i++) {
        lucid_ctx_options b = lucid_ctx_options_default();
        b.device.type = (lucid_device_type)bad[i].type;
        b.device.index = bad[i].index;
        b.cpu_threads = bad[i].threads;
        err[0] = 0;
        c = NULL;
        s = lucid_ctx_create(&b, &c, err, sizeof err);
        CHECK(bad[i].want, s == LUCID_ERR_ARG && !c && strstr(err, bad[i].want),
              "status %s, message '%s'", lucid_status_name(s), err);
        if (c) lucid_ctx_release(c);
    }
    err[0] = 0;
    s = lucid_ctx_create(NULL, NULL, err, sizeof err);
    CHECK("ctx.create_null_out", s == LUCID_ERR_ARG && strstr(err, "out is NULL"),
          "status %s, message '%s'", lucid_status_name(s), err);
    s = lucid_ctx_branch_fork(ctx_, 1, NULL);
    CHECK("ctx.branch_fork_null_out", s == LUCID_ERR_ARG && msg_has("forked is NULL", NULL, NULL),
          "status %s, message '%s'", lucid_status_name(s), lucid_ctx_error(ctx_));
    lucid_ctx_clear_error(ctx_);
    /* item: exactly one element (PyTorch's Tensor.item) */
    int64_t three[1] = {3};
    lucid_tensor *t3 = NULL;
    double v = 0;
    s = lucid_tensor_zeros(ctx_, CPU, LUCID_F32, 1, three, &t3);
    if (s == LUCID_OK) s = lucid_tensor_item(ctx_, t3, &v);
    CHECK("ctx.item_needs_one_element", s == LUCID_ERR_ARG && msg_has("one element", "got 3", NULL),
          "status %s, message '%s'", lucid_status_name(s), lucid_ctx_error(ctx_));
    lucid_ctx_clear_error(ctx_);
    if (t3) lucid_tensor_release(t3);
}

static void test_storage_stats(void) {
    lucid_memory_stats st0, st1, st2, st3;
    lucid_memory_stats_get(ctx_, CPU, &st0);
    int64_t shape[1] = {1000};
    lucid_tensor *t = NULL, *v = NULL;
    lucid_tensor_empty(ctx_, CPU, LUCID_F32, 1, shape, &t);
    lucid_memory_stats_get(ctx_, CPU, &st1);
    CHECK("storage.stats_alloc", st1.allocated == st0.allocated + 4000 &&
                                     st1.num_allocs == st0.num_allocs + 1 &&
                                     st1.peak_allocated >= st1.allocated,
          "allocated %llu -> %llu", (unsigned long long)st0.allocated,
          (unsigned long long)st1.allocated);
    CHECK("storage.aligned", ((uintptr_t)lucid_storage_data(t->storage) & 63) == 0,
          "cpu storage not 64-byte aligned");
    lucid_tensor_narrow(ctx_, t, 0, 10, 5, &v);
    CHECK("storage.view_refcount", v && t->storage->refcount == 2 && v->storage == t->storage,
          "refcount %d", t->storage->refcount);
    int ctx_refs = ctx_->refcount;
    lucid_tensor_release(t);
    lucid_memory_stats_get(ctx_, CPU, &st2);
    CHECK("storage.view_keeps_storage", v->storage->refcount == 1 &&
                                            st2.allocated == st1.allocated,
          "storage freed under a live view");
    uint64_t ver = lucid_storage_version(v->storage);
    lucid_fill(ctx_, v, 1.0);
    CHECK("storage.version_bump", lucid_storage_version(v->storage) == ver + 1,
          "fill did not bump the version");
    lucid_tensor_release(v);
    lucid_memory_stats_get(ctx_, CPU, &st3);
    CHECK("storage.stats_release", st3.allocated == st0.allocated &&
                                       st3.peak_allocated >= st0.allocated + 4000 &&
                                       ctx_->refcount == ctx_refs - 1,
          "allocated %llu (start %llu), peak %llu",
          (unsigned long long)st3.allocated, (unsigned long long)st0.allocated,
          (unsigned long long)st3.peak_allocated);
    lucid_memory_reset_peak(ctx_);
    lucid_memory_stats_get(ctx_, CPU, &st3);
    CHECK("storage.reset_peak", st3.peak_allocated == st3.allocated,
          "peak %llu != allocated %llu", (unsigned long long)st3.peak_allocated,
          (unsigned long long)st3.allocated);
    const lucid_backend *cpu = lucid_cpu_backend();
    lucid_memory_stats bs;
    CHECK("storage.backend_stats", cpu && cpu->memory_stats(ctx_, &bs) == LUCID_OK &&
                                       bs.allocated == st3.allocated,
          "cpu backend stats differ from the context's");
    /* a storage keeps its context alive */
    lucid_ctx *c = NULL;
    lucid_ctx_create(NULL, &c, NULL, 0);
    lucid_tensor *k = NULL;
    lucid_tensor_zeros(c, CPU, LUCID_F64, 1, shape, &k);
    lucid_ctx_release(c); /* the tensor's storage still holds it */
    int ok = k && c->refcount == 1 && lucid_fill(c, k, 2.0) == LUCID_OK &&
             lucid_cpu_get(k, 999) == 2.0;
    CHECK("storage.holds_context", ok, "context freed under a live storage");
    lucid_tensor_release(k); /* frees the context too (checked by ASan runs) */
    /* wrapped memory is never freed by lucid and not counted */
    float ext[8] = {0};
    lucid_storage *ws = NULL;
    lucid_memory_stats_get(ctx_, CPU, &st0);
    lucid_storage_wrap(ctx_, CPU, ext, sizeof ext, &ws);
    lucid_tensor *w = NULL;
    int64_t s8[1] = {8};
    lucid_tensor_from_storage(ctx_, ws, LUCID_F32, 1, s8, NULL, 0, &w);
    lucid_storage_release(ws);
    lucid_fill(ctx_, w, 3.0);
    lucid_tensor_release(w);
    lucid_memory_stats_get(ctx_, CPU, &st1);
    CHECK("storage.wrap", ext[7] == 3.0f && st1.allocated == st0.allocated,
          "wrapped storage not written or counted");
}

static void test_two_contexts(void) {
    lucid_ctx_options o = lucid_ctx_options_default();
    lucid_ctx *a = NULL, *b = NULL;
    o.seed = 1;
    lucid_ctx_create(&o, &a, NULL, 0);
    o.seed = 2;
    lucid_ctx_create(&o, &b, NULL, 0);
    if (!a || !b) { TEST_FAIL("ctx.two_contexts", "create failed"); return; }
    uint64_t sa, oa, sb, ob;
    lucid_ctx_rng_next(a, 100, &sa, &oa);
    lucid_ctx_rng_next(a, 10, &sa, &oa);
    lucid_ctx_rng_next(b, 5, &sb, &ob);
    CHECK("ctx.two_contexts_rng", sa == 1 && oa == 100 && sb == 2 && ob == 0,
          "rng state shared (a %llu/%llu, b %llu/%llu)", (unsigned long long)sa,
          (unsigned long long)oa, (unsigned long long)sb, (unsigned long long)ob);
    lucid_ctx_rng_get(a, &sa, &oa);
    CHECK("ctx.rng_advances", oa == 110, "offset %llu", (unsigned long long)oa);
    lucid_ctx_rng_set(a, 7, 3);
    lucid_ctx_rng_get(a, &sa, &oa);
    CHECK("ctx.rng_set", sa == 7 && oa == 3, "rng_set ignored");
    int64_t sh[1] = {256};
    lucid_tensor *t = NULL;
    lucid_tensor_empty(a, CPU, LUCID_F32, 1, sh, &t);
    lucid_memory_stats ma, mb;
    lucid_memory_stats_get(a, CPU, &ma);
    lucid_memory_stats_get(b, CPU, &mb);
    CHECK("ctx.two_contexts_stats", ma.allocated == 1024 && mb.allocated == 0,
          "stats shared (a %llu, b %llu)", (unsigned long long)ma.allocated,
          (unsigned long long)mb.allocated);
    lucid_tensor *bad = NULL;
    lucid_tensor_narrow(b, t, 0, 300, 1, &bad);
    CHECK("ctx.two_contexts_errors", lucid_ctx_last_status(b) == LUCID_ERR_ARG &&
                                         lucid_ctx_last_status(a) == LUCID_OK &&
                                         lucid_ctx_error(a)[0] == 0,
          "an error in one context leaked into the other");
    lucid_tensor_release(t);
    lucid_ctx_release(a);
    lucid_ctx_release(b);
}

/* lucid_cpu_set saturates integer stores (NaN -> 0) instead of an undefined
 * out-of-range cast. */
static void test_cpu_set_ints(void) {
    int64_t s3[1] = {3};
    lucid_tensor *i32 = NULL, *i64 = NULL, *u8 = NULL;
    lucid_tensor_empty(ctx_, CPU, LUCID_I32, 1, s3, &i32);
    lucid_tensor_empty(ctx_, CPU, LUCID_I64, 1, s3, &i64);
    lucid_tensor_empty(ctx_, CPU, LUCID_U8, 1, s3, &u8);
    double v[3] = {NAN, 1e20, -1e20};
    for (int i = 0; i < 3; i++) {
        lucid_cpu_set(i32, i, v[i]);
        lucid_cpu_set(i64, i, v[i]);
        lucid_cpu_set(u8, i, v[i]);
    }
    const int32_t *a = lucid_tensor_data(i32);
    const int64_t *b = lucid_tensor_data(i64);
    const uint8_t *c = lucid_tensor_data(u8);
    CHECK("tensor.cpu_set_saturates",
          a[0] == 0 && a[1] == INT32_MAX && a[2] == INT32_MIN && b[0] == 0 &&
              b[1] == INT64_MAX && b[2] == INT64_MIN && c[0] == 0 && c[1] == 255 &&
              c[2] == 0,
          "i32 %d %d %d, u8 %d %d %d", a[0], a[1], a[2], c[0], c[1], c[2]);
    lucid_tensor_release(i32);
    lucid_tensor_release(i64);
    lucid_tensor_release(u8);
}

/* The tolerance helper never lets NaN through. */
static void test_nan_tolerance(void) {
    CHECK("tolerance.nan_never_passes",
          !(test_relerr(NAN, 1.0) < 1e9) && !(test_relerr(1.0, NAN) < 1e9) &&
              !(test_relerr(NAN, NAN) < 1e9) && test_relerr(1.0, 1.0) == 0.0,
          "NaN passed a tolerance check");
}

/* ------------------------------------------------- size overflow edges */

/* lucid_tensor_empty of (shape, dt) fails with ERR_ARG "tensor size
 * overflows" and leaves *out NULL. */
static void expect_overflow(const char *name, int nd, const int64_t *sh,
                            lucid_dtype dt) {
    lucid_tensor *t = (lucid_tensor *)1;
    lucid_status st = lucid_tensor_empty(ctx_, CPU, dt, nd, sh, &t);
    CHECK(name, st == LUCID_ERR_ARG && !t && msg_has("tensor size overflows", NULL, NULL),
          "status %s, out %p: %s", lucid_status_name(st), (void *)t,
          lucid_ctx_error(ctx_));
    if (st == LUCID_OK) lucid_tensor_release(t);
}

static void test_size_overflow(void) {
    const int64_t P62 = (int64_t)1 << 62, P31 = (int64_t)1 << 31;
    int64_t n = -1, b = -1;
    /* lucid_shape_bytes: every product checked */
    int64_t s62[1] = {P62}, s3131[2] = {P31, P31}, s3232[2] = {P31 * 2, P31 * 2};
    CHECK("size.bytes_2^62_f32_overflows",
          lucid_shape_bytes(1, s62, LUCID_F32, &n, &b) == -1, "accepted");
    CHECK("size.bytes_2^62_u8_fits",
          lucid_shape_bytes(1, s62, LUCID_U8, &n, &b) == 0 && n == P62 && b == P62,
          "n %lld b %lld", (long long)n, (long long)b);
    CHECK("size.bytes_2^31x2^31_f32_overflows",
          lucid_shape_bytes(2, s3131, LUCID_F32, &n, &b) == -1, "accepted");
    CHECK("size.bytes_2^32x2^32_overflows_numel",
          lucid_shape_bytes(2, s3232, LUCID_U8, &n, &b) == -1, "accepted");
    int64_t edge[1] = {INT64_MAX / 4}, past[1] = {INT64_MAX / 4 + 1};
    CHECK("size.bytes_(2^63-1)/4_f32_fits",
          lucid_shape_bytes(1, edge, LUCID_F32, &n, &b) == 0 &&
              b == (INT64_MAX / 4) * 4,
          "rejected or b %lld", (long long)b);
    CHECK("size.bytes_2^63/4_f32_overflows",
          lucid_shape_bytes(1, past, LUCID_F32, &n, &b) == -1, "accepted");
    int64_t imax[1] = {INT64_MAX};
    CHECK("size.bytes_int64_max_u8_fits",
          lucid_shape_bytes(1, imax, LUCID_U8, &n, &b) == 0 && n == INT64_MAX,
          "rejected");
    CHECK("size.bytes_int64_max_i64_overflows",
          lucid_shape_bytes(1, imax, LUCID_I64, &n, &b) == -1, "accepted");
    int64_t z1[2] = {0, P62}, z2[3] = {0, P62, 4}, z3[3] = {P62, 0, 4},
            zmax[3] = {0, INT64_MAX, 2}, zfit[3] = {INT64_MAX, 0, INT64_MAX};
    CHECK("size.bytes_zero_dim_first_fits",
          lucid_shape_bytes(2, z1, LUCID_F32, &n, &b) == 0 && n == 0 && b == 0,
          "rejected or n %lld", (long long)n);
    CHECK("size.bytes_zero_dim_with_overflowing_stride",
          lucid_shape_bytes(3, z2, LUCID_F32, &n, &b) == -1,
          "[0, 2^62, 4]: stride 2^64 accepted");
    CHECK("size.bytes_zero_dim_strides_fit",
          lucid_shape_bytes(3, z3, LUCID_F32, &n, &b) == 0 && n == 0,
          "[2^62, 0, 4] rejected");
    CHECK("size.bytes_zero_dim_int64_max_strides_overflow",
          lucid_shape_bytes(3, zmax, LUCID_F32, &n, &b) == -1, "accepted");
    CHECK("size.bytes_zero_dim_int64_max_strides_fit",
          lucid_shape_bytes(3, zfit, LUCID_F32, &n, &b) == 0 && n == 0 && b == 0,
          "[int64 max, 0, int64 max] (strides int64 max, 1, 1) rejected");
    int64_t neg[2] = {4, -1};
    CHECK("size.bytes_negative_rejected",
          lucid_shape_bytes(2, neg, LUCID_F32, &n, &b) == -1, "accepted");
    int64_t ok[3] = {2, 3, 4};
    CHECK("size.bytes_control",
          lucid_shape_bytes(3, ok, LUCID_F32, &n, &b) == 0 && n == 24 && b == 96,
          "n %lld b %lld", (long long)n, (long long)b);
    CHECK("size.bytes_scalar", lucid_shape_bytes(0, NULL, LUCID_F64, &n, &b) == 0 &&
                                   n == 1 && b == 8,
          "n %lld b %lld", (long long)n, (long long)b);

    /* lucid_tensor_empty: the shapes that used to wrap to a tiny storage */
    expect_overflow("size.empty_2^62_f32", 1, s62, LUCID_F32);
    expect_overflow("size.empty_2^31x2^31_f32", 2, s3131, LUCID_F32);
    expect_overflow("size.empty_2^32x2^32_u8", 2, s3232, LUCID_U8);
    expect_overflow("size.empty_2^63/4_f32", 1, past, LUCID_F32);
    expect_overflow("size.empty_int64_max_f64", 1, imax, LUCID_F64);
    expect_overflow("size.empty_zero_dim_overflowing_stride", 3, z2, LUCID_F32);
    CHECK("size.empty_message_names_shape_and_dtype",
          (lucid_tensor_empty(ctx_, CPU, LUCID_F32, 2, s3131, &(lucid_tensor *){0}),
           msg_has("[2147483648,2147483648]", "f32", NULL)),
          "%s", lucid_ctx_error(ctx_));
    lucid_tensor *t = NULL;
    lucid_status st = lucid_tensor_empty(ctx_, CPU, LUCID_F32, 2, z1, &t);
    CHECK("size.empty_zero_dim_control", st == LUCID_OK && t &&
                                             lucid_tensor_numel(t) == 0 &&
                                             lucid_tensor_nbytes(t) == 0,
          "%s", lucid_ctx_error(ctx_));
    /* an allocation the size of int64 max (fits the arithmetic) fails as
     * out-of-memory, not as a wrapped size */
    lucid_tensor *big = NULL;
    st = lucid_tensor_empty(ctx_, CPU, LUCID_U8, 1, imax, &big);
    CHECK("size.empty_int64_max_u8_is_oom", st == LUCID_ERR_OOM && !big,
          "status %s: %s", lucid_status_name(st), lucid_ctx_error(ctx_));
    lucid_tensor_release(big);

    /* views: a shape whose product wraps to the tensor's numel (0 here) */
    lucid_tensor *v = NULL;
    int64_t wrap[3] = {P31 * 2, P31 * 2, 0}, wrap2[3] = {0, P31 * 2, P31 * 2};
    st = lucid_tensor_view(ctx_, t, 3, wrap2, &v);
    CHECK("size.view_zero_with_overflowing_strides",
          st == LUCID_ERR_ARG && !v && msg_has("view", "tensor size overflows", NULL),
          "status %s: %s", lucid_status_name(st), lucid_ctx_error(ctx_));
    lucid_tensor_release(v);
    v = NULL;
    st = lucid_tensor_view(ctx_, t, 3, wrap, &v);
    CHECK("size.view_zero_control", st == LUCID_OK && v, "%s", lucid_ctx_error(ctx_));
    lucid_tensor_release(v);
    lucid_tensor *four = NULL;
    int64_t s4[1] = {4}, w3[3] = {P31 * 2, P31 * 2, 4};
    lucid_tensor_empty(ctx_, CPU, LUCID_F32, 1, s4, &four);
    v = NULL;
    st = lucid_tensor_view(ctx_, four, 3, w3, &v);
    CHECK("size.view_product_overflow_rejected",
          st == LUCID_ERR_ARG && !v && msg_has("tensor size overflows", NULL, NULL),
          "status %s: %s", lucid_status_name(st), lucid_ctx_error(ctx_));
    lucid_tensor_release(v);

    /* from_storage: strides whose byte reach wraps past 2^64 */
    int64_t sh2[2] = {2, 2}, huge_st[2] = {P62, 1}, min_st[2] = {INT64_MIN, 1},
            fine_st[2] = {2, 1};
    v = NULL;
    st = lucid_tensor_from_storage(ctx_, four->storage, LUCID_F32, 2, sh2,
                                   huge_st, 0, &v);
    CHECK("size.from_storage_stride_reach_overflows",
          st == LUCID_ERR_ARG && !v && msg_has("tensor size overflows", NULL, NULL),
          "status %s: %s", lucid_status_name(st), lucid_ctx_error(ctx_));
    lucid_tensor_release(v);
    v = NULL;
    st = lucid_tensor_from_storage(ctx_, four->storage, LUCID_F32, 2, sh2,
                                   min_st, 0, &v);
    CHECK("size.from_storage_int64_min_stride", st == LUCID_ERR_ARG && !v,
          "status %s", lucid_status_name(st));
    lucid_tensor_release(v);
    v = NULL;
    int64_t off_big = INT64_MAX - 1;
    st = lucid_tensor_from_storage(ctx_, four->storage, LUCID_F32, 2, sh2,
                                   fine_st, off_big, &v);
    CHECK("size.from_storage_offset_overflows", st == LUCID_ERR_ARG && !v,
          "status %s", lucid_status_name(st));
    lucid_tensor_release(v);
    v = NULL;
    st = lucid_tensor_from_storage(ctx_, four->storage, LUCID_F32, 2, sh2,
                                   fine_st, 0, &v);
    CHECK("size.from_storage_control", st == LUCID_OK && v, "%s", lucid_ctx_error(ctx_));
    lucid_tensor_release(v);
    lucid_tensor_release(four);
    lucid_tensor_release(t);

    /* storage_create refuses a size past int64 (a wrapped count upstream) */
    lucid_storage *sg = NULL;
    st = lucid_storage_create(ctx_, CPU, SIZE_MAX, 0, &sg);
    CHECK("size.storage_size_max_rejected", st == LUCID_ERR_ARG && !sg &&
                                               msg_has("overflows", NULL, NULL),
          "status %s: %s", lucid_status_name(st), lucid_ctx_error(ctx_));
    if (sg) lucid_storage_release(sg);
    lucid_ctx_clear_error(ctx_);
}

int main(void) {
    char err[256];
    if (lucid_ctx_create(NULL, &ctx_, err, sizeof err) != LUCID_OK) {
        printf("not ok ctx.create: %s\n", err);
        return 1;
    }
    test_philox();
    test_f16();
    test_bf16();
    test_dtype_names();
    test_views();
    test_broadcast();
    test_context_errors();
    test_storage_stats();
    test_two_contexts();
    test_cpu_set_ints();
    test_nan_tolerance();
    test_size_overflow();
    lucid_ctx_release(ctx_);
    return test_exit();
}
