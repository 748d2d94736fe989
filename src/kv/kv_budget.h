/* How many bytes the KV cache may take when the user names no size (di_engine_options'
 * kv_cache_memory_bytes and num_kv_blocks both unset). On a device backend this is vLLM's
 * --gpu-memory-utilization rule: the engine may use `utilization` of the device's total memory for
 * everything; the KV cache gets what is left of that after what is already in use (the weights and
 * the largest step's buffers, which the backend reserves before it reports). On the CPU (no device
 * memory to report) it is a fixed size, since tests run many engines at once on a small machine. */
#ifndef DI_KV_BUDGET_H
#define DI_KV_BUDGET_H
#include <stdint.h>
#include "util/status.h"

#define DI_KV_CPU_DEFAULT_BYTES ((int64_t)1 << 30)
#define DI_GPU_MEMORY_UTILIZATION_DEFAULT 0.9

/* budget = utilization * total - used. Errors (naming the numbers) when utilization is not in (0, 1]
 * or leaves nothing for the cache. */
di_status di_kv_budget_from_device(int64_t total_bytes, int64_t used_bytes, double utilization, int64_t *budget);

#endif
