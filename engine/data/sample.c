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

static lucid_status work_ensure(lucid_ctx *ctx, lucid_aug_work *w, int s) {
    if (w->s == s && w->canvas.data && w->square.data) return LUCID_OK;
    lucid_aug_work_free(w);
    LUCID_TRY(lucid_image_alloc(ctx, 2 * s, 2 * s, &w->canvas));
    lucid_status st = lucid_image_alloc(ctx, s, s, &w->square);
    if (st != LUCID_OK) {
        lucid_image_free(&w->canvas);
        return st;
    }
    w->s = s;
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
                                   out, inst, hsv, NULL, 0, NULL);
}

lucid_status lucid_augment_sample_ex(lucid_ctx *ctx, const lucid_dataset *ds,
                                     const lucid_aug_params *p, int s,
                                     uint64_t seed, uint64_t epoch,
                                     int64_t index, lucid_aug_work *work,
                                     lucid_image *out, lucid_instances *inst,
                                     float hsv[3], double hsv_d[3],
                                     int defer, int *flips) {
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
    if (hsv_d) hsv_d[0] = hsv_d[1] = hsv_d[2] = 0;
    if (flips) *flips = 0;
    lucid_aug_work local;
    memset(&local, 0, sizeof local);
    if (!work) work = &local;
    LUCID_TRY(work_ensure(ctx, work, s));
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

    lucid_image *src;
    if (use_mosaic) {
        const lucid_image *ti[4] = {&imgs[0], &imgs[1], &imgs[2], &imgs[3]};
        const lucid_labels *tl[4];
        for (int i = 0; i < 4; i++) tl[i] = &ds->labels[idx[i]];
        st = lucid_aug_mosaic4(ctx, ti, tl, K, s, xc, yc, &work->canvas, inst);
        src = &work->canvas;
    } else {
        /* LetterBox(s, s) pre-transform (validation: the only transform) */
        st = lucid_instances_append(ctx, inst, &ds->labels[index], K,
                                    (float)imgs[0].w, (float)imgs[0].h, 0, 0);
        if (st == LUCID_OK)
            st = lucid_aug_letterbox(ctx, &imgs[0], s, s,
                                     p->augment ? &work->square : out, inst);
        src = &work->square;
    }
    if (st != LUCID_OK || !p->augment) goto done;

    /* RandomPerspective: output s x s */
    {
        double M[9], sc;
        lucid_rng_stream_seek(&r, STAGE_PERSPECTIVE);
        lucid_aug_perspective_matrix(p, src->w, src->h, s, s, &r, M, &sc);
        int identity = !use_mosaic && M[0] == 1 && M[1] == 0 && M[2] == 0 &&
                       M[3] == 0 && M[4] == 1 && M[5] == 0 && M[6] == 0 &&
                       M[7] == 0 && M[8] == 1;
        if (identity) memcpy(out->data, src->data, (size_t)s * s * 3);
        else st = lucid_aug_warp(ctx, src, M, out);
        if (st != LUCID_OK) goto done;
        lucid_aug_perspective_labels(inst, M, s, s, sc);
    }
    /* RandomHSV */
    {
        lucid_rng_stream_seek(&r, STAGE_HSV);
        /* rounded to f32, the dtype of the batch's hsv tensor, so the
         * device (hsv_on_cpu = 0) applies exactly the gains the CPU would */
        double rh = (float)(lucid_rng_uniform(&r, -1, 1) * p->hsv_h);
        double rs = (float)(lucid_rng_uniform(&r, -1, 1) * p->hsv_s);
        double rv = (float)(lucid_rng_uniform(&r, -1, 1) * p->hsv_v);
        if (hsv) { hsv[0] = (float)rh; hsv[1] = (float)rs; hsv[2] = (float)rv; }
        if (hsv_d) { hsv_d[0] = rh; hsv_d[1] = rs; hsv_d[2] = rv; }
        /* HSV is per pixel, so it commutes with the flips below: the loader
         * may apply it later, while transposing to CHW */
        if (!(defer & LUCID_DEFER_HSV) && p->hsv_on_cpu && (p->hsv_h || p->hsv_s || p->hsv_v))
            lucid_aug_hsv_apply(out, rh, rs, rv);
    }
    /* RandomFlip vertical then horizontal (both need flip_idx for pose) */
    {
        lucid_rng_stream_seek(&r, STAGE_FLIP);
        double ud = lucid_rng_uniform(&r, 0, 1);
        double lr = lucid_rng_uniform(&r, 0, 1);
        int flips_ok = K == 0 || spec->has_flip_idx;
        const int *fi = K > 0 ? spec->flip_idx : NULL;
        if (defer & LUCID_DEFER_FLIPS) {
            /* labels now, pixels in the loader's transpose */
            if (flips_ok && ud < p->flipud) {
                lucid_instances_flipud(inst, out->h);
                *flips |= LUCID_FLIP_UD;
            }
            if (flips_ok && lr < p->fliplr) {
                lucid_instances_fliplr(inst, out->w, fi);
                *flips |= LUCID_FLIP_LR;
            }
        } else {
            if (flips_ok && ud < p->flipud) lucid_aug_flipud(out, inst);
            if (flips_ok && lr < p->fliplr) lucid_aug_fliplr(out, inst, fi);
        }
    }
done:
    for (int i = 0; i < 4; i++)
        if (owned[i]) lucid_image_free(&imgs[i]);
    if (work == &local) lucid_aug_work_free(&local);
    return st;
}
