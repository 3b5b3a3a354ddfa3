/*
 * loader.c — persistent worker threads that assemble fixed-shape batches
 * into (pinned) host memory, with prefetch.
 *
 * Contract
 *   - prefetch + 1 batch slots (one may be held by the consumer). Workers
 *     claim samples in epoch order, one at a time; sample j of batch k goes
 *     to slot k % nslots, row j % B. A slot is reused only after the
 *     consumer released the batch it held. Every sample depends only on
 *     (seed, epoch, dataset index), so the bytes of a batch do not depend on
 *     the number of threads or on their timing.
 *   - The epoch order is a Fisher-Yates shuffle driven by Philox keyed by
 *     seed ^ 0x9E3779B97F4A7C15 with counter (epoch << 32) + i (identity
 *     order with shuffle = 0).
 *   - Target layout: see lucid_batch in data.h. More instances than max_gt
 *     in an image sets overflow / max_count in the batch (never silent).
 *   - The short last batch is delivered (drop_last = 0) with n < B; its pad
 *     rows are zero (images too) with mask 0 and sample_index -1.
 *   - A worker failure (e.g. an image that fails to decode without the
 *     cache) is stored with its message and returned by lucid_loader_next.
 *   - lucid_loader_start_epoch cancels unfinished work: it waits for the
 *     samples in flight, then discards the slots.
 *   - threads = 0 (Ultralytics workers=0): no worker thread and one slot;
 *     lucid_loader_next assembles the batch in the calling thread with the
 *     same per-sample code, so the bytes equal those of any thread count.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "data_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct slot {
    lucid_batch b;
    lucid_storage *storage;
    int64_t batch;      /* batch number held in this slot, -1 = free */
    int done, expected;
} slot;

struct lucid_loader {
    lucid_ctx *ctx;
    lucid_dataset *ds;
    lucid_loader_options opt;
    int S, K, B, G;              /* imgsz, keypoints, batch, max_gt */
    int nslots;
    slot *slots;
    int nthreads;
    pthread_t *threads;
    /* threads = 0: the calling thread's scratch (worker_main's locals) */
    lucid_ctx *sync_ctx;
    lucid_aug_work sync_work;
    lucid_instances sync_inst;
    lucid_image sync_img;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    /* epoch state (under mu) */
    int active, stop;
    uint64_t epoch, generation;
    lucid_aug_params params;
    int64_t *order;              /* [ds->n] */
    int64_t nsamples, nbatches;
    int64_t next_sample, next_batch, held;
    int busy;
    lucid_status err;
    char errmsg[2048];
};

lucid_loader_options lucid_loader_options_default(void) {
    lucid_loader_options o;
    memset(&o, 0, sizeof o);
    o.batch = 16;
    o.max_gt = 64;
    o.threads = 4;
    o.prefetch = 4;
    o.shuffle = 1;
    return o;
}

/* ------------------------------------------------------------- buffers */

static size_t align64(size_t v) { return (v + 63) & ~(size_t)63; }

/* Bytes of one batch slot (the layout of slot_init), every product and sum
 * checked: -1 when it does not fit in 2^62 (a batch, max_gt or imgsz so
 * large that the count would wrap to a small allocation). */
static int64_t slot_bytes(int64_t B, int64_t G, int64_t K, int64_t S) {
    int64_t part[7] = {3, 4, 16, 12, 1, 4, 12}, total = 0, x;
    int64_t f[7][3] = {{S, S, 1}, {G, 1, 1}, {G, 1, 1}, {G, K, 1},
                       {G, 1, 1}, {1, 1, 1}, {1, 1, 1}};
    for (int i = 0; i < 7; i++) {
        if (__builtin_mul_overflow(B, part[i], &x) ||
            __builtin_mul_overflow(x, f[i][0], &x) ||
            __builtin_mul_overflow(x, f[i][1], &x) ||
            __builtin_mul_overflow(x, f[i][2], &x) ||
            __builtin_add_overflow(total, x, &total) ||
            __builtin_add_overflow(total, 63, &total) ||
            total > ((int64_t)1 << 62))
            return -1;
    }
    return total;
}

