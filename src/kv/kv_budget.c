/* The KV cache's default size on a device (see kv_budget.h). */
#include "kv/kv_budget.h"
#include <math.h>

di_status di_kv_budget_from_device(int64_t total_bytes, int64_t used_bytes, double utilization, int64_t *budget) {
  if (!(utilization > 0 && utilization <= 1))
    return di_error_set(DI_ERR_INVALID_ARG, "gpu_memory_utilization must be in (0, 1], got %g", utilization);
  const double gib = (double)((int64_t)1 << 30);
  double allowed = floor(utilization * (double)total_bytes);
  if (allowed - (double)used_bytes < (double)((int64_t)64 << 20))
    return di_error_set(DI_ERR_OOM,
                        "gpu_memory_utilization %.2f allows %.2f GiB of the device's %.2f GiB, but the weights and the "
                        "largest step's buffers already use %.2f GiB: no room is left for the KV cache (raise "
                        "gpu_memory_utilization, lower max_num_batched_tokens, or give the KV cache size)",
                        utilization, allowed / gib, (double)total_bytes / gib, (double)used_bytes / gib);
  *budget = (int64_t)allowed - used_bytes; /* int-cast: checked: 0 < utilization <= 1: allowed <= total_bytes */
  return DI_OK;
}
