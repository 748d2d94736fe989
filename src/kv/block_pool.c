/* One pool of KV blocks: reference counts, LRU free list, hash table of cached blocks
 * (see block_pool.h). The hash table uses linear probing with backward-shift deletion, so it never
 * fills with tombstones however long the engine runs. */
#include "kv/block_pool.h"
#include <stdlib.h>
#include <string.h>

static void list_remove(di_block_pool *p, int32_t b) {
  int32_t pv = p->prev[b], nx = p->next[b];
  if (pv >= 0) p->next[pv] = nx; else p->head = nx;
  if (nx >= 0) p->prev[nx] = pv; else p->tail = pv;
  p->prev[b] = p->next[b] = -1;
  p->n_free--;
  if (p->hashed[b]) p->n_cached--;
}

static void list_push_back(di_block_pool *p, int32_t b) {
  p->prev[b] = p->tail;
  p->next[b] = -1;
  if (p->tail >= 0) p->next[p->tail] = b; else p->head = b;
  p->tail = b;
  p->n_free++;
  if (p->hashed[b]) p->n_cached++;
}

static void list_push_front(di_block_pool *p, int32_t b) {
  p->next[b] = p->head;
  p->prev[b] = -1;
  if (p->head >= 0) p->prev[p->head] = b; else p->tail = b;
  p->head = b;
  p->n_free++;
  if (p->hashed[b]) p->n_cached++;
}

di_status di_block_pool_init(di_block_pool *p, int64_t n) {
  memset(p, 0, sizeof *p);
  if (n <= 0 || n > INT32_MAX / 4)
    return di_error_set(DI_ERR_INVALID_ARG, "KV pool: %lld blocks is out of range", (long long)n);
  int64_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  p->n = n;
  p->ref = calloc((size_t)n, sizeof *p->ref);
  p->prev = malloc((size_t)n * sizeof *p->prev);
  p->next = malloc((size_t)n * sizeof *p->next);
  p->hashed = calloc((size_t)n, 1);
  p->hash = calloc((size_t)n, sizeof *p->hash);
  p->hash2 = calloc((size_t)n, sizeof *p->hash2);
  p->table = malloc((size_t)cap * sizeof *p->table);
  if (!p->ref || !p->prev || !p->next || !p->hashed || !p->hash || !p->hash2 || !p->table) {
    di_block_pool_destroy(p);
    return di_error_set(DI_ERR_OOM, "KV pool: out of host memory for %lld blocks", (long long)n);
  }
  p->table_mask = cap - 1;
  for (int64_t i = 0; i < cap; i++) p->table[i] = -1;
  p->head = p->tail = -1;
  for (int64_t i = 0; i < n; i++) list_push_back(p, (int32_t)i);
  return DI_OK;
}

void di_block_pool_destroy(di_block_pool *p) {
  free(p->ref); free(p->prev); free(p->next); free(p->hashed); free(p->hash); free(p->hash2);
  free(p->table);
  memset(p, 0, sizeof *p);
}

static int64_t slot_of(const di_block_pool *p, uint64_t h) { return (int64_t)(h & (uint64_t)p->table_mask); }

int32_t di_block_pool_lookup(const di_block_pool *p, uint64_t h, uint64_t h2) {
  for (int64_t i = slot_of(p, h);; i = (i + 1) & p->table_mask) {
    int32_t b = p->table[i];
    if (b < 0) return -1;
    if (p->hash[b] == h && p->hash2[b] == h2) return b;
  }
}

static void table_remove(di_block_pool *p, int32_t b) {
  int64_t i = slot_of(p, p->hash[b]);
  while (p->table[i] != b) i = (i + 1) & p->table_mask;
  /* backward-shift: move later entries of the probe run into the hole when their home allows */
  int64_t hole = i;
  for (int64_t j = (i + 1) & p->table_mask; p->table[j] >= 0; j = (j + 1) & p->table_mask) {
    int64_t home = slot_of(p, p->hash[p->table[j]]);
    int64_t dist_j = (j - home) & p->table_mask, dist_hole = (hole - home) & p->table_mask;
    if (dist_hole < dist_j) {
      p->table[hole] = p->table[j];
      hole = j;
    }
  }
  p->table[hole] = -1;
}

void di_block_pool_register(di_block_pool *p, int32_t b, uint64_t h, uint64_t h2) {
  if (p->hashed[b] || di_block_pool_lookup(p, h, h2) >= 0) return;
  int64_t i = slot_of(p, h);
  while (p->table[i] >= 0) i = (i + 1) & p->table_mask;
  p->table[i] = b;
  p->hash[b] = h;
  p->hash2[b] = h2;
  p->hashed[b] = 1;
  if (p->ref[b] == 0) p->n_cached++; /* not expected (callers register referenced blocks) */
}

int32_t di_block_pool_alloc(di_block_pool *p) {
  int32_t b = p->head;
  if (b < 0) return -1;
  list_remove(p, b);
  if (p->hashed[b]) {
    table_remove(p, b);
    p->hashed[b] = 0;
    p->evictions++;
  }
  p->ref[b] = 1;
  return b;
}

void di_block_pool_ref(di_block_pool *p, int32_t b) {
  if (p->ref[b] == 0) list_remove(p, b);
  p->ref[b]++;
}

void di_block_pool_unref(di_block_pool *p, int32_t b) {
  DI_ASSERT(p->ref[b] > 0);
  if (--p->ref[b] == 0) {
    if (p->hashed[b]) list_push_back(p, b);
    else list_push_front(p, b);
  }
}

di_status di_block_pool_check(const di_block_pool *p, const char *what) {
  int64_t n_list = 0, n_cached = 0;
  for (int32_t b = p->head, pv = -1; b >= 0; pv = b, b = p->next[b]) {
    if (++n_list > p->n) return di_error_set(DI_ERR_INTERNAL, "%s: free list has a cycle", what);
    if (p->ref[b] != 0) return di_error_set(DI_ERR_INTERNAL, "%s: block %d on the free list has %d references", what, b, p->ref[b]);
    if (p->prev[b] != pv) return di_error_set(DI_ERR_INTERNAL, "%s: free list links broken at block %d", what, b);
    if (p->hashed[b]) n_cached++;
  }
  int64_t n_zero = 0, n_hashed = 0;
  for (int64_t b = 0; b < p->n; b++) {
    if (p->ref[b] < 0) return di_error_set(DI_ERR_INTERNAL, "%s: block %lld has a negative count", what, (long long)b);
    if (p->ref[b] == 0) n_zero++;
    if (p->hashed[b]) {
      n_hashed++;
      if (di_block_pool_lookup(p, p->hash[b], p->hash2[b]) != (int32_t)b)
        return di_error_set(DI_ERR_INTERNAL, "%s: hashed block %lld is not findable", what, (long long)b);
    }
  }
  int64_t n_table = 0;
  for (int64_t i = 0; i <= p->table_mask; i++) if (p->table[i] >= 0) n_table++;
  if (n_list != n_zero || n_list != p->n_free)
    return di_error_set(DI_ERR_INTERNAL, "%s: %lld blocks on the free list, %lld unreferenced, counter says %lld",
                        what, (long long)n_list, (long long)n_zero, (long long)p->n_free);
  if (n_cached != p->n_cached)
    return di_error_set(DI_ERR_INTERNAL, "%s: cached count %lld, counter %lld", what, (long long)n_cached, (long long)p->n_cached);
  if (n_table != n_hashed)
    return di_error_set(DI_ERR_INTERNAL, "%s: %lld table entries for %lld hashed blocks", what, (long long)n_table, (long long)n_hashed);
  return DI_OK;
}
