/*
 * alloc.cu — the stream-aware caching allocator of one context's device,
 * and its cache of page-locked host blocks. Modelled on cutorch's
 * THCCachingAllocator / PyTorch's CUDACachingAllocator.
 *
 * Policy (device memory)
 *   - Requests are rounded up to a multiple of 512 bytes (minimum 512).
 *   - Two pools: "small" for rounded requests <= 1 MiB, carved out of 2 MiB
 *     segments; "large" for the rest: requests < 10 MiB get a 20 MiB segment,
 *     larger ones a segment rounded up to a multiple of 2 MiB.
 *   - Every block is tagged with the stream it was allocated for. A freed
 *     block returns to its pool and is reused only for the same stream:
 *     work on one stream runs in order, so the next user of the block runs
 *     after every earlier user, with no host synchronization. (Using a block
 *     on another stream needs an event; the op table only uses the compute
 *     stream.)
 *   - Best fit: the smallest cached block of the same stream that is large
 *     enough. It is split when the rest is worth keeping (>= 512 bytes in the
 *     small pool, > 1 MiB in the large pool); a freed block merges with free
 *     neighbours of its segment.
 *   - A cache miss calls cudaMalloc. When that fails, every wholly free cached
 *     segment is released (after a device synchronize) and cudaMalloc is tried
 *     once more; a second failure returns LUCID_ERR_OOM with the requested
 *     size, this allocator's allocated and reserved totals and the driver's
 *     free/total in the message. Never an abort.
 *   - empty_cache releases every wholly free segment to the driver; segments
 *     with a live block stay. Statistics: allocated (live blocks, rounded
 *     sizes), reserved (segments held from the driver), their peaks,
 *     num_allocs (blocks handed out) and num_device_allocs (cudaMalloc calls).
 *   - While a CUDA graph is captured on the context's stream (cuda/graph.cu)
 *     every request fails with LUCID_ERR_STATE "allocation during graph
 *     capture: <bytes>", cache hits included: a block handed out during a
 *     capture would be handed out again after it while the graph still
 *     writes it.
 *
 * Policy (pinned host memory, cudaHostAlloc)
 *   - Requests are rounded up to a power of two (minimum 4 KiB) up to 1 MiB,
 *     to a multiple of 1 MiB above. A freed block records an event on the
 *     stream given to free and is handed out again only once that event has
 *     completed (cudaEventQuery), so an asynchronous copy still reading or
 *     writing it is never disturbed. empty_cache frees idle pinned blocks.
 *
 * Thread safety: one mutex per allocator; storages may be released from any
 * thread (loader workers).
 */
#include "common.cuh"

#include <mutex>
#include <new>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>
#include <stdio.h>
#include <string.h>