static lucid_status slot_init(lucid_loader *ld, slot *sl) {
    int B = ld->B, G = ld->G, K = ld->K > 0 ? ld->K : 1, S = ld->S;
    int64_t sh_img[4] = {B, 3, S, S}, sh_cls[2] = {B, G}, sh_box[3] = {B, G, 4},
            sh_kp[4] = {B, G, K, 3}, sh_mask[2] = {B, G}, sh_cnt[1] = {B},
            sh_hsv[2] = {B, 3};
    size_t o_img = 0, n_img = (size_t)B * 3 * S * S;
    size_t o_cls = align64(o_img + n_img), n_cls = (size_t)B * G * 4;
    size_t o_box = align64(o_cls + n_cls), n_box = (size_t)B * G * 16;
    size_t o_kp = align64(o_box + n_box), n_kp = (size_t)B * G * K * 12;
    size_t o_mask = align64(o_kp + n_kp), n_mask = (size_t)B * G;
    size_t o_cnt = align64(o_mask + n_mask), n_cnt = (size_t)B * 4;
    size_t o_hsv = align64(o_cnt + n_cnt), n_hsv = (size_t)B * 12;
    size_t total = align64(o_hsv + n_hsv);
    lucid_device cpu = {LUCID_CPU, 0};
    LUCID_TRY(lucid_storage_create(ld->ctx, cpu, total, 1, &sl->storage));
    memset(lucid_storage_data(sl->storage), 0, total);
    lucid_batch *b = &sl->b;
    LUCID_TRY(lucid_tensor_from_storage(ld->ctx, sl->storage, LUCID_U8, 4,
                                        sh_img, NULL, (int64_t)o_img, &b->images));
    LUCID_TRY(lucid_tensor_from_storage(ld->ctx, sl->storage, LUCID_F32, 2,
                                        sh_cls, NULL, (int64_t)o_cls / 4, &b->cls));
    LUCID_TRY(lucid_tensor_from_storage(ld->ctx, sl->storage, LUCID_F32, 3,
                                        sh_box, NULL, (int64_t)o_box / 4, &b->boxes));
    LUCID_TRY(lucid_tensor_from_storage(ld->ctx, sl->storage, LUCID_F32, 4,
                                        sh_kp, NULL, (int64_t)o_kp / 4, &b->kpts));
    LUCID_TRY(lucid_tensor_from_storage(ld->ctx, sl->storage, LUCID_U8, 2,
                                        sh_mask, NULL, (int64_t)o_mask, &b->mask));
    LUCID_TRY(lucid_tensor_from_storage(ld->ctx, sl->storage, LUCID_I32, 1,
                                        sh_cnt, NULL, (int64_t)o_cnt / 4, &b->counts));
    LUCID_TRY(lucid_tensor_from_storage(ld->ctx, sl->storage, LUCID_F32, 2,
                                        sh_hsv, NULL, (int64_t)o_hsv / 4, &b->hsv));
    b->sample_index = malloc(sizeof(int64_t) * B);
    if (!b->sample_index)
        return lucid_seterr(ld->ctx, LUCID_ERR_OOM, "loader: out of memory");
    sl->batch = -1;
    return LUCID_OK;
}

static void slot_free(slot *sl) {
    lucid_batch *b = &sl->b;
    lucid_tensor *ts[7] = {b->images, b->cls, b->boxes, b->kpts,
                           b->mask, b->counts, b->hsv};
    for (int i = 0; i < 7; i++)
        if (ts[i]) lucid_tensor_release(ts[i]);
    free(b->sample_index);
    if (sl->storage) lucid_storage_release(sl->storage);
    memset(sl, 0, sizeof *sl);
}

/* The image of row j of a slot (3 planes of S*S). */
static uint8_t *row_image(lucid_loader *ld, slot *sl, int j) {
    return (uint8_t *)lucid_tensor_data(sl->b.images) +
           (size_t)j * 3 * ld->S * ld->S;
}

/* Write the targets of row j of a slot from an augmented sample (pixel
 * instances; the image is already in place). Returns the instance count. */
