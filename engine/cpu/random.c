/*
 * random.c — CPU rand_uniform / rand_normal over Philox-4x32-10.
 *
 * Contract (engine/lucid.h, "random"): element i of dst in logical row-major
 * order (whatever dst's strides) draws philox(seed, offset + i); the value
 * is computed in f64 and rounded once to dst's dtype (f32/f64/bf16/f16;
 * bf16/f16 correctly rounded from f64, see cpu_f64_to_bf16):
 *   uniform: u = (w0 >> 8) * 2^-24 in [0,1); v = lo + (hi - lo) * u
 *            (rounding to a narrow dtype can give hi itself);
 *   normal:  u1 = ((w0 >> 8) + 1) * 2^-24 in (0,1], u2 = (w1 >> 8) * 2^-24,
 *            v = mean + std * sqrt(-2 ln u1) * cos(2 pi u2).
 * dst is overwritten. Results depend only on (seed, offset, i), so a fill
 * of [n] at offset k equals elements k.. of a fill of [n+k] at offset 0,
 * and a contiguous fill is split over threads (parallel.c) without changing
 * any value.
 */
#include "cpu.h"
#include <math.h>

#define TWO_PI 6.283185307179586476925286766559
#define INV_2_24 (1.0 / 16777216.0)

typedef enum rand_kind { RAND_UNIFORM, RAND_NORMAL } rand_kind;

/* v[j] for counters c0 .. c0+n-1. */
static void draw(rand_kind kind, uint64_t seed, uint64_t c0, int64_t n,
                 double p, double q, double *v) {
    uint32_t w[4];
    for (int64_t j = 0; j < n; j++) {
        lucid_philox4x32(seed, c0 + (uint64_t)j, w);
        if (kind == RAND_UNIFORM) {
            double u = (double)(w[0] >> 8) * INV_2_24;
            v[j] = p + (q - p) * u;
        } else {
            double u1 = ((double)(w[0] >> 8) + 1.0) * INV_2_24;
            double u2 = (double)(w[1] >> 8) * INV_2_24;
            v[j] = p + q * (sqrt(-2.0 * log(u1)) * cos(TWO_PI * u2));
        }
    }
}

/* A segment of one row of dst: elements [begin, end) of the row that starts
 * at storage offset off, stride inner, whose element 0 has counter c0. */
typedef struct rand_row {
    rand_kind kind;
    lucid_tensor *dst;
    uint64_t seed, c0;
    int64_t off, inner;
    double p, q;
} rand_row;

static void rand_range(void *arg, int64_t begin, int64_t end) {
    const rand_row *r = arg;
    double buf[CPU_CHUNK];
    for (int64_t j0 = begin; j0 < end; j0 += CPU_CHUNK) {
        int64_t n = end - j0 < CPU_CHUNK ? end - j0 : CPU_CHUNK;
        draw(r->kind, r->seed, r->c0 + (uint64_t)j0, n, r->p, r->q, buf);
        cpu_store_f64(r->dst, r->off + j0 * r->inner, r->inner, buf, n);
    }
}

/* Rows in logical order; a single long row (contiguous dst) is split over
 * threads, which cannot change any value (each depends only on its index). */
static lucid_status rand_fill(lucid_ctx *ctx, rand_kind kind, lucid_tensor *dst,
                              uint64_t seed, uint64_t offset, double p,
                              double q) {
    const lucid_tensor *ts[1] = {dst};
    cpu_rows it;
    if (!cpu_rows_init(&it, 1, ts)) return LUCID_OK;
    rand_row r = {kind, dst, seed, offset, it.off[0], it.inner[0], p, q};
    if (it.rows_left == 0) {
        cpu_parallel_for(ctx, it.len, CPU_GRAIN / 16, rand_range, &r);
        return LUCID_OK;
    }
    do {
        r.off = it.off[0];
        rand_range(&r, 0, it.len);
        r.c0 += (uint64_t)it.len;
    } while (cpu_rows_next(&it));
    return LUCID_OK;
}

lucid_status lucid_cpu_rand_uniform(lucid_ctx *ctx, lucid_tensor *dst,
                                    uint64_t seed, uint64_t offset, double lo,
                                    double hi) {
    return rand_fill(ctx, RAND_UNIFORM, dst, seed, offset, lo, hi);
}

lucid_status lucid_cpu_rand_normal(lucid_ctx *ctx, lucid_tensor *dst,
                                   uint64_t seed, uint64_t offset, double mean,
                                   double std) {
    return rand_fill(ctx, RAND_NORMAL, dst, seed, offset, mean, std);
}
