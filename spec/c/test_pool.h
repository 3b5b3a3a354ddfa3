/* test_pool.h — a pool of the tensors a test case makes, released at the
 * end of the case (pool_free), so the cases need no per-tensor cleanup.
 * keep(t) adds t and returns it; NULL stays NULL, and a full pool (more
 * than a case ever makes) releases t and returns NULL: a leak-free
 * refusal the caller's NULL check reports. One pool per test program. */
#pragma once
#include "lucid.h"

static lucid_tensor *test_pool[2048];
static int test_npool;

static inline lucid_tensor *keep(lucid_tensor *t) {
    if (!t) return NULL;
    if (test_npool == (int)(sizeof test_pool / sizeof test_pool[0])) {
        lucid_tensor_release(t);
        return NULL;
    }
    test_pool[test_npool++] = t;
    return t;
}

static inline void pool_free(void) {
    for (int i = 0; i < test_npool; i++) lucid_tensor_release(test_pool[i]);
    test_npool = 0;
}
