/* One pool of KV blocks: reference counts, the LRU free list and the hash table of cached full
 * blocks. The KV manager (kv_manager.c) keeps one pool per cache group; nothing here knows about
 * sequences. Free blocks with no hash go to the front of the free list (handed out first, they
 * hold nothing reusable); freed hashed blocks go to the back, so the least recently used cached
 * block is the one evicted. */
#ifndef DI_KV_BLOCK_POOL_H
#define DI_KV_BLOCK_POOL_H
#include <stdint.h>
#include "util/status.h"

typedef struct di_block_pool {
  int64_t n;
  int32_t *ref;
  int32_t *prev, *next;       /* free-list links (-1 = none); valid only while ref == 0 */
  int32_t head, tail;
  int64_t n_free, n_cached;   /* free blocks; free blocks still hashed */
  uint8_t *hashed;
  uint64_t *hash, *hash2;     /* hash2: independent check against 64-bit collisions */
  int32_t *table;             /* open addressing: hash -> block id, -1 empty */
  int64_t table_mask;
  int64_t evictions;
} di_block_pool;

di_status di_block_pool_init(di_block_pool *p, int64_t n);
void di_block_pool_destroy(di_block_pool *p);
/* Pops the least recently used free block, evicting its hash; returns it with ref 1. -1 if none. */
int32_t di_block_pool_alloc(di_block_pool *p);
/* One more reference (a prefix-cache hit); removes the block from the free list when it was free. */
void di_block_pool_ref(di_block_pool *p, int32_t b);
/* One reference less; at zero the block joins the free list. */
void di_block_pool_unref(di_block_pool *p, int32_t b);
/* Block holding (h, h2), or -1. */
int32_t di_block_pool_lookup(const di_block_pool *p, uint64_t h, uint64_t h2);
/* Registers block b (referenced, full, written) under (h, h2) unless that hash is already present. */
void di_block_pool_register(di_block_pool *p, int32_t b, uint64_t h, uint64_t h2);
/* Invariant check; `what` prefixes the message. */
di_status di_block_pool_check(const di_block_pool *p, const char *what);
#endif
