/* The drafter cache's slot of a position (see drafter_cache.h). */
#include "backend/drafter_cache.h"

di_status di_drafter_cache_slot(const di_batch_seq *q, int pos, int64_t n_blocks, int64_t *slot) {
  if (pos < 0 || pos / DI_DRAFTER_BLOCK_TOKENS >= q->n_blocks)
    return di_error_set(DI_ERR_INVALID_ARG, "DSpark drafter: position %d beyond the %d blocks of its table", pos, q->n_blocks);
  int32_t blk = q->block_table[pos / DI_DRAFTER_BLOCK_TOKENS];
  if (blk < 0 || blk >= n_blocks)
    return di_error_set(DI_ERR_INVALID_ARG, "DSpark drafter: block id %d outside its cache of %lld", blk, (long long)n_blocks);
  *slot = (int64_t)blk * DI_DRAFTER_BLOCK_TOKENS + pos % DI_DRAFTER_BLOCK_TOKENS;
  return DI_OK;
}