static int write_row(lucid_loader *ld, slot *sl, int j,
                     const lucid_instances *in, const float hsv[3]) {
    int S = ld->S, G = ld->G, K = ld->K, KK = K > 0 ? K : 1;
    lucid_batch *b = &sl->b;
    float *cls = (float *)lucid_tensor_data(b->cls) + (size_t)j * G;
    float *box = (float *)lucid_tensor_data(b->boxes) + (size_t)j * G * 4;
    float *kp = (float *)lucid_tensor_data(b->kpts) + (size_t)j * G * KK * 3;
    uint8_t *mask = (uint8_t *)lucid_tensor_data(b->mask) + (size_t)j * G;
    memset(cls, 0, sizeof(float) * G);
    memset(box, 0, sizeof(float) * G * 4);
    memset(kp, 0, sizeof(float) * G * KK * 3);
    memset(mask, 0, G);
    int n = in->n < G ? in->n : G;
    float inv = 1.0f / S;
    for (int m = 0; m < n; m++) {
        const float *bb = in->box + m * 4;
        cls[m] = in->cls[m];
        box[m * 4 + 0] = (bb[0] + bb[2]) * 0.5f * inv;
        box[m * 4 + 1] = (bb[1] + bb[3]) * 0.5f * inv;
        box[m * 4 + 2] = (bb[2] - bb[0]) * inv;
        box[m * 4 + 3] = (bb[3] - bb[1]) * inv;
        for (int k = 0; k < K; k++) {
            const float *p = in->kpts + ((size_t)m * K + k) * 3;
            float *q = kp + ((size_t)m * KK + k) * 3;
            if (p[2] == 0) continue; /* v = 0: x = y = v = 0 */
            q[0] = p[0] * inv;
            q[1] = p[1] * inv;
            q[2] = p[2];
        }
        mask[m] = 1;
    }
    ((int32_t *)lucid_tensor_data(b->counts))[j] = in->n;
    float *h = (float *)lucid_tensor_data(b->hsv) + j * 3;
    h[0] = hsv[0]; h[1] = hsv[1]; h[2] = hsv[2];
    return in->n;
}

static void zero_row(lucid_loader *ld, slot *sl, int j) {
    int S = ld->S, G = ld->G, KK = ld->K > 0 ? ld->K : 1;
    lucid_batch *b = &sl->b;
    memset((uint8_t *)lucid_tensor_data(b->images) + (size_t)j * 3 * S * S, 0,
           (size_t)3 * S * S);
    memset((float *)lucid_tensor_data(b->cls) + (size_t)j * G, 0, sizeof(float) * G);
    memset((float *)lucid_tensor_data(b->boxes) + (size_t)j * G * 4, 0,
           sizeof(float) * G * 4);
    memset((float *)lucid_tensor_data(b->kpts) + (size_t)j * G * KK * 3, 0,
           sizeof(float) * G * KK * 3);
    memset((uint8_t *)lucid_tensor_data(b->mask) + (size_t)j * G, 0, G);
    ((int32_t *)lucid_tensor_data(b->counts))[j] = 0;
    memset((float *)lucid_tensor_data(b->hsv) + j * 3, 0, sizeof(float) * 3);
    b->sample_index[j] = -1;
}

/* ------------------------------------------------------------- workers */

static int64_t batch_size_of(const lucid_loader *ld, int64_t k) {
    int64_t rem = ld->nsamples - k * ld->B;
    return rem < ld->B ? rem : ld->B;
}

static int can_claim(const lucid_loader *ld) {
    if (!ld->active || ld->next_sample >= ld->nsamples) return 0;
    int64_t k = ld->next_sample / ld->B;
    const slot *sl = &ld->slots[k % ld->nslots];
    return sl->batch == -1 || sl->batch == k;
}