namespace {

constexpr size_t kMinBlock = 512;                   /* rounding unit */
constexpr size_t kSmallSize = (size_t)1 << 20;      /* small pool limit */
constexpr size_t kSmallBuffer = (size_t)2 << 20;    /* small segment */
constexpr size_t kLargeBuffer = (size_t)20 << 20;   /* segment for 1..10 MiB */
constexpr size_t kMinLargeAlloc = (size_t)10 << 20; /* above: own segment */
constexpr size_t kRoundLarge = (size_t)2 << 20;     /* large segment rounding */

struct Block {
    size_t size;          /* bytes of this block */
    void *ptr;
    cudaStream_t stream;  /* stream the block belongs to */
    bool allocated;
    bool small;           /* which pool its segment belongs to */
    Block *prev, *next;   /* neighbours in the same segment */
};

struct BlockLess {
    bool operator()(const Block *a, const Block *b) const {
        if (a->stream != b->stream)
            return (uintptr_t)a->stream < (uintptr_t)b->stream;
        if (a->size != b->size) return a->size < b->size;
        return (uintptr_t)a->ptr < (uintptr_t)b->ptr;
    }
};

typedef std::set<Block *, BlockLess> Pool;

struct HostBlock {
    size_t size;
    void *ptr;
    bool allocated;
    bool event_pending;   /* event recorded at free, maybe not complete */
    cudaEvent_t event;    /* created lazily */
};

struct HostLess {
    bool operator()(const HostBlock *a, const HostBlock *b) const {
        if (a->size != b->size) return a->size < b->size;
        return (uintptr_t)a->ptr < (uintptr_t)b->ptr;
    }
};

size_t round_size(size_t n) {
    if (n < kMinBlock) return kMinBlock;
    return (n + kMinBlock - 1) / kMinBlock * kMinBlock;
}

size_t segment_size(size_t size) {
    if (size <= kSmallSize) return kSmallBuffer;
    if (size < kMinLargeAlloc) return kLargeBuffer;
    return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

size_t host_round(size_t n) {
    if (n <= 4096) return 4096;
    if (n <= ((size_t)1 << 20)) {
        size_t p = 4096;
        while (p < n) p <<= 1;
        return p;
    }
    return (n + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
}

} /* namespace */

struct lucid_cuda_allocator {
    int device;
    cudaStream_t default_stream;
    std::mutex mu;
    Pool small_pool, large_pool;                     /* free blocks */
    std::unordered_map<void *, Block *> live;        /* allocated blocks */
    lucid_memory_stats stats;

    std::set<HostBlock *, HostLess> host_free;       /* idle pinned blocks */
    std::unordered_map<void *, HostBlock *> host_all;
    uint64_t host_reserved;

    /* Set while a CUDA graph is being captured on this context's stream
     * (cuda/graph.cu): every device allocation is refused, and so is a
     * pinned allocation from the capturing thread, because memory handed out
     * during a capture would be handed out again while the graph still uses
     * it. */
    bool capturing;
    std::thread::id capture_thread;
};

/* Called by cuda/graph.cu around a capture (declared there). */
void lucid_cuda_allocator_set_capture(lucid_cuda_allocator *a, int on) {
    std::lock_guard<std::mutex> lock(a->mu);
    a->capturing = on != 0;
    a->capture_thread = std::this_thread::get_id();
}

/* ---------------------------------------------------------------- helpers */

static void update_peaks(lucid_memory_stats &s) {
    if (s.allocated > s.peak_allocated) s.peak_allocated = s.allocated;
    if (s.reserved > s.peak_reserved) s.peak_reserved = s.reserved;
}

/* Free every cached segment that has no live block. Caller holds the lock.
 * Synchronizes the device first so no queued kernel still uses the memory.
 * Returns the first CUDA error (the cache stays consistent either way). */
static cudaError_t release_cached(lucid_cuda_allocator *a) {
    cudaError_t first = cudaDeviceSynchronize();
    Pool *pools[2] = {&a->small_pool, &a->large_pool};
    for (Pool *pool : pools) {
        for (auto it = pool->begin(); it != pool->end();) {
            Block *b = *it;
            if (b->prev == nullptr && b->next == nullptr) {
                cudaError_t e = cudaFree(b->ptr);
                if (e != cudaSuccess && first == cudaSuccess) first = e;
                a->stats.reserved -= b->size;
                it = pool->erase(it);
                delete b;
            } else {
                ++it;
            }
        }
    }
    return first;
}

/* Release idle pinned blocks whose last use has completed. Caller holds the
 * lock. */
static void release_host_cached(lucid_cuda_allocator *a) {
    for (auto it = a->host_free.begin(); it != a->host_free.end();) {
        HostBlock *h = *it;
        if (h->event_pending) {
            cudaError_t q = cudaEventQuery(h->event);
            if (q == cudaErrorNotReady) {
                (void)cudaGetLastError();
                ++it;
                continue;
            }
            (void)cudaGetLastError();
        }
        cudaFreeHost(h->ptr);
        if (h->event) cudaEventDestroy(h->event);
        a->host_reserved -= h->size;
        a->host_all.erase(h->ptr);
        it = a->host_free.erase(it);
        delete h;
    }
}

/* ---------------------------------------------------------------- lifetime */

lucid_status lucid_cuda_allocator_create(lucid_ctx *ctx, int device,
                                         cudaStream_t default_stream,
                                         lucid_cuda_allocator **out) {
    *out = nullptr;
    lucid_cuda_allocator *a = new (std::nothrow) lucid_cuda_allocator();
    if (!a)
        return lucid_seterr(ctx, LUCID_ERR_OOM,
                            "out of host memory creating the CUDA allocator");
    a->device = device;
    a->default_stream = default_stream;
    memset(&a->stats, 0, sizeof a->stats);
    a->host_reserved = 0;
    a->capturing = false;
    *out = a;
    return LUCID_OK;
}

void lucid_cuda_allocator_destroy(lucid_cuda_allocator *a) {
    if (!a) return;
    std::lock_guard<std::mutex> lock(a->mu);
    std::vector<Block *> all;
    for (Block *b : a->small_pool) all.push_back(b);
    for (Block *b : a->large_pool) all.push_back(b);
    for (auto &kv : a->live) all.push_back(kv.second);
    for (Block *b : all)
        if (b->prev == nullptr) cudaFree(b->ptr); /* segment heads */
    for (Block *b : all) delete b;
    for (auto &kv : a->host_all) {
        cudaFreeHost(kv.second->ptr);
        if (kv.second->event) cudaEventDestroy(kv.second->event);
        delete kv.second;
    }
    (void)cudaGetLastError();
    a->small_pool.clear();
    a->large_pool.clear();
    a->live.clear();
    a->host_all.clear();
    a->host_free.clear();
    delete a;
}

/* ---------------------------------------------------------------- device */

lucid_status lucid_cuda_malloc(lucid_ctx *ctx, lucid_cuda_allocator *a,
                               size_t nbytes, cudaStream_t stream, void **ptr) {
    *ptr = nullptr;
    std::lock_guard<std::mutex> lock(a->mu);
    if (a->capturing)
        return lucid_seterr(ctx, LUCID_ERR_STATE,
                            "allocation during graph capture: %zu bytes on "
                            "cuda:%d (every buffer a recorded step uses must "
                            "exist before recording; run an eager warm-up "
                            "step with these shapes first)",
                            nbytes, a->device);
    const size_t size = round_size(nbytes);
    Pool &pool = size <= kSmallSize ? a->small_pool : a->large_pool;

    /* best fit among cached blocks of this stream */
    Block key;
    key.size = size;
    key.ptr = nullptr;
    key.stream = stream;
    Block *block = nullptr;
    auto it = pool.lower_bound(&key);
    if (it != pool.end() && (*it)->stream == stream) {
        block = *it;
        pool.erase(it);
    }

    if (!block) {
        const size_t seg = segment_size(size);
        void *p = nullptr;
        cudaError_t e = cudaMalloc(&p, seg);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            /* free the cache and retry once */
            release_cached(a);
            (void)cudaGetLastError();
            e = cudaMalloc(&p, seg);
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                size_t dev_free = 0, dev_total = 0;
                if (cudaMemGetInfo(&dev_free, &dev_total) != cudaSuccess)
                    (void)cudaGetLastError();
                lucid_status st = (e == cudaErrorMemoryAllocation ||
                                   e == cudaErrorInvalidValue)
                                      ? LUCID_ERR_OOM
                                      : LUCID_ERR_DEVICE;
                return lucid_seterr(
                    ctx, st,
                    "cuda:%d out of memory: cannot allocate %zu bytes "
                    "(%.2f MiB; segment of %zu bytes): %llu bytes allocated "
                    "and %llu bytes reserved by this context; the device "
                    "reports %zu bytes free of %zu (cudaMalloc: %s)",
                    a->device, nbytes, (double)nbytes / (1024.0 * 1024.0), seg,
                    (unsigned long long)a->stats.allocated,
                    (unsigned long long)a->stats.reserved, dev_free, dev_total,
                    cudaGetErrorName(e));
            }
        }
        block = new (std::nothrow) Block();
        if (!block) {
            cudaFree(p);
            return lucid_seterr(ctx, LUCID_ERR_OOM,
                                "out of host memory for an allocator block");
        }
        block->size = seg;
        block->ptr = p;
        block->stream = stream;
        block->allocated = false;
        block->small = size <= kSmallSize;
        block->prev = block->next = nullptr;
        a->stats.reserved += seg;
        a->stats.num_device_allocs++;
    }

