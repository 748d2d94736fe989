/* A fixed pool of worker threads running parallel-for loops. The split of a range over threads
 * never changes the arithmetic of an element (callers compute each output element in one task), so
 * results are identical for any thread count. */
#ifndef DI_UTIL_THREADPOOL_H
#define DI_UTIL_THREADPOOL_H
#include <stdint.h>
#include "util/status.h"

typedef struct di_threadpool di_threadpool;
/* fn(ctx, begin, end, thread_index) is called on disjoint sub-ranges covering [0, n). */
typedef void (*di_parallel_fn)(void *ctx, int64_t begin, int64_t end, int thread);

/* n_threads <= 0: one per online core. */
di_status di_threadpool_create(int n_threads, di_threadpool **out);
void di_threadpool_free(di_threadpool *tp);
int di_threadpool_size(const di_threadpool *tp);
/* Runs fn over [0, n) in chunks of at least `grain` items; returns when all are done. Not
 * reentrant: call it from one thread at a time. */
void di_parallel_for(di_threadpool *tp, int64_t n, int64_t grain, di_parallel_fn fn, void *ctx);
/* A buffer of at least `bytes` (64-byte aligned) that belongs to thread index `thread` (the index a
 * di_parallel_for task is given): only that index's tasks use it, so it needs no lock. It lives until
 * the pool is freed (a larger request replaces it). NULL without a pool or on allocation failure. */
void *di_threadpool_scratch(di_threadpool *tp, int thread, size_t bytes);
#endif
