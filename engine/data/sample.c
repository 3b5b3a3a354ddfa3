/*
 * sample.c — the per-sample transform chain (v8_transforms) on top of the
 * primitives in augment.c.
 *
 * Contract
 *   - Randomness: one Philox stream per (seed, epoch, index); stage blocks:
 *     mosaic 0, perspective 256, hsv 512, flips 768. Nothing else is random,
 *     so a sample is the same bytes whatever thread computes it.
 *   - Mosaic partners are drawn uniformly from the whole dataset (the
 *     reference draws them from a buffer of recently loaded images, which
 *     depends on load order and could not be reproduced across thread
 *     counts; it equals our rule with cache='ram').
 *   - The HSV gains are always drawn (so the device can apply the same ones
 *     when hsv_on_cpu = 0), and rounded to f32 before use: the batch
 *     carries them as f32, and CPU and device HSV must see the same values.
 *   - Labels go through the stages in order; the pixels are made last, in
 *     one pass where possible: with an axis-aligned matrix (the pose
 *     defaults) the warp samples the four mosaic tiles directly
 *     (lucid_aug_warp_tiles: the 2s x 2s canvas is never written) and
 *     applies HSV and the flips while writing HWC or the loader's CHW
 *     planes. Other matrices warp the written canvas, then HSV and flips.
 *     Same bytes either way (HSV is per pixel and commutes with the flips).
 */
#include "data_internal.h"

#include <stdlib.h>
#include <string.h>

enum { STAGE_MOSAIC = 0, STAGE_PERSPECTIVE = 256, STAGE_HSV = 512,
       STAGE_FLIP = 768 };

void lucid_aug_work_free(lucid_aug_work *w) {
    if (!w) return;
    lucid_image_free(&w->canvas);
    lucid_image_free(&w->square);
    w->s = 0;
}

/* The s x s letterbox canvas always; the 2s x 2s mosaic canvas only when a
 * warp needs it materialised (rotation, shear or perspective). */
static lucid_status work_ensure(lucid_ctx *ctx, lucid_aug_work *w, int s,
                                int canvas) {
    if (w->s != s) {
        lucid_aug_work_free(w);
        w->s = s;
    }
    if (!w->square.data) LUCID_TRY(lucid_image_alloc(ctx, s, s, &w->square));
    if (canvas && !w->canvas.data)
        LUCID_TRY(lucid_image_alloc(ctx, 2 * s, 2 * s, &w->canvas));
    return LUCID_OK;
}

static int64_t draw_index(lucid_rng_stream *r, int64_t n) {
    int64_t i = (int64_t)lucid_rng_uniform(r, 0, (double)n);
    return i < n ? i : n - 1;
}

lucid_status lucid_augment_sample(lucid_ctx *ctx, const lucid_dataset *ds,
                                  const lucid_aug_params *p, int s,
                                  uint64_t seed, uint64_t epoch, int64_t index,
                                  lucid_aug_work *work, lucid_image *out,
                                  lucid_instances *inst, float hsv[3]) {
    return lucid_augment_sample_ex(ctx, ds, p, s, seed, epoch, index, work,
                                   out, inst, hsv, NULL);
}

/* The pixels of an augmented sample: the canvas (tiles) warped by M, HSV
 * (when apply_hsv) and the flips, into chw (planar) or else out (HWC). An
 * axis-aligned M samples the tiles directly into the destination (one pass);
 * any other M warps the materialised canvas into out first. */
static lucid_status augment_pixels(lucid_ctx *ctx, const lucid_tiles *tiles,
                                   int use_mosaic, const double M[9],
                                   int apply_hsv, const double g[3], int flips,
                                   lucid_aug_work *work, lucid_image *out,
                                   uint8_t *chw) {
    if (lucid_aug_warp_is_axis_aligned(M)) {
        lucid_warp_out o = chw ? lucid_warp_out_chw(chw, out->w, out->h)
                               : lucid_warp_out_hwc(out);
        o.flips = flips;
        o.hsv = apply_hsv;
        o.rh = g[0];
        o.rs = g[1];
        o.rv = g[2];
        return lucid_aug_warp_tiles(ctx, tiles, M, &o);
    }
    const lucid_image *src = &work->square;
    if (use_mosaic) {
        LUCID_TRY(work_ensure(ctx, work, work->s, 1));
        lucid_tiles_fill(tiles, &work->canvas);
        src = &work->canvas;
    }
    LUCID_TRY(lucid_aug_warp(ctx, src, M, out));
    if (chw) {
        lucid_hwc_to_chw(out, chw, apply_hsv, g[0], g[1], g[2], flips);
        return LUCID_OK;
    }
    if (apply_hsv) lucid_aug_hsv_apply(out, g[0], g[1], g[2]);
    lucid_image_flip(out, flips);
    return LUCID_OK;
}

