/* A DSpark drafter's cache paged by its own KV-manager group (the engine's drafter group, blocks of
 * DI_DRAFTER_BLOCK_TOKENS positions; on the CPU and CUDA): the slot of a position, checked against the
 * sequence's table in that group and the cache's block count. */
#ifndef DI_BACKEND_DRAFTER_CACHE_H
#define DI_BACKEND_DRAFTER_CACHE_H
#include "backend/backend.h"

/* *slot = block * DI_DRAFTER_BLOCK_TOKENS + pos % DI_DRAFTER_BLOCK_TOKENS for the block holding `pos` in
 * q's table (the sequence's drafter-group table); an error naming the position or the block when the
 * table or a cache of n_blocks does not hold it. */
di_status di_drafter_cache_slot(const di_batch_seq *q, int pos, int64_t n_blocks, int64_t *slot);
#endif