    /* split off the rest when it is worth keeping */
    const size_t rest = block->size - size;
    const bool split = block->small ? rest >= kMinBlock : rest > kSmallSize;
    if (split) {
        Block *r = new (std::nothrow) Block();
        if (r) {
            r->size = rest;
            r->ptr = (char *)block->ptr + size;
            r->stream = stream;
            r->allocated = false;
            r->small = block->small;
            r->prev = block;
            r->next = block->next;
            if (r->next) r->next->prev = r;
            block->next = r;
            block->size = size;
            pool.insert(r);
        }
    }

    block->allocated = true;
    a->live[block->ptr] = block;
    a->stats.allocated += block->size;
    a->stats.num_allocs++;
    update_peaks(a->stats);
    *ptr = block->ptr;
    return LUCID_OK;
}

void lucid_cuda_free(lucid_cuda_allocator *a, void *ptr) {
    if (!ptr) return;
    std::lock_guard<std::mutex> lock(a->mu);
    auto it = a->live.find(ptr);
    if (it == a->live.end()) return; /* not ours: ignore (never abort) */
    Block *b = it->second;
    a->live.erase(it);
    b->allocated = false;
    a->stats.allocated -= b->size;
    Pool &pool = b->small ? a->small_pool : a->large_pool;
    /* merge with free neighbours of the segment */
    Block *n = b->next;
    if (n && !n->allocated) {
        pool.erase(n);
        b->size += n->size;
        b->next = n->next;
        if (b->next) b->next->prev = b;
        delete n;
    }
    Block *p = b->prev;
    if (p && !p->allocated) {
        pool.erase(p);
        p->size += b->size;
        p->next = b->next;
        if (p->next) p->next->prev = p;
        delete b;
        b = p;
    }
    pool.insert(b);
}

