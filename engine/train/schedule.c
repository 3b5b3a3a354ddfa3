/*
 * schedule.c — host-side training-schedule arithmetic of the Ultralytics
 * trainer (reference §3.2-§3.4), as pure functions in f64.
 *
 * Contract
 *   - "round" is Python's round() / NumPy's .round(): half to even; rint()
 *     under the default rounding mode.
 *   - lucid_sched_interp reproduces numpy.interp for two points, including
 *     x0 == x1 (x >= x1 gives y1) and the formula order
 *     slope*(x - x0) + y0 with slope = (y1 - y0)/(x1 - x0).
 *   - The warmup test is ni <= nw (BaseTrainer._do_train).
 *   - Sources: ultralytics/engine/trainer.py (_setup_train: accumulate,
 *     weight_decay, lf; _do_train: nw, warmup interpolation) and
 *     build_optimizer (optimizer=auto rule); utils/ops one_cycle (cosine).
 */
#include "train/optim.h"
#include <math.h>

int lucid_sched_accumulate(int nbs, int batch) {
    if (batch <= 0) return 1;
    double a = rint((double)nbs / (double)batch);
    return a < 1.0 ? 1 : (int)a;
}

double lucid_sched_weight_decay(double weight_decay, int batch, int accumulate,
                                int nbs) {
    return weight_decay * (double)batch * (double)accumulate / (double)nbs;
}

int64_t lucid_sched_warmup_iters(double warmup_epochs, int epochs, int64_t nb) {
    double e = (double)(epochs - 1 > 0 ? epochs - 1 : 0);
    double w = warmup_epochs < e ? warmup_epochs : e;
    return (int64_t)rint(w * (double)nb);
}

double lucid_sched_interp(double x, double x0, double x1, double y0, double y1) {
    if (x >= x1) return y1;
    if (x <= x0) return y0;
    double slope = (y1 - y0) / (x1 - x0);
    return slope * (x - x0) + y0;
}

double lucid_sched_lf(int cos_lr, double epoch, int epochs, double lrf) {
    if (cos_lr) {
        double f = (1.0 - cos(epoch * M_PI / (double)epochs)) / 2.0;
        if (f < 0.0) f = 0.0;
        return f * (lrf - 1.0) + 1.0;
    }
    double f = 1.0 - epoch / (double)epochs;
    if (f < 0.0) f = 0.0;
    return f * (1.0 - lrf) + lrf;
}

int lucid_sched_in_warmup(int64_t ni, int64_t nw) { return ni <= nw; }

int lucid_sched_warmup_accumulate(int64_t ni, int64_t nw, int nbs, int batch) {
    double a = rint(lucid_sched_interp((double)ni, 0.0, (double)nw, 1.0,
                                       (double)nbs / (double)batch));
    return a < 1.0 ? 1 : (int)a;
}

double lucid_sched_warmup_lr(int64_t ni, int64_t nw, int is_bias,
                             double warmup_bias_lr, double initial_lr,
                             double lf) {
    return lucid_sched_interp((double)ni, 0.0, (double)nw,
                              is_bias ? warmup_bias_lr : 0.0, initial_lr * lf);
}

double lucid_sched_warmup_momentum(int64_t ni, int64_t nw,
                                   double warmup_momentum, double momentum) {
    return lucid_sched_interp((double)ni, 0.0, (double)nw, warmup_momentum,
                              momentum);
}

void lucid_sched_auto_optimizer(int64_t n_train, int batch, int nbs,
                                int epochs, int nc, lucid_optim_kind *kind,
                                double *lr, double *momentum) {
    int64_t denom = batch > nbs ? batch : nbs;
    if (denom < 1) denom = 1;
    int64_t iterations = ((n_train + denom - 1) / denom) * (int64_t)epochs;
    *momentum = 0.9;
    if (iterations > 10000) {
        *kind = LUCID_OPTIM_MUSGD;
        *lr = 0.01;
    } else {
        *kind = LUCID_OPTIM_ADAMW;
        /* round(0.002 * 5 / (4 + nc), 6) */
        *lr = rint(0.002 * 5.0 / (4.0 + nc) * 1e6) / 1e6;
    }
}