static void *worker_main(void *arg) {
    lucid_loader *ld = arg;
    lucid_ctx *ectx = NULL;
    lucid_ctx_create(NULL, &ectx, NULL, 0);
    lucid_aug_work work;
    memset(&work, 0, sizeof work);
    lucid_instances inst;
    memset(&inst, 0, sizeof inst);
    lucid_image img = {0, 0, NULL};
    lucid_status ast = ectx ? lucid_image_alloc(ectx, ld->S, ld->S, &img)
                            : LUCID_ERR_OOM;
    pthread_mutex_lock(&ld->mu);
    for (;;) {
        while (!ld->stop && !can_claim(ld)) pthread_cond_wait(&ld->cv_work, &ld->mu);
        if (ld->stop) break;
        int64_t pos = ld->next_sample++;
        int64_t k = pos / ld->B;
        slot *sl = &ld->slots[k % ld->nslots];
        if (sl->batch == -1) {
            sl->batch = k;
            sl->done = 0;
            sl->expected = (int)batch_size_of(ld, k);
            sl->b.overflow = 0;
            sl->b.max_count = 0;
        }
        uint64_t gen = ld->generation, epoch = ld->epoch;
        lucid_aug_params p = ld->params;
        int64_t idx = ld->order[pos];
        ld->busy++;
        pthread_mutex_unlock(&ld->mu);

        int j = (int)(pos % ld->B);
        float hsv[3] = {0, 0, 0};
        lucid_status st = ast;
        /* the pixels go straight to the slot's planes (HSV when
         * hsv_on_cpu, flips applied); img is scratch */
        if (st == LUCID_OK)
            st = lucid_augment_sample_ex(ectx, ld->ds, &p, ld->S, ld->opt.seed,
                                         epoch, idx, &work, &img, &inst, hsv,
                                         row_image(ld, sl, j));
        int count = 0;
        if (st == LUCID_OK) {
            count = write_row(ld, sl, j, &inst, hsv);
            sl->b.sample_index[j] = idx;
        }

        pthread_mutex_lock(&ld->mu);
        ld->busy--;
        if (gen == ld->generation) {
            if (st != LUCID_OK && ld->err == LUCID_OK) {
                ld->err = st;
                snprintf(ld->errmsg, sizeof ld->errmsg, "%s",
                         ectx ? lucid_ctx_error(ectx) : "out of memory");
            }
            if (count > sl->b.max_count) sl->b.max_count = count;
            if (count > ld->G) sl->b.overflow++;
            sl->done++;
            if (sl->done == sl->expected || st != LUCID_OK)
                pthread_cond_broadcast(&ld->cv_done);
        }
        if (ld->busy == 0) pthread_cond_broadcast(&ld->cv_done);
    }
    pthread_mutex_unlock(&ld->mu);
    lucid_image_free(&img);
    lucid_instances_free(&inst);
    lucid_aug_work_free(&work);
    if (ectx) lucid_ctx_release(ectx);
    return NULL;
}

/* ---------------------------------------------------------------- API */

