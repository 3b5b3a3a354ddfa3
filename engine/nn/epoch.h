/*
 * epoch.h — engine-private: the counter behind lucid_contract_epoch (nn.h)
 * for an inline read where one is on a hot path (the quick check of
 * train/graph.c). C11 only (not for C++ translation units).
 */
#ifndef LUCID_NN_EPOCH_H
#define LUCID_NN_EPOCH_H
#include <stdatomic.h>
#include <stdint.h>

extern _Atomic uint64_t lucid_contract_epoch_counter;

static inline uint64_t lucid_contract_epoch_now(void) {
    return atomic_load_explicit(&lucid_contract_epoch_counter, memory_order_relaxed);
}
#endif /* LUCID_NN_EPOCH_H */