void lucid_cuda_stats(lucid_cuda_allocator *a, lucid_memory_stats *out) {
    std::lock_guard<std::mutex> lock(a->mu);
    *out = a->stats;
}

lucid_status lucid_cuda_empty_cache(lucid_ctx *ctx, lucid_cuda_allocator *a) {
    std::lock_guard<std::mutex> lock(a->mu);
    cudaError_t e = release_cached(a);
    release_host_cached(a);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return lucid_cuda_err(ctx, e, "cudaFree (empty_cache)", __FILE__,
                              __LINE__);
    }
    return LUCID_OK;
}

void lucid_cuda_reset_peak(lucid_cuda_allocator *a) {
    std::lock_guard<std::mutex> lock(a->mu);
    a->stats.peak_allocated = a->stats.allocated;
    a->stats.peak_reserved = a->stats.reserved;
}

/* ---------------------------------------------------------------- pinned host */

lucid_status lucid_cuda_host_malloc(lucid_ctx *ctx, lucid_cuda_allocator *a,
                                    size_t nbytes, void **ptr) {
    *ptr = nullptr;
    std::lock_guard<std::mutex> lock(a->mu);
    if (a->capturing && a->capture_thread == std::this_thread::get_id())
        return lucid_seterr(ctx, LUCID_ERR_STATE,
                            "allocation during graph capture: %zu bytes of "
                            "pinned host memory (staging buffers of a "
                            "recorded step must exist before recording)",
                            nbytes);
    const size_t size = host_round(nbytes);
    HostBlock key;
    key.size = size;
    key.ptr = nullptr;
    /* smallest idle block that fits, is not more than twice the request
     * and whose last use has completed */
    for (auto it = a->host_free.lower_bound(&key);
         it != a->host_free.end() && (*it)->size <= 2 * size; ++it) {
        HostBlock *h = *it;
        if (h->event_pending) {
            cudaError_t q = cudaEventQuery(h->event);
            (void)cudaGetLastError();
            if (q == cudaErrorNotReady) continue;
            h->event_pending = false;
        }
        a->host_free.erase(it);
        h->allocated = true;
        *ptr = h->ptr;
        return LUCID_OK;
    }
    void *p = nullptr;
    cudaError_t e = cudaHostAlloc(&p, size, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        release_host_cached(a);
        e = cudaHostAlloc(&p, size, cudaHostAllocPortable);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return lucid_seterr(ctx, LUCID_ERR_OOM,
                                "cannot allocate %zu bytes of pinned host "
                                "memory (%llu bytes pinned by this context): "
                                "cudaHostAlloc: %s",
                                nbytes, (unsigned long long)a->host_reserved,
                                cudaGetErrorString(e));
        }
    }
    HostBlock *h = new (std::nothrow) HostBlock();
    if (!h) {
        cudaFreeHost(p);
        return lucid_seterr(ctx, LUCID_ERR_OOM,
                            "out of host memory for a pinned block record");
    }
    h->size = size;
    h->ptr = p;
    h->allocated = true;
    h->event_pending = false;
    h->event = nullptr;
    a->host_all[p] = h;
    a->host_reserved += size;
    *ptr = p;
    return LUCID_OK;
}

void lucid_cuda_host_free(lucid_cuda_allocator *a, void *ptr,
                          cudaStream_t stream) {
    if (!ptr) return;
    std::lock_guard<std::mutex> lock(a->mu);
    auto it = a->host_all.find(ptr);
    if (it == a->host_all.end() || !it->second->allocated) return;
    HostBlock *h = it->second;
    h->allocated = false;
    h->event_pending = false;
    if (!h->event &&
        cudaEventCreateWithFlags(&h->event, cudaEventDisableTiming) !=
            cudaSuccess) {
        (void)cudaGetLastError();
        h->event = nullptr;
    }
    if (h->event) {
        if (cudaEventRecord(h->event, stream) == cudaSuccess)
            h->event_pending = true;
        else
            (void)cudaGetLastError();
    }
    if (!h->event_pending) {
        /* no event: wait here rather than risk reuse during a copy */
        if (cudaStreamSynchronize(stream) != cudaSuccess)
            (void)cudaGetLastError();
    }
    a->host_free.insert(h);
}