lucid_status lucid_augment_sample_ex(lucid_ctx *ctx, const lucid_dataset *ds,
                                     const lucid_aug_params *p, int s,
                                     uint64_t seed, uint64_t epoch,
                                     int64_t index, lucid_aug_work *work,
                                     lucid_image *out, lucid_instances *inst,
                                     float hsv[3], uint8_t *chw) {
    const lucid_pose_spec *spec = &ds->opt.spec;
    int K = spec->nkpt;
    if (out->w != s || out->h != s || !out->data)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "augment output must be %dx%d, got %dx%d", s, s,
                            out->w, out->h);
    if (index < 0 || index >= ds->n)
        return lucid_seterr(ctx, LUCID_ERR_ARG, "sample %lld outside [0, %lld)",
                            (long long)index, (long long)ds->n);
    if (hsv) hsv[0] = hsv[1] = hsv[2] = 0;
    lucid_aug_work local;
    memset(&local, 0, sizeof local);
    if (!work) work = &local;
    LUCID_TRY(work_ensure(ctx, work, s, 0));
    inst->n = 0;
    LUCID_TRY(lucid_instances_reserve(ctx, inst, 16, K));

    lucid_rng_stream r;
    lucid_rng_stream_init(&r, seed, epoch, (uint64_t)index);
    lucid_status st = LUCID_OK;
    lucid_image imgs[4];
    int owned[4] = {0, 0, 0, 0};
    memset(imgs, 0, sizeof imgs);

    int use_mosaic = 0;
    int64_t idx[4] = {index, index, index, index};
    int xc = 0, yc = 0;
    if (p->augment) {
        lucid_rng_stream_seek(&r, STAGE_MOSAIC);
        double u = lucid_rng_uniform(&r, 0, 1);
        use_mosaic = p->mosaic > 0 && !(u > p->mosaic);
        if (use_mosaic) {
            for (int i = 1; i < 4; i++) idx[i] = draw_index(&r, ds->n);
            /* border = (-s//2, -s//2): U(s//2, 2s - s//2), int() */
            xc = (int)lucid_rng_uniform(&r, s / 2, 2 * s - s / 2);
            yc = (int)lucid_rng_uniform(&r, s / 2, 2 * s - s / 2);
        }
    }
    int nimg = use_mosaic ? 4 : 1;
    for (int i = 0; i < nimg && st == LUCID_OK; i++)
        st = lucid_dataset_load_image(ctx, ds, idx[i], &imgs[i], &owned[i]);
    if (st != LUCID_OK) goto done;

    /* the canvas: mosaic tiles (not written out), or the letterbox */
    lucid_tiles tiles;
    memset(&tiles, 0, sizeof tiles);
    if (use_mosaic) {
        const lucid_image *ti[4] = {&imgs[0], &imgs[1], &imgs[2], &imgs[3]};
        const lucid_labels *tl[4];
        for (int i = 0; i < 4; i++) tl[i] = &ds->labels[idx[i]];
        st = lucid_aug_mosaic4_tiles(ctx, ti, tl, K, s, xc, yc, &tiles, inst);
    } else {
        /* LetterBox(s, s) pre-transform (validation: the only transform) */
        st = lucid_instances_append(ctx, inst, &ds->labels[index], K,
                                    (float)imgs[0].w, (float)imgs[0].h, 0, 0);
        lucid_image *lb = p->augment ? &work->square : out;
        if (st == LUCID_OK) st = lucid_aug_letterbox(ctx, &imgs[0], s, s, lb, inst);
        tiles.w = tiles.h = s;
        tiles.n = 1;
        tiles.t[0] = (lucid_tile){0, 0, s, s, lb->data, (size_t)s * 3};
    }
    if (st != LUCID_OK) goto done;
    if (!p->augment) {
        if (chw) lucid_hwc_to_chw(out, chw, 0, 0, 0, 0, 0);
        goto done;
    }

    /* RandomPerspective: output s x s (labels here, pixels below) */
    double M[9], sc;
    lucid_rng_stream_seek(&r, STAGE_PERSPECTIVE);
    lucid_aug_perspective_matrix(p, use_mosaic ? 2 * s : s, use_mosaic ? 2 * s : s,
                                 s, s, &r, M, &sc);
    lucid_aug_perspective_labels(inst, M, s, s, sc);
    /* RandomHSV: the gains are always drawn, rounded to f32, the dtype of
     * the batch's hsv tensor, so the device (hsv_on_cpu = 0) applies
     * exactly the gains the CPU would */
    double g[3];
    lucid_rng_stream_seek(&r, STAGE_HSV);
    g[0] = (float)(lucid_rng_uniform(&r, -1, 1) * p->hsv_h);
    g[1] = (float)(lucid_rng_uniform(&r, -1, 1) * p->hsv_s);
    g[2] = (float)(lucid_rng_uniform(&r, -1, 1) * p->hsv_v);
    if (hsv) { hsv[0] = (float)g[0]; hsv[1] = (float)g[1]; hsv[2] = (float)g[2]; }
    int apply_hsv = p->hsv_on_cpu && (p->hsv_h || p->hsv_s || p->hsv_v);
    /* RandomFlip vertical then horizontal (both need flip_idx for pose):
     * labels here, pixels below */
    lucid_rng_stream_seek(&r, STAGE_FLIP);
    double ud = lucid_rng_uniform(&r, 0, 1);
    double lr = lucid_rng_uniform(&r, 0, 1);
    int flips_ok = K == 0 || spec->has_flip_idx, flips = 0;
    if (flips_ok && ud < p->flipud) {
        lucid_instances_flipud(inst, s);
        flips |= LUCID_FLIP_UD;
    }
    if (flips_ok && lr < p->fliplr) {
        lucid_instances_fliplr(inst, s, K > 0 ? spec->flip_idx : NULL);
        flips |= LUCID_FLIP_LR;
    }
    /* HSV is per pixel, so it commutes with the flips */
    st = augment_pixels(ctx, &tiles, use_mosaic, M, apply_hsv, g, flips, work,
                        out, chw);
done:
    for (int i = 0; i < 4; i++)
        if (owned[i]) lucid_image_free(&imgs[i]);
    if (work == &local) lucid_aug_work_free(&local);
    return st;
}