lucid_status lucid_loader_create(lucid_ctx *ctx, lucid_dataset *ds,
                                 const lucid_loader_options *opt,
                                 lucid_loader **out) {
    *out = NULL;
    lucid_loader_options def = lucid_loader_options_default();
    if (!opt) opt = &def;
    const lucid_dataset_options *dopt = lucid_dataset_opts(ds);
    int S = opt->imgsz > 0 ? opt->imgsz : dopt->imgsz;
    if (opt->batch < 1 || opt->max_gt < 1 || opt->threads < 0 ||
        opt->threads > 256 || opt->prefetch < 1 || S < 32 || S % 2)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "loader options: batch %d, max_gt %d, prefetch %d "
                            "must be >= 1, threads %d in 0..256 (0: batches "
                            "made in the calling thread) and imgsz %d even "
                            "and >= 32",
                            opt->batch, opt->max_gt, opt->prefetch,
                            opt->threads, S);
    int K = dopt->spec.nkpt > 0 ? dopt->spec.nkpt : 1;
    if (slot_bytes(opt->batch, opt->max_gt, K, S) < 0)
        return lucid_seterr(ctx, LUCID_ERR_ARG,
                            "loader options: tensor size overflows: batch %d "
                            "x 3 x imgsz %d x %d with max_gt %d and %d "
                            "keypoints does not fit one buffer",
                            opt->batch, S, S, opt->max_gt, K);
    lucid_loader *ld = calloc(1, sizeof *ld);
    if (!ld) return lucid_seterr(ctx, LUCID_ERR_OOM, "loader: out of memory");
    ld->ctx = ctx;
    lucid_ctx_retain(ctx);
    ld->ds = ds;
    lucid_dataset_retain(ds);
    ld->opt = *opt;
    ld->S = S;
    ld->K = dopt->spec.nkpt;
    ld->B = opt->batch;
    ld->G = opt->max_gt;
    ld->held = -1;
    /* threads = 0: nothing is prepared ahead, one slot is enough */
    ld->nslots = opt->threads == 0 ? 1 : opt->prefetch + 1;
    ld->order = malloc(sizeof(int64_t) * (ds->n > 0 ? ds->n : 1));
    ld->slots = calloc(ld->nslots, sizeof(slot));
    ld->threads = calloc(opt->threads > 0 ? opt->threads : 1, sizeof(pthread_t));
    pthread_mutex_init(&ld->mu, NULL);
    pthread_cond_init(&ld->cv_work, NULL);
    pthread_cond_init(&ld->cv_done, NULL);
    lucid_status st = LUCID_OK;
    if (!ld->order || !ld->slots || !ld->threads)
        st = lucid_seterr(ctx, LUCID_ERR_OOM, "loader: out of memory");
    for (int i = 0; st == LUCID_OK && i < ld->nslots; i++)
        st = slot_init(ld, &ld->slots[i]);
    if (st == LUCID_OK && opt->threads == 0) {
        /* worker_main's scratch, owned by the loader (its own CPU context
         * for the per-sample errors, as a worker has) */
        if (lucid_ctx_create(NULL, &ld->sync_ctx, NULL, 0) != LUCID_OK)
            st = lucid_seterr(ctx, LUCID_ERR_OOM, "loader: out of memory");
        else if (lucid_image_alloc(ld->sync_ctx, S, S, &ld->sync_img) != LUCID_OK)
            st = lucid_seterr(ctx, LUCID_ERR_OOM, "loader: out of memory");
    }
    for (int i = 0; st == LUCID_OK && i < opt->threads; i++) {
        if (pthread_create(&ld->threads[i], NULL, worker_main, ld) != 0)
            st = lucid_seterr(ctx, LUCID_ERR_OOM,
                              "loader: cannot start worker thread %d", i);
        else
            ld->nthreads++;
    }
    if (st != LUCID_OK) {
        lucid_loader_release(ld);
        return st;
    }
    ld->nsamples = ds->n;
    ld->nbatches = opt->drop_last ? ds->n / ld->B : (ds->n + ld->B - 1) / ld->B;
    *out = ld;
    return LUCID_OK;
}

static void make_order(lucid_loader *ld, uint64_t epoch) {
    int64_t n = ld->ds->n;
    for (int64_t i = 0; i < n; i++) ld->order[i] = i;
    if (!ld->opt.shuffle) return;
    uint64_t key = ld->opt.seed ^ 0x9E3779B97F4A7C15ull;
    for (int64_t i = n - 1; i > 0; i--) {
        uint32_t r[4];
        lucid_philox4x32(key, (epoch << 32) + (uint64_t)i, r);
        uint64_t x = ((uint64_t)r[0] << 32) | r[1];
        int64_t j = (int64_t)(x % (uint64_t)(i + 1));
        int64_t t = ld->order[i];
        ld->order[i] = ld->order[j];
        ld->order[j] = t;
    }
}

lucid_status lucid_loader_start_epoch(lucid_loader *ld, uint64_t epoch,
                                      const lucid_aug_params *p) {
    lucid_aug_params def = lucid_aug_params_default();
    if (!p) p = &def;
    pthread_mutex_lock(&ld->mu);
    ld->generation++;
    ld->active = 0;
    while (ld->busy > 0) pthread_cond_wait(&ld->cv_done, &ld->mu);
    for (int i = 0; i < ld->nslots; i++) ld->slots[i].batch = -1;
    ld->epoch = epoch;
    ld->params = *p;
    make_order(ld, epoch);
    ld->nsamples = ld->opt.drop_last ? ld->nbatches * ld->B : ld->ds->n;
    ld->next_sample = 0;
    ld->next_batch = 0;
    ld->held = -1;
    ld->err = LUCID_OK;
    ld->errmsg[0] = 0;
    ld->active = 1;
    pthread_cond_broadcast(&ld->cv_work);
    pthread_mutex_unlock(&ld->mu);
    return LUCID_OK;
}

/* threads = 0: assemble batch k in the calling thread, sample by sample as
 * worker_main does (same augmentation call, same row writes). */
static lucid_status sync_batch(lucid_loader *ld, int64_t k, slot *sl) {
    sl->batch = k;
    sl->done = 0;
    sl->expected = (int)batch_size_of(ld, k);
    sl->b.overflow = 0;
    sl->b.max_count = 0;
    for (int j = 0; j < sl->expected; j++) {
        int64_t pos = k * ld->B + j, idx = ld->order[pos];
        float hsv[3] = {0, 0, 0};
        lucid_status st = lucid_augment_sample_ex(
            ld->sync_ctx, ld->ds, &ld->params, ld->S, ld->opt.seed, ld->epoch, idx,
            &ld->sync_work, &ld->sync_img, &ld->sync_inst, hsv, row_image(ld, sl, j));
        if (st != LUCID_OK) {
            sl->batch = -1;
            return lucid_seterr(ld->ctx, st, "loader: %s", lucid_ctx_error(ld->sync_ctx));
        }
        int count = write_row(ld, sl, j, &ld->sync_inst, hsv);
        sl->b.sample_index[j] = idx;
        if (count > sl->b.max_count) sl->b.max_count = count;
        if (count > ld->G) sl->b.overflow++;
        sl->done++;
    }
    ld->next_sample = k * ld->B + sl->expected;
    return LUCID_OK;
}

lucid_status lucid_loader_next(lucid_loader *ld, lucid_batch **out) {
    *out = NULL;
    pthread_mutex_lock(&ld->mu);
    if (ld->held >= 0) {
        ld->slots[ld->held % ld->nslots].batch = -1;
        ld->held = -1;
        pthread_cond_broadcast(&ld->cv_work);
    }
    if (!ld->active) {
        pthread_mutex_unlock(&ld->mu);
        return lucid_seterr(ld->ctx, LUCID_ERR_STATE,
                            "loader: call start_epoch before next");
    }
    if (ld->next_batch >= ld->nbatches) {
        pthread_mutex_unlock(&ld->mu);
        return LUCID_OK;
    }
    int64_t k = ld->next_batch;
    slot *sl = &ld->slots[k % ld->nslots];
    if (ld->nthreads == 0) { /* no workers: this thread assembles it */
        lucid_status st = sync_batch(ld, k, sl);
        if (st != LUCID_OK) {
            pthread_mutex_unlock(&ld->mu);
            return st;
        }
    }
    while (ld->err == LUCID_OK &&
           !(sl->batch == k && sl->done == sl->expected))
        pthread_cond_wait(&ld->cv_done, &ld->mu);
    if (ld->err != LUCID_OK) {
        lucid_status st = ld->err;
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", ld->errmsg);
        pthread_mutex_unlock(&ld->mu);
        return lucid_seterr(ld->ctx, st, "loader: %s", msg);
    }
    ld->held = k;
    ld->next_batch++;
    sl->b.index = k;
    sl->b.epoch = ld->epoch;
    sl->b.n = sl->expected;
    pthread_mutex_unlock(&ld->mu);
    for (int j = sl->b.n; j < ld->B; j++) zero_row(ld, sl, j);
    *out = &sl->b;
    return LUCID_OK;
}

int64_t lucid_loader_num_batches(const lucid_loader *ld) { return ld->nbatches; }

void lucid_loader_release(lucid_loader *ld) {
    if (!ld) return;
    pthread_mutex_lock(&ld->mu);
    ld->stop = 1;
    ld->generation++;
    pthread_cond_broadcast(&ld->cv_work);
    pthread_mutex_unlock(&ld->mu);
    for (int i = 0; i < ld->nthreads; i++) pthread_join(ld->threads[i], NULL);
    if (ld->slots)
        for (int i = 0; i < ld->nslots; i++) slot_free(&ld->slots[i]);
    pthread_mutex_destroy(&ld->mu);
    pthread_cond_destroy(&ld->cv_work);
    pthread_cond_destroy(&ld->cv_done);
    free(ld->slots);
    free(ld->threads);
    free(ld->order);
    lucid_image_free(&ld->sync_img);
    lucid_instances_free(&ld->sync_inst);
    lucid_aug_work_free(&ld->sync_work);
    if (ld->sync_ctx) lucid_ctx_release(ld->sync_ctx);
    lucid_dataset_release(ld->ds);
    lucid_ctx_release(ld->ctx);
    free(ld);
}
